/* Layer normalisation on the GPU (kernels/layernorm.h): one warp per row, 16-byte loads, fp32 math.
 *
 * Backward, rows of at most LN_ROW_MAX_VECS 16-byte vectors per lane (C <= 2048 in 16-bit types, C <= 1024
 * in fp32): two kernels. The column sums of dweight and dbias run over a fixed grid of column strips and
 * row slices (a function of N and C alone); each slice writes one partial row to scratch. Then the input
 * gradient, one warp per row with the row in registers. Wider rows: one kernel in which each warp keeps
 * fp32 running sums of dweight and dbias in shared memory over the rows it sees, and each block writes
 * its warps' sums, added in warp order, as one partial row. Either way a last kernel adds the partial rows
 * in a fixed order, so the result is the same bits on every run and every GPU. */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/layernorm.h"

#define LN_BWD_BLOCKS 256        /* fixed, for determinism across GPUs */
#define LN_ROW_WARPS 4           /* rows (warps) per block of the input-gradient kernel */
#define LN_ROW_MAX_VECS 8        /* 16-byte vectors per lane and row the input-gradient kernel handles */
#define LN_COL_WARPS 4           /* warps per block of the weight/bias column sums */
#define LN_COL_SLICES 128        /* at most this many row slices of the column sums */
#define LN_COL_MIN_ROWS 64       /* and at least this many rows in each */
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

/* ACC: dinp += dx; else dinp = 0 + dx (the same bits, without reading dinp). */
template <typename T, bool ACC>
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
            zt_vec<T> dv;
            if (ACC)
                dv = zt_load_vec(d + c);
            for (int k = 0; k < VS; k++) {
                float norm = (zt_to_float(xv.v[k]) - m) * s;
                float gk = zt_to_float(gv.v[k]);
                float dnorm = zt_to_float(wv.v[k]) * gk;
                dv.v[k] = zt_from_float<T>((ACC ? zt_to_float(dv.v[k]) : 0.0f) + (dnorm - a - norm * b) * s);
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


/* The backward's input gradient, one warp per row: lane l holds the 16-byte vectors j * 32 + l (j < NV)
 * of x, dout and dinp in registers, so the row is read once, its two sums are reduced, and dinp is
 * written; the weight (C elements) stays in L1. No weight-gradient sums here (see the kernel below), so
 * few registers and many rows in flight. */
template <typename T, int NV, bool ACC>
static __global__ void __launch_bounds__(LN_ROW_WARPS *ZT_WARP_SIZE)
    layernorm_backward_dx_kernel(T *__restrict__ dinp, const T *__restrict__ dout, const T *__restrict__ inp,
                                 const T *__restrict__ weight, const float *__restrict__ mean,
                                 const float *__restrict__ rstd, int N, int C)
{
    constexpr int VS = zt_vec<T>::size;
    const int lane = threadIdx.x % ZT_WARP_SIZE;
    const int row = blockIdx.x * LN_ROW_WARPS + threadIdx.x / ZT_WARP_SIZE;
    if (row >= N)
        return;
    const T *x = inp + (size_t)row * C;
    const T *g = dout + (size_t)row * C;
    T *d = dinp + (size_t)row * C;
    const float m = mean[row], s = rstd[row];
    zt_vec<T> xv[NV], gv[NV], dv[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int c = (j * ZT_WARP_SIZE + lane) * VS;
        if (c < C) {
            xv[j] = zt_load_vec(x + c);
            gv[j] = zt_load_vec(g + c);
            if (ACC)
                dv[j] = zt_load_vec(d + c);
        }
    }

    float a = 0.0f, b = 0.0f; /* sums of dnorm and dnorm * norm */
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int c = (j * ZT_WARP_SIZE + lane) * VS;
        if (c < C) {
            zt_vec<T> wv = zt_load_vec(weight + c);
            for (int k = 0; k < VS; k++) {
                float norm = (zt_to_float(xv[j].v[k]) - m) * s;
                float dnorm = zt_to_float(wv.v[k]) * zt_to_float(gv[j].v[k]);
                a += dnorm;
                b += dnorm * norm;
            }
        }
    }
    a = zt_warp_sum(a) / C;
    b = zt_warp_sum(b) / C;

#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int c = (j * ZT_WARP_SIZE + lane) * VS;
        if (c < C) {
            zt_vec<T> wv = zt_load_vec(weight + c);
            for (int k = 0; k < VS; k++) {
                float norm = (zt_to_float(xv[j].v[k]) - m) * s;
                float dnorm = zt_to_float(wv.v[k]) * zt_to_float(gv[j].v[k]);
                dv[j].v[k] = zt_from_float<T>((ACC ? zt_to_float(dv[j].v[k]) : 0.0f) + (dnorm - a - norm * b) * s);
            }
            zt_store_vec(d + c, dv[j]);
        }
    }
}

/* The backward's weight and bias gradients as column sums: block (strip, slice) covers the 32 * VS columns
 * of strip blockIdx.x (lane l owns one 16-byte vector of them) over the rows of slice blockIdx.y; its
 * warps take every LN_COL_WARPS-th row in order, and warp 0 adds the warps' sums in warp order into the
 * slice's partial row (dweight then dbias, 2C floats). The slices are summed by the reduce kernel. */
template <typename T>
static __global__ void __launch_bounds__(LN_COL_WARPS *ZT_WARP_SIZE)
    layernorm_backward_dwdb_kernel(float *__restrict__ partials, const T *__restrict__ dout,
                                   const T *__restrict__ inp, const float *__restrict__ mean,
                                   const float *__restrict__ rstd, int N, int C, int rows_per_slice)
{
    constexpr int VS = zt_vec<T>::size;
    __shared__ float sums[LN_COL_WARPS][2][ZT_WARP_SIZE * VS];
    const int lane = threadIdx.x % ZT_WARP_SIZE, warp = threadIdx.x / ZT_WARP_SIZE;
    const int c = (blockIdx.x * ZT_WARP_SIZE + lane) * VS;
    const int r0 = blockIdx.y * rows_per_slice, r1 = min(N, r0 + rows_per_slice);
    float dw[VS], db[VS];
    for (int k = 0; k < VS; k++)
        dw[k] = db[k] = 0.0f;
    if (c < C) {
#pragma unroll 4
        for (int r = r0 + warp; r < r1; r += LN_COL_WARPS) {
            const float m = mean[r], s = rstd[r];
            const zt_vec<T> xv = zt_load_vec(inp + (size_t)r * C + c), gv = zt_load_vec(dout + (size_t)r * C + c);
            for (int k = 0; k < VS; k++) {
                const float gk = zt_to_float(gv.v[k]);
                dw[k] += (zt_to_float(xv.v[k]) - m) * s * gk;
                db[k] += gk;
            }
        }
    }
    for (int k = 0; k < VS; k++) {
        sums[warp][0][lane * VS + k] = dw[k];
        sums[warp][1][lane * VS + k] = db[k];
    }
    __syncthreads();
    if (warp != 0 || c >= C)
        return;
    float *out = partials + (size_t)blockIdx.y * 2 * C;
    for (int k = 0; k < VS; k++) {
        float w_sum = 0.0f, b_sum = 0.0f;
        for (int w = 0; w < LN_COL_WARPS; w++) {
            w_sum += sums[w][0][lane * VS + k];
            b_sum += sums[w][1][lane * VS + k];
        }
        out[c + k] = w_sum;
        out[C + c + k] = b_sum;
    }
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

/* 16-byte vectors per lane and row in the row kernel; 0 if C is too wide for it. */
static int ln_row_vecs(int C, size_t esize)
{
    int per_vec = ZT_WARP_SIZE * (int)(16 / esize);
    int nv = ZT_CEIL_DIV(C, per_vec);
    return nv <= LN_ROW_MAX_VECS ? nv : 0;
}

/* Row slices of the column-sum kernel: a function of N alone, so the sums' order is the same everywhere. */
static int ln_col_slices(int N)
{
    int s = ZT_CEIL_DIV(N, LN_COL_MIN_ROWS);
    return s > LN_COL_SLICES ? LN_COL_SLICES : s;
}

extern "C" size_t zt_cuda_layernorm_backward_scratch_size(int N, int C)
{
    int b = ln_bwd_blocks(N, C);
    if (ln_col_slices(N) > b)
        b = ln_col_slices(N);
    return (size_t)b * 2 * C * sizeof(float);
}

template <typename T, int NV, bool ACC>
static void launch_dx(T *dinp, const T *dout, const T *inp, const T *weight, const float *mean, const float *rstd,
                      int N, int C, cudaStream_t stream)
{
    layernorm_backward_dx_kernel<T, NV, ACC><<<ZT_CEIL_DIV(N, LN_ROW_WARPS), LN_ROW_WARPS * ZT_WARP_SIZE, 0,
                                               stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
}

template <typename T, bool ACC>
static void layernorm_backward(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight,
                               const float *mean, const float *rstd, int N, int C, void *scratch,
                               cudaStream_t stream)
{
    float *partials = (float *)scratch;
    int blocks;
    const int nv = ln_row_vecs(C, sizeof(T));
    if (nv > 0) {
        /* The weight and bias sums first (they read x and dout, which the row kernel then finds in L2). */
        blocks = ln_col_slices(N);
        const int rows_per_slice = ZT_CEIL_DIV(N, blocks);
        dim3 grid(ZT_CEIL_DIV(C, ZT_WARP_SIZE * zt_vec<T>::size), blocks);
        layernorm_backward_dwdb_kernel<T><<<grid, LN_COL_WARPS * ZT_WARP_SIZE, 0, stream>>>(
            partials, dout, inp, mean, rstd, N, C, rows_per_slice);
        ZT_CUDA_CHECK_LAUNCH();
        switch (nv) {
        case 1: launch_dx<T, 1, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        case 2: launch_dx<T, 2, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        case 3: launch_dx<T, 3, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        case 4: launch_dx<T, 4, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        case 5: launch_dx<T, 5, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        case 6: launch_dx<T, 6, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        case 7: launch_dx<T, 7, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        default: launch_dx<T, 8, ACC>(dinp, dout, inp, weight, mean, rstd, N, C, stream); break;
        }
    } else {
        int warps = ln_bwd_warps(C);
        blocks = ln_bwd_blocks(N, C);
        size_t smem = (size_t)warps * 2 * C * sizeof(float);
        layernorm_backward_kernel<T, ACC><<<blocks, warps * ZT_WARP_SIZE, smem, stream>>>(dinp, partials, dout, inp,
                                                                                          weight, mean, rstd, N, C);
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

template <bool ACC>
static void layernorm_backward_any(void *dinp, void *dweight, void *dbias, const void *dout, const void *inp,
                                   const void *weight, const float *mean, const float *rstd, int N, int C,
                                   void *scratch, enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(N > 0 && C > 0 && C % 8 == 0 && C <= LN_MAX_C);
    ZT_ASSERT(zt_aligned16(dinp) && zt_aligned16(dout) && zt_aligned16(inp) && zt_aligned16(weight));
    ZT_ASSERT(zt_aligned16(scratch));
    switch (dtype) {
    case ZT_DTYPE_F32:
        layernorm_backward<float, ACC>((float *)dinp, (float *)dweight, (float *)dbias, (const float *)dout,
                                       (const float *)inp, (const float *)weight, mean, rstd, N, C, scratch, stream);
        break;
    case ZT_DTYPE_F16:
        layernorm_backward<__half, ACC>((__half *)dinp, (__half *)dweight, (__half *)dbias, (const __half *)dout,
                                        (const __half *)inp, (const __half *)weight, mean, rstd, N, C, scratch,
                                        stream);
        break;
    case ZT_DTYPE_BF16:
        layernorm_backward<__nv_bfloat16, ACC>((__nv_bfloat16 *)dinp, (__nv_bfloat16 *)dweight,
                                               (__nv_bfloat16 *)dbias, (const __nv_bfloat16 *)dout,
                                               (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)weight, mean, rstd,
                                               N, C, scratch, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_layernorm_backward", dtype);
    }
}

extern "C" void zt_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout,
                                           const void *inp, const void *weight, const float *mean,
                                           const float *rstd, int N, int C, void *scratch, enum zt_dtype dtype,
                                           cudaStream_t stream)
{
    layernorm_backward_any<true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, scratch, dtype, stream);
}

extern "C" void zt_cuda_layernorm_backward_overwrite(void *dinp, void *dweight, void *dbias, const void *dout,
                                                     const void *inp, const void *weight, const float *mean,
                                                     const float *rstd, int N, int C, void *scratch,
                                                     enum zt_dtype dtype, cudaStream_t stream)
{
    layernorm_backward_any<false>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, scratch, dtype, stream);
}
