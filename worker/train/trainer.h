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

#include "common/status.h"
#include "worker/data/dataloader.h"
#include "worker/model/gpt2.h"
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
} zt_train_result;

/* Trains as cfg says (validated again here), logging progress, writing the run directory (config.json,
 * model_config.json, metrics.jsonl, checkpoints). Fills *res (free with zt_train_result_free, also after
 * an error). Returns 0 when the run reached cfg->steps or stopped on request after writing a checkpoint
 * (res->interrupted), or a negative code with a message in err. */
int zt_trainer_run(const zt_train_config *cfg, zt_train_result *res, zt_err *err);

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

#endif
