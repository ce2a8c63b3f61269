/* GPT-2 on one CUDA GPU (see gpt2_cuda.h): device layout, activation pool, the block-wise forward and
 * backward passes over the CUDA kernels behind the engine's model interface, and a profiling mode that
 * times kernel families. */
#include "worker/models/gpt2_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "kernels/attention.h"       /* zt_cuda_attention_forward / backward */
#include "kernels/crossentropy.h"    /* zt_cuda_crossentropy_forward_backward: the fused classifier */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, the inf/NaN check */
#include "kernels/embedding.h"       /* zt_cuda_embedding_forward / backward */
#include "kernels/layernorm.h"       /* zt_cuda_layernorm_forward / backward */
#include "kernels/matmul.h"          /* cuBLASLt GEMMs with bias / GELU / residual epilogues */
#include "worker/models/cuda_exec.h"  /* the layout, pool, stream and staging every executor shares */

/* Per-layer tensor order of the host layout (worker/models/gpt2.c). */
enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, LT_N };
#define LAYER_TENSOR(l, k) (2 + (l) * LT_N + (k))

#define PROF_EVENTS 8192

/* Kernel families timed in profiling mode. */
enum prof_family {
    PF_EMBED, PF_LAYERNORM, PF_MM_QKV, PF_ATTN, PF_MM_ATTPROJ, PF_MM_FC, PF_MM_FCPROJ, PF_HEAD,
    PF_CLASSIFIER, PF_B_HEAD, PF_B_LAYERNORM, PF_B_MM_FCPROJ, PF_B_MM_FC, PF_B_MM_ATTPROJ, PF_B_ATTN, PF_B_MM_QKV,
    PF_B_EMBED, PF_MEMSET, PF_COUNT
};
static const char *const prof_names[PF_COUNT] = {
    "fwd embedding", "fwd layernorm", "fwd matmul qkv", "fwd attention", "fwd matmul attn proj",
    "fwd matmul fc+gelu", "fwd matmul fc proj", "fwd head matmul", "classifier (fwd+bwd)", "bwd head matmul",
    "bwd layernorm", "bwd matmul fc proj+dgelu", "bwd matmul fc", "bwd matmul attn proj", "bwd attention",
    "bwd matmul qkv", "bwd embedding", "memsets"};

typedef struct layer_acts {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3; /* dtype */
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
} layer_acts;

typedef struct gpt2_cuda {
    zt_model base;           /* first member: a zt_model * is a gpt2_cuda * */
    const zt_gpt2 *host;
    zt_gpt2_config cfg;
    enum zt_dtype dtype;
    layer_acts shared;       /* the activations that checkpointed layers share (not res3) */
    size_t esize;            /* bytes per dtype element */
    int max_B, max_T, max_micro, Vp;
    zt__cuda_layout lay;     /* the device layout and the engine's view of it */
    zt__cuda_state cs;       /* stream, cuBLASLt, pool, pinned staging */

    /* Carved from the pool. */
    layer_acts *layers;
    void *encoded, *lnf, *logits, *dres, *dln, *datty, *dqkv, *dfch;
    float *lnf_mean, *lnf_rstd, *losses;
    int32_t *d_tokens, *d_targets;
    void *attn_scratch, *emb_scratch, *ln_scratch;
    int *d_flag;

    int n_valid[ZT__CUDA_MAX_MICRO]; /* per micro-batch of the current step */
    int cur_B, cur_T, micro;
    float grad_scale;        /* of the micro-batch in flight: scale / counted targets */

    /* Profiling. */
    bool profiling;
    cudaEvent_t *prof_ev;    /* [PROF_EVENTS] */
    int *prof_fam;           /* [PROF_EVENTS / 2] */
    int prof_used;
    double prof_ms[PF_COUNT];
    int prof_open;
} gpt2_cuda;

/* ---- profiling ---- */

static void prof_flush(gpt2_cuda *g)
{
    if (g->prof_used == 0)
        return;
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->cs.stream));
    for (int i = 0; i < g->prof_used; i++) {
        float ms = 0.0f;
        ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, g->prof_ev[2 * i], g->prof_ev[2 * i + 1]));
        g->prof_ms[g->prof_fam[i]] += ms;
    }
    g->prof_used = 0;
}

static void prof_begin(gpt2_cuda *g, int fam)
{
    if (!g->profiling)
        return;
    if (g->prof_used == PROF_EVENTS / 2)
        prof_flush(g);
    g->prof_fam[g->prof_used] = fam;
    ZT_CUDA_CHECK(cudaEventRecord(g->prof_ev[2 * g->prof_used], g->cs.stream));
    g->prof_open = 1;
}

static void prof_end(gpt2_cuda *g)
{
    if (!g->profiling || !g->prof_open)
        return;
    ZT_CUDA_CHECK(cudaEventRecord(g->prof_ev[2 * g->prof_used + 1], g->cs.stream));
    g->prof_used++;
    g->prof_open = 0;
}

/* Turns profiling on or off (creating the events the first time). */
void zt_gpt2_cuda_set_profiling(zt_model *m, bool on)
{
    gpt2_cuda *g = (gpt2_cuda *)m;
    if (on && !g->prof_ev) {
        g->prof_ev = zt_xcalloc(PROF_EVENTS, sizeof *g->prof_ev);
        g->prof_fam = zt_xcalloc(PROF_EVENTS / 2, sizeof *g->prof_fam);
        for (int i = 0; i < PROF_EVENTS; i++)
            ZT_CUDA_CHECK(cudaEventCreate(&g->prof_ev[i]));
    }
    if (!on)
        prof_flush(g);
    g->profiling = on;
}

/* Logs the time spent in each kernel family since profiling was turned on, and resets the sums. */
void zt_gpt2_cuda_profile_report(zt_model *m)
{
    gpt2_cuda *g = (gpt2_cuda *)m;
    prof_flush(g);
    double total = 0.0;
    for (int i = 0; i < PF_COUNT; i++)
        total += g->prof_ms[i];
    for (int i = 0; i < PF_COUNT; i++)
        if (g->prof_ms[i] > 0)
            zt_log(ZT_LOG_INFO, "profile: %-26s %10.2f ms  %5.1f%%", prof_names[i], g->prof_ms[i],
                   total > 0 ? 100.0 * g->prof_ms[i] / total : 0.0);
    zt_log(ZT_LOG_INFO, "profile: %-26s %10.2f ms", "total (model kernels)", total);
    memset(g->prof_ms, 0, sizeof g->prof_ms);
}

/* ---- creation ---- */


/* Whether layer l keeps only its output in the forward pass. */
static bool layer_ckpt(const gpt2_cuda *g, int l)
{
    return g->lay.block_ckpt[1 + l];
}

/* Carves every device buffer from base; returns the bytes used. With base NULL only counts. plan, when
 * not NULL, receives the bytes of: activations, scratch. */
static size_t carve(gpt2_cuda *g, char *base, size_t plan[2])
{
    const size_t N = (size_t)g->max_B * g->max_T, C = (size_t)g->cfg.n_embd, NH = (size_t)g->cfg.n_head;
    const size_t e = g->esize, NC = N * C;
    size_t used = 0;
    g->encoded = zt__pool_take(base, &used, NC * e);
    const bool any_ckpt = zt__cuda_layout_any_checkpointed(&g->lay);
    for (int l = -1; l < g->cfg.n_layer; l++) {
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
        a->ln1_mean = zt__pool_take(base, &used, N * 4);
        a->ln1_rstd = zt__pool_take(base, &used, N * 4);
        a->qkv = zt__pool_take(base, &used, 3 * NC * e);
        a->atty = zt__pool_take(base, &used, NC * e);
        a->lse = zt__pool_take(base, &used, N * NH * 4);
        a->res2 = zt__pool_take(base, &used, NC * e);
        a->ln2 = zt__pool_take(base, &used, NC * e);
        a->ln2_mean = zt__pool_take(base, &used, N * 4);
        a->ln2_rstd = zt__pool_take(base, &used, N * 4);
        a->fch = zt__pool_take(base, &used, 4 * NC * e);
        a->fch_gelu = zt__pool_take(base, &used, 4 * NC * e);
        a->res3 = zt__pool_take(base, &used, NC * e);
    }
    g->lnf = zt__pool_take(base, &used, NC * e);
    g->lnf_mean = zt__pool_take(base, &used, N * 4);
    g->lnf_rstd = zt__pool_take(base, &used, N * 4);
    g->logits = zt__pool_take(base, &used, N * (size_t)g->Vp * e);
    g->losses = zt__pool_take(base, &used, N * 4);
    g->dres = zt__pool_take(base, &used, NC * e);
    g->dln = zt__pool_take(base, &used, NC * e);
    g->datty = zt__pool_take(base, &used, NC * e);
    g->dqkv = zt__pool_take(base, &used, 3 * NC * e);
    g->dfch = zt__pool_take(base, &used, 4 * NC * e);
    if (plan)
        plan[0] = used;
    const size_t mark = used;
    g->d_tokens = zt__pool_take(base, &used, N * 4);
    g->d_targets = zt__pool_take(base, &used, N * 4);
    g->attn_scratch = zt__pool_take(base, &used, zt_cuda_attention_backward_scratch_size(g->max_B, g->max_T, (int)NH));
    g->emb_scratch =
        zt__pool_take(base, &used, zt_cuda_embedding_backward_scratch_size(g->max_B, g->max_T, g->cfg.vocab_size));
    g->ln_scratch = zt__pool_take(base, &used, zt_cuda_layernorm_backward_scratch_size((int)N, (int)C));
    g->d_flag = zt__pool_take(base, &used, 4);
    if (plan)
        plan[1] = used - mark;
    return used;
}

/* The device layout of the host model's tensor table: wte padded to Vp rows. */
static void build_layout(gpt2_cuda *g, const bool *ckpt_layers)
{
    const zt_param_info *tensors = zt_gpt2_tensor(g->host, 0);
    zt__cuda_layout_init(&g->lay, tensors, zt_gpt2_num_tensors(g->host), zt_gpt2_num_blocks(g->host));
    g->lay.tlen[0] = (size_t)g->Vp * (size_t)g->cfg.n_embd;
    zt__cuda_layout_finish(&g->lay, tensors, g->cfg.n_layer, ckpt_layers, false);
}

static void cuda_destroy(zt_model *m);
static const zt_model_ops cuda_ops;

/* Checks that the kernels serve the model's shape; returns 0 or ZT_EUNSUPPORTED with the fix. */
static int check_shape(const zt_gpt2_config *cfg, int max_micro, enum zt_dtype dtype, zt_err *err)
{
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_BF16 && dtype != ZT_DTYPE_F16)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA model computes in fp32, bf16 or fp16 only");
    if (!zt_cuda_attention_supported(cfg->n_embd, cfg->n_head))
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA attention kernels serve head sizes 32, 64, 80, 96 and 128 (256 on GPUs with 66 KiB "
                       "of shared memory per block); this model has %d / %d = %d (choose n_embd / n_head among "
                       "them, or train with --device cpu)",
                       cfg->n_embd, cfg->n_head, cfg->n_embd / cfg->n_head);
    if (cfg->n_embd % 8 != 0 || cfg->n_embd > 6144)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need n_embd to be a multiple of 8 and at most 6144 (it is %d); train "
                       "with --device cpu",
                       cfg->n_embd);
    if (max_micro < 1 || max_micro > ZT__CUDA_MAX_MICRO)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is out of range for the CUDA trainer (1..%d)",
                       max_micro, ZT__CUDA_MAX_MICRO);
    return 0;
}

/* Sets the sizes and the layout of g (no device memory yet). */
static void init_shape(gpt2_cuda *g, const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                       const bool *ckpt_layers)
{
    const zt_gpt2_config *cfg = zt_gpt2_get_config(host);
    g->host = host;
    g->cfg = *cfg;
    g->dtype = dtype;
    g->esize = zt_dtype_size(dtype);
    g->max_B = B;
    g->max_T = T;
    g->max_micro = max_micro;
    g->Vp = (int)zt__round_up((size_t)cfg->vocab_size, ZT__CUDA_VOCAB_PAD);
    g->layers = zt_xcalloc((size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1), sizeof(layer_acts));
    build_layout(g, ckpt_layers);
}

static void free_shape(gpt2_cuda *g)
{
    zt__cuda_layout_free(&g->lay);
    free(g->layers);
}

/* Device bytes of the activations and scratch; see gpt2_cuda.h. */
size_t zt_gpt2_cuda_plan_bytes(const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                               const bool *ckpt_layers)
{
    gpt2_cuda g;
    memset(&g, 0, sizeof g);
    init_shape(&g, host, B, T, max_micro, dtype, ckpt_layers);
    size_t bytes = carve(&g, NULL, NULL);
    free_shape(&g);
    return bytes;
}

/* The engine's view of g's layout (no device state); the head is tied to wte, the first tensor of block 0. */
static void fill_base(gpt2_cuda *g)
{
    g->base.ops = &cuda_ops;
    zt__cuda_layout_describe(&g->base, &g->lay, g->dtype, 0, zt_gpt2_num_params(g->host), g->max_B, g->max_T,
                             g->max_micro);
}

/* The layout alone, for planning; see gpt2_cuda.h. */
zt_model *zt_gpt2_cuda_shape(const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers)
{
    gpt2_cuda *g = zt_xcalloc(1, sizeof *g);
    init_shape(g, host, B, T, max_micro, dtype, ckpt_layers);
    fill_base(g);
    g->base.device_bytes = carve(g, NULL, NULL);
    return &g->base;
}

/* Creates the device passes; see gpt2_cuda.h. */
int zt_gpt2_cuda_create(zt_model **out, const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    int rc = check_shape(zt_gpt2_get_config(host), max_micro, dtype, err);
    if (rc < 0)
        return rc;
    gpt2_cuda *g = zt_xcalloc(1, sizeof *g);
    init_shape(g, host, B, T, max_micro, dtype, ckpt_layers);
    size_t plan[2];
    const size_t pool_bytes = carve(g, NULL, plan), N = (size_t)B * T;
    rc = zt__cuda_state_open(&g->cs, pool_bytes, plan, 2 * N, (size_t)max_micro * N, dtype, B, T, err);
    if (rc < 0)
        goto fail;
    ZT_ASSERT(carve(g, g->cs.pool, NULL) == pool_bytes);

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
    gpt2_cuda *g = (gpt2_cuda *)m;
    if (!g)
        return;
    if (g->cs.stream)
        ZT_CUDA_CHECK(cudaStreamSynchronize(g->cs.stream));
    if (g->prof_ev) {
        for (int i = 0; i < PROF_EVENTS; i++)
            cudaEventDestroy(g->prof_ev[i]);
        free(g->prof_ev);
        free(g->prof_fam);
    }
    zt__cuda_state_close(&g->cs);
    free_shape(g);
    free(g);
}

/* ---- forward and backward, block by block ---- */

/* Tensor idx inside block b's buffer (weights or gradients), given the block's base pointer. */
static void *in_block(const gpt2_cuda *g, void *block_base, int b, int idx)
{
    return zt__cuda_in_block(&g->lay, block_base, b, idx, g->esize);
}

static void zero(gpt2_cuda *g, void *p, size_t elems)
{
    prof_begin(g, PF_MEMSET);
    ZT_CUDA_CHECK(cudaMemsetAsync(p, 0, elems * g->esize, g->cs.stream));
    prof_end(g);
}

/* Block 0 forward: token and position embeddings. */
static void forward_embed(gpt2_cuda *g, const void *w, int B, int T)
{
    prof_begin(g, PF_EMBED);
    zt_cuda_embedding_forward(g->encoded, g->d_tokens, in_block(g, (void *)w, 0, 0), in_block(g, (void *)w, 0, 1),
                              B, T, g->cfg.n_embd, g->dtype, g->cs.stream);
    prof_end(g);
}

/* Block 1+l forward: one transformer layer from x into layers[l].res3; a rebuild (`rebuild`) stops before the
 * MLP's output projection, whose only product is res3, the output the checkpointed layer kept. */
static void forward_layer(gpt2_cuda *g, int l, void *w, const void *x, int B, int T, bool rebuild)
{
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, N = B * T, b = 1 + l;
    const float eps = g->cfg.layer_norm_epsilon;
    const enum zt_dtype dt = g->dtype;
    layer_acts *a = &g->layers[l];
    cudaStream_t s = g->cs.stream;
#define W(k) in_block(g, w, b, LAYER_TENSOR(l, k))
    prof_begin(g, PF_LAYERNORM);
    zt_cuda_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, W(LN1_W), W(LN1_B), N, C, eps, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_QKV);
    zt_cuda_matmul_forward(g->cs.blas, a->qkv, NULL, a->ln1, W(QKV_W), W(QKV_B), N, C, 3 * C, dt, s);
    prof_end(g);
    prof_begin(g, PF_ATTN);
    zt_cuda_attention_forward(a->atty, a->lse, a->qkv, B, T, C, NH, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_ATTPROJ);
    zt_cuda_matmul_forward_residual(g->cs.blas, a->res2, a->atty, W(ATTPROJ_W), W(ATTPROJ_B), x, N, C, C, dt, s);
    prof_end(g);
    prof_begin(g, PF_LAYERNORM);
    zt_cuda_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(LN2_W), W(LN2_B), N, C, eps, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_FC);
    zt_cuda_matmul_forward(g->cs.blas, a->fch_gelu, a->fch, a->ln2, W(FC_W), W(FC_B), N, C, 4 * C, dt, s);
    prof_end(g);
    if (rebuild)
        return;
    prof_begin(g, PF_MM_FCPROJ);
    zt_cuda_matmul_forward_residual(g->cs.blas, a->res3, a->fch_gelu, W(FCPROJ_W), W(FCPROJ_B), a->res2, N, 4 * C, C,
                                    dt, s);
    prof_end(g);
#undef W
}

/* The residual stream after the last layer (the input of ln_f). */
static void *last_residual(gpt2_cuda *g)
{
    return g->cfg.n_layer > 0 ? g->layers[g->cfg.n_layer - 1].res3 : g->encoded;
}

/* Block L+1 forward: the final layer norm. */
static void forward_lnf(gpt2_cuda *g, void *w_lnf, int B, int T)
{
    const int C = g->cfg.n_embd, N = B * T, L = g->cfg.n_layer, lnf = g->lay.ntensors - 2;
    prof_begin(g, PF_LAYERNORM);
    zt_cuda_layernorm_forward(g->lnf, g->lnf_mean, g->lnf_rstd, last_residual(g), in_block(g, w_lnf, L + 1, lnf),
                              in_block(g, w_lnf, L + 1, lnf + 1), N, C, g->cfg.layer_norm_epsilon, g->dtype,
                              g->cs.stream);
    prof_end(g);
}

/* Backward of ln_f: dln (the gradient of its output, from the head) becomes dres, the gradient of the
 * last residual stream; the layer norm's weight gradients are added into g_lnf. */
static void backward_lnf(gpt2_cuda *g, void *w_lnf, void *g_lnf, int B, int T)
{
    const int C = g->cfg.n_embd, N = B * T, L = g->cfg.n_layer, lnf = g->lay.ntensors - 2;
    zero(g, g->dres, (size_t)N * C);
    prof_begin(g, PF_B_LAYERNORM);
    zt_cuda_layernorm_backward(g->dres, in_block(g, g_lnf, L + 1, lnf), in_block(g, g_lnf, L + 1, lnf + 1), g->dln,
                               last_residual(g), in_block(g, w_lnf, L + 1, lnf), g->lnf_mean, g->lnf_rstd, N, C,
                               g->ln_scratch, g->dtype, g->cs.stream);
    prof_end(g);
}

/* Block 1+l backward: dres holds d(layer output) and becomes d(layer input); the layer's weight
 * gradients are added into its block's gradient buffer. */
static void backward_layer(gpt2_cuda *g, int l, void *w, void *gr, const void *x, int B, int T)
{
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, N = B * T, b = 1 + l;
    const enum zt_dtype dt = g->dtype;
    const layer_acts *a = &g->layers[l];
    cudaStream_t s = g->cs.stream;
#define W(k) in_block(g, w, b, LAYER_TENSOR(l, k))
#define G(k) in_block(g, gr, b, LAYER_TENSOR(l, k))
    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); the GELU's backward is fused (dfch overwritten). */
    prof_begin(g, PF_B_MM_FCPROJ);
    zt_cuda_matmul_backward(g->cs.blas, g->dfch, G(FCPROJ_W), G(FCPROJ_B), g->dres, a->fch_gelu, W(FCPROJ_W), a->fch,
                            N, 4 * C, C, dt, s);
    prof_end(g);
    prof_begin(g, PF_B_MM_FC);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, G(FC_W), G(FC_B), g->dfch, a->ln2, W(FC_W), NULL, N, C, 4 * C,
                                      dt, s);
    prof_end(g);
    prof_begin(g, PF_B_LAYERNORM);
    zt_cuda_layernorm_backward(g->dres, G(LN2_W), G(LN2_B), g->dln, a->res2, W(LN2_W), a->ln2_mean, a->ln2_rstd, N,
                               C, g->ln_scratch, dt, s);
    prof_end(g);
    /* Attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))). */
    prof_begin(g, PF_B_MM_ATTPROJ);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->datty, G(ATTPROJ_W), G(ATTPROJ_B), g->dres, a->atty, W(ATTPROJ_W),
                                      NULL, N, C, C, dt, s);
    prof_end(g);
    prof_begin(g, PF_B_ATTN);
    zt_cuda_attention_backward_overwrite(g->dqkv, g->datty, a->qkv, a->atty, a->lse, B, T, C, NH, g->attn_scratch, dt,
                                         s);
    prof_end(g);
    prof_begin(g, PF_B_MM_QKV);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, G(QKV_W), G(QKV_B), g->dqkv, a->ln1, W(QKV_W), NULL, N, C,
                                      3 * C, dt, s);
    prof_end(g);
    prof_begin(g, PF_B_LAYERNORM);
    zt_cuda_layernorm_backward(g->dres, G(LN1_W), G(LN1_B), g->dln, x, W(LN1_W), a->ln1_mean, a->ln1_rstd, N, C,
                               g->ln_scratch, dt, s);
    prof_end(g);
#undef W
#undef G
}

/* Block 0 backward: embeddings (wte's rows also hold the head's gradient by now). */
static void backward_embed(gpt2_cuda *g, void *gr, int B, int T)
{
    prof_begin(g, PF_B_EMBED);
    zt_cuda_embedding_backward(in_block(g, gr, 0, 0), in_block(g, gr, 0, 1), g->dres, g->d_tokens, B, T,
                               g->cfg.n_embd, g->cfg.vocab_size, g->emb_scratch, g->dtype, g->cs.stream);
    prof_end(g);
}


/* ---- the model interface (worker/models/model.h) ---- */

static void cuda_begin(zt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T, int micro)
{
    gpt2_cuda *g = (gpt2_cuda *)m;
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
    gpt2_cuda *g = (gpt2_cuda *)m;
    const int L = g->cfg.n_layer, B = g->cur_B, T = g->cur_T;
    if (b == 0) {
        forward_embed(g, w, B, T);
    } else if (b <= L) {
        const int l = b - 1;
        const enum zt__cuda_pass pass = zt__cuda_pass_of(&g->lay, b);
        if (pass != ZT__CUDA_PASS_KEPT)
            forward_layer(g, l, (void *)w, l > 0 ? g->layers[l - 1].res3 : g->encoded, B, T,
                          pass == ZT__CUDA_PASS_REBUILD);
    } else {
        forward_lnf(g, (void *)w, B, T);
    }
}

/* Checkpointed layers write their activations into the set they share: nothing to free, but the next forward
 * of b is a rebuild. */
static void cuda_discard(zt_model *m, int b)
{
    zt__cuda_pass_discard(&((gpt2_cuda *)m)->lay, b);
}

/* The tied head (logits = ln_f output @ wte^T) and the fused classifier, which writes the losses and,
 * in training (scale != 0), replaces the logits with their gradient. */
static void cuda_head(zt_model *m, const void *w_emb, float scale)
{
    gpt2_cuda *g = (gpt2_cuda *)m;
    const int C = g->cfg.n_embd, N = g->cur_B * g->cur_T, valid = g->n_valid[g->micro];
    const bool train = scale != 0.0f;
    g->grad_scale = valid > 0 ? scale / (float)valid : 0.0f;
    prof_begin(g, PF_HEAD);
    zt_cuda_matmul_forward(g->cs.blas, g->logits, NULL, g->lnf, in_block(g, (void *)w_emb, 0, 0), NULL, N, C, g->Vp,
                           g->dtype, g->cs.stream);
    prof_end(g);
    prof_begin(g, PF_CLASSIFIER);
    zt_cuda_crossentropy_forward_backward(g->losses, train ? g->logits : NULL, g->logits, g->d_targets, N,
                                          g->cfg.vocab_size, g->Vp, -1, g->grad_scale, NULL, g->dtype, g->cs.stream);
    prof_end(g);
    if (train)
        zt_cuda_check_finite(g->d_flag, g->losses, (size_t)N, ZT_DTYPE_F32, g->cs.stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->cs.h_losses + (size_t)g->micro * N, g->losses, (size_t)N * sizeof(float),
                                  cudaMemcpyDeviceToHost, g->cs.stream));
}

/* The head's backward: gradients into wte (block 0's buffer) and dln, the gradient of ln_f's output. */
static void cuda_head_backward(zt_model *m, const void *w_emb, void *g_emb)
{
    gpt2_cuda *g = (gpt2_cuda *)m;
    const int C = g->cfg.n_embd, N = g->cur_B * g->cur_T;
    prof_begin(g, PF_B_HEAD);
    zt_cuda_matmul_backward_overwrite(g->cs.blas, g->dln, in_block(g, g_emb, 0, 0), NULL, g->logits, g->lnf,
                                      in_block(g, (void *)w_emb, 0, 0), NULL, N, C, g->Vp, g->dtype, g->cs.stream);
    prof_end(g);
}

static void cuda_backward(zt_model *m, int b, const void *w, void *gr)
{
    gpt2_cuda *g = (gpt2_cuda *)m;
    ZT_ASSERT(zt__cuda_pass_backward_ready(&g->lay, b)); /* a checkpointed block was rebuilt first */
    const int L = g->cfg.n_layer, B = g->cur_B, T = g->cur_T;
    if (b == 0) {
        backward_embed(g, gr, B, T);
    } else if (b <= L) {
        const int l = b - 1;
        backward_layer(g, l, (void *)w, gr, l > 0 ? g->layers[l - 1].res3 : g->encoded, B, T);
    } else {
        backward_lnf(g, (void *)w, gr, B, T);
    }
}

/* The mean loss of micro-batch `micro` (its losses came back with the stream, which the caller waited
 * for). */
static float cuda_loss(const zt_model *m, int micro)
{
    const gpt2_cuda *g = (const gpt2_cuda *)m;
    const size_t N = (size_t)g->cur_B * g->cur_T;
    return zt__cuda_mean_loss(g->cs.h_losses + (size_t)micro * N, N, g->n_valid[micro]);
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
    .set_profiling = zt_gpt2_cuda_set_profiling,
    .profile_report = zt_gpt2_cuda_profile_report,
};
