/* The multi-rank training loop around the ZeRO runtime (see zero_train.h). */
#include "worker/runtime/zero_train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"
#include "common/fileio.h"
#include "common/units.h"
#include "kernels/cpu_threads.h"
#include "worker/launch/env.h"
#include "worker/launch/startup.h"
#include "worker/train/checkpoint.h"
#include "worker/train/metrics.h"
#include "worker/train/placement.h"
#include "worker/train/schedule.h"
#ifdef ZT_WITH_ZERO_CUDA
#include "worker/runtime/zero_cuda.h"  /* --device cuda: the runtime on GPUs over NCCL */
#endif

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Hashes the config's values; see zero_train.h. */
uint64_t zt_zero_train_config_hash(const zt_train_config *cfg)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, cfg->init_from, strlen(cfg->init_from));
    h = fnv1a(h, cfg->train_data, strlen(cfg->train_data));
    h = fnv1a(h, cfg->resume, strlen(cfg->resume));
    h = fnv1a(h, cfg->val_data, strlen(cfg->val_data));
    /* field by field: the structs' padding bytes differ between processes */
    const zt_gpt2_config *m = &cfg->model;
    const int64_t ints[] = {m->n_layer, m->n_head, m->n_embd, m->n_positions, m->vocab_size,
                            m->tie_word_embeddings, cfg->steps, cfg->batch_size, cfg->seq_len, cfg->grad_accum,
                            cfg->warmup_steps, cfg->save_every, cfg->seed, cfg->shuffle, cfg->eval_every,
                            cfg->eval_batches};
    const double reals[] = {m->layer_norm_epsilon, cfg->lr, cfg->min_lr, cfg->lr_gamma, cfg->weight_decay, cfg->beta1,
                            cfg->beta2, cfg->eps, cfg->grad_clip};
    h = fnv1a(h, ints, sizeof ints);
    h = fnv1a(h, reals, sizeof reals);
    h = fnv1a(h, cfg->schedule, strlen(cfg->schedule) + 1);
    /* Where and how the step runs: the device and precision, the optimizer placement, the number of state
     * servers (it decides which server owns which shard; the addresses themselves may differ between
     * hosts), the embedded store, and the ZeRO level, activation checkpointing and prefetch depth.
     * Strings are hashed with their NUL so that two adjacent strings cannot trade characters. */
    int64_t nservers = 0;
    if (cfg->servers[0]) {
        nservers = 1;
        for (const char *p = cfg->servers; *p; p++)
            nservers += *p == ',';
    }
    const int64_t runtime[] = {nservers, cfg->zero_level, cfg->prefetch};
    h = fnv1a(h, runtime, sizeof runtime);
    h = fnv1a(h, cfg->device, strlen(cfg->device) + 1);
    h = fnv1a(h, cfg->precision, strlen(cfg->precision) + 1);
    h = fnv1a(h, cfg->optimizer, strlen(cfg->optimizer) + 1);
    h = fnv1a(h, cfg->state_store, strlen(cfg->state_store) + 1);
    return fnv1a(h, cfg->checkpointing, strlen(cfg->checkpointing) + 1);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Makes the ranks agree on a local outcome: returns 0 when rc == 0 on every rank; otherwise a negative
 * code, keeping this rank's message when it failed itself and naming the failing rank(s) when not. */
static int agree(zt_comm *comm, int rc, zt_err *err)
{
    float bad = rc < 0 ? (float)(zt_comm_rank(comm) + 1) : 0.0f, worst = 0.0f;
    zt_err e;
    int crc = zt_comm_all_reduce(comm, &bad, &worst, 1, ZT_COMM_F32, ZT_COMM_MAX, NULL, &e);
    if (rc < 0)
        return rc;
    if (crc < 0)
        return zt_fail(err, crc, "%s", e.msg);
    if (worst > 0)
        return zt_fail(err, ZT_ESTATE, "rank %d failed (its log says why); stopping with it", (int)worst - 1);
    return 0;
}

/* The `step 120/1000 | loss ...` line, as the single-process trainer prints it. */
static void log_progress(int64_t step, int64_t steps, float loss, double lr, double norm, double tok_s,
                         double elapsed, double eta)
{
    char el[32], et[32];
    zt_format_duration(elapsed, el, sizeof el);
    zt_format_duration(eta, et, sizeof et);
    zt_log(ZT_LOG_INFO, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | elapsed %s | eta %s",
           (long long)step, (long long)steps, (double)loss, lr, norm, tok_s, el, et);
}

/* The mean loss of one validation batch (this rank's rows) on the runtime in use (zc: the GPU runtime, else
 * the CPU one); a collective. */
static int batch_loss(zt_zero *z, void *zc, const int32_t *tok, const int32_t *tgt, int b, int T, float *mean,
                      zt_err *err)
{
#ifdef ZT_WITH_ZERO_CUDA
    if (zc)
        return zt_zero_cuda_eval(zc, tok, tgt, b, T, mean, err);
#endif
    (void)zc;
    float loss;
    int rc = zt_zero_forward(z, tok, tgt, b, T, &loss, err);
    return rc < 0 ? rc : zt_zero_mean(z, loss, mean, err);
}

/* The mean val loss over `batches` global batches from the start of the validation data, each rank taking
 * its rows of every batch (a collective). */
static int evaluate(zt_zero *z, void *zc, zt_dataloader *val, int64_t batches, int rank, int b, int T,
                    int32_t *tok, int32_t *tgt, float *out, zt_err *err)
{
    zt_dataloader_reset(val);
    double sum = 0.0;
    const size_t off = (size_t)rank * (size_t)b * (size_t)T;
    for (int64_t i = 0; i < batches; i++) {
        float mean;
        zt_dataloader_next(val, tok, tgt);
        int rc = batch_loss(z, zc, tok + off, tgt + off, b, T, &mean, err);
        if (rc < 0)
            return rc;
        sum += mean;
    }
    *out = (float)(sum / (double)batches);
    return 0;
}

/* Saves a checkpoint of the gathered state (every rank gathers, rank 0 writes). */
static int save(zt_zero *z, void *zc, zt_gpt2 *model, zt_optimizer *full, const zt_train_config *cfg,
                zt_ckpt_state *st, zt_dataloader *dl, zt_comm *comm, zt_state_client_t *client, const char *run_id,
                zt_train_result *res, zt_err *err)
{
    int rc;
#ifdef ZT_WITH_ZERO_CUDA
    /* the GPU runtime gathers the masters and moments; the step counters are kept in full */
    if (zc)
        rc = zt_zero_cuda_export_state(zc, full, err);
    else
#endif
        rc = zt_zero_export_state(z, full, err);
    (void)zc;
    if (rc < 0)
        return rc;
    /* With state servers, every server first writes a snapshot of this step (the moments live there), so
     * that a checkpoint of step N always has the servers' snapshots of step N beside it. */
    if (zt_comm_rank(comm) == 0 && client)
        rc = zt_state_client_save_snapshot(client, run_id, NULL, err);
    if ((rc = agree(comm, rc, err)) < 0)
        return rc;
    if (zt_comm_rank(comm) == 0) {
        zt_dataloader_get_position(dl, &st->data);
        st->adam_step = full->adam_step;
        st->skipped_steps = full->skipped_steps;
        rc = zt_checkpoint_save(cfg->out_dir, model, full, cfg, st, res->checkpoint, sizeof res->checkpoint, err);
        if (rc == 0)
            zt_log(ZT_LOG_INFO, "checkpoint: %s", res->checkpoint);
    }
    return agree(comm, rc, err);
}

/* The error of a step that a state server refused because it holds an older step (it restarted from its
 * last snapshot): the run continues with --resume from the checkpoint written at that step. */
static int stale_servers(const zt_train_config *cfg, const char *run_id, int64_t server_step, int64_t step,
                         zt_err *err)
{
    return zt_fail(err, ZT_ESTATE, "a state server of run '%s' holds step %lld while this run is at step %lld (it "
                   "restarted from its last snapshot); the steps after %lld are lost: continue with "
                   "`ztrain train --resume %s/ckpt_%06lld` and the same flags", run_id, (long long)server_step,
                   (long long)step - 1, (long long)server_step, cfg->out_dir, (long long)server_step);
}

/* Rank 0's part of the setup: the run directory, its config files and metrics.jsonl, as zt_trainer_run
 * writes them. */
static int setup_run_dir(const zt_train_config *cfg, const zt_ckpt_state *st, bool resumed, zt_metrics *mt,
                         zt_train_result *res, zt_err *err)
{
    char path[ZT_TRAIN_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/latest", cfg->out_dir);
    struct stat sb;
    if (!resumed && stat(path, &sb) == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "'%s' already holds a run with checkpoints; continue it with "
                       "--resume %s, or start a new one with another --out directory (or delete this one)",
                       cfg->out_dir, cfg->out_dir);
    int rc = zt_check_writable_dir(cfg->out_dir, err);
    if (rc < 0)
        return rc;
    snprintf(path, sizeof path, "%s/config.json", cfg->out_dir);
    if ((rc = zt_train_config_save(cfg, path, "model_config.json", err)) < 0)
        return rc;
    snprintf(path, sizeof path, "%s/model_config.json", cfg->out_dir);
    if ((rc = zt_gpt2_config_save(&cfg->model, path, err)) < 0)
        return rc;
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out_dir);
    if (!resumed)
        return zt_metrics_create(mt, path, err);
    double first_val = NAN;
    rc = zt_metrics_resume(mt, path, st->step, &first_val, err);
    res->first_val_loss = (float)first_val;
    return rc;
}

/* One training run on an established communicator: from the start or cfg->resume to cfg->steps. When a
 * step fails because a state server holds an older step (the same on every rank, agreed in zero.c),
 * res->rewind_to receives that step. */
static int train_once(const zt_train_config *cfg, const zt_zero_options *zo_in, const zt_launch_env *penv,
                      zt_comm *comm, zt_train_result *res, zt_err *err)
{
    memset(res, 0, sizeof *res);
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    res->rewind_to = -1;
    const zt_launch_env env = *penv;
    const bool on_servers = strcmp(cfg->optimizer, "server") == 0;
    const int W = env.world_size, B = (int)cfg->batch_size, T = (int)cfg->seq_len, accum = (int)cfg->grad_accum;
    const bool is0 = env.rank == 0;
    const int b = B / W;
    int rc = 0;
    zt_gpt2 *model = NULL;
    zt_zero *z = NULL;
    void *zc = NULL; /* --device cuda: the zt_zero_cuda runtime (void * so that CPU builds need no CUDA) */
    const bool on_gpu = strcmp(cfg->device, "cuda") == 0;
    bool use_scaler = false; /* fp16 on the GPU: dynamic loss scaling, as the single-process trainer does */
    zt_loss_scaler scaler;
    memset(&scaler, 0, sizeof scaler);
    (void)use_scaler; /* CPU-only builds */
    zt_dataloader *dl = NULL, *val = NULL;
    zt_metrics mt = {0};
    zt_optimizer full;
    memset(&full, 0, sizeof full);
    int32_t *tok = NULL, *tgt = NULL;
    zt_state_client_t *client = NULL; /* --optimizer server */
    char *token = NULL;
    char run_id[ZT_SERVER_RUN_ID_MAX];
    zt_placement_run_id(cfg->out_dir, run_id, sizeof run_id);
    if (is0)
        zt_train_config_log(cfg);
    /* On the GPU the host model keeps the layout, the parameters and the files; it never runs, so its
     * activations are sized for one token. */
    if ((rc = zt_gpt2_create(&model, &cfg->model, on_gpu ? 1 : b, on_gpu ? 1 : T, (uint64_t)cfg->seed, err)) < 0)
        goto out;
    if ((rc = zt_optimizer_init(&full, zt_gpt2_num_params(model), cfg->beta1, cfg->beta2, cfg->eps,
                                cfg->weight_decay, cfg->grad_clip, err)) < 0)
        goto out;
    if ((rc = zt_dataloader_open(&dl, cfg->train_data, B, T, cfg->shuffle, (uint64_t)cfg->seed, err)) < 0)
        goto out;
    int64_t eval_batches = cfg->eval_batches;
    if (cfg->val_data[0]) {
        if ((rc = zt_dataloader_open(&val, cfg->val_data, B, T, false, (uint64_t)cfg->seed, err)) < 0)
            goto out;
        uint64_t available = zt_dataloader_batches_per_epoch(val);
        if ((uint64_t)eval_batches > available)
            eval_batches = (int64_t)available;
    }
    zt_ckpt_state st;
    memset(&st, 0, sizeof st);
    zt_rng_seed(&st.rng, (uint64_t)cfg->seed);
    zt_schedule sched = {.lr = cfg->lr, .min_lr = cfg->min_lr, .warmup_steps = cfg->warmup_steps,
                         .total_steps = cfg->steps, .gamma = cfg->lr_gamma};
    zt_schedule_parse(cfg->schedule, &sched.kind, NULL); /* validated above */
    bool resumed = false;
    if (cfg->resume[0]) {
        char dir[ZT_TRAIN_PATH_MAX + 64];
        if ((rc = zt_checkpoint_find(cfg->resume, dir, sizeof dir, err)) < 0 ||
            (rc = zt_trainer_check_resume_placement(dir, cfg, err)) < 0 ||
            (rc = zt_checkpoint_load(dir, model, &full, &st, err)) < 0 ||
            (rc = zt_dataloader_set_position(dl, &st.data, err)) < 0)
            goto out;
        if (st.step >= cfg->steps) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint %s is at step %lld and the run is configured for %lld "
                         "steps: nothing to do; raise --steps to train further", dir, (long long)st.step,
                         (long long)cfg->steps);
            goto out;
        }
        resumed = true;
        if (is0)
            zt_log(ZT_LOG_INFO, "resume: %s at step %lld", dir, (long long)st.step);
    } else if (cfg->init_from[0] && (rc = zt_gpt2_import(model, cfg->init_from, err)) < 0) {
        goto out;
    }
    st.schedule = sched;
    /* every rank has read its inputs; rank 0 prepares the run directory; all go on only if all succeeded */
    rc = is0 ? setup_run_dir(cfg, &st, resumed, &mt, res, err) : 0;
    if ((rc = agree(comm, rc, err)) < 0)
        goto out;

    zt_zero_options zo = *zo_in;
    zo.grad_accum = accum;
    zo.beta1 = cfg->beta1;
    zo.beta2 = cfg->beta2;
    zo.eps = cfg->eps;
    zo.weight_decay = cfg->weight_decay;
    zo.grad_clip = cfg->grad_clip;
    if (on_gpu) {
#ifdef ZT_WITH_ZERO_CUDA
        enum zt_dtype dt;
        zt_zero_cuda *g = NULL;
        rc = zt_trainer_pick_dtype(cfg, env.local_rank, &dt, err);
        if (rc == 0)
            rc = zt_zero_cuda_create(&g, model, comm, &zo, b, T, dt, err);
        if ((rc = agree(comm, rc, err)) < 0) {
            zt_zero_cuda_destroy(g);
            goto out;
        }
        zc = g;
        if (resumed)
            zt_zero_cuda_import_state(g, &full);
        if (dt == ZT_DTYPE_F16) {
            use_scaler = true;
            full.loss_scaled = true;
            zt_loss_scaler_init(&scaler, cfg->loss_scale, cfg->min_loss_scale, cfg->loss_scale_window);
            if (resumed && st.loss_scale > 0) {
                scaler.scale = st.loss_scale;
                scaler.clean_steps = st.loss_scale_clean_steps;
            }
            if (is0)
                zt_log(ZT_LOG_INFO, "fp16: dynamic loss scale %g (x2 after %lld clean steps, /2 on overflow, min %g)",
                       scaler.scale, (long long)scaler.window, scaler.min_scale);
        }
        if (is0)
            zt_zero_cuda_log_plan(g);
#endif
    } else {
        if ((rc = zt_zero_create(&z, model, comm, &zo, err)) < 0)
            goto out;
        if (resumed)
            zt_zero_import_state(z, &full);
    }
    if (on_servers) {
        /* The servers hold the masters and moments from here on: register, then push the initial weights
         * (new run) or pull those of the checkpoint's step (resume). */
        rc = zt_placement_client_create(cfg, &client, &token, err);
        if (rc == 0)
            rc = zt_zero_attach_server(z, client, run_id, st.step, NULL, err);
        if ((rc = agree(comm, rc, err)) < 0)
            goto out;
        if (is0)
            zt_log(ZT_LOG_INFO, "optimizer: AdamW on the state servers %s, run '%s' at step %lld", cfg->servers,
                   run_id, (long long)st.step);
        if (is0)
            zt__placement_test_watch_pushes(client);
    }
    if (is0 && z)
        zt_zero_log_plan(z, b, T);

    tok = zt_xmalloc((size_t)B * (size_t)T * sizeof *tok);
    tgt = zt_xmalloc((size_t)B * (size_t)T * sizeof *tgt);
    res->start_step = st.step;
    res->end_step = st.step;
    res->skipped_steps = st.skipped_steps;
    res->losses = zt_xcalloc((size_t)(cfg->steps - st.step) + 1, sizeof(float));

    if (val && !resumed) {
        float vl;
        if ((rc = evaluate(z, zc, val, eval_batches, env.rank, b, T, tok, tgt, &vl, err)) < 0)
            goto out;
        res->first_val_loss = res->last_val_loss = vl;
        if (is0) {
            zt_log(ZT_LOG_INFO, "eval: step 0 | val loss %.4f", (double)vl);
            rc = zt_metrics_write_eval(&mt, 0, vl, err);
        }
        if ((rc = agree(comm, rc, err)) < 0)
            goto out;
    }

    const double start = now_seconds();
    const double elapsed_before = st.elapsed_s;
    const double step_tokens = (double)B * (double)T * (double)accum;
    double train_time = 0.0, window_time = 0.0, window_tokens = 0.0;
    int64_t steps_run = 0;
    const size_t off = (size_t)env.rank * (size_t)b * (size_t)T;
    for (int64_t step = st.step + 1; step <= cfg->steps; step++) {
        const double t0 = now_seconds();
        float sum = 0, loss;
        float mean;
        zt_optimizer_report rep;
        double lr = zt_schedule_lr(&sched, step);
        if (zc) {
#ifdef ZT_WITH_ZERO_CUDA
            /* the GPU runtime: micro-batches queued, one wait at the end of the step */
            const float scale = use_scaler ? (float)scaler.scale : 1.0f;
            for (int a = 0; a < accum; a++) {
                zt_dataloader_next(dl, tok, tgt);
                zt_zero_cuda_forward_backward(zc, tok + off, tgt + off, b, T, a, 1.0f / (float)(accum * W), scale,
                                              a == accum - 1);
            }
            double norm = 0.0;
            bool nonfinite = false;
            if ((rc = zt_zero_cuda_step(zc, accum, (float)lr, full.adam_step + 1, &mean, &norm, &nonfinite,
                                        err)) < 0 ||
                (rc = zt_optimizer_account(&full, mean, norm, nonfinite, &rep, err)) < 0)
                goto out;
            if (use_scaler) {
                zt_loss_scaler_after_step(&scaler, &rep, mean, is0);
                st.loss_scale = scaler.scale;
                st.loss_scale_clean_steps = scaler.clean_steps;
            }
            if (is0 && step == res->start_step + 1) {
                char pl[32], me[32];
                zt_format_size(zt_zero_cuda_plan_bytes(zc), pl, sizeof pl);
                zt_format_size(zt_zero_cuda_measured_bytes(zc), me, sizeof me);
                zt_log(ZT_LOG_INFO, "zero: device memory in use after the first step %s (plan %s; the rest is "
                       "NCCL's, cuBLAS's and the CUDA context's)", me, pl);
            }
#endif
        } else {
            for (int a = 0; a < accum; a++) {
                zt_dataloader_next(dl, tok, tgt);
                if ((rc = zt_zero_forward_backward(z, tok + off, tgt + off, b, T, 1.0f / (float)(accum * W),
                                                   a == accum - 1, &loss, err)) < 0)
                    goto out;
                sum += loss;
            }
            if ((rc = zt_zero_mean(z, sum / (float)accum, &mean, err)) < 0)
                goto out;
        }
        if (z && (rc = zt_zero_step(z, mean, (float)lr, &rep, err)) < 0) {
            if (zt_zero_server_step(z) >= 0) {
                res->rewind_to = zt_zero_server_step(z);
                rc = stale_servers(cfg, run_id, zt_zero_server_step(z), step, err);
            }
            goto out;
        }
        const double dt = now_seconds() - t0;
        steps_run++;
        train_time += dt;
        window_time += dt;
        window_tokens += step_tokens;
        st.step = step;
        res->losses[step - res->start_step - 1] = mean;
        res->end_step = step;
        const double elapsed = elapsed_before + (now_seconds() - start);
        const bool last = step == cfg->steps;
        int mrc = 0; /* rank 0's metrics.jsonl writes */
        zt_err merr = {{0}};
        if (is0) {
            if (step == res->start_step + 1 && z)
                zt_log(ZT_LOG_INFO, "zero: measured window peak %zu bytes (plan %zu)", zt_zero_peak_window_bytes(z),
                       zt_zero_plan_window_bytes(z));
            if (rep.skipped)
                zt_log(ZT_LOG_WARN, "step %lld skipped: loss %g, grad norm %g is not finite", (long long)step,
                       (double)mean, rep.grad_norm);
            zt_metrics_train line = {.step = step, .loss = mean, .lr = lr, .grad_norm = rep.grad_norm,
                                     .tokens_per_s = dt > 0 ? step_tokens / dt : 0.0, .elapsed_s = elapsed,
                                     .skipped = rep.skipped};
            mrc = zt_metrics_write_train(&mt, &line, &merr);
            if (step % cfg->log_every == 0 || step == res->start_step + 1 || last) {
                double per_step = (now_seconds() - start) / (double)steps_run;
                log_progress(step, cfg->steps, mean, lr, rep.grad_norm,
                             window_time > 0 ? window_tokens / window_time : 0, elapsed,
                             per_step * (double)(cfg->steps - step));
                window_time = 0.0;
                window_tokens = 0.0;
            }
        }
        if (val && ((cfg->eval_every > 0 && step % cfg->eval_every == 0) || last)) {
            float vl;
            if ((rc = evaluate(z, zc, val, eval_batches, env.rank, b, T, tok, tgt, &vl, err)) < 0)
                goto out;
            res->last_val_loss = vl;
            if (isnan(res->first_val_loss))
                res->first_val_loss = vl;
            if (is0) {
                zt_log(ZT_LOG_INFO, "eval: step %lld | val loss %.4f", (long long)step, (double)vl);
                if (mrc == 0)
                    mrc = zt_metrics_write_eval(&mt, step, vl, &merr);
            }
        }
        /* A stop request on any rank (or a metrics failure on rank 0) stops every rank after this step. */
        float flag = mrc < 0 ? 2.0f : zt_trainer_take_stop_request() ? 1.0f : 0.0f, any = 0.0f;
        zt_err e;
        if (zt_comm_all_reduce(comm, &flag, &any, 1, ZT_COMM_F32, ZT_COMM_MAX, NULL, &e) < 0) {
            rc = zt_fail(err, ZT_ESTATE, "%s", e.msg);
            goto out;
        }
        if (any >= 2.0f) {
            rc = mrc < 0 ? zt_fail(err, mrc, "%s", merr.msg)
                         : zt_fail(err, ZT_ESTATE, "rank 0 could not write metrics.jsonl (its log says why); "
                                   "stopping with it");
            goto out;
        }
        const bool stop = any > 0 || (cfg->stop_at_step > 0 && step >= cfg->stop_at_step);
        if ((cfg->save_every > 0 && step % cfg->save_every == 0) || last || stop) {
            st.elapsed_s = elapsed_before + (now_seconds() - start);
            if ((rc = save(z, zc, model, &full, cfg, &st, dl, comm, client, run_id, res, err)) < 0)
                goto out;
            res->skipped_steps = full.skipped_steps;
        }
        if (is0 && client) {
            char where[48];
            snprintf(where, sizeof where, "step:%lld", (long long)step);
            zt__placement_test_pause(where);
        }
        if (stop && !last) {
            res->interrupted = true;
            if (is0)
                zt_log(ZT_LOG_WARN, "stopped after step %lld/%lld; resume with: ztrain train --resume %s",
                       (long long)step, (long long)cfg->steps, cfg->out_dir);
            break;
        }
    }
    res->seconds = now_seconds() - start;
    res->tokens_per_s = train_time > 0 ? step_tokens * (double)steps_run / train_time : 0.0;
    if (is0 && !res->interrupted) {
        char took[32];
        zt_format_duration(res->seconds, took, sizeof took);
        if (val)
            zt_log(ZT_LOG_INFO, "done: %lld steps in %s, %.0f tok/s; val loss %.4f -> %.4f; checkpoint %s",
                   (long long)steps_run, took, res->tokens_per_s, (double)res->first_val_loss,
                   (double)res->last_val_loss, res->checkpoint);
        else
            zt_log(ZT_LOG_INFO, "done: %lld steps in %s, %.0f tok/s; train loss %.4f -> %.4f; checkpoint %s",
                   (long long)steps_run, took, res->tokens_per_s, steps_run ? (double)res->losses[0] : NAN,
                   steps_run ? (double)res->losses[steps_run - 1] : NAN, res->checkpoint);
    }
    rc = 0;
out:
    free(tok);
    free(tgt);
    zt_metrics_close(&mt);
    zt_zero_destroy(z);
#ifdef ZT_WITH_ZERO_CUDA
    zt_zero_cuda_destroy(zc);
#endif
    zt_dataloader_close(val);
    zt_dataloader_close(dl);
    zt_optimizer_free(&full);
    zt_gpt2_destroy(model);
    zt_state_client_destroy(client);
    free(token);
    return rc;
}

/* Trains with the ranks of the launch environment, rewinding to an older checkpoint when state servers
 * restarted from older snapshots; see zero_train.h. */
int zt_zero_train_run(const zt_train_config *cfg, const zt_zero_options *zo_in, zt_train_result *res, zt_err *err)
{
    memset(res, 0, sizeof *res);
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    res->rewind_to = -1;
    zt_launch_env env;
    int rc = zt_launch_env_parse(NULL, &env, err);
    if (rc < 0)
        return rc;
    zt_log_set_rank(env.rank);
    if ((rc = zt_train_config_validate(cfg, err)) < 0)
        return rc;
    const bool on_servers = strcmp(cfg->optimizer, "server") == 0;
    /* Embedded state servers live inside one process; ranks are separate processes, so several ranks need
     * ztrain-server processes (one core reachable by all of them, with snapshots for restarts). */
    if (on_servers && cfg->servers[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "--optimizer server with WORLD_SIZE=%d needs state servers the ranks "
                       "can reach: start `ztrain-server --listen 127.0.0.1:7070 --snapshot-dir DIR` and pass "
                       "--servers 127.0.0.1:7070 (the embedded server lives inside one process: use it with one "
                       "rank, WORLD_SIZE=1)", env.world_size);
    const bool on_gpu = strcmp(cfg->device, "cuda") == 0;
#ifndef ZT_WITH_ZERO_CUDA
    if (on_gpu)
        return zt_fail(err, ZT_EUNSUPPORTED, "--device cuda with the ZeRO runtime (WORLD_SIZE=%d): this ztrain was "
                       "built without CUDA and NCCL (rebuild with -DZT_CUDA=ON where the CUDA toolkit and NCCL are "
                       "installed, or train with --device cpu)", env.world_size);
#endif
    if (on_gpu && strcmp(cfg->optimizer, "gpu") != 0)
        return zt_fail(err, ZT_EUNSUPPORTED, "--optimizer %s with --device cuda and the ZeRO runtime (WORLD_SIZE=%d): "
                       "the GPU runtime keeps its optimizer shards on the GPUs; use --optimizer gpu, or one process "
                       "without ZT_ZERO_LEVEL for the other placements", cfg->optimizer, env.world_size);
    /* Each rank holds only its shard of the gradients; gathering them for a dump is not implemented (not
     * even at one rank, where ZT_ZERO_LEVEL chose this runtime). */
    if (cfg->save_grads)
        return zt_fail(err, ZT_EUNSUPPORTED, "save_grads (--save-grads) with the ZeRO runtime (WORLD_SIZE=%d): "
                       "gradient dumps are written by the single-process trainer only; drop it, or train with one "
                       "rank (WORLD_SIZE=1) and without ZT_ZERO_LEVEL to inspect gradients", env.world_size);
    const int W = env.world_size, B = (int)cfg->batch_size;
    if (B % W != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "batch_size %d does not split over WORLD_SIZE=%d ranks: use a batch size that is a multiple "
                       "of %d (--batch-size)",
                       B, W, W);
    /* threads = 0: share the cores between the ranks of this host, since every rank would otherwise start
     * one thread per core and they would fight over them (the collectives wait for the slowest rank). */
    int threads = (int)cfg->threads;
    if (threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cores / (env.local_world_size > 0 ? env.local_world_size : 1));
        if (threads < 1)
            threads = 1;
    }
    zt_cpu_set_threads(threads);

    /* The ZeRO options in effect (environment overrides included) join the config's hash. */
    const int64_t zero_in_effect[] = {zo_in->level, zo_in->checkpoint, zo_in->checkpoint_every, zo_in->prefetch};
    const uint64_t hash = fnv1a(zt_zero_train_config_hash(cfg), zero_in_effect, sizeof zero_in_effect);
    zt_comm *comm = NULL;
    /* GPUs: NCCL on device LOCAL_RANK; the CPU: the shared-memory backend */
    if ((rc = zt_startup_comm(&env, on_gpu ? ZT_COMM_NCCL : ZT_COMM_SHM, hash, on_gpu ? env.local_rank : 0, &comm,
                              err)) < 0)
        return rc;

    /* A state server back at an older step s fails the step on every rank alike (zero.c agrees on s): the
     * run goes on from the checkpoint of step s (the servers snapshot at every checkpoint), at most
     * ZT_TRAIN_MAX_REWINDS times. The ranks agree on going on with one all-reduce, since one of them may
     * not find the checkpoint. */
    zt_train_config *again = zt_xmalloc(sizeof *again);
    *again = *cfg;
    for (int rewinds = 0;; rewinds++) {
        rc = train_once(again, zo_in, &env, comm, res, err);
        if (rc != ZT_ESTATE || res->rewind_to < 0)
            break;
        char ckpt[sizeof again->resume];
        const int64_t to = res->rewind_to;
        rc = zt_trainer_rewind_target(again, res, rewinds, ckpt, sizeof ckpt, err);
        if ((rc = agree(comm, rc, err)) < 0)
            break;
        if (env.rank == 0)
            zt_trainer_log_rewind(again, to, rewinds, ckpt);
        snprintf(again->resume, sizeof again->resume, "%s", ckpt);
        zt_train_result_free(res);
    }
    free(again);
    zt_comm_destroy(comm);
    return rc;
}

/* Whether to run the multi-rank loop; see zero_train.h. */
bool zt_zero_train_wanted(void)
{
    zt_launch_env env;
    return zt_launch_env_parse(NULL, &env, NULL) < 0 || env.world_size > 1 || getenv("ZT_ZERO_LEVEL") != NULL;
}

/* zt_zero_train_run with the ZeRO options of the environment; see zero_train.h. */
int zt_zero_train_main(const zt_train_config *cfg, zt_train_result *res, zt_err *err)
{
    memset(res, 0, sizeof *res);
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    zt_zero_options zo;
    zt_zero_options_init(&zo);
    /* The config's keys (zero_level, checkpointing, prefetch; validated), then the environment variables,
     * which override them when set. */
    zo.level = (int)cfg->zero_level;
    zo.prefetch = (int)cfg->prefetch;
    zt_err cerr;
    if (zt_zero_parse_checkpoint(cfg->checkpointing, &zo.checkpoint, &zo.checkpoint_every, &cerr) < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "\"checkpointing\" (--checkpointing): %s", cerr.msg);
    const char *v = getenv("ZT_ZERO_LEVEL");
    if (v) {
        if (strcmp(v, "2") != 0 && strcmp(v, "3") != 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "ZT_ZERO_LEVEL='%s': use 2 (keep a block's parameters gathered "
                           "until its backward) or 3 (gather again in backward)", v);
        zo.level = v[0] - '0';
    }
    v = getenv("ZT_CHECKPOINTING");
    if (v) {
        zt_err e;
        if (zt_zero_parse_checkpoint(v, &zo.checkpoint, &zo.checkpoint_every, &e) < 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "ZT_CHECKPOINTING: %s", e.msg);
    }
    v = getenv("ZT_PREFETCH");
    if (v) {
        char *end = NULL;
        long k = strtol(v, &end, 10);
        if (!*v || *end || k < 0 || k > 64)
            return zt_fail(err, ZT_EINVAL_CONFIG, "ZT_PREFETCH='%s': give the number of blocks to gather ahead, "
                           "0..64", v);
        zo.prefetch = (int)k;
    }
    return zt_zero_train_run(cfg, &zo, res, err);
}
