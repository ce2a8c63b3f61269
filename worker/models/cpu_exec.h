/* The training engine's executor on the CPU (worker/models/model.h), for every family: it drives the
 * family's per-block passes (zt_family_def) over the host model's activations. On the CPU the engine's
 * layout is the host model's slab layout, so the block and tensor tables come straight from the host
 * model. Internal to worker/models/ (the public entry is zt_family_model_cpu). */
#ifndef ZT_WORKER_MODELS_CPU_EXEC_H
#define ZT_WORKER_MODELS_CPU_EXEC_H

#include <stdbool.h>

#include "common/status.h"
#include "worker/models/model.h"

struct zt_family_def;

/* Creates the executor of host model `host` of family def in *out, for max_micro micro-batches per step;
 * ckpt_layers (one flag per layer, or NULL for none) names the layers whose activations are dropped after
 * their forward and rebuilt before their backward. host is borrowed and must outlive the executor (free it
 * with out->ops->destroy). Returns 0 or ZT_EINVAL_CONFIG with a message. */
int zt__cpu_exec_create(zt_model **out, const struct zt_family_def *def, void *host, int max_micro,
                        const bool *ckpt_layers, zt_err *err);

#endif
