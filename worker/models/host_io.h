/* Safetensors import and export of a host model from its tensor table, for every family (written once).
 *
 * A family says how its table meets Hugging Face files (struct zt_hf_names): the name each tensor is
 * exported under, and what a name found in a file means — a parameter (with or without the prefix that
 * Hugging Face puts before the base model's tensors, under older aliases), a buffer to skip (rotary
 * inv_freq, attention masks, position ids), a tensor tied to a parameter (lm_head.weight of a tied head: it
 * must hold the same values), or the tensor of a task head the model does not have (skipped when importing
 * a pretrained body). Linear weights marked transposed_in_hf (GPT-2's Conv1D) are transposed both ways, and
 * tensors the family reorders (GPT-NeoX's per-head q, k, v rows) are reordered both ways.
 *
 * Import reads a single file, a sharded index (model.safetensors.index.json) or a model folder in two steps:
 * the open checks every tensor of every file (missing, extra, duplicated or misshapen tensors, dtypes other
 * than F32, F16 and BF16, NaN and infinity, tied tensors that differ are errors naming the tensor and its file)
 * without writing the model; the fill then converts the tensors into the model's slab block by block, as a
 * caller that takes the weights block by block (the engine, from a lazily created model) asks for them. The
 * files stay mapped in between (page cache, not the process's own memory: each tensor's pages are given back
 * once read); nothing of the model's size is allocated beside its slab. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_HOST_IO_H
#define ZT_WORKER_MODELS_HOST_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/params.h"

struct zt_family_def;

/* What a tensor name in a file means to the model. */
enum zt_hf_kind {
    ZT_HF_PARAM = 0,   /* the model's tensor *idx */
    ZT_HF_BUFFER,      /* not a parameter (a buffer that older files carry): skipped */
    ZT_HF_TIED,        /* a tensor that must equal the model's tensor *idx (a tied head) */
    ZT_HF_OTHER_HEAD,  /* a task head the model does not have: skipped for a pretrained body, else unknown */
    ZT_HF_UNKNOWN,
};

typedef struct zt_hf_names {
    /* The name tensor t is exported under (at most cap bytes with the NUL). */
    void (*export_name)(const void *m, const zt_param_info *t, char *out, size_t cap);
    /* What the file's tensor `name` is, with the table index in *idx for ZT_HF_PARAM and ZT_HF_TIED. */
    enum zt_hf_kind (*map)(const void *m, const char *name, int *idx);
    /* The model in words for messages: "a GPT-2 with 12 layers". */
    void (*describe)(const void *m, char *out, size_t cap);
    /* Appended to the message of a tied tensor that differs: what to change in the config. */
    const char *tied_fix;
    /* A pretrained body may lack the tensors of the last block (the task head: they keep their initial
     * values); false: every tensor is required. */
    bool head_optional;
    /* Optional (NULL: every tensor has the table's element order in the files): whether tensor idx is stored
     * in another order (GPT-NeoX's fused q | k | v rows interleave the heads); if so it writes src (numel
     * elements) into dst in the files' order (to_hf) or back into the table's (!to_hf) and returns true. */
    bool (*reorder)(const void *m, int idx, const float *src, float *dst, bool to_hf);
} zt_hf_names;

/* The index of the tensor named name in the table, or -1. */
int zt__host_find_tensor(const zt_param_info *tensors, int n, const char *name);

/* Exports the host model m of family def as F32 safetensors with Hugging Face names into path, atomically
 * (metadata {"format": "pt"}, which transformers requires). */
int zt__host_export(const struct zt_family_def *def, const void *m, const char *path, zt_err *err);
/* The same in Hugging Face's sharded form into dir (shards of at most max_shard_bytes and
 * model.safetensors.index.json; a single model.safetensors when it fits). */
int zt__host_export_sharded(const struct zt_family_def *def, const void *m, const char *dir,
                            size_t max_shard_bytes, zt_err *err);
/* The export in pieces (a checkpoint streamed from state on disk): the name (cap bytes) and shape (ndim of the
 * tensor's) that tensor i is exported under; whether the files hold its values in another layout, and then
 * those values, written from src (its numel values) into dst (numel floats; false: src as it is, dst
 * untouched); and the most elements that may take (the largest tensor transposed or, for a family that
 * reorders, the largest tensor). zt__host_export writes with these. */
void zt__host_export_layout(const struct zt_family_def *def, const void *m, int i, char *name, size_t cap,
                            int64_t shape[2]);
bool zt__host_export_values(const struct zt_family_def *def, const void *m, int i, const float *src, float *dst);
size_t zt__host_export_staging(const struct zt_family_def *def, const void *m);
/* The reverse of zt__host_export_values, for a checkpoint read tensor by tensor: tensor i's values in the files'
 * layout (src, numel) into the table's (dst, numel floats) and true, or false (the files hold the table's layout;
 * dst untouched). */
bool zt__host_import_values(const struct zt_family_def *def, const void *m, int i, const float *src, float *dst);
/* Imports m's parameters from path (a file, an index or a folder): zt__host_import_open, every block filled,
 * zt__host_import_close. With pretrained, tensors of the last block (a task head) that the files lack keep their
 * values and other heads' tensors are skipped (both counted in a log line). Returns 0 or a negative code with a
 * message naming the tensor and the file; on error m is unchanged. */
int zt__host_import(const struct zt_family_def *def, void *m, const char *path, bool pretrained, zt_err *err);

/* An import under way: the files open and every tensor accepted, the model written block by block. */
typedef struct zt__host_importer zt__host_importer;
/* Opens the files of path and checks every tensor against m as zt__host_import does, with its messages, writing
 * nothing into m. On success *out (freed by zt__host_import_close) borrows def and m until then; m's tensors that
 * the files lack keep what m's slab holds when their block is filled (zt__hm_init_through first, for a lazy
 * model, whose initialisation still to come then leaves out the tensors the files hold, until the close: they
 * are not made twice; a tied tensor is compared with those values already: zt_family_def's tensor_values). Holds the
 * largest tensor for a family that reorders (zt__host_import_staging) and, during the check of a tied tensor,
 * a copy of its target. Returns 0 or a negative code with a message (*out NULL). */
int zt__host_import_open(const struct zt_family_def *def, void *m, const char *path, bool pretrained,
                         zt__host_importer **out, zt_err *err);
/* Writes the files' values of every tensor of the blocks up to and including `block` not written yet into m's
 * slab, in the table's layout (transposed and reordered where the files hold another), in table order. */
void zt__host_import_fill_through(zt__host_importer *imp, int block);
/* Closes the files and frees imp (accepts NULL); once every block was filled it logs how many tensors of the task
 * head kept their values and how many of other heads were skipped (when any). */
void zt__host_import_close(zt__host_importer *imp);
/* The floats an open import holds beside m's slab while it fills it: the largest tensor for a family that
 * reorders, else 0 (for planning; m may be a layout). */
size_t zt__host_import_staging(const struct zt_family_def *def, const void *m);

#endif
