/* Tests of worker/comm's shared-memory backend with real processes: every collective against a serial
 * reference for W = 1..4 (sizes that W does not divide, messages larger than one staging chunk), and the
 * failures a job must report on every rank instead of hanging: a WORLD_SIZE mismatch, a rank that never
 * joins, ranks with different configs, a peer that exits in the middle of a step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/comm/comm.h"

#define MAX_W 4

/* What one rank of a test job does; returns 0 when all its checks pass, or a line number. */
typedef int (*rank_fn)(int rank, int W, zt_comm_options *o, char *msg, size_t cap);

typedef struct rank_result {
    int status;   /* exit status of the rank's process */
    char msg[ZT_ERR_LEN];
} rank_result;

static int job_counter;

/* Runs fn in `started` processes (ranks 0..started-1 of a job of W) and collects their exit statuses and
 * messages. options_fn may adjust each rank's options. */
static void run_job(int W, int started, rank_fn fn, void (*options_fn)(int rank, zt_comm_options *o),
                    rank_result *res)
{
    char name[32];
    snprintf(name, sizeof name, "t%d-%d", (int)getpid(), job_counter++);
    int fds[MAX_W][2];
    pid_t pids[MAX_W];
    for (int r = 0; r < started; r++) {
        assert_int_equal(pipe(fds[r]), 0);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            close(fds[r][0]);
            zt_comm_options o;
            zt_comm_options_init(&o);
            o.rank = r;
            o.world_size = W;
            strcpy(o.name, name);
            o.join_timeout_s = 20;
            o.timeout_s = 20;
            o.chunk_bytes = 256; /* small, so that every collective runs in several chunks */
            if (options_fn)
                options_fn(r, &o);
            char msg[ZT_ERR_LEN] = "";
            int rc = fn(r, W, &o, msg, sizeof msg);
            ssize_t wr = write(fds[r][1], msg, strlen(msg));
            (void)wr;
            _exit(rc == 0 ? 0 : 1);
        }
        close(fds[r][1]);
    }
    for (int r = 0; r < started; r++) {
        int st = 0;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        res[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        ssize_t n = read(fds[r][0], res[r].msg, sizeof res[r].msg - 1);
        res[r].msg[n > 0 ? n : 0] = '\0';
        close(fds[r][0]);
    }
}

/* The value rank q contributes at index i: small integers plus a fraction, so float sums round. */
static float value(int q, size_t i)
{
    return (float)((int)((i * 7919u + (size_t)q * 104729u) % 1000u) - 500) * 0.0137f + 0.1f * (float)q;
}

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            snprintf(msg, cap, "check failed at line %d: %s", __LINE__, #cond);                            \
            return __LINE__;                                                                               \
        }                                                                                                  \
    } while (0)
#define CALL(expr)                                                                                         \
    do {                                                                                                   \
        if ((expr) < 0) {                                                                                  \
            snprintf(msg, cap, "%s", err.msg);                                                             \
            return __LINE__;                                                                               \
        }                                                                                                  \
    } while (0)

/* Every collective against its serial reference. */
static int collectives_rank(int rank, int W, zt_comm_options *o, char *msg, size_t cap)
{
    zt_err err = {{0}};
    zt_comm *c = NULL;
    CALL(zt_comm_create(&c, o, &err));
    CHECK(zt_comm_rank(c) == rank && zt_comm_world_size(c) == W);
    const size_t sizes[] = {1, 7, 301};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        float *send = malloc(n * W * sizeof(float)), *recv = malloc(n * W * sizeof(float));
        /* all_reduce sum and max, against sums in rank order */
        for (size_t i = 0; i < n; i++)
            send[i] = value(rank, i);
        CALL(zt_comm_all_reduce(c, send, recv, n, ZT_COMM_F32, ZT_COMM_SUM, NULL, &err));
        for (size_t i = 0; i < n; i++) {
            float ref = value(0, i);
            for (int q = 1; q < W; q++)
                ref += value(q, i);
            CHECK(recv[i] == ref);
        }
        CALL(zt_comm_all_reduce(c, send, send, n, ZT_COMM_F32, ZT_COMM_MAX, NULL, &err)); /* in place */
        for (size_t i = 0; i < n; i++) {
            float ref = value(0, i);
            for (int q = 1; q < W; q++)
                ref = value(q, i) > ref ? value(q, i) : ref;
            CHECK(send[i] == ref);
        }
        /* all_gather, also in place */
        for (size_t i = 0; i < n; i++)
            send[i] = value(rank, i);
        CALL(zt_comm_all_gather(c, send, recv, n, ZT_COMM_F32, NULL, &err));
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < n; i++)
                CHECK(recv[q * n + i] == value(q, i));
        memset(recv, 0, n * W * sizeof(float));
        for (size_t i = 0; i < n; i++)
            recv[rank * n + i] = value(rank, i);
        CALL(zt_comm_all_gather(c, recv + rank * n, recv, n, ZT_COMM_F32, NULL, &err));
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < n; i++)
                CHECK(recv[q * n + i] == value(q, i));
        /* reduce_scatter: rank q contributes value(q, j) at global index j */
        for (size_t j = 0; j < n * W; j++)
            send[j] = value(rank, j);
        CALL(zt_comm_reduce_scatter(c, send, recv, n, ZT_COMM_F32, ZT_COMM_SUM, NULL, &err));
        for (size_t i = 0; i < n; i++) {
            size_t j = (size_t)rank * n + i;
            float ref = value(0, j);
            for (int q = 1; q < W; q++)
                ref += value(q, j);
            CHECK(recv[i] == ref);
        }
        /* broadcast from the last rank */
        for (size_t i = 0; i < n; i++)
            send[i] = rank == W - 1 ? value(99, i) : -1.0f;
        CALL(zt_comm_broadcast(c, send, n, ZT_COMM_F32, W - 1, NULL, &err));
        for (size_t i = 0; i < n; i++)
            CHECK(send[i] == value(99, i));
        /* send/recv around the ring (even ranks send first, so a ring of two or more cannot deadlock) */
        if (W > 1) {
            int next = (rank + 1) % W, prev = (rank + W - 1) % W;
            for (size_t i = 0; i < n; i++)
                send[i] = value(rank + 10, i);
            if (rank % 2 == 0) {
                CALL(zt_comm_send(c, send, n, ZT_COMM_F32, next, NULL, &err));
                CALL(zt_comm_recv(c, recv, n, ZT_COMM_F32, prev, NULL, &err));
            } else {
                CALL(zt_comm_recv(c, recv, n, ZT_COMM_F32, prev, NULL, &err));
                CALL(zt_comm_send(c, send, n, ZT_COMM_F32, next, NULL, &err));
            }
            for (size_t i = 0; i < n; i++)
                CHECK(recv[i] == value(prev + 10, i));
        }
        free(send);
        free(recv);
    }
    /* fp64 sum and int32 max */
    double d = rank + 0.25, dsum = 0;
    CALL(zt_comm_all_reduce(c, &d, &dsum, 1, ZT_COMM_F64, ZT_COMM_SUM, NULL, &err));
    CHECK(dsum == W * (W - 1) / 2.0 + 0.25 * W);
    int32_t flag = rank == W - 1 ? 1 : 0;
    CALL(zt_comm_all_reduce(c, &flag, &flag, 1, ZT_COMM_I32, ZT_COMM_MAX, NULL, &err));
    CHECK(flag == 1);
    /* bf16 is for NCCL only */
    CHECK(zt_comm_all_reduce(c, &flag, &flag, 1, ZT_COMM_BF16, ZT_COMM_SUM, NULL, &err) == ZT_EUNSUPPORTED);
    CALL(zt_comm_barrier(c, NULL, &err));
    zt_comm_destroy(c);
    return 0;
}

static void test_collectives(void **state)
{
    (void)state;
    for (int W = 1; W <= MAX_W; W++) {
        rank_result res[MAX_W];
        run_job(W, W, collectives_rank, NULL, res);
        for (int r = 0; r < W; r++) {
            if (res[r].status != 0)
                print_error("W=%d rank %d: %s\n", W, r, res[r].msg);
            assert_int_equal(res[r].status, 0);
        }
    }
}

/* Creates the communicator and returns its result, the message in msg. */
static int join_rank(int rank, int W, zt_comm_options *o, char *msg, size_t cap)
{
    (void)rank;
    (void)W;
    zt_err err = {{0}};
    zt_comm *c = NULL;
    int rc = zt_comm_create(&c, o, &err);
    snprintf(msg, cap, "%s", rc < 0 ? err.msg : "ok");
    zt_comm_destroy(c);
    return rc < 0 ? 1 : 0;
}

static void world_size_3_on_rank_1(int rank, zt_comm_options *o)
{
    if (rank == 1)
        o->world_size = 3;
}

static void test_world_size_mismatch(void **state)
{
    (void)state;
    rank_result res[2];
    run_job(2, 2, join_rank, world_size_3_on_rank_1, res);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(res[r].status, 1);
        assert_non_null(strstr(res[r].msg, "WORLD_SIZE mismatch"));
        assert_non_null(strstr(res[r].msg, "WORLD_SIZE=3"));
    }
}

static void short_join(int rank, zt_comm_options *o)
{
    (void)rank;
    o->join_timeout_s = 1.0;
}

static void test_missing_rank(void **state)
{
    (void)state;
    rank_result res[3];
    run_job(4, 3, join_rank, short_join, res); /* rank 3 never starts */
    for (int r = 0; r < 3; r++) {
        assert_int_equal(res[r].status, 1);
        assert_non_null(strstr(res[r].msg, "rank(s) 3 did not arrive"));
    }
}

static void test_missing_rank0(void **state)
{
    (void)state;
    /* Only rank 0 is missing: rank 1 looks for a segment that nobody creates. */
    char name[32];
    snprintf(name, sizeof name, "t%d-none", (int)getpid());
    zt_comm_options o;
    zt_comm_options_init(&o);
    o.rank = 1;
    o.world_size = 2;
    strcpy(o.name, name);
    o.join_timeout_s = 0.5;
    zt_comm *c = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_comm_create(&c, &o, &err), ZT_ESTATE);
    assert_null(c);
    assert_non_null(strstr(err.msg, "rank(s) 0 never joined"));
}

static void other_config_on_rank_1(int rank, zt_comm_options *o)
{
    o->config_hash = rank == 1 ? 0xbad : 0x600d;
}

static void test_config_mismatch(void **state)
{
    (void)state;
    rank_result res[3];
    run_job(3, 3, join_rank, other_config_on_rank_1, res);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(res[r].status, 1);
        assert_non_null(strstr(res[r].msg, "rank(s) 1 run a different training config"));
    }
}

/* Rank 2 exits after joining; the others must fail in their next collective, naming it. */
static int dying_rank(int rank, int W, zt_comm_options *o, char *msg, size_t cap)
{
    (void)W;
    zt_err err = {{0}};
    zt_comm *c = NULL;
    o->timeout_s = 60; /* the failure must come from noticing the exit, long before this */
    CALL(zt_comm_create(&c, o, &err));
    if (rank == 2)
        _exit(3);
    float x[5] = {1, 2, 3, 4, 5};
    int rc = zt_comm_all_reduce(c, x, x, 5, ZT_COMM_F32, ZT_COMM_SUM, NULL, &err);
    snprintf(msg, cap, "%s", rc < 0 ? err.msg : "ok");
    /* later calls fail at once with the same message */
    if (rc < 0 && zt_comm_barrier(c, NULL, &err) >= 0)
        snprintf(msg, cap, "barrier after a failure succeeded");
    zt_comm_destroy(c);
    return rc < 0 ? 1 : 0;
}

static void test_peer_exit(void **state)
{
    (void)state;
    rank_result res[3];
    run_job(3, 3, dying_rank, NULL, res);
    assert_int_equal(res[2].status, 3);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(res[r].status, 1);
        assert_non_null(strstr(res[r].msg, "rank 2"));
        assert_non_null(strstr(res[r].msg, "exited"));
    }
}

static void test_bad_options(void **state)
{
    (void)state;
    zt_comm_options o;
    zt_comm_options_init(&o);
    zt_comm *c = NULL;
    zt_err err = {{0}};
    o.rank = 2;
    o.world_size = 2;
    assert_int_equal(zt_comm_create(&c, &o, &err), ZT_EINVAL_CONFIG);
    o.rank = 0;
    strcpy(o.name, "a/b");
    assert_int_equal(zt_comm_create(&c, &o, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "a/b"));
    assert_null(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),     cmocka_unit_test(test_world_size_mismatch),
        cmocka_unit_test(test_missing_rank),    cmocka_unit_test(test_missing_rank0),
        cmocka_unit_test(test_config_mismatch), cmocka_unit_test(test_peer_exit),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
