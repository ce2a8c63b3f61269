/* The worker's state-service client (see client.h): the step protocol over S ztrain-server processes via
 * proto/rpc.h, with retries on UNAVAILABLE, or over an in-process state server core (embedded mode). */
#include "worker/state/client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "proto/rpc.h"
#include "proto/wire.h"
#include "ztrain/v1/state.pb-c.h"

#define SVC "/ztrain.v1.StateService/"
#define MAX_RUNS 16

struct remote {
    char *target;            /* "host:port" */
    zt_rpc_channel_t *ch;
};

/* The world size of each run registered through this client: the owner mapping needs it. */
struct run_entry {
    char id[ZT_SERVER_RUN_ID_MAX];
    int world_size;
};

struct zt_state_client {
    int n;                   /* servers; 1 in embedded mode */
    struct remote *srv;      /* n entries, or NULL in embedded mode */
    zt_server_core *core;    /* embedded mode, else NULL */
    int max_retries;
    double backoff_s;
    double timeout_s;
    size_t chunk_bytes;
    int64_t server_step;     /* see zt_state_client_server_step */
    struct run_entry runs[MAX_RUNS];
    int nruns;
    void (*hook)(void *user, int block, int shard, uint64_t bytes_sent);
    void *hook_user;
};

/* ---- lifetime ---- */

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(zt_xmalloc(n), s, n);
}

static int parse_servers(zt_state_client_t *c, const char *list, zt_err *err)
{
    char *copy = xstrdup(list);
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    c->srv = zt_xcalloc((size_t)n, sizeof(*c->srv));
    int rc = 0;
    char *save = NULL;
    char *tok = strtok_r(copy, ",", &save);
    c->n = 0;
    for (; tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        const char *colon = strrchr(tok, ':');
        if (colon == NULL || colon == tok || colon[1] == '\0') {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "--servers %s: '%s' is not host:port", list, tok);
            break;
        }
        c->srv[c->n++].target = xstrdup(tok);
    }
    if (rc == 0 && c->n != n)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "--servers %s: an empty entry; list host:port pairs separated by commas",
                     list);
    free(copy);
    return rc;
}

int zt_state_client_create(const struct zt_state_client_options *opt, zt_state_client_t **out, zt_err *err)
{
    *out = NULL;
    zt_state_client_t *c = zt_xcalloc(1, sizeof(*c));
    c->max_retries = opt->max_retries > 0 ? opt->max_retries : 8;
    c->backoff_s = opt->backoff_s > 0 ? opt->backoff_s : 0.1;
    c->timeout_s = opt->timeout_s > 0 ? opt->timeout_s : 120.0;
    c->chunk_bytes = opt->chunk_bytes > 0 && opt->chunk_bytes <= (1u << 20) ? opt->chunk_bytes : (1u << 20);
    c->chunk_bytes -= c->chunk_bytes % 4; /* whole elements of every dtype */
    if (c->chunk_bytes == 0)
        c->chunk_bytes = 4;
    c->server_step = -1;
    int rc;
    if (opt->servers == NULL || opt->servers[0] == '\0') {
        c->n = 1;
        rc = zt_server_core_create(&c->core, &opt->embedded, err);
    } else {
        rc = parse_servers(c, opt->servers, err);
        for (int i = 0; rc == 0 && i < c->n; i++) {
            struct zt_rpc_channel_options co = {
                .target = c->srv[i].target,
                .tls_ca_file = opt->tls_ca_file,
                .tls_cert_file = opt->tls_cert_file,
                .tls_key_file = opt->tls_key_file,
                .tls_server_name = opt->tls_server_name,
                .token = opt->token,
            };
            rc = zt_rpc_channel_create(&co, &c->srv[i].ch, err);
        }
    }
    if (rc != 0) {
        zt_state_client_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

void zt_state_client_destroy(zt_state_client_t *c)
{
    if (c == NULL)
        return;
    for (int i = 0; c->srv != NULL && i < c->n; i++) {
        zt_rpc_channel_destroy(c->srv[i].ch);
        free(c->srv[i].target);
    }
    free(c->srv);
    zt_server_core_destroy(c->core);
    free(c);
}

int zt_state_client_nservers(const zt_state_client_t *c)
{
    return c->n;
}

zt_server_core *zt_state_client_embedded_core(zt_state_client_t *c)
{
    return c->core;
}

int64_t zt_state_client_server_step(const zt_state_client_t *c)
{
    return c->server_step;
}

void zt__state_client_set_chunk_hook(zt_state_client_t *c, void (*fn)(void *, int, int, uint64_t), void *user)
{
    c->hook = fn;
    c->hook_user = user;
}

/* ---- helpers ---- */

static int world_size_of(zt_state_client_t *c, const char *run, zt_err *err)
{
    for (int i = 0; i < c->nruns; i++)
        if (strcmp(c->runs[i].id, run) == 0)
            return c->runs[i].world_size;
    return zt_fail(err, ZT_ESTATE, "run %s was not registered through this client; call zt_state_client_register first",
                   run);
}

static int owner_of(zt_state_client_t *c, const char *run, int block, int shard, zt_err *err)
{
    int w = world_size_of(c, run, err);
    if (w < 0)
        return w;
    return zt_server_owner(run, block, shard, w, c->n);
}

/* Decides whether a call that ended with `code` is tried again; if so, logs and waits the backoff. */
static int should_retry(zt_state_client_t *c, int server, int code, int attempt, const struct zt_rpc_status *st)
{
    if (code != ZT_RPC_UNAVAILABLE || attempt >= c->max_retries)
        return 0;
    double wait = c->backoff_s;
    for (int i = 0; i < attempt; i++)
        wait *= 2.0;
    ZT_WARN("state server %s unavailable, retry %d/%d in %.1fs (%s)", c->srv[server].target, attempt + 1,
            c->max_retries, wait, st->msg);
    struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return 1;
}

/* Turns a failed call's status into a negative code with a message naming the server. */
static int rpc_fail(zt_state_client_t *c, int server, const char *what, const struct zt_rpc_status *st, zt_err *err)
{
    int code = st->code == ZT_RPC_NOT_FOUND            ? -ENOENT
               : st->code == ZT_RPC_INVALID_ARGUMENT    ? ZT_EINVAL_CONFIG
               : st->code == ZT_RPC_FAILED_PRECONDITION ? ZT_ESTATE
               : st->code == ZT_RPC_UNAVAILABLE         ? -ECONNREFUSED
               : st->code == ZT_RPC_DEADLINE_EXCEEDED   ? -ETIMEDOUT
                                                        : ZT_EIO;
    return zt_fail(err, code, "state server %s: %s failed: %s: %s", c->srv[server].target, what,
                   zt_rpc_code_name(st->code), st->msg);
}

/* Packs msg into a malloc'd buffer. */
static void *pack(const ProtobufCMessage *msg, size_t *len)
{
    *len = protobuf_c_message_get_packed_size(msg);
    void *buf = zt_xmalloc(*len ? *len : 1);
    protobuf_c_message_pack(msg, buf);
    return buf;
}

/* A unary call with retries on UNAVAILABLE. Returns the final gRPC code; *resp as zt_rpc_unary. */
static int unary(zt_state_client_t *c, int server, const char *method, const ProtobufCMessage *req, void **resp,
                 size_t *resp_len, struct zt_rpc_status *st)
{
    size_t len;
    void *buf = pack(req, &len);
    int code;
    for (int attempt = 0;; attempt++) {
        code = zt_rpc_unary(c->srv[server].ch, method, buf, len, c->timeout_s, 0, resp, resp_len, st);
        if (!should_retry(c, server, code, attempt, st))
            break;
    }
    free(buf);
    return code;
}

/* The step a remote server holds for run (Stats), or -1 when it cannot tell. */
static int64_t remote_step(zt_state_client_t *c, int server, const char *run)
{
    Ztrain__V1__StatsRequest req = ZTRAIN__V1__STATS_REQUEST__INIT;
    req.run = (char *)run;
    void *resp = NULL;
    size_t len = 0;
    struct zt_rpc_status st;
    if (unary(c, server, SVC "Stats", &req.base, &resp, &len, &st) != ZT_RPC_OK)
        return st.code == ZT_RPC_NOT_FOUND ? 0 : -1;
    Ztrain__V1__StatsResponse *r = ztrain__v1__stats_response__unpack(NULL, len, resp);
    int64_t step = r != NULL && r->n_runs == 1 ? r->runs[0]->step : -1;
    if (r != NULL)
        ztrain__v1__stats_response__free_unpacked(r, NULL);
    free(resp);
    return step;
}

/* A push or commit of `step` was refused: if the server sits below step - 1 (it restarted from an older
 * snapshot, or lost the run), records its step and returns ZT_ESTATE saying where to resume. */
static int step_refused(zt_state_client_t *c, int server, const char *run, int64_t step, const char *what,
                        const struct zt_rpc_status *st, zt_err *err)
{
    if (st->code != ZT_RPC_FAILED_PRECONDITION && st->code != ZT_RPC_NOT_FOUND)
        return rpc_fail(c, server, what, st, err);
    int64_t at = remote_step(c, server, run);
    if (at < 0 || at >= step - 1)
        return rpc_fail(c, server, what, st, err);
    c->server_step = at;
    ZT_WARN("state server %s holds run %s at step %" PRId64 " (restarted from a snapshot?); the run resumes there",
            c->srv[server].target, run, at);
    return zt_fail(err, ZT_ESTATE, "state server %s holds run %s at step %" PRId64 ", not %" PRId64
                   ": resume the run from step %" PRId64 " (pull its parameters and redo the steps after it)",
                   c->srv[server].target, run, at, step - 1, at);
}

/* ---- register ---- */

int zt_state_client_register(zt_state_client_t *c, const zt_server_run_desc *desc, int64_t *step, zt_err *err)
{
    int have = 0;
    for (int i = 0; i < c->nruns; i++)
        have |= strcmp(c->runs[i].id, desc->run_id) == 0;
    if (!have) {
        if (c->nruns == MAX_RUNS)
            return zt_fail(err, ZT_ENOMEM, "a state client serves at most %d runs", MAX_RUNS);
        snprintf(c->runs[c->nruns].id, sizeof(c->runs[c->nruns].id), "%s", desc->run_id);
        c->runs[c->nruns++].world_size = desc->world_size;
    }
    if (c->core != NULL) {
        zt_server_run_info info;
        int rc = zt_server_core_register(c->core, desc, &info, err);
        if (rc == 0 && step != NULL)
            *step = info.step;
        return rc;
    }
    Ztrain__V1__RegisterRunRequest req = ZTRAIN__V1__REGISTER_RUN_REQUEST__INIT;
    req.run = (char *)desc->run_id;
    req.world_size = desc->world_size;
    req.beta1 = desc->beta1;
    req.beta2 = desc->beta2;
    req.eps = desc->eps;
    req.weight_decay = desc->weight_decay;
    req.param_dtype = desc->param_dtype == ZT_DTYPE_F16    ? ZTRAIN__V1__DTYPE__DTYPE_F16
                      : desc->param_dtype == ZT_DTYPE_BF16 ? ZTRAIN__V1__DTYPE__DTYPE_BF16
                                                           : ZTRAIN__V1__DTYPE__DTYPE_F32;
    int nranges = 0;
    for (int b = 0; b < desc->nblocks; b++)
        nranges += desc->blocks[b].ndecay;
    Ztrain__V1__BlockLayout *blocks = zt_xcalloc((size_t)desc->nblocks, sizeof(*blocks));
    Ztrain__V1__BlockLayout **bptr = zt_xcalloc((size_t)desc->nblocks, sizeof(*bptr));
    Ztrain__V1__Range *ranges = zt_xcalloc((size_t)(nranges ? nranges : 1), sizeof(*ranges));
    Ztrain__V1__Range **rptr = zt_xcalloc((size_t)(nranges ? nranges : 1), sizeof(*rptr));
    int at = 0;
    for (int b = 0; b < desc->nblocks; b++) {
        ztrain__v1__block_layout__init(&blocks[b]);
        blocks[b].numel = desc->blocks[b].numel;
        blocks[b].n_decay = (size_t)desc->blocks[b].ndecay;
        blocks[b].decay = &rptr[at];
        for (int r = 0; r < desc->blocks[b].ndecay; r++, at++) {
            ztrain__v1__range__init(&ranges[at]);
            ranges[at].begin = desc->blocks[b].decay[r].begin;
            ranges[at].end = desc->blocks[b].decay[r].end;
            rptr[at] = &ranges[at];
        }
        bptr[b] = &blocks[b];
    }
    req.n_blocks = (size_t)desc->nblocks;
    req.blocks = bptr;
    int rc = 0;
    int64_t lowest = INT64_MAX;
    for (int i = 0; rc == 0 && i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        if (unary(c, i, SVC "RegisterRun", &req.base, &resp, &len, &st) != ZT_RPC_OK) {
            rc = rpc_fail(c, i, "RegisterRun", &st, err);
            break;
        }
        Ztrain__V1__RegisterRunResponse *r = ztrain__v1__register_run_response__unpack(NULL, len, resp);
        if (r == NULL || r->info == NULL)
            rc = zt_fail(err, ZT_EFORMAT, "state server %s: the RegisterRunResponse is not valid protobuf",
                         c->srv[i].target);
        else if (r->info->step < lowest)
            lowest = r->info->step;
        if (r != NULL)
            ztrain__v1__register_run_response__free_unpacked(r, NULL);
        free(resp);
    }
    free(rptr);
    free(ranges);
    free(bptr);
    free(blocks);
    if (rc == 0 && step != NULL)
        *step = lowest;
    return rc;
}

/* ---- pushes ---- */

/* Largest encoded PushMessage before a chunk's data: the chunk field's tag and length, the offset's tag
 * and value, the data field's tag and length. */
#define PUSH_CHUNK_HEAD_MAX (1 + ZT_WIRE_VARINT_MAX + 1 + ZT_WIRE_VARINT_MAX + 1 + ZT_WIRE_VARINT_MAX)

/* Writes the bytes of a PushMessage holding a PushChunk that precede the chunk's data (PushMessage.chunk
 * = 2; PushChunk.offset = 1, PushChunk.data = 2), as protobuf-c would pack them (proto3: a zero offset
 * and empty data are left out), so that the data can be placed right after. Returns the header's length. */
static size_t put_push_chunk_head(uint8_t *p, uint64_t offset, size_t len)
{
    uint8_t inner[1 + ZT_WIRE_VARINT_MAX + 1 + ZT_WIRE_VARINT_MAX];
    size_t n = 0;
    if (offset != 0) {
        n += zt_wire_put_key(inner + n, 1, ZT_WIRE_VARINT);
        n += zt_wire_put_varint(inner + n, offset);
    }
    if (len != 0) {
        n += zt_wire_put_key(inner + n, 2, ZT_WIRE_LEN);
        n += zt_wire_put_varint(inner + n, len);
    }
    size_t h = 0;
    h += zt_wire_put_key(p + h, 2, ZT_WIRE_LEN);
    h += zt_wire_put_varint(p + h, n + len);
    memcpy(p + h, inner, n);
    return h + n;
}

/* One attempt at a whole push stream. Returns the gRPC code with st filled. */
static int push_once(zt_state_client_t *c, int server, const char *method, const char *run, int64_t step, int block,
                     int shard, Ztrain__V1__DType dtype, const uint8_t *data, uint64_t bytes,
                     struct zt_rpc_status *st)
{
    zt_rpc_stream_t *s = NULL;
    zt_err e = {{0}};
    if (zt_rpc_stream_start(c->srv[server].ch, method, c->timeout_s, 0, &s, &e) != 0) {
        st->code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "%s", e.msg);
        return st->code;
    }
    Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
    h.run = (char *)run;
    h.step = step;
    h.block = block;
    h.shard = shard;
    h.dtype = dtype;
    h.total_bytes = bytes;
    Ztrain__V1__PushMessage m = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
    m.header = &h;
    size_t len;
    void *buf = pack(&m.base, &len);
    int ok = zt_rpc_stream_send(s, buf, len) == 0;
    free(buf);
    for (uint64_t at = 0; ok && at < bytes; at += c->chunk_bytes) {
        size_t n = (size_t)(bytes - at < c->chunk_bytes ? bytes - at : c->chunk_bytes);
        /* The chunk's data is copied once, right behind its header, into a buffer that gRPC sends and
         * frees (no protobuf-c pack, no copy into a slice). */
        uint8_t *msg = zt_xmalloc(PUSH_CHUNK_HEAD_MAX + n);
        size_t hlen = put_push_chunk_head(msg, at, n);
        memcpy(msg + hlen, data + at, n);
        ok = zt_rpc_stream_send_owned(s, msg, hlen + n) == 0;
        if (ok && c->hook != NULL)
            c->hook(c->hook_user, block, shard, at + n);
    }
    if (ok)
        zt_rpc_stream_close_send(s);
    const void *r;
    size_t rlen;
    int got = zt_rpc_stream_recv(s, &r, &rlen);
    int code = zt_rpc_stream_finish(s, st);
    if (code == ZT_RPC_OK && got != 1) {
        st->code = code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "the server ended the push without a PushResponse");
    }
    return code;
}

static int push_remote(zt_state_client_t *c, const char *method, const char *run, int64_t step, int block, int shard,
                       Ztrain__V1__DType dtype, const void *data, uint64_t bytes, zt_err *err)
{
    int server = owner_of(c, run, block, shard, err);
    if (server < 0)
        return server;
    c->server_step = -1;
    struct zt_rpc_status st;
    int code;
    /* A retry sends the whole shard again: the server overwrites what an interrupted attempt left. */
    for (int attempt = 0;; attempt++) {
        code = push_once(c, server, method, run, step, block, shard, dtype, data, bytes, &st);
        if (!should_retry(c, server, code, attempt, &st))
            break;
    }
    if (code == ZT_RPC_OK)
        return 0;
    return step > 0 ? step_refused(c, server, run, step, method + strlen(SVC), &st, err)
                    : rpc_fail(c, server, method + strlen(SVC), &st, err);
}

int zt_state_client_push_params(zt_state_client_t *c, const char *run, int block, int shard, const float *data,
                                uint64_t n, zt_err *err)
{
    if (c->core != NULL) {
        zt_server_chunk ch = {.block = block, .shard = shard, .offset = 0, .n = n, .dtype = ZT_DTYPE_F32, .data = data};
        return zt_server_core_push_params(c->core, run, &ch, err);
    }
    return push_remote(c, SVC "PushParams", run, 0, block, shard, ZTRAIN__V1__DTYPE__DTYPE_F32, data, n * 4, err);
}

int zt_state_client_push_grad(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                              enum zt_dtype dtype, const void *data, uint64_t n, zt_err *err)
{
    if (c->core != NULL) {
        zt_server_chunk ch = {.block = block, .shard = shard, .offset = 0, .n = n, .dtype = dtype, .data = data};
        return zt_server_core_push_grad(c->core, run, step, &ch, err);
    }
    Ztrain__V1__DType wire = dtype == ZT_DTYPE_F16    ? ZTRAIN__V1__DTYPE__DTYPE_F16
                             : dtype == ZT_DTYPE_BF16 ? ZTRAIN__V1__DTYPE__DTYPE_BF16
                                                      : ZTRAIN__V1__DTYPE__DTYPE_F32;
    return push_remote(c, SVC "PushGradients", run, step, block, shard, wire, data, n * zt_dtype_size(dtype), err);
}

/* ---- commit ---- */

int zt_state_client_commit(zt_state_client_t *c, const char *run, const zt_server_commit_args *args, zt_err *err)
{
    c->server_step = -1;
    if (c->core != NULL)
        return zt_server_core_commit(c->core, run, args, NULL, err);
    Ztrain__V1__CommitStepRequest req = ZTRAIN__V1__COMMIT_STEP_REQUEST__INIT;
    req.run = (char *)run;
    req.step = args->step;
    req.grad_norm = args->grad_norm;
    req.clip_coef = args->clip_coef;
    req.lr = args->lr;
    req.overflow = args->overflow;
    for (int i = 0; i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        if (unary(c, i, SVC "CommitStep", &req.base, &resp, &len, &st) != ZT_RPC_OK)
            return step_refused(c, i, run, args->step, "CommitStep", &st, err);
        free(resp);
    }
    return 0;
}

/* ---- pull ---- */

/* A ParamChunk parsed by hand (state.proto: block = 1, shard = 2, offset = 3, dtype = 4, data = 5; unknown
 * fields are skipped, fields may come in any order). */
struct param_view {
    int32_t block;
    int32_t shard;
    uint64_t offset;
    int dtype;          /* Ztrain__V1__DType */
    struct zt_wire_cursor data; /* at the first data byte; data.left = its length (0 when absent) */
};

/* A ParamChunk arrives in pieces (zt_rpc_stream_recv_parts) and is parsed where it lies, so that its data
 * (up to 1 MiB) is copied once, straight into the caller's array. Returns 0 with *v filled, or -1 when the
 * bytes are not a valid ParamChunk. */
static int parse_param_chunk(const struct zt_rpc_part *parts, size_t nparts, size_t len, struct param_view *v)
{
    memset(v, 0, sizeof(*v));
    struct zt_wire_cursor c;
    if (zt_wire_cursor_init(&c, parts, nparts, len) != 0)
        return -1;
    v->data = c;
    v->data.left = 0;
    while (c.left > 0) {
        uint32_t field;
        enum zt_wire_type wt;
        uint64_t x;
        if (zt_wire_read_key(&c, &field, &wt) != 0)
            return -1;
        if (field >= 1 && field <= 4 && wt == ZT_WIRE_VARINT) {
            if (zt_wire_read_varint(&c, &x) != 0)
                return -1;
            if (field == 1)
                v->block = (int32_t)(uint32_t)x; /* int32: protobuf keeps the low 32 bits */
            else if (field == 2)
                v->shard = (int32_t)(uint32_t)x;
            else if (field == 3)
                v->offset = x;
            else
                v->dtype = (int)(int32_t)(uint32_t)x;
        } else if (field == 5 && wt == ZT_WIRE_LEN) {
            size_t n;
            if (zt_wire_read_len(&c, &n) != 0)
                return -1;
            v->data = c;
            v->data.left = n;
            if (zt_wire_skip(&c, n) != 0)
                return -1;
        } else if (field <= 5) {
            return -1; /* a known field with the wrong wire type */
        } else if (zt_wire_skip_value(&c, wt) != 0) {
            return -1;
        }
    }
    return 0;
}

static int pull_once(zt_state_client_t *c, int server, const char *run, int64_t step, int block, int shard,
                     uint64_t offset, uint64_t n, uint8_t *out, struct zt_rpc_status *st)
{
    zt_rpc_stream_t *s = NULL;
    zt_err e = {{0}};
    if (zt_rpc_stream_start(c->srv[server].ch, SVC "PullParams", c->timeout_s, 0, &s, &e) != 0) {
        st->code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "%s", e.msg);
        return st->code;
    }
    Ztrain__V1__PullRange range = ZTRAIN__V1__PULL_RANGE__INIT;
    range.block = block;
    range.shard = shard;
    range.offset = offset;
    range.count = n;
    Ztrain__V1__PullRange *rp = &range;
    Ztrain__V1__PullParamsRequest req = ZTRAIN__V1__PULL_PARAMS_REQUEST__INIT;
    req.run = (char *)run;
    req.step = step;
    req.n_ranges = 1;
    req.ranges = &rp;
    size_t len;
    void *buf = pack(&req.base, &len);
    int ok = zt_rpc_stream_send(s, buf, len) == 0 && zt_rpc_stream_close_send(s) == 0;
    free(buf);
    uint64_t got = 0;
    const char *bad = NULL;
    while (ok) {
        const struct zt_rpc_part *parts;
        size_t nparts, dlen;
        if (zt_rpc_stream_recv_parts(s, &parts, &nparts, &dlen) != 1)
            break;
        struct param_view ch;
        int valid = parse_param_chunk(parts, nparts, dlen, &ch) == 0;
        enum zt_dtype dt = ch.dtype == ZTRAIN__V1__DTYPE__DTYPE_F16    ? ZT_DTYPE_F16
                           : ch.dtype == ZTRAIN__V1__DTYPE__DTYPE_BF16 ? ZT_DTYPE_BF16
                                                                       : ZT_DTYPE_F32;
        size_t es = zt_dtype_size(dt);
        size_t clen = ch.data.left;
        if (!valid || ch.block != block || ch.shard != shard || ch.offset < offset || clen % es != 0 ||
            ch.offset - offset > n || clen / es > n - (ch.offset - offset)) {
            bad = "a ParamChunk that is not valid protobuf or lies outside the requested range";
            break;
        }
        zt_wire_copy(ch.data, out + (ch.offset - offset) * es);
        got += clen / es;
    }
    int code = zt_rpc_stream_finish(s, st);
    if (code == ZT_RPC_OK && (bad != NULL || got != n)) {
        st->code = code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "%s", bad ? bad : "the stream ended before every element arrived");
    }
    return code;
}

int zt_state_client_pull(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                         uint64_t offset, uint64_t n, void *out, zt_err *err)
{
    if (c->core != NULL)
        return zt_server_core_pull(c->core, run, step, block, shard, offset, n, out,
                                   (int)(c->timeout_s * 1000.0), err);
    int server = owner_of(c, run, block, shard, err);
    if (server < 0)
        return server;
    struct zt_rpc_status st;
    int code;
    for (int attempt = 0;; attempt++) {
        code = pull_once(c, server, run, step, block, shard, offset, n, out, &st);
        if (!should_retry(c, server, code, attempt, &st))
            break;
    }
    return code == ZT_RPC_OK ? 0 : rpc_fail(c, server, "PullParams", &st, err);
}

/* ---- snapshots ---- */

int zt_state_client_save_snapshot(zt_state_client_t *c, const char *run, const char *embedded_root, zt_err *err)
{
    if (c->core != NULL) {
        if (embedded_root == NULL)
            return zt_fail(err, ZT_EINVAL_CONFIG, "an embedded state server needs a snapshot directory");
        return zt_server_core_snapshot_save(c->core, run, embedded_root, 0, NULL, 0, err);
    }
    Ztrain__V1__SaveSnapshotRequest req = ZTRAIN__V1__SAVE_SNAPSHOT_REQUEST__INIT;
    req.run = (char *)run;
    for (int i = 0; i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        if (unary(c, i, SVC "SaveSnapshot", &req.base, &resp, &len, &st) != ZT_RPC_OK)
            return rpc_fail(c, i, "SaveSnapshot", &st, err);
        free(resp);
    }
    return 0;
}
