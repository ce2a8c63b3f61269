/* Threading of the CPU kernels (OpenMP). Results never depend on the number of threads: work is split
 * over outputs, and every reduction runs in a fixed order. */
#ifndef ZT_KERNELS_CPU_THREADS_H
#define ZT_KERNELS_CPU_THREADS_H

/* Sets the number of threads the CPU kernels use; n <= 0 means one per available core. */
void zt_cpu_set_threads(int n);
/* The number of threads the CPU kernels will use. */
int zt_cpu_get_threads(void);

#endif
