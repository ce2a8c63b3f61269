/* Layer normalisation on the GPU (kernels/layernorm.h): one warp per row, 16-byte loads, fp32 math.
 *
 * Backward: each warp keeps its own fp32 running sums of dweight and dbias in shared memory (its lanes
 * own fixed channels, rows arrive in a fixed order); at the end a block adds its warps' sums in order
 * and writes one partial row to scratch, and a second kernel adds the blocks' partial rows in order.
 * The grid size is a constant, so the result is the same bits on every run and every GPU. */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/layernorm.h"

#define LN_BWD_BLOCKS 256        /* fixed, for determinism across GPUs */
#define LN_MAX_C 6144            /* one warp's dweight+dbias sums must fit in 48 KiB of shared memory */
#define LN_SMEM_BUDGET (48 * 1024)

template <typename T>
static __global__ void layernorm_forward_kernel(T *__restrict__ out, float *__restrict__ mean,
                                                float *__restrict__ rstd, const T *__restrict__ inp,
                                                const T *__restrict__ weight, const T *__restrict__ bias, int N,
                                                int C, float eps)
{
    constexpr int VS = zt_vec<T>::size;
    const int lane = threadIdx.x % ZT_WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / ZT_WARP_SIZE) + threadIdx.x / ZT_WARP_SIZE;
    if (row >= N)
        return;
    const T *x = inp + (size_t)row * C;

    float sum = 0.0f;
    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        zt_vec<T> v = zt_load_vec(x + c);
        for (int k = 0; k < VS; k++)
            sum += zt_to_float(v.v[k]);
    }
    float m = zt_warp_sum(sum) / C;

    float var = 0.0f; /* second pass over the row (now in L1): no cancellation from E[x^2] - m^2 */
    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        zt_vec<T> v = zt_load_vec(x + c);
        for (int k = 0; k < VS; k++) {
            float d = zt_to_float(v.v[k]) - m;
            var += d * d;
        }
    }
    float s = rsqrtf(zt_warp_sum(var) / C + eps);

    T *o = out + (size_t)row * C;
    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        zt_vec<T> v = zt_load_vec_cs(x + c);
        zt_vec<T> w = zt_load_vec(weight + c);
        zt_vec<T> b = zt_load_vec(bias + c);
        zt_vec<T> r;
        for (int k = 0; k < VS; k++)
            r.v[k] = zt_from_float<T>((zt_to_float(v.v[k]) - m) * s * zt_to_float(w.v[k]) + zt_to_float(b.v[k]));
        zt_store_vec(o + c, r);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <typename T>
static __global__ void layernorm_backward_kernel(T *__restrict__ dinp, float *__restrict__ partials,
                                                 const T *__restrict__ dout, const T *__restrict__ inp,
                                                 const T *__restrict__ weight, const float *__restrict__ mean,
                                                 const float *__restrict__ rstd, int N, int C)
{
    constexpr int VS = zt_vec<T>::size;
    extern __shared__ float sums[]; /* [nwarps][2C]: dweight then dbias of each warp */
    const int lane = threadIdx.x % ZT_WARP_SIZE, warp = threadIdx.x / ZT_WARP_SIZE;
    const int nwarps = blockDim.x / ZT_WARP_SIZE;
    float *dw = sums + (size_t)warp * 2 * C;
    float *db = dw + C;
    for (int c = lane; c < 2 * C; c += ZT_WARP_SIZE)
        dw[c] = 0.0f;
    __syncwarp();

    for (int row = blockIdx.x * nwarps + warp; row < N; row += gridDim.x * nwarps) {
        const T *x = inp + (size_t)row * C;
        const T *g = dout + (size_t)row * C;
        const float m = mean[row], s = rstd[row];

        float a = 0.0f, b = 0.0f; /* sums of dnorm and dnorm * norm */
        for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
            zt_vec<T> xv = zt_load_vec(x + c), gv = zt_load_vec(g + c), wv = zt_load_vec(weight + c);
            for (int k = 0; k < VS; k++) {
                float norm = (zt_to_float(xv.v[k]) - m) * s;
                float dnorm = zt_to_float(wv.v[k]) * zt_to_float(gv.v[k]);
                a += dnorm;
                b += dnorm * norm;
            }
        }
        a = zt_warp_sum(a) / C;
        b = zt_warp_sum(b) / C;

        T *d = dinp + (size_t)row * C;
        for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
            zt_vec<T> xv = zt_load_vec_cs(x + c), gv = zt_load_vec_cs(g + c), wv = zt_load_vec(weight + c);
            zt_vec<T> dv = zt_load_vec(d + c);
            for (int k = 0; k < VS; k++) {
                float norm = (zt_to_float(xv.v[k]) - m) * s;
                float gk = zt_to_float(gv.v[k]);
                float dnorm = zt_to_float(wv.v[k]) * gk;
                dv.v[k] = zt_from_float<T>(zt_to_float(dv.v[k]) + (dnorm - a - norm * b) * s);
                dw[c + k] += norm * gk;
                db[c + k] += gk;
            }
            zt_store_vec(d + c, dv);
        }
    }
    __syncthreads();
    /* This block's partial row: its warps' sums added in warp order. */
    float *out = partials + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < nwarps; w++)
            acc += sums[(size_t)w * 2 * C + c];
        out[c] = acc;
    }
}

/* dweight[c] += sum over blocks of partials[blk][c], dbias likewise, blocks in order. */
template <typename T>
static __global__ void layernorm_backward_reduce_kernel(T *__restrict__ dweight, T *__restrict__ dbias,
                                                        const float *__restrict__ partials, int nblocks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float w = 0.0f, b = 0.0f;
    for (int blk = 0; blk < nblocks; blk++) {
        w += partials[(size_t)blk * 2 * C + c];
        b += partials[(size_t)blk * 2 * C + C + c];
    }
    dweight[c] = zt_from_float<T>(zt_to_float(dweight[c]) + w);
    dbias[c] = zt_from_float<T>(zt_to_float(dbias[c]) + b);
}

template <typename T>
static void layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *weight, const T *bias,
                              int N, int C, float eps, cudaStream_t stream)
{
    const int block = 256, rows_per_block = block / ZT_WARP_SIZE;
    layernorm_forward_kernel<<<ZT_CEIL_DIV(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, inp, weight,
                                                                                   bias, N, C, eps);
    ZT_CUDA_CHECK_LAUNCH();
}

static int ln_bwd_warps(int C)
{
    int w = LN_SMEM_BUDGET / (2 * C * (int)sizeof(float));
    return w > 8 ? 8 : w;
}

static int ln_bwd_blocks(int N, int C)
{
    int b = ZT_CEIL_DIV(N, ln_bwd_warps(C));
    return b > LN_BWD_BLOCKS ? LN_BWD_BLOCKS : b;
}

extern "C" size_t zt_cuda_layernorm_backward_scratch_size(int N, int C)
{
    return (size_t)ln_bwd_blocks(N, C) * 2 * C * sizeof(float);
}

template <typename T>
static void layernorm_backward(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight,
                               const float *mean, const float *rstd, int N, int C, void *scratch,
                               cudaStream_t stream)
{
    int warps = ln_bwd_warps(C), blocks = ln_bwd_blocks(N, C);
    size_t smem = (size_t)warps * 2 * C * sizeof(float);
    layernorm_backward_kernel<<<blocks, warps * ZT_WARP_SIZE, smem, stream>>>(dinp, (float *)scratch, dout, inp,
                                                                              weight, mean, rstd, N, C);
    ZT_CUDA_CHECK_LAUNCH();
    layernorm_backward_reduce_kernel<<<ZT_CEIL_DIV(C, 256), 256, 0, stream>>>(dweight, dbias,
                                                                              (const float *)scratch, blocks, C);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                          const void *bias, int N, int C, float eps, enum zt_dtype dtype,
                                          cudaStream_t stream)
{
    ZT_ASSERT(N > 0 && C > 0 && C % 8 == 0);
    ZT_ASSERT(zt_aligned16(out) && zt_aligned16(inp) && zt_aligned16(weight) && zt_aligned16(bias));
    switch (dtype) {
    case ZT_DTYPE_F32:
        layernorm_forward((float *)out, mean, rstd, (const float *)inp, (const float *)weight,
                          (const float *)bias, N, C, eps, stream);
        break;
    case ZT_DTYPE_F16:
        layernorm_forward((__half *)out, mean, rstd, (const __half *)inp, (const __half *)weight,
                          (const __half *)bias, N, C, eps, stream);
        break;
    case ZT_DTYPE_BF16:
        layernorm_forward((__nv_bfloat16 *)out, mean, rstd, (const __nv_bfloat16 *)inp,
                          (const __nv_bfloat16 *)weight, (const __nv_bfloat16 *)bias, N, C, eps, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_layernorm_forward", dtype);
    }
}

extern "C" void zt_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout,
                                           const void *inp, const void *weight, const float *mean,
                                           const float *rstd, int N, int C, void *scratch, enum zt_dtype dtype,
                                           cudaStream_t stream)
{
    ZT_ASSERT(N > 0 && C > 0 && C % 8 == 0 && C <= LN_MAX_C);
    ZT_ASSERT(zt_aligned16(dinp) && zt_aligned16(dout) && zt_aligned16(inp) && zt_aligned16(weight));
    ZT_ASSERT(zt_aligned16(scratch));
    switch (dtype) {
    case ZT_DTYPE_F32:
        layernorm_backward((float *)dinp, (float *)dweight, (float *)dbias, (const float *)dout,
                           (const float *)inp, (const float *)weight, mean, rstd, N, C, scratch, stream);
        break;
    case ZT_DTYPE_F16:
        layernorm_backward((__half *)dinp, (__half *)dweight, (__half *)dbias, (const __half *)dout,
                           (const __half *)inp, (const __half *)weight, mean, rstd, N, C, scratch, stream);
        break;
    case ZT_DTYPE_BF16:
        layernorm_backward((__nv_bfloat16 *)dinp, (__nv_bfloat16 *)dweight, (__nv_bfloat16 *)dbias,
                           (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)inp,
                           (const __nv_bfloat16 *)weight, mean, rstd, N, C, scratch, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_layernorm_backward", dtype);
    }
}
