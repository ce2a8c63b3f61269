/* Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], and BERT's, which adds a token-type
 * embedding: out[b,t,:] = wte[tokens[b,t],:] + wtt[types[b,t],:] + wpe[t,:] (summed in that order).
 * Shapes: tokens [B,T] int32 in [0,V); wte [V,C]; wpe [maxT,C] with T <= maxT; types [B,T] int32 in
 * [0,NTT); wtt [NTT,C]; out [B,T,C]. */
#ifndef ZT_KERNELS_EMBEDDING_H
#define ZT_KERNELS_EMBEDDING_H

#include <stdint.h>

#include "kernels/real.h"

/* wpe NULL: a token embedding without positions (LLaMA, whose positions enter through RoPE), out[b,t,:] =
 * wte[tokens[b,t],:] exactly; the backward then takes dwpe NULL. The CUDA twins take NULL the same way. */
void zt_cpu_embedding_forward(zt_real *out, const int32_t *tokens, const zt_real *wte, const zt_real *wpe,
                              int B, int T, int C);
/* Accumulates (+=) into dwte [V,C] and dwpe [maxT,C] (NULL: none). Deterministic: rows of dwte are summed in
 * token order. */
void zt_cpu_embedding_backward(zt_real *dwte, zt_real *dwpe, const zt_real *dout, const int32_t *tokens,
                               int B, int T, int C);
/* With token types (BERT). */
void zt_cpu_embedding_forward_typed(zt_real *out, const int32_t *tokens, const int32_t *types, const zt_real *wte,
                                    const zt_real *wpe, const zt_real *wtt, int B, int T, int C);
/* Accumulates (+=) into dwte [V,C], dwpe [maxT,C] and dwtt [NTT,C], every row summed in (b,t) order. */
void zt_cpu_embedding_backward_typed(zt_real *dwte, zt_real *dwpe, zt_real *dwtt, const zt_real *dout,
                                     const int32_t *tokens, const int32_t *types, int B, int T, int C);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/embedding.cu). out, wte, wpe, dout, dwte, dwpe hold `dtype` elements (F32, F16
 * or BF16); tokens is a device int32 array; C must be a multiple of 8. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe, int B,
                               int T, int C, enum zt_dtype dtype, cudaStream_t stream);
/* Bytes of device scratch that zt_cuda_embedding_backward needs for B*T tokens below V. */
size_t zt_cuda_embedding_backward_scratch_size(int B, int T, int V);
/* Accumulates (+=) into dwte [V,C] and dwpe [maxT,C], deterministically and without float atomics: the
 * positions are sorted by token (stable radix sort on the device, so each token's positions stay in
 * order), then one block per distinct token sums its rows in position order, as the CPU twin does.
 * scratch: zt_cuda_embedding_backward_scratch_size(B, T, V) bytes of device memory, 16-byte aligned,
 * free to reuse once the stream has passed this call. Tokens must lie in [0,V). */
void zt_cuda_embedding_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tokens, int B,
                                int T, int C, int V, void *scratch, enum zt_dtype dtype, cudaStream_t stream);

/* Most token types the CUDA typed backward takes (BERT has 2). */
#define ZT_CUDA_EMBEDDING_MAX_TYPES 16

/* With token types (BERT): types is a device int32 array [B,T]; wtt, dwtt hold `dtype` elements. */
void zt_cuda_embedding_forward_typed(void *out, const int32_t *tokens, const int32_t *types, const void *wte,
                                     const void *wpe, const void *wtt, int B, int T, int C, enum zt_dtype dtype,
                                     cudaStream_t stream);
/* Bytes of device scratch zt_cuda_embedding_backward_typed needs. */
size_t zt_cuda_embedding_backward_typed_scratch_size(int B, int T, int C, int V, int NTT);
/* zt_cuda_embedding_backward, plus dwtt [NTT,C] (+=), NTT <= ZT_CUDA_EMBEDDING_MAX_TYPES and types in [0,NTT):
 * each slice of a fixed number of positions (a function of B*T) sums its rows per type in position order,
 * and a second kernel adds the slices in order, so the result is deterministic without atomics. */
void zt_cuda_embedding_backward_typed(void *dwte, void *dwpe, void *dwtt, const void *dout, const int32_t *tokens,
                                      const int32_t *types, int B, int T, int C, int V, int NTT, void *scratch,
                                      enum zt_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
