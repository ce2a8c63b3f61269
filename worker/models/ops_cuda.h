/* The CUDA binding of the layer operations (ops.h, ops_cuda.c). Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_OPS_CUDA_H
#define ZT_WORKER_MODELS_OPS_CUDA_H

#include <stdbool.h>

#include <cuda_runtime.h>

#include "kernels/matmul.h" /* zt_cuda_blas */
#include "worker/models/ops.h"

/* What the binding borrows from its executor: the stream every operation goes to, the cuBLASLt handle, and
 * device scratch for the backward passes of norms (zt_cuda_layernorm_backward_scratch_size /
 * zt_cuda_rmsnorm_backward_scratch_size bytes), attention and the embedding. */
typedef struct zt__ops_cuda_res {
    cudaStream_t stream;
    zt_cuda_blas *blas;
    void *norm_scratch, *attn_scratch, *emb_scratch;
    size_t attn_scratch_bytes;  /* attn_scratch's size: the varlen and descriptor backwards check their need */
} zt__ops_cuda_res;

/* Binds o to the CUDA kernels computing in dtype. Free with zt__ops_cuda_free (after the stream is done). */
void zt__ops_cuda_init(zt_ops *o, const zt__ops_cuda_res *r, enum zt_dtype dtype);
void zt__ops_cuda_free(zt_ops *o);
/* Times every operation while on (events on the stream); the report logs the sums and resets them. */
void zt__ops_cuda_set_profiling(zt_ops *o, bool on);
void zt__ops_cuda_profile_report(zt_ops *o);

#endif
