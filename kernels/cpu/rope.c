/* Rotary position embeddings: the inverse frequencies (host side, shared with the CUDA twins) and the
 * in-place rotation of the query and key heads, forward and backward. Rows are independent, so threads
 * split rows; each row's cosines and sines are computed once and used for all of its heads. */
#include <math.h>
#include <stdlib.h>

#include "common/status.h"
#include "kernels/cpu/real_math.h"
#include "kernels/cpu_threads.h"
#include "kernels/rope.h"

/* Fills inv_freq as transformers' "default", "linear" and "llama3" rope initialisations do. */
int zt_rope_inv_freq(float *inv_freq, int head_size, const zt_rope_config *cfg, zt_err *err)
{
    if (head_size <= 0 || head_size % 2 != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "rotary embeddings need an even head size; this model's is %d (hidden_size / "
                       "num_attention_heads, or head_dim)", head_size);
    if (!(cfg->theta > 0.0) || !isfinite(cfg->theta))
        return zt_fail(err, ZT_EINVAL_CONFIG, "rope_theta must be a positive number (it is %g)", cfg->theta);
    switch (cfg->scaling) {
    case ZT_ROPE_SCALING_NONE:
        break;
    case ZT_ROPE_SCALING_LINEAR:
        if (!(cfg->factor > 0.0) || !isfinite(cfg->factor))
            return zt_fail(err, ZT_EINVAL_CONFIG, "rope_scaling.factor must be a positive number (it is %g)",
                           cfg->factor);
        break;
    case ZT_ROPE_SCALING_LLAMA3:
        if (!(cfg->factor > 0.0) || !isfinite(cfg->factor))
            return zt_fail(err, ZT_EINVAL_CONFIG, "rope_scaling.factor must be a positive number (it is %g)",
                           cfg->factor);
        if (cfg->original_max_position_embeddings <= 0)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "llama3 rope_scaling needs original_max_position_embeddings > 0 (it is %d)",
                           cfg->original_max_position_embeddings);
        if (!(cfg->low_freq_factor > 0.0) || !(cfg->high_freq_factor > cfg->low_freq_factor) ||
            !isfinite(cfg->high_freq_factor))
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor (they are %g and %g; "
                           "LLaMA-3.1 uses 1 and 4)", cfg->low_freq_factor, cfg->high_freq_factor);
        break;
    default:
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown rope scaling type %d (ztrain computes none, linear and llama3)",
                       (int)cfg->scaling);
    }

    const float base = (float)cfg->theta;
    for (int i = 0; i < head_size / 2; i++) {
        /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step in fp32. */
        float e = (float)(2 * i) / (float)head_size;
        float p = (float)pow((double)base, (double)e);
        float f = 1.0f / p;
        if (cfg->scaling == ZT_ROPE_SCALING_LINEAR) {
            f = (float)((double)f / cfg->factor);
        } else if (cfg->scaling == ZT_ROPE_SCALING_LLAMA3) {
            const double old_len = cfg->original_max_position_embeddings;
            const double low_freq_wavelen = old_len / cfg->low_freq_factor;
            const double high_freq_wavelen = old_len / cfg->high_freq_factor;
            const double wavelen = 2.0 * M_PI / (double)f;
            if (wavelen > low_freq_wavelen) {
                f = (float)((double)f / cfg->factor);
            } else if (wavelen >= high_freq_wavelen) {
                const double smooth =
                    (old_len / wavelen - cfg->low_freq_factor) / (cfg->high_freq_factor - cfg->low_freq_factor);
                f = (float)((1.0 - smooth) * (double)f / cfg->factor + smooth * (double)f);
            }
        }
        inv_freq[i] = f;
    }
    return 0;
}

/* Turns the query and key heads of every row by sign * angle (sign -1: the backward). */
static void zt_rope_apply(zt_real *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                          int pos0, const int32_t *posv, zt_real sign)
{
    ZT_ASSERT(rot > 0 && rot <= HS && rot % 2 == 0);
    const int half = rot / 2, heads = NH + NKV;
    const long stride = (long)(NH + 2 * NKV) * HS, rows = (long)B * T;
    #pragma omp parallel num_threads(zt_cpu_get_threads()) if (rows * heads * HS >= 16384)
    {
        zt_real *cs = malloc(sizeof(zt_real) * 2 * (half ? half : 1));
        ZT_ASSERT(cs != NULL);
        zt_real *sn = cs + half;
        #pragma omp for schedule(static)
        for (long r = 0; r < rows; r++) {
            const int pos = posv ? posv[r] : pos0 + (int)(r % T);
            for (int i = 0; i < half; i++) {
#ifdef ZT_CPU_REAL_DOUBLE
                const zt_real ang = (zt_real)pos * (zt_real)inv_freq[i];
#else
                const float ang = (float)pos * inv_freq[i]; /* rounded to fp32, as transformers does */
#endif
                cs[i] = zt_real_cos(ang);
                sn[i] = sign * zt_real_sin(ang);
            }
            zt_real *row = qkv + r * stride;
            for (int h = 0; h < heads; h++) {
                zt_real *x = row + (long)h * HS;
                for (int i = 0; i < half; i++) {
                    const zt_real x0 = x[i], x1 = x[i + half];
                    x[i] = x0 * cs[i] - x1 * sn[i];
                    x[i + half] = x1 * cs[i] + x0 * sn[i];
                }
            }
        }
        free(cs);
    }
}

/* Rotates the query and key heads of qkv [B,T,(NH+2*NKV)*HS] in place. */
void zt_cpu_rope_forward(zt_real *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                         int pos0, const int32_t *pos)
{
    zt_rope_apply(qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, pos, (zt_real)1);
}

/* Rotates the query and key heads of dqkv back, in place. */
void zt_cpu_rope_backward(zt_real *dqkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                          int pos0, const int32_t *pos)
{
    zt_rope_apply(dqkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, pos, (zt_real)-1);
}
