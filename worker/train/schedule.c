/* Learning-rate schedules with warmup (BMTrain's formulas, floored at min_lr); see schedule.h. */
#include "worker/train/schedule.h"

#include <math.h>
#include <string.h>

static const char *const schedule_names[] = {
    [ZT_SCHEDULE_NODECAY] = "nodecay",
    [ZT_SCHEDULE_NOAM] = "noam",
    [ZT_SCHEDULE_LINEAR] = "linear",
    [ZT_SCHEDULE_COSINE] = "cosine",
    [ZT_SCHEDULE_EXPONENTIAL] = "exponential",
};
#define NUM_SCHEDULES ((int)(sizeof(schedule_names) / sizeof(schedule_names[0])))

/* Parses a schedule name; see schedule.h. */
int zt_schedule_parse(const char *name, enum zt_schedule_kind *out, zt_err *err)
{
    for (int i = 0; i < NUM_SCHEDULES; i++) {
        if (strcmp(name, schedule_names[i]) == 0) {
            *out = (enum zt_schedule_kind)i;
            return 0;
        }
    }
    return zt_fail(err, ZT_EINVAL_CONFIG,
                   "unknown schedule '%s'; use one of nodecay, noam, linear, cosine, exponential", name);
}

/* The name of a schedule kind; see schedule.h. */
const char *zt_schedule_name(enum zt_schedule_kind kind)
{
    if ((int)kind < 0 || (int)kind >= NUM_SCHEDULES)
        return "unknown";
    return schedule_names[kind];
}

/* True for the schedules that decay to min_lr; see schedule.h. */
bool zt_schedule_decays(enum zt_schedule_kind kind)
{
    return kind == ZT_SCHEDULE_LINEAR || kind == ZT_SCHEDULE_COSINE || kind == ZT_SCHEDULE_EXPONENTIAL;
}

/* The learning rate of update number step; see schedule.h for the formulas. */
double zt_schedule_lr(const zt_schedule *s, int64_t step)
{
    double t = step > 0 ? (double)step : 0.0;
    double w = (double)s->warmup_steps;

    if (t < w) {
        if (s->kind == ZT_SCHEDULE_NOAM)
            return s->lr / sqrt(w) * t / w;
        return s->lr * t / w;
    }

    /* Decay phase: t >= w, and t >= 1 unless warmup is 0 and step is 0. */
    double span = (double)(s->total_steps - s->warmup_steps);
    double progress = span > 0 ? (t - w) / span : 1.0; /* 0 at the end of warmup, 1 at total_steps */
    if (progress > 1.0)
        progress = 1.0;

    switch (s->kind) {
    case ZT_SCHEDULE_NODECAY:
        return s->lr;
    case ZT_SCHEDULE_NOAM:
        return t >= 1.0 ? s->lr / sqrt(t) : s->lr;
    case ZT_SCHEDULE_LINEAR:
        return s->min_lr + (s->lr - s->min_lr) * (1.0 - progress);
    case ZT_SCHEDULE_COSINE:
        return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
    case ZT_SCHEDULE_EXPONENTIAL: {
        double lr = s->lr * pow(s->gamma, t - w);
        return lr > s->min_lr ? lr : s->min_lr;
    }
    }
    ZT_ASSERT(!"unknown schedule kind");
    return 0.0;
}
