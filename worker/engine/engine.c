/* The training engine (see engine.h): the shard layout, the block walk of a micro-batch, the gathered
 * window with prefetch, the gradient path of each block, the step dispatch and the W-independent export
 * and import of the training state. What differs between the CPU and a GPU is behind zt__engine_dev
 * (engine_cpu.c, engine_cuda.c); the optimizer off the device is host_optimizer.c and engine_server.c. */
#include "worker/engine/engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/memory.h"
#include "common/units.h"
#include "offload/cpu_adam.h" /* zt_cpu_adam_convert: host weights to the compute dtype */
#include "worker/engine/optimizer.h" /* zt_optimizer_clip_coef */

#define GPU_SHARD_ALIGN 64 /* elements: on a GPU every shard starts on this boundary */

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static enum zt_comm_dtype comm_dtype(enum zt_dtype d)
{
    return d == ZT_DTYPE_BF16 ? ZT_COMM_BF16 : d == ZT_DTYPE_F16 ? ZT_COMM_F16 : ZT_COMM_F32;
}

static void *at(const zt_engine *e, void *base, size_t i)
{
    return (char *)base + i * e->esize;
}

/* Sets the defaults; see engine.h. */
void zt_engine_options_init(zt_engine_options *o)
{
    memset(o, 0, sizeof *o);
    o->zero_level = 3;
    o->prefetch = 1;
    o->grad_accum = 1;
    o->placement = ZT_PLACEMENT_CPU;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->grad_clip = 1.0;
}

/* Agreement of the ranks on a local outcome; see engine_internal.h. */
int zt__engine_agree(zt_engine *e, int rc, zt_err *err)
{
    return zt_comm_agree(e->comm, rc, err);
}

/* The mean over ranks; see engine.h. */
int zt_engine_mean(zt_engine *e, double x, double *out, zt_err *err)
{
    if (e->W == 1) {
        *out = x;
        return 0;
    }
    double sum = 0;
    int rc = zt_comm_all_reduce(e->comm, &x, &sum, 1, ZT_COMM_F64, ZT_COMM_SUM, NULL, err);
    *out = sum / e->W;
    return rc;
}

/* ---- layout ---- */

/* The moment fields of an AdamW range; see engine_internal.h. The stochastic rounding's indices are this
 * rank's shard offsets and its seed mixes the Adam step with the rank, so every element of every rank and
 * step draws its own bits whatever the thread count. */
void zt__engine_moments(const zt_engine *e, zt_cpu_adam_range *r, void *m, void *v, size_t moff, size_t index,
                        int64_t adam_step)
{
    r->m = (char *)m + moff * e->msize;
    r->v = (char *)v + moff * e->msize;
    r->moment_dtype = e->o.moment_dtype;
    r->seed = (uint64_t)adam_step ^ ((uint64_t)e->rank << 40);
    r->index_base = index;
}

/* Block b's weights as the gathers read them: wshard at the block's shard (at W = 1, the whole block). */
void *zt__engine_block_weights(zt_engine *e, int b)
{
    return at(e, e->wshard, e->blocks[b].shard_off);
}

/* The pieces of every tensor inside this rank's shards, in block order. */
static void build_pieces(zt_engine *e)
{
    const zt_model *m = e->model;
    e->pieces = zt_xcalloc((size_t)m->ntensors, sizeof *e->pieces);
    for (int i = 0; i < m->ntensors; i++) {
        const zt_model_tensor *t = &m->tensors[i];
        const zt__block *k = &e->blocks[t->block];
        size_t t_lo = t->offset - m->block_offset[t->block], t_hi = t_lo + t->len;
        size_t s_lo = (size_t)e->rank * k->shard, s_hi = s_lo + k->shard;
        size_t lo = t_lo > s_lo ? t_lo : s_lo, hi = t_hi < s_hi ? t_hi : s_hi;
        if (lo >= hi)
            continue;
        e->pieces[e->npieces++] = (zt__piece){.block = t->block, .shard_off = k->shard_off + (lo - s_lo),
                                              .n = hi - lo, .decay = t->weight_decay};
    }
}

/* Writes block b of a host-layout slab into buf (the block's padded model layout, zeros elsewhere). */
static void host_to_block(const zt_engine *e, int b, const float *slab, float *buf)
{
    const zt_model *m = e->model;
    if (slab && slab == e->filling)
        e->o.fill_host_block(e->o.fill_host_ctx, b);
    memset(buf, 0, e->blocks[b].padded * sizeof(float));
    for (int i = 0; i < m->ntensors; i++) {
        const zt_model_tensor *t = &m->tensors[i];
        if (t->block == b)
            memcpy(buf + (t->offset - m->block_offset[b]), slab + t->host_offset, t->numel * sizeof(float));
    }
}

/* The reverse: the tensors of block b (padded model layout in buf) into a host-layout slab. */
static void block_to_host(const zt_engine *e, int b, const float *buf, float *slab)
{
    const zt_model *m = e->model;
    for (int i = 0; i < m->ntensors; i++) {
        const zt_model_tensor *t = &m->tensors[i];
        if (t->block == b)
            memcpy(slab + t->host_offset, buf + (t->offset - m->block_offset[b]), t->numel * sizeof(float));
    }
}

/* ---- memory ---- */

/* One device or host allocation of the plan; counts the bytes, or fails naming the part. */
static int take_dev(zt_engine *e, void **p, size_t bytes, const char *what, zt_err *err)
{
    if (bytes == 0)
        return 0;
    if (e->dry) { /* zt_engine_plan_for: count only */
        e->device_bytes += bytes;
        return 0;
    }
    const bool over = e->o.device_budget > 0 && e->device_bytes + bytes > e->o.device_budget;
    *p = over ? NULL : e->dev->alloc(bytes);
    if (!*p) {
        char need[32], have[32], budget[32];
        zt_format_size(bytes, need, sizeof need);
        zt_format_size(e->device_bytes, have, sizeof have);
        zt_format_size(e->o.device_budget, budget, sizeof budget);
        return zt_fail(err, ZT_ENOMEM, "out of %s memory for the %s (%s more after %s%s%s): use more ranks, "
                       "--optimizer cpu, --checkpointing all, a smaller --prefetch or a smaller batch",
                       e->dev->gpu ? "GPU" : "host", what, need, have, over ? " under the engine's budget of " : "",
                       over ? budget : "");
    }
    e->device_bytes += bytes;
    return 0;
}

/* Host memory: page-locked (for copies to and from a GPU) or plain (what only the host touches). */
static int take_host(zt_engine *e, void **p, size_t bytes, bool pinned, const char *what, zt_err *err)
{
    if (bytes == 0)
        return 0;
    if (e->dry) {
        e->host_bytes += bytes;
        e->host_pinned_bytes += pinned ? bytes : 0;
        return 0;
    }
    /* Pageable host buffers come zeroed from calloc: their pages are taken when first written (the moments
     * at the first update), so the host slab the weights came from is gone by then. */
    *p = pinned ? e->dev->host_alloc(bytes) : calloc(1, bytes);
    if (!pinned) /* the optimizer's arrays: fewer page faults at the first update, fewer TLB misses after */
        zt_advise_huge_pages(*p, bytes);
    if (!*p) {
        char need[32];
        zt_format_size(bytes, need, sizeof need);
        return zt_fail(err, ZT_ENOMEM, "out of host memory for the %s (%s; page-locked memory is limited by ulimit "
                       "-l): free memory, use more ranks, or place the optimizer on state servers", what, need);
    }
    e->host_bytes += bytes;
    e->host_pinned_bytes += pinned ? bytes : 0;
    return 0;
}

/* Placement server with servers on this host: the pushed gradient in the state client's shared memory, so that
 * the servers read the pushes where the gradient lies (no copy into a slot); like an untouched mapping, its pages
 * are taken when first written. NULL where the client has none (embedded, TCP, too large): the caller
 * allocates. */
static void *shared_grad(zt_engine *e, size_t bytes)
{
    if (e->home != ZT__OPT_SERVER || e->o.client == NULL || e->grad_shared)
        return NULL;
    void *p = zt_state_client_shared_alloc(e->o.client, bytes, ZT_STATE_SHARED_GRADIENT, NULL);
    e->grad_shared = p != NULL;
    return p;
}

/* Placement server with servers on this host: the weights that pulls land in (h_lowp on a GPU computing in bf16
 * or fp16, the fp32 weights on the CPU) in the state client's shared memory, so that the servers write the pulled
 * parameters where the engine reads them and this process copies nothing. NULL where the client has none
 * (embedded, TCP, too large): the caller allocates. */
static void *shared_weights(zt_engine *e, size_t bytes)
{
    if (e->home != ZT__OPT_SERVER || e->o.client == NULL || e->dry || e->weights_shared)
        return NULL;
    void *p = zt_state_client_shared_alloc(e->o.client, bytes, ZT_STATE_SHARED_WEIGHTS, NULL);
    e->weights_shared = p != NULL;
    return p;
}

/* The page-locked host weights in transit (h_lowp): where a GPU computing in bf16 or fp16 pulls them from servers
 * on this host, in the client's shared memory (shared_weights), page-locked here as take_host's are from the
 * start (the import writes them); else take_host's. */
static int take_host_weights(zt_engine *e, size_t bytes, zt_err *err)
{
    void *p = bytes > 0 && e->dtype != ZT_DTYPE_F32 ? shared_weights(e, bytes) : NULL;
    if (p == NULL)
        return take_host(e, &e->h_lowp, bytes, true, "host weights in transit", err);
    e->host_bytes += bytes;
    e->host_pinned_bytes += bytes;
    if (!e->dev->host_register(p, bytes)) {
        char need[32];
        zt_format_size(bytes, need, sizeof need);
        return zt_fail(err, ZT_ENOMEM, "could not page-lock the host weights in transit (%s; page-locked memory is "
                       "limited by ulimit -l and the free RAM): raise ulimit -l or free memory", need);
    }
    e->h_lowp = p;
    return 0;
}

/* The host gradient: page-locked like take_host's pinned buffers, but mapped untouched here and page-locked
 * by lock_late_host at the end of zt_engine_create, after the import of the initial weights has given the
 * host slab's pages back. Page-locked memory is resident from the moment it is allocated: taken with the
 * others, the gradient (4 bytes per parameter) and the slab would be resident together at the start. The
 * plan counts it in host_late_bytes, which the start of a run does not hold yet. */
static int take_host_late(zt_engine *e, void **p, size_t bytes, const char *what, zt_err *err)
{
    if (bytes == 0)
        return 0;
    e->host_bytes += bytes;
    e->host_pinned_bytes += bytes;
    e->late_bytes = bytes;
    if (e->dry)
        return 0;
    if ((*p = shared_grad(e, bytes)) != NULL)
        return 0;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        char need[32];
        zt_format_size(bytes, need, sizeof need);
        return zt_fail(err, ZT_ENOMEM, "out of host memory for the %s (%s): free memory, use more ranks, or place the "
                       "optimizer on state servers", what, need);
    }
    *p = m;
    return 0;
}

/* Page-locks the host gradient of take_host_late (once). */
static int lock_late_host(zt_engine *e, zt_err *err)
{
    void *p = e->h_grad ? (void *)e->h_grad : (void *)e->h_grad16;
    if (!p || e->late_registered)
        return 0;
    if (!(e->late_registered = e->dev->host_register(p, e->late_bytes))) {
        char need[32];
        zt_format_size(e->late_bytes, need, sizeof need);
        return zt_fail(err, ZT_ENOMEM, "could not page-lock the host gradient (%s; page-locked memory is limited by "
                       "ulimit -l and the free RAM): raise ulimit -l or free memory", need);
    }
    return 0;
}

/* Elements of this rank's moments held in host memory (placement cpu): all, or with moments_dir those of
 * the blocks before mram_blocks (the shards are laid out in block order). */
static size_t ram_moment_elems(const zt_engine *e)
{
    if (!e->moments_dir[0])
        return e->nshard;
    return e->mram_blocks == 0 ? 0 : e->blocks[e->mram_blocks - 1].shard_off + e->blocks[e->mram_blocks - 1].shard;
}

/* Elements of this rank's fp32 masters held in host memory (HOST and SERVER homes): all, or with masters_disk
 * those of the blocks before xram_blocks. */
static size_t ram_master_elems(const zt_engine *e)
{
    return e->xram_blocks == e->nb ? e->nshard
           : e->xram_blocks == 0   ? 0
                                   : e->blocks[e->xram_blocks - 1].shard_off + e->blocks[e->xram_blocks - 1].shard;
}

/* Allocates every buffer the layout and the path need. */
static int allocate(zt_engine *e, zt_err *err)
{
    const size_t ns = e->nshard, es = e->esize;
    const bool lowp = e->dtype != ZT_DTYPE_F32;
    size_t max_shard = 0, pad_sum = 0, max_other = 0; /* max_shard, max_other: over the blocks but the head's */
    for (int b = 0; b < e->nb; b++) {
        if (b != e->model->head_block && e->blocks[b].shard > max_shard)
            max_shard = e->blocks[b].shard;
        pad_sum += e->blocks[b].padded;
        if (b != e->model->head_block && e->blocks[b].padded > max_other)
            max_other = e->blocks[b].padded;
    }
    int rc = 0;
    if (e->home == ZT__OPT_DEVICE) {
        if ((rc = take_dev(e, (void **)&e->master, ns * 4, "fp32 master weights", err)) < 0 ||
            (rc = take_dev(e, &e->m, ns * e->msize, "Adam first moments", err)) < 0 ||
            (rc = take_dev(e, &e->v, ns * e->msize, "Adam second moments", err)) < 0)
            return rc;
    }
    /* The reduced gradient on the device: every path but the one that writes compute-dtype gradients
     * straight into glow_slab and the one that sends them to the host. */
    if (e->path == ZT__GRAD_DIRECT_F32 || e->path == ZT__GRAD_REDUCE) {
        /* on the CPU with servers the pushes read gshard: in the client's shared memory where it has some */
        if (!e->dev->gpu && !e->dry && (e->gshard = shared_grad(e, ns * 4)) != NULL)
            e->device_bytes += ns * 4;
        else if ((rc = take_dev(e, (void **)&e->gshard, ns * 4, "fp32 gradient shards", err)) < 0)
            return rc;
    }
    /* The weights the passes read: the masters themselves for fp32 on the device; none on the device when
     * they are streamed from host memory (h_lowp). */
    if (e->home == ZT__OPT_DEVICE && !lowp)
        e->wshard = e->master;
    else if (!e->dev->gpu && !e->o.stream && (e->wshard = shared_weights(e, ns * es)) != NULL)
        e->device_bytes += ns * es; /* on the CPU with servers the pulls land in it (h_master below) */
    else if (!e->o.stream && (rc = take_dev(e, &e->wshard, ns * es, "compute-dtype weights", err)) < 0)
        return rc;
    if (e->path == ZT__GRAD_DIRECT_LOWP &&
        (rc = take_dev(e, &e->glow_slab, ns * es, "compute-dtype gradients", err)) < 0)
        return rc;
    /* Compute-dtype gradient buffers of single blocks (the head's block keeps its own through the backward). */
    if ((lowp || e->chunked) && e->path != ZT__GRAD_DIRECT_LOWP) {
        if ((rc = take_dev(e, &e->glow0, e->blocks[e->model->head_block].padded * es, "gradient buffers", err)) < 0 ||
            (rc = take_dev(e, &e->glow1, max_other * es, "gradient buffers", err)) < 0)
            return rc;
        /* chunked: the next block's backward writes one while the fold stream reads the other */
        if (e->chunked && (rc = take_dev(e, &e->glow2, max_other * es, "gradient buffers", err)) < 0)
            return rc;
    }
    if (e->path == ZT__GRAD_REDUCE && e->o.grad_accum > 1) {
        if ((rc = take_dev(e, (void **)&e->gacc, pad_sum * 4, "fp32 gradient accumulation", err)) < 0)
            return rc;
    } else if (e->chunked) {
        /* a piece of every rank's shard, side by side for the reduce-scatter (W = 1: the piece) */
        for (int r = 0; r < ZT__RING; r++)
            if ((rc = take_dev(e, (void **)&e->ring[r], e->o.grad_chunk * (size_t)e->W * 4, "fp32 gradient pieces",
                               err)) < 0)
                return rc;
    } else if (e->path == ZT__GRAD_REDUCE || e->path == ZT__GRAD_HOST) {
        const zt__block *h = &e->blocks[e->model->head_block];
        for (int r = 0; r <= ZT__RING; r++)
            if ((rc = take_dev(e, (void **)&e->ring[r], (r == ZT__RING ? h->padded : max_other) * 4,
                               "fp32 block buffers", err)) < 0)
                return rc;
    }
    if (e->path == ZT__GRAD_HOST && e->W > 1) {
        const zt__block *h = &e->blocks[e->model->head_block];
        for (int r = 0; r <= ZT__RING; r++) {
            const size_t n = e->chunked ? e->o.grad_chunk : r == ZT__RING ? h->shard : max_shard;
            if ((rc = take_dev(e, (void **)&e->dshard[r], n * 4, "gradient shard buffers", err)) < 0 ||
                (rc = take_dev(e, (void **)&e->dshard2[r], n * 4, "gradient shard buffers", err)) < 0)
                return rc;
        }
    }
    if (e->o.stream && e->W > 1) {
        size_t most = 0;
        for (int b = 0; b < e->nb; b++)
            most = e->blocks[b].shard > most ? e->blocks[b].shard : most;
        if ((rc = take_dev(e, &e->sstage, most * es, "streamed shard staging", err)) < 0)
            return rc;
    }
    if (e->o.stream_masters) {
        size_t most = e->blocks[e->model->head_block].shard > max_shard ? e->blocks[e->model->head_block].shard
                                                                          : max_shard;
        e->mpiece = e->o.grad_chunk > 0 && e->o.grad_chunk < most ? e->o.grad_chunk : most;
        if ((rc = take_dev(e, (void **)&e->mstage, e->mpiece * 4, "streamed master pieces", err)) < 0)
            return rc;
    }
    for (int s = 0; s < e->nslots; s++) {
        e->slots[s].elems = e->o.zero_level == 2 ? e->blocks[s].padded : e->max_padded;
        if ((rc = take_dev(e, &e->slots[s].buf, e->slots[s].elems * es, "gathered window", err)) < 0)
            return rc;
    }
    if (e->nres > 0 &&
        ((rc = take_dev(e, (void **)&e->r_master, e->nres * 4, "GPU part of the optimizer (master)", err)) < 0 ||
         (rc = take_dev(e, (void **)&e->r_m, e->nres * 4, "GPU part of the optimizer (m)", err)) < 0 ||
         (rc = take_dev(e, (void **)&e->r_v, e->nres * 4, "GPU part of the optimizer (v)", err)) < 0 ||
         (rc = take_dev(e, (void **)&e->r_grad, e->nres * 4, "GPU part of the optimizer (gradients)", err)) < 0))
        return rc;
    /* Host: the optimizer state and the gradient and weights in transit. On the CPU with servers the fp32 masters
     * pulled from them are the weights the passes read: one array, which the pulls write (no copy after them). */
    if (e->home == ZT__OPT_SERVER && !e->dev->gpu)
        e->h_master = e->wshard;
    else if (e->home == ZT__OPT_HOST || e->home == ZT__OPT_SERVER)
        if ((rc = take_host(e, (void **)&e->h_master, ram_master_elems(e) * 4, false, "host master weights", err)) < 0)
            return rc;
    if (e->o.stream_masters)
        e->host_pinned_bytes += ns * 4; /* page-locked after the first import */
    if (e->home == ZT__OPT_HOST) {
        /* in host memory: every block's moments, or with moments_dir the leading mram_blocks' */
        const size_t nram = ram_moment_elems(e);
        if ((rc = take_host(e, &e->h_m, nram * e->msize, false, "host Adam first moments", err)) < 0 ||
            (rc = take_host(e, &e->h_v, nram * e->msize, false, "host Adam second moments", err)) < 0)
            return rc;
        if (e->moments_dir[0] && e->mram_blocks < e->nb) /* the staging of two blocks' records (zt__mdisk_open) */
            e->host_bytes += 2 * zt__mdisk_buffer_bytes(e);
        e->h_moments_zero = true; /* calloc's zeros, and records created zero */
    }
    if (e->path == ZT__GRAD_HOST) {
        if ((e->hgrad_lowp ? (rc = take_host_late(e, (void **)&e->h_grad16, ns * 2, "host gradient", err))
                           : (rc = take_host_late(e, (void **)&e->h_grad, ns * 4, "host gradient", err))) < 0 ||
            (!e->o.stream_masters && (rc = take_host_weights(e, ns * es, err)) < 0))
            return rc;
        if (e->hacc) {
            size_t most = e->blocks[e->model->head_block].shard > max_shard ? e->blocks[e->model->head_block].shard
                                                                              : max_shard;
            if (e->chunked && e->o.grad_chunk < most)
                most = e->o.grad_chunk;
            if ((rc = take_host(e, (void **)&e->h_gstage, most * 4, true, "host gradient staging", err)) < 0)
                return rc;
        }
    }
    return 0;
}

/* ---- creation ---- */

static int check_options(const zt_engine_options *o, const zt_model *m, zt_err *err)
{
    if (o->stream && (o->placement == ZT_PLACEMENT_GPU || o->zero_level != 3 || o->gpu_fraction > 0 ||
                      (m->backend != ZT_MODEL_CUDA && o->placement != ZT_PLACEMENT_CPU)))
        return zt_fail(err, ZT_EINVAL_CONFIG, "streaming the weights from host memory needs the optimizer off the "
                       "GPU (--optimizer cpu or server, without --optimizer-gpu-fraction; on the CPU, --optimizer "
                       "cpu) and ZeRO level 3");
    if (o->stream_masters && (!o->stream || o->placement != ZT_PLACEMENT_CPU))
        return zt_fail(err, ZT_EINVAL_CONFIG, "streaming the fp32 masters needs streamed weights with --optimizer cpu "
                       "(the host AdamW keeps the masters)");
    if (o->moment_dtype != ZT_DTYPE_F32 && o->moment_dtype != ZT_DTYPE_BF16)
        return zt_fail(err, ZT_EINVAL_CONFIG, "Adam moments in %s are not supported; use fp32 or bf16",
                       zt_dtype_name(o->moment_dtype));
    if (o->moments_dir && o->moments_dir[0] &&
        (o->placement != ZT_PLACEMENT_CPU || o->gpu_fraction > 0 || (m->backend != ZT_MODEL_CUDA && !o->stream)))
        return zt_fail(err, ZT_EINVAL_CONFIG, "Adam moments on disk are read and written by the host AdamW: they need "
                       "--optimizer cpu without --optimizer-gpu-fraction and the optimizer's arrays in host memory "
                       "(--device cuda, or streamed weights)");
    if (o->masters_disk && (!o->moments_dir || !o->moments_dir[0] || o->stream_masters))
        return zt_fail(err, ZT_EINVAL_CONFIG, "fp32 masters on disk live in the records of the Adam moments and the "
                       "passes read a compute-dtype copy: they need --moments-dir and the weights' copy in host "
                       "memory (not --weights masters)");
    if (o->moments_dir && strlen(o->moments_dir) >= 4000)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the moments' directory path is too long (%zu bytes; at most 4000)",
                       strlen(o->moments_dir));
    if (o->moment_dtype == ZT_DTYPE_BF16 && (o->placement != ZT_PLACEMENT_CPU || o->gpu_fraction > 0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "bf16 Adam moments are kept by the host AdamW: they need --optimizer "
                       "cpu without --optimizer-gpu-fraction (or use fp32 moments)");
    if (o->zero_level != 2 && o->zero_level != 3)
        return zt_fail(err, ZT_EINVAL_CONFIG, "ZeRO level %d is not supported; use 2 or 3", o->zero_level);
    if (o->prefetch < 0 || o->grad_accum < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "prefetch depth (%d) must be >= 0 and grad_accum (%d) >= 1", o->prefetch,
                       o->grad_accum);
    if (o->grad_accum > m->max_micro)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is more than the model was made for (%d)", o->grad_accum,
                       m->max_micro);
    if (o->placement == ZT_PLACEMENT_GPU && m->backend != ZT_MODEL_CUDA)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--optimizer gpu needs --device cuda: on the CPU use --optimizer cpu or "
                       "server");
    if (o->placement == ZT_PLACEMENT_SERVER && (!o->client || !o->run_id))
        return zt_fail(err, ZT_EINVAL_CONFIG, "placement server needs a state client and a run id");
    return 0;
}

/* The order in which a training micro-batch asks for block weights: forward 0..nb-1, the head, then the
 * backward of every block that reads weights (nb-1..0). Evaluation stops after the head. */
static void build_sequence(zt_engine *e, bool training)
{
    const zt_model *m = e->model;
    int n = 0;
    for (int b = 0; b < e->nb; b++)
        e->seq[n++] = b;
    e->seq[n++] = m->head_block;
    if (training)
        for (int b = e->nb - 1; b >= 0; b--)
            if (m->backward_reads_weights[b] || m->checkpointed[b])
                e->seq[n++] = b;
    e->seq_len = n;
    e->pos = 0;
}

/* The engine's layout for model on rank `rank` of W with options o: where the optimizer lives, the gradient
 * path, the padded blocks and their shards, the pieces of every tensor, the resident blocks and the window.
 * No device work: zt_engine_plan_for uses it too. */
static zt_engine *layout_new(zt_model *model, int W, int rank, const zt_engine_options *o)
{
    zt_engine *e = zt_xcalloc(1, sizeof *e);
    e->model = model;
    e->o = *o;
    e->o.run_id = NULL;
    if (o->run_id)
        snprintf(e->run_id, sizeof e->run_id, "%s", o->run_id);
    e->o.moments_dir = NULL;
    if (o->moments_dir)
        snprintf(e->moments_dir, sizeof e->moments_dir, "%s", o->moments_dir);
    e->stale_step = -1;
    e->mahead[0] = e->mahead[1] = -1;
#ifdef ZT_WITH_CUDA
    e->dev = model->backend == ZT_MODEL_CUDA ? zt__engine_dev_cuda() : zt__engine_dev_cpu();
#else
    ZT_ASSERT(model->backend == ZT_MODEL_CPU);
    e->dev = zt__engine_dev_cpu();
#endif
    e->W = W;
    e->rank = rank;
    e->nb = model->nblocks;
    e->dtype = model->dtype;
    e->esize = zt_dtype_size(model->dtype);
    e->msize = o->moment_dtype == ZT_DTYPE_BF16 ? 2 : 4;
    e->home = o->placement == ZT_PLACEMENT_SERVER ? ZT__OPT_SERVER
              : o->placement == ZT_PLACEMENT_CPU && (e->dev->gpu || o->stream) ? ZT__OPT_HOST
                                                                 : ZT__OPT_DEVICE;
    if (e->home == ZT__OPT_DEVICE)
        e->path = e->W > 1 ? ZT__GRAD_REDUCE
                  : e->dtype != ZT_DTYPE_F32 && o->grad_accum == 1 ? ZT__GRAD_DIRECT_LOWP
                                                                    : ZT__GRAD_DIRECT_F32;
    else if (e->dev->gpu || e->home == ZT__OPT_HOST)
        e->path = ZT__GRAD_HOST;
    else
        e->path = e->W > 1 ? ZT__GRAD_REDUCE : ZT__GRAD_DIRECT_F32;
    /* pieces: one rank, or several without blocks kept on the GPU (whose gradients take whole-block buffers) */
    e->chunked = e->path == ZT__GRAD_HOST && o->grad_chunk > 0 && (e->W == 1 || o->gpu_fraction == 0);
    e->hgrad_lowp = e->chunked && e->W == 1 && (e->home == ZT__OPT_HOST || e->home == ZT__OPT_SERVER) &&
                    e->dtype == ZT_DTYPE_BF16 &&
                    o->grad_accum == 1 && o->gpu_fraction == 0;
    e->windowed = e->W > 1 || o->stream;
    /* the host adds what the device would: one rank in whole blocks computing in fp32 is left out (its kernels
     * add onto the loaded sum), and fp16 (its scaled fold is one fused operation on a GPU) */
    e->hacc = o->grad_accum_host && e->path == ZT__GRAD_HOST && o->grad_accum > 2 && e->dtype != ZT_DTYPE_F16 &&
              !e->hgrad_lowp && (e->W > 1 || e->chunked || e->dtype != ZT_DTYPE_F32);

    /* Blocks padded to a multiple of W (64 W on a GPU), shards laid end to end. */
    e->blocks = zt_xcalloc((size_t)e->nb, sizeof *e->blocks);
    const size_t unit = (e->dev->gpu ? GPU_SHARD_ALIGN : 1) * (size_t)e->W;
    size_t pad_sum = 0;
    for (int b = 0; b < e->nb; b++) {
        zt__block *k = &e->blocks[b];
        k->len = model->block_len[b];
        k->padded = round_up(k->len, unit);
        k->shard = k->padded / (size_t)e->W;
        k->shard_off = e->nshard;
        k->pad_off = pad_sum;
        k->slot = -1;
        k->ring = -1;
        e->nshard += k->shard;
        pad_sum += k->padded;
        if (k->padded > e->max_padded)
            e->max_padded = k->padded;
    }
    build_pieces(e);
    if (e->home == ZT__OPT_HOST && e->moments_dir[0]) /* the leading blocks whose moments fit the RAM allowed */
        while (e->mram_blocks < e->nb &&
               2 * (e->blocks[e->mram_blocks].shard_off + e->blocks[e->mram_blocks].shard) * e->msize <=
                   o->moments_ram_bytes)
            e->mram_blocks++;
    e->xram_blocks = e->nb;
    if (e->home == ZT__OPT_HOST && e->moments_dir[0] && o->masters_disk) {
        /* the leading blocks whose masters fit the RAM allowed, and at least those whose moments stay there (the
         * masters go to disk after the moments) */
        e->xram_blocks = 0;
        while (e->xram_blocks < e->nb &&
               4 * (e->blocks[e->xram_blocks].shard_off + e->blocks[e->xram_blocks].shard) <= o->masters_ram_bytes)
            e->xram_blocks++;
        if (e->xram_blocks < e->mram_blocks)
            e->xram_blocks = e->mram_blocks;
    }
    if (e->home == ZT__OPT_HOST && o->gpu_fraction > 0) {
        /* the leading blocks until they hold gpu_fraction of this rank's elements */
        const double want = o->gpu_fraction * (double)e->nshard;
        for (int b = 0; b < e->nb && (double)e->nres < want; b++) {
            e->blocks[b].resident = true;
            e->blocks[b].res_off = e->nres;
            e->nres += e->blocks[b].shard;
            e->nresident = b + 1;
        }
    }
    e->nslots = !e->windowed ? 0 : o->zero_level == 2 ? e->nb : o->prefetch + 2;
    e->slots = zt_xcalloc((size_t)(e->nslots > 0 ? e->nslots : 1), sizeof *e->slots);
    for (int s = 0; s < e->nslots; s++)
        e->slots[s].block = -1;
    return e;
}

/* What an engine would hold, without creating it; see engine.h. */
void zt_engine_plan_for(const zt_model *model, int W, const zt_engine_options *o, zt_engine_plan *plan)
{
    zt_engine *e = layout_new((zt_model *)model, W, 0, o);
    e->dry = true;
    zt_err ignored;
    (void)allocate(e, &ignored); /* counts only */
    plan->device_bytes = e->device_bytes;
    plan->host_bytes = e->host_bytes;
    plan->host_pinned_bytes = e->host_pinned_bytes;
    plan->host_late_bytes = e->late_bytes;
    plan->host_moment_bytes = e->home == ZT__OPT_HOST ? 2 * ram_moment_elems(e) * e->msize : 0;
    plan->host_master_bytes = e->home == ZT__OPT_HOST || e->home == ZT__OPT_SERVER ? ram_master_elems(e) * 4 : 0;
    plan->masters_ram_blocks = e->xram_blocks;
    plan->grad_accum_host = e->hacc;
    plan->disk_bytes = e->home == ZT__OPT_HOST && e->moments_dir[0] ? zt__mdisk_bytes(e) : 0;
    plan->moments_ram_blocks = e->home == ZT__OPT_HOST && e->moments_dir[0] ? e->mram_blocks : e->nb;
    plan->shard_elems = e->nshard;
    plan->export_stream_bytes = zt_engine_export_stream_bytes(e);
    plan->import_stream_bytes = zt_engine_import_stream_bytes(e);
    /* import_blocks' and import_field's stage of one block; import_disk_state's three (masters, m, v) */
    plan->import_bytes = (e->home == ZT__OPT_HOST && e->moments_dir[0] ? 3 : 1) * e->max_padded * sizeof(float);
    free(e->blocks);
    free(e->slots);
    free(e->pieces);
    free(e);
}

/* Creates the engine; see engine.h. */
int zt_engine_create(zt_engine **out, zt_model *model, zt_comm *comm, const zt_engine_options *o,
                     const float *host_params, zt_err *err)
{
    *out = NULL;
    int rc = check_options(o, model, err);
    if (rc < 0)
        return rc;
    zt_engine *e = layout_new(model, zt_comm_world_size(comm), zt_comm_rank(comm), o);
    e->comm = comm;
    for (int b = 0; b < e->nb; b++) {
        zt__block *k = &e->blocks[b];
        k->folded = e->dev->event_create();
        k->loaded = e->dev->event_create();
        k->grad_out = e->dev->event_create();
        k->updated = e->dev->event_create();
    }
    for (int s = 0; s < e->nslots; s++) {
        e->slots[s].ready = e->dev->event_create();
        e->slots[s].done = e->dev->event_create();
    }
    for (int r = 0; r <= ZT__RING; r++)
        e->ring_free[r] = e->dev->event_create();
    for (int i = 0; i < 3; i++)
        e->glow_free[i] = e->dev->event_create();
    e->glow_next = 1;
    e->seq = zt_xcalloc((size_t)(2 * e->nb + 2), sizeof(int));
    e->cs = model->stream;
    if (e->dev->gpu) {
        e->ms = e->dev->stream_create();
        e->down = e->dev->stream_create();
        e->up = e->dev->stream_create();
        if (e->chunked && e->W == 1) /* several ranks fold and reduce on the communication stream */
            e->fs = e->dev->stream_create();
    }

    if ((rc = allocate(e, err)) < 0)
        goto fail;
    if (e->hacc) {
        /* the additions into h_grad: one per block, or one per piece of grad_chunk elements */
        e->hadd_first = zt_xcalloc((size_t)e->nb + 1, sizeof *e->hadd_first);
        size_t total = 0;
        for (int b = 0; b < e->nb; b++) {
            e->hadd_first[b] = (int)total;
            total += e->chunked ? (e->blocks[b].shard + e->o.grad_chunk - 1) / e->o.grad_chunk : 1;
        }
        e->hadd_first[e->nb] = (int)total;
        e->hadds = zt_xcalloc(total, sizeof *e->hadds);
        for (int b = 0; b < e->nb; b++) {
            const zt__block *k = &e->blocks[b];
            const size_t piece = e->chunked ? e->o.grad_chunk : k->shard;
            for (int i = e->hadd_first[b]; i < e->hadd_first[b + 1]; i++) {
                const size_t off = (size_t)(i - e->hadd_first[b]) * piece;
                e->hadds[i] = (zt__hadd){.dst = e->h_grad + k->shard_off + off, .src = e->h_gstage,
                                         .n = k->shard - off < piece ? k->shard - off : piece, .threads = o->threads};
            }
        }
    }
    if (e->home == ZT__OPT_HOST && e->moments_dir[0] && (rc = zt__mdisk_open(e, err)) < 0)
        goto fail;
#ifdef ZT_WITH_CUDA
    rc = e->dev->gpu ? zt__engine_dev_setup_cuda(e, err) : zt__engine_dev_setup_cpu(e, err);
#else
    rc = zt__engine_dev_setup_cpu(e, err);
#endif
    if (rc < 0)
        goto fail;
    if ((e->home == ZT__OPT_HOST || e->home == ZT__OPT_SERVER) && (rc = zt__host_opt_create(e, err)) < 0)
        goto fail;
    e->releasing = o->release_host_params; /* the weights' import gives their pages back as it goes */
    e->filling = o->fill_host_block ? host_params : NULL; /* and may have them made block by block */
    rc = host_params ? zt_engine_import(e, host_params, NULL, NULL, err) : 0; /* NULL: zeros, as allocated */
    e->releasing = false;
    e->filling = NULL;
    if (rc < 0 || (rc = lock_late_host(e, err)) < 0)
        goto fail;
    e->plan_device_bytes = e->device_bytes + model->device_bytes;
    *out = e;
    return 0;
fail:
    zt_engine_destroy(e);
    return rc;
}

/* Frees everything; see engine.h. */
void zt_engine_destroy(zt_engine *e)
{
    if (!e)
        return;
    const zt__engine_dev *d = e->dev;
    zt__server_pipe_destroy(e); /* before the host thread: it marks blocks there */
    if (e->host)
        zt__host_opt_destroy(e);
    if (e->mstore || e->mbuf[0] || e->mbuf[1])
        zt__mdisk_close(e);
    if (d->gpu) {
        if (e->cs)
            d->stream_sync(e->cs);
        if (e->ms)
            d->stream_sync(e->ms);
        if (e->down)
            d->stream_sync(e->down);
        if (e->up)
            d->stream_sync(e->up);
        if (e->fs)
            d->stream_sync(e->fs);
    }
    if (d->teardown)
        d->teardown(e);
    for (int b = 0; e->blocks && b < e->nb; b++) {
        d->event_destroy(e->blocks[b].folded);
        d->event_destroy(e->blocks[b].loaded);
        d->event_destroy(e->blocks[b].grad_out);
        d->event_destroy(e->blocks[b].updated);
    }
    for (int s = 0; s < e->nslots; s++) {
        d->event_destroy(e->slots[s].ready);
        d->event_destroy(e->slots[s].done);
        d->free(e->slots[s].buf);
    }
    for (int r = 0; r <= ZT__RING; r++) {
        d->event_destroy(e->ring_free[r]);
        d->free(e->ring[r]);
        d->free(e->dshard[r]);
        d->free(e->dshard2[r]);
    }
    if (e->wshard != e->master && !(e->weights_shared && !d->gpu)) /* shared memory is the client's */
        d->free(e->wshard);
    d->free(e->master);
    d->free(e->m);
    d->free(e->v);
    if (!e->grad_shared || d->gpu)
        d->free(e->gshard);
    d->free(e->glow_slab);
    d->free(e->glow0);
    d->free(e->glow1);
    d->free(e->glow2);
    d->free(e->sstage);
    d->free(e->mstage);
    d->free(e->gacc);
    d->free(e->r_master);
    d->free(e->r_m);
    d->free(e->r_v);
    d->free(e->r_grad);
    if (e->master_registered)
        d->host_unregister(e->h_master);
    if (e->h_master != (float *)e->wshard)
        free(e->h_master); /* calloc (take_host); on the CPU with servers it is wshard */
    free(e->h_m);
    free(e->h_v);
    void *late = e->h_grad ? (void *)e->h_grad : (void *)e->h_grad16;
    if (late) {
        if (e->late_registered)
            d->host_unregister(late);
        if (!e->grad_shared)
            munmap(late, e->late_bytes);
    }
    if (e->weights_shared && d->gpu && e->h_lowp)
        d->host_unregister(e->h_lowp); /* the client's shared memory, freed by the client */
    else
        d->host_free(e->h_lowp);
    d->host_free(e->h_gstage);
    free(e->hadds);
    free(e->hadd_first);
    if (d->gpu) {
        if (e->ms)
            d->stream_destroy(e->ms);
        if (e->down)
            d->stream_destroy(e->down);
        if (e->up)
            d->stream_destroy(e->up);
        if (e->fs)
            d->stream_destroy(e->fs);
    }
    for (int i = 0; i < 3; i++)
        d->event_destroy(e->glow_free[i]);
    free(e->blocks);
    free(e->slots);
    free(e->seq);
    free(e->pieces);
    free(e);
}

/* ---- the plan ---- */

static const char *path_name(enum zt__grad_path p)
{
    switch (p) {
    case ZT__GRAD_DIRECT_LOWP:
        return "compute-dtype gradients read by the optimizer";
    case ZT__GRAD_DIRECT_F32:
        return "fp32 gradients accumulated in place";
    case ZT__GRAD_REDUCE:
        return "fp32 gradients reduce-scattered into the shards";
    case ZT__GRAD_HOST:
        return "gradient shards to host memory, block by block";
    }
    return "?";
}

/* Logs the plan; see engine.h. */
void zt_engine_log_plan(const zt_engine *e)
{
    char dev[32], model[32], host[32], all[32];
    zt_format_size(e->device_bytes, dev, sizeof dev);
    zt_format_size(e->model->device_bytes, model, sizeof model);
    zt_format_size(e->host_bytes, host, sizeof host);
    zt_format_size(e->plan_device_bytes, all, sizeof all);
    size_t total = 0;
    for (int b = 0; b < e->nb; b++)
        total += e->blocks[b].len;
    int nck = 0;
    for (int b = 0; b < e->nb; b++)
        nck += e->model->checkpointed[b];
    static const char *const homes[] = {"on the compute device", "in host memory (AdamW on the host)",
                                        "in state servers"};
    zt_log(ZT_LOG_INFO, "engine: W=%d rank %d, ZeRO-%d, prefetch %d, grad_accum %d, %d of %d blocks checkpointed; "
           "%zu of %zu elements per rank; optimizer state %s%s; %s%s%s",
           e->W, e->rank, e->o.zero_level, e->o.prefetch, e->o.grad_accum, nck, e->nb, e->nshard, total,
           homes[e->home], e->msize == 2 ? " (Adam moments in bf16)" : "", path_name(e->path),
           e->chunked ? " (in pieces)" : "",
           !e->o.stream ? ""
           : e->W == 1  ? "; weights streamed from host memory"
                        : "; weights streamed from host memory, each rank's shard, then all-gathered");
    if (e->mstore) {
        char disk[32];
        zt_format_size(zt__mdisk_bytes(e), disk, sizeof disk);
        zt_log(ZT_LOG_INFO, "engine: state on disk in %s: %s, the Adam moments of blocks %d..%d", e->moments_dir, disk,
               e->mram_blocks, e->nb - 1);
        if (e->xram_blocks < e->nb)
            zt_log(ZT_LOG_INFO, "engine: fp32 masters on disk: blocks %d..%d (read ahead and written behind with their "
                   "moments); host memory keeps the masters of %d block%s and the compute-dtype copy of all", e->xram_blocks,
                   e->nb - 1, e->xram_blocks, e->xram_blocks == 1 ? "" : "s");
    }
    if (e->hacc)
        zt_log(ZT_LOG_INFO, "engine: the gradients of micro-batches 2..%d of a step are added on the host (the sum "
               "comes up once, at the last)", e->o.grad_accum - 1);
    if (e->dev->gpu)
        zt_log(ZT_LOG_INFO, "engine: plan per rank: GPU %s (engine %s + model activations %s; cuBLAS, NCCL and the "
               "CUDA context come on top), host page-locked %s", all, dev, model, host);
    else
        zt_log(ZT_LOG_INFO, "engine: plan per rank: %s of shards, window and gradient buffers (activations are the "
               "model's)", dev);
}

size_t zt_engine_plan_device_bytes(const zt_engine *e)
{
    return e->plan_device_bytes;
}

size_t zt_engine_measured_device_bytes(const zt_engine *e)
{
    return e->measured_device_bytes;
}

/* ---- the window (W > 1) ---- */

/* Position in the micro-batch's order at which block b is asked for next, from position `from` on, or a
 * large number when it is not needed again. */
static int next_use(const zt_engine *e, int b, int from)
{
    for (int j = from; j < e->seq_len; j++)
        if (e->seq[j] == b)
            return j;
    return 1 << 30;
}

/* A slot to gather block b into, needed at position `when`: its own at ZeRO-2; at ZeRO-3 an empty slot or
 * a cached one whose block is needed later than `when` (the one needed last), or -1 when none is. */
static int pick_slot(zt_engine *e, int b, int when)
{
    if (e->o.zero_level == 2)
        return b;
    int best = -1, best_use = -1;
    for (int s = 0; s < e->nslots; s++) {
        zt__slot *sl = &e->slots[s];
        if (sl->state == ZT__SLOT_EMPTY)
            return s;
        if (sl->state != ZT__SLOT_CACHED)
            continue;
        int use = next_use(e, sl->block, e->pos);
        if (use > when && use > best_use) {
            best = s;
            best_use = use;
        }
    }
    return best;
}

/* Enqueues the all-gather of block b into slot s (on the CPU it runs at once). */
static int gather(zt_engine *e, int b, int s, zt_err *err)
{
    zt__slot *sl = &e->slots[s];
    zt__block *k = &e->blocks[b];
    if (sl->block >= 0)
        e->blocks[sl->block].slot = -1;
    if (e->host)
        e->timing.wait_update += zt__host_opt_wait_block(e, b, e->ms);
    e->dev->wait(e->ms, sl->done); /* its previous readers are done */
    int rc = 0;
    if (e->o.stream) {
        /* the block's compute-dtype weights come up from host memory, where the update wrote them: at W = 1
         * the whole block into the slot; at W > 1 this rank's shard, then the all-gather assembles the block
         * (the copy and the gather are ordered on the communication stream, so one staging buffer serves) */
        void *shard = e->W == 1 ? sl->buf : e->sstage;
        if (e->o.stream_masters) {
            /* the fp32 masters piece by piece through mstage, rounded on the way (one stream orders each
             * piece's copy after the previous piece's rounding) */
            for (size_t off = 0; off < k->shard; off += e->mpiece) {
                const size_t n = k->shard - off < e->mpiece ? k->shard - off : e->mpiece;
                e->dev->copy(e->mstage, e->h_master + k->shard_off + off, n * 4, e->ms);
                e->dev->cast((char *)shard + off * e->esize, e->dtype, e->mstage, n, e->ms);
            }
            e->timing.bytes_up += k->shard * 4;
        } else {
            e->dev->copy(shard, (const char *)e->h_lowp + k->shard_off * e->esize, k->shard * e->esize, e->ms);
            e->timing.bytes_up += k->shard * e->esize;
        }
        if (e->W > 1)
            rc = zt_comm_all_gather(e->comm, e->sstage, sl->buf, k->shard, comm_dtype(e->dtype), e->ms, err);
    } else {
        rc = zt_comm_all_gather(e->comm, zt__engine_block_weights(e, b), sl->buf, k->shard, comm_dtype(e->dtype),
                                e->ms, err);
    }
    e->dev->record(sl->ready, e->ms);
    sl->block = b;
    sl->state = ZT__SLOT_GATHERING;
    k->slot = s;
    return rc;
}

/* Gathers the blocks of the next `prefetch` positions that are not in the window yet, while slots allow. */
static int prefetch(zt_engine *e, zt_err *err)
{
    for (int j = e->pos; j < e->seq_len && j < e->pos + e->o.prefetch; j++) {
        int b = e->seq[j];
        if (e->blocks[b].slot >= 0)
            continue;
        int s = pick_slot(e, b, j);
        if (s < 0)
            return 0;
        int rc = gather(e, b, s, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Block b's weights for the next pass on the compute stream. */
static int acquire(zt_engine *e, int b, void **w, zt_err *err)
{
    ZT_ASSERT(e->pos < e->seq_len && e->seq[e->pos] == b);
    e->pos++;
    if (!e->windowed) {
        if (e->host)
            e->timing.wait_update += zt__host_opt_wait_block(e, b, e->cs);
        *w = zt__engine_block_weights(e, b);
        return 0;
    }
    zt__block *k = &e->blocks[b];
    int rc = 0;
    if (k->slot < 0) {
        int s = pick_slot(e, b, e->pos - 1);
        ZT_ASSERT(s >= 0); /* the window has prefetch + 2 slots: two held at most, the rest in flight */
        rc = gather(e, b, s, err);
    }
    zt__slot *sl = &e->slots[k->slot];
    sl->state = ZT__SLOT_HELD;
    if (rc == 0)
        rc = prefetch(e, err);
    e->dev->wait(e->cs, sl->ready);
    *w = sl->buf;
    return rc;
}

/* The pass is done reading block b's weights (for now). */
static void release(zt_engine *e, int b)
{
    if (!e->windowed)
        return;
    zt__block *k = &e->blocks[b];
    ZT_ASSERT(k->slot >= 0);
    zt__slot *sl = &e->slots[k->slot];
    e->dev->record(sl->done, e->cs);
    sl->state = ZT__SLOT_CACHED;
}

/* Forgets what the window holds (the weights changed). */
static void invalidate_window(zt_engine *e)
{
    for (int s = 0; s < e->nslots; s++) {
        e->slots[s].block = -1;
        e->slots[s].state = ZT__SLOT_EMPTY;
    }
    for (int b = 0; b < e->nb; b++)
        e->blocks[b].slot = -1;
}

/* ---- gradients ---- */

/* Takes block b's fp32 buffer once its last user is done (on `stream`): the head block's own, or the next
 * of the ring. */
static int ring_take(zt_engine *e, int b, void *stream)
{
    int r = ZT__RING;
    if (b != e->model->head_block) {
        r = e->ring_next;
        e->ring_next = (r + 1) % ZT__RING;
    }
    e->dev->wait(stream, e->ring_free[r]);
    return r;
}

/* A micro-batch between the step's first and last with grad_accum_host: its gradient goes down and is added
 * on the host (hacc). */
static bool host_adds(const zt_engine *e)
{
    return e->hacc && e->micro > 0 && !e->last;
}

static void hadd_run(void *arg)
{
    const zt__hadd *a = arg;
    zt_cpu_adam_accumulate(a->dst, a->src, a->n, a->threads);
}

/* Sends n fp32 elements of a micro-batch's gradient at src (device) down into the host staging and adds them
 * to the step's sum there (addition i of hadds), in order on the copy stream down. */
static void send_added(zt_engine *e, int i, const float *src, size_t n)
{
    ZT_ASSERT(e->hadds[i].n == n);
    e->dev->copy(e->h_gstage, src, n * 4, e->down);
    e->dev->host_call(e->down, hadd_run, &e->hadds[i]);
    e->timing.bytes_down += n * 4;
}

/* The fp32 buffer of the whole block b that receives its folded gradient (REDUCE and HOST paths). At
 * W = 1 on the HOST path, later micro-batches first load the step's gradient so far from the host, on
 * the up stream while the block's backward runs; `loaded` says whether the compute stream must wait for
 * it (set up here, waited for in grads_done or, in fp32, before the backward). */
static float *fp32_target(zt_engine *e, int b)
{
    zt__block *k = &e->blocks[b];
    if (k->gfull)
        return k->gfull;
    if (e->gacc) {
        k->gfull = e->gacc + k->pad_off;
        return k->gfull;
    }
    int r = ring_take(e, b, e->cs);
    k->ring = r;
    k->gfull = e->ring[r];
    const bool load = e->path == ZT__GRAD_HOST && e->W == 1 && e->micro > 0 && !k->resident && !host_adds(e);
    if (load) {
        /* the gradient so far came down at the previous micro-batch (grad_out); bring it back up */
        e->dev->wait(e->up, e->ring_free[r]);
        e->dev->wait(e->up, k->grad_out);
        e->dev->copy(k->gfull, e->h_grad + k->shard_off, k->shard * 4, e->up);
        e->dev->record(k->loaded, e->up);
        e->timing.bytes_up += k->shard * 4;
    } else if (k->padded > k->len || e->dtype == ZT_DTYPE_F32) {
        /* the padding after the block's last tensor enters the reduce-scatter and the norm: keep it zero
         * (fp32 compute adds into the whole buffer: zero it all) */
        size_t from = e->dtype == ZT_DTYPE_F32 ? 0 : k->len;
        e->dev->memset0(k->gfull + from, (k->padded - from) * 4, e->cs);
    }
    return k->gfull;
}

/* Where block b's backward writes its gradients in this micro-batch (the head's block is asked twice). */
static void *grad_buffer(zt_engine *e, int b)
{
    zt__block *k = &e->blocks[b];
    if (k->gbuf)
        return k->gbuf;
    const bool f32 = e->dtype == ZT_DTYPE_F32;
    switch (e->path) {
    case ZT__GRAD_DIRECT_LOWP:
        k->gbuf = at(e, e->glow_slab, k->shard_off);
        e->dev->memset0(k->gbuf, k->len * e->esize, e->cs);
        break;
    case ZT__GRAD_DIRECT_F32:
        if (f32) {
            k->gbuf = e->gshard + k->shard_off;
            if (e->micro == 0)
                e->dev->memset0(k->gbuf, k->len * 4, e->cs);
            break;
        }
        k->gbuf = b == e->model->head_block ? e->glow0 : e->glow1;
        e->dev->memset0(k->gbuf, k->len * e->esize, e->cs);
        break;
    case ZT__GRAD_REDUCE:
    case ZT__GRAD_HOST:
        if (k->resident && e->W == 1) {
            /* the block's gradient adds up on the GPU, in its part of r_grad */
            if (f32) {
                k->gbuf = e->r_grad + k->res_off;
                if (e->micro == 0)
                    e->dev->memset0(k->gbuf, k->padded * 4, e->cs);
            } else {
                k->gbuf = b == e->model->head_block ? e->glow0 : e->glow1;
                e->dev->memset0(k->gbuf, k->len * e->esize, e->cs);
            }
            break;
        }
        if (e->chunked) {
            /* one rank, the gradient goes out in pieces: the kernels write a whole-block buffer first, one that
             * the fold stream is done reading (the other blocks alternate between two) */
            int i = 0;
            if (b != e->model->head_block) {
                i = e->glow_next;
                e->glow_next = 3 - i;
            }
            k->gbuf = i == 0 ? e->glow0 : i == 1 ? e->glow1 : e->glow2;
            k->glow = i;
            e->dev->wait(e->cs, e->glow_free[i]);
            e->dev->memset0(k->gbuf, k->len * e->esize, e->cs);
            break;
        }
        if (f32) {
            k->gbuf = fp32_target(e, b);
            if (e->gacc && e->micro == 0)
                e->dev->memset0(k->gbuf, k->len * 4, e->cs);
            if (e->path == ZT__GRAD_HOST && e->W == 1 && e->micro > 0 && !host_adds(e))
                e->dev->wait(e->cs, k->loaded); /* the kernels add onto the loaded gradient */
            break;
        }
        if (e->path == ZT__GRAD_HOST)
            (void)fp32_target(e, b); /* start loading the host gradient while the backward runs */
        k->gbuf = b == e->model->head_block ? e->glow0 : e->glow1;
        e->dev->memset0(k->gbuf, k->len * e->esize, e->cs);
        break;
    }
    return k->gbuf;
}

/* One rank, the gradient off the GPU in pieces: block b's gradient g (compute dtype, the whole block) is
 * folded piece by piece into a ring of fp32 buffers, added (after the first micro-batch) onto the step's
 * gradient so far brought up from host memory, and copied down into h_grad. The folds run on their own
 * stream (fs), after the block's backward: the compute stream goes on with the next block's backward
 * (into the other of glow1 and glow2) while the pieces come up, are folded and go down. */
static int send_pieces(zt_engine *e, int b, const void *g)
{
    zt__block *k = &e->blocks[b];
    const size_t piece = e->o.grad_chunk;
    void *fs = e->fs;
    e->dev->record(k->folded, e->cs); /* the block's backward has written g */
    e->dev->wait(fs, k->folded);
    for (size_t off = 0; off < k->shard; off += piece) {
        const size_t n = k->shard - off < piece ? k->shard - off : piece;
        const size_t real = off >= k->len ? 0 : k->len - off < n ? k->len - off : n; /* before the padding */
        const int r = e->ring_next;
        e->ring_next = (r + 1) % ZT__RING;
        float *f = e->ring[r];
        e->dev->wait(fs, e->ring_free[r]);
        const bool adds = host_adds(e);
        if (e->micro > 0 && !adds) {
            e->dev->wait(e->up, e->ring_free[r]);
            e->dev->wait(e->up, k->grad_out); /* the previous micro-batch's copy down */
            e->dev->copy(f, e->h_grad + k->shard_off + off, n * 4, e->up);
            e->timing.bytes_up += n * 4;
            e->dev->record(k->loaded, e->up);
            e->dev->wait(fs, k->loaded);
        } else if (real < n) {
            e->dev->memset0(f + real, (n - real) * 4, fs); /* the padding stays zero */
        }
        if (real > 0)
            e->dev->fold(f, (const char *)g + off * e->esize, e->dtype, real, e->inv_scale, e->micro == 0 || adds, fs);
        if (e->last)
            e->dev->norm_add(e, f, n, fs);
        e->dev->record(k->folded, fs);
        e->dev->wait(e->down, k->folded);
        if (adds) {
            send_added(e, e->hadd_first[b] + (int)(off / piece), f, n);
        } else if (e->hgrad_lowp) {
            /* the bf16 gradient itself (the fold above only feeds the norm); the padding stays zero */
            if (real > 0)
                e->dev->copy(e->h_grad16 + k->shard_off + off, (const char *)g + off * e->esize, real * 2, e->down);
            e->timing.bytes_down += real * 2;
        } else {
            e->dev->copy(e->h_grad + k->shard_off + off, f, n * 4, e->down);
            e->timing.bytes_down += n * 4;
        }
        e->dev->record(e->ring_free[r], e->down);
    }
    /* g may be written again once its last reader is done: the fold stream, or the copies down, which wait
     * for the fold stream */
    e->dev->record(e->glow_free[k->glow], e->hgrad_lowp ? e->down : fs);
    e->dev->record(k->grad_out, e->down);
    if (e->last && e->home == ZT__OPT_SERVER)
        zt__host_opt_push(e, b);
    return 0;
}

/* Several ranks, the gradient off the GPU in pieces: for each piece of grad_chunk elements of a shard, the
 * matching piece of every rank's shard of block b's gradient g is folded into fp32 side by side, the
 * pieces are reduce-scattered (this rank's sum lands in dshard), the step's gradient so far comes up and
 * is added after the first micro-batch, and the sum goes down into h_grad. On the communication stream,
 * in order with the gathers, as the whole-block path does; the GPU holds pieces instead of blocks. */
static int send_pieces_reduced(zt_engine *e, int b, const void *g, zt_err *err)
{
    zt__block *k = &e->blocks[b];
    const size_t piece = e->o.grad_chunk;
    e->dev->record(k->folded, e->cs); /* the block's backward has written g */
    e->dev->wait(e->ms, k->folded);
    int rc = 0;
    for (size_t off = 0; off < k->shard && rc == 0; off += piece) {
        const size_t n = k->shard - off < piece ? k->shard - off : piece;
        const int r = e->ring_next;
        e->ring_next = (r + 1) % ZT__RING;
        float *in = e->ring[r], *out = e->dshard[r];
        e->dev->wait(e->ms, e->ring_free[r]);
        for (int q = 0; q < e->W; q++) {
            const size_t at = (size_t)q * k->shard + off; /* rank q's piece in the block */
            const size_t real = at >= k->len ? 0 : k->len - at < n ? k->len - at : n;
            if (real < n)
                e->dev->memset0(in + (size_t)q * n + real, (n - real) * 4, e->ms); /* the padding stays zero */
            if (real > 0)
                e->dev->fold(in + (size_t)q * n, (const char *)g + at * e->esize, e->dtype, real, e->inv_scale, true,
                             e->ms);
        }
        rc = zt_comm_reduce_scatter(e->comm, in, out, n, ZT_COMM_F32, ZT_COMM_SUM, e->ms, err);
        const bool adds = host_adds(e);
        if (e->micro > 0 && !adds) {
            /* add the step's gradient so far, brought up from the host */
            e->dev->wait(e->up, e->ring_free[r]);
            e->dev->wait(e->up, k->grad_out);
            e->dev->copy(e->dshard2[r], e->h_grad + k->shard_off + off, n * 4, e->up);
            e->timing.bytes_up += n * 4;
            e->dev->record(k->loaded, e->up);
            e->dev->wait(e->ms, k->loaded);
            e->dev->fold(out, e->dshard2[r], ZT_DTYPE_F32, n, 1.0f, false, e->ms);
        }
        if (e->last)
            e->dev->norm_add(e, out, n, e->ms);
        e->dev->record(k->folded, e->ms);
        e->dev->wait(e->down, k->folded);
        if (adds) {
            send_added(e, e->hadd_first[b] + (int)(off / piece), out, n);
        } else {
            e->dev->copy(e->h_grad + k->shard_off + off, out, n * 4, e->down);
            e->timing.bytes_down += n * 4;
        }
        e->dev->record(e->ring_free[r], e->down);
    }
    e->dev->record(e->glow_free[k->glow], e->ms); /* g may be written again */
    e->dev->record(k->grad_out, e->down);
    if (e->last && e->home == ZT__OPT_SERVER)
        zt__host_opt_push(e, b);
    return rc;
}

/* Block b's backward is enqueued: fold its gradients into fp32 and move them on (reduce-scatter on the
 * last micro-batch; to the host on the HOST path). */
static int grads_done(zt_engine *e, int b, zt_err *err)
{
    zt__block *k = &e->blocks[b];
    const bool f32 = e->dtype == ZT_DTYPE_F32;
    int rc = 0;
    void *g = k->gbuf;
    k->gbuf = NULL;
    switch (e->path) {
    case ZT__GRAD_DIRECT_LOWP:
        return 0;
    case ZT__GRAD_DIRECT_F32:
        if (!f32)
            e->dev->fold(e->gshard + k->shard_off, g, e->dtype, k->len, e->inv_scale, e->micro == 0, e->cs);
        return 0;
    case ZT__GRAD_REDUCE: {
        float *f = fp32_target(e, b);
        if (!f32)
            e->dev->fold(f, g, e->dtype, k->len, e->inv_scale, e->micro == 0 || !e->gacc, e->cs);
        if (!e->last) {
            k->gfull = NULL; /* grad_accum > 1: kept in gacc */
            return 0;
        }
        e->dev->record(k->folded, e->cs);
        e->dev->wait(e->ms, k->folded);
        rc = zt_comm_reduce_scatter(e->comm, f, e->gshard + k->shard_off, k->shard, ZT_COMM_F32, ZT_COMM_SUM, e->ms,
                                    err);
        if (k->ring >= 0)
            e->dev->record(e->ring_free[k->ring], e->ms);
        k->ring = -1;
        k->gfull = NULL;
        return rc;
    }
    case ZT__GRAD_HOST:
        break;
    }
    if (k->resident) {
        /* HOST path, a block whose optimizer stays on the GPU: its gradient adds up in r_grad */
        float *acc = e->r_grad + k->res_off;
        void *stream = e->cs;
        if (e->W == 1) {
            if (!f32)
                e->dev->fold(acc, g, e->dtype, k->len, e->inv_scale, e->micro == 0, e->cs);
        } else {
            float *f = fp32_target(e, b);
            if (!f32)
                e->dev->fold(f, g, e->dtype, k->len, e->inv_scale, true, e->cs);
            const int r = k->ring;
            e->dev->record(k->folded, e->cs);
            e->dev->wait(e->ms, k->folded);
            rc = zt_comm_reduce_scatter(e->comm, f, e->dshard[r], k->shard, ZT_COMM_F32, ZT_COMM_SUM, e->ms, err);
            e->dev->fold(acc, e->dshard[r], ZT_DTYPE_F32, k->shard, 1.0f, e->micro == 0, e->ms);
            e->dev->record(e->ring_free[r], e->ms);
            k->ring = -1;
            k->gfull = NULL;
            stream = e->ms;
        }
        if (e->last && e->fs) {
            /* the norm's partial sums take every addition on one stream: the fold stream's pieces too */
            e->dev->record(k->folded, stream);
            e->dev->wait(e->fs, k->folded);
            stream = e->fs;
        }
        if (e->last)
            e->dev->norm_add(e, acc, k->shard, stream);
        return rc;
    }
    if (e->chunked)
        return e->W == 1 ? send_pieces(e, b, g) : send_pieces_reduced(e, b, g, err);
    /* HOST: this micro-batch's part of the owned shard, plus the earlier ones', goes down to h_grad. */
    float *f = fp32_target(e, b);
    const bool adds = host_adds(e);
    const bool loaded = e->W == 1 && e->micro > 0 && !adds;
    if (!f32) {
        if (loaded)
            e->dev->wait(e->cs, k->loaded); /* the host gradient is on the device */
        e->dev->fold(f, g, e->dtype, k->len, e->inv_scale, !loaded, e->cs);
    }
    float *out = f;
    void *out_stream = e->cs;
    const int r = k->ring;
    if (e->W > 1) {
        e->dev->record(k->folded, e->cs);
        e->dev->wait(e->ms, k->folded);
        out = e->dshard[r];
        rc = zt_comm_reduce_scatter(e->comm, f, out, k->shard, ZT_COMM_F32, ZT_COMM_SUM, e->ms, err);
        out_stream = e->ms;
        if (e->micro > 0 && !adds) {
            /* add the step's gradient so far, brought up from the host */
            e->dev->wait(e->up, k->grad_out);
            e->dev->copy(e->dshard2[r], e->h_grad + k->shard_off, k->shard * 4, e->up);
            e->timing.bytes_up += k->shard * 4;
            e->dev->record(k->loaded, e->up);
            e->dev->wait(e->ms, k->loaded);
            e->dev->fold(out, e->dshard2[r], ZT_DTYPE_F32, k->shard, 1.0f, false, e->ms);
        }
    }
    if (e->last)
        e->dev->norm_add(e, out, k->shard, out_stream);
    e->dev->record(k->folded, out_stream);
    e->dev->wait(e->down, k->folded);
    if (adds) {
        send_added(e, e->hadd_first[b], out, k->shard);
    } else {
        e->dev->copy(e->h_grad + k->shard_off, out, k->shard * 4, e->down);
        e->timing.bytes_down += k->shard * 4;
    }
    e->dev->record(k->grad_out, e->down);
    e->dev->record(e->ring_free[r], e->down);
    k->ring = -1;
    k->gfull = NULL;
    if (e->last && e->home == ZT__OPT_SERVER)
        zt__host_opt_push(e, b);
    return rc;
}

/* ---- a micro-batch ---- */

/* One micro-batch; see engine.h. */
int zt_engine_micro(zt_engine *e, const int32_t *tokens, const int32_t *targets, int B, int T,
                    const zt_model_docs *docs, int micro, float grad_weight, float loss_scale, zt_err *err)
{
    zt_model *m = e->model;
    ZT_ASSERT(micro >= 0 && micro < e->o.grad_accum);
    if (micro == 0) {
        memset(&e->timing, 0, sizeof e->timing);
        e->timing.server_update_s = -1.0; /* unknown until a commit's answer says */
        e->t_step0 = zt_now_s();
    }
    e->training = true;
    e->micro = micro;
    e->last = micro == e->o.grad_accum - 1;
    e->inv_scale = 1.0f / loss_scale;
    int rc;
    void *w;
    for (bool again = true; again;) {
        again = false;
        build_sequence(e, true);
        m->ops->begin(m, tokens, targets, B, T, micro, docs);
        rc = e->windowed ? prefetch(e, err) : 0;
        for (int b = 0; b < e->nb && rc == 0; b++) {
            if ((rc = acquire(e, b, &w, err)) < 0)
                break;
            m->ops->forward(m, b, w);
            if (m->checkpointed[b])
                m->ops->discard(m, b);
            release(e, b);
        }
        /* servers: the last step's commit went on during this forward; agreed before the backward writes
         * gradients (a step pushed and committed again gives new weights: the forward again) */
        if (rc == 0 && micro == 0 && e->home == ZT__OPT_SERVER && (rc = zt__server_settle_step(e, &again, err)) == 0 &&
            again)
            invalidate_window(e);
    }
    const int h = m->head_block;
    if (rc == 0 && (rc = acquire(e, h, &w, err)) == 0) {
        m->ops->head(m, w, loss_scale * grad_weight);
        m->ops->head_backward(m, w, grad_buffer(e, h));
        release(e, h);
    }
    for (int b = e->nb - 1; b >= 0 && rc == 0; b--) {
        w = NULL;
        const bool reads = m->backward_reads_weights[b] || m->checkpointed[b];
        if (reads && (rc = acquire(e, b, &w, err)) < 0)
            break;
        if (m->checkpointed[b])
            m->ops->forward(m, b, w); /* rebuild the activations from the kept input */
        m->ops->backward(m, b, w, grad_buffer(e, b));
        if (reads)
            release(e, b);
        rc = grads_done(e, b, err);
        if (rc == 0 && e->last && e->home == ZT__OPT_SERVER && !e->dev->gpu)
            zt__host_opt_push(e, b); /* gshard holds the block's gradient shard: push it during the backward */
    }
    if (rc == 0)
        ZT_ASSERT(e->pos == e->seq_len);
    e->micros_done = micro + 1;
    return rc;
}

/* The mean of the step's micro-batch losses on this rank (the model's stream is done). */
static double local_loss(zt_engine *e)
{
    double sum = 0.0;
    for (int k = 0; k < e->micros_done; k++)
        sum += e->model->ops->loss(e->model, k);
    return sum / e->micros_done;
}

/* The step; see engine.h. */
int zt_engine_step(zt_engine *e, float lr, int64_t adam_step, zt_engine_step_result *res, zt_err *err)
{
    ZT_ASSERT(e->micros_done == e->o.grad_accum);
    memset(res, 0, sizeof *res);
    int rc;
    if (e->mstore) {
        /* the passes of this step have waited for every block's update of the last, so a disk failure in it is
         * known here (a failed write behind the last block, at the latest at the next step): every rank stops
         * before updating with what it computed on the blocks left behind */
        if ((rc = zt__engine_agree(e, zt__host_opt_failed(e, err), err)) < 0)
            return rc;
    }
    if (e->home == ZT__OPT_DEVICE) {
        rc = e->dev->resident_step(e, lr, adam_step, res, err);
    } else {
        /* The gradient left the device (or, on the CPU with servers, sits in gshard): the norm and the
         * losses first, then the update where the optimizer lives. */
        const double t0 = zt_now_s();
        double sumsq = 0.0, loss = 0.0;
        bool nonfinite = false;
        rc = e->dev->norm_finish(e, &sumsq, &nonfinite, err);
        e->timing.wait_norm = zt_now_s() - t0;
        if (rc == 0)
            rc = zt_engine_mean(e, local_loss(e), &loss, err);
        if (rc < 0)
            return rc;
        res->loss = (float)loss;
        res->grad_norm = sqrt(sumsq);
        res->skipped = nonfinite || !isfinite(res->loss) || !isfinite(res->grad_norm);
        res->clip_coef = 1.0f;
        if (!res->skipped)
            res->clip_coef = zt_optimizer_clip_coef(res->grad_norm, e->o.grad_clip);
        if (e->home == ZT__OPT_HOST) {
            if (e->nres > 0 && !res->skipped)
                e->dev->resident_update(e, lr, res->clip_coef, adam_step);
            for (int b = 0; b < e->nresident; b++) /* their update is on the compute stream, before any next pass */
                zt__host_opt_mark(e, b, e->step_no + 1);
            zt__host_opt_update(e, lr, res->clip_coef, adam_step, res->skipped);
        } else {
            rc = zt__server_step(e, res->grad_norm, res->clip_coef, lr, res->skipped, err);
            if (rc < 0)
                return rc;
        }
    }
    if (rc < 0)
        return rc;
    invalidate_window(e);
    e->h_moments_zero = false; /* the host AdamW writes them */
    e->step_no++;
    e->micros_done = 0;
    e->timing.step = zt_now_s() - e->t_step0;
    e->last_timing = e->timing;
    if (e->measured_device_bytes == 0 && e->dev->used_bytes)
        e->measured_device_bytes = e->dev->used_bytes(e); /* in use after the first step, for the plan's check */
    return 0;
}

/* Evaluation; see engine.h. */
int zt_engine_eval(zt_engine *e, const int32_t *tokens, const int32_t *targets, int B, int T,
                   const zt_model_docs *docs, float *loss, zt_err *err)
{
    zt_model *m = e->model;
    if (e->home == ZT__OPT_SERVER) { /* the weights pulled after the last step, on every rank */
        int src = zt__server_settle(e, err);
        if (src < 0)
            return src;
    }
    e->training = false;
    build_sequence(e, false);
    m->ops->begin(m, tokens, targets, B, T, 0, docs);
    int rc = e->windowed ? prefetch(e, err) : 0;
    void *w;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        if ((rc = acquire(e, b, &w, err)) < 0)
            break;
        m->ops->forward(m, b, w);
        release(e, b);
    }
    if (rc == 0 && (rc = acquire(e, m->head_block, &w, err)) == 0) {
        m->ops->head(m, w, 0.0f);
        release(e, m->head_block);
    }
    if (e->dev->gpu)
        e->dev->stream_sync(e->cs);
    if (rc < 0)
        return rc;
    double mean = 0;
    rc = zt_engine_mean(e, m->ops->loss(m, 0), &mean, err);
    *loss = (float)mean;
    return rc;
}

/* ---- the training state in the host layout ---- */

/* Waits until the update of the last step is done everywhere (host thread, copies, device). */
static int settle(zt_engine *e, zt_err *err)
{
    int rc = e->home == ZT__OPT_SERVER ? zt__server_settle(e, err) : 0;
    if (rc == 0 && e->host)
        rc = zt__host_opt_drain(e, err);
    if (e->host)
        for (int b = 0; b < e->nb; b++)
            (void)zt__host_opt_wait_block(e, b, e->cs);
    if (e->dev->gpu) {
        e->dev->stream_sync(e->cs);
        e->dev->stream_sync(e->ms);
        e->dev->stream_sync(e->up);
        if (e->fs)
            e->dev->stream_sync(e->fs);
        e->dev->stream_sync(e->down);
    }
    if (rc == 0 && e->mstore)
        rc = zt__host_opt_failed(e, err);
    return rc;
}

/* The resident blocks' optimizer state (gpu_fraction) between the GPU and the host arrays: up after an
 * import, down before an export. */
static void sync_resident(zt_engine *e, bool to_host)
{
    /* fp32 moments: bf16 ones are refused with gpu_fraction */
    float *host[4] = {e->h_master, (float *)e->h_m, (float *)e->h_v, e->h_grad};
    float *dev[4] = {e->r_master, e->r_m, e->r_v, e->r_grad};
    for (int b = 0; b < e->nresident; b++) {
        const zt__block *k = &e->blocks[b];
        for (int i = 0; i < (to_host ? 4 : 3); i++) {
            float *h = host[i] + k->shard_off, *d = dev[i] + k->res_off;
            e->dev->copy(to_host ? (void *)h : (void *)d, to_host ? (const void *)d : (const void *)h, k->shard * 4,
                         e->cs);
        }
    }
    if (e->nresident > 0)
        e->dev->stream_sync(e->cs);
}

/* Gathers block b's shard of every rank (src: this rank's fp32 shard, device or host memory) into stage
 * (max_padded floats: the block in the model's layout) and, unless slab is NULL, into the block's place in a
 * host-layout slab. */
static int export_block(zt_engine *e, int b, const float *src, bool on_device, float *stage, float *slab, zt_err *err)
{
    const zt__block *k = &e->blocks[b];
    int rc = 0;
    if (e->W == 1) {
        if (on_device)
            e->dev->copy(stage, src, k->padded * 4, e->cs), e->dev->stream_sync(e->cs);
        else
            memcpy(stage, src, k->padded * 4);
    } else if (e->dev->gpu && e->chunked) {
        /* NCCL gathers device memory, here through the gradient's piece buffers: this rank's piece up, the
         * all-gather, then each rank's part down into its place */
        const size_t piece = e->o.grad_chunk;
        float *d_in = e->dshard[0], *d_out = e->ring[0];
        for (size_t off = 0; off < k->shard && rc == 0; off += piece) {
            const size_t n = k->shard - off < piece ? k->shard - off : piece;
            e->dev->copy(d_in, src + off, n * 4, e->ms);
            rc = zt_comm_all_gather(e->comm, d_in, d_out, n, ZT_COMM_F32, e->ms, err);
            for (int q = 0; rc == 0 && q < e->W; q++)
                e->dev->copy(stage + (size_t)q * k->shard + off, d_out + (size_t)q * n, n * 4, e->ms);
            e->dev->stream_sync(e->ms); /* d_in and d_out are taken again by the next piece's copies */
        }
    } else if (e->dev->gpu) {
        /* NCCL gathers device memory: through the block's fp32 buffer (the head's own, or the ring's first) */
        const int r = b == e->model->head_block ? ZT__RING : 0;
        float *d_in = e->dshard[r];
        if (!on_device) {
            ZT_ASSERT(d_in); /* host-held state has the HOST path's shard buffers */
            e->dev->copy(d_in, src, k->shard * 4, e->ms);
            src = d_in;
        }
        float *d_out = e->ring[r] ? e->ring[r] : e->gacc;
        ZT_ASSERT(d_out);
        rc = zt_comm_all_gather(e->comm, src, d_out, k->shard, ZT_COMM_F32, e->ms, err);
        if (rc == 0) {
            e->dev->copy(stage, d_out, k->padded * 4, e->ms);
            e->dev->stream_sync(e->ms);
        }
    } else {
        rc = zt_comm_all_gather(e->comm, src, stage, k->shard, ZT_COMM_F32, NULL, err);
    }
    if (rc == 0 && slab)
        block_to_host(e, b, stage, slab);
    return rc;
}

/* Gathers one shard slab of every rank (device or host memory; fp32, or bf16 moments in host memory, widened
 * block by block) into a host-layout fp32 slab. */
static int export_field(zt_engine *e, const void *field, enum zt_dtype fdt, bool on_device, float *slab, zt_err *err)
{
    float *stage = zt_xmalloc(e->max_padded * sizeof(float));
    float *wide = NULL;
    if (fdt == ZT_DTYPE_BF16) {
        ZT_ASSERT(!on_device || !e->dev->gpu); /* bf16 moments live in host memory */
        wide = zt_xmalloc(e->max_padded * sizeof(float));
    }
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        const zt__block *k = &e->blocks[b];
        const float *src = (const float *)field + k->shard_off;
        bool dev = on_device;
        if (wide) {
            zt_err werr;
            int wrc = zt_cpu_adam_widen(wide, (const uint16_t *)field + k->shard_off, ZT_DTYPE_BF16, k->shard,
                                        e->o.threads, &werr);
            ZT_ASSERT(wrc == 0); /* bf16 is a supported dtype */
            (void)wrc;
            src = wide;
            dev = false;
        }
        rc = export_block(e, b, src, dev, stage, slab, err);
    }
    free(stage);
    free(wide);
    return rc;
}

/* State on disk: every block's record read back once (its masters where it holds them, its moments widened),
 * or its state in host memory (moments widened), then gathered like export_field: the host holds one block's
 * state at a time, never a second copy of what is on disk. params, m and v may be NULL. */
static int export_disk_state(zt_engine *e, float *params, float *m, float *v, zt_err *err)
{
    float *stage = zt_xmalloc(e->max_padded * sizeof(float));
    float *wm = zt_xcalloc(e->max_padded, sizeof(float)), *wv = zt_xcalloc(e->max_padded, sizeof(float));
    float *wx = zt_xcalloc(e->max_padded, sizeof(float));
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        const zt__block *k = &e->blocks[b];
        const bool own = zt__mdisk_has_master(e, b);
        const float *master = own ? wx : e->h_master + k->shard_off;
        if (own || (zt__mdisk_has(e, b) && (m || v))) {
            rc = zt__mdisk_load(e, b, wx, wm, wv, err);
        } else if (m || v) {
            const char *src[2] = {(const char *)e->h_m + k->shard_off * e->msize,
                                  (const char *)e->h_v + k->shard_off * e->msize};
            float *dst[2] = {wm, wv};
            for (int i = 0; i < 2 && rc == 0; i++)
                rc = zt_cpu_adam_widen(dst[i], src[i], e->o.moment_dtype, k->shard, e->o.threads, err);
        }
        rc = zt__engine_agree(e, rc, err);
        if (rc == 0 && params)
            rc = export_block(e, b, master, false, stage, params, err);
        if (rc == 0 && m)
            rc = export_block(e, b, wm, false, stage, m, err);
        if (rc == 0 && v)
            rc = export_block(e, b, wv, false, stage, v, err);
    }
    free(stage);
    free(wm);
    free(wv);
    free(wx);
    return rc;
}

/* The largest shard of a block. */
static size_t max_shard(const zt_engine *e)
{
    size_t most = 0;
    for (int b = 0; b < e->nb; b++)
        most = e->blocks[b].shard > most ? e->blocks[b].shard : most;
    return most;
}

/* Whether zt_engine_export_stream applies: the host AdamW's state with a part of it in records on disk. */
static bool streams_export(const zt_engine *e)
{
    return e->home == ZT__OPT_HOST && e->moments_dir[0];
}

/* The host bytes zt_engine_export_stream holds: this rank's fp32 masters, m and v of one block and, with
 * several ranks, the three gathered blocks. */
static size_t export_stream_bytes(const zt_engine *e)
{
    if (!streams_export(e))
        return 0;
    return 3 * 4 * (max_shard(e) + (e->W > 1 ? e->max_padded : 0));
}

size_t zt_engine_export_stream_bytes(const zt_engine *e)
{
    return export_stream_bytes(e);
}

bool zt_engine_exports_streamed(const zt_engine *e)
{
    return streams_export(e);
}

/* The state block by block to a sink, from the records on disk and the host arrays; see engine.h. */
int zt_engine_export_stream(zt_engine *e, zt_engine_state_sink sink, void *ctx, zt_err *err)
{
    if (!streams_export(e))
        return zt_fail(err, ZT_EUNSUPPORTED, "zt_engine_export_stream needs the optimizer state on disk (moments_dir "
                       "with placement cpu); use zt_engine_export");
    int rc = settle(e, err);
    if (rc < 0)
        return rc;
    const size_t S = max_shard(e);
    float *own[3], *all[3] = {NULL, NULL, NULL}; /* masters, m, v: this rank's shard, and the gathered block */
    for (int i = 0; i < 3; i++) {
        own[i] = zt_xcalloc(S, sizeof(float));
        if (e->W > 1)
            all[i] = zt_xcalloc(e->max_padded, sizeof(float));
    }
    const zt_model *md = e->model;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        const zt__block *k = &e->blocks[b];
        if (zt__mdisk_has_master(e, b) || zt__mdisk_has(e, b)) {
            rc = zt__mdisk_load(e, b, own[0], own[1], own[2], err);
        }
        if (rc == 0 && !zt__mdisk_has(e, b)) {
            const char *src[2] = {(const char *)e->h_m + k->shard_off * e->msize,
                                  (const char *)e->h_v + k->shard_off * e->msize};
            for (int i = 0; i < 2 && rc == 0; i++)
                rc = zt_cpu_adam_widen(own[1 + i], src[i], e->o.moment_dtype, k->shard, e->o.threads, err);
        }
        const float *src[3] = {zt__mdisk_has_master(e, b) ? own[0] : e->h_master + k->shard_off, own[1], own[2]};
        rc = zt__engine_agree(e, rc, err);
        const float *block[3] = {src[0], src[1], src[2]}; /* W = 1: the shard is the block */
        for (int i = 0; i < 3 && rc == 0 && e->W > 1; i++) {
            rc = export_block(e, b, src[i], false, all[i], NULL, err);
            block[i] = all[i];
        }
        for (int i = 0; i < md->ntensors && rc == 0 && sink; i++) {
            const zt_model_tensor *t = &md->tensors[i];
            if (t->block != b)
                continue;
            const size_t at = t->offset - md->block_offset[b];
            rc = sink(ctx, t->host_offset, t->numel, block[0] + at, block[1] + at, block[2] + at, err);
        }
        rc = zt__engine_agree(e, rc, err);
    }
    for (int i = 0; i < 3; i++) {
        free(own[i]);
        free(all[i]);
    }
    return rc;
}

/* The full state in the host layout; see engine.h. */
int zt_engine_export(zt_engine *e, float *params, float *m, float *v, zt_err *err)
{
    int rc = settle(e, err);
    if (rc < 0)
        return rc;
    switch (e->home) {
    case ZT__OPT_DEVICE:
        rc = export_field(e, e->master, ZT_DTYPE_F32, e->dev->gpu, params, err);
        if (rc == 0 && m)
            rc = export_field(e, e->m, e->o.moment_dtype, e->dev->gpu, m, err);
        if (rc == 0 && v)
            rc = export_field(e, e->v, e->o.moment_dtype, e->dev->gpu, v, err);
        return rc;
    case ZT__OPT_HOST:
        sync_resident(e, true);
        if (e->mstore)
            return export_disk_state(e, params, m, v, err);
        rc = export_field(e, e->h_master, ZT_DTYPE_F32, false, params, err);
        if (rc == 0 && m)
            rc = export_field(e, e->h_m, e->o.moment_dtype, false, m, err);
        if (rc == 0 && v)
            rc = export_field(e, e->h_v, e->o.moment_dtype, false, v, err);
        return rc;
    case ZT__OPT_SERVER:
        break;
    }
    /* servers: the masters of the last step; the moments only from an embedded core (one rank) */
    if (params && (rc = zt__engine_agree(e, zt__server_fresh_masters(e, err), err)) < 0)
        return rc;
    rc = export_field(e, e->h_master, ZT_DTYPE_F32, false, params, err);
    zt_server_core *core = zt_state_client_embedded_core(e->o.client);
    if (rc < 0 || !core || (!m && !v))
        return rc;
    float *stage = zt_xmalloc(e->max_padded * sizeof(float));
    for (int b = 0; b < e->nb && rc == 0; b++) {
        float *dst[2] = {m, v};
        const enum zt_server_state_tensor which[2] = {ZT_SERVER_ADAM_M, ZT_SERVER_ADAM_V};
        for (int i = 0; i < 2 && rc == 0; i++) {
            int64_t at_step = -1;
            if (!dst[i])
                continue;
            rc = zt_server_core_read_state(core, e->run_id, b, 0, which[i], stage, &at_step, err);
            if (rc == 0 && at_step != e->server_step)
                rc = zt_fail(err, ZT_ESTATE, "the embedded state server is at step %lld, the engine at %lld",
                             (long long)at_step, (long long)e->server_step);
            if (rc == 0)
                block_to_host(e, b, stage, dst[i]);
        }
    }
    free(stage);
    return rc;
}

/* One compute-dtype value as fp32 (bf16: the top half of an fp32; fp16: IEEE half). */
static float lowp_to_float(const void *p, size_t i, enum zt_dtype dt)
{
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == ZT_DTYPE_BF16 ? zt_bf16_to_f32(h) : zt_f16_to_f32(h);
}

/* The last step's gradient in the host layout; see engine.h. */
int zt_engine_export_grads(zt_engine *e, float *grads, zt_err *err)
{
    int rc = settle(e, err);
    if (rc < 0)
        return rc;
    if (e->path == ZT__GRAD_HOST) {
        sync_resident(e, true);
        if (!e->hgrad_lowp)
            return export_field(e, e->h_grad, ZT_DTYPE_F32, false, grads, err);
        /* the micro-batch's bf16 gradient, its loss scale (1 in training: bf16 is not scaled) removed here */
        if ((rc = export_field(e, e->h_grad16, ZT_DTYPE_BF16, false, grads, err)) < 0 || e->inv_scale == 1.0f)
            return rc;
        for (size_t i = 0; i < e->model->host_numel; i++)
            grads[i] *= e->inv_scale;
        return 0;
    }
    if (e->path != ZT__GRAD_DIRECT_LOWP)
        return export_field(e, e->gshard, ZT_DTYPE_F32, e->dev->gpu, grads, err);
    /* W = 1, compute-dtype gradients in glow_slab with the loss scale still applied */
    void *low = zt_xmalloc(e->max_padded * e->esize);
    float *stage = zt_xmalloc(e->max_padded * sizeof(float));
    for (int b = 0; b < e->nb; b++) {
        const zt__block *k = &e->blocks[b];
        e->dev->copy(low, at(e, e->glow_slab, k->shard_off), k->padded * e->esize, e->cs);
        e->dev->stream_sync(e->cs);
        for (size_t i = 0; i < k->padded; i++)
            stage[i] = lowp_to_float(low, i, e->dtype) * e->inv_scale;
        block_to_host(e, b, stage, grads);
    }
    free(low);
    free(stage);
    return 0;
}

/* Gives back the pages of block b's tensors in a host-layout slab (release_host_params), except where a later
 * block's tensor shares them: import walks the blocks in order, so a range goes once its last reader is done.
 * Only the whole pages inside each tensor are given back. */
static void release_block_source(const zt_engine *e, int b, const float *slab)
{
    const zt_model *m = e->model;
    for (int i = 0; i < m->ntensors; i++) {
        const zt_model_tensor *t = &m->tensors[i];
        if (t->block != b)
            continue;
        bool later = false;
        for (int j = 0; j < m->ntensors && !later; j++) {
            const zt_model_tensor *u = &m->tensors[j];
            later = u->block > b && u->host_offset < t->host_offset + t->numel &&
                    t->host_offset < u->host_offset + u->numel;
        }
        if (!later)
            zt_release_pages((void *)(slab + t->host_offset), t->numel * sizeof(float));
    }
}

/* This rank's fp32 shard of block b (src, S_b floats) into its place in a shard slab (device or host; fp32, or
 * bf16 moments in host memory, rounded to nearest). */
static void shard_into(zt_engine *e, int b, const float *src, void *field, enum zt_dtype fdt, bool on_device)
{
    const zt__block *k = &e->blocks[b];
    if (fdt == ZT_DTYPE_BF16) {
        ZT_ASSERT(!on_device || !e->dev->gpu); /* bf16 moments live in host memory */
        zt_err cerr;
        int rc = zt_cpu_adam_convert((uint16_t *)field + k->shard_off, ZT_DTYPE_BF16, src, k->shard, e->o.threads,
                                     &cerr);
        ZT_ASSERT(rc == 0); /* bf16 is a supported dtype */
        (void)rc;
    } else if (on_device) {
        e->dev->copy((float *)field + k->shard_off, src, k->shard * 4, e->cs);
        e->dev->stream_sync(e->cs);
    } else {
        memcpy((float *)field + k->shard_off, src, k->shard * 4);
    }
}

/* Copies this rank's shard of blocks [0, upto) of a host-layout slab into a shard slab (device or host; fp32,
 * or bf16 moments in host memory, rounded to nearest). */
static void import_blocks(zt_engine *e, const float *slab, void *field, enum zt_dtype fdt, bool on_device, int upto)
{
    float *stage = zt_xmalloc(e->max_padded * sizeof(float));
    for (int b = 0; b < upto; b++) {
        const zt__block *k = &e->blocks[b];
        if (slab)
            host_to_block(e, b, slab, stage);
        else
            memset(stage, 0, k->padded * sizeof(float));
        if (slab && e->releasing)
            release_block_source(e, b, slab);
        shard_into(e, b, stage + (size_t)e->rank * k->shard, field, fdt, on_device);
    }
    free(stage);
}

/* The same for every block. */
static void import_field(zt_engine *e, const float *slab, void *field, enum zt_dtype fdt, bool on_device)
{
    import_blocks(e, slab, field, fdt, on_device, e->nb);
}

/* State on disk: this rank's shard of every block of the host-layout m and v (NULL: zeros) written into the
 * block's record, or into h_m and h_v for the blocks that keep them there (bf16: rounded to nearest), where
 * `moments`; with masters_disk the masters of the blocks whose records hold them, from params, written into
 * the record (with zero moments where not `moments`) and rounded into the compute-dtype copy the passes
 * read. */
static int import_disk_state(zt_engine *e, const float *params, const float *m, const float *v, bool moments,
                             zt_err *err)
{
    float *sm = zt_xmalloc(e->max_padded * sizeof(float)), *sv = zt_xmalloc(e->max_padded * sizeof(float));
    float *sx = zt_xmalloc(e->max_padded * sizeof(float));
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        const zt__block *k = &e->blocks[b];
        const bool own = zt__mdisk_has_master(e, b);
        if (!moments && !own)
            continue;
        float *st[2] = {sm, sv};
        const float *slabs[2] = {moments ? m : NULL, moments ? v : NULL};
        for (int i = 0; i < 2; i++) {
            if (slabs[i])
                host_to_block(e, b, slabs[i], st[i]);
            else
                memset(st[i], 0, k->padded * sizeof(float));
        }
        const float *mine[2] = {sm + (size_t)e->rank * k->shard, sv + (size_t)e->rank * k->shard};
        const float *mx = sx + (size_t)e->rank * k->shard;
        if (own) {
            host_to_block(e, b, params, sx);
            if (e->releasing)
                release_block_source(e, b, params);
            void *lowp = (char *)e->h_lowp + k->shard_off * e->esize;
            if (e->dtype == ZT_DTYPE_F32)
                memcpy(lowp, mx, k->shard * 4);
            else if ((rc = zt_cpu_adam_convert(lowp, e->dtype, mx, k->shard, e->o.threads, err)) < 0)
                break;
        }
        if (zt__mdisk_has(e, b)) {
            rc = zt__mdisk_store(e, b, mx, mine[0], mine[1], err);
        } else { /* a block whose moments stay in host memory */
            void *dst[2] = {(char *)e->h_m + k->shard_off * e->msize, (char *)e->h_v + k->shard_off * e->msize};
            for (int i = 0; i < 2 && rc == 0; i++)
                rc = zt_cpu_adam_convert(dst[i], e->o.moment_dtype, mine[i], k->shard, e->o.threads, err);
        }
    }
    free(sm);
    free(sv);
    free(sx);
    return rc;
}

/* The compute-dtype weights from fp32 masters held on the host (HOST and SERVER homes): rounded on the
 * host into h_lowp (or, on the CPU, copied), then copied up unless the passes stream them from there. */
static int refresh_weights_from_host(zt_engine *e, const float *master, zt_err *err)
{
    if (e->o.stream_masters) { /* the passes read the masters; page-locked once, for copies at full speed */
        if (!e->master_registered && !(e->master_registered = e->dev->host_register(e->h_master, e->nshard * 4))) {
            char need[32];
            zt_format_size(e->nshard * 4, need, sizeof need);
            return zt_fail(err, ZT_ENOMEM, "could not page-lock the host master weights (%s; page-locked memory is "
                           "limited by ulimit -l and the free RAM): raise ulimit -l or free memory", need);
        }
        return 0;
    }
    /* the masters in host memory (with masters_disk the others' copy was written as their records were) */
    const size_t nram = ram_master_elems(e);
    if (!e->dev->gpu) { /* the CPU computes in fp32; streamed, the passes read h_lowp; with servers, h_master */
        void *dst = e->o.stream ? e->h_lowp : e->wshard;
        if (dst != (const void *)master)
            memcpy(dst, master, nram * 4);
        return 0;
    }
    void *lowp = e->h_lowp;
    int rc = zt_cpu_adam_convert(lowp, e->dtype, master, nram, e->o.threads, err);
    if (rc < 0 || e->o.stream) /* streamed weights stay in h_lowp */
        return rc;
    e->dev->copy(e->wshard, lowp, e->nshard * e->esize, e->up);
    e->dev->stream_sync(e->up);
    return 0;
}

/* Takes this rank's shards of a full state; see engine.h. */
int zt_engine_import(zt_engine *e, const float *params, const float *m, const float *v, zt_err *err)
{
    int rc = settle(e, err);
    if (rc < 0)
        return rc;
    invalidate_window(e);
    switch (e->home) {
    case ZT__OPT_DEVICE:
        import_field(e, params, e->master, ZT_DTYPE_F32, e->dev->gpu);
        import_field(e, m, e->m, e->o.moment_dtype, e->dev->gpu);
        import_field(e, v, e->v, e->o.moment_dtype, e->dev->gpu);
        if (e->wshard != e->master)
            e->dev->cast(e->wshard, e->dtype, e->master, e->nshard, e->cs);
        if (e->dev->gpu)
            e->dev->stream_sync(e->cs);
        return 0;
    case ZT__OPT_HOST:
        import_blocks(e, params, e->h_master, ZT_DTYPE_F32, false, e->xram_blocks);
        /* zero moments that are still calloc's zeros are left alone: their pages are taken at the first
         * update, after the caller gave back the slab the weights came from */
        if (e->mstore && (m || v || !e->h_moments_zero || e->xram_blocks < e->nb)) {
            const bool moments = m || v || !e->h_moments_zero;
            int rc = import_disk_state(e, params, m, v, moments, err);
            if (rc < 0)
                return rc;
            e->h_moments_zero = e->h_moments_zero && !moments;
        } else if (m || v || !e->h_moments_zero) {
            import_field(e, m, e->h_m, e->o.moment_dtype, false);
            import_field(e, v, e->h_v, e->o.moment_dtype, false);
            e->h_moments_zero = false;
        }
        sync_resident(e, false);
        return refresh_weights_from_host(e, e->h_master, err);
    case ZT__OPT_SERVER:
        break;
    }
    /* servers: the masters (and, for an embedded core's resume, the moments) wait for attach_server */
    import_field(e, params, e->h_master, ZT_DTYPE_F32, false);
    if (m || v) {
        if (!e->h_m)
            e->h_m = zt_xmalloc(e->nshard * 4);
        if (!e->h_v)
            e->h_v = zt_xmalloc(e->nshard * 4);
        import_field(e, m, e->h_m, e->o.moment_dtype, false);
        import_field(e, v, e->h_v, e->o.moment_dtype, false);
    }
    return refresh_weights_from_host(e, e->h_master, err);
}

/* ---- the training state from a source, block by block ---- */

/* Whether zt_engine_import_stream applies: the state is the engine's own (not the servers'). */
static bool streams_import(const zt_engine *e)
{
    return e->home != ZT__OPT_SERVER;
}

size_t zt_engine_import_stream_bytes(const zt_engine *e)
{
    return streams_import(e) ? 3 * 4 * max_shard(e) : 0;
}

/* Block b's shard of the masters, m and v (fp32, S_b each) where the state lives; see import_disk_state and
 * zt_engine_import, which put a whole slab's there the same way. */
static int import_block_shard(zt_engine *e, int b, float *const own[3], zt_err *err)
{
    if (e->home == ZT__OPT_DEVICE) {
        shard_into(e, b, own[0], e->master, ZT_DTYPE_F32, e->dev->gpu);
        shard_into(e, b, own[1], e->m, e->o.moment_dtype, e->dev->gpu);
        shard_into(e, b, own[2], e->v, e->o.moment_dtype, e->dev->gpu);
        return 0;
    }
    const zt__block *k = &e->blocks[b];
    if (!zt__mdisk_has_master(e, b)) {
        memcpy(e->h_master + k->shard_off, own[0], k->shard * 4);
    } else {
        /* masters in the record: their compute-dtype copy, which the passes read, is made here */
        void *lowp = (char *)e->h_lowp + k->shard_off * e->esize;
        int rc = 0;
        if (e->dtype == ZT_DTYPE_F32)
            memcpy(lowp, own[0], k->shard * 4);
        else if ((rc = zt_cpu_adam_convert(lowp, e->dtype, own[0], k->shard, e->o.threads, err)) < 0)
            return rc;
    }
    if (zt__mdisk_has(e, b))
        return zt__mdisk_store(e, b, own[0], own[1], own[2], err);
    for (int i = 0; i < 2; i++) {
        void *dst = (char *)(i == 0 ? e->h_m : e->h_v) + k->shard_off * e->msize;
        int rc = zt_cpu_adam_convert(dst, e->o.moment_dtype, own[1 + i], k->shard, e->o.threads, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The state from a source, block by block, this rank's shards only; see engine.h. */
int zt_engine_import_stream(zt_engine *e, zt_engine_state_source source, void *ctx, zt_err *err)
{
    if (!streams_import(e))
        return zt_fail(err, ZT_EUNSUPPORTED, "zt_engine_import_stream: with placement server the state goes to the "
                       "servers through zt_engine_import and zt_engine_attach_server");
    int rc = settle(e, err);
    if (rc < 0)
        return rc;
    invalidate_window(e);
    const size_t S = max_shard(e);
    float *own[3];
    for (int i = 0; i < 3; i++)
        own[i] = zt_xmalloc((S ? S : 1) * sizeof(float));
    const zt_model *md = e->model;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        const zt__block *k = &e->blocks[b];
        for (int i = 0; i < 3; i++)
            memset(own[i], 0, k->shard * sizeof(float)); /* padding, and the rows a tensor pads (len > numel) */
        const size_t s_lo = (size_t)e->rank * k->shard, s_hi = s_lo + k->shard;
        for (int i = 0; i < md->ntensors && rc == 0; i++) {
            const zt_model_tensor *t = &md->tensors[i];
            if (t->block != b)
                continue;
            const size_t t_lo = t->offset - md->block_offset[b], t_hi = t_lo + t->numel;
            const size_t lo = t_lo > s_lo ? t_lo : s_lo, hi = t_hi < s_hi ? t_hi : s_hi;
            if (lo >= hi)
                continue;
            const size_t at = lo - s_lo;
            rc = source(ctx, t->host_offset + (lo - t_lo), hi - lo, own[0] + at, own[1] + at, own[2] + at, err);
        }
        if (rc == 0)
            rc = import_block_shard(e, b, own, err);
    }
    for (int i = 0; i < 3; i++)
        free(own[i]);
    if (rc < 0)
        return rc;
    if (e->home == ZT__OPT_DEVICE) {
        if (e->wshard != e->master)
            e->dev->cast(e->wshard, e->dtype, e->master, e->nshard, e->cs);
        if (e->dev->gpu)
            e->dev->stream_sync(e->cs);
        return 0;
    }
    e->h_moments_zero = false;
    sync_resident(e, false);
    return refresh_weights_from_host(e, e->h_master, err);
}

/* The last step's timing; see engine.h. */
void zt_engine_last_timing(zt_engine *e, zt_engine_timing *t)
{
    *t = e->last_timing;
    if (e->home == ZT__OPT_SERVER)
        zt__server_timing(e, t);
    else if (e->host)
        t->host_update = zt__host_opt_busy(e);
    if (e->mstore) {
        zt__disk_timing d;
        zt__host_opt_disk(e, &d);
        t->disk = true;
        t->disk_read_wait = d.read_wait_s;
        t->disk_write_wait = d.write_wait_s;
        t->disk_behind = d.behind_s;
        t->disk_bytes_read = d.bytes_read;
        t->disk_bytes_written = d.bytes_written;
        t->disk_read_ahead = d.read_ahead;
    }
}

/* Kernel profiling of the model; see engine.h. */
void zt_engine_set_profiling(zt_engine *e, bool on)
{
    if (e->model->ops->set_profiling)
        e->model->ops->set_profiling(e->model, on);
}

void zt_engine_profile_report(zt_engine *e)
{
    if (e->model->ops->profile_report)
        e->model->ops->profile_report(e->model);
}
