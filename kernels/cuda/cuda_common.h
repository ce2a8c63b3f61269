/* Basics of ztrain's CUDA backend, for C and CUDA callers: the checks that abort on a failed CUDA or
 * cuBLAS call, the choice of the low-precision element type for a GPU, casts between fp32, bf16 and
 * fp16 buffers, and the inf/NaN check behind fp16 loss scaling.
 *
 * Element types. Every launcher of the CUDA backend takes untyped pointers and an enum zt_dtype
 * (ZT_DTYPE_F32, ZT_DTYPE_F16 or ZT_DTYPE_BF16) that says what they point to; inside the .cu files a
 * template per op is instantiated for the three types. One entry point per op keeps the callers free of
 * a compile-time element type: the trainer picks bf16 or fp16 at run time from the GPU it finds
 * (zt_cuda_pick_dtype) and passes it down. Arithmetic is fp32 whatever the storage type. Statistics
 * saved for backward (layer-norm mean/rstd, attention lse), losses and optimizer state are always fp32.
 *
 * Launchers never synchronise with the host. A broken precondition (shape, alignment, dtype) is a
 * caller's bug and aborts with file and line; a failed launch aborts through ZT_CUDA_CHECK. */
#ifndef ZT_KERNELS_CUDA_COMMON_H
#define ZT_KERNELS_CUDA_COMMON_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

/* Aborts with file, line, the failed call and CUDA's message when a CUDA runtime call fails. */
#define ZT_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t zt_cuda_err_ = (call);                                                         \
        if (zt_cuda_err_ != cudaSuccess)                                                           \
            zt__cuda_fail(__FILE__, __LINE__, #call, (int)zt_cuda_err_);                           \
    } while (0)

/* The same for cuBLAS / cuBLASLt calls (their status type is an int-valued enum). */
#define ZT_CUBLAS_CHECK(call)                                                                      \
    do {                                                                                           \
        int zt_cublas_st_ = (int)(call);                                                           \
        if (zt_cublas_st_ != 0)                                                                    \
            zt__cublas_fail(__FILE__, __LINE__, #call, zt_cublas_st_);                             \
    } while (0)

void zt__cuda_fail(const char *file, int line, const char *call, int err) __attribute__((noreturn));
void zt__cublas_fail(const char *file, int line, const char *call, int status) __attribute__((noreturn));

/* Returns ZT_DTYPE_BF16 for a GPU of compute capability 8.0 or newer and ZT_DTYPE_F16 below (sm_75 has
 * no bf16 matrix units; fp16 there needs loss scaling). Aborts if the device cannot be queried. */
enum zt_dtype zt_cuda_pick_dtype(int device);

/* Page-locked host memory for copies to and from the GPU at the bus's speed: every page-locked
 * allocation of ztrain goes through these two. Returns zeroed memory, or NULL when the memory (or the
 * locked-memory limit, ulimit -l) is not there; the caller says what it was for. Free accepts NULL. */
void *zt_cuda_host_alloc(size_t bytes);
void zt_cuda_host_free(void *p);

/* Writes n elements of dst (dst_dtype) converted from src (src_dtype), rounding to nearest even.
 * Both dtypes must be F32, F16 or BF16; dst and src must not overlap unless they are equal and the
 * dtypes are the same size. */
void zt_cuda_cast(void *dst, enum zt_dtype dst_dtype, const void *src, enum zt_dtype src_dtype, size_t n,
                  cudaStream_t stream);

/* Sets *d_flag (a device int) to 1 if any of the n elements of x is inf or NaN; never clears it, so one
 * flag can collect the checks of many buffers (zero it with cudaMemsetAsync before the first). */
void zt_cuda_check_finite(int *d_flag, const void *x, size_t n, enum zt_dtype dtype, cudaStream_t stream);

/* dst[i] = src[i] * scale (overwrite nonzero) or dst[i] += src[i] * scale, for n elements: folds a
 * block's low-precision gradients into the fp32 gradient buffer (removing the loss scale on the way). */
void zt_cuda_accumulate(float *dst, const void *src, enum zt_dtype src_dtype, size_t n, float scale,
                        int overwrite, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
