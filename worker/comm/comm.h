/* Collective communication between the worker ranks of one job: the one interface the runtime uses, with
 * two backends.
 *
 *   shm   ranks are processes on one host; a POSIX shared-memory segment with process-shared locking.
 *         Reductions add the ranks' contributions in rank order 0, 1, ..., W-1, so results are the same
 *         on every rank and do not depend on timing. CPU memory only; fp32, fp64 and int32.
 *   self  one rank alone (world size 1): every collective copies this rank's host data; no setup.
 *   nccl  GPUs (built when CUDA and NCCL are found); fp32, fp64, int32, bf16 and fp16. On device memory
 *         every call is enqueued on the given cudaStream_t (passed as void * so that CPU code needs no
 *         CUDA headers) and returns without waiting for it. all_gather, all_reduce and broadcast also take
 *         host memory (small control values: flags, losses): staged through a device buffer on the
 *         backend's own stream, and the call returns when the result is in host memory.
 *
 * Every rank must call the same collectives in the same order with the same counts. Calls return 0 or a
 * negative code with a sentence in err. A peer that exits or stops answering makes the waiting ranks fail
 * (naming the rank) within the configured timeout instead of hanging; after one failure the communicator
 * is broken and every later call fails at once with the first failure's message (on every rank, for shm).
 *
 * Creating a shm communicator is also the job's check-in: every rank must bring the same WORLD_SIZE and the
 * same config hash, and ranks that do not arrive within join_timeout_s are named in the error. */
#ifndef ZT_WORKER_COMM_H
#define ZT_WORKER_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

enum zt_comm_backend { ZT_COMM_SHM = 0, ZT_COMM_NCCL = 1, ZT_COMM_SELF = 2 };
enum zt_comm_dtype { ZT_COMM_F32 = 0, ZT_COMM_F64 = 1, ZT_COMM_I32 = 2, ZT_COMM_BF16 = 3, ZT_COMM_F16 = 4 };
enum zt_comm_op { ZT_COMM_SUM = 0, ZT_COMM_MAX = 1 };

#define ZT_COMM_NAME_LEN 64
#define ZT_COMM_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

typedef struct zt_comm zt_comm; /* opaque */

typedef struct zt_comm_options {
    enum zt_comm_backend backend;
    int rank;                      /* 0 <= rank < world_size */
    int world_size;                /* >= 1 */
    char name[ZT_COMM_NAME_LEN];   /* shm: the job's name, the same on every rank (e.g. "p29500");
                                      it names the segment /ztrain-<name>; letters, digits, '-', '_' */
    uint64_t config_hash;          /* shm: must be equal on every rank (0 is a valid hash) */
    double join_timeout_s;         /* shm: how long creation waits for every rank to arrive; > 0 */
    double timeout_s;              /* how long a collective (shm) or a stream wait (nccl, zt_comm_nccl_wait)
                                      waits for a slow peer before failing; > 0 */
    size_t chunk_bytes;            /* shm: staging buffer per rank, in bytes; 0 = 4 MiB */
    int device;                    /* nccl: CUDA device of this rank */
    unsigned char nccl_id[ZT_COMM_NCCL_ID_BYTES]; /* nccl: the unique id rank 0 handed out */
} zt_comm_options;

/* Fills o with the defaults: shm backend, rank 0 of 1, name "local", join timeout 60 s, collective
 * timeout 300 s, 4 MiB chunks. */
void zt_comm_options_init(zt_comm_options *o);

/* Creates this rank's communicator and waits until every rank of the job has created its own (a
 * collective). Returns 0 and sets *out, or: ZT_EINVAL_CONFIG for bad options, ZT_EMISMATCH when ranks
 * disagree on the world size or the config hash (every rank gets the error), ZT_ESTATE when a rank never
 * arrives (the message names the missing ranks) or two processes claim the same rank, ZT_EUNSUPPORTED for
 * a backend this build lacks, or a negative errno; with a message in err. Free with zt_comm_destroy. */
int zt_comm_create(zt_comm **out, const zt_comm_options *o, zt_err *err);

/* Releases this rank's side of the communicator; does not wait for the others. Accepts NULL. */
void zt_comm_destroy(zt_comm *c);

/* This rank and the world size. */
int zt_comm_rank(const zt_comm *c);
int zt_comm_world_size(const zt_comm *c);

/* Bytes of one element of dtype. */
size_t zt_comm_dtype_size(enum zt_comm_dtype dtype);

/* recv[q*count .. (q+1)*count) = rank q's send[0..count), for every rank q. recv holds world_size * count
 * elements; send may alias recv + rank * count (in place). */
int zt_comm_all_gather(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                       void *stream, zt_err *err);

/* recv[0..count) = op over ranks q (in rank order) of rank q's send[rank*count .. (rank+1)*count), where
 * rank is the caller's rank: send holds world_size * count elements. recv must not overlap send. */
int zt_comm_reduce_scatter(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                           enum zt_comm_op op, void *stream, zt_err *err);

/* recv[0..count) = op over ranks (in rank order) of send[0..count); send may equal recv. */
int zt_comm_all_reduce(zt_comm *c, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                       enum zt_comm_op op, void *stream, zt_err *err);

/* Copies root's buf[0..count) into every other rank's buf. */
int zt_comm_broadcast(zt_comm *c, void *buf, size_t count, enum zt_comm_dtype dtype, int root, void *stream,
                      zt_err *err);

/* Makes the ranks agree on a local outcome rc (0 or a negative code), with one all-reduce in host memory:
 * returns 0 when rc == 0 on every rank; otherwise a negative code on every rank, keeping this rank's message
 * when it failed itself and naming the first failed rank when not ("rank 2 failed (its log says why);
 * stopping with it"). With one rank, returns rc. A collective. */
int zt_comm_agree(zt_comm *c, int rc, zt_err *err);

/* Returns once every rank has called it (for nccl: once the stream-ordered work before it is done on all
 * ranks' streams, which it synchronises). */
int zt_comm_barrier(zt_comm *c, void *stream, zt_err *err);

/* Point-to-point: send count elements to peer, which receives them with a matching zt_comm_recv. Pairs
 * are matched in call order. For shm a send returns once the peer has taken the data. */
int zt_comm_send(zt_comm *c, const void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                 zt_err *err);
int zt_comm_recv(zt_comm *c, void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                 zt_err *err);

/* nccl only: writes a fresh unique id (ZT_COMM_NCCL_ID_BYTES) for rank 0 to hand out through the
 * rendezvous. Returns 0, or ZT_EUNSUPPORTED in a build without NCCL, or an NCCL failure, with err. */
int zt_comm_nccl_unique_id(unsigned char id[ZT_COMM_NCCL_ID_BYTES], zt_err *err);

#ifdef ZT_WITH_NCCL
/* nccl only: waits until the work enqueued on stream (a cudaStream_t) is done, polling the stream and
 * the communicator's asynchronous errors. A failed NCCL call or peer, or no progress within the
 * communicator's timeout_s (ZT_COMM_TIMEOUT_S), aborts the communicator and returns ZT_EIO with a
 * message naming the problem; the communicator is broken from then on. Returns 0 when done. */
int zt_comm_nccl_wait(zt_comm *c, void *stream, zt_err *err);
#endif

/* Internal backends (comm.c dispatches to them). */
typedef struct zt__comm_ops {
    int (*all_gather)(zt_comm *, const void *, void *, size_t, enum zt_comm_dtype, void *, zt_err *);
    int (*reduce_scatter)(zt_comm *, const void *, void *, size_t, enum zt_comm_dtype, enum zt_comm_op, void *,
                          zt_err *);
    int (*all_reduce)(zt_comm *, const void *, void *, size_t, enum zt_comm_dtype, enum zt_comm_op, void *,
                      zt_err *);
    int (*broadcast)(zt_comm *, void *, size_t, enum zt_comm_dtype, int, void *, zt_err *);
    int (*barrier)(zt_comm *, void *, zt_err *);
    int (*send)(zt_comm *, const void *, size_t, enum zt_comm_dtype, int, void *, zt_err *);
    int (*recv)(zt_comm *, void *, size_t, enum zt_comm_dtype, int, void *, zt_err *);
    void (*destroy)(zt_comm *);
} zt__comm_ops;

/* The fields every backend shares; a backend's struct starts with it. */
struct zt_comm {
    const zt__comm_ops *ops;
    int rank;
    int world_size;
};

int zt__comm_shm_create(zt_comm **out, const zt_comm_options *o, zt_err *err);
int zt__comm_nccl_create(zt_comm **out, const zt_comm_options *o, zt_err *err);
int zt__comm_self_create(zt_comm **out, const zt_comm_options *o, zt_err *err);

#endif
