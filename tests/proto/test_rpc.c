/* Tests of proto/rpc: a server and clients over loopback exercising every path of the glue, including
 * the answers the server gives by itself (UNIMPLEMENTED, UNAUTHENTICATED, RESOURCE_EXHAUSTED, deadlines,
 * health) and TLS / mutual TLS with certificates made by openssl for the test. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/rpc.h"

#define ECHO "/ztrain.test.Echo/Echo"
#define SUM "/ztrain.test.Echo/Sum"
#define COUNT "/ztrain.test.Echo/Count"
#define HANG "/ztrain.test.Echo/Hang"

/* Unary: answers the request unchanged. */
static int echo_handler(zt_rpc_call_t *call, void *user)
{
    (void)user;
    const void *data;
    size_t len;
    if (zt_rpc_call_read(call, &data, &len) != 1)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "no request");
    if (len == 4 && memcmp(data, "fail", 4) == 0)
        return zt_rpc_call_fail(call, ZT_RPC_NOT_FOUND, "asked to fail");
    return zt_rpc_call_write(call, data, len) == 0 ? ZT_RPC_OK : ZT_RPC_CANCELLED;
}

/* Client stream: answers the total bytes and message count as "bytes/messages". */
static int sum_handler(zt_rpc_call_t *call, void *user)
{
    (void)user;
    const void *data;
    size_t len, total = 0, count = 0;
    int rc;
    while ((rc = zt_rpc_call_read(call, &data, &len)) == 1) {
        total += len;
        count++;
    }
    if (rc < 0)
        return ZT_RPC_CANCELLED;
    char out[64];
    int n = snprintf(out, sizeof(out), "%zu/%zu", total, count);
    return zt_rpc_call_write(call, out, (size_t)n) == 0 ? ZT_RPC_OK : ZT_RPC_CANCELLED;
}

/* Server stream: the request is a decimal count n; answers n messages "0", "1", ... */
static int count_handler(zt_rpc_call_t *call, void *user)
{
    (void)user;
    const void *data;
    size_t len;
    if (zt_rpc_call_read(call, &data, &len) != 1)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "no request");
    char text[32] = {0};
    memcpy(text, data, len < 31 ? len : 31);
    int n = atoi(text);
    for (int i = 0; i < n; i++) {
        char out[16];
        int k = snprintf(out, sizeof(out), "%d", i);
        if (zt_rpc_call_write(call, out, (size_t)k) != 0)
            return ZT_RPC_CANCELLED;
    }
    return ZT_RPC_OK;
}

/* Client stream that reads until the call ends; the client never closes, so only a deadline ends it. */
static int hang_handler(zt_rpc_call_t *call, void *user)
{
    (void)user;
    const void *data;
    size_t len;
    int rc;
    while ((rc = zt_rpc_call_read(call, &data, &len)) == 1) {
    }
    return rc == 0 ? zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "stream ended") : ZT_RPC_DEADLINE_EXCEEDED;
}

static zt_rpc_server_t *start_server(struct zt_rpc_server_options *opt)
{
    if (opt->listen_addr == NULL)
        opt->listen_addr = "127.0.0.1:0";
    zt_rpc_server_t *srv = NULL;
    zt_err err = {{0}};
    int rc = zt_rpc_server_create(opt, &srv, &err);
    if (rc != 0)
        fail_msg("server create: %s", err.msg);
    assert_int_equal(zt_rpc_server_add_method(srv, ECHO, ZT_RPC_KIND_UNARY, echo_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_add_method(srv, SUM, ZT_RPC_KIND_CLIENT_STREAM, sum_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_add_method(srv, COUNT, ZT_RPC_KIND_SERVER_STREAM, count_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_add_method(srv, HANG, ZT_RPC_KIND_CLIENT_STREAM, hang_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_start(srv, &err), 0);
    assert_true(zt_rpc_server_port(srv) > 0);
    return srv;
}

static zt_rpc_channel_t *connect_to(int port, struct zt_rpc_channel_options *opt)
{
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    opt->target = target;
    zt_rpc_channel_t *ch = NULL;
    zt_err err = {{0}};
    if (zt_rpc_channel_create(opt, &ch, &err) != 0)
        fail_msg("channel create: %s", err.msg);
    return ch;
}

/* Makes a unary Echo call and returns its code; on OK checks the answer. */
static int echo(zt_rpc_channel_t *ch, const char *text, struct zt_rpc_status *st)
{
    void *resp = NULL;
    size_t len = 0;
    int code = zt_rpc_unary(ch, ECHO, text, strlen(text), 10.0, 0, &resp, &len, st);
    if (code == ZT_RPC_OK) {
        assert_int_equal(len, strlen(text));
        assert_memory_equal(resp, text, len);
    }
    free(resp);
    return code;
}

static void test_unary_and_errors(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    zt_rpc_server_t *srv = start_server(&sopt);
    struct zt_rpc_channel_options copt = {0};
    zt_rpc_channel_t *ch = connect_to(zt_rpc_server_port(srv), &copt);
    struct zt_rpc_status st;

    assert_int_equal(echo(ch, "hello", &st), ZT_RPC_OK);
    assert_int_equal(echo(ch, "", &st), ZT_RPC_OK); /* empty messages are messages */
    assert_int_equal(echo(ch, "fail", &st), ZT_RPC_NOT_FOUND);
    assert_string_equal(st.msg, "asked to fail");

    void *resp = NULL;
    size_t len;
    assert_int_equal(zt_rpc_unary(ch, "/ztrain.test.Echo/Nope", "x", 1, 10.0, 0, &resp, &len, &st), ZT_RPC_UNIMPLEMENTED);
    assert_non_null(strstr(st.msg, "/ztrain.test.Echo/Nope"));
    assert_null(resp);
    assert_int_equal(zt_rpc_unary(ch, "/other.Service/Echo", "x", 1, 10.0, 0, &resp, &len, &st), ZT_RPC_UNIMPLEMENTED);
    /* The server keeps serving after the refusals. */
    assert_int_equal(echo(ch, "again", &st), ZT_RPC_OK);

    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);
}

static void test_streams(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    zt_rpc_server_t *srv = start_server(&sopt);
    struct zt_rpc_channel_options copt = {0};
    zt_rpc_channel_t *ch = connect_to(zt_rpc_server_port(srv), &copt);
    struct zt_rpc_status st;
    zt_err err;

    /* Client stream of 64 messages of 64 KiB. */
    zt_rpc_stream_t *s = NULL;
    assert_int_equal(zt_rpc_stream_start(ch, SUM, 30.0, 0, &s, &err), 0);
    char *chunk = calloc(1, 65536);
    for (int i = 0; i < 64; i++)
        assert_int_equal(zt_rpc_stream_send(s, chunk, 65536), 0);
    assert_int_equal(zt_rpc_stream_close_send(s), 0);
    const void *data;
    size_t len;
    assert_int_equal(zt_rpc_stream_recv(s, &data, &len), 1);
    assert_int_equal(len, strlen("4194304/64"));
    assert_memory_equal(data, "4194304/64", len);
    assert_int_equal(zt_rpc_stream_recv(s, &data, &len), 0);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_OK);
    free(chunk);

    /* Server stream of 1000 messages, in order. */
    assert_int_equal(zt_rpc_stream_start(ch, COUNT, 30.0, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, "1000", 4), 0);
    assert_int_equal(zt_rpc_stream_close_send(s), 0);
    int got = 0;
    while (zt_rpc_stream_recv(s, &data, &len) == 1) {
        char text[16] = {0};
        memcpy(text, data, len);
        assert_int_equal(atoi(text), got);
        got++;
    }
    assert_int_equal(got, 1000);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_OK);

    /* Finishing without reading drops the rest of the stream and still gives the status. */
    assert_int_equal(zt_rpc_stream_start(ch, COUNT, 30.0, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, "50", 2), 0);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_OK);

    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);
}

static void test_token(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    sopt.token = "s3cret-token";
    zt_rpc_server_t *srv = start_server(&sopt);
    int port = zt_rpc_server_port(srv);
    struct zt_rpc_status st;

    struct zt_rpc_channel_options none = {0};
    zt_rpc_channel_t *ch = connect_to(port, &none);
    assert_int_equal(echo(ch, "hi", &st), ZT_RPC_UNAUTHENTICATED);
    assert_non_null(strstr(st.msg, "bearer token"));
    /* Streams are refused too, before the handler sees anything. */
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, SUM, 10.0, 0, &s, &err), 0);
    zt_rpc_stream_send(s, "abc", 3);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_UNAUTHENTICATED);
    zt_rpc_channel_destroy(ch);

    struct zt_rpc_channel_options wrong = {.token = "s3cret-tokem"};
    ch = connect_to(port, &wrong);
    assert_int_equal(echo(ch, "hi", &st), ZT_RPC_UNAUTHENTICATED);
    assert_non_null(strstr(st.msg, "does not match"));
    zt_rpc_channel_destroy(ch);

    struct zt_rpc_channel_options longer = {.token = "s3cret-token2"};
    ch = connect_to(port, &longer);
    assert_int_equal(echo(ch, "hi", &st), ZT_RPC_UNAUTHENTICATED);
    zt_rpc_channel_destroy(ch);

    struct zt_rpc_channel_options right = {.token = "s3cret-token"};
    ch = connect_to(port, &right);
    assert_int_equal(echo(ch, "hi", &st), ZT_RPC_OK);
    int health = -1;
    assert_int_equal(zt_rpc_health_check(ch, "", 10.0, &health, &st), ZT_RPC_OK);
    assert_int_equal(health, ZT_RPC_HEALTH_SERVING);
    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);
}

/* Rotation: after zt_rpc_server_set_token the old token is refused and the new one accepted, without a
 * restart. Without the rotation (set_token doing nothing) the old token would still pass. */
static void test_token_rotation(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    sopt.token = "token-one";
    zt_rpc_server_t *srv = start_server(&sopt);
    int port = zt_rpc_server_port(srv);
    struct zt_rpc_status st;
    struct zt_rpc_channel_options one = {.token = "token-one"}, two = {.token = "token-two"};
    zt_rpc_channel_t *c1 = connect_to(port, &one), *c2 = connect_to(port, &two);
    assert_int_equal(echo(c1, "before", &st), ZT_RPC_OK);
    assert_int_equal(echo(c2, "before", &st), ZT_RPC_UNAUTHENTICATED);

    zt_err err = {{0}};
    assert_int_equal(zt_rpc_server_set_token(srv, "token-two", &err), 0);
    assert_int_equal(echo(c1, "after", &st), ZT_RPC_UNAUTHENTICATED);
    assert_non_null(strstr(st.msg, "does not match"));
    assert_int_equal(echo(c2, "after", &st), ZT_RPC_OK);
    /* An empty token is refused and the current one stays. */
    assert_int_equal(zt_rpc_server_set_token(srv, "", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "empty"));
    assert_int_equal(echo(c2, "still", &st), ZT_RPC_OK);
    /* Two tokens during a rotation's overlap: both pass; then only the newer. */
    const char *both[2] = {"token-one", "token-two"};
    assert_int_equal(zt_rpc_server_set_tokens(srv, both, 2, &err), 0);
    assert_int_equal(echo(c1, "overlap", &st), ZT_RPC_OK);
    assert_int_equal(echo(c2, "overlap", &st), ZT_RPC_OK);
    assert_int_equal(zt_rpc_server_set_tokens(srv, both, 1, &err), 0);
    assert_int_equal(echo(c1, "after", &st), ZT_RPC_OK);
    assert_int_equal(echo(c2, "after", &st), ZT_RPC_UNAUTHENTICATED);
    assert_int_equal(zt_rpc_server_set_tokens(srv, both, 0, &err), ZT_EINVAL_CONFIG);
    zt_rpc_channel_destroy(c1);
    zt_rpc_channel_destroy(c2);
    zt_rpc_server_destroy(srv, 5.0);
}

/* ---- constant-time token comparison ---- */

static sigjmp_buf fault_jump;

static void on_fault(int sig)
{
    (void)sig;
    siglongjmp(fault_jump, 1);
}

/* Calls zt_rpc_token_equal(want, got, len) and returns 1 if it touched memory it may not read (SIGSEGV
 * caught), 0 otherwise; *equal gets its answer when it returned. */
static int compare_faults(const char *want, const unsigned char *got, size_t len, int *equal)
{
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_fault;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    int faulted = 1;
    if (sigsetjmp(fault_jump, 1) == 0) {
        *equal = zt_rpc_token_equal(want, got, len);
        faulted = 0;
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    return faulted;
}

/* The comparison must not stop at the first differing byte: a 512-byte token guessed wrong in its
 * first byte is put 256 bytes before the end of a readable page, the rest of it in a page that cannot be
 * read. A comparison that stops early (a byte loop with an early return, strcmp, or memcmp, which stops
 * within a few vector loads of the difference) never touches that page and returns; the constant-time
 * one reads every byte and faults. No clock is involved. */
static void test_token_equal_constant_time(void **state)
{
    (void)state;
    enum { N = 512, READABLE = 256 };
    char *want = malloc(N + 1);
    for (int i = 0; i < N; i++)
        want[i] = "0123456789abcdef"[i % 16];
    want[N] = '\0';
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *mem = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    assert_int_equal(mprotect(mem + page, (size_t)page, PROT_NONE), 0);
    int equal = -1;

    /* Plain answers, from readable memory. */
    unsigned char *copy = malloc(N);
    memcpy(copy, want, N);
    assert_int_equal(compare_faults(want, copy, N, &equal), 0);
    assert_int_equal(equal, 1);
    copy[N - 1] ^= 1;
    assert_int_equal(compare_faults(want, copy, N, &equal), 0);
    assert_int_equal(equal, 0);
    assert_int_equal(compare_faults(want, copy, N - 1, &equal), 0); /* a prefix is not the token */
    assert_int_equal(equal, 0);
    assert_int_equal(compare_faults(want, (const unsigned char *)"", 0, &equal), 0);
    assert_int_equal(equal, 0);

    /* First byte wrong, the token's bytes from READABLE on in the unreadable page: the comparison goes on
     * past the difference. */
    unsigned char *got = mem + page - READABLE;
    memcpy(got, want, READABLE);
    got[0] ^= 0x55;
    assert_int_equal(compare_faults(want, got, N, &equal), 1);
    /* It never reads past got_len, whatever want's length. */
    assert_int_equal(compare_faults(want, got, READABLE, &equal), 0);
    assert_int_equal(equal, 0);
    munmap(mem, (size_t)page * 2);
    free(copy);
    free(want);
}

/* ---- in-process calls ---- */

struct responses {
    int count;
    char last[64];
};

static void collect(const void *data, size_t len, void *user)
{
    struct responses *r = user;
    r->count++;
    size_t n = len < sizeof(r->last) - 1 ? len : sizeof(r->last) - 1;
    memcpy(r->last, data, n);
    r->last[n] = '\0';
}

static void test_local_calls(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {.max_message_bytes = 1000, .token = "ignored-in-process"};
    zt_rpc_server_t *srv = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_rpc_server_create(&sopt, &srv, &err), 0); /* no listen address: in-process only */
    assert_int_equal(zt_rpc_server_add_method(srv, ECHO, ZT_RPC_KIND_UNARY, echo_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_add_method(srv, SUM, ZT_RPC_KIND_CLIENT_STREAM, sum_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_add_method(srv, COUNT, ZT_RPC_KIND_SERVER_STREAM, count_handler, NULL, &err), 0);
    assert_int_equal(zt_rpc_server_port(srv), 0);
    struct zt_rpc_status st;
    struct responses r = {0};

    /* A message in three pieces reads as one. */
    struct zt_rpc_part pieces[3] = {{"he", 2}, {"", 0}, {"llo", 3}};
    struct zt_rpc_local_msg hello = {pieces, 3};
    assert_int_equal(zt_rpc_server_call_local(srv, ECHO, &hello, 1, 5.0, collect, &r, &st), ZT_RPC_OK);
    assert_int_equal(r.count, 1);
    assert_string_equal(r.last, "hello");

    struct zt_rpc_part failp = {"fail", 4};
    struct zt_rpc_local_msg fail = {&failp, 1};
    assert_int_equal(zt_rpc_server_call_local(srv, ECHO, &fail, 1, 5.0, NULL, NULL, &st), ZT_RPC_NOT_FOUND);
    assert_string_equal(st.msg, "asked to fail");
    assert_int_equal(zt_rpc_server_call_local(srv, ECHO, NULL, 0, 5.0, NULL, NULL, &st), ZT_RPC_INVALID_ARGUMENT);
    assert_int_equal(zt_rpc_server_call_local(srv, "/x.Y/Z", &hello, 1, 5.0, NULL, NULL, &st), ZT_RPC_UNIMPLEMENTED);

    /* Client stream: every message, then the end of the stream. */
    struct zt_rpc_local_msg three[3] = {{pieces, 1}, {pieces + 2, 1}, {pieces, 3}};
    r.count = 0;
    assert_int_equal(zt_rpc_server_call_local(srv, SUM, three, 3, 5.0, collect, &r, &st), ZT_RPC_OK);
    assert_string_equal(r.last, "10/3");

    /* Server stream: each response reaches the callback. */
    struct zt_rpc_part fivep = {"5", 1};
    struct zt_rpc_local_msg five = {&fivep, 1};
    r.count = 0;
    assert_int_equal(zt_rpc_server_call_local(srv, COUNT, &five, 1, 5.0, collect, &r, &st), ZT_RPC_OK);
    assert_int_equal(r.count, 5);
    assert_string_equal(r.last, "4");

    /* The size limit holds as on the network. */
    char *big = calloc(1, 1001);
    struct zt_rpc_part bigp = {big, 1001};
    struct zt_rpc_local_msg bigm = {&bigp, 1};
    assert_int_equal(zt_rpc_server_call_local(srv, ECHO, &bigm, 1, 5.0, NULL, NULL, &st), ZT_RPC_RESOURCE_EXHAUSTED);
    free(big);

    /* Health/Check is served; the server is SERVING. */
    uint8_t req[2] = {0};
    struct zt_rpc_part hp = {req, 0};
    struct zt_rpc_local_msg hm = {&hp, 1};
    r.count = 0;
    assert_int_equal(zt_rpc_server_call_local(srv, "/grpc.health.v1.Health/Check", &hm, 1, 5.0, collect, &r, &st),
                     ZT_RPC_OK);
    assert_int_equal(r.count, 1);
    zt_rpc_server_destroy(srv, 1.0);
}

static void test_size_limit(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    sopt.max_message_bytes = 64 * 1024;
    zt_rpc_server_t *srv = start_server(&sopt);
    struct zt_rpc_channel_options copt = {0};
    zt_rpc_channel_t *ch = connect_to(zt_rpc_server_port(srv), &copt);
    struct zt_rpc_status st;

    size_t big = 64 * 1024 + 1;
    char *buf = calloc(1, big);
    void *resp = NULL;
    size_t len;
    assert_int_equal(zt_rpc_unary(ch, ECHO, buf, big, 10.0, 0, &resp, &len, &st), ZT_RPC_RESOURCE_EXHAUSTED);
    assert_null(resp);
    /* In the middle of a client stream. */
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, SUM, 10.0, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, buf, 1000), 0);
    zt_rpc_stream_send(s, buf, big);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_RESOURCE_EXHAUSTED);
    /* Exactly at the limit passes, and the server is still serving. */
    assert_int_equal(zt_rpc_unary(ch, ECHO, buf, big - 1, 10.0, 0, &resp, &len, &st), ZT_RPC_OK);
    assert_int_equal(len, big - 1);
    free(resp);
    free(buf);
    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);
}

static void test_deadlines(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    sopt.default_deadline_s = 0.5;
    zt_rpc_server_t *srv = start_server(&sopt);
    struct zt_rpc_channel_options copt = {0};
    zt_rpc_channel_t *ch = connect_to(zt_rpc_server_port(srv), &copt);
    struct zt_rpc_status st;
    zt_err err;
    zt_rpc_stream_t *s;

    /* The client's deadline ends a call the server would let hang. */
    assert_int_equal(zt_rpc_stream_start(ch, HANG, 0.3, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, "x", 1), 0);
    const void *data;
    size_t len;
    assert_true(zt_rpc_stream_recv(s, &data, &len) <= 0);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_DEADLINE_EXCEEDED);

    /* A call without a deadline gets the server's default one. */
    assert_int_equal(zt_rpc_stream_start(ch, HANG, 1e12, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, "x", 1), 0);
    assert_true(zt_rpc_stream_recv(s, &data, &len) <= 0);
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_DEADLINE_EXCEEDED);

    assert_int_equal(echo(ch, "still serving", &st), ZT_RPC_OK);
    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);
}

static void test_health(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    sopt.token = "tok";
    sopt.health_listen_addr = "127.0.0.1:0";
    zt_rpc_server_t *srv = start_server(&sopt);
    assert_true(zt_rpc_server_health_port(srv) > 0);
    assert_int_not_equal(zt_rpc_server_health_port(srv), zt_rpc_server_port(srv));
    struct zt_rpc_status st;
    int health = -1;

    struct zt_rpc_channel_options main_opt = {.token = "tok"};
    zt_rpc_channel_t *ch = connect_to(zt_rpc_server_port(srv), &main_opt);
    assert_int_equal(zt_rpc_health_check(ch, "ztrain.test.Echo", 10.0, &health, &st), ZT_RPC_OK);
    assert_int_equal(health, ZT_RPC_HEALTH_SERVING);
    assert_int_equal(zt_rpc_health_check(ch, "no.such.Service", 10.0, &health, &st), ZT_RPC_NOT_FOUND);
    zt_rpc_channel_destroy(ch);

    /* The health port needs no token and serves nothing else. */
    struct zt_rpc_channel_options plain = {0};
    ch = connect_to(zt_rpc_server_health_port(srv), &plain);
    assert_int_equal(zt_rpc_health_check(ch, "", 10.0, &health, &st), ZT_RPC_OK);
    assert_int_equal(health, ZT_RPC_HEALTH_SERVING);
    assert_int_equal(echo(ch, "hi", &st), ZT_RPC_UNIMPLEMENTED);
    zt_rpc_server_set_serving(srv, 0);
    assert_int_equal(zt_rpc_health_check(ch, "", 10.0, &health, &st), ZT_RPC_OK);
    assert_int_equal(health, ZT_RPC_HEALTH_NOT_SERVING);

    /* Watch sends the current status, then the change. */
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, "/grpc.health.v1.Health/Watch", 10.0, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, "", 0), 0); /* service "" encodes as an empty message */
    assert_int_equal(zt_rpc_stream_close_send(s), 0);
    const void *data;
    size_t len;
    assert_int_equal(zt_rpc_stream_recv(s, &data, &len), 1);
    assert_int_equal(len, 2);
    assert_int_equal(((const uint8_t *)data)[1], ZT_RPC_HEALTH_NOT_SERVING);
    zt_rpc_server_set_serving(srv, 1);
    assert_int_equal(zt_rpc_stream_recv(s, &data, &len), 1);
    assert_int_equal(((const uint8_t *)data)[1], ZT_RPC_HEALTH_SERVING);
    /* The server shutting down ends the watch. */
    zt_rpc_server_destroy(srv, 5.0);
    while (zt_rpc_stream_recv(s, &data, &len) == 1) {
    }
    int code = zt_rpc_stream_finish(s, &st);
    assert_int_not_equal(code, ZT_RPC_OK);
    zt_rpc_channel_destroy(ch);
}

static void test_bad_options(void **state)
{
    (void)state;
    struct zt_rpc_server_options sopt = {0};
    zt_rpc_server_t *srv = start_server(&sopt);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", zt_rpc_server_port(srv));
    struct zt_rpc_server_options again = {.listen_addr = addr};
    zt_rpc_server_t *other = NULL;
    zt_err err = {{0}};
    assert_true(zt_rpc_server_create(&again, &other, &err) < 0);
    assert_null(other);
    assert_non_null(strstr(err.msg, addr));
    zt_rpc_server_destroy(srv, 5.0);

    struct zt_rpc_server_options half = {.listen_addr = "127.0.0.1:0", .tls_cert_file = "/nonexistent.pem"};
    assert_int_equal(zt_rpc_server_create(&half, &other, &err), ZT_EINVAL_CONFIG);
    struct zt_rpc_server_options missing = {
        .listen_addr = "127.0.0.1:0", .tls_cert_file = "/nonexistent.pem", .tls_key_file = "/nonexistent.key"};
    assert_true(zt_rpc_server_create(&missing, &other, &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent.pem"));
}

/* ---- TLS ---- */

static char tls_dir[256];

static void make_certs(void)
{
    snprintf(tls_dir, sizeof(tls_dir), "/tmp/zt_rpc_tls_XXXXXX");
    assert_non_null(mkdtemp(tls_dir));
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "cd %s && "
             "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ztrain-test-ca -keyout ca.key -out ca.pem && "
             "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && "
             "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr && "
             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile san.ext -out server.pem && "
             "openssl req -newkey rsa:2048 -nodes -subj /CN=ztrain-worker -keyout client.key -out client.csr && "
             "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out client.pem && "
             "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ztrain-worker -keyout rogue.key -out rogue.pem",
             tls_dir);
    char quiet[4200];
    snprintf(quiet, sizeof(quiet), "(%s) >/dev/null 2>&1", cmd);
    if (system(quiet) != 0)
        fail_msg("openssl could not make the test certificates in %s", tls_dir);
}

static void remove_certs(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tls_dir);
    assert_int_equal(system(cmd), 0);
}

static char *tls_path(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", tls_dir, name);
    return buf;
}

static void test_tls(void **state)
{
    (void)state;
    make_certs();
    char cert[300], key[300], ca[300], ccert[300], ckey[300];
    struct zt_rpc_server_options sopt = {0};
    sopt.tls_cert_file = tls_path("server.pem", cert, sizeof(cert));
    sopt.tls_key_file = tls_path("server.key", key, sizeof(key));
    sopt.token = "tls-token";
    zt_rpc_server_t *srv = start_server(&sopt);
    int port = zt_rpc_server_port(srv);
    struct zt_rpc_status st;

    struct zt_rpc_channel_options good = {.tls_ca_file = tls_path("ca.pem", ca, sizeof(ca)), .token = "tls-token"};
    zt_rpc_channel_t *ch = connect_to(port, &good);
    assert_int_equal(echo(ch, "over tls", &st), ZT_RPC_OK);
    zt_rpc_channel_destroy(ch);

    /* A plaintext client against the TLS server: refused, the server keeps serving. */
    struct zt_rpc_channel_options plain = {.token = "tls-token"};
    ch = connect_to(port, &plain);
    assert_int_equal(echo(ch, "plaintext", &st), ZT_RPC_UNAVAILABLE);
    zt_rpc_channel_destroy(ch);
    ch = connect_to(port, &good);
    assert_int_equal(echo(ch, "still there", &st), ZT_RPC_OK);
    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);

    /* Mutual TLS: a client without a certificate is refused, one with a certificate of the CA passes. */
    struct zt_rpc_server_options mopt = {0};
    mopt.tls_cert_file = cert;
    mopt.tls_key_file = key;
    mopt.tls_ca_file = ca;
    mopt.require_client_cert = 1;
    srv = start_server(&mopt);
    port = zt_rpc_server_port(srv);
    struct zt_rpc_channel_options nocert = {.tls_ca_file = ca};
    ch = connect_to(port, &nocert);
    assert_int_equal(echo(ch, "no cert", &st), ZT_RPC_UNAVAILABLE);
    zt_rpc_channel_destroy(ch);
    struct zt_rpc_channel_options withcert = {
        .tls_ca_file = ca,
        .tls_cert_file = tls_path("client.pem", ccert, sizeof(ccert)),
        .tls_key_file = tls_path("client.key", ckey, sizeof(ckey)),
    };
    ch = connect_to(port, &withcert);
    assert_int_equal(echo(ch, "with cert", &st), ZT_RPC_OK);
    zt_rpc_channel_destroy(ch);
    /* A certificate with the right name that the CA did not sign: refused (the server verifies it). */
    char rcert[300], rkey[300];
    struct zt_rpc_channel_options rogue = {
        .tls_ca_file = ca,
        .tls_cert_file = tls_path("rogue.pem", rcert, sizeof(rcert)),
        .tls_key_file = tls_path("rogue.key", rkey, sizeof(rkey)),
    };
    ch = connect_to(port, &rogue);
    assert_int_equal(echo(ch, "self-signed", &st), ZT_RPC_UNAVAILABLE);
    zt_rpc_channel_destroy(ch);
    zt_rpc_server_destroy(srv, 5.0);
    remove_certs();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_and_errors), cmocka_unit_test(test_streams), cmocka_unit_test(test_token),
        cmocka_unit_test(test_size_limit),       cmocka_unit_test(test_deadlines), cmocka_unit_test(test_health),
        cmocka_unit_test(test_bad_options),      cmocka_unit_test(test_tls),
        cmocka_unit_test(test_token_rotation),   cmocka_unit_test(test_token_equal_constant_time),
        cmocka_unit_test(test_local_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
