/* `ztrain inspect`: per-parameter statistics of a checkpoint, as BMTrain's inspector prints them: for every
 * tensor whose name matches a glob, the mean, standard deviation, minimum and maximum of its values, of
 * its Adam moments m and v (optim.safetensors), and of its gradients when the checkpoint holds a
 * gradient dump (grads.safetensors, same names). One table on stdout:
 *
 *   ztrain inspect --checkpoint runs/demo --params 'h.*.attn.*'
 *
 *   name                          kind    shape         mean          std           min           max
 *   h.0.attn.c_attn.weight        param   [30,10]       1.2345e-03    2.0012e-02   -6.1e-02       5.9e-02
 *   h.0.attn.c_attn.weight        adam_m  [30,10]       ...
 *
 * Names are ztrain's (the Hugging Face names without "transformer."); the shape of a param row is the
 * one in model.safetensors (Hugging Face layout), that of the Adam rows ztrain's layout. */
#include <fnmatch.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/safetensors.h"
#include "worker/cli/commands.h"
#include "worker/train/checkpoint.h"

#define HF_PREFIX "transformer."

static const char inspect_usage[] =
    "usage: ztrain inspect --checkpoint DIR [--params GLOB]\n"
    "\n"
    "Prints the mean, std, min and max of every parameter of a checkpoint whose name matches GLOB, and of\n"
    "its Adam moments m and v (and gradients, when the checkpoint has grads.safetensors).\n"
    "\n"
    "  --checkpoint DIR   a run directory (its latest checkpoint) or a ckpt_NNNNNN directory\n"
    "  --params GLOB      shell-style pattern over tensor names, e.g. 'h.*.attn.*' or '*ln_f*'\n"
    "                     (default '*': every tensor)\n";

typedef struct stats {
    double mean, std, min, max;
} stats;

/* Statistics of n fp32 values (read with memcpy: the mapping is not aligned in general). */
static stats summarise(const unsigned char *data, size_t n)
{
    stats s = {0, 0, INFINITY, -INFINITY};
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, data + i * sizeof f, sizeof f);
        sum += f;
        if (f < s.min)
            s.min = f;
        if (f > s.max)
            s.max = f;
    }
    s.mean = n ? sum / (double)n : NAN;
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, data + i * sizeof f, sizeof f);
        sq += ((double)f - s.mean) * ((double)f - s.mean);
    }
    s.std = n ? sqrt(sq / (double)n) : NAN;
    return s;
}

static void print_row(const char *name, const char *kind, const zt_st_tensor *t)
{
    char shape[64];
    int off = snprintf(shape, sizeof shape, "[");
    for (int d = 0; d < t->ndim && off < (int)sizeof shape - 24; d++)
        off += snprintf(shape + off, sizeof shape - (size_t)off, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    snprintf(shape + off, sizeof shape - (size_t)off, "]");
    if (t->dtype != ZT_DTYPE_F32) {
        printf("%-32s %-7s %-14s (%s values are not summarised)\n", name, kind, shape, zt_dtype_name(t->dtype));
        return;
    }
    stats s = summarise(t->data, t->nbytes / sizeof(float));
    printf("%-32s %-7s %-14s %13.6e %13.6e %13.6e %13.6e\n", name, kind, shape, s.mean, s.std, s.min, s.max);
}

/* Opens dir/file when it exists; *out stays NULL when it does not. Returns 0 or a negative code. */
static int open_optional(const char *dir, const char *file, zt_st_file **out, zt_err *err)
{
    char path[ZT_TRAIN_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fclose(f);
    return zt_st_open(path, out, err);
}

/* Runs `ztrain inspect ARGS`; returns the exit status. */
int zt_cmd_inspect(int argc, char **argv)
{
    static const struct option options[] = {{"help", no_argument, NULL, 'h'},
                                            {"checkpoint", required_argument, NULL, 'c'},
                                            {"params", required_argument, NULL, 'p'},
                                            {NULL, 0, NULL, 0}};
    const char *dir = NULL, *glob = "*";
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(inspect_usage, stdout);
            return 0;
        case 'c':
            dir = optarg;
            break;
        case 'p':
            glob = optarg;
            break;
        case ':':
            fprintf(stderr, "ztrain: error: %s needs a value; see ztrain inspect --help\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "ztrain: error: unknown flag '%s'; see ztrain inspect --help\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc || !dir) {
        fprintf(stderr, "ztrain: error: %s; see ztrain inspect --help\n",
                dir ? "inspect takes only flags" : "--checkpoint DIR is required");
        return 2;
    }

    zt_err err = {{0}};
    char ckpt[ZT_TRAIN_PATH_MAX + 64], path[ZT_TRAIN_PATH_MAX + 96];
    zt_ckpt_state st;
    zt_st_file *model = NULL, *optim = NULL, *grads = NULL;
    int rc = zt_checkpoint_find(dir, ckpt, sizeof ckpt, &err);
    if (rc == 0)
        rc = zt_checkpoint_verify(ckpt, &st, &err);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
        rc = zt_st_open(path, &model, &err);
    }
    if (rc == 0)
        rc = open_optional(ckpt, "optim.safetensors", &optim, &err);
    if (rc == 0)
        rc = open_optional(ckpt, "grads.safetensors", &grads, &err);
    if (rc < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        zt_st_close(model);
        zt_st_close(optim);
        zt_st_close(grads);
        return 1;
    }

    printf("checkpoint %s: step %lld, Adam step %lld%s\n", ckpt, (long long)st.step, (long long)st.adam_step,
           grads ? "" : " (no gradient dump: values and Adam moments only)");
    printf("%-32s %-7s %-14s %13s %13s %13s %13s\n", "name", "kind", "shape", "mean", "std", "min", "max");
    size_t shown = 0;
    for (size_t i = 0; i < zt_st_count(model); i++) {
        const zt_st_tensor *t = zt_st_get(model, i);
        /* model.safetensors has Hugging Face names ("transformer.h.0..."); the table and the optimizer
         * file use ztrain's ("h.0..."); the glob may be written either way */
        const char *short_name = t->name;
        if (strncmp(short_name, HF_PREFIX, strlen(HF_PREFIX)) == 0)
            short_name += strlen(HF_PREFIX);
        if (fnmatch(glob, short_name, 0) != 0 && fnmatch(glob, t->name, 0) != 0)
            continue;
        shown++;
        print_row(short_name, "param", t);
        char name[256];
        const zt_st_tensor *o;
        if (grads && ((o = zt_st_find(grads, short_name)) != NULL || (o = zt_st_find(grads, t->name)) != NULL))
            print_row(short_name, "grad", o);
        snprintf(name, sizeof name, "m.%s", short_name);
        if (optim && (o = zt_st_find(optim, name)) != NULL)
            print_row(short_name, "adam_m", o);
        snprintf(name, sizeof name, "v.%s", short_name);
        if (optim && (o = zt_st_find(optim, name)) != NULL)
            print_row(short_name, "adam_v", o);
    }
    zt_st_close(model);
    zt_st_close(optim);
    zt_st_close(grads);
    if (shown == 0) {
        fprintf(stderr, "ztrain: error: no tensor of %s matches '%s' (names look like 'h.0.attn.c_attn.weight', "
                "'wte.weight', 'ln_f.bias')\n", ckpt, glob);
        return 1;
    }
    return 0;
}
