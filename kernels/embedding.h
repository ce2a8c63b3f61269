/* Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
 * Shapes: tokens [B,T] int32 in [0,V); wte [V,C]; wpe [maxT,C] with T <= maxT; out [B,T,C]. */
#ifndef ZT_KERNELS_EMBEDDING_H
#define ZT_KERNELS_EMBEDDING_H

#include <stdint.h>

#include "kernels/real.h"

void zt_cpu_embedding_forward(zt_real *out, const int32_t *tokens, const zt_real *wte, const zt_real *wpe,
                              int B, int T, int C);
/* Accumulates (+=) into dwte [V,C] and dwpe [maxT,C]. Deterministic: rows of dwte are summed in token order. */
void zt_cpu_embedding_backward(zt_real *dwte, zt_real *dwpe, const zt_real *dout, const int32_t *tokens,
                               int B, int T, int C);

#endif
