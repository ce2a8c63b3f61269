/* Residual connection: out = a + b. Its backward passes dout unchanged to both inputs, which callers do
 * with zt_cpu_add_inplace (gradients accumulate). */
#ifndef ZT_KERNELS_RESIDUAL_H
#define ZT_KERNELS_RESIDUAL_H

#include <stddef.h>

#include "kernels/real.h"

void zt_cpu_residual_forward(zt_real *out, const zt_real *a, const zt_real *b, size_t n);
/* Accumulates (+=) dout into da and db (either may be NULL). */
void zt_cpu_residual_backward(zt_real *da, zt_real *db, const zt_real *dout, size_t n);
/* y += x */
void zt_cpu_add_inplace(zt_real *y, const zt_real *x, size_t n);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/residual.cu); every buffer holds n `dtype` elements (F32, F16 or BF16).
 * out may equal a or b. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, enum zt_dtype dtype,
                              cudaStream_t stream);
/* Accumulates (+=) dout into da and db (either may be NULL). */
void zt_cuda_residual_backward(void *da, void *db, const void *dout, size_t n, enum zt_dtype dtype,
                               cudaStream_t stream);
/* y += x */
void zt_cuda_add_inplace(void *y, const void *x, size_t n, enum zt_dtype dtype, cudaStream_t stream);
/* y (dtype) += x (fp32): a gradient kept in fp32 beside the compute dtype (T5's relative position bias
 * tables, which the attention kernels read and write in fp32). */
void zt_cuda_add_f32(void *y, const float *x, size_t n, enum zt_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
