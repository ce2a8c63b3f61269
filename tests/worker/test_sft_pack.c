/* Packed documents in the decoder models (model.h: zt_model_docs), on the CPU: a micro-batch whose rows hold
 * several examples end to end gives the loss and the gradients of the same examples one to a padded row, to
 * fp32 rounding, for GPT-2 (learned positions), LLaMA (rotary embeddings, grouped-query heads) and Qwen2
 * (LLaMA with q/k/v biases), with and without checkpointed layers; the same rows without their documents
 * (attention across the examples) give another loss. The plan of attention calls (zt__dec_docs_plan) covers
 * every row, keeps each call's lse within the layer's room and refuses positions that break the rule. */
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

#include "common/log.h"
#include "common/rng.h"
#include "worker/models/decoder.h"
#include "worker/models/family.h"
#include "worker/models/model.h"

#include "model_once.h"

enum { T = 16, NDOCS = 10, V = 64 };

/* Example lengths: a full row, a one-token example, several to a row. */
static const int k_len[NDOCS] = {5, 9, 3, 12, 7, 4, 1, 8, 16, 2};

static const char *k_gpt2 = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "
                            "\"n_positions\": 32, \"vocab_size\": 64, \"layer_norm_epsilon\": 1e-5}";
static const char *k_llama = "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 48, "
                             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                             "\"max_position_embeddings\": 64, \"vocab_size\": 64, \"rms_norm_eps\": 1e-5, "
                             "\"rope_theta\": 100.0, \"tie_word_embeddings\": false}";
static const char *k_qwen2 = "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"intermediate_size\": 48, "
                             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                             "\"max_position_embeddings\": 64, \"vocab_size\": 64, \"rms_norm_eps\": 1e-6, "
                             "\"rope_theta\": 100.0, \"tie_word_embeddings\": true}";

/* The examples: tokens in [1, V), targets the next token of the example on about 3 of 4 positions. */
typedef struct examples {
    int32_t tok[NDOCS][T], tgt[NDOCS][T];
} examples;

static void make_examples(examples *x)
{
    zt_rng rng;
    zt_rng_seed(&rng, 11);
    for (int d = 0; d < NDOCS; d++)
        for (int j = 0; j < k_len[d]; j++)
            x->tok[d][j] = 1 + (int32_t)(zt_rng_u64(&rng) % (V - 1));
    for (int d = 0; d < NDOCS; d++)
        for (int j = 0; j < k_len[d]; j++)
            x->tgt[d][j] = j + 1 < k_len[d] && zt_rng_u64(&rng) % 4 != 0 ? x->tok[d][j + 1] : -1;
}

/* One example a row, padded with token 0 (targets -1). */
static void padded_rows(const examples *x, int32_t *tok, int32_t *tgt)
{
    for (int d = 0; d < NDOCS; d++)
        for (int j = 0; j < T; j++) {
            tok[d * T + j] = j < k_len[d] ? x->tok[d][j] : 0;
            tgt[d * T + j] = j < k_len[d] ? x->tgt[d][j] : -1;
        }
}

/* The examples first-fit into rows of T in order, padding (its own document) at the end of a row; returns
 * the rows. */
static int packed_rows(const examples *x, int32_t *tok, int32_t *tgt, int32_t *pos)
{
    int used[NDOCS] = {0}, rows = 0;
    for (int i = 0; i < NDOCS * T; i++) {
        tok[i] = 0;
        tgt[i] = -1;
    }
    for (int d = 0; d < NDOCS; d++) {
        int r = 0;
        while (r < rows && used[r] + k_len[d] > T)
            r++;
        if (r == rows)
            rows++;
        for (int j = 0; j < k_len[d]; j++) {
            tok[r * T + used[r] + j] = x->tok[d][j];
            tgt[r * T + used[r] + j] = x->tgt[d][j];
            pos[r * T + used[r] + j] = j;
        }
        used[r] += k_len[d];
    }
    for (int r = 0; r < rows; r++)
        for (int j = used[r]; j < T; j++)
            pos[r * T + j] = j - used[r];
    return rows;
}

/* A model of the config json (written to a file), for NDOCS x T. */
static zt_family_model *make_model(const char *json)
{
    char path[] = "/tmp/zt_sft_pack_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    zt_family_config cfg;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    if (zt_family_config_load(&cfg, path, &err) < 0 || zt_family_model_create(&m, &cfg, NDOCS, T, 3, &err) < 0)
        fail_msg("%s", err.msg);
    unlink(path);
    /* weights away from the initialisation: every tensor gets noise, so that biases and norms matter */
    float *p = zt_family_model_params(m);
    zt_rng rng;
    zt_rng_seed(&rng, 5);
    for (size_t i = 0; i < zt_family_model_num_params(m); i++)
        p[i] += 0.05f * (float)((double)(zt_rng_u64(&rng) >> 11) / 9007199254740992.0 - 0.5);
    return m;
}

/* One training micro-batch through the executor in the engine's order; grads (the layout's size) are
 * zeroed first. Returns the loss. */
static float step(zt_model *e, float *params, float *grads, const int32_t *tok, const int32_t *tgt, int B,
                  const zt_model_docs *docs)
{
    const size_t total = e->block_offset[e->nblocks - 1] + e->block_len[e->nblocks - 1];
    memset(grads, 0, total * sizeof(float));
    return zt_test_cpu_passes(e, params, grads, tok, tgt, B, T, docs);
}

static void check_family(const char *name, const char *json, bool checkpointed)
{
    examples x;
    make_examples(&x);
    static int32_t ptok[NDOCS * T], ptgt[NDOCS * T], pos[NDOCS * T], utok[NDOCS * T], utgt[NDOCS * T];
    const int rows = packed_rows(&x, ptok, ptgt, pos);
    padded_rows(&x, utok, utgt);
    assert_true(rows < NDOCS);

    zt_family_model *m = make_model(json);
    zt_model *e = NULL;
    zt_err err = {{0}};
    bool ckpt[8] = {true, true, true, true, true, true, true, true};
    if (zt_family_model_cpu(&e, m, 1, checkpointed ? ckpt : NULL, &err) < 0)
        fail_msg("%s", err.msg);
    const size_t n = zt_family_model_num_params(m);
    float *params = zt_family_model_params(m);
    float *gu = calloc(n, sizeof(float)), *gp = calloc(n, sizeof(float));
    assert_non_null(gu);
    assert_non_null(gp);

    const float lu = step(e, params, gu, utok, utgt, NDOCS, NULL);
    const zt_model_docs docs = {.pos = pos};
    const float lp = step(e, params, gp, ptok, ptgt, rows, &docs);
    /* the same rows read as one document each: attention crosses the examples, positions run on */
    float *gx = calloc(n, sizeof(float));
    assert_non_null(gx);
    const float lx = step(e, params, gx, ptok, ptgt, rows, NULL);

    double worst = 0, scale = 0, crossed = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double dif = fabs((double)gp[i] - gu[i]);
        if (dif > worst) {
            worst = dif;
            at = i;
        }
        scale = fmax(scale, fabs((double)gu[i]));
        crossed = fmax(crossed, fabs((double)gx[i] - gu[i]));
    }
    const double rel = fabs((double)lp - lu) / fabs((double)lu);
    print_message("%s%s: %d examples in %d packed rows of %d: loss %.7f, padded %.7f (relative %.2e), unpacked "
                  "rows %.7f; largest gradient difference %.3g (at %zu) of %.3g (unpacked rows: %.3g)\n", name,
                  checkpointed ? " (checkpointed)" : "", NDOCS, rows, T, (double)lp, (double)lu, rel, (double)lx,
                  worst, at, scale, crossed);
    assert_true(rel < 2e-6);
    assert_true(worst <= 1e-5 * scale);
    assert_true(scale > 0);
    assert_true(crossed > 1e-2 * scale); /* the documents matter */

    free(gu);
    free(gp);
    free(gx);
    e->ops->destroy(e);
    zt_family_model_destroy(m);
}

static void test_gpt2(void **state)
{
    (void)state;
    check_family("gpt2", k_gpt2, false);
    check_family("gpt2", k_gpt2, true);
}

static void test_llama(void **state)
{
    (void)state;
    check_family("llama", k_llama, false);
    check_family("llama", k_llama, true);
}

static void test_qwen2(void **state)
{
    (void)state;
    check_family("qwen2", k_qwen2, false);
}

/* Checks a plan of pos [B*T]: groups cover the rows in order, each group's offsets are its documents, and
 * the lse of the calls fits ZT__DEC_LSE_ROWS * N rows without overlap. */
static int check_plan(const int32_t *pos, int B, int n)
{
    zt__dec_group *g = malloc(sizeof *g * (size_t)n);
    int32_t *cu = malloc(sizeof *cu * 2 * (size_t)n);
    assert_non_null(g);
    assert_non_null(cu);
    const int ng = zt__dec_docs_plan(pos, B, n / B, g, cu);
    assert_true(ng >= 1);
    int row = 0;
    size_t lse = 0;
    for (int i = 0; i < ng; i++) {
        assert_int_equal(g[i].row0, row);
        assert_true(g[i].lse_off >= lse);
        assert_int_equal(cu[g[i].cu_off], 0);
        int longest = 0;
        for (int s = 0; s < g[i].nseq; s++) {
            const int a = row + cu[g[i].cu_off + s], b = row + cu[g[i].cu_off + s + 1];
            assert_true(b > a);
            assert_int_equal(pos[a], 0);
            for (int k = a + 1; k < b; k++)
                assert_int_equal(pos[k], pos[k - 1] + 1);
            assert_true(b == n || pos[b] == 0);
            longest = b - a > longest ? b - a : longest;
        }
        assert_int_equal(g[i].maxlen, longest);
        row += cu[g[i].cu_off + g[i].nseq];
        lse = g[i].lse_off + (size_t)g[i].nseq * (size_t)g[i].maxlen;
    }
    assert_int_equal(row, n);
    assert_true(lse <= (size_t)ZT__DEC_LSE_ROWS * (size_t)n);
    free(g);
    free(cu);
    return ng;
}

static void test_plan(void **state)
{
    (void)state;
    enum { PB = 4, PT = 24 };
    int32_t pos[PB * PT];
    /* one document a row: one call */
    for (int i = 0; i < PB * PT; i++)
        pos[i] = i % PT;
    assert_int_equal(check_plan(pos, PB, PB * PT), 1);
    /* lengths that differ a lot: a long document and many short ones need more than one call */
    for (int i = 0; i < PB * PT; i++)
        pos[i] = i % PT < 20 ? i % PT : 0;
    assert_true(check_plan(pos, PB, PB * PT) > 1);
    /* random documents */
    zt_rng rng;
    zt_rng_seed(&rng, 9);
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < PB * PT; i++)
            pos[i] = i % PT == 0 || zt_rng_u64(&rng) % 5 == 0 ? 0 : pos[i - 1] + 1;
        check_plan(pos, PB, PB * PT);
    }
    /* broken rules: a row not starting at 0, a jump */
    for (int i = 0; i < PB * PT; i++)
        pos[i] = i % PT;
    pos[PT] = 3;
    zt__dec_group g[PB * PT];
    int32_t cu[2 * PB * PT];
    assert_int_equal(zt__dec_docs_plan(pos, PB, PT, g, cu), -1);
    pos[PT] = 0;
    pos[5] = 7;
    assert_int_equal(zt__dec_docs_plan(pos, PB, PT, g, cu), -1);
}

int main(void)
{
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
