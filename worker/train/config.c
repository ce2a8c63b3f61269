/* The training configuration: defaults, JSON file, flags, validation, logging and saving (see config.h).
 *
 * Every setting is described once in the `keys` table below (JSON key, flag, type, field), which drives
 * reading the file, applying flags, printing and saving, so a new setting is one line here plus its
 * default and its check. */
#include "worker/train/config.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/fileio.h"
#include "common/json.h"
#include "common/log.h"
#include "common/units.h"
#include "worker/train/schedule.h"

enum key_type {
    KEY_INT,    /* int64_t */
    KEY_DOUBLE, /* double */
    KEY_BOOL,   /* bool */
    KEY_PATH,   /* char[cap]; relative to the config file's folder when read from a file */
    KEY_TEXT,   /* char[cap] */
    KEY_ENUM,   /* an enum field: one of names[], stored as its index */
    KEY_CKPT,   /* checkpointing: none | all | every:K (checkpointing and checkpoint_every) */
    KEY_STORE,  /* state_store: ram | nvme:DIR (state_store and state_store_dir) */
    KEY_SIZE,   /* uint64_t bytes: none (0) or a size with a unit, e.g. 11GiB */
};

struct key_def {
    const char *key;  /* JSON key */
    const char *flag; /* command-line flag, or NULL for file-only keys */
    enum key_type type;
    size_t offset;    /* of the field in zt_train_config */
    size_t cap;       /* size of the field */
    const char *const *names; /* KEY_ENUM: the value names, in enum order */
    int nnames;
};

#define FIELD(name) offsetof(zt_train_config, name), sizeof(((zt_train_config *)0)->name), NULL, 0
#define ENUM_FIELD(name, arr)                                                                                   \
    offsetof(zt_train_config, name), sizeof(((zt_train_config *)0)->name), arr, (int)(sizeof(arr) / sizeof(arr[0]))

static const char *const device_names[] = {"cpu", "cuda"};
static const char *const precision_names[] = {"auto", "fp32", "bf16", "fp16"};
static const char *const optimizer_names[] = {"auto", "gpu", "cpu", "server"};
static const char *const weights_names[] = {"auto", "gpu", "host", "masters"};
static const char *const moments_names[] = {"fp32", "bf16"};
static const char *const overlong_names[] = {"truncate", "refuse"};
static const char *const server_shm_names[] = {"auto", "off"};
static const char *const schedule_names[] = {"nodecay", "noam", "linear", "cosine", "exponential"};

static const struct key_def keys[] = {
    {"model", "--model", KEY_PATH, FIELD(model_path)},
    {"init_from", "--init-from", KEY_PATH, FIELD(init_from)},
    {"train_data", "--train-data", KEY_PATH, FIELD(train_data)},
    {"val_data", "--val-data", KEY_PATH, FIELD(val_data)},
    {"tokenizer", "--tokenizer", KEY_PATH, FIELD(tokenizer)},
    {"out_dir", "--out", KEY_PATH, FIELD(out_dir)},
    {"sft_data", "--sft-data", KEY_PATH, FIELD(sft_data)},
    {"sft_val_data", "--sft-val-data", KEY_PATH, FIELD(sft_val_data)},
    {"chat_template", "--chat-template", KEY_TEXT, FIELD(chat_template)},
    {"train_on_prompt", "--train-on-prompt", KEY_BOOL, FIELD(train_on_prompt)},
    {"sft_overlong", "--sft-overlong", KEY_ENUM, ENUM_FIELD(sft_overlong, overlong_names)},
    {"sft_pack", "--sft-pack", KEY_BOOL, FIELD(sft_pack)},
    {"steps", "--steps", KEY_INT, FIELD(steps)},
    {"batch_size", "--batch-size", KEY_INT, FIELD(batch_size)},
    {"seq_len", "--seq-len", KEY_INT, FIELD(seq_len)},
    {"target_len", "--target-len", KEY_INT, FIELD(target_len)},
    {"grad_accum", "--grad-accum", KEY_INT, FIELD(grad_accum)},
    {"lr", "--lr", KEY_DOUBLE, FIELD(lr)},
    {"min_lr", "--min-lr", KEY_DOUBLE, FIELD(min_lr)},
    {"schedule", "--schedule", KEY_ENUM, ENUM_FIELD(schedule, schedule_names)},
    {"warmup_steps", "--warmup", KEY_INT, FIELD(warmup_steps)},
    {"lr_gamma", NULL, KEY_DOUBLE, FIELD(lr_gamma)},
    {"weight_decay", "--weight-decay", KEY_DOUBLE, FIELD(weight_decay)},
    {"beta1", NULL, KEY_DOUBLE, FIELD(beta1)},
    {"beta2", NULL, KEY_DOUBLE, FIELD(beta2)},
    {"eps", NULL, KEY_DOUBLE, FIELD(eps)},
    {"grad_clip", "--grad-clip", KEY_DOUBLE, FIELD(grad_clip)},
    {"eval_every", "--eval-every", KEY_INT, FIELD(eval_every)},
    {"eval_batches", "--eval-batches", KEY_INT, FIELD(eval_batches)},
    {"save_every", "--save-every", KEY_INT, FIELD(save_every)},
    {"log_every", "--log-every", KEY_INT, FIELD(log_every)},
    {"seed", "--seed", KEY_INT, FIELD(seed)},
    {"threads", "--threads", KEY_INT, FIELD(threads)},
    {"shuffle", NULL, KEY_BOOL, FIELD(shuffle)},
    {"save_grads", "--save-grads", KEY_BOOL, FIELD(save_grads)},
    {"device", "--device", KEY_ENUM, ENUM_FIELD(device, device_names)},
    {"precision", "--precision", KEY_ENUM, ENUM_FIELD(precision, precision_names)},
    {"loss_scale", NULL, KEY_DOUBLE, FIELD(loss_scale)},
    {"loss_scale_window", NULL, KEY_INT, FIELD(loss_scale_window)},
    {"min_loss_scale", NULL, KEY_DOUBLE, FIELD(min_loss_scale)},
    {"optimizer", "--optimizer", KEY_ENUM, ENUM_FIELD(optimizer, optimizer_names)},
    {"optimizer_gpu_fraction", "--optimizer-gpu-fraction", KEY_DOUBLE, FIELD(optimizer_gpu_fraction)},
    {"adam_moments", "--adam-moments", KEY_ENUM, ENUM_FIELD(adam_moments, moments_names)},
    {"moments_dir", "--moments-dir", KEY_PATH, FIELD(moments_dir)},
    {"moments_ram", "--moments-ram", KEY_SIZE, FIELD(moments_ram)},
    {"servers", "--servers", KEY_TEXT, FIELD(servers)},
    {"token_file", "--token-file", KEY_PATH, FIELD(token_file)},
    {"tls_ca", "--tls-ca", KEY_PATH, FIELD(tls_ca)},
    {"tls_cert", "--tls-cert", KEY_PATH, FIELD(tls_cert)},
    {"tls_key", "--tls-key", KEY_PATH, FIELD(tls_key)},
    {"server_shm", "--server-shm", KEY_ENUM, ENUM_FIELD(server_shm, server_shm_names)},
    {"state_store", "--state-store", KEY_STORE, FIELD(state_store)},
    {"zero_level", "--zero-level", KEY_INT, FIELD(zero_level)},
    {"checkpointing", "--checkpointing", KEY_CKPT, FIELD(checkpointing)},
    {"prefetch", "--prefetch", KEY_INT, FIELD(prefetch)},
    {"gpu_mem", "--gpu-mem", KEY_SIZE, FIELD(gpu_mem)},
    {"host_mem", "--host-mem", KEY_SIZE, FIELD(host_mem)},
    {"host_grad_accum", "--host-grad-accum", KEY_BOOL, FIELD(host_grad_accum)},
    {"weights", "--weights", KEY_ENUM, ENUM_FIELD(weights, weights_names)},
    {"auto_micro_batch", "--auto-micro-batch", KEY_BOOL, FIELD(auto_micro_batch)},
    {"plan_only", "--plan-only", KEY_BOOL, FIELD(plan_only)},
    {"grad_piece", NULL, KEY_INT, FIELD(grad_piece)},
};
#define NUM_KEYS (sizeof(keys) / sizeof(keys[0]))

/* Integers in JSON are doubles: beyond 2^53 they are not exact, so that is the widest accepted range. */
#define JSON_INT_LIMIT 9007199254740992LL

static void *field_ptr(zt_train_config *c, const struct key_def *k)
{
    return (char *)c + k->offset;
}

static const void *field_cptr(const zt_train_config *c, const struct key_def *k)
{
    return (const char *)c + k->offset;
}

static const struct key_def *find_key(const char *key)
{
    for (size_t i = 0; i < NUM_KEYS; i++)
        if (strcmp(keys[i].key, key) == 0)
            return &keys[i];
    return NULL;
}

static const struct key_def *find_flag(const char *flag)
{
    for (size_t i = 0; i < NUM_KEYS; i++)
        if (keys[i].flag && strcmp(keys[i].flag, flag) == 0)
            return &keys[i];
    return NULL;
}

/* The value names of the typed settings; see config.h. */
const char *zt_train_device_name(enum zt_train_device d)
{
    return (unsigned)d < 2 ? device_names[d] : "?";
}

const char *zt_train_precision_name(enum zt_train_precision p)
{
    return (unsigned)p < 4 ? precision_names[p] : "?";
}

const char *zt_train_optimizer_name(enum zt_train_optimizer o)
{
    return (unsigned)o < 4 ? optimizer_names[o] : "?";
}

/* The accepted values of an enum key, for messages: "a, b or c". */
static void list_names(const struct key_def *k, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < k->nnames && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i == 0 ? "" : i == k->nnames - 1 ? " or " : ", ",
                                 k->names[i]);
}

/* Parses the text of a typed setting (KEY_ENUM, KEY_CKPT, KEY_STORE) into its fields; an unknown value is
 * an error naming `where` and the accepted values. */
static int set_typed(zt_train_config *c, const struct key_def *k, const char *text, const char *where, zt_err *err)
{
    if (k->type == KEY_ENUM) {
        for (int i = 0; i < k->nnames; i++)
            if (strcmp(text, k->names[i]) == 0) {
                *(int *)((char *)c + k->offset) = i;
                return 0;
            }
        char names[128];
        list_names(k, names, sizeof names);
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: unknown %s '%s'; use %s", where, k->key, text, names);
    }
    if (k->type == KEY_CKPT) {
        if (strcmp(text, "none") == 0 || strcmp(text, "all") == 0) {
            c->checkpointing = text[0] == 'n' ? ZT_CKPT_NONE : ZT_CKPT_ALL;
            return 0;
        }
        char *end = NULL;
        long kk = strncmp(text, "every:", 6) == 0 && text[6] ? strtol(text + 6, &end, 10) : 0;
        if (end && *end == '\0' && kk >= 1 && kk <= 1000000) {
            c->checkpointing = ZT_CKPT_EVERY;
            c->checkpoint_every = kk;
            return 0;
        }
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s = '%s': use none, all or every:K (K from 1 to 1000000)", where, text);
    }
    if (k->type == KEY_SIZE) {
        uint64_t bytes = 0;
        zt_err serr;
        if (strcmp(text, "none") != 0 && zt_parse_size(text, &bytes, &serr) < 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s = '%s': use none or a size with a unit, e.g. 11GiB or 8000MiB",
                           where, text);
        *(uint64_t *)((char *)c + k->offset) = bytes;
        return 0;
    }
    /* KEY_STORE */
    if (strcmp(text, "ram") == 0) {
        c->state_store = ZT_STORE_RAM;
        c->state_store_dir[0] = '\0';
        return 0;
    }
    if (strncmp(text, "nvme:", 5) == 0 && text[5]) {
        if (strlen(text + 5) >= sizeof c->state_store_dir)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the directory is too long (at most %zu characters)", where,
                           sizeof c->state_store_dir - 1);
        c->state_store = ZT_STORE_NVME;
        snprintf(c->state_store_dir, sizeof c->state_store_dir, "%s", text + 5);
        return 0;
    }
    return zt_fail(err, ZT_EINVAL_CONFIG, "%s = '%s': use ram or nvme:DIR (a directory for the state files)", where,
                   text);
}

/* The text of a typed setting, as set_typed reads it. */
static void typed_text(const zt_train_config *c, const struct key_def *k, char *buf, size_t cap)
{
    if (k->type == KEY_ENUM) {
        int v = *(const int *)((const char *)c + k->offset);
        snprintf(buf, cap, "%s", v >= 0 && v < k->nnames ? k->names[v] : "?");
    } else if (k->type == KEY_CKPT) {
        if (c->checkpointing == ZT_CKPT_EVERY)
            snprintf(buf, cap, "every:%lld", (long long)c->checkpoint_every);
        else
            snprintf(buf, cap, "%s", c->checkpointing == ZT_CKPT_ALL ? "all" : "none");
    } else if (k->type == KEY_SIZE) {
        const uint64_t v = *(const uint64_t *)((const char *)c + k->offset);
        if (v == 0)
            snprintf(buf, cap, "none");
        else if (v % (1ULL << 30) == 0)
            snprintf(buf, cap, "%lluGiB", (unsigned long long)(v >> 30));
        else if (v % (1ULL << 20) == 0)
            snprintf(buf, cap, "%lluMiB", (unsigned long long)(v >> 20));
        else
            snprintf(buf, cap, "%llu", (unsigned long long)v);
    } else {
        snprintf(buf, cap, c->state_store == ZT_STORE_NVME ? "nvme:%s" : "ram", c->state_store_dir);
    }
}

/* Fills c with the defaults; see config.h. */
void zt_train_config_init(zt_train_config *c)
{
    memset(c, 0, sizeof(*c));
    zt_family_config_default(&c->model);
    c->model_loaded = false;
    snprintf(c->out_dir, sizeof(c->out_dir), "runs/train");
    c->steps = 1000;
    c->batch_size = 8;
    c->seq_len = 256;
    c->grad_accum = 1;
    c->lr = 6e-4;
    c->min_lr = 6e-5;
    c->schedule = ZT_SCHEDULE_COSINE;
    c->warmup_steps = ZT_TRAIN_AUTO;
    c->lr_gamma = 0.999;
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->grad_clip = 1.0;
    c->eval_every = 100;
    c->eval_batches = 10;
    c->save_every = 500;
    c->log_every = 10;
    c->seed = 1337;
    c->threads = 0;
    c->shuffle = true;
    c->device = ZT_DEVICE_CPU;
    c->precision = ZT_PRECISION_AUTO;
    c->loss_scale = 32768.0;
    c->loss_scale_window = 1024;
    c->min_loss_scale = 1.0;
    c->optimizer = ZT_OPTIMIZER_AUTO;
    c->state_store = ZT_STORE_RAM;
    c->zero_level = 3;
    c->checkpointing = ZT_CKPT_NONE;
    c->checkpoint_every = 1;
    c->prefetch = 1;
    c->grad_piece = 8 << 20;
    c->stop_at_step = 0;
}

/* Copies text into a string field of k->cap bytes; too long is an error naming `where`. */
static int set_string(zt_train_config *c, const struct key_def *k, const char *text, const char *where,
                      zt_err *err)
{
    size_t n = strlen(text);
    if (n >= k->cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: value of %zu characters is too long (at most %zu)", where, n,
                       k->cap - 1);
    memcpy(field_ptr(c, k), text, n + 1);
    return 0;
}

/* Joins a path from a config file with the file's folder (dir, "" for the current one), unless the path
 * is absolute. */
static int resolve_path(const char *dir, const char *value, char *out, size_t cap, const char *where,
                        zt_err *err)
{
    int n;
    if (value[0] == '\0' || value[0] == '/' || dir[0] == '\0')
        n = snprintf(out, cap, "%s", value);
    else
        n = snprintf(out, cap, "%s/%s", dir, value);
    if (n < 0 || (size_t)n >= cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: path '%s' is too long (at most %zu characters)", where, value,
                       cap - 1);
    return 0;
}

/* Reads the "model" key: a path to a HF config.json, an inline object, or null. */
static int read_model_key(zt_train_config *c, zt_json_reader *r, const cJSON *root, const char *dir,
                          const char *path, zt_err *err)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, "model");
    zt_json_accept(r, "model");
    if (!item)
        return 0;
    if (cJSON_IsNull(item)) {
        c->model_path[0] = '\0';
        c->model_loaded = false;
        return 0;
    }
    if (cJSON_IsString(item)) {
        char where[ZT_TRAIN_PATH_MAX + 16];
        snprintf(where, sizeof(where), "%s: \"model\"", path);
        int rc = resolve_path(dir, item->valuestring, c->model_path, sizeof(c->model_path), where, err);
        if (rc < 0)
            return rc;
        c->model_loaded = false;
        return 0;
    }
    if (cJSON_IsObject(item)) {
        char where[ZT_TRAIN_PATH_MAX + 16];
        snprintf(where, sizeof(where), "%s: \"model\"", path);
        zt_family_config m;
        int rc = zt_family_config_from_json(&m, item, where, err);
        if (rc < 0)
            return rc;
        c->model = m;
        c->model_loaded = true;
        c->model_path[0] = '\0';
        return 0;
    }
    return zt_fail(err, ZT_EINVAL_CONFIG,
                   "%s: \"model\" must be the path of a Hugging Face config.json or an object with its fields", path);
}

/* Reads a JSON config file over c, paths relative to its folder; see config.h. */
int zt_train_config_load_file(zt_train_config *c, const char *path, zt_err *err)
{
    cJSON *root = NULL;
    int rc = zt_json_load_object(path, &root, err);
    if (rc < 0)
        return rc;

    /* The folder of the config file: paths inside it are relative to it. */
    char dir[ZT_TRAIN_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        dir[0] = '\0';

    zt_json_reader r;
    zt_json_reader_init(&r, root, path);
    rc = read_model_key(c, &r, root, dir, path, err);
    for (size_t i = 0; rc == 0 && i < NUM_KEYS; i++) {
        const struct key_def *k = &keys[i];
        if (strcmp(k->key, "model") == 0)
            continue;
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, k->key);
        if (!item) {
            zt_json_accept(&r, k->key); /* known, so a misspelling of it gets a suggestion */
            continue;
        }
        switch (k->type) {
        case KEY_INT:
            rc = zt_json_get_int(&r, k->key, -JSON_INT_LIMIT, JSON_INT_LIMIT, field_ptr(c, k), err);
            break;
        case KEY_DOUBLE:
            rc = zt_json_get_double(&r, k->key, -DBL_MAX, DBL_MAX, field_ptr(c, k), err);
            break;
        case KEY_BOOL:
            rc = zt_json_get_bool(&r, k->key, field_ptr(c, k), err);
            break;
        case KEY_TEXT:
            rc = zt_json_get_string(&r, k->key, field_ptr(c, k), k->cap, err);
            break;
        case KEY_ENUM:
        case KEY_CKPT:
        case KEY_STORE:
        case KEY_SIZE: {
            char value[ZT_TRAIN_PATH_MAX + 8], where[ZT_TRAIN_PATH_MAX + 64];
            rc = zt_json_get_string(&r, k->key, value, sizeof(value), err);
            snprintf(where, sizeof(where), "%s: \"%s\"", path, k->key);
            if (rc == 0)
                rc = set_typed(c, k, value, where, err);
            break;
        }
        case KEY_PATH: {
            if (cJSON_IsNull(item)) { /* "init_from": null and the like: not given */
                zt_json_accept(&r, k->key);
                ((char *)field_ptr(c, k))[0] = '\0';
                break;
            }
            char value[ZT_TRAIN_PATH_MAX];
            rc = zt_json_get_string(&r, k->key, value, sizeof(value), err);
            if (rc == 0) {
                char where[ZT_TRAIN_PATH_MAX + 64];
                snprintf(where, sizeof(where), "%s: \"%s\"", path, k->key);
                rc = resolve_path(dir, value, field_ptr(c, k), k->cap, where, err);
            }
            break;
        }
        }
    }
    if (rc == 0)
        rc = zt_json_reader_finish(&r, err);
    cJSON_Delete(root);
    return rc;
}

/* Applies one command-line flag over c; see config.h. */
int zt_train_config_set_flag(zt_train_config *c, const char *flag, const char *value, zt_err *err)
{
    if (strcmp(flag, "--resume") == 0) {
        if (strlen(value) >= sizeof(c->resume))
            return zt_fail(err, ZT_EINVAL_CONFIG, "--resume: path is too long (at most %zu characters)",
                           sizeof(c->resume) - 1);
        snprintf(c->resume, sizeof(c->resume), "%s", value);
        return 0;
    }
    if (strcmp(flag, "--offload") == 0) {
        /* shorthand: cpu = the optimizer in host RAM; nvme:DIR = the embedded state server keeping the
         * optimizer state on NVMe in DIR */
        if (strcmp(value, "cpu") == 0) {
            c->optimizer = ZT_OPTIMIZER_CPU;
            return 0;
        }
        if (strncmp(value, "nvme:", 5) == 0 && value[5]) {
            c->optimizer = ZT_OPTIMIZER_SERVER;
            c->servers[0] = '\0';
            return set_typed(c, find_key("state_store"), value, flag, err);
        }
        return zt_fail(err, ZT_EINVAL_CONFIG, "--offload '%s': use cpu (the optimizer state in host RAM) or "
                       "nvme:DIR (the optimizer state on NVMe, in directory DIR)", value);
    }
    const struct key_def *k = find_flag(flag);
    if (!k)
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown flag '%s'; see ztrain train --help", flag);
    switch (k->type) {
    /* Only the form is checked here; zt_train_config_validate checks ranges and names the accepted one,
     * so the message below does not quote the (meaningless) limits of the number type. */
    case KEY_INT:
        if (zt_arg_int(flag, value, -JSON_INT_LIMIT, JSON_INT_LIMIT, field_ptr(c, k), NULL) < 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: expected a whole number, got '%s'", flag, value);
        return 0;
    case KEY_DOUBLE:
        if (zt_arg_double(flag, value, -DBL_MAX, DBL_MAX, field_ptr(c, k), NULL) < 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: expected a number, got '%s'", flag, value);
        return 0;
    case KEY_BOOL:
        /* A flag without a value ("--save-grads") arrives as "" and means true. */
        if (value[0] == '\0' || strcmp(value, "true") == 0 || strcmp(value, "1") == 0) {
            *(bool *)field_ptr(c, k) = true;
            return 0;
        }
        if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0) {
            *(bool *)field_ptr(c, k) = false;
            return 0;
        }
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: expected true or false, got '%s'", flag, value);
    case KEY_ENUM:
    case KEY_CKPT:
    case KEY_STORE:
    case KEY_SIZE:
        return set_typed(c, k, value, flag, err);
    case KEY_PATH:
    case KEY_TEXT: {
        int rc = set_string(c, k, value, flag, err);
        if (rc == 0 && strcmp(k->key, "model") == 0)
            c->model_loaded = false; /* --model replaces an inline model of the file */
        return rc;
    }
    }
    return ZT_EINVAL_CONFIG;
}

/* Reads the model config and fills the automatic settings; see config.h. */
int zt_train_config_resolve(zt_train_config *c, zt_err *err)
{
    if (c->warmup_steps == ZT_TRAIN_AUTO)
        c->warmup_steps = c->steps / 10 < 50 ? c->steps / 10 : 50;
    if (c->optimizer == ZT_OPTIMIZER_AUTO)
        c->optimizer = c->device == ZT_DEVICE_CUDA ? ZT_OPTIMIZER_GPU : ZT_OPTIMIZER_CPU;
    if (c->model_loaded)
        return 0;
    if (c->model_path[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "no model given: set \"model\" in the config file to a Hugging Face config.json "
                       "(or an inline object), or pass --model FILE (e.g. examples/gpt2-tiny.json)");
    zt_family_config m;
    int rc = zt_family_config_load(&m, c->model_path, err);
    if (rc < 0)
        return rc;
    c->model = m;
    c->model_loaded = true;
    return 0;
}

/* A setting's name for messages, e.g. "\"steps\" (--steps)", or "\"beta1\"" for keys without a flag.
 * Returns a pointer into a small ring of buffers, so that one message can name up to four settings. */
static const char *label(const char *key)
{
    static _Thread_local char bufs[4][96];
    static _Thread_local int next;
    char *buf = bufs[next];
    next = (next + 1) % 4;
    const struct key_def *k = find_key(key);
    if (k && k->flag)
        snprintf(buf, sizeof(bufs[0]), "\"%s\" (%s)", key, k->flag);
    else
        snprintf(buf, sizeof(bufs[0]), "\"%s\"", key);
    return buf;
}

/* Checks lo <= v <= hi for an integer setting. */
static int check_int(const zt_train_config *c, const char *key, int64_t lo, int64_t hi, zt_err *err)
{
    const int64_t v = *(const int64_t *)field_cptr(c, find_key(key));
    if (v < lo || v > hi)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "config: %s = %lld is out of range: set it to a whole number from %lld to %lld", label(key),
                       (long long)v, (long long)lo, (long long)hi);
    return 0;
}

/* Checks a double setting against lo and hi; open bounds exclude the bound itself. */
static int check_double(const zt_train_config *c, const char *key, double lo, bool lo_open, double hi, bool hi_open,
                        zt_err *err)
{
    const double v = *(const double *)field_cptr(c, find_key(key));
    bool ok = v == v && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = %g is out of range: set it to a number in %c%g, %g%c",
                       label(key), v, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    return 0;
}

/* Checks the optimizer placement, the state-server settings and the engine's settings together. */
static int validate_placement(const zt_train_config *c, zt_err *err)
{
    const bool cuda = c->device == ZT_DEVICE_CUDA;
    enum zt_train_optimizer opt = c->optimizer;
    if (opt == ZT_OPTIMIZER_AUTO)
        opt = cuda ? ZT_OPTIMIZER_GPU : ZT_OPTIMIZER_CPU;
    if (opt == ZT_OPTIMIZER_GPU && !cuda)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = gpu needs --device cuda: on the CPU use --optimizer cpu "
                       "(the default) or server", label("optimizer"));
    int rc;
    if ((rc = check_double(c, "optimizer_gpu_fraction", 0.0, false, 1.0, false, err)) < 0)
        return rc;
    if (c->optimizer_gpu_fraction > 0 && (!cuda || opt != ZT_OPTIMIZER_CPU))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = %g splits the optimizer between the host and the GPU: it "
                       "needs --device cuda --optimizer cpu (or set it to 0)", label("optimizer_gpu_fraction"),
                       c->optimizer_gpu_fraction);
    if (c->adam_moments == ZT_MOMENTS_BF16 && (opt != ZT_OPTIMIZER_CPU || c->optimizer_gpu_fraction > 0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = bf16 keeps the moments in the host AdamW: it needs "
                       "--optimizer cpu without --optimizer-gpu-fraction (or use fp32)", label("adam_moments"));
    if (c->moments_dir[0] && (opt != ZT_OPTIMIZER_CPU || c->optimizer_gpu_fraction > 0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = '%s' puts the Adam moments of the host AdamW on disk: it "
                       "needs --optimizer cpu without --optimizer-gpu-fraction (or drop it)",
                       label("moments_dir"), c->moments_dir);
    if (c->moments_dir[0] && !cuda && c->zero_level != 3)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s on the CPU streams the weights from the host AdamW's arrays: "
                       "it needs --zero-level 3 (or drop it)", label("moments_dir"));
    if (c->moments_ram > 0 && !c->moments_dir[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s sets how much of the moments stays in RAM beside "
                       "--moments-dir: give --moments-dir DIR too (or drop it)", label("moments_ram"));
    const bool server = opt == ZT_OPTIMIZER_SERVER;
    const bool remote = c->servers[0] != '\0';
    if (remote && !server)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s is given but %s = %s: state servers hold the optimizer "
                       "only with --optimizer server; add it or drop --servers", label("servers"), label("optimizer"),
                       zt_train_optimizer_name(opt));
    const char *remote_only[] = {"token_file", "tls_ca", "tls_cert", "tls_key"};
    for (size_t i = 0; i < sizeof(remote_only) / sizeof(remote_only[0]); i++) {
        const char *v = (const char *)field_cptr(c, find_key(remote_only[i]));
        if (v[0] && !remote)
            return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s is only used with remote state servers: pass "
                           "--optimizer server --servers host:port,... or drop it", label(remote_only[i]));
    }
    if (c->server_shm != ZT_SERVER_SHM_AUTO && !remote)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s is only used with remote state servers: pass "
                       "--optimizer server --servers host:port,... or drop it", label("server_shm"));
    if ((c->tls_cert[0] != '\0') != (c->tls_key[0] != '\0'))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s and %s go together (mutual TLS): give both or neither",
                       label("tls_cert"), label("tls_key"));
    if ((c->tls_cert[0] || c->tls_key[0]) && !c->tls_ca[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: a client certificate needs TLS: give %s too", label("tls_ca"));
    if (c->state_store == ZT_STORE_NVME && (!server || remote))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = nvme:%s applies to the embedded state server only "
                       "(--optimizer server without --servers); remote servers choose theirs with "
                       "ztrain-server --store", label("state_store"), c->state_store_dir);
    if ((rc = check_int(c, "zero_level", 2, 3, err)) < 0 || (rc = check_int(c, "prefetch", 0, 64, err)) < 0)
        return rc;
    if ((rc = check_int(c, "grad_piece", 256, 1 << 30, err)) < 0)
        return rc;
    if (c->gpu_mem > 0 && !cuda)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s caps GPU memory: it needs --device cuda (or drop it)",
                       label("gpu_mem"));
    if (c->weights != ZT_WEIGHTS_AUTO && !cuda)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s places the weights on or off a GPU: it needs --device "
                       "cuda (or set it to auto)", label("weights"));
    if (c->weights == ZT_WEIGHTS_HOST && (opt == ZT_OPTIMIZER_GPU || c->zero_level != 3 ||
                                          c->optimizer_gpu_fraction > 0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = host streams the weights from host memory, where the "
                       "optimizer updates them: it needs --optimizer cpu or server (without "
                       "--optimizer-gpu-fraction) and --zero-level 3", label("weights"));
    if (c->weights == ZT_WEIGHTS_MASTERS && (opt != ZT_OPTIMIZER_CPU || c->zero_level != 3 ||
                                             c->optimizer_gpu_fraction > 0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = masters streams the fp32 masters of the host AdamW: it "
                       "needs --optimizer cpu (without --optimizer-gpu-fraction) and --zero-level 3 (or use "
                       "--weights host)", label("weights"));
    if (c->checkpointing == ZT_CKPT_EVERY && (c->checkpoint_every < 1 || c->checkpoint_every > 1000000))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = every:%lld: K must be from 1 to 1000000",
                       label("checkpointing"), (long long)c->checkpoint_every);
    return 0;
}

/* Whether layer l keeps only its output; see config.h. */
bool zt_train_config_layer_checkpointed(const zt_train_config *c, int l)
{
    if (c->checkpointing == ZT_CKPT_ALL)
        return true;
    if (c->checkpointing == ZT_CKPT_EVERY)
        return l % c->checkpoint_every == 0;
    return false;
}

/* Checks the settings of supervised fine-tuning (sft_data and the keys that only it reads). */
static int validate_sft(const zt_train_config *c, enum zt_family_task task, zt_err *err)
{
    if (c->sft_data[0] == '\0') {
        const char *only[] = {"sft_val_data", "chat_template"};
        for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
            if (((const char *)field_cptr(c, find_key(only[i])))[0])
                return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s is a setting of supervised fine-tuning: give the "
                               "training examples with %s too, or drop it", label(only[i]), label("sft_data"));
        if (c->train_on_prompt || c->sft_pack || c->sft_overlong != ZT_OVERLONG_TRUNCATE)
            return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s is a setting of supervised fine-tuning: give the "
                           "training examples with %s too, or drop it",
                           label(c->train_on_prompt ? "train_on_prompt" : c->sft_pack ? "sft_pack" : "sft_overlong"),
                           label("sft_data"));
        return 0;
    }
    if (c->sft_pack && task != ZT_TASK_CAUSAL_LM)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s packs examples for decoder models (gpt2, llama, qwen2, "
                       "gpt_neox), whose attention can stay inside each example; this %s model (%s) does not pack: "
                       "drop %s", label("sft_pack"), zt_family_name(&c->model),
                       task == ZT_TASK_MASKED_LM ? "masked LM" : "not a decoder", label("sft_pack"));
    if (task != ZT_TASK_CAUSAL_LM && task != ZT_TASK_SEQ2SEQ)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s fine-tunes decoder models (gpt2, llama, qwen2, gpt_neox) "
                       "and text-to-text models (t5); this %s model is neither: train it on its own data with %s",
                       label("sft_data"), zt_family_name(&c->model), label("train_data"));
    if (c->train_data[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s and %s are both given: a run trains on token shards or on "
                       "supervised examples, not both; drop one", label("train_data"), label("sft_data"));
    if (c->val_data[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s reads token shards; the validation examples of supervised "
                       "fine-tuning go in %s (a JSONL file like %s)", label("val_data"), label("sft_val_data"),
                       label("sft_data"));
    if (c->tokenizer[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s reads texts: set %s to the model's tokenizer.json (a "
                       "tokenizer_config.json beside it gives the chat template)", label("sft_data"),
                       label("tokenizer"));
    return 0;
}

/* Whether x is a power of two (1, 2, 4, ..., or 1/2, 1/4, ...). */
static bool power_of_two(double x)
{
    int e;
    return x > 0 && frexp(x, &e) == 0.5;
}

/* Checks every setting; the first problem is returned with the key, the flag and the fix. */
int zt_train_config_validate(const zt_train_config *c, zt_err *err)
{
    int rc;
    if (!c->model_loaded) {
        if (c->model_path[0] == '\0')
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "no model given: set \"model\" in the config file to a Hugging Face config.json "
                           "(or an inline object), or pass --model FILE (e.g. examples/gpt2-tiny.json)");
        return zt_fail(err, ZT_EINVAL_CONFIG, "the model config '%s' was not read yet (zt_train_config_resolve)",
                       c->model_path);
    }
    if ((rc = zt_family_config_validate(&c->model, err)) < 0)
        return rc;
    const enum zt_family_task task = zt_family_config_task(&c->model);
    if ((rc = validate_sft(c, task, err)) < 0)
        return rc;
    const bool sft = c->sft_data[0] != '\0';
    if (task == ZT_TASK_SEQ2SEQ && !sft)
        return zt_fail(err, ZT_EINVAL_CONFIG, "a text-to-text model (%s) trains on JSONL examples: set %s to a file "
                       "of {\"input\": ..., \"target\": ...} records (and %s to the model's tokenizer.json)",
                       zt_family_name(&c->model), label("sft_data"), label("tokenizer"));
    if (c->target_len != 0 && task != ZT_TASK_SEQ2SEQ)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s is the decoder's length of a text-to-text model (t5); this "
                       "%s model has none: drop it", label("target_len"), zt_family_name(&c->model));
    if (c->plan_only && c->device != ZT_DEVICE_CUDA)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s plans a GPU run's memory: add --device cuda (a CPU run "
                       "plans its memory as it builds the model; give it --host-mem to check a cap)", label("plan_only"));
    if (c->train_data[0] == '\0' && !sft && !c->plan_only)
        return task == ZT_TASK_CLASSIFY
                   ? zt_fail(err, ZT_EINVAL_CONFIG, "no training data given: set %s to a JSONL file of examples "
                             "({\"text\": ..., \"label\": ...} per line)", label("train_data"))
                   : zt_fail(err, ZT_EINVAL_CONFIG,
                             "no training data given: set %s to a glob of token shards made by `ztrain tokenize`, "
                             "e.g. \"runs/demo/data/corpus_train_*.bin\"%s", label("train_data"),
                             task == ZT_TASK_CAUSAL_LM ? " (or, to fine-tune on instructions, --sft-data FILE.jsonl)"
                                                       : "");
    if (task == ZT_TASK_CLASSIFY && c->tokenizer[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "a classification model reads texts: set %s to the model's "
                       "tokenizer.json", label("tokenizer"));
    if (task == ZT_TASK_MASKED_LM && c->tokenizer[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "a masked-LM model masks its tokens with [MASK] and never masks special "
                       "tokens: set %s to the model's tokenizer.json, which names them", label("tokenizer"));
    if (task == ZT_TASK_CAUSAL_LM && c->tokenizer[0] != '\0' && !sft)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s is for JSONL data (BERT and RoBERTa models, or --sft-data); this %s "
                       "model reads token shards made by `ztrain tokenize --tokenizer`: leave it out",
                       label("tokenizer"), zt_family_name(&c->model));
    if (c->out_dir[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "no run directory given: set %s, e.g. \"runs/demo\"", label("out_dir"));

    if ((rc = check_int(c, "steps", 1, 1000000000, err)) < 0 ||
        (rc = check_int(c, "batch_size", 1, 1 << 20, err)) < 0 ||
        (rc = check_int(c, "seq_len", 1, 1 << 20, err)) < 0 ||
        (rc = check_int(c, "grad_accum", 1, 1 << 20, err)) < 0)
        return rc;
    if (task == ZT_TASK_SEQ2SEQ && (c->target_len < 0 || c->target_len > c->seq_len))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = %lld must be from 1 to %s (%lld; 0: the same): the "
                       "decoder's targets sit in the rows of the input's length", label("target_len"),
                       (long long)c->target_len, label("seq_len"), (long long)c->seq_len);
    const int positions = zt_family_config_positions(&c->model);
    if (c->seq_len > positions)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "config: %s = %lld is longer than the model's %d positions (n_positions, "
                       "max_position_embeddings): lower it to at most %d (or use a model with more positions)",
                       label("seq_len"), (long long)c->seq_len, positions, positions);
    if (c->batch_size * c->seq_len > (1LL << 30))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "config: batch_size x seq_len = %lld tokens per micro-batch is too many: lower %s or raise %s",
                       (long long)(c->batch_size * c->seq_len), label("batch_size"), label("grad_accum"));

    if ((rc = check_double(c, "lr", 0.0, true, 10.0, false, err)) < 0 ||
        (rc = check_double(c, "min_lr", 0.0, false, 10.0, false, err)) < 0)
        return rc;
    if (c->min_lr > c->lr)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = %g is above %s = %g: the floor of the schedule must "
                       "not exceed the peak rate; lower min_lr", label("min_lr"), c->min_lr, label("lr"), c->lr);
    /* typed settings set in the struct directly (not through a flag or a file) */
    for (size_t i = 0; i < NUM_KEYS; i++) {
        const struct key_def *k = &keys[i];
        int v = *(const int *)field_cptr(c, k);
        if (k->type == KEY_ENUM && (v < 0 || v >= k->nnames)) {
            char names[128];
            list_names(k, names, sizeof names);
            return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s holds no known value (%d): use %s", label(k->key), v,
                           names);
        }
    }
    if ((rc = check_int(c, "warmup_steps", 0, 1000000000, err)) < 0)
        return rc;
    if (zt_schedule_decays(c->schedule) && c->warmup_steps >= c->steps)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "config: %s = %lld is not below \"steps\" (--steps) = %lld: the %s schedule decays after "
                       "warmup, so lower the warmup or raise the steps",
                       label("warmup_steps"), (long long)c->warmup_steps, (long long)c->steps,
                       zt_schedule_name(c->schedule));
    if ((rc = check_double(c, "lr_gamma", 0.0, true, 1.0, false, err)) < 0 ||
        (rc = check_double(c, "weight_decay", 0.0, false, 10.0, false, err)) < 0 ||
        (rc = check_double(c, "beta1", 0.0, false, 1.0, true, err)) < 0 ||
        (rc = check_double(c, "beta2", 0.0, false, 1.0, true, err)) < 0 ||
        (rc = check_double(c, "eps", 0.0, true, 1.0, false, err)) < 0 ||
        (rc = check_double(c, "grad_clip", 0.0, false, 1e30, false, err)) < 0)
        return rc;

    if ((rc = check_int(c, "eval_every", 0, 1000000000, err)) < 0 ||
        (rc = check_int(c, "eval_batches", 1, 1000000, err)) < 0 ||
        (rc = check_int(c, "save_every", -1, 1000000000, err)) < 0 ||
        (rc = check_int(c, "log_every", 1, 1000000000, err)) < 0 ||
        (rc = check_int(c, "seed", 0, JSON_INT_LIMIT, err)) < 0 ||
        (rc = check_int(c, "threads", 0, 4096, err)) < 0)
        return rc;
    if (c->stop_at_step < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: stop_at_step = %lld must be 0 (off) or a step number",
                       (long long)c->stop_at_step);
    if (c->device == ZT_DEVICE_CPU && c->precision != ZT_PRECISION_AUTO && c->precision != ZT_PRECISION_FP32)
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = %s needs the GPU: the CPU trains in fp32 (pass "
                       "--device cuda, or leave the precision on auto)", label("precision"),
                       zt_train_precision_name(c->precision));
    if ((rc = check_double(c, "loss_scale", 1.0, false, 16777216.0, false, err)) < 0 ||
        (rc = check_double(c, "min_loss_scale", 0.0, true, c->loss_scale, false, err)) < 0 ||
        (rc = check_int(c, "loss_scale_window", 1, 1000000000, err)) < 0)
        return rc;
    /* Dynamic loss scaling halves and doubles the scale: powers of two keep every scaled gradient exact. */
    if (!power_of_two(c->loss_scale) || !power_of_two(c->min_loss_scale))
        return zt_fail(err, ZT_EINVAL_CONFIG, "config: %s = %g and %s = %g must be powers of two (e.g. 32768 and 1), "
                       "so that scaling a gradient and removing the scale are exact", label("loss_scale"), c->loss_scale,
                       label("min_loss_scale"), c->min_loss_scale);
    return validate_placement(c, err);
}

/* Writes the value of setting k as text (paths and strings as they are, "-" when empty). */
static void format_value(const zt_train_config *c, const struct key_def *k, char *buf, size_t cap)
{
    const void *p = field_cptr(c, k);
    switch (k->type) {
    case KEY_INT:
        snprintf(buf, cap, "%lld", (long long)*(const int64_t *)p);
        break;
    case KEY_DOUBLE:
        snprintf(buf, cap, "%.9g", *(const double *)p);
        break;
    case KEY_BOOL:
        snprintf(buf, cap, "%s", *(const bool *)p ? "true" : "false");
        break;
    case KEY_PATH:
    case KEY_TEXT:
        snprintf(buf, cap, "%s", ((const char *)p)[0] ? (const char *)p : "-");
        break;
    case KEY_ENUM:
    case KEY_CKPT:
    case KEY_STORE:
    case KEY_SIZE:
        typed_text(c, k, buf, cap);
        break;
    }
}

/* Logs one line per setting; see config.h. */
void zt_train_config_log(const zt_train_config *c)
{
    char value[ZT_TRAIN_PATH_MAX + 32];
    for (size_t i = 0; i < NUM_KEYS; i++) {
        const struct key_def *k = &keys[i];
        if (strcmp(k->key, "model") == 0 && c->model_path[0] == '\0')
            snprintf(value, sizeof(value), "(inline)");
        else
            format_value(c, k, value, sizeof(value));
        zt_log(ZT_LOG_INFO, "config: %s = %s", k->key, value);
    }
    if (c->resume[0])
        zt_log(ZT_LOG_INFO, "config: resume = %s", c->resume);
    if (c->stop_at_step > 0)
        zt_log(ZT_LOG_INFO, "config: stop_at_step = %lld", (long long)c->stop_at_step);
}

/* Makes a path absolute by prefixing the current directory; returns a malloc'd string or NULL on error. */
static char *absolute_path(const char *path, zt_err *err)
{
    if (path[0] == '/')
        return strdup(path);
    char cwd[ZT_TRAIN_PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd))) {
        zt_fail(err, ZT_EIO, "cannot find the current directory to make '%s' absolute", path);
        return NULL;
    }
    while (path[0] == '.' && path[1] == '/')
        path += 2;
    size_t n = strlen(cwd) + 1 + strlen(path) + 1;
    char *out = zt_xmalloc(n);
    snprintf(out, n, "%s/%s", cwd, path);
    return out;
}

/* Writes c as a JSON config file with absolute paths, atomically; see config.h. */
int zt_train_config_save(const zt_train_config *c, const char *path, const char *model_ref, zt_err *err)
{
    cJSON *root = cJSON_CreateObject();
    ZT_ASSERT(root);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < NUM_KEYS; i++) {
        const struct key_def *k = &keys[i];
        const void *p = field_cptr(c, k);
        if (strcmp(k->key, "model") == 0) {
            cJSON_AddStringToObject(root, "model", model_ref);
            continue;
        }
        switch (k->type) {
        case KEY_INT:
            cJSON_AddItemToObject(root, k->key, zt_json_exact_int(*(const int64_t *)p));
            break;
        case KEY_DOUBLE:
            cJSON_AddItemToObject(root, k->key, zt_json_exact_double(*(const double *)p));
            break;
        case KEY_BOOL:
            cJSON_AddBoolToObject(root, k->key, *(const bool *)p);
            break;
        case KEY_TEXT:
            cJSON_AddStringToObject(root, k->key, (const char *)p);
            break;
        case KEY_ENUM:
        case KEY_CKPT:
        case KEY_STORE:
        case KEY_SIZE: {
            char text[ZT_TRAIN_PATH_MAX + 8];
            typed_text(c, k, text, sizeof text);
            cJSON_AddStringToObject(root, k->key, text);
            break;
        }
        case KEY_PATH:
            if (((const char *)p)[0] == '\0') {
                cJSON_AddNullToObject(root, k->key);
            } else {
                char *abs = absolute_path((const char *)p, err);
                if (!abs) {
                    rc = ZT_EIO;
                    break;
                }
                cJSON_AddStringToObject(root, k->key, abs);
                free(abs);
            }
            break;
        }
    }
    if (rc == 0) {
        char *text = cJSON_Print(root);
        ZT_ASSERT(text);
        size_t n = strlen(text);
        char *with_newline = zt_xmalloc(n + 2);
        memcpy(with_newline, text, n);
        with_newline[n] = '\n';
        with_newline[n + 1] = '\0';
        rc = zt_write_file_atomic(path, with_newline, n + 1, err);
        free(with_newline);
        cJSON_free(text);
    }
    cJSON_Delete(root);
    return rc;
}
