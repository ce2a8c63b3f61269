/* The optimizer off the GPU, host side (see engine.h, placement cpu with --device cuda; and the gradient
 * pushes of placement server): one thread that takes jobs from the engine in order.
 *
 *   UPDATE  after the step's norm: for blocks 0, 1, ... in order, wait until the block's gradient shard has
 *           reached host memory, run AdamW (offload/cpu_adam.h) on its pieces writing the new weights in the
 *           compute dtype, copy them up to the GPU on this thread's stream, and mark the block ready;
 *   PUSH    placement server: once block b's gradient shard has reached host memory, push it to the servers
 *           (this runs during the backward of the other blocks).
 *
 * Readiness: queued[b] is the number of steps whose update of block b has been queued on the GPU (its
 * copy enqueued and `updated` recorded after it). The engine's step counter says which step the next pass
 * belongs to; zt__host_opt_wait_block waits (on the host) until queued[b] reaches it, then makes a stream
 * wait for the copy. So the next step's forward waits only for the block it needs, block 0 first. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/units.h"
#include "offload/cpu_adam.h"
#include "worker/engine/engine_internal.h"

enum job_kind { JOB_UPDATE, JOB_PUSH };

typedef struct job {
    enum job_kind kind;
    int block;            /* PUSH */
    int64_t step;         /* UPDATE: the step count once done; PUSH: the servers' step being pushed */
    float lr, clip_coef;  /* UPDATE; clip_coef: times the inverse loss scale for a bf16 host gradient */
    int64_t adam_step;    /* UPDATE */
    bool skip;            /* UPDATE */
} job;

struct zt__host_opt {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* broadcast on every change: a job queued or done, a block ready */
    job *q;                /* ring of jobs */
    int cap, head, count;
    bool busy;             /* the thread is working on a job */
    bool stop;
    int64_t *queued;       /* [nb] */
    int *first_piece;      /* [nb + 1]: pieces of block b are [first_piece[b], first_piece[b + 1]) */
    void *stream;          /* the thread's copies to the GPU */
    int rc;                /* first failure since the last drain */
    zt_err err;
    int update_rc;         /* first failure of an update (moments on disk); never cleared */
    zt_err update_err;
    double busy_s;         /* seconds of the last UPDATE */
    zt__disk_timing disk;  /* the disk traffic of the last UPDATE (under mu once it is done) */
};

/* Marks block b as holding the weights of `step` steps. */
static void mark(struct zt__host_opt *h, int b, int64_t step)
{
    pthread_mutex_lock(&h->mu);
    h->queued[b] = step;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Records a failure of the disk traffic of the update (the first one stays), before the blocks it leaves
 * are marked ready: whoever waits for them sees it. */
static void fail_update(zt_engine *e, int rc, const zt_err *io)
{
    struct zt__host_opt *h = e->host;
    zt_err why;
    const int code = rc < 0 ? rc : ZT_EIO;
    zt_fail(&why, code, "the host AdamW could not read or write the Adam moments on disk in '%s' (%s): training "
            "stops; the last checkpoint is intact (free space there, or resume it with another --moments-dir)",
            e->moments_dir, io->msg);
    pthread_mutex_lock(&h->mu);
    if (h->update_rc == 0) {
        h->update_rc = code;
        h->update_err = why;
    }
    pthread_mutex_unlock(&h->mu);
}

/* AdamW of block b's pieces with the masters at master (h_master, xbase 0; or the staging buffer of the
 * block's record, xbase the block's shard offset) and the moments at m and v (the host arrays, or the record:
 * then at the block's start, base its shard offset). */
static void update_block(zt_engine *e, const job *j, zt_adamw_params *p, int b, float *master, size_t xbase, void *m,
                         void *v, size_t base)
{
    struct zt__host_opt *h = e->host;
    for (int i = h->first_piece[b]; i < h->first_piece[b + 1]; i++) {
        const zt__piece *pc = &e->pieces[i];
        p->weight_decay = pc->decay ? (float)e->o.weight_decay : 0.0f;
        zt_cpu_adam_range r = {
            .param = master + (pc->shard_off - xbase),
            .grad = e->hgrad_lowp ? (const void *)(e->h_grad16 + pc->shard_off)
                                  : (const void *)(e->h_grad + pc->shard_off),
            .grad_dtype = e->hgrad_lowp ? ZT_DTYPE_BF16 : ZT_DTYPE_F32,
            .out = e->o.stream_masters ? NULL : (char *)e->h_lowp + pc->shard_off * e->esize,
            .out_dtype = e->dtype,
            .n = pc->n,
        };
        /* the rounding bits follow the element, wherever its moments are held */
        zt__engine_moments(e, &r, m, v, pc->shard_off - base, pc->shard_off, j->adam_step);
        zt_err aerr;
        int rc = zt_cpu_adam_update(&r, p, e->o.threads, &aerr);
        ZT_ASSERT(rc == 0); /* fp32 gradients, step >= 1, arrays given: it cannot fail */
        (void)rc;
    }
}

/* Waits for staging buffer i's write in flight (if any) and adds the wait to *waited. */
static int wait_write(zt_engine *e, int *wr, double *waited, zt_err *ioerr)
{
    if (*wr < 0)
        return 0;
    const double t0 = zt_now_s();
    int rc = zt__mdisk_wait(e, *wr, ioerr);
    *wr = -1;
    *waited += zt_now_s() - t0;
    return rc;
}

/* Makes sure block b's record is being read into staging buffer i: nothing when it is (read ahead, or queued
 * while the block before was updated); else once the buffer's last write is done, a read queued now. */
static int want_record(zt_engine *e, int b, int i, int rd[2], int rdb[2], int wr[2], zt__disk_timing *t,
                       zt_err *ioerr)
{
    if (rdb[i] == b)
        return 0;
    ZT_ASSERT(rd[i] < 0); /* a buffer receives the records of its blocks in order */
    int rc = wait_write(e, &wr[i], &t->write_wait_s, ioerr);
    if (rc == 0 && (rc = zt__mdisk_read_async(e, b, i, &rd[i], ioerr)) == 0)
        rdb[i] = b;
    return rc;
}

/* AdamW of every block after the norm, block 0 first, each block's new weights sent up at once. With the
 * moments on disk (the blocks from d0 = mram_blocks on), block b's record arrives in staging buffer (b - d0) % 2:
 * the first two were read ahead during the step's passes (zt__mdisk_read_ahead, queued at the end of the last
 * update), every later one is read while the block before it is updated, once the buffer's last write is done,
 * and each record is written back behind its update. After the last block the writes are waited for and the
 * next update's first two records are read ahead. A disk failure stops the update: the blocks left keep their
 * weights, and zt_engine_step reports it (the next step's, once its passes have waited for the blocks). */
static void run_update(zt_engine *e, const job *j)
{
    struct zt__host_opt *h = e->host;
    const double t0 = zt_now_s();
    zt_adamw_params p = {
        .lr = j->lr,
        .beta1 = (float)e->o.beta1,
        .beta2 = (float)e->o.beta2,
        .eps = (float)e->o.eps,
        .grad_scale = j->clip_coef,
        .step = (int)j->adam_step,
    };
    const bool disk = e->mstore != NULL && !j->skip; /* a skipped step leaves the records and their reads ahead */
    const int d0 = e->mram_blocks; /* the first block whose moments are on disk (nb: none) */
    int rd[2] = {-1, -1}, rdb[2] = {-1, -1}; /* each staging buffer's read in flight (ticket) and its block */
    int wr[2] = {-1, -1};                    /* each staging buffer's write in flight */
    zt__disk_timing dt = {0};
    bool failed = false;
    zt_err ioerr = {{0}};
    int rc = 0;
    bool was_ahead[2] = {false, false};      /* the record of block d0 + i was read during the passes */
    if (disk) { /* the reads ahead become this update's */
        for (int i = 0; i < 2; i++) {
            rd[i] = e->mahead[i] >= 0 ? e->mahead_ticket[i] : -1;
            rdb[i] = e->mahead[i];
            was_ahead[i] = e->mahead[i] == d0 + i;
            e->mahead[i] = -1;
        }
    }
    if (disk && h->update_rc != 0)
        failed = true; /* an earlier step failed: no more updates */
    else if (disk && d0 < e->nb && (rc = want_record(e, d0, 0, rd, rdb, wr, &dt, &ioerr)) < 0)
        failed = true, fail_update(e, rc, &ioerr);
    for (int b = 0; b < e->nb; b++) {
        zt__block *k = &e->blocks[b];
        if (k->resident)
            continue; /* updated on the GPU (gpu_fraction), marked by the engine */
        if (j->skip || failed) {
            mark(h, b, j->step);
            continue;
        }
        e->dev->event_sync(k->grad_out); /* the step's gradient shard is in h_grad */
        if (disk && zt__mdisk_has(e, b)) {
            const int cur = (b - d0) % 2, nxt = 1 - cur;
            const double tr = zt_now_s();
            rc = zt__mdisk_wait(e, rd[cur], &ioerr);
            dt.read_wait_s += zt_now_s() - tr;
            rd[cur] = -1;
            rdb[cur] = -1; /* the buffer holds block b's record now, and is written back from */
            dt.bytes_read += zt__mdisk_record_bytes(e, b);
            dt.read_ahead += b - d0 < 2 && was_ahead[cur];
            if (rc == 0 && b + 1 < e->nb)
                rc = want_record(e, b + 1, nxt, rd, rdb, wr, &dt, &ioerr);
            if (rc < 0) {
                failed = true;
                fail_update(e, rc, &ioerr);
                mark(h, b, j->step);
                continue;
            }
            char *rec = (char *)e->mbuf[cur];
            const bool own = zt__mdisk_has_master(e, b); /* the record holds the block's masters, first */
            char *mom = rec + zt__mdisk_moment_off(e, b);
            update_block(e, j, &p, b, own ? (float *)rec : e->h_master, own ? k->shard_off : 0, mom,
                         mom + k->shard * e->msize, k->shard_off);
            if ((rc = zt__mdisk_write_async(e, b, cur, &wr[cur], &ioerr)) < 0)
                failed = true, fail_update(e, rc, &ioerr);
            else
                dt.bytes_written += zt__mdisk_record_bytes(e, b);
        } else {
            update_block(e, j, &p, b, e->h_master, 0, e->h_m, e->h_v, 0);
        }
        if (!e->o.stream) { /* streamed weights are read from h_lowp by the next pass */
            e->dev->copy(zt__engine_block_weights(e, b), (char *)e->h_lowp + k->shard_off * e->esize,
                         k->shard * e->esize, h->stream);
            e->dev->record(k->updated, h->stream);
        }
        mark(h, b, j->step);
    }
    /* Behind the last block (the passes have what they need): a read ahead cut short by a failure, the last
     * writes, then the next update's first records. */
    const double tb = zt_now_s();
    for (int i = 0; i < 2; i++) {
        zt_err werr;
        int wrc;
        if (rd[i] >= 0 && (wrc = zt__mdisk_wait(e, rd[i], &werr)) < 0)
            fail_update(e, wrc, &werr);
        double ignored = 0;
        if (wr[i] >= 0 && (wrc = wait_write(e, &wr[i], &ignored, &werr)) < 0)
            fail_update(e, wrc, &werr), failed = true;
    }
    if (disk && !failed && h->update_rc == 0 && !e->o.moments_no_read_ahead)
        zt__mdisk_read_ahead(e);
    dt.behind_s = zt_now_s() - tb;
    h->busy_s = zt_now_s() - t0;
    if (disk) {
        pthread_mutex_lock(&h->mu);
        h->disk = dt;
        pthread_mutex_unlock(&h->mu);
    }
}

static void run_push(zt_engine *e, const job *j)
{
    struct zt__host_opt *h = e->host;
    e->dev->event_sync(e->blocks[j->block].grad_out);
    zt_err perr;
    int rc = zt__server_push_block(e, j->step, j->block, &perr);
    if (rc < 0) {
        pthread_mutex_lock(&h->mu);
        if (h->rc == 0) {
            h->rc = rc;
            h->err = perr;
        }
        pthread_mutex_unlock(&h->mu);
    }
}

static void *thread_main(void *arg)
{
    zt_engine *e = arg;
    struct zt__host_opt *h = e->host;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->count == 0 && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->count == 0 && h->stop)
            break;
        job j = h->q[h->head];
        h->head = (h->head + 1) % h->cap;
        h->count--;
        h->busy = true;
        pthread_mutex_unlock(&h->mu);
        if (j.kind == JOB_UPDATE)
            run_update(e, &j);
        else
            run_push(e, &j);
        pthread_mutex_lock(&h->mu);
        h->busy = false;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void enqueue(zt_engine *e, const job *j)
{
    struct zt__host_opt *h = e->host;
    pthread_mutex_lock(&h->mu);
    ZT_ASSERT(h->count < h->cap); /* at most one UPDATE and nb PUSHes are queued at a time */
    h->q[(h->head + h->count) % h->cap] = *j;
    h->count++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Starts the thread; see engine_internal.h. */
int zt__host_opt_create(zt_engine *e, zt_err *err)
{
    struct zt__host_opt *h = zt_xcalloc(1, sizeof *h);
    h->cap = e->nb + 4;
    h->q = zt_xcalloc((size_t)h->cap, sizeof *h->q);
    h->queued = zt_xcalloc((size_t)e->nb, sizeof *h->queued);
    h->first_piece = zt_xcalloc((size_t)e->nb + 1, sizeof *h->first_piece);
    for (int b = 0, i = 0; b <= e->nb; b++) {
        while (i < e->npieces && e->pieces[i].block < b)
            i++;
        h->first_piece[b] = i;
    }
    h->stream = e->dev->stream_create();
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    e->host = h;
    if (pthread_create(&h->thread, NULL, thread_main, e) != 0) {
        e->host = NULL;
        e->dev->stream_destroy(h->stream);
        free(h->q);
        free(h->queued);
        free(h->first_piece);
        free(h);
        return zt_fail(err, ZT_ENOMEM, "cannot start the host optimizer thread");
    }
    return 0;
}

/* Finishes the queued jobs and stops the thread. */
void zt__host_opt_destroy(zt_engine *e)
{
    struct zt__host_opt *h = e->host;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    e->dev->stream_sync(h->stream);
    e->dev->stream_destroy(h->stream);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->q);
    free(h->queued);
    free(h->first_piece);
    free(h);
    e->host = NULL;
}

/* Queues the step's update; see engine_internal.h. */
void zt__host_opt_update(zt_engine *e, float lr, float clip_coef, int64_t adam_step, bool skip)
{
    /* a bf16 host gradient still holds the micro-batch's loss scale (1 in training: bf16 is not scaled), which
     * the folds remove from an fp32 one */
    const float scale = e->hgrad_lowp ? clip_coef * e->inv_scale : clip_coef;
    job j = {.kind = JOB_UPDATE, .step = e->step_no + 1, .lr = lr, .clip_coef = scale, .adam_step = adam_step,
             .skip = skip};
    enqueue(e, &j);
}

/* Queues a push of block b's gradient; see engine_internal.h. */
void zt__host_opt_push(zt_engine *e, int b)
{
    job j = {.kind = JOB_PUSH, .block = b, .step = e->server_step + 1};
    enqueue(e, &j);
}

/* Waits for the queue; see engine_internal.h. */
int zt__host_opt_drain(zt_engine *e, zt_err *err)
{
    struct zt__host_opt *h = e->host;
    pthread_mutex_lock(&h->mu);
    while (h->count > 0 || h->busy)
        pthread_cond_wait(&h->cv, &h->mu);
    int rc = h->rc;
    if (rc < 0 && err)
        *err = h->err;
    h->rc = 0;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Marks block b ready after a copy queued by the caller (placement server's pulls). */
void zt__host_opt_mark(zt_engine *e, int b, int64_t step)
{
    mark(e->host, b, step);
}

/* The host thread's copy stream (for the caller's copies that others wait on through `updated`). */
void *zt__host_opt_stream(zt_engine *e)
{
    return e->host->stream;
}

/* Waits for block b's weights of the current step; see engine_internal.h. */
double zt__host_opt_wait_block(zt_engine *e, int b, void *stream)
{
    struct zt__host_opt *h = e->host;
    double waited = 0.0;
    pthread_mutex_lock(&h->mu);
    if (h->queued[b] < e->step_no) {
        const double t0 = zt_now_s();
        while (h->queued[b] < e->step_no)
            pthread_cond_wait(&h->cv, &h->mu);
        waited = zt_now_s() - t0;
    }
    pthread_mutex_unlock(&h->mu);
    e->dev->wait(stream, e->blocks[b].updated);
    return waited;
}

/* The first failure of an update; see engine_internal.h. */
int zt__host_opt_failed(zt_engine *e, zt_err *err)
{
    struct zt__host_opt *h = e->host;
    pthread_mutex_lock(&h->mu);
    int rc = h->update_rc;
    if (rc < 0 && err)
        *err = h->update_err;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Seconds of the last update; see engine_internal.h. */
double zt__host_opt_busy(zt_engine *e)
{
    return e->host->busy_s;
}

/* The disk traffic of the last update; see engine_internal.h. */
void zt__host_opt_disk(zt_engine *e, zt__disk_timing *t)
{
    struct zt__host_opt *h = e->host;
    pthread_mutex_lock(&h->mu);
    *t = h->disk;
    pthread_mutex_unlock(&h->mu);
}
