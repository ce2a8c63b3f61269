/* Placement server (see engine.h): the run's registration with the engine's layout, the step protocol
 * through worker/state/client.h, snapshots, and the agreement of the ranks on a server's failure.
 *
 * A step, overlapped as the host AdamW of placement cpu is:
 *   backward   each block's gradient shard is pushed (fp32) by the host thread (host_optimizer.c) as soon as
 *              it is in host memory (on the CPU: in gshard), while the backward goes on with the next blocks;
 *   step       after the norm, this rank waits for its last pushes and the ranks agree that all pushed; then
 *              the pull thread starts pulling the new weights block 0 first, rank 0 starts the commit on
 *              every server at once on the committer thread, and zt_engine_step returns: the commit is off
 *              the critical path. Each server updates its blocks in order and serves block b's pull as soon
 *              as b is done, so the pulls follow the update;
 *   next step  its forward waits only for the block it reads (zt__host_opt_wait_block), block 0 first,
 *              while the servers are still updating later blocks; between that forward and its backward (no
 *              gradient of the step written yet) the ranks agree on the commit's answer and their pulls
 *              (zt__server_settle_step). Evaluations and exports agree first too (zt__server_settle).
 * A commit the servers refused (a server restarted from the snapshot of the step before and lost pushes)
 * or a pull that failed is repaired there: the gradients are still those of the step, so every rank pushes
 * them again, rank 0 commits again, every rank pulls again, and the forward is computed again on the new
 * weights (engine.c). A failed pull marks its block and those after it ready with the weights they had, so
 * no pass waits for them, and nothing computed on them counts. A server at an older step cannot be
 * repaired: the ranks stop with ZT_ESTATE and the run resumes from that step's checkpoint.
 *
 * Pulled bytes. On a GPU computing in bf16/fp16 the run is registered with that param dtype: the servers
 * round their updated fp32 masters to it with the round-to-nearest-even the host AdamW of placement cpu
 * uses (the fused output of zt_cpu_adam_update, or zt_cpu_adam_convert: the same bits), and each rank pulls
 * 2 bytes a parameter straight into h_lowp, which the copies up read. h_master then holds the masters of
 * e->masters_step only; an export (checkpoints) fetches those of the servers' step first
 * (zt__server_fresh_masters, PullParams with `masters`). On the CPU (fp32 compute) the pulled fp32 masters
 * go to h_master, which is wshard: they are the weights the passes read. With servers on this host h_lowp (GPU)
 * or wshard (CPU) lies in the state client's shared memory (e->weights_shared): the servers write the pulled
 * bytes there themselves and this process copies none of them (from the second step on their update writes
 * them there, ZT_STATE_SHARED_WEIGHTS: nothing here writes those weights between a step's first push and the
 * end of its pull, only an import between steps does); otherwise the client copies them out of its
 * shared-memory slots or TCP messages (the step breakdown's "worker copies"). Gradients are pushed as the host
 * gradient is held, the one the host AdamW of placement cpu reads in the same configuration: bf16 (2 bytes a
 * parameter) with one rank, bf16 compute, chunked gradients and no accumulation (e->hgrad_lowp; the servers'
 * AdamW reads bf16 gradients with the same kernel and scale), fp32 otherwise. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/units.h"
#include "offload/cpu_adam.h"
#include "worker/engine/engine_internal.h"

/* The pull thread: one job at a time, posted by zt__server_step; and, on rank 0, the step's commit on a
 * thread of its own. Both are waited for by resolve() (zt__server_settle, zt__server_settle_step). */
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
    int rc;                 /* the last job's outcome, until resolve() reports it */
    zt_err err;
    int64_t told;           /* the older step a server reported to it, or -1 */
    double t_post, t_done;  /* when the last job was posted and when its last block was in */
    uint64_t bytes;         /* bytes the last job pulled */
    uint64_t copied;        /* of its bytes, those this process copied (client and engine) ... */
    double copy_s;          /* ... and the seconds of those copies, summed over threads */
    /* the step whose commit is not agreed yet (pending): its commit, on rank 0 on `committer` */
    bool pending;
    bool skip;              /* it overflowed: committed without gradients */
    zt_server_commit_args args;
    pthread_t committer;
    bool committing;        /* committer started and not joined */
    int crc;                /* the commit's outcome, its message and the older step a server reported */
    zt_err cerr;
    int64_t ctold;
    double commit_s;        /* how long the commit took */
    double server_s;        /* the longest of the servers' own update times in their answers */
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
    const double t0 = zt_now_s();
    int rc;
    if (e->hgrad_lowp) { /* the bf16 gradient itself, as the host AdamW of placement cpu reads it */
        rc = zt_state_client_push_grad(e->o.client, e->run_id, step, b, e->rank, ZT_DTYPE_BF16,
                                       e->h_grad16 + k->shard_off, k->shard, err);
        e->timing.bytes_pushed += k->shard * 2;
    } else {
        const float *g = (e->dev->gpu ? e->h_grad : e->gshard) + k->shard_off;
        rc = zt_state_client_push_grad(e->o.client, e->run_id, step, b, e->rank, ZT_DTYPE_F32, g, k->shard, err);
        e->timing.bytes_pushed += k->shard * 4;
    }
    e->timing.push_s += zt_now_s() - t0;
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
 * fp32 masters into h_master (which is wshard); on a GPU the compute dtype into h_lowp (pull_lowp: the
 * servers rounded their masters as the host AdamW of placement cpu does; otherwise the fp32 masters into
 * h_master, rounded here: that copy's bytes and seconds are added to *copied and *copy_s), sent up on `stream`
 * (event `updated`); then marks the block ready for the step count `ready`. */
static int pull_block(zt_engine *e, int64_t step, int b, int64_t ready, void *stream, uint64_t *copied,
                      double *copy_s, zt_err *err)
{
    zt__block *k = &e->blocks[b];
    float *dst = e->h_master + k->shard_off;
    void *lowp = e->dev->gpu ? (char *)e->h_lowp + k->shard_off * e->esize : NULL;
    int rc = e->pull_lowp ? zt_state_client_pull(e->o.client, e->run_id, step, b, e->rank, 0, k->shard, lowp, err)
                          : zt_state_client_pull(e->o.client, e->run_id, step, b, e->rank, 0, k->shard, dst, err);
    if (rc < 0)
        return rc;
    if (e->dev->gpu) {
        if (!e->pull_lowp) { /* fp32 compute: the pulled masters, copied into h_lowp here */
            const double t0 = zt_now_s();
            if ((rc = zt_cpu_adam_convert(lowp, e->dtype, dst, k->shard, e->o.threads, err)) < 0)
                return rc;
            *copied += k->shard * e->esize;
            *copy_s += zt_now_s() - t0;
        }
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

/* Pulls every block after `step`, block 0 first, on the calling thread, marking them ready for the step count
 * `ready`, and waits for the copies. */
static int pull_all(zt_engine *e, int64_t step, int64_t ready, zt_err *err)
{
    void *stream = e->spipe ? e->spipe->stream : NULL;
    int rc = 0;
    uint64_t copied = 0;
    double copy_s = 0.0;
    for (int b = 0; b < e->nb && rc == 0; b++)
        rc = pull_block(e, step, b, ready, stream, &copied, &copy_s, err);
    if (e->dev->gpu && stream)
        e->dev->stream_sync(stream);
    return rc;
}

int zt__server_pull_all(zt_engine *e, int64_t step, zt_err *err)
{
    return pull_all(e, step, e->step_no, err);
}

/* Marks every block ready for the step count `ready` with the weights it has (nothing waits for a step
 * that was not taken; what was computed on them does not count). */
static void mark_all(zt_engine *e, int64_t ready)
{
    for (int b = 0; b < e->nb && e->host; b++)
        zt__host_opt_mark(e, b, ready);
}

/* One job of the pull thread: every block in order; after a failure the blocks left are marked ready at
 * once with the weights they have, so that no pass waits for them: the failure is reported by resolve()
 * before anything computed on them counts (the pass is computed again after the step is repaired). */
static void run_pulls(zt_engine *e, struct zt__server_pipe *p)
{
    int rc = 0;
    zt_err perr = {{0}};
    int64_t told = -1;
    uint64_t bytes = 0, copied = 0, client_bytes0;
    double copy_s = 0.0, client_s0;
    zt_state_client_pull_copies(e->o.client, &client_bytes0, &client_s0); /* only this thread pulls now */
    for (int b = 0; b < e->nb && rc == 0; b++) {
        rc = pull_block(e, p->step, b, p->ready, p->stream, &copied, &copy_s, &perr);
        if (rc == 0) {
            bytes += pull_bytes(e, b);
        } else {
            told = rc == ZT_ESTATE ? zt_state_client_server_step(e->o.client) : -1;
            for (int l = b; l < e->nb && e->host; l++)
                zt__host_opt_mark(e, l, p->ready);
        }
    }
    if (e->dev->gpu)
        e->dev->stream_sync(p->stream); /* the copies are in when the job is done */
    uint64_t client_bytes;
    double client_s;
    zt_state_client_pull_copies(e->o.client, &client_bytes, &client_s);
    pthread_mutex_lock(&p->mu);
    p->rc = rc;
    p->err = perr;
    p->told = told;
    p->bytes = bytes;
    p->copied = copied + (client_bytes - client_bytes0);
    p->copy_s = copy_s + (client_s - client_s0);
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

/* The commit of the pending step (rank 0): on the committer thread, or on the caller's. */
static void *commit_main(void *arg)
{
    zt_engine *e = arg;
    struct zt__server_pipe *p = e->spipe;
    const double t0 = zt_now_s();
    p->crc = zt_state_client_commit_timed(e->o.client, e->run_id, &p->args, &p->server_s, &p->cerr);
    p->ctold = p->crc == ZT_ESTATE ? zt_state_client_server_step(e->o.client) : -1; /* this thread's call */
    p->commit_s = zt_now_s() - t0;
    return NULL;
}

static void commit_start(zt_engine *e)
{
    struct zt__server_pipe *p = e->spipe;
    p->crc = 0;
    p->ctold = -1;
    p->committing = pthread_create(&p->committer, NULL, commit_main, e) == 0;
    if (!p->committing)
        (void)commit_main(e); /* no thread: on the critical path, as it used to be */
}

static void commit_join(struct zt__server_pipe *p)
{
    if (p->committing) {
        pthread_join(p->committer, NULL);
        p->committing = false;
    }
}

/* Stops the pull thread; see engine_internal.h. */
void zt__server_pipe_destroy(zt_engine *e)
{
    struct zt__server_pipe *p = e->spipe;
    if (!p)
        return;
    commit_join(p);
    if (p->pending && p->crc < 0)
        zt_log(ZT_LOG_WARN, "the state servers did not take step %lld, the run's last: %s", (long long)p->args.step,
               p->cerr.msg);
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
    p->t_post = zt_now_s();
    p->posted = true;
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

/* The error of a step that a server at an older step refused (e->stale_step): the run resumes from the
 * checkpoint of that step. */
static int stale_error(zt_engine *e, int64_t step, zt_err *err)
{
    return zt_fail(err, ZT_ESTATE, "a state server of run '%s' holds step %lld while this run is at step %lld (it "
                   "restarted from its last snapshot): resume from the checkpoint of step %lld", e->run_id,
                   (long long)e->stale_step, (long long)step - 1, (long long)e->stale_step);
}

/* Waits for the pulls of the last step and, when its commit is still pending, for the commit (rank 0), and
 * makes the ranks agree on both. A step the servers did not take (the commit refused: a server that
 * restarted from the snapshot of the step before lost some pushes; pushes overwrite) is pushed whole and
 * committed again, and pulled; a step whose pulls failed is pulled again; *repaired then says that the weights
 * changed after passes may have read them. A server at an older step cannot be repaired: ZT_ESTATE with
 * e->stale_step, and the run resumes from the checkpoint of that step. The gradients are still those of the
 * step: every rank calls this before the next backward writes any (zt__server_settle_step). */
static int resolve(zt_engine *e, bool *repaired, zt_err *err)
{
    struct zt__server_pipe *p = e->spipe;
    zt_err perr = {{0}};
    int64_t told;
    if (repaired)
        *repaired = false;
    int prc = pipe_wait(e, &perr, &told);
    if (!p || !p->pending) {
        if (prc < 0 && err)
            *err = perr;
        return agree_told(e, prc, told, err);
    }
    const double t0 = zt_now_s();
    commit_join(p);
    p->pending = false;
    const int64_t step = p->args.step;
    pthread_mutex_lock(&p->mu); /* the job is done: pipe_wait waited for it */
    const double pulled = p->t_done > p->t_post ? p->t_done - p->t_post : 0.0;
    const int64_t ready = p->ready;
    e->timing.pull_s = pulled;
    e->timing.bytes_pulled = p->bytes;
    e->timing.bytes_pull_copied = p->copied;
    e->timing.pull_copy_s = p->copy_s;
    pthread_mutex_unlock(&p->mu);
    /* rank 0 timed the commit; the other ranks see it in their pulls, which followed the update */
    e->timing.update_s = e->rank == 0 ? p->commit_s : pulled;
    e->timing.server_update_s = e->rank == 0 ? p->server_s : -1.0;
    zt_err cerr = p->cerr;
    int rc = agree_told(e, e->rank == 0 ? p->crc : 0, e->rank == 0 ? p->ctold : -1, &cerr);
    const bool taken = rc == 0;
    if (taken) {
        if (prc < 0)
            cerr = perr;
        rc = agree_told(e, prc, told, &cerr);
    }
    e->timing.commit_wait_s += zt_now_s() - t0;
    if (rc == 0)
        return 0;
    if (e->stale_step >= 0) {
        e->server_step = step - 1;
        return stale_error(e, step, err);
    }
    zt_log(ZT_LOG_WARN, "step %lld: %s (%s); %s", (long long)step,
           taken ? "the pulls of the new weights failed" : "the state servers did not take the step", cerr.msg,
           taken ? "pulling them again" : "pushing this rank's gradients again and committing once more");
    if (e->dev->gpu) { /* the passes and gathers that read the weights left behind are done before new ones come */
        e->dev->stream_sync(e->cs);
        e->dev->stream_sync(e->ms);
        e->dev->stream_sync(e->up);
        if (e->fs)
            e->dev->stream_sync(e->fs);
    }
    rc = 0;
    if (!taken) {
        rc = server_agree(e, p->skip ? 0 : zt__server_push_all(e, step, err), err);
        if (rc == 0) {
            const double tc = zt_now_s();
            double server_s = -1.0;
            rc = e->rank == 0 ? zt_state_client_commit_timed(e->o.client, e->run_id, &p->args, &server_s, err) : 0;
            rc = server_agree(e, rc, err);
            e->timing.update_s = zt_now_s() - tc;
            e->timing.server_update_s = server_s;
        }
    }
    if (rc == 0)
        rc = server_agree(e, pull_all(e, step, ready, err), err);
    if (rc < 0) {
        mark_all(e, ready);
        e->server_step = step - 1;
        return e->stale_step >= 0 ? stale_error(e, step, err) : rc;
    }
    if (repaired)
        *repaired = true;
    return 0;
}

/* Reports the last pulls and commit; see engine_internal.h. */
int zt__server_settle(zt_engine *e, zt_err *err)
{
    return resolve(e, NULL, err);
}

/* The last step's commit before the next backward; see engine_internal.h. */
int zt__server_settle_step(zt_engine *e, bool *repaired, zt_err *err)
{
    *repaired = false;
    if (!e->spipe || !e->spipe->pending)
        return 0;
    return resolve(e, repaired, err);
}

/* The server part of a step; see engine_internal.h. A failed push is tried once more, whole (pushes
 * overwrite); then the pulls of the new weights start on the pull thread and rank 0 commits on the committer
 * thread, and the step returns: the servers update block 0 first and serve block b's pull as soon as b is
 * done, so the next forward starts behind block 0 instead of behind the whole update. The commit's outcome is
 * agreed before the next backward writes gradients (zt__server_settle_step, resolve()). */
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
    /* the last step's commit and pulls were agreed before this step's backward */
    ZT_ASSERT(!e->spipe->pending);
    zt_err serr;
    int src = zt__server_settle(e, &serr);
    if (src < 0) {
        if (err)
            *err = serr;
        return src;
    }
    for (int attempt = 0;; attempt++) {
        if (attempt > 0)
            rc = skip ? 0 : zt__server_push_all(e, step, err);
        if (skip)
            rc = 0; /* an overflowed step commits without gradients */
        /* every rank's pushes are done (all-reduce) before rank 0 commits */
        if ((rc = server_agree(e, rc, err)) == 0)
            break;
        if (attempt > 0 || e->stale_step >= 0) {
            mark_all(e, ready);
            return e->stale_step >= 0 ? stale_error(e, step, err) : rc;
        }
        zt_log(ZT_LOG_WARN, "step %lld: the state servers did not take this rank's gradients (%s); pushing them "
               "again", (long long)step, err ? err->msg : "");
    }
    struct zt__server_pipe *p = e->spipe;
    p->args = (zt_server_commit_args){
        .step = step,
        .grad_norm = norm,
        /* a bf16 host gradient still holds the micro-batch's loss scale (1 in training), as in host_optimizer.c */
        .clip_coef = e->hgrad_lowp ? clip_coef * e->inv_scale : clip_coef,
        .lr = lr,
        .overflow = skip,
    };
    p->skip = skip;
    p->pending = true;
    p->commit_s = 0.0;
    p->server_s = 0.0;
    pipe_post(e, step, ready); /* the pulls follow the servers' update, block by block */
    if (e->rank == 0)
        commit_start(e);
    e->server_step = step;
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
        rc = pull_all(e, step, e->step_no, err); /* the pulled weights are those of the current step count */
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
