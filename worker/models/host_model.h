/* The host model of every family, written once: the family's config struct, its tensor table and blocks,
 * the fp32 parameter and gradient slabs, the decoder program's architecture and CPU runner (decoder.h) or
 * the family's own passes, and the entries of zt_family_def (family.h) that follow from them. A family file
 * then holds only what is its own: the config mapping, the tensor table as data (tensor_table.h: Hugging Face's
 * names, shapes, initialisation, roles) and the architecture (or its passes), given as a zt__hm_spec; neox.c
 * is the example.
 *
 * Blocks are the decoder's: 0 = the embeddings, 1..L = the layers, L+1 = the final norm (and an untied head).
 * The host model borrows the spec (static data of the family) and copies the config. It runs the decoder
 * program (decoder.h, spec->arch) or the encoder program (encoder.h, spec->enc_arch: BERT, RoBERTa) on the CPU
 * and on CUDA; a family whose passes are neither gives its own (zt__hm_passes: T5) and keeps its state beside
 * the tables. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_HOST_MODEL_H
#define ZT_WORKER_MODELS_HOST_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/decoder.h"
#include "worker/models/encoder.h"
#include "worker/models/family.h"
#include "worker/models/params.h"

/* A family's own CPU passes in place of the decoder program's runner (BERT's encoder, T5): its state beside the host
 * model's tables and slabs, and the passes over that state (the zt_family_def entries of the same names). */
typedef struct zt__hm_passes {
    /* The state of host model m (tables and config set, slabs not yet initialised); with acts, the
     * activations for micro-batches up to zt__hm_max_batch x zt__hm_max_seq, without, only what the layout
     * queries of the family need. Returns 0 or ZT_ENOMEM with a message. */
    int (*create)(void **state, const void *m, bool acts, zt_err *err);
    void (*destroy)(void *state); /* accepts NULL */
    void (*forward_begin)(void *state, const int32_t *tokens, int B, int T, const int32_t *pos);
    void (*forward_block)(void *state, int b, const float *w);
    float (*forward_head)(void *state, const float *w, const int32_t *targets);
    void (*backward_head)(void *state, const float *w, float *g, float loss_scale);
    void (*backward_block)(void *state, int b, const float *w, float *g);
    void (*discard_block)(void *state, int b);
    const float *(*logits)(const void *state);
} zt__hm_passes;

struct zt__tt;

/* What a family tells the host model about a valid config (void *cfg: the family's config struct). */
typedef struct zt__hm_spec {
    const zt_family_def *def;  /* the family (its config functions validate and shape the config) */
    size_t config_size;        /* bytes of the family's config struct (<= ZT_FAMILY_CONFIG_BYTES) */
    const char *positions_key; /* the config's name of its longest sequence, for messages (NULL:
                                  "max_position_embeddings") */
    /* The tensors as data (tensor_table.h): the layout, the initialisation and the Hugging Face names come
     * from it. */
    const struct zt__tt *table;
    /* The decoder program's view of cfg (with a->rope, the frequencies' config); the table's roles fill the
     * tensor indices (decoder.h): layer rows by ZT__DEC_* role, final rows by ZT__DEC_FINAL_W, _B, _HEAD. */
    void (*arch)(const void *cfg, zt__dec_arch *a);
    /* Or the encoder program's view (encoder.h; arch is then NULL): its CPU runner and CUDA executor are the
     * host model's, the head reading block a->head_block; the table's roles fill the tensor indices (embedding
     * rows by ZT__ENC_E_*, layer rows by ZT__ENC_*, final rows by ZT__ENC_H_*; a masked-LM head's output
     * weight is the word embeddings). */
    void (*enc_arch)(const void *cfg, zt__enc_arch *a);
    /* Or a family's own passes (arch and enc_arch NULL) and the block its head reads. */
    const zt__hm_passes *passes;
    int (*head_block)(const void *cfg);
    /* NULL: a micro-batch's length is checked against the positions of config_shape; else this check of B x T,
     * with the family's own messages. */
    int (*check_batch)(const void *cfg, int B, int T, zt_err *err);
} zt__hm_spec;

typedef struct zt__hm zt__hm;

/* Creates the host model of cfg (checked by zt__family_validate) for micro-batches up to B x T (T at most
 * the config's positions), initialised from seed. Returns 0, ZT_EINVAL_CONFIG
 * or ZT_ENOMEM with a message. Free with zt__hm_destroy. */
int zt__hm_create(zt__hm **out, const zt__hm_spec *spec, const void *cfg, int B, int T, uint64_t seed, zt_err *err);
/* The same with the parameter slab left unfilled (untouched pages): zt__hm_init_through fills it block by block,
 * in order, with the values zt__hm_create gives, so that the blocks not filled yet take no memory. */
int zt__hm_create_lazy(zt__hm **out, const zt__hm_spec *spec, const void *cfg, int B, int T, uint64_t seed,
                       zt_err *err);
/* Fills the blocks up to and including `block` that are not filled yet (nothing once all are). */
void zt__hm_init_through(void *m, int block);
/* Tensors flagged in skip ([num_tensors]; copied; NULL: none) are left out of the initialisation still to come,
 * their generator draws skipped, so that the others get the values they would have: for tensors an import writes
 * (zt__host_import_open). */
void zt__hm_skip_init(void *m, const bool *skip);
/* Tensor i's values into dst (its numel floats): those of the slab, or for a tensor a lazy model has not filled
 * yet, those zt__hm_init_through will give it (the slab untouched). */
void zt__hm_tensor_values(const void *m, int i, float *dst);
/* The tables only (no slabs, no runner): only the layout queries may be used on it. */
int zt__hm_create_layout(zt__hm **out, const zt__hm_spec *spec, const void *cfg, zt_err *err);
void zt__hm_destroy(void *m); /* accepts NULL */

/* The family's config inside m, its architecture (decoder families) and its passes' state (the encoder
 * runner's, or the family's own passes'). */
const void *zt__hm_config(const void *m);
const struct zt__tt *zt__hm_table(const void *m); /* the spec's table */
const zt__dec_arch *zt__hm_arch(const void *m);
void *zt__hm_state(const void *m);

/* The zt_family_def entries of every host model (m: a zt__hm). */
size_t zt__hm_num_params(const void *m);
int zt__hm_num_tensors(const void *m);
const zt_param_info *zt__hm_tensor(const void *m, int i);
int zt__hm_num_blocks(const void *m);
const zt_block_info *zt__hm_block(const void *m, int i);
int zt__hm_head_block(const void *m);
int zt__hm_max_batch(const void *m);
int zt__hm_max_seq(const void *m);
float *zt__hm_params(void *m);
float *zt__hm_grads(void *m);
void zt__hm_release_params(void *m);
/* pos: NULL, or the [B*T] positions of packed documents (model.h's zt_model_docs) */
void zt__hm_forward_begin(void *m, const int32_t *tokens, int B, int T, const int32_t *pos);
void zt__hm_forward_block(void *m, int b, const float *w);
float zt__hm_forward_head(void *m, const float *w, const int32_t *targets);
void zt__hm_backward_head(void *m, const float *w, float *g, float loss_scale);
void zt__hm_backward_block(void *m, int b, const float *w, float *g);
void zt__hm_discard_block(void *m, int b);
const float *zt__hm_logits(const void *m);
/* The whole passes over m's own slabs, for the families' APIs: after forward_begin, every block's forward and
 * the head's (its loss, as forward_head); the backward of that forward into the gradient slab (+=); the
 * gradient slab zeroed. */
float zt__hm_forward_rest(void *m, const int32_t *targets);
void zt__hm_backward(void *m, float loss_scale);
void zt__hm_zero_grad(void *m);
#ifdef ZT_WITH_CUDA
struct zt_model;
int zt__hm_cuda_create(struct zt_model **out, const void *m, int B, int T, int max_micro, enum zt_dtype dtype,
                       const bool *ckpt_layers, zt_err *err);
struct zt_model *zt__hm_cuda_shape(const void *m, int B, int T, int max_micro, enum zt_dtype dtype,
                                   const bool *ckpt_layers);
#define ZT__HM_CUDA_ENTRIES .cuda_create = zt__hm_cuda_create, .cuda_shape = zt__hm_cuda_shape,
#else
#define ZT__HM_CUDA_ENTRIES
#endif

/* The encoder program's inputs and measure beyond the tokens (encoder.h): token types, the accuracy of the last
 * forward; and those entries of a zt_family_def initialiser. */
void zt__hm_set_token_types(void *m, const int32_t *types);
void zt__hm_accuracy(const void *m, int *correct, int *counted);
#define ZT__HM_ENCODER_ENTRIES                                                                                 \
    .embedding_reads_weights = true, .set_token_types = zt__hm_set_token_types, .accuracy = zt__hm_accuracy,

/* The host-model entries of a zt_family_def initialiser (the family adds create and create_layout); a family
 * with its own CUDA executor takes ZT__HM_HOST_ENTRIES and adds its cuda_create and cuda_shape. */
#define ZT__HM_HOST_ENTRIES                                                                                    \
    .destroy = zt__hm_destroy, .config = zt__hm_config, .num_params = zt__hm_num_params,                       \
    .num_tensors = zt__hm_num_tensors, .tensor = zt__hm_tensor, .num_blocks = zt__hm_num_blocks,               \
    .block = zt__hm_block, .head_block = zt__hm_head_block, .max_batch = zt__hm_max_batch,                     \
    .max_seq = zt__hm_max_seq, .params = zt__hm_params, .grads = zt__hm_grads,                                 \
    .tensor_values = zt__hm_tensor_values, .skip_init = zt__hm_skip_init,                                      \
    .release_params = zt__hm_release_params,                                                                   \
    .forward_begin = zt__hm_forward_begin, .forward_block = zt__hm_forward_block,                              \
    .forward_head = zt__hm_forward_head, .backward_head = zt__hm_backward_head,                                \
    .backward_block = zt__hm_backward_block, .discard_block = zt__hm_discard_block, .logits = zt__hm_logits,
#define ZT__HM_FAMILY_ENTRIES ZT__HM_HOST_ENTRIES ZT__HM_CUDA_ENTRIES
/* The config entries of a zt_family_def initialiser from a field table (an array) and the family's number. */
#define ZT__HM_FIELD_ENTRIES(table, family_number)                                                             \
    .fields = (table), .num_fields = (int)(sizeof(table) / sizeof((table)[0])), .number = (family_number),

/* The typed C API of a family on the host model (gpt2.h and llama.h declare it): prefix p, model type M,
 * config type C, the family's spec and definition. Each function is the zt__hm_ entry of the same name, or
 * the shared safetensors import and export (host_io.h) and CPU executor (cpu_exec.h), which the file that
 * expands it includes. */
#define ZT__HM_TYPED_API(p, M, C, spec, def)                                                                   \
    int p##_create_layout(M **out, const C *cfg, zt_err *err)                                                  \
    {                                                                                                          \
        return zt__hm_create_layout((zt__hm **)out, &(spec), cfg, err);                                        \
    }                                                                                                          \
    int p##_create(M **out, const C *cfg, int B, int T, uint64_t seed, zt_err *err)                            \
    {                                                                                                          \
        return zt__hm_create((zt__hm **)out, &(spec), cfg, B, T, seed, err);                                   \
    }                                                                                                          \
    void p##_destroy(M *m) { zt__hm_destroy(m); }                                                              \
    const C *p##_get_config(const M *m) { return zt__hm_config(m); }                                           \
    size_t p##_num_params(const M *m) { return zt__hm_num_params(m); }                                         \
    int p##_num_tensors(const M *m) { return zt__hm_num_tensors(m); }                                          \
    const zt_param_info *p##_tensor(const M *m, int i) { return zt__hm_tensor(m, i); }                         \
    int p##_num_blocks(const M *m) { return zt__hm_num_blocks(m); }                                            \
    const zt_block_info *p##_block(const M *m, int i) { return zt__hm_block(m, i); }                           \
    int p##_head_block(const M *m) { return zt__hm_head_block(m); }                                            \
    float *p##_params(M *m) { return zt__hm_params(m); }                                                       \
    float *p##_grads(M *m) { return zt__hm_grads(m); }                                                         \
    void p##_forward_begin(M *m, const int32_t *tok, int B, int T) { zt__hm_forward_begin(m, tok, B, T, NULL); } \
    void p##_forward_block(M *m, int b, const float *w) { zt__hm_forward_block(m, b, w); }                     \
    float p##_forward_head(M *m, const float *w, const int32_t *t) { return zt__hm_forward_head(m, w, t); }    \
    void p##_backward_head(M *m, const float *w, float *g, float s) { zt__hm_backward_head(m, w, g, s); }      \
    void p##_backward_block(M *m, int b, const float *w, float *g) { zt__hm_backward_block(m, b, w, g); }      \
    void p##_discard_block_acts(M *m, int b) { zt__hm_discard_block(m, b); }                                   \
    const float *p##_logits(const M *m) { return zt__hm_logits(m); }                                           \
    float p##_forward(M *m, const int32_t *tok, const int32_t *targets, int B, int T)                          \
    {                                                                                                          \
        zt__hm_forward_begin(m, tok, B, T, NULL);                                                              \
        return zt__hm_forward_rest(m, targets);                                                                \
    }                                                                                                          \
    void p##_backward(M *m, float loss_scale) { zt__hm_backward(m, loss_scale); }                              \
    void p##_zero_grad(M *m) { zt__hm_zero_grad(m); }                                                          \
    int p##_model_cpu(struct zt_model **out, M *m, int max_micro, const bool *ckpt_layers, zt_err *err)        \
    {                                                                                                          \
        return zt__cpu_exec_create(out, &(def), m, max_micro, ckpt_layers, err);                               \
    }                                                                                                          \
    int p##_export(const M *m, const char *path, zt_err *err) { return zt__host_export(&(def), m, path, err); } \
    int p##_export_sharded(const M *m, const char *dir, size_t max_shard_bytes, zt_err *err)                   \
    {                                                                                                          \
        return zt__host_export_sharded(&(def), m, dir, max_shard_bytes, err);                                  \
    }                                                                                                          \
    int p##_import(M *m, const char *path, zt_err *err) { return zt__host_import(&(def), m, path, false, err); }

/* The CUDA executor of a family's typed API (prefix p, model type M) over the host model. */
#ifdef ZT_WITH_CUDA
#define ZT__HM_TYPED_CUDA_API(p, M)                                                                            \
    int p##_cuda_create(struct zt_model **out, const M *m, int B, int T, int max_micro, enum zt_dtype dtype,   \
                        const bool *ckpt_layers, zt_err *err)                                                  \
    {                                                                                                          \
        return zt__hm_cuda_create(out, m, B, T, max_micro, dtype, ckpt_layers, err);                           \
    }                                                                                                          \
    struct zt_model *p##_cuda_shape(const M *m, int B, int T, int max_micro, enum zt_dtype dtype,              \
                                    const bool *ckpt_layers)                                                   \
    {                                                                                                          \
        return zt__hm_cuda_shape(m, B, T, max_micro, dtype, ckpt_layers);                                      \
    }
#else
#define ZT__HM_TYPED_CUDA_API(p, M)
#endif

/* ---- configs described by a field table: diff and fingerprint written once ---- */

enum zt__hm_kind { ZT__HM_INT, ZT__HM_BOOL, ZT__HM_FLOAT, ZT__HM_DOUBLE, ZT__HM_ENUM };

typedef struct zt__hm_field {
    const char *name;  /* the config.json key, for messages */
    size_t offset;     /* in the config struct */
    enum zt__hm_kind kind;
    bool hash_only;    /* in the fingerprint, not in the diff (a value a resumed run may change) */
} zt__hm_field;

/* The first field in which configs a and b differ, both values written into av and bv (integers in decimal,
 * booleans as true/false, reals in the shortest decimal that reads back the same); NULL when none. */
const char *zt__hm_config_diff(const zt__hm_field *fields, int n, const void *a, const void *b, char *av, char *bv,
                               size_t cap);
/* A 64-bit FNV-1a hash of family_number and the integer-like fields (int, bool, enum) as int64 in table order,
 * then the real fields as double in table order: the form every family hashed before the field tables. */
uint64_t zt__hm_config_fingerprint(const zt__hm_field *fields, int n, int64_t family_number, const void *cfg);

/* ---- tensor tables ---- */

/* Appends tensor `name` of shape [d0] (d1 0) or [d0, d1] in block `block` at *offset, advancing it. */
void zt__hm_add_tensor(zt_param_info *t, int block, size_t *offset, const char *name, int64_t d0, int64_t d1,
                       bool decay);

#endif
