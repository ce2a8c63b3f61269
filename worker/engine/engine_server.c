/* Placement server (see engine.h): the run's registration with the engine's layout, the step protocol
 * through worker/state/client.h, snapshots, and the agreement of the ranks on a server's failure.
 *
 * A step, overlapped as the host AdamW of placement cpu is:
 *   backward   each block's gradient shard is pushed by the host thread (host_optimizer.c) as soon as it is
 *              in host memory (on the CPU: in gshard), while the backward goes on with the next blocks;
 *   step       after the norm, this rank waits for its last pushes, the ranks agree that all pushed, the
 *              pull thread below starts pulling the new weights block 0 first, and rank 0 commits the step
 *              on every server at once: each server updates its blocks in order and serves block b's pull
 *              as soon as b is done, so the pulls follow the update; the ranks agree on the commit and
 *              zt_engine_step returns;
 *   next step  its forward waits only for the block it reads (zt__host_opt_wait_block), block 0 first,
 *              while later blocks are still being pulled.
 * A pull that fails leaves its block (and those after it) as they were and is reported at the next point
 * where every rank asks (zt__server_settle: the next step, an evaluation, an export), so that the ranks
 * stop together and nothing computed on such weights counts.
 *
 * Pulls are fp32: this rank keeps its masters of the last step in h_master (a checkpoint's weights) and
 * rounds them to the compute dtype for the GPU, the same rounding the host AdamW of placement cpu does, so
 * both placements give the same bits. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/units.h"
#include "offload/cpu_adam.h"
#include "worker/engine/engine_internal.h"

/* The pull thread: one job at a time, posted by zt__server_step. */
struct zt__server_pipe {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* broadcast when a job is posted or done, and on stop */
    bool posted;            /* a job waits or runs */
    bool stop;
    int64_t step;           /* the job: the servers' step to pull ... */
    int64_t ready;          /* ... and the step count its blocks then hold */
    void *stream;           /* GPU: the copies of the pulled weights up */
    int rc;                 /* the last job's outcome, until zt__server_settle reports it */
    zt_err err;
    int64_t told;           /* the older step a server reported to it, or -1 */
    int verdict;            /* the commit of the job's step: 0 not known yet, 1 taken, -1 refused (pulled again
                               or not at all): a failed job marks its blocks only once the step is taken */
    double t_post, t_done;  /* when the last job was posted and when its last block was in */
    uint64_t bytes;         /* bytes the last job pulled */
};

/* Agreement after a server call: 0 when rc == 0 on every rank; otherwise a negative code (this rank's
 * message when it failed itself, else one naming the failed rank) and, when a server said it holds an
 * older step (`told` >= 0 on some rank), the lowest such step in e->stale_step on every rank. */
static int agree_told(zt_engine *e, int rc, int64_t told, zt_err *err)
{
    if (e->W == 1) {
        e->stale_step = told;
        return rc;
    }
    /* MAX of -step is minus the lowest step; -1e18 stands for "no step reported" */
    double mine[2] = {rc < 0 ? (double)(e->rank + 1) : 0.0, told >= 0 ? -(double)told : -1e18}, all[2];
    zt_err ce;
    int crc = zt_comm_all_reduce(e->comm, mine, all, 2, ZT_COMM_F64, ZT_COMM_MAX, NULL, &ce);
    if (crc < 0)
        return rc < 0 ? rc : zt_fail(err, crc, "%s", ce.msg);
    e->stale_step = all[1] > -1e17 ? (int64_t)(-all[1]) : -1;
    if (rc < 0)
        return rc;
    if (all[0] > 0)
        return zt_fail(err, e->stale_step >= 0 ? ZT_ESTATE : ZT_EIO,
                       "rank %d failed talking to the state servers (its log says why); stopping with it",
                       (int)all[0] - 1);
    return 0;
}

/* agree_told with the step this thread's last client call was told. */
static int server_agree(zt_engine *e, int rc, zt_err *err)
{
    return agree_told(e, rc, rc == ZT_ESTATE ? zt_state_client_server_step(e->o.client) : -1, err);
}

/* Pushes this rank's gradient shard of block b for `step`: from host memory on a GPU, from gshard on the
 * CPU. Its time and bytes count in the step's timing (only the host thread pushes during a step). */
int zt__server_push_block(zt_engine *e, int64_t step, int b, zt_err *err)
{
    const zt__block *k = &e->blocks[b];
    const float *g = (e->dev->gpu ? e->h_grad : e->gshard) + k->shard_off;
    const double t0 = zt_now_s();
    int rc = zt_state_client_push_grad(e->o.client, e->run_id, step, b, e->rank, ZT_DTYPE_F32, g, k->shard, err);
    e->timing.push_s += zt_now_s() - t0;
    e->timing.bytes_pushed += k->shard * 4;
    return rc;
}

int zt__server_push_all(zt_engine *e, int64_t step, zt_err *err)
{
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++)
        rc = zt__server_push_block(e, step, b, err);
    return rc;
}

/* Bytes one pull of block b moves. */
static uint64_t pull_bytes(const zt_engine *e, int b)
{
    return e->blocks[b].shard * (e->pull_lowp ? e->esize : 4);
}

/* Pulls this rank's shard of block b after `step` and makes it the weights the passes read: on the CPU the
 * fp32 masters into h_master and a copy into wshard; on a GPU the compute dtype into h_lowp (pull_lowp: the
 * servers rounded their masters as the host AdamW of placement cpu does; otherwise the fp32 masters into
 * h_master, rounded here), sent up on `stream` (event `updated`); then marks the block ready for the step
 * count `ready`. */
static int pull_block(zt_engine *e, int64_t step, int b, int64_t ready, void *stream, zt_err *err)
{
    zt__block *k = &e->blocks[b];
    float *dst = e->h_master + k->shard_off;
    void *lowp = e->dev->gpu ? (char *)e->h_lowp + k->shard_off * e->esize : NULL;
    int rc = e->pull_lowp ? zt_state_client_pull(e->o.client, e->run_id, step, b, e->rank, 0, k->shard, lowp, err)
                          : zt_state_client_pull(e->o.client, e->run_id, step, b, e->rank, 0, k->shard, dst, err);
    if (rc < 0)
        return rc;
    if (!e->dev->gpu) {
        memcpy((float *)e->wshard + k->shard_off, dst, k->shard * 4);
    } else {
        if (!e->pull_lowp && (rc = zt_cpu_adam_convert(lowp, e->dtype, dst, k->shard, e->o.threads, err)) < 0)
            return rc;
        if (!e->o.stream) { /* streamed weights are read from h_lowp by the next pass */
            e->dev->copy(zt__engine_block_weights(e, b), lowp, k->shard * e->esize, stream);
            e->dev->record(k->updated, stream);
        }
    }
    if (e->host)
        zt__host_opt_mark(e, b, ready);
    return 0;
}

/* Fetches the fp32 masters of the servers' step when h_master is older; see engine_internal.h. */
int zt__server_fresh_masters(zt_engine *e, zt_err *err)
{
    if (!e->pull_lowp || e->masters_step == e->server_step)
        return 0;
    const double t0 = zt_now_s();
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++)
        rc = zt_state_client_pull_masters(e->o.client, e->run_id, e->server_step, b, e->rank, 0, e->blocks[b].shard,
                                          e->h_master + e->blocks[b].shard_off, err);
    if (rc == 0) {
        e->masters_step = e->server_step;
        zt_log(ZT_LOG_DEBUG, "fp32 masters of step %lld fetched from the state servers in %.3f s",
               (long long)e->server_step, zt_now_s() - t0);
    }
    return rc;
}

/* Pulls every block after `step`, block 0 first, on the calling thread, and waits for the copies. */
int zt__server_pull_all(zt_engine *e, int64_t step, zt_err *err)
{
    void *stream = e->spipe ? e->spipe->stream : NULL;
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++)
        rc = pull_block(e, step, b, e->step_no + 1, stream, err);
    if (e->dev->gpu && stream)
        e->dev->stream_sync(stream);
    return rc;
}

/* One job of the pull thread: every block in order; after a failure the blocks left are marked ready with
 * the weights they have (the failure is reported by zt__server_settle before anything counts). */
static void run_pulls(zt_engine *e, struct zt__server_pipe *p)
{
    int rc = 0;
    zt_err perr = {{0}};
    int64_t told = -1;
    uint64_t bytes = 0;
    int failed_at = e->nb;
    for (int b = 0; b < e->nb && rc == 0; b++) {
        rc = pull_block(e, p->step, b, p->ready, p->stream, &perr);
        if (rc == 0) {
            bytes += pull_bytes(e, b);
        } else {
            told = rc == ZT_ESTATE ? zt_state_client_server_step(e->o.client) : -1;
            failed_at = b;
        }
    }
    if (rc < 0) {
        /* a refused commit ends the pulls too, and the step is pushed and pulled again: the blocks stay
         * unready for that; after a commit that was taken they are marked with the weights they have */
        pthread_mutex_lock(&p->mu);
        while (p->verdict == 0)
            pthread_cond_wait(&p->cv, &p->mu);
        const bool keep = p->verdict > 0;
        pthread_mutex_unlock(&p->mu);
        for (int b = failed_at; keep && b < e->nb && e->host; b++)
            zt__host_opt_mark(e, b, p->ready);
    }
    if (e->dev->gpu)
        e->dev->stream_sync(p->stream); /* the copies are in when the job is done */
    pthread_mutex_lock(&p->mu);
    p->rc = rc;
    p->err = perr;
    p->told = told;
    p->bytes = bytes;
    p->t_done = zt_now_s();
    p->posted = false;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *pipe_main(void *arg)
{
    zt_engine *e = arg;
    struct zt__server_pipe *p = e->spipe;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->posted && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->posted)
            break;
        pthread_mutex_unlock(&p->mu);
        run_pulls(e, p);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static int pipe_create(zt_engine *e, zt_err *err)
{
    struct zt__server_pipe *p = zt_xcalloc(1, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->told = -1;
    p->stream = e->dev->gpu ? e->dev->stream_create() : NULL;
    e->spipe = p;
    if (pthread_create(&p->thread, NULL, pipe_main, e) != 0) {
        zt__server_pipe_destroy(e);
        return zt_fail(err, ZT_ENOMEM, "cannot start the thread that pulls from the state servers");
    }
    p->started = true;
    return 0;
}

/* Stops the pull thread; see engine_internal.h. */
void zt__server_pipe_destroy(zt_engine *e)
{
    struct zt__server_pipe *p = e->spipe;
    if (!p)
        return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    if (p->stream)
        e->dev->stream_destroy(p->stream);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    e->spipe = NULL;
}

static void pipe_post(zt_engine *e, int64_t step, int64_t ready)
{
    struct zt__server_pipe *p = e->spipe;
    pthread_mutex_lock(&p->mu);
    ZT_ASSERT(!p->posted);
    p->step = step;
    p->ready = ready;
    p->rc = 0;
    p->told = -1;
    p->verdict = 0;
    p->t_post = zt_now_s();
    p->posted = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Tells the job whether its step's commit was taken (1) or refused (-1). */
static void pipe_verdict(zt_engine *e, int v)
{
    struct zt__server_pipe *p = e->spipe;
    pthread_mutex_lock(&p->mu);
    p->verdict = v;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Waits until the pull thread has no job; returns the last job's outcome (and clears it). */
static int pipe_wait(zt_engine *e, zt_err *err, int64_t *told)
{
    struct zt__server_pipe *p = e->spipe;
    *told = -1;
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    while (p->posted)
        pthread_cond_wait(&p->cv, &p->mu);
    int rc = p->rc;
    if (rc < 0) {
        if (err)
            *err = p->err;
        *told = p->told;
    }
    p->rc = 0;
    p->told = -1;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Reports the last pulls; see engine_internal.h. */
int zt__server_settle(zt_engine *e, zt_err *err)
{
    int64_t told;
    int rc = pipe_wait(e, err, &told);
    return agree_told(e, rc, told, err);
}

/* The server part of a step; see engine_internal.h. A failed push or commit is tried once more, whole: a
 * server that restarted from the snapshot of the previous step lost the pushes it had received, and
 * pushes overwrite, so pushing every shard again and committing again completes the step (the gradients
 * are still in host memory: the next backward cannot start before the pulls are done). A server at an
 * older step cannot: that is returned (e->stale_step) and the run resumes from the checkpoint of that
 * step. */
int zt__server_step(zt_engine *e, double norm, float clip_coef, float lr, bool skip, zt_err *err)
{
    const int64_t step = e->server_step + 1;
    const int64_t ready = e->step_no + 1;
    double t0 = zt_now_s();
    zt_err perr = {{0}};
    int rc = e->host ? zt__host_opt_drain(e, &perr) : zt__server_push_all(e, step, &perr);
    e->timing.push_wait_s = zt_now_s() - t0;
    if (rc < 0 && err)
        *err = perr;
    if (!e->spipe && (rc = pipe_create(e, err)) < 0)
        return rc;
    /* the pulls of the last step (done: this step's passes read every block) */
    zt_err serr;
    int src = zt__server_settle(e, &serr);
    if (src < 0) {
        if (err)
            *err = serr;
        return src;
    }
    struct zt__server_pipe *p = e->spipe;
    pthread_mutex_lock(&p->mu); /* the job is done: settle waited for it */
    e->timing.pull_s = p->t_done > p->t_post ? p->t_done - p->t_post : 0.0;
    e->timing.bytes_pulled = p->bytes;
    pthread_mutex_unlock(&p->mu);
    bool pulling = false;
    t0 = zt_now_s();
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            int64_t told;
            if (pulling) { /* they end with the refused commit; pulled again below */
                pipe_verdict(e, -1);
                (void)pipe_wait(e, NULL, &told);
            }
            pulling = false;
            rc = skip ? 0 : zt__server_push_all(e, step, err);
        }
        if (skip)
            rc = 0; /* an overflowed step commits without gradients */
        /* every rank's pushes are done (all-reduce) before rank 0 commits; all ranks learn the outcome */
        if ((rc = server_agree(e, rc, err)) == 0) {
            if (attempt == 0) { /* the pulls follow the servers' update, block by block */
                pipe_post(e, step, ready);
                pulling = true;
            }
            if (e->rank == 0) {
                zt_server_commit_args args = {
                    .step = step,
                    .grad_norm = norm,
                    .clip_coef = clip_coef,
                    .lr = lr,
                    .overflow = skip,
                };
                rc = zt_state_client_commit(e->o.client, e->run_id, &args, err);
            }
            rc = server_agree(e, rc, err);
        }
        if (rc == 0)
            break;
        if (attempt > 0 || e->stale_step >= 0) {
            int64_t told;
            if (pulling) {
                pipe_verdict(e, -1);
                (void)pipe_wait(e, NULL, &told);
            }
            for (int b = 0; b < e->nb; b++) /* nothing waits for a step that was not taken */
                zt__host_opt_mark(e, b, ready);
            if (e->stale_step >= 0)
                return zt_fail(err, ZT_ESTATE, "a state server of run '%s' holds step %lld while this run is at step "
                               "%lld (it restarted from its last snapshot): resume from the checkpoint of step %lld",
                               e->run_id, (long long)e->stale_step, (long long)step - 1, (long long)e->stale_step);
            return rc;
        }
        zt_log(ZT_LOG_WARN, "step %lld: the state servers did not take the step (%s); pushing this rank's "
               "gradients again and committing once more", (long long)step, err ? err->msg : "");
    }
    e->timing.update_s = zt_now_s() - t0;
    e->server_step = step;
    if (!pulling)
        pipe_post(e, step, ready);
    pipe_verdict(e, 1);
    return 0;
}

/* The server fields of a step's timing; see engine_internal.h. */
void zt__server_timing(zt_engine *e, zt_engine_timing *t)
{
    (void)e;
    t->server = true;
    t->host_update = t->push_s + t->update_s + t->pull_s;
}

/* The layout the servers hold: W shards of every block (padded as the engine pads), the tensors' weight
 * decay (adjacent ranges merged), AdamW, pulls in the GPU's compute dtype (fp32 on the CPU). */
static int register_run(zt_engine *e, int64_t *at, zt_err *err)
{
    const zt_model *m = e->model;
    zt_server_block_desc *blocks = zt_xcalloc((size_t)e->nb, sizeof *blocks);
    zt_server_range *ranges = zt_xcalloc((size_t)m->ntensors + 1, sizeof *ranges);
    int used = 0;
    for (int b = 0; b < e->nb; b++) {
        blocks[b].numel = e->blocks[b].padded;
        blocks[b].decay = ranges + used;
        for (int i = 0; i < m->ntensors; i++) {
            const zt_model_tensor *t = &m->tensors[i];
            if (t->block != b || !t->weight_decay)
                continue;
            uint64_t begin = t->offset - m->block_offset[b], end = begin + t->len;
            if (blocks[b].ndecay > 0 && ranges[used - 1].end == begin) {
                ranges[used - 1].end = end;
                continue;
            }
            ranges[used++] = (zt_server_range){begin, end};
            blocks[b].ndecay++;
        }
    }
    zt_server_run_desc desc = {
        .run_id = e->run_id,
        .world_size = e->W,
        .nblocks = e->nb,
        .blocks = blocks,
        .beta1 = (float)e->o.beta1,
        .beta2 = (float)e->o.beta2,
        .eps = (float)e->o.eps,
        .weight_decay = (float)e->o.weight_decay,
        .param_dtype = e->pull_lowp ? e->dtype : ZT_DTYPE_F32,
    };
    int rc = zt_state_client_register(e->o.client, &desc, at, err);
    free(blocks);
    free(ranges);
    return rc;
}

/* Hands this rank's masters and moments (imported from a checkpoint) to the embedded core. */
static int load_embedded(zt_engine *e, zt_server_core *core, int64_t step, int64_t adam_step, zt_err *err)
{
    if (!e->h_m || !e->h_v)
        return zt_fail(err, ZT_EINVAL_CONFIG, "resuming run '%s' with the embedded state server needs the "
                       "checkpoint's Adam moments", e->run_id);
    zt_server_shard_state *st = zt_xcalloc((size_t)e->nb, sizeof *st);
    for (int b = 0; b < e->nb; b++) {
        size_t off = e->blocks[b].shard_off;
        st[b] = (zt_server_shard_state){.block = b, .shard = e->rank, .master = e->h_master + off,
                                        .m = (float *)e->h_m + off, .v = (float *)e->h_v + off};
    }
    int rc = zt_server_core_load_state(core, e->run_id, step, adam_step, st, e->nb, err);
    free(st);
    free(e->h_m);
    free(e->h_v);
    e->h_m = e->h_v = NULL;
    return rc;
}

/* Resuming a checkpoint of `step` while a server reported the run at `at`: every rank learns whether any
 * server is elsewhere (ranks register one after the other), then rank 0 asks every server for its snapshot
 * of the checkpoint's step, so that all pull the checkpoint's state. A server behind the checkpoint (it
 * restarted from an older snapshot) may not have one: that is the rewind the trainer handles (ZT_ESTATE). */
static int back_to_checkpoint(zt_engine *e, int64_t at, int64_t step, zt_err *err)
{
    float mine = at != step ? 1.0f : 0.0f, any = mine;
    if (zt_comm_world_size(e->comm) > 1) {
        zt_err ce;
        if (zt_comm_all_reduce(e->comm, &mine, &any, 1, ZT_COMM_F32, ZT_COMM_MAX, NULL, &ce) < 0)
            return zt_fail(err, ZT_ESTATE, "%s", ce.msg);
    }
    if (any == 0.0f)
        return 0;
    int rc = 0;
    if (zt_comm_rank(e->comm) == 0) {
        zt_log(ZT_LOG_WARN, "resume: the state servers hold run '%s' at step %lld, the checkpoint is at step %lld; "
               "taking them back to their snapshot of step %lld", e->run_id, (long long)at, (long long)step,
               (long long)step);
        zt_err lerr;
        rc = zt_state_client_load_snapshot(e->o.client, e->run_id, step, &lerr);
        if (rc < 0)
            rc = zt_fail(err, ZT_ESTATE, "the state servers hold run '%s' at step %lld, the checkpoint is at step "
                         "%lld%s: %s", e->run_id, (long long)at, (long long)step,
                         at > step ? ", and they cannot go back to it" : "", lerr.msg);
    }
    return zt_comm_agree(e->comm, rc, err);
}

/* Attaches the state servers; see engine.h. */
int zt_engine_attach_server(zt_engine *e, int64_t step, int64_t adam_step, bool resumed, int64_t *server_step,
                            zt_err *err)
{
    ZT_ASSERT(e->home == ZT__OPT_SERVER);
    e->stale_step = -1;
    /* h_lowp: the GPU's weights in transit (the passes' dtype); on the CPU the passes read fp32 */
    e->pull_lowp = e->dev->gpu && e->dtype != ZT_DTYPE_F32 && e->h_lowp != NULL;
    int rc = e->spipe ? 0 : pipe_create(e, err);
    if (rc < 0)
        return rc;
    int64_t at = 0;
    rc = register_run(e, &at, err);
    if (server_step)
        *server_step = rc == 0 ? at : -1;
    if (rc < 0)
        return rc;
    zt_server_core *core = zt_state_client_embedded_core(e->o.client);
    if (step == 0 && at == 0) {
        for (int b = 0; b < e->nb && rc == 0; b++)
            rc = zt_state_client_push_params(e->o.client, e->run_id, b, e->rank, e->h_master + e->blocks[b].shard_off,
                                             e->blocks[b].shard, err);
    } else if (!resumed) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "the state servers already hold run '%s' at step %lld: continue it "
                     "with --resume, or start a new run in a run directory of another name (--out)", e->run_id,
                     (long long)at);
    } else if (core && step > 0) {
        rc = load_embedded(e, core, step, adam_step, err);
    } else if (core) {
        rc = zt_fail(err, ZT_ESTATE, "the embedded state server holds run '%s' at step %lld, the checkpoint is at "
                     "step 0", e->run_id, (long long)at);
    } else if ((rc = back_to_checkpoint(e, at, step, err)) < 0) {
        if (at < step)
            e->stale_step = at;
    } else {
        const int64_t saved = e->step_no;
        e->step_no = saved - 1; /* the pulled weights are those of the current step count */
        rc = zt__server_pull_all(e, step, err);
        e->step_no = saved;
    }
    e->server_step = step;
    e->masters_step = step; /* the initial masters, or the checkpoint's (the servers went back to its step) */
    return rc;
}

/* Snapshots of the run's step; see engine.h. */
int zt_engine_server_snapshot(zt_engine *e, const char *embedded_root, zt_err *err)
{
    ZT_ASSERT(e->home == ZT__OPT_SERVER);
    return zt_state_client_save_snapshot(e->o.client, e->run_id, embedded_root, err);
}

/* The initial parameters again, for servers that lost the run; see engine.h. */
int zt_engine_server_restore_initial(zt_engine *e, zt_err *err)
{
    ZT_ASSERT(e->home == ZT__OPT_SERVER);
    return zt_state_client_restore_initial(e->o.client, e->run_id, err);
}

/* The older step a server reported; see engine.h. */
int64_t zt_engine_server_step(const zt_engine *e)
{
    return e->home == ZT__OPT_SERVER ? e->stale_step : -1;
}
