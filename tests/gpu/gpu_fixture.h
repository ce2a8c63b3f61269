/* Shared set-up of the GPU tests (test_gpu_training, test_zero_gpu and the executors' tests), on top of
 * tests/worker/train_fixture.h: the skip where no GPU is visible, the small GPT-2 they train, a bit-for-bit
 * loss comparison, a training run's losses against the CPU run's and a tolerance check of GPU values against
 * the CPU's.
 * Include after <cmocka.h>. */
#ifndef ZT_TESTS_GPU_FIXTURE_H
#define ZT_TESTS_GPU_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "../worker/train_fixture.h"
#include "worker/models/gpt2.h"

/* Whether a CUDA GPU is visible; prints that the test is skipped when none is (main then returns 77). */
static inline bool zt_gpu_fixture_have_gpu(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA GPU: skipped\n");
        return false;
    }
    return true;
}

/* The GPT-2 of the GPU tests: n_layer layers of 2 heads of size 64, T = 64, a vocabulary of `vocab`, trained
 * `steps` steps of grad_accum micro-batches of batch_size sequences on the shards dir/<shards>_train_*.bin,
 * evaluated on dir/<shards>_val_*.bin, with checkpoints every 10 steps into dir/out. */
static inline void zt_gpu_fixture_config(zt_train_config *c, const char *dir, const char *shards, const char *out,
                                         const char *device, const char *precision, int n_layer, int vocab,
                                         int steps, int batch_size, int grad_accum)
{
    zt_train_config_init(c);
    zt_family_config_default(&c->model);
    ZT_GPT2_CONFIG(&c->model)->n_layer = n_layer;
    ZT_GPT2_CONFIG(&c->model)->n_head = 2;
    ZT_GPT2_CONFIG(&c->model)->n_embd = 128;
    ZT_GPT2_CONFIG(&c->model)->n_positions = 64;
    ZT_GPT2_CONFIG(&c->model)->vocab_size = vocab;
    c->model_loaded = true;
    snprintf(c->train_data, sizeof(c->train_data), "%s/%s_train_*.bin", dir, shards);
    snprintf(c->val_data, sizeof(c->val_data), "%s/%s_val_*.bin", dir, shards);
    snprintf(c->out_dir, sizeof(c->out_dir), "%s/%s", dir, out);
    zt_err err = {{0}};
    if (zt_train_config_set_flag(c, "--device", device, &err) != 0 ||
        zt_train_config_set_flag(c, "--precision", precision, &err) != 0)
        fail_msg("%s", err.msg);
    c->steps = steps;
    c->batch_size = batch_size;
    c->seq_len = 64;
    c->grad_accum = grad_accum;
    c->lr = 2e-3;
    c->min_lr = 2e-4;
    c->warmup_steps = 3;
    c->eval_every = 10;
    c->eval_batches = 2;
    c->save_every = 10;
    c->log_every = 5;
    c->seed = 11;
    c->threads = 2;
    zt_fixture_finish_config(c);
}

/* Fails unless the losses of steps [first, last] (1-based, as logged) of a and b are equal bit for bit;
 * a and b may start at different steps (a resumed run). Prints how many differ either way. */
static inline void zt_gpu_fixture_same_losses(const char *what, const zt_train_result *a, const zt_train_result *b,
                                              int64_t first, int64_t last)
{
    double worst = 0.0;
    int differ = 0;
    for (int64_t s = first; s <= last; s++) {
        float x = a->losses[s - a->start_step - 1], y = b->losses[s - b->start_step - 1];
        double rel = fabs((double)x - (double)y) / fabs((double)y);
        if (memcmp(&x, &y, sizeof x) != 0) {
            differ++;
            if (rel > worst || isnan(rel))
                worst = rel;
        }
    }
    printf("%s: steps %lld..%lld, %d of %lld losses differ (largest relative difference %.3g)\n", what,
           (long long)first, (long long)last, differ, (long long)(last - first + 1), worst);
    if (differ)
        fail_msg("%s: the losses are not bit-identical (%d differ, up to %.3g relative)", what, differ, worst);
}

/* Fails unless the run r ended at step steps with the loss of each step within rel_tol (relative) of the CPU
 * run ref's, and learnt (its last loss 0.5 below its first). Prints the largest relative difference. */
static inline void zt_gpu_fixture_tracks_cpu(const char *what, const zt_train_result *r, const zt_train_result *ref,
                                             int steps, double rel_tol)
{
    assert_int_equal(r->end_step, steps);
    double worst = 0.0;
    for (int s = 0; s < steps; s++) {
        double rel = fabs((double)r->losses[s] - (double)ref->losses[s]) / fabs((double)ref->losses[s]);
        worst = fmax(worst, rel);
        if (!(rel <= rel_tol))
            fail_msg("%s: step %d loss %.7f vs CPU %.7f (relative %.3g > %.3g)", what, s + 1, (double)r->losses[s],
                     (double)ref->losses[s], rel, rel_tol);
    }
    printf("%s: loss %.5f -> %.5f, largest relative difference to the CPU run %.3g\n", what, (double)r->losses[0],
           (double)r->losses[steps - 1], worst);
    assert_true(r->losses[steps - 1] < r->losses[0] - 0.5f); /* it learns */
}

/* Fails unless got [n] is within tol of want relative to want's largest entry, or within the absolute floor
 * (for tensors whose gradient is zero but for rounding). Names the worst element. */
static inline void zt_gpu_fixture_expect_close(const char *what, const float *got, const float *want, size_t n,
                                               double tol, double floor)
{
    double big = 0.0, worst = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++)
        big = fmax(big, fabs((double)want[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) {
            worst = d;
            wi = i;
        }
    }
    if (!(worst <= tol * big || worst <= floor))
        fail_msg("%s: element %zu is %.8g on the GPU and %.8g on the CPU (%.3g of the largest, %.3g; tolerance %.3g)",
                 what, wi, (double)got[wi], (double)want[wi], worst / big, big, tol);
}

#endif
