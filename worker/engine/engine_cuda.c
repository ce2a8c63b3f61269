/* The training engine on a CUDA GPU (see engine_internal.h): device memory, streams and events, the
 * gradient folds and casts, the optimizer on the GPU (global norm, clip coefficient, the non-finite flag
 * and one fused AdamW over this rank's pieces, with one host wait per step), and the norm of gradients
 * that leave the GPU. At W = 1 with one micro-batch in bf16/fp16 the norm and AdamW read the
 * compute-dtype gradients themselves and remove the loss scale (a power of two, so the bits are those of
 * folding them into fp32 first). A collective that fails breaks the communicator; the step's wait
 * (zt_comm_nccl_wait) then returns the error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "kernels/adamw.h"            /* zt_cuda_adamw_update */
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, casts, folds, the non-finite check */
#include "kernels/norm.h"             /* sums of squares and the clip coefficient */
#include "worker/engine/engine_internal.h"

/* What the GPU part of the engine keeps besides the engine's buffers. */
typedef struct cuda_state {
    float *partials;        /* [ZT_CUDA_NORM_SLOTS] of the step's norm */
    float *d_sumsq, *d_clip;
    float *h_small;         /* pinned: [0] sum of squares, [1] the flag's bits */
    zt_cuda_adamw_tensor *adam; /* [npieces] */
    zt_cuda_adamw_tensor *adam_lowg; /* the same reading glow_slab (ZT__GRAD_DIRECT_LOWP) */
    zt_cuda_adamw_tensor *adam_res;  /* the resident blocks' pieces (gpu_fraction) */
    int nadam_res;
    void *step_done;        /* event: the resident update is done (the next gathers read its weights) */
    void *ev;               /* scratch event for ordering streams */
    bool norm_started;      /* partials zeroed for this step */
} cuda_state;

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    ZT_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

static void cuda_free(void *p)
{
    if (p)
        ZT_CUDA_CHECK(cudaFree(p));
}

static bool cuda_host_register(void *p, size_t bytes)
{
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return true;
}

static void cuda_host_unregister(void *p)
{
    ZT_CUDA_CHECK(cudaHostUnregister(p));
}

static void *cuda_stream_create(void)
{
    cudaStream_t s;
    ZT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

static void cuda_stream_destroy(void *s)
{
    ZT_CUDA_CHECK(cudaStreamDestroy((cudaStream_t)s));
}

static void cuda_stream_sync(void *s)
{
    ZT_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s));
}

static void *cuda_event_create(void)
{
    cudaEvent_t ev;
    ZT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return ev;
}

static void cuda_event_destroy(void *ev)
{
    if (ev)
        ZT_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

static void cuda_record(void *ev, void *stream)
{
    ZT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
}

static void cuda_wait(void *stream, void *ev)
{
    ZT_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0));
}

static void cuda_event_sync(void *ev)
{
    ZT_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
}

static float cuda_elapsed(void *a, void *b)
{
    (void)a;
    (void)b;
    return 0.0f; /* the engine's events are created without timing */
}

static void cuda_memset0(void *p, size_t bytes, void *stream)
{
    if (bytes)
        ZT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes)
        ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
}

static void cuda_fold(float *dst, const void *src, enum zt_dtype dtype, size_t n, float scale, bool overwrite,
                      void *stream)
{
    zt_cuda_accumulate(dst, src, dtype, n, scale, overwrite ? 1 : 0, (cudaStream_t)stream);
}

static void cuda_cast(void *dst, enum zt_dtype dtype, const float *src, size_t n, void *stream)
{
    zt_cuda_cast(dst, dtype, src, ZT_DTYPE_F32, n, (cudaStream_t)stream);
}

/* All-reduces n elements at d on the communication stream, ordered after the compute stream's work so
 * far; the compute stream waits for the result. */
static int all_reduce_ordered(zt_engine *e, void *d, size_t n, enum zt_comm_dtype dt, enum zt_comm_op op,
                              zt_err *err)
{
    cuda_state *cs = e->devstate;
    cuda_record(cs->ev, e->cs);
    cuda_wait(e->ms, cs->ev);
    int rc = zt_comm_all_reduce(e->comm, d, d, n, dt, op, e->ms, err);
    cuda_record(cs->ev, e->ms);
    cuda_wait(e->cs, cs->ev);
    return rc;
}

/* Waits for the compute stream: through the communicator with several ranks (a dead peer fails instead
 * of hanging). */
static int wait_compute(zt_engine *e, zt_err *err)
{
    if (e->W > 1)
        return zt_comm_nccl_wait(e->comm, e->cs, err);
    cuda_stream_sync(e->cs);
    return 0;
}

/* The mean micro-batch loss of this rank, averaged over the ranks (the compute stream is done). */
static int step_loss(zt_engine *e, float *loss, zt_err *err)
{
    double sum = 0.0, mean = 0.0;
    for (int k = 0; k < e->micros_done; k++)
        sum += e->model->ops->loss(e->model, k);
    int rc = zt_engine_mean(e, sum / e->micros_done, &mean, err);
    *loss = (float)mean;
    return rc;
}

/* The optimizer step on the GPU; see engine_cuda.c's header comment. */
static int cuda_resident_step(zt_engine *e, float lr, int64_t adam_step, zt_engine_step_result *res, zt_err *err)
{
    cuda_state *cs = e->devstate;
    cudaStream_t s = e->cs;
    /* every reduce-scatter is done before the norm reads the shards */
    cuda_record(cs->ev, e->ms);
    cuda_wait(s, cs->ev);
    const bool lowg = e->path == ZT__GRAD_DIRECT_LOWP;
    int exp2;
    ZT_ASSERT(!lowg || frexpf(e->inv_scale, &exp2) == 0.5f); /* the loss scale is a power of two */
    const float inv = lowg ? e->inv_scale : 1.0f;
    ZT_CUDA_CHECK(cudaMemsetAsync(cs->partials, 0, ZT_CUDA_NORM_SLOTS * sizeof(float), s));
    zt_cuda_sum_squares_accumulate(cs->partials, lowg ? e->glow_slab : (void *)e->gshard, e->nshard,
                                   lowg ? e->dtype : ZT_DTYPE_F32, s);
    zt_cuda_sum_squares_finish(cs->d_sumsq, cs->partials, s);
    if (inv != 1.0f)
        zt_cuda_scale_inplace(cs->d_sumsq, inv * inv, 1, ZT_DTYPE_F32, s);
    int rc = 0;
    if (e->W > 1)
        rc = all_reduce_ordered(e, cs->d_sumsq, 1, ZT_COMM_F32, ZT_COMM_SUM, err);
    int *flag = e->model->nonfinite_flag;
    zt_cuda_check_finite(flag, cs->d_sumsq, 1, ZT_DTYPE_F32, s);
    if (rc == 0 && e->W > 1)
        rc = all_reduce_ordered(e, flag, 1, ZT_COMM_I32, ZT_COMM_MAX, err);
    zt_cuda_clip_scale(cs->d_clip, cs->d_sumsq, (float)e->o.grad_clip, s);
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = (float)e->o.beta1,
        .beta2 = (float)e->o.beta2,
        .eps = (float)e->o.eps,
        .weight_decay = (float)e->o.weight_decay,
        .grad_scale = inv,
        .step = (int)adam_step,
    };
    zt_cuda_adamw_update(lowg ? cs->adam_lowg : cs->adam, e->npieces, &p, lowg ? e->dtype : ZT_DTYPE_F32, e->dtype,
                         cs->d_clip, flag, s);
    cuda_record(cs->step_done, s);
    ZT_CUDA_CHECK(cudaMemcpyAsync(&cs->h_small[0], cs->d_sumsq, sizeof(float), cudaMemcpyDeviceToHost, s));
    ZT_CUDA_CHECK(cudaMemcpyAsync(&cs->h_small[1], flag, sizeof(int), cudaMemcpyDeviceToHost, s));
    if (rc == 0)
        rc = wait_compute(e, err);
    if (rc < 0)
        return rc;
    /* the next micro-batch's gathers read the weights this update wrote */
    cuda_wait(e->ms, cs->step_done);
    int bits;
    memcpy(&bits, &cs->h_small[1], sizeof bits);
    res->grad_norm = sqrt((double)cs->h_small[0]);
    res->skipped = bits != 0;
    res->clip_coef = 1.0f;
    if (!res->skipped && e->o.grad_clip > 0) {
        /* as zt_cuda_clip_scale computes it (for the report) */
        float c = (float)e->o.grad_clip / (sqrtf(cs->h_small[0]) + 1e-6f);
        res->clip_coef = c < 1.0f ? c : 1.0f;
    }
    return step_loss(e, &res->loss, err);
}

/* Adds the sum of squares of a gradient shard that is about to leave the GPU into the step's norm. */
static void cuda_norm_add(zt_engine *e, const float *x, size_t n, void *stream)
{
    cuda_state *cs = e->devstate;
    if (!cs->norm_started) {
        cs->norm_started = true;
        /* the partials are read and zeroed on the compute stream; shards on the communication stream wait */
        ZT_CUDA_CHECK(cudaMemsetAsync(cs->partials, 0, ZT_CUDA_NORM_SLOTS * sizeof(float), e->cs));
        if (stream != e->cs) {
            cuda_record(cs->ev, e->cs);
            cuda_wait(stream, cs->ev);
        }
    }
    zt_cuda_sum_squares_accumulate(cs->partials, x, n, ZT_DTYPE_F32, (cudaStream_t)stream);
}

/* The norm of the gradients that left the GPU and the non-finite flag of the losses, on the host. */
static int cuda_norm_finish(zt_engine *e, double *sumsq, bool *nonfinite, zt_err *err)
{
    cuda_state *cs = e->devstate;
    ZT_ASSERT(cs->norm_started);
    cs->norm_started = false;
    cudaStream_t s = e->cs;
    cuda_record(cs->ev, e->ms); /* shard sums added on the communication stream */
    cuda_wait(s, cs->ev);
    if (e->fs) { /* ... or on the fold stream (chunked) */
        cuda_record(cs->ev, e->fs);
        cuda_wait(s, cs->ev);
    }
    zt_cuda_sum_squares_finish(cs->d_sumsq, cs->partials, s);
    int rc = 0;
    if (e->W > 1)
        rc = all_reduce_ordered(e, cs->d_sumsq, 1, ZT_COMM_F32, ZT_COMM_SUM, err);
    int *flag = e->model->nonfinite_flag;
    if (rc == 0 && e->W > 1)
        rc = all_reduce_ordered(e, flag, 1, ZT_COMM_I32, ZT_COMM_MAX, err);
    ZT_CUDA_CHECK(cudaMemcpyAsync(&cs->h_small[0], cs->d_sumsq, sizeof(float), cudaMemcpyDeviceToHost, s));
    ZT_CUDA_CHECK(cudaMemcpyAsync(&cs->h_small[1], flag, sizeof(int), cudaMemcpyDeviceToHost, s));
    if (rc == 0)
        rc = wait_compute(e, err);
    if (rc < 0)
        return rc;
    int bits;
    memcpy(&bits, &cs->h_small[1], sizeof bits);
    *sumsq = (double)cs->h_small[0];
    *nonfinite = bits != 0;
    return 0;
}

/* AdamW of the resident blocks (the optimizer off the GPU, gpu_fraction) with the clip coefficient the host
 * computed for every block, so that they get the update the host gives the others, bit for bit. */
static void cuda_resident_update(zt_engine *e, float lr, float clip_coef, int64_t adam_step)
{
    cuda_state *cs = e->devstate;
    zt_adamw_params p = {
        .lr = lr,
        .beta1 = (float)e->o.beta1,
        .beta2 = (float)e->o.beta2,
        .eps = (float)e->o.eps,
        .weight_decay = (float)e->o.weight_decay,
        .grad_scale = clip_coef,
        .step = (int)adam_step,
    };
    zt_cuda_adamw_update(cs->adam_res, cs->nadam_res, &p, ZT_DTYPE_F32, e->dtype, NULL, NULL, e->cs);
}

/* Device memory in use on the GPU now, as the driver reports it (this process's CUDA context, cuBLAS and
 * NCCL included). */
static size_t cuda_used_bytes(zt_engine *e)
{
    (void)e;
    size_t free_b = 0, total_b = 0;
    ZT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
}

static void cuda_teardown(zt_engine *e)
{
    cuda_state *cs = e->devstate;
    if (!cs)
        return;
    cuda_free(cs->partials);
    zt_cuda_host_free(cs->h_small);
    cuda_event_destroy(cs->step_done);
    cuda_event_destroy(cs->ev);
    free(cs->adam);
    free(cs->adam_lowg);
    free(cs->adam_res);
    free(cs);
    e->devstate = NULL;
}

static void cuda_host_call(void *stream, void (*fn)(void *arg), void *arg)
{
    ZT_CUDA_CHECK(cudaLaunchHostFunc((cudaStream_t)stream, fn, arg));
}

static const zt__engine_dev cuda_dev = {
    .gpu = true,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = zt_cuda_host_alloc,
    .host_free = zt_cuda_host_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .record = cuda_record,
    .wait = cuda_wait,
    .event_sync = cuda_event_sync,
    .elapsed_ms = cuda_elapsed,
    .memset0 = cuda_memset0,
    .copy = cuda_copy,
    .fold = cuda_fold,
    .cast = cuda_cast,
    .host_call = cuda_host_call,
    .resident_step = cuda_resident_step,
    .norm_add = cuda_norm_add,
    .norm_finish = cuda_norm_finish,
    .resident_update = cuda_resident_update,
    .used_bytes = cuda_used_bytes,
    .teardown = cuda_teardown,
};

const zt__engine_dev *zt__engine_dev_cuda(void)
{
    return &cuda_dev;
}

/* The norm's scratch and, with the optimizer on the GPU, the fused AdamW's tensor list (one entry per
 * piece of a tensor inside this rank's shards). */
int zt__engine_dev_setup_cuda(zt_engine *e, zt_err *err)
{
    cuda_state *cs = zt_xcalloc(1, sizeof *cs);
    e->devstate = cs;
    cs->partials = cuda_alloc((ZT_CUDA_NORM_SLOTS + 4) * sizeof(float));
    if (!cs->partials)
        return zt_fail(err, ZT_ENOMEM, "out of GPU memory for the gradient norm's scratch");
    cs->d_sumsq = cs->partials + ZT_CUDA_NORM_SLOTS;
    cs->d_clip = cs->d_sumsq + 1;
    cs->h_small = zt_cuda_host_alloc(4 * sizeof(float));
    if (!cs->h_small)
        return zt_fail(err, ZT_ENOMEM, "out of page-locked host memory (check ulimit -l)");
    cs->step_done = cuda_event_create();
    cs->ev = cuda_event_create();
    if (e->nres > 0) {
        cs->adam_res = zt_xcalloc((size_t)e->npieces, sizeof *cs->adam_res);
        for (int i = 0; i < e->npieces; i++) {
            const zt__piece *pc = &e->pieces[i];
            const zt__block *k = &e->blocks[pc->block];
            if (!k->resident)
                continue;
            const size_t j = k->res_off + (pc->shard_off - k->shard_off);
            zt_cuda_adamw_tensor *a = &cs->adam_res[cs->nadam_res++];
            a->param = e->r_master + j;
            a->m = e->r_m + j;
            a->v = e->r_v + j;
            a->grad = e->r_grad + j;
            a->param_lowp = (char *)e->wshard + pc->shard_off * e->esize;
            a->n = pc->n;
            a->weight_decay = pc->decay ? 1 : 0;
        }
    }
    if (e->home != ZT__OPT_DEVICE)
        return 0;
    cs->adam = zt_xcalloc((size_t)e->npieces, sizeof *cs->adam);
    cs->adam_lowg = zt_xcalloc((size_t)e->npieces, sizeof *cs->adam_lowg);
    for (int i = 0; i < e->npieces; i++) {
        const zt__piece *pc = &e->pieces[i];
        zt_cuda_adamw_tensor *a = &cs->adam[i];
        a->param = e->master + pc->shard_off;
        a->m = (float *)e->m + pc->shard_off; /* fp32: bf16 moments need the host AdamW */
        a->v = (float *)e->v + pc->shard_off;
        a->grad = e->gshard ? (const void *)(e->gshard + pc->shard_off) : NULL;
        a->param_lowp = e->dtype == ZT_DTYPE_F32 ? NULL : (char *)e->wshard + pc->shard_off * e->esize;
        a->n = pc->n;
        a->weight_decay = pc->decay ? 1 : 0;
        cs->adam_lowg[i] = *a;
        if (e->glow_slab)
            cs->adam_lowg[i].grad = (char *)e->glow_slab + pc->shard_off * e->esize;
    }
    return 0;
}
