/* LLaMA (Hugging Face LlamaForCausalLM, MistralForCausalLM without a sliding window, and Qwen2ForCausalLM:
 * LLaMA with q, k and v biases), built from blocks whose passes are the decoder program's
 * (worker/models/decoder.h) on the CPU and on CUDA, with the API of the GPT-2 host model
 * (worker/models/gpt2.h) one for one.
 *
 * Blocks, in order: 0 = the token embedding (embed_tokens); 1..L = decoder layers layers.0..layers.{L-1};
 * L+1 = the final RMSNorm (norm) and, when the head is untied, the output head (lm_head). The head reads
 * embed_tokens (block 0) when tie_word_embeddings is true and lm_head (block L+1) otherwise:
 * zt_llama_head_block says which. Every block's parameters form one contiguous range of the parameter slab
 * (and the same range of the gradient slab).
 *
 * A layer: h = x + o_proj(attention(rope(q), rope(k), v)) with q, k, v = q_proj, k_proj, v_proj of
 * input_layernorm(x); out = h + down_proj(silu(gate_proj(g)) * up_proj(g)) with g = post_attention_layernorm(h).
 * Attention is causal with grouped key/value heads (num_key_value_heads divides num_attention_heads).
 *
 * Tensor names are Hugging Face's without the "model." prefix (embed_tokens.weight,
 * layers.0.input_layernorm.weight, layers.0.self_attn.q_proj.weight, ..., norm.weight), and lm_head.weight.
 * Linear weights are in nn.Linear layout [out, in], as Hugging Face stores them. In a layer's range,
 * q_proj, k_proj and v_proj follow each other, so that together they are one [(NH + 2 NKV) * HS, C] weight
 * whose matmul gives the packed q | k | v rows the attention and RoPE kernels read, and gate_proj and
 * up_proj likewise form one [2F, C] weight, the layout of the SwiGLU kernel. */
#ifndef ZT_WORKER_LLAMA_H
#define ZT_WORKER_LLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "worker/models/family.h" /* zt_family_config_body */
#include "kernels/rope.h"         /* zt_rope_config */
#include "worker/models/params.h" /* zt_param_info, zt_block_info */

/* Hugging Face model types with LLaMA's math; saved in configs: only grows. */
enum zt_llama_family {
    ZT_LLAMA_FAMILY_LLAMA = 0,   /* model_type "llama", LlamaForCausalLM */
    ZT_LLAMA_FAMILY_MISTRAL = 1, /* model_type "mistral", MistralForCausalLM, without a sliding window */
    ZT_LLAMA_FAMILY_QWEN2 = 2,   /* model_type "qwen2", Qwen2ForCausalLM: q, k and v projections with biases */
};

/* The most end-of-sequence ids a config may list (LLaMA-3.1 lists three). */
#define ZT_LLAMA_MAX_EOS 8

typedef struct zt_llama_config {
    enum zt_llama_family family;
    bool qkv_bias;               /* q_proj, k_proj and v_proj have biases (Qwen2; no other family here) */
    int num_hidden_layers;       /* L */
    int hidden_size;             /* C */
    int num_attention_heads;     /* NH; head size HS = C / NH (head_dim) */
    int num_key_value_heads;     /* NKV, divides NH: NH / NKV query heads share a key/value head */
    int intermediate_size;       /* F, the MLP's width */
    int max_position_embeddings; /* the longest sequence */
    int vocab_size;              /* V */
    float rms_norm_eps;
    zt_rope_config rope;         /* rope_theta and rope_scaling */
    bool tie_word_embeddings;    /* the head reads embed_tokens; no lm_head */
    double initializer_range;    /* standard deviation of the initial linear and embedding weights */
    int bos_token_id;            /* -1: none (null) */
    int pad_token_id;            /* -1: none; else embed_tokens' padding row (zero at init, no gradient from
                                    the embedding, as nn.Embedding's padding_idx) */
    int num_eos_token_ids;       /* 0 (null), 1 (an id) or more (a list) */
    int eos_token_ids[ZT_LLAMA_MAX_EOS];
} zt_llama_config;

/* Hugging Face LlamaConfig's defaults (LLaMA-7B: 32 x 4096, 32 heads, MLP 11008, 32000 tokens, 2048
 * positions, eps 1e-6, rope_theta 10000, untied head, initializer_range 0.02, bos 1, eos 2). */
void zt_llama_config_default(zt_llama_config *cfg);
/* Fills cfg from a Hugging Face config.json object of model_type "llama" or "mistral" (fields absent keep
 * cfg's values, except num_key_value_heads, which means num_attention_heads when absent or null, as in
 * transformers; transformers 4.x's rope_theta and rope_scaling and 5.x's rope_parameters). Fields that do
 * not change the math (token ids, dtype, bookkeeping) are accepted; any other field, and values ztrain does
 * not compute (hidden_act other than "silu", biases, dropout, a rope scaling other than linear and llama3, a
 * sliding window shorter than the context, ...), are errors naming the field. `where` names the source in
 * messages. Validates (zt_llama_config_validate) before returning; cfg is unchanged on error. */
int zt_llama_config_from_json(zt_llama_config *cfg, const cJSON *obj, const char *where, zt_err *err);
/* Reads a config.json file (see zt_llama_config_from_json) on top of cfg's values. */
int zt_llama_config_load(zt_llama_config *cfg, const char *path, zt_err *err);
/* Writes cfg as a Hugging Face config.json (LlamaForCausalLM or MistralForCausalLM, rope_theta and
 * rope_scaling as transformers 4.x writes them, which 5.x reads too), atomically. */
int zt_llama_config_save(const zt_llama_config *cfg, const char *path, zt_err *err);
/* Checks ranges and consistency (C divisible by NH, NH by NKV, an even head size, the rope scaling's
 * values). Returns 0 or ZT_EINVAL_CONFIG. */
int zt_llama_config_validate(const zt_llama_config *cfg, zt_err *err);
/* Number of parameters of a LLaMA with cfg's shape (cfg valid), computed without creating a model. */
size_t zt_llama_config_num_params(const zt_llama_config *cfg);

/* The tensors of a decoder layer, in slab order: q, k, v adjacent (one packed weight), gate and up adjacent
 * (one packed weight). The tensor table holds embed_tokens, then every layer's tensors in this order, then
 * norm and (untied) lm_head. */
enum zt_llama_layer_tensor {
    ZT_LLAMA_T_IN_NORM,
    ZT_LLAMA_T_Q,
    ZT_LLAMA_T_K,
    ZT_LLAMA_T_V,
    ZT_LLAMA_T_O,
    ZT_LLAMA_T_POST_NORM,
    ZT_LLAMA_T_GATE,
    ZT_LLAMA_T_UP,
    ZT_LLAMA_T_DOWN,
    ZT_LLAMA_T_COUNT,
    /* Qwen2's layers end with the biases of q, k and v, adjacent (one packed bias of the packed weight). */
    ZT_LLAMA_T_Q_BIAS = ZT_LLAMA_T_COUNT,
    ZT_LLAMA_T_K_BIAS,
    ZT_LLAMA_T_V_BIAS,
    ZT_LLAMA_T_COUNT_QKV_BIAS
};
/* Tensors per decoder layer of cfg: ZT_LLAMA_T_COUNT, or ZT_LLAMA_T_COUNT_QKV_BIAS with q/k/v biases. */
int zt_llama_config_layer_tensors(const zt_llama_config *cfg);
/* Index of tensor k of layer l in the tensor table of a model with `per` tensors per layer; the final norm
 * is ZT_LLAMA_LAYER_TENSOR(per, L, 0) and an untied lm_head the one after it. */
#define ZT_LLAMA_LAYER_TENSOR(per, l, k) (1 + (l) * (per) + (k))

typedef struct zt_llama zt_llama; /* opaque */

/* Creates a model with room for batches up to B x T (T <= max_position_embeddings). Parameters are
 * initialised as LlamaPreTrainedModel does (normal(0, initializer_range) for embed_tokens, lm_head and every
 * linear weight, in slab order from one generator seeded with seed; RMSNorm weights 1; the padding row of
 * embed_tokens 0). Returns 0 or a code with a message. Free with zt_llama_destroy. */
int zt_llama_create(zt_llama **out, const zt_llama_config *cfg, int B, int T, uint64_t seed, zt_err *err);
/* The model's tables (configuration, tensors, blocks) and no slab, activations or data: for planning before
 * the parameters are allocated. Only the layout queries may be used on it (config, num_params, tensors,
 * blocks, head_block). Free with zt_llama_destroy. */
int zt_llama_create_layout(zt_llama **out, const zt_llama_config *cfg, zt_err *err);
void zt_llama_destroy(zt_llama *m); /* accepts NULL */

const zt_llama_config *zt_llama_get_config(const zt_llama *m);
size_t zt_llama_num_params(const zt_llama *m);
int zt_llama_num_tensors(const zt_llama *m);
const zt_param_info *zt_llama_tensor(const zt_llama *m, int i);
int zt_llama_num_blocks(const zt_llama *m); /* num_hidden_layers + 2 */
const zt_block_info *zt_llama_block(const zt_llama *m, int i);
/* The block whose weights the head reads: 0 (embed_tokens) when tied, num_hidden_layers + 1 (lm_head)
 * when not. */
int zt_llama_head_block(const zt_llama *m);
/* The parameter and gradient slabs (num_params floats each), owned by the model. */
float *zt_llama_params(zt_llama *m);
float *zt_llama_grads(zt_llama *m);

/* Forward pass over tokens [B,T]. With targets (ignore_index -1 allowed) returns the mean cross-entropy over
 * the non-ignored positions and keeps the activations for zt_llama_backward; with targets NULL only fills
 * the logits (zt_llama_logits) and returns 0. B and T may be smaller than at creation. Tokens outside
 * [0, vocab_size), other targets outside it, or B x T beyond the size given at create are caller bugs. */
float zt_llama_forward(zt_llama *m, const int32_t *tokens, const int32_t *targets, int B, int T);
/* Backward of the last forward (which had targets): accumulates (+=) d(mean loss)/d(params) * loss_scale
 * into the gradient slab. Call zt_llama_zero_grad first when a new accumulation starts. */
void zt_llama_backward(zt_llama *m, float loss_scale);
void zt_llama_zero_grad(zt_llama *m);
/* Logits [B,T,V] of the last forward pass; valid until the next forward or backward (backward turns them
 * into their gradient in place). */
const float *zt_llama_logits(const zt_llama *m);

/* Per-block passes, for a runtime that keeps each block's parameters in its own (gathered) buffer. bp and
 * bg point at one block's flat parameter and gradient buffers, laid out like the block's range of the slab
 * (tensor offsets relative to zt_llama_block(m, block)->offset). zt_llama_forward equals
 * zt_llama_forward_begin, zt_llama_forward_block for blocks 0..n-1, then zt_llama_forward_head with the head
 * block's buffer; zt_llama_backward equals zt_llama_backward_head (into the head block's gradient buffer),
 * then zt_llama_backward_block for blocks n-1..0, bit for bit. Gradients are accumulated (+=) into bg; the
 * head block receives the head's contribution first and its own later. */
void zt_llama_forward_begin(zt_llama *m, const int32_t *tokens, int B, int T);
/* Runs block `block` of the forward pass, reading its input from the previous block's output. */
void zt_llama_forward_block(zt_llama *m, int block, const float *bp);
/* The head (logits = norm output @ W^T, with W embed_tokens or lm_head inside hp, the buffer of block
 * zt_llama_head_block) and, with targets, the mean loss; as zt_llama_forward. */
float zt_llama_forward_head(zt_llama *m, const float *hp, const int32_t *targets);
/* Starts the backward of the last forward (which had targets): the head's backward, accumulating the head
 * weight's gradient into hg (the head block's gradient buffer) and leaving the gradient of the final norm's
 * output for the blocks. */
void zt_llama_backward_head(zt_llama *m, const float *hp, float *hg, float loss_scale);
/* Runs block `block` of the backward pass (blocks in descending order after zt_llama_backward_head). */
void zt_llama_backward_block(zt_llama *m, int block, const float *bp, float *bg);
/* Activation checkpointing: fills a decoder layer's (1 <= block <= num_hidden_layers) intermediate
 * activations with NaN, keeping its output (the next block's input); zt_llama_forward_block on the same
 * block recomputes them. Other blocks are left alone. */
void zt_llama_discard_block_acts(zt_llama *m, int block);

/* Export to safetensors with Hugging Face LlamaForCausalLM names ("model.layers.0.self_attn.q_proj.weight",
 * ..., and "lm_head.weight" when the head is untied), in F32 with metadata {"format": "pt"}, atomically.
 * The config is written separately with zt_llama_config_save. */
int zt_llama_export(const zt_llama *m, const char *path, zt_err *err);
/* The same tensors in Hugging Face's sharded form in the folder dir: shards of at most max_shard_bytes and
 * model.safetensors.index.json, or a single dir/model.safetensors when everything fits
 * (zt_st_writer_write_sharded). */
int zt_llama_export_sharded(const zt_llama *m, const char *dir, size_t max_shard_bytes, zt_err *err);
/* Imports parameters from a safetensors file with Hugging Face names (with or without the "model." prefix;
 * F32, F16 or BF16), or from the shards of a Hugging Face index (model.safetensors.index.json, or a model
 * directory holding model.safetensors or that index). Every tensor must be present with the right shape;
 * missing, unknown or misshapen tensors are errors naming the tensor and its file. rotary_emb.inv_freq
 * buffers are ignored; with a tied head, an lm_head.weight in the file must equal embed_tokens. Nothing in
 * the model changes unless the whole import succeeds. */
int zt_llama_import(zt_llama *m, const char *path, zt_err *err);

/* The training engine's view of this model on the CPU (worker/models/model.h), in *out: the per-block passes
 * above over m's activations, with m's layout and head_block = zt_llama_head_block(m). m is borrowed and
 * must outlive the result (free it with out->ops->destroy). max_micro is the most micro-batches per step;
 * ckpt_layers (num_hidden_layers flags, or NULL for none) names the decoder layers whose activations are
 * dropped after forward and rebuilt before backward. Returns 0 or ZT_EINVAL_CONFIG with a message. */
struct zt_model;
int zt_llama_model_cpu(struct zt_model **out, zt_llama *m, int max_micro, const bool *ckpt_layers, zt_err *err);

/* The zt_llama_config config inside a zt_family_config of this family (worker/models/family.h). */
#define ZT_LLAMA_CONFIG(fc) ((zt_llama_config *)zt_family_config_body(fc))

#ifdef ZT_WITH_CUDA
#include "common/safetensors.h" /* enum zt_dtype */
/* The training engine's executor of m on one CUDA GPU (the decoder program of worker/models/decoder.h),
 * for micro-batches up to B x T computing in dtype; ckpt_layers (num_hidden_layers flags, or NULL) names the
 * checkpointed layers. m is borrowed and must outlive it. Returns 0, or ZT_EUNSUPPORTED / ZT_ENOMEM. */
int zt_llama_cuda_create(struct zt_model **out, const zt_llama *m, int B, int T, int max_micro, enum zt_dtype dtype,
                         const bool *ckpt_layers, zt_err *err);
/* Its layout and device bytes with no device state: for planning. Free with ->ops->destroy. */
struct zt_model *zt_llama_cuda_shape(const zt_llama *m, int B, int T, int max_micro, enum zt_dtype dtype,
                                     const bool *ckpt_layers);
#endif

#endif
