/* Causal multi-head self-attention over a packed qkv tensor, flash style: no T x T matrix is kept
 * between forward and backward, only the log-sum-exp of each query row.
 * Shapes: qkv [B,T,3C] laid out as (q | k | v), each C = NH * HS with head h at columns h*HS..;
 *         out [B,T,C] (heads concatenated); lse [B,NH,T]. Scale 1/sqrt(HS). */
#ifndef ZT_KERNELS_ATTENTION_H
#define ZT_KERNELS_ATTENTION_H

#include "kernels/real.h"

void zt_cpu_attention_forward(zt_real *out, zt_real *lse, const zt_real *qkv, int B, int T, int C, int NH);
/* Accumulates (+=) into dqkv [B,T,3C]. Uses out and lse of the forward pass. */
void zt_cpu_attention_backward(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                               const zt_real *lse, int B, int T, int C, int NH);

#endif
