/* What the CUDA executors share; see cuda_exec.h. */
#include "worker/models/cuda_exec.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/units.h"
#include "kernels/crossentropy.h"     /* the fused classifier */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, pinned host memory, the inf/NaN check */
#include "worker/models/cpu_exec.h"   /* the mean loss */

size_t zt__round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

void *zt__pool_take(char *base, size_t *used, size_t bytes)
{
    void *p = base ? base + *used : NULL;
    *used += zt__round_up(bytes, ZT__CUDA_POOL_ALIGN);
    return p;
}

/* ---- layout ---- */

void zt__cuda_layout_init(zt__cuda_layout *lay, const zt_param_info *tensors, int ntensors, int nblocks)
{
    memset(lay, 0, sizeof *lay);
    lay->ntensors = ntensors;
    lay->nblocks = nblocks;
    const size_t nt = (size_t)ntensors, nb = (size_t)nblocks;
    lay->toff = zt_xcalloc(nt, sizeof(size_t));
    lay->tlen = zt_xcalloc(nt, sizeof(size_t));
    lay->packed = zt_xcalloc(nt, sizeof(bool));
    lay->boff = zt_xcalloc(nb, sizeof(size_t));
    lay->blen = zt_xcalloc(nb, sizeof(size_t));
    lay->tensors = zt_xcalloc(nt, sizeof(zt_model_tensor));
    lay->block_ckpt = zt_xcalloc(nb, sizeof(bool));
    lay->reads_weights = zt_xcalloc(nb, sizeof(bool));
    lay->state = zt_xcalloc(nb, 1);
    lay->top_ckpt = -1;
    for (int i = 0; i < ntensors; i++)
        lay->tlen[i] = tensors[i].numel;
}

void zt__cuda_layout_finish(zt__cuda_layout *lay, const zt_param_info *tensors, int nlayers, const bool *ckpt_layers,
                            bool embedding_reads_weights)
{
    size_t off = 0;
    for (int i = 0; i < lay->ntensors; i++) {
        const zt_param_info *t = &tensors[i];
        ZT_ASSERT(lay->tlen[i] >= t->numel);
        ZT_ASSERT(!lay->packed[i] || (i > 0 && tensors[i - 1].block == t->block));
        if (!lay->packed[i])
            off = zt__round_up(off, ZT__CUDA_ALIGN_ELEMS);
        lay->toff[i] = off;
        off += lay->tlen[i];
        lay->tensors[i] = (zt_model_tensor){.block = t->block, .offset = lay->toff[i], .len = lay->tlen[i],
                                            .host_offset = t->offset, .numel = t->numel,
                                            .weight_decay = t->weight_decay};
    }
    for (int b = 0; b < lay->nblocks; b++) {
        int first = -1, last = -1;
        for (int i = 0; i < lay->ntensors; i++)
            if (tensors[i].block == b) {
                if (first < 0)
                    first = i;
                last = i;
            }
        ZT_ASSERT(first >= 0);
        lay->boff[b] = lay->toff[first];
        lay->blen[b] = zt__round_up(lay->toff[last] + lay->tlen[last], ZT__CUDA_ALIGN_ELEMS) - lay->toff[first];
        lay->block_ckpt[b] = ckpt_layers && b >= 1 && b <= nlayers && ckpt_layers[b - 1];
        lay->reads_weights[b] = b != 0 || embedding_reads_weights;
        if (lay->block_ckpt[b])
            lay->top_ckpt = b;
    }
}

void zt__cuda_passes_begin(zt__cuda_layout *lay)
{
    memset(lay->state, ZT__CUDA_FORWARDED, (size_t)lay->nblocks);
}

void zt__cuda_pass_discard(zt__cuda_layout *lay, int b)
{
    ZT_ASSERT(b >= 0 && b < lay->nblocks && lay->block_ckpt[b]);
    lay->state[b] = ZT__CUDA_DISCARDED;
}

enum zt__cuda_pass zt__cuda_pass_of(zt__cuda_layout *lay, int b)
{
    ZT_ASSERT(b >= 0 && b < lay->nblocks);
    if (lay->state[b] != ZT__CUDA_DISCARDED) {
        lay->state[b] = ZT__CUDA_FORWARDED;
        return ZT__CUDA_PASS_FIRST;
    }
    lay->state[b] = ZT__CUDA_REBUILT;
    return b == lay->top_ckpt ? ZT__CUDA_PASS_KEPT : ZT__CUDA_PASS_REBUILD;
}

bool zt__cuda_pass_backward_ready(const zt__cuda_layout *lay, int b)
{
    ZT_ASSERT(b >= 0 && b < lay->nblocks);
    return !lay->block_ckpt[b] || lay->state[b] == ZT__CUDA_REBUILT;
}

bool zt__cuda_layout_any_checkpointed(const zt__cuda_layout *lay)
{
    for (int b = 0; b < lay->nblocks; b++)
        if (lay->block_ckpt[b])
            return true;
    return false;
}

void zt__cuda_layout_free(zt__cuda_layout *lay)
{
    free(lay->toff);
    free(lay->tlen);
    free(lay->packed);
    free(lay->boff);
    free(lay->blen);
    free(lay->tensors);
    free(lay->block_ckpt);
    free(lay->reads_weights);
    free(lay->state);
    memset(lay, 0, sizeof *lay);
}

void zt__cuda_layout_describe(zt_model *base, const zt__cuda_layout *lay, enum zt_dtype dtype, int head_block,
                              size_t host_numel, int max_B, int max_T, int max_micro)
{
    base->backend = ZT_MODEL_CUDA;
    base->dtype = dtype;
    base->nblocks = lay->nblocks;
    base->head_block = head_block;
    base->block_offset = lay->boff;
    base->block_len = lay->blen;
    base->checkpointed = lay->block_ckpt;
    base->backward_reads_weights = lay->reads_weights;
    base->ntensors = lay->ntensors;
    base->tensors = lay->tensors;
    base->host_numel = host_numel;
    base->max_B = max_B;
    base->max_T = max_T;
    base->max_micro = max_micro;
}

void *zt__cuda_in_block(const zt__cuda_layout *lay, const void *block_base, int b, int idx, size_t esize)
{
    return (char *)block_base + (lay->toff[idx] - lay->boff[b]) * esize;
}

/* ---- device state ---- */

int zt__cuda_state_open(zt__cuda_state *s, size_t pool_bytes, const size_t plan[2], size_t slot_ints,
                        size_t loss_floats, enum zt_dtype dtype, int B, int T, zt_err *err)
{
    memset(s, 0, sizeof *s);
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        cudaGetLastError();
        return zt_fail(err, ZT_EUNSUPPORTED, "no CUDA GPU is visible (train with --device cpu)");
    }
    ZT_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    int rc = zt_cuda_blas_create(&s->blas, 0, err);
    if (rc < 0)
        goto fail;
    size_t free_b = 0, total_b = 0;
    ZT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    char acts[32], scratch[32], avail[32];
    zt_format_size(plan[0], acts, sizeof acts);
    zt_format_size(plan[1], scratch, sizeof scratch);
    zt_format_size(free_b, avail, sizeof avail);
    if (cudaMalloc(&s->pool, pool_bytes) != cudaSuccess) {
        cudaGetLastError();
        s->pool = NULL;
        rc = zt_fail(err, ZT_ENOMEM, "the GPU has %s free but the model's activations need %s (lower the batch "
                     "size or sequence length, use grad_accum for the same tokens per step, or "
                     "--checkpointing all)", avail, acts);
        goto fail;
    }
    s->pool_bytes = pool_bytes;
    ZT_CUDA_CHECK(cudaMemsetAsync(s->pool, 0, pool_bytes, s->stream));
    s->h_io[0] = zt_cuda_host_alloc(2 * slot_ints * sizeof(int32_t));
    s->h_losses = zt_cuda_host_alloc(loss_floats * sizeof(float));
    if (!s->h_io[0] || !s->h_losses) {
        rc = zt_fail(err, ZT_ENOMEM, "out of page-locked host memory for the model's token and loss staging "
                     "(check ulimit -l)");
        goto fail;
    }
    s->h_io[1] = s->h_io[0] + slot_ints;
    for (int i = 0; i < 2; i++)
        ZT_CUDA_CHECK(cudaEventCreateWithFlags(&s->io_done[i], cudaEventDisableTiming));
    /* The zeroing is done before anything else (a copy on another stream, say) writes into the pool. */
    ZT_CUDA_CHECK(cudaStreamSynchronize(s->stream));
    zt_log(ZT_LOG_INFO, "gpu: %s compute; model activations %s (batch %d x %d), scratch %s", zt_dtype_name(dtype), acts,
           B, T, scratch);
    return 0;

fail:
    zt__cuda_state_close(s);
    return rc;
}

void zt__cuda_state_close(zt__cuda_state *s)
{
    if (s->stream)
        ZT_CUDA_CHECK(cudaStreamSynchronize(s->stream));
    for (int i = 0; i < 2; i++)
        if (s->io_done[i])
            cudaEventDestroy(s->io_done[i]);
    zt_cuda_host_free(s->h_io[0]);
    zt_cuda_host_free(s->h_losses);
    cudaFree(s->pool);
    zt_cuda_blas_destroy(s->blas);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    memset(s, 0, sizeof *s);
}

int zt__cuda_check_model(enum zt_dtype dtype, const zt_attention_dims *d, const char *heads, const char *fix,
                         int max_micro, zt_err *err)
{
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_BF16 && dtype != ZT_DTYPE_F16)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA model computes in fp32, bf16 or fp16 only");
    if (!zt_cuda_attention_gqa_supported(d))
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA attention kernels serve head sizes up to 256 (32, 64, 80, 96, 128 and 256 on their fast "
                       "kernels, the others on slower general ones) and at most 65535 sequence x head pairs per call; "
                       "%s (choose %s among them, or train with --device cpu)",
                       heads, fix);
    if (max_micro < 1 || max_micro > ZT__CUDA_MAX_MICRO)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is out of range for the CUDA trainer (1..%d)",
                       max_micro, ZT__CUDA_MAX_MICRO);
    return 0;
}

/* ---- staging and read-back ---- */

int zt__cuda_stage_lm(zt__cuda_state *s, int slot, const int32_t *tokens, const int32_t *targets, int B, int T,
                      int V, int32_t *d_tokens, int32_t *d_targets)
{
    const size_t N = (size_t)B * T;
    int32_t *h = s->h_io[slot];
    ZT_CUDA_CHECK(cudaEventSynchronize(s->io_done[slot])); /* the slot's previous copy has been made */
    int valid = 0;
    for (size_t i = 0; i < N; i++) {
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < V);
        int32_t t = targets ? targets[i] : -1;
        ZT_ASSERT(t == -1 || (t >= 0 && t < V));
        valid += t != -1;
        h[N + i] = t;
    }
    memcpy(h, tokens, N * sizeof(int32_t));
    ZT_CUDA_CHECK(cudaMemcpyAsync(d_tokens, h, N * sizeof(int32_t), cudaMemcpyHostToDevice, s->stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(d_targets, h + N, N * sizeof(int32_t), cudaMemcpyHostToDevice, s->stream));
    ZT_CUDA_CHECK(cudaEventRecord(s->io_done[slot], s->stream));
    return valid;
}

void zt__cuda_rows_to_f32(float *out, const void *dev, size_t rows, size_t cols, size_t stride, enum zt_dtype dtype,
                          cudaStream_t stream)
{
    const size_t es = zt_dtype_size(dtype);
    void *h = zt_xcalloc(rows * stride, es);
    ZT_CUDA_CHECK(cudaMemcpyAsync(h, dev, rows * stride * es, cudaMemcpyDeviceToHost, stream));
    ZT_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            const size_t i = r * stride + c;
            out[r * cols + c] = dtype == ZT_DTYPE_F32    ? ((const float *)h)[i]
                                : dtype == ZT_DTYPE_BF16 ? zt_bf16_to_f32(((const uint16_t *)h)[i])
                                                         : zt_f16_to_f32(((const uint16_t *)h)[i]);
        }
    free(h);
}

/* ---- what every executor holds ---- */

void zt__cuda_exec_init(zt__cuda_exec *x, const zt_model_ops *ops, enum zt_dtype dtype, int B, int T,
                        int max_micro)
{
    x->base.ops = ops;
    x->dtype = dtype;
    x->esize = zt_dtype_size(dtype);
    x->max_B = B;
    x->max_T = T;
    x->max_micro = max_micro;
}

zt_model *zt__cuda_exec_shape(zt__cuda_exec *x, zt__cuda_carve_fn carve)
{
    x->base.device_bytes = carve(x, NULL, NULL);
    return &x->base;
}

int zt__cuda_exec_open(zt__cuda_exec *x, zt__cuda_carve_fn carve, size_t slot_ints, size_t loss_floats,
                       zt_err *err)
{
    size_t plan[2];
    const size_t pool_bytes = carve(x, NULL, plan);
    int rc = zt__cuda_state_open(&x->cs, pool_bytes, plan, slot_ints, loss_floats, x->dtype, x->max_B, x->max_T, err);
    if (rc < 0)
        return rc;
    ZT_ASSERT(carve(x, x->cs.pool, NULL) == pool_bytes);
    return 0;
}

void zt__cuda_exec_bind(zt__cuda_exec *x, zt__ops_cuda_res res)
{
    res.stream = x->cs.stream;
    res.blas = x->cs.blas;
    zt__ops_cuda_init(&x->ops, &res, x->dtype);
    x->base.stream = x->cs.stream;
    x->base.nonfinite_flag = x->d_flag;
    x->base.device_bytes = x->cs.pool_bytes;
}

void zt__cuda_exec_close(zt__cuda_exec *x)
{
    zt__cuda_state_close(&x->cs);
    zt__ops_cuda_free(&x->ops);
    zt__cuda_layout_free(&x->lay);
}

void zt__cuda_exec_begin(zt__cuda_exec *x, int B, int T, int micro, size_t rows)
{
    ZT_ASSERT(B >= 1 && B <= x->max_B && T >= 1 && T <= x->max_T);
    ZT_ASSERT(micro >= 0 && micro < x->max_micro);
    if (micro == 0)
        ZT_CUDA_CHECK(cudaMemsetAsync(x->d_flag, 0, sizeof(int), x->cs.stream));
    x->cur_B = B;
    x->cur_T = T;
    x->micro = micro;
    x->rows = rows;
    zt__cuda_passes_begin(&x->lay);
}

void *zt__cuda_exec_in_block(const zt__cuda_exec *x, const void *block_base, int b, int idx)
{
    return zt__cuda_in_block(&x->lay, block_base, b, idx, x->esize);
}

void zt__cuda_exec_head_loss(zt__cuda_exec *x, void *logits, const int32_t *d_targets, int K, int Kp, float scale)
{
    const int rows = (int)x->rows, valid = x->n_valid[x->micro];
    const bool train = scale != 0.0f;
    const float grad_scale = valid > 0 ? scale / (float)valid : 0.0f;
    zt_cuda_crossentropy_forward_backward(x->losses, train ? logits : NULL, logits, d_targets, rows, K, Kp, -1,
                                          grad_scale, NULL, x->dtype, x->cs.stream);
    if (train)
        zt_cuda_check_finite(x->d_flag, x->losses, (size_t)rows, ZT_DTYPE_F32, x->cs.stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(x->cs.h_losses + (size_t)x->micro * x->rows, x->losses,
                                  x->rows * sizeof(float), cudaMemcpyDeviceToHost, x->cs.stream));
}

void zt__cuda_exec_discard(zt_model *m, int b)
{
    zt__cuda_pass_discard(&((zt__cuda_exec *)m)->lay, b);
}

float zt__cuda_exec_loss(const zt_model *m, int micro)
{
    const zt__cuda_exec *x = (const zt__cuda_exec *)m;
    return zt__mean_loss(x->cs.h_losses + (size_t)micro * x->rows, x->rows, x->n_valid[micro]);
}

void zt__cuda_exec_set_profiling(zt_model *m, bool on)
{
    zt__ops_cuda_set_profiling(&((zt__cuda_exec *)m)->ops, on);
}

void zt__cuda_exec_profile_report(zt_model *m)
{
    zt__ops_cuda_profile_report(&((zt__cuda_exec *)m)->ops);
}
