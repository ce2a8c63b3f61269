/* Tests of the multi-rank start-up and training path with real processes, each exec'ed fresh (gRPC does
 * not survive a fork):
 *   - `ztrain launch --nproc 2|3` of the train_rank program (what `ztrain train` runs at WORLD_SIZE > 1)
 *     goes through the gRPC rendezvous and writes a metrics.jsonl whose train and val losses match the
 *     single-process trainer's within 1e-5 relative, with a checkpoint in the trainer's format;
 *   - ranks started by hand with the torchrun variables: success, a WORLD_SIZE mismatch, different
 *     configs and a rank that never joins each fail on every started rank with the same clear message
 *     and a non-zero status, within ZT_RDZV_TIMEOUT_S;
 *   - SIGINT to the launcher stops every rank after the same step with a checkpoint, exit status 130;
 *   - under the tightest --host-mem the planner takes (its refusal of 1 MiB names it), at W = 1 and 2 with the
 *     state on disk, the peak resident memory of every rank (its VmHWM, as the kernel's rusage gives it)
 *     stays under the cap. */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/train/checkpoint.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

static char dir[] = "/tmp/zt_startup_XXXXXX";
static char model_path[256], train_path[256], val_path[256];
static int port_base;

/* The flags of every run but --out (and --lr, which some tests change). */
#define COMMON_FLAGS                                                                                         \
    "--model", model_path, "--train-data", train_path, "--val-data", val_path, "--batch-size", "6",         \
        "--seq-len", "8", "--grad-accum", "2", "--threads", "1", "--log-every", "2", "--eval-every", "3",   \
        "--eval-batches", "2", "--warmup", "1", "--save-every", "0"

static int setup(void **state)
{
    (void)state;
    assert_non_null(mkdtemp(dir));
    port_base = 20000 + (int)(getpid() % 2000) * 10;
    zt_gpt2_config c;
    zt_gpt2_config_default(&c);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 10;
    c.n_positions = 16;
    c.vocab_size = 37;
    zt_err err = {{0}};
    snprintf(model_path, sizeof model_path, "%s/model.json", dir);
    assert_int_equal(zt_gpt2_config_save(&c, model_path, &err), 0);
    uint16_t toks[4096];
    for (int i = 0; i < 4096; i++)
        toks[i] = (uint16_t)((i * 7 + (i / 5) * 3) % 37);
    snprintf(train_path, sizeof train_path, "%s/train_000.bin", dir);
    assert_int_equal(zt_shard_write(train_path, toks, 4096, &err), 0);
    for (int i = 0; i < 1024; i++)
        toks[i] = (uint16_t)((i * 5 + (i / 3)) % 37);
    snprintf(val_path, sizeof val_path, "%s/val_000.bin", dir);
    assert_int_equal(zt_shard_write(val_path, toks, 1024, &err), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    /* ZT_KEEP_TEST_DIR=1 keeps the runs and rank logs for a look after a failure */
    return getenv("ZT_KEEP_TEST_DIR") ? 0 : system(cmd) == 0 ? 0 : -1;
}

/* Starts prog argv with the given "NAME=value" variables added (NULL-terminated), its stdout and stderr
 * going to the file log. Returns the pid. */
static pid_t spawn(const char *prog, char **argv, char **vars, const char *log)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        for (int i = 0; vars && vars[i]; i++)
            putenv(vars[i]);
        execv(prog, argv);
        _exit(127);
    }
    return pid;
}

static int wait_status(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Reads a whole (small) file into a static buffer. */
static const char *slurp(const char *path)
{
    static char buf[1 << 18];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void assert_contains(const char *text, const char *what)
{
    if (!strstr(text, what))
        fail_msg("expected '%s' in:\n%s", what, text);
}

/* Reads the train losses (by step) and val losses (by step) of a metrics.jsonl. */
static int read_metrics(const char *run, float *loss, float *val, int cap)
{
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int lines = 0;
    for (int i = 0; i < cap; i++)
        loss[i] = val[i] = NAN;
    while (fgets(line, sizeof line, f)) {
        long long step;
        assert_int_equal(sscanf(line, "{\"step\":%lld", &step), 1);
        assert_true(step >= 0 && step < cap);
        const char *v = strstr(line, "\"val_loss\":"), *l = strstr(line, "\"loss\":");
        if (v)
            val[step] = strtof(v + 11, NULL);
        else if (l)
            loss[step] = strtof(l + 7, NULL);
        lines++;
    }
    fclose(f);
    return lines;
}

static void assert_same_curves(const char *a, const char *b, int steps)
{
    float la[32], va[32], lb[32], vb[32];
    assert_int_equal(read_metrics(a, la, va, 32), read_metrics(b, lb, vb, 32));
    for (int s = 0; s <= steps; s++) {
        if (isnan(la[s]) != isnan(lb[s]) || isnan(va[s]) != isnan(vb[s]))
            fail_msg("step %d: the runs logged different lines", s);
        if (!isnan(la[s]) && !(fabs(la[s] - lb[s]) <= 1e-5 * fabs(la[s])))
            fail_msg("step %d: loss %.9g vs %.9g", s, la[s], lb[s]);
        if (!isnan(va[s]) && !(fabs(va[s] - vb[s]) <= 1e-5 * fabs(va[s])))
            fail_msg("step %d: val loss %.9g vs %.9g", s, va[s], vb[s]);
    }
    assert_false(isnan(va[0])); /* step 0, eval_every and the end were evaluated */
    assert_false(isnan(va[3]));
    assert_false(isnan(va[steps]));
}

static void test_launch_matches_single_process(void **state)
{
    (void)state;
    char single[300], log[300];
    snprintf(single, sizeof single, "%s/single", dir);
    char *argv1[] = {"train_rank", COMMON_FLAGS, "--steps", "6", "--lr", "1e-2", "--out", single, NULL};
    snprintf(log, sizeof log, "%s/single.log", dir);
    assert_int_equal(wait_status(spawn(TRAIN_RANK_BIN, argv1, NULL, log)), 0);
    for (int W = 2; W <= 3; W++) {
        char out[300], port[16], nproc[8];
        snprintf(out, sizeof out, "%s/launch%d", dir, W);
        snprintf(port, sizeof port, "%d", port_base + W);
        snprintf(nproc, sizeof nproc, "%d", W);
        char *argv[] = {"ztrain", "launch", "--nproc", nproc, "--master-port", port, "--", TRAIN_RANK_BIN,
                        COMMON_FLAGS, "--steps", "6", "--lr", "1e-2", "--out", out, NULL};
        snprintf(log, sizeof log, "%s/launch%d.log", dir, W);
        assert_int_equal(wait_status(spawn(ZTRAIN_BIN, argv, NULL, log)), 0);
        const char *text = slurp(log);
        char joined[64];
        snprintf(joined, sizeof joined, "[r0] rendezvous: all %d ranks joined", W);
        assert_contains(text, joined);
        assert_contains(text, "[r0] eval: step 3 | val loss");
        assert_contains(text, "[r0] step 6/6 | loss");
        assert_same_curves(single, out, 6);
        char ckpt[PATH_MAX];
        zt_err err = {{0}};
        assert_int_equal(zt_checkpoint_find(out, ckpt, sizeof ckpt, &err), 0);
        assert_int_equal(zt_checkpoint_verify(ckpt, NULL, &err), 0);
    }
}

/* Starts n ranks by hand with the torchrun variables; world[r] is rank r's WORLD_SIZE, lr[r] its --lr,
 * rank[r] its RANK. Returns their statuses and leaves their logs in <dir>/<tag>.<r>.log. */
static void by_hand(const char *tag, int n, const int *rank, const int *world, const char *const *lr, int port,
                    const char *timeout, int *status)
{
    pid_t pids[4];
    char vars[4][7][64];
    char out[300], log[300];
    snprintf(out, sizeof out, "%s/%s", dir, tag);
    for (int i = 0; i < n; i++) {
        snprintf(vars[i][0], 64, "RANK=%d", rank[i]);
        snprintf(vars[i][1], 64, "LOCAL_RANK=%d", rank[i]);
        snprintf(vars[i][2], 64, "WORLD_SIZE=%d", world[i]);
        snprintf(vars[i][3], 64, "LOCAL_WORLD_SIZE=%d", world[i]);
        snprintf(vars[i][4], 64, "MASTER_ADDR=127.0.0.1");
        snprintf(vars[i][5], 64, "MASTER_PORT=%d", port);
        snprintf(vars[i][6], 64, "ZT_RDZV_TIMEOUT_S=%s", timeout);
        char *env[] = {vars[i][0], vars[i][1], vars[i][2], vars[i][3], vars[i][4], vars[i][5], vars[i][6], NULL};
        char *argv[] = {"train_rank", COMMON_FLAGS, "--steps", "2", "--lr", (char *)lr[i], "--out", out, NULL};
        snprintf(log, sizeof log, "%s/%s.%d.log", dir, tag, rank[i]);
        pids[i] = spawn(TRAIN_RANK_BIN, argv, env, log);
    }
    for (int i = 0; i < n; i++)
        status[i] = wait_status(pids[i]);
}

static const char *rank_log(const char *tag, int r)
{
    char log[300];
    snprintf(log, sizeof log, "%s/%s.%d.log", dir, tag, r);
    return slurp(log);
}

static void test_torchrun_environment_by_hand(void **state)
{
    (void)state;
    int st[4];
    const int ranks[] = {0, 1, 2};
    const char *lr[] = {"1e-2", "1e-2", "1e-2"};

    const int w2[] = {2, 2};
    by_hand("ok", 2, ranks, w2, lr, port_base + 4, "30", st);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], 0);
    assert_contains(rank_log("ok", 0), "rendezvous: all 2 ranks joined");
    assert_contains(rank_log("ok", 0), "step 2/2 | loss");

    const int wmix[] = {2, 3};
    by_hand("world", 2, ranks, wmix, lr, port_base + 5, "30", st);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(st[r], 1);
        assert_contains(rank_log("world", r), "was started with world size 3 but rank 0 with 2");
    }

    const char *lrmix[] = {"1e-2", "2e-2"};
    by_hand("config", 2, ranks, w2, lrmix, port_base + 6, "30", st);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(st[r], 1);
        assert_contains(rank_log("config", r), "every rank must run the same config");
    }

    /* rank 1 of 3 is never started: ranks 0 and 2 give up after 2 s, naming it */
    const int w3[] = {3, 3};
    const int ranks02[] = {0, 2};
    by_hand("missing", 2, ranks02, w3, lr, port_base + 7, "2", st);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(st[i], 1);
        assert_contains(rank_log("missing", ranks02[i]), "rank(s) 1 never joined the rendezvous");
    }
}

static void test_sigint_stops_every_rank_with_a_checkpoint(void **state)
{
    (void)state;
    char out[300], port[16];
    snprintf(out, sizeof out, "%s/interrupted", dir);
    snprintf(port, sizeof port, "%d", port_base + 8);
    char *argv[] = {"ztrain", "launch", "--nproc", "2", "--master-port", port, "--", TRAIN_RANK_BIN, COMMON_FLAGS,
                    "--steps", "1000000", "--lr", "1e-2", "--out", out, NULL};
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        execv(ZTRAIN_BIN, argv);
        _exit(127);
    }
    close(fds[1]);
    static char text[1 << 20];
    size_t got = 0;
    bool sent = false;
    ssize_t n;
    while (got + 1 < sizeof text && (n = read(fds[0], text + got, sizeof text - 1 - got)) > 0) {
        got += (size_t)n;
        text[got] = '\0';
        /* training is under way on both ranks once rank 0 reports step 2 */
        if (!sent && strstr(text, "[r0] step 2/1000000")) {
            assert_int_equal(kill(pid, SIGINT), 0);
            sent = true;
        }
    }
    close(fds[0]);
    assert_true(sent);
    assert_int_equal(wait_status(pid), 130);
    assert_contains(text, "[r0] stopped after step");
    long long step = 0;
    sscanf(strstr(text, "stopped after step") + strlen("stopped after step"), "%lld", &step);
    assert_true(step >= 2 && step < 1000000);
    char ckpt[PATH_MAX], want[32];
    zt_err err = {{0}};
    assert_int_equal(zt_checkpoint_find(out, ckpt, sizeof ckpt, &err), 0);
    assert_int_equal(zt_checkpoint_verify(ckpt, NULL, &err), 0);
    snprintf(want, sizeof want, "ckpt_%06lld", step);
    assert_contains(ckpt, want);
    /* both ranks ended cleanly: neither reports an error */
    assert_null(strstr(text, "ERROR"));
}

/* Runs argv (ZTRAIN_BIN: `ztrain launch` of W ranks, or one rank) with its output in log and returns its exit
 * status; *peak_kib receives the largest peak resident memory (ru_maxrss) of the processes it started and
 * waited for, itself included, measured in a process of its own so that no other test's children count. */
static int run_measured(char **argv, const char *log, long *peak_kib)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        const int st = wait_status(spawn(ZTRAIN_BIN, argv, NULL, log));
        struct rusage ru;
        getrusage(RUSAGE_CHILDREN, &ru);
        const long kib = ru.ru_maxrss;
        _exit(write(fds[1], &kib, sizeof kib) == (ssize_t)sizeof kib ? st : 126);
    }
    close(fds[1]);
    *peak_kib = -1;
    assert_int_equal(read(fds[0], peak_kib, sizeof *peak_kib), (ssize_t)sizeof *peak_kib);
    close(fds[0]);
    return wait_status(pid);
}

/* The minimum a refusal names ("what would fit: --host-mem 123MiB or more"), in MiB; fails when none. */
static long named_minimum_mib(const char *text)
{
    const char *at = strstr(text, "what would fit: --host-mem ");
    if (!at)
        fail_msg("no minimum in the refusal:\n%s", text);
    return strtol(at + strlen("what would fit: --host-mem "), NULL, 10);
}

static void test_peak_rss_under_host_mem(void **state)
{
    (void)state;
    /* a model whose fp32 state dwarfs the process (12.6 MB of weights; the process alone is about 13 MiB) */
    zt_gpt2_config c;
    zt_gpt2_config_default(&c);
    c.n_layer = 4;
    c.n_head = 4;
    c.n_embd = 256;
    c.n_positions = 16;
    c.vocab_size = 37;
    zt_err err = {{0}};
    char model[300];
    snprintf(model, sizeof model, "%s/model_rss.json", dir);
    assert_int_equal(zt_gpt2_config_save(&c, model, &err), 0);
    for (int W = 1; W <= 2; W++) {
        char out[300], mdir[300], log[300], cap[32], nproc[8], port[16];
        snprintf(mdir, sizeof mdir, "%s/rss_state%d", dir, W);
        assert_int_equal(mkdir(mdir, 0700), 0);
        snprintf(nproc, sizeof nproc, "%d", W);
        snprintf(port, sizeof port, "%d", port_base + 10 + W);
        snprintf(cap, sizeof cap, "1MiB");
        for (int pass = 0; pass < 2; pass++) {
            snprintf(out, sizeof out, "%s/rss%d_%d", dir, W, pass);
            snprintf(log, sizeof log, "%s/rss%d_%d.log", dir, W, pass);
            char *argv[] = {"ztrain", "launch", "--nproc", nproc, "--master-port", port, "--", TRAIN_RANK_BIN,
                            "--model", model, "--train-data", train_path, "--batch-size", "6", "--seq-len", "8",
                            "--grad-accum", "2", "--threads", "1", "--steps", "4", "--log-every", "1",
                            "--eval-every", "0", "--save-every", "2", "--adam-moments", "bf16", "--moments-dir", mdir,
                            "--host-mem", cap, "--out", out, NULL};
            long peak_kib = 0;
            const int st = run_measured(argv, log, &peak_kib);
            const char *text = slurp(log);
            if (pass == 0) { /* the probe: refused, naming the smallest plan */
                assert_int_equal(st, 1);
                snprintf(cap, sizeof cap, "%ldMiB", named_minimum_mib(text));
                continue;
            }
            if (st != 0)
                fail_msg("W=%d under --host-mem %s: exit status %d:\n%s", W, cap, st, text);
            assert_contains(text, "Adam moments on disk; fp32 masters on disk");
            assert_contains(text, "memory: the end of training: peak RSS");
            assert_null(strstr(text, "the peak is above the cap"));
            const long cap_kib = strtol(cap, NULL, 10) << 10;
            print_message("W=%d: peak RSS %ld KiB of --host-mem %s (%ld KiB)\n", W, peak_kib, cap, cap_kib);
            assert_true(peak_kib > 0 && peak_kib <= cap_kib);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_matches_single_process),
        cmocka_unit_test(test_torchrun_environment_by_hand),
        cmocka_unit_test(test_sigint_stops_every_rank_with_a_checkpoint),
        cmocka_unit_test(test_peak_rss_under_host_mem),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
