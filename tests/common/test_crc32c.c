/* Tests of common/crc32c: known vectors (RFC 3720 and the usual check value) on both the SSE4.2 and the
 * table implementation, chaining, and agreement of the two on random lengths and alignments. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/crc32c.h"
#include "common/rng.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void check_vectors(crc_fn crc)
{
    unsigned char buf[32];
    assert_int_equal(crc(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(crc(0, "", 0), 0u);
    assert_int_equal(crc(0, "a", 1), 0xC1D04330u);
    memset(buf, 0, sizeof(buf));
    assert_int_equal(crc(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xFF, sizeof(buf));
    assert_int_equal(crc(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    assert_int_equal(crc(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    assert_int_equal(crc(0, buf, 32), 0x113FDB5Cu);
}

static void test_vectors_table(void **state)
{
    (void)state;
    check_vectors(zt__crc32c_table);
}

static void test_vectors_hw(void **state)
{
    (void)state;
    if (!zt__crc32c_has_hw())
        skip();
    check_vectors(zt__crc32c_hw);
}

static void test_vectors_dispatch(void **state)
{
    (void)state;
    check_vectors(zt_crc32c);
}

/* crc(a || b) == crc(crc(a), b) for every split point. */
static void test_chaining(void **state)
{
    (void)state;
    const char *text = "The quick brown fox jumps over the lazy dog, twice over.";
    size_t n = strlen(text);
    uint32_t whole = zt_crc32c(0, text, n);
    for (size_t k = 0; k <= n; k++) {
        assert_int_equal(zt_crc32c(zt_crc32c(0, text, k), text + k, n - k), whole);
        assert_int_equal(zt__crc32c_table(zt__crc32c_table(0, text, k), text + k, n - k), whole);
    }
}

static void test_hw_matches_table(void **state)
{
    (void)state;
    if (!zt__crc32c_has_hw())
        skip();
    static unsigned char buf[4096 + 64];
    zt_rng rng;
    zt_rng_seed(&rng, 1234);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)zt_rng_u64(&rng);
    for (int trial = 0; trial < 2000; trial++) {
        size_t off = (size_t)zt_rng_below(&rng, 16);
        size_t len = (size_t)zt_rng_below(&rng, 4096);
        uint32_t seed = trial % 3 == 0 ? 0 : (uint32_t)zt_rng_u64(&rng);
        assert_int_equal(zt__crc32c_hw(seed, buf + off, len), zt__crc32c_table(seed, buf + off, len));
    }
}

/* A single flipped bit anywhere changes the checksum. */
static void test_detects_bit_flips(void **state)
{
    (void)state;
    unsigned char buf[257];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i * 7);
    uint32_t ref = zt_crc32c(0, buf, sizeof(buf));
    for (size_t bit = 0; bit < sizeof(buf) * 8; bit++) {
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_int_not_equal(zt_crc32c(0, buf, sizeof(buf)), ref);
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_table),    cmocka_unit_test(test_vectors_hw),
        cmocka_unit_test(test_vectors_dispatch), cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_hw_matches_table), cmocka_unit_test(test_detects_bit_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
