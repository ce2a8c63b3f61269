/* Tests of the float build of the CPU kernels (library zt_kernels_cpu, the one training uses).
 *
 * The float and double builds share symbol names, so they cannot be linked together: instead every
 * forward and backward here is compared with the naive double references of kernel_ref.h, fed the same
 * (float-rounded) inputs. The file also checks AdamW against PyTorch's formulation, the sum of squares,
 * and that results are bit-identical for 1 and 3 threads. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernel_ref.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cpu_threads.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

_Static_assert(sizeof(zt_real) == sizeof(float), "this test must link zt_kernels_cpu");

/* Accepted relative error of a float result against the double reference. */
#define F32_TOL 1e-4

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

/* Uniform in [-1, 1), from a fixed-seed xorshift. */
static double rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* Random floats times scale, and a double copy of the same values for the references. */
static float *rnd_floats(size_t n, double scale, double **as_double)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    double *d = malloc(sizeof(double) * (n ? n : 1));
    assert_true(f && d);
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(scale * rnd());
        d[i] = f[i];
    }
    if (as_double)
        *as_double = d;
    else
        free(d);
    return f;
}

static float *zero_floats(size_t n)
{
    float *f = calloc(n ? n : 1, sizeof(float));
    assert_non_null(f);
    return f;
}

static double *zero_doubles(size_t n)
{
    double *d = calloc(n ? n : 1, sizeof(double));
    assert_non_null(d);
    return d;
}

/* Fails unless got matches want to tol, relative to max(|got|, |want|, rms(want)): near-zero results of
 * long sums are judged against the typical magnitude of the output. */
static void expect_close_f(const char *what, const float *got, const double *want, size_t n, double tol)
{
    double rms = 0;
    for (size_t i = 0; i < n; i++)
        rms += want[i] * want[i];
    rms = n ? sqrt(rms / n) : 0;
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double den = fmax(fmax(fabs((double)got[i]), fabs(want[i])), fmax(rms, 1e-30));
        double err = fabs((double)got[i] - want[i]) / den;
        if (isnan(err) || err > worst) {
            worst = isnan(err) ? INFINITY : err;
            worst_i = i;
        }
    }
    if (worst > tol)
        fail_msg("%s: element %zu is %.9g, expected %.9g (relative error %.3g > %.3g)", what, worst_i,
                 (double)got[worst_i], want[worst_i], worst, tol);
}

/* ---- float build against the references ---- */

static void test_embedding(void **state)
{
    (void)state;
    enum { B = 3, T = 17, C = 40, V = 11 };
    int32_t tokens[B * T];
    for (int i = 0; i < B * T; i++)
        tokens[i] = (int32_t)((i * 7 + i / 5) % V);
    double *wte_d, *wpe_d, *dout_d;
    float *wte = rnd_floats(V * C, 1, &wte_d), *wpe = rnd_floats(T * C, 1, &wpe_d);
    float *dout = rnd_floats(B * T * C, 1, &dout_d);
    float *out = zero_floats(B * T * C), *dwte = zero_floats(V * C), *dwpe = zero_floats(T * C);
    double *want = zero_doubles(B * T * C), *rdwte = zero_doubles(V * C), *rdwpe = zero_doubles(T * C);
    zt_cpu_embedding_forward(out, tokens, wte, wpe, B, T, C);
    ref_embedding_forward(want, tokens, wte_d, wpe_d, B, T, C);
    expect_close_f("embedding forward", out, want, B * T * C, F32_TOL);
    zt_cpu_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    ref_embedding_backward(rdwte, rdwpe, dout_d, tokens, B, T, C, V);
    expect_close_f("embedding dwte", dwte, rdwte, V * C, F32_TOL);
    expect_close_f("embedding dwpe", dwpe, rdwpe, T * C, F32_TOL);

    /* Without positions (wpe and dwpe NULL): the rows of wte exactly, and the same dwte bits. */
    float *out0 = zero_floats(B * T * C), *dwte0 = zero_floats(V * C);
    zt_cpu_embedding_forward(out0, tokens, wte, NULL, B, T, C);
    for (int i = 0; i < B * T; i++)
        assert_memory_equal(out0 + (size_t)i * C, wte + (size_t)tokens[i] * C, sizeof(float) * C);
    zt_cpu_embedding_backward(dwte0, NULL, dout, tokens, B, T, C);
    assert_memory_equal(dwte0, dwte, sizeof(float) * V * C);
    free(out0);
    free(dwte0);

    /* With token types (BERT): three of them, the last never used. */
    enum { NTT = 3 };
    int32_t types[B * T];
    for (int i = 0; i < B * T; i++)
        types[i] = (int32_t)((i / 7) % 2);
    double *wtt_d;
    float *wtt = rnd_floats(NTT * C, 1, &wtt_d), *dwtt = zero_floats(NTT * C);
    double *rdwtt = zero_doubles(NTT * C);
    memset(dwte, 0, sizeof(float) * V * C);
    memset(dwpe, 0, sizeof(float) * T * C);
    zt_cpu_embedding_forward_typed(out, tokens, types, wte, wpe, wtt, B, T, C);
    ref_embedding_typed_forward(want, tokens, types, wte_d, wpe_d, wtt_d, B, T, C);
    expect_close_f("embedding forward with types", out, want, B * T * C, F32_TOL);
    zt_cpu_embedding_backward_typed(dwte, dwpe, dwtt, dout, tokens, types, B, T, C);
    ref_embedding_types_backward(rdwtt, dout_d, types, B, T, C, NTT);
    expect_close_f("embedding dwte with types", dwte, rdwte, V * C, F32_TOL);
    expect_close_f("embedding dwpe with types", dwpe, rdwpe, T * C, F32_TOL);
    expect_close_f("embedding dwtt", dwtt, rdwtt, NTT * C, F32_TOL);
    for (int c = 0; c < C; c++)
        assert_true(dwtt[2 * C + c] == 0.0f);
    free(wte); free(wpe); free(dout); free(out); free(dwte); free(dwpe); free(wtt); free(dwtt);
    free(wte_d); free(wpe_d); free(dout_d); free(want); free(rdwte); free(rdwpe); free(wtt_d); free(rdwtt);
}

static void test_layernorm(void **state)
{
    (void)state;
    enum { N = 37, C = 72 };
    double *inp_d, *w_d, *b_d, *dout_d;
    float *inp = rnd_floats(N * C, 3, &inp_d), *w = rnd_floats(C, 1, &w_d), *b = rnd_floats(C, 1, &b_d);
    float *dout = rnd_floats(N * C, 1, &dout_d);
    float *out = zero_floats(N * C), *mean = zero_floats(N), *rstd = zero_floats(N);
    float *dinp = zero_floats(N * C), *dw = zero_floats(C), *db = zero_floats(C);
    double *want = zero_doubles(N * C), *rmean = zero_doubles(N), *rrstd = zero_doubles(N);
    double *rdinp = zero_doubles(N * C), *rdw = zero_doubles(C), *rdb = zero_doubles(C);
    zt_cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, 1e-5f);
    ref_layernorm_forward(want, rmean, rrstd, inp_d, w_d, b_d, N, C, (double)1e-5f);
    expect_close_f("layernorm forward", out, want, N * C, F32_TOL);
    expect_close_f("layernorm mean", mean, rmean, N, F32_TOL);
    expect_close_f("layernorm rstd", rstd, rrstd, N, F32_TOL);
    zt_cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    ref_layernorm_backward(rdinp, rdw, rdb, dout_d, inp_d, w_d, rmean, rrstd, N, C);
    expect_close_f("layernorm dinp", dinp, rdinp, N * C, F32_TOL);
    expect_close_f("layernorm dweight", dw, rdw, C, F32_TOL);
    expect_close_f("layernorm dbias", db, rdb, C, F32_TOL);
    free(inp); free(w); free(b); free(dout); free(out); free(mean); free(rstd); free(dinp); free(dw); free(db);
    free(inp_d); free(w_d); free(b_d); free(dout_d); free(want); free(rmean); free(rrstd);
    free(rdinp); free(rdw); free(rdb);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    enum { N = 37, C = 75 }; /* C odd: no row is a multiple of a vector width */
    double *inp_d, *w_d, *dout_d;
    float *inp = rnd_floats(N * C, 3, &inp_d), *w = rnd_floats(C, 1, &w_d), *dout = rnd_floats(N * C, 1, &dout_d);
    float *out = zero_floats(N * C), *rstd = zero_floats(N), *dinp = zero_floats(N * C), *dw = zero_floats(C);
    double *want = zero_doubles(N * C), *rrstd = zero_doubles(N), *rdinp = zero_doubles(N * C), *rdw = zero_doubles(C);
    zt_cpu_rmsnorm_forward(out, rstd, inp, w, N, C, 1e-6f);
    ref_rmsnorm_forward(want, rrstd, inp_d, w_d, N, C, (double)1e-6f);
    expect_close_f("rmsnorm forward", out, want, N * C, F32_TOL);
    expect_close_f("rmsnorm rstd", rstd, rrstd, N, F32_TOL);
    zt_cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    ref_rmsnorm_backward(rdinp, rdw, dout_d, inp_d, w_d, rrstd, N, C);
    expect_close_f("rmsnorm dinp", dinp, rdinp, N * C, F32_TOL);
    expect_close_f("rmsnorm dweight", dw, rdw, C, F32_TOL);
    free(inp); free(w); free(dout); free(out); free(rstd); free(dinp); free(dw);
    free(inp_d); free(w_d); free(dout_d); free(want); free(rrstd); free(rdinp); free(rdw);
}

/* One matmul shape: forward with and without bias, and the three gradients. */
static void check_matmul(int n, int ic, int oc)
{
    double *inp_d, *w_d, *b_d, *dout_d;
    float *inp = rnd_floats((size_t)n * ic, 1, &inp_d), *w = rnd_floats((size_t)oc * ic, 1, &w_d);
    float *b = rnd_floats(oc, 1, &b_d), *dout = rnd_floats((size_t)n * oc, 1, &dout_d);
    float *out = zero_floats((size_t)n * oc), *dinp = zero_floats((size_t)n * ic);
    float *dw = zero_floats((size_t)oc * ic), *db = zero_floats(oc);
    double *want = zero_doubles((size_t)n * oc), *rdinp = zero_doubles((size_t)n * ic);
    double *rdw = zero_doubles((size_t)oc * ic), *rdb = zero_doubles(oc);
    char what[96];
    zt_cpu_matmul_forward(out, inp, w, b, n, ic, oc);
    ref_matmul_forward(want, inp_d, w_d, b_d, n, ic, oc);
    snprintf(what, sizeof(what), "matmul forward %dx%dx%d", n, ic, oc);
    expect_close_f(what, out, want, (size_t)n * oc, F32_TOL);
    zt_cpu_matmul_forward(out, inp, w, NULL, n, ic, oc);
    ref_matmul_forward(want, inp_d, w_d, NULL, n, ic, oc);
    snprintf(what, sizeof(what), "matmul forward without bias %dx%dx%d", n, ic, oc);
    expect_close_f(what, out, want, (size_t)n * oc, F32_TOL);
    zt_cpu_matmul_backward(dinp, dw, db, dout, inp, w, n, ic, oc);
    ref_matmul_backward(rdinp, rdw, rdb, dout_d, inp_d, w_d, n, ic, oc);
    snprintf(what, sizeof(what), "matmul dinp %dx%dx%d", n, ic, oc);
    expect_close_f(what, dinp, rdinp, (size_t)n * ic, F32_TOL);
    snprintf(what, sizeof(what), "matmul dweight %dx%dx%d", n, ic, oc);
    expect_close_f(what, dw, rdw, (size_t)oc * ic, F32_TOL);
    snprintf(what, sizeof(what), "matmul dbias %dx%dx%d", n, ic, oc);
    expect_close_f(what, db, rdb, oc, F32_TOL);
    free(inp); free(w); free(b); free(dout); free(out); free(dinp); free(dw); free(db);
    free(inp_d); free(w_d); free(b_d); free(dout_d); free(want); free(rdinp); free(rdw); free(rdb);
}

static void test_matmul(void **state)
{
    (void)state;
    check_matmul(3, 7, 5);
    check_matmul(67, 130, 97);
    /* Several cache blocks in every dimension, ragged at every edge. */
    check_matmul(301, 517, 263);
    check_matmul(1, 1, 1);
}

/* One attention shape, forward and backward against the reference. */
static void check_attention(int B, int T, int C, int NH)
{
    double *qkv_d, *dout_d;
    float *qkv = rnd_floats(B * T * 3 * C, 1.5, &qkv_d), *dout = rnd_floats(B * T * C, 1, &dout_d);
    float *out = zero_floats(B * T * C), *lse = zero_floats(B * NH * T), *dqkv = zero_floats(B * T * 3 * C);
    double *want = zero_doubles(B * T * C), *rdqkv = zero_doubles(B * T * 3 * C);
    zt_cpu_attention_forward(out, lse, qkv, B, T, C, NH);
    ref_attention_forward(want, qkv_d, B, T, C, NH);
    expect_close_f("attention forward", out, want, B * T * C, F32_TOL);
    zt_cpu_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    ref_attention_backward(rdqkv, dout_d, qkv_d, B, T, C, NH);
    expect_close_f("attention dqkv", dqkv, rdqkv, B * T * 3 * C, F32_TOL);
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(qkv_d); free(dout_d); free(want); free(rdqkv);
}

static void test_attention(void **state)
{
    (void)state;
    check_attention(2, 33, 48, 4);
    /* Longer than two key blocks of the online softmax. */
    check_attention(1, 150, 64, 2);
}

/* One general attention shape (grouped-query, causal or not, lengths or NULL) against the reference. */
static void check_attention_gqa(int B, int T, int NH, int NKV, int HS, int causal, const int32_t *lens)
{
    const int W = (NH + 2 * NKV) * HS, OW = NH * HS;
    zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .causal = causal};
    char what[96];
    double *qkv_d, *dout_d;
    float *qkv = rnd_floats(B * T * W, 1.5, &qkv_d), *dout = rnd_floats(B * T * OW, 1, &dout_d);
    float *out = rnd_floats(B * T * OW, 1, NULL), *lse = zero_floats(B * NH * T), *dqkv = zero_floats(B * T * W);
    double *want = zero_doubles(B * T * OW), *rdqkv = zero_doubles(B * T * W);
    zt_cpu_attention_forward_gqa(out, lse, qkv, lens, &d);
    ref_attention_gqa_forward(want, qkv_d, lens, B, T, NH, NKV, HS, causal);
    snprintf(what, sizeof(what), "attention B%d T%d NH%d NKV%d HS%d %s forward", B, T, NH, NKV, HS,
             causal ? "causal" : "bidirectional");
    expect_close_f(what, out, want, B * T * OW, F32_TOL);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                float l = lse[(b * NH + h) * T + t];
                assert_true(t < ref_attention_len(lens, b, T) ? isfinite(l) : isinf(l) && l > 0);
            }
    zt_cpu_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, &d);
    ref_attention_gqa_backward(rdqkv, dout_d, qkv_d, lens, B, T, NH, NKV, HS, causal);
    snprintf(what, sizeof(what), "attention B%d T%d NH%d NKV%d HS%d %s dqkv", B, T, NH, NKV, HS,
             causal ? "causal" : "bidirectional");
    expect_close_f(what, dqkv, rdqkv, B * T * W, F32_TOL);
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(qkv_d); free(dout_d); free(want); free(rdqkv);
}

static void test_attention_gqa(void **state)
{
    (void)state;
    const int32_t lens3[3] = {70, 37, 0}, lens2[2] = {150, 65};
    check_attention_gqa(2, 33, 6, 2, 16, 1, NULL);  /* grouped-query, ratio 3 */
    check_attention_gqa(3, 70, 4, 4, 20, 0, lens3); /* bidirectional with padding: full, partial, empty */
    check_attention_gqa(2, 150, 3, 1, 8, 1, lens2); /* one key/value head; causal with padding; > 2 key blocks */
    check_attention_gqa(2, 130, 2, 1, 40, 0, lens2); /* bidirectional across key blocks, a length past T */
}

static void test_gelu_residual(void **state)
{
    (void)state;
    enum { n = 20011 }; /* above the size where the element-wise kernels go parallel */
    double *x_d, *y_d, *dout_d;
    float *x = rnd_floats(n, 5, &x_d), *y = rnd_floats(n, 1, &y_d), *dout = rnd_floats(n, 1, &dout_d);
    float *out = zero_floats(n), *dinp = zero_floats(n);
    double *want = zero_doubles(n), *want_d = zero_doubles(n);
    zt_cpu_gelu_forward(out, x, n);
    zt_cpu_gelu_backward(dinp, x, dout, n);
    for (int i = 0; i < n; i++) {
        want[i] = ref_gelu(x_d[i]);
        want_d[i] = ref_gelu_grad(x_d[i]) * dout_d[i];
    }
    expect_close_f("gelu forward", out, want, n, F32_TOL);
    expect_close_f("gelu backward", dinp, want_d, n, F32_TOL);

    memset(dinp, 0, sizeof(float) * n);
    zt_cpu_gelu_erf_forward(out, x, n);
    zt_cpu_gelu_erf_backward(dinp, x, dout, n);
    for (int i = 0; i < n; i++) {
        want[i] = ref_gelu_erf(x_d[i]);
        want_d[i] = ref_gelu_erf_grad(x_d[i]) * dout_d[i];
    }
    expect_close_f("gelu_erf forward", out, want, n, F32_TOL);
    expect_close_f("gelu_erf backward", dinp, want_d, n, F32_TOL);

    zt_cpu_residual_forward(out, x, y, n);
    for (int i = 0; i < n; i++)
        assert_true(out[i] == x[i] + y[i]);
    memcpy(out, y, sizeof(float) * n);
    zt_cpu_residual_backward(out, NULL, x, n);
    for (int i = 0; i < n; i++)
        assert_true(out[i] == y[i] + x[i]);
    free(x); free(y); free(dout); free(out); free(dinp); free(x_d); free(y_d); free(dout_d); free(want); free(want_d);
}

static void test_swiglu_tanh(void **state)
{
    (void)state;
    enum { N = 37, F = 301 }; /* N * F above the size where the element-wise kernels go parallel */
    double *x_d, *dout_d, *t_d;
    float *x = rnd_floats(N * 2 * F, 6, &x_d), *dout = rnd_floats(N * F, 1, &dout_d);
    float *out = zero_floats(N * F), *dinp = zero_floats(N * 2 * F);
    double *want = zero_doubles(N * F), *want_d = zero_doubles(N * 2 * F);
    zt_cpu_swiglu_forward(out, x, N, F);
    ref_swiglu_forward(want, x_d, N, F);
    expect_close_f("swiglu forward", out, want, N * F, F32_TOL);
    zt_cpu_swiglu_backward(dinp, x, dout, N, F);
    ref_swiglu_backward(want_d, x_d, dout_d, N, F);
    expect_close_f("swiglu backward", dinp, want_d, N * 2 * F, F32_TOL);

    float *t = rnd_floats(N * F, 3, &t_d), *tout = zero_floats(N * F), *tdinp = zero_floats(N * F);
    zt_cpu_tanh_forward(tout, t, N * F);
    zt_cpu_tanh_backward(tdinp, tout, dout, N * F);
    for (int i = 0; i < N * F; i++) {
        want[i] = tanh(t_d[i]);
        want_d[i] = dout_d[i] * (1.0 - want[i] * want[i]);
    }
    expect_close_f("tanh forward", tout, want, N * F, F32_TOL);
    expect_close_f("tanh backward", tdinp, want_d, N * F, F32_TOL);
    free(x); free(dout); free(out); free(dinp); free(x_d); free(dout_d); free(want); free(want_d);
    free(t); free(t_d); free(tout); free(tdinp);
}

/* RoPE against the reference with the same fp32 angles, at positions up to 3000 (pos0 > 0). */
static void test_rope(void **state)
{
    (void)state;
    enum { B = 2, T = 37, NH = 6, NKV = 2, HS = 80, W = (NH + 2 * NKV) * HS };
    float inv_freq[HS / 2];
    zt_rope_config cfg = {.theta = 500000.0, .scaling = ZT_ROPE_SCALING_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0, .original_max_position_embeddings = 64};
    assert_int_equal(zt_rope_inv_freq(inv_freq, HS, &cfg, NULL), 0);
    double *qkv_d;
    float *qkv = rnd_floats(B * T * W, 2, &qkv_d), *orig = malloc(sizeof(float) * B * T * W);
    memcpy(orig, qkv, sizeof(float) * B * T * W);
    zt_cpu_rope_forward(qkv, inv_freq, B, T, NH, NKV, HS, HS, 2963, NULL);
    ref_rope(qkv_d, inv_freq, B, T, NH, NKV, HS, HS, 2963, 1.0, 1);
    expect_close_f("rope forward", qkv, qkv_d, B * T * W, F32_TOL);
    for (int r = 0; r < B * T; r++) /* value heads untouched, bit for bit */
        assert_memory_equal(qkv + r * W + (NH + NKV) * HS, orig + r * W + (NH + NKV) * HS, sizeof(float) * NKV * HS);
    zt_cpu_rope_backward(qkv, inv_freq, B, T, NH, NKV, HS, HS, 2963, NULL);
    ref_rope(qkv_d, inv_freq, B, T, NH, NKV, HS, HS, 2963, -1.0, 1);
    expect_close_f("rope backward", qkv, qkv_d, B * T * W, F32_TOL);
    for (int i = 0; i < B * T * W; i++) /* the backward undoes the forward (an orthogonal map) */
        assert_true(fabsf(qkv[i] - orig[i]) <= 1e-5f * (1.0f + fabsf(orig[i])));
    free(qkv); free(qkv_d); free(orig);
}

static void test_crossentropy(void **state)
{
    (void)state;
    enum { N = 21, V = 53 };
    int32_t targets[N];
    for (int n = 0; n < N; n++)
        targets[n] = n % 4 == 1 ? -1 : (n * 13) % V;
    double *logits_d;
    float *logits = rnd_floats(N * V, 6, &logits_d), *losses = zero_floats(N), *dlogits = zero_floats(N * V);
    double *rlosses = zero_doubles(N), *rd = zero_doubles(N * V);
    int counted = zt_cpu_crossentropy_forward_backward(losses, dlogits, logits, targets, N, V, -1, 1.0f / 16);
    int rcounted = ref_crossentropy(rlosses, rd, logits_d, targets, N, V, -1, 1.0 / 16);
    assert_int_equal(counted, rcounted);
    assert_int_equal(counted, 16);
    expect_close_f("crossentropy losses", losses, rlosses, N, F32_TOL);
    expect_close_f("crossentropy dlogits", dlogits, rd, N * V, F32_TOL);
    free(logits); free(losses); free(dlogits); free(logits_d); free(rlosses); free(rd);
}

/* ---- AdamW ---- */

/* A hand-computed first step: with bias correction m_hat = g and v_hat = g^2, so each parameter moves
 * by lr * (sign(g) * |g| / (|g| + eps) + wd * param). */
static void test_adamw_first_step(void **state)
{
    (void)state;
    float param[3] = {1.0f, -2.0f, 0.5f}, m[3] = {0}, v[3] = {0};
    const float grad[3] = {4.0f, -0.5f, 0.0f};
    zt_adamw_params p = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                         .grad_scale = 0.5f, .step = 1};
    zt_cpu_adamw_update(param, m, v, grad, 3, &p);
    /* g = grad * 0.5 = {2, -0.25, 0}. */
    assert_float_equal(param[0], 1.0f - 0.1f * (2.0f / (2.0f + 1e-8f) + 0.01f * 1.0f), 1e-6);
    assert_float_equal(param[1], -2.0f - 0.1f * (-0.25f / (0.25f + 1e-8f) + 0.01f * -2.0f), 1e-6);
    assert_float_equal(param[2], 0.5f - 0.1f * 0.01f * 0.5f, 1e-7); /* decay only */
    assert_float_equal(m[0], 0.1f * 2.0f, 1e-7);
    assert_float_equal(v[1], (1.0f - 0.999f) * 0.0625f, 1e-10);
}

/* Several steps against PyTorch's formulation (decay applied to the parameter, then the Adam step with
 * bias corrections), computed in double. */
static void test_adamw_steps(void **state)
{
    (void)state;
    enum { n = 41, steps = 5 };
    double *param_d;
    float *param = rnd_floats(n, 1, &param_d), *m = zero_floats(n), *v = zero_floats(n);
    double *m_d = zero_doubles(n), *v_d = zero_doubles(n);
    zt_adamw_params p = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 0.25f, .step = 0};
    for (int s = 1; s <= steps; s++) {
        double *grad_d;
        float *grad = rnd_floats(n, 2, &grad_d);
        p.step = s;
        zt_cpu_adamw_update(param, m, v, grad, n, &p);
        ref_adamw_step(param_d, m_d, v_d, grad_d, n, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay,
                       p.grad_scale, s);
        free(grad); free(grad_d);
    }
    expect_close_f("adamw param", param, param_d, n, 1e-5);
    expect_close_f("adamw m", m, m_d, n, 1e-5);
    expect_close_f("adamw v", v, v_d, n, 1e-5);
    free(param); free(m); free(v); free(param_d); free(m_d); free(v_d);
}

/* ---- norm ---- */

static void test_sum_squares(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 1, 5, 63, 64, 65, 100003};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        float *x = rnd_floats(n, 3, NULL);
        double want = 0;
        for (size_t i = 0; i < n; i++)
            want += (double)x[i] * x[i];
        double got = zt_cpu_sum_squares(x, n);
        assert_true(fabs(got - want) <= 1e-12 * want);
        zt_cpu_scale_inplace(x, 0.5f, n);
        assert_true(fabs(zt_cpu_sum_squares(x, n) - 0.25 * want) <= 1e-12 * want);
        free(x);
    }
}

/* ---- determinism ---- */

/* Buffers of every kernel whose work is split over threads, filled once with fixed inputs. */
struct det_outputs {
    float *mm_out, *mm_dinp, *mm_dw, *mm_db;
    float *att_out, *att_lse, *att_dqkv;
    float *gqa_out, *gqa_lse, *gqa_dqkv;
    float *rms_out, *rms_dinp, *rms_dw;
    float *ln_out, *ln_dinp, *ln_dw, *ln_db;
    float *emb_dwte, *emb_dwpe;
    float *ce_losses, *ce_d;
    double sumsq;
};

enum { DN = 203, DIC = 300, DOC = 261 };           /* matmul */
enum { DB = 2, DT = 100, DC = 64, DNH = 4 };       /* attention, layernorm and embedding */
enum { DV = 97 };                                  /* vocabulary */

/* Runs every kernel once with the given thread count on inputs drawn from a fixed seed. */
static void run_all(struct det_outputs *o, int threads)
{
    zt_cpu_set_threads(threads);
    g_rng = 12345;
    float *inp = rnd_floats((size_t)DN * DIC, 1, NULL), *w = rnd_floats((size_t)DOC * DIC, 1, NULL);
    float *b = rnd_floats(DOC, 1, NULL), *dout = rnd_floats((size_t)DN * DOC, 1, NULL);
    o->mm_out = zero_floats((size_t)DN * DOC);
    o->mm_dinp = zero_floats((size_t)DN * DIC);
    o->mm_dw = zero_floats((size_t)DOC * DIC);
    o->mm_db = zero_floats(DOC);
    zt_cpu_matmul_forward(o->mm_out, inp, w, b, DN, DIC, DOC);
    zt_cpu_matmul_backward(o->mm_dinp, o->mm_dw, o->mm_db, dout, inp, w, DN, DIC, DOC);
    free(inp); free(w); free(b); free(dout);

    float *qkv = rnd_floats(DB * DT * 3 * DC, 2, NULL), *adout = rnd_floats(DB * DT * DC, 1, NULL);
    o->att_out = zero_floats(DB * DT * DC);
    o->att_lse = zero_floats(DB * DNH * DT);
    o->att_dqkv = zero_floats(DB * DT * 3 * DC);
    zt_cpu_attention_forward(o->att_out, o->att_lse, qkv, DB, DT, DC, DNH);
    zt_cpu_attention_backward(o->att_dqkv, adout, qkv, o->att_out, o->att_lse, DB, DT, DC, DNH);
    /* Grouped-query (4 query heads, 2 key/value heads of 16: the same inputs read as rows of 128),
     * bidirectional with padding. */
    zt_attention_dims gd = {.B = DB, .T = DT, .NH = DNH, .NKV = 2, .HS = DC / DNH, .causal = false};
    const int32_t glens[DB] = {DT, DT / 3};
    o->gqa_out = zero_floats(DB * DT * DC);
    o->gqa_lse = zero_floats(DB * DNH * DT);
    o->gqa_dqkv = zero_floats(DB * DT * 2 * DC);
    zt_cpu_attention_forward_gqa(o->gqa_out, o->gqa_lse, qkv, glens, &gd);
    zt_cpu_attention_backward_gqa(o->gqa_dqkv, adout, qkv, o->gqa_out, o->gqa_lse, glens, &gd);
    free(qkv); free(adout);

    int ln_n = DB * DT;
    float *x = rnd_floats(ln_n * DC, 2, NULL), *lw = rnd_floats(DC, 1, NULL), *lb = rnd_floats(DC, 1, NULL);
    float *ldout = rnd_floats(ln_n * DC, 1, NULL), *mean = zero_floats(ln_n), *rstd = zero_floats(ln_n);
    o->ln_out = zero_floats(ln_n * DC);
    o->ln_dinp = zero_floats(ln_n * DC);
    o->ln_dw = zero_floats(DC);
    o->ln_db = zero_floats(DC);
    zt_cpu_layernorm_forward(o->ln_out, mean, rstd, x, lw, lb, ln_n, DC, 1e-5f);
    zt_cpu_layernorm_backward(o->ln_dinp, o->ln_dw, o->ln_db, ldout, x, lw, mean, rstd, ln_n, DC);
    o->rms_out = zero_floats(ln_n * DC);
    o->rms_dinp = zero_floats(ln_n * DC);
    o->rms_dw = zero_floats(DC);
    zt_cpu_rmsnorm_forward(o->rms_out, rstd, x, lw, ln_n, DC, 1e-6f);
    zt_cpu_rmsnorm_backward(o->rms_dinp, o->rms_dw, ldout, x, lw, rstd, ln_n, DC);
    free(x); free(lw); free(lb); free(ldout); free(mean); free(rstd);

    int32_t tokens[DB * DT];
    for (int i = 0; i < DB * DT; i++)
        tokens[i] = (int32_t)(i % 5 == 0 ? 7 : (i * 31) % DV); /* token 7 repeats often */
    float *edout = rnd_floats(DB * DT * DC, 1, NULL);
    o->emb_dwte = zero_floats(DV * DC);
    o->emb_dwpe = zero_floats(DT * DC);
    zt_cpu_embedding_backward(o->emb_dwte, o->emb_dwpe, edout, tokens, DB, DT, DC);
    free(edout);

    float *logits = rnd_floats(DB * DT * DV, 4, NULL);
    o->ce_losses = zero_floats(DB * DT);
    o->ce_d = zero_floats(DB * DT * DV);
    zt_cpu_crossentropy_forward_backward(o->ce_losses, o->ce_d, logits, tokens, DB * DT, DV, -1, 0.01f);
    o->sumsq = zt_cpu_sum_squares(logits, DB * DT * DV);
    free(logits);
}

static void free_all(struct det_outputs *o)
{
    free(o->mm_out); free(o->mm_dinp); free(o->mm_dw); free(o->mm_db);
    free(o->att_out); free(o->att_lse); free(o->att_dqkv);
    free(o->gqa_out); free(o->gqa_lse); free(o->gqa_dqkv);
    free(o->rms_out); free(o->rms_dinp); free(o->rms_dw);
    free(o->ln_out); free(o->ln_dinp); free(o->ln_dw); free(o->ln_db);
    free(o->emb_dwte); free(o->emb_dwpe); free(o->ce_losses); free(o->ce_d);
}

static void test_thread_count_determinism(void **state)
{
    (void)state;
    struct det_outputs one, three;
    run_all(&one, 1);
    run_all(&three, 3);
    zt_cpu_set_threads(0);
    assert_memory_equal(one.mm_out, three.mm_out, sizeof(float) * DN * DOC);
    assert_memory_equal(one.mm_dinp, three.mm_dinp, sizeof(float) * DN * DIC);
    assert_memory_equal(one.mm_dw, three.mm_dw, sizeof(float) * DOC * DIC);
    assert_memory_equal(one.mm_db, three.mm_db, sizeof(float) * DOC);
    assert_memory_equal(one.att_out, three.att_out, sizeof(float) * DB * DT * DC);
    assert_memory_equal(one.att_lse, three.att_lse, sizeof(float) * DB * DNH * DT);
    assert_memory_equal(one.att_dqkv, three.att_dqkv, sizeof(float) * DB * DT * 3 * DC);
    assert_memory_equal(one.gqa_out, three.gqa_out, sizeof(float) * DB * DT * DC);
    assert_memory_equal(one.gqa_lse, three.gqa_lse, sizeof(float) * DB * DNH * DT);
    assert_memory_equal(one.gqa_dqkv, three.gqa_dqkv, sizeof(float) * DB * DT * 2 * DC);
    assert_memory_equal(one.rms_out, three.rms_out, sizeof(float) * DB * DT * DC);
    assert_memory_equal(one.rms_dinp, three.rms_dinp, sizeof(float) * DB * DT * DC);
    assert_memory_equal(one.rms_dw, three.rms_dw, sizeof(float) * DC);
    assert_memory_equal(one.ln_out, three.ln_out, sizeof(float) * DB * DT * DC);
    assert_memory_equal(one.ln_dinp, three.ln_dinp, sizeof(float) * DB * DT * DC);
    assert_memory_equal(one.ln_dw, three.ln_dw, sizeof(float) * DC);
    assert_memory_equal(one.ln_db, three.ln_db, sizeof(float) * DC);
    assert_memory_equal(one.emb_dwte, three.emb_dwte, sizeof(float) * DV * DC);
    assert_memory_equal(one.emb_dwpe, three.emb_dwpe, sizeof(float) * DT * DC);
    assert_memory_equal(one.ce_losses, three.ce_losses, sizeof(float) * DB * DT);
    assert_memory_equal(one.ce_d, three.ce_d, sizeof(float) * DB * DT * DV);
    assert_memory_equal(&one.sumsq, &three.sumsq, sizeof(double));
    free_all(&one);
    free_all(&three);
}

static void test_threads_setting(void **state)
{
    (void)state;
    zt_cpu_set_threads(3);
    assert_int_equal(zt_cpu_get_threads(), 3);
    zt_cpu_set_threads(0);
    assert_true(zt_cpu_get_threads() >= 1);
}

int main(int argc, char **argv)
{
    /* --baseline: the portable build of the loops that have an AVX2 + FMA one (kernels/cpu/cpu_dispatch.h) */
    zt_cpu_force_baseline(argc > 1 && strcmp(argv[1], "--baseline") == 0);
    zt_cpu_set_threads(3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul),           cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_gelu_residual),
        cmocka_unit_test(test_swiglu_tanh),
        cmocka_unit_test(test_rope),    cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_adamw_first_step), cmocka_unit_test(test_adamw_steps),
        cmocka_unit_test(test_sum_squares),      cmocka_unit_test(test_thread_count_determinism),
        cmocka_unit_test(test_threads_setting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
