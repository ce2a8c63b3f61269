/* T5 (Hugging Face T5ForConditionalGeneration and MT5ForConditionalGeneration): an encoder-decoder whose
 * layers are written once against the op table (ops.h), with its Hugging Face config mapping, tensor table
 * and CPU passes.
 *
 * The math, as transformers computes it (dropout is not applied: ztrain trains T5 with dropout 0, whatever
 * dropout_rate the config holds):
 *   norm(x) = w * x / sqrt(mean(x^2) + eps)                     (T5's RMSNorm: no mean, no bias, fp32)
 *   encoder layer: x += o(attention(q, k, v of norm(x)))        (bidirectional, scale 1, relative bias)
 *                  x += wo(act(wi norm(x)))                     (act: ReLU, or gelu_new(wi_0 x) * wi_1 x)
 *   decoder layer: x += o(attention(q, k, v of norm(x)))        (causal, scale 1, its own relative bias)
 *                  x += o'(attention(q' norm(x), k', v' of e))  (cross-attention over the encoder output e,
 *                                                                  no bias, masked by the encoder's padding)
 *                  x += wo(act(wi norm(x)))
 *   e = encoder.final_layer_norm(encoder output); logits = head(s * decoder.final_layer_norm(decoder output))
 * with s = d_model^-0.5 where the config scales the decoder output (T5 v1.0; scale_decoder_outputs, or a tied
 * head in older configs) and 1 otherwise; the head is the shared embedding (tied) or lm_head. Each stack's
 * relative position bias is one table [num_buckets, num_heads] held by its layer 0 and used by every layer of
 * the stack (buckets as T5Attention._relative_position_bucket).
 *
 * Blocks (model.h's order): 0 = the shared embedding; 1..Le = encoder layers (block Le also holds
 * encoder.final_layer_norm); Le+1..Le+Ld = decoder layers; Le+Ld+1 = decoder.final_layer_norm and, untied,
 * lm_head. The head reads the shared embedding (block 0) when tied, else the last block. The encoder output
 * is kept for the decoder layers, which add its gradient from every cross-attention backward before the
 * encoder's backward runs; the bias tables are copied by their layer 0's forward and their gradients summed
 * over the stack's layers and added at layer 0's backward, so that every block reads only its own weights.
 *
 * A micro-batch is set_seq2seq (zt_model_seq2seq: decoder tokens [B,Td], encoder lengths) and then begin with
 * the encoder's tokens [B,T] (padding on the right past each length); targets are [B,T] as begin has them,
 * row b's first Td entries the targets of its decoder positions (Td <= T; -1 ignored, the rest unread). */
#ifndef ZT_WORKER_T5_H
#define ZT_WORKER_T5_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/model.h" /* zt_model_seq2seq */

typedef struct zt_t5_config {
    bool mt5;                   /* model_type "mt5" (MT5ForConditionalGeneration), else "t5" */
    int vocab_size;             /* V */
    int d_model;                /* C */
    int d_kv;                   /* head size, independent of C / num_heads */
    int d_ff;                   /* F, the MLP's width */
    int num_layers;             /* encoder layers */
    int num_decoder_layers;     /* decoder layers */
    int num_heads;              /* NH */
    int num_buckets;            /* relative_attention_num_buckets */
    int max_distance;           /* relative_attention_max_distance */
    float layer_norm_epsilon;
    double initializer_factor;  /* transformers' initialisation scale (1.0) */
    double dropout_rate;        /* kept for the config written back; not applied */
    bool gated;                 /* feed_forward_proj "gated-gelu" (v1.1, FLAN-T5, mT5), else "relu" (v1.0) */
    bool tie_word_embeddings;   /* the head is the shared embedding (no lm_head) */
    bool scale_decoder_outputs; /* the decoder output is scaled by d_model^-0.5 before the head */
    int n_positions;            /* the longest sequence planned for (relative positions have no limit) */
    int pad_token_id;           /* also the decoder start token in T5's configs */
    int eos_token_id;           /* -1: none */
    int decoder_start_token_id;
} zt_t5_config;

/* T5's defaults as transformers' T5Config (t5-small's shape). */
void zt_t5_config_default(zt_t5_config *cfg);

typedef struct zt_t5 zt_t5; /* the host model (family.h's void *m) */

/* A whole forward over one micro-batch (zt_model_seq2seq for the decoder side; targets [B,T] as above or
 * NULL) with the model's own slab;
 * returns the mean loss over the targets that are not -1 (0 without targets). The logits [B,Td,V] stay until
 * the next forward or backward. */
float zt_t5_forward(zt_t5 *m, const int32_t *enc_tokens, int B, int T, const zt_model_seq2seq *s,
                    const int32_t *targets);
/* The backward of the last forward (with targets) into the model's gradient slab, scaled by loss_scale. */
void zt_t5_backward(zt_t5 *m, float loss_scale);
const float *zt_t5_logits(const zt_t5 *m);

#endif
