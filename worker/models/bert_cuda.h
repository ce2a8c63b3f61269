/* BERT and RoBERTa on one CUDA GPU: the device twin of worker/models/bert.h's per-block passes, as the
 * training engine drives them (worker/models/model.h): post-LayerNorm encoder layers with bidirectional
 * attention under each sequence's padding mask, word + position + token-type embeddings, and the masked-LM
 * or the sequence-classification head.
 *
 * The host model (zt_bert) stays the source of truth for the configuration, the tensor table and the file
 * formats; this object holds the activations in the compute dtype (LayerNorm statistics, attention lse and
 * losses in fp32), scratch, the cuBLASLt handle and the model's stream. Device layout: the host slab's
 * tensors in order, each starting on a 64-element boundary except the key and value weights and biases
 * (right after the query's, so that each group stays one packed [3C, C] weight and [3C] bias); the word
 * embeddings and the masked-LM decoder bias are padded to a vocabulary that is a multiple of 128, the
 * classifier's weight and bias to a multiple of 8 labels (padding is zero and its gradients are never read).
 * Blocks as on the CPU: 0 = embeddings, 1..L = layers, L+1 = the head. Padding, token types, counted
 * targets and the loss follow bert.h: a sequence's trailing pad tokens are masked out of attention, and no
 * position whose token is pad_token_id counts.
 *
 * Every device buffer is carved from one allocation made at creation (plus the cuBLASLt workspace). The
 * model offers ->set_token_types, ->accuracy and ->logits. */
#ifndef ZT_WORKER_BERT_CUDA_H
#define ZT_WORKER_BERT_CUDA_H

#include <stdbool.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "worker/models/bert.h"
#include "worker/models/model.h"

/* The device layout of host's model for these sizes with no device state: for planning (see
 * the decoder executor's zt__dec_cuda_shape). Free with ->ops->destroy. */
zt_model *zt_bert_cuda_shape(const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers);

/* Creates the device passes of host's model for micro-batches up to B x T, steps of up to max_micro
 * micro-batches and compute dtype F32, BF16 or F16, on the current CUDA device; ckpt_layers (num_hidden_layers
 * flags, or NULL) as in zt_llama_cuda_create. Returns 0, or ZT_EUNSUPPORTED / ZT_ENOMEM with a message saying
 * what to change. */
int zt_bert_cuda_create(zt_model **out, const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err);

#endif
