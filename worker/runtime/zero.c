/* The ZeRO runtime on the CPU backend: block shards, gather/release around the per-block passes, gradient
 * reduce-scatter, the sharded optimizer step and W-independent state export (see zero.h). */
#include "worker/runtime/zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/units.h"
#include "kernels/adamw.h"
#include "kernels/norm.h"

typedef struct zblock {
    size_t offset;  /* first element in the model's slab */
    size_t numel;   /* real elements */
    size_t padded;  /* numel rounded up to a multiple of W */
    size_t shard;   /* padded / W */
    float *master;  /* [shard] owned fp32 weights */
    float *m, *v;   /* [shard] Adam moments */
    float *gshard;  /* [shard] reduced gradient of the step */
    float *full;    /* [padded] gathered parameters, or NULL when released */
    float *gfull;   /* [padded] local gradient of the step so far, or NULL */
} zblock;

struct zt_zero {
    zt_gpt2 *model;
    zt_comm *comm;
    zt_zero_options o;
    int W, rank, nb;
    zblock *blocks;
    int64_t adam_step;
    int bad_in_a_row;
    int64_t skipped_steps;
    size_t window_bytes; /* gathered parameters + full gradient buffers held now */
    size_t peak_window_bytes;
    /* Optimizer placement "server" (zt_zero_attach_server); client is NULL otherwise. */
    zt_state_client_t *client;
    char run_id[ZT_SERVER_RUN_ID_MAX];
    int64_t step;        /* the servers' committed step, as this runtime last saw it */
    int64_t stale_step;  /* zt_zero_server_step: the older step a server reported, or -1 */
};

/* Sets the defaults; see zero.h. */
void zt_zero_options_init(zt_zero_options *o)
{
    memset(o, 0, sizeof *o);
    o->level = 3;
    o->checkpoint = ZT_ZERO_CKPT_NONE;
    o->checkpoint_every = 1;
    o->prefetch = 1;
    o->grad_accum = 1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->grad_clip = 1.0;
}

/* Parses "none", "all" or "every:K"; see zero.h. */
int zt_zero_parse_checkpoint(const char *s, enum zt_zero_ckpt *policy, int *every, zt_err *err)
{
    if (strcmp(s, "none") == 0) {
        *policy = ZT_ZERO_CKPT_NONE;
        return 0;
    }
    if (strcmp(s, "all") == 0) {
        *policy = ZT_ZERO_CKPT_ALL;
        return 0;
    }
    char *end = NULL;
    if (strncmp(s, "every:", 6) == 0) {
        long k = strtol(s + 6, &end, 10);
        if (s[6] && !*end && k >= 1 && k <= 1 << 20) {
            *policy = ZT_ZERO_CKPT_EVERY;
            *every = (int)k;
            return 0;
        }
    }
    return zt_fail(err, ZT_EINVAL_CONFIG,
                   "activation checkpointing '%s' is not a policy; use none, all or every:K (K >= 1)", s);
}

/* Whether transformer layer l (0-based) is checkpointed; see zero.h. */
bool zt_zero_layer_checkpointed(const zt_zero_options *o, int l)
{
    if (o->checkpoint == ZT_ZERO_CKPT_ALL)
        return true;
    if (o->checkpoint == ZT_ZERO_CKPT_EVERY)
        return l % o->checkpoint_every == 0;
    return false;
}

/* Whether model block b (1..n_layer are transformer layers) drops its activations after forward. */
static bool checkpointed(const zt_zero *z, int b)
{
    int n_layer = z->nb - 2;
    return b >= 1 && b <= n_layer && zt_zero_layer_checkpointed(&z->o, b - 1);
}

static void window_add(zt_zero *z, size_t bytes)
{
    z->window_bytes += bytes;
    if (z->window_bytes > z->peak_window_bytes)
        z->peak_window_bytes = z->window_bytes;
}

/* Makes block b's full parameters available (an all-gather of the masters) unless they already are. */
static int gather(zt_zero *z, int b, zt_err *err)
{
    zblock *k = &z->blocks[b];
    if (k->full)
        return 0;
    k->full = malloc(k->padded * sizeof(float));
    if (!k->full)
        return zt_fail(err, ZT_ENOMEM, "out of memory gathering block %d (%zu floats)", b, k->padded);
    window_add(z, k->padded * sizeof(float));
    return zt_comm_all_gather(z->comm, k->master, k->full, k->shard, ZT_COMM_F32, NULL, err);
}

static void release(zt_zero *z, int b)
{
    zblock *k = &z->blocks[b];
    if (!k->full)
        return;
    free(k->full);
    k->full = NULL;
    z->window_bytes -= k->padded * sizeof(float);
}

/* The full local gradient buffer of block b, zeroed when the step's accumulation starts. */
static float *grad_buffer(zt_zero *z, int b, zt_err *err)
{
    zblock *k = &z->blocks[b];
    if (!k->gfull) {
        k->gfull = calloc(k->padded, sizeof(float));
        if (!k->gfull) {
            zt_fail(err, ZT_ENOMEM, "out of memory for block %d's gradients (%zu floats)", b, k->padded);
            return NULL;
        }
        window_add(z, k->padded * sizeof(float));
    }
    return k->gfull;
}

/* Last micro-batch: sums block b's gradients over the ranks into the owned shard and frees the buffer. */
static int reduce_grads(zt_zero *z, int b, zt_err *err)
{
    zblock *k = &z->blocks[b];
    int rc = zt_comm_reduce_scatter(z->comm, k->gfull, k->gshard, k->shard, ZT_COMM_F32, ZT_COMM_SUM, NULL, err);
    free(k->gfull);
    k->gfull = NULL;
    z->window_bytes -= k->padded * sizeof(float);
    return rc;
}

/* Copies this rank's shard of each block out of a slab laid out like the model's parameters. */
static void take_shards(zt_zero *z, const float *slab, float *(*field)(zblock *))
{
    for (int b = 0; b < z->nb; b++) {
        zblock *k = &z->blocks[b];
        float *dst = field(k);
        size_t lo = (size_t)z->rank * k->shard;
        for (size_t j = 0; j < k->shard; j++)
            dst[j] = lo + j < k->numel ? slab[k->offset + lo + j] : 0.0f;
    }
}

static float *f_master(zblock *k)
{
    return k->master;
}
static float *f_m(zblock *k)
{
    return k->m;
}
static float *f_v(zblock *k)
{
    return k->v;
}

/* Creates the runtime; see zero.h. */
int zt_zero_create(zt_zero **out, zt_gpt2 *model, zt_comm *comm, const zt_zero_options *o, zt_err *err)
{
    *out = NULL;
    if (o->level != 2 && o->level != 3)
        return zt_fail(err, ZT_EINVAL_CONFIG, "ZeRO level %d is not supported; use 2 or 3", o->level);
    if (o->prefetch < 0 || o->grad_accum < 1 || o->checkpoint_every < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "prefetch depth (%d) must be >= 0, grad_accum (%d) and the checkpoint interval (%d) >= 1",
                       o->prefetch, o->grad_accum, o->checkpoint_every);
    zt_zero *z = calloc(1, sizeof *z);
    if (!z)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating the ZeRO runtime");
    z->model = model;
    z->comm = comm;
    z->o = *o;
    z->W = zt_comm_world_size(comm);
    z->rank = zt_comm_rank(comm);
    z->nb = zt_gpt2_num_blocks(model);
    z->blocks = calloc((size_t)z->nb, sizeof *z->blocks);
    if (!z->blocks)
        goto oom;
    for (int b = 0; b < z->nb; b++) {
        zblock *k = &z->blocks[b];
        const zt_block_info *bi = zt_gpt2_block(model, b);
        k->offset = bi->offset;
        k->numel = bi->numel;
        k->padded = (bi->numel + (size_t)z->W - 1) / (size_t)z->W * (size_t)z->W;
        k->shard = k->padded / (size_t)z->W;
        k->master = calloc(k->shard, sizeof(float));
        k->m = calloc(k->shard, sizeof(float));
        k->v = calloc(k->shard, sizeof(float));
        k->gshard = calloc(k->shard, sizeof(float));
        if (!k->master || !k->m || !k->v || !k->gshard)
            goto oom;
    }
    take_shards(z, zt_gpt2_params(model), f_master);
    *out = z;
    return 0;
oom:
    zt_zero_destroy(z);
    return zt_fail(err, ZT_ENOMEM, "out of memory for the parameter shards; use more ranks or a smaller model");
}

/* Frees the runtime's buffers; accepts NULL. */
void zt_zero_destroy(zt_zero *z)
{
    if (!z)
        return;
    for (int b = 0; z->blocks && b < z->nb; b++) {
        zblock *k = &z->blocks[b];
        free(k->master);
        free(k->m);
        free(k->v);
        free(k->gshard);
        free(k->full);
        free(k->gfull);
    }
    free(z->blocks);
    free(z);
}

/* The bytes the plan expects the window (gathered parameters + full gradients) to peak at. */
size_t zt_zero_plan_window_bytes(const zt_zero *z)
{
    size_t largest = 0, all = 0;
    for (int b = 0; b < z->nb; b++) {
        size_t p = z->blocks[b].padded * sizeof(float);
        largest = p > largest ? p : largest;
        all += p;
    }
    /* Gradient buffers live from a block's first backward to the step's last micro-batch. */
    size_t grads = z->o.grad_accum > 1 ? all : 2 * largest;
    /* Level 2 keeps every block gathered from its forward to its backward; level 3 holds block 0 (the
     * tied head) plus the block at work and, on a GPU, `prefetch` more. */
    size_t params = z->o.level == 2 ? all : (size_t)(2 + z->o.prefetch) * largest;
    if (params > all)
        params = all;
    return params + grads;
}

/* Returns the measured peak of the window so far. */
size_t zt_zero_peak_window_bytes(const zt_zero *z)
{
    return z->peak_window_bytes;
}

/* Logs the memory plan; see zero.h. */
void zt_zero_log_plan(const zt_zero *z, int B, int T)
{
    size_t shard = 0, total = 0;
    for (int b = 0; b < z->nb; b++) {
        shard += z->blocks[b].shard;
        total += z->blocks[b].numel;
    }
    const zt_gpt2_config *c = zt_gpt2_get_config(z->model);
    const size_t N = (size_t)B * (size_t)T, C = (size_t)c->n_embd;
    const size_t layer_full = (16 * N * C + 4 * N + N * (size_t)c->n_head) * sizeof(float);
    const size_t layer_kept = N * C * sizeof(float);
    size_t acts = 0;
    int n_ckpt = 0;
    for (int b = 1; b <= c->n_layer; b++) {
        bool ck = checkpointed(z, b);
        n_ckpt += ck;
        acts += ck ? layer_kept : layer_full;
    }
    if (n_ckpt > 0)
        acts += layer_full; /* one layer's activations are rebuilt at a time in backward */
    char a[32], g[32], o[32], w[32], ac[32];
    zt_format_size((uint64_t)shard * 4, a, sizeof a);
    zt_format_size((uint64_t)shard * 4, g, sizeof g);
    zt_format_size((uint64_t)shard * 8, o, sizeof o);
    zt_format_size((uint64_t)zt_zero_plan_window_bytes(z), w, sizeof w);
    zt_format_size((uint64_t)acts, ac, sizeof ac);
    zt_log(ZT_LOG_INFO,
           "zero: plan per rank (W=%d, level %d, %zu of %zu parameters): params/W %s fp32, grads/W %s, "
           "optimizer/W %s (Adam m, v), gathered window %s (prefetch %d, grad_accum %d), activations %s "
           "(%d of %d layers checkpointed)",
           z->W, z->o.level, shard, total, a, g, o, w, z->o.prefetch, z->o.grad_accum, ac, n_ckpt, c->n_layer);
}

/* Forward over every block and the head, releasing as the level says; see zero.h. */
static int run_forward(zt_zero *z, const int32_t *tokens, const int32_t *targets, int B, int T, bool training,
                       float *loss, zt_err *err)
{
    int rc;
    zt_gpt2_forward_begin(z->model, tokens, B, T);
    for (int b = 0; b < z->nb; b++) {
        if ((rc = gather(z, b, err)) < 0)
            return rc;
        zt_gpt2_forward_block(z->model, b, z->blocks[b].full);
        if (training && checkpointed(z, b))
            zt_gpt2_discard_block_acts(z->model, b);
        if (b != 0 && (z->o.level == 3 || !training))
            release(z, b);
    }
    *loss = zt_gpt2_forward_head(z->model, z->blocks[0].full, targets);
    if (z->o.level == 3 || !training)
        release(z, 0);
    return 0;
}

/* One micro-batch; see zero.h. */
int zt_zero_forward_backward(zt_zero *z, const int32_t *tokens, const int32_t *targets, int B, int T,
                             float loss_scale, bool last, float *loss, zt_err *err)
{
    int rc = run_forward(z, tokens, targets, B, T, true, loss, err);
    if (rc < 0)
        return rc;
    float *g0;
    if ((rc = gather(z, 0, err)) < 0 || !(g0 = grad_buffer(z, 0, err)))
        return rc < 0 ? rc : ZT_ENOMEM;
    zt_gpt2_backward_head(z->model, z->blocks[0].full, g0, loss_scale);
    if (z->o.level == 3)
        release(z, 0);
    for (int b = z->nb - 1; b >= 0; b--) {
        float *g;
        if ((rc = gather(z, b, err)) < 0 || !(g = grad_buffer(z, b, err)))
            return rc < 0 ? rc : ZT_ENOMEM;
        if (checkpointed(z, b))
            zt_gpt2_forward_block(z->model, b, z->blocks[b].full); /* recompute from the kept input */
        zt_gpt2_backward_block(z->model, b, z->blocks[b].full, g);
        release(z, b);
        if (last && (rc = reduce_grads(z, b, err)) < 0)
            return rc;
    }
    return 0;
}

/* Forward only; see zero.h. */
int zt_zero_forward(zt_zero *z, const int32_t *tokens, const int32_t *targets, int B, int T, float *loss,
                    zt_err *err)
{
    return run_forward(z, tokens, targets, B, T, false, loss, err);
}

/* The mean of x over the ranks; see zero.h. */
int zt_zero_mean(zt_zero *z, float x, float *out, zt_err *err)
{
    double d = x, sum = 0;
    int rc = zt_comm_all_reduce(z->comm, &d, &sum, 1, ZT_COMM_F64, ZT_COMM_SUM, NULL, err);
    *out = (float)(sum / z->W);
    return rc;
}

/* Makes the ranks agree on the outcome of a server call: returns 0 when rc == 0 on every rank; otherwise a
 * negative code (this rank's message when it failed itself, else one naming the failed rank) and, when a
 * server said it holds an older step, the lowest such step in z->stale_step on every rank. */
static int server_agree(zt_zero *z, int rc, zt_err *err)
{
    int64_t told = rc == ZT_ESTATE ? zt_state_client_server_step(z->client) : -1;
    /* MAX of -step is minus the lowest step; -1e18 stands for "no step reported" */
    double mine[2] = {rc < 0 ? (double)(z->rank + 1) : 0.0, told >= 0 ? -(double)told : -1e18}, all[2];
    zt_err e;
    int crc = zt_comm_all_reduce(z->comm, mine, all, 2, ZT_COMM_F64, ZT_COMM_MAX, NULL, &e);
    if (crc < 0)
        return rc < 0 ? rc : zt_fail(err, crc, "%s", e.msg);
    z->stale_step = all[1] > -1e17 ? (int64_t)(-all[1]) : -1;
    if (rc < 0)
        return rc;
    if (all[0] > 0)
        return zt_fail(err, z->stale_step >= 0 ? ZT_ESTATE : ZT_EIO,
                       "rank %d failed talking to the state servers (its log says why); stopping with it",
                       (int)all[0] - 1);
    return 0;
}

/* Pulls this rank's shard of every block after `step` into the owned masters, block 0 first. */
static int pull_shards(zt_zero *z, int64_t step, zt_err *err)
{
    for (int b = 0; b < z->nb; b++) {
        zblock *k = &z->blocks[b];
        int rc = zt_state_client_pull(z->client, z->run_id, step, b, z->rank, 0, k->shard, k->master, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Attaches the state servers; see zero.h. */
int zt_zero_attach_server(zt_zero *z, zt_state_client_t *client, const char *run_id, int64_t step,
                          int64_t *server_step, zt_err *err)
{
    z->client = client;
    z->stale_step = -1;
    snprintf(z->run_id, sizeof z->run_id, "%s", run_id);
    /* The layout: every block in W shards, weight decay on the tensors that have it (adjacent ones merged). */
    const int nt = zt_gpt2_num_tensors(z->model);
    zt_server_block_desc *blocks = calloc((size_t)z->nb, sizeof *blocks);
    zt_server_range *ranges = calloc((size_t)nt + 1, sizeof *ranges);
    if (!blocks || !ranges) {
        free(blocks);
        free(ranges);
        return zt_fail(err, ZT_ENOMEM, "out of memory describing the run to the state servers");
    }
    int used = 0;
    for (int b = 0; b < z->nb; b++) {
        blocks[b].numel = z->blocks[b].numel;
        blocks[b].decay = ranges + used;
        for (int i = 0; i < nt; i++) {
            const zt_param_info *t = zt_gpt2_tensor(z->model, i);
            if (t->block != b || !t->weight_decay)
                continue;
            uint64_t begin = t->offset - z->blocks[b].offset, end = begin + t->numel;
            if (blocks[b].ndecay > 0 && ranges[used - 1].end == begin) {
                ranges[used - 1].end = end;
                continue;
            }
            ranges[used++] = (zt_server_range){begin, end};
            blocks[b].ndecay++;
        }
    }
    zt_server_run_desc desc = {
        .run_id = z->run_id,
        .world_size = z->W,
        .nblocks = z->nb,
        .blocks = blocks,
        .beta1 = (float)z->o.beta1,
        .beta2 = (float)z->o.beta2,
        .eps = (float)z->o.eps,
        .weight_decay = (float)z->o.weight_decay,
        .param_dtype = ZT_DTYPE_F32,
    };
    int64_t at = 0;
    int rc = zt_state_client_register(client, &desc, &at, err);
    free(blocks);
    free(ranges);
    if (server_step)
        *server_step = rc == 0 ? at : -1;
    if (rc < 0)
        return rc;
    if (step == 0 && at == 0) {
        for (int b = 0; b < z->nb && rc == 0; b++)
            rc = zt_state_client_push_params(client, z->run_id, b, z->rank, z->blocks[b].master, z->blocks[b].shard,
                                             err);
    } else if (step == 0) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "the state servers already hold run '%s' at step %lld: continue it "
                     "with --resume, or start a new run in a run directory of another name (--out)", z->run_id,
                     (long long)at);
    } else if (at != step) {
        z->stale_step = at;
        rc = zt_fail(err, ZT_ESTATE, "the state servers hold run '%s' at step %lld, the checkpoint is at step %lld: "
                     "resume from the checkpoint of step %lld (--resume RUN_DIR/ckpt_%06lld), or restart the "
                     "servers with --snapshot-dir holding the run's snapshot of step %lld", z->run_id,
                     (long long)at, (long long)step, (long long)at, (long long)at, (long long)step);
    } else {
        rc = pull_shards(z, step, err);
    }
    z->step = step;
    return rc;
}

/* The step a server reported it holds after a failed step; see zero.h. */
int64_t zt_zero_server_step(const zt_zero *z)
{
    return z->client ? z->stale_step : -1;
}

/* The step through the state servers: push the owned gradient shards, rank 0 commits once every push is
 * done, every rank pulls its updated shards. */
static int server_update(zt_zero *z, double norm, float lr, const zt_optimizer_report *report, zt_err *err)
{
    const int64_t step = z->step + 1;
    /* A failed push or commit is tried once more, whole: a server that restarted from the snapshot of the
     * previous step lost the pushes it had received, and pushes overwrite, so pushing every shard again
     * and committing again completes the step. A server at an older step cannot: that is returned
     * (z->stale_step) and the run resumes from the checkpoint of that step. */
    for (int attempt = 0;; attempt++) {
        int rc = 0;
        for (int b = 0; b < z->nb && rc == 0 && !report->skipped; b++)
            rc = zt_state_client_push_grad(z->client, z->run_id, step, b, z->rank, ZT_DTYPE_F32,
                                           z->blocks[b].gshard, z->blocks[b].shard, err);
        /* every rank's pushes are done (all-reduce) before rank 0 commits; all ranks learn the outcome */
        if ((rc = server_agree(z, rc, err)) == 0) {
            if (z->rank == 0) {
                zt_server_commit_args args = {
                    .step = step,
                    .grad_norm = norm,
                    .clip_coef = report->clip_coef,
                    .lr = lr,
                    .overflow = report->skipped,
                };
                rc = zt_state_client_commit(z->client, z->run_id, &args, err);
            }
            rc = server_agree(z, rc, err);
        }
        if (rc == 0)
            break;
        if (attempt > 0 || z->stale_step >= 0)
            return rc;
        zt_log(ZT_LOG_WARN, "step %lld: the state servers did not take the step (%s); pushing this rank's "
               "gradients again and committing once more", (long long)step, err ? err->msg : "");
    }
    z->step = step;
    if (!report->skipped)
        z->adam_step++;
    return server_agree(z, pull_shards(z, step, err), err);
}

/* The sharded optimizer step; see zero.h. */
int zt_zero_step(zt_zero *z, float loss, float lr, zt_optimizer_report *report, zt_err *err)
{
    double partial = 0, sumsq = 0;
    for (int b = 0; b < z->nb; b++)
        partial += zt_cpu_sum_squares(z->blocks[b].gshard, z->blocks[b].shard);
    int rc = zt_comm_all_reduce(z->comm, &partial, &sumsq, 1, ZT_COMM_F64, ZT_COMM_SUM, NULL, err);
    if (rc < 0)
        return rc;
    double norm = sqrt(sumsq);
    report->grad_norm = norm;
    report->clip_coef = 1.0f;
    report->skipped = false;
    if (!isfinite(loss) || !isfinite(norm)) {
        report->skipped = true;
        z->skipped_steps++;
        z->bad_in_a_row++;
        if (z->bad_in_a_row >= ZT_OPTIMIZER_MAX_BAD_STEPS)
            return zt_fail(err, ZT_ESTATE,
                           "%d steps in a row had a non-finite loss or gradient norm (loss %g, grad norm %g); "
                           "the run diverged: lower the learning rate (--lr), keep gradient clipping on "
                           "(--grad-clip 1.0), or resume from an earlier checkpoint",
                           z->bad_in_a_row, (double)loss, norm);
        return z->client ? server_update(z, norm, lr, report, err) : 0;
    }
    z->bad_in_a_row = 0;
    report->clip_coef = zt_optimizer_clip_coef(norm, z->o.grad_clip);
    if (z->client)
        return server_update(z, norm, lr, report, err);
    z->adam_step++;
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = (float)z->o.beta1,
        .beta2 = (float)z->o.beta2,
        .eps = (float)z->o.eps,
        .grad_scale = report->clip_coef,
        .step = (int)z->adam_step,
    };
    /* Each tensor's part of the owned shard gets its own weight decay. */
    const int nt = zt_gpt2_num_tensors(z->model);
    for (int i = 0; i < nt; i++) {
        const zt_param_info *t = zt_gpt2_tensor(z->model, i);
        zblock *k = &z->blocks[t->block];
        size_t t_lo = t->offset - k->offset, t_hi = t_lo + t->numel;
        size_t s_lo = (size_t)z->rank * k->shard, s_hi = s_lo + k->shard;
        size_t lo = t_lo > s_lo ? t_lo : s_lo, hi = t_hi < s_hi ? t_hi : s_hi;
        if (lo >= hi)
            continue;
        p.weight_decay = t->weight_decay ? (float)z->o.weight_decay : 0.0f;
        size_t j = lo - s_lo;
        zt_cpu_adamw_update(k->master + j, k->m + j, k->v + j, k->gshard + j, hi - lo, &p);
    }
    return 0;
}

/* Gathers one per-block field of every rank into a slab laid out like the model's parameters. */
static int gather_field(zt_zero *z, float *(*field)(zblock *), float *slab, zt_err *err)
{
    for (int b = 0; b < z->nb; b++) {
        zblock *k = &z->blocks[b];
        float *tmp = malloc(k->padded * sizeof(float));
        if (!tmp)
            return zt_fail(err, ZT_ENOMEM, "out of memory gathering the training state");
        int rc = zt_comm_all_gather(z->comm, field(k), tmp, k->shard, ZT_COMM_F32, NULL, err);
        if (rc == 0)
            memcpy(slab + k->offset, tmp, k->numel * sizeof(float));
        free(tmp);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Gathers the full state; see zero.h. */
int zt_zero_export_state(zt_zero *z, zt_optimizer *opt, zt_err *err)
{
    ZT_ASSERT(opt->n == zt_gpt2_num_params(z->model));
    int rc = gather_field(z, f_master, zt_gpt2_params(z->model), err);
    if (rc == 0)
        rc = gather_field(z, f_m, opt->m, err);
    if (rc == 0)
        rc = gather_field(z, f_v, opt->v, err);
    opt->adam_step = z->adam_step;
    opt->skipped_steps = z->skipped_steps;
    opt->bad_in_a_row = z->bad_in_a_row;
    return rc;
}

/* Takes this rank's shards of a full state; see zero.h. */
void zt_zero_import_state(zt_zero *z, const zt_optimizer *opt)
{
    ZT_ASSERT(opt->n == zt_gpt2_num_params(z->model));
    take_shards(z, zt_gpt2_params(z->model), f_master);
    take_shards(z, opt->m, f_m);
    take_shards(z, opt->v, f_v);
    z->adam_step = opt->adam_step;
    z->skipped_steps = opt->skipped_steps;
    z->bad_in_a_row = opt->bad_in_a_row;
}
