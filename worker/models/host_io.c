/* Safetensors import and export of any family's host model; see host_io.h. */
#include "worker/models/host_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/safetensors.h"
#include "worker/models/family.h"      /* zt_family_def: the tables of a host model */
#include "worker/models/host_shared.h" /* the import of one tensor */

int zt__host_find_tensor(const zt_param_info *tensors, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(tensors[i].name, name) == 0)
            return i;
    return -1;
}

/* The name and shape tensor i is exported under; see host_io.h. */
void zt__host_export_layout(const zt_family_def *def, const void *m, int i, char *name, size_t cap, int64_t shape[2])
{
    const zt_param_info *t = def->tensor(m, i);
    shape[0] = t->shape[0];
    shape[1] = t->shape[1];
    if (t->transposed_in_hf) {
        shape[0] = t->shape[1];
        shape[1] = t->shape[0];
    }
    def->hf->export_name(m, t, name, cap);
}

/* Tensor i's values in the files' layout; see host_io.h. */
bool zt__host_export_values(const zt_family_def *def, const void *m, int i, const float *src, float *dst)
{
    const zt_param_info *t = def->tensor(m, i);
    if (t->transposed_in_hf) {
        const size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1]; /* ours [out, in] */
        for (size_t o = 0; o < rows; o++)
            for (size_t k = 0; k < cols; k++)
                dst[k * rows + o] = src[o * cols + k];
        return true;
    }
    return def->hf->reorder && def->hf->reorder(m, i, src, dst, true);
}

/* Tensor i's values from the files' layout into the table's; see host_io.h. */
bool zt__host_import_values(const zt_family_def *def, const void *m, int i, const float *src, float *dst)
{
    const zt_param_info *t = def->tensor(m, i);
    if (t->transposed_in_hf) {
        const size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1]; /* ours [out, in]; the file's [in, out] */
        for (size_t o = 0; o < rows; o++)
            for (size_t k = 0; k < cols; k++)
                dst[o * cols + k] = src[k * rows + o];
        return true;
    }
    return def->hf->reorder && def->hf->reorder(m, i, src, dst, false);
}

/* The most elements zt__host_export_values may write; see host_io.h. */
size_t zt__host_export_staging(const zt_family_def *def, const void *m)
{
    size_t most = 0;
    for (int i = 0; i < def->num_tensors(m); i++) {
        const zt_param_info *t = def->tensor(m, i);
        if ((t->transposed_in_hf || def->hf->reorder) && t->numel > most)
            most = t->numel;
    }
    return most;
}

/* A writer holding every tensor under its Hugging Face name; transposed tensors are written from *hf (a
 * copy in Hugging Face's layout that the caller frees after writing). */
static int export_writer(const zt_family_def *def, const void *m, zt_st_writer **out, float **hf, zt_err *err)
{
    *out = NULL;
    *hf = NULL;
    const float *params = def->params((void *)m);
    const size_t n = def->num_params(m);
    bool any_transposed = def->hf->reorder != NULL;
    for (int i = 0; i < def->num_tensors(m); i++)
        any_transposed |= def->tensor(m, i)->transposed_in_hf;
    if (any_transposed && !(*hf = malloc(n * sizeof(float))))
        return zt_fail(err, ZT_ENOMEM, "out of memory preparing the export (%.1f MiB)",
                       (double)n * sizeof(float) / (1 << 20));
    zt_st_writer *w = zt_st_writer_create();
    int rc = zt_st_writer_add_metadata(w, "format", "pt", err);
    for (int i = 0; i < def->num_tensors(m) && rc == 0; i++) {
        const zt_param_info *t = def->tensor(m, i);
        const float *data = params + t->offset;
        int64_t shape[2];
        char name[160];
        zt__host_export_layout(def, m, i, name, sizeof name, shape);
        if (any_transposed && zt__host_export_values(def, m, i, data, *hf + t->offset))
            data = *hf + t->offset;
        rc = zt_st_writer_add(w, name, ZT_DTYPE_F32, t->ndim, shape, data, err);
    }
    if (rc < 0) {
        zt_st_writer_destroy(w);
        free(*hf);
        *hf = NULL;
        return rc;
    }
    *out = w;
    return 0;
}

int zt__host_export(const zt_family_def *def, const void *m, const char *path, zt_err *err)
{
    zt_st_writer *w = NULL;
    float *hf = NULL;
    int rc = export_writer(def, m, &w, &hf, err);
    if (rc == 0)
        rc = zt_st_writer_write(w, path, err);
    zt_st_writer_destroy(w);
    free(hf);
    return rc;
}

int zt__host_export_sharded(const zt_family_def *def, const void *m, const char *dir, size_t max_shard_bytes,
                            zt_err *err)
{
    zt_st_writer *w = NULL;
    float *hf = NULL;
    int rc = export_writer(def, m, &w, &hf, err);
    if (rc == 0)
        rc = zt_st_writer_write_sharded(w, dir, max_shard_bytes, NULL, err);
    zt_st_writer_destroy(w);
    free(hf);
    return rc;
}

/* Whether the file tensor st holds exactly the values of tensor t in slab tmp (t in the file's layout). */
static bool same_values(const zt_st_tensor *st, const zt_param_info *t, const float *tmp)
{
    if (!zt_st_dtype_is_f32_readable(st->dtype) || st->ndim != t->ndim || st->shape[0] != t->shape[0] ||
        (t->ndim == 2 && st->shape[1] != t->shape[1]))
        return false;
    for (size_t i = 0; i < t->numel; i++)
        if (zt_st_element_f32(st, i) != tmp[t->offset + i])
            return false;
    return true;
}

/* A file's tensor tied to a model tensor, kept until every file has been read. */
typedef struct tied_entry {
    const zt_st_tensor *st;
    const char *file;
    int idx;
} tied_entry;

int zt__host_import(const zt_family_def *def, void *m, const char *path, bool pretrained, zt_err *err)
{
    const zt_hf_names *hf = def->hf;
    const int ntensors = def->num_tensors(m);
    const size_t nparams = def->num_params(m);
    char what[160];
    hf->describe(m, what, sizeof what);
    char **files = NULL;
    int nfiles = 0, ntied = 0, skipped = 0, kept = 0;
    zt_st_file **fs = NULL;
    float *tmp = NULL;
    int *seen = NULL; /* per tensor: 1 + the file that held it, 0 when not seen yet */
    tied_entry *tied = NULL;
    int rc = zt_st_shard_files(path, &files, &nfiles, err);
    if (rc < 0)
        return rc;
    fs = zt_xcalloc((size_t)(nfiles > 0 ? nfiles : 1), sizeof *fs);
    tmp = malloc(nparams * sizeof(float));
    seen = calloc((size_t)ntensors, sizeof *seen);
    tied = calloc((size_t)ntensors, sizeof *tied);
    if (!tmp || !seen || !tied) {
        rc = zt_fail(err, ZT_ENOMEM, "%s: out of memory importing (%.1f MiB)", path,
                     (double)nparams * sizeof(float) / (1 << 20));
        goto out;
    }
    if (nfiles > 1)
        zt_log(ZT_LOG_INFO, "model: importing %s from %d shards", path, nfiles);
    if (pretrained)
        memcpy(tmp, def->params(m), nparams * sizeof(float)); /* what the files lack of the head stays */

    for (int fi = 0; fi < nfiles; fi++) {
        const char *file = files[fi];
        if ((rc = zt_st_open(file, &fs[fi], err)) < 0)
            goto out;
        for (size_t i = 0; i < zt_st_count(fs[fi]); i++) {
            const zt_st_tensor *st = zt_st_get(fs[fi], i);
            int idx = -1;
            enum zt_hf_kind kind = hf->map(m, st->name, &idx);
            if (kind == ZT_HF_BUFFER)
                continue;
            if (kind == ZT_HF_OTHER_HEAD && pretrained) {
                skipped++;
                continue;
            }
            if (kind == ZT_HF_TIED) {
                ZT_ASSERT(idx >= 0 && idx < ntensors && ntied < ntensors);
                tied[ntied++] = (tied_entry){.st = st, .file = file, .idx = idx};
                continue;
            }
            if (kind != ZT_HF_PARAM) {
                rc = zt_fail(err, ZT_EMISMATCH,
                             "%s: unknown tensor '%s' (not a parameter of %s; is this the right model config?)", file,
                             st->name, what);
                goto out;
            }
            const zt_param_info *t = def->tensor(m, idx);
            if (seen[idx]) {
                rc = zt_fail(err, ZT_EMISMATCH,
                             "%s: tensor '%s' appears twice (under two names such as with and without the prefix, "
                             "or in two shards; the other is in %s)",
                             file, t->name, files[seen[idx] - 1]);
                goto out;
            }
            if ((rc = zt__host_check_tensor(t, st, file, err)) < 0)
                goto out;
            zt__host_convert_tensor(t, st, tmp + t->offset);
            seen[idx] = fi + 1;
        }
    }
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = def->tensor(m, i);
        if (seen[i])
            continue;
        if (pretrained && hf->head_optional && t->block == def->num_blocks(m) - 1) {
            kept++;
            continue;
        }
        char name[160];
        hf->export_name(m, t, name, sizeof name);
        rc = zt_fail(err, ZT_EMISMATCH, "%s: tensor '%s' is missing (%s has it)", path, name, what);
        goto out;
    }
    for (int i = 0; i < ntensors && hf->reorder; i++) { /* the files' order into the table's */
        const zt_param_info *t = def->tensor(m, i);
        float *copy = zt_xmalloc(t->numel * sizeof(float));
        memcpy(copy, tmp + t->offset, t->numel * sizeof(float));
        if (seen[i])
            hf->reorder(m, i, copy, tmp + t->offset, false);
        free(copy);
    }
    for (int k = 0; k < ntied; k++) {
        const zt_param_info *t = def->tensor(m, tied[k].idx);
        ZT_ASSERT(!t->transposed_in_hf);
        if (!same_values(tied[k].st, t, tmp)) {
            rc = zt_fail(err, ZT_EMISMATCH, "%s: tensor '%s' differs from '%s', to which the model ties it (%s)",
                         tied[k].file, tied[k].st->name, t->name, hf->tied_fix);
            goto out;
        }
    }
    memcpy(def->params(m), tmp, nparams * sizeof(float));
    if (kept || skipped)
        zt_log(ZT_LOG_INFO, "model: %s: %d tensors of the task head keep their initial values; %d tensors of other "
               "heads were skipped", path, kept, skipped);
    rc = 0;
out:
    free(tmp);
    free(seen);
    free(tied);
    for (int i = 0; i < nfiles; i++)
        zt_st_close(fs ? fs[i] : NULL);
    free(fs);
    zt_st_shard_files_free(files, nfiles);
    return rc;
}
