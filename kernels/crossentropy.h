/* Fused softmax + cross-entropy over logits [N,V] with integer targets [N].
 * Rows whose target equals ignore_index contribute loss 0 and gradient 0. */
#ifndef ZT_KERNELS_CROSSENTROPY_H
#define ZT_KERNELS_CROSSENTROPY_H

#include <stdint.h>

#include "kernels/real.h"

/* Writes losses[n] = -log softmax(logits[n])[targets[n]] (0 for ignored rows). If dlogits is not NULL,
 * also writes (overwrites) dlogits[n,:] = grad_scale * (softmax(logits[n]) - onehot(targets[n])), where
 * grad_scale is typically 1 / (number of non-ignored rows). dlogits may alias logits. Returns the number
 * of rows that were not ignored. A target outside [0,V) that is not ignore_index is a caller's bug. */
int zt_cpu_crossentropy_forward_backward(zt_real *losses, zt_real *dlogits, const zt_real *logits,
                                         const int32_t *targets, int N, int V, int ignore_index,
                                         float grad_scale);

#ifdef ZT_WITH_CUDA
/* CUDA twin (kernels/cuda/crossentropy.cu): the fused classifier. logits and dlogits hold `dtype` elements
 * (F32, F16 or BF16) in rows of P >= V elements (P > V for a vocabulary padded for speed, e.g. 50304
 * for GPT-2's 50257; columns [V,P) take no part in the softmax). losses [N] are fp32; targets [N] are
 * device int32. One block per row: the row is read twice (max/sum, then the gradient) and never
 * copied to fp32. dlogits may equal logits (the gradient replaces the logits in place) or be NULL
 * (losses only); when written, its columns [V,P) are set to 0, and ignored rows are all 0.
 * d_valid_count, if not NULL, is a device int to which the number of rows not ignored is added. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_crossentropy_forward_backward(float *losses, void *dlogits, const void *logits,
                                           const int32_t *targets, int N, int V, int P, int ignore_index,
                                           float grad_scale, int *d_valid_count, enum zt_dtype dtype,
                                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
