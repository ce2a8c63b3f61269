/* A family's config.json mapping as data. Each key of a Hugging Face config that a family reads is one row
 * of a table: its type, the field of the family's config struct it fills, the range ztrain accepts, the one
 * value ztrain supports where it supports only one (and why), and what a config that ztrain writes holds.
 * Reading (strict: unknown keys refused by name), checking a config's ranges and writing a config.json
 * (keys sorted, as transformers writes them) are then written once here, and a family's file lists its keys
 * plus the few rules that tie keys together (head counts that divide the width, aliases that must agree).
 * Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_HOST_CONFIG_H
#define ZT_WORKER_MODELS_HOST_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/status.h"

enum zt__cfg_type {
    ZT__CFG_INT,    /* an int field in [min, max] */
    ZT__CFG_FLOAT,  /* a float field in [min, max]; written in its shortest decimal */
    ZT__CFG_DOUBLE, /* a double field in [min, max] */
    ZT__CFG_BOOL,   /* a bool field */
    ZT__CFG_TOKEN,  /* an int token id field: a whole number from 0, or null (stored as -1) */
    ZT__CFG_NAME,   /* an int (enum) field read from one of the strings names[] (its index) */
    ZT__CFG_ONLY,   /* no field: present, the key must hold `value` (JSON text), the one ztrain computes;
                       a config that ztrain writes holds it (unless ZT__CFG_NO_SAVE) */
    ZT__CFG_IGNORE, /* no field: any value is accepted, as it changes nothing ztrain computes */
    ZT__CFG_NUMBER, /* no field: a number in [min, max] is accepted, as it changes nothing (dropout rates) */
};

/* Flags of a key. */
#define ZT__CFG_NULL_OK 1u   /* null is accepted and leaves the field (ONLY: accepted as well) */
#define ZT__CFG_NO_SAVE 2u   /* a key not written by zt__cfg_write (the family writes it, or never) */
#define ZT__CFG_OPEN 4u      /* FLOAT, DOUBLE: min and max themselves are out of range */
#define ZT__CFG_PY_FLOAT 8u  /* DOUBLE, FLOAT: written with a decimal point (10000.0) so Python reads a float */
#define ZT__CFG_NO_CHECK 16u /* a field's range is read but not checked by zt__cfg_check (the family does) */
#define ZT__CFG_ABOVE_MIN 32u /* FLOAT, DOUBLE: min itself is out of range, max in it */
#define ZT__CFG_HASH_ONLY 64u /* a field in the config's fingerprint but not in its diff (family.h): a value a
                                 resumed run may change */

/* The most keys a table holds (diffs and fingerprints list its fields on the stack). */
#define ZT__CFG_MAX_KEYS 128

typedef struct zt__cfg_key {
    const char *key;
    enum zt__cfg_type type;
    size_t offset;            /* of the field in the family's config struct (INT .. NAME) */
    double min, max;          /* INT, FLOAT, DOUBLE: the range read and checked */
    unsigned flags;
    const char *value;        /* ONLY: the value supported, as JSON text; IGNORE, NUMBER: what a config that
                                 ztrain writes holds (NULL: the key is not written) */
    const char *why;          /* ONLY: what ztrain computes instead, for the message */
    const char *const *names; /* NAME: the strings, NULL-terminated, indexed by the field's value */
    const char *alias;        /* INT: another name transformers maps onto the key (both given must agree) */
    const char *divides;      /* INT: a key of the same table whose value this one must divide (the heads of a
                                 width), checked by zt__cfg_check */
} zt__cfg_key;

/* Rows of a table, for a config struct type S (macros, so that a table reads as one line a key). */
#define ZT__CFG_I(S, f, lo, hi) {.key = #f, .type = ZT__CFG_INT, .offset = offsetof(S, f), .min = (lo), .max = (hi)}
/* A head count from 1 that must divide the width key w. */
#define ZT__CFG_HEADS(S, f, hi, w)                                                                              \
    {.key = #f, .type = ZT__CFG_INT, .offset = offsetof(S, f), .min = 1, .max = (hi), .divides = (w)}
#define ZT__CFG_R(S, t, f, lo, hi, fl)                                                                       \
    {.key = #f, .type = ZT__CFG_##t, .offset = offsetof(S, f), .min = (lo), .max = (hi), .flags = (fl)}
#define ZT__CFG_B(S, f) {.key = #f, .type = ZT__CFG_BOOL, .offset = offsetof(S, f)}
#define ZT__CFG_T(S, f) {.key = #f, .type = ZT__CFG_TOKEN, .offset = offsetof(S, f)}
#define ZT__CFG_ONLY_(k, v, fl, w) {.key = (k), .type = ZT__CFG_ONLY, .flags = (fl), .value = (v), .why = (w)}
#define ZT__CFG_IGNORE_(k, v) {.key = (k), .type = ZT__CFG_IGNORE, .value = (v)}
#define ZT__CFG_NUMBER_(k, lo, hi, fl, v) {.key = (k), .type = ZT__CFG_NUMBER, .min = (lo), .max = (hi), .flags = (fl), .value = (v)}

/* Starts reading obj, a family's config.json object named where in messages: checks that it is an object
 * of a sensible size and that its "model_type", when given, is one of model_types (NULL-terminated); the
 * index of the one given, or -1 when absent, goes to *type. Returns 0 or ZT_EINVAL_CONFIG with a message. */
int zt__cfg_begin(zt_json_reader *r, const cJSON *obj, const char *where, const char *const *model_types, int *type,
                  zt_err *err);
/* Reads every key of the table that obj holds into cfg, in table order. Returns 0 or ZT_EINVAL_CONFIG. */
int zt__cfg_read(zt_json_reader *r, const cJSON *obj, const zt__cfg_key *keys, int n, void *cfg, zt_err *err);
/* Ends reading: "architectures" (absent, null, or a list of heads, NULL-terminated, the family trains; heads
 * NULL: any), the
 * keys every Hugging Face config carries (host_shared.h) accepted, then any other key refused by name.
 * Returns 0 or ZT_EINVAL_CONFIG. */
int zt__cfg_finish(zt_json_reader *r, const cJSON *obj, const char *const *heads, zt_err *err);
/* Checks the ranges of the table's fields in cfg ("<where>: <key> must be from <min> to <max>, got <v>"), then
 * the keys that must divide another ("<where>: hidden_size 36 is not divisible by num_attention_heads 5 ...").
 * Returns 0 or ZT_EINVAL_CONFIG. */
int zt__cfg_check(const zt__cfg_key *keys, int n, const void *cfg, const char *where, zt_err *err);
/* Adds the table's keys as a config that ztrain writes holds them to o. */
void zt__cfg_write(const zt__cfg_key *keys, int n, const void *cfg, cJSON *o);
/* Writes o to path as config.json (keys sorted, as transformers writes them, a newline at the end),
 * atomically, and deletes o. Returns 0 or a negative code with a message naming path. */
int zt__cfg_save(cJSON *o, const char *path, zt_err *err);
/* A JSON number for a real that reads back as exactly v, with a decimal point when py_float. */
cJSON *zt__cfg_number(double v, bool py_float);
/* zt__cfg_number(v), or null when v is negative (an absent token id). */
void zt__cfg_add_token(cJSON *o, const char *key, int id);
/* A token id field that may be one id, a list of up to max ids, or null (none): into ids[0 .. *n). Absent
 * leaves both. Returns 0 or ZT_EINVAL_CONFIG. The writer gives one id as a number, none as null. */
int zt__cfg_read_token_list(zt_json_reader *r, const cJSON *obj, const char *key, int *ids, int max, int *n,
                            zt_err *err);
void zt__cfg_write_token_list(cJSON *o, const char *key, const int *ids, int n);

/* Rotary embeddings as the LLaMA-like configs give them: rope_theta with rope_scaling (transformers 4.x) or
 * rope_parameters (5.x), a rope_type of "default", "linear" or "llama3" (its older name "type" too), into
 * *rope (its theta the default); both forms given, or disagreeing thetas, are refused. The writer gives
 * rope_theta and, with scaling, rope_scaling (null without, when null_scaling). */
struct zt_rope_config;
int zt__cfg_read_rope(zt_json_reader *r, const cJSON *obj, struct zt_rope_config *rope, int max_positions,
                      zt_err *err);
void zt__cfg_write_rope(cJSON *o, const struct zt_rope_config *rope, bool null_scaling);

/* Rotary embeddings of partly rotated heads as such configs give them: the older keys (base_key, pct_key: the
 * base and the fraction of a head rotated, read by the key table into *base and *pct) and transformers 5's
 * rope_parameters {rope_type "default", rope_theta, partial_rotary_factor}, which must agree with them where
 * both are given; rope_scaling only null (the embeddings are unscaled). model names what computes them in
 * messages ("ztrain's GPT-NeoX"). Returns 0 or ZT_EINVAL_CONFIG. */
int zt__cfg_read_partial_rope(zt_json_reader *r, const cJSON *obj, const char *base_key, double *base,
                              const char *pct_key, double *pct, const char *model, zt_err *err);

/* Classification labels as every transformers config gives them: num_labels, id2label ("0".."n-1" to names)
 * and label2id (its inverse). The names are kept NUL-separated in label order in names [cap], or "" when they
 * are transformers' defaults LABEL_0, LABEL_1, ... The reader fills *labels (1 .. max) and names from what
 * the config gives (neither changes when it gives neither; names may be written in part on an error) and
 * returns 0 or ZT_EINVAL_CONFIG; the check tells whether names holds n non-empty names; the name of label i
 * is its name in names or "LABEL_<i>" written into buf; the writer adds id2label and label2id. */
int zt__cfg_read_labels(zt_json_reader *r, const cJSON *obj, int max, int *labels, char *names, size_t cap,
                        zt_err *err);
bool zt__cfg_labels_ok(const char *names, size_t cap, int n);
const char *zt__cfg_label(const char *names, int i, char *buf, size_t cap);
void zt__cfg_write_labels(cJSON *o, const char *names, int n);

/* A family's config.json as a whole: its model types and heads (the first of each is what a written config
 * names, unless model_type and head say which for a config), its key table, the rules that tie keys together
 * (validate, with the source for messages), and optionally what it reads and writes beyond the table (after
 * the table's keys; NULL: nothing). heads NULL: "architectures" is read_extra's to read. */
typedef struct zt__cfg_io {
    const char *const *model_types, *const *heads; /* NULL-terminated */
    const zt__cfg_key *keys;
    int nkeys;
    size_t size; /* of the config struct (at most ZT__CFG_MAX_BYTES) */
    int (*validate)(const void *cfg, const char *where, zt_err *err); /* after the table's checks */
    int (*read_extra)(zt_json_reader *r, const cJSON *obj, void *cfg, zt_err *err);
    void (*write_extra)(const void *cfg, cJSON *o);
    const char *(*model_type)(const void *cfg), *(*head)(const void *cfg);
} zt__cfg_io;
#define ZT__CFG_MAX_BYTES 8192
/* Checks cfg: the key table's ranges and head counts (zt__cfg_check), then io's validate, the rules that tie keys
 * together. Returns 0 or ZT_EINVAL_CONFIG. */
int zt__cfg_io_validate(const zt__cfg_io *io, const void *cfg, const char *where, zt_err *err);
/* Fills cfg (a config struct of io's family) from obj: begin, the table's keys, read_extra, finish (any
 * other key refused by name), validate; cfg is unchanged on an error. Returns 0 or ZT_EINVAL_CONFIG. */
int zt__cfg_io_read(const zt__cfg_io *io, void *cfg, const cJSON *obj, const char *where, zt_err *err);
/* Validates cfg and writes it to path as transformers writes it: the table's keys, write_extra's,
 * "architectures" [head] and "model_type". Returns 0 or a negative code with a message. */
int zt__cfg_io_save(const zt__cfg_io *io, const void *cfg, const char *path, zt_err *err);

/* Reads a whole config.json file and hands its object to from_json (cfg, obj, path, err). */
int zt__cfg_load(void *cfg, const char *path, int (*from_json)(void *, const cJSON *, const char *, zt_err *),
                 zt_err *err);

#endif
