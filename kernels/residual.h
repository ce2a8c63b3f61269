/* Residual connection: out = a + b. Its backward passes dout unchanged to both inputs, which callers do
 * with zt_cpu_add_inplace (gradients accumulate). */
#ifndef ZT_KERNELS_RESIDUAL_H
#define ZT_KERNELS_RESIDUAL_H

#include <stddef.h>

#include "kernels/real.h"

void zt_cpu_residual_forward(zt_real *out, const zt_real *a, const zt_real *b, size_t n);
/* Accumulates (+=) dout into da and db (either may be NULL). */
void zt_cpu_residual_backward(zt_real *da, zt_real *db, const zt_real *dout, size_t n);
/* y += x */
void zt_cpu_add_inplace(zt_real *y, const zt_real *x, size_t n);

#endif
