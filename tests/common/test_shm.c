/* Tests of common/shm: a segment created and attached again through /proc (this process plays both
 * sides), every check of the attach (nonce, size, seals, a file that is no memfd, a closed descriptor),
 * the slots (distinct, a full segment waits for one to come back) and the bounds of zt_shm_span against
 * offsets and lengths a lying peer could send. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/shm.h"

static zt_shm_t *make(int nslots, uint64_t slot_bytes)
{
    zt_err err = {{0}};
    zt_shm_t *s = NULL;
    int rc = zt_shm_create(nslots, slot_bytes, &s, &err);
    if (rc != 0)
        fail_msg("zt_shm_create(%d, %llu): %s", nslots, (unsigned long long)slot_bytes, err.msg);
    return s;
}

static void test_create_and_attach_share_memory(void **state)
{
    (void)state;
    zt_shm_t *s = make(3, 8192);
    assert_int_equal(zt_shm_size(s), ZT_SHM_HEAD_BYTES + 3 * 8192);
    assert_true(zt_shm_fd(s) >= 0);
    zt_err err = {{0}};
    zt_shm_t *a = NULL;
    assert_int_equal(zt_shm_attach(getpid(), zt_shm_fd(s), zt_shm_size(s), zt_shm_nonce(s), &a, &err), 0);
    assert_int_equal(zt_shm_fd(a), -1);
    assert_int_equal(zt_shm_nslots(a), 3);
    assert_int_equal(zt_shm_slot_bytes(a), 8192);
    assert_memory_equal(zt_shm_nonce(a), zt_shm_nonce(s), ZT_SHM_NONCE_BYTES);
    /* bytes written on one side are read on the other */
    uint64_t off = zt_shm_slot_offset(s, 2);
    assert_int_equal(off, ZT_SHM_HEAD_BYTES + 2 * 8192);
    memset(zt_shm_span(s, off, 8192), 0x5a, 8192);
    const uint8_t *seen = zt_shm_span(a, off, 8192);
    assert_non_null(seen);
    assert_int_equal(seen[0], 0x5a);
    assert_int_equal(seen[8191], 0x5a);
    /* two segments get two nonces */
    zt_shm_t *t = make(1, 4096);
    assert_memory_not_equal(zt_shm_nonce(s), zt_shm_nonce(t), ZT_SHM_NONCE_BYTES);
    zt_shm_destroy(t);
    zt_shm_destroy(a);
    zt_shm_destroy(s);
    zt_shm_destroy(NULL);
}

static void test_attach_checks(void **state)
{
    (void)state;
    zt_shm_t *s = make(2, 4096);
    zt_err err = {{0}};
    zt_shm_t *a = NULL;
    uint8_t other[ZT_SHM_NONCE_BYTES];
    memcpy(other, zt_shm_nonce(s), sizeof(other));
    other[5] ^= 1;
    /* another nonce: what a server on another host sees at the same pid and descriptor */
    assert_int_equal(zt_shm_attach(getpid(), zt_shm_fd(s), zt_shm_size(s), other, &a, &err), ZT_EMISMATCH);
    assert_null(a);
    assert_non_null(strstr(err.msg, "nonce"));
    /* another size than the file has */
    assert_int_equal(zt_shm_attach(getpid(), zt_shm_fd(s), zt_shm_size(s) + 4096, zt_shm_nonce(s), &a, &err),
                     ZT_EINVAL_CONFIG);
    assert_int_equal(zt_shm_attach(getpid(), zt_shm_fd(s), 0, zt_shm_nonce(s), &a, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_shm_attach(getpid(), zt_shm_fd(s), UINT64_MAX, zt_shm_nonce(s), &a, &err), ZT_EINVAL_CONFIG);
    /* no such descriptor, no such process, nonsense numbers */
    assert_int_equal(zt_shm_attach(getpid(), 1000000, zt_shm_size(s), zt_shm_nonce(s), &a, &err), -ENOENT);
    assert_true(zt_shm_attach(0, zt_shm_fd(s), zt_shm_size(s), zt_shm_nonce(s), &a, &err) < 0);
    assert_true(zt_shm_attach(getpid(), -1, zt_shm_size(s), zt_shm_nonce(s), &a, &err) < 0);
    /* a memfd that is not sealed: it could shrink under the server */
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)zt_shm_size(s)), 0);
    assert_int_equal(zt_shm_attach(getpid(), fd, zt_shm_size(s), zt_shm_nonce(s), &a, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "sealed"));
    close(fd);
    /* a plain file is no memfd */
    char path[] = "/tmp/zt-shm-test-XXXXXX";
    fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(ftruncate(fd, (off_t)zt_shm_size(s)), 0);
    assert_int_equal(zt_shm_attach(getpid(), fd, zt_shm_size(s), zt_shm_nonce(s), &a, &err), ZT_EINVAL_CONFIG);
    close(fd);
    /* the size is sealed: the creator cannot shrink it any more */
    assert_int_not_equal(ftruncate(zt_shm_fd(s), 4096), 0);
    assert_null(a);
    zt_shm_destroy(s);
}

static void test_create_bounds(void **state)
{
    (void)state;
    zt_err err = {{0}};
    zt_shm_t *s = NULL;
    assert_int_equal(zt_shm_create(0, 4096, &s, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_shm_create(ZT_SHM_MAX_SLOTS + 1, 4096, &s, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_shm_create(1, 100, &s, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_shm_create(1, 0, &s, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_shm_create(64, ZT_SHM_MAX_BYTES / 32, &s, &err), ZT_EINVAL_CONFIG);
    assert_null(s);
}

static void test_span_bounds(void **state)
{
    (void)state;
    zt_shm_t *s = make(2, 4096);
    const uint64_t size = zt_shm_size(s);
    assert_non_null(zt_shm_span(s, ZT_SHM_HEAD_BYTES, 2 * 4096)); /* the whole data area */
    assert_non_null(zt_shm_span(s, size, 0));                      /* empty at the end */
    assert_non_null(zt_shm_span(s, size - 1, 1));
    assert_null(zt_shm_span(s, 0, 16));                            /* the head is not data */
    assert_null(zt_shm_span(s, ZT_SHM_HEAD_BYTES - 1, 1));
    assert_null(zt_shm_span(s, size - 1, 2));                      /* past the end */
    assert_null(zt_shm_span(s, size + 1, 0));
    assert_null(zt_shm_span(s, ZT_SHM_HEAD_BYTES, UINT64_MAX));    /* off + len wraps */
    assert_null(zt_shm_span(s, UINT64_MAX, 1));
    assert_null(zt_shm_span(s, UINT64_MAX - 4095, 8192));
    zt_shm_destroy(s);
}

struct holder {
    zt_shm_t *s;
    int slot;
    int got;
};

static void *take_one(void *arg)
{
    struct holder *h = arg;
    h->got = zt_shm_slot_get(h->s); /* waits: every slot is taken */
    return NULL;
}

static void test_slots(void **state)
{
    (void)state;
    zt_shm_t *s = make(3, 4096);
    int a = zt_shm_slot_get(s), b = zt_shm_slot_get(s), c = zt_shm_slot_get(s);
    assert_true(a != b && b != c && a != c);
    assert_true(a >= 0 && a < 3 && b >= 0 && b < 3 && c >= 0 && c < 3);
    struct holder h = {.s = s, .got = -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, take_one, &h), 0);
    zt_shm_slot_put(s, b); /* the waiting thread gets this one */
    pthread_join(th, NULL);
    assert_int_equal(h.got, b);
    zt_shm_slot_put(s, a);
    zt_shm_slot_put(s, c);
    zt_shm_slot_put(s, h.got);
    /* 64 slots: the mask's last bit */
    zt_shm_t *big = make(64, 4096);
    int seen[64] = {0};
    for (int i = 0; i < 64; i++)
        seen[zt_shm_slot_get(big)]++;
    for (int i = 0; i < 64; i++)
        assert_int_equal(seen[i], 1);
    zt_shm_destroy(big);
    zt_shm_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_attach_share_memory),
        cmocka_unit_test(test_attach_checks),
        cmocka_unit_test(test_create_bounds),
        cmocka_unit_test(test_span_bounds),
        cmocka_unit_test(test_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
