/* The CUDA binding of the layer operations (ops.h): every entry on one stream, cuBLASLt GEMMs with their
 * bias, GELU and residual epilogues, and a profiling mode that times each operation with events. */
#include "worker/models/ops_cuda.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK */
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/pooler.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

#define PROF_EVENTS 8192

/* What profiling sums time over: each operation of the table. */
enum prof_op {
    P_ZERO, P_COPY, P_LINEAR, P_LINEAR_RES, P_LINEAR_GELU, P_LINEAR_BWD, P_LINEAR_GELU_BWD, P_GELU_ERF,
    P_GELU_ERF_BWD, P_NORM, P_NORM_BWD, P_ROPE, P_ROPE_BWD, P_ATTN, P_ATTN_BWD, P_SWIGLU, P_SWIGLU_BWD, P_EMBED,
    P_EMBED_BWD, P_ACT, P_ACT_BWD, P_ELEM, P_COUNT
};
static const char *const prof_names[P_COUNT] = {
    "memset", "copy", "linear", "linear+residual", "linear+gelu", "linear backward", "linear backward+dgelu",
    "gelu (erf)", "gelu (erf) backward", "norm", "norm backward", "rope", "rope backward", "attention",
    "attention backward", "swiglu", "swiglu backward", "embedding", "embedding backward",
    "relu / geglu", "relu / geglu backward", "scale / add"};

typedef struct cuda_ctx {
    zt__ops_cuda_res r;
    bool profiling;
    cudaEvent_t *ev;   /* [PROF_EVENTS] */
    int *op;           /* [PROF_EVENTS / 2] */
    int used;
    double ms[P_COUNT];
} cuda_ctx;

static cuda_ctx *ctx_of(const zt_ops *o)
{
    return o->ctx;
}

static cudaStream_t stream_of(const zt_ops *o)
{
    return ctx_of(o)->r.stream;
}

static void prof_flush(cuda_ctx *c)
{
    if (c->used == 0)
        return;
    ZT_CUDA_CHECK(cudaStreamSynchronize(c->r.stream));
    for (int i = 0; i < c->used; i++) {
        float ms = 0.0f;
        ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]));
        c->ms[c->op[i]] += ms;
    }
    c->used = 0;
}

static void prof_begin(const zt_ops *o, int op)
{
    cuda_ctx *c = ctx_of(o);
    if (!c->profiling)
        return;
    if (c->used == PROF_EVENTS / 2)
        prof_flush(c);
    c->op[c->used] = op;
    ZT_CUDA_CHECK(cudaEventRecord(c->ev[2 * c->used], c->r.stream));
}

static void prof_end(const zt_ops *o)
{
    cuda_ctx *c = ctx_of(o);
    if (!c->profiling)
        return;
    ZT_CUDA_CHECK(cudaEventRecord(c->ev[2 * c->used + 1], c->r.stream));
    c->used++;
}

/* Every entry times itself between these. */
#define TIMED(op, call)                                                                                       \
    do {                                                                                                      \
        prof_begin(o, op);                                                                                    \
        call;                                                                                                 \
        prof_end(o);                                                                                          \
    } while (0)

static void k_zero(const zt_ops *o, void *x, size_t n)
{
    TIMED(P_ZERO, ZT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * o->esize, stream_of(o))));
}

static void k_copy(const zt_ops *o, void *dst, const void *src, size_t n)
{
    TIMED(P_COPY, ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * o->esize, cudaMemcpyDeviceToDevice, stream_of(o))));
}

static void k_linear(const zt_ops *o, void *out, const void *in, const void *w, const void *b, int N, int IC, int OC)
{
    TIMED(P_LINEAR, zt_cuda_matmul_forward(ctx_of(o)->r.blas, out, NULL, in, w, b, N, IC, OC, o->dtype, stream_of(o)));
}

static void k_linear_residual(const zt_ops *o, void *out, const void *in, const void *w, const void *b,
                              const void *res, int N, int IC, int OC)
{
    TIMED(P_LINEAR_RES, zt_cuda_matmul_forward_residual(ctx_of(o)->r.blas, out, in, w, b, res, N, IC, OC, o->dtype,
                                                        stream_of(o)));
}

static void k_linear_gelu(const zt_ops *o, void *pre, void *post, const void *in, const void *w, const void *b, int N,
                          int IC, int OC)
{
    TIMED(P_LINEAR_GELU,
          zt_cuda_matmul_forward(ctx_of(o)->r.blas, post, pre, in, w, b, N, IC, OC, o->dtype, stream_of(o)));
}

static void k_linear_backward(const zt_ops *o, void *din, void *dw, void *db, const void *dout, const void *in,
                              const void *w, int N, int IC, int OC)
{
    TIMED(P_LINEAR_BWD, zt_cuda_matmul_backward_overwrite(ctx_of(o)->r.blas, din, dw, db, dout, in, w, NULL, N, IC, OC,
                                                          o->dtype, stream_of(o)));
}

static void k_linear_backward_add(const zt_ops *o, void *din, void *dw, void *db, const void *dout, const void *in,
                                  const void *w, int N, int IC, int OC)
{
    TIMED(P_LINEAR_BWD, zt_cuda_matmul_backward(ctx_of(o)->r.blas, din, dw, db, dout, in, w, NULL, N, IC, OC, o->dtype,
                                                stream_of(o)));
}

static void k_linear_backward_gelu(const zt_ops *o, void *dpre, void *dw, void *db, const void *dout,
                                   const void *post, const void *w, const void *pre, int N, int IC, int OC)
{
    TIMED(P_LINEAR_GELU_BWD, zt_cuda_matmul_backward(ctx_of(o)->r.blas, dpre, dw, db, dout, post, w, pre, N, IC, OC,
                                                     o->dtype, stream_of(o)));
}

static void k_gelu_erf(const zt_ops *o, void *out, const void *in, size_t n)
{
    TIMED(P_GELU_ERF, zt_cuda_gelu_erf_forward(out, in, n, o->dtype, stream_of(o)));
}

static void k_gelu_erf_backward(const zt_ops *o, void *din, const void *in, const void *dout, size_t n)
{
    TIMED(P_GELU_ERF_BWD, zt_cuda_gelu_erf_backward_overwrite(din, in, dout, n, o->dtype, stream_of(o)));
}

static void k_layernorm(const zt_ops *o, void *out, float *mean, float *rstd, const void *x, const void *w,
                        const void *b, int N, int C, float eps)
{
    TIMED(P_NORM, zt_cuda_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps, o->dtype, stream_of(o)));
}

static void k_layernorm_backward(const zt_ops *o, void *dx, void *dw, void *db, const void *dout, const void *x,
                                 const void *w, const float *mean, const float *rstd, int N, int C)
{
    TIMED(P_NORM_BWD, zt_cuda_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C, ctx_of(o)->r.norm_scratch,
                                                 o->dtype, stream_of(o)));
}

static void k_layernorm_backward_overwrite(const zt_ops *o, void *dx, void *dw, void *db, const void *dout,
                                           const void *x, const void *w, const float *mean, const float *rstd, int N,
                                           int C)
{
    TIMED(P_NORM_BWD, zt_cuda_layernorm_backward_overwrite(dx, dw, db, dout, x, w, mean, rstd, N, C,
                                                           ctx_of(o)->r.norm_scratch, o->dtype, stream_of(o)));
}

static void k_rmsnorm(const zt_ops *o, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps)
{
    TIMED(P_NORM, zt_cuda_rmsnorm_forward(out, rstd, x, w, N, C, eps, o->dtype, stream_of(o)));
}

static void k_rmsnorm_backward(const zt_ops *o, void *dx, void *dw, const void *dout, const void *x, const void *w,
                               const float *rstd, int N, int C)
{
    TIMED(P_NORM_BWD, zt_cuda_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, ctx_of(o)->r.norm_scratch, o->dtype,
                                               stream_of(o)));
}

static void k_rope(const zt_ops *o, void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                   const int32_t *pos)
{
    TIMED(P_ROPE, zt_cuda_rope_forward(qkv, inv_freq, B, T, NH, NKV, HS, rot, 0, o->dtype, stream_of(o), pos));
}

static void k_rope_backward(const zt_ops *o, void *dqkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS,
                            int rot, const int32_t *pos)
{
    TIMED(P_ROPE_BWD, zt_cuda_rope_backward(dqkv, inv_freq, B, T, NH, NKV, HS, rot, 0, o->dtype, stream_of(o), pos));
}

static void k_attention(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *lens,
                        const zt_attention_dims *d)
{
    TIMED(P_ATTN, zt_cuda_attention_forward_gqa(out, lse, qkv, lens, d, o->dtype, stream_of(o)));
}

static void k_attention_backward(const zt_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out,
                                 const float *lse, const int32_t *lens, const zt_attention_dims *d)
{
    TIMED(P_ATTN_BWD, zt_cuda_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, d, false,
                                                     ctx_of(o)->r.attn_scratch, o->dtype, stream_of(o)));
}

/* The descriptor of a causal varlen call over packed qkv rows of esize-byte elements (ops.h:
 * attention_varlen); cu is device memory. */
static zt_attention_desc varlen_desc(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *cu,
                                     int nseq, int maxlen, const zt_attention_dims *d)
{
    const long W = (long)(d->NH + 2 * d->NKV) * d->HS;
    const char *q = qkv;
    return (zt_attention_desc){.q = q, .k = q + (size_t)d->NH * d->HS * o->esize,
                               .v = q + (size_t)(d->NH + d->NKV) * d->HS * o->esize, .q_stride = W, .k_stride = W,
                               .v_stride = W, .out = out, .out_stride = (long)d->NH * d->HS, .lse = lse,
                               .B = nseq, .Tq = maxlen, .Tk = maxlen, .NH = d->NH, .NKV = d->NKV, .HS = d->HS,
                               .causal = true, .window = -1, .cu_seqlens_q = cu, .cu_seqlens_k = cu};
}

static void k_attention_varlen(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *cu, int nseq,
                               int maxlen, const zt_attention_dims *d)
{
    const zt_attention_desc ad = varlen_desc(o, out, lse, qkv, cu, nseq, maxlen, d);
    zt_err err = {{0}};
    int rc = 0;
    TIMED(P_ATTN, rc = zt_cuda_attention_fwd(&ad, o->dtype, stream_of(o), &err));
    if (rc != 0)
        zt_log(ZT_LOG_ERROR, "varlen attention: %s", err.msg);
    ZT_ASSERT(rc == 0); /* the executor checked the shape at creation */
}

static void k_attention_varlen_backward(const zt_ops *o, void *dqkv, const void *dout, const void *qkv,
                                        const void *out, const float *lse, const int32_t *cu, int nseq, int maxlen,
                                        const zt_attention_dims *d)
{
    const zt_attention_desc ad = varlen_desc(o, (void *)out, (float *)lse, qkv, cu, nseq, maxlen, d);
    const long W = (long)(d->NH + 2 * d->NKV) * d->HS;
    char *dq = dqkv;
    const zt_attention_grads g = {.dout = dout, .dq = dq, .dk = dq + (size_t)d->NH * d->HS * o->esize,
                                  .dv = dq + (size_t)(d->NH + d->NKV) * d->HS * o->esize, .dq_stride = W,
                                  .dk_stride = W, .dv_stride = W, .accumulate = false};
    ZT_ASSERT(zt_cuda_attention_bwd_scratch_size(&ad) <= ctx_of(o)->r.attn_scratch_bytes);
    zt_err err = {{0}};
    int rc = 0;
    TIMED(P_ATTN_BWD, rc = zt_cuda_attention_bwd(&ad, &g, ctx_of(o)->r.attn_scratch, o->dtype, stream_of(o), &err));
    if (rc != 0)
        zt_log(ZT_LOG_ERROR, "varlen attention backward: %s", err.msg);
    ZT_ASSERT(rc == 0);
}

static void k_add_inplace(const zt_ops *o, void *y, const void *x, size_t n)
{
    TIMED(P_EMBED, zt_cuda_add_inplace(y, x, n, o->dtype, stream_of(o)));
}

static void k_swiglu(const zt_ops *o, void *out, const void *h, int N, int F)
{
    TIMED(P_SWIGLU, zt_cuda_swiglu_forward(out, h, N, F, o->dtype, stream_of(o)));
}

static void k_swiglu_backward(const zt_ops *o, void *dh, const void *h, const void *dout, int N, int F)
{
    TIMED(P_SWIGLU_BWD, zt_cuda_swiglu_backward_overwrite(dh, h, dout, N, F, o->dtype, stream_of(o)));
}

static void k_relu(const zt_ops *o, void *out, const void *in, size_t n)
{
    TIMED(P_ACT, zt_cuda_relu_forward(out, in, n, o->dtype, stream_of(o)));
}

static void k_relu_backward(const zt_ops *o, void *din, const void *in, const void *dout, size_t n)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(din, 0, n * o->esize, stream_of(o)));
    TIMED(P_ACT_BWD, zt_cuda_relu_backward(din, in, dout, n, o->dtype, stream_of(o)));
}

static void k_geglu(const zt_ops *o, void *out, const void *h, int N, int F)
{
    TIMED(P_ACT, zt_cuda_geglu_forward(out, h, N, F, o->dtype, stream_of(o)));
}

static void k_geglu_backward(const zt_ops *o, void *dh, const void *h, const void *dout, int N, int F)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(dh, 0, (size_t)N * 2 * F * o->esize, stream_of(o)));
    TIMED(P_ACT_BWD, zt_cuda_geglu_backward(dh, h, dout, N, F, o->dtype, stream_of(o)));
}

/* The unfused backwards below zero their input gradient and accumulate into it, as the kernels take it. */
static void k_gelu_backward(const zt_ops *o, void *din, const void *in, const void *dout, size_t n, bool exact)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(din, 0, n * o->esize, stream_of(o)));
    if (exact)
        TIMED(P_GELU_ERF_BWD, zt_cuda_gelu_erf_backward(din, in, dout, n, o->dtype, stream_of(o)));
    else
        TIMED(P_ACT_BWD, zt_cuda_gelu_backward(din, in, dout, n, o->dtype, stream_of(o)));
}

static void k_tanh(const zt_ops *o, void *out, const void *in, size_t n)
{
    TIMED(P_ACT, zt_cuda_tanh_forward(out, in, n, o->dtype, stream_of(o)));
}

static void k_tanh_backward(const zt_ops *o, void *din, const void *out, const void *dout, size_t n)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(din, 0, n * o->esize, stream_of(o)));
    TIMED(P_ACT_BWD, zt_cuda_tanh_backward(din, out, dout, n, o->dtype, stream_of(o)));
}

static void k_first_token(const zt_ops *o, void *first, const void *h, int B, int T, int C)
{
    TIMED(P_COPY, zt_cuda_first_token_forward(first, h, B, T, C, o->dtype, stream_of(o)));
}

static void k_first_token_backward(const zt_ops *o, void *dh, const void *dfirst, int B, int T, int C)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(dh, 0, (size_t)B * T * C * o->esize, stream_of(o)));
    TIMED(P_COPY, zt_cuda_first_token_backward(dh, dfirst, B, T, C, o->dtype, stream_of(o)));
}

static void k_scale(const zt_ops *o, void *x, float s, size_t n)
{
    TIMED(P_ELEM, zt_cuda_scale_inplace(x, s, n, o->dtype, stream_of(o)));
}

static void k_add(const zt_ops *o, void *y, const void *x, size_t n)
{
    TIMED(P_ELEM, zt_cuda_add_inplace(y, x, n, o->dtype, stream_of(o)));
}

static void k_zero_f32(const zt_ops *o, float *x, size_t n)
{
    TIMED(P_ZERO, ZT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_of(o))));
}

static void k_to_f32(const zt_ops *o, float *dst, const void *src, size_t n)
{
    TIMED(P_ELEM, zt_cuda_cast(dst, ZT_DTYPE_F32, src, o->dtype, n, stream_of(o)));
}

static void k_add_f32(const zt_ops *o, void *y, const float *x, size_t n)
{
    TIMED(P_ELEM, zt_cuda_add_f32(y, x, n, o->dtype, stream_of(o)));
}

/* A descriptor the kernels refuse is a bug of the program (the executor checks shapes when it is created). */
static void k_attention_desc(const zt_ops *o, const zt_attention_desc *d)
{
    zt_err err = {{0}};
    int rc = 0;
    TIMED(P_ATTN, rc = zt_cuda_attention_fwd(d, o->dtype, stream_of(o), &err));
    if (rc < 0)
        zt__assert_fail(__FILE__, __LINE__, err.msg);
}

static void k_attention_desc_backward(const zt_ops *o, const zt_attention_desc *d, const zt_attention_grads *g)
{
    zt_err err = {{0}};
    int rc = 0;
    ZT_ASSERT(zt_cuda_attention_bwd_scratch_size(d) <= ctx_of(o)->r.attn_scratch_bytes);
    TIMED(P_ATTN_BWD, rc = zt_cuda_attention_bwd(d, g, ctx_of(o)->r.attn_scratch, o->dtype, stream_of(o), &err));
    if (rc < 0)
        zt__assert_fail(__FILE__, __LINE__, err.msg);
}

static void k_embedding(const zt_ops *o, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B,
                        int T, int C)
{
    TIMED(P_EMBED, zt_cuda_embedding_forward(out, tokens, wte, wpe, B, T, C, o->dtype, stream_of(o)));
}

static void k_embedding_backward(const zt_ops *o, void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                 int B, int T, int C, int V)
{
    TIMED(P_EMBED_BWD, zt_cuda_embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, ctx_of(o)->r.emb_scratch,
                                                  o->dtype, stream_of(o)));
}

static void k_embedding_typed(const zt_ops *o, void *out, const int32_t *tokens, const int32_t *types,
                              const void *wte, const void *wpe, const void *wtt, int B, int T, int C)
{
    TIMED(P_EMBED, zt_cuda_embedding_forward_typed(out, tokens, types, wte, wpe, wtt, B, T, C, o->dtype, stream_of(o)));
}

static void k_embedding_typed_backward(const zt_ops *o, void *dwte, void *dwpe, void *dwtt, const void *dout,
                                       const int32_t *tokens, const int32_t *types, int B, int T, int C, int V,
                                       int NTT)
{
    TIMED(P_EMBED_BWD, zt_cuda_embedding_backward_typed(dwte, dwpe, dwtt, dout, tokens, types, B, T, C, V, NTT,
                                                        ctx_of(o)->r.emb_scratch, o->dtype, stream_of(o)));
}

void zt__ops_cuda_init(zt_ops *o, const zt__ops_cuda_res *r, enum zt_dtype dtype)
{
    cuda_ctx *c = zt_xcalloc(1, sizeof *c);
    c->r = *r;
    *o = (zt_ops){
        .zero = k_zero,
        .linear = k_linear,
        .linear_residual = k_linear_residual,
        .linear_gelu = k_linear_gelu,
        .linear_backward = k_linear_backward,
        .linear_backward_gelu = k_linear_backward_gelu,
        .linear_backward_add = k_linear_backward_add,
        .gelu_erf = k_gelu_erf,
        .gelu_erf_backward = k_gelu_erf_backward,
        .layernorm = k_layernorm,
        .layernorm_backward = k_layernorm_backward,
        .layernorm_backward_overwrite = k_layernorm_backward_overwrite,
        .rmsnorm = k_rmsnorm,
        .rmsnorm_backward = k_rmsnorm_backward,
        .rope = k_rope,
        .rope_backward = k_rope_backward,
        .attention = k_attention,
        .attention_backward = k_attention_backward,
        .attention_varlen = k_attention_varlen,
        .attention_varlen_backward = k_attention_varlen_backward,
        .swiglu = k_swiglu,
        .swiglu_backward = k_swiglu_backward,
        .relu = k_relu,
        .relu_backward = k_relu_backward,
        .geglu = k_geglu,
        .geglu_backward = k_geglu_backward,
        .gelu_backward = k_gelu_backward,
        .tanh = k_tanh,
        .tanh_backward = k_tanh_backward,
        .first_token = k_first_token,
        .first_token_backward = k_first_token_backward,
        .scale = k_scale,
        .add = k_add,
        .zero_f32 = k_zero_f32,
        .to_f32 = k_to_f32,
        .add_f32 = k_add_f32,
        .attention_desc = k_attention_desc,
        .attention_desc_backward = k_attention_desc_backward,
        .embedding = k_embedding,
        .embedding_backward = k_embedding_backward,
        .embedding_typed = k_embedding_typed,
        .embedding_typed_backward = k_embedding_typed_backward,
        .copy = k_copy,
        .add_inplace = k_add_inplace,
        .dtype = dtype,
        .esize = zt_dtype_size(dtype),
        .ctx = c,
    };
}

void zt__ops_cuda_free(zt_ops *o)
{
    cuda_ctx *c = o->ctx;
    if (!c)
        return;
    if (c->ev) {
        for (int i = 0; i < PROF_EVENTS; i++)
            cudaEventDestroy(c->ev[i]);
        free(c->ev);
        free(c->op);
    }
    free(c);
    o->ctx = NULL;
}

void zt__ops_cuda_set_profiling(zt_ops *o, bool on)
{
    cuda_ctx *c = o->ctx;
    if (on && !c->ev) {
        c->ev = zt_xcalloc(PROF_EVENTS, sizeof *c->ev);
        c->op = zt_xcalloc(PROF_EVENTS / 2, sizeof *c->op);
        for (int i = 0; i < PROF_EVENTS; i++)
            ZT_CUDA_CHECK(cudaEventCreate(&c->ev[i]));
    }
    if (!on)
        prof_flush(c);
    c->profiling = on;
}

void zt__ops_cuda_profile_report(zt_ops *o)
{
    cuda_ctx *c = o->ctx;
    prof_flush(c);
    double total = 0.0;
    for (int i = 0; i < P_COUNT; i++)
        total += c->ms[i];
    for (int i = 0; i < P_COUNT; i++)
        if (c->ms[i] > 0)
            zt_log(ZT_LOG_INFO, "profile: %-26s %10.2f ms  %5.1f%%", prof_names[i], c->ms[i],
                   total > 0 ? 100.0 * c->ms[i] / total : 0.0);
    zt_log(ZT_LOG_INFO, "profile: %-26s %10.2f ms", "total (layer operations)", total);
    memset(c->ms, 0, sizeof c->ms);
}
