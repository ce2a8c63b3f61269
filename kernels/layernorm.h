/* Layer normalisation over the last dimension: out = (x - mean) * rstd * weight + bias.
 * Shapes: inp, out [N,C]; weight, bias [C]; mean, rstd [N] (saved for backward). */
#ifndef ZT_KERNELS_LAYERNORM_H
#define ZT_KERNELS_LAYERNORM_H

#include "kernels/real.h"

void zt_cpu_layernorm_forward(zt_real *out, zt_real *mean, zt_real *rstd, const zt_real *inp,
                              const zt_real *weight, const zt_real *bias, int N, int C, float eps);
/* Accumulates (+=) into dinp [N,C], dweight [C] and dbias [C]. */
void zt_cpu_layernorm_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                               const zt_real *inp, const zt_real *weight, const zt_real *mean,
                               const zt_real *rstd, int N, int C);

#endif
