/* The encoder-only transformer, written once: the layer program of BERT and RoBERTa over the operations of a
 * backend (ops.h), its embeddings and task heads, the layout of its activations, and its CPU runner.
 *
 * A family describes its model as an architecture (zt__enc_arch, from its config): sizes, the GELU of the
 * layers and of the masked-LM transform, the task head, where position 0 sits in the position table, and
 * which tensor of its table plays each role. The program is then the same for every backend:
 *   embeddings: enc = LN(word[token] + position[pos_row0 + t] + type[token type])
 *   layer (post-LN): qkv = x Wqkv^T + bqkv; a = attention(qkv), bidirectional, each sequence's trailing
 *     padding masked out; res1 = x + a Wo^T + bo; ln1 = LN1(res1); h = ln1 Wup^T + bup; act = gelu(h);
 *     res2 = ln1 + act Wdown^T + bdown; out = LN2(res2)
 *   masked-LM head: tr = LN(gelu(x Wd^T + bd)); logits = tr word^T + bias (the decoder tied to the words)
 *   classification head: pooled = tanh(x[:, 0] Wp^T + bp); logits = pooled Wc^T + bc
 * (q, k and v are one packed weight and one packed bias). GELU is the exact x Phi(x) or its tanh form; the
 * tanh form rides in the GEMM's epilogue on CUDA, and the residuals do in every case.
 *
 * The CPU runner (zt__enc_cpu) holds one micro-batch's activations in fp32 and runs the program with the CPU
 * binding: its entries are the host model's per-block passes (host_model.h: zt__hm_passes). The CUDA
 * executor (encoder_cuda.c) runs the same program with the CUDA binding. Padding, token types and the
 * counted targets follow bert.h. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_ENCODER_H
#define ZT_WORKER_MODELS_ENCODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/ops.h"
#include "worker/models/params.h"

enum zt__enc_act { ZT__ENC_GELU_ERF = 0, ZT__ENC_GELU_TANH = 1 };
enum zt__enc_head { ZT__ENC_HEAD_MLM = 0, ZT__ENC_HEAD_CLASSIFY = 1 };

/* The tensors by what the program does with them: the embeddings' (block 0), a layer's, the head's (the
 * dense layer is the masked-LM transform or the pooler; the output layer is the decoder, whose weight is the
 * word embeddings and whose bias the head block keeps, or the classifier). */
enum zt__enc_emb_role {
    ZT__ENC_E_WORD, ZT__ENC_E_POS, ZT__ENC_E_TYPE, ZT__ENC_E_LN_W, ZT__ENC_E_LN_B, ZT__ENC_E_ROLES
};
enum zt__enc_role {
    ZT__ENC_QKV_W, ZT__ENC_QKV_B, ZT__ENC_O_W, ZT__ENC_O_B, ZT__ENC_LN1_W, ZT__ENC_LN1_B,
    ZT__ENC_UP_W, ZT__ENC_UP_B, ZT__ENC_DOWN_W, ZT__ENC_DOWN_B, ZT__ENC_LN2_W, ZT__ENC_LN2_B,
    ZT__ENC_ROLES
};
enum zt__enc_head_role {
    ZT__ENC_H_DENSE_W, ZT__ENC_H_DENSE_B, ZT__ENC_H_LN_W, ZT__ENC_H_LN_B, ZT__ENC_H_BIAS, ZT__ENC_H_OUT_W,
    ZT__ENC_H_OUT_B, ZT__ENC_H_ROLES
};

#define ZT__ENC_MAX_PER_LAYER 16

typedef struct zt__enc_arch {
    int L, C, NH, F, V;          /* layers, width, heads, MLP width, vocabulary */
    int types;                   /* rows of the token-type table */
    float eps;
    enum zt__enc_act act;        /* the layers' GELU */
    enum zt__enc_act head_act;   /* the masked-LM transform's */
    enum zt__enc_head head;
    int K;                       /* outputs per scored row: V (masked LM) or the labels */
    int pos_row0;                /* the position table's row of position 0 (RoBERTa: pad_token_id + 1) */
    int pad_token_id;            /* trailing runs of it are padding; no position holding it counts in a loss */
    /* From the tensor table's roles (the host model fills them after the family's enc_arch): */
    int emb[ZT__ENC_E_ROLES];    /* each role's tensor in the table (block 0) */
    int layer0, per_layer;       /* index of layer 0's first tensor; tensors per layer */
    int role[ZT__ENC_ROLES];     /* each role's tensor within a layer (0 .. per_layer-1) */
    bool packed[ZT__ENC_MAX_PER_LAYER]; /* tensor k of a layer continues the one before it on the device (k
                                           and v after q: parts of the packed weight and bias) */
    int head_t[ZT__ENC_H_ROLES]; /* each role's tensor in the table, -1 when the head has none; the output
                                    layer's in the head block (the word embeddings for masked LM) */
    int head_block;              /* the block the head pass reads: 0 (masked LM) or L+1 */
} zt__enc_arch;

/* Rows the head scores: every position (masked LM) or every sequence (classification). */
int zt__enc_rows(const zt__enc_arch *a, int B, int T);

/* What a layer keeps for its backward, in elements of the backend's type (the statistics in fp32). */
typedef struct zt__enc_acts {
    void *qkv, *atty, *res1, *ln1, *h, *act, *res2, *out;
    float *lse, *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
} zt__enc_acts;

/* The embeddings' and the head's activations and gradients (masked LM: tr_* to ddec_bias; classification:
 * first to dfirst; ddec_bias, dpooled and dfirst are gradients). */
typedef struct zt__enc_ends {
    void *emb, *enc;              /* [N,C] the embeddings' sum and block 0's output */
    float *emb_mean, *emb_rstd;   /* [N] */
    void *tr_pre, *tr_act, *tr_ln; /* [N,C] the transform before and after its GELU, after its LayerNorm */
    float *tr_mean, *tr_rstd;     /* [N] */
    void *dec_bias, *ddec_bias;   /* [Kp] the decoder bias (copied from the head block for the head pass) */
    void *first, *pool_pre, *pooled, *dpooled, *dpool_pre, *dfirst; /* [B,C] */
    void *logits;                 /* [rows, Kp]; their gradient after the loss's backward */
} zt__enc_ends;

/* The gradients one layer's backward works in, shared by all layers and the ends. dres holds d(block
 * output) on entry and d(block input) on return. */
typedef struct zt__enc_work {
    void *dres, *dln, *datty, *dtmp; /* [N,C] */
    void *dqkv;                      /* [N,3C] */
    void *dh, *dact;                 /* [N,F] */
} zt__enc_work;

/* Carving a layer's, the ends' and the work's buffers from base at *used for N rows of esize-byte elements,
 * every buffer aligned to `align` bytes (base NULL: only counts; decoder.h's zt__dec_take). A layer's parts:
 * inner, everything before res2 (what checkpointed layers share); sum, res2 and LN2's statistics; out. The
 * ends for batches of B sequences of N rows in all, logits [rows, Kp]. */
void zt__enc_carve_acts(const zt__enc_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__enc_acts *s, bool inner, bool sum, bool out);
void zt__enc_carve_ends(const zt__enc_arch *a, size_t B, size_t N, int Kp, size_t esize, size_t align, char *base,
                        size_t *used, zt__enc_ends *e);
void zt__enc_carve_work(const zt__enc_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__enc_work *k);

/* A block's tensors (weights or gradients) by role, NULL where absent. */
typedef struct zt__enc_w {
    const void *t[ZT__ENC_ROLES];
} zt__enc_w;
typedef struct zt__enc_g {
    void *t[ZT__ENC_ROLES];
} zt__enc_g;

/* ---- the program ----
 * B x T rows; tokens, types and lens ([B] tokens before each sequence's trailing padding) are the binding's
 * memory; Kp is the decoder's or the classifier's row count as the backend lays it out (K on the CPU,
 * padded on CUDA). */

/* Block 0: e->enc from the tokens and their types; the backward adds into g from work->dres. */
void zt__enc_embed_forward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                           const int32_t *tokens, const int32_t *types, int B, int T);
void zt__enc_embed_backward(const zt_ops *o, const zt__enc_arch *a, const zt__enc_ends *e, const zt__enc_w *w,
                            const zt__enc_g *g, zt__enc_work *k, const int32_t *tokens, const int32_t *types, int B,
                            int T);
/* A layer's forward from x into s; kept_sum: a rebuild of a layer that kept res2 and LN2's statistics, which
 * stops after the MLP's activation. */
void zt__enc_layer_forward(const zt_ops *o, const zt__enc_arch *a, const zt__enc_w *w, const void *x,
                           zt__enc_acts *s, const int32_t *lens, int B, int T, bool kept_sum);
/* A layer's output from its sum: s->out = LN2(s->res2) with LN2's weight and bias, over N rows. */
void zt__enc_layer_output(const zt_ops *o, const zt__enc_arch *a, zt__enc_acts *s, const void *ln_w,
                          const void *ln_b, int N);
/* A layer's backward: work->dres from d(out) to d(x); the weight gradients are added into g. */
void zt__enc_layer_backward(const zt_ops *o, const zt__enc_arch *a, const zt__enc_w *w, const zt__enc_g *g,
                            const void *x, const zt__enc_acts *s, zt__enc_work *k, const int32_t *lens, int B, int T);
/* Block L+1 up to the output layer (the transform and the decoder bias's copy, or the pooler), from the
 * encoder's output x; its backward from the output layer's input gradient (work->dln for masked LM,
 * e->dpooled) into work->dres, adding the decoder bias's gradient into its tensor. w and g by head role. */
void zt__enc_head_forward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                          const void *x, int B, int T, int Kp);
void zt__enc_head_backward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                           const zt__enc_g *g, const void *x, zt__enc_work *k, int B, int T, int Kp);
/* The output layer: e->logits from the head block's output weight and bias (by head role: the decoder's bias
 * is e->dec_bias); its backward from the logits' gradient into g and the output layer's input gradient. */
void zt__enc_logits(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w, int B, int T,
                    int Kp);
void zt__enc_logits_backward(const zt_ops *o, const zt__enc_arch *a, zt__enc_ends *e, const zt__enc_w *w,
                             const zt__enc_g *g, zt__enc_work *k, int B, int T, int Kp);

/* ---- a micro-batch's inputs, as every executor stages them (host memory) ---- */

/* Copies tokens [B,T] (each below V) into tok and types (each below a->types; NULL: all 0) into typ, and
 * writes lens [B]: each sequence's length before its trailing run of pad tokens. */
void zt__enc_stage(const zt__enc_arch *a, const int32_t *tokens, const int32_t *types, int B, int T, int32_t *tok,
                   int32_t *typ, int32_t *lens);
/* Writes out [zt__enc_rows] the counted targets of targets [B,T] (NULL: none): masked LM, the target of each
 * position; classification, each sequence's label at its first position (every other position -1); -1 at
 * a position whose token is the pad token. Returns how many count. Targets out of range are caller bugs. */
int zt__enc_targets(const zt__enc_arch *a, const int32_t *tok, const int32_t *targets, int B, int T, int32_t *out);
/* How many of the counted rows of targets [rows] the first highest of their logits [rows, K] gets right. */
int zt__enc_correct(const float *logits, const int32_t *targets, size_t rows, size_t K);

/* ---- the CPU runner: the host model's per-block passes (host_model.h: zt__hm_passes, over void *) ---- */

typedef struct zt__enc_cpu zt__enc_cpu;

/* Creates the runner of a model with architecture a and the given tables (borrowed: they must outlive it),
 * for micro-batches up to B x T. Returns 0 or ZT_ENOMEM with a message. */
int zt__enc_cpu_create(zt__enc_cpu **out, const zt__enc_arch *a, const zt_param_info *tensors,
                       const zt_block_info *blocks, int B, int T, zt_err *err);
void zt__enc_cpu_destroy(void *r); /* accepts NULL */
/* The passes of model.h's order over flat block buffers laid out like the slab's ranges (bert.h:
 * zt_bert_forward_begin ... zt_bert_discard_block_acts, which are these). pos must be NULL: an encoder does
 * not pack documents. */
void zt__enc_cpu_begin(void *r, const int32_t *tokens, int B, int T, const int32_t *pos);
void zt__enc_cpu_forward_block(void *r, int block, const float *bp);
float zt__enc_cpu_forward_head(void *r, const float *hp, const int32_t *targets);
void zt__enc_cpu_backward_head(void *r, const float *hp, float *hg, float loss_scale);
void zt__enc_cpu_backward_block(void *r, int block, const float *bp, float *bg);
void zt__enc_cpu_discard_block(void *r, int block);
const float *zt__enc_cpu_logits(const void *r);
/* Token types [B,T] for the next begin (borrowed until then), and the last head's counted and correct rows. */
void zt__enc_cpu_set_token_types(void *r, const int32_t *types);
void zt__enc_cpu_accuracy(const void *r, int *correct, int *counted);

/* ---- the CUDA executor (encoder_cuda.c) ---- */

/* A host model as the CUDA executor needs it: its architecture and tables (borrowed) and its size. */
typedef struct zt__enc_model {
    const zt__enc_arch *arch;
    const zt_param_info *tensors;
    int ntensors, nblocks;
    size_t num_params;
} zt__enc_model;

#ifdef ZT_WITH_CUDA
struct zt_model;
/* The training engine's executor on one CUDA GPU (worker/models/model.h): the encoder program with the CUDA
 * binding, activations in dtype (F32, BF16 or F16) for micro-batches up to B x T, max_micro micro-batches per
 * step, the layers ckpt_layers names (or none) checkpointed; it offers ->set_token_types, ->accuracy and
 * ->logits. Returns 0, or ZT_EUNSUPPORTED / ZT_ENOMEM with a message saying what to change. */
int zt__enc_cuda_create(struct zt_model **out, const zt__enc_model *m, int B, int T, int max_micro,
                        enum zt_dtype dtype, const bool *ckpt_layers, zt_err *err);
/* Its layout and device bytes without device state, for planning. Free with ->ops->destroy. */
struct zt_model *zt__enc_cuda_shape(const zt__enc_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                                    const bool *ckpt_layers);
#endif

#endif
