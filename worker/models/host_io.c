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

/* Whether the file tensor st holds exactly vals, tensor t's values in the table's layout. */
static bool same_values(const zt_st_tensor *st, const zt_param_info *t, const float *vals)
{
    if (!zt_st_dtype_is_f32_readable(st->dtype) || st->ndim != t->ndim || st->shape[0] != t->shape[0] ||
        (t->ndim == 2 && st->shape[1] != t->shape[1]))
        return false;
    for (size_t i = 0; i < t->numel; i++)
        if (zt_st_element_f32(st, i) != vals[i])
            return false;
    return true;
}

/* A file's tensor tied to a model tensor, kept until every file has been read. */
typedef struct tied_entry {
    const zt_st_tensor *st;
    const char *file;
    int idx;
} tied_entry;

struct zt__host_importer {
    const zt_family_def *def;
    void *m;
    char *path;               /* as given, for the log line */
    char **files;             /* [nfiles] */
    int nfiles;
    zt_st_file **fs;          /* [nfiles], open */
    const zt_st_tensor **src; /* [ntensors]: each model tensor's file tensor; NULL for one the files lack (kept) */
    int *seen;                /* [ntensors]: 1 + the index in fs of src's file, 0 when not seen */
    float *staging;           /* the largest tensor read, for the family's reorder; NULL without one */
    int next;                 /* the first tensor not written yet */
    int kept, skipped;        /* the task head's tensors kept, other heads' skipped */
};

/* Tensor i's values from its file tensor (accepted by the open) into dst in the table's layout: converted, then
 * reordered through staging where the family reorders it. */
static void read_values(const zt__host_importer *imp, int i, float *dst)
{
    const zt_family_def *def = imp->def;
    const zt_param_info *t = def->tensor(imp->m, i);
    zt__host_convert_tensor(t, imp->src[i], dst);
    if (def->hf->reorder) { /* the files' order into the table's (dst stays when the tensor is not reordered) */
        memcpy(imp->staging, dst, t->numel * sizeof(float));
        def->hf->reorder(imp->m, i, imp->staging, dst, false);
    }
    zt_st_release(imp->fs[imp->seen[i] - 1], imp->src[i]);
}

/* Frees an import without its log line. */
static void import_free(zt__host_importer *imp)
{
    for (int i = 0; i < imp->nfiles; i++)
        zt_st_close(imp->fs[i]);
    free(imp->fs);
    zt_st_shard_files_free(imp->files, imp->nfiles);
    free(imp->src);
    free(imp->seen);
    free(imp->staging);
    free(imp->path);
    free(imp);
}

/* Reads every file's tensors and checks them against the model (see host_io.h), in the files' order, then the
 * missing tensors; the tied tensors are gathered into tied (*ntied of them) for check_tied. */
static int check_files(zt__host_importer *imp, bool pretrained, tied_entry *tied, int *ntied, const char *what,
                       zt_err *err)
{
    const zt_family_def *def = imp->def;
    void *m = imp->m;
    const zt_hf_names *hf = def->hf;
    const int ntensors = def->num_tensors(m);
    for (int fi = 0; fi < imp->nfiles; fi++) {
        const char *file = imp->files[fi];
        int rc = zt_st_open(file, &imp->fs[fi], err);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < zt_st_count(imp->fs[fi]); i++) {
            const zt_st_tensor *st = zt_st_get(imp->fs[fi], i);
            int idx = -1;
            enum zt_hf_kind kind = hf->map(m, st->name, &idx);
            if (kind == ZT_HF_BUFFER)
                continue;
            if (kind == ZT_HF_OTHER_HEAD && pretrained) {
                imp->skipped++;
                continue;
            }
            if (kind == ZT_HF_TIED) {
                ZT_ASSERT(idx >= 0 && idx < ntensors && *ntied < ntensors);
                tied[(*ntied)++] = (tied_entry){.st = st, .file = file, .idx = idx};
                continue;
            }
            if (kind != ZT_HF_PARAM)
                return zt_fail(err, ZT_EMISMATCH,
                               "%s: unknown tensor '%s' (not a parameter of %s; is this the right model config?)", file,
                               st->name, what);
            const zt_param_info *t = def->tensor(m, idx);
            if (imp->seen[idx])
                return zt_fail(err, ZT_EMISMATCH,
                               "%s: tensor '%s' appears twice (under two names such as with and without the prefix, "
                               "or in two shards; the other is in %s)",
                               file, t->name, imp->files[imp->seen[idx] - 1]);
            if ((rc = zt__host_check_tensor(t, st, file, err)) < 0)
                return rc;
            zt_st_release(imp->fs[fi], st); /* read again when its block is written */
            imp->seen[idx] = fi + 1;
            imp->src[idx] = st;
        }
    }
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = def->tensor(m, i);
        if (imp->seen[i])
            continue;
        if (pretrained && hf->head_optional && t->block == def->num_blocks(m) - 1) {
            imp->kept++;
            continue;
        }
        char name[160];
        hf->export_name(m, t, name, sizeof name);
        return zt_fail(err, ZT_EMISMATCH, "%s: tensor '%s' is missing (%s has it)", imp->path, name, what);
    }
    return 0;
}

/* Whether each tied tensor holds the values its target will have once imported (or keeps, for a target the files
 * lack), through a copy of that target alone. */
static int check_tied(zt__host_importer *imp, const tied_entry *tied, int ntied, zt_err *err)
{
    const zt_family_def *def = imp->def;
    for (int k = 0; k < ntied; k++) {
        const zt_param_info *t = def->tensor(imp->m, tied[k].idx);
        ZT_ASSERT(!t->transposed_in_hf);
        float *vals = malloc(t->numel * sizeof(float));
        if (!vals)
            return zt_fail(err, ZT_ENOMEM, "%s: out of memory importing (%.1f MiB)", imp->path,
                           (double)t->numel * sizeof(float) / (1 << 20));
        if (imp->src[tied[k].idx])
            read_values(imp, tied[k].idx, vals);
        else
            def->tensor_values(imp->m, tied[k].idx, vals);
        const bool same = same_values(tied[k].st, t, vals);
        free(vals);
        if (!same)
            return zt_fail(err, ZT_EMISMATCH, "%s: tensor '%s' differs from '%s', to which the model ties it (%s)",
                           tied[k].file, tied[k].st->name, t->name, def->hf->tied_fix);
    }
    return 0;
}

int zt__host_import_open(const zt_family_def *def, void *m, const char *path, bool pretrained, zt__host_importer **out,
                         zt_err *err)
{
    *out = NULL;
    const int ntensors = def->num_tensors(m);
    char what[160];
    def->hf->describe(m, what, sizeof what);
    zt__host_importer *imp = zt_xcalloc(1, sizeof *imp);
    imp->def = def;
    imp->m = m;
    imp->path = zt_xstrdup(path);
    int rc = zt_st_shard_files(path, &imp->files, &imp->nfiles, err);
    if (rc < 0) {
        import_free(imp);
        return rc;
    }
    imp->fs = zt_xcalloc((size_t)(imp->nfiles > 0 ? imp->nfiles : 1), sizeof *imp->fs);
    imp->src = zt_xcalloc((size_t)ntensors, sizeof *imp->src);
    imp->seen = zt_xcalloc((size_t)ntensors, sizeof *imp->seen);
    tied_entry *tied = zt_xcalloc((size_t)ntensors, sizeof *tied);
    int ntied = 0;
    if (imp->nfiles > 1)
        zt_log(ZT_LOG_INFO, "model: importing %s from %d shards", path, imp->nfiles);
    rc = check_files(imp, pretrained, tied, &ntied, what, err);
    size_t most = 0; /* the reorder's staging: the largest tensor read */
    for (int i = 0; i < ntensors && rc == 0 && def->hf->reorder; i++)
        if (imp->src[i] && def->tensor(m, i)->numel > most)
            most = def->tensor(m, i)->numel;
    if (rc == 0 && most && !(imp->staging = malloc(most * sizeof(float))))
        rc = zt_fail(err, ZT_ENOMEM, "%s: out of memory importing (%.1f MiB)", path,
                     (double)most * sizeof(float) / (1 << 20));
    if (rc == 0)
        rc = check_tied(imp, tied, ntied, err);
    free(tied);
    if (rc < 0) {
        import_free(imp);
        return rc;
    }
    /* a lazily created model need not initialise what the files will write (the others keep their values) */
    bool *provided = zt_xmalloc((size_t)ntensors * sizeof *provided);
    for (int i = 0; i < ntensors; i++)
        provided[i] = imp->src[i] != NULL;
    def->skip_init(m, provided);
    free(provided);
    *out = imp;
    return 0;
}

void zt__host_import_fill_through(zt__host_importer *imp, int block)
{
    const zt_family_def *def = imp->def;
    float *params = def->params(imp->m);
    const int ntensors = def->num_tensors(imp->m);
    for (; imp->next < ntensors && def->tensor(imp->m, imp->next)->block <= block; imp->next++)
        if (imp->src[imp->next])
            read_values(imp, imp->next, params + def->tensor(imp->m, imp->next)->offset);
}

void zt__host_import_close(zt__host_importer *imp)
{
    if (!imp)
        return;
    if (imp->next == imp->def->num_tensors(imp->m) && (imp->kept || imp->skipped))
        zt_log(ZT_LOG_INFO, "model: %s: %d tensors of the task head keep their initial values; %d tensors of other "
               "heads were skipped", imp->path, imp->kept, imp->skipped);
    imp->def->skip_init(imp->m, NULL); /* the initialisation, if any is left, is whole again */
    import_free(imp);
}

size_t zt__host_import_staging(const zt_family_def *def, const void *m)
{
    size_t most = 0;
    for (int i = 0; i < def->num_tensors(m) && def->hf->reorder; i++)
        most = def->tensor(m, i)->numel > most ? def->tensor(m, i)->numel : most;
    return most;
}

int zt__host_import(const zt_family_def *def, void *m, const char *path, bool pretrained, zt_err *err)
{
    zt__host_importer *imp = NULL;
    int rc = zt__host_import_open(def, m, path, pretrained, &imp, err);
    if (rc < 0)
        return rc;
    zt__host_import_fill_through(imp, def->num_blocks(m) - 1);
    zt__host_import_close(imp);
    return 0;
}
