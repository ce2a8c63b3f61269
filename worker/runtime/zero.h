/* ZeRO over the model's blocks (DESIGN.md decisions 4-6): every block's parameters form one flat buffer,
 * padded with zeros to a multiple of the world size W and split into W equal shards; rank r owns shard r
 * of every block: its fp32 master weights, its gradient shard and its Adam moments m and v.
 *
 * One micro-batch (zt_zero_forward_backward):
 *   forward, blocks 0..n-1: all-gather the block's parameters, run it, and at ZeRO level 3 release them
 *     (block 0 is released after the tied head); at level 2 they stay gathered until the block's backward;
 *     checkpointed transformer layers drop their intermediate activations (keeping their output);
 *   backward, head then blocks n-1..0: gather again (level 3), recompute a checkpointed layer's forward,
 *     run its backward into the block's full local gradient buffer, release the parameters; on the last
 *     micro-batch of a step reduce-scatter the gradient buffer (sum) into the owned shard and free it.
 *     Earlier micro-batches only accumulate locally: no communication.
 * The step (zt_zero_step): global gradient norm from per-shard partial sums (one all-reduce), clipping,
 * the skip guard for a non-finite loss or norm, and AdamW (kernels/adamw.h) on the owned shards, each
 * tensor with its own weight decay, exactly as worker/train/optimizer.c does for the whole slab.
 *
 * On the CPU the communication is synchronous, so the prefetch depth changes nothing; it is kept in the
 * options and in the memory plan for the GPU runtime's communication stream.
 *
 * The model (zt_gpt2) supplies the activations and the per-block math; its own parameter and gradient
 * slabs are not used while training (zt_zero_export_state fills the parameter slab for checkpoints). */
#ifndef ZT_WORKER_RUNTIME_ZERO_H
#define ZT_WORKER_RUNTIME_ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/comm/comm.h"
#include "worker/models/gpt2.h"
#include "worker/state/client.h"
#include "worker/train/optimizer.h"

enum zt_zero_ckpt { ZT_ZERO_CKPT_NONE = 0, ZT_ZERO_CKPT_ALL = 1, ZT_ZERO_CKPT_EVERY = 2 };

typedef struct zt_zero_options {
    int level;                    /* 2 or 3 */
    enum zt_zero_ckpt checkpoint; /* activation checkpointing of transformer layers */
    int checkpoint_every;         /* ZT_ZERO_CKPT_EVERY: layers 0, k, 2k, ... are checkpointed; >= 1 */
    int prefetch;                 /* blocks gathered ahead (GPU); >= 0 */
    int grad_accum;               /* micro-batches per step (for the memory plan); >= 1 */
    double beta1, beta2, eps, weight_decay, grad_clip; /* AdamW, as zt_optimizer_init */
} zt_zero_options;

typedef struct zt_zero zt_zero; /* opaque */

/* Sets the defaults: level 3, no checkpointing, prefetch 1, grad_accum 1, AdamW 0.9/0.95/1e-8/0.1,
 * clip 1.0. */
void zt_zero_options_init(zt_zero_options *o);
/* Whether transformer layer l (0-based) drops its activations after forward under o's checkpointing. */
bool zt_zero_layer_checkpointed(const zt_zero_options *o, int l);

/* Parses a checkpointing policy: "none", "all" or "every:K" (K >= 1). Returns 0 or ZT_EINVAL_CONFIG. */
int zt_zero_parse_checkpoint(const char *s, enum zt_zero_ckpt *policy, int *every, zt_err *err);

/* Creates the runtime for model over comm: builds the padded block shards and copies this rank's shards
 * of the model's current parameters (which must be the same on every rank: same seed or same
 * checkpoint) into the owned fp32 masters; m and v start at zero. Borrows model and comm for its lifetime.
 * Returns 0, ZT_EINVAL_CONFIG for bad options, or ZT_ENOMEM, with a message. */
int zt_zero_create(zt_zero **out, zt_gpt2 *model, zt_comm *comm, const zt_zero_options *o, zt_err *err);
void zt_zero_destroy(zt_zero *z); /* accepts NULL */

/* Logs the per-rank memory plan of the ZeRO part for micro-batches of B x T (INFO lines). */
void zt_zero_log_plan(const zt_zero *z, int B, int T);
/* Bytes of gathered parameters and full gradient buffers held at once so far (the measured peak of what
 * the plan calls the window), and what the plan predicted for it. */
size_t zt_zero_peak_window_bytes(const zt_zero *z);
size_t zt_zero_plan_window_bytes(const zt_zero *z);

/* One micro-batch: forward and backward over this rank's tokens and targets [B,T], gradients scaled by
 * loss_scale (1 / (grad_accum * W) gives the gradient of the global mean loss); last says whether it is
 * the step's last micro-batch (then the gradients are reduce-scattered into the owned shards). Writes
 * this rank's mean loss to *loss. Returns 0 or a communication error. */
int zt_zero_forward_backward(zt_zero *z, const int32_t *tokens, const int32_t *targets, int B, int T,
                             float loss_scale, bool last, float *loss, zt_err *err);

/* Forward only (evaluation): gathers every block in turn; returns this rank's mean loss in *loss. */
int zt_zero_forward(zt_zero *z, const int32_t *tokens, const int32_t *targets, int B, int T, float *loss,
                    zt_err *err);

/* *out = the mean over ranks of x (an all-reduce). */
int zt_zero_mean(zt_zero *z, float x, float *out, zt_err *err);

/* The optimizer step after the last micro-batch; loss is the step's (global mean) loss. Same contract as
 * zt_optimizer_step: a skipped step returns 0 with report->skipped; too many in a row return ZT_ESTATE.
 * With state servers (zt_zero_attach_server) it commits the servers' next step (the attach step plus the
 * steps done since), a skipped step as an overflow; a failure on any rank fails the step on every rank
 * (ZT_ESTATE with zt_zero_server_step() >= 0 when a server holds an older step), and the owned masters
 * change only after a successful commit. A collective. */
int zt_zero_step(zt_zero *z, float loss, float lr, zt_optimizer_report *report, zt_err *err);

/* Moves this rank's optimizer to state servers (optimizer placement "server", DESIGN.md decisions 7-9;
 * worker/state/client.h): registers run_id with the runtime's layout (W shards of every block, the
 * model's weight-decay ranges, AdamW from the options, fp32 parameters), then
 *   step 0, servers at step 0: pushes this rank's shards of the current parameters as the initial master
 *     weights (every rank pushes its own shards);
 *   step > 0, servers at the same step: pulls this rank's shards of that step into the owned masters;
 *   anything else: ZT_EINVAL_CONFIG (a new run over a run the servers already hold) or ZT_ESTATE (the
 *     servers hold another step), with the servers' step in *server_step and a message saying what to do.
 * From then on zt_zero_step runs AdamW on the servers: every rank pushes its reduced gradient shards,
 * rank 0 commits once every rank's pushes are done (an all-reduce), and every rank pulls its updated
 * shards, block 0 first; the next forward all-gathers them as before. The client is borrowed for the
 * runtime's lifetime. *server_step (may be NULL) receives the servers' step. Not a collective. */
int zt_zero_attach_server(zt_zero *z, zt_state_client_t *client, const char *run_id, int64_t step,
                          int64_t *server_step, zt_err *err);

/* With state servers: the step the servers reported when a step failed because one of them holds an
 * older state (it restarted from a snapshot), agreed by every rank; -1 when that is not why. */
int64_t zt_zero_server_step(const zt_zero *z);

/* Gathers the full training state on every rank: the fp32 masters into the model's parameter slab, and
 * m and v into opt (allocated by the caller with zt_optimizer_init for the model's size; its adam_step,
 * skipped_steps and bad_in_a_row are set too). The layout is the single-process trainer's, so
 * zt_checkpoint_save writes a checkpoint that does not depend on W. A collective. */
int zt_zero_export_state(zt_zero *z, zt_optimizer *opt, zt_err *err);

/* The reverse: takes this rank's shards of the model's parameter slab and of opt's m and v (as
 * zt_checkpoint_load leaves them, on every rank) and opt's step counters. */
void zt_zero_import_state(zt_zero *z, const zt_optimizer *opt);

#endif
