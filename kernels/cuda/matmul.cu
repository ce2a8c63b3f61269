/* Linear layers on the GPU through cuBLASLt (kernels/matmul.h).
 *
 * Row-major [rows, cols] buffers are column-major [cols, rows] to cuBLAS, so out[N,OC] = inp W^T is the
 * column-major product out^T (OC x N) = W^T-as-stored (op T on an IC x OC matrix) times inp^T (IC x N).
 * Every GEMM computes in fp32 (CUBLAS_COMPUTE_32F: no TF32 for F32 data) with fp32 alpha/beta.
 *
 * Fusions: the forward puts the bias and the GELU (with its input saved as the "aux" output) into the
 * GEMM's epilogue, and the residual variant reads the residual stream as the GEMM's C (beta = 1); the backward can apply the GELU's derivative in the epilogue of the dinp GEMM. When
 * cuBLASLt has no kernel for a fused form (alignment, leading dimensions, old GPU) the launcher falls
 * back to the plain GEMM plus a small kernel, so results never depend on whether a fusion ran.
 * The bias gradient is a column sum done by our own kernel: split over a fixed number of row slices,
 * partial sums in the workspace, slices added in order, so it is deterministic. */
#include <cublasLt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/log.h"
}
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/matmul.h"
#include "kernels/residual.h" /* zt_cuda_add_inplace: the unfused residual */

#define BLAS_DEFAULT_WORKSPACE (32u << 20)
#define DBIAS_SLICES 64 /* row slices of the bias-gradient sum; fixed for determinism */
#define DBIAS_WARPS 8   /* warps (rows side by side) per block of the vectorised bias-gradient sum */
#define ALGO_SLOTS 64                /* GEMM forms whose algorithm is remembered */
#define TUNE_CANDIDATES 16           /* asked of the heuristic (it offers 8 for GPT-2's GEMMs on an H200) */
#define TUNE_RUNS 5                  /* timed runs per candidate, after one warm-up */

/* What identifies a GEMM form for the algorithm cache: everything the heuristic is told. */
typedef struct form_key {
    int dtype, m, n, k, trans_a, trans_b, lda, ldb, ldd, ldaux, epilogue, has_bias, has_aux, in_place;
    float beta;
    uint32_t al_a, al_b, al_c, al_d;
} form_key;

typedef struct algo_slot {
    form_key key;
    cublasLtMatmulAlgo_t algo;
} algo_slot;

struct zt_cuda_blas {
    cublasLtHandle_t lt;
    void *workspace; /* device, workspace_bytes */
    size_t workspace_bytes;
    /* The algorithm of each GEMM form, chosen at its first call: the heuristic's first or, with tuning
     * (on unless ZT_GEMM_TUNE=0; zt_cuda_blas_set_tuning), the fastest of its first TUNE_CANDIDATES that
     * give the first's bits. */
    bool tune;
    int nslots;
    algo_slot slots[ALGO_SLOTS];
    unsigned long long *d_hash; /* device: the hash of a candidate's output */
};

extern "C" int zt_cuda_blas_create(zt_cuda_blas **out, size_t workspace_bytes, zt_err *err)
{
    *out = NULL;
    zt_cuda_blas *ctx = (zt_cuda_blas *)calloc(1, sizeof(*ctx));
    if (!ctx)
        return zt_fail(err, ZT_ENOMEM, "out of host memory creating the cuBLASLt context");
    ctx->workspace_bytes = workspace_bytes ? workspace_bytes : BLAS_DEFAULT_WORKSPACE;
    const char *tune = getenv("ZT_GEMM_TUNE");
    ctx->tune = !(tune && strcmp(tune, "0") == 0);
    cublasStatus_t st = cublasLtCreate(&ctx->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(ctx);
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "cuBLASLt could not start (status %d): check the driver and that libcublasLt matches the "
                       "CUDA runtime",
                       (int)st);
    }
    cudaError_t ce = cudaMalloc(&ctx->workspace, ctx->workspace_bytes);
    if (ce == cudaSuccess)
        ce = cudaMalloc(&ctx->d_hash, sizeof *ctx->d_hash);
    if (ce != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls do not see it */
        cudaFree(ctx->workspace);
        cublasLtDestroy(ctx->lt);
        free(ctx);
        return zt_fail(err, ZT_ENOMEM, "cannot allocate %zu bytes of device memory for the cuBLASLt workspace (%s); "
                       "free GPU memory or pass a smaller workspace", workspace_bytes ? workspace_bytes
                       : (size_t)BLAS_DEFAULT_WORKSPACE, cudaGetErrorString(ce));
    }
    *out = ctx;
    return 0;
}

extern "C" void zt_cuda_blas_set_tuning(zt_cuda_blas *ctx, bool on)
{
    ctx->tune = on;
    ctx->nslots = 0; /* forget earlier choices */
}

extern "C" void zt_cuda_blas_destroy(zt_cuda_blas *ctx)
{
    if (!ctx)
        return;
    ZT_CUDA_CHECK(cudaFree(ctx->workspace));
    ZT_CUDA_CHECK(cudaFree(ctx->d_hash));
    ZT_CUBLAS_CHECK(cublasLtDestroy(ctx->lt));
    free(ctx);
}

/* ---- one GEMM through cuBLASLt ---- */

static cudaDataType_t cuda_type(enum zt_dtype dtype)
{
    switch (dtype) {
    case ZT_DTYPE_F32:
        return CUDA_R_32F;
    case ZT_DTYPE_F16:
        return CUDA_R_16F;
    case ZT_DTYPE_BF16:
        return CUDA_R_16BF;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_matmul", dtype);
    }
}

static uint32_t alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0)
        al >>= 1;
    return al;
}

/* What one call asks of cuBLASLt: column-major D (m x n, ldd) = op(A) op(B) [+ beta C], epilogue, where C is
 * c (same shape and ldd as D) or, when c is NULL, D itself. */
typedef struct gemm_args {
    void *d;
    const void *c;
    const void *a, *b;
    int m, n, k;
    bool trans_a, trans_b;
    int lda, ldb, ldd;
    float beta;
    cublasLtEpilogue_t epilogue;
    const void *bias; /* for *_BIAS epilogues */
    void *aux;        /* for *GELU_AUX* and DGELU epilogues */
    int ldaux;
} gemm_args;

/* *hash += a 64-bit mix of every (index, 32-bit word) of a buffer: equal buffers give equal hashes, and
 * any difference changes the sum except with a chance of about 2^-64. */
static __global__ void hash_kernel(const uint32_t *a, size_t n, unsigned long long *hash)
{
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long x = ((unsigned long long)i << 32 | a[i]) + 0x9E3779B97F4A7C15ull; /* splitmix64 */
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        local += x ^ (x >> 31);
    }
    atomicAdd(hash, local);
}

/* The hash of the bytes (a multiple of 4) of a device buffer; synchronizes the stream. */
static unsigned long long device_hash(zt_cuda_blas *ctx, const void *a, size_t bytes, cudaStream_t stream)
{
    unsigned long long h = 0;
    ZT_CUDA_CHECK(cudaMemsetAsync(ctx->d_hash, 0, sizeof h, stream));
    hash_kernel<<<264, 256, 0, stream>>>((const uint32_t *)a, bytes / 4, ctx->d_hash);
    ZT_CUDA_CHECK_LAUNCH();
    ZT_CUDA_CHECK(cudaMemcpyAsync(&h, ctx->d_hash, sizeof h, cudaMemcpyDeviceToHost, stream));
    ZT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return h;
}

/* Whether tuning may run a GEMM form's candidates into the call's own output: it may unless the GEMM
 * reads that output (an accumulation into D, such as the weight gradients), since the call's real run
 * comes after them and writes D (and the aux of a GELU epilogue) anew. */
static bool tunable(const gemm_args *g)
{
    return g->beta == 0.0f || (g->c != NULL && g->c != g->d);
}

/* Tuning of one GEMM form: runs the heuristic's candidates into the call's own outputs (see tunable),
 * keeps as eligible those whose outputs hash like the first candidate's (so that tuning never changes a
 * result: on the GEMMs of GPT-2 every candidate but the split-K ones gives the first's bits), times the
 * eligible ones and returns the index of the fastest (any of them gives the same results), or 0 (the
 * heuristic's first) when the first cannot run. */
static int tune_pick(zt_cuda_blas *ctx, enum zt_dtype dtype, const gemm_args *g, cublasLtMatmulDesc_t desc,
                     cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                     const cublasLtMatmulHeuristicResult_t *cand, int ncand, cudaStream_t stream)
{
    const size_t es = zt_dtype_size(dtype);
    const size_t dbytes = (size_t)g->ldd * g->n * es, auxbytes = (size_t)g->ldaux * g->n * es;
    const bool writes_aux = g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const void *c = g->c ? g->c : g->d;
    const float alpha = 1.0f;
    cudaEvent_t e0, e1;
    ZT_CUDA_CHECK(cudaEventCreate(&e0));
    ZT_CUDA_CHECK(cudaEventCreate(&e1));
    int best = 0, eligible = 0;
    float best_ms = INFINITY, first_ms = INFINITY;
    unsigned long long d_first = 0, aux_first = 0;
    for (int i = 0; i < ncand; i++) {
        if (cublasLtMatmul(ctx->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, ld, g->d, ld, &cand[i].algo,
                           ctx->workspace, ctx->workspace_bytes, stream) != CUBLAS_STATUS_SUCCESS) {
            if (i == 0)
                break; /* the heuristic's first cannot run here: nothing to compare with */
            continue;
        }
        const unsigned long long dh = dbytes % 4 == 0 ? device_hash(ctx, g->d, dbytes, stream) : 0;
        const unsigned long long ah = writes_aux && auxbytes % 4 == 0 ? device_hash(ctx, g->aux, auxbytes, stream) : 0;
        if (i == 0) {
            d_first = dh;
            aux_first = ah;
        } else if (dbytes % 4 != 0 || dh != d_first || ah != aux_first) {
            continue; /* sums in another order (split-K): other bits */
        }
        eligible++;
        ZT_CUDA_CHECK(cudaEventRecord(e0, stream));
        for (int r = 0; r < TUNE_RUNS; r++)
            ZT_CUBLAS_CHECK(cublasLtMatmul(ctx->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, ld, g->d, ld,
                                           &cand[i].algo, ctx->workspace, ctx->workspace_bytes, stream));
        ZT_CUDA_CHECK(cudaEventRecord(e1, stream));
        ZT_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= TUNE_RUNS;
        if (i == 0)
            first_ms = ms;
        if (ms < best_ms) {
            best_ms = ms;
            best = i;
        }
    }
    ZT_CUDA_CHECK(cudaEventDestroy(e0));
    ZT_CUDA_CHECK(cudaEventDestroy(e1));
    if (eligible > 0)
        zt_log(ZT_LOG_INFO, "gemm tune: m=%d n=%d k=%d epilogue %d: candidate %d of %d (%d with the same bits), "
               "%.4f ms (heuristic's first %.4f ms)", g->m, g->n, g->k, (int)g->epilogue, best, ncand, eligible,
               best_ms, first_ms);
    return best;
}

/* Runs the GEMM and returns CUBLAS_STATUS_SUCCESS, or, having launched nothing, the status that says
 * why cuBLASLt could not (no kernel for this shape, alignment, epilogue or dtype on this GPU). */
static cublasStatus_t gemm(zt_cuda_blas *ctx, enum zt_dtype dtype, const gemm_args *g, cudaStream_t stream)
{
    cudaDataType_t t = cuda_type(dtype);
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    ZT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epilogue,
                                                   sizeof(g->epilogue)));
    if (g->bias) {
        ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
        ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                       sizeof(g->bias)));
    }
    if (g->aux) {
        int64_t ldaux = g->ldaux;
        ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                       sizeof(g->aux)));
        ZT_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof(ldaux)));
    }
    /* Stored shapes: A is (trans_a ? k x m : m x k), B is (trans_b ? n x k : k x n), column-major. */
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, t, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda));
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, t, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb));
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, t, g->m, g->n, g->ldd));

    const void *c = g->c ? g->c : g->d;
    const uint32_t al_a = alignment_of(g->a), al_b = alignment_of(g->b), al_c = alignment_of(c),
                   al_d = alignment_of(g->d);
    /* The algorithm of a form seen before comes from the cache, without asking the heuristic again. */
    const form_key key = {(int)dtype, g->m, g->n, g->k, g->trans_a, g->trans_b, g->lda, g->ldb, g->ldd, g->ldaux,
                          (int)g->epilogue, g->bias != NULL, g->aux != NULL, c == g->d, g->beta,
                          al_a, al_b, al_c, al_d};
    const algo_slot *slot = NULL;
    for (int i = 0; i < ctx->nslots && !slot; i++)
        if (memcmp(&ctx->slots[i].key, &key, sizeof key) == 0)
            slot = &ctx->slots[i];
    cublasLtMatmulHeuristicResult_t cand[TUNE_CANDIDATES];
    cublasLtMatmulAlgo_t algo;
    int found = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (slot) {
        algo = slot->algo;
    } else {
        /* Tell the heuristic how aligned the pointers really are (it assumes 256 bytes otherwise). */
        cublasLtMatmulPreference_t pref;
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &ctx->workspace_bytes, sizeof(ctx->workspace_bytes)));
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                             sizeof(al_a)));
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                             sizeof(al_b)));
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                             sizeof(al_c)));
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                             sizeof(al_d)));
        const bool tune = ctx->tune && tunable(g);
        st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, la, lb, ld, ld, pref, tune ? TUNE_CANDIDATES : 1, cand,
                                            &found);
        ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        if (st == CUBLAS_STATUS_SUCCESS && found == 0)
            st = CUBLAS_STATUS_NOT_SUPPORTED;
        if (st == CUBLAS_STATUS_SUCCESS) {
            algo = cand[tune && found > 1 ? tune_pick(ctx, dtype, g, desc, la, lb, ld, cand, found, stream) : 0].algo;
            if (ctx->nslots < ALGO_SLOTS) {
                ctx->slots[ctx->nslots].key = key;
                ctx->slots[ctx->nslots].algo = algo;
                ctx->nslots++;
            }
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        const float alpha = 1.0f;
        st = cublasLtMatmul(ctx->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, ld, g->d, ld, &algo,
                            ctx->workspace, ctx->workspace_bytes, stream);
        /* Anything but "not supported" at this point is a failure to launch, not a missing kernel. */
        if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
            ZT_CUBLAS_CHECK(st);
    }
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    ZT_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    return st;
}

static bool gemm_ok(zt_cuda_blas *ctx, enum zt_dtype dtype, const gemm_args *g, cudaStream_t stream)
{
    return gemm(ctx, dtype, g, stream) == CUBLAS_STATUS_SUCCESS;
}

/* The plain GEMM must exist; its absence means a dtype this GPU cannot multiply (bf16 below sm_80). */
static void gemm_or_die(zt_cuda_blas *ctx, enum zt_dtype dtype, const gemm_args *g, cudaStream_t stream)
{
    cublasStatus_t st = gemm(ctx, dtype, g, stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr,
                "zt_cuda_matmul: cuBLASLt has no kernel for a %s GEMM m=%d n=%d k=%d on this GPU (status %d); BF16 "
                "needs sm_80 or newer (use zt_cuda_pick_dtype)\n",
                zt_dtype_name(dtype), g->m, g->n, g->k, (int)st);
        abort();
    }
}

/* ---- helper kernels for the unfused paths and the bias gradient ---- */

/* out[r, c] += bias[c] over an [rows, cols] buffer. */
template <typename T> static __global__ void add_bias_kernel(T *out, const T *bias, size_t rows, int cols)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols)
        return;
    out[i] = zt_from_float<T>(zt_to_float(out[i]) + zt_to_float(bias[i % cols]));
}

/* out = gelu(pre). */
template <typename T> static __global__ void gelu_kernel(T *out, const T *pre, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = zt_from_float<T>(zt_gelu(zt_to_float(pre[i])));
}

/* d = gelu'(pre) * d, in place (the unfused DGELU epilogue). */
template <typename T> static __global__ void dgelu_inplace_kernel(T *d, const T *pre, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        d[i] = zt_from_float<T>(zt_gelu_grad(zt_to_float(pre[i])) * zt_to_float(d[i]));
}

/* partial[slice, c] = sum of dout[r, c] over the rows r of row slice blockIdx.y, in row order.
 * blockDim.x threads cover consecutive columns, so each row's read is coalesced. */
template <typename T>
static __global__ void dbias_partial_kernel(float *__restrict__ partial, const T *__restrict__ dout, int N, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    int rows_per_slice = ZT_CEIL_DIV(N, (int)gridDim.y);
    int r0 = blockIdx.y * rows_per_slice;
    int r1 = min(N, r0 + rows_per_slice);
    float acc = 0.0f;
    for (int r = r0; r < r1; r++)
        acc += zt_to_float(dout[(size_t)r * OC + c]);
    partial[(size_t)blockIdx.y * OC + c] = acc;
}

/* The same partial sums with 16-byte loads, for OC a multiple of the vector and an aligned dout: lane l of a
 * block covers the VS columns (blockIdx.x * 32 + l) * VS .. + VS - 1; its DBIAS_WARPS warps take the rows
 * r0 + w, r0 + w + DBIAS_WARPS, ... of the slice in order, and warp 0 adds their sums in warp order. */
template <typename T>
static __global__ void __launch_bounds__(DBIAS_WARPS *ZT_WARP_SIZE)
    dbias_partial_vec_kernel(float *__restrict__ partial, const T *__restrict__ dout, int N, int OC)
{
    constexpr int VS = zt_vec<T>::size;
    __shared__ float sums[DBIAS_WARPS][ZT_WARP_SIZE * VS];
    const int lane = threadIdx.x % ZT_WARP_SIZE, warp = threadIdx.x / ZT_WARP_SIZE;
    const int c = (blockIdx.x * ZT_WARP_SIZE + lane) * VS;
    const int rows_per_slice = ZT_CEIL_DIV(N, (int)gridDim.y);
    const int r0 = blockIdx.y * rows_per_slice, r1 = min(N, r0 + rows_per_slice);
    float acc[VS];
#pragma unroll
    for (int k = 0; k < VS; k++)
        acc[k] = 0.0f;
    if (c < OC) {
#pragma unroll 4
        for (int r = r0 + warp; r < r1; r += DBIAS_WARPS) {
            const zt_vec<T> v = zt_load_vec_cs(dout + (size_t)r * OC + c);
#pragma unroll
            for (int k = 0; k < VS; k++)
                acc[k] += zt_to_float(v.v[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < VS; k++)
        sums[warp][lane * VS + k] = acc[k];
    __syncthreads();
    if (warp != 0 || c >= OC)
        return;
#pragma unroll
    for (int k = 0; k < VS; k++) {
        float sum = 0.0f;
        for (int w = 0; w < DBIAS_WARPS; w++)
            sum += sums[w][lane * VS + k];
        partial[(size_t)blockIdx.y * OC + c + k] = sum;
    }
}

/* dbias[c] += sum over slices of partial[slice, c], slices in order. */
template <typename T>
static __global__ void dbias_reduce_kernel(T *__restrict__ dbias, const float *__restrict__ partial, int slices, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float acc = 0.0f;
    for (int s = 0; s < slices; s++)
        acc += partial[(size_t)s * OC + c];
    dbias[c] = zt_from_float<T>(zt_to_float(dbias[c]) + acc);
}

static unsigned grid1d(size_t n, int block) { return (unsigned)ZT_CEIL_DIV(n, (size_t)block); }

template <typename T> static void add_bias(T *out, const T *bias, int N, int OC, cudaStream_t stream)
{
    add_bias_kernel<<<grid1d((size_t)N * OC, 256), 256, 0, stream>>>(out, bias, (size_t)N, OC);
    ZT_CUDA_CHECK_LAUNCH();
}

static void add_bias_any(void *out, const void *bias, int N, int OC, enum zt_dtype dtype, cudaStream_t stream)
{
    switch (dtype) {
    case ZT_DTYPE_F32:
        add_bias((float *)out, (const float *)bias, N, OC, stream);
        break;
    case ZT_DTYPE_F16:
        add_bias((__half *)out, (const __half *)bias, N, OC, stream);
        break;
    case ZT_DTYPE_BF16:
        add_bias((__nv_bfloat16 *)out, (const __nv_bfloat16 *)bias, N, OC, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_matmul_forward", dtype);
    }
}

static void gelu_any(void *out, const void *pre, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    switch (dtype) {
    case ZT_DTYPE_F32:
        gelu_kernel<<<grid1d(n, 256), 256, 0, stream>>>((float *)out, (const float *)pre, n);
        break;
    case ZT_DTYPE_F16:
        gelu_kernel<<<grid1d(n, 256), 256, 0, stream>>>((__half *)out, (const __half *)pre, n);
        break;
    case ZT_DTYPE_BF16:
        gelu_kernel<<<grid1d(n, 256), 256, 0, stream>>>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)pre, n);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_matmul_forward", dtype);
    }
    ZT_CUDA_CHECK_LAUNCH();
}

static void dgelu_any(void *d, const void *pre, size_t n, enum zt_dtype dtype, cudaStream_t stream)
{
    switch (dtype) {
    case ZT_DTYPE_F32:
        dgelu_inplace_kernel<<<grid1d(n, 256), 256, 0, stream>>>((float *)d, (const float *)pre, n);
        break;
    case ZT_DTYPE_F16:
        dgelu_inplace_kernel<<<grid1d(n, 256), 256, 0, stream>>>((__half *)d, (const __half *)pre, n);
        break;
    case ZT_DTYPE_BF16:
        dgelu_inplace_kernel<<<grid1d(n, 256), 256, 0, stream>>>((__nv_bfloat16 *)d, (const __nv_bfloat16 *)pre, n);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_matmul_backward", dtype);
    }
    ZT_CUDA_CHECK_LAUNCH();
}

template <typename T>
static void dbias(zt_cuda_blas *ctx, T *db, const T *dout, int N, int OC, cudaStream_t stream)
{
    int slices = N < DBIAS_SLICES ? N : DBIAS_SLICES;
    /* The partial sums borrow the cuBLASLt workspace: same stream, so the GEMMs queued after them wait. */
    ZT_ASSERT((size_t)slices * OC * sizeof(float) <= ctx->workspace_bytes);
    float *partial = (float *)ctx->workspace;
    constexpr int VS = zt_vec<T>::size;
    if (OC % VS == 0 && zt_aligned16(dout)) {
        dim3 grid(ZT_CEIL_DIV(OC, ZT_WARP_SIZE * VS), slices);
        dbias_partial_vec_kernel<<<grid, DBIAS_WARPS * ZT_WARP_SIZE, 0, stream>>>(partial, dout, N, OC);
    } else {
        dim3 grid(ZT_CEIL_DIV(OC, 128), slices);
        dbias_partial_kernel<<<grid, 128, 0, stream>>>(partial, dout, N, OC);
    }
    ZT_CUDA_CHECK_LAUNCH();
    dbias_reduce_kernel<<<ZT_CEIL_DIV(OC, 256), 256, 0, stream>>>(db, partial, slices, OC);
    ZT_CUDA_CHECK_LAUNCH();
}

/* ---- launchers ---- */

/* The forward GEMM out [N,OC] = inp [N,IC] weight[OC,IC]^T (+ bias), as column-major out^T = W^T-as-stored
 * times inp^T; no epilogue and no output chosen yet. */
static gemm_args forward_args(const void *inp, const void *weight, const void *bias, int N, int IC, int OC)
{
    gemm_args g = {};
    g.a = weight;
    g.b = inp;
    g.m = OC;
    g.n = N;
    g.k = IC;
    g.trans_a = true;
    g.trans_b = false;
    g.lda = IC;
    g.ldb = IC;
    g.ldd = OC;
    g.beta = 0.0f;
    g.bias = bias;
    return g;
}

extern "C" void zt_cuda_matmul_forward(zt_cuda_blas *ctx, void *out, void *pre_gelu, const void *inp,
                                       const void *weight, const void *bias, int N, int IC, int OC,
                                       enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(ctx && out && inp && weight && N > 0 && IC > 0 && OC > 0);
    gemm_args g = forward_args(inp, weight, bias, N, IC, OC);

    if (pre_gelu) {
        /* Fused: out = gelu(acc + bias), aux = acc + bias. */
        g.d = out;
        g.aux = pre_gelu;
        g.ldaux = OC;
        g.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (gemm_ok(ctx, dtype, &g, stream))
            return;
        ZT_DEBUG("matmul: no fused GELU epilogue for %s N=%d IC=%d OC=%d; GEMM then GELU kernel",
                 zt_dtype_name(dtype), N, IC, OC);
        g.aux = NULL;
        g.d = pre_gelu; /* unfused: the GEMM (with bias if possible) into pre_gelu, then the GELU */
    } else {
        g.d = out;
    }
    g.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (!bias || !gemm_ok(ctx, dtype, &g, stream)) {
        if (bias)
            ZT_DEBUG("matmul: no bias epilogue for %s N=%d IC=%d OC=%d; GEMM then bias kernel",
                     zt_dtype_name(dtype), N, IC, OC);
        g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        g.bias = NULL;
        gemm_or_die(ctx, dtype, &g, stream);
        if (bias)
            add_bias_any(g.d, bias, N, OC, dtype, stream);
    }
    if (pre_gelu)
        gelu_any(out, pre_gelu, (size_t)N * OC, dtype, stream);
}

extern "C" void zt_cuda_matmul_forward_residual(zt_cuda_blas *ctx, void *out, const void *inp, const void *weight,
                                                const void *bias, const void *residual, int N, int IC, int OC,
                                                enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(ctx && out && inp && weight && residual && out != residual && N > 0 && IC > 0 && OC > 0);
    gemm_args g = forward_args(inp, weight, bias, N, IC, OC);
    g.d = out;
    g.c = residual; /* out = residual + inp W^T (+ bias) */
    g.beta = 1.0f;
    g.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (gemm_ok(ctx, dtype, &g, stream))
        return;
    ZT_DEBUG("matmul: no fused residual for %s N=%d IC=%d OC=%d; GEMM then residual add", zt_dtype_name(dtype), N,
             IC, OC);
    zt_cuda_matmul_forward(ctx, out, NULL, inp, weight, bias, N, IC, OC, dtype, stream);
    zt_cuda_add_inplace(out, residual, (size_t)N * OC, dtype, stream);
}

/* The backward of both launchers: dinp_beta is 1 to add into dinp, 0 to overwrite it (ignored with
 * pre_gelu, whose DGELU result always overwrites). */
static void matmul_backward(zt_cuda_blas *ctx, void *dinp, void *dweight, void *dbias_, const void *dout,
                            const void *inp, const void *weight, const void *pre_gelu, int N, int IC, int OC,
                            enum zt_dtype dtype, float dinp_beta, cudaStream_t stream)
{
    ZT_ASSERT(ctx && dout && N > 0 && IC > 0 && OC > 0);
    ZT_ASSERT(dweight == NULL || inp != NULL);
    ZT_ASSERT(dinp == NULL || weight != NULL);

    if (dbias_) {
        switch (dtype) {
        case ZT_DTYPE_F32:
            dbias(ctx, (float *)dbias_, (const float *)dout, N, OC, stream);
            break;
        case ZT_DTYPE_F16:
            dbias(ctx, (__half *)dbias_, (const __half *)dout, N, OC, stream);
            break;
        case ZT_DTYPE_BF16:
            dbias(ctx, (__nv_bfloat16 *)dbias_, (const __nv_bfloat16 *)dout, N, OC, stream);
            break;
        default:
            ZT_CUDA_BAD_DTYPE("zt_cuda_matmul_backward", dtype);
        }
    }

    if (dinp) {
        /* dinp^T (IC x N) = W-as-stored (IC x OC) dout^T (OC x N). */
        gemm_args g = {};
        g.d = dinp;
        g.a = weight;
        g.b = dout;
        g.m = IC;
        g.n = N;
        g.k = OC;
        g.lda = IC;
        g.ldb = OC;
        g.ldd = IC;
        if (pre_gelu) {
            g.beta = 0.0f;
            g.epilogue = CUBLASLT_EPILOGUE_DGELU;
            g.aux = (void *)pre_gelu;
            g.ldaux = IC;
            if (!gemm_ok(ctx, dtype, &g, stream)) {
                ZT_DEBUG("matmul: no DGELU epilogue for %s N=%d IC=%d OC=%d; GEMM then GELU-gradient kernel",
                         zt_dtype_name(dtype), N, IC, OC);
                g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
                g.aux = NULL;
                gemm_or_die(ctx, dtype, &g, stream);
                dgelu_any(dinp, pre_gelu, (size_t)N * IC, dtype, stream);
            }
        } else {
            g.beta = dinp_beta;
            g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
            gemm_or_die(ctx, dtype, &g, stream);
        }
    }

    if (dweight) {
        /* dweight^T (IC x OC) += inp^T (IC x N) (dout^T)^T, dout^T stored OC x N. */
        gemm_args g = {};
        g.d = dweight;
        g.a = inp;
        g.b = dout;
        g.m = IC;
        g.n = OC;
        g.k = N;
        g.trans_b = true;
        g.lda = IC;
        g.ldb = OC;
        g.ldd = IC;
        g.beta = 1.0f;
        g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        gemm_or_die(ctx, dtype, &g, stream);
    }
}

extern "C" void zt_cuda_matmul_backward(zt_cuda_blas *ctx, void *dinp, void *dweight, void *dbias_, const void *dout,
                                        const void *inp, const void *weight, const void *pre_gelu, int N, int IC,
                                        int OC, enum zt_dtype dtype, cudaStream_t stream)
{
    matmul_backward(ctx, dinp, dweight, dbias_, dout, inp, weight, pre_gelu, N, IC, OC, dtype, 1.0f, stream);
}

extern "C" void zt_cuda_matmul_backward_overwrite(zt_cuda_blas *ctx, void *dinp, void *dweight, void *dbias_,
                                                  const void *dout, const void *inp, const void *weight,
                                                  const void *pre_gelu, int N, int IC, int OC, enum zt_dtype dtype,
                                                  cudaStream_t stream)
{
    matmul_backward(ctx, dinp, dweight, dbias_, dout, inp, weight, pre_gelu, N, IC, OC, dtype, 0.0f, stream);
}
