/* CUDA backend basics: failure reporting for ZT_CUDA_CHECK / ZT_CUBLAS_CHECK, the choice of the
 * low-precision type for a GPU, dtype casts and the inf/NaN check (kernels/cuda/cuda_common.h). */
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_utils.cuh"

extern "C" void zt__cuda_fail(const char *file, int line, const char *call, int err)
{
    fprintf(stderr, "%s:%d: CUDA call failed: %s: %s (%s)\n", file, line, call,
            cudaGetErrorString((cudaError_t)err), cudaGetErrorName((cudaError_t)err));
    fflush(stderr);
    abort();
}

extern "C" void zt__cublas_fail(const char *file, int line, const char *call, int status)
{
    fprintf(stderr, "%s:%d: cuBLAS call failed: %s: status %d\n", file, line, call, status);
    fflush(stderr);
    abort();
}

void zt__cuda_bad_dtype(const char *file, int line, const char *op, int dtype)
{
    fprintf(stderr, "%s:%d: %s: dtype %d is not served by the CUDA kernels (use F32, F16 or BF16)\n", file,
            line, op, dtype);
    fflush(stderr);
    abort();
}

extern "C" enum zt_dtype zt_cuda_pick_dtype(int device)
{
    int major = 0;
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 8 ? ZT_DTYPE_BF16 : ZT_DTYPE_F16;
}

/* ---- casts ---- */

template <typename Td, typename Ts>
static __global__ void cast_kernel(Td *__restrict__ dst, const Ts *__restrict__ src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = zt_from_float<Td>(zt_to_float<Ts>(src[i]));
}

static int grid_for(size_t n, int block)
{
    size_t blocks = (n + block - 1) / block;
    if (blocks > 65536)
        blocks = 65536; /* grid-stride loops cover the rest */
    return blocks == 0 ? 1 : (int)blocks;
}

template <typename Td>
static void cast_from(Td *dst, const void *src, enum zt_dtype src_dtype, size_t n, cudaStream_t stream)
{
    const int block = 256;
    switch (src_dtype) {
    case ZT_DTYPE_F32:
        cast_kernel<<<grid_for(n, block), block, 0, stream>>>(dst, (const float *)src, n);
        break;
    case ZT_DTYPE_F16:
        cast_kernel<<<grid_for(n, block), block, 0, stream>>>(dst, (const __half *)src, n);
        break;
    case ZT_DTYPE_BF16:
        cast_kernel<<<grid_for(n, block), block, 0, stream>>>(dst, (const __nv_bfloat16 *)src, n);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_cast", src_dtype);
    }
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_cast(void *dst, enum zt_dtype dst_dtype, const void *src, enum zt_dtype src_dtype,
                             size_t n, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (dst_dtype) {
    case ZT_DTYPE_F32:
        cast_from((float *)dst, src, src_dtype, n, stream);
        break;
    case ZT_DTYPE_F16:
        cast_from((__half *)dst, src, src_dtype, n, stream);
        break;
    case ZT_DTYPE_BF16:
        cast_from((__nv_bfloat16 *)dst, src, src_dtype, n, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_cast", dst_dtype);
    }
}

/* ---- inf / NaN check ---- */

template <typename T>
static __global__ void check_finite_kernel(int *flag, const T *__restrict__ x, size_t n, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    size_t done = 0;
    if (vec) {
        const size_t nvec = n / VS;
        for (size_t i = tid; i < nvec; i += stride) {
            zt_vec<T> v = zt_load_vec_cs(x + i * VS);
            for (int k = 0; k < VS; k++)
                bad |= !isfinite(zt_to_float(v.v[k]));
        }
        done = nvec * VS;
    }
    for (size_t i = done + tid; i < n; i += stride)
        bad |= !isfinite(zt_to_float<T>(x[i]));
    /* Any thread that saw one writes 1: the same value from every writer, so the result is exact. */
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        *flag = 1;
}

extern "C" void zt_cuda_check_finite(int *d_flag, const void *x, size_t n, enum zt_dtype dtype,
                                     cudaStream_t stream)
{
    const int block = 256;
    if (n == 0)
        return;
    int grid = grid_for(n, block * 8);
    if (grid > 4096)
        grid = 4096;
    const bool vec = zt_aligned16(x);
    switch (dtype) {
    case ZT_DTYPE_F32:
        check_finite_kernel<<<grid, block, 0, stream>>>(d_flag, (const float *)x, n, vec);
        break;
    case ZT_DTYPE_F16:
        check_finite_kernel<<<grid, block, 0, stream>>>(d_flag, (const __half *)x, n, vec);
        break;
    case ZT_DTYPE_BF16:
        check_finite_kernel<<<grid, block, 0, stream>>>(d_flag, (const __nv_bfloat16 *)x, n, vec);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_check_finite", dtype);
    }
    ZT_CUDA_CHECK_LAUNCH();
}

/* ---- gradient accumulation: fp32 sums of low-precision block gradients ---- */

template <typename T>
static __global__ void accumulate_kernel(float *__restrict__ dst, const T *__restrict__ src, size_t n, float scale,
                                         int overwrite)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = zt_to_float(src[i]) * scale;
        dst[i] = overwrite ? x : dst[i] + x;
    }
}

/* The same over n4 groups of four elements: one 16-byte fp32 access and one 8-byte (16-bit src) or
 * 16-byte (fp32 src) read per group; dst 16-byte and src 4-element aligned. */
template <typename T>
static __global__ void accumulate4_kernel(float4 *__restrict__ dst, const T *__restrict__ src, size_t n4, float scale,
                                          int overwrite)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 x = zt_load4_cs(src + 4 * i);
        x.x *= scale;
        x.y *= scale;
        x.z *= scale;
        x.w *= scale;
        if (!overwrite) {
            float4 d = dst[i];
            x.x = d.x + x.x;
            x.y = d.y + x.y;
            x.z = d.z + x.z;
            x.w = d.w + x.w;
        }
        dst[i] = x;
    }
}

template <typename T>
static void accumulate(float *dst, const T *src, size_t n, float scale, int overwrite, cudaStream_t stream)
{
    const int threads = 256;
    size_t n4 = 0;
    if (zt_aligned16(dst) && (uintptr_t)src % (4 * sizeof(T)) == 0) {
        n4 = n / 4;
        if (n4 > 0) {
            accumulate4_kernel<T><<<grid_for(n4, threads), threads, 0, stream>>>((float4 *)dst, src, n4, scale,
                                                                                 overwrite);
            ZT_CUDA_CHECK_LAUNCH();
        }
    }
    size_t rest = n - 4 * n4;
    if (rest > 0) {
        accumulate_kernel<T><<<grid_for(rest, threads), threads, 0, stream>>>(dst + 4 * n4, src + 4 * n4, rest, scale,
                                                                              overwrite);
        ZT_CUDA_CHECK_LAUNCH();
    }
}

extern "C" void zt_cuda_accumulate(float *dst, const void *src, enum zt_dtype src_dtype, size_t n, float scale,
                                   int overwrite, cudaStream_t stream)
{
    if (n == 0)
        return;
    switch (src_dtype) {
    case ZT_DTYPE_F32:
        accumulate(dst, (const float *)src, n, scale, overwrite, stream);
        break;
    case ZT_DTYPE_F16:
        accumulate(dst, (const __half *)src, n, scale, overwrite, stream);
        break;
    case ZT_DTYPE_BF16:
        accumulate(dst, (const __nv_bfloat16 *)src, n, scale, overwrite, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("accumulate", src_dtype);
    }
}

/* Page-locked host memory; see cuda_common.h. */
extern "C" void *zt_cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

extern "C" void zt_cuda_host_free(void *p)
{
    if (p)
        ZT_CUDA_CHECK(cudaFreeHost(p));
}
