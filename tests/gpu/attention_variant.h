/* The packed-qkv CUDA attention entry points with a kernel family chosen by the program, for the GPU tests
 * and benchmarks that compare the families. att_* take the arguments of zt_cuda_attention_* and, with
 * g_att_variant all zeros (the production choice), call those entry points themselves; otherwise they run
 * the same call as a packed-qkv descriptor with the variant (zt_cuda_attention_fwd / _bwd), which the
 * descriptor chooser sends to the same kernels. */
#ifndef ZT_TESTS_GPU_ATTENTION_VARIANT_H
#define ZT_TESTS_GPU_ATTENTION_VARIANT_H

#include <string.h>

#include "common/status.h"
#include "kernels/attention.h"

/* The kernel family under test; zeros: the production choice. */
static zt_attention_variant g_att_variant;

static inline bool att_variant_default(void)
{
    const zt_attention_variant z = {0};
    return memcmp(&z, &g_att_variant, sizeof(z)) == 0;
}

static inline zt_attention_desc att_packed_desc(void *out, float *lse, const void *qkv, const int32_t *lens,
                                                const zt_attention_dims *d, enum zt_dtype dt)
{
    const long es = (long)zt_dtype_size(dt), W = (long)(d->NH + 2 * d->NKV) * d->HS;
    zt_attention_desc a = {.q = qkv, .k = (const char *)qkv + (long)d->NH * d->HS * es,
                           .v = (const char *)qkv + (long)(d->NH + d->NKV) * d->HS * es, .q_stride = W,
                           .k_stride = W, .v_stride = W, .out = out, .out_stride = (long)d->NH * d->HS, .lse = lse,
                           .B = d->B, .Tq = d->T, .Tk = d->T, .NH = d->NH, .NKV = d->NKV, .HS = d->HS,
                           .causal = d->causal, .window = -1, .lens = lens, .variant = &g_att_variant};
    return a;
}

/* Bytes of backward scratch the call needs with the variant under test (the single pass needs more). */
static inline size_t att_scratch_bytes(int B, int T, int NH, int NKV, int HS, bool causal)
{
    const zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .causal = causal};
    /* the sizes depend on the shape and the variant, not on the tensors */
    const zt_attention_desc a = {.B = B, .Tq = T, .Tk = T, .NH = NH, .NKV = NKV, .HS = HS, .causal = causal,
                                 .window = -1, .variant = &g_att_variant};
    const size_t s = zt_cuda_attention_bwd_scratch_size(&a), g = zt_cuda_attention_backward_gqa_scratch_size(&d);
    return s > g ? s : g;
}

static inline void att_forward_gqa(void *out, float *lse, const void *qkv, const int32_t *lens,
                                   const zt_attention_dims *d, enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_forward_gqa(out, lse, qkv, lens, d, dt, stream);
        return;
    }
    const zt_attention_desc a = att_packed_desc(out, lse, qkv, lens, d, dt);
    zt_err err;
    ZT_ASSERT(zt_cuda_attention_fwd(&a, dt, stream, &err) == 0);
}

static inline void att_backward_gqa(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                    const int32_t *lens, const zt_attention_dims *d, bool accumulate, void *scratch,
                                    enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, d, accumulate, scratch, dt, stream);
        return;
    }
    const zt_attention_desc a = att_packed_desc((void *)out, (float *)lse, qkv, lens, d, dt);
    const long es = (long)zt_dtype_size(dt);
    const zt_attention_grads g = {.dout = dout, .dq = dqkv, .dk = (char *)dqkv + (long)d->NH * d->HS * es,
                                  .dv = (char *)dqkv + (long)(d->NH + d->NKV) * d->HS * es, .dq_stride = a.q_stride,
                                  .dk_stride = a.q_stride, .dv_stride = a.q_stride, .accumulate = accumulate};
    zt_err err;
    ZT_ASSERT(zt_cuda_attention_bwd(&a, &g, scratch, dt, stream, &err) == 0);
}

static inline zt_attention_dims att_mha_dims(int B, int T, int C, int NH)
{
    const zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NH, .HS = C / NH, .causal = true};
    return d;
}

static inline void att_forward_masked(void *out, float *lse, const void *qkv, const int32_t *lens, int B, int T,
                                      int C, int NH, enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_forward_masked(out, lse, qkv, lens, B, T, C, NH, dt, stream);
        return;
    }
    const zt_attention_dims d = att_mha_dims(B, T, C, NH);
    att_forward_gqa(out, lse, qkv, lens, &d, dt, stream);
}

static inline void att_backward_masked(void *dqkv, const void *dout, const void *qkv, const void *out,
                                       const float *lse, const int32_t *lens, int B, int T, int C, int NH,
                                       void *scratch, enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_backward_masked(dqkv, dout, qkv, out, lse, lens, B, T, C, NH, scratch, dt, stream);
        return;
    }
    const zt_attention_dims d = att_mha_dims(B, T, C, NH);
    att_backward_gqa(dqkv, dout, qkv, out, lse, lens, &d, true, scratch, dt, stream);
}

static inline void att_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                               enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_forward(out, lse, qkv, B, T, C, NH, dt, stream);
        return;
    }
    att_forward_masked(out, lse, qkv, NULL, B, T, C, NH, dt, stream);
}

static inline void att_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                int B, int T, int C, int NH, void *scratch, enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, dt, stream);
        return;
    }
    att_backward_masked(dqkv, dout, qkv, out, lse, NULL, B, T, C, NH, scratch, dt, stream);
}

static inline void att_backward_overwrite(void *dqkv, const void *dout, const void *qkv, const void *out,
                                          const float *lse, int B, int T, int C, int NH, void *scratch,
                                          enum zt_dtype dt, cudaStream_t stream)
{
    if (att_variant_default()) {
        zt_cuda_attention_backward_overwrite(dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, dt, stream);
        return;
    }
    const zt_attention_dims d = att_mha_dims(B, T, C, NH);
    att_backward_gqa(dqkv, dout, qkv, out, lse, NULL, &d, false, scratch, dt, stream);
}

#endif
