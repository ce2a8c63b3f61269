/* The operations a model's layer program is written with, bound to a backend: the CPU kernels (ops_cpu.c,
 * the reference) or the CUDA kernels (ops_cuda.c). A layer program (decoder.c, encoder.c, t5.c) calls o->linear(o, ...)
 * and never knows which backend runs it, so every layer is written once.
 *
 * Buffers are `void *` of the backend's element type: fp32 on the CPU, the compute dtype (bf16, fp16 or fp32)
 * on CUDA; the statistics of norms and attention (mean, rstd, lse) are fp32 on both. Matrices are row-major,
 * weights in nn.Linear's [out, in] layout. Unless said otherwise an input gradient (din, dx) is written (=)
 * and a weight or bias gradient (dw, db) is added into (+=), so that micro-batches accumulate. A fused CUDA
 * operation (the bias, GELU and residual in the GEMM's epilogue, the GELU's backward in the GEMM's) has the
 * unfused composition of the CPU kernels as its CPU binding, which gives the CPU reference for every path the
 * GPU takes. Calls only enqueue work on a GPU (the binding's stream). Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_OPS_H
#define ZT_WORKER_MODELS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h" /* enum zt_dtype */
#include "kernels/attention.h"  /* zt_attention_dims */

typedef struct zt_ops zt_ops;

struct zt_ops {
    /* x[0..n) = 0 */
    void (*zero)(const zt_ops *o, void *x, size_t n);
    /* out [N,OC] = in [N,IC] w^T + b (b may be NULL) */
    void (*linear)(const zt_ops *o, void *out, const void *in, const void *w, const void *b, int N, int IC, int OC);
    /* out = res + in w^T + b (out is not res) */
    void (*linear_residual)(const zt_ops *o, void *out, const void *in, const void *w, const void *b,
                            const void *res, int N, int IC, int OC);
    /* pre = in w^T + b; post = gelu(pre), GELU's tanh form */
    void (*linear_gelu)(const zt_ops *o, void *pre, void *post, const void *in, const void *w, const void *b, int N,
                        int IC, int OC);
    /* din [N,IC] = dout [N,OC] w; dw += dout^T in; db += column sums of dout (din, db may be NULL) */
    void (*linear_backward)(const zt_ops *o, void *din, void *dw, void *db, const void *dout, const void *in,
                            const void *w, int N, int IC, int OC);
    /* The backward of a linear layer whose input was post = gelu(pre) (tanh form): dpre = gelu'(pre) (dout w);
     * dw += dout^T post; db += column sums of dout */
    void (*linear_backward_gelu)(const zt_ops *o, void *dpre, void *dw, void *db, const void *dout, const void *post,
                                 const void *w, const void *pre, int N, int IC, int OC);
    /* din [N,IC] += dout w, with the weight and bias gradients of linear_backward: the input gradient joins
     * one already there (a residual's) in the GEMM's accumulation on CUDA */
    void (*linear_backward_add)(const zt_ops *o, void *din, void *dw, void *db, const void *dout, const void *in,
                                const void *w, int N, int IC, int OC);
    /* out = x Phi(x), the exact GELU; and its backward din = gelu'(in) dout */
    void (*gelu_erf)(const zt_ops *o, void *out, const void *in, size_t n);
    void (*gelu_erf_backward)(const zt_ops *o, void *din, const void *in, const void *dout, size_t n);
    /* LayerNorm over rows of C: out, mean and rstd [N] from x; backward adds into dx, dw and db */
    void (*layernorm)(const zt_ops *o, void *out, float *mean, float *rstd, const void *x, const void *w,
                      const void *b, int N, int C, float eps);
    void (*layernorm_backward)(const zt_ops *o, void *dx, void *dw, void *db, const void *dout, const void *x,
                               const void *w, const float *mean, const float *rstd, int N, int C);
    /* layernorm_backward that writes (=) dx: the bits of zeroing dx first */
    void (*layernorm_backward_overwrite)(const zt_ops *o, void *dx, void *dw, void *db, const void *dout,
                                         const void *x, const void *w, const float *mean, const float *rstd, int N,
                                         int C);
    /* RMSNorm; backward adds into dx and dw */
    void (*rmsnorm)(const zt_ops *o, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps);
    void (*rmsnorm_backward)(const zt_ops *o, void *dx, void *dw, const void *dout, const void *x, const void *w,
                             const float *rstd, int N, int C);
    /* Rotary embeddings of the first rot channels of the q and k heads of packed qkv rows [B,T,(NH+2 NKV) HS],
     * in place, and the backward (in place on dqkv); inv_freq [rot/2] and pos are the binding's memory
     * (device memory on CUDA); pos NULL: row t of each sequence at position t, else [B*T] positions (packed
     * documents). */
    void (*rope)(const zt_ops *o, void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                 const int32_t *pos);
    void (*rope_backward)(const zt_ops *o, void *dqkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS,
                          int rot, const int32_t *pos);
    /* Attention over packed qkv rows (d: shape, grouped key/value heads, causal): out [B,T,NH HS] and lse
     * [B,NH,T]; the backward writes dqkv. lens: NULL, or [B] keys each sequence attends to before its
     * padding (the binding's memory) */
    void (*attention)(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *lens,
                      const zt_attention_dims *d);
    void (*attention_backward)(const zt_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out,
                               const float *lse, const int32_t *lens, const zt_attention_dims *d);
    /* Causal attention over nseq documents laid end to end in the packed qkv rows (the descriptor's cu_seqlens
     * layout, kernels/attention.h): cu [nseq+1] offsets from 0 (the binding's memory), maxlen the longest
     * document; d gives NH, NKV, HS (its B, T and causal are not read). Each document attends only within
     * itself. out [cu[nseq], NH HS]; lse [nseq, NH, maxlen]; the backward writes (=) every row of dqkv. */
    void (*attention_varlen)(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *cu, int nseq,
                             int maxlen, const zt_attention_dims *d);
    void (*attention_varlen_backward)(const zt_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out,
                                      const float *lse, const int32_t *cu, int nseq, int maxlen,
                                      const zt_attention_dims *d);
    /* out [N,F] = silu(h[:, :F]) * h[:, F:]; the backward writes dh [N,2F] */
    void (*swiglu)(const zt_ops *o, void *out, const void *h, int N, int F);
    void (*swiglu_backward)(const zt_ops *o, void *dh, const void *h, const void *dout, int N, int F);
    /* out [B,T,C] = wte[tokens] (+ wpe[t] when wpe is not NULL); the backward adds into dwte rows (and dwpe) */
    void (*embedding)(const zt_ops *o, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B,
                      int T, int C);
    void (*embedding_backward)(const zt_ops *o, void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                               int B, int T, int C, int V);
    /* ReLU: out [n] = max(in, 0); the backward writes din = dout where in > 0, else 0 */
    void (*relu)(const zt_ops *o, void *out, const void *in, size_t n);
    void (*relu_backward)(const zt_ops *o, void *din, const void *in, const void *dout, size_t n);
    /* Gated GELU (T5's "gated-gelu"): out [N,F] = gelu(h[:, :F]) * h[:, F:] (GELU's tanh form); the backward
     * writes dh [N,2F] */
    void (*geglu)(const zt_ops *o, void *out, const void *h, int N, int F);
    void (*geglu_backward)(const zt_ops *o, void *dh, const void *h, const void *dout, int N, int F);
    /* GELU's backward on its own (a GELU that no GEMM precedes), of the tanh form or (exact) of x Phi(x):
     * din [n] = gelu'(in) dout, written as zero plus the gradient */
    void (*gelu_backward)(const zt_ops *o, void *din, const void *in, const void *dout, size_t n, bool exact);
    /* out [n] = tanh(in); the backward writes din = dout (1 - out^2) */
    void (*tanh)(const zt_ops *o, void *out, const void *in, size_t n);
    void (*tanh_backward)(const zt_ops *o, void *din, const void *out, const void *dout, size_t n);
    /* first [B,C] = h[b, 0, :], each sequence's first row; the backward writes dh [B,T,C] (zero but at t = 0) */
    void (*first_token)(const zt_ops *o, void *first, const void *h, int B, int T, int C);
    void (*first_token_backward)(const zt_ops *o, void *dh, const void *dfirst, int B, int T, int C);
    /* With token types (BERT): out [B,T,C] = wte[tokens] + wpe[t] + wtt[types]; the backward adds into the rows
     * of dwte [V,C], dwpe and dwtt [NTT,C] (types: the binding's memory, below NTT) */
    void (*embedding_typed)(const zt_ops *o, void *out, const int32_t *tokens, const int32_t *types, const void *wte,
                            const void *wpe, const void *wtt, int B, int T, int C);
    void (*embedding_typed_backward)(const zt_ops *o, void *dwte, void *dwpe, void *dwtt, const void *dout,
                                     const int32_t *tokens, const int32_t *types, int B, int T, int C, int V, int NTT);
    /* x[0..n) *= s */
    void (*scale)(const zt_ops *o, void *x, float s, size_t n);
    /* y[0..n) += x[0..n) */
    void (*add)(const zt_ops *o, void *y, const void *x, size_t n);
    /* fp32 buffers beside the backend's type (T5's bias tables, which the attention kernels read in fp32):
     * x[0..n) = 0; dst = src as fp32; y += x (y of the backend's type, x fp32) */
    void (*zero_f32)(const zt_ops *o, float *x, size_t n);
    void (*to_f32)(const zt_ops *o, float *dst, const void *src, size_t n);
    void (*add_f32)(const zt_ops *o, void *y, const float *x, size_t n);
    /* Attention through the descriptor (kernels/attention.h: separate q, k, v with strides, Tq != Tk, scale,
     * T5's relative position bias, padding lengths; host arrays on the CPU, device arrays on CUDA) and its
     * backward (dq, dk, dv and the bias table's gradient, written or added as g->accumulate says). */
    void (*attention_desc)(const zt_ops *o, const zt_attention_desc *d);
    void (*attention_desc_backward)(const zt_ops *o, const zt_attention_desc *d, const zt_attention_grads *g);
    /* dst[0..n) = src[0..n) in elements */
    void (*copy)(const zt_ops *o, void *dst, const void *src, size_t n);
    /* y[0..n) += x[0..n) (summed in fp32, rounded once) */
    void (*add_inplace)(const zt_ops *o, void *y, const void *x, size_t n);

    /* The binding's state. */
    enum zt_dtype dtype;  /* of every buffer but the statistics */
    size_t esize;         /* bytes per element */
    void *ctx;            /* the binding's own context (scratch buffers, stream, cuBLASLt) */
};

/* The CPU binding, with scratch for max_rows x max_width floats (the widest linear output it is given: the
 * unfused compositions keep intermediates there). Free with zt__ops_cpu_free. */
void zt__ops_cpu_init(zt_ops *o, size_t max_rows, size_t max_width);
void zt__ops_cpu_free(zt_ops *o);

#endif
