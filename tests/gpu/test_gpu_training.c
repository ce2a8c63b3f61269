/* GPU training tests (ctest label gpu; exit 77 without a GPU): `--device cuda` trains a tiny GPT-2 the
 * way the CPU trainer does.
 *
 * - fp32 on the GPU tracks the CPU run's losses step by step from the same init and data;
 * - bf16 and fp16 (dynamic loss scaling) track them within a looser tolerance;
 * - a GPU run stopped at a checkpoint and resumed on the GPU gives the losses of the uninterrupted run,
 *   bit for bit (the kernels are deterministic);
 * - a GPU checkpoint resumes on the CPU and continues as the CPU run does;
 * - with the optimizer off the GPU (--optimizer cpu, or server with the embedded state server in RAM or on
 *   disk) the GPU computes and AdamW runs on the host: fp32 tracks the CPU run, the three host placements give
 *   bit-identical parameters, bf16 and fp16 track as above, and such a run resumes bit for bit;
 * - --save-grads on the GPU writes the step's gradients, close to the CPU run's.
 * The model has head size 64 (what the CUDA attention serves) and a vocabulary of 200, which the GPU
 * pads to 256 rows. */
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
#include "common/safetensors.h"
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
    if (zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_gpu_training_") != 0)
        return -1;
    zt_fixture_write_phrase_shard(g_dir, "g_train_000.bin", 40000, 7, VOCAB);
    zt_fixture_write_phrase_shard(g_dir, "g_val_000.bin", 4000, 9, VOCAB);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

/* A 2-layer model, 2 micro-batches of 4 sequences per step. */
static void base_config(zt_train_config *c, const char *out, const char *device, const char *precision)
{
    zt_gpu_fixture_config(c, g_dir, "g", out, device, precision, 2, VOCAB, STEPS, 4, 2);
}

/* base_config with the optimizer placed off the GPU: "cpu", or "server" with the embedded store
 * ("ram" or "nvme:DIR"). */
static void offload_config(zt_train_config *c, const char *out, const char *precision, const char *optimizer,
                           const char *store)
{
    base_config(c, out, "cuda", precision);
    zt_err err = {{0}};
    if (zt_train_config_set_flag(c, "--optimizer", optimizer, &err) != 0 ||
        (store && zt_train_config_set_flag(c, "--state-store", store, &err) != 0))
        fail_msg("%s", err.msg);
    zt_fixture_finish_config(c);
}

/* Fails unless the tensors of file `name` in checkpoints a and b (run directories' ckpt_<step>) hold the
 * same bytes. */
static void expect_same_tensors(const char *a, const char *b, int step, const char *name)
{
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/ckpt_%06d/%s", g_dir, a, step, name);
    snprintf(pb, sizeof pb, "%s/%s/ckpt_%06d/%s", g_dir, b, step, name);
    zt_err err = {{0}};
    zt_st_file *fa = NULL, *fb = NULL;
    if (zt_st_open(pa, &fa, &err) != 0 || zt_st_open(pb, &fb, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(zt_st_count(fa), zt_st_count(fb));
    for (size_t i = 0; i < zt_st_count(fa); i++) {
        const zt_st_tensor *ta = zt_st_get(fa, i), *tb = zt_st_find(fb, ta->name);
        assert_non_null(tb);
        assert_int_equal(ta->nbytes, tb->nbytes);
        if (memcmp(ta->data, tb->data, ta->nbytes) != 0)
            fail_msg("%s: tensor %s differs between %s and %s", name, ta->name, a, b);
    }
    zt_st_close(fa);
    zt_st_close(fb);
}

/* The CPU reference run, trained once. */
static zt_train_result g_cpu;
static bool g_have_cpu;

static const zt_train_result *cpu_run(void)
{
    if (!g_have_cpu) {
        zt_train_config c;
        base_config(&c, "cpu", "cpu", "auto");
        zt_fixture_train_ok(&c, &g_cpu);
        assert_int_equal(g_cpu.end_step, STEPS);
        g_have_cpu = true;
    }
    return &g_cpu;
}

/* Compares steps [from, to) of a run against the CPU reference; fails beyond rel_tol. Returns the
 * largest relative difference. */
static double compare(const char *what, const zt_train_result *r, int64_t first_step, double rel_tol)
{
    const zt_train_result *ref = cpu_run();
    double worst = 0.0;
    for (int64_t s = first_step; s <= r->end_step; s++) {
        float a = r->losses[s - r->start_step - 1], b = ref->losses[s - ref->start_step - 1];
        double rel = fabs((double)a - (double)b) / fabs((double)b);
        if (rel > worst)
            worst = rel;
        if (!(rel <= rel_tol))
            fail_msg("%s: step %lld loss %.7f vs CPU %.7f (relative %.3g > %.3g)", what, (long long)s, (double)a,
                     (double)b, rel, rel_tol);
    }
    printf("%s: %lld steps, loss %.5f -> %.5f, largest relative difference to the CPU run %.3g\n", what,
           (long long)(r->end_step - first_step + 1), (double)r->losses[0], (double)r->losses[r->end_step - r->start_step - 1], worst);
    return worst;
}

static void test_fp32_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    base_config(&c, "gpu_fp32", "cuda", "fp32");
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    assert_int_equal(r.end_step, STEPS);
    compare("fp32", &r, 1, 1e-4);
    assert_true(r.losses[STEPS - 1] < r.losses[0] - 0.5f); /* it learns */
    zt_train_result_free(&r);
}

static void test_bf16_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    base_config(&c, "gpu_bf16", "cuda", "bf16");
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("bf16", &r, 1, 3e-2);
    zt_train_result_free(&r);
}

static void test_fp16_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    base_config(&c, "gpu_fp16", "cuda", "fp16");
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("fp16", &r, 1, 3e-2);
    assert_int_equal(r.skipped_steps, 0);
    zt_train_result_free(&r);
}

/* Stop at step 10 (checkpoint), resume on the GPU to 20: the same losses as one run, bit for bit. */
static void test_gpu_resume_is_exact(void **state)
{
    (void)state;
    const char *precisions[] = {"bf16", "fp16"};
    for (int k = 0; k < 2; k++) {
        char out_full[32], out_split[32];
        snprintf(out_full, sizeof out_full, "full_%s", precisions[k]);
        snprintf(out_split, sizeof out_split, "split_%s", precisions[k]);
        zt_train_config c;
        base_config(&c, out_full, "cuda", precisions[k]);
        zt_train_result full, a, b;
        zt_fixture_train_ok(&c, &full);
        base_config(&c, out_split, "cuda", precisions[k]);
        c.stop_at_step = 10;
        zt_fixture_train_ok(&c, &a);
        assert_true(a.interrupted);
        base_config(&c, out_split, "cuda", precisions[k]);
        snprintf(c.resume, sizeof c.resume, "%s/%s", g_dir, out_split);
        zt_fixture_train_ok(&c, &b);
        assert_int_equal(b.start_step, 10);
        assert_int_equal(b.end_step, STEPS);
        char what[64];
        snprintf(what, sizeof what, "%s, stopped at step 10 vs uninterrupted", precisions[k]);
        zt_gpu_fixture_same_losses(what, &a, &full, 1, 10);
        snprintf(what, sizeof what, "%s, resumed on the GPU at step 10 vs uninterrupted", precisions[k]);
        zt_gpu_fixture_same_losses(what, &b, &full, 11, STEPS);
        zt_train_result_free(&full);
        zt_train_result_free(&a);
        zt_train_result_free(&b);
    }
}

/* A GPU (fp32) checkpoint at step 10, resumed on the CPU: steps 11..20 follow the CPU run. */
static void test_gpu_checkpoint_resumes_on_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    base_config(&c, "to_cpu", "cuda", "fp32");
    c.stop_at_step = 10;
    zt_train_result a, b;
    zt_fixture_train_ok(&c, &a);
    base_config(&c, "to_cpu", "cpu", "auto");
    snprintf(c.resume, sizeof c.resume, "%s/to_cpu", g_dir);
    zt_fixture_train_ok(&c, &b);
    assert_int_equal(b.start_step, 10);
    compare("GPU checkpoint -> CPU resume", &b, 11, 1e-4);
    zt_train_result_free(&a);
    zt_train_result_free(&b);
}

/* The optimizer off the GPU, fp32 compute: AdamW runs on the host over the GPU's gradients. */
static void test_offload_fp32_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    offload_config(&c, "off_fp32", "fp32", "cpu", NULL);
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    assert_int_equal(r.end_step, STEPS);
    compare("fp32, optimizer on the host", &r, 1, 1e-4);
    zt_train_result_free(&r);
}

/* cpu, server in RAM and server on disk, all with bf16 compute on the GPU: the same host AdamW, so the same
 * losses and checkpoints bit for bit; and they track the CPU run within bf16's tolerance. */
static void test_offload_placements_identical(void **state)
{
    (void)state;
    char nvme[300];
    snprintf(nvme, sizeof nvme, "nvme:%s/off_store", g_dir);
    const char *outs[3] = {"off_cpu", "off_ram", "off_nvme"};
    const char *opts[3] = {"cpu", "server", "server"};
    const char *stores[3] = {NULL, "ram", nvme};
    zt_train_result r[3];
    for (int k = 0; k < 3; k++) {
        zt_train_config c;
        offload_config(&c, outs[k], "bf16", opts[k], stores[k]);
        zt_fixture_train_ok(&c, &r[k]);
        assert_int_equal(r[k].end_step, STEPS);
    }
    compare("bf16, optimizer on the host", &r[0], 1, 3e-2);
    for (int k = 1; k < 3; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s vs --optimizer cpu", outs[k]);
        zt_gpu_fixture_same_losses(what, &r[k], &r[0], 1, STEPS);
        expect_same_tensors(outs[0], outs[k], STEPS, "model.safetensors");
    }
    printf("optimizer cpu, server (ram) and server (disk) with bf16 on the GPU: identical losses and parameters\n");
    for (int k = 0; k < 3; k++)
        zt_train_result_free(&r[k]);
}

/* cpu and server (RAM) with bf16 on the GPU and grad_accum 1: the host gradient is the bf16 gradient itself
 * (placement cpu's AdamW reads it; placement server pushes it in bf16 and pulls bf16 weights), so the same
 * losses and checkpoints bit for bit. */
static void test_offload_placements_identical_bf16_grads(void **state)
{
    (void)state;
    const char *outs[2] = {"off1_cpu", "off1_ram"};
    const char *opts[2] = {"cpu", "server"};
    zt_train_result r[2];
    for (int k = 0; k < 2; k++) {
        zt_train_config c;
        offload_config(&c, outs[k], "bf16", opts[k], k ? "ram" : NULL);
        c.grad_accum = 1;
        zt_fixture_finish_config(&c);
        zt_fixture_train_ok(&c, &r[k]);
        assert_int_equal(r[k].end_step, STEPS);
    }
    zt_gpu_fixture_same_losses("server (bf16 gradients pushed, bf16 weights pulled) vs --optimizer cpu", &r[1], &r[0],
                               1, STEPS);
    expect_same_tensors(outs[0], outs[1], STEPS, "model.safetensors");
    printf("optimizer cpu and server with bf16 on the GPU and grad_accum 1: identical losses and parameters\n");
    for (int k = 0; k < 2; k++)
        zt_train_result_free(&r[k]);
}

/* fp16 with loss scaling and the optimizer on the host; then a stop at step 10 and a resume reproduce the
 * uninterrupted run bit for bit. */
static void test_offload_fp16_and_resume(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result full, a, b;
    offload_config(&c, "off_fp16", "fp16", "cpu", NULL);
    zt_fixture_train_ok(&c, &full);
    compare("fp16, optimizer on the host", &full, 1, 3e-2);
    assert_int_equal(full.skipped_steps, 0);
    offload_config(&c, "off_fp16_split", "fp16", "cpu", NULL);
    c.stop_at_step = 10;
    zt_fixture_train_ok(&c, &a);
    assert_true(a.interrupted);
    offload_config(&c, "off_fp16_split", "fp16", "cpu", NULL);
    snprintf(c.resume, sizeof c.resume, "%s/off_fp16_split", g_dir);
    zt_fixture_train_ok(&c, &b);
    assert_int_equal(b.start_step, 10);
    zt_gpu_fixture_same_losses("fp16 with the optimizer on the host, resumed at step 10 vs uninterrupted", &b, &full,
                               11, STEPS);
    zt_train_result_free(&full);
    zt_train_result_free(&a);
    zt_train_result_free(&b);
}

/* --save-grads on the GPU (both placements): the last step's gradients, within fp32 tolerance of the CPU
 * run's at step 10 (the runs' parameters agree to ~1e-5 there). */
static void test_gpu_save_grads(void **state)
{
    (void)state;
    const char *outs[3] = {"sg_cpu", "sg_gpu", "sg_off"};
    for (int k = 0; k < 3; k++) {
        zt_train_config c;
        if (k == 2)
            offload_config(&c, outs[k], "fp32", "cpu", NULL);
        else
            base_config(&c, outs[k], k == 0 ? "cpu" : "cuda", k == 0 ? "auto" : "fp32");
        c.save_grads = true;
        c.stop_at_step = 10;
        zt_train_result r;
        zt_fixture_train_ok(&c, &r);
        zt_train_result_free(&r);
    }
    char path[3][512];
    zt_st_file *f[3] = {NULL, NULL, NULL};
    zt_err err = {{0}};
    for (int k = 0; k < 3; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s/ckpt_000010/grads.safetensors", g_dir, outs[k]);
        if (zt_st_open(path[k], &f[k], &err) != 0)
            fail_msg("%s", err.msg);
    }
    for (int k = 1; k < 3; k++) {
        double diff2 = 0.0, ref2 = 0.0;
        for (size_t i = 0; i < zt_st_count(f[0]); i++) {
            const zt_st_tensor *t0 = zt_st_get(f[0], i), *t = zt_st_find(f[k], t0->name);
            assert_non_null(t);
            assert_int_equal(t->nbytes, t0->nbytes);
            assert_int_equal(t->dtype, ZT_DTYPE_F32);
            for (size_t j = 0; j < t0->nbytes / 4; j++) {
                float x, y;
                memcpy(&x, (const char *)t0->data + 4 * j, 4);
                memcpy(&y, (const char *)t->data + 4 * j, 4);
                diff2 += ((double)x - y) * ((double)x - y);
                ref2 += (double)x * x;
            }
        }
        double rel = sqrt(diff2 / ref2);
        printf("%s: gradients at step 10 within %.3g (relative L2) of the CPU run's\n", outs[k], rel);
        assert_true(ref2 > 0.0);
        assert_true(rel < 1e-3);
    }
    for (int k = 0; k < 3; k++)
        zt_st_close(f[k]);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_tracks_cpu),
        cmocka_unit_test(test_bf16_tracks_cpu),
        cmocka_unit_test(test_fp16_tracks_cpu),
        cmocka_unit_test(test_gpu_resume_is_exact),
        cmocka_unit_test(test_gpu_checkpoint_resumes_on_cpu),
        cmocka_unit_test(test_offload_fp32_tracks_cpu),
        cmocka_unit_test(test_offload_placements_identical),
        cmocka_unit_test(test_offload_placements_identical_bf16_grads),
        cmocka_unit_test(test_offload_fp16_and_resume),
        cmocka_unit_test(test_gpu_save_grads),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    zt_train_result_free(&g_cpu);
    return rc;
}
