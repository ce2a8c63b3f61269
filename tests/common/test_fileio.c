/* Tests of common/fileio: whole-file reads, atomic writes (no temp file left on success or failure),
 * mkdir -p, the writability probe and fsync of directories, with the messages users see. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/fileio.h"

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/zt_test_fileio_XXXXXX");
    return mkdtemp(g_dir) != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int entries_in(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static void test_write_then_read(void **state)
{
    (void)state;
    char path[256], tmp[300];
    path_in(path, sizeof(path), "a.txt");
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    zt_err err = {{0}};
    assert_int_equal(zt_write_file_atomic(path, "hello\n", 6, &err), 0);
    assert_false(exists(tmp));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644); /* main sets umask 022 */

    char *text = NULL;
    size_t len = 0;
    assert_int_equal(zt_read_file(path, &text, &len, &err), 0);
    assert_int_equal(len, 6);
    assert_string_equal(text, "hello\n");
    free(text);

    /* Overwrite replaces the whole content. */
    assert_int_equal(zt_write_file_atomic(path, "x", 1, &err), 0);
    assert_int_equal(zt_read_file(path, &text, &len, &err), 0);
    assert_int_equal(len, 1);
    assert_string_equal(text, "x");
    free(text);

    /* Empty file. */
    assert_int_equal(zt_write_file_atomic(path, NULL, 0, &err), 0);
    assert_int_equal(zt_read_file(path, &text, &len, &err), 0);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
    assert_false(exists(tmp));
}

static void test_write_parts_and_large_read(void **state)
{
    (void)state;
    char path[256];
    path_in(path, sizeof(path), "big.bin");
    size_t n = 300000;
    unsigned char *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 31 + 7);
    zt_file_part parts[4] = {{data, 1000}, {NULL, 0}, {data + 1000, n - 1000 - 5}, {data + n - 5, 5}};
    zt_err err = {{0}};
    assert_int_equal(zt_write_file_atomic_parts(path, parts, 4, &err), 0);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(zt_read_file(path, &text, &len, &err), 0);
    assert_int_equal(len, n);
    assert_memory_equal(text, data, n);
    assert_int_equal(text[n], '\0');
    free(text);
    free(data);
}

/* /proc files report size 0: the reader must grow its buffer as it goes. */
static void test_read_unsized_file(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    zt_err err = {{0}};
    assert_int_equal(zt_read_file("/proc/self/status", &text, &len, &err), 0);
    assert_true(len > 0);
    assert_int_equal(strlen(text), len);
    assert_non_null(strstr(text, "Name:"));
    free(text);
}

static void test_read_errors(void **state)
{
    (void)state;
    char path[256], want[400];
    path_in(path, sizeof(path), "missing.txt");
    char *text = (char *)0x1;
    size_t len = 99;
    zt_err err = {{0}};
    assert_int_equal(zt_read_file(path, &text, &len, &err), -ENOENT);
    snprintf(want, sizeof(want), "cannot read %s: No such file or directory", path);
    assert_string_equal(err.msg, want);
    assert_ptr_equal(text, (char *)0x1);
    assert_int_equal(len, 99);

    assert_int_equal(zt_read_file(g_dir, &text, &len, &err), -EISDIR);
    assert_non_null(strstr(err.msg, "Is a directory"));
}

static void test_write_failures_leave_nothing(void **state)
{
    (void)state;
    zt_err err = {{0}};
    char path[256], tmp[300];

    /* Missing parent directory: the temp file cannot even be created. */
    path_in(path, sizeof(path), "no/such/dir/f.txt");
    assert_int_equal(zt_write_file_atomic(path, "abc", 3, &err), -ENOENT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "No such file or directory"));

    /* The target is a directory: writing works, the rename fails, the temp file must go. */
    path_in(path, sizeof(path), "target_dir");
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int rc = zt_write_file_atomic(path, "abc", 3, &err);
    assert_true(rc == -EISDIR || rc == -ENOTEMPTY || rc == -EEXIST);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "rename"));
    assert_false(exists(tmp));
    assert_int_equal(entries_in(path), 0);
    rmdir(path);
}

static void test_mkdir_p(void **state)
{
    (void)state;
    zt_err err = {{0}};
    char path[256];
    path_in(path, sizeof(path), "x/y//z/");
    assert_int_equal(zt_mkdir_p(path, &err), 0);
    assert_int_equal(zt_mkdir_p(path, &err), 0); /* again: already there is fine */
    char check[256];
    path_in(check, sizeof(check), "x/y/z");
    struct stat st;
    assert_int_equal(stat(check, &st), 0);
    assert_true(S_ISDIR(st.st_mode));

    /* A regular file in the way. */
    char file[256];
    path_in(file, sizeof(file), "plain");
    assert_int_equal(zt_write_file_atomic(file, "1", 1, &err), 0);
    path_in(path, sizeof(path), "plain/sub");
    assert_int_equal(zt_mkdir_p(path, &err), -ENOTDIR);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "Not a directory"));
    assert_int_equal(zt_mkdir_p(file, &err), -ENOTDIR);

    assert_int_equal(zt_mkdir_p("", &err), -ENOENT);
}

static void test_check_writable_dir(void **state)
{
    (void)state;
    zt_err err = {{0}};
    char path[256], want[512];
    path_in(path, sizeof(path), "out/run1");
    assert_int_equal(zt_check_writable_dir(path, &err), 0);
    assert_int_equal(entries_in(path), 0); /* the probe file is gone */

    char file[256];
    path_in(file, sizeof(file), "afile");
    assert_int_equal(zt_write_file_atomic(file, "1", 1, &err), 0);
    path_in(path, sizeof(path), "afile/out");
    assert_int_equal(zt_check_writable_dir(path, &err), -ENOTDIR);
    snprintf(want, sizeof(want),
             "cannot write to output directory '%s': Not a directory (choose another --out or fix its permissions)", path);
    assert_string_equal(err.msg, want);

    /* Permission checks do not apply to root, who can write anywhere. */
    if (geteuid() != 0) {
        path_in(path, sizeof(path), "locked");
        assert_int_equal(mkdir(path, 0555), 0);
        assert_int_equal(zt_check_writable_dir(path, &err), -EACCES);
        snprintf(want, sizeof(want),
                 "cannot write to output directory '%s': Permission denied (choose another --out or fix its "
                 "permissions)",
                 path);
        assert_string_equal(err.msg, want);
        char sub[300];
        snprintf(sub, sizeof(sub), "%s/sub", path);
        assert_int_equal(zt_check_writable_dir(sub, &err), -EACCES);
        chmod(path, 0755);
    }
}

/* zt_fsync_dir and zt_fsync_parent_dir: success on a directory, and messages naming the directory for
 * one that is missing or not a directory. */
static void test_fsync_dir(void **state)
{
    (void)state;
    zt_err err = {{0}};
    char path[256], want[512];
    assert_int_equal(zt_fsync_dir(g_dir, &err), 0);

    path_in(path, sizeof(path), "missing");
    assert_int_equal(zt_fsync_dir(path, &err), -ENOENT);
    snprintf(want, sizeof(want), "cannot open directory %s to sync it: No such file or directory", path);
    assert_string_equal(err.msg, want);

    path_in(path, sizeof(path), "afile");
    assert_int_equal(zt_write_file_atomic(path, "1", 1, &err), 0);
    assert_int_equal(zt_fsync_dir(path, &err), -ENOTDIR);
    assert_non_null(strstr(err.msg, path));

    /* The parent of a file in g_dir is g_dir, whether the file exists or not. */
    assert_int_equal(zt_fsync_parent_dir(path, &err), 0);
    path_in(path, sizeof(path), "not-yet");
    assert_int_equal(zt_fsync_parent_dir(path, &err), 0);
    assert_int_equal(zt_fsync_parent_dir("bare-name", &err), 0); /* "." */

    path_in(path, sizeof(path), "missing/file");
    assert_int_equal(zt_fsync_parent_dir(path, &err), -ENOENT);
    path_in(path, sizeof(path), "missing");
    snprintf(want, sizeof(want), "cannot open directory %s to sync it: No such file or directory", path);
    assert_string_equal(err.msg, want);

    size_t n = 5000;
    char *longp = malloc(n + 1);
    assert_non_null(longp);
    memset(longp, 'a', n);
    longp[n - 2] = '/';
    longp[n] = '\0';
    assert_int_equal(zt_fsync_parent_dir(longp, &err), -ENAMETOOLONG);
    assert_int_equal(strncmp(err.msg, "cannot sync the directory of aaa", 32), 0); /* truncated to ZT_ERR_LEN */
    free(longp);
}

int main(void)
{
    umask(022);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_then_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_parts_and_large_read, setup, teardown),
        cmocka_unit_test(test_read_unsized_file),
        cmocka_unit_test_setup_teardown(test_read_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_failures_leave_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mkdir_p, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_writable_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fsync_dir, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
