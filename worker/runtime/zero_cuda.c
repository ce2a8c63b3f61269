/* The ZeRO runtime on CUDA over NCCL: owned shards on the device, the gathered window with prefetch on a
 * communication stream, gradient folding and reduce-scatter overlapped with the next block's backward,
 * the sharded fused AdamW step, W-independent state export, and the optional timeline (see zero_cuda.h). */
#include "worker/runtime/zero_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "common/units.h"
#include "kernels/adamw.h"            /* zt_cuda_adamw_update: the fused update of the owned pieces */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, casts, the non-finite check, gradient folding */
#include "kernels/norm.h"             /* the sum of squares and the clip coefficient */
#include "worker/models/gpt2_cuda.h"   /* the device model, asked to use this runtime's weights (hooks) */

#define SHARD_ALIGN 64     /* elements: every shard starts on this boundary */
#define POOL_ALIGN 256     /* bytes */
#define TL_MAX_SPANS 16384 /* timeline: spans recorded per step at most */

enum slot_state { SLOT_EMPTY, SLOT_GATHERING, SLOT_HELD, SLOT_CACHED };

typedef struct zslot {
    void *buf;               /* dtype [elems] */
    size_t elems;
    int block;               /* the block it holds (gathered or in flight), or -1 */
    enum slot_state state;
    cudaEvent_t ready;       /* communication stream: the all-gather into it is done */
    cudaEvent_t done;        /* compute stream: its last reader is done */
} zslot;

typedef struct zblk {
    size_t dev_off, len;     /* the block's range in the model's device layout (elements) */
    size_t padded, shard;    /* P_b (a multiple of 64 W) and S_b = P_b / W */
    size_t shard_off;        /* offset of the block's shard in the shard slabs */
    size_t pad_off;          /* offset of the block in the padded accumulation slab (grad_accum > 1) */
    int slot;                /* the window slot holding it, or -1 */
    float *gfull;            /* fp32 [padded] gradient of the step on this rank, while in use */
    void *glow;              /* dtype gradient buffer handed to the model, while in use */
    int gslot;               /* rotating fp32 buffer used (0/1), or -1 */
    cudaEvent_t folded;      /* compute stream: the block's gradients are folded into gfull */
} zblk;

/* Timeline spans: kind 0 = all-gather, 1 = reduce-scatter, 2 = compute. */
typedef struct tl_span {
    int kind, block;
    cudaEvent_t a, b;
} tl_span;

struct zt_zero_cuda {
    zt_gpt2 *host;
    zt_comm *comm;
    zt_zero_options o;
    int W, rank, nb, L;
    enum zt_dtype dtype;
    size_t esize;
    zt_gpt2_cuda *model;
    cudaStream_t cs, ms;     /* compute (the model's) and communication streams */
    zblk *blocks;
    bool *ckpt;              /* [L] checkpointed layers */

    /* One device allocation for everything below. */
    void *pool;
    size_t pool_bytes;
    size_t nshard;           /* sum of S_b */
    float *master, *m, *v, *gshard; /* fp32 [nshard] */
    void *wshard;            /* dtype [nshard]; == master in fp32 */
    zslot *slots;
    int nslots;
    size_t max_padded;
    void *glow0, *glow1;     /* dtype gradient buffers: block 0's, and one for the others (not fp32) */
    float *gacc;             /* grad_accum > 1: fp32 [sum P_b], every block's accumulation */
    float *gf0, *gfrot[2];   /* grad_accum == 1: fp32 buffers for block 0 and two rotating ones */
    cudaEvent_t gfrot_free[2];
    int gfrot_next;
    float *partials, *d_sumsq, *d_clip, *d_loss;
    int *d_flag;             /* the model's non-finite flag */

    /* Host staging (pinned): [0] sum of squares, [1] flag bits, [2] loss. */
    float *h_small;

    /* The micro-batch in flight. */
    int *seq, seq_len, pos;  /* the order in which blocks are acquired, and the next position */
    int micro;
    bool last;
    float inv_scale;
    cudaEvent_t step_done, rs_done, ev_tmp;

    zt_cuda_adamw_tensor *adam;
    int nadam;

    size_t free_at_start, plan_bytes, measured_bytes;
    size_t plan[3]; /* the pool's bytes by part (see carve), for the plan's log line */
    bool comm_failed;        /* a collective enqueued by a hook failed (logged once) */

    /* Timeline (ZT_ZERO_TIMELINE=1). */
    bool timeline;
    tl_span *spans;
    int nspans, step_no;
    cudaEvent_t tl_base;
    int open_compute[2];     /* spans of blocks being computed (the head holds two), or -1 */
};

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static void *take(char *base, size_t *used, size_t bytes)
{
    void *p = base ? base + *used : NULL;
    *used += round_up(bytes, POOL_ALIGN);
    return p;
}

static enum zt_comm_dtype comm_dtype(enum zt_dtype d)
{
    return d == ZT_DTYPE_BF16 ? ZT_COMM_BF16 : d == ZT_DTYPE_F16 ? ZT_COMM_F16 : ZT_COMM_F32;
}

/* A collective enqueued from inside a hook cannot return its error through the model: a failure breaks
 * the communicator, every later call fails, and the step's wait (zt_comm_nccl_wait) returns the error
 * to the caller. The first message is logged here. */
static void comm_call(zt_zero_cuda *z, int rc, const zt_err *e)
{
    if (rc < 0 && !z->comm_failed) {
        z->comm_failed = true;
        zt_log(ZT_LOG_ERROR, "%s", e->msg);
    }
}

/* ---- timeline ---- */

static int tl_begin(zt_zero_cuda *z, int kind, int block, cudaStream_t s)
{
    if (!z->timeline || z->nspans == TL_MAX_SPANS)
        return -1;
    tl_span *sp = &z->spans[z->nspans];
    sp->kind = kind;
    sp->block = block;
    ZT_CUDA_CHECK(cudaEventRecord(sp->a, s));
    return z->nspans++;
}

static void tl_end(zt_zero_cuda *z, int span, cudaStream_t s)
{
    if (span >= 0)
        ZT_CUDA_CHECK(cudaEventRecord(z->spans[span].b, s));
}

static int cmp_double2(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* After the step's wait: the step's communication time, how much of it overlapped compute, one line. */
static void tl_report(zt_zero_cuda *z)
{
    if (!z->timeline || z->nspans == 0)
        return;
    double *comp = zt_xmalloc((size_t)z->nspans * 2 * sizeof(double));
    int nc = 0;
    double ag = 0, rs = 0, hidden = 0, end = 0;
    int nag = 0, nrs = 0;
    for (int i = 0; i < z->nspans; i++) {
        float a = 0, b = 0;
        ZT_CUDA_CHECK(cudaEventElapsedTime(&a, z->tl_base, z->spans[i].a));
        ZT_CUDA_CHECK(cudaEventElapsedTime(&b, z->tl_base, z->spans[i].b));
        if (b > end)
            end = b;
        if (z->spans[i].kind == 2) {
            comp[2 * nc] = a;
            comp[2 * nc + 1] = b;
            nc++;
        }
    }
    qsort(comp, (size_t)nc, 2 * sizeof(double), cmp_double2);
    /* merge the compute spans into disjoint intervals */
    int nm = 0;
    for (int i = 0; i < nc; i++) {
        if (nm > 0 && comp[2 * i] <= comp[2 * (nm - 1) + 1]) {
            if (comp[2 * i + 1] > comp[2 * (nm - 1) + 1])
                comp[2 * (nm - 1) + 1] = comp[2 * i + 1];
        } else {
            comp[2 * nm] = comp[2 * i];
            comp[2 * nm + 1] = comp[2 * i + 1];
            nm++;
        }
    }
    double busy = 0;
    for (int i = 0; i < nm; i++)
        busy += comp[2 * i + 1] - comp[2 * i];
    for (int i = 0; i < z->nspans; i++) {
        if (z->spans[i].kind == 2)
            continue;
        float fa = 0, fb = 0;
        ZT_CUDA_CHECK(cudaEventElapsedTime(&fa, z->tl_base, z->spans[i].a));
        ZT_CUDA_CHECK(cudaEventElapsedTime(&fb, z->tl_base, z->spans[i].b));
        double a = fa, b = fb, d = b - a;
        if (z->spans[i].kind == 0) {
            ag += d;
            nag++;
        } else {
            rs += d;
            nrs++;
        }
        for (int k = 0; k < nm; k++) {
            double lo = a > comp[2 * k] ? a : comp[2 * k], hi = b < comp[2 * k + 1] ? b : comp[2 * k + 1];
            if (hi > lo)
                hidden += hi - lo;
        }
    }
    free(comp);
    const double total = ag + rs;
    zt_log(ZT_LOG_INFO, "zero timeline: step %d | step %.2f ms | compute %.2f ms | all-gather %.2f ms (%d) | "
           "reduce-scatter %.2f ms (%d) | comm %.2f ms, hidden %.2f ms | hidden fraction %.1f%%",
           z->step_no, end, busy, ag, nag, rs, nrs, total, hidden, total > 0 ? 100.0 * hidden / total : 100.0);
    z->nspans = 0;
}

/* ---- the window ---- */

/* Position in the micro-batch's order at which block b is acquired next, from position `from` on, or
 * a large number when it is not needed again in this micro-batch. */
static int next_use(const zt_zero_cuda *z, int b, int from)
{
    for (int j = from; j < z->seq_len; j++)
        if (z->seq[j] == b)
            return j;
    return 1 << 30;
}

/* A slot to gather block b into, needed at position `when`: its own at level 2; at level 3 an empty or
 * cached slot whose block is needed later than `when` (the one needed last), or -1 when none is. */
static int pick_slot(zt_zero_cuda *z, int b, int when)
{
    if (z->o.level == 2)
        return b;
    int best = -1, best_use = -1;
    for (int s = 0; s < z->nslots; s++) {
        zslot *sl = &z->slots[s];
        if (sl->state == SLOT_EMPTY)
            return s;
        if (sl->state != SLOT_CACHED)
            continue;
        int use = next_use(z, sl->block, z->pos);
        if (use > when && use > best_use) {
            best = s;
            best_use = use;
        }
    }
    return best;
}

/* Enqueues the all-gather of block b into slot s on the communication stream. */
static void gather(zt_zero_cuda *z, int b, int s)
{
    zslot *sl = &z->slots[s];
    zblk *k = &z->blocks[b];
    if (sl->block >= 0)
        z->blocks[sl->block].slot = -1;
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->ms, sl->done, 0)); /* its previous readers are done */
    int span = tl_begin(z, 0, b, z->ms);
    zt_err e;
    comm_call(z, zt_comm_all_gather(z->comm, (char *)z->wshard + k->shard_off * z->esize, sl->buf, k->shard,
                                    comm_dtype(z->dtype), z->ms, &e), &e);
    tl_end(z, span, z->ms);
    ZT_CUDA_CHECK(cudaEventRecord(sl->ready, z->ms));
    sl->block = b;
    sl->state = SLOT_GATHERING;
    k->slot = s;
}

/* Gathers the blocks of the next `prefetch` positions that are not in the window yet, while slots
 * allow. */
static void prefetch(zt_zero_cuda *z)
{
    for (int j = z->pos; j < z->seq_len && j < z->pos + z->o.prefetch; j++) {
        int b = z->seq[j];
        if (z->blocks[b].slot >= 0)
            continue;
        int s = pick_slot(z, b, j);
        if (s < 0)
            return;
        gather(z, b, s);
    }
}

/* Hook: block b's gathered weights, for its forward (or the head) or its backward. */
static void *h_acquire(void *ctx, int b)
{
    zt_zero_cuda *z = ctx;
    ZT_ASSERT(z->pos < z->seq_len && z->seq[z->pos] == b);
    z->pos++;
    zblk *k = &z->blocks[b];
    if (k->slot < 0) {
        int s = pick_slot(z, b, z->pos - 1);
        ZT_ASSERT(s >= 0); /* the window has prefetch + 2 slots: two held at most, the rest in flight */
        gather(z, b, s);
    }
    zslot *sl = &z->slots[k->slot];
    sl->state = SLOT_HELD;
    prefetch(z);
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->cs, sl->ready, 0));
    int span = tl_begin(z, 2, b, z->cs);
    if (span >= 0)
        z->open_compute[z->open_compute[0] < 0 ? 0 : 1] = span;
    return sl->buf;
}

/* Hook: the model is done reading block b's weights (for now). */
static void h_release(void *ctx, int b)
{
    zt_zero_cuda *z = ctx;
    zblk *k = &z->blocks[b];
    ZT_ASSERT(k->slot >= 0);
    zslot *sl = &z->slots[k->slot];
    ZT_CUDA_CHECK(cudaEventRecord(sl->done, z->cs));
    sl->state = SLOT_CACHED;
    for (int i = 0; i < 2; i++)
        if (z->open_compute[i] >= 0 && z->spans[z->open_compute[i]].block == b) {
            tl_end(z, z->open_compute[i], z->cs);
            z->open_compute[i] = -1;
        }
}

/* ---- gradients ---- */

/* The fp32 buffer of the whole block b that receives its folded gradients on this rank. */
static float *fp32_target(zt_zero_cuda *z, int b)
{
    zblk *k = &z->blocks[b];
    if (k->gfull)
        return k->gfull;
    if (z->gacc) {
        k->gfull = z->gacc + k->pad_off;
    } else if (b == 0) {
        k->gfull = z->gf0;
    } else {
        int r = z->gfrot_next;
        z->gfrot_next ^= 1;
        ZT_CUDA_CHECK(cudaStreamWaitEvent(z->cs, z->gfrot_free[r], 0)); /* its last reduce-scatter is done */
        k->gfull = z->gfrot[r];
        k->gslot = r;
    }
    /* The padding after the block's last tensor goes into the reduce-scatter and the norm: keep it zero
     * (with grad_accum > 1 it was zeroed once at creation and is never written). */
    if (!z->gacc && k->padded > k->len)
        ZT_CUDA_CHECK(cudaMemsetAsync(k->gfull + k->len, 0, (k->padded - k->len) * sizeof(float), z->cs));
    return k->gfull;
}

/* Hook: where block b's backward writes its gradients; zeroed when first handed out in a micro-batch
 * (block 0 is asked twice: by the head and by the embeddings). */
static void *h_grad_buffer(void *ctx, int b)
{
    zt_zero_cuda *z = ctx;
    zblk *k = &z->blocks[b];
    if (k->glow)
        return k->glow;
    if (z->dtype == ZT_DTYPE_F32) {
        /* fp32 compute: the kernels add straight into the fp32 buffer, as the single-GPU model does */
        float *f = fp32_target(z, b);
        if (z->micro == 0)
            ZT_CUDA_CHECK(cudaMemsetAsync(f, 0, k->len * sizeof(float), z->cs));
        k->glow = f;
    } else {
        k->glow = b == 0 ? z->glow0 : z->glow1;
        ZT_CUDA_CHECK(cudaMemsetAsync(k->glow, 0, k->len * z->esize, z->cs));
    }
    return k->glow;
}

/* Hook: block b's backward is enqueued: fold its gradients into fp32 and, on the step's last
 * micro-batch, reduce-scatter them into the owned shard on the communication stream. */
static void h_grads_done(void *ctx, int b)
{
    zt_zero_cuda *z = ctx;
    zblk *k = &z->blocks[b];
    ZT_ASSERT(k->glow);
    if (z->dtype != ZT_DTYPE_F32) {
        float *f = fp32_target(z, b);
        zt_cuda_accumulate(f, k->glow, z->dtype, k->len, z->inv_scale, z->micro == 0 ? 1 : 0, z->cs);
    }
    k->glow = NULL;
    if (!z->last) {
        k->gfull = NULL; /* accumulation buffer (grad_accum > 1): kept in gacc */
        return;
    }
    ZT_CUDA_CHECK(cudaEventRecord(k->folded, z->cs));
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->ms, k->folded, 0));
    int span = tl_begin(z, 1, b, z->ms);
    zt_err e;
    comm_call(z, zt_comm_reduce_scatter(z->comm, k->gfull, z->gshard + k->shard_off, k->shard, ZT_COMM_F32,
                                        ZT_COMM_SUM, z->ms, &e), &e);
    tl_end(z, span, z->ms);
    if (k->gslot >= 0)
        ZT_CUDA_CHECK(cudaEventRecord(z->gfrot_free[k->gslot], z->ms));
    k->gslot = -1;
    k->gfull = NULL;
}

/* ---- creation ---- */

/* Carves the runtime's device buffers from base (or only counts them when base is NULL). plan receives
 * the bytes of: shards (masters, m, v, gradients, low-precision weights), window, gradient buffers. */
static size_t carve(zt_zero_cuda *z, char *base, size_t plan[3])
{
    size_t used = 0, mark;
    const size_t ns = z->nshard;
    z->master = take(base, &used, ns * 4);
    z->m = take(base, &used, ns * 4);
    z->v = take(base, &used, ns * 4);
    z->gshard = take(base, &used, ns * 4);
    z->wshard = z->dtype == ZT_DTYPE_F32 ? (void *)z->master : take(base, &used, ns * z->esize);
    plan[0] = used;
    mark = used;
    for (int s = 0; s < z->nslots; s++) {
        z->slots[s].elems = z->o.level == 2 ? z->blocks[s].padded : z->max_padded;
        z->slots[s].buf = take(base, &used, z->slots[s].elems * z->esize);
    }
    plan[1] = used - mark;
    mark = used;
    size_t max_other = 0, padded_sum = 0;
    for (int b = 0; b < z->nb; b++) {
        padded_sum += z->blocks[b].padded;
        if (b > 0 && z->blocks[b].padded > max_other)
            max_other = z->blocks[b].padded;
    }
    if (z->dtype != ZT_DTYPE_F32) {
        z->glow0 = take(base, &used, z->blocks[0].padded * z->esize);
        z->glow1 = take(base, &used, max_other * z->esize);
    }
    if (z->o.grad_accum > 1) {
        z->gacc = take(base, &used, padded_sum * 4);
    } else {
        z->gf0 = take(base, &used, z->blocks[0].padded * 4);
        z->gfrot[0] = take(base, &used, max_other * 4);
        z->gfrot[1] = take(base, &used, max_other * 4);
    }
    z->partials = take(base, &used, ZT_CUDA_NORM_SLOTS * 4);
    z->d_sumsq = take(base, &used, 4);
    z->d_clip = take(base, &used, 4);
    z->d_loss = take(base, &used, 4);
    plan[2] = used - mark;
    return used;
}

/* The order in which a training micro-batch acquires blocks: forward 0..L, the head (ln_f, then the tied
 * embeddings), backward L..1 (the embeddings' backward needs no weights). Evaluation stops after the
 * head. */
static void build_sequence(zt_zero_cuda *z, bool training)
{
    int n = 0;
    for (int b = 0; b <= z->L; b++)
        z->seq[n++] = b;
    z->seq[n++] = z->L + 1;
    z->seq[n++] = 0;
    if (training)
        for (int b = z->L; b >= 1; b--)
            z->seq[n++] = b;
    z->seq_len = n;
    z->pos = 0;
}

static void copy_field_to_shards(zt_zero_cuda *z, float *field, const float *slab, float *stage);

/* Creates the runtime; see zero_cuda.h. */
int zt_zero_cuda_create(zt_zero_cuda **out, zt_gpt2 *host, zt_comm *comm, const zt_zero_options *o, int B, int T,
                        enum zt_dtype dtype, zt_err *err)
{
    *out = NULL;
    int rc;
    if (o->level != 2 && o->level != 3)
        return zt_fail(err, ZT_EINVAL_CONFIG, "ZeRO level %d is not supported; use 2 or 3", o->level);
    if (o->prefetch < 0 || o->grad_accum < 1 || o->checkpoint_every < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "prefetch depth (%d) must be >= 0, grad_accum (%d) and the checkpoint interval (%d) >= 1",
                       o->prefetch, o->grad_accum, o->checkpoint_every);
    zt_zero_cuda *z = zt_xcalloc(1, sizeof *z);
    z->host = host;
    z->comm = comm;
    z->o = *o;
    z->W = zt_comm_world_size(comm);
    z->rank = zt_comm_rank(comm);
    z->nb = zt_gpt2_num_blocks(host);
    z->L = z->nb - 2;
    z->dtype = dtype;
    z->esize = zt_dtype_size(dtype);
    z->open_compute[0] = z->open_compute[1] = -1;
    size_t total_b = 0;
    ZT_CUDA_CHECK(cudaMemGetInfo(&z->free_at_start, &total_b));

    z->ckpt = zt_xcalloc((size_t)(z->L > 0 ? z->L : 1), sizeof(bool));
    for (int l = 0; l < z->L; l++)
        z->ckpt[l] = zt_zero_layer_checkpointed(o, l);
    zt_gpt2_cuda_hooks hooks = {
        .ctx = z,
        .acquire_weights = h_acquire,
        .release_weights = h_release,
        .grad_buffer = h_grad_buffer,
        .grads_done = h_grads_done,
    };
    if ((rc = zt_gpt2_cuda_create_hooked(&z->model, host, B, T, o->grad_accum, dtype, &hooks, z->ckpt, err)) < 0)
        goto fail;
    z->cs = (cudaStream_t)zt_gpt2_cuda_stream(z->model);
    z->d_flag = zt_gpt2_cuda_flag(z->model);
    ZT_CUDA_CHECK(cudaStreamCreateWithFlags(&z->ms, cudaStreamNonBlocking));

    /* Blocks: padded to a multiple of 64 W, shards laid end to end. */
    z->blocks = zt_xcalloc((size_t)z->nb, sizeof *z->blocks);
    const size_t unit = (size_t)SHARD_ALIGN * (size_t)z->W;
    size_t pad_sum = 0;
    for (int b = 0; b < z->nb; b++) {
        zblk *k = &z->blocks[b];
        k->dev_off = zt_gpt2_cuda_block_offset(z->model, b);
        k->len = zt_gpt2_cuda_block_len(z->model, b);
        k->padded = round_up(k->len, unit);
        k->shard = k->padded / (size_t)z->W;
        k->shard_off = z->nshard;
        k->pad_off = pad_sum;
        k->slot = -1;
        k->gslot = -1;
        z->nshard += k->shard;
        pad_sum += k->padded;
        if (k->padded > z->max_padded)
            z->max_padded = k->padded;
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&k->folded, cudaEventDisableTiming));
    }
    z->nslots = o->level == 2 ? z->nb : o->prefetch + 2;
    z->slots = zt_xcalloc((size_t)z->nslots, sizeof *z->slots);
    for (int s = 0; s < z->nslots; s++) {
        z->slots[s].block = -1;
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&z->slots[s].ready, cudaEventDisableTiming));
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&z->slots[s].done, cudaEventDisableTiming));
    }
    for (int i = 0; i < 2; i++)
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&z->gfrot_free[i], cudaEventDisableTiming));
    ZT_CUDA_CHECK(cudaEventCreateWithFlags(&z->step_done, cudaEventDisableTiming));
    ZT_CUDA_CHECK(cudaEventCreateWithFlags(&z->rs_done, cudaEventDisableTiming));
    ZT_CUDA_CHECK(cudaEventCreateWithFlags(&z->ev_tmp, cudaEventDisableTiming));
    z->seq = zt_xcalloc((size_t)(2 * z->nb + 2), sizeof(int));

    z->pool_bytes = carve(z, NULL, z->plan);
    if (cudaMalloc(&z->pool, z->pool_bytes) != cudaSuccess) {
        cudaGetLastError();
        char need[32], fr[32];
        size_t free_b = 0;
        ZT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        zt_format_size(z->pool_bytes, need, sizeof need);
        zt_format_size(free_b, fr, sizeof fr);
        rc = zt_fail(err, ZT_ENOMEM, "the ZeRO runtime needs %s of GPU memory for its shards, window and gradient "
                     "buffers and %s are free: use more ranks, ZeRO level 3 with a smaller --prefetch, "
                     "--checkpointing all, or a smaller batch", need, fr);
        goto fail;
    }
    ZT_ASSERT(carve(z, z->pool, z->plan) == z->pool_bytes);
    ZT_CUDA_CHECK(cudaMemsetAsync(z->pool, 0, z->pool_bytes, z->cs));
    z->plan_bytes = z->pool_bytes + zt_gpt2_cuda_pool_bytes(z->model);
    ZT_CUDA_CHECK(cudaMallocHost((void **)&z->h_small, 4 * sizeof(float)));

    /* AdamW over the pieces of every tensor inside this rank's shards. */
    const int nt = zt_gpt2_num_tensors(host);
    z->adam = zt_xcalloc((size_t)nt, sizeof *z->adam);
    for (int i = 0; i < nt; i++) {
        const zt_param_info *t = zt_gpt2_tensor(host, i);
        zblk *k = &z->blocks[t->block];
        size_t t_lo = zt_gpt2_cuda_tensor_offset(z->model, i) - k->dev_off;
        size_t t_hi = t_lo + zt_gpt2_cuda_tensor_len(z->model, i);
        size_t s_lo = (size_t)z->rank * k->shard, s_hi = s_lo + k->shard;
        size_t lo = t_lo > s_lo ? t_lo : s_lo, hi = t_hi < s_hi ? t_hi : s_hi;
        if (lo >= hi)
            continue;
        size_t j = k->shard_off + (lo - s_lo);
        zt_cuda_adamw_tensor *a = &z->adam[z->nadam++];
        a->param = z->master + j;
        a->m = z->m + j;
        a->v = z->v + j;
        a->grad = z->gshard + j;
        a->param_lowp = dtype == ZT_DTYPE_F32 ? NULL : (char *)z->wshard + j * z->esize;
        a->n = hi - lo;
        a->weight_decay = t->weight_decay ? 1 : 0;
    }

    const char *tl = getenv("ZT_ZERO_TIMELINE");
    if (tl && strcmp(tl, "1") == 0) {
        z->timeline = true;
        z->spans = zt_xcalloc(TL_MAX_SPANS, sizeof *z->spans);
        for (int i = 0; i < TL_MAX_SPANS; i++) {
            ZT_CUDA_CHECK(cudaEventCreate(&z->spans[i].a));
            ZT_CUDA_CHECK(cudaEventCreate(&z->spans[i].b));
        }
        ZT_CUDA_CHECK(cudaEventCreate(&z->tl_base));
    }

    /* The masters from the host model's parameters; m and v are zero (the pool was zeroed). */
    float *stage = zt_xmalloc(z->max_padded * sizeof(float));
    copy_field_to_shards(z, z->master, zt_gpt2_params(host), stage);
    free(stage);
    if (dtype != ZT_DTYPE_F32)
        zt_cuda_cast(z->wshard, dtype, z->master, ZT_DTYPE_F32, z->nshard, z->cs);
    ZT_CUDA_CHECK(cudaStreamSynchronize(z->cs));
    *out = z;
    return 0;

fail:
    zt_zero_cuda_destroy(z);
    return rc;
}

/* Frees everything; accepts NULL. */
void zt_zero_cuda_destroy(zt_zero_cuda *z)
{
    if (!z)
        return;
    if (z->ms)
        cudaStreamSynchronize(z->ms);
    if (z->cs)
        cudaStreamSynchronize(z->cs);
    if (z->spans) {
        for (int i = 0; i < TL_MAX_SPANS; i++) {
            cudaEventDestroy(z->spans[i].a);
            cudaEventDestroy(z->spans[i].b);
        }
        cudaEventDestroy(z->tl_base);
        free(z->spans);
    }
    if (z->blocks)
        for (int b = 0; b < z->nb; b++)
            if (z->blocks[b].folded)
                cudaEventDestroy(z->blocks[b].folded);
    if (z->slots)
        for (int s = 0; s < z->nslots; s++) {
            if (z->slots[s].ready)
                cudaEventDestroy(z->slots[s].ready);
            if (z->slots[s].done)
                cudaEventDestroy(z->slots[s].done);
        }
    for (int i = 0; i < 2; i++)
        if (z->gfrot_free[i])
            cudaEventDestroy(z->gfrot_free[i]);
    if (z->step_done)
        cudaEventDestroy(z->step_done);
    if (z->rs_done)
        cudaEventDestroy(z->rs_done);
    if (z->ev_tmp)
        cudaEventDestroy(z->ev_tmp);
    cudaFreeHost(z->h_small);
    cudaFree(z->pool);
    if (z->ms)
        cudaStreamDestroy(z->ms);
    zt_gpt2_cuda_destroy(z->model);
    free(z->blocks);
    free(z->slots);
    free(z->seq);
    free(z->ckpt);
    free(z->adam);
    free(z);
}

/* ---- memory plan ---- */

/* Logs the plan; see zero_cuda.h. */
void zt_zero_cuda_log_plan(const zt_zero_cuda *z)
{
    size_t total = 0;
    for (int b = 0; b < z->nb; b++)
        total += z->blocks[b].len;
    int n_ckpt = 0;
    for (int l = 0; l < z->L; l++)
        n_ckpt += z->ckpt[l];
    char p[32], g[32], o[32], lw[32], w[32], gb[32], act[32], all[32], fr[32];
    zt_format_size((uint64_t)z->nshard * 4, p, sizeof p);
    zt_format_size((uint64_t)z->nshard * 4, g, sizeof g);
    zt_format_size((uint64_t)z->nshard * 8, o, sizeof o);
    zt_format_size((uint64_t)(z->dtype == ZT_DTYPE_F32 ? 0 : z->nshard * z->esize), lw, sizeof lw);
    zt_format_size((uint64_t)z->plan[1], w, sizeof w);
    zt_format_size((uint64_t)z->plan[2], gb, sizeof gb);
    zt_format_size((uint64_t)zt_gpt2_cuda_pool_bytes(z->model), act, sizeof act);
    zt_format_size((uint64_t)z->plan_bytes, all, sizeof all);
    zt_format_size((uint64_t)z->free_at_start, fr, sizeof fr);
    zt_log(ZT_LOG_INFO,
           "zero: plan per rank (W=%d, level %d, %zu of %zu parameters, %s compute): params/W %s fp32 + %s low "
           "precision, grads/W %s, optimizer/W %s (Adam m, v), gathered window %s (%d slots, prefetch %d), "
           "gradient buffers %s (grad_accum %d), activations and scratch %s (%d of %d layers checkpointed); "
           "total %s of %s free",
           z->W, z->o.level, z->nshard, total, z->dtype == ZT_DTYPE_F32 ? "fp32" : z->dtype == ZT_DTYPE_BF16 ?
           "bf16" : "fp16", p, lw, g, o, w, z->nslots, z->o.prefetch, gb, z->o.grad_accum, act, n_ckpt, z->L, all,
           fr);
}

/* The planned and the measured bytes; see zero_cuda.h. */
size_t zt_zero_cuda_plan_bytes(const zt_zero_cuda *z)
{
    return z->plan_bytes;
}

size_t zt_zero_cuda_measured_bytes(const zt_zero_cuda *z)
{
    return z->measured_bytes;
}

/* ---- a micro-batch and the step ---- */

/* Starts a micro-batch's walk over the blocks. */
static void begin_micro(zt_zero_cuda *z, bool training, int micro, bool last, float loss_scale)
{
    build_sequence(z, training);
    z->micro = micro;
    z->last = last;
    z->inv_scale = 1.0f / loss_scale;
    if (micro == 0 && z->timeline && z->nspans == 0)
        ZT_CUDA_CHECK(cudaEventRecord(z->tl_base, z->cs));
    /* the all-gathers read the low-precision shards that the last step's update wrote */
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->ms, z->step_done, 0));
    prefetch(z);
}

/* One micro-batch; see zero_cuda.h. */
void zt_zero_cuda_forward_backward(zt_zero_cuda *z, const int32_t *tokens, const int32_t *targets, int B, int T,
                                   int micro, float grad_weight, float loss_scale, bool last)
{
    begin_micro(z, true, micro, last, loss_scale);
    zt_gpt2_cuda_train_micro(z->model, tokens, targets, B, T, micro, grad_weight, loss_scale);
    ZT_ASSERT(z->pos == z->seq_len);
}

/* Waits for the compute stream through the communicator (a dead peer fails instead of hanging). */
static int wait_compute(zt_zero_cuda *z, zt_err *err)
{
    return zt_comm_nccl_wait(z->comm, z->cs, err);
}

/* All-reduces n elements at d on the communication stream, ordered after the compute stream's work so
 * far; the compute stream waits for the result. */
static int all_reduce_ordered(zt_zero_cuda *z, void *d, size_t n, enum zt_comm_dtype dt, enum zt_comm_op op,
                              zt_err *err)
{
    ZT_CUDA_CHECK(cudaEventRecord(z->ev_tmp, z->cs));
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->ms, z->ev_tmp, 0));
    int rc = zt_comm_all_reduce(z->comm, d, d, n, dt, op, z->ms, err);
    ZT_CUDA_CHECK(cudaEventRecord(z->ev_tmp, z->ms));
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->cs, z->ev_tmp, 0));
    return rc;
}

/* The mean over ranks of a host float (one small all-reduce, waited for). */
static int mean_over_ranks(zt_zero_cuda *z, float x, float *out, zt_err *err)
{
    if (z->W == 1) {
        *out = x;
        return 0;
    }
    z->h_small[2] = x;
    ZT_CUDA_CHECK(cudaMemcpyAsync(z->d_loss, &z->h_small[2], sizeof(float), cudaMemcpyHostToDevice, z->cs));
    int rc = all_reduce_ordered(z, z->d_loss, 1, ZT_COMM_F32, ZT_COMM_SUM, err);
    ZT_CUDA_CHECK(cudaMemcpyAsync(&z->h_small[2], z->d_loss, sizeof(float), cudaMemcpyDeviceToHost, z->cs));
    if (rc == 0)
        rc = wait_compute(z, err);
    *out = z->h_small[2] / (float)z->W;
    return rc;
}

/* Forgets what the window holds (the weights changed). */
static void invalidate_window(zt_zero_cuda *z)
{
    for (int s = 0; s < z->nslots; s++) {
        z->slots[s].block = -1;
        z->slots[s].state = SLOT_EMPTY;
    }
    for (int b = 0; b < z->nb; b++)
        z->blocks[b].slot = -1;
}

/* The step; see zero_cuda.h. */
int zt_zero_cuda_step(zt_zero_cuda *z, int micros, float lr, int64_t adam_step, float *loss, double *grad_norm,
                      bool *nonfinite, zt_err *err)
{
    /* every reduce-scatter is done before the norm reads the shards */
    ZT_CUDA_CHECK(cudaEventRecord(z->rs_done, z->ms));
    ZT_CUDA_CHECK(cudaStreamWaitEvent(z->cs, z->rs_done, 0));
    ZT_CUDA_CHECK(cudaMemsetAsync(z->partials, 0, ZT_CUDA_NORM_SLOTS * sizeof(float), z->cs));
    zt_cuda_sum_squares_accumulate(z->partials, z->gshard, z->nshard, ZT_DTYPE_F32, z->cs);
    zt_cuda_sum_squares_finish(z->d_sumsq, z->partials, z->cs);
    int rc = 0;
    if (z->W > 1)
        rc = all_reduce_ordered(z, z->d_sumsq, 1, ZT_COMM_F32, ZT_COMM_SUM, err);
    zt_cuda_check_finite(z->d_flag, z->d_sumsq, 1, ZT_DTYPE_F32, z->cs);
    if (rc == 0 && z->W > 1)
        rc = all_reduce_ordered(z, z->d_flag, 1, ZT_COMM_I32, ZT_COMM_MAX, err);
    zt_cuda_clip_scale(z->d_clip, z->d_sumsq, (float)z->o.grad_clip, z->cs);
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = (float)z->o.beta1,
        .beta2 = (float)z->o.beta2,
        .eps = (float)z->o.eps,
        .weight_decay = (float)z->o.weight_decay,
        .grad_scale = 1.0f,
        .step = (int)adam_step,
    };
    zt_cuda_adamw_update(z->adam, z->nadam, &p, ZT_DTYPE_F32, z->dtype, z->d_clip, z->d_flag, z->cs);
    ZT_CUDA_CHECK(cudaEventRecord(z->step_done, z->cs));
    ZT_CUDA_CHECK(cudaMemcpyAsync(&z->h_small[0], z->d_sumsq, sizeof(float), cudaMemcpyDeviceToHost, z->cs));
    ZT_CUDA_CHECK(cudaMemcpyAsync(&z->h_small[1], z->d_flag, sizeof(int), cudaMemcpyDeviceToHost, z->cs));
    if (rc == 0)
        rc = wait_compute(z, err);
    invalidate_window(z);
    z->step_no++;
    if (rc < 0)
        return rc;
    tl_report(z);
    if (z->measured_bytes == 0) {
        size_t free_b = 0, total_b = 0;
        ZT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        z->measured_bytes = z->free_at_start > free_b ? z->free_at_start - free_b : 0;
    }
    *grad_norm = sqrt((double)z->h_small[0]);
    int flag;
    memcpy(&flag, &z->h_small[1], sizeof flag);
    *nonfinite = flag != 0;
    float mine = zt_gpt2_cuda_step_loss(z->model, micros);
    return mean_over_ranks(z, mine, loss, err);
}

/* Evaluation; see zero_cuda.h. */
int zt_zero_cuda_eval(zt_zero_cuda *z, const int32_t *tokens, const int32_t *targets, int B, int T, float *loss,
                      zt_err *err)
{
    begin_micro(z, false, 0, false, 1.0f);
    zt_gpt2_cuda_eval_enqueue(z->model, tokens, targets, B, T);
    ZT_ASSERT(z->pos == z->seq_len);
    int rc = wait_compute(z, err);
    if (rc < 0)
        return rc;
    z->nspans = 0; /* the timeline reports training steps only */
    return mean_over_ranks(z, zt_gpt2_cuda_eval_read(z->model), loss, err);
}

/* ---- state export and import ---- */

/* Copies this rank's shard of every block of a host slab (host layout) into a device shard slab. */
static void copy_field_to_shards(zt_zero_cuda *z, float *field, const float *slab, float *stage)
{
    const int nt = zt_gpt2_num_tensors(z->host);
    for (int b = 0; b < z->nb; b++) {
        zblk *k = &z->blocks[b];
        memset(stage, 0, k->padded * sizeof(float));
        for (int i = 0; i < nt; i++) {
            const zt_param_info *t = zt_gpt2_tensor(z->host, i);
            if (t->block == b)
                memcpy(stage + (zt_gpt2_cuda_tensor_offset(z->model, i) - k->dev_off), slab + t->offset,
                       t->numel * sizeof(float));
        }
        ZT_CUDA_CHECK(cudaMemcpy(field + k->shard_off, stage + (size_t)z->rank * k->shard, k->shard * sizeof(float),
                                 cudaMemcpyHostToDevice));
    }
}

/* Gathers one fp32 shard slab of every rank into a host slab (host layout). */
static int gather_field(zt_zero_cuda *z, const float *field, float *slab, float *d_tmp, float *stage, zt_err *err)
{
    const int nt = zt_gpt2_num_tensors(z->host);
    for (int b = 0; b < z->nb; b++) {
        zblk *k = &z->blocks[b];
        int rc = zt_comm_all_gather(z->comm, field + k->shard_off, d_tmp, k->shard, ZT_COMM_F32, z->ms, err);
        if (rc == 0)
            rc = zt_comm_nccl_wait(z->comm, z->ms, err);
        if (rc < 0)
            return rc;
        ZT_CUDA_CHECK(cudaMemcpy(stage, d_tmp, k->len * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < nt; i++) {
            const zt_param_info *t = zt_gpt2_tensor(z->host, i);
            if (t->block == b)
                memcpy(slab + t->offset, stage + (zt_gpt2_cuda_tensor_offset(z->model, i) - k->dev_off),
                       t->numel * sizeof(float));
        }
    }
    return 0;
}

/* Gathers the full state; see zero_cuda.h. */
int zt_zero_cuda_export_state(zt_zero_cuda *z, zt_optimizer *opt, zt_err *err)
{
    ZT_ASSERT(opt->n == zt_gpt2_num_params(z->host));
    ZT_CUDA_CHECK(cudaStreamSynchronize(z->cs));
    float *d_tmp = NULL;
    if (cudaMalloc((void **)&d_tmp, z->max_padded * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return zt_fail(err, ZT_ENOMEM, "no GPU memory left to gather the training state for a checkpoint (%zu "
                       "floats): lower the batch size or the prefetch depth", z->max_padded);
    }
    float *stage = zt_xmalloc(z->max_padded * sizeof(float));
    int rc = gather_field(z, z->master, zt_gpt2_params(z->host), d_tmp, stage, err);
    if (rc == 0)
        rc = gather_field(z, z->m, opt->m, d_tmp, stage, err);
    if (rc == 0)
        rc = gather_field(z, z->v, opt->v, d_tmp, stage, err);
    free(stage);
    cudaFree(d_tmp);
    return rc;
}

/* Takes this rank's shards of a full state; see zero_cuda.h. */
void zt_zero_cuda_import_state(zt_zero_cuda *z, const zt_optimizer *opt)
{
    ZT_ASSERT(opt->n == zt_gpt2_num_params(z->host));
    ZT_CUDA_CHECK(cudaStreamSynchronize(z->cs));
    float *stage = zt_xmalloc(z->max_padded * sizeof(float));
    copy_field_to_shards(z, z->master, zt_gpt2_params(z->host), stage);
    copy_field_to_shards(z, z->m, opt->m, stage);
    copy_field_to_shards(z, z->v, opt->v, stage);
    free(stage);
    if (z->dtype != ZT_DTYPE_F32)
        zt_cuda_cast(z->wshard, z->dtype, z->master, ZT_DTYPE_F32, z->nshard, z->cs);
    ZT_CUDA_CHECK(cudaStreamSynchronize(z->cs));
    invalidate_window(z);
}

