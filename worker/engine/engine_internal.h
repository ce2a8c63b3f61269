/* The training engine's internal structures, shared by engine.c (layout, the block walk, the window, the
 * gradient path, state export), engine_cpu.c and engine_cuda.c (the device each computes on),
 * host_optimizer.c (placement cpu with the model on a GPU) and engine_server.c (placement server). Not part
 * of the API: worker/engine/engine.h is. */
#ifndef ZT_WORKER_ENGINE_INTERNAL_H
#define ZT_WORKER_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/cpu_adam.h"
#include "worker/engine/engine.h"

/* What the engine asks of the device the model computes on. Work is enqueued on a stream (a
 * cudaStream_t; NULL on the CPU, where everything runs at once in the caller) and ordered across streams
 * with events. Failures of the device are broken invariants and abort (ZT_CUDA_CHECK). */
typedef struct zt__engine_dev {
    bool gpu;
    void *(*alloc)(size_t bytes);        /* device memory, zeroed; NULL when there is not enough */
    void (*free)(void *p);
    void *(*host_alloc)(size_t bytes);   /* host memory for copies (page-locked on a GPU), zeroed; or NULL */
    void (*host_free)(void *p);
    /* Page-locks host memory that calloc gave (copies from it run at the link's speed): true when done (always
     * on the CPU); host_unregister undoes it before the memory is freed. */
    bool (*host_register)(void *p, size_t bytes);
    void (*host_unregister)(void *p);
    void *(*stream_create)(void);
    void (*stream_destroy)(void *s);
    void (*stream_sync)(void *s);
    void *(*event_create)(void);
    void (*event_destroy)(void *ev);
    void (*record)(void *ev, void *stream);
    void (*wait)(void *stream, void *ev);      /* stream waits for ev's work */
    void (*event_sync)(void *ev);              /* the host waits for ev's work */
    float (*elapsed_ms)(void *a, void *b);     /* between two completed events; 0 on the CPU */
    void (*memset0)(void *p, size_t bytes, void *stream);
    void (*copy)(void *dst, const void *src, size_t bytes, void *stream); /* any direction */
    /* dst[i] = src[i] * scale (overwrite) or dst[i] + src[i] * scale, src of dtype */
    void (*fold)(float *dst, const void *src, enum zt_dtype dtype, size_t n, float scale, bool overwrite,
                 void *stream);
    void (*cast)(void *dst, enum zt_dtype dtype, const float *src, size_t n, void *stream);
    /* Runs fn(arg) on the host once the stream's work before it is done, and holds the stream's later work
     * until it returns (at once on the CPU). fn may not call the device. */
    void (*host_call)(void *stream, void (*fn)(void *arg), void *arg);
    /* The optimizer step with the state on this device (placement gpu on a GPU, cpu on the CPU). */
    int (*resident_step)(zt_engine *e, float lr, int64_t adam_step, zt_engine_step_result *res, zt_err *err);
    /* Gradients leaving the device: adds the sum of squares of x [n fp32] into the step's norm. */
    void (*norm_add)(zt_engine *e, const float *x, size_t n, void *stream);
    /* ... and finishes it: every rank's sum (all-reduce) and the non-finite flag of the losses; waits
     * for them on the host. */
    int (*norm_finish)(zt_engine *e, double *sumsq, bool *nonfinite, zt_err *err);
    /* HOST path: AdamW of the resident blocks (gpu_fraction) on the device with the host's clip coefficient. */
    void (*resident_update)(zt_engine *e, float lr, float clip_coef, int64_t adam_step);
    /* Device memory in use as the driver reports it; NULL on the CPU. */
    size_t (*used_bytes)(zt_engine *e);
    /* Frees what the device part of the engine holds (scratch for the norm etc.). */
    void (*teardown)(zt_engine *e);
} zt__engine_dev;

const zt__engine_dev *zt__engine_dev_cpu(void);
#ifdef ZT_WITH_CUDA
const zt__engine_dev *zt__engine_dev_cuda(void);
#endif

/* Sets up the device part of e (norm scratch, the resident optimizer's tensor list); 0 or ZT_ENOMEM. */
int zt__engine_dev_setup_cpu(zt_engine *e, zt_err *err);
#ifdef ZT_WITH_CUDA
int zt__engine_dev_setup_cuda(zt_engine *e, zt_err *err);
#endif

/* Where the optimizer state lives, from (placement, device). */
enum zt__opt_home {
    ZT__OPT_DEVICE = 0, /* on the compute device: placement gpu, or cpu with the CPU computing */
    ZT__OPT_HOST = 1,   /* host memory while a GPU computes: placement cpu */
    ZT__OPT_SERVER = 2, /* state servers */
};

/* How a block's gradient reaches its owned fp32 shard (chosen once at creation). */
enum zt__grad_path {
    ZT__GRAD_DIRECT_LOWP = 0, /* W = 1, one micro-batch, bf16/fp16, optimizer on the device: the kernels write
                                 the compute-dtype gradient into glow_slab, which the norm and AdamW read */
    ZT__GRAD_DIRECT_F32 = 1,  /* W = 1, optimizer on the device: the gradient lands in gshard (fp32 compute:
                                 the kernels add into it; else folded from a compute-dtype buffer) */
    ZT__GRAD_REDUCE = 2,      /* W > 1, optimizer on the device: folded into an fp32 block buffer, reduce-
                                 scattered into gshard on the step's last micro-batch */
    ZT__GRAD_HOST = 3,        /* optimizer off the GPU: folded (and reduce-scattered) per micro-batch into a
                                 device shard buffer that goes to the host gradient, where micro-batches add up */
};

/* A piece of one tensor inside this rank's shard of a block: what one AdamW call updates. */
typedef struct zt__piece {
    int block;
    size_t shard_off;   /* first element in the shard slabs */
    size_t n;
    bool decay;
} zt__piece;

enum zt__slot_state { ZT__SLOT_EMPTY, ZT__SLOT_GATHERING, ZT__SLOT_HELD, ZT__SLOT_CACHED };

typedef struct zt__slot {
    void *buf;          /* compute dtype [elems] */
    size_t elems;
    int block;          /* the block it holds or receives, or -1 */
    enum zt__slot_state state;
    void *ready;        /* event: the all-gather into it is done (comm stream) */
    void *done;         /* event: its last reader is done (compute stream) */
} zt__slot;

typedef struct zt__block {
    size_t len;         /* elements in the model's layout */
    size_t padded;      /* P_b */
    size_t shard;       /* S_b = P_b / W */
    size_t shard_off;   /* offset of the block's shard in the shard slabs */
    size_t pad_off;     /* offset of the block in the fp32 accumulation slab (ZT__GRAD_REDUCE, grad_accum > 1) */
    int slot;           /* window slot holding it, or -1 */
    void *gbuf;         /* the gradient buffer handed to the model in this micro-batch, or NULL */
    float *gfull;       /* the fp32 buffer of the whole block receiving it (REDUCE / HOST), or NULL */
    int ring;           /* ring buffer index of gfull, or -1 */
    int glow;           /* chunked: which compute-dtype buffer (0, 1, 2: glow0..2) gbuf is */
    void *folded;       /* event: folded (compute stream), or reduced */
    void *loaded;       /* event: the step's gradient so far is back on the device (HOST path) */
    void *grad_out;     /* event: the step's gradient shard reached the host (HOST path) */
    void *updated;      /* event: the block's new weights are in wshard (optimizer off the device) */
    bool resident;      /* HOST path: this block's optimizer state stays on the GPU (gpu_fraction) */
    size_t res_off;     /* its shard's offset in the resident slabs */
} zt__block;

/* One addition of a micro-batch's gradient (in h_gstage) into the step's sum in h_grad, on the host
 * (grad_accum_host): the argument of a host_call, one per block or per piece of a block. */
typedef struct zt__hadd {
    float *dst;
    const float *src;
    size_t n;
    int threads;
} zt__hadd;

/* The ring of fp32 block buffers for REDUCE (grad_accum 1) and HOST paths; one more buffer, index ZT__RING,
 * belongs to the head's block, whose gradient lives from the head's backward to the end of the backward. */
#define ZT__RING 4

struct zt_engine {
    zt_model *model;
    zt_comm *comm;
    zt_engine_options o;
    const zt__engine_dev *dev;
    enum zt__opt_home home;
    enum zt__grad_path path;
    bool chunked;                   /* HOST path at W = 1 in pieces of o.grad_chunk elements (ring[] are pieces) */
    bool hgrad_lowp;                /* chunked, one rank, placement cpu or server, bf16, grad_accum 1, no
                                       gpu_fraction: the step's gradient is one micro-batch's bf16 gradient times
                                       1, exact in bf16: h_grad16 holds it */
    bool windowed;                  /* block weights go through window slots: W > 1 (gathered) or streamed */
    bool dry;                       /* zt_engine_plan_for: allocations are only counted */
    bool releasing;                 /* zt_engine_create's import with release_host_params: each block's source
                                       pages are given back once taken */
    const float *filling;           /* zt_engine_create's host_params while o.fill_host_block fills it */
    int W, rank, nb;
    enum zt_dtype dtype;            /* compute dtype */
    size_t esize;
    zt__block *blocks;
    size_t nshard;                  /* sum of S_b */
    size_t max_padded;
    void *cs, *ms, *down, *up;      /* streams: compute (the model's), communication, copies to and from the host */
    void *sstage;                   /* streamed, W > 1: compute dtype [max shard], this rank's shard on its way into
                                       the all-gather (on the communication stream) */
    float *mstage;                  /* o.stream_masters: fp32 [mpiece], a piece of a master shard on its way up */
    size_t mpiece;                  /* its elements: o.grad_chunk, or the largest shard (the head's too) */
    void *fs;                       /* chunked: the stream that folds gradient pieces and sends them down, so that
                                       the next block's backward need not wait for the sums coming up */

    /* Device buffers. */
    float *master;                  /* fp32 [nshard]: ZT__OPT_DEVICE only */
    void *m, *v;                    /* moment dtype [nshard]: ZT__OPT_DEVICE only */
    float *gshard;                  /* fp32 [nshard]: the reduced gradient (device optimizer), or NULL */
    void *wshard;                   /* dtype [nshard]: the weights the gathers read; == master in fp32 on the device */
    void *glow_slab;                /* dtype [nshard]: ZT__GRAD_DIRECT_LOWP */
    void *glow0, *glow1;            /* dtype: compute-dtype gradient buffers (block 0's, the others') */
    void *glow2;                    /* chunked: a second buffer for the other blocks, alternating with glow1 */
    void *glow_free[3];             /* chunked: events, the folds of glow0, glow1, glow2 are done (fold stream) */
    int glow_next;                  /* chunked: 1 or 2, the buffer the next non-head block takes */
    float *gacc;                    /* fp32 [sum P_b]: ZT__GRAD_REDUCE with grad_accum > 1 */
    float *ring[ZT__RING + 1];      /* fp32 [max_padded]; the head's [its padded] */
    void *ring_free[ZT__RING + 1];  /* events: the ring buffer's last user is done */
    int ring_next;
    float *dshard[ZT__RING + 1];    /* fp32 [max shard]: ZT__GRAD_HOST at W > 1 (reduce-scatter target, loaded sum) */
    float *dshard2[ZT__RING + 1];
    zt__slot *slots;
    int nslots;
    size_t device_bytes;            /* what the buffers above take */
    size_t plan_device_bytes, measured_device_bytes, free_at_start;

    /* The leading blocks whose state stays on the GPU with the optimizer off it (gpu_fraction). */
    float *r_master, *r_m, *r_v, *r_grad; /* fp32 [nres] */
    size_t nres;
    int nresident;                  /* blocks 0 .. nresident-1 */

    /* Host buffers (optimizer off the device). */
    float *h_master;                /* [nshard]: ZT__OPT_HOST and SERVER (on the CPU with servers: wshard) */
    void *h_m, *h_v;                /* moment dtype [nshard]: ZT__OPT_HOST; fp32 in SERVER's resume */
    size_t msize;                   /* bytes of a moment element (4, or 2 with bf16 moments) */
    char moments_dir[4096];         /* the moments' directory (o.moments_dir), "" = host memory */
    struct zt_store *mstore;        /* the moments' records on disk, or NULL */
    float *mbuf[2];                 /* staging of two blocks' moment records (4096-aligned) */
    int mahead[2];                  /* the block whose record is being read into mbuf[i] ahead of the next update
                                       (blocks mram_blocks and mram_blocks + 1, queued once the last update's writes
                                       are done), or -1; its ticket mahead_ticket[i] is not waited for yet */
    int mahead_ticket[2];
    int mram_blocks;                /* moments_dir: blocks [0, mram_blocks) keep their moments in h_m and h_v
                                       (o.moments_ram_bytes), the others in records on disk */
    int xram_blocks;                /* masters_disk: blocks [0, xram_blocks) keep their fp32 masters in h_master (at
                                       least mram_blocks), the others in their records; nb without masters_disk */
    bool h_moments_zero;            /* h_m and h_v are as calloc left them: zeros, their pages not taken */
    float *h_grad;                  /* [nshard] page-locked: the step's gradient shard, summed over micro-batches
                                       (mapped untouched, page-locked once the weights' import is done) */
    bool hacc;                      /* grad_accum_host applies: the middle micro-batches add on the host */
    float *h_gstage;                /* hacc: page-locked [the largest shard, or a piece]: a micro-batch's gradient
                                       on its way into h_grad */
    zt__hadd *hadds;                /* hacc: the additions, block b's from hadd_first[b] (one per piece) */
    int *hadd_first;                /* [nb + 1] */
    uint16_t *h_grad16;             /* [nshard] page-locked, instead of h_grad where hgrad_lowp */
    void *h_lowp;                   /* [nshard] compute dtype, page-locked: updated weights on their way up (none
                                       with o.stream_masters) */
    bool master_registered;         /* o.stream_masters: h_master is page-locked (host_register) */
    size_t late_bytes;              /* bytes of the host gradient (h_grad or h_grad16), page-locked late */
    bool late_registered;           /* ... and whether it is page-locked yet */
    bool grad_shared;               /* placement server: the pushed gradient (h_grad, h_grad16, or gshard on the
                                       CPU) lies in the state client's shared memory (zt_state_client_shared_alloc),
                                       which the servers on this host read where it lies; the client frees it */
    bool weights_shared;            /* placement server: the weights pulls land in (h_lowp on a GPU, wshard, which
                                       is then h_master, on the CPU) lie in the client's shared memory, which the
                                       servers on this host write into; the client frees it */
    size_t host_bytes, host_pinned_bytes;

    /* Tensors inside this rank's shards. */
    zt__piece *pieces;
    int npieces;

    /* The micro-batch in flight. */
    int *seq, seq_len, pos;         /* order of weight acquisitions, and the next position */
    int micro;
    bool training, last;
    float inv_scale;
    float micro_loss_sum;           /* unused on the GPU until the step reads the model's losses */
    int micros_done;

    /* The step (host side). */
    int64_t step_no;                /* steps completed by this engine */
    int64_t ready_step;             /* ZT__OPT_HOST/SERVER: blocks hold the weights of this many steps once
                                       their `updated` event completes; see block_ready */
    double t_step0;

    /* Device-specific state (engine_cpu.c / engine_cuda.c). */
    void *devstate;

    /* Host update thread (ZT__OPT_HOST, and ZT__OPT_SERVER on a GPU). */
    struct zt__host_opt *host;

    /* State servers (ZT__OPT_SERVER). */
    char run_id[128];
    int64_t server_step;            /* the servers' committed step as this engine last saw it */
    int64_t stale_step;             /* zt_engine_server_step */
    bool pull_lowp;                 /* a GPU computing in bf16/fp16 pulls its weights in that dtype ... */
    int64_t masters_step;           /* ... and h_master holds the masters of this step (fetched when asked) */
    struct zt__server_pipe *spipe;  /* the thread pulling updated blocks (engine_server.c), or NULL */

    zt_engine_timing timing, last_timing;
};

/* ---- engine.c helpers used by the other files ---- */
void *zt__engine_block_weights(zt_engine *e, int b); /* wshard + the block's shard (W = 1: the block) */
/* Fills the moment fields of an AdamW range over this rank's shard elements [index, index + n): m and v at
 * element moff of the moment arrays m and v (the shard slabs, moff = index; or a block's staging buffer),
 * their dtype, and the stochastic rounding's seed and first index (bf16 moments). */
void zt__engine_moments(const zt_engine *e, zt_cpu_adam_range *r, void *m, void *v, size_t moff, size_t index,
                        int64_t adam_step);

/* ---- moments_disk.c: the Adam moments on disk (moments_dir) ---- */
size_t zt__mdisk_record_elems(const zt_engine *e, int b); /* store elements of block b's record */
size_t zt__mdisk_buffer_bytes(const zt_engine *e);        /* bytes of one staging buffer */
size_t zt__mdisk_bytes(const zt_engine *e);               /* disk bytes of all records */
size_t zt__mdisk_record_bytes(const zt_engine *e, int b);   /* bytes one read or write of block b's record moves */
/* Whether block b's moments are on disk (else in h_m and h_v at the block's shard offset). */
static inline bool zt__mdisk_has(const zt_engine *e, int b)
{
    return e->moments_dir[0] && b >= e->mram_blocks;
}
/* Whether block b's fp32 masters are in its record (then at its start, the moments after them), else in
 * h_master at the block's shard offset. */
static inline bool zt__mdisk_has_master(const zt_engine *e, int b)
{
    return b >= e->xram_blocks;
}
/* Byte offset of the moments in block b's record (after its masters where it holds them). */
static inline size_t zt__mdisk_moment_off(const zt_engine *e, int b)
{
    return zt__mdisk_has_master(e, b) ? e->blocks[b].shard * 4 : 0;
}
/* Opens the store in moments_dir, creates zero records (replacing this rank's earlier ones) and the two
 * staging buffers; 0 or an error naming the directory and the fix. */
int zt__mdisk_open(zt_engine *e, zt_err *err);
void zt__mdisk_close(zt_engine *e);
/* Asynchronous read / write of block b's record into / from staging buffer buf; wait with zt__mdisk_wait. */
int zt__mdisk_read_async(zt_engine *e, int b, int buf, int *ticket, zt_err *err);
int zt__mdisk_write_async(zt_engine *e, int b, int buf, int *ticket, zt_err *err);
int zt__mdisk_wait(zt_engine *e, int ticket, zt_err *err);
/* Synchronous, through staging buffer 0: block b's record as fp32 [S_b] each, read or written: its masters
 * (master: where the record holds them, else ignored and may be NULL) and its moments. */
int zt__mdisk_load(zt_engine *e, int b, float *master, float *m, float *v, zt_err *err);
int zt__mdisk_store(zt_engine *e, int b, const float *master, const float *m, const float *v, zt_err *err);
/* Queues the reads of the first two records the next update needs (blocks mram_blocks, mram_blocks + 1) into
 * the staging buffers, whose writes must be done (the host thread, at the end of an update); the next update
 * waits for them instead of starting with a cold read. */
void zt__mdisk_read_ahead(zt_engine *e);
/* Forgets the reads ahead (waits for them; a failed one is read again by whoever needs the record): before the
 * staging buffers serve anything else or a record changes outside an update (load, store, close). */
void zt__mdisk_drop_ahead(zt_engine *e);

/* What the host AdamW's update waited for on disk (moments_dir), in one step. */
typedef struct zt__disk_timing {
    double read_wait_s;     /* waiting for a block's record to arrive */
    double write_wait_s;    /* waiting for a write to finish before its staging buffer could take the next read */
    double behind_s;        /* after the last block (off the passes' path): the last writes, the reads ahead queued */
    uint64_t bytes_read, bytes_written;
    int read_ahead;         /* records the update found read ahead, during the step's passes */
} zt__disk_timing;

/* ---- host_optimizer.c ---- */
int zt__host_opt_create(zt_engine *e, zt_err *err);
void zt__host_opt_destroy(zt_engine *e);
/* Starts the host AdamW of the step (after the norm): updates blocks 0.. in order on the host thread and
 * sends each block's weights up. skip: no update, the blocks are marked ready at once. */
void zt__host_opt_update(zt_engine *e, float lr, float clip_coef, int64_t adam_step, bool skip);
/* Queues the push of block b's gradient shard (placement server on a GPU) once its copy to the host is done. */
void zt__host_opt_push(zt_engine *e, int b);
/* Waits until the host thread has nothing queued; returns the first error of its jobs since the last
 * call (0 when none), with the message in err. */
int zt__host_opt_drain(zt_engine *e, zt_err *err);
/* Makes `stream` wait until block b holds the weights of the current step (waits on the host until the
 * host thread has queued the block's copy, then on the device for the copy). Returns the host-side wait in
 * seconds. */
double zt__host_opt_wait_block(zt_engine *e, int b, void *stream);
/* The first failure of an update (moments on disk) since the engine started, with its message: 0 when none. */
int zt__host_opt_failed(zt_engine *e, zt_err *err);
/* Seconds the host thread spent on the last step's update (AdamW or server traffic). */
double zt__host_opt_busy(zt_engine *e);
/* Marks block b as holding the weights of `step` steps once the copy the caller queued on the host
 * thread's stream (zt__host_opt_stream) and recorded as `updated` is done. */
void zt__host_opt_mark(zt_engine *e, int b, int64_t step);
void *zt__host_opt_stream(zt_engine *e);
/* The disk traffic of the last finished update with moments on disk (zeros before the first). */
void zt__host_opt_disk(zt_engine *e, zt__disk_timing *t);

/* ---- engine_server.c ---- */
int zt__server_push_all(zt_engine *e, int64_t step, zt_err *err);
/* Pushes block b's gradient shard of `step` (the host thread calls it during the backward). */
int zt__server_push_block(zt_engine *e, int64_t step, int b, zt_err *err);
/* The server part of a step after the norm: waits for this rank's pushes, agreement, then the pulls of the
 * new weights start on the engine's pull thread and rank 0 commits on a thread of its own (the servers update
 * block 0 first, each block is pulled as soon as it is done); returns without waiting for either: the next
 * passes wait for each block they read (zt__host_opt_wait_block), and the commit is agreed before the next
 * backward (zt__server_settle_step). */
int zt__server_step(zt_engine *e, double norm, float clip_coef, float lr, bool skip, zt_err *err);
/* Synchronous pull of every block of `step` for the current step count (attach on resume). */
int zt__server_pull_all(zt_engine *e, int64_t step, zt_err *err);
/* Waits for the pulls and the commit of the last step and makes the ranks agree on their outcome: 0, or the
 * first failure (ZT_ESTATE with e->stale_step for a server at an older step). A step the servers did not
 * take is pushed, committed and pulled again first (its gradients are still there: every rank calls it at
 * the same points, before the next backward, an evaluation, an export). A pull that failed left its blocks
 * with the weights they had, so nothing computed on them may count. */
int zt__server_settle(zt_engine *e, zt_err *err);
/* zt__server_settle for the first micro-batch after a step, between its forward (which read the pulled
 * weights, block by block, while the commit went on) and its backward: *repaired says that the step was
 * pushed, committed or pulled again, so that the forward must be computed again. 0 at once when nothing
 * is pending. */
int zt__server_settle_step(zt_engine *e, bool *repaired, zt_err *err);
/* Brings h_master to the servers' step (pulled in the compute dtype, the fp32 masters stay on the servers
 * until a checkpoint or an export asks for them). Every rank calls it after zt__server_settle. */
int zt__server_fresh_masters(zt_engine *e, zt_err *err);
/* Stops the pull thread (engine destroy); accepts an engine without one. */
void zt__server_pipe_destroy(zt_engine *e);
/* Fills the server fields of a step's timing. */
void zt__server_timing(zt_engine *e, zt_engine_timing *t);

/* Makes the ranks agree on a local outcome: 0 when rc == 0 everywhere, else a negative code (this rank's
 * message when it failed itself, one naming the failed rank otherwise). */
int zt__engine_agree(zt_engine *e, int rc, zt_err *err);

#endif
