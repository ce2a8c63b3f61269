/* The gRPC glue of ztrain: a small, explicit C API over the gRPC C core for servers and clients.
 *
 * This is the only interface in ztrain that reaches the gRPC C core (whose API is not stable across
 * releases); every other module speaks in bytes of serialized protobuf messages through it.
 *
 * Server: zt_rpc_server_create() binds the listen address (TLS, optional client certificates, an optional
 * bearer token, a receive size limit), zt_rpc_server_add_method() registers a handler per full method name
 * ("/ztrain.v1.StateService/CommitStep"), zt_rpc_server_start() starts the server's own threads, and
 * zt_rpc_server_destroy() shuts down gracefully. Every call runs its handler on a thread of its own, so a
 * handler may block (for example until every rank of a rendezvous has joined). The server answers by itself:
 *   - unknown methods with UNIMPLEMENTED;
 *   - calls without "authorization: Bearer <token>" (when a token is set) with UNAUTHENTICATED;
 *   - messages over the size limit with RESOURCE_EXHAUSTED;
 *   - grpc.health.v1.Health/Check and /Watch on the main port and, if asked, on a plaintext port that
 *     serves nothing but health (Kubernetes' gRPC probes cannot do TLS or send tokens).
 * A call that arrives without a deadline gets the server's default deadline.
 *
 * Client: zt_rpc_channel_create() opens a channel to a target ("host:port"), zt_rpc_unary() makes a
 * unary call, and the zt_rpc_stream functions drive client-streaming and server-streaming calls. Every client call has
 * a deadline. Results come back as a gRPC status code plus a message (struct zt_rpc_status).
 *
 * Threading: a server, a channel and a stream may be used from any thread; one stream from one thread at a
 * time. Ownership is stated above each function. */
#ifndef ZT_PROTO_RPC_H
#define ZT_PROTO_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* gRPC status codes (the numbers of the gRPC specification, so they can be logged and compared as is). */
enum zt_rpc_code {
    ZT_RPC_OK = 0,
    ZT_RPC_CANCELLED = 1,
    ZT_RPC_UNKNOWN = 2,
    ZT_RPC_INVALID_ARGUMENT = 3,
    ZT_RPC_DEADLINE_EXCEEDED = 4,
    ZT_RPC_NOT_FOUND = 5,
    ZT_RPC_ALREADY_EXISTS = 6,
    ZT_RPC_PERMISSION_DENIED = 7,
    ZT_RPC_RESOURCE_EXHAUSTED = 8,
    ZT_RPC_FAILED_PRECONDITION = 9,
    ZT_RPC_ABORTED = 10,
    ZT_RPC_OUT_OF_RANGE = 11,
    ZT_RPC_UNIMPLEMENTED = 12,
    ZT_RPC_INTERNAL = 13,
    ZT_RPC_UNAVAILABLE = 14,
    ZT_RPC_DATA_LOSS = 15,
    ZT_RPC_UNAUTHENTICATED = 16,
};

/* Returns the specification's name of a gRPC status code ("UNAUTHENTICATED"); never NULL. */
const char *zt_rpc_code_name(int code);

/* The outcome of a call as a client sees it: a gRPC status code and the server's (or the library's)
 * message. */
struct zt_rpc_status {
    int code;          /* enum zt_rpc_code */
    char msg[ZT_ERR_LEN]; /* "" when the server sent none */
};

/* Kinds of method a server can register. */
enum zt_rpc_kind {
    ZT_RPC_KIND_UNARY = 0,         /* one request, one response */
    ZT_RPC_KIND_CLIENT_STREAM = 1, /* many requests, one response */
    ZT_RPC_KIND_SERVER_STREAM = 2, /* one request, many responses */
};

/* Default receive limit when the options leave max_message_bytes at 0: 4 MiB, gRPC's own default, which
 * leaves room for 1 MiB chunks and their headers. */
#define ZT_RPC_DEFAULT_MAX_MESSAGE (4u << 20)
/* Deadline a server applies to calls that arrive without one, when the options leave it at 0. */
#define ZT_RPC_DEFAULT_DEADLINE_S 300.0

/* ------------------------------------------------------------------------------------------------ */
/* Server                                                                                           */

typedef struct zt_rpc_server zt_rpc_server_t;
typedef struct zt_rpc_call zt_rpc_call_t;

struct zt_rpc_server_options {
    const char *listen_addr;        /* "127.0.0.1:7070"; port 0 picks a free port (see _port); NULL (with no
                                     * health_listen_addr): no listener, in-process calls only */
    const char *tls_cert_file;      /* PEM server certificate chain, or NULL for plaintext */
    const char *tls_key_file;       /* PEM private key; required with tls_cert_file */
    const char *tls_ca_file;        /* PEM CA that signs client certificates, or NULL */
    int require_client_cert;        /* 1: mutual TLS, clients must present a certificate signed by tls_ca_file */
    const char *token;              /* bearer token every call must carry, or NULL for none */
    size_t max_message_bytes;       /* receive and send limit per message; 0: ZT_RPC_DEFAULT_MAX_MESSAGE */
    double default_deadline_s;      /* applied to calls without a deadline; 0: ZT_RPC_DEFAULT_DEADLINE_S */
    const char *health_listen_addr; /* plaintext address that serves only grpc.health.v1.Health, or NULL */
    int max_calls;                  /* calls handled at once (one thread each); 0: 256; more get UNAVAILABLE */
};

/* A method handler. It reads requests with zt_rpc_call_read(), writes responses with zt_rpc_call_write()
 * and returns a gRPC status code (ZT_RPC_OK, or a code set with zt_rpc_call_fail() whose message the
 * client receives). It runs on a thread of its own and may block, within the call's deadline. */
typedef int (*zt_rpc_handler_fn)(zt_rpc_call_t *call, void *user);

/* Creates a server bound to opt->listen_addr (and opt->health_listen_addr when set) that is not yet
 * serving (with neither address: a server for zt_rpc_server_call_local only). Reads the TLS files now. Returns 0 and *out, or a negative code with a message in err (bad
 * address, port in use, unreadable certificate). Free with zt_rpc_server_destroy(). */
int zt_rpc_server_create(const struct zt_rpc_server_options *opt, zt_rpc_server_t **out, zt_err *err);

/* Registers handler for the full method name method ("/package.Service/Method"); must be called before
 * zt_rpc_server_start(). The service part of the name is reported SERVING by the health service. method
 * is copied; user is passed to every call of handler and must outlive the server. Returns 0, or
 * ZT_ESTATE if the server already started or the name is taken. */
int zt_rpc_server_add_method(zt_rpc_server_t *srv, const char *method, enum zt_rpc_kind kind,
                             zt_rpc_handler_fn handler, void *user, zt_err *err);

/* Starts serving on the server's own threads. Returns 0, or a negative code with a message in err. */
int zt_rpc_server_start(zt_rpc_server_t *srv, zt_err *err);

/* Returns the port the main listen address is bound to (useful after binding port 0). */
int zt_rpc_server_port(const zt_rpc_server_t *srv);

/* Returns the port of the health-only listener, or 0 if there is none. */
int zt_rpc_server_health_port(const zt_rpc_server_t *srv);

/* Marks every service of the server SERVING (1) or NOT_SERVING (0) in health answers; Watch streams see
 * the change. The server starts SERVING. */
void zt_rpc_server_set_serving(zt_rpc_server_t *srv, int serving);

/* Stops accepting calls, lets running calls finish until grace_s seconds have passed, cancels the rest,
 * joins the server's threads and frees everything. Accepts NULL. */
void zt_rpc_server_destroy(zt_rpc_server_t *srv, double grace_s);

/* Reads the next request message of the call. Returns 1 with *data and *len pointing at the message bytes
 * (owned by the call, valid until the next read or the end of the handler), 0 at the end of the client's
 * stream, or a negative code when the call was cancelled, timed out or broke (the handler should return;
 * whatever it returns, the client already has its status). */
int zt_rpc_call_read(zt_rpc_call_t *call, const void **data, size_t *len);

/* Sends one response message (a copy of data[0..len)). Waits for flow control. Returns 0, or a negative
 * code when the call is gone or when a unary or client-streaming method writes a second response. */
int zt_rpc_call_write(zt_rpc_call_t *call, const void *data, size_t len);

/* One contiguous piece of a received message. */
struct zt_rpc_part {
    const void *data;
    size_t len;
};

/* Reads the next request message like zt_rpc_call_read(), but without copying it into one buffer: *parts
 * and *nparts give the pieces the message arrived in, in order, and *len their total. The pieces are owned
 * by the call and stay valid until the next read of either kind or the end of the handler. Returns 1, 0 or
 * a negative code exactly as zt_rpc_call_read(). For bulk messages (chunks of 1 MiB) that the handler can
 * parse piece by piece. */
int zt_rpc_call_read_parts(zt_rpc_call_t *call, const struct zt_rpc_part **parts, size_t *nparts, size_t *len);

/* Sends one response message like zt_rpc_call_write(), but without copying: takes ownership of data
 * (allocated with malloc), which is freed with free() once gRPC no longer needs it, also when the call
 * fails. Returns 0 or a negative code as zt_rpc_call_write(). */
int zt_rpc_call_write_owned(zt_rpc_call_t *call, void *data, size_t len);

/* Records a non-OK status and its message for the client, and returns code, so that handlers can write
 * `return zt_rpc_call_fail(call, ZT_RPC_NOT_FOUND, "no run named '%s'; call RegisterRun first", run);`. */
int zt_rpc_call_fail(zt_rpc_call_t *call, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Returns the seconds left before the call's deadline (never more than the server's default). */
double zt_rpc_call_time_left(const zt_rpc_call_t *call);

/* Returns 1 if the client cancelled the call or its deadline passed, else 0. */
int zt_rpc_call_is_cancelled(zt_rpc_call_t *call);

/* Returns the peer address ("ipv4:127.0.0.1:53422"); owned by the call. */
const char *zt_rpc_call_peer(const zt_rpc_call_t *call);

/* Returns the full method name of the call; owned by the call. */
const char *zt_rpc_call_method(const zt_rpc_call_t *call);

/* The most bearer tokens a server accepts at once (zt_rpc_server_set_tokens). */
#define ZT_RPC_MAX_TOKENS 8

/* Replaces the bearer tokens every later call must carry one of (a token file re-read on SIGHUP; several
 * while a token is being rotated): calls that carry a token no longer listed are refused from the moment
 * this returns; calls already running go on. The tokens are copied (the old copies are wiped). Returns 0,
 * or ZT_EINVAL_CONFIG for n outside [1, ZT_RPC_MAX_TOKENS] or a NULL or empty token. */
int zt_rpc_server_set_tokens(zt_rpc_server_t *srv, const char *const *tokens, int n, zt_err *err);

/* zt_rpc_server_set_tokens with one token. */
int zt_rpc_server_set_token(zt_rpc_server_t *srv, const char *token, zt_err *err);

/* Returns 1 when got[0..got_len) equals the NUL-terminated want, else 0, in a time that depends only on
 * the length of want: every byte of want is compared whatever got holds, so the time a refusal takes
 * does not tell an attacker how much of a guessed token was right. The server checks tokens with it. */
int zt_rpc_token_equal(const char *want, const void *got, size_t got_len);

/* ------------------------------------------------------------------------------------------------ */
/* In-process calls (tests and fuzzing harnesses)                                                   */

/* One request message of an in-process call, given as pieces (a message split anywhere, as one that
 * arrives from the network may be); the pieces are borrowed for the call. */
struct zt_rpc_local_msg {
    const struct zt_rpc_part *parts;
    size_t nparts;
};

/* Receives each response message of an in-process call; data is valid only during the callback. */
typedef void (*zt_rpc_response_fn)(const void *data, size_t len, void *user);

/* Runs one call of method on srv in the calling thread, without a network: the handler reads
 * reqs[0..nreqs) and then the end of the client's stream, and each response it writes goes to
 * on_response (may be NULL). Everything the handler sees is as for a network call (deadline of timeout_s
 * seconds, capped by the server's default; the message size limit), except that no token is checked (the
 * caller is the process itself), the peer is "local" and Health/Watch is not served. Works on any server,
 * also on one created with neither listen_addr nor health_listen_addr, which listens nowhere, needs no
 * zt_rpc_server_start and serves only these calls. Returns the call's gRPC status code, with the message
 * in st (may be NULL). The handler's decode and validation code runs exactly as it does for a client,
 * so a fuzzer can feed it bytes without sockets. */
int zt_rpc_server_call_local(zt_rpc_server_t *srv, const char *method, const struct zt_rpc_local_msg *reqs,
                             size_t nreqs, double timeout_s, zt_rpc_response_fn on_response, void *user,
                             struct zt_rpc_status *st);

/* ------------------------------------------------------------------------------------------------ */
/* Client                                                                                           */

typedef struct zt_rpc_channel zt_rpc_channel_t;
typedef struct zt_rpc_stream zt_rpc_stream_t;

struct zt_rpc_channel_options {
    const char *target;        /* "host:port" */
    const char *tls_ca_file;   /* PEM CA that signs the server's certificate, or NULL for plaintext */
    const char *tls_cert_file; /* PEM client certificate for mutual TLS, or NULL */
    const char *tls_key_file;  /* PEM client key, with tls_cert_file */
    const char *tls_server_name; /* name to check the server certificate against instead of the target's host, or NULL */
    const char *token;         /* bearer token sent on every call, or NULL */
    size_t max_message_bytes;  /* receive limit per message; 0: ZT_RPC_DEFAULT_MAX_MESSAGE */
    int own_connection;        /* 1: open a TCP connection of its own; 0: share one with the process's other
                                * channels to the same target and options (gRPC's default) */
};

/* Creates a channel (connections are made lazily, on the first call). Returns 0 and *out, or a negative
 * code with a message in err (unreadable TLS file). Free with zt_rpc_channel_destroy(). */
int zt_rpc_channel_create(const struct zt_rpc_channel_options *opt, zt_rpc_channel_t **out, zt_err *err);

/* Closes the channel; calls still open on it fail. Accepts NULL. */
void zt_rpc_channel_destroy(zt_rpc_channel_t *ch);

/* Call flags. */
enum {
    ZT_RPC_WAIT_FOR_READY = 1, /* wait (within the deadline) for the server to come up instead of failing at once */
};

/* Makes a unary call of method with request req[0..req_len) and a deadline timeout_s seconds from now.
 * Returns the gRPC status code (ZT_RPC_OK = 0 on success) with the message in st (may be NULL). On OK,
 * *resp (malloc'd, the caller frees it) and *resp_len hold the response. */
int zt_rpc_unary(zt_rpc_channel_t *ch, const char *method, const void *req, size_t req_len, double timeout_s,
                 unsigned flags, void **resp, size_t *resp_len, struct zt_rpc_status *st);

/* Starts a streaming call (client-streaming, server-streaming or both) with a deadline timeout_s seconds
 * from now. Returns 0 and *out, or a negative code with a message in err. End it with
 * zt_rpc_stream_finish(). */
int zt_rpc_stream_start(zt_rpc_channel_t *ch, const char *method, double timeout_s, unsigned flags,
                        zt_rpc_stream_t **out, zt_err *err);

/* Sends one request message. Returns 0, or a negative code when the call already ended (the server's
 * status then comes from zt_rpc_stream_finish()). */
int zt_rpc_stream_send(zt_rpc_stream_t *s, const void *data, size_t len);

/* Tells the server that no more requests follow. Returns 0 or a negative code like _send. */
int zt_rpc_stream_close_send(zt_rpc_stream_t *s);

/* Receives the next response message. Returns 1 with *data and *len (owned by the stream, valid until the
 * next receive or finish), 0 when the server ended the stream, or a negative code on failure. */
int zt_rpc_stream_recv(zt_rpc_stream_t *s, const void **data, size_t *len);

/* Waits for the call's final status, frees the stream and returns the gRPC status code with its message
 * in st (may be NULL). Unread responses are dropped. Accepts NULL (returns ZT_RPC_INTERNAL). */
int zt_rpc_stream_finish(zt_rpc_stream_t *s, struct zt_rpc_status *st);

/* Sends one request message like zt_rpc_stream_send(), but without copying: takes ownership of data
 * (allocated with malloc), which is freed with free() once gRPC no longer needs it, also when the send
 * fails. Returns 0 or a negative code as zt_rpc_stream_send(). For bulk messages (chunks of 1 MiB) that the
 * caller builds in a buffer of their own. */
int zt_rpc_stream_send_owned(zt_rpc_stream_t *s, void *data, size_t len);

/* Sends one request message made of head (copied) followed by data, without copying data: gRPC reads it
 * where it lies until it lets go of it, then calls release(user) once (also when the send fails; possibly
 * after this call returns and on another thread). The caller keeps data unchanged until then. Returns 0
 * or a negative code as zt_rpc_stream_send(). For bulk chunks of arrays the caller owns. */
int zt_rpc_stream_send_borrowed(zt_rpc_stream_t *s, const void *head, size_t head_len, const void *data,
                                size_t data_len, void (*release)(void *user), void *user);

/* Receives the next response message like zt_rpc_stream_recv(), but without copying it into one buffer:
 * *parts and *nparts give the pieces the message arrived in, in order, and *len their total. The pieces
 * are owned by the stream and stay valid until the next receive of either kind or zt_rpc_stream_finish().
 * Returns 1, 0 or a negative code exactly as zt_rpc_stream_recv(). */
int zt_rpc_stream_recv_parts(zt_rpc_stream_t *s, const struct zt_rpc_part **parts, size_t *nparts, size_t *len);

/* ------------------------------------------------------------------------------------------------ */
/* Health client                                                                                    */

/* Health states of grpc.health.v1 (the numbers of its ServingStatus enum). */
enum zt_rpc_health {
    ZT_RPC_HEALTH_UNKNOWN = 0,
    ZT_RPC_HEALTH_SERVING = 1,
    ZT_RPC_HEALTH_NOT_SERVING = 2,
    ZT_RPC_HEALTH_SERVICE_UNKNOWN = 3,
};

/* Calls grpc.health.v1.Health/Check for service ("" for the whole server). Returns the gRPC status code
 * with the message in st (may be NULL); on OK, *health holds the serving status. */
int zt_rpc_health_check(zt_rpc_channel_t *ch, const char *service, double timeout_s, int *health,
                        struct zt_rpc_status *st);

#endif
