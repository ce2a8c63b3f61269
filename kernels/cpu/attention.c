/* Self-attention with grouped-query heads, causal or bidirectional, with an optional padding mask, flash
 * style: nothing of size T x T is stored. The forward keeps an online softmax per query row over blocks of
 * keys (running max and sum; the output accumulator is rescaled when a block raises the max) and saves
 * lse = max + log(sum) per row; the backward recomputes each probability as exp(score - lse) and uses
 * D = rowsum(dout * out).
 *
 * Work is split over (batch, key/value head) groups: a group reads and writes only its key/value head's
 * columns and those of the query heads that share it, so no two threads touch the same output, and every
 * sum inside a group runs in a fixed order (query heads in order, then rows, then keys). Per group, K (and V
 * in the backward) are copied transposed into a thread-local buffer so that the scores of one query against
 * a block of keys are computed with unit-stride, vectorisable loops. The per-group loops are compiled for
 * the baseline and for AVX2 + FMA (kernels/cpu/cpu_dispatch.h). Multi-head causal attention (the first
 * entry points) is the case NKV = NH, causal, no mask, and runs the same loops. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_dispatch.h"
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"

/* Keys per block of the online softmax: long enough for vector loops, short enough for L1. */
#define ZT_ATTN_BLOCK 64

/* Shapes and buffers of one call, shared by the per-group functions. */
typedef struct zt_attn_shape {
    int T, NH, NKV, hs;
    int G;         /* query heads per key/value head: NH / NKV */
    long stride;   /* row stride of qkv and dqkv: (NH + 2 NKV) hs */
    long koff;     /* column of key head 0: NH hs */
    long voff;     /* column of value head 0: (NH + NKV) hs */
    long ostride;  /* row stride of out and dout: NH hs */
    int causal;
    zt_real scale; /* 1 / sqrt(hs) */
} zt_attn_shape;

/* Copies the hs columns of a head from rows t = 0..n-1 of src (row stride `stride`) into dst[i * T + t]. */
ZT_CPU_INLINE void zt_attn_transpose(zt_real *restrict dst, const zt_real *restrict src, long stride, int T, int n,
                                     int hs)
{
    for (int t = 0; t < n; t++)
        for (int i = 0; i < hs; i++)
            dst[(long)i * T + t] = src[t * stride + i];
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

/* Forward of one (batch, key/value head) group: its G query heads. kt [hs*T], s [ZT_ATTN_BLOCK] and acc [hs]
 * are scratch. Rows at or past len get zeros and lse = +inf. */
ZT_CPU_INLINE void zt_attn_forward_group_body(zt_real *out, zt_real *lse, const zt_real *qkv, const zt_attn_shape *sh,
                                              int b, int g, int len, zt_real *kt, zt_real *s, zt_real *acc)
{
    int T = sh->T, hs = sh->hs;
    long stride = sh->stride;
    const zt_real *base = qkv + (long)b * T * stride;
    zt_attn_transpose(kt, base + sh->koff + (long)g * hs, stride, T, len, hs);
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
            for (int j0 = 0; j0 < kend; j0 += ZT_ATTN_BLOCK) {
                int n = kend - j0 < ZT_ATTN_BLOCK ? kend - j0 : ZT_ATTN_BLOCK;
                zt_attn_scores(s, q, kt, T, hs, j0, n, sh->scale);
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
                    zt_attn_axpy(acc, s[j], vbase + (long)(j0 + j) * stride, hs);
                }
            }
            zt_real inv = (zt_real)1 / sum;
            for (int i = 0; i < hs; i++)
                o[i] = acc[i] * inv;
            *row_lse = maxs + zt_real_log(sum);
        }
    }
}

/* Backward of one (batch, key/value head) group; kt, vt [hs*T], p and dp [ZT_ATTN_BLOCK] are scratch. The
 * group's key and value rows get the sums over its G query heads, in head order. */
ZT_CPU_INLINE void zt_attn_backward_group_body(zt_real *dqkv, const zt_real *dout, const zt_real *qkv,
                                               const zt_real *out, const zt_real *lse, const zt_attn_shape *sh,
                                               int b, int g, int len, zt_real *kt, zt_real *vt, zt_real *p,
                                               zt_real *dp)
{
    int T = sh->T, hs = sh->hs;
    long stride = sh->stride;
    const zt_real *base = qkv + (long)b * T * stride;
    zt_real *dbase = dqkv + (long)b * T * stride;
    const long kcol = sh->koff + (long)g * hs, vcol = sh->voff + (long)g * hs;
    zt_attn_transpose(kt, base + kcol, stride, T, len, hs);
    zt_attn_transpose(vt, base + vcol, stride, T, len, hs);
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
            for (int j0 = 0; j0 < kend; j0 += ZT_ATTN_BLOCK) {
                int n = kend - j0 < ZT_ATTN_BLOCK ? kend - j0 : ZT_ATTN_BLOCK;
                zt_attn_scores(p, q, kt, T, hs, j0, n, sh->scale);
                for (int j = 0; j < n; j++)
                    p[j] = zt_real_exp(p[j] - row_lse);
                zt_attn_scores(dp, d, vt, T, hs, j0, n, (zt_real)1);
                for (int j = 0; j < n; j++) {
                    zt_real ds = p[j] * (dp[j] - D) * sh->scale;
                    long row = (long)(j0 + j) * stride;
                    zt_attn_backward_update(dq, dbase + row + kcol, dbase + row + vcol, q, base + row + kcol, d,
                                            ds, p[j], hs);
                }
            }
        }
    }
}

/* The group functions for the baseline instruction set and for AVX2 + FMA. */
static void zt_attn_forward_group_base(zt_real *out, zt_real *lse, const zt_real *qkv, const zt_attn_shape *sh,
                                       int b, int g, int len, zt_real *kt, zt_real *s, zt_real *acc)
{
    zt_attn_forward_group_body(out, lse, qkv, sh, b, g, len, kt, s, acc);
}

ZT_CPU_TARGET_AVX2 static void zt_attn_forward_group_avx2(zt_real *out, zt_real *lse, const zt_real *qkv,
                                                          const zt_attn_shape *sh, int b, int g, int len,
                                                          zt_real *kt, zt_real *s, zt_real *acc)
{
    zt_attn_forward_group_body(out, lse, qkv, sh, b, g, len, kt, s, acc);
}

static void zt_attn_backward_group_base(zt_real *dqkv, const zt_real *dout, const zt_real *qkv,
                                        const zt_real *out, const zt_real *lse, const zt_attn_shape *sh, int b,
                                        int g, int len, zt_real *kt, zt_real *vt, zt_real *p, zt_real *dp)
{
    zt_attn_backward_group_body(dqkv, dout, qkv, out, lse, sh, b, g, len, kt, vt, p, dp);
}

ZT_CPU_TARGET_AVX2 static void zt_attn_backward_group_avx2(zt_real *dqkv, const zt_real *dout,
                                                           const zt_real *qkv, const zt_real *out,
                                                           const zt_real *lse, const zt_attn_shape *sh, int b,
                                                           int g, int len, zt_real *kt, zt_real *vt, zt_real *p,
                                                           zt_real *dp)
{
    zt_attn_backward_group_body(dqkv, dout, qkv, out, lse, sh, b, g, len, kt, vt, p, dp);
}

static zt_attn_shape zt_attn_make_shape(const zt_attention_dims *d)
{
    ZT_ASSERT(d->B >= 0 && d->T >= 0 && d->NH > 0 && d->NKV > 0 && d->NH % d->NKV == 0 && d->HS > 0);
    zt_attn_shape sh = {.T = d->T, .NH = d->NH, .NKV = d->NKV, .hs = d->HS, .G = d->NH / d->NKV,
                        .stride = (long)(d->NH + 2 * d->NKV) * d->HS, .koff = (long)d->NH * d->HS,
                        .voff = (long)(d->NH + d->NKV) * d->HS, .ostride = (long)d->NH * d->HS,
                        .causal = d->causal};
    sh.scale = (zt_real)1 / zt_real_sqrt((zt_real)sh.hs);
    return sh;
}

/* The valid length of sequence b: lens[b] clamped to [0, T], or T without lens. */
static int zt_attn_len(const int32_t *lens, int b, int T)
{
    if (!lens)
        return T;
    return lens[b] < 0 ? 0 : lens[b] > T ? T : (int)lens[b];
}

/* Writes out [B,T,NH*HS] and lse [B,NH,T] from qkv [B,T,(NH+2*NKV)*HS]. */
void zt_cpu_attention_forward_gqa(zt_real *out, zt_real *lse, const zt_real *qkv, const int32_t *lens,
                                  const zt_attention_dims *d)
{
    zt_attn_shape sh = zt_attn_make_shape(d);
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
        zt_real *s = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        zt_real *acc = malloc(sizeof(zt_real) * sh.hs);
        ZT_ASSERT(kt != NULL && s != NULL && acc != NULL);
        #pragma omp for schedule(static)
        for (int bg = 0; bg < groups; bg++) {
            int b = bg / d->NKV, g = bg % d->NKV, len = zt_attn_len(lens, b, T);
            if (avx2)
                zt_attn_forward_group_avx2(out, lse, qkv, &sh, b, g, len, kt, s, acc);
            else
                zt_attn_forward_group_base(out, lse, qkv, &sh, b, g, len, kt, s, acc);
        }
        free(kt);
        free(s);
        free(acc);
    }
}

/* Adds the gradients with respect to q, k and v into dqkv [B,T,(NH+2*NKV)*HS]. */
void zt_cpu_attention_backward_gqa(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                                   const zt_real *lse, const int32_t *lens, const zt_attention_dims *d)
{
    zt_attn_shape sh = zt_attn_make_shape(d);
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
        zt_real *p = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        zt_real *dp = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        ZT_ASSERT(kt != NULL && vt != NULL && p != NULL && dp != NULL);
        #pragma omp for schedule(static)
        for (int bg = 0; bg < groups; bg++) {
            int b = bg / d->NKV, g = bg % d->NKV, len = zt_attn_len(lens, b, T);
            if (avx2)
                zt_attn_backward_group_avx2(dqkv, dout, qkv, out, lse, &sh, b, g, len, kt, vt, p, dp);
            else
                zt_attn_backward_group_base(dqkv, dout, qkv, out, lse, &sh, b, g, len, kt, vt, p, dp);
        }
        free(kt);
        free(vt);
        free(p);
        free(dp);
    }
}

/* Causal multi-head attention over qkv [B,T,3C]: the grouped-query kernel with NKV = NH. */
void zt_cpu_attention_forward(zt_real *out, zt_real *lse, const zt_real *qkv, int B, int T, int C, int NH)
{
    zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NH, .HS = C / NH, .causal = true};
    zt_cpu_attention_forward_gqa(out, lse, qkv, NULL, &d);
}

void zt_cpu_attention_backward(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                               const zt_real *lse, int B, int T, int C, int NH)
{
    zt_attention_dims d = {.B = B, .T = T, .NH = NH, .NKV = NH, .HS = C / NH, .causal = true};
    zt_cpu_attention_backward_gqa(dqkv, dout, qkv, out, lse, NULL, &d);
}
