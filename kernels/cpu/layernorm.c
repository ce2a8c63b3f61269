/* Layer normalisation over the last dimension, forward and backward.
 *
 * Row statistics are accumulated in double (cheap next to the matmuls, and it keeps float results close
 * to the double build). The backward runs in two passes so that threads never share an output: rows for
 * dinp, then column blocks for dweight and dbias, each column summed over rows in row order. */
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"
#include "kernels/layernorm.h"

#define ZT_LN_COL_BLOCK 32

/* Writes out = (x - mean) * rstd * weight + bias per row, and saves mean and rstd = 1/sqrt(var + eps). */
void zt_cpu_layernorm_forward(zt_real *out, zt_real *mean, zt_real *rstd, const zt_real *inp,
                              const zt_real *weight, const zt_real *bias, int N, int C, float eps)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)N * C >= 16384)
    for (int n = 0; n < N; n++) {
        const zt_real *x = inp + (long)n * C;
        zt_real *o = out + (long)n * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++)
            sum += x[c];
        double mu = sum / C;
        double var = 0.0;
        for (int c = 0; c < C; c++) {
            double d = x[c] - mu;
            var += d * d;
        }
        var /= C;
        zt_real m = (zt_real)mu;
        zt_real s = (zt_real)(1.0 / sqrt(var + (double)eps));
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* Adds the gradients of the forward into dinp [N,C], dweight [C] and dbias [C]. */
void zt_cpu_layernorm_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                               const zt_real *inp, const zt_real *weight, const zt_real *mean,
                               const zt_real *rstd, int N, int C)
{
    int nthreads = zt_cpu_get_threads();

    /* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight. */
    #pragma omp parallel for schedule(static) num_threads(nthreads) if ((long)N * C >= 16384)
    for (int n = 0; n < N; n++) {
        const zt_real *x = inp + (long)n * C;
        const zt_real *d = dout + (long)n * C;
        zt_real *dx = dinp + (long)n * C;
        zt_real m = mean[n], s = rstd[n];
        double sum_g = 0.0, sum_gx = 0.0;
        for (int c = 0; c < C; c++) {
            zt_real g = d[c] * weight[c];
            sum_g += g;
            sum_gx += g * ((x[c] - m) * s);
        }
        zt_real mean_g = (zt_real)(sum_g / C);
        zt_real mean_gx = (zt_real)(sum_gx / C);
        for (int c = 0; c < C; c++) {
            zt_real xhat = (x[c] - m) * s;
            zt_real g = d[c] * weight[c];
            dx[c] += s * (g - mean_g - xhat * mean_gx);
        }
    }

    int nblocks = (C + ZT_LN_COL_BLOCK - 1) / ZT_LN_COL_BLOCK;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if ((long)N * C >= 16384)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * ZT_LN_COL_BLOCK;
        int c1 = c0 + ZT_LN_COL_BLOCK < C ? c0 + ZT_LN_COL_BLOCK : C;
        zt_real dw[ZT_LN_COL_BLOCK] = {0}, db[ZT_LN_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const zt_real *x = inp + (long)n * C;
            const zt_real *d = dout + (long)n * C;
            zt_real m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                dw[c - c0] += d[c] * ((x[c] - m) * s);
                db[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += dw[c - c0];
            dbias[c] += db[c - c0];
        }
    }
}
