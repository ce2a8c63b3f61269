/* Linear layer (out = inp @ weight^T + bias), forward and backward, as one blocked matrix product.
 *
 * All three products (out, dinp, dweight) are C += A * B with different strides, so they share
 * zt_mm_gemm: C is cut into tiles (a chunk of rows x ZT_MM_NC columns) that threads take in a static
 * split; within a tile, slices of ZT_MM_KC along the reduction are packed into thread-local buffers (B as
 * panels of ZT_MM_NR columns, then A block by block as panels of ZT_MM_MR rows, zero-padded) and a
 * register tile of MR x NR accumulators walks each slice with unit-stride loads the compiler vectorises.
 *
 * Determinism: every element of C is owned by one tile, and its sum runs over k in increasing order
 * starting from C's previous value (an accumulator is stored to C and reloaded between KC slices, which
 * is exact), so the result depends neither on the thread count nor on the block sizes.
 *
 * Speed: the tile loop is compiled twice from one body, for the baseline (SSE2 on x86-64) and for
 * AVX2 + FMA, and picked at run time (kernels/cpu/cpu_dispatch.h): results are stable on a given machine
 * but may differ in the last bits between machines with and without FMA. */
#include <stdlib.h>

#include "common/status.h"
#include "kernels/cpu/cpu_dispatch.h"
#include "kernels/cpu_threads.h"
#include "kernels/matmul.h"

/* Register tile: MR rows x NR columns of accumulators (NR = 64 bytes of zt_real: 16 floats, 8 doubles). */
#define ZT_MM_MR 6
#define ZT_MM_NR (64 / (int)sizeof(zt_real))
/* Cache blocks: an A panel (MC x KC) stays in L2, a B micro-panel (KC x NR) in L1. */
#define ZT_MM_MC (ZT_MM_MR * 16)
#define ZT_MM_NC 256
#define ZT_MM_KC 256

/* A strided matrix view: element (i, j) is at p[i * s0 + j * s1]. */
typedef struct zt_mm_view {
    const zt_real *p;
    long s0, s1;
} zt_mm_view;

/* Packs rows [m0, m0+mc) x reduction [k0, k0+kc) of A into panels of MR rows: ap[panel][k][r]. */
ZT_CPU_INLINE void zt_mm_pack_a(zt_real *restrict ap, zt_mm_view a, int m0, int mc, int k0, int kc)
{
    for (int p0 = 0; p0 < mc; p0 += ZT_MM_MR) {
        int rows = mc - p0 < ZT_MM_MR ? mc - p0 : ZT_MM_MR;
        zt_real *dst = ap + (long)p0 * kc;
        if (a.s1 == 1) {
            for (int r = 0; r < rows; r++) {
                const zt_real *src = a.p + (long)(m0 + p0 + r) * a.s0 + k0;
                for (int k = 0; k < kc; k++)
                    dst[k * ZT_MM_MR + r] = src[k];
            }
        } else {
            for (int k = 0; k < kc; k++) {
                const zt_real *src = a.p + (long)(k0 + k) * a.s1 + (long)(m0 + p0) * a.s0;
                for (int r = 0; r < rows; r++)
                    dst[k * ZT_MM_MR + r] = src[r * a.s0];
            }
        }
        for (int r = rows; r < ZT_MM_MR; r++)
            for (int k = 0; k < kc; k++)
                dst[k * ZT_MM_MR + r] = 0;
    }
}

/* Packs reduction [k0, k0+kc) x columns [n0, n0+nc) of B into panels of NR columns: bp[panel][k][j]. */
ZT_CPU_INLINE void zt_mm_pack_b(zt_real *restrict bp, zt_mm_view b, int k0, int kc, int n0, int nc)
{
    for (int q0 = 0; q0 < nc; q0 += ZT_MM_NR) {
        int cols = nc - q0 < ZT_MM_NR ? nc - q0 : ZT_MM_NR;
        zt_real *dst = bp + (long)q0 * kc;
        if (b.s1 == 1) {
            for (int k = 0; k < kc; k++) {
                const zt_real *src = b.p + (long)(k0 + k) * b.s0 + n0 + q0;
                for (int j = 0; j < cols; j++)
                    dst[k * ZT_MM_NR + j] = src[j];
                for (int j = cols; j < ZT_MM_NR; j++)
                    dst[k * ZT_MM_NR + j] = 0;
            }
        } else {
            for (int j = 0; j < cols; j++) {
                const zt_real *src = b.p + (long)(n0 + q0 + j) * b.s1 + (long)k0 * b.s0;
                for (int k = 0; k < kc; k++)
                    dst[k * ZT_MM_NR + j] = src[k * b.s0];
            }
            for (int j = cols; j < ZT_MM_NR; j++)
                for (int k = 0; k < kc; k++)
                    dst[k * ZT_MM_NR + j] = 0;
        }
    }
}

/* c[0..rows, 0..cols) += ap panel * bp panel over kc, through an MR x NR register tile. */
ZT_CPU_INLINE void zt_mm_micro(zt_real *restrict c, long ldc, const zt_real *restrict ap,
                               const zt_real *restrict bp, int kc, int rows, int cols)
{
    zt_real acc[ZT_MM_MR][ZT_MM_NR];
    if (rows == ZT_MM_MR && cols == ZT_MM_NR) {
        for (int r = 0; r < ZT_MM_MR; r++)
            for (int j = 0; j < ZT_MM_NR; j++)
                acc[r][j] = c[r * ldc + j];
    } else {
        for (int r = 0; r < ZT_MM_MR; r++)
            for (int j = 0; j < ZT_MM_NR; j++)
                acc[r][j] = r < rows && j < cols ? c[r * ldc + j] : 0;
    }
    for (int k = 0; k < kc; k++) {
        const zt_real *a = ap + k * ZT_MM_MR;
        const zt_real *b = bp + k * ZT_MM_NR;
        for (int r = 0; r < ZT_MM_MR; r++) {
            zt_real ar = a[r];
            #pragma omp simd
            for (int j = 0; j < ZT_MM_NR; j++)
                acc[r][j] += ar * b[j];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            c[r * ldc + j] = acc[r][j];
}

/* Computes one tile of C (rows [m0, m0+mrows), columns [n0, n0+nc)) over the whole reduction K: each
 * KC slice of B is packed once and used for every MC block of rows of the tile. */
ZT_CPU_INLINE void zt_mm_tile_body(zt_real *c, long ldc, zt_mm_view a, zt_mm_view b, int K, int m0, int mrows,
                                   int n0, int nc, zt_real *ap, zt_real *bp)
{
    for (int k0 = 0; k0 < K; k0 += ZT_MM_KC) {
        int kc = K - k0 < ZT_MM_KC ? K - k0 : ZT_MM_KC;
        zt_mm_pack_b(bp, b, k0, kc, n0, nc);
        for (int mb = m0; mb < m0 + mrows; mb += ZT_MM_MC) {
            int mc = m0 + mrows - mb < ZT_MM_MC ? m0 + mrows - mb : ZT_MM_MC;
            zt_mm_pack_a(ap, a, mb, mc, k0, kc);
            for (int q0 = 0; q0 < nc; q0 += ZT_MM_NR) {
                int cols = nc - q0 < ZT_MM_NR ? nc - q0 : ZT_MM_NR;
                for (int p0 = 0; p0 < mc; p0 += ZT_MM_MR) {
                    int rows = mc - p0 < ZT_MM_MR ? mc - p0 : ZT_MM_MR;
                    zt_mm_micro(c + (long)(mb + p0) * ldc + n0 + q0, ldc, ap + (long)p0 * kc,
                                bp + (long)q0 * kc, kc, rows, cols);
                }
            }
        }
    }
}

/* zt_mm_tile_body compiled for the baseline instruction set (SSE2 on x86-64). */
static void zt_mm_tile_base(zt_real *c, long ldc, zt_mm_view a, zt_mm_view b, int K, int m0, int mrows, int n0,
                            int nc, zt_real *ap, zt_real *bp)
{
    zt_mm_tile_body(c, ldc, a, b, K, m0, mrows, n0, nc, ap, bp);
}

/* zt_mm_tile_body compiled for AVX2 + FMA (256-bit vectors, fused multiply-add). */
ZT_CPU_TARGET_AVX2 static void zt_mm_tile_avx2(zt_real *c, long ldc, zt_mm_view a, zt_mm_view b, int K, int m0,
                                               int mrows, int n0, int nc, zt_real *ap, zt_real *bp)
{
    zt_mm_tile_body(c, ldc, a, b, K, m0, mrows, n0, nc, ap, bp);
}

typedef void (*zt_mm_tile_fn)(zt_real *c, long ldc, zt_mm_view a, zt_mm_view b, int K, int m0, int mrows,
                              int n0, int nc, zt_real *ap, zt_real *bp);

/* The tile function for this CPU: AVX2 + FMA where the CPU has both, the baseline otherwise. */
static zt_mm_tile_fn zt_mm_pick_tile(void)
{
    return zt_cpu_has_avx2_fma() ? zt_mm_tile_avx2 : zt_mm_tile_base;
}

static int zt_mm_gcd(int a, int b)
{
    while (b) {
        int r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* C[M, NC] += A[M, K] * B[K, NC], C row-major with leading dimension ldc, A and B strided views.
 * Tiles are ZT_MM_NC columns wide; the rows are cut into as few chunks as make the number of tiles a
 * multiple of the thread count, so that every thread gets the same work and packs B as rarely as
 * possible. (The tiling may depend on the thread count: results do not, see the top of the file.) */
static void zt_mm_gemm(zt_real *c, long ldc, zt_mm_view a, zt_mm_view b, int M, int NC, int K)
{
    if (M <= 0 || NC <= 0 || K <= 0)
        return;
    int nthreads = zt_cpu_get_threads();
    int ntiles = (NC + ZT_MM_NC - 1) / ZT_MM_NC;
    int chunks = nthreads / zt_mm_gcd(ntiles, nthreads);
    int max_chunks = (M + ZT_MM_MR - 1) / ZT_MM_MR;
    if (chunks > max_chunks)
        chunks = max_chunks;
    int chunk_rows = (M + chunks - 1) / chunks;
    chunk_rows = (chunk_rows + ZT_MM_MR - 1) / ZT_MM_MR * ZT_MM_MR;
    chunks = (M + chunk_rows - 1) / chunk_rows;
    int tiles = ntiles * chunks;
    if (nthreads > tiles)
        nthreads = tiles;
    zt_mm_tile_fn tile = zt_mm_pick_tile();
    #pragma omp parallel num_threads(nthreads)
    {
        /* Thread-local packing buffers, sized for a full block and aligned for vector loads. */
        zt_real *ap = aligned_alloc(64, sizeof(zt_real) * ZT_MM_MC * ZT_MM_KC);
        zt_real *bp = aligned_alloc(64, sizeof(zt_real) * ZT_MM_NC * ZT_MM_KC);
        ZT_ASSERT(ap != NULL && bp != NULL);
        #pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            int m0 = (t % chunks) * chunk_rows, n0 = (t / chunks) * ZT_MM_NC;
            int mrows = M - m0 < chunk_rows ? M - m0 : chunk_rows;
            int nc = NC - n0 < ZT_MM_NC ? NC - n0 : ZT_MM_NC;
            tile(c, ldc, a, b, K, m0, mrows, n0, nc, ap, bp);
        }
        free(ap);
        free(bp);
    }
}

/* Overwrites out[n,o] with bias[o] + sum_i inp[n,i] * weight[o,i]. */
void zt_cpu_matmul_forward(zt_real *out, const zt_real *inp, const zt_real *weight, const zt_real *bias,
                           int N, int IC, int OC)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)N * OC >= 16384)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            out[(long)n * OC + o] = bias ? bias[o] : 0;
    zt_mm_view a = {inp, IC, 1};    /* A[n, i] = inp[n, i] */
    zt_mm_view b = {weight, 1, IC}; /* B[i, o] = weight[o, i] */
    zt_mm_gemm(out, OC, a, b, N, OC, IC);
}

/* Adds dout @ weight into dinp, dout^T @ inp into dweight and the column sums of dout into dbias. */
void zt_cpu_matmul_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                            const zt_real *inp, const zt_real *weight, int N, int IC, int OC)
{
    if (dinp) {
        zt_mm_view a = {dout, OC, 1};   /* A[n, o] = dout[n, o] */
        zt_mm_view b = {weight, IC, 1}; /* B[o, i] = weight[o, i] */
        zt_mm_gemm(dinp, IC, a, b, N, IC, OC);
    }
    zt_mm_view a = {dout, 1, OC}; /* A[o, n] = dout[n, o] */
    zt_mm_view b = {inp, IC, 1};  /* B[n, i] = inp[n, i] */
    zt_mm_gemm(dweight, IC, a, b, OC, IC, N);

    if (dbias) {
        /* Column sums: threads split the columns, each sums its columns over n in order. */
        enum { COLS = 64 };
        int blocks = (OC + COLS - 1) / COLS;
        #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)N * OC >= 16384)
        for (int blk = 0; blk < blocks; blk++) {
            int o0 = blk * COLS, o1 = o0 + COLS < OC ? o0 + COLS : OC;
            zt_real sum[COLS] = {0};
            for (int n = 0; n < N; n++)
                for (int o = o0; o < o1; o++)
                    sum[o - o0] += dout[(long)n * OC + o];
            for (int o = o0; o < o1; o++)
                dbias[o] += sum[o - o0];
        }
    }
}
