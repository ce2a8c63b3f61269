/* One training micro-batch through an executor of the engine's model interface (worker/models/model.h) on a
 * CUDA GPU, in fp32, without the engine: the interop tools (llama_tool --device cuda) and the GPU tests use it
 * to compare an executor's logits and gradients with the CPU model's and with transformers'; the CPU twin
 * drives a CPU executor the same way (family_tool). And one step of the training engine over a CPU executor as
 * one rank of several, with the forked ranks of a test (test_llama, test_neox). */
#ifndef ZT_TESTS_MODEL_ONCE_H
#define ZT_TESTS_MODEL_ONCE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/comm/comm.h"
#include "worker/engine/engine.h"
#include "worker/models/model.h"

/* The same micro-batch through a CPU executor (host buffers; its logits op is absent, so logits_of gives the
 * host model's logits after the head's forward, copied into logits [B,T,V]). Returns the mean loss, -1 when
 * out of memory. */
static inline float zt_test_model_once_cpu(zt_model *m, const float *params, const int32_t *tokens,
                                           const int32_t *targets, int B, int T, const float *(*logits_of)(const void *),
                                           const void *host, size_t nlogits, float *logits, float *grads)
{
    const int nb = m->nblocks;
    const size_t total = m->block_offset[nb - 1] + m->block_len[nb - 1];
    float *w = (float *)calloc(total, sizeof(float)), *g = (float *)calloc(total, sizeof(float));
    if (!w || !g) {
        free(w);
        free(g);
        return -1.0f;
    }
    for (int i = 0; i < m->ntensors; i++)
        memcpy(w + m->tensors[i].offset, params + m->tensors[i].host_offset, m->tensors[i].numel * sizeof(float));
    m->ops->begin(m, tokens, targets, B, T, 0, NULL);
    for (int b = 0; b < nb; b++) {
        m->ops->forward(m, b, w + m->block_offset[b]);
        if (m->checkpointed[b])
            m->ops->discard(m, b);
    }
    m->ops->head(m, w + m->block_offset[m->head_block], 0.0f);
    memcpy(logits, logits_of(host), nlogits * sizeof(float)); /* before the head's backward overwrites them */
    m->ops->head(m, w + m->block_offset[m->head_block], 1.0f);
    m->ops->head_backward(m, w + m->block_offset[m->head_block], g + m->block_offset[m->head_block]);
    for (int b = nb - 1; b >= 0; b--) {
        if (m->checkpointed[b])
            m->ops->forward(m, b, w + m->block_offset[b]);
        m->ops->backward(m, b, w + m->block_offset[b], g + m->block_offset[b]);
    }
    for (int i = 0; i < m->ntensors; i++)
        memcpy(grads + m->tensors[i].host_offset, g + m->tensors[i].offset, m->tensors[i].numel * sizeof(float));
    const float loss = m->ops->loss(m, 0);
    free(w);
    free(g);
    return loss;
}

/* One micro-batch's passes in the engine's order over a CPU executor e with the weights params (e's layout):
 * begin with tokens and targets [B,T] and docs (or NULL), every block's forward (a checkpointed block discarded
 * after it and rebuilt before its backward), the head with loss scale 1 and its backward, every block's
 * backward, accumulating into grads (the caller zeroes them). Returns the mean loss. */
static inline float zt_test_cpu_passes(zt_model *e, float *params, float *grads, const int32_t *tok,
                                       const int32_t *tgt, int B, int T, const zt_model_docs *docs)
{
    const int nb = e->nblocks, h = e->head_block;
    e->ops->begin(e, tok, tgt, B, T, 0, docs);
    for (int b = 0; b < nb; b++) {
        e->ops->forward(e, b, params + e->block_offset[b]);
        if (e->checkpointed[b])
            e->ops->discard(e, b);
    }
    e->ops->head(e, params + e->block_offset[h], 1.0f);
    e->ops->head_backward(e, params + e->block_offset[h], grads + e->block_offset[h]);
    for (int b = nb - 1; b >= 0; b--) {
        if (e->checkpointed[b])
            e->ops->forward(e, b, params + e->block_offset[b]);
        e->ops->backward(e, b, params + e->block_offset[b], grads + e->block_offset[b]);
    }
    return e->ops->loss(e, 0);
}

/* The engine tests' token rows: n tokens and targets below V, different for each salt (micro-batch). */
static inline void zt_test_fill_batch(int32_t *tokens, int32_t *targets, int n, int V, int salt)
{
    for (int i = 0; i < n; i++) {
        tokens[i] = (i * 7 + 3 + salt) % V;
        targets[i] = (i * 5 + 1 + 3 * salt) % V;
    }
}

/* One step of the training engine at ZeRO level `level` over model (a CPU executor of accum micro-batches of
 * b rows of T tokens, with the host weights params) as rank `rank` of W on the shared-memory backend named
 * name: micro-batch a is this rank's b rows of the W*b rows zt_test_fill_batch writes (vocabulary V, salt a),
 * scaled 1/(accum W). Puts the step's loss in *loss and the gathered gradient in grads (the host layout).
 * Returns 0, or -1 with a message in msg. */
static inline int zt_test_engine_step(zt_model *model, const float *params, int W, int rank, int level, int accum,
                                      int b, int T, int V, const char *name, float *loss, float *grads, char *msg,
                                      size_t cap)
{
    zt_err err = {{0}};
    zt_comm_options co;
    zt_comm_options_init(&co);
    co.rank = rank;
    co.world_size = W;
    co.join_timeout_s = 30;
    co.timeout_s = 60;
    snprintf(co.name, sizeof co.name, "%s", name);
    zt_comm *comm = NULL;
    if (zt_comm_create(&comm, &co, &err) < 0)
        return snprintf(msg, cap, "comm: %s", err.msg), -1;
    zt_engine *e = NULL;
    const size_t rows = (size_t)W * b * T;
    int32_t *tok = (int32_t *)malloc(rows * sizeof(int32_t)), *tgt = (int32_t *)malloc(rows * sizeof(int32_t));
    int rc = -1;
    if (!tok || !tgt) {
        snprintf(msg, cap, "out of memory");
        goto out;
    }
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    eo.zero_level = level;
    eo.grad_accum = accum;
    if (zt_engine_create(&e, model, comm, &eo, params, &err) < 0) {
        snprintf(msg, cap, "engine: %s", err.msg);
        goto out;
    }
    for (int a = 0; a < accum; a++) {
        zt_test_fill_batch(tok, tgt, (int)rows, V, a);
        if (zt_engine_micro(e, tok + (size_t)rank * b * T, tgt + (size_t)rank * b * T, b, T, NULL, a,
                            1.0f / (accum * W), 1.0f, &err) < 0) {
            snprintf(msg, cap, "micro-batch %d: %s", a, err.msg);
            goto out;
        }
    }
    zt_engine_step_result sr;
    if (zt_engine_step(e, 0.0f, 1, &sr, &err) < 0 || zt_engine_export_grads(e, grads, &err) < 0) {
        snprintf(msg, cap, "step: %s", err.msg);
        goto out;
    }
    *loss = sr.loss;
    rc = 0;
out:
    zt_engine_destroy(e);
    zt_comm_destroy(comm);
    free(tok);
    free(tgt);
    return rc;
}

/* Runs rank(r, ctx) for r = 0 .. W-1, each in a forked process that exits 0 when it returned 0. Returns -1
 * when every rank succeeded, else the first rank that failed, its wait status in *status. */
static inline int zt_test_run_ranks(int W, int (*rank)(int r, void *ctx), void *ctx, int *status)
{
    pid_t pids[16];
    if (W < 1 || W > 16)
        return 0;
    fflush(NULL);
    int failed = -1, started = 0;
    for (; started < W; started++) {
        pids[started] = fork();
        if (pids[started] < 0) {
            failed = started;
            *status = -1;
            break;
        }
        if (pids[started] == 0)
            _exit(rank(started, ctx) == 0 ? 0 : 1);
    }
    for (int r = 0; r < started; r++) {
        int st = 0;
        if ((waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) &&
            (failed < 0 || r < failed)) {
            failed = r;
            *status = st;
        }
    }
    return failed;
}

#ifdef ZT_WITH_CUDA
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "worker/models/model.h"

/* Runs tokens and targets [B,T] through m (an F32 CUDA executor) with the weights of the host slab params:
 * forward, the head with scale 0 (logits [B,T,V] into logits), the head again with scale 1 and the backward,
 * in the engine's order (checkpointed blocks discarded after their forward and rebuilt before their backward).
 * Writes the gradient of the mean loss into grads (the host layout, host_numel floats) and returns the mean
 * loss; -1 when a CUDA call fails. docs: the rows' packed documents (model.h), or NULL. */
static inline float zt_test_model_once_docs(zt_model *m, const float *params, const int32_t *tokens,
                                            const int32_t *targets, int B, int T, const zt_model_docs *docs,
                                            float *logits, float *grads)
{
    const int nb = m->nblocks;
    const size_t total = m->block_offset[nb - 1] + m->block_len[nb - 1];
    float *hw = (float *)calloc(total, sizeof(float)), *hg = (float *)calloc(total, sizeof(float));
    float *dw = NULL, *dg = NULL;
    float loss = -1.0f;
    if (!hw || !hg || cudaMalloc((void **)&dw, total * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&dg, total * sizeof(float)) != cudaSuccess)
        goto out;
    for (int i = 0; i < m->ntensors; i++)
        memcpy(hw + m->tensors[i].offset, params + m->tensors[i].host_offset, m->tensors[i].numel * sizeof(float));
    if (cudaMemcpy(dw, hw, total * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemset(dg, 0, total * sizeof(float)) != cudaSuccess)
        goto out;
    m->ops->begin(m, tokens, targets, B, T, 0, docs);
    for (int b = 0; b < nb; b++) {
        m->ops->forward(m, b, dw + m->block_offset[b]);
        if (m->checkpointed[b])
            m->ops->discard(m, b);
    }
    m->ops->head(m, dw + m->block_offset[m->head_block], 0.0f);
    m->ops->logits(m, logits);
    m->ops->head(m, dw + m->block_offset[m->head_block], 1.0f);
    m->ops->head_backward(m, dw + m->block_offset[m->head_block], dg + m->block_offset[m->head_block]);
    for (int b = nb - 1; b >= 0; b--) {
        if (m->checkpointed[b])
            m->ops->forward(m, b, dw + m->block_offset[b]);
        m->ops->backward(m, b, dw + m->block_offset[b], dg + m->block_offset[b]);
    }
    if (cudaStreamSynchronize((cudaStream_t)m->stream) != cudaSuccess ||
        cudaMemcpy(hg, dg, total * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        goto out;
    for (int i = 0; i < m->ntensors; i++)
        memcpy(grads + m->tensors[i].host_offset, hg + m->tensors[i].offset, m->tensors[i].numel * sizeof(float));
    loss = m->ops->loss(m, 0);
out:
    cudaFree(dw);
    cudaFree(dg);
    free(hw);
    free(hg);
    return loss;
}

/* zt_test_model_once_docs without packed documents (one a row). */
static inline float zt_test_model_once(zt_model *m, const float *params, const int32_t *tokens,
                                       const int32_t *targets, int B, int T, float *logits, float *grads)
{
    return zt_test_model_once_docs(m, params, tokens, targets, B, T, NULL, logits, grads);
}
#endif

#endif
