/* The ZeRO runtime on the GPU (worker/runtime/zero_cuda.h) at W = 1 over NCCL, against the single-GPU
 * trainer (ctest label gpu; exit 77 without a GPU). W > 1 needs one GPU per rank (NCCL refuses two
 * ranks on one device): tests/gpu/zero_multi_gpu.sh checks it on a machine with two GPUs.
 *
 * - W = 1 gives the single-GPU trainer's losses bit for bit, from the same init and data, over 20
 *   steps: fp32, bf16, bf16 with grad_accum 2 and fp16 with loss scaling (the reduce-scatter is fp32,
 *   an identity at W = 1, and the norm, clipping and AdamW see the same numbers in the same order);
 * - ZeRO-2 equals ZeRO-3; prefetch 0, 1 and 2 are identical; activation checkpointing all and every:2
 *   equal none (the recomputed forward is deterministic);
 * - grad_accum 2 over half batches equals grad_accum 1 over the whole batch within a tolerance;
 * - a ZeRO checkpoint resumes in the single-GPU trainer with the next losses of the uninterrupted run
 *   (bit for bit), a single-GPU checkpoint resumes in the ZeRO runtime the same way, and a ZeRO fp32
 *   checkpoint resumes on the CPU, following the CPU run. */
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

#include "common/log.h"
#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/runtime/zero_train.h"
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

/* Trains on the ZeRO runtime (W = 1 from the empty launch environment); fails the test on error. */
static void zero_train_ok(const zt_train_config *c, int level, const char *ckpt, int prefetch, zt_train_result *res)
{
    zt_zero_options zo;
    zt_zero_options_init(&zo);
    zo.level = level;
    zo.prefetch = prefetch;
    zt_err err = {{0}};
    assert_int_equal(zt_zero_parse_checkpoint(ckpt, &zo.checkpoint, &zo.checkpoint_every, &err), 0);
    int rc = zt_zero_train_run(c, &zo, res, &err);
    if (rc != 0)
        fail_msg("zt_zero_train_run (%s, level %d, checkpointing %s, prefetch %d) failed (%d): %s", c->out_dir, level,
                 ckpt, prefetch, rc, err.msg);
}

/* W = 1 over NCCL against the single-GPU trainer, bit for bit. */
static void test_w1_equals_single_gpu(void **state)
{
    (void)state;
    const struct {
        const char *precision;
        int accum;
    } cases[] = {{"fp32", 1}, {"bf16", 1}, {"bf16", 2}, {"fp16", 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char out1[64], out2[64], what[96];
        snprintf(out1, sizeof out1, "single_%s_%d", cases[k].precision, cases[k].accum);
        snprintf(out2, sizeof out2, "zero_%s_%d", cases[k].precision, cases[k].accum);
        zt_train_config c;
        zt_train_result ref, z;
        base_config(&c, out1, "cuda", cases[k].precision, cases[k].accum);
        zt_fixture_train_ok(&c, &ref);
        base_config(&c, out2, "cuda", cases[k].precision, cases[k].accum);
        zero_train_ok(&c, 3, "none", 1, &z);
        assert_int_equal(z.end_step, STEPS);
        snprintf(what, sizeof what, "ZeRO-3 W=1 vs single GPU, %s, grad_accum %d", cases[k].precision,
                 cases[k].accum);
        zt_gpu_fixture_same_losses(what, &z, &ref, 1, STEPS);
        assert_memory_equal(&z.last_val_loss, &ref.last_val_loss, sizeof(float));
        assert_true(z.losses[STEPS - 1] < z.losses[0] - 0.5f); /* it learns */
        zt_train_result_free(&ref);
        zt_train_result_free(&z);
    }
}

/* Level, prefetch depth and activation checkpointing change where and when, never what. */
static void test_levels_prefetch_checkpointing(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result ref;
    base_config(&c, "var_ref", "cuda", "bf16", 1);
    zero_train_ok(&c, 3, "none", 1, &ref);
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
        zero_train_ok(&c, cases[k].level, cases[k].ckpt, cases[k].prefetch, &r);
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
    zero_train_ok(&c, 3, "none", 1, &one);
    base_config(&c, "acc2", "cuda", "fp32", 2);
    c.shuffle = false;
    zero_train_ok(&c, 3, "none", 1, &two);
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

/* Checkpoints cross between the runtimes: ZeRO -> single GPU, single GPU -> ZeRO, ZeRO (fp32) -> CPU. */
static void test_checkpoints_cross(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result full, a, b;

    /* ZeRO bf16 stopped at 10, resumed in the single-GPU trainer */
    base_config(&c, "x_full", "cuda", "bf16", 1);
    zt_fixture_train_ok(&c, &full);
    base_config(&c, "x_z2s", "cuda", "bf16", 1);
    c.stop_at_step = 10;
    zero_train_ok(&c, 3, "none", 2, &a);
    assert_true(a.interrupted);
    base_config(&c, "x_z2s", "cuda", "bf16", 1);
    snprintf(c.resume, sizeof c.resume, "%s/x_z2s", g_dir);
    zt_fixture_train_ok(&c, &b);
    assert_int_equal(b.start_step, 10);
    zt_gpu_fixture_same_losses("ZeRO checkpoint at 10 -> single-GPU resume", &b, &full, 11, STEPS);
    zt_train_result_free(&a);
    zt_train_result_free(&b);

    /* single GPU stopped at 10, resumed in the ZeRO runtime */
    base_config(&c, "x_s2z", "cuda", "bf16", 1);
    c.stop_at_step = 10;
    zt_fixture_train_ok(&c, &a);
    base_config(&c, "x_s2z", "cuda", "bf16", 1);
    snprintf(c.resume, sizeof c.resume, "%s/x_s2z", g_dir);
    zero_train_ok(&c, 3, "all", 1, &b);
    assert_int_equal(b.start_step, 10);
    zt_gpu_fixture_same_losses("single-GPU checkpoint at 10 -> ZeRO resume", &b, &full, 11, STEPS);
    zt_train_result_free(&a);
    zt_train_result_free(&b);
    zt_train_result_free(&full);

    /* ZeRO fp32 stopped at 10, resumed on the CPU: follows the CPU run */
    zt_train_result cpu;
    base_config(&c, "x_cpu", "cpu", "auto", 1);
    zt_fixture_train_ok(&c, &cpu);
    base_config(&c, "x_z2c", "cuda", "fp32", 1);
    c.stop_at_step = 10;
    zero_train_ok(&c, 3, "none", 1, &a);
    base_config(&c, "x_z2c", "cpu", "auto", 1);
    snprintf(c.resume, sizeof c.resume, "%s/x_z2c", g_dir);
    zt_fixture_train_ok(&c, &b);
    assert_int_equal(b.start_step, 10);
    double worst = 0.0;
    for (int s = 11; s <= STEPS; s++) {
        double rel = fabs((double)b.losses[s - 11] - (double)cpu.losses[s - 1]) / fabs((double)cpu.losses[s - 1]);
        if (rel > worst)
            worst = rel;
        if (!(rel <= 1e-4))
            fail_msg("ZeRO fp32 checkpoint -> CPU: step %d loss %.7f vs CPU run %.7f", s, (double)b.losses[s - 11],
                     (double)cpu.losses[s - 1]);
    }
    printf("ZeRO fp32 checkpoint at 10 -> CPU resume: largest relative difference to the CPU run %.3g\n", worst);
    zt_train_result_free(&a);
    zt_train_result_free(&b);
    zt_train_result_free(&cpu);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA GPU: skipped\n");
        return 77;
    }
    /* the launch environment of W = 1: this process is rank 0 of 1 */
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_w1_equals_single_gpu),
        cmocka_unit_test(test_levels_prefetch_checkpointing),
        cmocka_unit_test(test_grad_accum),
        cmocka_unit_test(test_checkpoints_cross),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
