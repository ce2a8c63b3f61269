/* bench_state_rpc: gRPC throughput of the state service through the worker's client: registers a run of
 * one block of MIB MiB of fp32 (W = 1) on a running ztrain-server, pushes the initial parameters, makes
 * one untimed gradient push and pull (the server's gradient buffer and both processes' heaps are touched
 * for the first time there, as in a trainer's first step), then times REPS gradient pushes (fp32, 1 MiB
 * chunks) and REPS pulls of the whole shard (the buffer is filled with NaNs before, outside the timing),
 * checks that the pulls returned the pushed parameters, and prints "grpc push_gib_s=P pull_gib_s=Q
 * push_cpu_s_gib=A pull_cpu_s_gib=B mib=N reps=R streams=K push_top=... (see below)". A and B are the CPU
 * seconds this client process (all its threads, gRPC's included) spent per GiB: on a shared machine they
 * move less with other processes' load than the throughput does, and they show the client's own copies.
 * K is the number of concurrent streams the client splits each push and pull into (the client's default,
 * from the core count, or ZT_STATE_STREAMS): the trainer's client is made the same way. push_faults_gib and
 * pull_faults_gib are the client's minor page faults per GiB moved (262144 would be every byte landing in
 * a fresh page: each fault costs a trap and the zeroing of 4 KiB).
 *
 * The push_top, pull_top, server_push_top and server_pull_top fields name, for the push and the pull,
 * the busiest thread of the client and of the server (given its pid; "none" otherwise) as F:NAME: the
 * fraction of the phase's wall time that thread was on a CPU (from /proc/PID/task/TID/schedstat), and
 * its name, with "/main" for the main thread (the one calling the client here). A thread near 1.0 is the
 * one that limits the transfer.
 *
 * TLS: ZT_BENCH_TLS_CA (the servers' CA, PEM) makes the client speak TLS; ZT_BENCH_TLS_CERT and
 * ZT_BENCH_TLS_KEY add a client certificate (mutual TLS), as ztrain train's --tls-ca/--tls-cert/--tls-key.
 *
 * usage: bench_state_rpc HOST:PORT MIB REPS [SERVER_PID] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

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

/* Minor page faults of this process so far (a fresh page touched: the kernel zeroes it first). */
static double minor_faults(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_minflt;
}

#define MAX_THREADS 512

/* On-CPU nanoseconds of every thread of one process at one moment. */
typedef struct thread_times {
    int count;
    long tid[MAX_THREADS];
    double ns[MAX_THREADS];
} thread_times;

/* Reads the on-CPU time of each thread of pid (0: this process); threads that cannot be read are left out. */
static void thread_times_read(pid_t pid, thread_times *t)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/task", pid ? (long)pid : (long)getpid());
    t->count = 0;
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && t->count < MAX_THREADS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char file[384];
        snprintf(file, sizeof(file), "%s/%s/schedstat", path, e->d_name);
        FILE *f = fopen(file, "r");
        double ns = 0;
        if (f && fscanf(f, "%lf", &ns) == 1) {
            t->tid[t->count] = atol(e->d_name);
            t->ns[t->count] = ns;
            t->count++;
        }
        if (f)
            fclose(f);
    }
    closedir(d);
}

/* Writes "F:NAME" for the thread of pid that spent the most CPU time between a and b, as a fraction of
 * wall seconds; "none" where /proc could not be read. */
static void busiest_thread(pid_t pid, const thread_times *a, const thread_times *b, double wall, char *out,
                           size_t len)
{
    double best = -1;
    long best_tid = 0;
    for (int i = 0; i < b->count; i++) {
        double before = 0; /* a thread started during the phase counts from zero */
        for (int j = 0; j < a->count; j++)
            if (a->tid[j] == b->tid[i])
                before = a->ns[j];
        if (b->ns[i] - before > best) {
            best = b->ns[i] - before;
            best_tid = b->tid[i];
        }
    }
    if (best < 0) {
        snprintf(out, len, "none");
        return;
    }
    char name[64] = "?", file[128];
    snprintf(file, sizeof(file), "/proc/%ld/task/%ld/comm", pid ? (long)pid : (long)getpid(), best_tid);
    FILE *f = fopen(file, "r");
    if (f) {
        if (fgets(name, sizeof(name), f))
            name[strcspn(name, "\n")] = 0;
        fclose(f);
    }
    for (char *p = name; *p; p++) /* one word, so that the line stays NAME=value fields */
        if (*p == ' ' || *p == '=')
            *p = '_';
    long main_tid = pid ? (long)pid : (long)getpid(); /* the main thread's id is the process id */
    snprintf(out, len, "%.2f:%s%s", best * 1e-9 / wall, name, best_tid == main_tid ? "/main" : "");
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: bench_state_rpc HOST:PORT MIB REPS [SERVER_PID]\n");
        return 2;
    }
    pid_t server = argc == 5 ? (pid_t)atol(argv[4]) : 0;
    static thread_times ct[4], st[4]; /* client and server threads: before and after the push, the pull */
    uint64_t n = (uint64_t)atoll(argv[2]) << 18; /* fp32 elements in MIB MiB */
    int reps = atoi(argv[3]);
    struct zt_state_client_options opt = {.servers = argv[1], .timeout_s = 600.0};
    opt.tls_ca_file = getenv("ZT_BENCH_TLS_CA");
    opt.tls_cert_file = getenv("ZT_BENCH_TLS_CERT");
    opt.tls_key_file = getenv("ZT_BENCH_TLS_KEY");
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
    thread_times_read(0, &ct[0]);
    if (server)
        thread_times_read(server, &st[0]);
    double t0 = now(), c0 = cpu_now(), f0 = minor_faults();
    for (int r = 0; rc == 0 && r < reps; r++)
        rc = zt_state_client_push_grad(c, "bench", 1, 0, 0, ZT_DTYPE_F32, buf, n, &err);
    double t1 = now(), c1 = cpu_now(), f1 = minor_faults();
    thread_times_read(0, &ct[1]);
    if (server)
        thread_times_read(server, &st[1]);
    memset(buf, 0xff, n * sizeof(float)); /* NaNs: a pull that leaves a gap is caught below */
    thread_times_read(0, &ct[2]);
    if (server)
        thread_times_read(server, &st[2]);
    double t1b = now(), c1b = cpu_now(), f1b = minor_faults(); /* the pull is timed from here, not the memset */
    for (int r = 0; rc == 0 && r < reps; r++)
        rc = zt_state_client_pull(c, "bench", 0, 0, 0, 0, n, buf, &err);
    double t2 = now(), c2 = cpu_now(), f2 = minor_faults();
    thread_times_read(0, &ct[3]);
    if (server)
        thread_times_read(server, &st[3]);
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
    char tops[4][96];
    busiest_thread(0, &ct[0], &ct[1], t1 - t0, tops[0], sizeof(tops[0]));
    busiest_thread(0, &ct[2], &ct[3], t2 - t1b, tops[1], sizeof(tops[1]));
    busiest_thread(server, &st[0], &st[1], t1 - t0, tops[2], sizeof(tops[2]));
    busiest_thread(server, &st[2], &st[3], t2 - t1b, tops[3], sizeof(tops[3]));
    printf("grpc push_gib_s=%.3f pull_gib_s=%.3f push_cpu_s_gib=%.3f pull_cpu_s_gib=%.3f mib=%s reps=%d streams=%d "
           "push_faults_gib=%.0f pull_faults_gib=%.0f push_top=%s pull_top=%s server_push_top=%s server_pull_top=%s\n",
           gib / (t1 - t0), gib / (t2 - t1b), (c1 - c0) / gib, (c2 - c1b) / gib, argv[2], reps,
           zt_state_client_streams(c), (f1 - f0) / gib, (f2 - f1b) / gib, tops[0], tops[1], server ? tops[2] : "none",
           server ? tops[3] : "none");
    zt_state_client_destroy(c);
    free(buf);
    return 0;
}
