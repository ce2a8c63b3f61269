/* Tests of the training engine (worker/engine/engine.h) on the CPU with real processes on the
 * shared-memory backend, against the whole-model math (zt_gpt2_forward/backward + zt_optimizer_step) on a
 * tiny GPT-2 whose block sizes W = 3 and 4 do not divide:
 *   - W = 1, 2, 3, 4 give the reference losses within 1e-5 relative over 20 steps (grad_accum 2), and W = 1
 *     gives them bit for bit;
 *   - ZeRO-2 equals ZeRO-3, and activation checkpointing (all, every:2) equals none, bit for bit;
 *   - a state saved at W = 4 in the trainer's checkpoint format resumes at W = 2 and W = 1 on the same
 *     loss curve;
 *   - `ztrain train` at W = 2 gives the losses of one process.
 * Rank r of W takes rows r*B/W .. (r+1)*B/W-1 of every global micro-batch of B rows. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/cpu_threads.h"
#include "common/fileio.h"
#include "worker/comm/comm.h"
#include "worker/engine/engine.h"
#include "worker/engine/optimizer.h"
#include "worker/models/gpt2.h"
#include "worker/models/model.h"
#include "worker/train/checkpoint.h"
#include "worker/train/plan.h"
#include "worker/train/trainer.h"

#include "../worker/train_fixture.h"

#define STEPS 20
#define GB 12 /* global micro-batch rows: divisible by 1, 2, 3 and 4 */
#define T 8
#define ACCUM 2
#define LR 1e-2f
#define MAX_W 4

static zt_gpt2_config tiny_config(void)
{
    zt_gpt2_config c;
    zt_gpt2_config_default(&c);
    c.n_layer = 3;
    c.n_head = 2;
    c.n_embd = 10;
    c.n_positions = 16;
    c.vocab_size = 37; /* block sizes 530, 1340 and 20: none divisible by 3 or 4 */
    return c;
}

/* The global micro-batch `micro` of step `step`: tokens and next-token targets, a fixed pseudo-random
 * function so every run and every rank sees the same data. */
static void global_batch(int step, int micro, int32_t *tok, int32_t *tgt)
{
    for (int r = 0; r < GB; r++) {
        uint32_t h = (uint32_t)(step * 131 + micro * 17 + r * 7 + 1);
        int32_t prev = (int32_t)(h % 37u);
        for (int t = 0; t < T; t++) {
            h = h * 1103515245u + 12345u;
            int32_t next = (int32_t)((prev * 3 + (h >> 16) % 5) % 37);
            tok[r * T + t] = prev;
            tgt[r * T + t] = next;
            prev = next;
        }
    }
}

static zt_optimizer_report dummy_report;

/* The single-process trainer's math: losses[s] of steps 0..STEPS-1. */
static void reference_losses(float *losses)
{
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_gpt2_create(&m, &c, GB, T, 7, &err), 0);
    zt_optimizer opt;
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    assert_int_equal(zt_optimizer_init(&opt, zt_gpt2_num_params(m), eo.beta1, eo.beta2, eo.eps, eo.weight_decay,
                                       eo.grad_clip, &err),
                     0);
    int32_t tok[GB * T], tgt[GB * T];
    for (int s = 0; s < STEPS; s++) {
        zt_gpt2_zero_grad(m);
        double sum = 0;
        for (int a = 0; a < ACCUM; a++) {
            global_batch(s, a, tok, tgt);
            sum += zt_gpt2_forward(m, tok, tgt, GB, T);
            zt_gpt2_backward(m, 1.0f / ACCUM);
        }
        losses[s] = (float)(sum / ACCUM);
        assert_int_equal(zt_optimizer_step(&opt, zt_gpt2_params(m), zt_gpt2_grads(m), zt_gpt2_tensor(m, 0),
                                       zt_gpt2_num_tensors(m), losses[s], LR, &dummy_report, &err), 0);
    }
    zt_optimizer_free(&opt);
    zt_gpt2_destroy(m);
}

typedef struct job {
    int W;
    int accum;              /* micro-batches per step */
    int level;
    const char *ckpt;       /* checkpoint policy */
    int first, last;        /* steps first..last-1 */
    const char *load_dir;   /* resume from this checkpoint before step `first`, or NULL */
    const char *save_dir;   /* rank 0 saves a checkpoint here after step last-1, or NULL */
    bool stream;            /* weights streamed from the host arrays (the GPU's offload layout on the CPU) */
    bool bf16_moments;      /* Adam moments in bf16 (stochastic rounding) */
    const char *moments_dir; /* Adam moments on disk here (streamed weights), or NULL */
    int grad_chunk;         /* streamed: the gradient leaves in pieces of this many elements per rank (0: blocks) */
    bool stream_masters;    /* streamed: the weights come up as the fp32 masters, in pieces of grad_chunk */
    double moments_ram;     /* moments on disk: this fraction of this rank's moments may stay in host memory
                               (0 < f < 1: checked to split the blocks between RAM and disk) */
    bool masters_disk;      /* moments on disk: the fp32 masters too, but for the share masters_ram of them */
    double masters_ram;     /* masters_disk: this fraction of this rank's masters may stay in host memory */
    bool grad_accum_host;   /* the middle micro-batches' gradients are added on the host */
    const char *stream_dir; /* state on disk, with save_dir: a checkpoint streamed from the records
                               (zt_engine_export_stream into zt_checkpoint_begin/put/finish) here too */
    bool stream_load;       /* with load_dir: the checkpoint read into an engine created empty, tensor by tensor
                               (zt_checkpoint_open into zt_engine_import_stream), not loaded into host arrays */
    bool no_read_ahead;     /* moments on disk: every update starts with a cold read (moments_no_read_ahead) */
} job;

/* A job of W ranks with the defaults the tests vary from: ACCUM micro-batches, ZeRO-3, no checkpointing,
 * steps 0..STEPS-1 from the same initialisation, resident weights, fp32 moments in host memory. */
static job job_of(int W)
{
    return (job){.W = W, .accum = ACCUM, .level = 3, .ckpt = "none", .first = 0, .last = STEPS};
}

#define FAIL(...)                                                                                          \
    do {                                                                                                   \
        fprintf(stderr, __VA_ARGS__);                                                                      \
        fprintf(stderr, "\n");                                                                             \
        _exit(1);                                                                                          \
    } while (0)

/* The layers a checkpointing policy ("none", "all", "every:K") drops activations of, out of n_layer. */
static void ckpt_layers(const char *policy, bool *out, int n_layer)
{
    int every = strncmp(policy, "every:", 6) == 0 ? atoi(policy + 6) : 0;
    for (int l = 0; l < n_layer; l++)
        out[l] = strcmp(policy, "all") == 0 || (every > 0 && l % every == 0);
}

/* The leading blocks whose moments stay in host memory (the others' records are on disk). */
static int pl_mram_blocks(const zt_model *model, int W, const zt_engine_options *eo)
{
    zt_engine_plan pl;
    zt_engine_plan_for(model, W, eo, &pl);
    return pl.moments_ram_blocks;
}

/* One rank of a job; writes its step losses (rank 0 only) to fd and exits. */
static void rank_main(const job *j, int rank, const char *name, int fd)
{
    zt_err err = {{0}};
    zt_cpu_set_threads(1);
    zt_comm_options co;
    zt_comm_options_init(&co);
    co.rank = rank;
    co.world_size = j->W;
    co.join_timeout_s = 30;
    co.timeout_s = 60;
    snprintf(co.name, sizeof co.name, "%s", name);
    zt_comm *comm = NULL;
    if (zt_comm_create(&comm, &co, &err) < 0)
        FAIL("rank %d: %s", rank, err.msg);
    const int b = GB / j->W;
    zt_family_config fc;
    zt_family_config_default(&fc);
    (*ZT_GPT2_CONFIG(&fc)) = tiny_config();
    zt_family_model *fm = NULL;
    if (zt_family_model_create(&fm, &fc, b, T, 7, &err) < 0)
        FAIL("%s", err.msg);
    bool ck[8];
    ckpt_layers(j->ckpt, ck, ZT_GPT2_CONFIG(&fc)->n_layer);
    zt_model *model = NULL;
    if (zt_family_model_cpu(&model, fm, j->accum, ck, &err) < 0)
        FAIL("%s", err.msg);
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    eo.zero_level = j->level;
    eo.grad_accum = j->accum;
    eo.stream = j->stream;
    eo.moment_dtype = j->bf16_moments ? ZT_DTYPE_BF16 : ZT_DTYPE_F32;
    eo.moments_dir = j->moments_dir;
    eo.grad_chunk = (size_t)j->grad_chunk;
    eo.stream_masters = j->stream_masters;
    if (j->moments_ram > 0) {
        const size_t msize = j->bf16_moments ? 2 : 4;
        eo.moments_ram_bytes = (size_t)(j->moments_ram * 2.0 * (double)msize *
                                        (double)(zt_family_model_num_params(fm) / (size_t)j->W));
        zt_engine_plan pl;
        zt_engine_plan_for(model, j->W, &eo, &pl);
        const int nb = model->nblocks;
        if (j->moments_ram < 1.0 && (pl.moments_ram_blocks <= 0 || pl.moments_ram_blocks >= nb))
            FAIL("moments_ram %.2f keeps %d of %d blocks' moments in RAM: not a split", j->moments_ram,
                 pl.moments_ram_blocks, nb);
    }
    eo.grad_accum_host = j->grad_accum_host;
    eo.moments_no_read_ahead = j->no_read_ahead;
    if (j->masters_disk) {
        eo.masters_disk = true;
        eo.masters_ram_bytes = (size_t)(j->masters_ram * 4.0 * (double)(zt_family_model_num_params(fm) / (size_t)j->W));
        zt_engine_plan pl;
        zt_engine_plan_for(model, j->W, &eo, &pl);
        if (pl.masters_ram_blocks >= model->nblocks || (j->masters_ram > 0 && pl.masters_ram_blocks == 0))
            FAIL("masters_ram %.2f keeps %d of %d blocks' masters in RAM", j->masters_ram, pl.masters_ram_blocks,
                 model->nblocks);
    }
    if (j->grad_accum_host) {
        zt_engine_plan pl;
        zt_engine_plan_for(model, j->W, &eo, &pl);
        if (!pl.grad_accum_host)
            FAIL("grad_accum_host does not apply to W=%d grad_accum %d grad_chunk %d", j->W, j->accum, j->grad_chunk);
    }
    zt_optimizer full;
    if (zt_optimizer_init(&full, zt_family_model_num_params(fm), eo.beta1, eo.beta2, eo.eps, eo.weight_decay, eo.grad_clip,
                          &err) < 0)
        FAIL("%s", err.msg);
    zt_ckpt_state st;
    memset(&st, 0, sizeof st);
    zt_ckpt_reader *reader = NULL;
    if (j->load_dir && j->stream_load && zt_checkpoint_open(j->load_dir, fm, &full, &st, &reader, &err) < 0)
        FAIL("rank %d: %s", rank, err.msg);
    if (j->load_dir && !j->stream_load && zt_checkpoint_load(j->load_dir, fm, &full, &st, &err) < 0)
        FAIL("rank %d: %s", rank, err.msg);
    if (j->load_dir && st.step != j->first)
        FAIL("checkpoint is at step %lld, expected %d", (long long)st.step, j->first);
    zt_engine *e = NULL;
    if (zt_engine_create(&e, model, comm, &eo, reader ? NULL : zt_family_model_params(fm), &err) < 0)
        FAIL("%s", err.msg);
    if (reader) {
        /* the engine's staging is this rank's masters, m and v of its largest block: 3 fp32 shards */
        size_t S = 0;
        for (int k = 0; k < model->nblocks; k++) {
            const size_t padded = (model->block_len[k] + (size_t)j->W - 1) / (size_t)j->W * (size_t)j->W;
            S = padded / (size_t)j->W > S ? padded / (size_t)j->W : S;
        }
        zt_engine_plan pl;
        zt_engine_plan_for(model, j->W, &eo, &pl);
        if (zt_engine_import_stream_bytes(e) != 12 * S || pl.import_stream_bytes != 12 * S)
            FAIL("streamed import: %zu bytes of staging (plan %zu), expected %zu", zt_engine_import_stream_bytes(e),
                 pl.import_stream_bytes, 12 * S);
        /* nothing else holds the weights: the slab the engine was not created from reads as zeros */
        zt_family_model_release_params(fm);
        if (zt_engine_import_stream(e, zt_checkpoint_read, reader, &err) < 0)
            FAIL("rank %d: %s", rank, err.msg);
        zt_checkpoint_close(reader);
    } else if (j->load_dir && zt_engine_import(e, zt_family_model_params(fm), full.m, full.v, &err) < 0) {
        FAIL("%s", err.msg);
    }
    if (rank == 0)
        zt_engine_log_plan(e);
    int32_t tok[GB * T], tgt[GB * T];
    for (int s = j->first; s < j->last; s++) {
        for (int a = 0; a < j->accum; a++) {
            global_batch(s, a, tok, tgt);
            if (zt_engine_micro(e, tok + rank * b * T, tgt + rank * b * T, b, T, NULL, a, 1.0f / (j->accum * j->W), 1.0f,
                                &err) < 0)
                FAIL("rank %d step %d: %s", rank, s, err.msg);
        }
        zt_engine_step_result sr;
        if (zt_engine_step(e, LR, full.adam_step + 1, &sr, &err) < 0)
            FAIL("%s", err.msg);
        zt_optimizer_report rep;
        if (zt_optimizer_account(&full, sr.loss, sr.grad_norm, sr.skipped, &rep, &err) < 0)
            FAIL("%s", err.msg);
        if (rank == 0 && write(fd, &sr.loss, sizeof sr.loss) != (ssize_t)sizeof sr.loss)
            FAIL("cannot write the loss");
        zt_engine_timing tm;
        zt_engine_last_timing(e, &tm);
        /* streamed: every pass copies this rank's shards up from the host arrays, and nothing else does */
        if (j->stream != (tm.bytes_up > 0))
            FAIL("rank %d step %d: %llu bytes copied up with stream %d", rank, s, (unsigned long long)tm.bytes_up,
                 (int)j->stream);
        /* state on disk: from the third step on, the last finished update is at least the second, which found the
         * first two records on disk read ahead by the update before it (none with no_read_ahead) */
        const int on_disk = j->moments_dir ? model->nblocks - pl_mram_blocks(model, j->W, &eo) : 0;
        const int want_ahead = j->no_read_ahead ? 0 : on_disk < 2 ? on_disk : 2;
        if (on_disk > 0 && s - j->first >= 3 && (!tm.disk || tm.disk_read_ahead != want_ahead))
            FAIL("rank %d step %d: the update found %d records read ahead, expected %d", rank, s, tm.disk_read_ahead,
                 want_ahead);
    }
    if (j->save_dir) {
        if (zt_engine_export(e, zt_family_model_params(fm), full.m, full.v, &err) < 0)
            FAIL("%s", err.msg);
        if (rank == 0) {
            zt_train_config cfg;
            zt_train_config_init(&cfg);
            cfg.model = fc;
            cfg.model_loaded = true;
            cfg.steps = STEPS;
            st.step = j->last;
            st.adam_step = full.adam_step;
            if (zt_checkpoint_save(j->save_dir, fm, &full, &cfg, &st, NULL, 0, &err) < 0)
                FAIL("%s", err.msg);
        }
        if (zt_comm_barrier(comm, NULL, &err) < 0)
            FAIL("%s", err.msg);
    }
    if (j->stream_dir) {
        /* the engine's staging is a few blocks: 3 fp32 shards, and at W > 1 the 3 gathered blocks */
        size_t S = 0, Pb = 0;
        for (int k = 0; k < model->nblocks; k++) {
            const size_t padded = (model->block_len[k] + (size_t)j->W - 1) / (size_t)j->W * (size_t)j->W;
            Pb = padded > Pb ? padded : Pb;
            S = padded / (size_t)j->W > S ? padded / (size_t)j->W : S;
        }
        const size_t want = 12 * (S + (j->W > 1 ? Pb : 0));
        zt_engine_plan pl;
        zt_engine_plan_for(model, j->W, &eo, &pl);
        if (!zt_engine_exports_streamed(e) || zt_engine_export_stream_bytes(e) != want || pl.export_stream_bytes != want)
            FAIL("streamed export: %zu bytes of staging (plan %zu), expected %zu", zt_engine_export_stream_bytes(e),
                 pl.export_stream_bytes, want);
        zt_ckpt_writer *w = NULL;
        if (rank == 0 && zt_checkpoint_begin(j->stream_dir, fm, j->last, &w, &err) < 0)
            FAIL("%s", err.msg);
        if (zt_engine_export_stream(e, w ? zt_checkpoint_put : NULL, w, &err) < 0)
            FAIL("rank %d: %s", rank, err.msg);
        if (rank == 0) {
            zt_train_config cfg;
            zt_train_config_init(&cfg);
            cfg.model = fc;
            cfg.model_loaded = true;
            cfg.steps = STEPS;
            st.step = j->last;
            st.adam_step = full.adam_step;
            if (zt_checkpoint_finish(w, NULL, &cfg, &st, NULL, 0, &err) < 0)
                FAIL("%s", err.msg);
        }
        if (zt_comm_barrier(comm, NULL, &err) < 0)
            FAIL("%s", err.msg);
    }
    zt_engine_destroy(e);
    model->ops->destroy(model);
    zt_optimizer_free(&full);
    zt_family_model_destroy(fm);
    zt_comm_destroy(comm);
    _exit(0);
}

static int job_counter;

/* Runs a job with W processes; returns the losses of steps first..last-1 in losses. */
static void run(const job *j, float *losses)
{
    char name[32];
    snprintf(name, sizeof name, "z%d-%d", (int)getpid(), job_counter++);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pids[MAX_W];
    fflush(NULL);
    for (int r = 0; r < j->W; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            close(fds[0]);
            rank_main(j, r, name, fds[1]);
        }
    }
    close(fds[1]);
    size_t want = (size_t)(j->last - j->first) * sizeof(float), got = 0;
    while (got < want) {
        ssize_t n = read(fds[0], (char *)losses + got, want - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fds[0]);
    for (int r = 0; r < j->W; r++) {
        int st;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("W=%d rank %d failed (status %d)", j->W, r, st);
    }
    assert_int_equal(got, want);
}

static void assert_close(const float *a, const float *ref, int n, double rel, const char *what)
{
    for (int s = 0; s < n; s++) {
        double d = fabs((double)a[s] - (double)ref[s]) / fabs((double)ref[s]);
        if (!(d <= rel))
            fail_msg("%s: step %d loss %.9g vs reference %.9g (relative %.3g > %.3g)", what, s, a[s], ref[s], d, rel);
    }
}

/* Removes a test's temporary directory and what it holds. */
static void remove_dir(const char *dir)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static float ref[STEPS];

static int setup(void **state)
{
    (void)state;
    zt_cpu_set_threads(1);
    reference_losses(ref);
    return 0;
}

static void test_equivalence_w1_to_w4(void **state)
{
    (void)state;
    /* The losses must change over the run, or the comparison would prove little. */
    print_message("reference loss: step 1 %.4f, step %d %.4f\n", ref[0], STEPS, ref[STEPS - 1]);
    assert_true(ref[STEPS - 1] < 0.95f * ref[0]);
    for (int W = 1; W <= MAX_W; W++) {
        float l[STEPS];
        job j = job_of(W);
        run(&j, l);
        char what[32];
        snprintf(what, sizeof what, "W=%d", W);
        assert_close(l, ref, STEPS, 1e-5, what);
        if (W == 1)
            assert_memory_equal(l, ref, sizeof l); /* one rank is the whole-model math */
    }
}

static void test_zero2_equals_zero3_and_checkpointing(void **state)
{
    (void)state;
    float l3[STEPS], l2[STEPS], lall[STEPS], levery[STEPS];
    job j3 = job_of(3);
    job j2 = job_of(3);
    j2.level = 2;
    job jall = job_of(3);
    jall.ckpt = "all";
    job jevery = job_of(2);
    jevery.level = 2;
    jevery.ckpt = "every:2";
    run(&j3, l3);
    run(&j2, l2);
    run(&jall, lall);
    run(&jevery, levery);
    assert_memory_equal(l2, l3, sizeof l3);   /* the level changes memory, not math */
    assert_memory_equal(lall, l3, sizeof l3); /* recomputation is exact */
    assert_close(levery, ref, STEPS, 1e-5, "W=2 level 2 every:2");
    /* one micro-batch per step: block buffers taken in turn from a ring, the head's kept apart */
    float o1[STEPS], o3[STEPS], o3c[STEPS];
    job one1 = job_of(1);
    one1.accum = 1;
    job one3 = job_of(3);
    one3.accum = 1;
    job one3c = job_of(3);
    one3c.accum = 1;
    one3c.level = 2;
    one3c.ckpt = "all";
    run(&one1, o1);
    run(&one3, o3);
    run(&one3c, o3c);
    assert_close(o3, o1, STEPS, 1e-5, "W=3 grad_accum 1");
    assert_memory_equal(o3c, o3, sizeof o3);
}

/* Weights streamed from host memory (the layout of a GPU whose weights do not fit, run here on CPU ranks):
 * each rank copies only its own shard of a block up and the all-gather assembles the block; the gradient
 * is reduce-scattered per micro-batch into the host arrays, where the host thread runs AdamW. The same
 * losses as the resident layout. */
static void test_streamed_weights(void **state)
{
    (void)state;
    for (int W = 1; W <= 3; W++) {
        float l[STEPS];
        job j = job_of(W);
        j.stream = true;
        run(&j, l);
        char what[48];
        snprintf(what, sizeof what, "W=%d streamed", W);
        assert_close(l, ref, STEPS, 1e-5, what);
    }
    /* the gradient in pieces (each rank's shard cut in pieces of 100 elements, the matching pieces of all
     * ranks reduce-scattered together), W = 2 and 3, two micro-batches per step: against whole blocks */
    for (int W = 2; W <= 3; W++) {
        float whole[STEPS], pieces[STEPS];
        job jw = job_of(W);
        jw.stream = true;
        job jp = job_of(W);
        jp.stream = true;
        jp.grad_chunk = 100;
        run(&jw, whole);
        run(&jp, pieces);
        char what[48];
        snprintf(what, sizeof what, "W=%d streamed, gradient in pieces", W);
        assert_close(pieces, whole, STEPS, 1e-6, what);
    }
    /* one micro-batch per step, and with recomputation: against the resident layout of the same W */
    float res[STEPS], st[STEPS], stc[STEPS];
    job jres = job_of(3);
    jres.accum = 1;
    job jst = job_of(3);
    jst.accum = 1;
    jst.stream = true;
    job jstc = job_of(3);
    jstc.accum = 1;
    jstc.ckpt = "all";
    jstc.stream = true;
    run(&jres, res);
    run(&jst, st);
    run(&jstc, stc);
    assert_close(st, res, STEPS, 1e-5, "W=3 grad_accum 1 streamed vs resident");
    assert_memory_equal(stc, st, sizeof st); /* recomputation is exact */
    /* resumed from a checkpoint of a resident run, streamed at another W */
    char dir[] = "/tmp/zt_zero_stream_XXXXXX";
    assert_non_null(mkdtemp(dir));
    float first[STEPS], rest[STEPS];
    job save = job_of(2);
    save.last = STEPS / 2;
    save.save_dir = dir;
    run(&save, first);
    char ckpt[PATH_MAX];
    zt_err err = {{0}};
    assert_int_equal(zt_checkpoint_find(dir, ckpt, sizeof ckpt, &err), 0);
    job load = job_of(3);
    load.first = STEPS / 2;
    load.load_dir = ckpt;
    load.stream = true;
    run(&load, rest);
    assert_close(first, ref, STEPS / 2, 1e-5, "resident W=2 before the checkpoint");
    assert_close(rest, ref + STEPS / 2, STEPS - STEPS / 2, 1e-5, "streamed W=3 after resuming");
    /* the same resume with the masters streamed: the same bits */
    float rest_m[STEPS];
    job load_m = load;
    load_m.stream_masters = true;
    run(&load_m, rest_m);
    assert_memory_equal(rest_m, rest, sizeof(float) * (STEPS - STEPS / 2));
    remove_dir(dir);
}

/* bf16 Adam moments: the losses follow the fp32 moments' closely but not exactly; the host arrays of the
 * streamed layout and the CPU's own give the same; a checkpoint (moments widened to fp32 and rounded back,
 * exactly) resumes on the same bits as the run that did not stop. */
static void test_bf16_moments(void **state)
{
    (void)state;
    float l1[STEPS], l2[STEPS], ls[STEPS];
    job j1 = job_of(1);
    j1.bf16_moments = true;
    job j2 = job_of(2);
    j2.accum = 1;
    j2.bf16_moments = true;
    job js = job_of(2);
    js.accum = 1;
    js.stream = true;
    js.bf16_moments = true;
    run(&j1, l1);
    run(&j2, l2);
    run(&js, ls);
    /* the rounding of the moments drifts the curve a little (measured up to 0.2% at step 17 of 20) */
    assert_close(l1, ref, STEPS, 1e-2, "W=1 bf16 moments against fp32");
    assert_true(l1[STEPS - 1] < 0.95f * l1[0]);
    assert_true(memcmp(l1, ref, sizeof l1) != 0); /* the moments really are bf16 */
    assert_close(ls, l2, STEPS, 1e-5, "W=2 bf16 moments, streamed against resident");
    char dir[] = "/tmp/zt_zero_bf16_XXXXXX";
    assert_non_null(mkdtemp(dir));
    float first[STEPS], rest[STEPS];
    job save = job_of(2);
    save.accum = 1;
    save.last = STEPS / 2;
    save.save_dir = dir;
    save.bf16_moments = true;
    run(&save, first);
    assert_memory_equal(first, l2, sizeof(float) * (STEPS / 2));
    char ckpt[PATH_MAX];
    zt_err err = {{0}};
    assert_int_equal(zt_checkpoint_find(dir, ckpt, sizeof ckpt, &err), 0);
    job load = job_of(2);
    load.accum = 1;
    load.first = STEPS / 2;
    load.load_dir = ckpt;
    load.bf16_moments = true;
    run(&load, rest);
    assert_memory_equal(rest, l2 + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2));
    remove_dir(dir);
}

/* One rank in this process (the self backend) and a tiny GPT-2 of width n_embd on the CPU, for the tests
 * that drive an engine directly. */
typedef struct solo {
    zt_comm *comm;
    zt_family_model *fm;
    zt_model *model;
} solo;

static solo solo_open(int n_embd)
{
    solo s = {0};
    zt_err err = {{0}};
    zt_comm_options co;
    zt_comm_options_init(&co);
    co.rank = 0;
    co.world_size = 1;
    snprintf(co.name, sizeof co.name, "zs%d", (int)getpid());
    assert_int_equal(zt_comm_create(&s.comm, &co, &err), 0);
    zt_family_config fc;
    zt_family_config_default(&fc);
    (*ZT_GPT2_CONFIG(&fc)) = tiny_config();
    ZT_GPT2_CONFIG(&fc)->n_embd = n_embd;
    assert_int_equal(zt_family_model_create(&s.fm, &fc, GB, T, 7, &err), 0);
    bool ck_layers[8] = {false};
    assert_int_equal(zt_family_model_cpu(&s.model, s.fm, 1, ck_layers, &err), 0);
    return s;
}

static void solo_close(solo *s)
{
    s->model->ops->destroy(s->model);
    zt_family_model_destroy(s->fm);
    zt_comm_destroy(s->comm);
}

/* Adam moments on disk (an NVMe store in a temporary directory; buffered I/O where it has no O_DIRECT): the
 * host AdamW reads each block's record ahead and writes it behind, with the same bits as moments in host
 * memory, fp32 or bf16, all of them on disk or the leading blocks' in host memory; a checkpoint resumes on
 * them; a directory that does not exist is refused. */
static void test_moments_on_disk(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_mdisk_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int W = 1; W <= 2; W++) {
            float ram[STEPS], disk[STEPS];
            job jr = job_of(W);
            jr.stream = true;
            jr.bf16_moments = bf16;
            job jd = job_of(W);
            jd.stream = true;
            jd.bf16_moments = bf16;
            jd.moments_dir = dir;
            run(&jr, ram);
            run(&jd, disk);
            char what[64];
            snprintf(what, sizeof what, "W=%d %s moments on disk", W, bf16 ? "bf16" : "fp32");
            print_message("%s: last loss %.6f (in memory %.6f)\n", what, disk[STEPS - 1], ram[STEPS - 1]);
            assert_memory_equal(disk, ram, sizeof ram);
            /* the leading blocks' moments in host memory, the rest on disk: the same bits again */
            float split[STEPS];
            job js = jd;
            js.moments_ram = 0.5;
            run(&js, split);
            assert_memory_equal(split, ram, sizeof ram);
        }
    /* a checkpoint of a run with half of its moments on disk, resumed with all of them there and with
     * another split: the bits of the run that did not stop (bf16 moments: their rounding follows the rank,
     * so the same W) */
    char ck[] = "/tmp/zt_zero_mdisk_ckpt_XXXXXX";
    assert_non_null(mkdtemp(ck));
    float whole[STEPS], first[STEPS], rest_disk[STEPS], rest_split[STEPS];
    job jw = job_of(2);
    jw.stream = true;
    jw.bf16_moments = true;
    jw.moments_dir = dir;
    job js = job_of(2);
    js.last = STEPS / 2;
    js.save_dir = ck;
    js.stream = true;
    js.bf16_moments = true;
    js.moments_dir = dir;
    js.moments_ram = 0.5;
    run(&jw, whole);
    run(&js, first);
    assert_memory_equal(first, whole, sizeof(float) * (STEPS / 2));
    char ckpt[PATH_MAX];
    zt_err err = {{0}};
    assert_int_equal(zt_checkpoint_find(ck, ckpt, sizeof ckpt, &err), 0);
    job jl = job_of(2);
    jl.first = STEPS / 2;
    jl.load_dir = ckpt;
    jl.stream = true;
    jl.bf16_moments = true;
    jl.moments_dir = dir;
    run(&jl, rest_disk);
    jl.moments_ram = 0.3;
    run(&jl, rest_split);
    assert_memory_equal(rest_disk, whole + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2));
    assert_memory_equal(rest_split, whole + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2));
    remove_dir(dir);
    remove_dir(ck);

    /* a directory that does not exist: refused at creation, naming it */
    solo so = solo_open(tiny_config().n_embd);
    zt_comm *comm = so.comm;
    zt_family_model *fm = so.fm;
    zt_model *model = so.model;
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    eo.stream = true;
    eo.moments_dir = "/nonexistent/zt_moments";
    zt_engine *e = NULL;
    int rc = zt_engine_create(&e, model, comm, &eo, zt_family_model_params(fm), &err);
    print_message("refusal: %s\n", err.msg);
    assert_true(rc < 0);
    assert_null(e);
    assert_non_null(strstr(err.msg, "/nonexistent/zt_moments"));
    /* ... and on disk with the optimizer on the device (no host arrays) */
    eo.stream = false;
    assert_int_equal(zt_engine_create(&e, model, comm, &eo, zt_family_model_params(fm), &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--optimizer cpu"));

    /* a record that goes bad between steps (a failing disk): the update that reads it stops, and the next
     * step returns the error naming the directory; nothing hangs, the engine is destroyed cleanly */
    char bad[] = "/tmp/zt_zero_mdisk_bad_XXXXXX";
    assert_non_null(mkdtemp(bad));
    eo.stream = true;
    eo.moments_dir = bad;
    assert_int_equal(zt_engine_create(&e, model, comm, &eo, zt_family_model_params(fm), &err), 0);
    int32_t tok[GB * T], tgt[GB * T];
    zt_engine_step_result sr;
    for (int s = 0; s < 2; s++) {
        global_batch(s, 0, tok, tgt);
        assert_int_equal(zt_engine_micro(e, tok, tgt, GB, T, NULL, 0, 1.0f, 1.0f, &err), 0);
        assert_int_equal(zt_engine_step(e, LR, s + 1, &sr, &err), 0);
    }
    float *scratch = malloc(zt_family_model_num_params(fm) * sizeof(float));
    assert_int_equal(zt_engine_export(e, scratch, NULL, NULL, &err), 0); /* the updates so far are done */
    char cmd[PATH_MAX + 64];
    /* block 2's: the records of blocks 0 and 1 were read ahead at the end of the last update, before the disk
     * went bad (the next update starts on them) */
    snprintf(cmd, sizeof cmd, "truncate -s 4096 %s/rank0/*-b2-s0.zts", bad);
    assert_int_equal(system(cmd), 0);
    global_batch(2, 0, tok, tgt);
    assert_int_equal(zt_engine_micro(e, tok, tgt, GB, T, NULL, 0, 1.0f, 1.0f, &err), 0);
    assert_int_equal(zt_engine_step(e, LR, 3, &sr, &err), 0); /* its update meets the bad record */
    global_batch(3, 0, tok, tgt);
    assert_int_equal(zt_engine_micro(e, tok, tgt, GB, T, NULL, 0, 1.0f, 1.0f, &err), 0);
    rc = zt_engine_step(e, LR, 4, &sr, &err);
    print_message("failing disk: %s\n", err.msg);
    assert_true(rc < 0);
    assert_non_null(strstr(err.msg, bad));
    assert_non_null(strstr(err.msg, "training stops"));
    zt_engine_destroy(e);
    free(scratch);
    remove_dir(bad);
    solo_close(&so);
}

/* The fp32 masters on disk as well, in the records of the moments (all of them, or the leading blocks' in host
 * memory): the same bits as masters in host memory at W = 1, 2, 3, fp32 and bf16 moments; a checkpoint of such
 * a run (its state read from where it lives) resumes on the bits of the run that did not stop, here with
 * another split of the masters; asked for without moments on disk, refused. */
static void test_masters_on_disk(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_xdisk_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int W = 1; W <= 3; W++) {
        const int bf16 = W == 2;
        float ram[STEPS], disk[STEPS], split[STEPS];
        job jr = job_of(W);
        jr.stream = true;
        jr.bf16_moments = bf16;
        job jd = jr;
        jd.moments_dir = dir;
        jd.masters_disk = true;
        job js = jd;
        js.moments_ram = 0.3;
        js.masters_ram = 0.5;
        run(&jr, ram);
        run(&jd, disk);
        run(&js, split);
        char what[64];
        snprintf(what, sizeof what, "W=%d masters on disk (%s moments)", W, bf16 ? "bf16" : "fp32");
        print_message("%s: last loss %.6f (in memory %.6f)\n", what, disk[STEPS - 1], ram[STEPS - 1]);
        assert_memory_equal(disk, ram, sizeof ram);
        assert_memory_equal(split, ram, sizeof ram);
    }
    char ck[] = "/tmp/zt_zero_xdisk_ckpt_XXXXXX";
    assert_non_null(mkdtemp(ck));
    float whole[STEPS], first[STEPS], rest[STEPS];
    job jw = job_of(2);
    jw.stream = true;
    jw.moments_dir = dir;
    jw.masters_disk = true;
    job js = jw;
    js.last = STEPS / 2;
    js.save_dir = ck;
    js.masters_ram = 0.5;
    run(&jw, whole);
    run(&js, first);
    assert_memory_equal(first, whole, sizeof(float) * (STEPS / 2));
    char ckpt[PATH_MAX];
    zt_err err = {{0}};
    assert_int_equal(zt_checkpoint_find(ck, ckpt, sizeof ckpt, &err), 0);
    job jl = jw;
    jl.first = STEPS / 2;
    jl.load_dir = ckpt;
    run(&jl, rest);
    assert_memory_equal(rest, whole + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2));
    remove_dir(dir);
    remove_dir(ck);

    solo so = solo_open(tiny_config().n_embd);
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    eo.stream = true;
    eo.masters_disk = true;
    zt_engine *e = NULL;
    assert_int_equal(zt_engine_create(&e, so.model, so.comm, &eo, zt_family_model_params(so.fm), &err),
                     ZT_EINVAL_CONFIG);
    assert_null(e);
    assert_non_null(strstr(err.msg, "--moments-dir"));
    solo_close(&so);
}


/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* The weights and optimizer state of the checkpoints of step `step` under two run folders: NULL when both
 * files are byte for byte the same, else the name of the first that differs. */
static const char *checkpoint_differs(const char *dir_a, const char *dir_b, int step)
{
    static const char *files[2] = {"model.safetensors", "optim.safetensors"};
    for (int f = 0; f < 2; f++) {
        char a[PATH_MAX + 64], b[PATH_MAX + 64];
        snprintf(a, sizeof a, "%s/ckpt_%06d/%s", dir_a, step, files[f]);
        snprintf(b, sizeof b, "%s/ckpt_%06d/%s", dir_b, step, files[f]);
        if (!same_file(a, b))
            return files[f];
    }
    return NULL;
}

/* Checkpoints of state on disk, streamed from the records block by block (zt_engine_export_stream): at W = 1
 * and 2, with the moments (fp32, and bf16 at W = 2) and a part of the masters on disk and the leading blocks'
 * in RAM, the streamed model.safetensors and optim.safetensors equal, byte for byte, those gathered into host
 * arrays from the same engine and those of the same run with its state in RAM; the engine's staging is three
 * shards (and three gathered blocks at W > 1), not the model; and the streamed checkpoint resumes on the
 * curve of the run that did not stop, bit for bit. */
static void test_streamed_checkpoint(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_sckpt_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int W = 1; W <= 2; W++)
        for (int bf16 = 0; bf16 <= (W == 2); bf16++) {
            char ram_dir[PATH_MAX], disk_dir[PATH_MAX], str_dir[PATH_MAX], mdir[PATH_MAX];
            snprintf(ram_dir, sizeof ram_dir, "%s/ram%d%d", dir, W, bf16);
            snprintf(disk_dir, sizeof disk_dir, "%s/disk%d%d", dir, W, bf16);
            snprintf(str_dir, sizeof str_dir, "%s/streamed%d%d", dir, W, bf16);
            snprintf(mdir, sizeof mdir, "%s/state", dir);
            assert_int_equal(mkdir(ram_dir, 0755), 0);
            assert_int_equal(mkdir(disk_dir, 0755), 0);
            assert_int_equal(mkdir(str_dir, 0755), 0);
            mkdir(mdir, 0700);
            float ram[STEPS], disk[STEPS], half[STEPS], rest[STEPS];
            job jr = job_of(W);
            jr.stream = true;
            jr.bf16_moments = bf16;
            jr.save_dir = ram_dir;
            job jd = jr;
            jd.save_dir = disk_dir;
            jd.stream_dir = str_dir;
            jd.moments_dir = mdir;
            jd.moments_ram = 0.3;
            jd.masters_disk = true;
            jd.masters_ram = 0.5;
            run(&jr, ram);
            run(&jd, disk);
            assert_memory_equal(disk, ram, sizeof ram);
            const char *files[2] = {"model.safetensors", "optim.safetensors"};
            for (int f = 0; f < 2; f++) {
                char a[PATH_MAX + 64], b[PATH_MAX + 64], c[PATH_MAX + 64];
                snprintf(a, sizeof a, "%s/ckpt_%06d/%s", ram_dir, STEPS, files[f]);
                snprintf(b, sizeof b, "%s/ckpt_%06d/%s", disk_dir, STEPS, files[f]);
                snprintf(c, sizeof c, "%s/ckpt_%06d/%s", str_dir, STEPS, files[f]);
                print_message("W=%d %s moments: streamed %s %s the gathered one and the RAM run's\n", W,
                              bf16 ? "bf16" : "fp32", files[f], same_file(c, b) && same_file(c, a) ? "equals" : "differs from");
                assert_true(same_file(b, a));
                assert_true(same_file(c, a));
            }
            char ckpt[PATH_MAX];
            zt_err err = {{0}};
            assert_int_equal(zt_checkpoint_find(str_dir, ckpt, sizeof ckpt, &err), 0);
            assert_int_equal(zt_checkpoint_verify(ckpt, NULL, &err), 0);

            /* stopped half way with a streamed checkpoint, resumed from it with the state on disk */
            job jh = jd;
            jh.last = STEPS / 2;
            jh.save_dir = NULL;
            snprintf(str_dir, sizeof str_dir, "%s/half%d%d", dir, W, bf16);
            assert_int_equal(mkdir(str_dir, 0755), 0);
            jh.stream_dir = str_dir;
            run(&jh, half);
            assert_int_equal(zt_checkpoint_find(str_dir, ckpt, sizeof ckpt, &err), 0);
            job jl = jd;
            jl.first = STEPS / 2;
            jl.load_dir = ckpt;
            jl.save_dir = NULL;
            jl.stream_dir = NULL;
            run(&jl, rest);
            assert_memory_equal(half, ram, sizeof(float) * (STEPS / 2));
            assert_memory_equal(rest, ram + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2));
        }
    remove_dir(dir);
}

/* The records of the first two blocks on disk read ahead across the step boundary (during the passes, once the
 * last update's writes are done) move only when bytes are read: at W = 1 and 2, fp32 and bf16 moments, the
 * moments and a part of the masters on disk, with and without the reads ahead, the same losses bit for bit and
 * the same streamed checkpoint byte for byte; a run stopped half way (its checkpoint drops the reads ahead)
 * and resumed continues on those bits. */
static void test_read_ahead(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_ahead_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int W = 1; W <= 2; W++) {
        const int bf16 = W == 2;
        char cold_dir[PATH_MAX], ahead_dir[PATH_MAX], half_dir[PATH_MAX], mdir[PATH_MAX];
        snprintf(cold_dir, sizeof cold_dir, "%s/cold%d", dir, W);
        snprintf(ahead_dir, sizeof ahead_dir, "%s/ahead%d", dir, W);
        snprintf(half_dir, sizeof half_dir, "%s/half%d", dir, W);
        snprintf(mdir, sizeof mdir, "%s/state%d", dir, W);
        assert_int_equal(mkdir(cold_dir, 0755), 0);
        assert_int_equal(mkdir(ahead_dir, 0755), 0);
        assert_int_equal(mkdir(half_dir, 0755), 0);
        assert_int_equal(mkdir(mdir, 0700), 0);
        float cold[STEPS], ahead[STEPS], half[STEPS], rest[STEPS];
        job ja = job_of(W);
        ja.stream = true;
        ja.bf16_moments = bf16;
        ja.moments_dir = mdir;
        ja.masters_disk = true;
        ja.masters_ram = 0.5;
        ja.stream_dir = ahead_dir;
        job jc = ja;
        jc.no_read_ahead = true;
        jc.stream_dir = cold_dir;
        run(&jc, cold);
        run(&ja, ahead);
        print_message("W=%d %s moments: last loss %.6f read ahead, %.6f cold\n", W, bf16 ? "bf16" : "fp32",
                      ahead[STEPS - 1], cold[STEPS - 1]);
        assert_memory_equal(ahead, cold, sizeof cold);
        const char *which = checkpoint_differs(ahead_dir, cold_dir, STEPS);
        if (which)
            fail_msg("W=%d: %s of the run with reads ahead differs from the cold run's", W, which);

        job jh = ja;
        jh.last = STEPS / 2;
        jh.stream_dir = half_dir;
        run(&jh, half);
        char ckpt[PATH_MAX];
        zt_err err = {{0}};
        assert_int_equal(zt_checkpoint_find(half_dir, ckpt, sizeof ckpt, &err), 0);
        job jl = ja;
        jl.first = STEPS / 2;
        jl.load_dir = ckpt;
        jl.stream_load = true;
        jl.stream_dir = NULL;
        run(&jl, rest);
        assert_memory_equal(half, cold, sizeof(float) * (STEPS / 2));
        assert_memory_equal(rest, cold + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2));
    }
    remove_dir(dir);
}

/* A checkpoint read into the engine tensor by tensor (zt_checkpoint_open into zt_engine_import_stream, the
 * engine created without a slab of initial weights): at W = 1 and 2, for the state where it lives in each layout
 * (resident fp32 arrays; streamed weights with the state in host arrays; the moments, bf16 at W = 2, and a part
 * of the masters on disk with the leading blocks' in RAM), a run stopped half way and resumed so continues on
 * the losses of the run that did not stop, bit for bit, and writes the same final checkpoint, byte for byte;
 * the engine's staging is three shards of a block. */
static void test_streamed_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_sload_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char mdir[PATH_MAX];
    snprintf(mdir, sizeof mdir, "%s/state", dir);
    assert_int_equal(mkdir(mdir, 0700), 0);
    for (int W = 1; W <= 2; W++)
        for (int layout = 0; layout < 3; layout++) {
            char whole_dir[PATH_MAX], half_dir[PATH_MAX], rest_dir[PATH_MAX], ckpt[PATH_MAX];
            snprintf(whole_dir, sizeof whole_dir, "%s/whole%d%d", dir, W, layout);
            snprintf(half_dir, sizeof half_dir, "%s/half%d%d", dir, W, layout);
            snprintf(rest_dir, sizeof rest_dir, "%s/rest%d%d", dir, W, layout);
            assert_int_equal(mkdir(whole_dir, 0755), 0);
            assert_int_equal(mkdir(half_dir, 0755), 0);
            assert_int_equal(mkdir(rest_dir, 0755), 0);
            job jw = job_of(W);
            if (layout >= 1)
                jw.stream = true;
            if (layout == 2) {
                jw.bf16_moments = W == 2;
                jw.moments_dir = mdir;
                jw.moments_ram = 0.3;
                jw.masters_disk = true;
                jw.masters_ram = 0.5;
            }
            jw.save_dir = whole_dir;
            float whole[STEPS], half[STEPS], rest[STEPS];
            run(&jw, whole);
            job jh = jw;
            jh.last = STEPS / 2;
            jh.save_dir = half_dir;
            run(&jh, half);
            zt_err err = {{0}};
            assert_int_equal(zt_checkpoint_find(half_dir, ckpt, sizeof ckpt, &err), 0);
            job jr = jw;
            jr.first = STEPS / 2;
            jr.load_dir = ckpt;
            jr.stream_load = true;
            jr.save_dir = rest_dir;
            run(&jr, rest);
            char what[64];
            snprintf(what, sizeof what, "W=%d %s", W, layout == 0 ? "resident" : layout == 1 ? "streamed, state in RAM"
                                                                                : "state on disk");
            if (memcmp(half, whole, sizeof(float) * (STEPS / 2)) != 0 ||
                memcmp(rest, whole + STEPS / 2, sizeof(float) * (STEPS - STEPS / 2)) != 0)
                fail_msg("%s: the resumed losses differ (last %.9g, %.9g without a stop)", what, rest[STEPS - STEPS / 2 - 1],
                         whole[STEPS - 1]);
            const char *differs = checkpoint_differs(whole_dir, rest_dir, STEPS);
            if (differs)
                fail_msg("%s: the resumed run's final %s differs", what, differs);
            print_message("%s: resumed from a checkpoint read tensor by tensor, the same losses and files\n", what);
        }
    remove_dir(dir);
}

/* The gradient of the middle micro-batches added on the host (grad_accum_host) instead of the sum coming up:
 * the same bits as the device's additions with four micro-batches per step, W = 2 and 3 in whole blocks and
 * in pieces, W = 1 in pieces, and with the state on disk; and 4 bytes per element less up per middle
 * micro-batch, counted. (One rank in whole blocks computing in fp32 is left out: its kernels add onto the
 * loaded sum in their own order, which the host's one addition per element would change.) */
static void test_grad_accum_on_host(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_hacc_XXXXXX";
    assert_non_null(mkdtemp(dir));
    static const int cases[][3] = {{1, 100, 0}, {2, 0, 0}, {2, 100, 0}, {3, 0, 0}, {3, 100, 0}, {2, 0, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float dev[STEPS], host[STEPS];
        job jd = job_of(cases[c][0]);
        jd.accum = 4;
        jd.stream = true;
        jd.grad_chunk = cases[c][1];
        if (cases[c][2]) {
            jd.moments_dir = dir;
            jd.masters_disk = true;
        }
        job jh = jd;
        jh.grad_accum_host = true;
        run(&jd, dev);
        run(&jh, host);
        char what[64];
        snprintf(what, sizeof what, "W=%d chunk %d%s", cases[c][0], cases[c][1], cases[c][2] ? " state on disk" : "");
        print_message("%s: last loss %.6f on the host, %.6f on the device\n", what, host[STEPS - 1], dev[STEPS - 1]);
        if (memcmp(dev, host, sizeof dev) != 0)
            fail_msg("%s: the losses differ", what);
    }
    remove_dir(dir);

    /* the bytes up of a step: the weights twice (forward, backward), and the sum so far once instead of at every
     * micro-batch after the first */
    uint64_t up[2];
    size_t nshard = 0;
    for (int h = 0; h <= 1; h++) {
        solo so = solo_open(tiny_config().n_embd);
        zt_model *model = NULL;
        zt_err err = {{0}};
        bool ck[8] = {false};
        assert_int_equal(zt_family_model_cpu(&model, so.fm, 4, ck, &err), 0);
        zt_engine_options eo;
        zt_engine_options_init(&eo);
        eo.stream = true;
        eo.grad_accum = 4;
        eo.grad_chunk = 100;
        eo.grad_accum_host = h;
        zt_engine_plan pl;
        zt_engine_plan_for(model, 1, &eo, &pl);
        assert_int_equal(pl.grad_accum_host, h);
        nshard = pl.shard_elems;
        zt_engine *e = NULL;
        assert_int_equal(zt_engine_create(&e, model, so.comm, &eo, zt_family_model_params(so.fm), &err), 0);
        int32_t tok[GB * T], tgt[GB * T];
        zt_engine_step_result sr;
        for (int a = 0; a < 4; a++) {
            global_batch(0, a, tok, tgt);
            assert_int_equal(zt_engine_micro(e, tok, tgt, GB, T, NULL, a, 0.25f, 1.0f, &err), 0);
        }
        assert_int_equal(zt_engine_step(e, LR, 1, &sr, &err), 0);
        zt_engine_timing tm;
        zt_engine_last_timing(e, &tm);
        up[h] = tm.bytes_up;
        zt_engine_destroy(e);
        model->ops->destroy(model);
        solo_close(&so);
    }
    print_message("bytes up per step: %llu with the sums on the host, %llu on the device\n", (unsigned long long)up[1],
                  (unsigned long long)up[0]);
    assert_true(up[0] - up[1] == 2 * nshard * 4);
}

/* The streamed weights come up as the fp32 masters instead of a compute-dtype host copy (on the CPU the
 * compute dtype is fp32, so what is checked here is the walk: pieces through the staging buffer, each
 * rank's shard into the all-gather): the same bits as from the copy, W = 1, 2, 3, in whole shards and in
 * pieces of 100 elements, with one micro-batch and with two. */
static void test_streamed_masters(void **state)
{
    (void)state;
    for (int W = 1; W <= 3; W++)
        for (int chunk = 0; chunk <= 100; chunk += 100)
            for (int accum = 1; accum <= ACCUM; accum += ACCUM - 1) {
                float copy[STEPS], masters[STEPS];
                job jc = job_of(W);
                jc.accum = accum;
                jc.stream = true;
                jc.grad_chunk = chunk;
                job jm = jc;
                jm.stream_masters = true;
                run(&jc, copy);
                run(&jm, masters);
                char what[64];
                snprintf(what, sizeof what, "W=%d chunk %d grad_accum %d", W, chunk, accum);
                for (int s = 0; s < STEPS; s++)
                    if (memcmp(&copy[s], &masters[s], sizeof(float)) != 0)
                        fail_msg("%s: step %d: %.9g from the masters, %.9g from the copy", what, s, masters[s], copy[s]);
            }
    /* refused without streamed weights, naming what it needs */
    solo so = solo_open(tiny_config().n_embd);
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    eo.stream_masters = true;
    zt_engine *e = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_engine_create(&e, so.model, so.comm, &eo, zt_family_model_params(so.fm), &err),
                     ZT_EINVAL_CONFIG);
    assert_null(e);
    assert_non_null(strstr(err.msg, "streamed weights"));
    solo_close(&so);
}

/* One rank in this process, a GPT-2 wide enough for whole pages inside its tensors: the losses of `steps`
 * steps, with the engine giving back the initial weights' pages as it takes them or not; *released
 * receives whether the first big tensor of the slab reads zeros after the engine's creation. */
static void train_in_process(bool release, bool stream, int steps, float *losses, bool *released)
{
    zt_err err = {{0}};
    solo so = solo_open(64); /* c_fc.weight: 64 x 256 floats, several whole pages */
    zt_comm *comm = so.comm;
    zt_model *model = so.model;
    const zt_model_tensor *big = NULL;
    for (int i = 0; i < model->ntensors && !big; i++)
        if (model->tensors[i].numel >= 8192)
            big = &model->tensors[i];
    assert_non_null(big);
    const float *slab = zt_family_model_params(so.fm);
    zt_engine_options eo;
    zt_engine_options_init(&eo);
    eo.stream = stream;
    eo.release_host_params = release;
    zt_engine *e = NULL;
    assert_int_equal(zt_engine_create(&e, model, comm, &eo, slab, &err), 0);
    bool zeros = true;
    for (size_t j = 2048; j < 4096; j++) /* a stretch in the tensor's inside: its whole pages */
        zeros = zeros && slab[big->host_offset + j] == 0.0f;
    *released = zeros;
    int32_t tok[GB * T], tgt[GB * T];
    for (int s = 0; s < steps; s++) {
        zt_engine_step_result sr;
        global_batch(s, 0, tok, tgt);
        assert_int_equal(zt_engine_micro(e, tok, tgt, GB, T, NULL, 0, 1.0f, 1.0f, &err), 0);
        assert_int_equal(zt_engine_step(e, LR, s + 1, &sr, &err), 0);
        losses[s] = sr.loss;
    }
    zt_engine_destroy(e);
    solo_close(&so);
}

/* release_host_params: the initial weights' pages are given back block by block as the engine takes them,
 * and training goes on with the same bits (optimizer on the CPU's shards, and in the host arrays). */
static void test_release_host_params(void **state)
{
    (void)state;
    for (int stream = 0; stream <= 1; stream++) {
        float kept[8], given[8];
        bool released_kept, released_given;
        train_in_process(false, stream, 8, kept, &released_kept);
        train_in_process(true, stream, 8, given, &released_given);
        assert_false(released_kept);
        assert_true(released_given);
        assert_memory_equal(given, kept, sizeof kept);
    }
}

static void test_resume_at_other_world_sizes(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_XXXXXX";
    assert_non_null(mkdtemp(dir));
    float first[STEPS], second[STEPS];
    job save = job_of(4);
    save.last = STEPS / 2;
    save.save_dir = dir;
    run(&save, first);
    assert_close(first, ref, STEPS / 2, 1e-5, "W=4 first half");
    char ckpt[PATH_MAX];
    zt_err err = {{0}};
    assert_int_equal(zt_checkpoint_find(dir, ckpt, sizeof ckpt, &err), 0);
    for (int W = 2; W >= 1; W--) {
        job resume = job_of(W);
        resume.ckpt = "all";
        resume.first = STEPS / 2;
        resume.load_dir = ckpt;
        run(&resume, second);
        char what[32];
        snprintf(what, sizeof what, "resumed at W=%d", W);
        assert_close(second, ref + STEPS / 2, STEPS / 2, 1e-5, what);
    }
    remove_dir(dir);
}

/* The training loop of `ztrain train` under WORLD_SIZE = 2 against the single-process trainer, on a token
 * shard written here. */
static void test_train_loop_matches_trainer(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_train_XXXXXX";
    assert_non_null(mkdtemp(dir));
    uint16_t toks[4096];
    for (int i = 0; i < 4096; i++)
        toks[i] = (uint16_t)((i * 7 + (i / 5) * 3) % 37);
    char shard[256], out1[256], out2[256];
    snprintf(shard, sizeof shard, "%s/train_000.bin", dir);
    snprintf(out1, sizeof out1, "%s/single", dir);
    snprintf(out2, sizeof out2, "%s/zero", dir);
    zt_err err = {{0}};
    assert_int_equal(zt_shard_write(shard, toks, 4096, &err), 0);
    zt_train_config cfg;
    zt_train_config_init(&cfg);
    zt_family_config_default(&cfg.model);
    (*ZT_GPT2_CONFIG(&cfg.model)) = tiny_config();
    cfg.model_loaded = true;
    snprintf(cfg.train_data, sizeof cfg.train_data, "%s", shard);
    snprintf(cfg.out_dir, sizeof cfg.out_dir, "%s", out1);
    cfg.steps = 8;
    cfg.batch_size = 4;
    cfg.seq_len = 8;
    cfg.grad_accum = 2;
    cfg.lr = 1e-2;
    cfg.threads = 1;
    cfg.log_every = 4;
    assert_int_equal(zt_train_config_resolve(&cfg, &err), 0);
    zt_train_result single;
    if (zt_trainer_run(&cfg, &single, &err) < 0)
        fail_msg("%s", err.msg);
    snprintf(cfg.out_dir, sizeof cfg.out_dir, "%s", out2);
    float losses[8];
    zt_fixture_train_ranks(&cfg, 2, losses, 8, NULL);
    assert_close(losses, single.losses, 8, 1e-5, "ztrain train at W=2");
    /* the final checkpoint has the single-process trainer's format */
    char ckpt[PATH_MAX];
    assert_int_equal(zt_checkpoint_find(out2, ckpt, sizeof ckpt, &err), 0);
    assert_int_equal(zt_checkpoint_verify(ckpt, NULL, &err), 0);
    zt_train_result_free(&single);
    remove_dir(dir);
}

/* Bytes of the regular files in dir (0 when it does not exist). */
static uint64_t dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    uint64_t sum = 0;
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    }
    if (d)
        closedir(d);
    return sum;
}

/* The runs under --host-mem: a folder from the template dir with a shard of 4096 tokens (shard) and an empty
 * state folder (sdir, 256 bytes each), and the config of a 6-layer GPT-2 of width 64 training on it (6 steps
 * of 4 x 8 with grad_accum 2, one thread), not yet resolved. */
static void host_mem_fixture(char *dir, char *shard, char *sdir, zt_train_config *cfg)
{
    assert_non_null(mkdtemp(dir));
    uint16_t toks[4096];
    for (int i = 0; i < 4096; i++)
        toks[i] = (uint16_t)((i * 7 + (i / 5) * 3) % 37);
    snprintf(shard, 256, "%s/train_000.bin", dir);
    snprintf(sdir, 256, "%s/state", dir);
    assert_int_equal(mkdir(sdir, 0700), 0);
    zt_err err = {{0}};
    assert_int_equal(zt_shard_write(shard, toks, 4096, &err), 0);
    zt_train_config_init(cfg);
    zt_family_config_default(&cfg->model);
    *ZT_GPT2_CONFIG(&cfg->model) = tiny_config();
    ZT_GPT2_CONFIG(&cfg->model)->n_layer = 6;
    ZT_GPT2_CONFIG(&cfg->model)->n_embd = 64;
    cfg->model_loaded = true;
    snprintf(cfg->train_data, sizeof cfg->train_data, "%s", shard);
    cfg->steps = 6;
    cfg->batch_size = 4;
    cfg->seq_len = 8;
    cfg->grad_accum = 2;
    cfg->lr = 1e-2;
    cfg->threads = 1;
    cfg->log_every = 3;
}

/* `ztrain train` at W = 2 under --host-mem with --moments-dir: a cap between the smallest plan (moments and
 * masters on disk) and the plan with the masters in RAM puts fp32 masters in the records on disk (their
 * files grow), and the losses are those of the same run with the masters in RAM, bit for bit. The cap is
 * priced here as the trainer prices CPU ranks: the engine's buffers, the model's parameters and gradients
 * (8 bytes per parameter), the checkpoints' staging (state on disk: streamed through the engine's buffers of
 * a few blocks and the writer's one tensor, not 12 bytes per parameter) or the import's at the start, the larger. The checkpoint, streamed from the
 * records, holds the bytes of the same run's with its state in RAM (gathered into host arrays), and resuming
 * it under the cap continues that run bit for bit. */
static void test_train_under_host_mem(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_hm_XXXXXX", shard[256], sdir[256], rank0[300];
    zt_train_config cfg;
    host_mem_fixture(dir, shard, sdir, &cfg);
    snprintf(rank0, sizeof rank0, "%s/rank0", sdir);
    snprintf(cfg.moments_dir, sizeof cfg.moments_dir, "%s", sdir);
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_resolve(&cfg, &err), 0);

    /* the prices of the two plans at W = 2, rank 0 */
    const int W = 2;
    zt_family_model *fm = NULL;
    assert_int_equal(zt_family_model_create(&fm, &cfg.model, 2, 8, 7, &err), 0);
    bool ck[8] = {false};
    zt_model *model = NULL;
    assert_int_equal(zt_family_model_cpu(&model, fm, 2, ck, &err), 0);
    const uint64_t P = zt_family_model_num_params(fm);
    uint64_t price[2];
    for (int masters = 0; masters <= 1; masters++) {
        zt_engine_options eo;
        zt_engine_options_init(&eo);
        eo.grad_accum = 2;
        eo.stream = true;
        eo.moments_dir = sdir;
        eo.masters_disk = masters;
        zt_engine_plan pl;
        zt_engine_plan_for(model, W, &eo, &pl);
        const uint64_t staging = pl.export_stream_bytes + zt_checkpoint_stream_bytes(fm);
        assert_true(pl.export_stream_bytes > 0 && staging < 12 * P / 3); /* 4.5 of 8 blocks, not 12 B a parameter */
        const uint64_t transient = staging > pl.import_bytes ? staging : pl.import_bytes; /* or the import's */
        price[masters] = pl.device_bytes + pl.host_bytes + 8 * P + transient + ZT_PLAN_PROCESS_RAM_CPU;
    }
    model->ops->destroy(model);
    zt_family_model_destroy(fm);
    print_message("W=2 plans: %llu bytes with the masters in RAM, %llu with them on disk\n",
                  (unsigned long long)price[0], (unsigned long long)price[1]);
    assert_true(price[1] + 4096 < price[0]);

    float in_ram[6], capped[6];
    snprintf(cfg.out_dir, sizeof cfg.out_dir, "%s/ram", dir);
    zt_fixture_train_ranks(&cfg, W, in_ram, 6, NULL);
    const uint64_t records_ram = dir_bytes(rank0);
    cfg.host_mem = (price[0] + price[1]) / 2;
    snprintf(cfg.out_dir, sizeof cfg.out_dir, "%s/capped", dir);
    zt_fixture_train_ranks(&cfg, W, capped, 6, NULL);
    const uint64_t records_capped = dir_bytes(rank0);
    print_message("records of rank 0: %llu bytes with the masters in RAM, %llu under --host-mem %llu\n",
                  (unsigned long long)records_ram, (unsigned long long)records_capped,
                  (unsigned long long)cfg.host_mem);
    assert_true(records_capped > records_ram);
    assert_memory_equal(capped, in_ram, sizeof in_ram);
    char ckpt[PATH_MAX];
    assert_int_equal(zt_checkpoint_find(cfg.out_dir, ckpt, sizeof ckpt, &err), 0);
    assert_int_equal(zt_checkpoint_verify(ckpt, NULL, &err), 0);

    /* the same run with its state in RAM (a cap that holds it all: the weights streamed from the host arrays as
     * above, the checkpoint gathered into host arrays): the same losses, the same checkpoint files */
    zt_train_config rc = cfg;
    rc.host_mem = (uint64_t)1 << 30;
    snprintf(rc.out_dir, sizeof rc.out_dir, "%s/state_in_ram", dir);
    float gathered[6];
    zt_fixture_train_ranks(&rc, W, gathered, 6, NULL);
    assert_memory_equal(gathered, in_ram, sizeof in_ram);
    const char *files[2] = {"model.safetensors", "optim.safetensors"};
    for (int f = 0; f < 2; f++) {
        char a[PATH_MAX + 64], b[PATH_MAX + 64];
        snprintf(a, sizeof a, "%s/ckpt_000006/%s", rc.out_dir, files[f]);
        snprintf(b, sizeof b, "%s/%s", ckpt, files[f]);
        assert_true(same_file(a, b));
    }

    /* under the cap, stopped at step 3 (a streamed checkpoint) and resumed to 6: the losses and the final files
     * of the run that did not stop (a learning rate without decay, which the number of steps does not change) */
    zt_train_config whole = cfg;
    whole.schedule = ZT_SCHEDULE_NODECAY;
    snprintf(whole.out_dir, sizeof whole.out_dir, "%s/whole", dir);
    float all[6], first[3], rest[3];
    zt_fixture_train_ranks(&whole, W, all, 6, NULL);
    zt_train_config half = whole;
    half.steps = 3;
    snprintf(half.out_dir, sizeof half.out_dir, "%s/resumed", dir);
    zt_fixture_train_ranks(&half, W, first, 3, NULL);
    half.steps = 6;
    snprintf(half.resume, sizeof half.resume, "%s", half.out_dir);
    zt_fixture_train_ranks(&half, W, rest, 3, NULL);
    assert_memory_equal(first, all, sizeof first);
    assert_memory_equal(rest, all + 3, sizeof rest);
    assert_null(checkpoint_differs(half.out_dir, whole.out_dir, 6));
    remove_dir(dir);
}

/* The host price of the trainer's plan of cfg's model at W ranks (rank 0), state on disk in sdir, with the fp32
 * masters in RAM (price[0]) and on disk too (price[1]), as plan_cpu_host counts it for a resume: the engine, the
 * host model, and the larger of the checkpoint's streamed staging and the streamed load's. */
static void resume_prices(const zt_train_config *cfg, int W, const char *sdir, uint64_t price[2])
{
    zt_err err = {{0}};
    zt_family_model *fm = NULL;
    assert_int_equal(zt_family_model_create(&fm, &cfg->model, (int)cfg->batch_size / W, (int)cfg->seq_len, 7, &err), 0);
    bool ck[8] = {false};
    zt_model *model = NULL;
    assert_int_equal(zt_family_model_cpu(&model, fm, (int)cfg->grad_accum, ck, &err), 0);
    const uint64_t P = zt_family_model_num_params(fm);
    for (int masters = 0; masters <= 1; masters++) {
        zt_engine_options eo;
        zt_engine_options_init(&eo);
        eo.grad_accum = (int)cfg->grad_accum;
        eo.stream = true;
        eo.moments_dir = sdir;
        eo.masters_disk = masters;
        zt_engine_plan pl;
        zt_engine_plan_for(model, W, &eo, &pl);
        const uint64_t save = pl.export_stream_bytes + zt_checkpoint_stream_bytes(fm);
        const uint64_t load = pl.import_stream_bytes + zt_checkpoint_read_bytes(fm);
        assert_true(pl.import_stream_bytes > 0 && load < 12 * P / 3); /* a block's shards, not 12 B a parameter */
        uint64_t transient = save > load ? save : load;
        transient = transient > pl.import_bytes ? transient : pl.import_bytes; /* the import of the initial weights */
        price[masters] = pl.device_bytes + pl.host_bytes + 8 * P + transient + ZT_PLAN_PROCESS_RAM_CPU;
    }
    model->ops->destroy(model);
    zt_family_model_destroy(fm);
}

/* A file's bytes (NULL when it cannot be read; free them). */
static char *file_bytes(const char *path, size_t *n)
{
    char *b = NULL;
    zt_err err;
    return zt_read_file(path, &b, n, &err) == 0 ? b : NULL;
}

/* The trainer's resume under --host-mem, W = 1 and 2: a run with its moments and masters on disk, stopped at
 * step 3 and resumed from its streamed checkpoint, reads that checkpoint into the engine tensor by tensor
 * (res.load_streamed, the plan inside the cap) and gives the losses and the final checkpoint of the run that
 * did not stop, bit for bit; so does a run with its state in RAM, which loads its checkpoint into host arrays
 * as before. A corrupt checkpoint is refused (ZT_ECHECKSUM) before anything is touched: the run directory's
 * files and the records on disk are as they were. */
static void test_resume_under_host_mem(void **state)
{
    (void)state;
    char dir[] = "/tmp/zt_zero_rhm_XXXXXX", shard[256], sdir[256];
    zt_train_config base;
    host_mem_fixture(dir, shard, sdir, &base);
    base.schedule = ZT_SCHEDULE_NODECAY; /* the number of steps does not change the learning rates */
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_resolve(&base, &err), 0);
    for (int W = 1; W <= 2; W++)
        for (int capped = 0; capped <= 1; capped++) {
            zt_train_config whole = base;
            if (capped) {
                uint64_t price[2];
                snprintf(whole.moments_dir, sizeof whole.moments_dir, "%s", sdir);
                resume_prices(&whole, W, sdir, price);
                assert_true(price[1] + 4096 < price[0]);
                whole.host_mem = (price[0] + price[1]) / 2; /* the masters must go to disk */
            }
            snprintf(whole.out_dir, sizeof whole.out_dir, "%s/whole%d%d", dir, W, capped);
            float all[6], first[3], rest[3];
            zt_fixture_train_ranks(&whole, W, all, 6, NULL);
            zt_train_config half = whole;
            half.steps = 3;
            snprintf(half.out_dir, sizeof half.out_dir, "%s/resumed%d%d", dir, W, capped);
            zt_fixture_train_ranks(&half, W, first, 3, NULL);
            half.steps = 6;
            snprintf(half.resume, sizeof half.resume, "%s", half.out_dir);
            if (W == 1) {
                /* in this process: the result says how the checkpoint was read */
                zt_train_result res;
                zt_fixture_train_ok(&half, &res);
                assert_int_equal(res.load_streamed, capped);
                memcpy(rest, res.losses, sizeof rest);
                zt_train_result_free(&res);
            } else {
                zt_fixture_train_ranks(&half, W, rest, 3, NULL);
            }
            assert_memory_equal(first, all, sizeof first);
            assert_memory_equal(rest, all + 3, sizeof rest);
            assert_null(checkpoint_differs(half.out_dir, whole.out_dir, 6));
            print_message("W=%d %s: resumed at step 3 on the bits of the run that did not stop\n", W,
                          capped ? "under --host-mem, state on disk (streamed load)" : "state in RAM (loaded whole)");
        }

    /* a corrupt checkpoint under the cap, W = 1: refused, and nothing in the run directory or the records changed */
    zt_train_config c = base;
    snprintf(c.moments_dir, sizeof c.moments_dir, "%s", sdir);
    uint64_t price[2];
    resume_prices(&c, 1, sdir, price);
    c.host_mem = (price[0] + price[1]) / 2;
    snprintf(c.out_dir, sizeof c.out_dir, "%s/resumed11", dir);
    snprintf(c.resume, sizeof c.resume, "%s/resumed11/ckpt_000006", dir);
    c.steps = 8;
    char path[1024];
    snprintf(path, sizeof path, "%s/resumed11/ckpt_000006/optim.safetensors", dir);
    size_t n = 0;
    char *bytes = file_bytes(path, &n);
    assert_non_null(bytes);
    bytes[n - 8] ^= 0x01;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    const char *kept[3] = {"latest", "metrics.jsonl", "config.json"};
    char *before[3];
    size_t lens[3];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/resumed11/%s", dir, kept[i]);
        assert_non_null(before[i] = file_bytes(path, &lens[i]));
    }
    /* the records: an engine that started would have replaced them (the folder's time changes) */
    snprintf(path, sizeof path, "%s/rank0", sdir);
    const uint64_t records = dir_bytes(path);
    struct stat rst;
    assert_int_equal(stat(path, &rst), 0);
    zt_train_result res;
    const int rc = zt_trainer_run(&c, &res, &err);
    print_message("corrupt checkpoint: %d, %s\n", rc, err.msg);
    assert_int_equal(rc, ZT_ECHECKSUM);
    assert_non_null(strstr(err.msg, "optim.safetensors"));
    zt_train_result_free(&res);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/resumed11/%s", dir, kept[i]);
        size_t len = 0;
        char *now = file_bytes(path, &len);
        assert_non_null(now);
        assert_int_equal(len, lens[i]);
        assert_memory_equal(now, before[i], len);
        free(now);
        free(before[i]);
    }
    snprintf(path, sizeof path, "%s/rank0", sdir);
    struct stat rnow;
    assert_int_equal(stat(path, &rnow), 0);
    assert_int_equal(dir_bytes(path), records);
    assert_true(rnow.st_mtim.tv_sec == rst.st_mtim.tv_sec && rnow.st_mtim.tv_nsec == rst.st_mtim.tv_nsec);
    free(bytes);
    remove_dir(dir);
}

/* Every setting that changes the math or the protocol of a step changes the config hash that the
 * rendezvous compares; the addresses of the state servers (which differ between hosts) do not. */
static void test_config_hash_covers_runtime_settings(void **state)
{
    (void)state;
    zt_train_config base;
    zt_train_config_init(&base);
    const uint64_t h0 = zt_trainer_config_hash(&base);
    static const char *const changes[][2] = {
        {"--optimizer", "server"}, {"--servers", "a:1,b:2"}, {"--zero-level", "2"},
        {"--checkpointing", "all"}, {"--prefetch", "3"},     {"--state-store", "nvme:/tmp/x"},
        {"--grad-clip", "0.5"},    {"--batch-size", "24"},  {"--adam-moments", "bf16"},
        {"--host-mem", "64GiB"},   {"--moments-dir", "/tmp"},
    };
    for (size_t i = 0; i < sizeof changes / sizeof changes[0]; i++) {
        zt_train_config c = base;
        zt_err err = {{0}};
        assert_int_equal(zt_train_config_set_flag(&c, changes[i][0], changes[i][1], &err), 0);
        if (zt_trainer_config_hash(&c) == h0)
            fail_msg("%s %s does not change the config hash", changes[i][0], changes[i][1]);
    }
    zt_train_config a = base, b = base;
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(&a, "--servers", "10.0.0.1:7070,10.0.0.2:7070", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&b, "--servers", "s0.svc:7070,s1.svc:7070", &err), 0);
    assert_true(zt_trainer_config_hash(&a) == zt_trainer_config_hash(&b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equivalence_w1_to_w4),
        cmocka_unit_test(test_zero2_equals_zero3_and_checkpointing),
        cmocka_unit_test(test_streamed_weights),
        cmocka_unit_test(test_streamed_masters),
        cmocka_unit_test(test_bf16_moments),
        cmocka_unit_test(test_moments_on_disk),
        cmocka_unit_test(test_masters_on_disk),
        cmocka_unit_test(test_streamed_checkpoint),
        cmocka_unit_test(test_read_ahead),
        cmocka_unit_test(test_streamed_load),
        cmocka_unit_test(test_grad_accum_on_host),
        cmocka_unit_test(test_release_host_params),
        cmocka_unit_test(test_resume_at_other_world_sizes),
        cmocka_unit_test(test_train_loop_matches_trainer),
        cmocka_unit_test(test_train_under_host_mem),
        cmocka_unit_test(test_resume_under_host_mem),
        cmocka_unit_test(test_config_hash_covers_runtime_settings),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
