/* GPU test of offload/pinned.h (ctest label gpu; exit 77, skipped, without a CUDA device): a pool that
 * requires pinning gets page-locked host memory (as CUDA reports it), and asynchronous copies host ->
 * device -> host through two of its buffers on one stream bring every byte back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "offload/pinned.h"

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                     \
    } while (0)

static void test_pinned_round_trip(void **state)
{
    (void)state;
    enum { BYTES = 3 << 20 };
    zt_pinned_pool_t *pool = NULL;
    zt_err err = {{0}};
    if (zt_pinned_pool_create(BYTES, 2, ZT_PINNED_FLAG_REQUIRE, &pool, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(zt_pinned_pool_is_pinned(pool), 1);
    void *src = NULL, *dst = NULL;
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &src, &err), 0);
    assert_int_equal(zt_pinned_pool_acquire(pool, 0, &dst, &err), 0);
    struct cudaPointerAttributes attr;
    CUDA_OK(cudaPointerGetAttributes(&attr, src));
    assert_int_equal(attr.type, cudaMemoryTypeHost);

    uint32_t *s = src;
    for (size_t i = 0; i < BYTES / 4; i++)
        s[i] = (uint32_t)(i * 2654435761u);
    memset(dst, 0, BYTES);
    void *dev = NULL;
    cudaStream_t stream;
    CUDA_OK(cudaMalloc(&dev, BYTES));
    CUDA_OK(cudaStreamCreate(&stream));
    CUDA_OK(cudaMemcpyAsync(dev, src, BYTES, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(dst, dev, BYTES, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    assert_memory_equal(dst, src, BYTES);
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFree(dev));
    zt_pinned_pool_release(pool, src);
    zt_pinned_pool_release(pool, dst);
    zt_pinned_pool_destroy(pool);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: the pinned staging test is skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
