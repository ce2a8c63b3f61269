/* The collective interface of comm.h: argument checks shared by the backends, and dispatch to them. */
#include "worker/comm/comm.h"

#include <string.h>

/* Fills the default options; see comm.h. */
void zt_comm_options_init(zt_comm_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = ZT_COMM_SHM;
    o->rank = 0;
    o->world_size = 1;
    strcpy(o->name, "local");
    o->join_timeout_s = 60.0;
    o->timeout_s = 300.0;
    o->chunk_bytes = 0;
}

/* Checks the options, then creates the backend's communicator; see comm.h. */
int zt_comm_create(zt_comm **out, const zt_comm_options *o, zt_err *err)
{
    *out = NULL;
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "rank %d does not fit world size %d (set RANK to 0..WORLD_SIZE-1 and WORLD_SIZE >= 1)",
                       o->rank, o->world_size);
    if (o->backend == ZT_COMM_SHM)
        return zt__comm_shm_create(out, o, err);
    if (o->backend == ZT_COMM_NCCL)
        return zt__comm_nccl_create(out, o, err);
    if (o->backend == ZT_COMM_SELF)
        return zt__comm_self_create(out, o, err);
    return zt_fail(err, ZT_EINVAL_CONFIG, "unknown communication backend %d (use shm, nccl or self)", (int)o->backend);
}

/* Destroys the communicator through its backend; accepts NULL. */
void zt_comm_destroy(zt_comm *c)
{
    if (c)
        c->ops->destroy(c);
}

/* Returns this rank. */
int zt_comm_rank(const zt_comm *c)
{
    return c->rank;
}

/* Returns the world size. */
int zt_comm_world_size(const zt_comm *c)
{
    return c->world_size;
}

/* Returns the bytes of one element of dtype. */
size_t zt_comm_dtype_size(enum zt_comm_dtype dtype)
{
    switch (dtype) {
    case ZT_COMM_F32:
    case ZT_COMM_I32:
        return 4;
    case ZT_COMM_F64:
        return 8;
    case ZT_COMM_BF16:
    case ZT_COMM_F16:
        return 2;
    }
    return 0;
}

/* Checks a dtype and an op; returns 0 or ZT_EINVAL_CONFIG with a message. */
static int check_args(enum zt_comm_dtype dtype, enum zt_comm_op op, zt_err *err)
{
    if (zt_comm_dtype_size(dtype) == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown element type %d for a collective", (int)dtype);
    if (op != ZT_COMM_SUM && op != ZT_COMM_MAX)
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown reduction %d (use sum or max)", (int)op);
    return 0;
}

/* Checks a peer rank; returns 0 or ZT_EINVAL_CONFIG with a message. */
static int check_peer(const zt_comm *c, int peer, const char *what, zt_err *err)
{
    if (peer < 0 || peer >= c->world_size)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s rank %d is outside 0..%d", what, peer, c->world_size - 1);
    return 0;
}

/* Gathers every rank's send into recv; see comm.h. */
int zt_comm_all_gather(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                       void *stream, zt_err *err)
{
    int rc = check_args(dtype, ZT_COMM_SUM, err);
    return rc < 0 ? rc : c->ops->all_gather(c, send, recv, count, dtype, stream, err);
}

/* Reduces and scatters; see comm.h. */
int zt_comm_reduce_scatter(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                           enum zt_comm_op op, void *stream, zt_err *err)
{
    int rc = check_args(dtype, op, err);
    return rc < 0 ? rc : c->ops->reduce_scatter(c, send, recv, count, dtype, op, stream, err);
}

/* Reduces onto every rank; see comm.h. */
int zt_comm_all_reduce(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                       enum zt_comm_op op, void *stream, zt_err *err)
{
    int rc = check_args(dtype, op, err);
    return rc < 0 ? rc : c->ops->all_reduce(c, send, recv, count, dtype, op, stream, err);
}

/* Copies root's buffer to every rank; see comm.h. */
int zt_comm_broadcast(zt_comm *c, void *buf, size_t count, enum zt_comm_dtype dtype, int root, void *stream,
                      zt_err *err)
{
    int rc = check_args(dtype, ZT_COMM_SUM, err);
    if (rc == 0)
        rc = check_peer(c, root, "broadcast root", err);
    return rc < 0 ? rc : c->ops->broadcast(c, buf, count, dtype, root, stream, err);
}

/* Waits for every rank; see comm.h. */
int zt_comm_barrier(zt_comm *c, void *stream, zt_err *err)
{
    return c->ops->barrier(c, stream, err);
}

/* Sends to one peer; see comm.h. */
int zt_comm_send(zt_comm *c, const void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                 zt_err *err)
{
    int rc = check_args(dtype, ZT_COMM_SUM, err);
    if (rc == 0)
        rc = check_peer(c, peer, "send to", err);
    if (rc == 0 && peer == c->rank)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "rank %d cannot send to itself", peer);
    return rc < 0 ? rc : c->ops->send(c, buf, count, dtype, peer, stream, err);
}

/* Receives from one peer; see comm.h. */
int zt_comm_recv(zt_comm *c, void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                 zt_err *err)
{
    int rc = check_args(dtype, ZT_COMM_SUM, err);
    if (rc == 0)
        rc = check_peer(c, peer, "receive from", err);
    if (rc == 0 && peer == c->rank)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "rank %d cannot receive from itself", peer);
    return rc < 0 ? rc : c->ops->recv(c, buf, count, dtype, peer, stream, err);
}

#ifndef ZT_WITH_NCCL
/* Builds without NCCL: the nccl backend is not available. */
int zt__comm_nccl_create(zt_comm **out, const zt_comm_options *o, zt_err *err)
{
    (void)o;
    *out = NULL;
    return zt_fail(err, ZT_EUNSUPPORTED, "this ztrain was built without NCCL; use the shm backend (CPU) or "
                                         "rebuild with CUDA and NCCL installed");
}

/* Builds without NCCL have no unique ids to hand out. */
int zt_comm_nccl_unique_id(unsigned char id[ZT_COMM_NCCL_ID_BYTES], zt_err *err)
{
    (void)id;
    return zt_fail(err, ZT_EUNSUPPORTED, "this ztrain was built without NCCL");
}
#endif

/* Agreement of the ranks on a local outcome; see comm.h. */
int zt_comm_agree(zt_comm *c, int rc, zt_err *err)
{
    if (c->world_size == 1)
        return rc;
    float bad = rc < 0 ? (float)(c->rank + 1) : 0.0f, worst = 0.0f;
    zt_err ce;
    int crc = zt_comm_all_reduce(c, &bad, &worst, 1, ZT_COMM_F32, ZT_COMM_MAX, NULL, &ce);
    if (rc < 0)
        return rc;
    if (crc < 0)
        return zt_fail(err, crc, "%s", ce.msg);
    if (worst > 0)
        return zt_fail(err, ZT_ESTATE, "rank %d failed (its log says why); stopping with it", (int)worst - 1);
    return 0;
}
