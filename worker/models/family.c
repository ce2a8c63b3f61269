/* The registry of model families, and the calls every family answers; see family.h. This is the only file
 * that names the families. */
#include "worker/models/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "worker/models/cpu_exec.h"   /* the engine's CPU executor of every family */
#include "worker/models/host_config.h" /* config mappings as data */
#include "worker/models/host_io.h"    /* safetensors import and export from the tensor table */
#include "worker/models/host_model.h" /* config field tables: diff and fingerprint */
#include "worker/models/model.h"

/* The families, each defined in its own file (gpt2.c, llama.c, qwen2.c, bert.c, neox.c, t5.c). The first is
 * the default. */
extern const zt_family_def zt__family_gpt2, zt__family_llama, zt__family_qwen2, zt__family_bert, zt__family_neox,
    zt__family_t5;
static const zt_family_def *const registry[] = {&zt__family_gpt2, &zt__family_llama, &zt__family_qwen2,
                                                &zt__family_bert, &zt__family_neox, &zt__family_t5};
#define NFAMILIES ((int)(sizeof registry / sizeof registry[0]))

const zt_family_def *zt_family_find(const char *model_type)
{
    for (int i = 0; i < NFAMILIES; i++)
        for (const char *const *t = registry[i]->model_types; *t; t++)
            if (strcmp(*t, model_type) == 0)
                return registry[i];
    return NULL;
}

const char *zt_family_name(const zt_family_config *c)
{
    return c->def ? c->def->name : "?";
}

void *zt_family_config_body(zt_family_config *c)
{
    return c->body;
}

const void *zt_family_config_body_const(const zt_family_config *c)
{
    return c->body;
}

void zt_family_config_default_of(zt_family_config *c, const char *model_type)
{
    const zt_family_def *def = zt_family_find(model_type);
    ZT_ASSERT(def);
    memset(c, 0, sizeof *c);
    c->def = def;
    def->config_default(c->body, model_type);
}

void zt_family_config_default(zt_family_config *c)
{
    zt_family_config_default_of(c, registry[0]->model_types[0]);
}

void zt_family_list_model_types(char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < NFAMILIES; i++)
        for (const char *const *t = registry[i]->model_types; *t && k < cap; t++)
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", *t);
}

int zt_family_config_from_json(zt_family_config *c, const cJSON *obj, const char *where, zt_err *err)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "model_type");
    if (type && !cJSON_IsString(type))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: \"model_type\" must be a string such as \"gpt2\"", where);
    /* a config without a model_type is GPT-2's, as earlier releases wrote them */
    const char *name = type ? type->valuestring : registry[0]->model_types[0];
    const zt_family_def *def = zt_family_find(name);
    if (!def) {
        char known[256];
        zt_family_list_model_types(known, sizeof known);
        return zt_fail(err, ZT_EUNSUPPORTED, "%s: model_type '%s' is not a family ztrain trains (it trains %s)", where,
                       name, known);
    }
    zt_family_config_default_of(c, name);
    return def->io ? zt__cfg_io_read(def->io, c->body, obj, where, err)
                   : def->config_from_json(c->body, obj, where, err);
}

int zt_family_config_load(zt_family_config *c, const char *path, zt_err *err)
{
    cJSON *root = NULL;
    int rc = zt_json_load_object(path, &root, err);
    if (rc < 0)
        return rc;
    rc = zt_family_config_from_json(c, root, path, err);
    cJSON_Delete(root);
    return rc;
}

int zt_family_config_save(const zt_family_config *c, const char *path, zt_err *err)
{
    return c->def->io ? zt__cfg_io_save(c->def->io, c->body, path, err) : c->def->config_save(c->body, path, err);
}

int zt_family_config_validate(const zt_family_config *c, zt_err *err)
{
    bool known = false;
    for (int i = 0; i < NFAMILIES; i++)
        known |= c->def == registry[i];
    if (!known)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the model config names no known family (set its model_type)");
    return zt__family_validate(c->def, c->body, err);
}

int zt__family_validate(const zt_family_def *def, const void *body, zt_err *err)
{
    return def->io ? zt__cfg_io_validate(def->io, body, "model config", err) : def->config_validate(body, err);
}

/* The fields that say which model a config is: the family's table, or the keys of its io that fill a field
 * (those flagged ZT__CFG_HASH_ONLY in the fingerprint only), into buf [ZT__CFG_MAX_KEYS]. */
static int fields_of(const zt_family_def *def, zt__hm_field *buf, const zt__hm_field **out)
{
    if (def->fields) {
        *out = def->fields;
        return def->num_fields;
    }
    *out = buf;
    int n = 0;
    for (int i = 0; i < def->io->nkeys; i++) {
        const zt__cfg_key *k = &def->io->keys[i];
        static const int kinds[] = {[ZT__CFG_INT] = ZT__HM_INT, [ZT__CFG_FLOAT] = ZT__HM_FLOAT,
                                    [ZT__CFG_DOUBLE] = ZT__HM_DOUBLE, [ZT__CFG_BOOL] = ZT__HM_BOOL,
                                    [ZT__CFG_TOKEN] = ZT__HM_INT, [ZT__CFG_NAME] = ZT__HM_ENUM};
        if (k->type > ZT__CFG_NAME)
            continue; /* no field */
        ZT_ASSERT(n < ZT__CFG_MAX_KEYS);
        buf[n++] = (zt__hm_field){k->key, k->offset, (enum zt__hm_kind)kinds[k->type],
                                  (k->flags & ZT__CFG_HASH_ONLY) != 0};
    }
    return n;
}

const char *zt_family_config_diff(const zt_family_config *a, const zt_family_config *b, char *av, char *bv,
                                  size_t cap)
{
    if (a->def != b->def) {
        snprintf(av, cap, "%s", zt_family_name(a));
        snprintf(bv, cap, "%s", zt_family_name(b));
        return "model_type";
    }
    zt__hm_field buf[ZT__CFG_MAX_KEYS];
    const zt__hm_field *fields;
    const int n = fields_of(a->def, buf, &fields);
    return zt__hm_config_diff(fields, n, a->body, b->body, av, bv, cap);
}

bool zt_family_config_has_cuda(const zt_family_config *c)
{
#ifdef ZT_WITH_CUDA
    return c->def->cuda_create != NULL;
#else
    (void)c;
    return true; /* every family has one; this build has no CUDA backend at all, which the trainer says */
#endif
}

void zt_family_config_shape(const zt_family_config *c, zt_family_shape *out)
{
    c->def->config_shape(c->body, out);
}

/* One field of the shape. */
#define SHAPE_FIELD(fn, field, type)                                                                          \
    type fn(const zt_family_config *c)                                                                        \
    {                                                                                                         \
        zt_family_shape s;                                                                                    \
        c->def->config_shape(c->body, &s);                                                                    \
        return s.field;                                                                                       \
    }
SHAPE_FIELD(zt_family_config_task, task, enum zt_family_task)
SHAPE_FIELD(zt_family_config_layers, layers, int)
SHAPE_FIELD(zt_family_config_positions, positions, int)
SHAPE_FIELD(zt_family_config_vocab, vocab, int)
SHAPE_FIELD(zt_family_config_width, width, int)
SHAPE_FIELD(zt_family_config_heads, heads, int)
SHAPE_FIELD(zt_family_config_num_params, num_params, size_t)
#undef SHAPE_FIELD

const char *zt_family_config_label(const zt_family_config *c, int i, char *buf, size_t cap)
{
    return c->def->config_label ? c->def->config_label(c->body, i, buf, cap) : NULL;
}

/* The family's own fingerprint (which starts with a number of its own, so that families differ). */
uint64_t zt_family_config_fingerprint(const zt_family_config *c)
{
    zt__hm_field buf[ZT__CFG_MAX_KEYS];
    const zt__hm_field *fields;
    const int n = fields_of(c->def, buf, &fields);
    return zt__hm_config_fingerprint(fields, n, c->def->number, c->body);
}

void zt_family_config_describe(const zt_family_config *c, char *buf, size_t cap)
{
    c->def->config_describe(c->body, buf, cap);
}

/* ---- the host model ---- */

struct zt_family_model {
    zt_family_config cfg;
    const zt_family_def *def;
    void *host; /* the family's host model */
};

static int wrap(zt_family_model **out, const zt_family_config *c, void *host)
{
    zt_family_model *m = zt_xcalloc(1, sizeof *m);
    m->cfg = *c;
    m->def = c->def;
    m->host = host;
    *out = m;
    return 0;
}

int zt_family_model_create(zt_family_model **out, const zt_family_config *c, int B, int T, uint64_t seed,
                           zt_err *err)
{
    *out = NULL;
    void *host = NULL;
    int rc = zt__hm_create((zt__hm **)&host, c->def->host, c->body, B, T, seed, err);
    return rc < 0 ? rc : wrap(out, c, host);
}

int zt_family_model_create_lazy(zt_family_model **out, const zt_family_config *c, int B, int T, uint64_t seed,
                                zt_err *err)
{
    *out = NULL;
    void *host = NULL;
    int rc = zt__hm_create_lazy((zt__hm **)&host, c->def->host, c->body, B, T, seed, err);
    return rc < 0 ? rc : wrap(out, c, host);
}

void zt_family_model_init_through(zt_family_model *m, int block)
{
    zt__hm_init_through(m->host, block);
}

int zt_family_model_create_layout(zt_family_model **out, const zt_family_config *c, zt_err *err)
{
    *out = NULL;
    void *host = NULL;
    int rc = zt__hm_create_layout((zt__hm **)&host, c->def->host, c->body, err);
    return rc < 0 ? rc : wrap(out, c, host);
}

void zt_family_model_destroy(zt_family_model *m)
{
    if (!m)
        return;
    m->def->destroy(m->host);
    free(m);
}

const zt_family_config *zt_family_model_config(const zt_family_model *m)
{
    return &m->cfg;
}

void *zt_family_model_host(zt_family_model *m)
{
    return m->host;
}

size_t zt_family_model_num_params(const zt_family_model *m)
{
    return m->def->num_params(m->host);
}

int zt_family_model_num_tensors(const zt_family_model *m)
{
    return m->def->num_tensors(m->host);
}

const zt_param_info *zt_family_model_tensor(const zt_family_model *m, int i)
{
    return m->def->tensor(m->host, i);
}

float *zt_family_model_params(zt_family_model *m)
{
    return m->def->params(m->host);
}

float *zt_family_model_grads(zt_family_model *m)
{
    return m->def->grads(m->host);
}

void zt_family_model_release_params(zt_family_model *m)
{
    m->def->release_params(m->host);
}

int zt_family_model_export(const zt_family_model *m, const char *path, zt_err *err)
{
    return zt__host_export(m->def, m->host, path, err);
}

void zt_family_model_export_layout(const zt_family_model *m, int i, char *name, size_t cap, int64_t shape[2])
{
    zt__host_export_layout(m->def, m->host, i, name, cap, shape);
}

bool zt_family_model_export_values(const zt_family_model *m, int i, const float *src, float *dst)
{
    return zt__host_export_values(m->def, m->host, i, src, dst);
}

bool zt_family_model_import_values(const zt_family_model *m, int i, const float *src, float *dst)
{
    return zt__host_import_values(m->def, m->host, i, src, dst);
}

size_t zt_family_model_export_staging(const zt_family_model *m)
{
    return zt__host_export_staging(m->def, m->host);
}

int zt_family_model_export_sharded(const zt_family_model *m, const char *dir, size_t max_shard_bytes, zt_err *err)
{
    return zt__host_export_sharded(m->def, m->host, dir, max_shard_bytes, err);
}

int zt_family_model_import(zt_family_model *m, const char *path, zt_err *err)
{
    return zt__host_import(m->def, m->host, path, true, err);
}

int zt_family_model_import_open(zt_family_model *m, const char *path, zt_family_import **out, zt_err *err)
{
    return zt__host_import_open(m->def, m->host, path, true, out, err);
}

void zt_family_import_fill_through(zt_family_import *imp, int block)
{
    zt__host_import_fill_through(imp, block);
}

void zt_family_import_close(zt_family_import *imp)
{
    zt__host_import_close(imp);
}

size_t zt_family_model_import_staging(const zt_family_model *m)
{
    return zt__host_import_staging(m->def, m->host);
}

/* The head block's weights (or gradients) in the slab. */
static size_t head_offset(const zt_family_model *m)
{
    return m->def->block(m->host, m->def->head_block(m->host))->offset;
}

void zt_family_model_set_seq2seq(zt_family_model *m, const struct zt_model_seq2seq *s)
{
    ZT_ASSERT(m->def->set_seq2seq); /* a sequence-to-sequence family */
    m->def->set_seq2seq(m->host, s);
}

float zt_family_model_forward(zt_family_model *m, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    const zt_family_def *d = m->def;
    const float *params = d->params(m->host);
    d->forward_begin(m->host, tokens, B, T, NULL);
    for (int b = 0; b < d->num_blocks(m->host); b++)
        d->forward_block(m->host, b, params + d->block(m->host, b)->offset);
    return d->forward_head(m->host, params + head_offset(m), targets);
}

void zt_family_model_zero_grad(zt_family_model *m)
{
    memset(m->def->grads(m->host), 0, m->def->num_params(m->host) * sizeof(float));
}

const float *zt_family_model_logits(const zt_family_model *m)
{
    return m->def->logits(m->host);
}

int zt_family_model_cpu(struct zt_model **out, zt_family_model *m, int max_micro, const bool *ckpt_layers,
                        zt_err *err)
{
    return zt__cpu_exec_create(out, m->def, m->host, max_micro, ckpt_layers, err);
}

#ifdef ZT_WITH_CUDA
int zt_family_model_cuda(struct zt_model **out, const zt_family_model *m, int B, int T, int max_micro,
                         enum zt_dtype dtype, const bool *ckpt_layers, zt_err *err)
{
    return m->def->cuda_create(out, m->host, B, T, max_micro, dtype, ckpt_layers, err);
}

struct zt_model *zt_family_model_cuda_shape(const zt_family_model *m, int B, int T, int max_micro,
                                            enum zt_dtype dtype, const bool *ckpt_layers)
{
    return m->def->cuda_shape(m->host, B, T, max_micro, dtype, ckpt_layers);
}
#endif
