/* family_tool: a small driver of any family's host model for the interop checks in tests/interop/
 * (neox_hf.py, neox_numpy_ref.py), through the family API (worker/models/family.h) only.
 *
 *   family_tool [--device cuda] CONFIG_JSON SEED TOKENS_FILE OUT_DIR [INIT_WEIGHTS]
 *
 * Reads a Hugging Face config.json (any model_type ztrain trains), creates the model from SEED (or imports
 * INIT_WEIGHTS: a safetensors file, an index or a model folder), runs a forward and a backward pass on the
 * tokens, prints the mean loss with 9 significant digits, and writes into OUT_DIR:
 *   model.safetensors, config.json  the export (loads with from_pretrained);
 *   logits.safetensors              "logits" [B,T,V];
 *   grads.safetensors               the gradient of the mean loss of every parameter, under the parameter's
 *                                   Hugging Face name and in its layout (written by the model's export).
 * TOKENS_FILE: int32 B, T, then B rows of T+1 tokens (inputs the first T, targets the last T; a row's last
 * token may be -1). With --device cuda the passes run on the GPU through the family's CUDA executor in fp32.
 * Exit status 0 on success, 1 on a failure, 2 on bad usage. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/safetensors.h"
#include "worker/models/family.h"
#include "worker/models/model.h"
#include "model_once.h"
#include "tokens_file.h"

static int die(const char *msg)
{
    fprintf(stderr, "family_tool: error: %s\n", msg);
    return 1;
}

static const float *host_logits(const void *fm)
{
    return zt_family_model_logits(fm);
}

int main(int argc, char **argv)
{
    bool on_gpu = false;
    int a = 1;
    if (argc > 2 && strcmp(argv[1], "--device") == 0) {
        on_gpu = strcmp(argv[2], "cuda") == 0;
        a = 3;
    }
#ifndef ZT_WITH_CUDA
    if (on_gpu) {
        fprintf(stderr, "family_tool: error: --device cuda needs a build with CUDA (-DZT_CUDA=ON)\n");
        return 2;
    }
#endif
    if (argc - a != 4 && argc - a != 5) {
        fprintf(stderr, "usage: family_tool [--device cpu|cuda] CONFIG_JSON SEED TOKENS_FILE OUT_DIR [INIT_WEIGHTS]\n");
        return 2;
    }
    const char *config = argv[a], *tokens = argv[a + 2], *out_dir = argv[a + 3];
    const char *init = argc - a == 5 ? argv[a + 4] : NULL;
    const unsigned long long seed = strtoull(argv[a + 1], NULL, 10);
    zt_err err = {{0}};
    zt_family_config cfg;
    if (zt_family_config_load(&cfg, config, &err) < 0)
        return die(err.msg);
    int B = 0, T = 0;
    int32_t *inputs = NULL, *targets = NULL;
    char msg[512];
    if (zt_test_read_tokens(tokens, zt_family_config_vocab(&cfg), &B, &T, &inputs, &targets, msg, sizeof msg) < 0)
        return die(msg);
    zt_family_model *m = NULL;
    char path[4096 + 32];
    int status = 1;
    float *logits = NULL, *saved = NULL;
    if (zt_family_model_create(&m, &cfg, B, T, seed, &err) < 0 || (init && zt_family_model_import(m, init, &err) < 0) ||
        zt_mkdir_p(out_dir, &err) < 0) {
        die(err.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (zt_family_model_export(m, path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (zt_family_config_save(&cfg, path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    zt_family_model_zero_grad(m);
    const int V = zt_family_config_vocab(&cfg);
    const size_t nlogits = (size_t)B * T * V, np = zt_family_model_num_params(m);
    logits = malloc(nlogits * sizeof(float));
    saved = malloc(np * sizeof(float));
    if (!logits || !saved) {
        die("out of memory");
        goto out;
    }
    float loss = 0.0f;
    if (on_gpu) {
#ifdef ZT_WITH_CUDA
        zt_model *gm = NULL;
        if (zt_family_model_cuda(&gm, m, B, T, 1, ZT_DTYPE_F32, NULL, &err) < 0) {
            die(err.msg);
            goto out;
        }
        loss = zt_test_model_once(gm, zt_family_model_params(m), inputs, targets, B, T, logits,
                                  zt_family_model_grads(m));
        gm->ops->destroy(gm);
        if (loss < 0.0f) {
            die("a CUDA call failed");
            goto out;
        }
#endif
    } else {
        zt_model *cm = NULL;
        if (zt_family_model_cpu(&cm, m, 1, NULL, &err) < 0) {
            die(err.msg);
            goto out;
        }
        loss = zt_test_model_once_cpu(cm, zt_family_model_params(m), inputs, targets, B, T, host_logits, m, nlogits,
                                      logits, zt_family_model_grads(m));
        cm->ops->destroy(cm);
    }
    zt_st_writer *w = zt_st_writer_create();
    const int64_t shape[3] = {B, T, V};
    snprintf(path, sizeof path, "%s/logits.safetensors", out_dir);
    int rc = zt_st_writer_add(w, "logits", ZT_DTYPE_F32, 3, shape, logits, &err);
    if (rc == 0)
        rc = zt_st_writer_write(w, path, &err);
    zt_st_writer_destroy(w);
    /* the gradients in Hugging Face's names and layout: the export of a model whose weights they are */
    memcpy(saved, zt_family_model_params(m), np * sizeof(float));
    memcpy(zt_family_model_params(m), zt_family_model_grads(m), np * sizeof(float));
    snprintf(path, sizeof path, "%s/grads.safetensors", out_dir);
    if (rc == 0)
        rc = zt_family_model_export(m, path, &err);
    memcpy(zt_family_model_params(m), saved, np * sizeof(float));
    if (rc < 0) {
        die(err.msg);
        goto out;
    }
    printf("%.9g\n", (double)loss);
    status = 0;
out:
    zt_family_model_destroy(m);
    free(logits);
    free(saved);
    free(inputs);
    free(targets);
    return status;
}
