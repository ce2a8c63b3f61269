/* Packed documents (model.h: zt_model_docs) on the GPU (ctest label gpu; exit 77 without a GPU): one
 * training micro-batch of rows holding several examples end to end, through the CUDA executor in fp32,
 * against the CPU executor on the same rows: the loss within 1e-5 relative and every gradient within 1e-4 of
 * its tensor's largest, for GPT-2 (learned positions read at the restarting position) and LLaMA (rotary
 * angles at the restarting position, grouped-query heads), with and without checkpointed layers, and with
 * lengths that make the attention plan take more than one call. The CPU's packed step equals one example a
 * padded row (tests/worker/test_sft_pack.c), so this ties the GPU's packing to the padded loss too. */
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
#include "worker/models/decoder.h"
#include "worker/models/family.h"
#include "worker/models/model.h"

#include "../worker/model_once.h"
#include "gpu_fixture.h"

enum { T = 48, MAXDOCS = 24, V = 96 };

static const char *k_gpt2 = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 128, "
                            "\"n_positions\": 64, \"vocab_size\": 96, \"layer_norm_epsilon\": 1e-5}";
static const char *k_llama = "{\"model_type\": \"llama\", \"hidden_size\": 192, \"intermediate_size\": 344, "
                             "\"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, "
                             "\"max_position_embeddings\": 64, \"vocab_size\": 96, \"rms_norm_eps\": 1e-5, "
                             "\"rope_theta\": 100.0, \"tie_word_embeddings\": false}";

static uint64_t g_lcg = 88172645463325252ull;
static uint32_t next(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_lcg >> 33);
}

/* Rows of T filled first-fit with the examples of lengths len[0..n), tokens and targets drawn here, padding
 * (its own document) after the examples of a row. Returns the rows. */
static int pack(const int *len, int n, int32_t *tok, int32_t *tgt, int32_t *pos)
{
    int used[MAXDOCS] = {0}, rows = 0;
    for (int i = 0; i < MAXDOCS * T; i++) {
        tok[i] = 0;
        tgt[i] = -1;
    }
    for (int d = 0; d < n; d++) {
        int r = 0;
        while (r < rows && used[r] + len[d] > T)
            r++;
        if (r == rows)
            rows++;
        int32_t *t = tok + r * T + used[r], *g = tgt + r * T + used[r], *p = pos + r * T + used[r];
        for (int j = 0; j < len[d]; j++) {
            t[j] = 1 + (int32_t)(next() % (V - 1));
            p[j] = j;
        }
        for (int j = 0; j < len[d]; j++)
            g[j] = j + 1 < len[d] && next() % 4 != 0 ? t[j + 1] : -1;
        used[r] += len[d];
    }
    for (int r = 0; r < rows; r++)
        for (int j = used[r]; j < T; j++)
            pos[r * T + j] = j - used[r];
    return rows;
}

static zt_family_model *make_model(const char *json, int B)
{
    char path[] = "/tmp/zt_sft_pack_cuda_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    zt_family_config cfg;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    if (zt_family_config_load(&cfg, path, &err) < 0 || zt_family_model_create(&m, &cfg, B, T, 3, &err) < 0)
        fail_msg("%s", err.msg);
    unlink(path);
    float *p = zt_family_model_params(m);
    for (size_t i = 0; i < zt_family_model_num_params(m); i++)
        p[i] += 0.05f * ((float)(next() % 1000) / 1000.0f - 0.5f);
    return m;
}

/* One micro-batch through the CPU executor (its layout is the host's); returns the loss. */
static float cpu_step(zt_model *e, float *params, float *grads, const int32_t *tok, const int32_t *tgt, int B,
                      const zt_model_docs *docs)
{
    memset(grads, 0, e->host_numel * sizeof(float));
    return zt_test_cpu_passes(e, params, grads, tok, tgt, B, T, docs);
}

static void check(const char *name, const char *json, const int *len, int n, bool checkpointed)
{
    static int32_t tok[MAXDOCS * T], tgt[MAXDOCS * T], pos[MAXDOCS * T];
    const int B = pack(len, n, tok, tgt, pos);
    zt__dec_group groups[MAXDOCS * T];
    int32_t cu[2 * MAXDOCS * T];
    const int calls = zt__dec_docs_plan(pos, B, T, groups, cu);
    zt_family_model *fm = make_model(json, B);
    const bool ckpt[4] = {true, true, true, true};
    zt_model *c = NULL, *g = NULL;
    zt_err err = {{0}};
    if (zt_family_model_cpu(&c, fm, 1, checkpointed ? ckpt : NULL, &err) < 0 ||
        zt_family_model_cuda(&g, fm, B, T, 1, ZT_DTYPE_F32, checkpointed ? ckpt : NULL, &err) < 0)
        fail_msg("%s", err.msg);
    const size_t P = zt_family_model_num_params(fm), NV = (size_t)B * T * V;
    float *params = zt_family_model_params(fm);
    float *want = calloc(P, sizeof(float)), *got = calloc(P, sizeof(float)), *logits = malloc(NV * sizeof(float));
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(logits);
    const zt_model_docs docs = {.pos = pos};
    const float want_loss = cpu_step(c, params, want, tok, tgt, B, &docs);
    const float loss = zt_test_model_once_docs(g, params, tok, tgt, B, T, &docs, logits, got);
    assert_true(loss >= 0.0f);
    printf("%s%s: %d examples in %d rows of %d (%d attention calls): loss %.7f on the GPU, %.7f on the CPU\n", name,
           checkpointed ? " (checkpointed)" : "", n, B, T, calls, (double)loss, (double)want_loss);
    assert_true(fabs((double)loss - (double)want_loss) <= 1e-5 * fabs((double)want_loss));
    for (int i = 0; i < zt_family_model_num_tensors(fm); i++) {
        const zt_param_info *t = zt_family_model_tensor(fm, i);
        zt_gpu_fixture_expect_close(t->name, got + t->offset, want + t->offset, t->numel, 1e-4, 0.0);
    }
    free(want);
    free(got);
    free(logits);
    g->ops->destroy(g);
    c->ops->destroy(c);
    zt_family_model_destroy(fm);
}

/* Lengths of every size: one-token examples, a full row, several to a row. */
static const int k_mixed[] = {5, 9, 3, 12, 7, 4, 1, 8, 48, 2, 30, 17, 11, 1, 23, 6};
/* One long example and many short ones a row: the plan splits the calls. */
static const int k_skewed[] = {40, 1, 1, 1, 1, 1, 1, 1, 1, 44, 1, 1, 1, 1, 38, 2, 2, 2, 2, 2};

static void test_gpt2(void **state)
{
    (void)state;
    check("gpt2", k_gpt2, k_mixed, (int)(sizeof k_mixed / sizeof k_mixed[0]), false);
    check("gpt2", k_gpt2, k_mixed, (int)(sizeof k_mixed / sizeof k_mixed[0]), true);
    check("gpt2 skewed", k_gpt2, k_skewed, (int)(sizeof k_skewed / sizeof k_skewed[0]), false);
}

static void test_llama(void **state)
{
    (void)state;
    check("llama", k_llama, k_mixed, (int)(sizeof k_mixed / sizeof k_mixed[0]), false);
    check("llama", k_llama, k_mixed, (int)(sizeof k_mixed / sizeof k_mixed[0]), true);
    check("llama skewed", k_llama, k_skewed, (int)(sizeof k_skewed / sizeof k_skewed[0]), false);
}

int main(void)
{
    if (!zt_gpu_fixture_have_gpu())
        return 77;
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
