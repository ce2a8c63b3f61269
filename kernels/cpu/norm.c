/* Global L2 norm helpers for gradient clipping. The sum of squares splits x into a fixed number of chunks
 * (a function of n only), sums each chunk in double, then adds the chunk sums in chunk order: the result
 * is the same bits for any thread count. */
#include <stddef.h>

#include "kernels/cpu_threads.h"
#include "kernels/norm.h"

/* Fixed number of chunks of the sum of squares; independent of the thread count on purpose. */
#define ZT_NORM_CHUNKS 64

/* Returns the sum of x[i]^2 over [0, n), accumulated in double in a fixed order. */
double zt_cpu_sum_squares(const zt_real *x, size_t n)
{
    double partial[ZT_NORM_CHUNKS];
    size_t chunk = (n + ZT_NORM_CHUNKS - 1) / ZT_NORM_CHUNKS;
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= 65536)
    for (int k = 0; k < ZT_NORM_CHUNKS; k++) {
        size_t i0 = (size_t)k * chunk;
        size_t i1 = i0 + chunk < n ? i0 + chunk : n;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++)
            s += (double)x[i] * (double)x[i];
        partial[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < ZT_NORM_CHUNKS; k++)
        total += partial[k];
    return total;
}

/* Multiplies x[0..n) by s in place. */
void zt_cpu_scale_inplace(zt_real *x, float s, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= 16384)
    for (size_t i = 0; i < n; i++)
        x[i] *= (zt_real)s;
}
