/* Training checkpoints: one directory per saved step inside the run directory.
 *
 *   runs/demo/ckpt_000500/
 *     manifest.json       format version, step, Adam step, data position, RNG state, schedule, elapsed time,
 *                         and every other file of the directory with its size and CRC-32C
 *     model.safetensors   parameters with Hugging Face names, F32 (the family's export: also a usable export)
 *     optim.safetensors   Adam moments per tensor: "m.<name>" and "v.<name>" (ztrain names and layout), F32
 *     config.json         the training config (zt_train_config_save; "model" refers to model_config.json)
 *     model_config.json   the model's Hugging Face config
 *     grads.safetensors   only with save_grads: the gradients of the last step, before clipping, ztrain
 *                         names and layout (as optim.safetensors without "m."/"v."), F32; verified on load
 *                         like the other files but not needed to resume
 *   runs/demo/latest      "ckpt_000500\n": the newest checkpoint's name
 *
 * A checkpoint is written as ckpt_000500.tmp/ (each file atomically), then renamed, and only then is
 * `latest` updated (atomically), so a crash at any point leaves the previous checkpoint usable. Loading
 * verifies every file's size and CRC-32C before anything is read into the model, whole (zt_checkpoint_load)
 * or tensor by tensor (zt_checkpoint_open/read). */
#ifndef ZT_WORKER_CHECKPOINT_H
#define ZT_WORKER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"
#include "worker/data/dataloader.h"
#include "worker/models/family.h"
#include "worker/train/config.h"
#include "worker/engine/optimizer.h"
#include "worker/train/schedule.h"

#define ZT_CKPT_FORMAT "ztrain-checkpoint"
#define ZT_CKPT_VERSION 1

/* The training state besides the tensors: everything needed to continue bit for bit. */
typedef struct zt_ckpt_state {
    int64_t step;              /* training steps completed (the schedule's position) */
    int64_t adam_step;         /* updates applied (Adam's bias correction); < step if steps were skipped */
    int64_t skipped_steps;     /* steps skipped for a non-finite loss or norm */
    zt_data_position data;     /* the training loader's position after `step` */
    zt_rng rng;                /* the trainer's generator */
    zt_schedule schedule;      /* the schedule the run used (informational on load) */
    double elapsed_s;          /* training time of all sessions so far, in seconds */
    double loss_scale;         /* fp16 dynamic loss scale; 0 when the run has no loss scaler */
    int64_t loss_scale_clean_steps; /* steps since the scale last changed (fp16) */
} zt_ckpt_state;

/* The directory of the checkpoint of step `step` in run directory out_dir: out_dir/ckpt_<step, 6 digits>.
 * Returns 0, or ZT_EINVAL_CONFIG with a message when it does not fit in cap bytes. */
int zt_checkpoint_dir(const char *out_dir, int64_t step, char *out, size_t cap, zt_err *err);

/* Writes checkpoint ckpt_<step> into out_dir from the model, the optimizer, the training config and
 * st, then points out_dir/latest at it. On success the checkpoint's path is written into path_out
 * (cap bytes; may be NULL). On failure nothing new is left behind (the .tmp directory is removed), the
 * previous checkpoint and `latest` are untouched, and a negative code is returned with a message. */
int zt_checkpoint_save(const char *out_dir, const zt_family_model *model, const zt_optimizer *opt,
                       const zt_train_config *cfg, const zt_ckpt_state *st, char *path_out, size_t cap,
                       zt_err *err);

/* zt_checkpoint_save that also writes grads.safetensors from grads (the model's gradient slab layout,
 * zt_family_model_num_params floats) and lists it in the manifest; grads NULL writes no gradient file. */
int zt_checkpoint_save_with_grads(const char *out_dir, const zt_family_model *model, const zt_optimizer *opt,
                                  const float *grads, const zt_train_config *cfg, const zt_ckpt_state *st,
                                  char *path_out, size_t cap, zt_err *err);

/* A checkpoint written from state that arrives tensor by tensor (zt_engine_export_stream's, for state on
 * disk), so that the model's weights and moments are never in host memory at once: the same files, byte for
 * byte, as zt_checkpoint_save_with_grads from the same values.
 *   zt_checkpoint_begin  creates ckpt_<step>.tmp with model.safetensors and optim.safetensors at their full
 *                        sizes (a disk that cannot hold them fails here) and *out (free with finish or
 *                        abandon);
 *   zt_checkpoint_put    writes elements [host_offset, host_offset + numel) of the host model's layout of the
 *                        masters, m and v (numel floats each, borrowed for the call) into both files; a
 *                        zt_engine_state_sink (writer as void *). A tensor that the export transposes or
 *                        reorders must arrive whole (else ZT_EINVAL_CONFIG, nothing written); arriving again
 *                        overwrites it;
 *   zt_checkpoint_finish the configs, grads.safetensors from grads (NULL: none), the manifest, the rename and
 *                        `latest`, as zt_checkpoint_save_with_grads; frees w, success or not;
 *   zt_checkpoint_abandon removes the .tmp directory and frees w (accepts NULL).
 * Each returns 0 or a negative code with a message; on failure nothing new is left behind. The writer holds
 * zt_checkpoint_stream_bytes of host memory (one tensor in the files' layout). */
typedef struct zt_ckpt_writer zt_ckpt_writer;
int zt_checkpoint_begin(const char *out_dir, const zt_family_model *model, int64_t step, zt_ckpt_writer **out,
                        zt_err *err);
int zt_checkpoint_put(void *writer, size_t host_offset, size_t numel, const float *params, const float *m,
                      const float *v, zt_err *err);
int zt_checkpoint_finish(zt_ckpt_writer *w, const float *grads, const zt_train_config *cfg, const zt_ckpt_state *st,
                         char *path_out, size_t cap, zt_err *err);
void zt_checkpoint_abandon(zt_ckpt_writer *w);
size_t zt_checkpoint_stream_bytes(const zt_family_model *model);

/* Finds the checkpoint meant by dir: dir itself when it holds a manifest.json, otherwise the one named
 * by dir/latest. Writes its path into out (cap bytes). Returns 0, or a negative code with a message
 * saying what dir should be. */
int zt_checkpoint_find(const char *dir, char *out, size_t cap, zt_err *err);

/* Reads ckpt_dir/manifest.json and checks the size and CRC-32C of every file it lists. Returns 0,
 * ZT_ECHECKSUM ("checkpoint X is corrupt: model.safetensors crc32c mismatch ..."), ZT_EFORMAT for a
 * bad manifest, or a negative errno for a missing file, with a message. st may be NULL; otherwise it
 * receives the manifest's state. */
int zt_checkpoint_verify(const char *ckpt_dir, zt_ckpt_state *st, zt_err *err);

/* Verifies ckpt_dir, checks that its model config equals the model's (ZT_EMISMATCH naming the first
 * field that differs otherwise), then loads the parameters into the model, the Adam moments and step
 * into opt, and the state into st. Nothing is changed unless everything checks out. */
int zt_checkpoint_load(const char *ckpt_dir, zt_family_model *model, zt_optimizer *opt, zt_ckpt_state *st, zt_err *err);

/* A checkpoint read tensor by tensor (into zt_engine_import_stream, for state on disk or a --host-mem cap), so
 * that the model's weights and moments are never in host memory at once: the mirror of zt_checkpoint_begin/put.
 *   zt_checkpoint_open  verifies everything zt_checkpoint_load does before it hands out a value: the manifest,
 *                       every file's size and CRC-32C (one read-only pass over the files, 1 MiB at a time), the
 *                       model config (ZT_EMISMATCH naming the field), and that model.safetensors and
 *                       optim.safetensors hold every tensor of the model with its name, shape and F32, and
 *                       nothing else (ZT_EFORMAT). Then it maps both files and fills *st with the state and, when
 *                       opt is not NULL, opt's Adam step and counters (its m and v are not touched). On failure
 *                       nothing is changed and *out is NULL;
 *   zt_checkpoint_read  a zt_engine_state_source (reader as void *): elements [host_offset, host_offset + numel)
 *                       of the host model's layout of the masters, m and v (numel floats each) into the caller's
 *                       arrays; every element must belong to a model tensor. A tensor that the files hold
 *                       transposed or reordered is read whole once and turned into the table's layout. The
 *                       mapping's pages of what was copied are given back at once, so the page cache, not the
 *                       process, keeps the files;
 *   zt_checkpoint_close unmaps the files and frees r (accepts NULL).
 * The reader holds zt_checkpoint_read_bytes of host memory (two tensors of the largest transformed size). The
 * check comes first, in a pass of its own, because the engine writes what it is handed where the state lives
 * (the records on disk among it) as it goes: a checksum known only at the end could not undo that. */
typedef struct zt_ckpt_reader zt_ckpt_reader;
int zt_checkpoint_open(const char *ckpt_dir, const zt_family_model *model, zt_optimizer *opt, zt_ckpt_state *st,
                       zt_ckpt_reader **out, zt_err *err);
int zt_checkpoint_read(void *reader, size_t host_offset, size_t numel, float *params, float *m, float *v, zt_err *err);
void zt_checkpoint_close(zt_ckpt_reader *r);
size_t zt_checkpoint_read_bytes(const zt_family_model *model);

#endif
