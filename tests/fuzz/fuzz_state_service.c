/* libFuzzer harness: every request handler of ztrain.v1.StateService (server/service.c: protobuf-c
 * unpacking, the hand-parsed push chunks of proto/wire, validation, and the core behind them), called in
 * process through zt_rpc_server_call_local, so the bytes reach the same code a network client's would.
 *
 * Each input is a script of calls against a fresh server holding the run "fz" at step 1
 * (fuzz_server_run.h), with a snapshot folder:
 *   call    := method:u8 count:u8 message{count % 5}
 *   message := length:u16le cut:u8 bytes[length]
 * method % 11 picks RegisterRun, PushParams, PushGradients, CommitStep, PullParams, SaveSnapshot,
 * LoadSnapshot, Stats, Health/Check, AttachShm or DetachShm; a message is handed to the handler in two pieces split at
 * cut % (length + 1), as the network may split it. Calls have a 20 ms deadline, so a pull that waits for a
 * commit that never comes ends quickly. Before the script runs, the harness attaches a small shared-memory
 * segment of its own as segment 1 (zt__service_set_shm_ids), so that pushes and pulls naming segment 1 at any
 * offset reach the bounds checks and the copies in and out of it. */
#include "fuzz_common.h"

#include "fuzz_server_run.h"
#include "common/shm.h"
#include "proto/rpc.h"
#include "server/service.h"
#include "ztrain/v1/state.pb-c.h"

#define MAX_CALLS 12
#define MAX_MSGS 4
#define CALL_TIMEOUT_S 0.02

#define NMETHODS 11
static const char *const k_methods[NMETHODS] = {
    "/ztrain.v1.StateService/RegisterRun", "/ztrain.v1.StateService/PushParams",
    "/ztrain.v1.StateService/PushGradients", "/ztrain.v1.StateService/CommitStep",
    "/ztrain.v1.StateService/PullParams", "/ztrain.v1.StateService/SaveSnapshot",
    "/ztrain.v1.StateService/LoadSnapshot", "/ztrain.v1.StateService/Stats", "/grpc.health.v1.Health/Check",
    "/ztrain.v1.StateService/AttachShm", "/ztrain.v1.StateService/DetachShm",
};
enum { M_REGISTER, M_PUSH_PARAMS, M_PUSH_GRADS, M_COMMIT, M_PULL, M_SAVE, M_LOAD, M_STATS, M_HEALTH, M_ATTACH,
       M_DETACH };

/* The harness's segment (2 slots of 4 KiB), attached as segment 1 before every script. */
static zt_shm_t *g_shm;

static char g_snaps[512];

static void sink(const void *data, size_t len, void *user)
{
    (void)user;
    volatile uint8_t x = 0;
    (void)x;
    for (size_t i = 0; i < len; i++)
        x ^= ((const uint8_t *)data)[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zt_server_core_options o = fz_core_options();
    zt_server_core *core = NULL;
    zt_service_t *svc = NULL;
    zt_rpc_server_t *srv = NULL;
    zt_err err = {{0}};
    struct zt_service_options so = {.snapshot_dir = g_snaps, .snapshot_keep = 2};
    struct zt_rpc_server_options ro = {0};
    if (zt_server_core_create(&core, &o, &err) != 0 || zt_service_create(core, &so, &svc, &err) != 0 ||
        zt_rpc_server_create(&ro, &srv, &err) != 0 || zt_service_add_methods(svc, srv, &err) != 0) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
    fz_make_run(core, 1);
    zt__service_set_shm_ids(svc, 1);
    {
        Ztrain__V1__AttachShmRequest a = ZTRAIN__V1__ATTACH_SHM_REQUEST__INIT;
        a.pid = (int32_t)getpid();
        a.fd = zt_shm_fd(g_shm);
        a.size = zt_shm_size(g_shm);
        a.nonce.data = (uint8_t *)zt_shm_nonce(g_shm);
        a.nonce.len = ZT_SHM_NONCE_BYTES;
        uint8_t abuf[128];
        struct zt_rpc_part ap = {abuf, ztrain__v1__attach_shm_request__pack(&a, abuf)};
        struct zt_rpc_local_msg am = {&ap, 1};
        struct zt_rpc_status ast;
        if (zt_rpc_server_call_local(srv, k_methods[M_ATTACH], &am, 1, 1.0, sink, NULL, &ast) != ZT_RPC_OK) {
            fprintf(stderr, "fuzz: AttachShm failed: %s\n", ast.msg);
            abort();
        }
    }

    size_t at = 0;
    for (int call = 0; call < MAX_CALLS && at + 2 <= size; call++) {
        int method = data[at] % NMETHODS;
        int count = data[at + 1] % (MAX_MSGS + 1);
        at += 2;
        struct zt_rpc_part parts[MAX_MSGS][2];
        struct zt_rpc_local_msg msgs[MAX_MSGS];
        int n = 0;
        for (; n < count && at + 3 <= size; n++) {
            size_t len = (size_t)data[at] | (size_t)data[at + 1] << 8;
            size_t cut = data[at + 2];
            at += 3;
            if (len > size - at)
                len = size - at;
            cut %= len + 1;
            parts[n][0].data = data + at;
            parts[n][0].len = cut;
            parts[n][1].data = data + at + cut;
            parts[n][1].len = len - cut;
            msgs[n].parts = parts[n];
            msgs[n].nparts = 2;
            at += len;
        }
        struct zt_rpc_status st;
        int code = zt_rpc_server_call_local(srv, k_methods[method], msgs, (size_t)n, CALL_TIMEOUT_S, sink, NULL, &st);
        if (getenv("ZT_FUZZ_LOG"))
            fprintf(stderr, "fuzz: %s (%d messages) -> %s %s\n", k_methods[method], n, zt_rpc_code_name(code), st.msg);
    }
    /* Whatever the script did, the server still answers. */
    struct zt_rpc_part none = {"", 0};
    struct zt_rpc_local_msg stats = {&none, 1};
    struct zt_rpc_status st;
    if (zt_rpc_server_call_local(srv, k_methods[M_STATS], &stats, 1, 1.0, sink, NULL, &st) != ZT_RPC_OK) {
        fprintf(stderr, "fuzz: Stats failed after the script: %s\n", st.msg);
        abort();
    }
    zt_rpc_server_destroy(srv, 0);
    zt_service_destroy(svc);
    zt_server_core_destroy(core);
    fz_rm_tree(g_snaps);
    return 0;
}

/* ---- seeds: scripts of valid calls, packed with protobuf-c ---- */

static uint8_t g_seed[1 << 16];
static size_t g_seed_len;

static void seed_call(int method, int count)
{
    g_seed[g_seed_len++] = (uint8_t)method;
    g_seed[g_seed_len++] = (uint8_t)count;
}

static void seed_msg(const ProtobufCMessage *m, int cut)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    if (g_seed_len + 3 + n > sizeof(g_seed))
        abort();
    g_seed[g_seed_len++] = (uint8_t)(n & 0xff);
    g_seed[g_seed_len++] = (uint8_t)(n >> 8);
    g_seed[g_seed_len++] = (uint8_t)cut;
    protobuf_c_message_pack(m, g_seed + g_seed_len);
    g_seed_len += n;
}

/* One push of a whole (block, shard) of "fz" (or of run) as a header and one chunk. */
static void seed_push(const char *run, int method, int64_t step, int block, int shard, uint64_t n, float value)
{
    Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
    h.run = (char *)run;
    h.step = step;
    h.block = block;
    h.shard = shard;
    h.dtype = ZTRAIN__V1__DTYPE__DTYPE_F32;
    h.total_bytes = n * 4;
    Ztrain__V1__PushMessage m1 = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m1.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
    m1.header = &h;
    float v[16];
    for (uint64_t i = 0; i < n && i < 16; i++)
        v[i] = value * (float)(i + 1);
    Ztrain__V1__PushChunk c = ZTRAIN__V1__PUSH_CHUNK__INIT;
    c.offset = 0;
    c.data.data = (uint8_t *)v;
    c.data.len = n * 4;
    Ztrain__V1__PushMessage m2 = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m2.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_CHUNK;
    m2.chunk = &c;
    seed_call(method, 2);
    seed_msg(&m1.base, 3);
    seed_msg(&m2.base, 7);
}

static void seed_stats(void)
{
    Ztrain__V1__StatsRequest r = ZTRAIN__V1__STATS_REQUEST__INIT;
    r.run = "";
    seed_call(M_STATS, 1);
    seed_msg(&r.base, 0);
}

static void seed_done(const char *name)
{
    fz_write_seed(name, g_seed, g_seed_len);
    g_seed_len = 0;
}

static void write_seeds(void)
{
    /* A whole step: gradients of step 2 for every shard, commit, pull. */
    for (int b = 0; b < FZ_BLOCKS; b++)
        for (int s = 0; s < FZ_WORLD; s++)
            seed_push(FZ_RUN, M_PUSH_GRADS, 2, b, s, zt_server_shard_numel(fz_numel[b], FZ_WORLD), 0.01f);
    Ztrain__V1__CommitStepRequest c = ZTRAIN__V1__COMMIT_STEP_REQUEST__INIT;
    c.run = FZ_RUN;
    c.step = 2;
    c.grad_norm = 1.0;
    c.clip_coef = 1.0f;
    c.lr = 1e-3f;
    seed_call(M_COMMIT, 1);
    seed_msg(&c.base, 2);
    Ztrain__V1__PullRange r[FZ_BLOCKS * FZ_WORLD], *rp[FZ_BLOCKS * FZ_WORLD];
    for (int b = 0, k = 0; b < FZ_BLOCKS; b++)
        for (int s = 0; s < FZ_WORLD; s++, k++) {
            ztrain__v1__pull_range__init(&r[k]);
            r[k].block = b;
            r[k].shard = s;
            r[k].count = zt_server_shard_numel(fz_numel[b], FZ_WORLD);
            rp[k] = &r[k];
        }
    Ztrain__V1__PullParamsRequest p = ZTRAIN__V1__PULL_PARAMS_REQUEST__INIT;
    p.run = FZ_RUN;
    p.step = 2;
    p.n_ranges = FZ_BLOCKS * FZ_WORLD;
    p.ranges = rp;
    seed_call(M_PULL, 1);
    seed_msg(&p.base, 5);
    seed_stats();
    seed_done("step.bin");

    /* An overflowed step (no gradients needed), then a pull of it. */
    c.overflow = 1;
    seed_call(M_COMMIT, 1);
    seed_msg(&c.base, 0);
    seed_call(M_PULL, 1);
    seed_msg(&p.base, 0);
    seed_done("overflow.bin");

    /* A second run: register (3 ranks, one block of 7 with a decay range), its initial parameters. */
    Ztrain__V1__Range dr = ZTRAIN__V1__RANGE__INIT;
    dr.begin = 2;
    dr.end = 6;
    Ztrain__V1__Range *drp = &dr;
    Ztrain__V1__BlockLayout bl = ZTRAIN__V1__BLOCK_LAYOUT__INIT;
    bl.numel = 7;
    bl.n_decay = 1;
    bl.decay = &drp;
    Ztrain__V1__BlockLayout *blp = &bl;
    Ztrain__V1__RegisterRunRequest reg = ZTRAIN__V1__REGISTER_RUN_REQUEST__INIT;
    reg.run = "second";
    reg.world_size = 3;
    reg.n_blocks = 1;
    reg.blocks = &blp;
    reg.beta1 = 0.9f;
    reg.beta2 = 0.999f;
    reg.eps = 1e-8f;
    reg.weight_decay = 0.01f;
    reg.param_dtype = ZTRAIN__V1__DTYPE__DTYPE_BF16;
    seed_call(M_REGISTER, 1);
    seed_msg(&reg.base, 9);
    for (int s = 0; s < 3; s++)
        seed_push("second", M_PUSH_PARAMS, 0, 0, s, 3, 0.5f);
    seed_stats();
    seed_done("register.bin");

    /* Snapshots: save, load the latest, save again (the step exists already). */
    Ztrain__V1__SaveSnapshotRequest sv = ZTRAIN__V1__SAVE_SNAPSHOT_REQUEST__INIT;
    sv.run = FZ_RUN;
    sv.keep = 1;
    seed_call(M_SAVE, 1);
    seed_msg(&sv.base, 1);
    Ztrain__V1__LoadSnapshotRequest ld = ZTRAIN__V1__LOAD_SNAPSHOT_REQUEST__INIT;
    ld.run = FZ_RUN;
    seed_call(M_LOAD, 1);
    seed_msg(&ld.base, 1);
    seed_call(M_SAVE, 1);
    seed_msg(&sv.base, 0);
    seed_done("snapshot.bin");

    /* Through shared memory (segment 1, the harness's own): gradients from slot 0 at step 2, a commit, a pull
     * into slot 1; then a push at an offset past the segment's end and a detach. */
    for (int b = 0; b < FZ_BLOCKS; b++)
        for (int s = 0; s < FZ_WORLD; s++) {
            Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
            h.run = FZ_RUN;
            h.step = 2;
            h.block = b;
            h.shard = s;
            h.dtype = ZTRAIN__V1__DTYPE__DTYPE_F32;
            h.total_bytes = zt_server_shard_numel(fz_numel[b], FZ_WORLD) * 4;
            h.shm_segment = 1;
            h.shm_offset = ZT_SHM_HEAD_BYTES;
            Ztrain__V1__PushMessage m = ZTRAIN__V1__PUSH_MESSAGE__INIT;
            m.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
            m.header = &h;
            seed_call(M_PUSH_GRADS, 1);
            seed_msg(&m.base, 4);
        }
    c.overflow = 0;
    seed_call(M_COMMIT, 1);
    seed_msg(&c.base, 0);
    p.shm_segment = 1;
    p.shm_offset = ZT_SHM_HEAD_BYTES + 4096;
    seed_call(M_PULL, 1);
    seed_msg(&p.base, 3);
    p.shm_offset = ZT_SHM_HEAD_BYTES + 2 * 4096 - 4;
    seed_call(M_PULL, 1);
    seed_msg(&p.base, 1);
    Ztrain__V1__DetachShmRequest dt = ZTRAIN__V1__DETACH_SHM_REQUEST__INIT;
    dt.segment = 1;
    seed_call(M_DETACH, 1);
    seed_msg(&dt.base, 0);
    seed_call(M_PULL, 1);
    seed_msg(&p.base, 0);
    seed_done("shm.bin");

    /* Health. */
    seed_call(M_HEALTH, 1);
    g_seed[g_seed_len++] = 0;
    g_seed[g_seed_len++] = 0;
    g_seed[g_seed_len++] = 0;
    seed_done("health.bin");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    fz_path(g_snaps, sizeof(g_snaps), "snapshots");
    zt_err err = {{0}};
    if (zt_shm_create(2, 4096, &g_shm, &err) != 0) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
    return 0;
}
