/* Attention descriptors on the GPU (kernels/attention.h): the one chooser of the CUDA attention kernels, and
 * the general kernels that serve every descriptor feature.
 *
 * The chooser. A descriptor that is packed qkv (k and v at their columns of q's rows, one stride), Tq == Tk,
 * the default scale, no bias, no window and no cu_seqlens, at a head size the packed kernels serve, runs the
 * packed-qkv kernels of attention.cu and attention_generic.cu (tuned mma.sync, WMMA and SIMT paths: GPT-2,
 * LLaMA, BERT), exactly as their entry points do (the descriptor's variant, for tests and benchmarks, picks
 * among those families or forces the general kernels). Every other descriptor at head size 64 or 128 in fp16 or
 * bf16 on sm_80+, with 16-byte aligned rows, runs the tensor-core kernels of attention_desc_mma.cuh (dm_serves);
 * the rest runs the general kernels below.
 *
 * The general kernels: CUDA cores, fp32 arithmetic on fp32, fp16 or bf16 storage, any head size up to 256,
 * one warp per row. Simple rather than fast (no tiles in shared memory, no tensor cores): they are the
 * baseline every feature has (separate q/k/v with strides, Tq != Tk, scale, causal bottom-right, window, T5
 * bias and its gradient, cu_seqlens, padding), and the reference a faster path for one of them is checked
 * against on the GPU.
 *   Forward: a warp owns one query row of one head; each lane scores one key of a chunk of 32 (the query row
 *     in shared memory, the key row read by that lane), the chunk updates the online softmax (base 2), and
 *     each lane accumulates its head channels (lane + 32 i) of P V.
 *   Backward (D = rowsum(dout * out) first): a warp per query row computes dQ (lanes score keys as in the
 *     forward, then dQ += dS K channel-wise); a warp per key row and key/value head computes dK and dV over
 *     the query rows that see it, query heads in order. Every element has one writer: no atomics, the same
 *     bits on every run. The bias-table gradient: in the dQ pass each bucket is owned by one lane, which adds
 *     the dS of its bucket's keys in key order into a per-warp shared row; a block sums its warps' rows in
 *     order into a partial per (sequence, head, row block), and a last kernel sums those in order. */
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace {

constexpr int DESC_WARPS = 4;                 /* warps per block */
constexpr int DESC_QROWS = 32;                /* query rows per block of the dQ pass */
constexpr int DESC_MAX_HS = 256;
constexpr int DESC_MAX_THR = ZT_ATTENTION_MAX_BUCKETS / 2;
constexpr float DESC_LOG2E = 1.4426950408889634f;

/* A call, by value (kernel parameters). */
struct desc_params {
    const void *q, *k, *v;
    void *out;
    float *lse;
    long qs, ks, vs, os;
    int B, Tq, Tk, NH, NKV, HS, G;
    float scale;
    int causal, window;
    const int32_t *cu_q, *cu_k, *lens;
    /* T5 bias: table [nb, NH]; buckets past the exact ones come from thresholds (see t5_thresholds). */
    const float *table;
    int nb, bidir, half, max_exact, nthr;
    int thr[DESC_MAX_THR];
    int relR; /* the mma.sync dQ pass: rels beyond +-relR share the buckets of +-relR (max_distance) */
    /* backward */
    const void *dout;
    void *dq, *dk, *dv;
    long dqs, dks, dvs;
    int accumulate;
    float *D;    /* [B, NH, Tq] */
    float *part; /* [B * NH, ntq, nb] bias-table partials */
    int ntq;     /* row blocks of the dQ pass */
};

/* One sequence: first query and key rows, rows in it, rows that take part, query position offset. */
struct desc_seq {
    long q0, k0;
    int span, kspan, qvalid, kvalid, off;
};

__device__ __forceinline__ desc_seq seq_of(const desc_params &p, int b)
{
    desc_seq s;
    if (p.cu_q) {
        s.q0 = p.cu_q[b];
        s.k0 = p.cu_k[b];
        s.span = s.qvalid = p.cu_q[b + 1] - p.cu_q[b];
        s.kspan = s.kvalid = p.cu_k[b + 1] - p.cu_k[b];
    } else {
        s.q0 = (long)b * p.Tq;
        s.k0 = (long)b * p.Tk;
        s.span = s.qvalid = p.Tq;
        s.kspan = s.kvalid = p.Tk;
        if (p.lens) /* Tq == Tk */
            s.qvalid = s.kvalid = max(0, min((int)p.lens[b], p.Tq));
    }
    s.off = p.lens ? 0 : s.kvalid - s.span;
    return s;
}

/* The keys [*kbeg, *kend) query row t sees. */
__device__ __forceinline__ void key_range(const desc_params &p, const desc_seq &s, int t, int *kbeg, int *kend)
{
    const int pos = t + s.off;
    int hi = s.kvalid, lo = 0;
    if (p.causal && pos + 1 < hi)
        hi = pos + 1;
    if (p.window >= 0 && pos - p.window > lo)
        lo = pos - p.window;
    *kbeg = lo;
    *kend = hi;
}

/* zt_attention_t5_bucket through the thresholds the host tabulated with it. */
__device__ __forceinline__ int t5_bucket(const desc_params &p, int rel)
{
    int bucket = 0;
    if (p.bidir) {
        if (rel > 0)
            bucket += p.half;
        rel = abs(rel);
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    if (rel < p.max_exact)
        return bucket + rel;
    int large = p.max_exact;
    for (int i = 0; i < p.nthr; i++)
        large += rel >= p.thr[i];
    return bucket + large;
}

/* The bias of (head h, key position - query position rel); 0 without a table. */
__device__ __forceinline__ float bias_of(const desc_params &p, int h, int rel, int *bucket)
{
    if (!p.table)
        return 0.0f;
    const int bk = t5_bucket(p, rel);
    *bucket = bk;
    return p.table[(long)bk * p.NH + h];
}

template <typename T> __device__ __forceinline__ float row_dot(const float *a, const T *b, int n)
{
    float acc = 0.0f;
    for (int c = 0; c < n; c++)
        acc += a[c] * zt_to_float(b[c]);
    return acc;
}

/* ---- forward ---- */

template <typename T, int NC>
__global__ void __launch_bounds__(DESC_WARPS * 32) desc_forward_kernel(const desc_params p)
{
    __shared__ float qsh[DESC_WARPS][NC * 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bh = blockIdx.y, b = bh / p.NH, h = bh % p.NH, g = h / p.G, HS = p.HS;
    const int t = blockIdx.x * DESC_WARPS + warp;
    const desc_seq s = seq_of(p, b);
    if (t >= s.span)
        return;
    T *orow = (T *)p.out + (s.q0 + t) * p.os + (long)h * HS;
    float *lse = p.lse + ((long)b * p.NH + h) * p.Tq + t;
    int kbeg = 0, kend = 0;
    if (t < s.qvalid)
        key_range(p, s, t, &kbeg, &kend);
    if (kbeg >= kend) {
        for (int c = lane; c < HS; c += 32)
            orow[c] = zt_from_float<T>(0.0f);
        if (lane == 0)
            *lse = INFINITY;
        return;
    }
    const T *qrow = (const T *)p.q + (s.q0 + t) * p.qs + (long)h * HS;
    for (int c = lane; c < HS; c += 32)
        qsh[warp][c] = zt_to_float(qrow[c]);
    __syncwarp();
    const T *kb = (const T *)p.k + s.k0 * p.ks + (long)g * HS;
    const T *vb = (const T *)p.v + s.k0 * p.vs + (long)g * HS;
    const int pos = t + s.off;
    float acc[NC];
#pragma unroll
    for (int i = 0; i < NC; i++)
        acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = kbeg; j0 < kend; j0 += 32) {
        const int j = j0 + lane;
        float sc = -INFINITY;
        if (j < kend) {
            int bk;
            sc = (row_dot(qsh[warp], kb + (long)j * p.ks, HS) * p.scale + bias_of(p, h, j - pos, &bk)) * DESC_LOG2E;
        }
        const float m_new = fmaxf(m, zt_warp_max(sc)); /* finite: lane 0 has a key */
        const float alpha = exp2f(m - m_new);
        const float pj = j < kend ? exp2f(sc - m_new) : 0.0f;
        l = l * alpha + zt_warp_sum(pj);
#pragma unroll
        for (int i = 0; i < NC; i++)
            acc[i] *= alpha;
        const int n = min(32, kend - j0);
        for (int jj = 0; jj < n; jj++) {
            const float pb = __shfl_sync(0xffffffffu, pj, jj);
            const T *vr = vb + (long)(j0 + jj) * p.vs;
#pragma unroll
            for (int i = 0; i < NC; i++) {
                const int c = lane + 32 * i;
                if (c < HS)
                    acc[i] += pb * zt_to_float(vr[c]);
            }
        }
        m = m_new;
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < NC; i++) {
        const int c = lane + 32 * i;
        if (c < HS)
            orow[c] = zt_from_float<T>(acc[i] * inv);
    }
    if (lane == 0)
        *lse = (m + log2f(l)) / DESC_LOG2E;
}

/* ---- backward ---- */

/* D[b,h,t] = sum over the head's channels of dout * out: a warp per (row, head). */
template <typename T> __global__ void __launch_bounds__(DESC_WARPS * 32) desc_rowdot_kernel(const desc_params p)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bh = blockIdx.y, b = bh / p.NH, h = bh % p.NH;
    const int t = blockIdx.x * DESC_WARPS + warp;
    const desc_seq s = seq_of(p, b);
    if (t >= s.span)
        return;
    const T *o = (const T *)p.out + (s.q0 + t) * p.os + (long)h * p.HS;
    const T *d = (const T *)p.dout + (s.q0 + t) * p.os + (long)h * p.HS;
    float acc = 0.0f;
    for (int c = lane; c < p.HS; c += 32)
        acc += zt_to_float(d[c]) * zt_to_float(o[c]);
    acc = zt_warp_sum(acc);
    if (lane == 0)
        p.D[((long)b * p.NH + h) * p.Tq + t] = acc;
}

/* Stores v into x, or adds it when accumulating. */
template <typename T> __device__ __forceinline__ void put(T *x, float v, int accumulate)
{
    *x = zt_from_float<T>(accumulate ? zt_to_float(*x) + v : v);
}

/* dQ of DESC_QROWS query rows of one (sequence, head), and the block's partial bias-table gradient. */
template <typename T, int NC>
__global__ void __launch_bounds__(DESC_WARPS * 32) desc_backward_q_kernel(const desc_params p)
{
    __shared__ float qsh[DESC_WARPS][NC * 32], dsh[DESC_WARPS][NC * 32];
    extern __shared__ float bsh[]; /* [DESC_WARPS][nb] with a bias */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bh = blockIdx.y, b = bh / p.NH, h = bh % p.NH, g = h / p.G, HS = p.HS;
    const desc_seq s = seq_of(p, b);
    if (p.table) {
        for (int i = threadIdx.x; i < DESC_WARPS * p.nb; i += blockDim.x)
            bsh[i] = 0.0f;
        __syncthreads();
    }
    float *wb = bsh + warp * p.nb;
    const T *kb = (const T *)p.k + s.k0 * p.ks + (long)g * HS;
    const T *vb = (const T *)p.v + s.k0 * p.vs + (long)g * HS;
    for (int r = 0; r < DESC_QROWS / DESC_WARPS; r++) {
        const int t = blockIdx.x * DESC_QROWS + r * DESC_WARPS + warp;
        if (t >= s.span)
            continue;
        T *dqrow = (T *)p.dq + (s.q0 + t) * p.dqs + (long)h * HS;
        int kbeg = 0, kend = 0;
        if (t < s.qvalid)
            key_range(p, s, t, &kbeg, &kend);
        if (kbeg >= kend) {
            if (!p.accumulate)
                for (int c = lane; c < HS; c += 32)
                    dqrow[c] = zt_from_float<T>(0.0f);
            continue;
        }
        const T *qrow = (const T *)p.q + (s.q0 + t) * p.qs + (long)h * HS;
        const T *drow = (const T *)p.dout + (s.q0 + t) * p.os + (long)h * HS;
        for (int c = lane; c < HS; c += 32) {
            qsh[warp][c] = zt_to_float(qrow[c]);
            dsh[warp][c] = zt_to_float(drow[c]);
        }
        __syncwarp();
        const long li = ((long)b * p.NH + h) * p.Tq + t;
        const float lse2 = p.lse[li] * DESC_LOG2E, Dr = p.D[li];
        const int pos = t + s.off;
        float acc[NC];
#pragma unroll
        for (int i = 0; i < NC; i++)
            acc[i] = 0.0f;
        for (int j0 = kbeg; j0 < kend; j0 += 32) {
            const int j = j0 + lane;
            float ds = 0.0f;
            int bk = 0;
            if (j < kend) {
                const float sc = row_dot(qsh[warp], kb + (long)j * p.ks, HS) * p.scale + bias_of(p, h, j - pos, &bk);
                const float pj = exp2f(sc * DESC_LOG2E - lse2);
                const float dp = row_dot(dsh[warp], vb + (long)j * p.vs, HS);
                ds = pj * (dp - Dr);
            }
            const int n = min(32, kend - j0);
            for (int jj = 0; jj < n; jj++) {
                const float db = __shfl_sync(0xffffffffu, ds, jj);
                const T *kr = kb + (long)(j0 + jj) * p.ks;
#pragma unroll
                for (int i = 0; i < NC; i++) {
                    const int c = lane + 32 * i;
                    if (c < HS)
                        acc[i] += db * zt_to_float(kr[c]);
                }
                if (p.table) {
                    const int bb = __shfl_sync(0xffffffffu, bk, jj);
                    if (lane == (bb & 31))
                        wb[bb] += db;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const int c = lane + 32 * i;
            if (c < HS)
                put(dqrow + c, acc[i] * p.scale, p.accumulate);
        }
        __syncwarp(); /* the next row overwrites qsh and dsh */
    }
    if (p.table) {
        __syncthreads();
        for (int bk = threadIdx.x; bk < p.nb; bk += blockDim.x) {
            float sum = 0.0f;
            for (int w = 0; w < DESC_WARPS; w++)
                sum += bsh[w * p.nb + bk];
            p.part[((long)bh * p.ntq + blockIdx.x) * p.nb + bk] = sum;
        }
    }
}

/* dK and dV of one key row of one (sequence, key/value head). */
template <typename T, int NC>
__global__ void __launch_bounds__(DESC_WARPS * 32) desc_backward_kv_kernel(const desc_params p)
{
    __shared__ float ksh[DESC_WARPS][NC * 32], vsh[DESC_WARPS][NC * 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bg = blockIdx.y, b = bg / p.NKV, g = bg % p.NKV, HS = p.HS;
    const int j = blockIdx.x * DESC_WARPS + warp;
    const desc_seq s = seq_of(p, b);
    if (j >= s.kspan)
        return;
    T *dkrow = (T *)p.dk + (s.k0 + j) * p.dks + (long)g * HS;
    T *dvrow = (T *)p.dv + (s.k0 + j) * p.dvs + (long)g * HS;
    /* The query rows that see key j: the inverse of key_range. */
    int ibeg = p.causal ? max(0, j - s.off) : 0, iend = s.qvalid;
    if (p.window >= 0)
        iend = min(iend, j - s.off + p.window + 1);
    if (j >= s.kvalid || ibeg >= iend) {
        if (!p.accumulate)
            for (int c = lane; c < HS; c += 32) {
                dkrow[c] = zt_from_float<T>(0.0f);
                dvrow[c] = zt_from_float<T>(0.0f);
            }
        return;
    }
    const T *krow = (const T *)p.k + (s.k0 + j) * p.ks + (long)g * HS;
    const T *vrow = (const T *)p.v + (s.k0 + j) * p.vs + (long)g * HS;
    for (int c = lane; c < HS; c += 32) {
        ksh[warp][c] = zt_to_float(krow[c]);
        vsh[warp][c] = zt_to_float(vrow[c]);
    }
    __syncwarp();
    float ak[NC], av[NC];
#pragma unroll
    for (int i = 0; i < NC; i++)
        ak[i] = av[i] = 0.0f;
    for (int h = g * p.G; h < (g + 1) * p.G; h++) {
        const T *qb = (const T *)p.q + s.q0 * p.qs + (long)h * HS;
        const T *db = (const T *)p.dout + s.q0 * p.os + (long)h * HS;
        const long lb = ((long)b * p.NH + h) * p.Tq;
        for (int i0 = ibeg; i0 < iend; i0 += 32) {
            const int i = i0 + lane;
            float pv = 0.0f, ds = 0.0f;
            if (i < iend) {
                int bk;
                const float sc = row_dot(ksh[warp], qb + (long)i * p.qs, HS) * p.scale + bias_of(p, h, j - (i + s.off), &bk);
                pv = exp2f(sc * DESC_LOG2E - p.lse[lb + i] * DESC_LOG2E);
                const float dp = row_dot(vsh[warp], db + (long)i * p.os, HS);
                ds = pv * (dp - p.D[lb + i]);
            }
            const int n = min(32, iend - i0);
            for (int ii = 0; ii < n; ii++) {
                const float pb = __shfl_sync(0xffffffffu, pv, ii);
                const float dsb = __shfl_sync(0xffffffffu, ds, ii);
                const T *qr = qb + (long)(i0 + ii) * p.qs;
                const T *dr = db + (long)(i0 + ii) * p.os;
#pragma unroll
                for (int c4 = 0; c4 < NC; c4++) {
                    const int c = lane + 32 * c4;
                    if (c < HS) {
                        av[c4] += pb * zt_to_float(dr[c]);
                        ak[c4] += dsb * zt_to_float(qr[c]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NC; i++) {
        const int c = lane + 32 * i;
        if (c < HS) {
            put(dkrow + c, ak[i] * p.scale, p.accumulate);
            put(dvrow + c, av[i], p.accumulate);
        }
    }
}

/* dbias_table[bk, h] (+)= the partials of every (sequence, row block) of head h, in order. */
__global__ void desc_bias_reduce_kernel(const desc_params p, float *dtable)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= p.nb * p.NH)
        return;
    const int bk = idx / p.NH, h = idx % p.NH;
    float sum = 0.0f;
    for (int b = 0; b < p.B; b++)
        for (int r = 0; r < p.ntq; r++)
            sum += p.part[(((long)b * p.NH + h) * p.ntq + r) * p.nb + bk];
    dtable[idx] = p.accumulate ? dtable[idx] + sum : sum;
}

/* The tensor-core kernels of every descriptor at head sizes 64 and 128 (bf16, fp16, sm_80+). */
#include "kernels/cuda/attention_desc_mma.cuh"

/* ---- host side ---- */

/* The kernel parameters of a descriptor; the T5 thresholds: thr[i] is the smallest distance whose bucket
 * (within its half) is max_exact + 1 + i, from zt_attention_t5_bucket itself, so both sides agree exactly. */
desc_params make_params(const zt_attention_desc *d)
{
    desc_params p;
    memset(&p, 0, sizeof(p));
    p.q = d->q;
    p.k = d->k;
    p.v = d->v;
    p.out = d->out;
    p.lse = (float *)d->lse;
    p.qs = d->q_stride;
    p.ks = d->k_stride;
    p.vs = d->v_stride;
    p.os = d->out_stride;
    p.B = d->B;
    p.Tq = d->Tq;
    p.Tk = d->Tk;
    p.NH = d->NH;
    p.NKV = d->NKV;
    p.HS = d->HS;
    p.G = d->NH / d->NKV;
    p.scale = d->scale > 0 ? d->scale : 1.0f / sqrtf((float)d->HS);
    p.causal = d->causal;
    p.window = d->window < 0 ? -1 : d->window;
    p.cu_q = d->cu_seqlens_q;
    p.cu_k = d->cu_seqlens_k;
    p.lens = d->lens;
    p.ntq = ZT_CEIL_DIV(d->Tq, DESC_QROWS);
    if (d->bias == ZT_ATTENTION_BIAS_T5) {
        p.table = (const float *)d->bias_table;
        p.nb = d->num_buckets;
        p.bidir = d->bias_bidirectional;
        p.half = p.bidir ? p.nb / 2 : p.nb;
        p.relR = d->max_distance;
        p.max_exact = p.half / 2;
        /* Within a half, the bucket of distance r is zt_attention_t5_bucket(-r, false, half, max_distance). */
        int r = p.max_exact;
        for (int v = p.max_exact + 1; v < p.half; v++) {
            while (zt_attention_t5_bucket(-r, false, p.half, d->max_distance) < v)
                r++;
            p.thr[p.nthr++] = r;
        }
    }
    return p;
}

template <typename T, int NC> void launch_forward(const desc_params &p, cudaStream_t stream)
{
    const dim3 grid((unsigned)ZT_CEIL_DIV(p.Tq, DESC_WARPS), (unsigned)(p.B * p.NH));
    desc_forward_kernel<T, NC><<<grid, DESC_WARPS * 32, 0, stream>>>(p);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T, int NC> void launch_backward(const desc_params &p, float *dtable, cudaStream_t stream)
{
    if (p.Tq > 0) {
        const dim3 qgrid((unsigned)ZT_CEIL_DIV(p.Tq, DESC_WARPS), (unsigned)(p.B * p.NH));
        desc_rowdot_kernel<T><<<qgrid, DESC_WARPS * 32, 0, stream>>>(p);
        ZT_CUDA_CHECK_LAUNCH();
        const dim3 dqgrid((unsigned)p.ntq, (unsigned)(p.B * p.NH));
        const size_t bsmem = p.table ? sizeof(float) * DESC_WARPS * p.nb : 0;
        desc_backward_q_kernel<T, NC><<<dqgrid, DESC_WARPS * 32, bsmem, stream>>>(p);
        ZT_CUDA_CHECK_LAUNCH();
    }
    if (p.Tk > 0) {
        const dim3 kvgrid((unsigned)ZT_CEIL_DIV(p.Tk, DESC_WARPS), (unsigned)(p.B * p.NKV));
        desc_backward_kv_kernel<T, NC><<<kvgrid, DESC_WARPS * 32, 0, stream>>>(p);
        ZT_CUDA_CHECK_LAUNCH();
    }
    if (p.table) { /* with Tq == 0 there are no partials: the table gets zeros (or stays) */
        desc_bias_reduce_kernel<<<(unsigned)ZT_CEIL_DIV(p.nb * p.NH, 128), 128, 0, stream>>>(p, dtable);
        ZT_CUDA_CHECK_LAUNCH();
    }
}

/* Head channels per lane: NC = ceil(HS / 32). */
template <typename T> void general_forward(const desc_params &p, cudaStream_t stream)
{
    switch (ZT_CEIL_DIV(p.HS, 32)) {
    case 1: launch_forward<T, 1>(p, stream); break;
    case 2: launch_forward<T, 2>(p, stream); break;
    case 3: launch_forward<T, 3>(p, stream); break;
    case 4: launch_forward<T, 4>(p, stream); break;
    case 5: launch_forward<T, 5>(p, stream); break;
    case 6: launch_forward<T, 6>(p, stream); break;
    case 7: launch_forward<T, 7>(p, stream); break;
    default: launch_forward<T, 8>(p, stream); break;
    }
}

template <typename T> void general_backward(const desc_params &p, float *dtable, cudaStream_t stream)
{
    switch (ZT_CEIL_DIV(p.HS, 32)) {
    case 1: launch_backward<T, 1>(p, dtable, stream); break;
    case 2: launch_backward<T, 2>(p, dtable, stream); break;
    case 3: launch_backward<T, 3>(p, dtable, stream); break;
    case 4: launch_backward<T, 4>(p, dtable, stream); break;
    case 5: launch_backward<T, 5>(p, dtable, stream); break;
    case 6: launch_backward<T, 6>(p, dtable, stream); break;
    case 7: launch_backward<T, 7>(p, dtable, stream); break;
    default: launch_backward<T, 8>(p, dtable, stream); break;
    }
}

/* ---- the descriptor's mma.sync kernels (attention_desc_mma.cuh) ---- */

/* Dynamic shared memory of a kernel: 0 forward, 1 dK/dV pass, 2 dQ pass (R: the bias's max_distance). */
template <typename T, int HS, bool BIAS> size_t dm_smem(int which, int R)
{
    using sh = dm_shape<T, HS, BIAS>;
    const size_t rel = BIAS ? (size_t)(2 * R + 1) * (MMA_WARPS * sizeof(float) + sizeof(int)) : 0;
    return which == 0 ? sh::fwd_smem : which == 1 ? sh::kv_smem : sh::q_smem_fixed + rel;
}

/* Most max_distance the mma.sync backward takes with a bias (its dQ pass keeps sums by rel in 2R + 1). */
constexpr int DM_MAX_REL_R = 1024;

/* Whether every distance from max_distance on falls in the last bucket of its half (so that the dQ pass may
 * sum rels beyond +-max_distance together): true for T5's bucket function whenever max_distance exceeds the
 * exact buckets, checked here rather than assumed. Buckets only grow with the distance. */
bool dm_far_buckets_shared(const zt_attention_desc *d)
{
    const int nb = d->num_buckets, R = d->max_distance;
    if (R < 1 || R > DM_MAX_REL_R)
        return false;
    const int half = d->bias_bidirectional ? nb / 2 : nb;
    if (zt_attention_t5_bucket(-R, d->bias_bidirectional, nb, R) != half - 1)
        return false;
    return !d->bias_bidirectional || zt_attention_t5_bucket(R, true, nb, R) == nb - 1;
}

/* Kernels above 48 KiB of dynamic shared memory must say so. */
template <typename K> void dm_allow_smem(K kernel, size_t bytes)
{
    if (bytes > 48 * 1024)
        ZT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* Whether this GPU and build run the kernels of (T, HS): sm_80 code (mma.sync, cp.async) and the shared
 * memory the forward (backward: true) needs. */
template <typename T, int HS> bool dm_device_ok(const zt_attention_desc *d, bool backward)
{
    cudaFuncAttributes attr;
    ZT_CUDA_CHECK(cudaFuncGetAttributes(&attr, dm_forward_kernel<T, HS, false>));
    if (attr.binaryVersion < 80 || attr.ptxVersion < 80)
        return false;
    int dev = 0, optin = 0;
    ZT_CUDA_CHECK(cudaGetDevice(&dev));
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const bool bias = d->bias == ZT_ATTENTION_BIAS_T5;
    size_t need = bias ? dm_smem<T, HS, true>(0, d->max_distance) : dm_smem<T, HS, false>(0, 0);
    if (backward) {
        if (bias && !dm_far_buckets_shared(d))
            return false;
        const size_t kv = bias ? dm_smem<T, HS, true>(1, d->max_distance) : dm_smem<T, HS, false>(1, 0);
        const size_t qq = bias ? dm_smem<T, HS, true>(2, d->max_distance) : dm_smem<T, HS, false>(2, 0);
        need = kv > qq ? kv : qq;
    }
    return need <= (size_t)optin;
}

/* A tensor the kernels copy 16 bytes at a time: aligned base and rows of whole 16-byte chunks (16-bit types). */
bool dm_rows_ok(const void *p, long stride)
{
    return p && zt_aligned16(p) && stride > 0 && stride % 8 == 0 && stride <= 0x7fffffffL;
}

/* Whether the mma.sync kernels serve d (g NULL: the forward; else the backward with g): F16 or BF16, head
 * size 64 or 128, a variant that does not ask for other kernels, 16-byte aligned rows, an sm_80+ GPU. */
bool dm_serves(const zt_attention_desc *d, const zt_attention_grads *g, enum zt_dtype dtype)
{
    const zt_attention_variant *v = d->variant;
    if ((dtype != ZT_DTYPE_F16 && dtype != ZT_DTYPE_BF16) || (d->HS != 64 && d->HS != 128))
        return false;
    if (v && (v->general || v->cuda_cores || v->wmma))
        return false;
    if (ZT_CEIL_DIV((long)d->Tq, DM_TILE) > 65535 || ZT_CEIL_DIV((long)d->Tk, DM_TILE) > 65535)
        return false;
    if (!dm_rows_ok(d->q, d->q_stride) || !dm_rows_ok(d->k, d->k_stride) || !dm_rows_ok(d->v, d->v_stride) ||
        !dm_rows_ok(d->out, d->out_stride))
        return false;
    if (g && (!dm_rows_ok(g->dout, d->out_stride) || !dm_rows_ok(g->dq, g->dq_stride) ||
              !dm_rows_ok(g->dk, g->dk_stride) || !dm_rows_ok(g->dv, g->dv_stride)))
        return false;
    if (dtype == ZT_DTYPE_BF16)
        return d->HS == 64 ? dm_device_ok<__nv_bfloat16, 64>(d, g) : dm_device_ok<__nv_bfloat16, 128>(d, g);
    return d->HS == 64 ? dm_device_ok<__half, 64>(d, g) : dm_device_ok<__half, 128>(d, g);
}

template <typename T, int HS, bool BIAS> void dm_forward(const desc_params &p, cudaStream_t stream)
{
    const size_t smem = dm_smem<T, HS, BIAS>(0, p.relR);
    dm_allow_smem(dm_forward_kernel<T, HS, BIAS>, smem);
    const dim3 grid((unsigned)(p.B * p.NH), (unsigned)ZT_CEIL_DIV(p.Tq, DM_TILE));
    dm_forward_kernel<T, HS, BIAS><<<grid, MMA_THREADS, smem, stream>>>(p);
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T, int HS, bool BIAS> void dm_backward(desc_params p, float *dtable, cudaStream_t stream)
{
    p.ntq = ZT_CEIL_DIV(p.Tq, DM_TILE); /* the dQ pass's row tiles: one bias partial each */
    if (p.Tq > 0) {
        const dim3 rgrid((unsigned)ZT_CEIL_DIV(p.Tq, DESC_WARPS), (unsigned)(p.B * p.NH));
        desc_rowdot_kernel<T><<<rgrid, DESC_WARPS * 32, 0, stream>>>(p);
        ZT_CUDA_CHECK_LAUNCH();
    }
    if (p.Tk > 0) {
        const size_t smem = dm_smem<T, HS, BIAS>(1, p.relR);
        dm_allow_smem(dm_backward_kv_kernel<T, HS, BIAS>, smem);
        const dim3 grid((unsigned)(p.B * p.NKV), (unsigned)ZT_CEIL_DIV(p.Tk, DM_TILE));
        dm_backward_kv_kernel<T, HS, BIAS><<<grid, MMA_THREADS, smem, stream>>>(p);
        ZT_CUDA_CHECK_LAUNCH();
    }
    if (p.Tq > 0) {
        const size_t smem = dm_smem<T, HS, BIAS>(2, p.relR);
        dm_allow_smem(dm_backward_q_kernel<T, HS, BIAS>, smem);
        const dim3 grid((unsigned)(p.B * p.NH), (unsigned)p.ntq);
        dm_backward_q_kernel<T, HS, BIAS><<<grid, MMA_THREADS, smem, stream>>>(p);
        ZT_CUDA_CHECK_LAUNCH();
    }
    if (BIAS) {
        desc_bias_reduce_kernel<<<(unsigned)ZT_CEIL_DIV(p.nb * p.NH, 128), 128, 0, stream>>>(p, dtable);
        ZT_CUDA_CHECK_LAUNCH();
    }
}

template <typename T> void dm_forward_t(const desc_params &p, cudaStream_t stream)
{
    if (p.HS == 64)
        p.table ? dm_forward<T, 64, true>(p, stream) : dm_forward<T, 64, false>(p, stream);
    else
        p.table ? dm_forward<T, 128, true>(p, stream) : dm_forward<T, 128, false>(p, stream);
}

template <typename T> void dm_backward_t(const desc_params &p, float *dtable, cudaStream_t stream)
{
    if (p.HS == 64)
        p.table ? dm_backward<T, 64, true>(p, dtable, stream) : dm_backward<T, 64, false>(p, dtable, stream);
    else
        p.table ? dm_backward<T, 128, true>(p, dtable, stream) : dm_backward<T, 128, false>(p, dtable, stream);
}

/* Whether d is packed qkv in the form the packed-qkv kernels take; fills dims. */
bool packed_form(const zt_attention_desc *d, enum zt_dtype dtype, zt_attention_dims *dims)
{
    const long es = (long)zt_dtype_size(dtype), W = (long)(d->NH + 2 * d->NKV) * d->HS;
    if ((d->variant && d->variant->general) || d->cu_seqlens_q || d->bias != ZT_ATTENTION_BIAS_NONE || d->window >= 0 || d->Tq != d->Tk)
        return false;
    if (d->scale > 0 && d->scale != 1.0f / sqrtf((float)d->HS))
        return false;
    if ((const char *)d->k != (const char *)d->q + (long)d->NH * d->HS * es ||
        (const char *)d->v != (const char *)d->k + (long)d->NKV * d->HS * es)
        return false;
    if (d->q_stride != W || d->k_stride != W || d->v_stride != W || d->out_stride != (long)d->NH * d->HS)
        return false;
    *dims = (zt_attention_dims){.B = d->B, .T = d->Tq, .NH = d->NH, .NKV = d->NKV, .HS = d->HS, .causal = d->causal};
    return zt__cuda_attention_packed_serves(dims);
}

bool packed_grads(const zt_attention_desc *d, const zt_attention_grads *g, enum zt_dtype dtype)
{
    const long es = (long)zt_dtype_size(dtype), W = (long)(d->NH + 2 * d->NKV) * d->HS;
    return (const char *)g->dk == (const char *)g->dq + (long)d->NH * d->HS * es &&
           (const char *)g->dv == (const char *)g->dk + (long)d->NKV * d->HS * es && g->dq_stride == W &&
           g->dk_stride == W && g->dv_stride == W;
}

int check_gpu(const zt_attention_desc *d, enum zt_dtype dtype, zt_err *err)
{
    int rc = zt_attention_check(d, false, err);
    if (rc)
        return rc;
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_F16 && dtype != ZT_DTYPE_BF16)
        return zt_fail(err, ZT_EUNSUPPORTED, "attention: dtype %d; the CUDA kernels take F32, F16 or BF16", (int)dtype);
    if (d->HS > DESC_MAX_HS)
        return zt_fail(err, ZT_EUNSUPPORTED, "attention: head size %d; the CUDA kernels take head sizes up to %d",
                       d->HS, DESC_MAX_HS);
    if (d->bias == ZT_ATTENTION_BIAS_T5 && d->num_buckets > ZT_ATTENTION_MAX_BUCKETS)
        return zt_fail(err, ZT_EUNSUPPORTED, "attention: %d buckets; the CUDA kernels take up to %d",
                       d->num_buckets, ZT_ATTENTION_MAX_BUCKETS);
    const long rows = (long)d->B * (d->NH > d->NKV ? d->NH : d->NKV);
    if (rows > 65535 || d->Tq < 0 || d->Tk < 0)
        return zt_fail(err, ZT_EUNSUPPORTED, "attention: %ld (sequence, head) pairs; the CUDA kernels take up to 65535",
                       rows);
    return 0;
}

} /* namespace */

extern "C" bool zt_cuda_attention_desc_supported(const zt_attention_desc *d, enum zt_dtype dtype)
{
    return check_gpu(d, dtype, NULL) == 0;
}

extern "C" const char *zt_cuda_attention_path(const zt_attention_desc *d, enum zt_dtype dtype)
{
    zt_attention_dims dims;
    if (packed_form(d, dtype, &dims))
        return "packed";
    return check_gpu(d, dtype, NULL) == 0 && dm_serves(d, NULL, dtype) ? "mma" : "general";
}

extern "C" size_t zt_cuda_attention_bwd_scratch_size(const zt_attention_desc *d)
{
    const size_t D = (size_t)d->B * d->NH * d->Tq * sizeof(float);
    const size_t part = d->bias == ZT_ATTENTION_BIAS_T5
                            ? (size_t)d->B * d->NH * ZT_CEIL_DIV(d->Tq, DESC_QROWS) * d->num_buckets * sizeof(float)
                            : 0;
    /* A descriptor in the packed-qkv form asking for the single pass runs it, which needs more. */
    const bool packed_candidate = !d->cu_seqlens_q && d->bias == ZT_ATTENTION_BIAS_NONE && d->window < 0 &&
                                  d->Tq == d->Tk && (d->scale <= 0 || d->scale == 1.0f / sqrtf((float)d->HS));
    if (packed_candidate && d->variant && d->variant->single_pass && (d->HS == 64 || d->HS == 128)) {
        const zt_attention_dims dims = {.B = d->B, .T = d->Tq, .NH = d->NH, .NKV = d->NKV, .HS = d->HS,
                                        .causal = d->causal};
        const size_t packed = zt__cuda_attention_single_pass_scratch_size(&dims);
        if (packed > D + part)
            return packed;
    }
    return D + part;
}

extern "C" int zt_cuda_attention_fwd(const zt_attention_desc *d, enum zt_dtype dtype, cudaStream_t stream,
                                     zt_err *err)
{
    int rc = check_gpu(d, dtype, err);
    if (rc)
        return rc;
    if (d->B == 0 || d->Tq == 0)
        return 0;
    zt_attention_dims dims;
    if (packed_form(d, dtype, &dims)) {
        zt__cuda_attention_packed_forward(d->out, (float *)d->lse, d->q, d->lens, &dims, dtype, stream, d->variant);
        return 0;
    }
    const desc_params p = make_params(d);
    if (dm_serves(d, NULL, dtype)) {
        if (dtype == ZT_DTYPE_BF16)
            dm_forward_t<__nv_bfloat16>(p, stream);
        else
            dm_forward_t<__half>(p, stream);
        return 0;
    }
    if (dtype == ZT_DTYPE_F32)
        general_forward<float>(p, stream);
    else if (dtype == ZT_DTYPE_F16)
        general_forward<__half>(p, stream);
    else
        general_forward<__nv_bfloat16>(p, stream);
    return 0;
}

extern "C" int zt_cuda_attention_bwd(const zt_attention_desc *d, const zt_attention_grads *g, void *scratch,
                                     enum zt_dtype dtype, cudaStream_t stream, zt_err *err)
{
    int rc = check_gpu(d, dtype, err);
    if (rc)
        return rc;
    if (!g->dout || !g->dq || !g->dk || !g->dv || !scratch || (d->bias == ZT_ATTENTION_BIAS_T5 && !g->dbias_table))
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention backward: dout, dq, dk, dv, the scratch (and dbias_table "
                                              "with a bias) must all be given");
    if (d->B == 0)
        return 0;
    zt_attention_dims dims;
    if (packed_form(d, dtype, &dims) && packed_grads(d, g, dtype) && d->Tq > 0) {
        zt__cuda_attention_packed_backward(g->dq, g->dout, d->q, d->out, (const float *)d->lse, d->lens, &dims,
                                           g->accumulate, scratch, dtype, stream, d->variant);
        return 0;
    }
    desc_params p = make_params(d);
    p.dout = g->dout;
    p.dq = g->dq;
    p.dk = g->dk;
    p.dv = g->dv;
    p.dqs = g->dq_stride;
    p.dks = g->dk_stride;
    p.dvs = g->dv_stride;
    p.accumulate = g->accumulate;
    p.D = (float *)scratch;
    p.part = p.D + (size_t)d->B * d->NH * d->Tq;
    if (dm_serves(d, g, dtype)) {
        if (dtype == ZT_DTYPE_BF16)
            dm_backward_t<__nv_bfloat16>(p, (float *)g->dbias_table, stream);
        else
            dm_backward_t<__half>(p, (float *)g->dbias_table, stream);
        return 0;
    }
    if (dtype == ZT_DTYPE_F32)
        general_backward<float>(p, (float *)g->dbias_table, stream);
    else if (dtype == ZT_DTYPE_F16)
        general_backward<__half>(p, (float *)g->dbias_table, stream);
    else
        general_backward<__nv_bfloat16>(p, (float *)g->dbias_table, stream);
    return 0;
}
