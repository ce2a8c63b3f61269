/* The training engine on the CPU (see engine_internal.h): device memory is host memory, there are no
 * streams (every operation runs at once in the caller), and the optimizer on the device is
 * offload/cpu_adam.h's AdamW on this rank's shards. The gradient norm is summed in double in a fixed
 * order over the shard slab, so one rank gives the bits of zt_optimizer_grad_norm over the whole model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/memory.h"
#include "kernels/norm.h"
#include "offload/cpu_adam.h"
#include "worker/engine/engine_internal.h"
#include "worker/engine/optimizer.h"

#define CPU_ALIGN 64

/* The CPU's part of an engine (e->devstate). */
typedef struct cpu_state {
    double sumsq; /* HOST path: the step's sum of squares of the shards that left so far */
} cpu_state;

static void *cpu_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGN, bytes ? bytes : CPU_ALIGN) != 0)
        return NULL;
    zt_advise_huge_pages(p, bytes); /* before the zeroing touches the pages */
    memset(p, 0, bytes);
    return p;
}

static void cpu_free(void *p)
{
    free(p);
}

/* Host memory is the device's own: nothing to lock. */
static bool cpu_host_register(void *p, size_t bytes)
{
    (void)p;
    (void)bytes;
    return true;
}

static void cpu_host_unregister(void *p)
{
    (void)p;
}

/* Streams and events do not exist on the CPU: a non-NULL token stands for them. */
static char event_token;

static void *cpu_stream_create(void)
{
    return NULL;
}

static void cpu_stream_nop(void *s)
{
    (void)s;
}

static void *cpu_event_create(void)
{
    return &event_token;
}

static void cpu_event_nop(void *ev)
{
    (void)ev;
}

static void cpu_record(void *ev, void *stream)
{
    (void)ev;
    (void)stream;
}

static void cpu_wait(void *stream, void *ev)
{
    (void)stream;
    (void)ev;
}

static float cpu_elapsed(void *a, void *b)
{
    (void)a;
    (void)b;
    return 0.0f;
}

static void cpu_memset0(void *p, size_t bytes, void *stream)
{
    (void)stream;
    memset(p, 0, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)stream;
    memmove(dst, src, bytes);
}

/* The CPU computes in fp32: gradients arrive in fp32. */
static void cpu_fold(float *dst, const void *src, enum zt_dtype dtype, size_t n, float scale, bool overwrite,
                     void *stream)
{
    (void)stream;
    ZT_ASSERT(dtype == ZT_DTYPE_F32);
    const float *s = src;
    for (size_t i = 0; i < n; i++) {
        float x = s[i] * scale;
        dst[i] = overwrite ? x : dst[i] + x;
    }
}

static void cpu_host_call(void *stream, void (*fn)(void *arg), void *arg)
{
    (void)stream;
    fn(arg);
}

static void cpu_cast(void *dst, enum zt_dtype dtype, const float *src, size_t n, void *stream)
{
    (void)stream;
    ZT_ASSERT(dtype == ZT_DTYPE_F32);
    memmove(dst, src, n * sizeof(float));
}

/* The sum of squares of this rank's gradient shards, summed over the ranks. */
static int cpu_sumsq(zt_engine *e, double *sumsq, zt_err *err)
{
    double mine = zt_cpu_sum_squares(e->gshard, e->nshard);
    if (e->W == 1) {
        *sumsq = mine;
        return 0;
    }
    return zt_comm_all_reduce(e->comm, &mine, sumsq, 1, ZT_COMM_F64, ZT_COMM_SUM, NULL, err);
}

/* The step with the optimizer on the CPU's shards: global norm, clipping, the non-finite guard, AdamW per
 * piece of every tensor (each with its own weight decay). */
static int cpu_resident_step(zt_engine *e, float lr, int64_t adam_step, zt_engine_step_result *res, zt_err *err)
{
    double sumsq = 0, loss = 0, local = 0;
    for (int k = 0; k < e->micros_done; k++)
        local += e->model->ops->loss(e->model, k);
    int rc = cpu_sumsq(e, &sumsq, err);
    if (rc == 0)
        rc = zt_engine_mean(e, local / e->micros_done, &loss, err);
    if (rc < 0)
        return rc;
    res->loss = (float)loss;
    res->grad_norm = sqrt(sumsq);
    res->skipped = !isfinite(res->loss) || !isfinite(res->grad_norm);
    res->clip_coef = res->skipped ? 1.0f : zt_optimizer_clip_coef(res->grad_norm, e->o.grad_clip);
    if (res->skipped)
        return 0;
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = (float)e->o.beta1,
        .beta2 = (float)e->o.beta2,
        .eps = (float)e->o.eps,
        .grad_scale = res->clip_coef,
        .step = (int)adam_step,
    };
    for (int i = 0; i < e->npieces && rc == 0; i++) {
        const zt__piece *pc = &e->pieces[i];
        p.weight_decay = pc->decay ? (float)e->o.weight_decay : 0.0f;
        zt_cpu_adam_range r = {
            .param = e->master + pc->shard_off,
            .grad = e->gshard + pc->shard_off,
            .grad_dtype = ZT_DTYPE_F32,
            .n = pc->n,
        };
        zt__engine_moments(e, &r, e->m, e->v, pc->shard_off, pc->shard_off, adam_step);
        rc = zt_cpu_adam_update(&r, &p, e->o.threads, err);
    }
    return rc;
}

/* The HOST path (streamed weights on the CPU): each gradient shard leaving for the host arrays adds its sum
 * of squares, block by block, as on a GPU. */
static void cpu_norm_add(zt_engine *e, const float *x, size_t n, void *stream)
{
    (void)stream;
    cpu_state *cs = e->devstate;
    cs->sumsq += zt_cpu_sum_squares(x, n);
}

/* The norm: over gshard (placement server on the CPU), or the shards that left on the HOST path; the
 * CPU's losses are checked by the caller. */
static int cpu_norm_finish(zt_engine *e, double *sumsq, bool *nonfinite, zt_err *err)
{
    *nonfinite = false;
    if (e->path != ZT__GRAD_HOST)
        return cpu_sumsq(e, sumsq, err);
    cpu_state *cs = e->devstate;
    double mine = cs->sumsq;
    cs->sumsq = 0.0;
    if (e->W == 1) {
        *sumsq = mine;
        return 0;
    }
    return zt_comm_all_reduce(e->comm, &mine, sumsq, 1, ZT_COMM_F64, ZT_COMM_SUM, NULL, err);
}

static void cpu_teardown(zt_engine *e);

static const zt__engine_dev cpu_dev = {
    .gpu = false,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_nop,
    .stream_sync = cpu_stream_nop,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_nop,
    .record = cpu_record,
    .wait = cpu_wait,
    .event_sync = cpu_event_nop,
    .elapsed_ms = cpu_elapsed,
    .memset0 = cpu_memset0,
    .copy = cpu_copy,
    .fold = cpu_fold,
    .cast = cpu_cast,
    .host_call = cpu_host_call,
    .resident_step = cpu_resident_step,
    .norm_add = cpu_norm_add,
    .norm_finish = cpu_norm_finish,
    .used_bytes = NULL,
    .teardown = cpu_teardown,
};

const zt__engine_dev *zt__engine_dev_cpu(void)
{
    return &cpu_dev;
}

static void cpu_teardown(zt_engine *e)
{
    free(e->devstate);
    e->devstate = NULL;
}

/* The CPU's state: the norm's running sum on the HOST path. */
int zt__engine_dev_setup_cpu(zt_engine *e, zt_err *err)
{
    (void)err;
    e->devstate = zt_xcalloc(1, sizeof(cpu_state));
    return 0;
}
