/* Thread count of the CPU kernels. Every parallel region in kernels/cpu/ asks zt_cpu_get_threads() for
 * its team size (num_threads clause), so the setting holds whichever thread later calls a kernel. */
#include <omp.h>

#include "kernels/cpu_threads.h"

/* 0 means "not set": use OpenMP's default (OMP_NUM_THREADS, or one per core). */
static int g_cpu_threads = 0;

/* Sets the number of threads the CPU kernels use; n <= 0 means one per available core. */
void zt_cpu_set_threads(int n)
{
    if (n <= 0)
        n = omp_get_num_procs();
    g_cpu_threads = n;
    omp_set_num_threads(n);
}

/* Returns the number of threads the CPU kernels will use (at least 1). */
int zt_cpu_get_threads(void)
{
    int n = g_cpu_threads > 0 ? g_cpu_threads : omp_get_max_threads();
    return n > 0 ? n : 1;
}

static int g_force_baseline = 0;

/* The portable build of the CPU kernels on or off; see cpu_threads.h. */
void zt_cpu_force_baseline(int on)
{
    g_force_baseline = on != 0;
}

int zt_cpu_baseline_forced(void)
{
    return g_force_baseline;
}
