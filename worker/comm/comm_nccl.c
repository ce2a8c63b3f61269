/* The NCCL backend of comm.h: GPU ranks, device buffers, every call enqueued on the caller's CUDA stream.
 * The unique id comes from rank 0 through the rendezvous; NCCL failures are returned as errors that name
 * the NCCL error (a peer that fails turns into ncclRemoteError / ncclSystemError on the others). */
#include "worker/comm/comm.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

_Static_assert(sizeof(ncclUniqueId) == ZT_COMM_NCCL_ID_BYTES, "ZT_COMM_NCCL_ID_BYTES must match ncclUniqueId");

typedef struct nccl_comm {
    zt_comm base;
    ncclComm_t comm;
    int device;
} nccl_comm;

/* Turns an NCCL result into 0 or ZT_EIO with a message naming the call, the rank and NCCL's reason. */
static int nccl_result(nccl_comm *c, ncclResult_t r, const char *what, zt_err *err)
{
    if (r == ncclSuccess)
        return 0;
    return zt_fail(err, ZT_EIO, "NCCL %s failed on rank %d: %s (%s); see the other ranks' logs", what,
                   c ? c->base.rank : -1, ncclGetErrorString(r), ncclGetLastError(c ? c->comm : NULL));
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

static int n_all_gather(zt_comm *b, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                        void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    return nccl_result(c, ncclAllGather(send, recv, count, nccl_type(dtype), c->comm, (cudaStream_t)stream),
                       "all_gather", err);
}

static int n_reduce_scatter(zt_comm *b, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                            enum zt_comm_op op, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    return nccl_result(c,
                       ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), c->comm,
                                         (cudaStream_t)stream),
                       "reduce_scatter", err);
}

static int n_all_reduce(zt_comm *b, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                        enum zt_comm_op op, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    return nccl_result(c,
                       ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), c->comm, (cudaStream_t)stream),
                       "all_reduce", err);
}

static int n_broadcast(zt_comm *b, void *buf, size_t count, enum zt_comm_dtype dtype, int root, void *stream,
                       zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    return nccl_result(c, ncclBroadcast(buf, buf, count, nccl_type(dtype), root, c->comm, (cudaStream_t)stream),
                       "broadcast", err);
}

/* A barrier: an all-reduce of one int on the stream, then waiting for the stream. */
static int n_barrier(zt_comm *b, void *stream, zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    int *d = NULL;
    cudaStream_t s = (cudaStream_t)stream;
    if (cudaMallocAsync((void **)&d, sizeof(int), s) != cudaSuccess)
        return zt_fail(err, ZT_ENOMEM, "cannot allocate 4 bytes of device memory for a barrier on rank %d",
                       b->rank);
    cudaMemsetAsync(d, 0, sizeof(int), s);
    int rc = nccl_result(c, ncclAllReduce(d, d, 1, ncclInt32, ncclSum, c->comm, s), "barrier", err);
    cudaFreeAsync(d, s);
    cudaError_t e = cudaStreamSynchronize(s);
    if (rc == 0 && e != cudaSuccess)
        rc = zt_fail(err, ZT_EIO, "CUDA failed in a barrier on rank %d: %s", b->rank, cudaGetErrorString(e));
    return rc;
}

static int n_send(zt_comm *b, const void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                  zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    return nccl_result(c, ncclSend(buf, count, nccl_type(dtype), peer, c->comm, (cudaStream_t)stream), "send", err);
}

static int n_recv(zt_comm *b, void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                  zt_err *err)
{
    nccl_comm *c = (nccl_comm *)b;
    return nccl_result(c, ncclRecv(buf, count, nccl_type(dtype), peer, c->comm, (cudaStream_t)stream), "recv", err);
}

static void n_destroy(zt_comm *b)
{
    nccl_comm *c = (nccl_comm *)b;
    if (c->comm)
        ncclCommDestroy(c->comm);
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
    ncclUniqueId id;
    memcpy(&id, o->nccl_id, sizeof id);
    int rc = nccl_result(c, ncclCommInitRank(&c->comm, o->world_size, id, o->rank), "init", err);
    if (rc < 0) {
        c->comm = NULL;
        free(c);
        return rc;
    }
    *out = &c->base;
    return 0;
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
