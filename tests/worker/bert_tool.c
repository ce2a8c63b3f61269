/* bert_tool: a small driver of the BERT / RoBERTa model for the interop checks in tests/interop/.
 *
 *   bert_tool [--device cuda] CONFIG_JSON SEED BATCH_FILE OUT_DIR [INIT]
 *
 * Reads a Hugging Face config.json, creates a model from SEED (or imports INIT: a safetensors file, an
 * index or a model directory), exports OUT_DIR/model.safetensors and OUT_DIR/config.json (a folder that
 * transformers' from_pretrained loads), runs a forward pass on the batch, and writes:
 *   OUT_DIR/logits.bin         float32 logits, [B,T,V] (masked LM) or [B,num_labels] (classification);
 *   OUT_DIR/grads.safetensors  when the batch counts a target: d(mean loss)/d(parameter) for every
 *                              parameter, under its Hugging Face name (F32);
 * and prints "loss correct counted" on stdout (the loss with 9 significant digits).
 *
 * With --device cuda (a CUDA build on a machine with a GPU) the forward and backward pass run on the GPU
 * through the training engine's CUDA executor (worker/models/encoder_cuda.c) in fp32 instead of the CPU model.
 *
 * BATCH_FILE: little-endian int32 values: B, T, then tokens [B,T], token types [B,T] and targets [B,T]
 * (masked LM: -1 or the token to predict at each position; classification: the label at the first
 * position of each sequence, -1 elsewhere). Exit status 0 on success, 1 on a failure, 2 on bad usage. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"
#include "worker/models/bert.h" /* the host model and its CUDA executor */
#include "model_once.h"

static int die(const char *msg)
{
    fprintf(stderr, "bert_tool: error: %s\n", msg);
    return 1;
}

/* Reads the batch file: *B, *T and three malloc'd [B,T] arrays. */
static int read_batch(const char *path, int *B, int *T, int32_t **tokens, int32_t **types, int32_t **targets,
                      char *msg, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, cap, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int32_t hdr[2];
    int rc = -1;
    if (fread(hdr, sizeof hdr[0], 2, f) != 2 || hdr[0] < 1 || hdr[1] < 1 || hdr[0] > 4096 || hdr[1] > 65536) {
        snprintf(msg, cap, "%s: expected int32 B >= 1 and T >= 1 first", path);
        goto out;
    }
    *B = hdr[0];
    *T = hdr[1];
    const size_t n = (size_t)*B * (size_t)*T;
    int32_t **arrays[3] = {tokens, types, targets};
    for (int k = 0; k < 3; k++) {
        *arrays[k] = malloc(n * sizeof(int32_t));
        if (!*arrays[k] || fread(*arrays[k], sizeof(int32_t), n, f) != n) {
            snprintf(msg, cap, "%s: file ends before its %zu x 3 values", path, n);
            goto out;
        }
    }
    rc = 0;
out:
    fclose(f);
    return rc;
}

/* Checks the batch against the config (the model aborts on ids out of range: a caller's bug). */
static int check_batch(const zt_bert_config *c, int B, int T, const int32_t *tokens, const int32_t *types,
                       const int32_t *targets, char *msg, size_t cap)
{
    const int K = zt_bert_config_outputs(c);
    for (int i = 0; i < B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size || types[i] < 0 || types[i] >= c->type_vocab_size ||
            targets[i] < -1 || targets[i] >= K ||
            (c->head == ZT_BERT_HEAD_CLASSIFY && i % T != 0 && targets[i] != -1)) {
            snprintf(msg, cap, "batch value %d out of range (token %d, type %d, target %d)", i, tokens[i], types[i],
                     targets[i]);
            return -1;
        }
    }
    return 0;
}

/* The GPU's run of the batch (CUDA builds): logits [rows, outputs] into logits, the gradients into m's
 * gradient slab, the loss into *loss and the accuracy of the counted rows (targets not -1 at a token that
 * is not padding, as bert.h counts them). Returns 0, or 1 after printing the error. */
static int run_on_gpu(zt_bert *m, const int32_t *tokens, const int32_t *types, const int32_t *targets, int B, int T,
                      float *logits, float *loss, int *correct, int *counted)
{
#ifdef ZT_WITH_CUDA
    const zt_bert_config *cfg = zt_bert_get_config(m);
    zt_err err = {{0}};
    zt_model *gm = NULL;
    if (zt_bert_cuda_create(&gm, m, B, T, 1, ZT_DTYPE_F32, NULL, &err) < 0)
        return die(err.msg);
    gm->ops->set_token_types(gm, types);
    memset(zt_bert_grads(m), 0, zt_bert_num_params(m) * sizeof(float));
    *loss = zt_test_model_once(gm, zt_bert_params(m), tokens, targets, B, T, logits, zt_bert_grads(m));
    gm->ops->destroy(gm);
    if (*loss < 0.0f)
        return die("a CUDA call failed");
    const bool mlm = cfg->head == ZT_BERT_HEAD_MLM;
    const int K = zt_bert_config_outputs(cfg), rows = mlm ? B * T : B;
    *correct = *counted = 0;
    for (int r = 0; r < rows; r++) {
        const int at = mlm ? r : r * T;
        if (targets[at] == -1 || tokens[at] == cfg->pad_token_id)
            continue;
        const float *x = logits + (size_t)r * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (x[k] > x[best])
                best = k;
        (*counted)++;
        *correct += best == targets[at];
    }
    return 0;
#else
    (void)m, (void)tokens, (void)types, (void)targets, (void)B, (void)T, (void)logits, (void)loss, (void)correct,
        (void)counted;
    return die("--device cuda needs a build with CUDA (-DZT_CUDA=ON)");
#endif
}

int main(int argc, char **argv)
{
    bool on_gpu = false;
    if (argc > 2 && strcmp(argv[1], "--device") == 0) {
        if (strcmp(argv[2], "cuda") != 0 && strcmp(argv[2], "cpu") != 0) {
            fprintf(stderr, "bert_tool: error: --device takes cpu or cuda, got '%s'\n", argv[2]);
            return 2;
        }
        on_gpu = strcmp(argv[2], "cuda") == 0;
        argc -= 2;
        argv += 2;
    }
#ifndef ZT_WITH_CUDA
    if (on_gpu) {
        fprintf(stderr, "bert_tool: error: --device cuda needs a build with CUDA (-DZT_CUDA=ON)\n");
        return 2;
    }
#endif
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: bert_tool [--device cpu|cuda] CONFIG_JSON SEED BATCH_FILE OUT_DIR [INIT]\n");
        return 2;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long seed = strtoull(argv[2], &end, 10);
    if (errno || *end || end == argv[2]) {
        fprintf(stderr, "bert_tool: error: SEED must be a whole number, got '%s'\n", argv[2]);
        return 2;
    }
    zt_err err = {{0}};
    zt_bert_config cfg;
    if (zt_bert_config_load(&cfg, argv[1], &err) < 0)
        return die(err.msg);
    int B = 0, T = 0;
    int32_t *tokens = NULL, *types = NULL, *targets = NULL;
    char msg[4096 + 128];
    if (read_batch(argv[3], &B, &T, &tokens, &types, &targets, msg, sizeof msg) < 0 ||
        check_batch(&cfg, B, T, tokens, types, targets, msg, sizeof msg) < 0)
        return die(msg);

    zt_bert *m = NULL;
    zt_st_writer *w = NULL;
    float *logits = NULL;
    int status = 1;
    char path[4096];
    if (zt_bert_create(&m, &cfg, B, T, seed, &err) < 0 || (argc == 6 && zt_bert_import(m, argv[5], &err) < 0)) {
        die(err.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", argv[4]);
    if (zt_bert_export(m, path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    snprintf(path, sizeof path, "%s/config.json", argv[4]);
    if (zt_bert_config_save(&cfg, path, &err) < 0) {
        die(err.msg);
        goto out;
    }
    const size_t rows = cfg.head == ZT_BERT_HEAD_MLM ? (size_t)B * T : (size_t)B;
    const size_t nlogits = rows * (size_t)zt_bert_config_outputs(&cfg);
    logits = malloc(nlogits * sizeof(float));
    if (!logits) {
        die("out of memory");
        goto out;
    }
    float loss = 0.0f;
    int correct = 0, counted = 0;
    if (on_gpu) {
        if (run_on_gpu(m, tokens, types, targets, B, T, logits, &loss, &correct, &counted) != 0)
            goto out;
    } else {
        zt_bert_set_token_types(m, types);
        loss = zt_bert_forward(m, tokens, targets, B, T);
        zt_bert_accuracy(m, &correct, &counted);
        memcpy(logits, zt_bert_logits(m), nlogits * sizeof(float));
        if (counted > 0) {
            zt_bert_zero_grad(m);
            zt_bert_backward(m, 1.0f);
        }
    }
    snprintf(path, sizeof path, "%s/logits.bin", argv[4]);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(logits, sizeof(float), nlogits, f) != nlogits || fclose(f) != 0) {
        snprintf(msg, sizeof msg, "cannot write %s", path);
        die(msg);
        goto out;
    }
    if (counted > 0) {
        w = zt_st_writer_create();
        const float *g = zt_bert_grads(m);
        int rc = 0;
        for (int i = 0; i < zt_bert_num_tensors(m) && rc == 0; i++) {
            const zt_param_info *t = zt_bert_tensor(m, i);
            rc = zt_st_writer_add(w, t->name, ZT_DTYPE_F32, t->ndim, t->shape, g + t->offset, &err);
        }
        snprintf(path, sizeof path, "%s/grads.safetensors", argv[4]);
        if (rc < 0 || zt_st_writer_write(w, path, &err) < 0) {
            die(err.msg);
            goto out;
        }
    }
    printf("%.9g %d %d\n", (double)loss, correct, counted);
    status = 0;
out:
    zt_st_writer_destroy(w);
    free(logits);
    zt_bert_destroy(m);
    free(tokens);
    free(types);
    free(targets);
    return status;
}
