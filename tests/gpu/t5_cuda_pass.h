/* One T5 micro-batch through a CUDA executor, as the engine drives it, for tests/gpu/test_t5_cuda.c and
 * tests/worker/t5_tool.c (--device cuda): the weights copied from the host slab into device blocks, every
 * block's forward (checkpointed blocks dropped after it and rebuilt before their backward), the logits, the
 * head with its loss, the backward of every block; the logits [B,Td,V] and the gradient in the host slab's
 * layout come back. Returns 0, or -1 after printing the failing CUDA call. */
#ifndef ZT_TESTS_GPU_T5_CUDA_PASS_H
#define ZT_TESTS_GPU_T5_CUDA_PASS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "worker/models/model.h"

#define ZT__T5_PASS_CHECK(call)                                                                                \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));             \
            goto fail;                                                                                         \
        }                                                                                                      \
    } while (0)

/* targets: rows of T (the decoder's Td first, -1 ignored), as begin takes them; grads may be NULL. */
static inline int zt_t5_cuda_pass(zt_model *m, const float *params, const zt_model_seq2seq *s, const int32_t *enc,
                                  const int32_t *targets, int B, int T, float *logits, float *grads, float *loss)
{
    const int nb = m->nblocks;
    const size_t total = m->block_offset[nb - 1] + m->block_len[nb - 1];
    float *hw = calloc(total, sizeof(float)), *hg = calloc(total, sizeof(float)), *dw = NULL, *dg = NULL;
    int rc = -1;
    if (!hw || !hg)
        goto fail;
    ZT__T5_PASS_CHECK(cudaMalloc((void **)&dw, total * sizeof(float)));
    ZT__T5_PASS_CHECK(cudaMalloc((void **)&dg, total * sizeof(float)));
    for (int i = 0; i < m->ntensors; i++)
        memcpy(hw + m->tensors[i].offset, params + m->tensors[i].host_offset, m->tensors[i].numel * sizeof(float));
    ZT__T5_PASS_CHECK(cudaMemcpy(dw, hw, total * sizeof(float), cudaMemcpyHostToDevice));
    ZT__T5_PASS_CHECK(cudaMemset(dg, 0, total * sizeof(float)));
    m->ops->set_seq2seq(m, s);
    m->ops->begin(m, enc, targets, B, T, 0, NULL);
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
    ZT__T5_PASS_CHECK(cudaStreamSynchronize((cudaStream_t)m->stream));
    ZT__T5_PASS_CHECK(cudaMemcpy(hg, dg, total * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; grads && i < m->ntensors; i++)
        memcpy(grads + m->tensors[i].host_offset, hg + m->tensors[i].offset, m->tensors[i].numel * sizeof(float));
    *loss = m->ops->loss(m, 0);
    rc = 0;
fail:
    cudaFree(dw);
    cudaFree(dg);
    free(hw);
    free(hg);
    return rc;
}

#undef ZT__T5_PASS_CHECK
#endif
