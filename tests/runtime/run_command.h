/* Runs one `ztrain` subcommand function (worker/cli/commands.h) in a forked child with its stdout and
 * stderr captured, for the tests of commands that print and exit. Include after <cmocka.h>. */
#ifndef ZT_TESTS_RUN_COMMAND_H
#define ZT_TESTS_RUN_COMMAND_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs cmd(argc, argv) (argv NULL-terminated) in a child, captures what it prints into out (NUL-terminated,
 * at most cap - 1 bytes), and returns its exit status (128 + the signal if it died of one). */
static inline int zt_test_run_command(int (*cmd)(int, char **), char **argv, char *out, size_t cap)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        int argc = 0;
        while (argv[argc])
            argc++;
        int rc = cmd(argc, argv);
        fflush(NULL);
        _exit(rc);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < cap && (n = read(fds[0], out + got, cap - 1 - got)) > 0)
        got += (size_t)n;
    out[got] = '\0';
    close(fds[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#endif
