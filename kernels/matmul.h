/* Linear layer: out[n,o] = sum_i inp[n,i] * weight[o,i] + bias[o]  (weight in PyTorch nn.Linear layout).
 * Shapes: inp [N,IC]; weight [OC,IC]; bias [OC] or NULL; out [N,OC]. */
#ifndef ZT_KERNELS_MATMUL_H
#define ZT_KERNELS_MATMUL_H

#include "kernels/real.h"

/* Overwrites out. Blocked for cache and registers, split over threads by output tiles. */
void zt_cpu_matmul_forward(zt_real *out, const zt_real *inp, const zt_real *weight, const zt_real *bias,
                           int N, int IC, int OC);
/* Accumulates (+=) into dinp [N,IC] (may be NULL), dweight [OC,IC] and dbias [OC] (may be NULL). */
void zt_cpu_matmul_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                            const zt_real *inp, const zt_real *weight, int N, int IC, int OC);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/matmul.cu) through cuBLASLt: fp32 accumulation and compute for every dtype
 * (F32 without TF32, F16, BF16 on sm_80+); the bias and the GELU are fused into the GEMM epilogue where
 * cuBLASLt has one, with a separate kernel otherwise. inp, weight, bias, out, pre_gelu, dout, dinp,
 * dweight, dbias hold `dtype` elements; pointers 16-byte aligned are faster. */
#include <stdbool.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"
#include "common/status.h"

/* A cuBLASLt handle and its workspace, created once and used by one stream at a time. */
typedef struct zt_cuda_blas zt_cuda_blas;

/* Creates a context with workspace_bytes of workspace (0: 32 MiB, what Hopper's kernels want). Returns
 * 0, or ZT_ENOMEM (device memory) / ZT_EUNSUPPORTED (cuBLASLt cannot start) with a message in err.
 * Free with zt_cuda_blas_destroy. */
int zt_cuda_blas_create(zt_cuda_blas **out, size_t workspace_bytes, zt_err *err);
/* Device bytes a context with the default workspace holds (workspace and scratch, rounded up): what a
 * memory plan counts for it. */
#define ZT_CUDA_BLAS_DEVICE_BYTES ((size_t)34 << 20)
/* GEMM tuning, on unless the environment has ZT_GEMM_TUNE=0 at creation. The first call of each GEMM
 * form (shapes, epilogue, alignment) that overwrites its output runs up to 16 of the cuBLASLt heuristic's
 * algorithms into that output (synchronizing the stream; no memory is allocated, and the call's own run
 * comes last), keeps those whose outputs hash like the heuristic first's (algorithms that sum in another
 * order, such as split-K, drop out), and uses the fastest of them for the later calls of that form.
 * Results are therefore the same bits with and without tuning. A GEMM that adds into its output (the
 * weight gradients) keeps the heuristic's first. Every form's algorithm is remembered after its first
 * call; turning tuning on or off forgets them. */
void zt_cuda_blas_set_tuning(zt_cuda_blas *ctx, bool on);
/* Frees the context (accepts NULL); the caller makes sure no work that uses it is still queued. */
void zt_cuda_blas_destroy(zt_cuda_blas *ctx);

/* out [N,OC] = inp [N,IC] weight[OC,IC]^T + bias (bias may be NULL). With pre_gelu (not NULL), pre_gelu
 * receives that value and out = gelu(pre_gelu): the MLP's first layer and its activation in one GEMM. */
void zt_cuda_matmul_forward(zt_cuda_blas *ctx, void *out, void *pre_gelu, const void *inp, const void *weight,
                            const void *bias, int N, int IC, int OC, enum zt_dtype dtype, cudaStream_t stream);
/* out [N,OC] = residual [N,OC] + inp [N,IC] weight[OC,IC]^T + bias (bias may be NULL): a projection and the
 * residual connection after it in one GEMM (the residual is the GEMM's C input), with a separate add where
 * cuBLASLt has no such kernel. out must not be residual. */
void zt_cuda_matmul_forward_residual(zt_cuda_blas *ctx, void *out, const void *inp, const void *weight,
                                     const void *bias, const void *residual, int N, int IC, int OC,
                                     enum zt_dtype dtype, cudaStream_t stream);
/* Accumulates (+=) into dweight [OC,IC] and dbias [OC] (may be NULL; summed by a deterministic kernel)
 * and, without pre_gelu, into dinp [N,IC] (may be NULL). With pre_gelu (the forward's pre_gelu, the
 * input of a GELU whose output was this layer's inp), dinp is instead overwritten with the gradient of
 * the GELU's input, gelu'(pre_gelu) * (dout weight): that intermediate is never accumulated. */
void zt_cuda_matmul_backward(zt_cuda_blas *ctx, void *dinp, void *dweight, void *dbias, const void *dout,
                             const void *inp, const void *weight, const void *pre_gelu, int N, int IC, int OC,
                             enum zt_dtype dtype, cudaStream_t stream);
/* zt_cuda_matmul_backward, except that dinp is always overwritten (=) instead of added into: for a
 * caller whose dinp buffer holds nothing worth keeping, which saves zeroing it first and the GEMM's read
 * of it. dweight and dbias still accumulate; with pre_gelu it is the same call as the one above. */
void zt_cuda_matmul_backward_overwrite(zt_cuda_blas *ctx, void *dinp, void *dweight, void *dbias, const void *dout,
                                       const void *inp, const void *weight, const void *pre_gelu, int N, int IC,
                                       int OC, enum zt_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
