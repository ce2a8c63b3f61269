/* Naive double-precision references of the CPU kernels, shared by the kernel tests. Each is the textbook
 * formula written as plainly as possible (full attention matrix, no blocking, no threads) so that a
 * reader can check it by eye; the kernels under test are compared against these. Arrays are double;
 * backward references overwrite (=) their outputs rather than accumulate. */
#ifndef ZT_TESTS_KERNEL_REF_H
#define ZT_TESTS_KERNEL_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline void ref_embedding_forward(double *out, const int32_t *tokens, const double *wte, const double *wpe,
                                  int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
}

static inline void ref_embedding_backward(double *dwte, double *dwpe, const double *dout, const int32_t *tokens,
                                   int B, int T, int C, int V)
{
    memset(dwte, 0, sizeof(double) * V * C);
    memset(dwpe, 0, sizeof(double) * T * C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                dwte[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
                dwpe[t * C + c] += dout[(b * T + t) * C + c];
            }
}

/* BERT's embedding: the token + position one plus wtt[types[b,t],:]; dwtt [NTT,C] overwritten. */
static inline void ref_embedding_typed_forward(double *out, const int32_t *tokens, const int32_t *types,
                                               const double *wte, const double *wpe, const double *wtt, int B, int T,
                                               int C)
{
    ref_embedding_forward(out, tokens, wte, wpe, B, T, C);
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++)
            out[bt * C + c] += wtt[types[bt] * C + c];
}

static inline void ref_embedding_types_backward(double *dwtt, const double *dout, const int32_t *types, int B, int T,
                                                int C, int NTT)
{
    memset(dwtt, 0, sizeof(double) * NTT * C);
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++)
            dwtt[types[bt] * C + c] += dout[bt * C + c];
}

static inline void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                                  const double *weight, const double *bias, int N, int C, double eps)
{
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += inp[n * C + c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + eps);
        for (int c = 0; c < C; c++)
            out[n * C + c] = (inp[n * C + c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

static inline void ref_layernorm_backward(double *dinp, double *dweight, double *dbias, const double *dout,
                                   const double *inp, const double *weight, const double *mean,
                                   const double *rstd, int N, int C)
{
    memset(dweight, 0, sizeof(double) * C);
    memset(dbias, 0, sizeof(double) * C);
    for (int n = 0; n < N; n++) {
        double sg = 0, sgx = 0;
        for (int c = 0; c < C; c++) {
            double xhat = (inp[n * C + c] - mean[n]) * rstd[n];
            double g = dout[n * C + c] * weight[c];
            sg += g;
            sgx += g * xhat;
            dweight[c] += dout[n * C + c] * xhat;
            dbias[c] += dout[n * C + c];
        }
        for (int c = 0; c < C; c++) {
            double xhat = (inp[n * C + c] - mean[n]) * rstd[n];
            double g = dout[n * C + c] * weight[c];
            dinp[n * C + c] = rstd[n] * (g - sg / C - xhat * sgx / C);
        }
    }
}

static inline void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *weight, int N,
                                       int C, double eps)
{
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += inp[n * C + c] * inp[n * C + c];
        double s = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++)
            out[n * C + c] = inp[n * C + c] * s * weight[c];
        rstd[n] = s;
    }
}

static inline void ref_rmsnorm_backward(double *dinp, double *dweight, const double *dout, const double *inp,
                                        const double *weight, const double *rstd, int N, int C)
{
    memset(dweight, 0, sizeof(double) * C);
    for (int n = 0; n < N; n++) {
        double sgx = 0;
        for (int c = 0; c < C; c++) {
            sgx += dout[n * C + c] * weight[c] * inp[n * C + c];
            dweight[c] += dout[n * C + c] * inp[n * C + c] * rstd[n];
        }
        for (int c = 0; c < C; c++)
            dinp[n * C + c] = rstd[n] * (dout[n * C + c] * weight[c] - inp[n * C + c] * rstd[n] * rstd[n] * sgx / C);
    }
}

static inline void ref_matmul_forward(double *out, const double *inp, const double *weight, const double *bias,
                               int N, int IC, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++)
                acc += inp[(long)n * IC + i] * weight[(long)o * IC + i];
            out[(long)n * OC + o] = acc;
        }
}

static inline void ref_matmul_backward(double *dinp, double *dweight, double *dbias, const double *dout,
                                const double *inp, const double *weight, int N, int IC, int OC)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double acc = 0;
            for (int o = 0; o < OC; o++)
                acc += dout[(long)n * OC + o] * weight[(long)o * IC + i];
            dinp[(long)n * IC + i] = acc;
        }
    for (int o = 0; o < OC; o++) {
        for (int i = 0; i < IC; i++) {
            double acc = 0;
            for (int n = 0; n < N; n++)
                acc += dout[(long)n * OC + o] * inp[(long)n * IC + i];
            dweight[(long)o * IC + i] = acc;
        }
        double acc = 0;
        for (int n = 0; n < N; n++)
            acc += dout[(long)n * OC + o];
        dbias[o] = acc;
    }
}

/* Materialises the causal softmax matrix P [T,T] of head (b,h). */
static inline void ref_attention_probs(double *P, const double *qkv, int b, int h, int T, int C, int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int t = 0; t < T; t++) {
        double mx = -INFINITY, sum = 0;
        for (int u = 0; u < T; u++) {
            double s = -INFINITY;
            if (u <= t) {
                s = 0;
                for (int i = 0; i < hs; i++)
                    s += qkv[(b * T + t) * 3 * C + h * hs + i] * qkv[(b * T + u) * 3 * C + C + h * hs + i];
                s *= scale;
            }
            P[t * T + u] = s;
            if (s > mx)
                mx = s;
        }
        for (int u = 0; u < T; u++) {
            P[t * T + u] = u <= t ? exp(P[t * T + u] - mx) : 0.0;
            sum += P[t * T + u];
        }
        for (int u = 0; u < T; u++)
            P[t * T + u] /= sum;
    }
}

static inline void ref_attention_forward(double *out, const double *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double *P = malloc(sizeof(double) * T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            ref_attention_probs(P, qkv, b, h, T, C, NH);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += P[t * T + u] * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = acc;
                }
        }
    free(P);
}

static inline void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, int B, int T, int C,
                                   int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *P = malloc(sizeof(double) * T * T);
    double *dP = malloc(sizeof(double) * T * T);
    memset(dqkv, 0, sizeof(double) * B * T * 3 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            ref_attention_probs(P, qkv, b, h, T, C, NH);
            for (int t = 0; t < T; t++)
                for (int u = 0; u < T; u++) {
                    double acc = 0;
                    for (int i = 0; i < hs; i++)
                        acc += dout[(b * T + t) * C + h * hs + i] * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    dP[t * T + u] = acc;
                }
            for (int t = 0; t < T; t++) {
                double dot = 0;
                for (int u = 0; u < T; u++)
                    dot += P[t * T + u] * dP[t * T + u];
                for (int u = 0; u <= t; u++) {
                    double ds = P[t * T + u] * (dP[t * T + u] - dot) * scale;
                    for (int i = 0; i < hs; i++) {
                        dqkv[(b * T + t) * 3 * C + h * hs + i] += ds * qkv[(b * T + u) * 3 * C + C + h * hs + i];
                        dqkv[(b * T + u) * 3 * C + C + h * hs + i] += ds * qkv[(b * T + t) * 3 * C + h * hs + i];
                        dqkv[(b * T + u) * 3 * C + 2 * C + h * hs + i] +=
                            P[t * T + u] * dout[(b * T + t) * C + h * hs + i];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

/* The general attention (kernels/attention.h: grouped-query heads, causal or not, padding lengths) written
 * out with the full probability matrix. qkv [B,T,(NH+2*NKV)*HS]; out [B,T,NH*HS]; padded rows of out are
 * zero. causal: 1 or 0; lens: B lengths or NULL. */
static inline int ref_attention_len(const int32_t *lens, int b, int T)
{
    return !lens ? T : lens[b] < 0 ? 0 : lens[b] > T ? T : lens[b];
}

/* P [T,T] of query head h of sequence b (rows at or past the length stay 0). */
static inline void ref_attention_gqa_probs(double *P, const double *qkv, int b, int h, int T, int NH, int NKV, int HS,
                                           int causal, int len)
{
    long W = (long)(NH + 2 * NKV) * HS;
    int g = h / (NH / NKV);
    double scale = 1.0 / sqrt((double)HS);
    memset(P, 0, sizeof(double) * T * T);
    for (int t = 0; t < len; t++) {
        int kend = causal ? t + 1 : len;
        double mx = -INFINITY, sum = 0;
        for (int u = 0; u < kend; u++) {
            double s = 0;
            for (int i = 0; i < HS; i++)
                s += qkv[(b * T + t) * W + h * HS + i] * qkv[(b * T + u) * W + (long)NH * HS + g * HS + i];
            P[t * T + u] = s * scale;
            mx = fmax(mx, s * scale);
        }
        for (int u = 0; u < kend; u++) {
            P[t * T + u] = exp(P[t * T + u] - mx);
            sum += P[t * T + u];
        }
        for (int u = 0; u < kend; u++)
            P[t * T + u] /= sum;
    }
}

static inline void ref_attention_gqa_forward(double *out, const double *qkv, const int32_t *lens, int B, int T, int NH,
                                             int NKV, int HS, int causal)
{
    long W = (long)(NH + 2 * NKV) * HS, voff = (long)(NH + NKV) * HS;
    double *P = malloc(sizeof(double) * T * T);
    memset(out, 0, sizeof(double) * B * T * NH * HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int len = ref_attention_len(lens, b, T), g = h / (NH / NKV);
            ref_attention_gqa_probs(P, qkv, b, h, T, NH, NKV, HS, causal, len);
            for (int t = 0; t < len; t++)
                for (int i = 0; i < HS; i++) {
                    double acc = 0;
                    for (int u = 0; u < T; u++)
                        acc += P[t * T + u] * qkv[(b * T + u) * W + voff + g * HS + i];
                    out[((long)b * T + t) * NH * HS + h * HS + i] = acc;
                }
        }
    free(P);
}

/* dqkv (overwritten) of the objective sum(out * dout). */
static inline void ref_attention_gqa_backward(double *dqkv, const double *dout, const double *qkv, const int32_t *lens,
                                              int B, int T, int NH, int NKV, int HS, int causal)
{
    long W = (long)(NH + 2 * NKV) * HS, koff = (long)NH * HS, voff = (long)(NH + NKV) * HS, OW = (long)NH * HS;
    double scale = 1.0 / sqrt((double)HS);
    double *P = malloc(sizeof(double) * T * T), *dP = malloc(sizeof(double) * T * T);
    memset(dqkv, 0, sizeof(double) * B * T * W);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int len = ref_attention_len(lens, b, T), g = h / (NH / NKV);
            ref_attention_gqa_probs(P, qkv, b, h, T, NH, NKV, HS, causal, len);
            for (int t = 0; t < len; t++)
                for (int u = 0; u < len; u++) {
                    double acc = 0;
                    for (int i = 0; i < HS; i++)
                        acc += dout[(b * T + t) * OW + h * HS + i] * qkv[(b * T + u) * W + voff + g * HS + i];
                    dP[t * T + u] = acc;
                }
            for (int t = 0; t < len; t++) {
                double dot = 0;
                for (int u = 0; u < len; u++)
                    dot += P[t * T + u] * dP[t * T + u];
                for (int u = 0; u < len; u++) {
                    if (P[t * T + u] == 0.0)
                        continue; /* masked */
                    double ds = P[t * T + u] * (dP[t * T + u] - dot) * scale;
                    for (int i = 0; i < HS; i++) {
                        dqkv[(b * T + t) * W + h * HS + i] += ds * qkv[(b * T + u) * W + koff + g * HS + i];
                        dqkv[(b * T + u) * W + koff + g * HS + i] += ds * qkv[(b * T + t) * W + h * HS + i];
                        dqkv[(b * T + u) * W + voff + g * HS + i] += P[t * T + u] * dout[(b * T + t) * OW + h * HS + i];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

static inline double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static inline double ref_gelu_grad(double x)
{
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    double th = tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

/* Exact GELU, x Phi(x), and its derivative Phi(x) + x phi(x). */
static inline double ref_gelu_erf(double x)
{
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

static inline double ref_gelu_erf_grad(double x)
{
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

static inline double ref_sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* SwiGLU over inp [N,2F] (gate | up per row) into out [N,F]. */
static inline void ref_swiglu_forward(double *out, const double *inp, int N, int F)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            double g = inp[(long)n * 2 * F + f], u = inp[(long)n * 2 * F + F + f];
            out[(long)n * F + f] = g * ref_sigmoid(g) * u;
        }
}

static inline void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int F)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            double g = inp[(long)n * 2 * F + f], u = inp[(long)n * 2 * F + F + f], d = dout[(long)n * F + f];
            double s = ref_sigmoid(g);
            dinp[(long)n * 2 * F + f] = d * u * (s + g * s * (1.0 - s));
            dinp[(long)n * 2 * F + F + f] = d * g * s;
        }
}

/* RoPE ("rotate_half") on the query and key heads of qkv [B,T,(NH+2*NKV)*HS], in place, by sign * angle.
 * fp32_angle: the angle is pos * inv_freq rounded to fp32 (the float build and the GPU), else exact. */
static inline void ref_rope(double *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int HS, int rot,
                            int pos0, double sign, int fp32_angle)
{
    int half = rot / 2; /* channels rot .. HS-1 pass through */
    long stride = (long)(NH + 2 * NKV) * HS;
    for (long r = 0; r < (long)B * T; r++) {
        int pos = pos0 + (int)(r % T);
        for (int h = 0; h < NH + NKV; h++)
            for (int i = 0; i < half; i++) {
                double ang = fp32_angle ? (double)((float)pos * inv_freq[i]) : (double)pos * inv_freq[i];
                double c = cos(ang), s = sign * sin(ang);
                double *x = qkv + r * stride + (long)h * HS;
                double x0 = x[i], x1 = x[i + half];
                x[i] = x0 * c - x1 * s;
                x[i + half] = x1 * c + x0 * s;
            }
    }
}

/* Losses and (grad_scale-weighted) dlogits of softmax cross-entropy; returns the non-ignored row count. */
static inline int ref_crossentropy(double *losses, double *dlogits, const double *logits, const int32_t *targets,
                            int N, int V, int ignore_index, double grad_scale)
{
    int counted = 0;
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_index) {
            losses[n] = 0;
            for (int v = 0; v < V; v++)
                dlogits[n * V + v] = 0;
            continue;
        }
        counted++;
        double mx = logits[n * V];
        for (int v = 1; v < V; v++)
            mx = fmax(mx, logits[n * V + v]);
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += exp(logits[n * V + v] - mx);
        losses[n] = mx + log(sum) - logits[n * V + targets[n]];
        for (int v = 0; v < V; v++)
            dlogits[n * V + v] = grad_scale * (exp(logits[n * V + v] - mx) / sum - (v == targets[n]));
    }
    return counted;
}

/* One AdamW step as PyTorch's torch.optim.AdamW (foreach=False) computes it, in double:
 * param *= 1 - lr*wd; m, v updated; param -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
static inline void ref_adamw_step(double *param, double *m, double *v, const double *grad, size_t n, double lr,
                           double beta1, double beta2, double eps, double wd, double grad_scale, int step)
{
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    for (size_t i = 0; i < n; i++) {
        double g = grad[i] * grad_scale;
        param[i] *= 1.0 - lr * wd;
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
        double denom = sqrt(v[i]) / sqrt(bc2) + eps;
        param[i] -= (lr / bc1) * m[i] / denom;
    }
}

#endif
