/* The memory planner: where a run's bytes go -- the GPU under --gpu-mem, host RAM and disk -- decided
 * before anything large is allocated.
 *
 * On the GPU the planner prices the layouts the engine offers, fastest first, and takes the first that
 * fits under the cap (--gpu-mem, or the GPU's free memory when no cap is given):
 *   resident  the compute-dtype weights stay on the GPU (with --optimizer gpu, all of the optimizer too);
 *   chunked   the weights stay on the GPU; each block's gradient goes to the host optimizer in pieces
 *             through a few small fp32 buffers instead of whole-block ones;
 *   streamed  the weights stay in page-locked host memory, where the optimizer writes them, and each
 *             block is copied to the GPU ahead of its use, in the forward and again in the backward;
 *             gradients go down in pieces.
 * With an automatic micro-batch (ztrain finetune) it also lowers the rows per micro-batch, raising
 * grad_accum so that a step keeps its tokens. When nothing fits, the refusal names the smallest
 * configuration's need and the changes that would fit, each with its need.
 *
 * In host RAM and on disk the planner compares what the plan needs with what the machine has
 * (MemAvailable, the free space of the state directory) and refuses, naming both numbers, before the
 * run allocates. Under --host-mem it fits the plan's host bytes under the cap, moving state down the tiers
 * as needed: the Adam moments to --moments-dir first (the leading blocks' stay in RAM as far as the cap
 * allows), then the fp32 masters (the same way), and refuses what cannot fit with the minimum and the
 * changes that would fit. The pricing itself is the caller's (the trainer builds the model's and the engine's
 * plans), so the choice and the messages are testable without a GPU. */
#ifndef ZT_WORKER_TRAIN_PLAN_H
#define ZT_WORKER_TRAIN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/train/config.h"

/* Host RAM counted for the process itself beside its plan, measured rather than derived: on a GPU the CUDA
 * context and libraries, the model's host tables, the data loader; on CPU ranks the binary and its libraries,
 * the heap, the threads' stacks, the data loader and the micro-batch's activations of small models. A CPU rank
 * of a tiny GPT-2 peaks at 12.6 MiB in a build without CUDA; a build with CUDA loads the CUDA libraries even
 * on CPU ranks (on a machine without a GPU, 67 MiB of their files resident and about 70 MiB of anonymous
 * memory besides the plan's arrays), so it counts more. */
#define ZT_PLAN_PROCESS_RAM_GPU ((uint64_t)2 << 30)
#ifdef ZT_WITH_CUDA
#define ZT_PLAN_PROCESS_RAM_CPU ((uint64_t)256 << 20)
#else
#define ZT_PLAN_PROCESS_RAM_CPU ((uint64_t)64 << 20)
#endif

enum zt_plan_weights {
    ZT_PLAN_RESIDENT = 0,
    ZT_PLAN_CHUNKED = 1,
    ZT_PLAN_STREAMED = 2,
};

/* "resident", "chunked", "streamed". */
const char *zt_plan_weights_name(enum zt_plan_weights w);

/* Device bytes of one layout, by part. */
typedef struct zt_plan_device {
    size_t engine; /* weights, prefetch window, gradient buffers, the optimizer state on the GPU */
    size_t model;  /* activations and scratch of the micro-batch */
    size_t fixed;  /* cuBLAS workspace, NCCL buffers */
} zt_plan_device;

size_t zt_plan_device_total(const zt_plan_device *d);

/* Prices a layout: weights w, the optimizer on the GPU or not, b rows per rank per micro-batch, every
 * transformer layer checkpointed (true) or as configured (false). */
typedef void (*zt_plan_price_fn)(void *ctx, enum zt_plan_weights w, bool optimizer_on_gpu, int b, bool ckpt_all,
                                 zt_plan_device *out);

typedef struct zt_plan_request {
    uint64_t cap;                  /* --gpu-mem; 0: none */
    uint64_t gpu_free;             /* the GPU's free memory now: the cap when none is given */
    enum zt_train_weights weights; /* auto, gpu (resident or chunked) or host (streamed) */
    bool optimizer_on_gpu;
    bool can_chunk;                /* the optimizer off the GPU, one rank */
    bool can_stream;               /* and ZeRO-3, no --optimizer-gpu-fraction */
    bool ckpt_all;                 /* every layer is checkpointed already */
    int world;                     /* ranks */
    int micro_batch;               /* rows per rank per micro-batch, as configured */
    int grad_accum;                /* as configured */
    int seq_len;
    bool auto_micro;               /* the planner may lower micro_batch (raising grad_accum) */
    zt_plan_price_fn price;
    void *ctx;
} zt_plan_request;

typedef struct zt_plan_choice {
    enum zt_plan_weights weights;
    int micro_batch;    /* rows per rank */
    int grad_accum;     /* raised by as much as micro_batch was lowered */
    zt_plan_device device;
    uint64_t limit;     /* the cap it fits under: --gpu-mem, or the GPU's free memory when there is no cap
                           or less memory free than the cap (a cap at the card's size leaves nothing for
                           the CUDA context and other processes) */
    bool capped;        /* limit is --gpu-mem */
} zt_plan_choice;

/* Chooses the layout; see above. Returns 0, or ZT_ENOMEM with the minimum and the changes that fit in
 * err. */
int zt_plan_fit(const zt_plan_request *r, zt_plan_choice *out, zt_err *err);

/* Host RAM and disk: what the plan needs (at its peak) against what there is. */
typedef struct zt_plan_host {
    uint64_t ram_needed;
    uint64_t ram_available; /* MemAvailable */
    uint64_t disk_needed;   /* 0: nothing on disk */
    uint64_t disk_free;
    const char *disk_dir;   /* where the disk bytes go */
    const char *ram_parts;  /* "master weights 24.9 GiB, ...": what ram_needed is made of, for the message */
    const char *ram_fixes;  /* "" or NULL, or the other settings that would fit, with their needs */
} zt_plan_host;

/* Returns 0, or ZT_ENOMEM naming the numbers and the fixes. */
int zt_plan_check_host(const zt_plan_host *h, zt_err *err);

/* Where the fp32 state of the host AdamW lives, tier by tier. */
typedef struct zt_plan_tiers {
    bool moments_disk;    /* the Adam moments on disk but for the leading blocks' within moments_ram */
    uint64_t moments_ram; /* bytes */
    bool masters_disk;    /* the fp32 masters on disk too but for the leading blocks' within masters_ram */
    uint64_t masters_ram; /* bytes */
} zt_plan_tiers;

/* What one placement of the state costs on the host and on disk, and what the host bytes are made of. */
typedef struct zt_plan_host_price {
    uint64_t ram;
    uint64_t disk;
    char parts[320]; /* "engine 12.0 GiB of which ..., checkpoint staging ...": for the messages */
    uint64_t staging; /* the checkpoints' staging inside ram (a checkpoint of state on disk streams it through a
                         few blocks' buffers); 0: the request's */
} zt_plan_host_price;

typedef void (*zt_plan_host_price_fn)(void *ctx, const zt_plan_tiers *t, zt_plan_host_price *out);

typedef struct zt_plan_host_request {
    uint64_t cap;            /* --host-mem, > 0 */
    bool has_dir;            /* --moments-dir is given (else the disk tiers are priced for the message only) */
    bool can_masters_disk;   /* the masters may go to disk (the passes read a compute-dtype copy) */
    uint64_t staging;        /* the checkpoints' staging inside every price that does not give its own (0: no
                                checkpoints) */
    zt_plan_host_price_fn price;
    void *ctx;
} zt_plan_host_request;

typedef struct zt_plan_host_choice {
    zt_plan_tiers tiers;
    zt_plan_host_price price;
} zt_plan_host_choice;

/* Fits the host state under r->cap: everything in RAM if it fits; else with a directory the moments on disk
 * (the leading blocks' in what the cap leaves), then the masters as well. Returns 0, or ZT_ENOMEM naming the
 * cap, the smallest plan's need and what it is made of, and the changes that fit (--host-mem, --save-every
 * -1, --moments-dir with its need). */
int zt_plan_fit_host(const zt_plan_host_request *r, zt_plan_host_choice *out, zt_err *err);

/* The bytes of one checkpoint of P parameters (model.safetensors 4 P, optim.safetensors 8 P, with grads 4 P
 * more; headers, config and manifest within 1 MiB per million tensors' worth of names, counted as 1 MiB). */
uint64_t zt_plan_checkpoint_bytes(uint64_t P, bool grads);

/* A checkpoint of `need` bytes into dir whose file system has `free_bytes` free (0: unknown, not refused):
 * returns 0, or ZT_ENOMEM naming both numbers, the directory and the fixes, before anything is written. */
int zt_plan_check_checkpoint(uint64_t need, uint64_t free_bytes, const char *dir, zt_err *err);

/* A size flag's value at least `bytes`, rounded up to 64 MiB above 1 GiB (to a MiB below), as the parser
 * takes it: "3584MiB". */
void zt_plan_size_flag(uint64_t bytes, char *buf, size_t cap);

/* MemAvailable of /proc/meminfo, in bytes; 0 when unknown. */
uint64_t zt_plan_ram_available(void);

/* Free bytes of the file system holding dir (statvfs, for unprivileged users); 0 when unknown. */
uint64_t zt_plan_disk_free(const char *dir);

#endif
