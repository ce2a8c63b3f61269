/* RMS normalisation over the last dimension, as LLaMA uses it: out = x * rstd * weight with
 * rstd = 1 / sqrt(mean(x^2) + eps). No mean is subtracted and there is no bias.
 * Shapes: inp, out [N,C]; weight [C]; rstd [N] (saved for backward). */
#ifndef ZT_KERNELS_RMSNORM_H
#define ZT_KERNELS_RMSNORM_H

#include "kernels/real.h"

/* Writes out and rstd. The sum of squares of a row is accumulated in double. */
void zt_cpu_rmsnorm_forward(zt_real *out, zt_real *rstd, const zt_real *inp, const zt_real *weight, int N, int C,
                            float eps);
/* Accumulates (+=) into dinp [N,C] and dweight [C]. Uses rstd of the forward pass. */
void zt_cpu_rmsnorm_backward(zt_real *dinp, zt_real *dweight, const zt_real *dout, const zt_real *inp,
                             const zt_real *weight, const zt_real *rstd, int N, int C);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/rmsnorm.cu). inp, out, weight, dout, dinp, dweight hold `dtype` elements (F32,
 * F16 or BF16); rstd is fp32 always, and so is all arithmetic. Any C >= 1 (rows whose length in bytes is a
 * multiple of 16, in 16-byte aligned buffers, are read with 16-byte loads); one warp per row. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps,
                             enum zt_dtype dtype, cudaStream_t stream);
/* Bytes of fp32 device scratch that zt_cuda_rmsnorm_backward needs: the partial column sums of dweight
 * over a fixed number of row slices (a function of N alone), added in a fixed order by a second kernel,
 * so that the result is the same bits on every run. */
size_t zt_cuda_rmsnorm_backward_scratch_size(int N, int C);
/* Accumulates (+=) into dinp [N,C] and dweight [C]; scratch as above, 16-byte aligned, free to reuse once
 * the stream has passed this call. */
void zt_cuda_rmsnorm_backward(void *dinp, void *dweight, const void *dout, const void *inp, const void *weight,
                              const float *rstd, int N, int C, void *scratch, enum zt_dtype dtype,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
