/* bench_load: many training runs against one ztrain-server at once. CLIENTS threads each open their own
 * state client (own gRPC channel and connection), register a run of their own ("load-<i>": W = 1, two
 * blocks of NUMEL and 1000 parameters, weight decay on block 0, F32 pulls), push its initial parameters,
 * and then, all at the same time, run STEPS steps: push the gradients of both blocks, commit, pull both
 * blocks. After every step a client compares the pulled parameters with its own AdamW (kernels/adamw.h,
 * the math the server applies) on the same gradients, bit for bit. Once the CLIENTS runs are registered,
 * one more registration is made that, with the server's --max-memory sized for CLIENTS runs, must be
 * refused (RESOURCE_EXHAUSTED: the limit holds).
 *
 * Prints one line of key=value: clients, steps, commits (committed and checked), mismatches (steps whose
 * pulled parameters differed from the reference), errors (failed calls), extra_run (refused or accepted),
 * push_p50_ms, push_p99_ms, push_max_ms (one push of one block's gradient, 1 MiB chunks), step_p50_ms,
 * step_p99_ms (push both, commit, pull both), wall_s, and server_peak_rss_mib (VmHWM of SERVER_PID) with
 * server_run_ram_mib (the RAM the server accounts to the runs, from its Stats). Exits 1 when a step
 * mismatched or a call failed.
 *
 * usage: bench_load HOST:PORT CLIENTS STEPS [NUMEL] [SERVER_PID] */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/adamw.h"
#include "proto/rpc.h"
#include "worker/state/client.h"
#include "ztrain/v1/state.pb-c.h"

#define NBLOCKS 2
#define LR 1e-3f
#define BETA1 0.9f
#define BETA2 0.95f
#define EPS 1e-8f
#define WD 0.1f

static const char *g_target;
static int g_steps;
static uint64_t g_numel[NBLOCKS];

typedef struct client {
    int index;
    pthread_t thread;
    double *push_ms;  /* 2 per step */
    double *step_ms;  /* 1 per step */
    int commits;
    int mismatches;
    int errors;
    char error[ZT_ERR_LEN + 64];
} client;

static pthread_barrier_t g_registered;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A reproducible value for client c, block b, element i, step s (s = 0: the initial parameters). */
static float value(int c, int b, uint64_t i, int s)
{
    uint32_t x = (uint32_t)(c * 7919 + b * 104729 + s * 15485863) ^ (uint32_t)(i * 2654435761u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return ((float)(x & 0xffff) / 65536.0f - 0.5f) * (s == 0 ? 0.2f : 1.0f);
}

static void fail(client *cl, const char *what, const zt_err *err)
{
    cl->errors++;
    if (!cl->error[0])
        snprintf(cl->error, sizeof(cl->error), "client %d: %s: %s", cl->index, what, err->msg);
}

static void *run_client(void *arg)
{
    client *cl = arg;
    char run[32];
    snprintf(run, sizeof(run), "load-%03d", cl->index);
    struct zt_state_client_options opt = {.servers = g_target, .streams = 1, .timeout_s = 300};
    zt_state_client_t *sc = NULL;
    zt_err err = {{0}};
    float *p[NBLOCKS], *m[NBLOCKS], *v[NBLOCKS], *g[NBLOCKS], *got[NBLOCKS];
    for (int b = 0; b < NBLOCKS; b++) {
        p[b] = malloc(g_numel[b] * 4);
        m[b] = calloc(g_numel[b], 4);
        v[b] = calloc(g_numel[b], 4);
        g[b] = malloc(g_numel[b] * 4);
        got[b] = malloc(g_numel[b] * 4);
        for (uint64_t i = 0; i < g_numel[b]; i++)
            p[b][i] = value(cl->index, b, i, 0);
    }
    zt_server_range decay = {0, g_numel[0]};
    zt_server_block_desc blocks[NBLOCKS] = {{.numel = g_numel[0], .decay = &decay, .ndecay = 1},
                                            {.numel = g_numel[1]}};
    zt_server_run_desc desc = {.run_id = run, .world_size = 1, .nblocks = NBLOCKS, .blocks = blocks,
                               .beta1 = BETA1, .beta2 = BETA2, .eps = EPS, .weight_decay = WD,
                               .param_dtype = ZT_DTYPE_F32};
    int ok = zt_state_client_create(&opt, &sc, &err) == 0;
    if (!ok)
        fail(cl, "create", &err);
    if (ok && !(ok = zt_state_client_register(sc, &desc, NULL, &err) == 0))
        fail(cl, "register", &err);
    for (int b = 0; ok && b < NBLOCKS; b++)
        if (!(ok = zt_state_client_push_params(sc, run, b, 0, p[b], g_numel[b], &err) == 0))
            fail(cl, "push params", &err);
    pthread_barrier_wait(&g_registered); /* every run registered: the main thread tries one more */
    pthread_barrier_wait(&g_registered); /* then all clients start their steps together */
    for (int s = 1; ok && s <= g_steps; s++) {
        double t0 = now_s();
        for (int b = 0; ok && b < NBLOCKS; b++) {
            for (uint64_t i = 0; i < g_numel[b]; i++)
                g[b][i] = value(cl->index, b, i, s);
            double t = now_s();
            if (!(ok = zt_state_client_push_grad(sc, run, s, b, 0, ZT_DTYPE_F32, g[b], g_numel[b], &err) == 0))
                fail(cl, "push gradients", &err);
            cl->push_ms[2 * (s - 1) + b] = (now_s() - t) * 1e3;
        }
        zt_server_commit_args a = {.step = s, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = LR};
        if (ok && !(ok = zt_state_client_commit(sc, run, &a, &err) == 0))
            fail(cl, "commit", &err);
        for (int b = 0; ok && b < NBLOCKS; b++)
            if (!(ok = zt_state_client_pull(sc, run, s, b, 0, 0, g_numel[b], got[b], &err) == 0))
                fail(cl, "pull", &err);
        if (!ok)
            break;
        cl->step_ms[s - 1] = (now_s() - t0) * 1e3;
        int same = 1;
        for (int b = 0; b < NBLOCKS; b++) {
            zt_adamw_params hp = {.lr = LR, .beta1 = BETA1, .beta2 = BETA2, .eps = EPS,
                                  .weight_decay = b == 0 ? WD : 0.0f, .grad_scale = 1.0f, .step = s};
            zt_cpu_adamw_update(p[b], m[b], v[b], g[b], g_numel[b], &hp);
            same &= memcmp(p[b], got[b], g_numel[b] * 4) == 0;
        }
        cl->commits++;
        cl->mismatches += !same;
    }
    zt_state_client_destroy(sc);
    for (int b = 0; b < NBLOCKS; b++) {
        free(p[b]);
        free(m[b]);
        free(v[b]);
        free(g[b]);
        free(got[b]);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(const double *sorted, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return sorted[k < n ? k : n - 1];
}

/* VmHWM (peak resident memory) of a process in MiB, or -1. */
static double peak_rss_mib(long pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    double kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "VmHWM:", 6) == 0)
            kb = atof(line + 6);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb / 1024.0;
}

/* The RAM the server accounts to its runs (the sum of Stats' ram_bytes), in MiB, or -1. */
static double run_ram_mib(void)
{
    struct zt_rpc_channel_options o = {.target = g_target};
    zt_rpc_channel_t *ch = NULL;
    zt_err err;
    if (zt_rpc_channel_create(&o, &ch, &err) != 0)
        return -1;
    Ztrain__V1__StatsRequest req = ZTRAIN__V1__STATS_REQUEST__INIT;
    req.run = "";
    uint8_t buf[16];
    size_t n = ztrain__v1__stats_request__pack(&req, buf);
    void *resp = NULL;
    size_t len = 0;
    double mib = -1;
    if (zt_rpc_unary(ch, "/ztrain.v1.StateService/Stats", buf, n, 30.0, 0, &resp, &len, NULL) == ZT_RPC_OK) {
        Ztrain__V1__StatsResponse *r = ztrain__v1__stats_response__unpack(NULL, len, resp);
        if (r) {
            uint64_t total = 0;
            for (size_t i = 0; i < r->n_runs; i++)
                total += r->runs[i]->ram_bytes;
            mib = (double)total / (1 << 20);
            ztrain__v1__stats_response__free_unpacked(r, NULL);
        }
    }
    free(resp);
    zt_rpc_channel_destroy(ch);
    return mib;
}

/* Registers one run more than the limit was sized for; returns "refused" or "accepted". */
static const char *extra_run(void)
{
    struct zt_state_client_options opt = {.servers = g_target, .streams = 1, .max_retries = 1};
    zt_state_client_t *sc = NULL;
    zt_err err = {{0}};
    if (zt_state_client_create(&opt, &sc, &err) != 0)
        return "error";
    zt_server_block_desc blocks[NBLOCKS] = {{.numel = g_numel[0]}, {.numel = g_numel[1]}};
    zt_server_run_desc desc = {.run_id = "load-extra", .world_size = 1, .nblocks = NBLOCKS, .blocks = blocks,
                               .beta1 = BETA1, .beta2 = BETA2, .eps = EPS, .param_dtype = ZT_DTYPE_F32};
    int rc = zt_state_client_register(sc, &desc, NULL, &err);
    zt_state_client_destroy(sc);
    if (rc == 0)
        return "accepted";
    return strstr(err.msg, "--max-memory") ? "refused" : "error";
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_load HOST:PORT CLIENTS STEPS [NUMEL] [SERVER_PID]\n");
        return 2;
    }
    g_target = argv[1];
    int nclients = atoi(argv[2]);
    g_steps = atoi(argv[3]);
    g_numel[0] = argc > 4 ? strtoull(argv[4], NULL, 10) : 65536;
    g_numel[1] = 1000;
    long server_pid = argc > 5 ? atol(argv[5]) : 0;
    if (nclients < 1 || g_steps < 1 || g_numel[0] < 1) {
        fprintf(stderr, "bench_load: CLIENTS, STEPS and NUMEL must be positive\n");
        return 2;
    }
    client *cl = calloc((size_t)nclients, sizeof(*cl));
    pthread_barrier_init(&g_registered, NULL, (unsigned)nclients + 1);
    for (int i = 0; i < nclients; i++) {
        cl[i].index = i;
        cl[i].push_ms = calloc((size_t)g_steps * NBLOCKS, sizeof(double));
        cl[i].step_ms = calloc((size_t)g_steps, sizeof(double));
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 20);
        if (pthread_create(&cl[i].thread, &attr, run_client, &cl[i]) != 0) {
            fprintf(stderr, "bench_load: cannot start client thread %d\n", i);
            return 1;
        }
        pthread_attr_destroy(&attr);
    }
    pthread_barrier_wait(&g_registered);
    const char *extra = extra_run();
    double t0 = now_s();
    pthread_barrier_wait(&g_registered);
    for (int i = 0; i < nclients; i++)
        pthread_join(cl[i].thread, NULL);
    double wall = now_s() - t0;

    size_t npush = 0, nstep = 0;
    double *push = malloc((size_t)nclients * (size_t)g_steps * NBLOCKS * sizeof(double));
    double *step = malloc((size_t)nclients * (size_t)g_steps * sizeof(double));
    int commits = 0, mismatches = 0, errors = 0;
    for (int i = 0; i < nclients; i++) {
        for (int s = 0; s < cl[i].commits; s++) {
            push[npush++] = cl[i].push_ms[2 * s];
            push[npush++] = cl[i].push_ms[2 * s + 1];
            step[nstep++] = cl[i].step_ms[s];
        }
        commits += cl[i].commits;
        mismatches += cl[i].mismatches;
        errors += cl[i].errors;
        if (cl[i].error[0])
            fprintf(stderr, "bench_load: %s\n", cl[i].error);
    }
    qsort(push, npush, sizeof(double), cmp_double);
    qsort(step, nstep, sizeof(double), cmp_double);
    printf("load clients=%d steps=%d numel=%" PRIu64 " commits=%d mismatches=%d errors=%d extra_run=%s "
           "push_p50_ms=%.2f push_p99_ms=%.2f push_max_ms=%.2f step_p50_ms=%.2f step_p99_ms=%.2f wall_s=%.2f "
           "server_peak_rss_mib=%.1f server_run_ram_mib=%.1f\n",
           nclients, g_steps, g_numel[0] + g_numel[1], commits, mismatches, errors, extra, percentile(push, npush, 0.5),
           percentile(push, npush, 0.99), npush ? push[npush - 1] : 0.0, percentile(step, nstep, 0.5),
           percentile(step, nstep, 0.99), wall, server_pid ? peak_rss_mib(server_pid) : -1.0, run_ram_mib());
    for (int i = 0; i < nclients; i++) {
        free(cl[i].push_ms);
        free(cl[i].step_ms);
    }
    free(cl);
    free(push);
    free(step);
    int expected = nclients * g_steps;
    return commits == expected && mismatches == 0 && errors == 0 && strcmp(extra, "refused") == 0 ? 0 : 1;
}
