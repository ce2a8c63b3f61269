/* Causal self-attention on the GPU, flash style (kernels/attention.h).
 *
 * Forward: a block owns a tile of TILE queries of one (batch, head) and walks the key tiles up to the
 * diagonal. Q, K, V tiles sit in shared memory in the storage type; scores, the online softmax (running
 * max m and sum l per row, in base 2) and the output accumulator are fp32 in registers. The block saves
 * lse = m + log(l) per row for the backward pass.
 *
 * Backward (FlashAttention-2's equations, with D = rowsum(dout * out) precomputed):
 *   P = exp(S - lse),  dV += P^T dO,  dP = dO V^T,  dS = P (dP - D),  dK += dS^T Q,  dQ += dS K
 * split into two kernels so that no element is written by two blocks: one over key tiles computes dK
 * and dV (walking the query tiles from the diagonal down), one over query tiles computes dQ (walking the
 * key tiles up to the diagonal). The scores are recomputed in both; the price of determinism.
 *
 * Threads: 256 as a 16 x 16 grid (ty, tx). A thread owns TILE/16 rows (ty * TM + i) of a tile and the
 * columns tx + 16 j of scores and of head channels, so the 16 threads of a half-warp share rows (row
 * reductions are 4 shuffles) and read consecutive columns. Shared rows are padded by one 32-bit word,
 * which makes both row-wise and column-wise reads free of bank conflicts; score tiles are padded so that
 * the two half-warps of a warp write different banks.
 *
 * Tiles are sized so a kernel needs at most 64 KiB of shared memory (sm_75's limit): TILE = 64 for
 * 16-bit types at head size 64, smaller for fp32 or head size 128. This is CUDA-core (SIMT) code; a
 * tensor-core version is the next step for speed. */
#include <math.h>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_utils.cuh"

#define ATT_THREADS 256
#define LOG2E 1.4426950408889634f

template <typename T, int HS> struct att_cfg {
    static constexpr int TILE_RAW = 8192 / (HS * (int)sizeof(T));
    static constexpr int TILE = TILE_RAW > 64 ? 64 : (TILE_RAW < 16 ? 16 : TILE_RAW);
    static constexpr int EPW = 4 / (int)sizeof(T);       /* elements per 32-bit word */
    static constexpr int ROW = HS + EPW;                  /* padded shared row, in elements */
    static constexpr int TM = TILE / 16;                  /* tile rows per thread */
    static constexpr int TN = TILE / 16;                  /* score columns per thread */
    static constexpr int TH = HS / 16;                    /* head channels per thread */
    static constexpr int PS = TILE + (TM == 1 ? 0 : 16 / TM); /* score-tile row stride (floats) */
    static constexpr size_t tile_bytes = (size_t)TILE * ROW * sizeof(T);
    static constexpr size_t score_bytes = (size_t)TILE * PS * sizeof(float);
};

/* Copies rows [t0, t0 + TILE) of one head's slice (q, k or v) of qkv into a padded shared tile; rows past
 * T are zero. base points at column 0 of that slice in row 0 of the batch; stride is 3C. */
template <typename T, int HS>
__device__ __forceinline__ void load_tile(T *tile, const T *base, int t0, int T_, int stride)
{
    using cfg = att_cfg<T, HS>;
    constexpr int WPR = HS / cfg::EPW; /* words per row */
    for (int idx = threadIdx.x; idx < cfg::TILE * WPR; idx += ATT_THREADS) {
        int r = idx / WPR, w = idx % WPR;
        int t = t0 + r;
        uint32_t val = 0;
        if (t < T_)
            val = reinterpret_cast<const uint32_t *>(base + (size_t)t * stride)[w];
        reinterpret_cast<uint32_t *>(tile + r * cfg::ROW)[w] = val;
    }
}

/* Two consecutive elements (index d even) of a shared row as floats. */
template <typename T> __device__ __forceinline__ float2 load_pair(const T *p);
template <> __device__ __forceinline__ float2 load_pair<float>(const float *p) { return make_float2(p[0], p[1]); }
template <> __device__ __forceinline__ float2 load_pair<__half>(const __half *p)
{
    return __half22float2(*reinterpret_cast<const __half2 *>(p));
}
template <> __device__ __forceinline__ float2 load_pair<__nv_bfloat16>(const __nv_bfloat16 *p)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}

/* acc[i][j] = dot(A row (ty*TM + i), B row (tx + 16 j)) over HS channels; A, B padded shared tiles. */
template <typename T, int HS>
__device__ __forceinline__ void tile_dot(float (&acc)[att_cfg<T, HS>::TM][att_cfg<T, HS>::TN], const T *A,
                                         const T *B, int ty, int tx)
{
    using cfg = att_cfg<T, HS>;
#pragma unroll
    for (int i = 0; i < cfg::TM; i++)
#pragma unroll
        for (int j = 0; j < cfg::TN; j++)
            acc[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HS; d += 2) {
        float2 a[cfg::TM], b[cfg::TN];
#pragma unroll
        for (int i = 0; i < cfg::TM; i++)
            a[i] = load_pair(A + (ty * cfg::TM + i) * cfg::ROW + d);
#pragma unroll
        for (int j = 0; j < cfg::TN; j++)
            b[j] = load_pair(B + (tx + 16 * j) * cfg::ROW + d);
#pragma unroll
        for (int i = 0; i < cfg::TM; i++)
#pragma unroll
            for (int j = 0; j < cfg::TN; j++)
                acc[i][j] += a[i].x * b[j].x + a[i].y * b[j].y;
    }
}

/* acc[i][j] += sum over c < TILE of S[(ty*TM + i) * PS + c] * X[c * ROW + tx + 16 j]: a score tile in
 * shared fp32 times a padded shared tile of the storage type. */
template <typename T, int HS>
__device__ __forceinline__ void tile_mul_acc(float (&acc)[att_cfg<T, HS>::TM][att_cfg<T, HS>::TH],
                                             const float *S, const T *X, int ty, int tx)
{
    using cfg = att_cfg<T, HS>;
#pragma unroll 4
    for (int c = 0; c < cfg::TILE; c++) {
        float s[cfg::TM], x[cfg::TH];
#pragma unroll
        for (int i = 0; i < cfg::TM; i++)
            s[i] = S[(ty * cfg::TM + i) * cfg::PS + c];
#pragma unroll
        for (int j = 0; j < cfg::TH; j++)
            x[j] = zt_to_float(X[c * cfg::ROW + tx + 16 * j]);
#pragma unroll
        for (int i = 0; i < cfg::TM; i++)
#pragma unroll
            for (int j = 0; j < cfg::TH; j++)
                acc[i][j] += s[i] * x[j];
    }
}

/* Sum / max over the 16 threads of a half-warp (the threads that share a row). */
__device__ __forceinline__ float half_warp_sum(float v)
{
    for (int o = 8; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float half_warp_max(float v)
{
    for (int o = 8; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- forward ---- */

template <typename T, int HS>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv, int T_, int C,
                             int NH, float scale_log2)
{
    using cfg = att_cfg<T, HS>;
    constexpr int TILE = cfg::TILE, TM = cfg::TM, TN = cfg::TN, TH = cfg::TH;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = reinterpret_cast<T *>(smem + cfg::tile_bytes);
    T *Vs = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
    float *Ps = reinterpret_cast<float *>(smem + 3 * cfg::tile_bytes);

    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int qt = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * TILE;
    const int stride = 3 * C;
    const T *base = qkv + (size_t)b * T_ * stride + h * HS;

    load_tile<T, HS>(Qs, base, q0, T_, stride);

    float m[TM], l[TM], o[TM][TH];
#pragma unroll
    for (int i = 0; i < TM; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < TH; j++)
            o[i][j] = 0.0f;
    }

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TILE;
        __syncthreads(); /* the previous tile's readers are done */
        load_tile<T, HS>(Ks, base + C, k0, T_, stride);
        load_tile<T, HS>(Vs, base + 2 * C, k0, T_, stride);
        __syncthreads();

        float s[TM][TN];
        tile_dot<T, HS>(s, Qs, Ks, ty, tx);
#pragma unroll
        for (int i = 0; i < TM; i++) {
            const int r = q0 + ty * TM + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int c = k0 + tx + 16 * j;
                s[i][j] = c <= r ? s[i][j] * scale_log2 : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            /* Key 0 is in the first tile and never masked, so m is finite from the first tile on. */
            const float m_new = fmaxf(m[i], half_warp_max(mx));
            const float alpha = exp2f(m[i] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                float p = exp2f(s[i][j] - m_new);
                sum += p;
                Ps[(ty * TM + i) * cfg::PS + tx + 16 * j] = p;
            }
            l[i] = l[i] * alpha + half_warp_sum(sum);
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < TH; j++)
                o[i][j] *= alpha;
        }
        __syncthreads();
        tile_mul_acc<T, HS>(o, Ps, Vs, ty, tx);
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int r = q0 + ty * TM + i;
        if (r >= T_)
            continue;
        const float inv = 1.0f / l[i];
        T *orow = out + ((size_t)b * T_ + r) * C + h * HS;
#pragma unroll
        for (int j = 0; j < TH; j++)
            orow[tx + 16 * j] = zt_from_float<T>(o[i][j] * inv);
        if (tx == 0)
            lse[(size_t)bh * T_ + r] = (m[i] + log2f(l[i])) / LOG2E;
    }
}

/* ---- backward ---- */

/* D[b,h,t] = sum over the head's channels of dout * out: one warp per (b, t, h). */
template <typename T>
static __global__ void attention_rowdot_kernel(float *__restrict__ D, const T *__restrict__ dout,
                                               const T *__restrict__ out, int B, int T_, int C, int NH)
{
    const int HS = C / NH;
    const int lane = threadIdx.x % ZT_WARP_SIZE;
    const size_t item = (size_t)blockIdx.x * (blockDim.x / ZT_WARP_SIZE) + threadIdx.x / ZT_WARP_SIZE;
    if (item >= (size_t)B * T_ * NH)
        return;
    const int h = (int)(item % NH);
    const size_t bt = item / NH;
    const int t = (int)(bt % T_), b = (int)(bt / T_);
    const T *g = dout + bt * C + h * HS, *o = out + bt * C + h * HS;
    float acc = 0.0f;
    for (int d = lane; d < HS; d += ZT_WARP_SIZE)
        acc += zt_to_float(g[d]) * zt_to_float(o[d]);
    acc = zt_warp_sum(acc);
    if (lane == 0)
        D[((size_t)b * NH + h) * T_ + t] = acc;
}

/* dK, dV of one key tile. */
template <typename T, int HS>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_kv_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                                 const float *__restrict__ lse, const float *__restrict__ D, int T_, int C, int NH,
                                 float scale)
{
    using cfg = att_cfg<T, HS>;
    constexpr int TILE = cfg::TILE, TM = cfg::TM, TN = cfg::TN, TH = cfg::TH;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Ks = reinterpret_cast<T *>(smem);
    T *Vs = reinterpret_cast<T *>(smem + cfg::tile_bytes);
    T *Qs = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
    T *dOs = reinterpret_cast<T *>(smem + 3 * cfg::tile_bytes);
    float *Ps = reinterpret_cast<float *>(smem + 4 * cfg::tile_bytes);
    float *lse_s = Ps + TILE * cfg::PS; /* this query tile's lse * log2(e) */
    float *D_s = lse_s + TILE;

    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int kt = blockIdx.x; /* the first key tiles see the most query tiles: they start first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = kt * TILE;
    const int stride = 3 * C;
    const T *base = qkv + (size_t)b * T_ * stride + h * HS;
    const T *dobase = dout + (size_t)b * T_ * C + h * HS;
    const float scale_log2 = scale * LOG2E;
    const int ntiles = ZT_CEIL_DIV(T_, TILE);

    load_tile<T, HS>(Ks, base + C, k0, T_, stride);
    load_tile<T, HS>(Vs, base + 2 * C, k0, T_, stride);

    float dk[TM][TH], dv[TM][TH];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TH; j++)
            dk[i][j] = dv[i][j] = 0.0f;

    for (int qt = kt; qt < ntiles; qt++) {
        const int q0 = qt * TILE;
        __syncthreads();
        load_tile<T, HS>(Qs, base, q0, T_, stride);
        load_tile<T, HS>(dOs, dobase, q0, T_, C);
        for (int r = threadIdx.x; r < TILE; r += ATT_THREADS) {
            const int t = q0 + r;
            lse_s[r] = t < T_ ? lse[(size_t)bh * T_ + t] * LOG2E : INFINITY; /* P = 0 past T */
            D_s[r] = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
        }
        __syncthreads();

        /* Transposed scores: rows are this thread's keys c, columns queries r = tx + 16 j. */
        float p[TM][TN], dp[TM][TN];
        tile_dot<T, HS>(p, Ks, Qs, ty, tx);
        tile_dot<T, HS>(dp, Vs, dOs, ty, tx);
#pragma unroll
        for (int i = 0; i < TM; i++) {
            const int c = k0 + ty * TM + i;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int rr = tx + 16 * j;
                const int r = q0 + rr;
                float pv = c <= r ? exp2f(p[i][j] * scale_log2 - lse_s[rr]) : 0.0f;
                p[i][j] = pv;
                dp[i][j] = pv * (dp[i][j] - D_s[rr]); /* dS */
                Ps[(ty * TM + i) * cfg::PS + rr] = pv;
            }
        }
        __syncthreads();
        tile_mul_acc<T, HS>(dv, Ps, dOs, ty, tx); /* dV += P^T dO */
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
                Ps[(ty * TM + i) * cfg::PS + tx + 16 * j] = dp[i][j];
        __syncthreads();
        tile_mul_acc<T, HS>(dk, Ps, Qs, ty, tx); /* dK += dS^T Q */
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int c = k0 + ty * TM + i;
        if (c >= T_)
            continue;
        T *row = dqkv + ((size_t)b * T_ + c) * stride + h * HS;
#pragma unroll
        for (int j = 0; j < TH; j++) {
            const int d = tx + 16 * j;
            row[C + d] = zt_from_float<T>(zt_to_float(row[C + d]) + dk[i][j] * scale);
            row[2 * C + d] = zt_from_float<T>(zt_to_float(row[2 * C + d]) + dv[i][j]);
        }
    }
}

/* dQ of one query tile. */
template <typename T, int HS>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_q_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                                const float *__restrict__ lse, const float *__restrict__ D, int T_, int C, int NH,
                                float scale)
{
    using cfg = att_cfg<T, HS>;
    constexpr int TILE = cfg::TILE, TM = cfg::TM, TN = cfg::TN, TH = cfg::TH;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem);
    T *dOs = reinterpret_cast<T *>(smem + cfg::tile_bytes);
    T *Ks = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
    T *Vs = reinterpret_cast<T *>(smem + 3 * cfg::tile_bytes);
    float *Ps = reinterpret_cast<float *>(smem + 4 * cfg::tile_bytes);

    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int qt = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * TILE;
    const int stride = 3 * C;
    const T *base = qkv + (size_t)b * T_ * stride + h * HS;
    const T *dobase = dout + (size_t)b * T_ * C + h * HS;
    const float scale_log2 = scale * LOG2E;

    load_tile<T, HS>(Qs, base, q0, T_, stride);
    load_tile<T, HS>(dOs, dobase, q0, T_, C);

    float lse2[TM], Dr[TM], dq[TM][TH];
#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int r = q0 + ty * TM + i;
        lse2[i] = r < T_ ? lse[(size_t)bh * T_ + r] * LOG2E : INFINITY;
        Dr[i] = r < T_ ? D[(size_t)bh * T_ + r] : 0.0f;
#pragma unroll
        for (int j = 0; j < TH; j++)
            dq[i][j] = 0.0f;
    }

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TILE;
        __syncthreads();
        load_tile<T, HS>(Ks, base + C, k0, T_, stride);
        load_tile<T, HS>(Vs, base + 2 * C, k0, T_, stride);
        __syncthreads();

        float s[TM][TN], dp[TM][TN];
        tile_dot<T, HS>(s, Qs, Ks, ty, tx);
        tile_dot<T, HS>(dp, dOs, Vs, ty, tx);
#pragma unroll
        for (int i = 0; i < TM; i++) {
            const int r = q0 + ty * TM + i;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int c = k0 + tx + 16 * j;
                float pv = c <= r ? exp2f(s[i][j] * scale_log2 - lse2[i]) : 0.0f;
                Ps[(ty * TM + i) * cfg::PS + tx + 16 * j] = pv * (dp[i][j] - Dr[i]); /* dS */
            }
        }
        __syncthreads();
        tile_mul_acc<T, HS>(dq, Ps, Ks, ty, tx); /* dQ += dS K */
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int r = q0 + ty * TM + i;
        if (r >= T_)
            continue;
        T *row = dqkv + ((size_t)b * T_ + r) * stride + h * HS;
#pragma unroll
        for (int j = 0; j < TH; j++) {
            const int d = tx + 16 * j;
            row[d] = zt_from_float<T>(zt_to_float(row[d]) + dq[i][j] * scale);
        }
    }
}

/* ---- launchers ---- */

/* Kernels above 48 KiB of dynamic shared memory must say so once per kernel. */
template <typename K> static void allow_smem(K kernel, size_t bytes)
{
    if (bytes > 48 * 1024)
        ZT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename T, int HS>
static void forward(T *out, float *lse, const T *qkv, int B, int T_, int C, int NH, cudaStream_t stream)
{
    using cfg = att_cfg<T, HS>;
    const size_t smem = 3 * cfg::tile_bytes + cfg::score_bytes;
    allow_smem(attention_forward_kernel<T, HS>, smem);
    dim3 grid(ZT_CEIL_DIV(T_, cfg::TILE), B * NH);
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    attention_forward_kernel<T, HS><<<grid, ATT_THREADS, smem, stream>>>(out, lse, qkv, T_, C, NH, scale_log2);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T, int HS>
static void backward(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, int B, int T_, int C,
                     int NH, float *D, cudaStream_t stream)
{
    using cfg = att_cfg<T, HS>;
    const size_t items = (size_t)B * T_ * NH;
    attention_rowdot_kernel<T><<<(unsigned)ZT_CEIL_DIV(items, (size_t)8), 256, 0, stream>>>(D, dout, out, B, T_, C,
                                                                                             NH);
    ZT_CUDA_CHECK_LAUNCH();

    const float scale = 1.0f / sqrtf((float)HS);
    dim3 grid(ZT_CEIL_DIV(T_, cfg::TILE), B * NH);
    const size_t smem_kv = 4 * cfg::tile_bytes + cfg::score_bytes + 2 * cfg::TILE * sizeof(float);
    allow_smem(attention_backward_kv_kernel<T, HS>, smem_kv);
    attention_backward_kv_kernel<T, HS><<<grid, ATT_THREADS, smem_kv, stream>>>(dqkv, dout, qkv, lse, D, T_, C, NH,
                                                                                scale);
    ZT_CUDA_CHECK_LAUNCH();
    const size_t smem_q = 4 * cfg::tile_bytes + cfg::score_bytes;
    allow_smem(attention_backward_q_kernel<T, HS>, smem_q);
    attention_backward_q_kernel<T, HS><<<grid, ATT_THREADS, smem_q, stream>>>(dqkv, dout, qkv, lse, D, T_, C, NH,
                                                                              scale);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" bool zt_cuda_attention_supported(int C, int NH)
{
    return NH > 0 && C > 0 && C % NH == 0 && (C / NH == 64 || C / NH == 128);
}

extern "C" size_t zt_cuda_attention_backward_scratch_size(int B, int T, int NH)
{
    return (size_t)B * NH * T * sizeof(float);
}

template <typename T>
static void forward_hs(T *out, float *lse, const T *qkv, int B, int T_, int C, int NH, cudaStream_t stream)
{
    if (C / NH == 64)
        forward<T, 64>(out, lse, qkv, B, T_, C, NH, stream);
    else
        forward<T, 128>(out, lse, qkv, B, T_, C, NH, stream);
}

template <typename T>
static void backward_hs(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, int B, int T_, int C,
                        int NH, float *D, cudaStream_t stream)
{
    if (C / NH == 64)
        backward<T, 64>(dqkv, dout, qkv, out, lse, B, T_, C, NH, D, stream);
    else
        backward<T, 128>(dqkv, dout, qkv, out, lse, B, T_, C, NH, D, stream);
}

extern "C" void zt_cuda_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                                          enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && zt_cuda_attention_supported(C, NH));
    ZT_ASSERT(((uintptr_t)qkv & 3u) == 0);
    switch (dtype) {
    case ZT_DTYPE_F32:
        forward_hs((float *)out, lse, (const float *)qkv, B, T, C, NH, stream);
        break;
    case ZT_DTYPE_F16:
        forward_hs((__half *)out, lse, (const __half *)qkv, B, T, C, NH, stream);
        break;
    case ZT_DTYPE_BF16:
        forward_hs((__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)qkv, B, T, C, NH, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_forward", dtype);
    }
}

extern "C" void zt_cuda_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                           const float *lse, int B, int T, int C, int NH, void *scratch,
                                           enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && zt_cuda_attention_supported(C, NH));
    ZT_ASSERT(((uintptr_t)qkv & 3u) == 0 && ((uintptr_t)dout & 3u) == 0 && ((uintptr_t)scratch & 3u) == 0);
    float *D = (float *)scratch;
    switch (dtype) {
    case ZT_DTYPE_F32:
        backward_hs((float *)dqkv, (const float *)dout, (const float *)qkv, (const float *)out, lse, B, T, C, NH, D,
                    stream);
        break;
    case ZT_DTYPE_F16:
        backward_hs((__half *)dqkv, (const __half *)dout, (const __half *)qkv, (const __half *)out, lse, B, T, C,
                    NH, D, stream);
        break;
    case ZT_DTYPE_BF16:
        backward_hs((__nv_bfloat16 *)dqkv, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)qkv,
                    (const __nv_bfloat16 *)out, lse, B, T, C, NH, D, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_backward", dtype);
    }
}
