/* Self-attention over a packed qkv tensor, flash style: no T x T matrix is kept between forward and
 * backward, only the log-sum-exp of each query row. Scale 1/sqrt(HS).
 *
 * Causal multi-head attention (GPT-2; the first entry points):
 *   qkv [B,T,3C] laid out as (q | k | v), each C = NH * HS with head h at columns h*HS..;
 *   out [B,T,C] (heads concatenated); lse [B,NH,T].
 *
 * The general entry points (*_gqa; LLaMA, BERT) add grouped-query heads, bidirectional attention and a
 * padding mask, with zt_attention_dims for the shape:
 *   qkv [B,T,(NH+2*NKV)*HS]: each row holds NH query heads, then NKV key heads, then NKV value heads (what
 *       one matmul produces whose weight stacks the q, k and v projections' rows in that order); query head
 *       h reads key/value head h / (NH / NKV), as Hugging Face's repeat_kv pairs them. NKV = NH is
 *       multi-head attention with the layout above (3C = (NH + 2 NH) HS);
 *   out [B,T,NH*HS]; lse [B,NH,T].
 *   Padding mask: lens holds B valid lengths (NULL: none; values are clamped to [0,T]). In sequence b, keys
 *   at t >= lens[b] are masked for every query, and query rows t >= lens[b] produce zeros in out and +inf
 *   in lse; the backward adds nothing to the rows t >= lens[b] of dqkv (q, k and v parts). With padding on
 *   the right, as BERT's tokenizers put it, a causal row below the length never sees a padded key anyway. */
#ifndef ZT_KERNELS_ATTENTION_H
#define ZT_KERNELS_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/real.h"

/* The shape of a call of the general entry points. */
typedef struct zt_attention_dims {
    int B, T;    /* sequences, positions */
    int NH;      /* query heads */
    int NKV;     /* key/value heads, NH % NKV == 0 */
    int HS;      /* head size */
    bool causal; /* true: row t sees keys 0..t; false: every key of its sequence (bidirectional) */
} zt_attention_dims;

void zt_cpu_attention_forward(zt_real *out, zt_real *lse, const zt_real *qkv, int B, int T, int C, int NH);
/* Accumulates (+=) into dqkv [B,T,3C]. Uses out and lse of the forward pass. */
void zt_cpu_attention_backward(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                               const zt_real *lse, int B, int T, int C, int NH);

/* General forward (layout above); lens is a host array or NULL. Any head size. The multi-head entry points
 * above are this one with NKV = NH, causal, no mask (same bits). */
void zt_cpu_attention_forward_gqa(zt_real *out, zt_real *lse, const zt_real *qkv, const int32_t *lens,
                                  const zt_attention_dims *d);
/* Accumulates (+=) into dqkv [B,T,(NH+2*NKV)*HS]; uses out and lse of the forward pass and the same lens. A
 * key/value head's gradient sums its NH / NKV query heads in head order. */
void zt_cpu_attention_backward_gqa(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                                   const zt_real *lse, const int32_t *lens, const zt_attention_dims *d);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/attention.cu, attention_generic.cu), flash style: tiles of queries and keys in
 * shared memory, an online softmax in fp32, nothing of size T x T in memory, backward passes without
 * atomics (the same inputs give the same bits). qkv, out, dout, dqkv hold `dtype` elements (F32, F16 or
 * BF16); lse [B,NH,T] and the scratch are fp32; lens is a device array. Any T.
 *
 * Head sizes 32, 64, 80, 96 and 128, and 256 on GPUs that give a block 66 KiB of shared memory (all but
 * sm_75); zt_cuda_attention_supported and zt_cuda_attention_gqa_supported tell, so that a model can refuse
 * a config early (a head size of 40, say). Causal multi-head attention at head sizes 64 and 128 runs tuned
 * kernels (tensor cores for F16 and BF16 where the GPU has them), and so do grouped-query and bidirectional
 * attention, padded or not, at those head sizes in F16 and BF16 on sm_80+ (the mma.sync kernels; a
 * key/value head's dK and dV sum its query heads in order); every other shape runs generic kernels,
 * on the tensor cores for F16 and BF16 on sm_80+ up to head size 128, on the CUDA cores otherwise. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

/* Whether the CUDA kernels serve C channels in NH heads (causal multi-head attention). */
bool zt_cuda_attention_supported(int C, int NH);
/* Whether the CUDA kernels serve the general shape d (its head size and NH % NKV == 0; B and T are free). */
bool zt_cuda_attention_gqa_supported(const zt_attention_dims *d);
/* For F16 and BF16 the launchers use tensor-core (WMMA) kernels where the GPU (bf16: sm_80+, fp16:
 * sm_70+), the build, 16-byte aligned buffers and the shared memory allow, and CUDA-core kernels
 * otherwise (and always for F32). Passing false forces the CUDA-core kernels, process-wide: for tests
 * that check both and for comparisons. */
void zt_cuda_attention_use_tensor_cores(bool on);
void zt_cuda_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                               enum zt_dtype dtype, cudaStream_t stream);
/* Bytes of device scratch zt_cuda_attention_backward needs (the fp32 row sums of dout * out). */
size_t zt_cuda_attention_backward_scratch_size(int B, int T, int NH);
/* Accumulates (+=) into dqkv [B,T,3C]. Deterministic: dK and dV come from one pass over key tiles and
 * dQ from a second pass over query tiles, so every element is written by one thread (no atomics). */
void zt_cuda_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                const float *lse, int B, int T, int C, int NH, void *scratch,
                                enum zt_dtype dtype, cudaStream_t stream);
/* zt_cuda_attention_backward, except that dqkv is overwritten (=) instead of added into, so the caller
 * need not zero it first. The mma.sync kernels store their results directly; the other kernels run on a
 * dqkv zeroed here. */
void zt_cuda_attention_backward_overwrite(void *dqkv, const void *dout, const void *qkv, const void *out,
                                          const float *lse, int B, int T, int C, int NH, void *scratch,
                                          enum zt_dtype dtype, cudaStream_t stream);

/* Padding mask, added to the causal one: lens is a device array of B int32 valid lengths (NULL: no
 * padding, exactly the launchers above). In sequence b, query rows t >= lens[b] produce zeros in out and
 * +inf in lse; rows below see only keys below them, so keys >= lens[b] are masked too. The backward pass
 * adds nothing to the rows of dqkv at t >= lens[b] (q, k and v parts); it reads the mask from lse, so
 * lens only lets it skip the padded tiles. Lengths above T count as T, below 0 as 0. */
void zt_cuda_attention_forward_masked(void *out, float *lse, const void *qkv, const int32_t *lens, int B, int T,
                                      int C, int NH, enum zt_dtype dtype, cudaStream_t stream);
void zt_cuda_attention_backward_masked(void *dqkv, const void *dout, const void *qkv, const void *out,
                                       const float *lse, const int32_t *lens, int B, int T, int C, int NH,
                                       void *scratch, enum zt_dtype dtype, cudaStream_t stream);
/* The general entry points (layout and padding as at the top of this file). The multi-head launchers above
 * are these with NKV = NH and causal. */
void zt_cuda_attention_forward_gqa(void *out, float *lse, const void *qkv, const int32_t *lens,
                                   const zt_attention_dims *d, enum zt_dtype dtype, cudaStream_t stream);
/* Bytes of device scratch zt_cuda_attention_backward_gqa needs (B*NH*T floats). */
size_t zt_cuda_attention_backward_gqa_scratch_size(const zt_attention_dims *d);
/* accumulate: adds (+=) into dqkv [B,T,(NH+2*NKV)*HS]; else overwrites it (padded rows become zeros). */
void zt_cuda_attention_backward_gqa(void *dqkv, const void *dout, const void *qkv, const void *out,
                                    const float *lse, const int32_t *lens, const zt_attention_dims *d,
                                    bool accumulate, void *scratch, enum zt_dtype dtype, cudaStream_t stream);
/* Runs the generic kernels for every shape, the tuned ones' included, when on (default off). Process-wide,
 * for tests that check the generic kernels at head sizes 64 and 128 and for comparisons. */
void zt_cuda_attention_use_generic(bool on);

/* For F16 and BF16 on sm_80+, the launchers prefer the mma.sync kernels (FlashAttention-2 style: fragments
 * in registers, ldmatrix, cp.async double buffering) over the WMMA ones when this is on (the default,
 * zt_cuda_attention_mma_default). Process-wide, like zt_cuda_attention_use_tensor_cores (which, when off,
 * turns both off). These choices change the result bits, so they are never read from the environment:
 * only a program (a test, a benchmark) calls these setters. */
void zt_cuda_attention_use_mma(bool on);
/* Whether the mma.sync kernels are preferred unless zt_cuda_attention_use_mma says otherwise. */
bool zt_cuda_attention_mma_default(void);
/* Rows of the tile each warp of the mma.sync kernels owns at head size 64: 32 (the default: every
 * operand fragment read from shared memory feeds two products) or 16 (the earlier kernels, kept to compare
 * against); 0 returns to the default. Head size 128 always runs 16. Process-wide. */
void zt_cuda_attention_mma_warp_rows(int rows);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
