/* `ztrain export`: turns a training checkpoint into a Hugging Face model. The checkpoint is verified, then
 * its model.safetensors (Hugging Face names, F32) is written -- as it is, or converted to BF16/F16, or split
 * into shards with model.safetensors.index.json -- with the model's config.json and the tokenizer the run
 * used. --out DIR writes a folder as transformers' save_pretrained does (shards above 5GB by default), so
 * that from_pretrained(DIR) loads it; --out FILE.safetensors writes one file (shards only when
 * --max-shard-size asks) with config.json in FILE's folder. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/json.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/units.h"
#include "offload/cpu_adam.h" /* zt_cpu_adam_convert: fp32 to bf16/fp16, round to nearest even */
#include "worker/cli/commands.h"
#include "worker/models/family.h"
#include "worker/train/checkpoint.h"

/* transformers' default max_shard_size for save_pretrained: "5GB", decimal. */
#define ZT_EXPORT_DEFAULT_SHARD 5000000000ULL

static const char export_usage[] =
    "usage: ztrain export --checkpoint DIR --out DIR [--dtype D] [--max-shard-size SIZE] [--tokenizer FILE]\n"
    "       ztrain export --checkpoint DIR --out FILE.safetensors [--dtype D] [--max-shard-size SIZE]\n"
    "\n"
    "Writes the weights of a training checkpoint under their Hugging Face names with the model's config.json\n"
    "and the run's tokenizer, so that transformers' from_pretrained loads the folder.\n"
    "\n"
    "  --checkpoint DIR        a run directory (its latest checkpoint) or a ckpt_NNNNNN directory\n"
    "  --out DIR               a model folder as save_pretrained writes it: config.json, model.safetensors or\n"
    "                          shards model-00001-of-0000N.safetensors with model.safetensors.index.json, and\n"
    "                          tokenizer.json (with tokenizer_config.json and special_tokens_map.json when they\n"
    "                          sit beside it); weights files of an earlier export in DIR are replaced\n"
    "  --out FILE.safetensors  one safetensors file; config.json (and the tokenizer) go into FILE's folder\n"
    "  --dtype D               f32 (default, the checkpoint's values) | bf16 | f16 (rounded to nearest even)\n"
    "  --max-shard-size SIZE   split into files of at most SIZE (e.g. 5GB, 500MiB); one file when all fits.\n"
    "                          Default for --out DIR: 5GB, as transformers; for FILE.safetensors: no split\n"
    "  --tokenizer FILE        the tokenizer.json to export (default: the one the run's config names, which\n"
    "                          BERT / RoBERTa runs have; a causal LM's data was tokenized beforehand)\n";

static int fail_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "ztrain: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "; see ztrain export --help\n");
    return 2;
}

/* Copies src to dst atomically. */
static int copy_file(const char *src, const char *dst, size_t *bytes, zt_err *err)
{
    char *data = NULL;
    size_t len = 0;
    int rc = zt_read_file(src, &data, &len, err);
    if (rc < 0)
        return rc;
    rc = zt_write_file_atomic(dst, data, len, err);
    free(data);
    if (bytes)
        *bytes = len;
    return rc;
}

/* True when two paths name the same existing directory. */
static bool same_dir(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && strcmp(ra, rb) == 0;
}

/* The output's tensors: those of the checkpoint's model.safetensors f (Hugging Face names, F32, written by
 * zt_family_model_export) in w, F32 ones converted to dtype into buffers that *bufs receives (free each and
 * the array), the others borrowed from f. *total receives the bytes of tensor data. */
static int collect_tensors(const zt_st_file *f, enum zt_dtype dtype, zt_st_writer *w, void ***bufs,
                           uint64_t *total, zt_err *err)
{
    const size_t n = zt_st_count(f);
    *bufs = zt_xcalloc(n + 1, sizeof **bufs);
    *total = 0;
    int rc = zt_st_writer_add_metadata(w, "format", "pt", err); /* transformers requires it */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        const void *data = t->data;
        enum zt_dtype out = t->dtype;
        if (t->dtype == ZT_DTYPE_F32 && dtype != ZT_DTYPE_F32) {
            const size_t numel = (size_t)t->nbytes / zt_dtype_size(t->dtype);
            (*bufs)[i] = zt_xmalloc(numel * zt_dtype_size(dtype) + 1);
            if ((rc = zt_cpu_adam_convert((*bufs)[i], dtype, t->data, numel, 0, err)) < 0)
                break;
            data = (*bufs)[i];
            out = dtype;
        }
        rc = zt_st_writer_add(w, t->name, out, t->ndim, t->shape, data, err);
        *total += (uint64_t)t->nbytes / zt_dtype_size(t->dtype) * zt_dtype_size(out);
    }
    return rc;
}

/* Writes the checkpoint's weights src converted to dtype. Folder mode (file NULL): into dir as transformers'
 * save_pretrained does, model.safetensors or shards of at most max_shard bytes with their index. File mode:
 * into file when it all fits max_shard (0: no limit), else shards into dir. src was written by
 * zt_family_model_export, so its tensors are what zt_family_model_export_sharded would write, and the
 * sharding is the one that function uses (zt_st_writer_write_sharded), without building the model in
 * memory (F32 tensors are borrowed from the mapped file). *bytes and *nshards receive what was written. */
static int export_weights(const char *src, const char *file, const char *dir, enum zt_dtype dtype,
                          uint64_t max_shard, uint64_t *bytes, int *nshards, zt_err *err)
{
    zt_st_file *f = NULL;
    int rc = zt_st_open(src, &f, err);
    if (rc < 0)
        return rc;
    zt_st_writer *w = zt_st_writer_create();
    void **bufs = NULL;
    rc = collect_tensors(f, dtype, w, &bufs, bytes, err);
    *nshards = 1;
    if (rc == 0 && file && (max_shard == 0 || *bytes <= max_shard))
        rc = zt_st_writer_write(w, file, err);
    else if (rc == 0)
        rc = zt_st_writer_write_sharded(w, dir, (size_t)max_shard, nshards, err);
    for (size_t i = 0; bufs && i < zt_st_count(f); i++)
        free(bufs[i]);
    free(bufs);
    zt_st_writer_destroy(w);
    zt_st_close(f);
    return rc;
}

/* Whether name is a weights file of a Hugging Face folder: model.safetensors, its index, or a shard
 * model-NNNNN-of-NNNNN.safetensors. */
static bool is_weights_file(const char *name)
{
    int a = 0, b = 0, end = 0;
    if (strcmp(name, "model.safetensors") == 0 || strcmp(name, "model.safetensors.index.json") == 0)
        return true;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &end) == 2 && end > 0 &&
           name[end] == '\0';
}

/* Removes the weights files in dir that this export did not write (nshards files): another export's
 * shards or model.safetensors, which transformers would read instead of, or beside, the new ones. */
static int remove_stale_weights(const char *dir, int nshards, zt_err *err)
{
    char keep[64];
    DIR *d = opendir(dir);
    if (!d)
        return zt_fail(err, -errno, "cannot list %s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (!is_weights_file(e->d_name))
            continue;
        bool ours = false;
        if (nshards == 1) {
            ours = strcmp(e->d_name, "model.safetensors") == 0;
        } else {
            ours = strcmp(e->d_name, "model.safetensors.index.json") == 0;
            for (int s = 1; !ours && s <= nshards; s++) {
                snprintf(keep, sizeof keep, "model-%05d-of-%05d.safetensors", s, nshards);
                ours = strcmp(e->d_name, keep) == 0;
            }
        }
        if (ours)
            continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0)
            rc = zt_fail(err, -errno, "cannot remove %s, left by an earlier export: %s (remove it, or export into "
                         "an empty folder)", path, strerror(errno));
        else
            zt_log(ZT_LOG_INFO, "export: removed %s, left by an earlier export", path);
    }
    closedir(d);
    return rc;
}

/* The tokenizer.json that the run of checkpoint ckpt used (its config.json's "tokenizer", relative to that
 * file's folder unless absolute) into out (cap bytes); "" when the run named none. */
static int run_tokenizer(const char *ckpt, char *out, size_t cap, zt_err *err)
{
    char path[PATH_MAX + 16];
    cJSON *cfg = NULL;
    out[0] = '\0';
    snprintf(path, sizeof path, "%s/config.json", ckpt);
    int rc = zt_json_load_object(path, &cfg, err);
    if (rc < 0)
        return rc;
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer");
    if (cJSON_IsString(tok) && tok->valuestring[0] != '\0') {
        if (tok->valuestring[0] == '/')
            snprintf(out, cap, "%s", tok->valuestring);
        else
            snprintf(out, cap, "%s/%s", ckpt, tok->valuestring);
    }
    cJSON_Delete(cfg);
    return 0;
}

/* Copies tokenizer (a tokenizer.json) into dir as tokenizer.json, with the tokenizer_config.json and
 * special_tokens_map.json beside it when they exist. *copied receives how many files were written. */
static int export_tokenizer(const char *tokenizer, const char *dir, int *copied, zt_err *err)
{
    static const char *const extras[] = {"tokenizer_config.json", "special_tokens_map.json"};
    char dst[PATH_MAX + 32], src[PATH_MAX + 32], folder[PATH_MAX];
    *copied = 0;
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    int rc = copy_file(tokenizer, dst, NULL, err);
    if (rc < 0)
        return rc;
    *copied = 1;
    snprintf(folder, sizeof folder, "%s", tokenizer);
    const char *from = dirname(folder);
    for (size_t i = 0; i < sizeof extras / sizeof *extras; i++) {
        snprintf(src, sizeof src, "%s/%s", from, extras[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, extras[i]);
        if (access(src, R_OK) != 0)
            continue;
        if ((rc = copy_file(src, dst, NULL, err)) < 0)
            return rc;
        (*copied)++;
    }
    return 0;
}

/* Whether path ends in ".safetensors" (file mode: one file and config.json beside it). */
static bool is_safetensors_path(const char *path)
{
    const size_t n = strlen(path), k = strlen(".safetensors");
    return n > k && strcmp(path + n - k, ".safetensors") == 0;
}

/* Runs `ztrain export ARGS`; returns the exit status (0, 1 or 2). */
int zt_cmd_export(int argc, char **argv)
{
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"checkpoint", required_argument, NULL, 'c'},
        {"out", required_argument, NULL, 'o'},
        {"dtype", required_argument, NULL, 'd'},
        {"max-shard-size", required_argument, NULL, 's'},
        {"tokenizer", required_argument, NULL, 't'},
        {NULL, 0, NULL, 0},
    };
    const char *checkpoint = NULL, *out = NULL, *tokenizer_flag = NULL;
    enum zt_dtype dtype = ZT_DTYPE_F32;
    uint64_t max_shard = 0;
    zt_err perr = {{0}};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(export_usage, stdout);
            return 0;
        case 'c':
            checkpoint = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'd':
            if (strcmp(optarg, "f32") == 0)
                dtype = ZT_DTYPE_F32;
            else if (strcmp(optarg, "bf16") == 0)
                dtype = ZT_DTYPE_BF16;
            else if (strcmp(optarg, "f16") == 0)
                dtype = ZT_DTYPE_F16;
            else
                return fail_usage("--dtype '%s': use f32, bf16 or f16", optarg);
            break;
        case 's':
            if (zt_parse_size(optarg, &max_shard, &perr) < 0 || max_shard == 0)
                return fail_usage("--max-shard-size '%s': use a size with a unit, e.g. 5GB or 500MiB", optarg);
            break;
        case 't':
            tokenizer_flag = optarg;
            break;
        case ':':
            return fail_usage("%s needs a value", argv[optind - 1]);
        default:
            return fail_usage("unknown flag '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail_usage("unexpected argument '%s' (export takes only flags)", argv[optind]);
    if (!checkpoint)
        return fail_usage("%s is required", "--checkpoint DIR");
    if (!out || out[0] == '\0')
        return fail_usage("%s is required", "--out DIR (or --out FILE.safetensors)");
    if (tokenizer_flag && access(tokenizer_flag, R_OK) != 0)
        return fail_usage("--tokenizer '%s' cannot be read: give the tokenizer.json to export with the model",
                          tokenizer_flag);
    const bool file_mode = is_safetensors_path(out);
    if (!file_mode && max_shard == 0)
        max_shard = ZT_EXPORT_DEFAULT_SHARD;

    zt_err err = {{0}};
    char ckpt[PATH_MAX], src[PATH_MAX + 32], out_dir[PATH_MAX], config_out[PATH_MAX + 16];
    char tokenizer[PATH_MAX + 8];
    zt_ckpt_state st;
    zt_family_config model;
    int rc = zt_checkpoint_find(checkpoint, ckpt, sizeof(ckpt), &err);
    if (rc == 0)
        rc = zt_checkpoint_verify(ckpt, &st, &err);
    if (rc == 0) {
        snprintf(src, sizeof(src), "%s/model_config.json", ckpt);
        rc = zt_family_config_load(&model, src, &err);
    }
    if (rc == 0 && tokenizer_flag)
        snprintf(tokenizer, sizeof tokenizer, "%s", tokenizer_flag);
    else if (rc == 0)
        rc = run_tokenizer(ckpt, tokenizer, sizeof tokenizer, &err);
    if (rc == 0 && tokenizer[0] != '\0' && access(tokenizer, R_OK) != 0)
        rc = zt_fail(&err, -errno, "the run's tokenizer %s cannot be read (%s): give --tokenizer FILE, or "
                     "restore the file", tokenizer, strerror(errno));
    if (rc < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }

    snprintf(out_dir, sizeof(out_dir), "%s", out);
    char *dir = file_mode ? dirname(out_dir) : out_dir; /* dirname may point at a static "." */
    snprintf(config_out, sizeof(config_out), "%s/config.json", dir);
    if ((rc = zt_mkdir_p(dir, &err)) < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }
    if (same_dir(dir, ckpt)) {
        fprintf(stderr, "ztrain: error: --out %s is inside the checkpoint %s, whose config.json it would "
                "replace; write the export to another folder\n", out, ckpt);
        return 2;
    }
    char run_dir[PATH_MAX + 4];
    snprintf(run_dir, sizeof run_dir, "%s/..", ckpt);
    if (same_dir(dir, run_dir)) {
        fprintf(stderr, "ztrain: error: --out %s is the run directory of %s, whose config.json it would "
                "replace; write the export to another folder (e.g. %s/hf)\n", out, ckpt, out);
        return 2;
    }

    uint64_t bytes = 0;
    int nshards = 1, ntok_files = 0;
    snprintf(src, sizeof(src), "%s/model.safetensors", ckpt);
    if (file_mode && dtype == ZT_DTYPE_F32 && max_shard == 0) {
        size_t len = 0;
        rc = copy_file(src, out, &len, &err);
        bytes = len;
    } else {
        rc = export_weights(src, file_mode ? out : NULL, dir, dtype, max_shard, &bytes, &nshards, &err);
    }
    if (rc == 0 && !file_mode)
        rc = remove_stale_weights(dir, nshards, &err);
    if (rc == 0)
        rc = zt_family_config_save(&model, config_out, &err);
    if (rc == 0 && tokenizer[0] != '\0')
        rc = export_tokenizer(tokenizer, dir, &ntok_files, &err);
    if (rc < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }
    char size[32], tok_note[PATH_MAX + 64] = "";
    zt_format_size(bytes, size, sizeof(size));
    if (ntok_files > 0)
        snprintf(tok_note, sizeof tok_note, " and %d tokenizer file(s) from %s", ntok_files, tokenizer);
    if (nshards > 1)
        zt_log(ZT_LOG_INFO, "export: step %lld of %s -> %d shards in %s with model.safetensors.index.json (%s, %s), "
               "%s%s", (long long)st.step, ckpt, nshards, dir, size, zt_dtype_name(dtype), config_out, tok_note);
    else
        zt_log(ZT_LOG_INFO, "export: step %lld of %s -> %s%s (%s, %s) and %s%s", (long long)st.step, ckpt,
               file_mode ? out : dir, file_mode ? "" : "/model.safetensors", size, zt_dtype_name(dtype), config_out,
               tok_note);
    if (!file_mode && tokenizer[0] == '\0')
        zt_log(ZT_LOG_INFO, "export: the run named no tokenizer (its data was tokenized beforehand); add "
               "--tokenizer FILE to put its tokenizer.json into %s", dir);
    return 0;
}
