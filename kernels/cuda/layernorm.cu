/* Layer normalisation on the GPU (kernels/layernorm.h): one warp per row, 16-byte loads, fp32 math.
 *
 * Backward: each warp keeps its own fp32 running sums of dweight and dbias (its lanes own fixed
 * channels, rows arrive in a fixed order): in registers where a row is at most LN_REG_MAX_VECS 16-byte
 * vectors per lane (C <= 2048 in 16-bit types, C <= 1024 in fp32), otherwise in shared memory. At the
 * end a block adds its warps' sums in warp order and writes one partial row to scratch, and a second
 * kernel adds the blocks' partial rows in a fixed order. The grid depends on N, C and the dtype alone,
 * so the result is the same bits on every run and every GPU. */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/layernorm.h"

#define LN_BWD_BLOCKS 256        /* fixed, for determinism across GPUs */
#define LN_REG_WARPS 4           /* warps per block of the register kernel */
#define LN_REG_SMS 132           /* the grid is a multiple of an H100/H200's SM count (a constant) */
#define LN_REG_MAX_VECS 8        /* 16-byte vectors per lane and row the register kernel handles */
#define LN_RED_ROWS 8            /* the reduce kernel: partial rows summed side by side */
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


/* The backward with the dweight/dbias sums in registers: lane l of a warp owns the 16-byte vectors
 * j * 32 + l (j < NV) of every row it sees, so its sums need no shared memory until the end. */
template <typename T, int NV>
static __global__ void __launch_bounds__(LN_REG_WARPS *ZT_WARP_SIZE)
    layernorm_backward_reg_kernel(T *__restrict__ dinp, float *__restrict__ partials, const T *__restrict__ dout,
                                  const T *__restrict__ inp, const T *__restrict__ weight,
                                  const float *__restrict__ mean, const float *__restrict__ rstd, int N, int C)
{
    constexpr int VS = zt_vec<T>::size;
    extern __shared__ float block_sums[]; /* [2C]: dweight then dbias of the block */
    const int lane = threadIdx.x % ZT_WARP_SIZE, warp = threadIdx.x / ZT_WARP_SIZE;
    float dw[NV][VS], db[NV][VS];
    for (int j = 0; j < NV; j++)
        for (int k = 0; k < VS; k++)
            dw[j][k] = db[j][k] = 0.0f;

    for (int row = blockIdx.x * LN_REG_WARPS + warp; row < N; row += gridDim.x * LN_REG_WARPS) {
        const T *x = inp + (size_t)row * C;
        const T *g = dout + (size_t)row * C;
        const float m = mean[row], s = rstd[row];

        float a = 0.0f, b = 0.0f; /* sums of dnorm and dnorm * norm */
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int c = (j * ZT_WARP_SIZE + lane) * VS;
            if (c < C) {
                zt_vec<T> xv = zt_load_vec(x + c), gv = zt_load_vec(g + c), wv = zt_load_vec(weight + c);
                for (int k = 0; k < VS; k++) {
                    float norm = (zt_to_float(xv.v[k]) - m) * s;
                    float dnorm = zt_to_float(wv.v[k]) * zt_to_float(gv.v[k]);
                    a += dnorm;
                    b += dnorm * norm;
                }
            }
        }
        a = zt_warp_sum(a) / C;
        b = zt_warp_sum(b) / C;

        T *d = dinp + (size_t)row * C;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int c = (j * ZT_WARP_SIZE + lane) * VS;
            if (c < C) {
                zt_vec<T> xv = zt_load_vec_cs(x + c), gv = zt_load_vec_cs(g + c), wv = zt_load_vec(weight + c);
                zt_vec<T> dv = zt_load_vec(d + c);
                for (int k = 0; k < VS; k++) {
                    float norm = (zt_to_float(xv.v[k]) - m) * s;
                    float gk = zt_to_float(gv.v[k]);
                    float dnorm = zt_to_float(wv.v[k]) * gk;
                    dv.v[k] = zt_from_float<T>(zt_to_float(dv.v[k]) + (dnorm - a - norm * b) * s);
                    dw[j][k] += norm * gk;
                    db[j][k] += gk;
                }
                zt_store_vec(d + c, dv);
            }
        }
    }

    /* The block's sums, warps added in order: warp 0 stores, then each next warp adds. */
    for (int w = 0; w < LN_REG_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int c = (j * ZT_WARP_SIZE + lane) * VS;
                if (c < C)
                    for (int k = 0; k < VS; k++) {
                        block_sums[c + k] = (w == 0 ? 0.0f : block_sums[c + k]) + dw[j][k];
                        block_sums[C + c + k] = (w == 0 ? 0.0f : block_sums[C + c + k]) + db[j][k];
                    }
            }
        }
        __syncthreads();
    }
    float *out = partials + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x)
        out[c] = block_sums[c];
}

/* dweight[c] += sum over blocks of partials[blk][c], dbias likewise. Each block owns 32 of the 2C columns;
 * its LN_RED_ROWS warps sum the partial rows r, r + LN_RED_ROWS, ... in order, then warp 0 adds the
 * warps' sums in order: a fixed order for given nblocks. */
template <typename T>
static __global__ void __launch_bounds__(LN_RED_ROWS *ZT_WARP_SIZE)
    layernorm_backward_reduce_kernel(T *__restrict__ dweight, T *__restrict__ dbias,
                                     const float *__restrict__ partials, int nblocks, int C)
{
    __shared__ float part[LN_RED_ROWS][ZT_WARP_SIZE];
    const int lane = threadIdx.x % ZT_WARP_SIZE, r = threadIdx.x / ZT_WARP_SIZE;
    const int col = blockIdx.x * ZT_WARP_SIZE + lane; /* in [0, 2C): dweight, then dbias */
    float acc = 0.0f;
    if (col < 2 * C)
        for (int blk = r; blk < nblocks; blk += LN_RED_ROWS)
            acc += partials[(size_t)blk * 2 * C + col];
    part[r][lane] = acc;
    __syncthreads();
    if (r != 0 || col >= 2 * C)
        return;
    float sum = 0.0f;
    for (int i = 0; i < LN_RED_ROWS; i++)
        sum += part[i][lane];
    T *dst = col < C ? dweight + col : dbias + (col - C);
    *dst = zt_from_float<T>(zt_to_float(*dst) + sum);
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

/* 16-byte vectors per lane and row in the register kernel; 0 if C is too wide for it. */
static int ln_reg_vecs(int C, size_t esize)
{
    int per_vec = ZT_WARP_SIZE * (int)(16 / esize);
    int nv = ZT_CEIL_DIV(C, per_vec);
    return nv <= LN_REG_MAX_VECS ? nv : 0;
}

/* Blocks of the register kernel: one wave on 132 SMs at the occupancy its registers allow (about 80,
 * 128 and 168 registers a thread for up to 3, 5 and 8 vectors), fewer for small N. A function of N and
 * nv alone, never of the GPU, so that the sums' order is the same everywhere. */
static int ln_reg_blocks(int N, int nv)
{
    int per_sm = nv <= 3 ? 6 : nv <= 5 ? 4 : 3;
    int b = ZT_CEIL_DIV(N, LN_REG_WARPS), most = per_sm * LN_REG_SMS;
    return b > most ? most : b;
}

extern "C" size_t zt_cuda_layernorm_backward_scratch_size(int N, int C)
{
    int b = ln_bwd_blocks(N, C);
    for (size_t esize = 2; esize <= 4; esize += 2) {
        int nv = ln_reg_vecs(C, esize);
        if (nv > 0 && ln_reg_blocks(N, nv) > b)
            b = ln_reg_blocks(N, nv);
    }
    return (size_t)b * 2 * C * sizeof(float);
}

template <typename T, int NV>
static void launch_reg(T *dinp, float *partials, const T *dout, const T *inp, const T *weight, const float *mean,
                       const float *rstd, int N, int C, int blocks, cudaStream_t stream)
{
    layernorm_backward_reg_kernel<T, NV><<<blocks, LN_REG_WARPS * ZT_WARP_SIZE, 2 * C * sizeof(float), stream>>>(
        dinp, partials, dout, inp, weight, mean, rstd, N, C);
}

template <typename T>
static void layernorm_backward(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight,
                               const float *mean, const float *rstd, int N, int C, void *scratch,
                               cudaStream_t stream)
{
    float *partials = (float *)scratch;
    int blocks;
    const int nv = ln_reg_vecs(C, sizeof(T));
    if (nv > 0) {
        blocks = ln_reg_blocks(N, nv);
        switch (nv) {
        case 1: launch_reg<T, 1>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        case 2: launch_reg<T, 2>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        case 3: launch_reg<T, 3>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        case 4: launch_reg<T, 4>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        case 5: launch_reg<T, 5>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        case 6: launch_reg<T, 6>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        case 7: launch_reg<T, 7>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        default: launch_reg<T, 8>(dinp, partials, dout, inp, weight, mean, rstd, N, C, blocks, stream); break;
        }
    } else {
        int warps = ln_bwd_warps(C);
        blocks = ln_bwd_blocks(N, C);
        size_t smem = (size_t)warps * 2 * C * sizeof(float);
        layernorm_backward_kernel<<<blocks, warps * ZT_WARP_SIZE, smem, stream>>>(dinp, partials, dout, inp, weight,
                                                                                  mean, rstd, N, C);
    }
    ZT_CUDA_CHECK_LAUNCH();
    layernorm_backward_reduce_kernel<<<ZT_CEIL_DIV(2 * C, ZT_WARP_SIZE), LN_RED_ROWS * ZT_WARP_SIZE, 0, stream>>>(
        dweight, dbias, partials, blocks, C);
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
