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
 * 16-bit types at head size 64, smaller for fp32 or head size 128. These CUDA-core (SIMT) kernels serve
 * fp32 and every GPU; for bf16 and fp16 the launchers use the tensor-core kernels further down where
 * the GPU, the build and the shared memory allow (a zt_attention_variant can ask for the CUDA cores): on
 * sm_80+ the mma.sync kernels (the default; the variant's wmma turns them off), else the WMMA kernels
 * (sm_75: fp16).
 *
 * Padding mask (the *_masked launchers): causal rows below a sequence's length never see keys past it,
 * so the forward kernels run as they are and padded rows get zeros and lse = +inf afterwards (the
 * mma.sync kernel skips their tiles); every backward kernel takes P = exp(S - lse) = 0 on those rows. */
#include <math.h>
#include <stdio.h>

#include <mma.h>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_mma.cuh"
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
    extern __shared__ __align__(128) unsigned char smem[];
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
    extern __shared__ __align__(128) unsigned char smem[];
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
    extern __shared__ __align__(128) unsigned char smem[];
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


/* ---- tensor-core kernels (bf16 on sm_80+, fp16 on sm_70+) ----
 *
 * The same algorithm with WMMA 16x16x16 products (fp32 accumulation): a block of 4 warps owns a tile of
 * 64 rows (queries in the forward and the dQ pass, keys in the dK/dV pass), each warp 16 of them, and
 * walks the 64-row tiles of the other side. Tiles sit in shared memory in the storage type, rows padded
 * by 16 bytes (aligned for WMMA loads, no bank conflicts). A warp stores its 16 x 64 fp32 products to
 * its own shared region, does the softmax part with plain code there (two lanes per row), writes the
 * 16-bit P or dS over it, and multiplies that back with the tensor cores. The forward rescales its
 * output accumulators row by row; the fragment layout is unspecified, so each warp reads the row of
 * every fragment element off a fragment loaded from a matrix of row indices. */

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_TILE 64
#define TC_SLD 68 /* fp32 score row stride, floats */
#define TC_PLD 72 /* 16-bit P / dS row stride over the same region, elements */

/* Whether this compilation pass can build the tensor-core kernels for T. */
template <typename T> __host__ __device__ constexpr bool tc_supported()
{
    return std::is_same<T, __half>::value ? ZT_ARCH >= 700 : (std::is_same<T, __nv_bfloat16>::value && ZT_ARCH >= 800);
}

template <int HS> struct tc_cfg {
    static constexpr int LD = HS + 8; /* 16-bit tile row stride, elements */
    static constexpr size_t tile_bytes = (size_t)TC_TILE * LD * 2;
    static constexpr size_t score_bytes = 16 * TC_SLD * sizeof(float); /* one warp's 16 x 64 fp32 tile */
    static constexpr size_t fwd_smem = 3 * tile_bytes + TC_WARPS * score_bytes + TC_WARPS * 16 * sizeof(float);
    static constexpr size_t bwd_smem = 4 * tile_bytes + 2 * TC_WARPS * score_bytes + 2 * TC_TILE * sizeof(float);
};

/* Copies rows [t0, t0 + 64) of one head's slice of a [*, stride] tensor into a padded tile with 16-byte
 * moves; rows past T are zero. */
template <typename T, int HS>
__device__ __forceinline__ void tc_load_tile(T *tile, const T *base, int t0, int T_, int stride)
{
    constexpr int VPR = HS * (int)sizeof(T) / 16, EPV = 16 / (int)sizeof(T);
    for (int idx = threadIdx.x; idx < TC_TILE * VPR; idx += TC_THREADS) {
        int r = idx / VPR, v = idx % VPR, t = t0 + r;
        int4 val = make_int4(0, 0, 0, 0);
        if (t < T_)
            val = *reinterpret_cast<const int4 *>(base + (size_t)t * stride + v * EPV);
        *reinterpret_cast<int4 *>(tile + r * tc_cfg<HS>::LD + v * EPV) = val;
    }
}

/* acc (16 x 64, fp32, to this warp's region S) = A (16 rows of a tile) times B^T (64 rows of a tile):
 * rows of both are HS long, so B enters as a column-major 16 x 16 operand. */
template <typename T, int HS>
__device__ __forceinline__ void tc_scores(float *S, const T *A, const T *B)
{
    using namespace nvcuda;
    constexpr int LD = tc_cfg<HS>::LD;
#pragma unroll
    for (int j = 0; j < TC_TILE / 16; j++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < HS / 16; k++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
            wmma::load_matrix_sync(a, A + k * 16, LD);
            wmma::load_matrix_sync(b, B + j * 16 * LD + k * 16, LD);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(S + j * 16, acc, TC_SLD, wmma::mem_row_major);
    }
}

/* acc[f] (16 x HS) += P (16 x 64, 16-bit, row stride TC_PLD) times X (a 64 x HS tile). */
template <typename T, int HS>
__device__ __forceinline__ void tc_mul_acc(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[HS / 16],
                                           const T *P, const T *X)
{
    using namespace nvcuda;
    constexpr int LD = tc_cfg<HS>::LD;
#pragma unroll
    for (int j = 0; j < TC_TILE / 16; j++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::load_matrix_sync(a, P + j * 16, TC_PLD);
#pragma unroll
        for (int f = 0; f < HS / 16; f++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
            wmma::load_matrix_sync(b, X + j * 16 * LD + f * 16, LD);
            wmma::mma_sync(acc[f], a, b, acc[f]);
        }
    }
}

/* Adds scale * acc (this warp's 16 x HS block) into rows t0.. (rows past T skipped) of a [*, stride]
 * tensor at column col, staging through the warp's fp32 region (16 x (HS + 4) floats). */
template <typename T, int HS>
__device__ __forceinline__ void tc_add_out(T *dst, int stride, int t0, int T_, float scale, float *stage,
                                           nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[HS / 16],
                                           bool accumulate)
{
    using namespace nvcuda;
    const int lane = threadIdx.x % 32;
    __syncwarp();
#pragma unroll
    for (int f = 0; f < HS / 16; f++)
        wmma::store_matrix_sync(stage + f * 16, acc[f], HS + 4, wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < 16 * HS; idx += 32) {
        int r = idx / HS, d = idx % HS, t = t0 + r;
        if (t >= T_)
            continue;
        T *p = dst + (size_t)t * stride + d;
        float v = stage[r * (HS + 4) + d] * scale;
        *p = zt_from_float<T>(accumulate ? zt_to_float(*p) + v : v);
    }
    __syncwarp();
}

template <typename T, int HS>
static __global__ void __launch_bounds__(TC_THREADS)
    attention_forward_tc_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv, int T_, int C,
                                int NH, float scale_log2)
{
    if constexpr (!tc_supported<T>()) {
        __trap();
    } else {
        using namespace nvcuda;
        using cfg = tc_cfg<HS>;
        constexpr int LD = cfg::LD, NF = HS / 16;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Qs = reinterpret_cast<T *>(smem);
        T *Ks = reinterpret_cast<T *>(smem + cfg::tile_bytes);
        T *Vs = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        float *S = reinterpret_cast<float *>(smem + 3 * cfg::tile_bytes + warp * cfg::score_bytes);
        T *P = reinterpret_cast<T *>(S);
        float *rowbuf = reinterpret_cast<float *>(smem + 3 * cfg::tile_bytes + TC_WARPS * cfg::score_bytes) + warp * 16;

        const int qt = gridDim.x - 1 - blockIdx.x;
        const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
        const int q0 = qt * TC_TILE, stride = 3 * C;
        const T *base = qkv + (size_t)b * T_ * stride + h * HS;
        tc_load_tile<T, HS>(Qs, base, q0, T_, stride);

        /* The row of each accumulator element. */
        for (int i = lane; i < 256; i += 32)
            S[(i / 16) * TC_SLD + i % 16] = (float)(i / 16);
        __syncwarp();
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> rows;
        wmma::load_matrix_sync(rows, S, TC_SLD, wmma::mem_row_major);
        int row_of[rows.num_elements];
#pragma unroll
        for (int e = 0; e < rows.num_elements; e++)
            row_of[e] = (int)rows.x[e];

        wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[NF];
#pragma unroll
        for (int f = 0; f < NF; f++)
            wmma::fill_fragment(o[f], 0.0f);
        const int r = lane >> 1, half = lane & 1; /* this lane's row, and its columns half + 2 i */
        const int qrow = q0 + warp * 16 + r;
        float m = -INFINITY, l = 0.0f;

        for (int kt = 0; kt <= qt; kt++) {
            const int k0 = kt * TC_TILE;
            __syncthreads();
            tc_load_tile<T, HS>(Ks, base + C, k0, T_, stride);
            tc_load_tile<T, HS>(Vs, base + 2 * C, k0, T_, stride);
            __syncthreads();
            tc_scores<T, HS>(S, Qs + warp * 16 * LD, Ks);
            __syncwarp();

            float v[TC_TILE / 2];
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++) {
                const int c = half + 2 * i;
                float x = k0 + c <= qrow ? S[r * TC_SLD + c] * scale_log2 : -INFINITY;
                v[i] = x;
                mx = fmaxf(mx, x);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float m_new = fmaxf(m, mx); /* finite: key 0 is in the first tile */
            const float alpha = exp2f(m - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++) {
                v[i] = exp2f(v[i] - m_new);
                sum += v[i];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            l = l * alpha + sum;
            m = m_new;
            __syncwarp(); /* every lane has read its scores: P may overwrite them */
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++)
                P[r * TC_PLD + half + 2 * i] = zt_from_float<T>(v[i]);
            if (half == 0)
                rowbuf[r] = alpha;
            __syncwarp();
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < o[f].num_elements; e++)
                    o[f].x[e] *= rowbuf[row_of[e]];
            tc_mul_acc<T, HS>(o, P, Vs);
        }

        __syncwarp();
        if (half == 0) {
            rowbuf[r] = 1.0f / l;
            if (qrow < T_)
                lse[(size_t)bh * T_ + qrow] = (m + log2f(l)) / LOG2E;
        }
        __syncwarp();
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < o[f].num_elements; e++)
                o[f].x[e] *= rowbuf[row_of[e]];
        __syncthreads(); /* K and V are done with: stage the output there */
        float *stage = reinterpret_cast<float *>(smem + cfg::tile_bytes) + warp * 16 * (HS + 4);
        tc_add_out<T, HS>(out + (size_t)b * T_ * C + h * HS, C, q0 + warp * 16, T_, 1.0f, stage, o, false);
    }
}

/* dK, dV of one 64-key tile. */
template <typename T, int HS>
static __global__ void __launch_bounds__(TC_THREADS)
    attention_backward_kv_tc_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                                    const float *__restrict__ lse, const float *__restrict__ D, int T_, int C, int NH,
                                    float scale)
{
    if constexpr (!tc_supported<T>()) {
        __trap();
    } else {
        using namespace nvcuda;
        using cfg = tc_cfg<HS>;
        constexpr int LD = cfg::LD, NF = HS / 16;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Ks = reinterpret_cast<T *>(smem);
        T *Vs = reinterpret_cast<T *>(smem + cfg::tile_bytes);
        T *Qs = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
        T *dOs = reinterpret_cast<T *>(smem + 3 * cfg::tile_bytes);
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        float *S = reinterpret_cast<float *>(smem + 4 * cfg::tile_bytes + 2 * warp * cfg::score_bytes);
        float *dP = S + 16 * TC_SLD;
        T *Pt = reinterpret_cast<T *>(S), *dSt = reinterpret_cast<T *>(dP);
        float *lse_s = reinterpret_cast<float *>(smem + 4 * cfg::tile_bytes + 2 * TC_WARPS * cfg::score_bytes);
        float *D_s = lse_s + TC_TILE;

        const int kt = blockIdx.x;
        const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
        const int k0 = kt * TC_TILE, stride = 3 * C;
        const T *base = qkv + (size_t)b * T_ * stride + h * HS;
        const T *dobase = dout + (size_t)b * T_ * C + h * HS;
        const float scale_log2 = scale * LOG2E;
        const int ntiles = ZT_CEIL_DIV(T_, TC_TILE);
        const int r = lane >> 1, half = lane & 1;
        const int key = k0 + warp * 16 + r;

        tc_load_tile<T, HS>(Ks, base + C, k0, T_, stride);
        tc_load_tile<T, HS>(Vs, base + 2 * C, k0, T_, stride);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[NF], dv[NF];
#pragma unroll
        for (int f = 0; f < NF; f++) {
            wmma::fill_fragment(dk[f], 0.0f);
            wmma::fill_fragment(dv[f], 0.0f);
        }

        for (int qt = kt; qt < ntiles; qt++) {
            const int q0 = qt * TC_TILE;
            __syncthreads();
            tc_load_tile<T, HS>(Qs, base, q0, T_, stride);
            tc_load_tile<T, HS>(dOs, dobase, q0, T_, C);
            for (int i = threadIdx.x; i < TC_TILE; i += TC_THREADS) {
                const int t = q0 + i;
                lse_s[i] = t < T_ ? lse[(size_t)bh * T_ + t] * LOG2E : INFINITY; /* P = 0 past T */
                D_s[i] = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
            }
            __syncthreads();
            tc_scores<T, HS>(S, Ks + warp * 16 * LD, Qs);   /* S^T: this warp's keys x 64 queries */
            tc_scores<T, HS>(dP, Vs + warp * 16 * LD, dOs); /* dP^T */
            __syncwarp();
            float pv[TC_TILE / 2], dsv[TC_TILE / 2];
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++) {
                const int c = half + 2 * i;
                float p = key <= q0 + c ? exp2f(S[r * TC_SLD + c] * scale_log2 - lse_s[c]) : 0.0f;
                pv[i] = p;
                dsv[i] = p * (dP[r * TC_SLD + c] - D_s[c]);
            }
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++) {
                Pt[r * TC_PLD + half + 2 * i] = zt_from_float<T>(pv[i]);
                dSt[r * TC_PLD + half + 2 * i] = zt_from_float<T>(dsv[i]);
            }
            __syncwarp();
            tc_mul_acc<T, HS>(dv, Pt, dOs); /* dV += P^T dO */
            tc_mul_acc<T, HS>(dk, dSt, Qs); /* dK += dS^T Q */
        }
        T *rows = dqkv + (size_t)b * T_ * stride + h * HS;
        tc_add_out<T, HS>(rows + C, stride, k0 + warp * 16, T_, scale, S, dk, true);
        tc_add_out<T, HS>(rows + 2 * C, stride, k0 + warp * 16, T_, 1.0f, S, dv, true);
    }
}

/* dQ of one 64-query tile. */
template <typename T, int HS>
static __global__ void __launch_bounds__(TC_THREADS)
    attention_backward_q_tc_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                                   const float *__restrict__ lse, const float *__restrict__ D, int T_, int C, int NH,
                                   float scale)
{
    if constexpr (!tc_supported<T>()) {
        __trap();
    } else {
        using namespace nvcuda;
        using cfg = tc_cfg<HS>;
        constexpr int LD = cfg::LD, NF = HS / 16;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Qs = reinterpret_cast<T *>(smem);
        T *dOs = reinterpret_cast<T *>(smem + cfg::tile_bytes);
        T *Ks = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
        T *Vs = reinterpret_cast<T *>(smem + 3 * cfg::tile_bytes);
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        float *S = reinterpret_cast<float *>(smem + 4 * cfg::tile_bytes + 2 * warp * cfg::score_bytes);
        float *dP = S + 16 * TC_SLD;
        T *dS = reinterpret_cast<T *>(S);

        const int qt = gridDim.x - 1 - blockIdx.x;
        const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
        const int q0 = qt * TC_TILE, stride = 3 * C;
        const T *base = qkv + (size_t)b * T_ * stride + h * HS;
        const T *dobase = dout + (size_t)b * T_ * C + h * HS;
        const float scale_log2 = scale * LOG2E;
        const int r = lane >> 1, half = lane & 1;
        const int qrow = q0 + warp * 16 + r;
        const float lse2 = qrow < T_ ? lse[(size_t)bh * T_ + qrow] * LOG2E : INFINITY;
        const float Dr = qrow < T_ ? D[(size_t)bh * T_ + qrow] : 0.0f;

        tc_load_tile<T, HS>(Qs, base, q0, T_, stride);
        tc_load_tile<T, HS>(dOs, dobase, q0, T_, C);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> dq[NF];
#pragma unroll
        for (int f = 0; f < NF; f++)
            wmma::fill_fragment(dq[f], 0.0f);

        for (int kt = 0; kt <= qt; kt++) {
            const int k0 = kt * TC_TILE;
            __syncthreads();
            tc_load_tile<T, HS>(Ks, base + C, k0, T_, stride);
            tc_load_tile<T, HS>(Vs, base + 2 * C, k0, T_, stride);
            __syncthreads();
            tc_scores<T, HS>(S, Qs + warp * 16 * LD, Ks);
            tc_scores<T, HS>(dP, dOs + warp * 16 * LD, Vs);
            __syncwarp();
            float dsv[TC_TILE / 2];
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++) {
                const int c = half + 2 * i;
                float p = k0 + c <= qrow ? exp2f(S[r * TC_SLD + c] * scale_log2 - lse2) : 0.0f;
                dsv[i] = p * (dP[r * TC_SLD + c] - Dr);
            }
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TC_TILE / 2; i++)
                dS[r * TC_PLD + half + 2 * i] = zt_from_float<T>(dsv[i]);
            __syncwarp();
            tc_mul_acc<T, HS>(dq, dS, Ks); /* dQ += dS K */
        }
        tc_add_out<T, HS>(dqkv + (size_t)b * T_ * stride + h * HS, stride, q0 + warp * 16, T_, scale, S, dq, true);
    }
}

/* ---- mma.sync kernels (bf16 and fp16 on sm_80+), FlashAttention-2 style ----
 *
 * A block of 4 warps owns a resident tile of rows (queries in the forward and the dQ pass, keys in the
 * dK/dV pass), each warp 16 MI of them (MI = 2 at head size 64, 1 at 128; see mma_shape), and walks the
 * 64-row tiles of the other side; a warp skips the steps the causal mask zeroes for all of its rows.
 * Tiles of the storage type sit in shared memory with rows padded by 16 bytes (LDS), so that the 8 row
 * addresses of an ldmatrix fall in 8 different groups of 4 banks. The tiles of the side being walked are
 * double buffered: cp.async fetches tile i + 1 while the tensor cores work on tile i. The grid puts the
 * (batch, head) pairs along x and the tiles along y, longest causal work first (mma_grid).
 *
 * The mma.sync building blocks (fragment layouts, ldmatrix, cp.async) are in attention_mma.cuh. */

/* A block whose warps own MI blocks of 16 rows each: its resident tile has ROWS rows. MI = 2 lets each
 * operand fragment that ldmatrix brings from shared memory feed two products instead of one, which
 * halves the shared-memory traffic per product (the limit of the MI = 1 kernels at head size 64);
 * head size 128 keeps MI = 1, whose accumulators already fill the registers. */
template <int HS, int MI> struct mma_shape {
    static constexpr int ROWS = MMA_WARPS * 16 * MI;
    static constexpr int RES_ELEMS = ROWS * mma_cfg<HS>::LDS;
    /* Forward: Q resident, 2 x K and 2 x V walked. */
    static constexpr size_t fwd_smem = (size_t)(RES_ELEMS + 4 * mma_cfg<HS>::TILE_ELEMS) * 2;
    /* Backward: two resident tiles, 2 x 2 walked ones, and the walked query tiles' lse and D (2 x 2 x 64
     * floats; the dQ pass leaves them unused). */
    static constexpr size_t bwd_smem =
        (size_t)(2 * RES_ELEMS + 4 * mma_cfg<HS>::TILE_ELEMS) * 2 + 4 * MMA_TILE * sizeof(float);
    /* The single pass adds the dS^T of one query tile: ROWS keys x 64 queries, rows padded by 8 elements. */
    static constexpr int DS_LD = MMA_TILE + 8;
    static constexpr size_t bwd1_smem = bwd_smem + (size_t)ROWS * DS_LD * 2;
    /* Columns of the walked side per inner step of the dK/dV pass: 64 for head size 64 with MI = 1, else 32,
     * which keeps the two score tiles and the two HS-wide accumulators within the registers. */
    static constexpr int SUB = HS == 64 && MI == 1 ? 64 : 32;
    /* The dQ pass holds one HS-wide accumulator, not two: 64 columns per step at head size 64. */
    static constexpr int SUB_Q = HS == 64 ? 64 : 32;
};

/* Forward: a block owns ROWS queries (warp w: rows q0 + 16 MI w .. + 16 MI - 1) and walks the 64-key
 * tiles up to the sequence's length (CAUSAL: and the diagonal; a warp skips a tile whose keys all lie past
 * its rows, their P is 0). Bidirectional: the last tile masks the keys at and past the length. */
template <typename T, int HS, int MI, bool CAUSAL>
static __global__ void __launch_bounds__(MMA_THREADS)
    attention_forward_mma_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                                 const int32_t *__restrict__ lens, int T_, int C, int NH, int NKV, float scale_log2)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using cfg = mma_cfg<HS>;
        using sh = mma_shape<HS, MI>;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Qs = reinterpret_cast<T *>(smem);
        T *Ks = Qs + sh::RES_ELEMS;       /* two buffers */
        T *Vs = Ks + 2 * cfg::TILE_ELEMS; /* two buffers */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        /* Blocks start in order of blockIdx.y, then x: the longest rows of every (batch, head) first, so
         * that the short ones fill the last wave (see mma_grid). */
        const int qt = gridDim.y - 1 - blockIdx.y;
        const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
        const int q0 = qt * sh::ROWS;
        const int len = mma_seq_len(lens, b, T_);
        if (q0 >= len)
            return; /* every row is padding: the mask kernel writes them */
        /* Rows of NH query heads, then NKV key heads, then NKV value heads; query head h reads key/value head
         * h / (NH / NKV) (NKV = NH: multi-head attention, rows of 3C). */
        const int stride = C + 2 * NKV * HS;
        const T *base = qkv + (size_t)b * T_ * stride + h * HS;
        const T *kbase = qkv + (size_t)b * T_ * stride + C + (h / (NH / NKV)) * HS, *vbase = kbase + NKV * HS;
        /* Rows below len see keys below len only. */
        const int nkt = CAUSAL ? min(ZT_CEIL_DIV(q0 + sh::ROWS, MMA_TILE), ZT_CEIL_DIV(len, MMA_TILE))
                               : ZT_CEIL_DIV(len, MMA_TILE);
        const int wr0 = q0 + warp * 16 * MI; /* this warp's first row; this lane's: wr0 + 16 mi + g (+ 8) */

        mma_load_tile<T, HS, sh::ROWS>(Qs, base, q0, T_, stride);
        mma_load_tile<T, HS>(Ks, kbase, 0, T_, stride);
        mma_load_tile<T, HS>(Vs, vbase, 0, T_, stride);
        cp_async_commit();

        float o[MI][HS / 8][4];
        mma_zero(o);
        /* Running max (of the raw scores) and this lane's part of the running sum, per row. */
        float m[MI][2], l[MI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;

        for (int kt = 0; kt < nkt; kt++) {
            if (kt + 1 < nkt) {
                const int nb = (kt + 1) % 2;
                mma_load_tile<T, HS>(Ks + nb * cfg::TILE_ELEMS, kbase, (kt + 1) * MMA_TILE, T_, stride);
                mma_load_tile<T, HS>(Vs + nb * cfg::TILE_ELEMS, vbase, (kt + 1) * MMA_TILE, T_, stride);
                cp_async_commit();
                cp_async_wait<1>(); /* tile kt (and Q) landed; kt + 1 may still be in flight */
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const int k0 = kt * MMA_TILE;
            if (!CAUSAL || k0 <= wr0 + 16 * MI - 1) { /* else every key of the tile is past every row of the warp */
                const T *Kt = Ks + (kt % 2) * cfg::TILE_ELEMS, *Vt = Vs + (kt % 2) * cfg::TILE_ELEMS;
                float s[MI][8][4];
                mma_zero(s);
                mma_rows_x_rows<T, HS, MI, 4>(s, Qs + warp * 16 * MI * cfg::LDS, Kt);

                /* Online softmax. s[mi][j][e] is row wr0 + 16 mi + g + 8 (e / 2), key k0 + 8 j + 2 q + e % 2.
                 * Masked: causal, keys past the row; bidirectional, keys at and past the length. The max is
                 * taken over the raw scores (the scale is positive) and the scale applied inside the
                 * exponent, one FMA per score. */
                const bool edge = CAUSAL ? k0 + MMA_TILE - 1 > wr0 : k0 + MMA_TILE > len;
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    float mx[2] = {m[mi][0], m[mi][1]};
#pragma unroll
                    for (int j = 0; j < 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int key = k0 + 8 * j + 2 * q + (e % 2);
                            const int row = wr0 + 16 * mi + g + 8 * (e / 2);
                            if (edge && (CAUSAL ? key > row : key >= len))
                                s[mi][j][e] = -INFINITY;
                            mx[e / 2] = fmaxf(mx[e / 2], s[mi][j][e]);
                        }
                    float alpha[2], ms[2];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                        /* Finite: key 0 of the first tile is never masked (len >= 1). */
                        alpha[i] = fast_exp2((m[mi][i] - mx[i]) * scale_log2);
                        m[mi][i] = mx[i];
                        ms[i] = mx[i] * scale_log2;
                        l[mi][i] *= alpha[i];
                    }
#pragma unroll
                    for (int j = 0; j < 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float p = fast_exp2(fmaf(s[mi][j][e], scale_log2, -ms[e / 2]));
                            s[mi][j][e] = p;
                            l[mi][e / 2] += p;
                        }
#pragma unroll
                    for (int j = 0; j < HS / 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            o[mi][j][e] *= alpha[e / 2];
                }
                mma_acc_x_rows<T, HS, MI, 4>(o, s, Vt); /* O += P V */
            }
            __syncthreads(); /* every warp is done with buffer kt % 2 before it is refilled */
        }

#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            const int row0 = wr0 + 16 * mi + g;
            float inv[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                l[mi][i] += __shfl_xor_sync(0xffffffffu, l[mi][i], 1);
                l[mi][i] += __shfl_xor_sync(0xffffffffu, l[mi][i], 2);
                inv[i] = 1.0f / l[mi][i];
                const int row = row0 + 8 * i;
                if (q == 0 && row < len)
                    lse[(size_t)bh * T_ + row] = (m[mi][i] * scale_log2 + log2f(l[mi][i])) / LOG2E;
            }
#pragma unroll
            for (int j = 0; j < HS / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    o[mi][j][e] *= inv[e / 2];
            mma_store_rows<T, HS>(out + (size_t)b * T_ * C + h * HS, C, row0, len, 1.0f, o[mi], false);
        }
    }
}

/* dK, dV of ROWS keys of one key/value head: warp w owns keys k0 + 16 MI w .. + 16 MI - 1 and walks, for
 * each of the head's NH / NKV query heads in order, the 64-query tiles below the length (CAUSAL: from the
 * diagonal down). Per query tile, in steps of SUB queries: S^T = K Q^T and dP^T = V dO^T,
 * P^T = exp(S^T - lse), dS^T = P^T (dP^T - D), then dV += P^T dO and dK += dS^T Q with P^T and dS^T straight
 * from the registers. CAUSAL: a warp skips the steps whose queries all precede its keys. Bidirectional:
 * nothing to mask for dK and dV (padded queries have lse = +inf, so P = 0; the rows of padded keys are not
 * stored). GQA false: NKV = NH, compiled without the walk over query heads.
 *
 * DQ (the single pass): the block also gives each query tile its part of dQ. Its warps leave the tile's dS^T
 * (rounded to T, as the dK product takes it; zeros where a warp skipped a step or, bidirectional, for keys
 * at and past the length) in shared memory; then warp w computes dQ of the tile's queries 16 w .. 16 w + 15
 * over the block's ROWS keys (dS from the stored dS^T by ldmatrix.trans, times the resident K) and adds it
 * into the fp32 rows of dq_acc [B, NH, T, HS]. The additions into a query tile are ordered: key block kt
 * waits until sems[(b NH + h) nqt + qt] says kt (every block below it added its part), stores (kt = 0: the
 * first part of every tile it sees) or adds by reductions done in L2 (red.global.add: a read-modify-write
 * from the SM waits on memory and ran 4-6x slower), waits until its reductions are done (fence) and
 * releases kt + 1. So the sum runs over the key blocks in order and the same inputs give the same bits, with
 * 5 products per tile pair instead of the 7 of the two passes. A block waits only on blocks that took an
 * earlier ticket (tickets), which are running or done, so the waits always end. attention_dq_store_kernel
 * then writes dq_acc, scaled, into dqkv. Measured on the H200 (bench/attention) it is 3-12% slower than the
 * two passes at GPT-2's, LLaMA's and BERT's shapes (the fp32 reductions, about 64 x HS x 4 bytes per tile
 * pair, cost more than the two products they save), and 30% slower with grouped-query heads (a block walks
 * every query head of its key/value head: too few blocks), so it is not the default. */
template <typename T, int HS, int MI, bool GQA, bool CAUSAL, bool DQ>
static __global__ void __launch_bounds__(MMA_THREADS)
    attention_backward_kv_mma_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                                     const float *__restrict__ lse, const float *__restrict__ D,
                                     const int32_t *__restrict__ lens, int T_, int C, int NH, int NKV, float scale,
                                     bool accumulate, float *__restrict__ dq_acc, int *__restrict__ sems,
                                     int *__restrict__ tickets)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using cfg = mma_cfg<HS>;
        using sh = mma_shape<HS, MI>;
        constexpr int SUB = sh::SUB;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Ks = reinterpret_cast<T *>(smem);
        T *Vs = Ks + sh::RES_ELEMS;
        T *Qs = Vs + sh::RES_ELEMS;         /* two buffers */
        T *dOs = Qs + 2 * cfg::TILE_ELEMS;  /* two buffers */
        float *lse_s = reinterpret_cast<float *>(dOs + 2 * cfg::TILE_ELEMS); /* two buffers of 64 */
        float *D_s = lse_s + 2 * MMA_TILE;                                   /* two buffers of 64 */
        T *dSs = reinterpret_cast<T *>(D_s + 2 * MMA_TILE);                  /* DQ: [ROWS][DS_LD] */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        /* The first key tiles see the most query tiles: those of every (batch, head) start first. DQ: the
         * block's tile comes from a ticket taken at its start, in the grid's order, so that the blocks it
         * waits for have started before it, whatever order the GPU starts blocks in. */
        int kt = blockIdx.y, bkv = blockIdx.x;
        if constexpr (DQ) {
            __shared__ int ticket;
            if (threadIdx.x == 0)
                ticket = atomicAdd(tickets, 1);
            __syncthreads();
            kt = ticket / (int)gridDim.x;
            bkv = ticket % (int)gridDim.x;
        }
        const int b = bkv / NKV, kvh = bkv % NKV, G = GQA ? NH / NKV : 1;
        const int k0 = kt * sh::ROWS;
        const int len = mma_seq_len(lens, b, T_);
        if (k0 >= len)
            return; /* padded keys: only padded queries see them, and those add nothing */
        const int stride = C + 2 * NKV * HS; /* rows of q (NH heads) | k (NKV heads) | v (NKV heads) */
        const T *qrow = qkv + (size_t)b * T_ * stride;
        const T *kbase = qrow + C + kvh * HS, *vbase = kbase + NKV * HS;
        const float scale_log2 = scale * LOG2E;
        const int qbegin = CAUSAL ? k0 / MMA_TILE : 0, qend = ZT_CEIL_DIV(len, MMA_TILE), nq = qend - qbegin;
        const int wk0 = k0 + warp * 16 * MI; /* this warp's first key; this lane's: wk0 + 16 mi + g (+ 8) */
        const bool kedge = !CAUSAL && k0 + sh::ROWS > len; /* DQ: keys at and past the length in this block */
        T *dSw = dSs + warp * 16 * MI * sh::DS_LD;          /* DQ: this warp's rows of dS^T */

        /* Step it walks query tile qbegin + it % nq of query head kvh G + it / nq. Starts loading its tile into
         * buffer nb: Q and dO by cp.async, lse and D by plain stores (padded and out-of-range rows get
         * lse = +inf, so P = 0 there). */
        auto load_query_tile = [&](int it, int nb) {
            const int h = kvh * G + (GQA ? it / nq : 0), qt = qbegin + (GQA ? it % nq : it);
            const size_t bh = (size_t)b * NH + h;
            mma_load_tile<T, HS>(Qs + nb * cfg::TILE_ELEMS, qrow + h * HS, qt * MMA_TILE, T_, stride);
            mma_load_tile<T, HS>(dOs + nb * cfg::TILE_ELEMS, dout + (size_t)b * T_ * C + h * HS, qt * MMA_TILE, T_,
                                 C);
            for (int i = threadIdx.x; i < MMA_TILE; i += MMA_THREADS) {
                const int t = qt * MMA_TILE + i;
                lse_s[nb * MMA_TILE + i] = t < len ? lse[bh * T_ + t] * LOG2E : INFINITY;
                D_s[nb * MMA_TILE + i] = t < len ? D[bh * T_ + t] : 0.0f;
            }
        };

        mma_load_tile<T, HS, sh::ROWS>(Ks, kbase, k0, T_, stride);
        mma_load_tile<T, HS, sh::ROWS>(Vs, vbase, k0, T_, stride);
        load_query_tile(0, 0);
        cp_async_commit();

        float dk[MI][HS / 8][4], dv[MI][HS / 8][4];
        mma_zero(dk);
        mma_zero(dv);

        const int steps = GQA ? G * nq : nq;
        for (int it = 0; it < steps; it++) {
            const int qt = qbegin + (GQA ? it % nq : it), cb = it % 2;
            if (it + 1 < steps) {
                load_query_tile(it + 1, 1 - cb);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const T *Qt = Qs + cb * cfg::TILE_ELEMS, *dOt = dOs + cb * cfg::TILE_ELEMS;
            const float *lse_t = lse_s + cb * MMA_TILE, *D_t = D_s + cb * MMA_TILE;

#pragma unroll 1
            for (int sub = 0; sub < MMA_TILE / SUB; sub++) {
                const int qs0 = qt * MMA_TILE + sub * SUB; /* first query of the step */
                if (CAUSAL && wk0 > qs0 + SUB - 1) {
                    /* every key of this warp is past every query of the step: P = 0 */
                    if constexpr (DQ) {
#pragma unroll
                        for (int r = 0; r < 16 * MI; r++)
                            if (lane < SUB / 2)
                                *reinterpret_cast<uint32_t *>(dSw + r * sh::DS_LD + sub * SUB + 2 * lane) = 0u;
                    }
                    continue;
                }
                const bool diag = CAUSAL && wk0 + 16 * MI - 1 > qs0;
                float s[MI][SUB / 8][4], dp[MI][SUB / 8][4];
                mma_zero(s);
                mma_zero(dp);
                mma_rows_x_rows<T, HS, MI, SUB / 16>(s, Ks + warp * 16 * MI * cfg::LDS, Qt + sub * SUB * cfg::LDS);
                mma_rows_x_rows<T, HS, MI, SUB / 16>(dp, Vs + warp * 16 * MI * cfg::LDS, dOt + sub * SUB * cfg::LDS);
                /* s[mi][j][e] is key wk0 + 16 mi + g + 8 (e / 2), query column c = sub * SUB + 8 j + 2 q + e % 2. */
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int c = sub * SUB + 8 * j + 2 * q + (e % 2);
                            const int key = wk0 + 16 * mi + g + 8 * (e / 2);
                            float p = fast_exp2(s[mi][j][e] * scale_log2 - lse_t[c]);
                            if (diag && key > qt * MMA_TILE + c)
                                p = 0.0f;
                            if (DQ && kedge && key >= len)
                                p = 0.0f;
                            s[mi][j][e] = p;
                            dp[mi][j][e] = p * (dp[mi][j][e] - D_t[c]); /* dS^T */
                        }
                if constexpr (DQ) {
#pragma unroll
                    for (int mi = 0; mi < MI; mi++)
#pragma unroll
                        for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                            for (int i = 0; i < 2; i++)
                                *reinterpret_cast<uint32_t *>(dSw + (16 * mi + g + 8 * i) * sh::DS_LD + sub * SUB +
                                                              8 * j + 2 * q) =
                                    pack2<T>(dp[mi][j][2 * i], dp[mi][j][2 * i + 1]);
                }
                mma_acc_x_rows<T, HS, MI, SUB / 16>(dv, s, dOt + sub * SUB * cfg::LDS); /* dV += P^T dO */
                mma_acc_x_rows<T, HS, MI, SUB / 16>(dk, dp, Qt + sub * SUB * cfg::LDS); /* dK += dS^T Q */
            }
            if constexpr (DQ) {
                __syncthreads(); /* the tile's dS^T is complete */
                float dqp[HS / 8][4];
#pragma unroll
                for (int j = 0; j < HS / 8; j++)
                    dqp[j][0] = dqp[j][1] = dqp[j][2] = dqp[j][3] = 0.0f;
                mma_at_x_rows<T, HS, sh::ROWS / 16>(dqp, dSs + warp * 16, sh::DS_LD, Ks); /* dQ part = dS K */
                const int h = kvh * G + (GQA ? it / nq : 0);
                int *sem = sems + ((size_t)b * NH + h) * ZT_CEIL_DIV(T_, MMA_TILE) + qt;
                if (threadIdx.x == 0)
                    while (ld_acquire_gpu(sem) != kt)
                        __nanosleep(32);
                __syncthreads(); /* the key blocks below this one have added their parts */
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int row = qt * MMA_TILE + warp * 16 + g + 8 * i;
                    if (row >= T_)
                        continue;
                    float *acc = dq_acc + (((size_t)b * NH + h) * T_ + row) * HS + 2 * q;
#pragma unroll
                    for (int j = 0; j < HS / 8; j++) {
                        if (kt == 0)
                            __stcg(reinterpret_cast<float2 *>(acc + 8 * j), make_float2(dqp[j][2 * i], dqp[j][2 * i + 1]));
                        else
                            red_add2(acc + 8 * j, dqp[j][2 * i], dqp[j][2 * i + 1]);
                    }
                }
                __threadfence(); /* this thread's additions are done in memory */
                __syncthreads();
                if (threadIdx.x == 0)
                    st_release_gpu(sem, kt + 1);
            }
            __syncthreads(); /* buffer cb (and dS^T) is refilled in the next iteration */
        }

        T *krows = dqkv + (size_t)b * T_ * stride + C + kvh * HS;
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            const int key0 = wk0 + 16 * mi + g;
            mma_store_rows<T, HS>(krows, stride, key0, len, scale, dk[mi], accumulate);
            mma_store_rows<T, HS>(krows + NKV * HS, stride, key0, len, 1.0f, dv[mi], accumulate);
        }
    }
}

/* dQ of ROWS queries: warp w owns queries q0 + 16 MI w .. + 16 MI - 1 and walks the 64-key tiles up to
 * the length (CAUSAL: and the diagonal). Per key tile, in steps of SUB keys: S = Q K^T, dP = dO V^T,
 * dS = P (dP - D), dQ += dS K. CAUSAL: a warp skips the steps whose keys all lie past its rows;
 * bidirectional: the keys at and past the length are masked. GQA false (NKV = NH): rows of 3C, and the
 * key/value head is h, addressed from the query's own pointer as the kernel was before grouped-query heads
 * (one pointer fewer live: this kernel is at the register limit, and every extra one spills). */
template <typename T, int HS, int MI, bool GQA, bool CAUSAL>
static __global__ void __launch_bounds__(MMA_THREADS)
    attention_backward_q_mma_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                                    const float *__restrict__ lse, const float *__restrict__ D,
                                    const int32_t *__restrict__ lens, int T_, int C, int NH, int NKV, float scale,
                                    bool accumulate)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using cfg = mma_cfg<HS>;
        using sh = mma_shape<HS, MI>;
        constexpr int SUB = sh::SUB_Q;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Qs = reinterpret_cast<T *>(smem);
        T *dOs = Qs + sh::RES_ELEMS;
        T *Ks = dOs + sh::RES_ELEMS;       /* two buffers */
        T *Vs = Ks + 2 * cfg::TILE_ELEMS;  /* two buffers */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        /* Blocks start in order of blockIdx.y, then x: the longest rows of every (batch, head) first, so
         * that the short ones fill the last wave (see mma_grid). */
        const int qt = gridDim.y - 1 - blockIdx.y;
        const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
        const int q0 = qt * sh::ROWS;
        const int len = mma_seq_len(lens, b, T_);
        if (q0 >= len)
            return;
        /* rows of q (NH heads) | k (NKV heads) | v (NKV heads) */
        const int stride = GQA ? C + 2 * NKV * HS : 3 * C;
        const T *base = qkv + (size_t)b * T_ * stride + h * HS;
        const T *kbase = GQA ? qkv + (size_t)b * T_ * stride + C + (h / (NH / NKV)) * HS : base + C;
        const T *vbase = GQA ? kbase + NKV * HS : base + 2 * C;
        const T *dobase = dout + (size_t)b * T_ * C + h * HS;
        const float scale_log2 = scale * LOG2E;
        const int wr0 = q0 + warp * 16 * MI; /* this warp's first row; this lane's: wr0 + 16 mi + g (+ 8) */
        float lse2[MI][2], Dr[MI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int row = wr0 + 16 * mi + g + 8 * i;
                lse2[mi][i] = row < len ? lse[(size_t)bh * T_ + row] * LOG2E : INFINITY;
                Dr[mi][i] = row < len ? D[(size_t)bh * T_ + row] : 0.0f;
            }

        mma_load_tile<T, HS, sh::ROWS>(Qs, base, q0, T_, stride);
        mma_load_tile<T, HS, sh::ROWS>(dOs, dobase, q0, T_, C);
        mma_load_tile<T, HS>(Ks, kbase, 0, T_, stride);
        mma_load_tile<T, HS>(Vs, vbase, 0, T_, stride);
        cp_async_commit();

        float dq[MI][HS / 8][4];
        mma_zero(dq);

        const int nkt = CAUSAL ? min(ZT_CEIL_DIV(q0 + sh::ROWS, MMA_TILE), ZT_CEIL_DIV(len, MMA_TILE))
                               : ZT_CEIL_DIV(len, MMA_TILE);
        for (int kt = 0; kt < nkt; kt++) {
            if (kt + 1 < nkt) {
                const int nb = (kt + 1) % 2;
                mma_load_tile<T, HS>(Ks + nb * cfg::TILE_ELEMS, kbase, (kt + 1) * MMA_TILE, T_, stride);
                mma_load_tile<T, HS>(Vs + nb * cfg::TILE_ELEMS, vbase, (kt + 1) * MMA_TILE, T_, stride);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const T *Kt = Ks + (kt % 2) * cfg::TILE_ELEMS, *Vt = Vs + (kt % 2) * cfg::TILE_ELEMS;

#pragma unroll 1
            for (int sub = 0; sub < MMA_TILE / SUB; sub++) {
                const int ks0 = kt * MMA_TILE + sub * SUB; /* first key of the step */
                if (CAUSAL && ks0 > wr0 + 16 * MI - 1)
                    continue; /* every key of the step is past every row of this warp: P = 0 */
                const bool edge = CAUSAL ? ks0 + SUB - 1 > wr0 : ks0 + SUB > len;
                float s[MI][SUB / 8][4], dp[MI][SUB / 8][4];
                mma_zero(s);
                mma_zero(dp);
                mma_rows_x_rows<T, HS, MI, SUB / 16>(s, Qs + warp * 16 * MI * cfg::LDS, Kt + sub * SUB * cfg::LDS);
                mma_rows_x_rows<T, HS, MI, SUB / 16>(dp, dOs + warp * 16 * MI * cfg::LDS, Vt + sub * SUB * cfg::LDS);
                /* s[mi][j][e] is row wr0 + 16 mi + g + 8 (e / 2), key ks0 + 8 j + 2 q + e % 2. */
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int key = ks0 + 8 * j + 2 * q + (e % 2);
                            const int i = e / 2;
                            float p = fast_exp2(s[mi][j][e] * scale_log2 - lse2[mi][i]);
                            if (edge && (CAUSAL ? key > wr0 + 16 * mi + g + 8 * i : key >= len))
                                p = 0.0f;
                            s[mi][j][e] = p * (dp[mi][j][e] - Dr[mi][i]); /* dS */
                        }
                mma_acc_x_rows<T, HS, MI, SUB / 16>(dq, s, Kt + sub * SUB * cfg::LDS); /* dQ += dS K */
            }
            __syncthreads();
        }
        T *rows = dqkv + (size_t)b * T_ * stride + h * HS;
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            mma_store_rows<T, HS>(rows, stride, wr0 + 16 * mi + g, len, scale, dq[mi], accumulate);
    }
}

/* The single pass's dQ into dqkv: row t < lens[b] of query head h gets scale * dq_acc [B, NH, T, HS], added
 * (accumulate) or stored; rows at or past the length are left as they are. A thread owns two channels. */
template <typename T>
static __global__ void attention_dq_store_kernel(T *__restrict__ dqkv, const float *__restrict__ dq_acc,
                                                 const int32_t *__restrict__ lens, int T_, int NH, int HS, int stride,
                                                 float scale, bool accumulate)
{
    const int b = blockIdx.y, W = NH * HS;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, pair = 2 * idx;
    if (pair >= (size_t)T_ * W)
        return;
    const int t = (int)(pair / W), c = (int)(pair % W), h = c / HS;
    if (t >= mma_seq_len(lens, b, T_))
        return;
    const float2 v =
        *reinterpret_cast<const float2 *>(dq_acc + (((size_t)b * NH + h) * T_ + t) * HS + c % HS);
    T *p = dqkv + ((size_t)b * T_ + t) * stride + c;
    float lo = v.x * scale, hi = v.y * scale;
    if (accumulate) {
        lo += zt_to_float(p[0]);
        hi += zt_to_float(p[1]);
    }
    *reinterpret_cast<uint32_t *>(p) = pack2<T>(lo, hi);
}

/* Padding rows: rows t >= lens[b] of x [B, T, W] become zero, and with lse [B, NH, T] their lse +inf (so that
 * the backward kernels, which take P = exp(S - lse), see P = 0 there). Block (b, y) owns the MASK_ROWS rows
 * from y MASK_ROWS and returns at once where they all hold tokens, as in a batch without padding. */
#define MASK_ROWS 32
template <typename T>
static __global__ void attention_mask_rows_kernel(T *__restrict__ x, float *__restrict__ lse,
                                                  const int32_t *__restrict__ lens, int T_, int W, int NH)
{
    const int b = blockIdx.x, t0 = blockIdx.y * MASK_ROWS;
    const int first = max(t0, max(0, min(lens[b], T_))), last = min(T_, t0 + MASK_ROWS);
    for (int t = first; t < last; t++) {
        T *row = x + ((size_t)b * T_ + t) * W;
        for (int c = threadIdx.x; c < W; c += blockDim.x)
            row[c] = zt_from_float<T>(0.0f);
        if (lse)
            for (int h = threadIdx.x; h < NH; h += blockDim.x)
                lse[((size_t)b * NH + h) * T_ + t] = INFINITY;
    }
}

/* ---- launchers ---- */

/* The backward's scratch: D [B, NH, T] (rows of dout . out), then, 16-byte aligned, the single pass's fp32 dQ
 * rows [B, NH, T, HS], its counters, one per (sequence, head, 64-query tile), and the blocks' ticket
 * counter (sem_count + 1 ints, zeroed before each launch). */
struct bwd_scratch {
    float *dq;
    int *sems;
    size_t sem_count;
};

static size_t bwd_scratch_dq_offset(int B, int T_, int NH) { return ((size_t)B * NH * T_ + 3) / 4 * 4; }

/* The scratch of the single pass (the mma.sync kernels' head sizes); every other backward needs D alone. */
static size_t bwd_scratch_floats(int B, int T_, int NH, int HS)
{
    return bwd_scratch_dq_offset(B, T_, NH) + (size_t)B * T_ * NH * HS + (size_t)B * NH * ZT_CEIL_DIV(T_, MMA_TILE) +
           1;
}

static bwd_scratch bwd_scratch_of(float *D, int B, int T_, int NH, int HS)
{
    bwd_scratch s;
    s.dq = D + bwd_scratch_dq_offset(B, T_, NH);
    s.sems = reinterpret_cast<int *>(s.dq + (size_t)B * T_ * NH * HS);
    s.sem_count = (size_t)B * NH * ZT_CEIL_DIV(T_, MMA_TILE);
    return s;
}

/* Kernels above 48 KiB of dynamic shared memory must say so once per kernel. */
template <typename K> static void allow_smem(K kernel, size_t bytes)
{
    if (bytes > 48 * 1024)
        ZT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* Whether a tensor-core kernel can run here: allowed, enough shared memory on this GPU, and its code
 * built for an architecture with the needed MMA (a build for sm_75 alone cannot do bf16). */
template <typename T, typename K>
static bool tc_usable(const zt_attention_variant *v, K kernel, size_t smem, const void *const *ptrs, int nptrs)
{
    if (v->cuda_cores || std::is_same<T, float>::value)
        return false;
    for (int i = 0; i < nptrs; i++)
        if (!zt_aligned16(ptrs[i]))
            return false; /* 16-byte tile loads */
    int dev = 0, optin = 0;
    ZT_CUDA_CHECK(cudaGetDevice(&dev));
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > (size_t)optin)
        return false;
    cudaFuncAttributes attr;
    ZT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.ptxVersion >= (std::is_same<T, __nv_bfloat16>::value ? 80 : 70);
}

/* Whether an mma.sync kernel can run here: wanted, and usable as a tensor-core kernel whose code was
 * built for sm_80 or newer (cp.async, bf16 and m16n8k16 need it). */
template <typename T, typename K>
static bool mma_usable(const zt_attention_variant *v, K kernel, size_t smem, const void *const *ptrs, int nptrs)
{
    if (v->wmma || !tc_usable<T>(v, kernel, smem, ptrs, nptrs))
        return false;
    cudaFuncAttributes attr;
    ZT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.ptxVersion >= 80 && attr.binaryVersion >= 80;
}

template <typename T>
static void mask_rows(T *out, float *lse, const int32_t *lens, int B, int T_, int C, int NH, cudaStream_t stream)
{
    if (!lens)
        return;
    const dim3 grid((unsigned)B, (unsigned)ZT_CEIL_DIV(T_, MASK_ROWS));
    ZT_ASSERT(grid.y <= 65535);
    attention_mask_rows_kernel<T><<<grid, 128, 0, stream>>>(out, lse, lens, T_, C, NH);
    ZT_CUDA_CHECK_LAUNCH();
}

/* Rows per warp of the mma.sync kernels at head size 64: 32 (the default: every operand fragment read from
 * shared memory feeds two products) or 16 (the earlier kernels, kept to compare against; the variant's
 * mma_warp_rows). Head size 128 always runs 16. */
static int mma_warp_rows(const zt_attention_variant *v) { return v->mma_warp_rows == 16 ? 16 : 32; }

/* The mma.sync kernels' grid: (batch, head) along x and the resident tiles along y, so that blocks start
 * tile by tile across every (batch, head). Under the causal mask a block's work grows with its tile's
 * distance from the diagonal; starting the long blocks first leaves short ones for the last wave, where
 * the x-major order (tiles of one head together) left long blocks starting at the very end. */
template <int HS, int MI> static dim3 mma_grid(int B, int T_, int NH)
{
    const int tiles = ZT_CEIL_DIV(T_, (mma_shape<HS, MI>::ROWS));
    ZT_ASSERT(tiles <= 65535);
    return dim3((unsigned)(B * NH), (unsigned)tiles);
}

/* Launches the mma.sync forward with MI row blocks per warp, causal or bidirectional; false (nothing
 * launched) where it cannot run. */
template <typename T, int HS, int MI>
static bool mma_forward_mi(T *out, float *lse, const T *qkv, const int32_t *lens, int B, int T_, int C, int NH,
                           int NKV, bool causal, float scale_log2, cudaStream_t stream, const zt_attention_variant *v)
{
    const void *ptrs[2] = {out, qkv};
    const size_t smem = mma_shape<HS, MI>::fwd_smem;
    auto kernel = causal ? attention_forward_mma_kernel<T, HS, MI, true> : attention_forward_mma_kernel<T, HS, MI, false>;
    if (!mma_usable<T>(v, kernel, smem, ptrs, 2))
        return false;
    allow_smem(kernel, smem);
    const dim3 grid = mma_grid<HS, MI>(B, T_, NH);
    kernel<<<grid, MMA_THREADS, smem, stream>>>(out, lse, qkv, lens, T_, C, NH, NKV, scale_log2);
    ZT_CUDA_CHECK_LAUNCH();
    return true;
}

template <typename T, int HS>
static bool mma_forward(T *out, float *lse, const T *qkv, const int32_t *lens, int B, int T_, int C, int NH,
                        int NKV, bool causal, float scale_log2, cudaStream_t stream, const zt_attention_variant *v)
{
    if constexpr (HS == 64) {
        if (mma_warp_rows(v) == 32 &&
            mma_forward_mi<T, HS, 2>(out, lse, qkv, lens, B, T_, C, NH, NKV, causal, scale_log2, stream, v))
            return true;
    }
    return mma_forward_mi<T, HS, 1>(out, lse, qkv, lens, B, T_, C, NH, NKV, causal, scale_log2, stream, v);
}

/* The mma.sync backward with MI row blocks per warp; false (nothing launched) where it cannot run. The
 * dK/dV pass then the dQ pass, or with the variant's single_pass the single pass (dK, dV and dQ from one walk;
 * D is then the larger scratch bwd_scratch describes). accumulate false (never with a padding mask, which
 * leaves rows unwritten): the kernels store; otherwise they add. */
template <typename T, int HS, int MI>
static bool mma_backward_mi(T *dqkv, const T *dout, const T *qkv, const float *lse, const int32_t *lens, int B,
                            int T_, int C, int NH, int NKV, bool causal, float *D, float scale, bool accumulate,
                            cudaStream_t stream, const zt_attention_variant *v)
{
    const void *ptrs[3] = {dqkv, dout, qkv};
    if (v->single_pass) {
        const size_t smem = mma_shape<HS, MI>::bwd1_smem;
        auto kernel = causal ? (NKV == NH ? attention_backward_kv_mma_kernel<T, HS, MI, false, true, true>
                                          : attention_backward_kv_mma_kernel<T, HS, MI, true, true, true>)
                             : (NKV == NH ? attention_backward_kv_mma_kernel<T, HS, MI, false, false, true>
                                          : attention_backward_kv_mma_kernel<T, HS, MI, true, false, true>);
        if (!mma_usable<T>(v, kernel, smem, ptrs, 3))
            return false;
        const bwd_scratch sc = bwd_scratch_of(D, B, T_, NH, HS);
        ZT_CUDA_CHECK(cudaMemsetAsync(sc.sems, 0, (sc.sem_count + 1) * sizeof(int), stream));
        allow_smem(kernel, smem);
        kernel<<<mma_grid<HS, MI>(B, T_, NKV), MMA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D, lens, T_, C, NH,
                                                                           NKV, scale, accumulate, sc.dq, sc.sems,
                                                                           sc.sems + sc.sem_count);
        ZT_CUDA_CHECK_LAUNCH();
        const size_t pairs = (size_t)T_ * C / 2;
        const dim3 grid((unsigned)ZT_CEIL_DIV(pairs, (size_t)256), (unsigned)B);
        attention_dq_store_kernel<T><<<grid, 256, 0, stream>>>(dqkv, sc.dq, lens, T_, NH, HS, C + 2 * NKV * HS, scale,
                                                               accumulate);
        ZT_CUDA_CHECK_LAUNCH();
        return true;
    }
    const size_t smem = mma_shape<HS, MI>::bwd_smem;
    /* Grouped-query and bidirectional calls run their own instances, so the causal multi-head kernels
     * (GPT-2's) carry neither the walk over query heads nor the length mask. */
    auto kv_kernel = causal ? (NKV == NH ? attention_backward_kv_mma_kernel<T, HS, MI, false, true, false>
                                         : attention_backward_kv_mma_kernel<T, HS, MI, true, true, false>)
                            : (NKV == NH ? attention_backward_kv_mma_kernel<T, HS, MI, false, false, false>
                                         : attention_backward_kv_mma_kernel<T, HS, MI, true, false, false>);
    auto q_kernel = causal ? (NKV == NH ? attention_backward_q_mma_kernel<T, HS, MI, false, true>
                                        : attention_backward_q_mma_kernel<T, HS, MI, true, true>)
                           : (NKV == NH ? attention_backward_q_mma_kernel<T, HS, MI, false, false>
                                        : attention_backward_q_mma_kernel<T, HS, MI, true, false>);
    if (!mma_usable<T>(v, kv_kernel, smem, ptrs, 3) || !mma_usable<T>(v, q_kernel, smem, ptrs, 3))
        return false;
    allow_smem(kv_kernel, smem);
    kv_kernel<<<mma_grid<HS, MI>(B, T_, NKV), MMA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D, lens, T_, C, NH, NKV,
                                                                          scale, accumulate, nullptr, nullptr, nullptr);
    ZT_CUDA_CHECK_LAUNCH();
    allow_smem(q_kernel, smem);
    q_kernel<<<mma_grid<HS, MI>(B, T_, NH), MMA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D, lens, T_, C, NH, NKV,
                                                                        scale, accumulate);
    ZT_CUDA_CHECK_LAUNCH();
    return true;
}

template <typename T, int HS>
static bool mma_backward(T *dqkv, const T *dout, const T *qkv, const float *lse, const int32_t *lens, int B, int T_,
                         int C, int NH, int NKV, bool causal, float *D, float scale, bool accumulate,
                         cudaStream_t stream, const zt_attention_variant *v)
{
    if constexpr (HS == 64) {
        if (mma_warp_rows(v) == 32 && mma_backward_mi<T, HS, 2>(dqkv, dout, qkv, lse, lens, B, T_, C, NH, NKV, causal, D,
                                                               scale, accumulate, stream, v))
            return true;
    }
    return mma_backward_mi<T, HS, 1>(dqkv, dout, qkv, lse, lens, B, T_, C, NH, NKV, causal, D, scale, accumulate,
                                     stream, v);
}

template <typename T, int HS>
static void forward(T *out, float *lse, const T *qkv, const int32_t *lens, int B, int T_, int C, int NH,
                    cudaStream_t stream, const zt_attention_variant *v)
{
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    if constexpr (!std::is_same<T, float>::value) {
        if (mma_forward<T, HS>(out, lse, qkv, lens, B, T_, C, NH, NH, true, scale_log2, stream, v)) {
            mask_rows(out, lse, lens, B, T_, C, NH, stream);
            return;
        }
        const void *ptrs[2] = {out, qkv};
        const size_t smem = tc_cfg<HS>::fwd_smem;
        if (tc_usable<T>(v, attention_forward_tc_kernel<T, HS>, smem, ptrs, 2)) {
            allow_smem(attention_forward_tc_kernel<T, HS>, smem);
            dim3 grid(ZT_CEIL_DIV(T_, TC_TILE), B * NH);
            attention_forward_tc_kernel<T, HS><<<grid, TC_THREADS, smem, stream>>>(out, lse, qkv, T_, C, NH, scale_log2);
            ZT_CUDA_CHECK_LAUNCH();
            /* Causal rows below the length never see the keys past it: masking rows afterwards is exact. */
            mask_rows(out, lse, lens, B, T_, C, NH, stream);
            return;
        }
    }
    using cfg = att_cfg<T, HS>;
    const size_t smem = 3 * cfg::tile_bytes + cfg::score_bytes;
    allow_smem(attention_forward_kernel<T, HS>, smem);
    dim3 grid(ZT_CEIL_DIV(T_, cfg::TILE), B * NH);
    attention_forward_kernel<T, HS><<<grid, ATT_THREADS, smem, stream>>>(out, lse, qkv, T_, C, NH, scale_log2);
    ZT_CUDA_CHECK_LAUNCH();
    mask_rows(out, lse, lens, B, T_, C, NH, stream);
}

/* accumulate false: dqkv is overwritten (then lens is NULL). The mma.sync kernels store; the other kernels
 * add, into a dqkv zeroed first. */
template <typename T, int HS>
static void backward(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const int32_t *lens,
                     int B, int T_, int C, int NH, float *D, bool accumulate, cudaStream_t stream, const zt_attention_variant *v)
{
    using cfg = att_cfg<T, HS>;
    const size_t items = (size_t)B * T_ * NH;
    attention_rowdot_kernel<T><<<(unsigned)ZT_CEIL_DIV(items, (size_t)8), 256, 0, stream>>>(D, dout, out, B, T_, C,
                                                                                             NH);
    ZT_CUDA_CHECK_LAUNCH();
    const float scale = 1.0f / sqrtf((float)HS);

    /* Padded rows (lens) carry lse = +inf from the forward pass, so P = 0 there in every kernel below;
     * the mma.sync kernels also use lens to skip the padded tiles. */
    if constexpr (!std::is_same<T, float>::value) {
        if (mma_backward<T, HS>(dqkv, dout, qkv, lse, lens, B, T_, C, NH, NH, true, D, scale, accumulate, stream, v))
            return;
    }
    if (!accumulate)
        ZT_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, (size_t)B * T_ * 3 * C * sizeof(T), stream));
    if constexpr (!std::is_same<T, float>::value) {
        const void *ptrs[3] = {dqkv, dout, qkv};
        const size_t smem = tc_cfg<HS>::bwd_smem;
        if (tc_usable<T>(v, attention_backward_kv_tc_kernel<T, HS>, smem, ptrs, 3) &&
            tc_usable<T>(v, attention_backward_q_tc_kernel<T, HS>, smem, ptrs, 3)) {
            dim3 grid(ZT_CEIL_DIV(T_, TC_TILE), B * NH);
            allow_smem(attention_backward_kv_tc_kernel<T, HS>, smem);
            attention_backward_kv_tc_kernel<T, HS><<<grid, TC_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D, T_, C,
                                                                                       NH, scale);
            ZT_CUDA_CHECK_LAUNCH();
            allow_smem(attention_backward_q_tc_kernel<T, HS>, smem);
            attention_backward_q_tc_kernel<T, HS><<<grid, TC_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D, T_, C,
                                                                                      NH, scale);
            ZT_CUDA_CHECK_LAUNCH();
            return;
        }
    }
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

/* ---- dispatch between the tuned kernels above and the generic ones (attention_generic.cu) ---- */

/* Whether the kernels of this file serve the call: causal multi-head attention at head size 64 or 128. */
static bool tuned_serves(const zt_attention_dims *d, const zt_attention_variant *v)
{
    return !v->generic && d->causal && d->NKV == d->NH && (d->HS == 64 || d->HS == 128);
}

static bool head_size_served(int HS) { return HS == 64 || HS == 128 || zt__cuda_attention_generic_serves(HS); }

extern "C" bool zt_cuda_attention_supported(int C, int NH)
{
    return NH > 0 && C > 0 && C % NH == 0 && head_size_served(C / NH);
}

extern "C" bool zt__cuda_attention_packed_serves(const zt_attention_dims *d)
{
    return d->NH > 0 && d->NKV > 0 && d->NH % d->NKV == 0 && head_size_served(d->HS);
}

/* The descriptor of packed-qkv call d (the layout of zt_cuda_attention_forward_gqa), for the head sizes the
 * packed kernels are not built for: the descriptor's general kernels serve them (attention_desc.cu). */
static zt_attention_desc packed_desc(void *out, float *lse, const void *qkv, const int32_t *lens,
                                     const zt_attention_dims *d, enum zt_dtype dtype)
{
    const long W = (long)(d->NH + 2 * d->NKV) * d->HS;
    const size_t es = zt_dtype_size(dtype);
    const char *q = (const char *)qkv;
    return zt_attention_desc{.q = q, .k = q + (size_t)d->NH * d->HS * es, .v = q + (size_t)(d->NH + d->NKV) * d->HS * es,
                             .q_stride = W, .k_stride = W, .v_stride = W, .out = out, .out_stride = (long)d->NH * d->HS,
                             .lse = lse, .B = d->B, .Tq = d->T, .Tk = d->T, .NH = d->NH, .NKV = d->NKV, .HS = d->HS,
                             .scale = 0.0f, .causal = d->causal, .window = -1, .lens = lens};
}

/* The head sizes the descriptor's general kernels take beside the packed ones, and B x NH within their grid. */
static bool general_serves(const zt_attention_dims *d)
{
    return d->HS > 0 && d->HS <= 256 && (long)d->B * d->NH <= 65535;
}

extern "C" bool zt_cuda_attention_gqa_supported(const zt_attention_dims *d)
{
    return zt__cuda_attention_packed_serves(d) ||
           (d->NH > 0 && d->NKV > 0 && d->NH % d->NKV == 0 && general_serves(d));
}

extern "C" size_t zt_cuda_attention_backward_scratch_size(int B, int T, int NH)
{
    return (size_t)B * NH * T * sizeof(float);
}

extern "C" size_t zt_cuda_attention_backward_gqa_scratch_size(const zt_attention_dims *d)
{
    return zt_cuda_attention_backward_scratch_size(d->B, d->T, d->NH);
}

extern "C" size_t zt__cuda_attention_single_pass_scratch_size(const zt_attention_dims *d)
{
    return bwd_scratch_floats(d->B, d->T, d->NH, d->HS) * sizeof(float);
}

template <typename T>
static void forward_hs(T *out, float *lse, const T *qkv, const int32_t *lens, int B, int T_, int C, int NH,
                       cudaStream_t stream, const zt_attention_variant *v)
{
    if (C / NH == 64)
        forward<T, 64>(out, lse, qkv, lens, B, T_, C, NH, stream, v);
    else
        forward<T, 128>(out, lse, qkv, lens, B, T_, C, NH, stream, v);
}

template <typename T>
static void backward_hs(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const int32_t *lens,
                        int B, int T_, int C, int NH, float *D, bool accumulate, cudaStream_t stream, const zt_attention_variant *v)
{
    if (C / NH == 64)
        backward<T, 64>(dqkv, dout, qkv, out, lse, lens, B, T_, C, NH, D, accumulate, stream, v);
    else
        backward<T, 128>(dqkv, dout, qkv, out, lse, lens, B, T_, C, NH, D, accumulate, stream, v);
}

/* Grouped-query (NKV < NH) or bidirectional attention on the mma.sync kernels: head size 64 or 128, F16 or
 * BF16, with or without padding. The launchers return false (nothing launched) where they cannot run; the
 * generic kernels serve the call then. */
static bool gqa_tuned_candidate(const zt_attention_dims *d, enum zt_dtype dtype, const zt_attention_variant *v)
{
    return !v->generic && (d->NKV != d->NH || !d->causal) && (d->HS == 64 || d->HS == 128) &&
           (dtype == ZT_DTYPE_F16 || dtype == ZT_DTYPE_BF16);
}

template <typename T, int HS>
static bool gqa_forward_t(void *out, float *lse, const void *qkv, const int32_t *lens, const zt_attention_dims *d,
                          cudaStream_t stream, const zt_attention_variant *v)
{
    const int C = d->NH * HS;
    if (!mma_forward<T, HS>((T *)out, lse, (const T *)qkv, lens, d->B, d->T, C, d->NH, d->NKV, d->causal,
                            LOG2E / sqrtf((float)HS), stream, v))
        return false;
    mask_rows((T *)out, lse, lens, d->B, d->T, C, d->NH, stream);
    return true;
}

template <typename T, int HS>
static bool gqa_backward_t(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                           const int32_t *lens, const zt_attention_dims *d, float *D, bool accumulate,
                           cudaStream_t stream, const zt_attention_variant *v)
{
    const int C = d->NH * HS;
    const size_t items = (size_t)d->B * d->T * d->NH;
    attention_rowdot_kernel<T><<<(unsigned)ZT_CEIL_DIV(items, (size_t)8), 256, 0, stream>>>(
        D, (const T *)dout, (const T *)out, d->B, d->T, C, d->NH);
    ZT_CUDA_CHECK_LAUNCH();
    return mma_backward<T, HS>((T *)dqkv, (const T *)dout, (const T *)qkv, lse, lens, d->B, d->T, C, d->NH, d->NKV,
                               d->causal, D, 1.0f / sqrtf((float)HS), accumulate, stream, v);
}

static bool gqa_tuned_forward(void *out, float *lse, const void *qkv, const int32_t *lens, const zt_attention_dims *d,
                              enum zt_dtype dtype, cudaStream_t stream, const zt_attention_variant *v)
{
    if (!gqa_tuned_candidate(d, dtype, v))
        return false;
    if (dtype == ZT_DTYPE_BF16)
        return d->HS == 64 ? gqa_forward_t<__nv_bfloat16, 64>(out, lse, qkv, lens, d, stream, v)
                           : gqa_forward_t<__nv_bfloat16, 128>(out, lse, qkv, lens, d, stream, v);
    return d->HS == 64 ? gqa_forward_t<__half, 64>(out, lse, qkv, lens, d, stream, v)
                       : gqa_forward_t<__half, 128>(out, lse, qkv, lens, d, stream, v);
}

static bool gqa_tuned_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                               const int32_t *lens, const zt_attention_dims *d, float *D, bool accumulate,
                               enum zt_dtype dtype, cudaStream_t stream, const zt_attention_variant *v)
{
    if (dtype == ZT_DTYPE_BF16)
        return d->HS == 64 ? gqa_backward_t<__nv_bfloat16, 64>(dqkv, dout, qkv, out, lse, lens, d, D, accumulate, stream, v)
                           : gqa_backward_t<__nv_bfloat16, 128>(dqkv, dout, qkv, out, lse, lens, d, D, accumulate,
                                                                 stream, v);
    return d->HS == 64 ? gqa_backward_t<__half, 64>(dqkv, dout, qkv, out, lse, lens, d, D, accumulate, stream, v)
                       : gqa_backward_t<__half, 128>(dqkv, dout, qkv, out, lse, lens, d, D, accumulate, stream, v);
}

extern "C" void zt__cuda_attention_packed_forward(void *out, float *lse, const void *qkv, const int32_t *lens,
                                                  const zt_attention_dims *d, enum zt_dtype dtype, cudaStream_t stream,
                                                  const zt_attention_variant *v)
{
    const zt_attention_variant none = {};
    if (!v)
        v = &none;
    ZT_ASSERT(d->B > 0 && d->T > 0 && zt__cuda_attention_packed_serves(d));
    if (!tuned_serves(d, v)) {
        if (!gqa_tuned_forward(out, lse, qkv, lens, d, dtype, stream, v))
            zt__cuda_attention_generic_forward(out, lse, qkv, lens, d, dtype, stream, v);
        return;
    }
    const int B = d->B, T = d->T, NH = d->NH, C = d->NH * d->HS;
    ZT_ASSERT(((uintptr_t)qkv & 3u) == 0);
    switch (dtype) {
    case ZT_DTYPE_F32:
        forward_hs((float *)out, lse, (const float *)qkv, lens, B, T, C, NH, stream, v);
        break;
    case ZT_DTYPE_F16:
        forward_hs((__half *)out, lse, (const __half *)qkv, lens, B, T, C, NH, stream, v);
        break;
    case ZT_DTYPE_BF16:
        forward_hs((__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)qkv, lens, B, T, C, NH, stream, v);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_forward", dtype);
    }
}

/* The tuned backward: accumulate true adds into dqkv, false overwrites it (then lens is NULL). */
static void backward_tuned(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                           const int32_t *lens, int B, int T, int C, int NH, void *scratch, enum zt_dtype dtype,
                           bool accumulate, cudaStream_t stream, const zt_attention_variant *v)
{
    ZT_ASSERT(((uintptr_t)qkv & 3u) == 0 && ((uintptr_t)dout & 3u) == 0 && ((uintptr_t)scratch & 3u) == 0);
    ZT_ASSERT(accumulate || lens == NULL); /* an overwrite would leave the padded rows unwritten */
    float *D = (float *)scratch;
    switch (dtype) {
    case ZT_DTYPE_F32:
        backward_hs((float *)dqkv, (const float *)dout, (const float *)qkv, (const float *)out, lse, lens, B, T, C, NH, D,
                    accumulate, stream, v);
        break;
    case ZT_DTYPE_F16:
        backward_hs((__half *)dqkv, (const __half *)dout, (const __half *)qkv, (const __half *)out, lse, lens, B, T,
                    C, NH, D, accumulate, stream, v);
        break;
    case ZT_DTYPE_BF16:
        backward_hs((__nv_bfloat16 *)dqkv, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)qkv,
                    (const __nv_bfloat16 *)out, lse, lens, B, T, C, NH, D, accumulate, stream, v);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_backward", dtype);
    }
}

/* Zeroes rows t >= lens[b] of x [B, T, W] (16-bit types). */
static void mask_rows_any(void *x, const int32_t *lens, int B, int T_, int W, enum zt_dtype dtype, cudaStream_t stream)
{
    if (dtype == ZT_DTYPE_BF16)
        mask_rows((__nv_bfloat16 *)x, (float *)NULL, lens, B, T_, W, 0, stream);
    else if (dtype == ZT_DTYPE_F16)
        mask_rows((__half *)x, (float *)NULL, lens, B, T_, W, 0, stream);
    else
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_backward_gqa", dtype);
}

extern "C" void zt__cuda_attention_packed_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                                   const float *lse, const int32_t *lens, const zt_attention_dims *d,
                                                   bool accumulate, void *scratch, enum zt_dtype dtype,
                                                   cudaStream_t stream, const zt_attention_variant *v)
{
    const zt_attention_variant none = {};
    if (!v)
        v = &none;
    ZT_ASSERT(d->B > 0 && d->T > 0 && zt__cuda_attention_packed_serves(d));
    const bool tuned = tuned_serves(d, v);
    if (!tuned && gqa_tuned_candidate(d, dtype, v)) {
        ZT_ASSERT(((uintptr_t)scratch & 3u) == 0);
        if (gqa_tuned_backward(dqkv, dout, qkv, out, lse, lens, d, (float *)scratch, accumulate, dtype, stream, v)) {
            /* Overwriting, the mma.sync kernels store every row below the length and leave the padded rows,
             * which become zero here (instead of adding into a zeroed dqkv: a third of the traffic). */
            if (!accumulate && lens)
                mask_rows_any(dqkv, lens, d->B, d->T, (d->NH + 2 * d->NKV) * d->HS, dtype, stream);
            return;
        }
    }
    if (!accumulate && (lens || !tuned)) {
        /* Only the tuned kernels without a mask store their results directly; the others add into zeros. */
        const size_t n = (size_t)d->B * d->T * (d->NH + 2 * d->NKV) * d->HS;
        ZT_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, n * zt_dtype_size(dtype), stream));
        accumulate = true;
    }
    if (tuned)
        backward_tuned(dqkv, dout, qkv, out, lse, lens, d->B, d->T, d->NH * d->HS, d->NH, scratch, dtype, accumulate,
                       stream, v);
    else
        zt__cuda_attention_generic_backward(dqkv, dout, qkv, out, lse, lens, d, (float *)scratch, dtype, stream, v);
}

extern "C" void zt_cuda_attention_forward_gqa(void *out, float *lse, const void *qkv, const int32_t *lens,
                                              const zt_attention_dims *d, enum zt_dtype dtype, cudaStream_t stream)
{
    if (zt__cuda_attention_packed_serves(d)) {
        zt__cuda_attention_packed_forward(out, lse, qkv, lens, d, dtype, stream, NULL);
        return;
    }
    const zt_attention_desc ad = packed_desc(out, lse, qkv, lens, d, dtype);
    zt_err err = {};
    const int rc = zt_cuda_attention_fwd(&ad, dtype, stream, &err);
    if (rc != 0)
        fprintf(stderr, "attention forward: %s\n", err.msg);
    ZT_ASSERT(rc == 0); /* zt_cuda_attention_gqa_supported(d) */
}

extern "C" void zt_cuda_attention_backward_gqa(void *dqkv, const void *dout, const void *qkv, const void *out,
                                               const float *lse, const int32_t *lens, const zt_attention_dims *d,
                                               bool accumulate, void *scratch, enum zt_dtype dtype,
                                               cudaStream_t stream)
{
    if (zt__cuda_attention_packed_serves(d)) {
        zt__cuda_attention_packed_backward(dqkv, dout, qkv, out, lse, lens, d, accumulate, scratch, dtype, stream,
                                           NULL);
        return;
    }
    const zt_attention_desc ad = packed_desc((void *)out, (float *)lse, qkv, lens, d, dtype);
    const long W = (long)(d->NH + 2 * d->NKV) * d->HS;
    const size_t es = zt_dtype_size(dtype);
    char *dq = (char *)dqkv;
    const zt_attention_grads g = {.dout = dout, .dq = dq, .dk = dq + (size_t)d->NH * d->HS * es,
                                  .dv = dq + (size_t)(d->NH + d->NKV) * d->HS * es, .dq_stride = W, .dk_stride = W,
                                  .dv_stride = W, .dbias_table = NULL, .accumulate = accumulate};
    ZT_ASSERT(zt_cuda_attention_bwd_scratch_size(&ad) <= zt_cuda_attention_backward_gqa_scratch_size(d));
    zt_err err = {};
    const int rc = zt_cuda_attention_bwd(&ad, &g, scratch, dtype, stream, &err);
    if (rc != 0)
        fprintf(stderr, "attention backward: %s\n", err.msg);
    ZT_ASSERT(rc == 0);
}

/* The multi-head entry points: causal, NKV = NH. */
static zt_attention_dims mha_dims(int B, int T, int C, int NH)
{
    ZT_ASSERT(zt_cuda_attention_supported(C, NH));
    zt_attention_dims d = {B, T, NH, NH, C / NH, true};
    return d;
}

extern "C" void zt_cuda_attention_forward_masked(void *out, float *lse, const void *qkv, const int32_t *lens, int B,
                                                 int T, int C, int NH, enum zt_dtype dtype, cudaStream_t stream)
{
    const zt_attention_dims d = mha_dims(B, T, C, NH);
    zt_cuda_attention_forward_gqa(out, lse, qkv, lens, &d, dtype, stream);
}

extern "C" void zt_cuda_attention_backward_masked(void *dqkv, const void *dout, const void *qkv, const void *out,
                                                  const float *lse, const int32_t *lens, int B, int T, int C, int NH,
                                                  void *scratch, enum zt_dtype dtype, cudaStream_t stream)
{
    const zt_attention_dims d = mha_dims(B, T, C, NH);
    zt_cuda_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, &d, true, scratch, dtype, stream);
}

extern "C" void zt_cuda_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                                          enum zt_dtype dtype, cudaStream_t stream)
{
    zt_cuda_attention_forward_masked(out, lse, qkv, NULL, B, T, C, NH, dtype, stream);
}

extern "C" void zt_cuda_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                           const float *lse, int B, int T, int C, int NH, void *scratch,
                                           enum zt_dtype dtype, cudaStream_t stream)
{
    zt_cuda_attention_backward_masked(dqkv, dout, qkv, out, lse, NULL, B, T, C, NH, scratch, dtype, stream);
}

extern "C" void zt_cuda_attention_backward_overwrite(void *dqkv, const void *dout, const void *qkv, const void *out,
                                                     const float *lse, int B, int T, int C, int NH, void *scratch,
                                                     enum zt_dtype dtype, cudaStream_t stream)
{
    const zt_attention_dims d = mha_dims(B, T, C, NH);
    zt_cuda_attention_backward_gqa(dqkv, dout, qkv, out, lse, NULL, &d, false, scratch, dtype, stream);
}
