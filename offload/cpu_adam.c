/* CPU AdamW for the state server and the cpu optimizer placement (offload/cpu_adam.h): one loop body,
 * compiled three times (scalar, AVX2+F16C, AVX-512F), picked at run time.
 *
 * Bit-identity with zt_cpu_adamw_update (kernels/cpu/adamw.c) rests on doing exactly its operations, in
 * its order, in fp32: g = grad * gs; m = b1 m + (1 - b1) g; v = b2 v + ((1 - b2) g) g; mhat = m / bc1;
 * vhat = v / bc2; param = param - lr (mhat / (sqrt(vhat) + eps) + wd param). This file is compiled with
 * -ffp-contract=off (offload/CMakeLists.txt) so no multiply-add is fused, and the vector tails run the
 * scalar body. Division and square root are correctly rounded in every instruction set. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define ZT_ADAM_X86 1
#endif

#include "kernels/cpu_threads.h"
#include "offload/cpu_adam.h"

#define ZT_ADAM_INLINE static inline __attribute__((always_inline))

/* Elements per unit of work handed to a thread: large enough to amortise scheduling, small enough to
 * balance 16+ threads on a few-million-element shard. A multiple of every vector width. */
#define ZT_ADAM_CHUNK ((size_t)16384)

/* The per-step constants, computed once exactly as the reference computes them. */
typedef struct adam_consts {
    float beta1, beta2, one_minus_beta1, one_minus_beta2, bc1, bc2, lr, eps, wd, gs;
} adam_consts;

/* ---- scalar conversions (the reference for the vector ones) ---- */

ZT_ADAM_INLINE uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

ZT_ADAM_INLINE float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

ZT_ADAM_INLINE float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* Round to nearest even; a NaN stays a NaN (quiet bit set, so that truncation cannot make it infinity). */
ZT_ADAM_INLINE uint16_t f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half to float, exact (subnormals included). */
ZT_ADAM_INLINE float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in fp32 */
    float f = (float)man * 0x1p-24f;
    return sign ? -f : f;
}

/* Float to IEEE half, round to nearest even, as F16C's vcvtps2ph does (NaN: quiet, top mantissa bits kept). */
ZT_ADAM_INLINE uint16_t f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* rounds to 65536 or more, or is infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal half: rebias, round the 13 dropped bits to nearest even */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) /* below half the smallest subnormal (2^-25): rounds to zero */
        return sign;
    /* subnormal half: value = a's significand scaled by 2^(e-127); shift so that units are 2^-24 */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

ZT_ADAM_INLINE float load_grad1(const void *grad, enum zt_dtype dt, size_t i)
{
    if (dt == ZT_DTYPE_F32)
        return ((const float *)grad)[i];
    if (dt == ZT_DTYPE_F16)
        return f16_to_f32(((const uint16_t *)grad)[i]);
    return bf16_to_f32(((const uint16_t *)grad)[i]);
}

ZT_ADAM_INLINE void store_out1(void *out, enum zt_dtype dt, size_t i, float x)
{
    if (dt == ZT_DTYPE_F32)
        ((float *)out)[i] = x;
    else if (dt == ZT_DTYPE_F16)
        ((uint16_t *)out)[i] = f32_to_f16(x);
    else
        ((uint16_t *)out)[i] = f32_to_bf16(x);
}

/* Where an array's old values are read from: its source (a two-slot update, which reads one state and writes
 * another) or, in place, the array itself. */
#define SRC_OR(src, dst) ((src) ? (const float *)(src) : (const float *)(dst))

/* The reference's element update, operation for operation (kernels/cpu/adamw.c). */
ZT_ADAM_INLINE void adam_scalar_range(const zt_cpu_adam_range *r, const adam_consts *c, enum zt_dtype gdt,
                                      int has_out, enum zt_dtype odt, size_t begin, size_t end)
{
    float *param = r->param, *m = r->m, *v = r->v;
    const float *ps = SRC_OR(r->param_src, param), *ms = SRC_OR(r->m_src, m), *vs = SRC_OR(r->v_src, v);
    for (size_t i = begin; i < end; i++) {
        float g = load_grad1(r->grad, gdt, i) * c->gs;
        float mi = c->beta1 * ms[i] + c->one_minus_beta1 * g;
        float vi = c->beta2 * vs[i] + c->one_minus_beta2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / c->bc1;
        float vhat = vi / c->bc2;
        float p = ps[i];
        p -= c->lr * (mhat / (sqrtf(vhat) + c->eps) + c->wd * p);
        param[i] = p;
        if (has_out)
            store_out1(r->out, odt, i, p);
    }
}

static void adam_chunk_scalar(const zt_cpu_adam_range *r, const adam_consts *c, size_t begin, size_t end)
{
    int has_out = r->out != NULL;
    /* Separate instantiations per dtype pair keep the inner loop free of dtype branches. */
#define ZT_ADAM_SCALAR_CASE(G, O, H) adam_scalar_range(r, c, G, H, O, begin, end)
    if (r->grad_dtype == ZT_DTYPE_F32) {
        if (!has_out) ZT_ADAM_SCALAR_CASE(ZT_DTYPE_F32, ZT_DTYPE_F32, 0);
        else if (r->out_dtype == ZT_DTYPE_F32) ZT_ADAM_SCALAR_CASE(ZT_DTYPE_F32, ZT_DTYPE_F32, 1);
        else if (r->out_dtype == ZT_DTYPE_F16) ZT_ADAM_SCALAR_CASE(ZT_DTYPE_F32, ZT_DTYPE_F16, 1);
        else ZT_ADAM_SCALAR_CASE(ZT_DTYPE_F32, ZT_DTYPE_BF16, 1);
    } else {
        /* Low-precision gradients: conversion dominates less than memory; one generic loop. */
        adam_scalar_range(r, c, r->grad_dtype, has_out, r->out_dtype, begin, end);
    }
#undef ZT_ADAM_SCALAR_CASE
}

#ifdef ZT_ADAM_X86
/* ---- AVX2 + F16C: 8 lanes ---- */
#define ZT_TARGET_AVX2 __attribute__((target("avx2,f16c")))

/* A store of 8 floats, streamed (nt: 32-byte aligned, past the caches) or not. */
#define ZT_STORE256(nt, p, x) ((nt) ? _mm256_stream_ps((p), (x)) : _mm256_storeu_ps((p), (x)))

ZT_ADAM_INLINE ZT_TARGET_AVX2 __m256 avx2_load_grad(const void *grad, enum zt_dtype dt, size_t i)
{
    if (dt == ZT_DTYPE_F32)
        return _mm256_loadu_ps((const float *)grad + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)grad + i));
    if (dt == ZT_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* bf16 rounding of 8 floats with integer operations (see f32_to_bf16), packed into 8 halfwords. */
ZT_ADAM_INLINE ZT_TARGET_AVX2 __m128i avx2_to_bf16(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i is_nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, is_nan), 16);
    /* 32-bit lanes -> 16-bit: packus works per 128-bit half, then fix the order of the two halves */
    __m256i packed = _mm256_packus_epi32(r, r);
    packed = _mm256_permute4x64_epi64(packed, 0x08);
    return _mm256_castsi256_si128(packed);
}

ZT_ADAM_INLINE ZT_TARGET_AVX2 void avx2_store_out(void *out, enum zt_dtype dt, size_t i, __m256 x)
{
    if (dt == ZT_DTYPE_F32)
        _mm256_storeu_ps((float *)out + i, x);
    else if (dt == ZT_DTYPE_F16)
        _mm_storeu_si128((__m128i *)((uint16_t *)out + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    else
        _mm_storeu_si128((__m128i *)((uint16_t *)out + i), avx2_to_bf16(x));
}

ZT_ADAM_INLINE ZT_TARGET_AVX2 void adam_avx2_range(const zt_cpu_adam_range *r, const adam_consts *c,
                                                    enum zt_dtype gdt, int has_out, enum zt_dtype odt,
                                                    size_t begin, size_t end)
{
    float *param = r->param, *m = r->m, *v = r->v;
    const float *ps = SRC_OR(r->param_src, param), *ms = SRC_OR(r->m_src, m), *vs = SRC_OR(r->v_src, v);
    const __m256 beta1 = _mm256_set1_ps(c->beta1), beta2 = _mm256_set1_ps(c->beta2);
    const __m256 omb1 = _mm256_set1_ps(c->one_minus_beta1), omb2 = _mm256_set1_ps(c->one_minus_beta2);
    const __m256 bc1 = _mm256_set1_ps(c->bc1), bc2 = _mm256_set1_ps(c->bc2);
    const __m256 lr = _mm256_set1_ps(c->lr), eps = _mm256_set1_ps(c->eps);
    const __m256 wd = _mm256_set1_ps(c->wd), gs = _mm256_set1_ps(c->gs);
    size_t i = begin;
    /* A two-slot update writes state that is read again only by the next step, long after it has left the
     * caches: streaming stores write it without first reading the old lines in (a third less memory
     * traffic). They need aligned addresses: the first elements up to param's alignment go through the
     * scalar body, then m and v stream where they are aligned too. */
    int nt_p = 0, nt_m = 0, nt_v = 0;
    if (r->param_src && end - begin >= 4 * 8) {
        size_t head = ((31u + 1u - ((uintptr_t)(param + i) & 31u)) & 31u) / sizeof(float);
        adam_scalar_range(r, c, gdt, has_out, odt, i, i + head);
        i += head;
        nt_p = 1;
        nt_m = r->m_src && ((uintptr_t)(m + i) & 31u) == 0; /* not the bf16 moments' widened copies */
        nt_v = r->v_src && ((uintptr_t)(v + i) & 31u) == 0;
    }
    for (; i + 8 <= end; i += 8) {
        /* every load before the first store: in place the sources are the destinations */
        __m256 p = _mm256_loadu_ps(ps + i);
        __m256 g = _mm256_mul_ps(avx2_load_grad(r->grad, gdt, i), gs);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(ms + i)), _mm256_mul_ps(omb1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(vs + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        ZT_STORE256(nt_m, m + i, mi);
        ZT_STORE256(nt_v, v + i, vi);
        __m256 mhat = _mm256_div_ps(mi, bc1);
        __m256 vhat = _mm256_div_ps(vi, bc2);
        __m256 upd = _mm256_add_ps(_mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), eps)),
                                   _mm256_mul_ps(wd, p));
        p = _mm256_sub_ps(p, _mm256_mul_ps(lr, upd));
        ZT_STORE256(nt_p, param + i, p);
        if (has_out)
            avx2_store_out(r->out, odt, i, p);
    }
    if (nt_p)
        _mm_sfence(); /* the streamed lines reach memory before another thread is told the range is done */
    adam_scalar_range(r, c, gdt, has_out, odt, i, end);
}

#define ZT_ADAM_DISPATCH(FN)                                                                              \
    do {                                                                                                  \
        int has_out_ = r->out != NULL;                                                                    \
        enum zt_dtype g_ = r->grad_dtype, o_ = has_out_ ? r->out_dtype : ZT_DTYPE_F32;                    \
        if (g_ == ZT_DTYPE_F32) {                                                                         \
            if (!has_out_) FN(r, c, ZT_DTYPE_F32, 0, ZT_DTYPE_F32, begin, end);                           \
            else if (o_ == ZT_DTYPE_F32) FN(r, c, ZT_DTYPE_F32, 1, ZT_DTYPE_F32, begin, end);             \
            else if (o_ == ZT_DTYPE_F16) FN(r, c, ZT_DTYPE_F32, 1, ZT_DTYPE_F16, begin, end);             \
            else FN(r, c, ZT_DTYPE_F32, 1, ZT_DTYPE_BF16, begin, end);                                    \
        } else if (g_ == ZT_DTYPE_F16) {                                                                  \
            if (!has_out_) FN(r, c, ZT_DTYPE_F16, 0, ZT_DTYPE_F32, begin, end);                           \
            else if (o_ == ZT_DTYPE_F32) FN(r, c, ZT_DTYPE_F16, 1, ZT_DTYPE_F32, begin, end);             \
            else if (o_ == ZT_DTYPE_F16) FN(r, c, ZT_DTYPE_F16, 1, ZT_DTYPE_F16, begin, end);             \
            else FN(r, c, ZT_DTYPE_F16, 1, ZT_DTYPE_BF16, begin, end);                                    \
        } else {                                                                                          \
            if (!has_out_) FN(r, c, ZT_DTYPE_BF16, 0, ZT_DTYPE_F32, begin, end);                          \
            else if (o_ == ZT_DTYPE_F32) FN(r, c, ZT_DTYPE_BF16, 1, ZT_DTYPE_F32, begin, end);            \
            else if (o_ == ZT_DTYPE_F16) FN(r, c, ZT_DTYPE_BF16, 1, ZT_DTYPE_F16, begin, end);            \
            else FN(r, c, ZT_DTYPE_BF16, 1, ZT_DTYPE_BF16, begin, end);                                   \
        }                                                                                                 \
    } while (0)

static ZT_TARGET_AVX2 void adam_chunk_avx2(const zt_cpu_adam_range *r, const adam_consts *c, size_t begin,
                                           size_t end)
{
    ZT_ADAM_DISPATCH(adam_avx2_range);
}

/* ---- AVX-512F: 16 lanes ---- */
#define ZT_TARGET_AVX512 __attribute__((target("avx512f")))

/* A store of 16 floats, streamed (nt: 64-byte aligned, past the caches) or not. */
#define ZT_STORE512(nt, p, x) ((nt) ? _mm512_stream_ps((p), (x)) : _mm512_storeu_ps((p), (x)))

ZT_ADAM_INLINE ZT_TARGET_AVX512 __m512 avx512_load_grad(const void *grad, enum zt_dtype dt, size_t i)
{
    if (dt == ZT_DTYPE_F32)
        return _mm512_loadu_ps((const float *)grad + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)grad + i));
    if (dt == ZT_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* bf16 rounding of 16 floats with integer operations (see f32_to_bf16). */
ZT_ADAM_INLINE ZT_TARGET_AVX512 __m256i avx512_to_bf16(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i absu = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 is_nan = _mm512_cmpgt_epu32_mask(absu, _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    __m512i r = _mm512_srli_epi32(_mm512_mask_blend_epi32(is_nan, rounded, quiet), 16);
    return _mm512_cvtepi32_epi16(r);
}

ZT_ADAM_INLINE ZT_TARGET_AVX512 void avx512_store_out(void *out, enum zt_dtype dt, size_t i, __m512 x)
{
    if (dt == ZT_DTYPE_F32)
        _mm512_storeu_ps((float *)out + i, x);
    else if (dt == ZT_DTYPE_F16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    else
        _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), avx512_to_bf16(x));
}

ZT_ADAM_INLINE ZT_TARGET_AVX512 void adam_avx512_range(const zt_cpu_adam_range *r, const adam_consts *c,
                                                        enum zt_dtype gdt, int has_out, enum zt_dtype odt,
                                                        size_t begin, size_t end)
{
    float *param = r->param, *m = r->m, *v = r->v;
    const float *ps = SRC_OR(r->param_src, param), *ms = SRC_OR(r->m_src, m), *vs = SRC_OR(r->v_src, v);
    const __m512 beta1 = _mm512_set1_ps(c->beta1), beta2 = _mm512_set1_ps(c->beta2);
    const __m512 omb1 = _mm512_set1_ps(c->one_minus_beta1), omb2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 bc1 = _mm512_set1_ps(c->bc1), bc2 = _mm512_set1_ps(c->bc2);
    const __m512 lr = _mm512_set1_ps(c->lr), eps = _mm512_set1_ps(c->eps);
    const __m512 wd = _mm512_set1_ps(c->wd), gs = _mm512_set1_ps(c->gs);
    size_t i = begin;
    /* A two-slot update writes state that is read again only by the next step, long after it has left the
     * caches: streaming stores write it without first reading the old lines in (a third less memory
     * traffic). They need aligned addresses: the first elements up to param's alignment go through the
     * scalar body, then m and v stream where they are aligned too. */
    int nt_p = 0, nt_m = 0, nt_v = 0;
    if (r->param_src && end - begin >= 4 * 16) {
        size_t head = ((63u + 1u - ((uintptr_t)(param + i) & 63u)) & 63u) / sizeof(float);
        adam_scalar_range(r, c, gdt, has_out, odt, i, i + head);
        i += head;
        nt_p = 1;
        nt_m = r->m_src && ((uintptr_t)(m + i) & 63u) == 0; /* not the bf16 moments' widened copies */
        nt_v = r->v_src && ((uintptr_t)(v + i) & 63u) == 0;
    }
    for (; i + 16 <= end; i += 16) {
        /* every load before the first store: in place the sources are the destinations */
        __m512 p = _mm512_loadu_ps(ps + i);
        __m512 g = _mm512_mul_ps(avx512_load_grad(r->grad, gdt, i), gs);
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(ms + i)), _mm512_mul_ps(omb1, g));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(vs + i)),
                                  _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        ZT_STORE512(nt_m, m + i, mi);
        ZT_STORE512(nt_v, v + i, vi);
        __m512 mhat = _mm512_div_ps(mi, bc1);
        __m512 vhat = _mm512_div_ps(vi, bc2);
        __m512 upd = _mm512_add_ps(_mm512_div_ps(mhat, _mm512_add_ps(_mm512_sqrt_ps(vhat), eps)),
                                   _mm512_mul_ps(wd, p));
        p = _mm512_sub_ps(p, _mm512_mul_ps(lr, upd));
        ZT_STORE512(nt_p, param + i, p);
        if (has_out)
            avx512_store_out(r->out, odt, i, p);
    }
    if (nt_p)
        _mm_sfence(); /* the streamed lines reach memory before another thread is told the range is done */
    adam_scalar_range(r, c, gdt, has_out, odt, i, end);
}

static ZT_TARGET_AVX512 void adam_chunk_avx512(const zt_cpu_adam_range *r, const adam_consts *c, size_t begin,
                                               size_t end)
{
    ZT_ADAM_DISPATCH(adam_avx512_range);
}
#endif /* ZT_ADAM_X86 */

typedef void (*adam_chunk_fn)(const zt_cpu_adam_range *r, const adam_consts *c, size_t begin, size_t end);

#ifdef ZT_ADAM_X86
/* F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know "f16c"). */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

/* Whether this CPU (and build) can run the given instruction set: 1 or 0. */
int zt_cpu_adam_isa_supported(enum zt_cpu_adam_isa isa)
{
    switch (isa) {
    case ZT_CPU_ADAM_ISA_SCALAR:
        return 1;
#ifdef ZT_ADAM_X86
    case ZT_CPU_ADAM_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case ZT_CPU_ADAM_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

/* Returns "avx512", "avx2" or "scalar" (never NULL). */
const char *zt_cpu_adam_isa_name(enum zt_cpu_adam_isa isa)
{
    switch (isa) {
    case ZT_CPU_ADAM_ISA_AVX512:
        return "avx512";
    case ZT_CPU_ADAM_ISA_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

static enum zt_cpu_adam_isa pick_isa(void)
{
    enum zt_cpu_adam_isa best = ZT_CPU_ADAM_ISA_SCALAR;
    if (zt_cpu_adam_isa_supported(ZT_CPU_ADAM_ISA_AVX512))
        best = ZT_CPU_ADAM_ISA_AVX512;
    else if (zt_cpu_adam_isa_supported(ZT_CPU_ADAM_ISA_AVX2))
        best = ZT_CPU_ADAM_ISA_AVX2;
    /* ZT_CPU_ADAM_ISA can only lower the choice: asking for more than the CPU has would crash. */
    const char *want = getenv("ZT_CPU_ADAM_ISA");
    if (want && strcmp(want, "scalar") == 0)
        best = ZT_CPU_ADAM_ISA_SCALAR;
    else if (want && strcmp(want, "avx2") == 0 && best > ZT_CPU_ADAM_ISA_AVX2)
        best = ZT_CPU_ADAM_ISA_AVX2;
    return best;
}

/* Returns the instruction set zt_cpu_adam_update uses, chosen once per process. */
enum zt_cpu_adam_isa zt_cpu_adam_get_isa(void)
{
    static int chosen = -1; /* benign race: every thread computes the same value */
    if (chosen < 0)
        chosen = (int)pick_isa();
    return (enum zt_cpu_adam_isa)chosen;
}

/* ---- bf16 moments ---- */

/* A 32-bit mixing function (the "lowbias32" finaliser): every output bit depends on every input bit. */
ZT_ADAM_INLINE uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* The key of moment `which` (0: m, 1: v) for the elements whose index has these high 32 bits. */
ZT_ADAM_INLINE uint32_t sr_key(uint64_t seed, uint32_t idx_hi, uint32_t which)
{
    return mix32(mix32((uint32_t)seed ^ (which ? 0x9e3779b9u : 0x85ebca6bu)) ^ mix32((uint32_t)(seed >> 32) + idx_hi));
}

/* x rounded to bf16 stochastically with the random 16 bits r16: the 16 bits dropped, plus r16, carry
 * into the kept ones with probability (dropped bits) / 65536. Infinity and NaN round to nearest (a NaN
 * stays a NaN); a carry into the all-ones exponent truncates instead. */
ZT_ADAM_INLINE uint16_t f32_to_bf16_sr(float x, uint32_t r16)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u)
        return f32_to_bf16(x);
    uint32_t t = u + r16;
    if ((t & 0x7f800000u) == 0x7f800000u)
        t = u;
    return (uint16_t)(t >> 16);
}

/* dst[i] = src[i] widened, i < len. */
static void widen_scalar(float *dst, const uint16_t *src, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = bf16_to_f32(src[i]);
}

/* The random 16 bits of element index lo + i: the top of a Weyl sequence over the indices, (lo + i) times
 * the golden ratio plus the step's key, modulo 2^32. Within a step the elements' bits are spread evenly;
 * across steps each element's are offset by a fresh key, so every element is rounded up with the right
 * probability on average. One multiply (or, in the vector loop, one add) per element. */
#define ZT_ADAM_WEYL 0x9e3779b9u

/* dst[i] = src[i] rounded stochastically with the bits of element index lo + i (lo + len - 1 must not pass
 * 2^32: one key serves the whole range). */
static void narrow_scalar(uint16_t *dst, const float *src, uint32_t lo, uint32_t key, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = f32_to_bf16_sr(src[i], ((lo + (uint32_t)i) * ZT_ADAM_WEYL + key) >> 16);
}

#ifdef ZT_ADAM_X86
static ZT_TARGET_AVX2 void widen_avx2(float *dst, const uint16_t *src, size_t len)
{
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
    widen_scalar(dst + i, src + i, len - i);
}

/* narrow_scalar's bits, 8 lanes at a time. */
static ZT_TARGET_AVX2 void narrow_avx2(uint16_t *dst, const float *src, uint32_t lo, uint32_t key, size_t len)
{
    /* the Weyl sequence of lanes lo .. lo + 7, advanced by 8 steps per iteration */
    __m256i weyl = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                       _mm256_set1_epi32((int)ZT_ADAM_WEYL)),
                                    _mm256_set1_epi32((int)(lo * ZT_ADAM_WEYL + key)));
    const __m256i step8 = _mm256_set1_epi32((int)(8u * ZT_ADAM_WEYL));
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), expmask = _mm256_set1_epi32(0x7f800000);
    const __m256i maxfin = _mm256_set1_epi32(0x7f7fffff);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256i r16 = _mm256_srli_epi32(weyl, 16);
        weyl = _mm256_add_epi32(weyl, step8);
        __m256 x = _mm256_loadu_ps(src + i);
        __m256i u = _mm256_castps_si256(x);
        /* stochastic: u + r16, unless that carries into the all-ones exponent (then u truncated) */
        __m256i t = _mm256_add_epi32(u, r16);
        __m256i over = _mm256_cmpeq_epi32(_mm256_and_si256(t, expmask), expmask);
        t = _mm256_blendv_epi8(t, u, over);
        /* infinity and NaN: rounded to nearest as f32_to_bf16 does (NaN quiet) */
        __m256i special = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), maxfin);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i rne = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), expmask);
        rne = _mm256_blendv_epi8(rne, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), isnan);
        __m256i res = _mm256_srli_epi32(_mm256_blendv_epi8(t, rne, special), 16);
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(res, res), 0x08);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
    }
    narrow_scalar(dst + i, src + i, lo + (uint32_t)i, key, len - i);
}

static ZT_TARGET_AVX512 void widen_avx512(float *dst, const uint16_t *src, size_t len)
{
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
    }
    widen_scalar(dst + i, src + i, len - i);
}

/* narrow_scalar's bits, 16 lanes at a time. */
static ZT_TARGET_AVX512 void narrow_avx512(uint16_t *dst, const float *src, uint32_t lo, uint32_t key, size_t len)
{
    __m512i weyl = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                                         13, 14, 15),
                                                       _mm512_set1_epi32((int)ZT_ADAM_WEYL)),
                                    _mm512_set1_epi32((int)(lo * ZT_ADAM_WEYL + key)));
    const __m512i step16 = _mm512_set1_epi32((int)(16u * ZT_ADAM_WEYL));
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), expmask = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512i r16 = _mm512_srli_epi32(weyl, 16);
        weyl = _mm512_add_epi32(weyl, step16);
        __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
        __m512i t = _mm512_add_epi32(u, r16);
        __mmask16 over = _mm512_cmpeq_epi32_mask(_mm512_and_si512(t, expmask), expmask);
        t = _mm512_mask_blend_epi32(over, t, u);
        __m512i absu = _mm512_and_si512(u, absmask);
        __mmask16 special = _mm512_cmpge_epu32_mask(absu, expmask);
        __mmask16 isnan = _mm512_cmpgt_epu32_mask(absu, expmask);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i rne = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
        rne = _mm512_mask_blend_epi32(isnan, rne, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
        __m512i res = _mm512_srli_epi32(_mm512_mask_blend_epi32(special, t, rne), 16);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(res));
    }
    narrow_scalar(dst + i, src + i, lo + (uint32_t)i, key, len - i);
}
#endif

/* One chunk with bf16 moments: widen m and v, the fp32 update of `fn` on the chunk, narrow them back. The
 * conversions use the update's instruction set (AVX-512 or AVX2); they give the scalar bits everywhere. */
static void adam_chunk_bf16_moments(enum zt_cpu_adam_isa isa, adam_chunk_fn fn, const zt_cpu_adam_range *r,
                                    const adam_consts *c, size_t begin, size_t end)
{
    float mt[ZT_ADAM_CHUNK], vt[ZT_ADAM_CHUNK];
    uint16_t *m16 = (uint16_t *)r->m + begin, *v16 = (uint16_t *)r->v + begin;
    /* a two-slot update widens the old moments from their source and narrows the new ones into m and v */
    const uint16_t *m16_src = (const uint16_t *)(r->m_src ? r->m_src : r->m) + begin;
    const uint16_t *v16_src = (const uint16_t *)(r->v_src ? r->v_src : r->v) + begin;
    const size_t len = end - begin;
    void (*widen)(float *, const uint16_t *, size_t) = widen_scalar;
    void (*narrow)(uint16_t *, const float *, uint32_t, uint32_t, size_t) = narrow_scalar;
#ifdef ZT_ADAM_X86
    if (isa >= ZT_CPU_ADAM_ISA_AVX512) {
        widen = widen_avx512;
        narrow = narrow_avx512;
    } else if (isa >= ZT_CPU_ADAM_ISA_AVX2) {
        widen = widen_avx2;
        narrow = narrow_avx2;
    }
#else
    (void)isa;
#endif
    widen(mt, m16_src, len);
    widen(vt, v16_src, len);
    zt_cpu_adam_range sub = *r;
    sub.param = r->param + begin;
    sub.param_src = r->param_src ? r->param_src + begin : NULL;
    sub.m = mt;
    sub.v = vt;
    sub.m_src = sub.v_src = NULL; /* mt and vt hold the old moments and receive the new ones */
    sub.grad = (const char *)r->grad + begin * zt_dtype_size(r->grad_dtype);
    sub.out = r->out ? (char *)r->out + begin * zt_dtype_size(r->out_dtype) : NULL;
    sub.n = len;
    sub.moment_dtype = ZT_DTYPE_F32;
    fn(&sub, c, 0, len);
    /* in runs of indices that share their high 32 bits (one key each) */
    for (size_t i = 0; i < len;) {
        const uint64_t idx = r->index_base + begin + i;
        const uint32_t hi = (uint32_t)(idx >> 32), lo = (uint32_t)idx;
        const uint64_t left = ((uint64_t)1 << 32) - lo; /* indices before the high bits change */
        const size_t run = left < len - i ? (size_t)left : len - i;
        narrow(m16 + i, mt + i, lo, sr_key(r->seed, hi, 0), run);
        narrow(v16 + i, vt + i, lo, sr_key(r->seed, hi, 1), run);
        i += run;
    }
}

static int dtype_ok(enum zt_dtype dt)
{
    return dt == ZT_DTYPE_F32 || dt == ZT_DTYPE_F16 || dt == ZT_DTYPE_BF16;
}

static int check_range(const zt_cpu_adam_range *r, const zt_adamw_params *p, zt_err *err)
{
    if (!r || !p)
        return zt_fail(err, ZT_EINVAL_CONFIG, "cpu adam: range and parameters must not be NULL");
    if (p->step < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "cpu adam: step is %d; steps count from 1", p->step);
    if (!dtype_ok(r->grad_dtype))
        return zt_fail(err, ZT_EUNSUPPORTED, "cpu adam: gradient dtype %s is not supported; use F32, F16 or BF16",
                       zt_dtype_name(r->grad_dtype));
    if (r->out && !dtype_ok(r->out_dtype))
        return zt_fail(err, ZT_EUNSUPPORTED, "cpu adam: output dtype %s is not supported; use F32, F16 or BF16",
                       zt_dtype_name(r->out_dtype));
    if (r->moment_dtype != ZT_DTYPE_F32 && r->moment_dtype != ZT_DTYPE_BF16)
        return zt_fail(err, ZT_EUNSUPPORTED, "cpu adam: moment dtype %s is not supported; use F32 or BF16",
                       zt_dtype_name(r->moment_dtype));
    if (r->n > 0 && (!r->param || !r->m || !r->v || !r->grad))
        return zt_fail(err, ZT_EINVAL_CONFIG, "cpu adam: param, m, v and grad must not be NULL for n = %zu", r->n);
    if (!r->param_src != !r->m_src || !r->param_src != !r->v_src)
        return zt_fail(err, ZT_EINVAL_CONFIG, "cpu adam: param_src, m_src and v_src are set together or not at all");
    return 0;
}

/* Applies one AdamW step with an explicit instruction set; see offload/cpu_adam.h. */
int zt_cpu_adam_update_isa(enum zt_cpu_adam_isa isa, const zt_cpu_adam_range *r, const zt_adamw_params *p,
                           int threads, zt_err *err)
{
    int rc = check_range(r, p, err);
    if (rc)
        return rc;
    if (!zt_cpu_adam_isa_supported(isa))
        return zt_fail(err, ZT_EUNSUPPORTED, "cpu adam: this CPU cannot run the %s path; use %s",
                       zt_cpu_adam_isa_name(isa), zt_cpu_adam_isa_name(zt_cpu_adam_get_isa()));
    adam_chunk_fn fn = adam_chunk_scalar;
#ifdef ZT_ADAM_X86
    if (isa == ZT_CPU_ADAM_ISA_AVX512)
        fn = adam_chunk_avx512;
    else if (isa == ZT_CPU_ADAM_ISA_AVX2)
        fn = adam_chunk_avx2;
#endif
    /* Constants exactly as kernels/cpu/adamw.c computes them. */
    adam_consts c;
    c.beta1 = p->beta1;
    c.beta2 = p->beta2;
    c.one_minus_beta1 = 1.0f - p->beta1;
    c.one_minus_beta2 = 1.0f - p->beta2;
    c.bc1 = (float)(1.0 - pow((double)p->beta1, (double)p->step));
    c.bc2 = (float)(1.0 - pow((double)p->beta2, (double)p->step));
    c.lr = p->lr;
    c.eps = p->eps;
    c.wd = p->weight_decay;
    c.gs = p->grad_scale;

    size_t n = r->n;
    size_t chunks = (n + ZT_ADAM_CHUNK - 1) / ZT_ADAM_CHUNK;
    if (threads <= 0)
        threads = zt_cpu_get_threads();
    if ((size_t)threads > chunks)
        threads = chunks > 0 ? (int)chunks : 1;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (size_t k = 0; k < chunks; k++) {
        size_t begin = k * ZT_ADAM_CHUNK;
        size_t end = begin + ZT_ADAM_CHUNK < n ? begin + ZT_ADAM_CHUNK : n;
        if (r->moment_dtype == ZT_DTYPE_BF16)
            adam_chunk_bf16_moments(isa, fn, r, &c, begin, end);
        else
            fn(r, &c, begin, end);
    }
    return 0;
}

/* Applies one AdamW step on the instruction set zt_cpu_adam_get_isa() picks; see offload/cpu_adam.h. */
int zt_cpu_adam_update(const zt_cpu_adam_range *r, const zt_adamw_params *p, int threads, zt_err *err)
{
    return zt_cpu_adam_update_isa(zt_cpu_adam_get_isa(), r, p, threads, err);
}

/* ---- plain conversion of fp32 values ---- */

#ifdef ZT_ADAM_X86
/* Converts src[begin, end) to dt with AVX2+F16C. */
static ZT_TARGET_AVX2 void convert_avx2(void *dst, enum zt_dtype dt, const float *src, size_t begin,
                                              size_t end)
{
    size_t i = begin;
    for (; i + 8 <= end; i += 8)
        avx2_store_out(dst, dt, i, _mm256_loadu_ps(src + i));
    for (; i < end; i++)
        store_out1(dst, dt, i, src[i]);
}
#endif


static void convert_chunk(void *dst, enum zt_dtype dt, const float *src, size_t begin, size_t end)
{
    size_t i = begin;
#ifdef ZT_ADAM_X86
    /* The vector conversions give the scalar ones' bits; use them where the CPU has them. */
    if (dt != ZT_DTYPE_F32 && zt_cpu_adam_get_isa() >= ZT_CPU_ADAM_ISA_AVX2) {
        convert_avx2(dst, dt, src, begin, end);
        return;
    }
#endif
    for (; i < end; i++)
        store_out1(dst, dt, i, src[i]);
}

/* Widens src[begin, end) of dt to fp32 (the bf16 chunk path's conversions for bf16). */
static void widen_chunk(float *dst, const void *src, enum zt_dtype dt, size_t begin, size_t end)
{
    if (dt == ZT_DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)src + begin;
#ifdef ZT_ADAM_X86
        const enum zt_cpu_adam_isa isa = zt_cpu_adam_get_isa();
        if (isa >= ZT_CPU_ADAM_ISA_AVX512) {
            widen_avx512(dst + begin, h, end - begin);
            return;
        }
        if (isa >= ZT_CPU_ADAM_ISA_AVX2) {
            widen_avx2(dst + begin, h, end - begin);
            return;
        }
#endif
        widen_scalar(dst + begin, h, end - begin);
        return;
    }
    for (size_t i = begin; i < end; i++)
        dst[i] = load_grad1(src, dt, i);
}

/* Converts n values between fp32 and dt in chunks over `threads` threads: to dt (narrow: src fp32) or from
 * it (widen: dst fp32). */
static void convert_chunks(void *dst, const void *src, enum zt_dtype dt, bool narrow, size_t n, int threads)
{
    size_t chunks = (n + ZT_ADAM_CHUNK - 1) / ZT_ADAM_CHUNK;
    if (threads <= 0)
        threads = zt_cpu_get_threads();
    if ((size_t)threads > chunks)
        threads = (int)chunks;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (size_t k = 0; k < chunks; k++) {
        size_t begin = k * ZT_ADAM_CHUNK;
        size_t end = begin + ZT_ADAM_CHUNK < n ? begin + ZT_ADAM_CHUNK : n;
        if (narrow)
            convert_chunk(dst, dt, (const float *)src, begin, end);
        else
            widen_chunk((float *)dst, src, dt, begin, end);
    }
}

/* Converts n fp32 values to dst_dtype; see offload/cpu_adam.h. */
int zt_cpu_adam_convert(void *dst, enum zt_dtype dst_dtype, const float *src, size_t n, int threads, zt_err *err)
{
    if (!dtype_ok(dst_dtype))
        return zt_fail(err, ZT_EUNSUPPORTED, "cpu adam: output dtype %s is not supported; use F32, F16 or BF16",
                       zt_dtype_name(dst_dtype));
    if (dst_dtype == ZT_DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (n > 0)
        convert_chunks(dst, src, dst_dtype, true, n, threads);
    return 0;
}

/* Adds src into dst; see offload/cpu_adam.h. */
void zt_cpu_adam_accumulate(float *dst, const float *src, size_t n, int threads)
{
    size_t chunks = (n + ZT_ADAM_CHUNK - 1) / ZT_ADAM_CHUNK;
    if (threads <= 0)
        threads = zt_cpu_get_threads();
    if ((size_t)threads > chunks)
        threads = (int)chunks;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (size_t k = 0; k < chunks; k++) {
        size_t begin = k * ZT_ADAM_CHUNK;
        size_t end = begin + ZT_ADAM_CHUNK < n ? begin + ZT_ADAM_CHUNK : n;
        for (size_t i = begin; i < end; i++)
            dst[i] += src[i];
    }
}

/* Widens n values to fp32; see offload/cpu_adam.h. */
int zt_cpu_adam_widen(float *dst, const void *src, enum zt_dtype src_dtype, size_t n, int threads, zt_err *err)
{
    if (!dtype_ok(src_dtype))
        return zt_fail(err, ZT_EUNSUPPORTED, "cpu adam: input dtype %s is not supported; use F32, F16 or BF16",
                       zt_dtype_name(src_dtype));
    if (src_dtype == ZT_DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (n > 0)
        convert_chunks(dst, src, src_dtype, false, n, threads);
    return 0;
}
