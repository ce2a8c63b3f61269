/* AdamW (decoupled weight decay, Loshchilov & Hutter), PyTorch's semantics:
 *   g = grad * grad_scale
 *   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *   param -= lr * ( (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * param )
 * step counts from 1. grad_scale folds in gradient clipping, loss-scale removal and accumulation. */
#ifndef ZT_KERNELS_ADAMW_H
#define ZT_KERNELS_ADAMW_H

#include <stddef.h>

typedef struct zt_adamw_params {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    float grad_scale;
    int step; /* 1-based */
} zt_adamw_params;

/* fp32 always: master weights and Adam state are fp32 on every backend. */
void zt_cpu_adamw_update(float *param, float *m, float *v, const float *grad, size_t n,
                         const zt_adamw_params *p);

#ifdef ZT_WITH_CUDA
/* CUDA twin (kernels/cuda/adamw.cu): one launch updates many tensors (their pointers travel in the
 * kernel's arguments, a block per chunk), the same math as zt_cpu_adamw_update. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

/* One tensor of a fused update. Device pointers. */
typedef struct zt_cuda_adamw_tensor {
    float *param;      /* fp32 master weights [n], updated in place */
    float *m;          /* fp32 first moment [n] */
    float *v;          /* fp32 second moment [n] */
    const void *grad;  /* [n] of grad_dtype */
    void *param_lowp;  /* NULL, or [n] of lowp_dtype that receives the updated weights, rounded */
    size_t n;
    int weight_decay;  /* 1: apply p->weight_decay; 0: none (biases, layer-norm parameters) */
} zt_cuda_adamw_tensor;

/* Updates count tensors with p's hyperparameters; the gradient is scaled by p->grad_scale and, if
 * d_grad_scale is not NULL, also by that device float (a clip coefficient computed on the device).
 * If d_skip is not NULL and the device int it points to is nonzero (an fp16 overflow), nothing changes.
 * grad_dtype and lowp_dtype are F32, F16 or BF16 (lowp_dtype is ignored where param_lowp is NULL). */
void zt_cuda_adamw_update(const zt_cuda_adamw_tensor *tensors, int count, const zt_adamw_params *p,
                          enum zt_dtype grad_dtype, enum zt_dtype lowp_dtype, const float *d_grad_scale,
                          const int *d_skip, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
