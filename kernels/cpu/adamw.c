/* AdamW update of fp32 master weights, with PyTorch's semantics (see kernels/adamw.h). Element-wise, so
 * the split over threads never changes a result. */
#include <math.h>
#include <stddef.h>

#include "common/status.h"
#include "kernels/adamw.h"
#include "kernels/cpu_threads.h"

/* Applies one AdamW step to param[0..n), updating the moments m and v in place. */
void zt_cpu_adamw_update(float *param, float *m, float *v, const float *grad, size_t n,
                         const zt_adamw_params *p)
{
    ZT_ASSERT(p->step >= 1); /* the bias corrections divide by 1 - beta^step */
    float beta1 = p->beta1, beta2 = p->beta2;
    /* Bias corrections in double: beta^step underflows gracefully and loses no digits for large steps. */
    float bc1 = (float)(1.0 - pow((double)beta1, (double)p->step));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)p->step));
    float lr = p->lr, eps = p->eps, wd = p->weight_decay, gs = p->grad_scale;

    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= 16384)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * gs;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
    }
}
