/* Attention throughput per shape and kernel family: the descriptor entry points (zt_cuda_attention_fwd /
 * _bwd) at the shapes of GPT-2 1558M, TinyLlama, BERT-Large and T5, each with the production choice and the
 * other families a zt_attention_variant selects (the experimental and fallback kernels live behind that
 * field, not behind switches of the library). Prints one table row per (shape, family):
 *   shape | family | path | forward ms | forward TFLOP/s | backward ms | backward TFLOP/s | bits on a rerun
 * and exits 1 when a backward run again gives other bits than the run before it (every backward is
 * deterministic).
 * FLOPs count the unmasked (query, key) pairs: forward 4 HS per pair (two products), backward 10 HS (five).
 * Run by bench/attention/run.sh, which adds PyTorch's scaled_dot_product_attention beside it. bf16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_common.h"

static cudaStream_t g_stream;
static cudaEvent_t g_ev0, g_ev1;
static int g_iters = 20;
static int g_status; /* 1 once a backward gave other bits on a rerun */

static void *drand(size_t n, float scale, enum zt_dtype dt)
{
    float *h = malloc(sizeof(float) * (n ? n : 1)), *tmp = NULL;
    void *d = NULL;
    uint64_t s = 0x2545f4914f6cdd1dull ^ n;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = scale * (float)((double)(s >> 11) / (double)(1ull << 52) - 1.0);
    }
    ZT_CUDA_CHECK(cudaMalloc((void **)&tmp, sizeof(float) * (n ? n : 1)));
    ZT_CUDA_CHECK(cudaMalloc(&d, zt_dtype_size(dt) * (n ? n : 1)));
    ZT_CUDA_CHECK(cudaMemcpy(tmp, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    zt_cuda_cast(d, dt, tmp, ZT_DTYPE_F32, n, g_stream);
    ZT_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    ZT_CUDA_CHECK(cudaFree(tmp));
    free(h);
    return d;
}

/* n fp32 values on the device, uniform in [-scale, scale). */
static float *dfloats(size_t n, float scale)
{
    float *h = malloc(sizeof(float) * n), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = scale * (float)((double)rand() / RAND_MAX * 2.0 - 1.0);
    ZT_CUDA_CHECK(cudaMalloc((void **)&d, sizeof(float) * n));
    ZT_CUDA_CHECK(cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *dints(const int32_t *h, int n)
{
    if (!h)
        return NULL;
    void *d = NULL;
    ZT_CUDA_CHECK(cudaMalloc(&d, sizeof(int32_t) * n));
    ZT_CUDA_CHECK(cudaMemcpy(d, h, sizeof(int32_t) * n, cudaMemcpyHostToDevice));
    return d;
}

/* One shape: packed qkv (GPT-2, LLaMA, BERT) or q and a separate kv (T5's cross-attention). */
struct shape {
    const char *name;
    int B, Tq, Tk, NH, NKV, HS;
    bool causal, packed, bias;
    float scale;
    const int32_t *lens;   /* host, or NULL */
    int window;            /* 0 here means none (-1 in the descriptor); windows of 0 are not benchmarked */
    const int32_t *cu;     /* host cu_seqlens (the same for queries and keys), or NULL */
    bool bias_causal;      /* T5 decoder buckets (else the encoder's bidirectional ones) */
};

/* The (query, key) pairs the mask keeps, per head, summed over heads: row by row from the descriptor's rule. */
static double pairs_of(const struct shape *s)
{
    double pairs = 0;
    for (int b = 0; b < s->B; b++) {
        long lq = s->Tq, lk = s->Tk;
        if (s->lens)
            lq = lk = s->lens[b];
        if (s->cu)
            lq = lk = s->cu[b + 1] - s->cu[b];
        const long off = s->lens ? 0 : lk - lq;
        for (long i = 0; i < lq; i++) {
            const long pos = i + off;
            long lo = 0, hi = lk;
            if (s->causal && pos + 1 < hi)
                hi = pos + 1;
            if (s->window > 0 && pos - s->window > lo)
                lo = pos - s->window;
            if (hi > lo)
                pairs += (double)(hi - lo);
        }
    }
    return pairs * s->NH;
}

static double time_ms(int which, const zt_attention_desc *d, const zt_attention_grads *g, void *scratch)
{
    zt_err err;
    for (int it = -2; it < g_iters; it++) {
        if (it == 0)
            ZT_CUDA_CHECK(cudaEventRecord(g_ev0, g_stream));
        int rc = which == 0 ? zt_cuda_attention_fwd(d, ZT_DTYPE_BF16, g_stream, &err)
                            : zt_cuda_attention_bwd(d, g, scratch, ZT_DTYPE_BF16, g_stream, &err);
        if (rc) {
            fprintf(stderr, "bench_attention: %s\n", err.msg);
            exit(1);
        }
    }
    ZT_CUDA_CHECK(cudaEventRecord(g_ev1, g_stream));
    ZT_CUDA_CHECK(cudaEventSynchronize(g_ev1));
    float ms = 0;
    ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
    return ms / g_iters;
}

static void bench_shape(const struct shape *s, const char *family, const zt_attention_variant *v)
{
    const enum zt_dtype dt = ZT_DTYPE_BF16;
    const long es = 2, hq = (long)s->NH * s->HS, hk = (long)s->NKV * s->HS;
    const long nq = s->cu ? s->cu[s->B] : (long)s->B * s->Tq, nk = s->cu ? s->cu[s->B] : (long)s->B * s->Tk;
    const long qs = s->packed ? hq + 2 * hk : hq, kvs = 2 * hk;
    void *q = drand((size_t)(nq * qs), 1.0f, dt), *kv = s->packed ? NULL : drand((size_t)(nk * kvs), 1.0f, dt);
    void *dq = drand((size_t)(nq * qs), 0.0f, dt), *dkv = s->packed ? NULL : drand((size_t)(nk * kvs), 0.0f, dt);
    void *out = drand((size_t)(nq * hq), 0.0f, dt), *dout = drand((size_t)(nq * hq), 1.0f, dt);
    float *lse = NULL, *table = NULL, *dtable = NULL;
    ZT_CUDA_CHECK(cudaMalloc((void **)&lse, sizeof(float) * (size_t)s->B * s->Tq * s->NH));
    if (s->bias) {
        table = dfloats((size_t)32 * s->NH, 1.0f);
        ZT_CUDA_CHECK(cudaMalloc((void **)&dtable, sizeof(float) * 32 * s->NH));
    }
    void *lens = dints(s->lens, s->B), *cu = dints(s->cu, s->B + 1);
    zt_attention_desc d = {.q = q, .q_stride = qs, .out = out, .out_stride = hq, .lse = lse, .B = s->B, .Tq = s->Tq,
                           .Tk = s->Tk, .NH = s->NH, .NKV = s->NKV, .HS = s->HS, .scale = s->scale,
                           .causal = s->causal, .window = s->window > 0 ? s->window : -1, .cu_seqlens_q = cu,
                           .cu_seqlens_k = cu, .lens = lens,
                           .bias = s->bias ? ZT_ATTENTION_BIAS_T5 : ZT_ATTENTION_BIAS_NONE, .bias_table = table,
                           .num_buckets = 32, .max_distance = 128, .bias_bidirectional = !s->bias_causal,
                           .variant = v};
    zt_attention_grads g = {.dout = dout, .dq = dq, .dq_stride = qs, .dbias_table = dtable, .accumulate = false};
    if (s->packed) {
        d.k = (char *)q + hq * es;
        d.v = (char *)q + (hq + hk) * es;
        d.k_stride = d.v_stride = qs;
        g.dk = (char *)dq + hq * es;
        g.dv = (char *)dq + (hq + hk) * es;
        g.dk_stride = g.dv_stride = qs;
    } else {
        d.k = kv;
        d.v = (char *)kv + hk * es;
        d.k_stride = d.v_stride = kvs;
        g.dk = dkv;
        g.dv = (char *)dkv + hk * es;
        g.dk_stride = g.dv_stride = kvs;
    }
    void *scratch = NULL;
    ZT_CUDA_CHECK(cudaMalloc(&scratch, zt_cuda_attention_bwd_scratch_size(&d)));
    const double pairs = pairs_of(s);
    const double fms = time_ms(0, &d, &g, scratch), bms = time_ms(1, &d, &g, scratch);
    /* The backward overwrites its gradients: one more run must give the bits of the last timed one. */
    const size_t nbq = (size_t)(nq * qs) * es, nbk = s->packed ? 0 : (size_t)(nk * kvs) * es;
    unsigned char *h0 = malloc(nbq + nbk), *h1 = malloc(nbq + nbk);
    ZT_CUDA_CHECK(cudaMemcpy(h0, dq, nbq, cudaMemcpyDeviceToHost));
    if (nbk)
        ZT_CUDA_CHECK(cudaMemcpy(h0 + nbq, dkv, nbk, cudaMemcpyDeviceToHost));
    zt_err err;
    if (zt_cuda_attention_bwd(&d, &g, scratch, dt, g_stream, &err)) {
        fprintf(stderr, "bench_attention: %s\n", err.msg);
        exit(1);
    }
    ZT_CUDA_CHECK(cudaMemcpy(h1, dq, nbq, cudaMemcpyDeviceToHost));
    if (nbk)
        ZT_CUDA_CHECK(cudaMemcpy(h1 + nbq, dkv, nbk, cudaMemcpyDeviceToHost));
    const bool same = memcmp(h0, h1, nbq + nbk) == 0;
    free(h0);
    free(h1);
    if (!same)
        g_status = 1;
    printf("| %-34s | %-22s | %-7s | %8.3f | %7.1f | %8.3f | %7.1f | %s |\n", s->name, family,
           zt_cuda_attention_path(&d, dt), fms, 4.0 * pairs * s->HS / (fms * 1e-3) / 1e12, bms,
           10.0 * pairs * s->HS / (bms * 1e-3) / 1e12, same ? "same" : "DIFFERENT");
    fflush(stdout);
    void *bufs[] = {q, kv, dq, dkv, out, dout, lse, table, dtable, lens, cu, scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            ZT_CUDA_CHECK(cudaFree(bufs[i]));
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_iters = atoi(argv[1]) > 0 ? atoi(argv[1]) : g_iters;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device\n");
        return 77;
    }
    ZT_CUDA_CHECK(cudaStreamCreate(&g_stream));
    ZT_CUDA_CHECK(cudaEventCreate(&g_ev0));
    ZT_CUDA_CHECK(cudaEventCreate(&g_ev1));
    static int32_t bert_lens[32];
    for (int i = 0; i < 32; i++)
        bert_lens[i] = 128 + (i * 97) % 385; /* a padded batch: lengths spread over 128..512 */
    /* Packed documents: 8 of 128..2048 tokens in 8192 rows (the longest 2048). */
    static const int32_t docs[9] = {0, 2048, 3072, 3584, 5120, 5248, 6016, 7168, 8192};
    const struct shape shapes[] = {
        /* name, B, Tq, Tk, NH, NKV, HS, causal, packed, bias, scale, lens, window, cu, bias_causal */
        {"GPT-2 1558M: 25x64, T 1024, causal, B 8", 8, 1024, 1024, 25, 25, 64, true, true, false, 0, NULL, 0, NULL,
         false},
        {"TinyLlama: 32x64, 4 kv, T 2048, causal, B 4", 4, 2048, 2048, 32, 4, 64, true, true, false, 0, NULL, 0, NULL,
         false},
        {"LLaMA-7B: 32x128, T 2048, causal, B 2", 2, 2048, 2048, 32, 32, 128, true, true, false, 0, NULL, 0, NULL,
         false},
        {"BERT-Large: 16x64, T 512, padded, B 32", 32, 512, 512, 16, 16, 64, false, true, false, 0, bert_lens, 0,
         NULL, false},
        {"T5: 16x64, Tq 128, Tk 512, bias, B 8", 8, 128, 512, 16, 16, 64, false, false, true, 1.0f, NULL, 0, NULL,
         false},
        {"varlen: 32x64, 4 kv, 8 docs in 8192, causal", 8, 2048, 2048, 32, 4, 64, true, true, false, 0, NULL, 0, docs,
         false},
        {"varlen: 32x128, 8 kv, 8 docs in 8192, causal", 8, 2048, 2048, 32, 8, 128, true, true, false, 0, NULL, 0,
         docs, false},
        {"window 256: 32x64, 8 kv, T 4096, causal, B 2", 2, 4096, 4096, 32, 8, 64, true, true, false, 0, NULL, 256,
         NULL, false},
        {"window 1024: 32x128, 8 kv, T 4096, causal, B 2", 2, 4096, 4096, 32, 8, 128, true, true, false, 0, NULL,
         1024, NULL, false},
        {"T5 encoder: 16x64, T 512, bias, B 8", 8, 512, 512, 16, 16, 64, false, false, true, 1.0f, NULL, 0, NULL,
         false},
        {"T5 decoder: 16x64, T 512, causal bias, B 8", 8, 512, 512, 16, 16, 64, true, false, true, 1.0f, NULL, 0,
         NULL, true},
        {"cross: 16x64, Tq 128, Tk 512, B 8", 8, 128, 512, 16, 16, 64, false, false, false, 0, NULL, 0, NULL, false},
    };
    const zt_attention_variant v_default = {0}, v_single_pass = {.single_pass = true}, v_mma16 = {.mma_warp_rows = 16},
                               v_wmma = {.wmma = true},
                               v_generic = {.generic = true}, v_general = {.general = true};
    printf("| shape | family | path | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | bwd bits on a rerun |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        bench_shape(&shapes[i], "ztrain default", &v_default);
        if (!shapes[i].packed || shapes[i].cu || shapes[i].window) {
            /* the descriptor's shapes: the default (mma) beside the general kernels */
            bench_shape(&shapes[i], "ztrain general kernels", &v_general);
            continue;
        }
        bench_shape(&shapes[i], "ztrain single-pass backward", &v_single_pass);
        bench_shape(&shapes[i], "ztrain mma 16 rows/warp", &v_mma16);
        bench_shape(&shapes[i], "ztrain WMMA", &v_wmma);
        bench_shape(&shapes[i], "ztrain generic packed", &v_generic);
        bench_shape(&shapes[i], "ztrain general kernels", &v_general);
    }
    return g_status;
}
