/* GPT-2 on one CUDA GPU: the device twin of worker/models/gpt2.h, built from the same blocks.
 *
 * The host model (zt_gpt2) stays the source of truth for the configuration, the parameter table and
 * the file formats (import, export, checkpoints); this object mirrors its parameters on the device and
 * runs forward and backward there with the CUDA kernels:
 *   - fp32 master weights, fp32 gradients and fp32 Adam moments (m, v), in one device layout: the host
 *     slab's tensors in order, each tensor starting on a 64-element boundary, wte padded to a vocabulary
 *     that is a multiple of 128 rows (extra rows stay 0);
 *   - a low-precision copy of the weights (dtype: bf16, fp16, or none for fp32) that the kernels read,
 *     and low-precision gradients that the kernels write; after each block's backward they are folded
 *     into the fp32 gradients (scaled by 1 / loss_scale), so accumulation over micro-batches is fp32;
 *   - activations in dtype (layer-norm statistics, attention lse and losses in fp32).
 * Blocks as on the CPU: 0 = embeddings (and the tied head), 1..L = layers, L+1 = ln_f. Each block's
 * forward reads its weights from the block's range of the low-precision slab and its backward writes
 * into the block's range of the gradient slab, so a sharded runtime can gather and reduce per block.
 *
 * Every device buffer is carved from one allocation made at creation (plus the cuBLASLt workspace);
 * nothing is allocated inside a step. All work goes to one stream; the host waits only where a value
 * is read back (zt_gpt2_cuda_step_finish, zt_gpt2_cuda_eval_loss). */
#ifndef ZT_WORKER_GPT2_CUDA_H
#define ZT_WORKER_GPT2_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "kernels/adamw.h"
#include "worker/models/gpt2.h"

typedef struct zt_gpt2_cuda zt_gpt2_cuda; /* opaque */

/* What the device model holds besides activations:
 *   FULL          fp32 master weights, fp32 gradients, Adam m and v, and the low-precision copies (optimizer
 *                 placement gpu: the whole step runs on the device);
 *   NO_OPTIMIZER  only the compute-dtype weights, the low-precision gradients and the fp32 gradients (optimizer
 *                 placement cpu or server: the master weights and moments live on the host or in state
 *                 servers; after each step the caller downloads the gradients with zt_gpt2_cuda_download_grads
 *                 and uploads the updated weights with zt_gpt2_cuda_upload_weights). 8 bytes per parameter
 *                 instead of FULL's 20 (bf16/fp16 compute) or 16 (fp32). */
enum zt_gpt2_cuda_state { ZT_GPT2_CUDA_FULL = 0, ZT_GPT2_CUDA_NO_OPTIMIZER = 1, ZT_GPT2_CUDA_HOOKED = 2 };

/* zt_gpt2_cuda_create with a choice of what the device holds (see zt_gpt2_cuda_state). In NO_OPTIMIZER mode the
 * weights on the device start as the host model's parameters rounded to dtype; zt_gpt2_cuda_upload,
 * zt_gpt2_cuda_download and zt_gpt2_cuda_step_update are not available (they need the fp32 state). */
int zt_gpt2_cuda_create_state(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                              enum zt_gpt2_cuda_state state, zt_err *err);

/* Creates the device model for batches up to B x T and steps of up to max_micro micro-batches, with
 * compute type dtype (F32, BF16 or F16) on the current CUDA device, copies the host model's parameters
 * to it and zeroes the Adam moments. The host model must outlive the device model. Logs the memory
 * plan. Returns 0, or ZT_ENOMEM / ZT_EUNSUPPORTED
 * with a message saying what to change. Free with zt_gpt2_cuda_destroy. */
int zt_gpt2_cuda_create(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        zt_err *err);
/* Frees everything the device model owns (after waiting for its stream); accepts NULL. */
void zt_gpt2_cuda_destroy(zt_gpt2_cuda *g);

/* The compute type chosen at creation. */
enum zt_dtype zt_gpt2_cuda_dtype(const zt_gpt2_cuda *g);

/* Copies parameters (host slab layout, num_params floats) and, when m and v are not NULL, the Adam
 * moments to the device, and refreshes the low-precision copy. Synchronous. */
void zt_gpt2_cuda_upload(zt_gpt2_cuda *g, const float *params, const float *m, const float *v);
/* Copies the fp32 master weights (and m, v when not NULL) back into host slabs. Synchronous. */
void zt_gpt2_cuda_download(zt_gpt2_cuda *g, float *params, float *m, float *v);

/* Starts a step: the next zt_gpt2_cuda_train_micro overwrites the fp32 gradients instead of adding. */
void zt_gpt2_cuda_zero_grad(zt_gpt2_cuda *g);

/* One micro-batch of training: forward and backward over tokens/targets [B,T] (host arrays; targets
 * -1 are ignored), adding d(mean loss)/d(params) * grad_weight to the fp32 gradients, where the
 * backward runs with the loss multiplied by loss_scale (fp16) and the result is divided by it again.
 * Asynchronous: the micro-batch's losses are read by zt_gpt2_cuda_step_finish. micro is 0 for the
 * first micro-batch of a step and counts up (below the max_micro given at creation). */
void zt_gpt2_cuda_train_micro(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T,
                              int micro, float grad_weight, float loss_scale);

/* Queues the optimizer update after the micro-batches of a step: global gradient norm, clip
 * coefficient (grad_clip, 0 = none), a non-finite check of the gradients and losses (the update is
 * skipped on the device when it fires), then the fused AdamW of every tensor (p->grad_scale should be
 * 1, p->step the 1-based Adam step the update would be) and the new low-precision weights. */
void zt_gpt2_cuda_step_update(zt_gpt2_cuda *g, const zt_adamw_params *p, float grad_clip);

/* Waits for the step and reports: *loss = mean over the micro-batches of their mean loss (as the CPU
 * trainer computes it), *grad_norm = the global norm before clipping, *nonfinite = whether the update
 * was skipped for an inf/NaN gradient or loss. micros is the number of micro-batches of the step. */
void zt_gpt2_cuda_step_finish(zt_gpt2_cuda *g, int micros, float *loss, double *grad_norm, bool *nonfinite);

/* Waits for the step's micro-batches and returns their mean loss (as zt_gpt2_cuda_step_finish computes it), for
 * a step whose update does not run on the device (NO_OPTIMIZER mode). */
float zt_gpt2_cuda_step_loss(zt_gpt2_cuda *g, int micros);

/* Copies the fp32 gradients of the step (the sum over its micro-batches, already divided by the loss scale)
 * into grads, a host array in the host slab's layout (num_params floats). Synchronous. Either mode. */
void zt_gpt2_cuda_download_grads(zt_gpt2_cuda *g, float *grads);

/* Replaces the compute weights with w, a host array in the host slab's layout of num_params elements of
 * wdtype: the compute dtype chosen at creation, or F32 (rounded on the device; this overwrites the step's fp32
 * gradients, so download them first). NO_OPTIMIZER mode only. The copy is finished when the call returns,
 * so w may be changed right away. */
void zt_gpt2_cuda_upload_weights(zt_gpt2_cuda *g, const void *w, enum zt_dtype wdtype);

/* Mean loss of one batch without backward (evaluation). Synchronous. */
float zt_gpt2_cuda_eval_loss(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T);
/* The same in two halves: queue the forward pass, then wait for it and return the mean loss (so that a
 * caller can wait in its own way in between, e.g. watching its communicator). */
void zt_gpt2_cuda_eval_enqueue(zt_gpt2_cuda *g, const int32_t *tokens, const int32_t *targets, int B, int T);
float zt_gpt2_cuda_eval_read(zt_gpt2_cuda *g);

/* HOOKED mode (ZT_GPT2_CUDA_HOOKED, for the ZeRO runtime worker/runtime/zero_cuda.h): the device model
 * holds no parameters, gradients or optimizer state, only activations and scratch, and asks the hooks
 * for every block's weights and gradient buffer (device pointers in the device layout below, valid
 * until released / done). The calls, in order, for one training micro-batch:
 *   acquire/release 0 (embeddings), acquire/release 1..L (layers), acquire L+1 then 0 (ln_f and the
 *   tied head, kept through the head's backward), grad_buffer L+1 and 0, release L+1 and 0,
 *   grads_done L+1; for l = L..1: acquire l, (the layer's forward again if checkpointed), grad_buffer
 *   l, release l, grads_done l; then grad_buffer 0 again (the embeddings) and grads_done 0.
 * Evaluation does the forward part and releases L+1 and 0 after the head. Every call happens on the
 * host while the kernels are only enqueued on the model's stream (zt_gpt2_cuda_stream): the hooks
 * order their own work against it with events. A gradient buffer must be zeroed when first handed out
 * in a micro-batch (block 0 is asked twice); backward adds into it, in the compute dtype, with the
 * loss scale still applied; grads_done means every kernel writing it has been enqueued. */
typedef struct zt_gpt2_cuda_hooks {
    void *ctx;                                     /* passed back to every hook */
    void *(*acquire_weights)(void *ctx, int block);
    void (*release_weights)(void *ctx, int block);
    void *(*grad_buffer)(void *ctx, int block);
    void (*grads_done)(void *ctx, int block);
} zt_gpt2_cuda_hooks;

/* Creates a HOOKED device model (see above) for batches up to B x T and max_micro micro-batches per
 * step. checkpointed (n_layer flags, or NULL for none) names the layers that keep only their output
 * and recompute their other activations (into one shared set) right before their backward. The hooks
 * table is copied. Returns 0, or an error as zt_gpt2_cuda_create. In this mode upload, download,
 * step_update, step_finish and download_grads are not available; use zt_gpt2_cuda_step_loss. */
int zt_gpt2_cuda_create_hooked(zt_gpt2_cuda **out, zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                               const zt_gpt2_cuda_hooks *hooks, const bool *checkpointed, zt_err *err);

/* The model's stream (a cudaStream_t) and its device int that collects the non-finite check of the
 * losses (zeroed at each step's first micro-batch). */
void *zt_gpt2_cuda_stream(zt_gpt2_cuda *g);
int *zt_gpt2_cuda_flag(zt_gpt2_cuda *g);

/* The device layout (elements): where block b and tensor i start and how long they are. Blocks are
 * contiguous in block order; every tensor starts on a 64-element boundary; wte is padded to a
 * vocabulary that is a multiple of 128 rows. */
size_t zt_gpt2_cuda_block_offset(const zt_gpt2_cuda *g, int b);
size_t zt_gpt2_cuda_block_len(const zt_gpt2_cuda *g, int b);
size_t zt_gpt2_cuda_tensor_offset(const zt_gpt2_cuda *g, int i);
size_t zt_gpt2_cuda_tensor_len(const zt_gpt2_cuda *g, int i);
/* Bytes of the model's device pool. */
size_t zt_gpt2_cuda_pool_bytes(const zt_gpt2_cuda *g);

/* Profiling mode (bench): when on, every kernel family of the forward and backward is timed with CUDA
 * events and zt_gpt2_cuda_profile_report logs the accumulated milliseconds per family. Slows a step. */
void zt_gpt2_cuda_set_profiling(zt_gpt2_cuda *g, bool on);
void zt_gpt2_cuda_profile_report(zt_gpt2_cuda *g);

#endif
