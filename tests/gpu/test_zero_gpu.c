/* The training engine's settings on one GPU (ctest label gpu; exit 77 without a GPU). W > 1 needs one
 * GPU per rank (NCCL refuses two ranks on one device): tests/gpu/zero_multi_gpu.sh checks it on a machine
 * with two GPUs.
 *
 * - ZeRO-2 equals ZeRO-3; prefetch 0, 1 and 2 are identical; activation checkpointing all and every:2
 *   equal none (the recomputed forward is deterministic);
 * - grad_accum 2 over half batches equals grad_accum 1 over the whole batch within a tolerance;
 * - a checkpoint written under one checkpointing policy resumes under another with the next losses of the
 *   uninterrupted run (bit for bit), and an fp32 checkpoint resumes on the CPU, following the CPU run;
 * - the optimizer off the GPU (placement cpu: the host AdamW overlapping the next step) tracks placement
 *   gpu within bf16's tolerance, with grad_accum 1 and 2 and every layer checkpointed; and with part of
 *   its blocks updated on the GPU (--optimizer-gpu-fraction) it gives the same bits as with none;
 * - weights streamed from host memory give the bits of weights kept on the GPU (test_streamed_weights);
 * - a resume that reads its checkpoint into the engine tensor by tensor (state on disk, --host-mem) continues
 *   on the bits of the run that did not stop (test_streamed_resume). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "common/fileio.h"
#include "common/log.h"
#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/train/trainer.h"

#include "gpu_fixture.h"

#define VOCAB 200
#define STEPS 20

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    if (zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_zero_gpu_") != 0)
        return -1;
    zt_fixture_write_phrase_shard(g_dir, "z_train_000.bin", 40000, 7, VOCAB);
    zt_fixture_write_phrase_shard(g_dir, "z_val_000.bin", 4000, 9, VOCAB);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

/* A 4-layer model (so that every:2 checkpoints some layers and not others), 4 sequences per step. */
static void base_config(zt_train_config *c, const char *out, const char *device, const char *precision, int accum)
{
    zt_gpu_fixture_config(c, g_dir, "z", out, device, precision, 4, VOCAB, STEPS, 4 / accum, accum);
}

/* Trains with the given ZeRO level, checkpointing, prefetch depth and optimizer placement; fails the test
 * on error. */
static void engine_train_ok(zt_train_config *c, int level, const char *ckpt, int prefetch, const char *optimizer,
                            zt_train_result *res)
{
    char lv[8], pf[8];
    snprintf(lv, sizeof lv, "%d", level);
    snprintf(pf, sizeof pf, "%d", prefetch);
    zt_err err = {{0}};
    if (zt_train_config_set_flag(c, "--zero-level", lv, &err) != 0 ||
        zt_train_config_set_flag(c, "--checkpointing", ckpt, &err) != 0 ||
        zt_train_config_set_flag(c, "--prefetch", pf, &err) != 0 ||
        zt_train_config_set_flag(c, "--optimizer", optimizer, &err) != 0)
        fail_msg("%s", err.msg);
    zt_fixture_finish_config(c);
    zt_fixture_train_ok(c, res);
}

/* Level, prefetch depth and activation checkpointing change where and when, never what. */
static void test_levels_prefetch_checkpointing(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result ref;
    base_config(&c, "var_ref", "cuda", "bf16", 1);
    engine_train_ok(&c, 3, "none", 1, "gpu", &ref);
    assert_true(ref.losses[STEPS - 1] < ref.losses[0] - 0.5f); /* it learns */
    const struct {
        int level;
        const char *ckpt;
        int prefetch;
    } cases[] = {{2, "none", 1}, {3, "none", 0}, {3, "none", 2}, {2, "none", 0}, {3, "all", 1}, {3, "every:2", 2},
                 {2, "all", 2}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char out[64], what[96];
        snprintf(out, sizeof out, "var_%zu", k);
        snprintf(what, sizeof what, "ZeRO-%d, checkpointing %s, prefetch %d vs ZeRO-3, none, 1", cases[k].level,
                 cases[k].ckpt, cases[k].prefetch);
        zt_train_result r;
        base_config(&c, out, "cuda", "bf16", 1);
        engine_train_ok(&c, cases[k].level, cases[k].ckpt, cases[k].prefetch, "gpu", &r);
        zt_gpu_fixture_same_losses(what, &r, &ref, 1, STEPS);
        zt_train_result_free(&r);
    }
    zt_train_result_free(&ref);
}

/* grad_accum 2 over batches of 2 sees the tokens of grad_accum 1 over batches of 4. */
static void test_grad_accum(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result one, two;
    /* unshuffled: windows of 2 x 64 tokens two by two are the windows of 4 x 64 */
    base_config(&c, "acc1", "cuda", "fp32", 1);
    c.shuffle = false;
    engine_train_ok(&c, 3, "none", 1, "gpu", &one);
    base_config(&c, "acc2", "cuda", "fp32", 2);
    c.shuffle = false;
    engine_train_ok(&c, 3, "none", 1, "gpu", &two);
    double worst = 0.0;
    for (int s = 0; s < STEPS; s++) {
        double rel = fabs((double)one.losses[s] - (double)two.losses[s]) / fabs((double)one.losses[s]);
        if (rel > worst)
            worst = rel;
        if (!(rel <= 1e-4))
            fail_msg("step %d: grad_accum 2 loss %.7f vs grad_accum 1 %.7f", s + 1, (double)two.losses[s],
                     (double)one.losses[s]);
    }
    printf("grad_accum 2 vs 1 (fp32): largest relative loss difference %.3g over %d steps\n", worst, STEPS);
    zt_train_result_free(&one);
    zt_train_result_free(&two);
}

/* Checkpoints cross settings: checkpointing none -> all, fp32 on the GPU -> the CPU. */
static void test_checkpoints_cross(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result full, a, b;

    /* bf16 stopped at 10 without checkpointing, resumed with every layer checkpointed */
    base_config(&c, "x_full", "cuda", "bf16", 1);
    engine_train_ok(&c, 3, "none", 1, "gpu", &full);
    base_config(&c, "x_split", "cuda", "bf16", 1);
    c.stop_at_step = 10;
    engine_train_ok(&c, 3, "none", 2, "gpu", &a);
    assert_true(a.interrupted);
    base_config(&c, "x_split", "cuda", "bf16", 1);
    snprintf(c.resume, sizeof c.resume, "%s/x_split", g_dir);
    engine_train_ok(&c, 2, "all", 1, "gpu", &b);
    assert_int_equal(b.start_step, 10);
    zt_gpu_fixture_same_losses("checkpoint at 10 (checkpointing none) -> resume (all)", &b, &full, 11, STEPS);
    zt_train_result_free(&a);
    zt_train_result_free(&b);
    zt_train_result_free(&full);

    /* fp32 stopped at 10, resumed on the CPU: follows the CPU run */
    zt_train_result cpu;
    base_config(&c, "x_cpu", "cpu", "auto", 1);
    zt_fixture_train_ok(&c, &cpu);
    base_config(&c, "x_g2c", "cuda", "fp32", 1);
    c.stop_at_step = 10;
    engine_train_ok(&c, 3, "none", 1, "gpu", &a);
    base_config(&c, "x_g2c", "cpu", "auto", 1);
    snprintf(c.resume, sizeof c.resume, "%s/x_g2c", g_dir);
    zt_fixture_train_ok(&c, &b);
    assert_int_equal(b.start_step, 10);
    double worst = 0.0;
    for (int s = 11; s <= STEPS; s++) {
        double rel = fabs((double)b.losses[s - 11] - (double)cpu.losses[s - 1]) / fabs((double)cpu.losses[s - 1]);
        if (rel > worst)
            worst = rel;
        if (!(rel <= 1e-4))
            fail_msg("fp32 GPU checkpoint -> CPU: step %d loss %.7f vs CPU run %.7f", s, (double)b.losses[s - 11],
                     (double)cpu.losses[s - 1]);
    }
    printf("fp32 GPU checkpoint at 10 -> CPU resume: largest relative difference to the CPU run %.3g\n", worst);
    zt_train_result_free(&a);
    zt_train_result_free(&b);
    zt_train_result_free(&cpu);
}

/* Fails unless the final checkpoints (ckpt_<STEPS>) of two runs hold the same weights, byte for byte. */
static void expect_same_weights(const char *a, const char *b)
{
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/ckpt_%06d/model.safetensors", g_dir, a, STEPS);
    snprintf(pb, sizeof pb, "%s/%s/ckpt_%06d/model.safetensors", g_dir, b, STEPS);
    char *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    zt_err err = {{0}};
    if (zt_read_file(pa, &da, &na, &err) != 0 || zt_read_file(pb, &db, &nb, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(na, nb);
    if (memcmp(da, db, na) != 0)
        fail_msg("the final weights of %s and %s differ", a, b);
    free(da);
    free(db);
}

/* The host AdamW (placement cpu) against the GPU's (placement gpu): the same math on the same gradients
 * up to the summation order of the norm: within bf16's tolerance, with grad_accum 1 and 2 (the host
 * gradient loaded back and added on the GPU) and every layer checkpointed. */
static void test_host_optimizer_tracks_gpu(void **state)
{
    (void)state;
    for (int accum = 1; accum <= 2; accum++) {
        char o1[32], o2[32];
        snprintf(o1, sizeof o1, "place_gpu_%d", accum);
        snprintf(o2, sizeof o2, "place_cpu_%d", accum);
        zt_train_config c;
        zt_train_result g, h;
        base_config(&c, o1, "cuda", "bf16", accum);
        engine_train_ok(&c, 3, "all", 1, "gpu", &g);
        base_config(&c, o2, "cuda", "bf16", accum);
        engine_train_ok(&c, 3, "all", 1, "cpu", &h);
        double worst = 0.0;
        for (int s = 0; s < STEPS; s++) {
            double rel = fabs((double)h.losses[s] - (double)g.losses[s]) / fabs((double)g.losses[s]);
            worst = rel > worst ? rel : worst;
            if (!(rel <= 1e-2))
                fail_msg("grad_accum %d, step %d: host optimizer loss %.6f vs GPU optimizer %.6f", accum, s + 1,
                         (double)h.losses[s], (double)g.losses[s]);
        }
        printf("placement cpu vs gpu (bf16, grad_accum %d, checkpointing all): largest relative loss difference "
               "%.3g over %d steps\n", accum, worst, STEPS);
        assert_true(h.losses[STEPS - 1] < h.losses[0] - 0.5f); /* it learns */
        /* half of the blocks' AdamW on the GPU, the rest on the host: the same bits, weights included */
        char o3[32];
        snprintf(o3, sizeof o3, "place_split_%d", accum);
        zt_train_result split;
        base_config(&c, o3, "cuda", "bf16", accum);
        zt_err err = {{0}};
        if (zt_train_config_set_flag(&c, "--optimizer-gpu-fraction", "0.5", &err) != 0)
            fail_msg("%s", err.msg);
        engine_train_ok(&c, 3, "all", 1, "cpu", &split);
        zt_gpu_fixture_same_losses("placement cpu, half of it on the GPU, vs all on the host", &split, &h, 1, STEPS);
        expect_same_weights(o2, o3);
        zt_train_result_free(&split);
        zt_train_result_free(&g);
        zt_train_result_free(&h);
    }
}

/* Weights streamed from host memory (--weights host: each block copied up before its forward and again
 * before its backward, gradients sent down in pieces of grad_piece elements that do not divide the blocks;
 * --weights masters: the fp32 masters copied up in pieces and rounded on the GPU)
 * against the weights kept on the GPU with the same host optimizer: bit for bit without clipping (the
 * norm's summation order is all that differs), for bf16 and fp16 (loss scaling), grad_accum 1 and 2, and
 * with the embedded state server; within a tight tolerance with clipping. A cap below the minimum is
 * refused with the minimum and what to change. */
static void test_streamed_weights(void **state)
{
    (void)state;
    static const char *const precisions[] = {"bf16", "fp16"};
    zt_err err = {{0}};
    for (int p = 0; p < 2; p++)
        for (int accum = 1; accum <= 2; accum++) {
            char o1[48];
            snprintf(o1, sizeof o1, "resident_%s_%d", precisions[p], accum);
            zt_train_config c;
            zt_train_result r;
            base_config(&c, o1, "cuda", precisions[p], accum);
            c.grad_clip = 0.0;
            if (zt_train_config_set_flag(&c, "--weights", "gpu", &err) != 0)
                fail_msg("%s", err.msg);
            engine_train_ok(&c, 3, "all", 1, "cpu", &r);
            /* the compute-dtype copy streamed (host), and the fp32 masters streamed and rounded on the GPU */
            static const char *const modes[2] = {"host", "masters"};
            for (int m = 0; m < 2; m++) {
                char o2[48], what[96];
                zt_train_result st;
                snprintf(o2, sizeof o2, "streamed_%s_%s_%d", modes[m], precisions[p], accum);
                base_config(&c, o2, "cuda", precisions[p], accum);
                c.grad_clip = 0.0;
                c.grad_piece = 1000;
                if (zt_train_config_set_flag(&c, "--weights", modes[m], &err) != 0)
                    fail_msg("%s", err.msg);
                engine_train_ok(&c, 3, "all", 1, "cpu", &st);
                snprintf(what, sizeof what, "streamed (--weights %s) vs resident weights (%s, grad_accum %d)", modes[m],
                         precisions[p], accum);
                zt_gpu_fixture_same_losses(what, &st, &r, 1, STEPS);
                expect_same_weights(o1, o2);
                assert_true(st.losses[STEPS - 1] < st.losses[0] - 0.5f);
                zt_train_result_free(&st);
            }
            zt_train_result_free(&r);
        }

    /* bf16 Adam moments in host memory: streamed = resident, bit for bit; close to fp32 moments, not equal */
    {
        static const char *const names[5] = {"resident_m16", "streamed_m16", "resident_m32", "streamed_m16_disk",
                                             "streamed_m16_split"};
        char mdir[] = "/tmp/zt_gpu_moments_XXXXXX";
        assert_non_null(mkdtemp(mdir));
        zt_train_result res[5];
        for (int i = 0; i < 5; i++) {
            zt_train_config c;
            base_config(&c, names[i], "cuda", "bf16", 1);
            c.grad_clip = 0.0;
            c.grad_piece = 1000;
            /* on disk: every block's moments (1KiB holds none of them), or the leading blocks' in RAM (2MiB) */
            if (zt_train_config_set_flag(&c, "--weights", i == 1 || i >= 3 ? "host" : "gpu", &err) != 0 ||
                zt_train_config_set_flag(&c, "--adam-moments", i == 2 ? "fp32" : "bf16", &err) != 0 ||
                (i >= 3 && zt_train_config_set_flag(&c, "--moments-dir", mdir, &err) != 0) ||
                (i >= 3 && zt_train_config_set_flag(&c, "--moments-ram", i == 3 ? "1KiB" : "2MiB", &err) != 0))
                fail_msg("%s", err.msg);
            engine_train_ok(&c, 3, "all", 1, "cpu", &res[i]);
        }
        zt_gpu_fixture_same_losses("streamed vs resident weights, bf16 moments", &res[1], &res[0], 1, STEPS);
        zt_gpu_fixture_same_losses("bf16 moments on disk vs in host memory", &res[3], &res[1], 1, STEPS);
        zt_gpu_fixture_same_losses("bf16 moments split between RAM and disk vs in host memory", &res[4], &res[1], 1,
                                   STEPS);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", mdir);
        assert_int_equal(system(cmd), 0);
        double worst = 0.0;
        for (int s = 0; s < STEPS; s++) {
            double rel = fabs((double)res[0].losses[s] - (double)res[2].losses[s]) / fabs((double)res[2].losses[s]);
            worst = rel > worst ? rel : worst;
        }
        printf("bf16 vs fp32 Adam moments (bf16 weights): largest relative loss difference %.3g\n", worst);
        assert_true(worst > 0.0 && worst < 2e-2);
        for (int i = 0; i < 5; i++)
            zt_train_result_free(&res[i]);
    }

    /* the embedded state server behind streamed weights */
    zt_train_config c;
    zt_train_result a, b;
    base_config(&c, "streamed_cpu", "cuda", "bf16", 2);
    c.grad_piece = 777;
    if (zt_train_config_set_flag(&c, "--weights", "host", &err) != 0)
        fail_msg("%s", err.msg);
    engine_train_ok(&c, 3, "none", 2, "cpu", &a);
    base_config(&c, "streamed_server", "cuda", "bf16", 2);
    c.grad_piece = 777;
    if (zt_train_config_set_flag(&c, "--weights", "host", &err) != 0)
        fail_msg("%s", err.msg);
    engine_train_ok(&c, 3, "none", 2, "server", &b);
    zt_gpu_fixture_same_losses("streamed weights, optimizer embedded server vs cpu (bf16, clipping)", &b, &a, 1, STEPS);
    expect_same_weights("streamed_cpu", "streamed_server");
    zt_train_result_free(&b);

    /* with clipping, against the resident layout: the norm's order only */
    base_config(&c, "resident_clip", "cuda", "bf16", 2);
    if (zt_train_config_set_flag(&c, "--weights", "gpu", &err) != 0)
        fail_msg("%s", err.msg);
    engine_train_ok(&c, 3, "none", 2, "cpu", &b);
    double worst = 0.0;
    for (int s = 0; s < STEPS; s++) {
        double rel = fabs((double)a.losses[s] - (double)b.losses[s]) / fabs((double)b.losses[s]);
        worst = rel > worst ? rel : worst;
    }
    printf("streamed vs resident with clipping (bf16, grad_accum 2): largest relative loss difference %.3g\n", worst);
    assert_true(worst < 1e-3);
    zt_train_result_free(&a);
    zt_train_result_free(&b);

    /* a cap below the minimum: refused before training, naming the minimum and the fixes */
    base_config(&c, "too_small", "cuda", "bf16", 1);
    if (zt_train_config_set_flag(&c, "--gpu-mem", "1MiB", &err) != 0 ||
        zt_train_config_set_flag(&c, "--optimizer", "cpu", &err) != 0)
        fail_msg("%s", err.msg);
    zt_fixture_finish_config(&c);
    zt_train_result res;
    memset(&err, 0, sizeof err);
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_ENOMEM);
    printf("refusal: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "--gpu-mem is 1.00 MiB"));
    assert_non_null(strstr(err.msg, "at least"));
    assert_non_null(strstr(err.msg, "or more"));
    zt_train_result_free(&res);
}

/* The smallest --host-mem plan of c (with the settings engine_train_ok gives a run: ZeRO-3, every layer
 * checkpointed, the host AdamW) from the refusal of a cap of 1 MiB, in MiB. */
static long smallest_host_mem(const zt_train_config *c)
{
    zt_err err = {{0}};
    zt_train_config probe = *c;
    if (zt_train_config_set_flag(&probe, "--zero-level", "3", &err) != 0 ||
        zt_train_config_set_flag(&probe, "--checkpointing", "all", &err) != 0 ||
        zt_train_config_set_flag(&probe, "--optimizer", "cpu", &err) != 0 ||
        zt_train_config_set_flag(&probe, "--host-mem", "1MiB", &err) != 0)
        fail_msg("%s", err.msg);
    zt_fixture_finish_config(&probe);
    zt_train_result pr;
    memset(&err, 0, sizeof err);
    assert_int_equal(zt_trainer_run(&probe, &pr, &err), ZT_ENOMEM);
    printf("refusal: %s\n", err.msg);
    const char *at = strstr(err.msg, "what would fit: --host-mem ");
    assert_non_null(at);
    zt_train_result_free(&pr);
    return strtol(at + strlen("what would fit: --host-mem "), NULL, 10);
}

/* The host side under --host-mem, on the GPU (bf16, four micro-batches per step, streamed weights, gradients
 * in pieces, no clipping): the middle micro-batches' gradients added on the host (--host-grad-accum) and the
 * Adam moments and fp32 masters moved to disk by --host-mem give the bits of the plain streamed run, losses
 * and weights; a cap below the smallest plan is refused naming the minimum. */
static void test_host_mem(void **state)
{
    (void)state;
    zt_err err = {{0}};
    char sdir[] = "/tmp/zt_gpu_hostmem_XXXXXX";
    assert_non_null(mkdtemp(sdir));
    static const char *const names[3] = {"hm_plain", "hm_host_accum", "hm_capped"};
    zt_train_result res[3];
    char cap[32] = "";
    for (int i = 0; i < 3; i++) {
        zt_train_config c;
        base_config(&c, names[i], "cuda", "bf16", 4);
        c.grad_clip = 0.0;
        c.grad_piece = 1000;
        if (zt_train_config_set_flag(&c, "--weights", "host", &err) != 0 ||
            (i >= 1 && zt_train_config_set_flag(&c, "--host-grad-accum", "true", &err) != 0) ||
            (i == 2 && zt_train_config_set_flag(&c, "--moments-dir", sdir, &err) != 0))
            fail_msg("%s", err.msg);
        if (i == 2) {
            /* the smallest plan from the refusal of a cap too small, plus 1 MiB: the state mostly on disk */
            snprintf(cap, sizeof cap, "%ldMiB", smallest_host_mem(&c) + 1);
            if (zt_train_config_set_flag(&c, "--host-mem", cap, &err) != 0)
                fail_msg("%s", err.msg);
        }
        engine_train_ok(&c, 3, "all", 1, "cpu", &res[i]);
    }
    zt_gpu_fixture_same_losses("gradients of the middle micro-batches added on the host", &res[1], &res[0], 1, STEPS);
    expect_same_weights(names[0], names[1]);
    char what[96];
    snprintf(what, sizeof what, "moments and masters on disk under --host-mem %s", cap);
    zt_gpu_fixture_same_losses(what, &res[2], &res[0], 1, STEPS);
    expect_same_weights(names[0], names[2]);
    for (int i = 0; i < 3; i++)
        zt_train_result_free(&res[i]);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", sdir);
    assert_int_equal(system(cmd), 0);
}

/* The settings of case k of test_streamed_resume on c (bf16, no clipping, gradients in pieces); cap: "" or
 * the --host-mem of case 2. */
static void streamed_resume_case(zt_train_config *c, int k, const char *mdir, const char *cap)
{
    zt_err err = {{0}};
    c->grad_clip = 0.0;
    c->grad_piece = 1000;
    if ((k == 0 && (zt_train_config_set_flag(c, "--weights", "gpu", &err) != 0 ||
                    zt_train_config_set_flag(c, "--host-mem", "64GiB", &err) != 0)) ||
        (k >= 1 && (zt_train_config_set_flag(c, "--weights", "host", &err) != 0 ||
                    zt_train_config_set_flag(c, "--moments-dir", mdir, &err) != 0)) ||
        (k == 1 && zt_train_config_set_flag(c, "--adam-moments", "bf16", &err) != 0) ||
        (k == 2 && cap[0] && zt_train_config_set_flag(c, "--host-mem", cap, &err) != 0))
        fail_msg("%s", err.msg);
}

/* A resume that reads its checkpoint into the engine tensor by tensor (res.load_streamed) on the GPU: (0) the
 * optimizer on the GPU under a --host-mem that holds everything (the device's arrays and the cast to bf16);
 * (1) the host AdamW behind streamed weights with its bf16 moments on disk; (2) the same with fp32 moments and
 * the fp32 masters on disk under the smallest cap plus 1 MiB (the compute-dtype copy made from the
 * checkpoint). Stopped at step 10 and resumed, each gives the losses of its uninterrupted run from step 11 on
 * and the same final weights, bit for bit. */
static void test_streamed_resume(void **state)
{
    (void)state;
    static const char *const placement[3] = {"gpu", "cpu", "cpu"};
    char mdir[] = "/tmp/zt_gpu_sresume_XXXXXX";
    assert_non_null(mkdtemp(mdir));
    for (int k = 0; k < 3; k++) {
        char full_out[32], split_out[32], cap[32] = "";
        snprintf(full_out, sizeof full_out, "sr_full_%d", k);
        snprintf(split_out, sizeof split_out, "sr_split_%d", k);
        zt_train_config c;
        zt_train_result full, a, b;
        if (k == 2) {
            /* a cap that the fresh run and the resumed one (which plans the checkpoint's reading) both fit */
            base_config(&c, "sr_probe", "cuda", "bf16", 2);
            streamed_resume_case(&c, k, mdir, cap);
            snprintf(cap, sizeof cap, "%ldMiB", smallest_host_mem(&c) + 1);
        }
        base_config(&c, split_out, "cuda", "bf16", 2);
        streamed_resume_case(&c, k, mdir, cap);
        c.stop_at_step = 10;
        engine_train_ok(&c, 3, "all", 1, placement[k], &a);
        assert_true(a.interrupted);
        if (k == 2) {
            base_config(&c, split_out, "cuda", "bf16", 2);
            streamed_resume_case(&c, k, mdir, "");
            snprintf(c.resume, sizeof c.resume, "%s/%s", g_dir, split_out);
            const long resumed = smallest_host_mem(&c), fresh = strtol(cap, NULL, 10) - 1;
            snprintf(cap, sizeof cap, "%ldMiB", (resumed > fresh ? resumed : fresh) + 1);
        }
        base_config(&c, full_out, "cuda", "bf16", 2);
        streamed_resume_case(&c, k, mdir, cap);
        engine_train_ok(&c, 3, "all", 1, placement[k], &full);
        base_config(&c, split_out, "cuda", "bf16", 2);
        streamed_resume_case(&c, k, mdir, cap);
        snprintf(c.resume, sizeof c.resume, "%s/%s", g_dir, split_out);
        engine_train_ok(&c, 3, "all", 1, placement[k], &b);
        assert_int_equal(b.start_step, 10);
        assert_true(b.load_streamed);
        char what[128];
        snprintf(what, sizeof what, "case %d (--optimizer %s%s%s): streamed resume at 10 vs uninterrupted", k,
                 placement[k], cap[0] ? ", --host-mem " : "", cap);
        zt_gpu_fixture_same_losses(what, &b, &full, 11, STEPS);
        expect_same_weights(full_out, split_out);
        zt_train_result_free(&a);
        zt_train_result_free(&b);
        zt_train_result_free(&full);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", mdir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    /* the launch environment of W = 1: this process is rank 0 of 1 */
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_prefetch_checkpointing),
        cmocka_unit_test(test_grad_accum),
        cmocka_unit_test(test_checkpoints_cross),
        cmocka_unit_test(test_host_optimizer_tracks_gpu),
        cmocka_unit_test(test_streamed_weights),
        cmocka_unit_test(test_host_mem),
        cmocka_unit_test(test_streamed_resume),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
