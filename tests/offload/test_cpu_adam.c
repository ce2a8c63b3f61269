/* Tests of offload/cpu_adam.h: every instruction set this CPU has gives, for fp32 gradients, exactly the
 * bits of zt_cpu_adamw_update (kernels/cpu/adamw.c); fp16/bf16 gradients and outputs match the reference
 * update on gradients converted by an independent conversion; the thread count changes nothing; the
 * conversions round to nearest even and keep NaN; bad arguments are refused without changes; an update out of
 * place gives the bits of the same update in place. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/adamw.h"
#include "offload/cpu_adam.h"

static uint64_t g_state = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
    /* xorshift64*: deterministic test data, independent of common/rng.h */
    g_state ^= g_state >> 12;
    g_state ^= g_state << 25;
    g_state ^= g_state >> 27;
    return (uint32_t)((g_state * 0x2545f4914f6cdd1dull) >> 32);
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(next_u32() >> 8) * 0x1p-24f;
}

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Reference bf16 rounding in double: the nearer of the two neighbouring bf16 values, ties to even. */
static uint16_t ref_bf16(float x)
{
    if (isnan(x))
        return 0x7fc0;
    if (isinf(x))
        return (uint16_t)(bits(x) >> 16);
    uint32_t lo = bits(x) & 0xffff0000u;
    uint32_t hi = lo + 0x10000u; /* next value away from zero (may be infinity) */
    double dx = fabs((double)x), dlo = fabs((double)from_bits(lo)), dhi = fabs((double)from_bits(hi));
    if (isinf(from_bits(hi)))
        dhi = 0x1p128; /* the rounding boundary above FLT_MAX's bf16 */
    double d1 = dx - dlo, d2 = dhi - dx;
    if (d1 < d2 || (d1 == d2 && ((lo >> 16) & 1u) == 0))
        return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static float ref_bf16_to_f32(uint16_t h)
{
    return from_bits((uint32_t)h << 16);
}

/* fp16 through the compiler's _Float16 (software rounding to nearest even). */
static uint16_t ref_f16(float x)
{
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static float ref_f16_to_f32(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}

typedef struct state {
    size_t n;
    float *param, *m, *v, *grad;
} state;

static void state_init(state *s, size_t n)
{
    s->n = n;
    s->param = malloc((n + 1) * sizeof(float));
    s->m = malloc((n + 1) * sizeof(float));
    s->v = malloc((n + 1) * sizeof(float));
    s->grad = malloc((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        s->param[i] = uniform(-1.0f, 1.0f);
        s->m[i] = uniform(-0.01f, 0.01f);
        s->v[i] = uniform(0.0f, 1e-4f);
        /* gradients over many magnitudes, with exact zeros and tiny values */
        float g = uniform(-1.0f, 1.0f) * powf(10.0f, uniform(-8.0f, 2.0f));
        if (i % 97 == 0)
            g = 0.0f;
        if (i % 89 == 0)
            g = 1e-30f;
        s->grad[i] = g;
    }
}

static void state_copy(state *dst, const state *src)
{
    state_init(dst, src->n);
    memcpy(dst->param, src->param, src->n * sizeof(float));
    memcpy(dst->m, src->m, src->n * sizeof(float));
    memcpy(dst->v, src->v, src->n * sizeof(float));
    memcpy(dst->grad, src->grad, src->n * sizeof(float));
}

static void state_free(state *s)
{
    free(s->param);
    free(s->m);
    free(s->v);
    free(s->grad);
}

static void assert_same_bits(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (bits(a[i]) != bits(b[i]))
            fail_msg("%s[%zu]: %.9g (0x%08x) vs reference %.9g (0x%08x)", what, i, (double)a[i], bits(a[i]),
                     (double)b[i], bits(b[i]));
    }
}

static zt_adamw_params params(int step, float wd)
{
    zt_adamw_params p = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd,
                         .grad_scale = 0.731f, .step = step};
    return p;
}

static const enum zt_cpu_adam_isa k_isas[] = {ZT_CPU_ADAM_ISA_SCALAR, ZT_CPU_ADAM_ISA_AVX2, ZT_CPU_ADAM_ISA_AVX512};

/* fp32 gradients: every ISA, several sizes (tails included), steps and thread counts, against the
 * reference update, bit for bit. */
static void test_f32_matches_reference(void **unused)
{
    (void)unused;
    const size_t sizes[] = {0, 1, 7, 15, 16, 17, 33, 1000, 16384 + 5, 100003};
    int tested = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        state ref;
        state_init(&ref, sizes[si]);
        for (size_t k = 0; k < 3; k++) {
            enum zt_cpu_adam_isa isa = k_isas[k];
            if (!zt_cpu_adam_isa_supported(isa))
                continue;
            tested |= 1 << k;
            state ref_k, got;
            state_copy(&ref_k, &ref);
            state_copy(&got, &ref);
            float *out = malloc((ref.n + 1) * sizeof(float));
            for (int step = 1; step <= 4; step++) {
                zt_adamw_params p = params(step, step % 2 ? 0.1f : 0.0f);
                zt_cpu_adamw_update(ref_k.param, ref_k.m, ref_k.v, ref_k.grad, ref.n, &p);
                zt_cpu_adam_range r = {.param = got.param, .m = got.m, .v = got.v, .grad = got.grad,
                                       .grad_dtype = ZT_DTYPE_F32, .out = out, .out_dtype = ZT_DTYPE_F32,
                                       .n = ref.n};
                zt_err err = {{0}};
                assert_int_equal(zt_cpu_adam_update_isa(isa, &r, &p, 1 + step % 3, &err), 0);
                assert_same_bits(got.param, ref_k.param, ref.n, "param");
                assert_same_bits(got.m, ref_k.m, ref.n, "m");
                assert_same_bits(got.v, ref_k.v, ref.n, "v");
                assert_same_bits(out, ref_k.param, ref.n, "out");
            }
            free(out);
            state_free(&ref_k);
            state_free(&got);
        }
        state_free(&ref);
    }
    assert_true(tested & 1);
    print_message("instruction sets tested: %s%s%s (default %s)\n", tested & 1 ? "scalar " : "",
                  tested & 2 ? "avx2 " : "", tested & 4 ? "avx512 " : "",
                  zt_cpu_adam_isa_name(zt_cpu_adam_get_isa()));
}

/* Special values flow through identically: huge gradients, infinities and NaN in the state. */
static void test_f32_special_values(void **unused)
{
    (void)unused;
    const size_t n = 64;
    state ref;
    state_init(&ref, n);
    ref.grad[3] = INFINITY;
    ref.grad[4] = NAN;
    ref.grad[5] = 3e38f;
    ref.m[6] = NAN;
    ref.v[7] = INFINITY;
    ref.param[8] = -INFINITY;
    ref.grad[9] = -0.0f;
    ref.param[10] = -0.0f;
    zt_adamw_params p = params(1, 0.1f);
    for (size_t k = 0; k < 3; k++) {
        if (!zt_cpu_adam_isa_supported(k_isas[k]))
            continue;
        state a, b;
        state_copy(&a, &ref);
        state_copy(&b, &ref);
        zt_cpu_adamw_update(a.param, a.m, a.v, a.grad, n, &p);
        zt_cpu_adam_range r = {.param = b.param, .m = b.m, .v = b.v, .grad = b.grad, .grad_dtype = ZT_DTYPE_F32,
                               .n = n};
        assert_int_equal(zt_cpu_adam_update_isa(k_isas[k], &r, &p, 1, NULL), 0);
        assert_same_bits(b.param, a.param, n, "param");
        assert_same_bits(b.m, a.m, n, "m");
        assert_same_bits(b.v, a.v, n, "v");
        state_free(&a);
        state_free(&b);
    }
    state_free(&ref);
}

/* fp16 and bf16 gradients and outputs: the reference update on gradients converted by the reference
 * conversion, then the reference rounding of the new weights. */
static void test_lowp_grads_and_outputs(void **unused)
{
    (void)unused;
    const size_t n = 50021;
    const enum zt_dtype dts[] = {ZT_DTYPE_F32, ZT_DTYPE_F16, ZT_DTYPE_BF16};
    state base;
    state_init(&base, n);
    uint16_t *g16 = malloc(n * 2);
    float *gref = malloc(n * sizeof(float));
    void *out = malloc(n * 4);
    for (int gi = 1; gi < 3; gi++) {
        enum zt_dtype gdt = dts[gi];
        for (size_t i = 0; i < n; i++) {
            g16[i] = gdt == ZT_DTYPE_F16 ? ref_f16(base.grad[i]) : ref_bf16(base.grad[i]);
            gref[i] = gdt == ZT_DTYPE_F16 ? ref_f16_to_f32(g16[i]) : ref_bf16_to_f32(g16[i]);
        }
        for (int oi = 0; oi < 3; oi++) {
            enum zt_dtype odt = dts[oi];
            for (size_t k = 0; k < 3; k++) {
                if (!zt_cpu_adam_isa_supported(k_isas[k]))
                    continue;
                state a, b;
                state_copy(&a, &base);
                state_copy(&b, &base);
                zt_adamw_params p = params(7, 0.01f);
                zt_cpu_adamw_update(a.param, a.m, a.v, gref, n, &p);
                zt_cpu_adam_range r = {.param = b.param, .m = b.m, .v = b.v, .grad = g16, .grad_dtype = gdt,
                                       .out = out, .out_dtype = odt, .n = n};
                assert_int_equal(zt_cpu_adam_update_isa(k_isas[k], &r, &p, 2, NULL), 0);
                assert_same_bits(b.param, a.param, n, "param");
                assert_same_bits(b.m, a.m, n, "m");
                assert_same_bits(b.v, a.v, n, "v");
                for (size_t i = 0; i < n; i++) {
                    if (odt == ZT_DTYPE_F32)
                        assert_int_equal(bits(((float *)out)[i]), bits(a.param[i]));
                    else if (odt == ZT_DTYPE_F16)
                        assert_int_equal(((uint16_t *)out)[i], ref_f16(a.param[i]));
                    else
                        assert_int_equal(((uint16_t *)out)[i], ref_bf16(a.param[i]));
                }
                state_free(&a);
                state_free(&b);
            }
        }
    }
    free(g16);
    free(gref);
    free(out);
    state_free(&base);
}

/* The conversions on every bit pattern class: random bits, ties, subnormals, overflow, infinities, NaN. */
static void test_conversions(void **unused)
{
    (void)unused;
    const size_t n = 200000;
    float *src = malloc(n * sizeof(float));
    uint16_t *dst = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = next_u32();
        switch (i % 8) {
        case 0: u = (u & 0xffff0000u) | 0x8000u; break;             /* bf16 tie */
        case 1: u = (u & 0xffffe000u) | 0x1000u; break;             /* f16 tie (normal range) */
        case 2: u = (u & 0x80000000u) | (0x33000000u + (u & 0x07ffffffu)); break; /* f16 subnormals */
        case 3: u = (u & 0x80000000u) | (0x477f0000u + (u & 0x0001ffffu)); break; /* near 65504 */
        default: break;
        }
        src[i] = from_bits(u);
    }
    src[0] = NAN;
    src[1] = -NAN;
    src[2] = INFINITY;
    src[3] = -INFINITY;
    src[4] = 3.4028235e38f; /* FLT_MAX rounds to bf16 infinity */
    src[5] = from_bits(0x7f800001u); /* signalling NaN whose top 16 bits are infinity's */
    src[6] = 65520.0f;    /* f16 tie to infinity */
    src[7] = 0x1p-25f;    /* f16 tie to zero */
    for (int t = 0; t < 2; t++) {
        enum zt_dtype dt = t ? ZT_DTYPE_BF16 : ZT_DTYPE_F16;
        zt_err err = {{0}};
        assert_int_equal(zt_cpu_adam_convert(dst, dt, src, n, 2, &err), 0);
        for (size_t i = 0; i < n; i++) {
            uint16_t want = t ? ref_bf16(src[i]) : ref_f16(src[i]);
            if (isnan(src[i])) {
                float back = t ? ref_bf16_to_f32(dst[i]) : ref_f16_to_f32(dst[i]);
                if (!isnan(back))
                    fail_msg("%s of NaN 0x%08x gave 0x%04x, not a NaN", t ? "bf16" : "f16", bits(src[i]), dst[i]);
                continue;
            }
            if (dst[i] != want)
                fail_msg("%s of %.9g (0x%08x): 0x%04x, reference 0x%04x", t ? "bf16" : "f16", (double)src[i],
                         bits(src[i]), dst[i], want);
        }
    }
    free(src);
    free(dst);
}

/* The same results on 1, 2, 3 and 8 threads, on the default instruction set. */
static void test_threads_deterministic(void **unused)
{
    (void)unused;
    const size_t n = 200003;
    state base;
    state_init(&base, n);
    state first;
    state_copy(&first, &base);
    zt_adamw_params p = params(3, 0.1f);
    zt_cpu_adam_range r = {.param = first.param, .m = first.m, .v = first.v, .grad = first.grad,
                           .grad_dtype = ZT_DTYPE_F32, .n = n};
    assert_int_equal(zt_cpu_adam_update(&r, &p, 1, NULL), 0);
    const int threads[] = {2, 3, 8};
    for (int t = 0; t < 3; t++) {
        state s;
        state_copy(&s, &base);
        zt_cpu_adam_range rs = {.param = s.param, .m = s.m, .v = s.v, .grad = s.grad, .grad_dtype = ZT_DTYPE_F32,
                                .n = n};
        assert_int_equal(zt_cpu_adam_update(&rs, &p, threads[t], NULL), 0);
        assert_same_bits(s.param, first.param, n, "param");
        assert_same_bits(s.v, first.v, n, "v");
        state_free(&s);
    }
    state_free(&first);
    state_free(&base);
}

/* Out of place (param_src, m_src, v_src): the state read from there and written into param, m and v gives the
 * bits of the in-place update, on every instruction set and thread count, with fp32 and bf16 moments; the
 * source is left as it was and the destination's old contents do not matter; the three are set together. */
static void test_out_of_place(void **unused)
{
    (void)unused;
    const size_t n = 50003; /* several chunks and a tail */
    state base;
    state_init(&base, n);
    zt_adamw_params p = params(4, 0.1f);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const size_t ms = bf16 ? 2 : 4;
        /* the in-place reference, from the moments in their type */
        float *param_ref = malloc(n * 4);
        char *m_ref = malloc(n * ms), *v_ref = malloc(n * ms), *m0 = malloc(n * ms), *v0 = malloc(n * ms);
        for (size_t i = 0; i < n; i++) {
            if (bf16) {
                ((uint16_t *)m0)[i] = ref_bf16(base.m[i]);
                ((uint16_t *)v0)[i] = ref_bf16(base.v[i]);
            } else {
                ((float *)m0)[i] = base.m[i];
                ((float *)v0)[i] = base.v[i];
            }
        }
        memcpy(param_ref, base.param, n * 4);
        memcpy(m_ref, m0, n * ms);
        memcpy(v_ref, v0, n * ms);
        const enum zt_dtype md = bf16 ? ZT_DTYPE_BF16 : ZT_DTYPE_F32;
        zt_cpu_adam_range rr = {.param = param_ref, .m = m_ref, .v = v_ref, .grad = base.grad,
                                .grad_dtype = ZT_DTYPE_F32, .n = n, .moment_dtype = md, .seed = 4, .index_base = 7};
        assert_int_equal(zt_cpu_adam_update(&rr, &p, 1, NULL), 0);
        const int threads[] = {1, 3};
        for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++) {
            if (!zt_cpu_adam_isa_supported(k_isas[k]))
                continue;
            for (int t = 0; t < 2; t++) {
                float *param = malloc(n * 4);
                char *m = malloc(n * ms), *v = malloc(n * ms);
                memset(param, 0x7f, n * 4); /* whatever the other slot held */
                memset(m, 0x5a, n * ms);
                memset(v, 0xa5, n * ms);
                zt_cpu_adam_range r = {.param = param, .m = m, .v = v, .grad = base.grad, .grad_dtype = ZT_DTYPE_F32,
                                       .n = n, .moment_dtype = md, .seed = 4, .index_base = 7,
                                       .param_src = base.param, .m_src = m0, .v_src = v0};
                const float before = base.param[n / 2];
                assert_int_equal(zt_cpu_adam_update_isa(k_isas[k], &r, &p, threads[t], NULL), 0);
                assert_same_bits(param, param_ref, n, "param out of place");
                assert_memory_equal(m, m_ref, n * ms);
                assert_memory_equal(v, v_ref, n * ms);
                assert_true(bits(base.param[n / 2]) == bits(before)); /* the source is read only */
                free(param);
                free(m);
                free(v);
            }
        }
        free(param_ref);
        free(m_ref);
        free(v_ref);
        free(m0);
        free(v0);
    }
    /* one source without the others is refused */
    zt_cpu_adam_range bad = {.param = base.param, .m = base.m, .v = base.v, .grad = base.grad,
                             .grad_dtype = ZT_DTYPE_F32, .n = n, .param_src = base.param};
    zt_err err = {{0}};
    assert_int_equal(zt_cpu_adam_update(&bad, &p, 1, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "set together"));
    state_free(&base);
}

/* Out of place with the state laid out as a state server's record (master, m and v one after the other in one
 * buffer) at every alignment: the destination's start moved by 0 to 17 floats and n such that m and v are
 * aligned like the master or not (the update streams its stores to the arrays that are aligned after the first
 * elements and stores the others normally); bf16 and fp32 gradients, a bf16 output. Every instruction set and
 * thread count gives the in-place update's bits, and nothing outside the destination is written. */
static void test_out_of_place_alignments(void **unused)
{
    (void)unused;
    const size_t ns[] = {16 * 1024 * 3, 16 * 1024 * 3 + 5, 300, 65};
    const size_t shifts[] = {0, 1, 3, 8, 15, 17};
    zt_adamw_params p = params(3, 0.1f);
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const size_t n = ns[a];
        state base;
        state_init(&base, n);
        uint16_t *g16 = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            g16[i] = ref_bf16(base.grad[i]);
        for (int lowp = 0; lowp < 2; lowp++) {
            const void *grad = lowp ? (const void *)g16 : (const void *)base.grad;
            const enum zt_dtype gdt = lowp ? ZT_DTYPE_BF16 : ZT_DTYPE_F32;
            /* the reference: in place on a copy */
            state ref;
            state_copy(&ref, &base);
            uint16_t *out_ref = calloc(n, 2);
            zt_cpu_adam_range rr = {.param = ref.param, .m = ref.m, .v = ref.v, .grad = grad, .grad_dtype = gdt,
                                    .out = out_ref, .out_dtype = ZT_DTYPE_BF16, .n = n};
            assert_int_equal(zt_cpu_adam_update_isa(ZT_CPU_ADAM_ISA_SCALAR, &rr, &p, 1, NULL), 0);
            /* the source record, and a destination record with room for the shift and guard floats */
            float *src = malloc(3 * n * 4);
            memcpy(src, base.param, n * 4);
            memcpy(src + n, base.m, n * 4);
            memcpy(src + 2 * n, base.v, n * 4);
            const size_t room = 3 * n + 64;
            float *dst_buf = aligned_alloc(64, (room * 4 + 63) / 64 * 64);
            for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++) {
                if (!zt_cpu_adam_isa_supported(k_isas[k]))
                    continue;
                for (size_t s = 0; s < sizeof shifts / sizeof shifts[0]; s++) {
                    for (int threads = 1; threads <= 3; threads += 2) {
                        memset(dst_buf, 0x5a, room * 4);
                        float *dst = dst_buf + shifts[s];
                        uint16_t *out = calloc(n, 2);
                        zt_cpu_adam_range r = {.param = dst, .m = dst + n, .v = dst + 2 * n, .grad = grad,
                                               .grad_dtype = gdt, .out = out, .out_dtype = ZT_DTYPE_BF16, .n = n,
                                               .param_src = src, .m_src = src + n, .v_src = src + 2 * n};
                        assert_int_equal(zt_cpu_adam_update_isa(k_isas[k], &r, &p, threads, NULL), 0);
                        assert_same_bits(dst, ref.param, n, "param (record layout)");
                        assert_same_bits(dst + n, ref.m, n, "m (record layout)");
                        assert_same_bits(dst + 2 * n, ref.v, n, "v (record layout)");
                        assert_memory_equal(out, out_ref, n * 2);
                        for (size_t i = 0; i < shifts[s]; i++)
                            assert_true(bits(dst_buf[i]) == 0x5a5a5a5au);
                        for (size_t i = shifts[s] + 3 * n; i < room; i++)
                            assert_true(bits(dst_buf[i]) == 0x5a5a5a5au);
                        free(out);
                    }
                }
            }
            assert_same_bits(src, base.param, n, "source (read only)");
            free(dst_buf);
            free(src);
            free(out_ref);
            state_free(&ref);
        }
        free(g16);
        state_free(&base);
    }
}

/* bf16 moments: the parameters (and the bf16 output) are exactly those of the fp32 update on the widened
 * moments; each new moment is one of the two bf16 values around the fp32 result (the value itself when it
 * is a bf16 value), rounded up about as often as its position between them says; every instruction set
 * and thread count gives the same bits; the indices cross a multiple of 2^32. */
static void test_bf16_moments(void **unused)
{
    (void)unused;
    const size_t n = 100003;
    const uint64_t base_index = (1ull << 32) - 40000;
    state s0;
    state_init(&s0, n);
    s0.grad[3] = NAN; /* non-finite moments follow (round to nearest; NaN stays NaN), in the vector body */
    s0.grad[17] = INFINITY;
    s0.grad[n - 2] = -INFINITY; /* ... and in the scalar tail */
    uint16_t *m16 = malloc(n * 2), *v16 = malloc(n * 2), *out_ref = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        m16[i] = ref_bf16(s0.m[i]);
        v16[i] = ref_bf16(s0.v[i]);
        s0.m[i] = ref_bf16_to_f32(m16[i]); /* the widened moments the reference starts from */
        s0.v[i] = ref_bf16_to_f32(v16[i]);
    }
    state ref;
    state_copy(&ref, &s0);
    zt_adamw_params p = params(5, 0.1f);
    zt_cpu_adam_range rr = {.param = ref.param, .m = ref.m, .v = ref.v, .grad = ref.grad, .grad_dtype = ZT_DTYPE_F32,
                            .out = out_ref, .out_dtype = ZT_DTYPE_BF16, .n = n};
    assert_int_equal(zt_cpu_adam_update_isa(ZT_CPU_ADAM_ISA_SCALAR, &rr, &p, 1, NULL), 0);

    uint16_t *first_m = NULL, *first_v = NULL;
    const int threads[] = {1, 3};
    for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++) {
        if (!zt_cpu_adam_isa_supported(k_isas[k]))
            continue;
        for (int t = 0; t < 2; t++) {
            float *param = malloc(n * 4);
            uint16_t *m = malloc(n * 2), *v = malloc(n * 2), *out = malloc(n * 2);
            memcpy(param, s0.param, n * 4);
            memcpy(m, m16, n * 2);
            memcpy(v, v16, n * 2);
            zt_cpu_adam_range r = {.param = param, .m = m, .v = v, .grad = s0.grad, .grad_dtype = ZT_DTYPE_F32,
                                   .out = out, .out_dtype = ZT_DTYPE_BF16, .n = n, .moment_dtype = ZT_DTYPE_BF16,
                                   .seed = 5, .index_base = base_index};
            assert_int_equal(zt_cpu_adam_update_isa(k_isas[k], &r, &p, threads[t], NULL), 0);
            assert_same_bits(param, ref.param, n, "param with bf16 moments");
            assert_memory_equal(out, out_ref, n * 2);
            double up_minus_frac = 0.0;
            size_t inexact = 0;
            for (size_t i = 0; i < n; i++) {
                const float want[2] = {ref.m[i], ref.v[i]};
                const uint16_t got[2] = {m[i], v[i]};
                for (int j = 0; j < 2; j++) {
                    if (!isfinite(want[j])) {
                        float w = ref_bf16_to_f32(got[j]);
                        if (isnan(want[j]) ? !isnan(w) : w != want[j])
                            fail_msg("moment %d [%zu]: %g became 0x%04x", j, i, (double)want[j], got[j]);
                        continue;
                    }
                    uint32_t b = bits(want[j]), low = b & 0xffffu, lo = b >> 16;
                    if (low == 0) {
                        if (got[j] != lo)
                            fail_msg("moment %d [%zu]: exact bf16 value 0x%04x became 0x%04x", j, i, lo, got[j]);
                        continue;
                    }
                    if (got[j] != lo && got[j] != lo + 1)
                        fail_msg("moment %d [%zu]: %.9g rounded to 0x%04x, not a neighbour", j, i, (double)want[j],
                                 got[j]);
                    up_minus_frac += (got[j] == lo + 1 ? 1.0 : 0.0) - low / 65536.0;
                    inexact++;
                }
            }
            /* unbiased: rounded up as often as the fractions say (about 200k draws: 5 sigma is 0.0056) */
            if (fabs(up_minus_frac / (double)inexact) > 0.006)
                fail_msg("stochastic rounding is biased: mean(up - fraction) = %.4f", up_minus_frac / inexact);
            if (!first_m) {
                first_m = m;
                first_v = v;
            } else {
                assert_memory_equal(m, first_m, n * 2);
                assert_memory_equal(v, first_v, n * 2);
                free(m);
                free(v);
            }
            free(param);
            free(out);
        }
    }
    /* another seed draws other bits */
    {
        float *param = malloc(n * 4);
        uint16_t *m = malloc(n * 2), *v = malloc(n * 2);
        memcpy(param, s0.param, n * 4);
        memcpy(m, m16, n * 2);
        memcpy(v, v16, n * 2);
        zt_cpu_adam_range r = {.param = param, .m = m, .v = v, .grad = s0.grad, .grad_dtype = ZT_DTYPE_F32, .n = n,
                               .moment_dtype = ZT_DTYPE_BF16, .seed = 6, .index_base = base_index};
        assert_int_equal(zt_cpu_adam_update(&r, &p, 2, NULL), 0);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += m[i] != first_m[i];
        assert_true(differ > n / 10);
        /* moments in another dtype are refused, nothing changed */
        memcpy(m, first_m, n * 2);
        r.moment_dtype = ZT_DTYPE_F16;
        zt_err err = {{0}};
        assert_int_equal(zt_cpu_adam_update(&r, &p, 2, &err), ZT_EUNSUPPORTED);
        assert_non_null(strstr(err.msg, "moment dtype"));
        assert_memory_equal(m, first_m, n * 2);
        free(param);
        free(m);
        free(v);
    }
    free(first_m);
    free(first_v);
    free(m16);
    free(v16);
    free(out_ref);
    state_free(&ref);
    state_free(&s0);
}

/* Widening to fp32 is exact for every bf16 and fp16 bit pattern (NaN stays NaN), on every size (vector
 * bodies and tails) and thread count. */
static void test_widen(void **unused)
{
    (void)unused;
    const size_t n = 65536 + 37; /* every 16-bit pattern, then a tail */
    uint16_t *h = malloc(n * 2);
    float *out = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)(i * 40503u);
    for (int t = 1; t <= 3; t += 2) {
        assert_int_equal(zt_cpu_adam_widen(out, h, ZT_DTYPE_BF16, n, t, NULL), 0);
        for (size_t i = 0; i < n; i++) {
            float want = ref_bf16_to_f32(h[i]);
            if (isnan(want) ? !isnan(out[i]) : bits(out[i]) != bits(want))
                fail_msg("bf16 0x%04x widened to 0x%08x", h[i], bits(out[i]));
        }
        assert_int_equal(zt_cpu_adam_widen(out, h, ZT_DTYPE_F16, n, t, NULL), 0);
        for (size_t i = 0; i < n; i++) {
            float want = ref_f16_to_f32(h[i]);
            if (isnan(want) ? !isnan(out[i]) : bits(out[i]) != bits(want))
                fail_msg("fp16 0x%04x widened to 0x%08x", h[i], bits(out[i]));
        }
    }
    zt_err err = {{0}};
    assert_int_equal(zt_cpu_adam_widen(out, h, ZT_DTYPE_I32, n, 1, &err), ZT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "input dtype"));
    free(h);
    free(out);
}

/* Why stochastic rounding: with beta2 = 0.999 and a squared gradient 0.1% above v, each step moves v by
 * 1e-6 relative, far below bf16's half step (2e-3): rounded to nearest, v never moves. Rounded
 * stochastically, its mean over many elements follows the fp32 recurrence. */
static void test_bf16_moments_follow_small_updates(void **unused)
{
    (void)unused;
    const size_t n = 16384;
    const int steps = 2000;
    float *p32 = malloc(n * 4), *m32 = calloc(n, 4), *v32 = malloc(n * 4), *g = malloc(n * 4), *p16 = malloc(n * 4);
    uint16_t *m16 = calloc(n, 2), *v16 = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        p32[i] = p16[i] = 0.5f;
        v32[i] = 1.0f;
        v16[i] = 0x3f80; /* 1.0 */
        g[i] = sqrtf(1.001f);
    }
    zt_adamw_params p = {.lr = 1e-6f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1.0f};
    for (int s = 1; s <= steps; s++) {
        p.step = s;
        zt_cpu_adam_range a = {.param = p32, .m = m32, .v = v32, .grad = g, .grad_dtype = ZT_DTYPE_F32, .n = n};
        zt_cpu_adam_range b = {.param = p16, .m = m16, .v = v16, .grad = g, .grad_dtype = ZT_DTYPE_F32, .n = n,
                               .moment_dtype = ZT_DTYPE_BF16, .seed = (uint64_t)s};
        assert_int_equal(zt_cpu_adam_update(&a, &p, 1, NULL), 0);
        assert_int_equal(zt_cpu_adam_update(&b, &p, 1, NULL), 0);
    }
    double mean = 0.0;
    for (size_t i = 0; i < n; i++)
        mean += ref_bf16_to_f32(v16[i]);
    mean /= (double)n;
    const double want = v32[0], moved = want - 1.0; /* about 8.6e-4 */
    print_message("v after %d steps: fp32 %.7f, bf16 moments (mean of %zu) %.7f\n", steps, want, n, mean);
    assert_true(moved > 5e-4);
    if (fabs(mean - want) > 0.2 * moved) /* the mean's spread is about 2% of `moved` */
        fail_msg("bf16 v mean %.7f does not follow fp32 %.7f", mean, want);
    free(p32);
    free(m32);
    free(v32);
    free(g);
    free(p16);
    free(m16);
    free(v16);
}

/* Bad dtypes, step 0 and NULL arrays are refused with a message, and nothing changes. */
static void test_bad_arguments(void **unused)
{
    (void)unused;
    state s;
    state_init(&s, 10);
    state keep;
    state_copy(&keep, &s);
    zt_err err = {{0}};
    zt_adamw_params p = params(1, 0.0f);
    zt_cpu_adam_range r = {.param = s.param, .m = s.m, .v = s.v, .grad = s.grad, .grad_dtype = ZT_DTYPE_I32,
                           .n = 10};
    assert_int_equal(zt_cpu_adam_update(&r, &p, 1, &err), ZT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "I32"));
    r.grad_dtype = ZT_DTYPE_F32;
    r.out = s.grad;
    r.out_dtype = ZT_DTYPE_F64;
    assert_int_equal(zt_cpu_adam_update(&r, &p, 1, &err), ZT_EUNSUPPORTED);
    r.out = NULL;
    p.step = 0;
    assert_int_equal(zt_cpu_adam_update(&r, &p, 1, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "step"));
    p.step = 1;
    r.m = NULL;
    assert_int_equal(zt_cpu_adam_update(&r, &p, 1, &err), ZT_EINVAL_CONFIG);
    assert_same_bits(s.param, keep.param, 10, "param");
    assert_int_equal(zt_cpu_adam_convert(s.grad, ZT_DTYPE_U8, s.param, 10, 1, &err), ZT_EUNSUPPORTED);
    state_free(&s);
    state_free(&keep);
}

/* ZT_CPU_ADAM_ISA picks the path (ctest runs this file once per value). */
static void test_env_override(void **unused)
{
    (void)unused;
    const char *want = getenv("ZT_CPU_ADAM_ISA");
    enum zt_cpu_adam_isa got = zt_cpu_adam_get_isa();
    assert_true(zt_cpu_adam_isa_supported(got));
    if (!want)
        return;
    enum zt_cpu_adam_isa w = strcmp(want, "avx512") == 0 ? ZT_CPU_ADAM_ISA_AVX512
                             : strcmp(want, "avx2") == 0 ? ZT_CPU_ADAM_ISA_AVX2
                                                         : ZT_CPU_ADAM_ISA_SCALAR;
    if (zt_cpu_adam_isa_supported(w))
        assert_string_equal(zt_cpu_adam_isa_name(got), zt_cpu_adam_isa_name(w));
    else
        assert_true(got < w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_matches_reference), cmocka_unit_test(test_f32_special_values),
        cmocka_unit_test(test_lowp_grads_and_outputs), cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_threads_deterministic),  cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_env_override),         cmocka_unit_test(test_bf16_moments),
        cmocka_unit_test(test_bf16_moments_follow_small_updates), cmocka_unit_test(test_widen),
        cmocka_unit_test(test_out_of_place), cmocka_unit_test(test_out_of_place_alignments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
