/* The decoder program on one CUDA GPU (decoder.h): the device layout of a host model's tensor table, the
 * activations carved from one pool, and the engine's model interface (worker/models/model.h) over the
 * layer program with the CUDA binding (ops_cuda.c). Every decoder family (GPT-2, LLaMA, Mistral, Qwen2)
 * trains through this one executor.
 *
 * Device layout: the host slab's tensors in order, each on a 64-element boundary unless the architecture
 * packs it after the one before it; the token embedding and an untied head padded to a vocabulary that is a
 * multiple of 128 rows (zero weights, gradients never read). Checkpointed layers share one set of
 * activations and keep only their output; a checkpointed layer's rebuild stops before the down projection,
 * and the highest checkpointed layer is not rebuilt at all (nothing overwrote its activations). Nothing is
 * allocated inside a step. */
#include "worker/models/decoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK */
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/rmsnorm.h"
#include "worker/models/cpu_exec.h"  /* the mean loss */
#include "worker/models/cuda_exec.h" /* the layout, pool, stream and staging executors share */
#include "worker/models/model.h"
#include "worker/models/ops_cuda.h"

typedef struct dec_cuda {
    zt__cuda_exec x;          /* first member: a zt_model * is a dec_cuda * */
    zt__dec_arch a;
    zt__dec_model m;          /* tables borrowed from the host model */
    int Vp;

    /* Carved from the pool. */
    zt__dec_acts *layers;     /* [L] */
    zt__dec_acts shared;      /* what checkpointed layers share (all but out) */
    void *encoded, *lnf, *logits, *pad_row;
    float *lnf_mean, *lnf_rstd, *inv_freq;
    zt__dec_work work;
    int32_t *d_tokens, *d_targets;
    int32_t *d_pos, *d_cu;    /* [N], [2N] packed documents' positions and attention offsets */
    void *attn_scratch, *emb_scratch, *norm_scratch;
    size_t attn_scratch_bytes;

    /* Packed documents (host): the plan of the micro-batch begun last, and two pinned slots of 3N int32 that
     * stage its positions and offsets. */
    zt__dec_group *groups;    /* [N] */
    int32_t *h_docs[2];
    cudaEvent_t docs_done[2];
    zt__dec_docs docs;
    bool packed;
} dec_cuda;

static const zt_model_ops cuda_ops;

/* Hands out pool memory, every piece 256-byte aligned. */
static void *take(char *base, size_t *used, size_t bytes)
{
    return zt__dec_take(base, used, bytes, ZT__CUDA_POOL_ALIGN);
}

/* Rows of the learned position table (0 without one). */
static int wpe_rows(const dec_cuda *g)
{
    return g->a.wpe ? (int)(g->m.tensors[1].numel / (size_t)g->a.C) : 0;
}

/* Carves every device buffer from base; returns the bytes used (with base NULL only counts). plan, when not
 * NULL, receives the bytes of activations and of scratch. */
static size_t carve(zt__cuda_exec *x, char *base, size_t plan[2])
{
    dec_cuda *g = (dec_cuda *)x;
    const zt__dec_arch *a = &g->a;
    const size_t N = (size_t)g->x.max_B * g->x.max_T, C = (size_t)a->C, e = g->x.esize, al = ZT__CUDA_POOL_ALIGN;
    size_t used = 0;
    g->encoded = take(base, &used, N * C * e);
    if (zt__cuda_layout_any_checkpointed(&g->x.lay))
        zt__dec_carve_acts(a, N, e, al, base, &used, &g->shared, false);
    for (int l = 0; l < a->L; l++) {
        const bool ckpt = g->x.lay.block_ckpt[1 + l];
        if (ckpt)
            g->layers[l] = g->shared;
        zt__dec_carve_acts(a, N, e, al, base, &used, &g->layers[l], ckpt);
    }
    g->lnf = take(base, &used, N * C * e);
    g->lnf_mean = take(base, &used, N * 4);
    g->lnf_rstd = take(base, &used, N * 4);
    g->logits = take(base, &used, N * (size_t)g->Vp * e);
    g->x.losses = take(base, &used, N * 4);
    zt__dec_carve_work(a, N, e, al, base, &used, &g->work);
    if (plan)
        plan[0] = used;
    const size_t mark = used;
    const zt_attention_dims d = {.B = g->x.max_B, .T = g->x.max_T, .NH = a->NH, .NKV = a->NKV, .HS = a->HS,
                                 .causal = true};
    const size_t norm_scratch = a->norm == ZT__DEC_LAYERNORM ? zt_cuda_layernorm_backward_scratch_size((int)N, a->C)
                                                             : zt_cuda_rmsnorm_backward_scratch_size((int)N, a->C);
    g->d_tokens = take(base, &used, N * 4);
    g->d_targets = take(base, &used, N * 4);
    g->inv_freq = a->rope ? take(base, &used, (size_t)a->rot / 2 * 4) : NULL;
    g->pad_row = a->pad_token_id >= 0 ? take(base, &used, C * e) : NULL;
    g->d_pos = take(base, &used, N * 4);
    g->d_cu = take(base, &used, 2 * N * 4);
    /* packed documents: a varlen call's backward needs B*NH*Tq floats, at most ZT__DEC_LSE_ROWS * N * NH */
    const size_t attn_fixed = zt_cuda_attention_backward_gqa_scratch_size(&d);
    const size_t attn_varlen = ZT__DEC_LSE_ROWS * N * (size_t)a->NH * sizeof(float);
    g->attn_scratch_bytes = attn_fixed > attn_varlen ? attn_fixed : attn_varlen;
    g->attn_scratch = take(base, &used, g->attn_scratch_bytes);
    /* the embedding's backward also sorts positions into wpe's rows (packed documents) */
    const size_t emb_tokens = zt_cuda_embedding_backward_scratch_size(g->x.max_B, g->x.max_T, a->V);
    const size_t emb_pos = a->wpe ? zt_cuda_embedding_backward_scratch_size(g->x.max_B, g->x.max_T, wpe_rows(g)) : 0;
    g->emb_scratch = take(base, &used, emb_tokens > emb_pos ? emb_tokens : emb_pos);
    g->norm_scratch = take(base, &used, norm_scratch);
    g->x.d_flag = take(base, &used, 4);
    if (plan)
        plan[1] = used - mark;
    return used;
}

/* The device layout of the host table: the token embedding and an untied head padded to Vp rows, packed
 * tensors after the ones they continue. */
static void build_layout(dec_cuda *g, const bool *ckpt_layers)
{
    const zt__dec_arch *a = &g->a;
    zt__cuda_layout_init(&g->x.lay, g->m.tensors, g->m.ntensors, g->m.nblocks);
    g->x.lay.tlen[0] = (size_t)g->Vp * (size_t)a->C;
    g->x.lay.tlen[a->head_tensor] = (size_t)g->Vp * (size_t)a->C;
    for (int l = 0; l < a->L; l++)
        for (int k = 0; k < a->per_layer; k++)
            g->x.lay.packed[a->layer0 + l * a->per_layer + k] = a->packed[k];
    zt__cuda_layout_finish(&g->x.lay, g->m.tensors, a->L, ckpt_layers, false);
}

/* Checks that the kernels serve the model's shape; returns 0 or ZT_EUNSUPPORTED with the fix. */
static int check_shape(const zt__dec_arch *a, int max_micro, enum zt_dtype dtype, zt_err *err)
{
    const zt_attention_dims d = {.B = 1, .T = 1, .NH = a->NH, .NKV = a->NKV, .HS = a->HS, .causal = true};
    char heads[64];
    snprintf(heads, sizeof heads, "this model's heads have %d channels", a->HS);
    int rc = zt__cuda_check_model(dtype, &d, heads, "a hidden size and head count", max_micro, err);
    if (rc < 0)
        return rc;
    if (a->C % 8 != 0 || a->F % 8 != 0)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need the hidden size and the MLP's width to be multiples of 8 (they are %d "
                       "and %d); choose sizes that are, or train with --device cpu (which takes any size)",
                       a->C, a->F);
    if (a->norm == ZT__DEC_LAYERNORM && a->C > 6144)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA LayerNorm kernels serve hidden sizes up to 6144 (this model has %d); train with "
                       "--device cpu", a->C);
    return 0;
}

static dec_cuda *new_shape(const zt__dec_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                           const bool *ckpt_layers)
{
    dec_cuda *g = zt_xcalloc(1, sizeof *g);
    g->a = *m->arch;
    g->m = *m;
    g->m.arch = &g->a;
    zt__cuda_exec_init(&g->x, &cuda_ops, dtype, B, T, max_micro);
    g->Vp = (int)zt__round_up((size_t)g->a.V, ZT__CUDA_VOCAB_PAD);
    g->layers = zt_xcalloc((size_t)(g->a.L > 0 ? g->a.L : 1), sizeof *g->layers);
    build_layout(g, ckpt_layers);
    zt__cuda_layout_describe(&g->x.base, &g->x.lay, dtype, m->head_block, m->num_params, B, T, max_micro);
    return g;
}

static void cuda_destroy(zt_model *base)
{
    dec_cuda *g = (dec_cuda *)base;
    if (!g)
        return;
    if (g->x.cs.stream)
        ZT_CUDA_CHECK(cudaStreamSynchronize(g->x.cs.stream));
    for (int i = 0; i < 2; i++) {
        if (g->docs_done[i])
            cudaEventDestroy(g->docs_done[i]);
        zt_cuda_host_free(g->h_docs[i]);
    }
    free(g->groups);
    zt__cuda_exec_close(&g->x);
    free(g->layers);
    free(g);
}

zt_model *zt__dec_cuda_shape(const zt__dec_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers)
{
    return zt__cuda_exec_shape(&new_shape(m, B, T, max_micro, dtype, ckpt_layers)->x, carve);
}

int zt__dec_cuda_create(zt_model **out, const zt__dec_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    int rc = check_shape(m->arch, max_micro, dtype, err);
    if (rc < 0)
        return rc;
    dec_cuda *g = new_shape(m, B, T, max_micro, dtype, ckpt_layers);
    const size_t N = (size_t)B * T;
    if ((rc = zt__cuda_exec_open(&g->x, carve, 2 * N, (size_t)max_micro * N, err)) < 0) {
        cuda_destroy(&g->x.base);
        return rc;
    }
    if (g->a.rope)
        ZT_CUDA_CHECK(cudaMemcpy(g->inv_freq, m->inv_freq, (size_t)g->a.rot / 2 * sizeof(float),
                                 cudaMemcpyHostToDevice));
    g->groups = zt_xmalloc(N * sizeof *g->groups);
    for (int i = 0; i < 2; i++) {
        g->h_docs[i] = zt_cuda_host_alloc(3 * N * sizeof(int32_t));
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&g->docs_done[i], cudaEventDisableTiming));
    }
    const zt__ops_cuda_res res = {.norm_scratch = g->norm_scratch, .attn_scratch = g->attn_scratch,
                                  .emb_scratch = g->emb_scratch, .attn_scratch_bytes = g->attn_scratch_bytes};
    zt__cuda_exec_bind(&g->x, res);
    *out = &g->x.base;
    return 0;
}

/* ---- the model interface ---- */

static void *in_block(const dec_cuda *g, const void *block_base, int b, int idx)
{
    return zt__cuda_exec_in_block(&g->x, block_base, b, idx);
}

/* Layer l's tensor of role k in block 1+l's buffer bp (weights or gradients), or NULL. */
static void *layer_tensor(const dec_cuda *g, int l, const void *bp, int k)
{
    return g->a.role[k] < 0 ? NULL : in_block(g, bp, 1 + l, g->a.layer0 + l * g->a.per_layer + g->a.role[k]);
}

static void *layer_input(dec_cuda *g, int l)
{
    return l > 0 ? g->layers[l - 1].out : g->encoded;
}

/* Plans the attention calls of packed documents on the host and stages their positions and offsets through
 * pinned slot `slot` into d_pos and d_cu. */
static void stage_docs(dec_cuda *g, int slot, const int32_t *pos, int B, int T)
{
    const size_t N = (size_t)B * T;
    int32_t *h = g->h_docs[slot];
    ZT_CUDA_CHECK(cudaEventSynchronize(g->docs_done[slot])); /* the slot's previous copy has been made */
    memcpy(h, pos, N * sizeof(int32_t));
    const int ngroups = zt__dec_docs_plan(h, B, T, g->groups, h + N);
    ZT_ASSERT(ngroups > 0); /* positions restart at 0 at each row and document, and count up by 1 */
    const zt__dec_group *last = &g->groups[ngroups - 1];
    const size_t ncu = (size_t)last->cu_off + (size_t)last->nseq + 1;
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_pos, h, N * sizeof(int32_t), cudaMemcpyHostToDevice, g->x.cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_cu, h + N, ncu * sizeof(int32_t), cudaMemcpyHostToDevice, g->x.cs.stream));
    ZT_CUDA_CHECK(cudaEventRecord(g->docs_done[slot], g->x.cs.stream));
    g->docs = (zt__dec_docs){.pos = g->d_pos, .cu = g->d_cu, .groups = g->groups, .ngroups = ngroups};
}

/* The documents of the micro-batch begun last, or NULL (one a row). */
static const zt__dec_docs *docs_of(const dec_cuda *g)
{
    return g->packed ? &g->docs : NULL;
}

static void cuda_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro,
                       const zt_model_docs *docs)
{
    dec_cuda *g = (dec_cuda *)base;
    zt__cuda_exec_begin(&g->x, B, T, micro, (size_t)B * T);
    g->x.n_valid[micro] =
        zt__cuda_stage_lm(&g->x.cs, micro & 1, tokens, targets, B, T, g->a.V, g->d_tokens, g->d_targets);
    g->packed = docs != NULL;
    if (docs)
        stage_docs(g, micro & 1, docs->pos, B, T);
}

static void cuda_forward(zt_model *base, int b, const void *w)
{
    dec_cuda *g = (dec_cuda *)base;
    const zt__dec_arch *a = &g->a;
    const int B = g->x.cur_B, T = g->x.cur_T;
    if (b == 0) {
        zt__dec_embedding_forward(&g->x.ops, a, g->encoded, g->d_tokens, in_block(g, w, 0, 0),
                                  a->wpe ? in_block(g, w, 0, 1) : NULL, g->work.dln, B, T, docs_of(g));
    } else if (b <= a->L) {
        const enum zt__cuda_pass pass = zt__cuda_pass_of(&g->x.lay, b);
        if (pass == ZT__CUDA_PASS_KEPT)
            return;
        zt__dec_w lw;
        for (int k = 0; k < ZT__DEC_ROLES; k++)
            lw.t[k] = layer_tensor(g, b - 1, w, k);
        zt__dec_layer_forward(&g->x.ops, a, &lw, layer_input(g, b - 1), &g->layers[b - 1], g->inv_freq, B, T,
                              pass == ZT__CUDA_PASS_REBUILD, docs_of(g));
    } else {
        zt__dec_final_forward(&g->x.ops, a, g->lnf, g->lnf_mean, g->lnf_rstd, layer_input(g, a->L),
                              in_block(g, w, b, a->final_w), a->final_b >= 0 ? in_block(g, w, b, a->final_b) : NULL,
                              B * T);
    }
}

/* The head (logits = final norm output @ W^T, W the token embedding or lm_head, over Vp padded rows) and the
 * fused classifier, which writes the losses and, in training (scale != 0), turns the logits into their
 * gradient. */
static void cuda_head(zt_model *base, const void *w, float scale)
{
    dec_cuda *g = (dec_cuda *)base;
    const zt_ops *o = &g->x.ops;
    o->linear(o, g->logits, g->lnf, in_block(g, w, base->head_block, g->a.head_tensor), NULL,
              g->x.cur_B * g->x.cur_T, g->a.C, g->Vp);
    zt__cuda_exec_head_loss(&g->x, g->logits, g->d_targets, g->a.V, g->Vp, scale);
}

/* The head's backward: its weight's gradient into the head block's buffer, and the gradient of the final
 * norm's output in work.dln. */
static void cuda_head_backward(zt_model *base, const void *w, void *gr)
{
    dec_cuda *g = (dec_cuda *)base;
    const zt_ops *o = &g->x.ops;
    const int N = g->x.cur_B * g->x.cur_T, hb = base->head_block;
    o->linear_backward(o, g->work.dln, in_block(g, gr, hb, g->a.head_tensor), NULL, g->logits, g->lnf,
                       in_block(g, w, hb, g->a.head_tensor), N, g->a.C, g->Vp);
}

static void cuda_backward(zt_model *base, int b, const void *w, void *gr)
{
    dec_cuda *g = (dec_cuda *)base;
    const zt__dec_arch *a = &g->a;
    ZT_ASSERT(zt__cuda_pass_backward_ready(&g->x.lay, b)); /* a checkpointed block was rebuilt first */
    const int B = g->x.cur_B, T = g->x.cur_T;
    if (b == 0) {
        zt__dec_embedding_backward(&g->x.ops, a, in_block(g, gr, 0, 0), a->wpe ? in_block(g, gr, 0, 1) : NULL,
                                   g->work.dres, g->d_tokens, g->pad_row, B, T, docs_of(g), wpe_rows(g));
    } else if (b <= a->L) {
        zt__dec_w lw;
        zt__dec_g lg;
        for (int k = 0; k < ZT__DEC_ROLES; k++) {
            lw.t[k] = layer_tensor(g, b - 1, w, k);
            lg.t[k] = layer_tensor(g, b - 1, gr, k);
        }
        zt__dec_layer_backward(&g->x.ops, a, &lw, &lg, layer_input(g, b - 1), &g->layers[b - 1], &g->work,
                               g->inv_freq, B, T, docs_of(g));
    } else {
        zt__dec_final_backward(&g->x.ops, a, g->work.dres, in_block(g, gr, b, a->final_w),
                               a->final_b >= 0 ? in_block(g, gr, b, a->final_b) : NULL, g->work.dln,
                               layer_input(g, a->L), in_block(g, w, b, a->final_w), g->lnf_mean, g->lnf_rstd, B * T);
    }
}

/* The logits of the last head (called with scale 0) as fp32 [B,T,V]. */
static void cuda_logits(zt_model *base, float *out)
{
    dec_cuda *g = (dec_cuda *)base;
    const size_t N = (size_t)g->x.cur_B * g->x.cur_T;
    zt__cuda_rows_to_f32(out, g->logits, N, (size_t)g->a.V, (size_t)g->Vp, g->x.dtype, g->x.cs.stream);
}

static const zt_model_ops cuda_ops = {
    .destroy = cuda_destroy,
    .begin = cuda_begin,
    .forward = cuda_forward,
    .discard = zt__cuda_exec_discard,
    .head = cuda_head,
    .head_backward = cuda_head_backward,
    .backward = cuda_backward,
    .loss = zt__cuda_exec_loss,
    .logits = cuda_logits,
    .set_profiling = zt__cuda_exec_set_profiling,
    .profile_report = zt__cuda_exec_profile_report,
};
