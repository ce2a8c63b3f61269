/* Learning-rate schedules with linear warmup, after BMTrain's bmtrain/lr_scheduler (NoDecay, Noam, Linear,
 * Cosine, Exponential), as pure functions of the step.
 *
 * `step` is the 1-based index of the optimizer update the rate is for (BMTrain's num_iter), so the first
 * update of a run with warmup W gets lr / W, not 0. With t = step, W = warmup_steps, E = total_steps:
 *   warmup (t < W):  lr * t / W                     (noam: lr / sqrt(W) * t / W)
 *   nodecay:         lr
 *   noam:            lr / sqrt(t)
 *   linear:          min_lr + (lr - min_lr) * (E - t) / (E - W)          reaches min_lr at t = E
 *   cosine:          min_lr + (lr - min_lr) * (1 + cos(pi (t - W) / (E - W))) / 2
 *   exponential:     max(min_lr, lr * gamma^(t - W))
 * BMTrain floors the decaying schedules at 0 (and its users' cosine at 0.1 * lr); ztrain floors them at
 * min_lr, and holds min_lr after E. nodecay and noam do not use min_lr. */
#ifndef ZT_WORKER_SCHEDULE_H
#define ZT_WORKER_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

/* Saved by name (zt_schedule_name) in configs and checkpoints; the enum order is ztrain's own. */
enum zt_schedule_kind {
    ZT_SCHEDULE_NODECAY = 0,
    ZT_SCHEDULE_NOAM = 1,
    ZT_SCHEDULE_LINEAR = 2,
    ZT_SCHEDULE_COSINE = 3,
    ZT_SCHEDULE_EXPONENTIAL = 4,
};

typedef struct zt_schedule {
    enum zt_schedule_kind kind;
    double lr;            /* peak learning rate, reached at the end of warmup */
    double min_lr;        /* floor of linear, cosine and exponential */
    int64_t warmup_steps; /* >= 0 */
    int64_t total_steps;  /* E: the step at which linear and cosine reach min_lr */
    double gamma;         /* exponential only: decay factor per step */
} zt_schedule;

/* Parses "nodecay", "noam", "linear", "cosine" or "exponential" (lower case). Returns 0, or
 * ZT_EINVAL_CONFIG with a message listing the known names in err. */
int zt_schedule_parse(const char *name, enum zt_schedule_kind *out, zt_err *err);

/* The lower-case name of a schedule kind, as zt_schedule_parse accepts it. Never NULL. */
const char *zt_schedule_name(enum zt_schedule_kind kind);

/* True for the schedules that decay towards min_lr over total_steps (linear, cosine, exponential). */
bool zt_schedule_decays(enum zt_schedule_kind kind);

/* The learning rate of update number step (1-based; a step <= 0 gives the rate of step 0, i.e. 0 during
 * warmup). A pure function of its arguments. */
double zt_schedule_lr(const zt_schedule *s, int64_t step);

#endif
