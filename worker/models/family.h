/* Model families: what the training loop, checkpoints, export and generation need of a model, whatever
 * its architecture. A family (GPT-2; LLaMA and Mistral; BERT and RoBERTa) has a Hugging Face config, a host model (the tensor table and
 * the fp32 parameter slab in the family's layout, initialisation, safetensors import and export with
 * Hugging Face names, a forward pass for generation) and executors for the training engine
 * (worker/models/model.h) on the CPU and on CUDA. This module dispatches on the family; the families
 * themselves live beside it (gpt2.h, gpt2_cpu.c, gpt2_cuda.c; llama.h, llama_cpu.c, llama_cuda.c; bert.h, bert_cpu.c, bert_cuda.c).
 *
 * The family of a config.json is its "model_type" ("gpt2"; "llama" or "mistral"; "bert" or "roberta"; a
 * config without one is GPT-2, as earlier releases wrote them). Every family trains on the CPU and on CUDA
 * GPUs. */
#ifndef ZT_WORKER_MODELS_FAMILY_H
#define ZT_WORKER_MODELS_FAMILY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/safetensors.h" /* enum zt_dtype */
#include "common/status.h"
#include "worker/models/gpt2.h"
#include "worker/models/bert.h"
#include "worker/models/llama.h"

enum zt_family { ZT_FAMILY_GPT2 = 0, ZT_FAMILY_LLAMA = 1, ZT_FAMILY_BERT = 2 };

/* "gpt2", "llama", "bert". */
const char *zt_family_name(enum zt_family f);

/* A model's configuration: the family and that family's config. */
typedef struct zt_family_config {
    enum zt_family family;
    zt_gpt2_config gpt2;   /* family gpt2 */
    zt_llama_config llama; /* family llama (LLaMA and Mistral) */
    zt_bert_config bert;   /* family bert (BERT and RoBERTa) */
} zt_family_config;

/* GPT-2 small. */
void zt_family_config_default(zt_family_config *c);
/* Reads a Hugging Face config.json object (the family from "model_type"); `where` names the source in
 * messages. Unknown fields and values are errors naming them. */
int zt_family_config_from_json(zt_family_config *c, const cJSON *obj, const char *where, zt_err *err);
int zt_family_config_load(zt_family_config *c, const char *path, zt_err *err);
/* Writes the Hugging Face config.json of c, atomically. */
int zt_family_config_save(const zt_family_config *c, const char *path, zt_err *err);
int zt_family_config_validate(const zt_family_config *c, zt_err *err);
/* The first field in which a and b differ ("model_type" when the families do), with both values written
 * into av and bv; NULL when they describe the same model. */
const char *zt_family_config_diff(const zt_family_config *a, const zt_family_config *b, char *av, char *bv,
                                  size_t cap);

/* Whether the family has a CUDA executor (every family has one in this version). */
bool zt_family_config_has_cuda(const zt_family_config *c);

/* What a model of c learns from, as the trainer feeds it. */
enum zt_family_task {
    ZT_TASK_CAUSAL_LM = 0, /* GPT-2, LLaMA: the next token of token shards */
    ZT_TASK_CLASSIFY = 1,  /* BERT / RoBERTa with a classification head: labelled texts (JSONL) */
    ZT_TASK_MASKED_LM = 2, /* BERT / RoBERTa with the masked-LM head */
};
enum zt_family_task zt_family_config_task(const zt_family_config *c);

/* Shape queries. */
int zt_family_config_layers(const zt_family_config *c);
int zt_family_config_positions(const zt_family_config *c); /* the longest sequence */
int zt_family_config_vocab(const zt_family_config *c);
int zt_family_config_width(const zt_family_config *c);     /* hidden size */
int zt_family_config_heads(const zt_family_config *c);
size_t zt_family_config_num_params(const zt_family_config *c);
/* A 64-bit fingerprint of every field of c (for checking that ranks run the same model). */
uint64_t zt_family_config_fingerprint(const zt_family_config *c);
/* One line for logs: "GPT-2, 12 layers x 768 wide, 12 heads, vocab 50257, 1024 positions". */
void zt_family_config_describe(const zt_family_config *c, char *buf, size_t cap);

/* The host model of a family. */
typedef struct zt_family_model zt_family_model;

/* Creates the host model for micro-batches up to B x T, initialised as the family does from seed. */
int zt_family_model_create(zt_family_model **out, const zt_family_config *c, int B, int T, uint64_t seed,
                           zt_err *err);
/* The tables only (no slab): for planning. Only the layout queries may be used on it. */
int zt_family_model_create_layout(zt_family_model **out, const zt_family_config *c, zt_err *err);
void zt_family_model_destroy(zt_family_model *m); /* accepts NULL */

const zt_family_config *zt_family_model_config(const zt_family_model *m);
/* The host model behind m in its family's own API (e.g. the whole-model backward), or NULL when m is of
 * another family. */
zt_gpt2 *zt_family_model_gpt2(zt_family_model *m);
zt_llama *zt_family_model_llama(zt_family_model *m);
zt_bert *zt_family_model_bert(zt_family_model *m);
size_t zt_family_model_num_params(const zt_family_model *m);
int zt_family_model_num_tensors(const zt_family_model *m);
const zt_param_info *zt_family_model_tensor(const zt_family_model *m, int i);
float *zt_family_model_params(zt_family_model *m);
float *zt_family_model_grads(zt_family_model *m);
/* See zt_gpt2_release_params. */
void zt_family_model_release_params(zt_family_model *m);
/* Safetensors with Hugging Face names (see the family's header for the rules). */
int zt_family_model_export(const zt_family_model *m, const char *path, zt_err *err);
int zt_family_model_import(zt_family_model *m, const char *path, zt_err *err);
/* Forward pass on the CPU (targets NULL: logits only; see zt_gpt2_forward) and its logits [B, T, V]; for
 * generation, so causal families only (zt_family_config_task). */
float zt_family_model_forward(zt_family_model *m, const int32_t *tokens, const int32_t *targets, int B, int T);
const float *zt_family_model_logits(const zt_family_model *m);

/* The training engine's executors of m (worker/models/model.h). m must outlive them. */
struct zt_model;
int zt_family_model_cpu(struct zt_model **out, zt_family_model *m, int max_micro, const bool *ckpt_layers,
                        zt_err *err);
#ifdef ZT_WITH_CUDA
int zt_family_model_cuda(struct zt_model **out, const zt_family_model *m, int B, int T, int max_micro,
                         enum zt_dtype dtype, const bool *ckpt_layers, zt_err *err);
/* The CUDA executor's layout without device state, for planning (see zt_gpt2_cuda_shape). */
struct zt_model *zt_family_model_cuda_shape(const zt_family_model *m, int B, int T, int max_micro,
                                            enum zt_dtype dtype, const bool *ckpt_layers);
#endif

#endif
