/* Global gradient norm, clip coefficient and scaling on the GPU (kernels/norm.h).
 *
 * Determinism: a tensor's sum of squares is split over a fixed grid (at most ZT_CUDA_NORM_SLOTS blocks,
 * the count depending only on n); block i strides over the tensor in a fixed pattern, reduces in a fixed
 * order and adds its result into slot i. Launches on one stream run in order, so each slot sees the same
 * sequence of additions on every run, and the finishing block adds the slots in index order. */
#include <math.h>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/norm.h"

#define NORM_THREADS 256

/* Every dtype is read four elements at a time in the same pattern, so the sum over fp16/bf16 data is
 * bit-identical to the sum over the same values held in fp32 (a norm over low-precision gradients then
 * equals the norm over their fp32 copy). Each thread handles two groups per round (more loads in flight)
 * and adds them in the order a one-group loop would. */
template <typename T>
static __global__ void __launch_bounds__(NORM_THREADS)
    sum_squares_kernel(float *__restrict__ partials, const T *__restrict__ x, size_t n, bool vec)
{
    float acc = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) { /* whole groups of four, then the ragged end */
        const size_t ngroups = n / 4;
        for (size_t i = tid; i < ngroups; i += 2 * stride) {
            const bool second = i + stride < ngroups;
            const float4 a = zt_load4_cs(x + i * 4);
            const float4 b = second ? zt_load4_cs(x + (i + stride) * 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            acc += a.x * a.x;
            acc += a.y * a.y;
            acc += a.z * a.z;
            acc += a.w * a.w;
            if (second) {
                acc += b.x * b.x;
                acc += b.y * b.y;
                acc += b.z * b.z;
                acc += b.w * b.w;
            }
        }
        done = ngroups * 4;
    }
    for (size_t i = done + tid; i < n; i += stride) {
        float v = zt_to_float(x[i]);
        acc += v * v;
    }
    acc = zt_block_sum(acc);
    if (threadIdx.x == 0)
        partials[blockIdx.x] += acc;
}

static __global__ void sum_slots_kernel(float *d_out, const float *__restrict__ partials)
{
    float acc = 0.0f;
    for (int i = threadIdx.x; i < ZT_CUDA_NORM_SLOTS; i += blockDim.x)
        acc += partials[i];
    acc = zt_block_sum(acc);
    if (threadIdx.x == 0)
        *d_out = acc;
}

static __global__ void clip_scale_kernel(float *d_scale, const float *d_sumsq, float max_norm)
{
    float norm = sqrtf(*d_sumsq);
    float s = 1.0f;
    if (max_norm > 0.0f) {
        float c = max_norm / (norm + 1e-6f);
        if (c < 1.0f)
            s = c;
    }
    *d_scale = s;
}

template <typename T> static __global__ void scale_kernel(T *x, float s, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = zt_from_float<T>(zt_to_float(x[i]) * s);
}

extern "C" void zt_cuda_sum_squares_accumulate(float *partials, const void *x, size_t n, enum zt_dtype dtype,
                                               cudaStream_t stream)
{
    if (n == 0)
        return;
    /* A few thousand elements per block at least; the grid depends on n alone. */
    size_t blocks = ZT_CEIL_DIV(n, (size_t)NORM_THREADS * 16);
    if (blocks > ZT_CUDA_NORM_SLOTS)
        blocks = ZT_CUDA_NORM_SLOTS;
    /* fp32 groups of four need 16-byte alignment, fp16/bf16 ones 8 bytes */
    const bool vec = ((uintptr_t)x & (dtype == ZT_DTYPE_F32 ? 15u : 7u)) == 0;
    switch (dtype) {
    case ZT_DTYPE_F32:
        sum_squares_kernel<<<(unsigned)blocks, NORM_THREADS, 0, stream>>>(partials, (const float *)x, n, vec);
        break;
    case ZT_DTYPE_F16:
        sum_squares_kernel<<<(unsigned)blocks, NORM_THREADS, 0, stream>>>(partials, (const __half *)x, n, vec);
        break;
    case ZT_DTYPE_BF16:
        sum_squares_kernel<<<(unsigned)blocks, NORM_THREADS, 0, stream>>>(partials, (const __nv_bfloat16 *)x, n, vec);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_sum_squares_accumulate", dtype);
    }
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_sum_squares_finish(float *d_out, const float *partials, cudaStream_t stream)
{
    sum_slots_kernel<<<1, NORM_THREADS, 0, stream>>>(d_out, partials);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_sum_squares(float *d_out, float *partials, const void *x, size_t n, enum zt_dtype dtype,
                                    cudaStream_t stream)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(partials, 0, ZT_CUDA_NORM_SLOTS * sizeof(float), stream));
    zt_cuda_sum_squares_accumulate(partials, x, n, dtype, stream);
    zt_cuda_sum_squares_finish(d_out, partials, stream);
}

extern "C" void zt_cuda_clip_scale(float *d_scale, const float *d_sumsq, float max_norm, cudaStream_t stream)
{
    clip_scale_kernel<<<1, 1, 0, stream>>>(d_scale, d_sumsq, max_norm);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_scale_inplace(void *x, float s, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    if (n == 0)
        return;
    size_t blocks = ZT_CEIL_DIV(n, (size_t)256);
    if (blocks > 65536)
        blocks = 65536;
    switch (dtype) {
    case ZT_DTYPE_F32:
        scale_kernel<<<(unsigned)blocks, 256, 0, stream>>>((float *)x, s, n);
        break;
    case ZT_DTYPE_F16:
        scale_kernel<<<(unsigned)blocks, 256, 0, stream>>>((__half *)x, s, n);
        break;
    case ZT_DTYPE_BF16:
        scale_kernel<<<(unsigned)blocks, 256, 0, stream>>>((__nv_bfloat16 *)x, s, n);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_scale_inplace", dtype);
    }
    ZT_CUDA_CHECK_LAUNCH();
}
