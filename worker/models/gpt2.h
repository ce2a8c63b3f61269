/* GPT-2, built from blocks whose passes are the decoder program's (worker/models/decoder.h) on the CPU and
 * on CUDA.
 *
 * Blocks, in order: 0 = embeddings (wte, wpe); 1..n_layer = transformer layers h.0..h.{L-1};
 * n_layer+1 = final layer norm (ln_f). The LM head is tied to wte. Every block's parameters form one
 * contiguous range of the model's parameter slab (and the same range of the gradient slab), so the
 * runtime can later shard, gather and release a block as one flat buffer.
 *
 * Tensor names and shapes are Hugging Face's GPT2LMHeadModel names without the "transformer." prefix
 * (wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight, ...), but linear weights are kept in
 * nn.Linear layout [out, in]; export and import transpose to HF's Conv1D layout [in, out]. */
#ifndef ZT_WORKER_GPT2_H
#define ZT_WORKER_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "worker/models/family.h" /* zt_family_config_body */
#include "worker/models/params.h" /* zt_param_info, zt_block_info */

typedef struct zt_gpt2_config {
    int n_layer;
    int n_head;
    int n_embd;
    int n_positions;            /* maximum sequence length */
    int vocab_size;
    float layer_norm_epsilon;
    bool tie_word_embeddings;   /* must be true: the head is tied to wte */
} zt_gpt2_config;

/* GPT-2 small's values (12 x 768, 50257 tokens, 1024 positions, eps 1e-5). */
void zt_gpt2_config_default(zt_gpt2_config *cfg);
/* Fills cfg from a Hugging Face config.json object (fields absent keep cfg's values). Unknown fields
 * are errors unless they are known HF GPT-2 fields that do not change the math (dropout rates,
 * architectures, model_type ...); n_inner, activation_function etc. other than GPT-2's are errors.
 * `where` names the source in messages. Validates (zt_gpt2_config_validate) before returning. */
int zt_gpt2_config_from_json(zt_gpt2_config *cfg, const cJSON *obj, const char *where, zt_err *err);
/* Reads a config.json file (see zt_gpt2_config_from_json). */
int zt_gpt2_config_load(zt_gpt2_config *cfg, const char *path, zt_err *err);
/* Writes cfg as a Hugging Face config.json (model_type gpt2, GPT2LMHeadModel), atomically. */
int zt_gpt2_config_save(const zt_gpt2_config *cfg, const char *path, zt_err *err);
/* Checks ranges and consistency (n_embd divisible by n_head, ...). Returns 0 or ZT_EINVAL_CONFIG. */
int zt_gpt2_config_validate(const zt_gpt2_config *cfg, zt_err *err);
/* Number of parameters of a GPT-2 with cfg's shape (cfg valid), computed without creating a model. */
size_t zt_gpt2_config_num_params(const zt_gpt2_config *cfg);

typedef struct zt_gpt2 zt_gpt2; /* opaque */

/* Creates a model with room for batches up to B x T (T <= n_positions). Parameters are initialised as
 * GPT-2 does (normal(0, 0.02); residual projections scaled by 1/sqrt(2 n_layer); layer norms 1 and 0;
 * biases 0) from a deterministic generator seeded with seed. Returns 0 or a code with a message. */
int zt_gpt2_create(zt_gpt2 **out, const zt_gpt2_config *cfg, int B, int T, uint64_t seed, zt_err *err);

/* The model's tables (configuration, tensors, blocks) and no slab, activations or data: for planning
 * (the CUDA executor's shape) before the parameters are allocated. Only the layout queries may be used on it
 * (num_params, tensors, blocks, config). Free with zt_gpt2_destroy. */
int zt_gpt2_create_layout(zt_gpt2 **out, const zt_gpt2_config *cfg, zt_err *err);

void zt_gpt2_destroy(zt_gpt2 *m); /* accepts NULL */

const zt_gpt2_config *zt_gpt2_get_config(const zt_gpt2 *m);
size_t zt_gpt2_num_params(const zt_gpt2 *m);
int zt_gpt2_num_tensors(const zt_gpt2 *m);
const zt_param_info *zt_gpt2_tensor(const zt_gpt2 *m, int i);
int zt_gpt2_num_blocks(const zt_gpt2 *m);
/* The block the head reads: 0 (wte; the head is tied). */
int zt_gpt2_head_block(const zt_gpt2 *m);
const zt_block_info *zt_gpt2_block(const zt_gpt2 *m, int i);
/* The parameter and gradient slabs (num_params floats each), owned by the model. */
float *zt_gpt2_params(zt_gpt2 *m);
float *zt_gpt2_grads(zt_gpt2 *m);

/* Forward pass over tokens [B,T]. With targets (ignore_index -1 allowed) returns the mean loss over the
 * non-ignored positions and keeps the activations for zt_gpt2_backward; with targets NULL only fills the
 * logits (zt_gpt2_logits) and returns 0. B and T may be smaller than at creation. */
float zt_gpt2_forward(zt_gpt2 *m, const int32_t *tokens, const int32_t *targets, int B, int T);
/* Backward of the last forward (which had targets): accumulates (+=) d(mean loss)/d(params) * loss_scale
 * into the gradient slab. Call zt_gpt2_zero_grad first when a new accumulation starts. */
void zt_gpt2_backward(zt_gpt2 *m, float loss_scale);
void zt_gpt2_zero_grad(zt_gpt2 *m);
/* Logits [B,T,V] of the last forward pass; valid until the next forward or backward (backward turns
 * them into their gradient in place). */
const float *zt_gpt2_logits(const zt_gpt2 *m);

/* Per-block passes, for a runtime that keeps each block's parameters in its own (gathered) buffer.
 * bp and bg point at one block's flat parameter and gradient buffers, laid out like the block's range
 * of the slab (tensor offsets relative to zt_gpt2_block(m, block)->offset). zt_gpt2_forward equals
 * zt_gpt2_forward_begin, zt_gpt2_forward_block for blocks 0..n-1, then zt_gpt2_forward_head with block 0's
 * buffer (the head is tied to wte, the first tensor of block 0); zt_gpt2_backward equals
 * zt_gpt2_backward_head, then zt_gpt2_backward_block for blocks n-1..0, bit for bit. Gradients are
 * accumulated (+=) into bg; block 0 receives contributions from the head and from the embedding.
 * zt_gpt2_forward_begin stores the tokens [B,T] (B, T as for zt_gpt2_forward). */
void zt_gpt2_forward_begin(zt_gpt2 *m, const int32_t *tokens, int B, int T);
/* Runs block `block` of the forward pass, reading its input from the previous block's output. */
void zt_gpt2_forward_block(zt_gpt2 *m, int block, const float *bp);
/* The tied head (logits = ln_f output @ wte^T) and, with targets, the mean loss; as zt_gpt2_forward. */
float zt_gpt2_forward_head(zt_gpt2 *m, const float *wte, const int32_t *targets);
/* Starts the backward of the last forward (which had targets): the head's backward, accumulating into
 * dwte (block 0's gradient buffer) and leaving the gradient of ln_f's output for the blocks. */
void zt_gpt2_backward_head(zt_gpt2 *m, const float *wte, float *dwte, float loss_scale);
/* Runs block `block` of the backward pass (blocks in descending order after zt_gpt2_backward_head). */
void zt_gpt2_backward_block(zt_gpt2 *m, int block, const float *bp, float *bg);
/* Activation checkpointing: fills a transformer layer's (1 <= block <= n_layer) intermediate activations
 * with NaN, keeping its output (the next block's input); zt_gpt2_forward_block on the same block
 * recomputes them. Other blocks are left alone. */
void zt_gpt2_discard_block_acts(zt_gpt2 *m, int block);

/* Export to safetensors with Hugging Face GPT2LMHeadModel names ("transformer.h.0.attn.c_attn.weight",
 * Conv1D layout; no lm_head.weight, which HF ties to wte), in F32, atomically. The config is written
 * separately with zt_gpt2_config_save. */
int zt_gpt2_export(const zt_gpt2 *m, const char *path, zt_err *err);
/* The same tensors in Hugging Face's sharded form in the folder dir: shards of at most max_shard_bytes and
 * model.safetensors.index.json, or a single dir/model.safetensors when everything fits. */
int zt_gpt2_export_sharded(const zt_gpt2 *m, const char *dir, size_t max_shard_bytes, zt_err *err);
/* Imports parameters from a safetensors file with HF names (with or without the "transformer." prefix;
 * F32, F16 or BF16), or from the shards of a Hugging Face index (model.safetensors.index.json, or a model
 * directory holding model.safetensors or that index). Every tensor must be present with the right shape; missing, extra (other than
 * lm_head.weight equal to wte, and attn.bias / attn.masked_bias buffers) or misshapen tensors are errors
 * naming the tensor. Nothing in the model changes unless the whole import succeeds. */
int zt_gpt2_import(zt_gpt2 *m, const char *path, zt_err *err);

/* The training engine's view of this model on the CPU (worker/models/model.h), in *out: the per-block
 * passes above over m's activations, with m's layout. m is borrowed and must outlive the result (free it
 * with out->ops->destroy). max_micro is the most micro-batches per step; ckpt_layers (n_layer flags, or
 * NULL for none) names the transformer layers whose activations are dropped after forward and rebuilt
 * before backward. Returns 0 or ZT_EINVAL_CONFIG with a message. */
struct zt_model;
int zt_gpt2_model_cpu(struct zt_model **out, zt_gpt2 *m, int max_micro, const bool *ckpt_layers, zt_err *err);

/* The zt_gpt2_config config inside a zt_family_config of this family (worker/models/family.h). */
#define ZT_GPT2_CONFIG(fc) ((zt_gpt2_config *)zt_family_config_body(fc))

#endif
