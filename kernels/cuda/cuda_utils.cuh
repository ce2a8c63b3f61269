/* Device-side helpers shared by the .cu files of the CUDA backend (C++ only, not part of the API):
 * conversions between the storage types and fp32, 16-byte vector loads and stores, warp and block
 * reductions in a fixed order (so that every reduction is deterministic), and the assertion that
 * launchers use for their preconditions. */
#ifndef ZT_KERNELS_CUDA_UTILS_CUH
#define ZT_KERNELS_CUDA_UTILS_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* ztrain's C headers carry no extern "C" of their own. */
extern "C" {
#include "common/status.h"
}
#include "kernels/cuda/cuda_common.h"

#define ZT_WARP_SIZE 32
#define ZT_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Checks the launch just made (configuration errors show up here; faults inside the kernel show up at
 * the next synchronising call). */
#define ZT_CUDA_CHECK_LAUNCH() ZT_CUDA_CHECK(cudaGetLastError())

/* Aborts on a dtype a launcher does not serve (a caller's bug: see zt_cuda_pick_dtype). */
void zt__cuda_bad_dtype(const char *file, int line, const char *op, int dtype) __attribute__((noreturn));
#define ZT_CUDA_BAD_DTYPE(op, dtype) zt__cuda_bad_dtype(__FILE__, __LINE__, op, (int)(dtype))

/* ---- element conversions: fp32 arithmetic, any storage type ---- */

template <typename T> __device__ __forceinline__ float zt_to_float(T x);
template <> __device__ __forceinline__ float zt_to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float zt_to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float zt_to_float<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T zt_from_float(float x);
template <> __device__ __forceinline__ float zt_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half zt_from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 zt_from_float<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* ---- 16-byte vectors: one LDG.128 / STG.128 moves 4 floats or 8 halves ---- */

template <typename T> struct alignas(16) zt_vec {
    static constexpr int size = 16 / sizeof(T);
    T v[size];
};

template <typename T> __device__ __forceinline__ zt_vec<T> zt_load_vec(const T *p)
{
    zt_vec<T> r;
    *reinterpret_cast<int4 *>(&r) = *reinterpret_cast<const int4 *>(p);
    return r;
}

/* Streaming load: data read once (evict-first), e.g. activations consumed by a backward kernel. */
template <typename T> __device__ __forceinline__ zt_vec<T> zt_load_vec_cs(const T *p)
{
    zt_vec<T> r;
    *reinterpret_cast<int4 *>(&r) = __ldcs(reinterpret_cast<const int4 *>(p));
    return r;
}

template <typename T> __device__ __forceinline__ void zt_store_vec(T *p, const zt_vec<T> &x)
{
    *reinterpret_cast<int4 *>(p) = *reinterpret_cast<const int4 *>(&x);
}

/* ---- four consecutive elements as fp32, and back (p aligned to four elements): one 16-byte access for
 * fp32, one 8-byte access for fp16/bf16. The _cs load streams (data read once). ---- */

template <typename T> __device__ __forceinline__ float4 zt_float4_of(uint2 raw)
{
    const T *h = reinterpret_cast<const T *>(&raw);
    return make_float4(zt_to_float(h[0]), zt_to_float(h[1]), zt_to_float(h[2]), zt_to_float(h[3]));
}

template <typename T> __device__ __forceinline__ float4 zt_load4(const T *p)
{
    return zt_float4_of<T>(*reinterpret_cast<const uint2 *>(p));
}
template <> __device__ __forceinline__ float4 zt_load4<float>(const float *p)
{
    return *reinterpret_cast<const float4 *>(p);
}

template <typename T> __device__ __forceinline__ float4 zt_load4_cs(const T *p)
{
    return zt_float4_of<T>(__ldcs(reinterpret_cast<const uint2 *>(p)));
}
template <> __device__ __forceinline__ float4 zt_load4_cs<float>(const float *p)
{
    return __ldcs(reinterpret_cast<const float4 *>(p));
}

template <typename T> __device__ __forceinline__ void zt_store4(T *p, float4 x)
{
    uint2 raw;
    T *h = reinterpret_cast<T *>(&raw);
    h[0] = zt_from_float<T>(x.x);
    h[1] = zt_from_float<T>(x.y);
    h[2] = zt_from_float<T>(x.z);
    h[3] = zt_from_float<T>(x.w);
    *reinterpret_cast<uint2 *>(p) = raw;
}
template <> __device__ __forceinline__ void zt_store4<float>(float *p, float4 x)
{
    *reinterpret_cast<float4 *>(p) = x;
}

/* True if p is 16-byte aligned (host side, for choosing vector paths in launchers). */
static inline bool zt_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- reductions (fixed order: the same inputs give the same bits on every run) ---- */

__device__ __forceinline__ float zt_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float zt_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * Uses 33 floats of shared memory and ends with a barrier, so it can be called again right away. */
__device__ __forceinline__ float zt_block_sum(float v)
{
    __shared__ float part[ZT_WARP_SIZE];
    __shared__ float total;
    const int lane = threadIdx.x % ZT_WARP_SIZE, warp = threadIdx.x / ZT_WARP_SIZE;
    const int nwarps = blockDim.x / ZT_WARP_SIZE;
    v = zt_warp_sum(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? part[lane] : 0.0f;
        w = zt_warp_sum(w);
        if (lane == 0)
            total = w;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

/* Maximum over the whole block, like zt_block_sum. */
__device__ __forceinline__ float zt_block_max(float v)
{
    __shared__ float part[ZT_WARP_SIZE];
    __shared__ float total;
    const int lane = threadIdx.x % ZT_WARP_SIZE, warp = threadIdx.x / ZT_WARP_SIZE;
    const int nwarps = blockDim.x / ZT_WARP_SIZE;
    v = zt_warp_max(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? part[lane] : -INFINITY;
        w = zt_warp_max(w);
        if (lane == 0)
            total = w;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

/* GELU, tanh approximation, and its derivative (GPT-2's; kernels/activation.h). */
#define ZT_GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

__device__ __forceinline__ float zt_gelu(float x)
{
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(ZT_GELU_SCALE * (x + cube)));
}

__device__ __forceinline__ float zt_gelu_grad(float x)
{
    float cube = 0.044715f * x * x * x;
    float t = tanhf(ZT_GELU_SCALE * (x + cube));
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * ZT_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif
