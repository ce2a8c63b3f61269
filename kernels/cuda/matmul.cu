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
#define TUNE_SLOTS 64                /* GEMM forms whose tuned algorithm is remembered */
#define TUNE_CANDIDATES 16           /* asked of the heuristic (it offers 8 for GPT-2's GEMMs on an H200) */
#define TUNE_RUNS 5                  /* timed runs per candidate, after one warm-up */
#define TUNE_HEADROOM (512ull << 20) /* device memory that tuning's scratch outputs must leave free */

/* What identifies a GEMM form for the tuned-algorithm cache: everything the heuristic is told. */
typedef struct tune_key {
    int dtype, m, n, k, trans_a, trans_b, lda, ldb, ldd, ldaux, epilogue, has_bias, has_aux, in_place;
    float beta;
    uint32_t al_a, al_b, al_c, al_d;
} tune_key;

typedef struct tune_slot {
    tune_key key;
    cublasLtMatmulAlgo_t algo;
} tune_slot;

struct zt_cuda_blas {
    cublasLtHandle_t lt;
    void *workspace; /* device, workspace_bytes */
    size_t workspace_bytes;
    /* Tuning (on unless ZT_GEMM_TUNE=0; zt_cuda_blas_set_tuning): the first call of each GEMM form picks
     * the fastest of the heuristic's first TUNE_CANDIDATES algorithms that give the first's bits. */
    bool tune;
    int tuned;
    tune_slot slots[TUNE_SLOTS];
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
    if (ce != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls do not see it */
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
    ctx->tuned = 0; /* forget earlier choices */
}

extern "C" void zt_cuda_blas_destroy(zt_cuda_blas *ctx)
{
    if (!ctx)
        return;
    ZT_CUDA_CHECK(cudaFree(ctx->workspace));
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

/* *count += the 32-bit words where a and b differ. */
static __global__ void count_diff_kernel(const uint32_t *a, const uint32_t *b, size_t n, unsigned long long *count)
{
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        local += a[i] != b[i];
    if (local)
        atomicAdd(count, local);
}

/* Whether two device buffers (bytes a multiple of 4) hold the same bits; synchronizes the stream. */
static bool same_bits(const void *a, const void *b, size_t bytes, unsigned long long *d_count, cudaStream_t stream)
{
    unsigned long long h = 0;
    ZT_CUDA_CHECK(cudaMemsetAsync(d_count, 0, sizeof *d_count, stream));
    count_diff_kernel<<<264, 256, 0, stream>>>((const uint32_t *)a, (const uint32_t *)b, bytes / 4, d_count);
    ZT_CUDA_CHECK_LAUNCH();
    ZT_CUDA_CHECK(cudaMemcpyAsync(&h, d_count, sizeof h, cudaMemcpyDeviceToHost, stream));
    ZT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return h == 0;
}

static size_t dtype_bytes(enum zt_dtype dtype)
{
    return dtype == ZT_DTYPE_F32 ? 4 : 2;
}

/* Tuning of one GEMM form: runs the heuristic's candidates on scratch outputs (the call's own D, and an
 * aux that the epilogue writes, stay untouched; an accumulating GEMM reads the real D as its C), keeps
 * as eligible those whose outputs equal the first candidate's bit for bit (so that tuning never changes
 * a result: on the GEMMs of GPT-2 every candidate but the split-K ones does), times the eligible ones
 * and returns the index of the fastest (any of them gives the same results), or 0 (the heuristic's
 * first) when the scratch cannot be had. */
static int tune_pick(zt_cuda_blas *ctx, enum zt_dtype dtype, const gemm_args *g, cublasLtMatmulDesc_t desc,
                     cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                     const cublasLtMatmulHeuristicResult_t *cand, int ncand, cudaStream_t stream)
{
    const size_t dbytes = (size_t)g->ldd * g->n * dtype_bytes(dtype);
    const size_t auxbytes = (size_t)g->ldaux * g->n * dtype_bytes(dtype);
    const bool writes_aux = g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    /* d, d0 (the first candidate's output), aux, aux0, and the difference count. */
    void *buf[5] = {NULL, NULL, NULL, NULL, NULL};
    const size_t sizes[5] = {dbytes, dbytes, writes_aux ? auxbytes : 0, writes_aux ? auxbytes : 0,
                             sizeof(unsigned long long)};
    size_t need = 0, free_b = 0, total_b = 0;
    for (int i = 0; i < 5; i++)
        need += sizes[i];
    /* Never tune at the cost of someone else's memory: a form too large for what is free keeps the
     * heuristic's first. */
    bool ok = dbytes % 4 == 0 && auxbytes % 4 == 0 && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
              free_b >= need + TUNE_HEADROOM;
    for (int i = 0; i < 5 && ok; i++)
        if (sizes[i] && cudaMalloc(&buf[i], sizes[i]) != cudaSuccess) {
            cudaGetLastError(); /* not enough memory to tune: keep the heuristic's first */
            ok = false;
        }
    int best = 0, eligible = 0;
    float best_ms = INFINITY, first_ms = INFINITY;
    if (ok) {
        void *d = buf[0], *d0 = buf[1], *aux = buf[2], *aux0 = buf[3];
        unsigned long long *d_count = (unsigned long long *)buf[4];
        if (writes_aux)
            ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                           sizeof(aux)));
        const void *c = g->c ? g->c : g->d;
        const float alpha = 1.0f;
        cudaEvent_t e0, e1;
        ZT_CUDA_CHECK(cudaEventCreate(&e0));
        ZT_CUDA_CHECK(cudaEventCreate(&e1));
        for (int i = 0; i < ncand; i++) {
            if (cublasLtMatmul(ctx->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, ld, d, ld, &cand[i].algo,
                               ctx->workspace, ctx->workspace_bytes, stream) != CUBLAS_STATUS_SUCCESS) {
                if (i == 0)
                    break; /* the heuristic's first cannot run here: nothing to compare with */
                continue;
            }
            if (i == 0) {
                ZT_CUDA_CHECK(cudaMemcpyAsync(d0, d, dbytes, cudaMemcpyDeviceToDevice, stream));
                if (writes_aux)
                    ZT_CUDA_CHECK(cudaMemcpyAsync(aux0, aux, auxbytes, cudaMemcpyDeviceToDevice, stream));
            } else if (!same_bits(d, d0, dbytes, d_count, stream) ||
                       (writes_aux && !same_bits(aux, aux0, auxbytes, d_count, stream))) {
                continue; /* sums in another order (split-K): other bits */
            }
            eligible++;
            ZT_CUDA_CHECK(cudaEventRecord(e0, stream));
            for (int r = 0; r < TUNE_RUNS; r++)
                ZT_CUBLAS_CHECK(cublasLtMatmul(ctx->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, ld, d, ld,
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
        if (writes_aux)
            ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                           sizeof(g->aux)));
    }
    for (int i = 0; i < 5; i++)
        cudaFree(buf[i]);
    if (eligible > 0)
        zt_log(ZT_LOG_INFO, "gemm tune: m=%d n=%d k=%d epilogue %d: candidate %d of %d (%d with the same bits), "
               "%.4f ms (heuristic's first %.4f ms)", g->m, g->n, g->k, (int)g->epilogue, best, ncand, eligible,
               best_ms, first_ms);
    else
        zt_log(ZT_LOG_INFO, "gemm tune: m=%d n=%d k=%d epilogue %d: not tuned (%s), the heuristic's first", g->m,
               g->n, g->k, (int)g->epilogue, ok ? "it cannot run on scratch" : "too little free memory for scratch outputs");
    return best;
}

/* Runs the GEMM and returns CUBLAS_STATUS_SUCCESS, or, having launched nothing, the status that says
 * why cuBLASLt could not (no kernel for this shape, alignment, epilogue or dtype on this GPU). */
static cublasStatus_t gemm(zt_cuda_blas *ctx, enum zt_dtype dtype, const gemm_args *g, cudaStream_t stream)
{
    cudaDataType_t t = cuda_type(dtype);
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
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

    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &ctx->workspace_bytes, sizeof(ctx->workspace_bytes)));
    /* Tell the heuristic how aligned the pointers really are (it assumes 256 bytes otherwise). */
    const void *c = g->c ? g->c : g->d;
    uint32_t al_a = alignment_of(g->a), al_b = alignment_of(g->b), al_c = alignment_of(c), al_d = alignment_of(g->d);
    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                         sizeof(al_a)));
    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                         sizeof(al_b)));
    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                         sizeof(al_c)));
    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                         sizeof(al_d)));

    cublasLtMatmulHeuristicResult_t cand[TUNE_CANDIDATES];
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    tune_key key;
    memset(&key, 0, sizeof key);
    tune_slot *slot = NULL;
    if (ctx->tune) {
        key = tune_key{(int)dtype, g->m, g->n, g->k, g->trans_a, g->trans_b, g->lda, g->ldb, g->ldd, g->ldaux,
                       (int)g->epilogue, g->bias != NULL, g->aux != NULL, c == g->d, g->beta,
                       al_a, al_b, al_c, al_d};
        for (int i = 0; i < ctx->tuned && !slot; i++)
            if (memcmp(&ctx->slots[i].key, &key, sizeof key) == 0)
                slot = &ctx->slots[i];
    }
    if (slot) {
        heur.algo = slot->algo;
    } else {
        const int want = ctx->tune && ctx->tuned < TUNE_SLOTS ? TUNE_CANDIDATES : 1;
        st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, la, lb, ld, ld, pref, want, cand, &found);
        if (st == CUBLAS_STATUS_SUCCESS && found == 0)
            st = CUBLAS_STATUS_NOT_SUPPORTED;
        if (st == CUBLAS_STATUS_SUCCESS) {
            heur = cand[want > 1 && found > 1 ? tune_pick(ctx, dtype, g, desc, la, lb, ld, cand, found, stream) : 0];
            if (want > 1) {
                ctx->slots[ctx->tuned].key = key;
                ctx->slots[ctx->tuned].algo = heur.algo;
                ctx->tuned++;
            }
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        const float alpha = 1.0f;
        st = cublasLtMatmul(ctx->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, ld, g->d, ld, &heur.algo,
                            ctx->workspace, ctx->workspace_bytes, stream);
        /* Anything but "not supported" at this point is a failure to launch, not a missing kernel. */
        if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
            ZT_CUBLAS_CHECK(st);
    }
    ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
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
    dim3 grid(ZT_CEIL_DIV(OC, 128), slices);
    dbias_partial_kernel<<<grid, 128, 0, stream>>>(partial, dout, N, OC);
    ZT_CUDA_CHECK_LAUNCH();
    dbias_reduce_kernel<<<ZT_CEIL_DIV(OC, 256), 256, 0, stream>>>(db, partial, slices, OC);
    ZT_CUDA_CHECK_LAUNCH();
}

/* ---- launchers ---- */

extern "C" void zt_cuda_matmul_forward(zt_cuda_blas *ctx, void *out, void *pre_gelu, const void *inp,
                                       const void *weight, const void *bias, int N, int IC, int OC,
                                       enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(ctx && out && inp && weight && N > 0 && IC > 0 && OC > 0);
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
    gemm_args g = {};
    g.d = out;
    g.c = residual;
    g.a = weight;
    g.b = inp;
    g.m = OC;
    g.n = N;
    g.k = IC;
    g.trans_a = true;
    g.lda = IC;
    g.ldb = IC;
    g.ldd = OC;
    g.beta = 1.0f;
    g.bias = bias;
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
