/* The encoder program on one CUDA GPU (encoder.h): the device layout of a host model's tensor table, the
 * activations carved from one pool, and the engine's model interface (worker/models/model.h) over the
 * encoder program with the CUDA binding (ops_cuda.c). BERT and RoBERTa train through this executor.
 *
 * Device layout: the host slab's tensors in order, each on a 64-element boundary except the key and value
 * weights and biases (right after the query's, so that each group stays one packed [3C, C] weight and [3C]
 * bias); the word embeddings and the masked-LM decoder bias padded to a vocabulary that is a multiple of 128,
 * the classifier's weight and bias to a multiple of 8 labels (padding is zero and its gradients are never
 * read). Checkpointed layers share one set of activations; one whose layer above is checkpointed too (or that
 * is the last) keeps its sum before the output LayerNorm rather than its output, so that no rebuild runs the
 * output projection. Nothing is allocated inside a step. */
#include "worker/models/encoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK */
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "worker/models/cpu_exec.h"  /* the mean loss */
#include "worker/models/cuda_exec.h" /* the layout, pool, stream and staging executors share */
#include "worker/models/decoder.h"   /* zt__dec_take */
#include "worker/models/model.h"
#include "worker/models/ops_cuda.h"

#define LABEL_PAD 8 /* classifier rows: the labels rounded up to this */

/* A checkpointed layer that keeps its sum: the output LayerNorm's weight and bias [C], copied at the first
 * forward, for the layer above to rebuild its input when this block's weights may be gone. */
typedef struct kept_norm {
    void *w, *b;
} kept_norm;

typedef struct enc_cuda {
    zt__cuda_exec x;     /* first member: a zt_model * is an enc_cuda * */
    zt__enc_arch a;
    int Kp;              /* the decoder's or the classifier's rows on the device */

    bool *keep_sum;      /* [L] a checkpointed layer keeps res2 and its statistics; see above */
    kept_norm *kept;     /* [L] */

    /* Carved from the pool. */
    zt__enc_acts *layers, shared; /* [L]; what checkpointed layers share */
    void *outbuf[2];     /* the outputs of layers that keep their sum, alternately */
    zt__enc_ends e;
    zt__enc_work work;
    int32_t *d_tokens, *d_types, *d_targets, *d_lens;
    void *attn_scratch, *emb_scratch, *ln_scratch;
    size_t attn_scratch_bytes;

    /* Staging: cs.h_io's slots hold tokens, types, targets [N] each and lens [B]; cs.h_losses
     * [max_micro * rows]. */
    int32_t *h_targets;  /* [max_micro * rows] the counted targets, for the accuracy */
    const int32_t *next_types;
} enc_cuda;

static const zt_model_ops cuda_ops;

static bool layer_ckpt(const enc_cuda *g, int l)
{
    return g->x.lay.block_ckpt[1 + l];
}

static size_t head_rows(const enc_cuda *g, int B, int T)
{
    return (size_t)zt__enc_rows(&g->a, B, T);
}

/* The device layout of the host table: the word embeddings and the decoder bias padded to Kp, the classifier
 * to Kp labels, key and value packed after query. */
static void build_layout(enc_cuda *g, const zt__enc_model *m, const bool *ckpt_layers)
{
    const zt__enc_arch *a = &g->a;
    const size_t C = (size_t)a->C, Vp = zt__round_up((size_t)a->V, ZT__CUDA_VOCAB_PAD);
    zt__cuda_layout_init(&g->x.lay, m->tensors, m->ntensors, m->nblocks);
    g->x.lay.tlen[a->emb[ZT__ENC_E_WORD]] = Vp * C;
    if (a->head == ZT__ENC_HEAD_MLM) {
        g->x.lay.tlen[a->head_t[ZT__ENC_H_BIAS]] = (size_t)g->Kp;
    } else {
        g->x.lay.tlen[a->head_t[ZT__ENC_H_OUT_W]] = (size_t)g->Kp * C;
        g->x.lay.tlen[a->head_t[ZT__ENC_H_OUT_B]] = (size_t)g->Kp;
    }
    for (int l = 0; l < a->L; l++)
        for (int k = 0; k < a->per_layer; k++)
            g->x.lay.packed[a->layer0 + l * a->per_layer + k] = a->packed[k];
    /* the embeddings' backward reads their LayerNorm's weights */
    zt__cuda_layout_finish(&g->x.lay, m->tensors, a->L, ckpt_layers, true);
}

/* Hands out pool memory, every piece 256-byte aligned. */
static void *take(char *base, size_t *used, size_t bytes)
{
    return zt__dec_take(base, used, bytes, ZT__CUDA_POOL_ALIGN);
}

/* Carves every device buffer from base; returns the bytes used (base NULL: only counts). plan, when not
 * NULL, receives the bytes of activations and of scratch. */
static size_t carve(zt__cuda_exec *x, char *base, size_t plan[2])
{
    enc_cuda *g = (enc_cuda *)x;
    const zt__enc_arch *a = &g->a;
    const size_t B = (size_t)g->x.max_B, N = B * g->x.max_T, C = (size_t)a->C, e = g->x.esize, al = ZT__CUDA_POOL_ALIGN;
    const size_t rows = head_rows(g, g->x.max_B, g->x.max_T);
    size_t used = 0;
    zt__enc_carve_ends(a, B, N, g->Kp, e, al, base, &used, &g->e);
    bool any_sum = false, any_out = false; /* checkpointed layers that keep their sum; that keep their output */
    for (int l = 0; l < a->L; l++) {
        any_sum |= g->keep_sum[l];
        any_out |= layer_ckpt(g, l) && !g->keep_sum[l];
    }
    if (any_sum || any_out) {
        /* what checkpointed layers share: all but the sum of those that keep it, and the outputs */
        zt__enc_carve_acts(a, N, e, al, base, &used, &g->shared, true, any_out, false);
        if (any_sum) {
            g->outbuf[0] = take(base, &used, N * C * e);
            g->outbuf[1] = take(base, &used, N * C * e);
        }
    }
    for (int l = 0; l < a->L; l++) {
        zt__enc_acts *s = &g->layers[l];
        if (!layer_ckpt(g, l)) {
            zt__enc_carve_acts(a, N, e, al, base, &used, s, true, true, true);
            continue;
        }
        *s = g->shared;
        zt__enc_carve_acts(a, N, e, al, base, &used, s, false, g->keep_sum[l], !g->keep_sum[l]);
        if (g->keep_sum[l]) {
            g->kept[l].w = take(base, &used, C * e);
            g->kept[l].b = take(base, &used, C * e);
            s->out = g->outbuf[l & 1];
        }
    }
    g->x.losses = take(base, &used, rows * 4);
    zt__enc_carve_work(a, N, e, al, base, &used, &g->work);
    if (plan)
        plan[0] = used;
    const size_t mark = used;
    const zt_attention_dims d = {.B = g->x.max_B, .T = g->x.max_T, .NH = a->NH, .NKV = a->NH, .HS = a->C / a->NH,
                                 .causal = false};
    g->d_tokens = take(base, &used, N * 4);
    g->d_types = take(base, &used, N * 4);
    g->d_targets = take(base, &used, rows * 4);
    g->d_lens = take(base, &used, B * 4);
    g->attn_scratch_bytes = zt_cuda_attention_backward_gqa_scratch_size(&d);
    g->attn_scratch = take(base, &used, g->attn_scratch_bytes);
    g->emb_scratch =
        take(base, &used, zt_cuda_embedding_backward_typed_scratch_size(g->x.max_B, g->x.max_T, a->C, a->V, a->types));
    g->ln_scratch = take(base, &used, zt_cuda_layernorm_backward_scratch_size((int)N, a->C));
    g->x.d_flag = take(base, &used, 4);
    if (plan)
        plan[1] = used - mark;
    return used;
}

static enc_cuda *new_shape(const zt__enc_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                           const bool *ckpt_layers)
{
    enc_cuda *g = zt_xcalloc(1, sizeof *g);
    zt__cuda_exec_init(&g->x, &cuda_ops, dtype, B, T, max_micro);
    g->a = *m->arch;
    g->Kp = (int)zt__round_up((size_t)g->a.K, g->a.head == ZT__ENC_HEAD_MLM ? ZT__CUDA_VOCAB_PAD : LABEL_PAD);
    const size_t nl = (size_t)(g->a.L > 0 ? g->a.L : 1);
    g->layers = zt_xcalloc(nl, sizeof *g->layers);
    g->keep_sum = zt_xcalloc(nl, sizeof *g->keep_sum);
    g->kept = zt_xcalloc(nl, sizeof *g->kept);
    build_layout(g, m, ckpt_layers);
    for (int l = 0; l < g->a.L; l++)
        g->keep_sum[l] = layer_ckpt(g, l) && (l == g->a.L - 1 || layer_ckpt(g, l + 1));
    zt__cuda_layout_describe(&g->x.base, &g->x.lay, dtype, g->a.head_block, m->num_params, B, T, max_micro);
    return g;
}

/* Checks that the kernels serve the model's shape; returns 0 or ZT_EUNSUPPORTED with the fix. */
static int check_shape(const zt__enc_arch *a, int max_micro, enum zt_dtype dtype, zt_err *err)
{
    const int C = a->C, NH = a->NH;
    const zt_attention_dims d = {.B = 1, .T = 1, .NH = NH, .NKV = NH, .HS = C / NH, .causal = false};
    char heads[64];
    snprintf(heads, sizeof heads, "this model has %d / %d = %d", C, NH, C / NH);
    int rc = zt__cuda_check_model(dtype, &d, heads, "hidden_size / num_attention_heads", max_micro, err);
    if (rc < 0)
        return rc;
    if (C % 8 != 0 || C > 6144 || a->F % 8 != 0)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need hidden_size to be a multiple of 8 up to 6144 and intermediate_size a "
                       "multiple of 8 (they are %d and %d); choose sizes that are, or train with --device cpu (which "
                       "takes any size)",
                       C, a->F);
    if (a->types > ZT_CUDA_EMBEDDING_MAX_TYPES)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA embedding serves at most %d token types (type_vocab_size is "
                       "%d); train with --device cpu", ZT_CUDA_EMBEDDING_MAX_TYPES, a->types);
    return 0;
}

static void cuda_destroy(zt_model *base)
{
    enc_cuda *g = (enc_cuda *)base;
    if (!g)
        return;
    zt__cuda_exec_close(&g->x);
    free(g->h_targets);
    free(g->layers);
    free(g->keep_sum);
    free(g->kept);
    free(g);
}

/* ---- the model interface ---- */

/* Block b's tensors in its buffer bp by role (n roles, idx[k] their tensors or -1). */
static void block_tensors(const enc_cuda *g, const void *bp, int b, const int *idx, int n, void **t)
{
    for (int k = 0; k < n; k++)
        t[k] = idx[k] < 0 ? NULL : zt__cuda_exec_in_block(&g->x, bp, b, idx[k]);
}

static void layer_tensors(const enc_cuda *g, int l, const void *bp, void **t)
{
    int idx[ZT__ENC_ROLES];
    for (int k = 0; k < ZT__ENC_ROLES; k++)
        idx[k] = g->a.layer0 + l * g->a.per_layer + g->a.role[k];
    block_tensors(g, bp, 1 + l, idx, ZT__ENC_ROLES, t);
}

/* The output layer's weight and bias (by head role) in the head block's buffer hp; the other roles NULL. */
static void output_tensors(const enc_cuda *g, const void *hp, void **t)
{
    for (int k = 0; k < ZT__ENC_H_ROLES; k++)
        t[k] = NULL;
    block_tensors(g, hp, g->a.head_block, g->a.head_t + ZT__ENC_H_OUT_W, ZT__ENC_H_ROLES - ZT__ENC_H_OUT_W,
                  t + ZT__ENC_H_OUT_W);
}

static void *layer_input(const enc_cuda *g, int l)
{
    return l > 0 ? g->layers[l - 1].out : g->e.enc;
}

/* Stages tokens, token types, the counted targets and each sequence's length before its trailing padding
 * through pinned slot `slot`, and copies them to the device. Returns the number of counted targets. */
static int stage_batch(enc_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T, int slot,
                       int micro)
{
    const size_t N = (size_t)B * T, rows = head_rows(g, B, T);
    int32_t *tok = g->x.cs.h_io[slot], *typ = tok + N, *tgt = typ + N, *lens = tgt + N;
    ZT_CUDA_CHECK(cudaEventSynchronize(g->x.cs.io_done[slot])); /* the slot's previous copy has been made */
    zt__enc_stage(&g->a, tokens, g->next_types, B, T, tok, typ, lens);
    g->next_types = NULL;
    const int valid = zt__enc_targets(&g->a, tok, targets, B, T, tgt);
    memcpy(g->h_targets + (size_t)micro * rows, tgt, rows * sizeof(int32_t));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_tokens, tok, N * 4, cudaMemcpyHostToDevice, g->x.cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_types, typ, N * 4, cudaMemcpyHostToDevice, g->x.cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_targets, tgt, rows * 4, cudaMemcpyHostToDevice, g->x.cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_lens, lens, (size_t)B * 4, cudaMemcpyHostToDevice, g->x.cs.stream));
    ZT_CUDA_CHECK(cudaEventRecord(g->x.cs.io_done[slot], g->x.cs.stream));
    return valid;
}

static void cuda_set_token_types(zt_model *base, const int32_t *types)
{
    ((enc_cuda *)base)->next_types = types;
}

static void cuda_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro,
                       const zt_model_docs *docs)
{
    enc_cuda *g = (enc_cuda *)base;
    ZT_ASSERT(docs == NULL); /* an encoder does not pack documents (the config refuses --sft-pack for it) */
    zt__cuda_exec_begin(&g->x, B, T, micro, head_rows(g, B, T));
    g->x.n_valid[micro] = stage_batch(g, tokens, targets, B, T, micro & 1, micro);
}

/* Layer l's forward. A rebuild first recomputes its input from the sum the layer below kept (the same
 * LayerNorm: the same bits), and stops at its own kept sum. */
static void forward_layer(enc_cuda *g, int l, const void *w, enum zt__cuda_pass pass)
{
    const int N = g->x.cur_B * g->x.cur_T;
    const bool rebuild = pass == ZT__CUDA_PASS_REBUILD;
    if (rebuild && l > 0 && g->keep_sum[l - 1])
        zt__enc_layer_output(&g->x.ops, &g->a, &g->layers[l - 1], g->kept[l - 1].w, g->kept[l - 1].b, N);
    zt__enc_w lw;
    layer_tensors(g, l, w, (void **)lw.t);
    zt__enc_layer_forward(&g->x.ops, &g->a, &lw, layer_input(g, l), &g->layers[l], g->d_lens, g->x.cur_B, g->x.cur_T,
                          rebuild && g->keep_sum[l]);
    if (pass == ZT__CUDA_PASS_FIRST && g->keep_sum[l]) {
        g->x.ops.copy(&g->x.ops, g->kept[l].w, lw.t[ZT__ENC_LN2_W], (size_t)g->a.C);
        g->x.ops.copy(&g->x.ops, g->kept[l].b, lw.t[ZT__ENC_LN2_B], (size_t)g->a.C);
    }
}

static void cuda_forward(zt_model *base, int b, const void *w)
{
    enc_cuda *g = (enc_cuda *)base;
    const zt__enc_arch *a = &g->a;
    zt__enc_w bw;
    if (b == 0) {
        block_tensors(g, w, 0, a->emb, ZT__ENC_E_ROLES, (void **)bw.t);
        zt__enc_embed_forward(&g->x.ops, a, &g->e, &bw, g->d_tokens, g->d_types, g->x.cur_B, g->x.cur_T);
    } else if (b <= a->L) {
        const enum zt__cuda_pass pass = zt__cuda_pass_of(&g->x.lay, b);
        if (pass != ZT__CUDA_PASS_KEPT)
            forward_layer(g, b - 1, w, pass);
    } else {
        block_tensors(g, w, b, a->head_t, ZT__ENC_H_OUT_W, (void **)bw.t);
        zt__enc_head_forward(&g->x.ops, a, &g->e, &bw, layer_input(g, a->L), g->x.cur_B, g->x.cur_T, g->Kp);
    }
}

/* The head's output layer and the fused classifier loss, which in training (scale != 0) replaces the logits
 * with their gradient. */
static void cuda_head(zt_model *base, const void *w, float scale)
{
    enc_cuda *g = (enc_cuda *)base;
    zt__enc_w ow;
    output_tensors(g, w, (void **)ow.t);
    zt__enc_logits(&g->x.ops, &g->a, &g->e, &ow, g->x.cur_B, g->x.cur_T, g->Kp);
    zt__cuda_exec_head_loss(&g->x, g->e.logits, g->d_targets, g->a.K, g->Kp, scale);
}

static void cuda_head_backward(zt_model *base, const void *w, void *gr)
{
    enc_cuda *g = (enc_cuda *)base;
    zt__enc_w ow;
    zt__enc_g og;
    output_tensors(g, w, (void **)ow.t);
    output_tensors(g, gr, og.t);
    zt__enc_logits_backward(&g->x.ops, &g->a, &g->e, &ow, &og, &g->work, g->x.cur_B, g->x.cur_T, g->Kp);
}

static void cuda_backward(zt_model *base, int b, const void *w, void *gr)
{
    enc_cuda *g = (enc_cuda *)base;
    const zt__enc_arch *a = &g->a;
    ZT_ASSERT(zt__cuda_pass_backward_ready(&g->x.lay, b)); /* a checkpointed block was rebuilt first */
    if (g->x.n_valid[g->x.micro] == 0)
        return; /* nothing counted: no gradient (as on the CPU) */
    const int B = g->x.cur_B, T = g->x.cur_T;
    zt__enc_w bw;
    zt__enc_g bg;
    if (b == 0) {
        block_tensors(g, w, 0, a->emb, ZT__ENC_E_ROLES, (void **)bw.t);
        block_tensors(g, gr, 0, a->emb, ZT__ENC_E_ROLES, bg.t);
        zt__enc_embed_backward(&g->x.ops, a, &g->e, &bw, &bg, &g->work, g->d_tokens, g->d_types, B, T);
    } else if (b <= a->L) {
        layer_tensors(g, b - 1, w, (void **)bw.t);
        layer_tensors(g, b - 1, gr, bg.t);
        zt__enc_layer_backward(&g->x.ops, a, &bw, &bg, layer_input(g, b - 1), &g->layers[b - 1], &g->work, g->d_lens,
                               B, T);
    } else {
        block_tensors(g, w, b, a->head_t, ZT__ENC_H_OUT_W, (void **)bw.t);
        block_tensors(g, gr, b, a->head_t, ZT__ENC_H_OUT_W, bg.t);
        zt__enc_head_backward(&g->x.ops, a, &g->e, &bw, &bg, layer_input(g, a->L), &g->work, B, T, g->Kp);
    }
}

/* The logits of the last head [rows, K] as fp32. */
static void cuda_logits(zt_model *base, float *out)
{
    enc_cuda *g = (enc_cuda *)base;
    zt__cuda_rows_to_f32(out, g->e.logits, g->x.rows, (size_t)g->a.K, (size_t)g->Kp, g->x.dtype, g->x.cs.stream);
}

/* The argmax of each counted row against its target, from the logits of the evaluation head. */
static void cuda_accuracy(zt_model *base, int micro, int *correct, int *counted)
{
    enc_cuda *g = (enc_cuda *)base;
    ZT_ASSERT(micro == g->x.micro);
    const size_t rows = g->x.rows, K = (size_t)g->a.K;
    const int32_t *tgt = g->h_targets + (size_t)micro * rows;
    float *x = zt_xcalloc(rows * K, sizeof(float));
    cuda_logits(base, x);
    *counted = 0;
    for (size_t r = 0; r < rows; r++)
        *counted += tgt[r] != -1;
    *correct = zt__enc_correct(x, tgt, rows, K);
    free(x);
}

/* The encoder's entries, and those every executor has alike (cuda_exec.h). */
static const zt_model_ops cuda_ops = {
    .destroy = cuda_destroy, .begin = cuda_begin, .forward = cuda_forward, .head = cuda_head,
    .head_backward = cuda_head_backward, .backward = cuda_backward, .set_token_types = cuda_set_token_types,
    .accuracy = cuda_accuracy, .logits = cuda_logits,
    .discard = zt__cuda_exec_discard, .loss = zt__cuda_exec_loss, .set_profiling = zt__cuda_exec_set_profiling,
    .profile_report = zt__cuda_exec_profile_report,
};

/* ---- the entry points (encoder.h) ---- */

int zt__enc_cuda_create(zt_model **out, const zt__enc_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    enc_cuda *g = new_shape(m, B, T, max_micro, dtype, ckpt_layers);
    /* staging slots of tokens, types and targets [N] and lengths [B]; the losses of every micro-batch */
    const size_t N = (size_t)B * T, rows = head_rows(g, B, T);
    int rc = check_shape(&g->a, max_micro, dtype, err);
    if (rc == 0)
        rc = zt__cuda_exec_open(&g->x, carve, 3 * N + (size_t)B, (size_t)max_micro * rows, err);
    if (rc < 0) {
        cuda_destroy(&g->x.base);
        return rc;
    }
    g->h_targets = zt_xcalloc((size_t)max_micro * rows, sizeof(int32_t));
    const zt__ops_cuda_res res = {.norm_scratch = g->ln_scratch, .attn_scratch = g->attn_scratch,
                                  .emb_scratch = g->emb_scratch, .attn_scratch_bytes = g->attn_scratch_bytes};
    zt__cuda_exec_bind(&g->x, res);
    *out = &g->x.base;
    return 0;
}

/* The layout alone, for planning (encoder.h). */
zt_model *zt__enc_cuda_shape(const zt__enc_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers)
{
    return zt__cuda_exec_shape(&new_shape(m, B, T, max_micro, dtype, ckpt_layers)->x, carve);
}
