/* What the families written on the LLaMA family share (qwen2.c): the LLaMA config reader and writer with the
 * hooks of a model type's own keys, and the LLaMA family's definition entries (the config checks, shape and
 * fingerprint, the tensor table, the decoder program's architecture, the Hugging Face names), so that such a
 * family's file holds only what is its own. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_LLAMA_FAMILY_H
#define ZT_WORKER_MODELS_LLAMA_FAMILY_H

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/status.h"
#include "worker/models/family.h"
#include "worker/models/host_io.h"
#include "worker/models/host_model.h"
#include "worker/models/llama.h"

/* A model type with LLaMA's math: its config.json names, its value of zt_llama_config.family, whether its
 * q, k and v projections have biases, and its own keys: read after the shared ones (NULL: none) and added to
 * a written config. */
typedef struct zt__llama_variant {
    const char *model_type;   /* "llama" */
    const char *architecture; /* "LlamaForCausalLM" */
    enum zt_llama_family family;
    bool qkv_bias;
    int (*read)(zt_json_reader *r, const cJSON *obj, const zt_llama_config *c, zt_err *err);
    void (*write)(const zt_llama_config *c, cJSON *o);
} zt__llama_variant;

/* Reads a config.json object whose model_type is one of the variants' (NULL-terminated; absent: the variant
 * of cfg's family, else the first) into cfg, as zt_llama_config_from_json does. Returns 0 or
 * ZT_EINVAL_CONFIG; cfg is unchanged on error. */
int zt__llama_config_read(zt_llama_config *cfg, const cJSON *obj, const char *where,
                          const zt__llama_variant *const *variants, zt_err *err);
/* Writes c as variant v's config.json (keys sorted), atomically. Returns 0 or a negative code. */
int zt__llama_config_write(const zt_llama_config *c, const char *path, const zt__llama_variant *v, zt_err *err);

/* The LLaMA family's entries (llama.c), shared by the families written on it. */
#define ZT__LLAMA_NUM_FIELDS 18
extern const zt__hm_field zt__llama_fields[ZT__LLAMA_NUM_FIELDS];
extern const zt_hf_names zt__llama_hf_names;
int zt__llama_config_validate_v(const void *c, zt_err *err);
void zt__llama_describe(const void *c, char *buf, size_t cap);
void zt__llama_shape(const void *c, zt_family_shape *s);
extern const zt__hm_spec zt__llama_spec;
#define ZT__LLAMA_SHARED_ENTRIES                                                                                \
    .config_validate = zt__llama_config_validate_v, ZT__HM_FIELD_ENTRIES(zt__llama_fields, 1)                  \
    .config_describe = zt__llama_describe, .config_shape = zt__llama_shape, .host = &zt__llama_spec,           \
    .hf = &zt__llama_hf_names, ZT__HM_FAMILY_ENTRIES

#endif
