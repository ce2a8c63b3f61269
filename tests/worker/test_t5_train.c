/* T5 through the trainer: a tiny T5 v1.1 (examples/t5-tiny.json: gated-gelu, untied head, vocabulary 256 with
 * the byte-level examples/byte-tokenizer.json) trained on input/target examples (reverse a word) on the CPU.
 * Checks that the loss falls; that two ranks, each with half of every batch, train the same model as one; that
 * a resumed run ends on the same bits; that the per-block passes with every layer checkpointed (each rebuilt
 * before its backward) give the gradient of the whole passes bit for bit; and that the settings of the task are
 * checked (input/target data needed, --target-len at most --seq-len, not for other models). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/models/family.h"
#include "worker/models/model.h"
#include "worker/models/t5.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

#include "model_once.h"
#include "train_fixture.h"

static zt_fixture_examples g; /* the temporary folder and the files */

enum { B = 4, T = 20, TD = 12, STEPS = 12 };

/* Words of 3 to 9 letters and their reversals. */
static void write_examples(const char *path, int n, unsigned seed)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    unsigned x = seed;
    for (int i = 0; i < n; i++) {
        char w[16], r[16];
        x = x * 1664525u + 1013904223u;
        const int len = 3 + (int)(x >> 28) % 7;
        for (int k = 0; k < len; k++) {
            x = x * 1664525u + 1013904223u;
            w[k] = (char)('a' + (x >> 24) % 8);
        }
        for (int k = 0; k < len; k++)
            r[k] = w[len - 1 - k];
        w[len] = r[len] = '\0';
        fprintf(f, "{\"input\": \"reverse: %s\", \"target\": \"%s\"}\n", w, r);
    }
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    zt_log_set_level(ZT_LOG_WARN);
    if (zt_fixture_examples_setup(&g, "zt_t5_train_", "t5-tiny.json") < 0)
        return -1;
    write_examples(g.train, 30, 7);
    write_examples(g.val, B, 99);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g.dir);
}

static void t5_config(zt_train_config *c, const char *out)
{
    zt_fixture_examples_config(c, &g, out, STEPS, B, T);
    c->target_len = TD;
    c->eval_every = 6;
    zt_fixture_finish_config(c);
}

static zt_family_model *load_family(const char *path)
{
    zt_family_config cfg;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_family_config_load(&cfg, g.model, &err), 0);
    assert_int_equal(zt_family_model_create(&m, &cfg, B, T, 1, &err), 0);
    if (zt_family_model_import(m, path, &err) < 0)
        fail_msg("%s", err.msg);
    return m;
}

static void test_t5_trains(void **state)
{
    (void)state;
    zt_train_config c;
    t5_config(&c, "A");
    zt_train_result res;
    zt_fixture_train_ok(&c, &res);
    zt_fixture_expect_loss_falls("t5", &res, STEPS, 0.5f);
    zt_train_result_free(&res);
}

/* Two ranks, each with half of every batch (rows with different numbers of target tokens), train the same
 * model as one: the final weights agree to rounding. */
static void test_t5_two_ranks(void **state)
{
    (void)state;
    float one[STEPS], two[STEPS];
    char p1[ZT_TRAIN_PATH_MAX + 64], p2[ZT_TRAIN_PATH_MAX + 64];
    zt_fixture_train_one_and_two(t5_config, STEPS, one, two, p1, p2, sizeof p1);
    zt_family_model *m1 = load_family(p1), *m2 = load_family(p2);
    const float *w1 = zt_family_model_params(m1), *w2 = zt_family_model_params(m2);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < zt_family_model_num_params(m1); i++) {
        worst = fmax(worst, fabs((double)w1[i] - w2[i]));
        scale = fmax(scale, fabs((double)w1[i]));
    }
    print_message("t5 W=2: largest weight difference from W=1 %.3g of %.3g; losses %.4f -> %.4f (W=1)\n", worst,
                  scale, (double)one[0], (double)one[STEPS - 1]);
    assert_true(worst < 1e-5 * scale);
    assert_true(one[STEPS - 1] < one[0]);
    zt_family_model_destroy(m1);
    zt_family_model_destroy(m2);
}

static void test_t5_resume(void **state)
{
    (void)state;
    zt_fixture_check_resume(t5_config, STEPS, 6);
}

/* The engine's CPU executor with every layer checkpointed (discarded after its forward, rebuilt before its
 * backward) gives the whole passes' loss and gradient bit for bit, with padded inputs. */
static void test_t5_checkpointed_passes(void **state)
{
    (void)state;
    zt_family_config cfg;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_family_config_load(&cfg, g.model, &err), 0);
    assert_int_equal(zt_family_model_create(&m, &cfg, 2, 9, 3, &err), 0);
    const int32_t enc[18] = {5, 9, 44, 100, 7, 1, 0, 0, 0, 31, 32, 33, 34, 35, 36, 37, 38, 1};
    const int32_t lens[2] = {6, 9}, dec[10] = {0, 70, 71, 72, 0, 0, 80, 81, 82, 83};
    int32_t tgt[18];
    const int32_t t0[5] = {70, 71, 72, 1, -1}, t1[5] = {80, 81, 82, 83, 1};
    for (int j = 0; j < 9; j++) {
        tgt[j] = j < 5 ? t0[j] : -1;
        tgt[9 + j] = j < 5 ? t1[j] : -1;
    }
    const zt_model_seq2seq s = {.decoder_tokens = dec, .Td = 5, .encoder_lens = lens};
    zt_t5 *h = zt_family_model_host(m);
    const size_t n = zt_family_model_num_params(m);
    zt_family_model_zero_grad(m);
    const float whole = zt_t5_forward(h, enc, 2, 9, &s, tgt);
    zt_t5_backward(h, 1.0f);
    float *ref = malloc(n * sizeof *ref);
    memcpy(ref, zt_family_model_grads(m), n * sizeof *ref);

    const int layers = zt_family_config_layers(&cfg);
    bool ckpt[64];
    for (int l = 0; l < layers; l++)
        ckpt[l] = true;
    zt_model *x = NULL;
    assert_int_equal(zt_family_model_cpu(&x, m, 1, ckpt, &err), 0);
    zt_family_model_zero_grad(m);
    float *w = zt_family_model_params(m), *g = zt_family_model_grads(m);
    x->ops->set_seq2seq(x, &s);
    assert_true(zt_test_cpu_passes(x, w, g, enc, tgt, 2, 9, NULL) == whole);
    assert_memory_equal(g, ref, n * sizeof *ref);
    x->ops->destroy(x);
    free(ref);
    zt_family_model_destroy(m);
}

static void expect_invalid(zt_train_config *c, const char *needle)
{
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_validate(c, &err), ZT_EINVAL_CONFIG);
    if (!strstr(err.msg, needle))
        fail_msg("expected '%s' in: %s", needle, err.msg);
}

static void test_t5_config(void **state)
{
    (void)state;
    zt_train_config c;
    t5_config(&c, "X");
    c.target_len = T + 1;
    expect_invalid(&c, "--target-len");
    t5_config(&c, "X");
    c.sft_data[0] = '\0';
    c.sft_val_data[0] = '\0';
    expect_invalid(&c, "{\"input\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5_checkpointed_passes),
        cmocka_unit_test(test_t5_trains),
        cmocka_unit_test(test_t5_two_ranks),
        cmocka_unit_test(test_t5_resume),
        cmocka_unit_test(test_t5_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
