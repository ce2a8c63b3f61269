/* Tests of the CUDA kernels (library zt_kernels_cuda) against their CPU twins (zt_kernels_cpu).
 *
 * Every op runs for F32, F16 and BF16 on random inputs. Inputs are made in fp32, cast to the dtype on the
 * device, and the rounded values are read back and given to the CPU kernel, so the comparison measures
 * only the GPU's arithmetic and output rounding. Tolerances are relative to each element plus the RMS of
 * the reference (so that elements near zero after cancellation are judged on the tensor's scale):
 * fp32 1e-4, fp16 5e-3, bf16 1e-2. Shapes include odd T (not a multiple of any tile), C = 768 = 3 * 256,
 * an odd vocabulary (1003), padded logits rows, ignored targets and tensors that cross the fused AdamW's
 * chunk and batch limits; for the LLaMA and BERT families, rows whose length is not a multiple of 16 bytes
 * (RMSNorm, SwiGLU), grouped-query heads (ratios 3 and 4), head sizes 32 to 256, bidirectional attention
 * with padding (empty and full sequences, lengths past T and below 0), and NH = 5 heads of 40 refused. The
 * deterministic kernels are run twice and compared bit for bit.
 *
 * Exits 77 (skipped) when there is no CUDA device. Each check prints its largest error, so a log of
 * this test doubles as a record of the kernels' accuracy. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/rng.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "attention_variant.h"
#include "kernels/cpu_threads.h"
#include "kernels/crossentropy.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/pooler.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

_Static_assert(sizeof(zt_real) == sizeof(float), "this test must link zt_kernels_cpu (float build)");

static cudaStream_t g_stream;
#include "dev_buffers.h" /* dev_alloc, dev_upload, dev_download on g_stream */
static zt_cuda_blas *g_blas;
static int g_cc_major;
static zt_rng g_rng;

static const enum zt_dtype k_dtypes[3] = {ZT_DTYPE_F32, ZT_DTYPE_F16, ZT_DTYPE_BF16};

static double tol_of(enum zt_dtype dt)
{
    return dt == ZT_DTYPE_F32 ? 1e-4 : dt == ZT_DTYPE_F16 ? 5e-3 : 1e-2;
}

/* ---- host / device helpers ---- */

static float *host_rand(size_t n, float scale)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(scale * (2.0 * zt_rng_uniform(&g_rng) - 1.0));
    return h;
}

static float *host_copy(const float *x, size_t n)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(h);
    memcpy(h, x, sizeof(float) * n);
    return h;
}

/* Random values of dtype on the device; *host receives the same (rounded) values as floats. */
static void *dev_rand(size_t n, float scale, enum zt_dtype dt, float **host)
{
    float *h = host_rand(n, scale);
    void *d = dev_upload(h, n, dt);
    *host = h;
    return d;
}

static void *dev_clone(const void *d, size_t bytes)
{
    void *c = dev_alloc(bytes);
    ZT_CUDA_CHECK(cudaMemcpyAsync(c, d, bytes, cudaMemcpyDeviceToDevice, g_stream));
    return c;
}

static void dev_copy(void *dst, const void *src, size_t bytes)
{
    ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
}

/* True if two device buffers hold the same bytes. */
static int dev_equal(const void *a, const void *b, size_t bytes)
{
    unsigned char *ha = malloc(bytes ? bytes : 1), *hb = malloc(bytes ? bytes : 1);
    assert_true(ha && hb);
    dev_sync();
    ZT_CUDA_CHECK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    ZT_CUDA_CHECK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    int eq = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return eq;
}

static void dev_free(void *p) { ZT_CUDA_CHECK(cudaFree(p)); }

/* Compares got with ref: |got - ref| <= tol * (|ref| + rms(ref)) for every element. Prints the worst. */
static void check_close(const char *what, enum zt_dtype dt, const float *got, const float *ref, size_t n, double tol)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)ref[i] * ref[i];
    double rms = n ? sqrt(ss / n) : 0.0;
    if (rms == 0.0)
        rms = 1e-30;
    double worst = 0.0, worst_abs = 0.0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        double lim = tol * (fabs((double)ref[i]) + rms);
        if (!(err <= lim))
            bad++;
        double ratio = isnan(err) ? INFINITY : err / (fabs((double)ref[i]) + rms);
        if (ratio > worst || (isnan(err) && worst != INFINITY)) {
            worst = ratio;
            worst_i = i;
        }
        if (err > worst_abs)
            worst_abs = err;
    }
    printf("  %-40s %-4s n=%-9zu max_err/(|ref|+rms)=%.2e (tol %.0e) max_abs_err=%.2e rms=%.2e\n", what,
           zt_dtype_name(dt), n, worst, tol, worst_abs, rms);
    if (bad) {
        printf("  FAIL %s: %zu of %zu elements out of tolerance; worst at %zu: got %.8g, want %.8g\n", what, bad,
               n, worst_i, (double)got[worst_i], (double)ref[worst_i]);
        fail();
    }
}

/* ---- embedding ---- */

static void run_embedding(enum zt_dtype dt, int B, int T, int C, int V, int maxT)
{
    const int BT = B * T;
    int32_t *tok = malloc(sizeof(int32_t) * BT);
    assert_non_null(tok);
    for (int i = 0; i < BT; i++)
        tok[i] = (int32_t)zt_rng_below(&g_rng, 50); /* many repeats: the hard case for the backward */
    tok[BT / 2] = V - 1;
    tok[BT - 1] = V - 1;
    int32_t *d_tok = dev_alloc(sizeof(int32_t) * BT);
    ZT_CUDA_CHECK(cudaMemcpy(d_tok, tok, sizeof(int32_t) * BT, cudaMemcpyHostToDevice));

    float *wte, *wpe, *dout, *dwte, *dwpe;
    void *d_wte = dev_rand((size_t)V * C, 1.0f, dt, &wte);
    void *d_wpe = dev_rand((size_t)maxT * C, 1.0f, dt, &wpe);
    void *d_out = dev_alloc((size_t)BT * C * zt_dtype_size(dt));
    zt_cuda_embedding_forward(d_out, d_tok, d_wte, d_wpe, B, T, C, dt, g_stream);
    float *out = dev_download(d_out, (size_t)BT * C, dt);
    float *ref = malloc(sizeof(float) * BT * C);
    zt_cpu_embedding_forward(ref, tok, wte, wpe, B, T, C);
    check_close("embedding forward out", dt, out, ref, (size_t)BT * C, tol_of(dt));

    void *d_dout = dev_rand((size_t)BT * C, 1.0f, dt, &dout);
    void *d_dwte = dev_rand((size_t)V * C, 0.5f, dt, &dwte);
    void *d_dwpe = dev_rand((size_t)maxT * C, 0.5f, dt, &dwpe);
    void *d_dwte0 = dev_clone(d_dwte, (size_t)V * C * zt_dtype_size(dt));
    void *d_dwpe0 = dev_clone(d_dwpe, (size_t)maxT * C * zt_dtype_size(dt));
    size_t scratch_bytes = zt_cuda_embedding_backward_scratch_size(B, T, V);
    void *scratch = dev_alloc(scratch_bytes);
    zt_cuda_embedding_backward(d_dwte, d_dwpe, d_dout, d_tok, B, T, C, V, scratch, dt, g_stream);
    float *g_dwte = dev_download(d_dwte, (size_t)V * C, dt);
    float *g_dwpe = dev_download(d_dwpe, (size_t)maxT * C, dt);
    zt_cpu_embedding_backward(dwte, dwpe, dout, tok, B, T, C);
    check_close("embedding backward dwte", dt, g_dwte, dwte, (size_t)V * C, tol_of(dt));
    check_close("embedding backward dwpe", dt, g_dwpe, dwpe, (size_t)maxT * C, tol_of(dt));

    /* Determinism: the same call from the same state gives the same bits. */
    void *d_dwte1 = dev_clone(d_dwte, (size_t)V * C * zt_dtype_size(dt));
    void *d_dwpe1 = dev_clone(d_dwpe, (size_t)maxT * C * zt_dtype_size(dt));
    dev_copy(d_dwte, d_dwte0, (size_t)V * C * zt_dtype_size(dt));
    dev_copy(d_dwpe, d_dwpe0, (size_t)maxT * C * zt_dtype_size(dt));
    zt_cuda_embedding_backward(d_dwte, d_dwpe, d_dout, d_tok, B, T, C, V, scratch, dt, g_stream);
    assert_true(dev_equal(d_dwte, d_dwte1, (size_t)V * C * zt_dtype_size(dt)));
    assert_true(dev_equal(d_dwpe, d_dwpe1, (size_t)maxT * C * zt_dtype_size(dt)));

    /* Without learned positions (LLaMA): the rows of wte exactly, and dwte alone in the backward. */
    zt_cuda_embedding_forward(d_out, d_tok, d_wte, NULL, B, T, C, dt, g_stream);
    float *out_np = dev_download(d_out, (size_t)BT * C, dt);
    zt_cpu_embedding_forward(ref, tok, wte, NULL, B, T, C);
    check_close("embedding forward out (no positions)", dt, out_np, ref, (size_t)BT * C, 0.0f);
    dev_copy(d_dwte, d_dwte0, (size_t)V * C * zt_dtype_size(dt));
    float *dwte_np = dev_download(d_dwte0, (size_t)V * C, dt);
    zt_cuda_embedding_backward(d_dwte, NULL, d_dout, d_tok, B, T, C, V, scratch, dt, g_stream);
    float *g_dwte_np = dev_download(d_dwte, (size_t)V * C, dt);
    zt_cpu_embedding_backward(dwte_np, NULL, dout, tok, B, T, C);
    check_close("embedding backward dwte (no positions)", dt, g_dwte_np, dwte_np, (size_t)V * C, tol_of(dt));
    free(out_np), free(dwte_np), free(g_dwte_np);

    free(tok), free(wte), free(wpe), free(dout), free(dwte), free(dwpe), free(out), free(ref), free(g_dwte);
    free(g_dwpe);
    void *dev[] = {d_tok, d_wte, d_wpe, d_out, d_dout, d_dwte, d_dwpe, d_dwte0, d_dwpe0, scratch, d_dwte1, d_dwpe1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
}

/* BERT's embedding with NTT token types; type NTT - 1 never occurs when NTT > 2 (its gradient row stays). */
static void run_embedding_typed(enum zt_dtype dt, int B, int T, int C, int V, int NTT)
{
    const int BT = B * T;
    const size_t es = zt_dtype_size(dt);
    char name[96];
    int32_t *tok = malloc(sizeof(int32_t) * BT), *typ = malloc(sizeof(int32_t) * BT);
    assert_true(tok && typ);
    for (int i = 0; i < BT; i++) {
        tok[i] = (int32_t)zt_rng_below(&g_rng, V);
        typ[i] = (int32_t)zt_rng_below(&g_rng, NTT > 2 ? NTT - 1 : NTT);
    }
    int32_t *d_tok = dev_alloc(sizeof(int32_t) * BT), *d_typ = dev_alloc(sizeof(int32_t) * BT);
    ZT_CUDA_CHECK(cudaMemcpy(d_tok, tok, sizeof(int32_t) * BT, cudaMemcpyHostToDevice));
    ZT_CUDA_CHECK(cudaMemcpy(d_typ, typ, sizeof(int32_t) * BT, cudaMemcpyHostToDevice));

    float *wte, *wpe, *wtt, *dout, *dwte, *dwpe, *dwtt;
    void *d_wte = dev_rand((size_t)V * C, 1.0f, dt, &wte);
    void *d_wpe = dev_rand((size_t)T * C, 1.0f, dt, &wpe);
    void *d_wtt = dev_rand((size_t)NTT * C, 1.0f, dt, &wtt);
    void *d_out = dev_alloc((size_t)BT * C * es);
    zt_cuda_embedding_forward_typed(d_out, d_tok, d_typ, d_wte, d_wpe, d_wtt, B, T, C, dt, g_stream);
    float *out = dev_download(d_out, (size_t)BT * C, dt), *ref = malloc(sizeof(float) * BT * C);
    zt_cpu_embedding_forward_typed(ref, tok, typ, wte, wpe, wtt, B, T, C);
    snprintf(name, sizeof(name), "embedding B%d T%d C%d NTT%d forward with types", B, T, C, NTT);
    check_close(name, dt, out, ref, (size_t)BT * C, tol_of(dt));

    void *d_dout = dev_rand((size_t)BT * C, 1.0f, dt, &dout);
    void *d_dwte = dev_rand((size_t)V * C, 0.5f, dt, &dwte);
    void *d_dwpe = dev_rand((size_t)T * C, 0.5f, dt, &dwpe);
    void *d_dwtt = dev_rand((size_t)NTT * C, 0.5f, dt, &dwtt);
    void *d_dwtt0 = dev_clone(d_dwtt, (size_t)NTT * C * es);
    void *scratch = dev_alloc(zt_cuda_embedding_backward_typed_scratch_size(B, T, C, V, NTT));
    zt_cuda_embedding_backward_typed(d_dwte, d_dwpe, d_dwtt, d_dout, d_tok, d_typ, B, T, C, V, NTT, scratch, dt,
                                     g_stream);
    float *g_dwte = dev_download(d_dwte, (size_t)V * C, dt), *g_dwpe = dev_download(d_dwpe, (size_t)T * C, dt);
    float *g_dwtt = dev_download(d_dwtt, (size_t)NTT * C, dt);
    float *dwtt0 = host_copy(dwtt, (size_t)NTT * C);
    zt_cpu_embedding_backward_typed(dwte, dwpe, dwtt, dout, tok, typ, B, T, C);
    snprintf(name, sizeof(name), "embedding B%d T%d C%d NTT%d dwte (typed)", B, T, C, NTT);
    check_close(name, dt, g_dwte, dwte, (size_t)V * C, tol_of(dt));
    snprintf(name, sizeof(name), "embedding B%d T%d C%d NTT%d dwpe (typed)", B, T, C, NTT);
    check_close(name, dt, g_dwpe, dwpe, (size_t)T * C, tol_of(dt));
    snprintf(name, sizeof(name), "embedding B%d T%d C%d NTT%d dwtt", B, T, C, NTT);
    check_close(name, dt, g_dwtt, dwtt, (size_t)NTT * C, tol_of(dt));
    if (NTT > 2) /* the unused type's row: added nothing, so the same bits */
        assert_memory_equal(g_dwtt + (size_t)(NTT - 1) * C, dwtt0 + (size_t)(NTT - 1) * C, sizeof(float) * C);

    /* Determinism of dwtt: the same call from the same state, the same bits. */
    void *d_dwtt1 = dev_clone(d_dwtt, (size_t)NTT * C * es);
    dev_copy(d_dwtt, d_dwtt0, (size_t)NTT * C * es);
    zt_cuda_embedding_backward_typed(d_dwte, d_dwpe, d_dwtt, d_dout, d_tok, d_typ, B, T, C, V, NTT, scratch, dt,
                                     g_stream);
    assert_true(dev_equal(d_dwtt, d_dwtt1, (size_t)NTT * C * es));

    free(tok), free(typ), free(wte), free(wpe), free(wtt), free(dout), free(dwte), free(dwpe), free(dwtt);
    free(out), free(ref), free(g_dwte), free(g_dwpe), free(g_dwtt), free(dwtt0);
    void *dev[] = {d_tok, d_typ, d_wte, d_wpe, d_wtt, d_out, d_dout, d_dwte, d_dwpe, d_dwtt, d_dwtt0, scratch, d_dwtt1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
}

static void test_embedding(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        run_embedding(k_dtypes[i], 2, 67, 768, 1003, 80);
        run_embedding(k_dtypes[i], 3, 5, 64, 50257, 8);
        run_embedding_typed(k_dtypes[i], 4, 129, 768, 1003, 2); /* BERT-base width, two types */
        run_embedding_typed(k_dtypes[i], 3, 5, 64, 30522, 16);  /* the most types; fewer positions than a slice */
        run_embedding_typed(k_dtypes[i], 64, 200, 128, 97, 3);   /* many slices; one type unused */
    }
}

/* ---- layernorm ---- */

static void run_layernorm(enum zt_dtype dt, int N, int C)
{
    float *inp, *w, *b, *dout, *dinp, *dw, *db;
    void *d_inp = dev_rand((size_t)N * C, 2.0f, dt, &inp);
    void *d_w = dev_rand(C, 1.0f, dt, &w);
    void *d_b = dev_rand(C, 1.0f, dt, &b);
    void *d_out = dev_alloc((size_t)N * C * zt_dtype_size(dt));
    float *d_mean = dev_alloc(N * sizeof(float)), *d_rstd = dev_alloc(N * sizeof(float));
    zt_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, 1e-5f, dt, g_stream);
    float *out = dev_download(d_out, (size_t)N * C, dt);
    float *mean = dev_download(d_mean, N, ZT_DTYPE_F32), *rstd = dev_download(d_rstd, N, ZT_DTYPE_F32);
    float *ref = malloc(sizeof(float) * N * C), *rmean = malloc(sizeof(float) * N), *rrstd = malloc(sizeof(float) * N);
    zt_cpu_layernorm_forward(ref, rmean, rrstd, inp, w, b, N, C, 1e-5f);
    check_close("layernorm forward out", dt, out, ref, (size_t)N * C, tol_of(dt));
    check_close("layernorm forward mean", dt, mean, rmean, N, 1e-5);
    check_close("layernorm forward rstd", dt, rstd, rrstd, N, 1e-5);

    void *d_dout = dev_rand((size_t)N * C, 1.0f, dt, &dout);
    void *d_dinp = dev_rand((size_t)N * C, 0.5f, dt, &dinp);
    void *d_dw = dev_rand(C, 0.5f, dt, &dw);
    void *d_db = dev_rand(C, 0.5f, dt, &db);
    void *d_dinp0 = dev_clone(d_dinp, (size_t)N * C * zt_dtype_size(dt));
    void *d_dw0 = dev_clone(d_dw, C * zt_dtype_size(dt)), *d_db0 = dev_clone(d_db, C * zt_dtype_size(dt));
    void *scratch = dev_alloc(zt_cuda_layernorm_backward_scratch_size(N, C));
    zt_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, scratch, dt, g_stream);
    float *g_dinp = dev_download(d_dinp, (size_t)N * C, dt);
    float *g_dw = dev_download(d_dw, C, dt), *g_db = dev_download(d_db, C, dt);
    zt_cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); /* the GPU's statistics */
    check_close("layernorm backward dinp", dt, g_dinp, dinp, (size_t)N * C, tol_of(dt));
    check_close("layernorm backward dweight", dt, g_dw, dw, C, tol_of(dt));
    check_close("layernorm backward dbias", dt, g_db, db, C, tol_of(dt));

    void *d_dinp1 = dev_clone(d_dinp, (size_t)N * C * zt_dtype_size(dt));
    void *d_dw1 = dev_clone(d_dw, C * zt_dtype_size(dt)), *d_db1 = dev_clone(d_db, C * zt_dtype_size(dt));
    dev_copy(d_dinp, d_dinp0, (size_t)N * C * zt_dtype_size(dt));
    dev_copy(d_dw, d_dw0, C * zt_dtype_size(dt));
    dev_copy(d_db, d_db0, C * zt_dtype_size(dt));
    zt_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, scratch, dt, g_stream);
    assert_true(dev_equal(d_dinp, d_dinp1, (size_t)N * C * zt_dtype_size(dt)));
    assert_true(dev_equal(d_dw, d_dw1, C * zt_dtype_size(dt)));
    assert_true(dev_equal(d_db, d_db1, C * zt_dtype_size(dt)));

    /* Overwrite: from NaN (all bits set), the dinp of zeroing first and adding; the same weight sums. */
    const size_t nb = (size_t)N * C * zt_dtype_size(dt);
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dinp, 0, nb, g_stream));
    dev_copy(d_dw, d_dw0, C * zt_dtype_size(dt));
    dev_copy(d_db, d_db0, C * zt_dtype_size(dt));
    zt_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, scratch, dt, g_stream);
    void *want = dev_clone(d_dinp, nb);
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dinp, 0xff, nb, g_stream));
    dev_copy(d_dw, d_dw0, C * zt_dtype_size(dt));
    dev_copy(d_db, d_db0, C * zt_dtype_size(dt));
    zt_cuda_layernorm_backward_overwrite(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, scratch, dt,
                                         g_stream);
    assert_true(dev_equal(d_dinp, want, nb));
    assert_true(dev_equal(d_dw, d_dw1, C * zt_dtype_size(dt)));
    assert_true(dev_equal(d_db, d_db1, C * zt_dtype_size(dt)));
    dev_free(want);

    free(inp), free(w), free(b), free(dout), free(dinp), free(dw), free(db), free(out), free(mean), free(rstd);
    free(ref), free(rmean), free(rrstd), free(g_dinp), free(g_dw), free(g_db);
    void *dev[] = {d_inp, d_w,     d_b,   d_out, d_mean, d_rstd,  d_dout,  d_dinp, d_dw,
                   d_db,  d_dinp0, d_dw0, d_db0, scratch, d_dinp1, d_dw1, d_db1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
}

static void test_layernorm(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        run_layernorm(k_dtypes[i], 134, 768);
        run_layernorm(k_dtypes[i], 5, 64);
        run_layernorm(k_dtypes[i], 1000, 1600);
        /* More rows than the backward's warps (several rows per warp), the widest rows the register
         * kernel takes in 16-bit types (8 vectors a lane) and the first it leaves to the shared-memory one. */
        run_layernorm(k_dtypes[i], 3001, 1600);
        run_layernorm(k_dtypes[i], 300, 2048);
        run_layernorm(k_dtypes[i], 300, 2056);
    }
}

/* ---- rmsnorm ---- */

static void run_rmsnorm(enum zt_dtype dt, int N, int C)
{
    const size_t es = zt_dtype_size(dt);
    char name[96];
    float *inp, *w, *dout, *dinp, *dw;
    void *d_inp = dev_rand((size_t)N * C, 2.0f, dt, &inp);
    void *d_w = dev_rand(C, 1.0f, dt, &w);
    void *d_out = dev_alloc((size_t)N * C * es);
    float *d_rstd = dev_alloc(N * sizeof(float));
    zt_cuda_rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, 1e-6f, dt, g_stream);
    float *out = dev_download(d_out, (size_t)N * C, dt), *rstd = dev_download(d_rstd, N, ZT_DTYPE_F32);
    float *ref = malloc(sizeof(float) * N * C), *rrstd = malloc(sizeof(float) * N);
    zt_cpu_rmsnorm_forward(ref, rrstd, inp, w, N, C, 1e-6f);
    snprintf(name, sizeof(name), "rmsnorm N%d C%d forward out", N, C);
    check_close(name, dt, out, ref, (size_t)N * C, tol_of(dt));
    snprintf(name, sizeof(name), "rmsnorm N%d C%d forward rstd", N, C);
    check_close(name, dt, rstd, rrstd, N, 1e-5);

    void *d_dout = dev_rand((size_t)N * C, 1.0f, dt, &dout);
    void *d_dinp = dev_rand((size_t)N * C, 0.5f, dt, &dinp);
    void *d_dw = dev_rand(C, 0.5f, dt, &dw);
    void *d_dinp0 = dev_clone(d_dinp, (size_t)N * C * es), *d_dw0 = dev_clone(d_dw, C * es);
    void *scratch = dev_alloc(zt_cuda_rmsnorm_backward_scratch_size(N, C));
    zt_cuda_rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C, scratch, dt, g_stream);
    float *g_dinp = dev_download(d_dinp, (size_t)N * C, dt), *g_dw = dev_download(d_dw, C, dt);
    zt_cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); /* the GPU's statistics */
    snprintf(name, sizeof(name), "rmsnorm N%d C%d backward dinp", N, C);
    check_close(name, dt, g_dinp, dinp, (size_t)N * C, tol_of(dt));
    snprintf(name, sizeof(name), "rmsnorm N%d C%d backward dweight", N, C);
    check_close(name, dt, g_dw, dw, C, tol_of(dt));

    /* Determinism: the same call from the same state gives the same bits. */
    void *d_dinp1 = dev_clone(d_dinp, (size_t)N * C * es), *d_dw1 = dev_clone(d_dw, C * es);
    dev_copy(d_dinp, d_dinp0, (size_t)N * C * es);
    dev_copy(d_dw, d_dw0, C * es);
    zt_cuda_rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C, scratch, dt, g_stream);
    assert_true(dev_equal(d_dinp, d_dinp1, (size_t)N * C * es));
    assert_true(dev_equal(d_dw, d_dw1, C * es));

    free(inp), free(w), free(dout), free(dinp), free(dw), free(out), free(rstd), free(ref), free(rrstd);
    free(g_dinp), free(g_dw);
    void *dev[] = {d_inp, d_w, d_out, d_rstd, d_dout, d_dinp, d_dw, d_dinp0, d_dw0, scratch, d_dinp1, d_dw1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        run_rmsnorm(k_dtypes[i], 134, 768);   /* 16-byte rows */
        run_rmsnorm(k_dtypes[i], 5, 75);      /* odd C: one element at a time */
        run_rmsnorm(k_dtypes[i], 37, 4100);   /* fp32 rows of 16 bytes, 16-bit rows not: both paths */
        run_rmsnorm(k_dtypes[i], 3001, 4096); /* LLaMA-7B width, many row slices */
        run_rmsnorm(k_dtypes[i], 9, 8192);    /* LLaMA-70B width, fewer rows than a slice */
    }
}

/* ---- rotary position embeddings ---- */

static void run_rope(enum zt_dtype dt, int B, int T, int NH, int NKV, int HS, int rot, int pos0,
                     const zt_rope_config *cfg)
{
    const int W = (NH + 2 * NKV) * HS;
    const size_t n = (size_t)B * T * W;
    char name[112];
    float *inv_freq = malloc(sizeof(float) * rot / 2);
    assert_int_equal(zt_rope_inv_freq(inv_freq, rot, cfg, NULL), 0);
    float *d_inv = dev_alloc(sizeof(float) * rot / 2);
    ZT_CUDA_CHECK(cudaMemcpy(d_inv, inv_freq, sizeof(float) * rot / 2, cudaMemcpyHostToDevice));
    float *qkv;
    void *d_qkv = dev_rand(n, 2.0f, dt, &qkv);
    zt_cuda_rope_forward(d_qkv, d_inv, B, T, NH, NKV, HS, rot, pos0, dt, g_stream, NULL);
    float *got = dev_download(d_qkv, n, dt);
    zt_cpu_rope_forward(qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, NULL);
    snprintf(name, sizeof(name), "rope B%d T%d NH%d NKV%d HS%d rot %d pos0 %d forward", B, T, NH, NKV, HS, rot, pos0);
    check_close(name, dt, got, qkv, n, tol_of(dt));
    memcpy(qkv, got, sizeof(float) * n); /* the backward's input: the GPU's rotated values, on both sides */
    free(got);
    /* The backward, in place like the forward. */
    zt_cuda_rope_backward(d_qkv, d_inv, B, T, NH, NKV, HS, rot, pos0, dt, g_stream, NULL);
    got = dev_download(d_qkv, n, dt);
    zt_cpu_rope_backward(qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, NULL);
    snprintf(name, sizeof(name), "rope B%d T%d NH%d NKV%d HS%d rot %d pos0 %d backward", B, T, NH, NKV, HS, rot,
             pos0);
    check_close(name, dt, got, qkv, n, tol_of(dt));
    free(got), free(qkv), free(inv_freq);
    dev_free(d_qkv), dev_free(d_inv);
}

/* Per-row positions (packed documents restarting at 0) against the CPU twin with the same positions. */
static void run_rope_positions(enum zt_dtype dt, int B, int T, int NH, int NKV, int HS, const zt_rope_config *cfg)
{
    const int W = (NH + 2 * NKV) * HS;
    const size_t n = (size_t)B * T * W, rows = (size_t)B * T;
    char name[96];
    float *inv_freq = malloc(sizeof(float) * HS / 2);
    assert_int_equal(zt_rope_inv_freq(inv_freq, HS, cfg, NULL), 0);
    int32_t *pos = malloc(sizeof(int32_t) * rows);
    for (size_t r = 0, p = 0; r < rows; r++, p++) {
        if (r % (size_t)T == 0 || r % 7 == 3) /* a document starts at each row and at every 7th token + 3 */
            p = 0;
        pos[r] = (int32_t)p;
    }
    float *d_inv = dev_alloc(sizeof(float) * HS / 2);
    int32_t *d_pos = dev_alloc(sizeof(int32_t) * rows);
    ZT_CUDA_CHECK(cudaMemcpy(d_inv, inv_freq, sizeof(float) * HS / 2, cudaMemcpyHostToDevice));
    ZT_CUDA_CHECK(cudaMemcpy(d_pos, pos, sizeof(int32_t) * rows, cudaMemcpyHostToDevice));
    float *qkv;
    void *d_qkv = dev_rand(n, 2.0f, dt, &qkv);
    zt_cuda_rope_forward(d_qkv, d_inv, B, T, NH, NKV, HS, HS, 0, dt, g_stream, d_pos);
    float *got = dev_download(d_qkv, n, dt);
    zt_cpu_rope_forward(qkv, inv_freq, B, T, NH, NKV, HS, HS, 0, pos);
    snprintf(name, sizeof(name), "rope positions B%d T%d NH%d NKV%d HS%d forward", B, T, NH, NKV, HS);
    check_close(name, dt, got, qkv, n, tol_of(dt));
    memcpy(qkv, got, sizeof(float) * n);
    free(got);
    zt_cuda_rope_backward(d_qkv, d_inv, B, T, NH, NKV, HS, HS, 0, dt, g_stream, d_pos);
    got = dev_download(d_qkv, n, dt);
    zt_cpu_rope_backward(qkv, inv_freq, B, T, NH, NKV, HS, HS, 0, pos);
    snprintf(name, sizeof(name), "rope positions B%d T%d NH%d NKV%d HS%d backward", B, T, NH, NKV, HS);
    check_close(name, dt, got, qkv, n, tol_of(dt));
    free(got), free(qkv), free(inv_freq), free(pos);
    dev_free(d_qkv), dev_free(d_inv), dev_free(d_pos);
}

static void test_rope(void **state)
{
    (void)state;
    const zt_rope_config llama2 = {.theta = 10000.0};
    const zt_rope_config llama3 = {.theta = 500000.0, .scaling = ZT_ROPE_SCALING_LLAMA3, .factor = 8.0,
                                   .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                                   .original_max_position_embeddings = 8192};
    const zt_rope_config linear = {.theta = 10000.0, .scaling = ZT_ROPE_SCALING_LINEAR, .factor = 4.0};
    for (int i = 0; i < 3; i++) {
        run_rope(k_dtypes[i], 2, 67, 4, 4, 128, 128, 0, &llama2);      /* multi-head */
        run_rope(k_dtypes[i], 3, 33, 6, 2, 80, 80, 0, &linear);        /* grouped-query, ratio 3, head size 80 */
        run_rope(k_dtypes[i], 1, 129, 32, 8, 128, 128, 8000, &llama3); /* LLaMA-3 8B heads, positions 8000.. */
        run_rope(k_dtypes[i], 2, 5, 5, 1, 40, 40, 3, &llama2);         /* one key head, odd head count */
        run_rope(k_dtypes[i], 2, 67, 8, 8, 64, 16, 0, &llama2);        /* Pythia's rotary_pct 0.25 of 64 */
        run_rope(k_dtypes[i], 3, 33, 4, 4, 32, 8, 5, &llama2);         /* 0.25 of 32 */
        run_rope(k_dtypes[i], 1, 17, 12, 12, 80, 20, 0, &linear);      /* a quarter of 80: 10 pairs */
        run_rope_positions(k_dtypes[i], 3, 50, 6, 2, 64, &llama2); /* packed documents */
    }
}

/* ---- matmul ---- */

static void run_matmul(enum zt_dtype dt, int N, int IC, int OC, int with_bias, int with_gelu)
{
    const size_t es = zt_dtype_size(dt);
    char name[96];
    float *inp, *w, *b = NULL;
    void *d_inp = dev_rand((size_t)N * IC, 1.0f, dt, &inp);
    void *d_w = dev_rand((size_t)OC * IC, 0.1f, dt, &w);
    void *d_b = with_bias ? dev_rand(OC, 0.5f, dt, &b) : NULL;
    void *d_out = dev_alloc((size_t)N * OC * es);
    void *d_pre = with_gelu ? dev_alloc((size_t)N * OC * es) : NULL;
    zt_cuda_matmul_forward(g_blas, d_out, d_pre, d_inp, d_w, d_b, N, IC, OC, dt, g_stream);
    float *out = dev_download(d_out, (size_t)N * OC, dt);
    float *ref = malloc(sizeof(float) * N * OC);
    zt_cpu_matmul_forward(ref, inp, w, b, N, IC, OC);
    if (with_gelu) {
        float *pre = dev_download(d_pre, (size_t)N * OC, dt);
        snprintf(name, sizeof(name), "matmul %dx%dx%d fwd pre_gelu", N, IC, OC);
        check_close(name, dt, pre, ref, (size_t)N * OC, tol_of(dt));
        float *act = malloc(sizeof(float) * N * OC);
        zt_cpu_gelu_forward(act, ref, (size_t)N * OC);
        snprintf(name, sizeof(name), "matmul %dx%dx%d fwd gelu out", N, IC, OC);
        check_close(name, dt, out, act, (size_t)N * OC, tol_of(dt));
        free(pre), free(act);
    } else {
        snprintf(name, sizeof(name), "matmul %dx%dx%d fwd%s", N, IC, OC, with_bias ? " +bias" : "");
        check_close(name, dt, out, ref, (size_t)N * OC, tol_of(dt));
        /* With the residual read as the GEMM's C: out = res + inp W^T + bias, twice the same bits. */
        float *res;
        void *d_res = dev_rand((size_t)N * OC, 1.0f, dt, &res);
        zt_cuda_matmul_forward_residual(g_blas, d_out, d_inp, d_w, d_b, d_res, N, IC, OC, dt, g_stream);
        float *rout = dev_download(d_out, (size_t)N * OC, dt);
        for (size_t i = 0; i < (size_t)N * OC; i++)
            res[i] += ref[i];
        snprintf(name, sizeof(name), "matmul %dx%dx%d fwd%s +residual", N, IC, OC, with_bias ? " +bias" : "");
        check_close(name, dt, rout, res, (size_t)N * OC, tol_of(dt));
        void *d_out1 = dev_clone(d_out, (size_t)N * OC * es);
        ZT_CUDA_CHECK(cudaMemsetAsync(d_out, 0xff, (size_t)N * OC * es, g_stream));
        zt_cuda_matmul_forward_residual(g_blas, d_out, d_inp, d_w, d_b, d_res, N, IC, OC, dt, g_stream);
        assert_true(dev_equal(d_out, d_out1, (size_t)N * OC * es));
        free(res), free(rout);
        dev_free(d_res), dev_free(d_out1);
    }

    /* Backward, accumulating into random dinp / dweight / dbias. */
    float *dout, *dinp, *dw, *db = NULL;
    void *d_dout = dev_rand((size_t)N * OC, 1.0f, dt, &dout);
    void *d_dinp = dev_rand((size_t)N * IC, 0.5f, dt, &dinp);
    void *d_dw = dev_rand((size_t)OC * IC, 0.5f, dt, &dw);
    void *d_db = with_bias ? dev_rand(OC, 0.5f, dt, &db) : NULL;
    void *d_dinp0 = dev_clone(d_dinp, (size_t)N * IC * es), *d_dw0 = dev_clone(d_dw, (size_t)OC * IC * es);
    void *d_db0 = with_bias ? dev_clone(d_db, OC * es) : NULL;
    zt_cuda_matmul_backward(g_blas, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, NULL, N, IC, OC, dt, g_stream);
    float *g_dinp = dev_download(d_dinp, (size_t)N * IC, dt), *g_dw = dev_download(d_dw, (size_t)OC * IC, dt);
    zt_cpu_matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    snprintf(name, sizeof(name), "matmul %dx%dx%d bwd dinp", N, IC, OC);
    check_close(name, dt, g_dinp, dinp, (size_t)N * IC, tol_of(dt));
    snprintf(name, sizeof(name), "matmul %dx%dx%d bwd dweight", N, IC, OC);
    check_close(name, dt, g_dw, dw, (size_t)OC * IC, tol_of(dt));
    if (with_bias) {
        float *g_db = dev_download(d_db, OC, dt);
        snprintf(name, sizeof(name), "matmul %dx%dx%d bwd dbias", N, IC, OC);
        check_close(name, dt, g_db, db, OC, tol_of(dt));
        free(g_db);
    }

    /* Determinism of the whole backward. */
    void *d_dinp1 = dev_clone(d_dinp, (size_t)N * IC * es), *d_dw1 = dev_clone(d_dw, (size_t)OC * IC * es);
    void *d_db1 = with_bias ? dev_clone(d_db, OC * es) : NULL;
    dev_copy(d_dinp, d_dinp0, (size_t)N * IC * es);
    dev_copy(d_dw, d_dw0, (size_t)OC * IC * es);
    if (with_bias)
        dev_copy(d_db, d_db0, OC * es);
    zt_cuda_matmul_backward(g_blas, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, NULL, N, IC, OC, dt, g_stream);
    assert_true(dev_equal(d_dinp, d_dinp1, (size_t)N * IC * es));
    assert_true(dev_equal(d_dw, d_dw1, (size_t)OC * IC * es));
    if (with_bias)
        assert_true(dev_equal(d_db, d_db1, OC * es));

    /* The overwrite variant: dinp starts as NaN (all bits set), which it must never read; dweight and
     * dbias still accumulate (from the state before the first backward). Run twice: the same bits. */
    {
        ZT_CUDA_CHECK(cudaMemsetAsync(d_dinp, 0xff, (size_t)N * IC * es, g_stream));
        dev_copy(d_dw, d_dw0, (size_t)OC * IC * es);
        if (with_bias)
            dev_copy(d_db, d_db0, OC * es);
        zt_cuda_matmul_backward_overwrite(g_blas, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, NULL, N, IC, OC, dt,
                                          g_stream);
        float *o_dinp = dev_download(d_dinp, (size_t)N * IC, dt);
        float *want = calloc((size_t)N * IC, sizeof(float)), *dummy_dw = calloc((size_t)OC * IC, sizeof(float));
        zt_cpu_matmul_backward(want, dummy_dw, NULL, dout, inp, w, N, IC, OC);
        snprintf(name, sizeof(name), "matmul %dx%dx%d bwd dinp overwrite", N, IC, OC);
        check_close(name, dt, o_dinp, want, (size_t)N * IC, tol_of(dt));
        assert_true(dev_equal(d_dw, d_dw1, (size_t)OC * IC * es));
        if (with_bias)
            assert_true(dev_equal(d_db, d_db1, OC * es));
        void *d_o1 = dev_clone(d_dinp, (size_t)N * IC * es);
        ZT_CUDA_CHECK(cudaMemsetAsync(d_dinp, 0xff, (size_t)N * IC * es, g_stream));
        zt_cuda_matmul_backward_overwrite(g_blas, d_dinp, NULL, NULL, d_dout, d_inp, d_w, NULL, N, IC, OC, dt,
                                          g_stream);
        assert_true(dev_equal(d_dinp, d_o1, (size_t)N * IC * es));
        free(o_dinp), free(want), free(dummy_dw);
        dev_free(d_o1);
    }

    if (with_gelu) {
        /* The fused GELU backward: this layer's inp was gelu(pre), so dpre = gelu'(pre) * (dout W),
         * overwritten. Here "pre" is a random [N, IC] tensor. */
        float *pre;
        void *d_pre_in = dev_rand((size_t)N * IC, 2.0f, dt, &pre);
        zt_cuda_matmul_backward(g_blas, d_dinp, NULL, NULL, d_dout, d_inp, d_w, d_pre_in, N, IC, OC, dt, g_stream);
        float *g_dpre = dev_download(d_dinp, (size_t)N * IC, dt);
        float *tmp = calloc((size_t)N * IC, sizeof(float)), *dummy_dw = calloc((size_t)OC * IC, sizeof(float));
        float *want = calloc((size_t)N * IC, sizeof(float));
        zt_cpu_matmul_backward(tmp, dummy_dw, NULL, dout, inp, w, N, IC, OC);
        zt_cpu_gelu_backward(want, pre, tmp, (size_t)N * IC);
        snprintf(name, sizeof(name), "matmul %dx%dx%d bwd fused dgelu", N, IC, OC);
        check_close(name, dt, g_dpre, want, (size_t)N * IC, tol_of(dt));
        free(pre), free(g_dpre), free(tmp), free(dummy_dw), free(want);
        dev_free(d_pre_in);
    }

    free(inp), free(w), free(b), free(out), free(ref), free(dout), free(dinp), free(dw), free(db), free(g_dinp);
    free(g_dw);
    void *dev[] = {d_inp, d_w, d_b, d_out, d_pre, d_dout, d_dinp, d_dw, d_db, d_dinp0, d_dw0, d_db0, d_dinp1, d_dw1,
                   d_db1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i])
            dev_free(dev[i]);
}

/* Tuning changes no bits: every GEMM path through a tuning context and through one that takes the
 * heuristic's first algorithm, on the data the tuning ran on (round 0) and on new data with the tuned
 * choices (round 1), gives the same outputs. */
static void run_matmul_tuning_bits(enum zt_dtype dt, int N, int IC, int OC, int gelu)
{
    const size_t es = zt_dtype_size(dt);
    zt_cuda_blas *ctx[2];
    zt_err err;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(zt_cuda_blas_create(&ctx[k], 0, &err), 0);
        zt_cuda_blas_set_tuning(ctx[k], k == 1);
    }
    for (int round = 0; round < 2; round++) {
        float *h[8];
        void *inp = dev_rand((size_t)N * IC, 1.0f, dt, &h[0]), *w = dev_rand((size_t)OC * IC, 0.1f, dt, &h[1]);
        void *b = dev_rand(OC, 0.5f, dt, &h[2]), *res = dev_rand((size_t)N * OC, 1.0f, dt, &h[3]);
        void *dout = dev_rand((size_t)N * OC, 1.0f, dt, &h[4]), *pre_in = dev_rand((size_t)N * IC, 2.0f, dt, &h[5]);
        void *dinp0 = dev_rand((size_t)N * IC, 0.5f, dt, &h[6]), *dw0 = dev_rand((size_t)OC * IC, 0.5f, dt, &h[7]);
        /* Per context: out, pre, residual out, dinp, dweight, dbias (accumulating), dinp overwritten, dpre. */
        void *o[2][8];
        for (int k = 0; k < 2; k++) {
            o[k][0] = dev_alloc((size_t)N * OC * es);
            o[k][1] = gelu ? dev_alloc((size_t)N * OC * es) : NULL;
            o[k][2] = dev_alloc((size_t)N * OC * es);
            o[k][3] = dev_clone(dinp0, (size_t)N * IC * es);
            o[k][4] = dev_clone(dw0, (size_t)OC * IC * es);
            o[k][5] = dev_clone(b, OC * es);
            o[k][6] = dev_alloc((size_t)N * IC * es);
            o[k][7] = dev_alloc((size_t)N * IC * es);
            zt_cuda_matmul_forward(ctx[k], o[k][0], o[k][1], inp, w, b, N, IC, OC, dt, g_stream);
            zt_cuda_matmul_forward_residual(ctx[k], o[k][2], inp, w, b, res, N, IC, OC, dt, g_stream);
            zt_cuda_matmul_backward(ctx[k], o[k][3], o[k][4], o[k][5], dout, inp, w, NULL, N, IC, OC, dt, g_stream);
            zt_cuda_matmul_backward_overwrite(ctx[k], o[k][6], NULL, NULL, dout, inp, w, NULL, N, IC, OC, dt,
                                              g_stream);
            zt_cuda_matmul_backward_overwrite(ctx[k], o[k][7], NULL, NULL, dout, inp, w, pre_in, N, IC, OC, dt,
                                              g_stream);
        }
        const size_t bytes[8] = {(size_t)N * OC * es, gelu ? (size_t)N * OC * es : 0, (size_t)N * OC * es,
                                 (size_t)N * IC * es, (size_t)OC * IC * es, OC * es, (size_t)N * IC * es,
                                 (size_t)N * IC * es};
        for (int i = 0; i < 8; i++) {
            if (bytes[i] && !dev_equal(o[0][i], o[1][i], bytes[i]))
                fail_msg("matmul %dx%dx%d %s round %d: output %d differs with tuning", N, IC, OC, zt_dtype_name(dt),
                         round, i);
            for (int k = 0; k < 2; k++)
                if (o[k][i])
                    dev_free(o[k][i]);
        }
        void *dev[] = {inp, w, b, res, dout, pre_in, dinp0, dw0};
        for (int i = 0; i < 8; i++) {
            dev_free(dev[i]);
            free(h[i]);
        }
    }
    for (int k = 0; k < 2; k++)
        zt_cuda_blas_destroy(ctx[k]);
}

static void test_matmul(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        enum zt_dtype dt = k_dtypes[i];
        if (dt == ZT_DTYPE_BF16 && g_cc_major < 8) {
            printf("  matmul BF16 skipped: this GPU (sm_%d x) has no bf16 GEMM\n", g_cc_major);
            continue;
        }
        /* Heuristic algorithms, then tuned ones: tuning runs candidates into the call's own output, so
         * the GEMMs that read other inputs as C (the residual) and those that add into their output
         * (dweight, which tuning leaves alone) must still give the reference. */
        for (int tune = 0; tune < 2; tune++) {
            zt_cuda_blas_set_tuning(g_blas, tune == 1);
            run_matmul(dt, 134, 768, 2304, 1, 0); /* attention's qkv projection */
            run_matmul(dt, 134, 768, 3072, 1, 1); /* MLP's first layer with the fused GELU */
            run_matmul(dt, 134, 768, 1003, 0, 0); /* LM head, odd vocabulary */
            run_matmul(dt, 67, 72, 40, 1, 0);     /* small and odd */
            run_matmul(dt, 67, 64, 48, 1, 1);     /* small, fused GELU */
            run_matmul(dt, 67, 72, 44, 1, 0);     /* bias gradient of a width that is no multiple of 8 */
            run_matmul(dt, 3001, 64, 1000, 1, 0); /* bias gradient over many rows per slice and warp */
        }
        zt_cuda_blas_set_tuning(g_blas, false);
        run_matmul_tuning_bits(dt, 1024, 768, 2304, 0); /* GPT-2 124M shapes at 1 x 1024 tokens */
        run_matmul_tuning_bits(dt, 1024, 768, 3072, 1);
        run_matmul_tuning_bits(dt, 1024, 3072, 768, 0);
        run_matmul_tuning_bits(dt, 134, 768, 1003, 0);
    }
}

/* ---- GELU and residual ---- */

static void run_elementwise(enum zt_dtype dt, size_t n, size_t offset)
{
    const size_t es = zt_dtype_size(dt);
    float *x, *g, *acc;
    /* offset shifts every pointer by that many elements, to exercise the unaligned (scalar) path. */
    void *bx = dev_rand(n + offset, 3.0f, dt, &x);
    void *bg = dev_rand(n + offset, 1.0f, dt, &g);
    void *bacc = dev_rand(n + offset, 1.0f, dt, &acc);
    void *bout = dev_alloc((n + offset) * es);
    char *dx = (char *)bx + offset * es, *dg = (char *)bg + offset * es, *dacc = (char *)bacc + offset * es;
    char *dout = (char *)bout + offset * es;
    float *ref = malloc(sizeof(float) * n), *ref2 = host_copy(acc + offset, n), *ref3 = host_copy(g + offset, n);

    zt_cuda_gelu_forward(dout, dx, n, dt, g_stream);
    float *got = dev_download(dout, n, dt);
    zt_cpu_gelu_forward(ref, x + offset, n);
    check_close(offset ? "gelu forward (unaligned)" : "gelu forward", dt, got, ref, n, tol_of(dt));
    free(got);

    zt_cuda_gelu_backward(dacc, dx, dg, n, dt, g_stream);
    got = dev_download(dacc, n, dt);
    zt_cpu_gelu_backward(ref2, x + offset, g + offset, n);
    check_close(offset ? "gelu backward (unaligned)" : "gelu backward", dt, got, ref2, n, tol_of(dt));
    free(got);

    /* Exact GELU: forward, then backward into a copy of the starting accumulator. */
    zt_cuda_gelu_erf_forward(dout, dx, n, dt, g_stream);
    got = dev_download(dout, n, dt);
    zt_cpu_gelu_erf_forward(ref, x + offset, n);
    check_close(offset ? "gelu_erf forward (unaligned)" : "gelu_erf forward", dt, got, ref, n, tol_of(dt));
    free(got);
    float *eacc = dev_download(dacc, n, dt);
    zt_cuda_gelu_erf_backward(dacc, dx, dg, n, dt, g_stream);
    got = dev_download(dacc, n, dt);
    zt_cpu_gelu_erf_backward(eacc, x + offset, g + offset, n);
    check_close(offset ? "gelu_erf backward (unaligned)" : "gelu_erf backward", dt, got, eacc, n, tol_of(dt));
    free(got), free(eacc);
    /* Overwrite: from NaN (all bits set), the bits of zeroing first and adding. */
    ZT_CUDA_CHECK(cudaMemsetAsync(dout, 0, n * es, g_stream));
    zt_cuda_gelu_erf_backward(dout, dx, dg, n, dt, g_stream);
    void *want = dev_clone(dout, n * es);
    ZT_CUDA_CHECK(cudaMemsetAsync(dout, 0xff, n * es, g_stream));
    zt_cuda_gelu_erf_backward_overwrite(dout, dx, dg, n, dt, g_stream);
    assert_true(dev_equal(dout, want, n * es));
    dev_free(want);

    /* tanh, backward from the forward's output (the GPU's, given to the CPU too). */
    zt_cuda_tanh_forward(dout, dx, n, dt, g_stream);
    got = dev_download(dout, n, dt);
    zt_cpu_tanh_forward(ref, x + offset, n);
    check_close(offset ? "tanh forward (unaligned)" : "tanh forward", dt, got, ref, n, tol_of(dt));
    float *tacc = dev_download(dacc, n, dt);
    zt_cuda_tanh_backward(dacc, dout, dg, n, dt, g_stream);
    float *tgot = dev_download(dacc, n, dt);
    zt_cpu_tanh_backward(tacc, got, g + offset, n);
    check_close(offset ? "tanh backward (unaligned)" : "tanh backward", dt, tgot, tacc, n, tol_of(dt));
    free(got), free(tacc), free(tgot);

    zt_cuda_residual_forward(dout, dx, dg, n, dt, g_stream);
    got = dev_download(dout, n, dt);
    zt_cpu_residual_forward(ref, x + offset, g + offset, n);
    check_close("residual forward", dt, got, ref, n, tol_of(dt));
    free(got);

    /* residual backward into (dacc, dout=a+b) and add_inplace into dg. */
    float *ref_a = dev_download(dacc, n, dt), *ref_b = dev_download(dout, n, dt);
    zt_cuda_residual_backward(dacc, dout, dx, n, dt, g_stream);
    float *got_a = dev_download(dacc, n, dt), *got_b = dev_download(dout, n, dt);
    zt_cpu_residual_backward(ref_a, ref_b, x + offset, n);
    check_close("residual backward da", dt, got_a, ref_a, n, tol_of(dt));
    check_close("residual backward db", dt, got_b, ref_b, n, tol_of(dt));
    zt_cuda_add_inplace(dg, dx, n, dt, g_stream);
    got = dev_download(dg, n, dt);
    zt_cpu_add_inplace(ref3, x + offset, n);
    check_close("add_inplace", dt, got, ref3, n, tol_of(dt));
    free(got);

    free(x), free(g), free(acc), free(ref), free(ref2), free(ref3), free(ref_a), free(ref_b), free(got_a), free(got_b);
    dev_free(bx), dev_free(bg), dev_free(bacc), dev_free(bout);
}

/* SwiGLU over inp [N,2F], accumulating into a random dinp. */
static void run_swiglu(enum zt_dtype dt, int N, int F)
{
    const size_t n = (size_t)N * F, es = zt_dtype_size(dt);
    char name[96];
    float *inp, *dout, *dinp;
    void *d_inp = dev_rand(2 * n, 5.0f, dt, &inp);
    void *d_out = dev_alloc(n * es);
    zt_cuda_swiglu_forward(d_out, d_inp, N, F, dt, g_stream);
    float *out = dev_download(d_out, n, dt), *ref = malloc(sizeof(float) * n);
    zt_cpu_swiglu_forward(ref, inp, N, F);
    snprintf(name, sizeof(name), "swiglu N%d F%d forward", N, F);
    check_close(name, dt, out, ref, n, tol_of(dt));

    void *d_dout = dev_rand(n, 1.0f, dt, &dout);
    void *d_dinp = dev_rand(2 * n, 0.5f, dt, &dinp);
    zt_cuda_swiglu_backward(d_dinp, d_inp, d_dout, N, F, dt, g_stream);
    float *g_dinp = dev_download(d_dinp, 2 * n, dt);
    zt_cpu_swiglu_backward(dinp, inp, dout, N, F);
    snprintf(name, sizeof(name), "swiglu N%d F%d backward", N, F);
    check_close(name, dt, g_dinp, dinp, 2 * n, tol_of(dt));

    /* Overwrite: from NaN (all bits set), the bits of zeroing first and adding. */
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dinp, 0, 2 * n * es, g_stream));
    zt_cuda_swiglu_backward(d_dinp, d_inp, d_dout, N, F, dt, g_stream);
    void *d_want = dev_clone(d_dinp, 2 * n * es);
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dinp, 0xff, 2 * n * es, g_stream));
    zt_cuda_swiglu_backward_overwrite(d_dinp, d_inp, d_dout, N, F, dt, g_stream);
    assert_true(dev_equal(d_dinp, d_want, 2 * n * es));
    dev_free(d_want);
    free(inp), free(dout), free(dinp), free(out), free(ref), free(g_dinp);
    dev_free(d_inp), dev_free(d_out), dev_free(d_dout), dev_free(d_dinp);
}

/* T5's gated GELU over inp [N,2F] and ReLU over N*F values, accumulating into a random dinp. */
static void run_geglu_relu(enum zt_dtype dt, int N, int F)
{
    const size_t n = (size_t)N * F, es = zt_dtype_size(dt);
    char name[96];
    float *inp, *dout, *dinp, *dinp2;
    void *d_inp = dev_rand(2 * n, 4.0f, dt, &inp);
    void *d_out = dev_alloc(n * es);
    zt_cuda_geglu_forward(d_out, d_inp, N, F, dt, g_stream);
    float *out = dev_download(d_out, n, dt), *ref = malloc(sizeof(float) * 2 * n);
    zt_cpu_geglu_forward(ref, inp, N, F);
    snprintf(name, sizeof(name), "geglu N%d F%d forward", N, F);
    check_close(name, dt, out, ref, n, tol_of(dt));
    void *d_dout = dev_rand(n, 1.0f, dt, &dout);
    void *d_dinp = dev_rand(2 * n, 0.5f, dt, &dinp);
    zt_cuda_geglu_backward(d_dinp, d_inp, d_dout, N, F, dt, g_stream);
    float *g_dinp = dev_download(d_dinp, 2 * n, dt);
    zt_cpu_geglu_backward(dinp, inp, dout, N, F);
    snprintf(name, sizeof(name), "geglu N%d F%d backward", N, F);
    check_close(name, dt, g_dinp, dinp, 2 * n, tol_of(dt));
    free(out), free(g_dinp);

    /* ReLU over the first n values of inp */
    zt_cuda_relu_forward(d_out, d_inp, n, dt, g_stream);
    out = dev_download(d_out, n, dt);
    zt_cpu_relu_forward(ref, inp, n);
    snprintf(name, sizeof(name), "relu %zu forward", n);
    check_close(name, dt, out, ref, n, tol_of(dt));
    void *d_dinp2 = dev_rand(n, 0.5f, dt, &dinp2);
    zt_cuda_relu_backward(d_dinp2, d_inp, d_dout, n, dt, g_stream);
    g_dinp = dev_download(d_dinp2, n, dt);
    zt_cpu_relu_backward(dinp2, inp, dout, n);
    snprintf(name, sizeof(name), "relu %zu backward", n);
    check_close(name, dt, g_dinp, dinp2, n, tol_of(dt));
    free(out), free(g_dinp);

    /* an fp32 gradient added into dtype (T5's bias tables): dinp2 += inp as fp32 */
    float *d_f32 = dev_alloc(n * sizeof(float));
    zt_cuda_cast(d_f32, ZT_DTYPE_F32, d_inp, dt, n, g_stream);
    zt_cuda_add_f32(d_dinp2, d_f32, n, dt, g_stream);
    g_dinp = dev_download(d_dinp2, n, dt);
    zt_cpu_add_inplace(dinp2, inp, n);
    check_close("add_f32", dt, g_dinp, dinp2, n, tol_of(dt));
    dev_free(d_f32);
    free(inp), free(dout), free(dinp), free(dinp2), free(ref), free(g_dinp);
    dev_free(d_inp), dev_free(d_out), dev_free(d_dout), dev_free(d_dinp), dev_free(d_dinp2);
}

static void test_elementwise(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        run_elementwise(k_dtypes[i], 100003, 0);
        run_elementwise(k_dtypes[i], 1001, 1);
        run_swiglu(k_dtypes[i], 134, 1376); /* rows of 16-byte multiples: vector path */
        run_swiglu(k_dtypes[i], 37, 301);   /* odd F (and N * F): one element at a time */
        run_swiglu(k_dtypes[i], 3, 11008);  /* LLaMA-7B's intermediate size */
        run_geglu_relu(k_dtypes[i], 37, 301);
        run_geglu_relu(k_dtypes[i], 5, 2048); /* T5 v1.1 small's d_ff */
    }
}

/* ---- fused classifier ---- */

/* Which rows are ignored: every 7th (CE_SOME), all but every 7th (CE_MASKED_LM: a masked-LM batch, where
 * most positions carry no label), or all of them (CE_ALL). */
enum ce_pattern { CE_SOME, CE_MASKED_LM, CE_ALL };

static void run_crossentropy(enum zt_dtype dt, int N, int V, int P, int ignore, enum ce_pattern pattern)
{
    const size_t es = zt_dtype_size(dt);
    int32_t *tgt = malloc(sizeof(int32_t) * N);
    int valid = 0;
    for (int n = 0; n < N; n++) {
        int ignored = pattern == CE_ALL || (pattern == CE_SOME ? n % 7 == 3 : n % 7 != 0);
        tgt[n] = ignored ? ignore : (int32_t)zt_rng_below(&g_rng, V);
    }
    if (pattern != CE_ALL)
        tgt[0] = V - 1; /* row 0 is not ignored: the last class is a target */
    for (int n = 0; n < N; n++)
        valid += tgt[n] != ignore;
    int32_t *d_tgt = dev_alloc(sizeof(int32_t) * N);
    ZT_CUDA_CHECK(cudaMemcpy(d_tgt, tgt, sizeof(int32_t) * N, cudaMemcpyHostToDevice));

    /* Logits in rows of P: random in the first V columns, garbage (1e4) in the padding. */
    float *lg = host_rand((size_t)N * P, 4.0f);
    for (int n = 0; n < N; n++)
        for (int i = V; i < P; i++)
            lg[(size_t)n * P + i] = 1e4f;
    void *d_lg = dev_upload(lg, (size_t)N * P, dt);
    float *dense = malloc(sizeof(float) * N * V);
    for (int n = 0; n < N; n++)
        memcpy(dense + (size_t)n * V, lg + (size_t)n * P, sizeof(float) * V);
    void *d_lg0 = dev_clone(d_lg, (size_t)N * P * es);

    float *d_loss = dev_alloc(sizeof(float) * N);
    int *d_count = dev_alloc(sizeof(int));
    ZT_CUDA_CHECK(cudaMemsetAsync(d_count, 0, sizeof(int), g_stream));
    float grad_scale = valid ? 1.0f / (float)valid : 1.0f;

    /* Losses only: logits untouched. */
    zt_cuda_crossentropy_forward_backward(d_loss, NULL, d_lg, d_tgt, N, V, P, ignore, grad_scale, d_count, dt,
                                          g_stream);
    assert_true(dev_equal(d_lg, d_lg0, (size_t)N * P * es));
    float *loss_only = dev_download(d_loss, N, ZT_DTYPE_F32);

    /* In place: the gradient replaces the logits. */
    zt_cuda_crossentropy_forward_backward(d_loss, d_lg, d_lg, d_tgt, N, V, P, ignore, grad_scale, d_count, dt,
                                          g_stream);
    float *loss = dev_download(d_loss, N, ZT_DTYPE_F32);
    float *grad = dev_download(d_lg, (size_t)N * P, dt);
    int count = 0;
    ZT_CUDA_CHECK(cudaMemcpy(&count, d_count, sizeof(int), cudaMemcpyDeviceToHost));
    assert_int_equal(count, 2 * valid);

    float *rloss = malloc(sizeof(float) * N), *rgrad = malloc(sizeof(float) * N * V);
    int rvalid = zt_cpu_crossentropy_forward_backward(rloss, rgrad, dense, tgt, N, V, ignore, grad_scale);
    assert_int_equal(rvalid, valid);
    char name[80];
    snprintf(name, sizeof(name), "crossentropy N=%d V=%d P=%d ignore %d loss", N, V, P, ignore);
    check_close(name, dt, loss, rloss, N, 1e-4);
    check_close("crossentropy loss without gradient", dt, loss_only, rloss, N, 1e-4);
    float *gdense = malloc(sizeof(float) * N * V);
    for (int n = 0; n < N; n++) {
        memcpy(gdense + (size_t)n * V, grad + (size_t)n * P, sizeof(float) * V);
        for (int i = V; i < P; i++)
            assert_true(grad[(size_t)n * P + i] == 0.0f);
        if (tgt[n] == ignore) {
            assert_true(loss[n] == 0.0f);
            for (int i = 0; i < V; i++)
                assert_true(grad[(size_t)n * P + i] == 0.0f);
        }
    }
    snprintf(name, sizeof(name), "crossentropy N=%d V=%d P=%d ignore %d dlogits", N, V, P, ignore);
    check_close(name, dt, gdense, rgrad, (size_t)N * V, tol_of(dt));

    /* Determinism, into a separate buffer this time. */
    void *d_g2 = dev_alloc((size_t)N * P * es);
    zt_cuda_crossentropy_forward_backward(d_loss, d_g2, d_lg0, d_tgt, N, V, P, ignore, grad_scale, NULL, dt,
                                          g_stream);
    assert_true(dev_equal(d_g2, d_lg, (size_t)N * P * es));
    float *loss2 = dev_download(d_loss, N, ZT_DTYPE_F32);
    assert_memory_equal(loss2, loss, sizeof(float) * N);

    free(tgt), free(lg), free(dense), free(loss_only), free(loss), free(grad), free(rloss), free(rgrad), free(gdense);
    free(loss2);
    dev_free(d_tgt), dev_free(d_lg), dev_free(d_lg0), dev_free(d_loss), dev_free(d_count), dev_free(d_g2);
}

static void test_crossentropy(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        run_crossentropy(k_dtypes[i], 134, 1003, 1003, -100, CE_SOME); /* odd V: unaligned rows, scalar path */
        run_crossentropy(k_dtypes[i], 134, 1003, 1008, -100, CE_SOME); /* padded rows: vector path */
        run_crossentropy(k_dtypes[i], 8, 50257, 50304, -100, CE_SOME); /* GPT-2's vocabulary */
        /* Masked LM with ztrain's ignore_index -1: most rows carry no label; BERT's vocabulary. */
        run_crossentropy(k_dtypes[i], 67, 30522, 30528, -1, CE_MASKED_LM);
        run_crossentropy(k_dtypes[i], 9, 1003, 1008, -1, CE_ALL);
        /* A classification head: three labels, one row per sequence. */
        run_crossentropy(k_dtypes[i], 7, 3, 3, -1, CE_SOME);
    }
}

/* ---- BERT's pooler and classification head, composed from the kernels ---- */

/* Every stage on the GPU against its CPU twin fed the GPU's input to that stage: first token, pooler
 * dense, tanh, classifier dense, cross-entropy with one label per sequence (ignore_index -1), and the
 * backward through all of them. */
static void run_classifier_head(enum zt_dtype dt, int B, int T, int C, int L)
{
    const size_t es = zt_dtype_size(dt);
    char name[96];
    int32_t *lab = malloc(sizeof(int32_t) * B);
    int valid = 0;
    for (int b = 0; b < B; b++) {
        lab[b] = b % 4 == 1 ? -1 : (int32_t)zt_rng_below(&g_rng, L);
        valid += lab[b] != -1;
    }
    int32_t *d_lab = dev_alloc(sizeof(int32_t) * B);
    ZT_CUDA_CHECK(cudaMemcpy(d_lab, lab, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
    float *h, *wp, *bp, *wc, *bc;
    void *d_h = dev_rand((size_t)B * T * C, 1.0f, dt, &h);
    void *d_wp = dev_rand((size_t)C * C, 0.1f, dt, &wp), *d_bp = dev_rand(C, 0.1f, dt, &bp);
    void *d_wc = dev_rand((size_t)L * C, 0.3f, dt, &wc), *d_bc = dev_rand(L, 0.1f, dt, &bc);
    void *d_first = dev_alloc((size_t)B * C * es), *d_pre = dev_alloc((size_t)B * C * es);
    void *d_pooled = dev_alloc((size_t)B * C * es), *d_logits = dev_alloc((size_t)B * L * es);
    float *d_loss = dev_alloc(sizeof(float) * B);

    zt_cuda_first_token_forward(d_first, d_h, B, T, C, dt, g_stream);
    zt_cuda_matmul_forward(g_blas, d_pre, NULL, d_first, d_wp, d_bp, B, C, C, dt, g_stream);
    zt_cuda_tanh_forward(d_pooled, d_pre, (size_t)B * C, dt, g_stream);
    zt_cuda_matmul_forward(g_blas, d_logits, NULL, d_pooled, d_wc, d_bc, B, C, L, dt, g_stream);
    float *first = dev_download(d_first, (size_t)B * C, dt), *pre = dev_download(d_pre, (size_t)B * C, dt);
    float *pooled = dev_download(d_pooled, (size_t)B * C, dt), *logits = dev_download(d_logits, (size_t)B * L, dt);
    for (int b = 0; b < B; b++)
        assert_memory_equal(first + (size_t)b * C, h + (size_t)b * T * C, sizeof(float) * C);
    float *r = malloc(sizeof(float) * B * (C > L ? C : L));
    zt_cpu_matmul_forward(r, first, wp, bp, B, C, C);
    snprintf(name, sizeof(name), "head B%d C%d L%d pooler dense", B, C, L);
    check_close(name, dt, pre, r, (size_t)B * C, tol_of(dt));
    zt_cpu_tanh_forward(r, pre, (size_t)B * C);
    snprintf(name, sizeof(name), "head B%d C%d L%d pooler tanh", B, C, L);
    check_close(name, dt, pooled, r, (size_t)B * C, tol_of(dt));
    zt_cpu_matmul_forward(r, pooled, wc, bc, B, C, L);
    snprintf(name, sizeof(name), "head B%d C%d L%d logits", B, C, L);
    check_close(name, dt, logits, r, (size_t)B * L, tol_of(dt));

    /* Loss and dlogits in place (P = L: rows not padded), then the backward chain. */
    const float scale = 1.0f / (float)valid;
    zt_cuda_crossentropy_forward_backward(d_loss, d_logits, d_logits, d_lab, B, L, L, -1, scale, NULL, dt, g_stream);
    float *loss = dev_download(d_loss, B, ZT_DTYPE_F32), *dlogits = dev_download(d_logits, (size_t)B * L, dt);
    float *rloss = malloc(sizeof(float) * B), *rdlogits = malloc(sizeof(float) * B * L);
    assert_int_equal(zt_cpu_crossentropy_forward_backward(rloss, rdlogits, logits, lab, B, L, -1, scale), valid);
    snprintf(name, sizeof(name), "head B%d C%d L%d loss", B, C, L);
    check_close(name, dt, loss, rloss, B, 1e-4);
    snprintf(name, sizeof(name), "head B%d C%d L%d dlogits", B, C, L);
    check_close(name, dt, dlogits, rdlogits, (size_t)B * L, tol_of(dt));

    void *d_dpooled = dev_alloc((size_t)B * C * es), *d_dpre = dev_alloc((size_t)B * C * es);
    void *d_dfirst = dev_alloc((size_t)B * C * es), *d_dh = dev_alloc((size_t)B * T * C * es);
    void *d_dwc = dev_alloc((size_t)L * C * es), *d_dbc = dev_alloc(L * es);
    void *d_dwp = dev_alloc((size_t)C * C * es), *d_dbp = dev_alloc(C * es);
    void *zero[] = {d_dpooled, d_dpre, d_dfirst, d_dh, d_dwc, d_dbc, d_dwp, d_dbp};
    const size_t zbytes[] = {(size_t)B * C * es, (size_t)B * C * es, (size_t)B * C * es, (size_t)B * T * C * es,
                             (size_t)L * C * es, L * es, (size_t)C * C * es, C * es};
    for (int i = 0; i < 8; i++)
        ZT_CUDA_CHECK(cudaMemsetAsync(zero[i], 0, zbytes[i], g_stream));
    zt_cuda_matmul_backward(g_blas, d_dpooled, d_dwc, d_dbc, d_logits, d_pooled, d_wc, NULL, B, C, L, dt, g_stream);
    zt_cuda_tanh_backward(d_dpre, d_pooled, d_dpooled, (size_t)B * C, dt, g_stream);
    zt_cuda_matmul_backward(g_blas, d_dfirst, d_dwp, d_dbp, d_dpre, d_first, d_wp, NULL, B, C, C, dt, g_stream);
    zt_cuda_first_token_backward(d_dh, d_dfirst, B, T, C, dt, g_stream);
    float *dpooled = dev_download(d_dpooled, (size_t)B * C, dt), *dpre = dev_download(d_dpre, (size_t)B * C, dt);
    float *dfirst = dev_download(d_dfirst, (size_t)B * C, dt), *dh = dev_download(d_dh, (size_t)B * T * C, dt);
    float *dwc = dev_download(d_dwc, (size_t)L * C, dt), *dwp = dev_download(d_dwp, (size_t)C * C, dt);
    float *rdwc = calloc((size_t)L * C, sizeof(float)), *rdbc = calloc(L, sizeof(float));
    float *rdwp = calloc((size_t)C * C, sizeof(float)), *rdbp = calloc(C, sizeof(float));
    float *rd = calloc((size_t)B * C, sizeof(float));
    zt_cpu_matmul_backward(rd, rdwc, rdbc, dlogits, pooled, wc, B, C, L);
    snprintf(name, sizeof(name), "head B%d C%d L%d dpooled", B, C, L);
    check_close(name, dt, dpooled, rd, (size_t)B * C, tol_of(dt));
    snprintf(name, sizeof(name), "head B%d C%d L%d dW labels", B, C, L);
    check_close(name, dt, dwc, rdwc, (size_t)L * C, tol_of(dt));
    memset(rd, 0, sizeof(float) * B * C);
    zt_cpu_tanh_backward(rd, pooled, dpooled, (size_t)B * C);
    snprintf(name, sizeof(name), "head B%d C%d L%d dtanh", B, C, L);
    check_close(name, dt, dpre, rd, (size_t)B * C, tol_of(dt));
    memset(rd, 0, sizeof(float) * B * C);
    zt_cpu_matmul_backward(rd, rdwp, rdbp, dpre, first, wp, B, C, C);
    snprintf(name, sizeof(name), "head B%d C%d L%d dfirst", B, C, L);
    check_close(name, dt, dfirst, rd, (size_t)B * C, tol_of(dt));
    snprintf(name, sizeof(name), "head B%d C%d L%d dW pooler", B, C, L);
    check_close(name, dt, dwp, rdwp, (size_t)C * C, tol_of(dt));
    for (int b = 0; b < B; b++) {
        assert_memory_equal(dh + (size_t)b * T * C, dfirst + (size_t)b * C, sizeof(float) * C);
        for (size_t i = C; i < (size_t)T * C; i++)
            assert_true(dh[(size_t)b * T * C + i] == 0.0f);
    }

    free(lab), free(h), free(wp), free(bp), free(wc), free(bc), free(first), free(pre), free(pooled), free(logits);
    free(r), free(loss), free(dlogits), free(rloss), free(rdlogits), free(dpooled), free(dpre), free(dfirst), free(dh);
    free(dwc), free(dwp), free(rdwc), free(rdbc), free(rdwp), free(rdbp), free(rd);
    void *dev[] = {d_lab, d_h, d_wp, d_bp, d_wc, d_bc, d_first, d_pre, d_pooled, d_logits, d_loss};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
    for (int i = 0; i < 8; i++)
        dev_free(zero[i]);
}

static void test_classifier_head(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        if (k_dtypes[i] == ZT_DTYPE_BF16 && g_cc_major < 8)
            continue; /* no bf16 GEMM */
        run_classifier_head(k_dtypes[i], 7, 13, 768, 3); /* BERT-base width, three labels */
        run_classifier_head(k_dtypes[i], 32, 5, 64, 2);
    }
}

/* ---- attention ---- */

/* The tensor-core kernels (tuned and generic) round P and dS to the storage type before their second
 * product, as FlashAttention does: with bf16 that adds up to 2^-9 relative error per summed term, and the
 * outputs of random inputs are sums that largely cancel, so the bf16 tensor-core check allows twice the
 * base. */
static int g_attention_tc;

static double attention_tol(enum zt_dtype dt)
{
    return dt == ZT_DTYPE_BF16 && g_attention_tc && g_cc_major >= 8 ? 2e-2 : tol_of(dt);
}

static void run_attention(enum zt_dtype dt, int B, int T, int C, int NH)
{
    const size_t es = zt_dtype_size(dt);
    char name[96];
    float *qkv, *dout, *dqkv;
    void *d_qkv = dev_rand((size_t)B * T * 3 * C, 1.5f, dt, &qkv);
    void *d_out = dev_alloc((size_t)B * T * C * es);
    float *d_lse = dev_alloc(sizeof(float) * B * NH * T);
    att_forward(d_out, d_lse, d_qkv, B, T, C, NH, dt, g_stream);
    float *out = dev_download(d_out, (size_t)B * T * C, dt);
    float *lse = dev_download(d_lse, (size_t)B * NH * T, ZT_DTYPE_F32);
    float *rout = malloc(sizeof(float) * B * T * C), *rlse = malloc(sizeof(float) * B * NH * T);
    zt_cpu_attention_forward(rout, rlse, qkv, B, T, C, NH);
    snprintf(name, sizeof(name), "attention B%d T%d C%d NH%d fwd out", B, T, C, NH);
    check_close(name, dt, out, rout, (size_t)B * T * C, attention_tol(dt));
    snprintf(name, sizeof(name), "attention B%d T%d C%d NH%d fwd lse", B, T, C, NH);
    check_close(name, dt, lse, rlse, (size_t)B * NH * T, dt == ZT_DTYPE_F32 ? 1e-5 : 1e-4);

    /* Backward from the GPU's own out and lse (fed to the CPU too), accumulating into random dqkv. */
    void *d_dout = dev_rand((size_t)B * T * C, 1.0f, dt, &dout);
    void *d_dqkv = dev_rand((size_t)B * T * 3 * C, 0.5f, dt, &dqkv);
    void *d_dqkv0 = dev_clone(d_dqkv, (size_t)B * T * 3 * C * es);
    void *scratch = dev_alloc(att_scratch_bytes(B, T, NH, NH, C / NH, true));
    att_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, scratch, dt, g_stream);
    float *g_dqkv = dev_download(d_dqkv, (size_t)B * T * 3 * C, dt);
    zt_cpu_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    /* Compare q, k and v parts separately: their scales differ. */
    const char *part[3] = {"dq", "dk", "dv"};
    size_t n = (size_t)B * T * C;
    float *gp = malloc(sizeof(float) * n), *rp = malloc(sizeof(float) * n);
    for (int p = 0; p < 3; p++) {
        for (size_t bt = 0; bt < (size_t)B * T; bt++) {
            memcpy(gp + bt * C, g_dqkv + bt * 3 * C + (size_t)p * C, sizeof(float) * C);
            memcpy(rp + bt * C, dqkv + bt * 3 * C + (size_t)p * C, sizeof(float) * C);
        }
        snprintf(name, sizeof(name), "attention B%d T%d C%d NH%d bwd %s", B, T, C, NH, part[p]);
        check_close(name, dt, gp, rp, n, attention_tol(dt));
    }

    void *d_dqkv1 = dev_clone(d_dqkv, (size_t)B * T * 3 * C * es);
    dev_copy(d_dqkv, d_dqkv0, (size_t)B * T * 3 * C * es);
    att_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, scratch, dt, g_stream);
    assert_true(dev_equal(d_dqkv, d_dqkv1, (size_t)B * T * 3 * C * es));

    /* The overwrite variant: dqkv starts as NaN (all bits set), which it must never read, and ends with the
     * values the accumulating launcher adds into a zeroed dqkv (equal as numbers: +0 and -0 may differ).
     * Checked against that rather than the CPU, whose accuracy the test above covers: with T = 1 the exact
     * dq is 0 and both sides hold only rounding noise. Twice the same bits. */
    const size_t n3 = (size_t)B * T * 3 * C;
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dqkv, 0, n3 * es, g_stream));
    att_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, scratch, dt, g_stream);
    float *want = dev_download(d_dqkv, n3, dt);
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dqkv, 0xff, n3 * es, g_stream));
    att_backward_overwrite(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, scratch, dt, g_stream);
    float *o_dqkv = dev_download(d_dqkv, n3, dt);
    size_t unequal = 0;
    for (size_t i = 0; i < n3; i++)
        unequal += !(o_dqkv[i] == want[i]);
    printf("  attention B%d T%d C%d NH%d bwd overwrite %-4s %zu of %zu elements differ from zeroed + added\n", B, T,
           C, NH, zt_dtype_name(dt), unequal, n3);
    assert_int_equal(unequal, 0);
    dev_copy(d_dqkv1, d_dqkv, n3 * es);
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dqkv, 0xff, n3 * es, g_stream));
    att_backward_overwrite(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, scratch, dt, g_stream);
    assert_true(dev_equal(d_dqkv, d_dqkv1, n3 * es));
    free(o_dqkv), free(want);

    free(qkv), free(dout), free(dqkv), free(out), free(lse), free(rout), free(rlse), free(g_dqkv), free(gp), free(rp);
    void *dev[] = {d_qkv, d_out, d_lse, d_dout, d_dqkv, d_dqkv0, scratch, d_dqkv1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
}

/* The padding mask (zt_cuda_attention_*_masked) against the causal CPU kernel: with a causal mask, rows
 * below a sequence's length never see the keys past it, so the expected output is the CPU's causal output
 * with rows t >= len[b] set to zero (lse +inf), and the expected gradients are the CPU's with those rows
 * of dout set to zero (they then add nothing anywhere). */
static void run_attention_masked(enum zt_dtype dt, int B, int T, int C, int NH, const int32_t *lens)
{
    const size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C;
    char name[96];
    float *qkv, *dout, *dqkv;
    void *d_qkv = dev_rand(n3, 1.5f, dt, &qkv);
    void *d_out = dev_rand(n, 1.0f, dt, &dout); /* garbage that the padded rows must not keep */
    free(dout);
    float *d_lse = dev_alloc(sizeof(float) * B * NH * T);
    int32_t *d_lens = dev_alloc(sizeof(int32_t) * B);
    ZT_CUDA_CHECK(cudaMemcpy(d_lens, lens, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
    att_forward_masked(d_out, d_lse, d_qkv, d_lens, B, T, C, NH, dt, g_stream);
    float *out = dev_download(d_out, n, dt);
    float *lse = dev_download(d_lse, (size_t)B * NH * T, ZT_DTYPE_F32);
    float *rout = malloc(sizeof(float) * n), *rlse = malloc(sizeof(float) * B * NH * T);
    zt_cpu_attention_forward(rout, rlse, qkv, B, T, C, NH);
    int padded_ok = 1;
    for (int b = 0; b < B; b++)
        for (int t = lens[b] < 0 ? 0 : lens[b]; t < T; t++) {
            memset(rout + ((size_t)b * T + t) * C, 0, sizeof(float) * C);
            for (int h = 0; h < NH; h++) {
                size_t i = ((size_t)b * NH + h) * T + t;
                padded_ok &= isinf(lse[i]) && lse[i] > 0;
                lse[i] = rlse[i]; /* finite for the comparison and for the CPU backward below */
            }
        }
    snprintf(name, sizeof(name), "attention masked B%d T%d C%d NH%d fwd out", B, T, C, NH);
    check_close(name, dt, out, rout, n, attention_tol(dt));
    snprintf(name, sizeof(name), "attention masked B%d T%d C%d NH%d fwd lse", B, T, C, NH);
    check_close(name, dt, lse, rlse, (size_t)B * NH * T, dt == ZT_DTYPE_F32 ? 1e-5 : 1e-4);
    assert_true(padded_ok);

    void *d_dout = dev_rand(n, 1.0f, dt, &dout);
    void *d_dqkv = dev_rand(n3, 0.5f, dt, &dqkv);
    void *scratch = dev_alloc(att_scratch_bytes(B, T, NH, NH, C / NH, true));
    att_backward_masked(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_lens, B, T, C, NH, scratch, dt,
                                      g_stream);
    float *g_dqkv = dev_download(d_dqkv, n3, dt);
    for (int b = 0; b < B; b++)
        for (int t = lens[b] < 0 ? 0 : lens[b]; t < T; t++)
            memset(dout + ((size_t)b * T + t) * C, 0, sizeof(float) * C);
    zt_cpu_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    snprintf(name, sizeof(name), "attention masked B%d T%d C%d NH%d bwd dqkv", B, T, C, NH);
    check_close(name, dt, g_dqkv, dqkv, n3, attention_tol(dt));

    free(qkv), free(dout), free(dqkv), free(out), free(lse), free(rout), free(rlse), free(g_dqkv);
    void *dev[] = {d_qkv, d_out, d_lse, d_lens, d_dout, d_dqkv, scratch};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
}

static void test_attention(void **state)
{
    (void)state;
    assert_true(zt_cuda_attention_supported(768, 12));
    assert_true(zt_cuda_attention_supported(256, 2));
    assert_true(zt_cuda_attention_supported(96, 3));  /* head size 32 */
    assert_true(zt_cuda_attention_supported(400, 5)); /* head size 80 */
    assert_true(zt_cuda_attention_supported(480, 5)); /* head size 96 */
    assert_false(zt_cuda_attention_supported(768, 10));
    assert_false(zt_cuda_attention_supported(200, 5)); /* head size 40: refused, the caller reports it */
    assert_false(zt_cuda_attention_supported(0, 5));
    assert_false(zt_cuda_attention_supported(48, 3)); /* head size 16 */
    if (g_cc_major >= 8)
        assert_true(zt_cuda_attention_supported(256 * 4, 4)); /* head size 256 */
    /* Pass 0: the default path for every dtype, with the mma.sync kernels preferred (bf16 and fp16 on
     * sm_80+) at 32 rows per warp; pass 1: the mma.sync kernels at 16 rows
     * per warp; pass 2: bf16 and fp16 with the WMMA kernels; pass 3: the CUDA-core kernels; passes 4 and 5:
     * the generic kernels, forced, on the tensor cores (bf16 and fp16 on sm_80+) and on the CUDA cores;
     * passes 6 and 7: the mma.sync backward in a single pass at 32 and 16 rows per warp. */
    static const char *what[8] = {"mma.sync preferred, 32 rows per warp", "mma.sync, 16 rows per warp",
                                  "WMMA (mma.sync off)", "CUDA cores only", "generic kernels forced",
                                  "generic kernels forced, CUDA cores only", "mma.sync, single-pass backward",
                                  "mma.sync, 16 rows per warp, single-pass backward"};
    const int32_t lens[3] = {150, 97, 0}, lens128[2] = {64, 130}, lens_long[2] = {300, 257};
    for (int pass = 0; pass < 8; pass++) {
        g_att_variant = (zt_attention_variant){.cuda_cores = pass == 3 || pass == 5, .wmma = pass == 2,
                                               .generic = pass == 4 || pass == 5,
                                               .mma_warp_rows = pass == 1 || pass == 7 ? 16 : 0,
                                               .single_pass = pass >= 6};
        g_attention_tc = pass < 3 || pass == 4 || pass >= 6;
        printf("  -- attention: %s\n", what[pass]);
        for (int i = pass == 0 || pass == 4 || pass == 5 ? 0 : 1; i < 3; i++) {
            run_attention(k_dtypes[i], 2, 67, 256, 4);   /* head size 64, T not a multiple of any tile */
            run_attention(k_dtypes[i], 1, 130, 256, 2);  /* head size 128 */
            run_attention(k_dtypes[i], 2, 200, 512, 4);  /* head size 128, several tiles */
            run_attention(k_dtypes[i], 1, 1030, 128, 2); /* long sequence */
            run_attention(k_dtypes[i], 2, 1, 128, 1);    /* a single position */
            run_attention(k_dtypes[i], 1, 192, 128, 2);  /* head size 64: 1.5 tiles of 128 rows */
            run_attention_masked(k_dtypes[i], 3, 150, 256, 4, lens);  /* full, partial, empty */
            run_attention_masked(k_dtypes[i], 2, 130, 256, 2, lens128); /* head size 128, a tile edge */
            run_attention_masked(k_dtypes[i], 2, 320, 128, 2, lens_long); /* head size 64, lengths inside a tile */
        }
    }
    g_att_variant = (zt_attention_variant){0};
    /* The multi-head launchers at the head sizes only the generic kernels serve (GPT-2-like models), by
     * default on the tensor cores for bf16 and fp16 (sm_80+). */
    g_attention_tc = 1;
    for (int i = 0; i < 3; i++) {
        run_attention(k_dtypes[i], 2, 67, 400, 5);  /* 5 heads of 80 */
        run_attention(k_dtypes[i], 1, 100, 96, 3);  /* 3 heads of 32 */
        run_attention(k_dtypes[i], 2, 33, 480, 5);  /* 5 heads of 96 */
        run_attention_masked(k_dtypes[i], 3, 150, 400, 5, lens);
    }
}

/* ---- attention, general entry points: grouped-query heads, bidirectional, padding ---- */

/* One general shape on the GPU against the CPU twin: forward (padded rows zeros and +inf), backward from
 * the GPU's out and lse accumulating into random dqkv (q, k and v parts compared separately), the same bits
 * on a second run, and the overwrite variant against zeroed + accumulated. lens: host lengths or NULL. */
static void run_attention_gqa(enum zt_dtype dt, int B, int T, int NH, int NKV, int HS, bool causal,
                              const int32_t *lens, double tol)
{
    const zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .causal = causal};
    const int W = (NH + 2 * NKV) * HS, OW = NH * HS;
    const size_t es = zt_dtype_size(dt), n3 = (size_t)B * T * W, n = (size_t)B * T * OW;
    char name[128], shape[80];
    snprintf(shape, sizeof(shape), "B%d T%d NH%d NKV%d HS%d %s%s", B, T, NH, NKV, HS,
             causal ? "causal" : "bidirectional", lens ? " padded" : "");
    assert_true(zt_cuda_attention_gqa_supported(&d));
    float *qkv, *dout, *dqkv, *junk;
    void *d_qkv = dev_rand(n3, 1.5f, dt, &qkv);
    void *d_out = dev_rand(n, 1.0f, dt, &junk); /* garbage that padded rows must not keep */
    free(junk);
    float *d_lse = dev_alloc(sizeof(float) * B * NH * T);
    int32_t *d_lens = NULL;
    if (lens) {
        d_lens = dev_alloc(sizeof(int32_t) * B);
        ZT_CUDA_CHECK(cudaMemcpy(d_lens, lens, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
    }
    att_forward_gqa(d_out, d_lse, d_qkv, d_lens, &d, dt, g_stream);
    float *out = dev_download(d_out, n, dt), *lse = dev_download(d_lse, (size_t)B * NH * T, ZT_DTYPE_F32);
    float *rout = malloc(sizeof(float) * n), *rlse = malloc(sizeof(float) * B * NH * T);
    zt_cpu_attention_forward_gqa(rout, rlse, qkv, lens, &d);
    snprintf(name, sizeof(name), "attention %s fwd out", shape);
    check_close(name, dt, out, rout, n, tol);
    int padded_ok = 1;
    for (size_t i = 0; i < (size_t)B * NH * T; i++)
        if (isinf(rlse[i])) {
            padded_ok &= isinf(lse[i]) && lse[i] > 0;
            lse[i] = rlse[i] = 0.0f; /* finite for the comparison */
        }
    snprintf(name, sizeof(name), "attention %s fwd lse", shape);
    check_close(name, dt, lse, rlse, (size_t)B * NH * T, dt == ZT_DTYPE_F32 ? 1e-5 : 1e-4);
    assert_true(padded_ok);
    free(lse);
    lse = dev_download(d_lse, (size_t)B * NH * T, ZT_DTYPE_F32); /* the GPU's, +inf included, for the CPU */

    void *d_dout = dev_rand(n, 1.0f, dt, &dout);
    void *d_dqkv = dev_rand(n3, 0.5f, dt, &dqkv);
    void *d_dqkv0 = dev_clone(d_dqkv, n3 * es);
    void *scratch = dev_alloc(att_scratch_bytes(d.B, d.T, d.NH, d.NKV, d.HS, d.causal));
    att_backward_gqa(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_lens, &d, true, scratch, dt, g_stream);
    float *g_dqkv = dev_download(d_dqkv, n3, dt);
    zt_cpu_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, &d);
    const char *part[3] = {"dq", "dk", "dv"};
    const int col[4] = {0, NH * HS, (NH + NKV) * HS, W};
    float *gp = malloc(sizeof(float) * n), *rp = malloc(sizeof(float) * n);
    for (int p = 0; p < 3; p++) {
        const int w = col[p + 1] - col[p];
        for (size_t bt = 0; bt < (size_t)B * T; bt++) {
            memcpy(gp + bt * w, g_dqkv + bt * W + col[p], sizeof(float) * w);
            memcpy(rp + bt * w, dqkv + bt * W + col[p], sizeof(float) * w);
        }
        snprintf(name, sizeof(name), "attention %s bwd %s", shape, part[p]);
        check_close(name, dt, gp, rp, (size_t)B * T * w, tol);
    }

    /* The same call from the same state: the same bits. */
    void *d_dqkv1 = dev_clone(d_dqkv, n3 * es);
    dev_copy(d_dqkv, d_dqkv0, n3 * es);
    att_backward_gqa(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_lens, &d, true, scratch, dt, g_stream);
    assert_true(dev_equal(d_dqkv, d_dqkv1, n3 * es));

    /* Overwrite: from NaN (all bits set), the values that accumulating into zeros gives. */
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dqkv, 0, n3 * es, g_stream));
    att_backward_gqa(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_lens, &d, true, scratch, dt, g_stream);
    float *want = dev_download(d_dqkv, n3, dt);
    ZT_CUDA_CHECK(cudaMemsetAsync(d_dqkv, 0xff, n3 * es, g_stream));
    att_backward_gqa(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_lens, &d, false, scratch, dt, g_stream);
    float *o_dqkv = dev_download(d_dqkv, n3, dt);
    size_t unequal = 0;
    for (size_t i = 0; i < n3; i++)
        unequal += !(o_dqkv[i] == want[i]);
    if (unequal)
        printf("  attention %s bwd overwrite %s: %zu of %zu elements differ from zeroed + added\n", shape,
               zt_dtype_name(dt), unequal, n3);
    assert_int_equal(unequal, 0);

    free(qkv), free(dout), free(dqkv), free(out), free(lse), free(rout), free(rlse), free(g_dqkv), free(gp), free(rp);
    free(want), free(o_dqkv);
    void *dev[] = {d_qkv, d_out, d_lse, d_dout, d_dqkv, d_dqkv0, scratch, d_dqkv1};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dev_free(dev[i]);
    if (d_lens)
        dev_free(d_lens);
}

/* Every general shape, with the tensor-core kernels allowed or not (g_attention_tc set to match). */
static void run_attention_gqa_shapes(enum zt_dtype dt)
{
    const int32_t bert[4] = {129, 77, 0, 1}, two[2] = {100, 51}, odd[3] = {33, 500, -3};
    const double tol = attention_tol(dt);
    run_attention_gqa(dt, 2, 67, 6, 2, 128, true, NULL, tol);    /* grouped-query, ratio 3 */
    run_attention_gqa(dt, 1, 130, 8, 2, 128, true, NULL, tol);   /* LLaMA-3's ratio 4, past two tiles */
    run_attention_gqa(dt, 4, 129, 12, 12, 64, false, bert, tol); /* BERT-base: bidirectional, padded */
    run_attention_gqa(dt, 2, 100, 5, 5, 80, true, two, tol);     /* 5 heads of 80, causal, padded */
    run_attention_gqa(dt, 3, 33, 4, 1, 96, false, odd, tol);     /* one key/value head; lengths past T, < 0 */
    run_attention_gqa(dt, 2, 200, 3, 3, 32, false, NULL, tol);   /* head size 32, bidirectional */
    run_attention_gqa(dt, 2, 1, 6, 3, 64, true, NULL, tol);      /* a single position */
    run_attention_gqa(dt, 1, 70, 6, 2, 80, false, NULL, tol);    /* bidirectional grouped-query */
    /* Head sizes the packed kernels are not built for: the descriptor's general kernels behind the same entry. */
    run_attention_gqa(dt, 2, 90, 4, 2, 40, true, NULL, tol);     /* 40, causal, grouped-query */
    run_attention_gqa(dt, 2, 120, 3, 3, 48, false, two, tol);    /* 48, bidirectional, padded */
    run_attention_gqa(dt, 1, 77, 2, 1, 112, true, NULL, tol);    /* 112, one key/value head */
    if (zt_cuda_attention_supported(1024, 4)) {
        run_attention_gqa(dt, 2, 50, 2, 1, 256, true, NULL, tol);
        run_attention_gqa(dt, 2, 40, 4, 4, 256, false, two, tol);
    } else {
        printf("  attention head size 256 skipped: this GPU has too little shared memory per block\n");
    }
    /* The tuned kernels' shapes through the general entry points: the mma.sync kernels with their two-pass
     * backward, with the single pass, and the generic kernels. */
    for (int family = 0; family < 3; family++) {
        g_att_variant.generic = family == 2;
        g_att_variant.single_pass = family == 1;
        run_attention_gqa(dt, 2, 67, 4, 4, 64, true, NULL, tol);
        run_attention_gqa(dt, 2, 150, 2, 2, 128, true, two, tol);
        /* Grouped-query at the tuned head sizes (the mma.sync kernels for bf16 and fp16), padded too. */
        run_attention_gqa(dt, 2, 150, 8, 2, 64, true, two, tol);
        run_attention_gqa(dt, 1, 200, 6, 3, 128, true, NULL, tol);
        /* Bidirectional at the tuned head sizes (BERT's; the mma.sync kernels for bf16 and fp16): padded,
         * lengths past T and below 0, grouped-query, a length inside the first and the last tile. */
        run_attention_gqa(dt, 3, 130, 4, 4, 64, false, odd, tol);
        run_attention_gqa(dt, 2, 150, 2, 2, 128, false, two, tol);
        run_attention_gqa(dt, 2, 67, 6, 2, 64, false, NULL, tol);
        run_attention_gqa(dt, 4, 192, 3, 1, 128, false, bert, tol);
    }
    g_att_variant.generic = false;
    g_att_variant.single_pass = false;
}

static void test_attention_gqa(void **state)
{
    (void)state;
    const zt_attention_dims bad_ratio = {.B = 1, .T = 8, .NH = 6, .NKV = 4, .HS = 64, .causal = true};
    const zt_attention_dims bad_hs = {.B = 1, .T = 8, .NH = 2, .NKV = 2, .HS = 300, .causal = true};
    const zt_attention_dims hs40 = {.B = 1, .T = 8, .NH = 5, .NKV = 5, .HS = 40, .causal = true};
    assert_true(zt_cuda_attention_gqa_supported(&hs40)); /* the general kernels, behind the same entry */
    assert_false(zt_cuda_attention_gqa_supported(&bad_ratio));
    assert_false(zt_cuda_attention_gqa_supported(&bad_hs));
    /* Pass 0: the default kernels (tensor cores for bf16 and fp16 on sm_80+); pass 1: CUDA cores only. */
    for (int pass = 0; pass < 2; pass++) {
        g_att_variant.cuda_cores = pass != 0;
        g_attention_tc = pass == 0;
        printf("  -- general attention: %s\n", pass == 0 ? "default kernels" : "CUDA cores only");
        for (int i = 0; i < 3; i++)
            run_attention_gqa_shapes(k_dtypes[i]);
    }
    g_att_variant.cuda_cores = false;
}

/* ---- AdamW ---- */

/* A copy of bytes of d at byte offset shift of a new buffer *base; d is freed. */
static void *dev_shift(void *d, size_t bytes, size_t shift, void **base)
{
    *base = dev_alloc(bytes + shift);
    ZT_CUDA_CHECK(cudaMemcpy((char *)*base + shift, d, bytes, cudaMemcpyDeviceToDevice));
    dev_free(d);
    return (char *)*base + shift;
}

/* shift (elements) moves every device tensor off its 16-byte alignment when odd, to reach the kernel's
 * one-element-at-a-time path. */
static void run_adamw(enum zt_dtype gdt, enum zt_dtype ldt, const size_t *sizes, int count, int shift)
{
    zt_adamw_params p = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 2.0f, .step = 3};
    zt_cuda_adamw_tensor *t = calloc(count, sizeof(*t));
    float **hp = calloc(count, sizeof(float *)), **hm = calloc(count, sizeof(float *));
    float **hv = calloc(count, sizeof(float *)), **hg = calloc(count, sizeof(float *));
    void **base = calloc((size_t)count * 5, sizeof(void *)); /* with shift: the allocations */
    for (int i = 0; i < count; i++) {
        size_t n = sizes[i];
        hp[i] = host_rand(n, 1.0f);
        hm[i] = host_rand(n, 0.01f);
        hv[i] = host_rand(n, 1e-4f);
        for (size_t k = 0; k < n; k++)
            hv[i][k] = fabsf(hv[i][k]);
        t[i].param = dev_upload(hp[i], n, ZT_DTYPE_F32);
        t[i].m = dev_upload(hm[i], n, ZT_DTYPE_F32);
        t[i].v = dev_upload(hv[i], n, ZT_DTYPE_F32);
        t[i].grad = dev_rand(n, 0.02f, gdt, &hg[i]);
        t[i].param_lowp = dev_alloc(n * zt_dtype_size(ldt));
        if (shift) {
            const size_t gs = zt_dtype_size(gdt), ls = zt_dtype_size(ldt), sh = (size_t)shift;
            t[i].param = dev_shift(t[i].param, n * 4, sh * 4, &base[5 * i]);
            t[i].m = dev_shift(t[i].m, n * 4, sh * 4, &base[5 * i + 1]);
            t[i].v = dev_shift(t[i].v, n * 4, sh * 4, &base[5 * i + 2]);
            t[i].grad = dev_shift((void *)t[i].grad, n * gs, sh * gs, &base[5 * i + 3]);
            t[i].param_lowp = dev_shift(t[i].param_lowp, n * ls, sh * ls, &base[5 * i + 4]);
        }
        t[i].n = n;
        t[i].weight_decay = i % 2 == 0;
    }
    float *d_half = dev_alloc(sizeof(float)), half = 0.5f;
    int *d_skip = dev_alloc(sizeof(int)), one = 1, zero = 0;
    ZT_CUDA_CHECK(cudaMemcpy(d_half, &half, sizeof(float), cudaMemcpyHostToDevice));

    /* With the skip flag set nothing changes. */
    ZT_CUDA_CHECK(cudaMemcpy(d_skip, &one, sizeof(int), cudaMemcpyHostToDevice));
    void *before = dev_clone(t[0].param, sizes[0] * sizeof(float));
    zt_cuda_adamw_update(t, count, &p, gdt, ldt, d_half, d_skip, g_stream);
    assert_true(dev_equal(before, t[0].param, sizes[0] * sizeof(float)));
    dev_free(before);

    /* Step: grad_scale 2 on the host times 0.5 on the device. */
    ZT_CUDA_CHECK(cudaMemcpy(d_skip, &zero, sizeof(int), cudaMemcpyHostToDevice));
    zt_cuda_adamw_update(t, count, &p, gdt, ldt, d_half, d_skip, g_stream);
    zt_adamw_params pc = p;
    pc.grad_scale = 1.0f;
    for (int i = 0; i < count; i++) {
        size_t n = sizes[i];
        pc.weight_decay = t[i].weight_decay ? p.weight_decay : 0.0f;
        zt_cpu_adamw_update(hp[i], hm[i], hv[i], hg[i], n, &pc);
        float *gp = dev_download(t[i].param, n, ZT_DTYPE_F32), *gm = dev_download(t[i].m, n, ZT_DTYPE_F32);
        float *gv = dev_download(t[i].v, n, ZT_DTYPE_F32);
        check_close("adamw param", gdt, gp, hp[i], n, 1e-5);
        check_close("adamw m", gdt, gm, hm[i], n, 1e-5);
        check_close("adamw v", gdt, gv, hv[i], n, 1e-5);
        /* The low-precision copy is exactly the new fp32 weights rounded. */
        void *rounded = dev_alloc(n * zt_dtype_size(ldt));
        zt_cuda_cast(rounded, ldt, t[i].param, ZT_DTYPE_F32, n, g_stream);
        assert_true(dev_equal(rounded, t[i].param_lowp, n * zt_dtype_size(ldt)));
        dev_free(rounded);
        free(gp), free(gm), free(gv);
    }
    for (int i = 0; i < count; i++) {
        free(hp[i]), free(hm[i]), free(hv[i]), free(hg[i]);
        if (shift) {
            for (int k = 0; k < 5; k++)
                dev_free(base[5 * i + k]);
        } else {
            dev_free(t[i].param), dev_free(t[i].m), dev_free(t[i].v), dev_free((void *)t[i].grad);
            dev_free(t[i].param_lowp);
        }
    }
    free(t), free(hp), free(hm), free(hv), free(hg), free(base);
    dev_free(d_half), dev_free(d_skip);
}

static void test_adamw(void **state)
{
    (void)state;
    const size_t sizes[] = {1000003, 777, 65536 * 3 + 5, 1};
    for (int i = 0; i < 3; i++)
        run_adamw(k_dtypes[i], k_dtypes[i], sizes, 4, 0);
    run_adamw(ZT_DTYPE_F32, ZT_DTYPE_BF16, sizes, 4, 0);
    /* Tensors off their 16-byte alignment: one element at a time. */
    run_adamw(ZT_DTYPE_F32, ZT_DTYPE_BF16, sizes, 4, 1);
    run_adamw(ZT_DTYPE_BF16, ZT_DTYPE_F16, sizes, 4, 3);
    /* More tensors than one launch carries. */
    size_t many[150];
    for (int i = 0; i < 150; i++)
        many[i] = 100 + 37 * i;
    run_adamw(ZT_DTYPE_BF16, ZT_DTYPE_BF16, many, 150, 0);
    /* A tensor of hundreds of blocks between small ones. */
    const size_t big[] = {1000, 65536 * 330 + 17, 5000};
    run_adamw(ZT_DTYPE_F32, ZT_DTYPE_F16, big, 3, 0);
}

/* ---- gradient fold: dst = src * scale or dst += src * scale ---- */

static void test_accumulate(void **state)
{
    (void)state;
    const size_t n = 100003;
    for (int i = 0; i < 3; i++) {
        enum zt_dtype dt = k_dtypes[i];
        const size_t es = zt_dtype_size(dt);
        float *hs, *hd;
        void *src = dev_rand(n + 1, 1.0f, dt, &hs);
        float *dst = dev_rand(n + 1, 1.0f, ZT_DTYPE_F32, &hd);
        /* Aligned (four elements at a time, then the ragged end), then src and dst off by one element. */
        for (int off = 0; off < 2; off++)
            for (int overwrite = 0; overwrite < 2; overwrite++) {
                size_t len = n - (size_t)off;
                float *before = dev_download(dst + off, len, ZT_DTYPE_F32);
                zt_cuda_accumulate(dst + off, (const char *)src + off * es, dt, len, 0.25f, overwrite, g_stream);
                float *got = dev_download(dst + off, len, ZT_DTYPE_F32);
                for (size_t k = 0; k < len; k++) {
                    float x = hs[k + off] * 0.25f, want = overwrite ? x : before[k] + x;
                    if (got[k] != want) {
                        printf("  accumulate %s off %d overwrite %d [%zu]: got %.9g, want %.9g\n", zt_dtype_name(dt),
                               off, overwrite, k, got[k], want);
                        fail();
                    }
                }
                free(before), free(got);
            }
        free(hs), free(hd);
        dev_free(src), dev_free(dst);
    }
}

/* ---- global norm, clip, scale ---- */

static void test_norm(void **state)
{
    (void)state;
    float *d_partials = dev_alloc(sizeof(float) * ZT_CUDA_NORM_SLOTS), *d_out = dev_alloc(sizeof(float));
    float *d_out2 = dev_alloc(sizeof(float));
    for (int i = 0; i < 3; i++) {
        enum zt_dtype dt = k_dtypes[i];
        const size_t sizes[3] = {1000003, 3, 65537};
        float *h[3];
        void *d[3];
        double want = 0.0;
        for (int k = 0; k < 3; k++) {
            d[k] = dev_rand(sizes[k], 1.0f, dt, &h[k]);
            want += zt_cpu_sum_squares(h[k], sizes[k]);
        }
        /* One tensor. */
        zt_cuda_sum_squares(d_out, d_partials, d[0], sizes[0], dt, g_stream);
        float got = 0.0f;
        ZT_CUDA_CHECK(cudaMemcpy(&got, d_out, sizeof(float), cudaMemcpyDeviceToHost));
        float want0 = (float)zt_cpu_sum_squares(h[0], sizes[0]);
        check_close("sum of squares, one tensor", dt, &got, &want0, 1, 1e-5);
        /* Three tensors into the same slots, twice: same bits. */
        for (int rep = 0; rep < 2; rep++) {
            ZT_CUDA_CHECK(cudaMemsetAsync(d_partials, 0, sizeof(float) * ZT_CUDA_NORM_SLOTS, g_stream));
            for (int k = 0; k < 3; k++)
                zt_cuda_sum_squares_accumulate(d_partials, d[k], sizes[k], dt, g_stream);
            zt_cuda_sum_squares_finish(rep == 0 ? d_out : d_out2, d_partials, g_stream);
        }
        ZT_CUDA_CHECK(cudaMemcpy(&got, d_out, sizeof(float), cudaMemcpyDeviceToHost));
        float wantf = (float)want;
        check_close("sum of squares, three tensors", dt, &got, &wantf, 1, 1e-5);
        assert_true(dev_equal(d_out, d_out2, sizeof(float)));
        if (dt != ZT_DTYPE_F32) {
            /* The same values held in fp32 give the same bits (the model's norm over bf16 gradients). */
            void *d32[3];
            for (int k = 0; k < 3; k++)
                d32[k] = dev_upload(h[k], sizes[k], ZT_DTYPE_F32);
            ZT_CUDA_CHECK(cudaMemsetAsync(d_partials, 0, sizeof(float) * ZT_CUDA_NORM_SLOTS, g_stream));
            for (int k = 0; k < 3; k++)
                zt_cuda_sum_squares_accumulate(d_partials, d32[k], sizes[k], ZT_DTYPE_F32, g_stream);
            zt_cuda_sum_squares_finish(d_out2, d_partials, g_stream);
            assert_true(dev_equal(d_out, d_out2, sizeof(float)));
            for (int k = 0; k < 3; k++)
                dev_free(d32[k]);
        }

        /* Scale in place. */
        zt_cuda_scale_inplace(d[0], 0.37f, sizes[0], dt, g_stream);
        float *gs = dev_download(d[0], sizes[0], dt);
        zt_cpu_scale_inplace(h[0], 0.37f, sizes[0]);
        check_close("scale_inplace", dt, gs, h[0], sizes[0], tol_of(dt));
        free(gs);
        for (int k = 0; k < 3; k++)
            free(h[k]), dev_free(d[k]);
    }
    /* Clip coefficient: norm 4 against max 1 and max 10, and clipping off. */
    float sumsq = 16.0f, s = 0.0f;
    ZT_CUDA_CHECK(cudaMemcpy(d_out, &sumsq, sizeof(float), cudaMemcpyHostToDevice));
    zt_cuda_clip_scale(d_out2, d_out, 1.0f, g_stream);
    ZT_CUDA_CHECK(cudaMemcpy(&s, d_out2, sizeof(float), cudaMemcpyDeviceToHost));
    assert_float_equal(s, 1.0f / (4.0f + 1e-6f), 1e-7);
    zt_cuda_clip_scale(d_out2, d_out, 10.0f, g_stream);
    ZT_CUDA_CHECK(cudaMemcpy(&s, d_out2, sizeof(float), cudaMemcpyDeviceToHost));
    assert_true(s == 1.0f);
    zt_cuda_clip_scale(d_out2, d_out, 0.0f, g_stream);
    ZT_CUDA_CHECK(cudaMemcpy(&s, d_out2, sizeof(float), cudaMemcpyDeviceToHost));
    assert_true(s == 1.0f);
    dev_free(d_partials), dev_free(d_out), dev_free(d_out2);
}

/* ---- casts and the inf/NaN check ---- */

/* fp32 -> bf16 -> fp32 with round-to-nearest-even, on the host, for finite values. */
static float host_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float dev_roundtrip(float x, enum zt_dtype dt)
{
    float y = x;
    void *d = dev_upload(&y, 1, dt);
    dev_free(d);
    return y;
}

static void test_cast(void **state)
{
    (void)state;
    size_t n = 100000;
    float *h = host_rand(n, 100.0f);
    h[0] = 1.0f + 1.0f / 256.0f; /* bf16 tie: rounds to even (1.0) */
    h[1] = 1.0f + 3.0f / 256.0f; /* bf16 tie: rounds up to even */
    float *x = host_copy(h, n);
    void *d = dev_upload(x, n, ZT_DTYPE_BF16);
    for (size_t i = 0; i < n; i++)
        if (x[i] != host_bf16_round(h[i])) {
            printf("  bf16 cast of %.9g: got %.9g, want %.9g\n", h[i], x[i], host_bf16_round(h[i]));
            fail();
        }
    assert_true(x[0] == 1.0f && x[1] == 1.0f + 4.0f / 256.0f);
    /* bf16 -> f16 -> f32 of values both types hold exactly. */
    void *d16 = dev_alloc(n * 2);
    zt_cuda_cast(d16, ZT_DTYPE_F16, d, ZT_DTYPE_BF16, n, g_stream);
    float *back = dev_download(d16, n, ZT_DTYPE_F16);
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(back[i] - x[i]) <= fabsf(x[i]) * (1.0f / 1024.0f) + 6e-8f);
    dev_free(d), dev_free(d16), free(h), free(x), free(back);

    /* fp16 rounding: ties to even, overflow to inf, exact small integers. */
    assert_true(dev_roundtrip(1.0f + 1.0f / 2048.0f, ZT_DTYPE_F16) == 1.0f);
    assert_true(dev_roundtrip(1.0f + 3.0f / 2048.0f, ZT_DTYPE_F16) == 1.0f + 4.0f / 2048.0f);
    assert_true(dev_roundtrip(2047.0f, ZT_DTYPE_F16) == 2047.0f);
    assert_true(isinf(dev_roundtrip(65520.0f, ZT_DTYPE_F16)));
    assert_true(dev_roundtrip(65504.0f, ZT_DTYPE_F16) == 65504.0f);
    assert_true(dev_roundtrip(-0.5f, ZT_DTYPE_BF16) == -0.5f);
    assert_true(dev_roundtrip(3.0e38f, ZT_DTYPE_BF16) == host_bf16_round(3.0e38f));
}

static void test_check_finite(void **state)
{
    (void)state;
    int *d_flag = dev_alloc(sizeof(int));
    const size_t n = 100003;
    for (int i = 0; i < 3; i++) {
        enum zt_dtype dt = k_dtypes[i];
        float *h = host_rand(n, 100.0f);
        void *d = dev_upload(h, n, dt);
        int flag = -1;
        ZT_CUDA_CHECK(cudaMemsetAsync(d_flag, 0, sizeof(int), g_stream));
        zt_cuda_check_finite(d_flag, d, n, dt, g_stream);
        dev_sync();
        ZT_CUDA_CHECK(cudaMemcpy(&flag, d_flag, sizeof(int), cudaMemcpyDeviceToHost));
        assert_int_equal(flag, 0);
        dev_free(d);

        const float bad[3] = {INFINITY, -INFINITY, NAN};
        const size_t where[3] = {n - 1, 0, n / 2};
        for (int k = 0; k < 3; k++) {
            float *hb = host_copy(h, n);
            hb[where[k]] = bad[k];
            d = dev_upload(hb, n, dt);
            ZT_CUDA_CHECK(cudaMemsetAsync(d_flag, 0, sizeof(int), g_stream));
            zt_cuda_check_finite(d_flag, d, n, dt, g_stream);
            ZT_CUDA_CHECK(cudaMemcpy(&flag, d_flag, sizeof(int), cudaMemcpyDeviceToHost));
            assert_int_equal(flag, 1);
            dev_free(d), free(hb);
        }
        if (dt == ZT_DTYPE_F16) { /* finite in fp32, inf once stored as fp16 */
            float *hb = host_copy(h, n);
            hb[7] = 1e5f;
            d = dev_upload(hb, n, dt);
            ZT_CUDA_CHECK(cudaMemsetAsync(d_flag, 0, sizeof(int), g_stream));
            zt_cuda_check_finite(d_flag, d, n, dt, g_stream);
            ZT_CUDA_CHECK(cudaMemcpy(&flag, d_flag, sizeof(int), cudaMemcpyDeviceToHost));
            assert_int_equal(flag, 1);
            dev_free(d), free(hb);
        }
        free(h);
    }
    dev_free(d_flag);
}

static int setup(void **state)
{
    (void)state;
    zt_err err;
    zt_rng_seed(&g_rng, 1234);
    zt_cpu_set_threads(0);
    ZT_CUDA_CHECK(cudaStreamCreate(&g_stream));
    if (zt_cuda_blas_create(&g_blas, 0, &err) != 0) {
        printf("cuBLASLt context: %s\n", err.msg);
        return -1;
    }
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&g_cc_major, cudaDevAttrComputeCapabilityMajor, 0));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    zt_cuda_blas_destroy(g_blas);
    ZT_CUDA_CHECK(cudaStreamDestroy(g_stream));
    return 0;
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: GPU tests skipped\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    ZT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cast),        cmocka_unit_test(test_check_finite), cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_embedding),   cmocka_unit_test(test_layernorm),    cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rmsnorm),     cmocka_unit_test(test_rope),
        cmocka_unit_test(test_crossentropy), cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_classifier_head),   cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_norm),        cmocka_unit_test(test_accumulate),
    };
    /* ZT_TEST_FILTER=test_attention (a glob) runs a subset, e.g. under compute-sanitizer. */
    const char *filter = getenv("ZT_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
