/* The training engine's executor on the CPU (worker/models/model.h), for every family: it drives the
 * family's per-block passes (zt_family_def) over the host model's activations. On the CPU the engine's
 * layout is the host model's slab layout, so the block and tensor tables come straight from the host
 * model. Also what the programs' CPU runners share (decoder.c, encoder.c): the loss of their head, and the
 * mean loss every executor reports. Internal to worker/models/ (the public entry is zt_family_model_cpu). */
#ifndef ZT_WORKER_MODELS_CPU_EXEC_H
#define ZT_WORKER_MODELS_CPU_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/model.h"

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

#endif
