/* Supervised fine-tuning through the trainer: a tiny LLaMA (examples/llama-tiny.json, vocabulary 256, with the
 * byte-level examples/byte-tokenizer.json) trained on a small chat set with the chatml template, on the CPU.
 * Checks that the loss falls; that the validation loss of a batch is the mean cross-entropy over its trained
 * tokens only (computed here from the model's logits, with targets built from the examples' trained flags);
 * that two ranks train the same model as one (the step's gradient is the mean over the global batch's
 * trained tokens at any number of ranks); that a resumed run ends on the same bits; and that the settings
 * of fine-tuning are checked (packing only with examples and a decoder, shards and examples not mixed, a
 * decoder needed). Packed (--sft-pack), the same examples train too, and the validation loss is still the mean
 * cross-entropy over the trained tokens, the reference computed one example a padded row. */
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
#include "worker/data/chat_template.h"
#include "worker/data/sft.h"
#include "worker/data/tokenize.h"
#include "worker/models/family.h"
#include "worker/models/llama.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

#include "train_fixture.h"

static zt_fixture_examples g; /* the temporary folder and the files */
static char g_init[512];

enum { B = 4, T = 128, STEPS = 12 };

static void path_in(char *out, size_t cap, const char *rel)
{
    snprintf(out, cap, "%s/%s", g.dir, rel);
}

/* A chat set: questions whose answers follow from them (sums, reversals, repeats), one or two rounds, some
 * with a system prompt; short enough for 128 bytes with chatml's markers. */
static void write_chats(const char *path, int n, unsigned seed)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    unsigned x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        const int a = (int)(x >> 24) % 5, b = (int)(x >> 16) % 5;
        if (i % 3 == 0)
            fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"%d+%d\"}, "
                       "{\"role\": \"assistant\", \"content\": \"%d\"}]}\n", a, b, a + b);
        else if (i % 3 == 1)
            fprintf(f, "{\"messages\": [{\"role\": \"system\", \"content\": \"r\"}, {\"role\": \"user\", "
                       "\"content\": \"%c%c\"}, {\"role\": \"assistant\", \"content\": \"%c%c\"}]}\n",
                    'a' + a, 'a' + b, 'a' + b, 'a' + a);
        else
            fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"%d\"}, {\"role\": \"assistant\", "
                       "\"content\": \"%d%d\"}]}\n", a, a, a);
    }
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    zt_log_set_level(ZT_LOG_WARN);
    if (zt_fixture_examples_setup(&g, "zt_sft_train_", "llama-tiny.json") < 0)
        return -1;
    path_in(g_init, sizeof g_init, "init.safetensors");
    write_chats(g.train, 22, 7);
    write_chats(g.val, B, 99); /* one validation batch */
    /* the starting weights, written here so that the reference below uses the very same ones */
    zt_family_config cfg;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    if (zt_family_config_load(&cfg, g.model, &err) < 0 || zt_family_model_create(&m, &cfg, B, T, 5, &err) < 0 ||
        zt_llama_export(zt_family_model_host(m), g_init, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    zt_family_model_destroy(m);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g.dir);
}

static void sft_config(zt_train_config *c, const char *out)
{
    zt_fixture_examples_config(c, &g, out, STEPS, B, T);
    snprintf(c->chat_template, sizeof c->chat_template, "chatml");
    snprintf(c->init_from, sizeof c->init_from, "%s", g_init);
    c->eval_every = 4;
    zt_fixture_finish_config(c);
}

/* The mean cross-entropy, from the logits of m, of predicting each trained token of the examples of the
 * validation file (one to a row, padded with 0): the examples' ids and trained flags from zt_sft_get, the
 * targets built here. *ntrained and *ntokens count the scored targets and the examples' tokens. */
static double reference_val_loss(zt_llama *m, int *ntrained, int *ntokens)
{
    zt_tokenizer *tok = NULL;
    zt_chat_template *tmpl = NULL;
    zt_sft_data *d = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_tokenizer_load(&tok, g.tok, &err), 0);
    assert_int_equal(zt_chat_template_by_name(&tmpl, "chatml", NULL, NULL, &err), 0);
    const zt_sft_options o = {.chat_template = tmpl, .vocab_size = 256};
    assert_int_equal(zt_sft_open(&d, g.val, tok, &o, &err), 0);
    assert_int_equal(zt_sft_count(d), B);
    int32_t tokens[B * T], targets[B * T];
    *ntrained = *ntokens = 0;
    for (int r = 0; r < B; r++) {
        zt_sft_example ex;
        zt_sft_get(d, (size_t)r, &ex);
        assert_true(ex.n <= T);
        for (int j = 0; j < T; j++) {
            const bool in = (size_t)j < ex.n;
            tokens[r * T + j] = in ? ex.ids[j] : 0;
            targets[r * T + j] = (size_t)j + 1 < ex.n && ex.trained[j + 1] ? ex.ids[j + 1] : -1;
            *ntrained += targets[r * T + j] >= 0;
            *ntokens += in;
        }
    }
    const int V = 256;
    zt_llama_forward(m, tokens, NULL, B, T);
    const float *logits = zt_llama_logits(m);
    double sum = 0;
    for (int i = 0; i < B * T; i++) {
        if (targets[i] < 0)
            continue;
        const float *row = logits + (size_t)i * V;
        double mx = row[0], z = 0;
        for (int v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < V; v++)
            z += exp(row[v] - mx);
        sum += mx + log(z) - row[targets[i]];
    }
    zt_sft_close(d);
    zt_chat_template_destroy(tmpl);
    zt_tokenizer_destroy(tok);
    return sum / *ntrained;
}

/* A model with the weights of a safetensors file (or a checkpoint's model.safetensors); the LLaMA is
 * zt_family_model_host of it. */
static zt_family_model *load_family(const char *path)
{
    zt_family_config cfg;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_family_config_load(&cfg, g.model, &err), 0);
    assert_int_equal(zt_family_model_create(&m, &cfg, B, T, 1, &err), 0);
    if (zt_llama_import(zt_family_model_host(m), path, &err) < 0)
        fail_msg("%s", err.msg);
    return m;
}

#define load_model(path) ((zt_llama *)zt_family_model_host(held[nheld++] = load_family(path)))
static zt_family_model *held[8];
static int nheld;

static void release_models(void)
{
    while (nheld > 0)
        zt_family_model_destroy(held[--nheld]);
}

static double rel_diff(double a, double b)
{
    return fabs(a - b) / fmax(fabs(a), fabs(b));
}

/* Fails unless res's validation losses before and after training (the run directory out_dir) are, to 1e-5
 * relative, the mean cross-entropy over the trained tokens only of the starting weights and of the final
 * checkpoint's; prints them, labelled what. *ntrained and *ntokens: those of the validation batch. */
static void expect_val_losses(const char *what, const zt_train_result *res, const char *out_dir, int *ntrained,
                              int *ntokens)
{
    zt_llama *m = load_model(g_init);
    const double first = reference_val_loss(m, ntrained, ntokens);
    print_message("%s: val batch of %d tokens, %d trained: loss %.7f, reference (padded rows) %.7f\n", what,
                  *ntokens, *ntrained, (double)res->first_val_loss, first);
    assert_true(rel_diff(res->first_val_loss, first) < 1e-5);
    char ckpt[ZT_TRAIN_PATH_MAX + 64];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt_%06d/model.safetensors", out_dir, STEPS);
    m = load_model(ckpt);
    const double last = reference_val_loss(m, ntrained, ntokens);
    assert_true(rel_diff(res->last_val_loss, last) < 1e-5);
    release_models();
}

/* The loss falls, and the validation losses before and after training are the mean cross-entropy over the
 * trained tokens only, of the starting and the final weights. */
static void test_sft_trains(void **state)
{
    (void)state;
    zt_train_config c;
    sft_config(&c, "A");
    zt_train_result res;
    zt_fixture_train_ok(&c, &res);
    zt_fixture_expect_loss_falls("sft", &res, STEPS, 0.8f);
    int ntrained, ntokens;
    expect_val_losses("sft", &res, c.out_dir, &ntrained, &ntokens);
    /* only the answers and their end-of-turn markers are scored: fewer than half of the tokens here */
    assert_true(ntrained > 0 && 2 * ntrained < ntokens);
    zt_train_result_free(&res);
}

/* Packed rows (--sft-pack): the loss falls, and the validation loss (the four validation examples packed into
 * fewer rows) is the mean cross-entropy over their trained tokens computed one example a padded row. */
static void test_sft_packed(void **state)
{
    (void)state;
    zt_train_config c;
    sft_config(&c, "P");
    c.sft_pack = true;
    zt_train_result res;
    zt_fixture_train_ok(&c, &res);
    zt_fixture_expect_loss_falls("sft packed", &res, STEPS, 0.8f);
    int ntrained, ntokens;
    expect_val_losses("sft packed", &res, c.out_dir, &ntrained, &ntokens);
    zt_train_result_free(&res);
}

/* Two ranks, each with half of every batch (rows holding different numbers of trained tokens), train the
 * same model as one: the loss of the final weights agrees to rounding. (The train losses logged at W=2 are
 * the mean of the ranks' means, which differs.) */
static void test_sft_two_ranks(void **state)
{
    (void)state;
    float one[STEPS], two[STEPS];
    char p1[ZT_TRAIN_PATH_MAX + 64], p2[ZT_TRAIN_PATH_MAX + 64];
    zt_fixture_train_one_and_two(sft_config, STEPS, one, two, p1, p2, sizeof p1);
    int nt, nk;
    zt_llama *m1 = load_model(p1), *m2 = load_model(p2);
    const double l1 = reference_val_loss(m1, &nt, &nk), l2 = reference_val_loss(m2, &nt, &nk);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < zt_llama_num_params(m1); i++) {
        worst = fmax(worst, fabs((double)zt_llama_params(m1)[i] - zt_llama_params(m2)[i]));
        scale = fmax(scale, fabs((double)zt_llama_params(m1)[i]));
    }
    print_message("sft W=2: val loss of the final weights %.7f (W=1 %.7f); largest weight difference %.3g of %.3g\n",
                  l2, l1, worst, scale);
    assert_true(rel_diff(l1, l2) < 1e-5);
    assert_true(worst < 1e-5 * scale);
    /* and the training did something: the weights moved from the start */
    zt_llama *m0 = load_model(g_init);
    double moved = 0;
    for (size_t i = 0; i < zt_llama_num_params(m1); i++)
        moved = fmax(moved, fabs((double)zt_llama_params(m1)[i] - zt_llama_params(m0)[i]));
    assert_true(moved > 100 * worst);
    release_models();
}

/* A run stopped at step 6 and resumed from its checkpoint ends on the bits of a run straight through: the
 * examples' order (shuffled, several epochs) continues where it stood. */
static void test_sft_resume(void **state)
{
    (void)state;
    zt_fixture_check_resume(sft_config, STEPS, 6);
}

/* The checks of the settings: each names the key, the flag and the fix. */
static void expect_invalid(zt_train_config *c, const char *needle)
{
    zt_err err = {{0}};
    if (zt_train_config_resolve(c, &err) != 0)
        fail_msg("resolve: %s", err.msg);
    if (zt_train_config_validate(c, &err) != ZT_EINVAL_CONFIG)
        fail_msg("expected '%s': the config passed", needle);
    if (!strstr(err.msg, needle))
        fail_msg("expected '%s' in: %s", needle, err.msg);
}

static void test_sft_config(void **state)
{
    (void)state;
    zt_train_config c;
    sft_config(&c, "C");
    c.sft_pack = true;
    zt_err perr = {{0}};
    assert_int_equal(zt_train_config_resolve(&c, &perr), 0);
    if (zt_train_config_validate(&c, &perr) != 0)
        fail_msg("--sft-pack with examples and a decoder: %s", perr.msg);
    /* without examples: the fix is --sft-data */
    zt_train_config_init(&c);
    snprintf(c.model_path, sizeof c.model_path, "%s", g.model);
    snprintf(c.train_data, sizeof c.train_data, "x_*.bin");
    c.sft_pack = true;
    expect_invalid(&c, "--sft-pack");
    expect_invalid(&c, "give the training examples with \"sft_data\" (--sft-data)");
    /* BERT (a classifier, and a masked LM) does not pack, by name */
    const char *src = getenv("ZT_SOURCE_DIR");
    char bert[512], mlm[512];
    snprintf(bert, sizeof bert, "%s/examples/bert-cls-tiny.json", src);
    path_in(mlm, sizeof mlm, "bert-mlm.json");
    FILE *f = fopen(mlm, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"bert\", \"architectures\": [\"BertForMaskedLM\"], \"vocab_size\": 256, "
               "\"hidden_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
               "\"intermediate_size\": 64, \"max_position_embeddings\": 128}\n");
    fclose(f);
    const char *berts[2] = {bert, mlm};
    for (int i = 0; i < 2; i++) {
        sft_config(&c, "C");
        snprintf(c.model_path, sizeof c.model_path, "%s", berts[i]);
        c.model_loaded = false; /* read the BERT config instead of the LLaMA's */
        c.sft_pack = true;
        expect_invalid(&c, "(--sft-pack) packs examples for decoder models");
        expect_invalid(&c, i == 0 ? "bert model (not a decoder)" : "bert model (masked LM)");
    }
    sft_config(&c, "C");
    snprintf(c.train_data, sizeof c.train_data, "x_*.bin");
    expect_invalid(&c, "not both");
    sft_config(&c, "C");
    snprintf(c.val_data, sizeof c.val_data, "x_*.bin");
    expect_invalid(&c, "--sft-val-data");
    sft_config(&c, "C");
    c.tokenizer[0] = '\0';
    expect_invalid(&c, "--tokenizer");
    zt_train_config_init(&c);
    snprintf(c.model_path, sizeof c.model_path, "%s", g.model);
    snprintf(c.train_data, sizeof c.train_data, "x_*.bin");
    c.train_on_prompt = true;
    expect_invalid(&c, "--sft-data");
    /* the key table reads them from a file and from flags */
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(&c, "--sft-overlong", "refuse", &err), 0);
    assert_int_equal(c.sft_overlong, ZT_OVERLONG_REFUSE);
    assert_int_equal(zt_train_config_set_flag(&c, "--sft-overlong", "cut", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "truncate or refuse"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sft_trains),
        cmocka_unit_test(test_sft_packed),
        cmocka_unit_test(test_sft_two_ranks),
        cmocka_unit_test(test_sft_resume),
        cmocka_unit_test(test_sft_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
