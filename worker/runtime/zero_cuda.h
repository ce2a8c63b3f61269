/* The ZeRO runtime on CUDA GPUs over NCCL (DESIGN.md decisions 4-6): the GPU twin of zero.h.
 *
 * Every block of the device model (worker/models/gpt2_cuda.h: 0 = embeddings and the tied head, 1..L =
 * layers, L+1 = ln_f) is one flat buffer in the device layout, padded with zeros to P_b elements, a
 * multiple of 64 * W, and split into W shards of S_b = P_b / W elements (so every shard starts on a
 * 64-element boundary). Rank r owns shard r of every block and keeps it on its GPU:
 *   fp32 master weights, Adam m and v, the fp32 reduced gradient of the step, and the low-precision
 *   weights (bf16 / fp16, or the fp32 masters themselves) that the all-gathers read.
 * The device model holds no parameters of its own: it asks this runtime for them block by block
 * (zt_gpt2_cuda_hooks), and only keeps activations and scratch.
 *
 * Streams. The model's stream computes; a second stream communicates. Before block b's forward (and, at
 * level 3, again before its backward) the runtime makes sure block b sits gathered in a slot of the
 * window, and enqueues the all-gathers of the next `prefetch` blocks of the micro-batch's fixed order on
 * the communication stream; the compute stream waits on the slot's "gathered" event, and the next
 * gather into a slot waits on the event recorded when the slot's last reader finished. Level 3: the
 * window has prefetch + 2 slots of the largest block; a slot still holding a block that comes round
 * again (ln_f and the embeddings around the head, the last layer) is used without gathering again.
 * Level 2: every block has its own slot and is gathered once per step.
 *
 * Gradients. Block b's backward writes low-precision gradients (fp32 in fp32 compute) into a buffer the
 * runtime hands out; when the backward is enqueued they are folded into an fp32 buffer of the whole
 * block (removing the fp16 loss scale), and on the step's last micro-batch that buffer is
 * reduce-scattered (sum, fp32) into the owned gradient shard on the communication stream, while the
 * compute stream goes on with block b-1. fp32 is the reduce-scatter dtype on purpose: it is exact at
 * W = 1 (the run equals the single-GPU trainer bit for bit) and its sums do not lose the low bits that
 * bf16 would; it costs twice the traffic of bf16. Earlier micro-batches of a step only accumulate
 * locally: with grad_accum > 1 every block keeps its fp32 accumulation buffer for the whole step.
 *
 * The step: sum of squares of the owned gradient shards, an all-reduce (sum), the non-finite flag (the
 * micro-batches' losses and the norm) all-reduced (max), the clip coefficient, and one fused AdamW over
 * the pieces of every tensor inside the owned shards (each with its tensor's weight decay) that also
 * writes the new low-precision shard; the update is skipped on the device when the flag is set (fp16
 * overflow or a non-finite loss). The host waits once per step, for the loss, the norm and the flag;
 * that wait polls NCCL and gives up after the communicator's timeout (worker/comm/comm.h).
 *
 * Timeline (ZT_ZERO_TIMELINE=1 in the environment): CUDA events around every all-gather, every
 * reduce-scatter and every block's compute; after each step one INFO line gives the step's
 * communication time, the part of it that ran while the compute stream was busy, and the hidden
 * fraction (bench/zero/timeline.sh). */
#ifndef ZT_WORKER_RUNTIME_ZERO_CUDA_H
#define ZT_WORKER_RUNTIME_ZERO_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "worker/comm/comm.h"
#include "worker/models/gpt2.h"
#include "worker/runtime/zero.h"
#include "worker/train/optimizer.h"

typedef struct zt_zero_cuda zt_zero_cuda; /* opaque */

/* Creates the runtime and its device model for micro-batches up to B x T in compute type dtype (F32,
 * BF16 or F16) on the current CUDA device, over the nccl communicator comm. Takes this rank's shards of
 * host's current parameters (the same on every rank) as the fp32 masters; m and v start at zero. o
 * gives the level, checkpointing, prefetch depth, grad_accum and AdamW settings. Borrows host and comm
 * for its lifetime. Returns 0, or ZT_EINVAL_CONFIG / ZT_EUNSUPPORTED / ZT_ENOMEM with a message saying
 * what to change. Free with zt_zero_cuda_destroy. */
int zt_zero_cuda_create(zt_zero_cuda **out, zt_gpt2 *host, zt_comm *comm, const zt_zero_options *o, int B, int T,
                        enum zt_dtype dtype, zt_err *err);
/* Waits for the device and frees everything; accepts NULL. */
void zt_zero_cuda_destroy(zt_zero_cuda *z);

/* Logs the per-rank memory plan of the ZeRO part (INFO): params/W, grads/W, optimizer/W, the gathered
 * window, the gradient buffers and the activations (checkpointed layers counted). */
void zt_zero_cuda_log_plan(const zt_zero_cuda *z);
/* Bytes of device memory the plan predicts for this rank (the runtime's buffers plus the model's), and
 * the peak the CUDA allocator saw so far (cudaMemGetInfo, from creation on). */
size_t zt_zero_cuda_plan_bytes(const zt_zero_cuda *z);
size_t zt_zero_cuda_measured_bytes(const zt_zero_cuda *z);

/* One micro-batch: forward and backward over this rank's tokens and targets [B,T] (host arrays), the
 * gradients weighted by grad_weight (1 / (grad_accum * W) for the gradient of the global mean loss) and
 * computed under loss_scale (fp16; 1 otherwise). micro counts the step's micro-batches from 0; last
 * says whether this one is the step's last (its gradients are then reduce-scattered). Asynchronous. */
void zt_zero_cuda_forward_backward(zt_zero_cuda *z, const int32_t *tokens, const int32_t *targets, int B, int T,
                                   int micro, float grad_weight, float loss_scale, bool last);

/* The step after the last micro-batch: global norm, clipping (o->grad_clip), the non-finite flag and
 * AdamW with lr at Adam step adam_step (1-based; the update is skipped on the device when the flag is
 * set). Waits for it and reports: *loss = the mean over ranks of each rank's mean micro-batch loss,
 * *grad_norm before clipping, *nonfinite. micros is the number of micro-batches of the step. Returns 0,
 * or a communication error (a failed or silent peer, within the timeout) with a message. A collective. */
int zt_zero_cuda_step(zt_zero_cuda *z, int micros, float lr, int64_t adam_step, float *loss, double *grad_norm,
                      bool *nonfinite, zt_err *err);

/* Mean loss of one batch (this rank's rows) without backward, averaged over the ranks. Synchronous; a
 * collective. Returns 0 or a communication error. */
int zt_zero_cuda_eval(zt_zero_cuda *z, const int32_t *tokens, const int32_t *targets, int B, int T, float *loss,
                      zt_err *err);

/* Gathers the full training state on every rank: the fp32 masters into host's parameter slab and m, v
 * into opt->m, opt->v (opt sized for the host model by zt_optimizer_init); the step counters in opt
 * are the caller's. The layout is the single-process trainer's, so zt_checkpoint_save writes a
 * checkpoint that does not depend on W or on the device. A collective. */
int zt_zero_cuda_export_state(zt_zero_cuda *z, zt_optimizer *opt, zt_err *err);

/* The reverse: takes this rank's shards of host's parameter slab and of opt's m and v (as
 * zt_checkpoint_load leaves them on every rank) and refreshes the low-precision shards. Synchronous. */
void zt_zero_cuda_import_state(zt_zero_cuda *z, const zt_optimizer *opt);

#endif
