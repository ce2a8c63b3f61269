/* The training engine's executor on the CPU (worker/models/model.h), for every family: it drives the
 * family's per-block passes (zt_family_def) over the host model's activations. On the CPU the engine's
 * layout is the host model's slab layout, so the block and tensor tables come straight from the host
 * model. Also what the programs' CPU runners share (decoder.c, encoder.c): their tables, binding, slab and
 * inputs, the loss of their head, and the mean loss every executor reports. Internal to worker/models/ (the
 * public entry is zt_family_model_cpu). */
#ifndef ZT_WORKER_MODELS_CPU_EXEC_H
#define ZT_WORKER_MODELS_CPU_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/model.h"
#include "worker/models/ops.h"
#include "worker/models/params.h"

struct zt_family_def;

/* Creates the executor of host model `host` of family def in *out, for max_micro micro-batches per step;
 * ckpt_layers (one flag per layer, or NULL for none) names the layers whose activations are dropped after
 * their forward and rebuilt before their backward. host is borrowed and must outlive the executor (free it
 * with out->ops->destroy). Returns 0 or ZT_EINVAL_CONFIG with a message. */
int zt__cpu_exec_create(zt_model **out, const struct zt_family_def *def, void *host, int max_micro,
                        const bool *ckpt_layers, zt_err *err);

/* The sum of losses[0..n) in double over counted, rounded to float (0 when counted is 0). */
float zt__mean_loss(const float *losses, size_t n, int counted);

/* A CPU runner's loss: the cross-entropy of its head's logits against the counted targets of its last
 * forward, kept from that forward to its backward. The runner owns losses and targets. */
typedef struct zt__cpu_loss {
    float *losses;      /* [rows] */
    int32_t *targets;   /* [rows] the counted targets (-1: ignored), which the runner writes */
    int rows, K;        /* of the last forward */
    int counted;        /* targets that count */
    bool have_targets;  /* the last head had targets and no backward consumed them */
    bool skip;          /* the running backward has nothing to do (no target counted) */
} zt__cpu_loss;

/* The mean loss of logits [rows, K] against l->targets (0 when none counts); a backward may follow, once. */
float zt__cpu_loss_forward(zt__cpu_loss *l, const float *logits, int rows, int K);
/* A backward begins (after a forward with targets, once): false when no target counted (the runner's
 * backward then skips every block); else the logits, in place, become the gradient of the mean loss times
 * loss_scale, and true. */
bool zt__cpu_loss_backward(zt__cpu_loss *l, float *logits, float loss_scale);

/* What every program's CPU runner holds beside its activations: the tables its block buffers are read by,
 * the CPU binding, the largest micro-batch, the activation slab, its int32 inputs and its loss. */
typedef struct zt__cpu_runner {
    const zt_param_info *tensors; /* borrowed */
    const zt_block_info *blocks;  /* borrowed */
    zt_ops ops;                   /* the CPU binding (once open) */
    int max_B, max_T;
    char *slab;                   /* the activations, carved by the runner; N = B*T rows used of max_B*max_T */
    int32_t *io;                  /* the runner's int32 inputs (tokens, targets, ...), carved by the runner */
    zt__cpu_loss loss;
    int B, T;                     /* the micro-batch begun last */
} zt__cpu_runner;

/* Sets c's tables (borrowed: they must outlive it) and largest micro-batch, before the runner counts its
 * slab. */
void zt__cpu_runner_init(zt__cpu_runner *c, const zt_param_info *tensors, const zt_block_info *blocks, int B,
                         int T);
/* Allocates the slab of slab_bytes (huge pages advised) and io_ints int32, and binds the CPU kernels with
 * scratch for max_B*max_T rows of widest floats. Returns 0 or ZT_ENOMEM with a message; free c with
 * zt__cpu_runner_free either way. */
int zt__cpu_runner_open(zt__cpu_runner *c, size_t slab_bytes, size_t io_ints, int widest, zt_err *err);
void zt__cpu_runner_free(zt__cpu_runner *c);
/* A micro-batch of B x T begins: checks it against the largest; no backward before its head. */
void zt__cpu_runner_begin(zt__cpu_runner *c, int B, int T);
/* Tensor idx inside its block's flat buffer bp (laid out like the block's range of the slab). */
float *zt__cpu_in_block(const zt__cpu_runner *c, const float *bp, int idx);

#endif
