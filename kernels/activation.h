/* Activations: GELU with the tanh approximation (GPT-2; Hugging Face's "gelu_new"), GELU in its exact form
 * (BERT's and RoBERTa's "gelu"), SwiGLU (LLaMA's MLP), tanh (BERT's pooler), ReLU (T5's MLP) and gated GELU
 * (T5 v1.1's "gated-gelu" MLP).
 *
 * GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * Exact GELU: x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), PyTorch's nn.GELU() default.
 * SwiGLU over the packed output of one gate-and-up matmul: row n of inp [N,2F] holds the gate in columns
 * 0..F-1 and the up projection in columns F..2F-1, which is what a matmul produces whose weight [2F,C]
 * stacks the gate projection's rows above the up projection's (Hugging Face's gate_proj, then up_proj).
 * out [N,F] = silu(gate) * up, with silu(x) = x sigmoid(x). */
#ifndef ZT_KERNELS_ACTIVATION_H
#define ZT_KERNELS_ACTIVATION_H

#include <stddef.h>

#include "kernels/real.h"

void zt_cpu_gelu_forward(zt_real *out, const zt_real *inp, size_t n);
/* Accumulates (+=) into dinp. */
void zt_cpu_gelu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n);

/* Exact GELU; out may equal inp. */
void zt_cpu_gelu_erf_forward(zt_real *out, const zt_real *inp, size_t n);
/* Accumulates (+=) dout * (Phi(x) + x phi(x)) into dinp, with phi the standard normal density. */
void zt_cpu_gelu_erf_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n);

/* Writes out [N,F] from inp [N,2F] (layout above). */
void zt_cpu_swiglu_forward(zt_real *out, const zt_real *inp, int N, int F);
/* Accumulates (+=) into dinp [N,2F]: dout * up * silu'(gate) into the gate columns, dout * silu(gate) into
 * the up columns. */
void zt_cpu_swiglu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, int N, int F);

/* out = tanh(inp); out may equal inp. */
void zt_cpu_tanh_forward(zt_real *out, const zt_real *inp, size_t n);
/* ReLU, max(x, 0); out may equal inp. The backward accumulates (+=) dout where inp > 0 (PyTorch's gradient 0
 * at 0). */
void zt_cpu_relu_forward(zt_real *out, const zt_real *inp, size_t n);
void zt_cpu_relu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, size_t n);
/* Gated GELU over SwiGLU's layout: out [N,F] = gelu(gate) * up (GELU's tanh form, Hugging Face's T5
 * "gated-gelu": gelu_new(wi_0 x) * wi_1 x with wi_0's rows above wi_1's in one weight). The backward
 * accumulates (+=) into dinp [N,2F]. */
void zt_cpu_geglu_forward(zt_real *out, const zt_real *inp, int N, int F);
void zt_cpu_geglu_backward(zt_real *dinp, const zt_real *inp, const zt_real *dout, int N, int F);

/* Accumulates (+=) dout * (1 - out^2) into dinp: the derivative taken from the forward's output. */
void zt_cpu_tanh_backward(zt_real *dinp, const zt_real *out, const zt_real *dout, size_t n);

#ifdef ZT_WITH_CUDA
/* CUDA twins (kernels/cuda/activation.cu); every buffer holds `dtype` elements (F32, F16 or BF16), arithmetic
 * is fp32. out may equal inp for GELU and tanh. Any sizes; 16-byte aligned buffers (and, for SwiGLU, rows of
 * F elements that are a multiple of 16 bytes) are read 16 bytes at a time. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"

void zt_cuda_gelu_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream);
/* Accumulates (+=) into dinp. */
void zt_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                           cudaStream_t stream);
/* Exact GELU (erff); out may equal inp. */
void zt_cuda_gelu_erf_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream);
/* Accumulates (+=) into dinp. */
void zt_cuda_gelu_erf_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                               cudaStream_t stream);
/* zt_cuda_gelu_erf_backward, except that dinp is overwritten (=): the bits of zeroing it first and adding,
 * without the zeroing and the read. */
void zt_cuda_gelu_erf_backward_overwrite(void *dinp, const void *inp, const void *dout, size_t n,
                                         enum zt_dtype dtype, cudaStream_t stream);
/* ReLU: out may equal inp; the backward accumulates (+=) dout where inp > 0 into dinp. */
void zt_cuda_relu_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream);
void zt_cuda_relu_backward(void *dinp, const void *inp, const void *dout, size_t n, enum zt_dtype dtype,
                           cudaStream_t stream);
/* Gated GELU (layout of SwiGLU, GELU's tanh form): out [N,F] must not overlap inp [N,2F]; the backward
 * accumulates (+=) into dinp [N,2F]. */
void zt_cuda_geglu_forward(void *out, const void *inp, int N, int F, enum zt_dtype dtype, cudaStream_t stream);
void zt_cuda_geglu_backward(void *dinp, const void *inp, const void *dout, int N, int F, enum zt_dtype dtype,
                            cudaStream_t stream);
/* out [N,F] must not overlap inp [N,2F]. */
void zt_cuda_swiglu_forward(void *out, const void *inp, int N, int F, enum zt_dtype dtype, cudaStream_t stream);
/* Accumulates (+=) into dinp [N,2F]. */
void zt_cuda_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F, enum zt_dtype dtype,
                             cudaStream_t stream);
/* zt_cuda_swiglu_backward, except that dinp is overwritten (=): the bits of zeroing it first and adding,
 * without the zeroing and the read. */
void zt_cuda_swiglu_backward_overwrite(void *dinp, const void *inp, const void *dout, int N, int F,
                                       enum zt_dtype dtype, cudaStream_t stream);
void zt_cuda_tanh_forward(void *out, const void *inp, size_t n, enum zt_dtype dtype, cudaStream_t stream);
/* Accumulates (+=) dout * (1 - out^2) into dinp. */
void zt_cuda_tanh_backward(void *dinp, const void *out, const void *dout, size_t n, enum zt_dtype dtype,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* ZT_WITH_CUDA */

#endif
