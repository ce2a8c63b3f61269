/* Tests of the learning-rate schedules (worker/train/schedule.h) against values computed by hand from
 * BMTrain's formulas with ztrain's min_lr floor. lr = 1e-3, min_lr = 1e-4, warmup W = 10, total E = 110
 * unless a test says otherwise, so the decay phase runs from step 10 to step 110 (100 steps). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "worker/train/schedule.h"

#define TOL 1e-12

static zt_schedule make(enum zt_schedule_kind kind)
{
    zt_schedule s = {
        .kind = kind, .lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110, .gamma = 0.9,
    };
    return s;
}

static void expect_lr(const zt_schedule *s, int64_t step, double want)
{
    double got = zt_schedule_lr(s, step);
    if (fabs(got - want) > TOL) {
        print_error("%s step %lld: lr %.17g, expected %.17g\n", zt_schedule_name(s->kind), (long long)step, got,
                    want);
        fail();
    }
}

static void test_warmup_is_linear_for_all_but_noam(void **state)
{
    (void)state;
    enum zt_schedule_kind kinds[] = {ZT_SCHEDULE_NODECAY, ZT_SCHEDULE_LINEAR, ZT_SCHEDULE_COSINE,
                                     ZT_SCHEDULE_EXPONENTIAL};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        zt_schedule s = make(kinds[i]);
        expect_lr(&s, 0, 0.0);
        expect_lr(&s, 1, 1e-4);  /* lr * 1 / 10 */
        expect_lr(&s, 5, 5e-4);
        expect_lr(&s, 9, 9e-4);
        expect_lr(&s, 10, 1e-3); /* the end of warmup is the peak */
    }
}

static void test_nodecay(void **state)
{
    (void)state;
    zt_schedule s = make(ZT_SCHEDULE_NODECAY);
    expect_lr(&s, 11, 1e-3);
    expect_lr(&s, 110, 1e-3);
    expect_lr(&s, 5000, 1e-3); /* no floor and no end */
}

static void test_noam(void **state)
{
    (void)state;
    zt_schedule s = make(ZT_SCHEDULE_NOAM);
    /* warmup: lr / sqrt(W) * t / W */
    expect_lr(&s, 5, 1e-3 / sqrt(10.0) * 0.5);
    expect_lr(&s, 1, 1e-3 / sqrt(10.0) / 10.0);
    /* decay: lr / sqrt(t), continuous at t = W, and min_lr is no floor */
    expect_lr(&s, 10, 1e-3 / sqrt(10.0));
    expect_lr(&s, 100, 1e-4);
    expect_lr(&s, 400, 5e-5);
    /* without warmup the first step gets lr / sqrt(1) */
    s.warmup_steps = 0;
    expect_lr(&s, 1, 1e-3);
    expect_lr(&s, 4, 5e-4);
}

static void test_linear(void **state)
{
    (void)state;
    zt_schedule s = make(ZT_SCHEDULE_LINEAR);
    /* min_lr + (lr - min_lr) * (E - t) / (E - W) */
    expect_lr(&s, 35, 1e-4 + 9e-4 * 0.75);
    expect_lr(&s, 60, 5.5e-4);
    expect_lr(&s, 110, 1e-4);
    expect_lr(&s, 200, 1e-4); /* held at the floor after E */
}

static void test_cosine(void **state)
{
    (void)state;
    zt_schedule s = make(ZT_SCHEDULE_COSINE);
    /* min_lr + (lr - min_lr) * (1 + cos(pi (t - W) / (E - W))) / 2 */
    expect_lr(&s, 60, 5.5e-4);                 /* halfway: cos(pi/2) = 0 */
    expect_lr(&s, 35, 1e-4 + 9e-4 * (1.0 + sqrt(0.5)) / 2.0); /* a quarter: cos(pi/4) */
    expect_lr(&s, 85, 1e-4 + 9e-4 * (1.0 - sqrt(0.5)) / 2.0); /* three quarters */
    expect_lr(&s, 110, 1e-4);
    expect_lr(&s, 111, 1e-4);
    /* BMTrain floors at 0: with min_lr 0 the formula is exactly BMTrain's */
    s.min_lr = 0.0;
    expect_lr(&s, 60, 5e-4);
    expect_lr(&s, 110, 0.0);
}

static void test_exponential(void **state)
{
    (void)state;
    zt_schedule s = make(ZT_SCHEDULE_EXPONENTIAL);
    /* max(min_lr, lr * gamma^(t - W)) */
    expect_lr(&s, 11, 9e-4);
    expect_lr(&s, 12, 8.1e-4);
    expect_lr(&s, 13, 7.29e-4);
    /* 0.9^22 = 0.0985 < 0.1: floored */
    expect_lr(&s, 31, 1e-3 * pow(0.9, 21));
    expect_lr(&s, 32, 1e-4);
    expect_lr(&s, 1000, 1e-4);
}

static void test_no_warmup_starts_at_peak(void **state)
{
    (void)state;
    zt_schedule s = make(ZT_SCHEDULE_COSINE);
    s.warmup_steps = 0;
    s.total_steps = 100;
    expect_lr(&s, 0, 1e-3);
    expect_lr(&s, 50, 5.5e-4);
    expect_lr(&s, 100, 1e-4);
}

static void test_names(void **state)
{
    (void)state;
    const char *names[] = {"nodecay", "noam", "linear", "cosine", "exponential"};
    for (int i = 0; i < 5; i++) {
        enum zt_schedule_kind k;
        zt_err err = {{0}};
        assert_int_equal(zt_schedule_parse(names[i], &k, &err), 0);
        assert_int_equal((int)k, i);
        assert_string_equal(zt_schedule_name(k), names[i]);
    }
    enum zt_schedule_kind k = ZT_SCHEDULE_NOAM;
    zt_err err = {{0}};
    assert_int_equal(zt_schedule_parse("Cosine", &k, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "'Cosine'"));
    assert_non_null(strstr(err.msg, "exponential"));
    assert_int_equal((int)k, ZT_SCHEDULE_NOAM); /* untouched on error */
    assert_true(zt_schedule_decays(ZT_SCHEDULE_COSINE));
    assert_true(zt_schedule_decays(ZT_SCHEDULE_LINEAR));
    assert_true(zt_schedule_decays(ZT_SCHEDULE_EXPONENTIAL));
    assert_false(zt_schedule_decays(ZT_SCHEDULE_NODECAY));
    assert_false(zt_schedule_decays(ZT_SCHEDULE_NOAM));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_is_linear_for_all_but_noam),
        cmocka_unit_test(test_nodecay),
        cmocka_unit_test(test_noam),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cosine),
        cmocka_unit_test(test_exponential),
        cmocka_unit_test(test_no_warmup_starts_at_peak),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
