/* Causal multi-head self-attention, flash style: the forward keeps an online softmax per query row (running
 * max and sum, output rescaled when the max grows) and saves only lse = max + log(sum); the backward
 * recomputes each probability as exp(score - lse) and uses D = rowsum(dout * out).
 *
 * Threads split the (batch, head) pairs: a pair reads and writes only its own head's columns of qkv, out,
 * lse and dqkv, so no two threads touch the same output and each sum runs in a fixed order. */
#include "kernels/attention.h"
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"

/* Dot product of two head vectors of length hs. */
static zt_real zt_attn_dot(const zt_real *a, const zt_real *b, int hs)
{
    zt_real acc = 0;
    for (int i = 0; i < hs; i++)
        acc += a[i] * b[i];
    return acc;
}

/* Writes out [B,T,C] and lse [B,NH,T] from qkv [B,T,3C]. */
void zt_cpu_attention_forward(zt_real *out, zt_real *lse, const zt_real *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    long C3 = 3L * C;
    zt_real scale = (zt_real)1 / zt_real_sqrt((zt_real)hs);

    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads())
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const zt_real *base = qkv + (long)b * T * C3;
        for (int t = 0; t < T; t++) {
            const zt_real *q = base + t * C3 + h * hs;
            zt_real *o = out + ((long)b * T + t) * C + h * hs;
            zt_real maxs = 0, sum = 0;
            for (int i = 0; i < hs; i++)
                o[i] = 0;
            for (int t2 = 0; t2 <= t; t2++) {
                const zt_real *k = base + t2 * C3 + C + h * hs;
                const zt_real *v = base + t2 * C3 + 2 * C + h * hs;
                zt_real s = zt_attn_dot(q, k, hs) * scale;
                if (t2 == 0) {
                    maxs = s;
                } else if (s > maxs) {
                    zt_real corr = zt_real_exp(maxs - s);
                    sum *= corr;
                    for (int i = 0; i < hs; i++)
                        o[i] *= corr;
                    maxs = s;
                }
                zt_real p = zt_real_exp(s - maxs);
                sum += p;
                for (int i = 0; i < hs; i++)
                    o[i] += p * v[i];
            }
            zt_real inv = (zt_real)1 / sum;
            for (int i = 0; i < hs; i++)
                o[i] *= inv;
            lse[((long)b * NH + h) * T + t] = maxs + zt_real_log(sum);
        }
    }
}

/* Adds the gradients with respect to q, k and v into dqkv [B,T,3C]. */
void zt_cpu_attention_backward(zt_real *dqkv, const zt_real *dout, const zt_real *qkv, const zt_real *out,
                               const zt_real *lse, int B, int T, int C, int NH)
{
    int hs = C / NH;
    long C3 = 3L * C;
    zt_real scale = (zt_real)1 / zt_real_sqrt((zt_real)hs);

    #pragma omp parallel for schedule(static) num_threads(zt_cpu_get_threads())
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const zt_real *base = qkv + (long)b * T * C3;
        zt_real *dbase = dqkv + (long)b * T * C3;
        for (int t = 0; t < T; t++) {
            const zt_real *q = base + t * C3 + h * hs;
            zt_real *dq = dbase + t * C3 + h * hs;
            const zt_real *o = out + ((long)b * T + t) * C + h * hs;
            const zt_real *d = dout + ((long)b * T + t) * C + h * hs;
            zt_real row_lse = lse[((long)b * NH + h) * T + t];
            zt_real D = zt_attn_dot(d, o, hs);
            for (int t2 = 0; t2 <= t; t2++) {
                const zt_real *k = base + t2 * C3 + C + h * hs;
                const zt_real *v = base + t2 * C3 + 2 * C + h * hs;
                zt_real *dk = dbase + t2 * C3 + C + h * hs;
                zt_real *dv = dbase + t2 * C3 + 2 * C + h * hs;
                zt_real p = zt_real_exp(zt_attn_dot(q, k, hs) * scale - row_lse);
                zt_real ds = p * (zt_attn_dot(d, v, hs) - D) * scale;
                for (int i = 0; i < hs; i++) {
                    dq[i] += ds * k[i];
                    dk[i] += ds * q[i];
                    dv[i] += p * d[i];
                }
            }
        }
    }
}
