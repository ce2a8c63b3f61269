/* The state server's update against the embedded host AdamW, per parameter, without gRPC: for the same n
 * parameters laid out as GPT-2 layers (blocks of tensors whose weight matrices get weight decay and whose
 * biases and layer norms do not, so the update walks the same pieces as a real run), on the CPU:
 *
 *   embedded     zt_cpu_adam_update in place on each tensor of host arrays, as `--optimizer cpu` calls it
 *                (master, m, v, the gradient and the low-precision weights each one array, huge pages advised
 *                as the engine advises its host arrays);
 *   two-slot     zt_cpu_adam_update reading the state from one array and writing it to another (param_src,
 *                m_src, v_src): the kernel of the server's commit alone, on the embedded arrays' layout;
 *   server       zt_server_core_commit of a run registered with the same blocks, RAM store, W = 1: the
 *                server's update from its committed slot into the other one (the commit's own seconds);
 *                the gradient pushes that precede every commit (zt_server_core_push_grad, one chunk per
 *                block, as an shm push stores them) are timed apart ("push");
 *   pulls        the same commit while one more thread pulls every block as soon as the update has it
 *                (zt_server_core_pull, which waits for it), into a worker's bf16 weights as the state service
 *                does on one host: "through a slot", the server's copy into a 16 MiB slot of a shared-memory
 *                segment and the worker's copy out of it (a pull into private memory), "in place", the
 *                server's copy straight into the weights (a pull into the client's shared memory), or
 *                "standing", the update itself writing the bf16 weights there and the pull copying nothing
 *                (zt_server_core_pull_standing, what a pull into the client's shared memory does from the
 *                second step on). Each gives the commit's seconds beside the pulls and the seconds until the
 *                last block was in the weights ("+ pulls"), from the commit's start.
 *
 * Each variant runs ITERS updates after one warm-up (which takes the pages) for each thread count, and prints
 * one line "bench_server_update variant=... threads=... best_s=... ns_param=... gb_s=..." and then a table.
 * GB/s counts the bytes an in-place update must move: master, m and v read and written (24), the gradient read
 * (4 or 2) and the output written (2 for bf16), the same count for every variant, so that the column compares
 * time per parameter. Run by bench/server/update.sh; never by ctest.
 *
 * COPY_THREADS (default 0) threads copy 64 MiB buffers back and forth during every variant, as the pulls'
 * copies run beside a server's update on its host: with as many Adam threads as cores, a copy thread takes a
 * core from one of them.
 *
 * usage: bench_server_update N_MILLIONS THREADS[,THREADS...] [f32|bf16 gradient] [ITERS] [n_embd] [COPY_THREADS] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/memory.h"
#include "common/safetensors.h"
#include "offload/cpu_adam.h"
#include "server/core.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The copy threads: each copies between two buffers of its own until told to stop. */
static atomic_int g_copy_stop;

static void *copy_main(void *arg)
{
    (void)arg;
    const size_t bytes = (size_t)64 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b)
        return NULL;
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    while (!atomic_load(&g_copy_stop)) {
        memcpy(b, a, bytes);
        memcpy(a, b, bytes);
    }
    free(a);
    free(b);
    return NULL;
}

static void die(const char *what, const zt_err *err)
{
    fprintf(stderr, "bench_server_update: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* One GPT-2 layer of width c as tensors in slab order: (elements, weight decay). */
#define NT 12
static void layer_tensors(uint64_t c, uint64_t *n, int *decay)
{
    const uint64_t sizes[NT] = {c, c, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, 4 * c * c, c};
    const int dec[NT] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0};
    for (int t = 0; t < NT; t++) {
        n[t] = sizes[t];
        decay[t] = dec[t];
    }
}

typedef struct layout {
    int nblocks;
    uint64_t block_numel;   /* every block is one layer */
    uint64_t tn[NT];        /* tensor sizes */
    int tdecay[NT];
    uint64_t n;             /* all parameters */
} layout;

static void fill_grad(void *g, enum zt_dtype gdt, uint64_t n, uint64_t salt)
{
    for (uint64_t i = 0; i < n; i++) {
        if (gdt == ZT_DTYPE_F32)
            ((float *)g)[i] = 1e-3f * (float)((i + salt) % 777) - 0.3f;
        else
            ((unsigned short *)g)[i] = (unsigned short)(0x3a00 + (i + salt) % 256);
    }
}

static zt_adamw_params hparams(int step)
{
    return (zt_adamw_params){.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                             .grad_scale = 1.0f, .step = step};
}

/* The in-place (src NULL) or two-slot update of every tensor of the layout over flat arrays. */
static void update_arrays(const layout *L, float *param, float *m, float *v, const float *sp, const float *sm,
                          const float *sv, const void *grad, enum zt_dtype gdt, void *out, int step, int threads)
{
    size_t gs = zt_dtype_size(gdt);
    uint64_t off = 0;
    zt_err err;
    for (int b = 0; b < L->nblocks; b++)
        for (int t = 0; t < NT; t++) {
            zt_adamw_params p = hparams(step);
            p.weight_decay = L->tdecay[t] ? p.weight_decay : 0.0f;
            zt_cpu_adam_range r = {
                .param = param + off, .m = m + off, .v = v + off, .grad = (const char *)grad + off * gs,
                .grad_dtype = gdt, .out = (char *)out + off * 2, .out_dtype = ZT_DTYPE_BF16, .n = L->tn[t],
                .param_src = sp ? sp + off : NULL, .m_src = sp ? sm + off : NULL, .v_src = sp ? sv + off : NULL,
            };
            if (zt_cpu_adam_update(&r, &p, threads, &err) != 0)
                die("zt_cpu_adam_update", &err);
            off += L->tn[t];
        }
}

static float *huge_calloc(uint64_t n, size_t es)
{
    void *p = calloc(n, es);
    if (!p) {
        fprintf(stderr, "bench_server_update: out of memory (%llu elements)\n", (unsigned long long)n);
        exit(1);
    }
    zt_advise_huge_pages(p, n * es);
    return p;
}

/* Times `iters` updates of the embedded arrays (two_slot: reading from a second copy of the state, which
 * swaps with the first after every update as the server's slots do). Returns the best seconds. */
static double bench_arrays(const layout *L, enum zt_dtype gdt, int threads, int iters, int two_slot)
{
    uint64_t n = L->n;
    float *param[2], *m[2], *v[2];
    for (int s = 0; s < 1 + two_slot; s++) {
        param[s] = huge_calloc(n, 4);
        m[s] = huge_calloc(n, 4);
        v[s] = huge_calloc(n, 4);
    }
    void *grad = huge_calloc(n, zt_dtype_size(gdt));
    void *out = huge_calloc(n, 2);
    for (uint64_t i = 0; i < n; i++)
        param[0][i] = 0.01f * (float)(i % 1000);
    fill_grad(grad, gdt, n, 0);
    double best = 1e30;
    int cur = 0;
    for (int it = 0; it <= iters; it++) {
        double t0 = now();
        if (two_slot)
            update_arrays(L, param[1 - cur], m[1 - cur], v[1 - cur], param[cur], m[cur], v[cur], grad, gdt, out,
                          it + 1, threads);
        else
            update_arrays(L, param[0], m[0], v[0], NULL, NULL, NULL, grad, gdt, out, it + 1, threads);
        double dt = now() - t0;
        if (two_slot)
            cur = 1 - cur;
        if (it > 0 && dt < best) /* the first one takes the pages */
            best = dt;
    }
    for (int s = 0; s < 1 + two_slot; s++) {
        free(param[s]);
        free(m[s]);
        free(v[s]);
    }
    free(grad);
    free(out);
    return best;
}

/* How bench_server's pull thread moves every block into the worker's weights beside the commit. */
enum pull_mode {
    PULLS_NONE = 0,
    PULLS_SLOT = 1,     /* into a 16 MiB slot, then copied out of it */
    PULLS_IN_PLACE = 2, /* straight into the weights */
    PULLS_STANDING = 3, /* standing in the weights: the update writes them there */
};

#define SLOT_BYTES ((size_t)16 << 20) /* ZT_STATE_CLIENT_SHM_SLOT_BYTES */

/* The pull thread of one commit: every block of `step` in order, as soon as the update has it. */
struct puller {
    zt_server_core *core;
    const layout *L;
    int64_t step;
    enum pull_mode mode;
    unsigned short *weights; /* L->n bf16 */
    unsigned short *slot;    /* SLOT_BYTES */
    double t_done;
};

/* The place (id 1) of the standing pulls: the weights of the puller. */
static void *place_get(void *user, uint64_t id, uint64_t off, uint64_t len)
{
    struct puller *p = user;
    return id == 1 && off + len <= p->L->n * 2 ? (char *)p->weights + off : NULL;
}

static void place_put(void *user, uint64_t id)
{
    (void)user;
    (void)id;
}

static void *pull_main(void *arg)
{
    struct puller *p = arg;
    const uint64_t bn = p->L->block_numel, per = SLOT_BYTES / 2;
    zt_err err = {{0}};
    for (int b = 0; b < p->L->nblocks; b++) {
        unsigned short *dst = p->weights + (uint64_t)b * bn;
        if (p->mode == PULLS_STANDING) {
            bool delivered;
            if (zt_server_core_pull_standing(p->core, "bench", p->step, b, 0, 0, bn, dst, 1, (uint64_t)b * bn * 2,
                                             600000, &delivered, &err) != 0)
                die("pull", &err);
            continue;
        }
        for (uint64_t off = 0; off < bn; off += p->mode == PULLS_SLOT ? per : bn) {
            const uint64_t k = p->mode == PULLS_SLOT && bn - off > per ? per : bn - off;
            void *into = p->mode == PULLS_SLOT ? (void *)p->slot : (void *)(dst + off);
            if (zt_server_core_pull(p->core, "bench", p->step, b, 0, off, k, into, 600000, &err) != 0)
                die("pull", &err);
            if (p->mode == PULLS_SLOT)
                memcpy(dst + off, p->slot, k * 2);
        }
    }
    p->t_done = now();
    return NULL;
}

/* Times `iters` commits of a run of the layout on a RAM-tier core, with the pulls of `mode` beside each; the
 * best push time of a step goes into *push_s, the best time from a commit's start to its last pulled block
 * into *pulled_s (with pulls). Returns the best seconds of the commit's update (its own clock,
 * zt_server_commit_result.seconds). */
static double bench_server(const layout *L, enum zt_dtype gdt, int threads, int iters, enum pull_mode mode,
                           double *push_s, double *pulled_s)
{
    zt_err err = {{0}};
    zt_server_core *core;
    zt_server_core_options o = {.threads = threads};
    if (zt_server_core_create(&core, &o, &err) != 0)
        die("zt_server_core_create", &err);
    zt_server_range *ranges = calloc((size_t)L->nblocks * NT, sizeof(*ranges));
    zt_server_block_desc *blocks = calloc((size_t)L->nblocks, sizeof(*blocks));
    for (int b = 0; b < L->nblocks; b++) {
        int nd = 0;
        uint64_t off = 0;
        zt_server_range *r = ranges + (size_t)b * NT;
        for (int t = 0; t < NT; t++) {
            if (L->tdecay[t])
                r[nd++] = (zt_server_range){off, off + L->tn[t]};
            off += L->tn[t];
        }
        blocks[b] = (zt_server_block_desc){.numel = L->block_numel, .decay = r, .ndecay = nd};
    }
    zt_server_run_desc d = {.run_id = "bench", .world_size = 1, .nblocks = L->nblocks, .blocks = blocks,
                            .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .param_dtype = ZT_DTYPE_BF16};
    if (zt_server_core_register(core, &d, NULL, &err) != 0)
        die("register", &err);
    uint64_t bn = L->block_numel;
    float *init = malloc(bn * 4);
    void *grad = huge_calloc(bn, zt_dtype_size(gdt)); /* one block's gradient, pushed as every block's */
    if (!init)
        die("out of memory", NULL);
    for (uint64_t i = 0; i < bn; i++)
        init[i] = 0.01f * (float)(i % 1000);
    fill_grad(grad, gdt, bn, 0);
    for (int b = 0; b < L->nblocks; b++) {
        zt_server_chunk c = {.block = b, .shard = 0, .offset = 0, .n = bn, .dtype = ZT_DTYPE_F32, .data = init};
        if (zt_server_core_push_params(core, "bench", &c, &err) != 0)
            die("push_params", &err);
    }
    struct puller pl = {.core = core, .L = L, .mode = mode};
    if (mode != PULLS_NONE) {
        pl.weights = (unsigned short *)huge_calloc(L->n, 2);
        pl.slot = (unsigned short *)huge_calloc(SLOT_BYTES / 2, 2);
    }
    const zt_server_pull_places places = {.get = place_get, .put = place_put, .user = &pl};
    if (mode == PULLS_STANDING)
        zt_server_core_set_pull_places(core, &places);
    double best = 1e30, best_push = 1e30, best_pulled = 1e30;
    for (int it = 0; it <= iters; it++) {
        double t0 = now();
        for (int b = 0; b < L->nblocks; b++) {
            zt_server_chunk c = {.block = b, .shard = 0, .offset = 0, .n = bn, .dtype = gdt, .data = grad};
            if (zt_server_core_push_grad(core, "bench", it + 1, &c, &err) != 0)
                die("push_grad", &err);
        }
        double tp = now() - t0;
        pthread_t th;
        pl.step = it + 1;
        if (mode != PULLS_NONE && pthread_create(&th, NULL, pull_main, &pl) != 0)
            die("cannot start the pull thread", NULL);
        zt_server_commit_args a = {.step = it + 1, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-4f};
        zt_server_commit_result res;
        const double tc = now();
        if (zt_server_core_commit(core, "bench", &a, &res, &err) != 0)
            die("commit", &err);
        if (mode != PULLS_NONE)
            pthread_join(th, NULL);
        if (it > 0 && res.seconds < best)
            best = res.seconds;
        if (it > 0 && tp < best_push)
            best_push = tp;
        if (it > 0 && mode != PULLS_NONE && pl.t_done - tc < best_pulled)
            best_pulled = pl.t_done - tc;
    }
    *push_s = best_push;
    *pulled_s = best_pulled;
    zt_server_core_destroy(core);
    free(pl.weights);
    free(pl.slot);
    free(init);
    free(grad);
    free(ranges);
    free(blocks);
    return best;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s N_MILLIONS THREADS[,THREADS...] [f32|bf16] [ITERS] [n_embd] [COPY_THREADS]\n",
                argv[0]);
        return 2;
    }
    double want = atof(argv[1]) * 1e6;
    const char *tlist = argv[2];
    enum zt_dtype gdt = argc > 3 && strcmp(argv[3], "bf16") == 0 ? ZT_DTYPE_BF16 : ZT_DTYPE_F32;
    int iters = argc > 4 ? atoi(argv[4]) : 4;
    uint64_t c = argc > 5 ? (uint64_t)atoll(argv[5]) : 1600; /* GPT-2 1558M's width */
    int copiers = argc > 6 ? atoi(argv[6]) : 0;
    if (want < 1 || iters < 1 || c < 8 || copiers < 0 || copiers > 64) {
        fprintf(stderr, "bench_server_update: give N_MILLIONS > 0, ITERS >= 1, n_embd >= 8 and 0 to 64 copy threads\n");
        return 2;
    }
    layout L = {0};
    layer_tensors(c, L.tn, L.tdecay);
    for (int t = 0; t < NT; t++)
        L.block_numel += L.tn[t];
    L.nblocks = (int)(want / (double)L.block_numel + 0.5);
    if (L.nblocks < 1)
        L.nblocks = 1;
    L.n = (uint64_t)L.nblocks * L.block_numel;
    double bytes = (double)L.n * (24.0 + (double)zt_dtype_size(gdt) + 2.0);
    printf("bench_server_update: %d layers of n_embd %llu, %.1fM parameters, %s gradient, bf16 output, isa %s, "
           "best of %d updates, %d copy threads beside\n", L.nblocks, (unsigned long long)c, (double)L.n / 1e6,
           zt_dtype_name(gdt), zt_cpu_adam_isa_name(zt_cpu_adam_get_isa()), iters, copiers);
    pthread_t copy_th[64];
    for (int k = 0; k < copiers; k++)
        if (pthread_create(&copy_th[k], NULL, copy_main, NULL) != 0)
            die("cannot start a copy thread", NULL);
    enum { PER = 10 }; /* rows per thread count, the embedded one first */
    struct row {
        const char *variant;
        int threads;
        double s;
    } rows[64];
    int nrows = 0;
    char *tl = strdup(tlist);
    for (char *tok = strtok(tl, ","); tok && nrows + PER <= 64; tok = strtok(NULL, ",")) {
        int th = atoi(tok);
        double push = 0, pulled = 0, slot_s, place_s;
        rows[nrows++] = (struct row){"embedded (in place)", th, bench_arrays(&L, gdt, th, iters, 0)};
        rows[nrows++] = (struct row){"two-slot kernel (arrays)", th, bench_arrays(&L, gdt, th, iters, 1)};
        rows[nrows++] = (struct row){"server core commit", th, bench_server(&L, gdt, th, iters, PULLS_NONE, &push,
                                                                            &pulled)};
        rows[nrows++] = (struct row){"server core push (memcpy)", th, push};
        slot_s = bench_server(&L, gdt, th, iters, PULLS_SLOT, &push, &pulled);
        rows[nrows++] = (struct row){"server commit beside pulls through a slot", th, slot_s};
        rows[nrows++] = (struct row){"server commit + pulls through a slot", th, pulled};
        place_s = bench_server(&L, gdt, th, iters, PULLS_IN_PLACE, &push, &pulled);
        rows[nrows++] = (struct row){"server commit beside pulls in place", th, place_s};
        rows[nrows++] = (struct row){"server commit + pulls in place", th, pulled};
        place_s = bench_server(&L, gdt, th, iters, PULLS_STANDING, &push, &pulled);
        rows[nrows++] = (struct row){"server commit writing standing pulls", th, place_s};
        rows[nrows++] = (struct row){"server commit + pulls standing", th, pulled};
        for (int k = nrows - PER; k < nrows; k++)
            printf("bench_server_update variant=\"%s\" threads=%d best_s=%.4f ns_param=%.3f gb_s=%.2f\n",
                   rows[k].variant, rows[k].threads, rows[k].s, 1e9 * rows[k].s / (double)L.n, bytes / rows[k].s / 1e9);
        fflush(stdout);
    }
    free(tl);
    atomic_store(&g_copy_stop, 1);
    for (int k = 0; k < copiers; k++)
        pthread_join(copy_th[k], NULL);
    printf("\n| variant | threads | best s | ns / parameter | GB/s (%.0f B/param) | vs embedded |\n",
           24.0 + (double)zt_dtype_size(gdt) + 2.0);
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < nrows; k++) {
        double base = rows[k - k % PER].s;
        printf("| %s | %d | %.4f | %.3f | %.2f | %.2fx |\n", rows[k].variant, rows[k].threads, rows[k].s,
               1e9 * rows[k].s / (double)L.n, bytes / rows[k].s / 1e9, rows[k].s / base);
    }
    return 0;
}
