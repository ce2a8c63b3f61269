/* What the families' CUDA executors share (decoder_cuda.c, encoder_cuda.c, t5.c): the device layout of a
 * host model's tensor table, the pool that activations and scratch are carved from, the stream, cuBLASLt
 * handle and pinned staging, the checks of a model's shape that every executor makes, the op table's
 * binding, token staging, the fused classifier's loss and reading losses and logits back. Internal to
 * worker/models/.
 *
 * Device layout: the host slab's tensors in order, each starting on a ZT__CUDA_ALIGN_ELEMS boundary unless
 * the family marks it packed (it continues the tensor before it, as k and v after q form one packed weight);
 * a tensor may take more elements than it holds (padding rows, zero, whose gradients are never read);
 * blocks are contiguous and their lengths rounded up to ZT__CUDA_ALIGN_ELEMS. */
#ifndef ZT_WORKER_MODELS_CUDA_EXEC_H
#define ZT_WORKER_MODELS_CUDA_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "kernels/attention.h" /* zt_attention_dims */
#include "kernels/matmul.h"    /* zt_cuda_blas */
#include "worker/models/model.h"
#include "worker/models/ops_cuda.h"
#include "worker/models/params.h" /* zt_param_info */

#define ZT__CUDA_ALIGN_ELEMS 64 /* tensors start on a 64-element boundary of the device layout */
#define ZT__CUDA_VOCAB_PAD 128  /* vocabulary rows on the device: the vocabulary rounded up to this */
#define ZT__CUDA_POOL_ALIGN 256 /* bytes between buffers carved from the pool */
#define ZT__CUDA_MAX_MICRO 1024 /* micro-batches per step */

size_t zt__round_up(size_t x, size_t a);

/* Hands out `bytes` from the pool at base (or only counts them when base is NULL), advancing *used. */
void *zt__pool_take(char *base, size_t *used, size_t bytes);

typedef struct zt__cuda_layout {
    int ntensors, nblocks;
    size_t *toff, *tlen;              /* [ntensors] device offset and length (elements) */
    bool *packed;                     /* [ntensors] continues the tensor before it without alignment */
    size_t *boff, *blen;              /* [nblocks] */
    zt_model_tensor *tensors;         /* [ntensors] the engine's view */
    bool *block_ckpt, *reads_weights; /* [nblocks] */
    unsigned char *state;             /* [nblocks] where each block stands in the micro-batch: ZT__CUDA_* below */
    int top_ckpt;                     /* the highest checkpointed block, or -1 */
} zt__cuda_layout;

/* A block's state: its last forward was a first one (or none yet), it discarded its activations after it,
 * or it rebuilt them since (then its backward may run). */
enum { ZT__CUDA_FORWARDED = 0, ZT__CUDA_DISCARDED, ZT__CUDA_REBUILT };

/* Which forward a block's forward(b) call is (model.h: a checkpointed block's forward runs again before its
 * backward). A rebuild computes only what the block's backward reads: the block's output, which the engine
 * kept, is not computed again. */
enum zt__cuda_pass {
    ZT__CUDA_PASS_FIRST,   /* the micro-batch's forward */
    ZT__CUDA_PASS_REBUILD, /* a checkpointed block's activations again, before its backward */
    ZT__CUDA_PASS_KEPT,    /* the highest checkpointed block before its backward: no layer above it shares its
                              activations, so those of its first forward are still in place */
};

/* Allocates lay's tables for a host table of ntensors tensors in nblocks blocks, every tensor at its numel
 * and unpacked: the family then sets tlen[i] of padded tensors and packed[i], and calls
 * zt__cuda_layout_finish. */
void zt__cuda_layout_init(zt__cuda_layout *lay, const zt_param_info *tensors, int ntensors, int nblocks);
/* Computes the offsets, the blocks and the engine's view. Blocks 1..nlayers are the layers (ckpt_layers,
 * nlayers flags or NULL, names the checkpointed ones); every block's backward reads its weights except
 * block 0's unless embedding_reads_weights. */
void zt__cuda_layout_finish(zt__cuda_layout *lay, const zt_param_info *tensors, int nlayers, const bool *ckpt_layers,
                            bool embedding_reads_weights);
void zt__cuda_layout_free(zt__cuda_layout *lay);
/* Whether any block is checkpointed (then the checkpointed layers share one set of activations). */
bool zt__cuda_layout_any_checkpointed(const zt__cuda_layout *lay);
/* The micro-batch begins: every block's next forward is a first one. */
void zt__cuda_passes_begin(zt__cuda_layout *lay);
/* Block b discarded its activations after its first forward. */
void zt__cuda_pass_discard(zt__cuda_layout *lay, int b);
/* Which forward the call of block b's forward is; the next call of a rebuilt block is a first one again. */
enum zt__cuda_pass zt__cuda_pass_of(zt__cuda_layout *lay, int b);
/* Whether block b's backward may run: it is not checkpointed, or it was discarded and rebuilt in this
 * micro-batch (model.h's order; a checkpointed layer's first forward leaves shared buffers that the layers
 * after it overwrite). */
bool zt__cuda_pass_backward_ready(const zt__cuda_layout *lay, int b);
/* Points base's layout fields at lay and sets the rest of its description (ops, stream and device fields
 * stay the caller's). */
void zt__cuda_layout_describe(zt_model *base, const zt__cuda_layout *lay, enum zt_dtype dtype, int head_block,
                              size_t host_numel, int max_B, int max_T, int max_micro);
/* Tensor idx inside block b's buffer (weights or gradients) of elements of esize bytes. */
void *zt__cuda_in_block(const zt__cuda_layout *lay, const void *block_base, int b, int idx, size_t esize);

/* A created executor's device state. */
typedef struct zt__cuda_state {
    cudaStream_t stream;
    zt_cuda_blas *blas;
    void *pool;
    size_t pool_bytes;
    int32_t *h_io[2];        /* two pinned staging slots of slot_ints int32 */
    cudaEvent_t io_done[2];  /* the last copy out of each slot */
    float *h_losses;         /* pinned, loss_floats */
} zt__cuda_state;

/* Checks that a GPU is visible, creates the stream and the cuBLASLt handle, allocates and zeroes the pool of
 * pool_bytes (plan: its activation and scratch bytes, for the log and the message when the GPU lacks them),
 * and the pinned staging; waits for the zeroing and logs the model's memory ("gpu: ... compute"). Returns 0,
 * or ZT_EUNSUPPORTED / ZT_ENOMEM with a message saying what to change; s is closed then. */
int zt__cuda_state_open(zt__cuda_state *s, size_t pool_bytes, const size_t plan[2], size_t slot_ints,
                        size_t loss_floats, enum zt_dtype dtype, int B, int T, zt_err *err);
/* Waits for the stream and frees everything (accepts a state that failed to open, or a zeroed one). */
void zt__cuda_state_close(zt__cuda_state *s);

/* Checks what every executor needs of a model: the compute dtype (F32, BF16 or F16), attention of d's head
 * shape that the kernels serve (heads: what the model has, fix: what to choose, for the message), and
 * max_micro micro-batches per step. Returns 0, or ZT_EUNSUPPORTED / ZT_EINVAL_CONFIG with a message. */
int zt__cuda_check_model(enum zt_dtype dtype, const zt_attention_dims *d, const char *heads, const char *fix,
                         int max_micro, zt_err *err);
/* Stages tokens and targets [B,T] (targets NULL: every position ignored) through pinned slot `slot` (whose
 * previous copy it waits for) into d_tokens and d_targets on s's stream. Tokens and targets must lie in
 * [0,V) (targets -1: ignored). Returns the number of targets that count. */
int zt__cuda_stage_lm(zt__cuda_state *s, int slot, const int32_t *tokens, const int32_t *targets, int B, int T,
                      int V, int32_t *d_tokens, int32_t *d_targets);
/* Copies rows x cols of a device matrix of dtype elements with row stride `stride` into out [rows, cols] as
 * fp32, after the stream's work so far. */
void zt__cuda_rows_to_f32(float *out, const void *dev, size_t rows, size_t cols, size_t stride, enum zt_dtype dtype,
                          cudaStream_t stream);

/* ---- what every executor holds ----
 * The part of a CUDA executor that every program's shares, its first member (so that a zt_model * is one):
 * the engine's view, the compute dtype, the largest micro-batch, the device layout and state, the CUDA
 * binding, the step's inf/NaN flag and the head's losses, and the micro-batch under way. */
typedef struct zt__cuda_exec {
    zt_model base;                   /* first member */
    enum zt_dtype dtype;
    size_t esize;                    /* bytes of an element of dtype */
    int max_B, max_T, max_micro;
    zt__cuda_layout lay;             /* the device layout and the engine's view of it */
    zt__cuda_state cs;               /* stream, cuBLASLt, pool, pinned staging */
    zt_ops ops;                      /* the CUDA binding (once bound) */
    int *d_flag;                     /* the step's inf/NaN flag (the family carves it from the pool) */
    float *losses;                   /* [rows] the head's losses (the family carves them) */
    int n_valid[ZT__CUDA_MAX_MICRO]; /* counted targets of each micro-batch of the step */
    int cur_B, cur_T, micro;         /* the micro-batch begun last */
    size_t rows;                     /* the rows its head scores */
} zt__cuda_exec;

/* Sets x's dtype and largest micro-batch and base's calls; the family then builds x->lay and describes base
 * (zt__cuda_layout_describe). */
void zt__cuda_exec_init(zt__cuda_exec *x, const zt_model_ops *ops, enum zt_dtype dtype, int B, int T,
                        int max_micro);
/* How a family carves its device buffers from the pool at base (base NULL: only counts), returning the bytes;
 * plan, when not NULL, receives the bytes of activations and of scratch. x is the family's executor. */
typedef size_t (*zt__cuda_carve_fn)(zt__cuda_exec *x, char *base, size_t plan[2]);
/* An executor's shape without device state, for planning: base with the device bytes carve takes. */
struct zt_model *zt__cuda_exec_shape(zt__cuda_exec *x, zt__cuda_carve_fn carve);
/* Opens x's device state (zt__cuda_state_open: slot_ints per staging slot, loss_floats of host losses) with
 * a pool of the bytes carve takes, and carves it. Returns 0, or ZT_EUNSUPPORTED / ZT_ENOMEM with a message
 * (the caller then destroys its executor). */
int zt__cuda_exec_open(zt__cuda_exec *x, zt__cuda_carve_fn carve, size_t slot_ints, size_t loss_floats,
                       zt_err *err);
/* Binds x->ops to the CUDA kernels on x's stream and cuBLASLt handle with res's scratch (its stream and
 * handle are set here), and sets base's device fields: the stream, the inf/NaN flag and the pool's bytes. */
void zt__cuda_exec_bind(zt__cuda_exec *x, zt__ops_cuda_res res);
/* Waits for the stream, then frees the binding, the device state and the layout (x stays the caller's). */
void zt__cuda_exec_close(zt__cuda_exec *x);
/* A micro-batch of B x T whose head scores `rows` rows begins: checks it against the largest, zeroes the
 * step's flag at micro-batch 0 and starts every block's passes again. The family stages its inputs and sets
 * x->n_valid[micro]. */
void zt__cuda_exec_begin(zt__cuda_exec *x, int B, int T, int micro, size_t rows);
/* Tensor idx inside block b's buffer (weights or gradients). */
void *zt__cuda_exec_in_block(const zt__cuda_exec *x, const void *block_base, int b, int idx);
/* The fused classifier over the micro-batch's logits [rows, Kp] (the first K columns count) against
 * d_targets (-1: ignored): the losses and, in training (scale != 0), the logits replaced by the gradient of
 * the mean loss over the counted targets times scale, the losses checked for inf/NaN; then the losses copied
 * to the host for zt__cuda_exec_loss. */
void zt__cuda_exec_head_loss(zt__cuda_exec *x, void *logits, const int32_t *d_targets, int K, int Kp, float scale);
/* The model interface's entries that every executor has alike: discard (checkpointed layers write into the
 * set they share: nothing to free, but the block's next forward is a rebuild) and the mean loss of a
 * micro-batch (its losses came back with the stream, which the caller waited for). */
void zt__cuda_exec_discard(zt_model *m, int b);
float zt__cuda_exec_loss(const zt_model *m, int micro);
/* Profiling of the binding's operations (ops_cuda.h): on or off, and the report. */
void zt__cuda_exec_set_profiling(zt_model *m, bool on);
void zt__cuda_exec_profile_report(zt_model *m);

#endif
