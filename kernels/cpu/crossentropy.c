/* Fused softmax + cross-entropy over rows of logits, with an optional gradient written in the same pass.
 * Rows are independent, so threads split rows; each row's sums run in double and in a fixed order. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"
#include "kernels/crossentropy.h"

/* Writes per-row losses and, if dlogits is not NULL, grad_scale * (softmax - onehot); returns the number
 * of rows whose target is not ignore_index. */
int zt_cpu_crossentropy_forward_backward(zt_real *losses, zt_real *dlogits, const zt_real *logits,
                                         const int32_t *targets, int N, int V, int ignore_index,
                                         float grad_scale)
{
    int counted = 0;
    for (int n = 0; n < N; n++)
        counted += targets[n] != ignore_index;

    /* dlogits may alias logits: each element is read before it is written, and never read after. */
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)N * V >= 16384)
    for (int n = 0; n < N; n++) {
        const zt_real *x = logits + (long)n * V;
        zt_real *dx = dlogits ? dlogits + (long)n * V : NULL;
        int target = targets[n];
        if (target == ignore_index) {
            losses[n] = 0;
            if (dx)
                for (int i = 0; i < V; i++)
                    dx[i] = 0;
            continue;
        }
        zt_real maxv = x[0];
        for (int i = 1; i < V; i++)
            maxv = x[i] > maxv ? x[i] : maxv;
        double sum = 0.0;
        for (int i = 0; i < V; i++)
            sum += zt_real_exp(x[i] - maxv);
        double lse = (double)maxv + log(sum);
        losses[n] = (zt_real)(lse - (double)x[target]);
        if (dx) {
            zt_real inv_sum = (zt_real)(1.0 / sum);
            zt_real scale = (zt_real)grad_scale;
            for (int i = 0; i < V; i++) {
                zt_real prob = zt_real_exp(x[i] - maxv) * inv_sum;
                dx[i] = scale * (prob - (i == target ? (zt_real)1 : (zt_real)0));
            }
        }
    }
    return counted;
}
