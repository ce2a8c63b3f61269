/* Tests of the tokenizer (worker/data/tokenize.h) and of `ztrain tokenize` (zt_cmd_tokenize): round trips,
 * the shards it writes read back through the data loader's format, and its usage and runtime errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/cli/commands.h"
#include "worker/data/dataloader.h"
#include "worker/data/tokenize.h"

static char g_dir[256];

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
        remove_tree(p);
    }
    closedir(d);
    rmdir(path);
}

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/zt_test_tokenize_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(g_dir);
    return 0;
}

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void write_file(const char *name, const void *data, size_t len)
{
    char p[512];
    path_of(p, sizeof(p), name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* Runs zt_cmd_tokenize with a NULL-terminated list of arguments (after the command name). */
static int run_tokenize(const char *first, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "tokenize";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL; a = va_arg(ap, const char *)) {
        assert_true(argc < 31);
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    fflush(stdout);
    return zt_cmd_tokenize(argc, argv);
}

/* Reads a shard with plain stdio (not the loader) and checks its header; returns its tokens. */
static uint16_t *read_shard(const char *name, size_t *n)
{
    char p[512];
    path_of(p, sizeof(p), name);
    FILE *f = fopen(p, "rb");
    if (!f)
        fail_msg("missing shard %s", p);
    int32_t header[ZT_SHARD_HEADER_INTS];
    assert_int_equal(fread(header, sizeof(header), 1, f), 1);
    assert_int_equal(header[0], ZT_SHARD_MAGIC);
    assert_int_equal(header[1], ZT_SHARD_VERSION);
    assert_true(header[2] >= 0);
    *n = (size_t)header[2];
    uint16_t *t = malloc(*n * 2 + 2);
    assert_non_null(t);
    assert_int_equal(fread(t, 2, *n, f), *n);
    assert_int_equal(fgetc(f), EOF); /* nothing after the tokens */
    fclose(f);
    return t;
}

static bool exists(const char *name)
{
    char p[512];
    path_of(p, sizeof(p), name);
    return access(p, F_OK) == 0;
}

/* Number of entries in folder `name` of the temporary folder, not counting . and .. */
static int count_entries(const char *name)
{
    char p[512];
    path_of(p, sizeof(p), name);
    DIR *d = opendir(p);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void test_bytes_round_trip(void **state)
{
    (void)state;
    zt_tokenizer *tok;
    zt_err err;
    assert_int_equal(zt_tokenizer_create(&tok, "bytes", &err), 0);
    assert_string_equal(zt_tokenizer_kind(tok), "bytes");
    assert_int_equal(zt_tokenizer_vocab_size(tok), 256);

    unsigned char text[300];
    for (int i = 0; i < 256; i++)
        text[i] = (unsigned char)i;
    memcpy(text + 256, "caf\xc3\xa9 \xe2\x82\xac\n", 10); /* UTF-8, and every byte value above */
    int32_t *t;
    size_t n;
    assert_int_equal(zt_tokenizer_encode(tok, text, 266, &t, &n, &err), 0);
    assert_int_equal(n, 266);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(t[i], text[i]);
    char *back;
    size_t len;
    assert_int_equal(zt_tokenizer_decode(tok, t, n, &back, &len, &err), 0);
    assert_int_equal(len, 266);
    assert_memory_equal(back, text, 266);
    assert_int_equal(back[len], '\0');
    free(back);

    const char *b;
    assert_int_equal(zt_tokenizer_token_bytes(tok, 'A', &b, &len, &err), 0);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], 'A');

    /* Empty text: no tokens; out-of-vocabulary tokens: an error naming the token. */
    free(t);
    assert_int_equal(zt_tokenizer_encode(tok, "", 0, &t, &n, &err), 0);
    assert_int_equal(n, 0);
    free(t);
    const int32_t bad[3] = {65, 256, 66};
    assert_int_equal(zt_tokenizer_decode(tok, bad, 3, &back, &len, &err), ZT_EMISMATCH);
    assert_null(back);
    assert_non_null(strstr(err.msg, "token 256"));
    assert_int_equal(zt_tokenizer_token_bytes(tok, -1, &b, &len, &err), ZT_EMISMATCH);
    zt_tokenizer_destroy(tok);
    zt_tokenizer_destroy(NULL);

    tok = (zt_tokenizer *)0x1;
    assert_int_equal(zt_tokenizer_create(&tok, "gpt2-bpe", &err), ZT_EINVAL_CONFIG);
    assert_null(tok);
    assert_non_null(strstr(err.msg, "gpt2-bpe"));
}

/* A text of n bytes whose content depends on the position. */
static char *make_text(size_t n)
{
    char *s = malloc(n);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)(unsigned char)((i * 7 + i / 251) & 0xff);
    return s;
}

static void test_cmd_writes_train_and_val_shards(void **state)
{
    (void)state;
    /* Two inputs, 700 + 300 bytes: 900 train tokens (shards of 400, 400, 100) and 100 val tokens. */
    char *text = make_text(1000);
    write_file("a.txt", text, 700);
    write_file("b.txt", text + 700, 300);
    char in_a[512], in_b[512], out[512];
    path_of(in_a, sizeof(in_a), "a.txt");
    path_of(in_b, sizeof(in_b), "b.txt");
    path_of(out, sizeof(out), "out/sub");
    int rc = run_tokenize("--input", in_a, "--input", in_b, "--out-dir", out, "--val-fraction", "0.1",
                          "--shard-tokens", "400", "--name", "demo", NULL);
    assert_int_equal(rc, 0);

    const char *files[4] = {"out/sub/demo_train_000000.bin", "out/sub/demo_train_000001.bin",
                            "out/sub/demo_train_000002.bin", "out/sub/demo_val_000000.bin"};
    const size_t sizes[4] = {400, 400, 100, 100};
    size_t offset = 0;
    for (int f = 0; f < 4; f++) {
        size_t n;
        uint16_t *t = read_shard(files[f], &n);
        assert_int_equal(n, sizes[f]);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(t[i], (unsigned char)text[offset + i]);
        offset += n;
        free(t);
    }
    assert_int_equal(offset, 1000);
    assert_false(exists("out/sub/demo_train_000003.bin"));
    assert_false(exists("out/sub/demo_val_000001.bin"));
    assert_int_equal(count_entries("out/sub"), 4); /* no temporary files left */

    /* The loader reads them: 900 train tokens, windows of 2*16+1. */
    char pat[600];
    snprintf(pat, sizeof(pat), "%s/demo_train_*.bin", out);
    zt_dataloader *dl;
    zt_err err;
    assert_int_equal(zt_dataloader_open(&dl, pat, 2, 16, false, 0, &err), 0);
    assert_int_equal(zt_dataloader_num_tokens(dl), 900);
    assert_int_equal(zt_dataloader_batches_per_epoch(dl), 12 + 12 + 3);
    int32_t in[32], tg[32];
    zt_dataloader_next(dl, in, tg);
    for (int i = 0; i < 32; i++) {
        assert_int_equal(in[i], (unsigned char)text[i]);
        assert_int_equal(tg[i], (unsigned char)text[i + 1]);
    }
    zt_dataloader_close(dl);

    /* Running again with the same flags replaces the same files. */
    rc = run_tokenize("--input", in_a, "--input", in_b, "--out-dir", out, "--shard-tokens", "400", "--name",
                      "demo", NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(count_entries("out/sub"), 4);
    free(text);
}

static void test_cmd_defaults(void **state)
{
    (void)state;
    /* Default name (the input's stem), default fraction 0.1 and one shard per split. */
    char *text = make_text(12345);
    write_file("my corpus.v1.txt", text, 12345);
    char in[512], out[512];
    path_of(in, sizeof(in), "my corpus.v1.txt");
    path_of(out, sizeof(out), "o");
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, NULL), 0);
    size_t ntrain, nval;
    uint16_t *tr = read_shard("o/my_corpus.v1_train_000000.bin", &ntrain);
    uint16_t *va = read_shard("o/my_corpus.v1_val_000000.bin", &nval);
    assert_int_equal(nval, 1235); /* round(12345 * 0.1) = 1234.5 -> 1235 */
    assert_int_equal(ntrain + nval, 12345);
    assert_int_equal(va[0], (unsigned char)text[ntrain]);
    assert_int_equal(tr[0], (unsigned char)text[0]);
    free(tr);
    free(va);

    /* --val-fraction 0: no validation shard at all. */
    path_of(out, sizeof(out), "o0");
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--val-fraction", "0", "--name", "x", NULL), 0);
    assert_true(exists("o0/x_train_000000.bin"));
    assert_false(exists("o0/x_val_000000.bin"));
    free(text);
}

static void test_cmd_help_and_usage_errors(void **state)
{
    (void)state;
    write_file("in.txt", "hello world\n", 12);
    char in[512], out[512];
    path_of(in, sizeof(in), "in.txt");
    path_of(out, sizeof(out), "o");

    assert_int_equal(run_tokenize("--help", NULL), 0);
    assert_int_equal(run_tokenize(NULL), 2);                                          /* nothing given */
    assert_int_equal(run_tokenize("--out-dir", out, NULL), 2);                        /* no --input */
    assert_int_equal(run_tokenize("--input", in, NULL), 2);                           /* no --out-dir */
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--bogus", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "-x", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", NULL), 2);              /* missing value */
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "extra.txt", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--val-fraction", "abc", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--val-fraction", "1.5", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--val-fraction", "-0.1", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--shard-tokens", "0", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--shard-tokens", "12x", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--name", "a/b", NULL), 2);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--name", "", NULL), 2);
    assert_int_equal(run_tokenize("--input", "", "--out-dir", out, NULL), 2);
    /* None of these wrote anything. */
    assert_false(exists("o"));
}

static void test_cmd_runtime_errors(void **state)
{
    (void)state;
    write_file("in.txt", "hello world\n", 12);
    write_file("empty.txt", "", 0);
    write_file("one.txt", "x", 1);
    write_file("afile", "not a folder", 12);
    char in[512], empty[512], one[512], missing[512], out[512], bad_out[512];
    path_of(in, sizeof(in), "in.txt");
    path_of(empty, sizeof(empty), "empty.txt");
    path_of(one, sizeof(one), "one.txt");
    path_of(missing, sizeof(missing), "missing.txt");
    path_of(out, sizeof(out), "o");
    path_of(bad_out, sizeof(bad_out), "afile/sub");

    assert_int_equal(run_tokenize("--input", missing, "--out-dir", out, NULL), 1);
    assert_int_equal(run_tokenize("--input", in, "--input", missing, "--out-dir", out, NULL), 1);
    assert_int_equal(run_tokenize("--input", empty, "--out-dir", out, NULL), 1);
    assert_int_equal(run_tokenize("--input", empty, "--input", empty, "--out-dir", out, NULL), 1);
    assert_int_equal(run_tokenize("--input", one, "--out-dir", out, NULL), 1); /* nothing left to train on */
    assert_int_equal(run_tokenize("--input", g_dir, "--out-dir", out, NULL), 1); /* a folder as input */
    assert_false(exists("o"));
    assert_int_equal(run_tokenize("--input", in, "--out-dir", bad_out, NULL), 1); /* unwritable output */
    assert_int_equal(count_entries(""), 4);
}

static void test_cmd_refuses_stale_shards(void **state)
{
    (void)state;
    char *text = make_text(1000);
    write_file("in.txt", text, 1000);
    char in[512], out[512];
    path_of(in, sizeof(in), "in.txt");
    path_of(out, sizeof(out), "o");
    /* Shards of 300: train 900 = 3 files, val 100 = 1 file. */
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--shard-tokens", "300", "--name", "c", NULL), 0);
    assert_int_equal(count_entries("o"), 4);
    /* Larger shards would leave c_train_000001/2 behind: refused, and nothing is changed. */
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--shard-tokens", "1000", "--name", "c", NULL),
                     1);
    assert_int_equal(count_entries("o"), 4);
    size_t n;
    uint16_t *t = read_shard("o/c_train_000000.bin", &n);
    assert_int_equal(n, 300);
    free(t);
    /* Another name in the same folder is fine. */
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--shard-tokens", "1000", "--name", "d", NULL), 0);
    assert_int_equal(count_entries("o"), 6);
    free(text);
}

static void test_cmd_failed_write_leaves_nothing(void **state)
{
    (void)state;
    char *text = make_text(1000);
    write_file("in.txt", text, 1000);
    char in[512], out[512], blocker[512];
    path_of(in, sizeof(in), "in.txt");
    path_of(out, sizeof(out), "o");
    /* A folder where the validation shard must go: the train shards are written first, then the val
     * write fails, and the train shards are removed again. */
    path_of(blocker, sizeof(blocker), "o/c_val_000000.bin");
    assert_int_equal(mkdir(out, 0755), 0);
    assert_int_equal(mkdir(blocker, 0755), 0);
    assert_int_equal(run_tokenize("--input", in, "--out-dir", out, "--shard-tokens", "300", "--name", "c", NULL), 1);
    assert_int_equal(count_entries("o"), 1);
    assert_true(exists("o/c_val_000000.bin"));
    assert_false(exists("o/c_train_000000.bin"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_round_trip),
        cmocka_unit_test_setup_teardown(test_cmd_writes_train_and_val_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cmd_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cmd_help_and_usage_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cmd_runtime_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cmd_refuses_stale_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cmd_failed_write_leaves_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
