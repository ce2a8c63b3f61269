/* Strict, typed reading of JSON objects on top of cJSON: syntax errors with line and column, getters
 * that reject wrong types and out-of-range values, and a final check that names unknown keys. */
#include "common/json.h"

#include "common/fileio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *where_of(const zt_json_reader *r)
{
    return r->where != NULL ? r->where : "JSON";
}

/* "a string", "a number", ... for messages about a value of the wrong type. */
static const char *type_phrase(const cJSON *item)
{
    if (cJSON_IsString(item))
        return "a string";
    if (cJSON_IsNumber(item))
        return "a number";
    if (cJSON_IsBool(item))
        return "a boolean";
    if (cJSON_IsNull(item))
        return "null";
    if (cJSON_IsArray(item))
        return "an array";
    if (cJSON_IsObject(item))
        return "an object";
    return "an invalid value";
}

/* Parses text into an object; see json.h. */
int zt_json_parse_object(const char *text, const char *where, cJSON **out, zt_err *err)
{
    if (where == NULL)
        where = "JSON";
    if (text == NULL)
        text = "";
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (root == NULL) {
        if (end == NULL)
            end = text;
        int line = 1, col = 1;
        for (const char *p = text; p < end && *p != '\0'; p++) {
            if (*p == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        if (*end == '\0')
            return zt_fail(err, ZT_EFORMAT, "%s: JSON syntax error at line %d, column %d: unexpected end of input",
                           where, line, col);
        /* Quote a little of the text at the error, on one line. */
        char near[24];
        size_t k = 0;
        for (const char *p = end; *p != '\0' && *p != '\n' && k < sizeof(near) - 1; p++)
            near[k++] = *p;
        near[k] = '\0';
        return zt_fail(err, ZT_EFORMAT, "%s: JSON syntax error at line %d, column %d, near '%s'", where, line, col,
                       near);
    }
    if (!cJSON_IsObject(root)) {
        const char *got = type_phrase(root);
        cJSON_Delete(root);
        return zt_fail(err, ZT_EFORMAT, "%s: expected a JSON object ({...}) at the top level, got %s", where, got);
    }
    *out = root;
    return 0;
}

/* Starts reading obj; where names it in messages (a file name, say). */
void zt_json_reader_init(zt_json_reader *r, const cJSON *obj, const char *where)
{
    memset(r, 0, sizeof(*r));
    r->obj = obj;
    r->where = where;
}

/* Records key as asked for, so that zt_json_reader_finish does not report it. */
static void mark_seen(zt_json_reader *r, const char *key)
{
    for (int i = 0; i < r->nseen; i++)
        if (strcmp(r->seen[i], key) == 0)
            return;
    ZT_ASSERT(r->nseen < ZT_JSON_MAX_KEYS);
    r->seen[r->nseen++] = key;
}

static const cJSON *lookup(zt_json_reader *r, const char *key)
{
    mark_seen(r, key);
    if (r->obj == NULL)
        return NULL;
    return cJSON_GetObjectItemCaseSensitive(r->obj, key);
}

/* Reads a whole number in [min, max]; see json.h. */
int zt_json_get_int(zt_json_reader *r, const char *key, int64_t min, int64_t max, int64_t *out, zt_err *err)
{
    const cJSON *item = lookup(r, key);
    if (item == NULL)
        return 0;
    if (!cJSON_IsNumber(item))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be a whole number, got %s", where_of(r), key,
                       type_phrase(item));
    double v = item->valuedouble;
    if (v != floor(v))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be a whole number, got %.17g", where_of(r), key, v);
    /* 2^63 bounds the conversion below; (double)INT64_MAX rounds up to exactly that. */
    if (v < -9223372036854775808.0 || v >= 9223372036854775808.0 || (int64_t)v < min || (int64_t)v > max)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be from %lld to %lld, got %.17g", where_of(r), key,
                       (long long)min, (long long)max, v);
    *out = (int64_t)v;
    return 0;
}

/* Reads a number in [min, max]; see json.h. */
int zt_json_get_double(zt_json_reader *r, const char *key, double min, double max, double *out, zt_err *err)
{
    const cJSON *item = lookup(r, key);
    if (item == NULL)
        return 0;
    if (!cJSON_IsNumber(item))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be a number, got %s", where_of(r), key, type_phrase(item));
    double v = item->valuedouble;
    if (!isfinite(v) || v < min || v > max)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be from %g to %g, got %g", where_of(r), key, min, max, v);
    *out = v;
    return 0;
}

/* Reads true or false; see json.h. */
int zt_json_get_bool(zt_json_reader *r, const char *key, bool *out, zt_err *err)
{
    const cJSON *item = lookup(r, key);
    if (item == NULL)
        return 0;
    if (!cJSON_IsBool(item))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be true or false, got %s", where_of(r), key,
                       type_phrase(item));
    *out = cJSON_IsTrue(item);
    return 0;
}

/* Copies a string value into out (cap bytes including the NUL); see json.h. */
int zt_json_get_string(zt_json_reader *r, const char *key, char *out, size_t cap, zt_err *err)
{
    const cJSON *item = lookup(r, key);
    if (item == NULL)
        return 0;
    if (!cJSON_IsString(item) || item->valuestring == NULL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s must be a string, got %s", where_of(r), key, type_phrase(item));
    size_t n = strlen(item->valuestring);
    if (cap == 0 || n >= cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s is too long (%zu characters, at most %zu)", where_of(r), key, n,
                       cap > 0 ? cap - 1 : 0);
    memcpy(out, item->valuestring, n + 1);
    return 0;
}

/* Marks key as known without reading it. */
void zt_json_accept(zt_json_reader *r, const char *key)
{
    mark_seen(r, key);
}

/* Levenshtein distance, or a large value for keys too long to bother with. */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 64 };
    size_t na = strlen(a), nb = strlen(b);
    if (na > MAXLEN || nb > MAXLEN)
        return 1000;
    int prev[MAXLEN + 1], cur[MAXLEN + 1];
    for (size_t j = 0; j <= nb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = prev[j - 1] + cost;
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, (nb + 1) * sizeof(int));
    }
    return prev[nb];
}

/* Reports the first key of the object that was never asked for (or a key given twice); see json.h. */
int zt_json_reader_finish(zt_json_reader *r, zt_err *err)
{
    if (r->obj == NULL)
        return 0;
    for (const cJSON *c = r->obj->child; c != NULL; c = c->next) {
        const char *key = c->string != NULL ? c->string : "";
        for (const cJSON *d = r->obj->child; d != c; d = d->next)
            if (d->string != NULL && strcmp(d->string, key) == 0)
                return zt_fail(err, ZT_EINVAL_CONFIG, "field '%s' appears twice in %s (keep one)", key, where_of(r));
        if (r->ignore_prefix != NULL && strncmp(key, r->ignore_prefix, strlen(r->ignore_prefix)) == 0)
            continue;
        int known = 0;
        for (int i = 0; i < r->nseen && !known; i++)
            known = strcmp(r->seen[i], key) == 0;
        if (known)
            continue;
        const char *best = NULL;
        int best_d = 3;
        for (int i = 0; i < r->nseen; i++) {
            int d = edit_distance(key, r->seen[i]);
            if (d < best_d) {
                best_d = d;
                best = r->seen[i];
            }
        }
        if (best != NULL)
            return zt_fail(err, ZT_EINVAL_CONFIG, "unknown field '%s' in %s (did you mean '%s'?)", key, where_of(r),
                           best);
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown field '%s' in %s (remove it or check its spelling)", key,
                       where_of(r));
    }
    return 0;
}

/* A raw JSON number that reads back as exactly v; see json.h. */
cJSON *zt_json_exact_double(double v)
{
    char buf[40];
    if (!isfinite(v))
        return cJSON_CreateNull();
    /* The shortest of 15, 16 or 17 significant digits that gives v back. */
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof(buf), "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    cJSON *n = cJSON_CreateRaw(buf);
    ZT_ASSERT(n);
    return n;
}

/* A raw JSON number for a whole number; see json.h. */
cJSON *zt_json_exact_int(int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    cJSON *n = cJSON_CreateRaw(buf);
    ZT_ASSERT(n);
    return n;
}

/* Reads and parses a JSON object file; see json.h. */
int zt_json_load_object(const char *path, cJSON **out, zt_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc < 0)
        return rc;
    rc = zt_json_parse_object(text, path, out, err);
    free(text);
    return rc;
}
