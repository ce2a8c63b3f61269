/* Token + position (+ token type) embedding, forward and backward.
 *
 * The backward is a scatter-add (many positions may hold the same token). To stay deterministic without
 * atomics, threads split the channels: each thread owns a range of columns of dwte, dwpe (and dwtt) and
 * walks all positions in order, so every element is summed in token order whatever the thread count. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu_threads.h"
#include "kernels/embedding.h"

/* Columns per unit of work in the backward: wide enough for whole cache lines and SIMD. */
#define ZT_EMBED_COL_BLOCK 32

/* Writes out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], or wte[tokens[b,t],:] alone when wpe is NULL. */
void zt_cpu_embedding_forward(zt_real *out, const int32_t *tokens, const zt_real *wte, const zt_real *wpe,
                              int B, int T, int C)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)B * T * C >= 16384)
    for (long bt = 0; bt < (long)B * T; bt++) {
        int t = (int)(bt % T);
        const zt_real *w = wte + (long)tokens[bt] * C;
        zt_real *o = out + bt * C;
        if (!wpe) {
            for (int c = 0; c < C; c++)
                o[c] = w[c];
            continue;
        }
        const zt_real *p = wpe + (long)t * C;
        for (int c = 0; c < C; c++)
            o[c] = w[c] + p[c];
    }
}

/* Writes out[b,t,:] = wte[tokens[b,t],:] + wtt[types[b,t],:] + wpe[t,:] (Hugging Face's BertEmbeddings order). */
void zt_cpu_embedding_forward_typed(zt_real *out, const int32_t *tokens, const int32_t *types, const zt_real *wte,
                                    const zt_real *wpe, const zt_real *wtt, int B, int T, int C)
{
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)B * T * C >= 16384)
    for (long bt = 0; bt < (long)B * T; bt++) {
        int t = (int)(bt % T);
        const zt_real *w = wte + (long)tokens[bt] * C;
        const zt_real *y = wtt + (long)types[bt] * C;
        const zt_real *p = wpe + (long)t * C;
        zt_real *o = out + bt * C;
        for (int c = 0; c < C; c++)
            o[c] = (w[c] + y[c]) + p[c];
    }
}

/* Adds dout[b,t,:] into dwte[tokens[b,t],:] and dwpe[t,:] and, with types, into dwtt[types[b,t],:], summing
 * in (b,t) order per element. */
static void zt_embedding_backward(zt_real *dwte, zt_real *dwpe, zt_real *dwtt, const zt_real *dout,
                                  const int32_t *tokens, const int32_t *types, int B, int T, int C)
{
    int nblocks = (C + ZT_EMBED_COL_BLOCK - 1) / ZT_EMBED_COL_BLOCK;
    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads()) if ((long)B * T * C >= 16384)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * ZT_EMBED_COL_BLOCK;
        int c1 = c0 + ZT_EMBED_COL_BLOCK < C ? c0 + ZT_EMBED_COL_BLOCK : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const zt_real *d = dout + ((long)b * T + t) * C;
                zt_real *w = dwte + (long)tokens[(long)b * T + t] * C;
                if (dwpe) {
                    zt_real *p = dwpe + (long)t * C;
                    for (int c = c0; c < c1; c++) {
                        w[c] += d[c];
                        p[c] += d[c];
                    }
                } else {
                    for (int c = c0; c < c1; c++)
                        w[c] += d[c];
                }
                if (types) {
                    zt_real *y = dwtt + (long)types[(long)b * T + t] * C;
                    for (int c = c0; c < c1; c++)
                        y[c] += d[c];
                }
            }
        }
    }
}

/* Adds dout[b,t,:] into dwte[tokens[b,t],:] and (unless NULL) dwpe[t,:], summing in (b,t) order per element. */
void zt_cpu_embedding_backward(zt_real *dwte, zt_real *dwpe, const zt_real *dout, const int32_t *tokens,
                               int B, int T, int C)
{
    zt_embedding_backward(dwte, dwpe, NULL, dout, tokens, NULL, B, T, C);
}

/* The same, and dout[b,t,:] into dwtt[types[b,t],:]. */
void zt_cpu_embedding_backward_typed(zt_real *dwte, zt_real *dwpe, zt_real *dwtt, const zt_real *dout,
                                     const int32_t *tokens, const int32_t *types, int B, int T, int C)
{
    zt_embedding_backward(dwte, dwpe, dwtt, dout, tokens, types, B, T, C);
}
