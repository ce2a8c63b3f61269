/* Run-time choice between a baseline and an AVX2 + FMA build of a hot loop. Internal to kernels/cpu/.
 *
 * A kernel writes its loop once as a ZT_CPU_INLINE function, wraps it in two functions, one plain and
 * one marked ZT_CPU_TARGET_AVX2, and calls the one zt_cpu_has_avx2_fma() picks. The choice depends only
 * on the CPU, so results are the same on every run on a given machine (and independent of the thread
 * count); machines with and without FMA may differ in the last bits. Files that use it are compiled with
 * -ffp-contract=fast (kernels/CMakeLists.txt) so that the AVX2 build fuses multiplies and adds.
 *
 * zt_cpu_force_baseline (kernels/cpu_threads.h) forces the baseline build everywhere: the tests use it to
 * check both builds on one machine, and it gives the same bits as a machine without AVX2. */
#ifndef ZT_KERNELS_CPU_DISPATCH_H
#define ZT_KERNELS_CPU_DISPATCH_H

#include "kernels/cpu_threads.h"

/* Forces inlining, so that the body is compiled again inside each target-specific wrapper. */
#define ZT_CPU_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
#define ZT_CPU_X86_DISPATCH 1
#define ZT_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))

/* Whether the AVX2 + FMA builds should run: the CPU (and OS) supports them and the baseline is not forced. */
static inline int zt_cpu_has_avx2_fma(void)
{
    if (zt_cpu_baseline_forced())
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
#define ZT_CPU_TARGET_AVX2

static inline int zt_cpu_has_avx2_fma(void)
{
    return 0;
}
#endif

#endif
