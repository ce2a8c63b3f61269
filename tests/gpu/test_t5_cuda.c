/* T5 on the GPU (ctest label gpu; exit 77 without a GPU): the CUDA executor (worker/models/t5.c, the layer
 * program with the CUDA binding) against the CPU passes, which tests/interop/t5_hf.py checks against
 * transformers.
 *
 * One micro-batch in fp32, for T5 v1.0 (ReLU, tied and rescaled head) and v1.1 (gated GELU, untied head), with
 * a vocabulary of 301 (padded to 384 rows on the GPU), heads of 16 in 4 heads that do not make d_model 48,
 * encoder inputs padded (lengths 11, 6 and 3 of 11) and ignored targets: the logits, the loss and every
 * parameter's gradient (both bias tables included) agree to 1e-4 relative (gradients relative to the tensor's
 * largest entry); the same with checkpointed layers. */
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

#include <cjson/cJSON.h>

#include "common/log.h"
#include "worker/models/family.h"
#include "worker/models/model.h"
#include "worker/models/t5.h"

#include "gpu_fixture.h"
#include "t5_cuda_pass.h"

enum { B = 3, T = 11, TD = 7, V = 301 };

static const char *config_json(bool v11)
{
    return v11 ? "{\"model_type\": \"t5\", \"vocab_size\": 301, \"d_model\": 48, \"d_kv\": 16, \"d_ff\": 72, "
                 "\"num_layers\": 2, \"num_decoder_layers\": 3, \"num_heads\": 4, "
                 "\"relative_attention_num_buckets\": 32, \"relative_attention_max_distance\": 128, "
                 "\"feed_forward_proj\": \"gated-gelu\", \"tie_word_embeddings\": false}"
               : "{\"model_type\": \"t5\", \"vocab_size\": 301, \"d_model\": 48, \"d_kv\": 16, \"d_ff\": 80, "
                 "\"num_layers\": 2, \"num_decoder_layers\": 3, \"num_heads\": 4, "
                 "\"relative_attention_num_buckets\": 8, \"relative_attention_max_distance\": 20, "
                 "\"feed_forward_proj\": \"relu\", \"tie_word_embeddings\": true}";
}

static uint64_t g_lcg = 88172645463325252ull;
static float noise(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_lcg >> 40) / (double)(1ull << 24)) - 0.5f;
}

/* ckpt: the layers (2 encoder, then 3 decoder) the executor checkpoints, or NULL. */
static void check(bool v11, const bool *ckpt)
{
    zt_family_config cfg;
    zt_err err = {{0}};
    cJSON *obj = cJSON_Parse(config_json(v11));
    assert_non_null(obj);
    assert_int_equal(zt_family_config_from_json(&cfg, obj, "test config", &err), 0);
    cJSON_Delete(obj);
    zt_family_model *fm = NULL;
    assert_int_equal(zt_family_model_create(&fm, &cfg, B, T, 42, &err), 0);
    float *params = zt_family_model_params(fm);
    for (int i = 0; i < zt_family_model_num_tensors(fm); i++) { /* norms away from 1 */
        const zt_param_info *t = zt_family_model_tensor(fm, i);
        if (t->ndim == 1)
            for (size_t k = 0; k < t->numel; k++)
                params[t->offset + k] = 1.0f + noise();
    }
    int32_t enc[B * T], tgt[B * T], dec[B * TD];
    const int32_t lens[B] = {11, 6, 3};
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            enc[b * T + t] = t < lens[b] ? (int32_t)((b * 7919u + t * 104729u + 5u) % V) : 0;
            tgt[b * T + t] = t < TD ? (int32_t)((b * 31u + t * 7u + 2u) % V) : -1;
        }
    tgt[1 * T + 5] = tgt[1 * T + 6] = tgt[2 * T + 4] = -1; /* ignored targets */
    tgt[0] = V - 1;                                      /* the last row, beside the GPU head's padding rows */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < TD; t++)
            dec[b * TD + t] = t == 0 ? 0 : tgt[b * T + t - 1] < 0 ? 0 : tgt[b * T + t - 1];
    const zt_model_seq2seq s = {.decoder_tokens = dec, .Td = TD, .encoder_lens = lens};

    zt_t5 *h = zt_family_model_host(fm);
    const size_t P = zt_family_model_num_params(fm), NV = (size_t)B * TD * V;
    zt_family_model_zero_grad(fm);
    const float want_loss = zt_t5_forward(h, enc, B, T, &s, tgt);
    float *want_logits = malloc(NV * sizeof(float));
    memcpy(want_logits, zt_t5_logits(h), NV * sizeof(float));
    zt_t5_backward(h, 1.0f);
    const float *want_grads = zt_family_model_grads(fm);

    zt_model *m = NULL;
    if (zt_family_model_cuda(&m, fm, B, T, 1, ZT_DTYPE_F32, ckpt, &err) != 0)
        fail_msg("%s", err.msg);
    float *logits = malloc(NV * sizeof(float)), *grads = calloc(P, sizeof(float));
    float loss = 0.0f;
    assert_int_equal(zt_t5_cuda_pass(m, params, &s, enc, tgt, B, T, logits, grads, &loss), 0);
    m->ops->destroy(m);
    printf("T5 %s%s: loss %.7f on the GPU, %.7f on the CPU\n", v11 ? "v1.1" : "v1.0", ckpt ? " checkpointed" : "",
           (double)loss, (double)want_loss);
    assert_true(fabs((double)loss - (double)want_loss) <= 1e-4 * fabs((double)want_loss));
    zt_gpu_fixture_expect_close("logits", logits, want_logits, NV, 1e-4, 0.0);
    for (int i = 0; i < zt_family_model_num_tensors(fm); i++) {
        const zt_param_info *t = zt_family_model_tensor(fm, i);
        zt_gpu_fixture_expect_close(t->name, grads + t->offset, want_grads + t->offset, t->numel, 1e-4, 0.0);
    }
    free(logits);
    free(want_logits);
    free(grads);
    zt_family_model_destroy(fm);
}

static void test_t5_v10_matches_cpu(void **state)
{
    (void)state;
    check(false, NULL);
}

static void test_t5_v11_matches_cpu(void **state)
{
    (void)state;
    check(true, NULL);
}

/* Checkpointed layers share one set of intermediates and are rebuilt before their backward: every layer (the
 * last one's rebuild skipped, its set still holding its values), and a mix with a kept layer between
 * checkpointed ones and the encoder's top kept. */
static void test_t5_checkpointed_matches_cpu(void **state)
{
    (void)state;
    const bool all[5] = {true, true, true, true, true}, mix[5] = {true, false, true, false, true};
    check(false, all);
    check(true, mix);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5_v10_matches_cpu),
        cmocka_unit_test(test_t5_v11_matches_cpu),
        cmocka_unit_test(test_t5_checkpointed_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
