/* Tests of common/safetensors: write/read round trips over every dtype, the writer's header layout and
 * argument checks, atomic writes that leave nothing behind on failure, and one crafted bad file for
 * each check of the reader (each message must name the file and the problem). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/safetensors.h"

static char g_dir[64];
static char g_path[128]; /* the file each test writes or crafts */

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/zt_test_st_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    snprintf(g_path, sizeof(g_path), "%s/model.safetensors", g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Writes raw bytes to g_path. */
static void write_raw(const void *bytes, size_t n)
{
    FILE *f = fopen(g_path, "wb");
    assert_non_null(f);
    if (n > 0)
        assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* craft()'s header_len that means "the true length of the header text". */
#define HLEN UINT64_MAX

/* Writes a file made of the length prefix (header_len, or strlen(header) for HLEN), the header text
 * and data_len bytes of data (a counting pattern). */
static void craft(const char *header, uint64_t header_len, size_t data_len)
{
    size_t hn = strlen(header);
    uint64_t len = header_len == HLEN ? (uint64_t)hn : header_len;
    size_t total = 8 + hn + data_len;
    unsigned char *buf = malloc(total);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, hn);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hn + i] = (unsigned char)i;
    write_raw(buf, total);
    free(buf);
}

/* Opening g_path must fail with code and a message that holds the path and every given fragment. */
static void expect_open_error(int code, const char *fragment1, const char *fragment2)
{
    zt_st_file *f = (zt_st_file *)0x1;
    zt_err err = {{0}};
    int rc = zt_st_open(g_path, &f, &err);
    if (rc != code)
        fail_msg("zt_st_open returned %d (%s), want %d", rc, err.msg, code);
    assert_null(f);
    if (strstr(err.msg, g_path) == NULL)
        fail_msg("message '%s' does not name the file", err.msg);
    if (fragment1 != NULL && strstr(err.msg, fragment1) == NULL)
        fail_msg("message '%s' does not contain '%s'", err.msg, fragment1);
    if (fragment2 != NULL && strstr(err.msg, fragment2) == NULL)
        fail_msg("message '%s' does not contain '%s'", err.msg, fragment2);
}

static zt_st_file *open_ok(void)
{
    zt_st_file *f = NULL;
    zt_err err = {{0}};
    int rc = zt_st_open(g_path, &f, &err);
    if (rc != 0)
        fail_msg("zt_st_open failed: %s", err.msg);
    return f;
}

/* ---- dtypes ---- */

static void test_dtype_table(void **state)
{
    (void)state;
    static const char *names[] = {"F32", "F16", "BF16", "F64", "I8",  "U8",  "I16",
                                  "U16", "I32", "U32",  "I64", "U64", "BOOL"};
    static const size_t sizes[] = {4, 2, 2, 8, 1, 1, 2, 2, 4, 4, 8, 8, 1};
    for (int i = 0; i < 13; i++) {
        assert_string_equal(zt_dtype_name((enum zt_dtype)i), names[i]);
        assert_int_equal(zt_dtype_size((enum zt_dtype)i), sizes[i]);
        enum zt_dtype d;
        assert_int_equal(zt_dtype_parse(names[i], &d), 0);
        assert_int_equal(d, i);
    }
    enum zt_dtype d;
    assert_int_equal(zt_dtype_parse("f32", &d), ZT_EFORMAT);
    assert_int_equal(zt_dtype_parse("F8_E4M3", &d), ZT_EFORMAT);
    assert_int_equal(zt_dtype_size((enum zt_dtype)13), 0);
}

/* ---- round trips and the writer ---- */

static void test_round_trip_all_dtypes(void **state)
{
    (void)state;
    zt_st_writer *w = zt_st_writer_create();
    zt_err err = {{0}};
    unsigned char data[13][64];
    char names[13][16];
    for (int i = 0; i < 13; i++) {
        for (int k = 0; k < 64; k++)
            data[i][k] = (unsigned char)(i * 17 + k * 3);
        if (i == ZT_DTYPE_BOOL)
            for (int k = 0; k < 64; k++)
                data[i][k] &= 1;
        /* Names in reverse alphabetical order: the file keeps the order of the adds. */
        snprintf(names[i], sizeof(names[i]), "t%02d.%s", 20 - i, zt_dtype_name((enum zt_dtype)i));
        int64_t shape[2] = {2, (int64_t)(8 / zt_dtype_size((enum zt_dtype)i))};
        assert_int_equal(zt_st_writer_add(w, names[i], (enum zt_dtype)i, 2, shape, data[i], &err), 0);
    }
    int64_t empty_shape[2] = {0, 5};
    assert_int_equal(zt_st_writer_add(w, "empty", ZT_DTYPE_F32, 2, empty_shape, NULL, &err), 0);
    float scalar = 2.5f;
    assert_int_equal(zt_st_writer_add(w, "scalar", ZT_DTYPE_F32, 0, NULL, &scalar, &err), 0);
    assert_int_equal(zt_st_writer_add_metadata(w, "format", "pt", &err), 0);
    assert_int_equal(zt_st_writer_add_metadata(w, "note", "quote \" backslash \\ newline \n tab \t \x01 \xc3\xbc", &err),
                     0);
    assert_int_equal(zt_st_writer_write(w, g_path, &err), 0);
    zt_st_writer_destroy(w);

    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", g_path);
    assert_false(exists(tmp));

    zt_st_file *f = open_ok();
    assert_int_equal(zt_st_count(f), 15);
    for (int i = 0; i < 13; i++) {
        const zt_st_tensor *t = zt_st_get(f, (size_t)i);
        assert_string_equal(t->name, names[i]);
        assert_int_equal(t->dtype, i);
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->shape[0], 2);
        assert_int_equal(t->shape[1], 8 / zt_dtype_size((enum zt_dtype)i));
        assert_int_equal(t->nbytes, 16);
        assert_memory_equal(t->data, data[i], 16);
        assert_ptr_equal(zt_st_find(f, names[i]), t);
    }
    const zt_st_tensor *e = zt_st_find(f, "empty");
    assert_non_null(e);
    assert_int_equal(e->nbytes, 0);
    assert_int_equal(e->shape[0], 0);
    assert_int_equal(e->shape[1], 5);
    const zt_st_tensor *s = zt_st_find(f, "scalar");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->nbytes, 4);
    float got;
    memcpy(&got, s->data, 4);
    assert_true(got == 2.5f);
    assert_null(zt_st_find(f, "missing"));
    assert_null(zt_st_find(f, ""));
    assert_string_equal(zt_st_metadata(f, "format"), "pt");
    assert_string_equal(zt_st_metadata(f, "note"), "quote \" backslash \\ newline \n tab \t \x01 \xc3\xbc");
    assert_null(zt_st_metadata(f, "absent"));
    zt_st_close(f);
    zt_st_close(NULL);
}

static void test_header_layout(void **state)
{
    (void)state;
    zt_st_writer *w = zt_st_writer_create();
    zt_err err = {{0}};
    uint16_t v[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    assert_int_equal(zt_st_writer_add(w, "w", ZT_DTYPE_BF16, 1, shape, v, &err), 0);
    assert_int_equal(zt_st_writer_add_metadata(w, "format", "pt", &err), 0);
    assert_int_equal(zt_st_writer_write(w, g_path, &err), 0);
    zt_st_writer_destroy(w);

    FILE *fp = fopen(g_path, "rb");
    assert_non_null(fp);
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof(buf), fp);
    fclose(fp);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[3],"
                       "\"data_offsets\":[0,6]}}";
    assert_int_equal(hlen % 8, 0);
    assert_true(hlen >= strlen(want) && hlen < strlen(want) + 8);
    assert_int_equal(n, 8 + hlen + 6);
    assert_memory_equal(buf + 8, want, strlen(want));
    for (size_t i = strlen(want); i < hlen; i++)
        assert_int_equal(buf[8 + i], ' ');
    assert_memory_equal(buf + 8 + hlen, v, 6);
}

static void test_empty_file_round_trip(void **state)
{
    (void)state;
    zt_st_writer *w = zt_st_writer_create();
    zt_err err = {{0}};
    assert_int_equal(zt_st_writer_write(w, g_path, &err), 0);
    zt_st_writer_destroy(w);
    zt_st_file *f = open_ok();
    assert_int_equal(zt_st_count(f), 0);
    assert_null(zt_st_find(f, "x"));
    assert_null(zt_st_metadata(f, "x"));
    zt_st_close(f);
}

static void test_writer_rejects_bad_tensors(void **state)
{
    (void)state;
    zt_st_writer *w = zt_st_writer_create();
    zt_err err = {{0}};
    float x[4] = {0};
    int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(zt_st_writer_add(w, "a", ZT_DTYPE_F32, 1, shape, x, &err), 0);
    assert_int_equal(zt_st_writer_add(w, "a", ZT_DTYPE_F32, 1, shape, x, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "'a' was added twice"));
    assert_int_equal(zt_st_writer_add(w, "b", ZT_DTYPE_F32, 9, shape, x, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "9 dimensions"));
    assert_int_equal(zt_st_writer_add(w, "c", ZT_DTYPE_F32, -1, shape, x, &err), ZT_EINVAL_CONFIG);
    int64_t neg[2] = {2, -1};
    assert_int_equal(zt_st_writer_add(w, "d", ZT_DTYPE_F32, 2, neg, x, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "negative"));
    int64_t huge[3] = {1LL << 40, 1LL << 40, 1LL << 40};
    assert_int_equal(zt_st_writer_add(w, "e", ZT_DTYPE_F32, 3, huge, x, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "too large"));
    assert_int_equal(zt_st_writer_add(w, "__metadata__", ZT_DTYPE_F32, 1, shape, x, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_st_writer_add(w, "", ZT_DTYPE_F32, 1, shape, x, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_st_writer_add(w, "\xff\xfe", ZT_DTYPE_F32, 1, shape, x, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_st_writer_add(w, "f", (enum zt_dtype)99, 1, shape, x, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_st_writer_add(w, "g", ZT_DTYPE_F32, 1, shape, NULL, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_st_writer_add_metadata(w, "k", "v", &err), 0);
    assert_int_equal(zt_st_writer_add_metadata(w, "k", "w", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "'k' was added twice"));
    assert_int_equal(zt_st_writer_add_metadata(w, "k2", NULL, &err), ZT_EINVAL_CONFIG);
    /* The rejected adds changed nothing: the file holds "a" alone. */
    assert_int_equal(zt_st_writer_write(w, g_path, &err), 0);
    zt_st_writer_destroy(w);
    zt_st_writer_destroy(NULL);
    zt_st_file *f = open_ok();
    assert_int_equal(zt_st_count(f), 1);
    assert_string_equal(zt_st_get(f, 0)->name, "a");
    assert_string_equal(zt_st_metadata(f, "k"), "v");
    zt_st_close(f);
}

static void test_writer_failure_leaves_nothing(void **state)
{
    (void)state;
    zt_st_writer *w = zt_st_writer_create();
    zt_err err = {{0}};
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    assert_int_equal(zt_st_writer_add(w, "x", ZT_DTYPE_F32, 1, shape, x, &err), 0);

    /* The target path is a directory: the rename fails after the data is written. */
    char target[160], tmp[170];
    snprintf(target, sizeof(target), "%s/dir.safetensors", g_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", target);
    assert_int_equal(mkdir(target, 0755), 0);
    int rc = zt_st_writer_write(w, target, &err);
    assert_true(rc < 0);
    assert_non_null(strstr(err.msg, target));
    assert_false(exists(tmp));

    /* A missing directory. */
    snprintf(target, sizeof(target), "%s/missing/m.safetensors", g_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", target);
    assert_int_equal(zt_st_writer_write(w, target, &err), -ENOENT);
    assert_non_null(strstr(err.msg, target));
    assert_false(exists(target));
    assert_false(exists(tmp));

    /* A good write replaces an older file whole. */
    write_raw("old content", 11);
    assert_int_equal(zt_st_writer_write(w, g_path, &err), 0);
    zt_st_file *f = open_ok();
    assert_int_equal(zt_st_count(f), 1);
    zt_st_close(f);
    zt_st_writer_destroy(w);
}

/* ---- the reader on crafted files ---- */

static void test_reader_orders_by_offset(void **state)
{
    (void)state;
    craft("{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
          "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
          "\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"y\":{\"dtype\":\"F64\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
          "\"__metadata__\":{}}",
          HLEN, 8);
    zt_st_file *f = open_ok();
    assert_int_equal(zt_st_count(f), 4);
    assert_string_equal(zt_st_get(f, 0)->name, "a");
    assert_string_equal(zt_st_get(f, 1)->name, "z");
    assert_string_equal(zt_st_get(f, 2)->name, "b");
    assert_string_equal(zt_st_get(f, 3)->name, "y");
    const unsigned char *b = zt_st_find(f, "b")->data;
    assert_int_equal(b[0], 4);
    assert_int_equal(b[3], 7);
    zt_st_close(f);
}

static void test_reader_rejects_bad_sizes(void **state)
{
    (void)state;
    zt_st_file *f = (zt_st_file *)0x1;
    zt_err err = {{0}};
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/none.safetensors", g_dir);
    assert_int_equal(zt_st_open(missing, &f, &err), -ENOENT);
    assert_null(f);
    assert_non_null(strstr(err.msg, missing));

    assert_int_equal(zt_st_open(g_dir, &f, &err), ZT_EFORMAT); /* a directory */

    write_raw("", 0);
    expect_open_error(ZT_EFORMAT, "0 bytes", "too short");
    write_raw("\x05\0\0\0\0", 5);
    expect_open_error(ZT_EFORMAT, "5 bytes", "too short");
    craft("{}      ", 100000001, 0);
    expect_open_error(ZT_EFORMAT, "100000001", "100 MB");
    craft("{}      ", 9, 0);
    expect_open_error(ZT_EFORMAT, "header length 9 runs past the end", NULL);
    craft("{}", 0x8000000000000000ULL, 0);
    expect_open_error(ZT_EFORMAT, "100 MB", NULL);
}

static void test_reader_rejects_bad_headers(void **state)
{
    (void)state;
    craft("        ", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "does not start with '{'", NULL);
    craft("[]      ", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "does not start with '{'", NULL);
    craft("{\"a\":   ", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "not valid JSON", NULL);
    craft("{} x    ", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "not valid JSON", NULL);
    craft("{\"\xff\":1}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "UTF-8", NULL);
    char with_nul[] = "{}  \0   ";
    size_t hn = sizeof(with_nul) - 1;
    unsigned char buf[8 + sizeof(with_nul)];
    memset(buf, 0, 8);
    buf[0] = (unsigned char)hn;
    memcpy(buf + 8, with_nul, hn);
    write_raw(buf, 8 + hn);
    expect_open_error(ZT_EFORMAT, "UTF-8", NULL);
}

static void test_reader_rejects_bad_entries(void **state)
{
    (void)state;
    craft("{\"t\":[1,2]}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "expected an object");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "missing field 'data_offsets'");
    craft("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "missing field 'dtype'");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "unexpected field 'extra'");
    craft("{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "field 'dtype' appears twice");
    craft("{\"t\":{\"dtype\":\"F8_E5M2\",\"shape\":[1],\"data_offsets\":[0,1]}}", HLEN, 1);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "unknown dtype 'F8_E5M2'");
    craft("{\"t\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "dtype must be a string");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", HLEN, 16);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "shape must be an array");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,0]}}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "shape[1]");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "shape[0]");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", HLEN, 8);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "shape[0]");
    craft("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", HLEN, 1);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "9 dimensions");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,0]}}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "overflows");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", HLEN, 12);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "make 16 bytes");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "data_offsets must be an array [begin, end]");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", HLEN, 8);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "data_offsets must be an array [begin, end]");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "whole numbers");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "whole numbers");
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "not a range inside");
}

static void test_reader_rejects_bad_layout(void **state)
{
    (void)state;
    /* Truncated: a valid file cut short. */
    craft("{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", HLEN, 10);
    expect_open_error(ZT_EFORMAT, "tensor 't'", "truncated");
    /* Overlap. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
          HLEN, 12);
    expect_open_error(ZT_EFORMAT, "tensor 'b'", "overlaps");
    /* Two tensors on the same bytes. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
          HLEN, 8);
    expect_open_error(ZT_EFORMAT, "overlaps", NULL);
    /* Gap between tensors. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
          HLEN, 20);
    expect_open_error(ZT_EFORMAT, "gap of 4 bytes", "tensor 'b'");
    /* Gap at the start. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", HLEN, 12);
    expect_open_error(ZT_EFORMAT, "gap of 4 bytes", "tensor 'a'");
    /* Bytes after the last tensor. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", HLEN, 12);
    expect_open_error(ZT_EFORMAT, "cover 8 bytes of the 12-byte data buffer", NULL);
    /* No tensors but data. */
    craft("{}", HLEN, 4);
    expect_open_error(ZT_EFORMAT, "cover 0 bytes", NULL);
    /* Duplicate name. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
          HLEN, 8);
    expect_open_error(ZT_EFORMAT, "tensor 'a' appears twice", NULL);
}

static void test_reader_rejects_bad_metadata(void **state)
{
    (void)state;
    craft("{\"__metadata__\":\"pt\"}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "__metadata__ must be an object", NULL);
    craft("{\"__metadata__\":[\"a\"]}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "__metadata__ must be an object", NULL);
    craft("{\"__metadata__\":{\"step\":10}}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "__metadata__ entry 'step' must be a string", NULL);
    craft("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "__metadata__ entry 'k' appears twice", NULL);
    craft("{\"__metadata__\":{},\"__metadata__\":{}}", HLEN, 0);
    expect_open_error(ZT_EFORMAT, "__metadata__ appears twice", NULL);
    craft("{\"__metadata__\":{\"format\":\"pt\"}}", HLEN, 0);
    zt_st_file *f = open_ok();
    assert_string_equal(zt_st_metadata(f, "format"), "pt");
    zt_st_close(f);
}

/* Every half-precision value widens to the float that ldexpf computes from its fields; BF16 is the top
 * half of a float; F32 reads from any alignment. */
static void test_element_f32(void **state)
{
    (void)state;
    uint16_t *h = malloc(65536 * sizeof *h);
    assert_non_null(h);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    zt_st_tensor t = {.name = "h", .dtype = ZT_DTYPE_F16, .ndim = 1, .shape = {65536}, .data = h};
    for (uint32_t i = 0; i < 65536; i++) {
        const int e = (i >> 10) & 0x1f, m = i & 0x3ff;
        const float got = zt_st_element_f32(&t, i);
        if (e == 0x1f) {
            assert_true(m == 0 ? isinf(got) : isnan(got));
            assert_true((signbit(got) != 0) == ((i & 0x8000) != 0));
            continue;
        }
        float want = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), e - 25);
        if (i & 0x8000)
            want = -want;
        uint32_t gb, wb;
        memcpy(&gb, &got, 4);
        memcpy(&wb, &want, 4);
        if (gb != wb)
            fail_msg("half 0x%04x: got %a, expected %a", (unsigned)i, (double)got, (double)want);
    }
    free(h);

    const uint16_t bf[3] = {0x3f80, 0xc040, 0x0001}; /* 1, -3, the smallest subnormal */
    t = (zt_st_tensor){.name = "b", .dtype = ZT_DTYPE_BF16, .ndim = 1, .shape = {3}, .data = bf};
    assert_true(zt_st_element_f32(&t, 0) == 1.0f);
    assert_true(zt_st_element_f32(&t, 1) == -3.0f);
    assert_true(zt_st_element_f32(&t, 2) == ldexpf(1.0f, -133));
    unsigned char raw[9];
    const float x = -1.25f;
    memcpy(raw + 5, &x, 4);
    t = (zt_st_tensor){.name = "f", .dtype = ZT_DTYPE_F32, .ndim = 1, .shape = {2}, .data = raw + 1};
    assert_true(zt_st_element_f32(&t, 1) == x);
    assert_true(zt_st_dtype_is_f32_readable(ZT_DTYPE_F32) && zt_st_dtype_is_f32_readable(ZT_DTYPE_F16) &&
                zt_st_dtype_is_f32_readable(ZT_DTYPE_BF16));
    assert_false(zt_st_dtype_is_f32_readable(ZT_DTYPE_F64) || zt_st_dtype_is_f32_readable(ZT_DTYPE_I32));
}

/* A tensor's pages given back (zt_st_release, zt_st_copy_out) read the same values again: they come from the file. */
static void test_release_reads_again(void **state)
{
    (void)state;
    enum { N = 5000 }; /* a few pages, so that a range's neighbours are given back too */
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *out = malloc(N * sizeof *out);
    for (int i = 0; i < N; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = -(float)i;
    }
    zt_err err = {{0}};
    zt_st_writer *w = zt_st_writer_create();
    const int64_t shape[1] = {N};
    assert_int_equal(zt_st_writer_add(w, "a", ZT_DTYPE_F32, 1, shape, a, &err), 0);
    assert_int_equal(zt_st_writer_add(w, "b", ZT_DTYPE_F32, 1, shape, b, &err), 0);
    assert_int_equal(zt_st_writer_write(w, g_path, &err), 0);
    zt_st_writer_destroy(w);
    zt_st_file *f = open_ok();
    const zt_st_tensor *ta = zt_st_find(f, "a"), *tb = zt_st_find(f, "b");
    assert_memory_equal(ta->data, a, N * sizeof *a);
    zt_st_release(f, ta);
    assert_memory_equal(ta->data, a, N * sizeof *a);
    assert_memory_equal(tb->data, b, N * sizeof *b); /* the neighbour's page given back with it reads the same */
    zt_st_copy_out(f, tb, 4 * 1000, out, 4 * 3000);
    assert_memory_equal(out, b + 1000, 3000 * sizeof *b);
    assert_memory_equal(tb->data, b, N * sizeof *b);
    zt_st_close(f);
    free(a);
    free(b);
    free(out);
}

/* Writes text to the file dir/name. */
static void write_text(const char *name, const char *text)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The three forms of a checkpoint: a file, an index (each shard once, in order of first mention, beside
 * the index), a directory (its model.safetensors first, else its index); and the refusals. */
static void test_shard_files(void **state)
{
    (void)state;
    char **files = NULL, path[160], want[160];
    int n = -1;
    zt_err err = {{0}};
    /* A file is itself, whether it exists or not (opening it reports what is wrong). */
    assert_int_equal(zt_st_shard_files("/nonexistent/x.safetensors", &files, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(files[0], "/nonexistent/x.safetensors");
    zt_st_shard_files_free(files, n);

    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 8}, \"weight_map\": {\"a\": \"s2.safetensors\", "
               "\"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", g_dir);
    for (int form = 0; form < 2; form++) {
        assert_int_equal(zt_st_shard_files(form ? g_dir : path, &files, &n, &err), 0);
        assert_int_equal(n, 2);
        snprintf(want, sizeof want, "%s/s2.safetensors", g_dir);
        assert_string_equal(files[0], want);
        snprintf(want, sizeof want, "%s/s1.safetensors", g_dir);
        assert_string_equal(files[1], want);
        zt_st_shard_files_free(files, n);
    }
    /* A directory's model.safetensors comes before its index. */
    write_text("model.safetensors", "");
    assert_int_equal(zt_st_shard_files(g_dir, &files, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(files[0], g_path);
    zt_st_shard_files_free(files, n);

    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"not json", "weight_map"},
        {"{\"weight_map\": {}}", "weight_map"},
        {"{\"weight_map\": [\"a\"]}", "weight_map"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"w\": \"../x.safetensors\"}}", "'w'"},
        {"{\"weight_map\": {\"w\": \"..\"}}", "in the index's folder"},
        {"{\"weight_map\": {\"w\": 3}}", "'w'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text("model.safetensors.index.json", bad[i].text);
        files = (char **)&err; /* must be reset */
        n = -1;
        memset(&err, 0, sizeof err);
        int rc = zt_st_shard_files(path, &files, &n, &err);
        if (rc != ZT_EFORMAT || !strstr(err.msg, bad[i].needle) || !strstr(err.msg, path))
            fail_msg("case %zu: rc %d, message '%s'", i, rc, err.msg);
        assert_null(files);
        assert_int_equal(n, 0);
    }
    assert_true(zt_st_shard_files("/nonexistent/model.safetensors.index.json", &files, &n, &err) < 0);
    assert_null(files);
    /* A directory with neither file. */
    unlink(g_path);
    unlink(path);
    assert_int_equal(zt_st_shard_files(g_dir, &files, &n, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "model.safetensors.index.json"));
    assert_null(files);
    assert_int_equal(n, 0);
}

/* A checkpoint written in shards of at most 100 bytes: tensors in order, a large one alone, the index
 * naming each tensor's shard and the total size; zt_st_shard_files finds the shards again. With room
 * for everything, one model.safetensors and no index. */
static void test_write_sharded(void **state)
{
    (void)state;
    static const float data[64];
    const int64_t sizes[5] = {10, 12, 40, 3, 5}; /* floats: 40, 48, 160, 12 and 20 bytes */
    const int want_shard[5] = {1, 1, 2, 3, 3};
    zt_err err = {{0}};
    zt_st_writer *w = zt_st_writer_create();
    char name[32], dir[160], path[200];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(zt_st_writer_add(w, name, ZT_DTYPE_F32, 1, &sizes[i], data, &err), 0);
    }
    assert_int_equal(zt_st_writer_add_metadata(w, "format", "pt", &err), 0);
    snprintf(dir, sizeof dir, "%s/sharded", g_dir);
    int n = 0;
    if (zt_st_writer_write_sharded(w, dir, 100, &n, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(n, 3);
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-00003.safetensors", dir, want_shard[i]);
        zt_st_file *f = NULL;
        assert_int_equal(zt_st_open(path, &f, &err), 0);
        snprintf(name, sizeof name, "t%d", i);
        const zt_st_tensor *t = zt_st_find(f, name);
        assert_non_null(t);
        assert_int_equal(t->shape[0], sizes[i]);
        assert_string_equal(zt_st_metadata(f, "format"), "pt");
        zt_st_close(f);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char text[1024];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    assert_non_null(strstr(text, "\"total_size\":\t280"));
    assert_non_null(strstr(text, "\"t2\":\t\"model-00002-of-00003.safetensors\""));
    char **files = NULL;
    assert_int_equal(zt_st_shard_files(dir, &files, &n, &err), 0);
    assert_int_equal(n, 3);
    snprintf(path, sizeof path, "%s/model-00003-of-00003.safetensors", dir);
    assert_string_equal(files[2], path);
    zt_st_shard_files_free(files, n);

    snprintf(dir, sizeof dir, "%s/whole", g_dir);
    assert_int_equal(zt_st_writer_write_sharded(w, dir, 280, &n, &err), 0);
    assert_int_equal(n, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_true(exists(path));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_false(exists(path));
    assert_int_equal(zt_st_writer_write_sharded(w, dir, 0, &n, &err), ZT_EINVAL_CONFIG);
    zt_st_writer_destroy(w);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        T(test_round_trip_all_dtypes),
        T(test_header_layout),
        T(test_empty_file_round_trip),
        T(test_writer_rejects_bad_tensors),
        T(test_writer_failure_leaves_nothing),
        T(test_reader_orders_by_offset),
        T(test_reader_rejects_bad_sizes),
        T(test_reader_rejects_bad_headers),
        T(test_reader_rejects_bad_entries),
        T(test_reader_rejects_bad_layout),
        T(test_reader_rejects_bad_metadata),
        cmocka_unit_test(test_element_f32),
        T(test_release_reads_again),
        T(test_shard_files),
        T(test_write_sharded),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
