/* The communication backend of a job with one rank (comm.h's `self`): every collective is a copy of
 * this rank's own data, in host memory, at once. The engine calls no collective at W = 1; this backend
 * exists so that one process needs neither a shared-memory segment nor NCCL to train. */
#include <stdlib.h>
#include <string.h>

#include "worker/comm/comm.h"

static void copy(void *dst, const void *src, size_t count, enum zt_comm_dtype dtype)
{
    if (dst != src)
        memmove(dst, src, count * zt_comm_dtype_size(dtype));
}

static int self_all_gather(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                           void *stream, zt_err *err)
{
    (void)c;
    (void)stream;
    (void)err;
    copy(recv, send, count, dtype);
    return 0;
}

static int self_reduce(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                       enum zt_comm_op op, void *stream, zt_err *err)
{
    (void)c;
    (void)op;
    (void)stream;
    (void)err;
    copy(recv, send, count, dtype);
    return 0;
}

static int self_broadcast(zt_comm *c, void *buf, size_t count, enum zt_comm_dtype dtype, int root, void *stream,
                          zt_err *err)
{
    (void)c;
    (void)buf;
    (void)count;
    (void)dtype;
    (void)root;
    (void)stream;
    (void)err;
    return 0;
}

static int self_barrier(zt_comm *c, void *stream, zt_err *err)
{
    (void)c;
    (void)stream;
    (void)err;
    return 0;
}

static int self_p2p(zt_comm *c, const void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                    zt_err *err)
{
    (void)buf;
    (void)count;
    (void)dtype;
    (void)stream;
    return zt_fail(err, ZT_EINVAL_CONFIG, "rank %d has no peer %d in a job of one rank", c->rank, peer);
}

static int self_recv(zt_comm *c, void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                     zt_err *err)
{
    return self_p2p(c, buf, count, dtype, peer, stream, err);
}

static void self_destroy(zt_comm *c)
{
    free(c);
}

static const zt__comm_ops self_ops = {
    .all_gather = self_all_gather,
    .reduce_scatter = self_reduce,
    .all_reduce = self_reduce,
    .broadcast = self_broadcast,
    .barrier = self_barrier,
    .send = self_p2p,
    .recv = self_recv,
    .destroy = self_destroy,
};

/* Creates the one-rank communicator; see comm.h. */
int zt__comm_self_create(zt_comm **out, const zt_comm_options *o, zt_err *err)
{
    if (o->world_size != 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the self backend serves one rank, not %d: use shm or nccl",
                       o->world_size);
    zt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating a communicator");
    c->ops = &self_ops;
    c->rank = 0;
    c->world_size = 1;
    *out = c;
    return 0;
}
