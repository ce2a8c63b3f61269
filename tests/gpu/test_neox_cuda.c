/* GPT-NeoX on the GPU (ctest label gpu; exit 77 without a GPU): the CUDA executor (the decoder program of
 * worker/models/decoder_cuda.c) against the CPU host model (worker/models/neox.c), which
 * tests/interop/neox_numpy_ref.py and neox_hf.py check against transformers' model.
 *
 * - one micro-batch's logits, loss and every parameter's gradient in fp32, for heads of 32 channels with 8
 *   rotated (rotary_pct 0.25), an MLP of 344, a vocabulary of 1003 and ignored targets: parallel residuals
 *   with exact GELU and an untied head, sequential residuals with gelu_new and a tied head, and no attention
 *   biases: 1e-4 relative (gradients relative to the tensor's largest entry); checkpointed layers give the
 *   same bits as kept ones;
 * - `ztrain train --device cuda` tracks the CPU run's losses (fp32 1e-4, bf16 3e-2), resident, and with the
 *   optimizer on the host, every layer checkpointed and the weights streamed under --gpu-mem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "worker/models/family.h"
#include "worker/models/model.h"
#include "worker/train/trainer.h"

#include "gpu_fixture.h"
#include "../worker/model_once.h"

#define VOCAB 1003
#define STEPS 16
#define PB 3 /* the pass test's batch */
#define PT 37

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    if (zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_neox_cuda_") != 0)
        return -1;
    zt_fixture_write_phrase_shard(g_dir, "n_train_000.bin", 40000, 7, 300);
    zt_fixture_write_phrase_shard(g_dir, "n_val_000.bin", 4000, 9, 300);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

/* The config of variant k (0: parallel, gelu, untied; 1: sequential, gelu_new, tied; 2: no attention biases)
 * through the family's config reader. */
static void neox_config(zt_family_config *c, int k, double init_range)
{
    static const char *const variants[] = {
        "\"use_parallel_residual\": true, \"hidden_act\": \"gelu\", \"tie_word_embeddings\": false",
        "\"use_parallel_residual\": false, \"hidden_act\": \"gelu_new\", \"tie_word_embeddings\": true",
        "\"use_parallel_residual\": true, \"hidden_act\": \"gelu\", \"attention_bias\": false",
    };
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"gpt_neox\", \"hidden_size\": 128, \"num_attention_heads\": 4, "
             "\"num_hidden_layers\": 2, \"intermediate_size\": 344, \"vocab_size\": %d, "
             "\"max_position_embeddings\": 64, \"rotary_pct\": 0.25, \"rotary_emb_base\": 10000.0, "
             "\"initializer_range\": %g, %s}", VOCAB, init_range, variants[k]);
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    zt_err err = {{0}};
    zt_family_config_default_of(c, "gpt_neox");
    if (zt_family_config_from_json(c, obj, "test config", &err) != 0)
        fail_msg("%s", err.msg);
    cJSON_Delete(obj);
}

static uint64_t g_lcg = 88172645463325252ull;
static float noise(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_lcg >> 40) / (double)(1ull << 24)) - 0.5f;
}

static const float *host_logits(const void *m)
{
    return zt_family_model_logits(m);
}

static float run_cuda(const zt_family_model *host, const bool *ckpt, const int32_t *tok, const int32_t *tgt,
                      float *logits, float *grads)
{
    zt_model *m = NULL;
    zt_err err = {{0}};
    if (zt_family_model_cuda(&m, host, PB, PT, 1, ZT_DTYPE_F32, ckpt, &err) != 0)
        fail_msg("%s", err.msg);
    const float loss =
        zt_test_model_once(m, zt_family_model_params((zt_family_model *)host), tok, tgt, PB, PT, logits, grads);
    assert_true(loss >= 0.0f);
    m->ops->destroy(m);
    return loss;
}

static void check_passes(int variant)
{
    zt_family_config cfg;
    neox_config(&cfg, variant, 0.1);
    zt_family_model *host = NULL;
    zt_err err = {{0}};
    if (zt_family_model_create(&host, &cfg, PB, PT, 42, &err) != 0)
        fail_msg("%s", err.msg);
    /* LayerNorm weights away from 1 and biases away from 0, so that their gradients are checked. */
    float *params = zt_family_model_params(host);
    for (int i = 0; i < zt_family_model_num_tensors(host); i++) {
        const zt_param_info *t = zt_family_model_tensor(host, i);
        if (t->ndim == 1)
            for (size_t k = 0; k < t->numel; k++)
                params[t->offset + k] = (strstr(t->name, "norm.weight") ? 1.0f : 0.0f) + noise();
    }
    const int N = PB * PT;
    int32_t tok[PB * PT], tgt[PB * PT];
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)((i * 7919u + 13u) % VOCAB);
        tgt[i] = (int32_t)((i * 104729u + 3u) % VOCAB);
    }
    tgt[5] = tgt[N - 1] = -1; /* ignored targets */
    tgt[7] = VOCAB - 1;       /* the last row of the vocabulary, next to the padding rows of the GPU head */

    const size_t P = zt_family_model_num_params(host), NV = (size_t)N * VOCAB;
    zt_model *cm = NULL;
    if (zt_family_model_cpu(&cm, host, 1, NULL, &err) != 0)
        fail_msg("%s", err.msg);
    float *want_logits = malloc(NV * sizeof(float)), *want_grads = calloc(P, sizeof(float));
    const float want_loss =
        zt_test_model_once_cpu(cm, params, tok, tgt, PB, PT, host_logits, host, NV, want_logits, want_grads);
    cm->ops->destroy(cm);

    float *logits = malloc(NV * sizeof(float)), *grads = calloc(P, sizeof(float));
    const float loss = run_cuda(host, NULL, tok, tgt, logits, grads);
    printf("variant %d: loss %.7f on the GPU, %.7f on the CPU\n", variant, (double)loss, (double)want_loss);
    assert_true(fabs((double)loss - (double)want_loss) <= 1e-4 * fabs((double)want_loss));
    zt_gpu_fixture_expect_close("logits", logits, want_logits, NV, 1e-4, 0.0);
    for (int i = 0; i < zt_family_model_num_tensors(host); i++) {
        const zt_param_info *t = zt_family_model_tensor(host, i);
        zt_gpu_fixture_expect_close(t->name, grads + t->offset, want_grads + t->offset, t->numel, 1e-4, 0.0);
    }
    static const bool patterns[][2] = {{true, true}, {true, false}, {false, true}};
    float *logits2 = malloc(NV * sizeof(float)), *grads2 = calloc(P, sizeof(float));
    for (size_t k = 0; k < sizeof patterns / sizeof patterns[0]; k++) {
        memset(grads2, 0, P * sizeof(float));
        const float loss2 = run_cuda(host, patterns[k], tok, tgt, logits2, grads2);
        assert_memory_equal(&loss2, &loss, sizeof loss);
        assert_memory_equal(logits2, logits, NV * sizeof(float));
        assert_memory_equal(grads2, grads, P * sizeof(float));
    }
    free(want_logits);
    free(want_grads);
    free(logits);
    free(grads);
    free(logits2);
    free(grads2);
    zt_family_model_destroy(host);
}

static void test_parallel_untied_matches_cpu(void **state)
{
    (void)state;
    check_passes(0);
}

static void test_sequential_tied_matches_cpu(void **state)
{
    (void)state;
    check_passes(1);
}

static void test_no_attention_bias_matches_cpu(void **state)
{
    (void)state;
    check_passes(2);
}

/* ---- training through `ztrain train` ---- */

static void train_config(zt_train_config *c, const char *out, const char *device, const char *precision)
{
    zt_gpu_fixture_config(c, g_dir, "n", out, device, precision, 2, VOCAB, STEPS, 4, 2);
    neox_config(&c->model, 0, 0.02);
    zt_fixture_finish_config(c);
}

static zt_train_result g_cpu;
static bool g_have_cpu;

static const zt_train_result *cpu_run(void)
{
    if (!g_have_cpu) {
        zt_train_config c;
        train_config(&c, "cpu", "cpu", "auto");
        zt_fixture_train_ok(&c, &g_cpu);
        assert_int_equal(g_cpu.end_step, STEPS);
        g_have_cpu = true;
    }
    return &g_cpu;
}

static void compare(const char *what, const zt_train_result *r, double rel_tol)
{
    zt_gpu_fixture_tracks_cpu(what, r, cpu_run(), STEPS, rel_tol);
}

static void test_train_fp32_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    train_config(&c, "gpu_fp32", "cuda", "fp32");
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("neox fp32", &r, 1e-4);
    zt_train_result_free(&r);
}

static void test_train_bf16_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    train_config(&c, "gpu_bf16", "cuda", "bf16");
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("neox bf16", &r, 3e-2);
    zt_train_result_free(&r);
}

/* The optimizer on the host, every layer checkpointed and the weights streamed under a GPU memory limit. */
static void test_train_streamed_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    train_config(&c, "gpu_stream", "cuda", "fp32");
    zt_err err = {{0}};
    if (zt_train_config_set_flag(&c, "--optimizer", "cpu", &err) != 0 ||
        zt_train_config_set_flag(&c, "--checkpointing", "all", &err) != 0 ||
        zt_train_config_set_flag(&c, "--weights", "host", &err) != 0 ||
        zt_train_config_set_flag(&c, "--gpu-mem", "256MiB", &err) != 0)
        fail_msg("%s", err.msg);
    zt_fixture_finish_config(&c);
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("neox fp32, optimizer cpu, streamed, checkpointed", &r, 1e-4);
    zt_train_result_free(&r);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_untied_matches_cpu),
        cmocka_unit_test(test_sequential_tied_matches_cpu),
        cmocka_unit_test(test_no_attention_bias_matches_cpu),
        cmocka_unit_test(test_train_fp32_tracks_cpu),
        cmocka_unit_test(test_train_bf16_tracks_cpu),
        cmocka_unit_test(test_train_streamed_tracks_cpu),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    zt_train_result_free(&g_cpu);
    return rc;
}
