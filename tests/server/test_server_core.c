/* Tests of the state server core (server/core.h) on the CPU: the step protocol against
 * zt_cpu_adamw_update applied to the same data (bit-identical with fp32 gradients), idempotent and
 * incomplete pushes, stale and future steps, overflow skips, an injected store failure in the middle of a
 * commit, snapshots and their corruption checks, the RAM and NVMe stores, the owner mapping, and two
 * servers sharing one run. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/rng.h"
#include "common/status.h"
#include "kernels/adamw.h"
#include "offload/cpu_adam.h"
#include "server/core.h"

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/zt_test_server_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- a small layout and its reference optimizer ---- */

#define NB 3
#define W 2
static const uint64_t k_numel[NB] = {1000, 37, 513};
static const zt_server_range k_decay0[] = {{0, 800}};
static const zt_server_range k_decay2[] = {{100, 300}, {400, 513}};
static const char *k_run = "test-run";

static zt_server_run_desc make_desc(const char *run, enum zt_dtype dtype, zt_server_block_desc *blocks)
{
    blocks[0] = (zt_server_block_desc){.numel = k_numel[0], .decay = k_decay0, .ndecay = 1};
    blocks[1] = (zt_server_block_desc){.numel = k_numel[1], .decay = NULL, .ndecay = 0};
    blocks[2] = (zt_server_block_desc){.numel = k_numel[2], .decay = k_decay2, .ndecay = 2};
    return (zt_server_run_desc){.run_id = run, .world_size = W, .nblocks = NB, .blocks = blocks, .beta1 = 0.9f,
                                .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .param_dtype = dtype};
}

/* The CPU trainer's view: whole blocks of params, m, v, and this step's gradients. */
typedef struct ref {
    float *p[NB], *m[NB], *v[NB], *g[NB];
    int64_t adam_step;
} ref;

static void ref_init(ref *r, uint64_t seed)
{
    zt_rng rng;
    zt_rng_seed(&rng, seed);
    memset(r, 0, sizeof(*r));
    for (int b = 0; b < NB; b++) {
        r->p[b] = calloc(k_numel[b], 4);
        r->m[b] = calloc(k_numel[b], 4);
        r->v[b] = calloc(k_numel[b], 4);
        r->g[b] = calloc(k_numel[b], 4);
        for (uint64_t i = 0; i < k_numel[b]; i++)
            r->p[b][i] = (float)(0.02 * zt_rng_normal(&rng));
    }
}

static void ref_free(ref *r)
{
    for (int b = 0; b < NB; b++) {
        free(r->p[b]);
        free(r->m[b]);
        free(r->v[b]);
        free(r->g[b]);
    }
}

static void ref_make_grads(ref *r, uint64_t seed)
{
    zt_rng rng;
    zt_rng_seed(&rng, seed);
    for (int b = 0; b < NB; b++)
        for (uint64_t i = 0; i < k_numel[b]; i++)
            r->g[b][i] = (float)(0.1 * zt_rng_normal(&rng));
}

/* One AdamW step with per-range weight decay, exactly as the CPU trainer applies it per tensor. */
static void ref_step(ref *r, float lr, float clip)
{
    r->adam_step++;
    zt_server_block_desc blocks[NB];
    zt_server_run_desc d = make_desc(k_run, ZT_DTYPE_F32, blocks);
    for (int b = 0; b < NB; b++) {
        uint64_t i = 0;
        int di = 0;
        while (i < k_numel[b]) {
            bool decay = di < blocks[b].ndecay && blocks[b].decay[di].begin <= i;
            uint64_t stop = decay ? blocks[b].decay[di].end
                                  : (di < blocks[b].ndecay ? blocks[b].decay[di].begin : k_numel[b]);
            zt_adamw_params hp = {.lr = lr, .beta1 = d.beta1, .beta2 = d.beta2, .eps = d.eps,
                                  .weight_decay = decay ? d.weight_decay : 0.0f, .grad_scale = clip,
                                  .step = (int)r->adam_step};
            zt_cpu_adamw_update(r->p[b] + i, r->m[b] + i, r->v[b] + i, r->g[b] + i, stop - i, &hp);
            if (decay)
                di++;
            i = stop;
        }
    }
}

/* ---- driving servers ---- */

typedef struct cluster {
    zt_server_core *core[2];
    int S;
} cluster;

static void cluster_create(cluster *c, int S, enum zt_server_store_kind kind)
{
    memset(c, 0, sizeof(*c));
    c->S = S;
    for (int s = 0; s < S; s++) {
        zt_server_core_options o = {0};
        o.store = kind;
        o.server_index = s;
        o.server_count = S;
        o.threads = 2;
        char path[300];
        zt_err err = {0};
        if (kind == ZT_SERVER_STORE_NVME) {
            snprintf(path, sizeof(path), "%s/store%d", g_dir, s);
            mkdir(path, 0755);
            o.store_path = path;
        }
        int rc = zt_server_core_create(&c->core[s], &o, &err);
        if (rc == ZT_EUNSUPPORTED && kind == ZT_SERVER_STORE_NVME) {
            /* A file system without O_DIRECT (tmpfs): the store's buffered test mode. */
            o.store_no_direct = true;
            rc = zt_server_core_create(&c->core[s], &o, &err);
        }
        if (rc != 0)
            fail_msg("create: %s", err.msg);
    }
}

static void cluster_destroy(cluster *c)
{
    for (int s = 0; s < c->S; s++)
        zt_server_core_destroy(c->core[s]);
}

static zt_server_core *owner_of(cluster *c, int b, int r)
{
    return c->core[zt_server_owner(k_run, b, r, W, c->S)];
}

static void must(int rc, const zt_err *err)
{
    if (rc != 0)
        fail_msg("unexpected error %d: %s", rc, err->msg);
}

static void cluster_register(cluster *c, enum zt_dtype dtype)
{
    zt_server_block_desc blocks[NB];
    zt_server_run_desc d = make_desc(k_run, dtype, blocks);
    for (int s = 0; s < c->S; s++) {
        zt_err err = {0};
        zt_server_run_info info;
        must(zt_server_core_register(c->core[s], &d, &info, &err), &err);
        assert_int_equal(info.step, 0);
        assert_false(info.params_ready);
    }
}

/* The shard r of block b of a whole-block array, zero padded. */
static float *shard_of(const float *block, int b, int r)
{
    uint64_t n = zt_server_shard_numel(k_numel[b], W);
    float *s = calloc(n, 4);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t e = (uint64_t)r * n + i;
        if (e < k_numel[b])
            s[i] = block[e];
    }
    return s;
}

/* Pushes whole-block data (params or gradients) shard by shard in uneven chunks, some twice. */
static void push_all(cluster *c, const ref *r, bool params, int64_t step, uint64_t seed)
{
    zt_rng rng;
    zt_rng_seed(&rng, seed);
    for (int b = 0; b < NB; b++) {
        uint64_t n = zt_server_shard_numel(k_numel[b], W);
        for (int sh = 0; sh < W; sh++) {
            float *data = shard_of(params ? r->p[b] : r->g[b], b, sh);
            uint64_t off = 0;
            while (off < n) {
                uint64_t len = 1 + zt_rng_below(&rng, 200);
                if (len > n - off)
                    len = n - off;
                zt_server_chunk ch = {.block = b, .shard = sh, .offset = off, .n = len, .dtype = ZT_DTYPE_F32,
                                      .data = data + off};
                int times = zt_rng_below(&rng, 4) == 0 ? 2 : 1; /* retries overwrite identically */
                for (int t = 0; t < times; t++) {
                    zt_err err = {0};
                    int rc = params ? zt_server_core_push_params(owner_of(c, b, sh), k_run, &ch, &err)
                                    : zt_server_core_push_grad(owner_of(c, b, sh), k_run, step, &ch, &err);
                    must(rc, &err);
                }
                off += len;
            }
            free(data);
        }
    }
}

static void commit_all(cluster *c, int64_t step, float lr, float clip, bool overflow)
{
    zt_server_commit_args a = {.step = step, .grad_norm = 1.0, .clip_coef = clip, .lr = lr, .overflow = overflow};
    for (int s = 0; s < c->S; s++) {
        zt_err err = {0};
        zt_server_commit_result res;
        must(zt_server_core_commit(c->core[s], k_run, &a, &res, &err), &err);
        assert_int_equal(res.step, step);
        assert_int_equal(res.skipped, overflow);
        assert_false(res.already_committed);
    }
}

/* Checks every shard's master, m, v (bit for bit) and the pulled parameters against the reference. */
static void check_state(cluster *c, const ref *r, int64_t step, enum zt_dtype dtype)
{
    for (int b = 0; b < NB; b++) {
        uint64_t n = zt_server_shard_numel(k_numel[b], W);
        float *got = malloc(n * 4);
        void *pulled = malloc(n * 4);
        void *want_lowp = malloc(n * 4);
        for (int sh = 0; sh < W; sh++) {
            const float *want[3] = {r->p[b], r->m[b], r->v[b]};
            for (int k = 0; k < 3; k++) {
                zt_err err = {0};
                int64_t st = -1;
                must(zt_server_core_read_state(owner_of(c, b, sh), k_run, b, sh, (enum zt_server_state_tensor)k, got,
                                               &st, &err), &err);
                assert_int_equal(st, step);
                float *exp = shard_of(want[k], b, sh);
                if (memcmp(got, exp, n * 4) != 0) {
                    for (uint64_t i = 0; i < n; i++)
                        if (memcmp(&got[i], &exp[i], 4) != 0)
                            fail_msg("step %lld block %d shard %d tensor %d element %llu: got %.9g want %.9g",
                                     (long long)step, b, sh, k, (unsigned long long)i, (double)got[i], (double)exp[i]);
                }
                if (k == 0) {
                    zt_err e2 = {0};
                    must(zt_cpu_adam_convert(want_lowp, dtype, exp, n, 1, &e2), &e2);
                }
                free(exp);
            }
            zt_err err = {0};
            must(zt_server_core_pull(owner_of(c, b, sh), k_run, step, b, sh, 0, n, pulled, 0, &err), &err);
            assert_memory_equal(pulled, want_lowp, n * zt_dtype_size(dtype));
        }
        free(got);
        free(pulled);
        free(want_lowp);
    }
}

/* Registers, pushes initial params, then runs `steps` steps with one overflow among them. */
static void run_steps(cluster *c, ref *r, int steps, enum zt_dtype dtype)
{
    cluster_register(c, dtype);
    push_all(c, r, true, 0, 7);
    check_state(c, r, 0, dtype);
    for (int s = 1; s <= steps; s++) {
        ref_make_grads(r, 100 + (uint64_t)s);
        push_all(c, r, false, s, 200 + (uint64_t)s);
        bool overflow = s == 2;
        float lr = 1e-3f * (float)s, clip = s == 3 ? 0.5f : 1.0f;
        commit_all(c, s, lr, clip, overflow);
        if (!overflow)
            ref_step(r, lr, clip);
        check_state(c, r, s, dtype);
    }
}

/* ---- tests ---- */

static void test_round_trip_ram_f32(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 1);
    run_steps(&c, &r, 4, ZT_DTYPE_F32);
    zt_server_run_info info;
    zt_err err = {0};
    must(zt_server_core_run_info(c.core[0], k_run, &info, &err), &err);
    assert_int_equal(info.step, 4);
    assert_int_equal(info.adam_step, 3); /* step 2 overflowed */
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_round_trip_ram_bf16(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 2);
    run_steps(&c, &r, 3, ZT_DTYPE_BF16);
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_round_trip_nvme(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_NVME);
    ref_init(&r, 3);
    run_steps(&c, &r, 4, ZT_DTYPE_F16);
    ref_free(&r);
    cluster_destroy(&c);
}

/* A torn state file of a killed process does not stop the NVMe store from opening. */
static void test_nvme_ignores_old_state_files(void **state)
{
    (void)state;
    char dir[300], file[400];
    snprintf(dir, sizeof(dir), "%s/store0", g_dir); /* the directory cluster_create uses */
    mkdir(dir, 0755);
    snprintf(file, sizeof(file), "%s/r12-b0-s0.zts", dir);
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    fputs("torn", f);
    fclose(f);
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_NVME);
    struct stat st;
    assert_int_not_equal(stat(file, &st), 0);
    ref_init(&r, 12);
    run_steps(&c, &r, 1, ZT_DTYPE_F32);
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_two_servers_match_one(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 2, ZT_SERVER_STORE_RAM);
    ref_init(&r, 4);
    run_steps(&c, &r, 4, ZT_DTYPE_F32); /* checks against the same reference as one server */
    /* Each server refuses the pairs of the other, naming the owner. */
    int other = 1 - zt_server_owner(k_run, 0, 0, W, 2);
    float x = 0;
    zt_server_chunk ch = {.block = 0, .shard = 0, .offset = 0, .n = 1, .dtype = ZT_DTYPE_F32, .data = &x};
    zt_err err = {0};
    assert_int_equal(zt_server_core_push_grad(c.core[other], k_run, 5, &ch, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "belongs to server"));
    zt_server_run_info i0, i1;
    must(zt_server_core_run_info(c.core[0], k_run, &i0, &err), &err);
    must(zt_server_core_run_info(c.core[1], k_run, &i1, &err), &err);
    assert_int_equal(i0.owned_shards + i1.owned_shards, NB * W);
    ref_free(&r);
    cluster_destroy(&c);
}

/* Copies the committed state of every shard (for before/after comparisons). */
static float *snapshot_state(cluster *c)
{
    size_t total = 0;
    for (int b = 0; b < NB; b++)
        total += 3 * W * zt_server_shard_numel(k_numel[b], W);
    float *all = malloc(total * 4), *p = all;
    for (int b = 0; b < NB; b++) {
        uint64_t n = zt_server_shard_numel(k_numel[b], W);
        for (int sh = 0; sh < W; sh++)
            for (int k = 0; k < 3; k++, p += n) {
                zt_err err = {0};
                must(zt_server_core_read_state(owner_of(c, b, sh), k_run, b, sh, (enum zt_server_state_tensor)k, p,
                                               NULL, &err), &err);
            }
    }
    return all;
}

static size_t state_bytes(void)
{
    size_t total = 0;
    for (int b = 0; b < NB; b++)
        total += 3 * W * zt_server_shard_numel(k_numel[b], W);
    return total * 4;
}

static void test_incomplete_stale_future(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 5);
    cluster_register(&c, ZT_DTYPE_F32);
    zt_err err = {0};
    zt_server_commit_args a = {.step = 1, .clip_coef = 1.0f, .lr = 1e-3f};
    /* Initial parameters missing. */
    assert_int_equal(zt_server_core_commit(c.core[0], k_run, &a, NULL, &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "initial parameters"));
    push_all(&c, &r, true, 0, 7);
    float *before = snapshot_state(&c);

    /* Everything but the last 10 elements of block 2 shard 1. */
    ref_make_grads(&r, 11);
    uint64_t n2 = zt_server_shard_numel(k_numel[2], W);
    for (int b = 0; b < NB; b++)
        for (int sh = 0; sh < W; sh++) {
            uint64_t n = zt_server_shard_numel(k_numel[b], W);
            float *g = shard_of(r.g[b], b, sh);
            zt_server_chunk ch = {.block = b, .shard = sh, .offset = 0, .n = n, .dtype = ZT_DTYPE_F32, .data = g};
            if (b == 2 && sh == 1)
                ch.n = n - 10;
            must(zt_server_core_push_grad(c.core[0], k_run, 1, &ch, &err), &err);
            free(g);
        }
    assert_int_equal(zt_server_core_commit(c.core[0], k_run, &a, NULL, &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "block 2 shard 1 is incomplete"));
    char want[64];
    snprintf(want, sizeof(want), "element %llu", (unsigned long long)(n2 - 10));
    assert_non_null(strstr(err.msg, want));
    float *after = snapshot_state(&c);
    assert_memory_equal(before, after, state_bytes());
    free(after);
    /* a pull of step 1 after the refusal ends at once with it (instead of waiting 60 s for a commit) */
    float y;
    err.msg[0] = '\0';
    assert_int_equal(zt_server_core_pull(c.core[0], k_run, 1, 0, 0, 0, 1, &y, 60000, &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "block 2 shard 1 is incomplete"));

    /* Stale and future steps. */
    float x = 0;
    zt_server_chunk one = {.block = 0, .shard = 0, .offset = 0, .n = 1, .dtype = ZT_DTYPE_F32, .data = &x};
    assert_int_equal(zt_server_core_push_grad(c.core[0], k_run, 0, &one, &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "already committed"));
    assert_int_equal(zt_server_core_push_grad(c.core[0], k_run, 3, &one, &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "future"));
    zt_server_commit_args fut = a;
    fut.step = 2;
    assert_int_equal(zt_server_core_commit(c.core[0], k_run, &fut, NULL, &err), ZT_ESTATE);
    /* A chunk past the shard, a second dtype, an unknown run. */
    zt_server_chunk bad = one;
    bad.offset = n2;
    bad.block = 2;
    assert_int_equal(zt_server_core_push_grad(c.core[0], k_run, 1, &bad, &err), ZT_EINVAL_CONFIG);
    zt_server_chunk half = one;
    half.dtype = ZT_DTYPE_BF16;
    assert_int_equal(zt_server_core_push_grad(c.core[0], k_run, 1, &half, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_server_core_push_grad(c.core[0], "nope", 1, &one, &err), -ENOENT);

    /* The rest arrives: the commit goes through and matches the reference. */
    float *g = shard_of(r.g[2], 2, 1);
    zt_server_chunk rest = {.block = 2, .shard = 1, .offset = n2 - 10, .n = 10, .dtype = ZT_DTYPE_F32,
                            .data = g + n2 - 10};
    must(zt_server_core_push_grad(c.core[0], k_run, 1, &rest, &err), &err);
    free(g);
    must(zt_server_core_commit(c.core[0], k_run, &a, NULL, &err), &err);
    ref_step(&r, a.lr, a.clip_coef);
    check_state(&c, &r, 1, ZT_DTYPE_F32);
    /* The same commit again is a retry: nothing changes. */
    zt_server_commit_result res;
    must(zt_server_core_commit(c.core[0], k_run, &a, &res, &err), &err);
    assert_true(res.already_committed);
    check_state(&c, &r, 1, ZT_DTYPE_F32);
    /* Initial parameters cannot be pushed after a commit. */
    assert_int_equal(zt_server_core_push_params(c.core[0], k_run, &one, &err), ZT_ESTATE);

    free(before);
    ref_free(&r);
    cluster_destroy(&c);
}

static void atomic_commit(enum zt_server_store_kind kind)
{
    cluster c;
    ref r;
    cluster_create(&c, 1, kind);
    ref_init(&r, 6);
    cluster_register(&c, ZT_DTYPE_F32);
    push_all(&c, &r, true, 0, 7);
    ref_make_grads(&r, 21);
    push_all(&c, &r, false, 1, 22);
    float *before = snapshot_state(&c);

    /* The 4th of the 6 shard writes fails: block 0 is done, block 1 half, block 2 not started. */
    zt__server_core_fail_store_write(c.core[0], 4);
    zt_server_commit_args a = {.step = 1, .clip_coef = 1.0f, .lr = 2e-3f};
    zt_err err = {0};
    assert_int_equal(zt_server_core_commit(c.core[0], k_run, &a, NULL, &err), ZT_EIO);
    assert_non_null(strstr(err.msg, "stays at step 0"));
    zt_server_run_info info;
    must(zt_server_core_run_info(c.core[0], k_run, &info, &err), &err);
    assert_int_equal(info.step, 0);
    assert_int_equal(info.adam_step, 0);
    float *after = snapshot_state(&c);
    assert_memory_equal(before, after, state_bytes());
    free(after);
    check_state(&c, &r, 0, ZT_DTYPE_F32); /* the pulled parameters are still step 0's */
    /* A pull of step 1 that comes after the failure ends at once with it (a worker pulls while it commits, and
     * must not wait out its deadline for a commit that failed), until a commit of the step starts again. */
    float x;
    err.msg[0] = '\0';
    assert_int_equal(zt_server_core_pull(c.core[0], k_run, 1, 0, 0, 0, 1, &x, 60000, &err), ZT_EIO);
    assert_non_null(strstr(err.msg, "commit of step 1 failed"));

    /* The gradients are kept: the retried commit applies the step exactly once. */
    must(zt_server_core_commit(c.core[0], k_run, &a, NULL, &err), &err);
    ref_step(&r, a.lr, a.clip_coef);
    check_state(&c, &r, 1, ZT_DTYPE_F32);
    free(before);
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_atomic_commit_ram(void **state)
{
    (void)state;
    atomic_commit(ZT_SERVER_STORE_RAM);
}

static void test_atomic_commit_nvme(void **state)
{
    (void)state;
    atomic_commit(ZT_SERVER_STORE_NVME);
}

/* A commit on another thread; the main thread waits for block 0 of its step. */
typedef struct commit_job {
    zt_server_core *core;
    zt_server_commit_args a;
    int rc;
    zt_err err;
} commit_job;

static void *commit_thread(void *arg)
{
    commit_job *j = arg;
    j->rc = zt_server_core_commit(j->core, k_run, &j->a, NULL, &j->err);
    return NULL;
}

static void test_pull_waits_for_block(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 8);
    cluster_register(&c, ZT_DTYPE_F32);
    push_all(&c, &r, true, 0, 7);
    ref_make_grads(&r, 31);
    push_all(&c, &r, false, 1, 32);
    commit_job j = {.core = c.core[0], .a = {.step = 1, .clip_coef = 1.0f, .lr = 1e-3f}};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, commit_thread, &j), 0);
    /* Whether the commit has started or not, this returns once block 0 of step 1 is done. */
    zt_err err = {0};
    must(zt_server_core_wait_block(c.core[0], k_run, 1, 0, -1, &err), &err);
    uint64_t n = zt_server_shard_numel(k_numel[0], W);
    float *got = malloc(n * 4);
    must(zt_server_core_pull(c.core[0], k_run, 1, 0, 0, 0, n, got, -1, &err), &err);
    pthread_join(t, NULL);
    must(j.rc, &j.err);
    ref_step(&r, 1e-3f, 1.0f);
    float *want = shard_of(r.p[0], 0, 0);
    assert_memory_equal(got, want, n * 4);
    free(want);
    free(got);
    /* Pulls of a step two ahead are refused; old steps too. */
    float x;
    assert_int_equal(zt_server_core_pull(c.core[0], k_run, 3, 0, 0, 0, 1, &x, 0, &err), ZT_ESTATE);
    assert_int_equal(zt_server_core_pull(c.core[0], k_run, 0, 0, 0, 0, 1, &x, 0, &err), ZT_ESTATE);
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_register_idempotent_and_mismatch(void **state)
{
    (void)state;
    cluster c;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    cluster_register(&c, ZT_DTYPE_F32);
    zt_server_block_desc blocks[NB];
    zt_server_run_desc d = make_desc(k_run, ZT_DTYPE_F32, blocks);
    zt_err err = {0};
    zt_server_run_info info;
    must(zt_server_core_register(c.core[0], &d, &info, &err), &err);
    assert_int_equal(info.world_size, W);
    assert_int_equal(info.nblocks, NB);
    assert_int_equal(info.param_dtype, ZT_DTYPE_F32);
    assert_int_equal(info.owned_numel, 2 * (500 + 19 + 257));
    uint64_t numel = 0, sn = 0;
    must(zt_server_core_block_numel(c.core[0], k_run, 2, &numel, &sn, &err), &err);
    assert_int_equal(numel, 513);
    assert_int_equal(sn, 257);
    assert_int_equal(zt_server_core_block_numel(c.core[0], k_run, 3, &numel, &sn, &err), ZT_EINVAL_CONFIG);
    blocks[1].numel = 38;
    assert_int_equal(zt_server_core_register(c.core[0], &d, &info, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "block 1: numel 38, registered 37"));
    blocks[1].numel = 37;
    d.param_dtype = ZT_DTYPE_BF16;
    assert_int_equal(zt_server_core_register(c.core[0], &d, &info, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "parameter dtype"));
    d = make_desc("bad/id", ZT_DTYPE_F32, blocks);
    assert_int_equal(zt_server_core_register(c.core[0], &d, &info, &err), ZT_EINVAL_CONFIG);
    d = make_desc("other", ZT_DTYPE_F32, blocks);
    zt_server_range overlap[2] = {{0, 10}, {5, 20}};
    blocks[0].decay = overlap;
    blocks[0].ndecay = 2;
    assert_int_equal(zt_server_core_register(c.core[0], &d, &info, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "weight-decay range 1"));
    /* Memory limit: a run that does not fit is refused with the sizes. */
    zt_server_core_options o = {.mem_limit = 1000};
    zt_server_core *small;
    must(zt_server_core_create(&small, &o, &err), &err);
    d = make_desc(k_run, ZT_DTYPE_F32, blocks);
    assert_int_equal(zt_server_core_register(small, &d, &info, &err), ZT_ENOMEM);
    assert_non_null(strstr(err.msg, "--max-memory"));
    zt_server_core_destroy(small);
    cluster_destroy(&c);
}

/* Limits a hostile or mistaken RegisterRun meets before the server allocates anything: the number of runs
 * (max_runs) and the shards of one run (blocks times world size). */
static void test_register_limits(void **state)
{
    (void)state;
    zt_err err = {{0}};
    zt_server_core_options o = {.max_runs = 2};
    zt_server_core *core;
    must(zt_server_core_create(&core, &o, &err), &err);
    zt_server_block_desc blocks[NB];
    zt_server_run_info info;
    static const char *const names[3] = {"run-a", "run-b", "run-c"};
    for (int i = 0; i < 3; i++) {
        zt_server_run_desc d = make_desc(names[i], ZT_DTYPE_F32, blocks);
        int rc = zt_server_core_register(core, &d, &info, &err);
        assert_int_equal(rc, i < 2 ? 0 : ZT_ENOMEM);
    }
    assert_non_null(strstr(err.msg, "--max-runs"));
    /* A run already held registers again (a restarted worker), at the limit too. */
    zt_server_run_desc d = make_desc("run-a", ZT_DTYPE_F32, blocks);
    assert_int_equal(zt_server_core_register(core, &d, &info, &err), 0);
    assert_int_equal(zt_server_core_drop(core, "run-b", &err), 0);
    d = make_desc("run-c", ZT_DTYPE_F32, blocks);
    assert_int_equal(zt_server_core_register(core, &d, &info, &err), 0);

    /* 65536 blocks of 65536 shards would be 2^32 pairs: refused at once, naming the limit. */
    zt_server_block_desc *many = calloc(ZT_SERVER_MAX_BLOCKS, sizeof(*many));
    for (int b = 0; b < ZT_SERVER_MAX_BLOCKS; b++)
        many[b].numel = 1;
    zt_server_run_desc wide = {.run_id = "wide", .world_size = ZT_SERVER_MAX_WORLD, .nblocks = ZT_SERVER_MAX_BLOCKS,
                               .blocks = many, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .param_dtype = ZT_DTYPE_F32};
    assert_int_equal(zt_server_core_register(core, &wide, &info, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "at most 65536"));
    wide.nblocks = 2; /* one shard over the limit */
    wide.world_size = ZT_SERVER_MAX_SHARDS / 2 + 1;
    assert_int_equal(zt_server_core_register(core, &wide, &info, &err), ZT_EINVAL_CONFIG);
    free(many);
    zt_server_core_destroy(core);
}

static void test_owner_mapping(void **state)
{
    (void)state;
    /* The documented formula, computed here independently. */
    uint32_t h = 2166136261u;
    for (const char *s = "gpt2-run"; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 16777619u;
    }
    for (int b = 0; b < 5; b++)
        for (int r = 0; r < 3; r++)
            assert_int_equal(zt_server_owner("gpt2-run", b, r, 3, 4), (int)(((uint64_t)h + (uint64_t)(b * 3 + r)) % 4));
    /* Balanced: every server owns the same number of pairs, give or take one. */
    static const int shapes[][3] = {{14, 1, 4}, {14, 2, 3}, {26, 8, 5}, {3, 7, 2}, {50, 3, 7}};
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        int nb = shapes[k][0], w = shapes[k][1], s = shapes[k][2];
        int count[8] = {0};
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < w; r++) {
                int o = zt_server_owner("run-a", b, r, w, s);
                assert_true(o >= 0 && o < s);
                assert_int_equal(o, zt_server_owner("run-a", b, r, w, s));
                count[o]++;
            }
        int lo = count[0], hi = count[0];
        for (int i = 1; i < s; i++) {
            lo = count[i] < lo ? count[i] : lo;
            hi = count[i] > hi ? count[i] : hi;
        }
        assert_true(hi - lo <= 1);
    }
    assert_int_equal(zt_server_owner("x", 3, 1, 2, 1), 0);
    assert_int_equal(zt_server_shard_numel(10, 4), 3);
    assert_int_equal(zt_server_shard_numel(12, 4), 3);
    assert_int_equal(zt_server_shard_numel(1, 4), 1);
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, at, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(ch ^ 0x40, f);
    fclose(f);
}

static void snapshot_round_trip(enum zt_server_store_kind kind, int S)
{
    cluster c;
    ref r;
    cluster_create(&c, S, kind);
    ref_init(&r, 9);
    run_steps(&c, &r, 3, ZT_DTYPE_BF16);
    char root[300], path[2][600];
    snprintf(root, sizeof(root), "%s/snaps-%d-%d", g_dir, (int)kind, S);
    zt_err err = {0};
    for (int s = 0; s < S; s++)
        must(zt_server_core_snapshot_save(c.core[s], k_run, root, 2, path[s], sizeof(path[s]), &err), &err);
    /* A server restarted from its snapshot directory has the same state. */
    cluster d;
    cluster_create(&d, S, kind);
    for (int s = 0; s < S; s++) {
        int nruns = 0;
        must(zt_server_core_restore_all(d.core[s], root, &nruns, &err), &err);
        assert_int_equal(nruns, 1);
    }
    check_state(&d, &r, 3, ZT_DTYPE_BF16);
    /* ... and continues like the original. */
    ref_make_grads(&r, 77);
    push_all(&d, &r, false, 4, 78);
    commit_all(&d, 4, 1e-3f, 1.0f, false);
    ref_step(&r, 1e-3f, 1.0f);
    check_state(&d, &r, 4, ZT_DTYPE_BF16);
    zt_server_run_info info;
    must(zt_server_core_run_info(d.core[0], k_run, &info, &err), &err);
    assert_int_equal(info.adam_step, 3);

    /* Corruption: a flipped byte in a block file, then a damaged manifest. */
    cluster e;
    cluster_create(&e, S, kind);
    char file[700];
    snprintf(file, sizeof(file), "%s/block_000000.safetensors", path[0]);
    struct stat st;
    if (stat(file, &st) != 0)
        snprintf(file, sizeof(file), "%s/block_000001.safetensors", path[0]);
    assert_int_equal(stat(file, &st), 0);
    flip_byte(file, (long)st.st_size - 5);
    assert_int_equal(zt_server_core_snapshot_read(e.core[0], path[0], NULL, &err), ZT_ECHECKSUM);
    assert_non_null(strstr(err.msg, "crc32c mismatch"));
    assert_int_equal(zt_server_core_run_info(e.core[0], k_run, &info, &err), -ENOENT); /* nothing registered */
    flip_byte(file, (long)st.st_size - 5);
    snprintf(file, sizeof(file), "%s/manifest.json", path[0]);
    assert_int_equal(truncate(file, 40), 0);
    assert_int_equal(zt_server_core_snapshot_read(e.core[0], path[0], NULL, &err), ZT_EFORMAT);
    if (S == 2) {
        /* A snapshot of the other server is refused. */
        assert_int_equal(zt_server_core_snapshot_read(e.core[0], path[1], NULL, &err), ZT_EMISMATCH);
        assert_non_null(strstr(err.msg, "server 1 of 2"));
    }
    cluster_destroy(&e);
    cluster_destroy(&d);
    ref_free(&r);
    cluster_destroy(&c);
}

/* Replaces the first `from` in file path by `to`; fails the test if there is none. */
static void replace_in_file(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char text[16384];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, from);
    assert_non_null(at);
    char out[17000];
    snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    f = fopen(path, "wb");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
}

/* Numbers in a manifest that no integer type holds (found by fuzz_snapshot_manifest: the range was
 * checked after converting to int64_t, which is undefined for 1e300) are a damaged snapshot. */
static void test_snapshot_manifest_numbers(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 5);
    run_steps(&c, &r, 1, ZT_DTYPE_F32);
    static const char *const edits[][2] = {
        {"\"step\":\t1,", "\"step\":\t1e300,"},
        {"\"world_size\":\t2,", "\"world_size\":\t-1e300,"},
        {"\"numel\":\t1000,", "\"numel\":\t1.5,"},
        {"[0, 800]", "[1e300, 800]"},
        {"[0, 800]", "[0, -1e19]"},
    };
    zt_err err = {{0}};
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        char dir[400], file[500];
        snprintf(dir, sizeof(dir), "%s/numbers-%zu", g_dir, i);
        must(zt_server_core_snapshot_write(c.core[0], k_run, dir, &err), &err);
        snprintf(file, sizeof(file), "%s/manifest.json", dir);
        replace_in_file(file, edits[i][0], edits[i][1]);
        zt_server_core *fresh;
        zt_server_core_options o = {0};
        must(zt_server_core_create(&fresh, &o, &err), &err);
        assert_int_equal(zt_server_core_snapshot_read(fresh, dir, NULL, &err), ZT_EFORMAT);
        zt_server_core_destroy(fresh);
    }
    ref_free(&r);
    cluster_destroy(&c);
}

/* Lowers the file size limit to `bytes` (as ulimit -f, or a disk that fills up at that size: writes past
 * it fail with EFBIG, SIGXFSZ being ignored) and returns the limit to put back. */
static struct rlimit limit_file_size(rlim_t bytes)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    low = old;
    low.rlim_cur = bytes;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
    return old;
}

/* A snapshot that meets a full disk fails with a message naming the file; nothing of it is left, `latest`
 * still names the previous snapshot, which restores, and the live run loses nothing: it is still at its
 * step with its state, and the next save, with room again, succeeds. */
static void snapshot_disk_full(enum zt_server_store_kind kind)
{
    cluster c;
    ref r;
    cluster_create(&c, 1, kind);
    ref_init(&r, 13);
    run_steps(&c, &r, 1, ZT_DTYPE_F32);
    char root[300], path[600], file[700];
    snprintf(root, sizeof(root), "%s/full-%d", g_dir, (int)kind);
    zt_err err = {0};
    must(zt_server_core_snapshot_save(c.core[0], k_run, root, 2, path, sizeof(path), &err), &err);
    ref_make_grads(&r, 300);
    push_all(&c, &r, false, 2, 301);
    commit_all(&c, 2, 1e-3f, 1.0f, false);
    ref_step(&r, 1e-3f, 1.0f);

    struct rlimit old = limit_file_size(4096); /* block 0's file is 12 KiB */
    int rc = zt_server_core_snapshot_save(c.core[0], k_run, root, 2, path, sizeof(path), &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(rc, -EFBIG);
    assert_non_null(strstr(err.msg, "step_00000002.tmp/block_000000.safetensors"));

    snprintf(file, sizeof(file), "%s/%s/server0of1/step_00000002", root, k_run);
    struct stat st;
    assert_int_not_equal(stat(file, &st), 0);
    snprintf(file, sizeof(file), "%s/%s/server0of1/step_00000002.tmp", root, k_run);
    assert_int_not_equal(stat(file, &st), 0);
    snprintf(file, sizeof(file), "%s/%s/server0of1/latest", root, k_run);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    char line[64] = "";
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_string_equal(line, "step_00000001\n");
    cluster d;
    cluster_create(&d, 1, kind);
    int nruns = 0;
    must(zt_server_core_restore_all(d.core[0], root, &nruns, &err), &err);
    zt_server_run_info info;
    must(zt_server_core_run_info(d.core[0], k_run, &info, &err), &err);
    assert_int_equal(info.step, 1);
    cluster_destroy(&d);
    check_state(&c, &r, 2, ZT_DTYPE_F32); /* nothing committed is lost */
    must(zt_server_core_snapshot_save(c.core[0], k_run, root, 2, path, sizeof(path), &err), &err);
    assert_non_null(strstr(path, "step_00000002"));
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_snapshot_disk_full_ram(void **state)
{
    (void)state;
    snapshot_disk_full(ZT_SERVER_STORE_RAM);
}

static void test_snapshot_disk_full_nvme(void **state)
{
    (void)state;
    snapshot_disk_full(ZT_SERVER_STORE_NVME);
}

/* The NVMe tier reserves a run's files when the run registers (posix_fallocate), so a full disk shows
 * then, as a clean refusal that leaves no run and no files behind, and never in the middle of a commit.
 * The run registered before goes on. */
static void test_nvme_register_disk_full(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_NVME);
    ref_init(&r, 17);
    run_steps(&c, &r, 1, ZT_DTYPE_F32);
    zt_server_block_desc blocks[NB];
    zt_server_run_desc d = make_desc("second-run", ZT_DTYPE_F32, blocks);
    zt_err err = {0};
    zt_server_run_info info;
    struct rlimit old = limit_file_size(8192); /* a record of block 0's shard needs 4096 + 8192 bytes */
    int rc = zt_server_core_register(c.core[0], &d, &info, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(rc, -EFBIG);
    assert_non_null(strstr(err.msg, "free disk space"));
    assert_int_equal(zt_server_core_run_info(c.core[0], "second-run", &info, &err), -ENOENT);
    char store[300];
    snprintf(store, sizeof(store), "%s/store0", g_dir);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "test $(ls '%s' | wc -l) -eq %d", store, 2 * NB * W); /* the first run's only */
    assert_int_equal(system(cmd), 0);
    ref_make_grads(&r, 400);
    push_all(&c, &r, false, 2, 401);
    commit_all(&c, 2, 1e-3f, 1.0f, false);
    ref_step(&r, 1e-3f, 1.0f);
    check_state(&c, &r, 2, ZT_DTYPE_F32);
    ref_free(&r);
    cluster_destroy(&c);
}

static void test_snapshot_ram(void **state)
{
    (void)state;
    snapshot_round_trip(ZT_SERVER_STORE_RAM, 1);
}

static void test_snapshot_nvme_two_servers(void **state)
{
    (void)state;
    snapshot_round_trip(ZT_SERVER_STORE_NVME, 2);
}

static void test_snapshot_save_keep_and_metrics(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 10);
    cluster_register(&c, ZT_DTYPE_F32);
    zt_err err = {0};
    char root[300], p[600];
    snprintf(root, sizeof(root), "%s/keep", g_dir);
    assert_int_equal(zt_server_core_snapshot_save(c.core[0], k_run, root, 2, p, sizeof(p), &err), ZT_ESTATE);
    push_all(&c, &r, true, 0, 7);
    for (int s = 1; s <= 3; s++) {
        must(zt_server_core_snapshot_save(c.core[0], k_run, root, 2, p, sizeof(p), &err), &err);
        must(zt_server_core_snapshot_save(c.core[0], k_run, root, 2, p, sizeof(p), &err), &err); /* same step */
        ref_make_grads(&r, 300 + (uint64_t)s);
        push_all(&c, &r, false, s, 400 + (uint64_t)s);
        commit_all(&c, s, 1e-3f, 1.0f, false);
    }
    char dir[700];
    struct stat st;
    snprintf(dir, sizeof(dir), "%s/%s/server0of1/step_00000000", root, k_run);
    assert_int_not_equal(stat(dir, &st), 0); /* pruned: only the newest two are kept */
    snprintf(dir, sizeof(dir), "%s/%s/server0of1/step_00000002", root, k_run);
    assert_int_equal(stat(dir, &st), 0);

    char text[8192];
    size_t len = zt_server_core_metrics_text(c.core[0], text, sizeof(text));
    assert_true(len < sizeof(text));
    assert_non_null(strstr(text, "# TYPE ztrain_server_step gauge\n"));
    assert_non_null(strstr(text, "ztrain_server_step{run=\"test-run\"} 3\n"));
    assert_non_null(strstr(text, "ztrain_server_commits_total{run=\"test-run\"} 3\n"));
    char small[16];
    assert_int_equal(zt_server_core_metrics_text(c.core[0], small, sizeof(small)), len);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    zt_server_run_stats stt;
    must(zt_server_core_stats(c.core[0], k_run, &stt, &err), &err);
    assert_true(stt.bytes_pushed > 0 && stt.bytes_pulled == 0);
    assert_true(stt.store_bytes > 0);
    ref_free(&r);
    cluster_destroy(&c);
}

/* Snapshots of workers' checkpoints are kept apart from the durable ones of every commit: with keep 2, the
 * checkpoint snapshots of steps 2 and 4 survive the commit snapshots of steps 5 to 9, a durable snapshot of
 * a checkpoint's step becomes a checkpoint one, and the oldest checkpoint snapshot goes with its marker;
 * LoadSnapshot's reader takes the kept checkpoint back. */
static void test_snapshot_checkpoints_kept_apart(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 10);
    cluster_register(&c, ZT_DTYPE_F32);
    zt_err err = {0};
    char root[300], p[600], dir[700];
    snprintf(root, sizeof(root), "%s/pinned", g_dir);
    push_all(&c, &r, true, 0, 7);
    struct stat st;
    for (int s = 1; s <= 9; s++) {
        ref_make_grads(&r, 500 + (uint64_t)s);
        push_all(&c, &r, false, s, 600 + (uint64_t)s);
        commit_all(&c, s, 1e-3f, 1.0f, false);
        must(zt_server_core_snapshot_save(c.core[0], k_run, root, 2, p, sizeof(p), &err), &err); /* durable */
        if (s == 1 || s == 2 || s == 4) /* a worker's checkpoint of the step, after the durable snapshot */
            must(zt_server_core_snapshot_save_checkpoint(c.core[0], k_run, root, 2, p, sizeof(p), &err), &err);
    }
    static const struct {
        int step;
        bool kept, marked;
    } want[] = {{1, false, false}, {2, true, true}, {3, false, false}, {4, true, true},
                {7, false, false}, {8, true, false}, {9, true, false}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(dir, sizeof(dir), "%s/%s/server0of1/step_%08d", root, k_run, want[i].step);
        if ((stat(dir, &st) == 0) != want[i].kept)
            fail_msg("step %d: kept %d, expected %d", want[i].step, stat(dir, &st) == 0, want[i].kept);
        snprintf(dir, sizeof(dir), "%s/%s/server0of1/step_%08d.checkpoint", root, k_run, want[i].step);
        if ((stat(dir, &st) == 0) != want[i].marked)
            fail_msg("step %d: marker %d, expected %d", want[i].step, stat(dir, &st) == 0, want[i].marked);
    }
    zt_server_run_info info;
    snprintf(dir, sizeof(dir), "%s/%s/server0of1/step_%08d", root, k_run, 4);
    must(zt_server_core_snapshot_read(c.core[0], dir, &info, &err), &err);
    assert_int_equal(info.step, 4);
    ref_free(&r);
    cluster_destroy(&c);
}

/* ---- larger shards, pushed from two threads per rank, on both stores ---- */

#define BIG_NB 2
#define BIG_W 3
static const uint64_t k_big[BIG_NB] = {300001, 70000};

#define BIG_LANES 2 /* threads pushing one shard at the same time, as the client's streams do */

typedef struct pusher {
    zt_server_core *core;
    int shard;
    int lane;            /* this thread pushes the chunks i with i % BIG_LANES == lane */
    int64_t step;
    float *const *grads; /* [BIG_NB] whole blocks */
    int rc;
    zt_err err;
} pusher;

/* Pushes its lane's chunks of this rank's shard of every block (4096 elements each), last block first (as
 * backward does). */
static void *push_thread(void *arg)
{
    pusher *p = arg;
    for (int b = BIG_NB - 1; b >= 0 && p->rc == 0; b--) {
        uint64_t n = zt_server_shard_numel(k_big[b], BIG_W);
        float *s = calloc(n, 4);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t e = (uint64_t)p->shard * n + i;
            s[i] = e < k_big[b] ? p->grads[b][e] : 0.0f;
        }
        for (uint64_t off = (uint64_t)p->lane * 4096; off < n && p->rc == 0; off += BIG_LANES * 4096) {
            zt_server_chunk ch = {.block = b, .shard = p->shard, .offset = off, .n = n - off < 4096 ? n - off : 4096,
                                  .dtype = ZT_DTYPE_F32, .data = s + off};
            p->rc = zt_server_core_push_grad(p->core, "big", p->step, &ch, &p->err);
        }
        free(s);
    }
    return NULL;
}

static void test_large_shards_threads_ram_and_nvme(void **state)
{
    (void)state;
    zt_server_core *core[2];
    zt_err err = {0};
    for (int k = 0; k < 2; k++) {
        zt_server_core_options o = {.store = k ? ZT_SERVER_STORE_NVME : ZT_SERVER_STORE_RAM, .threads = 2};
        char path[300];
        snprintf(path, sizeof(path), "%s/bigstore", g_dir);
        if (k) {
            mkdir(path, 0755);
            o.store_path = path;
        }
        int rc = zt_server_core_create(&core[k], &o, &err);
        if (rc == ZT_EUNSUPPORTED && k) {
            o.store_no_direct = true;
            rc = zt_server_core_create(&core[k], &o, &err);
        }
        must(rc, &err);
    }
    zt_server_block_desc blocks[BIG_NB] = {{.numel = k_big[0]}, {.numel = k_big[1]}};
    zt_server_run_desc d = {.run_id = "big", .world_size = BIG_W, .nblocks = BIG_NB, .blocks = blocks,
                            .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .param_dtype = ZT_DTYPE_BF16};
    float *p[BIG_NB], *m[BIG_NB], *v[BIG_NB], *g[BIG_NB];
    zt_rng rng;
    zt_rng_seed(&rng, 99);
    for (int b = 0; b < BIG_NB; b++) {
        p[b] = malloc(k_big[b] * 4);
        m[b] = calloc(k_big[b], 4);
        v[b] = calloc(k_big[b], 4);
        g[b] = malloc(k_big[b] * 4);
        for (uint64_t i = 0; i < k_big[b]; i++)
            p[b][i] = (float)(0.02 * zt_rng_normal(&rng));
    }
    for (int k = 0; k < 2; k++) {
        must(zt_server_core_register(core[k], &d, NULL, &err), &err);
        for (int b = 0; b < BIG_NB; b++) {
            uint64_t n = zt_server_shard_numel(k_big[b], BIG_W);
            float *s = calloc(n * BIG_W, 4);
            memcpy(s, p[b], k_big[b] * 4);
            for (int r = 0; r < BIG_W; r++) {
                zt_server_chunk ch = {.block = b, .shard = r, .offset = 0, .n = n, .dtype = ZT_DTYPE_F32,
                                      .data = s + (uint64_t)r * n};
                must(zt_server_core_push_params(core[k], "big", &ch, &err), &err);
            }
            free(s);
        }
    }
    for (int step = 1; step <= 2; step++) {
        for (int b = 0; b < BIG_NB; b++)
            for (uint64_t i = 0; i < k_big[b]; i++)
                g[b][i] = (float)zt_rng_normal(&rng);
        for (int k = 0; k < 2; k++) {
            pusher ps[BIG_W * BIG_LANES];
            pthread_t t[BIG_W * BIG_LANES];
            for (int r = 0; r < BIG_W * BIG_LANES; r++) {
                ps[r] = (pusher){.core = core[k], .shard = r / BIG_LANES, .lane = r % BIG_LANES, .step = step,
                                 .grads = g};
                assert_int_equal(pthread_create(&t[r], NULL, push_thread, &ps[r]), 0);
            }
            for (int r = 0; r < BIG_W * BIG_LANES; r++) {
                pthread_join(t[r], NULL);
                must(ps[r].rc, &ps[r].err);
            }
            zt_server_commit_args a = {.step = step, .clip_coef = 0.75f, .lr = 3e-4f};
            must(zt_server_core_commit(core[k], "big", &a, NULL, &err), &err);
        }
        zt_adamw_params hp = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 0.75f,
                              .step = step};
        for (int b = 0; b < BIG_NB; b++)
            zt_cpu_adamw_update(p[b], m[b], v[b], g[b], k_big[b], &hp);
    }
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < BIG_NB; b++) {
            uint64_t n = zt_server_shard_numel(k_big[b], BIG_W);
            float *got = malloc(n * 4);
            const float *want[3] = {p[b], m[b], v[b]};
            for (int r = 0; r < BIG_W; r++)
                for (int t = 0; t < 3; t++) {
                    must(zt_server_core_read_state(core[k], "big", b, r, (enum zt_server_state_tensor)t, got, NULL,
                                                   &err), &err);
                    uint64_t valid = k_big[b] - (uint64_t)r * n < n ? k_big[b] - (uint64_t)r * n : n;
                    assert_memory_equal(got, want[t] + (uint64_t)r * n, valid * 4);
                    for (uint64_t i = valid; i < n; i++)
                        assert_true(got[i] == 0.0f); /* padding stays zero */
                }
            free(got);
        }
    for (int b = 0; b < BIG_NB; b++) {
        free(p[b]);
        free(m[b]);
        free(v[b]);
        free(g[b]);
    }
    zt_server_core_destroy(core[0]);
    zt_server_core_destroy(core[1]);
}

/* ---- pulls that stand in the worker's memory ---- */

/* One place (id 7) over a flat buffer that holds every shard's low-precision parameters, shard after shard. */
typedef struct place {
    uint8_t *buf;
    uint64_t bytes;
    bool gone;  /* get answers NULL */
    int held;   /* references get took and put did not give back */
} place;

static void *place_get(void *user, uint64_t id, uint64_t off, uint64_t len)
{
    place *pl = user;
    if (id != 7 || pl->gone || off > pl->bytes || len > pl->bytes - off)
        return NULL;
    pl->held++;
    return pl->buf + off;
}

static void place_put(void *user, uint64_t id)
{
    place *pl = user;
    assert_int_equal(id, 7);
    pl->held--;
}

/* The byte of shard sh of block b in the place, and the bytes of one such shard. */
static uint64_t place_off(int b, int sh, size_t es)
{
    uint64_t off = 0;
    for (int k = 0; k < b; k++)
        off += zt_server_shard_numel(k_numel[k], W) * W * es;
    return off + (uint64_t)sh * zt_server_shard_numel(k_numel[b], W) * es;
}

/* Pulls every shard of `step` standing in the place (or, plain, into it without standing), checks that the
 * commit had written them there (delivered) or not, and that the place holds the reference's parameters. */
static void pull_into_place(zt_server_core *core, place *pl, const ref *r, int64_t step, bool plain, bool delivered)
{
    const size_t es = 2;
    for (int b = 0; b < NB; b++) {
        uint64_t n = zt_server_shard_numel(k_numel[b], W);
        for (int sh = 0; sh < W; sh++) {
            zt_err err = {0};
            const uint64_t off = place_off(b, sh, es);
            bool got = false;
            if (plain)
                must(zt_server_core_pull(core, k_run, step, b, sh, 0, n, pl->buf + off, 0, &err), &err);
            else
                must(zt_server_core_pull_standing(core, k_run, step, b, sh, 0, n, pl->buf + off, 7, off, 0, &got,
                                                  &err), &err);
            if (got != delivered)
                fail_msg("step %lld block %d shard %d: delivered by the commit %d, expected %d", (long long)step, b,
                         sh, got, delivered);
            float *exp = shard_of(r->p[b], b, sh);
            uint16_t *want = malloc(n * es);
            must(zt_cpu_adam_convert(want, ZT_DTYPE_BF16, exp, n, 1, &err), &err);
            assert_memory_equal(pl->buf + off, want, n * es);
            free(want);
            free(exp);
        }
    }
}

/* Standing pulls on a RAM-tier core with places: the first pull of each shard is a copy that stands in the
 * place; the commits after it write the bf16 parameters straight there and the pulls of their steps copy
 * nothing, with the bits of the reference; an overflowed step (no update) and a plain pull after a delivered
 * step are served from the core's copy, made again from the masters (the same bits); the plain pull ends the
 * standing place (the next commit writes the core's copy), a standing pull makes it stand again; a place that
 * is gone at a commit gets nothing (the core's copy is written) and ends it; removing the places ends them
 * all. Every reference a commit took is given back, and the delivered bytes are counted. */
static void test_standing_pulls_ram(void **state)
{
    (void)state;
    cluster c;
    ref r;
    cluster_create(&c, 1, ZT_SERVER_STORE_RAM);
    ref_init(&r, 11);
    zt_server_core *core = c.core[0];
    place pl = {0};
    pl.bytes = place_off(NB, 0, 2);
    pl.buf = calloc(pl.bytes, 1);
    const zt_server_pull_places places = {.get = place_get, .put = place_put, .user = &pl};
    zt_server_core_set_pull_places(core, &places);
    cluster_register(&c, ZT_DTYPE_BF16);
    push_all(&c, &r, true, 0, 7);
    pull_into_place(core, &pl, &r, 0, false, false); /* stands from here on */
    uint64_t per_step = 0;
    for (int b = 0; b < NB; b++)
        per_step += zt_server_shard_numel(k_numel[b], W) * W * 2;
    /* delivered at steps 1, 3 (and 4, 6 after standing again); 2 overflows; a plain pull after 3; 5 is gone */
    const bool want[7] = {false, true, false, true, false, false, true};
    for (int s = 1; s <= 6; s++) {
        ref_make_grads(&r, 300 + (uint64_t)s);
        push_all(&c, &r, false, s, 400 + (uint64_t)s);
        const bool overflow = s == 2;
        pl.gone = s == 5;
        commit_all(&c, s, 1e-3f, 1.0f, overflow);
        pl.gone = false;
        if (!overflow)
            ref_step(&r, 1e-3f, 1.0f);
        assert_int_equal(pl.held, 0);
        pull_into_place(core, &pl, &r, s, false, want[s]);
        if (s == 3) {
            pull_into_place(core, &pl, &r, s, true, false); /* the core's copy, made again; ends the place */
            ref_make_grads(&r, 500);
            push_all(&c, &r, false, 4, 600);
            commit_all(&c, 4, 1e-3f, 1.0f, false);
            ref_step(&r, 1e-3f, 1.0f);
            pull_into_place(core, &pl, &r, 4, false, false); /* a copy, which stands again */
            s = 4;
        }
    }
    zt_server_run_stats st;
    zt_err err = {0};
    must(zt_server_core_stats(core, k_run, &st, &err), &err);
    assert_int_equal(st.bytes_delivered, 3 * per_step); /* steps 1, 3 and 6 */
    /* no places: a standing pull of step 6 again is a copy */
    zt_server_core_set_pull_places(core, NULL);
    pull_into_place(core, &pl, &r, 6, false, false);
    free(pl.buf);
    ref_free(&r);
    cluster_destroy(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owner_mapping),
        cmocka_unit_test(test_register_idempotent_and_mismatch),
        cmocka_unit_test(test_register_limits),
        cmocka_unit_test(test_round_trip_ram_f32),
        cmocka_unit_test(test_round_trip_ram_bf16),
        cmocka_unit_test(test_round_trip_nvme),
        cmocka_unit_test(test_nvme_ignores_old_state_files),
        cmocka_unit_test(test_two_servers_match_one),
        cmocka_unit_test(test_incomplete_stale_future),
        cmocka_unit_test(test_atomic_commit_ram),
        cmocka_unit_test(test_atomic_commit_nvme),
        cmocka_unit_test(test_pull_waits_for_block),
        cmocka_unit_test(test_snapshot_ram),
        cmocka_unit_test(test_snapshot_manifest_numbers),
        cmocka_unit_test(test_snapshot_disk_full_ram),
        cmocka_unit_test(test_snapshot_disk_full_nvme),
        cmocka_unit_test(test_nvme_register_disk_full),
        cmocka_unit_test(test_snapshot_nvme_two_servers),
        cmocka_unit_test(test_snapshot_save_keep_and_metrics),
        cmocka_unit_test(test_snapshot_checkpoints_kept_apart),
        cmocka_unit_test(test_large_shards_threads_ram_and_nvme),
        cmocka_unit_test(test_standing_pulls_ram),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
