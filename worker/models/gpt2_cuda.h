/* GPT-2 on one CUDA GPU: the device twin of worker/models/gpt2.h's per-block passes, as the training
 * engine drives them (worker/models/model.h).
 *
 * The host model (zt_gpt2) stays the source of truth for the configuration, the tensor table and the
 * file formats; this object holds only what the passes need on the device: activations in the compute
 * dtype (layer-norm statistics, attention lse and losses in fp32), scratch, the cuBLASLt handle and the
 * model's stream. Weights and gradients come from the engine, block by block, in the device layout:
 * the host slab's tensors in order, each starting on a 64-element boundary, wte padded to a vocabulary
 * that is a multiple of 128 rows (the padding rows' weights are zero and their gradients are never
 * read). Blocks as on the CPU: 0 = embeddings (and the tied head), 1..L = layers, L+1 = ln_f.
 *
 * Every device buffer is carved from one allocation made at creation (plus the cuBLASLt workspace);
 * nothing is allocated inside a step. All kernels go to the model's stream. */
#ifndef ZT_WORKER_GPT2_CUDA_H
#define ZT_WORKER_GPT2_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "worker/models/gpt2.h"
#include "worker/models/model.h"

/* Bytes of device memory zt_gpt2_cuda_create would take for these sizes (activations and scratch, the
 * cuBLASLt workspace not included), without creating anything: for the engine's memory plan. */
size_t zt_gpt2_cuda_plan_bytes(const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                               const bool *ckpt_layers);

/* A model with the device layout of host's GPT-2 for these sizes (blocks, tensors, checkpointed blocks;
 * device_bytes = what zt_gpt2_cuda_plan_bytes counts) and no device state: for planning with
 * zt_engine_plan_for. Its passes must not be run. Free with ->ops->destroy. */
zt_model *zt_gpt2_cuda_shape(const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers);

/* Creates the device passes of host's GPT-2 in *out for micro-batches up to B x T, steps of up to
 * max_micro micro-batches and compute dtype dtype (F32, BF16 or F16), on the current CUDA device.
 * ckpt_layers (n_layer flags, or NULL) names the layers that keep only their output and rebuild their
 * other activations (into one set they share) before their backward. host must outlive the model. Logs
 * the model's memory. Returns 0, or ZT_EUNSUPPORTED (a shape the kernels do not serve) / ZT_ENOMEM with a
 * message saying what to change. Free with (*out)->ops->destroy. */
int zt_gpt2_cuda_create(zt_model **out, const zt_gpt2 *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err);

/* Profiling mode (bench): when on, every kernel family of the forward and backward is timed with CUDA
 * events and zt_gpt2_cuda_profile_report logs the accumulated milliseconds per family. Slows a step. */
void zt_gpt2_cuda_set_profiling(zt_model *m, bool on);
void zt_gpt2_cuda_profile_report(zt_model *m);

#endif
