/* Device buffers for the GPU tests (test_cuda_kernels.c, test_attention.c): allocation, uploads of host
 * floats in a dtype (the host copy is overwritten with the rounded values the device holds) and downloads as
 * floats, all on the including test's stream g_stream, which it defines before including this header.
 * Internal to tests/gpu/. */
#ifndef ZT_TESTS_GPU_DEV_BUFFERS_H
#define ZT_TESTS_GPU_DEV_BUFFERS_H

#include <stdlib.h>

#include <cuda_runtime.h>

#include "common/safetensors.h"      /* enum zt_dtype */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, zt_cuda_cast */

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    ZT_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

static void dev_sync(void) { ZT_CUDA_CHECK(cudaStreamSynchronize(g_stream)); }

/* Uploads n floats as dtype; h is overwritten with the values the device holds (rounded). */
static void *dev_upload(float *h, size_t n, enum zt_dtype dt)
{
    float *tmp = dev_alloc(n * sizeof(float));
    void *d = dev_alloc(n * zt_dtype_size(dt));
    ZT_CUDA_CHECK(cudaMemcpyAsync(tmp, h, n * sizeof(float), cudaMemcpyHostToDevice, g_stream));
    zt_cuda_cast(d, dt, tmp, ZT_DTYPE_F32, n, g_stream);
    zt_cuda_cast(tmp, ZT_DTYPE_F32, d, dt, n, g_stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(h, tmp, n * sizeof(float), cudaMemcpyDeviceToHost, g_stream));
    dev_sync();
    ZT_CUDA_CHECK(cudaFree(tmp));
    return d;
}

/* n elements of dtype on the device as host floats (malloc'ed; the caller frees them). */
static float *dev_download(const void *d, size_t n, enum zt_dtype dt)
{
    float *tmp = dev_alloc(n * sizeof(float));
    float *h = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(h);
    zt_cuda_cast(tmp, ZT_DTYPE_F32, d, dt, n, g_stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(h, tmp, n * sizeof(float), cudaMemcpyDeviceToHost, g_stream));
    dev_sync();
    ZT_CUDA_CHECK(cudaFree(tmp));
    return h;
}

#endif
