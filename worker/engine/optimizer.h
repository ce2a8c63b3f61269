/* AdamW over the GPT-2 parameter slab, with global-norm gradient clipping and a guard against non-finite
 * steps.
 *
 * The optimizer owns fp32 first and second moments (m, v) laid out like the parameter slab, so that
 * tensor i of the model uses m[offset..offset+numel) too. Weight decay applies only to the tensors whose
 * zt_param_info.weight_decay is set (not biases or layer norms). Gradient accumulation is folded into the
 * backward pass (loss scale 1/grad_accum), so the gradients seen here are already the step's mean. */
#ifndef ZT_WORKER_OPTIMIZER_H
#define ZT_WORKER_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "worker/models/params.h" /* zt_param_info */

/* A run stops after this many steps in a row with a non-finite loss or gradient norm. */
#define ZT_OPTIMIZER_MAX_BAD_STEPS 10

typedef struct zt_optimizer {
    float *m;               /* first moment, n floats, owned */
    float *v;               /* second moment, n floats, owned */
    size_t n;               /* number of parameters */
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    float grad_clip;        /* maximum global gradient norm; 0 = no clipping */
    int64_t adam_step;      /* updates applied so far (skipped steps excluded): Adam's bias correction */
    int bad_in_a_row;       /* consecutive skipped steps */
    int64_t skipped_steps;  /* skipped steps over the whole run */
    bool loss_scaled;       /* fp16 with dynamic loss scaling: a skip with a finite loss is an overflow, not a
                               divergence (see zt_optimizer_account); false after zt_optimizer_init */
    void *lowp;             /* NULL (after zt_optimizer_init), or a borrowed slab of n elements of lowp_dtype laid
                               out like the parameters: zt_optimizer_step also writes each updated weight into
                               it, rounded to nearest even, for a GPU that computes in bf16 or fp16 */
    enum zt_dtype lowp_dtype; /* BF16 or F16, with lowp */
} zt_optimizer;

/* What one call of zt_optimizer_step did. */
typedef struct zt_optimizer_report {
    double grad_norm;       /* global L2 norm of the gradients before clipping (may be inf or nan) */
    float clip_coef;        /* factor applied to the gradients: min(1, grad_clip / (norm + 1e-6)) or 1 */
    bool skipped;           /* true when the update was skipped for a non-finite loss or norm */
} zt_optimizer_report;

/* Allocates zeroed m and v for n parameters and stores the hyper-parameters. Returns 0, or ZT_ENOMEM
 * with a message. Free with zt_optimizer_free. */
int zt_optimizer_init(zt_optimizer *o, size_t n, double beta1, double beta2, double eps, double weight_decay,
                      double grad_clip, zt_err *err);
/* Frees m and v; accepts a zeroed or freed optimizer. */
void zt_optimizer_free(zt_optimizer *o);

/* The global L2 norm of grads[0..n), summed in double in a fixed order. */
double zt_optimizer_grad_norm(const float *grads, size_t n);

/* The clipping factor for a gradient norm: min(1, max_norm / (norm + 1e-6)), or 1 when max_norm is 0. */
float zt_optimizer_clip_coef(double norm, double max_norm);

/* Applies one AdamW update with learning rate lr to the parameter slab params (o->n floats, the tensors of
 * the table tensors[0..ntensors), which say which are decayed) from the gradient slab grads of the same
 * layout (and writes the rounded weights into o->lowp when set).
 * loss is the step's loss: when it or the gradient norm is not finite the update is skipped
 * (report->skipped, counted in skipped_steps) and 0 is returned, unless that made
 * ZT_OPTIMIZER_MAX_BAD_STEPS skipped steps in a row: then ZT_ESTATE is returned with a message saying
 * what to change. */
int zt_optimizer_step(zt_optimizer *o, float *params, const float *grads, const zt_param_info *tensors, int ntensors,
                      float loss, float lr, zt_optimizer_report *report, zt_err *err);

/* Books a step whose update ran on the GPU (the fused AdamW of the GPU placement), with the same rules as
 * zt_optimizer_step: the step counts as skipped when nonfinite (the device skipped the update) or the
 * loss or norm is not finite. With o->loss_scaled (fp16), a skip with a finite loss is a loss-scale
 * overflow: counted in skipped_steps but not as a divergence (the scaler lowers the scale instead).
 * Returns 0, or ZT_ESTATE as zt_optimizer_step does. */
int zt_optimizer_account(zt_optimizer *o, float loss, double grad_norm, bool nonfinite, zt_optimizer_report *report,
                         zt_err *err);

/* Dynamic loss scaling for fp16, with BMTrain's OptimManager semantics: the loss is multiplied by
 * `scale` before backward; a step whose gradients overflow is skipped and the scale divided by 2 (not
 * below min_scale); after `window` clean steps in a row the scale is multiplied by 2. */
typedef struct zt_loss_scaler {
    double scale;
    double min_scale;
    int64_t window;
    int64_t clean_steps;    /* clean steps since the scale last changed */
} zt_loss_scaler;

/* Sets the scaler's starting state. */
void zt_loss_scaler_init(zt_loss_scaler *s, double scale, double min_scale, int64_t window);
/* Updates the scale after a step; overflow says whether its gradients were not finite. */
void zt_loss_scaler_update(zt_loss_scaler *s, bool overflow);

/* After a step booked in rep (zt_optimizer_step, zt_optimizer_account or a state server's step): a step
 * skipped with a finite loss is an overflow. Logs it (WARN) when log is set, updates the scale, and
 * returns whether it was one. */
bool zt_loss_scaler_after_step(zt_loss_scaler *s, const zt_optimizer_report *rep, float loss, bool log);

#endif
