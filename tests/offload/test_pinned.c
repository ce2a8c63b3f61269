/* Tests of offload/pinned.h with CPU memory (every build): buffer count, size rounding and alignment,
 * buffers that do not overlap, an exhausted pool that times out with a clear message, a waiting acquire
 * woken by a release from another thread, bad arguments, and "pinning required" refused cleanly where
 * the build or machine cannot pin. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "offload/pinned.h"

static void test_sizes_and_alignment(void **state)
{
    (void)state;
    zt_pinned_pool_t *pool = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_pinned_pool_create(1000, 3, ZT_PINNED_FLAG_CPU_ONLY, &pool, &err), 0);
    assert_int_equal(zt_pinned_pool_is_pinned(pool), 0);
    assert_int_equal(zt_pinned_pool_buffer_bytes(pool), ZT_PINNED_ALIGN);
    assert_int_equal(zt_pinned_pool_count(pool), 3);
    assert_int_equal(zt_pinned_pool_free_count(pool), 3);
    zt_pinned_pool_destroy(pool);

    assert_int_equal(zt_pinned_pool_create(3 * ZT_PINNED_ALIGN, 1, ZT_PINNED_FLAG_CPU_ONLY, &pool, &err), 0);
    assert_int_equal(zt_pinned_pool_buffer_bytes(pool), 3 * ZT_PINNED_ALIGN);
    zt_pinned_pool_destroy(pool);
    zt_pinned_pool_destroy(NULL);
}

/* Every buffer is aligned, distinct, whole (a pattern written into each survives writes to the others). */
static void test_buffers_do_not_overlap(void **state)
{
    (void)state;
    enum { N = 5, BYTES = 10000 };
    zt_pinned_pool_t *pool = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_pinned_pool_create(BYTES, N, ZT_PINNED_FLAG_CPU_ONLY, &pool, &err), 0);
    size_t bb = zt_pinned_pool_buffer_bytes(pool);
    unsigned char *bufs[N];
    for (int i = 0; i < N; i++) {
        void *p = NULL;
        assert_int_equal(zt_pinned_pool_acquire(pool, 0, &p, &err), 0);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % ZT_PINNED_ALIGN, 0);
        bufs[i] = p;
        memset(bufs[i], 0x10 + i, bb);
        assert_int_equal(zt_pinned_pool_free_count(pool), N - 1 - i);
    }
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < i; j++)
            assert_ptr_not_equal(bufs[i], bufs[j]);
        for (size_t k = 0; k < bb; k++) {
            if (bufs[i][k] != 0x10 + i)
                fail_msg("buffer %d byte %zu is %d, not %d: buffers overlap", i, k, bufs[i][k], 0x10 + i);
        }
    }
    for (int i = 0; i < N; i++)
        zt_pinned_pool_release(pool, bufs[i]);
    assert_int_equal(zt_pinned_pool_free_count(pool), N);
    zt_pinned_pool_destroy(pool);
}

static void test_exhausted_pool_times_out(void **state)
{
    (void)state;
    zt_pinned_pool_t *pool = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_pinned_pool_create(4096, 2, ZT_PINNED_FLAG_CPU_ONLY, &pool, &err), 0);
    void *a = NULL, *b = NULL, *c = (void *)1;
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &a, &err), 0);
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &b, &err), 0);
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &c, &err), -ETIMEDOUT);
    assert_null(c);
    assert_non_null(strstr(err.msg, "all 2 staging buffers are still in use"));
    err.msg[0] = '\0';
    assert_int_equal(zt_pinned_pool_acquire(pool, 0.01, &c, &err), -ETIMEDOUT);
    assert_non_null(strstr(err.msg, "release buffers sooner"));
    /* A released buffer is handed out again. */
    zt_pinned_pool_release(pool, b);
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &c, &err), 0);
    assert_ptr_equal(c, b);
    zt_pinned_pool_release(pool, a);
    zt_pinned_pool_release(pool, c);
    zt_pinned_pool_destroy(pool);
}

struct waiter {
    zt_pinned_pool_t *pool;
    void *got;
    int rc;
};

static void *wait_for_buffer(void *arg)
{
    struct waiter *w = arg;
    zt_err err = {{0}};
    w->rc = zt_pinned_pool_acquire(w->pool, 60.0, &w->got, &err);
    return NULL;
}

/* An acquire on an empty pool gets the buffer another thread releases (whether it started waiting
 * before or after the release). */
static void test_release_wakes_a_waiter(void **state)
{
    (void)state;
    zt_pinned_pool_t *pool = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_pinned_pool_create(8192, 1, ZT_PINNED_FLAG_CPU_ONLY, &pool, &err), 0);
    void *mine = NULL;
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &mine, &err), 0);
    struct waiter w = {.pool = pool, .rc = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for_buffer, &w), 0);
    zt_pinned_pool_release(pool, mine);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    assert_ptr_equal(w.got, mine);
    assert_int_equal(zt_pinned_pool_free_count(pool), 0);
    zt_pinned_pool_release(pool, w.got);
    zt_pinned_pool_destroy(pool);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    zt_pinned_pool_t *pool = (zt_pinned_pool_t *)1;
    zt_err err = {{0}};
    assert_int_equal(zt_pinned_pool_create(0, 2, 0, &pool, &err), ZT_EINVAL_CONFIG);
    assert_null(pool);
    assert_non_null(strstr(err.msg, "above 0"));
    assert_int_equal(zt_pinned_pool_create(4096, 0, 0, &pool, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_pinned_pool_create(4096, 1, ZT_PINNED_FLAG_REQUIRE | ZT_PINNED_FLAG_CPU_ONLY, &pool, &err),
                     ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "pass one of the two flags"));
    assert_int_equal(zt_pinned_pool_create(SIZE_MAX / 2, 4, 0, &pool, &err), ZT_EINVAL_CONFIG);
}

/* Without REQUIRE a pool always comes up (pinned where possible); with it, either the memory is pinned
 * or the refusal says why. */
static void test_default_and_required_pinning(void **state)
{
    (void)state;
    zt_pinned_pool_t *pool = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_pinned_pool_create(1 << 16, 2, 0, &pool, &err), 0);
    void *p = NULL;
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &p, &err), 0);
    memset(p, 7, zt_pinned_pool_buffer_bytes(pool));
    zt_pinned_pool_release(pool, p);
    zt_pinned_pool_destroy(pool);

    int rc = zt_pinned_pool_create(1 << 16, 2, ZT_PINNED_FLAG_REQUIRE, &pool, &err);
    if (rc == 0) {
        assert_int_equal(zt_pinned_pool_is_pinned(pool), 1);
        zt_pinned_pool_destroy(pool);
    } else {
        assert_int_equal(rc, ZT_EUNSUPPORTED);
        assert_null(pool);
        assert_non_null(strstr(err.msg, "cannot pin"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_and_alignment),
        cmocka_unit_test(test_buffers_do_not_overlap),
        cmocka_unit_test(test_exhausted_pool_times_out),
        cmocka_unit_test(test_release_wakes_a_waiter),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_default_and_required_pinning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
