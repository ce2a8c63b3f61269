/* The training engine: one step engine for every number of ranks, every device and every optimizer
 * placement (docs/architecture.md). W = 1 is ZeRO with one rank.
 *
 * A model (worker/models/model.h) is a list of blocks; every block's parameters form one flat buffer in
 * the model's layout, padded with zeros to P_b elements (a multiple of W, and of 64 W on a GPU) and split
 * into W shards of S_b = P_b / W elements. Rank r owns shard r of every block: its fp32 master weights,
 * Adam moments m and v, and the reduced fp32 gradient of the step. The engine drives the model block by
 * block, the same way on the CPU and on GPUs:
 *   gather   all-gather block b's low-precision weights (the compute dtype; fp32 on the CPU) into a slot
 *            of the window, `prefetch` blocks ahead on a communication stream; at W = 1 the shard is the
 *            block and nothing is copied;
 *   compute  the block's forward, or (backward order) its recomputation when checkpointed and its
 *            backward, into a gradient buffer in the compute dtype;
 *   release  ZeRO-3 lets the slot go after each use; ZeRO-2 keeps the block until the step ends;
 *   reduce   the block's gradient folded into fp32 and, at W > 1, reduce-scattered (sum) into the owned
 *            shard, while the backward goes on with the next block;
 *   update   AdamW on the owned shards, where the placement puts the optimizer:
 *     gpu     (--device cuda) the fused kernel on the GPU after the backward, one host wait per step;
 *     cpu     --device cpu: AdamW on the CPU shard (the compute device itself);
 *             --device cuda: the master weights and moments live in host memory: each block's gradient
 *             shard goes to pinned host memory as soon as it is reduced; after the backward (the global
 *             norm is known) a host thread updates the blocks in order 0, 1, ... and sends each one's
 *             new low-precision weights back, so the next step's forward waits only for the block it
 *             needs. The GPU holds no fp32 gradient of the whole model; micro-batches of a step add up
 *             in the host gradient (loaded back to the GPU block by block and added there);
 *     server  state servers (worker/state/client.h: remote, or a core in this process) hold the masters
 *             and moments: the gradient shards are pushed as they are reduced, the step is committed
 *             after the backward (rank 0, once every rank has pushed), and the updated low-precision
 *             shards are pulled back, block 0 first.
 *             With gpu_fraction > 0 the leading blocks' state stays on the GPU (DeepSpeed's Twin-Flow split):
 *             those blocks are updated by the GPU at once and the host has fewer blocks to update;
 * cpu and server compute the same AdamW (offload/cpu_adam.h, or its bit-identical GPU twin) on the same
 * gradients: the same bits.
 *
 * Every rank calls the collectives (micro, step, eval, export, import) in the same order. Returns are 0
 * or a negative ZT_E* code with a message in err. */
#ifndef ZT_WORKER_ENGINE_H
#define ZT_WORKER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/comm/comm.h"
#include "worker/models/model.h"
#include "worker/state/client.h"

/* Where AdamW and its state live. */
enum zt_placement {
    ZT_PLACEMENT_GPU = 0,    /* on the GPU that computes (--device cuda) */
    ZT_PLACEMENT_CPU = 1,    /* in this process's host memory */
    ZT_PLACEMENT_SERVER = 2, /* in state servers, remote or embedded */
};

typedef struct zt_engine_options {
    int zero_level;              /* 2: keep a block gathered until the step ends; 3: gather again for backward */
    int prefetch;                /* blocks gathered ahead; >= 0 */
    int grad_accum;              /* micro-batches per step; >= 1 */
    enum zt_placement placement;
    double beta1, beta2, eps, weight_decay, grad_clip; /* AdamW; grad_clip 0 = no clipping */
    int threads;                 /* host AdamW threads; <= 0: the CPU kernels' count */
    bool stream;                 /* optimizer off the GPU (cpu or server), ZeRO-3: the compute-dtype weights stay in
                                    host memory and each block is copied to the GPU when a pass needs it, `prefetch`
                                    blocks ahead, in the forward and again in the backward; with W > 1 each rank
                                    copies up only its own shard and the all-gather assembles the block. On the
                                    CPU (placement cpu) the same path runs with host memory on both sides: the
                                    optimizer state lives in the host arrays of the GPU's layout and AdamW runs on
                                    the host thread, as it does with a GPU */
    bool stream_masters;         /* with stream and placement cpu: the weights come up as the fp32 master shards, in
                                    pieces through a device buffer, and are rounded to the compute dtype on the
                                    device (the bits the host rounding gives): host memory holds no compute-dtype
                                    copy (2 bytes per parameter less with bf16), and each pass copies up 4 bytes
                                    per parameter instead of 2. The masters are page-locked after the first
                                    zt_engine_import */
    size_t grad_chunk;           /* GPU, optimizer off it, one rank: fold and send the gradient in pieces of this
                                    many elements through a few fp32 buffers (0: whole blocks) */
    size_t device_budget;        /* bytes the engine may allocate on the device; 0: no limit */
    enum zt_dtype moment_dtype;  /* the Adam moments: F32 (default) or BF16 (half the bytes, rounded stochastically;
                                    offload/cpu_adam.h), placement cpu only, without gpu_fraction */
    const char *moments_dir;     /* placement cpu with the optimizer's arrays in host memory (a GPU, or streamed
                                    weights on the CPU), without gpu_fraction: the moments live on disk in this
                                    directory (NVMe through io_uring), read ahead of each block's update and
                                    written behind it; NULL or "": host memory. Copied. A read or write that fails
                                    stops the updates; the next zt_engine_step returns the error on every rank */
    size_t moments_ram_bytes;    /* with moments_dir: host memory the moments may keep; the leading blocks whose m
                                    and v fit in it stay in host memory, the rest go to disk (0: all on disk) */
    bool masters_disk;           /* with moments_dir and a compute-dtype copy of the weights in host memory (not
                                    stream_masters): the fp32 masters of the blocks from masters_ram_bytes on live in
                                    their block's record on disk beside its moments (the third tier of the fp32
                                    state), read ahead of the block's update and written behind it; the passes read
                                    the compute-dtype copy the update writes. The same bits as masters in RAM */
    size_t masters_ram_bytes;    /* with masters_disk: host memory the masters may keep; the leading blocks whose
                                    masters fit stay in host memory (never fewer than keep their moments there; 0:
                                    the others on disk) */
    bool moments_no_read_ahead;  /* with moments_dir: do not read the first two records of the next update ahead,
                                    during the step's passes (each update then starts with a cold read; the same
                                    bits either way: for measurements and tests) */
    bool grad_accum_host;        /* optimizer off the device, grad_accum > 2: the middle micro-batches' gradient
                                    shards go down and are added to the step's sum on the host, instead of the sum
                                    coming up, being added on the device and going down again (4 bytes per
                                    parameter per micro-batch up saved); the first goes down as it is, the last
                                    brings the sum up once for the norm. The same bits where the device would add
                                    the same two fp32 numbers: several ranks, or one rank with the gradient in
                                    pieces (grad_chunk), with a loss scale of 1. Ignored elsewhere (one rank in whole
                                    blocks: the kernels add onto the loaded sum in their own order; fp16: the
                                    scaled fold is one fused operation on a GPU) */
    double gpu_fraction;         /* placement cpu with the model on a GPU: the leading blocks (block 0 first) that
                                    hold at least this fraction of the parameters keep their AdamW state on the
                                    GPU and are updated there right after the norm, while the host updates the
                                    rest; the same bits as 0 (none), fewer host bytes per step. 0 to 1 */
    bool release_host_params;    /* zt_engine_create gives back the pages of host_params block by block as it takes
                                    them (madvise), so that the start holds no second copy of the weights; the
                                    caller must not read host_params again (its pages read as zeros) */
    /* zt_engine_create's host_params filled on demand: called with block b before the engine first reads block
     * b's tensors there, blocks in order, so that a host model created lazily (zt_family_model_create_lazy)
     * holds one block of the initial weights at a time. NULL: host_params is filled already */
    void (*fill_host_block)(void *ctx, int block);
    void *fill_host_ctx;
    /* placement server only */
    zt_state_client_t *client;   /* borrowed for the engine's lifetime */
    const char *run_id;          /* the run's id on the servers (copied) */
} zt_engine_options;

typedef struct zt_engine zt_engine; /* opaque */

/* Sets the defaults: ZeRO-3, prefetch 1, grad_accum 1, placement cpu, AdamW 0.9/0.95/1e-8/0.1, clip 1. */
void zt_engine_options_init(zt_engine_options *o);

/* Creates the engine for model over comm: lays out the padded shards, allocates every buffer the plan
 * holds (refusing with ZT_ENOMEM and what to change when it does not fit), and takes this rank's shards of
 * host_params (the host model's slab, model->host_numel floats, the same on every rank) as the initial
 * fp32 masters; m and v start at zero. host_params NULL takes nothing: the state is zeros until
 * zt_engine_import or zt_engine_import_stream fills it (a resume that streams its checkpoint, so that no slab
 * of the model's size is needed). With placement server, call zt_engine_attach_server before the
 * first step. Borrows model and comm for its lifetime. Not a collective. */
int zt_engine_create(zt_engine **out, zt_model *model, zt_comm *comm, const zt_engine_options *o,
                     const float *host_params, zt_err *err);
/* Waits for the work in flight and frees everything; accepts NULL. */
void zt_engine_destroy(zt_engine *e);

/* What an engine for model with these options would hold on one rank of W, without creating it: device
 * bytes (the engine's own buffers; the model's activations are model->device_bytes) and host bytes. */
typedef struct zt_engine_plan {
    size_t device_bytes;
    size_t host_bytes;        /* of which page-locked: */
    size_t host_pinned_bytes;
    size_t host_moment_bytes; /* of which the Adam moments, whose pages are taken at the first update */
    size_t host_master_bytes; /* of which the fp32 masters */
    size_t host_late_bytes;   /* of which the host gradient, page-locked only once the initial weights are in */
    size_t disk_bytes;        /* the records on disk (moments_dir: the moments, with masters_disk some masters), or 0 */
    size_t shard_elems;       /* elements of this rank's shards (padding included) */
    int moments_ram_blocks;   /* the leading blocks whose moments stay in host memory (all without moments_dir) */
    int masters_ram_blocks;   /* the leading blocks whose fp32 masters stay in host memory (all without masters_disk) */
    bool grad_accum_host;     /* the middle micro-batches' gradients are added on the host (grad_accum_host applies) */
    size_t export_stream_bytes; /* host bytes zt_engine_export_stream holds while a checkpoint is written (state on
                                   disk), not in host_bytes; 0 where it does not apply */
    size_t import_stream_bytes; /* host bytes zt_engine_import_stream holds while a checkpoint is read, not in
                                   host_bytes; 0 where it does not apply (placement server) */
    size_t import_bytes;        /* host bytes zt_engine_import (zt_engine_create's initial weights, a checkpoint in
                                   host arrays) holds beside host_bytes while it runs: a block's staging, and with
                                   state on disk its masters, m and v for the block's record */
} zt_engine_plan;
void zt_engine_plan_for(const zt_model *model, int W, const zt_engine_options *o, zt_engine_plan *plan);

/* Logs the memory plan of this rank (INFO): device bytes by part, host bytes, and what is where. */
void zt_engine_log_plan(const zt_engine *e);
/* Device bytes the plan holds (the engine's buffers plus the model's), and the device memory in use
 * after the first step as the driver reports it (0 before; the CPU reports 0). */
size_t zt_engine_plan_device_bytes(const zt_engine *e);
size_t zt_engine_measured_device_bytes(const zt_engine *e);

/* One micro-batch: forward and backward over this rank's tokens and targets [B,T] (host arrays, used
 * only during the call) and, for packed rows, their documents (docs, model.h; NULL: one a row), gradients weighted by grad_weight (1 / (grad_accum W) for the gradient of the
 * global mean loss) and computed under loss_scale (fp16; 1 otherwise). micro counts the step's
 * micro-batches from 0 to grad_accum - 1; the last one reduces the gradients. On a GPU the call returns
 * once the work is enqueued (it may wait for the previous step's updates of the blocks it needs). */
int zt_engine_micro(zt_engine *e, const int32_t *tokens, const int32_t *targets, int B, int T,
                    const zt_model_docs *docs, int micro, float grad_weight, float loss_scale, zt_err *err);

/* What a step did. */
typedef struct zt_engine_step_result {
    float loss;        /* mean over ranks of each rank's mean micro-batch loss */
    double grad_norm;  /* global L2 norm of the gradient before clipping (inf or nan when not finite) */
    float clip_coef;   /* the factor the update applied to the gradient: min(1, clip / (norm + 1e-6)) */
    bool skipped;      /* no update: a loss or the norm was not finite (an fp16 overflow or a divergence) */
} zt_engine_step_result;

/* The step after the last micro-batch: the global norm (one all-reduce), clipping, the non-finite check,
 * and AdamW with learning rate lr at Adam step adam_step (1-based; not advanced when skipped). The host
 * waits for the loss and the norm; with the optimizer off the GPU the update goes on after the call
 * returns (the next micro-batch waits for the blocks it needs). Placement server commits step
 * `server_step` of the servers (the engine counts it from zt_engine_attach_server). A collective. On a
 * state-server failure *res is not meaningful and, when a server holds an older step, zt_engine_server_step
 * gives it. */
int zt_engine_step(zt_engine *e, float lr, int64_t adam_step, zt_engine_step_result *res, zt_err *err);

/* Mean loss of one batch of this rank's rows (docs as zt_engine_micro's) without backward, averaged over the
 * ranks (waits for pending updates first). A collective. */
int zt_engine_eval(zt_engine *e, const int32_t *tokens, const int32_t *targets, int B, int T,
                   const zt_model_docs *docs, float *loss, zt_err *err);

/* *out = the mean over ranks of x (an all-reduce in double). A collective. */
int zt_engine_mean(zt_engine *e, double x, double *out, zt_err *err);

/* Gathers the full training state on every rank into host arrays in the host model's layout
 * (model->host_numel floats each; m and v may be NULL): the fp32 masters (pulled from the servers with
 * placement server) and the moments (not available with remote servers: left as they are). Waits for
 * pending updates first. A collective. */
int zt_engine_export(zt_engine *e, float *params, float *m, float *v, zt_err *err);

/* Receives the state of one model tensor from zt_engine_export_stream: numel fp32 values of each of the
 * masters, m and v, which are elements [host_offset, host_offset + numel) of the host model's slab; the arrays
 * are borrowed for the call. A tensor that two blocks share (tied weights) arrives once from each. Returns 0
 * or a negative code with a message, which stops the export. */
typedef int (*zt_engine_state_sink)(void *ctx, size_t host_offset, size_t numel, const float *params,
                                    const float *m, const float *v, zt_err *err);

/* Whether the engine's state lives partly on disk (placement cpu with moments_dir, masters_disk or not), so
 * that a checkpoint streams it with zt_engine_export_stream instead of gathering it into host arrays. */
bool zt_engine_exports_streamed(const zt_engine *e);

/* zt_engine_export for state on disk, without host arrays of the model's size: block by block, each block's
 * records read back once (its moments widened to fp32) or its state taken from the host arrays, gathered from
 * every rank, and handed to sink tensor by tensor, in block order (a tensor's last delivery holds the values
 * zt_engine_export gives). sink may be NULL (the ranks that do not write). The host holds
 * zt_engine_export_stream_bytes beside the engine's buffers. Waits for pending updates first. A collective:
 * a failure on any rank (a read, a sink) stops it on every rank with that message. ZT_EUNSUPPORTED where
 * zt_engine_exports_streamed is false. */
int zt_engine_export_stream(zt_engine *e, zt_engine_state_sink sink, void *ctx, zt_err *err);
size_t zt_engine_export_stream_bytes(const zt_engine *e);

/* Gathers the gradient of the last step (summed over its micro-batches, before clipping, any loss scale
 * removed) on every rank into a host array in the host model's layout (model->host_numel floats), for
 * checkpoints that keep it. Waits for pending work. A collective. */
int zt_engine_export_grads(zt_engine *e, float *grads, zt_err *err);

/* The reverse: takes this rank's shards of full host arrays (as a checkpoint leaves them, the same on
 * every rank; m and v NULL for zeros) and refreshes the low-precision weights. With placement server the
 * embedded core receives them (remote servers keep their own state: call zt_engine_attach_server with
 * the step to pull theirs). Not a collective. */
int zt_engine_import(zt_engine *e, const float *params, const float *m, const float *v, zt_err *err);

/* Fills one range of the state for zt_engine_import_stream: elements [host_offset, host_offset + numel) of the
 * host model's slab (inside one model tensor) of the masters, m and v, written into the arrays given (numel
 * floats each, the engine's). Returns 0 or a negative code with a message, which stops the import. */
typedef int (*zt_engine_state_source)(void *ctx, size_t host_offset, size_t numel, float *params, float *m, float *v,
                                      zt_err *err);

/* zt_engine_import of a whole state without host arrays of the model's size: block by block, this rank asks
 * source for the parts of the block's tensors inside its own shard only, and puts them where the state lives
 * (the device or host arrays, the records on disk with their compute-dtype copy, the GPU's resident blocks),
 * then refreshes the low-precision weights. The host holds zt_engine_import_stream_bytes beside the engine's
 * buffers (this rank's masters, m and v of one block). Every rank reads for itself: not a collective. When a
 * source fails part of the state is already replaced: check the source first (zt_checkpoint_open verifies the
 * whole checkpoint before it hands out a value) and do not train on an engine whose import failed.
 * ZT_EUNSUPPORTED with placement server (zt_engine_import). */
int zt_engine_import_stream(zt_engine *e, zt_engine_state_source source, void *ctx, zt_err *err);
size_t zt_engine_import_stream_bytes(const zt_engine *e);

/* Placement server: registers the run with the engine's layout (W shards of every block, the tensors'
 * weight decay, AdamW from the options, the compute dtype for pulls), then
 *   step 0, servers at step 0: pushes this rank's shards of the current masters as the initial weights;
 *   a new run (not resumed) that the servers hold at a later step: ZT_EINVAL_CONFIG saying what to do;
 *   a resumed checkpoint of step > 0, embedded core: loads this rank's shards of the current masters and
 *     moments (zt_engine_import first) as the state of that step, Adam step adam_step;
 *   a resumed checkpoint, remote servers: if any server holds another step, rank 0 asks every server for
 *     its snapshot of the checkpoint's step (a worker that stopped after the servers committed more steps);
 *     then every rank pulls its shards of that step. ZT_ESTATE when a server cannot go back to it (one
 *     behind the checkpoint: zt_engine_server_step gives its step, for the trainer's rewind).
 * *server_step (may be NULL) receives the servers' step at registration. A collective for resumed remote
 * runs. */
int zt_engine_attach_server(zt_engine *e, int64_t step, int64_t adam_step, bool resumed, int64_t *server_step,
                            zt_err *err);

/* Placement server: asks every server to write a snapshot of the run's current step (rank 0's part of a
 * checkpoint; embedded_root is where the embedded core writes, NULL with remote servers). */
int zt_engine_server_snapshot(zt_engine *e, const char *embedded_root, zt_err *err);
/* Placement server, before the first step, on every rank: gives a server that lost the run its
 * registration and this rank's initial parameters again (zt_state_client_restore_initial). */
int zt_engine_server_restore_initial(zt_engine *e, zt_err *err);

/* Placement server: the step a server reported when a step failed because it holds an older one (it
 * restarted from a snapshot), agreed by every rank; -1 otherwise. */
int64_t zt_engine_server_step(const zt_engine *e);

/* Where the last step's time went, on this rank (seconds; on the CPU only step and the server fields). */
typedef struct zt_engine_timing {
    double step;          /* wall time from the first micro-batch to the end of zt_engine_step */
    double host_update;   /* host AdamW (placement cpu) or push + commit + pull (server) of the step */
    double wait_update;   /* the engine waiting for blocks that the previous step's update had not finished */
    double wait_norm;     /* waiting at the end of the step for the backward and the norm */
    double copy_down_s;   /* gradient copies to the host (busy time of that copy stream) */
    double copy_up_s;     /* weight and gradient copies to the GPU (busy time of that copy stream) */
    uint64_t bytes_down;  /* bytes copied to the host in the step */
    uint64_t bytes_up;    /* bytes copied to the GPU in the step */
    /* Placement server (on the CPU too): */
    bool server;          /* the fields below are filled */
    double push_s;        /* this rank's gradient pushes, on the host thread while the backward goes on */
    double push_wait_s;   /* after the backward, waiting for the pushes still going */
    double update_s;      /* the last step's commit: the servers' AdamW (rank 0's call; on the other ranks their pull,
                             which follows it), off the critical path: it overlaps this step's forward */
    double server_update_s; /* of that commit, the longest time a server spent applying it (its own clock: the
                               AdamW alone, the rest of update_s is the calls and the waiting); -1 where this
                               rank does not know (the ranks other than 0) */
    double commit_wait_s; /* waiting, between this step's first forward and its backward, for that commit's answer
                             and the ranks' agreement on it */
    double pull_s;        /* the pull of the weights this step computed with (the last step's update), from the
                             commit to the last block: it follows the update block by block and overlaps this
                             step's forward, which waited wait_update for blocks not yet back */
    uint64_t bytes_pushed; /* gradient bytes this rank pushed in the step */
    uint64_t bytes_pulled; /* parameter bytes of that pull */
    uint64_t bytes_pull_copied; /* of those, the bytes this rank copied besides the servers' own copies (out of the
                                   state client's shared-memory slots or TCP messages, or rounded from fp32 on the
                                   host): 0 when the servers wrote them straight into its memory (servers on this
                                   host) and with the embedded server */
    double pull_copy_s;   /* the seconds of those copies, summed over the threads that made them */
    /* Placement cpu with moments_dir (the last finished update): */
    bool disk;              /* the fields below are filled */
    double disk_read_wait;  /* the host AdamW waiting for a block's record to arrive from disk */
    double disk_write_wait; /* ... for a record's write to finish before its staging buffer could take the next read */
    double disk_behind;     /* after the update's last block (the passes no longer wait): the last writes */
    uint64_t disk_bytes_read, disk_bytes_written;
    int disk_read_ahead;    /* records the update found read ahead, during the step's passes (0, 1 or 2) */
} zt_engine_timing;

/* The timing of the last completed step (its update included when it has finished by now). */
void zt_engine_last_timing(zt_engine *e, zt_engine_timing *t);

/* Turns the model's kernel profiling on (GPU; no-op on the CPU) and logs the report (bench). */
void zt_engine_set_profiling(zt_engine *e, bool on);
void zt_engine_profile_report(zt_engine *e);

#endif
