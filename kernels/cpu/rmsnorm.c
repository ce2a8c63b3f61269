/* RMS normalisation over the last dimension, forward and backward.
 *
 * As in layernorm.c, row sums run in double and the backward runs in two passes so that threads never
 * share an output: rows for dinp, then column blocks for dweight, each column summed over rows in row
 * order. */
#include <math.h>

#include "kernels/cpu_threads.h"
#include "kernels/rmsnorm.h"

#define ZT_RMS_COL_BLOCK 32

/* Writes out = x * rstd * weight per row, and saves rstd = 1/sqrt(mean(x^2) + eps). */
void zt_cpu_rmsnorm_forward(zt_real *out, zt_real *rstd, const zt_real *inp, const zt_real *weight, int N, int C,
                            float eps)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)N * C >= 16384)
    for (int n = 0; n < N; n++) {
        const zt_real *x = inp + (long)n * C;
        zt_real *o = out + (long)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)x[c] * x[c];
        zt_real s = (zt_real)(1.0 / sqrt(ss / C + (double)eps));
        for (int c = 0; c < C; c++)
            o[c] = x[c] * s * weight[c];
        rstd[n] = s;
    }
}

/* Adds the gradients of the forward into dinp [N,C] and dweight [C]. */
void zt_cpu_rmsnorm_backward(zt_real *dinp, zt_real *dweight, const zt_real *dout, const zt_real *inp,
                             const zt_real *weight, const zt_real *rstd, int N, int C)
{
    int nthreads = zt_cpu_get_threads();

    /* dinp = rstd * (g - x * rstd^2 * mean(g * x)) with g = dout * weight. */
    #pragma omp parallel for schedule(static) num_threads(nthreads) if ((long)N * C >= 16384)
    for (int n = 0; n < N; n++) {
        const zt_real *x = inp + (long)n * C;
        const zt_real *d = dout + (long)n * C;
        zt_real *dx = dinp + (long)n * C;
        zt_real s = rstd[n];
        double sum_gx = 0.0;
        for (int c = 0; c < C; c++)
            sum_gx += (double)(d[c] * weight[c]) * x[c];
        zt_real k = (zt_real)(sum_gx / C) * s * s;
        for (int c = 0; c < C; c++)
            dx[c] += s * (d[c] * weight[c] - x[c] * k);
    }

    int nblocks = (C + ZT_RMS_COL_BLOCK - 1) / ZT_RMS_COL_BLOCK;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if ((long)N * C >= 16384)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * ZT_RMS_COL_BLOCK;
        int c1 = c0 + ZT_RMS_COL_BLOCK < C ? c0 + ZT_RMS_COL_BLOCK : C;
        zt_real dw[ZT_RMS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const zt_real *x = inp + (long)n * C;
            const zt_real *d = dout + (long)n * C;
            zt_real s = rstd[n];
            for (int c = c0; c < c1; c++)
                dw[c - c0] += d[c] * (x[c] * s);
        }
        for (int c = c0; c < c1; c++)
            dweight[c] += dw[c - c0];
    }
}
