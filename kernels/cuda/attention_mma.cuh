/* The mma.sync building blocks of the attention kernels (bf16 and fp16 on sm_80+), shared by the tuned
 * kernels of attention.cu and the generic ones of attention_generic.cu. Internal to kernels/cuda/.
 *
 * Tiles of the storage type sit in shared memory with rows padded by 16 bytes (mma_cfg::LDS), so that the 8
 * row addresses of an ldmatrix fall in 8 different groups of 4 banks; cp.async moves 16 bytes from global
 * to shared memory without passing through registers.
 *
 * Products are mma.sync.m16n8k16 (fp32 accumulation). Fragment layout for a lane (g = lane / 4,
 * q = lane % 4): the accumulator c[4] of a 16 x 8 tile holds (row g, cols 2q, 2q + 1) in c[0], c[1] and
 * (row g + 8, same cols) in c[2], c[3]; the A operand (16 x 16) holds (row g, cols 2q..) (row g + 8,
 * cols 2q..) (row g, cols 8 + 2q..) (row g + 8, cols 8 + 2q..) as pairs; B (16 x 8, k x n) holds
 * (k 2q, 2q + 1; n g) and (k 8 + 2q, 8 + 2q + 1; n g). So the accumulators of two neighbouring 16 x 8
 * score tiles are, once rounded to 16 bits, the A operand of the next product: P never leaves the
 * registers, and the softmax statistics of a row live in the 4 lanes that share g.
 *
 * Operands from shared memory come through ldmatrix.x4 (four 8 x 8 matrices, one row address per lane):
 * A from a row-major tile (rows = M), B from a row-major tile whose rows are N (K in Q K^T: plain
 * ldmatrix) or whose rows are K (V in P V: ldmatrix.trans). */
#ifndef ZT_KERNELS_CUDA_ATTENTION_MMA_CUH
#define ZT_KERNELS_CUDA_ATTENTION_MMA_CUH

#include <stdint.h>

#include <type_traits>

#include "kernels/cuda/cuda_utils.cuh"

/* The architecture this compilation pass builds for (0 on the host). */
#if defined(__CUDA_ARCH__)
#define ZT_ARCH __CUDA_ARCH__
#else
#define ZT_ARCH 0
#endif

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_TILE 64 /* rows of a walked tile */

template <int HS> struct mma_cfg {
    static constexpr int LDS = HS + 8;                  /* shared row stride, elements */
    static constexpr int TILE_ELEMS = MMA_TILE * LDS;   /* one walked tile */
};

template <typename T> __host__ __device__ constexpr bool mma_supported()
{
    return (std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value) && ZT_ARCH >= 800;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared without passing through registers; zero-fills when !valid. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* d (16 x 8 fp32) += a (16 x 16) * b (16 x 8). */
template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x through the special-function unit alone (ex2.approx.ftz: relative error about 2^-22, results
 * below 2^-126 flushed to 0, 2^-inf = 0), without exp2f's handling of subnormal results, which a
 * probability rounded to 16 bits cannot use. */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Two floats as one register of two 16-bit values, lo in the low half (the lower column). */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The A operand of k-step ks (columns 16 ks .. 16 ks + 15) of a product whose left matrix is held as
 * accumulators acc[j] (16 x 8 each, columns 8 j ..): tiles 2 ks and 2 ks + 1, rounded to T. */
template <typename T, int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[N][4], int ks)
{
    a[0] = pack2<T>(acc[2 * ks][0], acc[2 * ks][1]);
    a[1] = pack2<T>(acc[2 * ks][2], acc[2 * ks][3]);
    a[2] = pack2<T>(acc[2 * ks + 1][0], acc[2 * ks + 1][1]);
    a[3] = pack2<T>(acc[2 * ks + 1][2], acc[2 * ks + 1][3]);
}

/* Starts copying rows [t0, t0 + ROWS) of one head's slice of a [*, stride] tensor into a padded tile;
 * rows at or past T_ are zero. */
template <typename T, int HS, int ROWS = MMA_TILE>
__device__ __forceinline__ void mma_load_tile(T *tile, const T *base, int t0, int T_, int stride)
{
    constexpr int CPR = HS / 8; /* 16-byte chunks per row */
    for (int idx = threadIdx.x; idx < ROWS * CPR; idx += MMA_THREADS) {
        const int r = idx / CPR, c = idx % CPR, t = t0 + r;
        const bool ok = t < T_;
        cp_async16(tile + r * mma_cfg<HS>::LDS + c * 8, base + (size_t)(ok ? t : 0) * stride + c * 8, ok);
    }
}

/* acc[mi][j] (16 x 8 tiles, j < 2 NP) += the rows [16 mi, 16 mi + 16) of a (row-major, HS long) times
 * the rows [0, 16 NP) of tile b (row-major, HS long) transposed: S = Q K^T-like products. Each B fragment
 * serves the MI row blocks. */
template <typename T, int HS, int MI, int NP>
__device__ __forceinline__ void mma_rows_x_rows(float (&acc)[MI][2 * NP][4], const T *a, const T *b)
{
    constexpr int LDS = mma_cfg<HS>::LDS;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        uint32_t af[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            ldsm_x4(af[mi], a + (mi * 16 + lane % 16) * LDS + ks * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < NP; np++) {
            /* Matrices: rows n 0-7 k 0-7, n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15. */
            uint32_t bf[4];
            ldsm_x4(bf, b + (np * 16 + (lane / 16) * 8 + lane % 8) * LDS + ks * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                mma16816<T>(acc[mi][2 * np], af[mi], bf[0], bf[1]);
                mma16816<T>(acc[mi][2 * np + 1], af[mi], bf[2], bf[3]);
            }
        }
    }
}

/* acc[mi] (16 x HS as HS / 8 tiles) += P (accumulators p[mi][j], 16 x 16 KS) times rows [0, 16 KS) of
 * the row-major tile x (HS long): O += P V-like products. */
template <typename T, int HS, int MI, int KS>
__device__ __forceinline__ void mma_acc_x_rows(float (&acc)[MI][HS / 8][4], const float (&p)[MI][2 * KS][4],
                                               const T *x)
{
    constexpr int LDS = mma_cfg<HS>::LDS;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t af[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            acc_to_a<T>(af[mi], p[mi], ks);
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            /* Transposed matrices: k 0-7 n 0-7, k 8-15 n 0-7, k 0-7 n 8-15, k 8-15 n 8-15. */
            uint32_t bf[4];
            ldsm_x4_trans(bf, x + (ks * 16 + lane % 16) * LDS + dp * 16 + (lane / 16) * 8);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                mma16816<T>(acc[mi][2 * dp], af[mi], bf[0], bf[1]);
                mma16816<T>(acc[mi][2 * dp + 1], af[mi], bf[2], bf[3]);
            }
        }
    }
}

/* acc (16 x HS as HS / 8 tiles) += A (16 x 16 KS) times rows [0, 16 KS) of the row-major tile x (HS long),
 * where A is held transposed in shared memory: A[m][k] at at[k * ldat + m] (16-byte aligned rows). dQ += dS K
 * from the dS^T a dK/dV pass keeps: ldmatrix.trans of the stored [k][m] matrices gives A's fragments. */
template <typename T, int HS, int KS>
__device__ __forceinline__ void mma_at_x_rows(float (&acc)[HS / 8][4], const T *at, int ldat, const T *x)
{
    constexpr int LDS = mma_cfg<HS>::LDS;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        /* Matrices (m, k): 0-7 0-7, 8-15 0-7, 0-7 8-15, 8-15 8-15, each stored as its k rows. */
        uint32_t af[4];
        ldsm_x4_trans(af, at + (ks * 16 + (lane / 16) * 8 + lane % 8) * ldat + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t bf[4];
            ldsm_x4_trans(bf, x + (ks * 16 + lane % 16) * LDS + dp * 16 + (lane / 16) * 8);
            mma16816<T>(acc[2 * dp], af, bf[0], bf[1]);
            mma16816<T>(acc[2 * dp + 1], af, bf[2], bf[3]);
        }
    }
}

/* p[0] += a, p[1] += b in global memory, performed where the memory is (no value comes back): one vector
 * reduction on sm_90, two scalar ones before. */
__device__ __forceinline__ void red_add2(float *p, float a, float b)
{
#if ZT_ARCH >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

/* An int in global memory read with acquire and written with release semantics at GPU scope: the ordered
 * hand-over of a tile between blocks (each block adds its part after the one before it released the tile). */
__device__ __forceinline__ int ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_gpu(int *p, int v)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

template <int MI, int N> __device__ __forceinline__ void mma_zero(float (&acc)[MI][N][4])
{
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][j][e] = 0.0f;
}

/* Adds scale * acc (rows g and g + 8 of a warp's 16 x HS block, as HS / 8 accumulator tiles) into
 * rows row0 and row0 + 8 of a [*, stride] tensor (rows at or past end skipped); overwrites instead when
 * !accumulate. */
template <typename T, int HS>
__device__ __forceinline__ void mma_store_rows(T *dst, int stride, int row0, int end, float scale,
                                               const float (&acc)[HS / 8][4], bool accumulate)
{
    const int q = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + 8 * i;
        if (row >= end)
            continue;
        T *p = dst + (size_t)row * stride + 2 * q;
#pragma unroll
        for (int j = 0; j < HS / 8; j++) {
            float lo = acc[j][2 * i] * scale, hi = acc[j][2 * i + 1] * scale;
            if (accumulate) {
                lo += zt_to_float(p[8 * j]);
                hi += zt_to_float(p[8 * j + 1]);
            }
            *reinterpret_cast<uint32_t *>(p + 8 * j) = pack2<T>(lo, hi);
        }
    }
}

/* The valid length of sequence b (T_ without a mask). */
__device__ __forceinline__ int mma_seq_len(const int32_t *lens, int b, int T_)
{
    return lens ? max(0, min(lens[b], T_)) : T_;
}

#endif
