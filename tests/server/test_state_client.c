/* The worker's state-service client (worker/state/client.h): what registration records, in embedded mode
 * and against one state service on loopback gRPC in this process. A run is routed by the client only
 * once the servers have accepted it, so a refused registration leaves the client as it was; a layout
 * that differs from the registered one is ZT_EMISMATCH either way; the client's run limit is checked
 * before anything is registered. A run that pulls bf16 parameters gets its masters rounded as the worker
 * would round them, and the fp32 masters of the committed step on request (and of no other step). Pushes and
 * pulls through shared memory give the bits of TCP and of embedded mode, with a shard larger than a slot;
 * the client falls back to TCP when the server refuses shared memory, when its nonce does not match (another
 * host) and when no segment can be made, and attaches again by itself to a server that restarted. Gradients
 * pushed from the client's shared host memory are read by the server where they lie, with the same bits. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "offload/cpu_adam.h"
#include "proto/rpc.h"
#include "server/core.h"
#include "server/service.h"
#include "worker/state/client.h"

static const zt_server_block_desc blocks[2] = {{.numel = 100}, {.numel = 37}};

static zt_server_run_desc desc_of(const char *run, int world_size)
{
    zt_server_run_desc d = {.run_id = run, .world_size = world_size, .nblocks = 2, .blocks = blocks,
                            .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .param_dtype = ZT_DTYPE_F32};
    return d;
}

/* A client, embedded or talking to a state service of its own on a loopback port. */
struct fixture {
    int remote;
    zt_server_core *core; /* the served core (remote), or the client's own (embedded) */
    zt_service_t *svc;
    zt_rpc_server_t *srv;
    zt_state_client_t *client;
};

static int setup(void **state, int remote)
{
    struct fixture *f = calloc(1, sizeof(*f));
    zt_err err = {{0}};
    struct zt_state_client_options opt = {.max_retries = 1, .backoff_s = 0.01};
    char target[64];
    f->remote = remote;
    if (remote) {
        zt_server_core_options copt = {0};
        assert_int_equal(zt_server_core_create(&f->core, &copt, &err), 0);
        assert_int_equal(zt_service_create(f->core, NULL, &f->svc, &err), 0);
        struct zt_rpc_server_options ropt = {.listen_addr = "127.0.0.1:0"};
        assert_int_equal(zt_rpc_server_create(&ropt, &f->srv, &err), 0);
        assert_int_equal(zt_service_add_methods(f->svc, f->srv, &err), 0);
        assert_int_equal(zt_rpc_server_start(f->srv, &err), 0);
        snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f->srv));
        opt.servers = target;
    }
    assert_int_equal(zt_state_client_create(&opt, &f->client, &err), 0);
    if (!remote)
        f->core = zt_state_client_embedded_core(f->client);
    *state = f;
    return 0;
}

static int setup_embedded(void **state)
{
    return setup(state, 0);
}

static int setup_remote(void **state)
{
    return setup(state, 1);
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    zt_state_client_destroy(f->client);
    if (f->remote) {
        zt_rpc_server_destroy(f->srv, 5.0);
        zt_service_destroy(f->svc);
        zt_server_core_destroy(f->core);
    }
    free(f);
    return 0;
}

/* A registration the servers refuse records nothing: pushes for that run are refused by the client
 * itself (remote) or by the core (embedded), and a correct registration afterwards works. */
static void test_refused_registration_records_nothing(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    zt_server_run_desc bad = desc_of("r", 0);
    assert_int_equal(zt_state_client_register(f->client, &bad, NULL, &err), ZT_EINVAL_CONFIG);

    float p[100] = {0};
    int rc = zt_state_client_push_params(f->client, "r", 0, 0, p, 100, &err);
    if (f->remote) {
        assert_int_equal(rc, ZT_ESTATE);
        assert_non_null(strstr(err.msg, "not registered through this client"));
    } else {
        assert_int_equal(rc, -ENOENT);
    }

    zt_server_run_desc good = desc_of("r", 1);
    assert_int_equal(zt_state_client_register(f->client, &good, NULL, &err), 0);
    assert_int_equal(zt_state_client_push_params(f->client, "r", 0, 0, p, 100, &err), 0);
}

/* Another layout under a registered run id is ZT_EMISMATCH, and the client keeps routing by the layout the
 * server holds: shard 1 of the W = 2 run is still accepted after the refused W = 1 registration. */
static void test_mismatched_registration_keeps_layout(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    zt_server_run_desc two = desc_of("r", 2), one = desc_of("r", 1);
    int64_t step = -1;
    assert_int_equal(zt_state_client_register(f->client, &two, &step, &err), 0);
    assert_int_equal(step, 0);
    assert_int_equal(zt_state_client_register(f->client, &one, NULL, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "world"));

    float p[50] = {0};
    assert_int_equal(zt_state_client_push_params(f->client, "r", 0, 1, p, 50, &err), 0);
    assert_int_equal(zt_state_client_push_params(f->client, "r", 1, 1, p, 19, &err), 0);
    zt_server_run_info info;
    assert_int_equal(zt_server_core_run_info(f->core, "r", &info, &err), 0);
    assert_int_equal(info.world_size, 2);
}

/* The client serves a fixed number of runs: the next one is refused before any server registers it, and
 * registering a run again does not take a new place. */
static void test_run_limit_checked_first(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    char run[32];
    int held = 0;
    for (;; held++) {
        snprintf(run, sizeof(run), "run-%d", held);
        zt_server_run_desc d = desc_of(run, 1);
        int rc = zt_state_client_register(f->client, &d, NULL, &err);
        if (rc != 0) {
            assert_int_equal(rc, ZT_ENOMEM);
            assert_non_null(strstr(err.msg, "at most"));
            break;
        }
        assert_int_equal(zt_state_client_register(f->client, &d, NULL, &err), 0); /* again: same place */
    }
    assert_int_equal(held, ZT_STATE_CLIENT_MAX_RUNS);
    zt_server_run_info info;
    assert_int_equal(zt_server_core_run_info(f->core, run, &info, &err), -ENOENT);
    snprintf(run, sizeof(run), "run-%d", held - 1);
    assert_int_equal(zt_server_core_run_info(f->core, run, &info, &err), 0);
}

/* Replaces the served state service by a fresh one on the same port: a server that was killed and came
 * back without a snapshot of the run. */
static void restart_server(struct fixture *f)
{
    int port = zt_rpc_server_port(f->srv);
    zt_rpc_server_destroy(f->srv, 5.0);
    zt_service_destroy(f->svc);
    zt_server_core_destroy(f->core);
    zt_err err = {{0}};
    zt_server_core_options copt = {0};
    assert_int_equal(zt_server_core_create(&f->core, &copt, &err), 0);
    assert_int_equal(zt_service_create(f->core, NULL, &f->svc, &err), 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    struct zt_rpc_server_options ropt = {.listen_addr = addr};
    assert_int_equal(zt_rpc_server_create(&ropt, &f->srv, &err), 0);
    assert_int_equal(zt_service_add_methods(f->svc, f->srv, &err), 0);
    assert_int_equal(zt_rpc_server_start(f->srv, &err), 0);
}

/* Step 1 of run "r" (W = 1) through the client, then the pulled parameters of both blocks. */
static void step_one(struct fixture *f, float *p0, float *p1)
{
    zt_err err = {{0}};
    float g0[100], g1[37];
    for (int i = 0; i < 100; i++)
        g0[i] = 0.01f * (float)(i % 7);
    for (int i = 0; i < 37; i++)
        g1[i] = -0.02f * (float)(i % 5);
    assert_int_equal(zt_state_client_push_grad(f->client, "r", 1, 0, 0, ZT_DTYPE_F32, g0, 100, &err), 0);
    assert_int_equal(zt_state_client_push_grad(f->client, "r", 1, 1, 0, ZT_DTYPE_F32, g1, 37, &err), 0);
    zt_server_commit_args a = {.step = 1, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
    if (zt_state_client_commit(f->client, "r", &a, &err) != 0)
        fail_msg("commit: %s", err.msg);
    assert_int_equal(zt_state_client_pull(f->client, "r", 1, 0, 0, 0, 100, p0, &err), 0);
    assert_int_equal(zt_state_client_pull(f->client, "r", 1, 1, 0, 0, 37, p1, &err), 0);
}

/* A server that restarts before a run has its first snapshot has lost the run: the client registers it
 * there again and pushes again the initial parameters it pushed before (it keeps copies until the run's
 * first step is taken), whether the restart comes between two initial pushes, before the first step, or
 * right after the registration.
 * Either way step 1 gives the parameters of a run without a restart, bit for bit. */
static void test_server_lost_run_before_first_step(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    /* A client that waits out a restart as the trainer's does (the fixture's retries only once). */
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f->srv));
    struct zt_state_client_options opt = {.servers = target, .max_retries = 8, .backoff_s = 0.05};
    zt_state_client_destroy(f->client);
    assert_int_equal(zt_state_client_create(&opt, &f->client, &err), 0);
    zt_server_run_desc d = desc_of("r", 1);
    float init0[100], init1[37], want0[100], want1[37], got0[100], got1[37];
    for (int i = 0; i < 100; i++)
        init0[i] = 0.5f - 0.01f * (float)i;
    for (int i = 0; i < 37; i++)
        init1[i] = 0.25f + 0.02f * (float)i;

    /* Without a restart. */
    assert_int_equal(zt_state_client_register(f->client, &d, NULL, &err), 0);
    assert_int_equal(zt_state_client_push_params(f->client, "r", 0, 0, init0, 100, &err), 0);
    assert_int_equal(zt_state_client_push_params(f->client, "r", 1, 0, init1, 37, &err), 0);
    step_one(f, want0, want1);

    for (int when = 0; when < 3; when++) {
        restart_server(f);
        if (zt_state_client_register(f->client, &d, NULL, &err) != 0)
            fail_msg("register after a restart: %s", err.msg);
        if (when == 2)
            restart_server(f); /* after the registration, before any initial push */
        if (zt_state_client_push_params(f->client, "r", 0, 0, init0, 100, &err) != 0)
            fail_msg("push: %s", err.msg);
        if (when == 0)
            restart_server(f); /* between the two initial pushes: the next one meets NOT_FOUND */
        assert_int_equal(zt_state_client_push_params(f->client, "r", 1, 0, init1, 37, &err), 0);
        if (when == 1)
            restart_server(f); /* after them, before the first step */
        step_one(f, got0, got1);
        assert_memory_equal(got0, want0, sizeof(want0));
        assert_memory_equal(got1, want1, sizeof(want1));
    }
}

/* A bf16 run (W = 1): after step 1 the pulled parameters are the server's fp32 masters rounded to bf16
 * (zt_cpu_adam_convert, the worker's rounding), bit for bit, and pull_masters gives those masters, also
 * for a block large enough to be split over several streams; masters of a step the run is not at are
 * refused with ZT_ESTATE. */
static void test_bf16_pulls_and_masters(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    if (f->remote) { /* pieces on 4 streams at once, whatever the cores */
        char target[64];
        snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f->srv));
        struct zt_state_client_options opt = {.servers = target, .max_retries = 1, .backoff_s = 0.01, .streams = 4};
        zt_state_client_destroy(f->client);
        assert_int_equal(zt_state_client_create(&opt, &f->client, &err), 0);
        assert_int_equal(zt_state_client_streams(f->client), 4);
    }
    enum { N0 = 1200001, N1 = 37 };
    const zt_server_block_desc big[2] = {{.numel = N0}, {.numel = N1}};
    zt_server_run_desc d = desc_of("lp", 1);
    d.blocks = big;
    d.param_dtype = ZT_DTYPE_BF16;
    assert_int_equal(zt_state_client_register(f->client, &d, NULL, &err), 0);
    const uint64_t n[2] = {N0, N1};
    for (int b = 0; b < 2; b++) {
        float *x = malloc(n[b] * sizeof(float)), *g = malloc(n[b] * sizeof(float));
        for (uint64_t i = 0; i < n[b]; i++) {
            x[i] = 0.3f - 1e-6f * (float)i + 0.1f * (float)b;
            g[i] = 0.01f * (float)((i * 7 + (uint64_t)b) % 13) - 0.06f;
        }
        assert_int_equal(zt_state_client_push_params(f->client, "lp", b, 0, x, n[b], &err), 0);
        assert_int_equal(zt_state_client_push_grad(f->client, "lp", 1, b, 0, ZT_DTYPE_F32, g, n[b], &err), 0);
        free(x);
        free(g);
    }
    zt_server_commit_args a = {.step = 1, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
    if (zt_state_client_commit(f->client, "lp", &a, &err) != 0)
        fail_msg("commit: %s", err.msg);
    for (int b = 0; b < 2; b++) {
        float *want = malloc(n[b] * sizeof(float)), *got = malloc(n[b] * sizeof(float));
        uint16_t *lp = malloc(n[b] * 2), *want_lp = malloc(n[b] * 2);
        assert_int_equal(zt_server_core_read_state(f->core, "lp", b, 0, ZT_SERVER_MASTER, want, NULL, &err), 0);
        assert_int_equal(zt_cpu_adam_convert(want_lp, ZT_DTYPE_BF16, want, n[b], 1, &err), 0);
        assert_int_equal(zt_state_client_pull(f->client, "lp", 1, b, 0, 0, n[b], lp, &err), 0);
        assert_memory_equal(lp, want_lp, n[b] * 2);
        memset(got, 0xff, n[b] * sizeof(float));
        if (zt_state_client_pull_masters(f->client, "lp", 1, b, 0, 0, n[b], got, &err) != 0)
            fail_msg("pull_masters: %s", err.msg);
        assert_memory_equal(got, want, n[b] * sizeof(float));
        /* a range inside the shard */
        assert_int_equal(zt_state_client_pull_masters(f->client, "lp", 1, b, 0, 5, 20, got, &err), 0);
        assert_memory_equal(got, want + 5, 20 * sizeof(float));
        free(want);
        free(got);
        free(lp);
        free(want_lp);
    }
    float one[4];
    assert_int_equal(zt_state_client_pull_masters(f->client, "lp", 2, 0, 0, 0, 4, one, &err), ZT_ESTATE);
    assert_int_equal(zt_state_client_pull_masters(f->client, "lp", 0, 1, 0, 0, 4, one, &err) != 0, 1);
}


/* Replaces the served state service (not the core) by a fresh one on the same port: a server restarted
 * from its snapshot, which knows no shared-memory segment. shm_off: the new one refuses shared memory. */
static void restart_service(struct fixture *f, int shm_off)
{
    int port = zt_rpc_server_port(f->srv);
    zt_rpc_server_destroy(f->srv, 5.0);
    zt_service_destroy(f->svc);
    zt_err err = {{0}};
    struct zt_service_options so = {.shm_off = shm_off};
    assert_int_equal(zt_service_create(f->core, &so, &f->svc, &err), 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    struct zt_rpc_server_options ropt = {.listen_addr = addr};
    assert_int_equal(zt_rpc_server_create(&ropt, &f->srv, &err), 0);
    assert_int_equal(zt_service_add_methods(f->svc, f->srv, &err), 0);
    assert_int_equal(zt_rpc_server_start(f->srv, &err), 0);
}

/* Block 0 is larger than a slot (ZT_STATE_CLIENT_SHM_SLOT_BYTES): its pieces take several slots. */
enum { SHM_N0 = (ZT_STATE_CLIENT_SHM_SLOT_BYTES / 4) * 5 / 4 + 3, SHM_N1 = 37 };

/* What shm_steps_from keeps in the client's shared host memory (zt_state_client_shared_alloc). */
enum { SHARED_GRAD = 1, SHARED_WEIGHTS = 2 };

/* Two steps of run "shm" (W = 1, fp32) through f->client; restart: the service restarts (core kept) after
 * step 1; shared: SHARED_GRAD, the gradients are pushed from the client's shared host memory; SHARED_WEIGHTS, the
 * parameters are pulled into it (zt_state_client_shared_alloc, which must give some). Returns both blocks'
 * parameters after step 2 (malloc'd, SHM_N0 + SHM_N1 floats). */
static float *shm_steps_from(struct fixture *f, int restart, int shared)
{
    zt_err err = {{0}};
    const zt_server_block_desc big[2] = {{.numel = SHM_N0}, {.numel = SHM_N1}};
    zt_server_run_desc d = desc_of("shm", 1);
    d.blocks = big;
    assert_int_equal(zt_state_client_register(f->client, &d, NULL, &err), 0);
    const uint64_t n[2] = {SHM_N0, SHM_N1};
    const size_t xbytes = (SHM_N0 + SHM_N1) * sizeof(float);
    float *x = shared & SHARED_WEIGHTS ? zt_state_client_shared_alloc(f->client, xbytes, ZT_STATE_SHARED_WEIGHTS, &err)
                                       : malloc(xbytes);
    float *g = shared & SHARED_GRAD
                   ? zt_state_client_shared_alloc(f->client, SHM_N0 * sizeof(float), ZT_STATE_SHARED_GRADIENT, &err)
                   : malloc(SHM_N0 * sizeof(float));
    assert_non_null(x);
    assert_non_null(g);
    for (int b = 0; b < 2; b++) {
        for (uint64_t i = 0; i < n[b]; i++)
            x[i] = 0.3f - 1e-7f * (float)i + 0.1f * (float)b;
        assert_int_equal(zt_state_client_push_params(f->client, "shm", b, 0, x, n[b], &err), 0);
    }
    for (int64_t step = 1; step <= 2; step++) {
        if (restart && step == 2)
            restart_service(f, 0);
        for (int b = 0; b < 2; b++) {
            for (uint64_t i = 0; i < n[b]; i++)
                g[i] = 0.01f * (float)((i * 7 + (uint64_t)(b + step)) % 13) - 0.06f;
            if (zt_state_client_push_grad(f->client, "shm", step, b, 0, ZT_DTYPE_F32, g, n[b], &err) != 0)
                fail_msg("push of step %d: %s", (int)step, err.msg);
        }
        zt_server_commit_args a = {.step = step, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
        if (zt_state_client_commit(f->client, "shm", &a, &err) != 0)
            fail_msg("commit: %s", err.msg);
        /* a pull that leaves a gap is caught, but weights in shared memory are the server's to write from the
         * pushes of a step until its pull returns (the commit may have written them already) */
        if (!(shared & SHARED_WEIGHTS))
            memset(x, 0xff, (SHM_N0 + SHM_N1) * sizeof(float));
        assert_int_equal(zt_state_client_pull(f->client, "shm", step, 0, 0, 0, SHM_N0, x, &err), 0);
        assert_int_equal(zt_state_client_pull(f->client, "shm", step, 1, 0, 0, SHM_N1, x + SHM_N0, &err), 0);
    }
    float m[SHM_N1];
    assert_int_equal(zt_state_client_pull_masters(f->client, "shm", 2, 1, 0, 0, SHM_N1, m, &err), 0);
    assert_memory_equal(m, x + SHM_N0, sizeof(m));
    if (!(shared & SHARED_GRAD))
        free(g); /* the shared memory is the client's */
    if (shared & SHARED_WEIGHTS) {
        float *copy = malloc(xbytes);
        memcpy(copy, x, xbytes);
        x = copy;
    }
    return x;
}

static float *shm_steps(struct fixture *f, int restart)
{
    return shm_steps_from(f, restart, 0);
}

/* A remote client of f's server with the given transport, streams and test fault. */
static void reconnect(struct fixture *f, enum zt_state_shm shm, int streams, enum zt__state_shm_fault fault)
{
    zt_err err = {{0}};
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", zt_rpc_server_port(f->srv));
    struct zt_state_client_options opt = {.servers = target, .max_retries = 8, .backoff_s = 0.02, .streams = streams,
                                          .shm = shm};
    zt_state_client_destroy(f->client);
    assert_int_equal(zt_state_client_create(&opt, &f->client, &err), 0);
    zt__state_client_set_shm_fault(f->client, fault);
}

/* Drops run "shm" from the served core, so that the next configuration registers it afresh. */
static void drop_run(struct fixture *f)
{
    zt_err err = {{0}};
    assert_int_equal(zt_server_core_drop(f->core, "shm", &err), 0);
}

static void test_shared_memory_transport(void **state)
{
    struct fixture *f = *state;
    char via[96];
    /* the reference: embedded mode */
    zt_err err = {{0}};
    struct zt_state_client_options eopt = {0};
    zt_state_client_t *saved = f->client;
    assert_int_equal(zt_state_client_create(&eopt, &f->client, &err), 0);
    float *want = shm_steps(f, 0);
    assert_string_equal(zt_state_client_transport(f->client, via, sizeof(via)), "embedded");
    zt_state_client_destroy(f->client);
    f->client = saved;
    const size_t bytes = (SHM_N0 + SHM_N1) * sizeof(float);

    /* shared memory, one stream (a piece over two slots) and three */
    const int streams[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        reconnect(f, ZT_STATE_SHM_AUTO, streams[i], ZT__STATE_SHM_FAULT_NONE);
        float *got = shm_steps(f, 0);
        assert_int_equal(zt__state_client_uses_shm(f->client, 0), 1);
        assert_string_equal(zt_state_client_transport(f->client, via, sizeof(via)), "shared memory");
        assert_memory_equal(got, want, bytes);
        free(got);
        drop_run(f);
    }
    /* TCP: turned off, a nonce that does not match, a segment that cannot be made, a server that refuses */
    const enum zt__state_shm_fault faults[3] = {ZT__STATE_SHM_FAULT_NONE, ZT__STATE_SHM_FAULT_NONCE,
                                                ZT__STATE_SHM_FAULT_CREATE};
    for (int i = 0; i < 4; i++) {
        if (i == 3)
            restart_service(f, 1);
        reconnect(f, i == 0 ? ZT_STATE_SHM_OFF : ZT_STATE_SHM_AUTO, 2, i < 3 ? faults[i] : ZT__STATE_SHM_FAULT_NONE);
        float *got = shm_steps(f, 0);
        assert_int_equal(zt__state_client_uses_shm(f->client, 0), 0);
        assert_string_equal(zt_state_client_transport(f->client, via, sizeof(via)), "TCP");
        assert_memory_equal(got, want, bytes);
        free(got);
        drop_run(f);
    }
    /* a server restarted between two steps knows no segment: the client attaches again by itself */
    restart_service(f, 0);
    reconnect(f, ZT_STATE_SHM_AUTO, 2, ZT__STATE_SHM_FAULT_NONE);
    float *got = shm_steps(f, 1);
    assert_int_equal(zt__state_client_uses_shm(f->client, 0), 1);
    assert_memory_equal(got, want, bytes);
    free(got);
    free(want);
}

/* The pulled bytes this client copied itself (zt_state_client_pull_copies). */
static uint64_t pull_copied(struct fixture *f)
{
    uint64_t bytes;
    double seconds;
    zt_state_client_pull_copies(f->client, &bytes, &seconds);
    assert_true(seconds >= 0.0);
    return bytes;
}

/* The reference: shm_steps through an embedded client (in place of f's for the call), which has no shared
 * memory of either kind to give and copies no pulled byte itself. */
static float *embedded_steps(struct fixture *f, enum zt_state_shared what)
{
    zt_err err = {{0}};
    struct zt_state_client_options eopt = {0};
    zt_state_client_t *saved = f->client;
    assert_int_equal(zt_state_client_create(&eopt, &f->client, &err), 0);
    assert_null(zt_state_client_shared_alloc(f->client, 4096, what, &err));
    float *want = shm_steps(f, 0);
    assert_int_equal(pull_copied(f), 0);
    zt_state_client_destroy(f->client);
    f->client = saved;
    return want;
}

/* The parameter bytes the served core's commits wrote straight into the places of standing pulls of run "shm". */
static uint64_t delivered(struct fixture *f)
{
    zt_err err = {{0}};
    zt_server_run_stats st;
    assert_int_equal(zt_server_core_stats(f->core, "shm", &st, &err), 0);
    return st.bytes_delivered;
}

/* What one run of shm_steps_from must count; -1 leaves a field unchecked. */
struct counts {
    int uses_shm;              /* the server is reached through shared memory */
    int64_t in_place;          /* push bytes read where they lie */
    int64_t pulled_in_place;   /* pull bytes written where they land */
    int64_t copied;            /* pulled bytes the client copied */
    int64_t delivered;         /* pulled bytes the server's commits wrote */
};

/* Runs shm_steps_from(f, restart, shared), checks the parameters against want (the embedded reference) and the
 * counts against *want_counts, and drops the run. */
static void steps_count(struct fixture *f, int restart, int shared, const float *want, struct counts want_counts)
{
    float *got = shm_steps_from(f, restart, shared);
    const struct counts *w = &want_counts;
    if (w->uses_shm >= 0)
        assert_int_equal(zt__state_client_uses_shm(f->client, 0), w->uses_shm);
    if (w->in_place >= 0)
        assert_int_equal(zt__state_client_bytes_in_place(f->client), w->in_place);
    if (w->pulled_in_place >= 0)
        assert_int_equal(zt__state_client_bytes_pulled_in_place(f->client), w->pulled_in_place);
    if (w->copied >= 0)
        assert_int_equal(pull_copied(f), w->copied);
    if (w->delivered >= 0)
        assert_int_equal(delivered(f), w->delivered);
    assert_memory_equal(got, want, (SHM_N0 + SHM_N1) * sizeof(float));
    free(got);
    drop_run(f);
}

/* Gradients pushed from the client's shared host memory: the server reads them where they lie (every pushed
 * byte counted as read in place, none copied into a slot), and the parameters are the bits of embedded mode,
 * with one and three streams (pieces over two slots' worth of bytes), and after a restart of the service,
 * which knows no segment (the memory is offered again by itself). A server that refuses shared memory is
 * pushed to over TCP from the same memory; embedded mode and a client with shared memory off have none. */
static void test_shared_gradient_memory(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    float *want = embedded_steps(f, ZT_STATE_SHARED_GRADIENT);
    const int64_t pushed = 2 * (int64_t)((SHM_N0 + SHM_N1) * sizeof(float)); /* two steps of both blocks */
    const int streams[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        reconnect(f, ZT_STATE_SHM_AUTO, streams[i], ZT__STATE_SHM_FAULT_NONE);
        steps_count(f, 0, SHARED_GRAD, want, (struct counts){1, pushed, 0, -1, -1});
    }
    /* the service restarts after step 1: step 2's pushes meet an unknown segment, offer the memory again */
    reconnect(f, ZT_STATE_SHM_AUTO, 2, ZT__STATE_SHM_FAULT_NONE);
    steps_count(f, 1, SHARED_GRAD, want, (struct counts){-1, pushed, -1, -1, -1});
    /* a server that refuses shared memory: TCP from the same memory */
    restart_service(f, 1);
    reconnect(f, ZT_STATE_SHM_AUTO, 2, ZT__STATE_SHM_FAULT_NONE);
    steps_count(f, 0, SHARED_GRAD, want, (struct counts){0, 0, -1, -1, -1});
    /* shared memory off: none to give */
    reconnect(f, ZT_STATE_SHM_OFF, 2, ZT__STATE_SHM_FAULT_NONE);
    assert_null(zt_state_client_shared_alloc(f->client, 4096, ZT_STATE_SHARED_GRADIENT, &err));
    free(want);
}

/* Parameters pulled into the client's shared host memory: the server writes them straight there (every pulled
 * byte counted as written in place, none copied by the client), and they are the bits of embedded mode, with one
 * and three streams (a shard over two slots' worth of bytes), with the gradients in shared memory too or not, and
 * after a restart of the service, which knows no segment (the memory is offered again by itself). The pulls stand
 * there: step 1's pull is a copy by the server, step 2's commit writes both blocks straight into the memory and
 * step 2's pull copies nothing (after the restart, step 2's pull is a copy again). The fallbacks give the same
 * bits with the client copying every pulled byte: all pieces of shared memory given already (through the slots),
 * a server that refuses shared memory (TCP into the same memory), a client with shared memory off and embedded
 * mode (no shared memory to give). The fp32 masters pulled at the end into private memory are copied through a
 * slot; the initial parameters are pushed from the weights' memory, read in place too. */
static void test_shared_weight_memory(void **state)
{
    struct fixture *f = *state;
    zt_err err = {{0}};
    float *want = embedded_steps(f, ZT_STATE_SHARED_WEIGHTS);
    const int64_t bytes = (int64_t)((SHM_N0 + SHM_N1) * sizeof(float));
    const int64_t pulled = 2 * bytes, masters = SHM_N1 * sizeof(float); /* two steps of both blocks; the masters */
    const int streams[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        reconnect(f, ZT_STATE_SHM_AUTO, streams[i], ZT__STATE_SHM_FAULT_NONE);
        steps_count(f, 0, SHARED_WEIGHTS, want, (struct counts){1, bytes, pulled, masters, bytes});
        reconnect(f, ZT_STATE_SHM_AUTO, streams[i], ZT__STATE_SHM_FAULT_NONE);
        steps_count(f, 0, SHARED_WEIGHTS | SHARED_GRAD, want, (struct counts){1, bytes + pulled, pulled, masters, bytes});
    }
    /* the service restarts after step 1: step 2's pulls meet an unknown segment, offer the memory again */
    reconnect(f, ZT_STATE_SHM_AUTO, 2, ZT__STATE_SHM_FAULT_NONE);
    steps_count(f, 1, SHARED_WEIGHTS | SHARED_GRAD, want, (struct counts){-1, -1, pulled, masters, 0});
    /* the shared memory cannot be given beyond ZT_STATE_CLIENT_MAX_SHARED pieces; the pulls go through the slots */
    reconnect(f, ZT_STATE_SHM_AUTO, 2, ZT__STATE_SHM_FAULT_NONE);
    for (int i = 0; i < ZT_STATE_CLIENT_MAX_SHARED; i++)
        assert_non_null(zt_state_client_shared_alloc(f->client, 4096, ZT_STATE_SHARED_GRADIENT, &err));
    assert_null(zt_state_client_shared_alloc(f->client, 4096, ZT_STATE_SHARED_WEIGHTS, &err));
    steps_count(f, 0, 0, want, (struct counts){1, -1, 0, pulled + masters, 0});
    /* a server that refuses shared memory: TCP into the same memory, copied out of the messages */
    restart_service(f, 1);
    reconnect(f, ZT_STATE_SHM_AUTO, 2, ZT__STATE_SHM_FAULT_NONE);
    steps_count(f, 0, SHARED_WEIGHTS, want, (struct counts){0, -1, 0, pulled + masters, 0});
    /* shared memory off: none to give */
    reconnect(f, ZT_STATE_SHM_OFF, 2, ZT__STATE_SHM_FAULT_NONE);
    assert_null(zt_state_client_shared_alloc(f->client, 4096, ZT_STATE_SHARED_WEIGHTS, &err));
    free(want);
}

#define BOTH(fn) cmocka_unit_test_setup_teardown(fn, setup_embedded, teardown), \
                 cmocka_unit_test_setup_teardown(fn, setup_remote, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(test_refused_registration_records_nothing),
        BOTH(test_mismatched_registration_keeps_layout),
        BOTH(test_run_limit_checked_first),
        BOTH(test_bf16_pulls_and_masters),
        cmocka_unit_test_setup_teardown(test_server_lost_run_before_first_step, setup_remote, teardown),
        cmocka_unit_test_setup_teardown(test_shared_memory_transport, setup_remote, teardown),
        cmocka_unit_test_setup_teardown(test_shared_gradient_memory, setup_remote, teardown),
        cmocka_unit_test_setup_teardown(test_shared_weight_memory, setup_remote, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
