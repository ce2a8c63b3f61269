/* Tests of common/args: flag values must be whole numbers (or finite numbers) in range, with a message
 * that names the flag, the range and the text given. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/args.h"

static void expect_int(const char *text, int64_t min, int64_t max, int64_t want)
{
    zt_err err = {{0}};
    int64_t got = -12345;
    if (zt_arg_int("--n", text, min, max, &got, &err) != 0)
        fail_msg("'%s': %s", text, err.msg);
    assert_true(got == want);
}

static void expect_int_error(const char *text, int64_t min, int64_t max, const char *message)
{
    zt_err err = {{0}};
    int64_t got = 42;
    assert_int_equal(zt_arg_int("--steps", text, min, max, &got, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(got, 42);
    if (strcmp(err.msg, message) != 0)
        fail_msg("'%s': message '%s', want '%s'", text, err.msg, message);
}

static void test_arg_int(void **state)
{
    (void)state;
    expect_int("1", 1, 10, 1);
    expect_int("10", 1, 10, 10);
    expect_int("-5", -10, 10, -5);
    expect_int("+7", 0, 10, 7);
    expect_int("007", 0, 10, 7);
    expect_int("9223372036854775807", INT64_MIN, INT64_MAX, INT64_MAX);
    expect_int("-9223372036854775808", INT64_MIN, INT64_MAX, INT64_MIN);

    expect_int_error("12x", 1, 1000000000, "--steps: expected a whole number from 1 to 1000000000, got '12x'");
    expect_int_error("0", 1, 1000000000, "--steps: expected a whole number from 1 to 1000000000, got '0'");
    expect_int_error("1000000001", 1, 1000000000,
                     "--steps: expected a whole number from 1 to 1000000000, got '1000000001'");
    expect_int_error("", 1, 5, "--steps: expected a whole number from 1 to 5, got ''");
    expect_int_error(NULL, 1, 5, "--steps: expected a whole number from 1 to 5, got ''");
    expect_int_error(" 3", 1, 5, "--steps: expected a whole number from 1 to 5, got ' 3'");
    expect_int_error("3 ", 1, 5, "--steps: expected a whole number from 1 to 5, got '3 '");
    expect_int_error("2.0", 1, 5, "--steps: expected a whole number from 1 to 5, got '2.0'");
    expect_int_error("1e3", 1, 5000, "--steps: expected a whole number from 1 to 5000, got '1e3'");
    expect_int_error("0x10", 0, 100, "--steps: expected a whole number from 0 to 100, got '0x10'");
    expect_int_error("-", 0, 100, "--steps: expected a whole number from 0 to 100, got '-'");
    expect_int_error("9223372036854775808", INT64_MIN, INT64_MAX,
                     "--steps: expected a whole number from -9223372036854775808 to 9223372036854775807, got "
                     "'9223372036854775808'");
    expect_int_error("-99999999999999999999", INT64_MIN, INT64_MAX,
                     "--steps: expected a whole number from -9223372036854775808 to 9223372036854775807, got "
                     "'-99999999999999999999'");
}

static void expect_double(const char *text, double want)
{
    zt_err err = {{0}};
    double got = -1;
    if (zt_arg_double("--lr", text, -1e9, 1e9, &got, &err) != 0)
        fail_msg("'%s': %s", text, err.msg);
    assert_true(got == want);
}

static void expect_double_error(const char *text, const char *message)
{
    zt_err err = {{0}};
    double got = 0.125;
    assert_int_equal(zt_arg_double("--lr", text, 0, 1, &got, &err), ZT_EINVAL_CONFIG);
    assert_true(got == 0.125);
    if (strcmp(err.msg, message) != 0)
        fail_msg("'%s': message '%s', want '%s'", text, err.msg, message);
}

static void test_arg_double(void **state)
{
    (void)state;
    expect_double("3e-4", 3e-4);
    expect_double("0.5", 0.5);
    expect_double(".5", 0.5);
    expect_double("-2", -2);
    expect_double("1E3", 1000);
    expect_double("1e-400", 0); /* underflow to zero is a usable value */

    expect_double_error("1.5", "--lr: expected a number from 0 to 1, got '1.5'");
    expect_double_error("-0.1", "--lr: expected a number from 0 to 1, got '-0.1'");
    expect_double_error("0.1x", "--lr: expected a number from 0 to 1, got '0.1x'");
    expect_double_error("inf", "--lr: expected a number from 0 to 1, got 'inf'");
    expect_double_error("nan", "--lr: expected a number from 0 to 1, got 'nan'");
    expect_double_error("1e999", "--lr: expected a number from 0 to 1, got '1e999'");
    expect_double_error("", "--lr: expected a number from 0 to 1, got ''");
    expect_double_error(" 0.5", "--lr: expected a number from 0 to 1, got ' 0.5'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arg_int),
        cmocka_unit_test(test_arg_double),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
