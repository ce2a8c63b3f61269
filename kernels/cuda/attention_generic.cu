/* Generic attention on the GPU: every shape the tuned kernels of attention.cu do not serve (head sizes 32,
 * 64, 80, 96, 128 and 256; grouped-query heads; causal or bidirectional; a padding mask), in fp32, fp16
 * and bf16 on every GPU. Simpler than the tuned kernels, but tiled and flash style like them: nothing of
 * size T x T in memory, an online softmax in fp32, and a deterministic backward without atomics. The
 * CUDA-core kernels below serve every case; tensor-core twins further down take bf16 and fp16 on sm_80+.
 *
 * Forward: a block owns a tile of TILE query rows of one (batch, query head) and walks the key tiles of the
 * head's key/value head, up to the diagonal (causal) or the sequence's length. Grids put the (batch, head)
 * pairs along x and the tiles along y. Q, K, V tiles sit in shared
 * memory in the storage type; scores, the running max m and sum l (base 2) and the output accumulator are
 * fp32 in registers; the block saves lse = m + log(l) per row.
 *
 * Backward (D = rowsum(dout * out) first, one warp per row and head):
 *   P = exp(S - lse),  dV += P^T dO,  dP = dO V^T,  dS = P (dP - D),  dK += dS^T Q,  dQ += dS K
 * in two kernels so that every element of dqkv is written by one block: one over (key/value head, key
 * tile) blocks walks the query tiles of all the query heads that share the key/value head, in head order,
 * and writes dK and dV; one over (query head, query tile) blocks walks the key tiles and writes dQ.
 *
 * Threads: 256 as a 16 x 16 grid (ty, tx); a thread owns TILE/16 rows (ty * TM + i) of a tile and the
 * columns tx + 16 j of scores and of head channels (HS/16 of them), so the 16 threads of a half-warp share
 * rows (row reductions are 4 shuffles) and read consecutive columns. Shared rows are padded by one 32-bit
 * word (conflict-free reads along rows and along columns); score rows are padded so that the two
 * half-warps of a warp use different banks. TILE (16, 32 or 64) keeps each tile within 8 KiB.
 *
 * Padding (lens): keys at or past a sequence's length are masked in every row; K and V rows past it are
 * loaded as zeros, and query rows past it produce zeros and lse = +inf (so P = 0 on them in the backward,
 * which also reads the mask from lens). Blocks whose whole tile is padding do no products.
 *
 * For bf16 and fp16 on sm_80+ (head sizes up to 128, 16-byte aligned buffers, enough shared memory) the
 * same passes run on the tensor cores instead, with the mma.sync building blocks of attention_mma.cuh: a
 * block of 4 warps owns 64 resident rows (16 per warp) and walks the 64-row tiles of the other side,
 * double buffered with cp.async; P and dS stay in registers between their two products, rounded to the
 * storage type as the tuned kernels do. A zt_attention_variant with cuda_cores or wmma keeps every call on
 * the CUDA cores. */
#include <math.h>

#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace {

constexpr int GEN_THREADS = 256;
constexpr float GEN_LOG2E = 1.4426950408889634f;

/* The shape of a call, in the form the kernels use. */
struct gen_args {
    int T, NH, NKV, G;   /* positions, query heads, key/value heads, NH / NKV */
    int stride;          /* row stride of qkv and dqkv: (NH + 2 NKV) HS */
    int koff, voff;      /* columns of key head 0 and value head 0 */
    int ostride;         /* row stride of out and dout: NH HS */
    bool causal;
};

template <typename T, int HS> struct gen_cfg {
    static_assert(HS % 16 == 0, "the head size must be a multiple of 16");
    static constexpr int TILE_RAW = 8192 / (HS * (int)sizeof(T));
    static constexpr int TILE = TILE_RAW >= 64 ? 64 : TILE_RAW >= 32 ? 32 : 16;
    static constexpr int EPW = 4 / (int)sizeof(T);            /* elements per 32-bit word */
    static constexpr int ROW = HS + EPW;                       /* padded shared row, elements */
    static constexpr int TM = TILE / 16;                       /* tile rows per thread */
    static constexpr int TN = TILE / 16;                       /* score columns per thread */
    static constexpr int TH = HS / 16;                         /* head channels per thread */
    static constexpr int PS = TILE + (TM == 1 ? 0 : 16 / TM);  /* score row stride, floats */
    static constexpr size_t tile_bytes = (size_t)TILE * ROW * sizeof(T);
    static constexpr size_t score_bytes = (size_t)TILE * PS * sizeof(float);
    static constexpr size_t fwd_smem = 3 * tile_bytes + score_bytes;
    static constexpr size_t kv_smem = 4 * tile_bytes + score_bytes + 2 * TILE * sizeof(float);
    static constexpr size_t q_smem = 4 * tile_bytes + score_bytes;
};

/* The valid length of sequence b. */
__device__ __forceinline__ int gen_len(const int32_t *lens, int b, int T_)
{
    return lens ? max(0, min(lens[b], T_)) : T_;
}

/* Copies rows [t0, t0 + TILE) of one head's columns (base: row 0, column 0 of the head) of a tensor with
 * row stride `stride` into a padded shared tile, 32 bits at a time; rows at or past tend are zero. */
template <typename T, int HS>
__device__ __forceinline__ void gen_load_tile(T *tile, const T *base, int t0, int tend, int stride)
{
    using cfg = gen_cfg<T, HS>;
    constexpr int WPR = HS / cfg::EPW; /* words per row */
    for (int idx = threadIdx.x; idx < cfg::TILE * WPR; idx += GEN_THREADS) {
        const int r = idx / WPR, w = idx % WPR, t = t0 + r;
        uint32_t val = 0;
        if (t < tend)
            val = reinterpret_cast<const uint32_t *>(base + (size_t)t * stride)[w];
        reinterpret_cast<uint32_t *>(tile + r * cfg::ROW)[w] = val;
    }
}

/* Two consecutive elements (index d even) of a shared row as floats. */
template <typename T> __device__ __forceinline__ float2 gen_pair(const T *p);
template <> __device__ __forceinline__ float2 gen_pair<float>(const float *p) { return make_float2(p[0], p[1]); }
template <> __device__ __forceinline__ float2 gen_pair<__half>(const __half *p)
{
    return __half22float2(*reinterpret_cast<const __half2 *>(p));
}
template <> __device__ __forceinline__ float2 gen_pair<__nv_bfloat16>(const __nv_bfloat16 *p)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}

/* acc[i][j] = dot(A row (ty*TM + i), B row (tx + 16 j)) over HS channels; A, B padded shared tiles. */
template <typename T, int HS>
__device__ __forceinline__ void gen_tile_dot(float (&acc)[gen_cfg<T, HS>::TM][gen_cfg<T, HS>::TN], const T *A,
                                             const T *B, int ty, int tx)
{
    using cfg = gen_cfg<T, HS>;
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
            a[i] = gen_pair(A + (ty * cfg::TM + i) * cfg::ROW + d);
#pragma unroll
        for (int j = 0; j < cfg::TN; j++)
            b[j] = gen_pair(B + (tx + 16 * j) * cfg::ROW + d);
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
__device__ __forceinline__ void gen_tile_mul_acc(float (&acc)[gen_cfg<T, HS>::TM][gen_cfg<T, HS>::TH],
                                                 const float *S, const T *X, int ty, int tx)
{
    using cfg = gen_cfg<T, HS>;
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
__device__ __forceinline__ float gen_half_warp_sum(float v)
{
    for (int o = 8; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float gen_half_warp_max(float v)
{
    for (int o = 8; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- forward ---- */

template <typename T, int HS>
__global__ void __launch_bounds__(GEN_THREADS)
    gen_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                       const int32_t *__restrict__ lens, gen_args a, float scale_log2)
{
    using cfg = gen_cfg<T, HS>;
    constexpr int TILE = cfg::TILE, TM = cfg::TM, TN = cfg::TN, TH = cfg::TH;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = reinterpret_cast<T *>(smem + cfg::tile_bytes);
    T *Vs = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
    float *Ps = reinterpret_cast<float *>(smem + 3 * cfg::tile_bytes);

    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    /* Blocks start in order of blockIdx.y, then x: causal, the last query tiles of every head (the most
     * keys to walk) start first and the short ones fill the last wave. */
    const int qt = a.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
    const int T_ = a.T, q0 = qt * TILE;
    const int len = gen_len(lens, b, T_);
    const T *base = qkv + (size_t)b * T_ * a.stride;
    T *obase = out + (size_t)b * T_ * a.ostride + h * HS;
    float *lrow = lse + (size_t)bh * T_;

    if (q0 >= len) { /* every row of the tile is padding */
        for (int idx = threadIdx.x; idx < TILE * HS; idx += GEN_THREADS) {
            const int r = q0 + idx / HS;
            if (r < T_)
                obase[(size_t)r * a.ostride + idx % HS] = zt_from_float<T>(0.0f);
        }
        for (int r = q0 + threadIdx.x; r < min(q0 + TILE, T_); r += GEN_THREADS)
            lrow[r] = INFINITY;
        return;
    }

    gen_load_tile<T, HS>(Qs, base + h * HS, q0, T_, a.stride);
    float m[TM], l[TM], o[TM][TH];
#pragma unroll
    for (int i = 0; i < TM; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < TH; j++)
            o[i][j] = 0.0f;
    }

    /* Keys [0, kend) matter to some row of the tile. */
    const int kend = a.causal ? min(q0 + TILE, len) : len;
    const int nkt = ZT_CEIL_DIV(kend, TILE);
    const T *kbase = base + a.koff + g * HS, *vbase = base + a.voff + g * HS;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * TILE;
        __syncthreads(); /* the previous tile's readers are done */
        gen_load_tile<T, HS>(Ks, kbase, k0, len, a.stride);
        gen_load_tile<T, HS>(Vs, vbase, k0, len, a.stride);
        __syncthreads();

        float s[TM][TN];
        gen_tile_dot<T, HS>(s, Qs, Ks, ty, tx);
#pragma unroll
        for (int i = 0; i < TM; i++) {
            const int r = q0 + ty * TM + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int c = k0 + tx + 16 * j;
                const bool valid = c < len && (!a.causal || c <= r);
                s[i][j] = valid ? s[i][j] * scale_log2 : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            /* Key 0 is in the first tile and valid for every row (len > 0 here), so m is finite from the
             * first tile on and alpha = exp2(-inf) = 0 there. */
            const float m_new = fmaxf(m[i], gen_half_warp_max(mx));
            const float alpha = exp2f(m[i] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const float p = exp2f(s[i][j] - m_new);
                sum += p;
                Ps[(ty * TM + i) * cfg::PS + tx + 16 * j] = p;
            }
            l[i] = l[i] * alpha + gen_half_warp_sum(sum);
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < TH; j++)
                o[i][j] *= alpha;
        }
        __syncthreads();
        gen_tile_mul_acc<T, HS>(o, Ps, Vs, ty, tx);
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int r = q0 + ty * TM + i;
        if (r >= T_)
            continue;
        const bool valid = r < len;
        const float inv = 1.0f / l[i];
        T *orow = obase + (size_t)r * a.ostride;
#pragma unroll
        for (int j = 0; j < TH; j++)
            orow[tx + 16 * j] = zt_from_float<T>(valid ? o[i][j] * inv : 0.0f);
        if (tx == 0)
            lrow[r] = valid ? (m[i] + log2f(l[i])) / GEN_LOG2E : INFINITY;
    }
}

/* ---- backward ---- */

/* D[b,h,t] = sum over the head's channels of dout * out: one warp per (b, t, h). */
template <typename T>
__global__ void gen_rowdot_kernel(float *__restrict__ D, const T *__restrict__ dout, const T *__restrict__ out, int B,
                                  int T_, int NH, int HS)
{
    const int lane = threadIdx.x % ZT_WARP_SIZE;
    const size_t item = (size_t)blockIdx.x * (blockDim.x / ZT_WARP_SIZE) + threadIdx.x / ZT_WARP_SIZE;
    if (item >= (size_t)B * T_ * NH)
        return;
    const int h = (int)(item % NH);
    const size_t bt = item / NH;
    const int t = (int)(bt % T_), b = (int)(bt / T_);
    const T *g = dout + bt * NH * HS + h * HS, *o = out + bt * NH * HS + h * HS;
    float acc = 0.0f;
    for (int d = lane; d < HS; d += ZT_WARP_SIZE)
        acc += zt_to_float(g[d]) * zt_to_float(o[d]);
    acc = zt_warp_sum(acc);
    if (lane == 0)
        D[((size_t)b * NH + h) * T_ + t] = acc;
}

/* dK, dV of one key tile of one key/value head: the sums over its G query heads (in order) and their
 * query tiles (from the diagonal on when causal). */
template <typename T, int HS>
__global__ void __launch_bounds__(GEN_THREADS)
    gen_backward_kv_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                           const float *__restrict__ lse, const float *__restrict__ D, const int32_t *__restrict__ lens,
                           gen_args a, float scale)
{
    using cfg = gen_cfg<T, HS>;
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
    const int kt = blockIdx.y; /* causal: the first key tiles see the most query tiles, and start first */
    const int bg = blockIdx.x, b = bg / a.NKV, g = bg % a.NKV;
    const int T_ = a.T, k0 = kt * TILE;
    const int len = gen_len(lens, b, T_);
    if (k0 >= len)
        return; /* padded keys: no query sees them */
    const T *base = qkv + (size_t)b * T_ * a.stride;
    const float scale_log2 = scale * GEN_LOG2E;
    const int nqt = ZT_CEIL_DIV(len, TILE);

    gen_load_tile<T, HS>(Ks, base + a.koff + g * HS, k0, len, a.stride);
    gen_load_tile<T, HS>(Vs, base + a.voff + g * HS, k0, len, a.stride);

    float dk[TM][TH], dv[TM][TH];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TH; j++)
            dk[i][j] = dv[i][j] = 0.0f;

    for (int hh = 0; hh < a.G; hh++) {
        const int h = g * a.G + hh, bh = b * a.NH + h;
        const T *qbase = base + h * HS;
        const T *dobase = dout + (size_t)b * T_ * a.ostride + h * HS;
        for (int qt = a.causal ? kt : 0; qt < nqt; qt++) {
            const int q0 = qt * TILE;
            __syncthreads();
            gen_load_tile<T, HS>(Qs, qbase, q0, len, a.stride);
            gen_load_tile<T, HS>(dOs, dobase, q0, len, a.ostride);
            for (int r = threadIdx.x; r < TILE; r += GEN_THREADS) {
                const int t = q0 + r;
                lse_s[r] = t < len ? lse[(size_t)bh * T_ + t] * GEN_LOG2E : INFINITY; /* P = 0 on padded rows */
                D_s[r] = t < len ? D[(size_t)bh * T_ + t] : 0.0f;
            }
            __syncthreads();

            /* Transposed scores: rows are this thread's keys c, columns queries r = tx + 16 j. */
            float p[TM][TN], dp[TM][TN];
            gen_tile_dot<T, HS>(p, Ks, Qs, ty, tx);
            gen_tile_dot<T, HS>(dp, Vs, dOs, ty, tx);
#pragma unroll
            for (int i = 0; i < TM; i++) {
                const int c = k0 + ty * TM + i;
#pragma unroll
                for (int j = 0; j < TN; j++) {
                    const int rr = tx + 16 * j, r = q0 + rr;
                    /* Keys at or past len belong to rows of dK, dV that are not written. */
                    const float pv = !a.causal || c <= r ? exp2f(p[i][j] * scale_log2 - lse_s[rr]) : 0.0f;
                    p[i][j] = pv;
                    dp[i][j] = pv * (dp[i][j] - D_s[rr]); /* dS */
                    Ps[(ty * TM + i) * cfg::PS + rr] = pv;
                }
            }
            __syncthreads();
            gen_tile_mul_acc<T, HS>(dv, Ps, dOs, ty, tx); /* dV += P^T dO */
            __syncthreads();
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++)
                    Ps[(ty * TM + i) * cfg::PS + tx + 16 * j] = dp[i][j];
            __syncthreads();
            gen_tile_mul_acc<T, HS>(dk, Ps, Qs, ty, tx); /* dK += dS^T Q */
        }
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int c = k0 + ty * TM + i;
        if (c >= len)
            continue;
        T *row = dqkv + ((size_t)b * T_ + c) * a.stride;
#pragma unroll
        for (int j = 0; j < TH; j++) {
            T *pk = row + a.koff + g * HS + tx + 16 * j, *pv = row + a.voff + g * HS + tx + 16 * j;
            *pk = zt_from_float<T>(zt_to_float(*pk) + dk[i][j] * scale);
            *pv = zt_from_float<T>(zt_to_float(*pv) + dv[i][j]);
        }
    }
}

/* dQ of one query tile of one query head. */
template <typename T, int HS>
__global__ void __launch_bounds__(GEN_THREADS)
    gen_backward_q_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                          const float *__restrict__ lse, const float *__restrict__ D, const int32_t *__restrict__ lens,
                          gen_args a, float scale)
{
    using cfg = gen_cfg<T, HS>;
    constexpr int TILE = cfg::TILE, TM = cfg::TM, TN = cfg::TN, TH = cfg::TH;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem);
    T *dOs = reinterpret_cast<T *>(smem + cfg::tile_bytes);
    T *Ks = reinterpret_cast<T *>(smem + 2 * cfg::tile_bytes);
    T *Vs = reinterpret_cast<T *>(smem + 3 * cfg::tile_bytes);
    float *Ps = reinterpret_cast<float *>(smem + 4 * cfg::tile_bytes);

    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int qt = a.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
    const int T_ = a.T, q0 = qt * TILE;
    const int len = gen_len(lens, b, T_);
    if (q0 >= len)
        return; /* padded rows get no gradient */
    const T *base = qkv + (size_t)b * T_ * a.stride;
    const T *dobase = dout + (size_t)b * T_ * a.ostride + h * HS;
    const float scale_log2 = scale * GEN_LOG2E;

    gen_load_tile<T, HS>(Qs, base + h * HS, q0, len, a.stride);
    gen_load_tile<T, HS>(dOs, dobase, q0, len, a.ostride);

    float lse2[TM], Dr[TM], dq[TM][TH];
#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int r = q0 + ty * TM + i;
        lse2[i] = r < len ? lse[(size_t)bh * T_ + r] * GEN_LOG2E : INFINITY;
        Dr[i] = r < len ? D[(size_t)bh * T_ + r] : 0.0f;
#pragma unroll
        for (int j = 0; j < TH; j++)
            dq[i][j] = 0.0f;
    }

    const int kend = a.causal ? min(q0 + TILE, len) : len;
    const int nkt = ZT_CEIL_DIV(kend, TILE);
    const T *kbase = base + a.koff + g * HS, *vbase = base + a.voff + g * HS;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * TILE;
        __syncthreads();
        gen_load_tile<T, HS>(Ks, kbase, k0, len, a.stride);
        gen_load_tile<T, HS>(Vs, vbase, k0, len, a.stride);
        __syncthreads();

        float s[TM][TN], dp[TM][TN];
        gen_tile_dot<T, HS>(s, Qs, Ks, ty, tx);
        gen_tile_dot<T, HS>(dp, dOs, Vs, ty, tx);
#pragma unroll
        for (int i = 0; i < TM; i++) {
            const int r = q0 + ty * TM + i;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int c = k0 + tx + 16 * j;
                const bool valid = c < len && (!a.causal || c <= r);
                const float pv = valid ? exp2f(s[i][j] * scale_log2 - lse2[i]) : 0.0f;
                Ps[(ty * TM + i) * cfg::PS + tx + 16 * j] = pv * (dp[i][j] - Dr[i]); /* dS */
            }
        }
        __syncthreads();
        gen_tile_mul_acc<T, HS>(dq, Ps, Ks, ty, tx); /* dQ += dS K */
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int r = q0 + ty * TM + i;
        if (r >= len)
            continue;
        T *row = dqkv + ((size_t)b * T_ + r) * a.stride + h * HS;
#pragma unroll
        for (int j = 0; j < TH; j++) {
            const int d = tx + 16 * j;
            row[d] = zt_from_float<T>(zt_to_float(row[d]) + dq[i][j] * scale);
        }
    }
}

/* ---- tensor-core kernels (bf16 and fp16 on sm_80+) ---- */

/* One 16-row block per warp: 64 resident rows, the size of a walked tile (MMA_TILE). */
template <int HS> struct genm_shape {
    static constexpr int RES_ELEMS = MMA_TILE * mma_cfg<HS>::LDS;
    /* Forward: Q resident, 2 x K and 2 x V walked. */
    static constexpr size_t fwd_smem = (size_t)(RES_ELEMS + 4 * mma_cfg<HS>::TILE_ELEMS) * 2;
    /* Backward: two resident tiles, 2 x 2 walked ones, and the walked query tiles' lse and D. */
    static constexpr size_t bwd_smem =
        (size_t)(2 * RES_ELEMS + 4 * mma_cfg<HS>::TILE_ELEMS) * 2 + 4 * MMA_TILE * sizeof(float);
};

/* Forward: warp w owns query rows q0 + 16 w .. + 15 and walks the key tiles of the query head's key/value
 * head up to the diagonal (causal) and the sequence's length. Rows past the length are not written here
 * (gen_mask_rows_kernel does). */
template <typename T, int HS>
__global__ void __launch_bounds__(MMA_THREADS)
    genm_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                        const int32_t *__restrict__ lens, gen_args a, float scale_log2)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using cfg = mma_cfg<HS>;
        using sh = genm_shape<HS>;
        extern __shared__ __align__(128) unsigned char msmem[];
        T *Qs = reinterpret_cast<T *>(msmem);
        T *Ks = Qs + sh::RES_ELEMS;       /* two buffers */
        T *Vs = Ks + 2 * cfg::TILE_ELEMS; /* two buffers */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int qt = a.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
        const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, kvh = h / a.G;
        const int T_ = a.T, q0 = qt * MMA_TILE;
        const int len = mma_seq_len(lens, b, T_);
        if (q0 >= len)
            return;
        const T *base = qkv + (size_t)b * T_ * a.stride;
        const T *kbase = base + a.koff + kvh * HS, *vbase = base + a.voff + kvh * HS;
        const int kend = a.causal ? min(q0 + MMA_TILE, len) : len;
        const int nkt = ZT_CEIL_DIV(kend, MMA_TILE);
        const int wr0 = q0 + warp * 16; /* this lane's rows: wr0 + g, wr0 + g + 8 */

        mma_load_tile<T, HS>(Qs, base + h * HS, q0, T_, a.stride);
        mma_load_tile<T, HS>(Ks, kbase, 0, len, a.stride);
        mma_load_tile<T, HS>(Vs, vbase, 0, len, a.stride);
        cp_async_commit();

        float o[1][HS / 8][4];
        mma_zero(o);
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        for (int kt = 0; kt < nkt; kt++) {
            if (kt + 1 < nkt) {
                const int nb = (kt + 1) % 2;
                mma_load_tile<T, HS>(Ks + nb * cfg::TILE_ELEMS, kbase, (kt + 1) * MMA_TILE, len, a.stride);
                mma_load_tile<T, HS>(Vs + nb * cfg::TILE_ELEMS, vbase, (kt + 1) * MMA_TILE, len, a.stride);
                cp_async_commit();
                cp_async_wait<1>(); /* tile kt (and Q) landed; kt + 1 may still be in flight */
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const int k0 = kt * MMA_TILE;
            if (!a.causal || k0 <= wr0 + 15) { /* else every key of the tile is past every row of this warp */
                const T *Kt = Ks + (kt % 2) * cfg::TILE_ELEMS, *Vt = Vs + (kt % 2) * cfg::TILE_ELEMS;
                float s[1][8][4];
                mma_zero(s);
                mma_rows_x_rows<T, HS, 1, 4>(s, Qs + warp * 16 * cfg::LDS, Kt);
                /* s[0][j][e] is row wr0 + g + 8 (e / 2), key k0 + 8 j + 2 q + e % 2. */
                const bool edge = k0 + MMA_TILE > len || (a.causal && k0 + MMA_TILE - 1 > wr0);
                float mx[2] = {m[0], m[1]};
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + 8 * j + 2 * q + (e % 2), row = wr0 + g + 8 * (e / 2);
                        float x = s[0][j][e] * scale_log2;
                        if (edge && (key >= len || (a.causal && key > row)))
                            x = -INFINITY;
                        s[0][j][e] = x;
                        mx[e / 2] = fmaxf(mx[e / 2], x);
                    }
                float alpha[2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                    /* Finite: key 0 of the first tile is valid for every row (0 < len, 0 <= row). */
                    alpha[i] = fast_exp2(m[i] - mx[i]);
                    m[i] = mx[i];
                    l[i] *= alpha[i];
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float p = fast_exp2(s[0][j][e] - m[e / 2]);
                        s[0][j][e] = p;
                        l[e / 2] += p;
                    }
#pragma unroll
                for (int j = 0; j < HS / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        o[0][j][e] *= alpha[e / 2];
                mma_acc_x_rows<T, HS, 1, 4>(o, s, Vt); /* O += P V */
            }
            __syncthreads(); /* every warp is done with buffer kt % 2 before it is refilled */
        }

        float inv[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
            inv[i] = 1.0f / l[i];
            const int row = wr0 + g + 8 * i;
            if (q == 0 && row < len)
                lse[(size_t)bh * T_ + row] = (m[i] + log2f(l[i])) / GEN_LOG2E;
        }
#pragma unroll
        for (int j = 0; j < HS / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[0][j][e] *= inv[e / 2];
        mma_store_rows<T, HS>(out + (size_t)b * T_ * a.ostride + h * HS, a.ostride, wr0 + g, len, 1.0f, o[0], false);
    }
}

/* dK, dV of 64 keys of one key/value head: warp w owns keys k0 + 16 w .. + 15 and walks, for each of the
 * G query heads in order, the 64-query tiles from the diagonal (causal) or the start on, in steps of 32
 * queries: S^T = K Q^T, dP^T = V dO^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T - D), then dV += P^T dO and
 * dK += dS^T Q with P^T and dS^T straight from the registers. Adds into dqkv. */
template <typename T, int HS>
__global__ void __launch_bounds__(MMA_THREADS)
    genm_backward_kv_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                            const float *__restrict__ lse, const float *__restrict__ D,
                            const int32_t *__restrict__ lens, gen_args a, float scale)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using cfg = mma_cfg<HS>;
        using sh = genm_shape<HS>;
        constexpr int SUB = 32; /* queries per step: two score tiles and two HS-wide accumulators in registers */
        extern __shared__ __align__(128) unsigned char msmem[];
        T *Ks = reinterpret_cast<T *>(msmem);
        T *Vs = Ks + sh::RES_ELEMS;
        T *Qs = Vs + sh::RES_ELEMS;        /* two buffers */
        T *dOs = Qs + 2 * cfg::TILE_ELEMS; /* two buffers */
        float *lse_s = reinterpret_cast<float *>(dOs + 2 * cfg::TILE_ELEMS); /* two buffers of 64 */
        float *D_s = lse_s + 2 * MMA_TILE;                                   /* two buffers of 64 */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int kt = blockIdx.y;
        const int bg = blockIdx.x, b = bg / a.NKV, kvh = bg % a.NKV;
        const int T_ = a.T, k0 = kt * MMA_TILE;
        const int len = mma_seq_len(lens, b, T_);
        if (k0 >= len)
            return; /* padded keys: no query sees them */
        const T *base = qkv + (size_t)b * T_ * a.stride;
        const T *dobase = dout + (size_t)b * T_ * a.ostride;
        const float scale_log2 = scale * GEN_LOG2E;
        const int qbegin = a.causal ? kt : 0, nq = ZT_CEIL_DIV(len, MMA_TILE) - qbegin;
        const int total = a.G * nq; /* (query head, query tile) steps */
        const int wk0 = k0 + warp * 16; /* this lane's keys: wk0 + g, wk0 + g + 8 */

        /* Starts loading step i into buffer nb: Q and dO by cp.async, lse and D by plain stores (rows past
         * the length get lse = +inf, so P = 0 there). */
        auto load_step = [&](int i, int nb) {
            const int h = kvh * a.G + i / nq, t0 = (qbegin + i % nq) * MMA_TILE;
            mma_load_tile<T, HS>(Qs + nb * cfg::TILE_ELEMS, base + h * HS, t0, len, a.stride);
            mma_load_tile<T, HS>(dOs + nb * cfg::TILE_ELEMS, dobase + h * HS, t0, len, a.ostride);
            const float *lrow = lse + ((size_t)b * a.NH + h) * T_, *drow = D + ((size_t)b * a.NH + h) * T_;
            for (int r = threadIdx.x; r < MMA_TILE; r += MMA_THREADS) {
                const int t = t0 + r;
                lse_s[nb * MMA_TILE + r] = t < len ? lrow[t] * GEN_LOG2E : INFINITY;
                D_s[nb * MMA_TILE + r] = t < len ? drow[t] : 0.0f;
            }
        };

        mma_load_tile<T, HS>(Ks, base + a.koff + kvh * HS, k0, len, a.stride);
        mma_load_tile<T, HS>(Vs, base + a.voff + kvh * HS, k0, len, a.stride);
        load_step(0, 0);
        cp_async_commit();

        float dk[1][HS / 8][4], dv[1][HS / 8][4];
        mma_zero(dk);
        mma_zero(dv);

        for (int i = 0; i < total; i++) {
            const int cb = i % 2;
            if (i + 1 < total) {
                load_step(i + 1, 1 - cb);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const int qt = qbegin + i % nq;
            const T *Qt = Qs + cb * cfg::TILE_ELEMS, *dOt = dOs + cb * cfg::TILE_ELEMS;
            const float *lse_t = lse_s + cb * MMA_TILE, *D_t = D_s + cb * MMA_TILE;

#pragma unroll 1
            for (int sub = 0; sub < MMA_TILE / SUB; sub++) {
                const int qs0 = qt * MMA_TILE + sub * SUB; /* first query of the step */
                if (a.causal && wk0 > qs0 + SUB - 1)
                    continue; /* every key of this warp is past every query of the step: P = 0 */
                const bool diag = a.causal && wk0 + 15 > qs0;
                float s[1][SUB / 8][4], dp[1][SUB / 8][4];
                mma_zero(s);
                mma_zero(dp);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(s, Ks + warp * 16 * cfg::LDS, Qt + sub * SUB * cfg::LDS);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(dp, Vs + warp * 16 * cfg::LDS, dOt + sub * SUB * cfg::LDS);
                /* s[0][j][e] is key wk0 + g + 8 (e / 2), query column c = sub * SUB + 8 j + 2 q + e % 2. Keys
                 * past the length belong to rows of dK and dV that are not written. */
#pragma unroll
                for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int c = sub * SUB + 8 * j + 2 * q + (e % 2);
                        const int key = wk0 + g + 8 * (e / 2);
                        float p = fast_exp2(s[0][j][e] * scale_log2 - lse_t[c]);
                        if (diag && key > qt * MMA_TILE + c)
                            p = 0.0f;
                        s[0][j][e] = p;
                        dp[0][j][e] = p * (dp[0][j][e] - D_t[c]); /* dS^T */
                    }
                mma_acc_x_rows<T, HS, 1, SUB / 16>(dv, s, dOt + sub * SUB * cfg::LDS); /* dV += P^T dO */
                mma_acc_x_rows<T, HS, 1, SUB / 16>(dk, dp, Qt + sub * SUB * cfg::LDS); /* dK += dS^T Q */
            }
            __syncthreads(); /* buffer cb is refilled in the next iteration */
        }

        T *rows = dqkv + (size_t)b * T_ * a.stride;
        mma_store_rows<T, HS>(rows + a.koff + kvh * HS, a.stride, wk0 + g, len, scale, dk[0], true);
        mma_store_rows<T, HS>(rows + a.voff + kvh * HS, a.stride, wk0 + g, len, 1.0f, dv[0], true);
    }
}

/* dQ of 64 queries of one query head: warp w owns rows q0 + 16 w .. + 15 and walks the key tiles of the
 * head's key/value head in steps of SUB keys: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K. Adds
 * into dqkv. */
template <typename T, int HS>
__global__ void __launch_bounds__(MMA_THREADS)
    genm_backward_q_kernel(T *__restrict__ dqkv, const T *__restrict__ dout, const T *__restrict__ qkv,
                           const float *__restrict__ lse, const float *__restrict__ D,
                           const int32_t *__restrict__ lens, gen_args a, float scale)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using cfg = mma_cfg<HS>;
        using sh = genm_shape<HS>;
        constexpr int SUB = HS <= 64 ? 64 : 32; /* keys per step (one HS-wide accumulator) */
        extern __shared__ __align__(128) unsigned char msmem[];
        T *Qs = reinterpret_cast<T *>(msmem);
        T *dOs = Qs + sh::RES_ELEMS;
        T *Ks = dOs + sh::RES_ELEMS;      /* two buffers */
        T *Vs = Ks + 2 * cfg::TILE_ELEMS; /* two buffers */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int qt = a.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
        const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, kvh = h / a.G;
        const int T_ = a.T, q0 = qt * MMA_TILE;
        const int len = mma_seq_len(lens, b, T_);
        if (q0 >= len)
            return; /* padded rows get no gradient */
        const T *base = qkv + (size_t)b * T_ * a.stride;
        const T *kbase = base + a.koff + kvh * HS, *vbase = base + a.voff + kvh * HS;
        const float scale_log2 = scale * GEN_LOG2E;
        const int wr0 = q0 + warp * 16; /* this lane's rows: wr0 + g, wr0 + g + 8 */
        float lse2[2], Dr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int row = wr0 + g + 8 * i;
            lse2[i] = row < len ? lse[(size_t)bh * T_ + row] * GEN_LOG2E : INFINITY;
            Dr[i] = row < len ? D[(size_t)bh * T_ + row] : 0.0f;
        }

        mma_load_tile<T, HS>(Qs, base + h * HS, q0, len, a.stride);
        mma_load_tile<T, HS>(dOs, dout + (size_t)b * T_ * a.ostride + h * HS, q0, len, a.ostride);
        mma_load_tile<T, HS>(Ks, kbase, 0, len, a.stride);
        mma_load_tile<T, HS>(Vs, vbase, 0, len, a.stride);
        cp_async_commit();

        float dq[1][HS / 8][4];
        mma_zero(dq);

        const int kend = a.causal ? min(q0 + MMA_TILE, len) : len;
        const int nkt = ZT_CEIL_DIV(kend, MMA_TILE);
        for (int kt = 0; kt < nkt; kt++) {
            if (kt + 1 < nkt) {
                const int nb = (kt + 1) % 2;
                mma_load_tile<T, HS>(Ks + nb * cfg::TILE_ELEMS, kbase, (kt + 1) * MMA_TILE, len, a.stride);
                mma_load_tile<T, HS>(Vs + nb * cfg::TILE_ELEMS, vbase, (kt + 1) * MMA_TILE, len, a.stride);
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
                if (a.causal && ks0 > wr0 + 15)
                    continue; /* every key of the step is past every row of this warp: P = 0 */
                const bool edge = ks0 + SUB > len || (a.causal && ks0 + SUB - 1 > wr0);
                float s[1][SUB / 8][4], dp[1][SUB / 8][4];
                mma_zero(s);
                mma_zero(dp);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(s, Qs + warp * 16 * cfg::LDS, Kt + sub * SUB * cfg::LDS);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(dp, dOs + warp * 16 * cfg::LDS, Vt + sub * SUB * cfg::LDS);
                /* s[0][j][e] is row wr0 + g + 8 (e / 2), key ks0 + 8 j + 2 q + e % 2; K rows past the length
                 * are zeros, whose scores must not count. */
#pragma unroll
                for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = ks0 + 8 * j + 2 * q + (e % 2), i = e / 2;
                        float p = fast_exp2(s[0][j][e] * scale_log2 - lse2[i]);
                        if (edge && (key >= len || (a.causal && key > wr0 + g + 8 * i)))
                            p = 0.0f;
                        s[0][j][e] = p * (dp[0][j][e] - Dr[i]); /* dS */
                    }
                mma_acc_x_rows<T, HS, 1, SUB / 16>(dq, s, Kt + sub * SUB * cfg::LDS); /* dQ += dS K */
            }
            __syncthreads();
        }
        mma_store_rows<T, HS>(dqkv + (size_t)b * T_ * a.stride + h * HS, a.stride, wr0 + g, len, scale, dq[0], true);
    }
}

/* Rows t >= lens[b] of the tensor-core forward: zeros in out, +inf in lse. One block per (b, t). */
template <typename T>
__global__ void gen_mask_rows_kernel(T *__restrict__ out, float *__restrict__ lse, const int32_t *__restrict__ lens,
                                     int T_, int NH, int HS)
{
    const int b = blockIdx.x / T_, t = blockIdx.x % T_;
    if (t < max(0, min(lens[b], T_)))
        return;
    T *row = out + ((size_t)b * T_ + t) * NH * HS;
    for (int c = threadIdx.x; c < NH * HS; c += blockDim.x)
        row[c] = zt_from_float<T>(0.0f);
    for (int h = threadIdx.x; h < NH; h += blockDim.x)
        lse[((size_t)b * NH + h) * T_ + t] = INFINITY;
}

/* ---- launchers ---- */

gen_args gen_make_args(const zt_attention_dims *d)
{
    gen_args a;
    a.T = d->T;
    a.NH = d->NH;
    a.NKV = d->NKV;
    a.G = d->NH / d->NKV;
    a.stride = (d->NH + 2 * d->NKV) * d->HS;
    a.koff = d->NH * d->HS;
    a.voff = (d->NH + d->NKV) * d->HS;
    a.ostride = d->NH * d->HS;
    a.causal = d->causal;
    return a;
}

/* Kernels above 48 KiB of dynamic shared memory must say so (the launcher checked that the GPU has it). */
template <typename K> void gen_allow_smem(K kernel, size_t bytes)
{
    if (bytes > 48 * 1024)
        ZT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* Tiles of `tile` rows over T positions: the grid's y dimension (at most 65535). */
unsigned gen_tiles(int T_, int tile)
{
    const int tiles = ZT_CEIL_DIV(T_, tile);
    ZT_ASSERT(tiles <= 65535);
    return (unsigned)tiles;
}

/* The most dynamic shared memory the kernels for (T, HS) ask for. */
template <typename T, int HS> constexpr size_t gen_smem()
{
    using cfg = gen_cfg<T, HS>;
    return cfg::kv_smem > cfg::fwd_smem ? cfg::kv_smem : cfg::fwd_smem;
}

template <int HS> constexpr size_t gen_smem_any()
{
    return gen_smem<float, HS>() > gen_smem<__half, HS>() ? gen_smem<float, HS>() : gen_smem<__half, HS>();
}

/* Whether a tensor-core kernel can run here: allowed (the variant asks neither for the CUDA cores nor for
 * WMMA), 16-byte aligned
 * buffers (row strides are multiples of 16 bytes: head sizes are multiples of 16), the shared memory on
 * this GPU, and code built for sm_80 or newer. */
template <typename T, typename K>
bool genm_usable(const zt_attention_variant *v, K kernel, size_t smem, const void *const *ptrs, int nptrs)
{
    if (std::is_same<T, float>::value || v->cuda_cores || v->wmma)
        return false;
    for (int i = 0; i < nptrs; i++)
        if (!zt_aligned16(ptrs[i]))
            return false;
    int dev = 0, optin = 0;
    ZT_CUDA_CHECK(cudaGetDevice(&dev));
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > (size_t)optin)
        return false;
    cudaFuncAttributes attr;
    ZT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.ptxVersion >= 80 && attr.binaryVersion >= 80;
}

/* The tensor-core forward; false (nothing launched) where it cannot run. */
template <typename T, int HS>
bool genm_forward(T *out, float *lse, const T *qkv, const int32_t *lens, const zt_attention_dims *d,
                  cudaStream_t stream, const zt_attention_variant *v)
{
    const void *ptrs[2] = {out, qkv};
    const size_t smem = genm_shape<HS>::fwd_smem;
    if (!genm_usable<T>(v, genm_forward_kernel<T, HS>, smem, ptrs, 2))
        return false;
    const unsigned tiles = gen_tiles(d->T, MMA_TILE);
    gen_allow_smem(genm_forward_kernel<T, HS>, smem);
    genm_forward_kernel<T, HS><<<dim3(d->B * d->NH, tiles), MMA_THREADS, smem, stream>>>(
        out, lse, qkv, lens, gen_make_args(d), GEN_LOG2E / sqrtf((float)HS));
    ZT_CUDA_CHECK_LAUNCH();
    if (lens) {
        gen_mask_rows_kernel<T><<<(unsigned)((size_t)d->B * d->T), 128, 0, stream>>>(out, lse, lens, d->T, d->NH, HS);
        ZT_CUDA_CHECK_LAUNCH();
    }
    return true;
}

/* The tensor-core backward after the row dots; false (nothing launched) where it cannot run. */
template <typename T, int HS>
bool genm_backward(T *dqkv, const T *dout, const T *qkv, const float *lse, const int32_t *lens,
                   const zt_attention_dims *d, const float *D, float scale, cudaStream_t stream, const zt_attention_variant *v)
{
    const void *ptrs[3] = {dqkv, dout, qkv};
    const size_t smem = genm_shape<HS>::bwd_smem;
    if (!genm_usable<T>(v, genm_backward_kv_kernel<T, HS>, smem, ptrs, 3) ||
        !genm_usable<T>(v, genm_backward_q_kernel<T, HS>, smem, ptrs, 3))
        return false;
    const unsigned tiles = gen_tiles(d->T, MMA_TILE);
    const gen_args a = gen_make_args(d);
    gen_allow_smem(genm_backward_kv_kernel<T, HS>, smem);
    genm_backward_kv_kernel<T, HS><<<dim3(d->B * d->NKV, tiles), MMA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D,
                                                                                             lens, a, scale);
    ZT_CUDA_CHECK_LAUNCH();
    gen_allow_smem(genm_backward_q_kernel<T, HS>, smem);
    genm_backward_q_kernel<T, HS><<<dim3(d->B * d->NH, tiles), MMA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, D,
                                                                                           lens, a, scale);
    ZT_CUDA_CHECK_LAUNCH();
    return true;
}

template <typename T, int HS>
void gen_forward(T *out, float *lse, const T *qkv, const int32_t *lens, const zt_attention_dims *d, cudaStream_t stream, const zt_attention_variant *v)
{
    if constexpr (HS <= 128 && !std::is_same<T, float>::value) {
        if (genm_forward<T, HS>(out, lse, qkv, lens, d, stream, v))
            return;
    }
    using cfg = gen_cfg<T, HS>;
    gen_allow_smem(gen_forward_kernel<T, HS>, cfg::fwd_smem);
    const dim3 grid(d->B * d->NH, gen_tiles(d->T, cfg::TILE));
    gen_forward_kernel<T, HS><<<grid, GEN_THREADS, cfg::fwd_smem, stream>>>(out, lse, qkv, lens, gen_make_args(d),
                                                                            GEN_LOG2E / sqrtf((float)HS));
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T, int HS>
void gen_backward(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const int32_t *lens,
                  const zt_attention_dims *d, float *D, cudaStream_t stream, const zt_attention_variant *v)
{
    using cfg = gen_cfg<T, HS>;
    const size_t items = (size_t)d->B * d->T * d->NH;
    gen_rowdot_kernel<T><<<(unsigned)ZT_CEIL_DIV(items, (size_t)8), 256, 0, stream>>>(D, dout, out, d->B, d->T, d->NH,
                                                                                      HS);
    ZT_CUDA_CHECK_LAUNCH();
    const gen_args a = gen_make_args(d);
    const float scale = 1.0f / sqrtf((float)HS);
    if constexpr (HS <= 128 && !std::is_same<T, float>::value) {
        if (genm_backward<T, HS>(dqkv, dout, qkv, lse, lens, d, D, scale, stream, v))
            return;
    }
    const unsigned tiles = gen_tiles(d->T, cfg::TILE);
    gen_allow_smem(gen_backward_kv_kernel<T, HS>, cfg::kv_smem);
    gen_backward_kv_kernel<T, HS><<<dim3(d->B * d->NKV, tiles), GEN_THREADS, cfg::kv_smem, stream>>>(
        dqkv, dout, qkv, lse, D, lens, a, scale);
    ZT_CUDA_CHECK_LAUNCH();
    gen_allow_smem(gen_backward_q_kernel<T, HS>, cfg::q_smem);
    gen_backward_q_kernel<T, HS><<<dim3(d->B * d->NH, tiles), GEN_THREADS, cfg::q_smem, stream>>>(
        dqkv, dout, qkv, lse, D, lens, a, scale);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void gen_forward_hs(T *out, float *lse, const T *qkv, const int32_t *lens, const zt_attention_dims *d,
                    cudaStream_t stream, const zt_attention_variant *v)
{
    switch (d->HS) {
    case 32: gen_forward<T, 32>(out, lse, qkv, lens, d, stream, v); break;
    case 64: gen_forward<T, 64>(out, lse, qkv, lens, d, stream, v); break;
    case 80: gen_forward<T, 80>(out, lse, qkv, lens, d, stream, v); break;
    case 96: gen_forward<T, 96>(out, lse, qkv, lens, d, stream, v); break;
    case 128: gen_forward<T, 128>(out, lse, qkv, lens, d, stream, v); break;
    case 256: gen_forward<T, 256>(out, lse, qkv, lens, d, stream, v); break;
    default: ZT_ASSERT(!"a head size the generic attention kernels are built for");
    }
}

template <typename T>
void gen_backward_hs(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const int32_t *lens,
                     const zt_attention_dims *d, float *D, cudaStream_t stream, const zt_attention_variant *v)
{
    switch (d->HS) {
    case 32: gen_backward<T, 32>(dqkv, dout, qkv, out, lse, lens, d, D, stream, v); break;
    case 64: gen_backward<T, 64>(dqkv, dout, qkv, out, lse, lens, d, D, stream, v); break;
    case 80: gen_backward<T, 80>(dqkv, dout, qkv, out, lse, lens, d, D, stream, v); break;
    case 96: gen_backward<T, 96>(dqkv, dout, qkv, out, lse, lens, d, D, stream, v); break;
    case 128: gen_backward<T, 128>(dqkv, dout, qkv, out, lse, lens, d, D, stream, v); break;
    case 256: gen_backward<T, 256>(dqkv, dout, qkv, out, lse, lens, d, D, stream, v); break;
    default: ZT_ASSERT(!"a head size the generic attention kernels are built for");
    }
}

/* Shape preconditions common to both passes (the dispatcher in attention.cu checked the head size). */
void gen_check(const void *qkv, const zt_attention_dims *d)
{
    ZT_ASSERT(d->B > 0 && d->T > 0 && d->NH > 0 && d->NKV > 0 && d->NH % d->NKV == 0);
    ZT_ASSERT(zt__cuda_attention_generic_serves(d->HS));
    ZT_ASSERT((size_t)d->B * d->NH <= 0x7fffffffu && (size_t)(d->NH + 2 * d->NKV) * d->HS <= 0x7fffffffu);
    ZT_ASSERT(((uintptr_t)qkv & 3u) == 0); /* 32-bit tile loads */
}

} /* namespace */

extern "C" bool zt__cuda_attention_generic_serves(int HS)
{
    size_t need;
    switch (HS) {
    case 32: need = gen_smem_any<32>(); break;
    case 64: need = gen_smem_any<64>(); break;
    case 80: need = gen_smem_any<80>(); break;
    case 96: need = gen_smem_any<96>(); break;
    case 128: need = gen_smem_any<128>(); break;
    case 256: need = gen_smem_any<256>(); break;
    default: return false;
    }
    if (need <= 48 * 1024)
        return true;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError(); /* no GPU here: clear the error, answer no */
        return false;
    }
    return need <= (size_t)optin;
}

extern "C" void zt__cuda_attention_generic_forward(void *out, float *lse, const void *qkv, const int32_t *lens,
                                                   const zt_attention_dims *d, enum zt_dtype dtype,
                                                   cudaStream_t stream, const zt_attention_variant *v)
{
    gen_check(qkv, d);
    switch (dtype) {
    case ZT_DTYPE_F32:
        gen_forward_hs((float *)out, lse, (const float *)qkv, lens, d, stream, v);
        break;
    case ZT_DTYPE_F16:
        gen_forward_hs((__half *)out, lse, (const __half *)qkv, lens, d, stream, v);
        break;
    case ZT_DTYPE_BF16:
        gen_forward_hs((__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)qkv, lens, d, stream, v);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_forward_gqa", dtype);
    }
}

extern "C" void zt__cuda_attention_generic_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                                    const float *lse, const int32_t *lens,
                                                    const zt_attention_dims *d, float *D, enum zt_dtype dtype,
                                                    cudaStream_t stream, const zt_attention_variant *v)
{
    gen_check(qkv, d);
    ZT_ASSERT(((uintptr_t)dout & 3u) == 0 && ((uintptr_t)D & 3u) == 0);
    switch (dtype) {
    case ZT_DTYPE_F32:
        gen_backward_hs((float *)dqkv, (const float *)dout, (const float *)qkv, (const float *)out, lse, lens, d, D,
                        stream, v);
        break;
    case ZT_DTYPE_F16:
        gen_backward_hs((__half *)dqkv, (const __half *)dout, (const __half *)qkv, (const __half *)out, lse, lens, d,
                        D, stream, v);
        break;
    case ZT_DTYPE_BF16:
        gen_backward_hs((__nv_bfloat16 *)dqkv, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)qkv,
                        (const __nv_bfloat16 *)out, lse, lens, d, D, stream, v);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_attention_backward_gqa", dtype);
    }
}
