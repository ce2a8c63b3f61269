/* The attention descriptor on the GPU (zt_cuda_attention_fwd / _bwd) against the CPU reference
 * (zt_cpu_attention_fwd / _bwd, kernels/cpu/attention.c, whose backward the finite-difference tests check).
 *
 * Every descriptor feature, forward and backward, in fp32, fp16 and bf16: separate q and kv tensors with row
 * strides wider than the heads, cross-attention (Tq != Tk), T5's scale 1 and relative position bias
 * (bidirectional and causal buckets) with its table gradient, causal attention aligned bottom-right, sliding
 * windows, grouped-query heads, variable lengths by cu_seqlens (packed documents, an empty one, varlen
 * cross-attention), padding lengths, head sizes the packed kernels do not take (40, 48, 112), and packed-qkv
 * descriptors both through the packed kernels and forced onto the general ones. Inputs are rounded to the
 * dtype on the device and the rounded values go to the CPU, so only the GPU's arithmetic is measured; the
 * CPU backward reads the GPU's out and lse. Each backward overwrites buffers that start as random values
 * (columns outside the heads must keep them), runs a second time for the same bits, and then accumulates.
 *
 * Exits 77 (skipped) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/attention.h"
#include "kernels/cpu_threads.h"
#include "kernels/cuda/cuda_common.h"

_Static_assert(sizeof(zt_real) == sizeof(float), "this test must link zt_kernels_cpu (float build)");

static cudaStream_t g_stream;
#include "dev_buffers.h" /* dev_alloc, dev_upload, dev_download on g_stream */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static const enum zt_dtype k_dtypes[3] = {ZT_DTYPE_F32, ZT_DTYPE_F16, ZT_DTYPE_BF16};

static float rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / (double)(1ull << 52) - 1.0);
}

static float *host_rand(size_t n, float scale)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = scale * rnd();
    return h;
}

static void *dev_ints(const int32_t *h, int n)
{
    if (!h)
        return NULL;
    void *d = dev_alloc(sizeof(int32_t) * n);
    ZT_CUDA_CHECK(cudaMemcpy(d, h, sizeof(int32_t) * n, cudaMemcpyHostToDevice));
    return d;
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

/* |got - ref| <= tol * (|ref| + rms(ref)) for every element; prints the worst. */
static void check_close(const char *what, enum zt_dtype dt, const float *got, const float *ref, size_t n, double tol)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)ref[i] * ref[i];
    double rms = n ? sqrt(ss / n) : 0.0;
    if (rms == 0.0)
        rms = 1e-30;
    double worst = 0.0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        if (!(err <= tol * (fabs((double)ref[i]) + rms)))
            bad++;
        double ratio = isnan(err) ? INFINITY : err / (fabs((double)ref[i]) + rms);
        if (ratio > worst || (isnan(err) && worst != INFINITY)) {
            worst = ratio;
            worst_i = i;
        }
    }
    printf("    %-22s %-4s n=%-8zu max_err/(|ref|+rms)=%.2e (tol %.0e) rms=%.2e\n", what, zt_dtype_name(dt), n, worst,
           tol, rms);
    if (bad)
        fail_msg("%s: %zu of %zu elements out of tolerance; worst at %zu: got %.8g, want %.8g", what, bad, n, worst_i,
                 (double)got[worst_i], (double)ref[worst_i]);
}

/* One descriptor case. packed: q, k, v are the three parts of one packed qkv tensor (else q and a kv tensor
 * with padded strides); general: force the general kernels (variant). want_path: the chooser's answer. */
struct gcase {
    const char *name;
    int B, Tq, Tk, NH, NKV, HS;
    float scale;
    bool causal;
    int window;
    const int32_t *cu_q, *cu_k, *lens;
    bool bias, bidir;
    int nb, maxd;
    bool packed, general;
    const char *want_path;
};

/* The buffers of one side (host or device) of a case. */
struct gbufs {
    void *q, *kv, *out, *dout, *dq, *dkv;
    void *lse, *table, *dtable;
};

static zt_attention_desc make_desc(const struct gcase *c, const struct gbufs *b, long qs, long kvs, long os, long es,
                                   const int32_t *cu_q, const int32_t *cu_k, const int32_t *lens,
                                   const zt_attention_variant *variant)
{
    const long hq = (long)c->NH * c->HS, hk = (long)c->NKV * c->HS;
    zt_attention_desc d = {.q = b->q, .q_stride = qs, .out = b->out, .out_stride = os, .lse = b->lse, .B = c->B,
                           .Tq = c->Tq, .Tk = c->Tk, .NH = c->NH, .NKV = c->NKV, .HS = c->HS, .scale = c->scale,
                           .causal = c->causal, .window = c->window, .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k,
                           .lens = lens, .bias = c->bias ? ZT_ATTENTION_BIAS_T5 : ZT_ATTENTION_BIAS_NONE,
                           .bias_table = b->table, .num_buckets = c->nb, .max_distance = c->maxd,
                           .bias_bidirectional = c->bidir, .variant = variant};
    if (c->packed) {
        d.k = (const char *)b->q + hq * es;
        d.v = (const char *)b->q + (hq + hk) * es;
        d.k_stride = d.v_stride = qs;
    } else {
        d.k = b->kv;
        d.v = (const char *)b->kv + hk * es;
        d.k_stride = d.v_stride = kvs;
    }
    return d;
}

static zt_attention_grads make_grads(const struct gcase *c, const struct gbufs *b, long qs, long kvs, long es,
                                     bool accumulate)
{
    const long hq = (long)c->NH * c->HS, hk = (long)c->NKV * c->HS;
    zt_attention_grads g = {.dout = b->dout, .dq = b->dq, .dq_stride = qs, .dbias_table = b->dtable,
                            .accumulate = accumulate};
    if (c->packed) {
        g.dk = (char *)b->dq + hq * es;
        g.dv = (char *)b->dq + (hq + hk) * es;
        g.dk_stride = g.dv_stride = qs;
    } else {
        g.dk = b->dkv;
        g.dv = (char *)b->dkv + hk * es;
        g.dk_stride = g.dv_stride = kvs;
    }
    return g;
}

static void run_case(const struct gcase *c, enum zt_dtype dt)
{
    const long es = (long)zt_dtype_size(dt);
    const long nq = c->cu_q ? c->cu_q[c->B] : (long)c->B * c->Tq;
    const long nk = c->cu_k ? c->cu_k[c->B] : (long)c->B * c->Tk;
    const long hq = (long)c->NH * c->HS, hk = (long)c->NKV * c->HS;
    /* Packed: one qkv row; else rows wider than the heads (8 elements, 16 bytes for 16-bit types). */
    const long qs = c->packed ? hq + 2 * hk : hq + 8, kvs = 2 * hk + 8, os = c->packed ? hq : hq + 8;
    const size_t nqe = (size_t)(nq * qs), nke = c->packed ? 0 : (size_t)(nk * kvs), noe = (size_t)(nq * os);
    const size_t nlse = (size_t)c->B * c->NH * c->Tq, ntab = c->bias ? (size_t)c->nb * c->NH : 0;
    /* bf16: 2e-2 of |ref| + rms, as test_cuda_kernels checks the same kernels; the packed (mma.sync) backward
     * rounds P and dP to bf16 before its dQ and dK products, which reached 2.4e-2 on 1 element of 153,600 at
     * GPT-2's shape on an H200, so the tensor-core backwards (packed and mma) get 3e-2 */
    const double tol = dt == ZT_DTYPE_F32 ? 1e-4 : dt == ZT_DTYPE_F16 ? 5e-3 : 2e-2;
    printf("  %s (%s)\n", c->name, zt_dtype_name(dt));

    struct gbufs h, d;
    float *hq_ = host_rand(nqe, 1.5f), *hkv = host_rand(nke, 1.5f), *hdout = host_rand(noe, 1.0f);
    float *htab = host_rand(ntab, 1.0f);
    d.q = dev_upload(hq_, nqe, dt);
    d.kv = c->packed ? NULL : dev_upload(hkv, nke, dt);
    d.dout = dev_upload(hdout, noe, dt);
    float *zeros = calloc(noe ? noe : 1, sizeof(float));
    d.out = dev_upload(zeros, noe, dt); /* columns outside the heads stay 0 on both sides */
    d.lse = dev_alloc(sizeof(float) * (nlse ? nlse : 1));
    /* with cu_seqlens the entries past a sequence's length stay as they were: zeros on both sides */
    ZT_CUDA_CHECK(cudaMemset(d.lse, 0, sizeof(float) * (nlse ? nlse : 1)));
    d.table = ntab ? dev_alloc(sizeof(float) * ntab) : NULL;
    if (ntab)
        ZT_CUDA_CHECK(cudaMemcpy(d.table, htab, sizeof(float) * ntab, cudaMemcpyHostToDevice));
    void *dcu_q = dev_ints(c->cu_q, c->B + 1), *dcu_k = dev_ints(c->cu_k, c->B + 1), *dlens = dev_ints(c->lens, c->B);
    zt_attention_variant variant = {.general = c->general};
    const zt_attention_desc dd = make_desc(c, &d, qs, kvs, os, es, dcu_q, dcu_k, dlens, &variant);
    assert_true(zt_cuda_attention_desc_supported(&dd, dt));
    /* "mma": the descriptor's tensor-core kernels in fp16 and bf16, the general ones in fp32 */
    const char *want = strcmp(c->want_path, "mma") == 0 && dt == ZT_DTYPE_F32 ? "general" : c->want_path;
    assert_string_equal(zt_cuda_attention_path(&dd, dt), want);
    const bool tensor_cores = strcmp(want, "general") != 0;
    const double tol_bwd = dt == ZT_DTYPE_BF16 && tensor_cores ? 3e-2 : tol;
    zt_err err;
    if (zt_cuda_attention_fwd(&dd, dt, g_stream, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    float *gout = dev_download(d.out, noe, dt), *glse = dev_download(d.lse, nlse, ZT_DTYPE_F32);

    h.q = hq_;
    h.kv = hkv;
    h.dout = hdout;
    h.out = calloc(noe ? noe : 1, sizeof(float));
    h.lse = calloc(nlse ? nlse : 1, sizeof(float));
    h.table = htab;
    zt_attention_desc hd = make_desc(c, &h, qs, kvs, os, 1, c->cu_q, c->cu_k, c->lens, NULL);
    if (c->packed) { /* host pointer arithmetic in floats */
        hd.k = (float *)h.q + hq;
        hd.v = (float *)h.q + hq + hk;
    } else {
        hd.v = (float *)h.kv + hk;
    }
    if (zt_cpu_attention_fwd(&hd, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    check_close("forward out", dt, gout, h.out, noe, tol);
    float *rl = h.lse;
    size_t inf_bad = 0;
    for (size_t i = 0; i < nlse; i++) {
        const bool rinf = isinf(rl[i]), ginf = isinf(glse[i]);
        if (rinf || ginf) {
            inf_bad += !(rinf && ginf && glse[i] > 0);
            rl[i] = glse[i] = 0.0f;
        }
    }
    assert_int_equal(inf_bad, 0);
    check_close("forward lse", dt, glse, rl, nlse, dt == ZT_DTYPE_F32 ? 1e-5 : 1e-4);

    /* Backward: the CPU from the GPU's out and lse; both overwrite the same random buffers. */
    free(glse);
    glse = dev_download(d.lse, nlse, ZT_DTYPE_F32);
    memcpy(h.lse, glse, sizeof(float) * nlse);
    memcpy(h.out, gout, sizeof(float) * noe);
    float *pq = host_rand(nqe, 0.5f), *pkv = host_rand(nke, 0.5f), *ptab = host_rand(ntab, 0.5f);
    d.dq = dev_upload(pq, nqe, dt);
    d.dkv = c->packed ? NULL : dev_upload(pkv, nke, dt);
    d.dtable = ntab ? dev_alloc(sizeof(float) * ntab) : NULL;
    if (ntab)
        ZT_CUDA_CHECK(cudaMemcpy(d.dtable, ptab, sizeof(float) * ntab, cudaMemcpyHostToDevice));
    h.dq = pq;
    h.dkv = pkv;
    h.dtable = ptab;
    void *scratch = dev_alloc(zt_cuda_attention_bwd_scratch_size(&dd));
    zt_attention_grads dg = make_grads(c, &d, qs, kvs, es, false);
    if (zt_cuda_attention_bwd(&dd, &dg, scratch, dt, g_stream, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    zt_attention_grads hg = make_grads(c, &h, qs, kvs, 1, false);
    if (c->packed) {
        hg.dk = (float *)h.dq + hq;
        hg.dv = (float *)h.dq + hq + hk;
    } else {
        hg.dv = (float *)h.dkv + hk;
    }
    if (zt_cpu_attention_bwd(&hd, &hg, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    float *gdq = dev_download(d.dq, nqe, dt), *gdkv = c->packed ? NULL : dev_download(d.dkv, nke, dt);
    check_close(c->packed ? "backward dqkv" : "backward dq", dt, gdq, h.dq, nqe, tol_bwd);
    if (!c->packed)
        check_close("backward dk, dv", dt, gdkv, h.dkv, nke, tol_bwd);
    float *gtab = NULL;
    if (ntab) {
        gtab = malloc(sizeof(float) * ntab);
        ZT_CUDA_CHECK(cudaMemcpy(gtab, d.dtable, sizeof(float) * ntab, cudaMemcpyDeviceToHost));
        check_close("backward dbias_table", dt, gtab, h.dtable, ntab, dt == ZT_DTYPE_F32 ? 1e-4 : 1e-2);
    }

    /* The same call again: the same bits. */
    void *dq1 = dev_alloc(nqe * es), *dkv1 = dev_alloc(nke * es + 16), *dtab1 = dev_alloc(ntab * 4 + 16);
    ZT_CUDA_CHECK(cudaMemcpy(dq1, d.dq, nqe * es, cudaMemcpyDeviceToDevice));
    if (!c->packed)
        ZT_CUDA_CHECK(cudaMemcpy(dkv1, d.dkv, nke * es, cudaMemcpyDeviceToDevice));
    if (ntab)
        ZT_CUDA_CHECK(cudaMemcpy(dtab1, d.dtable, ntab * 4, cudaMemcpyDeviceToDevice));
    assert_int_equal(zt_cuda_attention_bwd(&dd, &dg, scratch, dt, g_stream, &err), 0);
    assert_true(dev_equal(d.dq, dq1, nqe * es));
    if (!c->packed)
        assert_true(dev_equal(d.dkv, dkv1, nke * es));
    if (ntab)
        assert_true(dev_equal(d.dtable, dtab1, ntab * 4));

    /* Accumulate on top: both sides add the gradient once more. */
    dg.accumulate = hg.accumulate = true;
    assert_int_equal(zt_cuda_attention_bwd(&dd, &dg, scratch, dt, g_stream, &err), 0);
    assert_int_equal(zt_cpu_attention_bwd(&hd, &hg, &err), 0);
    free(gdq);
    gdq = dev_download(d.dq, nqe, dt);
    check_close(c->packed ? "accumulated dqkv" : "accumulated dq", dt, gdq, h.dq, nqe, tol_bwd);
    if (!c->packed) {
        free(gdkv);
        gdkv = dev_download(d.dkv, nke, dt);
        check_close("accumulated dk, dv", dt, gdkv, h.dkv, nke, tol_bwd);
    }
    if (ntab) {
        ZT_CUDA_CHECK(cudaMemcpy(gtab, d.dtable, sizeof(float) * ntab, cudaMemcpyDeviceToHost));
        check_close("accumulated dbias", dt, gtab, h.dtable, ntab, dt == ZT_DTYPE_F32 ? 1e-4 : 1e-2);
    }

    void *dev[] = {d.q, d.kv, d.dout, d.out, d.lse, d.table, d.dq, d.dkv, d.dtable, scratch, dq1, dkv1, dtab1,
                   dcu_q, dcu_k, dlens};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i])
            ZT_CUDA_CHECK(cudaFree(dev[i]));
    void *host[] = {hq_, hkv, hdout, htab, zeros, h.out, h.lse, gout, glse, pq, pkv, ptab, gdq, gdkv, gtab};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
}

static void run_all(const struct gcase *cases, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int t = 0; t < 3; t++)
            run_case(&cases[i], k_dtypes[t]);
}

/* T5: the encoder's bidirectional biased self-attention, the decoder's causal one, cross-attention. */
static void test_t5(void **state)
{
    (void)state;
    const struct gcase cases[] = {
        {.name = "T5 encoder: bidirectional, bias, scale 1", .B = 2, .Tq = 77, .Tk = 77, .NH = 4, .NKV = 4, .HS = 64,
         .scale = 1.0f, .window = -1, .bias = true, .bidir = true, .nb = 32, .maxd = 128, .want_path = "mma"},
        {.name = "T5 decoder: causal, causal buckets", .B = 2, .Tq = 70, .Tk = 70, .NH = 4, .NKV = 4, .HS = 64,
         .scale = 1.0f, .causal = true, .window = -1, .bias = true, .bidir = false, .nb = 32, .maxd = 128,
         .want_path = "mma"},
        {.name = "T5 cross-attention Tq 40 Tk 100", .B = 2, .Tq = 40, .Tk = 100, .NH = 4, .NKV = 4, .HS = 64,
         .scale = 1.0f, .window = -1, .want_path = "mma"},
        {.name = "cross-attention with a bias, 8 buckets", .B = 1, .Tq = 33, .Tk = 130, .NH = 2, .NKV = 1,
         .HS = 32, .window = -1, .bias = true, .bidir = true, .nb = 8, .maxd = 20, .want_path = "general"},
    };
    run_all(cases, sizeof(cases) / sizeof(cases[0]));
}

/* Causal bottom-right with Tq != Tk, windows, grouped-query heads, head sizes the packed kernels refuse. */
static void test_masks(void **state)
{
    (void)state;
    const struct gcase cases[] = {
        {.name = "causal Tq 37 Tk 90, GQA 6/2, head size 48, window 20", .B = 2, .Tq = 37, .Tk = 90, .NH = 6,
         .NKV = 2, .HS = 48, .causal = true, .window = 20, .want_path = "general"},
        {.name = "causal Tq 50 > Tk 20 (rows without keys)", .B = 1, .Tq = 50, .Tk = 20, .NH = 2, .NKV = 2,
         .HS = 64, .causal = true, .window = -1, .want_path = "mma"},
        {.name = "sliding window 16, packed qkv, head size 64", .B = 2, .Tq = 100, .Tk = 100, .NH = 4, .NKV = 2,
         .HS = 64, .causal = true, .window = 16, .packed = true, .want_path = "mma"},
        {.name = "packed qkv, head size 40 (general path)", .B = 2, .Tq = 65, .Tk = 65, .NH = 5, .NKV = 5,
         .HS = 40, .causal = true, .window = -1, .packed = true, .want_path = "general"},
        {.name = "scale 0.3, bidirectional, head size 112", .B = 1, .Tq = 45, .Tk = 45, .NH = 2, .NKV = 1,
         .HS = 112, .scale = 0.3f, .window = -1, .want_path = "general"},
    };
    run_all(cases, sizeof(cases) / sizeof(cases[0]));
}

/* Variable lengths (cu_seqlens) and padding (lens). */
static void test_varlen(void **state)
{
    (void)state;
    static const int32_t docs[6] = {0, 50, 51, 130, 130, 200}; /* a one-token and an empty document */
    static const int32_t xq[3] = {0, 10, 45}, xk[3] = {0, 70, 71};
    static const int32_t lens[3] = {65, 20, 0}, lens2[2] = {100, 37};
    const struct gcase cases[] = {
        {.name = "packed documents, causal, GQA 4/2, decoder bias", .B = 5, .Tq = 79, .Tk = 79, .NH = 4,
         .NKV = 2, .HS = 64, .causal = true, .window = -1, .cu_q = docs, .cu_k = docs, .bias = true,
         .bidir = false, .nb = 32, .maxd = 128, .packed = true, .want_path = "mma"},
        {.name = "varlen cross-attention, window 30, head size 112", .B = 2, .Tq = 35, .Tk = 70, .NH = 2,
         .NKV = 2, .HS = 112, .window = 30, .cu_q = xq, .cu_k = xk, .want_path = "general"},
        {.name = "padding, encoder bias, head size 40", .B = 3, .Tq = 65, .Tk = 65, .NH = 5, .NKV = 5, .HS = 40,
         .window = -1, .lens = lens, .bias = true, .bidir = true, .nb = 32, .maxd = 128, .packed = true,
         .want_path = "general"},
        {.name = "padding, bidirectional packed qkv (packed kernels)", .B = 2, .Tq = 100, .Tk = 100, .NH = 4,
         .NKV = 4, .HS = 64, .window = -1, .lens = lens2, .packed = true, .want_path = "packed"},
        {.name = "padding, bidirectional packed qkv, general forced", .B = 2, .Tq = 100, .Tk = 100, .NH = 4,
         .NKV = 4, .HS = 64, .window = -1, .lens = lens2, .packed = true, .general = true,
         .want_path = "general"},
    };
    run_all(cases, sizeof(cases) / sizeof(cases[0]));
}

/* The packed-qkv forms of GPT-2 and LLaMA through the chooser: the packed kernels, and the general ones. */
static void test_packed(void **state)
{
    (void)state;
    const struct gcase cases[] = {
        {.name = "GPT-2: causal multi-head, head size 64", .B = 2, .Tq = 100, .Tk = 100, .NH = 4, .NKV = 4,
         .HS = 64, .causal = true, .window = -1, .packed = true, .want_path = "packed"},
        {.name = "GPT-2, general forced", .B = 2, .Tq = 100, .Tk = 100, .NH = 4, .NKV = 4, .HS = 64, .causal = true,
         .window = -1, .packed = true, .general = true, .want_path = "general"},
        {.name = "LLaMA: causal GQA 8/2, head size 128", .B = 1, .Tq = 130, .Tk = 130, .NH = 8, .NKV = 2,
         .HS = 128, .causal = true, .window = -1, .packed = true, .want_path = "packed"},
        {.name = "LLaMA, general forced", .B = 1, .Tq = 130, .Tk = 130, .NH = 8, .NKV = 2, .HS = 128,
         .causal = true, .window = -1, .packed = true, .general = true, .want_path = "general"},
        {.name = "explicit default scale stays packed", .B = 1, .Tq = 64, .Tk = 64, .NH = 2, .NKV = 2, .HS = 64,
         .scale = 0.125f, .causal = true, .window = -1, .packed = true, .want_path = "packed"},
    };
    run_all(cases, sizeof(cases) / sizeof(cases[0]));
}

/* The descriptor's tensor-core kernels (head sizes 64 and 128) on every feature: variable lengths of 1, 17
 * and 200 rows, Tq != Tk, windows 0, 1, 63 and 300, grouped-query ratios 1, 2 and 4, T5 bias and its
 * gradient, padding; odd lengths so that tiles end inside sequences. */
static void test_mma(void **state)
{
    (void)state;
    static const int32_t docs[4] = {0, 1, 18, 218}; /* lengths 1, 17, 200 */
    static const int32_t kdocs[4] = {0, 70, 71, 371}; /* lengths 70, 1, 300 */
    static const int32_t lens[3] = {65, 1, 0};
    const struct gcase cases[] = {
        {.name = "mma: varlen 1/17/200, causal, GQA 4/1, head size 128", .B = 3, .Tq = 200, .Tk = 200, .NH = 4,
         .NKV = 1, .HS = 128, .causal = true, .window = -1, .cu_q = docs, .cu_k = docs, .want_path = "mma"},
        {.name = "mma: varlen 1/17/200, bidirectional, encoder bias", .B = 3, .Tq = 200, .Tk = 200, .NH = 2,
         .NKV = 2, .HS = 64, .window = -1, .cu_q = docs, .cu_k = docs, .bias = true, .bidir = true, .nb = 32,
         .maxd = 128, .want_path = "mma"},
        {.name = "mma: varlen packed qkv, causal, decoder bias, GQA 2", .B = 3, .Tq = 200, .Tk = 200, .NH = 4,
         .NKV = 2, .HS = 128, .causal = true, .window = -1, .cu_q = docs, .cu_k = docs, .bias = true,
         .bidir = false, .nb = 32, .maxd = 128, .packed = true, .want_path = "mma"},
        {.name = "mma: varlen cross-attention 1/17/200 x 70/1/300, window 30", .B = 3, .Tq = 200, .Tk = 300,
         .NH = 2, .NKV = 1, .HS = 64, .causal = true, .window = 30, .cu_q = docs, .cu_k = kdocs,
         .want_path = "mma"},
        {.name = "mma: window 0, causal, GQA 2", .B = 1, .Tq = 150, .Tk = 150, .NH = 2, .NKV = 1, .HS = 64,
         .causal = true, .window = 0, .want_path = "mma"},
        {.name = "mma: window 1, causal, head size 128, GQA 2", .B = 2, .Tq = 130, .Tk = 130, .NH = 4, .NKV = 2,
         .HS = 128, .causal = true, .window = 1, .want_path = "mma"},
        {.name = "mma: window 63, causal, GQA 4", .B = 1, .Tq = 200, .Tk = 200, .NH = 4, .NKV = 1, .HS = 64,
         .causal = true, .window = 63, .want_path = "mma"},
        {.name = "mma: window 300, causal, T 333", .B = 1, .Tq = 333, .Tk = 333, .NH = 2, .NKV = 2, .HS = 64,
         .causal = true, .window = 300, .want_path = "mma"},
        {.name = "mma: window 63, bidirectional, head size 128", .B = 1, .Tq = 140, .Tk = 140, .NH = 2, .NKV = 2,
         .HS = 128, .window = 63, .want_path = "mma"},
        {.name = "mma: T5 cross-attention Tq 128 Tk 512, bias, scale 1", .B = 2, .Tq = 128, .Tk = 512, .NH = 4,
         .NKV = 4, .HS = 64, .scale = 1.0f, .window = -1, .bias = true, .bidir = true, .nb = 32, .maxd = 128,
         .want_path = "mma"},
        {.name = "mma: causal Tq 100 Tk 300 (bottom-right), GQA 4/2, hs 128", .B = 2, .Tq = 100, .Tk = 300,
         .NH = 4, .NKV = 2, .HS = 128, .causal = true, .window = -1, .want_path = "mma"},
        {.name = "mma: causal Tq 90 > Tk 40 (rows without keys), window 5", .B = 1, .Tq = 90, .Tk = 40, .NH = 2,
         .NKV = 1, .HS = 64, .causal = true, .window = 5, .want_path = "mma"},
        {.name = "mma: T5 decoder, causal buckets, head size 128, 64 buckets", .B = 1, .Tq = 129, .Tk = 129,
         .NH = 2, .NKV = 2, .HS = 128, .scale = 1.0f, .causal = true, .window = -1, .bias = true, .bidir = false,
         .nb = 64, .maxd = 200, .want_path = "mma"},
        {.name = "mma: padding 65/1/0, encoder bias, scale 0.3", .B = 3, .Tq = 65, .Tk = 65, .NH = 2, .NKV = 2,
         .HS = 64, .scale = 0.3f, .window = -1, .lens = lens, .bias = true, .bidir = true, .nb = 32, .maxd = 128,
         .want_path = "mma"},
        {.name = "mma: padding, causal, head size 128, GQA 2", .B = 3, .Tq = 65, .Tk = 65, .NH = 2, .NKV = 1,
         .HS = 128, .causal = true, .window = -1, .lens = lens, .want_path = "mma"},
        {.name = "mma forward, general backward: max_distance 2000", .B = 1, .Tq = 100, .Tk = 100, .NH = 2,
         .NKV = 2, .HS = 64, .scale = 1.0f, .window = -1, .bias = true, .bidir = true, .nb = 32, .maxd = 2000,
         .want_path = "mma"},
        {.name = "mma: window 16 forced onto the general kernels", .B = 1, .Tq = 100, .Tk = 100, .NH = 2, .NKV = 1,
         .HS = 64, .causal = true, .window = 16, .general = true, .want_path = "general"},
    };
    run_all(cases, sizeof(cases) / sizeof(cases[0]));
}

/* What the GPU refuses, with a reason. */
static void test_refusals(void **state)
{
    (void)state;
    float *buf = dev_alloc(4096);
    zt_attention_desc d = {.q = buf, .k = buf, .v = buf, .q_stride = 600, .k_stride = 600, .v_stride = 600,
                           .out = buf, .out_stride = 600, .lse = buf, .B = 1, .Tq = 1, .Tk = 1, .NH = 2, .NKV = 2,
                           .HS = 300, .window = -1};
    zt_err err;
    assert_false(zt_cuda_attention_desc_supported(&d, ZT_DTYPE_BF16));
    assert_int_equal(zt_cuda_attention_fwd(&d, ZT_DTYPE_BF16, g_stream, &err), ZT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "head size"));
    d.HS = 64;
    d.bias = ZT_ATTENTION_BIAS_T5;
    d.bias_table = buf;
    d.num_buckets = 512;
    d.max_distance = 1000;
    assert_int_equal(zt_cuda_attention_fwd(&d, ZT_DTYPE_BF16, g_stream, &err), ZT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "buckets"));
    d.num_buckets = 32;
    d.NKV = 3;
    assert_int_equal(zt_cuda_attention_fwd(&d, ZT_DTYPE_BF16, g_stream, &err), ZT_EINVAL_CONFIG);
    ZT_CUDA_CHECK(cudaFree(buf));
}

static int setup(void **state)
{
    (void)state;
    ZT_CUDA_CHECK(cudaStreamCreate(&g_stream));
    zt_cpu_set_threads(4);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
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
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5),     cmocka_unit_test(test_masks),    cmocka_unit_test(test_varlen),
        cmocka_unit_test(test_packed), cmocka_unit_test(test_mma),       cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
