/* BERT and RoBERTa on the GPU (ctest label gpu; exit 77 without a GPU): the CUDA executor
 * (worker/models/encoder_cuda.c) against the CPU runner (worker/models/encoder.c), which
 * tests/interop/bert_hf.py checks against transformers. One micro-batch's logits, loss and every parameter's
 * gradient in fp32, 1e-4 relative (gradients relative to the tensor's largest entry), for
 * - BERT with the masked-LM head: 5 heads of 32, an MLP of 200, a vocabulary of 1001 (padded to 1024 on the
 *   GPU), two token types, exact GELU, sequences with trailing padding, ignored targets;
 * - RoBERTa with a 3-label classification head: 3 heads of 64, the tanh GELU, positions after the padding id,
 *   a sequence that is all padding (not counted);
 * and checkpointed layers give the same bits as kept ones (every layer, and mixed with kept ones). The trainer's GPU runs of both heads are in
 * tests/worker/test_trainer.c (test_bert_on_gpu). */
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
#include "worker/models/bert.h" /* the host model and its CUDA executor */
#include "worker/models/model.h"

#include "../worker/model_once.h"
#include "gpu_fixture.h"

#define PB 3
#define PT 29

static uint64_t g_lcg = 1234567ull;
static uint32_t next_u32(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_lcg >> 33);
}

static float noise(void)
{
    return (float)(next_u32() % 1000000u) / 1e6f - 0.5f;
}

static float run_cuda(const zt_bert *host, const bool *ckpt, const int32_t *tok, const int32_t *types,
                      const int32_t *tgt, float *logits, float *grads)
{
    zt_model *m = NULL;
    zt_err err = {{0}};
    if (zt_bert_cuda_create(&m, host, PB, PT, 1, ZT_DTYPE_F32, ckpt, &err) != 0)
        fail_msg("%s", err.msg);
    m->ops->set_token_types(m, types);
    const float loss = zt_test_model_once(m, zt_bert_params((zt_bert *)host), tok, tgt, PB, PT, logits, grads);
    assert_true(loss >= 0.0f);
    m->ops->destroy(m);
    return loss;
}

static void check_passes(const zt_bert_config *cfg)
{
    zt_bert *host = NULL;
    zt_err err = {{0}};
    if (zt_bert_create(&host, cfg, PB, PT, 42, &err) != 0)
        fail_msg("%s", err.msg);
    /* LayerNorm weights and biases away from 1 and 0, every bias non-zero. */
    float *params = zt_bert_params(host);
    for (int i = 0; i < zt_bert_num_tensors(host); i++) {
        const zt_param_info *t = zt_bert_tensor(host, i);
        if (t->ndim == 1)
            for (size_t k = 0; k < t->numel; k++)
                params[t->offset + k] += 0.3f * noise();
    }
    const bool mlm = cfg->head == ZT_BERT_HEAD_MLM;
    const int N = PB * PT, pad = cfg->pad_token_id, K = zt_bert_config_outputs(cfg);
    int32_t tok[PB * PT], types[PB * PT], tgt[PB * PT];
    for (int b = 0; b < PB; b++) {
        /* sequence 0: full; 1: 9 trailing pad tokens; 2 (RoBERTa): all padding, (BERT) one pad inside */
        const int len = b == 0 ? PT : b == 1 ? PT - 9 : mlm ? PT - 3 : 0;
        for (int t = 0; t < PT; t++) {
            const int i = b * PT + t;
            tok[i] = t < len ? (int32_t)(4 + next_u32() % (uint32_t)(cfg->vocab_size - 4)) : pad;
            types[i] = cfg->type_vocab_size > 1 && t >= len / 2 ? 1 : 0;
            tgt[i] = -1;
            if (mlm && (t % 3 == 1 || t == PT - 1))
                tgt[i] = (int32_t)(next_u32() % (uint32_t)K);
        }
        if (!mlm)
            tgt[b * PT] = b % K;
    }
    if (mlm)
        tok[2 * PT + 5] = pad; /* a pad token inside a sequence is attended to like any token */

    zt_bert_set_token_types(host, types);
    const float want_loss = zt_bert_forward(host, tok, tgt, PB, PT);
    const size_t rows = mlm ? (size_t)N : PB, P = zt_bert_num_params(host);
    float *want_logits = malloc(rows * K * sizeof(float));
    memcpy(want_logits, zt_bert_logits(host), rows * K * sizeof(float));
    zt_bert_zero_grad(host);
    zt_bert_backward(host, 1.0f);
    const float *want_grads = zt_bert_grads(host);

    float *logits = malloc(rows * K * sizeof(float)), *grads = calloc(P, sizeof(float));
    const float loss = run_cuda(host, NULL, tok, types, tgt, logits, grads);
    printf("%s %s: loss %.7f on the GPU, %.7f on the CPU\n", cfg->roberta ? "roberta" : "bert",
           mlm ? "masked LM" : "classifier", (double)loss, (double)want_loss);
    assert_true(fabs((double)loss - (double)want_loss) <= 1e-4 * fabs((double)want_loss));
    /* Padded positions' logits mean nothing (bert.h): compare the rows of real tokens. */
    for (size_t r = 0; r < rows; r++)
        if (!mlm || tok[r] != pad) {
            char what[64];
            snprintf(what, sizeof what, "logits of row %zu", r);
            zt_gpu_fixture_expect_close(what, logits + r * K, want_logits + r * K, (size_t)K, 1e-4, 1e-7);
        }
    for (int i = 0; i < zt_bert_num_tensors(host); i++) {
        const zt_param_info *t = zt_bert_tensor(host, i);
        /* 1e-7 absolute: the key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by
         * every key), so both sides hold rounding noise of about 1e-8 there. */
        zt_gpu_fixture_expect_close(t->name, grads + t->offset, want_grads + t->offset, t->numel, 1e-4, 1e-7);
    }

    /* Checkpointed layers ('1'): every one; runs that keep their sums and one that keeps its output (its
     * neighbour above is not checkpointed); the highest checkpointed layer below kept ones. */
    static const char *const patterns[] = {"11", "10", "01", "1111", "1011", "0110", "1101"};
    float *logits2 = malloc(rows * K * sizeof(float)), *grads2 = calloc(P, sizeof(float));
    int tried = 0;
    for (size_t k = 0; k < sizeof patterns / sizeof patterns[0]; k++) {
        if ((int)strlen(patterns[k]) != cfg->num_hidden_layers)
            continue;
        bool ckpt[4];
        for (int l = 0; l < cfg->num_hidden_layers; l++)
            ckpt[l] = patterns[k][l] == '1';
        memset(grads2, 0, P * sizeof(float));
        const float loss2 = run_cuda(host, ckpt, tok, types, tgt, logits2, grads2);
        printf("checkpointed %s: loss %.7f\n", patterns[k], (double)loss2);
        assert_memory_equal(&loss2, &loss, sizeof loss);
        assert_memory_equal(logits2, logits, rows * K * sizeof(float));
        assert_memory_equal(grads2, grads, P * sizeof(float));
        tried++;
    }
    assert_true(tried >= 3);

    free(want_logits);
    free(logits);
    free(grads);
    free(logits2);
    free(grads2);
    zt_bert_destroy(host);
}

static void test_bert_masked_lm(void **state)
{
    (void)state;
    zt_bert_config c;
    zt_bert_config_default(&c);
    c.vocab_size = 1001;
    c.hidden_size = 160;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 5;
    c.intermediate_size = 200;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.1f;
    check_passes(&c);
}

static void test_roberta_classifier(void **state)
{
    (void)state;
    zt_bert_config c;
    zt_bert_config_default_roberta(&c);
    c.head = ZT_BERT_HEAD_CLASSIFY;
    c.num_labels = 3;
    c.vocab_size = 777;
    c.hidden_size = 192;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 3;
    c.intermediate_size = 344;
    c.max_position_embeddings = 40;
    c.hidden_act = ZT_BERT_ACT_GELU_TANH;
    c.initializer_range = 0.1f;
    check_passes(&c);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bert_masked_lm),
        cmocka_unit_test(test_roberta_classifier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
