/* GELU with GPT-2's tanh approximation, forward and backward. Element-wise, so the split over threads
 * never changes a result. */
#include <stddef.h>

#include "kernels/activation.h"
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"

#define ZT_GELU_PAR_MIN 16384

/* sqrt(2 / pi) */
#define ZT_GELU_SCALE 0.7978845608028654
#define ZT_GELU_CUBIC 0.044715

/* Writes out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) with x = inp[i]. */
void zt_cpu_gelu_forward(zt_real *out, const zt_real *inp, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        zt_real x = inp[i];
        zt_real u = (zt_real)ZT_GELU_SCALE * (x + (zt_real)ZT_GELU_CUBIC * x * x * x);
        out[i] = (zt_real)0.5 * x * ((zt_real)1 + zt_real_tanh(u));
    }
}

/* Adds dout[i] * gelu'(inp[i]) into dinp[i]. */
void zt_cpu_gelu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        zt_real x = inp[i];
        zt_real u = (zt_real)ZT_GELU_SCALE * (x + (zt_real)ZT_GELU_CUBIC * x * x * x);
        zt_real th = zt_real_tanh(u);
        zt_real sech2 = (zt_real)1 - th * th;
        zt_real du = (zt_real)ZT_GELU_SCALE * ((zt_real)1 + (zt_real)(3.0 * ZT_GELU_CUBIC) * x * x);
        zt_real grad = (zt_real)0.5 * ((zt_real)1 + th) + (zt_real)0.5 * x * sech2 * du;
        dinp[i] += grad * dout[i];
    }
}
