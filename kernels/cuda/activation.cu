/* Activations on the GPU (kernels/activation.h): GELU (tanh approximation and exact), SwiGLU and tanh,
 * forward and backward. Elementwise, one thread per 16 bytes, scalar code only for a ragged end or unaligned buffers
 * (for SwiGLU: rows of F elements that are not a multiple of 16 bytes). */
#include "kernels/activation.h"
#include "kernels/cuda/cuda_utils.cuh"

/* The exact GELU, x Phi(x), and its derivative Phi(x) + x phi(x). */
__device__ __forceinline__ float zt_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

__device__ __forceinline__ float zt_gelu_erf_grad(float x)
{
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    return cdf + x * 0.39894228040143268f * expf(-0.5f * x * x);
}

/* GELU in the form ERF selects (true: exact; false: tanh approximation) and its derivative. */
template <bool ERF> __device__ __forceinline__ float gelu_of(float x) { return ERF ? zt_gelu_erf(x) : zt_gelu(x); }
template <bool ERF> __device__ __forceinline__ float gelu_grad_of(float x)
{
    return ERF ? zt_gelu_erf_grad(x) : zt_gelu_grad(x);
}

/* Vectors per thread of the GELU kernels: their loads are all issued before the math, which keeps enough bytes
 * in flight for the exact GELU, whose erf costs as much time as its memory traffic when one vector waits for
 * the next. Thread t of a block handles vectors t, t + blockDim, ... (coalesced). */
#define GELU_UNROLL 4

template <typename T, bool ERF>
static __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size, U = GELU_UNROLL;
    const size_t step = (size_t)blockDim.x * VS;
    const size_t i0 = (size_t)blockIdx.x * blockDim.x * VS * U + (size_t)threadIdx.x * VS;
    if (vec && i0 + (U - 1) * step + VS <= n) {
        zt_vec<T> x[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            x[u] = zt_load_vec_cs(inp + i0 + u * step);
#pragma unroll
        for (int u = 0; u < U; u++) {
            zt_vec<T> r;
#pragma unroll
            for (int k = 0; k < VS; k++)
                r.v[k] = zt_from_float<T>(gelu_of<ERF>(zt_to_float(x[u].v[k])));
            zt_store_vec(out + i0 + u * step, r);
        }
    } else {
        for (int u = 0; u < U; u++)
            for (size_t j = i0 + u * step; j < i0 + u * step + VS && j < n; j++)
                out[j] = zt_from_float<T>(gelu_of<ERF>(zt_to_float(inp[j])));
    }
}

/* ACC: dinp += gelu'(inp) dout; else dinp = 0 + gelu'(inp) dout (the same bits, without reading dinp). */
template <typename T, bool ERF, bool ACC>
static __global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size, U = GELU_UNROLL;
    const size_t step = (size_t)blockDim.x * VS;
    const size_t i0 = (size_t)blockIdx.x * blockDim.x * VS * U + (size_t)threadIdx.x * VS;
    if (vec && i0 + (U - 1) * step + VS <= n) {
        zt_vec<T> x[U], g[U], d[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            x[u] = zt_load_vec_cs(inp + i0 + u * step);
            g[u] = zt_load_vec_cs(dout + i0 + u * step);
            if (ACC)
                d[u] = zt_load_vec(dinp + i0 + u * step);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int k = 0; k < VS; k++)
                d[u].v[k] = zt_from_float<T>((ACC ? zt_to_float(d[u].v[k]) : 0.0f) +
                                             gelu_grad_of<ERF>(zt_to_float(x[u].v[k])) * zt_to_float(g[u].v[k]));
            zt_store_vec(dinp + i0 + u * step, d[u]);
        }
    } else {
        for (int u = 0; u < U; u++)
            for (size_t j = i0 + u * step; j < i0 + u * step + VS && j < n; j++)
                dinp[j] = zt_from_float<T>((ACC ? zt_to_float(dinp[j]) : 0.0f) +
                                           gelu_grad_of<ERF>(zt_to_float(inp[j])) * zt_to_float(dout[j]));
    }
}

__device__ __forceinline__ float zt_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out[n,f] = silu(inp[n,f]) * inp[n,F+f]; thread i owns outputs i*VS .. i*VS + VS - 1 of the N*F (with
 * vec, F % VS == 0, so they lie in one row). */
template <typename T>
static __global__ void swiglu_forward_kernel(T *__restrict__ out, const T *__restrict__ inp, int F, size_t n,
                                             bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (i >= n)
        return;
    if (vec) {
        const size_t row = i / F, f = i % F;
        const T *gate = inp + row * 2 * F + f;
        zt_vec<T> g = zt_load_vec_cs(gate), u = zt_load_vec_cs(gate + F), r;
        for (int k = 0; k < VS; k++) {
            const float x = zt_to_float(g.v[k]);
            r.v[k] = zt_from_float<T>(x * zt_sigmoid(x) * zt_to_float(u.v[k]));
        }
        zt_store_vec(out + i, r);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++) {
            const size_t row = j / F, f = j % F;
            const float x = zt_to_float(inp[row * 2 * F + f]);
            out[j] = zt_from_float<T>(x * zt_sigmoid(x) * zt_to_float(inp[row * 2 * F + F + f]));
        }
    }
}

/* dgate += dout * up * s (1 + x (1 - s)), dup += dout * x s with x = gate, s = sigmoid(x). */
template <typename T>
__device__ __forceinline__ void swiglu_grad(T &dgate, T &dup, T gate, T up, T dout)
{
    const float x = zt_to_float(gate), s = zt_sigmoid(x), d = zt_to_float(dout);
    dgate = zt_from_float<T>(zt_to_float(dgate) + d * zt_to_float(up) * s * (1.0f + x * (1.0f - s)));
    dup = zt_from_float<T>(zt_to_float(dup) + d * x * s);
}

template <typename T>
static __global__ void swiglu_backward_kernel(T *__restrict__ dinp, const T *__restrict__ inp,
                                              const T *__restrict__ dout, int F, size_t n, bool vec, bool acc)
{
    constexpr int VS = zt_vec<T>::size;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (i >= n)
        return;
    if (vec) {
        const size_t row = i / F, f = i % F, at = row * 2 * F + f;
        zt_vec<T> g = zt_load_vec_cs(inp + at), u = zt_load_vec_cs(inp + at + F), d = zt_load_vec_cs(dout + i);
        zt_vec<T> dg, du;
        if (acc) {
            dg = zt_load_vec(dinp + at);
            du = zt_load_vec(dinp + at + F);
        } else {
            for (int k = 0; k < VS; k++)
                dg.v[k] = du.v[k] = zt_from_float<T>(0.0f); /* 0 + x rounds as x: the bits of zeroing first */
        }
        for (int k = 0; k < VS; k++)
            swiglu_grad(dg.v[k], du.v[k], g.v[k], u.v[k], d.v[k]);
        zt_store_vec(dinp + at, dg);
        zt_store_vec(dinp + at + F, du);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++) {
            const size_t row = j / F, f = j % F, at = row * 2 * F + f;
            if (!acc)
                dinp[at] = dinp[at + F] = zt_from_float<T>(0.0f);
            swiglu_grad(dinp[at], dinp[at + F], inp[at], inp[at + F], dout[j]);
        }
    }
}

template <typename T>
static __global__ void tanh_forward_kernel(T *out, const T *inp, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (vec && i + VS <= n) {
        zt_vec<T> x = zt_load_vec_cs(inp + i), r;
        for (int k = 0; k < VS; k++)
            r.v[k] = zt_from_float<T>(tanhf(zt_to_float(x.v[k])));
        zt_store_vec(out + i, r);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++)
            out[j] = zt_from_float<T>(tanhf(zt_to_float(inp[j])));
    }
}

template <typename T>
static __global__ void tanh_backward_kernel(T *dinp, const T *out, const T *dout, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (vec && i + VS <= n) {
        zt_vec<T> y = zt_load_vec_cs(out + i), g = zt_load_vec_cs(dout + i), d = zt_load_vec(dinp + i);
        for (int k = 0; k < VS; k++) {
            const float yk = zt_to_float(y.v[k]);
            d.v[k] = zt_from_float<T>(zt_to_float(d.v[k]) + zt_to_float(g.v[k]) * (1.0f - yk * yk));
        }
        zt_store_vec(dinp + i, d);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++) {
            const float yk = zt_to_float(out[j]);
            dinp[j] = zt_from_float<T>(zt_to_float(dinp[j]) + zt_to_float(dout[j]) * (1.0f - yk * yk));
        }
    }
}

template <typename T> static unsigned elementwise_grid(size_t n, int block)
{
    return (unsigned)ZT_CEIL_DIV(ZT_CEIL_DIV(n, (size_t)zt_vec<T>::size), (size_t)block);
}

template <typename T, bool ERF> static void gelu_forward(T *out, const T *inp, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(out) && zt_aligned16(inp);
    gelu_forward_kernel<T, ERF><<<elementwise_grid<T>(n, block * GELU_UNROLL), block, 0, stream>>>(out, inp, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T, bool ERF, bool ACC = true>
static void gelu_backward(T *dinp, const T *inp, const T *dout, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(dinp) && zt_aligned16(inp) && zt_aligned16(dout);
    gelu_backward_kernel<T, ERF, ACC>
        <<<elementwise_grid<T>(n, block * GELU_UNROLL), block, 0, stream>>>(dinp, inp, dout, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T> static void swiglu_forward(T *out, const T *inp, int N, int F, cudaStream_t stream)
{
    const int block = 256;
    const size_t n = (size_t)N * F;
    const bool vec = F % zt_vec<T>::size == 0 && zt_aligned16(out) && zt_aligned16(inp);
    swiglu_forward_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(out, inp, F, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T>
static void swiglu_backward(T *dinp, const T *inp, const T *dout, int N, int F, bool acc, cudaStream_t stream)
{
    const int block = 256;
    const size_t n = (size_t)N * F;
    const bool vec = F % zt_vec<T>::size == 0 && zt_aligned16(dinp) && zt_aligned16(inp) && zt_aligned16(dout);
    swiglu_backward_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(dinp, inp, dout, F, n, vec, acc);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T> static void tanh_forward(T *out, const T *inp, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(out) && zt_aligned16(inp);
    tanh_forward_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(out, inp, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T> static void tanh_backward(T *dinp, const T *out, const T *dout, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(dinp) && zt_aligned16(out) && zt_aligned16(dout);
    tanh_backward_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(dinp, out, dout, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_gelu_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_forward<float, false>((float *)out, (const float *)inp, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_forward<__half, false>((__half *)out, (const __half *)inp, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_forward<__nv_bfloat16, false>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)inp, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_gelu_forward", dtype);
    }
}

extern "C" void zt_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                                      cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_backward<float, false>((float *)dinp, (const float *)inp, (const float *)dout, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_backward<__half, false>((__half *)dinp, (const __half *)inp, (const __half *)dout, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_backward<__nv_bfloat16, false>((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)inp,
                                           (const __nv_bfloat16 *)dout, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_gelu_backward", dtype);
    }
}

extern "C" void zt_cuda_gelu_erf_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_forward<float, true>((float *)out, (const float *)inp, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_forward<__half, true>((__half *)out, (const __half *)inp, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_forward<__nv_bfloat16, true>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)inp, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_gelu_erf_forward", dtype);
    }
}

extern "C" void zt_cuda_gelu_erf_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                                          cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_backward<float, true>((float *)dinp, (const float *)inp, (const float *)dout, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_backward<__half, true>((__half *)dinp, (const __half *)inp, (const __half *)dout, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_backward<__nv_bfloat16, true>((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)inp,
                                           (const __nv_bfloat16 *)dout, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_gelu_erf_backward", dtype);
    }
}

extern "C" void zt_cuda_gelu_erf_backward_overwrite(void *dinp, const void *inp, const void *dout, size_t n,
                                                    enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_backward<float, true, false>((float *)dinp, (const float *)inp, (const float *)dout, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_backward<__half, true, false>((__half *)dinp, (const __half *)inp, (const __half *)dout, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_backward<__nv_bfloat16, true, false>((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)inp,
                                                  (const __nv_bfloat16 *)dout, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_gelu_erf_backward_overwrite", dtype);
    }
}

extern "C" void zt_cuda_swiglu_forward(void *out, const void *inp, int N, int F, enum zt_dtype dtype,
                                       cudaStream_t stream)
{
    ZT_ASSERT(N >= 0 && F >= 0);
    if ((size_t)N * F == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        swiglu_forward((float *)out, (const float *)inp, N, F, stream);
        break;
    case ZT_DTYPE_F16:
        swiglu_forward((__half *)out, (const __half *)inp, N, F, stream);
        break;
    case ZT_DTYPE_BF16:
        swiglu_forward((__nv_bfloat16 *)out, (const __nv_bfloat16 *)inp, N, F, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_swiglu_forward", dtype);
    }
}

static void swiglu_backward_any(void *dinp, const void *inp, const void *dout, int N, int F, bool acc,
                                enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(N >= 0 && F >= 0);
    if ((size_t)N * F == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        swiglu_backward((float *)dinp, (const float *)inp, (const float *)dout, N, F, acc, stream);
        break;
    case ZT_DTYPE_F16:
        swiglu_backward((__half *)dinp, (const __half *)inp, (const __half *)dout, N, F, acc, stream);
        break;
    case ZT_DTYPE_BF16:
        swiglu_backward((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)dout, N, F, acc,
                        stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_swiglu_backward", dtype);
    }
}

extern "C" void zt_cuda_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,
                                        enum zt_dtype dtype, cudaStream_t stream)
{
    swiglu_backward_any(dinp, inp, dout, N, F, true, dtype, stream);
}

extern "C" void zt_cuda_swiglu_backward_overwrite(void *dinp, const void *inp, const void *dout, int N, int F,
                                                  enum zt_dtype dtype, cudaStream_t stream)
{
    swiglu_backward_any(dinp, inp, dout, N, F, false, dtype, stream);
}

extern "C" void zt_cuda_tanh_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        tanh_forward((float *)out, (const float *)inp, n, stream);
        break;
    case ZT_DTYPE_F16:
        tanh_forward((__half *)out, (const __half *)inp, n, stream);
        break;
    case ZT_DTYPE_BF16:
        tanh_forward((__nv_bfloat16 *)out, (const __nv_bfloat16 *)inp, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_tanh_forward", dtype);
    }
}

extern "C" void zt_cuda_tanh_backward(void *dinp, const void *out, const void *dout, size_t n, enum zt_dtype dtype,
                                      cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        tanh_backward((float *)dinp, (const float *)out, (const float *)dout, n, stream);
        break;
    case ZT_DTYPE_F16:
        tanh_backward((__half *)dinp, (const __half *)out, (const __half *)dout, n, stream);
        break;
    case ZT_DTYPE_BF16:
        tanh_backward((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_tanh_backward", dtype);
    }
}

/* ---- ReLU and gated GELU (T5): scalar elementwise kernels, grid-stride ---- */

template <typename T> static __global__ void relu_forward_kernel(T *out, const T *inp, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = zt_to_float(inp[i]);
        out[i] = zt_from_float<T>(x > 0.0f ? x : 0.0f);
    }
}

template <typename T> static __global__ void relu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (zt_to_float(inp[i]) > 0.0f)
            dinp[i] = zt_from_float<T>(zt_to_float(dinp[i]) + zt_to_float(dout[i]));
}

template <typename T> static __global__ void geglu_forward_kernel(T *out, const T *inp, int F, size_t n)
{
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        const size_t row = j / (size_t)F, col = j % (size_t)F, at = row * 2 * (size_t)F + col;
        out[j] = zt_from_float<T>(zt_gelu(zt_to_float(inp[at])) * zt_to_float(inp[at + F]));
    }
}

template <typename T>
static __global__ void geglu_backward_kernel(T *dinp, const T *inp, const T *dout, int F, size_t n)
{
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        const size_t row = j / (size_t)F, col = j % (size_t)F, at = row * 2 * (size_t)F + col;
        const float g = zt_to_float(inp[at]), u = zt_to_float(inp[at + F]), d = zt_to_float(dout[j]);
        dinp[at] = zt_from_float<T>(zt_to_float(dinp[at]) + d * u * zt_gelu_grad(g));
        dinp[at + F] = zt_from_float<T>(zt_to_float(dinp[at + F]) + d * zt_gelu(g));
    }
}

static unsigned scalar_grid(size_t n)
{
    const size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

#define T5_ACT_DISPATCH(name, dtype, launch)                                                                  \
    switch (dtype) {                                                                                          \
    case ZT_DTYPE_F32: {                                                                                      \
        typedef float T;                                                                                      \
        launch;                                                                                               \
        break;                                                                                                \
    }                                                                                                         \
    case ZT_DTYPE_F16: {                                                                                      \
        typedef __half T;                                                                                     \
        launch;                                                                                               \
        break;                                                                                                \
    }                                                                                                         \
    case ZT_DTYPE_BF16: {                                                                                     \
        typedef __nv_bfloat16 T;                                                                              \
        launch;                                                                                               \
        break;                                                                                                \
    }                                                                                                         \
    default:                                                                                                  \
        ZT_CUDA_BAD_DTYPE(name, dtype);                                                                       \
    }

extern "C" void zt_cuda_relu_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    T5_ACT_DISPATCH("zt_cuda_relu_forward", dtype,
                    (relu_forward_kernel<T><<<scalar_grid(n), 256, 0, stream>>>((T *)out, (const T *)inp, n)));
}

extern "C" void zt_cuda_relu_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                                      cudaStream_t stream)
{
    if (n == 0)
        return;
    T5_ACT_DISPATCH("zt_cuda_relu_backward", dtype,
                    (relu_backward_kernel<T><<<scalar_grid(n), 256, 0, stream>>>((T *)dinp, (const T *)inp,
                                                                                 (const T *)dout, n)));
}

extern "C" void zt_cuda_geglu_forward(void *out, const void *inp, int N, int F, enum zt_dtype dtype,
                                      cudaStream_t stream)
{
    ZT_ASSERT(N >= 0 && F >= 0);
    const size_t n = (size_t)N * F;
    if (n == 0)
        return;
    T5_ACT_DISPATCH("zt_cuda_geglu_forward", dtype,
                    (geglu_forward_kernel<T><<<scalar_grid(n), 256, 0, stream>>>((T *)out, (const T *)inp, F, n)));
}

extern "C" void zt_cuda_geglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,
                                       enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(N >= 0 && F >= 0);
    const size_t n = (size_t)N * F;
    if (n == 0)
        return;
    T5_ACT_DISPATCH("zt_cuda_geglu_backward", dtype,
                    (geglu_backward_kernel<T><<<scalar_grid(n), 256, 0, stream>>>((T *)dinp, (const T *)inp,
                                                                                  (const T *)dout, F, n)));
}
