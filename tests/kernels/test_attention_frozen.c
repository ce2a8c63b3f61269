/* The packed-qkv CPU attention entry points (zt_cpu_attention_forward/backward and their _gqa forms) against a
 * frozen copy of their implementation before the descriptor (kernels/attention.h) replaced it, bit for bit:
 * the models' CPU losses are checked bit for bit against earlier builds, so the wrappers over the descriptor
 * must keep every rounding of the old loops. The copy below is that implementation with its names changed
 * (frozen_*); it is compiled like kernels/cpu/attention.c (-ffp-contract=fast, the same AVX2 dispatch), and
 * the test runs on both instruction-set builds (--baseline). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_dispatch.h"
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"

_Static_assert(sizeof(zt_real) == sizeof(float), "this test must link zt_kernels_cpu (the training build)");

/* ---- frozen copy of kernels/cpu/attention.c as of the packed-qkv interface ---- */

/* Keys per block of the online softmax: long enough for vector loops, short enough for L1. */
#define FROZEN_BLOCK 64

/* Shapes and buffers of one call, shared by the per-group functions. */
typedef struct frozen_attn_shape {
    int T, NH, NKV, hs;
    int G;         /* query heads per key/value head: NH / NKV */
    long stride;   /* row stride of qkv and dqkv: (NH + 2 NKV) hs */
    long koff;     /* column of key head 0: NH hs */
    long voff;     /* column of value head 0: (NH + NKV) hs */
    long ostride;  /* row stride of out and dout: NH hs */
    int causal;
    zt_real scale; /* 1 / sqrt(hs) */
} frozen_attn_shape;

/* Copies the hs columns of a head from rows t = 0..n-1 of src (row stride `stride`) into dst[i * T + t]. */
ZT_CPU_INLINE void frozen_attn_transpose(zt_real *restrict dst, const zt_real *restrict src, long stride, int T, int n,
                                     int hs)
{
    for (int t = 0; t < n; t++)
        for (int i = 0; i < hs; i++)
            dst[(long)i * T + t] = src[t * stride + i];
}

/* s[j] = scale * sum_i q[i] * kt[i * T + j0 + j] for j in [0, len): one query against a block of keys. */
ZT_CPU_INLINE void frozen_attn_scores(zt_real *restrict s, const zt_real *restrict q, const zt_real *restrict kt,
                                  int T, int hs, int j0, int len, zt_real scale)
{
    for (int j = 0; j < len; j++)
        s[j] = 0;
    for (int i = 0; i < hs; i++) {
        zt_real qi = q[i];
        const zt_real *k = kt + (long)i * T + j0;
        for (int j = 0; j < len; j++)
            s[j] += qi * k[j];
    }
    for (int j = 0; j < len; j++)
        s[j] *= scale;
}

/* y[i] += a * x[i] for i in [0, n). */
ZT_CPU_INLINE void frozen_attn_axpy(zt_real *restrict y, zt_real a, const zt_real *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* One key's share of the backward: dq += ds k, dk += ds q, dv += p d (distinct rows of dqkv). */
ZT_CPU_INLINE void frozen_attn_backward_update(zt_real *restrict dq, zt_real *restrict dk, zt_real *restrict dv,
                                           const zt_real *restrict q, const zt_real *restrict k,
                                           const zt_real *restrict d, zt_real ds, zt_real p, int hs)
{
    for (int i = 0; i < hs; i++) {
        dq[i] += ds * k[i];
        dk[i] += ds * q[i];
        dv[i] += p * d[i];
    }
}

/* Forward of one (batch, key/value head) group: its G query heads. kt [hs*T], s [FROZEN_BLOCK] and acc [hs]
 * are scratch. Rows at or past len get zeros and lse = +inf. */
ZT_CPU_INLINE void frozen_attn_forward_group_body(zt_real *out, zt_real *lse, const zt_real *qkv, const frozen_attn_shape *sh,
                                              int b, int g, int len, zt_real *kt, zt_real *s, zt_real *acc)
{
    int T = sh->T, hs = sh->hs;
    long stride = sh->stride;
    const zt_real *base = qkv + (long)b * T * stride;
    frozen_attn_transpose(kt, base + sh->koff + (long)g * hs, stride, T, len, hs);
    const zt_real *vbase = base + sh->voff + (long)g * hs;
    for (int h = g * sh->G; h < (g + 1) * sh->G; h++) {
        for (int t = 0; t < T; t++) {
            zt_real *o = out + ((long)b * T + t) * sh->ostride + (long)h * hs;
            zt_real *row_lse = lse + ((long)b * sh->NH + h) * T + t;
            if (t >= len) {
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                *row_lse = (zt_real)INFINITY;
                continue;
            }
            const zt_real *q = base + t * stride + (long)h * hs;
            const int kend = sh->causal ? t + 1 : len; /* keys [0, kend) */
            zt_real maxs = 0, sum = 0;
            for (int i = 0; i < hs; i++)
                acc[i] = 0;
            for (int j0 = 0; j0 < kend; j0 += FROZEN_BLOCK) {
                int n = kend - j0 < FROZEN_BLOCK ? kend - j0 : FROZEN_BLOCK;
                frozen_attn_scores(s, q, kt, T, hs, j0, n, sh->scale);
                zt_real bmax = s[0];
                for (int j = 1; j < n; j++)
                    bmax = s[j] > bmax ? s[j] : bmax;
                if (j0 == 0) {
                    maxs = bmax;
                } else if (bmax > maxs) {
                    zt_real corr = zt_real_exp(maxs - bmax);
                    sum *= corr;
                    for (int i = 0; i < hs; i++)
                        acc[i] *= corr;
                    maxs = bmax;
                }
                for (int j = 0; j < n; j++)
                    s[j] = zt_real_exp(s[j] - maxs);
                for (int j = 0; j < n; j++) {
                    sum += s[j];
                    frozen_attn_axpy(acc, s[j], vbase + (long)(j0 + j) * stride, hs);
                }
            }
            zt_real inv = (zt_real)1 / sum;
            for (int i = 0; i < hs; i++)
                o[i] = acc[i] * inv;
            *row_lse = maxs + zt_real_log(sum);
        }
    }
}

/* Backward of one (batch, key/value head) group; kt, vt [hs*T], p and dp [FROZEN_BLOCK] are scratch. The
 * group's key and value rows get the sums over its G query heads, in head order. */
ZT_CPU_INLINE void frozen_attn_backward_group_body(zt_real *dqkv, const zt_real *dout, const zt_real *qkv,
                                               const zt_real *out, const zt_real *lse, const frozen_attn_shape *sh,
                                               int b, int g, int len, zt_real *kt, zt_real *vt, zt_real *p,
                                               zt_real *dp)
{
    int T = sh->T, hs = sh->hs;
    long stride = sh->stride;
    const zt_real *base = qkv + (long)b * T * stride;
    zt_real *dbase = dqkv + (long)b * T * stride;
    const long kcol = sh->koff + (long)g * hs, vcol = sh->voff + (long)g * hs;
    frozen_attn_transpose(kt, base + kcol, stride, T, len, hs);
    frozen_attn_transpose(vt, base + vcol, stride, T, len, hs);
    for (int h = g * sh->G; h < (g + 1) * sh->G; h++) {
        for (int t = 0; t < len; t++) {
            const zt_real *q = base + t * stride + (long)h * hs;
            zt_real *dq = dbase + t * stride + (long)h * hs;
            const zt_real *o = out + ((long)b * T + t) * sh->ostride + (long)h * hs;
            const zt_real *d = dout + ((long)b * T + t) * sh->ostride + (long)h * hs;
            zt_real row_lse = lse[((long)b * sh->NH + h) * T + t];
            const int kend = sh->causal ? t + 1 : len;
            zt_real D = 0;
            for (int i = 0; i < hs; i++)
                D += d[i] * o[i];
            for (int j0 = 0; j0 < kend; j0 += FROZEN_BLOCK) {
                int n = kend - j0 < FROZEN_BLOCK ? kend - j0 : FROZEN_BLOCK;
                frozen_attn_scores(p, q, kt, T, hs, j0, n, sh->scale);
                for (int j = 0; j < n; j++)
                    p[j] = zt_real_exp(p[j] - row_lse);
                frozen_attn_scores(dp, d, vt, T, hs, j0, n, (zt_real)1);
                for (int j = 0; j < n; j++) {
                    zt_real ds = p[j] * (dp[j] - D) * sh->scale;
                    long row = (long)(j0 + j) * stride;
                    frozen_attn_backward_update(dq, dbase + row + kcol, dbase + row + vcol, q, base + row + kcol, d,
                                            ds, p[j], hs);
                }
            }
        }
    }
}

/* The group functions for the baseline instruction set and for AVX2 + FMA. */
static void frozen_attn_forward_group_base(zt_real *out, zt_real *lse, const zt_real *qkv, const frozen_attn_shape *sh,
                                       int b, int g, int len, zt_real *kt, zt_real *s, zt_real *acc)
{
    frozen_attn_forward_group_body(out, lse, qkv, sh, b, g, len, kt, s, acc);
}

ZT_CPU_TARGET_AVX2 static void frozen_attn_forward_group_avx2(zt_real *out, zt_real *lse, const zt_real *qkv,
                                                          const frozen_attn_shape *sh, int b, int g, int len,
                                                          zt_real *kt, zt_real *s, zt_real *acc)
{
    frozen_attn_forward_group_body(out, lse, qkv, sh, b, g, len, kt, s, acc);
}

static void frozen_attn_backward_group_base(zt_real *dqkv, const zt_real *dout, const zt_real *qkv,
                                        const zt_real *out, const zt_real *lse, const frozen_attn_shape *sh, int b,
                                        int g, int len, zt_real *kt, zt_real *vt, zt_real *p, zt_real *dp)
{
    frozen_attn_backward_group_body(dqkv, dout, qkv, out, lse, sh, b, g, len, kt, vt, p, dp);
}

ZT_CPU_TARGET_AVX2 static void frozen_attn_backward_group_avx2(zt_real *dqkv, const zt_real *dout,
                                                           const zt_real *qkv, const zt_real *out,
                                                           const zt_real *lse, const frozen_attn_shape *sh, int b,
                                                           int g, int len, zt_real *kt, zt_real *vt, zt_real *p,
                                                           zt_real *dp)
{
    frozen_attn_backward_group_body(dqkv, dout, qkv, out, lse, sh, b, g, len, kt, vt, p, dp);
}

static frozen_attn_shape frozen_attn_make_shape(const zt_attention_dims *d)
{
    ZT_ASSERT(d->B >= 0 && d->T >= 0 && d->NH > 0 && d->NKV > 0 && d->NH % d->NKV == 0 && d->HS > 0);
    frozen_attn_shape sh = {.T = d->T, .NH = d->NH, .NKV = d->NKV, .hs = d->HS, .G = d->NH / d->NKV,
                        .stride = (long)(d->NH + 2 * d->NKV) * d->HS, .koff = (long)d->NH * d->HS,
                        .voff = (long)(d->NH + d->NKV) * d->HS, .ostride = (long)d->NH * d->HS,
                        .causal = d->causal};
    sh.scale = (zt_real)1 / zt_real_sqrt((zt_real)sh.hs);
    return sh;
}

/* The valid length of sequence b: lens[b] clamped to [0, T], or T without lens. */
static int frozen_attn_len(const int32_t *lens, int b, int T)
{
    if (!lens)
        return T;
    return lens[b] < 0 ? 0 : lens[b] > T ? T : (int)lens[b];
}

/* Writes out [B,T,NH*HS] and lse [B,NH,T] from qkv [B,T,(NH+2*NKV)*HS]. */
static void frozen_forward_gqa(zt_real *out, zt_real *lse, const zt_real *qkv, const int32_t *lens,
                                  const zt_attention_dims *d)
{
    frozen_attn_shape sh = frozen_attn_make_shape(d);
    int T = d->T, avx2 = zt_cpu_has_avx2_fma();
    int groups = d->B * d->NKV;
    if (groups <= 0 || T <= 0)
        return;
    int nthreads = zt_cpu_get_threads();
    if (nthreads > groups)
        nthreads = groups;

    #pragma omp parallel num_threads(nthreads)
    {
        zt_real *kt = malloc(sizeof(zt_real) * sh.hs * T);
        zt_real *s = malloc(sizeof(zt_real) * FROZEN_BLOCK);
        zt_real *acc = malloc(sizeof(zt_real) * sh.hs);
        ZT_ASSERT(kt != NULL && s != NULL && acc != NULL);
        #pragma omp for schedule(static)
        for (int bg = 0; bg < groups; bg++) {
            int b = bg / d->NKV, g = bg % d->NKV, len = frozen_attn_len(lens, b, T);
            if (avx2)
                frozen_attn_forward_group_avx2(out, lse, qkv, &sh, b, g, len, kt, s, acc);
            else
                frozen_attn_forward_group_base(out, lse, qkv, &sh, b, g, len, kt, s, acc);
        }
        free(kt);
        free(s);
        free(acc);
    }
}

/* Adds the gradients with respect to q, k and v into dqkv [B,T,(NH+2*NKV)*HS]. */
static void frozen_backward_gqa(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                                   const zt_real *lse, const int32_t *lens, const zt_attention_dims *d)
{
    frozen_attn_shape sh = frozen_attn_make_shape(d);
    int T = d->T, avx2 = zt_cpu_has_avx2_fma();
    int groups = d->B * d->NKV;
    if (groups <= 0 || T <= 0)
        return;
    int nthreads = zt_cpu_get_threads();
    if (nthreads > groups)
        nthreads = groups;

    #pragma omp parallel num_threads(nthreads)
    {
        zt_real *kt = malloc(sizeof(zt_real) * sh.hs * T);
        zt_real *vt = malloc(sizeof(zt_real) * sh.hs * T);
        zt_real *p = malloc(sizeof(zt_real) * FROZEN_BLOCK);
        zt_real *dp = malloc(sizeof(zt_real) * FROZEN_BLOCK);
        ZT_ASSERT(kt != NULL && vt != NULL && p != NULL && dp != NULL);
        #pragma omp for schedule(static)
        for (int bg = 0; bg < groups; bg++) {
            int b = bg / d->NKV, g = bg % d->NKV, len = frozen_attn_len(lens, b, T);
            if (avx2)
                frozen_attn_backward_group_avx2(dqkv, dout, qkv, out, lse, &sh, b, g, len, kt, vt, p, dp);
            else
                frozen_attn_backward_group_base(dqkv, dout, qkv, out, lse, &sh, b, g, len, kt, vt, p, dp);
        }
        free(kt);
        free(vt);
        free(p);
        free(dp);
    }
}


/* ---- the comparisons ---- */

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static float rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / (double)(1ull << 52) - 1.0);
}

static float *rnd_array(size_t n, float scale)
{
    float *x = malloc(sizeof(float) * n);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = rnd() * scale;
    return x;
}

static float *copy_array(const float *x, size_t n)
{
    float *y = malloc(sizeof(float) * n);
    assert_non_null(y);
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* Fails unless a and b hold the same bits. */
static void expect_same_bits(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu is %.9g, the frozen implementation gives %.9g", what, i, a[i], b[i]);
}

/* One shape: forward (out, lse) and backward (added onto the same random dqkv) of the entry point against the
 * frozen copy. mha: through zt_cpu_attention_forward/backward (causal, NKV = NH, no lens). */
static void check_shape(int B, int T, int NH, int NKV, int HS, bool causal, const int32_t *lens, bool mha)
{
    const zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .causal = causal};
    const size_t W = (size_t)(NH + 2 * NKV) * HS, OW = (size_t)NH * HS;
    const size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * OW, nlse = (size_t)B * NH * T;
    float *qkv = rnd_array(nqkv, 2.0f), *dout = rnd_array(nout, 1.0f), *pre = rnd_array(nqkv, 1.0f);
    float *out = calloc(nout, sizeof(float)), *lse = calloc(nlse, sizeof(float));
    float *fout = calloc(nout, sizeof(float)), *flse = calloc(nlse, sizeof(float));
    float *dqkv = copy_array(pre, nqkv), *fdqkv = copy_array(pre, nqkv);
    char what[128];
    snprintf(what, sizeof(what), "B%d T%d NH%d NKV%d HS%d %s%s%s", B, T, NH, NKV, HS, causal ? "causal" : "bidirectional",
             lens ? " padded" : "", mha ? " (multi-head entry points)" : "");
    if (mha) {
        zt_cpu_attention_forward(out, lse, qkv, B, T, NH * HS, NH);
        zt_cpu_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH * HS, NH);
    } else {
        zt_cpu_attention_forward_gqa(out, lse, qkv, lens, &d);
        zt_cpu_attention_backward_gqa(dqkv, dout, qkv, out, lse, lens, &d);
    }
    frozen_forward_gqa(fout, flse, qkv, lens, &d);
    frozen_backward_gqa(fdqkv, dout, qkv, fout, flse, lens, &d);
    printf("    %s\n", what);
    expect_same_bits(what, out, fout, nout);
    expect_same_bits(what, lse, flse, nlse);
    expect_same_bits(what, dqkv, fdqkv, nqkv);
    free(qkv); free(dout); free(pre); free(out); free(lse); free(fout); free(flse); free(dqkv); free(fdqkv);
}

static void test_multi_head(void **state)
{
    (void)state;
    check_shape(2, 70, 4, 4, 16, true, NULL, true);   /* GPT-2 style, two key blocks */
    check_shape(1, 64, 2, 2, 64, true, NULL, true);   /* exactly one block */
    check_shape(3, 1, 3, 3, 8, true, NULL, true);     /* one position */
    check_shape(1, 200, 2, 2, 24, true, NULL, true);  /* four blocks, a partial one */
}

static void test_grouped_query(void **state)
{
    (void)state;
    const int32_t lens3[3] = {70, 33, 0}, lens2[2] = {150, 129};
    check_shape(2, 150, 6, 2, 64, true, NULL, false);  /* TinyLlama-like ratio 3 */
    check_shape(2, 33, 8, 1, 32, false, NULL, false);  /* one key/value head, bidirectional */
    check_shape(3, 70, 4, 4, 20, false, lens3, false); /* BERT padding: full, partial, empty */
    check_shape(2, 150, 3, 1, 8, true, lens2, false);  /* causal with padding */
    check_shape(2, 130, 2, 1, 40, false, lens2, false);
}

int main(int argc, char **argv)
{
    zt_cpu_force_baseline(argc > 1 && strcmp(argv[1], "--baseline") == 0);
    zt_cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_head),
        cmocka_unit_test(test_grouped_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
