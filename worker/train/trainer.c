/* The training loop: setup (model, data, resume), steps, evaluation, metrics, checkpoints (see trainer.h). */
#include "worker/train/trainer.h"

#include <errno.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/units.h"
#include "kernels/cpu_threads.h"
#include "worker/train/checkpoint.h"
#include "worker/train/metrics.h"
#include "worker/train/optimizer.h"
#include "worker/train/placement.h"
#include "worker/train/schedule.h"
#ifdef ZT_WITH_CUDA
#include "kernels/cuda/cuda_common.h" /* zt_cuda_pick_dtype */
#include "worker/models/gpt2_cuda.h"   /* the model's device twin for --device cuda */
#endif

#define PATH_CAP (ZT_TRAIN_PATH_MAX + 64)

static volatile sig_atomic_t stop_requested;

/* Asks the running loop to stop after its current step; async-signal-safe. */
void zt_trainer_request_stop(void)
{
    stop_requested = 1;
}

/* Returns and clears the stop request; see trainer.h. */
bool zt_trainer_take_stop_request(void)
{
    bool was = stop_requested != 0;
    stop_requested = 0;
    return was;
}

/* Frees the losses of a result; see trainer.h. */
void zt_train_result_free(zt_train_result *res)
{
    if (!res)
        return;
    free(res->losses);
    res->losses = NULL;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool file_exists(const char *dir, const char *name)
{
    char path[PATH_CAP];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* Zeroes the gradients and accumulates grad_accum micro-batches; see trainer.h. */
float zt_trainer_accumulate(zt_gpt2 *model, zt_dataloader *dl, int grad_accum, int B, int T, int32_t *inputs,
                            int32_t *targets)
{
    zt_gpt2_zero_grad(model);
    float scale = 1.0f / (float)grad_accum;
    double sum = 0.0;
    for (int i = 0; i < grad_accum; i++) {
        zt_dataloader_next(dl, inputs, targets);
        sum += zt_gpt2_forward(model, inputs, targets, B, T);
        zt_gpt2_backward(model, scale);
    }
    return (float)(sum / grad_accum);
}

/* Mean loss over `batches` batches from the start of the validation data (the loader does not shuffle). */
static float evaluate(zt_gpt2 *model, zt_dataloader *val, int64_t batches, int B, int T, int32_t *inputs,
                      int32_t *targets)
{
    zt_dataloader_reset(val);
    double sum = 0.0;
    for (int64_t i = 0; i < batches; i++) {
        zt_dataloader_next(val, inputs, targets);
        sum += zt_gpt2_forward(model, inputs, targets, B, T);
    }
    return (float)(sum / (double)batches);
}

/* The largest token id of one shard file, or -1 if it cannot be read (the loader reported that already). */
static int shard_max_token(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    int32_t header[ZT_SHARD_HEADER_INTS];
    if (fread(header, sizeof(int32_t), ZT_SHARD_HEADER_INTS, f) != ZT_SHARD_HEADER_INTS) {
        fclose(f);
        return -1;
    }
    uint16_t buf[1 << 15];
    int64_t left = header[2];
    int max = -1;
    while (left > 0) {
        size_t want = left < (int64_t)(sizeof(buf) / sizeof(buf[0])) ? (size_t)left : sizeof(buf) / sizeof(buf[0]);
        size_t got = fread(buf, sizeof(uint16_t), want, f);
        if (got == 0)
            break;
        for (size_t i = 0; i < got; i++)
            if (buf[i] > max)
                max = buf[i];
        left -= (int64_t)got;
    }
    fclose(f);
    return max;
}

/* Refuses data with token ids the model's embedding has no row for, naming the first such file. */
/* Puts the flag that named the data in front of a loader message ("--val-data: no files match ..."),
 * since the loader does not know which flag its pattern came from. */
static void prefix_error(zt_err *err, const char *flag)
{
    if (err == NULL)
        return;
    size_t n = strlen(flag) + 2; /* "flag: " */
    if (n >= sizeof(err->msg))
        return;
    memmove(err->msg + n, err->msg, sizeof(err->msg) - n);
    err->msg[sizeof(err->msg) - 1] = '\0';
    memcpy(err->msg, flag, n - 2);
    err->msg[n - 2] = ':';
    err->msg[n - 1] = ' ';
}

static int check_vocab(const zt_dataloader *dl, const char *pattern, int vocab_size, zt_err *err)
{
    int max = zt_dataloader_max_token(dl);
    if (max < vocab_size)
        return 0;
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            int file_max = shard_max_token(g.gl_pathv[i]);
            if (file_max >= vocab_size) {
                int rc = zt_fail(err, ZT_EMISMATCH, "token id %d in '%s' does not fit vocab_size %d of the model "
                                 "(tokenize with the model's tokenizer or raise vocab_size)",
                                 file_max, g.gl_pathv[i], vocab_size);
                globfree(&g);
                return rc;
            }
        }
        globfree(&g);
    }
    return zt_fail(err, ZT_EMISMATCH, "token id %d in '%s' does not fit vocab_size %d of the model (tokenize with "
                   "the model's tokenizer or raise vocab_size)", max, pattern, vocab_size);
}

static void log_model(const zt_gpt2 *model, const zt_train_config *cfg)
{
    const zt_gpt2_config *m = zt_gpt2_get_config(model);
    size_t n = zt_gpt2_num_params(model);
    char weights[32], state[32];
    zt_format_size((uint64_t)n * sizeof(float), weights, sizeof(weights));
    zt_format_size((uint64_t)n * sizeof(float) * 4, state, sizeof(state));
    zt_log(ZT_LOG_INFO, "model: GPT-2, %d layers x %d wide, %d heads, vocab %d, %d positions: %.2fM parameters "
           "(%s fp32; %s with gradients and Adam state)",
           m->n_layer, m->n_embd, m->n_head, m->vocab_size, m->n_positions, (double)n / 1e6, weights, state);
    zt_log(ZT_LOG_INFO, "model: a step is %lld x %lld sequences of %lld tokens = %lld tokens",
           (long long)cfg->grad_accum, (long long)cfg->batch_size, (long long)cfg->seq_len,
           (long long)(cfg->grad_accum * cfg->batch_size * cfg->seq_len));
}

static void log_data(const char *what, const char *pattern, const zt_dataloader *dl, const zt_train_config *cfg)
{
    uint64_t tokens = zt_dataloader_num_tokens(dl);
    uint64_t batches = zt_dataloader_batches_per_epoch(dl);
    zt_log(ZT_LOG_INFO, "data: %s '%s': %llu tokens, %llu batches of %lld x %lld per epoch (max token id %d)",
           what, pattern, (unsigned long long)tokens, (unsigned long long)batches, (long long)cfg->batch_size,
           (long long)cfg->seq_len, zt_dataloader_max_token(dl));
}

/* The `step 120/1000 | loss ...` line. */
static void log_progress(int64_t step, int64_t steps, float loss, double lr, double norm, double tok_s,
                         double elapsed, double eta)
{
    char el[32], et[32];
    zt_format_duration(elapsed, el, sizeof(el));
    zt_format_duration(eta, et, sizeof(et));
    zt_log(ZT_LOG_INFO, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | elapsed %s | eta %s",
           (long long)step, (long long)steps, (double)loss, lr, norm, tok_s, el, et);
}

/* Everything a run holds, so that one cleanup path frees it. */
struct run {
    zt_gpt2 *model;
#ifdef ZT_WITH_CUDA
    zt_gpt2_cuda *gpu;      /* --device cuda: the device model (the host model keeps layout and files) */
    bool gpu_offload;       /* --device cuda with --optimizer cpu|server: the device holds no optimizer state */
    bool pinned;            /* the host model's parameter and gradient slabs are page-locked (cudaHostRegister) */
#endif
    bool use_scaler;        /* fp16 on the GPU: dynamic loss scaling */
    zt_loss_scaler scaler;
    zt_optimizer opt;
    zt_placement_server *state; /* --optimizer server: the state servers holding master weights and moments */
    zt_dataloader *train;
    zt_dataloader *val;
    zt_metrics metrics;
    int32_t *inputs;
    int32_t *targets;
};

static void run_free(struct run *r)
{
#ifdef ZT_WITH_CUDA
    zt_gpt2_cuda_destroy(r->gpu);
    cudaFreeHost(r->opt.lowp); /* page-locked here for --optimizer cpu with bf16/fp16 compute; NULL otherwise */
    if (r->pinned) {
        cudaHostUnregister(zt_gpt2_params(r->model));
        cudaHostUnregister(zt_gpt2_grads(r->model));
    }
#endif
    zt_placement_server_close(r->state);
    zt_gpt2_destroy(r->model);
    zt_optimizer_free(&r->opt);
    zt_dataloader_close(r->train);
    zt_dataloader_close(r->val);
    zt_metrics_close(&r->metrics);
    free(r->inputs);
    free(r->targets);
}

/* evaluate() on the device the run trains on. */
static float run_evaluate(struct run *r, int64_t batches, int B, int T)
{
#ifdef ZT_WITH_CUDA
    if (r->gpu) {
        zt_dataloader_reset(r->val);
        double sum = 0.0;
        for (int64_t i = 0; i < batches; i++) {
            zt_dataloader_next(r->val, r->inputs, r->targets);
            sum += zt_gpt2_cuda_eval_loss(r->gpu, r->inputs, r->targets, B, T);
        }
        return (float)(sum / (double)batches);
    }
#endif
    return evaluate(r->model, r->val, batches, B, T, r->inputs, r->targets);
}

#ifdef ZT_WITH_CUDA
/* Queues the grad_accum micro-batches of a step on the GPU (under the fp16 loss scale). */
static void run_micro_batches(struct run *r, const zt_train_config *cfg)
{
    const int B = (int)cfg->batch_size, T = (int)cfg->seq_len, accum = (int)cfg->grad_accum;
    const float scale = r->use_scaler ? (float)r->scaler.scale : 1.0f;
    zt_gpt2_cuda_zero_grad(r->gpu);
    for (int i = 0; i < accum; i++) {
        zt_dataloader_next(r->train, r->inputs, r->targets);
        zt_gpt2_cuda_train_micro(r->gpu, r->inputs, r->targets, B, T, i, 1.0f / (float)accum, scale);
    }
}

/* One training step on the GPU: grad_accum micro-batches, then the fused update; the host waits once,
 * for the loss and the norm. Fills *loss and *rep; returns 0 or ZT_ESTATE (diverged). */
static int gpu_step(struct run *r, const zt_train_config *cfg, float lr, float *loss, zt_optimizer_report *rep,
                    zt_err *err)
{
    const int accum = (int)cfg->grad_accum;
    run_micro_batches(r, cfg);
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = r->opt.beta1,
        .beta2 = r->opt.beta2,
        .eps = r->opt.eps,
        .weight_decay = r->opt.weight_decay,
        .grad_scale = 1.0f,
        .step = (int)(r->opt.adam_step + 1),
    };
    zt_gpt2_cuda_step_update(r->gpu, &p, r->opt.grad_clip);
    double norm = 0.0;
    bool nonfinite = false;
    zt_gpt2_cuda_step_finish(r->gpu, accum, loss, &norm, &nonfinite);
    int rc = zt_optimizer_account(&r->opt, *loss, norm, nonfinite, rep, err);
    if (r->use_scaler)
        zt_loss_scaler_after_step(&r->scaler, rep, *loss, true);
    return rc;
}
#endif

#ifdef ZT_WITH_CUDA
/* One training step with the optimizer off the GPU (--optimizer cpu or server): the micro-batches run on the
 * GPU, their fp32 gradients come down into the host model's gradient slab, AdamW runs on the host (or in
 * the state servers, which send the parameters back into the host slab), and the updated parameters go
 * up again: in the compute type when the host AdamW wrote them so (r->opt.lowp), else as fp32 that the
 * device rounds. Same contract as gpu_step. */
static int offload_step(struct run *r, const zt_train_config *cfg, int64_t step, float lr, float *loss,
                        zt_optimizer_report *rep, zt_err *err)
{
    const int accum = (int)cfg->grad_accum;
    run_micro_batches(r, cfg);
    *loss = zt_gpt2_cuda_step_loss(r->gpu, accum);
    zt_gpt2_cuda_download_grads(r->gpu, zt_gpt2_grads(r->model));
    int rc = r->state ? zt_placement_server_step(r->state, r->model, &r->opt, step, *loss, lr, rep, err)
                      : zt_optimizer_step(&r->opt, r->model, *loss, lr, rep, err);
    if (rc < 0)
        return rc;
    if (!rep->skipped)
        zt_gpt2_cuda_upload_weights(r->gpu, r->opt.lowp ? r->opt.lowp : (void *)zt_gpt2_params(r->model),
                                    r->opt.lowp ? r->opt.lowp_dtype : ZT_DTYPE_F32);
    if (r->use_scaler)
        zt_loss_scaler_after_step(&r->scaler, rep, *loss, true);
    return 0;
}
#endif

#ifdef ZT_WITH_CUDA
/* The compute type for --precision on CUDA device `device`; see trainer.h. */
int zt_trainer_pick_dtype(const zt_train_config *cfg, int device, enum zt_dtype *dt, zt_err *err)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
        cudaGetLastError();
        return zt_fail(err, ZT_EUNSUPPORTED, "--device cuda: CUDA device %d is needed but %d are visible (check the "
                       "driver and CUDA_VISIBLE_DEVICES, with several ranks LOCAL_RANK and --nproc, or train with "
                       "--device cpu)", device, n);
    }
    const enum zt_dtype best = zt_cuda_pick_dtype(device);
    *dt = best;
    if (strcmp(cfg->precision, "fp32") == 0)
        *dt = ZT_DTYPE_F32;
    else if (strcmp(cfg->precision, "bf16") == 0)
        *dt = ZT_DTYPE_BF16;
    else if (strcmp(cfg->precision, "fp16") == 0)
        *dt = ZT_DTYPE_F16;
    if (*dt == ZT_DTYPE_BF16 && best != ZT_DTYPE_BF16)
        return zt_fail(err, ZT_EUNSUPPORTED, "--precision bf16: this GPU has no bf16 matrix units (sm_80+); use "
                       "--precision fp16 (with loss scaling) or fp32");
    return 0;
}
#endif

/* Warns when the schedule of the checkpoint differs from the configured one (e.g. more steps): allowed,
 * but the learning rates then differ from an uninterrupted run. */
static void warn_schedule_change(const zt_schedule *saved, const zt_schedule *now)
{
    if (saved->kind != now->kind || saved->lr != now->lr || saved->min_lr != now->min_lr ||
        saved->warmup_steps != now->warmup_steps || saved->total_steps != now->total_steps ||
        saved->gamma != now->gamma)
        zt_log(ZT_LOG_WARN, "resume: the learning-rate schedule differs from the checkpoint's (%s to step %lld, "
               "lr %g, min_lr %g, warmup %lld); continuing with the configured one (%s to step %lld, lr %g, "
               "min_lr %g, warmup %lld)",
               zt_schedule_name(saved->kind), (long long)saved->total_steps, saved->lr, saved->min_lr,
               (long long)saved->warmup_steps, zt_schedule_name(now->kind), (long long)now->total_steps, now->lr,
               now->min_lr, (long long)now->warmup_steps);
}

/* Whether a run goes on from the checkpoint of a restarted server's step; see trainer.h. */
int zt_trainer_rewind_target(const zt_train_config *cfg, const zt_train_result *res, int rewinds_done, char *ckpt,
                             size_t cap, zt_err *err)
{
    char failed[ZT_ERR_LEN];
    snprintf(failed, sizeof(failed), "%s", err->msg);
    if (res->rewind_to < 0)
        return zt_fail(err, ZT_ESTATE, "%s", failed);
    if (rewinds_done >= ZT_TRAIN_MAX_REWINDS)
        return zt_fail(err, ZT_ESTATE, "%s (the state servers went back to an older step again after %d automatic "
                       "rewinds: check why they keep restarting)", failed, rewinds_done);
    zt_err perr;
    if (zt_checkpoint_dir(cfg->out_dir, res->rewind_to, ckpt, cap, &perr) < 0)
        return zt_fail(err, ZT_ESTATE, "%s (no automatic rewind: %s)", failed, perr.msg);
    if (!file_exists(ckpt, "manifest.json"))
        return zt_fail(err, ZT_ESTATE, "%s (no automatic rewind: checkpoint %s is missing)", failed, ckpt);
    return 0;
}

/* Logs an automatic rewind; see trainer.h. */
void zt_trainer_log_rewind(const zt_train_config *cfg, int64_t server_step, int rewinds_done, const char *ckpt)
{
    const bool one = strchr(cfg->servers, ',') == NULL;
    zt_log(ZT_LOG_WARN, "%s %s restarted at step %lld; rewinding to checkpoint %s (rewind %d of %d)",
           one ? "state server" : "a state server of", cfg->servers[0] ? cfg->servers : "(embedded)",
           (long long)server_step, ckpt, rewinds_done + 1, ZT_TRAIN_MAX_REWINDS);
}

/* Refuses to resume a checkpoint of remote state servers without them; see trainer.h. */
int zt_trainer_check_resume_placement(const char *ckpt_dir, const zt_train_config *cfg, zt_err *err)
{
    char path[PATH_CAP + 16];
    snprintf(path, sizeof(path), "%s/config.json", ckpt_dir);
    zt_train_config *saved = zt_xmalloc(sizeof(*saved));
    zt_train_config_init(saved);
    zt_err ignored;
    bool remote_before = zt_train_config_load_file(saved, path, &ignored) == 0 &&
                         strcmp(saved->optimizer, "server") == 0 && saved->servers[0] != '\0';
    free(saved);
    bool remote_now = strcmp(cfg->optimizer, "server") == 0 && cfg->servers[0] != '\0';
    if (remote_before && !remote_now)
        return zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint %s was written with remote state servers, which keep the "
                       "Adam moments in their snapshots: resume it with --optimizer server --servers host:port,... "
                       "(the servers started with their --snapshot-dir)", ckpt_dir);
    return 0;
}

/* One training run from the start or cfg->resume to cfg->steps. When a state server holds an older step,
 * the run fails with ZT_ESTATE and that step in res->rewind_to. */
static int train_once(const zt_train_config *cfg, zt_train_result *res, zt_err *err)
{
    memset(res, 0, sizeof(*res));
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    res->rewind_to = -1;

    int rc = zt_train_config_validate(cfg, err);
    if (rc < 0)
        return rc;
    const int B = (int)cfg->batch_size;
    const int T = (int)cfg->seq_len;
    const int accum = (int)cfg->grad_accum;
    const bool resuming = cfg->resume[0] != '\0';
    struct run r;
    memset(&r, 0, sizeof(r));
    char path[PATH_CAP], ckpt_dir[PATH_CAP];

    zt_cpu_set_threads((int)cfg->threads);
    zt_train_config_log(cfg);
    zt_log(ZT_LOG_INFO, "threads: %d", zt_cpu_get_threads());

    /* The run directory must not hold another run's checkpoints, unless this run continues it. (A run
     * that stopped before its first checkpoint left nothing to continue: it is started over.) */
    if (!resuming && file_exists(cfg->out_dir, "latest"))
        return zt_fail(err, ZT_EINVAL_CONFIG, "'%s' already holds a run with checkpoints; continue it with "
                       "--resume %s, or start a new one with another --out directory (or delete this one)",
                       cfg->out_dir, cfg->out_dir);
    if (resuming && (rc = zt_checkpoint_find(cfg->resume, ckpt_dir, sizeof(ckpt_dir), err)) < 0)
        return rc;

    /* Model and optimizer. */
    /* On the GPU the host model keeps the layout, the parameters and the files; it never runs, so its
     * activations are sized for one token. */
    const bool on_gpu = strcmp(cfg->device, "cuda") == 0;
    if ((rc = zt_gpt2_create(&r.model, &cfg->model, on_gpu ? 1 : B, on_gpu ? 1 : T, (uint64_t)cfg->seed, err)) < 0)
        goto out;
    log_model(r.model, cfg);
    if ((rc = zt_optimizer_init(&r.opt, zt_gpt2_num_params(r.model), cfg->beta1, cfg->beta2, cfg->eps,
                                cfg->weight_decay, cfg->grad_clip, err)) < 0)
        goto out;

    /* Data. */
    if ((rc = zt_dataloader_open(&r.train, cfg->train_data, B, T, cfg->shuffle, (uint64_t)cfg->seed, err)) < 0) {
        prefix_error(err, "--train-data");
        goto out;
    }
    if ((rc = check_vocab(r.train, cfg->train_data, cfg->model.vocab_size, err)) < 0)
        goto out;
    log_data("train", cfg->train_data, r.train, cfg);
    int64_t eval_batches = cfg->eval_batches;
    if (cfg->val_data[0]) {
        if ((rc = zt_dataloader_open(&r.val, cfg->val_data, B, T, false, (uint64_t)cfg->seed, err)) < 0) {
            prefix_error(err, "--val-data");
            goto out;
        }
        if ((rc = check_vocab(r.val, cfg->val_data, cfg->model.vocab_size, err)) < 0)
            goto out;
        log_data("val", cfg->val_data, r.val, cfg);
        uint64_t available = zt_dataloader_batches_per_epoch(r.val);
        if ((uint64_t)eval_batches > available) {
            zt_log(ZT_LOG_INFO, "eval: the validation data has %llu batches; evaluating on those instead of %lld",
                   (unsigned long long)available, (long long)eval_batches);
            eval_batches = (int64_t)available;
        }
    } else {
        zt_log(ZT_LOG_INFO, "data: no val_data given: no evaluation");
    }
    r.inputs = zt_xmalloc((size_t)B * (size_t)T * sizeof(int32_t));
    r.targets = zt_xmalloc((size_t)B * (size_t)T * sizeof(int32_t));

    /* Starting state: fresh, from init_from, or from a checkpoint. */
    zt_schedule sched;
    enum zt_schedule_kind kind = ZT_SCHEDULE_COSINE;
    zt_schedule_parse(cfg->schedule, &kind, NULL); /* validated above */
    sched.kind = kind;
    sched.lr = cfg->lr;
    sched.min_lr = cfg->min_lr;
    sched.warmup_steps = cfg->warmup_steps;
    sched.total_steps = cfg->steps;
    sched.gamma = cfg->lr_gamma;

    zt_ckpt_state st;
    memset(&st, 0, sizeof(st));
    zt_rng_seed(&st.rng, (uint64_t)cfg->seed);
    if (resuming) {
        if ((rc = zt_checkpoint_load(ckpt_dir, r.model, &r.opt, &st, err)) < 0)
            goto out;
        if (st.step >= cfg->steps) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint %s is at step %lld and the run is configured for "
                         "%lld steps: nothing to do; raise --steps to train further", ckpt_dir,
                         (long long)st.step, (long long)cfg->steps);
            goto out;
        }
        zt_err pos_err;
        if ((rc = zt_dataloader_set_position(r.train, &st.data, &pos_err)) < 0) {
            rc = zt_fail(err, rc, "resume from %s: %s (keep batch_size, seq_len and train_data of the run)",
                         ckpt_dir, pos_err.msg);
            goto out;
        }
        if ((rc = zt_trainer_check_resume_placement(ckpt_dir, cfg, err)) < 0)
            goto out;
        warn_schedule_change(&st.schedule, &sched);
        if (cfg->init_from[0])
            zt_log(ZT_LOG_WARN, "resume: init_from '%s' is ignored: the parameters come from the checkpoint",
                   cfg->init_from);
        zt_log(ZT_LOG_INFO, "resume: continuing from %s at step %lld (data epoch %llu, shard %llu, window %llu)",
               ckpt_dir, (long long)st.step, (unsigned long long)st.data.epoch, (unsigned long long)st.data.shard,
               (unsigned long long)st.data.window);
    } else if (cfg->init_from[0]) {
        if ((rc = zt_gpt2_import(r.model, cfg->init_from, err)) < 0)
            goto out;
        zt_log(ZT_LOG_INFO, "model: parameters initialised from %s", cfg->init_from);
    }
    st.schedule = sched;

    /* The device. */
    if (strcmp(cfg->device, "cuda") == 0) {
#ifdef ZT_WITH_CUDA
        enum zt_dtype dt;
        if ((rc = zt_trainer_pick_dtype(cfg, 0, &dt, err)) < 0)
            goto out;
        r.gpu_offload = strcmp(cfg->optimizer, "gpu") != 0;
        if ((rc = zt_gpt2_cuda_create_state(&r.gpu, r.model, B, T, accum, dt,
                                            r.gpu_offload ? ZT_GPT2_CUDA_NO_OPTIMIZER : ZT_GPT2_CUDA_FULL, err)) < 0)
            goto out;
        if (resuming && !r.gpu_offload)
            zt_gpt2_cuda_upload(r.gpu, zt_gpt2_params(r.model), r.opt.m, r.opt.v);
        if (r.gpu_offload) {
            /* Gradients come down and parameters go up every step: page-lock the two host slabs so the
             * copies run at the bus's speed. (The device model uploaded the parameters at creation.) */
            const size_t bytes = zt_gpt2_num_params(r.model) * sizeof(float);
            if (cudaHostRegister(zt_gpt2_params(r.model), bytes, cudaHostRegisterDefault) == cudaSuccess &&
                cudaHostRegister(zt_gpt2_grads(r.model), bytes, cudaHostRegisterDefault) == cudaSuccess) {
                r.pinned = true;
            } else {
                cudaGetLastError();
                cudaHostUnregister(zt_gpt2_params(r.model));
                cudaGetLastError();
                zt_log(ZT_LOG_WARN, "gpu: could not page-lock the host parameter and gradient slabs (check ulimit -l); "
                       "the copies between host and GPU run slower");
            }
            /* --optimizer cpu: the host AdamW also writes the weights in the compute type, so that half the
             * bytes go up (the state servers send fp32, which the device rounds). */
            if (strcmp(cfg->optimizer, "cpu") == 0 && dt != ZT_DTYPE_F32) {
                const size_t lowp_bytes = zt_gpt2_num_params(r.model) * zt_dtype_size(dt);
                if (cudaMallocHost(&r.opt.lowp, lowp_bytes) == cudaSuccess) {
                    r.opt.lowp_dtype = dt;
                } else {
                    cudaGetLastError();
                    r.opt.lowp = NULL;
                    zt_log(ZT_LOG_WARN, "gpu: could not page-lock %zu bytes for the %s weights; fp32 weights go "
                           "up instead (twice the bytes)", lowp_bytes, zt_dtype_name(dt));
                }
            }
            zt_log(ZT_LOG_INFO, "gpu: optimizer placement %s: gradients to the host and %s parameters back after "
                   "every step", cfg->optimizer, zt_dtype_name(r.opt.lowp ? dt : ZT_DTYPE_F32));
        }
        if (dt == ZT_DTYPE_F16) {
            r.use_scaler = true;
            zt_loss_scaler_init(&r.scaler, cfg->loss_scale, cfg->min_loss_scale, cfg->loss_scale_window);
            if (resuming && st.loss_scale > 0) {
                r.scaler.scale = st.loss_scale;
                r.scaler.clean_steps = st.loss_scale_clean_steps;
            }
            zt_log(ZT_LOG_INFO, "fp16: dynamic loss scale %g (x2 after %lld clean steps, /2 on overflow, min %g)",
                   r.scaler.scale, (long long)r.scaler.window, r.scaler.min_scale);
        }
#else
        rc = zt_fail(err, ZT_EUNSUPPORTED, "--device cuda: this ztrain was built without the CUDA backend "
                     "(rebuild with -DZT_CUDA=ON on a machine with the CUDA toolkit, or train with --device cpu)");
        goto out;
#endif
    }

    /* Everything is read: check that the run directory can be written before training starts, so that a
     * long run does not fail at its first checkpoint. */
    if ((rc = zt_check_writable_dir(cfg->out_dir, err)) < 0)
        goto out;
    /* --optimizer server: the master weights and moments move to the state servers (embedded or remote). */
    if (strcmp(cfg->optimizer, "server") == 0 &&
        (rc = zt_placement_server_open(&r.state, cfg, r.model, &r.opt, st.step, err)) < 0)
        goto out;
#ifdef ZT_WITH_CUDA
    if (r.gpu_offload && r.state) /* remote servers may have sent their parameters into the host slab */
        zt_gpt2_cuda_upload_weights(r.gpu, zt_gpt2_params(r.model), ZT_DTYPE_F32);
    r.opt.loss_scaled = r.use_scaler;
#endif
    res->start_step = st.step;
    res->end_step = st.step;
    res->skipped_steps = st.skipped_steps;
    res->losses = zt_xcalloc((size_t)(cfg->steps - st.step), sizeof(float));

    /* The run directory's config files, as this run started, and the metrics log. */
    snprintf(path, sizeof(path), "%s/config.json", cfg->out_dir);
    if ((rc = zt_train_config_save(cfg, path, "model_config.json", err)) < 0)
        goto out;
    snprintf(path, sizeof(path), "%s/model_config.json", cfg->out_dir);
    if ((rc = zt_gpt2_config_save(&cfg->model, path, err)) < 0)
        goto out;
    snprintf(path, sizeof(path), "%s/metrics.jsonl", cfg->out_dir);
    if (resuming) {
        double first_val = NAN;
        if ((rc = zt_metrics_resume(&r.metrics, path, st.step, &first_val, err)) < 0)
            goto out;
        res->first_val_loss = (float)first_val;
    } else if ((rc = zt_metrics_create(&r.metrics, path, err)) < 0) {
        goto out;
    }

    /* The starting validation loss, so that the curve has its origin. */
    if (r.val && !resuming) {
        float vl = run_evaluate(&r, eval_batches, B, T);
        zt_log(ZT_LOG_INFO, "eval: step 0 | val loss %.4f", (double)vl);
        res->first_val_loss = res->last_val_loss = vl;
        if ((rc = zt_metrics_write_eval(&r.metrics, 0, vl, err)) < 0)
            goto out;
    }

    const double start = now_seconds();
    const double elapsed_before = st.elapsed_s;
    const double step_tokens = (double)B * (double)T * (double)accum;
    double train_time = 0.0, window_time = 0.0, window_tokens = 0.0;
    int64_t steps_run = 0;
#ifdef ZT_WITH_CUDA
    const char *profile_env = getenv("ZT_GPU_PROFILE");
    const int64_t profile_from = profile_env ? atoll(profile_env) : 0;
#endif

    for (int64_t step = st.step + 1; step <= cfg->steps; step++) {
        double t0 = now_seconds();
        double lr = zt_schedule_lr(&sched, step);
        zt_optimizer_report rep;
        float loss;
#ifdef ZT_WITH_CUDA
        /* ZT_GPU_PROFILE=N: from step N on, time every kernel family with CUDA events (logged at the end). */
        if (r.gpu && profile_from > 0 && step == profile_from)
            zt_gpt2_cuda_set_profiling(r.gpu, true);
        if (r.gpu && !r.gpu_offload) {
            if ((rc = gpu_step(&r, cfg, (float)lr, &loss, &rep, err)) < 0)
                goto out;
        } else if (r.gpu) {
            if ((rc = offload_step(&r, cfg, step, (float)lr, &loss, &rep, err)) < 0)
                goto out;
        } else
#endif
        {
            loss = zt_trainer_accumulate(r.model, r.train, accum, B, T, r.inputs, r.targets);
            if (r.state)
                rc = zt_placement_server_step(r.state, r.model, &r.opt, step, loss, (float)lr, &rep, err);
            else
                rc = zt_optimizer_step(&r.opt, r.model, loss, (float)lr, &rep, err);
            if (rc < 0)
                goto out;
        }
        double dt = now_seconds() - t0;

        steps_run++;
        train_time += dt;
        window_time += dt;
        window_tokens += step_tokens;
        st.step = step;
        res->end_step = step;
        res->losses[step - res->start_step - 1] = loss;
        res->skipped_steps = r.opt.skipped_steps;
        double elapsed = elapsed_before + (now_seconds() - start);
        if (rep.skipped)
            zt_log(ZT_LOG_WARN, "step %lld skipped: loss %g, grad norm %g is not finite (%d in a row; the run stops "
                   "at %d)", (long long)step, (double)loss, rep.grad_norm, r.opt.bad_in_a_row,
                   ZT_OPTIMIZER_MAX_BAD_STEPS);

        zt_metrics_train line = {
            .step = step,
            .loss = loss,
            .lr = lr,
            .grad_norm = rep.grad_norm,
            .tokens_per_s = dt > 0 ? step_tokens / dt : 0.0,
            .elapsed_s = elapsed,
            .skipped = rep.skipped,
        };
        if ((rc = zt_metrics_write_train(&r.metrics, &line, err)) < 0)
            goto out;
        const bool last = step == cfg->steps;
        if (step % cfg->log_every == 0 || step == res->start_step + 1 || last) {
            double per_step = (now_seconds() - start) / (double)steps_run;
            log_progress(step, cfg->steps, loss, lr, rep.grad_norm, window_time > 0 ? window_tokens / window_time : 0,
                         elapsed, per_step * (double)(cfg->steps - step));
            window_time = 0.0;
            window_tokens = 0.0;
        }

        if (r.val && ((cfg->eval_every > 0 && step % cfg->eval_every == 0) || last)) {
            float vl = run_evaluate(&r, eval_batches, B, T);
            zt_log(ZT_LOG_INFO, "eval: step %lld | val loss %.4f", (long long)step, (double)vl);
            res->last_val_loss = vl;
            if (isnan(res->first_val_loss))
                res->first_val_loss = vl;
            if ((rc = zt_metrics_write_eval(&r.metrics, step, vl, err)) < 0)
                goto out;
        }

        const bool stop = stop_requested || (cfg->stop_at_step > 0 && step >= cfg->stop_at_step);
        if ((cfg->save_every > 0 && step % cfg->save_every == 0) || last || stop) {
            st.adam_step = r.opt.adam_step;
            st.skipped_steps = r.opt.skipped_steps;
            st.elapsed_s = elapsed_before + (now_seconds() - start);
            zt_dataloader_get_position(r.train, &st.data);
#ifdef ZT_WITH_CUDA
            if (r.gpu && !r.gpu_offload) { /* with the optimizer off the GPU the host slabs are current */
                zt_gpt2_cuda_download(r.gpu, zt_gpt2_params(r.model), r.opt.m, r.opt.v);
                if (cfg->save_grads)
                    zt_gpt2_cuda_download_grads(r.gpu, zt_gpt2_grads(r.model));
            }
#endif
            if (r.state && (rc = zt_placement_server_checkpoint(r.state, &r.opt, step, err)) < 0)
                goto out;
            st.loss_scale = r.use_scaler ? r.scaler.scale : 0.0;
            st.loss_scale_clean_steps = r.use_scaler ? r.scaler.clean_steps : 0;
            /* The CPU gradient slab still holds this step's gradients (clipping only scales the update). */
            const float *grads = cfg->save_grads ? zt_gpt2_grads(r.model) : NULL;
            if ((rc = zt_checkpoint_save_with_grads(cfg->out_dir, r.model, &r.opt, grads, cfg, &st, res->checkpoint,
                                                    sizeof(res->checkpoint), err)) < 0)
                goto out;
            zt_log(ZT_LOG_INFO, "checkpoint: %s", res->checkpoint);
        }
        if (r.state) {
            char where[48];
            snprintf(where, sizeof(where), "step:%lld", (long long)step);
            zt__placement_test_pause(where);
        }
        if (stop && !last) {
            stop_requested = 0;
            res->interrupted = true;
            zt_log(ZT_LOG_WARN, "stopped after step %lld/%lld; resume with: ztrain train --resume %s",
                   (long long)step, (long long)cfg->steps, cfg->out_dir);
            break;
        }
    }

    stop_requested = 0; /* a request that came with the last step needs no stop */
#ifdef ZT_WITH_CUDA
    if (r.gpu && profile_from > 0)
        zt_gpt2_cuda_profile_report(r.gpu);
#endif
    res->seconds = now_seconds() - start;
    res->tokens_per_s = train_time > 0 ? step_tokens * (double)steps_run / train_time : 0.0;
    if (!res->interrupted) {
        char took[32];
        zt_format_duration(res->seconds, took, sizeof(took));
        if (r.val)
            zt_log(ZT_LOG_INFO, "done: %lld steps in %s, %.0f tok/s; val loss %.4f -> %.4f; checkpoint %s",
                   (long long)steps_run, took, res->tokens_per_s, (double)res->first_val_loss,
                   (double)res->last_val_loss, res->checkpoint);
        else
            zt_log(ZT_LOG_INFO, "done: %lld steps in %s, %.0f tok/s; train loss %.4f -> %.4f; checkpoint %s",
                   (long long)steps_run, took, res->tokens_per_s, steps_run ? (double)res->losses[0] : NAN,
                   steps_run ? (double)res->losses[steps_run - 1] : NAN, res->checkpoint);
        if (res->skipped_steps > 0)
            zt_log(ZT_LOG_WARN, "%lld steps were skipped for a non-finite loss or gradient norm",
                   (long long)res->skipped_steps);
    }
    rc = 0;
out:
    if (rc < 0) /* a step that failed on a state server back at an older step: which one */
        res->rewind_to = zt_placement_server_stale_step(r.state);
    run_free(&r);
    return rc;
}

/* Runs training as cfg says; see trainer.h. A state server that restarted from an older snapshot makes a
 * run fail with the server's step in res->rewind_to: training continues from the checkpoint of that step
 * (the server's snapshot was written with it), ZT_TRAIN_MAX_REWINDS times at most. */
int zt_trainer_run(const zt_train_config *cfg, zt_train_result *res, zt_err *err)
{
    zt_train_config *again = zt_xmalloc(sizeof *again);
    *again = *cfg;
    int rc;
    for (int rewinds = 0;; rewinds++) {
        rc = train_once(again, res, err);
        if (rc != ZT_ESTATE || res->rewind_to < 0)
            break;
        char ckpt[sizeof again->resume];
        if ((rc = zt_trainer_rewind_target(again, res, rewinds, ckpt, sizeof ckpt, err)) < 0)
            break;
        zt_trainer_log_rewind(again, res->rewind_to, rewinds, ckpt);
        snprintf(again->resume, sizeof again->resume, "%s", ckpt);
        zt_train_result_free(res);
    }
    free(again);
    return rc;
}
