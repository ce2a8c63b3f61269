/* Training checkpoints: writing a checkpoint directory atomically, finding, verifying and loading one
 * (see checkpoint.h for the layout). */
#include "worker/train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/crc32c.h"
#include "common/fileio.h"
#include "common/json.h"
#include "common/safetensors.h"

#define PATH_CAP 1280

/* The files of a checkpoint besides manifest.json, all listed in the manifest with size and CRC. */
static const char *const ckpt_files[] = {"model.safetensors", "optim.safetensors", "config.json",
                                         "model_config.json"};
#define NUM_CKPT_FILES (sizeof(ckpt_files) / sizeof(ckpt_files[0]))

static int join(char *out, size_t cap, const char *dir, const char *name, zt_err *err)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "path '%s/%s' is too long; use a shorter run directory", dir, name);
    return 0;
}

static bool path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* optim.safetensors: "m.<name>" and "v.<name>" for every model tensor, in the model's layout. */
static int write_optim(const char *path, const zt_family_model *model, const zt_optimizer *opt, zt_err *err)
{
    int ntensors = zt_family_model_num_tensors(model);
    char(*names)[112] = zt_xcalloc((size_t)ntensors * 2, sizeof(*names));
    zt_st_writer *w = zt_st_writer_create();
    ZT_ASSERT(w);
    int rc = 0;
    for (int i = 0; rc == 0 && i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        snprintf(names[2 * i], sizeof(names[0]), "m.%s", t->name);
        snprintf(names[2 * i + 1], sizeof(names[0]), "v.%s", t->name);
        rc = zt_st_writer_add(w, names[2 * i], ZT_DTYPE_F32, t->ndim, t->shape, opt->m + t->offset, err);
        if (rc == 0)
            rc = zt_st_writer_add(w, names[2 * i + 1], ZT_DTYPE_F32, t->ndim, t->shape, opt->v + t->offset, err);
    }
    if (rc == 0)
        rc = zt_st_writer_add_metadata(w, "format", "ztrain-optim", err);
    if (rc == 0)
        rc = zt_st_writer_write(w, path, err);
    zt_st_writer_destroy(w);
    free(names);
    return rc;
}

/* grads.safetensors: the gradient of every model tensor under its ztrain name, in the model's layout. */
static int write_grads(const char *path, const zt_family_model *model, const float *grads, zt_err *err)
{
    zt_st_writer *w = zt_st_writer_create();
    ZT_ASSERT(w);
    int rc = 0;
    for (int i = 0; rc == 0 && i < zt_family_model_num_tensors(model); i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        rc = zt_st_writer_add(w, t->name, ZT_DTYPE_F32, t->ndim, t->shape, grads + t->offset, err);
    }
    if (rc == 0)
        rc = zt_st_writer_add_metadata(w, "format", "ztrain-grads", err);
    if (rc == 0)
        rc = zt_st_writer_write(w, path, err);
    zt_st_writer_destroy(w);
    return rc;
}

/* manifest.json: the state and the size and CRC of every file already in dir. */
static int write_manifest(const char *dir, const zt_ckpt_state *st, bool with_grads, zt_err *err)
{
    cJSON *root = cJSON_CreateObject();
    ZT_ASSERT(root);
    cJSON_AddStringToObject(root, "format", ZT_CKPT_FORMAT);
    cJSON_AddItemToObject(root, "version", zt_json_exact_int(ZT_CKPT_VERSION));
    cJSON_AddItemToObject(root, "step", zt_json_exact_int(st->step));
    cJSON_AddItemToObject(root, "adam_step", zt_json_exact_int(st->adam_step));
    cJSON_AddItemToObject(root, "skipped_steps", zt_json_exact_int(st->skipped_steps));
    cJSON_AddItemToObject(root, "elapsed_s", zt_json_exact_double(st->elapsed_s));
    if (st->loss_scale > 0) {
        cJSON_AddItemToObject(root, "loss_scale", zt_json_exact_double(st->loss_scale));
        cJSON_AddItemToObject(root, "loss_scale_clean_steps", zt_json_exact_int(st->loss_scale_clean_steps));
    }

    cJSON *pos = cJSON_AddObjectToObject(root, "data_position");
    cJSON_AddItemToObject(pos, "epoch", zt_json_exact_int((int64_t)st->data.epoch));
    cJSON_AddItemToObject(pos, "shard", zt_json_exact_int((int64_t)st->data.shard));
    cJSON_AddItemToObject(pos, "window", zt_json_exact_int((int64_t)st->data.window));

    /* 64-bit words do not fit JSON numbers (doubles): hex strings. */
    cJSON *rng = cJSON_AddArrayToObject(root, "rng_state");
    for (int i = 0; i < 4; i++) {
        char hex[20];
        snprintf(hex, sizeof(hex), "%016" PRIx64, st->rng.s[i]);
        cJSON_AddItemToArray(rng, cJSON_CreateString(hex));
    }

    cJSON *sched = cJSON_AddObjectToObject(root, "schedule");
    cJSON_AddStringToObject(sched, "name", zt_schedule_name(st->schedule.kind));
    cJSON_AddItemToObject(sched, "lr", zt_json_exact_double(st->schedule.lr));
    cJSON_AddItemToObject(sched, "min_lr", zt_json_exact_double(st->schedule.min_lr));
    cJSON_AddItemToObject(sched, "warmup_steps", zt_json_exact_int(st->schedule.warmup_steps));
    cJSON_AddItemToObject(sched, "total_steps", zt_json_exact_int(st->schedule.total_steps));
    cJSON_AddItemToObject(sched, "gamma", zt_json_exact_double(st->schedule.gamma));

    cJSON *files = cJSON_AddObjectToObject(root, "files");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < NUM_CKPT_FILES + (with_grads ? 1 : 0); i++) {
        const char *name = i < NUM_CKPT_FILES ? ckpt_files[i] : "grads.safetensors";
        char path[PATH_CAP];
        uint64_t size = 0;
        uint32_t crc = 0;
        rc = join(path, sizeof(path), dir, name, err);
        if (rc == 0)
            rc = zt_checksum_file(path, &size, &crc, err);
        if (rc == 0) {
            cJSON *f = cJSON_AddObjectToObject(files, name);
            char hex[12];
            snprintf(hex, sizeof(hex), "%08" PRIx32, crc);
            cJSON_AddItemToObject(f, "bytes", zt_json_exact_int((int64_t)size));
            cJSON_AddStringToObject(f, "crc32c", hex);
        }
    }
    if (rc == 0) {
        char path[PATH_CAP];
        char *text = cJSON_Print(root);
        ZT_ASSERT(text);
        rc = join(path, sizeof(path), dir, "manifest.json", err);
        if (rc == 0)
            rc = zt_write_file_atomic(path, text, strlen(text), err);
        cJSON_free(text);
    }
    cJSON_Delete(root);
    return rc;
}

/* Writes ckpt_<step> atomically and points `latest` at it; see checkpoint.h. */
int zt_checkpoint_save(const char *out_dir, const zt_family_model *model, const zt_optimizer *opt,
                       const zt_train_config *cfg, const zt_ckpt_state *st, char *path_out, size_t cap,
                       zt_err *err)
{
    return zt_checkpoint_save_with_grads(out_dir, model, opt, NULL, cfg, st, path_out, cap, err);
}

/* The directory of the checkpoint of step `step`; see checkpoint.h. */
int zt_checkpoint_dir(const char *out_dir, int64_t step, char *out, size_t cap, zt_err *err)
{
    char name[32];
    snprintf(name, sizeof(name), "ckpt_%06lld", (long long)step);
    return join(out, cap, out_dir, name, err);
}

/* Makes the empty out_dir/ckpt_<step>.tmp (removing one a crash left) and names the directories of step. */
static int make_tmp_dir(const char *out_dir, int64_t step, char *final_dir, char *tmp_dir, zt_err *err)
{
    int rc = zt_checkpoint_dir(out_dir, step, final_dir, PATH_CAP, err);
    if (rc < 0)
        return rc;
    snprintf(tmp_dir, PATH_CAP + 8, "%s.tmp", final_dir);
    zt_remove_flat_dir(tmp_dir); /* left over by a crash while saving */
    if (mkdir(tmp_dir, 0755) != 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot create checkpoint directory %s: %s; check that the run directory is "
                       "writable and has free space", tmp_dir, strerror(e));
    }
    return 0;
}

/* The rest of a checkpoint whose model.safetensors and optim.safetensors are in tmp_dir: the configs, the
 * gradients, the manifest, then the rename into final_dir and `latest`. Removes tmp_dir on failure. */
static int finish_dir(const char *out_dir, const char *final_dir, const char *tmp_dir, const zt_family_model *model,
                      const float *grads, const zt_train_config *cfg, const zt_ckpt_state *st, char *path_out,
                      size_t cap, zt_err *err)
{
    char old_dir[PATH_CAP + 8], path[PATH_CAP + 32];
    snprintf(old_dir, sizeof(old_dir), "%s.old", final_dir);
    snprintf(path, sizeof(path), "%s/config.json", tmp_dir);
    int rc = zt_train_config_save(cfg, path, "model_config.json", err);
    if (rc == 0) {
        snprintf(path, sizeof(path), "%s/model_config.json", tmp_dir);
        rc = zt_family_config_save(zt_family_model_config(model), path, err);
    }
    if (rc == 0 && grads) {
        snprintf(path, sizeof(path), "%s/grads.safetensors", tmp_dir);
        rc = write_grads(path, model, grads, err);
    }
    if (rc == 0)
        rc = write_manifest(tmp_dir, st, grads != NULL, err);
    if (rc == 0)
        rc = zt_fsync_dir(tmp_dir, err);
    if (rc < 0)
        goto fail;

    /* A checkpoint of the same step may exist (a run resumed and stopped again at once): replace it. */
    if (path_exists(final_dir)) {
        zt_remove_flat_dir(old_dir);
        if (rename(final_dir, old_dir) != 0) {
            int e = errno;
            rc = zt_fail(err, -e, "cannot replace %s: %s", final_dir, strerror(e));
            goto fail;
        }
    }
    if (rename(tmp_dir, final_dir) != 0) {
        int e = errno;
        rename(old_dir, final_dir); /* put the replaced checkpoint back, if there was one */
        rc = zt_fail(err, -e, "cannot rename %s to %s: %s", tmp_dir, final_dir, strerror(e));
        goto fail;
    }
    zt_remove_flat_dir(old_dir);
    if ((rc = zt_fsync_dir(out_dir, err)) < 0)
        return rc;

    char latest[PATH_CAP], text[40];
    if ((rc = join(latest, sizeof(latest), out_dir, "latest", err)) < 0)
        return rc;
    int n = snprintf(text, sizeof(text), "%s\n", strrchr(final_dir, '/') + 1); /* ckpt_<step> */
    if ((rc = zt_write_file_atomic(latest, text, (size_t)n, err)) < 0)
        return rc;
    if (path_out)
        snprintf(path_out, cap, "%s", final_dir);
    return 0;

fail:
    zt_remove_flat_dir(tmp_dir);
    return rc;
}

/* zt_checkpoint_save with an optional gradient dump; see checkpoint.h. */
int zt_checkpoint_save_with_grads(const char *out_dir, const zt_family_model *model, const zt_optimizer *opt,
                                  const float *grads, const zt_train_config *cfg, const zt_ckpt_state *st,
                                  char *path_out, size_t cap, zt_err *err)
{
    char final_dir[PATH_CAP], tmp_dir[PATH_CAP + 8], path[PATH_CAP + 32];
    int rc = make_tmp_dir(out_dir, st->step, final_dir, tmp_dir, err);
    if (rc < 0)
        return rc;
    snprintf(path, sizeof(path), "%s/model.safetensors", tmp_dir);
    rc = zt_family_model_export(model, path, err);
    if (rc == 0) {
        snprintf(path, sizeof(path), "%s/optim.safetensors", tmp_dir);
        rc = write_optim(path, model, opt, err);
    }
    if (rc < 0) {
        zt_remove_flat_dir(tmp_dir);
        return rc;
    }
    return finish_dir(out_dir, final_dir, tmp_dir, model, grads, cfg, st, path_out, cap, err);
}

/* ---- streamed checkpoints ---- */

struct zt_ckpt_writer {
    const zt_family_model *model;
    char out_dir[PATH_CAP], final_dir[PATH_CAP], tmp_dir[PATH_CAP + 8];
    zt_st_writer *params;   /* model.safetensors: tensor i of the table at index i */
    zt_st_writer *optim;    /* optim.safetensors: m of tensor i at 2 i, v at 2 i + 1 */
    float *hf;              /* [staging]: a tensor in the files' layout on its way to model.safetensors */
    size_t staging;         /* its elements (zt_family_model_export_staging) */
    bool *transformed;      /* per tensor: the files hold it in another layout (it must arrive whole) */
};

size_t zt_checkpoint_stream_bytes(const zt_family_model *model)
{
    return zt_family_model_export_staging(model) * sizeof(float);
}

/* Declares model.safetensors's and optim.safetensors's tensors and creates both files; see checkpoint.h. */
int zt_checkpoint_begin(const char *out_dir, const zt_family_model *model, int64_t step, zt_ckpt_writer **out,
                        zt_err *err)
{
    *out = NULL;
    zt_ckpt_writer *w = zt_xcalloc(1, sizeof *w);
    w->model = model;
    if ((size_t)snprintf(w->out_dir, sizeof w->out_dir, "%s", out_dir) >= sizeof w->out_dir) {
        free(w);
        return zt_fail(err, ZT_EINVAL_CONFIG, "run directory '%s' is too long; use a shorter one", out_dir);
    }
    int rc = make_tmp_dir(out_dir, step, w->final_dir, w->tmp_dir, err);
    if (rc < 0) {
        free(w);
        return rc;
    }
    w->params = zt_st_writer_create();
    w->optim = zt_st_writer_create();
    ZT_ASSERT(w->params && w->optim);
    /* the tensors, names and metadata in the order zt_family_model_export and write_optim add them */
    rc = zt_st_writer_add_metadata(w->params, "format", "pt", err);
    const int ntensors = zt_family_model_num_tensors(model);
    for (int i = 0; rc == 0 && i < ntensors; i++) {
        char name[160];
        int64_t shape[2];
        const zt_param_info *t = zt_family_model_tensor(model, i);
        zt_family_model_export_layout(model, i, name, sizeof name, shape);
        rc = zt_st_writer_declare(w->params, name, ZT_DTYPE_F32, t->ndim, shape, err);
        for (int k = 0; rc == 0 && k < 2; k++) {
            snprintf(name, sizeof name, "%c.%s", k == 0 ? 'm' : 'v', t->name);
            rc = zt_st_writer_declare(w->optim, name, ZT_DTYPE_F32, t->ndim, t->shape, err);
        }
    }
    if (rc == 0)
        rc = zt_st_writer_add_metadata(w->optim, "format", "ztrain-optim", err);
    char path[PATH_CAP + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", w->tmp_dir);
    if (rc == 0)
        rc = zt_st_writer_begin(w->params, path, err);
    snprintf(path, sizeof path, "%s/optim.safetensors", w->tmp_dir);
    if (rc == 0)
        rc = zt_st_writer_begin(w->optim, path, err);
    w->staging = zt_family_model_export_staging(model);
    if (rc == 0 && w->staging && !(w->hf = malloc(w->staging * sizeof(float))))
        rc = zt_fail(err, ZT_ENOMEM, "out of memory for the checkpoint's staging of one tensor (%zu bytes)",
                     w->staging * sizeof(float));
    /* which tensors the export transforms: asked of the family with the slab's values (their pages may have
     * been given back: then zeros), which do not matter here */
    w->transformed = zt_xcalloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof(bool));
    const float *slab = zt_family_model_params((zt_family_model *)model);
    for (int i = 0; rc == 0 && i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        w->transformed[i] = t->numel <= w->staging && zt_family_model_export_values(model, i, slab + t->offset, w->hf);
    }
    if (rc < 0) {
        zt_checkpoint_abandon(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* Writes the elements [host_offset, host_offset + numel) of the state into both files; see checkpoint.h. */
int zt_checkpoint_put(void *writer, size_t host_offset, size_t numel, const float *params, const float *m,
                      const float *v, zt_err *err)
{
    zt_ckpt_writer *w = writer;
    const int ntensors = zt_family_model_num_tensors(w->model);
    const size_t end = host_offset + numel;
    /* a tensor the files hold in another layout needs all of it at once: checked before anything is written */
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(w->model, i);
        const size_t lo = t->offset > host_offset ? t->offset : host_offset;
        const size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (lo < hi && w->transformed[i] && (lo != t->offset || hi != t->offset + t->numel))
            return zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint: tensor %s arrived in part (%zu of %zu elements); a "
                           "tensor that is transposed or reordered for the files must arrive whole", t->name, hi - lo,
                           t->numel);
    }
    int rc = 0;
    for (int i = 0; rc == 0 && i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(w->model, i);
        const size_t lo = t->offset > host_offset ? t->offset : host_offset;
        const size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (lo >= hi)
            continue;
        const size_t at = (lo - t->offset) * sizeof(float), bytes = (hi - lo) * sizeof(float);
        const size_t from = lo - host_offset;
        rc = zt_st_writer_put(w->optim, 2 * (size_t)i, at, m + from, bytes, err);
        if (rc == 0)
            rc = zt_st_writer_put(w->optim, 2 * (size_t)i + 1, at, v + from, bytes, err);
        if (rc < 0)
            break;
        if (!w->transformed[i]) {
            rc = zt_st_writer_put(w->params, (size_t)i, at, params + from, bytes, err);
        } else {
            const bool moved = zt_family_model_export_values(w->model, i, params + from, w->hf);
            ZT_ASSERT(moved); /* the family transforms a tensor or not, whatever its values */
            (void)moved;
            rc = zt_st_writer_put(w->params, (size_t)i, 0, w->hf, bytes, err);
        }
    }
    return rc;
}

/* Finishes both files and the rest of the checkpoint; see checkpoint.h. */
int zt_checkpoint_finish(zt_ckpt_writer *w, const float *grads, const zt_train_config *cfg, const zt_ckpt_state *st,
                         char *path_out, size_t cap, zt_err *err)
{
    int rc = zt_st_writer_finish(w->params, err);
    if (rc == 0)
        rc = zt_st_writer_finish(w->optim, err);
    if (rc == 0)
        rc = finish_dir(w->out_dir, w->final_dir, w->tmp_dir, w->model, grads, cfg, st, path_out, cap, err);
    else
        zt_remove_flat_dir(w->tmp_dir);
    w->tmp_dir[0] = '\0'; /* finish_dir removed it on failure */
    zt_checkpoint_abandon(w);
    return rc;
}

/* Removes what a writer left and frees it; see checkpoint.h. */
void zt_checkpoint_abandon(zt_ckpt_writer *w)
{
    if (!w)
        return;
    zt_st_writer_destroy(w->params);
    zt_st_writer_destroy(w->optim);
    if (w->tmp_dir[0])
        zt_remove_flat_dir(w->tmp_dir);
    free(w->hf);
    free(w->transformed);
    free(w);
}

/* Finds the checkpoint a run or checkpoint directory means; see checkpoint.h. */
int zt_checkpoint_find(const char *dir, char *out, size_t cap, zt_err *err)
{
    char path[PATH_CAP];
    int rc = join(path, sizeof(path), dir, "manifest.json", err);
    if (rc < 0)
        return rc;
    if (path_exists(path)) {
        if ((size_t)snprintf(out, cap, "%s", dir) >= cap)
            return zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint path '%s' is too long", dir);
        return 0;
    }
    if ((rc = join(path, sizeof(path), dir, "latest", err)) < 0)
        return rc;
    char *text = NULL;
    size_t len = 0;
    zt_err read_err;
    if (!path_exists(dir))
        return zt_fail(err, -ENOENT, "'%s' does not exist; pass a run directory (with a 'latest' file) or a "
                       "checkpoint directory (ckpt_NNNNNN, with a manifest.json)", dir);
    if (zt_read_file(path, &text, &len, &read_err) < 0)
        return zt_fail(err, -ENOENT, "'%s' is neither a checkpoint (no manifest.json) nor a run directory with "
                       "a checkpoint (no 'latest' file); pass a run directory that has saved a checkpoint, or a "
                       "ckpt_NNNNNN directory", dir);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        text[--len] = '\0';
    if (len == 0 || strchr(text, '/') || strcmp(text, ".") == 0 || strcmp(text, "..") == 0) {
        free(text);
        return zt_fail(err, ZT_EFORMAT, "%s does not name a checkpoint directory; write the name of one "
                       "(e.g. ckpt_000500) into it, or pass the checkpoint directory itself", path);
    }
    int n = snprintf(out, cap, "%s/%s", dir, text);
    free(text);
    if (n < 0 || (size_t)n >= cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "checkpoint path under '%s' is too long", dir);
    return 0;
}

/* Reads an integer that the manifest must have. */
static int need_int(zt_json_reader *r, const char *key, int64_t *out, const char *where, zt_err *err)
{
    if (!cJSON_GetObjectItemCaseSensitive(r->obj, key))
        return zt_fail(err, ZT_EFORMAT, "%s: \"%s\" is missing; the checkpoint is damaged, use another one",
                       where, key);
    return zt_json_get_int(r, key, 0, 9007199254740992LL, out, err);
}

static const cJSON *need_item(const cJSON *obj, const char *key, const char *where, zt_err *err)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item)
        zt_fail(err, ZT_EFORMAT, "%s: \"%s\" is missing; the checkpoint is damaged, use another one", where, key);
    return item;
}

/* Parses the manifest's state fields (everything but "files"). */
static int parse_state(const cJSON *root, const char *where, zt_ckpt_state *st, zt_err *err)
{
    zt_json_reader r;
    zt_json_reader_init(&r, root, where);
    char format[64] = "";
    int64_t version = 0, v;
    int rc = zt_json_get_string(&r, "format", format, sizeof(format), err);
    if (rc < 0)
        return rc;
    if (strcmp(format, ZT_CKPT_FORMAT) != 0)
        return zt_fail(err, ZT_EFORMAT, "%s: format is '%s', not '%s'; this is not a ztrain checkpoint", where,
                       format, ZT_CKPT_FORMAT);
    if ((rc = need_int(&r, "version", &version, where, err)) < 0)
        return rc;
    if (version != ZT_CKPT_VERSION)
        return zt_fail(err, ZT_EUNSUPPORTED, "%s: checkpoint format version %lld; this ztrain reads version %d: "
                       "use the ztrain release that wrote it", where, (long long)version, ZT_CKPT_VERSION);
    if ((rc = need_int(&r, "step", &st->step, where, err)) < 0 ||
        (rc = need_int(&r, "adam_step", &st->adam_step, where, err)) < 0 ||
        (rc = need_int(&r, "skipped_steps", &st->skipped_steps, where, err)) < 0)
        return rc;
    st->elapsed_s = 0.0;
    if ((rc = zt_json_get_double(&r, "elapsed_s", 0.0, 1e300, &st->elapsed_s, err)) < 0)
        return rc;
    /* The fp16 loss scaler's state; absent in checkpoints of runs without one. */
    st->loss_scale = 0.0;
    st->loss_scale_clean_steps = 0;
    if ((rc = zt_json_get_double(&r, "loss_scale", 0.0, 1e300, &st->loss_scale, err)) < 0 ||
        (rc = zt_json_get_int(&r, "loss_scale_clean_steps", 0, 9007199254740992LL, &st->loss_scale_clean_steps, err)) < 0)
        return rc;

    const cJSON *pos = need_item(root, "data_position", where, err);
    if (!pos)
        return ZT_EFORMAT;
    zt_json_accept(&r, "data_position");
    zt_json_reader pr;
    zt_json_reader_init(&pr, pos, where);
    if ((rc = need_int(&pr, "epoch", &v, where, err)) < 0)
        return rc;
    st->data.epoch = (uint64_t)v;
    if ((rc = need_int(&pr, "shard", &v, where, err)) < 0)
        return rc;
    st->data.shard = (uint64_t)v;
    if ((rc = need_int(&pr, "window", &v, where, err)) < 0)
        return rc;
    st->data.window = (uint64_t)v;
    if ((rc = zt_json_reader_finish(&pr, err)) < 0)
        return rc;

    const cJSON *rng = need_item(root, "rng_state", where, err);
    if (!rng)
        return ZT_EFORMAT;
    zt_json_accept(&r, "rng_state");
    if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4)
        return zt_fail(err, ZT_EFORMAT, "%s: \"rng_state\" must be 4 hex strings; the checkpoint is damaged", where);
    for (int i = 0; i < 4; i++) {
        const cJSON *word = cJSON_GetArrayItem(rng, i);
        char *end = NULL;
        if (!cJSON_IsString(word) || strlen(word->valuestring) != 16)
            return zt_fail(err, ZT_EFORMAT, "%s: \"rng_state\" must be 4 hex strings; the checkpoint is damaged",
                           where);
        st->rng.s[i] = strtoull(word->valuestring, &end, 16);
        if (*end != '\0')
            return zt_fail(err, ZT_EFORMAT, "%s: \"rng_state\" must be 4 hex strings; the checkpoint is damaged",
                           where);
    }

    const cJSON *sched = need_item(root, "schedule", where, err);
    if (!sched)
        return ZT_EFORMAT;
    zt_json_accept(&r, "schedule");
    zt_json_reader sr;
    zt_json_reader_init(&sr, sched, where);
    char name[32] = "";
    if ((rc = zt_json_get_string(&sr, "name", name, sizeof(name), err)) < 0 ||
        (rc = zt_schedule_parse(name, &st->schedule.kind, err)) < 0 ||
        (rc = zt_json_get_double(&sr, "lr", 0.0, 1e300, &st->schedule.lr, err)) < 0 ||
        (rc = zt_json_get_double(&sr, "min_lr", 0.0, 1e300, &st->schedule.min_lr, err)) < 0 ||
        (rc = need_int(&sr, "warmup_steps", &st->schedule.warmup_steps, where, err)) < 0 ||
        (rc = need_int(&sr, "total_steps", &st->schedule.total_steps, where, err)) < 0 ||
        (rc = zt_json_get_double(&sr, "gamma", 0.0, 1e300, &st->schedule.gamma, err)) < 0 ||
        (rc = zt_json_reader_finish(&sr, err)) < 0)
        return rc;

    zt_json_accept(&r, "files");
    return zt_json_reader_finish(&r, err);
}

/* Checks one file against its manifest entry. */
static int check_file(const char *ckpt_dir, const cJSON *entry, const char *where, zt_err *err)
{
    const char *name = entry->string;
    if (!name || !name[0] || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return zt_fail(err, ZT_EFORMAT, "%s: bad file name in \"files\"; the checkpoint is damaged", where);
    zt_json_reader r;
    zt_json_reader_init(&r, entry, where);
    int64_t bytes = 0;
    char hex[16] = "";
    int rc = need_int(&r, "bytes", &bytes, where, err);
    if (rc == 0)
        rc = zt_json_get_string(&r, "crc32c", hex, sizeof(hex), err);
    if (rc == 0)
        rc = zt_json_reader_finish(&r, err);
    if (rc < 0)
        return rc;
    char *end = NULL;
    unsigned long want_crc = strtoul(hex, &end, 16);
    if (hex[0] == '\0' || *end != '\0')
        return zt_fail(err, ZT_EFORMAT, "%s: crc32c of %s is not a hex number; the checkpoint is damaged", where,
                       name);

    char path[PATH_CAP];
    if ((rc = join(path, sizeof(path), ckpt_dir, name, err)) < 0)
        return rc;
    if (!path_exists(path))
        return zt_fail(err, -ENOENT, "checkpoint %s is incomplete: %s is missing; resume from another checkpoint",
                       ckpt_dir, name);
    uint64_t size = 0;
    uint32_t crc = 0;
    if ((rc = zt_checksum_file(path, &size, &crc, err)) < 0)
        return rc;
    if (size != (uint64_t)bytes)
        return zt_fail(err, ZT_ECHECKSUM, "checkpoint %s is corrupt: %s is %llu bytes, the manifest says %lld; "
                       "resume from another checkpoint", ckpt_dir, name, (unsigned long long)size, (long long)bytes);
    if (crc != (uint32_t)want_crc)
        return zt_fail(err, ZT_ECHECKSUM, "checkpoint %s is corrupt: %s crc32c mismatch (manifest %08lx, file "
                       "%08" PRIx32 "); resume from another checkpoint", ckpt_dir, name, want_crc, crc);
    return 0;
}

/* Checks the manifest and every file's size and CRC-32C; see checkpoint.h. */
int zt_checkpoint_verify(const char *ckpt_dir, zt_ckpt_state *st_out, zt_err *err)
{
    char path[PATH_CAP];
    int rc = join(path, sizeof(path), ckpt_dir, "manifest.json", err);
    if (rc < 0)
        return rc;
    cJSON *root = NULL;
    if ((rc = zt_json_load_object(path, &root, err)) < 0)
        return rc;

    zt_ckpt_state st;
    memset(&st, 0, sizeof(st));
    rc = parse_state(root, path, &st, err);

    const cJSON *files = rc == 0 ? need_item(root, "files", path, err) : NULL;
    if (rc == 0 && !files)
        rc = ZT_EFORMAT;
    if (rc == 0 && !cJSON_IsObject(files))
        rc = zt_fail(err, ZT_EFORMAT, "%s: \"files\" must be an object; the checkpoint is damaged", path);
    for (size_t i = 0; rc == 0 && i < NUM_CKPT_FILES; i++)
        if (!cJSON_GetObjectItemCaseSensitive(files, ckpt_files[i]))
            rc = zt_fail(err, ZT_EFORMAT, "%s does not list %s; the checkpoint is damaged, use another one", path,
                         ckpt_files[i]);
    const cJSON *entry;
    if (rc == 0) {
        cJSON_ArrayForEach(entry, files)
        {
            if ((rc = check_file(ckpt_dir, entry, path, err)) < 0)
                break;
        }
    }
    cJSON_Delete(root);
    if (rc == 0 && st_out)
        *st_out = st;
    return rc;
}

/* Checks that optim.safetensors has m and v of the right shape for every model tensor, and nothing else. */
static int check_optim(const zt_st_file *f, const zt_family_model *model, const char *path, zt_err *err)
{
    int ntensors = zt_family_model_num_tensors(model);
    if (zt_st_count(f) != (size_t)ntensors * 2)
        return zt_fail(err, ZT_EFORMAT, "%s holds %zu tensors, the model needs %d (m and v of each of %d); the "
                       "checkpoint does not belong to this model", path, zt_st_count(f), ntensors * 2, ntensors);
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        for (int k = 0; k < 2; k++) {
            char name[112];
            snprintf(name, sizeof(name), "%c.%s", k == 0 ? 'm' : 'v', t->name);
            const zt_st_tensor *s = zt_st_find(f, name);
            if (!s)
                return zt_fail(err, ZT_EFORMAT, "%s has no tensor '%s'; the checkpoint does not belong to this model",
                               path, name);
            if (s->dtype != ZT_DTYPE_F32 || s->nbytes != t->numel * sizeof(float))
                return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s' is %s with %zu bytes, expected F32 with %zu; the "
                               "checkpoint does not belong to this model", path, name, zt_dtype_name(s->dtype),
                               s->nbytes, t->numel * sizeof(float));
        }
    }
    return 0;
}

/* Checks that the checkpoint's model_config.json describes the model (ZT_EMISMATCH naming the first field that
 * differs). */
static int check_config(const char *ckpt_dir, const zt_family_model *model, zt_err *err)
{
    char path[PATH_CAP];
    int rc = join(path, sizeof(path), ckpt_dir, "model_config.json", err);
    if (rc < 0)
        return rc;
    zt_family_config saved;
    if ((rc = zt_family_config_load(&saved, path, err)) < 0)
        return rc;
    char sv[32], cv[32];
    const char *field = zt_family_config_diff(&saved, zt_family_model_config(model), sv, cv, sizeof(sv));
    if (field)
        return zt_fail(err, ZT_EMISMATCH, "checkpoint %s was saved from a model with %s = %s, but the configured "
                       "model has %s = %s; resume with the checkpoint's model (its model_config.json), or start a "
                       "new run in another --out directory", ckpt_dir, field, sv, field, cv);
    return 0;
}

/* Verifies a checkpoint and loads it into the model and the optimizer; see checkpoint.h. */
int zt_checkpoint_load(const char *ckpt_dir, zt_family_model *model, zt_optimizer *opt, zt_ckpt_state *st, zt_err *err)
{
    zt_ckpt_state state;
    int rc = zt_checkpoint_verify(ckpt_dir, &state, err);
    if (rc < 0)
        return rc;
    if ((rc = check_config(ckpt_dir, model, err)) < 0)
        return rc;

    char path[PATH_CAP];
    if ((rc = join(path, sizeof(path), ckpt_dir, "optim.safetensors", err)) < 0)
        return rc;
    zt_st_file *f = NULL;
    if ((rc = zt_st_open(path, &f, err)) < 0)
        return rc;
    if ((rc = check_optim(f, model, path, err)) < 0)
        goto done;

    char model_path[PATH_CAP];
    if ((rc = join(model_path, sizeof(model_path), ckpt_dir, "model.safetensors", err)) < 0)
        goto done;
    if ((rc = zt_family_model_import(model, model_path, err)) < 0)
        goto done;

    /* Everything is checked: nothing below can fail. */
    int ntensors = zt_family_model_num_tensors(model);
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        char name[112];
        snprintf(name, sizeof(name), "m.%s", t->name);
        memcpy(opt->m + t->offset, zt_st_find(f, name)->data, t->numel * sizeof(float));
        snprintf(name, sizeof(name), "v.%s", t->name);
        memcpy(opt->v + t->offset, zt_st_find(f, name)->data, t->numel * sizeof(float));
    }
    opt->adam_step = state.adam_step;
    opt->skipped_steps = state.skipped_steps;
    opt->bad_in_a_row = 0;
    *st = state;
done:
    zt_st_close(f);
    return rc;
}

/* ---- streamed loads ---- */

struct zt_ckpt_reader {
    const zt_family_model *model;
    zt_st_file *params;           /* model.safetensors */
    zt_st_file *optim;            /* optim.safetensors */
    const zt_st_tensor **tensors; /* per table tensor i: its weights at 3 i, m at 3 i + 1, v at 3 i + 2 */
    bool *transformed;            /* per tensor: model.safetensors holds it in another layout */
    float *hf, *table;            /* [staging] each: a transformed tensor as the file holds it, and in the table's layout */
    size_t staging;               /* zt_family_model_export_staging */
    int cached;                   /* the tensor whose values `table` holds, or -1 */
};

size_t zt_checkpoint_read_bytes(const zt_family_model *model)
{
    return 2 * zt_family_model_export_staging(model) * sizeof(float);
}

/* Checks that model.safetensors holds every model tensor under its exported name and shape, F32, and nothing
 * else (a checkpoint's weights are written by zt_family_model_export or zt_checkpoint_put). */
static int check_params(const zt_st_file *f, const zt_family_model *model, const char *path, zt_err *err)
{
    const int ntensors = zt_family_model_num_tensors(model);
    if (zt_st_count(f) != (size_t)ntensors)
        return zt_fail(err, ZT_EFORMAT, "%s holds %zu tensors, the model has %d; the checkpoint does not belong to "
                       "this model", path, zt_st_count(f), ntensors);
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        char name[160];
        int64_t shape[2];
        zt_family_model_export_layout(model, i, name, sizeof name, shape);
        const zt_st_tensor *s = zt_st_find(f, name);
        if (!s)
            return zt_fail(err, ZT_EFORMAT, "%s has no tensor '%s'; the checkpoint does not belong to this model",
                           path, name);
        bool same = s->dtype == ZT_DTYPE_F32 && s->ndim == t->ndim && s->nbytes == t->numel * sizeof(float);
        for (int d = 0; same && d < t->ndim && d < 2; d++)
            same = s->shape[d] == shape[d];
        if (!same)
            return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s' is %s with %zu bytes, expected F32 [%lld%s%lld] with %zu; "
                           "the checkpoint does not belong to this model", path, name, zt_dtype_name(s->dtype),
                           s->nbytes, (long long)shape[0], t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)shape[1] : 0LL,
                           t->numel * sizeof(float));
    }
    return 0;
}

/* Verifies the checkpoint and prepares to hand out its tensors; see checkpoint.h. */
int zt_checkpoint_open(const char *ckpt_dir, const zt_family_model *model, zt_optimizer *opt, zt_ckpt_state *st,
                       zt_ckpt_reader **out, zt_err *err)
{
    *out = NULL;
    zt_ckpt_state state;
    int rc = zt_checkpoint_verify(ckpt_dir, &state, err);
    if (rc < 0 || (rc = check_config(ckpt_dir, model, err)) < 0)
        return rc;
    zt_ckpt_reader *r = zt_xcalloc(1, sizeof *r);
    r->model = model;
    r->cached = -1;
    const int ntensors = zt_family_model_num_tensors(model);
    char path[PATH_CAP];
    if ((rc = join(path, sizeof path, ckpt_dir, "optim.safetensors", err)) < 0 ||
        (rc = zt_st_open(path, &r->optim, err)) < 0 || (rc = check_optim(r->optim, model, path, err)) < 0)
        goto fail;
    if ((rc = join(path, sizeof path, ckpt_dir, "model.safetensors", err)) < 0 ||
        (rc = zt_st_open(path, &r->params, err)) < 0 || (rc = check_params(r->params, model, path, err)) < 0)
        goto fail;
    r->tensors = zt_xcalloc((size_t)(ntensors > 0 ? ntensors : 1) * 3, sizeof *r->tensors);
    r->transformed = zt_xcalloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof(bool));
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(model, i);
        char name[160];
        int64_t shape[2];
        zt_family_model_export_layout(model, i, name, sizeof name, shape);
        r->tensors[3 * i] = zt_st_find(r->params, name);
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "%c.%s", k == 0 ? 'm' : 'v', t->name);
            r->tensors[3 * i + 1 + k] = zt_st_find(r->optim, name);
        }
    }
    r->staging = zt_family_model_export_staging(model);
    if (r->staging && (!(r->hf = calloc(r->staging, sizeof(float))) || !(r->table = calloc(r->staging, sizeof(float))))) {
        rc = zt_fail(err, ZT_ENOMEM, "out of memory for the staging of a checkpoint's tensor (2 x %zu bytes)",
                     r->staging * sizeof(float));
        goto fail;
    }
    /* which tensors the files hold in another layout: asked of the family with values that do not matter here */
    for (int i = 0; i < ntensors; i++)
        r->transformed[i] = zt_family_model_tensor(model, i)->numel <= r->staging &&
                            zt_family_model_import_values(model, i, r->hf, r->table);
    if (opt) {
        opt->adam_step = state.adam_step;
        opt->skipped_steps = state.skipped_steps;
        opt->bad_in_a_row = 0;
    }
    *st = state;
    *out = r;
    return 0;
fail:
    zt_checkpoint_close(r);
    return rc;
}

/* Elements [host_offset, host_offset + numel) of the masters, m and v from the files; see checkpoint.h. */
int zt_checkpoint_read(void *reader, size_t host_offset, size_t numel, float *params, float *m, float *v, zt_err *err)
{
    zt_ckpt_reader *r = reader;
    const int ntensors = zt_family_model_num_tensors(r->model);
    const size_t end = host_offset + numel;
    (void)err; /* the files were checked when opened: a read past that is a mapping of checked bytes */
    for (int i = 0; i < ntensors; i++) {
        const zt_param_info *t = zt_family_model_tensor(r->model, i);
        const size_t lo = t->offset > host_offset ? t->offset : host_offset;
        const size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (lo >= hi)
            continue;
        const size_t at = (lo - t->offset) * sizeof(float), bytes = (hi - lo) * sizeof(float), to = lo - host_offset;
        zt_st_copy_out(r->optim, r->tensors[3 * i + 1], at, m + to, bytes);
        zt_st_copy_out(r->optim, r->tensors[3 * i + 2], at, v + to, bytes);
        if (!r->transformed[i]) {
            zt_st_copy_out(r->params, r->tensors[3 * i], at, params + to, bytes);
            continue;
        }
        /* in another layout in the file: all of it, turned into the table's, then the part asked for */
        if (r->cached != i) {
            zt_st_copy_out(r->params, r->tensors[3 * i], 0, r->hf, t->numel * sizeof(float));
            const bool moved = zt_family_model_import_values(r->model, i, r->hf, r->table);
            ZT_ASSERT(moved); /* the family transforms a tensor or not, whatever its values */
            (void)moved;
            r->cached = i;
        }
        memcpy(params + to, r->table + (lo - t->offset), bytes);
    }
    return 0;
}

/* Closes the files and frees the reader; see checkpoint.h. */
void zt_checkpoint_close(zt_ckpt_reader *r)
{
    if (!r)
        return;
    zt_st_close(r->params);
    zt_st_close(r->optim);
    free(r->tensors);
    free(r->transformed);
    free(r->hf);
    free(r->table);
    free(r);
}
