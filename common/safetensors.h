/* safetensors files (https://huggingface.co/docs/safetensors): the weight format of Hugging Face, used by
 * ztrain for exported weights, imported weights and training-state snapshots.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
 * then the data buffer; offsets are relative to the buffer's start.
 *
 * The reader maps the file read-only and validates the whole header before it returns: JSON syntax,
 * known dtypes, shape products that match the byte ranges, ranges inside the file, no overlaps and no
 * gaps (the tensors tile the buffer exactly, as the format requires), unique names, sane header size.
 * The writer writes to "<path>.tmp", fsyncs and renames, so a reader never sees a partial file. */
#ifndef ZT_COMMON_SAFETENSORS_H
#define ZT_COMMON_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/status.h"

/* Stored as names in the file; the enum order is ztrain's own and only grows. */
enum zt_dtype {
    ZT_DTYPE_F32 = 0,
    ZT_DTYPE_F16 = 1,
    ZT_DTYPE_BF16 = 2,
    ZT_DTYPE_F64 = 3,
    ZT_DTYPE_I8 = 4,
    ZT_DTYPE_U8 = 5,
    ZT_DTYPE_I16 = 6,
    ZT_DTYPE_U16 = 7,
    ZT_DTYPE_I32 = 8,
    ZT_DTYPE_U32 = 9,
    ZT_DTYPE_I64 = 10,
    ZT_DTYPE_U64 = 11,
    ZT_DTYPE_BOOL = 12,
};

#define ZT_ST_MAX_DIMS 8

/* Bytes per element of a dtype. */
size_t zt_dtype_size(enum zt_dtype dtype);

/* "F32", "BF16", ... as written in safetensors headers. */
const char *zt_dtype_name(enum zt_dtype dtype);
/* Parses a safetensors dtype name; returns 0 or ZT_EFORMAT. */
int zt_dtype_parse(const char *name, enum zt_dtype *out);

/* One tensor of a file being read. Pointers stay valid until zt_st_close(). */
typedef struct zt_st_tensor {
    const char *name;
    enum zt_dtype dtype;
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* inside the read-only mapping; not aligned beyond 1 byte in general */
} zt_st_tensor;

typedef struct zt_st_file zt_st_file; /* opaque: an open, validated file */

/* Opens and validates path. On success *out owns the mapping (free with zt_st_close). On failure
 * returns ZT_EFORMAT (with the reason and the path in err) or a negative errno (missing file ...). */
int zt_st_open(const char *path, zt_st_file **out, zt_err *err);
void zt_st_close(zt_st_file *f); /* accepts NULL */

/* Number of tensors and the i-th one, in file order of their data offsets. */
size_t zt_st_count(const zt_st_file *f);
const zt_st_tensor *zt_st_get(const zt_st_file *f, size_t i);
/* The tensor called name, or NULL. */
const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name);
/* The value of a "__metadata__" key, or NULL. */
const char *zt_st_metadata(const zt_st_file *f, const char *key);

/* Copies bytes [offset, offset + bytes) of tensor t of f (inside t->nbytes) into dst, then gives back the
 * pages of the mapping that the copy touched (they are read from the file again if touched later), so that a
 * file read piece by piece holds no more of it in memory than the piece being copied. */
void zt_st_copy_out(const zt_st_file *f, const zt_st_tensor *t, size_t offset, void *dst, size_t bytes);
/* Gives back the pages of the mapping that tensor t of f lies on, once read in place (t->data) and not needed
 * until later: they are read from the file again when touched, so that a file read tensor by tensor holds no
 * more of it in the process's memory than the tensor being read. */
void zt_st_release(const zt_st_file *f, const zt_st_tensor *t);

/* Whether zt_st_element_f32 reads this dtype: F32, F16 and BF16 (the weight dtypes of Hugging Face
 * checkpoints; not F64 or the integer types). */
bool zt_st_dtype_is_f32_readable(enum zt_dtype dtype);

/* IEEE half to float, exactly (zero, subnormals, infinities and NaN included), by moving the bits. */
static inline float zt_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ff, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {
        /* a subnormal half is a normal float: shift the leading one into the implicit bit */
        uint32_t e = 127 - 15 + 1;
        do {
            mantissa <<= 1;
            e--;
        } while (!(mantissa & 0x400));
        bits = sign | (e << 23) | ((mantissa & 0x3ff) << 13);
    }
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* bfloat16 to float, exactly: the top half of a float. */
static inline float zt_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Element i of tensor t as a float, exactly (F16 and BF16 widen without rounding); t->dtype must be
 * F32, F16 or BF16 (zt_st_dtype_is_f32_readable). The data is little-endian and may be unaligned.
 * Inline: importers call it once per element of every weight. */
static inline float zt_st_element_f32(const zt_st_tensor *t, size_t i)
{
    const unsigned char *d = (const unsigned char *)t->data;
    if (t->dtype == ZT_DTYPE_F32) {
        float v;
        memcpy(&v, d + 4 * i, sizeof v);
        return v;
    }
    uint16_t h;
    memcpy(&h, d + 2 * i, sizeof h);
    return t->dtype == ZT_DTYPE_F16 ? zt_f16_to_f32(h) : zt_bf16_to_f32(h);
}

/* The safetensors files of a model checkpoint at path, in the three forms Hugging Face uses: a single
 * .safetensors file (path itself); a sharded checkpoint's index, a path ending in ".json" (such as
 * model.safetensors.index.json), whose "weight_map" maps tensor names to shard files in the index's
 * folder (each shard is listed once, in the order of its first appearance); or a model directory,
 * which stands for its model.safetensors if it has one, else for its model.safetensors.index.json.
 * Only names are resolved here: the files are opened by the caller (zt_st_open), so a missing shard is
 * reported there. On success *files is an array of *n paths that the caller frees with
 * zt_st_shard_files_free. Returns 0, a negative errno (an unreadable index, a directory without either
 * file) or ZT_EFORMAT (an index without a weight_map, or one naming a file outside its folder), with a
 * message in err; on error *files is NULL and *n is 0. */
int zt_st_shard_files(const char *path, char ***files, int *n, zt_err *err);
/* Frees what zt_st_shard_files returned (accepts NULL). */
void zt_st_shard_files_free(char **files, int n);

/* Writing: collect tensors (borrowed data pointers must stay valid until zt_st_write returns), then
 * write the file atomically. Tensors are written in the order they were added. */
typedef struct zt_st_writer zt_st_writer;
zt_st_writer *zt_st_writer_create(void);
void zt_st_writer_destroy(zt_st_writer *w); /* accepts NULL */
/* Adds a tensor; returns 0, or ZT_EINVAL_CONFIG for a duplicate name or ndim > ZT_ST_MAX_DIMS. */
int zt_st_writer_add(zt_st_writer *w, const char *name, enum zt_dtype dtype, int ndim, const int64_t *shape,
                     const void *data, zt_err *err);
/* Adds a "__metadata__" entry (both strings are copied). */
int zt_st_writer_add_metadata(zt_st_writer *w, const char *key, const char *value, zt_err *err);
/* Writes path via path.tmp + fsync + rename. On failure nothing is left at path or path.tmp, and a
 * negative errno or ZT_E* code is returned with a message naming the path. */
int zt_st_writer_write(zt_st_writer *w, const char *path, zt_err *err);
/* Streaming, for data that is never in memory all at once (a checkpoint of state on disk): tensors declared
 * without data (the same checks as zt_st_writer_add), then zt_st_writer_begin creates path.tmp at the file's
 * full size with the header zt_st_writer_write would write (ENOSPC or EFBIG there, before any data), each
 * tensor's bytes arrive through zt_st_writer_put in any order and pieces, and zt_st_writer_finish fsyncs it
 * and renames it to path. A tensor's bytes that are never put read as zeros. The file equals, byte for byte,
 * zt_st_writer_write's of the same tensors. zt_st_writer_destroy of a writer begun and not finished removes
 * path.tmp. Each returns 0, or a negative errno or ZT_E* code with a message naming the path; after a failed
 * finish nothing is left at path.tmp. */
int zt_st_writer_declare(zt_st_writer *w, const char *name, enum zt_dtype dtype, int ndim, const int64_t *shape,
                         zt_err *err);
int zt_st_writer_begin(zt_st_writer *w, const char *path, zt_err *err);
/* bytes of tensor `index` (in the order added, from 0) from byte `offset` of its data */
int zt_st_writer_put(zt_st_writer *w, size_t index, uint64_t offset, const void *data, size_t bytes, zt_err *err);
int zt_st_writer_finish(zt_st_writer *w, zt_err *err);
/* Writes the collected tensors into the folder dir (created if missing) the way Hugging Face shards a
 * checkpoint: tensors in the order they were added fill shards of at most max_shard_bytes of data (a
 * tensor larger than that gets a shard of its own), written as model-00001-of-0000N.safetensors ... with
 * the writer's metadata in each, then model.safetensors.index.json ({"metadata": {"total_size": bytes},
 * "weight_map": {tensor: shard}}) last, every file atomically. When everything fits in one shard, only
 * dir/model.safetensors is written, as transformers does. *nshards (if not NULL) receives the number of
 * files with tensors. Returns 0, or ZT_EINVAL_CONFIG (max_shard_bytes 0), a negative errno or a ZT_E*
 * code with a message naming the file. */
int zt_st_writer_write_sharded(zt_st_writer *w, const char *dir, size_t max_shard_bytes, int *nshards,
                               zt_err *err);

#endif
