/* Residual connection (out = a + b), its backward, and the in-place add used to accumulate gradients.
 * Element-wise, so any split over threads gives the same bits. */
#include <stddef.h>

#include "kernels/cpu_threads.h"
#include "kernels/residual.h"

/* Below this many elements a parallel region costs more than it saves. */
#define ZT_RESIDUAL_PAR_MIN 16384

/* Writes out[i] = a[i] + b[i] for i in [0, n). */
void zt_cpu_residual_forward(zt_real *out, const zt_real *a, const zt_real *b, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_RESIDUAL_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* Adds dout into da and into db; either may be NULL (that input needs no gradient). */
void zt_cpu_residual_backward(zt_real *da, zt_real *db, const zt_real *dout, size_t n)
{
    if (da)
        zt_cpu_add_inplace(da, dout, n);
    if (db)
        zt_cpu_add_inplace(db, dout, n);
}

/* Adds x into y element-wise (y += x). */
void zt_cpu_add_inplace(zt_real *y, const zt_real *x, size_t n)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if (n >= ZT_RESIDUAL_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}
