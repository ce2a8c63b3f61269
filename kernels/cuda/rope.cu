/* Rotary position embeddings on the GPU (kernels/rope.h): one block per row of qkv. The block's threads
 * first compute the row's rot/2 cosines and sines into shared memory (fp32 angle pos * inv_freq[i], then
 * sincosf at full precision), then walk the (head, pair) items of the NH + NKV rotated heads, consecutive
 * threads on consecutive channels. In place; value heads and the channels from rot on are not touched. */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/rope.h"

#define ROPE_THREADS 128
#define ROPE_MAX_HS 1024 /* shared cosines and sines: 2 * 512 floats */

template <typename T>
static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(T *__restrict__ qkv, const float *__restrict__ inv_freq, int T_, int heads, int HS, int rot,
                int stride, int pos0, const int32_t *__restrict__ posv, float sign)
{
    __shared__ float cs[ROPE_MAX_HS / 2], sn[ROPE_MAX_HS / 2];
    const int half = rot / 2;
    const size_t r = blockIdx.x;
    const float pos = (float)(posv ? posv[r] : pos0 + (int)(r % T_));
    for (int i = threadIdx.x; i < half; i += ROPE_THREADS) {
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        cs[i] = c;
        sn[i] = sign * s;
    }
    __syncthreads();
    T *row = qkv + r * stride;
    for (int idx = threadIdx.x; idx < heads * half; idx += ROPE_THREADS) {
        const int h = idx / half, i = idx % half;
        T *x = row + h * HS;
        const float x0 = zt_to_float(x[i]), x1 = zt_to_float(x[i + half]);
        x[i] = zt_from_float<T>(x0 * cs[i] - x1 * sn[i]);
        x[i + half] = zt_from_float<T>(x1 * cs[i] + x0 * sn[i]);
    }
}

template <typename T>
static void rope(T *qkv, const float *inv_freq, int B, int T_, int NH, int NKV, int HS, int rot, int pos0,
                 const int32_t *posv, float sign, cudaStream_t stream)
{
    rope_kernel<T><<<(unsigned)((size_t)B * T_), ROPE_THREADS, 0, stream>>>(qkv, inv_freq, T_, NH + NKV, HS, rot,
                                                                           (NH + 2 * NKV) * HS, pos0, posv, sign);
    ZT_CUDA_CHECK_LAUNCH();
}

static void rope_any(void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot, int pos0,
                     const int32_t *posv, float sign, enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && NH > 0 && NKV > 0 && HS > 0 && HS <= ROPE_MAX_HS);
    ZT_ASSERT(rot > 0 && rot <= HS && rot % 2 == 0);
    ZT_ASSERT(posv || (pos0 >= 0 && (long)pos0 + T <= (1L << 24))); /* positions exact in fp32 */
    switch (dtype) {
    case ZT_DTYPE_F32:
        rope((float *)qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, posv, sign, stream);
        break;
    case ZT_DTYPE_F16:
        rope((__half *)qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, posv, sign, stream);
        break;
    case ZT_DTYPE_BF16:
        rope((__nv_bfloat16 *)qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, posv, sign, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_rope", dtype);
    }
}

extern "C" void zt_cuda_rope_forward(void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS,
                                     int rot, int pos0, enum zt_dtype dtype, cudaStream_t stream,
                                     const int32_t *pos)
{
    rope_any(qkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, pos, 1.0f, dtype, stream);
}

extern "C" void zt_cuda_rope_backward(void *dqkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS,
                                      int rot, int pos0, enum zt_dtype dtype, cudaStream_t stream,
                                      const int32_t *pos)
{
    rope_any(dqkv, inv_freq, B, T, NH, NKV, HS, rot, pos0, pos, -1.0f, dtype, stream);
}
