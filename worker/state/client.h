/* The worker's client of the state service: one API over S remote state servers
 * (ztrain-server, gRPC through proto/rpc.h) or over a state server core running in this process
 * (embedded mode, no sockets), so a ZeRO rank drives the step protocol the same way in both:
 *   register the run once; rank 0 pushes the initial parameters; then per step every rank pushes the
 *   gradients of the (block, shard) pairs it owns, one rank commits the step on every server, and every
 *   rank pulls its updated shards, block 0 first.
 * Each (block, shard) pair lives on server zt_server_owner(run, block, shard, W, S) (server/core.h), S
 * being the number of entries of --servers; server i must run with --server-index i --server-count S.
 *
 * Failures. A server that is UNAVAILABLE (not started yet, restarting, a dropped connection) is retried
 * with exponential backoff, logging "state server 127.0.0.1:7070 unavailable, retry 2/8 in 0.4s"; a
 * push is retried whole from its first chunk, which the server accepts as an idempotent overwrite. A
 * server that restarted from a snapshot older than the run's step answers pushes and commits with
 * FAILED_PRECONDITION: the client then returns ZT_ESTATE with the server's step in *server_step (see
 * zt_state_client_server_step), and the caller resumes the run from there (pull the parameters of that
 * step, recompute, push again). Nothing of a step is applied on a server until its commit. A server that
 * restarted before the run had a snapshot there (killed between registration and the first step) has lost
 * the run: the client registers it again and pushes again the initial parameters it pushed itself, for
 * which it keeps copies until the run's first step is taken (its first successful commit or pull of a step
 * after 0; rank 0 of W = 1 holds the whole model's fp32 parameters that long, each rank of a ZeRO run its
 * shards). Until then every gradient push first checks (RegisterRun, idempotent) that its server holds
 * the run's initial parameters. With ztrain-server --snapshot-commits 1 a restarted server never lost an
 * answered push of initial parameters or commit, so together the two survive a server killed at any
 * moment (tests/fault).
 *
 * Parallelism: a push or pull of a large shard is split into up to `streams` contiguous pieces (whole
 * chunks, at least 4 chunks each) that go to the owner at the same time, each on its own stream, TCP
 * connection and thread (the calling thread takes the first piece, a small pool of threads started on the
 * first split transfer takes the others). The bytes stored and returned are the same as with one stream;
 * each piece is retried on its own (a piece is an idempotent overwrite of its range).
 *
 * Shared memory: with shm ZT_STATE_SHM_AUTO (the default) the client offers every server, on its first push or
 * pull, a shared-memory segment of its own (common/shm.h: a sealed memfd of 2 x streams slots of
 * ZT_STATE_CLIENT_SHM_SLOT_BYTES, named to the server by pid, descriptor and a random nonce on the
 * authenticated AttachShm call). A server on this host, of the same user, started without --shm off, maps it,
 * and from then on the bytes of pushes and pulls move through the slots (the client copies a piece's bytes
 * in or out, one slot per stream, the server reads and writes them in place) while every call, its step, its
 * errors and its retries still go over gRPC: the bits and the failure handling are those of TCP. A server that
 * cannot or will not map it (another host, another user, a container, --shm off, an older ztrain-server) is
 * reached over TCP, with one INFO line naming the reason. A call through the segment that fails for any
 * reason retires the segment (its slots may still be in use by the server's handler): the next call makes
 * and offers a new one, so a restarted server (which knows no segment: ABORTED) is attached again by itself.
 * Gradients that lie in the client's shared host memory (zt_state_client_shared_alloc, where the engine keeps
 * its host gradient) are not copied at all: the push names their place there and the server reads them in
 * place, which is safe because the engine writes a step's gradient only after that step's commit, and a commit
 * (or a state load) waits for every push still reading. Pulls into such memory (where the engine keeps the
 * weights it pulls: h_lowp on a GPU, the fp32 weights on the CPU) are not copied either: the pull names their
 * place and the server writes the parameters there, from the second step on during its update itself
 * (ZT_STATE_SHARED_WEIGHTS). A pull that failed may still be written by the server's
 * handler, with the bytes of the same step and block (it checks, after the block is ready and before it writes,
 * that the client has not given the memory's segment up, which the client does at once after a failed call),
 * so the caller pulls again into the same place, as the engine does.
 *
 * Memory: the first client with remote servers sets glibc's heap thresholds of the process to the most
 * its dynamic adjustment would reach (mallopt: blocks up to 32 MiB come from the heap, up to 64 MiB of
 * freed memory stay at a heap's top), so that the 1 MiB message buffers allocated and freed on several
 * threads do not make heaps shrink and fault their pages in again; GLIBC_TUNABLES with a glibc.malloc
 * setting, MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ in the environment leave the process as set.
 *
 * Threading: one client per rank. Calls may come from two threads at once (an engine pulls the updated
 * shards of a step on one thread while it commits the step on another); split transfers take turns on
 * the pool, and zt_state_client_server_step answers for the calling thread. */
#ifndef ZT_WORKER_STATE_CLIENT_H
#define ZT_WORKER_STATE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "server/core.h"

typedef struct zt_state_client zt_state_client_t;

/* The most concurrent streams one push or pull may use (zt_state_client_options.streams). */
#define ZT_STATE_CLIENT_MAX_STREAMS 8

/* The most runs one client registers (zt_state_client_register). */
#define ZT_STATE_CLIENT_MAX_RUNS 16

/* Bytes of one slot of a shared-memory segment: a push or pull through shared memory moves at most this
 * much per call. */
#define ZT_STATE_CLIENT_SHM_SLOT_BYTES (16u << 20)

/* The most separate pieces of shared host memory one client gives (zt_state_client_shared_alloc). */
#define ZT_STATE_CLIENT_MAX_SHARED 4

/* What a piece of shared host memory holds (any push from it and any pull into it goes without a copy, whatever
 * it holds). A pull into WEIGHTS stands there: it is one request for the whole range, and the servers' commits
 * after it write the shard's new parameters straight into that memory during their update, so that the pull of
 * their step finds them there and nobody copies them (zt_server_core_pull_standing). The caller promises not to
 * write a shard's place in it from its first push of a step until its pull of that step has returned (the
 * engine reads its weights there, and writes them only at an import, between steps). */
enum zt_state_shared {
    ZT_STATE_SHARED_GRADIENT = 0, /* the gradients the caller pushes */
    ZT_STATE_SHARED_WEIGHTS = 1,  /* the parameters the caller pulls, whole shards, as above */
};

/* Whether pushes and pulls may go through shared memory with servers on this host (--server-shm). */
enum zt_state_shm {
    ZT_STATE_SHM_AUTO = 0, /* offer it to every server; TCP where it is refused */
    ZT_STATE_SHM_OFF = 1,  /* TCP only */
};

struct zt_state_client_options {
    const char *servers;        /* "host:port,host:port,..." (--servers), or NULL / "" for embedded mode */
    const char *token;          /* bearer token sent on every call, or NULL */
    const char *tls_ca_file;    /* PEM CA of the servers' certificates, or NULL for plaintext */
    const char *tls_cert_file;  /* client certificate for mutual TLS, or NULL */
    const char *tls_key_file;   /* its key, with tls_cert_file */
    const char *tls_server_name; /* name to check server certificates against instead of the host, or NULL */
    int max_retries;            /* attempts after the first on UNAVAILABLE; 0: 8 */
    double backoff_s;           /* wait before the first retry, doubled after each; 0: 0.1 s */
    double timeout_s;           /* deadline of every call; 0: 120 s */
    size_t chunk_bytes;         /* bytes per pushed chunk; 0: 1 MiB (the protocol's maximum) */
    int streams;                /* concurrent streams per push or pull of one shard (1 to ZT_STATE_CLIENT_MAX_STREAMS);
                                 * 0: ZT_STATE_STREAMS from the environment, else a quarter of the online
                                 * cores, 1 to 4 */
    enum zt_state_shm shm;      /* remote servers on this host: shared memory for the bulk bytes (default auto) */
    zt_server_core_options embedded; /* embedded mode: the options of the in-process core */
};

/* Creates a client: parses opt->servers and opens a channel per server (connections are made on the
 * first call), or creates the in-process core in embedded mode. Returns 0 and *out (free with
 * zt_state_client_destroy), or a negative code with a message (an empty or malformed server list,
 * unreadable TLS files, bad core options). */
int zt_state_client_create(const struct zt_state_client_options *opt, zt_state_client_t **out, zt_err *err);

/* Closes the channels (or frees the embedded core and its state). Accepts NULL. */
void zt_state_client_destroy(zt_state_client_t *c);

/* The number of servers S (1 in embedded mode). */
int zt_state_client_nservers(const zt_state_client_t *c);

/* The number of concurrent streams a push or pull of a large shard uses (1 in embedded mode). */
int zt_state_client_streams(const zt_state_client_t *c);

/* Writes how pushes and pulls reach the servers into buf (cap bytes): "embedded", "TCP" (also before the first
 * transfer, or with shm off), "shared memory", or for a mix "shared memory with 1 of 2 servers, TCP with the
 * others". Returns buf. */
const char *zt_state_client_transport(zt_state_client_t *c, char *buf, size_t cap);

/* Host memory of `bytes` bytes (zeroed, page-aligned) that the state servers on this host read pushes from and
 * write pulls into where they lie: a push of data inside it, or a pull into it, names its place in the memory
 * instead of copying the bytes through a shared-memory slot (the engine keeps its host gradient and the weights
 * it pulls there, so that the GPU's copies land where the servers read and start where they write). Each call
 * makes one more sealed memfd segment, offered (AttachShm) to every server that took the client's slot
 * segment, at the first push or pull that touches it; a server that refuses it is pushed to and pulled from
 * through the slots, with one INFO line naming `what`. Call it before the client's first push or pull (the
 * transfers read the pieces without a lock). Returns the memory, owned by the client and valid until
 * zt_state_client_destroy (the caller must be done with it, and have unregistered it from CUDA, before), or
 * NULL when there is none to give (embedded mode, shared memory off, ZT_STATE_CLIENT_MAX_SHARED pieces given
 * already, more than one segment can hold, a segment that cannot be made: one INFO line for the last three):
 * then the caller allocates its own. err is unused (no case is an error). */
void *zt_state_client_shared_alloc(zt_state_client_t *c, size_t bytes, enum zt_state_shared what, zt_err *err);

/* Pulled bytes this process copied itself (out of the shared-memory slots, or out of the messages over TCP)
 * since the client was created, into *bytes, and the seconds the copies took, summed over the threads that
 * made them, into *seconds (either may be NULL): 0 for pulls into zt_state_client_shared_alloc's memory and in
 * embedded mode. Safe from any thread; a caller that wants one pull's figures takes the difference. */
void zt_state_client_pull_copies(zt_state_client_t *c, uint64_t *bytes, double *seconds);

/* The in-process core in embedded mode (for snapshots and tests), or NULL with remote servers. */
zt_server_core *zt_state_client_embedded_core(zt_state_client_t *c);

/* Registers the run on every server (idempotent: a restarted worker or server finds the run again) and
 * returns the lowest step any server holds in *step (may be NULL): the step the run can continue from.
 * The client routes a run's shards only after every server has accepted it. Returns 0 or a negative
 * code with a message (a different layout under the run id: ZT_EMISMATCH, embedded or remote; a run
 * beyond ZT_STATE_CLIENT_MAX_RUNS: ZT_ENOMEM, before any server is asked). */
int zt_state_client_register(zt_state_client_t *c, const zt_server_run_desc *desc, int64_t *step, zt_err *err);

/* Pushes the initial fp32 parameters of one shard (n elements from element 0) to its owner; rank 0 does
 * this once at step 0. Returns 0 or a negative code with a message. */
int zt_state_client_push_params(zt_state_client_t *c, const char *run, int block, int shard, const float *data,
                                uint64_t n, zt_err *err);

/* Pushes the gradient of one whole shard (n elements of dtype F32, F16 or BF16) for step `step` to its
 * owner, in chunks. Returns 0; ZT_ESTATE with the owner's step in zt_state_client_server_step() when the
 * owner is not at step - 1 (it restarted from an older snapshot); another negative code with a message. */
int zt_state_client_push_grad(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                              enum zt_dtype dtype, const void *data, uint64_t n, zt_err *err);

/* Commits step args->step on every server, all at the same time (a server that already committed it answers so, which counts
 * as done). Returns 0, ZT_ESTATE as push does, or another negative code with a message. */
int zt_state_client_commit(zt_state_client_t *c, const char *run, const zt_server_commit_args *args, zt_err *err);

/* zt_state_client_commit that also writes into *server_s (may be NULL) the longest time any server spent
 * applying the update (its CommitStepResponse.seconds: the AdamW alone, without the calls and the waiting;
 * 0 for a retried or overflowed step and from servers too old to say), on success. Returns as
 * zt_state_client_commit. */
int zt_state_client_commit_timed(zt_state_client_t *c, const char *run, const zt_server_commit_args *args,
                                 double *server_s, zt_err *err);

/* Pulls elements [offset, offset + n) of one shard after `step` commits from its owner into out (n
 * elements of the run's param dtype); waits for a commit of that step in progress. Pull the blocks in
 * order, block 0 first. Returns 0 or a negative code with a message. */
int zt_state_client_pull(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                         uint64_t offset, uint64_t n, void *out, zt_err *err);

/* Pulls elements [offset, offset + n) of one shard's committed fp32 master weights of `step` (the owner's
 * committed step, after a commit in progress) into out: what a worker that pulls parameters in F16/BF16
 * (the run's param_dtype) fetches for a checkpoint or an export. Returns 0, ZT_ESTATE as pull does when the
 * owner is at an older step, or another negative code with a message (one naming a server too old to send
 * masters). */
int zt_state_client_pull_masters(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                                 uint64_t offset, uint64_t n, float *out, zt_err *err);

/* Asks every server to write a snapshot of the run (ztrain-server --snapshot-dir; in embedded mode under
 * embedded_root, which may then not be NULL). Returns 0 or a negative code with a message. */
int zt_state_client_save_snapshot(zt_state_client_t *c, const char *run, const char *embedded_root, zt_err *err);

/* Asks every server whether it keeps snapshots (ztrain-server --snapshot-dir), before anything is built: a
 * worker that will write checkpoints needs them on every server. Returns 0 (also in embedded mode, and for
 * servers too old to say), ZT_EINVAL_CONFIG naming the first server without a snapshot directory, `why`
 * (what needs them, e.g. "this run writes checkpoints (--save-every 500)") and the fix, or the error of a
 * server that cannot be reached. */
int zt_state_client_check_snapshots(zt_state_client_t *c, const char *why, zt_err *err);

/* Asks every server to replace the run's state with its snapshot of `step` (ztrain-server --snapshot-dir):
 * a worker that resumes a checkpoint older than the servers' step (it stopped after they had committed
 * more) takes them back to the checkpoint. Nothing to do in embedded mode. Returns 0, or -ENOENT naming
 * the server that has no such snapshot, or another negative code with a message. */
int zt_state_client_load_snapshot(zt_state_client_t *c, const char *run, int64_t step, zt_err *err);

/* Before the run's first step: gives every server that lost the run (it restarted without a snapshot of
 * it) the run again, with the initial parameters this client pushed. Every rank calls it, so that each
 * pushes its own shards. Returns 0 (nothing to do in embedded mode or after the first step) or a negative
 * code with a message. */
int zt_state_client_restore_initial(zt_state_client_t *c, const char *run, zt_err *err);

/* The step that the server which refused this thread's last push, commit or pull with a step mismatch
 * reported, or -1. */
int64_t zt_state_client_server_step(const zt_state_client_t *c);

/* For tests: fn(user, step, block, shard, bytes_sent) runs after every chunk a push sends (to stop a rank
 * in the middle of a push); step is the pushed gradients' step, bytes_sent where the chunk ends in the
 * shard's bytes. With several streams it runs on the thread that sent the chunk, one call at a time.
 * NULL removes it. */
void zt__state_client_set_chunk_hook(zt_state_client_t *c,
                                     void (*fn)(void *user, int64_t step, int block, int shard, uint64_t bytes_sent),
                                     void *user);

/* For tests: makes the next shared-memory segments this client offers fail: ZT__STATE_SHM_FAULT_CREATE, their
 * creation fails; ZT__STATE_SHM_FAULT_NONCE, the AttachShm request carries another nonce than the segment
 * holds (what a server on another host would see). ZT__STATE_SHM_FAULT_NONE undoes it. */
enum zt__state_shm_fault {
    ZT__STATE_SHM_FAULT_NONE = 0,
    ZT__STATE_SHM_FAULT_CREATE = 1,
    ZT__STATE_SHM_FAULT_NONCE = 2,
};
void zt__state_client_set_shm_fault(zt_state_client_t *c, enum zt__state_shm_fault fault);

/* For tests: the push bytes servers read from the memory of zt_state_client_shared_alloc (without a copy;
 * a retried call's bytes count again). */
uint64_t zt__state_client_bytes_in_place(zt_state_client_t *c);

/* For tests: the pull bytes servers wrote straight into the memory of zt_state_client_shared_alloc (without a
 * copy; a retried call's bytes count again). */
uint64_t zt__state_client_bytes_pulled_in_place(zt_state_client_t *c);

/* For tests: whether server `server` is reached through shared memory now (1) or over TCP (0). */
int zt__state_client_uses_shm(zt_state_client_t *c, int server);

#endif
