/* Layer normalisation over the last dimension: out = (x - mean) * rstd * weight + bias.
 * Shapes: inp, out [N,C]; weight, bias [C]; mean, rstd [N] (saved for backward). */
#ifndef ZT_KERNELS_LAYERNORM_H
#define ZT_KERNELS_LAYERNORM_H

#include "kernels/real.h"

void zt_cpu_layernorm_forward(zt_real *out, zt_real *mean, zt_real *rstd, const zt_real *inp,
                              const zt_real *weight, const zt_real *bias, int N, int C, float eps);
/* Accumulates (+=) into dinp [N,C], dweight [C] and dbias [C]. */
void zt_cpu_layernorm_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                               const zt_real *inp, const zt_real *weight, const zt_real *mean,
                               const zt_real *rstd, int N, int C);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/layernorm.cu). inp, out, weight, bias, dout, dinp, dweight, dbias hold `dtype`
 * elements (F32, F16 or BF16); mean and rstd are fp32 always. C must be a multiple of 8 and at most
 * 6144. One warp per row. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                               const void *bias, int N, int C, float eps, enum zt_dtype dtype,
                               cudaStream_t stream);
/* Bytes of fp32 device scratch that zt_cuda_layernorm_backward needs (per-block partial sums of
 * dweight and dbias, reduced in a fixed order by a second kernel, so the result is deterministic). */
size_t zt_cuda_layernorm_backward_scratch_size(int N, int C);
/* Accumulates (+=) into dinp [N,C], dweight [C] and dbias [C]; scratch as above, 16-byte aligned. */
void zt_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout, const void *inp,
                                const void *weight, const float *mean, const float *rstd, int N, int C,
                                void *scratch, enum zt_dtype dtype, cudaStream_t stream);
/* zt_cuda_layernorm_backward, except that dinp is overwritten (=): the bits of zeroing it first and adding,
 * without the zeroing and the read. dweight and dbias still accumulate. */
void zt_cuda_layernorm_backward_overwrite(void *dinp, void *dweight, void *dbias, const void *dout,
                                          const void *inp, const void *weight, const float *mean, const float *rstd,
                                          int N, int C, void *scratch, enum zt_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
