/* LLaMA on the GPU (ctest label gpu; exit 77 without a GPU): the CUDA executor (worker/models/decoder_cuda.c)
 * against the CPU host model (worker/models/llama.c), which tests/interop/llama_hf.py checks against
 * transformers.
 *
 * - one micro-batch's logits, loss and every parameter's gradient in fp32, for an odd shape (6 query heads
 *   sharing 2 key/value heads, an MLP of 344, a vocabulary of 1001, llama3 rope scaling, a padding token,
 *   ignored targets), with an untied and with a tied head: 1e-4 relative (gradients relative to the
 *   tensor's largest entry);
 * - checkpointed layers give the same bits as kept ones;
 * - `ztrain train --device cuda` on a LLaMA config tracks the CPU run's losses (fp32 1e-4, bf16 3e-2), with
 *   the optimizer on the GPU and, streamed weights and all, off it. */
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
#include "worker/models/llama.h"
#include "worker/models/llama.h"
#include "worker/models/model.h"
#include "worker/train/trainer.h"

#include "gpu_fixture.h"
#include "../worker/model_once.h"

#define VOCAB 1001
#define STEPS 16
#define PB 3  /* the pass test's batch */
#define PT 37

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    if (zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_llama_cuda_") != 0)
        return -1;
    zt_fixture_write_phrase_shard(g_dir, "l_train_000.bin", 40000, 7, 300);
    zt_fixture_write_phrase_shard(g_dir, "l_val_000.bin", 4000, 9, 300);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

/* The odd shape: hidden 6 x head_size (192: heads of 32) in 6 heads (3 query heads per key/value head), MLP
 * 344, vocabulary 1001. */
static void odd_config(zt_llama_config *c, bool tied, int head_size)
{
    zt_llama_config_default(c);
    c->num_hidden_layers = 2;
    c->hidden_size = 6 * head_size;
    c->num_attention_heads = 6;
    c->num_key_value_heads = 2;
    c->intermediate_size = 344;
    c->vocab_size = VOCAB;
    c->max_position_embeddings = 64;
    c->rms_norm_eps = 1e-5f;
    c->rope.theta = 10000.0;
    c->rope.scaling = ZT_ROPE_SCALING_LLAMA3;
    c->rope.factor = 8.0;
    c->rope.low_freq_factor = 1.0;
    c->rope.high_freq_factor = 4.0;
    c->rope.original_max_position_embeddings = 16;
    c->tie_word_embeddings = tied;
    c->initializer_range = 0.1;
    c->pad_token_id = 5;
}

static uint64_t g_lcg = 88172645463325252ull;
static float noise(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_lcg >> 40) / (double)(1ull << 24)) - 0.5f;
}

/* Runs one micro-batch through the CUDA executor in fp32 from host's parameters: logits [B,T,V], the mean
 * loss and the gradient slab in the host layout. */
static float run_cuda(const zt_llama *host, const bool *ckpt, const int32_t *tok, const int32_t *tgt, float *logits,
                      float *grads)
{
    zt_model *m = NULL;
    zt_err err = {{0}};
    if (zt_llama_cuda_create(&m, host, PB, PT, 1, ZT_DTYPE_F32, ckpt, &err) != 0)
        fail_msg("%s", err.msg);
    const float loss = zt_test_model_once(m, zt_llama_params((zt_llama *)host), tok, tgt, PB, PT, logits, grads);
    assert_true(loss >= 0.0f);
    m->ops->destroy(m);
    return loss;
}

static void check_passes(bool tied, int head_size)
{
    zt_llama_config cfg;
    odd_config(&cfg, tied, head_size);
    zt_llama *host = NULL;
    zt_err err = {{0}};
    if (zt_llama_create(&host, &cfg, PB, PT, 42, &err) != 0)
        fail_msg("%s", err.msg);
    /* Norm weights away from 1, so that their gradients and the norms' scaling are checked. */
    float *params = zt_llama_params(host);
    for (int i = 0; i < zt_llama_num_tensors(host); i++) {
        const zt_param_info *t = zt_llama_tensor(host, i);
        if (t->ndim == 1)
            for (size_t k = 0; k < t->numel; k++)
                params[t->offset + k] = 1.0f + noise();
    }
    const int N = PB * PT;
    int32_t tok[PB * PT], tgt[PB * PT];
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)((i * 7919u + 13u) % VOCAB);
        tgt[i] = (int32_t)((i * 104729u + 3u) % VOCAB);
    }
    tok[4] = cfg.pad_token_id; /* the padding row gets no gradient from the embedding */
    tgt[5] = tgt[N - 1] = -1;  /* ignored targets */
    tgt[7] = VOCAB - 1;        /* the last row of the vocabulary, next to the padding rows of the GPU head */

    const size_t P = zt_llama_num_params(host), NV = (size_t)N * VOCAB;
    const float want_loss = zt_llama_forward(host, tok, tgt, PB, PT);
    float *want_logits = malloc(NV * sizeof(float));
    memcpy(want_logits, zt_llama_logits(host), NV * sizeof(float));
    zt_llama_zero_grad(host);
    zt_llama_backward(host, 1.0f);
    const float *want_grads = zt_llama_grads(host);

    float *logits = malloc(NV * sizeof(float)), *grads = calloc(P, sizeof(float));
    const float loss = run_cuda(host, NULL, tok, tgt, logits, grads);
    printf("%s head: loss %.7f on the GPU, %.7f on the CPU\n", tied ? "tied" : "untied", (double)loss,
           (double)want_loss);
    assert_true(fabs((double)loss - (double)want_loss) <= 1e-4 * fabs((double)want_loss));
    zt_gpu_fixture_expect_close("logits", logits, want_logits, NV, 1e-4, 0.0);
    for (int i = 0; i < zt_llama_num_tensors(host); i++) {
        const zt_param_info *t = zt_llama_tensor(host, i);
        zt_gpu_fixture_expect_close(t->name, grads + t->offset, want_grads + t->offset, t->numel, 1e-4, 0.0);
    }
    /* The padding row: no gradient from the embedding (with a tied head, the head's part alone). */
    if (!tied)
        for (int c = 0; c < cfg.hidden_size; c++)
            assert_true(grads[(size_t)cfg.pad_token_id * cfg.hidden_size + c] == 0.0f);

    /* Checkpointed layers (every one, the lower, the upper): the same bits. */
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
    free(logits);
    free(grads);
    free(logits2);
    free(grads2);
    zt_llama_destroy(host);
}

static void test_untied_head_matches_cpu(void **state)
{
    (void)state;
    check_passes(false, 32);
}

static void test_tied_head_matches_cpu(void **state)
{
    (void)state;
    check_passes(true, 32);
}

/* Heads of 40 channels, which the packed attention kernels are not built for: the general kernels. */
static void test_head_size_40_matches_cpu(void **state)
{
    (void)state;
    check_passes(false, 40);
}

/* ---- training through `ztrain train` ---- */

static void train_config(zt_train_config *c, const char *out, const char *device, const char *precision)
{
    zt_gpu_fixture_config(c, g_dir, "l", out, device, precision, 2, VOCAB, STEPS, 4, 2);
    zt_family_config_default_of(&c->model, "llama");
    odd_config(ZT_LLAMA_CONFIG(&c->model), false, 32);
    ZT_LLAMA_CONFIG(&c->model)->initializer_range = 0.02;
    ZT_LLAMA_CONFIG(&c->model)->pad_token_id = -1;
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
    compare("llama fp32", &r, 1e-4);
    zt_train_result_free(&r);
}

static void test_train_bf16_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    train_config(&c, "gpu_bf16", "cuda", "bf16");
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("llama bf16", &r, 3e-2);
    zt_train_result_free(&r);
}

/* The optimizer on the host, every layer checkpointed and the weights streamed from host memory. */
static void test_train_offloaded_tracks_cpu(void **state)
{
    (void)state;
    zt_train_config c;
    train_config(&c, "gpu_offload", "cuda", "fp32");
    zt_err err = {{0}};
    if (zt_train_config_set_flag(&c, "--optimizer", "cpu", &err) != 0 ||
        zt_train_config_set_flag(&c, "--checkpointing", "all", &err) != 0 ||
        zt_train_config_set_flag(&c, "--weights", "host", &err) != 0)
        fail_msg("%s", err.msg);
    zt_fixture_finish_config(&c);
    zt_train_result r;
    zt_fixture_train_ok(&c, &r);
    compare("llama fp32, optimizer cpu, streamed, checkpointed", &r, 1e-4);
    zt_train_result_free(&r);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untied_head_matches_cpu),
        cmocka_unit_test(test_tied_head_matches_cpu),
        cmocka_unit_test(test_head_size_40_matches_cpu),
        cmocka_unit_test(test_train_fp32_tracks_cpu),
        cmocka_unit_test(test_train_bf16_tracks_cpu),
        cmocka_unit_test(test_train_offloaded_tracks_cpu),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    zt_train_result_free(&g_cpu);
    return rc;
}
