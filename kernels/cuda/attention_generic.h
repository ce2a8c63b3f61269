/* The generic attention kernels of the CUDA backend (kernels/cuda/attention_generic.cu), which
 * kernels/cuda/attention.cu runs for every shape its tuned kernels do not serve, and the packed-qkv
 * dispatch of attention.cu with a kernel variant (for attention_desc.cu). Internal to kernels/cuda/:
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
/* Writes out and lse (padded rows: zeros and +inf); v (not NULL) may keep the calls on the CUDA cores. */
void zt__cuda_attention_generic_forward(void *out, float *lse, const void *qkv, const int32_t *lens,
                                        const zt_attention_dims *d, enum zt_dtype dtype, cudaStream_t stream,
                                        const zt_attention_variant *v);
/* Adds (+=) into dqkv; D: B*NH*T floats of device scratch. */
void zt__cuda_attention_generic_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                         const float *lse, const int32_t *lens, const zt_attention_dims *d, float *D,
                                         enum zt_dtype dtype, cudaStream_t stream, const zt_attention_variant *v);
/* Whether the packed-qkv kernels (attention.cu, attention_generic.cu) serve d: its head size is one they are
 * built for and NH % NKV == 0. zt_cuda_attention_gqa_supported says more: the packed entry points send other
 * head sizes (up to 256) to the descriptor's general kernels. */
bool zt__cuda_attention_packed_serves(const zt_attention_dims *d);
/* zt_cuda_attention_forward_gqa and zt_cuda_attention_backward_gqa (attention.cu) with a kernel variant (NULL:
 * the default choice) for the shapes zt__cuda_attention_packed_serves accepts; the descriptor chooser
 * (attention_desc.cu) calls these for packed-qkv descriptors. */
void zt__cuda_attention_packed_forward(void *out, float *lse, const void *qkv, const int32_t *lens,
                                       const zt_attention_dims *d, enum zt_dtype dtype, cudaStream_t stream,
                                       const zt_attention_variant *v);
void zt__cuda_attention_packed_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                        const float *lse, const int32_t *lens, const zt_attention_dims *d,
                                        bool accumulate, void *scratch, enum zt_dtype dtype, cudaStream_t stream,
                                        const zt_attention_variant *v);
/* Bytes of scratch the packed backward needs with the variant's single_pass (mma.sync head sizes 64 and 128):
 * D, the fp32 dQ rows and the counters of its ordered additions. */
size_t zt__cuda_attention_single_pass_scratch_size(const zt_attention_dims *d);

#ifdef __cplusplus
}
#endif

#endif
