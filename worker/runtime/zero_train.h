/* The multi-rank training loop of `ztrain train` under WORLD_SIZE > 1 (CPU: the shared-memory backend and
 * zero.h; --device cuda: NCCL on GPU LOCAL_RANK and zero_cuda.h, with the optimizer on the GPUs): the
 * trainer's config, data loader, schedule, metrics and checkpoint format around the ZeRO runtime (zero.h).
 * Start-up goes through rank 0's gRPC rendezvous (startup.h): WORLD_SIZE and the config hash are checked
 * there, on every rank.
 *
 * Data split: every rank opens the training data with the global batch size B and reads the same global
 * batches in the same order; rank r of W trains on rows r*B/W .. (r+1)*B/W - 1 of each. B must be a
 * multiple of W. So W ranks with micro-batch B/W see exactly what one rank with B sees, and the data
 * position saved in a checkpoint is the same for every W. Evaluation is split the same way (each rank
 * evaluates its rows of every validation batch; the val loss is their mean), at step 0, every
 * eval_every steps and at the end.
 *
 * Rank 0 writes the run directory as the single-process trainer does: config.json, model_config.json,
 * metrics.jsonl (worker/train/metrics.h) and the progress lines; checkpoints are the trainer's
 * (worker/train/checkpoint.h), written by rank 0 from the gathered state, so a run saved at W = 4 resumes
 * at W = 2, at W = 1 or in the single-process trainer.
 *
 * A stop request (zt_trainer_request_stop, from a SIGINT or SIGTERM handler) on any rank stops every rank
 * after the same step (the ranks agree on it with one all-reduce per step), with a checkpoint.
 *
 * Optimizer placement "server" (--optimizer server --servers host:port,...): the masters and moments live
 * in ztrain-server processes (zt_zero_attach_server); the run id is the run directory's name
 * (zt_placement_run_id). Several ranks need real servers: without --servers the run is refused (the
 * embedded server lives inside one process). At every checkpoint rank 0 first asks every server for a
 * snapshot of the step (ztrain-server --snapshot-dir), so the checkpoint of step N always has the servers'
 * snapshots of step N; the checkpoint holds the masters, not the moments, and resumes only with the
 * servers. A server killed and restarted from its latest snapshot:
 *   - at the step before the one in flight (killed between a checkpoint and the next commit, or in the
 *     middle of a push): the client's retries reconnect, the commit of the half-pushed step is refused
 *     (its gradients are incomplete), every rank pushes its gradients again and the step commits: the run
 *     goes on by itself;
 *   - at an older step s: the steps since are lost; every rank learns s (zero.c agrees on it), logs
 *     "state server HOST:PORT restarted at step s; rewinding to checkpoint RUN_DIR/ckpt_s (rewind 1 of 3)"
 *     and, after one all-reduce that every rank can go on (the checkpoint exists), runs again from the
 *     checkpoint of step s on the same communicator, as `--resume RUN_DIR/ckpt_s` would (metrics.jsonl is
 *     cut back to step s): the run ends on the losses of an uninterrupted run. After ZT_TRAIN_MAX_REWINDS
 *     rewinds in one process every rank stops with ZT_ESTATE and a message naming the checkpoint to
 *     continue from by hand with `ztrain train --resume RUN_DIR/ckpt_NNNNNN` and the same flags.
 * No partial step is ever applied: a server commits only a step whose gradients have all arrived. */
#ifndef ZT_WORKER_RUNTIME_ZERO_TRAIN_H
#define ZT_WORKER_RUNTIME_ZERO_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/runtime/zero.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

/* Trains as cfg says with the ranks of the launch environment (worker/launch/env.h); zo gives the ZeRO
 * level, checkpointing and prefetch (its AdamW fields are taken from cfg). Fills *res on every rank
 * (losses of this call's steps; free with zt_train_result_free, also after an error). The join timeout
 * is ZT_RDZV_TIMEOUT_S (default 60 s) and the collective timeout ZT_COMM_TIMEOUT_S (default 300 s). After an
 * automatic rewind (see above) *res describes the last attempt (start_step is the rewound-to step).
 * Returns 0, or a negative code with a message in err on every rank (world size or config mismatch, a missing or failed rank, data or
 * checkpoint errors). */
int zt_zero_train_run(const zt_train_config *cfg, const zt_zero_options *zo, zt_train_result *res, zt_err *err);

/* Whether the launch environment (worker/launch/env.h) asks for more than one rank: WORLD_SIZE > 1, or
 * a malformed launch variable (so that zt_zero_train_main reports it); or, with one rank, whether
 * ZT_ZERO_LEVEL is set, which asks for the ZeRO runtime explicitly (to compare it with the
 * single-process trainer, or to use its activation checkpointing on one GPU). */
bool zt_zero_train_wanted(void);

/* What `ztrain train` runs when zt_zero_train_wanted(): zt_zero_train_run with the ZeRO options of the
 * config (zero_level, checkpointing, prefetch: --zero-level, --checkpointing, --prefetch), each overridden
 * by its environment variable when that is set:
 *   ZT_ZERO_LEVEL      2 | 3 (default 3)
 *   ZT_CHECKPOINTING   none | all | every:K (default none)
 *   ZT_PREFETCH        blocks gathered ahead, >= 0 (default 1)
 * Same contract as zt_trainer_run: fills *res (free with zt_train_result_free, also after an error;
 * res->interrupted after a stop request), returns 0 or a negative code with a message in err. */
int zt_zero_train_main(const zt_train_config *cfg, zt_train_result *res, zt_err *err);

/* A hash of the settings every rank must share (FNV-1a over the config's values): the model, data, schedule,
 * AdamW and batch settings, and everything that changes the math or the protocol of a step: device,
 * precision, optimizer placement, the number of state servers (not their addresses), the embedded state
 * store, zero_level, checkpointing and prefetch. zt_zero_train_run adds the ZeRO options in effect (after
 * the environment overrides) before the rendezvous compares it. */
uint64_t zt_zero_train_config_hash(const zt_train_config *cfg);

#endif
