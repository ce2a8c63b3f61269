/* The encoder-only transformer's program, its inputs' staging and its CPU runner; see encoder.h. */
#include "worker/models/encoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "worker/models/cpu_exec.h" /* what the CPU runners share */
#include "worker/models/decoder.h"  /* zt__dec_take, the carving of activation pools */

#define IGNORE_INDEX (-1)

int zt__enc_rows(const zt__enc_arch *a, int B, int T)
{
    return a->head == ZT__ENC_HEAD_MLM ? B * T : B;
}

/* ---- activations ---- */

void zt__enc_carve_acts(const zt__enc_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__enc_acts *s, bool inner, bool sum, bool out)
{
    const size_t NC = N * (size_t)a->C * esize, NF = N * (size_t)a->F * esize, f4 = sizeof(float);
    if (inner) {
        s->qkv = zt__dec_take(base, used, 3 * NC, align);
        s->atty = zt__dec_take(base, used, NC, align);
        s->lse = zt__dec_take(base, used, N * (size_t)a->NH * f4, align);
        s->res1 = zt__dec_take(base, used, NC, align);
        s->ln1 = zt__dec_take(base, used, NC, align);
        s->ln1_mean = zt__dec_take(base, used, N * f4, align);
        s->ln1_rstd = zt__dec_take(base, used, N * f4, align);
        s->h = zt__dec_take(base, used, NF, align);
        s->act = zt__dec_take(base, used, NF, align);
    }
    if (sum) {
        s->res2 = zt__dec_take(base, used, NC, align);
        s->ln2_mean = zt__dec_take(base, used, N * f4, align);
        s->ln2_rstd = zt__dec_take(base, used, N * f4, align);
    }
    if (out)
        s->out = zt__dec_take(base, used, NC, align);
}

void zt__enc_carve_ends(const zt__enc_arch *a, size_t B, size_t N, int Kp, size_t esize, size_t align, char *base,
                        size_t *used, zt__enc_ends *e)
{
    const size_t NC = N * (size_t)a->C * esize, BC = B * (size_t)a->C * esize, f4 = sizeof(float);
    e->emb = zt__dec_take(base, used, NC, align);
    e->emb_mean = zt__dec_take(base, used, N * f4, align);
    e->emb_rstd = zt__dec_take(base, used, N * f4, align);
    e->enc = zt__dec_take(base, used, NC, align);
    if (a->head == ZT__ENC_HEAD_MLM) {
        e->tr_pre = zt__dec_take(base, used, NC, align);
        e->tr_act = zt__dec_take(base, used, NC, align);
        e->tr_ln = zt__dec_take(base, used, NC, align);
        e->tr_mean = zt__dec_take(base, used, N * f4, align);
        e->tr_rstd = zt__dec_take(base, used, N * f4, align);
        e->dec_bias = zt__dec_take(base, used, (size_t)Kp * esize, align);
        e->ddec_bias = zt__dec_take(base, used, (size_t)Kp * esize, align);
    } else {
        void **rows[] = {&e->first, &e->pool_pre, &e->pooled, &e->dpooled, &e->dpool_pre, &e->dfirst};
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            *rows[i] = zt__dec_take(base, used, BC, align);
    }
    e->logits = zt__dec_take(base, used, (a->head == ZT__ENC_HEAD_MLM ? N : B) * (size_t)Kp * esize, align);
}

void zt__enc_carve_work(const zt__enc_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__enc_work *k)
{
    const size_t NC = N * (size_t)a->C * esize, NF = N * (size_t)a->F * esize;
    void **rows[] = {&k->dres, &k->dln, &k->datty, &k->dtmp};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        *rows[i] = zt__dec_take(base, used, NC, align);
    k->dqkv = zt__dec_take(base, used, 3 * NC, align);
    k->dh = zt__dec_take(base, used, NF, align);
    k->dact = zt__dec_take(base, used, NF, align);
}

/* ---- the program ---- */

static zt_attention_dims attention_dims(const zt__enc_arch *a, int B, int T)
{
    return (zt_attention_dims){.B = B, .T = T, .NH = a->NH, .NKV = a->NH, .HS = a->C / a->NH, .causal = false};
}

/* pre = in w^T + b; post = gelu(pre): the tanh form in the GEMM's epilogue, the exact form after it. */
static void linear_gelu(const zt_ops *o, enum zt__enc_act act, void *pre, void *post, const void *in, const void *w,
                        const void *b, int N, int IC, int OC)
{
    if (act == ZT__ENC_GELU_TANH) {
        o->linear_gelu(o, pre, post, in, w, b, N, IC, OC);
    } else {
        o->linear(o, pre, in, w, b, N, IC, OC);
        o->gelu_erf(o, post, pre, (size_t)N * OC);
    }
}

/* Row pos_row0 of the position table (of weights or gradients). */
static const void *position0(const zt_ops *o, const zt__enc_arch *a, const void *table)
{
    return (const char *)table + (size_t)a->pos_row0 * (size_t)a->C * o->esize;
}

void zt__enc_embed_forward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                           const int32_t *tokens, const int32_t *types, int B, int T)
{
#define W(r) w->t[ZT__ENC_E_##r]
    o->embedding_typed(o, e->emb, tokens, types, W(WORD), position0(o, a, W(POS)), W(TYPE), B, T, a->C);
    o->layernorm(o, e->enc, e->emb_mean, e->emb_rstd, e->emb, W(LN_W), W(LN_B), B * T, a->C, a->eps);
#undef W
}

void zt__enc_embed_backward(const zt_ops *o, const zt__enc_arch *a, const zt__enc_ends *e, const zt__enc_w *w,
                            const zt__enc_g *g, zt__enc_work *k, const int32_t *tokens, const int32_t *types, int B,
                            int T)
{
#define G(r) g->t[ZT__ENC_E_##r]
    o->layernorm_backward_overwrite(o, k->dln, G(LN_W), G(LN_B), k->dres, e->emb, w->t[ZT__ENC_E_LN_W], e->emb_mean,
                                    e->emb_rstd, B * T, a->C);
    o->embedding_typed_backward(o, G(WORD), (void *)position0(o, a, G(POS)), G(TYPE), k->dln, tokens, types, B, T,
                                a->C, a->V, a->types);
#undef G
}

void zt__enc_layer_output(const zt_ops *o, const zt__enc_arch *a, zt__enc_acts *s, const void *ln_w,
                          const void *ln_b, int N)
{
    o->layernorm(o, s->out, s->ln2_mean, s->ln2_rstd, s->res2, ln_w, ln_b, N, a->C, a->eps);
}

void zt__enc_layer_forward(const zt_ops *o, const zt__enc_arch *a, const zt__enc_w *w, const void *x,
                           zt__enc_acts *s, const int32_t *lens, int B, int T, bool kept_sum)
{
    const int N = B * T, C = a->C, F = a->F;
    const zt_attention_dims d = attention_dims(a, B, T);
#define W(r) w->t[ZT__ENC_##r]
    /* ln1 = LN1(x + o_proj(attention(qkv_proj(x)))) */
    o->linear(o, s->qkv, x, W(QKV_W), W(QKV_B), N, C, 3 * C);
    o->attention(o, s->atty, s->lse, s->qkv, lens, &d);
    o->linear_residual(o, s->res1, s->atty, W(O_W), W(O_B), x, N, C, C);
    o->layernorm(o, s->ln1, s->ln1_mean, s->ln1_rstd, s->res1, W(LN1_W), W(LN1_B), N, C, a->eps);
    /* out = LN2(ln1 + down_proj(gelu(up_proj(ln1)))) */
    linear_gelu(o, a->act, s->h, s->act, s->ln1, W(UP_W), W(UP_B), N, C, F);
    if (kept_sum)
        return;
    o->linear_residual(o, s->res2, s->act, W(DOWN_W), W(DOWN_B), s->ln1, N, F, C);
    zt__enc_layer_output(o, a, s, W(LN2_W), W(LN2_B), N);
#undef W
}

void zt__enc_layer_backward(const zt_ops *o, const zt__enc_arch *a, const zt__enc_w *w, const zt__enc_g *g,
                            const void *x, const zt__enc_acts *s, zt__enc_work *k, const int32_t *lens, int B, int T)
{
    const int N = B * T, C = a->C, F = a->F;
    const zt_attention_dims d = attention_dims(a, B, T);
#define W(r) w->t[ZT__ENC_##r]
#define G(r) g->t[ZT__ENC_##r]
    /* dln = d(res2), which is also the residual's part of d(ln1) */
    o->layernorm_backward_overwrite(o, k->dln, G(LN2_W), G(LN2_B), k->dres, s->res2, W(LN2_W), s->ln2_mean,
                                    s->ln2_rstd, N, C);
    if (a->act == ZT__ENC_GELU_TANH) {
        o->linear_backward_gelu(o, k->dh, G(DOWN_W), G(DOWN_B), k->dln, s->act, W(DOWN_W), s->h, N, F, C);
    } else {
        o->linear_backward(o, k->dact, G(DOWN_W), G(DOWN_B), k->dln, s->act, W(DOWN_W), N, F, C);
        o->gelu_erf_backward(o, k->dh, s->h, k->dact, (size_t)N * F);
    }
    o->linear_backward_add(o, k->dln, G(UP_W), G(UP_B), k->dh, s->ln1, W(UP_W), N, C, F);
    /* dres = d(res1), which is also the residual's part of d(x) */
    o->layernorm_backward_overwrite(o, k->dres, G(LN1_W), G(LN1_B), k->dln, s->res1, W(LN1_W), s->ln1_mean,
                                    s->ln1_rstd, N, C);
    o->linear_backward(o, k->datty, G(O_W), G(O_B), k->dres, s->atty, W(O_W), N, C, C);
    o->attention_backward(o, k->dqkv, k->datty, s->qkv, s->atty, s->lse, lens, &d);
    o->linear_backward_add(o, k->dres, G(QKV_W), G(QKV_B), k->dqkv, x, W(QKV_W), N, C, 3 * C);
#undef W
#undef G
}

void zt__enc_head_forward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                          const void *x, int B, int T, int Kp)
{
    const int N = B * T, C = a->C;
#define W(r) w->t[ZT__ENC_H_##r]
    if (a->head == ZT__ENC_HEAD_MLM) {
        linear_gelu(o, a->head_act, e->tr_pre, e->tr_act, x, W(DENSE_W), W(DENSE_B), N, C, C);
        o->layernorm(o, e->tr_ln, e->tr_mean, e->tr_rstd, e->tr_act, W(LN_W), W(LN_B), N, C, a->eps);
        /* the decoder bias, for the head pass (which reads the word embeddings' block) */
        o->copy(o, e->dec_bias, W(BIAS), (size_t)Kp);
    } else {
        o->first_token(o, e->first, x, B, T, C);
        o->linear(o, e->pool_pre, e->first, W(DENSE_W), W(DENSE_B), B, C, C);
        o->tanh(o, e->pooled, e->pool_pre, (size_t)B * C);
    }
#undef W
}

void zt__enc_head_backward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                           const zt__enc_g *g, const void *x, zt__enc_work *k, int B, int T, int Kp)
{
    const int N = B * T, C = a->C;
#define W(r) w->t[ZT__ENC_H_##r]
#define G(r) g->t[ZT__ENC_H_##r]
    if (a->head == ZT__ENC_HEAD_MLM) {
        o->layernorm_backward_overwrite(o, k->datty, G(LN_W), G(LN_B), k->dln, e->tr_act, W(LN_W), e->tr_mean,
                                        e->tr_rstd, N, C);
        o->gelu_backward(o, k->dtmp, e->tr_pre, k->datty, (size_t)N * C, a->head_act == ZT__ENC_GELU_ERF);
        o->linear_backward(o, k->dres, G(DENSE_W), G(DENSE_B), k->dtmp, x, W(DENSE_W), N, C, C);
        o->add(o, G(BIAS), e->ddec_bias, (size_t)Kp);
    } else {
        o->tanh_backward(o, e->dpool_pre, e->pooled, e->dpooled, (size_t)B * C);
        o->linear_backward(o, e->dfirst, G(DENSE_W), G(DENSE_B), e->dpool_pre, e->first, W(DENSE_W), B, C, C);
        o->first_token_backward(o, k->dres, e->dfirst, B, T, C);
    }
#undef W
#undef G
}

void zt__enc_logits(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w, int B, int T,
                    int Kp)
{
    if (a->head == ZT__ENC_HEAD_MLM)
        o->linear(o, e->logits, e->tr_ln, w->t[ZT__ENC_H_OUT_W], e->dec_bias, B * T, a->C, Kp);
    else
        o->linear(o, e->logits, e->pooled, w->t[ZT__ENC_H_OUT_W], w->t[ZT__ENC_H_OUT_B], B, a->C, Kp);
}

void zt__enc_logits_backward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                             const zt__enc_g *g, zt__enc_work *k, int B, int T, int Kp)
{
    if (a->head == ZT__ENC_HEAD_MLM) {
        o->zero(o, e->ddec_bias, (size_t)Kp);
        o->linear_backward(o, k->dln, g->t[ZT__ENC_H_OUT_W], e->ddec_bias, e->logits, e->tr_ln,
                           w->t[ZT__ENC_H_OUT_W], B * T, a->C, Kp);
    } else {
        o->linear_backward(o, e->dpooled, g->t[ZT__ENC_H_OUT_W], g->t[ZT__ENC_H_OUT_B], e->logits, e->pooled,
                           w->t[ZT__ENC_H_OUT_W], B, a->C, Kp);
    }
}

/* ---- inputs ---- */

void zt__enc_stage(const zt__enc_arch *a, const int32_t *tokens, const int32_t *types, int B, int T, int32_t *tok,
                   int32_t *typ, int32_t *lens)
{
    const size_t N = (size_t)B * T;
    for (size_t i = 0; i < N; i++) {
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < a->V);
        ZT_ASSERT(!types || (types[i] >= 0 && types[i] < a->types));
        tok[i] = tokens[i];
        typ[i] = types ? types[i] : 0;
    }
    for (int b = 0; b < B; b++) {
        int len = T;
        while (len > 0 && tok[(size_t)b * T + (size_t)len - 1] == a->pad_token_id)
            len--;
        lens[b] = len;
    }
}

int zt__enc_targets(const zt__enc_arch *a, const int32_t *tok, const int32_t *targets, int B, int T, int32_t *out)
{
    const bool mlm = a->head == ZT__ENC_HEAD_MLM;
    const int rows = zt__enc_rows(a, B, T);
    int valid = 0;
    for (int r = 0; r < rows; r++) {
        const size_t at = mlm ? (size_t)r : (size_t)r * T;
        int32_t y = targets ? targets[at] : IGNORE_INDEX;
        ZT_ASSERT(y == IGNORE_INDEX || (y >= 0 && y < a->K));
        if (!mlm && targets)
            for (int t = 1; t < T; t++)
                ZT_ASSERT(targets[at + (size_t)t] == IGNORE_INDEX); /* one label per sequence, at its first position */
        if (tok[at] == a->pad_token_id)
            y = IGNORE_INDEX;
        out[r] = y;
        valid += y != IGNORE_INDEX;
    }
    return valid;
}

int zt__enc_correct(const float *logits, const int32_t *targets, size_t rows, size_t K)
{
    int correct = 0;
    for (size_t r = 0; r < rows; r++) {
        if (targets[r] == IGNORE_INDEX)
            continue;
        const float *row = logits + r * K;
        size_t best = 0;
        for (size_t k = 1; k < K; k++)
            if (row[k] > row[best])
                best = k;
        correct += (int32_t)best == targets[r];
    }
    return correct;
}

/* ---- the CPU runner ---- */

struct zt__enc_cpu {
    zt__cpu_runner c;             /* tables, binding, slab, inputs, loss and the micro-batch begun last */
    zt__enc_arch a;

    /* Carved from the slab and the inputs. */
    zt__enc_ends e;
    zt__enc_acts *layers;         /* [L] */
    zt__enc_work work;
    int32_t *tokens, *types, *lens; /* [N], [N], [B] of the micro-batch begun last; c.loss's targets after */
    const int32_t *next_types;    /* for the next begin; borrowed */
    int n_correct;                /* of the last head's counted targets */
};

/* Carves the runner's activations from base (or counts them with base NULL); returns the bytes. */
static size_t carve(zt__enc_cpu *r, char *base)
{
    const zt__enc_arch *a = &r->a;
    const size_t B = (size_t)r->c.max_B, N = B * r->c.max_T, f = sizeof(float), al = 64;
    size_t used = 0;
    zt__enc_carve_ends(a, B, N, a->K, f, al, base, &used, &r->e);
    for (int l = 0; l < a->L; l++)
        zt__enc_carve_acts(a, N, f, al, base, &used, &r->layers[l], true, true, true);
    r->c.loss.losses = zt__dec_take(base, &used, N * f, al);
    zt__enc_carve_work(a, N, f, al, base, &used, &r->work);
    return used;
}

int zt__enc_cpu_create(zt__enc_cpu **out, const zt__enc_arch *a, const zt_param_info *tensors,
                       const zt_block_info *blocks, int B, int T, zt_err *err)
{
    *out = NULL;
    zt__enc_cpu *r = zt_xcalloc(1, sizeof *r);
    zt__cpu_runner_init(&r->c, tensors, blocks, B, T);
    r->a = *a;
    r->layers = zt_xcalloc((size_t)(a->L > 0 ? a->L : 1), sizeof *r->layers);
    const size_t bytes = carve(r, NULL), N = (size_t)B * T;
    /* tokens and types [N], lengths [B], counted targets [N] */
    const int rc = zt__cpu_runner_open(&r->c, bytes, 3 * N + (size_t)B, a->F > a->C ? a->F : a->C, err);
    if (rc < 0) {
        zt__enc_cpu_destroy(r);
        return rc;
    }
    ZT_ASSERT(carve(r, r->c.slab) == bytes);
    r->tokens = r->c.io;
    r->types = r->c.io + N;
    r->lens = r->c.io + 2 * N;
    r->c.loss.targets = r->lens + B;
    *out = r;
    return 0;
}

void zt__enc_cpu_destroy(void *rv)
{
    zt__enc_cpu *r = rv;
    if (!r)
        return;
    zt__cpu_runner_free(&r->c);
    free(r->layers);
    free(r);
}

/* Block `block`'s tensors in its buffer bp by role (n roles, idx[k] their tensors or -1). */
static void block_tensors(const zt__enc_cpu *r, const float *bp, const int *idx, int n, void **t)
{
    for (int k = 0; k < n; k++)
        t[k] = idx[k] < 0 ? NULL : zt__cpu_in_block(&r->c, bp, idx[k]);
}

static void layer_tensors(const zt__enc_cpu *r, int l, const float *bp, void **t)
{
    int idx[ZT__ENC_ROLES];
    for (int k = 0; k < ZT__ENC_ROLES; k++)
        idx[k] = r->a.layer0 + l * r->a.per_layer + r->a.role[k];
    block_tensors(r, bp, idx, ZT__ENC_ROLES, t);
}

/* The hidden states entering layer l (l == L: the encoder's output, the head's input). */
static const float *layer_input(const zt__enc_cpu *r, int l)
{
    return l > 0 ? r->layers[l - 1].out : r->e.enc;
}

void zt__enc_cpu_set_token_types(void *rv, const int32_t *types)
{
    ((zt__enc_cpu *)rv)->next_types = types;
}

void zt__enc_cpu_begin(void *rv, const int32_t *tokens, int B, int T, const int32_t *pos)
{
    zt__enc_cpu *r = rv;
    ZT_ASSERT(pos == NULL); /* an encoder does not pack documents (the config refuses --sft-pack for it) */
    zt__cpu_runner_begin(&r->c, B, T);
    zt__enc_stage(&r->a, tokens, r->next_types, B, T, r->tokens, r->types, r->lens);
    r->next_types = NULL;
}

void zt__enc_cpu_forward_block(void *rv, int block, const float *bp)
{
    zt__enc_cpu *r = rv;
    const zt__enc_arch *a = &r->a;
    ZT_ASSERT(block >= 0 && block <= a->L + 1);
    zt__enc_w w;
    if (block == 0) {
        block_tensors(r, bp, a->emb, ZT__ENC_E_ROLES, (void **)w.t);
        zt__enc_embed_forward(&r->c.ops, a, &r->e, &w, r->tokens, r->types, r->c.B, r->c.T);
    } else if (block == a->L + 1) {
        block_tensors(r, bp, a->head_t, ZT__ENC_H_OUT_W, (void **)w.t);
        zt__enc_head_forward(&r->c.ops, a, &r->e, &w, layer_input(r, a->L), r->c.B, r->c.T, a->K);
    } else {
        /* a checkpointed layer's rebuild is its whole forward again: it kept only its output */
        layer_tensors(r, block - 1, bp, (void **)w.t);
        zt__enc_layer_forward(&r->c.ops, a, &w, layer_input(r, block - 1), &r->layers[block - 1], r->lens, r->c.B,
                              r->c.T, false);
    }
}

/* The output layer's weight and bias (by head role) in the head block's buffer hp; the other roles NULL. */
static void output_tensors(const zt__enc_cpu *r, const float *hp, void **t)
{
    for (int k = 0; k < ZT__ENC_H_ROLES; k++)
        t[k] = NULL;
    block_tensors(r, hp, r->a.head_t + ZT__ENC_H_OUT_W, ZT__ENC_H_ROLES - ZT__ENC_H_OUT_W, t + ZT__ENC_H_OUT_W);
}

float zt__enc_cpu_forward_head(void *rv, const float *hp, const int32_t *targets)
{
    zt__enc_cpu *r = rv;
    const zt__enc_arch *a = &r->a;
    const int rows = zt__enc_rows(a, r->c.B, r->c.T);
    zt__enc_w w;
    output_tensors(r, hp, (void **)w.t);
    zt__enc_logits(&r->c.ops, a, &r->e, &w, r->c.B, r->c.T, a->K);
    r->c.loss.counted = r->n_correct = 0;
    if (!targets)
        return 0.0f;
    zt__enc_targets(a, r->tokens, targets, r->c.B, r->c.T, r->c.loss.targets);
    const float loss = zt__cpu_loss_forward(&r->c.loss, r->e.logits, rows, a->K);
    r->n_correct = zt__enc_correct(r->e.logits, r->c.loss.targets, (size_t)rows, (size_t)a->K);
    return loss;
}

void zt__enc_cpu_backward_head(void *rv, const float *hp, float *hg, float loss_scale)
{
    zt__enc_cpu *r = rv;
    if (!zt__cpu_loss_backward(&r->c.loss, r->e.logits, loss_scale))
        return;
    zt__enc_w w;
    zt__enc_g g;
    output_tensors(r, hp, (void **)w.t);
    output_tensors(r, hg, g.t);
    zt__enc_logits_backward(&r->c.ops, &r->a, &r->e, &w, &g, &r->work, r->c.B, r->c.T, r->a.K);
}

void zt__enc_cpu_backward_block(void *rv, int block, const float *bp, float *bg)
{
    zt__enc_cpu *r = rv;
    const zt__enc_arch *a = &r->a;
    ZT_ASSERT(block >= 0 && block <= a->L + 1);
    if (r->c.loss.skip)
        return;
    zt__enc_w w;
    zt__enc_g g;
    if (block == 0) {
        block_tensors(r, bp, a->emb, ZT__ENC_E_ROLES, (void **)w.t);
        block_tensors(r, bg, a->emb, ZT__ENC_E_ROLES, g.t);
        zt__enc_embed_backward(&r->c.ops, a, &r->e, &w, &g, &r->work, r->tokens, r->types, r->c.B, r->c.T);
    } else if (block == a->L + 1) {
        block_tensors(r, bp, a->head_t, ZT__ENC_H_OUT_W, (void **)w.t);
        block_tensors(r, bg, a->head_t, ZT__ENC_H_OUT_W, g.t);
        zt__enc_head_backward(&r->c.ops, a, &r->e, &w, &g, layer_input(r, a->L), &r->work, r->c.B, r->c.T, a->K);
    } else {
        layer_tensors(r, block - 1, bp, (void **)w.t);
        layer_tensors(r, block - 1, bg, g.t);
        zt__enc_layer_backward(&r->c.ops, a, &w, &g, layer_input(r, block - 1), &r->layers[block - 1], &r->work,
                               r->lens, r->c.B, r->c.T);
    }
}

/* Fills a layer's intermediate activations with NaN, keeping its output: a rebuild must recompute them. */
void zt__enc_cpu_discard_block(void *rv, int block)
{
    zt__enc_cpu *r = rv;
    if (block < 1 || block > r->a.L)
        return;
    const size_t N = (size_t)r->c.B * r->c.T, C = (size_t)r->a.C, F = (size_t)r->a.F, NH = (size_t)r->a.NH;
    zt__enc_acts *s = &r->layers[block - 1];
    struct {
        float *p;
        size_t n;
    } parts[] = {{s->qkv, N * 3 * C}, {s->atty, N * C},  {s->lse, N * NH},      {s->res1, N * C},
                 {s->ln1, N * C},     {s->ln1_mean, N},  {s->ln1_rstd, N},      {s->h, N * F},
                 {s->act, N * F},     {s->res2, N * C},  {s->ln2_mean, N},      {s->ln2_rstd, N}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        for (size_t i = 0; i < parts[k].n; i++)
            parts[k].p[i] = NAN;
}

const float *zt__enc_cpu_logits(const void *rv)
{
    return ((const zt__enc_cpu *)rv)->e.logits;
}

void zt__enc_cpu_accuracy(const void *rv, int *correct, int *counted)
{
    const zt__enc_cpu *r = rv;
    *correct = r->n_correct;
    *counted = r->c.loss.counted;
}
