/* Multi-tensor fused AdamW on the GPU (kernels/adamw.h).
 *
 * The tensors' pointers travel in the kernel's argument block (no device-side table to upload), with
 * each tensor's first block: one launch updates up to ADAMW_MAX_TENSORS tensors, one block for every
 * ADAMW_CHUNK elements, and the launcher issues as many launches as the list needs. Each element is read
 * and written once: fp32 param, m, v, the gradient in its own dtype, and the rounded low-precision copy
 * of the new weights; four elements at a time (16-byte fp32 accesses) where a tensor's pointers allow. */
#include <math.h>

#include "kernels/adamw.h"
#include "kernels/cuda/cuda_utils.cuh"

#define ADAMW_MAX_TENSORS 64
#define ADAMW_CHUNK 65536
#define ADAMW_THREADS 512

/* Kept under the classic 4 KiB kernel-argument limit (CUDA 12.x on older GPUs). */
struct adamw_batch {
    float *param[ADAMW_MAX_TENSORS];
    float *m[ADAMW_MAX_TENSORS];
    float *v[ADAMW_MAX_TENSORS];
    const void *grad[ADAMW_MAX_TENSORS];
    void *lowp[ADAMW_MAX_TENSORS];
    long long n[ADAMW_MAX_TENSORS];
    float wd[ADAMW_MAX_TENSORS];
    int first_block[ADAMW_MAX_TENSORS + 1]; /* tensor t has blocks first_block[t] .. first_block[t+1]-1 */
    unsigned char vec4[ADAMW_MAX_TENSORS];  /* 1: every pointer allows four-element accesses */
};
static_assert(sizeof(adamw_batch) <= 4096 - 256, "adamw_batch and the kernel's other arguments must fit in 4 KiB");

struct adamw_hyper {
    float lr, beta1, beta2, eps, grad_scale;
    float bc1, bc2; /* 1 - beta^step, from the host in double precision */
};

/* One element's update; returns the new weight. Every operation is an explicitly rounded intrinsic, so
 * the compiler cannot fuse a multiply and an add differently in different instantiations: the update is
 * the same bits whatever the gradient's storage type (an fp32 gradient and a bf16 one of the same value
 * give the same weights, which keeps a step that reads bf16 gradients equal to one that reads their
 * fp32 copy). */
__device__ __forceinline__ float adamw_one(float g, float &m, float &v, float p, const adamw_hyper &hp, float gs,
                                           float wd)
{
    g = __fmul_rn(g, gs);
    m = __fadd_rn(__fmul_rn(hp.beta1, m), __fmul_rn(__fsub_rn(1.0f, hp.beta1), g));
    v = __fadd_rn(__fmul_rn(hp.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, hp.beta2), g), g));
    const float mhat = __fdiv_rn(m, hp.bc1), vhat = __fdiv_rn(v, hp.bc2);
    const float upd = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), hp.eps)), __fmul_rn(wd, p));
    return __fsub_rn(p, __fmul_rn(hp.lr, upd));
}

template <typename G, typename L>
static __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(const __grid_constant__ adamw_batch batch, const adamw_hyper hp, const float *d_grad_scale,
                 const int *d_skip)
{
    if (d_skip && *d_skip)
        return;
    const float gs = d_grad_scale ? hp.grad_scale * *d_grad_scale : hp.grad_scale;
    int t = 0;
    while ((int)blockIdx.x >= batch.first_block[t + 1])
        t++;
    const long long start = (long long)(blockIdx.x - batch.first_block[t]) * ADAMW_CHUNK;
    const long long end = min(start + ADAMW_CHUNK, batch.n[t]);
    float *param = batch.param[t], *m = batch.m[t], *v = batch.v[t];
    const G *grad = (const G *)batch.grad[t];
    L *lowp = (L *)batch.lowp[t];
    const float wd = batch.wd[t];
    long long done = start;
    if (batch.vec4[t]) {
        const long long end4 = start + (end - start) / 4 * 4;
        for (long long i = start + 4 * threadIdx.x; i < end4; i += 4 * blockDim.x) {
            float4 g = zt_load4(grad + i), mi = zt_load4(m + i), vi = zt_load4(v + i), p = zt_load4(param + i);
            p.x = adamw_one(g.x, mi.x, vi.x, p.x, hp, gs, wd);
            p.y = adamw_one(g.y, mi.y, vi.y, p.y, hp, gs, wd);
            p.z = adamw_one(g.z, mi.z, vi.z, p.z, hp, gs, wd);
            p.w = adamw_one(g.w, mi.w, vi.w, p.w, hp, gs, wd);
            zt_store4(m + i, mi);
            zt_store4(v + i, vi);
            zt_store4(param + i, p);
            if (lowp)
                zt_store4(lowp + i, p);
        }
        done = end4;
    }
    for (long long i = done + threadIdx.x; i < end; i += blockDim.x) {
        float mi = m[i], vi = v[i];
        float p = adamw_one(zt_to_float(grad[i]), mi, vi, param[i], hp, gs, wd);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if (lowp)
            lowp[i] = zt_from_float<L>(p);
    }
}

template <typename G, typename L>
static void launch(const adamw_batch &batch, int blocks, const adamw_hyper &hp, const float *d_grad_scale,
                   const int *d_skip, cudaStream_t stream)
{
    adamw_kernel<G, L><<<blocks, ADAMW_THREADS, 0, stream>>>(batch, hp, d_grad_scale, d_skip);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename G>
static void launch_lowp(const adamw_batch &batch, int blocks, const adamw_hyper &hp, enum zt_dtype lowp_dtype,
                        const float *d_grad_scale, const int *d_skip, cudaStream_t stream)
{
    switch (lowp_dtype) {
    case ZT_DTYPE_F32:
        launch<G, float>(batch, blocks, hp, d_grad_scale, d_skip, stream);
        break;
    case ZT_DTYPE_F16:
        launch<G, __half>(batch, blocks, hp, d_grad_scale, d_skip, stream);
        break;
    case ZT_DTYPE_BF16:
        launch<G, __nv_bfloat16>(batch, blocks, hp, d_grad_scale, d_skip, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_adamw_update", lowp_dtype);
    }
}

static void flush(const adamw_batch &batch, int blocks, const adamw_hyper &hp, enum zt_dtype grad_dtype,
                  enum zt_dtype lowp_dtype, const float *d_grad_scale, const int *d_skip, cudaStream_t stream)
{
    if (blocks == 0)
        return;
    switch (grad_dtype) {
    case ZT_DTYPE_F32:
        launch_lowp<float>(batch, blocks, hp, lowp_dtype, d_grad_scale, d_skip, stream);
        break;
    case ZT_DTYPE_F16:
        launch_lowp<__half>(batch, blocks, hp, lowp_dtype, d_grad_scale, d_skip, stream);
        break;
    case ZT_DTYPE_BF16:
        launch_lowp<__nv_bfloat16>(batch, blocks, hp, lowp_dtype, d_grad_scale, d_skip, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_adamw_update", grad_dtype);
    }
}

extern "C" void zt_cuda_adamw_update(const zt_cuda_adamw_tensor *tensors, int count, const zt_adamw_params *p,
                                     enum zt_dtype grad_dtype, enum zt_dtype lowp_dtype, const float *d_grad_scale,
                                     const int *d_skip, cudaStream_t stream)
{
    ZT_ASSERT(count >= 0 && (count == 0 || tensors) && p && p->step >= 1);
    adamw_hyper hp;
    hp.lr = p->lr;
    hp.beta1 = p->beta1;
    hp.beta2 = p->beta2;
    hp.eps = p->eps;
    hp.grad_scale = p->grad_scale;
    hp.bc1 = (float)(1.0 - pow((double)p->beta1, (double)p->step));
    hp.bc2 = (float)(1.0 - pow((double)p->beta2, (double)p->step));

    adamw_batch batch;
    int ntensors = 0, blocks = 0;
    const size_t gsize = zt_dtype_size(grad_dtype);
    const size_t lsize = lowp_dtype == ZT_DTYPE_F32 || lowp_dtype == ZT_DTYPE_F16 || lowp_dtype == ZT_DTYPE_BF16
                             ? zt_dtype_size(lowp_dtype)
                             : 0;
    for (int i = 0; i < count; i++) {
        const zt_cuda_adamw_tensor *t = &tensors[i];
        if (t->n == 0)
            continue;
        ZT_ASSERT(t->param && t->m && t->v && t->grad);
        size_t chunks = ZT_CEIL_DIV(t->n, (size_t)ADAMW_CHUNK);
        ZT_ASSERT(chunks <= (size_t)0x7fffffff);
        if (ntensors == ADAMW_MAX_TENSORS || (size_t)blocks + chunks > (size_t)0x7fffffff) {
            batch.first_block[ntensors] = blocks;
            flush(batch, blocks, hp, grad_dtype, lowp_dtype, d_grad_scale, d_skip, stream);
            ntensors = blocks = 0;
        }
        batch.param[ntensors] = t->param;
        batch.m[ntensors] = t->m;
        batch.v[ntensors] = t->v;
        batch.grad[ntensors] = t->grad;
        batch.lowp[ntensors] = t->param_lowp;
        batch.n[ntensors] = (long long)t->n;
        batch.wd[ntensors] = t->weight_decay ? p->weight_decay : 0.0f;
        batch.vec4[ntensors] = zt_aligned16(t->param) && zt_aligned16(t->m) && zt_aligned16(t->v) &&
                               gsize > 0 && (uintptr_t)t->grad % (4 * gsize) == 0 &&
                               (!t->param_lowp || (lsize > 0 && (uintptr_t)t->param_lowp % (4 * lsize) == 0));
        batch.first_block[ntensors] = blocks;
        blocks += (int)chunks;
        ntensors++;
    }
    batch.first_block[ntensors] = blocks;
    flush(batch, blocks, hp, grad_dtype, lowp_dtype, d_grad_scale, d_skip, stream);
}
