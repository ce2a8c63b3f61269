/* Activations, forward and backward: GELU with GPT-2's tanh approximation, exact GELU, SwiGLU and tanh. Element-wise,
 * so the split over threads never changes a result. */
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

/* 1 / sqrt(2) and 1 / sqrt(2 pi) */
#define ZT_GELU_ERF_SCALE 0.7071067811865476
#define ZT_GELU_ERF_DENSITY 0.3989422804014327

/* Writes out[i] = 0.5 x (1 + erf(x / sqrt(2))) with x = inp[i]. */
void zt_cpu_gelu_erf_forward(zt_real *out, const zt_real *inp, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        zt_real x = inp[i];
        out[i] = (zt_real)0.5 * x * ((zt_real)1 + zt_real_erf(x * (zt_real)ZT_GELU_ERF_SCALE));
    }
}

/* Adds dout[i] * (Phi(x) + x phi(x)) into dinp[i], x = inp[i]. */
void zt_cpu_gelu_erf_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        zt_real x = inp[i];
        zt_real cdf = (zt_real)0.5 * ((zt_real)1 + zt_real_erf(x * (zt_real)ZT_GELU_ERF_SCALE));
        zt_real pdf = (zt_real)ZT_GELU_ERF_DENSITY * zt_real_exp((zt_real)-0.5 * x * x);
        dinp[i] += (cdf + x * pdf) * dout[i];
    }
}

/* sigmoid(x) = 1 / (1 + exp(-x)): exp overflows to inf for very negative x, which gives 0, not NaN. */
static inline zt_real zt_sigmoid(zt_real x)
{
    return (zt_real)1 / ((zt_real)1 + zt_real_exp(-x));
}

/* Writes out[n,f] = silu(gate) * up with gate = inp[n,f], up = inp[n,F+f]. */
void zt_cpu_swiglu_forward(zt_real *out, const zt_real *inp, int N, int F)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((size_t)N * F >= ZT_GELU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const zt_real *gate = inp + (size_t)n * 2 * F, *up = gate + F;
        zt_real *o = out + (size_t)n * F;
        for (int f = 0; f < F; f++)
            o[f] = gate[f] * zt_sigmoid(gate[f]) * up[f];
    }
}

/* Adds dout * up * silu'(gate) into the gate columns of dinp and dout * silu(gate) into its up columns,
 * with silu'(x) = s (1 + x (1 - s)), s = sigmoid(x). */
void zt_cpu_swiglu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, int N, int F)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((size_t)N * F >= ZT_GELU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const zt_real *gate = inp + (size_t)n * 2 * F, *up = gate + F;
        const zt_real *d = dout + (size_t)n * F;
        zt_real *dgate = dinp + (size_t)n * 2 * F, *dup = dgate + F;
        for (int f = 0; f < F; f++) {
            zt_real x = gate[f], s = zt_sigmoid(x);
            dgate[f] += d[f] * up[f] * s * ((zt_real)1 + x * ((zt_real)1 - s));
            dup[f] += d[f] * x * s;
        }
    }
}

/* Writes out[i] = tanh(inp[i]). */
void zt_cpu_tanh_forward(zt_real *out, const zt_real *inp, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = zt_real_tanh(inp[i]);
}

/* Adds dout[i] * (1 - out[i]^2) into dinp[i]. */
void zt_cpu_tanh_backward(zt_real *dinp, const zt_real *out, const zt_real *dout, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        dinp[i] += dout[i] * ((zt_real)1 - out[i] * out[i]);
}

/* Writes out[i] = max(inp[i], 0). */
void zt_cpu_relu_forward(zt_real *out, const zt_real *inp, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > (zt_real)0 ? inp[i] : (zt_real)0;
}

/* Adds dout[i] into dinp[i] where inp[i] > 0 (PyTorch's ReLU has gradient 0 at 0). */
void zt_cpu_relu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_GELU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        if (inp[i] > (zt_real)0)
            dinp[i] += dout[i];
}

/* GELU's tanh form and its derivative, as zt_cpu_gelu_forward / _backward compute them. */
static inline zt_real gelu_tanh(zt_real x)
{
    zt_real u = (zt_real)ZT_GELU_SCALE * (x + (zt_real)ZT_GELU_CUBIC * x * x * x);
    return (zt_real)0.5 * x * ((zt_real)1 + zt_real_tanh(u));
}

static inline zt_real gelu_tanh_grad(zt_real x)
{
    zt_real u = (zt_real)ZT_GELU_SCALE * (x + (zt_real)ZT_GELU_CUBIC * x * x * x);
    zt_real th = zt_real_tanh(u);
    zt_real du = (zt_real)ZT_GELU_SCALE * ((zt_real)1 + (zt_real)(3.0 * ZT_GELU_CUBIC) * x * x);
    return (zt_real)0.5 * ((zt_real)1 + th) + (zt_real)0.5 * x * ((zt_real)1 - th * th) * du;
}

/* Writes out [N,F] = gelu(gate) * up from inp [N,2F] (gate | up per row). */
void zt_cpu_geglu_forward(zt_real *out, const zt_real *inp, int N, int F)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((size_t)N * F >= ZT_GELU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const zt_real *gate = inp + (size_t)n * 2 * F, *up = gate + F;
        zt_real *o = out + (size_t)n * F;
        for (int f = 0; f < F; f++)
            o[f] = gelu_tanh(gate[f]) * up[f];
    }
}

/* Adds dout * up * gelu'(gate) into the gate columns of dinp and dout * gelu(gate) into its up columns. */
void zt_cpu_geglu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, int N, int F)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((size_t)N * F >= ZT_GELU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const zt_real *gate = inp + (size_t)n * 2 * F, *up = gate + F;
        const zt_real *d = dout + (size_t)n * F;
        zt_real *dgate = dinp + (size_t)n * 2 * F, *dup = dgate + F;
        for (int f = 0; f < F; f++) {
            dgate[f] += d[f] * up[f] * gelu_tanh_grad(gate[f]);
            dup[f] += d[f] * gelu_tanh(gate[f]);
        }
    }
}

