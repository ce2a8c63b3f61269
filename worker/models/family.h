/* Model families: what the training loop, checkpoints, export and generation need of a model, whatever
 * its architecture, and the registry of the families ztrain knows.
 *
 * A family (GPT-2; LLaMA and Mistral; Qwen2; GPT-NeoX; BERT and RoBERTa; T5 and mT5) is one definition,
 * zt_family_def: its Hugging Face config mapping, its host model (the tensor table and the fp32 parameter
 * slab in the family's layout, initialisation as transformers does, the per-block passes on the CPU) and its
 * CUDA executor. The registry (family.c) lists the definitions and picks one by the config's "model_type";
 * nothing outside worker/models names a family. What a family shares with the others (safetensors import
 * and export from its tensor table, the engine's CPU executor) is written once beside this module
 * (host_io.c, cpu_exec.c).
 *
 * The family of a config.json is its "model_type" (a config without one is GPT-2, as earlier releases
 * wrote them). Every family trains on the CPU and on CUDA GPUs. */
#ifndef ZT_WORKER_MODELS_FAMILY_H
#define ZT_WORKER_MODELS_FAMILY_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/safetensors.h" /* enum zt_dtype */
#include "common/status.h"
#include "worker/models/params.h" /* zt_param_info, zt_block_info */

/* What a model of a family learns from, as the trainer feeds it (worker/train/task.h). */
enum zt_family_task {
    ZT_TASK_CAUSAL_LM = 0, /* the next token of token shards (GPT-2, LLaMA) */
    ZT_TASK_CLASSIFY = 1,  /* a label per sequence: labelled texts (JSONL) */
    ZT_TASK_MASKED_LM = 2, /* masked tokens of token shards */
    ZT_TASK_SEQ2SEQ = 3,   /* a target text per input text (T5): input/target JSONL */
};

/* Bytes a family's own config struct may take inside zt_family_config. */
#define ZT_FAMILY_CONFIG_BYTES 8192

typedef struct zt_family_def zt_family_def;
struct zt_model; /* worker/models/model.h */
struct zt_model_seq2seq; /* worker/models/model.h */

/* A model's configuration: its family and that family's config struct (opaque here: the family's header
 * declares it, zt_family_config_body reaches it). Copy by value. */
typedef struct zt_family_config {
    const zt_family_def *def; /* never NULL once set by zt_family_config_default / _from_json */
    alignas(max_align_t) unsigned char body[ZT_FAMILY_CONFIG_BYTES];
} zt_family_config;

/* The shape of a config, for planning and logs. */
/* The most end-of-sequence ids a config lists (LLaMA 3.1 lists 3). */
#define ZT_FAMILY_MAX_EOS 8

typedef struct zt_family_shape {
    int layers;        /* transformer layers (the blocks checkpointing applies to: blocks 1..layers) */
    int positions;     /* the longest sequence */
    int vocab;
    int width;         /* hidden size */
    int heads;
    size_t num_params;
    enum zt_family_task task;
    int pad_token_id;  /* the padding token (never masked, no loss), or -1 */
    int num_labels;    /* a classifier's outputs; 0 for other tasks */
    int decoder_start_token_id; /* sequence-to-sequence: the decoder's first input; 0 for other tasks */
    int eos_token_id;  /* sequence-to-sequence: where generation stops (-1: none); unset (0) for other tasks */
    int n_eos;         /* the end-of-sequence ids of config.json's eos_token_id (generation stops at them), */
    int eos_ids[ZT_FAMILY_MAX_EOS]; /* n_eos of them; 0: none */
} zt_family_shape;

/* One family. Host-model functions take the family's own host model (void *m: zt_gpt2 *, zt_llama *, ...);
 * config functions the family's config struct. Optional entries are NULL where the family has none. */
struct zt_family_def {
    const char *name;                /* "gpt2", "llama", "bert": logs and messages */
    const char *const *model_types;  /* NULL-terminated "model_type" values the family reads */

    /* Configuration (the family's config struct behind void *). A family whose config.json mapping is data
     * (io: host_config.h's zt__cfg_io) leaves config_from_json, config_save and config_validate NULL: the
     * registry reads, writes and checks through io. */
    void (*config_default)(void *cfg, const char *model_type);
    const struct zt__cfg_io *io;
    int (*config_from_json)(void *cfg, const cJSON *obj, const char *where, zt_err *err);
    int (*config_save)(const void *cfg, const char *path, zt_err *err);
    int (*config_validate)(const void *cfg, zt_err *err);
    /* The config's fields (host_model.h): what zt_family_config_diff compares and the fingerprint hashes
     * after the family's number (fixed once given: 0 gpt2, 1 llama, 2 bert, 4 gpt_neox, 5 t5). NULL with io:
     * the keys of io's table that fill a field. */
    const struct zt__hm_field *fields;
    int num_fields;
    int64_t number;
    void (*config_describe)(const void *cfg, char *buf, size_t cap);
    void (*config_shape)(const void *cfg, zt_family_shape *out);
    /* The name of label i of a classifier (NULL for families without labels). */
    const char *(*config_label)(const void *cfg, int i, char *buf, size_t cap);

    /* The host model: the shared one (host_model.h), given its spec; the family's own entries below are the
     * host model's (ZT__HM_FAMILY_ENTRIES, ZT__HM_HOST_ENTRIES). */
    const struct zt__hm_spec *host;
    void (*destroy)(void *m);
    const void *(*config)(const void *m);
    size_t (*num_params)(const void *m);
    int (*num_tensors)(const void *m);
    const zt_param_info *(*tensor)(const void *m, int i);
    int (*num_blocks)(const void *m);
    const zt_block_info *(*block)(const void *m, int i);
    int (*head_block)(const void *m);   /* the block whose weights the head reads */
    int (*max_batch)(const void *m);
    int (*max_seq)(const void *m);
    float *(*params)(void *m);
    float *(*grads)(void *m);
    /* Tensor i's values into dst (numel floats): the slab's, or those a lazily created model will be filled with */
    void (*tensor_values)(const void *m, int i, float *dst);
    /* Tensors flagged in skip are left out of a lazily created model's initialisation still to come (NULL: none) */
    void (*skip_init)(void *m, const bool *skip);
    void (*release_params)(void *m);
    /* How the tensor table meets Hugging Face files (host_io.c). */
    const struct zt_hf_names *hf;

    /* The per-block passes on the CPU (worker/models/model.h's order; cpu_exec.c drives them). */
    /* pos: NULL, or the positions of packed documents (model.h: zt_model_docs); families without packing
     * take NULL only */
    void (*forward_begin)(void *m, const int32_t *tokens, int B, int T, const int32_t *pos);
    void (*forward_block)(void *m, int b, const float *w);
    float (*forward_head)(void *m, const float *w, const int32_t *targets);
    void (*backward_head)(void *m, const float *w, float *g, float loss_scale);
    void (*backward_block)(void *m, int b, const float *w, float *g);
    void (*discard_block)(void *m, int b);
    const float *(*logits)(const void *m);
    bool embedding_reads_weights;      /* block 0's backward reads its weights */
    void (*set_token_types)(void *m, const int32_t *types);          /* optional */
    void (*accuracy)(const void *m, int *correct, int *counted);     /* optional */
    void (*set_seq2seq)(void *m, const struct zt_model_seq2seq *s);  /* sequence-to-sequence families only */

#ifdef ZT_WITH_CUDA
    /* The CUDA executor of a host model, and its layout without device state (for planning). */
    int (*cuda_create)(struct zt_model **out, const void *m, int B, int T, int max_micro, enum zt_dtype dtype,
                       const bool *ckpt_layers, zt_err *err);
    struct zt_model *(*cuda_shape)(const void *m, int B, int T, int max_micro, enum zt_dtype dtype,
                                   const bool *ckpt_layers);
#endif
};

/* Checks a config struct of def's family (its io's rules, or its config_validate), "model config" named in
 * messages. Internal to worker/models/. */
int zt__family_validate(const zt_family_def *def, const void *body, zt_err *err);

/* The registry: the family reading model_type (NULL when none does). */
const zt_family_def *zt_family_find(const char *model_type);
/* Every model_type the registry reads, in its order, as "gpt2, llama, mistral, ..." into buf (cut at cap). */
void zt_family_list_model_types(char *buf, size_t cap);
/* "gpt2", "llama", ... */
const char *zt_family_name(const zt_family_config *c);

/* GPT-2 small. */
void zt_family_config_default(zt_family_config *c);
/* The family's config struct inside c (its family's header declares the type). */
void *zt_family_config_body(zt_family_config *c);
const void *zt_family_config_body_const(const zt_family_config *c);
/* Sets c to the defaults of model_type's family (which must be registered). */
void zt_family_config_default_of(zt_family_config *c, const char *model_type);
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
enum zt_family_task zt_family_config_task(const zt_family_config *c);

/* Shape queries. */
void zt_family_config_shape(const zt_family_config *c, zt_family_shape *out);
int zt_family_config_layers(const zt_family_config *c);
int zt_family_config_positions(const zt_family_config *c); /* the longest sequence */
int zt_family_config_vocab(const zt_family_config *c);
int zt_family_config_width(const zt_family_config *c);     /* hidden size */
int zt_family_config_heads(const zt_family_config *c);
size_t zt_family_config_num_params(const zt_family_config *c);
/* The name of label i of a classifier's config (its id2label, or "LABEL_<i>" in buf); NULL when the family
 * has no labels. */
const char *zt_family_config_label(const zt_family_config *c, int i, char *buf, size_t cap);
/* A 64-bit fingerprint of every field of c (for checking that ranks run the same model). */
uint64_t zt_family_config_fingerprint(const zt_family_config *c);
/* One line for logs: "GPT-2, 12 layers x 768 wide, 12 heads, vocab 50257, 1024 positions". */
void zt_family_config_describe(const zt_family_config *c, char *buf, size_t cap);

/* The host model of a family. */
typedef struct zt_family_model zt_family_model;

/* Creates the host model for micro-batches up to B x T, initialised as the family does from seed. */
int zt_family_model_create(zt_family_model **out, const zt_family_config *c, int B, int T, uint64_t seed,
                           zt_err *err);
/* The same with the parameter slab filled later, block by block in order, by zt_family_model_init_through (the
 * values zt_family_model_create gives): a run whose engine takes the initial weights block by block holds one
 * block of them at a time (zt_engine_options.fill_host_block). */
int zt_family_model_create_lazy(zt_family_model **out, const zt_family_config *c, int B, int T, uint64_t seed,
                                zt_err *err);
/* Fills the parameter slab's blocks up to and including `block` that are not filled yet (a no-op when all
 * are, and for models created by zt_family_model_create). */
void zt_family_model_init_through(zt_family_model *m, int block);
/* The tables only (no slab): for planning. Only the layout queries may be used on it. */
int zt_family_model_create_layout(zt_family_model **out, const zt_family_config *c, zt_err *err);
void zt_family_model_destroy(zt_family_model *m); /* accepts NULL */

const zt_family_config *zt_family_model_config(const zt_family_model *m);
/* The family's own host model behind m (zt_gpt2 *, zt_llama *, ...: its header's API). */
void *zt_family_model_host(zt_family_model *m);
size_t zt_family_model_num_params(const zt_family_model *m);
int zt_family_model_num_tensors(const zt_family_model *m);
const zt_param_info *zt_family_model_tensor(const zt_family_model *m, int i);
float *zt_family_model_params(zt_family_model *m);
float *zt_family_model_grads(zt_family_model *m);
/* Gives the parameter slab's memory back once the weights live elsewhere: the slab reads as zeros and takes
 * memory again only where written (a checkpoint's export). */
void zt_family_model_release_params(zt_family_model *m);
/* Safetensors with Hugging Face names (host_io.h has the rules). */
int zt_family_model_export(const zt_family_model *m, const char *path, zt_err *err);
/* The export in pieces, for writing model.safetensors from tensors that arrive one at a time (a checkpoint of
 * state on disk); zt_family_model_export writes with these, in table order, after the metadata
 * {"format": "pt"}. Tensor i's Hugging Face name (cap bytes) and shape (its ndim); whether its values are
 * written in another layout (transposed, reordered), and then those values from src (numel) into dst (numel
 * floats; false: src as it is); the most elements that may take. */
void zt_family_model_export_layout(const zt_family_model *m, int i, char *name, size_t cap, int64_t shape[2]);
bool zt_family_model_export_values(const zt_family_model *m, int i, const float *src, float *dst);
size_t zt_family_model_export_staging(const zt_family_model *m);
/* The reverse for reading such files tensor by tensor: tensor i's values from the files' layout (src, numel)
 * into the table's (dst, numel floats) and true, or false (the files hold the table's layout, dst untouched). */
bool zt_family_model_import_values(const zt_family_model *m, int i, const float *src, float *dst);
/* The sharded form into dir (model-0000i-of-0000n.safetensors and model.safetensors.index.json, shards of at
 * most max_shard_bytes; one model.safetensors when everything fits). */
int zt_family_model_export_sharded(const zt_family_model *m, const char *dir, size_t max_shard_bytes, zt_err *err);
/* Reads weights with Hugging Face names; a pretrained encoder without the configured task head keeps the
 * head's initialisation, as transformers' from_pretrained does. Nothing changes unless all of it is read. */
int zt_family_model_import(zt_family_model *m, const char *path, zt_err *err);
/* zt_family_model_import in steps, for a model whose slab is filled block by block as it is taken (a lazily created
 * model under zt_engine_options.fill_host_block): the open reads every tensor of path and refuses what
 * zt_family_model_import refuses, with its messages, writing nothing into m; the fill then writes the files' values
 * into m's slab, blocks in order; the close ends it. Between them the files stay mapped (each tensor's pages given
 * back once read) and the import holds at most zt_family_model_import_staging floats beside m's slab. */
typedef struct zt__host_importer zt_family_import; /* host_io.c's, opaque here */
/* Opens and checks path for m. Returns 0 with *out (freed by zt_family_import_close; it borrows m until then), or a
 * negative code with a message naming the tensor and the file (*out NULL). */
int zt_family_model_import_open(zt_family_model *m, const char *path, zt_family_import **out, zt_err *err);
/* Writes the files' tensors of the blocks up to and including `block` not written yet into m's slab. m's tensors
 * that the files lack (a pretrained body's task head) keep what the slab holds: for a lazily created model, call
 * zt_family_model_init_through(m, block) first, so that they hold the family's initialisation as with
 * zt_family_model_import (between the open and the close that initialisation leaves out the tensors the files
 * hold). */
void zt_family_import_fill_through(zt_family_import *imp, int block);
/* Closes the files and frees imp (accepts NULL); an import whose every block was filled logs, as
 * zt_family_model_import does, the task head's tensors kept and other heads' skipped. */
void zt_family_import_close(zt_family_import *imp);
/* The most floats an import of m holds beside its slab while filling it (the largest tensor of a family that
 * reorders rows, else 0): for planning (m may be a layout). */
size_t zt_family_model_import_staging(const zt_family_model *m);
/* The decoder side of the next forward of a sequence-to-sequence model (model.h's zt_model_seq2seq; the
 * forward's tokens are then the encoder's); other families have none (an assertion). */
void zt_family_model_set_seq2seq(zt_family_model *m, const struct zt_model_seq2seq *s);
/* Forward pass on the CPU (targets NULL: logits only) and its logits [B, T, outputs] ([B, Td, V] after
 * zt_family_model_set_seq2seq); the zeroing of the gradient slab. */
float zt_family_model_forward(zt_family_model *m, const int32_t *tokens, const int32_t *targets, int B, int T);
void zt_family_model_zero_grad(zt_family_model *m);
const float *zt_family_model_logits(const zt_family_model *m);

/* The training engine's executors of m (worker/models/model.h). m must outlive them. */
struct zt_model;
int zt_family_model_cpu(struct zt_model **out, zt_family_model *m, int max_micro, const bool *ckpt_layers,
                        zt_err *err);
#ifdef ZT_WITH_CUDA
int zt_family_model_cuda(struct zt_model **out, const zt_family_model *m, int B, int T, int max_micro,
                         enum zt_dtype dtype, const bool *ckpt_layers, zt_err *err);
/* The CUDA executor's layout without device state, for planning. */
struct zt_model *zt_family_model_cuda_shape(const zt_family_model *m, int B, int T, int max_micro,
                                            enum zt_dtype dtype, const bool *ckpt_layers);
#endif

#endif
