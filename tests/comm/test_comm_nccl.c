/* GPU test of the NCCL backend of worker/comm (ctest label gpu; exits 77 where there is no GPU): one rank
 * (W = 1) through NCCL, with the unique id made as rank 0 makes it for the rendezvous, gives the same
 * results, bit for bit, as the shared-memory backend at W = 1 for all_reduce (sum, max), all_gather,
 * reduce_scatter and broadcast on known data in fp32 and int32 (and the known answer, the input, in bf16
 * and fp16, which shm does not carry), for a small count and one larger than the shm staging buffer;
 * and a barrier completes. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime.h>

#include "worker/comm/comm.h"

static zt_comm *nccl, *shm;
static cudaStream_t stream;

static int setup(void **state)
{
    (void)state;
    zt_err err = {{0}};
    zt_comm_options o;
    zt_comm_options_init(&o);
    snprintf(o.name, sizeof o.name, "nccl-test-%d", (int)getpid());
    if (zt_comm_create(&shm, &o, &err) < 0) {
        fprintf(stderr, "shm: %s\n", err.msg);
        return -1;
    }
    o.backend = ZT_COMM_NCCL;
    o.device = 0;
    if (zt_comm_nccl_unique_id(o.nccl_id, &err) < 0 || zt_comm_create(&nccl, &o, &err) < 0) {
        fprintf(stderr, "nccl: %s\n", err.msg);
        return -1;
    }
    return cudaStreamCreate(&stream) == cudaSuccess ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    zt_comm_destroy(nccl);
    zt_comm_destroy(shm);
    cudaStreamDestroy(stream);
    return 0;
}

/* Known data: element i of a buffer of `bytes` bytes, with a pattern that is a valid finite number in
 * every dtype used here (small integers, in fp32/bf16/fp16 bit patterns, and int32). */
static void fill(void *buf, size_t count, enum zt_comm_dtype dtype, int salt)
{
    for (size_t i = 0; i < count; i++) {
        int v = (int)((i * 37 + (size_t)salt * 11) % 201) - 100;
        switch (dtype) {
        case ZT_COMM_F32:
            ((float *)buf)[i] = (float)v * 0.25f;
            break;
        case ZT_COMM_I32:
            ((int32_t *)buf)[i] = v;
            break;
        case ZT_COMM_BF16: { /* bf16 = the top 16 bits of the fp32 value (exact for these) */
            float f = (float)v * 0.25f;
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
            break;
        }
        case ZT_COMM_F16: { /* v/4 in fp16: sign, exponent, 10-bit mantissa, built by hand */
            uint16_t h = 0;
            if (v != 0) {
                unsigned a = (unsigned)(v < 0 ? -v : v), e = 0;
                while ((a >> e) > 1)
                    e++;
                unsigned mant = (a << (10 - e)) & 0x3ffu;
                h = (uint16_t)((v < 0 ? 0x8000u : 0) | ((e - 2 + 15) << 10) | mant);
            }
            ((uint16_t *)buf)[i] = h;
            break;
        }
        default:
            fail_msg("unexpected dtype");
        }
    }
}

enum which { ALL_REDUCE_SUM, ALL_REDUCE_MAX, ALL_GATHER, REDUCE_SCATTER, BROADCAST };

/* Runs one collective on shm (host buffers) and on NCCL (device buffers) and compares the results. */
static void compare(enum which w, size_t count, enum zt_comm_dtype dtype)
{
    zt_err err = {{0}};
    size_t bytes = count * zt_comm_dtype_size(dtype);
    void *in = malloc(bytes), *ref = malloc(bytes), *got = malloc(bytes);
    assert_non_null(in);
    assert_non_null(ref);
    assert_non_null(got);
    fill(in, count, dtype, (int)w);
    void *din = NULL, *dout = NULL;
    assert_int_equal(cudaMalloc(&din, bytes), cudaSuccess);
    assert_int_equal(cudaMalloc(&dout, bytes), cudaSuccess);
    assert_int_equal(cudaMemcpy(din, in, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemset(dout, 0xff, bytes), cudaSuccess);
    memcpy(ref, in, bytes);
    /* shm moves and reduces fp32, fp64 and int32; for bf16 and fp16 the known answer (the input, at
     * W = 1) is the reference */
    zt_comm *host = (dtype == ZT_COMM_BF16 || dtype == ZT_COMM_F16) ? NULL : shm;
    int rs = 0, rn = 0;
    switch (w) {
    case ALL_REDUCE_SUM:
    case ALL_REDUCE_MAX: {
        enum zt_comm_op op = w == ALL_REDUCE_SUM ? ZT_COMM_SUM : ZT_COMM_MAX;
        rs = host ? zt_comm_all_reduce(host, in, ref, count, dtype, op, NULL, &err) : 0;
        rn = zt_comm_all_reduce(nccl, din, dout, count, dtype, op, stream, &err);
        break;
    }
    case ALL_GATHER:
        rs = host ? zt_comm_all_gather(host, in, ref, count, dtype, NULL, &err) : 0;
        rn = zt_comm_all_gather(nccl, din, dout, count, dtype, stream, &err);
        break;
    case REDUCE_SCATTER:
        rs = host ? zt_comm_reduce_scatter(host, in, ref, count, dtype, ZT_COMM_SUM, NULL, &err) : 0;
        rn = zt_comm_reduce_scatter(nccl, din, dout, count, dtype, ZT_COMM_SUM, stream, &err);
        break;
    case BROADCAST:
        rs = host ? zt_comm_broadcast(host, ref, count, dtype, 0, NULL, &err) : 0;
        rn = zt_comm_broadcast(nccl, din, count, dtype, 0, stream, &err);
        dout = din; /* in place */
        break;
    }
    if (rs < 0 || rn < 0)
        fail_msg("collective %d: %s", (int)w, err.msg);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, dout, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    /* at W = 1 every collective returns its input */
    assert_memory_equal(ref, in, bytes);
    assert_memory_equal(got, ref, bytes);
    cudaFree(din);
    if (dout != din)
        cudaFree(dout);
    free(in);
    free(ref);
    free(got);
}

static void test_matches_shm_at_w1(void **state)
{
    (void)state;
    const enum zt_comm_dtype dtypes[] = {ZT_COMM_F32, ZT_COMM_I32, ZT_COMM_BF16, ZT_COMM_F16};
    const size_t counts[] = {1001, (size_t)5 << 20}; /* the second is larger than the 4 MiB shm staging */
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t n = 0; n < 2; n++)
            for (int w = ALL_REDUCE_SUM; w <= BROADCAST; w++)
                compare((enum which)w, counts[n], dtypes[d]);
}

static void test_barrier(void **state)
{
    (void)state;
    zt_err err = {{0}};
    assert_int_equal(zt_comm_barrier(nccl, stream, &err), 0);
    assert_int_equal(zt_comm_rank(nccl), 0);
    assert_int_equal(zt_comm_world_size(nccl), 1);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_shm_at_w1),
        cmocka_unit_test(test_barrier),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
