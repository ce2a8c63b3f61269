/* GPT-2 on one CUDA GPU (see gpt2_cuda.h): device layout, memory pool, block-wise forward and backward
 * over the CUDA kernels, the fused optimizer step, and a profiling mode that times kernel families. */
#include "worker/models/gpt2_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "common/units.h"
#include "kernels/activation.h"      /* (gelu is fused into the matmul epilogue) */
#include "kernels/adamw.h"           /* zt_cuda_adamw_update */
#include "kernels/attention.h"       /* zt_cuda_attention_forward / backward */
#include "kernels/crossentropy.h"    /* zt_cuda_crossentropy_forward_backward: the fused classifier */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, casts, inf/NaN check, gradient accumulation */
#include "kernels/embedding.h"       /* zt_cuda_embedding_forward / backward */
#include "kernels/layernorm.h"       /* zt_cuda_layernorm_forward / backward */
#include "kernels/matmul.h"          /* cuBLASLt GEMMs with bias / GELU / residual epilogues */
#include "kernels/norm.h"            /* global norm and clip coefficient */

/* Per-layer tensor order of the host layout (worker/models/gpt2.c). */
enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, LT_N };
#define LAYER_TENSOR(l, k) (2 + (l) * LT_N + (k))

#define ALIGN_ELEMS 64     /* every tensor starts on a 64-element boundary of the device slabs */
#define VOCAB_PAD 128      /* wte rows on the device: the vocabulary rounded up to this */
#define POOL_ALIGN 256     /* bytes */
#define PROF_EVENTS 8192

/* Kernel families timed in profiling mode. */
enum prof_family {
    PF_EMBED, PF_LAYERNORM, PF_MM_QKV, PF_ATTN, PF_MM_ATTPROJ, PF_MM_FC, PF_MM_FCPROJ, PF_HEAD,
    PF_CLASSIFIER, PF_B_HEAD, PF_B_LAYERNORM, PF_B_MM_FCPROJ, PF_B_MM_FC, PF_B_MM_ATTPROJ, PF_B_ATTN, PF_B_MM_QKV,
    PF_B_EMBED, PF_MEMSET, PF_GRAD_ACCUM, PF_OPTIMIZER, PF_COUNT
};
static const char *const prof_names[PF_COUNT] = {
    "fwd embedding", "fwd layernorm", "fwd matmul qkv", "fwd attention", "fwd matmul attn proj",
    "fwd matmul fc+gelu", "fwd matmul fc proj", "fwd head matmul", "classifier (fwd+bwd)", "bwd head matmul",
    "bwd layernorm", "bwd matmul fc proj+dgelu", "bwd matmul fc", "bwd matmul attn proj", "bwd attention",
    "bwd matmul qkv", "bwd embedding", "memsets", "grad accumulate fp32", "norm+clip+adamw"};

typedef struct layer_acts {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3; /* dtype */
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
} layer_acts;

struct zt_gpt2_cuda {
    zt_gpt2 *host;
    zt_gpt2_config cfg;
    enum zt_dtype dtype;
    enum zt_gpt2_cuda_state state;
    zt_gpt2_cuda_hooks hooks; /* HOOKED: where the weights and gradients of each block come from */
    bool *ckpt;              /* [n_layer]: layers whose activations are recomputed in backward, or NULL */
    layer_acts shared;       /* the activations that checkpointed layers share (not res3) */
    size_t esize;            /* bytes per dtype element */
    int max_B, max_T, max_micro, Vp;
    cudaStream_t stream;
    zt_cuda_blas *blas;

    /* Layout: device offset and length (elements) of every tensor and block. */
    int num_tensors, num_blocks;
    size_t *toff, *tlen;
    size_t *boff, *blen;
    size_t n;                /* elements of every slab */

    /* The pool and what is carved from it. */
    void *pool;
    size_t pool_bytes;
    float *master, *grads, *m, *v; /* fp32 [n]; NO_OPTIMIZER: no m, v, and master only for fp32 compute */
    void *wlow, *glow;       /* dtype [n]; equal to master / grads for F32 */
    layer_acts *layers;
    void *encoded, *lnf, *logits, *dres, *dln, *datty, *dqkv, *dfch;
    float *lnf_mean, *lnf_rstd, *losses;
    int32_t *d_tokens, *d_targets;
    void *attn_scratch, *emb_scratch, *ln_scratch;
    float *norm_partials, *d_sumsq, *d_clip;
    int *d_flag;

    /* Pinned host staging. */
    int32_t *h_io[2];        /* two slots of tokens then targets [2 * max_B * max_T] */
    cudaEvent_t io_done[2];
    float *h_losses;         /* [max_micro * max_B * max_T] */
    float *h_result;         /* [0] = sum of squares, [1] = flag (as int bits) */
    int n_valid[1024];       /* per micro-batch of the current step (max_micro <= 1024) */
    int cur_B, cur_T;
    bool first_micro;
    /* FULL mode in bf16/fp16: a step's first micro-batch leaves its gradients in glow unfolded. If the step
     * has no second one, the norm and AdamW read them there (scaled by deferred_inv_scale), which saves
     * the fold; otherwise the next micro-batch (or a download) folds them first. */
    bool fold_deferred;
    float deferred_inv_scale;

    zt_cuda_adamw_tensor *adam;      /* [num_tensors] */
    zt_cuda_adamw_tensor *adam_lowg; /* [num_tensors]: the same with the gradients in glow (FULL, bf16/fp16) */

    /* Profiling. */
    bool profiling;
    cudaEvent_t *prof_ev;    /* [PROF_EVENTS] */
    int *prof_fam;           /* [PROF_EVENTS / 2] */
    int prof_used;
    double prof_ms[PF_COUNT];
    int prof_open;
};

static void fold_deferred_grads(zt_gpt2_cuda *g);

/* ---- profiling ---- */

static void prof_flush(zt_gpt2_cuda *g)
{
    if (g->prof_used == 0)
        return;
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    for (int i = 0; i < g->prof_used; i++) {
        float ms = 0.0f;
        ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, g->prof_ev[2 * i], g->prof_ev[2 * i + 1]));
        g->prof_ms[g->prof_fam[i]] += ms;
    }
    g->prof_used = 0;
}

static void prof_begin(zt_gpt2_cuda *g, int fam)
{
    if (!g->profiling)
        return;
    if (g->prof_used == PROF_EVENTS / 2)
        prof_flush(g);
    g->prof_fam[g->prof_used] = fam;
    ZT_CUDA_CHECK(cudaEventRecord(g->prof_ev[2 * g->prof_used], g->stream));
    g->prof_open = 1;
}

static void prof_end(zt_gpt2_cuda *g)
{
    if (!g->profiling || !g->prof_open)
        return;
    ZT_CUDA_CHECK(cudaEventRecord(g->prof_ev[2 * g->prof_used + 1], g->stream));
    g->prof_used++;
    g->prof_open = 0;
}

/* Turns profiling on or off (creating the events the first time). */
void zt_gpt2_cuda_set_profiling(zt_gpt2_cuda *g, bool on)
{
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
void zt_gpt2_cuda_profile_report(zt_gpt2_cuda *g)
{
    prof_flush(g);
    double total = 0.0;
    for (int i = 0; i < PF_COUNT; i++)
        total += g->prof_ms[i];
    for (int i = 0; i < PF_COUNT; i++)
        if (g->prof_ms[i] > 0)
            zt_log(ZT_LOG_INFO, "profile: %-26s %10.2f ms  %5.1f%%", prof_names[i], g->prof_ms[i],
                   total > 0 ? 100.0 * g->prof_ms[i] / total : 0.0);
    zt_log(ZT_LOG_INFO, "profile: %-26s %10.2f ms", "total", total);
    memset(g->prof_ms, 0, sizeof g->prof_ms);
}

/* ---- creation ---- */

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* Hands out `bytes` from the pool at base (or only counts them when base is NULL). */
static void *take(char *base, size_t *used, size_t bytes)
{
    void *p = base ? base + *used : NULL;
    *used += round_up(bytes, POOL_ALIGN);
    return p;
}

/* Carves every device buffer from base; returns the bytes used. With base NULL only counts. plan, when
 * not NULL, receives the bytes of: params+grads fp32, Adam, low precision copies, activations, scratch. */
static size_t carve(zt_gpt2_cuda *g, char *base, size_t plan[5])
{
    const size_t N = (size_t)g->max_B * g->max_T, C = (size_t)g->cfg.n_embd, NH = (size_t)g->cfg.n_head;
    const size_t e = g->esize, NC = N * C;
    size_t used = 0, mark;
    const bool f32 = g->dtype == ZT_DTYPE_F32, full = g->state == ZT_GPT2_CUDA_FULL;
    const bool hooked = g->state == ZT_GPT2_CUDA_HOOKED; /* no parameters or gradients of its own */

    g->master = (full || f32) && !hooked ? take(base, &used, g->n * 4) : NULL;
    g->grads = hooked ? NULL : take(base, &used, g->n * 4);
    if (plan)
        plan[0] = used;
    mark = used;
    g->m = full ? take(base, &used, g->n * 4) : NULL;
    g->v = full ? take(base, &used, g->n * 4) : NULL;
    if (plan)
        plan[1] = used - mark;
    mark = used;
    g->wlow = hooked ? NULL : f32 ? (void *)g->master : take(base, &used, g->n * e);
    g->glow = hooked ? NULL : f32 ? (void *)g->grads : take(base, &used, g->n * e);
    if (plan)
        plan[2] = used - mark;
    mark = used;
    g->encoded = take(base, &used, NC * e);
    bool any_ckpt = false;
    for (int l = 0; l < g->cfg.n_layer && g->ckpt; l++)
        any_ckpt |= g->ckpt[l];
    for (int l = -1; l < g->cfg.n_layer; l++) {
        /* l = -1: the set that checkpointed layers share; a checkpointed layer keeps only its output */
        if (l < 0 && !any_ckpt)
            continue;
        layer_acts *a = l < 0 ? &g->shared : &g->layers[l];
        if (l >= 0 && g->ckpt && g->ckpt[l]) {
            *a = g->shared;
            a->res3 = take(base, &used, NC * e);
            continue;
        }
        a->ln1 = take(base, &used, NC * e);
        a->ln1_mean = take(base, &used, N * 4);
        a->ln1_rstd = take(base, &used, N * 4);
        a->qkv = take(base, &used, 3 * NC * e);
        a->atty = take(base, &used, NC * e);
        a->lse = take(base, &used, N * NH * 4);
        a->res2 = take(base, &used, NC * e);
        a->ln2 = take(base, &used, NC * e);
        a->ln2_mean = take(base, &used, N * 4);
        a->ln2_rstd = take(base, &used, N * 4);
        a->fch = take(base, &used, 4 * NC * e);
        a->fch_gelu = take(base, &used, 4 * NC * e);
        a->res3 = take(base, &used, NC * e);
    }
    g->lnf = take(base, &used, NC * e);
    g->lnf_mean = take(base, &used, N * 4);
    g->lnf_rstd = take(base, &used, N * 4);
    g->logits = take(base, &used, N * (size_t)g->Vp * e);
    g->losses = take(base, &used, N * 4);
    g->dres = take(base, &used, NC * e);
    g->dln = take(base, &used, NC * e);
    g->datty = take(base, &used, NC * e);
    g->dqkv = take(base, &used, 3 * NC * e);
    g->dfch = take(base, &used, 4 * NC * e);
    if (plan)
        plan[3] = used - mark;
    mark = used;
    g->d_tokens = take(base, &used, N * 4);
    g->d_targets = take(base, &used, N * 4);
    g->attn_scratch = take(base, &used, zt_cuda_attention_backward_scratch_size(g->max_B, g->max_T, (int)NH));
    g->emb_scratch =
        take(base, &used, zt_cuda_embedding_backward_scratch_size(g->max_B, g->max_T, g->cfg.vocab_size));
    g->ln_scratch = take(base, &used, zt_cuda_layernorm_backward_scratch_size((int)N, (int)C));
    g->norm_partials = take(base, &used, ZT_CUDA_NORM_SLOTS * 4);
    g->d_sumsq = take(base, &used, 4);
    g->d_clip = take(base, &used, 4);
    g->d_flag = take(base, &used, 4);
    if (plan)
        plan[4] = used - mark;
    return used;
}

/* Fills the device layout from the host model's tensor table. */
static void build_layout(zt_gpt2_cuda *g)
{
    const int nt = g->num_tensors;
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        const zt_param_info *t = zt_gpt2_tensor(g->host, i);
        g->toff[i] = off;
        g->tlen[i] = i == 0 ? (size_t)g->Vp * (size_t)g->cfg.n_embd : t->numel; /* wte padded */
        off = round_up(off + g->tlen[i], ALIGN_ELEMS);
    }
    g->n = off;
    for (int b = 0; b < g->num_blocks; b++) {
        int first = -1, last = -1;
        for (int i = 0; i < nt; i++)
            if (zt_gpt2_tensor(g->host, i)->block == b) {
                if (first < 0)
                    first = i;
                last = i;
            }
        ZT_ASSERT(first >= 0);
        g->boff[b] = g->toff[first];
        g->blen[b] = round_up(g->toff[last] + g->tlen[last], ALIGN_ELEMS) - g->toff[first];
    }
}

static size_t dtype_size(enum zt_dtype d)
{
    return d == ZT_DTYPE_F32 ? 4 : 2;
}

static const char *dtype_name(enum zt_dtype d)
{
    return d == ZT_DTYPE_F32 ? "fp32" : d == ZT_DTYPE_BF16 ? "bf16" : "fp16";
}

/* Creates the device model holding everything; see gpt2_cuda.h. */
int zt_gpt2_cuda_create(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        zt_err *err)
{
    return zt_gpt2_cuda_create_state(out, host, B, T, max_micro, dtype, ZT_GPT2_CUDA_FULL, err);
}

static int create(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                  enum zt_gpt2_cuda_state state, const zt_gpt2_cuda_hooks *hooks, const bool *checkpointed,
                  zt_err *err);

/* Creates the device model; see gpt2_cuda.h. */
int zt_gpt2_cuda_create_state(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                              enum zt_gpt2_cuda_state state, zt_err *err)
{
    ZT_ASSERT(state != ZT_GPT2_CUDA_HOOKED);
    return create(out, host, B, T, max_micro, dtype, state, NULL, NULL, err);
}

/* Creates the device model that asks a runtime for weights and gradient buffers; see gpt2_cuda.h. */
int zt_gpt2_cuda_create_hooked(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                               const zt_gpt2_cuda_hooks *hooks, const bool *checkpointed, zt_err *err)
{
    ZT_ASSERT(hooks && hooks->acquire_weights && hooks->release_weights && hooks->grad_buffer && hooks->grads_done);
    return create(out, host, B, T, max_micro, dtype, ZT_GPT2_CUDA_HOOKED, hooks, checkpointed, err);
}

static int create(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                  enum zt_gpt2_cuda_state state, const zt_gpt2_cuda_hooks *hooks, const bool *checkpointed,
                  zt_err *err)
{
    int rc = 0;
    const zt_gpt2_config *cfg = zt_gpt2_get_config(host);
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_BF16 && dtype != ZT_DTYPE_F16)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA model computes in fp32, bf16 or fp16 only");
    if (!zt_cuda_attention_supported(cfg->n_embd, cfg->n_head))
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA attention kernels serve head sizes 64 and 128; this model has %d / %d = %d (choose "
                       "n_embd / n_head = 64 or 128, or train with --device cpu)",
                       cfg->n_embd, cfg->n_head, cfg->n_embd / cfg->n_head);
    if (cfg->n_embd % 8 != 0 || cfg->n_embd > 6144)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need n_embd to be a multiple of 8 and at most 6144 (it is %d); train "
                       "with --device cpu",
                       cfg->n_embd);
    if (max_micro < 1 || max_micro > 1024)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is out of range for the CUDA trainer (1..1024)",
                       max_micro);
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        cudaGetLastError();
        return zt_fail(err, ZT_EUNSUPPORTED, "no CUDA GPU is visible (train with --device cpu)");
    }

    zt_gpt2_cuda *g = zt_xcalloc(1, sizeof *g);
    g->host = host;
    g->cfg = *cfg;
    g->dtype = dtype;
    g->state = state;
    if (hooks)
        g->hooks = *hooks;
    if (checkpointed) {
        g->ckpt = zt_xcalloc((size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1), sizeof(bool));
        memcpy(g->ckpt, checkpointed, (size_t)cfg->n_layer * sizeof(bool));
    }
    g->esize = dtype_size(dtype);
    g->max_B = B;
    g->max_T = T;
    g->max_micro = max_micro;
    g->Vp = (int)round_up((size_t)cfg->vocab_size, VOCAB_PAD);
    g->num_tensors = zt_gpt2_num_tensors(host);
    g->num_blocks = zt_gpt2_num_blocks(host);
    g->toff = zt_xcalloc((size_t)g->num_tensors, sizeof(size_t));
    g->tlen = zt_xcalloc((size_t)g->num_tensors, sizeof(size_t));
    g->boff = zt_xcalloc((size_t)g->num_blocks, sizeof(size_t));
    g->blen = zt_xcalloc((size_t)g->num_blocks, sizeof(size_t));
    g->layers = zt_xcalloc((size_t)cfg->n_layer, sizeof(layer_acts));
    g->adam = zt_xcalloc((size_t)g->num_tensors, sizeof(zt_cuda_adamw_tensor));
    g->adam_lowg = zt_xcalloc((size_t)g->num_tensors, sizeof(zt_cuda_adamw_tensor));
    build_layout(g);

    ZT_CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    if ((rc = zt_cuda_blas_create(&g->blas, 0, err)) < 0)
        goto fail;

    size_t plan[5];
    g->pool_bytes = carve(g, NULL, plan);
    size_t free_b = 0, total_b = 0;
    ZT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    char sz[5][32], need[32], avail[32];
    for (int i = 0; i < 5; i++)
        zt_format_size(plan[i], sz[i], sizeof sz[i]);
    zt_format_size(g->pool_bytes, need, sizeof need);
    zt_format_size(free_b, avail, sizeof avail);
    if (state == ZT_GPT2_CUDA_HOOKED)
        zt_log(ZT_LOG_INFO, "gpu: %s compute, weights and gradients from the ZeRO runtime; model memory %s of %s "
               "free: activations %s (batch %d x %d), scratch %s", dtype_name(dtype), need, avail, sz[3], B, T,
               sz[4]);
    else if (state == ZT_GPT2_CUDA_FULL)
        zt_log(ZT_LOG_INFO, "gpu: %s compute; memory plan %s of %s free: fp32 params+grads %s, Adam m+v %s, %s "
               "weights+grads %s, activations %s (batch %d x %d), scratch %s",
               dtype_name(dtype), need, avail, sz[0], sz[1], dtype_name(dtype), sz[2], sz[3], B, T, sz[4]);
    else
        zt_log(ZT_LOG_INFO, "gpu: %s compute, optimizer state on the host; memory plan %s of %s free: fp32 grads%s %s, "
               "%s weights+grads %s, activations %s (batch %d x %d), scratch %s",
               dtype_name(dtype), need, avail, dtype == ZT_DTYPE_F32 ? "+weights" : "", sz[0], dtype_name(dtype),
               sz[2], sz[3], B, T, sz[4]);
    if (cudaMalloc(&g->pool, g->pool_bytes) != cudaSuccess) {
        cudaGetLastError();
        rc = zt_fail(err, ZT_ENOMEM, "the GPU has %s free but the model needs %s (lower the batch size or "
                     "sequence length, use grad_accum for the same tokens per step, or a smaller model)",
                     avail, need);
        goto fail;
    }
    ZT_ASSERT(carve(g, g->pool, NULL) == g->pool_bytes);
    ZT_CUDA_CHECK(cudaMemsetAsync(g->pool, 0, g->pool_bytes, g->stream));

    const size_t N = (size_t)B * T;
    ZT_CUDA_CHECK(cudaMallocHost((void **)&g->h_io[0], 4 * N * sizeof(int32_t)));
    g->h_io[1] = g->h_io[0] + 2 * N;
    ZT_CUDA_CHECK(cudaMallocHost((void **)&g->h_losses, (size_t)max_micro * N * sizeof(float)));
    ZT_CUDA_CHECK(cudaMallocHost((void **)&g->h_result, 4 * sizeof(float)));
    for (int i = 0; i < 2; i++)
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&g->io_done[i], cudaEventDisableTiming));

    for (int i = 0; i < g->num_tensors && state == ZT_GPT2_CUDA_FULL; i++) {
        const zt_param_info *t = zt_gpt2_tensor(host, i);
        zt_cuda_adamw_tensor *a = &g->adam[i];
        a->param = g->master + g->toff[i];
        a->m = g->m + g->toff[i];
        a->v = g->v + g->toff[i];
        a->grad = g->grads + g->toff[i];
        a->param_lowp = dtype == ZT_DTYPE_F32 ? NULL : (char *)g->wlow + g->toff[i] * g->esize;
        a->n = g->tlen[i];
        a->weight_decay = t->weight_decay ? 1 : 0;
        g->adam_lowg[i] = *a;
        if (dtype != ZT_DTYPE_F32)
            g->adam_lowg[i].grad = (char *)g->glow + g->toff[i] * g->esize;
    }
    if (state == ZT_GPT2_CUDA_FULL)
        zt_gpt2_cuda_upload(g, zt_gpt2_params(host), NULL, NULL);
    else if (state == ZT_GPT2_CUDA_NO_OPTIMIZER)
        zt_gpt2_cuda_upload_weights(g, zt_gpt2_params(host), ZT_DTYPE_F32);
    else
        ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream)); /* the pool's zeroing */
    g->first_micro = true;
    *out = g;
    return 0;

fail:
    zt_gpt2_cuda_destroy(g);
    return rc;
}

/* Frees the device model; accepts NULL. */
void zt_gpt2_cuda_destroy(zt_gpt2_cuda *g)
{
    if (!g)
        return;
    if (g->stream)
        ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (g->prof_ev) {
        for (int i = 0; i < PROF_EVENTS; i++)
            cudaEventDestroy(g->prof_ev[i]);
        free(g->prof_ev);
        free(g->prof_fam);
    }
    for (int i = 0; i < 2; i++)
        if (g->io_done[i])
            cudaEventDestroy(g->io_done[i]);
    cudaFreeHost(g->h_io[0]);
    cudaFreeHost(g->h_losses);
    cudaFreeHost(g->h_result);
    cudaFree(g->pool);
    zt_cuda_blas_destroy(g->blas);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g->toff);
    free(g->tlen);
    free(g->boff);
    free(g->blen);
    free(g->layers);
    free(g->adam);
    free(g->adam_lowg);
    free(g->ckpt);
    free(g);
}

/* Returns the compute type. */
enum zt_dtype zt_gpt2_cuda_dtype(const zt_gpt2_cuda *g)
{
    return g->dtype;
}

/* Element i of a dtype buffer. */
static void *at(const zt_gpt2_cuda *g, void *base, size_t i)
{
    return (char *)base + i * g->esize;
}

/* Copies one host slab (host layout) into a device fp32 slab (device layout). */
static void upload_slab(zt_gpt2_cuda *g, float *dst, const float *src)
{
    for (int i = 0; i < g->num_tensors; i++) {
        const zt_param_info *t = zt_gpt2_tensor(g->host, i);
        ZT_CUDA_CHECK(cudaMemcpyAsync(dst + g->toff[i], src + t->offset, t->numel * sizeof(float),
                                      cudaMemcpyHostToDevice, g->stream));
    }
}

static void download_slab(zt_gpt2_cuda *g, float *dst, const float *src)
{
    for (int i = 0; i < g->num_tensors; i++) {
        const zt_param_info *t = zt_gpt2_tensor(g->host, i);
        ZT_CUDA_CHECK(cudaMemcpyAsync(dst + t->offset, src + g->toff[i], t->numel * sizeof(float),
                                      cudaMemcpyDeviceToHost, g->stream));
    }
}

/* Uploads parameters (and moments) from host slabs and refreshes the low-precision weights. */
void zt_gpt2_cuda_upload(zt_gpt2_cuda *g, const float *params, const float *m, const float *v)
{
    ZT_ASSERT(g->state == ZT_GPT2_CUDA_FULL);
    upload_slab(g, g->master, params);
    if (m && v) {
        upload_slab(g, g->m, m);
        upload_slab(g, g->v, v);
    } else {
        ZT_CUDA_CHECK(cudaMemsetAsync(g->m, 0, g->n * sizeof(float), g->stream));
        ZT_CUDA_CHECK(cudaMemsetAsync(g->v, 0, g->n * sizeof(float), g->stream));
    }
    if (g->dtype != ZT_DTYPE_F32)
        zt_cuda_cast(g->wlow, g->dtype, g->master, ZT_DTYPE_F32, g->n, g->stream);
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
}

/* Downloads the master weights (and moments) into host slabs. */
void zt_gpt2_cuda_download(zt_gpt2_cuda *g, float *params, float *m, float *v)
{
    ZT_ASSERT(g->state == ZT_GPT2_CUDA_FULL);
    download_slab(g, params, g->master);
    if (m)
        download_slab(g, m, g->m);
    if (v)
        download_slab(g, v, g->v);
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
}

/* Downloads the fp32 gradients into a host slab. */
void zt_gpt2_cuda_download_grads(zt_gpt2_cuda *g, float *grads)
{
    ZT_ASSERT(g->state != ZT_GPT2_CUDA_HOOKED);
    fold_deferred_grads(g);
    download_slab(g, grads, g->grads);
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
}

/* Uploads compute weights (or fp32 weights, rounded on the device) from a host slab; NO_OPTIMIZER mode. */
void zt_gpt2_cuda_upload_weights(zt_gpt2_cuda *g, const void *w, enum zt_dtype wdtype)
{
    ZT_ASSERT(g->state == ZT_GPT2_CUDA_NO_OPTIMIZER);
    ZT_ASSERT(wdtype == ZT_DTYPE_F32 || wdtype == g->dtype);
    const size_t wsize = dtype_size(wdtype);
    /* fp32 weights for a low-precision model go through the fp32 gradient slab, tensor by tensor, so that
     * the padding between tensors (and wte's padded rows) stays zero in the weights. */
    const bool staged = wdtype != g->dtype;
    for (int i = 0; i < g->num_tensors; i++) {
        const zt_param_info *t = zt_gpt2_tensor(g->host, i);
        const char *src = (const char *)w + t->offset * wsize;
        void *dst = staged ? (void *)(g->grads + g->toff[i]) : at(g, g->wlow, g->toff[i]);
        ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, t->numel * wsize, cudaMemcpyHostToDevice, g->stream));
        if (staged)
            zt_cuda_cast(at(g, g->wlow, g->toff[i]), g->dtype, g->grads + g->toff[i], ZT_DTYPE_F32, t->numel,
                         g->stream);
    }
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
}

/* Marks the start of a step's gradient accumulation. */
void zt_gpt2_cuda_zero_grad(zt_gpt2_cuda *g)
{
    g->first_micro = true;
    g->fold_deferred = false;
}

/* ---- forward and backward, block by block ---- */


/* Tensor idx inside block b's buffer (weights or gradients), given the block's base pointer. The
 * runtime can later hand a gathered copy of the block instead of the slab range. */
static void *in_block(const zt_gpt2_cuda *g, void *block_base, int b, int idx)
{
    return at(g, block_base, g->toff[idx] - g->boff[b]);
}

static void *block_weights(const zt_gpt2_cuda *g, int b)
{
    return at(g, g->wlow, g->boff[b]);
}

static void *block_grads(const zt_gpt2_cuda *g, int b)
{
    return at(g, g->glow, g->boff[b]);
}

/* Block b's weights for the next kernels: the runtime's gathered copy in HOOKED mode (acquired until
 * put_weights), else the block's range of the weight slab. */
static void *get_weights(zt_gpt2_cuda *g, int b)
{
    return g->state == ZT_GPT2_CUDA_HOOKED ? g->hooks.acquire_weights(g->hooks.ctx, b) : block_weights(g, b);
}

static void put_weights(zt_gpt2_cuda *g, int b)
{
    if (g->state == ZT_GPT2_CUDA_HOOKED)
        g->hooks.release_weights(g->hooks.ctx, b);
}

/* Where block b's backward writes its gradients: the runtime's buffer in HOOKED mode, else the block's
 * range of the gradient slab. */
static void *get_grads(zt_gpt2_cuda *g, int b)
{
    return g->state == ZT_GPT2_CUDA_HOOKED ? g->hooks.grad_buffer(g->hooks.ctx, b) : block_grads(g, b);
}

static void zero(zt_gpt2_cuda *g, void *p, size_t elems)
{
    prof_begin(g, PF_MEMSET);
    ZT_CUDA_CHECK(cudaMemsetAsync(p, 0, elems * g->esize, g->stream));
    prof_end(g);
}

/* Block 0 forward: token and position embeddings. */
static void forward_embed(zt_gpt2_cuda *g, const void *w, int B, int T)
{
    prof_begin(g, PF_EMBED);
    zt_cuda_embedding_forward(g->encoded, g->d_tokens, in_block(g, (void *)w, 0, 0), in_block(g, (void *)w, 0, 1),
                              B, T, g->cfg.n_embd, g->dtype, g->stream);
    prof_end(g);
}

/* Block 1+l forward: one transformer layer from x into layers[l].res3. */
static void forward_layer(zt_gpt2_cuda *g, int l, void *w, const void *x, int B, int T)
{
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, N = B * T, b = 1 + l;
    const float eps = g->cfg.layer_norm_epsilon;
    const enum zt_dtype dt = g->dtype;
    layer_acts *a = &g->layers[l];
    cudaStream_t s = g->stream;
#define W(k) in_block(g, w, b, LAYER_TENSOR(l, k))
    prof_begin(g, PF_LAYERNORM);
    zt_cuda_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, W(LN1_W), W(LN1_B), N, C, eps, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_QKV);
    zt_cuda_matmul_forward(g->blas, a->qkv, NULL, a->ln1, W(QKV_W), W(QKV_B), N, C, 3 * C, dt, s);
    prof_end(g);
    prof_begin(g, PF_ATTN);
    zt_cuda_attention_forward(a->atty, a->lse, a->qkv, B, T, C, NH, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_ATTPROJ);
    zt_cuda_matmul_forward_residual(g->blas, a->res2, a->atty, W(ATTPROJ_W), W(ATTPROJ_B), x, N, C, C, dt, s);
    prof_end(g);
    prof_begin(g, PF_LAYERNORM);
    zt_cuda_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(LN2_W), W(LN2_B), N, C, eps, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_FC);
    zt_cuda_matmul_forward(g->blas, a->fch_gelu, a->fch, a->ln2, W(FC_W), W(FC_B), N, C, 4 * C, dt, s);
    prof_end(g);
    prof_begin(g, PF_MM_FCPROJ);
    zt_cuda_matmul_forward_residual(g->blas, a->res3, a->fch_gelu, W(FCPROJ_W), W(FCPROJ_B), a->res2, N, 4 * C, C, dt,
                                    s);
    prof_end(g);
#undef W
}

/* The residual stream after the last layer (the input of ln_f). */
static void *last_residual(zt_gpt2_cuda *g)
{
    return g->cfg.n_layer > 0 ? g->layers[g->cfg.n_layer - 1].res3 : g->encoded;
}

/* Block L+1 forward (ln_f) and the tied head (block 0's wte): logits, then the fused classifier, which
 * writes the losses and, when grad_scale is not 0, replaces the logits with their gradient. */
static void forward_head(zt_gpt2_cuda *g, void *w_lnf, void *w_emb, int B, int T, bool with_grad, float grad_scale)
{
    const int C = g->cfg.n_embd, N = B * T, L = g->cfg.n_layer, lnf = g->num_tensors - 2;
    prof_begin(g, PF_LAYERNORM);
    zt_cuda_layernorm_forward(g->lnf, g->lnf_mean, g->lnf_rstd, last_residual(g), in_block(g, w_lnf, L + 1, lnf),
                              in_block(g, w_lnf, L + 1, lnf + 1), N, C, g->cfg.layer_norm_epsilon, g->dtype,
                              g->stream);
    prof_end(g);
    prof_begin(g, PF_HEAD);
    zt_cuda_matmul_forward(g->blas, g->logits, NULL, g->lnf, in_block(g, w_emb, 0, 0), NULL, N, C, g->Vp, g->dtype,
                           g->stream);
    prof_end(g);
    prof_begin(g, PF_CLASSIFIER);
    zt_cuda_crossentropy_forward_backward(g->losses, with_grad ? g->logits : NULL, g->logits, g->d_targets, N,
                                          g->cfg.vocab_size, g->Vp, -1, grad_scale, NULL, g->dtype, g->stream);
    prof_end(g);
}

/* Backward of the head and ln_f: gradients into wte (block 0) and ln_f (block L+1); dres receives the
 * gradient of the last residual stream. */
static void backward_head(zt_gpt2_cuda *g, void *w_lnf, void *g_lnf, void *w_emb, void *g_emb, int B, int T)
{
    const int C = g->cfg.n_embd, N = B * T, L = g->cfg.n_layer, lnf = g->num_tensors - 2;
    const size_t NC = (size_t)N * C;
    prof_begin(g, PF_B_HEAD);
    zt_cuda_matmul_backward_overwrite(g->blas, g->dln, in_block(g, g_emb, 0, 0), NULL, g->logits, g->lnf,
                                      in_block(g, w_emb, 0, 0), NULL, N, C, g->Vp, g->dtype, g->stream);
    prof_end(g);
    zero(g, g->dres, NC);
    prof_begin(g, PF_B_LAYERNORM);
    zt_cuda_layernorm_backward(g->dres, in_block(g, g_lnf, L + 1, lnf), in_block(g, g_lnf, L + 1, lnf + 1), g->dln,
                               last_residual(g), in_block(g, w_lnf, L + 1, lnf), g->lnf_mean, g->lnf_rstd, N, C,
                               g->ln_scratch, g->dtype, g->stream);
    prof_end(g);
}

/* Block 1+l backward: dres holds d(layer output) and becomes d(layer input); the layer's weight
 * gradients are added into its block's gradient buffer. */
static void backward_layer(zt_gpt2_cuda *g, int l, void *w, void *gr, const void *x, int B, int T)
{
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, N = B * T, b = 1 + l;
    const enum zt_dtype dt = g->dtype;
    const layer_acts *a = &g->layers[l];
    cudaStream_t s = g->stream;
#define W(k) in_block(g, w, b, LAYER_TENSOR(l, k))
#define G(k) in_block(g, gr, b, LAYER_TENSOR(l, k))
    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); the GELU's backward is fused (dfch overwritten). */
    prof_begin(g, PF_B_MM_FCPROJ);
    zt_cuda_matmul_backward(g->blas, g->dfch, G(FCPROJ_W), G(FCPROJ_B), g->dres, a->fch_gelu, W(FCPROJ_W), a->fch,
                            N, 4 * C, C, dt, s);
    prof_end(g);
    prof_begin(g, PF_B_MM_FC);
    zt_cuda_matmul_backward_overwrite(g->blas, g->dln, G(FC_W), G(FC_B), g->dfch, a->ln2, W(FC_W), NULL, N, C, 4 * C,
                                      dt, s);
    prof_end(g);
    prof_begin(g, PF_B_LAYERNORM);
    zt_cuda_layernorm_backward(g->dres, G(LN2_W), G(LN2_B), g->dln, a->res2, W(LN2_W), a->ln2_mean, a->ln2_rstd, N,
                               C, g->ln_scratch, dt, s);
    prof_end(g);
    /* Attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))). */
    prof_begin(g, PF_B_MM_ATTPROJ);
    zt_cuda_matmul_backward_overwrite(g->blas, g->datty, G(ATTPROJ_W), G(ATTPROJ_B), g->dres, a->atty, W(ATTPROJ_W),
                                      NULL, N, C, C, dt, s);
    prof_end(g);
    prof_begin(g, PF_B_ATTN);
    zt_cuda_attention_backward_overwrite(g->dqkv, g->datty, a->qkv, a->atty, a->lse, B, T, C, NH, g->attn_scratch, dt,
                                         s);
    prof_end(g);
    prof_begin(g, PF_B_MM_QKV);
    zt_cuda_matmul_backward_overwrite(g->blas, g->dln, G(QKV_W), G(QKV_B), g->dqkv, a->ln1, W(QKV_W), NULL, N, C,
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
static void backward_embed(zt_gpt2_cuda *g, void *gr, int B, int T)
{
    prof_begin(g, PF_B_EMBED);
    zt_cuda_embedding_backward(in_block(g, gr, 0, 0), in_block(g, gr, 0, 1), g->dres, g->d_tokens, B, T,
                               g->cfg.n_embd, g->cfg.vocab_size, g->emb_scratch, g->dtype, g->stream);
    prof_end(g);
}

/* Folds the step's first micro-batch's gradients, left in glow (fold_deferred), into the fp32 gradients,
 * all blocks at once; nothing to do when none are waiting. */
static void fold_deferred_grads(zt_gpt2_cuda *g)
{
    if (!g->fold_deferred)
        return;
    prof_begin(g, PF_GRAD_ACCUM);
    zt_cuda_accumulate(g->grads, g->glow, g->dtype, g->n, g->deferred_inv_scale, 1, g->stream);
    prof_end(g);
    g->fold_deferred = false;
}

/* Folds block b's low-precision gradients into the fp32 gradients (nothing to do in fp32 compute); in
 * HOOKED mode tells the runtime that the block's backward is enqueued (it folds and reduces them). */
static void reduce_block_grads(zt_gpt2_cuda *g, int b, float inv_scale)
{
    if (g->state == ZT_GPT2_CUDA_HOOKED) {
        g->hooks.grads_done(g->hooks.ctx, b);
        return;
    }
    if (g->dtype == ZT_DTYPE_F32)
        return;
    if (g->state == ZT_GPT2_CUDA_FULL && g->first_micro)
        return; /* deferred: see fold_deferred */
    prof_begin(g, PF_GRAD_ACCUM);
    zt_cuda_accumulate(g->grads + g->boff[b], block_grads(g, b), g->dtype, g->blen[b], inv_scale,
                       g->first_micro ? 1 : 0, g->stream);
    prof_end(g);
}

/* Stages tokens and targets through a pinned slot and copies them to the device. */
static int stage_batch(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T, int slot)
{
    const size_t N = (size_t)B * T;
    const int V = g->cfg.vocab_size;
    int32_t *h = g->h_io[slot];
    ZT_CUDA_CHECK(cudaEventSynchronize(g->io_done[slot])); /* the slot's previous copy has been made */
    int valid = 0;
    for (size_t i = 0; i < N; i++) {
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < V);
        ZT_ASSERT(targets[i] == -1 || (targets[i] >= 0 && targets[i] < V));
        valid += targets[i] != -1;
    }
    memcpy(h, tokens, N * sizeof(int32_t));
    memcpy(h + N, targets, N * sizeof(int32_t));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_tokens, h, N * sizeof(int32_t), cudaMemcpyHostToDevice, g->stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_targets, h + N, N * sizeof(int32_t), cudaMemcpyHostToDevice, g->stream));
    ZT_CUDA_CHECK(cudaEventRecord(g->io_done[slot], g->stream));
    return valid;
}

/* Runs the forward pass of every block. With keep_head, the weights of ln_f and the tied head stay
 * acquired for the backward (*w_lnf, *w_emb); otherwise they are put back. */
static void forward_all(zt_gpt2_cuda *g, int B, int T, bool with_grad, float grad_scale, bool keep_head,
                        void **w_lnf, void **w_emb)
{
    const int L = g->cfg.n_layer;
    forward_embed(g, get_weights(g, 0), B, T);
    put_weights(g, 0);
    const void *x = g->encoded;
    for (int l = 0; l < L; l++) {
        forward_layer(g, l, get_weights(g, 1 + l), x, B, T);
        put_weights(g, 1 + l);
        x = g->layers[l].res3;
    }
    void *wl = get_weights(g, L + 1), *we = get_weights(g, 0);
    forward_head(g, wl, we, B, T, with_grad, grad_scale);
    if (keep_head) {
        *w_lnf = wl;
        *w_emb = we;
    } else {
        put_weights(g, L + 1);
        put_weights(g, 0);
    }
}

/* One training micro-batch; see gpt2_cuda.h. */
void zt_gpt2_cuda_train_micro(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T,
                              int micro, float grad_weight, float loss_scale)
{
    ZT_ASSERT(B >= 1 && B <= g->max_B && T >= 1 && T <= g->max_T);
    ZT_ASSERT(micro >= 0 && micro < g->max_micro);
    ZT_ASSERT(g->dtype != ZT_DTYPE_F32 || loss_scale == 1.0f);
    const int L = g->cfg.n_layer, N = B * T;
    if (micro == 0)
        ZT_CUDA_CHECK(cudaMemsetAsync(g->d_flag, 0, sizeof(int), g->stream));
    if (!g->first_micro)
        fold_deferred_grads(g); /* before glow is zeroed for this micro-batch */
    int valid = stage_batch(g, tokens, targets, B, T, micro & 1);
    g->n_valid[micro] = valid;
    g->cur_B = B;
    g->cur_T = T;

    const float grad_scale = valid > 0 ? loss_scale * grad_weight / (float)valid : 0.0f;
    void *w_lnf = NULL, *w_emb = NULL;
    forward_all(g, B, T, true, grad_scale, true, &w_lnf, &w_emb);
    zt_cuda_check_finite(g->d_flag, g->losses, (size_t)N, ZT_DTYPE_F32, g->stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->h_losses + (size_t)micro * N, g->losses, (size_t)N * sizeof(float),
                                  cudaMemcpyDeviceToHost, g->stream));

    /* Backward. In fp32 compute the kernels add straight into the fp32 gradients; otherwise into the
     * low-precision gradients, zeroed here, which each block then folds into fp32. */
    const float inv_scale = 1.0f / loss_scale;
    if (g->state == ZT_GPT2_CUDA_HOOKED) {
        /* the runtime hands out zeroed gradient buffers */
    } else if (g->dtype == ZT_DTYPE_F32) {
        if (g->first_micro) {
            prof_begin(g, PF_MEMSET);
            ZT_CUDA_CHECK(cudaMemsetAsync(g->grads, 0, g->n * sizeof(float), g->stream));
            prof_end(g);
        }
    } else {
        zero(g, g->glow, g->n);
    }
    backward_head(g, w_lnf, get_grads(g, L + 1), w_emb, get_grads(g, 0), B, T);
    put_weights(g, L + 1);
    put_weights(g, 0);
    reduce_block_grads(g, L + 1, inv_scale);
    for (int l = L - 1; l >= 0; l--) {
        const void *x = l > 0 ? g->layers[l - 1].res3 : g->encoded;
        void *w = get_weights(g, 1 + l);
        if (g->ckpt && g->ckpt[l])
            forward_layer(g, l, w, x, B, T); /* recompute the activations from the kept input */
        backward_layer(g, l, w, get_grads(g, 1 + l), x, B, T);
        put_weights(g, 1 + l);
        reduce_block_grads(g, 1 + l, inv_scale);
    }
    backward_embed(g, get_grads(g, 0), B, T);
    reduce_block_grads(g, 0, inv_scale);
    if (g->state == ZT_GPT2_CUDA_FULL && g->dtype != ZT_DTYPE_F32 && g->first_micro) {
        g->fold_deferred = true;
        g->deferred_inv_scale = inv_scale;
    }
    g->first_micro = false;
}

/* Queues norm, clip, the non-finite check and AdamW; see gpt2_cuda.h. */
void zt_gpt2_cuda_step_update(zt_gpt2_cuda *g, const zt_adamw_params *p, float grad_clip)
{
    ZT_ASSERT(g->state == ZT_GPT2_CUDA_FULL);
    /* One micro-batch in bf16/fp16: its gradients are still in glow, with the loss scale applied; the norm
     * and AdamW read them there and remove the scale themselves (no fold into the fp32 gradients). With a
     * power-of-two loss scale the norm, the clip coefficient and the update are the same bits as with the
     * fold (the norm kernel sums fp16/bf16 in the fp32 order; scaling by 2^k is exact); any other scale
     * takes the fold. */
    int exp2;
    if (g->fold_deferred && frexpf(g->deferred_inv_scale, &exp2) != 0.5f)
        fold_deferred_grads(g);
    const bool lowg = g->fold_deferred;
    const float inv = lowg ? g->deferred_inv_scale : 1.0f;
    zt_adamw_params pl = *p;
    pl.grad_scale = p->grad_scale * inv;
    prof_begin(g, PF_OPTIMIZER);
    ZT_CUDA_CHECK(cudaMemsetAsync(g->norm_partials, 0, ZT_CUDA_NORM_SLOTS * sizeof(float), g->stream));
    zt_cuda_sum_squares_accumulate(g->norm_partials, lowg ? g->glow : (void *)g->grads, g->n,
                                   lowg ? g->dtype : ZT_DTYPE_F32, g->stream);
    zt_cuda_sum_squares_finish(g->d_sumsq, g->norm_partials, g->stream);
    if (inv != 1.0f)
        zt_cuda_scale_inplace(g->d_sumsq, inv * inv, 1, ZT_DTYPE_F32, g->stream);
    zt_cuda_check_finite(g->d_flag, g->d_sumsq, 1, ZT_DTYPE_F32, g->stream);
    zt_cuda_clip_scale(g->d_clip, g->d_sumsq, grad_clip, g->stream);
    zt_cuda_adamw_update(lowg ? g->adam_lowg : g->adam, g->num_tensors, &pl, lowg ? g->dtype : ZT_DTYPE_F32,
                         g->dtype, g->d_clip, g->d_flag, g->stream);
    prof_end(g);
    ZT_CUDA_CHECK(cudaMemcpyAsync(&g->h_result[0], g->d_sumsq, sizeof(float), cudaMemcpyDeviceToHost, g->stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(&g->h_result[1], g->d_flag, sizeof(int), cudaMemcpyDeviceToHost, g->stream));
}

/* Waits for the step and reports loss, norm and the non-finite flag; see gpt2_cuda.h. */
void zt_gpt2_cuda_step_finish(zt_gpt2_cuda *g, int micros, float *loss, double *grad_norm, bool *nonfinite)
{
    *loss = zt_gpt2_cuda_step_loss(g, micros);
    *grad_norm = sqrt((double)g->h_result[0]);
    int flag;
    memcpy(&flag, &g->h_result[1], sizeof flag);
    *nonfinite = flag != 0;
}

/* Waits for the step's micro-batches and returns their mean loss; see gpt2_cuda.h. */
float zt_gpt2_cuda_step_loss(zt_gpt2_cuda *g, int micros)
{
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    const size_t N = (size_t)g->cur_B * g->cur_T;
    double total = 0.0;
    for (int k = 0; k < micros; k++) {
        if (g->n_valid[k] == 0)
            continue;
        double sum = 0.0;
        const float *l = g->h_losses + (size_t)k * N;
        for (size_t i = 0; i < N; i++)
            sum += l[i];
        total += (double)(float)(sum / g->n_valid[k]);
    }
    return (float)(total / micros);
}

/* Mean loss of one batch, forward only. */
float zt_gpt2_cuda_eval_loss(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    zt_gpt2_cuda_eval_enqueue(g, tokens, targets, B, T);
    return zt_gpt2_cuda_eval_read(g);
}

/* Queues the forward pass of an evaluation batch; see gpt2_cuda.h. */
void zt_gpt2_cuda_eval_enqueue(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    ZT_ASSERT(B >= 1 && B <= g->max_B && T >= 1 && T <= g->max_T);
    const int N = B * T;
    g->n_valid[0] = stage_batch(g, tokens, targets, B, T, 0);
    g->cur_B = B;
    g->cur_T = T;
    forward_all(g, B, T, false, 0.0f, false, NULL, NULL);
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->h_losses, g->losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost,
                                  g->stream));
}

/* Waits for the evaluation batch and returns its mean loss; see gpt2_cuda.h. */
float zt_gpt2_cuda_eval_read(zt_gpt2_cuda *g)
{
    ZT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    const int N = g->cur_B * g->cur_T, valid = g->n_valid[0];
    if (valid == 0)
        return 0.0f;
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += g->h_losses[i];
    return (float)(sum / valid);
}

/* The device layout and the stream, for a runtime that supplies the weights; see gpt2_cuda.h. */
void *zt_gpt2_cuda_stream(zt_gpt2_cuda *g)
{
    return g->stream;
}

int *zt_gpt2_cuda_flag(zt_gpt2_cuda *g)
{
    return g->d_flag;
}

size_t zt_gpt2_cuda_block_offset(const zt_gpt2_cuda *g, int b)
{
    return g->boff[b];
}

size_t zt_gpt2_cuda_block_len(const zt_gpt2_cuda *g, int b)
{
    return g->blen[b];
}

size_t zt_gpt2_cuda_tensor_offset(const zt_gpt2_cuda *g, int i)
{
    return g->toff[i];
}

size_t zt_gpt2_cuda_tensor_len(const zt_gpt2_cuda *g, int i)
{
    return g->tlen[i];
}

size_t zt_gpt2_cuda_pool_bytes(const zt_gpt2_cuda *g)
{
    return g->pool_bytes;
}
