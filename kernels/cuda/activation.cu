/* GELU (tanh approximation) forward and backward on the GPU (kernels/activation.h): elementwise, one
 * thread per 16 bytes, scalar code only for a ragged end or unaligned buffers. */
#include "kernels/activation.h"
#include "kernels/cuda/cuda_utils.cuh"

template <typename T>
static __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (vec && i + VS <= n) {
        zt_vec<T> x = zt_load_vec_cs(inp + i), r;
        for (int k = 0; k < VS; k++)
            r.v[k] = zt_from_float<T>(zt_gelu(zt_to_float(x.v[k])));
        zt_store_vec(out + i, r);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++)
            out[j] = zt_from_float<T>(zt_gelu(zt_to_float(inp[j])));
    }
}

template <typename T>
static __global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (vec && i + VS <= n) {
        zt_vec<T> x = zt_load_vec_cs(inp + i), g = zt_load_vec_cs(dout + i), d = zt_load_vec(dinp + i);
        for (int k = 0; k < VS; k++)
            d.v[k] = zt_from_float<T>(zt_to_float(d.v[k]) + zt_gelu_grad(zt_to_float(x.v[k])) * zt_to_float(g.v[k]));
        zt_store_vec(dinp + i, d);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++)
            dinp[j] = zt_from_float<T>(zt_to_float(dinp[j]) + zt_gelu_grad(zt_to_float(inp[j])) * zt_to_float(dout[j]));
    }
}

template <typename T> static unsigned elementwise_grid(size_t n, int block)
{
    return (unsigned)ZT_CEIL_DIV(ZT_CEIL_DIV(n, (size_t)zt_vec<T>::size), (size_t)block);
}

template <typename T> static void gelu_forward(T *out, const T *inp, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(out) && zt_aligned16(inp);
    gelu_forward_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(out, inp, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T> static void gelu_backward(T *dinp, const T *inp, const T *dout, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(dinp) && zt_aligned16(inp) && zt_aligned16(dout);
    gelu_backward_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(dinp, inp, dout, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_gelu_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_forward((float *)out, (const float *)inp, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_forward((__half *)out, (const __half *)inp, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_forward((__nv_bfloat16 *)out, (const __nv_bfloat16 *)inp, n, stream);
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
        gelu_backward((float *)dinp, (const float *)inp, (const float *)dout, n, stream);
        break;
    case ZT_DTYPE_F16:
        gelu_backward((__half *)dinp, (const __half *)inp, (const __half *)dout, n, stream);
        break;
    case ZT_DTYPE_BF16:
        gelu_backward((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)dout, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_gelu_backward", dtype);
    }
}
