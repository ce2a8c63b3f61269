/* Causal multi-head self-attention, flash style: nothing of size T x T is stored. The forward keeps an
 * online softmax per query row over blocks of keys (running max and sum; the output accumulator is
 * rescaled when a block raises the max) and saves lse = max + log(sum) per row; the backward recomputes
 * each probability as exp(score - lse) and uses D = rowsum(dout * out).
 *
 * Work is split over (batch, head) pairs: a pair reads and writes only its own head's columns of qkv,
 * out, lse and dqkv, so no two threads touch the same output, and every sum inside a pair runs in a fixed
 * order. Per pair, K (and V in the backward) are copied transposed into a thread-local buffer so that the
 * scores of one query against a block of keys are computed with unit-stride, vectorisable loops. The
 * per-pair loops are compiled for the baseline and for AVX2 + FMA (kernels/cpu/cpu_dispatch.h). */
#include <stdlib.h>

#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_dispatch.h"
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"

/* Keys per block of the online softmax: long enough for vector loops, short enough for L1. */
#define ZT_ATTN_BLOCK 64

/* Shapes and buffers of one call, shared by the per-pair functions. */
typedef struct zt_attn_shape {
    int T, C, NH, hs;
    long C3;       /* row stride of qkv and dqkv: 3C */
    zt_real scale; /* 1 / sqrt(hs) */
} zt_attn_shape;

/* Copies the hs columns of a head from rows t = 0..T-1 of src (row stride C3) into dst[i * T + t]. */
ZT_CPU_INLINE void zt_attn_transpose(zt_real *restrict dst, const zt_real *restrict src, long C3, int T, int hs)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs; i++)
            dst[(long)i * T + t] = src[t * C3 + i];
}

/* s[j] = scale * sum_i q[i] * kt[i * T + j0 + j] for j in [0, len): one query against a block of keys. */
ZT_CPU_INLINE void zt_attn_scores(zt_real *restrict s, const zt_real *restrict q, const zt_real *restrict kt,
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
ZT_CPU_INLINE void zt_attn_axpy(zt_real *restrict y, zt_real a, const zt_real *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* One key's share of the backward: dq += ds k, dk += ds q, dv += p d (distinct rows of dqkv). */
ZT_CPU_INLINE void zt_attn_backward_update(zt_real *restrict dq, zt_real *restrict dk, zt_real *restrict dv,
                                           const zt_real *restrict q, const zt_real *restrict k,
                                           const zt_real *restrict d, zt_real ds, zt_real p, int hs)
{
    for (int i = 0; i < hs; i++) {
        dq[i] += ds * k[i];
        dk[i] += ds * q[i];
        dv[i] += p * d[i];
    }
}

/* Forward of one (batch, head) pair; kt [hs*T], s [ZT_ATTN_BLOCK] and acc [hs] are scratch. */
ZT_CPU_INLINE void zt_attn_forward_pair_body(zt_real *out, zt_real *lse, const zt_real *qkv,
                                             const zt_attn_shape *sh, int b, int h, zt_real *kt, zt_real *s,
                                             zt_real *acc)
{
    int T = sh->T, C = sh->C, hs = sh->hs;
    long C3 = sh->C3;
    const zt_real *base = qkv + (long)b * T * C3;
    zt_attn_transpose(kt, base + C + h * hs, C3, T, hs);
    for (int t = 0; t < T; t++) {
        const zt_real *q = base + t * C3 + h * hs;
        zt_real maxs = 0, sum = 0;
        for (int i = 0; i < hs; i++)
            acc[i] = 0;
        for (int j0 = 0; j0 <= t; j0 += ZT_ATTN_BLOCK) {
            int len = t + 1 - j0 < ZT_ATTN_BLOCK ? t + 1 - j0 : ZT_ATTN_BLOCK;
            zt_attn_scores(s, q, kt, T, hs, j0, len, sh->scale);
            zt_real bmax = s[0];
            for (int j = 1; j < len; j++)
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
            for (int j = 0; j < len; j++)
                s[j] = zt_real_exp(s[j] - maxs);
            for (int j = 0; j < len; j++) {
                sum += s[j];
                zt_attn_axpy(acc, s[j], base + (long)(j0 + j) * C3 + 2 * C + h * hs, hs);
            }
        }
        zt_real *o = out + ((long)b * T + t) * C + h * hs;
        zt_real inv = (zt_real)1 / sum;
        for (int i = 0; i < hs; i++)
            o[i] = acc[i] * inv;
        lse[((long)b * sh->NH + h) * T + t] = maxs + zt_real_log(sum);
    }
}

/* Backward of one (batch, head) pair; kt, vt [hs*T], p and dp [ZT_ATTN_BLOCK] are scratch. */
ZT_CPU_INLINE void zt_attn_backward_pair_body(zt_real *dqkv, const zt_real *dout, const zt_real *qkv,
                                              const zt_real *out, const zt_real *lse, const zt_attn_shape *sh,
                                              int b, int h, zt_real *kt, zt_real *vt, zt_real *p, zt_real *dp)
{
    int T = sh->T, C = sh->C, hs = sh->hs;
    long C3 = sh->C3;
    const zt_real *base = qkv + (long)b * T * C3;
    zt_real *dbase = dqkv + (long)b * T * C3;
    zt_attn_transpose(kt, base + C + h * hs, C3, T, hs);
    zt_attn_transpose(vt, base + 2 * C + h * hs, C3, T, hs);
    for (int t = 0; t < T; t++) {
        const zt_real *q = base + t * C3 + h * hs;
        zt_real *dq = dbase + t * C3 + h * hs;
        const zt_real *o = out + ((long)b * T + t) * C + h * hs;
        const zt_real *d = dout + ((long)b * T + t) * C + h * hs;
        zt_real row_lse = lse[((long)b * sh->NH + h) * T + t];
        zt_real D = 0;
        for (int i = 0; i < hs; i++)
            D += d[i] * o[i];
        for (int j0 = 0; j0 <= t; j0 += ZT_ATTN_BLOCK) {
            int len = t + 1 - j0 < ZT_ATTN_BLOCK ? t + 1 - j0 : ZT_ATTN_BLOCK;
            zt_attn_scores(p, q, kt, T, hs, j0, len, sh->scale);
            for (int j = 0; j < len; j++)
                p[j] = zt_real_exp(p[j] - row_lse);
            zt_attn_scores(dp, d, vt, T, hs, j0, len, (zt_real)1);
            for (int j = 0; j < len; j++) {
                zt_real ds = p[j] * (dp[j] - D) * sh->scale;
                long row = (long)(j0 + j) * C3 + h * hs;
                zt_attn_backward_update(dq, dbase + row + C, dbase + row + 2 * C, q, base + row + C, d, ds, p[j],
                                        hs);
            }
        }
    }
}

/* The pair functions for the baseline instruction set and for AVX2 + FMA. */
static void zt_attn_forward_pair_base(zt_real *out, zt_real *lse, const zt_real *qkv, const zt_attn_shape *sh,
                                      int b, int h, zt_real *kt, zt_real *s, zt_real *acc)
{
    zt_attn_forward_pair_body(out, lse, qkv, sh, b, h, kt, s, acc);
}

ZT_CPU_TARGET_AVX2 static void zt_attn_forward_pair_avx2(zt_real *out, zt_real *lse, const zt_real *qkv,
                                                         const zt_attn_shape *sh, int b, int h, zt_real *kt,
                                                         zt_real *s, zt_real *acc)
{
    zt_attn_forward_pair_body(out, lse, qkv, sh, b, h, kt, s, acc);
}

static void zt_attn_backward_pair_base(zt_real *dqkv, const zt_real *dout, const zt_real *qkv,
                                       const zt_real *out, const zt_real *lse, const zt_attn_shape *sh, int b,
                                       int h, zt_real *kt, zt_real *vt, zt_real *p, zt_real *dp)
{
    zt_attn_backward_pair_body(dqkv, dout, qkv, out, lse, sh, b, h, kt, vt, p, dp);
}

ZT_CPU_TARGET_AVX2 static void zt_attn_backward_pair_avx2(zt_real *dqkv, const zt_real *dout,
                                                          const zt_real *qkv, const zt_real *out,
                                                          const zt_real *lse, const zt_attn_shape *sh, int b,
                                                          int h, zt_real *kt, zt_real *vt, zt_real *p,
                                                          zt_real *dp)
{
    zt_attn_backward_pair_body(dqkv, dout, qkv, out, lse, sh, b, h, kt, vt, p, dp);
}

static zt_attn_shape zt_attn_make_shape(int T, int C, int NH)
{
    zt_attn_shape sh = {.T = T, .C = C, .NH = NH, .hs = C / NH, .C3 = 3L * C};
    sh.scale = (zt_real)1 / zt_real_sqrt((zt_real)sh.hs);
    return sh;
}

/* Writes out [B,T,C] and lse [B,NH,T] from qkv [B,T,3C]. */
void zt_cpu_attention_forward(zt_real *out, zt_real *lse, const zt_real *qkv, int B, int T, int C, int NH)
{
    zt_attn_shape sh = zt_attn_make_shape(T, C, NH);
    int avx2 = zt_cpu_has_avx2_fma();
    int pairs = B * NH;
    if (pairs <= 0 || T <= 0)
        return;
    int nthreads = zt_cpu_get_threads();
    if (nthreads > pairs)
        nthreads = pairs;

    #pragma omp parallel num_threads(nthreads)
    {
        zt_real *kt = malloc(sizeof(zt_real) * sh.hs * T);
        zt_real *s = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        zt_real *acc = malloc(sizeof(zt_real) * sh.hs);
        ZT_ASSERT(kt != NULL && s != NULL && acc != NULL);
        #pragma omp for schedule(static)
        for (int bh = 0; bh < pairs; bh++) {
            if (avx2)
                zt_attn_forward_pair_avx2(out, lse, qkv, &sh, bh / NH, bh % NH, kt, s, acc);
            else
                zt_attn_forward_pair_base(out, lse, qkv, &sh, bh / NH, bh % NH, kt, s, acc);
        }
        free(kt);
        free(s);
        free(acc);
    }
}

/* Adds the gradients with respect to q, k and v into dqkv [B,T,3C]. */
void zt_cpu_attention_backward(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                               const zt_real *lse, int B, int T, int C, int NH)
{
    zt_attn_shape sh = zt_attn_make_shape(T, C, NH);
    int avx2 = zt_cpu_has_avx2_fma();
    int pairs = B * NH;
    if (pairs <= 0 || T <= 0)
        return;
    int nthreads = zt_cpu_get_threads();
    if (nthreads > pairs)
        nthreads = pairs;

    #pragma omp parallel num_threads(nthreads)
    {
        zt_real *kt = malloc(sizeof(zt_real) * sh.hs * T);
        zt_real *vt = malloc(sizeof(zt_real) * sh.hs * T);
        zt_real *p = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        zt_real *dp = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        ZT_ASSERT(kt != NULL && vt != NULL && p != NULL && dp != NULL);
        #pragma omp for schedule(static)
        for (int bh = 0; bh < pairs; bh++) {
            if (avx2)
                zt_attn_backward_pair_avx2(dqkv, dout, qkv, out, lse, &sh, bh / NH, bh % NH, kt, vt, p, dp);
            else
                zt_attn_backward_pair_base(dqkv, dout, qkv, out, lse, &sh, bh / NH, bh % NH, kt, vt, p, dp);
        }
        free(kt);
        free(vt);
        free(p);
        free(dp);
    }
}
