/* The decoder-only transformer's layer program, its activations and its CPU runner; see decoder.h. */
#include "worker/models/decoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/matmul.h"     /* the head on the CPU */
#include "worker/models/cpu_exec.h" /* what the CPU runners share */

#define IGNORE_INDEX (-1)

int zt__dec_qkv_width(const zt__dec_arch *a)
{
    return (a->NH + 2 * a->NKV) * a->HS;
}

int zt__dec_up_width(const zt__dec_arch *a)
{
    return a->mlp == ZT__DEC_MLP_SWIGLU ? 2 * a->F : a->F;
}

void *zt__dec_take(char *base, size_t *used, size_t bytes, size_t align)
{
    *used = (*used + align - 1) / align * align;
    void *p = base ? base + *used : NULL;
    *used += bytes;
    return p;
}

void zt__dec_carve_acts(const zt__dec_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__dec_acts *acts, bool out_only)
{
    const size_t C = (size_t)a->C, e = esize, f4 = sizeof(float);
    if (!out_only) {
        const bool ln = a->norm == ZT__DEC_LAYERNORM;
        acts->ln1 = zt__dec_take(base, used, N * C * e, align);
        acts->ln1_mean = ln ? zt__dec_take(base, used, N * f4, align) : NULL;
        acts->ln1_rstd = zt__dec_take(base, used, N * f4, align);
        acts->qkv = zt__dec_take(base, used, N * (size_t)zt__dec_qkv_width(a) * e, align);
        acts->atty = zt__dec_take(base, used, N * C * e, align);
        acts->lse = zt__dec_take(base, used, ZT__DEC_LSE_ROWS * N * (size_t)a->NH * f4, align);
        acts->res2 = zt__dec_take(base, used, N * C * e, align);
        acts->ln2 = zt__dec_take(base, used, N * C * e, align);
        acts->ln2_mean = ln ? zt__dec_take(base, used, N * f4, align) : NULL;
        acts->ln2_rstd = zt__dec_take(base, used, N * f4, align);
        acts->h = zt__dec_take(base, used, N * (size_t)zt__dec_up_width(a) * e, align);
        acts->act = zt__dec_take(base, used, N * (size_t)a->F * e, align);
    }
    acts->out = zt__dec_take(base, used, N * C * e, align);
}

void zt__dec_carve_work(const zt__dec_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__dec_work *work)
{
    const size_t C = (size_t)a->C, e = esize;
    work->dres = zt__dec_take(base, used, N * C * e, align);
    work->dln = zt__dec_take(base, used, N * C * e, align);
    work->datty = zt__dec_take(base, used, N * C * e, align);
    work->dqkv = zt__dec_take(base, used, N * (size_t)zt__dec_qkv_width(a) * e, align);
    work->dh = zt__dec_take(base, used, N * (size_t)zt__dec_up_width(a) * e, align);
    work->dact = a->mlp != ZT__DEC_MLP_GELU_TANH ? zt__dec_take(base, used, N * (size_t)a->F * e, align) : NULL;
}

/* ---- the program ---- */

static void norm_forward(const zt_ops *o, const zt__dec_arch *a, void *out, float *mean, float *rstd, const void *x,
                         const void *w, const void *b, int N)
{
    if (a->norm == ZT__DEC_LAYERNORM)
        o->layernorm(o, out, mean, rstd, x, w, b, N, a->C, a->eps);
    else
        o->rmsnorm(o, out, rstd, x, w, N, a->C, a->eps);
}

/* dx += the norm's input gradient of dout; its weight (and bias) gradients into dw (db). */
static void norm_backward(const zt_ops *o, const zt__dec_arch *a, void *dx, void *dw, void *db, const void *dout,
                          const void *x, const void *w, const float *mean, const float *rstd, int N)
{
    if (a->norm == ZT__DEC_LAYERNORM)
        o->layernorm_backward(o, dx, dw, db, dout, x, w, mean, rstd, N, a->C);
    else
        o->rmsnorm_backward(o, dx, dw, dout, x, w, rstd, N, a->C);
}

int zt__dec_docs_plan(const int32_t *pos, int B, int T, zt__dec_group *groups, int32_t *cu)
{
    const long N = (long)B * T, cap = ZT__DEC_LSE_ROWS * N;
    for (long i = 0; i < N; i++)
        if (i % T == 0 ? pos[i] != 0 : pos[i] != 0 && pos[i] != pos[i - 1] + 1)
            return -1;
    /* Invariant: used (closed groups) + the open group's need + the tokens after the open group <= cap, so
     * that a group of one document, which needs exactly its length, always fits. */
    long used = 0, rest = N;
    int ngroups = 0, ncu = 0;
    zt__dec_group *g = NULL;
    for (long start = 0; start < N;) {
        long end = start + 1;
        while (end < N && pos[end] != 0)
            end++;
        const int len = (int)(end - start);
        rest -= len;
        if (g) {
            const long m = g->maxlen > len ? g->maxlen : len;
            if (used + (long)(g->nseq + 1) * m + rest > cap) {
                used += (long)g->nseq * g->maxlen;
                g = NULL;
            }
        }
        if (!g) {
            g = &groups[ngroups++];
            *g = (zt__dec_group){.row0 = (int)start, .nseq = 0, .maxlen = 0, .cu_off = ncu,
                                 .lse_off = (size_t)used};
            cu[ncu++] = 0;
        }
        g->nseq++;
        if (len > g->maxlen)
            g->maxlen = len;
        cu[ncu++] = (int32_t)(end - g->row0);
        start = end;
    }
    return ngroups;
}

static zt_attention_dims attention_dims(const zt__dec_arch *a, int B, int T)
{
    return (zt_attention_dims){.B = B, .T = T, .NH = a->NH, .NKV = a->NKV, .HS = a->HS, .causal = true};
}

/* Attention over packed qkv rows: one document a row, or the documents' groups (out, lse, qkv of the group's
 * rows; lse_off counts rows of NH floats). */
static void attention_forward(const zt_ops *o, const zt__dec_arch *a, void *out, float *lse, const void *qkv,
                              const zt_attention_dims *d, const zt__dec_docs *docs)
{
    if (!docs) {
        o->attention(o, out, lse, qkv, NULL, d);
        return;
    }
    const size_t QKV = (size_t)zt__dec_qkv_width(a), C = (size_t)a->NH * a->HS;
    for (int i = 0; i < docs->ngroups; i++) {
        const zt__dec_group *g = &docs->groups[i];
        o->attention_varlen(o, (char *)out + (size_t)g->row0 * C * o->esize, lse + g->lse_off * (size_t)a->NH,
                            (const char *)qkv + (size_t)g->row0 * QKV * o->esize, docs->cu + g->cu_off, g->nseq,
                            g->maxlen, d);
    }
}

static void attention_backward(const zt_ops *o, const zt__dec_arch *a, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const float *lse, const zt_attention_dims *d, const zt__dec_docs *docs)
{
    if (!docs) {
        o->attention_backward(o, dqkv, dout, qkv, out, lse, NULL, d);
        return;
    }
    const size_t QKV = (size_t)zt__dec_qkv_width(a), C = (size_t)a->NH * a->HS;
    for (int i = 0; i < docs->ngroups; i++) {
        const zt__dec_group *g = &docs->groups[i];
        const size_t q = (size_t)g->row0 * QKV * o->esize, r = (size_t)g->row0 * C * o->esize;
        o->attention_varlen_backward(o, (char *)dqkv + q, (const char *)dout + r, (const char *)qkv + q,
                                     (const char *)out + r, lse + g->lse_off * (size_t)a->NH, docs->cu + g->cu_off,
                                     g->nseq, g->maxlen, d);
    }
}

void zt__dec_layer_forward(const zt_ops *o, const zt__dec_arch *a, const zt__dec_w *w, const void *x,
                           zt__dec_acts *s, const float *inv_freq, int B, int T, bool rebuild,
                           const zt__dec_docs *docs)
{
    const int N = B * T, C = a->C, F = a->F, QKV = zt__dec_qkv_width(a), UP = zt__dec_up_width(a);
    const zt_attention_dims d = attention_dims(a, B, T);
#define W(r) w->t[ZT__DEC_##r]
    /* attention: res2 = x + o_proj(attention(rope(qkv_proj(norm1(x))))) */
    norm_forward(o, a, s->ln1, s->ln1_mean, s->ln1_rstd, x, W(LN1_W), W(LN1_B), N);
    o->linear(o, s->qkv, s->ln1, W(QKV_W), W(QKV_B), N, C, QKV);
    if (a->rope)
        o->rope(o, s->qkv, inv_freq, B, T, a->NH, a->NKV, a->HS, a->rot, docs ? docs->pos : NULL);
    attention_forward(o, a, s->atty, s->lse, s->qkv, &d, docs);
    o->linear_residual(o, s->res2, s->atty, W(O_W), W(O_B), x, N, C, C);
    /* MLP: out = res2 + down_proj(act(up_proj(norm2(res2)))), or of norm2(x) with parallel residuals */
    norm_forward(o, a, s->ln2, s->ln2_mean, s->ln2_rstd, a->parallel_residual ? x : s->res2, W(LN2_W), W(LN2_B), N);
    if (a->mlp == ZT__DEC_MLP_SWIGLU) {
        o->linear(o, s->h, s->ln2, W(UP_W), W(UP_B), N, C, UP);
        o->swiglu(o, s->act, s->h, N, F);
    } else if (a->mlp == ZT__DEC_MLP_GELU_ERF) {
        o->linear(o, s->h, s->ln2, W(UP_W), W(UP_B), N, C, UP);
        o->gelu_erf(o, s->act, s->h, (size_t)N * F);
    } else {
        o->linear_gelu(o, s->h, s->act, s->ln2, W(UP_W), W(UP_B), N, C, UP);
    }
    if (!rebuild)
        o->linear_residual(o, s->out, s->act, W(DOWN_W), W(DOWN_B), s->res2, N, F, C);
#undef W
}

void zt__dec_layer_backward(const zt_ops *o, const zt__dec_arch *a, const zt__dec_w *w, const zt__dec_g *g,
                            const void *x, const zt__dec_acts *s, zt__dec_work *k, const float *inv_freq, int B, int T,
                            const zt__dec_docs *docs)
{
    const int N = B * T, C = a->C, F = a->F, QKV = zt__dec_qkv_width(a), UP = zt__dec_up_width(a);
    const zt_attention_dims d = attention_dims(a, B, T);
#define W(r) w->t[ZT__DEC_##r]
#define G(r) g->t[ZT__DEC_##r]
    /* MLP */
    if (a->mlp == ZT__DEC_MLP_SWIGLU) {
        o->linear_backward(o, k->dact, G(DOWN_W), G(DOWN_B), k->dres, s->act, W(DOWN_W), N, F, C);
        o->swiglu_backward(o, k->dh, s->h, k->dact, N, F);
    } else if (a->mlp == ZT__DEC_MLP_GELU_ERF) {
        o->linear_backward(o, k->dact, G(DOWN_W), G(DOWN_B), k->dres, s->act, W(DOWN_W), N, F, C);
        o->gelu_erf_backward(o, k->dh, s->h, k->dact, (size_t)N * F);
    } else {
        o->linear_backward_gelu(o, k->dh, G(DOWN_W), G(DOWN_B), k->dres, s->act, W(DOWN_W), s->h, N, F, C);
    }
    o->linear_backward(o, k->dln, G(UP_W), G(UP_B), k->dh, s->ln2, W(UP_W), N, C, UP);
    /* Sequential: dres becomes d(res2) = d(out) + norm2's input gradient. Parallel: norm2 read x, and the
     * output projection's gradient is d(out) alone, so norm2's input gradient joins dres after it. */
    if (!a->parallel_residual)
        norm_backward(o, a, k->dres, G(LN2_W), G(LN2_B), k->dln, s->res2, W(LN2_W), s->ln2_mean, s->ln2_rstd, N);
    /* attention */
    o->linear_backward(o, k->datty, G(O_W), G(O_B), k->dres, s->atty, W(O_W), N, C, C);
    if (a->parallel_residual)
        norm_backward(o, a, k->dres, G(LN2_W), G(LN2_B), k->dln, x, W(LN2_W), s->ln2_mean, s->ln2_rstd, N);
    attention_backward(o, a, k->dqkv, k->datty, s->qkv, s->atty, s->lse, &d, docs);
    if (a->rope)
        o->rope_backward(o, k->dqkv, inv_freq, B, T, a->NH, a->NKV, a->HS, a->rot, docs ? docs->pos : NULL);
    o->linear_backward(o, k->dln, G(QKV_W), G(QKV_B), k->dqkv, s->ln1, W(QKV_W), N, C, QKV);
    norm_backward(o, a, k->dres, G(LN1_W), G(LN1_B), k->dln, x, W(LN1_W), s->ln1_mean, s->ln1_rstd, N);
#undef W
#undef G
}

void zt__dec_final_forward(const zt_ops *o, const zt__dec_arch *a, void *out, float *mean, float *rstd, const void *x,
                           const void *w, const void *b, int N)
{
    norm_forward(o, a, out, mean, rstd, x, w, b, N);
}

void zt__dec_final_backward(const zt_ops *o, const zt__dec_arch *a, void *dres, void *dw, void *db, const void *dout,
                            const void *x, const void *w, const float *mean, const float *rstd, int N)
{
    o->zero(o, dres, (size_t)N * a->C);
    norm_backward(o, a, dres, dw, db, dout, x, w, mean, rstd, N);
}

void zt__dec_embedding_forward(const zt_ops *o, const zt__dec_arch *a, void *out, const int32_t *tokens,
                               const void *wte, const void *wpe, void *tmp, int B, int T, const zt__dec_docs *docs)
{
    if (!docs || !wpe) {
        o->embedding(o, out, tokens, wte, wpe, B, T, a->C);
        return;
    }
    /* wte[token] + wpe[position]: the positions index wpe as tokens index wte; the sum is rounded once, as
     * the fused kernel rounds it */
    o->embedding(o, out, tokens, wte, NULL, B, T, a->C);
    o->embedding(o, tmp, docs->pos, wpe, NULL, B, T, a->C);
    o->add_inplace(o, out, tmp, (size_t)B * T * a->C);
}

void zt__dec_embedding_backward(const zt_ops *o, const zt__dec_arch *a, void *dwte, void *dwpe, const void *dres,
                                const int32_t *tokens, void *pad_row, int B, int T, const zt__dec_docs *docs,
                                int wpe_rows)
{
    const size_t C = (size_t)a->C;
    char *pad = a->pad_token_id >= 0 ? (char *)dwte + (size_t)a->pad_token_id * C * o->esize : NULL;
    if (pad)
        o->copy(o, pad_row, pad, C);
    o->embedding_backward(o, dwte, docs ? NULL : dwpe, dres, tokens, B, T, a->C, a->V);
    if (pad)
        o->copy(o, pad, pad_row, C);
    if (docs && dwpe) /* the rows of wpe gather the gradients of their positions, as token rows do */
        o->embedding_backward(o, dwpe, NULL, dres, docs->pos, B, T, a->C, wpe_rows);
}

/* ---- the CPU runner ---- */

struct zt__dec_cpu {
    zt__cpu_runner c;             /* tables, binding, slab, inputs, loss and the micro-batch begun last */
    zt__dec_arch a;
    float *inv_freq;              /* [rot/2] when a.rope */

    /* Carved from the slab and the inputs. */
    float *encoded;               /* [N,C] the input of layer 0 */
    zt__dec_acts *layers;         /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                /* [N,V]; the logits' gradient after backward_head */
    zt__dec_work work;
    float *pad_row;               /* [C] */
    int32_t *tokens;              /* [N] of the micro-batch begun last; c.loss's targets [N] after them */
    bool *discarded;              /* [L+2] a checkpointed block dropped its activations after its forward */
    int32_t *pos, *cu;            /* [N], [2N]: packed documents' positions and attention offsets */
    zt__dec_group *groups;        /* [N] */
    zt__dec_docs docs;            /* over pos, cu and groups */
    bool packed;                  /* the micro-batch begun last has packed documents */
};

/* Carves the runner's activations from base (or counts them with base NULL); returns the bytes. */
static size_t carve(zt__dec_cpu *r, char *base)
{
    const zt__dec_arch *a = &r->a;
    const size_t N = (size_t)r->c.max_B * r->c.max_T, C = (size_t)a->C, f = sizeof(float), al = 64;
    size_t used = 0;
    r->encoded = zt__dec_take(base, &used, N * C * f, al);
    for (int l = 0; l < a->L; l++)
        zt__dec_carve_acts(a, N, f, al, base, &used, &r->layers[l], false);
    r->lnf = zt__dec_take(base, &used, N * C * f, al);
    r->lnf_mean = zt__dec_take(base, &used, N * f, al);
    r->lnf_rstd = zt__dec_take(base, &used, N * f, al);
    r->logits = zt__dec_take(base, &used, N * (size_t)a->V * f, al);
    r->c.loss.losses = zt__dec_take(base, &used, N * f, al);
    zt__dec_carve_work(a, N, f, al, base, &used, &r->work);
    r->pad_row = zt__dec_take(base, &used, C * f, al);
    return used;
}

int zt__dec_cpu_create(zt__dec_cpu **out, const zt__dec_arch *a, const zt_param_info *tensors,
                       const zt_block_info *blocks, int B, int T, const float *inv_freq, zt_err *err)
{
    *out = NULL;
    zt__dec_cpu *r = zt_xcalloc(1, sizeof *r);
    r->a = *a;
    zt__cpu_runner_init(&r->c, tensors, blocks, B, T);
    r->layers = zt_xcalloc((size_t)(a->L > 0 ? a->L : 1), sizeof *r->layers);
    r->discarded = zt_xcalloc((size_t)a->L + 2, sizeof *r->discarded);
    const size_t bytes = carve(r, NULL), N = (size_t)B * T;
    r->groups = zt_xmalloc(N * sizeof(zt__dec_group));
    /* tokens, targets and packed documents' positions [N] each, their attention offsets [2N] */
    const int rc = zt__cpu_runner_open(&r->c, bytes, 5 * N, a->F > a->C ? a->F : a->C, err);
    if (rc < 0) {
        zt__dec_cpu_destroy(r);
        return rc;
    }
    ZT_ASSERT(carve(r, r->c.slab) == bytes);
    r->tokens = r->c.io;
    r->c.loss.targets = r->c.io + N;
    r->pos = r->c.io + 2 * N;
    r->cu = r->c.io + 3 * N;
    if (a->rope) {
        ZT_ASSERT(a->rot > 0 && a->rot <= a->HS && a->rot % 2 == 0);
        r->inv_freq = zt_xmalloc((size_t)a->rot / 2 * sizeof(float));
        memcpy(r->inv_freq, inv_freq, (size_t)a->rot / 2 * sizeof(float));
    }
    *out = r;
    return 0;
}

void zt__dec_cpu_destroy(zt__dec_cpu *r)
{
    if (!r)
        return;
    zt__cpu_runner_free(&r->c);
    free(r->layers);
    free(r->discarded);
    free(r->inv_freq);
    free(r->groups);
    free(r);
}

/* Tensor idx inside its block's flat buffer bp (weights or gradients). */
static float *in_block(const zt__dec_cpu *r, const float *bp, int idx)
{
    return zt__cpu_in_block(&r->c, bp, idx);
}

/* Layer l's weights (or gradients) in its block's buffer, by role. */
static void layer_weights(const zt__dec_cpu *r, int l, const float *bp, zt__dec_w *w)
{
    for (int k = 0; k < ZT__DEC_ROLES; k++)
        w->t[k] = r->a.role[k] < 0 ? NULL : in_block(r, bp, r->a.layer0 + l * r->a.per_layer + r->a.role[k]);
}

static void layer_grads(const zt__dec_cpu *r, int l, float *bg, zt__dec_g *g)
{
    for (int k = 0; k < ZT__DEC_ROLES; k++)
        g->t[k] = r->a.role[k] < 0 ? NULL : in_block(r, bg, r->a.layer0 + l * r->a.per_layer + r->a.role[k]);
}

/* The documents of the micro-batch begun last, or NULL (one a row). */
static const zt__dec_docs *docs_of(const zt__dec_cpu *r)
{
    return r->packed ? &r->docs : NULL;
}

/* The residual stream entering layer l (l == L: entering the final norm). */
static const float *layer_input(const zt__dec_cpu *r, int l)
{
    return l > 0 ? r->layers[l - 1].out : r->encoded;
}

void zt__dec_cpu_begin(zt__dec_cpu *r, const int32_t *tokens, int B, int T, const int32_t *pos)
{
    zt__cpu_runner_begin(&r->c, B, T);
    const int N = B * T;
    for (int i = 0; i < N; i++)
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < r->a.V);
    memmove(r->tokens, tokens, (size_t)N * sizeof *tokens);
    r->packed = pos != NULL;
    if (pos) {
        memmove(r->pos, pos, (size_t)N * sizeof *pos);
        const int ngroups = zt__dec_docs_plan(r->pos, B, T, r->groups, r->cu);
        ZT_ASSERT(ngroups > 0); /* positions restart at 0 at each row and document, and count up by 1 */
        r->docs = (zt__dec_docs){.pos = r->pos, .cu = r->cu, .groups = r->groups, .ngroups = ngroups};
    }
    memset(r->discarded, 0, ((size_t)r->a.L + 2) * sizeof *r->discarded);
}

void zt__dec_cpu_forward_block(zt__dec_cpu *r, int block, const float *bp)
{
    const zt__dec_arch *a = &r->a;
    ZT_ASSERT(block >= 0 && block <= a->L + 1);
    const int N = r->c.B * r->c.T;
    if (block == 0) {
        zt__dec_embedding_forward(&r->c.ops, a, r->encoded, r->tokens, in_block(r, bp, 0),
                                  a->wpe ? in_block(r, bp, 1) : NULL, r->work.dln, r->c.B, r->c.T, docs_of(r));
        return;
    }
    if (block == a->L + 1) {
        zt__dec_final_forward(&r->c.ops, a, r->lnf, r->lnf_mean, r->lnf_rstd, layer_input(r, a->L),
                              in_block(r, bp, a->final_w), a->final_b >= 0 ? in_block(r, bp, a->final_b) : NULL, N);
        return;
    }
    const int l = block - 1;
    zt__dec_w w;
    layer_weights(r, l, bp, &w);
    const bool rebuild = r->discarded[block];
    r->discarded[block] = false;
    zt__dec_layer_forward(&r->c.ops, a, &w, layer_input(r, l), &r->layers[l], r->inv_freq, r->c.B, r->c.T, rebuild,
                          docs_of(r));
}

float zt__dec_cpu_forward_head(zt__dec_cpu *r, const float *hp, const int32_t *targets)
{
    const int N = r->c.B * r->c.T, C = r->a.C, V = r->a.V;
    zt_cpu_matmul_forward(r->logits, r->lnf, in_block(r, hp, r->a.head_tensor), NULL, N, C, V);
    if (!targets)
        return 0.0f;
    for (int i = 0; i < N; i++)
        ZT_ASSERT(targets[i] == IGNORE_INDEX || (targets[i] >= 0 && targets[i] < V));
    memmove(r->c.loss.targets, targets, (size_t)N * sizeof *targets);
    return zt__cpu_loss_forward(&r->c.loss, r->logits, N, V);
}

void zt__dec_cpu_backward_head(zt__dec_cpu *r, const float *hp, float *hg, float loss_scale)
{
    if (!zt__cpu_loss_backward(&r->c.loss, r->logits, loss_scale))
        return;
    const int N = r->c.B * r->c.T, C = r->a.C, V = r->a.V;
    memset(r->work.dln, 0, (size_t)N * C * sizeof(float));
    zt_cpu_matmul_backward(r->work.dln, in_block(r, hg, r->a.head_tensor), NULL, r->logits, r->lnf,
                           in_block(r, hp, r->a.head_tensor), N, C, V);
}

void zt__dec_cpu_backward_block(zt__dec_cpu *r, int block, const float *bp, float *bg)
{
    const zt__dec_arch *a = &r->a;
    ZT_ASSERT(block >= 0 && block <= a->L + 1);
    if (r->c.loss.skip)
        return;
    const int N = r->c.B * r->c.T;
    if (block == a->L + 1) {
        zt__dec_final_backward(&r->c.ops, a, r->work.dres, in_block(r, bg, a->final_w),
                               a->final_b >= 0 ? in_block(r, bg, a->final_b) : NULL, r->work.dln,
                               layer_input(r, a->L), in_block(r, bp, a->final_w), r->lnf_mean, r->lnf_rstd, N);
        return;
    }
    if (block == 0) {
        zt__dec_embedding_backward(&r->c.ops, a, in_block(r, bg, 0), a->wpe ? in_block(r, bg, 1) : NULL,
                                   r->work.dres, r->tokens, r->pad_row, r->c.B, r->c.T, docs_of(r),
                                   a->wpe ? (int)(r->c.tensors[1].numel / (size_t)a->C) : 0);
        return;
    }
    const int l = block - 1;
    zt__dec_w w;
    zt__dec_g g;
    layer_weights(r, l, bp, &w);
    layer_grads(r, l, bg, &g);
    zt__dec_layer_backward(&r->c.ops, a, &w, &g, layer_input(r, l), &r->layers[l], &r->work, r->inv_freq, r->c.B,
                           r->c.T, docs_of(r));
}

/* Fills a layer's intermediate activations with NaN, keeping its output: a rebuild must recompute them. */
void zt__dec_cpu_discard_block(zt__dec_cpu *r, int block)
{
    if (block < 1 || block > r->a.L)
        return;
    const zt__dec_arch *a = &r->a;
    const size_t N = (size_t)r->c.B * r->c.T, C = (size_t)a->C;
    zt__dec_acts *s = &r->layers[block - 1];
    struct {
        float *p;
        size_t n;
    } parts[] = {{s->ln1, N * C},      {s->ln1_mean, s->ln1_mean ? N : 0},
                 {s->ln1_rstd, N},     {s->qkv, N * (size_t)zt__dec_qkv_width(a)},
                 {s->atty, N * C},     {s->lse, ZT__DEC_LSE_ROWS * N * (size_t)a->NH},
                 {s->res2, N * C},     {s->ln2, N * C},
                 {s->ln2_mean, s->ln2_mean ? N : 0}, {s->ln2_rstd, N},
                 {s->h, N * (size_t)zt__dec_up_width(a)}, {s->act, N * (size_t)a->F}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        for (size_t i = 0; i < parts[k].n; i++)
            parts[k].p[i] = NAN;
    r->discarded[block] = true;
}

const float *zt__dec_cpu_logits(const zt__dec_cpu *r)
{
    return r->logits;
}
