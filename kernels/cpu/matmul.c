/* Linear layer (out = inp @ weight^T + bias), forward and backward. Simple version: every output element
 * is one dot product summed in index order, threads split the outputs. */
#include "kernels/cpu_threads.h"
#include "kernels/matmul.h"

/* Overwrites out[n,o] with bias[o] + sum_i inp[n,i] * weight[o,i]. */
void zt_cpu_matmul_forward(zt_real *out, const zt_real *inp, const zt_real *weight, const zt_real *bias,
                           int N, int IC, int OC)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads())
    for (int n = 0; n < N; n++) {
        const zt_real *x = inp + (long)n * IC;
        for (int o = 0; o < OC; o++) {
            const zt_real *w = weight + (long)o * IC;
            zt_real acc = 0;
            for (int i = 0; i < IC; i++)
                acc += x[i] * w[i];
            out[(long)n * OC + o] = acc + (bias ? bias[o] : 0);
        }
    }
}

/* Adds dout @ weight into dinp, dout^T @ inp into dweight and the column sums of dout into dbias. */
void zt_cpu_matmul_backward(zt_real *dinp, zt_real *dweight, zt_real *dbias, const zt_real *dout,
                            const zt_real *inp, const zt_real *weight, int N, int IC, int OC)
{
    int nthreads = zt_cpu_get_threads();
    if (dinp) {
        #pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int n = 0; n < N; n++) {
            zt_real *dx = dinp + (long)n * IC;
            const zt_real *d = dout + (long)n * OC;
            for (int o = 0; o < OC; o++) {
                const zt_real *w = weight + (long)o * IC;
                for (int i = 0; i < IC; i++)
                    dx[i] += d[o] * w[i];
            }
        }
    }
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int o = 0; o < OC; o++) {
        zt_real *dw = dweight + (long)o * IC;
        zt_real db = 0;
        for (int n = 0; n < N; n++) {
            zt_real d = dout[(long)n * OC + o];
            const zt_real *x = inp + (long)n * IC;
            for (int i = 0; i < IC; i++)
                dw[i] += d * x[i];
            db += d;
        }
        if (dbias)
            dbias[o] += db;
    }
}
