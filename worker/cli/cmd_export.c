/* `ztrain export`: turns a training checkpoint into a Hugging Face model file: the checkpoint is verified,
 * then its model.safetensors (HF names, F32) is written to FILE and its model_config.json to config.json
 * in FILE's folder. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/units.h"
#include "worker/cli/commands.h"
#include "worker/train/checkpoint.h"

static const char export_usage[] =
    "usage: ztrain export --checkpoint DIR --out FILE.safetensors\n"
    "\n"
    "Writes the weights of a training checkpoint as a Hugging Face safetensors file (GPT2LMHeadModel names,\n"
    "F32), and the model's config.json beside it, so that transformers can load the folder.\n"
    "\n"
    "  --checkpoint DIR   a run directory (its latest checkpoint) or a ckpt_NNNNNN directory\n"
    "  --out FILE         the safetensors file to write; config.json goes into the same folder\n";

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

/* Runs `ztrain export ARGS`; returns the exit status (0, 1 or 2). */
int zt_cmd_export(int argc, char **argv)
{
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"checkpoint", required_argument, NULL, 'c'},
        {"out", required_argument, NULL, 'o'},
        {NULL, 0, NULL, 0},
    };
    const char *checkpoint = NULL, *out = NULL;
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
    snprintf(src, sizeof(src), "%s/model.safetensors", ckpt);
    rc = copy_file(src, out, &bytes, &err);
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
    zt_log(ZT_LOG_INFO, "export: step %lld of %s -> %s (%s) and %s", (long long)st.step, ckpt, out, size,
           config_out);
    return 0;
}
