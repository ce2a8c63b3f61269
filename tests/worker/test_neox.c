/* GPT-NeoX (worker/models/neox.c on the shared host model): the config reader (Pythia's fields and
 * transformers 5's rope_parameters, contradictions and unsupported values refused by name), the saved config
 * reading back as the same, the per-block passes through the engine's CPU executor with checkpointed layers
 * giving the same bits, and the training engine at two ranks (ZeRO-2 and ZeRO-3, separate processes) giving
 * one rank's loss and gradient within rounding. tests/interop/neox_numpy_ref.py checks the math. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <math.h>

#include "kernels/cpu_threads.h"
#include "worker/comm/comm.h"
#include "worker/engine/engine.h"
#include "worker/models/family.h"
#include "worker/models/model.h"
#include "worker/models/neox.h"

#include "model_once.h"

#define ODD                                                                                                    \
    "\"model_type\": \"gpt_neox\", \"hidden_size\": 48, "                                                  \
    "\"num_attention_heads\": 3, \"num_hidden_layers\": 3, \"intermediate_size\": 40, \"vocab_size\": 1003, "  \
    "\"max_position_embeddings\": 32, \"initializer_range\": 0.2"

static int read_config(zt_family_config *c, const char *body, zt_err *err)
{
    char text[2048];
    snprintf(text, sizeof text, "{%s}", body);
    cJSON *o = cJSON_Parse(text);
    assert_non_null(o);
    zt_family_config_default_of(c, "gpt_neox");
    int rc = zt_family_config_from_json(c, o, "neox.json", err);
    cJSON_Delete(o);
    return rc;
}

static const zt_neox_config *neox(const zt_family_config *c)
{
    return zt_family_config_body_const(c);
}

static void test_config(void **state)
{
    (void)state;
    zt_family_config c;
    zt_err err = {{0}};
    /* transformers 5's form */
    assert_int_equal(read_config(&c, ODD ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500.0, "
                                     "\"partial_rotary_factor\": 0.5}, \"use_parallel_residual\": false, "
                                     "\"hidden_act\": \"gelu_new\", \"classifier_dropout\": 0.1, \"is_decoder\": false, "
                                     "\"architectures\": [\"GPTNeoXForCausalLM\"]",
                                 &err), 0);
    assert_string_equal(zt_family_name(&c), "gpt_neox");
    assert_true(neox(&c)->rotary_pct == 0.5 && neox(&c)->rotary_emb_base == 500.0);
    assert_int_equal(zt_neox_config_rotary_ndims(neox(&c)), 8);
    assert_false(neox(&c)->use_parallel_residual);
    assert_int_equal(neox(&c)->hidden_act, ZT_NEOX_ACT_GELU_NEW);
    /* Pythia's form; the defaults: parallel residuals, exact GELU, attention biases, rotary_pct 0.25 */
    assert_int_equal(read_config(&c, ODD ", \"rotary_pct\": 0.25, \"rotary_emb_base\": 10000", &err), 0);
    assert_true(neox(&c)->use_parallel_residual && neox(&c)->attention_bias);
    assert_int_equal(zt_neox_config_rotary_ndims(neox(&c)), 4);
    /* both, agreeing */
    assert_int_equal(read_config(&c, ODD ", \"rotary_pct\": 0.25, \"rope_parameters\": {\"partial_rotary_factor\": "
                                     "0.25}", &err), 0);

    static const struct {
        const char *body, *needle;
    } bad[] = {
        {ODD ", \"rotary_pct\": 0.5, \"rope_parameters\": {\"partial_rotary_factor\": 0.25}", "disagree"},
        {ODD ", \"rotary_emb_base\": 100, \"rope_parameters\": {\"rope_theta\": 10000.0}", "disagree"},
        {ODD ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0}", "factor"},
        {ODD ", \"rope_parameters\": {\"rope_type\": \"dynamic\"}", "dynamic"},
        {ODD ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling"},
        {ODD ", \"hidden_act\": \"relu\"", "relu"},
        {ODD ", \"hidden_dropout\": 0.1", "hidden_dropout"},
        {ODD ", \"rotary_pct\": 0.3", "rotated channels"}, /* int(16 * 0.3) = 4 is even: fine; 0.2 gives 3 */
        {ODD ", \"rotary_pct\": 0.2", "rotated channels"},
        {ODD ", \"frobnicate\": 1", "frobnicate"},
        {ODD ", \"architectures\": [\"GPTNeoXForSequenceClassification\"]", "GPTNeoXForCausalLM"},
        {ODD ", \"layer_norm_eps\": 2.0", "layer_norm_eps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (i == 7) { /* 0.3 of 16 channels: 4, accepted */
            assert_int_equal(read_config(&c, bad[i].body, &err), 0);
            continue;
        }
        err.msg[0] = '\0';
        if (read_config(&c, bad[i].body, &err) >= 0)
            fail_msg("accepted: %s", bad[i].body);
        if (!strstr(err.msg, bad[i].needle))
            fail_msg("the message for %s does not name '%s': %s", bad[i].body, bad[i].needle, err.msg);
    }
}

static void test_config_save_load(void **state)
{
    (void)state;
    zt_family_config a, b;
    zt_err err = {{0}};
    assert_int_equal(read_config(&a, ODD ", \"rope_parameters\": {\"rope_theta\": 1234.5, \"partial_rotary_factor\": "
                                     "0.5}, \"use_parallel_residual\": false, \"tie_word_embeddings\": true, "
                                     "\"attention_bias\": false, \"hidden_act\": \"gelu_fast\", \"layer_norm_eps\": 1e-6",
                                 &err), 0);
    char dir[] = "/tmp/zt_neox_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(zt_family_config_save(&a, path, &err), 0);
    assert_int_equal(zt_family_config_load(&b, path, &err), 0);
    char av[64], bv[64];
    const char *field = zt_family_config_diff(&a, &b, av, bv, sizeof av);
    if (field)
        fail_msg("%s: %s saved, %s read back", field, av, bv);
    assert_true(zt_family_config_fingerprint(&a) == zt_family_config_fingerprint(&b));
    /* a change shows in the diff and the fingerprint */
    ((zt_neox_config *)zt_family_config_body(&b))->rotary_pct = 0.25;
    assert_string_equal(zt_family_config_diff(&a, &b, av, bv, sizeof av), "rotary_pct");
    assert_true(zt_family_config_fingerprint(&a) != zt_family_config_fingerprint(&b));
    unlink(path);
    rmdir(dir);
}

#define EB 4
#define ET 6
#define ACCUM 2

static void odd_config(zt_family_config *c, bool tied, bool parallel)
{
    char body[1024];
    zt_err err = {{0}};
    snprintf(body, sizeof body, ODD ", \"tie_word_embeddings\": %s, \"use_parallel_residual\": %s",
             tied ? "true" : "false", parallel ? "true" : "false");
    if (read_config(c, body, &err) != 0)
        fail_msg("%s", err.msg);
}

/* One rank of W: the engine over this rank's rows; the step's loss and the gathered gradient in *loss and
 * grads (num_params floats). */
static int engine_rank(const zt_family_config *c, int W, int rank, int level, bool ckpt, const char *name,
                       float *loss, float *grads, char *msg, size_t cap)
{
    zt_err err = {{0}};
    zt_family_model *m = NULL;
    zt_model *model = NULL;
    bool ck[3] = {ckpt, ckpt, ckpt};
    int rc = -1;
    if (zt_family_model_create(&m, c, EB / W, ET, 9, &err) < 0 ||
        zt_family_model_cpu(&model, m, ACCUM, ck, &err) < 0)
        snprintf(msg, cap, "model: %s", err.msg);
    else
        rc = zt_test_engine_step(model, zt_family_model_params(m), W, rank, level, ACCUM, EB / W, ET,
                                 zt_family_config_vocab(c), name, loss, grads, msg, cap);
    if (model)
        model->ops->destroy(model);
    zt_family_model_destroy(m);
    return rc;
}

/* A rank of the two of test_engine: its step against the one rank's, within rounding. */
typedef struct {
    const zt_family_config *c;
    int level;
    const char *name;
    const float *ref;
    float ref_loss;
    double scale;
    size_t n;
    float *got;
} two_ranks;

static int two_ranks_rank(int r, void *ctx)
{
    const two_ranks *t = ctx;
    char msg[ZT_ERR_LEN + 128];
    float l = 0;
    int rc = engine_rank(t->c, 2, r, t->level, r == 1, t->name, &l, t->got, msg, sizeof msg);
    double worst = 0;
    for (size_t i = 0; rc == 0 && i < t->n; i++)
        worst = fmax(worst, fabs((double)t->got[i] - t->ref[i]));
    if (rc == 0 && (fabs(l - t->ref_loss) > 1e-5 * t->ref_loss || worst > 1e-5 * t->scale)) {
        snprintf(msg, sizeof msg, "loss %.9g (W=1 %.9g), largest gradient difference %.3g of %.3g", (double)l,
                 (double)t->ref_loss, worst, t->scale);
        rc = -1;
    }
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", r, msg);
    return rc;
}

static void test_engine(void **state)
{
    (void)state;
    zt_cpu_set_threads(1);
    char msg[ZT_ERR_LEN + 128];
    for (int variant = 0; variant < 2; variant++) {
        zt_family_config c;
        odd_config(&c, variant == 1, variant == 0);
        const size_t n = zt_family_config_num_params(&c);
        float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), ref_loss = 0, loss = 0;
        char name[64];
        snprintf(name, sizeof name, "zt_test_neox_%d_%d_w1", (int)getpid(), variant);
        if (engine_rank(&c, 1, 0, 3, false, name, &ref_loss, ref, msg, sizeof msg) != 0)
            fail_msg("%s", msg);
        snprintf(name, sizeof name, "zt_test_neox_%d_%d_w1c", (int)getpid(), variant);
        if (engine_rank(&c, 1, 0, 3, true, name, &loss, got, msg, sizeof msg) != 0)
            fail_msg("%s", msg);
        assert_memory_equal(&loss, &ref_loss, sizeof loss); /* checkpointed layers: the same bits */
        assert_memory_equal(got, ref, n * sizeof(float));
        double scale = 0;
        for (size_t i = 0; i < n; i++)
            scale = fmax(scale, fabs(ref[i]));
        assert_true(scale > 0 && isfinite(ref_loss));
        for (int level = 2; level <= 3; level++) {
            snprintf(name, sizeof name, "zt_test_neox_%d_%d_%d", (int)getpid(), variant, level);
            two_ranks t = {&c, level, name, ref, ref_loss, scale, n, got};
            int st = 0, r = zt_test_run_ranks(2, two_ranks_rank, &t, &st);
            if (r >= 0)
                fail_msg("variant %d, W=2 ZeRO-%d: rank %d failed (status %d)", variant, level, r, st);
        }
        free(ref);
        free(got);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_save_load),
        cmocka_unit_test(test_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
