/* GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#ifndef ZT_KERNELS_ACTIVATION_H
#define ZT_KERNELS_ACTIVATION_H

#include <stddef.h>

#include "kernels/real.h"

void zt_cpu_gelu_forward(zt_real *out, const zt_real *inp, size_t n);
/* Accumulates (+=) into dinp. */
void zt_cpu_gelu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/activation.cu); every buffer holds n `dtype` elements (F32, F16 or BF16).
 * out may equal inp. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_gelu_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream);
/* Accumulates (+=) into dinp. */
void zt_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
