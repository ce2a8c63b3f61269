/* GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#ifndef ZT_KERNELS_ACTIVATION_H
#define ZT_KERNELS_ACTIVATION_H

#include <stddef.h>

#include "kernels/real.h"

void zt_cpu_gelu_forward(zt_real *out, const zt_real *inp, size_t n);
/* Accumulates (+=) into dinp. */
void zt_cpu_gelu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n);

#endif
