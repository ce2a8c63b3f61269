/* The first token of every sequence, forward (a strided copy) and backward (an add into rows t = 0). */
#include <string.h>

#include "kernels/pooler.h"

/* Copies row t = 0 of every sequence of h [B,T,C] into first [B,C]. */
void zt_cpu_first_token_forward(zt_real *first, const zt_real *h, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        memcpy(first + (long)b * C, h + (long)b * T * C, sizeof(zt_real) * C);
}

/* Adds dfirst [B,C] into row t = 0 of every sequence of dh [B,T,C]. */
void zt_cpu_first_token_backward(zt_real *dh, const zt_real *dfirst, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        zt_real *d = dh + (long)b * T * C;
        const zt_real *g = dfirst + (long)b * C;
        for (int c = 0; c < C; c++)
            d[c] += g[c];
    }
}
