/* BERT and RoBERTa encoders (Hugging Face BertModel / RobertaModel), built from blocks: explicit forward and
 * backward, the encoder program (worker/models/encoder.h) run by its CPU runner or its CUDA executor, with one
 * of two task heads.
 *
 * Blocks, in order: 0 = embeddings (word, position and token-type embeddings, then a LayerNorm);
 * 1..L = encoder layers, post-LN: x = LN(x + attention.output.dense(attention(x)));
 * x = LN(x + output.dense(gelu(intermediate.dense(x)))); L+1 = the task head, either
 *   masked LM (BertForMaskedLM, RobertaForMaskedLM): transform dense, GELU, LayerNorm, then a decoder
 *     tied to the word embeddings plus a decoder bias: logits [B,T,V];
 *   sequence classification (BertForSequenceClassification, RobertaForSequenceClassification): dense and
 *     tanh on the first token ([CLS] / <s>: BERT's pooler, RoBERTa's classifier.dense), then a dense layer
 *     to num_labels: logits [B,num_labels].
 * Every block's parameters form one contiguous range of the parameter slab (and of the gradient slab), as in
 * the GPT-2 model (worker/models/gpt2.h), whose zt_param_info and zt_block_info tables this model uses.
 *
 * Tensor names are Hugging Face's full names for the configured architecture ("bert.encoder.layer.0.
 * attention.self.query.weight", "cls.predictions.bias", "roberta.embeddings.word_embeddings.weight",
 * "lm_head.dense.weight", "classifier.out_proj.bias", ...); linear weights are [out, in] as in nn.Linear,
 * so export and import copy them unchanged. Inside a layer the slab holds query, key and value weights
 * one after the other, then their biases, so that one matmul computes q, k and v.
 *
 * Padding. A sequence's padding is its trailing run of pad_token_id (tokenizers pad on the right by
 * default): those positions are not attended to, and no position whose token is pad_token_id counts in a
 * loss. A pad token followed by other tokens is attended to like any token. The logits of padded positions
 * are not Hugging Face's (RoBERTa gives them other position ids) and mean nothing.
 *
 * Positions: BERT's position ids are 0..T-1. RoBERTa's are pad_token_id + 1 + t for the tokens of a
 * sequence, as Hugging Face's create_position_ids_from_input_ids gives them for right padding; so a RoBERTa
 * sequence holds at most max_position_embeddings - pad_token_id - 1 tokens (512 for roberta-base).
 *
 * Token types (segment ids): zt_bert_set_token_types before each forward; none means all zero.
 *
 * Losses. Masked LM: the mean cross-entropy over the positions whose target is not -1 (the caller masks
 * the inputs and writes the targets: the masked-LM task, worker/train/task.h). Classification: targets [B,T] hold sequence b's
 * label at targets[b*T] and -1 elsewhere; the loss is the mean cross-entropy of the labelled sequences
 * (a label of -1 leaves the sequence out). zt_bert_accuracy counts the correct argmax predictions. */
#ifndef ZT_WORKER_BERT_H
#define ZT_WORKER_BERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/rng.h"
#include "common/status.h"
#include "worker/models/family.h" /* zt_family_config_body */
#include "worker/models/gpt2.h" /* zt_param_info, zt_block_info */

/* The task head (Hugging Face "architectures"). */
enum zt_bert_head {
    ZT_BERT_HEAD_MLM = 0,      /* BertForMaskedLM / RobertaForMaskedLM */
    ZT_BERT_HEAD_CLASSIFY = 1, /* BertForSequenceClassification / RobertaForSequenceClassification */
};

/* hidden_act: "gelu" is the exact form x Phi(x); "gelu_new" (also accepted as "gelu_pytorch_tanh") the
 * tanh approximation. RoBERTa's masked-LM head applies the exact form whatever hidden_act says, as
 * transformers does. */
enum zt_bert_act {
    ZT_BERT_ACT_GELU = 0,
    ZT_BERT_ACT_GELU_TANH = 1,
};

/* Most labels a classification head has, and the room their names take (NUL-separated, in label order). */
#define ZT_BERT_MAX_LABELS 4096
#define ZT_BERT_LABEL_TEXT 4096

typedef struct zt_bert_config {
    bool roberta;                /* model_type "roberta" (else "bert") */
    enum zt_bert_head head;
    int vocab_size;
    int hidden_size;
    int num_hidden_layers;
    int num_attention_heads;     /* any count that divides hidden_size */
    int intermediate_size;
    int max_position_embeddings;
    int type_vocab_size;         /* rows of token_type_embeddings (RoBERTa: 1) */
    int pad_token_id;
    enum zt_bert_act hidden_act;
    float layer_norm_eps;
    float initializer_range;     /* std of the normal initialisation */
    int num_labels;              /* classification head: outputs; kept (not used) for masked LM */
    char label_names[ZT_BERT_LABEL_TEXT]; /* num_labels names, NUL-separated ("" = LABEL_0, LABEL_1, ...) */
} zt_bert_config;

/* bert-base-uncased with the masked-LM head: 12 x 768, 12 heads, 3072 wide MLP, vocab 30522, 512 positions,
 * 2 token types, eps 1e-12, pad 0, exact GELU, initializer_range 0.02, 2 labels. */
void zt_bert_config_default(zt_bert_config *cfg);
/* RoBERTa's defaults (roberta-base): as above with vocab 50265, 514 positions, 1 token type, eps 1e-5,
 * pad 1. */
void zt_bert_config_default_roberta(zt_bert_config *cfg);
/* Fills cfg from a Hugging Face config.json object (BertConfig or RobertaConfig). "model_type" ("bert" or
 * "roberta") picks the defaults of absent fields (cfg's values when the model types agree); "architectures"
 * picks the head (absent: cfg's). Accepted besides the sizes: hidden_act, layer_norm_eps, pad_token_id,
 * position_embedding_type ("absolute"), num_labels / id2label / label2id, problem_type
 * ("single_label_classification" or null), classifier_dropout, hidden_dropout_prob and
 * attention_probs_dropout_prob (ztrain trains without dropout), initializer_range, torch_dtype, and the
 * fields every transformers config carries that do not change the math (transformers_version, use_cache,
 * token ids, ...). Any other field, and a value ztrain does not implement, is ZT_EINVAL_CONFIG naming it;
 * cfg is unchanged on error. `where` names the source in messages. Validates before returning. */
int zt_bert_config_from_json(zt_bert_config *cfg, const cJSON *obj, const char *where, zt_err *err);
/* Reads a config.json file (see zt_bert_config_from_json; absent fields take the model type's defaults). */
int zt_bert_config_load(zt_bert_config *cfg, const char *path, zt_err *err);
/* Writes cfg as a Hugging Face config.json (model_type, architectures, every size, id2label and label2id),
 * atomically; transformers loads it. Dropout probabilities are written as 0 (ztrain trains without). */
int zt_bert_config_save(const zt_bert_config *cfg, const char *path, zt_err *err);
/* Checks ranges and consistency. Returns 0 or ZT_EINVAL_CONFIG with a message. */
int zt_bert_config_validate(const zt_bert_config *cfg, zt_err *err);
/* Number of parameters of a model with cfg's shape (cfg valid), without creating it. */
size_t zt_bert_config_num_params(const zt_bert_config *cfg);
/* The longest sequence cfg's position table serves: max_position_embeddings, less pad_token_id + 1 for
 * RoBERTa. */
int zt_bert_config_max_seq(const zt_bert_config *cfg);
/* Outputs of the head per scored row: vocab_size (masked LM) or num_labels (classification). */
int zt_bert_config_outputs(const zt_bert_config *cfg);
/* Hugging Face's class for cfg ("BertForMaskedLM", "RobertaForSequenceClassification", ...). */
const char *zt_bert_config_architecture(const zt_bert_config *cfg);
/* The name of label i (0 <= i < num_labels): its id2label entry, or "LABEL_<i>" written into buf. */
const char *zt_bert_config_label(const zt_bert_config *cfg, int i, char *buf, size_t cap);

/* The tensor table's order: the embeddings (block 0), then each encoder layer's tensors, then the head's. */
enum zt_bert_emb_tensor {
    ZT_BERT_E_WORD, ZT_BERT_E_POS, ZT_BERT_E_TYPE, ZT_BERT_E_LN_W, ZT_BERT_E_LN_B, ZT_BERT_E_COUNT
};
/* An encoder layer: q, k and v weights adjacent (one [3C, C] matrix), then their biases (one [3C] vector). */
enum zt_bert_layer_tensor {
    ZT_BERT_T_Q_W, ZT_BERT_T_K_W, ZT_BERT_T_V_W, ZT_BERT_T_Q_B, ZT_BERT_T_K_B, ZT_BERT_T_V_B,
    ZT_BERT_T_AO_W, ZT_BERT_T_AO_B, ZT_BERT_T_ALN_W, ZT_BERT_T_ALN_B,
    ZT_BERT_T_I_W, ZT_BERT_T_I_B, ZT_BERT_T_O_W, ZT_BERT_T_O_B, ZT_BERT_T_OLN_W, ZT_BERT_T_OLN_B,
    ZT_BERT_T_COUNT
};
/* The head (block L+1): masked LM or classification. */
enum zt_bert_mlm_tensor { ZT_BERT_H_DENSE_W, ZT_BERT_H_DENSE_B, ZT_BERT_H_LN_W, ZT_BERT_H_LN_B, ZT_BERT_H_BIAS,
                          ZT_BERT_H_MLM_COUNT };
enum zt_bert_cls_tensor { ZT_BERT_H_POOL_W, ZT_BERT_H_POOL_B, ZT_BERT_H_CLS_W, ZT_BERT_H_CLS_B, ZT_BERT_H_CLS_COUNT };
#define ZT_BERT_LAYER_TENSOR(l, k) (ZT_BERT_E_COUNT + (l) * ZT_BERT_T_COUNT + (k))
#define ZT_BERT_HEAD_TENSOR(L, k) (ZT_BERT_E_COUNT + (L) * ZT_BERT_T_COUNT + (k))

typedef struct zt_bert zt_bert; /* opaque: the shared host model of this family (family.h's void *m) */

/* Creates a model with room for batches up to B x T (T <= zt_bert_config_max_seq). Parameters are
 * initialised as BertPreTrainedModel does: normal(0, initializer_range) for linear weights and embeddings
 * (the word embeddings' pad_token_id row zeroed, and RoBERTa's position embeddings' too, as
 * nn.Embedding(padding_idx) leaves them), LayerNorm weights 1 and biases 0, every bias 0 (the decoder bias
 * too), from a deterministic generator seeded with seed (common/rng.h). Returns 0, ZT_EINVAL_CONFIG or
 * ZT_ENOMEM with a message; free with zt_bert_destroy. */
int zt_bert_create(zt_bert **out, const zt_bert_config *cfg, int B, int T, uint64_t seed, zt_err *err);
/* The tables (configuration, tensors, blocks) without slabs or activations: for planning. Only the layout
 * queries may be used on it. Free with zt_bert_destroy. */
int zt_bert_create_layout(zt_bert **out, const zt_bert_config *cfg, zt_err *err);
void zt_bert_destroy(zt_bert *m); /* accepts NULL */

const zt_bert_config *zt_bert_get_config(const zt_bert *m);
size_t zt_bert_num_params(const zt_bert *m);
int zt_bert_num_tensors(const zt_bert *m);
const zt_param_info *zt_bert_tensor(const zt_bert *m, int i);
int zt_bert_num_blocks(const zt_bert *m); /* num_hidden_layers + 2 */
const zt_block_info *zt_bert_block(const zt_bert *m, int i);
/* The block whose parameters the head pass reads: 0 for masked LM (the decoder is the word embeddings,
 * block 0's first tensor), num_hidden_layers + 1 for classification (the classifier). */
int zt_bert_head_block(const zt_bert *m);
/* The parameter and gradient slabs (num_params floats each), owned by the model. */
float *zt_bert_params(zt_bert *m);
float *zt_bert_grads(zt_bert *m);

/* Token types [B,T] (ids below type_vocab_size) for the next forward pass: zt_bert_forward or
 * zt_bert_forward_begin copies them (the caller's array is read only then) and forgets the pointer, so
 * every batch sets its own; never set, or NULL, means type 0 everywhere. */
void zt_bert_set_token_types(zt_bert *m, const int32_t *types);

/* Forward pass over tokens [B,T]. With targets (the layouts above; -1 ignored) returns the mean loss over
 * the counted rows (0 when none) and keeps the activations for zt_bert_backward; with targets NULL only
 * fills the logits and returns 0. B and T may be smaller than at creation. Tokens outside the vocabulary,
 * targets outside [0, outputs) other than -1, a classification target other than -1 after a sequence's
 * first position, and token types out of range are caller bugs (abort). */
float zt_bert_forward(zt_bert *m, const int32_t *tokens, const int32_t *targets, int B, int T);
/* Backward of the last forward (which had targets): accumulates (+=) d(mean loss)/d(params) * loss_scale
 * into the gradient slab. */
void zt_bert_backward(zt_bert *m, float loss_scale);
void zt_bert_zero_grad(zt_bert *m);
/* Logits of the last forward pass: [B,T,V] (masked LM) or [B,num_labels] (classification); valid until the
 * next forward or backward (backward turns them into their gradient). */
const float *zt_bert_logits(const zt_bert *m);
/* Rows scored by the last forward with targets (counted targets) and how many of them the logits' argmax
 * (the first highest) gets right: masked-LM positions or labelled sequences. */
void zt_bert_accuracy(const zt_bert *m, int *correct, int *counted);

/* Per-block passes, for a runtime that keeps each block's parameters in its own buffer (bp, bg laid out like
 * the block's range of the slab), as zt_gpt2's: zt_bert_forward equals zt_bert_forward_begin,
 * zt_bert_forward_block for blocks 0..n-1, then zt_bert_forward_head with the buffer of block
 * zt_bert_head_block; zt_bert_backward equals zt_bert_backward_head (into that block's gradient buffer),
 * then zt_bert_backward_block for blocks n-1..0, bit for bit. Gradients accumulate (+=). The masked-LM
 * decoder bias belongs to block L+1: zt_bert_forward_block(L+1) keeps a copy of it for the head, and
 * zt_bert_backward_block(L+1) adds the gradient that zt_bert_backward_head left for it. */
void zt_bert_forward_begin(zt_bert *m, const int32_t *tokens, int B, int T);
void zt_bert_forward_block(zt_bert *m, int block, const float *bp);
/* The head's output layer (the tied decoder, or the classifier) and, with targets, the mean loss. */
float zt_bert_forward_head(zt_bert *m, const float *hp, const int32_t *targets);
/* The head's backward: accumulates into hg (the head block's gradient buffer) and leaves the gradient of
 * block L+1's output for zt_bert_backward_block. */
void zt_bert_backward_head(zt_bert *m, const float *hp, float *hg, float loss_scale);
void zt_bert_backward_block(zt_bert *m, int block, const float *bp, float *bg);
/* Activation checkpointing: fills an encoder layer's (1 <= block <= L) intermediate activations with NaN,
 * keeping its output; zt_bert_forward_block on the same block recomputes them. Other blocks: no-op. */
void zt_bert_discard_block_acts(zt_bert *m, int block);

/* Export to safetensors with Hugging Face names (F32, {"format": "pt"}), atomically: what
 * BertForMaskedLM.from_pretrained (or the configured class) loads. The tied decoder weight and bias are
 * left out, as transformers saves them. The config is written with zt_bert_config_save. */
int zt_bert_export(const zt_bert *m, const char *path, zt_err *err);
/* The same tensors in Hugging Face's sharded form in the folder dir: shards of at most max_shard_bytes and
 * model.safetensors.index.json, or a single dir/model.safetensors when everything fits. */
int zt_bert_export_sharded(const zt_bert *m, const char *dir, size_t max_shard_bytes, zt_err *err);
/* Imports parameters from a safetensors file with Hugging Face names (F32, F16 or BF16), from the shards of
 * an index (model.safetensors.index.json), or from a model directory holding model.safetensors or that
 * index. Encoder and embedding tensors may lack the "bert." / "roberta." prefix; LayerNorm "gamma" and
 * "beta" are read as weight and bias. The position_ids and token_type_ids buffers are ignored, as is the
 * decoder weight (bias) when equal to the word embeddings (decoder bias). Missing, unexpected, repeated or
 * misshapen tensors are ZT_EMISMATCH naming the tensor and the file; nothing changes unless the whole
 * import succeeds. */
int zt_bert_import(zt_bert *m, const char *path, zt_err *err);
/* zt_bert_import for fine-tuning from a pretrained checkpoint (bert-base-uncased into a classifier, say), as
 * transformers' from_pretrained does it: the tensors of the task head (block L+1) that the files lack keep
 * their current values (the initialisation), and the tensors of other heads in the files (cls.*, lm_head.*,
 * classifier.*, a pooler) are skipped; both counts are logged. Everything else is as strict as
 * zt_bert_import: the encoder and embeddings must all be there with the right shapes. */
int zt_bert_import_pretrained(zt_bert *m, const char *path, zt_err *err);

/* The training engine's view of this model on the CPU (worker/models/model.h): the per-block passes above,
 * with m's layout; head_block is zt_bert_head_block(m). m is borrowed and must outlive the result (free it
 * with out->ops->destroy). max_micro is the most micro-batches per step; ckpt_layers (num_hidden_layers
 * flags, or NULL) names the encoder layers whose activations are dropped after forward. The trainer sets
 * token types on m (zt_bert_set_token_types) before each micro-batch. Returns 0 or ZT_EINVAL_CONFIG. */
struct zt_model;
int zt_bert_model_cpu(struct zt_model **out, zt_bert *m, int max_micro, const bool *ckpt_layers, zt_err *err);

#ifdef ZT_WITH_CUDA
#include "common/safetensors.h" /* enum zt_dtype */
/* The training engine's view of m's model on one CUDA GPU (the encoder's CUDA executor, encoder.h), for
 * micro-batches up to B x T, steps of up to max_micro micro-batches and compute dtype F32, BF16 or F16, on the
 * current CUDA device; ckpt_layers as in zt_bert_model_cpu. Activations live in the compute dtype (LayerNorm
 * statistics, attention lse and losses in fp32), carved from one device allocation made here. m is borrowed
 * and must outlive the result (free it with out->ops->destroy). Returns 0, or ZT_EUNSUPPORTED / ZT_ENOMEM with
 * a message saying what to change. */
int zt_bert_cuda_create(struct zt_model **out, const zt_bert *m, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err);
/* Its layout and device bytes with no device state: for planning. Free with ->ops->destroy. */
struct zt_model *zt_bert_cuda_shape(const zt_bert *m, int B, int T, int max_micro, enum zt_dtype dtype,
                                    const bool *ckpt_layers);
#endif

/* The zt_bert_config config inside a zt_family_config of this family (worker/models/family.h). */
#define ZT_BERT_CONFIG(fc) ((zt_bert_config *)zt_family_config_body(fc))

#endif
