/* Tests of the token shard loader (worker/data/dataloader.h): batches, epochs, shuffling, positions,
 * several shards, and every malformed-file error. Shards are written to a fresh temporary folder.
 *
 * Token j of test shard s has the value s * 10000 + j, so a token tells which shard and offset it came
 * from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/data/dataloader.h"

#define MAXB 64 /* B*T of every test */

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/zt_test_dataloader_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof(p), "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(g_dir);
    return 0;
}

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

/* Writes shard `name` with n tokens of value id * 10000 + j. */
static void write_test_shard(const char *name, int id, size_t n)
{
    uint16_t *t = malloc((n ? n : 1) * sizeof(uint16_t));
    assert_non_null(t);
    for (size_t j = 0; j < n; j++)
        t[j] = (uint16_t)(id * 10000 + (int)j);
    char p[512];
    path_of(p, sizeof(p), name);
    zt_err err;
    assert_int_equal(zt_shard_write(p, t, n, &err), 0);
    free(t);
}

/* Writes raw bytes: a 256-int header with the given fields, then nbytes_after bytes of tokens. */
static void write_raw_shard(const char *name, int32_t magic, int32_t version, int32_t count, size_t nbytes_after)
{
    char p[512];
    path_of(p, sizeof(p), name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    int32_t header[ZT_SHARD_HEADER_INTS] = {magic, version, count};
    assert_int_equal(fwrite(header, sizeof(header), 1, f), 1);
    for (size_t i = 0; i < nbytes_after; i++)
        fputc((int)(i & 0x7f), f);
    fclose(f);
}

static zt_dataloader *open_ok(const char *glob_name, int B, int T, bool shuffle, uint64_t seed)
{
    char pat[512];
    path_of(pat, sizeof(pat), glob_name);
    zt_dataloader *dl = NULL;
    zt_err err = {{0}};
    int rc = zt_dataloader_open(&dl, pat, B, T, shuffle, seed, &err);
    if (rc != 0)
        fail_msg("open %s: %s", pat, err.msg);
    return dl;
}

/* Opens pattern expecting failure; returns the code and leaves the message in err. */
static int open_fail(const char *glob_name, int B, int T, zt_err *err)
{
    char pat[512];
    path_of(pat, sizeof(pat), glob_name);
    zt_dataloader *dl = (zt_dataloader *)0x1;
    memset(err, 0, sizeof(*err));
    int rc = zt_dataloader_open(&dl, pat, B, T, false, 0, err);
    assert_int_not_equal(rc, 0);
    assert_null(dl);
    assert_true(strlen(err->msg) > 0);
    return rc;
}

/* Checks one batch against the rule: row b is tokens [w0 + b*T, w0 + b*T + T] of one shard, inputs are
 * the first T, targets the last T. Returns the token value of the window's first input. */
static int check_batch(const int32_t *in, const int32_t *tg, int B, int T)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[b * T + t], in[0] + b * T + t);
            assert_int_equal(tg[b * T + t], in[b * T + t] + 1);
        }
    return in[0];
}

static void test_batches_in_file_order(void **state)
{
    (void)state;
    const int B = 2, T = 4; /* windows of 9 tokens starting every 8 */
    write_test_shard("a_000.bin", 1, 3 * 8 + 1 + 5); /* 3 windows and 5 spare tokens */
    zt_dataloader *dl = open_ok("a_*.bin", B, T, false, 0);
    assert_int_equal(zt_dataloader_batches_per_epoch(dl), 3);
    assert_int_equal(zt_dataloader_num_tokens(dl), 30);
    assert_int_equal(zt_dataloader_max_token(dl), 10000 + 29);

    int32_t in[MAXB], tg[MAXB];
    for (int k = 0; k < 3; k++) {
        zt_dataloader_next(dl, in, tg);
        assert_int_equal(check_batch(in, tg, B, T), 10000 + k * B * T);
    }
    zt_dataloader_close(dl);
}

static void test_epoch_wrap_and_reset(void **state)
{
    (void)state;
    const int B = 1, T = 4;
    write_test_shard("a_000.bin", 0, 13); /* windows at 0, 4, 8 (8 + 5 = 13 fits) */
    zt_dataloader *dl = open_ok("a_*.bin", B, T, false, 0);
    assert_int_equal(zt_dataloader_batches_per_epoch(dl), 3);
    int32_t in[MAXB], tg[MAXB];
    for (int k = 0; k < 3; k++)
        zt_dataloader_next(dl, in, tg);
    zt_data_position pos;
    zt_dataloader_get_position(dl, &pos);
    assert_int_equal(pos.epoch, 1);
    assert_int_equal(pos.shard, 0);
    assert_int_equal(pos.window, 0);
    zt_dataloader_next(dl, in, tg);
    assert_int_equal(check_batch(in, tg, B, T), 0);
    zt_dataloader_next(dl, in, tg);
    assert_int_equal(check_batch(in, tg, B, T), 4);

    zt_dataloader_reset(dl);
    zt_dataloader_get_position(dl, &pos);
    assert_int_equal(pos.epoch, 0);
    assert_int_equal(pos.window, 0);
    zt_dataloader_next(dl, in, tg);
    assert_int_equal(check_batch(in, tg, B, T), 0);
    zt_dataloader_close(dl);
}

static void test_several_shards_sorted_and_small_skipped(void **state)
{
    (void)state;
    const int B = 2, T = 3; /* windows of 7 tokens every 6 */
    /* Written out of name order: the loader sorts by name. */
    write_test_shard("d_002.bin", 2, 6 * 2 + 1); /* 2 windows */
    write_test_shard("d_000.bin", 0, 6 * 1 + 1); /* 1 window */
    write_test_shard("d_001.bin", 1, 6);         /* too small: skipped with a warning */
    write_test_shard("d_003.bin", 3, 6 * 3 + 4); /* 3 windows */
    zt_dataloader *dl = open_ok("d_*.bin", B, T, false, 0);
    assert_int_equal(zt_dataloader_batches_per_epoch(dl), 6);
    assert_int_equal(zt_dataloader_num_tokens(dl), 7 + 13 + 22);
    assert_int_equal(zt_dataloader_max_token(dl), 30000 + 21);

    const int expect[6] = {0, 20000, 20006, 30000, 30006, 30012};
    int32_t in[MAXB], tg[MAXB];
    for (int epoch = 0; epoch < 2; epoch++)
        for (int k = 0; k < 6; k++) {
            zt_dataloader_next(dl, in, tg);
            assert_int_equal(check_batch(in, tg, B, T), expect[k]);
        }
    zt_dataloader_close(dl);
}

/* Three shards with 4, 5 and 6 windows (B*T = 8). */
static void write_three_shards(void)
{
    write_test_shard("s_000.bin", 0, 4 * 8 + 1);
    write_test_shard("s_001.bin", 1, 5 * 8 + 1);
    write_test_shard("s_002.bin", 2, 6 * 8 + 1);
}

#define THREE_WINDOWS 15

/* Reads n batches and records the first input token of each. */
static void read_firsts(zt_dataloader *dl, int B, int T, int n, int *firsts)
{
    int32_t in[MAXB], tg[MAXB];
    for (int i = 0; i < n; i++) {
        zt_dataloader_next(dl, in, tg);
        firsts[i] = check_batch(in, tg, B, T);
    }
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void test_shuffle_deterministic(void **state)
{
    (void)state;
    const int B = 2, T = 4;
    write_three_shards();
    int a[2 * THREE_WINDOWS], b[2 * THREE_WINDOWS], c[2 * THREE_WINDOWS], plain[THREE_WINDOWS];

    zt_dataloader *dl = open_ok("s_*.bin", B, T, false, 0);
    read_firsts(dl, B, T, THREE_WINDOWS, plain);
    zt_dataloader_close(dl);

    dl = open_ok("s_*.bin", B, T, true, 1234);
    read_firsts(dl, B, T, 2 * THREE_WINDOWS, a);
    zt_dataloader_close(dl);
    dl = open_ok("s_*.bin", B, T, true, 1234);
    read_firsts(dl, B, T, 2 * THREE_WINDOWS, b);
    zt_dataloader_close(dl);
    dl = open_ok("s_*.bin", B, T, true, 1235);
    read_firsts(dl, B, T, 2 * THREE_WINDOWS, c);
    zt_dataloader_close(dl);

    /* Same seed: the same batches. */
    assert_memory_equal(a, b, sizeof(a));
    /* Another seed, and another epoch of the same seed: another order. */
    assert_memory_not_equal(a, c, sizeof(a));
    assert_memory_not_equal(a, a + THREE_WINDOWS, THREE_WINDOWS * sizeof(int));
    assert_memory_not_equal(a, plain, sizeof(plain));

    /* Every epoch visits every window exactly once, and the windows of one shard stay together. */
    for (int e = 0; e < 2; e++) {
        int sorted[THREE_WINDOWS];
        memcpy(sorted, a + e * THREE_WINDOWS, sizeof(sorted));
        qsort(sorted, THREE_WINDOWS, sizeof(int), cmp_int);
        assert_memory_equal(sorted, plain, sizeof(plain));
        int changes = 0;
        for (int i = 1; i < THREE_WINDOWS; i++)
            changes += a[e * THREE_WINDOWS + i] / 10000 != a[e * THREE_WINDOWS + i - 1] / 10000;
        assert_int_equal(changes, 2);
    }
}

/* Saves the position after `skip` batches, reads `n` more; a fresh loader set to that position must
 * give the same n batches. */
static void check_restore(bool shuffle, int skip, int n)
{
    const int B = 2, T = 4;
    int32_t in[MAXB], tg[MAXB], in2[MAXB], tg2[MAXB];
    zt_dataloader *dl = open_ok("s_*.bin", B, T, shuffle, 99);
    for (int i = 0; i < skip; i++)
        zt_dataloader_next(dl, in, tg);
    zt_data_position pos;
    zt_dataloader_get_position(dl, &pos);

    zt_dataloader *dl2 = open_ok("s_*.bin", B, T, shuffle, 99);
    zt_dataloader_next(dl2, in2, tg2); /* move it somewhere else first */
    zt_err err;
    assert_int_equal(zt_dataloader_set_position(dl2, &pos, &err), 0);
    for (int i = 0; i < n; i++) {
        zt_dataloader_next(dl, in, tg);
        zt_dataloader_next(dl2, in2, tg2);
        assert_memory_equal(in, in2, sizeof(int32_t) * B * T);
        assert_memory_equal(tg, tg2, sizeof(int32_t) * B * T);
    }
    zt_data_position p1, p2;
    zt_dataloader_get_position(dl, &p1);
    zt_dataloader_get_position(dl2, &p2);
    assert_memory_equal(&p1, &p2, sizeof(p1));
    zt_dataloader_close(dl);
    zt_dataloader_close(dl2);
}

static void test_position_restore(void **state)
{
    (void)state;
    write_three_shards();
    check_restore(true, 7, 2 * THREE_WINDOWS);  /* mid-epoch, across two epoch boundaries */
    check_restore(true, 31, 5);                 /* in a later epoch */
    check_restore(false, 9, THREE_WINDOWS + 3); /* file order too */
    check_restore(true, 0, 3);
}

static void test_set_position_rejects_out_of_range(void **state)
{
    (void)state;
    write_three_shards();
    zt_dataloader *dl = open_ok("s_*.bin", 2, 4, true, 5);
    int32_t in[MAXB], tg[MAXB];
    zt_dataloader_next(dl, in, tg);
    zt_data_position before, after;
    zt_dataloader_get_position(dl, &before);

    zt_err err = {{0}};
    zt_data_position bad = {.epoch = 0, .shard = 3, .window = 0};
    assert_int_equal(zt_dataloader_set_position(dl, &bad, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "does not fit"));

    /* Window 5 exists only in the shard with 6 windows; window 6 in none. */
    bad = (zt_data_position){.epoch = 2, .shard = 0, .window = 6};
    memset(&err, 0, sizeof(err));
    assert_int_equal(zt_dataloader_set_position(dl, &bad, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "windows"));

    zt_dataloader_get_position(dl, &after);
    assert_memory_equal(&before, &after, sizeof(before));
    zt_dataloader_close(dl);
}

static void test_error_no_match(void **state)
{
    (void)state;
    zt_err err;
    int rc = open_fail("nothing_*.bin", 1, 4, &err);
    assert_int_equal(rc, -ENOENT);
    assert_non_null(strstr(err.msg, "no files match"));
    assert_non_null(strstr(err.msg, "nothing_*.bin"));
}

static void test_error_truncated(void **state)
{
    (void)state;
    write_raw_shard("t_000.bin", ZT_SHARD_MAGIC, ZT_SHARD_VERSION, 100, 2 * 100 - 3);
    zt_err err;
    assert_int_equal(open_fail("t_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated: header says 100 tokens (1224 bytes) but the file has 1221 bytes"));
    assert_non_null(strstr(err.msg, "t_000.bin"));
}

static void test_error_count_larger_file(void **state)
{
    (void)state;
    write_raw_shard("t_000.bin", ZT_SHARD_MAGIC, ZT_SHARD_VERSION, 10, 2 * 10 + 2);
    zt_err err;
    assert_int_equal(open_fail("t_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "header says 10 tokens (1044 bytes) but the file has 1046 bytes"));
}

static void test_error_negative_count(void **state)
{
    (void)state;
    write_raw_shard("t_000.bin", ZT_SHARD_MAGIC, ZT_SHARD_VERSION, -5, 0);
    zt_err err;
    assert_int_equal(open_fail("t_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "negative token count"));
}

static void test_error_bad_magic(void **state)
{
    (void)state;
    write_raw_shard("t_000.bin", 20240519, ZT_SHARD_VERSION, 10, 20);
    zt_err err;
    assert_int_equal(open_fail("t_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "bad magic 20240519"));
}

static void test_error_bad_version(void **state)
{
    (void)state;
    write_raw_shard("t_000.bin", ZT_SHARD_MAGIC, 2, 10, 20);
    zt_err err;
    assert_int_equal(open_fail("t_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "unsupported shard version 2"));
}

static void test_error_shorter_than_header(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof(p), "t_000.bin");
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs("hello, this is text, not tokens\n", f);
    fclose(f);
    zt_err err;
    assert_int_equal(open_fail("t_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "less than the 1024-byte shard header"));
}

static void test_error_one_bad_among_good(void **state)
{
    (void)state;
    write_test_shard("m_000.bin", 0, 100);
    write_raw_shard("m_001.bin", ZT_SHARD_MAGIC, ZT_SHARD_VERSION, 50, 10);
    write_test_shard("m_002.bin", 2, 100);
    zt_err err;
    assert_int_equal(open_fail("m_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "m_001.bin"));
}

static void test_error_all_too_small(void **state)
{
    (void)state;
    write_test_shard("x_000.bin", 0, 8);
    write_test_shard("x_001.bin", 1, 0);
    zt_err err;
    assert_int_equal(open_fail("x_*.bin", 2, 4, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "none of the 2 shard(s)"));
    assert_non_null(strstr(err.msg, "window of 9 tokens"));
    /* With 8 = B*T tokens a window is one token short; 9 is enough. */
    write_test_shard("y_000.bin", 0, 9);
    zt_dataloader *dl = open_ok("y_*.bin", 2, 4, false, 0);
    assert_int_equal(zt_dataloader_batches_per_epoch(dl), 1);
    zt_dataloader_close(dl);
}

static void test_error_bad_sizes(void **state)
{
    (void)state;
    write_test_shard("a_000.bin", 0, 100);
    zt_err err;
    assert_int_equal(open_fail("a_*.bin", 0, 4, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(open_fail("a_*.bin", 4, -1, &err), ZT_EINVAL_CONFIG);
}

static void test_shard_write_layout(void **state)
{
    (void)state;
    const uint16_t t[5] = {0, 1, 255, 256, 65535};
    char p[512];
    path_of(p, sizeof(p), "w.bin");
    zt_err err;
    assert_int_equal(zt_shard_write(p, t, 5, &err), 0);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char buf[2048];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_int_equal(n, 1024 + 10);
    const unsigned char head[12] = {0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0, 5, 0, 0, 0}; /* 20240520, 1, 5 LE */
    assert_memory_equal(buf, head, 12);
    for (int i = 12; i < 1024; i++)
        assert_int_equal(buf[i], 0);
    const unsigned char body[10] = {0, 0, 1, 0, 0xff, 0, 0, 1, 0xff, 0xff};
    assert_memory_equal(buf + 1024, body, 10);
    /* No temporary file is left beside it. */
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    assert_int_equal(access(tmp, F_OK), -1);

    /* A writer error names the path. */
    path_of(p, sizeof(p), "no_such_dir/w.bin");
    memset(&err, 0, sizeof(err));
    assert_true(zt_shard_write(p, t, 5, &err) < 0);
    assert_non_null(strstr(err.msg, "no_such_dir/w.bin"));
}

/* The 32-bit format (llm.c's LLaMA-3 shards): its header and layout, ids above 65535 through the loader
 * and zt_shard_max_token, a glob mixing both formats, and its own format errors. */
static void test_32bit_shards(void **state)
{
    (void)state;
    const uint32_t t[5] = {0, 65535, 65536, 128255, 4000000000u};
    char p[512];
    path_of(p, sizeof(p), "w32.bin");
    zt_err err;
    assert_int_equal(zt_shard_write32(p, t, 5, &err), 0);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char buf[2048];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_int_equal(n, 1024 + 20);
    const unsigned char head[12] = {0xa1, 0xd9, 0x34, 0x01, 7, 0, 0, 0, 5, 0, 0, 0}; /* 20240801, 7, 5 LE */
    assert_memory_equal(buf, head, 12);
    const unsigned char body[8] = {0, 0, 0, 0, 0xff, 0xff, 0, 0};
    assert_memory_equal(buf + 1024, body, 8);
    assert_int_equal(zt_shard_max_token(p), INT32_MAX); /* 4e9 saturates */

    /* ids above 65535 through the loader, beside a 16-bit shard of the same glob */
    const int B = 2, T = 4;
    uint32_t wide[40];
    for (int j = 0; j < 40; j++)
        wide[j] = (uint32_t)(100000 + j);
    path_of(p, sizeof(p), "mix_000.bin");
    assert_int_equal(zt_shard_write32(p, wide, 40, &err), 0);
    assert_int_equal(zt_shard_max_token(p), 100039);
    write_test_shard("mix_001.bin", 2, 17);
    zt_dataloader *dl = open_ok("mix_*.bin", B, T, false, 0);
    assert_int_equal(zt_dataloader_num_tokens(dl), 57);
    assert_int_equal(zt_dataloader_max_token(dl), 100039);
    assert_int_equal(zt_dataloader_batches_per_epoch(dl), 4 + 2);
    int32_t in[MAXB], tg[MAXB];
    for (int k = 0; k < 4; k++) {
        zt_dataloader_next(dl, in, tg);
        assert_int_equal(check_batch(in, tg, B, T), 100000 + k * B * T);
    }
    zt_dataloader_next(dl, in, tg);
    assert_int_equal(check_batch(in, tg, B, T), 20000);
    zt_dataloader_close(dl);

    /* the 32-bit format's size and version checks */
    write_raw_shard("u_000.bin", ZT_SHARD32_MAGIC, ZT_SHARD32_VERSION, 10, 2 * 10);
    assert_int_equal(open_fail("u_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated: header says 10 tokens (1064 bytes) but the file has 1044 bytes"));
    write_raw_shard("v_000.bin", ZT_SHARD32_MAGIC, 1, 10, 40);
    assert_int_equal(open_fail("v_*.bin", 1, 4, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "version 7 of the 32-bit format"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batches_in_file_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_32bit_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_epoch_wrap_and_reset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_several_shards_sorted_and_small_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shuffle_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_position_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_position_rejects_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_no_match, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_count_larger_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_negative_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_bad_magic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_bad_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_shorter_than_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_one_bad_among_good, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_all_too_small, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_bad_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_write_layout, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
