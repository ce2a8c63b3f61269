/* Optimizer placement "server" for the single-process trainer: push, commit, pull through the state
 * client, and the conversion of a checkpoint into an embedded core's snapshot (see placement.h). */
#include "worker/train/placement.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/crc32c.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "worker/state/client.h"

#define RUN_PATH_MAX 4096

struct zt_placement_server {
    zt_state_client_t *client;
    bool remote;
    char run_id[ZT_SERVER_RUN_ID_MAX];
    int nblocks;
    size_t *offset;   /* first element of each block in the parameter slab */
    size_t *numel;    /* elements of each block */
    char *token;      /* bearer token read from token_file, or NULL */
    int64_t stale_step; /* zt_placement_server_stale_step: the older step a server reported, or -1 */
};

/* The run id: the run directory's last component, restricted to the characters run ids allow; see
 * placement.h. */
void zt_placement_run_id(const char *out_dir, char *id, size_t cap)
{
    char dir[ZT_TRAIN_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", out_dir);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = '\0';
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        base = "train";
    snprintf(id, cap, "%s", base);
    for (char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            *p = '_';
}

/* Reads the bearer token: the file's first line without surrounding white space. */
static int read_token(const char *path, char **out, zt_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc < 0)
        return zt_fail(err, rc, "--token-file: %s", err ? err->msg : "cannot read it");
    char *s = text;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strcspn(s, "\r\n");
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n == 0) {
        free(text);
        return zt_fail(err, ZT_EINVAL_CONFIG, "--token-file %s is empty: write the servers' token in it", path);
    }
    memmove(text, s, n);
    text[n] = '\0';
    *out = text;
    return 0;
}

/* Whether files in dir can be opened with O_DIRECT (tmpfs cannot); creates dir if needed. */
static bool dir_supports_direct(const char *dir)
{
    char probe[RUN_PATH_MAX];
    mkdir(dir, 0755);
    snprintf(probe, sizeof(probe), "%s/.ztrain_direct_probe", dir);
    int fd = open(probe, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) {
        fd = open(probe, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            close(fd);
            unlink(probe);
            return false;
        }
        return true; /* another problem: let the store report it */
    }
    close(fd);
    unlink(probe);
    return true;
}

/* The run's layout: one block per model block, W = 1, weight decay on the tensors that have it. */
static void fill_desc(const zt_placement_server *ps, const zt_gpt2 *model, const zt_optimizer *opt,
                      zt_server_run_desc *desc, zt_server_block_desc *blocks, zt_server_range *ranges)
{
    int nt = zt_gpt2_num_tensors(model), used = 0;
    for (int b = 0; b < ps->nblocks; b++) {
        blocks[b].numel = ps->numel[b];
        blocks[b].decay = ranges + used;
        blocks[b].ndecay = 0;
        for (int i = 0; i < nt; i++) {
            const zt_param_info *t = zt_gpt2_tensor(model, i);
            if (t->block != b || !t->weight_decay)
                continue;
            uint64_t begin = t->offset - ps->offset[b], end = begin + t->numel;
            zt_server_range *last = blocks[b].ndecay ? &ranges[used - 1] : NULL;
            if (last && last->end == begin) { /* adjacent tensors: one range */
                last->end = end;
                continue;
            }
            ranges[used++] = (zt_server_range){begin, end};
            blocks[b].ndecay++;
        }
    }
    memset(desc, 0, sizeof(*desc));
    desc->run_id = ps->run_id;
    desc->world_size = 1;
    desc->nblocks = ps->nblocks;
    desc->blocks = blocks;
    desc->beta1 = opt->beta1;
    desc->beta2 = opt->beta2;
    desc->eps = opt->eps;
    desc->weight_decay = opt->weight_decay;
    desc->param_dtype = ZT_DTYPE_F32;
}

static cJSON *raw_number(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static cJSON *raw_number(const char *fmt, ...)
{
    char buf[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    cJSON *n = cJSON_CreateRaw(buf);
    ZT_ASSERT(n);
    return n;
}

/* out = dir/name; a path too long is an error. */
static int join(char *out, size_t cap, const char *dir, const char *name, zt_err *err)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return zt_fail(err, ZT_EINVAL_CONFIG, "path %s/%s is too long", dir, name);
    return 0;
}

/* The size and CRC-32C of a file, as the snapshot manifest lists them. */
static int file_crc(const char *path, uint64_t *bytes, uint32_t *crc, zt_err *err)
{
    char *data = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &data, &len, err);
    if (rc < 0)
        return rc;
    *bytes = len;
    *crc = zt_crc32c(0, data, len);
    free(data);
    return 0;
}

/* Writes a checkpoint's master weights and moments as a snapshot of server 0 of 1 (docs/state-server.md,
 * "Converting to and from CPU-trainer checkpoints") into dir, for the embedded core to read. */
static int write_snapshot(const zt_placement_server *ps, const zt_server_run_desc *desc, const float *params,
                          const zt_optimizer *opt, int64_t step, const char *dir, zt_err *err)
{
    if (mkdir(dir, 0755) < 0)
        return zt_fail(err, -errno, "cannot create %s: %s", dir, strerror(errno));
    cJSON *root = cJSON_CreateObject();
    cJSON *files = cJSON_CreateObject();
    int rc = 0;
    char path[RUN_PATH_MAX], name[64], num[32];
    snprintf(num, sizeof(num), "%" PRId64, step);
    for (int b = 0; b < ps->nblocks && rc == 0; b++) {
        zt_st_writer *w = zt_st_writer_create();
        int64_t shape[1] = {(int64_t)ps->numel[b]};
        const float *src[3] = {params + ps->offset[b], opt->m + ps->offset[b], opt->v + ps->offset[b]};
        static const char *const kind[3] = {"master", "m", "v"};
        for (int k = 0; k < 3 && rc == 0; k++) {
            snprintf(name, sizeof(name), "%s.%d.0", kind[k], b);
            rc = zt_st_writer_add(w, name, ZT_DTYPE_F32, 1, shape, src[k], err);
        }
        if (rc == 0)
            rc = zt_st_writer_add_metadata(w, "format", "ztrain-server-snapshot", err);
        if (rc == 0)
            rc = zt_st_writer_add_metadata(w, "run_id", ps->run_id, err);
        if (rc == 0)
            rc = zt_st_writer_add_metadata(w, "step", num, err);
        snprintf(name, sizeof(name), "block_%06d.safetensors", b);
        if (rc == 0)
            rc = join(path, sizeof(path), dir, name, err);
        if (rc == 0)
            rc = zt_st_writer_write(w, path, err);
        zt_st_writer_destroy(w);
        uint64_t bytes = 0;
        uint32_t crc = 0;
        if (rc == 0)
            rc = file_crc(path, &bytes, &crc, err);
        if (rc == 0) {
            cJSON *f = cJSON_AddObjectToObject(files, name);
            cJSON_AddItemToObject(f, "bytes", raw_number("%" PRIu64, bytes));
            char hex[16];
            snprintf(hex, sizeof(hex), "%08" PRIx32, crc);
            cJSON_AddStringToObject(f, "crc32c", hex);
        }
    }
    cJSON_AddStringToObject(root, "format", "ztrain-server-snapshot");
    cJSON_AddItemToObject(root, "version", raw_number("1"));
    cJSON_AddStringToObject(root, "run_id", ps->run_id);
    cJSON_AddItemToObject(root, "step", raw_number("%" PRId64, step));
    cJSON_AddItemToObject(root, "adam_step", raw_number("%" PRId64, opt->adam_step));
    cJSON_AddItemToObject(root, "world_size", raw_number("1"));
    cJSON_AddItemToObject(root, "server_index", raw_number("0"));
    cJSON_AddItemToObject(root, "server_count", raw_number("1"));
    cJSON_AddStringToObject(root, "param_dtype", zt_dtype_name(ZT_DTYPE_F32));
    cJSON *adam = cJSON_AddObjectToObject(root, "adamw");
    cJSON_AddItemToObject(adam, "beta1", raw_number("%.9g", (double)desc->beta1));
    cJSON_AddItemToObject(adam, "beta2", raw_number("%.9g", (double)desc->beta2));
    cJSON_AddItemToObject(adam, "eps", raw_number("%.9g", (double)desc->eps));
    cJSON_AddItemToObject(adam, "weight_decay", raw_number("%.9g", (double)desc->weight_decay));
    cJSON *blocks = cJSON_AddArrayToObject(root, "blocks");
    cJSON *shards = cJSON_AddArrayToObject(root, "shards");
    for (int b = 0; b < ps->nblocks; b++) {
        cJSON *bo = cJSON_CreateObject();
        cJSON_AddItemToObject(bo, "numel", raw_number("%" PRIu64, (uint64_t)ps->numel[b]));
        cJSON *dec = cJSON_AddArrayToObject(bo, "decay");
        for (int i = 0; i < desc->blocks[b].ndecay; i++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, raw_number("%" PRIu64, desc->blocks[b].decay[i].begin));
            cJSON_AddItemToArray(pair, raw_number("%" PRIu64, desc->blocks[b].decay[i].end));
            cJSON_AddItemToArray(dec, pair);
        }
        cJSON_AddItemToArray(blocks, bo);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, raw_number("%d", b));
        cJSON_AddItemToArray(pair, raw_number("0"));
        cJSON_AddItemToArray(shards, pair);
    }
    cJSON_AddItemToObject(root, "files", files);
    if (rc == 0) {
        char *text = cJSON_Print(root);
        ZT_ASSERT(text);
        rc = join(path, sizeof(path), dir, "manifest.json", err);
        if (rc == 0)
            rc = zt_write_file_atomic(path, text, strlen(text), err);
        free(text);
    }
    cJSON_Delete(root);
    return rc;
}

/* Hands a checkpoint's state to the embedded core through a snapshot in a temporary directory. */
static int load_checkpoint_state(zt_placement_server *ps, const zt_server_run_desc *desc, const zt_gpt2 *model,
                                 const zt_optimizer *opt, int64_t step, const char *out_dir, zt_err *err)
{
    char dir[RUN_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/.state_import_%ld", out_dir, (long)getpid());
    zt_remove_flat_dir(dir);
    int rc = write_snapshot(ps, desc, zt_gpt2_params((zt_gpt2 *)model), opt, step, dir, err);
    zt_server_run_info info;
    if (rc == 0)
        rc = zt_server_core_snapshot_read(zt_state_client_embedded_core(ps->client), dir, &info, err);
    zt_remove_flat_dir(dir);
    if (rc == 0 && info.step != step)
        rc = zt_fail(err, ZT_ESTATE, "the embedded state server holds step %lld after loading step %lld",
                     (long long)info.step, (long long)step);
    return rc;
}

/* Pulls every block's fp32 parameters after `step` into the model's slab, block 0 first. */
static int pull_all(zt_placement_server *ps, zt_gpt2 *model, int64_t step, zt_err *err)
{
    float *params = zt_gpt2_params(model);
    for (int b = 0; b < ps->nblocks; b++) {
        int rc = zt_state_client_pull(ps->client, ps->run_id, step, b, 0, 0, ps->numel[b], params + ps->offset[b],
                                      err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Creates the state client of cfg; see placement.h. */
int zt_placement_client_create(const zt_train_config *cfg, zt_state_client_t **out, char **token, zt_err *err)
{
    *out = NULL;
    *token = NULL;
    int rc = 0;
    if (cfg->token_file[0] && (rc = read_token(cfg->token_file, token, err)) < 0)
        return rc;
    const bool remote = cfg->servers[0] != '\0';
    struct zt_state_client_options copt;
    memset(&copt, 0, sizeof(copt));
    copt.servers = remote ? cfg->servers : NULL;
    copt.token = *token;
    copt.tls_ca_file = cfg->tls_ca[0] ? cfg->tls_ca : NULL;
    copt.tls_cert_file = cfg->tls_cert[0] ? cfg->tls_cert : NULL;
    copt.tls_key_file = cfg->tls_key[0] ? cfg->tls_key : NULL;
    copt.embedded.threads = (int)cfg->threads;
    if (!remote && strncmp(cfg->state_store, "nvme:", 5) == 0) {
        copt.embedded.store = ZT_SERVER_STORE_NVME;
        copt.embedded.store_path = cfg->state_store + 5;
        copt.embedded.store_no_direct = !dir_supports_direct(cfg->state_store + 5);
        if (copt.embedded.store_no_direct)
            zt_log(ZT_LOG_WARN, "state store %s: the file system has no O_DIRECT (tmpfs?); using buffered I/O",
                   cfg->state_store + 5);
    }
    rc = zt_state_client_create(&copt, out, err);
    if (rc < 0) {
        free(*token);
        *token = NULL;
    }
    return rc;
}

/* Connects and registers; see placement.h. */
int zt_placement_server_open(zt_placement_server **out, const zt_train_config *cfg, zt_gpt2 *model,
                             const zt_optimizer *opt, int64_t step, zt_err *err)
{
    *out = NULL;
    zt_placement_server *ps = zt_xcalloc(1, sizeof(*ps));
    ps->remote = cfg->servers[0] != '\0';
    zt_placement_run_id(cfg->out_dir, ps->run_id, sizeof(ps->run_id));
    ps->nblocks = zt_gpt2_num_blocks(model);
    ps->offset = zt_xcalloc((size_t)ps->nblocks, sizeof(size_t));
    ps->numel = zt_xcalloc((size_t)ps->nblocks, sizeof(size_t));
    for (int b = 0; b < ps->nblocks; b++) {
        ps->offset[b] = zt_gpt2_block(model, b)->offset;
        ps->numel[b] = zt_gpt2_block(model, b)->numel;
    }
    ps->stale_step = -1;
    int rc = zt_placement_client_create(cfg, &ps->client, &ps->token, err);
    if (rc < 0)
        goto fail;
    zt__placement_test_watch_pushes(ps->client);

    int nt = zt_gpt2_num_tensors(model);
    zt_server_block_desc *blocks = zt_xcalloc((size_t)ps->nblocks, sizeof(*blocks));
    zt_server_range *ranges = zt_xcalloc((size_t)nt + 1, sizeof(*ranges));
    zt_server_run_desc desc;
    fill_desc(ps, model, opt, &desc, blocks, ranges);
    int64_t server_step = 0;
    rc = zt_state_client_register(ps->client, &desc, &server_step, err);
    if (rc == 0 && step == 0 && server_step == 0) {
        const float *params = zt_gpt2_params(model);
        for (int b = 0; b < ps->nblocks && rc == 0; b++)
            rc = zt_state_client_push_params(ps->client, ps->run_id, b, 0, params + ps->offset[b], ps->numel[b], err);
    } else if (rc == 0 && step == 0) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "the state servers already hold run '%s' at step %lld: continue it "
                     "with --resume, or start a new run in a run directory of another name (--out)", ps->run_id,
                     (long long)server_step);
    } else if (rc == 0 && !ps->remote) {
        rc = load_checkpoint_state(ps, &desc, model, opt, step, cfg->out_dir, err);
    } else if (rc == 0 && server_step != step) {
        rc = zt_fail(err, ZT_ESTATE, "the state servers hold run '%s' at step %lld, the checkpoint is at step %lld: "
                     "restart the servers with --snapshot-dir holding the run's snapshot of step %lld, or resume "
                     "from the checkpoint of step %lld", ps->run_id, (long long)server_step, (long long)step,
                     (long long)step, (long long)server_step);
    } else if (rc == 0) {
        rc = pull_all(ps, model, step, err);
    }
    free(blocks);
    free(ranges);
    if (rc < 0)
        goto fail;
    zt_log(ZT_LOG_INFO, "optimizer: AdamW on %s, run '%s' at step %lld",
           ps->remote ? cfg->servers : strncmp(cfg->state_store, "nvme:", 5) == 0 ? "the embedded state server (NVMe)"
                                                                                  : "the embedded state server (RAM)",
           ps->run_id, (long long)step);
    *out = ps;
    return 0;
fail:
    zt_placement_server_close(ps);
    return rc;
}

/* Frees everything; see placement.h. */
void zt_placement_server_close(zt_placement_server *ps)
{
    if (!ps)
        return;
    zt_state_client_destroy(ps->client);
    free(ps->offset);
    free(ps->numel);
    free(ps->token);
    free(ps);
}

/* A step through the servers; see placement.h. */
int zt_placement_server_step(zt_placement_server *ps, zt_gpt2 *model, zt_optimizer *opt, int64_t step,
                             float loss, float lr, zt_optimizer_report *report, zt_err *err)
{
    const float *grads = zt_gpt2_grads(model);
    double norm = zt_optimizer_grad_norm(grads, opt->n);
    int rc = zt_optimizer_account(opt, loss, norm, false, report, err);
    if (rc < 0)
        return rc;
    zt_server_commit_args args = {
        .step = step,
        .grad_norm = norm,
        .clip_coef = report->clip_coef,
        .lr = lr,
        .overflow = report->skipped,
    };
    /* A failed push or commit is tried once more, whole: a server that restarted from the snapshot of the
     * previous step lost the pushes it had received, and pushes overwrite, so pushing every block again
     * and committing again completes the step. A server at an older step cannot: its step is kept
     * (zt_placement_server_stale_step) and the run continues from the checkpoint of that step. */
    ps->stale_step = -1;
    for (int attempt = 0;; attempt++) {
        rc = 0;
        for (int b = 0; b < ps->nblocks && rc == 0 && !report->skipped; b++)
            rc = zt_state_client_push_grad(ps->client, ps->run_id, step, b, 0, ZT_DTYPE_F32, grads + ps->offset[b],
                                           ps->numel[b], err);
        if (rc == 0)
            rc = zt_state_client_commit(ps->client, ps->run_id, &args, err);
        if (rc == 0)
            break;
        if (rc == ZT_ESTATE && zt_state_client_server_step(ps->client) >= 0) {
            ps->stale_step = zt_state_client_server_step(ps->client);
            return zt_fail(err, ZT_ESTATE, "a state server of run '%s' is at step %lld, this worker at step %lld (it "
                           "restarted from an older snapshot): resume from the checkpoint of step %lld with --resume",
                           ps->run_id, (long long)ps->stale_step, (long long)step, (long long)ps->stale_step);
        }
        if (attempt > 0)
            return rc;
        zt_log(ZT_LOG_WARN, "step %lld: the state servers did not take the step (%s); pushing the gradients again "
               "and committing once more", (long long)step, err ? err->msg : "");
    }
    return pull_all(ps, model, step, err); /* the loop ends here with rc == 0 */
}

/* Fills the moments for a checkpoint and snapshots the servers; see placement.h. */
int zt_placement_server_checkpoint(zt_placement_server *ps, zt_optimizer *opt, int64_t step, zt_err *err)
{
    if (ps->remote)
        return zt_state_client_save_snapshot(ps->client, ps->run_id, NULL, err);
    zt_server_core *core = zt_state_client_embedded_core(ps->client);
    for (int b = 0; b < ps->nblocks; b++) {
        int64_t at = -1;
        int rc = zt_server_core_read_state(core, ps->run_id, b, 0, ZT_SERVER_ADAM_M, opt->m + ps->offset[b], &at, err);
        if (rc == 0)
            rc = zt_server_core_read_state(core, ps->run_id, b, 0, ZT_SERVER_ADAM_V, opt->v + ps->offset[b], &at, err);
        if (rc < 0)
            return rc;
        if (at != step)
            return zt_fail(err, ZT_ESTATE, "the embedded state server is at step %lld, the trainer at %lld",
                           (long long)at, (long long)step);
    }
    return 0;
}

/* The older step a server reported in the last failed step; see placement.h. */
int64_t zt_placement_server_stale_step(const zt_placement_server *ps)
{
    return ps ? ps->stale_step : -1;
}

/* Test hook state: how many pauses happened in this process (ZT_TEST_PAUSE_TIMES allows more than one). */
static int test_pauses;

/* Pauses at `where` when the environment asks for it; see placement.h. */
void zt__placement_test_pause(const char *where)
{
    const char *want = getenv("ZT_TEST_PAUSE"), *fifo = getenv("ZT_TEST_PAUSE_FIFO");
    const char *times = getenv("ZT_TEST_PAUSE_TIMES");
    int allowed = times ? atoi(times) : 1;
    if (!want || !fifo || strcmp(want, where) != 0 || test_pauses >= allowed)
        return;
    test_pauses++;
    zt_log(ZT_LOG_WARN, "test pause: %s (waiting for a line on %s)", where, fifo);
    FILE *f = fopen(fifo, "r");
    if (f) {
        char line[64];
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
    }
    zt_log(ZT_LOG_WARN, "test pause: %s: going on", where);
}

/* The chunk hook behind zt__placement_test_watch_pushes: "push:N" after the first chunk of block 1. */
static void test_chunk_hook(void *user, int64_t step, int block, int shard, uint64_t bytes_sent)
{
    (void)user;
    (void)shard;
    (void)bytes_sent;
    char where[48];
    snprintf(where, sizeof where, "push:%lld", (long long)step);
    if (block == 1)
        zt__placement_test_pause(where);
}

/* Installs the push pause hook on a client when the environment asks for pauses; see placement.h. */
void zt__placement_test_watch_pushes(zt_state_client_t *client)
{
    if (client && getenv("ZT_TEST_PAUSE"))
        zt__state_client_set_chunk_hook(client, test_chunk_hook, NULL);
}

/* Whether the servers are remote; see placement.h. */
bool zt_placement_server_is_remote(const zt_placement_server *ps)
{
    return ps->remote;
}
