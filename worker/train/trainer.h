/* The training loop of `ztrain train` on the CPU backend: model, data, AdamW with a learning-rate schedule,
 * evaluation, metrics, checkpoints and resume.
 *
 * One step: zero the gradients; grad_accum micro-batches (next batch, forward, backward with loss scale
 * 1/grad_accum); global gradient norm; clipping; learning rate of the step; AdamW. A run that resumes
 * from the checkpoint of step N and trains to step N+M produces the same losses and parameters, bit for
 * bit, as a run that trained N+M steps without stopping. */
#ifndef ZT_WORKER_TRAINER_H
#define ZT_WORKER_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/safetensors.h" /* enum zt_dtype */
#include "common/status.h"
#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/train/config.h"

typedef struct zt_train_result {
    int64_t start_step;       /* steps completed before this run (0, or the resumed checkpoint's step) */
    int64_t end_step;         /* steps completed at the end */
    float *losses;            /* train loss of steps start_step+1 .. end_step, in order; owned */
    float first_val_loss;     /* the run's first val loss (step 0, or read from metrics.jsonl on resume); or NAN */
    float last_val_loss;      /* the latest val loss; NAN if none */
    int64_t skipped_steps;    /* steps skipped for a non-finite loss or norm, over the whole run */
    double seconds;           /* wall time of this call's training loop */
    double tokens_per_s;      /* training tokens per second in this call */
    bool interrupted;         /* stopped before `steps` by zt_trainer_request_stop or stop_at_step */
    char checkpoint[ZT_TRAIN_PATH_MAX + 32]; /* the last checkpoint written; "" if none */
    int64_t rewind_to;        /* after a ZT_ESTATE failure: the older step a state server restarted at (the run
                               * can continue from its checkpoint, zt_trainer_rewind_target); otherwise -1 */
} zt_train_result;

/* How many times one process continues a run by itself from an older checkpoint after state servers
 * restarted from older snapshots, before it gives up (zt_trainer_rewind_target). */
#define ZT_TRAIN_MAX_REWINDS 3

/* Trains as cfg says (validated again here), logging progress, writing the run directory (config.json,
 * model_config.json, metrics.jsonl, checkpoints). When state servers restarted from older snapshots, it
 * continues from the checkpoint of their step by itself (zt_trainer_rewind_target, at most
 * ZT_TRAIN_MAX_REWINDS times). Fills *res (free with zt_train_result_free, also after an error). Returns 0
 * when the run reached cfg->steps or stopped on request after writing a checkpoint (res->interrupted), or
 * a negative code with a message in err. */
int zt_trainer_run(const zt_train_config *cfg, zt_train_result *res, zt_err *err);

/* Decides whether a run that failed because a state server restarted at the older step res->rewind_to
 * continues by itself: when fewer than ZT_TRAIN_MAX_REWINDS rewinds were done and the checkpoint of that
 * step exists in cfg->out_dir, writes its path into ckpt (cap bytes) and returns 0; the caller then logs
 * it with zt_trainer_log_rewind and runs again with resume = ckpt. Otherwise returns ZT_ESTATE with the
 * failed run's message in err (which says how to resume by hand) and why there is no automatic rewind.
 * (Servers write a snapshot at every checkpoint, so a server's step always has a checkpoint.) */
int zt_trainer_rewind_target(const zt_train_config *cfg, const zt_train_result *res, int rewinds_done, char *ckpt,
                             size_t cap, zt_err *err);

/* Logs the line of an automatic rewind: "state server HOST:PORT restarted at step S; rewinding to checkpoint
 * CKPT (rewind N of 3)", N = rewinds_done + 1. */
void zt_trainer_log_rewind(const zt_train_config *cfg, int64_t server_step, int rewinds_done, const char *ckpt);

/* Frees what a result owns; accepts a zeroed result. */
void zt_train_result_free(zt_train_result *res);

/* Asks a running zt_trainer_run to stop after the current step, write a checkpoint and return with
 * res->interrupted set. Async-signal-safe: meant for SIGINT and SIGTERM handlers. */
void zt_trainer_request_stop(void);

/* A checkpoint written with remote state servers holds the master weights but not the Adam moments (the
 * servers keep them in their snapshots): it can only continue with remote servers. Its saved config (in
 * ckpt_dir) says which placement wrote it. Returns 0, or ZT_EINVAL_CONFIG with a message when cfg does
 * not use remote servers. Used by every training loop that resumes. */
int zt_trainer_check_resume_placement(const char *ckpt_dir, const zt_train_config *cfg, zt_err *err);

/* Returns whether a stop was requested (zt_trainer_request_stop) since the last call, and clears the
 * request: for training loops other than zt_trainer_run (the multi-rank loop of worker/runtime). */
bool zt_trainer_take_stop_request(void);

/* The forward and backward passes of one step: zeroes the gradients, then for each of grad_accum
 * micro-batches takes the next batch of B x T tokens from dl (into inputs and targets, B*T each) and runs
 * forward and backward with loss scale 1/grad_accum, so the gradient slab ends up holding the gradient of
 * the mean loss. Returns that mean loss. */
float zt_trainer_accumulate(zt_gpt2 *model, zt_dataloader *dl, int grad_accum, int B, int T, int32_t *inputs,
                            int32_t *targets);

#ifdef ZT_WITH_CUDA
/* The compute type of a run on CUDA device `device`: cfg->precision, or with "auto" bf16 on GPUs with bf16
 * matrix units (sm_80+) and fp16 below. Returns 0, or ZT_EUNSUPPORTED with a message when the device is not
 * visible or bf16 is asked of a GPU without it. Shared by the single-process and the multi-rank loops. */
int zt_trainer_pick_dtype(const zt_train_config *cfg, int device, enum zt_dtype *dt, zt_err *err);
#endif

#endif
