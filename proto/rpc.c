/* The gRPC glue: ztrain's servers and clients over the gRPC C core (see rpc.h for the contract).
 *
 * Server design. Each listener (the main port, and optionally a plaintext health-only port) is one
 * grpc_server with one completion queue for new-call notifications and one dispatcher thread. All calls
 * are requested as "unregistered" calls (grpc_server_request_call), so that the dispatcher sees every
 * method name, answers unknown ones with UNIMPLEMENTED instead of leaving them hanging, and looks up the
 * handler itself. Each accepted call gets its own thread and its own pluck completion queue, on which
 * the thread runs the call synchronously: read, write and status are one batch each, waited for with the
 * call's deadline. A RECV_CLOSE_ON_SERVER op is started first on every call so that cancellation (by
 * the client, by the deadline or by a message over the size limit) is seen.
 *
 * Client design. Every call (unary or streaming) gets its own pluck completion queue; the status op is
 * started with the call, so that a send or receive that fails because the server ended the call is
 * followed by the server's real status. */
#include "proto/rpc.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/fileio.h"
#include "common/log.h"
#include "grpc/health/v1/health.pb-c.h"

#if defined(__SANITIZE_ADDRESS__)
/* LeakSanitizer reads this at exit in -DZT_SANITIZE=address builds of every program that links the gRPC
 * glue (ztrain, ztrain-server, the tests), so that a leak inside gRPC itself does not fail them. libgrpc
 * 1.51 (Debian 12) leaks the slot arrays of slice buffers grown in its TLS transport (about 4 KB a
 * connection; allocated by gpr_realloc under grpc_slice_buffer_add_indexed from gRPC's poller, never by
 * ztrain, which does not call gpr_realloc). Only these gRPC frames are matched. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:gpr_realloc\nleak:grpc_slice_buffer_add_indexed\n";
}
#endif

#define HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define HEALTH_WATCH "/grpc.health.v1.Health/Watch"
#define HEALTH_SERVICE "grpc.health.v1.Health"
#define DEFAULT_MAX_CALLS 256
#define REQUESTS_PER_LISTENER 4 /* unregistered-call requests kept posted per listener */

/* Distinct tags for the ops of one call (each call has its own queue, so addresses of statics suffice). */
static char tag_close, tag_read, tag_write, tag_status, tag_start, tag_shutdown;

const char *zt_rpc_code_name(int code)
{
    static const char *const names[] = {
        "OK",           "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND",     "ALREADY_EXISTS",    "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",    "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",       "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (code >= 0 && code < (int)(sizeof(names) / sizeof(names[0])))
        return names[code];
    return "UNKNOWN_CODE";
}

/* ------------------------------------------------------------------------------------------------ */
/* Small helpers                                                                                    */

static gpr_timespec deadline_in(double seconds)
{
    if (seconds < 0)
        seconds = 0;
    if (seconds > 1e9)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis((int64_t)(seconds * 1000.0), GPR_TIMESPAN));
}

static double seconds_until(gpr_timespec deadline)
{
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    deadline = gpr_convert_clock_type(deadline, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(deadline, now);
    return (double)left.tv_sec + (double)left.tv_nsec * 1e-9;
}

/* Copies a byte buffer into *buf (grown as needed); returns the length. */
static size_t flatten(grpc_byte_buffer *bb, char **buf, size_t *cap)
{
    grpc_byte_buffer_reader reader;
    size_t len = grpc_byte_buffer_length(bb);
    if (len + 1 > *cap) {
        free(*buf);
        *cap = len + 1;
        *buf = zt_xmalloc(*cap);
    }
    size_t off = 0;
    if (grpc_byte_buffer_reader_init(&reader, bb)) {
        grpc_slice slice;
        while (grpc_byte_buffer_reader_next(&reader, &slice)) {
            size_t n = GRPC_SLICE_LENGTH(slice);
            ZT_ASSERT(off + n <= len);
            memcpy(*buf + off, GRPC_SLICE_START_PTR(slice), n);
            off += n;
            grpc_slice_unref(slice);
        }
        grpc_byte_buffer_reader_destroy(&reader);
    }
    ZT_ASSERT(off == len);
    return len;
}

static grpc_byte_buffer *make_buffer(const void *data, size_t len)
{
    grpc_slice slice = grpc_slice_from_copied_buffer(data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

/* A byte buffer that takes ownership of data (malloc'd) without a copy: the slice frees data when gRPC
 * drops its last reference, which may be after the send that uses the buffer has completed (the
 * transport can still hold the bytes for the socket). */
static grpc_byte_buffer *owned_buffer(void *data, size_t len)
{
    grpc_slice slice = grpc_slice_new(data, len, free);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

/* Channel arguments for bulk streams (1 MiB chunks) on both ends of a connection. gRPC's defaults suit
 * small messages: 16 KiB HTTP/2 frames and socket reads that start small and grow. Larger frames and
 * reads mean fewer frame headers, fewer read syscalls and fewer, larger slices per message. Appends to
 * args[*n] (ZT_TUNE_ARGS of them) and advances *n. */
#define ZT_TUNE_ARGS 5
static void add_throughput_args(grpc_arg *args, int *n)
{
    static const struct {
        const char *key;
        int value;
    } tune[ZT_TUNE_ARGS] = {
        {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20},         /* default 16 KiB */
        {GRPC_ARG_TCP_READ_CHUNK_SIZE, 1 << 20},          /* default 8 KiB, grown as reads fill */
        {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10},
        /* A fixed 8 MiB stream window instead of probing for one: several chunks in flight at once. */
        {GRPC_ARG_HTTP2_BDP_PROBE, 0},
        {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20},
    };
    for (int i = 0; i < ZT_TUNE_ARGS; i++) {
        args[*n].type = GRPC_ARG_INTEGER;
        args[*n].key = (char *)tune[i].key;
        args[(*n)++].value.integer = tune[i].value;
    }
}

/* Waits for tag on a pluck queue until deadline; on timeout cancels the call with DEADLINE_EXCEEDED and
 * waits for the (now prompt) completion. Returns the op's success flag; *timed_out says whether the
 * deadline passed. */
static int wait_op(grpc_completion_queue *cq, grpc_call *call, void *tag, gpr_timespec deadline, int *timed_out)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, deadline, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        if (timed_out != NULL)
            *timed_out = 1;
        grpc_call_cancel_with_status(call, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded", NULL);
        ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    ZT_ASSERT(ev.type == GRPC_OP_COMPLETE);
    return ev.success;
}

static void drain_and_destroy_queue(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
    }
    grpc_completion_queue_destroy(cq);
}

static int read_pem(const char *what, const char *path, char **out, zt_err *err)
{
    size_t len;
    zt_err e;
    int rc = zt_read_file(path, out, &len, &e);
    if (rc < 0)
        return zt_fail(err, rc, "cannot read the %s: %s", what, e.msg);
    return 0;
}

/* The service part of "/package.Service/Method", written into out. */
static void service_of(const char *method, char *out, size_t cap)
{
    const char *start = method[0] == '/' ? method + 1 : method;
    const char *slash = strchr(start, '/');
    size_t n = slash ? (size_t)(slash - start) : strlen(start);
    if (n >= cap)
        n = cap - 1;
    memcpy(out, start, n);
    out[n] = '\0';
}

/* ------------------------------------------------------------------------------------------------ */
/* Server                                                                                           */

struct method {
    char *name;
    char *service;
    enum zt_rpc_kind kind;
    zt_rpc_handler_fn handler;
    void *user;
};

struct listener {
    zt_rpc_server_t *srv;
    grpc_server *server;
    grpc_completion_queue *cq; /* notifications of new calls */
    pthread_t thread;
    int thread_started;
    int health_only;
    int port;
};

/* One posted request for a new call, and then the call it received. */
struct slot {
    struct listener *lis;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_completion_queue *call_cq;
};

struct zt_rpc_server {
    struct listener main;
    struct listener health;
    int has_health;
    int local_only;         /* no listener: only zt_rpc_server_call_local (no gRPC core in use) */
    char **tokens;          /* accepted bearer tokens (ntokens; none: no token required), guarded by mu:
                             * zt_rpc_server_set_tokens replaces them while calls run */
    int ntokens;
    size_t max_message;
    double default_deadline_s;
    int max_calls;
    struct method *methods;
    int n_methods;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;
    int shutting_down;
    int active_calls;
    int serving;
    unsigned health_version; /* bumped on every change of serving */
};

struct zt_rpc_call {
    zt_rpc_server_t *srv;
    struct slot *slot;
    grpc_call *call;
    grpc_completion_queue *cq;
    gpr_timespec deadline; /* monotonic */
    const struct method *method;
    char method_name[256];
    char *peer;
    int cancelled;      /* written by the core when the close op completes */
    int close_done;
    int read_done;      /* the client half-closed */
    int md_sent;
    int writes;
    int status_code;
    char status_msg[ZT_ERR_LEN];
    char *buf;
    size_t cap;
    grpc_byte_buffer *held;     /* the message zt_rpc_call_read_parts() last returned, or NULL */
    struct zt_rpc_part *parts;  /* its pieces */
    size_t parts_cap;
    /* An in-process call (zt_rpc_server_call_local): requests from memory, responses to a callback. */
    int local;
    const struct zt_rpc_local_msg *local_reqs;
    size_t local_nreqs;
    size_t local_next;
    zt_rpc_response_fn local_cb;
    void *local_user;
    int local_ended; /* the status is decided (a message over the limit), as when the core cancels a call */
};

static int post_request(struct listener *lis)
{
    struct slot *s = zt_xcalloc(1, sizeof(*s));
    s->lis = lis;
    grpc_call_details_init(&s->details);
    grpc_metadata_array_init(&s->md);
    s->call_cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call_error e = grpc_server_request_call(lis->server, &s->call, &s->details, &s->md, s->call_cq, lis->cq, s);
    if (e != GRPC_CALL_OK) {
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->md);
        grpc_completion_queue_destroy(s->call_cq);
        free(s);
        return -1;
    }
    return 0;
}

static void free_slot(struct slot *s)
{
    grpc_call_details_destroy(&s->details);
    grpc_metadata_array_destroy(&s->md);
    if (s->call != NULL)
        grpc_call_unref(s->call);
    drain_and_destroy_queue(s->call_cq);
    free(s);
}

/* Answers a call with a status and no response, without a handler thread (used when over max_calls). */
static void reject_inline(struct slot *s, grpc_status_code code, const char *msg)
{
    int cancelled = 0;
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    grpc_slice details = grpc_slice_from_copied_string(msg);
    ops[1].data.send_status_from_server.status = code;
    ops[1].data.send_status_from_server.status_details = &details;
    ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[2].data.recv_close_on_server.cancelled = &cancelled;
    if (grpc_call_start_batch(s->call, ops, 3, &tag_status, NULL) == GRPC_CALL_OK)
        wait_op(s->call_cq, s->call, &tag_status, deadline_in(10.0), NULL);
    grpc_slice_unref(details);
}

static int finish_call(zt_rpc_call_t *c);
static int run_health(zt_rpc_call_t *c, int watch);

/* Wipes and frees an array of n tokens. */
static void free_tokens(char **tokens, int n)
{
    for (int i = 0; i < n; i++) {
        explicit_bzero(tokens[i], strlen(tokens[i]));
        free(tokens[i]);
    }
    free(tokens);
}

/* Runs the handler of c->method_name (or the health service, or answers UNIMPLEMENTED) and records the
 * call's status: the step after authentication that network and in-process calls share. */
static void run_method(zt_rpc_call_t *c, int health_only)
{
    zt_rpc_server_t *srv = c->srv;
    if (strcmp(c->method_name, HEALTH_CHECK) == 0 || strcmp(c->method_name, HEALTH_WATCH) == 0) {
        if (c->local && strcmp(c->method_name, HEALTH_WATCH) == 0)
            zt_rpc_call_fail(c, ZT_RPC_UNIMPLEMENTED, "Health/Watch is not served to in-process calls");
        else
            run_health(c, strcmp(c->method_name, HEALTH_WATCH) == 0);
        return;
    }
    for (int i = 0; !health_only && i < srv->n_methods; i++) {
        if (strcmp(srv->methods[i].name, c->method_name) == 0)
            c->method = &srv->methods[i];
    }
    if (c->method == NULL) {
        zt_rpc_call_fail(c, ZT_RPC_UNIMPLEMENTED, "method %s is not served here%s", c->method_name,
                         health_only ? " (this port serves only grpc.health.v1.Health)" : "");
        return;
    }
    int code = c->method->handler(c, c->method->user);
    if (code != ZT_RPC_OK && c->status_code == ZT_RPC_OK)
        zt_rpc_call_fail(c, code, "%s failed", c->method_name);
    else if (code == ZT_RPC_OK && c->method->kind != ZT_RPC_KIND_SERVER_STREAM && c->writes == 0 &&
             c->status_code == ZT_RPC_OK)
        zt_rpc_call_fail(c, ZT_RPC_INTERNAL, "%s returned no response", c->method_name);
}

/* Compares in time that depends only on want_len: every byte of want is looked at, whatever the
 * presented bytes are (see rpc.h). */
int zt_rpc_token_equal(const char *want, const void *got, size_t got_len)
{
    const volatile unsigned char *g = got;
    size_t wlen = strlen(want);
    unsigned diff = (unsigned)(got_len != wlen);
    for (size_t i = 0; i < wlen; i++) {
        unsigned char have = i < got_len ? g[i] : 0;
        diff |= (unsigned)((unsigned char)want[i] ^ have);
    }
    return diff == 0;
}

/* Checks "authorization: Bearer <token>" in constant time (zt_rpc_token_equal) against every token
 * accepted at the moment (zt_rpc_server_set_tokens may replace them). Returns 0 when allowed. */
static int check_token(zt_rpc_server_t *srv, const grpc_metadata_array *md, char *why, size_t cap)
{
    const grpc_slice *value = NULL;
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") == 0)
            value = &md->metadata[i].value;
    }
    pthread_mutex_lock(&srv->mu);
    int ok = srv->ntokens == 0;
    if (!ok && value != NULL) {
        static const char prefix[] = "Bearer ";
        size_t plen = sizeof(prefix) - 1, vlen = GRPC_SLICE_LENGTH(*value);
        const unsigned char *v = GRPC_SLICE_START_PTR(*value);
        /* The prefix is public: only the token's bytes need the constant-time comparison, against every
         * accepted token (no early exit: the time does not tell which one, if any, matched). */
        int prefix_ok = vlen >= plen && memcmp(v, prefix, plen) == 0;
        int token_ok = 0;
        for (int i = 0; i < srv->ntokens; i++)
            token_ok |= zt_rpc_token_equal(srv->tokens[i], prefix_ok ? v + plen : v, prefix_ok ? vlen - plen : 0);
        ok = prefix_ok & token_ok;
    }
    pthread_mutex_unlock(&srv->mu);
    if (ok)
        return 0;
    if (value == NULL)
        snprintf(why, cap, "this server requires a bearer token and the call carried none: send metadata "
                           "'authorization: Bearer <token>' (ztrain: --token-file)");
    else
        snprintf(why, cap, "the bearer token of the call does not match this server's token: check that "
                           "client and server read the same token file");
    return -1;
}

static void *call_thread(void *arg)
{
    struct slot *s = arg;
    zt_rpc_server_t *srv = s->lis->srv;
    zt_rpc_call_t *c = zt_xcalloc(1, sizeof(*c));
    c->srv = srv;
    c->slot = s;
    c->call = s->call;
    c->cq = s->call_cq;
    size_t mlen = GRPC_SLICE_LENGTH(s->details.method);
    if (mlen >= sizeof(c->method_name))
        mlen = sizeof(c->method_name) - 1;
    memcpy(c->method_name, GRPC_SLICE_START_PTR(s->details.method), mlen);
    c->method_name[mlen] = '\0';
    c->peer = grpc_call_get_peer(c->call);

    /* The client's deadline, capped by the server's default (which also applies when there is none). */
    gpr_timespec cap = deadline_in(srv->default_deadline_s);
    gpr_timespec client = gpr_convert_clock_type(s->details.deadline, GPR_CLOCK_MONOTONIC);
    c->deadline = gpr_time_cmp(client, cap) < 0 ? client : cap;

    grpc_op close_op;
    memset(&close_op, 0, sizeof(close_op));
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->cancelled;
    ZT_ASSERT(grpc_call_start_batch(c->call, &close_op, 1, &tag_close, NULL) == GRPC_CALL_OK);

    char why[ZT_ERR_LEN];
    if (!s->lis->health_only && check_token(srv, &s->md, why, sizeof(why)) != 0) {
        ZT_WARN("rpc: %s from %s refused: %s", c->method_name, c->peer, why);
        zt_rpc_call_fail(c, ZT_RPC_UNAUTHENTICATED, "%s", why);
    } else {
        run_method(c, s->lis->health_only);
    }
    finish_call(c);

    if (!c->close_done)
        wait_op(c->cq, c->call, &tag_close, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    gpr_free(c->peer);
    if (c->held != NULL)
        grpc_byte_buffer_destroy(c->held);
    free(c->parts);
    free(c->buf);
    free(c);
    free_slot(s);

    pthread_mutex_lock(&srv->mu);
    srv->active_calls--;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

static int finish_call(zt_rpc_call_t *c)
{
    grpc_op ops[2];
    int n = 0;
    memset(ops, 0, sizeof(ops));
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = 1;
    }
    grpc_slice details = grpc_slice_from_copied_string(c->status_msg);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->status_code;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    int ok = 0;
    if (grpc_call_start_batch(c->call, ops, (size_t)n, &tag_status, NULL) == GRPC_CALL_OK)
        ok = wait_op(c->cq, c->call, &tag_status, c->deadline, NULL);
    grpc_slice_unref(details);
    if (c->status_code != ZT_RPC_OK)
        ZT_DEBUG("rpc: %s from %s -> %s: %s", c->method_name, c->peer, zt_rpc_code_name(c->status_code),
                 c->status_msg);
    return ok ? 0 : -ECONNABORTED;
}

static void dispatch(struct listener *lis, struct slot *s)
{
    zt_rpc_server_t *srv = lis->srv;
    pthread_mutex_lock(&srv->mu);
    int over = srv->active_calls >= srv->max_calls;
    if (!over)
        srv->active_calls++;
    pthread_mutex_unlock(&srv->mu);
    if (over) {
        reject_inline(s, GRPC_STATUS_UNAVAILABLE, "the server is handling its maximum number of calls; retry later");
        free_slot(s);
        return;
    }
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, call_thread, s) != 0) {
        pthread_mutex_lock(&srv->mu);
        srv->active_calls--;
        pthread_mutex_unlock(&srv->mu);
        reject_inline(s, GRPC_STATUS_UNAVAILABLE, "the server could not start a thread for the call");
        free_slot(s);
    }
    pthread_attr_destroy(&attr);
}

static void *dispatcher_thread(void *arg)
{
    struct listener *lis = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(lis->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &tag_shutdown) {
            grpc_completion_queue_shutdown(lis->cq);
            continue;
        }
        struct slot *s = ev.tag;
        if (!ev.success) { /* the server is shutting down: the request was failed */
            free_slot(s);
            continue;
        }
        pthread_mutex_lock(&lis->srv->mu);
        int stopping = lis->srv->shutting_down;
        pthread_mutex_unlock(&lis->srv->mu);
        if (!stopping)
            post_request(lis);
        dispatch(lis, s);
    }
    return NULL;
}

static int open_listener(zt_rpc_server_t *srv, struct listener *lis, const char *addr, grpc_server_credentials *creds,
                         int health_only, zt_err *err)
{
    grpc_arg args[3 + ZT_TUNE_ARGS];
    memset(args, 0, sizeof(args));
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)srv->max_message;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)srv->max_message;
    /* Without this, Linux lets a second server bind the same port and steal half the connections. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    int nargs = 3;
    add_throughput_args(args, &nargs);
    grpc_channel_args chargs = {(size_t)nargs, args};

    lis->srv = srv;
    lis->health_only = health_only;
    lis->server = grpc_server_create(&chargs, NULL);
    lis->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(lis->server, lis->cq, NULL);
    lis->port = grpc_server_add_http2_port(lis->server, addr, creds);
    if (lis->port == 0)
        return zt_fail(err, -EADDRINUSE,
                       "cannot listen on %s: the address is malformed, not local, or the port is in use "
                       "(pick another with --listen host:port)",
                       addr);
    return 0;
}

static void close_listener(struct listener *lis)
{
    if (lis->server == NULL)
        return;
    if (lis->thread_started) {
        pthread_join(lis->thread, NULL);
    } else {
        /* Never started: no dispatcher, shut down directly. */
        grpc_server_shutdown_and_notify(lis->server, lis->cq, &tag_shutdown);
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(lis->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_OP_COMPLETE && ev.tag == &tag_shutdown)
                grpc_completion_queue_shutdown(lis->cq);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
        }
    }
    grpc_server_destroy(lis->server);
    grpc_completion_queue_destroy(lis->cq);
    lis->server = NULL;
}

int zt_rpc_server_create(const struct zt_rpc_server_options *opt, zt_rpc_server_t **out, zt_err *err)
{
    *out = NULL;
    if (opt == NULL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "no server options given");
    if (opt->listen_addr == NULL && opt->health_listen_addr == NULL) {
        /* No listener: a server for in-process calls only, which needs nothing of the gRPC core. */
        zt_rpc_server_t *srv = zt_xcalloc(1, sizeof(*srv));
        pthread_mutex_init(&srv->mu, NULL);
        pthread_cond_init(&srv->cv, NULL);
        srv->local_only = 1;
        srv->serving = 1;
        srv->max_message = opt->max_message_bytes ? opt->max_message_bytes : ZT_RPC_DEFAULT_MAX_MESSAGE;
        srv->default_deadline_s = opt->default_deadline_s > 0 ? opt->default_deadline_s : ZT_RPC_DEFAULT_DEADLINE_S;
        srv->max_calls = opt->max_calls > 0 ? opt->max_calls : DEFAULT_MAX_CALLS;
        *out = srv;
        return 0;
    }
    if (opt->listen_addr == NULL || opt->listen_addr[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "no listen address given (example: 127.0.0.1:7070)");
    if ((opt->tls_cert_file == NULL) != (opt->tls_key_file == NULL))
        return zt_fail(err, ZT_EINVAL_CONFIG, "TLS needs both a certificate and a key (--tls-cert and --tls-key)");
    if (opt->require_client_cert && (opt->tls_ca_file == NULL || opt->tls_cert_file == NULL))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "requiring client certificates needs TLS and a CA to check them against (--tls-ca)");
    if (opt->token != NULL && opt->token[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "the bearer token is empty; put a non-empty token in the token file");

    grpc_init();
    zt_rpc_server_t *srv = zt_xcalloc(1, sizeof(*srv));
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    srv->serving = 1;
    if (opt->token != NULL) {
        srv->tokens = zt_xmalloc(sizeof(*srv->tokens));
        srv->tokens[0] = strdup(opt->token);
        ZT_ASSERT(srv->tokens[0] != NULL);
        srv->ntokens = 1;
    }
    srv->max_message = opt->max_message_bytes ? opt->max_message_bytes : ZT_RPC_DEFAULT_MAX_MESSAGE;
    if (srv->max_message > 0x7fffffff)
        srv->max_message = 0x7fffffff;
    srv->default_deadline_s = opt->default_deadline_s > 0 ? opt->default_deadline_s : ZT_RPC_DEFAULT_DEADLINE_S;
    srv->max_calls = opt->max_calls > 0 ? opt->max_calls : DEFAULT_MAX_CALLS;

    int rc = 0;
    grpc_server_credentials *creds = NULL;
    if (opt->tls_cert_file != NULL) {
        char *cert = NULL, *key = NULL, *ca = NULL;
        if ((rc = read_pem("TLS certificate", opt->tls_cert_file, &cert, err)) == 0 &&
            (rc = read_pem("TLS key", opt->tls_key_file, &key, err)) == 0 &&
            (opt->tls_ca_file == NULL || (rc = read_pem("TLS CA", opt->tls_ca_file, &ca, err)) == 0)) {
            grpc_ssl_pem_key_cert_pair pair = {key, cert};
            grpc_ssl_client_certificate_request_type req =
                opt->require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                         : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
            creds = grpc_ssl_server_credentials_create_ex(ca, &pair, 1, req, NULL);
            if (creds == NULL)
                rc = zt_fail(err, ZT_EFORMAT, "the TLS certificate %s or key %s is not valid PEM", opt->tls_cert_file,
                             opt->tls_key_file);
        }
        free(cert);
        free(key);
        free(ca);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    if (rc == 0)
        rc = open_listener(srv, &srv->main, opt->listen_addr, creds, 0, err);
    if (creds != NULL)
        grpc_server_credentials_release(creds);
    if (rc == 0 && opt->health_listen_addr != NULL && opt->health_listen_addr[0] != '\0') {
        grpc_server_credentials *plain = grpc_insecure_server_credentials_create();
        srv->has_health = 1;
        rc = open_listener(srv, &srv->health, opt->health_listen_addr, plain, 1, err);
        grpc_server_credentials_release(plain);
    }
    if (rc != 0) {
        zt_rpc_server_destroy(srv, 0);
        return rc;
    }
    *out = srv;
    return 0;
}

int zt_rpc_server_add_method(zt_rpc_server_t *srv, const char *method, enum zt_rpc_kind kind,
                             zt_rpc_handler_fn handler, void *user, zt_err *err)
{
    if (srv->started)
        return zt_fail(err, ZT_ESTATE, "method %s added after the server started", method);
    if (method == NULL || method[0] != '/' || strchr(method + 1, '/') == NULL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "method name '%s' is not of the form /package.Service/Method",
                       method ? method : "(null)");
    for (int i = 0; i < srv->n_methods; i++) {
        if (strcmp(srv->methods[i].name, method) == 0)
            return zt_fail(err, ZT_ESTATE, "method %s is registered twice", method);
    }
    srv->methods = realloc(srv->methods, (size_t)(srv->n_methods + 1) * sizeof(*srv->methods));
    ZT_ASSERT(srv->methods != NULL);
    struct method *m = &srv->methods[srv->n_methods++];
    char service[256];
    service_of(method, service, sizeof(service));
    m->name = strdup(method);
    m->service = strdup(service);
    m->kind = kind;
    m->handler = handler;
    m->user = user;
    return 0;
}

static int start_listener(struct listener *lis, zt_err *err)
{
    grpc_server_start(lis->server);
    for (int i = 0; i < REQUESTS_PER_LISTENER; i++) {
        if (post_request(lis) != 0)
            return zt_fail(err, ZT_ESTATE, "the gRPC server refused to accept calls");
    }
    if (pthread_create(&lis->thread, NULL, dispatcher_thread, lis) != 0)
        return zt_fail(err, -EAGAIN, "cannot start the server's dispatcher thread");
    lis->thread_started = 1;
    return 0;
}

int zt_rpc_server_start(zt_rpc_server_t *srv, zt_err *err)
{
    if (srv->started)
        return zt_fail(err, ZT_ESTATE, "the server is already started");
    srv->started = 1;
    if (srv->local_only)
        return 0;
    int rc = start_listener(&srv->main, err);
    if (rc == 0 && srv->has_health)
        rc = start_listener(&srv->health, err);
    return rc;
}

int zt_rpc_server_port(const zt_rpc_server_t *srv)
{
    return srv->main.port;
}

int zt_rpc_server_health_port(const zt_rpc_server_t *srv)
{
    return srv->has_health ? srv->health.port : 0;
}

void zt_rpc_server_set_serving(zt_rpc_server_t *srv, int serving)
{
    pthread_mutex_lock(&srv->mu);
    if (srv->serving != (serving != 0)) {
        srv->serving = serving != 0;
        srv->health_version++;
        pthread_cond_broadcast(&srv->cv);
    }
    pthread_mutex_unlock(&srv->mu);
}

void zt_rpc_server_destroy(zt_rpc_server_t *srv, double grace_s)
{
    if (srv == NULL)
        return;
    pthread_mutex_lock(&srv->mu);
    srv->shutting_down = 1;
    srv->serving = 0;
    srv->health_version++;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);

    struct listener *all[2] = {&srv->main, &srv->health};
    for (int i = 0; i < 2; i++) {
        if (all[i]->server != NULL && all[i]->thread_started)
            grpc_server_shutdown_and_notify(all[i]->server, all[i]->cq, &tag_shutdown);
    }
    /* Let running calls finish within the grace period, then cancel what is left. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)grace_s;
    until.tv_nsec += (long)((grace_s - (double)(time_t)grace_s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&srv->mu);
    while (srv->active_calls > 0) {
        if (pthread_cond_timedwait(&srv->cv, &srv->mu, &until) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&srv->mu);
    for (int i = 0; i < 2; i++) {
        if (all[i]->server != NULL)
            grpc_server_cancel_all_calls(all[i]->server);
    }
    pthread_mutex_lock(&srv->mu);
    while (srv->active_calls > 0)
        pthread_cond_wait(&srv->cv, &srv->mu);
    pthread_mutex_unlock(&srv->mu);
    for (int i = 0; i < 2; i++)
        close_listener(all[i]);

    for (int i = 0; i < srv->n_methods; i++) {
        free(srv->methods[i].name);
        free(srv->methods[i].service);
    }
    free(srv->methods);
    free_tokens(srv->tokens, srv->ntokens);
    pthread_cond_destroy(&srv->cv);
    pthread_mutex_destroy(&srv->mu);
    int local_only = srv->local_only;
    free(srv);
    if (!local_only)
        grpc_shutdown();
}

int zt_rpc_server_set_tokens(zt_rpc_server_t *srv, const char *const *tokens, int n, zt_err *err)
{
    if (n < 1 || n > ZT_RPC_MAX_TOKENS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%d bearer tokens: give 1 to %d", n, ZT_RPC_MAX_TOKENS);
    for (int i = 0; i < n; i++)
        if (tokens[i] == NULL || tokens[i][0] == '\0')
            return zt_fail(err, ZT_EINVAL_CONFIG, "the new bearer token is empty; put a non-empty token in the token "
                           "file");
    char **copy = zt_xmalloc((size_t)n * sizeof(*copy));
    for (int i = 0; i < n; i++) {
        copy[i] = strdup(tokens[i]);
        ZT_ASSERT(copy[i] != NULL);
    }
    pthread_mutex_lock(&srv->mu);
    char **old = srv->tokens;
    int nold = srv->ntokens;
    srv->tokens = copy;
    srv->ntokens = n;
    pthread_mutex_unlock(&srv->mu);
    free_tokens(old, nold);
    return 0;
}

int zt_rpc_server_set_token(zt_rpc_server_t *srv, const char *token, zt_err *err)
{
    return zt_rpc_server_set_tokens(srv, &token, 1, err);
}

/* ------------------------------------------------------------------------------------------------ */
/* Call context                                                                                     */

/* Sees, without waiting, whether the call's close op completed; records cancellation. */
static void poll_close(zt_rpc_call_t *c)
{
    if (c->close_done)
        return;
    grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag_close, gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_OP_COMPLETE)
        c->close_done = 1;
}

/* Receives the next request message into *out (the caller destroys it). Returns 1, 0 at the end of the
 * client's stream, or a negative code as zt_rpc_call_read(). */
static int recv_request(zt_rpc_call_t *c, grpc_byte_buffer **out)
{
    *out = NULL;
    if (c->held != NULL) {
        grpc_byte_buffer_destroy(c->held);
        c->held = NULL;
    }
    if (c->read_done)
        return 0;
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (grpc_call_start_batch(c->call, &op, 1, &tag_read, NULL) != GRPC_CALL_OK)
        return -ECONNABORTED;
    int timed_out = 0;
    int ok = wait_op(c->cq, c->call, &tag_read, c->deadline, &timed_out);
    if (timed_out) {
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
        return -ETIMEDOUT;
    }
    if (!ok || bb == NULL) {
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
        poll_close(c);
        if (!ok || (c->close_done && c->cancelled))
            return -ECANCELED;
        c->read_done = 1;
        return 0;
    }
    *out = bb;
    return 1;
}

/* The next request of an in-process call: 1 with *m, 0 after the last one, -ETIMEDOUT once the call's
 * deadline has passed (as a network call's read would report it). */
static int local_request(zt_rpc_call_t *c, const struct zt_rpc_local_msg **m)
{
    if (seconds_until(c->deadline) <= 0)
        return -ETIMEDOUT;
    if (c->local_next >= c->local_nreqs) {
        c->read_done = 1;
        return 0;
    }
    *m = &c->local_reqs[c->local_next++];
    size_t len = 0;
    for (size_t i = 0; i < (*m)->nparts; i++)
        len += (*m)->parts[i].len;
    if (len > c->srv->max_message) { /* what the gRPC core does with such a message: cancel the call */
        zt_rpc_call_fail(c, ZT_RPC_RESOURCE_EXHAUSTED, "a request of %zu bytes is over the server's limit of %zu",
                         len, c->srv->max_message);
        c->local_ended = 1;
        return -ECANCELED;
    }
    return 1;
}

/* Copies the pieces of an in-process request into c->buf; returns its length. */
static size_t local_flatten(zt_rpc_call_t *c, const struct zt_rpc_local_msg *m)
{
    size_t len = 0;
    for (size_t i = 0; i < m->nparts; i++)
        len += m->parts[i].len;
    if (len + 1 > c->cap) {
        free(c->buf);
        c->cap = len + 1;
        c->buf = zt_xmalloc(c->cap);
    }
    size_t off = 0;
    for (size_t i = 0; i < m->nparts; i++) {
        if (m->parts[i].len > 0)
            memcpy(c->buf + off, m->parts[i].data, m->parts[i].len);
        off += m->parts[i].len;
    }
    return len;
}

int zt_rpc_call_read(zt_rpc_call_t *c, const void **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (c->local) {
        const struct zt_rpc_local_msg *m;
        int rc = local_request(c, &m);
        if (rc <= 0)
            return rc;
        *len = local_flatten(c, m);
        *data = c->buf;
        return 1;
    }
    grpc_byte_buffer *bb;
    int rc = recv_request(c, &bb);
    if (rc <= 0)
        return rc;
    size_t n = flatten(bb, &c->buf, &c->cap);
    grpc_byte_buffer_destroy(bb);
    *data = c->buf;
    *len = n;
    return 1;
}

/* Describes the received message bb as pieces in *parts (grown as needed; *parts_cap elements) without
 * copying its plain slices: bb is kept alive in *held until the caller's next read destroys it. A message
 * that is not plain slices (compressed) is flattened into *buf instead, as one piece, and destroyed.
 * Writes the number of pieces to *nparts and returns the message's length in bytes. */
static size_t split_message(grpc_byte_buffer *bb, char **buf, size_t *cap, struct zt_rpc_part **parts,
                            size_t *parts_cap, size_t *nparts, grpc_byte_buffer **held)
{
    if (bb->type != GRPC_BB_RAW || bb->data.raw.compression != GRPC_COMPRESS_NONE) {
        size_t n = flatten(bb, buf, cap);
        grpc_byte_buffer_destroy(bb);
        if (*parts_cap < 1) {
            *parts = zt_xmalloc(sizeof(**parts));
            *parts_cap = 1;
        }
        (*parts)[0].data = *buf;
        (*parts)[0].len = n;
        *nparts = 1;
        return n;
    }
    const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
    if (sb->count > *parts_cap) {
        free(*parts);
        *parts_cap = sb->count;
        *parts = zt_xmalloc(*parts_cap * sizeof(**parts));
    }
    size_t total = 0;
    for (size_t i = 0; i < sb->count; i++) {
        (*parts)[i].data = GRPC_SLICE_START_PTR(sb->slices[i]);
        (*parts)[i].len = GRPC_SLICE_LENGTH(sb->slices[i]);
        total += (*parts)[i].len;
    }
    *held = bb;
    *nparts = sb->count;
    return total;
}

int zt_rpc_call_read_parts(zt_rpc_call_t *c, const struct zt_rpc_part **parts, size_t *nparts, size_t *len)
{
    *parts = NULL;
    *nparts = 0;
    *len = 0;
    if (c->local) {
        const struct zt_rpc_local_msg *m;
        int rc = local_request(c, &m);
        if (rc <= 0)
            return rc;
        for (size_t i = 0; i < m->nparts; i++)
            *len += m->parts[i].len;
        *parts = m->parts;
        *nparts = m->nparts;
        return 1;
    }
    grpc_byte_buffer *bb;
    int rc = recv_request(c, &bb);
    if (rc <= 0)
        return rc;
    /* The pieces stay valid until the next read or the end of the call (c->held). */
    *len = split_message(bb, &c->buf, &c->cap, &c->parts, &c->parts_cap, nparts, &c->held);
    *parts = c->parts;
    return 1;
}

/* Sends bb as the call's next response (sending initial metadata first if not yet sent); destroys bb. */
static int send_response(zt_rpc_call_t *c, grpc_byte_buffer *bb)
{
    if (c->method != NULL && c->method->kind != ZT_RPC_KIND_SERVER_STREAM && c->writes > 0) {
        grpc_byte_buffer_destroy(bb);
        return ZT_ESTATE;
    }
    grpc_op ops[2];
    int n = 0;
    memset(ops, 0, sizeof(ops));
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = 1;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    int ok = 0;
    if (grpc_call_start_batch(c->call, ops, (size_t)n, &tag_write, NULL) == GRPC_CALL_OK)
        ok = wait_op(c->cq, c->call, &tag_write, c->deadline, NULL);
    grpc_byte_buffer_destroy(bb);
    if (!ok)
        return -ECONNABORTED;
    c->writes++;
    return 0;
}

/* Hands a response of an in-process call to its callback. */
static int local_response(zt_rpc_call_t *c, const void *data, size_t len)
{
    if (c->method != NULL && c->method->kind != ZT_RPC_KIND_SERVER_STREAM && c->writes > 0)
        return ZT_ESTATE;
    if (seconds_until(c->deadline) <= 0)
        return -ECONNABORTED;
    if (c->local_cb != NULL)
        c->local_cb(data, len, c->local_user);
    c->writes++;
    return 0;
}

int zt_rpc_call_write_owned(zt_rpc_call_t *c, void *data, size_t len)
{
    if (c->local) {
        int rc = local_response(c, data, len);
        free(data);
        return rc;
    }
    return send_response(c, owned_buffer(data, len)); /* data is freed when gRPC lets go of it */
}

int zt_rpc_call_write(zt_rpc_call_t *c, const void *data, size_t len)
{
    if (c->local)
        return local_response(c, data, len);
    return send_response(c, make_buffer(data, len));
}

int zt_rpc_call_fail(zt_rpc_call_t *c, int code, const char *fmt, ...)
{
    if (c->local_ended)
        return code;
    c->status_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->status_msg, sizeof(c->status_msg), fmt, ap);
    va_end(ap);
    return code;
}

double zt_rpc_call_time_left(const zt_rpc_call_t *c)
{
    return seconds_until(c->deadline);
}

int zt_rpc_call_is_cancelled(zt_rpc_call_t *c)
{
    if (c->local)
        return seconds_until(c->deadline) <= 0;
    poll_close(c);
    if (c->close_done && c->cancelled)
        return 1;
    return seconds_until(c->deadline) <= 0;
}

const char *zt_rpc_call_peer(const zt_rpc_call_t *c)
{
    if (c->local)
        return "local";
    return c->peer ? c->peer : "unknown";
}

int zt_rpc_server_call_local(zt_rpc_server_t *srv, const char *method, const struct zt_rpc_local_msg *reqs,
                             size_t nreqs, double timeout_s, zt_rpc_response_fn on_response, void *user,
                             struct zt_rpc_status *st)
{
    zt_rpc_call_t *c = zt_xcalloc(1, sizeof(*c));
    c->srv = srv;
    c->local = 1;
    c->local_reqs = reqs;
    c->local_nreqs = nreqs;
    c->local_cb = on_response;
    c->local_user = user;
    double limit = timeout_s > 0 && timeout_s < srv->default_deadline_s ? timeout_s : srv->default_deadline_s;
    c->deadline = deadline_in(limit);
    snprintf(c->method_name, sizeof(c->method_name), "%s", method ? method : "");
    run_method(c, 0);
    int code = c->status_code;
    if (st != NULL) {
        st->code = code;
        snprintf(st->msg, sizeof(st->msg), "%s", c->status_msg);
    }
    free(c->buf);
    free(c);
    return code;
}

const char *zt_rpc_call_method(const zt_rpc_call_t *c)
{
    return c->method_name;
}

/* ------------------------------------------------------------------------------------------------ */
/* grpc.health.v1.Health                                                                            */

/* Returns the status of service ("" = the server) or -1 for a service the server does not serve. */
static int health_of(zt_rpc_server_t *srv, const char *service, int serving)
{
    int known = service[0] == '\0' || strcmp(service, HEALTH_SERVICE) == 0;
    for (int i = 0; !known && i < srv->n_methods; i++)
        known = strcmp(srv->methods[i].service, service) == 0;
    if (!known)
        return -1;
    return serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static int write_health(zt_rpc_call_t *c, int status)
{
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    uint8_t buf[16];
    size_t n = grpc__health__v1__health_check_response__pack(&resp, buf);
    return zt_rpc_call_write(c, buf, n);
}

static int run_health(zt_rpc_call_t *c, int watch)
{
    zt_rpc_server_t *srv = c->srv;
    const void *data;
    size_t len;
    int rc = zt_rpc_call_read(c, &data, &len);
    if (rc < 0)
        return zt_rpc_call_fail(c, ZT_RPC_CANCELLED, "the call ended before its request arrived");
    if (rc == 0)
        return zt_rpc_call_fail(c, ZT_RPC_INVALID_ARGUMENT, "no HealthCheckRequest was sent");
    Grpc__Health__V1__HealthCheckRequest *req = grpc__health__v1__health_check_request__unpack(NULL, len, data);
    if (req == NULL)
        return zt_rpc_call_fail(c, ZT_RPC_INVALID_ARGUMENT, "the HealthCheckRequest is not a valid protobuf message");
    char service[256];
    snprintf(service, sizeof(service), "%s", req->service ? req->service : "");
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);

    pthread_mutex_lock(&srv->mu);
    int serving = srv->serving;
    unsigned version = srv->health_version;
    pthread_mutex_unlock(&srv->mu);
    int status = health_of(srv, service, serving);
    if (!watch) {
        if (status < 0)
            return zt_rpc_call_fail(c, ZT_RPC_NOT_FOUND, "unknown service '%s'", service);
        write_health(c, status);
        return ZT_RPC_OK;
    }
    if (status < 0)
        status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    if (write_health(c, status) != 0)
        return ZT_RPC_CANCELLED;
    /* Watch: send every change until the client goes away, the deadline passes or the server stops. The
     * wait alternates between the server's condition variable and the call's close op in short slices,
     * because one thread cannot block on both. */
    for (;;) {
        grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag_close, deadline_in(0.05), NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            c->close_done = 1;
            return ZT_RPC_CANCELLED;
        }
        if (seconds_until(c->deadline) <= 0)
            return zt_rpc_call_fail(c, ZT_RPC_DEADLINE_EXCEEDED, "deadline exceeded");
        pthread_mutex_lock(&srv->mu);
        int stopping = srv->shutting_down;
        if (srv->health_version == version && !stopping) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 200 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&srv->cv, &srv->mu, &until);
        }
        int changed = srv->health_version != version;
        version = srv->health_version;
        serving = srv->serving;
        stopping = srv->shutting_down;
        pthread_mutex_unlock(&srv->mu);
        if (changed) {
            int now = health_of(srv, service, serving);
            if (now < 0)
                now = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
            if (now != status && write_health(c, now) != 0)
                return ZT_RPC_CANCELLED;
            status = now;
        }
        if (stopping)
            return zt_rpc_call_fail(c, ZT_RPC_UNAVAILABLE, "the server is shutting down");
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Client                                                                                           */

struct zt_rpc_channel {
    grpc_channel *channel;
    char *auth; /* "Bearer <token>" or NULL */
};

struct zt_rpc_stream {
    zt_rpc_channel_t *ch;
    grpc_call *call;
    grpc_completion_queue *cq;
    gpr_timespec deadline; /* monotonic; waits get a margin past it, the core enforces it */
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code status;
    grpc_slice details;
    int got_initial;
    int send_closed;
    int recv_done;
    int broken; /* a send or receive failed: the call is over */
    int status_done; /* the status op completed (plucked) */
    char *buf;
    size_t cap;
    grpc_byte_buffer *held;   /* the message zt_rpc_stream_recv_parts() handed out, or NULL */
    struct zt_rpc_part *parts; /* its pieces */
    size_t parts_cap;
};

int zt_rpc_channel_create(const struct zt_rpc_channel_options *opt, zt_rpc_channel_t **out, zt_err *err)
{
    *out = NULL;
    if (opt == NULL || opt->target == NULL || opt->target[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "no server address given (example: 127.0.0.1:7070)");
    if ((opt->tls_cert_file == NULL) != (opt->tls_key_file == NULL))
        return zt_fail(err, ZT_EINVAL_CONFIG, "a client certificate needs its key too");
    grpc_init();
    grpc_channel_credentials *creds = NULL;
    int rc = 0;
    if (opt->tls_ca_file != NULL) {
        char *ca = NULL, *cert = NULL, *key = NULL;
        if ((rc = read_pem("TLS CA", opt->tls_ca_file, &ca, err)) == 0 &&
            (opt->tls_cert_file == NULL || ((rc = read_pem("TLS client certificate", opt->tls_cert_file, &cert, err)) == 0 &&
                                            (rc = read_pem("TLS client key", opt->tls_key_file, &key, err)) == 0))) {
            grpc_ssl_pem_key_cert_pair pair = {key, cert};
            creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
            if (creds == NULL)
                rc = zt_fail(err, ZT_EFORMAT, "the TLS files given to the client are not valid PEM");
        }
        free(ca);
        free(cert);
        free(key);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    if (rc != 0) {
        if (creds != NULL)
            grpc_channel_credentials_release(creds);
        grpc_shutdown();
        return rc;
    }
    grpc_arg args[3 + ZT_TUNE_ARGS];
    int nargs = 0;
    memset(args, 0, sizeof(args));
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[nargs++].value.integer = (int)(opt->max_message_bytes ? opt->max_message_bytes : ZT_RPC_DEFAULT_MAX_MESSAGE);
    if (opt->tls_server_name != NULL) {
        args[nargs].type = GRPC_ARG_STRING;
        args[nargs].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[nargs++].value.string = (char *)opt->tls_server_name;
    }
    if (opt->own_connection) {
        /* Channels otherwise share the connection (subchannel) of an earlier channel with equal arguments:
         * several streams then go through one socket, read and written by one thread at a time. */
        args[nargs].type = GRPC_ARG_INTEGER;
        args[nargs].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        args[nargs++].value.integer = 1;
    }
    add_throughput_args(args, &nargs);
    grpc_channel_args chargs = {(size_t)nargs, args};
    zt_rpc_channel_t *ch = zt_xcalloc(1, sizeof(*ch));
    ch->channel = grpc_channel_create(opt->target, creds, &chargs);
    grpc_channel_credentials_release(creds);
    if (opt->token != NULL) {
        size_t n = strlen(opt->token) + 8;
        ch->auth = zt_xmalloc(n);
        snprintf(ch->auth, n, "Bearer %s", opt->token);
    }
    *out = ch;
    return 0;
}

void zt_rpc_channel_destroy(zt_rpc_channel_t *ch)
{
    if (ch == NULL)
        return;
    grpc_channel_destroy(ch->channel);
    free(ch->auth);
    free(ch);
    grpc_shutdown();
}

int zt_rpc_stream_start(zt_rpc_channel_t *ch, const char *method, double timeout_s, unsigned flags,
                        zt_rpc_stream_t **out, zt_err *err)
{
    *out = NULL;
    zt_rpc_stream_t *s = zt_xcalloc(1, sizeof(*s));
    s->ch = ch;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    s->deadline = deadline_in(timeout_s);
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    grpc_slice mslice = grpc_slice_from_copied_string(method);
    s->call = grpc_channel_create_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, mslice, NULL,
                                       s->deadline, NULL);
    grpc_slice_unref(mslice);

    grpc_metadata md;
    memset(&md, 0, sizeof(md));
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (flags & ZT_RPC_WAIT_FOR_READY)
        ops[0].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY;
    if (ch->auth != NULL) {
        md.key = grpc_slice_from_static_string("authorization");
        md.value = grpc_slice_from_copied_string(ch->auth);
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &md;
    }
    grpc_call_error e = grpc_call_start_batch(s->call, ops, 1, &tag_start, NULL);
    if (e == GRPC_CALL_OK) {
        /* The status op goes first so that it is always there to tell why a later op failed. */
        ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[1].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
        ops[1].data.recv_status_on_client.status = &s->status;
        ops[1].data.recv_status_on_client.status_details = &s->details;
        e = grpc_call_start_batch(s->call, &ops[1], 1, &tag_status, NULL);
    }
    if (e != GRPC_CALL_OK) {
        if (ch->auth != NULL)
            grpc_slice_unref(md.value);
        grpc_call_unref(s->call);
        drain_and_destroy_queue(s->cq);
        free(s);
        return zt_fail(err, ZT_ESTATE, "cannot start a call of %s (gRPC call error %d)", method, (int)e);
    }
    int ok = wait_op(s->cq, s->call, &tag_start, gpr_time_add(s->deadline, gpr_time_from_seconds(5, GPR_TIMESPAN)), NULL);
    if (ch->auth != NULL)
        grpc_slice_unref(md.value);
    if (!ok)
        s->broken = 1;
    *out = s;
    return 0;
}

static gpr_timespec stream_wait_deadline(const zt_rpc_stream_t *s)
{
    return gpr_time_add(s->deadline, gpr_time_from_seconds(5, GPR_TIMESPAN));
}

/* Waits for a send. A server that ends the call without reading (a refusal) may leave a large send
 * waiting for flow control that never comes, so the wait looks at the status op in short slices and
 * cancels the send once the server's status is in. Returns the send's success flag. */
static int wait_send(zt_rpc_stream_t *s)
{
    gpr_timespec until = stream_wait_deadline(s);
    for (;;) {
        gpr_timespec slice = deadline_in(0.05);
        if (gpr_time_cmp(slice, until) > 0)
            slice = until;
        grpc_event ev = grpc_completion_queue_pluck(s->cq, &tag_write, slice, NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            return ev.success;
        if (!s->status_done) {
            ev = grpc_completion_queue_pluck(s->cq, &tag_status, gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type == GRPC_OP_COMPLETE) {
                s->status_done = 1;
                grpc_call_cancel(s->call, NULL);
            }
        }
        if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), until) >= 0)
            return wait_op(s->cq, s->call, &tag_write, until, NULL);
    }
}

/* Sends bb as the stream's next request and destroys it; 0, or -EPIPE (the stream is then broken). */
static int stream_send_buffer(zt_rpc_stream_t *s, grpc_byte_buffer *bb)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    int ok = 0;
    if (grpc_call_start_batch(s->call, &op, 1, &tag_write, NULL) == GRPC_CALL_OK)
        ok = wait_send(s);
    grpc_byte_buffer_destroy(bb);
    if (!ok) {
        s->broken = 1;
        return -EPIPE;
    }
    return 0;
}

int zt_rpc_stream_send(zt_rpc_stream_t *s, const void *data, size_t len)
{
    if (s->broken || s->send_closed)
        return -EPIPE;
    return stream_send_buffer(s, make_buffer(data, len));
}

int zt_rpc_stream_close_send(zt_rpc_stream_t *s)
{
    if (s->send_closed)
        return 0;
    s->send_closed = 1;
    if (s->broken)
        return -EPIPE;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    int ok = 0;
    if (grpc_call_start_batch(s->call, &op, 1, &tag_write, NULL) == GRPC_CALL_OK)
        ok = wait_op(s->cq, s->call, &tag_write, stream_wait_deadline(s), NULL);
    if (!ok) {
        s->broken = 1;
        return -EPIPE;
    }
    return 0;
}

/* Receives the next message of a client stream into *bb (NULL at the end of the stream), first releasing
 * the pieces a previous zt_rpc_stream_recv_parts() handed out, and reading the initial metadata with the
 * first message. Returns 0 (with *bb, or NULL at the end) or -EPIPE when the stream broke. */
static int stream_recv_message(zt_rpc_stream_t *s, grpc_byte_buffer **bb)
{
    *bb = NULL;
    if (s->held != NULL) {
        grpc_byte_buffer_destroy(s->held);
        s->held = NULL;
    }
    if (s->recv_done)
        return 0;
    grpc_op ops[2];
    int n = 0;
    memset(ops, 0, sizeof(ops));
    if (!s->got_initial) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
        s->got_initial = 1;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = bb;
    int ok = 0;
    if (grpc_call_start_batch(s->call, ops, (size_t)n, &tag_read, NULL) == GRPC_CALL_OK)
        ok = wait_op(s->cq, s->call, &tag_read, stream_wait_deadline(s), NULL);
    if (*bb == NULL) {
        s->recv_done = 1;
        if (!ok)
            s->broken = 1;
        return ok ? 0 : -EPIPE;
    }
    return 0;
}

int zt_rpc_stream_recv(zt_rpc_stream_t *s, const void **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    grpc_byte_buffer *bb;
    int rc = stream_recv_message(s, &bb);
    if (bb == NULL)
        return rc;
    size_t got = flatten(bb, &s->buf, &s->cap);
    grpc_byte_buffer_destroy(bb);
    *data = s->buf;
    *len = got;
    return 1;
}

int zt_rpc_stream_finish(zt_rpc_stream_t *s, struct zt_rpc_status *st)
{
    if (st != NULL) {
        st->code = ZT_RPC_INTERNAL;
        st->msg[0] = '\0';
    }
    if (s == NULL)
        return ZT_RPC_INTERNAL;
    if (!s->send_closed)
        zt_rpc_stream_close_send(s);
    const void *data;
    size_t len;
    /* Always receive: the core delivers the status only once initial metadata and messages are read. */
    while (zt_rpc_stream_recv(s, &data, &len) == 1) {
        /* drop unread responses */
    }
    if (!s->status_done)
        wait_op(s->cq, s->call, &tag_status, stream_wait_deadline(s), NULL);
    int code = (int)s->status;
    if (st != NULL) {
        st->code = code;
        size_t n = GRPC_SLICE_LENGTH(s->details);
        if (n >= sizeof(st->msg))
            n = sizeof(st->msg) - 1;
        memcpy(st->msg, GRPC_SLICE_START_PTR(s->details), n);
        st->msg[n] = '\0';
    }
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_call_unref(s->call);
    drain_and_destroy_queue(s->cq);
    free(s->buf);
    free(s->parts);
    free(s);
    return code;
}

int zt_rpc_unary(zt_rpc_channel_t *ch, const char *method, const void *req, size_t req_len, double timeout_s,
                 unsigned flags, void **resp, size_t *resp_len, struct zt_rpc_status *st)
{
    *resp = NULL;
    *resp_len = 0;
    zt_rpc_stream_t *s;
    zt_err err;
    if (zt_rpc_stream_start(ch, method, timeout_s, flags, &s, &err) != 0) {
        if (st != NULL) {
            st->code = ZT_RPC_INTERNAL;
            snprintf(st->msg, sizeof(st->msg), "%s", err.msg);
        }
        return ZT_RPC_INTERNAL;
    }
    const void *data = NULL;
    size_t len = 0;
    void *copy = NULL;
    size_t copy_len = 0;
    if (zt_rpc_stream_send(s, req, req_len) == 0 && zt_rpc_stream_close_send(s) == 0 &&
        zt_rpc_stream_recv(s, &data, &len) == 1) {
        copy = zt_xmalloc(len);
        memcpy(copy, data, len);
        copy_len = len;
    }
    int code = zt_rpc_stream_finish(s, st);
    if (code == ZT_RPC_OK && copy == NULL) {
        /* The response was lost on the way: seen when the connection broke under a call, as when a server
         * restarts. The server may or may not have run the call; UNAVAILABLE tells the caller to try again
         * (every method of ztrain's services may be called twice). */
        code = ZT_RPC_UNAVAILABLE;
        if (st != NULL) {
            st->code = code;
            snprintf(st->msg, sizeof(st->msg), "the connection broke before the response of %s arrived", method);
        }
    }
    if (code != ZT_RPC_OK) {
        free(copy);
        return code;
    }
    *resp = copy;
    *resp_len = copy_len;
    return ZT_RPC_OK;
}

int zt_rpc_health_check(zt_rpc_channel_t *ch, const char *service, double timeout_s, int *health,
                        struct zt_rpc_status *st)
{
    *health = ZT_RPC_HEALTH_UNKNOWN;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)(service ? service : "");
    size_t n = grpc__health__v1__health_check_request__get_packed_size(&req);
    uint8_t *buf = zt_xmalloc(n);
    grpc__health__v1__health_check_request__pack(&req, buf);
    void *resp;
    size_t resp_len;
    int code = zt_rpc_unary(ch, HEALTH_CHECK, buf, n, timeout_s, 0, &resp, &resp_len, st);
    free(buf);
    if (code != ZT_RPC_OK)
        return code;
    Grpc__Health__V1__HealthCheckResponse *r = grpc__health__v1__health_check_response__unpack(NULL, resp_len, resp);
    free(resp);
    if (r == NULL) {
        if (st != NULL) {
            st->code = ZT_RPC_INTERNAL;
            snprintf(st->msg, sizeof(st->msg), "the server's HealthCheckResponse is not a valid protobuf message");
        }
        return ZT_RPC_INTERNAL;
    }
    *health = (int)r->status;
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    return ZT_RPC_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* Client: bulk messages without copies                                                             */

int zt_rpc_stream_send_owned(zt_rpc_stream_t *s, void *data, size_t len)
{
    if (s->broken || s->send_closed) {
        free(data);
        return -EPIPE;
    }
    return stream_send_buffer(s, owned_buffer(data, len)); /* data is freed when gRPC lets go of it */
}

int zt_rpc_stream_send_borrowed(zt_rpc_stream_t *s, const void *head, size_t head_len, const void *data,
                                size_t data_len, void (*release)(void *user), void *user)
{
    if (s->broken || s->send_closed) {
        release(user);
        return -EPIPE;
    }
    /* two slices, one message: the small head copied, the data referenced where it lies (gRPC only reads
     * it; the cast drops const for the slice API) */
    grpc_slice slices[2] = {grpc_slice_from_copied_buffer(head, head_len),
                            data_len > 0 ? grpc_slice_new_with_user_data((void *)data, data_len, release, user)
                                         : grpc_empty_slice()};
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, 2);
    grpc_slice_unref(slices[0]);
    grpc_slice_unref(slices[1]);
    if (data_len == 0)
        release(user);
    return stream_send_buffer(s, bb);
}

int zt_rpc_stream_recv_parts(zt_rpc_stream_t *s, const struct zt_rpc_part **parts, size_t *nparts, size_t *len)
{
    *parts = NULL;
    *nparts = 0;
    *len = 0;
    grpc_byte_buffer *bb;
    int rc = stream_recv_message(s, &bb);
    if (bb == NULL)
        return rc;
    /* The pieces stay valid until the next receive or finish (s->held). */
    *len = split_message(bb, &s->buf, &s->cap, &s->parts, &s->parts_cap, nparts, &s->held);
    *parts = s->parts;
    return 1;
}
