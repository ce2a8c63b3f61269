/* `ztrain launch`: starts N worker processes on this host with the torchrun environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), prefixes every line they print with [rN],
 * forwards SIGINT and SIGTERM to them, and when one fails stops the others and exits non-zero naming it.
 *
 *   ztrain launch --nproc 4 train --config run.json       (a ztrain subcommand: runs this ztrain binary)
 *   ztrain launch --nproc 4 -- ztrain train --config run.json
 *   ztrain launch --nproc 2 -- ./my_program args          (any program)
 *
 * Each child runs in its own process group, so a Ctrl-C in the terminal reaches only the launcher, which
 * passes it on once. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "worker/cli/commands.h"

#define LAUNCH_MAX_PROCS 256
#define LAUNCH_KILL_GRACE_S 10.0 /* after SIGTERM, children get this long before SIGKILL */

typedef struct child {
    pid_t pid;
    int fd[2];          /* read ends of its stdout and stderr pipes; -1 once closed */
    char *partial[2];   /* an unfinished last line per stream */
    size_t partial_len[2];
    int status;         /* exit status once reaped, else -1 */
} child;

static volatile sig_atomic_t pending_signal;

static void on_signal(int sig)
{
    pending_signal = sig;
}

static void print_help(FILE *f)
{
    fprintf(f, "usage: ztrain launch --nproc N [--master-addr A] [--master-port P] <subcommand | -- program> "
               "[args...]\n\n"
               "Starts N ranks of a job on this host with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
               "MASTER_ADDR and MASTER_PORT set (as torchrun --nproc-per-node N does), prefixes their output\n"
               "with [rN], forwards Ctrl-C and SIGTERM, and stops every rank when one fails.\n\n"
               "  --nproc N          number of ranks to start (1..%d)\n"
               "  --master-addr A    address of rank 0 (default 127.0.0.1)\n"
               "  --master-port P    rank 0's port; also names the job's shared memory (default 29500);\n"
               "                     give concurrent jobs on one host different ports\n\n"
               "examples:\n"
               "  ztrain launch --nproc 4 train --config examples/demo.json\n"
               "  ztrain launch --nproc 2 -- ztrain train --config examples/demo.json\n\n"
               "exit status: 0 when every rank succeeded; otherwise the first failing rank's status\n",
               LAUNCH_MAX_PROCS);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes one line of rank r to out with the [rN] prefix, unless the line already carries it (ztrain's
 * own log lines do). */
static void emit_line(FILE *out, int rank, const char *line, size_t len)
{
    char tag[16];
    int tl = snprintf(tag, sizeof tag, "[r%d] ", rank);
    if (memmem(line, len, tag, (size_t)tl) == NULL)
        fwrite(tag, 1, (size_t)tl, out);
    fwrite(line, 1, len, out);
    fputc('\n', out);
    fflush(out);
}

/* Reads what is available on stream s of child c and prints the complete lines; closes the fd at EOF
 * (printing an unfinished last line). */
static void pump(child *c, int rank, int s)
{
    char buf[4096];
    ssize_t n = read(c->fd[s], buf, sizeof buf);
    FILE *out = s == 0 ? stdout : stderr;
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        if (c->partial_len[s])
            emit_line(out, rank, c->partial[s], c->partial_len[s]);
        c->partial_len[s] = 0;
        close(c->fd[s]);
        c->fd[s] = -1;
        return;
    }
    c->partial[s] = realloc(c->partial[s], c->partial_len[s] + (size_t)n);
    ZT_ASSERT(c->partial[s]);
    memcpy(c->partial[s] + c->partial_len[s], buf, (size_t)n);
    c->partial_len[s] += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < c->partial_len[s]; i++)
        if (c->partial[s][i] == '\n') {
            emit_line(out, rank, c->partial[s] + start, i - start);
            start = i + 1;
        }
    memmove(c->partial[s], c->partial[s] + start, c->partial_len[s] - start);
    c->partial_len[s] -= start;
}

static void signal_all(child *kids, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (kids[r].status < 0 && kids[r].pid > 0)
            kill(kids[r].pid, sig);
}

/* Starts rank r running argv with the job's environment. Returns the pid, or -1 with a message. */
static pid_t spawn(child *c, int r, int n, const char *addr, int port, char **argv, const char *self)
{
    int out[2], errp[2];
    if (pipe(out) != 0 || pipe(errp) != 0) {
        fprintf(stderr, "ztrain launch: error: cannot create pipes for rank %d: %s\n", r, strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ztrain launch: error: cannot start rank %d: %s\n", r, strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        dup2(out[1], STDOUT_FILENO);
        dup2(errp[1], STDERR_FILENO);
        close(out[0]);
        close(out[1]);
        close(errp[0]);
        close(errp[1]);
        char v[32];
        snprintf(v, sizeof v, "%d", r);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof v, "%d", n);
        setenv("WORLD_SIZE", v, 1);
        setenv("LOCAL_WORLD_SIZE", v, 1);
        setenv("MASTER_ADDR", addr, 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
        if (self)
            execv(self, argv);
        else
            execvp(argv[0], argv);
        fprintf(stderr, "cannot run '%s': %s\n", self ? self : argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(errp[1]);
    c->pid = pid;
    c->fd[0] = out[0];
    c->fd[1] = errp[0];
    c->status = -1;
    return pid;
}

/* `ztrain launch`; see the top of the file. Returns the exit status. */
int zt_cmd_launch(int argc, char **argv)
{
    int nproc = 0, port = 29500;
    const char *addr = "127.0.0.1";
    static const struct option opts[] = {{"nproc", required_argument, 0, 'n'},
                                         {"nproc-per-node", required_argument, 0, 'n'},
                                         {"master-addr", required_argument, 0, 'a'},
                                         {"master-port", required_argument, 0, 'p'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    int ch;
    /* '+': stop at the first non-option, which starts the command to run. */
    while ((ch = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (ch) {
        case 'n':
            nproc = (int)strtol(optarg, &end, 10);
            if (!*optarg || *end || nproc < 1 || nproc > LAUNCH_MAX_PROCS) {
                fprintf(stderr, "ztrain launch: error: --nproc '%s' must be a whole number from 1 to %d\n", optarg,
                        LAUNCH_MAX_PROCS);
                return 2;
            }
            break;
        case 'a':
            addr = optarg;
            break;
        case 'p':
            port = (int)strtol(optarg, &end, 10);
            if (!*optarg || *end || port < 1 || port > 65535) {
                fprintf(stderr, "ztrain launch: error: --master-port '%s' must be a port number from 1 to 65535\n",
                        optarg);
                return 2;
            }
            break;
        case 'h':
            print_help(stdout);
            return 0;
        default:
            fprintf(stderr, "ztrain launch: see ztrain launch --help\n");
            return 2;
        }
    }
    if (nproc == 0 || optind >= argc) {
        fprintf(stderr, "ztrain launch: error: %s (e.g. ztrain launch --nproc 2 train --config run.json)\n",
                nproc == 0 ? "--nproc N is required" : "give the command to run after the flags");
        return 2;
    }
    char **cmd = argv + optind;
    int ncmd = argc - optind;
    /* Without "--" the command is a ztrain subcommand; after "--", "ztrain ..." also runs this very
     * binary (so the ranks run the same build as the launcher), anything else is looked up on PATH. */
    bool dashdash = strcmp(argv[optind - 1], "--") == 0;
    const char *self = NULL;
    char **child_argv = calloc((size_t)ncmd + 2, sizeof *child_argv);
    ZT_ASSERT(child_argv);
    if (!dashdash) {
        self = "/proc/self/exe";
        child_argv[0] = "ztrain";
        memcpy(child_argv + 1, cmd, (size_t)ncmd * sizeof *cmd);
    } else {
        if (strcmp(cmd[0], "ztrain") == 0)
            self = "/proc/self/exe";
        memcpy(child_argv, cmd, (size_t)ncmd * sizeof *cmd);
    }
    char self_path[4096];
    if (self) {
        ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
        if (len > 0) {
            self_path[len] = '\0';
            self = self_path;
        }
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    child *kids = calloc((size_t)nproc, sizeof *kids);
    ZT_ASSERT(kids);
    int started = 0, exit_code = 0, failed_rank = -1;
    for (; started < nproc; started++)
        if (spawn(&kids[started], started, nproc, addr, port, child_argv, self) < 0) {
            exit_code = 1;
            break;
        }
    if (exit_code)
        signal_all(kids, started, SIGTERM);

    double kill_at = exit_code ? now_s() + LAUNCH_KILL_GRACE_S : 0;
    int running = started;
    struct pollfd *pfd = calloc((size_t)started * 2 + 1, sizeof *pfd);
    ZT_ASSERT(pfd);
    while (running > 0) {
        if (pending_signal) {
            int sig = pending_signal;
            pending_signal = 0;
            fprintf(stderr, "ztrain launch: got %s; passing it on to the ranks\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
            signal_all(kids, started, sig);
            if (!exit_code)
                exit_code = 128 + sig;
            if (kill_at == 0)
                kill_at = now_s() + LAUNCH_KILL_GRACE_S * 3;
        }
        int np = 0;
        for (int r = 0; r < started; r++)
            for (int s = 0; s < 2; s++)
                if (kids[r].fd[s] >= 0) {
                    pfd[np].fd = kids[r].fd[s];
                    pfd[np].events = POLLIN;
                    np++;
                }
        if (np > 0) {
            int pr = poll(pfd, (nfds_t)np, 100);
            if (pr > 0)
                for (int r = 0, k = 0; r < started; r++)
                    for (int s = 0; s < 2; s++)
                        if (kids[r].fd[s] >= 0 && pfd[k++].revents)
                            pump(&kids[r], r, s);
        } else {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        for (int r = 0; r < started; r++) {
            int st;
            if (kids[r].status >= 0 || waitpid(kids[r].pid, &st, WNOHANG) != kids[r].pid)
                continue;
            /* drain what it left in its pipes before reporting */
            for (int s = 0; s < 2; s++)
                while (kids[r].fd[s] >= 0)
                    pump(&kids[r], r, s);
            kids[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            running--;
            if (kids[r].status != 0 && failed_rank < 0 && exit_code == 0) {
                failed_rank = r;
                exit_code = kids[r].status;
                fprintf(stderr, "ztrain launch: error: rank %d (pid %d) %s %d; stopping the other ranks\n", r,
                        (int)kids[r].pid, WIFEXITED(st) ? "exited with status" : "was killed by signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                signal_all(kids, started, SIGTERM);
                kill_at = now_s() + LAUNCH_KILL_GRACE_S;
            }
        }
        if (kill_at > 0 && now_s() > kill_at) {
            signal_all(kids, started, SIGKILL);
            kill_at = 0;
        }
    }
    for (int r = 0; r < started; r++) {
        free(kids[r].partial[0]);
        free(kids[r].partial[1]);
    }
    free(pfd);
    free(kids);
    free(child_argv);
    if (failed_rank >= 0)
        fprintf(stderr, "ztrain launch: error: the job failed: rank %d exited with status %d\n", failed_rank,
                exit_code);
    return exit_code;
}
