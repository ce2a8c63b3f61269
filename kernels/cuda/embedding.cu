/* Token + position embedding on the GPU (kernels/embedding.h).
 *
 * Backward without float atomics: the B*T positions are sorted by token with CUB's stable radix sort
 * (keys: token ids, values: positions 0..B*T-1), so each token's positions end up contiguous and in
 * increasing order. One block per sorted position checks whether it starts a run of equal tokens; the
 * block that does sums the run's rows of dout in order and adds them to that token's row of dwte. The
 * result does not depend on scheduling, and no host synchronisation is needed. */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/embedding.h"

template <typename T>
static __global__ void embedding_forward_kernel(T *__restrict__ out, const int32_t *__restrict__ tokens,
                                                const T *__restrict__ wte, const T *__restrict__ wpe, int B,
                                                int T_, int C)
{
    constexpr int VS = zt_vec<T>::size;
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (idx >= (size_t)B * T_ * C)
        return;
    int bt = (int)(idx / C);
    int c = (int)(idx % C);
    int t = bt % T_;
    int tok = tokens[bt];
    zt_vec<T> a = zt_load_vec(wte + (size_t)tok * C + c);
    zt_vec<T> p = zt_load_vec(wpe + (size_t)t * C + c);
    zt_vec<T> o;
    for (int k = 0; k < VS; k++)
        o.v[k] = zt_from_float<T>(zt_to_float(a.v[k]) + zt_to_float(p.v[k]));
    zt_store_vec(out + idx, o);
}

/* dwpe[t,c] += sum over b of dout[b,t,c], b in order. One thread per VS channels of one position. */
template <typename T>
static __global__ void wpe_backward_kernel(T *__restrict__ dwpe, const T *__restrict__ dout, int B, int T_,
                                           int C)
{
    constexpr int VS = zt_vec<T>::size;
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VS;
    if (idx >= (size_t)T_ * C)
        return;
    float acc[VS];
    for (int k = 0; k < VS; k++)
        acc[k] = 0.0f;
    for (int b = 0; b < B; b++) {
        zt_vec<T> d = zt_load_vec(dout + (size_t)b * T_ * C + idx);
        for (int k = 0; k < VS; k++)
            acc[k] += zt_to_float(d.v[k]);
    }
    zt_vec<T> w = zt_load_vec(dwpe + idx);
    for (int k = 0; k < VS; k++)
        w.v[k] = zt_from_float<T>(zt_to_float(w.v[k]) + acc[k]);
    zt_store_vec(dwpe + idx, w);
}

static __global__ void iota_kernel(int32_t *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = i;
}

/* Block i (of B*T) owns sorted position i if it starts a run of equal tokens; blockIdx.y picks a slice
 * of blockDim.x * VS channels. Rows are summed in increasing position order (the sort is stable). */
template <typename T>
static __global__ void wte_backward_kernel(T *__restrict__ dwte, const T *__restrict__ dout,
                                           const uint32_t *__restrict__ sorted_tokens,
                                           const int32_t *__restrict__ sorted_pos, int BT, int C)
{
    constexpr int VS = zt_vec<T>::size;
    int i = blockIdx.x;
    uint32_t tok = sorted_tokens[i];
    if (i > 0 && sorted_tokens[i - 1] == tok)
        return; /* not the start of a run */
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * VS;
    if (c >= C)
        return;
    float acc[VS];
    for (int k = 0; k < VS; k++)
        acc[k] = 0.0f;
    for (int j = i; j < BT && sorted_tokens[j] == tok; j++) {
        zt_vec<T> d = zt_load_vec(dout + (size_t)sorted_pos[j] * C + c);
        for (int k = 0; k < VS; k++)
            acc[k] += zt_to_float(d.v[k]);
    }
    T *row = dwte + (size_t)tok * C + c;
    zt_vec<T> w = zt_load_vec(row);
    for (int k = 0; k < VS; k++)
        w.v[k] = zt_from_float<T>(zt_to_float(w.v[k]) + acc[k]);
    zt_store_vec(row, w);
}

template <typename T>
static void embedding_forward(T *out, const int32_t *tokens, const T *wte, const T *wpe, int B, int T_, int C,
                              cudaStream_t stream)
{
    const int block = 256;
    size_t nvec = (size_t)B * T_ * C / zt_vec<T>::size;
    embedding_forward_kernel<<<(unsigned)ZT_CEIL_DIV(nvec, (size_t)block), block, 0, stream>>>(out, tokens, wte,
                                                                                             wpe, B, T_, C);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                          int B, int T, int C, enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && C > 0 && C % 8 == 0);
    ZT_ASSERT(zt_aligned16(out) && zt_aligned16(wte) && zt_aligned16(wpe));
    switch (dtype) {
    case ZT_DTYPE_F32:
        embedding_forward((float *)out, tokens, (const float *)wte, (const float *)wpe, B, T, C, stream);
        break;
    case ZT_DTYPE_F16:
        embedding_forward((__half *)out, tokens, (const __half *)wte, (const __half *)wpe, B, T, C, stream);
        break;
    case ZT_DTYPE_BF16:
        embedding_forward((__nv_bfloat16 *)out, tokens, (const __nv_bfloat16 *)wte, (const __nv_bfloat16 *)wpe,
                          B, T, C, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_embedding_forward", dtype);
    }
}

/* Scratch layout: sorted tokens [BT] u32 | positions [BT] i32 | sorted positions [BT] i32 | CUB temp. */
static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static int key_bits(int V)
{
    int bits = 1;
    while (bits < 32 && ((uint32_t)1 << bits) < (uint32_t)V)
        bits++;
    return bits;
}

static size_t cub_temp_bytes(int BT, int V)
{
    size_t bytes = 0;
    ZT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                                  (const int32_t *)NULL, (int32_t *)NULL, BT, 0, key_bits(V)));
    return bytes;
}

extern "C" size_t zt_cuda_embedding_backward_scratch_size(int B, int T, int V)
{
    size_t BT = (size_t)B * T;
    return 3 * align16(BT * sizeof(int32_t)) + align16(cub_temp_bytes((int)BT, V));
}

template <typename T>
static void embedding_backward(T *dwte, T *dwpe, const T *dout, const int32_t *tokens, int B, int T_, int C,
                               int V, void *scratch, cudaStream_t stream)
{
    const int BT = B * T_;
    constexpr int VS = zt_vec<T>::size;
    const int block = 256;

    /* dwpe: independent of the sort. */
    size_t nvec = (size_t)T_ * C / VS;
    wpe_backward_kernel<<<(unsigned)ZT_CEIL_DIV(nvec, (size_t)block), block, 0, stream>>>(dwpe, dout, B, T_, C);
    ZT_CUDA_CHECK_LAUNCH();

    char *s = (char *)scratch;
    uint32_t *sorted_tokens = (uint32_t *)s;
    s += align16((size_t)BT * sizeof(int32_t));
    int32_t *pos = (int32_t *)s;
    s += align16((size_t)BT * sizeof(int32_t));
    int32_t *sorted_pos = (int32_t *)s;
    s += align16((size_t)BT * sizeof(int32_t));
    size_t temp_bytes = cub_temp_bytes(BT, V);

    iota_kernel<<<ZT_CEIL_DIV(BT, block), block, 0, stream>>>(pos, BT);
    ZT_CUDA_CHECK_LAUNCH();
    ZT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s, temp_bytes, (const uint32_t *)tokens, sorted_tokens, pos,
                                                  sorted_pos, BT, 0, key_bits(V), stream));

    /* Threads per block: enough to cover C in one slice where possible (C/VS up to 1024). */
    int threads = C / VS;
    if (threads > 256)
        threads = 256;
    threads = ZT_CEIL_DIV(threads, ZT_WARP_SIZE) * ZT_WARP_SIZE;
    dim3 grid(BT, ZT_CEIL_DIV(C / VS, threads));
    wte_backward_kernel<<<grid, threads, 0, stream>>>(dwte, dout, sorted_tokens, sorted_pos, BT, C);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_embedding_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                           int B, int T, int C, int V, void *scratch, enum zt_dtype dtype,
                                           cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && C > 0 && C % 8 == 0 && V > 0);
    ZT_ASSERT(zt_aligned16(dwte) && zt_aligned16(dwpe) && zt_aligned16(dout) && zt_aligned16(scratch));
    switch (dtype) {
    case ZT_DTYPE_F32:
        embedding_backward((float *)dwte, (float *)dwpe, (const float *)dout, tokens, B, T, C, V, scratch,
                           stream);
        break;
    case ZT_DTYPE_F16:
        embedding_backward((__half *)dwte, (__half *)dwpe, (const __half *)dout, tokens, B, T, C, V, scratch,
                           stream);
        break;
    case ZT_DTYPE_BF16:
        embedding_backward((__nv_bfloat16 *)dwte, (__nv_bfloat16 *)dwpe, (const __nv_bfloat16 *)dout, tokens,
                           B, T, C, V, scratch, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_embedding_backward", dtype);
    }
}
