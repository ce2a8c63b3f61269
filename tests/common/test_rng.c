/* Tests of common/rng: the published xoshiro256** and splitmix64 sequences, determinism, state
 * save/restore, and the ranges and rough distributions of below, uniform, normal and shuffle. Every
 * statistical check uses a fixed seed, so it gives the same answer on every run. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/rng.h"

/* The reference sequence of xoshiro256** from state {1, 2, 3, 4}. */
static void test_xoshiro_reference(void **state)
{
    (void)state;
    zt_rng r = {{1, 2, 3, 4}};
    assert_true(zt_rng_u64(&r) == 11520ULL);
    assert_true(zt_rng_u64(&r) == 0ULL);
    assert_true(zt_rng_u64(&r) == 1509978240ULL);
    assert_true(zt_rng_u64(&r) == 1215971899390074240ULL);
}

/* Seeding is splitmix64 from the seed: its first output for seed 0 is the published 0xe220a8397b1dcdaf. */
static void test_seeding(void **state)
{
    (void)state;
    zt_rng r;
    zt_rng_seed(&r, 0);
    assert_true(r.s[0] == 0xe220a8397b1dcdafULL);
    assert_true(r.s[1] == 0x6e789e6aa1b965f4ULL);
    assert_true(r.s[2] == 0x06c45d188009454fULL);
    assert_true(r.s[3] == 0xf88bb8a8724c81ecULL);
    assert_true(zt_rng_u64(&r) == 0x99ec5f36cb75f2b4ULL);
    zt_rng_seed(&r, 42);
    assert_true(zt_rng_u64(&r) == 0x15780b2e0c2ec716ULL);
    assert_true(zt_rng_u64(&r) == 0x6104d9866d113a7eULL);
    assert_true(zt_rng_u64(&r) == 0xae17533239e499a1ULL);
}

static void test_state_restores_stream(void **state)
{
    (void)state;
    zt_rng a, b;
    zt_rng_seed(&a, 7);
    for (int i = 0; i < 100; i++)
        zt_rng_u64(&a);
    memcpy(&b, &a, sizeof(a)); /* what a checkpoint saves and loads */
    for (int i = 0; i < 1000; i++) {
        assert_true(zt_rng_u64(&a) == zt_rng_u64(&b));
        assert_true(zt_rng_normal(&a) == zt_rng_normal(&b));
    }
    zt_rng c;
    zt_rng_seed(&c, 8);
    zt_rng_seed(&a, 7);
    assert_true(zt_rng_u64(&a) != zt_rng_u64(&c));
}

static void test_below(void **state)
{
    (void)state;
    zt_rng r;
    zt_rng_seed(&r, 3);
    for (int i = 0; i < 1000; i++)
        assert_true(zt_rng_below(&r, 1) == 0);
    const uint64_t n = 10;
    const int draws = 100000;
    int counts[10] = {0};
    for (int i = 0; i < draws; i++) {
        uint64_t v = zt_rng_below(&r, n);
        assert_true(v < n);
        counts[v]++;
    }
    /* Chi-square with 9 degrees of freedom; 27.9 is its 0.999 quantile. */
    double chi2 = 0, expect = (double)draws / (double)n;
    for (uint64_t k = 0; k < n; k++)
        chi2 += (counts[k] - expect) * (counts[k] - expect) / expect;
    assert_true(chi2 < 27.9);
    uint64_t big = (1ULL << 63) + 12345;
    for (int i = 0; i < 1000; i++)
        assert_true(zt_rng_below(&r, big) < big);
}

static void test_uniform_and_normal(void **state)
{
    (void)state;
    zt_rng r;
    zt_rng_seed(&r, 11);
    const int n = 200000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; i++) {
        double u = zt_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
    }
    assert_true(fabs(sum / n - 0.5) < 0.005);

    sum = 0;
    int beyond3 = 0;
    for (int i = 0; i < n; i++) {
        double z = zt_rng_normal(&r);
        assert_true(isfinite(z));
        sum += z;
        sum2 += z * z;
        beyond3 += fabs(z) > 3.0;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    assert_true(fabs(mean) < 0.01);
    assert_true(fabs(var - 1.0) < 0.02);
    /* P(|z| > 3) = 0.0027: about 540 of 200000. */
    assert_true(beyond3 > 400 && beyond3 < 700);
}

static void test_shuffle(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint64_t a[N], b[N];
    for (uint64_t i = 0; i < N; i++)
        a[i] = b[i] = i;
    zt_rng r1, r2;
    zt_rng_seed(&r1, 5);
    zt_rng_seed(&r2, 5);
    zt_rng_shuffle_u64(&r1, a, N);
    zt_rng_shuffle_u64(&r2, b, N);
    assert_memory_equal(a, b, sizeof(a)); /* same seed, same order */
    int seen[N] = {0}, fixed = 0;
    for (uint64_t i = 0; i < N; i++) {
        assert_true(a[i] < N);
        seen[a[i]]++;
        fixed += a[i] == i;
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    assert_true(fixed < 10); /* a random permutation has about one fixed point */
    zt_rng_shuffle_u64(&r1, a, 0);
    zt_rng_shuffle_u64(&r1, a, 1);

    /* Every permutation of 3 elements appears, about equally often. */
    int perm_counts[6] = {0};
    for (int t = 0; t < 60000; t++) {
        uint64_t p[3] = {0, 1, 2};
        zt_rng_shuffle_u64(&r1, p, 3);
        perm_counts[p[0] * 2 + (p[1] > p[2] ? 1 : 0)]++;
    }
    for (int k = 0; k < 6; k++)
        assert_true(perm_counts[k] > 9500 && perm_counts[k] < 10500);
}

/* A jump of n equals n draws, for n around the word and power-of-two boundaries and beyond; jumps compose. */
static void test_jump(void **state)
{
    (void)state;
    const uint64_t ns[] = {0, 1, 2, 3, 63, 64, 65, 255, 256, 1000, 65537, 1234567};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        zt_rng a, b;
        zt_rng_seed(&a, 1337 + i);
        b = a;
        for (uint64_t k = 0; k < ns[i]; k++)
            (void)zt_rng_u64(&a);
        zt_rng_jump(&b, ns[i]);
        assert_memory_equal(a.s, b.s, sizeof a.s);
        assert_true(zt_rng_u64(&a) == zt_rng_u64(&b));
    }
    zt_rng a, b;
    zt_rng_seed(&a, 9);
    b = a;
    zt_rng_jump(&a, 1ULL << 40);
    zt_rng_jump(&a, 12345);
    zt_rng_jump(&b, (1ULL << 40) + 12345);
    assert_memory_equal(a.s, b.s, sizeof a.s);
    zt_rng_jump(&b, UINT64_MAX); /* every power once */
    assert_true(b.s[0] | b.s[1] | b.s[2] | b.s[3]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xoshiro_reference), cmocka_unit_test(test_seeding),
        cmocka_unit_test(test_state_restores_stream), cmocka_unit_test(test_below),
        cmocka_unit_test(test_uniform_and_normal), cmocka_unit_test(test_shuffle),
        cmocka_unit_test(test_jump),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
