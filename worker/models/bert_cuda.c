/* BERT and RoBERTa on one CUDA GPU (see bert_cuda.h): device layout, activation pool, and the block-wise
 * forward and backward passes over the CUDA kernels behind the engine's model interface. The passes follow
 * zt_bert_forward_block / zt_bert_backward_block (worker/models/bert.c) call for call, except that the
 * residual additions ride in the projections' GEMM epilogues (and the tanh GELU in the intermediate one). */
#include "worker/models/bert_cuda.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pooler.h"
#include "kernels/residual.h"
#include "worker/models/cpu_exec.h" /* the mean loss */
#include "worker/models/cuda_exec.h"

#define LABEL_PAD 8 /* classifier rows: the labels rounded up to this */

typedef struct layer_acts {
    void *qkv, *atty, *res1, *ln1, *inter, *inter_act, *res2, *out; /* dtype */
    float *lse, *ln1_mean, *ln1_rstd, *out_mean, *out_rstd;
    void *oln_w, *oln_b; /* keep_sum layers: the output LayerNorm's weight and bias [C], copied at the forward */
} layer_acts;

typedef struct bert_cuda {
    zt_model base; /* first member: a zt_model * is a bert_cuda * */
    const zt_bert *host;
    zt_bert_config cfg;
    enum zt_dtype dtype;
    size_t esize;
    bool mlm;          /* the masked-LM head (else classification) */
    int L, Vp, K, Kp;  /* layers, padded vocabulary, outputs per scored row and their padded count */
    size_t row0;       /* the position table's row of position 0 (RoBERTa: pad_token_id + 1) */
    int max_B, max_T, max_micro;
    zt__cuda_layout lay;     /* the device layout and the engine's view of it */
    zt__cuda_state cs;       /* stream, cuBLASLt, pool, pinned staging */

    /* Checkpointed layers keep their output's sum before the output LayerNorm (res2, with its statistics)
     * rather than the output itself when the layer above is checkpointed too (or it is the last): the output
     * is the next layer's input, which that layer's rebuild normalises again from the kept sum, so no
     * rebuild runs the output projection. Their outputs alternate between the two shared buffers outbuf. */
    bool *keep_sum; /* [L] */

    /* Carved from the pool. */
    layer_acts *layers, shared;
    void *outbuf[2];
    void *emb, *enc;                                  /* [N,C] */
    float *emb_mean, *emb_rstd;                       /* [N] */
    void *tr_pre, *tr_act, *tr_ln, *dec_bias, *ddec_bias; /* masked LM: [N,C] x3, [Vp] x2 */
    float *tr_mean, *tr_rstd;
    void *first, *pool_pre, *pooled, *dpooled, *dpool_pre, *dfirst; /* classification: [B,C] */
    void *logits;                                     /* [rows, Kp] */
    float *losses;                                    /* [rows] */
    void *dres, *dln, *datty, *dtmp, *dqkv, *dinter, *dinter_act;
    int32_t *d_tokens, *d_types, *d_targets, *d_lens;
    void *attn_scratch, *emb_scratch, *ln_scratch;
    int *d_flag;

    /* Staging: cs.h_io's slots hold tokens, types, targets [N] each and lens [B]; cs.h_losses
     * [max_micro * rows]. */
    int32_t *h_targets;      /* [max_micro * rows] the counted targets, for the accuracy */
    const int32_t *next_types;
    int n_valid[ZT__CUDA_MAX_MICRO];
    int cur_B, cur_T, micro;
} bert_cuda;

#define ET(k) (ZT_BERT_E_##k)
#define LT(l, k) ZT_BERT_LAYER_TENSOR(l, ZT_BERT_T_##k)
#define HT(k) ZT_BERT_HEAD_TENSOR(g->L, ZT_BERT_H_##k)

/* ---- layout and creation ---- */

static bool layer_ckpt(const bert_cuda *g, int l)
{
    return g->lay.block_ckpt[1 + l];
}

/* Rows the head scores: every position (masked LM) or every sequence (classification). */
static size_t head_rows(const bert_cuda *g, size_t B, size_t T)
{
    return g->mlm ? B * T : B;
}

/* Whether tensor i continues the packed weight or bias of the tensor before it (key and value after query). */
static bool packed(const bert_cuda *g, int i)
{
    if (i < ZT_BERT_E_COUNT || i >= ZT_BERT_LAYER_TENSOR(g->L, 0))
        return false;
    const int k = (i - ZT_BERT_E_COUNT) % ZT_BERT_T_COUNT;
    return k == ZT_BERT_T_K_W || k == ZT_BERT_T_V_W || k == ZT_BERT_T_K_B || k == ZT_BERT_T_V_B;
}

/* Carves every device buffer from base; returns the bytes used (base NULL: only counts). plan, when not
 * NULL, receives the bytes of activations and of scratch. */
static size_t carve(bert_cuda *g, char *base, size_t plan[2])
{
    const size_t B = (size_t)g->max_B, N = B * g->max_T, C = (size_t)g->cfg.hidden_size;
    const size_t NH = (size_t)g->cfg.num_attention_heads, I = (size_t)g->cfg.intermediate_size;
    const size_t e = g->esize, NC = N * C, NI = N * I, rows = head_rows(g, B, (size_t)g->max_T);
    size_t used = 0;
    g->emb = zt__pool_take(base, &used, NC * e);
    g->emb_mean = zt__pool_take(base, &used, N * 4);
    g->emb_rstd = zt__pool_take(base, &used, N * 4);
    g->enc = zt__pool_take(base, &used, NC * e);
    bool any_sum = false, any_out = false; /* checkpointed layers that keep their sum; that keep their output */
    for (int l = 0; l < g->L; l++) {
        any_sum |= g->keep_sum[l];
        any_out |= layer_ckpt(g, l) && !g->keep_sum[l];
    }
    for (int l = -1; l < g->L; l++) {
        /* l = -1: the set that checkpointed layers share */
        if (l < 0 && !any_sum && !any_out)
            continue;
        layer_acts *a = l < 0 ? &g->shared : &g->layers[l];
        if (l >= 0 && layer_ckpt(g, l)) {
            *a = g->shared;
            if (g->keep_sum[l]) {
                a->res2 = zt__pool_take(base, &used, NC * e);
                a->out_mean = zt__pool_take(base, &used, N * 4);
                a->out_rstd = zt__pool_take(base, &used, N * 4);
                a->oln_w = zt__pool_take(base, &used, C * e);
                a->oln_b = zt__pool_take(base, &used, C * e);
                a->out = g->outbuf[l & 1];
            } else {
                a->out = zt__pool_take(base, &used, NC * e);
            }
            continue;
        }
        a->qkv = zt__pool_take(base, &used, 3 * NC * e);
        a->atty = zt__pool_take(base, &used, NC * e);
        a->lse = zt__pool_take(base, &used, N * NH * 4);
        a->res1 = zt__pool_take(base, &used, NC * e);
        a->ln1 = zt__pool_take(base, &used, NC * e);
        a->ln1_mean = zt__pool_take(base, &used, N * 4);
        a->ln1_rstd = zt__pool_take(base, &used, N * 4);
        a->inter = zt__pool_take(base, &used, NI * e);
        a->inter_act = zt__pool_take(base, &used, NI * e);
        if (l >= 0 || any_out) {
            a->res2 = zt__pool_take(base, &used, NC * e);
            a->out_mean = zt__pool_take(base, &used, N * 4);
            a->out_rstd = zt__pool_take(base, &used, N * 4);
        }
        if (l >= 0) {
            a->out = zt__pool_take(base, &used, NC * e);
        } else if (any_sum) {
            g->outbuf[0] = zt__pool_take(base, &used, NC * e);
            g->outbuf[1] = zt__pool_take(base, &used, NC * e);
        }
    }
    if (g->mlm) {
        g->tr_pre = zt__pool_take(base, &used, NC * e);
        g->tr_act = zt__pool_take(base, &used, NC * e);
        g->tr_ln = zt__pool_take(base, &used, NC * e);
        g->tr_mean = zt__pool_take(base, &used, N * 4);
        g->tr_rstd = zt__pool_take(base, &used, N * 4);
        g->dec_bias = zt__pool_take(base, &used, (size_t)g->Vp * e);
        g->ddec_bias = zt__pool_take(base, &used, (size_t)g->Vp * e);
    } else {
        const size_t BC = B * C * e;
        g->first = zt__pool_take(base, &used, BC);
        g->pool_pre = zt__pool_take(base, &used, BC);
        g->pooled = zt__pool_take(base, &used, BC);
        g->dpooled = zt__pool_take(base, &used, BC);
        g->dpool_pre = zt__pool_take(base, &used, BC);
        g->dfirst = zt__pool_take(base, &used, BC);
    }
    g->logits = zt__pool_take(base, &used, rows * (size_t)g->Kp * e);
    g->losses = zt__pool_take(base, &used, rows * 4);
    g->dres = zt__pool_take(base, &used, NC * e);
    g->dln = zt__pool_take(base, &used, NC * e);
    g->datty = zt__pool_take(base, &used, NC * e);
    g->dtmp = zt__pool_take(base, &used, NC * e);
    g->dqkv = zt__pool_take(base, &used, 3 * NC * e);
    g->dinter = zt__pool_take(base, &used, NI * e);
    g->dinter_act = zt__pool_take(base, &used, NI * e);
    if (plan)
        plan[0] = used;
    const size_t mark = used;
    const zt_attention_dims d = {.B = g->max_B, .T = g->max_T, .NH = (int)NH, .NKV = (int)NH,
                                 .HS = (int)(C / NH), .causal = false};
    g->d_tokens = zt__pool_take(base, &used, N * 4);
    g->d_types = zt__pool_take(base, &used, N * 4);
    g->d_targets = zt__pool_take(base, &used, rows * 4);
    g->d_lens = zt__pool_take(base, &used, B * 4);
    g->attn_scratch = zt__pool_take(base, &used, zt_cuda_attention_backward_gqa_scratch_size(&d));
    g->emb_scratch = zt__pool_take(base, &used, zt_cuda_embedding_backward_typed_scratch_size(
                                           g->max_B, g->max_T, (int)C, g->cfg.vocab_size, g->cfg.type_vocab_size));
    g->ln_scratch = zt__pool_take(base, &used, zt_cuda_layernorm_backward_scratch_size((int)N, (int)C));
    g->d_flag = zt__pool_take(base, &used, 4);
    if (plan)
        plan[1] = used - mark;
    return used;
}

/* The device layout of the host model's tensor table: the word embeddings and the decoder bias padded to Vp,
 * the classifier to Kp labels, key and value packed after query. */
static void build_layout(bert_cuda *g, const bool *ckpt_layers)
{
    const int nt = zt_bert_num_tensors(g->host);
    const zt_param_info *tensors = zt_bert_tensor(g->host, 0);
    const size_t C = (size_t)g->cfg.hidden_size;
    zt__cuda_layout_init(&g->lay, tensors, nt, zt_bert_num_blocks(g->host));
    g->lay.tlen[ZT_BERT_E_WORD] = (size_t)g->Vp * C;
    if (g->mlm) {
        g->lay.tlen[HT(BIAS)] = (size_t)g->Vp;
    } else {
        g->lay.tlen[HT(CLS_W)] = (size_t)g->Kp * C;
        g->lay.tlen[HT(CLS_B)] = (size_t)g->Kp;
    }
    for (int i = 0; i < nt; i++)
        g->lay.packed[i] = packed(g, i);
    /* the embeddings' backward reads their LayerNorm's weights */
    zt__cuda_layout_finish(&g->lay, tensors, g->L, ckpt_layers, true);
}

static void cuda_destroy(zt_model *m);
static const zt_model_ops cuda_ops;

/* Checks that the kernels serve the model's shape; returns 0 or ZT_EUNSUPPORTED with the fix. */
static int check_shape(const zt_bert_config *cfg, int max_micro, enum zt_dtype dtype, zt_err *err)
{
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_BF16 && dtype != ZT_DTYPE_F16)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA model computes in fp32, bf16 or fp16 only");
    const int C = cfg->hidden_size, NH = cfg->num_attention_heads;
    const zt_attention_dims d = {.B = 1, .T = 1, .NH = NH, .NKV = NH, .HS = C / NH, .causal = false};
    if (!zt_cuda_attention_gqa_supported(&d))
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA attention kernels serve head sizes 32, 64, 80, 96 and 128 (256 on GPUs with 66 KiB "
                       "of shared memory per block); this model has %d / %d = %d (choose hidden_size / "
                       "num_attention_heads among them, or train with --device cpu)",
                       C, NH, C / NH);
    if (C % 8 != 0 || C > 6144 || cfg->intermediate_size % 8 != 0)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need hidden_size to be a multiple of 8 up to 6144 and intermediate_size a "
                       "multiple of 8 (they are %d and %d); choose sizes that are, or train with --device cpu (which "
                       "takes any size)",
                       C, cfg->intermediate_size);
    if (cfg->type_vocab_size > ZT_CUDA_EMBEDDING_MAX_TYPES)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA embedding serves at most %d token types (type_vocab_size is "
                       "%d); train with --device cpu", ZT_CUDA_EMBEDDING_MAX_TYPES, cfg->type_vocab_size);
    if (max_micro < 1 || max_micro > ZT__CUDA_MAX_MICRO)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is out of range for the CUDA trainer (1..%d)",
                       max_micro, ZT__CUDA_MAX_MICRO);
    return 0;
}

static void init_shape(bert_cuda *g, const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                       const bool *ckpt_layers)
{
    const zt_bert_config *cfg = zt_bert_get_config(host);
    g->host = host;
    g->cfg = *cfg;
    g->dtype = dtype;
    g->esize = zt_dtype_size(dtype);
    g->mlm = cfg->head == ZT_BERT_HEAD_MLM;
    g->L = cfg->num_hidden_layers;
    g->Vp = (int)zt__round_up((size_t)cfg->vocab_size, ZT__CUDA_VOCAB_PAD);
    g->K = zt_bert_config_outputs(cfg);
    g->Kp = g->mlm ? g->Vp : (int)zt__round_up((size_t)g->K, LABEL_PAD);
    g->row0 = cfg->roberta ? (size_t)cfg->pad_token_id + 1 : 0;
    const size_t nl = (size_t)(g->L > 0 ? g->L : 1);
    g->max_B = B;
    g->max_T = T;
    g->max_micro = max_micro;
    g->layers = zt_xcalloc(nl, sizeof(layer_acts));
    build_layout(g, ckpt_layers);
    g->keep_sum = zt_xcalloc(nl, sizeof(bool));
    for (int l = 0; l < g->L; l++)
        g->keep_sum[l] = layer_ckpt(g, l) && (l == g->L - 1 || layer_ckpt(g, l + 1));
}

static void free_shape(bert_cuda *g)
{
    zt__cuda_layout_free(&g->lay);
    free(g->layers);
    free(g->keep_sum);
}

static void fill_base(bert_cuda *g)
{
    g->base.ops = &cuda_ops;
    zt__cuda_layout_describe(&g->base, &g->lay, g->dtype, zt_bert_head_block(g->host), zt_bert_num_params(g->host),
                             g->max_B, g->max_T, g->max_micro);
}

zt_model *zt_bert_cuda_shape(const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers)
{
    bert_cuda *g = zt_xcalloc(1, sizeof *g);
    init_shape(g, host, B, T, max_micro, dtype, ckpt_layers);
    fill_base(g);
    g->base.device_bytes = carve(g, NULL, NULL);
    return &g->base;
}

int zt_bert_cuda_create(zt_model **out, const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    int rc = check_shape(zt_bert_get_config(host), max_micro, dtype, err);
    if (rc < 0)
        return rc;
    bert_cuda *g = zt_xcalloc(1, sizeof *g);
    init_shape(g, host, B, T, max_micro, dtype, ckpt_layers);
    size_t plan[2];
    const size_t pool_bytes = carve(g, NULL, plan);
    const size_t N = (size_t)B * T, rows = head_rows(g, (size_t)B, (size_t)T);
    rc = zt__cuda_state_open(&g->cs, pool_bytes, plan, 3 * N + (size_t)B, (size_t)max_micro * rows, dtype, B, T,
                             err);
    if (rc < 0)
        goto fail;
    ZT_ASSERT(carve(g, g->cs.pool, NULL) == pool_bytes);
    g->h_targets = zt_xcalloc((size_t)max_micro * rows, sizeof(int32_t));

    fill_base(g);
    g->base.stream = g->cs.stream;
    g->base.nonfinite_flag = g->d_flag;
    g->base.device_bytes = pool_bytes;
    *out = &g->base;
    return 0;

fail:
    cuda_destroy(&g->base);
    return rc;
}

static void cuda_destroy(zt_model *m)
{
    bert_cuda *g = (bert_cuda *)m;
    if (!g)
        return;
    zt__cuda_state_close(&g->cs);
    free(g->h_targets);
    free_shape(g);
    free(g);
}

/* ---- forward and backward, block by block ---- */

static void *in_block(const bert_cuda *g, const void *block_base, int b, int idx)
{
    return zt__cuda_in_block(&g->lay, block_base, b, idx, g->esize);
}

static void zero(bert_cuda *g, void *p, size_t elems)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(p, 0, elems * g->esize, g->cs.stream));
}

static const void *layer_input(const bert_cuda *g, int l)
{
    return l > 0 ? g->layers[l - 1].out : g->enc;
}

/* The exact GELU (erf) or its tanh approximation. */
static void act_forward(const bert_cuda *g, enum zt_bert_act act, void *out, const void *inp, size_t n)
{
    if (act == ZT_BERT_ACT_GELU)
        zt_cuda_gelu_erf_forward(out, inp, n, g->dtype, g->cs.stream);
    else
        zt_cuda_gelu_forward(out, inp, n, g->dtype, g->cs.stream);
}

/* Accumulates (+=) into dinp. */
static void act_backward(const bert_cuda *g, enum zt_bert_act act, void *dinp, const void *inp, const void *dout,
                         size_t n)
{
    if (act == ZT_BERT_ACT_GELU)
        zt_cuda_gelu_erf_backward(dinp, inp, dout, n, g->dtype, g->cs.stream);
    else
        zt_cuda_gelu_backward(dinp, inp, dout, n, g->dtype, g->cs.stream);
}

/* RoBERTa's masked-LM head applies the exact GELU always. */
static enum zt_bert_act head_act(const bert_cuda *g)
{
    return g->cfg.roberta ? ZT_BERT_ACT_GELU : g->cfg.hidden_act;
}

static zt_attention_dims attention_dims(const bert_cuda *g)
{
    const int NH = g->cfg.num_attention_heads;
    return (zt_attention_dims){.B = g->cur_B, .T = g->cur_T, .NH = NH, .NKV = NH,
                               .HS = g->cfg.hidden_size / NH, .causal = false};
}

static void forward_embed(bert_cuda *g, const void *w)
{
    const int B = g->cur_B, T = g->cur_T, C = g->cfg.hidden_size;
    const char *wpe = (const char *)in_block(g, w, 0, ET(POS)) + g->row0 * (size_t)C * g->esize;
    zt_cuda_embedding_forward_typed(g->emb, g->d_tokens, g->d_types, in_block(g, w, 0, ET(WORD)), wpe,
                                    in_block(g, w, 0, ET(TYPE)), B, T, C, g->dtype, g->cs.stream);
    zt_cuda_layernorm_forward(g->enc, g->emb_mean, g->emb_rstd, g->emb, in_block(g, w, 0, ET(LN_W)),
                              in_block(g, w, 0, ET(LN_B)), B * T, C, g->cfg.layer_norm_eps, g->dtype, g->cs.stream);
}

static void forward_layer(bert_cuda *g, int l, const void *w, enum zt__cuda_pass pass)
{
    const int N = g->cur_B * g->cur_T, C = g->cfg.hidden_size, I = g->cfg.intermediate_size, b = 1 + l;
    const float eps = g->cfg.layer_norm_eps;
    const enum zt_dtype dt = g->dtype;
    const zt_attention_dims d = attention_dims(g);
    layer_acts *a = &g->layers[l];
    const void *x = layer_input(g, l);
    cudaStream_t s = g->cs.stream;
    const bool rebuild = pass == ZT__CUDA_PASS_REBUILD;
    if (rebuild && l > 0 && g->keep_sum[l - 1]) {
        /* the input, from the sum the layer below kept (its LayerNorm again: the same bits) */
        layer_acts *p = &g->layers[l - 1];
        zt_cuda_layernorm_forward(p->out, p->out_mean, p->out_rstd, p->res2, p->oln_w, p->oln_b, N, C, eps, dt, s);
    }
#define W(k) in_block(g, w, b, LT(l, k))
    zt_cuda_matmul_forward(g->cs.blas, a->qkv, NULL, x, W(Q_W), W(Q_B), N, C, 3 * C, dt, s);
    zt_cuda_attention_forward_gqa(a->atty, a->lse, a->qkv, g->d_lens, &d, dt, s);
    zt_cuda_matmul_forward_residual(g->cs.blas, a->res1, a->atty, W(AO_W), W(AO_B), x, N, C, C, dt, s);
    zt_cuda_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, a->res1, W(ALN_W), W(ALN_B), N, C, eps, dt, s);
    if (g->cfg.hidden_act == ZT_BERT_ACT_GELU_TANH) {
        zt_cuda_matmul_forward(g->cs.blas, a->inter_act, a->inter, a->ln1, W(I_W), W(I_B), N, C, I, dt, s);
    } else {
        zt_cuda_matmul_forward(g->cs.blas, a->inter, NULL, a->ln1, W(I_W), W(I_B), N, C, I, dt, s);
        act_forward(g, ZT_BERT_ACT_GELU, a->inter_act, a->inter, (size_t)N * I);
    }
    if (rebuild && g->keep_sum[l])
        return; /* res2 and its statistics were kept */
    zt_cuda_matmul_forward_residual(g->cs.blas, a->res2, a->inter_act, W(O_W), W(O_B), a->ln1, N, I, C, dt, s);
    zt_cuda_layernorm_forward(a->out, a->out_mean, a->out_rstd, a->res2, W(OLN_W), W(OLN_B), N, C, eps, dt, s);
    if (pass == ZT__CUDA_PASS_FIRST && g->keep_sum[l]) {
        /* the layer above rebuilds its input with them, when this block's weights may be gone */
        ZT_CUDA_CHECK(cudaMemcpyAsync(a->oln_w, W(OLN_W), (size_t)C * g->esize, cudaMemcpyDeviceToDevice, s));
        ZT_CUDA_CHECK(cudaMemcpyAsync(a->oln_b, W(OLN_B), (size_t)C * g->esize, cudaMemcpyDeviceToDevice, s));
    }
#undef W
}

/* Block L+1 forward: the head up to its output layer (the masked-LM transform, or the pooler). */
static void forward_head_block(bert_cuda *g, const void *w)
{
    const int B = g->cur_B, T = g->cur_T, N = B * T, C = g->cfg.hidden_size, hb = g->L + 1;
    const enum zt_dtype dt = g->dtype;
    const void *h = layer_input(g, g->L);
    cudaStream_t s = g->cs.stream;
#define H(k) in_block(g, w, hb, HT(k))
    if (g->mlm) {
        if (head_act(g) == ZT_BERT_ACT_GELU_TANH) {
            zt_cuda_matmul_forward(g->cs.blas, g->tr_act, g->tr_pre, h, H(DENSE_W), H(DENSE_B), N, C, C, dt, s);
        } else {
            zt_cuda_matmul_forward(g->cs.blas, g->tr_pre, NULL, h, H(DENSE_W), H(DENSE_B), N, C, C, dt, s);
            act_forward(g, ZT_BERT_ACT_GELU, g->tr_act, g->tr_pre, (size_t)N * C);
        }
        zt_cuda_layernorm_forward(g->tr_ln, g->tr_mean, g->tr_rstd, g->tr_act, H(LN_W), H(LN_B), N, C,
                                  g->cfg.layer_norm_eps, dt, s);
        /* The decoder bias, for the head pass (which reads the word embeddings' block). */
        ZT_CUDA_CHECK(cudaMemcpyAsync(g->dec_bias, H(BIAS), (size_t)g->Vp * g->esize, cudaMemcpyDeviceToDevice, s));
    } else {
        zt_cuda_first_token_forward(g->first, h, B, T, C, dt, s);
        zt_cuda_matmul_forward(g->cs.blas, g->pool_pre, NULL, g->first, H(POOL_W), H(POOL_B), B, C, C, dt, s);
        zt_cuda_tanh_forward(g->pooled, g->pool_pre, (size_t)B * C, dt, s);
    }
#undef H
}

static void backward_head_block(bert_cuda *g, const void *w, void *gr)
{
    const int B = g->cur_B, T = g->cur_T, N = B * T, C = g->cfg.hidden_size, hb = g->L + 1;
    const size_t NC = (size_t)N * C, BC = (size_t)B * C;
    const enum zt_dtype dt = g->dtype;
    const void *h = layer_input(g, g->L);
    cudaStream_t s = g->cs.stream;
#define W(k) in_block(g, w, hb, HT(k))
#define G(k) in_block(g, gr, hb, HT(k))
    if (g->mlm) {
        /* dln holds d(transform LayerNorm output), from the decoder. */
        zt_cuda_layernorm_backward_overwrite(g->datty, G(LN_W), G(LN_B), g->dln, g->tr_act, W(LN_W), g->tr_mean,
                                             g->tr_rstd, N, C, g->ln_scratch, dt, s);
        zero(g, g->dtmp, NC);
        act_backward(g, head_act(g), g->dtmp, g->tr_pre, g->datty, NC);
        zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dres, G(DENSE_W), G(DENSE_B), g->dtmp, h, W(DENSE_W), NULL, N,
                                          C, C, dt, s);
        zt_cuda_add_inplace(G(BIAS), g->ddec_bias, (size_t)g->Vp, dt, s);
    } else {
        zero(g, g->dpool_pre, BC);
        zt_cuda_tanh_backward(g->dpool_pre, g->pooled, g->dpooled, BC, dt, s);
        zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dfirst, G(POOL_W), G(POOL_B), g->dpool_pre, g->first,
                                          W(POOL_W), NULL, B, C, C, dt, s);
        zero(g, g->dres, NC);
        zt_cuda_first_token_backward(g->dres, g->dfirst, B, T, C, dt, s);
    }
#undef W
#undef G
}

/* Block 1+l backward: dres holds d(layer output) and becomes d(layer input). */
static void backward_layer(bert_cuda *g, int l, const void *w, void *gr)
{
    const int N = g->cur_B * g->cur_T, C = g->cfg.hidden_size, I = g->cfg.intermediate_size, b = 1 + l;
    const size_t NI = (size_t)N * I;
    const enum zt_dtype dt = g->dtype;
    const zt_attention_dims d = attention_dims(g);
    const layer_acts *a = &g->layers[l];
    const void *x = layer_input(g, l);
    cudaStream_t s = g->cs.stream;
#define W(k) in_block(g, w, b, LT(l, k))
#define G(k) in_block(g, gr, b, LT(l, k))
    /* out = LN(res2), res2 = ln1 + output.dense(act(intermediate.dense(ln1))). */
    zt_cuda_layernorm_backward_overwrite(g->dln, G(OLN_W), G(OLN_B), g->dres, a->res2, W(OLN_W), a->out_mean,
                                         a->out_rstd, N, C, g->ln_scratch, dt, s);
    if (g->cfg.hidden_act == ZT_BERT_ACT_GELU_TANH) {
        /* dinter = gelu'(inter) * (dln W_O), in one call */
        zt_cuda_matmul_backward(g->cs.blas, g->dinter, G(O_W), G(O_B), g->dln, a->inter_act, W(O_W), a->inter, N, I, C,
                                dt, s);
    } else {
        zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dinter_act, G(O_W), G(O_B), g->dln, a->inter_act, W(O_W),
                                          NULL, N, I, C, dt, s);
        zt_cuda_gelu_erf_backward_overwrite(g->dinter, a->inter, g->dinter_act, NI, dt, s);
    }
    /* dln: d(ln1), the residual's part plus the intermediate's. */
    zt_cuda_matmul_backward(g->cs.blas, g->dln, G(I_W), G(I_B), g->dinter, a->ln1, W(I_W), NULL, N, C, I, dt, s);
    /* ln1 = LN(res1), res1 = x + attention.output.dense(attention(qkv(x))). */
    zt_cuda_layernorm_backward_overwrite(g->dres, G(ALN_W), G(ALN_B), g->dln, a->res1, W(ALN_W), a->ln1_mean,
                                         a->ln1_rstd, N, C, g->ln_scratch, dt, s);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->datty, G(AO_W), G(AO_B), g->dres, a->atty, W(AO_W), NULL, N, C, C,
                                      dt, s);
    zt_cuda_attention_backward_gqa(g->dqkv, g->datty, a->qkv, a->atty, a->lse, g->d_lens, &d, false, g->attn_scratch,
                                   dt, s);
    /* dres: d(x), the residual's part plus the projection's. */
    zt_cuda_matmul_backward(g->cs.blas, g->dres, G(Q_W), G(Q_B), g->dqkv, x, W(Q_W), NULL, N, C, 3 * C, dt, s);
#undef W
#undef G
}

static void backward_embed(bert_cuda *g, const void *w, void *gr)
{
    const int B = g->cur_B, T = g->cur_T, N = B * T, C = g->cfg.hidden_size;
    zt_cuda_layernorm_backward_overwrite(g->dln, in_block(g, gr, 0, ET(LN_W)), in_block(g, gr, 0, ET(LN_B)), g->dres,
                                         g->emb, in_block(g, w, 0, ET(LN_W)), g->emb_mean, g->emb_rstd, N, C,
                                         g->ln_scratch, g->dtype, g->cs.stream);
    char *dwpe = (char *)in_block(g, gr, 0, ET(POS)) + g->row0 * (size_t)C * g->esize;
    zt_cuda_embedding_backward_typed(in_block(g, gr, 0, ET(WORD)), dwpe, in_block(g, gr, 0, ET(TYPE)), g->dln,
                                     g->d_tokens, g->d_types, B, T, C, g->cfg.vocab_size, g->cfg.type_vocab_size,
                                     g->emb_scratch, g->dtype, g->cs.stream);
}

/* Stages tokens, token types, the counted targets (none at a pad token; one per sequence for
 * classification) and each sequence's length before its trailing padding, and copies them to the device.
 * Returns the number of counted targets. */
static int stage_batch(bert_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T, int slot,
                       int micro)
{
    const size_t N = (size_t)B * T, rows = head_rows(g, (size_t)B, (size_t)T);
    const int V = g->cfg.vocab_size, pad = g->cfg.pad_token_id;
    int32_t *tok = g->cs.h_io[slot], *typ = tok + N, *tgt = typ + N, *lens = tgt + N;
    int32_t *keep = g->h_targets + (size_t)micro * rows;
    ZT_CUDA_CHECK(cudaEventSynchronize(g->cs.io_done[slot])); /* the slot's previous copy has been made */
    for (size_t i = 0; i < N; i++) {
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < V);
        tok[i] = tokens[i];
        typ[i] = g->next_types ? g->next_types[i] : 0;
        ZT_ASSERT(typ[i] >= 0 && typ[i] < g->cfg.type_vocab_size);
    }
    g->next_types = NULL;
    int valid = 0;
    for (size_t r = 0; r < rows; r++) {
        const size_t at = g->mlm ? r : r * (size_t)T;
        int32_t y = targets ? targets[at] : -1;
        ZT_ASSERT(y == -1 || (y >= 0 && y < g->K));
        if (!g->mlm && targets)
            for (int t = 1; t < T; t++)
                ZT_ASSERT(targets[at + (size_t)t] == -1); /* one label per sequence, at its first position */
        if (tok[at] == pad)
            y = -1;
        tgt[r] = keep[r] = y;
        valid += y != -1;
    }
    for (int b = 0; b < B; b++) {
        int len = T;
        while (len > 0 && tok[(size_t)b * T + (size_t)len - 1] == pad)
            len--;
        lens[b] = len;
    }
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_tokens, tok, N * 4, cudaMemcpyHostToDevice, g->cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_types, typ, N * 4, cudaMemcpyHostToDevice, g->cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_targets, tgt, rows * 4, cudaMemcpyHostToDevice, g->cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_lens, lens, (size_t)B * 4, cudaMemcpyHostToDevice, g->cs.stream));
    ZT_CUDA_CHECK(cudaEventRecord(g->cs.io_done[slot], g->cs.stream));
    return valid;
}

/* ---- the model interface (worker/models/model.h) ---- */

static void cuda_set_token_types(zt_model *m, const int32_t *types)
{
    ((bert_cuda *)m)->next_types = types;
}

static void cuda_begin(zt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T, int micro,
                       const zt_model_docs *docs)
{
    bert_cuda *g = (bert_cuda *)m;
    ZT_ASSERT(docs == NULL); /* BERT does not pack documents (the config refuses --sft-pack for it) */
    ZT_ASSERT(B >= 1 && B <= g->max_B && T >= 1 && T <= g->max_T);
    ZT_ASSERT(micro >= 0 && micro < g->max_micro);
    if (micro == 0)
        ZT_CUDA_CHECK(cudaMemsetAsync(g->d_flag, 0, sizeof(int), g->cs.stream));
    g->n_valid[micro] = stage_batch(g, tokens, targets, B, T, micro & 1, micro);
    g->cur_B = B;
    g->cur_T = T;
    g->micro = micro;
    zt__cuda_passes_begin(&g->lay);
}

static void cuda_forward(zt_model *m, int b, const void *w)
{
    bert_cuda *g = (bert_cuda *)m;
    if (b == 0) {
        forward_embed(g, w);
    } else if (b <= g->L) {
        const enum zt__cuda_pass pass = zt__cuda_pass_of(&g->lay, b);
        if (pass != ZT__CUDA_PASS_KEPT)
            forward_layer(g, b - 1, w, pass);
    } else {
        forward_head_block(g, w);
    }
}

/* Checkpointed layers write their activations into the set they share: nothing to free, but the next forward
 * of b is a rebuild. */
static void cuda_discard(zt_model *m, int b)
{
    zt__cuda_pass_discard(&((bert_cuda *)m)->lay, b);
}

/* The head's output layer (the tied decoder with its bias, or the classifier) and the fused classifier
 * loss, which in training (scale != 0) replaces the logits with their gradient. */
static void cuda_head(zt_model *m, const void *w, float scale)
{
    bert_cuda *g = (bert_cuda *)m;
    const int C = g->cfg.hidden_size, B = g->cur_B, N = B * g->cur_T, hb = m->head_block;
    const int rows = (int)head_rows(g, (size_t)B, (size_t)g->cur_T), valid = g->n_valid[g->micro];
    const bool train = scale != 0.0f;
    const float grad_scale = valid > 0 ? scale / (float)valid : 0.0f;
    if (g->mlm)
        zt_cuda_matmul_forward(g->cs.blas, g->logits, NULL, g->tr_ln, in_block(g, w, hb, ET(WORD)), g->dec_bias, N, C,
                               g->Kp, g->dtype, g->cs.stream);
    else
        zt_cuda_matmul_forward(g->cs.blas, g->logits, NULL, g->pooled, in_block(g, w, hb, HT(CLS_W)),
                               in_block(g, w, hb, HT(CLS_B)), B, C, g->Kp, g->dtype, g->cs.stream);
    zt_cuda_crossentropy_forward_backward(g->losses, train ? g->logits : NULL, g->logits, g->d_targets, rows, g->K,
                                          g->Kp, -1, grad_scale, NULL, g->dtype, g->cs.stream);
    if (train)
        zt_cuda_check_finite(g->d_flag, g->losses, (size_t)rows, ZT_DTYPE_F32, g->cs.stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->cs.h_losses + (size_t)g->micro * rows, g->losses, (size_t)rows * sizeof(float),
                                  cudaMemcpyDeviceToHost, g->cs.stream));
}

static void cuda_head_backward(zt_model *m, const void *w, void *gr)
{
    bert_cuda *g = (bert_cuda *)m;
    const int C = g->cfg.hidden_size, B = g->cur_B, N = B * g->cur_T, hb = m->head_block;
    if (g->mlm) {
        zero(g, g->ddec_bias, (size_t)g->Vp);
        zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, in_block(g, gr, hb, ET(WORD)), g->ddec_bias, g->logits,
                                          g->tr_ln, in_block(g, w, hb, ET(WORD)), NULL, N, C, g->Kp, g->dtype,
                                          g->cs.stream);
    } else {
        zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dpooled, in_block(g, gr, hb, HT(CLS_W)),
                                          in_block(g, gr, hb, HT(CLS_B)), g->logits, g->pooled,
                                          in_block(g, w, hb, HT(CLS_W)), NULL, B, C, g->Kp, g->dtype, g->cs.stream);
    }
}

static void cuda_backward(zt_model *m, int b, const void *w, void *gr)
{
    bert_cuda *g = (bert_cuda *)m;
    ZT_ASSERT(zt__cuda_pass_backward_ready(&g->lay, b)); /* a checkpointed block was rebuilt first */
    if (g->n_valid[g->micro] == 0)
        return; /* nothing counted: no gradient (as the CPU model) */
    if (b == 0)
        backward_embed(g, w, gr);
    else if (b <= g->L)
        backward_layer(g, b - 1, w, gr);
    else
        backward_head_block(g, w, gr);
}

static float cuda_loss(const zt_model *m, int micro)
{
    const bert_cuda *g = (const bert_cuda *)m;
    const size_t rows = head_rows(g, (size_t)g->cur_B, (size_t)g->cur_T);
    return zt__mean_loss(g->cs.h_losses + (size_t)micro * rows, rows, g->n_valid[micro]);
}

/* Copies the logits of the last head [rows, K] to out as fp32. */
static void copy_logits(bert_cuda *g, float *out)
{
    const size_t rows = head_rows(g, (size_t)g->cur_B, (size_t)g->cur_T);
    zt__cuda_rows_to_f32(out, g->logits, rows, (size_t)g->K, (size_t)g->Kp, g->dtype, g->cs.stream);
}

static void cuda_logits(zt_model *m, float *out)
{
    copy_logits((bert_cuda *)m, out);
}

/* The argmax of each counted row against its target, from the logits of the evaluation head. */
static void cuda_accuracy(zt_model *m, int micro, int *correct, int *counted)
{
    bert_cuda *g = (bert_cuda *)m;
    ZT_ASSERT(micro == g->micro);
    const size_t rows = head_rows(g, (size_t)g->cur_B, (size_t)g->cur_T), K = (size_t)g->K;
    const int32_t *tgt = g->h_targets + (size_t)micro * rows;
    float *x = zt_xcalloc(rows * K, sizeof(float));
    copy_logits(g, x);
    *correct = *counted = 0;
    for (size_t r = 0; r < rows; r++) {
        if (tgt[r] == -1)
            continue;
        const float *row = x + r * K;
        size_t best = 0;
        for (size_t k = 1; k < K; k++)
            if (row[k] > row[best])
                best = k;
        (*counted)++;
        *correct += (int32_t)best == tgt[r];
    }
    free(x);
}

static const zt_model_ops cuda_ops = {
    .destroy = cuda_destroy,
    .begin = cuda_begin,
    .forward = cuda_forward,
    .discard = cuda_discard,
    .head = cuda_head,
    .head_backward = cuda_head_backward,
    .backward = cuda_backward,
    .loss = cuda_loss,
    .set_token_types = cuda_set_token_types,
    .accuracy = cuda_accuracy,
    .logits = cuda_logits,
};
