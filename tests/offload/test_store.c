/* Tests of offload/store.h: RAM and NVMe tiers hold records of random data through many asynchronous
 * reads and writes in flight at once (sizes that are not multiples of 4096, requests cut into many
 * pieces), enforce their capacity, refuse a missing or unusable directory, find their records again
 * after a reopen, and detect corrupt payloads and headers.
 *
 * The NVMe tests run in a fresh directory under $TMPDIR (or /tmp) with O_DIRECT; where that file
 * system has no O_DIRECT (tmpfs) they fall back to buffered I/O and say so. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "offload/store.h"

static uint64_t g_rng = 0x243f6a8885a308d3ull;

static uint32_t next_u32(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}

static void fill_random(float *buf, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < 3 * n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (float)(x >> 8) * 0x1p-24f - 0.5f;
    }
}

static char g_dir[512];
static int g_buffered; /* 1 where the temporary directory has no O_DIRECT */

static void make_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/zt-store-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    assert_non_null(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

static zt_store *open_nvme(size_t capacity, int qd, size_t io_size)
{
    zt_store_config cfg = {.kind = ZT_STORE_NVME, .path = g_dir, .capacity = capacity, .queue_depth = qd,
                           .io_size = io_size, .buffered = g_buffered};
    zt_store *s = NULL;
    zt_err err = {{0}};
    int rc = zt_store_open(&cfg, &s, &err);
    if (rc == ZT_EUNSUPPORTED && !g_buffered && strstr(err.msg, "O_DIRECT")) {
        print_message("%s: no O_DIRECT here; testing buffered I/O\n", g_dir);
        g_buffered = 1;
        cfg.buffered = 1;
        rc = zt_store_open(&cfg, &s, &err);
    }
    if (rc != 0)
        fail_msg("zt_store_open: %s", err.msg);
    return s;
}

static zt_store_key key_of(int i)
{
    zt_store_key k = {.run = 7, .block = (uint32_t)(i / 3), .shard = (uint32_t)(i % 3)};
    return k;
}

#define NREC 40

/* Writes NREC records of odd sizes all at once, then reads them all back while rewriting half of them
 * with new data, and checks every byte. Returns with the store holding generation `gen` data. */
static void round_trip(zt_store *s, size_t *sizes, float **bufs, float **back)
{
    zt_err err = {{0}};
    int tickets[NREC];
    for (int i = 0; i < NREC; i++) {
        fill_random(bufs[i], sizes[i], (uint32_t)i);
        if (zt_store_write_async(s, key_of(i), bufs[i], &tickets[i], &err) != 0)
            fail_msg("write_async %d: %s", i, err.msg);
    }
    for (int i = 0; i < NREC; i++)
        if (zt_store_wait(s, tickets[i], &err) != 0)
            fail_msg("wait write %d: %s", i, err.msg);
    /* Reads of the even records overlap with rewrites of the odd ones. */
    for (int i = 0; i < NREC; i++) {
        if (i % 2 == 0) {
            memset(back[i], 0xab, zt_store_buffer_bytes(sizes[i]));
            assert_int_equal(zt_store_read_async(s, key_of(i), back[i], &tickets[i], &err), 0);
        } else {
            fill_random(bufs[i], sizes[i], (uint32_t)i + 1000);
            assert_int_equal(zt_store_write_async(s, key_of(i), bufs[i], &tickets[i], &err), 0);
        }
    }
    for (int i = NREC - 1; i >= 0; i--) /* waited in reverse order on purpose */
        if (zt_store_wait(s, tickets[i], &err) != 0)
            fail_msg("wait %d: %s", i, err.msg);
    for (int i = 0; i < NREC; i++) {
        if (i % 2)
            assert_int_equal(zt_store_read(s, key_of(i), back[i], &err), 0);
        assert_memory_equal(back[i], bufs[i], sizes[i] * 12);
    }
}

static void alloc_records(zt_store *s, size_t *sizes, float **bufs, float **back)
{
    zt_err err = {{0}};
    for (int i = 0; i < NREC; i++) {
        /* 12 n bytes is never a multiple of 4096 here; a few records span many 64 KiB pieces */
        sizes[i] = i % 10 == 0 ? 250000 + (size_t)(next_u32() % 1000) * 3 + 1 : 1 + next_u32() % 20000;
        if (sizes[i] % 1024 == 0)
            sizes[i]++;
        if (zt_store_create(s, key_of(i), sizes[i], &err) != 0)
            fail_msg("create %d: %s", i, err.msg);
        bufs[i] = zt_store_buffer_alloc(sizes[i]);
        back[i] = zt_store_buffer_alloc(sizes[i]);
        assert_non_null(bufs[i]);
        assert_non_null(back[i]);
    }
}

static void free_records(float **bufs, float **back)
{
    for (int i = 0; i < NREC; i++) {
        zt_store_buffer_free(bufs[i]);
        zt_store_buffer_free(back[i]);
    }
}

/* RAM tier: round trips, zero records, in-place access, capacity, remove. */
static void test_ram(void **unused)
{
    (void)unused;
    zt_store_config cfg = {.kind = ZT_STORE_RAM, .capacity = 12 * 3000000};
    zt_store *s = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_store_open(&cfg, &s, &err), 0);
    size_t sizes[NREC];
    float *bufs[NREC], *back[NREC];
    alloc_records(s, sizes, bufs, back);
    float *zero = zt_store_buffer_alloc(sizes[1]);
    assert_int_equal(zt_store_read(s, key_of(1), back[1], &err), 0);
    assert_memory_equal(back[1], zero, sizes[1] * 12); /* a new record is zero */
    zt_store_buffer_free(zero);
    round_trip(s, sizes, bufs, back);
    float *data = NULL;
    size_t n = 0;
    assert_int_equal(zt_store_ram_data(s, key_of(5), &data, &n), 0);
    assert_int_equal(n, sizes[5]);
    assert_memory_equal(data, bufs[5], n * 12);
    /* capacity: a record past the limit is refused with a message naming the limit */
    size_t used = zt_store_used_bytes(s);
    zt_store_key big = {.run = 9, .block = 0, .shard = 0};
    size_t left = (cfg.capacity - used) / 12;
    assert_int_equal(zt_store_create(s, big, left + 1, &err), ZT_ENOMEM);
    assert_non_null(strstr(err.msg, "--mem-limit"));
    assert_int_equal(zt_store_create(s, big, left, &err), 0);
    assert_int_equal(zt_store_used_bytes(s), cfg.capacity - (cfg.capacity - used) % 12);
    assert_int_equal(zt_store_create(s, big, 1, &err), -EEXIST);
    assert_int_equal(zt_store_remove(s, big, &err), 0);
    assert_int_equal(zt_store_lookup(s, big, NULL), -ENOENT);
    assert_int_equal(zt_store_count(s), NREC);
    assert_int_equal(zt_store_read(s, big, back[0], &err), -ENOENT);
    zt_store_close(s);
    free_records(bufs, back);
}

/* NVMe tier: many records, queue depth 8 with 64 KiB pieces, overlapping reads and writes, registered
 * buffers for some requests, then a reopen that finds every record. */
static void test_nvme_round_trip_and_reopen(void **unused)
{
    (void)unused;
    make_dir();
    zt_store *s = open_nvme(0, 8, 65536);
    size_t sizes[NREC];
    float *bufs[NREC], *back[NREC];
    alloc_records(s, sizes, bufs, back);
    /* Register the first four write buffers and read buffers: those requests use fixed buffers. */
    float *reg[8];
    size_t lens[8];
    for (int i = 0; i < 4; i++) {
        reg[2 * i] = bufs[i];
        reg[2 * i + 1] = back[i];
        lens[2 * i] = lens[2 * i + 1] = zt_store_buffer_bytes(sizes[i]);
    }
    zt_err err = {{0}};
    if (zt_store_register_buffers(s, reg, lens, 8, &err) != 0)
        fail_msg("register_buffers: %s", err.msg);
    assert_int_equal(zt_store_register_buffers(s, reg, lens, 8, &err), ZT_ESTATE);
    round_trip(s, sizes, bufs, back);
    assert_int_equal(zt_store_count(s), NREC);
    /* A ticket held keeps its record: remove is refused until the wait. */
    int t;
    assert_int_equal(zt_store_read_async(s, key_of(3), back[3], &t, &err), 0);
    assert_int_equal(zt_store_remove(s, key_of(3), &err), ZT_ESTATE);
    assert_int_equal(zt_store_wait(s, t, &err), 0);
    assert_int_equal(zt_store_wait(s, t, &err), ZT_ESTATE);
    assert_int_equal(zt_store_remove(s, key_of(NREC - 1), &err), 0);
    zt_store_close(s);

    s = open_nvme(0, 4, 0);
    assert_int_equal(zt_store_count(s), NREC - 1);
    assert_int_equal(zt_store_lookup(s, key_of(NREC - 1), NULL), -ENOENT);
    for (int i = 0; i < NREC - 1; i++) {
        size_t n = 0;
        assert_int_equal(zt_store_lookup(s, key_of(i), &n), 0);
        assert_int_equal(n, sizes[i]);
        memset(back[i], 0, zt_store_buffer_bytes(n));
        if (zt_store_read(s, key_of(i), back[i], &err) != 0)
            fail_msg("read after reopen %d: %s", i, err.msg);
        assert_memory_equal(back[i], bufs[i], n * 12);
    }
    zt_store_close(s);
    free_records(bufs, back);
    remove_dir();
}

/* A flipped payload byte fails the checksum; a damaged header fails the open, naming the file. */
static void test_nvme_corruption(void **unused)
{
    (void)unused;
    make_dir();
    zt_store *s = open_nvme(0, 4, 0);
    zt_err err = {{0}};
    zt_store_key k = {.run = 1, .block = 2, .shard = 3};
    size_t n = 5000;
    float *buf = zt_store_buffer_alloc(n), *back = zt_store_buffer_alloc(n);
    fill_random(buf, n, 99);
    assert_int_equal(zt_store_create(s, k, n, &err), 0);
    assert_int_equal(zt_store_write(s, k, buf, &err), 0);
    assert_int_equal(zt_store_read(s, k, back, &err), 0);
    zt_store_close(s);

    char path[700];
    snprintf(path, sizeof(path), "%s/r1-b2-s3.zts", g_dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char byte;
    assert_int_equal(pread(fd, &byte, 1, 4096 + 12345), 1);
    byte ^= 0x10;
    assert_int_equal(pwrite(fd, &byte, 1, 4096 + 12345), 1);
    s = open_nvme(0, 4, 0);
    assert_int_equal(zt_store_read(s, k, back, &err), ZT_ECHECKSUM);
    assert_non_null(strstr(err.msg, "checksum"));
    /* rewriting the record repairs it */
    assert_int_equal(zt_store_write(s, k, buf, &err), 0);
    assert_int_equal(zt_store_read(s, k, back, &err), 0);
    assert_memory_equal(back, buf, n * 12);
    zt_store_close(s);

    assert_int_equal(pread(fd, &byte, 1, 20), 1);
    byte ^= 0x01;
    assert_int_equal(pwrite(fd, &byte, 1, 20), 1);
    close(fd);
    zt_store_config cfg = {.kind = ZT_STORE_NVME, .path = g_dir, .buffered = g_buffered};
    assert_int_equal(zt_store_open(&cfg, &s, &err), ZT_EFORMAT);
    assert_null(s);
    assert_non_null(strstr(err.msg, "r1-b2-s3.zts"));
    zt_store_buffer_free(buf);
    zt_store_buffer_free(back);
    remove_dir();
}

/* A record read in many small pieces (checksummed piece by piece as they arrive, in any order) reads back
 * intact, and a flipped byte in its first, a middle or its last piece is reported as ZT_ECHECKSUM. */
static void test_nvme_piecewise_checksum(void **unused)
{
    (void)unused;
    make_dir();
    zt_err err = {{0}};
    zt_store_key k = {.run = 4, .block = 5, .shard = 6};
    size_t n = 100003; /* 1200036 bytes: 293 pieces of 4096, the last one partly padding */
    float *buf = zt_store_buffer_alloc(n), *back = zt_store_buffer_alloc(n);
    fill_random(buf, n, 7);
    zt_store *s = open_nvme(0, 16, 4096);
    assert_int_equal(zt_store_create(s, k, n, &err), 0);
    assert_int_equal(zt_store_write(s, k, buf, &err), 0);
    assert_int_equal(zt_store_read(s, k, back, &err), 0);
    assert_memory_equal(back, buf, n * 12);
    zt_store_close(s);

    char path[700];
    snprintf(path, sizeof(path), "%s/r4-b5-s6.zts", g_dir);
    const off_t spots[3] = {4096 + 3, 4096 + 600001, 4096 + (off_t)(n * 12) - 1};
    for (int i = 0; i < 3; i++) {
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        unsigned char byte;
        assert_int_equal(pread(fd, &byte, 1, spots[i]), 1);
        byte ^= 0x40;
        assert_int_equal(pwrite(fd, &byte, 1, spots[i]), 1);
        close(fd);
        s = open_nvme(0, 16, 4096);
        assert_int_equal(zt_store_read(s, k, back, &err), ZT_ECHECKSUM);
        assert_int_equal(zt_store_write(s, k, buf, &err), 0); /* repair before the next spot */
        zt_store_close(s);
    }
    zt_store_buffer_free(buf);
    zt_store_buffer_free(back);
    remove_dir();
}

/* A pipeline as a state server runs it: a window of 3 buffers, the oldest ticket waited for before its
 * buffer is reused, so ticket slots are reused while newer requests are queued behind older ones. Every
 * record is written with its own data, then read back through the same kind of window and checked
 * (records of 37 pieces, 4 pieces in flight: requests overlap in the queue). */
static void test_nvme_pipeline_window(void **unused)
{
    (void)unused;
    make_dir();
    enum { NPIPE = 12, WINDOW = 3 };
    size_t n = 12345; /* 148140 bytes: 37 pieces of 4096 */
    zt_err err = {{0}};
    zt_store *s = open_nvme(0, 4, 4096);
    float *win[WINDOW];
    for (int j = 0; j < WINDOW; j++) {
        win[j] = zt_store_buffer_alloc(n);
        assert_non_null(win[j]);
    }
    float *want = zt_store_buffer_alloc(n);
    assert_non_null(want);
    for (int i = 0; i < NPIPE; i++)
        assert_int_equal(zt_store_create(s, key_of(i), n, &err), 0);
    for (int pass = 0; pass < 2; pass++) { /* pass 0 writes, pass 1 reads */
        int tickets[WINDOW];
        for (int i = 0; i < NPIPE + WINDOW; i++) {
            if (i >= WINDOW) {
                int j = (i - WINDOW) % WINDOW;
                if (zt_store_wait(s, tickets[j], &err) != 0)
                    fail_msg("pass %d, record %d: %s", pass, i - WINDOW, err.msg);
                if (pass == 1) {
                    fill_random(want, n, (uint32_t)(i - WINDOW) + 500);
                    assert_memory_equal(win[j], want, n * 12);
                }
            }
            if (i < NPIPE) {
                int j = i % WINDOW;
                if (pass == 0) {
                    fill_random(win[j], n, (uint32_t)i + 500);
                    assert_int_equal(zt_store_write_async(s, key_of(i), win[j], &tickets[j], &err), 0);
                } else {
                    memset(win[j], 0xab, zt_store_buffer_bytes(n));
                    assert_int_equal(zt_store_read_async(s, key_of(i), win[j], &tickets[j], &err), 0);
                }
            }
        }
    }
    zt_store_close(s);
    for (int j = 0; j < WINDOW; j++)
        zt_store_buffer_free(win[j]);
    zt_store_buffer_free(want);
    remove_dir();
}

/* Capacity on NVMe, a missing directory, a file where a directory should be, an unwritable directory,
 * a misaligned buffer with direct I/O, bad options. */
static void test_nvme_errors(void **unused)
{
    (void)unused;
    make_dir();
    zt_store *s = open_nvme(120000, 4, 0);
    zt_err err = {{0}};
    zt_store_key a = {.run = 1, .block = 0, .shard = 0}, b = {.run = 1, .block = 1, .shard = 0};
    assert_int_equal(zt_store_create(s, a, 9000, &err), 0);
    assert_int_equal(zt_store_create(s, b, 1001, &err), ZT_ENOMEM);
    assert_non_null(strstr(err.msg, "108000 of the 120000"));
    assert_int_equal(zt_store_create(s, b, 1000, &err), 0);
    if (!g_buffered) {
        float *buf = zt_store_buffer_alloc(9000 + 1024);
        int t;
        assert_int_equal(zt_store_write_async(s, a, buf + 1, &t, &err), ZT_EINVAL_CONFIG);
        assert_non_null(strstr(err.msg, "aligned"));
        zt_store_buffer_free(buf);
    }
    zt_store_close(s);

    zt_store_config cfg = {.kind = ZT_STORE_NVME};
    char path[700];
    snprintf(path, sizeof(path), "%s/missing", g_dir);
    cfg.path = path;
    assert_int_equal(zt_store_open(&cfg, &s, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "missing"));
    snprintf(path, sizeof(path), "%s/r1-b0-s0.zts", g_dir);
    assert_int_equal(zt_store_open(&cfg, &s, &err), -ENOTDIR);
    snprintf(path, sizeof(path), "%s/readonly", g_dir);
    assert_int_equal(mkdir(path, 0500), 0);
    if (geteuid() != 0) { /* root writes anywhere */
        assert_int_equal(zt_store_open(&cfg, &s, &err), -EACCES);
        assert_non_null(strstr(err.msg, "writable"));
    }
    cfg.path = g_dir;
    cfg.io_size = 1000;
    assert_int_equal(zt_store_open(&cfg, &s, &err), ZT_EINVAL_CONFIG);
    cfg.io_size = 0;
    cfg.path = NULL;
    assert_int_equal(zt_store_open(&cfg, &s, &err), ZT_EINVAL_CONFIG);
    remove_dir();
}

/* A full disk (a file size limit, SIGXFSZ ignored) when a record is created: -EFBIG with a message that
 * says what to do, no file and no record left behind, and the records already there read and write on.
 * Records reserve their space at creation, so a write never meets a full disk. */
static void test_nvme_file_size_limit(void **unused)
{
    (void)unused;
    make_dir();
    zt_store *s = open_nvme(0, 4, 0);
    zt_err err = {{0}};
    zt_store_key a = {.run = 3, .block = 0, .shard = 0}, b = {.run = 3, .block = 1, .shard = 0};
    assert_int_equal(zt_store_create(s, a, 1000, &err), 0);
    float *buf = zt_store_buffer_alloc(1000), *back = zt_store_buffer_alloc(1000);
    fill_random(buf, 1000, 5);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    low = old;
    low.rlim_cur = 16384; /* record a is 4096 + 12288 bytes: it fits, a larger one does not */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
    int rc = zt_store_create(s, b, 5000, &err);
    int wrc = zt_store_write(s, a, buf, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(rc, -EFBIG);
    assert_int_equal(wrc, 0);
    assert_int_equal(zt_store_lookup(s, b, NULL), -ENOENT);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "test $(ls '%s' | wc -l) -eq 1", g_dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(zt_store_read(s, a, back, &err), 0);
    assert_memory_equal(back, buf, 1000 * 12);
    assert_int_equal(zt_store_create(s, b, 5000, &err), 0); /* room again */
    zt_store_buffer_free(buf);
    zt_store_buffer_free(back);
    zt_store_close(s);
    remove_dir();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ram),
        cmocka_unit_test(test_nvme_round_trip_and_reopen),
        cmocka_unit_test(test_nvme_corruption),
        cmocka_unit_test(test_nvme_piecewise_checksum),
        cmocka_unit_test(test_nvme_pipeline_window),
        cmocka_unit_test(test_nvme_errors),
        cmocka_unit_test(test_nvme_file_size_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
