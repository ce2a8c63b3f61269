/* Tests of proto/rendezvous with real processes on loopback: rank 0 serves in this process, the other
 * ranks are forked children that join. Every rank must see the same outcome: the NCCL id on success, or
 * the one failure message (world size, config hash, duplicate rank, ranks that never joined). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <errno.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/rendezvous.h"
#include "ztrain/v1/rendezvous.pb-c.h"

#define HASH 0x1234abcd5678ef00ull
#define CHILD_MATCHED 0 /* exit codes of a joining child */
#define CHILD_WRONG_ID 1
#define CHILD_FAILED 2  /* failed with the expected text in the message */
#define CHILD_OTHER 3   /* failed with an unexpected message */

/* A free loopback port (bound and released; the rendezvous binds it right after). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void make_id(uint8_t id[ZT_RDZV_ID_BYTES])
{
    for (int i = 0; i < ZT_RDZV_ID_BYTES; i++)
        id[i] = (uint8_t)(i * 7 + 3);
}

/* The body of a joining child (run in a fresh process image, see spawn): joins as `rank` and exits with
 * one of the CHILD_* codes. If expect is not "-" the join must fail with expect in its message. If
 * wait_fd >= 0 the child first reads one byte from it; if done_fd >= 0 it writes one byte to it after its
 * join returned. */
static int child_main(int port, int rank, int world, uint64_t hash, double timeout, const char *expect, int wait_fd,
                      int done_fd)
{
    if (strcmp(expect, "-") == 0)
        expect = NULL;
    if (wait_fd >= 0) {
        char c;
        if (read(wait_fd, &c, 1) != 1)
            return CHILD_OTHER;
    }
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    uint8_t id[ZT_RDZV_ID_BYTES] = {0}, want[ZT_RDZV_ID_BYTES];
    make_id(want);
    zt_err err = {{0}};
    int rc = zt_rdzv_join(master, rank, world, hash, timeout, NULL, id, &err);
    if (done_fd >= 0 && write(done_fd, "x", 1) != 1)
        return CHILD_OTHER;
    if (rc != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return expect != NULL && strstr(err.msg, expect) != NULL ? CHILD_FAILED : CHILD_OTHER;
    }
    if (expect != NULL)
        return CHILD_OTHER;
    return memcmp(id, want, sizeof(id)) == 0 ? CHILD_MATCHED : CHILD_WRONG_ID;
}

/* Starts a joining rank as a new process: fork, then exec this test program in its child mode, because
 * the gRPC library's threads of this process do not survive a fork. */
static pid_t spawn(int port, int rank, int world, uint64_t hash, double timeout, const char *expect, int wait_fd,
                   int done_fd)
{
    char args[7][64];
    snprintf(args[0], 64, "%d", port);
    snprintf(args[1], 64, "%d", rank);
    snprintf(args[2], 64, "%d", world);
    snprintf(args[3], 64, "%llu", (unsigned long long)hash);
    snprintf(args[4], 64, "%g", timeout);
    snprintf(args[5], 64, "%d", wait_fd);
    snprintf(args[6], 64, "%d", done_fd);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_rendezvous", "--join", args[0], args[1], args[2], args[3], args[4],
              expect ? expect : "-", args[5], args[6], (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_child(pid_t pid)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_success(void **state)
{
    (void)state;
    const int world = 4;
    int port = free_port();
    pid_t kids[4];
    for (int r = 1; r < world; r++)
        kids[r] = spawn(port, r, world, HASH, 20.0, NULL, -1, -1);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    uint8_t id[ZT_RDZV_ID_BYTES];
    make_id(id);
    zt_err err = {{0}};
    int rc = zt_rdzv_serve(addr, world, HASH, id, 20.0, NULL, &err);
    if (rc != 0)
        fail_msg("serve: %s", err.msg);
    for (int r = 1; r < world; r++)
        assert_int_equal(wait_child(kids[r]), CHILD_MATCHED);
}

static void test_world_size_one(void **state)
{
    (void)state;
    uint8_t id[ZT_RDZV_ID_BYTES] = {0};
    zt_err err = {{0}};
    assert_int_equal(zt_rdzv_serve("127.0.0.1:0", 1, HASH, id, 1.0, NULL, &err), 0);
    assert_int_equal(zt_rdzv_serve("127.0.0.1:0", 0, HASH, id, 1.0, NULL, &err), ZT_EINVAL_CONFIG);
}

/* Runs a rendezvous of `world` ranks in which rank `bad` joins with bad_world / bad_hash, and checks that
 * rank 0 and every child fail with `expect` in their message. */
static void expect_failure(int world, int bad, int bad_world, uint64_t bad_hash, const char *expect)
{
    int port = free_port();
    pid_t kids[8];
    for (int r = 1; r < world; r++)
        kids[r] = spawn(port, r, r == bad ? bad_world : world, r == bad ? bad_hash : HASH, 20.0, expect, -1, -1);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    uint8_t id[ZT_RDZV_ID_BYTES];
    make_id(id);
    zt_err err = {{0}};
    assert_true(zt_rdzv_serve(addr, world, HASH, id, 20.0, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, expect));
    for (int r = 1; r < world; r++)
        assert_int_equal(wait_child(kids[r]), CHILD_FAILED);
}

static void test_config_hash_mismatch(void **state)
{
    (void)state;
    expect_failure(3, 2, 3, 0x99ull, "every rank must run the same config");
    /* Both hashes are named. */
    expect_failure(2, 1, 2, 0x99ull, "0000000000000099 but rank 0 has 1234abcd5678ef00");
}

static void test_world_size_mismatch(void **state)
{
    (void)state;
    expect_failure(3, 1, 4, HASH, "world size 4 but rank 0 with 3");
}

static void test_rank_out_of_range(void **state)
{
    (void)state;
    /* Rank 2 says world size 3 like everyone but the world is 2: its rank is outside. */
    int port = free_port();
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    pid_t kid = spawn(port, 5, 2, HASH, 20.0, "outside 1..1", -1, -1);
    uint8_t id[ZT_RDZV_ID_BYTES];
    make_id(id);
    zt_err err = {{0}};
    /* Rank 1 never comes, so rank 0 waits out its (short) timeout after the failure. */
    assert_true(zt_rdzv_serve(addr, 2, HASH, id, 3.0, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "outside 1..1"));
    assert_int_equal(wait_child(kid), CHILD_FAILED);
}

static void test_duplicate_rank(void **state)
{
    (void)state;
    /* Ranks 1 and 1 join first; rank 2 joins once one of them has its answer. */
    int port = free_port();
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t a = spawn(port, 1, 3, HASH, 20.0, "joined twice", -1, go[1]);
    pid_t b = spawn(port, 1, 3, HASH, 20.0, "joined twice", -1, go[1]);
    pid_t c = spawn(port, 2, 3, HASH, 20.0, "joined twice", go[0], -1);
    close(go[0]);
    close(go[1]);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    uint8_t id[ZT_RDZV_ID_BYTES];
    make_id(id);
    zt_err err = {{0}};
    assert_true(zt_rdzv_serve(addr, 3, HASH, id, 20.0, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "joined twice"));
    assert_int_equal(wait_child(a), CHILD_FAILED);
    assert_int_equal(wait_child(b), CHILD_FAILED);
    assert_int_equal(wait_child(c), CHILD_FAILED);
}

static void test_timeout_names_missing_ranks(void **state)
{
    (void)state;
    int port = free_port();
    pid_t kid = spawn(port, 2, 4, HASH, 20.0, "rank(s) 1, 3 never joined", -1, -1);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    uint8_t id[ZT_RDZV_ID_BYTES];
    make_id(id);
    zt_err err = {{0}};
    int rc = zt_rdzv_serve(addr, 4, HASH, id, 2.0, NULL, &err);
    assert_true(rc < 0);
    assert_non_null(strstr(err.msg, "rank(s) 1, 3 never joined"));
    assert_int_equal(wait_child(kid), CHILD_FAILED);
}

static void test_join_without_master(void **state)
{
    (void)state;
    int port = free_port();
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%d", port);
    uint8_t id[ZT_RDZV_ID_BYTES];
    zt_err err = {{0}};
    assert_int_equal(zt_rdzv_join(master, 1, 2, HASH, 1.0, NULL, id, &err), -ETIMEDOUT);
    assert_non_null(strstr(err.msg, "could not reach the rendezvous"));
    assert_non_null(strstr(err.msg, master));
}

/* Packs a JoinRequest into buf and returns its length. */
static size_t pack_join(int rank, int world, uint64_t hash, uint8_t *buf)
{
    Ztrain__V1__JoinRequest req = ZTRAIN__V1__JOIN_REQUEST__INIT;
    req.rank = rank;
    req.world_size = world;
    req.config_hash = hash;
    req.host = "test-host";
    return ztrain__v1__join_request__pack(&req, buf);
}

static int local_join(zt_rpc_server_t *srv, const void *data, size_t len, struct zt_rpc_status *st)
{
    struct zt_rpc_part part = {data, len};
    struct zt_rpc_local_msg msg = {&part, 1};
    return zt_rpc_server_call_local(srv, "/ztrain.v1.Rendezvous/Join", &msg, 1, 5.0, NULL, NULL, st);
}

/* The Join handler without a network (as the fuzzing harness drives it): a second rank of two joins at
 * once, the same rank again is refused, and so is a message that is not a JoinRequest. */
static void test_join_in_process(void **state)
{
    (void)state;
    uint8_t id[ZT_RDZV_ID_BYTES];
    make_id(id);
    zt__rdzv *r = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt__rdzv_create(0, HASH, id, 5.0, &r, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt__rdzv_create(2, HASH, id, 5.0, &r, &err), 0);
    struct zt_rpc_server_options opt = {0};
    zt_rpc_server_t *srv = NULL;
    assert_int_equal(zt_rpc_server_create(&opt, &srv, &err), 0);
    assert_int_equal(zt__rdzv_add_methods(r, srv, &err), 0);
    struct zt_rpc_status st;
    uint8_t buf[256];
    assert_int_equal(local_join(srv, "\xff\xff\xff", 3, &st), ZT_RPC_INVALID_ARGUMENT);
    assert_int_equal(local_join(srv, buf, pack_join(1, 2, HASH, buf), &st), ZT_RPC_OK);
    assert_int_equal(local_join(srv, buf, pack_join(1, 2, HASH, buf), &st), ZT_RPC_ALREADY_EXISTS);
    assert_non_null(strstr(st.msg, "joined twice"));
    zt_rpc_server_destroy(srv, 1.0);
    zt__rdzv_destroy(r);
}

int main(int argc, char **argv)
{
    if (argc == 10 && strcmp(argv[1], "--join") == 0)
        return child_main(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), strtoull(argv[5], NULL, 10), atof(argv[6]),
                          argv[7], atoi(argv[8]), atoi(argv[9]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_success),
        cmocka_unit_test(test_world_size_one),
        cmocka_unit_test(test_config_hash_mismatch),
        cmocka_unit_test(test_world_size_mismatch),
        cmocka_unit_test(test_rank_out_of_range),
        cmocka_unit_test(test_duplicate_rank),
        cmocka_unit_test(test_timeout_names_missing_ranks),
        cmocka_unit_test(test_join_without_master),
        cmocka_unit_test(test_join_in_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
