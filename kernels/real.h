/* The floating-point type of the CPU kernels.
 *
 * The CPU kernels are written once and compiled twice: with zt_real = float for training (library
 * zt_kernels_cpu) and with zt_real = double (ZT_CPU_REAL_DOUBLE, library zt_kernels_cpu_f64) for the
 * finite-difference tests, which need double precision to check every backward pass tightly. */
#ifndef ZT_KERNELS_REAL_H
#define ZT_KERNELS_REAL_H

#ifdef ZT_CPU_REAL_DOUBLE
typedef double zt_real;
#else
typedef float zt_real;
#endif

#endif
