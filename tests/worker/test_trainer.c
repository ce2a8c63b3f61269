/* Tests of the trainer (worker/train/trainer.h) and what it is built from: checkpoints, resume, metrics,
 * the optimizer's guards, and `ztrain export`. A tiny GPT-2 (2 layers x 32, vocab 64) trains on synthetic
 * shards in a fresh temporary folder.
 *
 * The central check: N steps, a checkpoint, a resume and M more steps give the same losses, the same
 * metrics.jsonl and the same final checkpoint files, bit for bit, as N + M steps without stopping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/models/bert.h"
#include "worker/models/llama.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "worker/cli/commands.h"
#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/train/checkpoint.h"
#include "worker/engine/optimizer.h"
#include "worker/train/trainer.h"

#include "train_fixture.h"

#ifdef ZT_WITH_CUDA
#include <cuda_runtime.h>
#endif

#define VOCAB 64
#define B 2
#define T 16

static char g_dir[256];

static zt_gpt2_config tiny_model(void)
{
    zt_gpt2_config m;
    zt_gpt2_config_default(&m);
    m.n_layer = 2;
    m.n_head = 2;
    m.n_embd = 32;
    m.n_positions = 32;
    m.vocab_size = VOCAB;
    return m;
}

/* A shard of n tokens with structure to learn: a repeating phrase of 11 tokens, shifted by salt; with
 * max_token 100 its largest token is (10 * 7 + 0) % 101 = 70. */
static void write_shard(const char *name, size_t n, uint16_t salt, uint16_t max_token)
{
    uint16_t *tok = malloc(n * sizeof(uint16_t));
    assert_non_null(tok);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint16_t)(((i % 11) * 7 + salt) % (max_token + 1u));
    zt_fixture_write_shard(g_dir, name, tok, n);
    free(tok);
}

static int setup(void **state)
{
    (void)state;
    if (zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_trainer_") != 0)
        return -1;
    write_shard("t_train_000.bin", 4000, 0, VOCAB - 1);
    write_shard("t_val_000.bin", 600, 0, VOCAB - 1);
    write_shard("big_train_000.bin", 2000, 0, 100); /* tokens up to 100: too many for VOCAB */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

/* A valid config for the tiny model writing into g_dir/<out>. */
static void base_config(zt_train_config *c, const char *out)
{
    zt_train_config_init(c);
    zt_family_config_default(&c->model);
    (*ZT_GPT2_CONFIG(&c->model)) = tiny_model();
    c->model_loaded = true;
    snprintf(c->train_data, sizeof(c->train_data), "%s/t_train_*.bin", g_dir);
    snprintf(c->val_data, sizeof(c->val_data), "%s/t_val_*.bin", g_dir);
    snprintf(c->out_dir, sizeof(c->out_dir), "%s/%s", g_dir, out);
    c->steps = 6;
    c->batch_size = B;
    c->seq_len = T;
    c->grad_accum = 2;
    c->lr = 1e-2;
    c->min_lr = 1e-3;
    c->warmup_steps = 2;
    c->eval_every = 2;
    c->eval_batches = 2;
    c->save_every = 2;
    c->log_every = 1;
    c->seed = 5;
    c->threads = 1;
    zt_fixture_finish_config(c);
}

static void path_of(char *out, size_t cap, const char *rel)
{
    snprintf(out, cap, "%s/%s", g_dir, rel);
}

/* Reads g_dir/rel whole; the caller frees. */
static char *slurp(const char *rel, size_t *len)
{
    char path[512];
    path_of(path, sizeof(path), rel);
    char *data = NULL;
    zt_err err = {{0}};
    if (zt_read_file(path, &data, len, &err) != 0)
        fail_msg("%s", err.msg);
    return data;
}

static void expect_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *da = slurp(a, &na), *db = slurp(b, &nb);
    if (na != nb || memcmp(da, db, na) != 0)
        fail_msg("%s and %s differ", a, b);
    free(da);
    free(db);
}

/* metrics.jsonl without the timing fields (tokens_per_s and elapsed_s differ from run to run). */
static char *metrics_without_timing(const char *rel)
{
    size_t n = 0;
    char *text = slurp(rel, &n);
    char *out = calloc(n + 1, 1), *o = out;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *cut = strstr(line, ",\"tokens_per_s\"");
        size_t len = cut ? (size_t)(cut - line) : strlen(line);
        memcpy(o, line, len);
        o += len;
        *o++ = '\n';
    }
    free(text);
    return out;
}

static bool exists(const char *rel)
{
    char path[512];
    struct stat st;
    path_of(path, sizeof(path), rel);
    return stat(path, &st) == 0;
}

static void test_resume_is_bit_identical(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result straight, first, second, again, other;

    /* A: 6 steps in one go. */
    base_config(&c, "A");
    zt_fixture_train_ok(&c, &straight);
    assert_false(straight.interrupted);
    assert_int_equal(straight.start_step, 0);
    assert_int_equal(straight.end_step, 6);
    assert_true(straight.losses[5] < straight.losses[0]); /* it learns something */
    assert_true(isfinite(straight.first_val_loss) && straight.last_val_loss < straight.first_val_loss);
    assert_true(exists("A/ckpt_000002/manifest.json") && exists("A/ckpt_000004/manifest.json"));
    assert_true(exists("A/config.json") && exists("A/model_config.json"));

    /* B: stopped after step 3 (a checkpoint is written), then resumed from the run directory. */
    base_config(&c, "B");
    c.stop_at_step = 3;
    zt_fixture_train_ok(&c, &first);
    assert_true(first.interrupted);
    assert_int_equal(first.end_step, 3);
    assert_true(exists("B/ckpt_000003/manifest.json"));
    assert_false(exists("B/ckpt_000006"));
    size_t n = 0;
    char *latest = slurp("B/latest", &n);
    assert_string_equal(latest, "ckpt_000003\n");
    free(latest);

    /* As `ztrain train --resume B` does: the settings come from the config saved with the checkpoint. */
    char saved[512];
    zt_err err = {{0}};
    path_of(saved, sizeof(saved), "B/ckpt_000003/config.json");
    zt_train_config_init(&c);
    if (zt_train_config_load_file(&c, saved, &err) != 0 || zt_train_config_resolve(&c, &err) != 0)
        fail_msg("%s", err.msg);
    snprintf(c.resume, sizeof(c.resume), "%s/B", g_dir);
    zt_fixture_train_ok(&c, &second);
    assert_int_equal(second.start_step, 3);
    assert_int_equal(second.end_step, 6);

    assert_memory_equal(first.losses, straight.losses, 3 * sizeof(float));
    assert_memory_equal(second.losses, straight.losses + 3, 3 * sizeof(float));
    assert_memory_equal(&second.last_val_loss, &straight.last_val_loss, sizeof(float));
    assert_memory_equal(&second.first_val_loss, &straight.first_val_loss, sizeof(float)); /* from metrics */
    expect_same_file("A/ckpt_000006/model.safetensors", "B/ckpt_000006/model.safetensors");
    expect_same_file("A/ckpt_000006/optim.safetensors", "B/ckpt_000006/optim.safetensors");
    char *ma = metrics_without_timing("A/metrics.jsonl");
    char *mb = metrics_without_timing("B/metrics.jsonl");
    assert_string_equal(ma, mb);

    /* Resuming B again from its step-4 checkpoint drops the metrics lines after step 4, replaces the
     * step-6 checkpoint, and still ends where A ended. */
    base_config(&c, "B");
    snprintf(c.resume, sizeof(c.resume), "%s/B/ckpt_000004", g_dir);
    zt_fixture_train_ok(&c, &again);
    assert_memory_equal(again.losses, straight.losses + 4, 2 * sizeof(float));
    expect_same_file("A/ckpt_000006/model.safetensors", "B/ckpt_000006/model.safetensors");
    char *mb2 = metrics_without_timing("B/metrics.jsonl");
    assert_string_equal(ma, mb2);
    assert_false(exists("B/ckpt_000006.tmp") || exists("B/ckpt_000006.old"));

    /* A checkpoint directory can also seed a new run directory. */
    base_config(&c, "C");
    snprintf(c.resume, sizeof(c.resume), "%s/A/ckpt_000002", g_dir);
    zt_fixture_train_ok(&c, &other);
    assert_memory_equal(other.losses, straight.losses + 2, 4 * sizeof(float));
    expect_same_file("A/ckpt_000006/model.safetensors", "C/ckpt_000006/model.safetensors");

    free(ma);
    free(mb);
    free(mb2);
    zt_train_result_free(&straight);
    zt_train_result_free(&first);
    zt_train_result_free(&second);
    zt_train_result_free(&again);
    zt_train_result_free(&other);
}

/* A LLaMA model (a family beside GPT-2, worker/models/family.h) through the same loop: it learns, resumes
 * bit for bit from a checkpoint, and a GPT-2 run cannot be resumed with it. */
static void llama_config(zt_train_config *c, const char *out)
{
    base_config(c, out);
    zt_family_config_default_of(&c->model, "llama");
    zt_llama_config *l = ZT_LLAMA_CONFIG(&c->model);
    l->num_hidden_layers = 2;
    l->hidden_size = 24;
    l->num_attention_heads = 3; /* head size 8, grouped 3:1 */
    l->num_key_value_heads = 1;
    l->intermediate_size = 40;
    l->max_position_embeddings = 32;
    l->vocab_size = VOCAB;
    l->tie_word_embeddings = false;
    l->bos_token_id = -1;
    l->num_eos_token_ids = 0;
    zt_err err = {{0}};
    if (zt_family_config_validate(&c->model, &err) != 0)
        fail_msg("%s", err.msg);
}

static void test_llama_family(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result straight, first, second;
    llama_config(&c, "LA");
    zt_fixture_train_ok(&c, &straight);
    assert_true(straight.losses[5] < straight.losses[0]);
    assert_true(straight.last_val_loss < straight.first_val_loss);
    size_t n = 0;
    char *cfg = slurp("LA/model_config.json", &n);
    assert_non_null(strstr(cfg, "\"llama\"")); /* model_type */
    free(cfg);

    llama_config(&c, "LB");
    c.stop_at_step = 3;
    zt_fixture_train_ok(&c, &first);
    llama_config(&c, "LB");
    snprintf(c.resume, sizeof(c.resume), "%s/LB", g_dir);
    zt_fixture_train_ok(&c, &second);
    assert_memory_equal(first.losses, straight.losses, 3 * sizeof(float));
    assert_memory_equal(second.losses, straight.losses + 3, 3 * sizeof(float));
    expect_same_file("LA/ckpt_000006/model.safetensors", "LB/ckpt_000006/model.safetensors");
    expect_same_file("LA/ckpt_000006/optim.safetensors", "LB/ckpt_000006/optim.safetensors");

    /* the GPT-2 run A cannot go on as a LLaMA */
    llama_config(&c, "LC");
    snprintf(c.resume, sizeof(c.resume), "%s/A/ckpt_000002", g_dir);
    zt_train_result res;
    zt_err err = {{0}};
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "model_type"));
    zt_train_result_free(&res);
    zt_train_result_free(&straight);
    zt_train_result_free(&first);
    zt_train_result_free(&second);
}

/* ---- a BERT classifier on labelled texts ---- */

/* A WordPiece tokenizer.json with BERT's post-processor: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, then words. */
static const char *const cls_words[] = {"the", "movie", "film", "was", "is", "good", "bad", "very", "not", "a",
                                        "story", "and", "plot", "acting", "great", "awful"};
#define CLS_VOCAB (5 + (int)(sizeof(cls_words) / sizeof(cls_words[0]))) /* [MASK] last */

static void write_text_file(const char *rel, const char *text)
{
    char path[512];
    path_of(path, sizeof path, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void write_cls_tokenizer(void)
{
    char vocab[2048];
    size_t k = (size_t)snprintf(vocab, sizeof vocab, "{\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3");
    for (int i = 0; i < CLS_VOCAB - 5; i++)
        k += (size_t)snprintf(vocab + k, sizeof vocab - k, ", \"%s\": %d", cls_words[i], i + 4);
    snprintf(vocab + k, sizeof vocab - k, ", \"[MASK]\": %d}", CLS_VOCAB - 1);
    char json[4096];
    snprintf(json, sizeof json,
             "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": ["
             "{\"id\": 0, \"content\": \"[PAD]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true}, "
             "{\"id\": 2, \"content\": \"[CLS]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true}, "
             "{\"id\": 3, \"content\": \"[SEP]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true}, "
             "{\"id\": %d, \"content\": \"[MASK]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true}], "
             "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
             "\"strip_accents\": null, \"lowercase\": true}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, "
             "\"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 3], \"cls\": [\"[CLS]\", 2]}, "
             "\"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}, "
             "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
             "\"max_input_chars_per_word\": 100, \"vocab\": %s}}",
             CLS_VOCAB - 1, vocab);
    write_text_file("cls_tok.json", json);
}

/* n examples: a review of filler words holding "good"/"great" (positive) or "bad"/"awful" (negative), with
 * a filler pair text on every third; labels by name or number. */
static void write_cls_data(const char *rel, int n, uint32_t seed)
{
    char path[512];
    path_of(path, sizeof path, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    uint32_t x = seed;
    for (int i = 0; i < n; i++) {
        char text[256] = "";
        size_t k = 0;
        x = x * 1664525u + 1013904223u;
        const int positive = (x >> 16) & 1;
        const int len = 3 + (int)((x >> 8) % 6), at = (int)((x >> 20) % (uint32_t)len);
        for (int w = 0; w < len; w++) {
            x = x * 1664525u + 1013904223u;
            const char *word = w == at ? (positive ? ((x >> 9) & 1 ? "good" : "Great")
                                                   : ((x >> 9) & 1 ? "bad" : "awful"))
                                       : cls_words[(x >> 12) % 5 + 7 * ((x >> 20) & 1)];
            k += (size_t)snprintf(text + k, sizeof text - k, "%s%s", w ? " " : "", word);
        }
        if (i % 3 == 0)
            fprintf(f, "{\"text\": \"%s\", \"text_pair\": \"the plot and the acting\", \"label\": %d}\n", text,
                    positive);
        else
            fprintf(f, "{\"text\": \"%s\", \"label\": \"%s\"}\n", text, positive ? "positive" : "negative");
        if (i % 10 == 4)
            fputs("\n", f); /* blank lines are skipped */
    }
    assert_int_equal(fclose(f), 0);
}

static void bert_classify_config(zt_train_config *c, const char *out)
{
    base_config(c, out);
    zt_family_config_default_of(&c->model, "bert");
    zt_bert_config *e = ZT_BERT_CONFIG(&c->model);
    e->head = ZT_BERT_HEAD_CLASSIFY;
    e->vocab_size = CLS_VOCAB;
    e->hidden_size = 24;
    e->num_hidden_layers = 2;
    e->num_attention_heads = 3;
    e->intermediate_size = 40;
    e->max_position_embeddings = 32;
    e->num_labels = 2;
    e->initializer_range = 0.2f;
    memcpy(e->label_names, "negative\0positive", sizeof "negative\0positive");
    snprintf(c->train_data, sizeof c->train_data, "%s/cls_train.jsonl", g_dir);
    snprintf(c->val_data, sizeof c->val_data, "%s/cls_val.jsonl", g_dir);
    snprintf(c->tokenizer, sizeof c->tokenizer, "%s/cls_tok.json", g_dir);
    c->batch_size = 8;
    c->grad_accum = 1;
    c->steps = 100;
    c->lr = 5e-3;
    c->min_lr = 5e-4;
    c->warmup_steps = 4;
    c->weight_decay = 0.01;
    c->eval_every = 50;
    c->save_every = 10;
    zt_fixture_finish_config(c);
}

/* A BERT classifier fine-tunes on JSONL texts (single and pairs, labels by name and by number) through the
 * same loop: the loss falls, the validation accuracy rises well above chance, a resumed run is bit for bit
 * the straight one, and bad inputs are refused with the line and the fix. */
static void test_bert_classifier(void **state)
{
    (void)state;
    write_cls_tokenizer();
    write_cls_data("cls_train.jsonl", 160, 11);
    write_cls_data("cls_val.jsonl", 37, 12); /* 37: the last batch of 8 is filled up with unscored rows */
    zt_train_config c;
    zt_train_result straight, first, second;
    bert_classify_config(&c, "BA");
    zt_fixture_train_ok(&c, &straight);
    print_message("bert classifier: val loss %.4f -> %.4f, accuracy %.4f\n", (double)straight.first_val_loss,
                  (double)straight.last_val_loss, (double)straight.last_val_accuracy);
    assert_true(straight.last_val_loss < 0.5f * straight.first_val_loss);
    assert_true(straight.last_val_accuracy >= 0.9f);
    size_t n = 0;
    char *text = slurp("BA/metrics.jsonl", &n);
    assert_non_null(strstr(text, "\"val_accuracy\""));
    free(text);
    text = slurp("BA/ckpt_000100/model_config.json", &n);
    assert_non_null(strstr(text, "BertForSequenceClassification"));
    assert_non_null(strstr(text, "\"positive\""));
    free(text);

    bert_classify_config(&c, "BB");
    c.stop_at_step = 13;
    zt_fixture_train_ok(&c, &first);
    bert_classify_config(&c, "BB");
    snprintf(c.resume, sizeof(c.resume), "%s/BB", g_dir);
    zt_fixture_train_ok(&c, &second);
    assert_memory_equal(first.losses, straight.losses, 13 * sizeof(float));
    assert_memory_equal(second.losses, straight.losses + 13, 87 * sizeof(float));
    expect_same_file("BA/ckpt_000100/model.safetensors", "BB/ckpt_000100/model.safetensors");
    assert_true(second.last_val_accuracy == straight.last_val_accuracy);

    /* two ranks, each with half of every batch: the same losses, and the accuracy summed over both (the
     * validation file's last batch puts 4 scored rows on rank 0 and 1 on rank 1) */
    bert_classify_config(&c, "BW");
    float two[100], two_val[2] = {NAN, NAN};
    zt_fixture_train_ranks(&c, 2, two, 100, two_val);
    for (int i = 0; i < 100; i++)
        if (fabsf(two[i] - straight.losses[i]) > 1e-4f * fabsf(straight.losses[i]) + 1e-6f)
            fail_msg("W=2 step %d: loss %.9g, W=1 %.9g", i + 1, (double)two[i], (double)straight.losses[i]);
    assert_true(two_val[1] == straight.last_val_accuracy);
    assert_true(fabsf(two_val[0] - straight.last_val_loss) <= 1e-3f * straight.last_val_loss);

    /* fine-tuning from a masked-LM checkpoint (as bert-base-uncased is): the encoder comes from the file, the
     * classification head keeps its initialisation */
    {
        bert_classify_config(&c, "BM");
        zt_bert_config mlm = (*ZT_BERT_CONFIG(&c.model));
        mlm.head = ZT_BERT_HEAD_MLM;
        zt_bert *pre = NULL;
        zt_err err = {{0}};
        assert_int_equal(zt_bert_create(&pre, &mlm, 1, T, 77, &err), 0);
        char path[512];
        path_of(path, sizeof path, "mlm.safetensors");
        assert_int_equal(zt_bert_export(pre, path, &err), 0);
        zt_bert_destroy(pre);
        snprintf(c.init_from, sizeof c.init_from, "%s", path);
        c.steps = 2;
        c.warmup_steps = 1;
        zt_train_result res;
        zt_fixture_train_ok(&c, &res);
        assert_true(res.first_val_loss != straight.first_val_loss); /* other encoder weights than seed 5's */
        zt_train_result_free(&res);
    }

    /* bad inputs: the file and line, or the missing setting, and the fix */
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"{\"text\": \"good\", \"label\": \"neutral\"}", "cls_bad.jsonl:2: \"label\" 'neutral' is not a label"},
        {"{\"text\": \"good\", \"label\": 2}", "cls_bad.jsonl:2: \"label\" 2 is not a class"},
        {"{\"label\": 1}", "cls_bad.jsonl:2: \"text\" is missing"},
        {"{\"text\": \"good\"}", "cls_bad.jsonl:2: \"label\" is missing"},
        {"[1, 2]", "cls_bad.jsonl:2: not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"text\": \"bad\", \"label\": 0}\n%s\n", bad[i].line);
        write_text_file("cls_bad.jsonl", body);
        bert_classify_config(&c, "BC");
        snprintf(c.train_data, sizeof c.train_data, "%s/cls_bad.jsonl", g_dir);
        zt_train_result res;
        zt_err err = {{0}};
        assert_true(zt_trainer_run(&c, &res, &err) < 0);
        if (!strstr(err.msg, bad[i].want) || !strstr(err.msg, "--train-data"))
            fail_msg("'%s': %s", bad[i].line, err.msg);
        zt_train_result_free(&res);
    }
    bert_classify_config(&c, "BC");
    c.tokenizer[0] = '\0';
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_validate(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "tokenizer.json"));
    zt_train_result_free(&straight);
    zt_train_result_free(&first);
    zt_train_result_free(&second);
}

/* A BERT masked LM on token shards: the tokenizer names [MASK] and the special tokens; masks depend on the
 * seed and the step only, so a resumed run is the straight one bit for bit, and the loss falls. */
static void bert_mlm_config(zt_train_config *c, const char *out)
{
    bert_classify_config(c, out);
    zt_bert_config *e = ZT_BERT_CONFIG(&c->model);
    e->head = ZT_BERT_HEAD_MLM;
    e->vocab_size = VOCAB; /* the shards' ids; the tokenizer's [MASK] (20) is among them */
    e->initializer_range = 0.02f;
    snprintf(c->train_data, sizeof(c->train_data), "%s/t_train_*.bin", g_dir);
    snprintf(c->val_data, sizeof(c->val_data), "%s/t_val_*.bin", g_dir);
    c->batch_size = B;
    c->grad_accum = 2;
    c->steps = 30;
    c->lr = 1e-2;
    c->min_lr = 1e-3;
    c->eval_every = 15;
    c->eval_batches = 4;
    zt_fixture_finish_config(c);
}

/* The trainer with BERT on the GPU (CUDA builds on a machine with a GPU; skipped elsewhere): the classifier
 * and the masked LM, in fp32, track the CPU runs of the same configs step by step (1e-2 relative; see the
 * comment in the loop), and the validation loss and accuracy agree. The models are the CPU tests' with heads of 32 channels, which the CUDA attention serves. */
static void test_bert_on_gpu(void **state)
{
    (void)state;
#ifdef ZT_WITH_CUDA
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0) {
        cudaGetLastError();
        print_message("no CUDA GPU: the BERT GPU runs are skipped\n");
        skip();
    }
    write_cls_tokenizer();
    write_cls_data("cls_train.jsonl", 160, 11);
    write_cls_data("cls_val.jsonl", 37, 12);
    for (int mlm = 0; mlm < 2; mlm++) {
        zt_train_result r[2];
        for (int gpu = 0; gpu < 2; gpu++) {
            zt_train_config c;
            const char *out = mlm ? (gpu ? "GMg" : "GMc") : (gpu ? "GCg" : "GCc");
            if (mlm)
                bert_mlm_config(&c, out);
            else
                bert_classify_config(&c, out);
            ZT_BERT_CONFIG(&c.model)->hidden_size = 96; /* 3 heads of 32 */
            c.steps = mlm ? 20 : 40;
            c.eval_every = mlm ? 10 : 20;
            zt_err err = {{0}};
            if (zt_train_config_set_flag(&c, "--device", gpu ? "cuda" : "cpu", &err) != 0 ||
                zt_train_config_set_flag(&c, "--precision", "fp32", &err) != 0)
                fail_msg("%s", err.msg);
            zt_fixture_finish_config(&c);
            zt_fixture_train_ok(&c, &r[gpu]);
        }
        double worst = 0.0;
        for (int64_t s = 0; s < r[0].end_step; s++) {
            const double rel = fabs((double)r[1].losses[s] - (double)r[0].losses[s]) / fabs((double)r[0].losses[s]);
            worst = fmax(worst, rel);
            /* The GPU sums in other orders, and the differences grow over the steps: AdamW's normalised update
             * turns the key bias's gradient, zero in exact arithmetic and rounding noise on either side, into
             * full-size steps of either sign (test_bert_cuda checks one step's gradients at 1e-4). */
            if (!(rel <= 1e-2))
                fail_msg("bert %s on the GPU: step %lld loss %.7f, CPU %.7f", mlm ? "masked LM" : "classifier",
                         (long long)s + 1, (double)r[1].losses[s], (double)r[0].losses[s]);
        }
        print_message("bert %s on the GPU: loss %.5f -> %.5f, largest relative difference to the CPU %.3g; val loss "
                      "%.6f (CPU %.6f), accuracy %.4f (CPU %.4f)\n", mlm ? "masked LM" : "classifier",
                      (double)r[1].losses[0], (double)r[1].losses[r[1].end_step - 1], worst,
                      (double)r[1].last_val_loss, (double)r[0].last_val_loss, (double)r[1].last_val_accuracy,
                      (double)r[0].last_val_accuracy);
        assert_true(fabsf(r[1].last_val_loss - r[0].last_val_loss) <= 1e-2f * r[0].last_val_loss);
        assert_true(fabsf(r[1].last_val_accuracy - r[0].last_val_accuracy) <= 0.05f);
        zt_train_result_free(&r[0]);
        zt_train_result_free(&r[1]);
    }
#else
    skip();
#endif
}

static void test_bert_masked_lm(void **state)
{
    (void)state;
    write_cls_tokenizer();
    zt_train_config c;
    zt_train_result straight, first, second;
    bert_mlm_config(&c, "MA");
    zt_fixture_train_ok(&c, &straight);
    print_message("bert masked LM: val loss %.4f -> %.4f, masked-token accuracy %.4f\n",
                  (double)straight.first_val_loss, (double)straight.last_val_loss, (double)straight.last_val_accuracy);
    assert_true(straight.last_val_loss < 0.9f * straight.first_val_loss);
    assert_true(straight.last_val_accuracy > 0.0f && straight.last_val_accuracy <= 1.0f);
    bert_mlm_config(&c, "MB");
    c.stop_at_step = 7;
    zt_fixture_train_ok(&c, &first);
    bert_mlm_config(&c, "MB");
    snprintf(c.resume, sizeof(c.resume), "%s/MB", g_dir);
    zt_fixture_train_ok(&c, &second);
    assert_memory_equal(first.losses, straight.losses, 7 * sizeof(float));
    assert_memory_equal(second.losses, straight.losses + 7, 23 * sizeof(float));
    expect_same_file("MA/ckpt_000030/model.safetensors", "MB/ckpt_000030/model.safetensors");
    /* two ranks, whose rows hold different numbers of masked tokens: each rank's gradient weighs by its share
     * of the batch's masked tokens, so the model is W=1's (to rounding: the validation loss and accuracy
     * agree); the train losses logged are the mean of the ranks' means, which differs */
    bert_mlm_config(&c, "MW");
    float two[30], two_val[2] = {NAN, NAN};
    zt_fixture_train_ranks(&c, 2, two, 30, two_val);
    print_message("bert masked LM at W=2: val loss %.6f (W=1 %.6f), accuracy %.4f\n", (double)two_val[0],
                  (double)straight.last_val_loss, (double)two_val[1]);
    assert_true(fabsf(two_val[0] - straight.last_val_loss) <= 1e-4f * straight.last_val_loss);
    assert_true(two_val[1] == straight.last_val_accuracy);
    /* a tokenizer without a mask token is refused, naming the fix */
    write_text_file("nomask.json", "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, "
                    "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, \"post_processor\": null, \"decoder\": null, "
                    "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": "
                    "\"##\", \"max_input_chars_per_word\": 100, \"vocab\": {\"[UNK]\": 0, \"a\": 1}}}");
    bert_mlm_config(&c, "MC");
    snprintf(c.tokenizer, sizeof c.tokenizer, "%s/nomask.json", g_dir);
    zt_train_result res;
    zt_err err = {{0}};
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "neither [MASK] nor <mask>"));
    zt_train_result_free(&res);
    zt_train_result_free(&straight);
    zt_train_result_free(&first);
    zt_train_result_free(&second);
}

static void test_request_stop(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    base_config(&c, "S");
    zt_trainer_request_stop(); /* as a SIGINT handler would */
    zt_fixture_train_ok(&c, &res);
    assert_true(res.interrupted);
    assert_int_equal(res.end_step, 1);
    assert_true(exists("S/ckpt_000001/manifest.json"));
    zt_train_result_free(&res);

    /* The request was consumed: the resumed run goes to the end. */
    snprintf(c.resume, sizeof(c.resume), "%s/S", g_dir);
    zt_fixture_train_ok(&c, &res);
    assert_false(res.interrupted);
    assert_int_equal(res.end_step, 6);
    zt_train_result_free(&res);
}

static void test_grad_accum_matches_bigger_batch(void **state)
{
    (void)state;
    zt_gpt2_config mc = tiny_model();
    zt_gpt2 *small = NULL, *big = NULL;
    zt_dataloader *dl_small = NULL, *dl_big = NULL;
    zt_err err = {{0}};
    char pattern[512];
    path_of(pattern, sizeof(pattern), "t_train_*.bin");
    assert_int_equal(zt_gpt2_create(&small, &mc, B, T, 9, &err), 0);
    assert_int_equal(zt_gpt2_create(&big, &mc, 2 * B, T, 9, &err), 0);
    size_t n = zt_gpt2_num_params(small);
    assert_memory_equal(zt_gpt2_params(small), zt_gpt2_params(big), n * sizeof(float));
    /* Without shuffling, two windows of B rows are the one window of 2B rows. */
    assert_int_equal(zt_dataloader_open(&dl_small, pattern, B, T, false, 1, &err), 0);
    assert_int_equal(zt_dataloader_open(&dl_big, pattern, 2 * B, T, false, 1, &err), 0);

    int32_t in[2 * B * T], tg[2 * B * T];
    float loss_accum = zt_fixture_accumulate(small, dl_small, 2, B, T, in, tg);
    float loss_big = zt_fixture_accumulate(big, dl_big, 1, 2 * B, T, in, tg);
    assert_true(fabsf(loss_accum - loss_big) <= 1e-5f * fabsf(loss_big));

    const float *ga = zt_gpt2_grads(small), *gb = zt_gpt2_grads(big);
    double max_abs = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < n; i++) {
        max_abs = fmax(max_abs, fabs(gb[i]));
        max_diff = fmax(max_diff, fabs((double)ga[i] - gb[i]));
    }
    assert_true(max_abs > 0.0);
    if (max_diff > 1e-5 * max_abs)
        fail_msg("gradients differ by %g (largest gradient %g)", max_diff, max_abs);
    /* The same norm too, to float precision. */
    double na = zt_optimizer_grad_norm(ga, n), nb = zt_optimizer_grad_norm(gb, n);
    assert_true(fabs(na - nb) <= 1e-5 * nb);

    zt_dataloader_close(dl_small);
    zt_dataloader_close(dl_big);
    zt_gpt2_destroy(small);
    zt_gpt2_destroy(big);
}

/* Inverts one byte of g_dir/rel at offset (negative: from the end). */
static void flip_byte(const char *rel, long offset)
{
    char path[512];
    path_of(path, sizeof(path), rel);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
    int ch = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(ch ^ 0xff, f);
    fclose(f);
}

static void expect_resume_error(const char *out, const char *resume_rel, int code, const char *n1, const char *n2)
{
    zt_train_config c;
    zt_train_result res;
    base_config(&c, out);
    c.steps = 8;
    snprintf(c.resume, sizeof(c.resume), "%s/%s", g_dir, resume_rel);
    zt_err err = {{0}};
    int rc = zt_trainer_run(&c, &res, &err);
    zt_train_result_free(&res);
    if (rc != code)
        fail_msg("resume from %s returned %d, expected %d (%s)", resume_rel, rc, code, err.msg);
    if (!strstr(err.msg, n1) || (n2 && !strstr(err.msg, n2)))
        fail_msg("message '%s' does not contain '%s' and '%s'", err.msg, n1, n2 ? n2 : "");
}

static void test_corrupt_checkpoint_is_refused(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    base_config(&c, "K");
    c.steps = 4;
    zt_fixture_train_ok(&c, &res);
    zt_train_result_free(&res);

    /* One flipped bit of the weights, in the tensor data (the header still parses). */
    flip_byte("K/ckpt_000004/model.safetensors", -5);
    expect_resume_error("K", "K", ZT_ECHECKSUM, "is corrupt: model.safetensors crc32c mismatch", "ckpt_000004");
    /* Nothing was written by the refused run. */
    assert_false(exists("K/ckpt_000008"));
    size_t n = 0;
    char *latest = slurp("K/latest", &n);
    assert_string_equal(latest, "ckpt_000004\n");
    free(latest);
    flip_byte("K/ckpt_000004/model.safetensors", -5); /* repaired */

    /* A truncated optimizer file. */
    char path[512];
    path_of(path, sizeof(path), "K/ckpt_000002/optim.safetensors");
    assert_int_equal(truncate(path, 100), 0);
    expect_resume_error("K", "K/ckpt_000002", ZT_ECHECKSUM, "optim.safetensors", "bytes");

    /* A checkpoint without its manifest, and a run directory without checkpoints. */
    path_of(path, sizeof(path), "K/ckpt_000004/manifest.json");
    char moved[520];
    snprintf(moved, sizeof(moved), "%s.away", path);
    assert_int_equal(rename(path, moved), 0);
    expect_resume_error("K", "K/ckpt_000004", -ENOENT, "ckpt_000004", "manifest.json");
    assert_int_equal(rename(moved, path), 0);
    path_of(path, sizeof(path), "empty_run");
    mkdir(path, 0755);
    expect_resume_error("K", "empty_run", -ENOENT, "empty_run", "latest");

    /* The repaired checkpoint resumes fine. */
    base_config(&c, "K");
    c.steps = 5;
    snprintf(c.resume, sizeof(c.resume), "%s/K", g_dir);
    zt_fixture_train_ok(&c, &res);
    assert_int_equal(res.start_step, 4);
    zt_train_result_free(&res);
}

static void test_other_model_is_refused(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    base_config(&c, "M");
    c.steps = 2;
    c.warmup_steps = 1;
    zt_fixture_train_ok(&c, &res);
    zt_train_result_free(&res);

    base_config(&c, "M");
    ZT_GPT2_CONFIG(&c.model)->n_layer = 1;
    c.steps = 4;
    snprintf(c.resume, sizeof(c.resume), "%s/M", g_dir);
    zt_err err = {{0}};
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_EMISMATCH);
    zt_train_result_free(&res);
    assert_non_null(strstr(err.msg, "n_layer = 2"));
    assert_non_null(strstr(err.msg, "n_layer = 1"));
    assert_non_null(strstr(err.msg, "model_config.json"));
}

static void test_setup_errors(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    zt_err err = {{0}};

    /* Data with token ids the model has no embedding for. */
    base_config(&c, "V");
    snprintf(c.train_data, sizeof(c.train_data), "%s/big_train_*.bin", g_dir);
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_EMISMATCH);
    zt_train_result_free(&res);
    assert_non_null(strstr(err.msg, "token id 70 in '"));
    assert_non_null(strstr(err.msg, "big_train_000.bin' does not fit vocab_size 64"));
    assert_false(exists("V/latest"));

    /* A fresh run into a directory that holds one already. */
    base_config(&c, "R");
    c.steps = 2;
    c.warmup_steps = 1;
    zt_fixture_train_ok(&c, &res);
    zt_train_result_free(&res);
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_EINVAL_CONFIG);
    zt_train_result_free(&res);
    assert_non_null(strstr(err.msg, "--resume"));

    /* A run that stopped before its first checkpoint is started over. */
    char path[512];
    path_of(path, sizeof(path), "F");
    mkdir(path, 0755);
    path_of(path, sizeof(path), "F/metrics.jsonl");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"step\":0,\"val_loss\":9.5}\n{\"step\":1,\"lo", f);
    fclose(f);
    base_config(&c, "F");
    c.steps = 2;
    c.warmup_steps = 1;
    zt_fixture_train_ok(&c, &res);
    zt_train_result_free(&res);
    size_t n = 0;
    char *metrics = slurp("F/metrics.jsonl", &n);
    /* (the old line itself: a new line's tokens/s or elapsed time may well contain the digits "9.5") */
    assert_null(strstr(metrics, "{\"step\":0,\"val_loss\":9.5}"));
    assert_non_null(strstr(metrics, "{\"step\":2,\"loss\":"));
    free(metrics);

    /* Resuming a finished run without more steps. */
    snprintf(c.resume, sizeof(c.resume), "%s/R", g_dir);
    assert_int_equal(zt_trainer_run(&c, &res, &err), ZT_EINVAL_CONFIG);
    zt_train_result_free(&res);
    assert_non_null(strstr(err.msg, "--steps"));

    /* A run directory that cannot be created. */
    base_config(&c, "t_val_000.bin/run"); /* below a regular file */
    assert_true(zt_trainer_run(&c, &res, &err) < 0);
    zt_train_result_free(&res);
    assert_non_null(strstr(err.msg, "t_val_000.bin"));
}

static void test_optimizer_guards(void **state)
{
    (void)state;
    zt_gpt2_config mc = tiny_model();
    zt_gpt2 *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_gpt2_create(&m, &mc, 1, 4, 3, &err), 0);
    size_t n = zt_gpt2_num_params(m);
    zt_optimizer opt;
    assert_int_equal(zt_optimizer_init(&opt, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
    float *before = malloc(n * sizeof(float));
    float *g = zt_gpt2_grads(m);

    /* Clipping coefficient: min(1, max / (norm + 1e-6)); 0 turns it off. */
    assert_true(fabsf(zt_optimizer_clip_coef(10.0, 1.0) - 0.1f) < 1e-6f);
    assert_true(zt_optimizer_clip_coef(0.5, 1.0) == 1.0f);
    assert_true(zt_optimizer_clip_coef(1e9, 0.0) == 1.0f);

    /* A finite step updates every parameter with a non-zero gradient. */
    for (size_t i = 0; i < n; i++)
        g[i] = 0.01f;
    memcpy(before, zt_gpt2_params(m), n * sizeof(float));
    zt_optimizer_report rep;
    assert_int_equal(zt_optimizer_step(&opt, zt_gpt2_params(m), zt_gpt2_grads(m), zt_gpt2_tensor(m, 0),
                                       zt_gpt2_num_tensors(m), 2.0f, 1e-3f, &rep, &err), 0);
    assert_false(rep.skipped);
    assert_int_equal(opt.adam_step, 1);
    assert_true(fabs(rep.grad_norm - 0.01 * sqrt((double)n)) < 1e-6 * sqrt((double)n));
    assert_true(rep.clip_coef < 1.0f); /* norm 0.01 sqrt(n) > 1 for this model */
    assert_memory_not_equal(before, zt_gpt2_params(m), n * sizeof(float));

    /* Non-finite gradient or loss: skipped, parameters and Adam step unchanged, counted. */
    memcpy(before, zt_gpt2_params(m), n * sizeof(float));
    g[n / 2] = NAN;
    for (int i = 1; i < ZT_OPTIMIZER_MAX_BAD_STEPS; i++) {
        assert_int_equal(zt_optimizer_step(&opt, zt_gpt2_params(m), zt_gpt2_grads(m), zt_gpt2_tensor(m, 0),
                                       zt_gpt2_num_tensors(m), 2.0f, 1e-3f, &rep, &err), 0);
        assert_true(rep.skipped);
    }
    assert_int_equal(opt.skipped_steps, ZT_OPTIMIZER_MAX_BAD_STEPS - 1);
    assert_int_equal(opt.adam_step, 1);
    assert_memory_equal(before, zt_gpt2_params(m), n * sizeof(float));
    /* A good step resets the run of bad ones... */
    g[n / 2] = 0.01f;
    assert_int_equal(zt_optimizer_step(&opt, zt_gpt2_params(m), zt_gpt2_grads(m), zt_gpt2_tensor(m, 0),
                                       zt_gpt2_num_tensors(m), 2.0f, 1e-3f, &rep, &err), 0);
    assert_int_equal(opt.adam_step, 2);
    /* ...and ten bad ones in a row stop the run with a message. */
    for (int i = 1; i < ZT_OPTIMIZER_MAX_BAD_STEPS; i++)
        assert_int_equal(zt_optimizer_step(&opt, zt_gpt2_params(m), zt_gpt2_grads(m), zt_gpt2_tensor(m, 0),
                                       zt_gpt2_num_tensors(m), INFINITY, 1e-3f, &rep, &err), 0);
    assert_int_equal(zt_optimizer_step(&opt, zt_gpt2_params(m), zt_gpt2_grads(m), zt_gpt2_tensor(m, 0),
                                       zt_gpt2_num_tensors(m), INFINITY, 1e-3f, &rep, &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "10 steps in a row"));
    assert_non_null(strstr(err.msg, "--lr"));
    assert_int_equal(opt.skipped_steps, 2 * ZT_OPTIMIZER_MAX_BAD_STEPS - 1);

    free(before);
    zt_optimizer_free(&opt);
    zt_gpt2_destroy(m);
}

/* bf16 of x, rounded to nearest even (finite x). */
static uint16_t bf16_rne(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* With o->lowp set, a step also writes every tensor's updated weights, rounded to bf16 or fp16, and leaves
 * the fp32 update and the slab outside the tensors as they were. */
static void test_optimizer_lowp_copy(void **state)
{
    (void)state;
    const enum zt_dtype dtypes[2] = {ZT_DTYPE_BF16, ZT_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        zt_gpt2_config mc = tiny_model();
        zt_gpt2 *a = NULL, *b = NULL;
        zt_err err = {{0}};
        assert_int_equal(zt_gpt2_create(&a, &mc, 1, 4, 3, &err), 0);
        assert_int_equal(zt_gpt2_create(&b, &mc, 1, 4, 3, &err), 0);
        size_t n = zt_gpt2_num_params(a);
        zt_optimizer oa, ob;
        assert_int_equal(zt_optimizer_init(&oa, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
        assert_int_equal(zt_optimizer_init(&ob, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
        uint16_t *lowp = malloc(n * sizeof(uint16_t));
        memset(lowp, 0xab, n * sizeof(uint16_t));
        ob.lowp = lowp;
        ob.lowp_dtype = dtypes[k];
        for (int step = 0; step < 2; step++) {
            float *ga = zt_gpt2_grads(a), *gb = zt_gpt2_grads(b);
            for (size_t i = 0; i < n; i++)
                ga[i] = gb[i] = 0.01f * (float)((i * 7919 + (size_t)step * 104729) % 2001) / 1000.0f - 0.01f;
            zt_optimizer_report ra, rb;
            assert_int_equal(zt_optimizer_step(&oa, zt_gpt2_params(a), zt_gpt2_grads(a), zt_gpt2_tensor(a, 0),
                                       zt_gpt2_num_tensors(a), 2.0f, 1e-2f, &ra, &err), 0);
            assert_int_equal(zt_optimizer_step(&ob, zt_gpt2_params(b), zt_gpt2_grads(b), zt_gpt2_tensor(b, 0),
                                       zt_gpt2_num_tensors(b), 2.0f, 1e-2f, &rb, &err), 0);
        }
        assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), n * sizeof(float));
        const float *p = zt_gpt2_params(b);
        bool *in_tensor = calloc(n, sizeof(bool));
        for (int t = 0; t < zt_gpt2_num_tensors(b); t++) {
            const zt_param_info *ti = zt_gpt2_tensor(b, t);
            for (size_t i = ti->offset; i < ti->offset + ti->numel; i++) {
                in_tensor[i] = true;
                uint16_t want;
                if (dtypes[k] == ZT_DTYPE_BF16) {
                    want = bf16_rne(p[i]);
                } else {
                    _Float16 h = (_Float16)p[i]; /* the compiler's conversion: round to nearest even */
                    memcpy(&want, &h, 2);
                }
                if (lowp[i] != want)
                    fail_msg("%s: element %zu (%s): 0x%04x, want 0x%04x for %.9g", zt_dtype_name(dtypes[k]), i,
                             ti->name, lowp[i], want, (double)p[i]);
            }
        }
        for (size_t i = 0; i < n; i++)
            if (!in_tensor[i])
                assert_int_equal(lowp[i], 0xabab);
        free(in_tensor);
        free(lowp);
        zt_optimizer_free(&oa);
        zt_optimizer_free(&ob);
        zt_gpt2_destroy(a);
        zt_gpt2_destroy(b);
    }
}

static void test_export(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    base_config(&c, "E");
    c.steps = 2;
    c.warmup_steps = 1;
    zt_fixture_train_ok(&c, &res);

    char ckpt[512], out[512];
    path_of(ckpt, sizeof(ckpt), "E");
    path_of(out, sizeof(out), "E_export/sub/model.safetensors");
    char *argv[] = {"export", "--checkpoint", ckpt, "--out", out, NULL};
    assert_int_equal(zt_cmd_export(5, argv), 0);
    expect_same_file("E/ckpt_000002/model.safetensors", "E_export/sub/model.safetensors");
    expect_same_file("E/ckpt_000002/model_config.json", "E_export/sub/config.json");
    assert_false(exists("E_export/sub/model.safetensors.tmp"));

    /* A new run that starts from the export evaluates, before its first step, exactly what the first run
     * evaluated after its last. */
    zt_train_config c2;
    zt_train_result res2;
    base_config(&c2, "E_init");
    c2.steps = 2;
    c2.warmup_steps = 1;
    snprintf(c2.init_from, sizeof(c2.init_from), "%s", out);
    zt_fixture_train_ok(&c2, &res2);
    assert_memory_equal(&res2.first_val_loss, &res.last_val_loss, sizeof(float));
    zt_train_result_free(&res2);

    /* Usage errors exit with 2, a corrupt checkpoint with 1 and no output. */
    char *no_out[] = {"export", "--checkpoint", ckpt, NULL};
    assert_int_equal(zt_cmd_export(3, no_out), 2);
    char *bogus[] = {"export", "--bogus", NULL};
    assert_int_equal(zt_cmd_export(2, bogus), 2);
    flip_byte("E/ckpt_000002/optim.safetensors", -3);
    path_of(out, sizeof(out), "E_export2/model.safetensors");
    char *corrupt[] = {"export", "--checkpoint", ckpt, "--out", out, NULL};
    assert_int_equal(zt_cmd_export(5, corrupt), 1);
    assert_false(exists("E_export2/model.safetensors"));
    zt_train_result_free(&res);
}

/* With save_grads, ckpt_000002/grads.safetensors holds the gradient of step 2: that of the parameters of
 * ckpt_000001 on the second window of the (unshuffled) training data, as zt_gpt2_backward computes it;
 * a resume from that checkpoint continues as usual. */
static void test_save_grads(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    base_config(&c, "grads");
    c.steps = 2;
    c.warmup_steps = 1;
    c.save_every = 1;
    c.grad_accum = 1;
    c.shuffle = false;
    c.val_data[0] = '\0';
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(&c, "--save-grads", "", &err), 0);
    assert_true(c.save_grads);
    zt_fixture_train_ok(&c, &res);
    zt_train_result_free(&res);
    assert_true(exists("grads/ckpt_000001/grads.safetensors"));
    assert_true(exists("grads/ckpt_000002/grads.safetensors"));

    /* The reference: step 2's batch through the parameters after step 1. */
    zt_gpt2_config mc = tiny_model();
    zt_gpt2 *m = NULL;
    zt_dataloader *dl = NULL;
    char path[512];
    assert_int_equal(zt_gpt2_create(&m, &mc, B, T, 1, &err), 0);
    path_of(path, sizeof(path), "grads/ckpt_000001/model.safetensors");
    assert_int_equal(zt_gpt2_import(m, path, &err), 0);
    path_of(path, sizeof(path), "t_train_*.bin");
    assert_int_equal(zt_dataloader_open(&dl, path, B, T, false, (uint64_t)c.seed, &err), 0);
    int32_t in[B * T], tg[B * T];
    zt_dataloader_next(dl, in, tg); /* step 1's window */
    zt_dataloader_next(dl, in, tg);
    zt_gpt2_zero_grad(m);
    zt_gpt2_forward(m, in, tg, B, T);
    zt_gpt2_backward(m, 1.0f);
    const float *want = zt_gpt2_grads(m);

    zt_st_file *f = NULL;
    path_of(path, sizeof(path), "grads/ckpt_000002/grads.safetensors");
    assert_int_equal(zt_st_open(path, &f, &err), 0);
    assert_int_equal(zt_st_count(f), zt_gpt2_num_tensors(m));
    double max_abs = 0.0, max_diff = 0.0;
    for (int i = 0; i < zt_gpt2_num_tensors(m); i++) {
        const zt_param_info *t = zt_gpt2_tensor(m, i);
        const zt_st_tensor *g = zt_st_find(f, t->name);
        if (!g)
            fail_msg("grads.safetensors has no tensor '%s'", t->name);
        assert_int_equal(g->dtype, ZT_DTYPE_F32);
        assert_int_equal(g->nbytes, t->numel * sizeof(float));
        const float *got = (const float *)g->data;
        for (size_t k = 0; k < t->numel; k++) {
            max_abs = fmax(max_abs, fabs(want[t->offset + k]));
            max_diff = fmax(max_diff, fabs((double)got[k] - want[t->offset + k]));
        }
    }
    zt_st_close(f);
    zt_dataloader_close(dl);
    zt_gpt2_destroy(m);
    assert_true(max_abs > 0.0);
    if (max_diff > 1e-6 * max_abs)
        fail_msg("saved gradients differ from zt_gpt2_backward by %g (largest gradient %g)", max_diff, max_abs);

    /* Resuming ignores the gradient file. */
    c.steps = 3;
    snprintf(c.resume, sizeof(c.resume), "%s/grads", g_dir);
    zt_fixture_train_ok(&c, &res);
    assert_int_equal(res.end_step, 3);
    zt_train_result_free(&res);
    assert_true(exists("grads/ckpt_000003/grads.safetensors"));
}

int main(void)
{
    zt_log_set_level(ZT_LOG_ERROR); /* the runs' progress lines would drown cmocka's report */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_is_bit_identical),
        cmocka_unit_test(test_llama_family),
        cmocka_unit_test(test_bert_classifier),
        cmocka_unit_test(test_bert_masked_lm),
        cmocka_unit_test(test_bert_on_gpu),
        cmocka_unit_test(test_request_stop),
        cmocka_unit_test(test_grad_accum_matches_bigger_batch),
        cmocka_unit_test(test_corrupt_checkpoint_is_refused),
        cmocka_unit_test(test_other_model_is_refused),
        cmocka_unit_test(test_setup_errors),
        cmocka_unit_test(test_optimizer_guards),
        cmocka_unit_test(test_optimizer_lowp_copy),
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_save_grads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
