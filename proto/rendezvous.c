/* The rendezvous of multi-rank start-up (see rendezvous.h): rank 0's Join handler collects the ranks,
 * checks that they agree, and answers all of them at once with the NCCL unique id or with one failure
 * message that every rank receives. */
#include "proto/rendezvous.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/rpc.h"
#include "ztrain/v1/rendezvous.pb-c.h"

#define JOIN_METHOD "/ztrain.v1.Rendezvous/Join"
#define HOST_LEN 256
#define RECEIVED_WAIT_S 5 /* how long rank 0 keeps the rendezvous up for the ranks to say their answer arrived */

struct rdzv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int world_size;
    uint64_t config_hash;
    uint8_t nccl_id[ZT_RDZV_ID_BYTES];
    struct timespec deadline; /* CLOCK_MONOTONIC */
    double timeout_s;
    char (*hosts)[HOST_LEN];
    int *joined; /* per rank */
    int *told;   /* per rank: received its answer (success or failure) */
    int *received; /* per rank: said that its successful answer arrived (JoinRequest.received) */
    int n_joined;
    int n_told;
    int n_received;
    int failed;
    int fail_code; /* enum zt_rpc_code */
    char fail_msg[ZT_ERR_LEN];
};

static void local_host(char *out, size_t cap)
{
    if (gethostname(out, cap) != 0)
        snprintf(out, cap, "unknown");
    out[cap - 1] = '\0';
}

static int timed_out(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline->tv_sec || (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

/* Fails the whole rendezvous (first reason wins) and wakes everyone waiting. Called with mu held. */
static void fail_locked(struct rdzv *r, int code, const char *msg)
{
    if (r->failed)
        return;
    r->failed = 1;
    r->fail_code = code;
    snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", msg);
    ZT_ERROR("rendezvous: %s", msg);
    pthread_cond_broadcast(&r->cv);
}

static void mark_told_locked(struct rdzv *r, int rank)
{
    if (rank > 0 && rank < r->world_size && !r->told[rank]) {
        r->told[rank] = 1;
        r->n_told++;
        pthread_cond_broadcast(&r->cv);
    }
}

/* Writes "2, 5, 7" (ranks not yet joined) into out. Called with mu held. */
static void missing_ranks(const struct rdzv *r, char *out, size_t cap)
{
    size_t off = 0;
    int shown = 0;
    out[0] = '\0';
    for (int i = 0; i < r->world_size && off + 16 < cap; i++) {
        if (r->joined[i])
            continue;
        if (shown == 32) {
            off += (size_t)snprintf(out + off, cap - off, ", ...");
            break;
        }
        off += (size_t)snprintf(out + off, cap - off, "%s%d", shown ? ", " : "", i);
        shown++;
    }
}

static int answer_failure_locked(zt_rpc_call_t *call, struct rdzv *r, int rank)
{
    mark_told_locked(r, rank);
    return zt_rpc_call_fail(call, r->fail_code, "%s", r->fail_msg);
}

static int join_handler(zt_rpc_call_t *call, void *user)
{
    struct rdzv *r = user;
    const void *data;
    size_t len;
    if (zt_rpc_call_read(call, &data, &len) != 1)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "no JoinRequest was sent");
    Ztrain__V1__JoinRequest *req = ztrain__v1__join_request__unpack(NULL, len, data);
    if (req == NULL)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "the JoinRequest is not a valid protobuf message");
    int rank = req->rank, world = req->world_size;
    uint64_t hash = req->config_hash;
    const int received = req->received;
    char host[HOST_LEN];
    snprintf(host, sizeof(host), "%s", req->host && req->host[0] ? req->host : zt_rpc_call_peer(call));
    ztrain__v1__join_request__free_unpacked(req, NULL);

    char msg[ZT_ERR_LEN];
    pthread_mutex_lock(&r->mu);
    if (received) { /* the second word of a rank that has its answer: count it, answer empty */
        if (rank > 0 && rank < r->world_size && r->told[rank] && !r->received[rank]) {
            r->received[rank] = 1;
            r->n_received++;
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
        Ztrain__V1__JoinResponse empty = ZTRAIN__V1__JOIN_RESPONSE__INIT;
        uint8_t none[8];
        size_t n = ztrain__v1__join_response__pack(&empty, none);
        return zt_rpc_call_write(call, none, n) == 0 ? ZT_RPC_OK : ZT_RPC_CANCELLED;
    }
    if (r->failed) {
        int code = answer_failure_locked(call, r, rank);
        pthread_mutex_unlock(&r->mu);
        return code;
    }
    if (world != r->world_size) {
        snprintf(msg, sizeof(msg),
                 "rank %d (host %s) was started with world size %d but rank 0 with %d; start every rank with "
                 "the same WORLD_SIZE",
                 rank, host, world, r->world_size);
        fail_locked(r, ZT_RPC_FAILED_PRECONDITION, msg);
    } else if (rank < 1 || rank >= r->world_size) {
        snprintf(msg, sizeof(msg), "host %s joined as rank %d, outside 1..%d (rank 0 is the one serving the rendezvous); "
                 "give every process a distinct RANK in 0..WORLD_SIZE-1", host, rank, r->world_size - 1);
        fail_locked(r, rank == 0 ? ZT_RPC_ALREADY_EXISTS : ZT_RPC_INVALID_ARGUMENT, msg);
    } else if (hash != r->config_hash) {
        snprintf(msg, sizeof(msg),
                 "rank %d (host %s) has config hash %016llx but rank 0 has %016llx; every rank must run the same config",
                 rank, host, (unsigned long long)hash, (unsigned long long)r->config_hash);
        fail_locked(r, ZT_RPC_FAILED_PRECONDITION, msg);
    } else if (r->joined[rank]) {
        snprintf(msg, sizeof(msg), "rank %d joined twice (hosts %s and %s); give every process a distinct RANK", rank,
                 r->hosts[rank], host);
        fail_locked(r, ZT_RPC_ALREADY_EXISTS, msg);
    } else {
        r->joined[rank] = 1;
        snprintf(r->hosts[rank], HOST_LEN, "%s", host);
        r->n_joined++;
        ZT_INFO("rendezvous: rank %d joined from %s (%d/%d)", rank, host, r->n_joined, r->world_size);
        pthread_cond_broadcast(&r->cv);
    }
    while (!r->failed && r->n_joined < r->world_size && !zt_rpc_call_is_cancelled(call)) {
        /* Wake at least every 100 ms to notice a client that went away. */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &until);
    }
    if (r->failed) {
        int code = answer_failure_locked(call, r, rank);
        pthread_mutex_unlock(&r->mu);
        return code;
    }
    if (r->n_joined < r->world_size) { /* this caller went away: forget it so it may join again */
        r->joined[rank] = 0;
        r->n_joined--;
        pthread_mutex_unlock(&r->mu);
        return zt_rpc_call_fail(call, ZT_RPC_CANCELLED, "the join was cancelled");
    }

    Ztrain__V1__Member *members = calloc((size_t)r->world_size, sizeof(*members));
    Ztrain__V1__Member **ptrs = calloc((size_t)r->world_size, sizeof(*ptrs));
    ZT_ASSERT(members != NULL && ptrs != NULL);
    for (int i = 0; i < r->world_size; i++) {
        ztrain__v1__member__init(&members[i]);
        members[i].rank = i;
        members[i].host = r->hosts[i];
        ptrs[i] = &members[i];
    }
    Ztrain__V1__JoinResponse resp = ZTRAIN__V1__JOIN_RESPONSE__INIT;
    resp.nccl_id.data = r->nccl_id;
    resp.nccl_id.len = ZT_RDZV_ID_BYTES;
    resp.n_members = (size_t)r->world_size;
    resp.members = ptrs;
    size_t n = ztrain__v1__join_response__get_packed_size(&resp);
    uint8_t *buf = zt_xmalloc(n);
    ztrain__v1__join_response__pack(&resp, buf);
    mark_told_locked(r, rank);
    pthread_mutex_unlock(&r->mu);
    int rc = zt_rpc_call_write(call, buf, n);
    free(buf);
    free(ptrs);
    free(members);
    return rc == 0 ? ZT_RPC_OK : ZT_RPC_CANCELLED;
}

int zt__rdzv_create(int world_size, uint64_t config_hash, const uint8_t nccl_id[ZT_RDZV_ID_BYTES], double timeout_s,
                    zt__rdzv **out, zt_err *err)
{
    *out = NULL;
    if (world_size < 1 || world_size > ZT_RDZV_MAX_WORLD)
        return zt_fail(err, ZT_EINVAL_CONFIG, "world size %d: WORLD_SIZE must be 1 to %d", world_size,
                       ZT_RDZV_MAX_WORLD);
    struct rdzv *r = zt_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->world_size = world_size;
    r->config_hash = config_hash;
    memcpy(r->nccl_id, nccl_id, ZT_RDZV_ID_BYTES);
    r->timeout_s = timeout_s;
    r->hosts = zt_xcalloc((size_t)world_size, sizeof(*r->hosts));
    r->joined = zt_xcalloc((size_t)world_size, sizeof(int));
    r->told = zt_xcalloc((size_t)world_size, sizeof(int));
    r->received = zt_xcalloc((size_t)world_size, sizeof(int));
    r->joined[0] = 1;
    r->n_joined = 1;
    local_host(r->hosts[0], HOST_LEN);
    clock_gettime(CLOCK_MONOTONIC, &r->deadline);
    r->deadline.tv_sec += (time_t)timeout_s;
    r->deadline.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
    if (r->deadline.tv_nsec >= 1000000000L) {
        r->deadline.tv_sec++;
        r->deadline.tv_nsec -= 1000000000L;
    }
    *out = r;
    return 0;
}

int zt__rdzv_add_methods(zt__rdzv *r, zt_rpc_server_t *srv, zt_err *err)
{
    return zt_rpc_server_add_method(srv, JOIN_METHOD, ZT_RPC_KIND_UNARY, join_handler, r, err);
}

void zt__rdzv_destroy(zt__rdzv *r)
{
    if (r == NULL)
        return;
    free(r->hosts);
    free(r->joined);
    free(r->told);
    free(r->received);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

int zt_rdzv_serve(const char *addr, int world_size, uint64_t config_hash, const uint8_t nccl_id[ZT_RDZV_ID_BYTES],
                  double timeout_s, const struct zt_rdzv_security *sec, zt_err *err)
{
    if (world_size < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "world size %d: WORLD_SIZE must be at least 1", world_size);
    if (world_size == 1)
        return 0;
    struct rdzv *r = NULL;
    int rc = zt__rdzv_create(world_size, config_hash, nccl_id, timeout_s, &r, err);
    if (rc != 0)
        return rc;

    struct zt_rpc_server_options opt = {0};
    opt.listen_addr = addr;
    opt.default_deadline_s = timeout_s + 5.0;
    if (sec != NULL) {
        opt.tls_cert_file = sec->tls_cert_file;
        opt.tls_key_file = sec->tls_key_file;
        opt.token = sec->token;
    }
    zt_rpc_server_t *srv = NULL;
    zt_err e;
    rc = zt_rpc_server_create(&opt, &srv, &e);
    if (rc == 0)
        rc = zt__rdzv_add_methods(r, srv, &e);
    if (rc == 0)
        rc = zt_rpc_server_start(srv, &e);
    if (rc != 0) {
        zt_fail(err, rc, "rank 0 cannot serve the rendezvous: %s", e.msg);
    } else {
        ZT_INFO("rendezvous: rank 0 serving on %s for %d ranks (timeout %.0fs)", addr, world_size, timeout_s);
        pthread_mutex_lock(&r->mu);
        while (r->n_told < world_size - 1) {
            if (timed_out(&r->deadline)) {
                if (!r->failed) {
                    char missing[ZT_ERR_LEN / 2];
                    char msg[ZT_ERR_LEN];
                    missing_ranks(r, missing, sizeof(missing));
                    snprintf(msg, sizeof(msg),
                             "rank(s) %s never joined the rendezvous at %s within %.0fs; check that every rank is "
                             "started and reaches MASTER_ADDR:MASTER_PORT",
                             missing, addr, timeout_s);
                    fail_locked(r, ZT_RPC_DEADLINE_EXCEEDED, msg);
                }
                break;
            }
            pthread_cond_timedwait(&r->cv, &r->mu, &r->deadline);
        }
        if (r->failed)
            rc = zt_fail(err, r->fail_code == ZT_RPC_DEADLINE_EXCEEDED ? -ETIMEDOUT : ZT_EMISMATCH, "%s", r->fail_msg);
        /* An answer is written when its call ends, but closing the server right then can cut it off in the
         * connection: every rank says when its answer arrived, and the server stays up until all have
         * (at most RECEIVED_WAIT_S more; a rank that died after its answer does not hold the others). */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += RECEIVED_WAIT_S;
        while (rc == 0 && r->n_received < world_size - 1 && !timed_out(&until))
            pthread_cond_timedwait(&r->cv, &r->mu, &until);
        pthread_mutex_unlock(&r->mu);
    }
    /* Give the handlers time to deliver their answers; they are already decided. */
    zt_rpc_server_destroy(srv, 5.0);
    if (rc == 0)
        ZT_INFO("rendezvous: all %d ranks joined", world_size);
    zt__rdzv_destroy(r);
    return rc;
}

int zt_rdzv_join(const char *master, int rank, int world_size, uint64_t config_hash, double timeout_s,
                 const struct zt_rdzv_security *sec, uint8_t nccl_id[ZT_RDZV_ID_BYTES], zt_err *err)
{
    struct zt_rpc_channel_options opt = {0};
    opt.target = master;
    if (sec != NULL) {
        opt.tls_ca_file = sec->tls_ca_file;
        opt.token = sec->token;
    }
    zt_rpc_channel_t *ch = NULL;
    zt_err e;
    int rc = zt_rpc_channel_create(&opt, &ch, &e);
    if (rc != 0)
        return zt_fail(err, rc, "rank %d cannot join the rendezvous at %s: %s", rank, master, e.msg);

    Ztrain__V1__JoinRequest req = ZTRAIN__V1__JOIN_REQUEST__INIT;
    char host[HOST_LEN];
    local_host(host, sizeof(host));
    req.rank = rank;
    req.world_size = world_size;
    req.config_hash = config_hash;
    req.host = host;
    size_t n = ztrain__v1__join_request__get_packed_size(&req);
    uint8_t *buf = zt_xmalloc(n);
    ztrain__v1__join_request__pack(&req, buf);

    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)timeout_s;
    rc = ZT_ESTATE;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = (double)(deadline.tv_sec - now.tv_sec) + (double)(deadline.tv_nsec - now.tv_nsec) * 1e-9;
        if (left <= 0) {
            rc = zt_fail(err, -ETIMEDOUT,
                         "rank %d could not reach the rendezvous at %s within %.0fs: check MASTER_ADDR and "
                         "MASTER_PORT and that rank 0 is running",
                         rank, master, timeout_s);
            break;
        }
        struct zt_rpc_status st;
        void *resp = NULL;
        size_t resp_len = 0;
        int code = zt_rpc_unary(ch, JOIN_METHOD, buf, n, left, ZT_RPC_WAIT_FOR_READY, &resp, &resp_len, &st);
        if (code == ZT_RPC_OK) {
            Ztrain__V1__JoinResponse *r = ztrain__v1__join_response__unpack(NULL, resp_len, resp);
            free(resp);
            if (r == NULL || r->nccl_id.len != ZT_RDZV_ID_BYTES) {
                rc = zt_fail(err, ZT_EFORMAT, "rank %d got a malformed answer from the rendezvous at %s", rank, master);
            } else {
                memcpy(nccl_id, r->nccl_id.data, ZT_RDZV_ID_BYTES);
                rc = 0;
            }
            if (r != NULL)
                ztrain__v1__join_response__free_unpacked(r, NULL);
            if (rc == 0) { /* tell rank 0 the answer arrived (its reply, or its failure, changes nothing) */
                req.received = 1;
                size_t n2 = ztrain__v1__join_request__get_packed_size(&req);
                uint8_t *buf2 = zt_xmalloc(n2);
                ztrain__v1__join_request__pack(&req, buf2);
                void *ack = NULL;
                size_t ack_len = 0;
                (void)zt_rpc_unary(ch, JOIN_METHOD, buf2, n2, RECEIVED_WAIT_S, 0, &ack, &ack_len, &st);
                free(ack);
                free(buf2);
            }
            break;
        }
        /* UNAVAILABLE: rank 0 went away between connecting and answering; try again within the timeout.
         * A client-side deadline (no message of rank 0) loops to the timeout message above. */
        if (code == ZT_RPC_UNAVAILABLE || (code == ZT_RPC_DEADLINE_EXCEEDED && strstr(st.msg, "rendezvous") == NULL))
            continue;
        rc = zt_fail(err, code == ZT_RPC_DEADLINE_EXCEEDED ? -ETIMEDOUT : ZT_EMISMATCH,
                     "rank %d: the rendezvous at %s failed (%s): %s", rank, master, zt_rpc_code_name(code), st.msg);
        break;
    }
    free(buf);
    zt_rpc_channel_destroy(ch);
    return rc;
}
