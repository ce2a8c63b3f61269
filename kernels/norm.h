/* Global L2 norm helpers for gradient clipping. */
#ifndef ZT_KERNELS_NORM_H
#define ZT_KERNELS_NORM_H

#include <stddef.h>

#include "kernels/real.h"

/* Sum of squares of x[0..n), accumulated in double in a fixed order (independent of thread count). */
double zt_cpu_sum_squares(const zt_real *x, size_t n);
/* x *= s */
void zt_cpu_scale_inplace(zt_real *x, float s, size_t n);

#endif
