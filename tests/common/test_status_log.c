/* Tests of common/status (codes, messages, the invariant abort, aborting allocators) and common/log
 * (line format, levels, rank prefix, ZT_LOG_LEVEL, truncation of long lines). */
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "common/status.h"

/* ---- shared test code ---- */

/* Runs fn with stderr redirected to a temporary file and returns what it wrote (malloc'd). */
static char *capture_stderr(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/zt_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    fn(arg);
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)size, 0), size);
    close(fd);
    return text;
}

static int count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        n += *p == '\n';
    return n;
}

/* True when every line of text matches the extended regular expression re. */
static int lines_match(const char *text, const char *re)
{
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    int ok = 1;
    char *copy = strdup(text);
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
        if (regexec(&rx, line, 0, NULL, 0) != 0)
            ok = 0;
    free(copy);
    regfree(&rx);
    return ok;
}

#define TS "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "

/* ---- status ---- */

static void test_strerror_codes(void **state)
{
    (void)state;
    const int codes[] = {ZT_OK,          ZT_EINVAL_CONFIG, ZT_EFORMAT, ZT_ECHECKSUM, ZT_EMISMATCH,
                         ZT_EUNSUPPORTED, ZT_ENOMEM,        ZT_EIO,     ZT_ESTATE};
    const size_t n = sizeof(codes) / sizeof(codes[0]);
    for (size_t i = 0; i < n; i++) {
        const char *s = zt_strerror(codes[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        assert_string_not_equal(s, "unknown status code");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, zt_strerror(codes[j]));
    }
    assert_string_equal(zt_strerror(-ENOENT), strerror(ENOENT));
    assert_string_equal(zt_strerror(-EACCES), strerror(EACCES));
    /* An errno number the C library does not know: still a stable string. */
    const char *unknown = zt_strerror(-999);
    assert_non_null(unknown);
    (void)strerror(998);
    assert_string_equal(zt_strerror(-999), unknown);
    assert_string_equal(zt_strerror(-1500), "unknown status code");
    assert_string_equal(zt_strerror(7), "unknown status code");
}

static void test_fail_formats_and_returns(void **state)
{
    (void)state;
    zt_err err = {{0}};
    assert_int_equal(zt_fail(&err, ZT_EFORMAT, "%s: header is %d bytes", "x.bin", 12), ZT_EFORMAT);
    assert_string_equal(err.msg, "x.bin: header is 12 bytes");
    assert_int_equal(zt_fail(NULL, -EIO, "ignored %d", 1), -EIO);

    char longer[2 * ZT_ERR_LEN];
    memset(longer, 'a', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    assert_int_equal(zt_fail(&err, ZT_EIO, "%s", longer), ZT_EIO);
    assert_int_equal(strlen(err.msg), ZT_ERR_LEN - 1);
}

static void test_err_prefix(void **state)
{
    (void)state;
    zt_err err;
    zt_fail(&err, ZT_EINVAL_CONFIG, "unknown chat template 'x'");
    zt_err_prefix(&err, "--chat-template");
    assert_string_equal(err.msg, "--chat-template: unknown chat template 'x'");
    zt_err_prefix(NULL, "ignored"); /* no message to prefix */
    /* A message that fills the room is cut at its end, never the prefix. */
    memset(err.msg, 'a', sizeof err.msg - 1);
    err.msg[sizeof err.msg - 1] = '\0';
    zt_err_prefix(&err, "flag");
    assert_int_equal(strlen(err.msg), sizeof err.msg - 1);
    assert_memory_equal(err.msg, "flag: aaa", 9);
}

static void test_assert_aborts_with_location(void **state)
{
    (void)state;
    char path[] = "/tmp/zt_test_assert_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(fd, STDERR_FILENO);
        int two = 2;
        ZT_ASSERT(two == 3);
        _exit(0); /* not reached when the assertion works */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    char text[512] = {0};
    assert_true(pread(fd, text, sizeof(text) - 1, 0) > 0);
    close(fd);
    assert_non_null(strstr(text, "ztrain: internal error at "));
    assert_non_null(strstr(text, "test_status_log.c:"));
    assert_non_null(strstr(text, ": two == 3\n"));
}

static void test_xalloc(void **state)
{
    (void)state;
    unsigned char *p = zt_xmalloc(100);
    memset(p, 1, 100);
    free(p);
    p = zt_xcalloc(10, 10);
    for (int i = 0; i < 100; i++)
        assert_int_equal(p[i], 0);
    free(p);
    free(zt_xmalloc(0));
    free(zt_xcalloc(0, 8));
}

/* ---- log ---- */

static void log_levels(void *arg)
{
    (void)arg;
    zt_log_set_rank(-1);
    zt_log_set_level(ZT_LOG_DEBUG);
    ZT_DEBUG("debug %d", 1);
    ZT_INFO("info %s", "two");
    ZT_WARN("warn");
    ZT_ERROR("error");
    zt_log_set_level(ZT_LOG_WARN);
    ZT_DEBUG("hidden");
    ZT_INFO("hidden");
    ZT_WARN("shown");
    zt_log_set_level(ZT_LOG_INFO);
}

static void test_log_format_and_levels(void **state)
{
    (void)state;
    char *out = capture_stderr(log_levels, NULL);
    assert_int_equal(count_lines(out), 5);
    assert_null(strstr(out, "hidden"));
    assert_true(lines_match(out, TS "(DEBUG|INFO |WARN |ERROR) [a-z0-9 ]+$"));
    assert_non_null(strstr(out, "Z DEBUG debug 1\n"));
    assert_non_null(strstr(out, "Z INFO  info two\n"));
    assert_non_null(strstr(out, "Z WARN  warn\n"));
    assert_non_null(strstr(out, "Z ERROR error\n"));
    assert_non_null(strstr(out, "Z WARN  shown\n"));
    free(out);
}

static void log_ranked(void *arg)
{
    (void)arg;
    zt_log_set_rank(3);
    ZT_INFO("step 10/200");
    zt_log_set_rank(-1);
    ZT_INFO("no rank");
}

static void test_log_rank_prefix(void **state)
{
    (void)state;
    char *out = capture_stderr(log_ranked, NULL);
    assert_int_equal(count_lines(out), 2);
    assert_non_null(strstr(out, "Z INFO  [r3] step 10/200\n"));
    assert_non_null(strstr(out, "Z INFO  no rank\n"));
    free(out);
}

static void log_long(void *arg)
{
    ZT_INFO("%s", (const char *)arg);
}

static void test_log_long_line_is_cut(void **state)
{
    (void)state;
    size_t n = 10000;
    char *msg = malloc(n + 1);
    memset(msg, 'x', n);
    msg[n] = '\0';
    char *out = capture_stderr(log_long, msg);
    size_t len = strlen(out);
    assert_int_equal(count_lines(out), 1);
    assert_true(len <= 4096);
    assert_true(len > 4000);
    assert_string_equal(out + len - 4, "...\n");
    free(out);
    free(msg);
}

static void test_log_parse_level(void **state)
{
    (void)state;
    enum zt_log_level level = ZT_LOG_INFO;
    assert_int_equal(zt_log_parse_level("debug", &level), 0);
    assert_int_equal(level, ZT_LOG_DEBUG);
    assert_int_equal(zt_log_parse_level("WARN", &level), 0);
    assert_int_equal(level, ZT_LOG_WARN);
    assert_int_equal(zt_log_parse_level("error", &level), 0);
    assert_int_equal(level, ZT_LOG_ERROR);
    assert_int_equal(zt_log_parse_level("info", &level), 0);
    assert_int_equal(level, ZT_LOG_INFO);
    assert_int_equal(zt_log_parse_level("verbose", &level), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_log_parse_level("", &level), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_log_parse_level(NULL, &level), ZT_EINVAL_CONFIG);
    assert_int_equal(level, ZT_LOG_INFO);
}

/* ZT_LOG_LEVEL is read on first use, so each case runs in a fresh copy of this program. */
static char g_self[4096];

static char *run_child_with_env(const char *value)
{
    char path[] = "/tmp/zt_test_logenv_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        setenv("ZT_LOG_LEVEL", value, 1);
        execl(g_self, g_self, "--log-child", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    assert_int_equal(pread(fd, text, (size_t)size, 0), size);
    close(fd);
    return text;
}

static int log_child_main(void)
{
    ZT_DEBUG("child debug");
    ZT_INFO("child info");
    ZT_WARN("child warn");
    ZT_ERROR("child error");
    return 0;
}

static void test_log_level_from_env(void **state)
{
    (void)state;
    char *out = run_child_with_env("error");
    assert_int_equal(count_lines(out), 1);
    assert_non_null(strstr(out, "ERROR child error\n"));
    free(out);

    out = run_child_with_env("debug");
    assert_int_equal(count_lines(out), 4);
    assert_non_null(strstr(out, "DEBUG child debug\n"));
    free(out);

    /* A bad value: one warning that names it, then the default level (info). */
    out = run_child_with_env("loud");
    assert_int_equal(count_lines(out), 4);
    assert_true(lines_match(out, TS "(INFO |WARN |ERROR) "));
    assert_non_null(strstr(out, "WARN  ZT_LOG_LEVEL='loud'"));
    assert_null(strstr(out, "child debug"));
    assert_non_null(strstr(out, "INFO  child info\n"));
    free(out);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--log-child") == 0)
        return log_child_main();
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
    if (n <= 0)
        return 1;
    g_self[n] = '\0';

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_codes),
        cmocka_unit_test(test_fail_formats_and_returns),
        cmocka_unit_test(test_err_prefix),
        cmocka_unit_test(test_assert_aborts_with_location),
        cmocka_unit_test(test_xalloc),
        cmocka_unit_test(test_log_format_and_levels),
        cmocka_unit_test(test_log_rank_prefix),
        cmocka_unit_test(test_log_long_line_is_cut),
        cmocka_unit_test(test_log_parse_level),
        cmocka_unit_test(test_log_level_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
