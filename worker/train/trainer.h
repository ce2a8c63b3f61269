/* The training loop of `ztrain train`: one loop for every number of ranks, device and optimizer placement,
 * around the training engine (worker/engine/engine.h): data, the learning-rate schedule, evaluation,
 * metrics, checkpoints, resume and the rewind after a state server restarted.
 *
 * Ranks. The launch environment (worker/launch/env.h: RANK, WORLD_SIZE, ...) gives W; without it W = 1.
 * W > 1 starts at rank 0's gRPC rendezvous (worker/launch/startup.h), which checks WORLD_SIZE and the
 * config hash (zt_trainer_config_hash) on every rank. Every rank reads the same global batches of B
 * sequences in the same order and trains on its B / W rows (B must be a multiple of W), so the losses do
 * not depend on W and neither does a checkpoint. Rank 0 writes the run directory (config.json,
 * model_config.json, metrics.jsonl, the progress lines, checkpoints from the gathered state); a run saved at
 * W = 4 resumes at W = 1 and back.
 *
 * One step: grad_accum micro-batches (forward and backward), then the engine's step (global norm,
 * clipping, the non-finite guard, AdamW where the placement puts it); its report is booked with
 * zt_optimizer_account (skipped steps, divergence) and the fp16 loss scaler. A run that resumes from the
 * checkpoint of step N and trains to N + M gives the same losses and parameters, bit for bit, as one that
 * trained N + M steps without stopping.
 *
 * A stop request (zt_trainer_request_stop, from a SIGINT or SIGTERM handler) on any rank stops every rank
 * after the same step (one all-reduce per step), with a checkpoint.
 *
 * Placement server (--optimizer server): the masters and moments live in state servers, embedded in the
 * process (W = 1) or remote (--servers, any W); the run id is the run directory's name. At every
 * checkpoint rank 0 first asks every server for a snapshot of the step. A remote server killed and
 * restarted from its latest snapshot:
 *   - at the step before the one in flight: the client's retries reconnect, the half-pushed step is pushed
 *     again and committed: the run goes on by itself;
 *   - at an older step s: every rank learns s, logs "state server HOST:PORT restarted at step s; rewinding
 *     to checkpoint RUN_DIR/ckpt_s (rewind 1 of 3)" and runs again from that checkpoint, as
 *     `--resume RUN_DIR/ckpt_s` would (metrics.jsonl is cut back to step s): the run ends on the losses of an
 *     uninterrupted run. After ZT_TRAIN_MAX_REWINDS rewinds every rank stops with ZT_ESTATE and a message
 *     naming the checkpoint to continue from by hand. */
#ifndef ZT_WORKER_TRAINER_H
#define ZT_WORKER_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/state/client.h"
#include "worker/train/config.h"

typedef struct zt_train_result {
    int64_t start_step;       /* steps completed before this run (0, or the resumed checkpoint's step) */
    int64_t end_step;         /* steps completed at the end */
    float *losses;            /* train loss of steps start_step+1 .. end_step, in order; owned */
    float first_val_loss;     /* the run's first val loss (step 0, or read from metrics.jsonl on resume); or NAN */
    float last_val_loss;      /* the latest val loss; NAN if none */
    float last_val_accuracy;  /* a classifier's latest val accuracy (0 to 1); NAN if none */
    int64_t skipped_steps;    /* steps skipped for a non-finite loss or norm, over the whole run */
    double seconds;           /* wall time of this call's training loop */
    double tokens_per_s;      /* training tokens per second in this call */
    bool interrupted;         /* stopped before `steps` by zt_trainer_request_stop or stop_at_step */
    char checkpoint[ZT_TRAIN_PATH_MAX + 32]; /* the last checkpoint written; "" if none */
    int64_t rewind_to;        /* after a ZT_ESTATE failure: the older step a state server restarted at (the run
                               * can continue from its checkpoint, zt_trainer_rewind_target); otherwise -1 */
    bool load_streamed;       /* resumed with the checkpoint read tensor by tensor into the engine (state on disk,
                               * or --host-mem), not loaded into host arrays of the model's size */
    uint64_t peak_rss_bytes;  /* this process's peak resident memory (VmHWM) at the end of training; 0: unknown */
    uint64_t plan_host_bytes; /* the host bytes the planner counted (--host-mem, or a run on a GPU); 0: none */
} zt_train_result;

/* How many times one process continues a run by itself from an older checkpoint after state servers
 * restarted from older snapshots, before it gives up (zt_trainer_rewind_target). */
#define ZT_TRAIN_MAX_REWINDS 3

/* Trains as cfg says (validated again here) with the ranks of the launch environment, logging progress and
 * writing the run directory. Fills *res on every rank (free with zt_train_result_free, also after an
 * error). The join timeout is ZT_RDZV_TIMEOUT_S (default 60 s) and the collective timeout
 * ZT_COMM_TIMEOUT_S (default 300 s). Returns 0 when the run reached cfg->steps or stopped on request after
 * writing a checkpoint (res->interrupted), or a negative code with a message in err on every rank. */
int zt_trainer_run(const zt_train_config *cfg, zt_train_result *res, zt_err *err);

/* Decides whether a run that failed because a state server restarted at the older step res->rewind_to
 * continues by itself: when fewer than ZT_TRAIN_MAX_REWINDS rewinds were done and the checkpoint of that
 * step exists in cfg->out_dir, writes its path into ckpt (cap bytes) and returns 0; the caller then logs
 * it with zt_trainer_log_rewind and runs again with resume = ckpt. Otherwise returns ZT_ESTATE with the
 * failed run's message in err (which says how to resume by hand) and why there is no automatic rewind. */
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
 * not use remote servers. */
int zt_trainer_check_resume_placement(const char *ckpt_dir, const zt_train_config *cfg, zt_err *err);

/* A hash of the settings every rank must share (FNV-1a over the config's values): the model, data, schedule,
 * AdamW and batch settings, and everything that changes the math or the protocol of a step: device,
 * precision, optimizer placement, the number of state servers (not their addresses), the embedded state
 * store, zero_level, checkpointing and prefetch. */
uint64_t zt_trainer_config_hash(const zt_train_config *cfg);

/* The run id on the state servers for a run directory: its last path component, characters outside
 * [A-Za-z0-9._-] replaced by '_' ("train" for "/", "." or ".."). */
void zt_trainer_run_id(const char *out_dir, char *id, size_t cap);

/* Points at which a program that embeds the loop (a test, a tool) can act; the `ztrain` program sets none.
 * Per process; NULL functions are skipped. */
typedef struct zt_trainer_hooks {
    void *user;
    /* rank 0, after step `step` and its checkpoint (if any) */
    void (*after_step)(void *user, int64_t step);
    /* rank 0, after its state client is created (placement server), e.g. to watch its pushes */
    void (*on_state_client)(void *user, zt_state_client_t *client);
} zt_trainer_hooks;

/* Installs hooks (copied) for the later runs of this process; NULL removes them. */
void zt_trainer_set_hooks(const zt_trainer_hooks *hooks);

#endif
