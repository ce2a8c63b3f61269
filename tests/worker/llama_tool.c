/* llama_tool: a small driver of the LLaMA model for the interop checks in tests/interop/.
 *
 *   llama_tool [--shard-bytes N] [--device cuda] CONFIG_JSON SEED TOKENS_FILE OUT_DIR [INIT_WEIGHTS]
 *
 * Reads a Hugging Face config.json, creates a model from SEED (or imports INIT_WEIGHTS: a safetensors file, a
 * model.safetensors.index.json or a model directory), runs a forward and a backward pass on the tokens,
 * prints the mean loss with 9 significant digits on stdout, and writes into OUT_DIR (created if missing):
 *   model.safetensors   the weights as zt_llama_export writes them (with --shard-bytes N: shards of at most N
 *                       bytes and model.safetensors.index.json instead, zt_llama_export_sharded);
 *   config.json         the family's config (zt_family_config_save) (so the folder loads with from_pretrained);
 *   outputs.safetensors "logits" [B,T,V] and, for every parameter, "grad.<Hugging Face name>": the gradient
 *                       of the mean loss (F32).
 *
 * With --device cuda (a CUDA build on a machine with a GPU) the forward and backward pass run on the GPU
 * through the training engine's CUDA executor (worker/models/decoder_cuda.c) in fp32 instead of the CPU model.
 *
 * TOKENS_FILE: little-endian int32 values: B, T, then B rows of T+1 tokens; inputs are the first T of a row,
 * targets the last T (the last token of a row may be -1: an ignored target). Exit status 0 on success, 1 on
 * a failure, 2 on bad usage. */
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/safetensors.h"
#include "worker/models/llama.h"
#ifdef ZT_WITH_CUDA
#include "worker/models/llama.h"
#endif
#include "model_once.h"
#include "tokens_file.h"

static int die(const char *msg)
{
    fprintf(stderr, "llama_tool: error: %s\n", msg);
    return 1;
}

/* Writes logits [B,T,V] and every parameter's gradient (with Hugging Face names) to path. */
static int write_outputs(zt_llama *m, const float *logits, int B, int T, const char *path, zt_err *err)
{
    const zt_llama_config *cfg = zt_llama_get_config(m);
    zt_st_writer *w = zt_st_writer_create();
    char (*names)[112] = calloc((size_t)zt_llama_num_tensors(m), sizeof *names);
    const int64_t shape[3] = {B, T, cfg->vocab_size};
    int rc = zt_st_writer_add(w, "logits", ZT_DTYPE_F32, 3, shape, logits, err);
    for (int i = 0; i < zt_llama_num_tensors(m) && rc == 0; i++) {
        const zt_param_info *t = zt_llama_tensor(m, i);
        snprintf(names[i], sizeof names[i], "grad.%s%s", strcmp(t->name, "lm_head.weight") == 0 ? "" : "model.",
                 t->name);
        rc = zt_st_writer_add(w, names[i], ZT_DTYPE_F32, t->ndim, t->shape, zt_llama_grads(m) + t->offset, err);
    }
    if (rc == 0)
        rc = zt_st_writer_write(w, path, err);
    zt_st_writer_destroy(w);
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    size_t shard_bytes = 0;
    bool on_gpu = false;
    int a = 1;
    for (;;) {
        if (argc > a + 1 && strcmp(argv[a], "--shard-bytes") == 0) {
            char *end = NULL;
            shard_bytes = strtoull(argv[a + 1], &end, 10);
            if (*end || shard_bytes == 0) {
                fprintf(stderr, "llama_tool: error: --shard-bytes takes a positive whole number, got '%s'\n",
                        argv[a + 1]);
                return 2;
            }
            a += 2;
        } else if (argc > a + 1 && strcmp(argv[a], "--device") == 0) {
            if (strcmp(argv[a + 1], "cuda") != 0 && strcmp(argv[a + 1], "cpu") != 0) {
                fprintf(stderr, "llama_tool: error: --device takes cpu or cuda, got '%s'\n", argv[a + 1]);
                return 2;
            }
            on_gpu = strcmp(argv[a + 1], "cuda") == 0;
            a += 2;
        } else {
            break;
        }
    }
#ifndef ZT_WITH_CUDA
    if (on_gpu) {
        fprintf(stderr, "llama_tool: error: --device cuda needs a build with CUDA (-DZT_CUDA=ON)\n");
        return 2;
    }
#endif
    if (argc - a != 4 && argc - a != 5) {
        fprintf(stderr, "usage: llama_tool [--shard-bytes N] [--device cpu|cuda] CONFIG_JSON SEED TOKENS_FILE OUT_DIR "
                "[INIT_WEIGHTS]\n");
        return 2;
    }
    const char *config = argv[a], *tokens = argv[a + 2], *out_dir = argv[a + 3];
    const char *init = argc - a == 5 ? argv[a + 4] : NULL;
    char *end = NULL;
    errno = 0;
    const unsigned long long seed = strtoull(argv[a + 1], &end, 10);
    if (errno || *end || end == argv[a + 1]) {
        fprintf(stderr, "llama_tool: error: SEED must be a whole number, got '%s'\n", argv[a + 1]);
        return 2;
    }
    zt_err err = {{0}};
    /* through the registry: LLaMA, Mistral and Qwen2 (its own family, on LLaMA's config) */
    zt_family_config fc;
    if (zt_family_config_load(&fc, config, &err) < 0)
        return die(err.msg);
    if (strcmp(zt_family_name(&fc), "llama") != 0 && strcmp(zt_family_name(&fc), "qwen2") != 0)
        return die("the config is not a LLaMA, Mistral or Qwen2 one");
    const zt_llama_config cfg = *ZT_LLAMA_CONFIG(&fc);

    int B = 0, T = 0;
    int32_t *inputs = NULL, *targets = NULL;
    char msg[512], path[4096 + 32];
    if (zt_test_read_tokens(tokens, cfg.vocab_size, &B, &T, &inputs, &targets, msg, sizeof msg) < 0)
        return die(msg);

    zt_llama *m = NULL;
    float *logits = NULL;
    int status = 1;
    if (zt_llama_create(&m, &cfg, B, T, seed, &err) < 0 || (init && zt_llama_import(m, init, &err) < 0) ||
        zt_mkdir_p(out_dir, &err) < 0) {
        die(err.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if ((shard_bytes ? zt_llama_export_sharded(m, out_dir, shard_bytes, &err) : zt_llama_export(m, path, &err)) < 0) {
        die(err.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (zt_family_config_save(&fc, path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    zt_llama_zero_grad(m);
    const size_t nlogits = (size_t)B * T * cfg.vocab_size;
    logits = malloc(nlogits * sizeof(float));
    if (!logits) {
        die("out of memory");
        goto out;
    }
    float loss = 0.0f;
    if (on_gpu) {
#ifdef ZT_WITH_CUDA
        zt_model *gm = NULL;
        if (zt_llama_cuda_create(&gm, m, B, T, 1, ZT_DTYPE_F32, NULL, &err) < 0) {
            die(err.msg);
            goto out;
        }
        loss = zt_test_model_once(gm, zt_llama_params(m), inputs, targets, B, T, logits, zt_llama_grads(m));
        gm->ops->destroy(gm);
        if (loss < 0.0f) {
            die("a CUDA call failed");
            goto out;
        }
#endif
    } else {
        loss = zt_llama_forward(m, inputs, targets, B, T);
        /* the logits, before the backward pass turns them into their gradient */
        memcpy(logits, zt_llama_logits(m), nlogits * sizeof(float));
        zt_llama_backward(m, 1.0f);
    }
    snprintf(path, sizeof path, "%s/outputs.safetensors", out_dir);
    if (write_outputs(m, logits, B, T, path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    printf("%.9g\n", (double)loss);
    status = 0;
out:
    zt_llama_destroy(m);
    free(logits);
    free(inputs);
    free(targets);
    return status;
}
