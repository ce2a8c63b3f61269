/* Residual connection on the GPU (kernels/residual.h): out = a + b, and the gradient accumulations
 * of its backward. Elementwise, one thread per 16 bytes, scalar code only for a ragged end or
 * unaligned buffers. */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/residual.h"

/* y = a + b (y may equal a or b). */
template <typename T> static __global__ void add_kernel(T *y, const T *a, const T *b, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (vec && i + VS <= n) {
        zt_vec<T> x = zt_load_vec(a + i), z = zt_load_vec(b + i), r;
        for (int k = 0; k < VS; k++)
            r.v[k] = zt_from_float<T>(zt_to_float(x.v[k]) + zt_to_float(z.v[k]));
        zt_store_vec(y + i, r);
    } else {
        for (size_t j = i; j < i + VS && j < n; j++)
            y[j] = zt_from_float<T>(zt_to_float(a[j]) + zt_to_float(b[j]));
    }
}

/* da += g and db += g in one pass (either may be NULL). */
template <typename T> static __global__ void add2_kernel(T *da, T *db, const T *g, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (vec && i + VS <= n) {
        zt_vec<T> gv = zt_load_vec_cs(g + i);
        if (da) {
            zt_vec<T> x = zt_load_vec(da + i);
            for (int k = 0; k < VS; k++)
                x.v[k] = zt_from_float<T>(zt_to_float(x.v[k]) + zt_to_float(gv.v[k]));
            zt_store_vec(da + i, x);
        }
        if (db) {
            zt_vec<T> x = zt_load_vec(db + i);
            for (int k = 0; k < VS; k++)
                x.v[k] = zt_from_float<T>(zt_to_float(x.v[k]) + zt_to_float(gv.v[k]));
            zt_store_vec(db + i, x);
        }
    } else {
        for (size_t j = i; j < i + VS && j < n; j++) {
            float gj = zt_to_float(g[j]);
            if (da)
                da[j] = zt_from_float<T>(zt_to_float(da[j]) + gj);
            if (db)
                db[j] = zt_from_float<T>(zt_to_float(db[j]) + gj);
        }
    }
}

template <typename T> static unsigned elementwise_grid(size_t n, int block)
{
    return (unsigned)ZT_CEIL_DIV(ZT_CEIL_DIV(n, (size_t)zt_vec<T>::size), (size_t)block);
}

template <typename T> static void add(T *y, const T *a, const T *b, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(y) && zt_aligned16(a) && zt_aligned16(b);
    add_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(y, a, b, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T> static void add2(T *da, T *db, const T *g, size_t n, cudaStream_t stream)
{
    const int block = 256;
    bool vec = zt_aligned16(da) && zt_aligned16(db) && zt_aligned16(g); /* NULL counts as aligned */
    add2_kernel<<<elementwise_grid<T>(n, block), block, 0, stream>>>(da, db, g, n, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, enum zt_dtype dtype,
                                         cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        add((float *)out, (const float *)a, (const float *)b, n, stream);
        break;
    case ZT_DTYPE_F16:
        add((__half *)out, (const __half *)a, (const __half *)b, n, stream);
        break;
    case ZT_DTYPE_BF16:
        add((__nv_bfloat16 *)out, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_residual_forward", dtype);
    }
}

extern "C" void zt_cuda_residual_backward(void *da, void *db, const void *dout, size_t n, enum zt_dtype dtype,
                                          cudaStream_t stream)
{
    if (n == 0 || (da == NULL && db == NULL))
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        add2((float *)da, (float *)db, (const float *)dout, n, stream);
        break;
    case ZT_DTYPE_F16:
        add2((__half *)da, (__half *)db, (const __half *)dout, n, stream);
        break;
    case ZT_DTYPE_BF16:
        add2((__nv_bfloat16 *)da, (__nv_bfloat16 *)db, (const __nv_bfloat16 *)dout, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_residual_backward", dtype);
    }
}

extern "C" void zt_cuda_add_inplace(void *y, const void *x, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    zt_cuda_residual_backward(y, NULL, x, n, dtype, stream);
}

template <typename T> static __global__ void add_f32_kernel(T *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = zt_from_float<T>(zt_to_float(y[i]) + x[i]);
}

static unsigned f32_grid(size_t n)
{
    const size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks < 4096 ? (blocks ? blocks : 1) : 4096);
}

extern "C" void zt_cuda_add_f32(void *y, const float *x, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dtype) {
    case ZT_DTYPE_F32:
        add_f32_kernel<<<f32_grid(n), 256, 0, stream>>>((float *)y, x, n);
        break;
    case ZT_DTYPE_F16:
        add_f32_kernel<<<f32_grid(n), 256, 0, stream>>>((__half *)y, x, n);
        break;
    case ZT_DTYPE_BF16:
        add_f32_kernel<<<f32_grid(n), 256, 0, stream>>>((__nv_bfloat16 *)y, x, n);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_add_f32", dtype);
    }
}
