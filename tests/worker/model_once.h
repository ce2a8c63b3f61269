/* One training micro-batch through an executor of the engine's model interface (worker/models/model.h) on a
 * CUDA GPU, in fp32, without the engine: the interop tools (llama_tool --device cuda) and the GPU tests use it
 * to compare an executor's logits and gradients with the CPU model's and with transformers'; the CPU twin
 * drives a CPU executor the same way (family_tool). */
#ifndef ZT_TESTS_MODEL_ONCE_H
#define ZT_TESTS_MODEL_ONCE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
