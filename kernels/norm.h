/* Global L2 norm helpers for gradient clipping. */
#ifndef ZT_KERNELS_NORM_H
#define ZT_KERNELS_NORM_H

#include <stddef.h>

#include "kernels/real.h"

/* Sum of squares of x[0..n), accumulated in double in a fixed order (independent of thread count). */
double zt_cpu_sum_squares(const zt_real *x, size_t n);
/* x *= s */
void zt_cpu_scale_inplace(zt_real *x, float s, size_t n);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/norm.cu). The global norm is deterministic: each tensor's sum of squares is
 * split over a fixed grid of ZT_CUDA_NORM_SLOTS blocks whose partial sums land in fixed slots, and one
 * block adds the slots in order. x holds `dtype` elements (F32, F16 or BF16); sums are fp32. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

#define ZT_CUDA_NORM_SLOTS 512

/* Adds the sum of squares of x[0..n) into the device array partials[ZT_CUDA_NORM_SLOTS] (zero it once
 * with cudaMemsetAsync, then call this for every tensor of the global norm). F16 and BF16 data give the
 * same bits as F32 data holding the same values (x 16-byte aligned in fp32, 8-byte in fp16/bf16). */
void zt_cuda_sum_squares_accumulate(float *partials, const void *x, size_t n, enum zt_dtype dtype,
                                    cudaStream_t stream);
/* *d_out = the sum of partials[0..ZT_CUDA_NORM_SLOTS), added in a fixed order. */
void zt_cuda_sum_squares_finish(float *d_out, const float *partials, cudaStream_t stream);
/* One tensor's sum of squares: zeroes partials, accumulates x, finishes into *d_out. */
void zt_cuda_sum_squares(float *d_out, float *partials, const void *x, size_t n, enum zt_dtype dtype,
                         cudaStream_t stream);
/* *d_scale = max_norm / (sqrt(*d_sumsq) + 1e-6) if that is below 1, else 1 (PyTorch's
 * clip_grad_norm_); max_norm <= 0 disables clipping (*d_scale = 1). Feeds zt_cuda_adamw_update. */
void zt_cuda_clip_scale(float *d_scale, const float *d_sumsq, float max_norm, cudaStream_t stream);
/* x *= s */
void zt_cuda_scale_inplace(void *x, float s, size_t n, enum zt_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
