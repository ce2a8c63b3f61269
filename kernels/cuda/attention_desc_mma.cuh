/* The descriptor's tensor-core kernels (mma.sync, bf16 and fp16 on sm_80+, head sizes 64 and 128): every
 * feature of zt_attention_desc on the building blocks of attention_mma.cuh. Included by attention_desc.cu
 * inside its anonymous namespace, after the general kernels, whose parameters (desc_params), sequence
 * lookup (seq_of, key_range), T5 buckets (t5_bucket), row sums (desc_rowdot_kernel) and bias-table reduction
 * (desc_bias_reduce_kernel) these kernels share. Internal to kernels/cuda/.
 *
 * The packed-qkv kernels of attention.cu stay as they are for the descriptors in their form (their bits and
 * speed are what the models compare); these kernels serve every other descriptor at their head sizes:
 * separate q, k, v with row strides, Tq != Tk (bottom-right causal), any scale, sliding windows (key tiles
 * wholly outside every row's window are skipped), cu_seqlens (a block owns one 64-row tile of one sequence;
 * the grid covers the longest, blocks past their sequence's end return) and padding lengths, and T5's bias.
 *
 * Masks. Query row t of a sequence sees keys [lo(t), hi(t)) (key_range); both ends grow with t, so a tile of
 * rows sees [lo(first), hi(last)) and a warp's 16 rows are unmasked on a key tile iff lo(last) <= the first
 * key and the last key < hi(first). Only the tiles on an edge evaluate the mask per element.
 *
 * Bias. For a 64 x 64 tile pair the relative position key - pos takes 127 values (a diagonal each); the block
 * tabulates table[bucket, h] * log2(e) (and the buckets) for them in shared memory before the tile's scores.
 * The bias gradient, in the dQ pass: the buckets depend on rel alone, and every rel <= -R (R = max_distance)
 * has the bucket of -R, every rel >= R that of R (the host checks it, dm_serves). So each warp keeps dS sums
 * by rel: a shared row of 2R + 1 (index rel + R), the lanes' registers for the two far ends. Per step the
 * warp writes its 16 x SUB dS block to shared memory and lane u sums diagonal u in row order (one rel per
 * diagonal, so each entry of the row has one writer per step); a step wholly beyond +-R adds its dS in
 * registers. At the end the block sums its warps' rows in warp order, then each bucket its rels in order,
 * into one partial per (sequence, head, row tile), and desc_bias_reduce_kernel sums those in order: the same
 * bits on every run, no atomics.
 *
 * Scores are taken in base 2: s = (q.k) scale log2(e) + bias log2(e); the online softmax keeps its max in
 * those units and treats a row whose keys so far are all masked (max -inf) with a max of 0. */

constexpr int DM_TILE = MMA_TILE; /* rows of every tile, resident or walked */
constexpr int DM_DIAG = 2 * DM_TILE; /* diagonals of a tile pair (127, padded) */

template <typename T, int HS, bool BIAS> struct dm_shape {
    static constexpr int TE = mma_cfg<HS>::TILE_ELEMS;
    static constexpr int SUB = HS == 64 ? 64 : 32; /* walked columns per inner step of the backward */
    /* Forward: Q, 2 x K, 2 x V, two bias rows. */
    static constexpr size_t fwd_smem = (size_t)5 * TE * sizeof(T) + (BIAS ? 2 * DM_DIAG * sizeof(float) : 0);
    /* dK/dV pass: K, V, 2 x Q, 2 x dO, 2 x (lse, D) of 64, two bias rows. */
    static constexpr size_t kv_smem = (size_t)6 * TE * sizeof(T) + 4 * DM_TILE * sizeof(float) +
                                      (BIAS ? 2 * DM_DIAG * sizeof(float) : 0);
    /* dQ pass: Q, dO, 2 x K, 2 x V; with a bias two bias rows and each warp's dS block; then each warp's row
     * of sums by rel and the rels' buckets (2R + 1 floats and ints, added at launch). */
    static constexpr int DS_LD = SUB + 1;
    static constexpr size_t q_smem_fixed =
        (size_t)6 * TE * sizeof(T) + (BIAS ? 2 * DM_DIAG * sizeof(float) + MMA_WARPS * 16 * DS_LD * sizeof(float) : 0);
};

/* Query row t's keys [lo, hi) (empty past the valid rows). */
__device__ __forceinline__ void dm_row_range(const desc_params &p, const desc_seq &s, int t, int *lo, int *hi)
{
    *lo = 0;
    *hi = 0;
    if (t < s.qvalid)
        key_range(p, s, t, lo, hi);
}

/* The bias rows of a tile pair: rel = base + d - 63 for d < 127 (base = first key - first row's position). */
template <bool WITH_BUCKET>
__device__ __forceinline__ void dm_fill_bias(const desc_params &p, int h, int base, float *bias_s, int *bk_s)
{
    for (int d = threadIdx.x; d < DM_DIAG; d += MMA_THREADS) {
        const int bk = t5_bucket(p, base + d - (DM_TILE - 1));
        bias_s[d] = p.table[(long)bk * p.NH + h] * DESC_LOG2E;
        if constexpr (WITH_BUCKET)
            bk_s[d] = bk;
    }
}

/* ---- forward: a block owns 64 query rows of one (sequence, head) ---- */
template <typename T, int HS, bool BIAS>
__global__ void __launch_bounds__(MMA_THREADS) dm_forward_kernel(const desc_params p)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        constexpr int LDS = mma_cfg<HS>::LDS, TE = mma_cfg<HS>::TILE_ELEMS;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Qs = reinterpret_cast<T *>(smem);
        T *Ks = Qs + TE;     /* two buffers */
        T *Vs = Ks + 2 * TE; /* two buffers */
        float *bias_s = reinterpret_cast<float *>(Vs + 2 * TE); /* two rows of DM_DIAG */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int qt = gridDim.y - 1 - blockIdx.y;
        const int bh = blockIdx.x, b = bh / p.NH, h = bh % p.NH, kvh = h / p.G;
        const desc_seq s = seq_of(p, b);
        const int t0 = qt * DM_TILE;
        if (t0 >= s.span)
            return;
        const T *qb = (const T *)p.q + s.q0 * p.qs + (long)h * HS;
        const T *kb = (const T *)p.k + s.k0 * p.ks + (long)kvh * HS;
        const T *vb = (const T *)p.v + s.k0 * p.vs + (long)kvh * HS;
        T *ob = (T *)p.out + s.q0 * p.os + (long)h * HS;
        float *lseb = p.lse + (long)bh * p.Tq;

        /* The block's keys, its tiles, this warp's keys and this lane's two rows' keys. */
        int kbeg, kend, dummy;
        dm_row_range(p, s, t0, &kbeg, &dummy);
        dm_row_range(p, s, min(t0 + DM_TILE, s.qvalid) - 1, &dummy, &kend);
        const int kt0 = kbeg / DM_TILE, nkt = kbeg < kend ? ZT_CEIL_DIV(kend, DM_TILE) - kt0 : 0;
        const int wr0 = t0 + warp * 16;
        int wlo, whi, lo_last, hi_first;
        dm_row_range(p, s, wr0, &wlo, &hi_first);
        dm_row_range(p, s, wr0 + 15, &lo_last, &whi);
        const bool wfull_rows = wr0 + 15 < s.qvalid;
        if (wr0 >= s.qvalid)
            wlo = whi = 0;
        else if (!wfull_rows)
            dm_row_range(p, s, s.qvalid - 1, &dummy, &whi);
        int rlo[2], rhi[2];
        dm_row_range(p, s, wr0 + g, &rlo[0], &rhi[0]);
        dm_row_range(p, s, wr0 + g + 8, &rlo[1], &rhi[1]);
        const float scale_log2 = p.scale * DESC_LOG2E;

        mma_load_tile<T, HS>(Qs, qb, t0, s.span, (int)p.qs);
        if (nkt > 0) {
            mma_load_tile<T, HS>(Ks, kb, kt0 * DM_TILE, s.kspan, (int)p.ks);
            mma_load_tile<T, HS>(Vs, vb, kt0 * DM_TILE, s.kspan, (int)p.vs);
        }
        cp_async_commit();

        float o[1][HS / 8][4];
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        mma_zero(o);

        for (int it = 0; it < nkt; it++) {
            const int k0 = (kt0 + it) * DM_TILE;
            if (it + 1 < nkt) {
                const int nb = (it + 1) % 2;
                mma_load_tile<T, HS>(Ks + nb * TE, kb, k0 + DM_TILE, s.kspan, (int)p.ks);
                mma_load_tile<T, HS>(Vs + nb * TE, vb, k0 + DM_TILE, s.kspan, (int)p.vs);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            const float *bias_t = bias_s + (it % 2) * DM_DIAG;
            if constexpr (BIAS)
                dm_fill_bias<false>(p, h, k0 - t0 - s.off, bias_s + (it % 2) * DM_DIAG, nullptr);
            __syncthreads();
            if (k0 < whi && k0 + DM_TILE > wlo) {
                const T *Kt = Ks + (it % 2) * TE, *Vt = Vs + (it % 2) * TE;
                float sc[1][8][4];
                mma_zero(sc);
                mma_rows_x_rows<T, HS, 1, 4>(sc, Qs + warp * 16 * LDS, Kt);
                const bool edge = !(wfull_rows && lo_last <= k0 && k0 + DM_TILE <= hi_first);
                float mx[2] = {m[0], m[1]};
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int i = e / 2, c = 8 * j + 2 * q + (e % 2), key = k0 + c;
                        float v = sc[0][j][e] * scale_log2;
                        if constexpr (BIAS)
                            v += bias_t[c - (warp * 16 + g + 8 * i) + DM_TILE - 1];
                        if (edge && (key < rlo[i] || key >= rhi[i]))
                            v = -INFINITY;
                        sc[0][j][e] = v;
                        mx[i] = fmaxf(mx[i], v);
                    }
                float ms[2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                    ms[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; /* no key of the row yet */
                    const float alpha = fast_exp2(m[i] - ms[i]);
                    m[i] = mx[i];
                    l[i] *= alpha;
#pragma unroll
                    for (int j = 0; j < HS / 8; j++) {
                        o[0][j][2 * i] *= alpha;
                        o[0][j][2 * i + 1] *= alpha;
                    }
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float pv = fast_exp2(sc[0][j][e] - ms[e / 2]);
                        sc[0][j][e] = pv;
                        l[e / 2] += pv;
                    }
                mma_acc_x_rows<T, HS, 1, 4>(o, sc, Vt); /* O += P V */
            }
            __syncthreads();
        }
        if (nkt == 0)
            cp_async_wait<0>();

        float inv[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
            inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            const int row = wr0 + g + 8 * i;
            if (q == 0 && row < s.span)
                lseb[row] = l[i] > 0.0f ? (m[i] + log2f(l[i])) / DESC_LOG2E : INFINITY;
        }
#pragma unroll
        for (int j = 0; j < HS / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[0][j][e] *= inv[e / 2];
        mma_store_rows<T, HS>(ob, (int)p.os, wr0 + g, s.span, 1.0f, o[0], false);
    }
}

/* ---- backward, dK and dV: a block owns 64 keys of one (sequence, key/value head) and walks, query head by
 * query head of its group, the 64-row query tiles that see any of them ---- */
template <typename T, int HS, bool BIAS>
__global__ void __launch_bounds__(MMA_THREADS) dm_backward_kv_kernel(const desc_params p)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using sh = dm_shape<T, HS, BIAS>;
        constexpr int LDS = mma_cfg<HS>::LDS, TE = mma_cfg<HS>::TILE_ELEMS, SUB = sh::SUB;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Ks = reinterpret_cast<T *>(smem);
        T *Vs = Ks + TE;
        T *Qs = Vs + TE;      /* two buffers */
        T *dOs = Qs + 2 * TE; /* two buffers */
        float *lse_s = reinterpret_cast<float *>(dOs + 2 * TE); /* two buffers of 64 */
        float *D_s = lse_s + 2 * DM_TILE;                       /* two buffers of 64 */
        float *bias_s = D_s + 2 * DM_TILE;                      /* two rows of DM_DIAG */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int kt = blockIdx.y;
        const int bkv = blockIdx.x, b = bkv / p.NKV, kvh = bkv % p.NKV;
        const desc_seq s = seq_of(p, b);
        const int j0 = kt * DM_TILE;
        if (j0 >= s.kspan)
            return;
        const T *kb = (const T *)p.k + s.k0 * p.ks + (long)kvh * HS;
        const T *vb = (const T *)p.v + s.k0 * p.vs + (long)kvh * HS;
        const float scale_log2 = p.scale * DESC_LOG2E;

        /* The query rows that see a key of the block: the inverse of key_range. */
        int imin = 0, imax = 0;
        if (j0 < s.kvalid) {
            const int jl = min(j0 + DM_TILE, s.kvalid) - 1;
            imin = p.causal ? max(0, j0 - s.off) : 0;
            imax = s.qvalid;
            if (p.window >= 0)
                imax = min(imax, jl - s.off + p.window + 1);
        }
        const int qt0 = imin / DM_TILE, nq = imin < imax ? ZT_CEIL_DIV(imax, DM_TILE) - qt0 : 0;
        const int steps = p.G * nq;
        const int wk0 = j0 + warp * 16; /* this warp's first key; this lane's: wk0 + g (+ 8) */

        auto load_query_tile = [&](int it, int nb) {
            const int h = kvh * p.G + it / nq, qt = qt0 + it % nq;
            const long bh = (long)b * p.NH + h;
            mma_load_tile<T, HS>(Qs + nb * TE, (const T *)p.q + s.q0 * p.qs + (long)h * HS, qt * DM_TILE, s.span,
                                 (int)p.qs);
            mma_load_tile<T, HS>(dOs + nb * TE, (const T *)p.dout + s.q0 * p.os + (long)h * HS, qt * DM_TILE, s.span,
                                 (int)p.os);
            for (int i = threadIdx.x; i < DM_TILE; i += MMA_THREADS) {
                const int t = qt * DM_TILE + i;
                lse_s[nb * DM_TILE + i] = t < s.qvalid ? p.lse[bh * p.Tq + t] * DESC_LOG2E : INFINITY;
                D_s[nb * DM_TILE + i] = t < s.qvalid ? p.D[bh * p.Tq + t] : 0.0f;
            }
            if constexpr (BIAS)
                dm_fill_bias<false>(p, h, j0 - qt * DM_TILE - s.off, bias_s + nb * DM_DIAG, nullptr);
        };

        mma_load_tile<T, HS>(Ks, kb, j0, s.kspan, (int)p.ks);
        mma_load_tile<T, HS>(Vs, vb, j0, s.kspan, (int)p.vs);
        if (steps > 0)
            load_query_tile(0, 0);
        cp_async_commit();

        float dk[1][HS / 8][4], dv[1][HS / 8][4];
        mma_zero(dk);
        mma_zero(dv);

        for (int it = 0; it < steps; it++) {
            const int qt = qt0 + it % nq, cb = it % 2;
            if (it + 1 < steps) {
                load_query_tile(it + 1, 1 - cb);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const T *Qt = Qs + cb * TE, *dOt = dOs + cb * TE;
            const float *lse_t = lse_s + cb * DM_TILE, *D_t = D_s + cb * DM_TILE, *bias_t = bias_s + cb * DM_DIAG;
#pragma unroll 1
            for (int sub = 0; sub < DM_TILE / SUB; sub++) {
                const int qs0 = qt * DM_TILE + sub * SUB; /* first query row of the step */
                const int pf = qs0 + s.off, pl = qs0 + SUB - 1 + s.off; /* its positions */
                /* Skip: no key of this warp is seen by a query of the step. */
                if (wk0 >= s.kvalid || (p.causal && wk0 > pl) || (p.window >= 0 && wk0 + 15 < pf - p.window))
                    continue;
                const bool edge = !(wk0 + 15 < s.kvalid && (!p.causal || wk0 + 15 <= pf) &&
                                    (p.window < 0 || wk0 >= pl - p.window));
                float sc[1][SUB / 8][4], dp[1][SUB / 8][4];
                mma_zero(sc);
                mma_zero(dp);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(sc, Ks + warp * 16 * LDS, Qt + sub * SUB * LDS);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(dp, Vs + warp * 16 * LDS, dOt + sub * SUB * LDS);
                /* sc[0][j][e] is key wk0 + g + 8 (e / 2), query column c = sub SUB + 8 j + 2 q + e % 2. */
#pragma unroll
                for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int c = sub * SUB + 8 * j + 2 * q + (e % 2);
                        const int kr = warp * 16 + g + 8 * (e / 2), key = j0 + kr;
                        float v = sc[0][j][e] * scale_log2;
                        if constexpr (BIAS)
                            v += bias_t[kr - c + DM_TILE - 1];
                        float pv = fast_exp2(v - lse_t[c]);
                        if (edge) {
                            const int pos = qt * DM_TILE + c + s.off;
                            if (key >= s.kvalid || (p.causal && key > pos) || (p.window >= 0 && key < pos - p.window))
                                pv = 0.0f;
                        }
                        sc[0][j][e] = pv;
                        dp[0][j][e] = pv * (dp[0][j][e] - D_t[c]); /* dS^T */
                    }
                mma_acc_x_rows<T, HS, 1, SUB / 16>(dv, sc, dOt + sub * SUB * LDS); /* dV += P^T dO */
                mma_acc_x_rows<T, HS, 1, SUB / 16>(dk, dp, Qt + sub * SUB * LDS);  /* dK += dS^T Q */
            }
            __syncthreads();
        }
        if (steps == 0)
            cp_async_wait<0>();

        T *dkb = (T *)p.dk + s.k0 * p.dks + (long)kvh * HS;
        T *dvb = (T *)p.dv + s.k0 * p.dvs + (long)kvh * HS;
        mma_store_rows<T, HS>(dkb, (int)p.dks, wk0 + g, s.kspan, p.scale, dk[0], p.accumulate);
        mma_store_rows<T, HS>(dvb, (int)p.dvs, wk0 + g, s.kspan, 1.0f, dv[0], p.accumulate);
    }
}

/* ---- backward, dQ (and the bias table's partials): a block owns 64 query rows of one (sequence, head) and
 * walks the key tiles they see ---- */
template <typename T, int HS, bool BIAS>
__global__ void __launch_bounds__(MMA_THREADS) dm_backward_q_kernel(const desc_params p)
{
    if constexpr (!mma_supported<T>()) {
        __trap();
    } else {
        using sh = dm_shape<T, HS, BIAS>;
        constexpr int LDS = mma_cfg<HS>::LDS, TE = mma_cfg<HS>::TILE_ELEMS, SUB = sh::SUB, DS_LD = sh::DS_LD;
        extern __shared__ __align__(128) unsigned char smem[];
        T *Qs = reinterpret_cast<T *>(smem);
        T *dOs = Qs + TE;
        T *Ks = dOs + TE;    /* two buffers */
        T *Vs = Ks + 2 * TE; /* two buffers */
        float *bias_s = reinterpret_cast<float *>(Vs + 2 * TE); /* two rows of DM_DIAG */
        float *ds_s = bias_s + 2 * DM_DIAG;                     /* per warp 16 x DS_LD */
        const int R = p.relR, NREL = 2 * p.relR + 1;
        float *relacc = ds_s + MMA_WARPS * 16 * DS_LD;            /* per warp NREL: dS sums by rel + R */
        int *relbk = reinterpret_cast<int *>(relacc + MMA_WARPS * NREL); /* NREL: the bucket of rel */
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int qt = gridDim.y - 1 - blockIdx.y;
        const int bh = blockIdx.x, b = bh / p.NH, h = bh % p.NH, kvh = h / p.G;
        const desc_seq s = seq_of(p, b);
        const int t0 = qt * DM_TILE;
        if (t0 >= s.span) {
            if constexpr (BIAS) /* the reduction reads every partial */
                for (int bk = threadIdx.x; bk < p.nb; bk += MMA_THREADS)
                    p.part[((long)bh * p.ntq + qt) * p.nb + bk] = 0.0f;
            return;
        }
        float farneg = 0.0f, farpos = 0.0f; /* this lane's dS of rel <= -R and rel >= R */
        if constexpr (BIAS)
            for (int i = threadIdx.x; i < MMA_WARPS * NREL; i += MMA_THREADS)
                relacc[i] = 0.0f; /* the loop's first __syncthreads orders this */
        const T *qb = (const T *)p.q + s.q0 * p.qs + (long)h * HS;
        const T *dob = (const T *)p.dout + s.q0 * p.os + (long)h * HS;
        const T *kb = (const T *)p.k + s.k0 * p.ks + (long)kvh * HS;
        const T *vb = (const T *)p.v + s.k0 * p.vs + (long)kvh * HS;
        const float scale_log2 = p.scale * DESC_LOG2E;

        int kbeg, kend, dummy;
        dm_row_range(p, s, t0, &kbeg, &dummy);
        dm_row_range(p, s, min(t0 + DM_TILE, s.qvalid) - 1, &dummy, &kend);
        const int kt0 = kbeg / DM_TILE, nkt = kbeg < kend ? ZT_CEIL_DIV(kend, DM_TILE) - kt0 : 0;
        const int wr0 = t0 + warp * 16;
        int wlo, whi, lo_last, hi_first;
        dm_row_range(p, s, wr0, &wlo, &hi_first);
        dm_row_range(p, s, wr0 + 15, &lo_last, &whi);
        const bool wfull_rows = wr0 + 15 < s.qvalid;
        if (wr0 >= s.qvalid)
            wlo = whi = 0;
        else if (!wfull_rows)
            dm_row_range(p, s, s.qvalid - 1, &dummy, &whi);
        int rlo[2], rhi[2];
        float lse2[2], Dr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int row = wr0 + g + 8 * i;
            dm_row_range(p, s, row, &rlo[i], &rhi[i]);
            lse2[i] = row < s.qvalid ? p.lse[(long)bh * p.Tq + row] * DESC_LOG2E : INFINITY;
            Dr[i] = row < s.qvalid ? p.D[(long)bh * p.Tq + row] : 0.0f;
        }

        mma_load_tile<T, HS>(Qs, qb, t0, s.span, (int)p.qs);
        mma_load_tile<T, HS>(dOs, dob, t0, s.span, (int)p.os);
        if (nkt > 0) {
            mma_load_tile<T, HS>(Ks, kb, kt0 * DM_TILE, s.kspan, (int)p.ks);
            mma_load_tile<T, HS>(Vs, vb, kt0 * DM_TILE, s.kspan, (int)p.vs);
        }
        cp_async_commit();

        float dq[1][HS / 8][4];
        mma_zero(dq);

        for (int it = 0; it < nkt; it++) {
            const int k0 = (kt0 + it) * DM_TILE;
            if (it + 1 < nkt) {
                const int nb = (it + 1) % 2;
                mma_load_tile<T, HS>(Ks + nb * TE, kb, k0 + DM_TILE, s.kspan, (int)p.ks);
                mma_load_tile<T, HS>(Vs + nb * TE, vb, k0 + DM_TILE, s.kspan, (int)p.vs);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            const float *bias_t = bias_s + (it % 2) * DM_DIAG;
            if constexpr (BIAS)
                dm_fill_bias<false>(p, h, k0 - t0 - s.off, bias_s + (it % 2) * DM_DIAG, nullptr);
            __syncthreads();
            const T *Kt = Ks + (it % 2) * TE, *Vt = Vs + (it % 2) * TE;
#pragma unroll 1
            for (int sub = 0; sub < DM_TILE / SUB; sub++) {
                const int ks0 = k0 + sub * SUB; /* first key of the step */
                if (ks0 >= whi || ks0 + SUB <= wlo)
                    continue; /* no row of this warp sees a key of the step */
                const bool edge = !(wfull_rows && lo_last <= ks0 && ks0 + SUB <= hi_first);
                float sc[1][SUB / 8][4], dp[1][SUB / 8][4];
                mma_zero(sc);
                mma_zero(dp);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(sc, Qs + warp * 16 * LDS, Kt + sub * SUB * LDS);
                mma_rows_x_rows<T, HS, 1, SUB / 16>(dp, dOs + warp * 16 * LDS, Vt + sub * SUB * LDS);
                /* sc[0][j][e] is row wr0 + g + 8 (e / 2), key ks0 + 8 j + 2 q + e % 2. */
#pragma unroll
                for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int i = e / 2, cc = 8 * j + 2 * q + (e % 2), key = ks0 + cc;
                        float v = sc[0][j][e] * scale_log2;
                        if constexpr (BIAS)
                            v += bias_t[sub * SUB + cc - (warp * 16 + g + 8 * i) + DM_TILE - 1];
                        float pv = fast_exp2(v - lse2[i]);
                        if (edge && (key < rlo[i] || key >= rhi[i]))
                            pv = 0.0f;
                        sc[0][j][e] = pv * (dp[0][j][e] - Dr[i]); /* dS */
                    }
                mma_acc_x_rows<T, HS, 1, SUB / 16>(dq, sc, Kt + sub * SUB * LDS); /* dQ += dS K */
                if constexpr (BIAS) {
                    /* Diagonal u of the warp's 16 x SUB block holds (rr, rr + u - 15), at rel rel0 + u. */
                    const int rel0 = ks0 - t0 - warp * 16 - s.off - 15;
                    if (rel0 + SUB + 14 <= -R || rel0 >= R) { /* the whole step at one far end */
                        float sum = 0.0f;
#pragma unroll
                        for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                sum += sc[0][j][e];
                        if (rel0 >= R)
                            farpos += sum;
                        else
                            farneg += sum;
                    } else {
                        float *wds = ds_s + warp * 16 * DS_LD;
#pragma unroll
                        for (int j = 0; j < SUB / 8; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                wds[(g + 8 * (e / 2)) * DS_LD + 8 * j + 2 * q + (e % 2)] = sc[0][j][e];
                        __syncwarp();
                        float *wrel = relacc + warp * NREL;
                        for (int u = lane; u < SUB + 15; u += 32) {
                            float sum = 0.0f;
#pragma unroll
                            for (int rr = 0; rr < 16; rr++) {
                                const int cc = rr + u - 15;
                                if (cc >= 0 && cc < SUB)
                                    sum += wds[rr * DS_LD + cc];
                            }
                            const int rel = rel0 + u;
                            if (rel <= -R)
                                farneg += sum;
                            else if (rel >= R)
                                farpos += sum;
                            else
                                wrel[rel + R] += sum;
                        }
                        __syncwarp(); /* the next step rewrites the warp's dS block and rel row */
                    }
                }
            }
            __syncthreads();
        }
        if (nkt == 0)
            cp_async_wait<0>();

        T *dqb = (T *)p.dq + s.q0 * p.dqs + (long)h * HS;
        mma_store_rows<T, HS>(dqb, (int)p.dqs, wr0 + g, s.span, p.scale, dq[0], p.accumulate);
        if constexpr (BIAS) {
            /* The far ends: the warp's lanes in a fixed tree, into the row's ends (no other writer there). */
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                farneg += __shfl_xor_sync(0xffffffffu, farneg, o);
                farpos += __shfl_xor_sync(0xffffffffu, farpos, o);
            }
            __syncwarp();
            if (lane == 0) {
                relacc[warp * NREL] += farneg;
                relacc[warp * NREL + NREL - 1] += farpos;
            }
            __syncthreads();
            for (int i = threadIdx.x; i < NREL; i += MMA_THREADS) {
                float sum = 0.0f;
                for (int w = 0; w < MMA_WARPS; w++)
                    sum += relacc[w * NREL + i];
                relacc[i] = sum; /* warp 0's row becomes the block's */
                relbk[i] = t5_bucket(p, i - R);
            }
            __syncthreads();
            for (int bk = threadIdx.x; bk < p.nb; bk += MMA_THREADS) {
                float sum = 0.0f;
                for (int i = 0; i < NREL; i++)
                    if (relbk[i] == bk)
                        sum += relacc[i];
                p.part[((long)bh * p.ntq + qt) * p.nb + bk] = sum;
            }
        }
    }
}
