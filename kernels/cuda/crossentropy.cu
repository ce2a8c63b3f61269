/* Fused classifier on the GPU (kernels/crossentropy.h): softmax, cross-entropy loss and its gradient
 * in one kernel, one block per row. The first pass keeps a running (max, sum of exp) per thread (the
 * online softmax), the block combines them, thread 0 writes the loss, and the second pass writes the
 * gradient over the logits (in place when dlogits == logits). Rows are read with 16-byte loads when
 * their layout allows it. */
#include "kernels/crossentropy.h"
#include "kernels/cuda/cuda_utils.cuh"

#define CE_BLOCK 512

/* Folds one value into a running (max, sum of exp(x - max)). */
__device__ __forceinline__ void online_add(float &m, float &s, float x)
{
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

template <typename T>
static __global__ void __launch_bounds__(CE_BLOCK)
    crossentropy_kernel(float *__restrict__ losses, T *dlogits, const T *logits, const int32_t *__restrict__ targets,
                        int V, int P, int ignore_index, float grad_scale, int *valid_count, bool vec)
{
    constexpr int VS = zt_vec<T>::size;
    const int row = blockIdx.x;
    const T *x = logits + (size_t)row * P;
    T *dx = dlogits ? dlogits + (size_t)row * P : NULL;
    const int target = targets[row];

    if (target == ignore_index) {
        if (threadIdx.x == 0)
            losses[row] = 0.0f;
        if (dx)
            for (int i = threadIdx.x; i < P; i += blockDim.x)
                dx[i] = zt_from_float<T>(0.0f);
        return;
    }

    /* Pass 1: running max and sum of exp per thread, then over the block. */
    const int vec_end = vec ? V / VS * VS : 0;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x * VS; i < vec_end; i += blockDim.x * VS) {
        zt_vec<T> v = zt_load_vec(x + i);
        for (int k = 0; k < VS; k++)
            online_add(m, s, zt_to_float(v.v[k]));
    }
    for (int i = vec_end + threadIdx.x; i < V; i += blockDim.x)
        online_add(m, s, zt_to_float(x[i]));
    const float bm = zt_block_max(m);
    const float bs = zt_block_sum(m == -INFINITY ? 0.0f : s * expf(m - bm));
    const float inv = 1.0f / bs;

    if (threadIdx.x == 0) {
        float lt = zt_to_float(x[target]);
        losses[row] = logf(bs) + bm - lt; /* -log softmax(x)[target] */
        if (valid_count)
            atomicAdd(valid_count, 1);   /* integer: the total is exact whatever the order */
    }
    if (!dx)
        return;
    __syncthreads(); /* thread 0 read x[target] above: no thread may overwrite it before that */

    /* Pass 2: the gradient, (softmax - onehot) * grad_scale; each thread rewrites what it reads. */
    for (int i = threadIdx.x * VS; i < vec_end; i += blockDim.x * VS) {
        zt_vec<T> v = zt_load_vec(x + i), r;
        for (int k = 0; k < VS; k++) {
            float p = expf(zt_to_float(v.v[k]) - bm) * inv;
            r.v[k] = zt_from_float<T>((p - (i + k == target ? 1.0f : 0.0f)) * grad_scale);
        }
        zt_store_vec(dx + i, r);
    }
    for (int i = vec_end + threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(zt_to_float(x[i]) - bm) * inv;
        dx[i] = zt_from_float<T>((p - (i == target ? 1.0f : 0.0f)) * grad_scale);
    }
    for (int i = V + threadIdx.x; i < P; i += blockDim.x)
        dx[i] = zt_from_float<T>(0.0f);
}

template <typename T>
static void crossentropy(float *losses, T *dlogits, const T *logits, const int32_t *targets, int N, int V, int P,
                         int ignore_index, float grad_scale, int *valid_count, cudaStream_t stream)
{
    /* 16-byte loads need every row to start on a 16-byte boundary. */
    bool vec = zt_aligned16(logits) && zt_aligned16(dlogits) && ((size_t)P * sizeof(T)) % 16 == 0;
    crossentropy_kernel<<<N, CE_BLOCK, 0, stream>>>(losses, dlogits, logits, targets, V, P, ignore_index,
                                                    grad_scale, valid_count, vec);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_crossentropy_forward_backward(float *losses, void *dlogits, const void *logits,
                                                      const int32_t *targets, int N, int V, int P,
                                                      int ignore_index, float grad_scale, int *d_valid_count,
                                                      enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(N > 0 && V > 0 && P >= V);
    /* In place or separate, but never partly overlapping. */
    ZT_ASSERT(dlogits == NULL || dlogits == logits ||
              (const char *)dlogits + (size_t)N * P * zt_dtype_size(dtype) <= (const char *)logits ||
              (const char *)logits + (size_t)N * P * zt_dtype_size(dtype) <= (const char *)dlogits);
    switch (dtype) {
    case ZT_DTYPE_F32:
        crossentropy(losses, (float *)dlogits, (const float *)logits, targets, N, V, P, ignore_index, grad_scale,
                     d_valid_count, stream);
        break;
    case ZT_DTYPE_F16:
        crossentropy(losses, (__half *)dlogits, (const __half *)logits, targets, N, V, P, ignore_index,
                     grad_scale, d_valid_count, stream);
        break;
    case ZT_DTYPE_BF16:
        crossentropy(losses, (__nv_bfloat16 *)dlogits, (const __nv_bfloat16 *)logits, targets, N, V, P,
                     ignore_index, grad_scale, d_valid_count, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_crossentropy_forward_backward", dtype);
    }
}
