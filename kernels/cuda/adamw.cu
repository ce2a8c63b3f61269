/* Multi-tensor fused AdamW on the GPU (kernels/adamw.h).
 *
 * The tensors' pointers travel in the kernel's argument block (no device-side table to upload), with a
 * map from block to (tensor, chunk): one launch updates up to ADAMW_MAX_TENSORS tensors in up to
 * ADAMW_MAX_BLOCKS chunks of ADAMW_CHUNK elements, and the launcher issues as many launches as the list
 * needs. Each element is read and written once: fp32 param, m, v, the gradient in its own dtype, and
 * the rounded low-precision copy of the new weights. */
#include <math.h>

#include "kernels/adamw.h"
#include "kernels/cuda/cuda_utils.cuh"

#define ADAMW_MAX_TENSORS 32
#define ADAMW_MAX_BLOCKS 320
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
    unsigned char block_tensor[ADAMW_MAX_BLOCKS];
    int block_chunk[ADAMW_MAX_BLOCKS];
};

struct adamw_hyper {
    float lr, beta1, beta2, eps, grad_scale;
    float bc1, bc2; /* 1 - beta^step, from the host in double precision */
};

template <typename G, typename L>
static __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(const __grid_constant__ adamw_batch batch, const adamw_hyper hp, const float *d_grad_scale,
                 const int *d_skip)
{
    if (d_skip && *d_skip)
        return;
    const float gs = d_grad_scale ? hp.grad_scale * *d_grad_scale : hp.grad_scale;
    const int t = batch.block_tensor[blockIdx.x];
    const long long start = (long long)batch.block_chunk[blockIdx.x] * ADAMW_CHUNK;
    const long long end = min(start + ADAMW_CHUNK, batch.n[t]);
    float *param = batch.param[t], *m = batch.m[t], *v = batch.v[t];
    const G *grad = (const G *)batch.grad[t];
    L *lowp = (L *)batch.lowp[t];
    const float wd = batch.wd[t];
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        float g = zt_to_float(grad[i]) * gs;
        float mi = hp.beta1 * m[i] + (1.0f - hp.beta1) * g;
        float vi = hp.beta2 * v[i] + (1.0f - hp.beta2) * g * g;
        float mhat = mi / hp.bc1, vhat = vi / hp.bc2;
        float p = param[i];
        p -= hp.lr * (mhat / (sqrtf(vhat) + hp.eps) + wd * p);
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
    for (int i = 0; i < count; i++) {
        const zt_cuda_adamw_tensor *t = &tensors[i];
        if (t->n == 0)
            continue;
        ZT_ASSERT(t->param && t->m && t->v && t->grad);
        if (ntensors == ADAMW_MAX_TENSORS) {
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
        size_t chunks = ZT_CEIL_DIV(t->n, (size_t)ADAMW_CHUNK);
        ZT_ASSERT(chunks <= (size_t)0x7fffffff);
        for (size_t c = 0; c < chunks; c++) {
            if (blocks == ADAMW_MAX_BLOCKS) {
                flush(batch, blocks, hp, grad_dtype, lowp_dtype, d_grad_scale, d_skip, stream);
                /* The tensor in progress moves to slot 0 of the next batch. */
                batch.param[0] = batch.param[ntensors];
                batch.m[0] = batch.m[ntensors];
                batch.v[0] = batch.v[ntensors];
                batch.grad[0] = batch.grad[ntensors];
                batch.lowp[0] = batch.lowp[ntensors];
                batch.n[0] = batch.n[ntensors];
                batch.wd[0] = batch.wd[ntensors];
                ntensors = 0;
                blocks = 0;
            }
            batch.block_tensor[blocks] = (unsigned char)ntensors;
            batch.block_chunk[blocks] = (int)c;
            blocks++;
        }
        ntensors++;
    }
    flush(batch, blocks, hp, grad_dtype, lowp_dtype, d_grad_scale, d_skip, stream);
}
