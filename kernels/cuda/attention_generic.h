/* The generic attention kernels of the CUDA backend (kernels/cuda/attention_generic.cu), which
 * kernels/cuda/attention.cu runs for every shape its tuned kernels do not serve. Internal to kernels/cuda/:
 * callers use the launchers of kernels/attention.h. Layout, lengths and lse as kernels/attention.h says. */
#ifndef ZT_KERNELS_CUDA_ATTENTION_GENERIC_H
#define ZT_KERNELS_CUDA_ATTENTION_GENERIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

/* Whether the kernels are built for head size HS and fit this GPU's shared memory in every dtype (head
 * size 256 in fp32 needs 66 KiB per block: not sm_75). For head size 256, false when no GPU can be
 * queried. */
bool zt__cuda_attention_generic_serves(int HS);
/* Whether tensor-core kernels may run (zt_cuda_attention_use_tensor_cores and zt_cuda_attention_use_mma
 * both on); defined in attention.cu, which owns those settings. */
bool zt__cuda_attention_mma_allowed(void);
/* Writes out and lse (padded rows: zeros and +inf). */
void zt__cuda_attention_generic_forward(void *out, float *lse, const void *qkv, const int32_t *lens,
                                        const zt_attention_dims *d, enum zt_dtype dtype, cudaStream_t stream);
/* Adds (+=) into dqkv; D: B*NH*T floats of device scratch. */
void zt__cuda_attention_generic_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                         const float *lse, const int32_t *lens, const zt_attention_dims *d, float *D,
                                         enum zt_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
