/* The first token of every sequence on the GPU (kernels/pooler.h): one block per sequence, one element per
 * thread and step (B * C elements in all: too few to be worth vector paths). */
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/pooler.h"

template <typename T>
static __global__ void first_token_kernel(T *__restrict__ dst, const T *__restrict__ src, int T_, int C, bool backward)
{
    const size_t b = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        if (backward) {
            T *d = dst + b * T_ * C + c;
            *d = zt_from_float<T>(zt_to_float(*d) + zt_to_float(src[b * C + c]));
        } else {
            dst[b * C + c] = src[b * T_ * C + c];
        }
    }
}

template <typename T>
static void first_token(T *dst, const T *src, int B, int T_, int C, bool backward, cudaStream_t stream)
{
    first_token_kernel<T><<<B, 256, 0, stream>>>(dst, src, T_, C, backward);
    ZT_CUDA_CHECK_LAUNCH();
}

static void first_token_any(void *dst, const void *src, int B, int T, int C, bool backward, enum zt_dtype dtype,
                            cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && C > 0);
    switch (dtype) {
    case ZT_DTYPE_F32:
        first_token((float *)dst, (const float *)src, B, T, C, backward, stream);
        break;
    case ZT_DTYPE_F16:
        first_token((__half *)dst, (const __half *)src, B, T, C, backward, stream);
        break;
    case ZT_DTYPE_BF16:
        first_token((__nv_bfloat16 *)dst, (const __nv_bfloat16 *)src, B, T, C, backward, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_first_token", dtype);
    }
}

extern "C" void zt_cuda_first_token_forward(void *first, const void *h, int B, int T, int C, enum zt_dtype dtype,
                                            cudaStream_t stream)
{
    first_token_any(first, h, B, T, C, false, dtype, stream);
}

extern "C" void zt_cuda_first_token_backward(void *dh, const void *dfirst, int B, int T, int C, enum zt_dtype dtype,
                                             cudaStream_t stream)
{
    first_token_any(dh, dfirst, B, T, C, true, dtype, stream);
}
