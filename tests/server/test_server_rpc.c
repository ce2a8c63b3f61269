/* Tests of the StateService over loopback gRPC (server/service + proto/rpc) with a C client: a full step
 * (register, push initial params, push gradients, commit, pull) gives the parameters an in-process core
 * computes from the same inputs, bit for bit; and every bad input of issue 5 (malformed protobuf, wrong
 * shard sizes, unknown run, stale step, oversize message, missing or wrong token) gets its gRPC status
 * while the server keeps serving and its state stays unchanged. Through a shared-memory segment (AttachShm):
 * the same step gives the same bits, and a client that lies about its segment (another nonce, offsets in the
 * head, past the end, wrapping around, misaligned, an unknown or detached segment) is refused without the
 * server reading or writing outside the segment or changing its state. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/shm.h"
#include "proto/rpc.h"
#include "server/core.h"
#include "server/service.h"
#include "ztrain/v1/state.pb-c.h"

#define M(name) "/ztrain.v1.StateService/" name
#define TOKEN "service-test-token"
#define WORLD 2
static const uint64_t NUMEL[2] = {10, 7};

struct fixture {
    zt_server_core *core;
    zt_service_t *svc;
    zt_rpc_server_t *srv;
    zt_rpc_channel_t *ch;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    zt_err err = {{0}};
    zt_server_core_options copt = {0};
    assert_int_equal(zt_server_core_create(&f->core, &copt, &err), 0);
    assert_int_equal(zt_service_create(f->core, NULL, &f->svc, &err), 0);
    struct zt_rpc_server_options ropt = {.listen_addr = "127.0.0.1:0", .token = TOKEN};
    assert_int_equal(zt_rpc_server_create(&ropt, &f->srv, &err), 0);
    assert_int_equal(zt_service_add_methods(f->svc, f->srv, &err), 0);
    assert_int_equal(zt_rpc_server_start(f->srv, &err), 0);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f->srv));
    struct zt_rpc_channel_options chopt = {.target = target, .token = TOKEN};
    assert_int_equal(zt_rpc_channel_create(&chopt, &f->ch, &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    zt_rpc_channel_destroy(f->ch);
    zt_rpc_server_destroy(f->srv, 5.0);
    zt_service_destroy(f->svc);
    zt_server_core_destroy(f->core);
    free(f);
    return 0;
}

static int call_packed(zt_rpc_channel_t *ch, const char *method, const ProtobufCMessage *msg, void **resp, size_t *len,
                       struct zt_rpc_status *st)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n + 1);
    protobuf_c_message_pack(msg, buf);
    int code = zt_rpc_unary(ch, method, buf, n, 10.0, 0, resp, len, st);
    free(buf);
    return code;
}

static int register_run(zt_rpc_channel_t *ch, const char *run, struct zt_rpc_status *st)
{
    Ztrain__V1__BlockLayout b[2], *bp[2];
    for (int i = 0; i < 2; i++) {
        ztrain__v1__block_layout__init(&b[i]);
        b[i].numel = NUMEL[i];
        bp[i] = &b[i];
    }
    Ztrain__V1__RegisterRunRequest req = ZTRAIN__V1__REGISTER_RUN_REQUEST__INIT;
    req.run = (char *)run;
    req.world_size = WORLD;
    req.n_blocks = 2;
    req.blocks = bp;
    req.beta1 = 0.9f;
    req.beta2 = 0.95f;
    req.eps = 1e-8f;
    req.param_dtype = ZTRAIN__V1__DTYPE__DTYPE_F32;
    void *resp = NULL;
    size_t len;
    int code = call_packed(ch, M("RegisterRun"), &req.base, &resp, &len, st);
    free(resp);
    return code;
}

/* Pushes total_bytes of data as a header and chunks of chunk_bytes. */
static int push(zt_rpc_channel_t *ch, const char *method, const char *run, int64_t step, int block, int shard,
                const void *data, size_t total_bytes, size_t chunk_bytes, struct zt_rpc_status *st)
{
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, method, 10.0, 0, &s, &err), 0);
    Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
    h.run = (char *)run;
    h.step = step;
    h.block = block;
    h.shard = shard;
    h.dtype = ZTRAIN__V1__DTYPE__DTYPE_F32;
    h.total_bytes = total_bytes;
    Ztrain__V1__PushMessage m = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
    m.header = &h;
    uint8_t *buf = malloc(total_bytes + 256);
    size_t n = ztrain__v1__push_message__pack(&m, buf);
    zt_rpc_stream_send(s, buf, n);
    for (size_t off = 0; off < total_bytes; off += chunk_bytes) {
        Ztrain__V1__PushChunk c = ZTRAIN__V1__PUSH_CHUNK__INIT;
        c.offset = off;
        c.data.data = (uint8_t *)data + off;
        c.data.len = total_bytes - off < chunk_bytes ? total_bytes - off : chunk_bytes;
        Ztrain__V1__PushMessage cm = ZTRAIN__V1__PUSH_MESSAGE__INIT;
        cm.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_CHUNK;
        cm.chunk = &c;
        n = ztrain__v1__push_message__pack(&cm, buf);
        if (zt_rpc_stream_send(s, buf, n) != 0)
            break;
    }
    free(buf);
    return zt_rpc_stream_finish(s, st);
}

static float init_value(int block, uint64_t i)
{
    return (float)block * 0.5f + (float)i * 0.01f - 0.03f;
}

static float grad_value(int block, uint64_t i)
{
    return (float)(i % 5) * 0.1f - 0.2f + (float)block * 0.05f;
}

/* Shard values of a block: element i of shard s is element s * shard_numel + i of the block, 0 in padding. */
static void shard_values(int block, int shard, float (*fn)(int, uint64_t), float *out)
{
    uint64_t sn = zt_server_shard_numel(NUMEL[block], WORLD);
    for (uint64_t i = 0; i < sn; i++) {
        uint64_t g = (uint64_t)shard * sn + i;
        out[i] = g < NUMEL[block] ? fn(block, g) : 0.0f;
    }
}

static int commit(zt_rpc_channel_t *ch, const char *run, int64_t step, struct zt_rpc_status *st)
{
    Ztrain__V1__CommitStepRequest req = ZTRAIN__V1__COMMIT_STEP_REQUEST__INIT;
    req.run = (char *)run;
    req.step = step;
    req.grad_norm = 1.0;
    req.clip_coef = 1.0f;
    req.lr = 1e-2f;
    void *resp = NULL;
    size_t len;
    int code = call_packed(ch, M("CommitStep"), &req.base, &resp, &len, st);
    free(resp);
    return code;
}

/* Registers run "r1" and pushes its initial parameters over gRPC, and does the same on `local` directly. */
static void prepare_run(struct fixture *f, zt_server_core *local)
{
    struct zt_rpc_status st;
    assert_int_equal(register_run(f->ch, "r1", &st), ZT_RPC_OK);
    zt_server_block_desc blocks[2] = {{.numel = NUMEL[0]}, {.numel = NUMEL[1]}};
    zt_server_run_desc desc = {.run_id = "r1", .world_size = WORLD, .nblocks = 2, .blocks = blocks, .beta1 = 0.9f,
                               .beta2 = 0.95f, .eps = 1e-8f, .param_dtype = ZT_DTYPE_F32};
    zt_err err = {{0}};
    if (local != NULL)
        assert_int_equal(zt_server_core_register(local, &desc, NULL, &err), 0);
    float vals[16];
    for (int b = 0; b < 2; b++) {
        for (int s = 0; s < WORLD; s++) {
            uint64_t sn = zt_server_shard_numel(NUMEL[b], WORLD);
            shard_values(b, s, init_value, vals);
            /* chunks of 3 elements: several chunks per shard */
            assert_int_equal(push(f->ch, M("PushParams"), "r1", 0, b, s, vals, sn * 4, 12, &st), ZT_RPC_OK);
            if (local != NULL) {
                zt_server_chunk c = {.block = b, .shard = s, .n = sn, .dtype = ZT_DTYPE_F32, .data = vals};
                assert_int_equal(zt_server_core_push_params(local, "r1", &c, &err), 0);
            }
        }
    }
}

static void push_grads(struct fixture *f, zt_server_core *local, int64_t step)
{
    struct zt_rpc_status st;
    zt_err err = {{0}};
    float vals[16];
    for (int b = 0; b < 2; b++) {
        for (int s = 0; s < WORLD; s++) {
            uint64_t sn = zt_server_shard_numel(NUMEL[b], WORLD);
            shard_values(b, s, grad_value, vals);
            assert_int_equal(push(f->ch, M("PushGradients"), "r1", step, b, s, vals, sn * 4, 8, &st), ZT_RPC_OK);
            zt_server_chunk c = {.block = b, .shard = s, .n = sn, .dtype = ZT_DTYPE_F32, .data = vals};
            assert_int_equal(zt_server_core_push_grad(local, "r1", step, &c, &err), 0);
        }
    }
}

static void test_steps_match_in_process_core(void **state)
{
    struct fixture *f = *state;
    zt_server_core *local;
    zt_err err = {{0}};
    zt_server_core_options copt = {0};
    assert_int_equal(zt_server_core_create(&local, &copt, &err), 0);
    prepare_run(f, local);
    struct zt_rpc_status st;
    for (int64_t step = 1; step <= 3; step++) {
        push_grads(f, local, step);
        assert_int_equal(commit(f->ch, "r1", step, &st), ZT_RPC_OK);
        zt_server_commit_args args = {.step = step, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
        assert_int_equal(zt_server_core_commit(local, "r1", &args, NULL, &err), 0);
    }
    /* A retried commit is answered as such. */
    assert_int_equal(commit(f->ch, "r1", 3, &st), ZT_RPC_OK);

    /* Pull every shard of step 3, block 0 first, and compare with the in-process core bit for bit. */
    Ztrain__V1__PullRange r[4], *rp[4];
    int k = 0;
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < WORLD; s++, k++) {
            ztrain__v1__pull_range__init(&r[k]);
            r[k].block = b;
            r[k].shard = s;
            r[k].count = zt_server_shard_numel(NUMEL[b], WORLD);
            rp[k] = &r[k];
        }
    Ztrain__V1__PullParamsRequest req = ZTRAIN__V1__PULL_PARAMS_REQUEST__INIT;
    req.run = "r1";
    req.step = 3;
    req.n_ranges = 4;
    req.ranges = rp;
    uint8_t buf[256];
    size_t n = ztrain__v1__pull_params_request__pack(&req, buf);
    zt_rpc_stream_t *s;
    assert_int_equal(zt_rpc_stream_start(f->ch, M("PullParams"), 10.0, 0, &s, &err), 0);
    assert_int_equal(zt_rpc_stream_send(s, buf, n), 0);
    assert_int_equal(zt_rpc_stream_close_send(s), 0);
    const void *data;
    size_t len;
    int chunks = 0, last_block = 0;
    while (zt_rpc_stream_recv(s, &data, &len) == 1) {
        Ztrain__V1__ParamChunk *c = ztrain__v1__param_chunk__unpack(NULL, len, data);
        assert_non_null(c);
        assert_true(c->block >= last_block);
        last_block = c->block;
        uint64_t sn = zt_server_shard_numel(NUMEL[c->block], WORLD);
        assert_int_equal(c->data.len, sn * 4);
        float want[16];
        float got[16];
        memcpy(got, c->data.data, c->data.len);
        assert_int_equal(zt_server_core_pull(local, "r1", 3, c->block, c->shard, 0, sn, want, 1000, &err), 0);
        assert_memory_equal(got, want, sn * 4);
        /* and the update really moved the parameters */
        float init[16];
        shard_values(c->block, c->shard, init_value, init);
        assert_memory_not_equal(got, init, sn * 4);
        ztrain__v1__param_chunk__free_unpacked(c, NULL);
        chunks++;
    }
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_OK);
    assert_int_equal(chunks, 4);
    zt_server_core_destroy(local);
}

/* Copies the committed master weights of every shard, to compare before and after a refused request. */
static void snapshot_master(zt_server_core *core, float *out)
{
    zt_err err = {{0}};
    int at = 0;
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < WORLD; s++) {
            assert_int_equal(zt_server_core_read_state(core, "r1", b, s, ZT_SERVER_MASTER, out + at, NULL, &err), 0);
            at += (int)zt_server_shard_numel(NUMEL[b], WORLD);
        }
}

/* A valid header for announced bytes, then one chunk of big bytes (over the server's message limit). */
static int push_oversize(zt_rpc_channel_t *ch, const char *run, int64_t step, const uint8_t *data, size_t big,
                         size_t announced, struct zt_rpc_status *st)
{
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, M("PushGradients"), 10.0, 0, &s, &err), 0);
    Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
    h.run = (char *)run;
    h.step = step;
    h.dtype = ZTRAIN__V1__DTYPE__DTYPE_F32;
    h.total_bytes = announced;
    Ztrain__V1__PushMessage m = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
    m.header = &h;
    uint8_t hb[256];
    size_t n = ztrain__v1__push_message__pack(&m, hb);
    assert_int_equal(zt_rpc_stream_send(s, hb, n), 0);
    zt_rpc_stream_send(s, data, big);
    return zt_rpc_stream_finish(s, st);
}

static void test_bad_input(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    zt_server_core *local;
    zt_server_core_options copt = {0};
    assert_int_equal(zt_server_core_create(&local, &copt, &err), 0);
    prepare_run(f, local);
    struct zt_rpc_status st;
    push_grads(f, local, 1);
    assert_int_equal(commit(f->ch, "r1", 1, &st), ZT_RPC_OK);
    zt_server_commit_args args = {.step = 1, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
    assert_int_equal(zt_server_core_commit(local, "r1", &args, NULL, &err), 0);
    float before[32], after[32];
    snapshot_master(f->core, before);
    zt_server_run_stats stats_before, stats_after;
    assert_int_equal(zt_server_core_stats(f->core, "r1", &stats_before, &err), 0);

    /* Malformed protobuf. */
    void *resp = NULL;
    size_t len;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12};
    assert_int_equal(zt_rpc_unary(f->ch, M("RegisterRun"), junk, sizeof(junk), 10.0, 0, &resp, &len, &st),
                     ZT_RPC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "not a valid protobuf"));
    assert_int_equal(zt_rpc_unary(f->ch, M("CommitStep"), junk, sizeof(junk), 10.0, 0, &resp, &len, &st),
                     ZT_RPC_INVALID_ARGUMENT);
    zt_rpc_stream_t *s;
    assert_int_equal(zt_rpc_stream_start(f->ch, M("PushGradients"), 10.0, 0, &s, &err), 0);
    zt_rpc_stream_send(s, junk, sizeof(junk));
    assert_int_equal(zt_rpc_stream_finish(s, &st), ZT_RPC_INVALID_ARGUMENT);

    /* Wrong shard sizes: one element more than the shard holds, and a push that ends early. */
    float g[16] = {0};
    uint64_t sn0 = zt_server_shard_numel(NUMEL[0], WORLD);
    assert_int_equal(push(f->ch, M("PushGradients"), "r1", 2, 0, 0, g, (sn0 + 1) * 4, 8, &st), ZT_RPC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "does not fit"));
    assert_int_equal(push(f->ch, M("PushGradients"), "r1", 2, 0, 0, g, 6, 6, &st), ZT_RPC_INVALID_ARGUMENT);

    /* Unknown run. */
    assert_int_equal(push(f->ch, M("PushGradients"), "nope", 1, 0, 0, g, 8, 8, &st), ZT_RPC_NOT_FOUND);
    assert_int_equal(commit(f->ch, "nope", 1, &st), ZT_RPC_NOT_FOUND);

    /* Stale step: step 1 is committed. */
    assert_int_equal(push(f->ch, M("PushGradients"), "r1", 1, 0, 0, g, sn0 * 4, 8, &st), ZT_RPC_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "already committed"));

    /* Oversize message: one chunk over the 4 MiB limit. */
    size_t big = (4u << 20) + 64;
    uint8_t *huge = calloc(1, big);
    assert_int_equal(push_oversize(f->ch, "r1", 2, huge, big, sn0 * 4, &st), ZT_RPC_RESOURCE_EXHAUSTED);
    free(huge);

    /* Missing and wrong token. */
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f->srv));
    const char *tokens[2] = {NULL, "not-the-token"};
    for (int i = 0; i < 2; i++) {
        struct zt_rpc_channel_options o = {.target = target, .token = tokens[i]};
        zt_rpc_channel_t *ch;
        assert_int_equal(zt_rpc_channel_create(&o, &ch, &err), 0);
        assert_int_equal(commit(ch, "r1", 2, &st), ZT_RPC_UNAUTHENTICATED);
        assert_int_equal(push(ch, M("PushGradients"), "r1", 2, 0, 0, g, sn0 * 4, 8, &st), ZT_RPC_UNAUTHENTICATED);
        zt_rpc_channel_destroy(ch);
    }

    /* Nothing changed, and the server still serves: the next step goes through. */
    snapshot_master(f->core, after);
    assert_memory_equal(before, after, sizeof(float) * (size_t)(2 * sn0 + 2 * zt_server_shard_numel(NUMEL[1], WORLD)));
    assert_int_equal(zt_server_core_stats(f->core, "r1", &stats_after, &err), 0);
    assert_int_equal(stats_after.step, 1);
    assert_int_equal(stats_after.commits, stats_before.commits);
    Ztrain__V1__StatsRequest sreq = ZTRAIN__V1__STATS_REQUEST__INIT;
    assert_int_equal(call_packed(f->ch, M("Stats"), &sreq.base, &resp, &len, &st), ZT_RPC_OK);
    Ztrain__V1__StatsResponse *sr = ztrain__v1__stats_response__unpack(NULL, len, resp);
    assert_non_null(sr);
    assert_int_equal(sr->n_runs, 1);
    assert_string_equal(sr->runs[0]->run, "r1");
    assert_int_equal(sr->runs[0]->step, 1);
    ztrain__v1__stats_response__free_unpacked(sr, NULL);
    free(resp);
    push_grads(f, local, 2);
    assert_int_equal(commit(f->ch, "r1", 2, &st), ZT_RPC_OK);
    zt_server_core_destroy(local);
}

/* A pull's own timeout_ms never outlasts the call's deadline: a pull of a step no commit will make, asking
 * to wait 2^31 - 1 ms, returns DEADLINE_EXCEEDED once its 0.2 s deadline passes (in process, so the
 * handler's own return is seen, not the client's). Before the fix the handler waited the 24 days it was
 * asked to, holding one of the server's threads whatever the client did. */
static void test_pull_wait_bounded_by_deadline(void **state)
{
    struct fixture *f = *state;
    prepare_run(f, NULL);
    Ztrain__V1__PullRange r = ZTRAIN__V1__PULL_RANGE__INIT;
    r.count = 1;
    Ztrain__V1__PullRange *rp = &r;
    Ztrain__V1__PullParamsRequest req = ZTRAIN__V1__PULL_PARAMS_REQUEST__INIT;
    req.run = "r1";
    req.step = 1; /* the next step: waits for a commit */
    req.n_ranges = 1;
    req.ranges = &rp;
    req.timeout_ms = INT32_MAX;
    uint8_t buf[128];
    struct zt_rpc_part part = {buf, ztrain__v1__pull_params_request__pack(&req, buf)};
    struct zt_rpc_local_msg msg = {&part, 1};
    struct zt_rpc_status st;
    assert_int_equal(zt_rpc_server_call_local(f->srv, M("PullParams"), &msg, 1, 0.2, NULL, NULL, &st),
                     ZT_RPC_DEADLINE_EXCEEDED);
}

static int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* --snapshot-commits 1: when the push that completes a run's initial parameters is answered, the snapshot
 * of step 0 is on disk, and when a commit is answered, the snapshot of its step; a server restored from
 * the folder is at the last answered commit. A commit retried after a restart finds its snapshot there. */
static void test_durable_commits(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_test_durable_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct fixture f = {0};
    zt_err err = {{0}};
    zt_server_core_options copt = {0};
    assert_int_equal(zt_server_core_create(&f.core, &copt, &err), 0);
    struct zt_service_options so = {.snapshot_dir = dir, .snapshot_keep = 2, .snapshot_commits = 1};
    assert_int_equal(zt_service_create(f.core, &so, &f.svc, &err), 0);
    struct zt_rpc_server_options ropt = {.listen_addr = "127.0.0.1:0"};
    assert_int_equal(zt_rpc_server_create(&ropt, &f.srv, &err), 0);
    assert_int_equal(zt_service_add_methods(f.svc, f.srv, &err), 0);
    assert_int_equal(zt_rpc_server_start(f.srv, &err), 0);
    char target[64], path[600];
    snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f.srv));
    struct zt_rpc_channel_options chopt = {.target = target};
    assert_int_equal(zt_rpc_channel_create(&chopt, &f.ch, &err), 0);

    struct zt_rpc_status st;
    assert_int_equal(register_run(f.ch, "r1", &st), ZT_RPC_OK);
    float vals[16];
    snprintf(path, sizeof(path), "%s/r1/server0of1/step_00000000", dir);
    for (int b = 0; b < 2; b++) {
        for (int s = 0; s < WORLD; s++) {
            assert_false(path_exists(path)); /* not before the last initial push */
            uint64_t sn = zt_server_shard_numel(NUMEL[b], WORLD);
            shard_values(b, s, init_value, vals);
            assert_int_equal(push(f.ch, M("PushParams"), "r1", 0, b, s, vals, sn * 4, 12, &st), ZT_RPC_OK);
        }
    }
    assert_true(path_exists(path));
    for (int b = 0; b < 2; b++) {
        for (int s = 0; s < WORLD; s++) {
            uint64_t sn = zt_server_shard_numel(NUMEL[b], WORLD);
            shard_values(b, s, grad_value, vals);
            assert_int_equal(push(f.ch, M("PushGradients"), "r1", 1, b, s, vals, sn * 4, 8, &st), ZT_RPC_OK);
        }
    }
    assert_int_equal(commit(f.ch, "r1", 1, &st), ZT_RPC_OK);
    snprintf(path, sizeof(path), "%s/r1/server0of1/step_00000001", dir);
    assert_true(path_exists(path));
    assert_int_equal(commit(f.ch, "r1", 1, &st), ZT_RPC_OK); /* a retry: already committed and saved */

    zt_server_core *back = NULL;
    assert_int_equal(zt_server_core_create(&back, &copt, &err), 0);
    int nruns = 0;
    assert_int_equal(zt_server_core_restore_all(back, dir, &nruns, &err), 0);
    zt_server_run_info info;
    assert_int_equal(zt_server_core_run_info(back, "r1", &info, &err), 0);
    assert_int_equal(info.step, 1);
    zt_server_core_destroy(back);
    zt_rpc_channel_destroy(f.ch);
    zt_rpc_server_destroy(f.srv, 5.0);
    zt_service_destroy(f.svc);
    zt_server_core_destroy(f.core);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}


/* AttachShm of seg (nonce as given); returns the response's segment id, 0 when refused (reason in why). */
static uint64_t attach(zt_rpc_channel_t *ch, const zt_shm_t *seg, const uint8_t *nonce, size_t nonce_len, int pid,
                       char *why, size_t cap)
{
    Ztrain__V1__AttachShmRequest req = ZTRAIN__V1__ATTACH_SHM_REQUEST__INIT;
    req.pid = pid;
    req.fd = zt_shm_fd(seg);
    req.size = zt_shm_size(seg);
    req.nonce.data = (uint8_t *)nonce;
    req.nonce.len = nonce_len;
    void *resp = NULL;
    size_t len;
    struct zt_rpc_status st;
    assert_int_equal(call_packed(ch, M("AttachShm"), &req.base, &resp, &len, &st), ZT_RPC_OK);
    Ztrain__V1__AttachShmResponse *r = ztrain__v1__attach_shm_response__unpack(NULL, len, resp);
    assert_non_null(r);
    uint64_t id = r->attached ? r->segment : 0;
    snprintf(why, cap, "%s", r->reason ? r->reason : "");
    ztrain__v1__attach_shm_response__free_unpacked(r, NULL);
    free(resp);
    return id;
}

/* A push through segment `id`: its header only, naming bytes [off, off + total) of the segment; with
 * extra_chunk also a chunk after it (which a shared-memory push must not have). */
static int push_shm(zt_rpc_channel_t *ch, const char *method, int64_t step, int block, int shard, uint64_t id,
                    uint64_t off, uint64_t total, int extra_chunk, struct zt_rpc_status *st)
{
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, method, 10.0, 0, &s, &err), 0);
    Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
    h.run = "r1";
    h.step = step;
    h.block = block;
    h.shard = shard;
    h.dtype = ZTRAIN__V1__DTYPE__DTYPE_F32;
    h.total_bytes = total;
    h.shm_segment = id;
    h.shm_offset = off;
    Ztrain__V1__PushMessage m = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
    m.header = &h;
    uint8_t buf[256];
    size_t n = ztrain__v1__push_message__pack(&m, buf);
    zt_rpc_stream_send(s, buf, n);
    if (extra_chunk) {
        float v[2] = {1, 2};
        Ztrain__V1__PushChunk c = ZTRAIN__V1__PUSH_CHUNK__INIT;
        c.data.data = (uint8_t *)v;
        c.data.len = sizeof(v);
        Ztrain__V1__PushMessage cm = ZTRAIN__V1__PUSH_MESSAGE__INIT;
        cm.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_CHUNK;
        cm.chunk = &c;
        n = ztrain__v1__push_message__pack(&cm, buf);
        zt_rpc_stream_send(s, buf, n);
    }
    zt_rpc_stream_close_send(s);
    return zt_rpc_stream_finish(s, st);
}

/* A pull of one range through segment `id` at byte off; *chunks receives the ParamChunks that came (none
 * should). */
static int pull_shm(zt_rpc_channel_t *ch, int64_t step, int block, int shard, uint64_t count, uint64_t id,
                    uint64_t off, int *chunks, struct zt_rpc_status *st)
{
    Ztrain__V1__PullRange r = ZTRAIN__V1__PULL_RANGE__INIT, *rp = &r;
    r.block = block;
    r.shard = shard;
    r.count = count;
    Ztrain__V1__PullParamsRequest req = ZTRAIN__V1__PULL_PARAMS_REQUEST__INIT;
    req.run = "r1";
    req.step = step;
    req.n_ranges = 1;
    req.ranges = &rp;
    req.shm_segment = id;
    req.shm_offset = off;
    uint8_t buf[256];
    size_t n = ztrain__v1__pull_params_request__pack(&req, buf);
    zt_rpc_stream_t *s;
    zt_err err;
    assert_int_equal(zt_rpc_stream_start(ch, M("PullParams"), 10.0, 0, &s, &err), 0);
    zt_rpc_stream_send(s, buf, n);
    zt_rpc_stream_close_send(s);
    const void *data;
    size_t len;
    *chunks = 0;
    while (zt_rpc_stream_recv(s, &data, &len) == 1)
        (*chunks)++;
    return zt_rpc_stream_finish(s, st);
}

static void test_shared_memory(void **state)
{
    struct fixture *f = *state;
    zt_server_core *local;
    zt_err err = {{0}};
    zt_server_core_options copt = {0};
    assert_int_equal(zt_server_core_create(&local, &copt, &err), 0);
    prepare_run(f, local);
    zt_shm_t *seg = NULL;
    assert_int_equal(zt_shm_create(2, 4096, &seg, &err), 0);
    const uint64_t size = zt_shm_size(seg);
    char why[600];
    /* refused: another nonce (what a server on another host reads), a nonce of another length, another pid */
    uint8_t other[ZT_SHM_NONCE_BYTES];
    memcpy(other, zt_shm_nonce(seg), sizeof(other));
    other[3] ^= 0x10;
    assert_int_equal(attach(f->ch, seg, other, sizeof(other), getpid(), why, sizeof(why)), 0);
    assert_non_null(strstr(why, "nonce"));
    assert_int_equal(attach(f->ch, seg, other, 3, getpid(), why, sizeof(why)), 0);
    assert_int_equal(attach(f->ch, seg, zt_shm_nonce(seg), ZT_SHM_NONCE_BYTES, 0x7ffffff0, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "cannot open"));
    const uint64_t id = attach(f->ch, seg, zt_shm_nonce(seg), ZT_SHM_NONCE_BYTES, getpid(), why, sizeof(why));
    assert_int_not_equal(id, 0);

    float before[32] = {0};
    snapshot_master(f->core, before);
    struct zt_rpc_status st;
    const uint64_t slot0 = zt_shm_slot_offset(seg, 0), slot1 = zt_shm_slot_offset(seg, 1);
    const uint64_t sn0 = zt_server_shard_numel(NUMEL[0], WORLD);
    /* lies: the head, past the end, wrapping around, misaligned, an unknown segment, chunks after the header */
    const uint64_t bad_off[] = {0, ZT_SHM_HEAD_BYTES - 4, size - 4, size, UINT64_MAX - 3, slot0 + 2};
    for (size_t i = 0; i < sizeof(bad_off) / sizeof(bad_off[0]); i++) {
        assert_int_equal(push_shm(f->ch, M("PushGradients"), 1, 0, 0, id, bad_off[i], sn0 * 4, 0, &st),
                         ZT_RPC_INVALID_ARGUMENT);
        assert_non_null(strstr(st.msg, "do not lie in its data"));
    }
    assert_int_equal(push_shm(f->ch, M("PushGradients"), 1, 0, 0, id + 1, slot0, sn0 * 4, 0, &st), ZT_RPC_ABORTED);
    assert_int_equal(push_shm(f->ch, M("PushGradients"), 1, 0, 0, 0x5a5a, slot0, sn0 * 4, 0, &st), ZT_RPC_ABORTED);
    int chunks;
    const uint64_t bad_pull[] = {0, size - 4, UINT64_MAX - 3, slot1 + 1};
    for (size_t i = 0; i < sizeof(bad_pull) / sizeof(bad_pull[0]); i++)
        assert_int_equal(pull_shm(f->ch, 0, 0, 0, sn0, id, bad_pull[i], &chunks, &st), ZT_RPC_INVALID_ARGUMENT);
    /* a count whose bytes overflow 64 bits, and one that runs past the end */
    assert_int_equal(pull_shm(f->ch, 0, 0, 0, UINT64_MAX / 2, id, slot0, &chunks, &st), ZT_RPC_INVALID_ARGUMENT);
    assert_int_equal(pull_shm(f->ch, 0, 0, 0, 4096, id, slot1, &chunks, &st), ZT_RPC_INVALID_ARGUMENT);
    float after[32] = {0};
    snapshot_master(f->core, after);
    assert_memory_equal(before, after, sizeof(before));

    /* the honest step: gradients written into slot 0 and pushed from there, then a pull into slot 1 gives the
     * parameters an in-process core computes from the same inputs, bit for bit */
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < WORLD; s++) {
            uint64_t sn = zt_server_shard_numel(NUMEL[b], WORLD);
            float vals[16];
            shard_values(b, s, grad_value, vals);
            memcpy(zt_shm_span(seg, slot0, sn * 4), vals, sn * 4);
            assert_int_equal(push_shm(f->ch, M("PushGradients"), 1, b, s, id, slot0, sn * 4, 1, &st),
                             ZT_RPC_INVALID_ARGUMENT); /* a chunk after the header */
            assert_int_equal(push_shm(f->ch, M("PushGradients"), 1, b, s, id, slot0, sn * 4, 0, &st), ZT_RPC_OK);
            zt_server_chunk c = {.block = b, .shard = s, .n = sn, .dtype = ZT_DTYPE_F32, .data = vals};
            assert_int_equal(zt_server_core_push_grad(local, "r1", 1, &c, &err), 0);
        }
    assert_int_equal(commit(f->ch, "r1", 1, &st), ZT_RPC_OK);
    zt_server_commit_args args = {.step = 1, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
    assert_int_equal(zt_server_core_commit(local, "r1", &args, NULL, &err), 0);
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < WORLD; s++) {
            uint64_t sn = zt_server_shard_numel(NUMEL[b], WORLD);
            memset(zt_shm_span(seg, slot1, 4096), 0xff, 4096);
            assert_int_equal(pull_shm(f->ch, 1, b, s, sn, id, slot1, &chunks, &st), ZT_RPC_OK);
            assert_int_equal(chunks, 0);
            float want[16];
            assert_int_equal(zt_server_core_pull(local, "r1", 1, b, s, 0, sn, want, 1000, &err), 0);
            assert_memory_equal(zt_shm_span(seg, slot1, sn * 4), want, sn * 4);
        }
    /* detached: named again, it is unknown */
    Ztrain__V1__DetachShmRequest dreq = ZTRAIN__V1__DETACH_SHM_REQUEST__INIT;
    dreq.segment = id;
    void *resp = NULL;
    size_t len;
    assert_int_equal(call_packed(f->ch, M("DetachShm"), &dreq.base, &resp, &len, &st), ZT_RPC_OK);
    free(resp);
    assert_int_equal(pull_shm(f->ch, 1, 0, 0, sn0, id, slot1, &chunks, &st), ZT_RPC_ABORTED);
    assert_non_null(strstr(st.msg, "attach it again"));
    zt_shm_destroy(seg);
    zt_server_core_destroy(local);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_steps_match_in_process_core, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pull_wait_bounded_by_deadline, setup, teardown),
        cmocka_unit_test(test_durable_commits),
        cmocka_unit_test_setup_teardown(test_shared_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
