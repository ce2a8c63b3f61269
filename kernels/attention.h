/* Attention, flash style: no Tq x Tk matrix is kept between forward and backward, only the log-sum-exp of
 * each query row.
 *
 * Every call can be written as one descriptor (zt_attention_desc, below): q, k and v as separate tensors
 * with row strides (packed qkv and a separate kv both fit), Tq and Tk, grouped-query heads, a scale, causal
 * (bottom-right aligned) or bidirectional, a sliding window, T5's relative position bias with its gradient,
 * variable lengths by cu_seqlens and padding lengths; zt_cpu_attention_fwd / _bwd run it on the CPU (the
 * reference) and zt_cuda_attention_fwd / _bwd on the GPU (the one chooser of the CUDA kernels).
 *
 * The packed-qkv entry points below (the models' interface before the descriptor) stay: on the CPU they are
 * wrappers over the descriptor with the same bits as before, on the GPU they run the kernels the descriptor's
 * chooser runs for packed-qkv descriptors. Their layout, scale 1/sqrt(HS):
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

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/real.h"

/* The shape of a call of the general entry points. */
typedef struct zt_attention_dims {
    int B, T;    /* sequences, positions */
    int NH;      /* query heads */
    int NKV;     /* key/value heads, NH % NKV == 0 */
    int HS;      /* head size */
    bool causal; /* true: row t sees keys 0..t; false: every key of its sequence (bidirectional) */
} zt_attention_dims;

/* ---- the descriptor: one struct for every attention call ----
 *
 * Rows. Query rows (q, out, dout, dq) and key rows (k, v, dk, dv) are rows of 2-D tensors with a row stride in
 * elements; in a row, query head h occupies columns h*HS .. h*HS+HS-1 and key/value head g columns g*HS.. of
 * k and v. Packed qkv [N, (NH+2*NKV)*HS] is q = qkv, k = qkv + NH*HS, v = qkv + (NH+NKV)*HS with all three
 * strides (NH+2*NKV)*HS; a separate kv tensor (T5's cross-attention) is just other pointers and strides.
 *
 * Sequences. Fixed layout (cu_seqlens_q == NULL): B sequences of Tq query rows and Tk key rows, sequence b at
 * query rows b*Tq.. and key rows b*Tk... Variable lengths (cu_seqlens_q and cu_seqlens_k, both B+1 int32
 * prefix sums starting at 0): sequence b is query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and key rows
 * cu_seqlens_k[b] ..; Tq and Tk are then the longest lengths (at least every sequence's length). Packed
 * documents and padding-free batches are this layout: every sequence attends only within itself and its
 * positions restart at 0. Padding (BERT): lens, B valid lengths, with the fixed layout and Tq == Tk; keys at
 * or past lens[b] are masked and query rows at or past it get zeros and lse = +inf (values clamped to [0,T]).
 *
 * Masks. In a sequence of lq query rows and lk key rows, query i sits at position i + lk - lq (queries are
 * aligned with the end of the keys, "bottom-right", as FlashAttention 2.1+ and a decoder continuing a cache
 * do; with lq == lk it is position i). Query i sees key j iff
 *     (!causal || j <= i + lk - lq) && (window < 0 || j >= i + lk - lq - window)
 * so window = W lets a query see itself and the W keys before it (FlashAttention's window_size = (W, 0)).
 * A query that sees no key (causal with lq > lk, or past a length) gets zeros in out and lse = +inf, and
 * contributes nothing to any gradient.
 *
 * Scores. s_ij = scale * q_i . k_j + bias_ij, with scale <= 0 meaning 1/sqrt(HS) (T5 sets 1). The optional
 * bias is T5's relative position bias: bias_ij = bias_table[bucket(j - pos_i) * NH + h] with pos_i the query
 * position above and bucket = zt_attention_t5_bucket(rel, bias_bidirectional, num_buckets, max_distance) as
 * in transformers' T5Attention._relative_position_bucket (the encoder is bidirectional, the decoder's
 * self-attention not). The table is [num_buckets, NH] in fp32 (float) on the GPU, zt_real on the CPU.
 *
 * Outputs. The forward writes out (out_stride; head h at column h*HS) and lse, fp32 (zt_real on the CPU)
 * log-sum-exp of each query row of each head, [B, NH, Tq]: sequence b, head h, row t at (b*NH + h)*Tq + t
 * (with cu_seqlens, t counts from the sequence's first row and entries past its length are untouched). The
 * backward reads out and lse and writes or adds (zt_attention_grads.accumulate) dq, dk, dv and dbias_table.
 * A key/value head's dk and dv sum its NH / NKV query heads. */

/* Keeps the kind of additive bias of a descriptor. Values only grow. */
enum zt_attention_bias {
    ZT_ATTENTION_BIAS_NONE = 0,
    ZT_ATTENTION_BIAS_T5 = 1, /* bucketed relative position bias, bias_table [num_buckets, NH] */
};

/* Most buckets of a T5 bias the GPU kernels take (the CPU takes any number). */
#define ZT_ATTENTION_MAX_BUCKETS 256

/* The kernel family of a CUDA call, for the tests and benchmarks that compare the families; NULL (or all
 * fields zero) is the production choice. These choices change result bits, so only a program sets them,
 * never the environment. The CPU ignores it. */
typedef struct zt_attention_variant {
    bool cuda_cores;   /* CUDA-core (SIMT) kernels only, no tensor cores */
    bool wmma;         /* the WMMA kernels where the mma.sync ones would run (tensor cores, sm_70+ fp16, sm_80+ bf16) */
    bool generic;      /* the generic packed-qkv kernels even at the tuned head sizes 64 and 128 */
    bool general;      /* the descriptor's general kernels even for packed-qkv descriptors */
    int mma_warp_rows; /* rows per warp of the mma.sync kernels at head size 64: 0 or 32 (default), or 16 */
    bool single_pass;  /* the packed mma.sync backward in one pass (dK, dV and dQ from one walk over the tiles; its
                          scratch is larger: zt_cuda_attention_bwd_scratch_size of a descriptor with this variant)
                          instead of the two passes (dK/dV, then dQ); slower on the H200 (bench/attention) */
} zt_attention_variant;

/* One attention call: shape, options and the forward's tensors. Pointers are borrowed for the call. On the
 * CPU the tensors hold zt_real; on the GPU q, k, v, out hold the call's dtype, lse and bias_table are fp32
 * and the int32 arrays are device memory. */
typedef struct zt_attention_desc {
    const void *q, *k, *v;   /* query, key, value rows (see above) */
    long q_stride, k_stride, v_stride; /* elements between rows */
    void *out;               /* [query rows, >= NH*HS] */
    long out_stride;         /* elements between rows of out (and of dout) */
    void *lse;               /* [B, NH, Tq]; written by the forward, read by the backward */
    int B;                   /* sequences */
    int Tq, Tk;              /* rows per sequence (fixed layout) or the longest (cu_seqlens) */
    int NH, NKV, HS;         /* query heads, key/value heads (NH % NKV == 0), head size */
    float scale;             /* scores' factor; <= 0: 1/sqrt(HS) */
    bool causal;             /* mask keys after the query's position (bottom-right aligned) */
    int window;              /* < 0: none; else keys more than `window` before the query's position are masked */
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* NULL (fixed layout) or B+1 offsets each */
    const int32_t *lens;     /* NULL or B valid lengths (fixed layout, Tq == Tk): padding */
    enum zt_attention_bias bias;
    const void *bias_table;  /* [num_buckets, NH] when bias is T5 */
    int num_buckets;         /* T5: buckets (32 in T5), even when bidirectional */
    int max_distance;        /* T5: distance of the last bucket (128 in T5) */
    bool bias_bidirectional; /* T5: true for the encoder, false for the decoder's self-attention */
    const zt_attention_variant *variant; /* CUDA kernel family; NULL: the production choice */
} zt_attention_desc;

/* The backward's tensors. dout has the layout of out (out_stride); dq, dk, dv have the layouts of q, k, v
 * with their own strides (packed dqkv: the same pointer arithmetic as qkv). dbias_table [num_buckets, NH]
 * (the type of bias_table) is required with a bias and ignored without. accumulate true: the backward adds
 * (+=) into dq, dk, dv and dbias_table; false: it overwrites them, the heads' columns of every row of every
 * sequence (padded rows and rows that see no key included, which become zeros) and the whole table. */
typedef struct zt_attention_grads {
    const void *dout;
    void *dq, *dk, *dv;
    long dq_stride, dk_stride, dv_stride;
    void *dbias_table;
    bool accumulate;
} zt_attention_grads;

/* The bucket of a relative position rel = key position - query position, exactly as transformers'
 * T5Attention._relative_position_bucket (float32 logarithm, truncation): with bidirectional, half the buckets
 * for rel > 0; num_buckets/2 (or /4 bidirectional) exact buckets, then logarithmic up to max_distance.
 * Inline so that the CPU kernels and the CUDA launchers (which tabulate it) share one definition. */
static inline int zt_attention_t5_bucket(int rel, bool bidirectional, int num_buckets, int max_distance)
{
    int bucket = 0, nb = num_buckets;
    if (bidirectional) {
        nb /= 2;
        if (rel > 0)
            bucket += nb;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int max_exact = nb / 2;
    if (rel < max_exact)
        return bucket + rel;
    const float ratio = logf((float)rel / (float)max_exact) / (float)log((double)max_distance / max_exact);
    int large = max_exact + (int)(ratio * (float)(nb - max_exact));
    if (large > nb - 1)
        large = nb - 1;
    return bucket + large;
}

/* Checks a descriptor's shape and options (not the pointers' contents; cu_seqlens and lens are host arrays
 * for this check only when host_arrays is true). Returns 0, or ZT_EINVAL_CONFIG with a sentence in err
 * naming the bad field and the fix. */
int zt_attention_check(const zt_attention_desc *d, bool host_arrays, zt_err *err);

/* CPU forward of a descriptor (host arrays, zt_real tensors): writes out and lse. Returns 0 or the error of
 * zt_attention_check (nothing written then). For the cases of the entry points below (packed qkv, Tq == Tk,
 * default scale, no bias, window or cu_seqlens) it runs the same arithmetic, so the same bits. */
int zt_cpu_attention_fwd(const zt_attention_desc *d, zt_err *err);
/* CPU backward of a descriptor: dq, dk, dv and dbias_table from g->dout and the forward's out and lse.
 * Returns 0 or the error of zt_attention_check. */
int zt_cpu_attention_bwd(const zt_attention_desc *d, const zt_attention_grads *g, zt_err *err);

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

#ifdef __cplusplus
}
#endif

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/attention.cu, attention_generic.cu), flash style: tiles of queries and keys in
 * shared memory, an online softmax in fp32, nothing of size T x T in memory, backward passes without
 * atomics (the same inputs give the same bits). qkv, out, dout, dqkv hold `dtype` elements (F32, F16 or
 * BF16); lse [B,NH,T] and the scratch are fp32; lens is a device array. Any T.
 *
 * The packed kernels are built for head sizes 32, 64, 80, 96 and 128, and 256 on GPUs that give a block 66
 * KiB of shared memory (all but sm_75); zt_cuda_attention_supported tells for the multi-head entry points.
 * zt_cuda_attention_forward_gqa and zt_cuda_attention_backward_gqa also take every other head size up to 256
 * (40, 48, 112, ...), which they hand to the descriptor's general CUDA-core kernels (below: slower, the same
 * results within rounding, deterministic); zt_cuda_attention_gqa_supported tells, so that a model can refuse
 * a config early (a head size of 300, say). Causal multi-head attention at head sizes 64 and 128 runs tuned
 * kernels (tensor cores for F16 and BF16 where the GPU has them), and so do grouped-query and bidirectional
 * attention, padded or not, at those head sizes in F16 and BF16 on sm_80+ (the mma.sync kernels; a
 * key/value head's dK and dV sum its query heads in order); every other shape runs generic kernels,
 * on the tensor cores for F16 and BF16 on sm_80+ up to head size 128, on the CUDA cores otherwise. The
 * tensor-core kernels need 16-byte aligned buffers (else the CUDA-core ones run). These entry points run
 * the production choice; a descriptor's variant (zt_cuda_attention_fwd) selects another family. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

/* ---- descriptors on the GPU (kernels/cuda/attention_desc.cu): the one chooser ----
 * Device pointers; q, k, v, out, dout, dq, dk, dv hold `dtype` (F32, F16, BF16), lse, bias_table,
 * dbias_table and the scratch fp32; cu_seqlens and lens are device int32 arrays (Tq and Tk must be the
 * longest lengths: the host cannot read them). Descriptors in the packed-qkv form (k and v at their columns
 * of q's rows, one stride, out [rows, NH*HS], Tq == Tk, default scale, no bias, window or cu_seqlens) at the
 * head sizes of zt_cuda_attention_gqa_supported run the packed-qkv kernels below (mma.sync, WMMA or SIMT, as
 * those entry points choose, with their bits). Every other descriptor at head size 64 or 128 in F16 or BF16 on
 * sm_80+ runs the descriptor's mma.sync kernels (tensor cores; every feature: strides, Tq != Tk, scale,
 * window, cu_seqlens, padding, T5 bias), when q, k, v, out (and dout, dq, dk, dv) are 16-byte aligned with
 * row strides of whole 8-element multiples; the rest runs general CUDA-core kernels that serve every feature
 * at any head size up to 256 (slower: one warp per row, no shared tiles). Every backward is deterministic:
 * the same inputs give the same bits, dbias_table included (per-block partial tables summed in a fixed
 * order, no atomics; the variant's single pass adds its dQ parts by reductions in a fixed order). */

/* Whether the kernels serve d in dtype (head size <= 256, at most ZT_ATTENTION_MAX_BUCKETS buckets). */
bool zt_cuda_attention_desc_supported(const zt_attention_desc *d, enum zt_dtype dtype);
/* Which kernels d's forward runs: "packed", "mma" or "general" (for tests and benchmarks). */
const char *zt_cuda_attention_path(const zt_attention_desc *d, enum zt_dtype dtype);
/* Forward: out and lse. Returns 0, or ZT_EINVAL_CONFIG / ZT_EUNSUPPORTED with a sentence in err (nothing
 * launched). No host synchronisation. */
int zt_cuda_attention_fwd(const zt_attention_desc *d, enum zt_dtype dtype, cudaStream_t stream, zt_err *err);
/* Bytes of device scratch zt_cuda_attention_bwd needs (row sums, bias-table partials). */
size_t zt_cuda_attention_bwd_scratch_size(const zt_attention_desc *d);
/* Backward: dq, dk, dv and dbias_table, added or overwritten as g->accumulate says. Returns 0 or an error
 * as zt_cuda_attention_fwd. */
int zt_cuda_attention_bwd(const zt_attention_desc *d, const zt_attention_grads *g, void *scratch,
                          enum zt_dtype dtype, cudaStream_t stream, zt_err *err);

/* Whether the CUDA kernels serve C channels in NH heads (causal multi-head attention). */
bool zt_cuda_attention_supported(int C, int NH);
/* Whether the CUDA kernels serve the general shape d (its head size and NH % NKV == 0; B and T are free). */
bool zt_cuda_attention_gqa_supported(const zt_attention_dims *d);
void zt_cuda_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                               enum zt_dtype dtype, cudaStream_t stream);
/* Bytes of device scratch zt_cuda_attention_backward needs (the fp32 row sums of dout * out). */
size_t zt_cuda_attention_backward_scratch_size(int B, int T, int NH);
/* Accumulates (+=) into dqkv [B,T,3C]. Deterministic: dK and dV come from one pass over key tiles and
 * dQ from a second pass over query tiles, so every element is written by one thread (no atomics). A
 * descriptor's variant can ask for the mma.sync kernels' single pass instead (zt_attention_variant). */
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
#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
