/* RMS normalisation on the GPU (kernels/rmsnorm.h): one warp per row, fp32 math.
 *
 * Every kernel comes in two builds (VEC): 16-byte loads of VS = 16 / sizeof(T) elements where each row's
 * length in bytes is a multiple of 16 and the buffers are 16-byte aligned, one element at a time
 * otherwise (any C). A lane owns elements (j * 32 + lane) * VS + k of a row.
 *
 * Backward: the input gradient, one warp per row (the row is read twice, the second time from L1/L2);
 * the weight gradient as column sums over a fixed number of row slices (a function of N alone), each
 * slice written as one partial row of scratch, then added in slice order by a last kernel. So the result
 * is the same bits on every run and every GPU, without atomics. */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/rmsnorm.h"

#define RMS_ROW_WARPS 8      /* rows (warps) per block of the row kernels */
#define RMS_COL_THREADS 128  /* threads (column groups) per block of the column sums */
#define RMS_COL_SLICES 128   /* at most this many row slices of the column sums */
#define RMS_COL_MIN_ROWS 64  /* and at least this many rows in each */

/* n elements of a row at p (n = VS with VEC, else 1) as fp32, and back. */
template <typename T, bool VEC> struct rms_io {
    static constexpr int ELEMS = VEC ? zt_vec<T>::size : 1;
    __device__ __forceinline__ static void load(float (&f)[ELEMS], const T *p)
    {
        if constexpr (VEC) {
            zt_vec<T> v = zt_load_vec(p);
#pragma unroll
            for (int k = 0; k < ELEMS; k++)
                f[k] = zt_to_float(v.v[k]);
        } else {
            f[0] = zt_to_float(*p);
        }
    }
    __device__ __forceinline__ static void store(T *p, const float (&f)[ELEMS])
    {
        if constexpr (VEC) {
            zt_vec<T> v;
#pragma unroll
            for (int k = 0; k < ELEMS; k++)
                v.v[k] = zt_from_float<T>(f[k]);
            zt_store_vec(p, v);
        } else {
            *p = zt_from_float<T>(f[0]);
        }
    }
};

template <typename T, bool VEC>
static __global__ void __launch_bounds__(RMS_ROW_WARPS *ZT_WARP_SIZE)
    rmsnorm_forward_kernel(T *__restrict__ out, float *__restrict__ rstd, const T *__restrict__ inp,
                           const T *__restrict__ weight, int N, int C, float eps)
{
    using io = rms_io<T, VEC>;
    constexpr int VS = io::ELEMS;
    const int lane = threadIdx.x % ZT_WARP_SIZE;
    const int row = blockIdx.x * RMS_ROW_WARPS + threadIdx.x / ZT_WARP_SIZE;
    if (row >= N)
        return;
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;

    float ss = 0.0f;
    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        float xv[VS];
        io::load(xv, x + c);
#pragma unroll
        for (int k = 0; k < VS; k++)
            ss += xv[k] * xv[k];
    }
    const float s = rsqrtf(zt_warp_sum(ss) / C + eps);

    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        float xv[VS], wv[VS], r[VS];
        io::load(xv, x + c);
        io::load(wv, weight + c);
#pragma unroll
        for (int k = 0; k < VS; k++)
            r[k] = xv[k] * s * wv[k];
        io::store(o + c, r);
    }
    if (lane == 0)
        rstd[row] = s;
}

/* dinp += rstd * (g - x * rstd^2 * mean(g * x)) with g = dout * weight, one warp per row. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(RMS_ROW_WARPS *ZT_WARP_SIZE)
    rmsnorm_backward_dx_kernel(T *__restrict__ dinp, const T *__restrict__ dout, const T *__restrict__ inp,
                               const T *__restrict__ weight, const float *__restrict__ rstd, int N, int C)
{
    using io = rms_io<T, VEC>;
    constexpr int VS = io::ELEMS;
    const int lane = threadIdx.x % ZT_WARP_SIZE;
    const int row = blockIdx.x * RMS_ROW_WARPS + threadIdx.x / ZT_WARP_SIZE;
    if (row >= N)
        return;
    const T *x = inp + (size_t)row * C, *g = dout + (size_t)row * C;
    T *d = dinp + (size_t)row * C;
    const float s = rstd[row];

    float a = 0.0f;
    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        float xv[VS], gv[VS], wv[VS];
        io::load(xv, x + c);
        io::load(gv, g + c);
        io::load(wv, weight + c);
#pragma unroll
        for (int k = 0; k < VS; k++)
            a += gv[k] * wv[k] * xv[k];
    }
    const float kx = zt_warp_sum(a) / C * s * s;

    for (int c = lane * VS; c < C; c += ZT_WARP_SIZE * VS) {
        float xv[VS], gv[VS], wv[VS], dv[VS];
        io::load(xv, x + c);
        io::load(gv, g + c);
        io::load(wv, weight + c);
        io::load(dv, d + c);
#pragma unroll
        for (int k = 0; k < VS; k++)
            dv[k] += s * (gv[k] * wv[k] - xv[k] * kx);
        io::store(d + c, dv);
    }
}

/* The weight gradient's partial column sums: thread i of block (strip, slice) owns the VS columns
 * (strip * RMS_COL_THREADS + i) * VS.. and sums dout * x * rstd over the rows of slice blockIdx.y in
 * order, into row blockIdx.y of partials [slices, C]. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(RMS_COL_THREADS)
    rmsnorm_backward_dw_kernel(float *__restrict__ partials, const T *__restrict__ dout, const T *__restrict__ inp,
                               const float *__restrict__ rstd, int N, int C, int rows_per_slice)
{
    using io = rms_io<T, VEC>;
    constexpr int VS = io::ELEMS;
    const int c = (blockIdx.x * RMS_COL_THREADS + threadIdx.x) * VS;
    if (c >= C)
        return;
    const int r0 = blockIdx.y * rows_per_slice, r1 = min(N, r0 + rows_per_slice);
    float acc[VS];
#pragma unroll
    for (int k = 0; k < VS; k++)
        acc[k] = 0.0f;
    for (int r = r0; r < r1; r++) {
        float xv[VS], gv[VS];
        io::load(xv, inp + (size_t)r * C + c);
        io::load(gv, dout + (size_t)r * C + c);
        const float s = rstd[r];
#pragma unroll
        for (int k = 0; k < VS; k++)
            acc[k] += gv[k] * (xv[k] * s);
    }
    float *p = partials + (size_t)blockIdx.y * C + c;
#pragma unroll
    for (int k = 0; k < VS; k++)
        p[k] = acc[k];
}

/* dweight[c] += the partial rows' column c, added in slice order. One thread per column. */
template <typename T>
static __global__ void rmsnorm_backward_reduce_kernel(T *__restrict__ dweight, const float *__restrict__ partials,
                                                      int slices, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int s = 0; s < slices; s++)
        acc += partials[(size_t)s * C + c];
    dweight[c] = zt_from_float<T>(zt_to_float(dweight[c]) + acc);
}

/* Row slices of the column sums: a function of N alone, so the order of the sums is too. */
static int rms_slices(int N)
{
    int s = ZT_CEIL_DIV(N, RMS_COL_MIN_ROWS);
    return s > RMS_COL_SLICES ? RMS_COL_SLICES : s;
}

extern "C" size_t zt_cuda_rmsnorm_backward_scratch_size(int N, int C)
{
    return (size_t)rms_slices(N) * C * sizeof(float);
}

/* Whether the rows can be read 16 bytes at a time. */
template <typename T> static bool rms_vec(int C, const void *const *ptrs, int nptrs)
{
    if (((size_t)C * sizeof(T)) % 16 != 0)
        return false;
    for (int i = 0; i < nptrs; i++)
        if (!zt_aligned16(ptrs[i]))
            return false;
    return true;
}

template <typename T>
static void rmsnorm_forward(T *out, float *rstd, const T *inp, const T *weight, int N, int C, float eps,
                            cudaStream_t stream)
{
    const void *ptrs[3] = {out, inp, weight};
    const unsigned grid = (unsigned)ZT_CEIL_DIV(N, RMS_ROW_WARPS);
    if (rms_vec<T>(C, ptrs, 3))
        rmsnorm_forward_kernel<T, true><<<grid, RMS_ROW_WARPS * ZT_WARP_SIZE, 0, stream>>>(out, rstd, inp, weight, N,
                                                                                          C, eps);
    else
        rmsnorm_forward_kernel<T, false><<<grid, RMS_ROW_WARPS * ZT_WARP_SIZE, 0, stream>>>(out, rstd, inp, weight,
                                                                                           N, C, eps);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T, bool VEC>
static void rmsnorm_backward_vec(T *dinp, T *dweight, const T *dout, const T *inp, const T *weight,
                                 const float *rstd, int N, int C, float *partials, cudaStream_t stream)
{
    constexpr int VS = VEC ? zt_vec<T>::size : 1;
    const int slices = rms_slices(N);
    /* The column sums first: they read x and dout, which the row kernel then finds in L2. */
    dim3 grid(ZT_CEIL_DIV(ZT_CEIL_DIV(C, VS), RMS_COL_THREADS), slices);
    rmsnorm_backward_dw_kernel<T, VEC><<<grid, RMS_COL_THREADS, 0, stream>>>(partials, dout, inp, rstd, N, C,
                                                                            ZT_CEIL_DIV(N, slices));
    ZT_CUDA_CHECK_LAUNCH();
    rmsnorm_backward_dx_kernel<T, VEC><<<ZT_CEIL_DIV(N, RMS_ROW_WARPS), RMS_ROW_WARPS * ZT_WARP_SIZE, 0, stream>>>(
        dinp, dout, inp, weight, rstd, N, C);
    ZT_CUDA_CHECK_LAUNCH();
    rmsnorm_backward_reduce_kernel<T><<<ZT_CEIL_DIV(C, 256), 256, 0, stream>>>(dweight, partials, slices, C);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T>
static void rmsnorm_backward(T *dinp, T *dweight, const T *dout, const T *inp, const T *weight, const float *rstd,
                             int N, int C, void *scratch, cudaStream_t stream)
{
    const void *ptrs[4] = {dinp, dout, inp, weight};
    if (rms_vec<T>(C, ptrs, 4))
        rmsnorm_backward_vec<T, true>(dinp, dweight, dout, inp, weight, rstd, N, C, (float *)scratch, stream);
    else
        rmsnorm_backward_vec<T, false>(dinp, dweight, dout, inp, weight, rstd, N, C, (float *)scratch, stream);
}

extern "C" void zt_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                                        float eps, enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(N > 0 && C > 0);
    switch (dtype) {
    case ZT_DTYPE_F32:
        rmsnorm_forward((float *)out, rstd, (const float *)inp, (const float *)weight, N, C, eps, stream);
        break;
    case ZT_DTYPE_F16:
        rmsnorm_forward((__half *)out, rstd, (const __half *)inp, (const __half *)weight, N, C, eps, stream);
        break;
    case ZT_DTYPE_BF16:
        rmsnorm_forward((__nv_bfloat16 *)out, rstd, (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)weight, N, C,
                        eps, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_rmsnorm_forward", dtype);
    }
}

extern "C" void zt_cuda_rmsnorm_backward(void *dinp, void *dweight, const void *dout, const void *inp,
                                         const void *weight, const float *rstd, int N, int C, void *scratch,
                                         enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(N > 0 && C > 0);
    ZT_ASSERT(zt_aligned16(scratch));
    switch (dtype) {
    case ZT_DTYPE_F32:
        rmsnorm_backward((float *)dinp, (float *)dweight, (const float *)dout, (const float *)inp,
                         (const float *)weight, rstd, N, C, scratch, stream);
        break;
    case ZT_DTYPE_F16:
        rmsnorm_backward((__half *)dinp, (__half *)dweight, (const __half *)dout, (const __half *)inp,
                         (const __half *)weight, rstd, N, C, scratch, stream);
        break;
    case ZT_DTYPE_BF16:
        rmsnorm_backward((__nv_bfloat16 *)dinp, (__nv_bfloat16 *)dweight, (const __nv_bfloat16 *)dout,
                         (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)weight, rstd, N, C, scratch, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_rmsnorm_backward", dtype);
    }
}
