/* Typed, strict reading of JSON objects (configs, manifests) on top of cJSON.
 *
 * A zt_json_reader walks one object: each get_* call names a key it understands; at the end
 * zt_json_reader_finish() reports any key that nobody asked for, so misspelt config fields are errors,
 * not silently ignored. Every message names the file, the key and the expected form. */
#ifndef ZT_COMMON_JSON_H
#define ZT_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"

#define ZT_JSON_MAX_KEYS 128

typedef struct zt_json_reader {
    const cJSON *obj;                 /* borrowed */
    const char *where;                /* e.g. the file name, used in messages; borrowed */
    const char *seen[ZT_JSON_MAX_KEYS]; /* keys asked for so far */
    int nseen;
    const char *ignore_prefix;        /* keys starting with this are allowed unasked; may be NULL */
} zt_json_reader;

/* Parses text; on a syntax error returns ZT_EFORMAT with the line and column in err. *out is freed
 * with cJSON_Delete. A root that is not an object is an error too. */
int zt_json_parse_object(const char *text, const char *where, cJSON **out, zt_err *err);
/* Reads the file at path and parses it as zt_json_parse_object does (path names it in messages). */
int zt_json_load_object(const char *path, cJSON **out, zt_err *err);

void zt_json_reader_init(zt_json_reader *r, const cJSON *obj, const char *where);

/* Each getter: if key is absent, leaves *out unchanged and returns 0 (so defaults are set before the
 * call); if present with the wrong type or out of range, returns ZT_EINVAL_CONFIG with a message. */
int zt_json_get_int(zt_json_reader *r, const char *key, int64_t min, int64_t max, int64_t *out, zt_err *err);
int zt_json_get_double(zt_json_reader *r, const char *key, double min, double max, double *out, zt_err *err);
int zt_json_get_bool(zt_json_reader *r, const char *key, bool *out, zt_err *err);
/* Copies a string into out (cap bytes with the NUL); too long is an error. */
int zt_json_get_string(zt_json_reader *r, const char *key, char *out, size_t cap, zt_err *err);
/* Marks key as known without reading it (fields accepted for compatibility but unused). */
void zt_json_accept(zt_json_reader *r, const char *key);
/* Returns ZT_EINVAL_CONFIG naming the first key that was never asked for, or 0. */
int zt_json_reader_finish(zt_json_reader *r, zt_err *err);

/* A raw JSON number node whose text reads back as exactly v (cJSON's own printing may drop the last bit of
 * a double; a non-finite v becomes null), and one for a whole number. Never NULL. */
cJSON *zt_json_exact_double(double v);
cJSON *zt_json_exact_int(int64_t v);

#endif
