/* The decoder-only transformer, written once: the layer program of GPT-2, LLaMA, Mistral, Qwen2 and GPT-NeoX
 * over the operations of a backend (ops.h), the layout of its activations, and its CPU runner.
 *
 * A family describes its model as an architecture (zt__dec_arch, from its config): norms (LayerNorm with
 * bias, or RMSNorm), the MLP (GELU's tanh form, exact GELU, or SwiGLU), rotary embeddings (of all or the
 * first rot channels of a head), learned positions, sequential or parallel residuals, and which tensor of
 * its table plays each role in a layer. The program is then the same for every family and every backend:
 *   ln1 = norm1(x); qkv = ln1 Wqkv^T + bqkv; rope(qkv); a = attention(qkv); res2 = x + a Wo^T + bo
 *   ln2 = norm2(res2); h = ln2 Wup^T + bup; act = gelu(h) or swiglu(h); out = res2 + act Wdown^T + bdown
 * and with parallel residuals (GPT-NeoX, Pythia) ln2 = norm2(x): out = x + attn(norm1(x)) + mlp(norm2(x))
 * (q, k and v are one packed weight, and so are SwiGLU's gate and up). A checkpointed layer's rebuild before
 * its backward stops before the down projection, whose only product is the output the layer kept.
 *
 * The CPU runner (zt__dec_cpu) holds the activations of one micro-batch in fp32 and runs the program with
 * the CPU binding: the host models' per-block passes (gpt2.c, llama.c) are this runner. The CUDA executor
 * (decoder_cuda.c) runs the same program with the CUDA binding. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_DECODER_H
#define ZT_WORKER_MODELS_DECODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/rope.h" /* zt_rope_config */
#include "worker/models/ops.h"
#include "worker/models/params.h"

enum zt__dec_norm { ZT__DEC_LAYERNORM = 0, ZT__DEC_RMSNORM = 1 };
enum zt__dec_mlp { ZT__DEC_MLP_GELU_TANH = 0, ZT__DEC_MLP_SWIGLU = 1, ZT__DEC_MLP_GELU_ERF = 2 };

/* The tensors of a layer, by what the program does with them. */
enum zt__dec_role {
    ZT__DEC_LN1_W, ZT__DEC_LN1_B, ZT__DEC_QKV_W, ZT__DEC_QKV_B, ZT__DEC_O_W, ZT__DEC_O_B,
    ZT__DEC_LN2_W, ZT__DEC_LN2_B, ZT__DEC_UP_W, ZT__DEC_UP_B, ZT__DEC_DOWN_W, ZT__DEC_DOWN_B,
    ZT__DEC_ROLES
};
/* The final block's: the final norm's weight and bias, an untied head (tied: the token embedding). */
enum zt__dec_final_role { ZT__DEC_FINAL_W, ZT__DEC_FINAL_B, ZT__DEC_HEAD, ZT__DEC_FINAL_ROLES };

#define ZT__DEC_MAX_PER_LAYER 16

typedef struct zt__dec_arch {
    int L, C, NH, NKV, HS, F, V; /* layers, width, heads, key/value heads, head size, MLP width, vocabulary */
    enum zt__dec_norm norm;
    float eps;
    enum zt__dec_mlp mlp;
    bool rope;                   /* rotary embeddings of q and k (the runner holds inv_freq) */
    int rot;                     /* with rope: the rotated channels of a head (HS, or fewer: GPT-NeoX), even */
    zt_rope_config rope_cfg;     /* with rope: the frequencies' base and scaling (zt_rope_inv_freq over rot) */
    bool parallel_residual;      /* out = x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX) instead of sequential */
    bool wpe;                    /* learned positions: block 0's second tensor */
    int pad_token_id;            /* the embedding row that gets no gradient from the embedding, or -1 */
    /* From the tensor table's roles (the host model fills them after the family's arch): */
    int layer0;                  /* index of layer 0's first tensor in the table */
    int per_layer;               /* tensors per layer */
    int role[ZT__DEC_ROLES];     /* each role's tensor within a layer (0 .. per_layer-1), -1 when absent */
    bool packed[ZT__DEC_MAX_PER_LAYER]; /* tensor k of a layer continues the one before it in memory (k and v
                                           after q: parts of one packed weight), on every backend */
    int final_w, final_b;        /* the final norm's tensors (final_b -1: RMSNorm) */
    int head_tensor;             /* the head's weight: the token embedding (0) when tied */
} zt__dec_arch;

/* Widths of a packed q | k | v row and of the MLP's first projection (2F for SwiGLU's gate | up). */
int zt__dec_qkv_width(const zt__dec_arch *a);
int zt__dec_up_width(const zt__dec_arch *a);

/* What a layer keeps for its backward, in elements of the backend's type (the statistics in fp32). */
typedef struct zt__dec_acts {
    void *ln1, *qkv, *atty, *res2, *ln2, *h, *act, *out;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd; /* means: LayerNorm only */
} zt__dec_acts;

/* The gradients one layer's backward works in, shared by all layers. dres holds d(layer output) on entry and
 * d(layer input) on return. */
typedef struct zt__dec_work {
    void *dres, *dln, *datty, *dqkv, *dh, *dact;
} zt__dec_work;

/* Hands out `bytes` from base at *used (or only counts them when base is NULL), aligned to `align` bytes. */
void *zt__dec_take(char *base, size_t *used, size_t bytes, size_t align);
/* Carves a layer's activations for N rows of esize-byte elements; with out_only only `out` (a checkpointed
 * layer that shares the rest, which the caller copies in). */
void zt__dec_carve_acts(const zt__dec_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__dec_acts *acts, bool out_only);
void zt__dec_carve_work(const zt__dec_arch *a, size_t N, size_t esize, size_t align, char *base, size_t *used,
                        zt__dec_work *work);

/* ---- packed documents ----
 * A micro-batch whose rows hold several documents (model.h: zt_model_docs) reaches the program as the
 * tokens' positions (rotary angles and learned positions restart at 0 in each document) and a list of
 * attention calls in the descriptor's cu_seqlens layout: the B*T rows are documents laid end to end (a row's
 * padding continues its last document, which nothing before it sees). One call would need lse room for
 * nseq * NH * (longest document) floats, more than N*NH when lengths differ; a layer keeps room for
 * ZT__DEC_LSE_ROWS * N * NH, and zt__dec_docs_plan cuts the documents into consecutive groups (one call each)
 * that fit it together: a document opens a new group only where joining the open one would leave too little
 * room for the rest, so batches of similar lengths take one call and no batch fails. */
#define ZT__DEC_LSE_ROWS 2

/* One attention call: documents first_doc .. of the rows from row0, their offsets cu[cu_off ..]. */
typedef struct zt__dec_group {
    int row0;       /* first row (of B*T) */
    int nseq;       /* documents */
    int maxlen;     /* longest of them */
    int cu_off;     /* where its nseq+1 offsets (from 0) start in the cu array */
    size_t lse_off; /* its lse's first float in a layer's lse */
} zt__dec_group;

/* The documents of a micro-batch as the program reads them. pos and cu are the backend's memory (device
 * memory on CUDA), groups host memory. NULL where the program takes one: one document a row. */
typedef struct zt__dec_docs {
    const int32_t *pos;          /* [N] each token's position in its document */
    const int32_t *cu;           /* every group's offsets */
    const zt__dec_group *groups; /* [ngroups] */
    int ngroups;
} zt__dec_docs;

/* Checks host positions pos [B*T] (each row starts a document at 0; every other token is 0, a new
 * document, or the token before plus 1) and plans the attention calls into groups [<= B*T] and cu
 * [<= 2*B*T]. Returns the number of groups, or -1 when pos breaks the rule. */
int zt__dec_docs_plan(const int32_t *pos, int B, int T, zt__dec_group *groups, int32_t *cu);

/* One layer's weights (or gradients) by role, NULL where absent. */
typedef struct zt__dec_w {
    const void *t[ZT__DEC_ROLES];
} zt__dec_w;
typedef struct zt__dec_g {
    void *t[ZT__DEC_ROLES];
} zt__dec_g;

/* A layer's forward from x (B x T rows) into acts; a rebuild skips the down projection (acts->out is kept).
 * docs: NULL (one document a row), or packed documents. */
void zt__dec_layer_forward(const zt_ops *o, const zt__dec_arch *a, const zt__dec_w *w, const void *x,
                           zt__dec_acts *acts, const float *inv_freq, int B, int T, bool rebuild,
                           const zt__dec_docs *docs);
/* A layer's backward: work->dres from d(out) to d(x); the weight gradients are added into g. */
void zt__dec_layer_backward(const zt_ops *o, const zt__dec_arch *a, const zt__dec_w *w, const zt__dec_g *g,
                            const void *x, const zt__dec_acts *acts, zt__dec_work *work, const float *inv_freq, int B,
                            int T, const zt__dec_docs *docs);
/* The embedding: out = wte[tokens] (+ wpe[position] with learned positions: t, or docs' positions, added
 * through tmp [N,C] of the backend's memory). */
void zt__dec_embedding_forward(const zt_ops *o, const zt__dec_arch *a, void *out, const int32_t *tokens,
                               const void *wte, const void *wpe, void *tmp, int B, int T, const zt__dec_docs *docs);
/* The final norm, forward (out, mean, rstd from x) and backward (dres = 0 + its input gradient of dout). */
void zt__dec_final_forward(const zt_ops *o, const zt__dec_arch *a, void *out, float *mean, float *rstd, const void *x,
                           const void *w, const void *b, int N);
void zt__dec_final_backward(const zt_ops *o, const zt__dec_arch *a, void *dres, void *dw, void *db, const void *dout,
                            const void *x, const void *w, const float *mean, const float *rstd, int N);
/* The embedding's backward: adds into dwte (and dwpe, at the docs' positions when given: wpe_rows is wpe's
 * row count), except into the padding row (kept through pad_row, C elements of the backend's memory). */
void zt__dec_embedding_backward(const zt_ops *o, const zt__dec_arch *a, void *dwte, void *dwpe, const void *dres,
                                const int32_t *tokens, void *pad_row, int B, int T, const zt__dec_docs *docs,
                                int wpe_rows);

/* ---- the CPU runner: a host model's per-block passes ---- */

typedef struct zt__dec_cpu zt__dec_cpu;

/* Creates the runner of a model with architecture a and the given tables (borrowed: they must outlive it),
 * for micro-batches up to B x T; inv_freq [rot/2] (copied) when a->rope. Returns 0 or ZT_ENOMEM with a
 * message. */
int zt__dec_cpu_create(zt__dec_cpu **out, const zt__dec_arch *a, const zt_param_info *tensors,
                       const zt_block_info *blocks, int B, int T, const float *inv_freq, zt_err *err);
void zt__dec_cpu_destroy(zt__dec_cpu *r); /* accepts NULL */
/* The per-block passes of model.h's order over flat block buffers laid out like the slab's ranges
 * (see gpt2.h: zt_gpt2_forward_begin ... zt_gpt2_discard_block_acts, which are these). */
/* pos: NULL, or [B*T] host positions of packed documents (model.h: zt_model_docs), copied. */
void zt__dec_cpu_begin(zt__dec_cpu *r, const int32_t *tokens, int B, int T, const int32_t *pos);
void zt__dec_cpu_forward_block(zt__dec_cpu *r, int block, const float *bp);
float zt__dec_cpu_forward_head(zt__dec_cpu *r, const float *hp, const int32_t *targets);
void zt__dec_cpu_backward_head(zt__dec_cpu *r, const float *hp, float *hg, float loss_scale);
void zt__dec_cpu_backward_block(zt__dec_cpu *r, int block, const float *bp, float *bg);
void zt__dec_cpu_discard_block(zt__dec_cpu *r, int block);
const float *zt__dec_cpu_logits(const zt__dec_cpu *r);

/* ---- the CUDA executor (decoder_cuda.c) ---- */

/* A host model as the CUDA executor needs it: its architecture and tables (borrowed), its size, the block
 * its head reads, and the rotary frequencies (host memory, [rot/2], when a->rope). */
typedef struct zt__dec_model {
    const zt__dec_arch *arch;
    const zt_param_info *tensors;
    int ntensors, nblocks, head_block;
    size_t num_params;
    const float *inv_freq;
} zt__dec_model;

#ifdef ZT_WITH_CUDA
struct zt_model;
/* The training engine's executor on one CUDA GPU (worker/models/model.h): the decoder program with the CUDA
 * binding, activations in dtype for micro-batches up to B x T, max_micro micro-batches per step, the layers
 * ckpt_layers names (or none) checkpointed. Returns 0, or ZT_EUNSUPPORTED / ZT_ENOMEM with a message saying
 * what to change. */
int zt__dec_cuda_create(struct zt_model **out, const zt__dec_model *m, int B, int T, int max_micro,
                        enum zt_dtype dtype, const bool *ckpt_layers, zt_err *err);
/* Its layout and device bytes without device state, for planning. Free with ->ops->destroy. */
struct zt_model *zt__dec_cuda_shape(const zt__dec_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                                    const bool *ckpt_layers);
#endif

#endif
