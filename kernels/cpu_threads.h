/* Threading of the CPU kernels (OpenMP). Results never depend on the number of threads: work is split
 * over outputs, and every reduction runs in a fixed order. */
#ifndef ZT_KERNELS_CPU_THREADS_H
#define ZT_KERNELS_CPU_THREADS_H

/* Sets the number of threads the CPU kernels use; n <= 0 means one per available core. */
void zt_cpu_set_threads(int n);
/* The number of threads the CPU kernels will use. */
int zt_cpu_get_threads(void);

/* Makes the CPU kernels run their portable build instead of the AVX2 + FMA one on CPUs that have it (on
 * or off, process-wide): the bits of a CPU without FMA, which may differ from an FMA CPU's in the last
 * bits. For the tests, which check both builds on one machine. */
void zt_cpu_force_baseline(int on);
/* Whether zt_cpu_force_baseline is on. */
int zt_cpu_baseline_forced(void);

#endif
