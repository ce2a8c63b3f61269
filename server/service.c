/* ztrain.v1.StateService handlers over the state server core (see service.h). Each handler decodes its
 * request with the protobuf-c code generated from proto/ztrain/v1/state.proto, validates what the core
 * cannot (message order, chunk offsets, sizes), calls the core and maps its error codes to gRPC codes. */
#include "server/service.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/shm.h"
#include "common/units.h"
#include "proto/wire.h"
#include "ztrain/v1/state.pb-c.h"

#define SVC "/ztrain.v1.StateService/"
#define PULL_CHUNK_BYTES (1u << 20) /* payload of one ParamChunk */

/* A client's shared-memory segment (AttachShm): found by its random id, used by calls in flight (refs), freed
 * when detached (or its process exited) and no call uses it any more. */
struct shm_entry {
    uint64_t id;         /* 0: a free entry */
    zt_shm_t *shm;
    int pid;             /* the client's process, as it named itself */
    int refs;            /* calls reading or writing it now */
    int gone;            /* detached: freed when refs reaches 0 */
};

struct zt_service {
    zt_server_core *core;
    int shm_off;
    uint64_t next_shm_id;   /* tests: the next segment's id; 0: random ids */
    pthread_mutex_t shm_mu;
    struct shm_entry shm[ZT_SERVICE_MAX_SHM];
    char *snapshot_dir;
    int snapshot_keep;
    int snapshot_commits;
    int server_index;
    int server_count;
};

/* Maps a core error code to the gRPC code a client should see. */
static int grpc_code_of(int rc)
{
    switch (rc) {
    case -ENOENT:
        return ZT_RPC_NOT_FOUND;
    case ZT_EINVAL_CONFIG:
        return ZT_RPC_INVALID_ARGUMENT;
    case ZT_EMISMATCH:
    case ZT_ESTATE:
        return ZT_RPC_FAILED_PRECONDITION;
    case ZT_ENOMEM:
    case -ENOSPC: /* a full disk, a file size limit or a quota: a resource, not a bug */
    case -EFBIG:
    case -EDQUOT:
        return ZT_RPC_RESOURCE_EXHAUSTED;
    case -ETIMEDOUT:
        return ZT_RPC_DEADLINE_EXCEEDED;
    case ZT_ECHECKSUM:
    case ZT_EFORMAT:
        return ZT_RPC_DATA_LOSS;
    case -EEXIST:
        return ZT_RPC_ALREADY_EXISTS;
    default:
        return ZT_RPC_INTERNAL;
    }
}

static int core_fail(zt_rpc_call_t *call, int rc, const zt_err *err)
{
    return zt_rpc_call_fail(call, grpc_code_of(rc), "%s", err->msg[0] ? err->msg : zt_strerror(rc));
}

static int dtype_from_wire(int wire, enum zt_dtype *out)
{
    switch (wire) {
    case ZTRAIN__V1__DTYPE__DTYPE_F32:
        *out = ZT_DTYPE_F32;
        return 0;
    case ZTRAIN__V1__DTYPE__DTYPE_F16:
        *out = ZT_DTYPE_F16;
        return 0;
    case ZTRAIN__V1__DTYPE__DTYPE_BF16:
        *out = ZT_DTYPE_BF16;
        return 0;
    default:
        return -1;
    }
}

static Ztrain__V1__DType dtype_to_wire(enum zt_dtype d)
{
    return d == ZT_DTYPE_F16 ? ZTRAIN__V1__DTYPE__DTYPE_F16
           : d == ZT_DTYPE_BF16 ? ZTRAIN__V1__DTYPE__DTYPE_BF16
                                : ZTRAIN__V1__DTYPE__DTYPE_F32;
}

/* Reads the one request message of a unary or server-streaming call. */
static int read_request(zt_rpc_call_t *call, const void **data, size_t *len)
{
    int rc = zt_rpc_call_read(call, data, len);
    if (rc < 0)
        return zt_rpc_call_fail(call, ZT_RPC_CANCELLED, "the call ended before its request arrived");
    if (rc == 0)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "the call carried no request message");
    return ZT_RPC_OK;
}

static int malformed(zt_rpc_call_t *call, const char *what)
{
    return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "the %s is not a valid protobuf message of ztrain.v1",
                            what);
}

/* Writes a packed message as the call's response. */
static int send_packed(zt_rpc_call_t *call, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = zt_xmalloc(n);
    protobuf_c_message_pack(msg, buf);
    int rc = zt_rpc_call_write(call, buf, n);
    free(buf);
    return rc == 0 ? ZT_RPC_OK : ZT_RPC_CANCELLED;
}

/* The work of a unary or server-streaming handler on its decoded request (a message of the descriptor
 * the handler passes to serve_request). Returns a gRPC status code. */
typedef int (*request_fn)(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg);

/* Reads the call's one request, decodes it as a message of `desc`, runs fn on it and frees it: the steps
 * that every handler but the pushes begins and ends with. Returns fn's code, or the code of a failed read
 * or of a request that does not decode. */
static int serve_request(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessageDescriptor *desc,
                         request_fn fn)
{
    const void *data;
    size_t len;
    int code = read_request(call, &data, &len);
    if (code != ZT_RPC_OK)
        return code;
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, data);
    if (msg == NULL)
        return malformed(call, desc->short_name);
    code = fn(call, svc, msg);
    protobuf_c_message_free_unpacked(msg, NULL);
    return code;
}

static void fill_info(Ztrain__V1__RunInfo *out, const char *run, const zt_server_run_info *info)
{
    out->run = (char *)run;
    out->step = info->step;
    out->adam_step = info->adam_step;
    out->params_ready = info->params_ready;
    out->committing = info->committing;
    out->owned_shards = info->owned_shards;
    out->owned_numel = info->owned_numel;
}

/* ---- RegisterRun ---- */

static int register_run(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__RegisterRunRequest *req = (const Ztrain__V1__RegisterRunRequest *)msg;
    enum zt_dtype dtype;
    if (dtype_from_wire(req->param_dtype, &dtype) != 0)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "param_dtype %d is not DTYPE_F32, DTYPE_F16 or DTYPE_BF16",
                                (int)req->param_dtype);
    if (req->n_blocks == 0 || req->n_blocks > ZT_SERVER_MAX_BLOCKS)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "a run has 1 to %d blocks, not %zu", ZT_SERVER_MAX_BLOCKS,
                                req->n_blocks);
    zt_server_block_desc *blocks = zt_xcalloc(req->n_blocks, sizeof(*blocks));
    size_t nranges = 0;
    for (size_t b = 0; b < req->n_blocks; b++)
        nranges += req->blocks[b]->n_decay;
    zt_server_range *ranges = zt_xcalloc(nranges ? nranges : 1, sizeof(*ranges));
    size_t at = 0;
    for (size_t b = 0; b < req->n_blocks; b++) {
        blocks[b].numel = req->blocks[b]->numel;
        blocks[b].decay = &ranges[at];
        blocks[b].ndecay = (int)req->blocks[b]->n_decay;
        for (size_t i = 0; i < req->blocks[b]->n_decay; i++, at++) {
            ranges[at].begin = req->blocks[b]->decay[i]->begin;
            ranges[at].end = req->blocks[b]->decay[i]->end;
        }
    }
    zt_server_run_desc desc = {
        .run_id = req->run,
        .world_size = req->world_size,
        .nblocks = (int)req->n_blocks,
        .blocks = blocks,
        .beta1 = req->beta1,
        .beta2 = req->beta2,
        .eps = req->eps,
        .weight_decay = req->weight_decay,
        .param_dtype = dtype,
    };
    zt_server_run_info info;
    zt_err err = {{0}};
    int rc = zt_server_core_register(svc->core, &desc, &info, &err);
    free(blocks);
    free(ranges);
    if (rc != 0)
        return core_fail(call, rc, &err);
    ZT_INFO("service: run %s registered (%zu blocks, world size %d) at step %" PRId64 " from %s", req->run,
            req->n_blocks, req->world_size, info.step, zt_rpc_call_peer(call));
    Ztrain__V1__RunInfo ri = ZTRAIN__V1__RUN_INFO__INIT;
    fill_info(&ri, req->run, &info);
    Ztrain__V1__RegisterRunResponse resp = ZTRAIN__V1__REGISTER_RUN_RESPONSE__INIT;
    resp.info = &ri;
    return send_packed(call, &resp.base);
}

static int handle_register(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__register_run_request__descriptor, register_run);
}

/* Durable state (snapshot_commits): saves run's committed state under the snapshot folder before the call
 * that made it is answered, so that a server killed right after answering restarts where its clients
 * think it is. A failure is logged and the call still answered: what it did is done in memory. */
static void save_durable(zt_service_t *svc, const char *run, const char *why)
{
    zt_err err = {{0}};
    char path[4096];
    if (zt_server_core_snapshot_save(svc->core, run, svc->snapshot_dir, svc->snapshot_keep, path, sizeof(path),
                                     &err) != 0)
        ZT_ERROR("service: run %s: the snapshot after %s failed, so a restart would not find it: %s", run, why,
                 err.msg);
}

/* ---- shared memory: AttachShm, DetachShm, and the segments pushes and pulls name ---- */

/* A random segment id, never 0: a restarted server does not know its predecessor's ids, so a client that
 * names one gets ABORTED and attaches again instead of reaching another client's segment. */
static uint64_t random_id(void)
{
    uint64_t id = 0;
    while (id == 0)
        if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
            id = 0;
    return id;
}

/* Drops the segments whose process exited and frees those no call uses. Under shm_mu. */
static void shm_prune(zt_service_t *svc)
{
    for (int i = 0; i < ZT_SERVICE_MAX_SHM; i++) {
        struct shm_entry *e = &svc->shm[i];
        if (e->id != 0 && !e->gone && kill(e->pid, 0) != 0 && errno == ESRCH)
            e->gone = 1;
        if (e->id != 0 && e->gone && e->refs == 0) {
            zt_shm_destroy(e->shm);
            memset(e, 0, sizeof(*e));
        }
    }
}

/* The attached segment `id` with a reference taken (give it back with shm_put), or NULL. */
static struct shm_entry *shm_get(zt_service_t *svc, uint64_t id)
{
    struct shm_entry *found = NULL;
    pthread_mutex_lock(&svc->shm_mu);
    for (int i = 0; i < ZT_SERVICE_MAX_SHM && found == NULL; i++)
        if (id != 0 && svc->shm[i].id == id && !svc->shm[i].gone)
            found = &svc->shm[i];
    if (found != NULL)
        found->refs++;
    pthread_mutex_unlock(&svc->shm_mu);
    return found;
}

static void shm_put(zt_service_t *svc, struct shm_entry *e)
{
    pthread_mutex_lock(&svc->shm_mu);
    e->refs--;
    if (e->gone && e->refs == 0) {
        zt_shm_destroy(e->shm);
        memset(e, 0, sizeof(*e));
    }
    pthread_mutex_unlock(&svc->shm_mu);
}

static int unknown_segment(zt_rpc_call_t *call, uint64_t id)
{
    return zt_rpc_call_fail(call, ZT_RPC_ABORTED, "unknown shared-memory segment %" PRIu64 " (this server restarted, "
                            "or the segment was detached): attach it again", id);
}

static int attach_shm(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__AttachShmRequest *req = (const Ztrain__V1__AttachShmRequest *)msg;
    Ztrain__V1__AttachShmResponse resp = ZTRAIN__V1__ATTACH_SHM_RESPONSE__INIT;
    zt_err err = {{0}};
    zt_shm_t *shm = NULL;
    char reason[sizeof(err.msg) + 64] = "";
    if (svc->shm_off)
        snprintf(reason, sizeof(reason), "this server was started with --shm off");
    else if (req->nonce.len != ZT_SHM_NONCE_BYTES)
        snprintf(reason, sizeof(reason), "the nonce has %zu bytes, not %d", req->nonce.len, ZT_SHM_NONCE_BYTES);
    else if (zt_shm_attach(req->pid, req->fd, req->size, req->nonce.data, &shm, &err) != 0)
        snprintf(reason, sizeof(reason), "%s", err.msg);
    if (shm != NULL) {
        pthread_mutex_lock(&svc->shm_mu);
        shm_prune(svc);
        struct shm_entry *e = NULL;
        for (int i = 0; i < ZT_SERVICE_MAX_SHM && e == NULL; i++)
            if (svc->shm[i].id == 0)
                e = &svc->shm[i];
        if (e != NULL) {
            *e = (struct shm_entry){.id = svc->next_shm_id ? svc->next_shm_id++ : random_id(), .shm = shm,
                                    .pid = req->pid};
            resp.attached = 1;
            resp.segment = e->id;
            resp.pulls_checked = 1; /* pull_shm */
        }
        pthread_mutex_unlock(&svc->shm_mu);
        if (e == NULL) {
            zt_shm_destroy(shm);
            snprintf(reason, sizeof(reason), "this server holds %d shared-memory segments already",
                     ZT_SERVICE_MAX_SHM);
        }
    }
    if (resp.attached) {
        char total[32], slot[32];
        zt_format_size(req->size, total, sizeof(total));
        zt_format_size(zt_shm_slot_bytes(shm), slot, sizeof(slot));
        ZT_INFO("service: shared memory with %s (pid %d): a segment of %s (%d slots of %s) attached",
                zt_rpc_call_peer(call), (int)req->pid, total, zt_shm_nslots(shm), slot);
    } else
        ZT_INFO("service: shared memory with %s (pid %d) refused: %s", zt_rpc_call_peer(call), (int)req->pid, reason);
    resp.reason = reason;
    return send_packed(call, &resp.base);
}

static int handle_attach_shm(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__attach_shm_request__descriptor, attach_shm);
}

static int detach_shm(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__DetachShmRequest *req = (const Ztrain__V1__DetachShmRequest *)msg;
    struct shm_entry *e = shm_get(svc, req->segment);
    if (e != NULL) {
        pthread_mutex_lock(&svc->shm_mu);
        e->gone = 1; /* freed by the last call that uses it: this one */
        pthread_mutex_unlock(&svc->shm_mu);
        shm_put(svc, e);
    }
    Ztrain__V1__DetachShmResponse resp = ZTRAIN__V1__DETACH_SHM_RESPONSE__INIT;
    return send_packed(call, &resp.base);
}

static int handle_detach_shm(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__detach_shm_request__descriptor, detach_shm);
}

/* ---- PushParams and PushGradients ---- */

/* A PushMessage holding a PushChunk, parsed by hand (wire format of state.proto: PushMessage.chunk = 2,
 * PushChunk.offset = 1, PushChunk.data = 2; unknown fields are skipped). */
struct chunk_view {
    int has_header; /* the message carries a PushHeader (field 1) */
    int has_chunk;
    uint64_t offset;
    struct zt_wire_cursor data; /* positioned at the first data byte; data.left = its length */
};

/* A push chunk arrives in pieces (zt_rpc_call_read_parts) and is parsed where it lies, instead of being
 * copied into one buffer and then again by protobuf-c. Returns 0 with *v filled, or -1 when the bytes are
 * not a valid PushMessage. */
static int parse_push_chunk(const struct zt_rpc_part *parts, size_t nparts, size_t len, struct chunk_view *v)
{
    memset(v, 0, sizeof(*v));
    struct zt_wire_cursor c;
    if (zt_wire_cursor_init(&c, parts, nparts, len) != 0)
        return -1;
    while (c.left > 0) {
        uint32_t field;
        enum zt_wire_type wt;
        if (zt_wire_read_key(&c, &field, &wt) != 0)
            return -1;
        if (field == 1 && wt == ZT_WIRE_LEN) {
            v->has_header = 1;
            if (zt_wire_skip_value(&c, wt) != 0)
                return -1;
        } else if (field == 2 && wt == ZT_WIRE_LEN) {
            struct zt_wire_cursor sub; /* the PushChunk's bytes; c moves past them */
            if (v->has_chunk || zt_wire_read_sub(&c, &sub) != 0)
                return -1;
            v->has_chunk = 1;
            while (sub.left > 0) {
                uint32_t f2;
                enum zt_wire_type w2;
                if (zt_wire_read_key(&sub, &f2, &w2) != 0)
                    return -1;
                if (f2 == 1 && w2 == ZT_WIRE_VARINT) {
                    if (zt_wire_read_varint(&sub, &v->offset) != 0)
                        return -1;
                } else if (f2 == 2 && w2 == ZT_WIRE_LEN) {
                    if (zt_wire_read_sub(&sub, &v->data) != 0)
                        return -1;
                } else if (zt_wire_skip_value(&sub, w2) != 0) {
                    return -1;
                }
            }
        } else if (zt_wire_skip_value(&c, wt) != 0) {
            return -1;
        }
    }
    return 0;
}

/* Stores the data of a parsed chunk, piece by piece, at element `at` of the push; an element split
 * between two pieces goes through a small buffer. Returns 0 or the core's code. */
static int store_chunk(zt_service_t *svc, const char *run, int params, int64_t step, int block, int shard,
                       enum zt_dtype dtype, uint64_t at, struct zt_wire_cursor d, zt_err *err);

/* Calls the core's push for params (step < 0) or gradients of `step`. */
static int core_push(zt_service_t *svc, const char *run, int params, int64_t step, const zt_server_chunk *c,
                     zt_err *err)
{
    return params ? zt_server_core_push_params(svc->core, run, c, err)
                  : zt_server_core_push_grad(svc->core, run, step, c, err);
}

static int store_chunk(zt_service_t *svc, const char *run, int params, int64_t step, int block, int shard,
                       enum zt_dtype dtype, uint64_t at, struct zt_wire_cursor d, zt_err *err)
{
    size_t es = zt_dtype_size(dtype);
    uint8_t split[8];
    size_t nsplit = 0;
    const uint8_t *p;
    size_t here;
    while ((here = zt_wire_next_span(&d, &p)) > 0) {
        size_t used = 0;
        if (nsplit > 0) { /* complete the element begun at the end of the previous piece */
            while (nsplit < es && nsplit < sizeof(split) && used < here)
                split[nsplit++] = p[used++];
            if (nsplit == es) {
                zt_server_chunk c = {.block = block, .shard = shard, .offset = at, .n = 1, .dtype = dtype, .data = split};
                int rc = core_push(svc, run, params, step, &c, err);
                if (rc != 0)
                    return rc;
                at++;
                nsplit = 0;
            }
        }
        size_t whole = (here - used) / es;
        if (whole > 0) {
            zt_server_chunk c = {.block = block, .shard = shard, .offset = at, .n = whole, .dtype = dtype, .data = p + used};
            int rc = core_push(svc, run, params, step, &c, err);
            if (rc != 0)
                return rc;
            at += whole;
            used += whole * es;
        }
        while (used < here && nsplit < sizeof(split)) /* fewer than es bytes are left */
            split[nsplit++] = p[used++];
    }
    return 0;
}

static int handle_push(zt_rpc_call_t *call, zt_service_t *svc, int params)
{
    const char *what = params ? "PushParams" : "PushGradients";
    const void *data;
    size_t len;
    int rc = zt_rpc_call_read(call, &data, &len);
    if (rc < 0)
        return ZT_RPC_CANCELLED;
    if (rc == 0)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "%s carried no messages; send a PushHeader first", what);
    Ztrain__V1__PushMessage *first = ztrain__v1__push_message__unpack(NULL, len, data);
    if (first == NULL)
        return malformed(call, "first PushMessage");
    if (first->msg_case != ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER) {
        ztrain__v1__push_message__free_unpacked(first, NULL);
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "the first message of %s must be a PushHeader", what);
    }
    const Ztrain__V1__PushHeader *h = first->header;
    char run[ZT_SERVER_RUN_ID_MAX];
    snprintf(run, sizeof(run), "%s", h->run);
    int64_t step = h->step;
    int block = h->block, shard = h->shard;
    uint64_t total = h->total_bytes, start = h->offset;
    const uint64_t shm_id = h->shm_segment, shm_off = h->shm_offset;
    enum zt_dtype dtype;
    int dtype_ok = dtype_from_wire(h->dtype, &dtype) == 0;
    ztrain__v1__push_message__free_unpacked(first, NULL);
    if (!dtype_ok)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "the PushHeader's dtype is not DTYPE_F32, DTYPE_F16 or DTYPE_BF16");
    size_t es = zt_dtype_size(dtype);
    if (total % es != 0)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT,
                                "the push announces %" PRIu64 " bytes, not a whole number of %zu-byte elements", total, es);

    /* Check the whole announced range against the layout before storing anything: an empty chunk at its
     * end fails exactly when the range does not fit (or the run, step, dtype or owner is wrong). */
    zt_err err = {{0}};
    zt_server_chunk probe = {.block = block, .shard = shard, .offset = start + total / es, .n = 0, .dtype = dtype};
    rc = core_push(svc, run, params, step, &probe, &err);
    if (rc != 0)
        return core_fail(call, rc, &err);

    uint64_t received = 0;
    if (shm_id != 0) {
        /* The bytes lie in the client's segment: stored straight from there, after the offsets are checked
         * against the segment (whatever the client says, nothing outside it is read). */
        struct shm_entry *e = shm_get(svc, shm_id);
        if (e == NULL)
            return unknown_segment(call, shm_id);
        const void *src = shm_off % es == 0 ? zt_shm_span(e->shm, shm_off, total) : NULL;
        if (src == NULL) {
            const uint64_t size = zt_shm_size(e->shm);
            shm_put(svc, e);
            return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "%s: bytes %" PRIu64 " + %" PRIu64 " of "
                                    "shared-memory segment %" PRIu64 " do not lie in its data (bytes %u to %" PRIu64
                                    ", elements aligned)", what, shm_off, total, shm_id, ZT_SHM_HEAD_BYTES, size);
        }
        zt_server_chunk c = {.block = block, .shard = shard, .offset = start, .n = total / es, .dtype = dtype,
                             .data = src};
        rc = total > 0 ? core_push(svc, run, params, step, &c, &err) : 0;
        shm_put(svc, e);
        if (rc != 0)
            return core_fail(call, rc, &err);
        received = total;
        const void *more;
        size_t mlen;
        if ((rc = zt_rpc_call_read(call, &more, &mlen)) < 0)
            return ZT_RPC_CANCELLED;
        if (rc > 0)
            return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "%s: a push through shared memory carries its "
                                    "header only, no chunks", what);
    }
    for (; shm_id == 0;) {
        const struct zt_rpc_part *parts;
        size_t nparts;
        rc = zt_rpc_call_read_parts(call, &parts, &nparts, &len);
        if (rc < 0)
            return ZT_RPC_CANCELLED;
        if (rc == 0)
            break;
        struct chunk_view v;
        if (parse_push_chunk(parts, nparts, len, &v) != 0)
            return malformed(call, "PushChunk");
        if (v.has_header || !v.has_chunk)
            return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "%s sent %s after its PushHeader; one push carries "
                                    "one header, then chunks", what, v.has_header ? "a second PushHeader" : "a message "
                                    "without a PushChunk");
        if (v.offset != received)
            return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "chunk at byte %" PRIu64 " after %" PRIu64
                                    " bytes: send chunks in order without gaps", v.offset, received);
        size_t dlen = v.data.left;
        if (dlen % es != 0 || dlen > total - received)
            return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "a chunk of %zu bytes after %" PRIu64 " of %" PRIu64
                                    " bytes: chunks must be whole elements and stay within the announced total",
                                    dlen, received, total);
        if (dlen > 0) {
            rc = store_chunk(svc, run, params, step, block, shard, dtype, start + received / es, v.data, &err);
            if (rc != 0)
                return core_fail(call, rc, &err);
            received += dlen;
        }
    }
    if (received != total)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "%s ended after %" PRIu64 " of the %" PRIu64
                                " bytes its header announced", what, received, total);
    if (params && svc->snapshot_commits > 0 && svc->snapshot_dir != NULL) {
        /* The push that completed the initial parameters makes step 0 durable. */
        zt_server_run_info info;
        if (zt_server_core_run_info(svc->core, run, &info, &err) == 0 && info.params_ready && info.step == 0)
            save_durable(svc, run, "its initial parameters");
    }
    Ztrain__V1__PushResponse resp = ZTRAIN__V1__PUSH_RESPONSE__INIT;
    resp.bytes_received = received;
    return send_packed(call, &resp.base);
}

static int handle_push_params(zt_rpc_call_t *call, void *user)
{
    return handle_push(call, user, 1);
}

static int handle_push_grads(zt_rpc_call_t *call, void *user)
{
    return handle_push(call, user, 0);
}

/* ---- CommitStep ---- */

static int commit_step(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__CommitStepRequest *req = (const Ztrain__V1__CommitStepRequest *)msg;
    zt_server_commit_args args = {.step = req->step, .grad_norm = req->grad_norm, .clip_coef = req->clip_coef,
                                  .lr = req->lr, .overflow = req->overflow};
    zt_server_commit_result res;
    zt_err err = {{0}};
    int rc = zt_server_core_commit(svc->core, req->run, &args, &res, &err);
    if (rc != 0)
        return core_fail(call, rc, &err);
    if (svc->snapshot_commits > 0 && svc->snapshot_dir != NULL && res.step % svc->snapshot_commits == 0) {
        char why[64];
        snprintf(why, sizeof(why), "commit %" PRId64, res.step);
        save_durable(svc, req->run, why); /* a retried commit finds the snapshot there and writes nothing */
    }
    Ztrain__V1__CommitStepResponse resp = ZTRAIN__V1__COMMIT_STEP_RESPONSE__INIT;
    resp.step = res.step;
    resp.adam_step = res.adam_step;
    resp.already_committed = res.already_committed;
    resp.skipped = res.skipped;
    resp.seconds = res.seconds;
    return send_packed(call, &resp.base);
}

static int handle_commit(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__commit_step_request__descriptor, commit_step);
}

/* ---- PullParams ---- */

/* Largest encoded ParamChunk before its data: four tagged varints and the data field's tag and length. */
#define PARAM_CHUNK_HEAD_MAX (5 * (1 + ZT_WIRE_VARINT_MAX))

/* Writes the fields of a ParamChunk that precede its data (block 1, shard 2, offset 3, dtype 4, then the
 * tag and length of data 5), as protobuf-c would pack them (proto3: zero scalars are left out), so that
 * the data can be placed right after without a copy. Returns the header's length. */
static size_t put_param_chunk_head(uint8_t *p, int32_t block, int32_t shard, uint64_t offset, int dtype, size_t len)
{
    size_t n = 0;
    if (block != 0) {
        n += zt_wire_put_key(p + n, 1, ZT_WIRE_VARINT);
        n += zt_wire_put_varint(p + n, (uint64_t)(int64_t)block); /* int32: negative values sign-extend */
    }
    if (shard != 0) {
        n += zt_wire_put_key(p + n, 2, ZT_WIRE_VARINT);
        n += zt_wire_put_varint(p + n, (uint64_t)(int64_t)shard);
    }
    if (offset != 0) {
        n += zt_wire_put_key(p + n, 3, ZT_WIRE_VARINT);
        n += zt_wire_put_varint(p + n, offset);
    }
    if (dtype != 0) {
        n += zt_wire_put_key(p + n, 4, ZT_WIRE_VARINT);
        n += zt_wire_put_varint(p + n, (uint64_t)(int64_t)dtype);
    }
    if (len != 0) {
        n += zt_wire_put_key(p + n, 5, ZT_WIRE_LEN);
        n += zt_wire_put_varint(p + n, len);
    }
    return n;
}

/* The client's wait for a block of a commit in progress, never past the call's deadline: a longer one would
 * keep this thread (one of the server's max_calls) blocked after the client has gone. */
static int pull_timeout_ms(const zt_rpc_call_t *call, const Ztrain__V1__PullParamsRequest *req)
{
    double left_ms = zt_rpc_call_time_left(call) * 1000.0;
    int timeout_ms = left_ms > 0 ? (left_ms < INT32_MAX ? (int)left_ms : INT32_MAX) : 0;
    if (req->timeout_ms > 0 && req->timeout_ms < timeout_ms)
        timeout_ms = req->timeout_ms;
    return timeout_ms;
}

/* The places of standing pulls (server/core.h): bytes of an attached segment, with a reference taken. */
static void *place_get(void *user, uint64_t id, uint64_t off, uint64_t len)
{
    zt_service_t *svc = user;
    struct shm_entry *e = shm_get(svc, id);
    void *p = e != NULL ? zt_shm_span(e->shm, off, len) : NULL;
    if (e != NULL && p == NULL)
        shm_put(svc, e);
    return p;
}

static void place_put(void *user, uint64_t id)
{
    zt_service_t *svc = user;
    struct shm_entry *e = NULL;
    pthread_mutex_lock(&svc->shm_mu); /* the reference place_get took keeps the entry, given up or not */
    for (int i = 0; i < ZT_SERVICE_MAX_SHM && e == NULL; i++)
        if (svc->shm[i].id == id && svc->shm[i].refs > 0)
            e = &svc->shm[i];
    pthread_mutex_unlock(&svc->shm_mu);
    ZT_ASSERT(e != NULL);
    shm_put(svc, e);
}

/* Whether the client gave segment e up (DetachShm) while a call still holds it. */
static int shm_given_up(zt_service_t *svc, const struct shm_entry *e)
{
    pthread_mutex_lock(&svc->shm_mu);
    const int gone = e->gone;
    pthread_mutex_unlock(&svc->shm_mu);
    return gone;
}

/* A pull into the client's shared-memory segment: every range straight from the core into the segment, one
 * after the other from shm_offset, each checked against the segment first; no ParamChunk is sent. The segment
 * may be the client's own memory, where its weights live (not a slot): the handler waits for the block first
 * and writes only if the client has not given the segment up meanwhile, which a client does at once after a
 * call that failed (one it stopped waiting for, say) and before it moves on to newer bytes in that memory.
 * A standing pull of one whole shard stays there (zt_server_core_pull_standing): the commits after it write
 * the shard straight into that memory, and its pull of such a step copies nothing. */
static int pull_shm(zt_rpc_call_t *call, zt_service_t *svc, const Ztrain__V1__PullParamsRequest *req, size_t es)
{
    struct shm_entry *e = shm_get(svc, req->shm_segment);
    if (e == NULL)
        return unknown_segment(call, req->shm_segment);
    zt_err err = {{0}};
    uint64_t at = req->shm_offset;
    int code = ZT_RPC_OK;
    for (size_t i = 0; i < req->n_ranges && code == ZT_RPC_OK; i++) {
        const Ztrain__V1__PullRange *r = req->ranges[i];
        void *dst = at % es == 0 && r->count <= UINT64_MAX / es ? zt_shm_span(e->shm, at, r->count * es) : NULL;
        if (dst == NULL) {
            code = zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "PullParams: %" PRIu64 " elements of %zu bytes at "
                                    "byte %" PRIu64 " of shared-memory segment %" PRIu64 " do not lie in its data "
                                    "(bytes %u to %" PRIu64 ", elements aligned)", r->count, es, at,
                                    req->shm_segment, ZT_SHM_HEAD_BYTES, zt_shm_size(e->shm));
            break;
        }
        int rc = req->masters ? 0 : zt_server_core_wait_block(svc->core, req->run, req->step, r->block,
                                                               pull_timeout_ms(call, req), &err);
        if (rc == 0 && shm_given_up(svc, e)) {
            code = zt_rpc_call_fail(call, ZT_RPC_ABORTED, "PullParams: the client gave shared-memory segment %"
                                    PRIu64 " up while this pull waited; nothing was written", req->shm_segment);
            break;
        }
        bool delivered;
        if (rc == 0 && req->masters)
            rc = zt_server_core_read_masters(svc->core, req->run, req->step, r->block, r->shard, r->offset, r->count,
                                             dst, &err);
        else if (rc == 0 && req->standing && req->n_ranges == 1)
            rc = zt_server_core_pull_standing(svc->core, req->run, req->step, r->block, r->shard, r->offset, r->count,
                                              dst, req->shm_segment, at, pull_timeout_ms(call, req), &delivered,
                                              &err);
        else if (rc == 0)
            rc = zt_server_core_pull(svc->core, req->run, req->step, r->block, r->shard, r->offset, r->count, dst,
                                     pull_timeout_ms(call, req), &err);
        if (rc != 0)
            code = core_fail(call, rc, &err);
        at += r->count * es;
    }
    shm_put(svc, e);
    return code;
}

static int pull_params(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__PullParamsRequest *req = (const Ztrain__V1__PullParamsRequest *)msg;
    zt_err err = {{0}};
    zt_server_run_info info;
    int rc = zt_server_core_run_info(svc->core, req->run, &info, &err);
    if (rc != 0)
        return core_fail(call, rc, &err);
    enum zt_dtype dtype = req->masters ? ZT_DTYPE_F32 : info.param_dtype;
    size_t es = zt_dtype_size(dtype);
    if (req->shm_segment != 0)
        return pull_shm(call, svc, req, es);
    uint64_t per_chunk = PULL_CHUNK_BYTES / es;
    for (size_t i = 0; i < req->n_ranges; i++) {
        const Ztrain__V1__PullRange *r = req->ranges[i];
        for (uint64_t done = 0; done < r->count; done += per_chunk) {
            uint64_t n = r->count - done < per_chunk ? r->count - done : per_chunk;
            int timeout_ms = pull_timeout_ms(call, req);
            /* One buffer per message, handed to gRPC without a copy: the header, then the core copies the
             * parameters right behind it. */
            uint8_t head[PARAM_CHUNK_HEAD_MAX];
            size_t hlen = put_param_chunk_head(head, r->block, r->shard, r->offset + done, dtype_to_wire(dtype),
                                               (size_t)(n * es));
            uint8_t *buf = zt_xmalloc(hlen + (size_t)(n * es));
            memcpy(buf, head, hlen);
            if (req->masters)
                rc = zt_server_core_read_masters(svc->core, req->run, req->step, r->block, r->shard, r->offset + done,
                                                 n, buf + hlen, &err);
            else
                rc = zt_server_core_pull(svc->core, req->run, req->step, r->block, r->shard, r->offset + done, n,
                                         buf + hlen, timeout_ms < 0 ? 0 : timeout_ms, &err);
            if (rc != 0) {
                free(buf);
                return core_fail(call, rc, &err);
            }
            if (zt_rpc_call_write_owned(call, buf, hlen + (size_t)(n * es)) != 0)
                return ZT_RPC_CANCELLED;
        }
    }
    return ZT_RPC_OK;
}

static int handle_pull(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__pull_params_request__descriptor, pull_params);
}

/* ---- snapshots ---- */

/* Run ids become directory names: only [A-Za-z0-9._-] and never "." or "..". */
static int run_id_is_safe(const char *run)
{
    if (run == NULL || run[0] == '\0' || strcmp(run, ".") == 0 || strcmp(run, "..") == 0 ||
        strlen(run) >= ZT_SERVER_RUN_ID_MAX)
        return 0;
    for (const char *p = run; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* Fails the call unless the server was started with a snapshot directory. */
static int require_snapshot_dir(zt_rpc_call_t *call, const zt_service_t *svc)
{
    if (svc->snapshot_dir != NULL)
        return ZT_RPC_OK;
    return zt_rpc_call_fail(call, ZT_RPC_FAILED_PRECONDITION,
                            "this server has no snapshot directory: start ztrain-server with --snapshot-dir DIR");
}

static int save_snapshot(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__SaveSnapshotRequest *req = (const Ztrain__V1__SaveSnapshotRequest *)msg;
    int code = require_snapshot_dir(call, svc);
    if (code != ZT_RPC_OK)
        return code;
    if (!run_id_is_safe(req->run))
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "'%s' is not a valid run id", req->run);
    zt_err err = {{0}};
    char path[4096] = "";
    zt_server_run_info info;
    int rc = zt_server_core_snapshot_save_checkpoint(svc->core, req->run, svc->snapshot_dir,
                                                     req->keep > 0 ? req->keep : svc->snapshot_keep, path,
                                                     sizeof(path), &err);
    if (rc == 0)
        rc = zt_server_core_run_info(svc->core, req->run, &info, &err);
    if (rc != 0)
        return core_fail(call, rc, &err);
    ZT_INFO("service: run %s saved at step %" PRId64 " to %s", req->run, info.step, path);
    Ztrain__V1__SaveSnapshotResponse resp = ZTRAIN__V1__SAVE_SNAPSHOT_RESPONSE__INIT;
    resp.path = path;
    resp.step = info.step;
    return send_packed(call, &resp.base);
}

static int handle_save(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__save_snapshot_request__descriptor, save_snapshot);
}

/* Finds the directory of a run's latest snapshot of this server: the file `latest` beside the step
 * directories names it (zt_server_core_snapshot_save writes it). */
static int latest_snapshot(zt_service_t *svc, const char *run, int count, char *dir, size_t cap, zt_err *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s/server%dof%d/latest", svc->snapshot_dir, run, svc->server_index, count);
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc != 0)
        return zt_fail(err, -ENOENT, "run %s has no snapshot of this server (%s is missing); call SaveSnapshot first",
                       run, path);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        text[--len] = '\0';
    if (len == 0 || strchr(text, '/') != NULL)
        rc = zt_fail(err, ZT_EFORMAT, "%s should name a snapshot directory beside it, not '%s'", path, text);
    else
        snprintf(dir, cap, "%s/%s/server%dof%d/%s", svc->snapshot_dir, run, svc->server_index, count, text);
    free(text);
    return rc;
}

static int load_snapshot(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__LoadSnapshotRequest *req = (const Ztrain__V1__LoadSnapshotRequest *)msg;
    int code = require_snapshot_dir(call, svc);
    if (code != ZT_RPC_OK)
        return code;
    if (!run_id_is_safe(req->run) || req->step < 0)
        return zt_rpc_call_fail(call, ZT_RPC_INVALID_ARGUMENT, "'%s' step %" PRId64 " does not name a snapshot",
                                req->run, req->step);
    zt_err err = {{0}};
    char dir[4096];
    int count = svc->server_count > 0 ? svc->server_count : 1;
    int rc = 0;
    if (req->step == 0 && !req->exact_step)
        rc = latest_snapshot(svc, req->run, count, dir, sizeof(dir), &err);
    else
        snprintf(dir, sizeof(dir), "%s/%s/server%dof%d/step_%08" PRId64, svc->snapshot_dir, req->run,
                 svc->server_index, count, req->step);
    zt_server_run_info info;
    if (rc == 0)
        rc = zt_server_core_snapshot_read(svc->core, dir, &info, &err);
    if (rc != 0)
        return core_fail(call, rc, &err);
    ZT_INFO("service: run %s loaded at step %" PRId64 " from %s", req->run, info.step, dir);
    Ztrain__V1__RunInfo ri = ZTRAIN__V1__RUN_INFO__INIT;
    fill_info(&ri, req->run, &info);
    Ztrain__V1__LoadSnapshotResponse resp = ZTRAIN__V1__LOAD_SNAPSHOT_RESPONSE__INIT;
    resp.info = &ri;
    return send_packed(call, &resp.base);
}

static int handle_load(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__load_snapshot_request__descriptor, load_snapshot);
}

/* ---- Stats ---- */

static int report_stats(zt_rpc_call_t *call, zt_service_t *svc, const ProtobufCMessage *msg)
{
    const Ztrain__V1__StatsRequest *req = (const Ztrain__V1__StatsRequest *)msg;
    zt_server_run_stats *stats = NULL;
    int n = 0;
    if (req->run != NULL && req->run[0] != '\0') {
        zt_err err = {{0}};
        stats = zt_xcalloc(1, sizeof(*stats));
        int rc = zt_server_core_stats(svc->core, req->run, stats, &err);
        if (rc != 0) {
            free(stats);
            return core_fail(call, rc, &err);
        }
        n = 1;
    } else {
        int total = 0;
        zt_server_core_list_stats(svc->core, NULL, 0, &total);
        stats = zt_xcalloc((size_t)(total > 0 ? total : 1), sizeof(*stats));
        zt_server_core_list_stats(svc->core, stats, total, &n);
        if (n > total)
            n = total;
    }
    Ztrain__V1__RunStats *items = zt_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*items));
    Ztrain__V1__RunStats **ptrs = zt_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*ptrs));
    for (int i = 0; i < n; i++) {
        ztrain__v1__run_stats__init(&items[i]);
        items[i].run = stats[i].run_id;
        items[i].step = stats[i].step;
        items[i].adam_step = stats[i].adam_step;
        items[i].commits = stats[i].commits;
        items[i].skipped_steps = stats[i].skipped_steps;
        items[i].bytes_pushed = stats[i].bytes_pushed;
        items[i].bytes_pulled = stats[i].bytes_pulled;
        items[i].last_commit_seconds = stats[i].last_commit_s;
        items[i].total_commit_seconds = stats[i].total_commit_s;
        items[i].store_bytes = stats[i].store_bytes;
        items[i].ram_bytes = stats[i].ram_bytes;
        ptrs[i] = &items[i];
    }
    Ztrain__V1__StatsResponse resp = ZTRAIN__V1__STATS_RESPONSE__INIT;
    resp.n_runs = (size_t)n;
    resp.runs = ptrs;
    resp.snapshot_dir = svc->snapshot_dir != NULL ? ZTRAIN__V1__SNAPSHOT_DIR__SNAPSHOT_DIR_SET
                                                  : ZTRAIN__V1__SNAPSHOT_DIR__SNAPSHOT_DIR_NONE;
    int code = send_packed(call, &resp.base);
    free(ptrs);
    free(items);
    free(stats);
    return code;
}

static int handle_stats(zt_rpc_call_t *call, void *user)
{
    return serve_request(call, user, &ztrain__v1__stats_request__descriptor, report_stats);
}

/* ---- lifetime ---- */

int zt_service_create(zt_server_core *core, const struct zt_service_options *opt, zt_service_t **out, zt_err *err)
{
    (void)err;
    zt_service_t *svc = zt_xcalloc(1, sizeof(*svc));
    svc->core = core;
    if (opt != NULL) {
        svc->snapshot_dir = opt->snapshot_dir ? strdup(opt->snapshot_dir) : NULL;
        svc->snapshot_keep = opt->snapshot_keep;
        svc->snapshot_commits = opt->snapshot_commits > 0 ? opt->snapshot_commits : 0;
        svc->server_index = opt->server_index;
        svc->server_count = opt->server_count;
        svc->shm_off = opt->shm_off;
    }
    pthread_mutex_init(&svc->shm_mu, NULL);
    const zt_server_pull_places places = {.get = place_get, .put = place_put, .user = svc};
    zt_server_core_set_pull_places(core, &places);
    *out = svc;
    return 0;
}

int zt_service_add_methods(zt_service_t *svc, zt_rpc_server_t *srv, zt_err *err)
{
    static const struct {
        const char *name;
        enum zt_rpc_kind kind;
        zt_rpc_handler_fn fn;
    } methods[] = {
        {SVC "RegisterRun", ZT_RPC_KIND_UNARY, handle_register},
        {SVC "PushParams", ZT_RPC_KIND_CLIENT_STREAM, handle_push_params},
        {SVC "PushGradients", ZT_RPC_KIND_CLIENT_STREAM, handle_push_grads},
        {SVC "CommitStep", ZT_RPC_KIND_UNARY, handle_commit},
        {SVC "PullParams", ZT_RPC_KIND_SERVER_STREAM, handle_pull},
        {SVC "SaveSnapshot", ZT_RPC_KIND_UNARY, handle_save},
        {SVC "LoadSnapshot", ZT_RPC_KIND_UNARY, handle_load},
        {SVC "Stats", ZT_RPC_KIND_UNARY, handle_stats},
        {SVC "AttachShm", ZT_RPC_KIND_UNARY, handle_attach_shm},
        {SVC "DetachShm", ZT_RPC_KIND_UNARY, handle_detach_shm},
    };
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        int rc = zt_rpc_server_add_method(srv, methods[i].name, methods[i].kind, methods[i].fn, svc, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void zt__service_set_shm_ids(zt_service_t *svc, uint64_t first)
{
    svc->next_shm_id = first;
}

void zt_service_destroy(zt_service_t *svc)
{
    if (svc == NULL)
        return;
    zt_server_core_set_pull_places(svc->core, NULL);
    for (int i = 0; i < ZT_SERVICE_MAX_SHM; i++)
        zt_shm_destroy(svc->shm[i].shm);
    pthread_mutex_destroy(&svc->shm_mu);
    free(svc->snapshot_dir);
    free(svc);
}
