/* Rotary position embeddings (RoPE), as Hugging Face's LlamaModel and GPTNeoXModel apply them ("rotate_half"):
 * the first rot channels of a head of HS channels turn (rot == HS: all of them, LLaMA; GPT-NeoX's
 * partial_rotary_factor gives rot = int(HS * factor)) and the channels from rot on pass through. Channel
 * i < rot/2 pairs with channel i + rot/2 and the pair turns by the angle pos * inv_freq[i]:
 *   x'[i]         = x[i] cos - x[i + rot/2] sin
 *   x'[i + rot/2] = x[i + rot/2] cos + x[i] sin
 *
 * Layout: in place on the query and key heads of the packed attention input (kernels/attention.h),
 * qkv [B,T,(NH+2*NKV)*HS]: each row holds NH query heads, then NKV key heads, then NKV value heads, which
 * are left as they are (grouped-query attention has NKV < NH; NKV == NH is multi-head attention). Row t of
 * every sequence sits at position pos0 + t, or, when the per-row position array pos [B*T] is given (packed
 * documents, whose positions restart at 0 for each), at position pos[b*T + t] (pos0 is then unused).
 *
 * Angles: pos * inv_freq[i] rounded to fp32, as Hugging Face computes them; cosine and sine in the
 * kernel's precision (fp32 on the GPU and in the CPU's float build). The inverse frequencies come from
 * zt_rope_inv_freq, on the host. */
#ifndef ZT_KERNELS_ROPE_H
#define ZT_KERNELS_ROPE_H

#include "common/status.h"
#include "kernels/real.h"

/* Hugging Face's rope_scaling "rope_type" values that ztrain computes (others are refused by the model
 * config readers). Saved in configs: only grows. */
enum zt_rope_scaling {
    ZT_ROPE_SCALING_NONE = 0,   /* no rope_scaling */
    ZT_ROPE_SCALING_LINEAR = 1, /* "linear": every inverse frequency divided by factor */
    ZT_ROPE_SCALING_LLAMA3 = 2, /* "llama3": long wavelengths divided by factor, short ones kept, a ramp between */
};

typedef struct zt_rope_config {
    double theta;                         /* rope_theta: 10000 (LLaMA, LLaMA-2), 500000 (LLaMA-3) */
    enum zt_rope_scaling scaling;
    double factor;                        /* linear and llama3: > 0 */
    double low_freq_factor;               /* llama3: > 0 */
    double high_freq_factor;              /* llama3: > low_freq_factor */
    int original_max_position_embeddings; /* llama3: > 0 */
} zt_rope_config;

/* Writes the head_size / 2 inverse frequencies inv_freq[i] = 1 / theta^(2i / head_size), scaled as cfg
 * says, the way transformers' ROPE_INIT_FUNCTIONS compute them ("default", "linear", "llama3"; the base
 * frequencies in fp32 steps, the scaling in double, rounded once). Returns 0, or ZT_EINVAL_CONFIG with a
 * message in err (if not NULL) for an odd or non-positive head size or a scaling value out of range. */
int zt_rope_inv_freq(float *inv_freq, int head_size, const zt_rope_config *cfg, zt_err *err);

#include <stdint.h>

/* Rotates the first rot channels (even, 0 < rot <= HS) of the query and key heads of qkv in place (layout
 * above); inv_freq [rot/2] (zt_rope_inv_freq with head_size rot); pos NULL (pos0 + t) or [B*T] positions,
 * each in [0, 2^24). */
void zt_cpu_rope_forward(zt_real *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                         int pos0, const int32_t *pos);
/* The backward, in place on dqkv: rotates the query and key heads back (by -angle), which turns the
 * gradient with respect to the rotated q and k into the gradient with respect to the unrotated ones.
 * It replaces those values (RoPE has no other input); the value heads are left alone. */
void zt_cpu_rope_backward(zt_real *dqkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                          int pos0, const int32_t *pos);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/rope.cu). qkv and dqkv hold `dtype` elements (F32, F16 or BF16), arithmetic is
 * fp32; inv_freq is a device array of rot/2 floats, pos NULL or a device array of B*T int32 positions. One
 * block per row of qkv. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_rope_forward(void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                          int pos0, enum zt_dtype dtype, cudaStream_t stream, const int32_t *pos);
void zt_cuda_rope_backward(void *dqkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                           int pos0, enum zt_dtype dtype, cudaStream_t stream, const int32_t *pos);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
