/* The first token of every sequence: BERT's pooler and sequence-classification head start from it.
 *
 * Composed from the other families: pooled = tanh(first_token(h) W_p^T + b_p) (matmul.h, activation.h),
 * logits = pooled W_c^T + b_c with num_labels outputs, then softmax cross-entropy with one label per
 * sequence (crossentropy.h, N = B rows of V = num_labels; on the GPU P = V: no padded columns). A label
 * equal to the ignore_index adds neither loss nor gradient.
 * Shapes: h, dh [B,T,C]; first, dfirst [B,C]. */
#ifndef ZT_KERNELS_POOLER_H
#define ZT_KERNELS_POOLER_H

#include "kernels/real.h"

/* Writes first[b,:] = h[b,0,:]. */
void zt_cpu_first_token_forward(zt_real *first, const zt_real *h, int B, int T, int C);
/* Accumulates (+=) dfirst[b,:] into dh[b,0,:]; the other rows of dh are not touched. */
void zt_cpu_first_token_backward(zt_real *dh, const zt_real *dfirst, int B, int T, int C);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/pooler.cu); buffers hold `dtype` elements (F32, F16 or BF16). */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_first_token_forward(void *first, const void *h, int B, int T, int C, enum zt_dtype dtype,
                                 cudaStream_t stream);
/* Accumulates (+=) into rows t = 0 of dh. */
void zt_cuda_first_token_backward(void *dh, const void *dfirst, int B, int T, int C, enum zt_dtype dtype,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
