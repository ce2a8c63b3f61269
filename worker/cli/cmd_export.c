/* `ztrain export`: turns a training checkpoint into a Hugging Face model file: the checkpoint is verified,
 * then its model.safetensors (HF names, F32) is written to FILE -- or converted to BF16/F16, or split into
 * shards of at most a given size with Hugging Face's model.safetensors.index.json -- and its
 * model_config.json to config.json in FILE's folder. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/units.h"
#include "offload/cpu_adam.h" /* zt_cpu_adam_convert: fp32 to bf16/fp16, round to nearest even */
#include "worker/cli/commands.h"
#include "worker/train/checkpoint.h"

static const char export_usage[] =
    "usage: ztrain export --checkpoint DIR --out FILE.safetensors [--dtype D] [--max-shard-size SIZE]\n"
    "\n"
    "Writes the weights of a training checkpoint as a Hugging Face safetensors file (the model's Hugging Face\n"
    "names), and the model's config.json beside it, so that transformers can load the folder.\n"
    "\n"
    "  --checkpoint DIR        a run directory (its latest checkpoint) or a ckpt_NNNNNN directory\n"
    "  --out FILE              the safetensors file to write; config.json goes into the same folder\n"
    "  --dtype D               f32 (default, the checkpoint's values) | bf16 | f16 (rounded to nearest even)\n"
    "  --max-shard-size SIZE   split into files of at most SIZE (e.g. 5GB) named model-00001-of-0000N.safetensors\n"
    "                          in FILE's folder, with model.safetensors.index.json; one file when all fits\n";

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

/* One output file of a sharded export: tensors [first, last) of the source. */
typedef struct shard_range {
    size_t first, last;
} shard_range;

/* Writes tensors [first, last) of f converted to dtype into path. */
static int write_shard(const zt_st_file *f, size_t first, size_t last, enum zt_dtype dtype, const char *path,
                       zt_err *err)
{
    zt_st_writer *w = zt_st_writer_create();
    void **bufs = zt_xcalloc(last - first + 1, sizeof *bufs);
    int rc = zt_st_writer_add_metadata(w, "format", "pt", err);
    for (size_t i = first; rc == 0 && i < last; i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        const void *data = t->data;
        enum zt_dtype out = t->dtype;
        if (t->dtype == ZT_DTYPE_F32 && dtype != ZT_DTYPE_F32) {
            size_t n = 1;
            for (int d = 0; d < t->ndim; d++)
                n *= (size_t)t->shape[d];
            bufs[i - first] = zt_xmalloc(n * zt_dtype_size(dtype));
            if ((rc = zt_cpu_adam_convert(bufs[i - first], dtype, t->data, n, 0, err)) < 0)
                break;
            data = bufs[i - first];
            out = dtype;
        }
        rc = zt_st_writer_add(w, t->name, out, t->ndim, t->shape, data, err);
    }
    if (rc == 0)
        rc = zt_st_writer_write(w, path, err);
    for (size_t i = 0; i < last - first + 1; i++)
        free(bufs[i]);
    free(bufs);
    zt_st_writer_destroy(w);
    return rc;
}

/* Writes the tensors of src converted to dtype: into out when they fit max_shard bytes (0: no limit),
 * else into shards in dir with their index. *bytes and *nshards receive what was written. */
static int export_converted(const char *src, const char *out, const char *dir, enum zt_dtype dtype,
                            uint64_t max_shard, size_t *bytes, int *nshards, zt_err *err)
{
    zt_st_file *f = NULL;
    int rc = zt_st_open(src, &f, err);
    if (rc < 0)
        return rc;
    const size_t n = zt_st_count(f);
    shard_range *shards = zt_xcalloc(n + 1, sizeof *shards);
    int ns = 0;
    uint64_t in_shard = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        const uint64_t b = (uint64_t)t->nbytes / zt_dtype_size(t->dtype) *
                           zt_dtype_size(t->dtype == ZT_DTYPE_F32 ? dtype : t->dtype);
        if (ns == 0 || (max_shard > 0 && in_shard > 0 && in_shard + b > max_shard)) {
            shards[ns].first = i;
            ns++;
            in_shard = 0;
        }
        shards[ns - 1].last = i + 1;
        in_shard += b;
        total += b;
    }
    char path[PATH_MAX + 64];
    cJSON *index = NULL, *map = NULL;
    if (ns > 1) {
        index = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        map = cJSON_AddObjectToObject(index, "weight_map");
    }
    for (int s = 0; rc == 0 && s < ns; s++) {
        if (ns == 1) {
            snprintf(path, sizeof path, "%s", out);
        } else {
            snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, ns);
            char name[64];
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, ns);
            for (size_t i = shards[s].first; i < shards[s].last; i++)
                cJSON_AddStringToObject(map, zt_st_get(f, i)->name, name);
        }
        rc = write_shard(f, shards[s].first, shards[s].last, dtype, path, err);
    }
    if (rc == 0 && index) {
        char *text = cJSON_Print(index);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        rc = zt_write_file_atomic(path, text, strlen(text), err);
        free(text);
    }
    cJSON_Delete(index);
    free(shards);
    zt_st_close(f);
    *bytes = (size_t)total;
    *nshards = ns;
    return rc;
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
        {NULL, 0, NULL, 0},
    };
    const char *checkpoint = NULL, *out = NULL;
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
    if (!out)
        return fail_usage("%s is required", "--out FILE.safetensors");

    zt_err err = {{0}};
    char ckpt[PATH_MAX], src[PATH_MAX + 32], out_dir[PATH_MAX], config_out[PATH_MAX + 16];
    zt_ckpt_state st;
    int rc = zt_checkpoint_find(checkpoint, ckpt, sizeof(ckpt), &err);
    if (rc == 0)
        rc = zt_checkpoint_verify(ckpt, &st, &err);
    if (rc < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }

    snprintf(out_dir, sizeof(out_dir), "%s", out);
    char *dir = dirname(out_dir); /* may point into out_dir or at a static "." */
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

    size_t bytes = 0;
    int nshards = 1;
    snprintf(src, sizeof(src), "%s/model.safetensors", ckpt);
    if (dtype == ZT_DTYPE_F32 && max_shard == 0)
        rc = copy_file(src, out, &bytes, &err);
    else
        rc = export_converted(src, out, dir, dtype, max_shard, &bytes, &nshards, &err);
    if (rc == 0) {
        snprintf(src, sizeof(src), "%s/model_config.json", ckpt);
        rc = copy_file(src, config_out, NULL, &err);
    }
    if (rc < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }
    char size[32];
    zt_format_size(bytes, size, sizeof(size));
    if (nshards > 1)
        zt_log(ZT_LOG_INFO, "export: step %lld of %s -> %d shards in %s with model.safetensors.index.json (%s, %s) "
               "and %s", (long long)st.step, ckpt, nshards, dir, size, zt_dtype_name(dtype), config_out);
    else
        zt_log(ZT_LOG_INFO, "export: step %lld of %s -> %s (%s, %s) and %s", (long long)st.step, ckpt, out, size,
               zt_dtype_name(dtype), config_out);
    return 0;
}
