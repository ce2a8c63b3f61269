/* Times every CUDA kernel at GPT-2 124M training shapes (B=16, T=1024, C=768, NH=12, V=50257 padded to
 * 50304) with CUDA events, and prints milliseconds per call with the achieved TFLOP/s (GEMMs, attention)
 * or GB/s (memory-bound kernels, counting the bytes each must read and write once). Built beside the GPU
 * tests but never run by ctest: a benchmark, not a test.
 *
 *   bench_cuda_kernels [bf16|f16|f32] [iterations]     (default bf16, 20)
 *   bench_cuda_kernels attention [iterations]          attention only, WMMA vs mma.sync kernels (16 and 32
 *                                                      rows per warp), bf16 and fp16, at GPT-2 124M
 *                                                      and 1558M shapes
 *   bench_cuda_kernels gqa [iterations]                the general attention entry points at LLaMA and BERT
 *                                                      shapes (bf16): grouped-query, bidirectional with
 *                                                      padding, head size 80, and the tuned shapes run by
 *                                                      the tuned and by the generic kernels
 *   bench_cuda_kernels bandwidth [iterations]          the bandwidth-bound kernels of a bf16 training step
 *   bench_cuda_kernels bert [iterations]               BERT-Large's GELU and LayerNorms against a copy
 *                                                      (layer norm, gradient fold, global norm, AdamW with
 *                                                      fp32 or bf16 gradients) at GPT-2 124M and 1558M
 *                                                      shapes, then at 1558M the input-gradient GEMMs and
 *                                                      the attention backward, zeroed + added vs overwritten
 *
 * Attention TFLOP/s count the causal half of the products: forward 2 (S = Q K^T, O = P V), backward 5
 * (2.5x the forward: dV, dP, dS's S, dK, dQ), whatever a kernel recomputes. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "attention_variant.h"
#include "kernels/crossentropy.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/residual.h"

enum { B = 16, T = 1024, C = 768, NH = 12, V = 50257, VP = 50304, NPARAM = 124475904 };
#define BT ((size_t)B * T)

static cudaStream_t g_stream;
static cudaEvent_t g_ev0, g_ev1;
static int g_iters = 20;

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    ZT_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
}

/* n random values of dtype in [-scale, scale): a host pattern of 2^22 floats tiled over an fp32 buffer. */
static void *drand(size_t n, float scale, enum zt_dtype dt)
{
    static float *pattern;
    const size_t pn = (size_t)1 << 22;
    if (!pattern) {
        zt_rng r;
        zt_rng_seed(&r, 7);
        pattern = malloc(pn * sizeof(float));
        for (size_t i = 0; i < pn; i++)
            pattern[i] = (float)(2.0 * zt_rng_uniform(&r) - 1.0);
    }
    float *tmp = dalloc(n * sizeof(float));
    for (size_t off = 0; off < n; off += pn) {
        size_t len = n - off < pn ? n - off : pn;
        ZT_CUDA_CHECK(cudaMemcpy(tmp + off, pattern, len * sizeof(float), cudaMemcpyHostToDevice));
    }
    zt_cuda_scale_inplace(tmp, scale, n, ZT_DTYPE_F32, g_stream);
    void *d = dalloc(n * zt_dtype_size(dt));
    zt_cuda_cast(d, dt, tmp, ZT_DTYPE_F32, n, g_stream);
    ZT_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    ZT_CUDA_CHECK(cudaFree(tmp));
    return d;
}

static void start(void)
{
    ZT_CUDA_CHECK(cudaEventRecord(g_ev0, g_stream));
}

/* Ends a timing started by start() over g_iters calls and prints it. */
static void stop(const char *what, double flop, double bytes)
{
    float ms = 0.0f;
    ZT_CUDA_CHECK(cudaEventRecord(g_ev1, g_stream));
    ZT_CUDA_CHECK(cudaEventSynchronize(g_ev1));
    ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
    ms /= g_iters;
    printf("%-44s %9.4f ms", what, ms);
    if (flop > 0)
        printf("  %7.1f TFLOP/s", flop / (ms * 1e-3) / 1e12);
    if (bytes > 0)
        printf("  %7.0f GB/s", bytes / (ms * 1e-3) / 1e9);
    printf("\n");
}

#define BENCH(what, flop, bytes, call)                                                                             \
    do {                                                                                                           \
        call;                                                                                                      \
        call; /* warm-up */                                                                                        \
        start();                                                                                                   \
        for (int it_ = 0; it_ < g_iters; it_++)                                                                    \
            call;                                                                                                  \
        stop(what, flop, bytes);                                                                                   \
    } while (0)

/* Attention alone at one shape: the WMMA kernels (mma.sync off) and the mma.sync kernels, forward and
 * backward, one after the other on the same buffers. */
static void bench_attention(enum zt_dtype dt, int b, int t, int c, int nh)
{
    const size_t bt = (size_t)b * t;
    void *qkv = drand(bt * 3 * c, 1.0f, dt), *dqkv = drand(bt * 3 * c, 0.0f, dt);
    void *out = drand(bt * c, 0.0f, dt), *dout = drand(bt * c, 1.0f, dt);
    float *lse = dalloc(sizeof(float) * b * nh * t);
    void *scratch = dalloc(zt_cuda_attention_backward_scratch_size(b, t, nh));
    const double hs = c / nh, pairs = (double)b * nh * t * (t + 1) / 2.0;
    printf("-- attention %s B=%d T=%d C=%d NH=%d (head size %d)\n", zt_dtype_name(dt), b, t, c, nh, (int)hs);
    for (int k = 0; k < 3; k++) {
        char name[96];
        g_att_variant = (zt_attention_variant){.wmma = k == 0, .mma_warp_rows = k == 2 ? 32 : 16};
        const char *which = k == 0 ? "WMMA" : k == 1 ? "mma.sync 16 rows/warp" : "mma.sync 32 rows/warp";
        snprintf(name, sizeof(name), "attention forward  %s", which);
        BENCH(name, 2.0 * 2 * pairs * hs, 0, att_forward(out, lse, qkv, b, t, c, nh, dt, g_stream));
        snprintf(name, sizeof(name), "attention backward %s", which);
        BENCH(name, 5.0 * 2 * pairs * hs, 0,
              att_backward(dqkv, dout, qkv, out, lse, b, t, c, nh, scratch, dt, g_stream));
    }
    g_att_variant = (zt_attention_variant){0};
    void *bufs[] = {qkv, dqkv, out, dout, lse, scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        ZT_CUDA_CHECK(cudaFree(bufs[i]));
}

/* The general attention entry points at one shape (bf16): forward and backward (accumulating), with the
 * generic kernels forced when `generic`. lens: NULL or B host lengths (the pairs counted are the unmasked
 * ones: causal rows below the length see t + 1 keys, bidirectional rows see the length). */
static void bench_attention_gqa(const char *what, int b, int t, int nh, int nkv, int hs, bool causal,
                                const int32_t *lens, bool generic)
{
    const enum zt_dtype dt = ZT_DTYPE_BF16;
    const zt_attention_dims d = {.B = b, .T = t, .NH = nh, .NKV = nkv, .HS = hs, .causal = causal};
    if (!zt_cuda_attention_gqa_supported(&d)) {
        printf("%-44s not supported on this GPU\n", what);
        return;
    }
    const size_t bt = (size_t)b * t, w = (size_t)(nh + 2 * nkv) * hs;
    void *qkv = drand(bt * w, 1.0f, dt), *dqkv = drand(bt * w, 0.0f, dt);
    void *out = drand(bt * nh * hs, 0.0f, dt), *dout = drand(bt * nh * hs, 1.0f, dt);
    float *lse = dalloc(sizeof(float) * b * nh * t);
    void *scratch = dalloc(zt_cuda_attention_backward_gqa_scratch_size(&d));
    int32_t *dlens = NULL;
    double pairs = 0;
    for (int i = 0; i < b; i++) {
        const double len = lens ? (lens[i] < t ? lens[i] : t) : t;
        pairs += nh * (causal ? len * (len + 1) / 2.0 : len * len);
    }
    if (lens) {
        dlens = dalloc(sizeof(int32_t) * b);
        ZT_CUDA_CHECK(cudaMemcpy(dlens, lens, sizeof(int32_t) * b, cudaMemcpyHostToDevice));
    }
    g_att_variant.generic = generic;
    char name[128];
    snprintf(name, sizeof(name), "%s forward", what);
    BENCH(name, 2.0 * 2 * pairs * hs, 0, att_forward_gqa(out, lse, qkv, dlens, &d, dt, g_stream));
    snprintf(name, sizeof(name), "%s backward", what);
    BENCH(name, 5.0 * 2 * pairs * hs, 0,
          att_backward_gqa(dqkv, dout, qkv, out, lse, dlens, &d, true, scratch, dt, g_stream));
    snprintf(name, sizeof(name), "%s backward, overwrite", what);
    BENCH(name, 5.0 * 2 * pairs * hs, 0,
          att_backward_gqa(dqkv, dout, qkv, out, lse, dlens, &d, false, scratch, dt, g_stream));
    g_att_variant.generic = false;
    void *bufs[] = {qkv, dqkv, out, dout, lse, scratch, dlens};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            ZT_CUDA_CHECK(cudaFree(bufs[i]));
}

/* LLaMA and BERT attention shapes, and the tuned shapes by both kernel families for comparison. */
static void bench_gqa(void)
{
    printf("-- general attention, bf16 (TFLOP/s count the unmasked pairs: forward 2 products, backward 5)\n");
    bench_attention_gqa("124M MHA hs64 causal, tuned", 16, 1024, 12, 12, 64, true, NULL, false);
    bench_attention_gqa("124M MHA hs64 causal, generic", 16, 1024, 12, 12, 64, true, NULL, true);
    bench_attention_gqa("LLaMA-7B MHA hs128 causal, tuned", 4, 2048, 32, 32, 128, true, NULL, false);
    bench_attention_gqa("LLaMA-7B MHA hs128 causal, generic", 4, 2048, 32, 32, 128, true, NULL, true);
    bench_attention_gqa("LLaMA-3-8B GQA 32/8 hs128 causal", 4, 2048, 32, 8, 128, true, NULL, false);
    /* BERT-base at sequence length 512, lengths spread over 128..512 as a padded batch has them. */
    int32_t lens[32];
    for (int i = 0; i < 32; i++)
        lens[i] = 128 + (i * 97) % 385;
    bench_attention_gqa("BERT-base hs64 bidirectional, no padding", 32, 512, 12, 12, 64, false, NULL, false);
    bench_attention_gqa("BERT-base hs64 bidirectional, padded", 32, 512, 12, 12, 64, false, lens, false);
    /* BERT-Large's micro-batches are larger: both row counts per warp of the mma.sync kernels. */
    bench_attention_gqa("BERT-Large hs64 bidirectional, 32 rows/warp", 64, 512, 16, 16, 64, false, NULL, false);
    g_att_variant.mma_warp_rows = 16;
    bench_attention_gqa("BERT-Large hs64 bidirectional, 16 rows/warp", 64, 512, 16, 16, 64, false, NULL, false);
    g_att_variant.mma_warp_rows = 0;
    /* As the BERT executor calls it: every sequence's length given (here all 512, no padding). */
    int32_t full[64];
    for (int i = 0; i < 64; i++)
        full[i] = 512;
    bench_attention_gqa("BERT-Large hs64 bidirectional, lengths given", 64, 512, 16, 16, 64, false, full, false);
    bench_attention_gqa("20 heads of 80, causal", 8, 1024, 20, 20, 80, true, NULL, false);
    bench_attention_gqa("16 heads of 256, GQA 16/8, causal", 2, 2048, 16, 8, 256, true, NULL, false);
}


/* Layer norm over rows x c (bf16): the forward, and the backward adding into dx or (overwrite) storing it. */
static void bench_layernorm(int rows, int c, bool overwrite)
{
    const enum zt_dtype dt = ZT_DTYPE_BF16;
    const double es = 2.0, nc = (double)rows * c;
    void *x = drand((size_t)rows * c, 1.0f, dt), *y = drand((size_t)rows * c, 1.0f, dt);
    void *dx = drand((size_t)rows * c, 0.0f, dt), *w = drand(c, 1.0f, dt), *b = drand(c, 0.1f, dt);
    void *dw = drand(c, 0.0f, dt), *db = drand(c, 0.0f, dt);
    float *mean = dalloc(sizeof(float) * rows), *rstd = dalloc(sizeof(float) * rows);
    void *scratch = dalloc(zt_cuda_layernorm_backward_scratch_size(rows, c));
    BENCH("layernorm forward", 0, es * 2.0 * nc,
          zt_cuda_layernorm_forward(y, mean, rstd, x, w, b, rows, c, 1e-5f, dt, g_stream));
    if (overwrite)
        BENCH("layernorm backward, overwrite", 0, es * 3.0 * nc,
              zt_cuda_layernorm_backward_overwrite(dx, dw, db, y, x, w, mean, rstd, rows, c, scratch, dt, g_stream));
    else
        BENCH("layernorm backward (dx += ...)", 0, es * 4.0 * nc,
              zt_cuda_layernorm_backward(dx, dw, db, y, x, w, mean, rstd, rows, c, scratch, dt, g_stream));
    void *bufs[] = {x, y, dx, w, b, dw, db, mean, rstd, scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        ZT_CUDA_CHECK(cudaFree(bufs[i]));
}

/* The memory-bound kernels of a bf16 training step at one model's shapes: layer norm over the B x T rows,
 * and over all parameters the bf16 -> fp32 gradient fold, the fp32 global norm and AdamW with fp32
 * gradients and a bf16 copy of the weights (as worker/models/decoder_cuda.c calls them). The optimizer
 * buffers are zeros: the kernels' speed does not depend on the values. */
static void bench_bandwidth(const char *model, int rows, int c, int layers, int vp)
{
    const enum zt_dtype dt = ZT_DTYPE_BF16;
    printf("-- %s: layer norm over %d x %d (bf16)\n", model, rows, c);
    bench_layernorm(rows, c, false);

    /* GPT-2's parameter tensors: wte (padded), wpe, 12 per layer, ln_f. */
    size_t sizes[2 + 12 * 48 + 2];
    int count = 0;
    sizes[count++] = (size_t)vp * c;
    sizes[count++] = (size_t)1024 * c;
    for (int l = 0; l < layers; l++) {
        const size_t per[12] = {c, c, (size_t)c * 3 * c, 3 * (size_t)c, (size_t)c * c, c,
                                c, c, (size_t)c * 4 * c, 4 * (size_t)c, (size_t)4 * c * c, c};
        for (int k = 0; k < 12; k++)
            sizes[count++] = per[k];
    }
    sizes[count++] = c;
    sizes[count++] = c;
    size_t n = 0;
    for (int i = 0; i < count; i++)
        n += (sizes[i] + 63) / 64 * 64; /* each tensor 256-byte aligned, as in the device pool */
    printf("-- %s: %d parameter tensors, %.1fM parameters\n", model, count, n / 1e6);
    float *p = dalloc(n * 4), *m = dalloc(n * 4), *v = dalloc(n * 4), *g = dalloc(n * 4);
    void *glow = dalloc(n * 2), *wlow = dalloc(n * 2);
    ZT_CUDA_CHECK(cudaMemset(p, 0, n * 4));
    ZT_CUDA_CHECK(cudaMemset(m, 0, n * 4));
    ZT_CUDA_CHECK(cudaMemset(v, 0, n * 4));
    ZT_CUDA_CHECK(cudaMemset(g, 0, n * 4));
    ZT_CUDA_CHECK(cudaMemset(glow, 0, n * 2));
    BENCH("grad fold bf16 -> fp32 (overwrite)", 0, (double)n * (2 + 4),
          zt_cuda_accumulate(g, glow, dt, n, 1.0f, 1, g_stream));
    BENCH("grad fold bf16 -> fp32 (add)", 0, (double)n * (2 + 4 + 4),
          zt_cuda_accumulate(g, glow, dt, n, 1.0f, 0, g_stream));
    float *partials = dalloc(sizeof(float) * ZT_CUDA_NORM_SLOTS), *out = dalloc(sizeof(float));
    BENCH("global norm fp32", 0, (double)n * 4, zt_cuda_sum_squares(out, partials, g, n, ZT_DTYPE_F32, g_stream));
    zt_cuda_adamw_tensor *t = calloc(count, sizeof(*t));
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        zt_cuda_adamw_tensor ti = {p + off, m + off, v + off, g + off, (uint16_t *)wlow + off, sizes[i],
                                   sizes[i] > (size_t)4 * c};
        t[i] = ti;
        off += (sizes[i] + 63) / 64 * 64;
    }
    zt_adamw_params hp = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    BENCH("adamw, fp32 grads, bf16 weights", 0, (double)n * (4 + 3 * 8 + 2),
          zt_cuda_adamw_update(t, count, &hp, ZT_DTYPE_F32, dt, out, NULL, g_stream));
    /* A step of one micro-batch reads the bf16 gradients directly (no fold). */
    BENCH("global norm bf16", 0, (double)n * 2, zt_cuda_sum_squares(out, partials, glow, n, dt, g_stream));
    off = 0;
    for (int i = 0; i < count; i++) {
        t[i].grad = (uint16_t *)glow + off;
        off += (sizes[i] + 63) / 64 * 64;
    }
    BENCH("adamw, bf16 grads, bf16 weights", 0, (double)n * (2 + 3 * 8 + 2),
          zt_cuda_adamw_update(t, count, &hp, dt, dt, out, NULL, g_stream));
    free(t);
    void *bufs2[] = {p, m, v, g, glow, wlow, partials, out};
    for (size_t i = 0; i < sizeof(bufs2) / sizeof(bufs2[0]); i++)
        ZT_CUDA_CHECK(cudaFree(bufs2[i]));
}

/* The input-gradient GEMMs of a layer and the attention backward at one model's shapes, as the model
 * called them before (buffer zeroed, then added into) and calls them now (overwritten). */
static void bench_overwrite(zt_cuda_blas *blas, const char *model, int rows, int c, int nh, int vp)
{
    const enum zt_dtype dt = ZT_DTYPE_BF16;
    const size_t es = 2;
    printf("-- %s: input gradients zeroed + added vs overwritten (bf16, %d rows)\n", model, rows);
    struct {
        const char *name;
        int IC, OC;
    } mm[] = {{"fc (4C -> C)", c, 4 * c}, {"attn proj (C -> C)", c, c}, {"qkv (3C -> C)", c, 3 * c},
              {"head (V -> C)", c, vp}};
    void *dout = drand((size_t)rows * vp, 1.0f, dt), *w = drand((size_t)vp * c, 0.02f, dt);
    void *dinp = drand((size_t)rows * 3 * c, 0.0f, dt);
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
        char name[96];
        const double flop = 2.0 * rows * mm[i].IC * mm[i].OC;
        const size_t bytes = (size_t)rows * mm[i].IC * es;
        snprintf(name, sizeof(name), "dinp %s, memset + add", mm[i].name);
        BENCH(name, flop, 0, {
            ZT_CUDA_CHECK(cudaMemsetAsync(dinp, 0, bytes, g_stream));
            zt_cuda_matmul_backward(blas, dinp, NULL, NULL, dout, NULL, w, NULL, rows, mm[i].IC, mm[i].OC, dt,
                                    g_stream);
        });
        snprintf(name, sizeof(name), "dinp %s, overwrite", mm[i].name);
        BENCH(name, flop, 0,
              zt_cuda_matmul_backward_overwrite(blas, dinp, NULL, NULL, dout, NULL, w, NULL, rows, mm[i].IC,
                                                mm[i].OC, dt, g_stream));
    }
    const int b = rows / 1024, t = 1024;
    void *qkv = drand((size_t)rows * 3 * c, 1.0f, dt), *out = drand((size_t)rows * c, 0.0f, dt);
    float *lse = dalloc(sizeof(float) * b * nh * t);
    void *scratch = dalloc(zt_cuda_attention_backward_scratch_size(b, t, nh));
    const double pairs = (double)b * nh * t * (t + 1) / 2.0, flop = 5.0 * 2 * pairs * (c / nh);
    att_forward(out, lse, qkv, b, t, c, nh, dt, g_stream);
    BENCH("attention backward, memset + add", flop, 0, {
        ZT_CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)rows * 3 * c * es, g_stream));
        att_backward(dinp, dout, qkv, out, lse, b, t, c, nh, scratch, dt, g_stream);
    });
    BENCH("attention backward, overwrite", flop, 0,
          att_backward_overwrite(dinp, dout, qkv, out, lse, b, t, c, nh, scratch, dt, g_stream));
    void *bufs[] = {dout, w, dinp, qkv, out, lse, scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        ZT_CUDA_CHECK(cudaFree(bufs[i]));
}

/* BERT-Large's memory-bound kernels (bf16) over rows of sequence 512: the exact GELU over the intermediate
 * width and the LayerNorms over the hidden width, against a device-to-device copy of the same bytes. */
static void bench_bert(zt_cuda_blas *blas, int rows)
{
    const enum zt_dtype dt = ZT_DTYPE_BF16;
    const int c = 1024, I = 4096;
    const double es = 2.0, ni = (double)rows * I, nc = (double)rows * c;
    printf("-- BERT-Large: %d rows, hidden %d, intermediate %d (bf16)\n", rows, c, I);
    void *a = drand((size_t)ni, 2.0f, dt), *b = drand((size_t)ni, 1.0f, dt), *d = drand((size_t)ni, 0.0f, dt);
    void *dbias = drand(I, 0.0f, dt);
    BENCH("copy (intermediate, device to device)", 0, es * 2.0 * ni,
          ZT_CUDA_CHECK(cudaMemcpyAsync(d, a, (size_t)ni * 2, cudaMemcpyDeviceToDevice, g_stream)));
    BENCH("gelu (erf) forward", 0, es * 2.0 * ni, zt_cuda_gelu_erf_forward(d, a, (size_t)ni, dt, g_stream));
    BENCH("gelu (erf) backward, overwrite", 0, es * 3.0 * ni,
          zt_cuda_gelu_erf_backward_overwrite(d, a, b, (size_t)ni, dt, g_stream));
    BENCH("bias gradient (intermediate width)", 0, es * ni,
          zt_cuda_matmul_backward(blas, NULL, NULL, dbias, a, NULL, NULL, NULL, rows, c, I, dt, g_stream));
    BENCH("bias gradient (hidden width)", 0, es * nc,
          zt_cuda_matmul_backward(blas, NULL, NULL, dbias, a, NULL, NULL, NULL, rows, c, c, dt, g_stream));
    void *bufs[] = {a, b, d, dbias};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        ZT_CUDA_CHECK(cudaFree(bufs[i]));
    bench_layernorm(rows, c, true);
}

int main(int argc, char **argv)
{
    enum zt_dtype dt = ZT_DTYPE_BF16;
    const int attention_only = argc > 1 && strcmp(argv[1], "attention") == 0;
    const int bandwidth_only = argc > 1 && strcmp(argv[1], "bandwidth") == 0;
    const int gqa_only = argc > 1 && strcmp(argv[1], "gqa") == 0;
    if (argc > 1 && strcmp(argv[1], "f16") == 0)
        dt = ZT_DTYPE_F16;
    else if (argc > 1 && strcmp(argv[1], "f32") == 0)
        dt = ZT_DTYPE_F32;
    if (argc > 2)
        g_iters = atoi(argv[2]) > 0 ? atoi(argv[2]) : 20;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    ZT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs); dtype %s; B=%d T=%d C=%d NH=%d V=%d (padded %d); mean of %d calls\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, zt_dtype_name(dt), B, T, C, NH, V, VP,
           g_iters);
    ZT_CUDA_CHECK(cudaStreamCreate(&g_stream));
    ZT_CUDA_CHECK(cudaEventCreate(&g_ev0));
    ZT_CUDA_CHECK(cudaEventCreate(&g_ev1));
    zt_cuda_blas *blas = NULL;
    zt_err err;
    if (zt_cuda_blas_create(&blas, 0, &err) != 0) {
        printf("%s\n", err.msg);
        return 1;
    }
    if (bandwidth_only) {
        bench_bandwidth("GPT-2 124M", 16 * 1024, 768, 12, 50304);
        bench_bandwidth("GPT-2 1558M", 8 * 1024, 1600, 48, 50304);
        bench_overwrite(blas, "GPT-2 1558M", 8 * 1024, 1600, 25, 50304);
        zt_cuda_blas_destroy(blas);
        printf("done\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "bert") == 0) {
        bench_bert(blas, 64 * 512);
        zt_cuda_blas_destroy(blas);
        printf("done\n");
        return 0;
    }
    if (gqa_only) {
        bench_gqa();
        zt_cuda_blas_destroy(blas);
        printf("done\n");
        return 0;
    }
    if (attention_only) {
        const enum zt_dtype dts[2] = {ZT_DTYPE_BF16, ZT_DTYPE_F16};
        for (int i = 0; i < 2; i++) {
            bench_attention(dts[i], 16, 1024, 768, 12); /* GPT-2 124M */
            bench_attention(dts[i], 8, 1024, 1600, 25); /* GPT-2 1558M */
        }
        zt_cuda_blas_destroy(blas);
        printf("done\n");
        return 0;
    }
    const double es = (double)zt_dtype_size(dt);

    /* Embedding. */
    int32_t *tok_h = malloc(sizeof(int32_t) * BT), *tok = dalloc(sizeof(int32_t) * BT);
    zt_rng r;
    zt_rng_seed(&r, 3);
    for (size_t i = 0; i < BT; i++)
        tok_h[i] = (int32_t)zt_rng_below(&r, V);
    ZT_CUDA_CHECK(cudaMemcpy(tok, tok_h, sizeof(int32_t) * BT, cudaMemcpyHostToDevice));
    void *wte = drand((size_t)VP * C, 0.02f, dt), *wpe = drand((size_t)T * C, 0.02f, dt);
    void *x = drand(BT * C, 1.0f, dt), *y = drand(BT * C, 1.0f, dt), *z = drand(BT * C, 1.0f, dt);
    BENCH("embedding forward", 0, es * (3.0 * BT * C), zt_cuda_embedding_forward(x, tok, wte, wpe, B, T, C, dt, g_stream));
    void *dwte = drand((size_t)VP * C, 0.0f, dt), *dwpe = drand((size_t)T * C, 0.0f, dt);
    void *escratch = dalloc(zt_cuda_embedding_backward_scratch_size(B, T, V));
    BENCH("embedding backward (sort + sum)", 0, 0,
          zt_cuda_embedding_backward(dwte, dwpe, y, tok, B, T, C, V, escratch, dt, g_stream));

    /* Layernorm. */
    void *w = drand(C, 1.0f, dt), *bsv = drand(C, 0.1f, dt);
    float *mean = dalloc(BT * sizeof(float)), *rstd = dalloc(BT * sizeof(float));
    BENCH("layernorm forward", 0, es * 2.0 * BT * C,
          zt_cuda_layernorm_forward(y, mean, rstd, x, w, bsv, (int)BT, C, 1e-5f, dt, g_stream));
    void *dw = drand(C, 0.0f, dt), *db = drand(C, 0.0f, dt);
    void *lscratch = dalloc(zt_cuda_layernorm_backward_scratch_size((int)BT, C));
    BENCH("layernorm backward", 0, es * 4.0 * BT * C,
          zt_cuda_layernorm_backward(z, dw, db, y, x, w, mean, rstd, (int)BT, C, lscratch, dt, g_stream));

    /* The block's GEMMs. */
    struct {
        const char *name;
        int IC, OC, bias, gelu;
    } mm[] = {
        {"qkv      768->2304 +bias", C, 3 * C, 1, 0},
        {"attproj  768->768  +bias", C, C, 1, 0},
        {"fc       768->3072 +bias +gelu", C, 4 * C, 1, 1},
        {"fcproj  3072->768  +bias", 4 * C, C, 1, 0},
        {"lm head  768->50304", C, VP, 0, 0},
    };
    size_t max_in = BT * 4 * C, max_out = BT * VP;
    void *min_ = drand(max_in, 1.0f, dt), *mout = drand(max_out, 1.0f, dt), *mpre = drand(BT * 4 * C, 1.0f, dt);
    void *mw = drand((size_t)VP * C, 0.02f, dt), *mb = drand(VP, 0.02f, dt);
    void *mdw = drand((size_t)VP * C, 0.0f, dt), *mdb = drand(VP, 0.0f, dt), *mdin = drand(max_in, 0.0f, dt);
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
        char name[96];
        double flop = 2.0 * BT * mm[i].IC * mm[i].OC;
        snprintf(name, sizeof(name), "matmul fwd %s", mm[i].name);
        BENCH(name, flop, 0,
              zt_cuda_matmul_forward(blas, mout, mm[i].gelu ? mpre : NULL, min_, mw, mm[i].bias ? mb : NULL, (int)BT,
                                     mm[i].IC, mm[i].OC, dt, g_stream));
        snprintf(name, sizeof(name), "matmul bwd %s", mm[i].name);
        BENCH(name, 2 * flop, 0,
              zt_cuda_matmul_backward(blas, mdin, mdw, mm[i].bias ? mdb : NULL, mout, min_, mw, NULL, (int)BT,
                                      mm[i].IC, mm[i].OC, dt, g_stream));
    }
    BENCH("matmul bwd fcproj with fused dGELU", 2.0 * 2 * BT * 4 * C * C, 0,
          zt_cuda_matmul_backward(blas, mdin, mdw, mdb, mout, min_, mw, mpre, (int)BT, 4 * C, C, dt, g_stream));

    /* Elementwise. */
    size_t n4 = BT * 4 * C;
    BENCH("gelu forward (4C)", 0, es * 2.0 * n4, zt_cuda_gelu_forward(mdin, mpre, n4, dt, g_stream));
    BENCH("gelu backward (4C)", 0, es * 4.0 * n4, zt_cuda_gelu_backward(mdin, mpre, min_, n4, dt, g_stream));
    BENCH("residual forward", 0, es * 3.0 * BT * C, zt_cuda_residual_forward(z, x, y, BT * C, dt, g_stream));
    BENCH("add_inplace", 0, es * 3.0 * BT * C, zt_cuda_add_inplace(z, x, BT * C, dt, g_stream));

    /* Attention. */
    {
        void *qkv = drand(BT * 3 * C, 1.0f, dt), *dqkv = drand(BT * 3 * C, 0.0f, dt);
        float *lse = dalloc(sizeof(float) * B * NH * T);
        void *ascratch = dalloc(zt_cuda_attention_backward_scratch_size(B, T, NH));
        /* Causal: half of the T x T scores; forward 2 GEMM-like products, backward 5 (see the top). */
        double hs = C / NH, pairs = (double)B * NH * T * (T + 1) / 2.0;
        BENCH("attention forward", 2.0 * 2 * pairs * hs, 0,
              att_forward(x, lse, qkv, B, T, C, NH, dt, g_stream));
        BENCH("attention backward", 5.0 * 2 * pairs * hs, 0,
              att_backward(dqkv, y, qkv, x, lse, B, T, C, NH, ascratch, dt, g_stream));
        g_att_variant.cuda_cores = true;
        BENCH("attention forward, CUDA cores only", 2.0 * 2 * pairs * hs, 0,
              att_forward(x, lse, qkv, B, T, C, NH, dt, g_stream));
        BENCH("attention backward, CUDA cores only", 5.0 * 2 * pairs * hs, 0,
              att_backward(dqkv, y, qkv, x, lse, B, T, C, NH, ascratch, dt, g_stream));
        g_att_variant.cuda_cores = false;
    }

    /* Fused classifier over the padded logits, in place. */
    {
        void *logits = drand(BT * VP, 4.0f, dt);
        int32_t *tg = dalloc(sizeof(int32_t) * BT);
        ZT_CUDA_CHECK(cudaMemcpy(tg, tok_h, sizeof(int32_t) * BT, cudaMemcpyHostToDevice));
        float *losses = dalloc(sizeof(float) * BT);
        BENCH("crossentropy fwd+bwd in place", 0, es * 2.0 * BT * VP,
              zt_cuda_crossentropy_forward_backward(losses, logits, logits, tg, (int)BT, V, VP, -100, 1.0f / BT,
                                                    NULL, dt, g_stream));
    }

    /* Optimizer and gradient health over all 124M parameters, as one tensor. */
    {
        float *p = drand(NPARAM, 0.02f, ZT_DTYPE_F32), *m = drand(NPARAM, 0.0f, ZT_DTYPE_F32);
        float *v = drand(NPARAM, 0.0f, ZT_DTYPE_F32);
        void *g = drand(NPARAM, 0.01f, dt), *lowp = dalloc((size_t)NPARAM * es);
        zt_cuda_adamw_tensor t = {p, m, v, g, lowp, NPARAM, 1};
        zt_adamw_params hp = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
        BENCH("adamw 124M params", 0, (double)NPARAM * (12 + 12 + 2 * es),
              zt_cuda_adamw_update(&t, 1, &hp, dt, dt, NULL, NULL, g_stream));
        float *partials = dalloc(sizeof(float) * ZT_CUDA_NORM_SLOTS), *out = dalloc(sizeof(float));
        BENCH("global norm 124M", 0, (double)NPARAM * es,
              zt_cuda_sum_squares(out, partials, g, NPARAM, dt, g_stream));
        int *flag = dalloc(sizeof(int));
        BENCH("inf/NaN check 124M", 0, (double)NPARAM * es, zt_cuda_check_finite(flag, g, NPARAM, dt, g_stream));
        BENCH("cast fp32 -> lowp 124M", 0, (double)NPARAM * (4 + es),
              zt_cuda_cast(lowp, dt, p, ZT_DTYPE_F32, NPARAM, g_stream));
    }
    ZT_CUDA_CHECK(cudaDeviceSynchronize());
    zt_cuda_blas_destroy(blas);
    printf("done\n");
    return 0;
}
