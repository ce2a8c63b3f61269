/* LLaMA on one CUDA GPU (see llama_cuda.h): device layout, activation pool, and the block-wise forward and
 * backward passes over the CUDA kernels behind the engine's model interface. The passes follow
 * zt_llama_forward_block / zt_llama_backward_block (worker/models/llama.c) call for call, except that the
 * residual additions ride in the projections' GEMM epilogues. */
#include "worker/models/llama_cuda.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "kernels/activation.h"       /* SwiGLU */
#include "kernels/attention.h"        /* grouped-query attention */
#include "kernels/crossentropy.h"     /* the fused classifier */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, the inf/NaN check, pinned host memory */
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "worker/models/cuda_exec.h"

#define LT(l, k) ZT_LLAMA_LAYER_TENSOR(g->per_layer, l, k) /* in functions with the executor g */

typedef struct layer_acts {
    void *ln1, *qkv, *atty, *res2, *ln2, *gu, *act, *res3; /* dtype */
    float *ln1_rstd, *lse, *ln2_rstd;
} layer_acts;

typedef struct llama_cuda {
    zt_model base;           /* first member: a zt_model * is a llama_cuda * */
    const zt_llama *host;
    zt_llama_config cfg;
    enum zt_dtype dtype;
    size_t esize;            /* bytes per dtype element */
    int HS, QKV, Vp, L;      /* head size, packed q|k|v width, padded vocabulary, layers */
    int per_layer;           /* tensors per layer (zt_llama_config_layer_tensors) */
    int head_tensor;         /* embed_tokens (0) or lm_head (the last tensor) */
    int max_B, max_T, max_micro;
    zt__cuda_layout lay;     /* the device layout and the engine's view of it */
    zt__cuda_state cs;       /* stream, cuBLASLt, pool, pinned staging */

    /* Carved from the pool. */
    layer_acts *layers;
    layer_acts shared;       /* the activations that checkpointed layers share (not res3) */
    void *encoded, *lnf, *logits, *dres, *dln, *datty, *dqkv, *dgu, *dact, *pad_row;
    float *lnf_rstd, *losses, *inv_freq;
    int32_t *d_tokens, *d_targets;
    void *attn_scratch, *emb_scratch, *norm_scratch;
    int *d_flag;

    int n_valid[ZT__CUDA_MAX_MICRO];
    int cur_B, cur_T, micro;
} llama_cuda;

/* ---- layout and creation ---- */

static bool layer_ckpt(const llama_cuda *g, int l)
{
    return g->lay.block_ckpt[1 + l];
}

/* Whether tensor i continues the packed weight of the tensor before it (k and v after q, up after gate, and
 * the biases of k and v after q's). */
static bool packed(const llama_cuda *g, int i)
{
    if (i < 1 || i > g->L * g->per_layer)
        return false;
    const int k = (i - 1) % g->per_layer;
    return k == ZT_LLAMA_T_K || k == ZT_LLAMA_T_V || k == ZT_LLAMA_T_UP || k == ZT_LLAMA_T_K_BIAS ||
           k == ZT_LLAMA_T_V_BIAS;
}

/* Carves every device buffer from base; returns the bytes used (with base NULL only counts). plan, when
 * not NULL, receives the bytes of activations and of scratch. */
static size_t carve(llama_cuda *g, char *base, size_t plan[2])
{
    const size_t N = (size_t)g->max_B * g->max_T, C = (size_t)g->cfg.hidden_size;
    const size_t NH = (size_t)g->cfg.num_attention_heads, F = (size_t)g->cfg.intermediate_size;
    const size_t e = g->esize, NC = N * C, QKV = (size_t)g->QKV;
    size_t used = 0;
    g->encoded = zt__pool_take(base, &used, NC * e);
    const bool any_ckpt = zt__cuda_layout_any_checkpointed(&g->lay);
    for (int l = -1; l < g->L; l++) {
        /* l = -1: the set that checkpointed layers share; a checkpointed layer keeps only its output */
        if (l < 0 && !any_ckpt)
            continue;
        layer_acts *a = l < 0 ? &g->shared : &g->layers[l];
        if (l >= 0 && layer_ckpt(g, l)) {
            *a = g->shared;
            a->res3 = zt__pool_take(base, &used, NC * e);
            continue;
        }
        a->ln1 = zt__pool_take(base, &used, NC * e);
        a->ln1_rstd = zt__pool_take(base, &used, N * 4);
        a->qkv = zt__pool_take(base, &used, N * QKV * e);
        a->atty = zt__pool_take(base, &used, NC * e);
        a->lse = zt__pool_take(base, &used, N * NH * 4);
        a->res2 = zt__pool_take(base, &used, NC * e);
        a->ln2 = zt__pool_take(base, &used, NC * e);
        a->ln2_rstd = zt__pool_take(base, &used, N * 4);
        a->gu = zt__pool_take(base, &used, N * 2 * F * e);
        a->act = zt__pool_take(base, &used, N * F * e);
        a->res3 = zt__pool_take(base, &used, NC * e);
    }
    g->lnf = zt__pool_take(base, &used, NC * e);
    g->lnf_rstd = zt__pool_take(base, &used, N * 4);
    g->logits = zt__pool_take(base, &used, N * (size_t)g->Vp * e);
    g->losses = zt__pool_take(base, &used, N * 4);
    g->dres = zt__pool_take(base, &used, NC * e);
    g->dln = zt__pool_take(base, &used, NC * e);
    g->datty = zt__pool_take(base, &used, NC * e);
    g->dqkv = zt__pool_take(base, &used, N * QKV * e);
    g->dgu = zt__pool_take(base, &used, N * 2 * F * e);
    g->dact = zt__pool_take(base, &used, N * F * e);
    if (plan)
        plan[0] = used;
    const size_t mark = used;
    const zt_attention_dims d = {.B = g->max_B, .T = g->max_T, .NH = (int)NH,
                                 .NKV = g->cfg.num_key_value_heads, .HS = g->HS, .causal = true};
    g->d_tokens = zt__pool_take(base, &used, N * 4);
    g->d_targets = zt__pool_take(base, &used, N * 4);
    g->inv_freq = zt__pool_take(base, &used, (size_t)g->HS / 2 * 4);
    g->pad_row = zt__pool_take(base, &used, C * e);
    g->attn_scratch = zt__pool_take(base, &used, zt_cuda_attention_backward_gqa_scratch_size(&d));
    g->emb_scratch =
        zt__pool_take(base, &used, zt_cuda_embedding_backward_scratch_size(g->max_B, g->max_T, g->cfg.vocab_size));
    g->norm_scratch = zt__pool_take(base, &used, zt_cuda_rmsnorm_backward_scratch_size((int)N, (int)C));
    g->d_flag = zt__pool_take(base, &used, 4);
    if (plan)
        plan[1] = used - mark;
    return used;
}

/* The device layout of the host model's tensor table: embed_tokens and lm_head padded to Vp rows, k and v
 * packed after q, up after gate. */
static void build_layout(llama_cuda *g, const bool *ckpt_layers)
{
    const int nt = zt_llama_num_tensors(g->host);
    const zt_param_info *tensors = zt_llama_tensor(g->host, 0);
    zt__cuda_layout_init(&g->lay, tensors, nt, zt_llama_num_blocks(g->host));
    g->lay.tlen[0] = (size_t)g->Vp * (size_t)g->cfg.hidden_size;
    if (!g->cfg.tie_word_embeddings)
        g->lay.tlen[nt - 1] = (size_t)g->Vp * (size_t)g->cfg.hidden_size;
    for (int i = 0; i < nt; i++)
        g->lay.packed[i] = packed(g, i);
    zt__cuda_layout_finish(&g->lay, tensors, g->L, ckpt_layers, false);
}

static void cuda_destroy(zt_model *m);
static const zt_model_ops cuda_ops;

/* Checks that the kernels serve the model's shape; returns 0 or ZT_EUNSUPPORTED with the fix. */
static int check_shape(const zt_llama_config *cfg, int max_micro, enum zt_dtype dtype, zt_err *err)
{
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_BF16 && dtype != ZT_DTYPE_F16)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA model computes in fp32, bf16 or fp16 only");
    const int C = cfg->hidden_size, NH = cfg->num_attention_heads;
    const zt_attention_dims d = {.B = 1, .T = 1, .NH = NH, .NKV = cfg->num_key_value_heads, .HS = C / NH,
                                 .causal = true};
    if (!zt_cuda_attention_gqa_supported(&d))
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA attention kernels serve head sizes 32, 64, 80, 96 and 128 (256 on GPUs with 66 KiB "
                       "of shared memory per block); this model has %d / %d = %d (choose hidden_size / "
                       "num_attention_heads among them, or train with --device cpu)",
                       C, NH, C / NH);
    if (C % 8 != 0 || cfg->intermediate_size % 8 != 0)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need hidden_size and intermediate_size to be multiples of 8 (they are %d and "
                       "%d); train with --device cpu",
                       C, cfg->intermediate_size);
    if (max_micro < 1 || max_micro > ZT__CUDA_MAX_MICRO)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is out of range for the CUDA trainer (1..%d)",
                       max_micro, ZT__CUDA_MAX_MICRO);
    return 0;
}

/* Sets the sizes and the layout of g (no device memory yet). */
static void init_shape(llama_cuda *g, const zt_llama *host, int B, int T, int max_micro, enum zt_dtype dtype,
                       const bool *ckpt_layers)
{
    const zt_llama_config *cfg = zt_llama_get_config(host);
    g->host = host;
    g->cfg = *cfg;
    g->dtype = dtype;
    g->L = cfg->num_hidden_layers;
    g->HS = cfg->hidden_size / cfg->num_attention_heads;
    g->QKV = (cfg->num_attention_heads + 2 * cfg->num_key_value_heads) * g->HS;
    g->per_layer = zt_llama_config_layer_tensors(cfg);
    g->Vp = (int)zt__round_up((size_t)cfg->vocab_size, ZT__CUDA_VOCAB_PAD);
    g->head_tensor = cfg->tie_word_embeddings ? 0 : zt_llama_num_tensors(host) - 1;
    const size_t nl = (size_t)(g->L > 0 ? g->L : 1);
    g->esize = zt_dtype_size(dtype);
    g->max_B = B;
    g->max_T = T;
    g->max_micro = max_micro;
    g->layers = zt_xcalloc(nl, sizeof(layer_acts));
    build_layout(g, ckpt_layers);
}

static void free_shape(llama_cuda *g)
{
    zt__cuda_layout_free(&g->lay);
    free(g->layers);
}

/* The engine's view of g's layout (no device state). */
static void fill_base(llama_cuda *g)
{
    g->base.ops = &cuda_ops;
    zt__cuda_layout_describe(&g->base, &g->lay, g->dtype, zt_llama_head_block(g->host), zt_llama_num_params(g->host),
                             g->max_B, g->max_T, g->max_micro);
}

/* The layout alone, for planning; see llama_cuda.h. */
zt_model *zt_llama_cuda_shape(const zt_llama *host, int B, int T, int max_micro, enum zt_dtype dtype,
                              const bool *ckpt_layers)
{
    llama_cuda *g = zt_xcalloc(1, sizeof *g);
    init_shape(g, host, B, T, max_micro, dtype, ckpt_layers);
    fill_base(g);
    g->base.device_bytes = carve(g, NULL, NULL);
    return &g->base;
}

/* Creates the device passes; see llama_cuda.h. */
int zt_llama_cuda_create(zt_model **out, const zt_llama *host, int B, int T, int max_micro, enum zt_dtype dtype,
                         const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    const zt_llama_config *cfg = zt_llama_get_config(host);
    int rc = check_shape(cfg, max_micro, dtype, err);
    if (rc < 0)
        return rc;
    llama_cuda *g = zt_xcalloc(1, sizeof *g);
    init_shape(g, host, B, T, max_micro, dtype, ckpt_layers);
    size_t plan[2];
    const size_t pool_bytes = carve(g, NULL, plan), N = (size_t)B * T;
    rc = zt__cuda_state_open(&g->cs, pool_bytes, plan, 2 * N, (size_t)max_micro * N, dtype, B, T, err);
    if (rc < 0)
        goto fail;
    ZT_ASSERT(carve(g, g->cs.pool, NULL) == pool_bytes);

    /* The RoPE frequencies, as the CPU model computes them. */
    float *inv_freq = zt_xcalloc((size_t)g->HS / 2, sizeof(float));
    rc = zt_rope_inv_freq(inv_freq, g->HS, &cfg->rope, err);
    if (rc == 0)
        ZT_CUDA_CHECK(cudaMemcpy(g->inv_freq, inv_freq, (size_t)g->HS / 2 * sizeof(float), cudaMemcpyHostToDevice));
    free(inv_freq);
    if (rc < 0)
        goto fail;

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

/* Frees the device model (after waiting for its stream). */
static void cuda_destroy(zt_model *m)
{
    llama_cuda *g = (llama_cuda *)m;
    if (!g)
        return;
    zt__cuda_state_close(&g->cs);
    free_shape(g);
    free(g);
}

/* ---- forward and backward, block by block ---- */

/* Tensor idx inside block b's buffer (weights or gradients), given the block's base pointer. */
static void *in_block(const llama_cuda *g, const void *block_base, int b, int idx)
{
    return zt__cuda_in_block(&g->lay, block_base, b, idx, g->esize);
}

static void zero(llama_cuda *g, void *p, size_t elems)
{
    ZT_CUDA_CHECK(cudaMemsetAsync(p, 0, elems * g->esize, g->cs.stream));
}

/* The residual stream entering layer l (l == L: entering the final norm). */
static void *layer_input(llama_cuda *g, int l)
{
    return l > 0 ? g->layers[l - 1].res3 : g->encoded;
}

static zt_attention_dims attention_dims(const llama_cuda *g)
{
    return (zt_attention_dims){.B = g->cur_B, .T = g->cur_T, .NH = g->cfg.num_attention_heads,
                               .NKV = g->cfg.num_key_value_heads, .HS = g->HS, .causal = true};
}

/* Block 1+l forward: one decoder layer from layer_input(l) into layers[l].res3; a rebuild (`rebuild`) stops
 * before the down projection, whose only product is res3, the output the checkpointed layer kept. */
static void forward_layer(llama_cuda *g, int l, const void *w, bool rebuild)
{
    const int B = g->cur_B, T = g->cur_T, N = B * T, b = 1 + l;
    const int C = g->cfg.hidden_size, F = g->cfg.intermediate_size;
    const float eps = g->cfg.rms_norm_eps;
    const enum zt_dtype dt = g->dtype;
    const zt_attention_dims d = attention_dims(g);
    layer_acts *a = &g->layers[l];
    const void *x = layer_input(g, l);
    cudaStream_t s = g->cs.stream;
#define W(k) in_block(g, w, b, LT(l, k))
    zt_cuda_rmsnorm_forward(a->ln1, a->ln1_rstd, x, W(ZT_LLAMA_T_IN_NORM), N, C, eps, dt, s);
    zt_cuda_matmul_forward(g->cs.blas, a->qkv, NULL, a->ln1, W(ZT_LLAMA_T_Q),
                           g->cfg.qkv_bias ? W(ZT_LLAMA_T_Q_BIAS) : NULL, N, C, g->QKV, dt, s);
    zt_cuda_rope_forward(a->qkv, g->inv_freq, B, T, d.NH, d.NKV, d.HS, 0, dt, s);
    zt_cuda_attention_forward_gqa(a->atty, a->lse, a->qkv, NULL, &d, dt, s);
    zt_cuda_matmul_forward_residual(g->cs.blas, a->res2, a->atty, W(ZT_LLAMA_T_O), NULL, x, N, C, C, dt, s);
    zt_cuda_rmsnorm_forward(a->ln2, a->ln2_rstd, a->res2, W(ZT_LLAMA_T_POST_NORM), N, C, eps, dt, s);
    zt_cuda_matmul_forward(g->cs.blas, a->gu, NULL, a->ln2, W(ZT_LLAMA_T_GATE), NULL, N, C, 2 * F, dt, s);
    zt_cuda_swiglu_forward(a->act, a->gu, N, F, dt, s);
    if (!rebuild)
        zt_cuda_matmul_forward_residual(g->cs.blas, a->res3, a->act, W(ZT_LLAMA_T_DOWN), NULL, a->res2, N, F, C, dt, s);
#undef W
}

/* Block 1+l backward: dres holds d(layer output) and becomes d(layer input); the layer's weight gradients
 * are added into its block's gradient buffer gr. */
static void backward_layer(llama_cuda *g, int l, const void *w, void *gr)
{
    const int B = g->cur_B, T = g->cur_T, N = B * T, b = 1 + l;
    const int C = g->cfg.hidden_size, F = g->cfg.intermediate_size;
    const enum zt_dtype dt = g->dtype;
    const zt_attention_dims d = attention_dims(g);
    const layer_acts *a = &g->layers[l];
    const void *x = layer_input(g, l);
    cudaStream_t s = g->cs.stream;
#define W(k) in_block(g, w, b, LT(l, k))
#define G(k) in_block(g, gr, b, LT(l, k))
    /* MLP: res3 = res2 + down_proj(silu(gate) * up), gate | up = gate_up_proj(post_attention_layernorm(res2)). */
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dact, G(ZT_LLAMA_T_DOWN), NULL, g->dres, a->act,
                                      W(ZT_LLAMA_T_DOWN), NULL, N, F, C, dt, s);
    zt_cuda_swiglu_backward_overwrite(g->dgu, a->gu, g->dact, N, F, dt, s);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, G(ZT_LLAMA_T_GATE), NULL, g->dgu, a->ln2, W(ZT_LLAMA_T_GATE),
                                      NULL, N, C, 2 * F, dt, s);
    zt_cuda_rmsnorm_backward(g->dres, G(ZT_LLAMA_T_POST_NORM), g->dln, a->res2, W(ZT_LLAMA_T_POST_NORM), a->ln2_rstd,
                             N, C, g->norm_scratch, dt, s);
    /* Attention: res2 = x + o_proj(attn(rope(q), rope(k), v)), q | k | v = qkv_proj(input_layernorm(x)). */
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->datty, G(ZT_LLAMA_T_O), NULL, g->dres, a->atty, W(ZT_LLAMA_T_O),
                                      NULL, N, C, C, dt, s);
    zt_cuda_attention_backward_gqa(g->dqkv, g->datty, a->qkv, a->atty, a->lse, NULL, &d, false, g->attn_scratch, dt,
                                   s);
    zt_cuda_rope_backward(g->dqkv, g->inv_freq, B, T, d.NH, d.NKV, d.HS, 0, dt, s);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, G(ZT_LLAMA_T_Q), g->cfg.qkv_bias ? G(ZT_LLAMA_T_Q_BIAS) : NULL,
                                      g->dqkv, a->ln1, W(ZT_LLAMA_T_Q), NULL, N, C, g->QKV, dt, s);
    zt_cuda_rmsnorm_backward(g->dres, G(ZT_LLAMA_T_IN_NORM), g->dln, x, W(ZT_LLAMA_T_IN_NORM), a->ln1_rstd, N, C,
                             g->norm_scratch, dt, s);
#undef W
#undef G
}

/* Block 0 backward: embed_tokens (whose rows hold the head's gradient too when the head is tied). The
 * padding row (pad_token_id) receives nothing from the embedding, as nn.Embedding's padding_idx. */
static void backward_embed(llama_cuda *g, void *gr)
{
    const size_t C = (size_t)g->cfg.hidden_size, rowb = C * g->esize;
    char *dwte = in_block(g, gr, 0, 0);
    char *pad = g->cfg.pad_token_id >= 0 ? dwte + (size_t)g->cfg.pad_token_id * rowb : NULL;
    if (pad)
        ZT_CUDA_CHECK(cudaMemcpyAsync(g->pad_row, pad, rowb, cudaMemcpyDeviceToDevice, g->cs.stream));
    zt_cuda_embedding_backward(dwte, NULL, g->dres, g->d_tokens, g->cur_B, g->cur_T, (int)C, g->cfg.vocab_size,
                               g->emb_scratch, g->dtype, g->cs.stream);
    if (pad)
        ZT_CUDA_CHECK(cudaMemcpyAsync(pad, g->pad_row, rowb, cudaMemcpyDeviceToDevice, g->cs.stream));
}


/* ---- the model interface (worker/models/model.h) ---- */

static void cuda_begin(zt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T, int micro)
{
    llama_cuda *g = (llama_cuda *)m;
    ZT_ASSERT(B >= 1 && B <= g->max_B && T >= 1 && T <= g->max_T);
    ZT_ASSERT(micro >= 0 && micro < g->max_micro);
    if (micro == 0)
        ZT_CUDA_CHECK(cudaMemsetAsync(g->d_flag, 0, sizeof(int), g->cs.stream));
    g->n_valid[micro] = zt__cuda_stage_lm(&g->cs, micro & 1, tokens, targets, B, T, g->cfg.vocab_size, g->d_tokens,
                                          g->d_targets);
    g->cur_B = B;
    g->cur_T = T;
    g->micro = micro;
    zt__cuda_passes_begin(&g->lay);
}

static void cuda_forward(zt_model *m, int b, const void *w)
{
    llama_cuda *g = (llama_cuda *)m;
    const int L = g->L, N = g->cur_B * g->cur_T, C = g->cfg.hidden_size;
    if (b == 0) {
        zt_cuda_embedding_forward(g->encoded, g->d_tokens, in_block(g, w, 0, 0), NULL, g->cur_B, g->cur_T, C,
                                  g->dtype, g->cs.stream);
    } else if (b <= L) {
        const enum zt__cuda_pass pass = zt__cuda_pass_of(&g->lay, b);
        if (pass != ZT__CUDA_PASS_KEPT)
            forward_layer(g, b - 1, w, pass == ZT__CUDA_PASS_REBUILD);
    } else {
        zt_cuda_rmsnorm_forward(g->lnf, g->lnf_rstd, layer_input(g, L), in_block(g, w, L + 1, LT(L, 0)), N, C,
                                g->cfg.rms_norm_eps, g->dtype, g->cs.stream);
    }
}

/* Checkpointed layers write their activations into the set they share: nothing to free, but the next forward
 * of b is a rebuild. */
static void cuda_discard(zt_model *m, int b)
{
    zt__cuda_pass_discard(&((llama_cuda *)m)->lay, b);
}

/* The head (logits = norm output @ W^T, W embed_tokens or lm_head) and the fused classifier, which writes
 * the losses and, in training (scale != 0), replaces the logits with their gradient. */
static void cuda_head(zt_model *m, const void *w, float scale)
{
    llama_cuda *g = (llama_cuda *)m;
    const int C = g->cfg.hidden_size, N = g->cur_B * g->cur_T, valid = g->n_valid[g->micro];
    const bool train = scale != 0.0f;
    const float grad_scale = valid > 0 ? scale / (float)valid : 0.0f;
    const int hb = m->head_block;
    zt_cuda_matmul_forward(g->cs.blas, g->logits, NULL, g->lnf, in_block(g, w, hb, g->head_tensor), NULL, N, C, g->Vp,
                           g->dtype, g->cs.stream);
    zt_cuda_crossentropy_forward_backward(g->losses, train ? g->logits : NULL, g->logits, g->d_targets, N,
                                          g->cfg.vocab_size, g->Vp, -1, grad_scale, NULL, g->dtype, g->cs.stream);
    if (train)
        zt_cuda_check_finite(g->d_flag, g->losses, (size_t)N, ZT_DTYPE_F32, g->cs.stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->cs.h_losses + (size_t)g->micro * N, g->losses, (size_t)N * sizeof(float),
                                  cudaMemcpyDeviceToHost, g->cs.stream));
}

/* The head's backward: the head weight's gradient into the head block's buffer, and dln, the gradient of
 * the final norm's output. */
static void cuda_head_backward(zt_model *m, const void *w, void *gr)
{
    llama_cuda *g = (llama_cuda *)m;
    const int C = g->cfg.hidden_size, N = g->cur_B * g->cur_T, hb = m->head_block;
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, in_block(g, gr, hb, g->head_tensor), NULL, g->logits, g->lnf,
                                      in_block(g, w, hb, g->head_tensor), NULL, N, C, g->Vp, g->dtype, g->cs.stream);
}

static void cuda_backward(zt_model *m, int b, const void *w, void *gr)
{
    llama_cuda *g = (llama_cuda *)m;
    ZT_ASSERT(zt__cuda_pass_backward_ready(&g->lay, b)); /* a checkpointed block was rebuilt first */
    const int L = g->L, N = g->cur_B * g->cur_T, C = g->cfg.hidden_size;
    if (b == 0) {
        backward_embed(g, gr);
    } else if (b <= L) {
        backward_layer(g, b - 1, w, gr);
    } else {
        zero(g, g->dres, (size_t)N * C);
        zt_cuda_rmsnorm_backward(g->dres, in_block(g, gr, L + 1, LT(L, 0)), g->dln, layer_input(g, L),
                                 in_block(g, w, L + 1, LT(L, 0)), g->lnf_rstd, N, C, g->norm_scratch, g->dtype,
                                 g->cs.stream);
    }
}

/* The mean loss of micro-batch `micro` (its losses came back with the stream, which the caller waited for). */
static float cuda_loss(const zt_model *m, int micro)
{
    const llama_cuda *g = (const llama_cuda *)m;
    const size_t N = (size_t)g->cur_B * g->cur_T;
    return zt__cuda_mean_loss(g->cs.h_losses + (size_t)micro * N, N, g->n_valid[micro]);
}

/* The logits of the last head (called with scale 0) as fp32 [B,T,V]. */
static void cuda_logits(zt_model *m, float *out)
{
    llama_cuda *g = (llama_cuda *)m;
    const size_t N = (size_t)g->cur_B * g->cur_T;
    zt__cuda_rows_to_f32(out, g->logits, N, (size_t)g->cfg.vocab_size, (size_t)g->Vp, g->dtype, g->cs.stream);
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
    .logits = cuda_logits,
};
