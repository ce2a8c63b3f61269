/* The state server core (server/core.h): the run table, the shard table of each run, the step protocol
 * (gradient pushes with coverage tracking, atomic block-by-block commits into the second state slot,
 * pulls that wait for their block) and the statistics. Snapshots are in snapshot.c. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/units.h"
#include "offload/cpu_adam.h"
#include "server/core_internal.h"

/* ---- small helpers ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t fnv1a32(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 16777619u;
    }
    return h;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static bool lowp_dtype_ok(enum zt_dtype d)
{
    return d == ZT_DTYPE_F32 || d == ZT_DTYPE_F16 || d == ZT_DTYPE_BF16;
}

/* ---- interval sets ---- */

static void ivset_free(zt__ivset *s)
{
    free(s->r);
    memset(s, 0, sizeof(*s));
}

static void ivset_clear(zt__ivset *s)
{
    s->n = 0;
}

/* Adds [b, e) and merges it with the ranges it touches. */
static void ivset_add(zt__ivset *s, uint64_t b, uint64_t e)
{
    if (b >= e)
        return;
    int i = 0;
    while (i < s->n && s->r[i].end < b)
        i++;
    int j = i;
    while (j < s->n && s->r[j].begin <= e) {
        if (s->r[j].begin < b)
            b = s->r[j].begin;
        if (s->r[j].end > e)
            e = s->r[j].end;
        j++;
    }
    /* ranges [i, j) are replaced by one */
    if (i == j) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 8;
            zt_server_range *r = realloc(s->r, (size_t)s->cap * sizeof(*r));
            ZT_ASSERT(r);
            s->r = r;
        }
        memmove(s->r + i + 1, s->r + i, (size_t)(s->n - i) * sizeof(*s->r));
        s->n++;
    } else if (j > i + 1) {
        memmove(s->r + i + 1, s->r + j, (size_t)(s->n - j) * sizeof(*s->r));
        s->n -= j - i - 1;
    }
    s->r[i].begin = b;
    s->r[i].end = e;
}

/* The first element of [0, n) not in the set, or n when all are. */
static uint64_t ivset_first_missing(const zt__ivset *s, uint64_t n)
{
    if (s->n == 0 || s->r[0].begin > 0)
        return 0;
    return s->r[0].end < n ? s->r[0].end : n;
}

/* ---- pure functions ---- */

/* Elements of one shard: ceil(numel / W); see core.h. */
uint64_t zt_server_shard_numel(uint64_t numel, int world_size)
{
    ZT_ASSERT(world_size >= 1);
    return (numel + (uint64_t)world_size - 1) / (uint64_t)world_size;
}

/* The owner of (block, shard): (fnv1a32(run_id) + block * W + shard) mod S; see core.h. */
int zt_server_owner(const char *run_id, int block, int shard, int world_size, int nservers)
{
    if (nservers <= 1)
        return 0;
    uint64_t flat = (uint64_t)block * (uint64_t)world_size + (uint64_t)shard;
    return (int)(((uint64_t)fnv1a32(run_id) + flat) % (uint64_t)nservers);
}

/* ---- core ---- */

static int nservers(const zt_server_core *core)
{
    return core->opt.server_count > 0 ? core->opt.server_count : 1;
}

/* Deletes the record files (*.zts, offload/store.h) an earlier process left in the NVMe directory: state
 * survives restarts through snapshots only, and a record torn by a crash would stop the store opening. */
static void remove_old_records(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return; /* zt_store_open reports the directory's problem */
    int removed = 0;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".zts") == 0 &&
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) < (int)sizeof(path) && unlink(path) == 0)
            removed++;
    }
    closedir(d);
    if (removed > 0)
        ZT_INFO("server: removed %d state files of an earlier process from %s (state is restored from snapshots)",
                removed, dir);
}

/* Creates a core with its store; see core.h. */
int zt_server_core_create(zt_server_core **out, const zt_server_core_options *opt, zt_err *err)
{
    *out = NULL;
    zt_server_core_options o = {0};
    if (opt)
        o = *opt;
    int S = o.server_count > 0 ? o.server_count : 1;
    if (o.server_index < 0 || o.server_index >= S)
        return zt_fail(err, ZT_EINVAL_CONFIG, "server index %d is outside [0, %d): give each of the %d servers "
                       "an index from 0 to %d", o.server_index, S, S, S - 1);
    if (o.store != ZT_SERVER_STORE_RAM && o.store != ZT_SERVER_STORE_NVME)
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown store kind %d: use ram or nvme:PATH", (int)o.store);
    if (o.store == ZT_SERVER_STORE_NVME && (!o.store_path || !o.store_path[0]))
        return zt_fail(err, ZT_EINVAL_CONFIG, "the NVMe store needs a directory: use --store nvme:PATH");

    zt_server_core *c = zt_xcalloc(1, sizeof(*c));
    c->opt = o;
    c->opt.server_count = S;
    if (o.store_path) {
        c->store_path = strdup(o.store_path);
        ZT_ASSERT(c->store_path);
        c->opt.store_path = c->store_path;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->register_mu, NULL);
    if (o.store == ZT_SERVER_STORE_NVME)
        remove_old_records(c->store_path);
    zt_store_config sc = {0};
    sc.kind = o.store == ZT_SERVER_STORE_NVME ? ZT_STORE_NVME : ZT_STORE_RAM;
    sc.path = c->store_path;
    sc.buffered = o.store_no_direct ? 1 : 0;
    int rc = zt_store_open(&sc, &c->store, err);
    if (rc < 0) {
        zt_server_core_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void run_free(zt_server_core *core, zt__run *run)
{
    if (!run)
        return;
    for (int i = 0; i < run->npairs; i++) {
        zt__pair *p = &run->pairs[i];
        if (core && core->store) {
            zt_store_remove(core->store, p->key[0], NULL);
            zt_store_remove(core->store, p->key[1], NULL);
        }
        free(p->grad);
        ivset_free(&p->grad_cov);
        ivset_free(&p->init_cov);
        zt_store_buffer_free(p->init);
        free(p->lowp[0]);
        free(p->lowp[1]);
    }
    free(run->pairs);
    free(run->block_pair);
    zt_store_buffer_free(run->stage[0]);
    zt_store_buffer_free(run->stage[1]);
    for (int b = 0; run->decay && b < run->nblocks; b++)
        free(run->decay[b]);
    free(run->decay);
    free(run->ndecay);
    free(run->numel);
    pthread_mutex_destroy(&run->mu);
    pthread_cond_destroy(&run->cv);
    free(run);
}

/* Frees the core, its runs and closes the store; see core.h. */
void zt_server_core_destroy(zt_server_core *core)
{
    if (!core)
        return;
    for (int i = 0; i < core->nruns; i++)
        run_free(core, core->runs[i]);
    free(core->runs);
    zt_store_close(core->store);
    pthread_mutex_destroy(&core->mu);
    pthread_mutex_destroy(&core->register_mu);
    free(core->store_path);
    free(core);
}

/* ---- run table ---- */

static int run_id_check(const char *id, zt_err *err)
{
    if (!id || !id[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "the run id is empty: name the run (letters, digits, '.', '_', '-')");
    size_t len = strlen(id);
    if (len >= ZT_SERVER_RUN_ID_MAX)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run id '%.40s...' is %zu bytes; the limit is %d", id, len,
                       ZT_SERVER_RUN_ID_MAX - 1);
    if (id[0] == '.')
        return zt_fail(err, ZT_EINVAL_CONFIG, "run id '%s' starts with '.': start it with a letter or digit", id);
    for (size_t i = 0; i < len; i++) {
        char ch = id[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == '-';
        if (!ok)
            return zt_fail(err, ZT_EINVAL_CONFIG, "run id '%s' has the character 0x%02x at byte %zu: use only "
                           "letters, digits, '.', '_' and '-'", id, (unsigned)(uint8_t)ch, i);
    }
    return 0;
}

static zt__run *find_locked(zt_server_core *core, const char *id)
{
    for (int i = 0; i < core->nruns; i++)
        if (strcmp(core->runs[i]->id, id) == 0)
            return core->runs[i];
    return NULL;
}

/* Looks a run up and takes a reference; see core_internal.h. */
int zt__run_get(zt_server_core *core, const char *run_id, zt__run **out, zt_err *err)
{
    *out = NULL;
    if (!run_id)
        return zt_fail(err, ZT_EINVAL_CONFIG, "no run id given");
    pthread_mutex_lock(&core->mu);
    zt__run *run = find_locked(core, run_id);
    if (run) {
        pthread_mutex_lock(&run->mu);
        run->refs++;
        pthread_mutex_unlock(&run->mu);
    }
    pthread_mutex_unlock(&core->mu);
    if (!run)
        return zt_fail(err, -ENOENT, "unknown run '%s': register it first (or restore it from a snapshot)", run_id);
    *out = run;
    return 0;
}

/* Drops a reference; frees a removed run when it was the last. */
void zt__run_release(zt_server_core *core, zt__run *run)
{
    if (!run)
        return;
    pthread_mutex_lock(&run->mu);
    int left = --run->refs;
    pthread_mutex_unlock(&run->mu);
    if (left == 0)
        run_free(core, run);
}

/* Takes a run out of the table; see core_internal.h. */
void zt__run_remove(zt_server_core *core, zt__run *run)
{
    pthread_mutex_lock(&core->mu);
    for (int i = 0; i < core->nruns; i++) {
        if (core->runs[i] == run) {
            memmove(core->runs + i, core->runs + i + 1, (size_t)(core->nruns - i - 1) * sizeof(*core->runs));
            core->nruns--;
            core->ram_bytes -= run->ram_bytes;
            break;
        }
    }
    pthread_mutex_unlock(&core->mu);
    zt__run_release(core, run);
}

void zt__run_acquire(zt__run *run, int what)
{
    while (run->busy != ZT__IDLE || run->grad_writers > 0)
        pthread_cond_wait(&run->cv, &run->mu);
    run->busy = what;
}

void zt__run_unacquire(zt__run *run)
{
    run->busy = ZT__IDLE;
    pthread_cond_broadcast(&run->cv);
}

/* Checks a description; see core_internal.h. */
int zt__desc_validate(const zt_server_run_desc *d, zt_err *err)
{
    if (!d)
        return zt_fail(err, ZT_EINVAL_CONFIG, "no run description given");
    int rc = run_id_check(d->run_id, err);
    if (rc < 0)
        return rc;
    const char *id = d->run_id;
    if (d->world_size < 1 || d->world_size > ZT_SERVER_MAX_WORLD)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: world size %d is outside [1, %d]", id, d->world_size,
                       ZT_SERVER_MAX_WORLD);
    if (d->nblocks < 1 || d->nblocks > ZT_SERVER_MAX_BLOCKS || !d->blocks)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: %d blocks; a layout has 1 to %d blocks", id, d->nblocks,
                       ZT_SERVER_MAX_BLOCKS);
    if ((uint64_t)d->nblocks * (uint64_t)d->world_size > ZT_SERVER_MAX_SHARDS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: %d blocks of %d shards are %" PRIu64 " shards; a run has at "
                       "most %d (fewer blocks or ranks)", id, d->nblocks, d->world_size,
                       (uint64_t)d->nblocks * (uint64_t)d->world_size, ZT_SERVER_MAX_SHARDS);
    if (!(d->beta1 >= 0.0f && d->beta1 < 1.0f) || !(d->beta2 >= 0.0f && d->beta2 < 1.0f))
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: AdamW betas (%g, %g) must lie in [0, 1)", id,
                       (double)d->beta1, (double)d->beta2);
    if (!(d->eps > 0.0f) || !isfinite(d->eps))
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: AdamW eps %g must be positive", id, (double)d->eps);
    if (!(d->weight_decay >= 0.0f) || !isfinite(d->weight_decay))
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: weight decay %g must be 0 or positive", id,
                       (double)d->weight_decay);
    if (!lowp_dtype_ok(d->param_dtype))
        return zt_fail(err, ZT_EUNSUPPORTED, "run %s: parameter dtype %d is not served: use F32, F16 or BF16", id,
                       (int)d->param_dtype);
    for (int b = 0; b < d->nblocks; b++) {
        const zt_server_block_desc *bd = &d->blocks[b];
        if (bd->numel == 0 || bd->numel > ((uint64_t)1 << 48))
            return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: block %d has %" PRIu64 " parameters; give 1 to 2^48", id,
                           b, bd->numel);
        if (bd->ndecay < 0 || (bd->ndecay > 0 && !bd->decay))
            return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: block %d: %d decay ranges but no array", id, b, bd->ndecay);
        uint64_t prev_end = 0;
        for (int i = 0; i < bd->ndecay; i++) {
            zt_server_range r = bd->decay[i];
            if (r.begin >= r.end || r.end > bd->numel || (i > 0 && r.begin < prev_end))
                return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: block %d: weight-decay range %d [%" PRIu64 ", %" PRIu64
                               ") is empty, overlaps the one before or ends past the block's %" PRIu64
                               " elements; give sorted, disjoint ranges", id, b, i, r.begin, r.end, bd->numel);
            prev_end = r.end;
        }
    }
    return 0;
}

/* Compares a description with a registered run; see core_internal.h. */
int zt__desc_compare(const zt__run *run, const zt_server_run_desc *d, zt_err *err)
{
    const char *id = run->id;
    if (d->world_size != run->world_size)
        return zt_fail(err, ZT_EMISMATCH, "run %s is registered with world size %d, not %d: use a new run id or "
                       "the same world size", id, run->world_size, d->world_size);
    if (d->nblocks != run->nblocks)
        return zt_fail(err, ZT_EMISMATCH, "run %s is registered with %d blocks, not %d", id, run->nblocks, d->nblocks);
    for (int b = 0; b < d->nblocks; b++) {
        if (d->blocks[b].numel != run->numel[b])
            return zt_fail(err, ZT_EMISMATCH, "run %s: block %d: numel %" PRIu64 ", registered %" PRIu64, id, b,
                           d->blocks[b].numel, run->numel[b]);
        if (d->blocks[b].ndecay != run->ndecay[b])
            return zt_fail(err, ZT_EMISMATCH, "run %s: block %d: %d weight-decay ranges, registered %d", id, b,
                           d->blocks[b].ndecay, run->ndecay[b]);
        for (int i = 0; i < run->ndecay[b]; i++)
            if (d->blocks[b].decay[i].begin != run->decay[b][i].begin ||
                d->blocks[b].decay[i].end != run->decay[b][i].end)
                return zt_fail(err, ZT_EMISMATCH, "run %s: block %d: weight-decay range %d is [%" PRIu64 ", %" PRIu64
                               "), registered [%" PRIu64 ", %" PRIu64 ")", id, b, i, d->blocks[b].decay[i].begin,
                               d->blocks[b].decay[i].end, run->decay[b][i].begin, run->decay[b][i].end);
    }
    if (d->beta1 != run->beta1 || d->beta2 != run->beta2 || d->eps != run->eps)
        return zt_fail(err, ZT_EMISMATCH, "run %s: AdamW betas/eps (%g, %g, %g), registered (%g, %g, %g)", id,
                       (double)d->beta1, (double)d->beta2, (double)d->eps, (double)run->beta1, (double)run->beta2,
                       (double)run->eps);
    if (d->weight_decay != run->weight_decay)
        return zt_fail(err, ZT_EMISMATCH, "run %s: weight decay %g, registered %g", id, (double)d->weight_decay,
                       (double)run->weight_decay);
    if (d->param_dtype != run->param_dtype)
        return zt_fail(err, ZT_EMISMATCH, "run %s: parameter dtype %s, registered %s", id,
                       zt_dtype_name(d->param_dtype), zt_dtype_name(run->param_dtype));
    return 0;
}

/* Fills a run's position and sizes; see core_internal.h. */
void zt__run_fill_info(const zt__run *run, zt_server_run_info *info)
{
    if (!info)
        return;
    memset(info, 0, sizeof(*info));
    info->step = run->step;
    info->adam_step = run->adam_step;
    info->params_ready = run->init_pending == 0;
    info->committing = run->busy == ZT__COMMIT;
    info->owned_shards = run->npairs;
    info->owned_numel = run->owned_numel;
    info->world_size = run->world_size;
    info->nblocks = run->nblocks;
    info->param_dtype = run->param_dtype;
}

/* Builds a run at step 0 and inserts it; see core_internal.h. */
/* Refuses a new run that the core's limits cannot take, before anything is allocated for it: the run
 * count (max_runs) and the RAM it needs (mem_limit), as far as they can be told without the core's lock.
 * Called with core->mu held; `bytes` is the run's RAM. Returns 0 or ZT_ENOMEM with the message. */
static int check_limits_locked(const zt_server_core *core, const char *run_id, uint64_t bytes, zt_err *err)
{
    if (core->opt.max_runs > 0 && core->nruns >= core->opt.max_runs)
        return zt_fail(err, ZT_ENOMEM, "run %s cannot be registered: this server holds %d runs, its --max-runs; "
                       "use a server with room (or raise --max-runs)", run_id, core->nruns);
    if (core->opt.mem_limit && core->ram_bytes + bytes > core->opt.mem_limit) {
        char a[32], b2[32], c2[32];
        return zt_fail(err, ZT_ENOMEM, "run %s needs %s of RAM on this server, %s of the %s --max-memory is in use: "
                       "raise --max-memory, add servers, or use the NVMe store", run_id,
                       zt_format_size(bytes, a, sizeof(a)), zt_format_size(core->ram_bytes, b2, sizeof(b2)),
                       zt_format_size(core->opt.mem_limit, c2, sizeof(c2)));
    }
    return 0;
}

/* The RAM a run of description d holds on this server (what zt__run_create accounts), and its owned
 * pairs and largest owned shard. */
static uint64_t run_bytes(const zt_server_core *core, const zt_server_run_desc *d, int *npairs_out, uint64_t *max_n_out)
{
    int W = d->world_size, S = nservers(core), me = core->opt.server_index;
    size_t esize = zt_dtype_size(d->param_dtype);
    uint64_t bytes = 0, max_n = 0;
    int npairs = 0;
    for (int b = 0; b < d->nblocks; b++) {
        uint64_t n = zt_server_shard_numel(d->blocks[b].numel, W);
        for (int r = 0; r < W; r++) {
            if (zt_server_owner(d->run_id, b, r, W, S) != me)
                continue;
            npairs++;
            if (n > max_n)
                max_n = n;
            bytes += n * 4 + 2 * n * esize;
            if (core->opt.store == ZT_SERVER_STORE_RAM)
                bytes += 2 * 12 * n;
        }
    }
    if (core->opt.store == ZT_SERVER_STORE_NVME && npairs > 0)
        bytes += 2 * (uint64_t)zt_store_buffer_bytes((size_t)max_n);
    if (npairs_out)
        *npairs_out = npairs;
    if (max_n_out)
        *max_n_out = max_n;
    return bytes;
}

int zt__run_create(zt_server_core *core, const zt_server_run_desc *d, zt__run **out, zt_err *err)
{
    *out = NULL;
    /* A run the limits refuse is refused before its tables are allocated (a hostile RegisterRun must not
     * make the server allocate what it then refuses). The check is repeated under the lock below. */
    uint64_t need = run_bytes(core, d, NULL, NULL);
    pthread_mutex_lock(&core->mu);
    int limit_rc = check_limits_locked(core, d->run_id, need, err);
    pthread_mutex_unlock(&core->mu);
    if (limit_rc < 0)
        return limit_rc;
    zt__run *run = zt_xcalloc(1, sizeof(*run));
    pthread_mutex_init(&run->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run->cv, &ca);
    pthread_condattr_destroy(&ca);
    run->refs = 1;
    snprintf(run->id, sizeof(run->id), "%s", d->run_id);
    run->world_size = d->world_size;
    run->nblocks = d->nblocks;
    run->beta1 = d->beta1;
    run->beta2 = d->beta2;
    run->eps = d->eps;
    run->weight_decay = d->weight_decay;
    run->param_dtype = d->param_dtype;
    run->key_run = fnv1a64(d->run_id) & ~(uint64_t)1;
    run->numel = zt_xcalloc((size_t)d->nblocks, sizeof(*run->numel));
    run->ndecay = zt_xcalloc((size_t)d->nblocks, sizeof(*run->ndecay));
    run->decay = zt_xcalloc((size_t)d->nblocks, sizeof(*run->decay));
    run->block_pair = zt_xcalloc((size_t)d->nblocks + 1, sizeof(*run->block_pair));
    int W = d->world_size, S = nservers(core), me = core->opt.server_index;
    int npairs = 0;
    for (int b = 0; b < d->nblocks; b++) {
        run->numel[b] = d->blocks[b].numel;
        run->ndecay[b] = d->blocks[b].ndecay;
        if (d->blocks[b].ndecay > 0) {
            run->decay[b] = zt_xmalloc((size_t)d->blocks[b].ndecay * sizeof(zt_server_range));
            memcpy(run->decay[b], d->blocks[b].decay, (size_t)d->blocks[b].ndecay * sizeof(zt_server_range));
        }
        for (int r = 0; r < W; r++)
            if (zt_server_owner(d->run_id, b, r, W, S) == me)
                npairs++;
    }
    run->pairs = zt_xcalloc(npairs > 0 ? (size_t)npairs : 1, sizeof(*run->pairs));
    size_t esize = zt_dtype_size(d->param_dtype);
    uint64_t max_n = 0, bytes = 0;
    int k = 0;
    for (int b = 0; b < d->nblocks; b++) {
        run->block_pair[b] = k;
        uint64_t n = zt_server_shard_numel(d->blocks[b].numel, W);
        for (int r = 0; r < W; r++) {
            if (zt_server_owner(d->run_id, b, r, W, S) != me)
                continue;
            zt__pair *p = &run->pairs[k++];
            p->block = b;
            p->shard = r;
            p->n = n;
            p->grad_dtype = -1;
            for (int s = 0; s < 2; s++) {
                p->key[s].run = run->key_run | (uint64_t)s;
                p->key[s].block = (uint32_t)b;
                p->key[s].shard = (uint32_t)r;
            }
            run->owned_numel += n;
            if (n > max_n)
                max_n = n;
            bytes += n * 4 + 2 * n * esize;
            if (core->opt.store == ZT_SERVER_STORE_RAM)
                bytes += 2 * 12 * n;
        }
    }
    run->block_pair[d->nblocks] = k;
    run->npairs = npairs;
    run->init_pending = npairs;
    if (core->opt.store == ZT_SERVER_STORE_NVME && npairs > 0)
        bytes += 2 * (uint64_t)zt_store_buffer_bytes((size_t)max_n);
    run->ram_bytes = bytes;

    /* Reserve the memory under the core's lock, so two registrations cannot both fit in the last room. */
    pthread_mutex_lock(&core->mu);
    if (find_locked(core, d->run_id)) {
        pthread_mutex_unlock(&core->mu);
        run_free(NULL, run);
        return zt_fail(err, -EEXIST, "run %s was registered meanwhile; register again", d->run_id);
    }
    for (int i = 0; i < core->nruns; i++) {
        if ((core->runs[i]->key_run) == run->key_run) {
            pthread_mutex_unlock(&core->mu);
            char other[ZT_SERVER_RUN_ID_MAX];
            snprintf(other, sizeof(other), "%s", core->runs[i]->id);
            run_free(NULL, run);
            return zt_fail(err, ZT_EMISMATCH, "run ids %s and %s have the same 64-bit hash: pick another run id",
                           d->run_id, other);
        }
    }
    int lrc = check_limits_locked(core, d->run_id, bytes, err);
    if (lrc < 0) {
        pthread_mutex_unlock(&core->mu);
        run_free(NULL, run);
        return lrc;
    }
    core->ram_bytes += bytes;
    pthread_mutex_unlock(&core->mu);

    /* Allocate buffers and the store records (both slots, zero). */
    int rc = 0;
    for (int i = 0; i < npairs && rc == 0; i++) {
        zt__pair *p = &run->pairs[i];
        p->grad = malloc((size_t)p->n * 4);
        p->lowp[0] = calloc((size_t)p->n, esize);
        p->lowp[1] = calloc((size_t)p->n, esize);
        if (!p->grad || !p->lowp[0] || !p->lowp[1]) {
            rc = zt_fail(err, ZT_ENOMEM, "run %s: out of memory for block %d shard %d (%" PRIu64 " elements)",
                         run->id, p->block, p->shard, p->n);
            break;
        }
        for (int s = 0; s < 2 && rc == 0; s++) {
            if (zt_store_lookup(core->store, p->key[s], NULL) == 0)
                zt_store_remove(core->store, p->key[s], NULL); /* left over from an earlier process */
            rc = zt_store_create(core->store, p->key[s], (size_t)p->n, err);
        }
    }
    if (rc == 0 && core->opt.store == ZT_SERVER_STORE_NVME && npairs > 0) {
        for (int s = 0; s < 2 && rc == 0; s++) {
            run->stage[s] = zt_store_buffer_alloc((size_t)max_n);
            if (!run->stage[s])
                rc = zt_fail(err, ZT_ENOMEM, "run %s: out of memory for staging buffers", run->id);
        }
    }
    run->stats.store_bytes = (uint64_t)npairs ? 0 : 0;
    for (int i = 0; i < npairs; i++)
        run->stats.store_bytes += 2 * 12 * run->pairs[i].n;
    run->stats.ram_bytes = bytes;
    snprintf(run->stats.run_id, sizeof(run->stats.run_id), "%s", run->id);
    if (rc < 0) {
        pthread_mutex_lock(&core->mu);
        core->ram_bytes -= bytes;
        pthread_mutex_unlock(&core->mu);
        run_free(core, run);
        return rc;
    }

    pthread_mutex_lock(&core->mu);
    if (find_locked(core, d->run_id)) {
        core->ram_bytes -= bytes;
        pthread_mutex_unlock(&core->mu);
        run_free(core, run);
        return zt_fail(err, -EEXIST, "run %s was registered meanwhile; register again", d->run_id);
    }
    if (core->nruns == core->cap) {
        core->cap = core->cap ? 2 * core->cap : 8;
        zt__run **r = realloc(core->runs, (size_t)core->cap * sizeof(*r));
        ZT_ASSERT(r);
        core->runs = r;
    }
    core->runs[core->nruns++] = run;
    pthread_mutex_unlock(&core->mu);
    *out = run;
    return 0;
}

static int register_locked(zt_server_core *core, const zt_server_run_desc *desc, zt_server_run_info *info,
                           zt_err *err);

/* Registers a run or checks it against the registered one; see core.h. */
int zt_server_core_register(zt_server_core *core, const zt_server_run_desc *desc, zt_server_run_info *info,
                            zt_err *err)
{
    int rc = zt__desc_validate(desc, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&core->register_mu);
    rc = register_locked(core, desc, info, err);
    pthread_mutex_unlock(&core->register_mu);
    return rc;
}

/* zt_server_core_register under core->register_mu. */
static int register_locked(zt_server_core *core, const zt_server_run_desc *desc, zt_server_run_info *info,
                           zt_err *err)
{
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        zt__run *run = NULL;
        zt_err ignore;
        if (zt__run_get(core, desc->run_id, &run, &ignore) == 0) {
            rc = zt__desc_compare(run, desc, err);
            if (rc == 0) {
                pthread_mutex_lock(&run->mu);
                zt__run_fill_info(run, info);
                pthread_mutex_unlock(&run->mu);
            }
            zt__run_release(core, run);
            return rc;
        }
        rc = zt__run_create(core, desc, &run, err);
        if (rc == -EEXIST)
            continue; /* registered by another thread meanwhile: compare with it */
        if (rc < 0)
            return rc;
        pthread_mutex_lock(&run->mu);
        zt__run_fill_info(run, info);
        pthread_mutex_unlock(&run->mu);
        ZT_INFO("server: registered run %s: %d blocks, world size %d, %d shards here (%" PRIu64 " parameters)",
                run->id, run->nblocks, run->world_size, run->npairs, run->owned_numel);
        return 0;
    }
    return rc;
}

/* Finds run_id and calls copy(run, out) under its lock: the whole of the calls that copy a run's fields
 * out. Returns 0, or -ENOENT for an unknown run. */
static int copy_from_run(zt_server_core *core, const char *run_id, void (*copy)(const zt__run *run, void *out),
                         void *out, zt_err *err)
{
    zt__run *run;
    int rc = zt__run_get(core, run_id, &run, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&run->mu);
    copy(run, out);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return 0;
}

static void copy_info(const zt__run *run, void *out)
{
    zt__run_fill_info(run, out);
}

/* Reports a run's position; see core.h. */
int zt_server_core_run_info(zt_server_core *core, const char *run_id, zt_server_run_info *info, zt_err *err)
{
    return copy_from_run(core, run_id, copy_info, info, err);
}

/* Finds run_id and checks that it has block `block`. Returns 0 with a reference on *run that the caller
 * drops with zt__run_release, or a negative code holding none. */
static int get_run_block(zt_server_core *core, const char *run_id, int block, zt__run **run, zt_err *err)
{
    int rc = zt__run_get(core, run_id, run, err);
    if (rc < 0)
        return rc;
    if (block < 0 || block >= (*run)->nblocks) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s has blocks 0 to %d, not %d", run_id, (*run)->nblocks - 1,
                     block);
        zt__run_release(core, *run);
    }
    return rc;
}

/* Reports a block's sizes; see core.h. */
int zt_server_core_block_numel(zt_server_core *core, const char *run_id, int block, uint64_t *numel,
                               uint64_t *shard_numel, zt_err *err)
{
    zt__run *run;
    int rc = get_run_block(core, run_id, block, &run, err);
    if (rc < 0)
        return rc;
    if (numel)
        *numel = run->numel[block];
    if (shard_numel)
        *shard_numel = zt_server_shard_numel(run->numel[block], run->world_size);
    zt__run_release(core, run);
    return 0;
}

/* Removes a run; see core.h. */
int zt_server_core_drop(zt_server_core *core, const char *run_id, zt_err *err)
{
    zt__run *run;
    int rc = zt__run_get(core, run_id, &run, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&run->mu);
    int busy = run->busy;
    pthread_mutex_unlock(&run->mu);
    if (busy != ZT__IDLE) {
        zt__run_release(core, run);
        return zt_fail(err, ZT_ESTATE, "run %s is committing or saving a snapshot; drop it when that is done", run_id);
    }
    zt__run_remove(core, run);
    zt__run_release(core, run);
    return 0;
}

/* ---- store access ---- */

/* Counts one store write for the test hook; see core_internal.h. */
int zt__store_write_hook(zt_server_core *core, zt_err *err)
{
    int fail = 0;
    pthread_mutex_lock(&core->mu);
    if (core->fail_write_in > 0 && --core->fail_write_in == 0)
        fail = 1;
    pthread_mutex_unlock(&core->mu);
    if (fail)
        return zt_fail(err, ZT_EIO, "store write failed (injected by a test)");
    return 0;
}

/* Arms the test hook; see core.h. */
void zt__server_core_fail_store_write(zt_server_core *core, int n)
{
    pthread_mutex_lock(&core->mu);
    core->fail_write_in = n > 0 ? n : 0;
    pthread_mutex_unlock(&core->mu);
}

/* The RAM tier's own memory of a pair's record in slot `slot`. */
static int ram_data(zt_server_core *core, zt__pair *p, int slot, float **data, zt_err *err)
{
    size_t n = 0;
    int rc = zt_store_ram_data(core->store, p->key[slot], data, &n);
    if (rc < 0)
        return zt_fail(err, rc, "block %d shard %d: the RAM store has no record for slot %d (%s)", p->block,
                       p->shard, slot, zt_strerror(rc));
    ZT_ASSERT(n == p->n);
    return 0;
}

int zt__pair_read(zt_server_core *core, zt__pair *p, int slot, float *buf, float **data, zt_err *err)
{
    if (core->opt.store == ZT_SERVER_STORE_RAM) {
        return ram_data(core, p, slot, data, err);
    }
    int rc = zt_store_read(core->store, p->key[slot], buf, err);
    *data = rc == 0 ? buf : NULL;
    return rc;
}

int zt__pair_write(zt_server_core *core, zt__pair *p, int slot, const float *src, zt_err *err)
{
    int rc = zt__store_write_hook(core, err);
    if (rc < 0)
        return rc;
    if (core->opt.store == ZT_SERVER_STORE_RAM) {
        float *dst;
        rc = ram_data(core, p, slot, &dst, err);
        if (rc == 0 && dst != src)
            memcpy(dst, src, (size_t)p->n * 3 * sizeof(float));
        return rc;
    }
    return zt_store_write(core->store, p->key[slot], src, err);
}

int zt__pair_make_lowp(zt_server_core *core, const zt__run *run, zt__pair *p, int slot, const float *master,
                       zt_err *err)
{
    int rc = zt_cpu_adam_convert(p->lowp[slot], run->param_dtype, master, (size_t)p->n, core->opt.threads, err);
    if (rc == 0)
        p->lowp_stale[slot] = false;
    return rc;
}

/* ---- pushes ---- */

/* Finds the owned pair (block, shard) and checks a chunk's range; returns it or an error. */
static int chunk_pair(zt_server_core *core, zt__run *run, const zt_server_chunk *c, zt__pair **out, zt_err *err)
{
    *out = NULL;
    if (!c)
        return zt_fail(err, ZT_EINVAL_CONFIG, "no chunk given");
    if (c->block < 0 || c->block >= run->nblocks)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s has blocks 0 to %d, not %d", run->id, run->nblocks - 1,
                       c->block);
    if (c->shard < 0 || c->shard >= run->world_size)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s has shards 0 to %d (world size %d), not %d", run->id,
                       run->world_size - 1, run->world_size, c->shard);
    int owner = zt_server_owner(run->id, c->block, c->shard, run->world_size, nservers(core));
    if (owner != core->opt.server_index)
        return zt_fail(err, ZT_EMISMATCH, "run %s: block %d shard %d belongs to server %d of %d, not to this "
                       "server (%d): check the --servers list and its order", run->id, c->block, c->shard, owner,
                       nservers(core), core->opt.server_index);
    zt__pair *p = NULL;
    for (int i = run->block_pair[c->block]; i < run->block_pair[c->block + 1]; i++)
        if (run->pairs[i].shard == c->shard)
            p = &run->pairs[i];
    ZT_ASSERT(p);
    if (c->offset > p->n || c->n > p->n - c->offset)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: block %d shard %d has %" PRIu64 " elements; a chunk of %"
                       PRIu64 " at offset %" PRIu64 " does not fit", run->id, c->block, c->shard, p->n, c->n,
                       c->offset);
    if (c->n > 0 && !c->data)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: chunk of %" PRIu64 " elements without data", run->id, c->n);
    *out = p;
    return 0;
}

/* Finds run_id and the shard pair that chunk c addresses in it (see chunk_pair). Returns 0 with a
 * reference on *run that the caller drops with zt__run_release, or a negative code holding none. */
static int get_chunk_pair(zt_server_core *core, const char *run_id, const zt_server_chunk *c, zt__run **run,
                          zt__pair **p, zt_err *err)
{
    int rc = zt__run_get(core, run_id, run, err);
    if (rc < 0)
        return rc;
    rc = chunk_pair(core, *run, c, p, err);
    if (rc < 0)
        zt__run_release(core, *run);
    return rc;
}

/* Installs a fully written slot as the committed state; see core_internal.h. */
void zt__run_install(zt__run *run, int dst, int64_t step, int64_t adam_step)
{
    while (run->grad_writers > 0) /* pushes checked against the old step finish before it is reset */
        pthread_cond_wait(&run->cv, &run->mu);
    run->cur = dst;
    run->step = step;
    run->adam_step = adam_step;
    run->failed_step = 0;
    run->init_pending = 0;
    for (int i = 0; i < run->npairs; i++) {
        zt__pair *p = &run->pairs[i];
        p->init_done = true;
        zt_store_buffer_free(p->init);
        p->init = NULL;
        p->grad_dtype = -1;
        p->grad_cov.n = 0;
        p->init_cov.n = 0;
        p->delivered_step = 0; /* the places hold other parameters than the new state */
    }
    run->stats.step = run->step;
}

/* Replaces a run's state with the given shards; see core.h. */
int zt_server_core_load_state(zt_server_core *core, const char *run_id, int64_t step, int64_t adam_step,
                              const zt_server_shard_state *shards, int nshards, zt_err *err)
{
    if (step < 0 || adam_step < 0 || adam_step > step)
        return zt_fail(err, ZT_EINVAL_CONFIG, "run %s: cannot load step %" PRId64 " with Adam step %" PRId64, run_id,
                       step, adam_step);
    zt__run *run;
    int rc = zt__run_get(core, run_id, &run, err);
    if (rc < 0)
        return rc;
    /* every owned pair exactly once, before anything changes */
    const zt_server_shard_state **of = zt_xcalloc((size_t)run->npairs + 1, sizeof *of);
    for (int i = 0; i < nshards && rc == 0; i++) {
        const zt_server_shard_state *st = &shards[i];
        int k = -1;
        if (st->block >= 0 && st->block < run->nblocks)
            for (int j = run->block_pair[st->block]; j < run->block_pair[st->block + 1]; j++)
                if (run->pairs[j].shard == st->shard)
                    k = j;
        if (k < 0 || of[k] || !st->master || !st->m || !st->v)
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s: block %d shard %d is not owned by this server, given twice "
                         "or without its master weights and moments", run_id, st->block, st->shard);
        else
            of[k] = st;
    }
    for (int j = 0; j < run->npairs && rc == 0; j++)
        if (!of[j])
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s: the state of block %d shard %d is missing", run_id,
                         run->pairs[j].block, run->pairs[j].shard);
    if (rc < 0) {
        free(of);
        zt__run_release(core, run);
        return rc;
    }
    pthread_mutex_lock(&run->mu);
    zt__run_acquire(run, ZT__EXCLUSIVE);
    const int dst = 1 - run->cur;
    pthread_mutex_unlock(&run->mu);
    float *buf = NULL;
    for (int j = 0; j < run->npairs && rc == 0; j++) {
        zt__pair *p = &run->pairs[j];
        float *data = NULL;
        if (core->opt.store == ZT_SERVER_STORE_NVME) {
            zt_store_buffer_free(buf);
            buf = zt_store_buffer_alloc((size_t)p->n);
            if (!buf) {
                rc = zt_fail(err, ZT_ENOMEM, "run %s: out of memory loading block %d shard %d", run_id, p->block,
                             p->shard);
                break;
            }
            data = buf;
        } else if ((rc = zt__pair_read(core, p, dst, NULL, &data, err)) < 0) {
            break;
        }
        memcpy(data, of[j]->master, (size_t)p->n * 4);
        memcpy(data + p->n, of[j]->m, (size_t)p->n * 4);
        memcpy(data + 2 * p->n, of[j]->v, (size_t)p->n * 4);
        rc = zt__pair_write(core, p, dst, data, err);
        if (rc == 0)
            rc = zt__pair_make_lowp(core, run, p, dst, data, err);
    }
    zt_store_buffer_free(buf);
    free(of);
    pthread_mutex_lock(&run->mu);
    if (rc == 0)
        zt__run_install(run, dst, step, adam_step);
    zt__run_unacquire(run);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* Stores initial parameters; see core.h. */
int zt_server_core_push_params(zt_server_core *core, const char *run_id, const zt_server_chunk *c, zt_err *err)
{
    zt__run *run;
    zt__pair *p;
    int rc = get_chunk_pair(core, run_id, c, &run, &p, err);
    if (rc < 0)
        return rc;
    if (c->dtype != ZT_DTYPE_F32) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s: initial parameters are sent as F32, not %s", run_id,
                     zt_dtype_name(c->dtype));
        zt__run_release(core, run);
        return rc;
    }
    pthread_mutex_lock(&run->mu);
    if (run->step != 0 || run->busy == ZT__COMMIT) {
        rc = zt_fail(err, ZT_ESTATE, "run %s is at step %" PRId64 ": its parameters live on the server now; pull "
                     "them instead of pushing initial ones", run_id, run->step);
        goto out;
    }
    if (p->init_done) {
        /* A restarted rank 0 pushing the same weights again is fine; different ones are not. */
        zt__run_acquire(run, ZT__EXCLUSIVE);
        pthread_mutex_unlock(&run->mu);
        float *buf = NULL, *data = NULL;
        if (core->opt.store == ZT_SERVER_STORE_NVME) {
            buf = zt_store_buffer_alloc((size_t)p->n);
            if (!buf)
                rc = zt_fail(err, ZT_ENOMEM, "out of memory comparing initial parameters");
        }
        if (rc == 0)
            rc = zt__pair_read(core, p, run->cur, buf, &data, err);
        if (rc == 0 && c->n > 0 && memcmp(data + c->offset, c->data, (size_t)c->n * 4) != 0)
            rc = zt_fail(err, ZT_EMISMATCH, "run %s: block %d shard %d already has initial parameters and these "
                         "differ: a restarted worker must push the same weights (same seed) or use a new run id",
                         run_id, c->block, c->shard);
        zt_store_buffer_free(buf);
        pthread_mutex_lock(&run->mu);
        zt__run_unacquire(run);
        goto out;
    }
    if (!p->init) {
        p->init = zt_store_buffer_alloc((size_t)p->n);
        if (!p->init) {
            rc = zt_fail(err, ZT_ENOMEM, "run %s: out of memory for the initial parameters of block %d shard %d",
                         run_id, c->block, c->shard);
            goto out;
        }
    }
    if (c->n > 0)
        memcpy(p->init + c->offset, c->data, (size_t)c->n * 4);
    ivset_add(&p->init_cov, c->offset, c->offset + c->n);
    run->stats.bytes_pushed += c->n * 4;
    if (ivset_first_missing(&p->init_cov, p->n) == p->n) {
        /* Complete: write master (m and v are zero in the buffer) into the committed slot. */
        zt__run_acquire(run, ZT__EXCLUSIVE);
        pthread_mutex_unlock(&run->mu);
        rc = zt__pair_write(core, p, run->cur, p->init, err);
        if (rc == 0)
            rc = zt__pair_make_lowp(core, run, p, run->cur, p->init, err);
        pthread_mutex_lock(&run->mu);
        if (rc == 0) {
            p->init_done = true;
            run->init_pending--;
            zt_store_buffer_free(p->init);
            p->init = NULL;
            ivset_free(&p->init_cov);
        }
        zt__run_unacquire(run);
    }
out:
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* Stores a gradient chunk; see core.h. */
int zt_server_core_push_grad(zt_server_core *core, const char *run_id, int64_t step, const zt_server_chunk *c,
                             zt_err *err)
{
    zt__run *run;
    zt__pair *p;
    int rc = get_chunk_pair(core, run_id, c, &run, &p, err);
    if (rc < 0)
        return rc;
    if (!lowp_dtype_ok(c->dtype)) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s: gradients are F32, F16 or BF16, not dtype %d", run_id,
                     (int)c->dtype);
        zt__run_release(core, run);
        return rc;
    }
    pthread_mutex_lock(&run->mu);
    /* A push for the step after the one being committed waits for that commit. */
    while (run->busy == ZT__COMMIT && step == run->commit_step + 1)
        pthread_cond_wait(&run->cv, &run->mu);
    if (step <= run->step) {
        rc = zt_fail(err, ZT_ESTATE, "run %s: step %" PRId64 " is already committed (the run is at step %" PRId64
                     "); push gradients for step %" PRId64, run_id, step, run->step, run->step + 1);
    } else if (step > run->step + 1) {
        rc = zt_fail(err, ZT_ESTATE, "run %s: step %" PRId64 " is in the future (the run is at step %" PRId64
                     "); push gradients for step %" PRId64, run_id, step, run->step, run->step + 1);
    } else if (run->busy == ZT__COMMIT) {
        rc = zt_fail(err, ZT_ESTATE, "run %s: step %" PRId64 " is being committed; its gradients can no longer "
                     "change", run_id, step);
    } else if (p->grad_dtype >= 0 && p->grad_dtype != (int)c->dtype) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s: block %d shard %d: this step's gradient chunks are %s, not %s: "
                     "send one dtype per shard and step", run_id, c->block, c->shard,
                     zt_dtype_name((enum zt_dtype)p->grad_dtype), zt_dtype_name(c->dtype));
    } else {
        /* The copy runs outside the lock, so that chunks arriving on several streams are copied at the same
         * time. Nothing else touches p->grad meanwhile: a commit or snapshot waits for grad_writers to reach
         * 0, and concurrent chunks of one step and shard hold disjoint ranges (or, when a push is retried,
         * the same bytes again). The range counts as arrived once its copy is done. */
        size_t es = zt_dtype_size(c->dtype);
        p->grad_dtype = (int)c->dtype;
        run->grad_writers++;
        pthread_mutex_unlock(&run->mu);
        if (c->n > 0)
            memcpy((char *)p->grad + c->offset * es, c->data, (size_t)c->n * es);
        pthread_mutex_lock(&run->mu);
        ivset_add(&p->grad_cov, c->offset, c->offset + c->n);
        run->stats.bytes_pushed += c->n * es;
        if (--run->grad_writers == 0)
            pthread_cond_broadcast(&run->cv);
    }
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* ---- commit ---- */

/* AdamW over one pair's state (3n floats at data) with its gradient; low-precision output into out. With src
 * (3n floats, not overlapping data) the state is read from there and the new one written to data, in one
 * pass; with src NULL data is updated in place. */
static int adam_pair(zt_server_core *core, const zt__run *run, const zt__pair *p, const float *src, float *data,
                     void *out, const zt_adamw_params *hp, zt_err *err)
{
    uint64_t n = p->n;
    uint64_t base = (uint64_t)p->shard * n;          /* block element of the shard's first element */
    uint64_t numel = run->numel[p->block];
    size_t gs = zt_dtype_size((enum zt_dtype)p->grad_dtype);
    size_t os = zt_dtype_size(run->param_dtype);
    const zt_server_range *dr = run->decay[p->block];
    int nd = run->ndecay[p->block];
    /* Walk the shard in maximal pieces of equal weight decay: decay ranges, gaps and padding. */
    uint64_t i = 0;
    int di = 0;
    while (i < n) {
        uint64_t e = base + i; /* block element */
        while (di < nd && dr[di].end <= e)
            di++;
        bool decay;
        uint64_t stop; /* block element where this piece ends */
        if (e >= numel) {
            decay = false;
            stop = base + n;
        } else if (di < nd && dr[di].begin <= e) {
            decay = true;
            stop = dr[di].end;
        } else {
            decay = false;
            stop = di < nd ? dr[di].begin : numel;
        }
        if (stop > base + n)
            stop = base + n;
        uint64_t len = stop - e;
        zt_adamw_params q = *hp;
        q.weight_decay = decay ? hp->weight_decay : 0.0f;
        zt_cpu_adam_range r = {
            .param = data + i,
            .m = data + n + i,
            .v = data + 2 * n + i,
            .grad = (const char *)p->grad + i * gs,
            .grad_dtype = (enum zt_dtype)p->grad_dtype,
            .out = (char *)out + i * os,
            .out_dtype = run->param_dtype,
            .n = (size_t)len,
            .param_src = src ? src + i : NULL,
            .m_src = src ? src + n + i : NULL,
            .v_src = src ? src + 2 * n + i : NULL,
        };
        int rc = zt_cpu_adam_update(&r, &q, core->opt.threads, err);
        if (rc < 0)
            return rc;
        i += len;
    }
    return 0;
}

/* Marks blocks [0, upto) of the commit done and wakes pulls waiting for them. */
static void set_ready(zt__run *run, int upto)
{
    pthread_mutex_lock(&run->mu);
    if (upto > run->ready_blocks) {
        run->ready_blocks = upto;
        pthread_cond_broadcast(&run->cv);
    }
    pthread_mutex_unlock(&run->mu);
}

/* The place pair p's pulls stand in, with a reference taken (give it back with core->places.put), into
 * *id, or NULL when there is none or it is gone (then the pull that named it no longer stands). */
static void *take_place(zt_server_core *core, zt__run *run, zt__pair *p, uint64_t *id)
{
    pthread_mutex_lock(&run->mu);
    *id = core->places.get ? p->place_id : 0;
    const uint64_t off = p->place_off;
    pthread_mutex_unlock(&run->mu);
    void *place = *id ? core->places.get(core->places.user, *id, off, p->n * zt_dtype_size(run->param_dtype)) : NULL;
    if (*id && !place) {
        pthread_mutex_lock(&run->mu);
        if (p->place_id == *id)
            p->place_id = 0;
        pthread_mutex_unlock(&run->mu);
    }
    return place;
}

/* After the update of pair i wrote its low-precision parameters into the place `id` of its standing pull
 * (delivered) or into lowp[dst]: records which, and marks the blocks before pair i + 1 ready (as set_ready). */
static void pair_done(zt__run *run, int i, int dst, bool delivered, uint64_t id)
{
    zt__pair *p = &run->pairs[i];
    pthread_mutex_lock(&run->mu);
    p->lowp_stale[dst] = delivered;
    if (delivered && p->place_id == id) { /* a pull may have named another place meanwhile */
        p->delivered_step = run->commit_step;
        run->stats.bytes_delivered += p->n * zt_dtype_size(run->param_dtype);
    }
    pthread_mutex_unlock(&run->mu);
    set_ready(run, i + 1 < run->npairs ? run->pairs[i + 1].block : run->nblocks);
}

/* The update of every owned pair into slot `dst` from slot `src`, block 0 first. RAM: read the record of
 * slot src, write the updated one into slot dst, in one pass, and the low-precision parameters into the place
 * of the pair's standing pull when it has one (the pull's copy then is not needed), else into lowp[dst]. NVMe:
 * read pair i+1 while pair i updates, write each back from its staging buffer. */
static int apply_update(zt_server_core *core, zt__run *run, int src, int dst, const zt_adamw_params *hp,
                        zt_err *err)
{
    int np = run->npairs;
    set_ready(run, np > 0 ? run->pairs[0].block : run->nblocks);
    if (core->opt.store == ZT_SERVER_STORE_RAM) {
        for (int i = 0; i < np; i++) {
            zt__pair *p = &run->pairs[i];
            float *from, *to;
            int rc = ram_data(core, p, src, &from, err);
            if (rc == 0)
                rc = zt__store_write_hook(core, err);
            if (rc == 0)
                rc = ram_data(core, p, dst, &to, err);
            if (rc < 0)
                return rc;
            uint64_t id;
            void *place = take_place(core, run, p, &id);
            rc = adam_pair(core, run, p, from, to, place ? place : p->lowp[dst], hp, err);
            if (place)
                core->places.put(core->places.user, id);
            if (rc < 0)
                return rc;
            pair_done(run, i, dst, place != NULL, id);
        }
        return 0;
    }
    int rtk[2] = {-1, -1}, wtk[2] = {-1, -1};
    int rc = 0;
    zt_err tmp;
    if (np > 0)
        rc = zt_store_read_async(core->store, run->pairs[0].key[src], run->stage[0], &rtk[0], err);
    for (int i = 0; i < np && rc == 0; i++) {
        int b = i & 1, nb = (i + 1) & 1;
        zt__pair *p = &run->pairs[i];
        rc = zt_store_wait(core->store, rtk[b], err);
        rtk[b] = -1;
        if (rc < 0)
            break;
        if (i + 1 < np) {
            if (wtk[nb] >= 0) {
                rc = zt_store_wait(core->store, wtk[nb], err);
                wtk[nb] = -1;
                if (rc < 0)
                    break;
            }
            rc = zt_store_read_async(core->store, run->pairs[i + 1].key[src], run->stage[nb], &rtk[nb], err);
            if (rc < 0)
                break;
        }
        rc = adam_pair(core, run, p, NULL, run->stage[b], p->lowp[dst], hp, err);
        if (rc == 0)
            rc = zt__store_write_hook(core, err);
        if (rc == 0)
            rc = zt_store_write_async(core->store, p->key[dst], run->stage[b], &wtk[b], err);
        if (rc == 0)
            set_ready(run, i + 1 < np ? run->pairs[i + 1].block : run->nblocks);
    }
    /* Wait for everything still in flight (the buffers are reused by the next commit). */
    for (int k = 0; k < 2; k++) {
        if (rtk[k] >= 0)
            zt_store_wait(core->store, rtk[k], &tmp);
        if (wtk[k] >= 0) {
            int w = zt_store_wait(core->store, wtk[k], rc == 0 ? err : &tmp);
            if (rc == 0 && w < 0)
                rc = w;
        }
    }
    return rc;
}

/* Records a failed commit of the run's next step (run->mu held): pulls waiting for it, and those of that
 * step that come later (until a commit of it starts again), end with the commit's message, so that a worker
 * pulling while it commits never waits out its deadline for a commit that was refused. */
static void commit_failed(zt__run *run, int64_t step, int rc, const char *msg)
{
    run->fail_seq++;
    run->fail_code = rc;
    run->failed_step = step;
    snprintf(run->fail_msg, sizeof(run->fail_msg), "%s", msg);
    pthread_cond_broadcast(&run->cv);
}

/* Commits a step atomically; see core.h. */
int zt_server_core_commit(zt_server_core *core, const char *run_id, const zt_server_commit_args *args,
                          zt_server_commit_result *result, zt_err *err)
{
    zt_server_commit_result res = {0};
    if (!args)
        return zt_fail(err, ZT_EINVAL_CONFIG, "no commit arguments given");
    zt__run *run;
    int rc = zt__run_get(core, run_id, &run, err);
    if (rc < 0)
        return rc;
    int64_t step = args->step;
    bool applied = false;
    pthread_mutex_lock(&run->mu);
    if (run->busy == ZT__COMMIT) {
        rc = zt_fail(err, ZT_ESTATE, "run %s: step %" PRId64 " is being committed already; wait for it", run_id,
                     run->commit_step);
        goto out_locked;
    }
    /* a snapshot or an initial-parameter write, or gradient chunks still being copied */
    while (run->busy != ZT__IDLE || run->grad_writers > 0)
        pthread_cond_wait(&run->cv, &run->mu);
    if (step == run->step && step > 0) {
        res.already_committed = true;
        goto done_locked;
    }
    if (step != run->step + 1) {
        rc = zt_fail(err, ZT_ESTATE, "run %s: cannot commit step %" PRId64 ": the run is at step %" PRId64
                     " and commits step %" PRId64 " next", run_id, step, run->step, run->step + 1);
        goto out_locked;
    }
    if (run->init_pending > 0) {
        for (int i = 0; i < run->npairs; i++)
            if (!run->pairs[i].init_done) {
                zt__pair *p = &run->pairs[i];
                uint64_t miss = p->init ? ivset_first_missing(&p->init_cov, p->n) : 0;
                rc = zt_fail(err, ZT_ESTATE, "run %s: cannot commit step %" PRId64 ": block %d shard %d has no "
                             "initial parameters from element %" PRIu64 " on: rank 0 pushes them before the "
                             "first step", run_id, step, p->block, p->shard, miss);
                goto out_locked;
            }
    }
    if (!args->overflow) {
        if (!isfinite(args->lr) || !isfinite(args->clip_coef)) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "run %s: commit of step %" PRId64 " with lr %g and clip coefficient "
                         "%g: both must be finite (send the overflow flag to skip a step)", run_id, step,
                         (double)args->lr, (double)args->clip_coef);
            goto out_locked;
        }
        for (int i = 0; i < run->npairs; i++) {
            zt__pair *p = &run->pairs[i];
            uint64_t miss = ivset_first_missing(&p->grad_cov, p->n);
            if (miss < p->n) {
                rc = zt_fail(err, ZT_ESTATE, "run %s: cannot commit step %" PRId64 ": the gradient of block %d "
                             "shard %d is incomplete (element %" PRIu64 " of %" PRIu64 " has not arrived); push "
                             "the rest, then commit again", run_id, step, p->block, p->shard, miss, p->n);
                goto out_locked;
            }
        }
    }
    if (args->overflow) {
        res.skipped = true;
        run->step = step;
        run->stats.skipped_steps++;
        run->stats.commits++;
        for (int i = 0; i < run->npairs; i++) {
            ivset_clear(&run->pairs[i].grad_cov);
            run->pairs[i].grad_dtype = -1;
        }
        pthread_cond_broadcast(&run->cv);
        goto done_locked;
    }

    run->busy = ZT__COMMIT;
    run->commit_step = step;
    run->failed_step = 0;
    run->ready_blocks = 0;
    for (int i = 0; i < run->npairs; i++)
        run->pairs[i].delivered_step = 0; /* this commit's update writes the places again, or not */
    int src = run->cur, dst = 1 - run->cur;
    zt_adamw_params hp = {
        .lr = args->lr,
        .beta1 = run->beta1,
        .beta2 = run->beta2,
        .eps = run->eps,
        .weight_decay = run->weight_decay,
        .grad_scale = args->clip_coef,
        .step = (int)(run->adam_step + 1),
    };
    pthread_mutex_unlock(&run->mu);

    double t0 = now_s();
    applied = true; /* a failure from here on is recorded where it happens */
    rc = apply_update(core, run, src, dst, &hp, err);
    double dt = now_s() - t0;

    pthread_mutex_lock(&run->mu);
    if (rc == 0) {
        run->cur = dst; /* the flip: the new state is the committed one from here on */
        run->step = step;
        run->adam_step++;
        for (int i = 0; i < run->npairs; i++) {
            ivset_clear(&run->pairs[i].grad_cov);
            run->pairs[i].grad_dtype = -1;
        }
        run->stats.commits++;
        run->stats.last_commit_s = dt;
        run->stats.total_commit_s += dt;
        res.seconds = dt;
    } else {
        char msg[ZT_ERR_LEN];
        snprintf(msg, sizeof(msg), "run %s: commit of step %" PRId64 " failed, the run stays at step %" PRId64
                 ": %.300s", run_id, step, run->step, err ? err->msg : zt_strerror(rc));
        commit_failed(run, step, rc, msg);
        if (err)
            snprintf(err->msg, sizeof(err->msg), "%s", run->fail_msg);
        ZT_WARN("server: %s", run->fail_msg);
    }
    run->ready_blocks = 0;
    zt__run_unacquire(run);
    if (rc < 0)
        goto out_locked;
done_locked:
    res.step = run->step;
    res.adam_step = run->adam_step;
out_locked:
    /* a commit of the next step refused before it started (gradients or initial parameters missing, bad
     * arguments): its pulls end too */
    if (rc < 0 && !applied && step == run->step + 1 && run->busy != ZT__COMMIT)
        commit_failed(run, step, rc, err ? err->msg : zt_strerror(rc));
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    if (result && rc == 0)
        *result = res;
    return rc;
}

/* ---- pulls ---- */

/* Whether every owned pair of block b has its initial parameters (run->mu held). */
static bool block_init_done(const zt__run *run, int b)
{
    for (int i = run->block_pair[b]; i < run->block_pair[b + 1]; i++)
        if (!run->pairs[i].init_done)
            return false;
    return true;
}

/* Waits (run->mu held) until block `block` of `step` can be read; on success *slot is the slot whose
 * low-precision parameters hold it. */
static int wait_ready(zt__run *run, int64_t step, int block, int timeout_ms, int *slot, zt_err *err)
{
    struct timespec deadline;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    uint64_t seq0 = run->fail_seq;
    for (;;) {
        if (step < run->step)
            return zt_fail(err, ZT_ESTATE, "run %s: the parameters of step %" PRId64 " are gone (the run is at step %"
                           PRId64 "); pull step %" PRId64, run->id, step, run->step, run->step);
        if (step > run->step + 1)
            return zt_fail(err, ZT_ESTATE, "run %s: step %" PRId64 " is in the future (the run is at step %" PRId64
                           ")", run->id, step, run->step);
        if (step == run->step && (step > 0 || block_init_done(run, block))) {
            *slot = run->cur;
            return 0;
        }
        if (step == run->step + 1 && run->busy == ZT__COMMIT && run->commit_step == step &&
            run->ready_blocks > block) {
            *slot = 1 - run->cur;
            return 0;
        }
        if ((run->fail_seq != seq0 || run->failed_step == step) && step == run->step + 1)
            return zt_fail(err, run->fail_code, "%s", run->fail_msg);
        if (timeout_ms < 0) {
            pthread_cond_wait(&run->cv, &run->mu);
        } else if (pthread_cond_timedwait(&run->cv, &run->mu, &deadline) == ETIMEDOUT) {
            return zt_fail(err, -ETIMEDOUT, "run %s: block %d of step %" PRId64 " was not ready within %d ms (the "
                           "run is at step %" PRId64 "%s)", run->id, block, step, timeout_ms, run->step,
                           step == 0 ? ", waiting for initial parameters" : "");
        }
    }
}

/* Waits until a block of a step can be pulled; see core.h. */
int zt_server_core_wait_block(zt_server_core *core, const char *run_id, int64_t step, int block, int timeout_ms,
                              zt_err *err)
{
    zt__run *run;
    int rc = get_run_block(core, run_id, block, &run, err);
    if (rc < 0)
        return rc;
    int slot;
    pthread_mutex_lock(&run->mu);
    rc = wait_ready(run, step, block, timeout_ms, &slot, err);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* Sets the places of standing pulls; see core.h. */
void zt_server_core_set_pull_places(zt_server_core *core, const zt_server_pull_places *places)
{
    pthread_mutex_lock(&core->mu);
    core->places = places ? *places : (zt_server_pull_places){0};
    for (int r = 0; !places && r < core->nruns; r++) {
        zt__run *run = core->runs[r];
        pthread_mutex_lock(&run->mu);
        for (int i = 0; i < run->npairs; i++)
            run->pairs[i].place_id = 0;
        pthread_mutex_unlock(&run->mu);
    }
    pthread_mutex_unlock(&core->mu);
}

/* A pull into out, standing in place `id` at byte `off` when id is not 0 (zt_server_core_pull_standing). */
static int pull_into(zt_server_core *core, const char *run_id, int64_t step, int block, int shard, uint64_t offset,
                     uint64_t n, void *out, uint64_t id, uint64_t off, int timeout_ms, bool *delivered, zt_err *err)
{
    *delivered = false;
    zt__run *run;
    zt__pair *p;
    zt_server_chunk c = {.block = block, .shard = shard, .offset = offset, .n = n, .data = out};
    int rc = get_chunk_pair(core, run_id, &c, &run, &p, err);
    if (rc < 0)
        return rc;
    int slot;
    pthread_mutex_lock(&run->mu);
    rc = wait_ready(run, step, block, timeout_ms, &slot, err);
    const bool whole = offset == 0 && n == p->n;
    const bool stands = id != 0 && whole && core->places.get != NULL && core->opt.store == ZT_SERVER_STORE_RAM;
    if (rc == 0 && stands && p->place_id == id && p->place_off == off && p->delivered_step == step) {
        *delivered = true; /* the update of this step wrote them there */
    } else if (rc == 0) {
        /* Copy under the lock: no commit can flip slots, and the one in progress writes the other slot
         * or only blocks not yet marked ready. */
        float *master;
        if (p->lowp_stale[slot] && (rc = ram_data(core, p, slot, &master, err)) == 0)
            rc = zt__pair_make_lowp(core, run, p, slot, master, err);
        size_t es = zt_dtype_size(run->param_dtype);
        if (rc == 0 && n > 0)
            memcpy(out, (const char *)p->lowp[slot] + offset * es, (size_t)n * es);
        if (rc == 0 && whole) { /* from the next commit on, written where this pull stands, or nowhere */
            p->place_id = stands ? id : 0;
            p->place_off = off;
            p->delivered_step = 0;
        }
    }
    if (rc == 0)
        run->stats.bytes_pulled += n * zt_dtype_size(run->param_dtype);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* Copies pulled parameters; see core.h. */
int zt_server_core_pull(zt_server_core *core, const char *run_id, int64_t step, int block, int shard,
                        uint64_t offset, uint64_t n, void *out, int timeout_ms, zt_err *err)
{
    bool delivered;
    return pull_into(core, run_id, step, block, shard, offset, n, out, 0, 0, timeout_ms, &delivered, err);
}

/* A pull that stands in the worker's memory; see core.h. */
int zt_server_core_pull_standing(zt_server_core *core, const char *run_id, int64_t step, int block, int shard,
                                 uint64_t offset, uint64_t n, void *out, uint64_t id, uint64_t off, int timeout_ms,
                                 bool *delivered, zt_err *err)
{
    return pull_into(core, run_id, step, block, shard, offset, n, out, id, off, timeout_ms, delivered, err);
}

/* Copies a shard's committed fp32 state; see core.h. */
int zt_server_core_read_state(zt_server_core *core, const char *run_id, int block, int shard,
                              enum zt_server_state_tensor which, float *out, int64_t *step, zt_err *err)
{
    zt__run *run;
    zt__pair *p;
    zt_server_chunk c = {.block = block, .shard = shard};
    int rc = get_chunk_pair(core, run_id, &c, &run, &p, err);
    if (rc < 0)
        return rc;
    if (which < ZT_SERVER_MASTER || which > ZT_SERVER_ADAM_V) {
        zt__run_release(core, run);
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown state tensor %d", (int)which);
    }
    pthread_mutex_lock(&run->mu);
    zt__run_acquire(run, ZT__EXCLUSIVE);
    int64_t s = run->step;
    int slot = run->cur;
    pthread_mutex_unlock(&run->mu);
    float *buf = NULL, *data = NULL;
    if (core->opt.store == ZT_SERVER_STORE_NVME) {
        buf = zt_store_buffer_alloc((size_t)p->n);
        if (!buf)
            rc = zt_fail(err, ZT_ENOMEM, "out of memory reading block %d shard %d", block, shard);
    }
    if (rc == 0)
        rc = zt__pair_read(core, p, slot, buf, &data, err);
    if (rc == 0)
        memcpy(out, data + (size_t)which * p->n, (size_t)p->n * sizeof(float));
    zt_store_buffer_free(buf);
    pthread_mutex_lock(&run->mu);
    zt__run_unacquire(run);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    if (rc == 0 && step)
        *step = s;
    return rc;
}

/* Copies a range of a shard's committed fp32 masters of `step`; see core.h. */
int zt_server_core_read_masters(zt_server_core *core, const char *run_id, int64_t step, int block, int shard,
                                uint64_t offset, uint64_t n, void *out, zt_err *err)
{
    zt__run *run;
    zt__pair *p;
    zt_server_chunk c = {.block = block, .shard = shard, .offset = offset, .n = n, .dtype = ZT_DTYPE_F32, .data = out};
    int rc = get_chunk_pair(core, run_id, &c, &run, &p, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&run->mu);
    zt__run_acquire(run, ZT__EXCLUSIVE); /* after a commit in progress */
    const int64_t s = run->step;
    const int slot = run->cur;
    pthread_mutex_unlock(&run->mu);
    float *buf = NULL, *data = NULL;
    if (s != step)
        rc = zt_fail(err, ZT_ESTATE, "run %s is at step %" PRId64 ", not %" PRId64 ": its fp32 masters of step %" PRId64
                     " are gone (resume the run from step %" PRId64 ")", run_id, s, step, step, s);
    if (rc == 0 && core->opt.store == ZT_SERVER_STORE_NVME && !(buf = zt_store_buffer_alloc((size_t)p->n)))
        rc = zt_fail(err, ZT_ENOMEM, "out of memory reading block %d shard %d", block, shard);
    if (rc == 0)
        rc = zt__pair_read(core, p, slot, buf, &data, err);
    if (rc == 0 && n > 0)
        memcpy(out, data + offset, (size_t)n * sizeof(float));
    zt_store_buffer_free(buf);
    pthread_mutex_lock(&run->mu);
    if (rc == 0)
        run->stats.bytes_pulled += n * sizeof(float);
    zt__run_unacquire(run);
    pthread_mutex_unlock(&run->mu);
    zt__run_release(core, run);
    return rc;
}

/* ---- statistics ---- */

static void run_stats_locked(const zt__run *run, zt_server_run_stats *out)
{
    *out = run->stats;
    out->step = run->step;
    out->adam_step = run->adam_step;
}

static void copy_stats(const zt__run *run, void *out)
{
    run_stats_locked(run, out);
}

/* Copies one run's counters; see core.h. */
int zt_server_core_stats(zt_server_core *core, const char *run_id, zt_server_run_stats *out, zt_err *err)
{
    return copy_from_run(core, run_id, copy_stats, out, err);
}

/* Copies every run's counters; see core.h. */
int zt_server_core_list_stats(zt_server_core *core, zt_server_run_stats *out, int cap, int *nruns)
{
    pthread_mutex_lock(&core->mu);
    int n = core->nruns;
    for (int i = 0; i < n && i < cap; i++) {
        zt__run *run = core->runs[i];
        pthread_mutex_lock(&run->mu);
        run_stats_locked(run, &out[i]);
        pthread_mutex_unlock(&run->mu);
    }
    pthread_mutex_unlock(&core->mu);
    if (nruns)
        *nruns = n;
    return 0;
}

/* Appends printf-style text to buf at *len, counting what did not fit. */
static void __attribute__((format(printf, 4, 5))) append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = *len < cap ? cap - *len : 0;
    int k = vsnprintf(room ? buf + *len : NULL, room, fmt, ap);
    va_end(ap);
    if (k > 0)
        *len += (size_t)k;
}

/* Writes the Prometheus text of every run; see core.h. */
size_t zt_server_core_metrics_text(zt_server_core *core, char *buf, size_t cap)
{
    if (cap > 0)
        buf[0] = '\0';
    int n = 0;
    zt_server_core_list_stats(core, NULL, 0, &n);
    zt_server_run_stats *st = n > 0 ? zt_xcalloc((size_t)n, sizeof(*st)) : NULL;
    int got = 0;
    if (n > 0)
        zt_server_core_list_stats(core, st, n, &got);
    if (got > n)
        got = n;
    pthread_mutex_lock(&core->mu);
    uint64_t ram = core->ram_bytes, limit = core->opt.mem_limit;
    size_t store_used = zt_store_used_bytes(core->store);
    pthread_mutex_unlock(&core->mu);

    size_t len = 0;
    static const struct {
        const char *name, *type, *help;
    } m[] = {
        {"ztrain_server_step", "gauge", "Steps committed by the run."},
        {"ztrain_server_adam_step", "gauge", "AdamW updates applied (steps minus skipped ones)."},
        {"ztrain_server_commits_total", "counter", "Commits applied, skipped ones included."},
        {"ztrain_server_skipped_steps_total", "counter", "Steps skipped for an overflow."},
        {"ztrain_server_pushed_bytes_total", "counter", "Gradient and parameter bytes received."},
        {"ztrain_server_pulled_bytes_total", "counter", "Parameter bytes sent."},
        {"ztrain_server_last_commit_seconds", "gauge", "Duration of the last commit."},
        {"ztrain_server_commit_seconds_total", "counter", "Time spent in commits."},
        {"ztrain_server_store_bytes", "gauge", "Bytes of master weights and Adam moments in the store (both slots)."},
        {"ztrain_server_ram_bytes", "gauge", "Bytes of RAM the run holds on this server."},
        {"ztrain_server_delivered_bytes_total", "counter", "Parameter bytes commits wrote straight into the "
         "memory of standing pulls (counted in the pulled bytes too)."},
    };
    for (size_t k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
        append(buf, cap, &len, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
        for (int i = 0; i < got; i++) {
            const zt_server_run_stats *s = &st[i];
            append(buf, cap, &len, "%s{run=\"%s\"} ", m[k].name, s->run_id); /* run ids need no escaping */
            switch (k) {
            case 0: append(buf, cap, &len, "%" PRId64 "\n", s->step); break;
            case 1: append(buf, cap, &len, "%" PRId64 "\n", s->adam_step); break;
            case 2: append(buf, cap, &len, "%" PRId64 "\n", s->commits); break;
            case 3: append(buf, cap, &len, "%" PRId64 "\n", s->skipped_steps); break;
            case 4: append(buf, cap, &len, "%" PRIu64 "\n", s->bytes_pushed); break;
            case 5: append(buf, cap, &len, "%" PRIu64 "\n", s->bytes_pulled); break;
            case 6: append(buf, cap, &len, "%.9g\n", s->last_commit_s); break;
            case 7: append(buf, cap, &len, "%.9g\n", s->total_commit_s); break;
            case 8: append(buf, cap, &len, "%" PRIu64 "\n", s->store_bytes); break;
            case 9: append(buf, cap, &len, "%" PRIu64 "\n", s->ram_bytes); break;
            default: append(buf, cap, &len, "%" PRIu64 "\n", s->bytes_delivered); break;
            }
        }
    }
    append(buf, cap, &len, "# HELP ztrain_server_runs Runs registered on this server.\n# TYPE ztrain_server_runs "
           "gauge\nztrain_server_runs %d\n", got);
    append(buf, cap, &len, "# HELP ztrain_server_ram_bytes_total RAM held for all runs.\n# TYPE "
           "ztrain_server_ram_bytes_total gauge\nztrain_server_ram_bytes_total %" PRIu64 "\n", ram);
    append(buf, cap, &len, "# HELP ztrain_server_mem_limit_bytes The --mem-limit (0: none).\n# TYPE "
           "ztrain_server_mem_limit_bytes gauge\nztrain_server_mem_limit_bytes %" PRIu64 "\n", limit);
    append(buf, cap, &len, "# HELP ztrain_server_store_used_bytes Payload bytes in the store.\n# TYPE "
           "ztrain_server_store_used_bytes gauge\nztrain_server_store_used_bytes %zu\n", store_used);
    free(st);
    return len;
}
