/* The multi-rank training loop around the ZeRO runtime (see zero_train.h). */
#include "worker/runtime/zero_train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "kernels/cpu_threads.h"
#include "worker/launch/env.h"
#include "worker/train/checkpoint.h"
#include "worker/train/schedule.h"

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
    h = fnv1a(h, &cfg->model, sizeof cfg->model);
    const int64_t ints[] = {cfg->steps, cfg->batch_size, cfg->seq_len, cfg->grad_accum, cfg->warmup_steps,
                            cfg->save_every, cfg->seed, cfg->shuffle};
    const double reals[] = {cfg->lr, cfg->min_lr, cfg->lr_gamma, cfg->weight_decay, cfg->beta1,
                            cfg->beta2, cfg->eps, cfg->grad_clip};
    h = fnv1a(h, ints, sizeof ints);
    h = fnv1a(h, reals, sizeof reals);
    return fnv1a(h, cfg->schedule, strlen(cfg->schedule));
}

static double env_seconds(const char *name, double def)
{
    const char *v = getenv(name);
    char *end = NULL;
    double d = v ? strtod(v, &end) : def;
    return v && (!*v || *end || !(d > 0)) ? def : d;
}

/* Saves a checkpoint of the gathered state (every rank gathers, rank 0 writes). */
static int save(zt_zero *z, zt_gpt2 *model, zt_optimizer *full, const zt_train_config *cfg, zt_ckpt_state *st,
                zt_dataloader *dl, zt_comm *comm, zt_train_result *res, zt_err *err)
{
    int rc = zt_zero_export_state(z, full, err);
    if (rc == 0 && zt_comm_rank(comm) == 0) {
        zt_dataloader_get_position(dl, &st->data);
        st->adam_step = full->adam_step;
        st->skipped_steps = full->skipped_steps;
        if (mkdir(cfg->out_dir, 0755) != 0 && errno != EEXIST)
            rc = zt_fail(err, -errno, "cannot create run directory %s: %s", cfg->out_dir, strerror(errno));
        if (rc == 0)
            rc = zt_checkpoint_save(cfg->out_dir, model, full, cfg, st, res->checkpoint, sizeof res->checkpoint, err);
        if (rc == 0)
            zt_log(ZT_LOG_INFO, "checkpoint: %s", res->checkpoint);
    }
    /* rank 0's failure reaches the others as its exit; a barrier keeps the ranks in step otherwise */
    if (rc == 0)
        rc = zt_comm_barrier(comm, NULL, err);
    return rc;
}

/* The training loop; see zero_train.h. */
int zt_zero_train_run(const zt_train_config *cfg, const zt_zero_options *zo_in, zt_train_result *res, zt_err *err)
{
    memset(res, 0, sizeof *res);
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    zt_launch_env env;
    int rc = zt_launch_env_parse(NULL, &env, err);
    if (rc < 0)
        return rc;
    zt_log_set_rank(env.rank);
    if ((rc = zt_train_config_validate(cfg, err)) < 0)
        return rc;
    const int W = env.world_size, B = (int)cfg->batch_size, T = (int)cfg->seq_len, accum = (int)cfg->grad_accum;
    if (B % W != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "batch_size %d does not split over WORLD_SIZE=%d ranks: use a batch size that is a multiple "
                       "of %d (--batch-size)",
                       B, W, W);
    const int b = B / W;
    zt_cpu_set_threads((int)cfg->threads);

    zt_comm_options co;
    zt_comm_options_init(&co);
    co.rank = env.rank;
    co.world_size = W;
    snprintf(co.name, sizeof co.name, "p%d", env.master_port);
    co.config_hash = zt_zero_train_config_hash(cfg);
    co.join_timeout_s = env_seconds("ZT_RDZV_TIMEOUT_S", 60);
    co.timeout_s = env_seconds("ZT_COMM_TIMEOUT_S", 300);

    zt_comm *comm = NULL;
    zt_gpt2 *model = NULL;
    zt_zero *z = NULL;
    zt_dataloader *dl = NULL;
    zt_optimizer full;
    memset(&full, 0, sizeof full);
    int32_t *tok = NULL, *tgt = NULL;
    if ((rc = zt_comm_create(&comm, &co, err)) < 0)
        goto out;
    if (env.rank == 0)
        zt_train_config_log(cfg);
    if ((rc = zt_gpt2_create(&model, &cfg->model, b, T, (uint64_t)cfg->seed, err)) < 0)
        goto out;
    if ((rc = zt_optimizer_init(&full, zt_gpt2_num_params(model), cfg->beta1, cfg->beta2, cfg->eps,
                                cfg->weight_decay, cfg->grad_clip, err)) < 0)
        goto out;
    if ((rc = zt_dataloader_open(&dl, cfg->train_data, B, T, cfg->shuffle, (uint64_t)cfg->seed, err)) < 0)
        goto out;
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
            (rc = zt_checkpoint_load(dir, model, &full, &st, err)) < 0 ||
            (rc = zt_dataloader_set_position(dl, &st.data, err)) < 0)
            goto out;
        resumed = true;
        zt_log(ZT_LOG_INFO, "resume: %s at step %lld", dir, (long long)st.step);
    } else if (cfg->init_from[0] && (rc = zt_gpt2_import(model, cfg->init_from, err)) < 0) {
        goto out;
    }
    st.schedule = sched;

    zt_zero_options zo = *zo_in;
    zo.grad_accum = accum;
    zo.beta1 = cfg->beta1;
    zo.beta2 = cfg->beta2;
    zo.eps = cfg->eps;
    zo.weight_decay = cfg->weight_decay;
    zo.grad_clip = cfg->grad_clip;
    if ((rc = zt_zero_create(&z, model, comm, &zo, err)) < 0)
        goto out;
    if (resumed)
        zt_zero_import_state(z, &full);
    if (env.rank == 0)
        zt_zero_log_plan(z, b, T);

    tok = zt_xmalloc((size_t)B * (size_t)T * sizeof *tok);
    tgt = zt_xmalloc((size_t)B * (size_t)T * sizeof *tgt);
    res->start_step = st.step;
    res->losses = zt_xcalloc((size_t)(cfg->steps - st.step) + 1, sizeof(float));
    const int64_t stop = cfg->stop_at_step > 0 && cfg->stop_at_step < cfg->steps ? cfg->stop_at_step : cfg->steps;
    for (int64_t step = st.step + 1; step <= stop; step++) {
        float sum = 0, loss;
        for (int a = 0; a < accum; a++) {
            zt_dataloader_next(dl, tok, tgt);
            size_t off = (size_t)env.rank * (size_t)b * (size_t)T;
            if ((rc = zt_zero_forward_backward(z, tok + off, tgt + off, b, T, 1.0f / (float)(accum * W),
                                               a == accum - 1, &loss, err)) < 0)
                goto out;
            sum += loss;
        }
        float mean;
        zt_optimizer_report rep;
        double lr = zt_schedule_lr(&sched, step);
        if ((rc = zt_zero_mean(z, sum / (float)accum, &mean, err)) < 0 ||
            (rc = zt_zero_step(z, mean, (float)lr, &rep, err)) < 0)
            goto out;
        st.step = step;
        res->losses[step - res->start_step - 1] = mean;
        res->end_step = step;
        if (step == res->start_step + 1 && env.rank == 0)
            zt_log(ZT_LOG_INFO, "zero: measured window peak %zu bytes (plan %zu)", zt_zero_peak_window_bytes(z),
                   zt_zero_plan_window_bytes(z));
        if (env.rank == 0 && (step % cfg->log_every == 0 || step == stop))
            zt_log(ZT_LOG_INFO, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f%s", (long long)step,
                   (long long)cfg->steps, mean, lr, rep.grad_norm, rep.skipped ? " | skipped" : "");
        if ((cfg->save_every > 0 && step % cfg->save_every == 0) || step == stop)
            if ((rc = save(z, model, &full, cfg, &st, dl, comm, res, err)) < 0)
                goto out;
    }
    res->interrupted = stop < cfg->steps;
out:
    free(tok);
    free(tgt);
    zt_zero_destroy(z);
    zt_dataloader_close(dl);
    zt_optimizer_free(&full);
    zt_gpt2_destroy(model);
    zt_comm_destroy(comm);
    return rc;
}
