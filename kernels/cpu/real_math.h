/* libm functions for zt_real: the float build calls the float versions (expf, ...), the double build
 * (ZT_CPU_REAL_DOUBLE) the double ones, so neither precision pays for or loses to the other. Internal to
 * kernels/cpu/. */
#ifndef ZT_KERNELS_CPU_REAL_MATH_H
#define ZT_KERNELS_CPU_REAL_MATH_H

#include <math.h>

#include "kernels/real.h"

#ifdef ZT_CPU_REAL_DOUBLE
#define zt_real_exp exp
#define zt_real_log log
#define zt_real_sqrt sqrt
#define zt_real_tanh tanh
#define zt_real_cos cos
#define zt_real_sin sin
#define zt_real_erf erf
#else
#define zt_real_exp expf
#define zt_real_log logf
#define zt_real_sqrt sqrtf
#define zt_real_tanh tanhf
#define zt_real_cos cosf
#define zt_real_sin sinf
#define zt_real_erf erff
#endif

#endif
