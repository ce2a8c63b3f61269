/* Placement server (see engine.h): the run's registration with the engine's layout, the step protocol
 * through worker/state/client.h (push this rank's gradient shards, rank 0 commits once every rank pushed,
 * every rank pulls its updated shards, block 0 first), snapshots, and the agreement of the ranks on a
 * server's failure.
 *
 * Pulls are fp32: this rank keeps its masters of the last step in h_master (a checkpoint's weights) and
 * rounds them to the compute dtype for the GPU, the same rounding the host AdamW of placement cpu does, so
 * both placements give the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "offload/cpu_adam.h"
#include "worker/engine/engine_internal.h"

/* Agreement after a server call: 0 when rc == 0 on every rank; otherwise a negative code (this rank's
 * message when it failed itself, else one naming the failed rank) and, when a server said it holds an
 * older step, the lowest such step in e->stale_step on every rank. */
static int server_agree(zt_engine *e, int rc, zt_err *err)
{
    int64_t told = rc == ZT_ESTATE ? zt_state_client_server_step(e->o.client) : -1;
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

/* Pushes this rank's gradient shard of block b for `step`: from host memory on a GPU, from gshard on the
 * CPU. */
int zt__server_push_block(zt_engine *e, int64_t step, int b, zt_err *err)
{
    const zt__block *k = &e->blocks[b];
    const float *g = (e->dev->gpu ? e->h_grad : e->gshard) + k->shard_off;
    return zt_state_client_push_grad(e->o.client, e->run_id, step, b, e->rank, ZT_DTYPE_F32, g, k->shard, err);
}

int zt__server_push_all(zt_engine *e, int64_t step, zt_err *err)
{
    int rc = 0;
    for (int b = 0; b < e->nb && rc == 0; b++)
        rc = zt__server_push_block(e, step, b, err);
    return rc;
}

/* Pulls this rank's fp32 shard of every block after `step` into h_master, block 0 first, and makes it the
 * weights the passes read: on the CPU a copy, on a GPU the compute dtype sent up block by block (marked
 * ready for the step count `ready`). */
int zt__server_pull_all(zt_engine *e, int64_t step, zt_err *err)
{
    const int64_t ready = e->step_no + 1;
    for (int b = 0; b < e->nb; b++) {
        zt__block *k = &e->blocks[b];
        float *dst = e->h_master + k->shard_off;
        int rc = zt_state_client_pull(e->o.client, e->run_id, step, b, e->rank, 0, k->shard, dst, err);
        if (rc < 0)
            return rc;
        if (!e->dev->gpu) {
            memcpy((float *)e->wshard + k->shard_off, dst, k->shard * 4);
            continue;
        }
        void *lowp = (char *)e->h_lowp + k->shard_off * e->esize;
        if ((rc = zt_cpu_adam_convert(lowp, e->dtype, dst, k->shard, e->o.threads, err)) < 0)
            return rc;
        if (!e->o.stream) { /* streamed weights are read from h_lowp by the next pass */
            void *stream = zt__host_opt_stream(e);
            e->dev->copy(zt__engine_block_weights(e, b), lowp, k->shard * e->esize, stream);
            e->dev->record(k->updated, stream);
        }
        zt__host_opt_mark(e, b, ready);
    }
    return 0;
}

/* The server part of a step; see engine_internal.h. A failed push or commit is tried once more, whole: a
 * server that restarted from the snapshot of the previous step lost the pushes it had received, and
 * pushes overwrite, so pushing every shard again and committing again completes the step. A server at an
 * older step cannot: that is returned (e->stale_step) and the run resumes from the checkpoint of that
 * step. */
int zt__server_step(zt_engine *e, int push_rc, zt_err *push_err, double norm, float clip_coef, float lr,
                    bool skip, zt_err *err)
{
    const int64_t step = e->server_step + 1;
    int rc = push_rc;
    if (rc < 0 && err)
        *err = *push_err;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0)
            rc = skip ? 0 : zt__server_push_all(e, step, err);
        if (skip)
            rc = 0; /* an overflowed step commits without gradients */
        /* every rank's pushes are done (all-reduce) before rank 0 commits; all ranks learn the outcome */
        if ((rc = server_agree(e, rc, err)) == 0) {
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
            if (e->stale_step >= 0)
                return zt_fail(err, ZT_ESTATE, "a state server of run '%s' holds step %lld while this run is at step "
                               "%lld (it restarted from its last snapshot): resume from the checkpoint of step %lld",
                               e->run_id, (long long)e->stale_step, (long long)step - 1, (long long)e->stale_step);
            return rc;
        }
        zt_log(ZT_LOG_WARN, "step %lld: the state servers did not take the step (%s); pushing this rank's "
               "gradients again and committing once more", (long long)step, err ? err->msg : "");
    }
    e->server_step = step;
    rc = server_agree(e, zt__server_pull_all(e, step, err), err);
    if (rc == 0 && e->dev->gpu)
        e->dev->stream_sync(zt__host_opt_stream(e));
    return rc;
}

/* The layout the servers hold: W shards of every block (padded as the engine pads), the tensors' weight
 * decay (adjacent ranges merged), AdamW, fp32 pulls. */
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
        .param_dtype = ZT_DTYPE_F32,
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
    int64_t at = 0;
    int rc = register_run(e, &at, err);
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
        if (rc == 0 && e->dev->gpu)
            e->dev->stream_sync(zt__host_opt_stream(e));
    }
    e->server_step = step;
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
