/* The NCCL backend of comm.h: GPU ranks, device buffers, every call enqueued on the caller's CUDA stream.
 * The unique id comes from rank 0 through the rendezvous; NCCL failures are returned as errors that name
 * the NCCL error (a peer that fails turns into ncclRemoteError / ncclSystemError on the others).
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0): no NCCL call can hang the host. Creation
 * and every call that answers ncclInProgress are polled (ncclCommGetAsyncError) against a deadline, and
 * the host waits for a stream through zt_comm_nccl_wait, which polls the stream and the communicator's
 * asynchronous error; on an error, or when the timeout passes, the communicator is aborted
 * (ncclCommAbort, which also ends kernels stuck waiting on a dead peer) and every later call fails at
 * once with the first message.
 *
 * Host buffers (the training loop's agreement flags and means) are staged through a small device buffer
 * on the communicator's own stream, and such a call waits for its result (it is synchronous); the
 * caller's stream is not used for them. Callers issue them while no other NCCL work of theirs is in
 * flight, so the order of operations is the same on every rank. */
#include "worker/comm/comm.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

_Static_assert(sizeof(ncclUniqueId) == ZT_COMM_NCCL_ID_BYTES, "ZT_COMM_NCCL_ID_BYTES must match ncclUniqueId");

typedef struct nccl_comm {
    zt_comm base;
    ncclComm_t comm;
    int device;
    double timeout_s;        /* how long a wait may take before the communicator is aborted */
    cudaStream_t sstream;    /* staging of host buffers */
    void *stage;             /* device buffer for host buffers, stage_bytes long */
    size_t stage_bytes;
    bool broken;             /* aborted after a failure: every call fails with msg */
    char msg[sizeof(((zt_err *)0)->msg)];
} nccl_comm;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void pause_briefly(void)
{
    struct timespec ts = {0, 50 * 1000}; /* 50 us: a poll, not a wait for anything in particular */
    nanosleep(&ts, NULL);
}

/* Marks the communicator broken with a message (the first one stays), aborts it, and returns ZT_EIO
 * with that message. */
static int fail_comm(nccl_comm *c, zt_err *err, const char *fmt, const char *what, const char *reason)
{
    if (!c->broken) {
        snprintf(c->msg, sizeof c->msg, fmt, what, c->base.rank, reason);
        c->broken = true;
        if (c->comm)
            ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    return zt_fail(err, ZT_EIO, "%s", c->msg);
}

/* Polls the communicator until it is no longer busy with a call that answered ncclInProgress, for at
 * most the timeout. An enqueue usually settles within microseconds, so the first 200 us poll without
 * sleeping (a sleep costs 50-100 us, which every collective call would pay); after that, 50 us pauses. */
static ncclResult_t settle(nccl_comm *c, double timeout_s)
{
    const double start = now_s(), deadline = start + timeout_s;
    ncclResult_t st = ncclInProgress;
    while (ncclCommGetAsyncError(c->comm, &st) == ncclSuccess && st == ncclInProgress) {
        const double t = now_s();
        if (t > deadline)
            return ncclInProgress;
        if (t - start > 200e-6)
            pause_briefly();
    }
    return st;
}

/* Turns an NCCL result into 0 or ZT_EIO with a message naming the call, the rank and NCCL's reason; a
 * failure breaks the communicator. */
static int nccl_result(nccl_comm *c, ncclResult_t r, const char *what, zt_err *err)
{
    if (c && c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    if (c && r == ncclInProgress)
        r = settle(c, c->timeout_s);
    if (r == ncclSuccess)
        return 0;
    if (!c)
        return zt_fail(err, ZT_EIO, "NCCL %s failed: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(NULL));
    if (r == ncclInProgress)
        return fail_comm(c, err, "NCCL %s did not complete on rank %d within the timeout (%s); a peer is gone or "
                         "stuck: see the other ranks' logs, raise ZT_COMM_TIMEOUT_S if it was only slow", what,
                         "aborted");
    char reason[256];
    snprintf(reason, sizeof reason, "%s: %s", ncclGetErrorString(r), ncclGetLastError(c->comm));
    return fail_comm(c, err, "NCCL %s failed on rank %d (%s); see the other ranks' logs", what, reason);
}

static ncclDataType_t nccl_type(enum zt_comm_dtype d)
{
    switch (d) {
    case ZT_COMM_F32:
        return ncclFloat32;
    case ZT_COMM_F64:
        return ncclFloat64;
    case ZT_COMM_I32:
        return ncclInt32;
    case ZT_COMM_BF16:
        return ncclBfloat16;
    case ZT_COMM_F16:
        return ncclFloat16;
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(enum zt_comm_op op)
{
    return op == ZT_COMM_MAX ? ncclMax : ncclSum;
}

/* Whether p is host memory (NCCL needs device memory). */
static bool is_host(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return true;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

/* A device buffer of at least bytes for staging host buffers, or NULL with err set. */
static void *stage(nccl_comm *c, size_t bytes, zt_err *err)
{
    if (!c->sstream && cudaStreamCreateWithFlags(&c->sstream, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        zt_fail(err, ZT_ENOMEM, "rank %d cannot create a CUDA stream for a collective on host memory", c->base.rank);
        return NULL;
    }
    if (bytes > c->stage_bytes) {
        cudaFree(c->stage);
        c->stage = NULL;
        c->stage_bytes = 0;
        if (cudaMalloc(&c->stage, bytes) != cudaSuccess) {
            cudaGetLastError();
            zt_fail(err, ZT_ENOMEM, "rank %d has no GPU memory left to stage %zu bytes for a collective", c->base.rank,
                    bytes);
            return NULL;
        }
        c->stage_bytes = bytes;
    }
    return c->stage;
}

/* Copies n bytes between host and device on the staging stream. */
static void stage_copy(nccl_comm *c, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    if (n > 0)
        cudaMemcpyAsync(dst, src, n, kind, c->sstream);
}

static int n_all_gather(zt_comm *b, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                        void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    if (is_host(send) || is_host(recv)) {
        const size_t n = count * zt_comm_dtype_size(dtype), total = n * (size_t)b->world_size;
        char *d = stage(c, total, err);
        if (!d)
            return ZT_ENOMEM;
        stage_copy(c, d + (size_t)b->rank * n, send, n, cudaMemcpyHostToDevice);
        int rc = nccl_result(c, ncclAllGather(d + (size_t)b->rank * n, d, count, nccl_type(dtype), c->comm,
                                              c->sstream), "all_gather", err);
        /* wait (watching the communicator) before the copy to pageable memory, which would block */
        if (rc == 0)
            rc = zt_comm_nccl_wait(b, c->sstream, err);
        if (rc == 0) {
            stage_copy(c, recv, d, total, cudaMemcpyDeviceToHost);
            cudaStreamSynchronize(c->sstream);
        }
        return rc;
    }
    return nccl_result(c, ncclAllGather(send, recv, count, nccl_type(dtype), c->comm, (cudaStream_t)stream),
                       "all_gather", err);
}

static int n_reduce_scatter(zt_comm *b, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                            enum zt_comm_op op, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    return nccl_result(c,
                       ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), c->comm,
                                         (cudaStream_t)stream),
                       "reduce_scatter", err);
}

static int n_all_reduce(zt_comm *b, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                        enum zt_comm_op op, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    if (is_host(send) || is_host(recv)) {
        const size_t n = count * zt_comm_dtype_size(dtype);
        void *d = stage(c, n, err);
        if (!d)
            return ZT_ENOMEM;
        stage_copy(c, d, send, n, cudaMemcpyHostToDevice);
        int rc = nccl_result(c, ncclAllReduce(d, d, count, nccl_type(dtype), nccl_op(op), c->comm, c->sstream),
                             "all_reduce", err);
        /* wait (watching the communicator) before the copy to pageable memory, which would block */
        if (rc == 0)
            rc = zt_comm_nccl_wait(b, c->sstream, err);
        if (rc == 0) {
            stage_copy(c, recv, d, n, cudaMemcpyDeviceToHost);
            cudaStreamSynchronize(c->sstream);
        }
        return rc;
    }
    return nccl_result(c,
                       ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), c->comm, (cudaStream_t)stream),
                       "all_reduce", err);
}

static int n_broadcast(zt_comm *b, void *buf, size_t count, enum zt_comm_dtype dtype, int root, void *stream,
                       zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    if (is_host(buf)) {
        const size_t n = count * zt_comm_dtype_size(dtype);
        void *d = stage(c, n, err);
        if (!d)
            return ZT_ENOMEM;
        stage_copy(c, d, buf, n, cudaMemcpyHostToDevice);
        int rc = nccl_result(c, ncclBroadcast(d, d, count, nccl_type(dtype), root, c->comm, c->sstream), "broadcast",
                             err);
        /* wait (watching the communicator) before the copy to pageable memory, which would block */
        if (rc == 0)
            rc = zt_comm_nccl_wait(b, c->sstream, err);
        if (rc == 0) {
            stage_copy(c, buf, d, n, cudaMemcpyDeviceToHost);
            cudaStreamSynchronize(c->sstream);
        }
        return rc;
    }
    return nccl_result(c, ncclBroadcast(buf, buf, count, nccl_type(dtype), root, c->comm, (cudaStream_t)stream),
                       "broadcast", err);
}

/* A barrier: an all-reduce of one int on the stream, then waiting for the stream. */
static int n_barrier(zt_comm *b, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    int *d = NULL;
    cudaStream_t s = (cudaStream_t)stream;
    if (cudaMallocAsync((void **)&d, sizeof(int), s) != cudaSuccess)
        return zt_fail(err, ZT_ENOMEM, "cannot allocate 4 bytes of device memory for a barrier on rank %d",
                       b->rank);
    cudaMemsetAsync(d, 0, sizeof(int), s);
    int rc = nccl_result(c, ncclAllReduce(d, d, 1, ncclInt32, ncclSum, c->comm, s), "barrier", err);
    cudaFreeAsync(d, s);
    if (rc == 0)
        rc = zt_comm_nccl_wait(b, stream, err);
    return rc;
}

static int n_send(zt_comm *b, const void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                  zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    return nccl_result(c, ncclSend(buf, count, nccl_type(dtype), peer, c->comm, (cudaStream_t)stream), "send", err);
}

static int n_recv(zt_comm *b, void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                  zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    return nccl_result(c, ncclRecv(buf, count, nccl_type(dtype), peer, c->comm, (cudaStream_t)stream), "recv", err);
}

/* Finalizes (every issued call is flushed) and destroys the communicator; one that cannot finalize
 * within the timeout, or a broken one, is aborted instead. */
static void n_destroy(zt_comm *b)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->comm && !c->broken) {
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (r == ncclInProgress)
            r = settle(c, c->timeout_s);
        if (r == ncclSuccess)
            ncclCommDestroy(c->comm);
        else
            ncclCommAbort(c->comm);
    }
    if (c->sstream)
        cudaStreamDestroy(c->sstream);
    cudaFree(c->stage);
    free(c);
}

static const zt__comm_ops nccl_ops = {n_all_gather, n_reduce_scatter, n_all_reduce, n_broadcast,
                                      n_barrier,    n_send,           n_recv,       n_destroy};

/* Creates an NCCL communicator from the unique id in o (see comm.h). */
int zt__comm_nccl_create(zt_comm **out, const zt_comm_options *o, zt_err *err)
{
    *out = NULL;
    cudaError_t e = cudaSetDevice(o->device);
    if (e != cudaSuccess)
        return zt_fail(err, ZT_EINVAL_CONFIG, "rank %d cannot use CUDA device %d: %s (check LOCAL_RANK and "
                       "CUDA_VISIBLE_DEVICES)", o->rank, o->device, cudaGetErrorString(e));
    nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating a communicator");
    c->base.ops = &nccl_ops;
    c->base.rank = o->rank;
    c->base.world_size = o->world_size;
    c->device = o->device;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 300.0;
    ncclUniqueId id;
    memcpy(&id, o->nccl_id, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, o->world_size, id, o->rank, &config);
    if (r == ncclInProgress || r == ncclSuccess)
        r = settle(c, o->join_timeout_s > 0 ? o->join_timeout_s : 60.0);
    if (r != ncclSuccess) {
        int rc;
        if (r == ncclInProgress)
            rc = zt_fail(err, ZT_ESTATE, "NCCL init did not complete on rank %d of %d within %g s: a rank did not "
                         "join or cannot reach this one (check that every rank started, NCCL_SOCKET_IFNAME and "
                         "the firewall)", o->rank, o->world_size, o->join_timeout_s);
        else
            rc = zt_fail(err, ZT_EIO, "NCCL init failed on rank %d of %d: %s (%s); see the other ranks' logs",
                         o->rank, o->world_size, ncclGetErrorString(r), ncclGetLastError(c->comm));
        if (c->comm)
            ncclCommAbort(c->comm);
        free(c);
        return rc;
    }
    *out = &c->base;
    return 0;
}

/* Waits for the work enqueued on stream, watching the communicator; see comm.h. */
int zt_comm_nccl_wait(zt_comm *b, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->broken)
        return zt_fail(err, ZT_EIO, "%s", c->msg);
    const double deadline = now_s() + c->timeout_s;
    for (;;) {
        cudaError_t q = cudaStreamQuery((cudaStream_t)stream);
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady)
            return fail_comm(c, err, "CUDA failed while rank %2$d waited for its %1$s (%3$s)", "stream",
                             cudaGetErrorString(q));
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(c->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            char reason[256];
            snprintf(reason, sizeof reason, "%s: %s", ncclGetErrorString(st), ncclGetLastError(c->comm));
            return fail_comm(c, err, "NCCL %s failed on rank %d (%s); a peer exited or failed: see the other "
                             "ranks' logs", "communication", reason);
        }
        if (now_s() > deadline) {
            char reason[64];
            snprintf(reason, sizeof reason, "ZT_COMM_TIMEOUT_S=%g", c->timeout_s);
            return fail_comm(c, err, "NCCL %s on rank %d did not finish within the timeout (%s); a peer is gone or "
                             "stuck: see the other ranks' logs, raise ZT_COMM_TIMEOUT_S if it was only slow",
                             "communication", reason);
        }
        pause_briefly();
    }
}

/* Writes a fresh NCCL unique id (see comm.h). */
int zt_comm_nccl_unique_id(unsigned char id[ZT_COMM_NCCL_ID_BYTES], zt_err *err)
{
    ncclUniqueId u;
    int rc = nccl_result(NULL, ncclGetUniqueId(&u), "get unique id", err);
    if (rc == 0)
        memcpy(id, &u, sizeof u);
    return rc;
}
