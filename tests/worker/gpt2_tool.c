/* gpt2_tool: a small driver of the GPT-2 model for the interop checks in tests/interop/.
 *
 *   gpt2_tool CONFIG_JSON SEED TOKENS_FILE OUT_SAFETENSORS [INIT_SAFETENSORS]
 *
 * Reads a Hugging Face config.json, creates a model from SEED (or imports INIT_SAFETENSORS, for weights
 * that came out of a training run), exports it to OUT_SAFETENSORS and writes config.json beside it (so
 * the folder loads with transformers' from_pretrained), runs a forward pass on the tokens and prints the
 * mean loss with 9 significant digits on stdout.
 *
 * TOKENS_FILE: little-endian int32 values: B, T, then B rows of T+1 tokens; inputs are the first T of a
 * row, targets the last T (the last token of a row may be -1: an ignored target). Exit status 0 on
 * success, 1 on a failure, 2 on bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/models/gpt2.h"

static int die(const char *msg)
{
    fprintf(stderr, "gpt2_tool: error: %s\n", msg);
    return 1;
}

/* Reads the tokens file into *inputs and *targets ([B,T] each, malloc'd). */
static int read_tokens(const char *path, int vocab, int *B, int *T, int32_t **inputs, int32_t **targets,
                       char *msg, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, cap, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int32_t hdr[2];
    int rc = -1;
    int32_t *row = NULL;
    if (fread(hdr, sizeof hdr[0], 2, f) != 2 || hdr[0] < 1 || hdr[1] < 1 || hdr[0] > 4096 || hdr[1] > 65536) {
        snprintf(msg, cap, "%s: expected int32 B >= 1 and T >= 1 first", path);
        goto out;
    }
    *B = hdr[0];
    *T = hdr[1];
    size_t n = (size_t)*B * (size_t)*T;
    *inputs = malloc(n * sizeof(int32_t));
    *targets = malloc(n * sizeof(int32_t));
    row = malloc(((size_t)*T + 1) * sizeof(int32_t));
    if (!*inputs || !*targets || !row) {
        snprintf(msg, cap, "out of memory reading %s", path);
        goto out;
    }
    for (int b = 0; b < *B; b++) {
        if (fread(row, sizeof(int32_t), (size_t)*T + 1, f) != (size_t)*T + 1) {
            snprintf(msg, cap, "%s: file ends inside row %d (expected %d rows of %d tokens)", path, b, *B, *T + 1);
            goto out;
        }
        for (int t = 0; t <= *T; t++) {
            /* Only the last token of a row is a target and nothing else, so only it may be -1. */
            bool ok = (row[t] >= 0 && row[t] < vocab) || (t == *T && row[t] == -1);
            if (!ok) {
                snprintf(msg, cap, "%s: token %" PRId32 " at row %d, column %d is outside the vocabulary of %d", path,
                         row[t], b, t, vocab);
                goto out;
            }
        }
        memcpy(*inputs + (size_t)b * *T, row, (size_t)*T * sizeof(int32_t));
        memcpy(*targets + (size_t)b * *T, row + 1, (size_t)*T * sizeof(int32_t));
    }
    rc = 0;
out:
    free(row);
    fclose(f);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: gpt2_tool CONFIG_JSON SEED TOKENS_FILE OUT_SAFETENSORS [INIT_SAFETENSORS]\n");
        return 2;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long seed = strtoull(argv[2], &end, 10);
    if (errno || *end || end == argv[2]) {
        fprintf(stderr, "gpt2_tool: error: SEED must be a whole number, got '%s'\n", argv[2]);
        return 2;
    }
    zt_err err = {{0}};
    zt_gpt2_config cfg;
    zt_gpt2_config_default(&cfg);
    if (zt_gpt2_config_load(&cfg, argv[1], &err) < 0)
        return die(err.msg);

    int B = 0, T = 0;
    int32_t *inputs = NULL, *targets = NULL;
    char msg[512];
    if (read_tokens(argv[3], cfg.vocab_size, &B, &T, &inputs, &targets, msg, sizeof msg) < 0)
        return die(msg);

    zt_gpt2 *m = NULL;
    int status = 1;
    if (zt_gpt2_create(&m, &cfg, B, T, seed, &err) < 0) {
        die(err.msg);
        goto out;
    }
    if (argc == 6 && zt_gpt2_import(m, argv[5], &err) < 0) {
        die(err.msg);
        goto out;
    }
    if (zt_gpt2_export(m, argv[4], &err) < 0) {
        die(err.msg);
        goto out;
    }
    char *copy = strdup(argv[4]);
    char config_path[4096];
    snprintf(config_path, sizeof config_path, "%s/config.json", dirname(copy));
    free(copy);
    if (zt_gpt2_config_save(&cfg, config_path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    float loss = zt_gpt2_forward(m, inputs, targets, B, T);
    printf("%.9g\n", (double)loss);
    status = 0;
out:
    zt_gpt2_destroy(m);
    free(inputs);
    free(targets);
    return status;
}
