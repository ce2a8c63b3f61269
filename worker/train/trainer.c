/* The training loop (see trainer.h): start-up of the ranks, setup (model, data, resume, the engine and
 * where its optimizer lives), steps, evaluation, metrics, checkpoints and the rewind after a state-server
 * restart. */
#include "worker/train/trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/memory.h"
#include "common/rng.h"
#include "common/units.h"
#include "kernels/cpu_threads.h"
#include "worker/data/dataloader.h"
#include "worker/data/tokenize.h"
#include "worker/engine/engine.h"
#include "worker/engine/optimizer.h"
#include "worker/launch/env.h"
#include "worker/launch/startup.h"
#include "worker/models/family.h"
#include "worker/train/checkpoint.h"
#include "worker/train/metrics.h"
#include "worker/train/plan.h"
#include "worker/train/schedule.h"
#include "worker/train/task.h"
#ifdef ZT_WITH_CUDA
#include "kernels/cuda/cuda_common.h" /* zt_cuda_pick_dtype */
#include "kernels/matmul.h"            /* ZT_CUDA_BLAS_DEVICE_BYTES */
#endif

#define PATH_CAP (ZT_TRAIN_PATH_MAX + 64)

static volatile sig_atomic_t stop_requested;
static zt_trainer_hooks hooks;

/* Asks the running loop to stop after its current step; async-signal-safe. */
void zt_trainer_request_stop(void)
{
    stop_requested = 1;
}

/* Installs the hooks of this process; see trainer.h. */
void zt_trainer_set_hooks(const zt_trainer_hooks *h)
{
    if (h)
        hooks = *h;
    else
        memset(&hooks, 0, sizeof hooks);
}

/* Frees the losses of a result; see trainer.h. */
void zt_train_result_free(zt_train_result *res)
{
    if (!res)
        return;
    free(res->losses);
    res->losses = NULL;
}

static bool file_exists(const char *dir, const char *name)
{
    char path[PATH_CAP];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Hashes the config's values; see trainer.h. */
uint64_t zt_trainer_config_hash(const zt_train_config *cfg)
{
    uint64_t h = 0xcbf29ce484222325ull;
    /* strings with their NUL, so that two adjacent strings cannot trade characters */
    h = fnv1a(h, cfg->init_from, strlen(cfg->init_from) + 1);
    h = fnv1a(h, cfg->train_data, strlen(cfg->train_data) + 1);
    h = fnv1a(h, cfg->resume, strlen(cfg->resume) + 1);
    h = fnv1a(h, cfg->val_data, strlen(cfg->val_data) + 1);
    h = fnv1a(h, cfg->state_store_dir, strlen(cfg->state_store_dir) + 1);
    /* field by field: the structs' padding bytes differ between processes. The number of state servers
     * decides which server owns which shard; their addresses may differ between hosts. */
    int64_t nservers = 0;
    if (cfg->servers[0]) {
        nservers = 1;
        for (const char *p = cfg->servers; *p; p++)
            nservers += *p == ',';
    }
    const int64_t ints[] = {(int64_t)zt_family_config_fingerprint(&cfg->model),
                            cfg->steps, cfg->batch_size, cfg->seq_len, cfg->grad_accum, cfg->warmup_steps,
                            cfg->save_every, cfg->seed, cfg->shuffle, cfg->eval_every, cfg->eval_batches,
                            cfg->schedule, cfg->device, cfg->precision, cfg->optimizer, cfg->state_store, nservers,
                            cfg->zero_level, cfg->checkpointing, cfg->checkpoint_every, cfg->prefetch,
                            cfg->loss_scale_window, cfg->adam_moments, (int64_t)cfg->host_mem,
                            cfg->moments_dir[0] != '\0'};
    const double reals[] = {cfg->lr, cfg->min_lr, cfg->lr_gamma, cfg->weight_decay, cfg->beta1,
                            cfg->beta2, cfg->eps, cfg->grad_clip, cfg->loss_scale, cfg->min_loss_scale};
    h = fnv1a(h, ints, sizeof ints);
    return fnv1a(h, reals, sizeof reals);
}

/* The run id: the run directory's last component, restricted to the characters run ids allow; see
 * trainer.h. */
void zt_trainer_run_id(const char *out_dir, char *id, size_t cap)
{
    char dir[ZT_TRAIN_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", out_dir);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = '\0';
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        base = "train";
    snprintf(id, cap, "%s", base);
    for (char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            *p = '_';
}

static void log_model(const zt_family_model *model, const zt_train_config *cfg)
{
    size_t n = zt_family_model_num_params(model);
    char weights[32], state[32], what[160];
    zt_format_size((uint64_t)n * sizeof(float), weights, sizeof(weights));
    zt_format_size((uint64_t)n * sizeof(float) * 4, state, sizeof(state));
    zt_family_config_describe(zt_family_model_config(model), what, sizeof what);
    zt_log(ZT_LOG_INFO, "model: %s: %.2fM parameters (%s fp32; %s with gradients and Adam state)", what,
           (double)n / 1e6, weights, state);
    zt_log(ZT_LOG_INFO, "model: a step is %lld x %lld sequences of %lld tokens = %lld tokens",
           (long long)cfg->grad_accum, (long long)cfg->batch_size, (long long)cfg->seq_len,
           (long long)(cfg->grad_accum * cfg->batch_size * cfg->seq_len));
}

/* Whether the run's initial weights are made block by block as the engine takes them (zt_family_model_create_lazy):
 * a new run on GPUs, whose engine gives each block's pages back once taken, from the family's initialisation or
 * from --init-from's files (checked whole before the engine is created, then read block by block). */
static bool lazy_init(const zt_train_config *cfg)
{
    return cfg->device == ZT_DEVICE_CUDA && !cfg->resume[0];
}

/* What a lazy run's blocks are made from (zt_engine_options.fill_host_ctx). */
typedef struct lazy_fill {
    zt_family_model *host;
    zt_family_import *import; /* --init-from's files, opened and checked; NULL without */
} lazy_fill;

/* Block `block` of the host slab: the family's initialisation of what the files lack (the open told the model to
 * leave out the rest), then the files' tensors, so that a task head the files lack keeps its initial values as when
 * a whole model is created and then imported. */
static void fill_host_block(void *ctx, int block)
{
    const lazy_fill *f = ctx;
    zt_family_model_init_through(f->host, block);
    if (f->import)
        zt_family_import_fill_through(f->import, block);
}

/* The `eval: step 120 | val loss ...` line, with the accuracy of a classifier (acc not NAN). */
static void log_eval(int64_t step, float loss, float acc)
{
    if (isnan(acc))
        zt_log(ZT_LOG_INFO, "eval: step %lld | val loss %.4f", (long long)step, (double)loss);
    else
        zt_log(ZT_LOG_INFO, "eval: step %lld | val loss %.4f | accuracy %.4f", (long long)step, (double)loss,
               (double)acc);
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
                         saved->optimizer == ZT_OPTIMIZER_SERVER && saved->servers[0] != '\0';
    free(saved);
    bool remote_now = cfg->optimizer == ZT_OPTIMIZER_SERVER && cfg->servers[0] != '\0';
    if (remote_before && !remote_now)
        return zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint %s was written with remote state servers, which keep the "
                       "Adam moments in their snapshots: resume it with --optimizer server --servers host:port,... "
                       "(the servers started with their --snapshot-dir)", ckpt_dir);
    return 0;
}


/* ---- the state servers' client (placement server) ---- */

/* Reads the bearer token: the file's first line without surrounding white space. */
static int read_token(const char *path, char **out, zt_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc < 0)
        return zt_fail(err, rc, "--token-file: %s", err ? err->msg : "cannot read it");
    char *s = text;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strcspn(s, "\r\n");
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n == 0) {
        free(text);
        return zt_fail(err, ZT_EINVAL_CONFIG, "--token-file %s is empty: write the servers' token in it", path);
    }
    memmove(text, s, n);
    text[n] = '\0';
    *out = text;
    return 0;
}

/* Whether files in dir can be opened with O_DIRECT (tmpfs cannot); creates dir if needed. */
static bool dir_supports_direct(const char *dir)
{
    char probe[PATH_CAP];
    mkdir(dir, 0755);
    snprintf(probe, sizeof(probe), "%s/.ztrain_direct_probe", dir);
    int fd = open(probe, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) {
        fd = open(probe, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            close(fd);
            unlink(probe);
            return false;
        }
        return true; /* another problem: let the store report it */
    }
    close(fd);
    unlink(probe);
    return true;
}

/* Creates the state client cfg describes: remote servers (TLS files, the bearer token) or the core in
 * this process (cfg->state_store). *token (freed after the client) receives the token used, or NULL. */
static int state_client_create(const zt_train_config *cfg, zt_state_client_t **out, char **token, zt_err *err)
{
    *out = NULL;
    *token = NULL;
    int rc = 0;
    if (cfg->token_file[0] && (rc = read_token(cfg->token_file, token, err)) < 0)
        return rc;
    const bool remote = cfg->servers[0] != '\0';
    struct zt_state_client_options copt;
    memset(&copt, 0, sizeof(copt));
    copt.servers = remote ? cfg->servers : NULL;
    copt.token = *token;
    copt.tls_ca_file = cfg->tls_ca[0] ? cfg->tls_ca : NULL;
    copt.tls_cert_file = cfg->tls_cert[0] ? cfg->tls_cert : NULL;
    copt.tls_key_file = cfg->tls_key[0] ? cfg->tls_key : NULL;
    copt.shm = cfg->server_shm == ZT_SERVER_SHM_OFF ? ZT_STATE_SHM_OFF : ZT_STATE_SHM_AUTO;
    copt.embedded.threads = (int)cfg->threads;
    if (!remote && cfg->state_store == ZT_STORE_NVME) {
        copt.embedded.store = ZT_SERVER_STORE_NVME;
        copt.embedded.store_path = cfg->state_store_dir;
        copt.embedded.store_no_direct = !dir_supports_direct(cfg->state_store_dir);
        if (copt.embedded.store_no_direct)
            zt_log(ZT_LOG_WARN, "state store %s: the file system has no O_DIRECT (tmpfs?); using buffered I/O",
                   cfg->state_store_dir);
    }
    rc = zt_state_client_create(&copt, out, err);
    if (rc < 0) {
        free(*token);
        *token = NULL;
    }
    return rc;
}

/* ---- the device ---- */

#ifdef ZT_WITH_CUDA
/* The compute type of a run on CUDA device `device`: cfg->precision, or with "auto" bf16 on GPUs with bf16
 * matrix units (sm_80+) and fp16 below. */
/* Whether --plan-only plans for a GPU that this machine does not show (one of --gpu-mem bytes, bf16 units). */
static bool plan_for_absent_gpu(const zt_train_config *cfg, int device)
{
    int n = 0;
    if (!cfg->plan_only || (cudaGetDeviceCount(&n) == cudaSuccess && n > device))
        return false;
    cudaGetLastError();
    return true;
}

static int pick_dtype(const zt_train_config *cfg, int device, enum zt_dtype *dt, zt_err *err)
{
    if (plan_for_absent_gpu(cfg, device)) {
        if (!cfg->gpu_mem)
            return zt_fail(err, ZT_EINVAL_CONFIG, "--plan-only: no CUDA device is visible, so the plan needs the GPU's "
                           "memory: add --gpu-mem SIZE (e.g. 11GiB for an RTX 2080 Ti, 80GiB for an H100)");
        *dt = cfg->precision == ZT_PRECISION_FP32 ? ZT_DTYPE_F32
              : cfg->precision == ZT_PRECISION_FP16 ? ZT_DTYPE_F16 : ZT_DTYPE_BF16;
        return 0;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
        cudaGetLastError();
        return zt_fail(err, ZT_EUNSUPPORTED, "--device cuda: CUDA device %d is needed but %d are visible (check the "
                       "driver and CUDA_VISIBLE_DEVICES, with several ranks LOCAL_RANK and --nproc, or train with "
                       "--device cpu)", device, n);
    }
    ZT_CUDA_CHECK(cudaSetDevice(device));
    const enum zt_dtype best = zt_cuda_pick_dtype(device);
    switch (cfg->precision) {
    case ZT_PRECISION_AUTO:
        *dt = best;
        break;
    case ZT_PRECISION_FP32:
        *dt = ZT_DTYPE_F32;
        break;
    case ZT_PRECISION_BF16:
        *dt = ZT_DTYPE_BF16;
        break;
    case ZT_PRECISION_FP16:
        *dt = ZT_DTYPE_F16;
        break;
    }
    if (*dt == ZT_DTYPE_BF16 && best != ZT_DTYPE_BF16)
        return zt_fail(err, ZT_EUNSUPPORTED, "--precision bf16: this GPU has no bf16 matrix units (sm_80+); use "
                       "--precision fp16 (with loss scaling) or fp32");
    return 0;
}
#endif

/* The layer flags of activation checkpointing: every layer (all) or as cfg says. Free with free(). */
static bool *layer_flags(const zt_train_config *cfg, bool all)
{
    const int L = zt_family_config_layers(&cfg->model);
    bool *ckpt = zt_xcalloc((size_t)(L > 0 ? L : 1), sizeof(bool));
    for (int l = 0; l < L; l++)
        ckpt[l] = all || zt_train_config_layer_checkpointed(cfg, l);
    return ckpt;
}

#ifndef ZT_WITH_CUDA
static int no_cuda_backend(zt_err *err)
{
    return zt_fail(err, ZT_EUNSUPPORTED, "--device cuda: this ztrain was built without the CUDA backend (rebuild with "
                   "-DZT_CUDA=ON on a machine with the CUDA toolkit, or train with --device cpu)");
}
#endif

/* The model as the engine drives it, on the device cfg asks for, computing in dtype (chosen by
 * plan_gpu_run on a GPU); b x T micro-batches. */
static int create_model(const zt_train_config *cfg, zt_family_model *host, int b, int T, enum zt_dtype dtype, zt_model **out,
                        zt_err *err)
{
    bool *ckpt = layer_flags(cfg, false);
    int rc;
    if (cfg->device == ZT_DEVICE_CPU) {
        rc = zt_family_model_cpu(out, host, (int)cfg->grad_accum, ckpt, err);
    } else {
#ifdef ZT_WITH_CUDA
        rc = zt_family_model_cuda(out, host, b, T, (int)cfg->grad_accum, dtype, ckpt, err);
#else
        (void)b;
        (void)T;
        (void)dtype;
        rc = no_cuda_backend(err);
#endif
    }
    free(ckpt);
    return rc;
}

static enum zt_placement engine_placement(enum zt_train_optimizer o)
{
    return o == ZT_OPTIMIZER_GPU ? ZT_PLACEMENT_GPU : o == ZT_OPTIMIZER_SERVER ? ZT_PLACEMENT_SERVER : ZT_PLACEMENT_CPU;
}

/* The engine's options from cfg, for grad_accum micro-batches per step (the layout's fields stay 0). */
static void engine_options(const zt_train_config *cfg, int accum, zt_engine_options *eo)
{
    zt_engine_options_init(eo);
    eo->zero_level = (int)cfg->zero_level;
    eo->prefetch = (int)cfg->prefetch;
    eo->grad_accum = accum;
    eo->placement = engine_placement(cfg->optimizer);
    eo->beta1 = cfg->beta1;
    eo->beta2 = cfg->beta2;
    eo->eps = cfg->eps;
    eo->weight_decay = cfg->weight_decay;
    eo->grad_clip = cfg->grad_clip;
    eo->gpu_fraction = cfg->optimizer_gpu_fraction;
    eo->moment_dtype = cfg->adam_moments == ZT_MOMENTS_BF16 ? ZT_DTYPE_BF16 : ZT_DTYPE_F32;
    eo->moments_dir = cfg->moments_dir[0] ? cfg->moments_dir : NULL;
    eo->grad_accum_host = cfg->host_grad_accum;
    /* ZT_MOMENTS_READ_AHEAD=0 (a diagnostic, the same bits): every update of the state on disk starts cold */
    const char *ahead = getenv("ZT_MOMENTS_READ_AHEAD");
    eo->moments_no_read_ahead = ahead && strcmp(ahead, "0") == 0;
}

/* What the planner chose for the engine. */
struct layout {
    size_t moments_ram_bytes; /* --moments-dir: the moments' share of RAM (the leading blocks') */
    bool moments_ram_only;    /* --host-mem chose to keep every moment in RAM despite --moments-dir */
    bool masters_disk;        /* --host-mem: the fp32 masters on disk too, but for masters_ram_bytes of them */
    size_t masters_ram_bytes;
    bool stream;
    bool stream_masters; /* the streamed weights come up as the fp32 masters (no compute-dtype host copy) */
    size_t grad_chunk;
    size_t device_budget; /* 0: no cap */
    uint64_t host_ram;    /* the plan's host bytes at its peak (logged beside the measured peak); 0: none planned */
};

/* The host tiers of the state as engine options (--host-mem): moments and masters on disk or not, and their
 * shares of RAM. */
static void apply_tiers(const zt_train_config *cfg, const zt_plan_tiers *t, zt_engine_options *o)
{
    o->moments_dir = t->moments_disk ? (cfg->moments_dir[0] ? cfg->moments_dir : "DIR") : NULL;
    o->moments_ram_bytes = t->moments_disk ? (size_t)t->moments_ram : 0;
    o->masters_disk = t->masters_disk;
    o->masters_ram_bytes = t->masters_disk ? (size_t)t->masters_ram : 0;
    if (t->masters_disk)
        o->stream_masters = false; /* the passes read the compute-dtype copy */
}

static void apply_tiers_layout(const zt_plan_tiers *t, const zt_engine_options *o, struct layout *lay)
{
    lay->moments_ram_only = !t->moments_disk;
    lay->moments_ram_bytes = o->moments_ram_bytes;
    lay->masters_disk = o->masters_disk;
    lay->masters_ram_bytes = o->masters_ram_bytes;
    lay->stream_masters = o->stream_masters;
}

/* Logs the host part of the plan under --host-mem (rank 0). */
static void log_host_tiers(const zt_train_config *cfg, const zt_plan_host_choice *c)
{
    char need[32], cap[32], disk[32], mom[32], mas[32], mtext[96], xtext[96];
    zt_format_size(c->price.ram, need, sizeof need);
    zt_format_size(cfg->host_mem, cap, sizeof cap);
    zt_format_size(c->price.disk, disk, sizeof disk);
    const zt_plan_tiers *t = &c->tiers;
    zt_format_size(t->moments_ram, mom, sizeof mom);
    zt_format_size(t->masters_ram, mas, sizeof mas);
    snprintf(mtext, sizeof mtext, !t->moments_disk ? "in RAM" : t->moments_ram ? "on disk, the leading blocks' within "
             "%s in RAM" : "on disk", mom);
    snprintf(xtext, sizeof xtext, !t->masters_disk ? "in RAM" : t->masters_ram ? "on disk, the leading blocks' within "
             "%s in RAM" : "on disk", mas);
    zt_log(ZT_LOG_INFO, "plan: host %s of --host-mem %s (%s); Adam moments %s; fp32 masters %s; disk %s%s%s", need, cap,
           c->price.parts, mtext, xtext, disk, c->price.disk ? " in " : "", c->price.disk ? cfg->moments_dir : "");
}

/* Whether a resume reads its checkpoint into the engine tensor by tensor (zt_checkpoint_open and
 * zt_engine_import_stream) instead of loading it into host arrays of the model's size: state on disk
 * (--moments-dir) or a --host-mem cap, with the state in this process (not the state servers'). */
static bool streams_resume(const zt_train_config *cfg)
{
    return cfg->resume[0] && cfg->optimizer != ZT_OPTIMIZER_SERVER && (cfg->host_mem || cfg->moments_dir[0]);
}

/* The host bytes a checkpoint stages beside the plan: with state on disk the engine's buffers of a few blocks
 * and the writer's tensor in the files' layout (the checkpoint is streamed from the records), else `gathered`
 * (the weights, moments and Hugging Face copy gathered into host arrays); 0 without checkpoints. A resume that
 * streams its checkpoint reads it before the first save, through the engine's shards of one block and the
 * reader's two tensors: the larger of the two. */
static uint64_t checkpoint_staging(const zt_train_config *cfg, const zt_engine_plan *ep, const zt_family_model *host,
                                   uint64_t gathered)
{
    uint64_t save = 0;
    if (cfg->save_every >= 0)
        save = ep->export_stream_bytes ? ep->export_stream_bytes + zt_checkpoint_stream_bytes(host) : gathered;
    const uint64_t load = streams_resume(cfg) ? ep->import_stream_bytes + zt_checkpoint_read_bytes(host) : 0;
    return save > load ? save : load;
}

/* The host price of a placement of the state on CPU ranks: the engine's arrays (on the CPU its "device"
 * buffers are host memory too), the host model's parameters and gradients, the checkpoints' staging (the
 * moments gathered and the exported weights, or with state on disk a few blocks' buffers). The activations of
 * the micro-batch are the model's and not counted. */
struct cpu_pricing {
    const zt_train_config *cfg;
    zt_model *model;
    const zt_family_model *host;
    int W;
    zt_engine_options base;
    uint64_t P, staging; /* staging: of a checkpoint gathered into host arrays */
};

static void price_cpu_host(void *ctx, const zt_plan_tiers *t, zt_plan_host_price *out)
{
    const struct cpu_pricing *p = ctx;
    zt_engine_options o = p->base;
    apply_tiers(p->cfg, t, &o);
    o.stream = o.stream || o.moments_dir; /* the host arrays hold the state on disk's way */
    zt_engine_plan ep;
    zt_engine_plan_for(p->model, p->W, &o, &ep);
    const uint64_t staging = checkpoint_staging(p->cfg, &ep, p->host, p->staging);
    /* the import of the initial weights (or of a checkpoint in host arrays) stages a block or three at the start,
     * before any checkpoint's staging */
    const uint64_t transient = staging > ep.import_bytes ? staging : ep.import_bytes;
    out->ram = ep.device_bytes + ep.host_bytes + 8 * p->P + transient + ZT_PLAN_PROCESS_RAM_CPU;
    out->disk = ep.disk_bytes;
    out->staging = staging;
    char eng[32], mod[32], stg[32], imp[32], proc[32];
    zt_format_size(ep.device_bytes + ep.host_bytes, eng, sizeof eng);
    zt_format_size(8 * p->P, mod, sizeof mod);
    zt_format_size(staging, stg, sizeof stg);
    zt_format_size(ep.import_bytes, imp, sizeof imp);
    zt_format_size(ZT_PLAN_PROCESS_RAM_CPU, proc, sizeof proc);
    snprintf(out->parts, sizeof out->parts, "engine %s, model %s, checkpoint staging %s or the import's %s, "
             "process %s", eng, mod, stg, imp, proc);
}

/* Plans the host memory of CPU ranks under --host-mem before the engine allocates its state: the tiers of the
 * state, the disk's free space for the records and a checkpoint. Logs the plan; refuses what does not fit. */
static int plan_cpu_host(const zt_train_config *cfg, int W, bool is0, zt_model *model, const zt_family_model *host,
                         struct layout *lay, zt_err *err)
{
    struct cpu_pricing p = {.cfg = cfg, .model = model, .host = host, .W = W, .P = zt_family_model_num_params(host)};
    engine_options(cfg, (int)cfg->grad_accum, &p.base);
    p.base.stream = lay->stream;
    p.staging = cfg->save_every >= 0 ? 12 * p.P : 0;
    zt_plan_host_request q = {.cap = cfg->host_mem, .has_dir = cfg->moments_dir[0] != '\0', .can_masters_disk = true,
                              .staging = p.staging, .price = price_cpu_host, .ctx = &p};
    zt_plan_host_choice c;
    int rc = zt_plan_fit_host(&q, &c, err);
    if (rc < 0)
        return rc;
    zt_engine_options o = p.base;
    apply_tiers(cfg, &c.tiers, &o);
    apply_tiers_layout(&c.tiers, &o, lay);
    lay->host_ram = c.price.ram;
    if (is0)
        log_host_tiers(cfg, &c);
    zt_plan_host h = {.ram_needed = c.price.ram, .ram_available = zt_plan_ram_available(), .disk_needed = c.price.disk,
                      .disk_free = c.price.disk ? zt_plan_disk_free(cfg->moments_dir) : 0, .disk_dir = cfg->moments_dir,
                      .ram_parts = c.price.parts};
    return zt_plan_check_host(&h, err);
}

#ifdef ZT_WITH_CUDA
/* What NCCL's buffers are counted at with several ranks. */
#define NCCL_RESERVE_BYTES ((size_t)256 << 20)

/* A planner layout as engine options. */
static void apply_layout(const zt_train_config *cfg, enum zt_plan_weights w, bool optimizer_on_gpu,
                         zt_engine_options *o)
{
    o->stream = w == ZT_PLAN_STREAMED;
    o->stream_masters = o->stream && cfg->weights == ZT_WEIGHTS_MASTERS;
    o->grad_chunk = w == ZT_PLAN_RESIDENT ? 0 : (size_t)cfg->grad_piece;
    if (optimizer_on_gpu)
        o->placement = ZT_PLACEMENT_GPU;
    else if (o->placement == ZT_PLACEMENT_GPU) /* priced for --optimizer cpu */
        o->placement = ZT_PLACEMENT_CPU;
}

struct pricing {
    const zt_train_config *cfg;
    const zt_family_model *layout; /* the model's tables */
    int W;
    enum zt_dtype dtype;
};

/* The engine options and the model's shape of a layout at micro-batch b (rows per rank). */
static zt_model *shape_of(const struct pricing *p, enum zt_plan_weights w, bool on_gpu, int b, bool ckpt_all,
                          zt_engine_options *o)
{
    const zt_train_config *cfg = p->cfg;
    const int micro_cfg = (int)cfg->batch_size / p->W;
    const int accum = (int)cfg->grad_accum * (micro_cfg / b);
    bool *ckpt = layer_flags(cfg, ckpt_all);
    zt_model *shape = zt_family_model_cuda_shape(p->layout, b, (int)cfg->seq_len, accum, p->dtype, ckpt);
    free(ckpt);
    engine_options(cfg, accum, o);
    apply_layout(cfg, w, on_gpu, o);
    return shape;
}

/* The planner's price of a layout on the GPU: the engine's buffers, the model's activations, cuBLAS and
 * NCCL. */
static void price_layout(void *ctx, enum zt_plan_weights w, bool on_gpu, int b, bool ckpt_all, zt_plan_device *out)
{
    const struct pricing *p = ctx;
    zt_engine_options o;
    zt_model *shape = shape_of(p, w, on_gpu, b, ckpt_all, &o);
    zt_engine_plan ep;
    zt_engine_plan_for(shape, p->W, &o, &ep);
    out->engine = ep.device_bytes;
    out->model = shape->device_bytes;
    out->fixed = ZT_CUDA_BLAS_DEVICE_BYTES + (p->W > 1 ? NCCL_RESERVE_BYTES : 0);
    shape->ops->destroy(shape);
}

/* The host AdamW's other ways of holding its state that fit in `available` bytes of RAM (bf16 moments,
 * moments on disk, both; without checkpoints when those are what does not fit), as text for the refusal:
 * "--adam-moments bf16 (RAM 98.0 GiB); ...". `other` is the RAM the plan needs besides the engine's. */
static void ram_fixes(const zt_model *shape, int W, const zt_engine_options *o, uint64_t other, uint64_t available,
                      uint64_t staging, char *out, size_t cap)
{
    static const char *const flags[3] = {"--adam-moments bf16", "--moments-dir DIR", "--adam-moments bf16 --moments-dir DIR"};
    size_t used = 0;
    for (int i = 0; i < 3; i++) {
        zt_engine_options x = *o;
        if (i != 1) {
            if (o->moment_dtype == ZT_DTYPE_BF16)
                continue; /* already */
            x.moment_dtype = ZT_DTYPE_BF16;
        }
        if (i != 0) {
            if (o->moments_dir && o->moments_dir[0])
                continue;
            x.moments_dir = "DIR";
        }
        zt_engine_plan xp;
        zt_engine_plan_for(shape, W, &x, &xp);
        const uint64_t need = other + xp.host_bytes;
        const bool fits = need <= available, fits_nockpt = staging && need - staging <= available;
        if (!fits && !fits_nockpt)
            continue;
        char r[32], d[32];
        zt_format_size(fits ? need : need - staging, r, sizeof r);
        zt_format_size(xp.disk_bytes, d, sizeof d);
        used += (size_t)snprintf(out + used, cap - used, "%s%s%s (RAM %s%s%s)", used ? "; " : "", flags[i],
                                 fits ? "" : " --save-every -1", r, xp.disk_bytes ? ", disk " : "",
                                 xp.disk_bytes ? d : "");
        if (used >= cap)
            break;
    }
}

/* The parameters of the largest block of a model's tensor table. */
static uint64_t largest_block(const zt_family_model *tables)
{
    uint64_t most = 0, sum = 0;
    int block = -1;
    for (int i = 0; i < zt_family_model_num_tensors(tables); i++) {
        const zt_param_info *t = zt_family_model_tensor(tables, i);
        if (t->block != block)
            sum = 0, block = t->block;
        sum += t->numel;
        most = sum > most ? sum : most;
    }
    return most;
}

/* Host RAM counted for the process besides its plan (plan.h). */
#define PROCESS_RAM_BYTES ZT_PLAN_PROCESS_RAM_GPU

/* The host RAM a run needs: the engine's arrays with `steady_other` beside them, or at the start with
 * `start_other` (the slab of the initial weights among it), whichever is more. At the start the Adam moments'
 * pages are not taken yet (the first update takes them), and in a fresh run neither are the host gradient's
 * (page-locked once the weights are in) nor the fp32 masters' (the import fills them as it gives the slab's
 * pages back); a resumed run imports its checkpoint beside everything but the moments. */
static uint64_t host_ram(const zt_engine_plan *ep, uint64_t steady_other, uint64_t start_other, bool fresh)
{
    const uint64_t steady = ep->host_bytes + steady_other;
    const uint64_t later = ep->host_moment_bytes + (fresh ? ep->host_late_bytes + ep->host_master_bytes : 0);
    const uint64_t at_start = ep->host_bytes - later + start_other + ep->import_bytes; /* the import's staging */
    return steady > at_start ? steady : at_start;
}

/* The host price of a placement of the state on a GPU run (--host-mem): the engine's host arrays with the
 * rest of the plan's host bytes beside them (host_ram). */
struct gpu_host_pricing {
    const zt_train_config *cfg;
    const zt_model *shape;
    int W;
    zt_engine_options base;
    const zt_family_model *tables; /* the model's tensor table (the checkpoint writer's staging) */
    uint64_t steady_base, start_other, server_ram, gathered; /* steady_base: beside the engine, less the
                                                                checkpoint's staging (gathered: in host arrays) */
};

static void price_gpu_host(void *ctx, const zt_plan_tiers *t, zt_plan_host_price *out)
{
    const struct gpu_host_pricing *p = ctx;
    zt_engine_options o = p->base;
    apply_tiers(p->cfg, t, &o);
    zt_engine_plan ep;
    zt_engine_plan_for(p->shape, p->W, &o, &ep);
    const uint64_t staging = checkpoint_staging(p->cfg, &ep, p->tables, p->gathered);
    out->ram = host_ram(&ep, p->steady_base + staging, p->start_other, !p->cfg->resume[0]);
    out->disk = ep.disk_bytes;
    out->staging = staging;
    char eng[32], pin[32], srv[32], stg[32], proc[32];
    zt_format_size(ep.host_bytes, eng, sizeof eng);
    zt_format_size(ep.host_pinned_bytes, pin, sizeof pin);
    zt_format_size(p->server_ram, srv, sizeof srv);
    zt_format_size(staging, stg, sizeof stg);
    zt_format_size(PROCESS_RAM_BYTES, proc, sizeof proc);
    snprintf(out->parts, sizeof out->parts, "engine %s (%s pinned), state server %s, checkpoint staging %s, process %s",
             eng, pin, srv, stg, proc);
}

/* Plans a run on the GPU before anything large is allocated: the compute dtype, the layout under --gpu-mem
 * (or the GPU's free memory), with an automatic micro-batch the rows per micro-batch (cfg's batch_size and
 * grad_accum change then), and the host and disk bytes, refused when the machine lacks them. Logs the
 * plan. */
static int plan_gpu_run(zt_train_config *cfg, const zt_launch_env *env, enum zt_dtype *dtype, struct layout *lay,
                        zt_err *err)
{
    const int W = env->world_size;
    if (!zt_family_config_has_cuda(&cfg->model))
        return zt_fail(err, ZT_EUNSUPPORTED, "%s models train on the CPU only in this version (their CUDA executor "
                       "is not built yet): train with --device cpu", zt_family_name(&cfg->model));
    int rc = pick_dtype(cfg, env->local_rank, dtype, err);
    zt_family_model *tables = NULL;
    if (rc < 0 || (rc = zt_family_model_create_layout(&tables, &cfg->model, err)) < 0)
        return rc;
    size_t free_b = 0, total_b = 0;
    const bool absent = plan_for_absent_gpu(cfg, env->local_rank);
    if (absent) { /* --plan-only for another machine's GPU: --gpu-mem is all of it */
        free_b = (size_t)cfg->gpu_mem;
        if (env->rank == 0)
            zt_log(ZT_LOG_INFO, "plan: no CUDA device visible: planning for a GPU of --gpu-mem with %s",
                   *dtype == ZT_DTYPE_F32 ? "fp32" : *dtype == ZT_DTYPE_F16 ? "fp16" : "bf16 matrix units (sm_80 or later)");
    } else {
        ZT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    }
    struct pricing p = {.cfg = cfg, .layout = tables, .W = W, .dtype = *dtype};
    const bool opt_gpu = cfg->optimizer == ZT_OPTIMIZER_GPU;
    zt_plan_request q = {
        .cap = cfg->gpu_mem,
        .gpu_free = free_b,
        .weights = cfg->weights,
        .optimizer_on_gpu = opt_gpu,
        .can_chunk = W == 1 || cfg->optimizer_gpu_fraction == 0,
        .can_stream = cfg->zero_level == 3 && cfg->optimizer_gpu_fraction == 0,
        .ckpt_all = cfg->checkpointing == ZT_CKPT_ALL,
        .world = W,
        .micro_batch = (int)cfg->batch_size / W,
        .grad_accum = (int)cfg->grad_accum,
        .seq_len = (int)cfg->seq_len,
        .auto_micro = cfg->auto_micro_batch,
        .price = price_layout,
        .ctx = &p,
    };
    zt_plan_choice ch;
    if ((rc = zt_plan_fit(&q, &ch, err)) < 0)
        goto done;
    const bool is0 = env->rank == 0;
    if (ch.micro_batch != q.micro_batch && is0)
        zt_log(ZT_LOG_INFO, "plan: micro-batch %d rows per rank instead of %d, grad_accum %d instead of %d (the same "
               "%lld tokens per step), to fit", ch.micro_batch, q.micro_batch, ch.grad_accum, q.grad_accum,
               (long long)cfg->batch_size * (long long)cfg->grad_accum * (long long)cfg->seq_len);
    cfg->batch_size = (int64_t)ch.micro_batch * W;
    cfg->grad_accum = ch.grad_accum;
    cfg->auto_micro_batch = false; /* the run directory's config holds what was chosen */
    zt_engine_options o;
    zt_model *shape = shape_of(&p, ch.weights, opt_gpu, ch.micro_batch, false, &o);
    zt_engine_plan ep;
    zt_engine_plan_for(shape, W, &o, &ep);
    lay->stream = o.stream;
    lay->grad_chunk = o.grad_chunk;
    lay->device_budget = cfg->gpu_mem ? ch.limit - ch.device.model - ch.device.fixed : 0;

    /* Host: the engine's buffers (the Adam moments' pages are taken at the first update, after the host
     * slab of the initial weights is given back), the embedded state server's records, the checkpoints'
     * staging (the gathered weights, moments and their Hugging Face copy; with state on disk a few blocks'
     * buffers, the checkpoint streamed from the records). Disk: the NVMe records. */
    const uint64_t P = zt_family_model_num_params(tables);
    const bool embedded = cfg->optimizer == ZT_OPTIMIZER_SERVER && !cfg->servers[0];
    const uint64_t server_ram = embedded && cfg->state_store == ZT_STORE_RAM ? 12 * (uint64_t)ep.shard_elems : 0;
    const uint64_t gathered = cfg->save_every >= 0 ? 16 * P : 0;
    /* At the start the initial weights (4 bytes per parameter) sit beside the engine's arrays (host_ram says
     * which of those are not resident yet), or one block of them where they are made block by block; a
     * resumed run's slab stays until the checkpoint's second import. Read from --init-from's files block by
     * block, the import's staging (the largest tensor of a family that reorders rows) comes beside that block;
     * its check of a tied tensor holds a copy of the target, one tensor, before any block is made, and the
     * files' pages are given back tensor by tensor. */
    const bool fresh = !cfg->resume[0];
    const uint64_t steady_base = server_ram + PROCESS_RAM_BYTES;
    const uint64_t import_staging = cfg->init_from[0] ? zt_family_model_import_staging(tables) : 0;
    const uint64_t lazy_start = largest_block(tables) + import_staging;
    const uint64_t start_other = 4 * (lazy_init(cfg) ? lazy_start : P) + server_ram + PROCESS_RAM_BYTES;
    uint64_t ram = host_ram(&ep, steady_base + checkpoint_staging(cfg, &ep, tables, gathered), start_other, fresh);
    /* --plan-only with --host-mem plans for a machine of that much RAM, not for this one's */
    const uint64_t ram_available = cfg->plan_only && cfg->host_mem ? cfg->host_mem : zt_plan_ram_available();
    if (cfg->host_mem) {
        /* --host-mem: the tiers of the state under the cap (the moments to disk, then the masters) */
        struct gpu_host_pricing hp = {.cfg = cfg, .shape = shape, .W = W, .base = o, .tables = tables,
                                      .steady_base = steady_base, .start_other = start_other,
                                      .server_ram = server_ram, .gathered = gathered};
        zt_plan_host_request hq = {.cap = cfg->host_mem, .has_dir = cfg->moments_dir[0] != '\0',
                                   .can_masters_disk = o.placement == ZT_PLACEMENT_CPU && o.gpu_fraction == 0 &&
                                                       cfg->weights != ZT_WEIGHTS_MASTERS,
                                   .staging = gathered, .price = price_gpu_host, .ctx = &hp};
        zt_plan_host_choice hc;
        if ((rc = zt_plan_fit_host(&hq, &hc, err)) < 0) {
            shape->ops->destroy(shape);
            goto done;
        }
        apply_tiers(cfg, &hc.tiers, &o);
        apply_tiers_layout(&hc.tiers, &o, lay);
        zt_engine_plan_for(shape, W, &o, &ep);
        ram = hc.price.ram;
        ch.device.engine = ep.device_bytes;
        if (is0)
            log_host_tiers(cfg, &hc);
    }
    /* Streamed weights whose compute-dtype host copy does not fit: the masters come up instead (twice the
     * bytes up with bf16, 2 bytes per parameter less RAM; with fp32, 4 less), where the GPU has room for their
     * staging. */
    if (!cfg->host_mem && ram_available > 0 && ram > ram_available && o.stream && !o.stream_masters &&
        o.placement == ZT_PLACEMENT_CPU) {
        zt_engine_options x = o;
        x.stream_masters = true;
        zt_engine_plan xp;
        zt_engine_plan_for(shape, W, &x, &xp);
        const uint64_t xram = host_ram(&xp, steady_base + checkpoint_staging(cfg, &xp, tables, gathered), start_other,
                                       fresh);
        if (xram < ram && ch.device.model + xp.device_bytes + ch.device.fixed <= ch.limit) {
            char before[32], after[32];
            zt_format_size(ram, before, sizeof before);
            zt_format_size(xram, after, sizeof after);
            if (is0)
                zt_log(ZT_LOG_INFO, "plan: the streamed weights come up as the fp32 masters, rounded on the GPU (no "
                       "compute-dtype copy in host memory: RAM %s instead of %s; 4 bytes per parameter up per pass "
                       "instead of 2)", after, before);
            o = x;
            ep = xp;
            ram = xram;
            ch.device.engine = xp.device_bytes;
        }
    }
    /* Moments on disk with RAM to spare: the leading blocks keep theirs in RAM (less disk traffic per step),
     * up to --moments-ram or what the plan leaves free less a margin (4 GiB or 5% of it). */
    if (!cfg->host_mem && o.moments_dir && o.moments_dir[0] && o.placement == ZT_PLACEMENT_CPU && ram_available > 0) {
        const uint64_t margin = ram_available / 20 > ((uint64_t)4 << 30) ? ram_available / 20 : (uint64_t)4 << 30;
        const uint64_t spare = ram_available > ram + margin ? ram_available - ram - margin : 0;
        zt_engine_options x = o;
        x.moments_ram_bytes = cfg->moments_ram ? cfg->moments_ram : spare;
        zt_engine_plan xp;
        zt_engine_plan_for(shape, W, &x, &xp);
        if (xp.moments_ram_blocks > 0) {
            char inram[32], ondisk[32];
            zt_format_size(xp.host_moment_bytes, inram, sizeof inram);
            zt_format_size(xp.disk_bytes, ondisk, sizeof ondisk);
            if (is0)
                zt_log(ZT_LOG_INFO, "plan: the Adam moments of the first %d blocks stay in RAM (%s, %s), the rest "
                       "on disk (%s)", xp.moments_ram_blocks, inram,
                       cfg->moments_ram ? "--moments-ram" : "RAM the plan leaves free", ondisk);
            o = x;
            ep = xp;
            ram = host_ram(&xp, steady_base + checkpoint_staging(cfg, &xp, tables, gathered), start_other, fresh);
        }
    }
    lay->moments_ram_bytes = o.moments_ram_bytes;
    lay->stream_masters = o.stream_masters;
    lay->masters_disk = o.masters_disk;
    lay->masters_ram_bytes = o.masters_ram_bytes;
    lay->host_ram = ram;
    const uint64_t disk = embedded && cfg->state_store == ZT_STORE_NVME
                              ? 12 * (uint64_t)ep.shard_elems + 8192 * (uint64_t)(zt_family_config_layers(&cfg->model) + 2)
                              : ep.disk_bytes;
    const char *disk_dir = ep.disk_bytes ? cfg->moments_dir : cfg->state_store_dir;
    char parts[320], eng[32], pin[32], srv[32], stg[32], proc[32];
    zt_format_size(PROCESS_RAM_BYTES, proc, sizeof proc);
    zt_format_size(ep.host_bytes, eng, sizeof eng);
    zt_format_size(ep.host_pinned_bytes, pin, sizeof pin);
    zt_format_size(server_ram, srv, sizeof srv);
    const uint64_t staging = checkpoint_staging(cfg, &ep, tables, gathered);
    zt_format_size(staging, stg, sizeof stg);
    snprintf(parts, sizeof parts, "engine %s of which %s page-locked, state server %s, checkpoint staging %s%s, "
             "the process %s", eng, pin, srv, stg, staging ? " (--save-every -1 trains without checkpoints)" : "", proc);
    zt_plan_host h = {.ram_needed = ram, .ram_available = ram_available, .disk_needed = disk,
                      .disk_free = disk ? zt_plan_disk_free(disk_dir) : 0,
                      .disk_dir = disk_dir, .ram_parts = parts};
    /* Too little RAM with the host AdamW: what the other ways of holding its state would need. */
    char fixes[512] = "";
    if (h.ram_available > 0 && ram > h.ram_available && o.placement == ZT_PLACEMENT_CPU && o.gpu_fraction == 0)
        ram_fixes(shape, W, &o, ram - ep.host_bytes, h.ram_available, staging, fixes, sizeof fixes);
    h.ram_fixes = fixes;
    shape->ops->destroy(shape);
    if (is0) {
        char all[32], lim[32], e[32], m[32], f[32], need[32], avail[32], dk[32], dfree[32];
        zt_format_size(zt_plan_device_total(&ch.device), all, sizeof all);
        zt_format_size(ch.limit, lim, sizeof lim);
        zt_format_size(ch.device.engine, e, sizeof e);
        zt_format_size(ch.device.model, m, sizeof m);
        zt_format_size(ch.device.fixed, f, sizeof f);
        zt_format_size(ram, need, sizeof need);
        zt_format_size(h.ram_available, avail, sizeof avail);
        zt_format_size(disk, dk, sizeof dk);
        zt_format_size(h.disk_free, dfree, sizeof dfree);
        zt_log(ZT_LOG_INFO, "plan: GPU %s of %s%s per rank: weights %s (engine %s, activations of %d x %lld tokens "
               "%s, cuBLAS and NCCL %s)", all, lim,
               ch.capped ? " (--gpu-mem)" : cfg->gpu_mem ? " free (less than --gpu-mem)" : " free", zt_plan_weights_name(ch.weights),
               e, ch.micro_batch, (long long)cfg->seq_len, m, f);
        zt_log(ZT_LOG_INFO, "plan: host %s of %s available (%s)", need, avail, parts);
        if (disk)
            zt_log(ZT_LOG_INFO, "plan: disk %s of %s free in %s (%s)", dk, dfree, disk_dir,
                   ep.disk_bytes ? (cfg->adam_moments == ZT_MOMENTS_BF16 ? "bf16 Adam moments" : "Adam moments")
                                 : "fp32 masters and Adam moments");
        else
            zt_log(ZT_LOG_INFO, "plan: disk 0 (no state on disk%s)", cfg->servers[0] ? "; the state servers hold it" : "");
    }
    rc = zt_plan_check_host(&h, err);
done:
    zt_family_model_destroy(tables);
    return rc;
}
#endif


/* ---- one run ---- */

/* Everything a run holds, so that one cleanup path frees it. */
struct run {
    zt_train_config *cfg;     /* this run's settings: the given ones, with what the planner chose */
    zt_family_model *host;    /* configuration, tensor table, files; its slab receives checkpoints' weights */
    zt_model *model;          /* the passes the engine drives */
    zt_engine *engine;
    zt_optimizer opt;         /* full-size m and v for checkpoints gathered into host arrays (their pages untouched
                                 otherwise), and the step counters */
    zt_ckpt_reader *reader;   /* a resume that streams its checkpoint into the engine, until it has */
    zt_family_import *import; /* --init-from on a lazy run: the files checked, read as the engine takes each
                                 block, until the engine is created */
    zt_state_client_t *client; /* placement server */
    char *token;
    zt_task *task;            /* what the model learns from: its data, batches and scoring */
    zt_metrics metrics;
    int32_t *tok, *tgt;       /* one global batch */
    int32_t *types;           /* one global batch's token types */
    int32_t *pos;             /* one global batch's positions in packed documents (when the task packs) */
    bool use_scaler;          /* fp16: dynamic loss scaling */
    zt_loss_scaler scaler;
    char run_id[ZT_SERVER_RUN_ID_MAX];
};

static void run_free(struct run *r)
{
    zt_engine_destroy(r->engine);
    if (r->model)
        r->model->ops->destroy(r->model);
    zt_state_client_destroy(r->client);
    free(r->token);
    zt_checkpoint_close(r->reader);
    zt_family_import_close(r->import);
    zt_family_model_destroy(r->host);
    zt_optimizer_free(&r->opt);
    zt_task_close(r->task);
    free(r->types);
    free(r->pos);
    zt_metrics_close(&r->metrics);
    free(r->tok);
    free(r->tgt);
    free(r->cfg);
}

/* A sequence-to-sequence task's decoder side of the batch just read, for this rank's rows from row0. */
static void set_seq2seq(struct run *r, size_t row0)
{
    zt_model_seq2seq s;
    if (zt_task_seq2seq(r->task, (int)row0, &s)) {
        ZT_ASSERT(r->model->ops->set_seq2seq);
        r->model->ops->set_seq2seq(r->model, &s);
    }
}

/* The weight of this rank's gradient in the micro-batch just read: 1 / (grad_accum W) when every rank scores
 * as many targets (causal LM); for a task whose rows hold different numbers of scored targets (masked tokens,
 * labelled examples), the rank's share of the batch's scored targets over grad_accum, so that the step's
 * gradient is that of the mean over all the batch's targets at any number of ranks (each rank's loss is
 * the mean over its own targets). */
static float micro_weight(const struct run *r, size_t off, int b, int T, int accum, int W)
{
    if (!zt_task_weighs_targets(r->task))
        return 1.0f / (float)(accum * W);
    const size_t all = (size_t)r->cfg->batch_size * (size_t)T, mine = (size_t)b * (size_t)T;
    size_t total = 0, local = 0;
    for (size_t i = 0; i < all; i++)
        if (r->tgt[i] != -1) {
            total++;
            local += i >= off && i < off + mine;
        }
    return total ? (float)((double)local / ((double)total * (double)accum)) : 0.0f;
}

/* The validation loss: the task's validation batches (a classifier's whole file, else `batches` global
 * batches from the start of the validation data), each rank taking its rows of every batch (a collective).
 * Tasks that count correct predictions give the mean over the scored rows and the accuracy (the fraction whose
 * highest logit is the target), summed over the ranks' rows; the others the mean of the batches' losses and
 * an accuracy of NAN. */
static int evaluate(struct run *r, zt_comm *comm, int64_t batches, size_t off, int b, int T, float *loss,
                    float *accuracy, zt_err *err)
{
    const bool counted = zt_task_reports_accuracy(r->task);
    batches = zt_task_val_begin(r->task, batches);
    double sums[3] = {0, 0, 0}; /* loss x counted (or the batches' losses), correct, counted */
    for (int64_t i = 0; i < batches; i++) {
        float mean;
        zt_task_next(r->task, true, (uint64_t)i, r->tok, r->tgt, r->types, r->pos);
        if (r->model->ops->set_token_types)
            r->model->ops->set_token_types(r->model, r->types + off);
        set_seq2seq(r, off / (size_t)T);
        const zt_model_docs docs = {.pos = r->pos + off};
        int rc = zt_engine_eval(r->engine, r->tok + off, r->tgt + off, b, T, zt_task_packs(r->task) ? &docs : NULL,
                                &mean, err);
        if (rc < 0)
            return rc;
        if (!counted) {
            sums[0] += mean;
            continue;
        }
        int correct = 0, n = 0;
        r->model->ops->accuracy(r->model, 0, &correct, &n);
        sums[0] += (double)r->model->ops->loss(r->model, 0) * n;
        sums[1] += correct;
        sums[2] += n;
    }
    if (!counted) {
        *loss = (float)(sums[0] / (double)batches);
        *accuracy = NAN;
        return 0;
    }
    float local[3] = {(float)sums[0], (float)sums[1], (float)sums[2]}, all[3];
    memcpy(all, local, sizeof all);
    if (zt_comm_world_size(comm) > 1) {
        zt_err ce;
        if (zt_comm_all_reduce(comm, local, all, 3, ZT_COMM_F32, ZT_COMM_SUM, NULL, &ce) < 0)
            return zt_fail(err, ZT_ESTATE, "%s", ce.msg);
    }
    *loss = all[2] > 0 ? all[0] / all[2] : 0.0f;
    *accuracy = all[2] > 0 ? all[1] / all[2] : 0.0f;
    return 0;
}

/* Rank 0's part of the setup: the run directory (a new run must not land on another run's checkpoints),
 * its config files and metrics.jsonl. */
static int setup_run_dir(struct run *r, const zt_train_config *cfg, int64_t step, bool resumed,
                         zt_train_result *res, zt_err *err)
{
    if (!resumed && file_exists(cfg->out_dir, "latest"))
        return zt_fail(err, ZT_EINVAL_CONFIG, "'%s' already holds a run with checkpoints; continue it with "
                       "--resume %s, or start a new one with another --out directory (or delete this one)",
                       cfg->out_dir, cfg->out_dir);
    int rc = zt_check_writable_dir(cfg->out_dir, err);
    if (rc < 0)
        return rc;
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/config.json", cfg->out_dir);
    if ((rc = zt_train_config_save(cfg, path, "model_config.json", err)) < 0)
        return rc;
    snprintf(path, sizeof path, "%s/model_config.json", cfg->out_dir);
    if ((rc = zt_family_config_save(&cfg->model, path, err)) < 0)
        return rc;
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out_dir);
    if (!resumed)
        return zt_metrics_create(&r->metrics, path, err);
    double first_val = NAN;
    rc = zt_metrics_resume(&r->metrics, path, step, &first_val, err);
    res->first_val_loss = (float)first_val;
    return rc;
}

/* A checkpoint of the gathered state: every rank gathers, the state servers snapshot the step (remote ones
 * keep the moments), rank 0 writes. */
/* Rank 0: whether the run directory's disk holds one more checkpoint (statvfs), before anything is gathered or
 * written; logs the numbers when `log`. */
static int check_checkpoint_space(const struct run *r, const zt_train_config *cfg, bool log, zt_err *err)
{
    const uint64_t need = zt_plan_checkpoint_bytes(zt_family_model_num_params(r->host), cfg->save_grads);
    const uint64_t free_b = zt_plan_disk_free(cfg->out_dir);
    if (log) {
        char n[32], f[32];
        zt_format_size(need, n, sizeof n);
        zt_format_size(free_b, f, sizeof f);
        zt_log(ZT_LOG_INFO, "plan: a checkpoint takes %s in %s (%s free)", n, cfg->out_dir, f);
    }
    return zt_plan_check_checkpoint(need, free_b, cfg->out_dir, err);
}

/* Rank 0: the state of the checkpoint besides the tensors, as the run holds it now. */
static void fill_state(struct run *r, zt_ckpt_state *st)
{
    zt_task_get_position(r->task, &st->data);
    st->adam_step = r->opt.adam_step;
    st->skipped_steps = r->opt.skipped_steps;
    st->loss_scale = r->use_scaler ? r->scaler.scale : 0.0;
    st->loss_scale_clean_steps = r->use_scaler ? r->scaler.clean_steps : 0;
}

/* A checkpoint of state on disk, streamed: every rank reads its records block by block and the blocks are
 * gathered; rank 0 writes each tensor into the checkpoint's files as it arrives, so no rank holds the model's
 * weights and moments in host memory (the engine's and the writer's staging: checkpoint_staging). */
static int save_streamed(struct run *r, const zt_train_config *cfg, zt_ckpt_state *st, zt_comm *comm,
                         zt_train_result *res, zt_err *err)
{
    const bool is0 = zt_comm_rank(comm) == 0;
    zt_ckpt_writer *w = NULL;
    int rc = is0 ? zt_checkpoint_begin(cfg->out_dir, r->host, st->step, &w, err) : 0;
    if ((rc = zt_comm_agree(comm, rc, err)) == 0)
        rc = zt_engine_export_stream(r->engine, w ? zt_checkpoint_put : NULL, w, err);
    if (rc == 0 && cfg->save_grads)
        rc = zt_engine_export_grads(r->engine, zt_family_model_grads(r->host), err);
    if ((rc = zt_comm_agree(comm, rc, err)) < 0) {
        zt_checkpoint_abandon(w);
        return rc;
    }
    if (is0) {
        fill_state(r, st);
        rc = zt_checkpoint_finish(w, cfg->save_grads ? zt_family_model_grads(r->host) : NULL, cfg, st, res->checkpoint,
                                  sizeof res->checkpoint, err);
        if (rc == 0)
            zt_log(ZT_LOG_INFO, "checkpoint: %s (streamed from the state on disk)", res->checkpoint);
    }
    return zt_comm_agree(comm, rc, err);
}

static int save(struct run *r, const zt_train_config *cfg, zt_ckpt_state *st, zt_comm *comm, zt_train_result *res,
                zt_err *err)
{
    const bool remote = cfg->optimizer == ZT_OPTIMIZER_SERVER && cfg->servers[0];
    /* a disk that cannot hold the checkpoint is refused before the state is gathered or a file written */
    int rc = zt_comm_rank(comm) == 0 ? check_checkpoint_space(r, cfg, false, err) : 0;
    if ((rc = zt_comm_agree(comm, rc, err)) < 0)
        return rc;
    if (zt_engine_exports_streamed(r->engine))
        return save_streamed(r, cfg, st, comm, res, err);
    rc = zt_engine_export(r->engine, zt_family_model_params(r->host), r->opt.m, r->opt.v, err);
    if (rc == 0 && cfg->save_grads)
        rc = zt_engine_export_grads(r->engine, zt_family_model_grads(r->host), err);
    if (rc == 0 && remote && zt_comm_rank(comm) == 0)
        rc = zt_engine_server_snapshot(r->engine, NULL, err);
    if (remote && st->step == 0 && (rc = zt_comm_agree(comm, rc, err)) < 0) {
        /* before the first step a server that restarted has lost the run: every rank gives it its initial
         * parameters again, then the snapshot is asked for once more */
        zt_log(ZT_LOG_WARN, "checkpoint of step 0: %s; giving the state servers the run again", err->msg);
        rc = zt_engine_server_restore_initial(r->engine, err);
        if ((rc = zt_comm_agree(comm, rc, err)) == 0 && zt_comm_rank(comm) == 0)
            rc = zt_engine_server_snapshot(r->engine, NULL, err);
    }
    if ((rc = zt_comm_agree(comm, rc, err)) < 0)
        return rc;
    if (zt_comm_rank(comm) == 0) {
        fill_state(r, st);
        rc = zt_checkpoint_save_with_grads(cfg->out_dir, r->host, &r->opt,
                                           cfg->save_grads ? zt_family_model_grads(r->host) : NULL, cfg, st, res->checkpoint,
                                           sizeof res->checkpoint, err);
        if (rc == 0)
            zt_log(ZT_LOG_INFO, "checkpoint: %s", res->checkpoint);
    }
    return zt_comm_agree(comm, rc, err);
}

/* One line of where a step's time went, with the optimizer off the GPU. */
static void log_timing(zt_engine *e, zt_state_client_t *client)
{
    zt_engine_timing t;
    zt_engine_last_timing(e, &t);
    char via[96] = "";
    if (client != NULL)
        zt_state_client_transport(client, via, sizeof via);
    char down[32], up[32];
    zt_format_size(t.bytes_down, down, sizeof down);
    zt_format_size(t.bytes_up, up, sizeof up);
    if (t.server) {
        /* the servers' own AdamW time, where this rank knows it (rank 0, which commits) */
        char own[64] = "";
        if (t.server_update_s >= 0.0)
            snprintf(own, sizeof own, "AdamW on the servers %.3f s, ", t.server_update_s);
        /* the pulled bytes this rank copied besides the servers' own copies: none when they write into its memory */
        char copied[32];
        zt_format_size(t.bytes_pull_copied, copied, sizeof copied);
        /* the wire's MiB are greppable as "wire N MiB" (bench/server/cpu_placement.sh reads them) */
        zt_log(ZT_LOG_INFO, "engine: step %.3f s | server push %.3f s (during the backward; waited %.3f s after it) | "
               "server update %.3f s (%sduring the forward; waited %.3f s for its answer) | pull %.3f s (behind the "
               "update, into the forward; worker copies %s in %.3f s) | waited for pulled blocks %.3f s | "
               "waited for the backward and norm %.3f s | wire %.1f MiB pushed + pulled (via %s) | copied down %s, up %s",
               t.step, t.push_s, t.push_wait_s, t.update_s, own, t.commit_wait_s, t.pull_s, copied, t.pull_copy_s,
               t.wait_update, t.wait_norm,
               (double)(t.bytes_pushed + t.bytes_pulled) / (1024.0 * 1024.0), via[0] ? via : "embedded", down, up);
        return;
    }
    char disk[192] = "";
    if (t.disk) {
        /* "disk read waited" and "disk write waited" are the update's waits that the passes may wait for behind it */
        char rd[32], wr[32];
        zt_format_size(t.disk_bytes_read, rd, sizeof rd);
        zt_format_size(t.disk_bytes_written, wr, sizeof wr);
        snprintf(disk, sizeof disk, " | disk read waited %.3f s, disk write waited %.3f s, behind the last block "
                 "%.3f s (%s read, %d record%s read ahead, %s written)", t.disk_read_wait, t.disk_write_wait,
                 t.disk_behind, rd, t.disk_read_ahead, t.disk_read_ahead == 1 ? "" : "s", wr);
    }
    zt_log(ZT_LOG_INFO, "engine: step %.3f s | host update %.3f s (overlaps the next step) | waited for updated "
           "blocks %.3f s | waited for the backward and norm %.3f s | copied down %s, up %s%s",
           t.step, t.host_update, t.wait_update, t.wait_norm, down, up, disk);
}

/* This process's resident memory as /proc/self/status counts it (bytes; 0 where unknown): the peak (VmHWM),
 * now (VmRSS) and what it is now by kind: anonymous (heap, page-locked buffers), file-backed (binaries,
 * libraries, mapped files, a page cache that a buffered store maps), shared memory. */
typedef struct rss_now {
    uint64_t peak, now, anon, file, shmem;
} rss_now;

static void read_rss(rss_now *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long kib;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            m->peak = (uint64_t)kib << 10;
        else if (sscanf(line, "VmRSS: %llu kB", &kib) == 1)
            m->now = (uint64_t)kib << 10;
        else if (sscanf(line, "RssAnon: %llu kB", &kib) == 1)
            m->anon = (uint64_t)kib << 10;
        else if (sscanf(line, "RssFile: %llu kB", &kib) == 1)
            m->file = (uint64_t)kib << 10;
        else if (sscanf(line, "RssShmem: %llu kB", &kib) == 1)
            m->shmem = (uint64_t)kib << 10;
    }
    fclose(f);
}

/* One line of the host memory at a point of the run against the plan (greppable: "memory: <when>: peak RSS"),
 * so that memory the plan does not count shows where it is taken. Returns the peak. */
static uint64_t log_rss(const char *when, uint64_t planned, uint64_t cap, bool is0)
{
    rss_now m;
    read_rss(&m);
    if (!is0)
        return m.peak;
    char peak[32], now[32], anon[32], file[32], shm[32], plan[32], capt[32];
    zt_format_size(m.peak, peak, sizeof peak);
    zt_format_size(m.now, now, sizeof now);
    zt_format_size(m.anon, anon, sizeof anon);
    zt_format_size(m.file, file, sizeof file);
    zt_format_size(m.shmem, shm, sizeof shm);
    zt_format_size(planned, plan, sizeof plan);
    zt_format_size(cap, capt, sizeof capt);
    zt_log(cap && m.peak > cap ? ZT_LOG_WARN : ZT_LOG_INFO, "memory: %s: peak RSS %s, RSS %s (anon %s, file %s, "
           "shmem %s); the plan's host %s%s%s%s", when, peak, now, anon, file, shm, planned ? plan : "-",
           cap ? " of --host-mem " : "", cap ? capt : "", cap && m.peak > cap ? ": the peak is above the cap" : "");
    return m.peak;
}

/* One training run on an established communicator: from the start or cfg->resume to cfg->steps. When a
 * step fails because a state server holds an older step (the same on every rank), res->rewind_to
 * receives that step. */
static int train_once(const zt_train_config *given, const zt_launch_env *env, zt_comm *comm, zt_train_result *res,
                      zt_err *err)
{
    memset(res, 0, sizeof *res);
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    res->last_val_accuracy = NAN;
    res->rewind_to = -1;
    struct run r;
    memset(&r, 0, sizeof r);
    r.cfg = zt_xmalloc(sizeof *r.cfg);
    *r.cfg = *given;
    zt_train_config *const cfg = r.cfg;
    const int W = env->world_size, rank = env->rank, T = (int)cfg->seq_len;
    const bool is0 = rank == 0, on_gpu = cfg->device == ZT_DEVICE_CUDA;
    const bool on_servers = cfg->optimizer == ZT_OPTIMIZER_SERVER;
    int rc;
    if (is0) {
        zt_train_config_log(cfg);
        zt_log(ZT_LOG_INFO, "threads: %d per rank, %d rank%s", zt_cpu_get_threads(), W, W == 1 ? "" : "s");
    }

    /* On a GPU, the memory plan comes first: it may refuse, or lower the micro-batch. */
    enum zt_dtype dtype = ZT_DTYPE_F32;
    struct layout lay = {0};
    /* --plan-only reads no data and asks no server: it prints the plan below and stops */
    if (!cfg->plan_only && (rc = zt_comm_agree(comm, zt_task_check_paths(cfg, err), err)) < 0)
        goto out;
    /* The state servers first: a server that cannot take this run's checkpoints refuses it before anything
     * is built. */
    if (on_servers && !cfg->plan_only) {
        rc = state_client_create(cfg, &r.client, &r.token, err);
        if (rc == 0 && is0 && cfg->servers[0] && cfg->save_every >= 0) {
            char why[96];
            snprintf(why, sizeof why, "this run writes checkpoints (--save-every %lld)", (long long)cfg->save_every);
            rc = zt_state_client_check_snapshots(r.client, why, err);
        }
        if ((rc = zt_comm_agree(comm, rc, err)) < 0)
            goto out;
        if (is0 && hooks.on_state_client)
            hooks.on_state_client(hooks.user, r.client);
    }
#ifdef ZT_WITH_CUDA
    rc = on_gpu ? plan_gpu_run(cfg, env, &dtype, &lay, err) : 0;
    if ((rc = zt_comm_agree(comm, rc, err)) < 0)
        goto out;
#else
    if (on_gpu && cfg->plan_only) { /* the GPU's plan is the CUDA build's */
        rc = no_cuda_backend(err);
        goto out;
    }
#endif
    if (cfg->plan_only) {
        if (is0)
            zt_log(ZT_LOG_INFO, "plan: --plan-only: the run fits as planned above; nothing was allocated, read or "
                   "trained (drop --plan-only to train)");
        rc = 0;
        goto out;
    }
    const int B = (int)cfg->batch_size, accum = (int)cfg->grad_accum, b = B / W;

    /* The host model keeps the layout, the parameters and the files; on the GPU it never runs, so its
     * activations are sized for one token. A new run on GPUs from the family's initialisation makes its
     * initial weights block by block as the engine takes them (and gives them back). */
    const bool lazy = lazy_init(cfg);
    if ((rc = (lazy ? zt_family_model_create_lazy : zt_family_model_create)(&r.host, &cfg->model, on_gpu ? 1 : b,
                                                                          on_gpu ? 1 : T, (uint64_t)cfg->seed, err)) < 0)
        goto out;
    if (is0)
        log_model(r.host, cfg);
    if ((rc = zt_optimizer_init(&r.opt, zt_family_model_num_params(r.host), cfg->beta1, cfg->beta2, cfg->eps,
                                cfg->weight_decay, cfg->grad_clip, err)) < 0)
        goto out;

    /* Data: every rank reads the global batches and trains on its rows. */
    int64_t eval_batches = cfg->eval_batches;
    if ((rc = zt_task_open(&r.task, cfg, B, T, is0, &eval_batches, err)) < 0)
        goto out;
    r.tok = zt_xmalloc((size_t)B * (size_t)T * sizeof(int32_t));
    r.tgt = zt_xmalloc((size_t)B * (size_t)T * sizeof(int32_t));
    r.types = zt_xcalloc((size_t)B * (size_t)T, sizeof(int32_t));
    r.pos = zt_xcalloc((size_t)B * (size_t)T, sizeof(int32_t));

    /* Starting state: fresh, from init_from, or from a checkpoint. */
    zt_schedule sched = {.kind = cfg->schedule, .lr = cfg->lr, .min_lr = cfg->min_lr,
                         .warmup_steps = cfg->warmup_steps, .total_steps = cfg->steps, .gamma = cfg->lr_gamma};
    zt_ckpt_state st;
    memset(&st, 0, sizeof st);
    zt_rng_seed(&st.rng, (uint64_t)cfg->seed);
    const bool resumed = cfg->resume[0] != '\0';
    /* State on disk (--moments-dir: the host AdamW's records) or under --host-mem: the checkpoint is verified
     * here, before anything is touched, and read into the engine tensor by tensor once it exists, so that the
     * host never holds the model's weights and moments at once; otherwise it is loaded into the host arrays
     * (the state servers take theirs from there) */
    const bool load_streamed = streams_resume(cfg);
    if (resumed) {
        char dir[PATH_CAP];
        if ((rc = zt_checkpoint_find(cfg->resume, dir, sizeof dir, err)) < 0 ||
            (rc = zt_trainer_check_resume_placement(dir, cfg, err)) < 0)
            goto out;
        rc = load_streamed ? zt_checkpoint_open(dir, r.host, &r.opt, &st, &r.reader, err)
                           : zt_checkpoint_load(dir, r.host, &r.opt, &st, err);
        if (rc < 0)
            goto out;
        if (st.step >= cfg->steps) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint %s is at step %lld and the run is configured for %lld "
                         "steps: nothing to do; raise --steps to train further", dir, (long long)st.step,
                         (long long)cfg->steps);
            goto out;
        }
        zt_err pos_err;
        rc = zt_task_set_position(r.task, &st.data, &pos_err);
        if (rc < 0) {
            rc = zt_fail(err, rc, "resume from %s: %s (keep batch_size, seq_len and train_data of the run)", dir,
                         pos_err.msg);
            goto out;
        }
        if (is0) {
            warn_schedule_change(&st.schedule, &sched);
            if (cfg->init_from[0])
                zt_log(ZT_LOG_WARN, "resume: init_from '%s' is ignored: the parameters come from the checkpoint",
                       cfg->init_from);
            zt_log(ZT_LOG_INFO, "resume: continuing from %s at step %lld (data epoch %llu, shard %llu, window %llu)",
                   dir, (long long)st.step, (unsigned long long)st.data.epoch, (unsigned long long)st.data.shard,
                   (unsigned long long)st.data.window);
        }
    } else if (cfg->init_from[0]) {
        /* a lazy run's import is checked whole here and read into the slab block by block as the engine takes
         * each (fill_host_block) */
        rc = lazy ? zt_family_model_import_open(r.host, cfg->init_from, &r.import, err)
                  : zt_family_model_import(r.host, cfg->init_from, err);
        if (rc < 0)
            goto out;
        if (is0 && lazy)
            zt_log(ZT_LOG_INFO, "model: parameters from %s (checked; read as the engine takes each block)",
                   cfg->init_from);
        else if (is0)
            zt_log(ZT_LOG_INFO, "model: parameters initialised from %s", cfg->init_from);
    }
    st.schedule = sched;
    /* every rank has read its inputs; rank 0 prepares the run directory; all go on only if all succeeded */
    rc = is0 ? setup_run_dir(&r, cfg, st.step, resumed, res, err) : 0;
    if (rc == 0 && is0 && cfg->save_every >= 0)
        rc = check_checkpoint_space(&r, cfg, true, err);
    if ((rc = zt_comm_agree(comm, rc, err)) < 0)
        goto out;

    /* The model's passes and the engine around them. */
    rc = create_model(cfg, r.host, b, T, dtype, &r.model, err);
    if ((rc = zt_comm_agree(comm, rc, err)) < 0)
        goto out;
    if (!on_gpu) {
        /* on the CPU, state on disk goes through the host AdamW's arrays: the weights are streamed from them */
        lay.stream = cfg->moments_dir[0] != '\0';
        lay.moments_ram_bytes = cfg->moments_ram;
        if (cfg->host_mem && (rc = zt_comm_agree(comm, plan_cpu_host(cfg, W, is0, r.model, r.host, &lay, err), err)) < 0)
            goto out;
    }
    zt_engine_options eo;
    engine_options(cfg, accum, &eo);
    eo.stream = lay.stream;
    eo.masters_disk = lay.masters_disk;
    eo.masters_ram_bytes = lay.masters_ram_bytes;
    if (lay.moments_ram_only)
        eo.moments_dir = NULL;
    eo.stream_masters = lay.stream_masters;
    eo.moments_ram_bytes = lay.moments_ram_bytes;
    eo.grad_chunk = lay.grad_chunk;
    eo.device_budget = lay.device_budget;
    /* a new run on GPUs reads the initial weights once: the engine gives their pages back as it takes them,
     * so the start holds one copy (a resumed run imports the checkpoint's slab again below) */
    eo.release_host_params = on_gpu && !resumed;
    lazy_fill fill = {.host = r.host, .import = r.import};
    eo.fill_host_block = lazy ? fill_host_block : NULL;
    eo.fill_host_ctx = &fill;
    zt_trainer_run_id(cfg->out_dir, r.run_id, sizeof r.run_id);
    if (on_servers) {
        eo.client = r.client;
        eo.run_id = r.run_id;
    }
    /* a streamed resume's engine starts empty: the checkpoint fills it below, after the slab is given back */
    rc = zt_engine_create(&r.engine, r.model, comm, &eo, load_streamed ? NULL : zt_family_model_params(r.host), err);
    zt_family_import_close(r.import); /* every block read (or the engine refused) */
    r.import = NULL;
    if (rc == 0 && resumed && !load_streamed)
        rc = zt_engine_import(r.engine, zt_family_model_params(r.host), r.opt.m, r.opt.v, err);
    if (rc == 0 && on_servers)
        rc = zt_engine_attach_server(r.engine, st.step, st.adam_step, resumed, NULL, err);
    if ((rc = zt_comm_agree(comm, rc, err)) < 0) {
        if (on_servers && zt_engine_server_step(r.engine) >= 0)
            res->rewind_to = zt_engine_server_step(r.engine);
        goto out;
    }
    /* the engine holds the weights; checkpoints write the slab again. A streamed resume gives back the initial
     * weights on CPU ranks too: nothing reads them (the passes read the engine's) */
    if (on_gpu || load_streamed)
        zt_family_model_release_params(r.host);
    if (load_streamed) {
        rc = zt_engine_import_stream(r.engine, zt_checkpoint_read, r.reader, err);
        zt_checkpoint_close(r.reader);
        r.reader = NULL;
        if ((rc = zt_comm_agree(comm, rc, err)) < 0)
            goto out;
        res->load_streamed = true;
        if (is0) {
            char stage[32];
            zt_format_size(zt_engine_import_stream_bytes(r.engine) + zt_checkpoint_read_bytes(r.host), stage,
                           sizeof stage);
            zt_log(ZT_LOG_INFO, "resume: the checkpoint read into the engine block by block (%s of staging)", stage);
        }
    }
    (void)log_rss("the engine created", lay.host_ram, cfg->host_mem, is0);
    if (is0) {
        zt_engine_log_plan(r.engine);
        if (on_servers)
            zt_log(ZT_LOG_INFO, "optimizer: AdamW on %s%s, run '%s' at step %lld",
                   cfg->servers[0] ? "the state servers " : "the embedded state server",
                   cfg->servers[0] ? cfg->servers : cfg->state_store == ZT_STORE_NVME ? " (NVMe)" : " (RAM)",
                   r.run_id, (long long)st.step);
    }
    if (dtype == ZT_DTYPE_F16) {
        r.use_scaler = true;
        r.opt.loss_scaled = true;
        zt_loss_scaler_init(&r.scaler, cfg->loss_scale, cfg->min_loss_scale, cfg->loss_scale_window);
        if (resumed && st.loss_scale > 0) {
            r.scaler.scale = st.loss_scale;
            r.scaler.clean_steps = st.loss_scale_clean_steps;
        }
        if (is0)
            zt_log(ZT_LOG_INFO, "fp16: dynamic loss scale %g (x2 after %lld clean steps, /2 on overflow, min %g)",
                   r.scaler.scale, (long long)r.scaler.window, r.scaler.min_scale);
    }
    res->start_step = st.step;
    res->end_step = st.step;
    res->skipped_steps = st.skipped_steps;
    res->losses = zt_xcalloc((size_t)(cfg->steps - st.step) + 1, sizeof(float));
    const size_t off = (size_t)rank * (size_t)b * (size_t)T;

    /* Remote state servers: a checkpoint of step 0 (they snapshot the run with it), so that a server that
     * restarts before the first checkpoint has a step to go back to, and the run a checkpoint to resume
     * from. */
    if (on_servers && cfg->servers[0] && !resumed && cfg->save_every >= 0) {
        if ((rc = save(&r, cfg, &st, comm, res, err)) < 0)
            goto out;
    }

    /* The starting validation loss, so that the curve has its origin. */
    const bool has_val = zt_task_has_val(r.task);
    if (has_val && !resumed) {
        float vl, acc;
        if ((rc = evaluate(&r, comm, eval_batches, off, b, T, &vl, &acc, err)) < 0)
            goto out;
        res->first_val_loss = res->last_val_loss = vl;
        res->last_val_accuracy = acc;
        if (is0) {
            log_eval(0, vl, acc);
            rc = zt_metrics_write_eval(&r.metrics, 0, vl, acc, err);
        }
        if ((rc = zt_comm_agree(comm, rc, err)) < 0)
            goto out;
    }

    const double start = zt_now_s();
    const double elapsed_before = st.elapsed_s;
    const double step_tokens = (double)B * (double)T * (double)accum;
    double train_time = 0.0, window_time = 0.0, window_tokens = 0.0;
    int64_t steps_run = 0;
    /* ZT_GPU_PROFILE=N (a diagnostic): from step N on, time every kernel family (logged at the end). */
    const char *profile_env = getenv("ZT_GPU_PROFILE");
    const int64_t profile_from = profile_env ? atoll(profile_env) : 0;
    /* the optimizer off the GPU, on servers, or on the CPU with its state on disk (the host AdamW's thread) */
    const bool offloaded = (on_gpu && cfg->optimizer != ZT_OPTIMIZER_GPU) || on_servers || zt_engine_exports_streamed(r.engine);

    for (int64_t step = st.step + 1; step <= cfg->steps; step++) {
        const double t0 = zt_now_s();
        const double lr = zt_schedule_lr(&sched, step);
        if (profile_from > 0 && step == profile_from)
            zt_engine_set_profiling(r.engine, true);
        const float scale = r.use_scaler ? (float)r.scaler.scale : 1.0f;
        for (int a = 0; a < accum && rc == 0; a++) {
            zt_task_next(r.task, false, ((uint64_t)step << 20) + (uint64_t)a, r.tok, r.tgt, r.types, r.pos);
            if (r.model->ops->set_token_types)
                r.model->ops->set_token_types(r.model, r.types + off);
            set_seq2seq(&r, off / (size_t)T);
            const zt_model_docs docs = {.pos = r.pos + off};
            rc = zt_engine_micro(r.engine, r.tok + off, r.tgt + off, b, T, zt_task_packs(r.task) ? &docs : NULL, a,
                                 micro_weight(&r, off, b, T, accum, W), scale, err);
        }
        zt_engine_step_result sr;
        if (rc == 0)
            rc = zt_engine_step(r.engine, (float)lr, r.opt.adam_step + 1, &sr, err);
        if (rc < 0) {
            if (on_servers && zt_engine_server_step(r.engine) >= 0) {
                res->rewind_to = zt_engine_server_step(r.engine);
                rc = zt_fail(err, ZT_ESTATE, "a state server of run '%s' holds step %lld while this run is at step "
                             "%lld (it restarted from its last snapshot); the steps after %lld are lost: continue with "
                             "`ztrain train --resume %s/ckpt_%06lld` and the same flags", r.run_id,
                             (long long)res->rewind_to, (long long)step - 1, (long long)res->rewind_to, cfg->out_dir,
                             (long long)res->rewind_to);
            }
            goto out;
        }
        zt_optimizer_report rep;
        if ((rc = zt_optimizer_account(&r.opt, sr.loss, sr.grad_norm, sr.skipped, &rep, err)) < 0)
            goto out;
        if (r.use_scaler)
            zt_loss_scaler_after_step(&r.scaler, &rep, sr.loss, is0);
        const double dt = zt_now_s() - t0;
        steps_run++;
        train_time += dt;
        window_time += dt;
        window_tokens += step_tokens;
        st.step = step;
        res->end_step = step;
        res->losses[step - res->start_step - 1] = sr.loss;
        res->skipped_steps = r.opt.skipped_steps;
        const double elapsed = elapsed_before + (zt_now_s() - start);
        const bool last = step == cfg->steps;
        int mrc = 0; /* rank 0's metrics.jsonl writes */
        zt_err merr = {{0}};
        if (is0) {
            if (step == res->start_step + 1 && zt_engine_measured_device_bytes(r.engine) > 0) {
                char pl[32], me[32];
                zt_format_size(zt_engine_plan_device_bytes(r.engine), pl, sizeof pl);
                zt_format_size(zt_engine_measured_device_bytes(r.engine), me, sizeof me);
                zt_log(ZT_LOG_INFO, "engine: GPU memory in use after the first step %s (plan %s; the rest is the CUDA "
                       "context's, cuBLAS's and NCCL's)", me, pl);
            }
            if (rep.skipped)
                zt_log(ZT_LOG_WARN, "step %lld skipped: loss %g, grad norm %g is not finite (%d in a row; the run "
                       "stops at %d)", (long long)step, (double)sr.loss, rep.grad_norm, r.opt.bad_in_a_row,
                       ZT_OPTIMIZER_MAX_BAD_STEPS);
            zt_metrics_train line = {.step = step, .loss = sr.loss, .lr = lr, .grad_norm = rep.grad_norm,
                                     .tokens_per_s = dt > 0 ? step_tokens / dt : 0.0, .elapsed_s = elapsed,
                                     .skipped = rep.skipped};
            mrc = zt_metrics_write_train(&r.metrics, &line, &merr);
            if (step % cfg->log_every == 0 || step == res->start_step + 1 || last) {
                double per_step = (zt_now_s() - start) / (double)steps_run;
                log_progress(step, cfg->steps, sr.loss, lr, rep.grad_norm,
                             window_time > 0 ? window_tokens / window_time : 0, elapsed,
                             per_step * (double)(cfg->steps - step));
                if (offloaded)
                    log_timing(r.engine, r.client);
                if (steps_run <= 2) { /* the first updates take the pages of the state they write */
                    char when[48];
                    snprintf(when, sizeof when, "step %lld", (long long)step);
                    (void)log_rss(when, lay.host_ram, cfg->host_mem, is0);
                }
                window_time = 0.0;
                window_tokens = 0.0;
            }
        }
        if (has_val && ((cfg->eval_every > 0 && step % cfg->eval_every == 0) || last)) {
            float vl, acc;
            if ((rc = evaluate(&r, comm, eval_batches, off, b, T, &vl, &acc, err)) < 0)
                goto out;
            res->last_val_loss = vl;
            res->last_val_accuracy = acc;
            if (isnan(res->first_val_loss))
                res->first_val_loss = vl;
            if (is0) {
                log_eval(step, vl, acc);
                if (mrc == 0)
                    mrc = zt_metrics_write_eval(&r.metrics, step, vl, acc, &merr);
            }
        }
        /* A stop request on any rank (or a metrics failure on rank 0) stops every rank after this step. */
        float flag = mrc < 0 ? 2.0f : stop_requested ? 1.0f : 0.0f, any = flag;
        stop_requested = 0;
        zt_err ce;
        if (W > 1 && zt_comm_all_reduce(comm, &flag, &any, 1, ZT_COMM_F32, ZT_COMM_MAX, NULL, &ce) < 0) {
            rc = zt_fail(err, ZT_ESTATE, "%s", ce.msg);
            goto out;
        }
        if (any >= 2.0f) {
            rc = mrc < 0 ? zt_fail(err, mrc, "%s", merr.msg)
                         : zt_fail(err, ZT_ESTATE, "rank 0 could not write metrics.jsonl (its log says why); "
                                   "stopping with it");
            goto out;
        }
        const bool stop = any > 0 || (cfg->stop_at_step > 0 && step >= cfg->stop_at_step);
        if (cfg->save_every >= 0 && ((cfg->save_every > 0 && step % cfg->save_every == 0) || last || stop)) {
            st.elapsed_s = elapsed_before + (zt_now_s() - start);
            if ((rc = save(&r, cfg, &st, comm, res, err)) < 0)
                goto out;
        }
        if (is0 && hooks.after_step)
            hooks.after_step(hooks.user, step);
        if (stop && !last) {
            res->interrupted = true;
            if (is0)
                zt_log(ZT_LOG_WARN, "stopped after step %lld/%lld; resume with: ztrain train --resume %s",
                       (long long)step, (long long)cfg->steps, cfg->out_dir);
            break;
        }
    }
    stop_requested = 0; /* a request that came with the last step needs no stop */
    if (profile_from > 0 && is0)
        zt_engine_profile_report(r.engine);
    res->peak_rss_bytes = log_rss("the end of training", lay.host_ram, cfg->host_mem, is0);
    res->plan_host_bytes = lay.host_ram;
    res->seconds = zt_now_s() - start;
    res->tokens_per_s = train_time > 0 ? step_tokens * (double)steps_run / train_time : 0.0;
    if (is0 && !res->interrupted) {
        char took[32];
        zt_format_duration(res->seconds, took, sizeof took);
        if (has_val && zt_task_reports_accuracy(r.task))
            zt_log(ZT_LOG_INFO, "done: %lld steps in %s, %.0f tok/s; val loss %.4f -> %.4f, accuracy %.4f; checkpoint "
                   "%s", (long long)steps_run, took, res->tokens_per_s, (double)res->first_val_loss,
                   (double)res->last_val_loss, (double)res->last_val_accuracy, res->checkpoint);
        else if (has_val)
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
    run_free(&r);
    return rc;
}

/* Checks what depends on the number of ranks, before any rank starts work. */
static int check_ranks(const zt_train_config *cfg, const zt_launch_env *env, zt_err *err)
{
    const int W = env->world_size;
    if (W == 1)
        return 0;
    /* The embedded state server lives inside one process; ranks are separate processes. */
    if (cfg->optimizer == ZT_OPTIMIZER_SERVER && cfg->servers[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "--optimizer server with WORLD_SIZE=%d needs state servers the ranks "
                       "can reach: start `ztrain-server --listen 127.0.0.1:7070 --snapshot-dir DIR` and pass "
                       "--servers 127.0.0.1:7070 (the embedded server lives inside one process: use it with one "
                       "rank, WORLD_SIZE=1)", W);
#ifndef ZT_WITH_NCCL
    if (cfg->device == ZT_DEVICE_CUDA)
        return zt_fail(err, ZT_EUNSUPPORTED, "--device cuda with WORLD_SIZE=%d: this ztrain was built without NCCL "
                       "(rebuild with -DZT_CUDA=ON where the CUDA toolkit and NCCL are installed, or train with "
                       "--device cpu)", W);
#endif
    if (cfg->batch_size % W != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "batch_size %lld does not split over WORLD_SIZE=%d ranks: use a batch "
                       "size that is a multiple of %d (--batch-size)", (long long)cfg->batch_size, W, W);
    return 0;
}

/* Runs training as cfg says with the ranks of the launch environment; see trainer.h. A state server that
 * restarted from an older snapshot makes a step fail on every rank with the server's step in
 * res->rewind_to: training continues from the checkpoint of that step (the servers snapshot at every
 * checkpoint), ZT_TRAIN_MAX_REWINDS times at most; the ranks agree on going on, since one of them may
 * not find the checkpoint. */
int zt_trainer_run(const zt_train_config *cfg, zt_train_result *res, zt_err *err)
{
    memset(res, 0, sizeof *res);
    res->first_val_loss = NAN;
    res->last_val_loss = NAN;
    res->last_val_accuracy = NAN;
    res->rewind_to = -1;
    zt_launch_env env;
    int rc = zt_launch_env_parse(NULL, &env, err);
    if (rc < 0)
        return rc;
    zt_log_set_rank(env.world_size > 1 ? env.rank : -1);
    if ((rc = zt_train_config_validate(cfg, err)) < 0 || (rc = check_ranks(cfg, &env, err)) < 0)
        return rc;
    /* threads = 0: share the cores between the ranks of this host, since the collectives wait for the
     * slowest rank and every rank would otherwise start one thread per core. */
    int threads = (int)cfg->threads;
    if (threads == 0 && env.local_world_size > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cores / env.local_world_size);
        if (threads < 1)
            threads = 1;
    }
    zt_cpu_set_threads(threads);

    zt_comm *comm = NULL;
    if (env.world_size == 1) {
        zt_comm_options co;
        zt_comm_options_init(&co);
        co.backend = ZT_COMM_SELF;
        rc = zt_comm_create(&comm, &co, err);
    } else {
        /* GPUs: NCCL on device LOCAL_RANK; the CPU: the shared-memory backend */
        const bool gpu = cfg->device == ZT_DEVICE_CUDA;
        /* (--plan-only plans each rank's memory: no GPU collective is needed, nor a GPU) */
        rc = zt_startup_comm(&env, gpu && !cfg->plan_only ? ZT_COMM_NCCL : ZT_COMM_SHM, zt_trainer_config_hash(cfg),
                             gpu ? env.local_rank : 0, &comm, err);
    }
    if (rc < 0)
        return rc;
    zt_train_config *again = zt_xmalloc(sizeof *again);
    *again = *cfg;
    for (int rewinds = 0;; rewinds++) {
        rc = train_once(again, &env, comm, res, err);
        if (rc != ZT_ESTATE || res->rewind_to < 0)
            break;
        char ckpt[sizeof again->resume];
        const int64_t to = res->rewind_to;
        rc = zt_trainer_rewind_target(again, res, rewinds, ckpt, sizeof ckpt, err);
        if ((rc = zt_comm_agree(comm, rc, err)) < 0)
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
