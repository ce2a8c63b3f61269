/* Snapshots of the state server core (server/core.h): one directory per server and saved step with a
 * manifest and one safetensors file per block holding the fp32 master weights and Adam moments of the
 * shards this server owns, written atomically (DIR.tmp, fsync, rename) and checked (size and CRC-32C of
 * every file) before anything is restored. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/json.h"
#include "common/log.h"
#include "offload/cpu_adam.h"
#include "server/core_internal.h"

#define SNAP_FORMAT "ztrain-server-snapshot"
#define SNAP_VERSION 1
#define SNAP_MAX_PATH 4096

/* ---- file helpers ---- */

static int join(char *out, size_t cap, const char *a, const char *b, zt_err *err)
{
    int k = snprintf(out, cap, "%s/%s", a, b);
    if (k < 0 || (size_t)k >= cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "path %s/%s is too long", a, b);
    return 0;
}

static cJSON *json_int(int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    cJSON *n = cJSON_CreateRaw(buf);
    ZT_ASSERT(n);
    return n;
}

/* A float that reads back as exactly the same float. */
static cJSON *json_float(float v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%.9g", (double)v);
    cJSON *n = cJSON_CreateRaw(buf);
    ZT_ASSERT(n);
    return n;
}

static void block_file_name(char *out, size_t cap, int block)
{
    snprintf(out, cap, "block_%06d.safetensors", block);
}

/* ---- writing ---- */

/* Writes the run's committed state (run->busy held by the caller as ZT__EXCLUSIVE) into dir. */
static int write_dir(zt_server_core *core, zt__run *run, int slot, int64_t step, int64_t adam_step, const char *dir,
                     zt_err *err)
{
    char tmp[SNAP_MAX_PATH], path[SNAP_MAX_PATH], name[64];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", dir) >= (int)sizeof(tmp))
        return zt_fail(err, ZT_EINVAL_CONFIG, "snapshot path %s is too long", dir);
    struct stat st;
    if (stat(dir, &st) == 0)
        return zt_fail(err, -EEXIST, "snapshot directory %s exists already: pick a new one or remove it", dir);
    zt_remove_flat_dir(tmp); /* a leftover of an interrupted save */
    if (mkdir(tmp, 0755) < 0)
        return zt_fail(err, -errno, "cannot create snapshot directory %s: %s", tmp, strerror(errno));

    cJSON *root = cJSON_CreateObject();
    cJSON *files = cJSON_CreateObject();
    int rc = 0;
    bool nvme = core->opt.store == ZT_SERVER_STORE_NVME;
    for (int b = 0; b < run->nblocks && rc == 0; b++) {
        int first = run->block_pair[b], last = run->block_pair[b + 1];
        if (first == last)
            continue;
        int np = last - first;
        float **bufs = zt_xcalloc((size_t)np, sizeof(*bufs));
        zt_st_writer *w = zt_st_writer_create();
        for (int i = 0; i < np && rc == 0; i++) {
            zt__pair *p = &run->pairs[first + i];
            float *data = NULL;
            if (nvme) {
                bufs[i] = zt_store_buffer_alloc((size_t)p->n);
                if (!bufs[i]) {
                    rc = zt_fail(err, ZT_ENOMEM, "out of memory saving block %d shard %d", p->block, p->shard);
                    break;
                }
            }
            rc = zt__pair_read(core, p, slot, bufs[i], &data, err);
            int64_t shape[1] = {(int64_t)p->n};
            static const char *const kind[3] = {"master", "m", "v"};
            for (int k = 0; k < 3 && rc == 0; k++) {
                snprintf(name, sizeof(name), "%s.%d.%d", kind[k], p->block, p->shard);
                rc = zt_st_writer_add(w, name, ZT_DTYPE_F32, 1, shape, data + (size_t)k * p->n, err);
            }
        }
        char num[32];
        snprintf(num, sizeof(num), "%" PRId64, step);
        if (rc == 0)
            rc = zt_st_writer_add_metadata(w, "format", SNAP_FORMAT, err);
        if (rc == 0)
            rc = zt_st_writer_add_metadata(w, "run_id", run->id, err);
        if (rc == 0)
            rc = zt_st_writer_add_metadata(w, "step", num, err);
        block_file_name(name, sizeof(name), b);
        if (rc == 0)
            rc = join(path, sizeof(path), tmp, name, err);
        if (rc == 0)
            rc = zt_st_writer_write(w, path, err);
        zt_st_writer_destroy(w);
        for (int i = 0; i < np; i++)
            zt_store_buffer_free(bufs[i]);
        free(bufs);
        uint64_t bytes = 0;
        uint32_t crc = 0;
        if (rc == 0)
            rc = zt_checksum_file(path, &bytes, &crc, err);
        if (rc == 0) {
            char hex[16];
            snprintf(hex, sizeof(hex), "%08" PRIx32, crc);
            cJSON *f = cJSON_AddObjectToObject(files, name);
            cJSON_AddItemToObject(f, "bytes", json_int((int64_t)bytes));
            cJSON_AddStringToObject(f, "crc32c", hex);
        }
    }

    cJSON_AddStringToObject(root, "format", SNAP_FORMAT);
    cJSON_AddItemToObject(root, "version", json_int(SNAP_VERSION));
    cJSON_AddStringToObject(root, "run_id", run->id);
    cJSON_AddItemToObject(root, "step", json_int(step));
    cJSON_AddItemToObject(root, "adam_step", json_int(adam_step));
    cJSON_AddItemToObject(root, "world_size", json_int(run->world_size));
    cJSON_AddItemToObject(root, "server_index", json_int(core->opt.server_index));
    cJSON_AddItemToObject(root, "server_count", json_int(core->opt.server_count));
    cJSON_AddStringToObject(root, "param_dtype", zt_dtype_name(run->param_dtype));
    cJSON *adam = cJSON_AddObjectToObject(root, "adamw");
    cJSON_AddItemToObject(adam, "beta1", json_float(run->beta1));
    cJSON_AddItemToObject(adam, "beta2", json_float(run->beta2));
    cJSON_AddItemToObject(adam, "eps", json_float(run->eps));
    cJSON_AddItemToObject(adam, "weight_decay", json_float(run->weight_decay));
    cJSON *blocks = cJSON_AddArrayToObject(root, "blocks");
    for (int b = 0; b < run->nblocks; b++) {
        cJSON *bo = cJSON_CreateObject();
        cJSON_AddItemToObject(bo, "numel", json_int((int64_t)run->numel[b]));
        cJSON *dec = cJSON_AddArrayToObject(bo, "decay");
        for (int i = 0; i < run->ndecay[b]; i++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, json_int((int64_t)run->decay[b][i].begin));
            cJSON_AddItemToArray(pair, json_int((int64_t)run->decay[b][i].end));
            cJSON_AddItemToArray(dec, pair);
        }
        cJSON_AddItemToArray(blocks, bo);
    }
    cJSON *shards = cJSON_AddArrayToObject(root, "shards");
    for (int i = 0; i < run->npairs; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, json_int(run->pairs[i].block));
        cJSON_AddItemToArray(pair, json_int(run->pairs[i].shard));
        cJSON_AddItemToArray(shards, pair);
    }
    cJSON_AddItemToObject(root, "files", files);

    if (rc == 0) {
        char *text = cJSON_Print(root);
        ZT_ASSERT(text);
        rc = join(path, sizeof(path), tmp, "manifest.json", err);
        if (rc == 0)
            rc = zt_write_file_atomic(path, text, strlen(text), err);
        free(text);
    }
    cJSON_Delete(root);
    if (rc == 0)
        rc = zt_fsync_dir(tmp, err);
    if (rc == 0 && rename(tmp, dir) < 0)
        rc = zt_fail(err, -errno, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    if (rc == 0)
        rc = zt_fsync_parent_dir(dir, err);
    if (rc < 0)
        zt_remove_flat_dir(tmp);
    return rc;
}

/* Holds the run for a snapshot and writes it; dir is either given or made from parent and the step. */
static int snapshot_run(zt_server_core *core, const char *run_id, const char *dir, const char *parent,
                        char *path_out, size_t cap, bool *existed, zt_err *err)
{
    zt__run *run;
    int rc = zt__run_get(core, run_id, &run, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&run->mu);
    if (run->init_pending > 0) {
        pthread_mutex_unlock(&run->mu);
        zt__run_release(core, run);
        return zt_fail(err, ZT_ESTATE, "run %s has no complete initial parameters yet: nothing to save", run_id);
    }
    zt__run_acquire(run, ZT__EXCLUSIVE); /* waits for a commit in progress */
    int64_t step = run->step, adam_step = run->adam_step;
    int slot = run->cur;
    pthread_mutex_unlock(&run->mu);

    char path[SNAP_MAX_PATH];
    if (dir) {
        snprintf(path, sizeof(path), "%s", dir);
    } else if (snprintf(path, sizeof(path), "%s/step_%08" PRId64, parent, step) >= (int)sizeof(path)) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "snapshot directory %s is too long", parent);
    }
    struct stat st;
    if (rc == 0 && !dir && stat(path, &st) == 0) {
        *existed = true; /* this step is saved already */
    } else if (rc == 0) {
        rc = write_dir(core, run, slot, step, adam_step, path, err);
        if (rc == 0)
            ZT_INFO("server: saved run %s at step %" PRId64 " to %s", run_id, step, path);
    }
    if (rc == 0 && path_out && cap > 0)
        snprintf(path_out, cap, "%s", path);
    pthread_mutex_lock(&run->mu);
    zt__run_unacquire(run);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* Writes a snapshot directory; see core.h. */
int zt_server_core_snapshot_write(zt_server_core *core, const char *run_id, const char *dir, zt_err *err)
{
    bool existed = false;
    if (!dir || !dir[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "no snapshot directory given");
    return snapshot_run(core, run_id, dir, NULL, NULL, 0, &existed, err);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether snapshot `name` of dir was saved for a worker's checkpoint (the marker NAME.checkpoint beside it). */
static bool is_checkpoint(const char *dir, const char *name)
{
    char path[SNAP_MAX_PATH];
    return snprintf(path, sizeof(path), "%s/%s.checkpoint", dir, name) < (int)sizeof(path) && access(path, F_OK) == 0;
}

/* Removes snapshots step_* of dir beyond the newest keep of their kind: those saved for a worker's
 * checkpoint (with their markers) and the others (--snapshot-commits) are counted apart, so that many
 * commits after a checkpoint do not remove the snapshot a worker resuming that checkpoint needs. */
static void prune(const char *dir, int keep)
{
    if (keep <= 0)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "step_", 5) != 0 || len != 13 || strspn(e->d_name + 5, "0123456789") != 8)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            names = realloc(names, (size_t)cap * sizeof(*names));
            ZT_ASSERT(names);
        }
        names[n] = strdup(e->d_name);
        ZT_ASSERT(names[n]);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, (size_t)n, sizeof(*names), cmp_str);
    char path[SNAP_MAX_PATH];
    bool *ckpt = calloc((size_t)(n > 0 ? n : 1), sizeof(bool));
    ZT_ASSERT(ckpt);
    int total[2] = {0, 0}, seen[2] = {0, 0};
    for (int i = 0; i < n; i++)
        total[ckpt[i] = is_checkpoint(dir, names[i])]++;
    for (int i = 0; i < n; i++) {
        const int k = ckpt[i];
        if (seen[k]++ < total[k] - keep) {
            if (snprintf(path, sizeof(path), "%s/%s", dir, names[i]) < (int)sizeof(path))
                zt_remove_flat_dir(path);
            if (k && snprintf(path, sizeof(path), "%s/%s.checkpoint", dir, names[i]) < (int)sizeof(path))
                unlink(path);
        }
        free(names[i]);
    }
    free(ckpt);
    free(names);
}

static void server_dir(char *out, size_t cap, const char *root, const char *run_id, const zt_server_core *core)
{
    snprintf(out, cap, "%s/%s/server%dof%d", root, run_id, core->opt.server_index, core->opt.server_count);
}

/* Saves a snapshot under root, marks it as a checkpoint's (checkpoint), points `latest` at it and prunes. */
static int snapshot_save(zt_server_core *core, const char *run_id, const char *root, int keep, bool checkpoint,
                         char *path_out, size_t cap, zt_err *err)
{
    if (!root || !root[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "no snapshot directory given: use --snapshot-dir");
    zt__run *run;
    int rc = zt__run_get(core, run_id, &run, err); /* checks the run id before it becomes a path */
    if (rc < 0)
        return rc;
    zt__run_release(core, run);
    char parent[SNAP_MAX_PATH], path[SNAP_MAX_PATH], latest[SNAP_MAX_PATH];
    server_dir(parent, sizeof(parent), root, run_id, core);
    rc = zt_mkdir_p(parent, err);
    if (rc < 0)
        return rc;
    bool existed = false;
    rc = snapshot_run(core, run_id, NULL, parent, path, sizeof(path), &existed, err);
    if (rc < 0)
        return rc;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char line[SNAP_MAX_PATH + 2];
    snprintf(line, sizeof(line), "%s\n", base);
    rc = join(latest, sizeof(latest), parent, "latest", err);
    if (rc == 0)
        rc = zt_write_file_atomic(latest, line, strlen(line), err);
    char marker[SNAP_MAX_PATH + 16];
    if (rc == 0 && checkpoint) {
        /* after the snapshot exists (a snapshot of the step saved before, by a commit, gets the marker too) */
        if (snprintf(marker, sizeof(marker), "%s.checkpoint", path) >= (int)sizeof(marker))
            rc = zt_fail(err, -ENAMETOOLONG, "snapshot path %s is too long", path);
        else
            rc = zt_write_file_atomic(marker, "checkpoint\n", 11, err);
    }
    if (rc == 0)
        prune(parent, keep);
    if (rc == 0 && path_out && cap > 0)
        snprintf(path_out, cap, "%s", path);
    return rc;
}

/* See core.h. */
int zt_server_core_snapshot_save(zt_server_core *core, const char *run_id, const char *root, int keep,
                                 char *path_out, size_t cap, zt_err *err)
{
    return snapshot_save(core, run_id, root, keep, false, path_out, cap, err);
}

/* See core.h. */
int zt_server_core_snapshot_save_checkpoint(zt_server_core *core, const char *run_id, const char *root, int keep,
                                            char *path_out, size_t cap, zt_err *err)
{
    return snapshot_save(core, run_id, root, keep, true, path_out, cap, err);
}

/* ---- reading ---- */

/* The parts of a manifest needed to restore; decay ranges live in one array. */
typedef struct manifest {
    char run_id[ZT_SERVER_RUN_ID_MAX];
    int64_t step, adam_step;
    int server_index, server_count;
    zt_server_run_desc desc;
    zt_server_block_desc *blocks;
    zt_server_range *ranges;
    cJSON *root;
} manifest;

static void manifest_free(manifest *m)
{
    free(m->blocks);
    free(m->ranges);
    cJSON_Delete(m->root);
    memset(m, 0, sizeof(*m));
}

static int get_int(const cJSON *obj, const char *key, int64_t min, int64_t max, int64_t *out, const char *where,
                   zt_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    /* The range first: converting a double outside int64_t's range to an integer is undefined. */
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= (double)min && it->valuedouble <= (double)max) ||
        it->valuedouble != floor(it->valuedouble))
        return zt_fail(err, ZT_EFORMAT, "%s: \"%s\" is missing or not a whole number in [%" PRId64 ", %" PRId64
                       "]; the snapshot is damaged", where, key, min, max);
    *out = (int64_t)it->valuedouble;
    return 0;
}

static int get_float(const cJSON *obj, const char *key, float *out, const char *where, zt_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(it))
        return zt_fail(err, ZT_EFORMAT, "%s: \"%s\" is missing or not a number; the snapshot is damaged", where, key);
    *out = (float)it->valuedouble;
    return 0;
}

static int get_pair(const cJSON *arr, int64_t *a, int64_t *b)
{
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != 2)
        return -1;
    const cJSON *x = cJSON_GetArrayItem(arr, 0), *y = cJSON_GetArrayItem(arr, 1);
    const double top = 281474976710656.0; /* 2^48, the most parameters a block has */
    if (!cJSON_IsNumber(x) || !cJSON_IsNumber(y) || !(x->valuedouble >= 0 && x->valuedouble <= top) ||
        !(y->valuedouble >= 0 && y->valuedouble <= top) || x->valuedouble != floor(x->valuedouble) ||
        y->valuedouble != floor(y->valuedouble))
        return -1;
    *a = (int64_t)x->valuedouble;
    *b = (int64_t)y->valuedouble;
    return 0;
}

/* Reads dir/manifest.json, checks every file's size and CRC-32C, and fills m. */
static int read_manifest(const char *dir, manifest *m, zt_err *err)
{
    memset(m, 0, sizeof(*m));
    char path[SNAP_MAX_PATH];
    int rc = join(path, sizeof(path), dir, "manifest.json", err);
    if (rc < 0)
        return rc;
    char *text = NULL;
    size_t len = 0;
    rc = zt_read_file(path, &text, &len, err);
    if (rc < 0)
        return rc;
    rc = zt_json_parse_object(text, path, &m->root, err);
    free(text);
    if (rc < 0)
        return rc;
    const cJSON *root = m->root;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, SNAP_FORMAT) != 0)
        return zt_fail(err, ZT_EFORMAT, "%s is not a state-server snapshot manifest (format should be \"%s\")", path,
                       SNAP_FORMAT);
    int64_t v = 0;
    rc = get_int(root, "version", 0, 1 << 30, &v, path, err);
    if (rc == 0 && v != SNAP_VERSION)
        rc = zt_fail(err, ZT_EFORMAT, "%s has snapshot version %" PRId64 "; this ztrain reads version %d", path, v,
                     SNAP_VERSION);
    if (rc < 0)
        return rc;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "run_id");
    if (!cJSON_IsString(id) || strlen(id->valuestring) >= sizeof(m->run_id))
        return zt_fail(err, ZT_EFORMAT, "%s: \"run_id\" is missing or too long; the snapshot is damaged", path);
    snprintf(m->run_id, sizeof(m->run_id), "%s", id->valuestring);
    int64_t ws = 0, si = 0, sc = 0;
    if (rc == 0)
        rc = get_int(root, "step", 0, INT64_MAX / 2, &m->step, path, err);
    if (rc == 0)
        rc = get_int(root, "adam_step", 0, m->step, &m->adam_step, path, err);
    if (rc == 0)
        rc = get_int(root, "world_size", 1, ZT_SERVER_MAX_WORLD, &ws, path, err);
    if (rc == 0)
        rc = get_int(root, "server_count", 1, 1 << 20, &sc, path, err);
    if (rc == 0)
        rc = get_int(root, "server_index", 0, sc - 1, &si, path, err);
    if (rc < 0)
        return rc;
    m->server_index = (int)si;
    m->server_count = (int)sc;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "param_dtype");
    enum zt_dtype pd;
    if (!cJSON_IsString(dt) || zt_dtype_parse(dt->valuestring, &pd) < 0)
        return zt_fail(err, ZT_EFORMAT, "%s: \"param_dtype\" is missing or unknown; the snapshot is damaged", path);
    const cJSON *adam = cJSON_GetObjectItemCaseSensitive(root, "adamw");
    zt_server_run_desc *d = &m->desc;
    rc = get_float(adam, "beta1", &d->beta1, path, err);
    if (rc == 0)
        rc = get_float(adam, "beta2", &d->beta2, path, err);
    if (rc == 0)
        rc = get_float(adam, "eps", &d->eps, path, err);
    if (rc == 0)
        rc = get_float(adam, "weight_decay", &d->weight_decay, path, err);
    if (rc < 0)
        return rc;
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(root, "blocks");
    int nb = cJSON_IsArray(blocks) ? cJSON_GetArraySize(blocks) : 0;
    if (nb < 1 || nb > ZT_SERVER_MAX_BLOCKS)
        return zt_fail(err, ZT_EFORMAT, "%s: \"blocks\" is missing or empty; the snapshot is damaged", path);
    int nranges = 0;
    for (int b = 0; b < nb; b++) {
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(blocks, b), "decay");
        if (!cJSON_IsArray(dec))
            return zt_fail(err, ZT_EFORMAT, "%s: block %d has no \"decay\" list; the snapshot is damaged", path, b);
        nranges += cJSON_GetArraySize(dec);
    }
    m->blocks = zt_xcalloc((size_t)nb, sizeof(*m->blocks));
    m->ranges = zt_xcalloc(nranges > 0 ? (size_t)nranges : 1, sizeof(*m->ranges));
    int k = 0;
    for (int b = 0; b < nb; b++) {
        const cJSON *bo = cJSON_GetArrayItem(blocks, b);
        int64_t numel = 0;
        rc = get_int(bo, "numel", 1, (int64_t)1 << 48, &numel, path, err);
        if (rc < 0)
            return rc;
        m->blocks[b].numel = (uint64_t)numel;
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(bo, "decay");
        m->blocks[b].decay = m->ranges + k;
        m->blocks[b].ndecay = cJSON_GetArraySize(dec);
        for (int i = 0; i < m->blocks[b].ndecay; i++, k++) {
            int64_t lo, hi;
            if (get_pair(cJSON_GetArrayItem(dec, i), &lo, &hi) < 0)
                return zt_fail(err, ZT_EFORMAT, "%s: block %d: decay range %d is not [begin, end]", path, b, i);
            m->ranges[k].begin = (uint64_t)lo;
            m->ranges[k].end = (uint64_t)hi;
        }
    }
    d->run_id = m->run_id;
    d->world_size = (int)ws;
    d->nblocks = nb;
    d->blocks = m->blocks;
    d->param_dtype = pd;
    rc = zt__desc_validate(d, err);
    if (rc < 0)
        return zt_fail(err, ZT_EFORMAT, "%s: %s", path, err ? err->msg : "bad layout");

    /* Every file: size and checksum. */
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsObject(files))
        return zt_fail(err, ZT_EFORMAT, "%s: \"files\" is missing; the snapshot is damaged", path);
    const cJSON *f;
    cJSON_ArrayForEach(f, files)
    {
        char fpath[SNAP_MAX_PATH];
        if (strchr(f->string, '/') || strcmp(f->string, "..") == 0)
            return zt_fail(err, ZT_EFORMAT, "%s: file name '%s' is not a plain name", path, f->string);
        rc = join(fpath, sizeof(fpath), dir, f->string, err);
        if (rc < 0)
            return rc;
        int64_t want;
        rc = get_int(f, "bytes", 0, INT64_MAX / 2, &want, path, err);
        const cJSON *hex = cJSON_GetObjectItemCaseSensitive(f, "crc32c");
        char *end = NULL;
        unsigned long want_crc = cJSON_IsString(hex) ? strtoul(hex->valuestring, &end, 16) : 0;
        if (rc == 0 && (!cJSON_IsString(hex) || !end || *end || end == hex->valuestring))
            rc = zt_fail(err, ZT_EFORMAT, "%s: crc32c of %s is not a hex number; the snapshot is damaged", path,
                         f->string);
        if (rc < 0)
            return rc;
        uint64_t bytes;
        uint32_t crc;
        rc = zt_checksum_file(fpath, &bytes, &crc, err);
        if (rc < 0)
            return rc;
        if (bytes != (uint64_t)want)
            return zt_fail(err, ZT_ECHECKSUM, "snapshot %s is corrupt: %s is %" PRIu64 " bytes, the manifest says %"
                           PRId64 "; restore an older snapshot", dir, f->string, bytes, want);
        if (crc != (uint32_t)want_crc)
            return zt_fail(err, ZT_ECHECKSUM, "snapshot %s is corrupt: %s crc32c mismatch (manifest %08lx, file "
                           "%08" PRIx32 "); restore an older snapshot", dir, f->string, want_crc, crc);
    }
    return 0;
}

/* Finds tensor name in f and checks it is F32 of n elements. */
static int find_tensor(zt_st_file *f, const char *fpath, const char *name, uint64_t n, const float **out,
                       zt_err *err)
{
    const zt_st_tensor *t = zt_st_find(f, name);
    if (!t)
        return zt_fail(err, ZT_EFORMAT, "snapshot file %s has no tensor %s", fpath, name);
    if (t->dtype != ZT_DTYPE_F32 || t->nbytes != n * 4)
        return zt_fail(err, ZT_EFORMAT, "snapshot file %s: tensor %s is %s of %zu bytes, expected F32 of %" PRIu64
                       " elements", fpath, name, zt_dtype_name(t->dtype), t->nbytes, n);
    *out = t->data;
    return 0;
}

/* Loads every owned pair of run from the snapshot in dir into slot dst (the run held exclusive), or with
 * apply false only checks that every pair's tensors are there with the right dtype and size. */
static int load_pairs(zt_server_core *core, zt__run *run, const char *dir, int dst, bool apply, zt_err *err)
{
    int rc = 0;
    bool nvme = core->opt.store == ZT_SERVER_STORE_NVME;
    float *buf = NULL;
    for (int b = 0; b < run->nblocks && rc == 0; b++) {
        int first = run->block_pair[b], last = run->block_pair[b + 1];
        if (first == last)
            continue;
        char name[64], fpath[SNAP_MAX_PATH];
        block_file_name(name, sizeof(name), b);
        rc = join(fpath, sizeof(fpath), dir, name, err);
        if (rc < 0)
            break;
        zt_st_file *f = NULL;
        rc = zt_st_open(fpath, &f, err);
        if (rc < 0)
            break;
        for (int i = first; i < last && rc == 0; i++) {
            zt__pair *p = &run->pairs[i];
            const float *t[3];
            static const char *const kind[3] = {"master", "m", "v"};
            for (int k = 0; k < 3 && rc == 0; k++) {
                snprintf(name, sizeof(name), "%s.%d.%d", kind[k], p->block, p->shard);
                rc = find_tensor(f, fpath, name, p->n, &t[k], err);
            }
            if (rc < 0 || !apply)
                continue;
            float *data = NULL;
            if (nvme) {
                zt_store_buffer_free(buf);
                buf = zt_store_buffer_alloc((size_t)p->n);
                if (!buf) {
                    rc = zt_fail(err, ZT_ENOMEM, "out of memory restoring block %d shard %d", p->block, p->shard);
                    break;
                }
                data = buf;
            } else {
                rc = zt__pair_read(core, p, dst, NULL, &data, err);
                if (rc < 0)
                    break;
            }
            for (int k = 0; k < 3; k++)
                memcpy(data + (size_t)k * p->n, t[k], (size_t)p->n * 4);
            rc = zt__pair_write(core, p, dst, data, err);
            if (rc == 0)
                rc = zt__pair_make_lowp(core, run, p, dst, data, err);
        }
        zt_st_close(f);
    }
    zt_store_buffer_free(buf);
    return rc;
}

/* Restores a snapshot directory; see core.h. */
int zt_server_core_snapshot_read(zt_server_core *core, const char *dir, zt_server_run_info *info, zt_err *err)
{
    if (!dir || !dir[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "no snapshot directory given");
    manifest m;
    int rc = read_manifest(dir, &m, err);
    if (rc < 0) {
        manifest_free(&m);
        return rc;
    }
    if (m.server_count != core->opt.server_count || m.server_index != core->opt.server_index) {
        rc = zt_fail(err, ZT_EMISMATCH, "snapshot %s was saved by server %d of %d; this is server %d of %d: "
                     "restore each server from its own serverIofS directory", dir, m.server_index, m.server_count,
                     core->opt.server_index, core->opt.server_count);
        manifest_free(&m);
        return rc;
    }

    zt__run *run = NULL;
    bool created = false;
    zt_err ignore;
    if (zt__run_get(core, m.run_id, &run, &ignore) == 0) {
        rc = zt__desc_compare(run, &m.desc, err);
    } else {
        rc = zt__run_create(core, &m.desc, &run, err);
        if (rc == 0) {
            created = true;
            pthread_mutex_lock(&run->mu);
            run->refs++; /* our reference, besides the table's */
            pthread_mutex_unlock(&run->mu);
        }
    }
    if (rc < 0) {
        zt__run_release(core, run);
        manifest_free(&m);
        return rc;
    }
    /* Check that every owned pair is in the files before changing anything. */
    rc = load_pairs(core, run, dir, 0, false, err);
    if (rc == 0) {
        pthread_mutex_lock(&run->mu);
        zt__run_acquire(run, ZT__EXCLUSIVE);
        int dst = 1 - run->cur;
        pthread_mutex_unlock(&run->mu);
        rc = load_pairs(core, run, dir, dst, true, err);
        pthread_mutex_lock(&run->mu);
        if (rc == 0)
            zt__run_install(run, dst, m.step, m.adam_step);
        zt__run_unacquire(run);
        if (rc == 0) {
            zt__run_fill_info(run, info);
        }
        pthread_mutex_unlock(&run->mu);
    }
    if (rc == 0)
        ZT_INFO("server: restored run %s at step %" PRId64 " from %s", run->id, m.step, dir);
    if (rc < 0 && created)
        zt__run_remove(core, run);
    zt__run_release(core, run);
    manifest_free(&m);
    return rc;
}

/* Restores the latest snapshot of every run under root; see core.h. */
int zt_server_core_restore_all(zt_server_core *core, const char *root, int *nruns, zt_err *err)
{
    if (nruns)
        *nruns = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return zt_fail(err, -errno, "cannot open snapshot directory %s: %s", root, strerror(errno));
    }
    int rc = 0, count = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sdir[SNAP_MAX_PATH], latest[SNAP_MAX_PATH], snap[SNAP_MAX_PATH];
        server_dir(sdir, sizeof(sdir), root, e->d_name, core);
        if (join(latest, sizeof(latest), sdir, "latest", NULL) < 0)
            continue;
        char *text = NULL;
        size_t len = 0;
        zt_err ignore;
        if (zt_read_file(latest, &text, &len, &ignore) < 0)
            continue; /* not a run directory, or nothing saved by this server */
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r'))
            text[--len] = '\0';
        if (len == 0 || strchr(text, '/')) {
            rc = zt_fail(err, ZT_EFORMAT, "%s should name a snapshot directory beside it, not '%s'", latest, text);
        } else if (join(snap, sizeof(snap), sdir, text, err) == 0) {
            rc = zt_server_core_snapshot_read(core, snap, NULL, err);
            if (rc == 0)
                count++;
        }
        free(text);
    }
    closedir(d);
    if (nruns)
        *nruns = count;
    return rc;
}
