/* Bus bandwidth of the collectives ZeRO-3 uses (all-gather, reduce-scatter, all-reduce) through ztrain's
 * communication layer (worker/comm/comm.h, NCCL backend), one process per GPU:
 *
 *   NCCL_NVLS_ENABLE=0 ztrain launch --nproc N -- bench_collectives [--dtype bf16|fp32] [--min-mib M]
 *                                                 [--max-mib M] [--iters K]
 *
 * Every rank joins through the rendezvous (worker/launch/startup.h), takes GPU LOCAL_RANK, and times each
 * collective with CUDA events on one stream: 5 warm-up calls, then K timed calls, per size. Sizes double
 * from --min-mib to --max-mib; a size is the bytes of the whole (gathered) buffer, as nccl-tests counts
 * them. Rank 0 prints one line per size and collective:
 *   algbw = size / time;  busbw = algbw * (W-1)/W for all-gather and reduce-scatter, * 2(W-1)/W for
 *   all-reduce (nccl-tests' convention: the bytes each link carries, comparable with the link's speed).
 * The slowest rank's time is the one reported (a MAX all-reduce of the per-rank times). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/status.h"
#include "worker/comm/comm.h"
#include "worker/launch/env.h"
#include "worker/launch/startup.h"

#define CHECK_CUDA(call)                                                                                     \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "bench_collectives: %s failed: %s\n", #call, cudaGetErrorString(e_));          \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

enum op { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"all_gather", "reduce_scatter", "all_reduce"};

/* One call of collective op on `count` elements per rank (count * W for the whole buffer). */
static int run_op(zt_comm *c, enum op op, void *full, void *part, size_t count, enum zt_comm_dtype dt, int rank,
                  size_t esize, cudaStream_t s, zt_err *err)
{
    const int W = zt_comm_world_size(c);
    switch (op) {
    case OP_ALL_GATHER:
        return zt_comm_all_gather(c, (char *)full + (size_t)rank * count * esize, full, count, dt, s, err);
    case OP_REDUCE_SCATTER:
        return zt_comm_reduce_scatter(c, full, part, count, dt, ZT_COMM_SUM, s, err);
    default:
        return zt_comm_all_reduce(c, full, full, count * (size_t)W, dt, ZT_COMM_SUM, s, err);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: ztrain launch --nproc N -- bench_collectives [--dtype bf16|fp32] [--min-mib M] "
                    "[--max-mib M] [--iters K]\n");
}

int main(int argc, char **argv)
{
    enum zt_comm_dtype dt = ZT_COMM_BF16;
    double min_mib = 1, max_mib = 1024;
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--dtype") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "bf16") == 0)
                dt = ZT_COMM_BF16;
            else if (strcmp(v, "fp32") == 0)
                dt = ZT_COMM_F32;
            else {
                fprintf(stderr, "bench_collectives: --dtype %s: use bf16 or fp32\n", v);
                return 2;
            }
        } else if (i + 1 < argc && strcmp(argv[i], "--min-mib") == 0) {
            min_mib = atof(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--max-mib") == 0) {
            max_mib = atof(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--iters") == 0) {
            iters = atoi(argv[++i]);
        } else {
            usage();
            return 2;
        }
    }
    if (!(min_mib > 0) || !(max_mib >= min_mib) || iters < 1) {
        fprintf(stderr, "bench_collectives: need 0 < --min-mib <= --max-mib and --iters >= 1\n");
        return 2;
    }

    zt_err err = {{0}};
    zt_launch_env env;
    if (zt_launch_env_parse(NULL, &env, &err) < 0) {
        fprintf(stderr, "bench_collectives: %s\n", err.msg);
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(env.local_rank));
    zt_comm *c = NULL;
    if (zt_startup_comm(&env, ZT_COMM_NCCL, 0, env.local_rank, &c, &err) < 0) {
        fprintf(stderr, "bench_collectives: rank %d: %s\n", env.rank, err.msg);
        return 1;
    }
    const int W = env.world_size, rank = env.rank;
    const size_t esize = zt_comm_dtype_size(dt);
    const size_t max_bytes = (size_t)(max_mib * 1048576.0);
    const size_t max_count = max_bytes / esize / (size_t)W + 1;
    void *full = NULL, *part = NULL;
    CHECK_CUDA(cudaMalloc(&full, max_count * (size_t)W * esize));
    CHECK_CUDA(cudaMalloc(&part, max_count * esize));
    CHECK_CUDA(cudaMemset(full, 0, max_count * (size_t)W * esize)); /* zeros: sums stay finite */
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    float *d_time = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_time, sizeof(float)));

    if (rank == 0)
        printf("collectives: %d ranks, %s, %d timed calls per size\n%-15s %10s %12s %12s %12s\n", W,
               dt == ZT_COMM_BF16 ? "bf16" : "fp32", iters, "collective", "size MiB", "time us", "algbw GB/s",
               "busbw GB/s");
    for (double mib = min_mib; mib <= max_mib * 1.0001; mib *= 2) {
        const size_t count = (size_t)(mib * 1048576.0) / esize / (size_t)W;
        if (count == 0)
            continue;
        const double bytes = (double)count * (double)W * (double)esize;
        for (int op = 0; op < OP_COUNT; op++) {
            int rc = 0;
            for (int k = 0; k < 5 && rc == 0; k++)
                rc = run_op(c, op, full, part, count, dt, rank, esize, s, &err);
            CHECK_CUDA(cudaEventRecord(t0, s));
            for (int k = 0; k < iters && rc == 0; k++)
                rc = run_op(c, op, full, part, count, dt, rank, esize, s, &err);
            CHECK_CUDA(cudaEventRecord(t1, s));
            if (rc < 0) {
                fprintf(stderr, "bench_collectives: rank %d: %s: %s\n", rank, op_names[op], err.msg);
                return 1;
            }
            CHECK_CUDA(cudaEventSynchronize(t1));
            float ms = 0.0f;
            CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
            /* The slowest rank's time. */
            CHECK_CUDA(cudaMemcpy(d_time, &ms, sizeof ms, cudaMemcpyHostToDevice));
            if (zt_comm_all_reduce(c, d_time, d_time, 1, ZT_COMM_F32, ZT_COMM_MAX, s, &err) < 0) {
                fprintf(stderr, "bench_collectives: rank %d: %s\n", rank, err.msg);
                return 1;
            }
            CHECK_CUDA(cudaStreamSynchronize(s));
            CHECK_CUDA(cudaMemcpy(&ms, d_time, sizeof ms, cudaMemcpyDeviceToHost));
            const double sec = (double)ms / 1e3 / iters;
            const double algbw = bytes / sec / 1e9;
            const double factor = op == OP_ALL_REDUCE ? 2.0 * (W - 1) / W : (double)(W - 1) / W;
            if (rank == 0)
                printf("%-15s %10.1f %12.1f %12.2f %12.2f\n", op_names[op], bytes / 1048576.0, sec * 1e6, algbw,
                       algbw * factor);
        }
    }
    fflush(stdout);
    cudaFree(full);
    cudaFree(part);
    cudaFree(d_time);
    zt_comm_destroy(c);
    return 0;
}
