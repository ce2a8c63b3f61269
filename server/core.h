/* The state server core: the shard table of fp32 master weights and Adam moments, the step protocol of
 * the step protocol of docs/state-server.md (idempotent gradient pushes, atomic commit, block-by-block update, pull of the
 * updated low-precision parameters block 0 first) and snapshots. No networking: ztrain-server calls it
 * from its gRPC handlers and the worker calls it in process when it runs without --servers (embedded
 * mode). Every entry point is thread-safe and returns 0 or a negative code (ZT_E* or -errno) with one
 * sentence in the zt_err buffer that names the problem and the fix. docs/state-server.md describes the
 * protocol for users.
 *
 * Terms.
 *   run    a training run, named by a run id (1..ZT_SERVER_RUN_ID_MAX-1 bytes of [A-Za-z0-9._-]).
 *   block  one flat buffer of a model's parameters, numel elements.
 *   shard  block b split over the W worker ranks: the block is padded with zeros to
 *          padded = ceil(numel / W) * W elements and rank r owns elements [r * s, (r + 1) * s) with
 *          s = padded / W (zt_server_shard_numel). The padding elements are part of the last shard(s):
 *          workers push zero gradients for them, their parameters start and stay zero.
 *   step   the number of steps the run has committed (0 after registration). Gradients pushed for
 *          step s = committed + 1 are applied by commit(s); the parameters pulled for step s are those
 *          after s commits. Overflowed steps advance the step without an update, so Adam's bias
 *          correction uses adam_step (updates applied), as the CPU trainer does.
 *
 * Several servers. A run's (block, shard) pairs are spread over S servers by zt_server_owner. Every
 * server registers the whole layout but holds only the pairs it owns (options.server_index); a push or
 * pull of a pair owned by another server is refused with the owner's index. Each server commits its own
 * pairs atomically; workers commit step s on every server.
 *
 * Memory. A RAM-tier server holds, per owned parameter: master, m and v twice (the committed state and
 * the one being written by a commit: 24 bytes), the pushed gradient (up to 4 bytes) and the pulled
 * low-precision parameters twice (2 x 2 bytes for F16/BF16; a commit writes those of a shard whose pulls stand
 * in the worker's memory there instead, zt_server_core_pull_standing). The NVMe tier keeps master/m/v (both
 * copies) on disk and only the gradient, the low-precision parameters and a few blocks of staging in RAM. */
#ifndef ZT_SERVER_CORE_H
#define ZT_SERVER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"

#define ZT_SERVER_RUN_ID_MAX 128  /* bytes of a run id with its NUL */
#define ZT_SERVER_MAX_BLOCKS 65536
#define ZT_SERVER_MAX_WORLD 65536
#define ZT_SERVER_MAX_SHARDS 65536 /* (block, shard) pairs of one run: blocks times world size */

typedef struct zt_server_core zt_server_core; /* opaque */

/* Where master weights and Adam moments live. */
enum zt_server_store_kind {
    ZT_SERVER_STORE_RAM = 0,
    ZT_SERVER_STORE_NVME = 1, /* files under store_path, io_uring, O_DIRECT */
};

/* How a core is created; zero-initialise, then set what differs from the defaults. */
typedef struct zt_server_core_options {
    enum zt_server_store_kind store;  /* default RAM */
    const char *store_path;           /* NVMe tier: a directory for the state files (those of an earlier
                                         process are deleted at create: state survives through snapshots);
                                         borrowed for create */
    bool store_no_direct;             /* NVMe tier without O_DIRECT (filesystems such as tmpfs lack it; tests) */
    uint64_t mem_limit;               /* bytes of RAM the core may hold for runs; 0 = no limit */
    int max_runs;                     /* runs the core holds at once; 0 = no limit */
    int threads;                      /* CPU Adam threads; <= 0: the CPU kernels' default */
    int server_index;                 /* this server's index in [0, server_count) */
    int server_count;                 /* S, the number of servers sharing runs; 0 means 1 */
} zt_server_core_options;

/* Creates a core with no runs. Returns 0 and *out (free with zt_server_core_destroy), or a negative code
 * with a message (bad options, an NVMe directory that cannot be used). */
int zt_server_core_create(zt_server_core **out, const zt_server_core_options *opt, zt_err *err);

/* Frees the core and every run in it; the caller makes sure no other thread is still inside a call.
 * Accepts NULL. State not saved in a snapshot is lost. */
void zt_server_core_destroy(zt_server_core *core);

/* ---- layout and ownership (pure functions) ---- */

/* Elements of one shard of a block of numel elements split over world_size ranks: ceil(numel / W).
 * The padded block is world_size times this. */
uint64_t zt_server_shard_numel(uint64_t numel, int world_size);

/* The server (in [0, nservers)) that owns shard `shard` of block `block` of run run_id:
 *   owner = (fnv1a32(run_id) + block * world_size + shard) mod nservers.
 * Consecutive (block, shard) pairs go to consecutive servers, so every server owns the same number of
 * pairs give or take one, and the run id's hash staggers where different runs start. Deterministic on
 * every platform. nservers <= 1 gives 0. */
int zt_server_owner(const char *run_id, int block, int shard, int world_size, int nservers);

/* ---- runs ---- */

/* Elements [begin, end) of a block (unpadded indices) that get weight decay; the rest get none. */
typedef struct zt_server_range {
    uint64_t begin;
    uint64_t end;
} zt_server_range;

/* One block of a run's layout. */
typedef struct zt_server_block_desc {
    uint64_t numel;                 /* parameters of the block, without padding; > 0 */
    const zt_server_range *decay;   /* sorted, disjoint ranges with weight decay; borrowed for the call */
    int ndecay;                     /* entries of decay; 0: no weight decay in this block */
} zt_server_block_desc;

/* Everything that defines a run. Registering the same description again is accepted (a restarted
 * worker); any difference is refused. */
typedef struct zt_server_run_desc {
    const char *run_id;                 /* borrowed for the call */
    int world_size;                     /* W, number of shards of every block */
    int nblocks;
    const zt_server_block_desc *blocks; /* nblocks entries; borrowed for the call */
    float beta1, beta2, eps;            /* AdamW */
    float weight_decay;                 /* applied to the decay ranges */
    enum zt_dtype param_dtype;          /* dtype of the pulled parameters: F32, F16 or BF16 */
} zt_server_run_desc;

/* A run's position and sizes, as registration and zt_server_core_run_info report them. */
typedef struct zt_server_run_info {
    int64_t step;             /* steps committed */
    int64_t adam_step;        /* updates applied (step minus overflowed steps) */
    bool params_ready;        /* every owned shard has its initial parameters (or came from a snapshot) */
    bool committing;          /* a commit is in progress */
    int owned_shards;         /* (block, shard) pairs held by this server */
    uint64_t owned_numel;     /* elements of those shards, padding included */
    int world_size;           /* the registered layout, for callers that only know the run id */
    int nblocks;
    enum zt_dtype param_dtype;
} zt_server_run_info;

/* Registers a run (or finds it again). A new run starts at step 0 with zero parameters and moments and
 * waits for its initial parameters (zt_server_core_push_params). The same description again returns 0
 * with the run's current position in *info (may be NULL); a different one returns ZT_EMISMATCH naming
 * the first difference ("block 3: numel 2359296, registered 2360064"). Bad descriptions return
 * ZT_EINVAL_CONFIG (also more than ZT_SERVER_MAX_SHARDS shards); not enough memory under mem_limit, or
 * max_runs runs held already, returns ZT_ENOMEM with the bytes needed or the count, before anything is
 * allocated for the run. */
int zt_server_core_register(zt_server_core *core, const zt_server_run_desc *desc, zt_server_run_info *info,
                            zt_err *err);

/* Copies the position and sizes of run_id into *info. Returns 0 or -ENOENT for an unknown run. */
int zt_server_core_run_info(zt_server_core *core, const char *run_id, zt_server_run_info *info, zt_err *err);

/* The number of parameters of block `block` of run_id without padding (*numel) and of each of its
 * shards (*shard_numel); either pointer may be NULL. Returns 0, -ENOENT or ZT_EINVAL_CONFIG. */
int zt_server_core_block_numel(zt_server_core *core, const char *run_id, int block, uint64_t *numel,
                               uint64_t *shard_numel, zt_err *err);

/* Removes a run and frees its state. Returns 0, -ENOENT, or ZT_ESTATE while a commit is in progress. */
int zt_server_core_drop(zt_server_core *core, const char *run_id, zt_err *err);

/* ---- step protocol ---- */

/* One piece of a shard's gradient or initial parameters: n elements of dtype starting at element
 * `offset` of shard `shard` of block `block`. data is borrowed for the call. */
typedef struct zt_server_chunk {
    int block;
    int shard;
    uint64_t offset;      /* elements from the start of the shard */
    uint64_t n;           /* elements; offset + n <= shard numel */
    enum zt_dtype dtype;  /* gradients: F32, F16 or BF16 (one dtype per shard and step); params: F32 */
    const void *data;     /* n * zt_dtype_size(dtype) bytes */
} zt_server_chunk;

/* Stores the initial fp32 parameters of a range of a shard (rank 0 pushes the model's initial weights
 * once). Allowed only while the run is at step 0; pushing a range again overwrites it. Returns 0, or
 * -ENOENT (unknown run), ZT_EINVAL_CONFIG (block, shard or range out of the layout, a dtype other than
 * F32), ZT_EMISMATCH (a pair this server does not own: the message names the owner) or ZT_ESTATE (the run
 * has committed steps: pull its parameters instead). */
int zt_server_core_push_params(zt_server_core *core, const char *run_id, const zt_server_chunk *c, zt_err *err);

/* Stores a gradient chunk for step `step`, which must be the run's next step (committed + 1). A chunk
 * pushed again overwrites the same elements, so retries are harmless; the core records which elements
 * of each shard have arrived. A push for the step after a commit in progress waits for that commit to
 * finish. Returns 0, or -ENOENT, ZT_EINVAL_CONFIG (range, dtype, a dtype other than the shard's first
 * chunk's), ZT_EMISMATCH (not owned) or ZT_ESTATE for a stale step (already committed) or a future one,
 * the message giving the run's step. Nothing changes on an error. */
int zt_server_core_push_grad(zt_server_core *core, const char *run_id, int64_t step, const zt_server_chunk *c,
                             zt_err *err);

/* The values a worker sends with commit(step): the global gradient norm (for stats), the factor every
 * gradient is multiplied by (the clip coefficient times any loss-scale removal: it becomes AdamW's
 * grad_scale), the learning rate, and whether the step overflowed (then no update is applied). */
typedef struct zt_server_commit_args {
    int64_t step;
    double grad_norm;
    float clip_coef;
    float lr;
    bool overflow;
} zt_server_commit_args;

/* What a commit did. */
typedef struct zt_server_commit_result {
    int64_t step;             /* the run's step after the call */
    int64_t adam_step;
    bool already_committed;   /* args->step was the last committed step: a retried commit, nothing done */
    bool skipped;             /* overflow: the step advanced without an update */
    double seconds;           /* time spent applying the update */
} zt_server_commit_result;

/* Commits step args->step (= committed + 1): checks that every owned shard's gradient has fully arrived
 * (ZT_ESTATE naming the first incomplete block and shard and its first missing element otherwise) and
 * that the initial parameters are complete, then applies AdamW block by block, block 0 first, writing
 * the new master/m/v beside the committed ones and the new low-precision parameters; pulls of block b of
 * this step are served as soon as block b is done. Only when every block is done does the run's step
 * advance and the new state become the committed one; if anything fails before (a store error), the
 * run stays at its previous step with its previous state and gradients, the error is returned and waiting
 * pulls of this step fail with it; the commit may then be retried. With overflow set, no state changes
 * but the step advances; the gradients need not have arrived and are dropped. A commit of the last committed step returns 0 with
 * result->already_committed (a retry whose reply was lost); stale or future steps return ZT_ESTATE. One
 * commit per run at a time (a second returns ZT_ESTATE). result may be NULL. Runs in the caller's thread. */
int zt_server_core_commit(zt_server_core *core, const char *run_id, const zt_server_commit_args *args,
                          zt_server_commit_result *result, zt_err *err);

/* Waits until block `block` of step `step` can be pulled: immediately when step is the committed step,
 * or until the commit in progress (or about to start) of that step has finished the block. A worker may
 * thus pull while it commits (the pulls follow the update block by block). A commit of that step that
 * fails, before it starts (refused) or while it applies, ends the waiting pulls with its error, and so
 * does every later pull of that step until a commit of it starts again. For step 0 it
 * waits for the initial parameters of the owned shards of the block. Returns 0; -ETIMEDOUT after
 * timeout_ms milliseconds (< 0: wait forever); the commit's error if that commit failed; ZT_ESTATE for a
 * step older than the committed one (those parameters are gone) or more than one step ahead. */
int zt_server_core_wait_block(zt_server_core *core, const char *run_id, int64_t step, int block, int timeout_ms,
                              zt_err *err);

/* Copies n low-precision parameters (the run's param_dtype) of shard `shard` of block `block` after step
 * `step`, starting at element `offset` of the shard, into out (n * dtype size bytes, caller's). Waits as
 * zt_server_core_wait_block does. Returns 0 or a negative code as push does and wait_block does. A pull of the
 * whole shard ends the place a standing pull of it named (below). */
int zt_server_core_pull(zt_server_core *core, const char *run_id, int64_t step, int block, int shard,
                        uint64_t offset, uint64_t n, void *out, int timeout_ms, zt_err *err);

/* Places that pulls may stand in: memory of the worker that pulls, which the caller of the core (the state
 * service: a client's shared-memory segment) maps and names by id. get returns bytes [off, off + len) of place
 * `id` with a reference taken, or NULL when the place is gone (the client gave it up, or its bytes do not lie
 * there); put gives the reference back. Both may be called from the thread of any commit. */
typedef struct zt_server_pull_places {
    void *(*get)(void *user, uint64_t id, uint64_t off, uint64_t len);
    void (*put)(void *user, uint64_t id);
    void *user;
} zt_server_pull_places;

/* Sets (places != NULL) or removes the places standing pulls name; call it while no pull or commit runs (the
 * state service does at its creation and destruction). Removing them ends every standing pull. */
void zt_server_core_set_pull_places(zt_server_core *core, const zt_server_pull_places *places);

/* zt_server_core_pull into out, which is bytes [off, off + n * dtype size) of place `id`, where the pull stands
 * when it is a pull of the whole shard (offset 0, the shard's n elements) on a RAM-tier core with places set:
 * the commits after it write the shard's new low-precision parameters straight there during their update,
 * instead of into the core's own copy (made again from the masters when another pull needs it), and a pull of
 * such a step into the same place finds them there and copies nothing (*delivered true, else false). The
 * worker must not write that memory from its first push of a step until its pull of that step has returned. A
 * pull of the shard into another place, or a place that is gone at a commit, ends it. Returns as
 * zt_server_core_pull. */
int zt_server_core_pull_standing(zt_server_core *core, const char *run_id, int64_t step, int block, int shard,
                                 uint64_t offset, uint64_t n, void *out, uint64_t id, uint64_t off, int timeout_ms,
                                 bool *delivered, zt_err *err);

/* One owned shard's fp32 state for zt_server_core_load_state: master weights, m and v, each the shard's
 * zt_server_shard_numel elements (padding included), borrowed for the call. */
typedef struct zt_server_shard_state {
    int block;
    int shard;
    const float *master;
    const float *m;
    const float *v;
} zt_server_shard_state;

/* Replaces the committed state of run_id with the given shards (every pair this server owns, exactly
 * once) at `step` and `adam_step`, as zt_server_core_snapshot_read does from files: a worker resuming its
 * own checkpoint with a core in its process. Pushed gradients are discarded; waits for a commit in
 * progress. Returns 0, or -ENOENT / ZT_EINVAL_CONFIG (a pair missing, not owned or given twice) / a store
 * error, with a message; nothing changes on error. */
int zt_server_core_load_state(zt_server_core *core, const char *run_id, int64_t step, int64_t adam_step,
                              const zt_server_shard_state *shards, int nshards, zt_err *err);

/* Copies elements [offset, offset + n) of the committed fp32 master weights of one owned shard into out,
 * when the run's committed step is `step` (after a commit in progress): the masters a worker that pulls
 * low-precision parameters (param_dtype F16 or BF16) fetches for a checkpoint or an export. Returns 0,
 * ZT_ESTATE when the run is at another step (the message gives it), or a negative code as pull does. */
int zt_server_core_read_masters(zt_server_core *core, const char *run_id, int64_t step, int block, int shard,
                                uint64_t offset, uint64_t n, void *out, zt_err *err);

/* Which fp32 tensor of a shard's committed state zt_server_core_read_state copies. */
enum zt_server_state_tensor {
    ZT_SERVER_MASTER = 0,
    ZT_SERVER_ADAM_M = 1,
    ZT_SERVER_ADAM_V = 2,
};

/* Copies the whole committed fp32 master weights, first or second moment of one owned shard
 * (zt_server_shard_numel elements) into out and the committed step into *step (may be NULL). For tests,
 * conversion tools and the placement-equivalence checks. Returns 0 or a negative code with a message. */
int zt_server_core_read_state(zt_server_core *core, const char *run_id, int block, int shard,
                              enum zt_server_state_tensor which, float *out, int64_t *step, zt_err *err);

/* ---- snapshots ----
 *
 * A snapshot of one server's part of a run is a directory:
 *   manifest.json             format "ztrain-server-snapshot", version, run id, step, adam_step, layout
 *                             (world size, blocks with numel and decay ranges), hyperparameters, param
 *                             dtype, server index and count, and every other file with bytes and crc32c
 *   block_000003.safetensors  for each block with owned shards: "master.<block>.<shard>",
 *                             "m.<block>.<shard>", "v.<block>.<shard>", F32 [shard numel], padding included
 * Concatenating a block's shards and dropping the padding gives that block's range of the CPU trainer's
 * parameter slab and its m/v (worker/train/checkpoint.h), so checkpoints convert both ways.
 * The directory is written as DIR.tmp (every file fsynced), renamed to DIR, and the parent fsynced. */

/* Writes the committed state of run_id to the directory `dir` (which must not exist yet) as described
 * above; the state saved is that of one committed step even while pushes and commits go on (a commit in
 * progress is waited for). Returns 0, or a negative code with a message; on failure nothing is left at
 * dir or dir.tmp. */
int zt_server_core_snapshot_write(zt_server_core *core, const char *run_id, const char *dir, zt_err *err);

/* Reads a snapshot directory: verifies the manifest and every file's size and crc32c first
 * (ZT_ECHECKSUM / ZT_EFORMAT naming the file), checks that it holds every pair this server owns
 * (ZT_EMISMATCH for a snapshot of another server split), then registers the run or, if it exists with
 * the same layout, replaces its state (after a commit in progress has finished). Pushed gradients of the
 * run are discarded. The run's position is written into *info (may be NULL). Nothing changes on error. */
int zt_server_core_snapshot_read(zt_server_core *core, const char *dir, zt_server_run_info *info, zt_err *err);

/* Saves run_id under root as root/<run_id>/server<i>of<S>/step_<step, 8 digits>/ (zt_server_core_snapshot_write),
 * then points root/<run_id>/server<i>of<S>/latest at it (atomically) and removes older snapshots of
 * that server beyond the newest `keep` (keep <= 0: keep all). Saving a step that already has a snapshot
 * returns 0 without writing. The snapshot's path goes into path_out (cap bytes; may be NULL). */
int zt_server_core_snapshot_save(zt_server_core *core, const char *run_id, const char *root, int keep,
                                 char *path_out, size_t cap, zt_err *err);
/* zt_server_core_snapshot_save for a worker's checkpoint (SaveSnapshot): the snapshot is marked as one
 * (an empty file step_<step>.checkpoint beside it), and pruning counts the checkpoints' snapshots apart
 * from the others (--snapshot-commits'), keeping the newest `keep` of each, so that a worker resuming its
 * last checkpoint finds the snapshot of its step however many commits came after it. */
int zt_server_core_snapshot_save_checkpoint(zt_server_core *core, const char *run_id, const char *root, int keep,
                                            char *path_out, size_t cap, zt_err *err);

/* Restores, for every run directory under root, the snapshot its `latest` names for this server
 * (ztrain-server --snapshot-dir at start). A root without runs restores nothing and returns 0; the
 * number of runs restored goes into *nruns (may be NULL). Stops at the first error. */
int zt_server_core_restore_all(zt_server_core *core, const char *root, int *nruns, zt_err *err);

/* ---- statistics ---- */

/* Counters of one run since the core started (or the run was registered). */
typedef struct zt_server_run_stats {
    char run_id[ZT_SERVER_RUN_ID_MAX];
    int64_t step;
    int64_t adam_step;
    int64_t commits;            /* commits applied, overflowed ones included */
    int64_t skipped_steps;      /* overflowed commits */
    uint64_t bytes_pushed;      /* gradient and parameter bytes received */
    uint64_t bytes_pulled;      /* parameter bytes sent (those delivered by a commit included) */
    uint64_t bytes_delivered;   /* parameter bytes commits wrote straight into the places of standing pulls */
    double last_commit_s;       /* seconds of the last commit */
    double total_commit_s;
    uint64_t store_bytes;       /* bytes of master/m/v held in the store (both copies) */
    uint64_t ram_bytes;         /* bytes of RAM the run holds (buffers and RAM store) */
} zt_server_run_stats;

/* Copies the stats of run_id into *out. Returns 0 or -ENOENT. */
int zt_server_core_stats(zt_server_core *core, const char *run_id, zt_server_run_stats *out, zt_err *err);

/* Copies the stats of up to cap runs (in registration order) into out and the number of runs into
 * *nruns (which may exceed cap: call again with more room). Returns 0. */
int zt_server_core_list_stats(zt_server_core *core, zt_server_run_stats *out, int cap, int *nruns);

/* Writes every run's counters in the Prometheus text exposition format (version 0.0.4; metric names
 * ztrain_server_*, label run="<id>") into buf (cap bytes, NUL-terminated when cap > 0). Returns the
 * length of the full text (like snprintf: a value >= cap means it was truncated). */
size_t zt_server_core_metrics_text(zt_server_core *core, char *buf, size_t cap);

/* ---- tests ---- */

/* Makes the n-th store write from now (1 = the next) fail with ZT_EIO, once; n <= 0 disarms. For the
 * tests of commit atomicity only. */
void zt__server_core_fail_store_write(zt_server_core *core, int n);

#endif
