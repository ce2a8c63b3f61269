/* The multi-rank training loop of `ztrain train` under WORLD_SIZE > 1 (CPU, shared-memory backend): the
 * trainer's config, data loader, schedule and checkpoint format around the ZeRO runtime (zero.h).
 *
 * Data split: every rank opens the training data with the global batch size B and reads the same global
 * batches in the same order; rank r of W trains on rows r*B/W .. (r+1)*B/W - 1 of each. B must be a
 * multiple of W. So W ranks with micro-batch B/W see exactly what one rank with B sees, and the data
 * position saved in a checkpoint is the same for every W.
 *
 * Checkpoints are the single-process trainer's (worker/train/checkpoint.h), written by rank 0 from the
 * gathered state, so a run saved at W = 4 resumes at W = 2, at W = 1 or in the single-process trainer. */
#ifndef ZT_WORKER_RUNTIME_ZERO_TRAIN_H
#define ZT_WORKER_RUNTIME_ZERO_TRAIN_H

#include "common/status.h"
#include "worker/runtime/zero.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

/* Trains as cfg says with the ranks of the launch environment (worker/launch/env.h); zo gives the ZeRO
 * level, checkpointing and prefetch (its AdamW fields are taken from cfg). Fills *res on rank 0 (losses
 * of this call's steps; free with zt_train_result_free). The join timeout is ZT_RDZV_TIMEOUT_S (default
 * 60 s) and the collective timeout ZT_COMM_TIMEOUT_S (default 300 s). Returns 0, or a negative code with a
 * message in err on every rank (world size or config mismatch, a missing or failed rank, data or
 * checkpoint errors). */
int zt_zero_train_run(const zt_train_config *cfg, const zt_zero_options *zo, zt_train_result *res, zt_err *err);

/* A hash of the settings every rank must share (FNV-1a over the config's values). */
uint64_t zt_zero_train_config_hash(const zt_train_config *cfg);

#endif
