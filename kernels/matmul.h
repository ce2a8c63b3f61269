/* Linear layer: out[n,o] = sum_i inp[n,i] * weight[o,i] + bias[o]  (weight in PyTorch nn.Linear layout).
 * Shapes: inp [N,IC]; weight [OC,IC]; bias [OC] or NULL; out [N,OC]. */
#ifndef ZT_KERNELS_MATMUL_H
#define ZT_KERNELS_MATMUL_H

#include "kernels/real.h"

/* Overwrites out. Blocked for cache and registers, split over threads by output tiles. */
void zt_cpu_matmul_forward(zt_real *out, const zt_real *inp, const zt_real *weight, const zt_real *bias,
                           int N, int IC, int OC);
/* Accumulates (+=) into dinp [N,IC] (may be NULL), dweight [OC,IC] and dbias [OC] (may be NULL). */
void zt_cpu_matmul_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                            const zt_real *inp, const zt_real *weight, int N, int IC, int OC);

#endif
