/* A model as the training engine sees it: a list of blocks, each one flat buffer
 * of parameters, with a forward and a backward pass per block, on one backend (the CPU or a CUDA GPU).
 *
 * The model holds activations and scratch only. The engine (worker/engine/engine.h) owns every parameter,
 * gradient and optimizer buffer: it hands each pass the block's gathered weights and the buffer that
 * receives the block's gradients, and it decides the order of the calls. A model never calls the engine.
 *
 * One training micro-batch, as the engine drives it (nb = nblocks, h = head_block):
 *   begin(tokens, targets, docs)
 *   forward(b, w[b])        for b = 0 .. nb-1   (then discard(b) for checkpointed blocks)
 *   head(w[h], scale)       logits and the loss; with scale != 0 also the logits' gradient
 *   head_backward(w[h], g[h])
 *   backward(b, w[b], g[b]) for b = nb-1 .. 0   (a checkpointed block runs forward(b, w[b]) again first)
 * Evaluation: begin, the forwards, head(w[h], 0). Gradients are added (+=) into g[b] in the model's
 * gradient dtype (the compute dtype), scaled by `scale` (the loss scale times the micro-batch's weight)
 * and divided by the number of counted targets; g[h] receives the head's part first and keeps it until
 * backward(h). Calls only enqueue work on a GPU: they return before the kernels run, on the model's
 * stream (zt_model.stream).
 *
 * Layout. Tensor i of the model lives in block tensors[i].block at element tensors[i].offset of the
 * model's layout (blocks are contiguous in block order: block b is [block_offset[b], block_offset[b] +
 * block_len[b])); the host model (worker/models/gpt2.h) keeps the same tensor at host_offset of its own
 * slab, which checkpoints and exports use. On the CPU the two layouts are the same; on a GPU tensors
 * start on 64-element boundaries and the embedding may have padding rows that stay zero. */
#ifndef ZT_WORKER_MODELS_MODEL_H
#define ZT_WORKER_MODELS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h" /* enum zt_dtype */

/* Where the model computes. */
enum zt_model_backend { ZT_MODEL_CPU = 0, ZT_MODEL_CUDA = 1 };

/* One parameter tensor in both layouts. */
typedef struct zt_model_tensor {
    int block;           /* the block that owns it */
    size_t offset;       /* first element in the model's layout (from the start of block 0) */
    size_t len;          /* elements it takes in the model's layout (numel, or more for padding rows) */
    size_t host_offset;  /* first element in the host model's slab */
    size_t numel;        /* elements that hold values (the host tensor's size) */
    bool weight_decay;   /* AdamW decays it (not biases and norms) */
} zt_model_tensor;

typedef struct zt_model zt_model;

/* The documents of a packed micro-batch (supervised fine-tuning's --sft-pack): each row of T tokens holds
 * several documents end to end, and each document is computed exactly as if it were a row of its own:
 * attention stays inside it and its positions (rotary angles, learned positions) restart at 0. One array
 * says it all: pos [B,T] (host memory, read during begin) is each token's position in its document; a row
 * starts a document (pos 0), and every other token either starts one (0) or continues the one before it
 * (its pos + 1). Padding at the end of a row continues the row's last document, which no token before it
 * sees (so it changes nothing; its targets are -1). A NULL docs is one document a row, positions 0..T-1. */
typedef struct zt_model_docs {
    const int32_t *pos; /* [B*T] */
} zt_model_docs;

/* The decoder side of a sequence-to-sequence micro-batch (T5), for the begin that follows set_seq2seq: begin's
 * tokens [B,T] are then the encoder's input; its targets stay [B,T], row b's first Td entries the targets of
 * its decoder positions (Td <= T; the rest unread), and the loss is over the decoder's positions.
 * decoder_tokens are the targets shifted right behind the decoder's start token. Pointers are the caller's; begin copies them. */
typedef struct zt_model_seq2seq {
    const int32_t *decoder_tokens; /* [B,Td] */
    int Td;                        /* decoder positions, 1 .. begin's T */
    const int32_t *encoder_lens;   /* [B] valid encoder tokens (padding on the right), or NULL: all T */
} zt_model_seq2seq;

typedef struct zt_model_ops {
    /* Frees the model (after its stream is done). */
    void (*destroy)(zt_model *m);
    /* Starts a micro-batch over tokens and targets [B,T] (host arrays; targets -1 are ignored; targets may
     * be NULL for a forward without a loss). `micro` numbers the micro-batches of a step from 0 (losses
     * are kept per micro-batch until read). docs: NULL, or the packed documents of the rows (read during
     * the call); a model without packing (BERT) aborts on one, which the config refuses before. */
    void (*begin)(zt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T, int micro,
                  const zt_model_docs *docs);
    /* Block b's forward from the previous block's output, with its weights at w. */
    void (*forward)(zt_model *m, int b, const void *w);
    /* Drops block b's intermediate activations after its forward (checkpointed blocks keep their output);
     * the next forward(b) rebuilds them: what block b's backward reads, which need not include the kept
     * output (begin() forgets every discard). */
    void (*discard)(zt_model *m, int b);
    /* The head (logits from the last block's output with head_block's weights) and the loss of every
     * position; scale != 0 also turns the logits into their gradient, scaled by scale / counted targets. */
    void (*head)(zt_model *m, const void *w, float scale);
    /* The head's backward: adds its weight gradients into g (head_block's gradient buffer) and leaves
     * the gradient of the last block's output for backward. */
    void (*head_backward)(zt_model *m, const void *w, void *g);
    /* Block b's backward: adds its weight gradients into g; w may be NULL where backward_reads_weights[b]
     * is false. */
    void (*backward)(zt_model *m, int b, const void *w, void *g);
    /* After the model's stream is done (the engine waits for it): the mean loss of micro-batch `micro`
     * over its counted positions (0 when none counted), summed in double and rounded to float. */
    float (*loss)(const zt_model *m, int micro);
    /* Optional (NULL for models without token types): token types [B,T] for the next begin, which copies
     * them (NULL: type 0 everywhere); every begin forgets them. */
    void (*set_token_types)(zt_model *m, const int32_t *types);
    /* Optional (NULL for models that are not sequence-to-sequence; required for those that are): the decoder
     * side of the next begin (zt_model_seq2seq, copied); every begin forgets it. */
    void (*set_seq2seq)(zt_model *m, const zt_model_seq2seq *s);
    /* Optional (NULL for models that do not count): after the head of an evaluation micro-batch (scale 0)
     * and the stream, the counted rows of micro-batch `micro` and how many of them have their target as the
     * highest logit (the first highest, on a tie). */
    void (*accuracy)(zt_model *m, int micro, int *correct, int *counted);
    /* Optional (NULL where not offered): copies the logits of the last head, which was called with scale 0,
     * into out [B,T,V] as fp32 (after waiting for the model's stream): for interop checks and generation. */
    void (*logits)(zt_model *m, float *out);
    /* Optional (NULL where not offered): times the kernel families while on, and logs what was timed. */
    void (*set_profiling)(zt_model *m, bool on);
    void (*profile_report)(zt_model *m);
} zt_model_ops;

struct zt_model {
    const zt_model_ops *ops;
    enum zt_model_backend backend;
    enum zt_dtype dtype;          /* compute dtype: weights the passes read and gradients they write */
    int nblocks;
    int head_block;               /* the block whose weights the head reads (the tied embedding in GPT-2) */
    const size_t *block_offset;   /* [nblocks] elements, model layout */
    const size_t *block_len;      /* [nblocks] elements, model layout (a multiple of 64 on a GPU) */
    const bool *checkpointed;     /* [nblocks] blocks that discard their activations after forward */
    const bool *backward_reads_weights; /* [nblocks] */
    int ntensors;
    const zt_model_tensor *tensors; /* [ntensors], in layout order */
    size_t host_numel;            /* elements of the host model's slab */
    int max_B, max_T, max_micro;  /* the largest micro-batch and micro-batches per step it was made for */
    void *stream;                 /* cudaStream_t of its kernels; NULL on the CPU */
    int *nonfinite_flag;          /* GPU: a device int that the step's first begin zeroes and every head sets
                                     when a loss is inf or NaN (the engine adds its own checks); NULL on the CPU */
    size_t device_bytes;          /* bytes of device memory it holds (activations, scratch); 0 on the CPU */
};

#endif
