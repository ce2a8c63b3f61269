/* LLaMA (and Mistral) on one CUDA GPU: the device twin of worker/models/llama.h's per-block passes, as the
 * training engine drives them (worker/models/model.h), built from the same kernels as the CPU passes
 * (RMSNorm, RoPE, grouped-query attention, SwiGLU) in their CUDA forms.
 *
 * The host model (zt_llama) stays the source of truth for the configuration, the tensor table and the file
 * formats; this object holds only what the passes need on the device: activations in the compute dtype
 * (RMSNorm statistics, attention lse and losses in fp32), scratch, the RoPE frequencies, the cuBLASLt handle
 * and the model's stream. Weights and gradients come from the engine, block by block, in the device layout:
 * the host slab's tensors in order, each starting on a 64-element boundary except k_proj and v_proj (right
 * after q_proj) and up_proj (right after gate_proj), so that each group stays one packed weight; embed_tokens
 * and lm_head are padded to a vocabulary that is a multiple of 128 rows (the padding rows' weights are zero
 * and their gradients are never read). Blocks as on the CPU: 0 = embed_tokens, 1..L = layers, L+1 = norm
 * (and lm_head when the head is untied).
 *
 * Every device buffer is carved from one allocation made at creation (plus the cuBLASLt workspace); nothing
 * is allocated inside a step. All kernels go to the model's stream. */
#ifndef ZT_WORKER_LLAMA_CUDA_H
#define ZT_WORKER_LLAMA_CUDA_H

#include <stdbool.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "worker/models/llama.h"
#include "worker/models/model.h"

/* A model with the device layout of host's LLaMA for these sizes (blocks, tensors, checkpointed blocks;
 * device_bytes = its activations and scratch) and no device state: for planning. Its passes must not be
 * run. Free with ->ops->destroy. */
zt_model *zt_llama_cuda_shape(const zt_llama *host, int B, int T, int max_micro, enum zt_dtype dtype,
                              const bool *ckpt_layers);

/* Creates the device passes of host's LLaMA in *out for micro-batches up to B x T, steps of up to max_micro
 * micro-batches and compute dtype dtype (F32, BF16 or F16), on the current CUDA device. ckpt_layers
 * (num_hidden_layers flags, or NULL) names the layers that keep only their output and rebuild their other
 * activations (into one set they share) before their backward. host must outlive the model. Logs the
 * model's memory. Returns 0, or ZT_EUNSUPPORTED (a shape the kernels do not serve) / ZT_ENOMEM with a message
 * saying what to change. Free with (*out)->ops->destroy. The model offers ->logits. */
int zt_llama_cuda_create(zt_model **out, const zt_llama *host, int B, int T, int max_micro, enum zt_dtype dtype,
                         const bool *ckpt_layers, zt_err *err);

#endif
