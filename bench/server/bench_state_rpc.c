/* bench_state_rpc: gRPC throughput of the state service through the worker's client: registers a run of
 * one block of MIB MiB of fp32 (W = 1) on a running ztrain-server, pushes the initial parameters, makes
 * one untimed gradient push and pull (the server's gradient buffer and both processes' heaps are touched
 * for the first time there, as in a trainer's first step), then times REPS gradient pushes (fp32, 1 MiB
 * chunks) and REPS pulls of the whole shard, checks that the pulls returned the pushed parameters, and prints
 * "grpc push_gib_s=P pull_gib_s=Q push_cpu_s_gib=A pull_cpu_s_gib=B mib=N reps=R". A and B are the CPU
 * seconds this client process (all its threads, gRPC's included) spent per GiB: on a shared machine they
 * move less with other processes' load than the throughput does, and they show the client's own copies.
 *
 * usage: bench_state_rpc HOST:PORT MIB REPS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/state/client.h"

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

static double cpu_now(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_state_rpc HOST:PORT MIB REPS\n");
        return 2;
    }
    uint64_t n = (uint64_t)atoll(argv[2]) << 18; /* fp32 elements in MIB MiB */
    int reps = atoi(argv[3]);
    struct zt_state_client_options opt = {.servers = argv[1], .timeout_s = 600.0};
    zt_state_client_t *c = NULL;
    zt_err err = {{0}};
    float *buf = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++)
        buf[i] = (float)(i % 1000) * 1e-3f;
    zt_server_block_desc block = {.numel = n};
    zt_server_run_desc desc = {.run_id = "bench", .world_size = 1, .nblocks = 1, .blocks = &block, .beta1 = 0.9f,
                               .beta2 = 0.95f, .eps = 1e-8f, .param_dtype = ZT_DTYPE_F32};
    int rc = zt_state_client_create(&opt, &c, &err);
    if (rc == 0)
        rc = zt_state_client_register(c, &desc, NULL, &err);
    if (rc == 0)
        rc = zt_state_client_push_params(c, "bench", 0, 0, buf, n, &err);
    if (rc == 0)
        rc = zt_state_client_push_grad(c, "bench", 1, 0, 0, ZT_DTYPE_F32, buf, n, &err);
    if (rc == 0)
        rc = zt_state_client_pull(c, "bench", 0, 0, 0, 0, n, buf, &err);
    double t0 = now(), c0 = cpu_now();
    for (int r = 0; rc == 0 && r < reps; r++)
        rc = zt_state_client_push_grad(c, "bench", 1, 0, 0, ZT_DTYPE_F32, buf, n, &err);
    double t1 = now(), c1 = cpu_now();
    memset(buf, 0xff, n * sizeof(float)); /* NaNs: a pull that leaves a gap is caught below */
    for (int r = 0; rc == 0 && r < reps; r++)
        rc = zt_state_client_pull(c, "bench", 0, 0, 0, 0, n, buf, &err);
    double t2 = now(), c2 = cpu_now();
    if (rc != 0) {
        fprintf(stderr, "bench_state_rpc: %s\n", err.msg);
        return 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (buf[i] != (float)(i % 1000) * 1e-3f) {
            fprintf(stderr, "bench_state_rpc: element %llu pulled back as %g, pushed as %g\n", (unsigned long long)i,
                    (double)buf[i], (double)((float)(i % 1000) * 1e-3f));
            return 1;
        }
    }
    double gib = (double)n * 4.0 * reps / (double)(1 << 30);
    printf("grpc push_gib_s=%.3f pull_gib_s=%.3f push_cpu_s_gib=%.3f pull_cpu_s_gib=%.3f mib=%s reps=%d\n",
           gib / (t1 - t0), gib / (t2 - t1), (c1 - c0) / gib, (c2 - c1) / gib, argv[2], reps);
    zt_state_client_destroy(c);
    free(buf);
    return 0;
}
