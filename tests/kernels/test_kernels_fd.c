/* Finite-difference checks of every backward pass of the CPU kernels, in double precision (library
 * zt_kernels_cpu_f64, zt_real = double).
 *
 * Each backward is checked against central differences of a scalar objective, sum(out * W) with random
 * weights W, on small odd shapes, so that every element of every gradient is verified. Forwards are
 * compared with the naive references of kernel_ref.h. The tests also check that backwards accumulate
 * (+=) into their outputs as the headers say, that ignored cross-entropy rows carry no loss or gradient,
 * and that attention is causal. */
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
#include "kernels/attention.h"
#include "kernels/cpu_threads.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pooler.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

_Static_assert(sizeof(zt_real) == sizeof(double), "this test must link zt_kernels_cpu_f64");

/* Step of the central differences: the truncation error (~h^2) and the rounding error (~1e-16 |terms| / h)
 * of the objectives here both stay below 1e-7 of a derivative. */
#define FD_STEP 1e-4
/* Largest accepted relative error between an analytic and a numeric derivative. */
#define FD_TOL 1e-6

/* Small, odd shapes: no dimension is a multiple of a SIMD width or a tile size. */
enum { B = 2, T = 5, C = 12, NH = 3, V = 7, N = 3, IC = 7, OC = 5 };

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1), from a fixed-seed xorshift so that every run sees the same numbers. */
static double rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

static double *rnd_array(size_t n)
{
    double *x = malloc(sizeof(double) * n);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = rnd();
    return x;
}

static double *zero_array(size_t n)
{
    double *x = calloc(n, sizeof(double));
    assert_non_null(x);
    return x;
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Fails unless got and want agree elementwise to rel_tol, relative to max(|got|, |want|, 1e-3). */
static void expect_close(const char *what, const double *got, const double *want, size_t n, double rel_tol)
{
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double den = fmax(fmax(fabs(got[i]), fabs(want[i])), 1e-3);
        double err = fabs(got[i] - want[i]) / den;
        if (!(err <= worst) || isnan(err)) {
            worst = isnan(err) ? INFINITY : err;
            worst_i = i;
        }
    }
    if (worst > rel_tol)
        fail_msg("%s: element %zu is %.12g, expected %.12g (relative error %.3g > %.3g)", what, worst_i,
                 got[worst_i], want[worst_i], worst, rel_tol);
}

/* Compares analytic[j] with the central difference of f with respect to x[j], for every j; x is restored. */
static void expect_fd(const char *what, double *x, size_t n, const double *analytic, double (*f)(void *),
                      void *ctx)
{
    double *numeric = zero_array(n);
    for (size_t j = 0; j < n; j++) {
        double saved = x[j];
        x[j] = saved + FD_STEP;
        double fp = f(ctx);
        x[j] = saved - FD_STEP;
        double fm = f(ctx);
        x[j] = saved;
        numeric[j] = (fp - fm) / (2 * FD_STEP);
    }
    double worst = 0;
    for (size_t j = 0; j < n; j++)
        worst = fmax(worst, fabs(analytic[j] - numeric[j]) / fmax(fmax(fabs(analytic[j]), fabs(numeric[j])), 1e-3));
    printf("    %-24s %4zu derivatives, worst relative error %.2g\n", what, n, worst);
    expect_close(what, analytic, numeric, n, FD_TOL);
    free(numeric);
}

/* Checks that a backward accumulates: started from prefill instead of zeros it must give prefill + grad. */
static void expect_accumulated(const char *what, const double *got, const double *prefill, const double *grad,
                               size_t n)
{
    double *want = zero_array(n);
    for (size_t i = 0; i < n; i++)
        want[i] = prefill[i] + grad[i];
    expect_close(what, got, want, n, 1e-12);
    free(want);
}

/* ---- embedding ---- */

struct embedding_ctx {
    int32_t tokens[B * T];
    double *wte, *wpe, *out, *w;
};

static double embedding_objective(void *p)
{
    struct embedding_ctx *c = p;
    zt_cpu_embedding_forward(c->out, c->tokens, c->wte, c->wpe, B, T, C);
    return dot(c->out, c->w, B * T * C);
}

static void test_embedding(void **state)
{
    (void)state;
    /* Token 3 repeats (the scatter-add must sum), token 6 never appears (its gradient row must stay 0). */
    struct embedding_ctx c = {.tokens = {3, 1, 3, 0, 5, 2, 3, 4, 1, 3}};
    c.wte = rnd_array(V * C);
    c.wpe = rnd_array(T * C);
    c.out = zero_array(B * T * C);
    c.w = rnd_array(B * T * C);
    double *want = zero_array(B * T * C);
    embedding_objective(&c);
    ref_embedding_forward(want, c.tokens, c.wte, c.wpe, B, T, C);
    expect_close("embedding forward", c.out, want, B * T * C, 1e-15);

    double *dwte = zero_array(V * C), *dwpe = zero_array(T * C);
    zt_cpu_embedding_backward(dwte, dwpe, c.w, c.tokens, B, T, C);
    expect_fd("embedding dwte", c.wte, V * C, dwte, embedding_objective, &c);
    expect_fd("embedding dwpe", c.wpe, T * C, dwpe, embedding_objective, &c);

    double *pre_te = rnd_array(V * C), *pre_pe = rnd_array(T * C);
    double *acc_te = malloc(sizeof(double) * V * C), *acc_pe = malloc(sizeof(double) * T * C);
    memcpy(acc_te, pre_te, sizeof(double) * V * C);
    memcpy(acc_pe, pre_pe, sizeof(double) * T * C);
    zt_cpu_embedding_backward(acc_te, acc_pe, c.w, c.tokens, B, T, C);
    expect_accumulated("embedding dwte +=", acc_te, pre_te, dwte, V * C);
    expect_accumulated("embedding dwpe +=", acc_pe, pre_pe, dwpe, T * C);

    free(c.wte); free(c.wpe); free(c.out); free(c.w); free(want);
    free(dwte); free(dwpe); free(pre_te); free(pre_pe); free(acc_te); free(acc_pe);
}

/* With token types: type 0 and 1 used, type 2 never (its gradient row must stay 0). */
enum { NTT = 3 };

struct embedding_typed_ctx {
    int32_t tokens[B * T], types[B * T];
    double *wte, *wpe, *wtt, *out, *w;
};

static double embedding_typed_objective(void *p)
{
    struct embedding_typed_ctx *c = p;
    zt_cpu_embedding_forward_typed(c->out, c->tokens, c->types, c->wte, c->wpe, c->wtt, B, T, C);
    return dot(c->out, c->w, B * T * C);
}

static void test_embedding_typed(void **state)
{
    (void)state;
    struct embedding_typed_ctx c = {.tokens = {3, 1, 3, 0, 5, 2, 3, 4, 1, 3}, .types = {0, 0, 0, 1, 1, 0, 1, 1, 1, 0}};
    c.wte = rnd_array(V * C);
    c.wpe = rnd_array(T * C);
    c.wtt = rnd_array(NTT * C);
    c.out = zero_array(B * T * C);
    c.w = rnd_array(B * T * C);
    double *want = zero_array(B * T * C);
    embedding_typed_objective(&c);
    ref_embedding_typed_forward(want, c.tokens, c.types, c.wte, c.wpe, c.wtt, B, T, C);
    expect_close("embedding forward with types", c.out, want, B * T * C, 1e-15);

    double *dwte = zero_array(V * C), *dwpe = zero_array(T * C), *dwtt = zero_array(NTT * C);
    zt_cpu_embedding_backward_typed(dwte, dwpe, dwtt, c.w, c.tokens, c.types, B, T, C);
    expect_fd("embedding dwte (typed)", c.wte, V * C, dwte, embedding_typed_objective, &c);
    expect_fd("embedding dwpe (typed)", c.wpe, T * C, dwpe, embedding_typed_objective, &c);
    expect_fd("embedding dwtt", c.wtt, NTT * C, dwtt, embedding_typed_objective, &c);

    double *pre = rnd_array(NTT * C), *acc = malloc(sizeof(double) * NTT * C);
    double *scratch_te = zero_array(V * C), *scratch_pe = zero_array(T * C);
    memcpy(acc, pre, sizeof(double) * NTT * C);
    zt_cpu_embedding_backward_typed(scratch_te, scratch_pe, acc, c.w, c.tokens, c.types, B, T, C);
    expect_accumulated("embedding dwtt +=", acc, pre, dwtt, NTT * C);

    free(c.wte); free(c.wpe); free(c.wtt); free(c.out); free(c.w); free(want);
    free(dwte); free(dwpe); free(dwtt); free(pre); free(acc); free(scratch_te); free(scratch_pe);
}

/* ---- layernorm ---- */

#define LN_N (B * T)

struct layernorm_ctx {
    double *inp, *weight, *bias, *out, *mean, *rstd, *w;
};

static double layernorm_objective(void *p)
{
    struct layernorm_ctx *c = p;
    zt_cpu_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->weight, c->bias, LN_N, C, 1e-5f);
    return dot(c->out, c->w, LN_N * C);
}

static void test_layernorm(void **state)
{
    (void)state;
    struct layernorm_ctx c;
    c.inp = rnd_array(LN_N * C);
    for (int i = 0; i < LN_N * C; i++)
        c.inp[i] = 2.0 * c.inp[i] + 0.5; /* a non-zero mean and a variance away from 1 */
    c.weight = rnd_array(C);
    c.bias = rnd_array(C);
    c.out = zero_array(LN_N * C);
    c.mean = zero_array(LN_N);
    c.rstd = zero_array(LN_N);
    c.w = rnd_array(LN_N * C);

    double *want = zero_array(LN_N * C), *want_mean = zero_array(LN_N), *want_rstd = zero_array(LN_N);
    layernorm_objective(&c);
    /* The kernel adds eps as a float; the reference must use the same value. */
    ref_layernorm_forward(want, want_mean, want_rstd, c.inp, c.weight, c.bias, LN_N, C, (double)1e-5f);
    expect_close("layernorm forward", c.out, want, LN_N * C, 1e-12);
    expect_close("layernorm mean", c.mean, want_mean, LN_N, 1e-12);
    expect_close("layernorm rstd", c.rstd, want_rstd, LN_N, 1e-12);

    double *dinp = zero_array(LN_N * C), *dw = zero_array(C), *db = zero_array(C);
    zt_cpu_layernorm_backward(dinp, dw, db, c.w, c.inp, c.weight, c.mean, c.rstd, LN_N, C);
    expect_fd("layernorm dinp", c.inp, LN_N * C, dinp, layernorm_objective, &c);
    expect_fd("layernorm dweight", c.weight, C, dw, layernorm_objective, &c);
    expect_fd("layernorm dbias", c.bias, C, db, layernorm_objective, &c);

    double *pre_x = rnd_array(LN_N * C), *pre_w = rnd_array(C), *pre_b = rnd_array(C);
    double *acc_x = malloc(sizeof(double) * LN_N * C), *acc_w = malloc(sizeof(double) * C);
    double *acc_b = malloc(sizeof(double) * C);
    memcpy(acc_x, pre_x, sizeof(double) * LN_N * C);
    memcpy(acc_w, pre_w, sizeof(double) * C);
    memcpy(acc_b, pre_b, sizeof(double) * C);
    layernorm_objective(&c); /* restore mean and rstd of the unperturbed input */
    zt_cpu_layernorm_backward(acc_x, acc_w, acc_b, c.w, c.inp, c.weight, c.mean, c.rstd, LN_N, C);
    expect_accumulated("layernorm dinp +=", acc_x, pre_x, dinp, LN_N * C);
    expect_accumulated("layernorm dweight +=", acc_w, pre_w, dw, C);
    expect_accumulated("layernorm dbias +=", acc_b, pre_b, db, C);

    free(c.inp); free(c.weight); free(c.bias); free(c.out); free(c.mean); free(c.rstd); free(c.w);
    free(want); free(want_mean); free(want_rstd); free(dinp); free(dw); free(db);
    free(pre_x); free(pre_w); free(pre_b); free(acc_x); free(acc_w); free(acc_b);
}

/* ---- rmsnorm ---- */

struct rmsnorm_ctx {
    double *inp, *weight, *out, *rstd, *w;
};

static double rmsnorm_objective(void *p)
{
    struct rmsnorm_ctx *c = p;
    zt_cpu_rmsnorm_forward(c->out, c->rstd, c->inp, c->weight, LN_N, C, 1e-6f);
    return dot(c->out, c->w, LN_N * C);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    struct rmsnorm_ctx c;
    c.inp = rnd_array(LN_N * C);
    for (int i = 0; i < LN_N * C; i++)
        c.inp[i] = 2.0 * c.inp[i] + 0.5; /* a non-zero mean, which RMS normalisation keeps */
    c.weight = rnd_array(C);
    c.out = zero_array(LN_N * C);
    c.rstd = zero_array(LN_N);
    c.w = rnd_array(LN_N * C);

    double *want = zero_array(LN_N * C), *want_rstd = zero_array(LN_N);
    rmsnorm_objective(&c);
    ref_rmsnorm_forward(want, want_rstd, c.inp, c.weight, LN_N, C, (double)1e-6f);
    expect_close("rmsnorm forward", c.out, want, LN_N * C, 1e-12);
    expect_close("rmsnorm rstd", c.rstd, want_rstd, LN_N, 1e-12);

    double *dinp = zero_array(LN_N * C), *dw = zero_array(C);
    zt_cpu_rmsnorm_backward(dinp, dw, c.w, c.inp, c.weight, c.rstd, LN_N, C);
    expect_fd("rmsnorm dinp", c.inp, LN_N * C, dinp, rmsnorm_objective, &c);
    expect_fd("rmsnorm dweight", c.weight, C, dw, rmsnorm_objective, &c);

    double *pre_x = rnd_array(LN_N * C), *pre_w = rnd_array(C);
    double *acc_x = malloc(sizeof(double) * LN_N * C), *acc_w = malloc(sizeof(double) * C);
    memcpy(acc_x, pre_x, sizeof(double) * LN_N * C);
    memcpy(acc_w, pre_w, sizeof(double) * C);
    rmsnorm_objective(&c); /* restore rstd of the unperturbed input */
    zt_cpu_rmsnorm_backward(acc_x, acc_w, c.w, c.inp, c.weight, c.rstd, LN_N, C);
    expect_accumulated("rmsnorm dinp +=", acc_x, pre_x, dinp, LN_N * C);
    expect_accumulated("rmsnorm dweight +=", acc_w, pre_w, dw, C);

    free(c.inp); free(c.weight); free(c.out); free(c.rstd); free(c.w); free(want); free(want_rstd);
    free(dinp); free(dw); free(pre_x); free(pre_w); free(acc_x); free(acc_w);
}

/* ---- matmul ---- */

struct matmul_ctx {
    int n, ic, oc;
    double *inp, *weight, *bias, *out, *w;
};

static double matmul_objective(void *p)
{
    struct matmul_ctx *c = p;
    zt_cpu_matmul_forward(c->out, c->inp, c->weight, c->bias, c->n, c->ic, c->oc);
    return dot(c->out, c->w, (size_t)c->n * c->oc);
}

/* Checks forward, the three gradients, accumulation and the NULL dinp/dbias paths for one shape. */
static void check_matmul(int n, int ic, int oc, int with_bias)
{
    struct matmul_ctx c = {.n = n, .ic = ic, .oc = oc};
    c.inp = rnd_array((size_t)n * ic);
    c.weight = rnd_array((size_t)oc * ic);
    c.bias = with_bias ? rnd_array(oc) : NULL;
    c.out = zero_array((size_t)n * oc);
    c.w = rnd_array((size_t)n * oc);
    double *want = zero_array((size_t)n * oc);
    matmul_objective(&c);
    ref_matmul_forward(want, c.inp, c.weight, c.bias, n, ic, oc);
    expect_close("matmul forward", c.out, want, (size_t)n * oc, 1e-12);

    double *dinp = zero_array((size_t)n * ic), *dw = zero_array((size_t)oc * ic), *db = zero_array(oc);
    zt_cpu_matmul_backward(dinp, dw, db, c.w, c.inp, c.weight, n, ic, oc);
    expect_fd("matmul dinp", c.inp, (size_t)n * ic, dinp, matmul_objective, &c);
    expect_fd("matmul dweight", c.weight, (size_t)oc * ic, dw, matmul_objective, &c);
    if (with_bias)
        expect_fd("matmul dbias", c.bias, oc, db, matmul_objective, &c);

    double *pre_x = rnd_array((size_t)n * ic), *pre_w = rnd_array((size_t)oc * ic), *pre_b = rnd_array(oc);
    double *acc_x = malloc(sizeof(double) * n * ic), *acc_w = malloc(sizeof(double) * oc * ic);
    double *acc_b = malloc(sizeof(double) * oc);
    memcpy(acc_x, pre_x, sizeof(double) * n * ic);
    memcpy(acc_w, pre_w, sizeof(double) * oc * ic);
    memcpy(acc_b, pre_b, sizeof(double) * oc);
    zt_cpu_matmul_backward(acc_x, acc_w, acc_b, c.w, c.inp, c.weight, n, ic, oc);
    expect_accumulated("matmul dinp +=", acc_x, pre_x, dinp, (size_t)n * ic);
    expect_accumulated("matmul dweight +=", acc_w, pre_w, dw, (size_t)oc * ic);
    expect_accumulated("matmul dbias +=", acc_b, pre_b, db, oc);

    /* Without dinp and dbias only dweight is written. */
    memcpy(acc_w, pre_w, sizeof(double) * oc * ic);
    zt_cpu_matmul_backward(NULL, acc_w, NULL, c.w, c.inp, c.weight, n, ic, oc);
    expect_accumulated("matmul dweight += (no dinp, no dbias)", acc_w, pre_w, dw, (size_t)oc * ic);

    free(c.inp); free(c.weight); free(c.bias); free(c.out); free(c.w); free(want);
    free(dinp); free(dw); free(db); free(pre_x); free(pre_w); free(pre_b); free(acc_x); free(acc_w); free(acc_b);
}

static void test_matmul(void **state)
{
    (void)state;
    check_matmul(N, IC, OC, 1);
    check_matmul(B * T, C, 3 * C, 0);
    /* Larger than one register tile in every dimension, with ragged edges. */
    check_matmul(19, 37, 23, 1);
}

/* Compares the double build's matmul with the naive reference on shapes that cross the cache blocks.
 * The tolerance allows for a different summation order over up to 300 terms. */
static void test_matmul_large(void **state)
{
    (void)state;
    const int shapes[][3] = {{67, 130, 97}, {33, 300, 17}, {129, 64, 80}, {1, 5, 1}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], ic = shapes[s][1], oc = shapes[s][2];
        double *inp = rnd_array((size_t)n * ic), *weight = rnd_array((size_t)oc * ic), *bias = rnd_array(oc);
        double *dout = rnd_array((size_t)n * oc);
        double *out = zero_array((size_t)n * oc), *want = zero_array((size_t)n * oc);
        double *dinp = zero_array((size_t)n * ic), *dw = zero_array((size_t)oc * ic), *db = zero_array(oc);
        double *rdinp = zero_array((size_t)n * ic), *rdw = zero_array((size_t)oc * ic), *rdb = zero_array(oc);
        zt_cpu_matmul_forward(out, inp, weight, bias, n, ic, oc);
        ref_matmul_forward(want, inp, weight, bias, n, ic, oc);
        expect_close("matmul forward (large)", out, want, (size_t)n * oc, 1e-10);
        zt_cpu_matmul_backward(dinp, dw, db, dout, inp, weight, n, ic, oc);
        ref_matmul_backward(rdinp, rdw, rdb, dout, inp, weight, n, ic, oc);
        expect_close("matmul dinp (large)", dinp, rdinp, (size_t)n * ic, 1e-10);
        expect_close("matmul dweight (large)", dw, rdw, (size_t)oc * ic, 1e-10);
        expect_close("matmul dbias (large)", db, rdb, oc, 1e-10);
        free(inp); free(weight); free(bias); free(dout); free(out); free(want);
        free(dinp); free(dw); free(db); free(rdinp); free(rdw); free(rdb);
    }
}

/* ---- attention ---- */

struct attention_ctx {
    double *qkv, *out, *lse, *w;
};

static double attention_objective(void *p)
{
    struct attention_ctx *c = p;
    zt_cpu_attention_forward(c->out, c->lse, c->qkv, B, T, C, NH);
    return dot(c->out, c->w, B * T * C);
}

static void test_attention(void **state)
{
    (void)state;
    struct attention_ctx c;
    c.qkv = rnd_array(B * T * 3 * C);
    for (int i = 0; i < B * T * 3 * C; i++)
        c.qkv[i] *= 2.0; /* scores spread enough that the softmax is far from uniform */
    c.out = zero_array(B * T * C);
    c.lse = zero_array(B * NH * T);
    c.w = rnd_array(B * T * C);
    double *want = zero_array(B * T * C);
    attention_objective(&c);
    ref_attention_forward(want, c.qkv, B, T, C, NH);
    expect_close("attention forward", c.out, want, B * T * C, 1e-12);

    double *dqkv = zero_array(B * T * 3 * C), *ref = zero_array(B * T * 3 * C);
    zt_cpu_attention_backward(dqkv, c.w, c.qkv, c.out, c.lse, B, T, C, NH);
    expect_fd("attention dqkv", c.qkv, B * T * 3 * C, dqkv, attention_objective, &c);
    ref_attention_backward(ref, c.w, c.qkv, B, T, C, NH);
    expect_close("attention dqkv vs reference", dqkv, ref, B * T * 3 * C, 1e-12);

    double *pre = rnd_array(B * T * 3 * C), *acc = malloc(sizeof(double) * B * T * 3 * C);
    memcpy(acc, pre, sizeof(double) * B * T * 3 * C);
    attention_objective(&c);
    zt_cpu_attention_backward(acc, c.w, c.qkv, c.out, c.lse, B, T, C, NH);
    expect_accumulated("attention dqkv +=", acc, pre, dqkv, B * T * 3 * C);

    free(c.qkv); free(c.out); free(c.lse); free(c.w); free(want); free(dqkv); free(ref); free(pre); free(acc);
}

/* A sequence longer than two key blocks of the online softmax, so that blocks raise the running max and
 * rescale the output; compared with the naive reference (forward and backward). */
static void test_attention_long(void **state)
{
    (void)state;
    enum { LB = 1, LT = 150, LC = 24, LNH = 2 };
    double *qkv = rnd_array(LB * LT * 3 * LC), *dout = rnd_array(LB * LT * LC);
    for (int i = 0; i < LB * LT * 3 * LC; i++)
        qkv[i] *= 3.0;
    double *out = zero_array(LB * LT * LC), *lse = zero_array(LB * LNH * LT), *want = zero_array(LB * LT * LC);
    double *dqkv = zero_array(LB * LT * 3 * LC), *ref = zero_array(LB * LT * 3 * LC);
    zt_cpu_attention_forward(out, lse, qkv, LB, LT, LC, LNH);
    ref_attention_forward(want, qkv, LB, LT, LC, LNH);
    expect_close("attention forward (T=150)", out, want, LB * LT * LC, 1e-10);
    zt_cpu_attention_backward(dqkv, dout, qkv, out, lse, LB, LT, LC, LNH);
    ref_attention_backward(ref, dout, qkv, LB, LT, LC, LNH);
    expect_close("attention dqkv (T=150)", dqkv, ref, LB * LT * 3 * LC, 1e-10);
    free(qkv); free(dout); free(out); free(lse); free(want); free(dqkv); free(ref);
}

/* Changing the keys and values of token t0 must leave every output before t0 bit-identical. */
static void test_attention_causal(void **state)
{
    (void)state;
    const int t0 = 2, b0 = 1;
    double *qkv = rnd_array(B * T * 3 * C), *out = zero_array(B * T * C), *out2 = zero_array(B * T * C);
    double *lse = zero_array(B * NH * T), *lse2 = zero_array(B * NH * T);
    zt_cpu_attention_forward(out, lse, qkv, B, T, C, NH);
    for (int i = C; i < 3 * C; i++)
        qkv[(b0 * T + t0) * 3 * C + i] += 0.5;
    zt_cpu_attention_forward(out2, lse2, qkv, B, T, C, NH);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int same = memcmp(out + (b * T + t) * C, out2 + (b * T + t) * C, sizeof(double) * C) == 0;
            int must_change = b == b0 && t >= t0;
            if (same == must_change)
                fail_msg("attention: output (b=%d, t=%d) %s after changing k,v of (b=%d, t=%d)", b, t,
                         same ? "did not change" : "changed", b0, t0);
        }
    free(qkv); free(out); free(out2); free(lse); free(lse2);
}

/* ---- general attention: grouped-query heads, bidirectional, padding ---- */

enum { GNH = 4, GNKV = 2, GHS = 3, GW = (GNH + 2 * GNKV) * GHS, GOW = GNH * GHS };

struct attention_gqa_ctx {
    zt_attention_dims d;
    const int32_t *lens;
    double *qkv, *out, *lse, *w;
};

static double attention_gqa_objective(void *p)
{
    struct attention_gqa_ctx *c = p;
    zt_cpu_attention_forward_gqa(c->out, c->lse, c->qkv, c->lens, &c->d);
    return dot(c->out, c->w, B * T * GOW);
}

/* Forward against the reference, every derivative against finite differences, the backward against the
 * reference, accumulation, and exact zeros for everything at or past a sequence's length. */
static void check_attention_gqa_fd(int causal, const int32_t *lens)
{
    struct attention_gqa_ctx c = {.d = {.B = B, .T = T, .NH = GNH, .NKV = GNKV, .HS = GHS, .causal = causal},
                                  .lens = lens};
    char what[80];
    const char *kind = causal ? (lens ? "causal, padded" : "causal") : (lens ? "bidirectional, padded" : "bidirectional");
    c.qkv = rnd_array(B * T * GW);
    for (int i = 0; i < B * T * GW; i++)
        c.qkv[i] *= 2.0;
    c.out = zero_array(B * T * GOW);
    c.lse = zero_array(B * GNH * T);
    c.w = rnd_array(B * T * GOW);
    double *want = zero_array(B * T * GOW);
    attention_gqa_objective(&c);
    ref_attention_gqa_forward(want, c.qkv, lens, B, T, GNH, GNKV, GHS, causal);
    snprintf(what, sizeof(what), "attention GQA %s forward", kind);
    expect_close(what, c.out, want, B * T * GOW, 1e-12);

    double *dqkv = zero_array(B * T * GW), *ref = zero_array(B * T * GW);
    zt_cpu_attention_backward_gqa(dqkv, c.w, c.qkv, c.out, c.lse, lens, &c.d);
    snprintf(what, sizeof(what), "attention GQA %s dqkv", kind);
    expect_fd(what, c.qkv, B * T * GW, dqkv, attention_gqa_objective, &c);
    ref_attention_gqa_backward(ref, c.w, c.qkv, lens, B, T, GNH, GNKV, GHS, causal);
    expect_close(what, dqkv, ref, B * T * GW, 1e-12);
    for (int b = 0; b < B; b++)
        for (int t = ref_attention_len(lens, b, T); t < T; t++)
            for (int i = 0; i < GW; i++)
                assert_true(dqkv[(b * T + t) * GW + i] == 0.0);

    double *pre = rnd_array(B * T * GW), *acc = malloc(sizeof(double) * B * T * GW);
    memcpy(acc, pre, sizeof(double) * B * T * GW);
    attention_gqa_objective(&c);
    zt_cpu_attention_backward_gqa(acc, c.w, c.qkv, c.out, c.lse, lens, &c.d);
    snprintf(what, sizeof(what), "attention GQA %s dqkv +=", kind);
    expect_accumulated(what, acc, pre, dqkv, B * T * GW);
    free(c.qkv); free(c.out); free(c.lse); free(c.w); free(want); free(dqkv); free(ref); free(pre); free(acc);
}

static void test_attention_gqa(void **state)
{
    (void)state;
    const int32_t lens[B] = {T, 3};
    check_attention_gqa_fd(1, NULL);
    check_attention_gqa_fd(0, NULL);
    check_attention_gqa_fd(0, lens);
    check_attention_gqa_fd(1, lens);
}

/* Grouped-query attention gives what multi-head attention gives with every key/value head repeated for
 * its query heads (Hugging Face's repeat_kv): the same forward bits, and key/value gradients that are the
 * sums over the repeated heads. The multi-head entry points give the bits of the general ones. */
static void test_attention_gqa_equivalences(void **state)
{
    (void)state;
    enum { G = GNH / GNKV, MW = 3 * GOW };
    zt_attention_dims gd = {.B = B, .T = T, .NH = GNH, .NKV = GNKV, .HS = GHS, .causal = true};
    zt_attention_dims md = gd;
    md.NKV = GNH;
    double *qkv = rnd_array(B * T * GW), *mqkv = zero_array(B * T * MW), *dout = rnd_array(B * T * GOW);
    for (int bt = 0; bt < B * T; bt++) {
        memcpy(mqkv + bt * MW, qkv + bt * GW, sizeof(double) * GOW);
        for (int h = 0; h < GNH; h++) {
            int g = h / G;
            memcpy(mqkv + bt * MW + GOW + h * GHS, qkv + bt * GW + GOW + g * GHS, sizeof(double) * GHS);
            memcpy(mqkv + bt * MW + 2 * GOW + h * GHS, qkv + bt * GW + GOW + GNKV * GHS + g * GHS,
                   sizeof(double) * GHS);
        }
    }
    double *out = zero_array(B * T * GOW), *mout = zero_array(B * T * GOW);
    double *lse = zero_array(B * GNH * T), *mlse = zero_array(B * GNH * T);
    zt_cpu_attention_forward_gqa(out, lse, qkv, NULL, &gd);
    zt_cpu_attention_forward_gqa(mout, mlse, mqkv, NULL, &md);
    assert_memory_equal(out, mout, sizeof(double) * B * T * GOW);
    assert_memory_equal(lse, mlse, sizeof(double) * B * GNH * T);

    double *dqkv = zero_array(B * T * GW), *mdqkv = zero_array(B * T * MW), *folded = zero_array(B * T * GW);
    zt_cpu_attention_backward_gqa(dqkv, dout, qkv, out, lse, NULL, &gd);
    zt_cpu_attention_backward_gqa(mdqkv, dout, mqkv, mout, mlse, NULL, &md);
    for (int bt = 0; bt < B * T; bt++) {
        memcpy(folded + bt * GW, mdqkv + bt * MW, sizeof(double) * GOW);
        for (int h = 0; h < GNH; h++)
            for (int i = 0; i < GHS; i++) {
                int g = h / G;
                folded[bt * GW + GOW + g * GHS + i] += mdqkv[bt * MW + GOW + h * GHS + i];
                folded[bt * GW + GOW + GNKV * GHS + g * GHS + i] += mdqkv[bt * MW + 2 * GOW + h * GHS + i];
            }
    }
    expect_close("GQA dqkv vs repeated heads", dqkv, folded, B * T * GW, 1e-13);

    /* The multi-head entry points: the general ones with NKV = NH, causal, no mask, bit for bit. */
    double *out2 = zero_array(B * T * GOW), *lse2 = zero_array(B * GNH * T), *dqkv2 = zero_array(B * T * MW);
    zt_cpu_attention_forward(out2, lse2, mqkv, B, T, GOW, GNH);
    assert_memory_equal(out2, mout, sizeof(double) * B * T * GOW);
    assert_memory_equal(lse2, mlse, sizeof(double) * B * GNH * T);
    zt_cpu_attention_backward(dqkv2, dout, mqkv, out2, lse2, B, T, GOW, GNH);
    assert_memory_equal(dqkv2, mdqkv, sizeof(double) * B * T * MW);
    free(qkv); free(mqkv); free(dout); free(out); free(mout); free(lse); free(mlse); free(dqkv); free(mdqkv);
    free(folded); free(out2); free(lse2); free(dqkv2);
}

/* Bidirectional with padding: changing a padded position's q, k and v leaves every output bit as it was
 * (padded keys are masked, padded rows are zeros); changing a valid key changes every valid row of its
 * sequence, earlier ones included. */
static void test_attention_padding(void **state)
{
    (void)state;
    const int32_t lens[B] = {T, 3};
    zt_attention_dims d = {.B = B, .T = T, .NH = GNH, .NKV = GNKV, .HS = GHS, .causal = false};
    double *qkv = rnd_array(B * T * GW), *out = zero_array(B * T * GOW), *out2 = zero_array(B * T * GOW);
    double *lse = zero_array(B * GNH * T), *lse2 = zero_array(B * GNH * T);
    zt_cpu_attention_forward_gqa(out, lse, qkv, lens, &d);
    for (int i = 0; i < GW; i++)
        qkv[(1 * T + 4) * GW + i] += 0.75; /* sequence 1, position 4: padding */
    zt_cpu_attention_forward_gqa(out2, lse2, qkv, lens, &d);
    assert_memory_equal(out, out2, sizeof(double) * B * T * GOW);
    assert_memory_equal(lse, lse2, sizeof(double) * B * GNH * T);
    for (int t = 3; t < T; t++)
        for (int i = 0; i < GOW; i++)
            assert_true(out[(1 * T + t) * GOW + i] == 0.0);
    for (int i = GOW; i < GW; i++)
        qkv[(1 * T + 2) * GW + i] += 0.5; /* sequence 1, position 2: the last valid key and value */
    zt_cpu_attention_forward_gqa(out2, lse2, qkv, lens, &d);
    for (int t = 0; t < 3; t++)
        for (int h = 0; h < GNH; h++)
            if (memcmp(out + (1 * T + t) * GOW + h * GHS, out2 + (1 * T + t) * GOW + h * GHS, sizeof(double) * GHS) == 0)
                fail_msg("bidirectional attention: row %d head %d did not see the change of key 2", t, h);
    free(qkv); free(out); free(out2); free(lse); free(lse2);
}

/* ---- GELU ---- */

#define GELU_N 37

struct gelu_ctx {
    double *inp, *out, *w;
};

static double gelu_objective(void *p)
{
    struct gelu_ctx *c = p;
    zt_cpu_gelu_forward(c->out, c->inp, GELU_N);
    return dot(c->out, c->w, GELU_N);
}

static void test_gelu(void **state)
{
    (void)state;
    struct gelu_ctx c;
    c.inp = zero_array(GELU_N);
    for (int i = 0; i < GELU_N; i++)
        c.inp[i] = -4.0 + 8.0 * i / (GELU_N - 1) + 0.01 * rnd(); /* across the whole curve */
    c.out = zero_array(GELU_N);
    c.w = rnd_array(GELU_N);
    double *want = zero_array(GELU_N);
    gelu_objective(&c);
    for (int i = 0; i < GELU_N; i++)
        want[i] = ref_gelu(c.inp[i]);
    expect_close("gelu forward", c.out, want, GELU_N, 1e-14);

    double *dinp = zero_array(GELU_N);
    zt_cpu_gelu_backward(dinp, c.inp, c.w, GELU_N);
    expect_fd("gelu dinp", c.inp, GELU_N, dinp, gelu_objective, &c);

    double *pre = rnd_array(GELU_N), *acc = malloc(sizeof(double) * GELU_N);
    memcpy(acc, pre, sizeof(double) * GELU_N);
    zt_cpu_gelu_backward(acc, c.inp, c.w, GELU_N);
    expect_accumulated("gelu dinp +=", acc, pre, dinp, GELU_N);
    free(c.inp); free(c.out); free(c.w); free(want); free(dinp); free(pre); free(acc);
}

/* Exact GELU (BERT's "gelu"). */
static double gelu_erf_objective(void *p)
{
    struct gelu_ctx *c = p;
    zt_cpu_gelu_erf_forward(c->out, c->inp, GELU_N);
    return dot(c->out, c->w, GELU_N);
}

static void test_gelu_erf(void **state)
{
    (void)state;
    struct gelu_ctx c;
    c.inp = zero_array(GELU_N);
    for (int i = 0; i < GELU_N; i++)
        c.inp[i] = -4.0 + 8.0 * i / (GELU_N - 1) + 0.01 * rnd();
    c.out = zero_array(GELU_N);
    c.w = rnd_array(GELU_N);
    double *want = zero_array(GELU_N);
    gelu_erf_objective(&c);
    for (int i = 0; i < GELU_N; i++)
        want[i] = ref_gelu_erf(c.inp[i]);
    expect_close("gelu_erf forward", c.out, want, GELU_N, 1e-14);

    double *dinp = zero_array(GELU_N);
    zt_cpu_gelu_erf_backward(dinp, c.inp, c.w, GELU_N);
    expect_fd("gelu_erf dinp", c.inp, GELU_N, dinp, gelu_erf_objective, &c);

    double *pre = rnd_array(GELU_N), *acc = malloc(sizeof(double) * GELU_N);
    memcpy(acc, pre, sizeof(double) * GELU_N);
    zt_cpu_gelu_erf_backward(acc, c.inp, c.w, GELU_N);
    expect_accumulated("gelu_erf dinp +=", acc, pre, dinp, GELU_N);
    /* The two forms differ (by up to ~5e-4 near |x| = 2): each is its own function. */
    double *tanh_form = zero_array(GELU_N), worst = 0.0;
    zt_cpu_gelu_forward(tanh_form, c.inp, GELU_N);
    for (int i = 0; i < GELU_N; i++)
        worst = fmax(worst, fabs(tanh_form[i] - c.out[i]));
    assert_true(worst > 1e-5 && worst < 1e-3);
    free(c.inp); free(c.out); free(c.w); free(want); free(dinp); free(pre); free(acc); free(tanh_form);
}

/* ---- SwiGLU and tanh ---- */

#define SWIGLU_N 3
#define SWIGLU_F 7

struct swiglu_ctx {
    double *inp, *out, *w;
};

static double swiglu_objective(void *p)
{
    struct swiglu_ctx *c = p;
    zt_cpu_swiglu_forward(c->out, c->inp, SWIGLU_N, SWIGLU_F);
    return dot(c->out, c->w, SWIGLU_N * SWIGLU_F);
}

static void test_swiglu(void **state)
{
    (void)state;
    enum { n_in = SWIGLU_N * 2 * SWIGLU_F, n_out = SWIGLU_N * SWIGLU_F };
    struct swiglu_ctx c = {.inp = rnd_array(n_in), .out = zero_array(n_out), .w = rnd_array(n_out)};
    for (int i = 0; i < n_in; i++)
        c.inp[i] *= 5.0; /* across the sigmoid's curve */
    double *want = zero_array(n_out);
    swiglu_objective(&c);
    ref_swiglu_forward(want, c.inp, SWIGLU_N, SWIGLU_F);
    expect_close("swiglu forward", c.out, want, n_out, 1e-14);

    double *dinp = zero_array(n_in);
    zt_cpu_swiglu_backward(dinp, c.inp, c.w, SWIGLU_N, SWIGLU_F);
    expect_fd("swiglu dinp", c.inp, n_in, dinp, swiglu_objective, &c);

    double *pre = rnd_array(n_in), *acc = malloc(sizeof(double) * n_in);
    memcpy(acc, pre, sizeof(double) * n_in);
    zt_cpu_swiglu_backward(acc, c.inp, c.w, SWIGLU_N, SWIGLU_F);
    expect_accumulated("swiglu dinp +=", acc, pre, dinp, n_in);
    free(c.inp); free(c.out); free(c.w); free(want); free(dinp); free(pre); free(acc);
}

/* ---- ReLU and gated GELU (T5) ---- */

struct geglu_ctx {
    double *inp, *out, *w;
};

static double geglu_objective(void *p)
{
    struct geglu_ctx *c = p;
    zt_cpu_geglu_forward(c->out, c->inp, SWIGLU_N, SWIGLU_F);
    return dot(c->out, c->w, SWIGLU_N * SWIGLU_F);
}

static void test_geglu(void **state)
{
    (void)state;
    enum { n_in = SWIGLU_N * 2 * SWIGLU_F, n_out = SWIGLU_N * SWIGLU_F };
    struct geglu_ctx c = {.inp = rnd_array(n_in), .out = zero_array(n_out), .w = rnd_array(n_out)};
    for (int i = 0; i < n_in; i++)
        c.inp[i] *= 4.0; /* across GELU's curve */
    double *want = zero_array(n_out);
    geglu_objective(&c);
    for (int n = 0; n < SWIGLU_N; n++)
        for (int f = 0; f < SWIGLU_F; f++) {
            const double g = c.inp[n * 2 * SWIGLU_F + f], u = c.inp[n * 2 * SWIGLU_F + SWIGLU_F + f];
            want[n * SWIGLU_F + f] = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
        }
    expect_close("geglu forward", c.out, want, n_out, 1e-14);
    double *dinp = zero_array(n_in);
    zt_cpu_geglu_backward(dinp, c.inp, c.w, SWIGLU_N, SWIGLU_F);
    expect_fd("geglu dinp", c.inp, n_in, dinp, geglu_objective, &c);
    double *pre = rnd_array(n_in), *acc = malloc(sizeof(double) * n_in);
    memcpy(acc, pre, sizeof(double) * n_in);
    zt_cpu_geglu_backward(acc, c.inp, c.w, SWIGLU_N, SWIGLU_F);
    expect_accumulated("geglu dinp +=", acc, pre, dinp, n_in);
    free(c.inp); free(c.out); free(c.w); free(want); free(dinp); free(pre); free(acc);
}

#define RELU_N 29

static double relu_objective(void *p)
{
    struct geglu_ctx *c = p;
    zt_cpu_relu_forward(c->out, c->inp, RELU_N);
    return dot(c->out, c->w, RELU_N);
}

static void test_relu(void **state)
{
    (void)state;
    struct geglu_ctx c = {.inp = rnd_array(RELU_N), .out = zero_array(RELU_N), .w = rnd_array(RELU_N)};
    for (int i = 0; i < RELU_N; i++)
        if (fabs(c.inp[i]) < 1e-3) /* away from the kink, where finite differences mean nothing */
            c.inp[i] = 0.5;
    relu_objective(&c);
    for (int i = 0; i < RELU_N; i++)
        assert_true(c.out[i] == (c.inp[i] > 0 ? c.inp[i] : 0.0));
    double *dinp = zero_array(RELU_N);
    zt_cpu_relu_backward(dinp, c.inp, c.w, RELU_N);
    expect_fd("relu dinp", c.inp, RELU_N, dinp, relu_objective, &c);
    double *pre = rnd_array(RELU_N), *acc = malloc(sizeof(double) * RELU_N);
    memcpy(acc, pre, sizeof(double) * RELU_N);
    zt_cpu_relu_backward(acc, c.inp, c.w, RELU_N);
    expect_accumulated("relu dinp +=", acc, pre, dinp, RELU_N);
    free(c.inp); free(c.out); free(c.w); free(dinp); free(pre); free(acc);
}

#define TANH_N 31

struct tanh_ctx {
    double *inp, *out, *w;
};

static double tanh_objective(void *p)
{
    struct tanh_ctx *c = p;
    zt_cpu_tanh_forward(c->out, c->inp, TANH_N);
    return dot(c->out, c->w, TANH_N);
}

static void test_tanh(void **state)
{
    (void)state;
    struct tanh_ctx c = {.inp = zero_array(TANH_N), .out = zero_array(TANH_N), .w = rnd_array(TANH_N)};
    for (int i = 0; i < TANH_N; i++)
        c.inp[i] = -3.0 + 6.0 * i / (TANH_N - 1) + 0.01 * rnd();
    tanh_objective(&c);
    for (int i = 0; i < TANH_N; i++)
        assert_true(c.out[i] == tanh(c.inp[i]));
    double *dinp = zero_array(TANH_N);
    zt_cpu_tanh_backward(dinp, c.out, c.w, TANH_N);
    expect_fd("tanh dinp", c.inp, TANH_N, dinp, tanh_objective, &c);

    double *pre = rnd_array(TANH_N), *acc = malloc(sizeof(double) * TANH_N);
    memcpy(acc, pre, sizeof(double) * TANH_N);
    tanh_objective(&c);
    zt_cpu_tanh_backward(acc, c.out, c.w, TANH_N);
    expect_accumulated("tanh dinp +=", acc, pre, dinp, TANH_N);
    free(c.inp); free(c.out); free(c.w); free(dinp); free(pre); free(acc);
}

/* ---- rotary position embeddings ---- */

enum { RP_NH = 4, RP_NKV = 2, RP_HS = 6, RP_W = (RP_NH + 2 * RP_NKV) * RP_HS, RP_POS0 = 3 };

struct rope_ctx {
    int rot; /* rotated channels of a head: RP_HS, or fewer (GPT-NeoX's partial rotary) */
    float inv_freq[RP_HS / 2];
    double *qkv, *out, *w;
};

static double rope_objective(void *p)
{
    struct rope_ctx *c = p;
    memcpy(c->out, c->qkv, sizeof(double) * B * T * RP_W);
    zt_cpu_rope_forward(c->out, c->inv_freq, B, T, RP_NH, RP_NKV, RP_HS, c->rot, RP_POS0, NULL);
    return dot(c->out, c->w, B * T * RP_W);
}

static void run_rope_fd(int rot)
{
    struct rope_ctx c = {.rot = rot};
    zt_rope_config cfg = {.theta = 10.0}; /* a small base: angles far apart over a few positions */
    assert_int_equal(zt_rope_inv_freq(c.inv_freq, rot, &cfg, NULL), 0);
    c.qkv = rnd_array(B * T * RP_W);
    c.out = zero_array(B * T * RP_W);
    c.w = rnd_array(B * T * RP_W);
    double *want = zero_array(B * T * RP_W);
    rope_objective(&c);
    memcpy(want, c.qkv, sizeof(double) * B * T * RP_W);
    ref_rope(want, c.inv_freq, B, T, RP_NH, RP_NKV, RP_HS, rot, RP_POS0, 1.0, 0);
    expect_close("rope forward", c.out, want, B * T * RP_W, 1e-14);
    for (int r = 0; r < B * T; r++) /* channels from rot on pass through, bit for bit */
        for (int h = 0; h < RP_NH + RP_NKV; h++)
            assert_memory_equal(c.out + r * RP_W + h * RP_HS + rot, c.qkv + r * RP_W + h * RP_HS + rot,
                                sizeof(double) * (RP_HS - rot));

    /* The backward of sum(rope(x) * w) is rope_backward(w): value columns carry w unchanged. */
    double *grad = malloc(sizeof(double) * B * T * RP_W);
    memcpy(grad, c.w, sizeof(double) * B * T * RP_W);
    zt_cpu_rope_backward(grad, c.inv_freq, B, T, RP_NH, RP_NKV, RP_HS, rot, RP_POS0, NULL);
    expect_fd("rope dqkv", c.qkv, B * T * RP_W, grad, rope_objective, &c);

    /* Positions: a call at pos0 = RP_POS0 + 2 on rows 2.. of a sequence gives the same bits as those rows of
     * the call at RP_POS0. */
    double *tail = malloc(sizeof(double) * (T - 2) * RP_W);
    memcpy(tail, c.qkv + 2 * RP_W, sizeof(double) * (T - 2) * RP_W);
    zt_cpu_rope_forward(tail, c.inv_freq, 1, T - 2, RP_NH, RP_NKV, RP_HS, rot, RP_POS0 + 2, NULL);
    rope_objective(&c);
    assert_memory_equal(tail, c.out + 2 * RP_W, sizeof(double) * (T - 2) * RP_W);
    free(c.qkv); free(c.out); free(c.w); free(want); free(grad); free(tail);
}

static void test_rope(void **state)
{
    (void)state;
    run_rope_fd(RP_HS); /* every channel (LLaMA) */
}

/* GPT-NeoX's partial rotary: the first 4 (or 2) of 6 channels turn, the rest pass through. */
static void test_rope_partial(void **state)
{
    (void)state;
    run_rope_fd(4);
    run_rope_fd(2);
}

/* The inverse frequencies against transformers' formulas written out in double. */
/* Per-row positions (packed documents): rows B*T with positions restarting at 0; each row must equal the
 * fixed-layout call of that row alone at pos0 = its position, and the backward passes finite differences. */
static const int32_t rope_positions[B * T] = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3};

static double rope_pos_objective(void *p)
{
    struct rope_ctx *c = p;
    memcpy(c->out, c->qkv, sizeof(double) * B * T * RP_W);
    zt_cpu_rope_forward(c->out, c->inv_freq, B, T, RP_NH, RP_NKV, RP_HS, RP_HS, 0, rope_positions);
    return dot(c->out, c->w, B * T * RP_W);
}

static void test_rope_positions(void **state)
{
    (void)state;
    struct rope_ctx c;
    zt_rope_config cfg = {.theta = 10.0};
    assert_int_equal(zt_rope_inv_freq(c.inv_freq, RP_HS, &cfg, NULL), 0);
    c.qkv = rnd_array(B * T * RP_W);
    c.out = zero_array(B * T * RP_W);
    c.w = rnd_array(B * T * RP_W);
    rope_pos_objective(&c);
    double *row = malloc(sizeof(double) * RP_W);
    int moved = 0;
    for (int r = 0; r < B * T; r++) {
        memcpy(row, c.qkv + (size_t)r * RP_W, sizeof(double) * RP_W);
        zt_cpu_rope_forward(row, c.inv_freq, 1, 1, RP_NH, RP_NKV, RP_HS, RP_HS, rope_positions[r], NULL);
        assert_memory_equal(row, c.out + (size_t)r * RP_W, sizeof(double) * RP_W);
        moved += rope_positions[r] != r % T;
    }
    assert_true(moved > 0); /* the positions differ from the fixed layout's */
    double *grad = malloc(sizeof(double) * B * T * RP_W);
    memcpy(grad, c.w, sizeof(double) * B * T * RP_W);
    zt_cpu_rope_backward(grad, c.inv_freq, B, T, RP_NH, RP_NKV, RP_HS, RP_HS, 0, rope_positions);
    expect_fd("rope dqkv (positions)", c.qkv, B * T * RP_W, grad, rope_pos_objective, &c);
    free(c.qkv); free(c.out); free(c.w); free(row); free(grad);
}

/* The inverse frequencies against transformers' formulas written out in double. */
static void test_rope_inv_freq(void **state)
{
    (void)state;
    enum { HS128 = 128 };
    float base[HS128 / 2], got[HS128 / 2];
    zt_rope_config cfg = {.theta = 10000.0};
    assert_int_equal(zt_rope_inv_freq(base, HS128, &cfg, NULL), 0);
    for (int i = 0; i < HS128 / 2; i++)
        assert_true(fabs(base[i] - pow(10000.0, -2.0 * i / HS128)) <= 2.4e-7 * base[i]);
    assert_true(base[0] == 1.0f);

    cfg.scaling = ZT_ROPE_SCALING_LINEAR;
    cfg.factor = 4.0;
    assert_int_equal(zt_rope_inv_freq(got, HS128, &cfg, NULL), 0);
    for (int i = 0; i < HS128 / 2; i++)
        assert_true(got[i] == (float)(base[i] / 4.0));

    /* LLaMA-3.1: theta 500000, factor 8, low 1, high 4, 8192 original positions. */
    zt_rope_config l3 = {.theta = 500000.0, .scaling = ZT_ROPE_SCALING_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0,
                         .high_freq_factor = 4.0, .original_max_position_embeddings = 8192};
    zt_rope_config plain = {.theta = 500000.0};
    assert_int_equal(zt_rope_inv_freq(base, HS128, &plain, NULL), 0);
    assert_int_equal(zt_rope_inv_freq(got, HS128, &l3, NULL), 0);
    int kept = 0, divided = 0, ramp = 0;
    for (int i = 0; i < HS128 / 2; i++) {
        double wavelen = 2.0 * M_PI / base[i], want;
        if (wavelen < 8192.0 / 4.0) {
            want = base[i];
            kept++;
        } else if (wavelen > 8192.0 / 1.0) {
            want = base[i] / 8.0;
            divided++;
        } else {
            double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
            want = (1.0 - smooth) * base[i] / 8.0 + smooth * base[i];
            ramp++;
        }
        assert_true(got[i] == (float)want);
        assert_true(i == 0 || got[i] < got[i - 1]);
    }
    assert_true(kept > 0 && divided > 0 && ramp > 0);

    /* Refusals name the value. */
    zt_err err;
    assert_int_equal(zt_rope_inv_freq(got, 7, &plain, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "head size"));
    l3.high_freq_factor = 1.0;
    assert_int_equal(zt_rope_inv_freq(got, HS128, &l3, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "low_freq_factor"));
    cfg.factor = 0.0;
    assert_int_equal(zt_rope_inv_freq(got, HS128, &cfg, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "factor"));
    plain.theta = -1.0;
    assert_int_equal(zt_rope_inv_freq(got, HS128, &plain, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "rope_theta"));
}

/* ---- residual ---- */

#define RES_N 29

struct residual_ctx {
    double *a, *b, *out, *w;
};

static double residual_objective(void *p)
{
    struct residual_ctx *c = p;
    zt_cpu_residual_forward(c->out, c->a, c->b, RES_N);
    return dot(c->out, c->w, RES_N);
}

static void test_residual(void **state)
{
    (void)state;
    struct residual_ctx c = {.a = rnd_array(RES_N), .b = rnd_array(RES_N), .out = zero_array(RES_N),
                             .w = rnd_array(RES_N)};
    double *da = zero_array(RES_N), *db = zero_array(RES_N);
    zt_cpu_residual_backward(da, db, c.w, RES_N);
    expect_fd("residual da", c.a, RES_N, da, residual_objective, &c);
    expect_fd("residual db", c.b, RES_N, db, residual_objective, &c);

    /* Accumulation, a NULL side, and add_inplace. */
    double *pre = rnd_array(RES_N), *acc = malloc(sizeof(double) * RES_N);
    memcpy(acc, pre, sizeof(double) * RES_N);
    zt_cpu_residual_backward(NULL, acc, c.w, RES_N);
    expect_accumulated("residual db += (da NULL)", acc, pre, db, RES_N);
    memcpy(acc, pre, sizeof(double) * RES_N);
    zt_cpu_add_inplace(acc, c.w, RES_N);
    expect_accumulated("add_inplace", acc, pre, c.w, RES_N);
    free(c.a); free(c.b); free(c.out); free(c.w); free(da); free(db); free(pre); free(acc);
}

/* ---- cross-entropy ---- */

#define CE_N 6
#define CE_IGNORE (-100)
#define CE_SCALE 0.25f

struct crossentropy_ctx {
    double *logits, *losses;
    int32_t targets[CE_N];
};

static double crossentropy_objective(void *p)
{
    struct crossentropy_ctx *c = p;
    zt_cpu_crossentropy_forward_backward(c->losses, NULL, c->logits, c->targets, CE_N, V, CE_IGNORE, 1.0f);
    double s = 0;
    for (int n = 0; n < CE_N; n++)
        s += c->losses[n];
    return CE_SCALE * s;
}

static void test_crossentropy(void **state)
{
    (void)state;
    /* Two rows are ignored; the gradient is grad_scale * d(sum of losses). */
    struct crossentropy_ctx c = {.targets = {3, CE_IGNORE, 0, 6, CE_IGNORE, 3}};
    c.logits = rnd_array(CE_N * V);
    for (int i = 0; i < CE_N * V; i++)
        c.logits[i] *= 3.0;
    c.losses = zero_array(CE_N);
    double *dlogits = zero_array(CE_N * V);
    for (int i = 0; i < CE_N * V; i++)
        dlogits[i] = 42.0; /* must be overwritten, not accumulated into */
    int counted = zt_cpu_crossentropy_forward_backward(c.losses, dlogits, c.logits, c.targets, CE_N, V,
                                                       CE_IGNORE, CE_SCALE);
    assert_int_equal(counted, 4);

    double *want_losses = zero_array(CE_N), *want_d = zero_array(CE_N * V);
    int want_counted = ref_crossentropy(want_losses, want_d, c.logits, c.targets, CE_N, V, CE_IGNORE, CE_SCALE);
    assert_int_equal(want_counted, 4);
    expect_close("crossentropy losses", c.losses, want_losses, CE_N, 1e-13);
    expect_close("crossentropy dlogits", dlogits, want_d, CE_N * V, 1e-13);
    for (int v = 0; v < V; v++) {
        assert_true(dlogits[1 * V + v] == 0.0);
        assert_true(dlogits[4 * V + v] == 0.0);
    }
    assert_true(c.losses[1] == 0.0 && c.losses[4] == 0.0);

    expect_fd("crossentropy dlogits", c.logits, CE_N * V, dlogits, crossentropy_objective, &c);

    /* dlogits may alias logits: same bits as the separate-buffer call. */
    double *inplace = malloc(sizeof(double) * CE_N * V), *losses2 = zero_array(CE_N);
    memcpy(inplace, c.logits, sizeof(double) * CE_N * V);
    zt_cpu_crossentropy_forward_backward(losses2, inplace, inplace, c.targets, CE_N, V, CE_IGNORE, CE_SCALE);
    assert_memory_equal(inplace, dlogits, sizeof(double) * CE_N * V);
    crossentropy_objective(&c); /* the finite differences left the losses of a perturbed input */
    assert_memory_equal(losses2, c.losses, sizeof(double) * CE_N);

    free(c.logits); free(c.losses); free(dlogits); free(want_losses); free(want_d); free(inplace); free(losses2);
}

/* ---- BERT's pooler and sequence-classification head, composed from the kernels ---- */

enum { HB = 4, HT = 3, HC = 6, HL = 3 }; /* sequences, positions, channels, labels */

struct head_ctx {
    double *h, *wp, *bp, *wc, *bc;          /* inputs and parameters */
    double *first, *pre, *pooled, *logits, *losses;
    int32_t labels[HB];
};

/* CE_SCALE * the sum of the losses of softmax(tanh(h[:,0] Wp^T + bp) Wc^T + bc) against the labels. */
static double head_objective(void *p)
{
    struct head_ctx *c = p;
    zt_cpu_first_token_forward(c->first, c->h, HB, HT, HC);
    zt_cpu_matmul_forward(c->pre, c->first, c->wp, c->bp, HB, HC, HC);
    zt_cpu_tanh_forward(c->pooled, c->pre, HB * HC);
    zt_cpu_matmul_forward(c->logits, c->pooled, c->wc, c->bc, HB, HC, HL);
    zt_cpu_crossentropy_forward_backward(c->losses, NULL, c->logits, c->labels, HB, HL, CE_IGNORE, 1.0f);
    double s = 0;
    for (int b = 0; b < HB; b++)
        s += c->losses[b];
    return CE_SCALE * s;
}

static void test_classifier_head(void **state)
{
    (void)state;
    struct head_ctx c = {.labels = {2, CE_IGNORE, 0, 1}};
    c.h = rnd_array(HB * HT * HC);
    c.wp = rnd_array(HC * HC);
    c.bp = rnd_array(HC);
    c.wc = rnd_array(HL * HC);
    c.bc = rnd_array(HL);
    c.first = zero_array(HB * HC);
    c.pre = zero_array(HB * HC);
    c.pooled = zero_array(HB * HC);
    c.logits = zero_array(HB * HL);
    c.losses = zero_array(HB);
    head_objective(&c);
    for (int b = 0; b < HB; b++) /* the pooler reads the first token */
        assert_memory_equal(c.first + b * HC, c.h + b * HT * HC, sizeof(double) * HC);

    double *dlogits = zero_array(HB * HL), *dpooled = zero_array(HB * HC), *dpre = zero_array(HB * HC);
    double *dfirst = zero_array(HB * HC), *dh = zero_array(HB * HT * HC);
    double *dwp = zero_array(HC * HC), *dbp = zero_array(HC), *dwc = zero_array(HL * HC), *dbc = zero_array(HL);
    int counted = zt_cpu_crossentropy_forward_backward(c.losses, dlogits, c.logits, c.labels, HB, HL, CE_IGNORE,
                                                       CE_SCALE);
    assert_int_equal(counted, 3);
    zt_cpu_matmul_backward(dpooled, dwc, dbc, dlogits, c.pooled, c.wc, HB, HC, HL);
    zt_cpu_tanh_backward(dpre, c.pooled, dpooled, HB * HC);
    zt_cpu_matmul_backward(dfirst, dwp, dbp, dpre, c.first, c.wp, HB, HC, HC);
    zt_cpu_first_token_backward(dh, dfirst, HB, HT, HC);
    for (int b = 0; b < HB; b++)
        for (int i = HC; i < HT * HC; i++)
            assert_true(dh[b * HT * HC + i] == 0.0); /* only the first token gets a gradient */
    for (int i = 0; i < HC; i++)
        assert_true(dh[1 * HT * HC + i] == 0.0); /* the ignored sequence adds nothing */
    expect_fd("classifier head dh", c.h, HB * HT * HC, dh, head_objective, &c);
    expect_fd("classifier head dW pooler", c.wp, HC * HC, dwp, head_objective, &c);
    expect_fd("classifier head db pooler", c.bp, HC, dbp, head_objective, &c);
    expect_fd("classifier head dW labels", c.wc, HL * HC, dwc, head_objective, &c);
    expect_fd("classifier head db labels", c.bc, HL, dbc, head_objective, &c);

    double *pre = rnd_array(HB * HT * HC), *acc = malloc(sizeof(double) * HB * HT * HC);
    memcpy(acc, pre, sizeof(double) * HB * HT * HC);
    zt_cpu_first_token_backward(acc, dfirst, HB, HT, HC);
    expect_accumulated("first token dh +=", acc, pre, dh, HB * HT * HC);

    free(c.h); free(c.wp); free(c.bp); free(c.wc); free(c.bc); free(c.first); free(c.pre); free(c.pooled);
    free(c.logits); free(c.losses); free(dlogits); free(dpooled); free(dpre); free(dfirst); free(dh);
    free(dwp); free(dbp); free(dwc); free(dbc); free(pre); free(acc);
}

/* ---- the attention descriptor: separate q and kv, Tq != Tk, scale, windows, T5 bias, varlen ---- */

/* One descriptor case. Buffers get row strides wider than the heads (the extra columns must stay untouched). */
struct desc_case {
    const char *name;
    int B, Tq, Tk, NH, NKV, HS;
    double scale; /* 0: the default */
    bool causal;
    int window;
    const int32_t *cu_q, *cu_k, *lens;
    bool bias, bidir;
    int nb, maxd;
};

struct desc_ctx {
    const struct desc_case *c;
    zt_attention_desc d;
    long nq, nk;             /* query rows, key rows */
    double *q, *kv, *out, *lse, *table, *w;
};

static double desc_objective(void *p)
{
    struct desc_ctx *x = p;
    zt_err err;
    int rc = zt_cpu_attention_fwd(&x->d, &err);
    if (rc)
        fail_msg("%s: %s", x->c->name, err.msg);
    return dot(x->out, x->w, (size_t)x->nq * x->d.out_stride);
}

/* Naive forward from the definitions of kernels/attention.h: every score, one softmax per row. */
static void desc_reference(const struct desc_ctx *x, double *out, double *lse)
{
    const zt_attention_desc *d = &x->d;
    const double scale = d->scale > 0 ? d->scale : 1.0 / sqrt(d->HS);
    double *s = zero_array((size_t)d->Tk + 1);
    for (int b = 0; b < d->B; b++) {
        long q0 = d->cu_seqlens_q ? d->cu_seqlens_q[b] : (long)b * d->Tq;
        long k0 = d->cu_seqlens_k ? d->cu_seqlens_k[b] : (long)b * d->Tk;
        int lq = d->cu_seqlens_q ? d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b] : d->Tq;
        int lk = d->cu_seqlens_k ? d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b] : d->Tk;
        int valid = lq, kvalid = lk, off = lk - lq;
        if (d->lens) {
            valid = kvalid = d->lens[b] < 0 ? 0 : d->lens[b] > lq ? lq : d->lens[b];
            off = 0;
        }
        for (int h = 0; h < d->NH; h++) {
            int g = h / (d->NH / d->NKV);
            for (int t = 0; t < lq; t++) {
                const double *q = x->q + (q0 + t) * d->q_stride + h * d->HS;
                double *o = out + (q0 + t) * d->out_stride + h * d->HS;
                int pos = t + off, any = 0;
                double mx = -INFINITY;
                for (int j = 0; j < lk; j++) {
                    int vis = t < valid && j < kvalid && (!d->causal || j <= pos) &&
                              (d->window < 0 || j >= pos - d->window);
                    s[j] = -INFINITY;
                    if (!vis)
                        continue;
                    const double *k = x->kv + (k0 + j) * d->k_stride + g * d->HS;
                    double v = 0;
                    for (int i = 0; i < d->HS; i++)
                        v += q[i] * k[i];
                    v *= scale;
                    if (d->bias == ZT_ATTENTION_BIAS_T5)
                        v += x->table[zt_attention_t5_bucket(j - pos, d->bias_bidirectional, d->num_buckets,
                                                             d->max_distance) * d->NH + h];
                    s[j] = v;
                    mx = fmax(mx, v);
                    any = 1;
                }
                for (int i = 0; i < d->HS; i++)
                    o[i] = 0;
                lse[((long)b * d->NH + h) * d->Tq + t] = INFINITY;
                if (!any)
                    continue;
                double sum = 0;
                for (int j = 0; j < lk; j++)
                    sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                for (int j = 0; j < lk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    const double *v = x->kv + (k0 + j) * d->v_stride + d->NKV * d->HS + g * d->HS;
                    for (int i = 0; i < d->HS; i++)
                        o[i] += exp(s[j] - mx) / sum * v[i];
                }
                lse[((long)b * d->NH + h) * d->Tq + t] = mx + log(sum);
            }
        }
    }
    free(s);
}

/* Zeroes columns [w, stride) of n rows: the columns outside the heads, which no call may touch. */
static void zero_outside(double *x, long n, long stride, long w)
{
    for (long r = 0; r < n; r++)
        for (long i = w; i < stride; i++)
            x[r * stride + i] = 0;
}

/* Forward against the naive reference, every derivative (q, k, v, bias table) against finite differences,
 * accumulation and overwriting. */
static void check_desc(const struct desc_case *c)
{
    struct desc_ctx x = {.c = c};
    x.nq = c->cu_q ? c->cu_q[c->B] : (long)c->B * c->Tq;
    x.nk = c->cu_k ? c->cu_k[c->B] : (long)c->B * c->Tk;
    const long qs = (long)c->NH * c->HS + 2, kvs = 2L * c->NKV * c->HS + 1, os = (long)c->NH * c->HS + 1;
    const long nlse = (long)c->B * c->NH * c->Tq, ntab = c->bias ? (long)c->nb * c->NH : 0;
    x.q = rnd_array((size_t)(x.nq * qs));
    x.kv = rnd_array((size_t)(x.nk * kvs));
    for (long i = 0; i < x.nq * qs; i++)
        x.q[i] *= 2.0;
    for (long i = 0; i < x.nk * kvs; i++)
        x.kv[i] *= 2.0;
    x.out = zero_array((size_t)(x.nq * os));
    x.lse = zero_array((size_t)nlse);
    x.w = rnd_array((size_t)(x.nq * os));
    x.table = c->bias ? rnd_array((size_t)ntab) : NULL;
    x.d = (zt_attention_desc){.q = x.q, .k = x.kv, .v = x.kv + (long)c->NKV * c->HS, .q_stride = qs,
                              .k_stride = kvs, .v_stride = kvs, .out = x.out, .out_stride = os, .lse = x.lse,
                              .B = c->B, .Tq = c->Tq, .Tk = c->Tk, .NH = c->NH, .NKV = c->NKV, .HS = c->HS,
                              .scale = (float)c->scale, .causal = c->causal, .window = c->window,
                              .cu_seqlens_q = c->cu_q, .cu_seqlens_k = c->cu_k, .lens = c->lens,
                              .bias = c->bias ? ZT_ATTENTION_BIAS_T5 : ZT_ATTENTION_BIAS_NONE,
                              .bias_table = x.table, .num_buckets = c->nb, .max_distance = c->maxd,
                              .bias_bidirectional = c->bidir};
    char what[160];
    double *want = zero_array((size_t)(x.nq * os)), *wlse = zero_array((size_t)nlse);
    desc_objective(&x);
    desc_reference(&x, want, wlse);
    snprintf(what, sizeof(what), "%s: forward", c->name);
    expect_close(what, x.out, want, (size_t)(x.nq * os), 1e-12);
    for (long i = 0; i < nlse; i++)
        if (isinf(wlse[i]) || isinf(x.lse[i]))
            assert_true(isinf(wlse[i]) && isinf(x.lse[i]) && x.lse[i] > 0);
        else
            assert_true(fabs(x.lse[i] - wlse[i]) <= 1e-12 * fmax(1, fabs(wlse[i])));

    /* Analytic gradients, started from zeros. */
    double *dq = zero_array((size_t)(x.nq * qs)), *dkv = zero_array((size_t)(x.nk * kvs));
    double *dtab = c->bias ? zero_array((size_t)ntab) : NULL;
    zt_attention_grads g = {.dout = x.w, .dq = dq, .dk = dkv, .dv = dkv + (long)c->NKV * c->HS, .dq_stride = qs,
                            .dk_stride = kvs, .dv_stride = kvs, .dbias_table = dtab, .accumulate = true};
    zt_err err;
    desc_objective(&x);
    assert_int_equal(zt_cpu_attention_bwd(&x.d, &g, &err), 0);
    snprintf(what, sizeof(what), "%s: dq", c->name);
    expect_fd(what, x.q, (size_t)(x.nq * qs), dq, desc_objective, &x);
    snprintf(what, sizeof(what), "%s: dk, dv", c->name);
    expect_fd(what, x.kv, (size_t)(x.nk * kvs), dkv, desc_objective, &x);
    if (c->bias) {
        snprintf(what, sizeof(what), "%s: dbias_table", c->name);
        expect_fd(what, x.table, (size_t)ntab, dtab, desc_objective, &x);
        double nz = 0;
        for (long i = 0; i < ntab; i++)
            nz += fabs(dtab[i]);
        assert_true(nz > 0);
    }

    /* accumulate: prefill + grad; overwrite: exactly the grad from zeros, whatever the buffers held. */
    double *aq = rnd_array((size_t)(x.nq * qs)), *akv = rnd_array((size_t)(x.nk * kvs));
    double *atab = c->bias ? rnd_array((size_t)ntab) : NULL;
    zero_outside(aq, x.nq, qs, (long)c->NH * c->HS);
    zero_outside(akv, x.nk, kvs, 2L * c->NKV * c->HS);
    double *pq = malloc(sizeof(double) * x.nq * qs), *pkv = malloc(sizeof(double) * x.nk * kvs);
    double *ptab = c->bias ? malloc(sizeof(double) * ntab) : NULL;
    memcpy(pq, aq, sizeof(double) * x.nq * qs);
    memcpy(pkv, akv, sizeof(double) * x.nk * kvs);
    if (c->bias)
        memcpy(ptab, atab, sizeof(double) * ntab);
    zt_attention_grads ga = {.dout = x.w, .dq = aq, .dk = akv, .dv = akv + (long)c->NKV * c->HS, .dq_stride = qs,
                             .dk_stride = kvs, .dv_stride = kvs, .dbias_table = atab, .accumulate = true};
    desc_objective(&x);
    assert_int_equal(zt_cpu_attention_bwd(&x.d, &ga, &err), 0);
    snprintf(what, sizeof(what), "%s: dq +=", c->name);
    expect_accumulated(what, aq, pq, dq, (size_t)(x.nq * qs));
    snprintf(what, sizeof(what), "%s: dkv +=", c->name);
    expect_accumulated(what, akv, pkv, dkv, (size_t)(x.nk * kvs));
    if (c->bias)
        expect_accumulated("dbias_table +=", atab, ptab, dtab, (size_t)ntab);
    ga.accumulate = false;
    assert_int_equal(zt_cpu_attention_bwd(&x.d, &ga, &err), 0);
    assert_memory_equal(aq, dq, sizeof(double) * x.nq * qs);
    assert_memory_equal(akv, dkv, sizeof(double) * x.nk * kvs);
    if (c->bias)
        assert_memory_equal(atab, dtab, sizeof(double) * ntab);

    free(x.q); free(x.kv); free(x.out); free(x.lse); free(x.w); free(x.table); free(want); free(wlse);
    free(dq); free(dkv); free(dtab); free(aq); free(akv); free(atab); free(pq); free(pkv); free(ptab);
}

static void test_attention_desc(void **state)
{
    (void)state;
    static const int32_t docs[4] = {0, 3, 3, 8};               /* packed documents, one empty */
    static const int32_t xq[3] = {0, 2, 6}, xk[3] = {0, 5, 8}; /* varlen cross-attention */
    static const int32_t lens[2] = {5, 3};
    const struct desc_case cases[] = {
        {.name = "cross-attention Tq 4 Tk 7, GQA, T5 encoder bias, scale 1", .B = 2, .Tq = 4, .Tk = 7, .NH = 4,
         .NKV = 2, .HS = 3, .scale = 1.0, .window = -1, .bias = true, .bidir = true, .nb = 8, .maxd = 10},
        {.name = "causal bottom-right Tq 4 Tk 6, window 2, T5 decoder bias", .B = 2, .Tq = 4, .Tk = 6, .NH = 2,
         .NKV = 1, .HS = 3, .causal = true, .window = 2, .bias = true, .bidir = false, .nb = 6, .maxd = 8},
        {.name = "causal Tq 6 > Tk 4 (rows without keys), scale 0.7", .B = 1, .Tq = 6, .Tk = 4, .NH = 2, .NKV = 2,
         .HS = 2, .scale = 0.7, .causal = true, .window = -1},
        {.name = "packed documents (cu_seqlens), causal, GQA, T5 decoder bias", .B = 3, .Tq = 5, .Tk = 5, .NH = 4,
         .NKV = 1, .HS = 3, .causal = true, .window = -1, .cu_q = docs, .cu_k = docs, .bias = true,
         .bidir = false, .nb = 6, .maxd = 8},
        {.name = "varlen cross-attention, window 1, bidirectional", .B = 2, .Tq = 4, .Tk = 5, .NH = 2, .NKV = 2,
         .HS = 3, .window = 1, .cu_q = xq, .cu_k = xk},
        {.name = "padding (lens), window 3, T5 encoder bias", .B = 2, .Tq = 5, .Tk = 5, .NH = 2, .NKV = 1, .HS = 3,
         .window = 3, .lens = lens, .bias = true, .bidir = true, .nb = 8, .maxd = 10},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_desc(&cases[i]);
}

/* The packed documents of a varlen call give, bit for bit, what each document gives alone (positions restart,
 * nothing crosses a document's border). */
static void test_attention_desc_documents(void **state)
{
    (void)state;
    static const int32_t cu[4] = {0, 4, 5, 11};
    enum { DN = 11, DNH = 2, DHS = 3, DW = 3 * DNH * DHS };
    double *qkv = rnd_array(DN * DW), *out = zero_array(DN * DNH * DHS), *lse = zero_array(3 * DNH * 6);
    double *table = rnd_array(6 * DNH);
    zt_attention_desc d = {.q = qkv, .k = qkv + DNH * DHS, .v = qkv + 2 * DNH * DHS, .q_stride = DW, .k_stride = DW,
                           .v_stride = DW, .out = out, .out_stride = DNH * DHS, .lse = lse, .B = 3, .Tq = 6, .Tk = 6,
                           .NH = DNH, .NKV = DNH, .HS = DHS, .causal = true, .window = -1, .cu_seqlens_q = cu,
                           .cu_seqlens_k = cu, .bias = ZT_ATTENTION_BIAS_T5, .bias_table = table, .num_buckets = 6,
                           .max_distance = 8};
    zt_err err;
    assert_int_equal(zt_cpu_attention_fwd(&d, &err), 0);
    for (int b = 0; b < 3; b++) {
        int n = cu[b + 1] - cu[b];
        double *o1 = zero_array((size_t)n * DNH * DHS), *l1 = zero_array((size_t)DNH * n);
        zt_attention_desc one = d;
        one.q = qkv + cu[b] * DW;
        one.k = qkv + cu[b] * DW + DNH * DHS;
        one.v = qkv + cu[b] * DW + 2 * DNH * DHS;
        one.out = o1;
        one.lse = l1;
        one.B = 1;
        one.Tq = one.Tk = n;
        one.cu_seqlens_q = one.cu_seqlens_k = NULL;
        assert_int_equal(zt_cpu_attention_fwd(&one, &err), 0);
        assert_memory_equal(o1, out + cu[b] * DNH * DHS, sizeof(double) * n * DNH * DHS);
        for (int h = 0; h < DNH; h++)
            assert_memory_equal(l1 + h * n, lse + (b * DNH + h) * 6, sizeof(double) * n);
        free(o1); free(l1);
    }
    free(qkv); free(out); free(lse); free(table);
}

/* T5's buckets (32 buckets, max distance 128) as transformers' _relative_position_bucket gives them. */
static void test_attention_t5_bucket(void **state)
{
    (void)state;
    static const int rel[19] = {-300, -128, -127, -64, -20, -9, -8, -7, -1, 0, 1, 7, 8, 9, 20, 64, 127, 128, 300};
    static const int bidir[19] = {15, 15, 15, 14, 10, 8, 8, 7, 1, 0, 17, 23, 24, 24, 26, 30, 31, 31, 31};
    static const int causal[19] = {31, 31, 31, 26, 17, 9, 8, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 19; i++) {
        assert_int_equal(zt_attention_t5_bucket(rel[i], true, 32, 128), bidir[i]);
        assert_int_equal(zt_attention_t5_bucket(rel[i], false, 32, 128), causal[i]);
    }
}

/* Bad descriptors are refused with a sentence naming the field. */
static void test_attention_desc_errors(void **state)
{
    (void)state;
    double buf[64] = {0};
    zt_attention_desc ok = {.q = buf, .k = buf, .v = buf, .q_stride = 6, .k_stride = 6, .v_stride = 6, .out = buf,
                            .out_stride = 6, .lse = buf, .B = 1, .Tq = 2, .Tk = 2, .NH = 2, .NKV = 2, .HS = 3,
                            .window = -1};
    zt_err err;
    assert_int_equal(zt_attention_check(&ok, true, &err), 0);
    zt_attention_desc d = ok;
    d.NKV = 4;
    assert_int_equal(zt_attention_check(&d, true, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "key/value heads"));
    d = ok;
    d.k_stride = 5;
    assert_int_equal(zt_attention_check(&d, true, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "strides"));
    static const int32_t cu[2] = {0, 3}, lens[1] = {1};
    d = ok;
    d.cu_seqlens_q = cu;
    assert_int_equal(zt_attention_check(&d, true, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "cu_seqlens_k"));
    d.cu_seqlens_k = cu; /* 3 rows > Tq 2 */
    assert_int_equal(zt_attention_check(&d, true, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "longest"));
    d = ok;
    d.lens = lens;
    d.Tk = 3;
    assert_int_equal(zt_attention_check(&d, true, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "Tq == Tk"));
    d = ok;
    d.bias = ZT_ATTENTION_BIAS_T5;
    d.bias_table = buf;
    d.num_buckets = 32;
    d.max_distance = 8;
    assert_int_equal(zt_attention_check(&d, true, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "max distance"));
    assert_int_equal(zt_cpu_attention_fwd(&d, &err), ZT_EINVAL_CONFIG);
}

int main(int argc, char **argv)
{
    /* --baseline: the portable build of the loops that have an AVX2 + FMA one (kernels/cpu/cpu_dispatch.h) */
    zt_cpu_force_baseline(argc > 1 && strcmp(argv[1], "--baseline") == 0);
    /* More threads than rows in most shapes, so empty and partial thread shares are exercised too. */
    zt_cpu_set_threads(3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),    cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),      cmocka_unit_test(test_embedding_typed),
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_matmul_large),
        cmocka_unit_test(test_attention),    cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_causal),
        cmocka_unit_test(test_attention_gqa), cmocka_unit_test(test_attention_gqa_equivalences),
        cmocka_unit_test(test_attention_padding),
        cmocka_unit_test(test_attention_desc), cmocka_unit_test(test_attention_desc_documents),
        cmocka_unit_test(test_attention_t5_bucket), cmocka_unit_test(test_attention_desc_errors),
        cmocka_unit_test(test_gelu),         cmocka_unit_test(test_gelu_erf),         cmocka_unit_test(test_residual),
        cmocka_unit_test(test_swiglu),       cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_partial),
        cmocka_unit_test(test_rope_positions),
        cmocka_unit_test(test_rope_inv_freq),
        cmocka_unit_test(test_crossentropy), cmocka_unit_test(test_classifier_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
