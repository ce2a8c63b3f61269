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

#include "tokens_file.h"

static int die(const char *msg)
{
    fprintf(stderr, "gpt2_tool: error: %s\n", msg);
    return 1;
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
    if (zt_test_read_tokens(argv[3], cfg.vocab_size, &B, &T, &inputs, &targets, msg, sizeof msg) < 0)
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
