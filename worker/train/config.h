/* The training configuration of `ztrain train`: one struct holding every setting, filled from defaults
 * (zt_train_config_init), then a JSON file (zt_train_config_load_file), then command-line flags
 * (zt_train_config_set_flag); then zt_train_config_resolve reads the model's config and fills the settings
 * left on "auto", and everything is checked in one place (zt_train_config_validate). The trainer prints it at start
 * (zt_train_config_log) and saves it into the run directory (zt_train_config_save).
 *
 * Paths inside a config file are relative to that file's folder; paths given as flags are relative to
 * the current directory. Both are stored here ready to open from the current directory. */
#ifndef ZT_WORKER_TRAIN_CONFIG_H
#define ZT_WORKER_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/family.h"
#include "worker/train/schedule.h"

#define ZT_TRAIN_PATH_MAX 1024
/* The value of an integer setting that zt_train_config_resolve computes from the others. */
#define ZT_TRAIN_AUTO (-1)

/* Typed settings: each is read from and saved as its name ("cuda", "bf16", ...), parsed and checked in
 * config.c only. The values are ztrain's own (not saved as numbers). */
enum zt_train_device { ZT_DEVICE_CPU = 0, ZT_DEVICE_CUDA = 1 };
enum zt_train_precision { ZT_PRECISION_AUTO = 0, ZT_PRECISION_FP32 = 1, ZT_PRECISION_BF16 = 2, ZT_PRECISION_FP16 = 3 };
enum zt_train_optimizer { ZT_OPTIMIZER_AUTO = 0, ZT_OPTIMIZER_GPU = 1, ZT_OPTIMIZER_CPU = 2, ZT_OPTIMIZER_SERVER = 3 };
enum zt_train_ckpt { ZT_CKPT_NONE = 0, ZT_CKPT_ALL = 1, ZT_CKPT_EVERY = 2 };
enum zt_train_store { ZT_STORE_RAM = 0, ZT_STORE_NVME = 1 };
/* Where the compute-dtype weights live between passes: auto (on the GPU unless --gpu-mem needs them in host
 * memory), gpu, host (streamed to the GPU block by block, in the forward and again in the backward), or
 * masters (streamed as the fp32 masters of the host AdamW and rounded on the GPU: no compute-dtype copy in
 * host memory, twice the bytes up; auto and host switch to it when RAM is short). */
enum zt_train_weights { ZT_WEIGHTS_AUTO = 0, ZT_WEIGHTS_GPU = 1, ZT_WEIGHTS_HOST = 2, ZT_WEIGHTS_MASTERS = 3 };
/* The Adam moments' storage: fp32, or bf16 with stochastic rounding (half the bytes; --optimizer cpu). */
enum zt_train_moments { ZT_MOMENTS_FP32 = 0, ZT_MOMENTS_BF16 = 1 };
/* Supervised fine-tuning: what happens to an example longer than seq_len (cut to its first seq_len tokens, or
 * the run refused, naming the first such line). */
enum zt_train_overlong { ZT_OVERLONG_TRUNCATE = 0, ZT_OVERLONG_REFUSE = 1 };
/* Remote state servers on this host: auto moves the pushed and pulled bytes through shared memory where the
 * server accepts it (TCP elsewhere), off keeps everything on TCP (worker/state/client.h). */
enum zt_train_server_shm { ZT_SERVER_SHM_AUTO = 0, ZT_SERVER_SHM_OFF = 1 };

/* The name of a typed setting's value, as configs and flags spell it ("cpu", "cuda", "auto", "fp32", ...).
 * Never NULL. */
const char *zt_train_device_name(enum zt_train_device d);
const char *zt_train_precision_name(enum zt_train_precision p);
const char *zt_train_optimizer_name(enum zt_train_optimizer o);

typedef struct zt_train_config {
    /* What to train, on what, and where the run goes. Empty strings mean "not given". */
    char model_path[ZT_TRAIN_PATH_MAX]; /* HF config.json of the model; "" when given inline */
    zt_family_config model;             /* the model's config; meaningful once model_loaded */
    bool model_loaded;                  /* model holds the config (inline, or read from model_path) */
    char init_from[ZT_TRAIN_PATH_MAX];  /* safetensors with HF names to start from; "" = random init */
    char train_data[ZT_TRAIN_PATH_MAX]; /* glob of llm.c token shards */
    char val_data[ZT_TRAIN_PATH_MAX];   /* glob of validation shards; "" = no evaluation */
    char tokenizer[ZT_TRAIN_PATH_MAX];  /* tokenizer.json of JSONL data (classification, masked LM, supervised
                                           fine-tuning); "" = none */
    char out_dir[ZT_TRAIN_PATH_MAX];    /* run directory */
    char resume[ZT_TRAIN_PATH_MAX];     /* run or checkpoint directory to continue; flag only; "" = new run */

    /* Supervised fine-tuning of a decoder (causal LM family): given sft_data, the run trains on JSONL records
     * (prompt/completion, alpaca, chats; worker/data/sft.h) instead of token shards, with the loss on the
     * answers only. */
    char sft_data[ZT_TRAIN_PATH_MAX];     /* JSONL of the training examples; "" = not fine-tuning */
    char sft_val_data[ZT_TRAIN_PATH_MAX]; /* JSONL of the validation examples; "" = no evaluation */
    char chat_template[64];               /* a template name (chatml, llama3, ...), "none", or "" = the
                                             chat_template of the tokenizer_config.json beside the tokenizer */
    bool train_on_prompt;                 /* the loss covers the prompts too */
    enum zt_train_overlong sft_overlong;
    bool sft_pack;                        /* several examples a row, each attending only within itself */

    /* Batch and length. One step sees batch_size * grad_accum sequences of seq_len tokens. */
    int64_t steps;
    int64_t batch_size;
    int64_t seq_len;                /* tokens a row (a text-to-text model's input: the encoder's) */
    int64_t target_len;             /* a text-to-text model's target tokens a row (at most seq_len); 0: seq_len */
    int64_t grad_accum;

    /* Learning rate (schedule.h). */
    double lr;
    double min_lr;
    enum zt_schedule_kind schedule; /* nodecay | noam | linear | cosine | exponential */
    int64_t warmup_steps; /* ZT_TRAIN_AUTO (the default) = min(50, steps / 10), set by resolve */
    double lr_gamma;      /* exponential only */

    /* AdamW. */
    double weight_decay;
    double beta1;
    double beta2;
    double eps;
    double grad_clip;     /* maximum global gradient norm; 0 = no clipping */

    /* Evaluation, checkpoints, logging (all in steps). */
    int64_t eval_every;   /* 0 = only before the first and after the last step */
    int64_t eval_batches;
    int64_t save_every;   /* 0 = only the final checkpoint; -1 = none */
    int64_t log_every;

    int64_t seed;
    int64_t threads;      /* CPU threads; 0 = one per core */
    bool shuffle;
    bool save_grads;      /* every checkpoint also holds grads.safetensors (the last step's gradients) */

    /* Where and in what precision to train. */
    enum zt_train_device device;
    enum zt_train_precision precision; /* cuda only; auto = bf16 on sm_80+, fp16 below */
    double loss_scale;    /* fp16: initial dynamic loss scale, a power of two (default 2^15) */
    int64_t loss_scale_window; /* fp16: clean steps before the scale doubles (default 1024) */
    double min_loss_scale;     /* fp16: the scale never drops below this power of two (default 1) */

    /* Where AdamW runs (worker/engine/engine.h); auto (the default) becomes gpu with
     * --device cuda and cpu with --device cpu in zt_train_config_resolve. */
    enum zt_train_optimizer optimizer;
    double optimizer_gpu_fraction;      /* --device cuda --optimizer cpu: the leading blocks holding this fraction of
                                           the parameters keep their AdamW on the GPU (0 = none, the default) */
    enum zt_train_moments adam_moments; /* --optimizer cpu: fp32 (default) or bf16 moments */
    char moments_dir[ZT_TRAIN_PATH_MAX]; /* --optimizer cpu: the Adam moments (under --host-mem, the fp32 masters
                                            too) on disk here; "" = RAM. On the CPU the weights are then streamed
                                            from the host AdamW's arrays (ZeRO-3) */
    uint64_t moments_ram;               /* with moments_dir: RAM the leading blocks' moments may keep instead (0 = what
                                           the plan leaves free, less a margin) */
    char servers[ZT_TRAIN_PATH_MAX];    /* "host:port,..." of the state servers; "" = embedded core */
    char token_file[ZT_TRAIN_PATH_MAX]; /* file holding the bearer token of the state servers; "" = none */
    char tls_ca[ZT_TRAIN_PATH_MAX];     /* PEM CA of the servers' certificates; "" = plaintext */
    char tls_cert[ZT_TRAIN_PATH_MAX];   /* client certificate (mutual TLS); "" = none */
    char tls_key[ZT_TRAIN_PATH_MAX];    /* its key */
    enum zt_train_server_shm server_shm; /* remote servers on this host: auto (shared memory) or off (TCP only) */
    enum zt_train_store state_store;    /* embedded core's store: ram, or nvme with state_store_dir */
    char state_store_dir[ZT_TRAIN_PATH_MAX]; /* nvme: the directory of the state files */

    /* The engine (ZeRO over the model's blocks, any number of ranks). */
    int64_t zero_level;   /* 2 | 3 */
    enum zt_train_ckpt checkpointing; /* activation checkpointing of transformer layers */
    int64_t checkpoint_every;         /* ZT_CKPT_EVERY: layers 0, K, 2K, ... are checkpointed */
    int64_t prefetch;     /* blocks gathered ahead, 0..64 */

    /* Memory (worker/train/plan.h): a cap on the GPU memory of each rank (0 = the whole GPU) and where the
     * weights live; the planner picks what the cap needs and refuses what cannot fit. */
    uint64_t gpu_mem;
    /* A cap on the host memory of each rank's training state (0 = none; MemAvailable is checked either way): the
     * engine's host arrays, the embedded state server's, the checkpoints' staging; the planner moves the Adam
     * moments, then the fp32 masters, to --moments-dir to fit, and refuses what cannot fit. */
    uint64_t host_mem;
    bool host_grad_accum; /* the middle micro-batches' gradients are added on the host (engine.h grad_accum_host) */
    enum zt_train_weights weights;
    int64_t grad_piece;    /* chunked and streamed layouts: elements per gradient piece sent to the host */
    bool auto_micro_batch; /* the planner may lower batch_size (rows per micro-batch), raising grad_accum so
                              that a step keeps its tokens, until the run fits */
    bool plan_only;        /* --device cuda: print the memory plan (GPU, host, disk) and stop before anything is
                              allocated or read; without a visible GPU it plans for one of --gpu-mem bytes, and
                              --host-mem stands for the machine's RAM */

    /* Not a file key nor a flag: stop after this step as if interrupted (checkpoint, then return with
     * zt_train_result.interrupted set); 0 = run to `steps`. For tests and tools. */
    int64_t stop_at_step;
} zt_train_config;

/* Fills c with the defaults (the values in the CLI documentation; no model, no data). */
void zt_train_config_init(zt_train_config *c);

/* Reads a JSON training config file over c: keys present replace c's values, absent keys keep them.
 * Unknown keys, wrong types and unreadable files are errors (ZT_EINVAL_CONFIG, ZT_EFORMAT or a negative
 * errno) with the file, the key and the fix in err; c may be partly updated then. "model" may be a path
 * (then read by zt_train_config_resolve) or an inline Hugging Face config object (read here). */
int zt_train_config_load_file(zt_train_config *c, const char *path, zt_err *err);

/* Applies one command-line flag, e.g. ("--steps", "500"), over c. Returns 0, or ZT_EINVAL_CONFIG for an
 * unknown flag or a value of the wrong form, with the flag and the accepted form in err. --config and
 * --log-level are handled by the command, not here. */
int zt_train_config_set_flag(zt_train_config *c, const char *flag, const char *value, zt_err *err);

/* Completes c after the file and the flags: reads the model's Hugging Face config from c->model_path
 * unless it is loaded already (inline), and replaces ZT_TRAIN_AUTO settings by their values
 * (warmup_steps = min(50, steps / 10)). Returns 0, ZT_EINVAL_CONFIG when no model was given, or the
 * model loader's error (naming the file). */
int zt_train_config_resolve(zt_train_config *c, zt_err *err);

/* Checks every setting and their consistency (ranges, seq_len <= n_positions, known schedule, warmup <
 * steps for decaying schedules, files given...). Returns 0 or ZT_EINVAL_CONFIG with a message that names
 * the config key and flag and says what to change. Needs a resolved config. */
int zt_train_config_validate(const zt_train_config *c, zt_err *err);

/* Logs every setting, one INFO line per key: "config: lr = 0.0006". */
void zt_train_config_log(const zt_train_config *c);

/* Writes c as a JSON config file, atomically, that zt_train_config_load_file reads back to the same
 * settings: paths are made absolute, and "model" is written as model_ref (a path relative to the saved
 * file's folder, e.g. "model_config.json" saved beside it). Returns 0 or a negative code with err. */
int zt_train_config_save(const zt_train_config *c, const char *path, const char *model_ref, zt_err *err);

/* Whether transformer layer l (0-based) keeps only its output in the forward pass under c's
 * checkpointing. */
bool zt_train_config_layer_checkpointed(const zt_train_config *c, int l);

#endif
