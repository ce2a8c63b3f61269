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

#endif
