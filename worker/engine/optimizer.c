/* AdamW over the model's parameter slab, with clipping folded into the gradient scale (see optimizer.h).
 * The update itself is offload/cpu_adam.h's multithreaded CPU AdamW (optimizer placement "cpu"), which
 * gives kernels/adamw.h's zt_cpu_adamw_update results bit for bit on fp32 gradients. */
#include "worker/engine/optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/safetensors.h"
#include "kernels/adamw.h"
#include "kernels/norm.h"
#include "offload/cpu_adam.h"

/* Allocates the Adam moments; see optimizer.h. */
int zt_optimizer_init(zt_optimizer *o, size_t n, double beta1, double beta2, double eps, double weight_decay,
                      double grad_clip, zt_err *err)
{
    memset(o, 0, sizeof(*o));
    o->m = calloc(n ? n : 1, sizeof(float));
    o->v = calloc(n ? n : 1, sizeof(float));
    if (!o->m || !o->v) {
        zt_optimizer_free(o);
        return zt_fail(err, ZT_ENOMEM, "cannot allocate the Adam state (2 x %zu floats); use a smaller model", n);
    }
    o->n = n;
    o->beta1 = (float)beta1;
    o->beta2 = (float)beta2;
    o->eps = (float)eps;
    o->weight_decay = (float)weight_decay;
    o->grad_clip = (float)grad_clip;
    return 0;
}

/* Frees the Adam moments; see optimizer.h. */
void zt_optimizer_free(zt_optimizer *o)
{
    if (!o)
        return;
    free(o->m);
    free(o->v);
    o->m = NULL;
    o->v = NULL;
    o->n = 0;
}

/* The global L2 norm of the gradients; see optimizer.h. */
double zt_optimizer_grad_norm(const float *grads, size_t n)
{
    return sqrt(zt_cpu_sum_squares(grads, n));
}

/* The clipping factor for a gradient norm; see optimizer.h. */
float zt_optimizer_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0.0)
        return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

/* One AdamW update of every tensor, or a skipped step for a non-finite loss or norm; see optimizer.h. */
int zt_optimizer_step(zt_optimizer *o, float *params, const float *grads, const zt_param_info *tensors, int ntensors,
                      float loss, float lr, zt_optimizer_report *report, zt_err *err)
{

    /* The skip guard and the step count are zt_optimizer_account's: a skipped step returns here. */
    double norm = zt_optimizer_grad_norm(grads, o->n);
    int rc = zt_optimizer_account(o, loss, norm, false, report, err);
    if (rc < 0 || report->skipped)
        return rc;
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = o->beta1,
        .beta2 = o->beta2,
        .eps = o->eps,
        .weight_decay = 0.0f,
        .grad_scale = report->clip_coef,
        .step = (int)o->adam_step,
    };
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = &tensors[i];
        ZT_ASSERT(t->offset + t->numel <= o->n);
        p.weight_decay = t->weight_decay ? o->weight_decay : 0.0f;
        zt_cpu_adam_range r = {
            .param = params + t->offset,
            .m = o->m + t->offset,
            .v = o->v + t->offset,
            .grad = grads + t->offset,
            .grad_dtype = ZT_DTYPE_F32,
            .out = o->lowp ? (char *)o->lowp + t->offset * zt_dtype_size(o->lowp_dtype) : NULL,
            .out_dtype = o->lowp_dtype,
            .n = t->numel,
        };
        rc = zt_cpu_adam_update(&r, &p, 0, err);
        ZT_ASSERT(rc == 0); /* fp32 gradients, step >= 1 and non-NULL arrays: it cannot fail */
        (void)rc;
    }
    return 0;
}

/* Books a step whose update ran on the GPU; see optimizer.h. */
int zt_optimizer_account(zt_optimizer *o, float loss, double grad_norm, bool nonfinite,
                         zt_optimizer_report *report, zt_err *err)
{
    report->grad_norm = grad_norm;
    report->clip_coef = 1.0f;
    report->skipped = false;
    if (nonfinite || !isfinite(loss) || !isfinite(grad_norm)) {
        report->skipped = true;
        o->skipped_steps++;
        if (o->loss_scaled && isfinite(loss))
            return 0; /* an fp16 overflow: the loss scaler handles it */
        o->bad_in_a_row++;
        if (o->bad_in_a_row >= ZT_OPTIMIZER_MAX_BAD_STEPS)
            return zt_fail(err, ZT_ESTATE,
                           "%d steps in a row had a non-finite loss or gradient norm (loss %g, grad norm %g); "
                           "the run diverged: lower the learning rate (--lr), keep gradient clipping on "
                           "(--grad-clip 1.0), or resume from an earlier checkpoint",
                           o->bad_in_a_row, (double)loss, grad_norm);
        return 0;
    }
    o->bad_in_a_row = 0;
    report->clip_coef = zt_optimizer_clip_coef(grad_norm, o->grad_clip);
    o->adam_step++;
    return 0;
}

/* Sets the loss scaler's starting state. */
void zt_loss_scaler_init(zt_loss_scaler *s, double scale, double min_scale, int64_t window)
{
    s->scale = scale;
    s->min_scale = min_scale;
    s->window = window;
    s->clean_steps = 0;
}

/* Books a step's overflow in the scaler; see optimizer.h. */
bool zt_loss_scaler_after_step(zt_loss_scaler *s, const zt_optimizer_report *rep, float loss, bool log)
{
    const bool overflow = rep->skipped && isfinite(loss);
    if (overflow && log)
        zt_log(ZT_LOG_WARN, "fp16: gradients overflowed at loss scale %g; step skipped, scale lowered", s->scale);
    zt_loss_scaler_update(s, overflow);
    return overflow;
}

/* Halves the scale on overflow (not below min_scale), doubles it after `window` clean steps. */
void zt_loss_scaler_update(zt_loss_scaler *s, bool overflow)
{
    if (overflow) {
        s->scale = s->scale / 2.0 < s->min_scale ? s->min_scale : s->scale / 2.0;
        s->clean_steps = 0;
        return;
    }
    if (++s->clean_steps >= s->window) {
        s->scale *= 2.0;
        s->clean_steps = 0;
    }
}
