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
    int NH, NKV, hs;
    int G;            /* query heads per key/value head: NH / NKV */
    long qs, ks, vs;  /* row strides of q, k, v (and of dq, dk, dv in the backward: dqs, dks, dvs) */
    long dqs, dks, dvs;
    long ostride;     /* row stride of out and dout */
    int Tq;           /* lse rows per (sequence, head) */
    int ktl;          /* row length of the transposed key/value buffers: the longest key sequence */
    int causal;
    int window;       /* < 0: none */
    zt_real scale;
    const zt_real *table; /* T5 bias table [nb, NH] or NULL */
    const int *bucket;    /* bucket of rel = j - pos at bucket[rel + brel0] */
    int brel0;
} zt_attn_shape;

/* One sequence of a call: its first query and key rows, its query rows (span), the rows and keys that take
 * part (valid; below span with padding) and the query position offset lk - lq. */
typedef struct zt_attn_seq {
    long q0, k0;
    int span, qvalid, kvalid, off;
} zt_attn_seq;

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

/* The keys [*kbeg, *kend) query row t of sequence sq sees (an empty range for none). */
ZT_CPU_INLINE void zt_attn_key_range(const zt_attn_shape *sh, const zt_attn_seq *sq, int t, int *kbeg, int *kend)
{
    const int pos = t + sq->off;
    int hi = sq->kvalid, lo = 0;
    if (sh->causal && pos + 1 < hi)
        hi = pos + 1;
    if (sh->window >= 0 && pos - sh->window > lo)
        lo = pos - sh->window;
    *kbeg = lo;
    *kend = hi;
}

/* s[j] += bias of (head h, query position pos, key j0 + j) for j in [0, n). */
ZT_CPU_INLINE void zt_attn_add_bias(zt_real *restrict s, const zt_attn_shape *sh, int h, int pos, int j0, int n)
{
    const int *bk = sh->bucket + sh->brel0 + j0 - pos;
    for (int j = 0; j < n; j++)
        s[j] += sh->table[(long)bk[j] * sh->NH + h];
}

/* Forward of one (sequence, key/value head) group: its G query heads. kt [hs*ktl], s [ZT_ATTN_BLOCK] and acc
 * [hs] are scratch. Rows at or past qvalid, and rows that see no key, get zeros and lse = +inf. */
ZT_CPU_INLINE void zt_attn_forward_group_body(zt_real *out, zt_real *lse, const zt_real *q_, const zt_real *k_,
                                              const zt_real *v_, const zt_attn_shape *sh, const zt_attn_seq *sq,
                                              int b, int g, zt_real *kt, zt_real *s, zt_real *acc)
{
    const int hs = sh->hs, ktl = sh->ktl;
    const zt_real *qbase = q_ + sq->q0 * sh->qs;
    zt_attn_transpose(kt, k_ + sq->k0 * sh->ks + (long)g * hs, sh->ks, ktl, sq->kvalid, hs);
    const zt_real *vbase = v_ + sq->k0 * sh->vs + (long)g * hs;
    const long vstride = sh->vs;
    for (int h = g * sh->G; h < (g + 1) * sh->G; h++) {
        for (int t = 0; t < sq->span; t++) {
            zt_real *o = out + (sq->q0 + t) * sh->ostride + (long)h * hs;
            zt_real *row_lse = lse + ((long)b * sh->NH + h) * sh->Tq + t;
            int kbeg = 0, kend = 0;
            if (t < sq->qvalid)
                zt_attn_key_range(sh, sq, t, &kbeg, &kend);
            if (kbeg >= kend) {
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                *row_lse = (zt_real)INFINITY;
                continue;
            }
            const zt_real *q = qbase + t * sh->qs + (long)h * hs;
            zt_real maxs = 0, sum = 0;
            for (int i = 0; i < hs; i++)
                acc[i] = 0;
            for (int j0 = kbeg; j0 < kend; j0 += ZT_ATTN_BLOCK) {
                int n = kend - j0 < ZT_ATTN_BLOCK ? kend - j0 : ZT_ATTN_BLOCK;
                zt_attn_scores(s, q, kt, ktl, hs, j0, n, sh->scale);
                if (sh->table)
                    zt_attn_add_bias(s, sh, h, t + sq->off, j0, n);
                zt_real bmax = s[0];
                for (int j = 1; j < n; j++)
                    bmax = s[j] > bmax ? s[j] : bmax;
                if (j0 == kbeg) {
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
                    zt_attn_axpy(acc, s[j], vbase + (long)(j0 + j) * vstride, hs);
                }
            }
            zt_real inv = (zt_real)1 / sum;
            for (int i = 0; i < hs; i++)
                o[i] = acc[i] * inv;
            *row_lse = maxs + zt_real_log(sum);
        }
    }
}

/* Backward of one (sequence, key/value head) group; kt, vt [hs*ktl], p and dp [ZT_ATTN_BLOCK] are scratch;
 * dtab [nb*NH] (NULL without a bias) receives this sequence's bias-table gradient. The group's key and value
 * rows get the sums over its G query heads, in head order. */
ZT_CPU_INLINE void zt_attn_backward_group_body(zt_real *dq_, zt_real *dk_, zt_real *dv_, const zt_real *dout,
                                               const zt_real *q_, const zt_real *k_, const zt_real *v_,
                                               const zt_real *out, const zt_real *lse, const zt_attn_shape *sh,
                                               const zt_attn_seq *sq, int b, int g, zt_real *kt, zt_real *vt,
                                               zt_real *p, zt_real *dp, zt_real *dtab)
{
    const int hs = sh->hs, ktl = sh->ktl;
    const zt_real *qbase = q_ + sq->q0 * sh->qs;
    zt_real *dqbase = dq_ + sq->q0 * sh->dqs;
    const zt_real *kbase = k_ + sq->k0 * sh->ks + (long)g * hs;
    zt_real *dkbase = dk_ + sq->k0 * sh->dks + (long)g * hs;
    zt_real *dvbase = dv_ + sq->k0 * sh->dvs + (long)g * hs;
    zt_attn_transpose(kt, kbase, sh->ks, ktl, sq->kvalid, hs);
    zt_attn_transpose(vt, v_ + sq->k0 * sh->vs + (long)g * hs, sh->vs, ktl, sq->kvalid, hs);
    for (int h = g * sh->G; h < (g + 1) * sh->G; h++) {
        for (int t = 0; t < sq->qvalid; t++) {
            int kbeg, kend;
            zt_attn_key_range(sh, sq, t, &kbeg, &kend);
            if (kbeg >= kend)
                continue;
            const zt_real *q = qbase + t * sh->qs + (long)h * hs;
            zt_real *dq = dqbase + t * sh->dqs + (long)h * hs;
            const zt_real *o = out + (sq->q0 + t) * sh->ostride + (long)h * hs;
            const zt_real *d = dout + (sq->q0 + t) * sh->ostride + (long)h * hs;
            zt_real row_lse = lse[((long)b * sh->NH + h) * sh->Tq + t];
            zt_real D = 0;
            for (int i = 0; i < hs; i++)
                D += d[i] * o[i];
            for (int j0 = kbeg; j0 < kend; j0 += ZT_ATTN_BLOCK) {
                int n = kend - j0 < ZT_ATTN_BLOCK ? kend - j0 : ZT_ATTN_BLOCK;
                zt_attn_scores(p, q, kt, ktl, hs, j0, n, sh->scale);
                if (sh->table)
                    zt_attn_add_bias(p, sh, h, t + sq->off, j0, n);
                for (int j = 0; j < n; j++)
                    p[j] = zt_real_exp(p[j] - row_lse);
                zt_attn_scores(dp, d, vt, ktl, hs, j0, n, (zt_real)1);
                if (dtab) {
                    const int *bk = sh->bucket + sh->brel0 + j0 - (t + sq->off);
                    for (int j = 0; j < n; j++)
                        dtab[(long)bk[j] * sh->NH + h] += p[j] * (dp[j] - D);
                }
                for (int j = 0; j < n; j++) {
                    zt_real ds = p[j] * (dp[j] - D) * sh->scale;
                    zt_attn_backward_update(dq, dkbase + (long)(j0 + j) * sh->dks, dvbase + (long)(j0 + j) * sh->dvs,
                                            q, kbase + (long)(j0 + j) * sh->ks, d, ds, p[j], hs);
                }
            }
        }
    }
}

/* The group functions for the baseline instruction set and for AVX2 + FMA. */
static void zt_attn_forward_group_base(zt_real *out, zt_real *lse, const zt_real *q, const zt_real *k,
                                       const zt_real *v, const zt_attn_shape *sh, const zt_attn_seq *sq, int b,
                                       int g, zt_real *kt, zt_real *s, zt_real *acc)
{
    zt_attn_forward_group_body(out, lse, q, k, v, sh, sq, b, g, kt, s, acc);
}

ZT_CPU_TARGET_AVX2 static void zt_attn_forward_group_avx2(zt_real *out, zt_real *lse, const zt_real *q,
                                                          const zt_real *k, const zt_real *v,
                                                          const zt_attn_shape *sh, const zt_attn_seq *sq, int b,
                                                          int g, zt_real *kt, zt_real *s, zt_real *acc)
{
    zt_attn_forward_group_body(out, lse, q, k, v, sh, sq, b, g, kt, s, acc);
}

static void zt_attn_backward_group_base(zt_real *dq, zt_real *dk, zt_real *dv, const zt_real *dout,
                                        const zt_real *q, const zt_real *k, const zt_real *v, const zt_real *out,
                                        const zt_real *lse, const zt_attn_shape *sh, const zt_attn_seq *sq, int b,
                                        int g, zt_real *kt, zt_real *vt, zt_real *p, zt_real *dp, zt_real *dtab)
{
    zt_attn_backward_group_body(dq, dk, dv, dout, q, k, v, out, lse, sh, sq, b, g, kt, vt, p, dp, dtab);
}

ZT_CPU_TARGET_AVX2 static void zt_attn_backward_group_avx2(zt_real *dq, zt_real *dk, zt_real *dv,
                                                           const zt_real *dout, const zt_real *q, const zt_real *k,
                                                           const zt_real *v, const zt_real *out, const zt_real *lse,
                                                           const zt_attn_shape *sh, const zt_attn_seq *sq, int b,
                                                           int g, zt_real *kt, zt_real *vt, zt_real *p,
                                                           zt_real *dp, zt_real *dtab)
{
    zt_attn_backward_group_body(dq, dk, dv, dout, q, k, v, out, lse, sh, sq, b, g, kt, vt, p, dp, dtab);
}

/* ---- the descriptor ---- */

int zt_attention_check(const zt_attention_desc *d, bool host_arrays, zt_err *err)
{
    if (d->NH <= 0 || d->NKV <= 0 || d->NH % d->NKV != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "attention: %d query heads and %d key/value heads; both must be positive and the query "
                       "heads a multiple of the key/value heads", d->NH, d->NKV);
    if (d->HS <= 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention: head size %d; give a positive head size", d->HS);
    if (d->B < 0 || d->Tq < 0 || d->Tk < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention: B %d, Tq %d, Tk %d; none may be negative", d->B, d->Tq,
                       d->Tk);
    const long qw = (long)d->NH * d->HS, kw = (long)d->NKV * d->HS;
    if (d->q_stride < qw || d->out_stride < qw || d->k_stride < kw || d->v_stride < kw)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "attention: row strides q %ld, out %ld, k %ld, v %ld; q and out need at least NH*HS = %ld "
                       "elements, k and v at least NKV*HS = %ld", d->q_stride, d->out_stride, d->k_stride,
                       d->v_stride, qw, kw);
    if (!d->q || !d->k || !d->v || !d->out || !d->lse)
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention: q, k, v, out and lse must all be given");
    if ((d->cu_seqlens_q == NULL) != (d->cu_seqlens_k == NULL))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "attention: only one of cu_seqlens_q and cu_seqlens_k is given; give both (the same array "
                       "for self-attention) or neither");
    if (d->lens && (d->cu_seqlens_q || d->Tq != d->Tk))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "attention: padding lengths (lens) need the fixed layout with Tq == Tk (here Tq %d, Tk %d%s); "
                       "use cu_seqlens_q/k for sequences of other lengths", d->Tq, d->Tk,
                       d->cu_seqlens_q ? ", cu_seqlens given" : "");
    if (host_arrays && d->cu_seqlens_q) {
        if (d->cu_seqlens_q[0] != 0 || d->cu_seqlens_k[0] != 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "attention: cu_seqlens_q[0] = %d, cu_seqlens_k[0] = %d; both must be 0",
                           d->cu_seqlens_q[0], d->cu_seqlens_k[0]);
        for (int b = 0; b < d->B; b++) {
            int lq = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b], lk = d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b];
            if (lq < 0 || lk < 0 || lq > d->Tq || lk > d->Tk)
                return zt_fail(err, ZT_EINVAL_CONFIG,
                               "attention: sequence %d has %d query rows and %d key rows; cu_seqlens must not "
                               "decrease and Tq (%d) and Tk (%d) must be the longest lengths", b, lq, lk, d->Tq,
                               d->Tk);
        }
    }
    if (d->bias == ZT_ATTENTION_BIAS_T5) {
        const int nb = d->bias_bidirectional ? d->num_buckets / 2 : d->num_buckets;
        if (!d->bias_table || nb < 2 || (d->bias_bidirectional && d->num_buckets % 2) ||
            d->max_distance <= nb / 2)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "attention: T5 bias with table %s, %d buckets, max distance %d; give the table, at least "
                           "2 buckets (4 and even when bidirectional) and a max distance above %d",
                           d->bias_table ? "given" : "NULL", d->num_buckets, d->max_distance, nb / 2);
    } else if (d->bias != ZT_ATTENTION_BIAS_NONE) {
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention: unknown bias kind %d; use ZT_ATTENTION_BIAS_NONE or _T5",
                       (int)d->bias);
    }
    return 0;
}

/* The geometry of sequence b (host arrays). */
static zt_attn_seq zt_attn_seq_of(const zt_attention_desc *d, int b)
{
    zt_attn_seq sq;
    if (d->cu_seqlens_q) {
        sq.q0 = d->cu_seqlens_q[b];
        sq.k0 = d->cu_seqlens_k[b];
        sq.span = sq.qvalid = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b];
        sq.kvalid = d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b];
    } else {
        sq.q0 = (long)b * d->Tq;
        sq.k0 = (long)b * d->Tk;
        sq.span = sq.qvalid = d->Tq;
        sq.kvalid = d->Tk;
        if (d->lens) /* Tq == Tk */
            sq.qvalid = sq.kvalid = d->lens[b] < 0 ? 0 : d->lens[b] > d->Tq ? d->Tq : (int)d->lens[b];
    }
    sq.off = d->lens ? 0 : sq.kvalid - sq.span;
    return sq;
}

/* The per-call shape; *bucket (freed by the caller) holds the T5 buckets of every relative position the call
 * can meet, rel in [-(Tk-1), Tq-1]. */
static zt_attn_shape zt_attn_make_shape(const zt_attention_desc *d, int **bucket)
{
    zt_attn_shape sh = {.NH = d->NH, .NKV = d->NKV, .hs = d->HS, .G = d->NH / d->NKV, .qs = d->q_stride,
                        .ks = d->k_stride, .vs = d->v_stride, .ostride = d->out_stride, .Tq = d->Tq,
                        .ktl = d->Tk > 0 ? d->Tk : 1, .causal = d->causal, .window = d->window < 0 ? -1 : d->window};
    sh.scale = d->scale > 0 ? (zt_real)d->scale : (zt_real)1 / zt_real_sqrt((zt_real)sh.hs);
    *bucket = NULL;
    if (d->bias == ZT_ATTENTION_BIAS_T5) {
        int n = d->Tq + d->Tk + 1;
        *bucket = zt_xmalloc(sizeof(int) * n);
        sh.brel0 = d->Tk;
        for (int i = 0; i < n; i++)
            (*bucket)[i] = zt_attention_t5_bucket(i - sh.brel0, d->bias_bidirectional, d->num_buckets, d->max_distance);
        sh.bucket = *bucket;
        sh.table = d->bias_table;
    }
    return sh;
}

int zt_cpu_attention_fwd(const zt_attention_desc *d, zt_err *err)
{
    int rc = zt_attention_check(d, true, err);
    if (rc)
        return rc;
    int groups = d->B * d->NKV;
    if (groups <= 0 || d->Tq <= 0)
        return 0;
    int *bucket;
    const zt_attn_shape sh = zt_attn_make_shape(d, &bucket);
    const int avx2 = zt_cpu_has_avx2_fma();
    int nthreads = zt_cpu_get_threads();
    if (nthreads > groups)
        nthreads = groups;
    const zt_real *q = d->q, *k = d->k, *v = d->v;
    zt_real *out = d->out, *lse = d->lse;

    #pragma omp parallel num_threads(nthreads)
    {
        zt_real *kt = malloc(sizeof(zt_real) * sh.hs * sh.ktl);
        zt_real *s = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        zt_real *acc = malloc(sizeof(zt_real) * sh.hs);
        ZT_ASSERT(kt != NULL && s != NULL && acc != NULL);
        #pragma omp for schedule(static)
        for (int bg = 0; bg < groups; bg++) {
            int b = bg / d->NKV, g = bg % d->NKV;
            const zt_attn_seq sq = zt_attn_seq_of(d, b);
            if (avx2)
                zt_attn_forward_group_avx2(out, lse, q, k, v, &sh, &sq, b, g, kt, s, acc);
            else
                zt_attn_forward_group_base(out, lse, q, k, v, &sh, &sq, b, g, kt, s, acc);
        }
        free(kt);
        free(s);
        free(acc);
    }
    free(bucket);
    return 0;
}

/* Zeroes columns [0, w) of rows [r0, r1) of x (row stride `stride`). */
static void zt_attn_zero_rows(zt_real *x, long stride, long r0, long r1, long w)
{
    for (long r = r0; r < r1; r++)
        for (long i = 0; i < w; i++)
            x[r * stride + i] = 0;
}

int zt_cpu_attention_bwd(const zt_attention_desc *d, const zt_attention_grads *gr, zt_err *err)
{
    int rc = zt_attention_check(d, true, err);
    if (rc)
        return rc;
    if (!gr->dout || !gr->dq || !gr->dk || !gr->dv || (d->bias == ZT_ATTENTION_BIAS_T5 && !gr->dbias_table))
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention backward: dout, dq, dk, dv (and dbias_table with a bias) "
                                              "must all be given");
    if (gr->dq_stride < (long)d->NH * d->HS || gr->dk_stride < (long)d->NKV * d->HS ||
        gr->dv_stride < (long)d->NKV * d->HS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "attention backward: row strides dq %ld, dk %ld, dv %ld are below the "
                                              "heads' widths %ld, %ld, %ld", gr->dq_stride, gr->dk_stride,
                       gr->dv_stride, (long)d->NH * d->HS, (long)d->NKV * d->HS, (long)d->NKV * d->HS);
    const long nbnh = (long)d->num_buckets * d->NH;
    zt_real *dtable = gr->dbias_table;
    if (!gr->accumulate) {
        long nq = d->cu_seqlens_q ? d->cu_seqlens_q[d->B] : (long)d->B * d->Tq;
        long nk = d->cu_seqlens_k ? d->cu_seqlens_k[d->B] : (long)d->B * d->Tk;
        zt_attn_zero_rows(gr->dq, gr->dq_stride, 0, nq, (long)d->NH * d->HS);
        zt_attn_zero_rows(gr->dk, gr->dk_stride, 0, nk, (long)d->NKV * d->HS);
        zt_attn_zero_rows(gr->dv, gr->dv_stride, 0, nk, (long)d->NKV * d->HS);
        if (d->bias == ZT_ATTENTION_BIAS_T5)
            for (long i = 0; i < nbnh; i++)
                dtable[i] = 0;
    }
    int groups = d->B * d->NKV;
    if (groups <= 0 || d->Tq <= 0)
        return 0;
    int *bucket;
    zt_attn_shape sh = zt_attn_make_shape(d, &bucket);
    sh.dqs = gr->dq_stride;
    sh.dks = gr->dk_stride;
    sh.dvs = gr->dv_stride;
    /* The bias gradient per sequence (groups of one sequence write disjoint heads of its slice), summed over
     * sequences in order afterwards: the same bits for any thread count. */
    zt_real *dtab = sh.table ? zt_xcalloc((size_t)d->B * nbnh, sizeof(zt_real)) : NULL;
    const int avx2 = zt_cpu_has_avx2_fma();
    int nthreads = zt_cpu_get_threads();
    if (nthreads > groups)
        nthreads = groups;
    const zt_real *q = d->q, *k = d->k, *v = d->v, *out = d->out, *lse = d->lse, *dout = gr->dout;
    zt_real *dq = gr->dq, *dk = gr->dk, *dv = gr->dv;

    #pragma omp parallel num_threads(nthreads)
    {
        zt_real *kt = malloc(sizeof(zt_real) * sh.hs * sh.ktl);
        zt_real *vt = malloc(sizeof(zt_real) * sh.hs * sh.ktl);
        zt_real *p = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        zt_real *dp = malloc(sizeof(zt_real) * ZT_ATTN_BLOCK);
        ZT_ASSERT(kt != NULL && vt != NULL && p != NULL && dp != NULL);
        #pragma omp for schedule(static)
        for (int bg = 0; bg < groups; bg++) {
            int b = bg / d->NKV, g = bg % d->NKV;
            const zt_attn_seq sq = zt_attn_seq_of(d, b);
            zt_real *dt = dtab ? dtab + (long)b * nbnh : NULL;
            if (avx2)
                zt_attn_backward_group_avx2(dq, dk, dv, dout, q, k, v, out, lse, &sh, &sq, b, g, kt, vt, p, dp, dt);
            else
                zt_attn_backward_group_base(dq, dk, dv, dout, q, k, v, out, lse, &sh, &sq, b, g, kt, vt, p, dp, dt);
        }
        free(kt);
        free(vt);
        free(p);
        free(dp);
    }
    if (dtab) {
        for (int b = 0; b < d->B; b++)
            for (long i = 0; i < nbnh; i++)
                dtable[i] += dtab[(long)b * nbnh + i];
        free(dtab);
    }
    free(bucket);
    return 0;
}

/* ---- the packed-qkv entry points, over the descriptor ---- */

/* The descriptor of packed qkv [B,T,(NH+2*NKV)*HS] with out [B,T,NH*HS], default scale, lens padding. */
static zt_attention_desc zt_attn_packed_desc(zt_real *out, zt_real *lse, const zt_real *qkv, const int32_t *lens,
                                             const zt_attention_dims *d)
{
    ZT_ASSERT(d->B >= 0 && d->T >= 0 && d->NH > 0 && d->NKV > 0 && d->NH % d->NKV == 0 && d->HS > 0);
    const long stride = (long)(d->NH + 2 * d->NKV) * d->HS;
    zt_attention_desc a = {.q = qkv, .k = qkv + (long)d->NH * d->HS, .v = qkv + (long)(d->NH + d->NKV) * d->HS,
                           .q_stride = stride, .k_stride = stride, .v_stride = stride, .out = out,
                           .out_stride = (long)d->NH * d->HS, .lse = lse, .B = d->B, .Tq = d->T, .Tk = d->T,
                           .NH = d->NH, .NKV = d->NKV, .HS = d->HS, .causal = d->causal, .window = -1, .lens = lens};
    return a;
}

/* Writes out [B,T,NH*HS] and lse [B,NH,T] from qkv [B,T,(NH+2*NKV)*HS]. */
void zt_cpu_attention_forward_gqa(zt_real *out, zt_real *lse, const zt_real *qkv, const int32_t *lens,
                                  const zt_attention_dims *d)
{
    const zt_attention_desc a = zt_attn_packed_desc(out, lse, qkv, lens, d);
    zt_err err;
    int rc = zt_cpu_attention_fwd(&a, &err);
    ZT_ASSERT(rc == 0);
}

/* Adds the gradients with respect to q, k and v into dqkv [B,T,(NH+2*NKV)*HS]. */
void zt_cpu_attention_backward_gqa(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                                   const zt_real *lse, const int32_t *lens, const zt_attention_dims *d)
{
    const zt_attention_desc a = zt_attn_packed_desc((zt_real *)out, (zt_real *)lse, qkv, lens, d);
    const long stride = a.q_stride;
    const zt_attention_grads g = {.dout = dout, .dq = dqkv, .dk = dqkv + (long)d->NH * d->HS,
                                  .dv = dqkv + (long)(d->NH + d->NKV) * d->HS, .dq_stride = stride,
                                  .dk_stride = stride, .dv_stride = stride, .accumulate = true};
    zt_err err;
    int rc = zt_cpu_attention_bwd(&a, &g, &err);
    ZT_ASSERT(rc == 0);
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
