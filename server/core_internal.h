/* The state server core's internal structures, shared by core.c (runs, step protocol, stats) and
 * snapshot.c (snapshot files). Not part of the API: server/core.h is. */
#ifndef ZT_SERVER_CORE_INTERNAL_H
#define ZT_SERVER_CORE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "offload/store.h"
#include "server/core.h"

/* A set of element ranges [begin, end), sorted and merged: which parts of a shard have arrived. */
typedef struct zt__ivset {
    zt_server_range *r; /* owned */
    int n;
    int cap;
} zt__ivset;

/* One (block, shard) pair that this server owns. */
typedef struct zt__pair {
    int block;
    int shard;
    uint64_t n;              /* shard numel, padding included */
    zt_store_key key[2];     /* the two state slots in the store */
    void *grad;              /* n * 4 bytes: this step's gradient, of grad_dtype */
    int grad_dtype;          /* enum zt_dtype of this step's chunks; -1 before the first one */
    zt__ivset grad_cov;      /* elements of the gradient that arrived */
    float *init;             /* a store buffer collecting the initial parameters; NULL when none */
    zt__ivset init_cov;      /* elements of the initial parameters that arrived */
    bool init_done;          /* the initial parameters (or a snapshot's) are in the committed slot */
    void *lowp[2];           /* n elements of the run's param_dtype per slot */
    bool lowp_stale[2];      /* lowp[slot] was not written by the update that made the slot: it wrote the place of
                                the standing pull instead (made again from the slot's masters when read) */
    uint64_t place_id;       /* the place the shard's pulls stand in (zt_server_core_pull_standing); 0: none */
    uint64_t place_off;      /* its byte in that place */
    int64_t delivered_step;  /* the step whose commit wrote the place, 0 when none has since that commit began */
} zt__pair;

/* What a run is busy with on its stored state (one at a time). */
enum zt__busy {
    ZT__IDLE = 0,
    ZT__COMMIT = 1,
    ZT__EXCLUSIVE = 2, /* snapshot write or read, initial-parameter write */
};

/* One registered run. */
typedef struct zt__run {
    char id[ZT_SERVER_RUN_ID_MAX];
    /* the description, copied */
    int world_size;
    int nblocks;
    uint64_t *numel;          /* [nblocks] */
    zt_server_range **decay;  /* [nblocks] arrays of ndecay[b] ranges */
    int *ndecay;              /* [nblocks] */
    float beta1, beta2, eps, weight_decay;
    enum zt_dtype param_dtype;

    uint64_t key_run;         /* the store's run key (low bit: slot) */
    int npairs;
    zt__pair *pairs;          /* owned pairs ordered by block, then shard */
    int *block_pair;          /* [nblocks + 1]: pairs of block b are [block_pair[b], block_pair[b + 1]) */
    uint64_t owned_numel;
    float *stage[2];          /* NVMe tier: staging buffers of the largest owned shard; NULL on RAM */
    uint64_t ram_bytes;       /* RAM held for this run (accounted against mem_limit) */

    pthread_mutex_t mu;
    pthread_cond_t cv;        /* broadcast on every change of state that a waiter looks at */
    int refs;                 /* lookups in progress plus 1 for the run table */

    int64_t step;             /* committed steps */
    int64_t adam_step;
    int cur;                  /* the committed state's slot */
    int busy;                 /* enum zt__busy */
    int grad_writers;         /* gradient pushes copying into pair buffers outside mu; commits, snapshots and
                                 initial-parameter writes wait for 0 */
    int64_t commit_step;      /* the step being committed, when busy == ZT__COMMIT */
    int ready_blocks;         /* blocks [0, ready_blocks) of commit_step are done */
    int init_pending;         /* pairs still waiting for their initial parameters */
    uint64_t fail_seq;        /* counts failed commits, so waiters notice one */
    int64_t failed_step;      /* the step of the last failed commit until a commit of it starts again (0:
                                 none), so that pulls of it that arrive after the failure end at once too */
    int fail_code;
    char fail_msg[ZT_ERR_LEN];

    zt_server_run_stats stats;
} zt__run;

struct zt_server_core {
    zt_server_core_options opt;
    char *store_path;         /* owned copy of opt.store_path */
    zt_store *store;
    pthread_mutex_t mu;       /* guards runs, nruns and ram_bytes */
    pthread_mutex_t register_mu; /* one registration at a time: two creating the same run would remove
                                    each other's store records (same keys) */
    zt__run **runs;
    int nruns;
    int cap;
    uint64_t ram_bytes;
    int fail_write_in;        /* test hook: fail the n-th store write from now; 0 = off */
    zt_server_pull_places places; /* zt_server_core_set_pull_places; places.get NULL: none */
};

/* Finds run_id and takes a reference (release with zt__run_release), or returns -ENOENT with a message. */
int zt__run_get(zt_server_core *core, const char *run_id, zt__run **out, zt_err *err);
void zt__run_release(zt_server_core *core, zt__run *run);

/* Creates and inserts a run from desc (validated) at step 0; used by register and snapshot reads. */
int zt__run_create(zt_server_core *core, const zt_server_run_desc *desc, zt__run **out, zt_err *err);
/* Removes a run from the table (it is freed when its last reference goes). */
void zt__run_remove(zt_server_core *core, zt__run *run);

/* Waits (run->mu held) until the run is idle and no gradient push is copying, then marks it busy with
 * `what`. */
void zt__run_acquire(zt__run *run, int what);
/* Marks the run idle again and wakes waiters (run->mu held). */
void zt__run_unacquire(zt__run *run);

/* Makes slot `dst`, filled with a complete state of every owned pair, the committed state of `step` and
 * `adam_step` (the run held exclusive, run->mu held): waits for gradient copies in flight, then resets
 * the pairs' gradients and initial-parameter bookkeeping. Used by snapshot reads and state loads. */
void zt__run_install(zt__run *run, int dst, int64_t step, int64_t adam_step);

/* Fills *info (may be NULL) from the run (run->mu held). */
void zt__run_fill_info(const zt__run *run, zt_server_run_info *info);

/* Checks a run description; returns 0 or ZT_EINVAL_CONFIG with the first problem. */
int zt__desc_validate(const zt_server_run_desc *desc, zt_err *err);
/* Compares desc with a registered run; returns 0 or ZT_EMISMATCH naming the first difference. */
int zt__desc_compare(const zt__run *run, const zt_server_run_desc *desc, zt_err *err);

/* One store write through the test hook: returns ZT_EIO when the hook says this write fails. */
int zt__store_write_hook(zt_server_core *core, zt_err *err);

/* Recomputes a pair's low-precision parameters of slot `slot` from fp32 master weights. */
int zt__pair_make_lowp(zt_server_core *core, const zt__run *run, zt__pair *p, int slot, const float *master,
                       zt_err *err);

/* Reads a pair's record of slot `slot`: returns a pointer to its 3n floats (master, m, v) -- the RAM
 * record itself, or buf (a store buffer of the pair's size) filled from the NVMe tier. */
int zt__pair_read(zt_server_core *core, zt__pair *p, int slot, float *buf, float **data, zt_err *err);
/* Writes 3n floats (master, m, v) into a pair's record of slot `slot` (through the test hook). On NVMe
 * src must be a store buffer. */
int zt__pair_write(zt_server_core *core, zt__pair *p, int slot, const float *src, zt_err *err);

#endif
