/* A family's config.json mapping as data: reading, checking and writing from its key table; see
 * host_config.h. */
#include "worker/models/host_config.h"

#include <math.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"             /* zt_write_file_atomic_parts */
#include "common/status.h"             /* zt_xmalloc */
#include "worker/models/host_shared.h" /* the keys every Hugging Face config carries, short decimals */
#include "kernels/rope.h"               /* zt_rope_config */

#define FIELD(cfg, k, T) ((T *)((char *)(cfg) + (k)->offset))

int zt__cfg_begin(zt_json_reader *r, const cJSON *obj, const char *where, const char *const *model_types, int *type,
                  zt_err *err)
{
    if (!cJSON_IsObject(obj))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the model config must be a JSON object", where);
    const int nkeys = cJSON_GetArraySize(obj);
    if (nkeys > ZT_JSON_MAX_KEYS - 32)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %d fields is more than a %s config.json has (at most %d)", where,
                       nkeys, model_types[0], ZT_JSON_MAX_KEYS - 32);
    zt_json_reader_init(r, obj, where);
    char text[64] = "";
    int rc = zt_json_get_string(r, "model_type", text, sizeof text, err);
    if (rc < 0)
        return rc;
    *type = -1;
    for (int i = 0; text[0] && model_types[i]; i++)
        if (strcmp(text, model_types[i]) == 0)
            *type = i;
    if (text[0] && *type < 0) {
        char list[160] = "";
        for (int i = 0; model_types[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "", model_types[i]);
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: model_type is \"%s\", but this loader reads only %s configs",
                       where, text, list);
    }
    return 0;
}

/* An int key, and its alias when the row has one: both given must agree. */
static int read_int(zt_json_reader *r, const zt__cfg_key *k, void *cfg, zt_err *err)
{
    int v = 0, a = 0;
    bool have = false, have_alias = false;
    int rc = zt__host_json_int(r, k->key, (int64_t)k->min, (int64_t)k->max, &v, &have, err);
    if (rc == 0 && k->alias)
        rc = zt__host_json_int(r, k->alias, (int64_t)k->min, (int64_t)k->max, &a, &have_alias, err);
    if (rc < 0)
        return rc;
    if (have && have_alias && v != a)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s (%d) and its alias %s (%d) disagree (keep only %s)", r->where,
                       k->key, v, k->alias, a, k->key);
    if (have || have_alias)
        *FIELD(cfg, k, int) = have ? v : a;
    return 0;
}

/* A key that must hold the one value ztrain computes. */
static int read_only(zt_json_reader *r, const cJSON *item, const zt__cfg_key *k, zt_err *err)
{
    zt_json_accept(r, k->key);
    if (cJSON_IsNull(item) && (k->flags & ZT__CFG_NULL_OK))
        return 0;
    cJSON *want = cJSON_Parse(k->value);
    ZT_ASSERT(want); /* the tables' values are JSON */
    const bool same = cJSON_IsNumber(want) ? cJSON_IsNumber(item) && item->valuedouble == want->valuedouble
                                           : cJSON_Compare(item, want, true);
    cJSON_Delete(want);
    if (same)
        return 0;
    char *got = cJSON_PrintUnformatted(item);
    int rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s is %.80s, but ztrain supports only %s (%s)", r->where, k->key,
                     got ? got : "?", k->value, k->why);
    cJSON_free(got);
    return rc;
}

int zt__cfg_read(zt_json_reader *r, const cJSON *obj, const zt__cfg_key *keys, int n, void *cfg, zt_err *err)
{
    for (int i = 0; i < n; i++) {
        const zt__cfg_key *k = &keys[i];
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, k->key);
        if (!item && !(k->type == ZT__CFG_INT && k->alias)) {
            zt_json_accept(r, k->key); /* known, so that a misspelt key's message can name it */
            continue;
        }
        if (item && cJSON_IsNull(item) && (k->flags & ZT__CFG_NULL_OK) && k->type != ZT__CFG_ONLY) {
            zt_json_accept(r, k->key);
            continue;
        }
        int rc = 0;
        double d;
        char text[64] = "";
        switch (k->type) {
        case ZT__CFG_INT:
            rc = read_int(r, k, cfg, err);
            break;
        case ZT__CFG_FLOAT:
            d = *FIELD(cfg, k, float);
            rc = zt_json_get_double(r, k->key, k->min, k->max, &d, err);
            *FIELD(cfg, k, float) = (float)d;
            break;
        case ZT__CFG_DOUBLE:
            rc = zt_json_get_double(r, k->key, k->min, k->max, FIELD(cfg, k, double), err);
            break;
        case ZT__CFG_BOOL:
            rc = zt_json_get_bool(r, k->key, FIELD(cfg, k, bool), err);
            break;
        case ZT__CFG_TOKEN:
            rc = zt__host_json_token_id(r, obj, k->key, FIELD(cfg, k, int), err);
            break;
        case ZT__CFG_NAME: {
            if ((rc = zt_json_get_string(r, k->key, text, sizeof text, err)) < 0)
                break;
            int j = 0;
            while (k->names[j] && strcmp(text, k->names[j]) != 0)
                j++;
            if (!k->names[j]) {
                char list[160] = "";
                for (int q = 0; k->names[q]; q++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", q ? ", " : "",
                             k->names[q]);
                rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s is \"%s\", but ztrain computes only %s", r->where, k->key,
                             text, list);
                break;
            }
            *FIELD(cfg, k, int) = j;
            break;
        }
        case ZT__CFG_ONLY:
            rc = read_only(r, item, k, err);
            break;
        case ZT__CFG_IGNORE:
            zt_json_accept(r, k->key);
            break;
        case ZT__CFG_NUMBER:
            rc = zt_json_get_double(r, k->key, k->min, k->max, &d, err);
            break;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

int zt__cfg_finish(zt_json_reader *r, const cJSON *obj, const char *const *heads, zt_err *err)
{
    if (heads && !zt__host_architectures_ok(obj, heads)) {
        char list[200] = "";
        for (int i = 0; heads[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? (heads[i + 1] ? ", " : " or ") : "",
                     heads[i]);
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: architectures must list %s (ztrain trains that head; other heads have other weights)",
                       r->where, list);
    }
    for (const cJSON *item = obj->child; item; item = item->next)
        if (item->string && zt__host_hf_generic_key(item->string))
            zt_json_accept(r, item->string);
    return zt_json_reader_finish(r, err);
}

int zt__cfg_check(const zt__cfg_key *keys, int n, const void *cfg, const char *where, zt_err *err)
{
    for (int i = 0; i < n; i++) {
        const zt__cfg_key *k = &keys[i];
        if (k->flags & ZT__CFG_NO_CHECK)
            continue;
        if (k->type == ZT__CFG_INT) {
            const int v = *FIELD(cfg, k, const int);
            if (v < k->min || v > k->max)
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be from %.0f to %.0f, got %d", where, k->key, k->min,
                               k->max, v);
        } else if (k->type == ZT__CFG_FLOAT || k->type == ZT__CFG_DOUBLE) {
            const double v = k->type == ZT__CFG_FLOAT ? *FIELD(cfg, k, const float) : *FIELD(cfg, k, const double);
            const bool open = k->flags & ZT__CFG_OPEN;
            if (k->flags & ZT__CFG_ABOVE_MIN) {
                if (!(v > k->min && v <= k->max))
                    return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be above %g and at most %g, got %g", where,
                                   k->key, k->min, k->max, v);
            } else if (open ? !(v > k->min && v < k->max) : !(v >= k->min && v <= k->max)) {
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be %s %g %s %g%s, got %g", where, k->key,
                               open ? "between" : "from", k->min, open ? "and" : "to", k->max,
                               open ? " (exclusive)" : "", v);
            }
        } else if (k->type == ZT__CFG_NAME) {
            const int v = *FIELD(cfg, k, const int);
            int count = 0;
            while (k->names[count])
                count++;
            if (v < 0 || v >= count)
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: unknown %s %d", where, k->key, v);
        }
    }
    for (int i = 0; i < n; i++) {
        const zt__cfg_key *k = &keys[i];
        if (!k->divides)
            continue;
        const zt__cfg_key *w = NULL;
        for (int j = 0; j < n && !w; j++)
            w = strcmp(keys[j].key, k->divides) == 0 ? &keys[j] : NULL;
        ZT_ASSERT(w && w->type == ZT__CFG_INT && k->type == ZT__CFG_INT);
        const int d = *FIELD(cfg, k, const int), v = *FIELD(cfg, w, const int);
        if (d < 1 || v % d != 0)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "%s: %s %d is not divisible by %s %d (every head gets %s / %s channels: set %s to a "
                           "divisor of %s)", where, w->key, v, k->key, d, w->key, k->key, k->key, w->key);
    }
    return 0;
}

cJSON *zt__cfg_number(double v, bool py_float)
{
    cJSON *n = zt_json_exact_double(v);
    if (py_float && cJSON_IsRaw(n) && !strpbrk(n->valuestring, ".eEn")) {
        char buf[48];
        snprintf(buf, sizeof buf, "%s.0", n->valuestring);
        cJSON_Delete(n);
        n = cJSON_CreateRaw(buf);
        ZT_ASSERT(n);
    }
    return n;
}

void zt__cfg_add_token(cJSON *o, const char *key, int id)
{
    if (id < 0)
        cJSON_AddNullToObject(o, key);
    else
        cJSON_AddItemToObject(o, key, zt_json_exact_int(id));
}

void zt__cfg_write(const zt__cfg_key *keys, int n, const void *cfg, cJSON *o)
{
    for (int i = 0; i < n; i++) {
        const zt__cfg_key *k = &keys[i];
        const bool py = k->flags & ZT__CFG_PY_FLOAT;
        if (k->flags & ZT__CFG_NO_SAVE)
            continue;
        switch (k->type) {
        case ZT__CFG_INT:
            cJSON_AddNumberToObject(o, k->key, *FIELD(cfg, k, const int));
            break;
        case ZT__CFG_FLOAT:
            cJSON_AddItemToObject(o, k->key, zt__cfg_number(zt__host_short_decimal(*FIELD(cfg, k, const float)), py));
            break;
        case ZT__CFG_DOUBLE:
            cJSON_AddItemToObject(o, k->key, zt__cfg_number(*FIELD(cfg, k, const double), py));
            break;
        case ZT__CFG_BOOL:
            cJSON_AddBoolToObject(o, k->key, *FIELD(cfg, k, const bool));
            break;
        case ZT__CFG_TOKEN:
            zt__cfg_add_token(o, k->key, *FIELD(cfg, k, const int));
            break;
        case ZT__CFG_NAME:
            cJSON_AddStringToObject(o, k->key, k->names[*FIELD(cfg, k, const int)]);
            break;
        case ZT__CFG_ONLY:
        case ZT__CFG_IGNORE:
        case ZT__CFG_NUMBER:
            if (k->value) /* an IGNORE row without one is not written */
                cJSON_AddItemToObject(o, k->key, cJSON_CreateRaw(k->value));
            break;
        }
    }
}

static int by_key(const void *a, const void *b)
{
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

int zt__cfg_save(cJSON *o, const char *path, zt_err *err)
{
    /* sort the members by key (stable for equal keys, which a table never has) */
    const int n = cJSON_GetArraySize(o);
    cJSON **items = zt_xmalloc((size_t)(n ? n : 1) * sizeof *items);
    int i = 0;
    for (cJSON *it = o->child; it; it = it->next)
        items[i++] = it;
    qsort(items, (size_t)n, sizeof *items, by_key);
    for (i = 0; i < n; i++) {
        items[i]->prev = i ? items[i - 1] : items[n - 1];
        items[i]->next = i + 1 < n ? items[i + 1] : NULL;
    }
    o->child = n ? items[0] : NULL;
    free(items);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text)
        return zt_fail(err, ZT_ENOMEM, "%s: out of memory while formatting the model config", path);
    const zt_file_part parts[2] = {{text, strlen(text)}, {"\n", 1}};
    int rc = zt_write_file_atomic_parts(path, parts, 2, err);
    cJSON_free(text);
    return rc;
}

int zt__cfg_io_validate(const zt__cfg_io *io, const void *cfg, const char *where, zt_err *err)
{
    int rc = zt__cfg_check(io->keys, io->nkeys, cfg, where, err);
    return rc < 0 ? rc : io->validate(cfg, where, err);
}

int zt__cfg_io_read(const zt__cfg_io *io, void *cfg, const cJSON *obj, const char *where, zt_err *err)
{
    ZT_ASSERT(io->size <= ZT__CFG_MAX_BYTES);
    alignas(max_align_t) unsigned char c[ZT__CFG_MAX_BYTES];
    memcpy(c, cfg, io->size);
    zt_json_reader r;
    int rc, type;
    if ((rc = zt__cfg_begin(&r, obj, where, io->model_types, &type, err)) < 0 ||
        (rc = zt__cfg_read(&r, obj, io->keys, io->nkeys, c, err)) < 0 ||
        (io->read_extra && (rc = io->read_extra(&r, obj, c, err)) < 0) ||
        (rc = zt__cfg_finish(&r, obj, io->heads, err)) < 0 || (rc = zt__cfg_io_validate(io, c, where, err)) < 0)
        return rc;
    memcpy(cfg, c, io->size);
    return 0;
}

int zt__cfg_io_save(const zt__cfg_io *io, const void *cfg, const char *path, zt_err *err)
{
    int rc = zt__cfg_io_validate(io, cfg, path, err);
    if (rc < 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    zt__cfg_write(io->keys, io->nkeys, cfg, o);
    if (io->write_extra)
        io->write_extra(cfg, o);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "architectures"),
                         cJSON_CreateString(io->head ? io->head(cfg) : io->heads[0]));
    cJSON_AddStringToObject(o, "model_type", io->model_type ? io->model_type(cfg) : io->model_types[0]);
    return zt__cfg_save(o, path, err);
}

int zt__cfg_load(void *cfg, const char *path, int (*from_json)(void *, const cJSON *, const char *, zt_err *),
                 zt_err *err)
{
    cJSON *obj = NULL;
    int rc = zt_json_load_object(path, &obj, err);
    if (rc < 0)
        return rc;
    rc = from_json(cfg, obj, path, err);
    cJSON_Delete(obj);
    return rc;
}

int zt__cfg_read_token_list(zt_json_reader *r, const cJSON *obj, const char *key, int *ids, int max, int *n,
                            zt_err *err)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item)
        return 0;
    zt_json_accept(r, key);
    int k = 0;
    const cJSON *one = cJSON_IsArray(item) ? item->child : cJSON_IsNull(item) ? NULL : item;
    for (; one; one = cJSON_IsArray(item) ? one->next : NULL) {
        const double v = cJSON_IsNumber(one) ? one->valuedouble : -1.0;
        if (v < 0 || v > INT32_MAX || v != floor(v))
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be a token id (a whole number from 0), a list of "
                           "them or null", r->where, key);
        if (k == max)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s lists more than %d ids", r->where, key, max);
        ids[k++] = (int)v;
    }
    *n = k;
    return 0;
}

void zt__cfg_write_token_list(cJSON *o, const char *key, const int *ids, int n)
{
    if (n == 1) {
        cJSON_AddItemToObject(o, key, zt_json_exact_int(ids[0]));
        return;
    }
    cJSON *list = n == 0 ? cJSON_CreateNull() : cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(list, zt_json_exact_int(ids[i]));
    cJSON_AddItemToObject(o, key, list);
}

/* A rope_scaling (transformers 4.x) or rope_parameters (5.x) object into rope: a rope_type (or its older
 * name "type") of "default", "linear" (factor) or "llama3" (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings); rope_parameters also holds rope_theta, stored in *theta when present
 * (else left alone). */
static int read_rope_object(const cJSON *d, const char *name, const char *where, int max_positions, double *theta,
                            zt_rope_config *rope, zt_err *err)
{
    char w[320];
    snprintf(w, sizeof w, "%s, %s", where, name);
    if (!cJSON_IsObject(d))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s must be an object or null", w);
    zt_json_reader r;
    zt_json_reader_init(&r, d, w);
    char type[32] = "", alias[32] = "";
    int rc;
    if ((rc = zt_json_get_string(&r, "rope_type", type, sizeof type, err)) < 0 ||
        (rc = zt_json_get_string(&r, "type", alias, sizeof alias, err)) < 0)
        return rc;
    if (type[0] && alias[0] && strcmp(type, alias) != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_type \"%s\" and its older name type \"%s\" disagree", w, type,
                       alias);
    if (!type[0])
        snprintf(type, sizeof type, "%s", alias[0] ? alias : "default");
    static const char *const types[] = {"default", "linear", "llama3"};
    static const enum zt_rope_scaling scalings[] = {ZT_ROPE_SCALING_NONE, ZT_ROPE_SCALING_LINEAR,
                                                    ZT_ROPE_SCALING_LLAMA3};
    zt_rope_config out = {.theta = rope->theta};
    int t = 0;
    while (t < 3 && strcmp(type, types[t]) != 0)
        t++;
    if (t == 3)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_type \"%s\" is not one ztrain computes (it computes "
                       "\"default\", \"linear\" and \"llama3\")", w, type);
    out.scaling = scalings[t];
    if (theta && (rc = zt_json_get_double(&r, "rope_theta", 0.0, 1e300, theta, err)) < 0)
        return rc;
    if (out.scaling != ZT_ROPE_SCALING_NONE) {
        const bool llama3 = out.scaling == ZT_ROPE_SCALING_LLAMA3;
        static const char *const needed[] = {"factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings"};
        for (int i = 0; i < (llama3 ? 4 : 1); i++)
            if (!cJSON_GetObjectItemCaseSensitive(d, needed[i]))
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_type \"%s\" needs %s", w, type, needed[i]);
        if ((rc = zt_json_get_double(&r, "factor", 0.0, 1e300, &out.factor, err)) < 0)
            return rc;
        if (llama3 && ((rc = zt_json_get_double(&r, "low_freq_factor", 0.0, 1e300, &out.low_freq_factor, err)) < 0 ||
                       (rc = zt_json_get_double(&r, "high_freq_factor", 0.0, 1e300, &out.high_freq_factor, err)) < 0))
            return rc;
        /* linear scaling has no use for the original length, but transformers writes it in some configs */
        if ((rc = zt__host_json_int(&r, "original_max_position_embeddings", 1, max_positions,
                                    &out.original_max_position_embeddings, NULL, err)) < 0)
            return rc;
        if (!llama3)
            out.original_max_position_embeddings = 0;
    }
    if ((rc = zt_json_reader_finish(&r, err)) < 0)
        return rc;
    *rope = out;
    return 0;
}

int zt__cfg_read_rope(zt_json_reader *r, const cJSON *obj, zt_rope_config *rope, int max_positions, zt_err *err)
{
    double theta = rope->theta;
    int rc = zt_json_get_double(r, "rope_theta", 0.0, 1e300, &theta, err);
    if (rc < 0)
        return rc;
    const bool have_theta = cJSON_GetObjectItemCaseSensitive(obj, "rope_theta") != NULL;
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(obj, "rope_scaling");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(obj, "rope_parameters");
    if (scaling)
        zt_json_accept(r, "rope_scaling");
    if (params)
        zt_json_accept(r, "rope_parameters");
    if (scaling && !cJSON_IsNull(scaling) && params && !cJSON_IsNull(params))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: both rope_scaling and rope_parameters are given (keep rope_parameters, transformers 5's "
                       "form, or rope_scaling with rope_theta, the older one)",
                       r->where);
    zt_rope_config out = *rope;
    out.theta = theta;
    if (scaling && cJSON_IsNull(scaling))
        out = (zt_rope_config){.theta = theta, .scaling = ZT_ROPE_SCALING_NONE};
    else if (scaling && (rc = read_rope_object(scaling, "rope_scaling", r->where, max_positions, NULL, &out, err)) < 0)
        return rc;
    if (params && !cJSON_IsNull(params)) {
        double ptheta = NAN;
        if ((rc = read_rope_object(params, "rope_parameters", r->where, max_positions, &ptheta, &out, err)) < 0)
            return rc;
        if (!isnan(ptheta) && have_theta && ptheta != theta)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "%s: rope_theta (%g) and rope_parameters.rope_theta (%g) disagree (keep one)", r->where,
                           theta, ptheta);
        if (!isnan(ptheta))
            out.theta = ptheta;
    }
    *rope = out;
    return 0;
}

void zt__cfg_write_rope(cJSON *o, const zt_rope_config *rope, bool null_scaling)
{
    cJSON_AddItemToObject(o, "rope_theta", zt__cfg_number(rope->theta, true));
    if (rope->scaling == ZT_ROPE_SCALING_NONE) {
        if (null_scaling)
            cJSON_AddNullToObject(o, "rope_scaling");
        return;
    }
    const bool llama3 = rope->scaling == ZT_ROPE_SCALING_LLAMA3;
    cJSON *s = cJSON_AddObjectToObject(o, "rope_scaling");
    cJSON_AddItemToObject(s, "factor", zt__cfg_number(rope->factor, true));
    if (llama3) {
        cJSON_AddItemToObject(s, "high_freq_factor", zt__cfg_number(rope->high_freq_factor, true));
        cJSON_AddItemToObject(s, "low_freq_factor", zt__cfg_number(rope->low_freq_factor, true));
        cJSON_AddNumberToObject(s, "original_max_position_embeddings", rope->original_max_position_embeddings);
    }
    cJSON_AddStringToObject(s, "rope_type", llama3 ? "llama3" : "linear");
}

int zt__cfg_read_partial_rope(zt_json_reader *r, const cJSON *obj, const char *base_key, double *base,
                              const char *pct_key, double *pct, const char *model, zt_err *err)
{
    const bool have_pct = cJSON_GetObjectItemCaseSensitive(obj, pct_key) != NULL;
    const bool have_base = cJSON_GetObjectItemCaseSensitive(obj, base_key) != NULL;
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(obj, "rope_scaling");
    if (scaling && !cJSON_IsNull(scaling))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_scaling is set, but %s computes unscaled rotary embeddings "
                       "(set it to null)", r->where, model);
    if (scaling)
        zt_json_accept(r, "rope_scaling");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "rope_parameters");
    if (p)
        zt_json_accept(r, "rope_parameters");
    if (!p || cJSON_IsNull(p))
        return 0;
    char w[320];
    snprintf(w, sizeof w, "%s, rope_parameters", r->where);
    if (!cJSON_IsObject(p))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s must be an object or null", w);
    zt_json_reader pr;
    zt_json_reader_init(&pr, p, w);
    char type[32] = "default";
    double theta = NAN, factor = NAN;
    int rc;
    if ((rc = zt_json_get_string(&pr, "rope_type", type, sizeof type, err)) < 0 ||
        (rc = zt_json_get_double(&pr, "rope_theta", 0.0, 1e300, &theta, err)) < 0 ||
        (rc = zt_json_get_double(&pr, "partial_rotary_factor", 0.0, 1.0, &factor, err)) < 0 ||
        (rc = zt_json_reader_finish(&pr, err)) < 0)
        return rc;
    if (strcmp(type, "default") != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_type \"%s\" is not one %s computes (it computes "
                       "\"default\")", w, type, model);
    if (!isnan(theta) && have_base && theta != *base)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_theta (%g) and %s (%g) disagree (keep one)", w, theta,
                       base_key, *base);
    if (!isnan(factor) && have_pct && factor != *pct)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: partial_rotary_factor (%g) and %s (%g) disagree (keep one)", w,
                       factor, pct_key, *pct);
    if (!isnan(theta))
        *base = theta;
    if (!isnan(factor))
        *pct = factor;
    return 0;
}

/* ---- classification labels ---- */

int zt__cfg_read_labels(zt_json_reader *r, const cJSON *obj, int max, int *labels, char *names, size_t cap,
                        zt_err *err)
{
    int num_labels = 0;
    int rc = zt__host_json_int(r, "num_labels", 1, max, &num_labels, NULL, err);
    if (rc < 0)
        return rc;
    const cJSON *id2label = cJSON_GetObjectItemCaseSensitive(obj, "id2label");
    const cJSON *label2id = cJSON_GetObjectItemCaseSensitive(obj, "label2id");
    if (id2label)
        zt_json_accept(r, "id2label");
    if (label2id)
        zt_json_accept(r, "label2id");
    if (!id2label) {
        if (label2id && !cJSON_IsNull(label2id))
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: label2id without id2label (give both, or neither)", r->where);
        if (num_labels > 0 && num_labels != *labels) {
            *labels = num_labels;
            names[0] = '\0';
        }
        return 0;
    }
    if (!cJSON_IsObject(id2label) || !id2label->child)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: id2label must be an object of label ids to names, such as "
                       "{\"0\": \"negative\", \"1\": \"positive\"}", r->where);
    const int n = cJSON_GetArraySize(id2label);
    if (n > max)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: id2label has %d labels, more than ztrain's %d", r->where, n,
                       max);
    if (num_labels > 0 && num_labels != n)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: num_labels is %d but id2label has %d labels (make them agree)",
                       r->where, num_labels, n);
    size_t at = 0;
    bool all_default = true;
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(id2label, key);
        if (!v)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "%s: id2label has %d labels but no label \"%s\" (ids run from 0 to %d)", r->where, n, key,
                           n - 1);
        if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: id2label[\"%s\"] must be a non-empty string", r->where, key);
        const size_t len = strlen(v->valuestring);
        if (at + len + 1 > cap)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the names in id2label take more than ztrain's %d bytes "
                           "(shorten them)", r->where, (int)cap);
        memcpy(names + at, v->valuestring, len + 1);
        at += len + 1;
        char def[32];
        snprintf(def, sizeof def, "LABEL_%d", i);
        all_default = all_default && strcmp(v->valuestring, def) == 0;
        if (label2id && !cJSON_IsNull(label2id)) {
            const cJSON *id = cJSON_IsObject(label2id) ? cJSON_GetObjectItemCaseSensitive(label2id, v->valuestring)
                                                        : NULL;
            if (!cJSON_IsNumber(id) || id->valuedouble != (double)i)
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: label2id[\"%s\"] must be %d, the inverse of id2label",
                               r->where, v->valuestring, i);
        }
    }
    if (label2id && !cJSON_IsNull(label2id) && cJSON_GetArraySize(label2id) != n)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: label2id has %d entries but id2label %d (label2id must be the "
                       "inverse of id2label)", r->where, cJSON_GetArraySize(label2id), n);
    *labels = n;
    if (all_default)
        memset(names, 0, at);
    return 0;
}

bool zt__cfg_labels_ok(const char *names, size_t cap, int n)
{
    if (!names[0])
        return true;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const char *nul = at < cap ? memchr(names + at, '\0', cap - at) : NULL;
        if (!nul || names[at] == '\0')
            return false;
        at = (size_t)(nul - names) + 1;
    }
    return true;
}

const char *zt__cfg_label(const char *names, int i, char *buf, size_t cap)
{
    if (names[0]) {
        const char *s = names;
        for (int k = 0; k < i; k++)
            s += strlen(s) + 1;
        return s;
    }
    snprintf(buf, cap, "LABEL_%d", i);
    return buf;
}

void zt__cfg_write_labels(cJSON *o, const char *names, int n)
{
    cJSON *id2label = cJSON_AddObjectToObject(o, "id2label"), *label2id = cJSON_AddObjectToObject(o, "label2id");
    for (int i = 0; i < n; i++) {
        char key[16], buf[32];
        snprintf(key, sizeof key, "%d", i);
        const char *name = zt__cfg_label(names, i, buf, sizeof buf);
        cJSON_AddStringToObject(id2label, key, name);
        cJSON_AddNumberToObject(label2id, name, i);
    }
}
