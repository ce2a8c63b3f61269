/* The CPU binding of the layer operations (ops.h): the reference kernels, and the unfused compositions of
 * the operations the CUDA binding fuses. Every input gradient the table writes (=) is zeroed here and then
 * accumulated by the kernel, which is how the CPU models have always computed it. */
#include "worker/models/ops.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/pooler.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

typedef struct cpu_ctx {
    float *scratch;      /* max_rows x max_width: a linear output before its residual, the gradient of a GELU's output */
    size_t scratch_len;
} cpu_ctx;

static float *scratch(const zt_ops *o, size_t n)
{
    cpu_ctx *c = o->ctx;
    ZT_ASSERT(n <= c->scratch_len);
    return c->scratch;
}

static void cpu_zero(const zt_ops *o, void *x, size_t n)
{
    (void)o;
    memset(x, 0, n * sizeof(float));
}

static void cpu_copy(const zt_ops *o, void *dst, const void *src, size_t n)
{
    (void)o;
    memcpy(dst, src, n * sizeof(float));
}

static void cpu_linear(const zt_ops *o, void *out, const void *in, const void *w, const void *b, int N, int IC, int OC)
{
    (void)o;
    zt_cpu_matmul_forward(out, in, w, b, N, IC, OC);
}

static void cpu_linear_residual(const zt_ops *o, void *out, const void *in, const void *w, const void *b,
                                const void *res, int N, int IC, int OC)
{
    float *proj = scratch(o, (size_t)N * OC);
    zt_cpu_matmul_forward(proj, in, w, b, N, IC, OC);
    zt_cpu_residual_forward(out, res, proj, (size_t)N * OC);
}

static void cpu_linear_gelu(const zt_ops *o, void *pre, void *post, const void *in, const void *w, const void *b,
                            int N, int IC, int OC)
{
    (void)o;
    zt_cpu_matmul_forward(pre, in, w, b, N, IC, OC);
    zt_cpu_gelu_forward(post, pre, (size_t)N * OC);
}

static void cpu_linear_backward(const zt_ops *o, void *din, void *dw, void *db, const void *dout, const void *in,
                                const void *w, int N, int IC, int OC)
{
    (void)o;
    if (din)
        memset(din, 0, (size_t)N * IC * sizeof(float));
    zt_cpu_matmul_backward(din, dw, db, dout, in, w, N, IC, OC);
}

static void cpu_linear_backward_add(const zt_ops *o, void *din, void *dw, void *db, const void *dout,
                                    const void *in, const void *w, int N, int IC, int OC)
{
    (void)o;
    zt_cpu_matmul_backward(din, dw, db, dout, in, w, N, IC, OC);
}

static void cpu_linear_backward_gelu(const zt_ops *o, void *dpre, void *dw, void *db, const void *dout,
                                     const void *post, const void *w, const void *pre, int N, int IC, int OC)
{
    float *dpost = scratch(o, (size_t)N * IC);
    memset(dpost, 0, (size_t)N * IC * sizeof(float));
    zt_cpu_matmul_backward(dpost, dw, db, dout, post, w, N, IC, OC);
    memset(dpre, 0, (size_t)N * IC * sizeof(float));
    zt_cpu_gelu_backward(dpre, pre, dpost, (size_t)N * IC);
}

static void cpu_gelu_erf(const zt_ops *o, void *out, const void *in, size_t n)
{
    (void)o;
    zt_cpu_gelu_erf_forward(out, in, n);
}

static void cpu_gelu_erf_backward(const zt_ops *o, void *din, const void *in, const void *dout, size_t n)
{
    (void)o;
    memset(din, 0, n * sizeof(float));
    zt_cpu_gelu_erf_backward(din, in, dout, n);
}

static void cpu_layernorm(const zt_ops *o, void *out, float *mean, float *rstd, const void *x, const void *w,
                          const void *b, int N, int C, float eps)
{
    (void)o;
    zt_cpu_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
}

static void cpu_layernorm_backward(const zt_ops *o, void *dx, void *dw, void *db, const void *dout, const void *x,
                                   const void *w, const float *mean, const float *rstd, int N, int C)
{
    (void)o;
    zt_cpu_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
}

static void cpu_layernorm_backward_overwrite(const zt_ops *o, void *dx, void *dw, void *db, const void *dout,
                                             const void *x, const void *w, const float *mean, const float *rstd,
                                             int N, int C)
{
    (void)o;
    memset(dx, 0, (size_t)N * C * sizeof(float));
    zt_cpu_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
}

static void cpu_rmsnorm(const zt_ops *o, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps)
{
    (void)o;
    zt_cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps);
}

static void cpu_rmsnorm_backward(const zt_ops *o, void *dx, void *dw, const void *dout, const void *x, const void *w,
                                 const float *rstd, int N, int C)
{
    (void)o;
    zt_cpu_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
}

static void cpu_rope(const zt_ops *o, void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS,
                     int rot, const int32_t *pos)
{
    (void)o;
    zt_cpu_rope_forward(qkv, inv_freq, B, T, NH, NKV, HS, rot, 0, pos);
}

static void cpu_rope_backward(const zt_ops *o, void *dqkv, const float *inv_freq, int B, int T, int NH, int NKV,
                              int HS, int rot, const int32_t *pos)
{
    (void)o;
    zt_cpu_rope_backward(dqkv, inv_freq, B, T, NH, NKV, HS, rot, 0, pos);
}

static void cpu_attention(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *lens,
                          const zt_attention_dims *d)
{
    (void)o;
    zt_cpu_attention_forward_gqa(out, lse, qkv, lens, d);
}

static void cpu_attention_backward(const zt_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out,
                                   const float *lse, const int32_t *lens, const zt_attention_dims *d)
{
    (void)o;
    memset(dqkv, 0, (size_t)d->B * d->T * (d->NH + 2 * d->NKV) * d->HS * sizeof(float));
    zt_cpu_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, d);
}

/* The descriptor of a causal varlen call over packed qkv rows (ops.h: attention_varlen). */
static zt_attention_desc varlen_desc(void *out, float *lse, const void *qkv, const int32_t *cu, int nseq,
                                     int maxlen, const zt_attention_dims *d)
{
    const long W = (long)(d->NH + 2 * d->NKV) * d->HS;
    const float *q = qkv;
    return (zt_attention_desc){.q = q, .k = q + (long)d->NH * d->HS, .v = q + (long)(d->NH + d->NKV) * d->HS,
                               .q_stride = W, .k_stride = W, .v_stride = W, .out = out,
                               .out_stride = (long)d->NH * d->HS, .lse = lse, .B = nseq, .Tq = maxlen,
                               .Tk = maxlen, .NH = d->NH, .NKV = d->NKV, .HS = d->HS, .causal = true, .window = -1,
                               .cu_seqlens_q = cu, .cu_seqlens_k = cu};
}

static void cpu_attention_varlen(const zt_ops *o, void *out, float *lse, const void *qkv, const int32_t *cu,
                                 int nseq, int maxlen, const zt_attention_dims *d)
{
    (void)o;
    const zt_attention_desc ad = varlen_desc(out, lse, qkv, cu, nseq, maxlen, d);
    ZT_ASSERT(zt_cpu_attention_fwd(&ad, NULL) == 0); /* the runner built a valid layout */
}

static void cpu_attention_varlen_backward(const zt_ops *o, void *dqkv, const void *dout, const void *qkv,
                                          const void *out, const float *lse, const int32_t *cu, int nseq, int maxlen,
                                          const zt_attention_dims *d)
{
    (void)o;
    const zt_attention_desc ad = varlen_desc((void *)out, (float *)lse, qkv, cu, nseq, maxlen, d);
    const long W = (long)(d->NH + 2 * d->NKV) * d->HS;
    float *dq = dqkv;
    const zt_attention_grads g = {.dout = dout, .dq = dq, .dk = dq + (long)d->NH * d->HS,
                                  .dv = dq + (long)(d->NH + d->NKV) * d->HS, .dq_stride = W, .dk_stride = W,
                                  .dv_stride = W, .accumulate = false};
    ZT_ASSERT(zt_cpu_attention_bwd(&ad, &g, NULL) == 0);
}

static void cpu_add_inplace(const zt_ops *o, void *y, const void *x, size_t n)
{
    (void)o;
    zt_cpu_add_inplace(y, x, n);
}

static void cpu_swiglu(const zt_ops *o, void *out, const void *h, int N, int F)
{
    (void)o;
    zt_cpu_swiglu_forward(out, h, N, F);
}

static void cpu_swiglu_backward(const zt_ops *o, void *dh, const void *h, const void *dout, int N, int F)
{
    (void)o;
    memset(dh, 0, (size_t)N * 2 * F * sizeof(float));
    zt_cpu_swiglu_backward(dh, h, dout, N, F);
}

static void cpu_embedding(const zt_ops *o, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B,
                          int T, int C)
{
    (void)o;
    zt_cpu_embedding_forward(out, tokens, wte, wpe, B, T, C);
}

static void cpu_embedding_backward(const zt_ops *o, void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                   int B, int T, int C, int V)
{
    (void)o;
    (void)V;
    zt_cpu_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
}

static void cpu_relu(const zt_ops *o, void *out, const void *in, size_t n)
{
    (void)o;
    zt_cpu_relu_forward(out, in, n);
}

static void cpu_relu_backward(const zt_ops *o, void *din, const void *in, const void *dout, size_t n)
{
    (void)o;
    memset(din, 0, n * sizeof(float));
    zt_cpu_relu_backward(din, in, dout, n);
}

static void cpu_geglu(const zt_ops *o, void *out, const void *h, int N, int F)
{
    (void)o;
    zt_cpu_geglu_forward(out, h, N, F);
}

static void cpu_geglu_backward(const zt_ops *o, void *dh, const void *h, const void *dout, int N, int F)
{
    (void)o;
    memset(dh, 0, (size_t)N * 2 * F * sizeof(float));
    zt_cpu_geglu_backward(dh, h, dout, N, F);
}

static void cpu_gelu_backward(const zt_ops *o, void *din, const void *in, const void *dout, size_t n, bool exact)
{
    (void)o;
    memset(din, 0, n * sizeof(float));
    if (exact)
        zt_cpu_gelu_erf_backward(din, in, dout, n);
    else
        zt_cpu_gelu_backward(din, in, dout, n);
}

static void cpu_tanh(const zt_ops *o, void *out, const void *in, size_t n)
{
    (void)o;
    zt_cpu_tanh_forward(out, in, n);
}

static void cpu_tanh_backward(const zt_ops *o, void *din, const void *out, const void *dout, size_t n)
{
    (void)o;
    memset(din, 0, n * sizeof(float));
    zt_cpu_tanh_backward(din, out, dout, n);
}

static void cpu_first_token(const zt_ops *o, void *first, const void *h, int B, int T, int C)
{
    (void)o;
    zt_cpu_first_token_forward(first, h, B, T, C);
}

static void cpu_first_token_backward(const zt_ops *o, void *dh, const void *dfirst, int B, int T, int C)
{
    (void)o;
    memset(dh, 0, (size_t)B * T * C * sizeof(float));
    zt_cpu_first_token_backward(dh, dfirst, B, T, C);
}

static void cpu_embedding_typed(const zt_ops *o, void *out, const int32_t *tokens, const int32_t *types,
                                const void *wte, const void *wpe, const void *wtt, int B, int T, int C)
{
    (void)o;
    zt_cpu_embedding_forward_typed(out, tokens, types, wte, wpe, wtt, B, T, C);
}

static void cpu_embedding_typed_backward(const zt_ops *o, void *dwte, void *dwpe, void *dwtt, const void *dout,
                                         const int32_t *tokens, const int32_t *types, int B, int T, int C, int V,
                                         int NTT)
{
    (void)o;
    (void)V;
    (void)NTT;
    zt_cpu_embedding_backward_typed(dwte, dwpe, dwtt, dout, tokens, types, B, T, C);
}

static void cpu_scale(const zt_ops *o, void *x, float s, size_t n)
{
    (void)o;
    zt_cpu_scale_inplace(x, s, n);
}

static void cpu_add(const zt_ops *o, void *y, const void *x, size_t n)
{
    (void)o;
    zt_cpu_add_inplace(y, x, n);
}

static void cpu_zero_f32(const zt_ops *o, float *x, size_t n)
{
    (void)o;
    memset(x, 0, n * sizeof(float));
}

static void cpu_to_f32(const zt_ops *o, float *dst, const void *src, size_t n)
{
    (void)o;
    memcpy(dst, src, n * sizeof(float));
}

static void cpu_add_f32(const zt_ops *o, void *y, const float *x, size_t n)
{
    (void)o;
    zt_cpu_add_inplace(y, x, n);
}

/* A descriptor the program built wrong is a bug of the program: it stops with the check's sentence. */
static void cpu_attention_desc(const zt_ops *o, const zt_attention_desc *d)
{
    (void)o;
    zt_err err = {{0}};
    if (zt_cpu_attention_fwd(d, &err) < 0)
        zt__assert_fail(__FILE__, __LINE__, err.msg);
}

static void cpu_attention_desc_backward(const zt_ops *o, const zt_attention_desc *d, const zt_attention_grads *g)
{
    (void)o;
    zt_err err = {{0}};
    if (zt_cpu_attention_bwd(d, g, &err) < 0)
        zt__assert_fail(__FILE__, __LINE__, err.msg);
}

void zt__ops_cpu_init(zt_ops *o, size_t max_rows, size_t max_width)
{
    cpu_ctx *c = zt_xcalloc(1, sizeof *c);
    c->scratch_len = max_rows * max_width;
    c->scratch = zt_xmalloc((c->scratch_len ? c->scratch_len : 1) * sizeof(float));
    *o = (zt_ops){
        .zero = cpu_zero,
        .linear = cpu_linear,
        .linear_residual = cpu_linear_residual,
        .linear_gelu = cpu_linear_gelu,
        .linear_backward = cpu_linear_backward,
        .linear_backward_gelu = cpu_linear_backward_gelu,
        .linear_backward_add = cpu_linear_backward_add,
        .gelu_erf = cpu_gelu_erf,
        .gelu_erf_backward = cpu_gelu_erf_backward,
        .layernorm = cpu_layernorm,
        .layernorm_backward = cpu_layernorm_backward,
        .layernorm_backward_overwrite = cpu_layernorm_backward_overwrite,
        .rmsnorm = cpu_rmsnorm,
        .rmsnorm_backward = cpu_rmsnorm_backward,
        .rope = cpu_rope,
        .rope_backward = cpu_rope_backward,
        .attention = cpu_attention,
        .attention_backward = cpu_attention_backward,
        .attention_varlen = cpu_attention_varlen,
        .attention_varlen_backward = cpu_attention_varlen_backward,
        .swiglu = cpu_swiglu,
        .swiglu_backward = cpu_swiglu_backward,
        .embedding = cpu_embedding,
        .embedding_backward = cpu_embedding_backward,
        .relu = cpu_relu,
        .relu_backward = cpu_relu_backward,
        .geglu = cpu_geglu,
        .geglu_backward = cpu_geglu_backward,
        .gelu_backward = cpu_gelu_backward,
        .tanh = cpu_tanh,
        .tanh_backward = cpu_tanh_backward,
        .first_token = cpu_first_token,
        .first_token_backward = cpu_first_token_backward,
        .embedding_typed = cpu_embedding_typed,
        .embedding_typed_backward = cpu_embedding_typed_backward,
        .scale = cpu_scale,
        .add = cpu_add,
        .zero_f32 = cpu_zero_f32,
        .to_f32 = cpu_to_f32,
        .add_f32 = cpu_add_f32,
        .attention_desc = cpu_attention_desc,
        .attention_desc_backward = cpu_attention_desc_backward,
        .copy = cpu_copy,
        .add_inplace = cpu_add_inplace,
        .dtype = ZT_DTYPE_F32,
        .esize = sizeof(float),
        .ctx = c,
    };
}

void zt__ops_cpu_free(zt_ops *o)
{
    cpu_ctx *c = o->ctx;
    if (c)
        free(c->scratch);
    free(c);
    o->ctx = NULL;
}
