/* Tests of common/units: size and duration parsing (every unit, decimals, spaces, each error message)
 * and their printed forms. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/units.h"

static void expect_size(const char *text, uint64_t want)
{
    zt_err err = {{0}};
    uint64_t got = 12345;
    int rc = zt_parse_size(text, &got, &err);
    if (rc != 0)
        fail_msg("zt_parse_size('%s') failed: %s", text, err.msg);
    if (got != want)
        fail_msg("zt_parse_size('%s') = %llu, want %llu", text, (unsigned long long)got, (unsigned long long)want);
}

static void expect_size_error(const char *text, const char *message)
{
    zt_err err = {{0}};
    uint64_t got = 777;
    int rc = zt_parse_size(text, &got, &err);
    assert_int_equal(rc, ZT_EINVAL_CONFIG);
    assert_int_equal(got, 777); /* untouched on error */
    if (strcmp(err.msg, message) != 0)
        fail_msg("zt_parse_size('%s'): message '%s', want '%s'", text, err.msg, message);
}

static void test_parse_size_units(void **state)
{
    (void)state;
    expect_size("0", 0);
    expect_size("4096", 4096);
    expect_size("4096B", 4096);
    expect_size("1K", 1000);
    expect_size("1KB", 1000);
    expect_size("1KiB", 1024);
    expect_size("1kib", 1024);
    expect_size("2M", 2000000);
    expect_size("2MB", 2000000);
    expect_size("2MiB", 2ull << 20);
    expect_size("3G", 3000000000ull);
    expect_size("3gb", 3000000000ull);
    expect_size("3GiB", 3ull << 30);
    expect_size("4T", 4000000000000ull);
    expect_size("4TB", 4000000000000ull);
    expect_size("4TiB", 4ull << 40);
    expect_size("10 GiB", 10ull << 30);
    expect_size("  512MB  ", 512000000ull);
    expect_size("1.5GiB", 1610612736ull);
    expect_size("1.5 KiB", 1536);
    expect_size(".5KiB", 512);
    expect_size("2.KiB", 2048);
    expect_size("0.001KB", 1);
    expect_size("1.3GiB", 1395864371ull); /* 1395864371.2 rounds to the nearest byte */
    expect_size("18446744073709551615", UINT64_MAX);
    expect_size("16777215TiB", 16777215ull << 40);
}

static void test_parse_size_errors(void **state)
{
    (void)state;
    expect_size_error("12XB", "size '12XB': unknown unit 'XB' (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)");
    expect_size_error("5 PiB", "size '5 PiB': unknown unit 'PiB' (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)");
    expect_size_error("1.2.3", "size '1.2.3': unknown unit '.3' (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)");
    expect_size_error("", "size '': empty (expected a number with an optional unit, e.g. 512MiB)");
    expect_size_error("   ", "size '   ': empty (expected a number with an optional unit, e.g. 512MiB)");
    expect_size_error("-1GB", "size '-1GB': must not be negative");
    expect_size_error("GiB", "size 'GiB': expected a number with an optional unit, e.g. 512MiB");
    expect_size_error(".", "size '.': expected a number with an optional unit, e.g. 512MiB");
    expect_size_error("18446744073709551616",
                      "size '18446744073709551616': too large (at most 16 EiB, 18446744073709551615 bytes)");
    expect_size_error("16777216TiB", "size '16777216TiB': too large (at most 16 EiB, 18446744073709551615 bytes)");
    expect_size_error("99999999999999999999999999",
                      "size '99999999999999999999999999': too large (at most 16 EiB, 18446744073709551615 bytes)");
    zt_err err;
    uint64_t v;
    assert_int_equal(zt_parse_size(NULL, &v, &err), ZT_EINVAL_CONFIG);
}

static void expect_duration(const char *text, double want)
{
    zt_err err = {{0}};
    double got = -1;
    int rc = zt_parse_duration(text, &got, &err);
    if (rc != 0)
        fail_msg("zt_parse_duration('%s') failed: %s", text, err.msg);
    if (got != want)
        fail_msg("zt_parse_duration('%s') = %.17g, want %.17g", text, got, want);
}

static void expect_duration_error(const char *text, const char *message)
{
    zt_err err = {{0}};
    double got = 5;
    assert_int_equal(zt_parse_duration(text, &got, &err), ZT_EINVAL_CONFIG);
    assert_true(got == 5);
    if (strcmp(err.msg, message) != 0)
        fail_msg("zt_parse_duration('%s'): message '%s', want '%s'", text, err.msg, message);
}

static void test_parse_duration(void **state)
{
    (void)state;
    expect_duration("30", 30);
    expect_duration("90s", 90);
    expect_duration("250ms", 0.25);
    expect_duration("5m", 300);
    expect_duration("1.5h", 5400);
    expect_duration("2 H", 7200);
    expect_duration("0", 0);
    expect_duration_error("5x", "duration '5x': unknown unit 'x' (use ms, s, m or h)");
    expect_duration_error("5min", "duration '5min': unknown unit 'min' (use ms, s, m or h)");
    expect_duration_error("", "duration '': empty (expected a number with an optional unit, e.g. 90s or 5m)");
    expect_duration_error("-3s", "duration '-3s': must not be negative");
    expect_duration_error("h", "duration 'h': expected a number with an optional unit, e.g. 90s or 5m");
    expect_duration_error("inf", "duration 'inf': expected a number with an optional unit, e.g. 90s or 5m");
}

static void expect_format_size(uint64_t bytes, const char *want)
{
    char buf[32];
    assert_ptr_equal(zt_format_size(bytes, buf, sizeof(buf)), buf);
    if (strcmp(buf, want) != 0)
        fail_msg("zt_format_size(%llu) = '%s', want '%s'", (unsigned long long)bytes, buf, want);
}

static void test_format_size(void **state)
{
    (void)state;
    expect_format_size(0, "0 B");
    expect_format_size(1023, "1023 B");
    expect_format_size(1024, "1.00 KiB");
    expect_format_size(1536, "1.50 KiB");
    expect_format_size(10 * 1024 - 1, "10.0 KiB");
    expect_format_size(123 * 1024, "123 KiB");
    expect_format_size(3ull << 29, "1.50 GiB");
    expect_format_size(11ull << 30, "11.0 GiB");
    expect_format_size(5ull << 40, "5.00 TiB");
    expect_format_size(UINT64_MAX, "16.0 EiB");
    char small[5];
    zt_format_size(3ull << 29, small, sizeof(small)); /* cut, still terminated */
    assert_int_equal(strlen(small), 4);
}

static void expect_format_duration(double s, const char *want)
{
    char buf[32];
    assert_ptr_equal(zt_format_duration(s, buf, sizeof(buf)), buf);
    if (strcmp(buf, want) != 0)
        fail_msg("zt_format_duration(%g) = '%s', want '%s'", s, buf, want);
}

static void test_format_duration(void **state)
{
    (void)state;
    expect_format_duration(0, "0.0s");
    expect_format_duration(12.34, "12.3s");
    expect_format_duration(59.96, "1m00s");
    expect_format_duration(245, "4m05s");
    expect_format_duration(3723, "1h02m03s");
    expect_format_duration(100 * 3600 + 59, "100h00m59s");
    expect_format_duration(-12.34, "-12.3s");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size_units), cmocka_unit_test(test_parse_size_errors),
        cmocka_unit_test(test_parse_duration),   cmocka_unit_test(test_format_size),
        cmocka_unit_test(test_format_duration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
