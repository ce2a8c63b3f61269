/* Token + position (+ token type) embedding on the GPU (kernels/embedding.h).
 *
 * Backward without float atomics: the B*T positions are sorted by token with CUB's stable radix sort
 * (keys: token ids, values: positions 0..B*T-1), so each token's positions end up contiguous and in
 * increasing order. One block per sorted position checks whether it starts a run of equal tokens; the
 * block that does sums the run's rows of dout in order and adds them to that token's row of dwte. The
 * result does not depend on scheduling, and no host synchronisation is needed.
 *
 * Token types (BERT: 2 of them) take the other route of a small table: every position is read once by a
 * fixed grid of slices of positions x strips of columns; a thread keeps one fp32 sum per type for its
 * columns in shared memory, walking its slice in position order, and writes them as the slice's partial
 * rows; a second kernel adds the slices in order. */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/embedding.h"

/* types and wtt are NULL without token types; wpe is NULL without learned positions (LLaMA). */
template <typename T>
static __global__ void embedding_forward_kernel(T *__restrict__ out, const int32_t *__restrict__ tokens,
                                                const int32_t *__restrict__ types, const T *__restrict__ wte,
                                                const T *__restrict__ wpe, const T *__restrict__ wtt, int B,
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
    zt_vec<T> p;
    if (wpe)
        p = zt_load_vec(wpe + (size_t)t * C + c);
    else
        for (int k = 0; k < VS; k++)
            p.v[k] = zt_from_float<T>(0.0f);
    zt_vec<T> o;
    if (types) {
        zt_vec<T> y = zt_load_vec(wtt + (size_t)types[bt] * C + c);
        for (int k = 0; k < VS; k++)
            o.v[k] = zt_from_float<T>((zt_to_float(a.v[k]) + zt_to_float(y.v[k])) + zt_to_float(p.v[k]));
    } else {
        for (int k = 0; k < VS; k++)
            o.v[k] = zt_from_float<T>(zt_to_float(a.v[k]) + zt_to_float(p.v[k]));
    }
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

/* The token-type gradient's partial sums: block (strip, slice) covers the VS-column groups of strip
 * blockIdx.x (thread i: columns (strip * EMB_TT_THREADS + i) * VS..) over the positions of slice blockIdx.y,
 * in order, and writes rows partials[slice][type][C]. Shared sums laid out [type][k][thread]: each thread
 * owns its own words (no barrier), and a warp's accesses fall in 32 different banks. */
#define EMB_TT_THREADS 64
#define EMB_TT_SLICES 128  /* at most this many slices of positions */
#define EMB_TT_MIN_ROWS 64 /* and at least this many positions in each */

template <typename T>
static __global__ void __launch_bounds__(EMB_TT_THREADS)
    wtt_partial_kernel(float *__restrict__ partials, const T *__restrict__ dout, const int32_t *__restrict__ types,
                       int BT, int C, int NTT, int rows_per_slice)
{
    constexpr int VS = zt_vec<T>::size;
    extern __shared__ float sums[]; /* [NTT][VS][EMB_TT_THREADS] */
    const int c = (blockIdx.x * EMB_TT_THREADS + threadIdx.x) * VS;
    if (c >= C)
        return;
    float *mine = sums + threadIdx.x;
    for (int i = 0; i < NTT * VS; i++)
        mine[i * EMB_TT_THREADS] = 0.0f;
    const int r0 = blockIdx.y * rows_per_slice, r1 = min(BT, r0 + rows_per_slice);
    for (int r = r0; r < r1; r++) {
        const int y = types[r];
        zt_vec<T> d = zt_load_vec(dout + (size_t)r * C + c);
        for (int k = 0; k < VS; k++)
            mine[(y * VS + k) * EMB_TT_THREADS] += zt_to_float(d.v[k]);
    }
    for (int y = 0; y < NTT; y++)
        for (int k = 0; k < VS; k++)
            partials[((size_t)blockIdx.y * NTT + y) * C + c + k] = mine[(y * VS + k) * EMB_TT_THREADS];
}

/* dwtt[y,c] += sum over slices, in order, of partials[slice][y][c]. One thread per element of dwtt. */
template <typename T>
static __global__ void wtt_reduce_kernel(T *__restrict__ dwtt, const float *__restrict__ partials, int slices,
                                         int NTT, int C)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= NTT * C)
        return;
    float acc = 0.0f;
    for (int s = 0; s < slices; s++)
        acc += partials[(size_t)s * NTT * C + i];
    dwtt[i] = zt_from_float<T>(zt_to_float(dwtt[i]) + acc);
}

static int wtt_slices(int BT)
{
    int s = ZT_CEIL_DIV(BT, EMB_TT_MIN_ROWS);
    return s > EMB_TT_SLICES ? EMB_TT_SLICES : s;
}

template <typename T>
static void embedding_forward(T *out, const int32_t *tokens, const int32_t *types, const T *wte, const T *wpe,
                              const T *wtt, int B, int T_, int C, cudaStream_t stream)
{
    const int block = 256;
    size_t nvec = (size_t)B * T_ * C / zt_vec<T>::size;
    embedding_forward_kernel<<<(unsigned)ZT_CEIL_DIV(nvec, (size_t)block), block, 0, stream>>>(out, tokens, types,
                                                                                             wte, wpe, wtt, B, T_, C);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_embedding_forward_typed(void *out, const int32_t *tokens, const int32_t *types,
                                                const void *wte, const void *wpe, const void *wtt, int B, int T,
                                                int C, enum zt_dtype dtype, cudaStream_t stream)
{
    ZT_ASSERT(B > 0 && T > 0 && C > 0 && C % 8 == 0);
    ZT_ASSERT(zt_aligned16(out) && zt_aligned16(wte) && zt_aligned16(wpe));
    ZT_ASSERT(types == NULL || zt_aligned16(wtt));
    switch (dtype) {
    case ZT_DTYPE_F32:
        embedding_forward((float *)out, tokens, types, (const float *)wte, (const float *)wpe, (const float *)wtt, B,
                          T, C, stream);
        break;
    case ZT_DTYPE_F16:
        embedding_forward((__half *)out, tokens, types, (const __half *)wte, (const __half *)wpe, (const __half *)wtt,
                          B, T, C, stream);
        break;
    case ZT_DTYPE_BF16:
        embedding_forward((__nv_bfloat16 *)out, tokens, types, (const __nv_bfloat16 *)wte, (const __nv_bfloat16 *)wpe,
                          (const __nv_bfloat16 *)wtt, B, T, C, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_embedding_forward", dtype);
    }
}

extern "C" void zt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                          int B, int T, int C, enum zt_dtype dtype, cudaStream_t stream)
{
    zt_cuda_embedding_forward_typed(out, tokens, NULL, wte, wpe, NULL, B, T, C, dtype, stream);
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

/* CUB's scratch bytes for sorting BT (token, position) pairs of a vocabulary of V, into *bytes. */
static cudaError_t cub_query(int BT, int V, size_t *bytes)
{
    return cub::DeviceRadixSort::SortPairs(NULL, *bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                           (const int32_t *)NULL, (int32_t *)NULL, BT, 0, key_bits(V));
}

static size_t cub_temp_bytes(int BT, int V)
{
    size_t bytes = 0;
    ZT_CUDA_CHECK(cub_query(BT, V, &bytes));
    return bytes;
}

/* cub_temp_bytes for the scratch's size, also where no GPU is visible to ask (a plan made for another machine's,
 * `ztrain train --plan-only`): the sort's second buffers of the keys and values and 1 MiB for its histograms. */
static size_t cub_temp_bytes_planned(int BT, int V)
{
    size_t bytes = 0;
    const cudaError_t rc = cub_query(BT, V, &bytes);
    if (rc == cudaSuccess)
        return bytes;
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
        ZT_CUDA_CHECK(rc); /* a GPU is there: the query's failure is an error */
    cudaGetLastError();
    return 2 * (size_t)BT * (sizeof(uint32_t) + sizeof(int32_t)) + ((size_t)1 << 20);
}

extern "C" size_t zt_cuda_embedding_backward_scratch_size(int B, int T, int V)
{
    size_t BT = (size_t)B * T;
    return 3 * align16(BT * sizeof(int32_t)) + align16(cub_temp_bytes_planned((int)BT, V));
}

template <typename T>
static void embedding_backward(T *dwte, T *dwpe, const T *dout, const int32_t *tokens, int B, int T_, int C,
                               int V, void *scratch, cudaStream_t stream)
{
    const int BT = B * T_;
    constexpr int VS = zt_vec<T>::size;
    const int block = 256;

    /* dwpe: independent of the sort (none without learned positions). */
    if (dwpe) {
        size_t nvec = (size_t)T_ * C / VS;
        wpe_backward_kernel<<<(unsigned)ZT_CEIL_DIV(nvec, (size_t)block), block, 0, stream>>>(dwpe, dout, B, T_,
                                                                                             C);
        ZT_CUDA_CHECK_LAUNCH();
    }

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

extern "C" size_t zt_cuda_embedding_backward_typed_scratch_size(int B, int T, int C, int V, int NTT)
{
    return zt_cuda_embedding_backward_scratch_size(B, T, V) +
           align16((size_t)wtt_slices(B * T) * NTT * C * sizeof(float));
}

template <typename T>
static void wtt_backward(T *dwtt, const T *dout, const int32_t *types, int BT, int C, int NTT, float *partials,
                         cudaStream_t stream)
{
    const int slices = wtt_slices(BT);
    dim3 grid(ZT_CEIL_DIV(C / zt_vec<T>::size, EMB_TT_THREADS), slices);
    const size_t smem = (size_t)NTT * zt_vec<T>::size * EMB_TT_THREADS * sizeof(float);
    wtt_partial_kernel<T><<<grid, EMB_TT_THREADS, smem, stream>>>(partials, dout, types, BT, C, NTT,
                                                                  ZT_CEIL_DIV(BT, slices));
    ZT_CUDA_CHECK_LAUNCH();
    wtt_reduce_kernel<T><<<ZT_CEIL_DIV(NTT * C, 256), 256, 0, stream>>>(dwtt, partials, slices, NTT, C);
    ZT_CUDA_CHECK_LAUNCH();
}

extern "C" void zt_cuda_embedding_backward_typed(void *dwte, void *dwpe, void *dwtt, const void *dout,
                                                 const int32_t *tokens, const int32_t *types, int B, int T, int C,
                                                 int V, int NTT, void *scratch, enum zt_dtype dtype,
                                                 cudaStream_t stream)
{
    ZT_ASSERT(NTT > 0 && NTT <= ZT_CUDA_EMBEDDING_MAX_TYPES);
    zt_cuda_embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, scratch, dtype, stream);
    float *partials = (float *)((char *)scratch + zt_cuda_embedding_backward_scratch_size(B, T, V));
    switch (dtype) {
    case ZT_DTYPE_F32:
        wtt_backward((float *)dwtt, (const float *)dout, types, B * T, C, NTT, partials, stream);
        break;
    case ZT_DTYPE_F16:
        wtt_backward((__half *)dwtt, (const __half *)dout, types, B * T, C, NTT, partials, stream);
        break;
    case ZT_DTYPE_BF16:
        wtt_backward((__nv_bfloat16 *)dwtt, (const __nv_bfloat16 *)dout, types, B * T, C, NTT, partials, stream);
        break;
    default:
        ZT_CUDA_BAD_DTYPE("zt_cuda_embedding_backward_typed", dtype);
    }
}
