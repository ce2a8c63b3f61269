/* Tests of the BERT / RoBERTa model (worker/models/bert.c): config.json parsing and writing (odd sizes,
 * every refused field named), the parameter count and layout, initialisation, the per-block passes against
 * the whole model bit for bit (with and without checkpointing, and through the training engine), a
 * finite-difference check of every tensor for both heads, padding, token types, safetensors export/import
 * (round trip and every refusal leaving the model unchanged), and the masked-LM masking statistics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <math.h>

#include "common/rng.h"
#include "common/safetensors.h"
#include "worker/comm/comm.h"
#include "worker/engine/engine.h"
#include "worker/models/bert.h"
#include "worker/train/task.h"
#include "worker/models/model.h"

/* ---------------------------------------------------------------------------------------------------- */
/* fixtures                                                                                             */
/* ---------------------------------------------------------------------------------------------------- */

static char g_dir[256]; /* a temporary folder for the files of one test */

static int make_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zt_test_bert_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

/* Parses text into a config that starts from BERT's defaults; returns the code. */
static int parse_config(const char *text, zt_bert_config *cfg, zt_err *err)
{
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    zt_bert_config_default(cfg);
    int rc = zt_bert_config_from_json(cfg, obj, "config.json", err);
    cJSON_Delete(obj);
    return rc;
}

/* Small models of odd sizes: 3 heads of 12 channels, vocabularies that are not multiples of 64. */
static zt_bert_config small_config(bool roberta, enum zt_bert_head head)
{
    zt_bert_config c;
    if (roberta)
        zt_bert_config_default_roberta(&c);
    else
        zt_bert_config_default(&c);
    c.head = head;
    c.vocab_size = roberta ? 37 : 41;
    c.hidden_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 3;
    c.intermediate_size = 19;
    c.max_position_embeddings = roberta ? 12 : 10;
    c.type_vocab_size = roberta ? 1 : 3;
    c.num_labels = 3;
    c.hidden_act = roberta ? ZT_BERT_ACT_GELU : ZT_BERT_ACT_GELU_TANH;
    c.layer_norm_eps = 1e-5f;
    return c;
}

static zt_bert *create_model(const zt_bert_config *cfg, int B, int T, uint64_t seed)
{
    zt_bert *m = NULL;
    zt_err err = {{0}};
    if (zt_bert_create(&m, cfg, B, T, seed, &err) != 0)
        fail_msg("zt_bert_create: %s", err.msg);
    return m;
}

/* Sets every parameter to a random value of a trained size, so that every path carries gradient. */
static void randomise_params(zt_bert *m, uint64_t seed, double scale)
{
    zt_rng r;
    zt_rng_seed(&r, seed);
    float *p = zt_bert_params(m);
    for (int i = 0; i < zt_bert_num_tensors(m); i++) {
        const zt_param_info *t = zt_bert_tensor(m, i);
        const bool norm_weight = strstr(t->name, "LayerNorm.weight") || strstr(t->name, "layer_norm.weight");
        for (size_t j = 0; j < t->numel; j++)
            p[t->offset + j] = (float)((norm_weight ? 1.0 : 0.0) + scale * zt_rng_normal(&r));
    }
}

/* A batch of B x T: random tokens (no padding id), trailing padding of pad_rows[b] positions, token types,
 * and targets for the model's head (masked LM: some positions; classification: one label per sequence). */
typedef struct batch {
    int B, T;
    int32_t tokens[64], types[64], targets[64];
} batch;

static batch make_batch(const zt_bert_config *c, int B, int T, const int *pad_rows, uint64_t seed)
{
    batch x;
    ZT_ASSERT(B * T <= 64);
    x.B = B;
    x.T = T;
    zt_rng r;
    zt_rng_seed(&r, seed);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int i = b * T + t;
            const bool padded = pad_rows && t >= T - pad_rows[b];
            int32_t tok = (int32_t)zt_rng_below(&r, (uint64_t)c->vocab_size - 1);
            x.tokens[i] = padded ? c->pad_token_id : tok >= c->pad_token_id ? tok + 1 : tok;
            x.types[i] = padded ? 0 : (int32_t)zt_rng_below(&r, (uint64_t)c->type_vocab_size);
            if (c->head == ZT_BERT_HEAD_MLM)
                x.targets[i] = padded || zt_rng_uniform(&r) < 0.4 ? -1
                                                                  : (int32_t)zt_rng_below(&r, (uint64_t)c->vocab_size);
            else
                x.targets[i] = t == 0 ? (int32_t)zt_rng_below(&r, (uint64_t)c->num_labels) : -1;
        }
    return x;
}

static float forward_batch(zt_bert *m, const batch *x)
{
    zt_bert_set_token_types(m, x->types);
    return zt_bert_forward(m, x->tokens, x->targets, x->B, x->T);
}

/* ---------------------------------------------------------------------------------------------------- */
/* configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

/* bert-base-uncased's config.json as the Hugging Face hub has it, and roberta-base's. */
static void test_config_hf_files(void **state)
{
    (void)state;
    const char *bert =
        "{\"architectures\": [\"BertForMaskedLM\"], \"attention_probs_dropout_prob\": 0.1, \"gradient_checkpointing\": "
        "false, \"hidden_act\": \"gelu\", \"hidden_dropout_prob\": 0.1, \"hidden_size\": 768, \"initializer_range\": "
        "0.02, \"intermediate_size\": 3072, \"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 512, "
        "\"model_type\": \"bert\", \"num_attention_heads\": 12, \"num_hidden_layers\": 12, \"pad_token_id\": 0, "
        "\"position_embedding_type\": \"absolute\", \"transformers_version\": \"4.6.0.dev0\", \"type_vocab_size\": 2, "
        "\"use_cache\": true, \"vocab_size\": 30522}";
    zt_bert_config c;
    zt_err err = {{0}};
    assert_int_equal(parse_config(bert, &c, &err), 0);
    assert_false(c.roberta);
    assert_int_equal(c.head, ZT_BERT_HEAD_MLM);
    assert_int_equal(c.vocab_size, 30522);
    assert_int_equal(c.num_hidden_layers, 12);
    assert_true(c.layer_norm_eps == 1e-12f);
    assert_int_equal(c.hidden_act, ZT_BERT_ACT_GELU);
    assert_int_equal(zt_bert_config_max_seq(&c), 512);
    assert_string_equal(zt_bert_config_architecture(&c), "BertForMaskedLM");

    const char *roberta =
        "{\"architectures\": [\"RobertaForMaskedLM\"], \"attention_probs_dropout_prob\": 0.1, \"bos_token_id\": 0, "
        "\"eos_token_id\": 2, \"hidden_act\": \"gelu\", \"hidden_dropout_prob\": 0.1, \"hidden_size\": 768, "
        "\"initializer_range\": 0.02, \"intermediate_size\": 3072, \"layer_norm_eps\": 1e-05, "
        "\"max_position_embeddings\": 514, \"model_type\": \"roberta\", \"num_attention_heads\": 12, "
        "\"num_hidden_layers\": 12, \"pad_token_id\": 1, \"type_vocab_size\": 1, \"vocab_size\": 50265}";
    assert_int_equal(parse_config(roberta, &c, &err), 0);
    assert_true(c.roberta);
    assert_int_equal(c.pad_token_id, 1);
    assert_int_equal(c.type_vocab_size, 1);
    assert_int_equal(zt_bert_config_max_seq(&c), 512);
    assert_string_equal(zt_bert_config_architecture(&c), "RobertaForMaskedLM");

    /* A fine-tuned classifier: id2label names, problem_type, classifier_dropout null, and transformers 4.x's
     * bookkeeping. */
    const char *cls =
        "{\"_name_or_path\": \"bert-base-uncased\", \"architectures\": [\"BertForSequenceClassification\"], "
        "\"classifier_dropout\": null, \"id2label\": {\"0\": \"negative\", \"1\": \"neutral\", \"2\": \"positive\"}, "
        "\"label2id\": {\"negative\": 0, \"neutral\": 1, \"positive\": 2}, \"model_type\": \"bert\", "
        "\"problem_type\": \"single_label_classification\", \"torch_dtype\": \"float32\", \"hidden_size\": 30, "
        "\"num_attention_heads\": 5, \"intermediate_size\": 37, \"vocab_size\": 71}";
    assert_int_equal(parse_config(cls, &c, &err), 0);
    assert_int_equal(c.head, ZT_BERT_HEAD_CLASSIFY);
    assert_int_equal(c.num_labels, 3);
    char buf[32];
    assert_string_equal(zt_bert_config_label(&c, 2, buf, sizeof buf), "positive");
    assert_int_equal(zt_bert_config_outputs(&c), 3);
    /* Default names are not stored: LABEL_i. */
    assert_int_equal(parse_config("{\"architectures\": [\"BertForSequenceClassification\"], \"num_labels\": 4}", &c,
                                  &err), 0);
    assert_int_equal(c.num_labels, 4);
    assert_string_equal(zt_bert_config_label(&c, 3, buf, sizeof buf), "LABEL_3");
}

/* Odd sizes are fine: heads that are not powers of two, a vocabulary that is not a multiple of 64. */
static void test_config_odd_sizes(void **state)
{
    (void)state;
    zt_bert_config c;
    zt_err err = {{0}};
    assert_int_equal(parse_config("{\"hidden_size\": 42, \"num_attention_heads\": 7, \"intermediate_size\": 29, "
                                  "\"vocab_size\": 89, \"max_position_embeddings\": 15, \"num_hidden_layers\": 3}",
                                  &c, &err), 0);
    assert_int_equal(c.hidden_size / c.num_attention_heads, 6);
    assert_int_equal(c.vocab_size, 89);
    zt_bert *m = create_model(&c, 2, 15, 1);
    assert_int_equal(zt_bert_num_blocks(m), 5);
    zt_bert_destroy(m);
    /* hidden_size must split evenly into heads */
    assert_int_equal(parse_config("{\"hidden_size\": 40, \"num_attention_heads\": 7}", &c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "divisible"));
    assert_int_equal(c.hidden_size, 768); /* unchanged on error */
}

/* Every field ztrain refuses, or refuses a value of, is named in the message. */
static void test_config_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"rope_theta\": 10000}", "rope_theta"},
        {"{\"num_layers\": 3}", "num_layers"},
        {"{\"model_type\": \"gpt2\"}", "model_type"},
        {"{\"architectures\": [\"BertForTokenClassification\"]}", "BertForTokenClassification"},
        {"{\"architectures\": [\"BertForPreTraining\"]}", "BertForPreTraining"},
        {"{\"architectures\": [\"RobertaForMaskedLM\"]}", "model_type"},
        {"{\"architectures\": \"BertForMaskedLM\"}", "architectures"},
        {"{\"hidden_act\": \"relu\"}", "hidden_act"},
        {"{\"position_embedding_type\": \"relative_key\"}", "position_embedding_type"},
        {"{\"problem_type\": \"regression\"}", "problem_type"},
        {"{\"problem_type\": \"multi_label_classification\"}", "problem_type"},
        {"{\"is_decoder\": true}", "is_decoder"},
        {"{\"add_cross_attention\": true}", "add_cross_attention"},
        {"{\"tie_word_embeddings\": false}", "tie_word_embeddings"},
        {"{\"pruned_heads\": {\"0\": [1]}}", "pruned_heads"},
        {"{\"pad_token_id\": null}", "pad_token_id"},
        {"{\"pad_token_id\": 30522}", "pad_token_id"},
        {"{\"vocab_size\": 0}", "vocab_size"},
        {"{\"hidden_dropout_prob\": 1.5}", "hidden_dropout_prob"},
        {"{\"classifier_dropout\": \"0.1\"}", "classifier_dropout"},
        {"{\"layer_norm_eps\": 0}", "layer_norm_eps"},
        {"{\"num_labels\": 3, \"id2label\": {\"0\": \"a\", \"1\": \"b\"}}", "num_labels"},
        {"{\"id2label\": {\"0\": \"a\", \"2\": \"b\"}}", "id2label"},
        {"{\"id2label\": {\"0\": \"a\", \"1\": \"b\"}, \"label2id\": {\"a\": 1, \"b\": 0}}", "label2id"},
        {"{\"label2id\": {\"a\": 0}}", "label2id"},
        {"{\"architectures\": [\"BertForSequenceClassification\"], \"num_labels\": 1}", "num_labels"},
        {"{\"model_type\": \"roberta\", \"max_position_embeddings\": 2}", "max_position_embeddings"},
        {"{\"type_vocab_size\": 2.5}", "type_vocab_size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zt_bert_config c;
        zt_err err = {{0}};
        int rc = parse_config(bad[i].json, &c, &err);
        if (rc != ZT_EINVAL_CONFIG)
            fail_msg("%s was accepted (rc %d)", bad[i].json, rc);
        if (!strstr(err.msg, bad[i].needle))
            fail_msg("%s: message '%s' does not name %s", bad[i].json, err.msg, bad[i].needle);
    }
}

/* model_type picks the defaults of the fields a file leaves out. */
static void test_config_model_type_defaults(void **state)
{
    (void)state;
    zt_bert_config c;
    zt_err err = {{0}};
    assert_int_equal(parse_config("{\"model_type\": \"roberta\", \"num_hidden_layers\": 2}", &c, &err), 0);
    assert_true(c.roberta);
    assert_int_equal(c.vocab_size, 50265);
    assert_int_equal(c.pad_token_id, 1);
    assert_true(c.layer_norm_eps == 1e-5f);
    assert_int_equal(c.num_hidden_layers, 2);
    assert_int_equal(parse_config("{\"hidden_act\": \"gelu_new\"}", &c, &err), 0);
    assert_int_equal(c.hidden_act, ZT_BERT_ACT_GELU_TANH);
    assert_int_equal(parse_config("{\"hidden_act\": \"gelu_pytorch_tanh\"}", &c, &err), 0);
    assert_int_equal(c.hidden_act, ZT_BERT_ACT_GELU_TANH);
}

static void test_config_save_load(void **state)
{
    (void)state;
    char path[300];
    path_in_dir(path, sizeof path, "config.json");
    zt_err err = {{0}};
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        c.initializer_range = 0.037f;
        c.layer_norm_eps = 1e-12f;
        if (k == 3) {
            c.num_labels = 2;
            memcpy(c.label_names, "no\0yes", 7);
        }
        assert_int_equal(zt_bert_config_save(&c, path, &err), 0);
        zt_bert_config back;
        if (zt_bert_config_load(&back, path, &err) != 0)
            fail_msg("%s", err.msg);
        assert_memory_equal(&c, &back, sizeof c);
    }
    /* The file is what transformers writes: sorted keys, the architecture, no ztrain-only fields. */
    char *text = NULL;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    text = calloc(1, 8192);
    assert_true(fread(text, 1, 8191, f) > 0);
    fclose(f);
    assert_non_null(strstr(text, "\"RobertaForSequenceClassification\""));
    assert_non_null(strstr(text, "\"layer_norm_eps\":\t1e-12"));
    assert_non_null(strstr(text, "\"yes\":\t1"));
    free(text);
}

/* ---------------------------------------------------------------------------------------------------- */
/* layout and initialisation                                                                            */
/* ---------------------------------------------------------------------------------------------------- */

/* Parameter counts of the Hugging Face models (model.num_parameters(), the tied decoder counted once). */
static void test_num_params(void **state)
{
    (void)state;
    zt_bert_config c;
    zt_bert_config_default(&c);
    assert_int_equal(zt_bert_config_num_params(&c), 109514298); /* bert-base-uncased, BertForMaskedLM */
    c.head = ZT_BERT_HEAD_CLASSIFY;
    assert_int_equal(zt_bert_config_num_params(&c), 109483778); /* BertForSequenceClassification, 2 labels */
    zt_bert_config_default_roberta(&c);
    assert_int_equal(zt_bert_config_num_params(&c), 124697433); /* roberta-base, RobertaForMaskedLM */
    c.head = ZT_BERT_HEAD_CLASSIFY;
    assert_int_equal(zt_bert_config_num_params(&c), 124647170); /* RobertaForSequenceClassification */
    zt_bert *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_bert_create_layout(&m, &c, &err), 0);
    assert_int_equal(zt_bert_num_params(m), 124647170);
    zt_bert_destroy(m);
}

static void test_layout(void **state)
{
    (void)state;
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        zt_bert *m = NULL;
        zt_err err = {{0}};
        assert_int_equal(zt_bert_create_layout(&m, &c, &err), 0);
        const int L = c.num_hidden_layers, nb = zt_bert_num_blocks(m);
        assert_int_equal(nb, L + 2);
        /* blocks tile the slab in order; tensors lie inside their block, in slab order */
        size_t off = 0;
        for (int b = 0; b < nb; b++) {
            assert_int_equal(zt_bert_block(m, b)->offset, off);
            off += zt_bert_block(m, b)->numel;
        }
        assert_int_equal(off, zt_bert_num_params(m));
        off = 0;
        for (int i = 0; i < zt_bert_num_tensors(m); i++) {
            const zt_param_info *t = zt_bert_tensor(m, i);
            const zt_block_info *blk = zt_bert_block(m, t->block);
            assert_int_equal(t->offset, off);
            assert_true(t->offset >= blk->offset && t->offset + t->numel <= blk->offset + blk->numel);
            assert_true(t->weight_decay == (t->ndim == 2));
            off += t->numel;
        }
        const char *pf = c.roberta ? "roberta." : "bert.";
        char want[96];
        snprintf(want, sizeof want, "%sembeddings.word_embeddings.weight", pf);
        assert_string_equal(zt_bert_tensor(m, 0)->name, want);
        /* query, key and value weights are adjacent (one [3C, C] matrix), then their biases */
        snprintf(want, sizeof want, "%sencoder.layer.1.attention.self.key.weight", pf);
        for (int i = 0; i < zt_bert_num_tensors(m); i++)
            if (strcmp(zt_bert_tensor(m, i)->name, want) == 0) {
                const zt_param_info *q = zt_bert_tensor(m, i - 1), *kk = zt_bert_tensor(m, i);
                const zt_param_info *v = zt_bert_tensor(m, i + 1), *qb = zt_bert_tensor(m, i + 2);
                assert_non_null(strstr(q->name, "query.weight"));
                assert_int_equal(kk->offset, q->offset + q->numel);
                assert_int_equal(v->offset, kk->offset + kk->numel);
                assert_non_null(strstr(qb->name, "query.bias"));
            }
        const zt_param_info *last = zt_bert_tensor(m, zt_bert_num_tensors(m) - 1);
        assert_int_equal(last->block, L + 1);
        const char *last_name = c.head == ZT_BERT_HEAD_MLM
                                    ? (c.roberta ? "lm_head.bias" : "cls.predictions.bias")
                                    : (c.roberta ? "classifier.out_proj.bias" : "classifier.bias");
        assert_string_equal(last->name, last_name);
        assert_int_equal(zt_bert_head_block(m), c.head == ZT_BERT_HEAD_MLM ? 0 : L + 1);
        zt_bert_destroy(m);
    }
}

static void test_init(void **state)
{
    (void)state;
    zt_bert_config c;
    zt_bert_config_default_roberta(&c);
    c.num_hidden_layers = 2;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.intermediate_size = 256;
    c.initializer_range = 0.05f;
    zt_bert *m = create_model(&c, 1, 8, 11), *m2 = create_model(&c, 1, 8, 11);
    assert_memory_equal(zt_bert_params(m), zt_bert_params(m2), zt_bert_num_params(m) * sizeof(float));
    const float *p = zt_bert_params(m);
    const size_t C = (size_t)c.hidden_size;
    for (int i = 0; i < zt_bert_num_tensors(m); i++) {
        const zt_param_info *t = zt_bert_tensor(m, i);
        const float *x = p + t->offset;
        if (strstr(t->name, "LayerNorm.weight") || strstr(t->name, "layer_norm.weight")) {
            for (size_t j = 0; j < t->numel; j++)
                assert_true(x[j] == 1.0f);
        } else if (t->ndim == 1) {
            for (size_t j = 0; j < t->numel; j++)
                assert_true(x[j] == 0.0f);
        } else {
            double s = 0, s2 = 0;
            for (size_t j = 0; j < t->numel; j++) {
                s += x[j];
                s2 += (double)x[j] * x[j];
            }
            const double sd = sqrt(s2 / t->numel - (s / t->numel) * (s / t->numel));
            if (t->numel > 10000 && fabs(sd - 0.05) > 0.002)
                fail_msg("%s: standard deviation %g, expected 0.05", t->name, sd);
        }
    }
    /* the padding rows of the word and (RoBERTa) position embeddings start at zero */
    for (size_t j = 0; j < C; j++) {
        assert_true(p[zt_bert_tensor(m, 0)->offset + (size_t)c.pad_token_id * C + j] == 0.0f);
        assert_true(p[zt_bert_tensor(m, 1)->offset + (size_t)c.pad_token_id * C + j] == 0.0f);
    }
    zt_bert_destroy(m);
    zt_bert_destroy(m2);
}

/* ---------------------------------------------------------------------------------------------------- */
/* passes                                                                                               */
/* ---------------------------------------------------------------------------------------------------- */

/* The per-block passes over separate block buffers give the whole model's loss, logits and gradients bit
 * for bit; with checkpointed layers (dropped after forward, recomputed before backward) too. */
static void run_per_block(zt_bert *m, const batch *x, bool checkpoint, float *loss, float *grads)
{
    const int nb = zt_bert_num_blocks(m), h = zt_bert_head_block(m);
    float **w = calloc((size_t)nb, sizeof *w), **g = calloc((size_t)nb, sizeof *g);
    for (int b = 0; b < nb; b++) {
        const zt_block_info *blk = zt_bert_block(m, b);
        w[b] = malloc(blk->numel * sizeof(float));
        g[b] = calloc(blk->numel, sizeof(float));
        memcpy(w[b], zt_bert_params(m) + blk->offset, blk->numel * sizeof(float));
    }
    zt_bert_set_token_types(m, x->types);
    zt_bert_forward_begin(m, x->tokens, x->B, x->T);
    for (int b = 0; b < nb; b++) {
        zt_bert_forward_block(m, b, w[b]);
        if (checkpoint)
            zt_bert_discard_block_acts(m, b);
    }
    *loss = zt_bert_forward_head(m, w[h], x->targets);
    zt_bert_backward_head(m, w[h], g[h], 1.0f);
    for (int b = nb - 1; b >= 0; b--) {
        if (checkpoint)
            zt_bert_forward_block(m, b, w[b]);
        zt_bert_backward_block(m, b, w[b], g[b]);
    }
    for (int b = 0; b < nb; b++) {
        memcpy(grads + zt_bert_block(m, b)->offset, g[b], zt_bert_block(m, b)->numel * sizeof(float));
        free(w[b]);
        free(g[b]);
    }
    free(w);
    free(g);
}

static void test_per_block_equals_whole(void **state)
{
    (void)state;
    const int pads[3] = {0, 2, 4};
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        zt_bert *m = create_model(&c, 3, 7, 5);
        randomise_params(m, 100 + k, 0.3);
        const batch x = make_batch(&c, 3, 7, pads, 9 + k);
        const size_t P = zt_bert_num_params(m);
        zt_bert_zero_grad(m);
        const float loss = forward_batch(m, &x);
        zt_bert_backward(m, 1.0f);
        assert_true(isfinite(loss) && loss > 0.0f);
        float *whole = malloc(P * sizeof(float)), *blocks = malloc(P * sizeof(float));
        memcpy(whole, zt_bert_grads(m), P * sizeof(float));
        for (int ck = 0; ck < 2; ck++) {
            float l2 = 0;
            run_per_block(m, &x, ck, &l2, blocks);
            assert_memory_equal(&loss, &l2, sizeof loss);
            for (size_t i = 0; i < P; i++)
                if (memcmp(&whole[i], &blocks[i], sizeof(float)) != 0)
                    fail_msg("model %d, %s: gradient %zu differs (%.9g vs %.9g)", k,
                             ck ? "checkpointed" : "per block", i, whole[i], blocks[i]);
        }
        /* gradients are not all zero anywhere: every tensor carries gradient */
        for (int i = 0; i < zt_bert_num_tensors(m); i++) {
            const zt_param_info *t = zt_bert_tensor(m, i);
            double s = 0;
            for (size_t j = 0; j < t->numel; j++)
                s += fabs(whole[t->offset + j]);
            if (!(s > 0))
                fail_msg("model %d: %s has no gradient", k, t->name);
        }
        free(whole);
        free(blocks);
        zt_bert_destroy(m);
    }
}

/* The training engine (one rank, on the CPU) drives zt_bert_model_cpu to the same loss and gradients as the
 * host model, for both heads (head block 0 and L+1), with checkpointed layers. */
static void test_engine_cpu(void **state)
{
    (void)state;
    const int pads[2] = {1, 3};
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        zt_bert *m = create_model(&c, 2, 6, 3);
        randomise_params(m, 200 + k, 0.3);
        const batch x = make_batch(&c, 2, 6, pads, 30 + k);
        const size_t P = zt_bert_num_params(m);
        zt_bert_zero_grad(m);
        const float loss = forward_batch(m, &x);
        int correct = 0, counted = 0;
        zt_bert_accuracy(m, &correct, &counted);
        zt_bert_backward(m, 1.0f);
        float *want = malloc(P * sizeof(float)), *got = malloc(P * sizeof(float));
        memcpy(want, zt_bert_grads(m), P * sizeof(float));

        zt_err err = {{0}};
        zt_comm_options co;
        zt_comm_options_init(&co);
        co.backend = ZT_COMM_SELF;
        zt_comm *comm = NULL;
        if (zt_comm_create(&comm, &co, &err) < 0)
            fail_msg("%s", err.msg);
        const bool ck[2] = {true, false};
        zt_model *model = NULL;
        assert_int_equal(zt_bert_model_cpu(&model, m, 1, ck, &err), 0);
        assert_int_equal(model->head_block, zt_bert_head_block(m));
        zt_engine_options eo;
        zt_engine_options_init(&eo);
        zt_engine *e = NULL;
        if (zt_engine_create(&e, model, comm, &eo, zt_bert_params(m), &err) < 0)
            fail_msg("%s", err.msg);
        zt_bert_set_token_types(m, x.types);
        assert_int_equal(zt_engine_micro(e, x.tokens, x.targets, x.B, x.T, NULL, 0, 1.0f, 1.0f, &err), 0);
        int ec = 0, en = 0;
        model->ops->accuracy(model, 0, &ec, &en);
        assert_int_equal(ec, correct);
        assert_int_equal(en, counted);
        zt_engine_step_result res;
        assert_int_equal(zt_engine_step(e, 1e-3f, 1, &res, &err), 0);
        assert_memory_equal(&res.loss, &loss, sizeof loss);
        assert_int_equal(zt_engine_export_grads(e, got, &err), 0);
        for (size_t i = 0; i < P; i++)
            if (memcmp(&want[i], &got[i], sizeof(float)) != 0)
                fail_msg("model %d: engine gradient %zu is %.9g, the host model's %.9g", k, i, got[i], want[i]);
        zt_engine_destroy(e);
        model->ops->destroy(model);
        zt_comm_destroy(comm);
        free(want);
        free(got);
        zt_bert_destroy(m);
    }
}

/* The loss recomputed in double from the logits of a forward pass (less rounding noise for the finite
 * differences than the float loss). */
static double loss_from_logits(zt_bert *m, const batch *x)
{
    forward_batch(m, x);
    const zt_bert_config *c = zt_bert_get_config(m);
    const bool mlm = c->head == ZT_BERT_HEAD_MLM;
    const int rows = mlm ? x->B * x->T : x->B, K = zt_bert_config_outputs(c);
    const float *logits = zt_bert_logits(m);
    double sum = 0;
    int n = 0;
    for (int r = 0; r < rows; r++) {
        const int at = mlm ? r : r * x->T;
        if (x->targets[at] < 0 || x->tokens[at] == c->pad_token_id)
            continue;
        const float *row = logits + (size_t)r * K;
        double mx = row[0], s = 0;
        for (int j = 1; j < K; j++)
            mx = fmax(mx, row[j]);
        for (int j = 0; j < K; j++)
            s += exp(row[j] - mx);
        sum += mx + log(s) - row[x->targets[at]];
        n++;
    }
    return sum / n;
}

/* Central differences of every tensor (up to 24 entries each) against the backward pass, for both heads of
 * both models, on a padded batch with token types. The float32 forward pass puts ~1e-6 of noise on the loss,
 * so steps are large (eps = 2e-2, and eps / 2 for Richardson's extrapolation, which cancels the eps^2
 * truncation error that perturbing a row every position reads, such as RoBERTa's one token type, makes
 * large): the noise stays near 2e-5 on each quotient. */
static void test_gradient_check(void **state)
{
    (void)state;
    const int pads[2] = {0, 2};
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        const int B = (k & 2) ? 3 : 2, T = 6;
        const int pads3[3] = {0, 2, 1};
        zt_bert *m = create_model(&c, B, T, 4);
        randomise_params(m, 77 + k, 0.3);
        const batch x = make_batch(&c, B, T, B == 3 ? pads3 : pads, 50 + k);
        zt_bert_zero_grad(m);
        const float loss = forward_batch(m, &x);
        const double ref = loss_from_logits(m, &x);
        assert_true(fabs(loss - ref) < 1e-5 * ref);
        forward_batch(m, &x);
        zt_bert_backward(m, 1.0f);
        float *p = zt_bert_params(m);
        const float *g = zt_bert_grads(m);
        const float eps = 2e-2f;
        zt_rng r;
        zt_rng_seed(&r, 123 + k);
        int checked = 0, large = 0;
        double worst_rel = 0, worst_abs = 0;
        for (int i = 0; i < zt_bert_num_tensors(m); i++) {
            const zt_param_info *t = zt_bert_tensor(m, i);
            const int count = t->numel < 24 ? (int)t->numel : 24;
            for (int s = 0; s < count; s++) {
                const size_t j = t->offset + (t->numel <= 24 ? (size_t)s : zt_rng_below(&r, t->numel));
                const float saved = p[j];
                double d[2];
                for (int h = 0; h < 2; h++) {
                    const float step = h ? eps / 2 : eps;
                    p[j] = saved + step;
                    const double lp = loss_from_logits(m, &x);
                    p[j] = saved - step;
                    const double lm = loss_from_logits(m, &x);
                    d[h] = (lp - lm) / ((double)(saved + step) - (double)(saved - step));
                }
                p[j] = saved;
                const double num = (4.0 * d[1] - d[0]) / 3.0; /* Richardson: the eps^2 error cancels */
                const double ana = g[j], diff = fabs(num - ana), mag = fmax(fabs(num), fabs(ana));
                checked++;
                /* 2% of the gradient, plus the forward pass's float rounding (~2e-5 after the division) */
                if (diff > 2e-2 * mag + 6e-5)
                    fail_msg("model %d %s[%zu]: backward %.6g, finite difference %.6g", k, t->name, j - t->offset,
                             ana, num);
                if (mag > 1e-2) {
                    large++;
                    worst_rel = fmax(worst_rel, diff / mag);
                } else {
                    worst_abs = fmax(worst_abs, diff);
                }
            }
        }
        print_message("gradient check %s %s: %d entries, %d with |g| > 1e-2, worst relative error of those %.3g, "
                      "worst absolute error of the others %.3g\n",
                      c.roberta ? "RoBERTa" : "BERT", c.head == ZT_BERT_HEAD_MLM ? "masked LM" : "classification",
                      checked, large, worst_rel, worst_abs);
        zt_bert_destroy(m);
    }
}

/* A padded batch gives each sequence's loss (and logits) as that sequence alone, unpadded, gives them. */
static void test_padding(void **state)
{
    (void)state;
    const int B = 3, T = 8, pads[3] = {0, 3, 6};
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        const bool mlm = c.head == ZT_BERT_HEAD_MLM;
        const int K = zt_bert_config_outputs(&c);
        zt_bert *m = create_model(&c, B, T, 8);
        randomise_params(m, 300 + k, 0.3);
        batch x = make_batch(&c, B, T, pads, 70 + k);
        if (mlm)
            for (int b = 0; b < B; b++) {
                x.targets[b * T] = 1; /* every sequence counts a target */
                x.targets[b * T + T - 1] = 2; /* and one at a padded position, which must not count */
            }
        const float loss = forward_batch(m, &x);
        int correct = 0, counted = 0;
        zt_bert_accuracy(m, &correct, &counted);
        float *padded = malloc((size_t)B * T * K * sizeof(float));
        memcpy(padded, zt_bert_logits(m), (size_t)(mlm ? B * T : B) * K * sizeof(float));
        double sum = 0;
        int n = 0;
        for (int b = 0; b < B; b++) {
            batch one;
            const int len = T - pads[b];
            one.B = 1;
            one.T = len;
            memcpy(one.tokens, x.tokens + b * T, (size_t)len * sizeof(int32_t));
            memcpy(one.types, x.types + b * T, (size_t)len * sizeof(int32_t));
            memcpy(one.targets, x.targets + b * T, (size_t)len * sizeof(int32_t));
            int cnt = 0;
            for (int t = 0; t < len; t++)
                cnt += one.targets[t] >= 0 && (mlm || t == 0);
            const float l1 = forward_batch(m, &one);
            sum += (double)l1 * cnt;
            n += cnt;
            const float *lg = zt_bert_logits(m);
            for (int t = 0; t < (mlm ? len : 1); t++)
                for (int j = 0; j < K; j++) {
                    const float a = padded[((size_t)(mlm ? b * T + t : b)) * K + j], e = lg[(size_t)t * K + j];
                    if (fabsf(a - e) > 2e-5f * fmaxf(1.0f, fabsf(e)))
                        fail_msg("model %d: sequence %d position %d logit %d: padded %.9g, alone %.9g", k, b, t, j, a,
                                 e);
                }
        }
        assert_int_equal(counted, n);
        if (fabs(loss - sum / n) > 1e-5 * fabs(sum / n))
            fail_msg("model %d: padded batch loss %.9g, sequences alone %.9g", k, loss, sum / n);
        free(padded);
        zt_bert_destroy(m);
    }
}

/* Token types change the output; none set means type 0, and a setting applies to one forward pass. */
static void test_token_types(void **state)
{
    (void)state;
    zt_bert_config c = small_config(false, ZT_BERT_HEAD_CLASSIFY);
    zt_bert *m = create_model(&c, 2, 5, 2);
    randomise_params(m, 5, 0.3);
    batch x = make_batch(&c, 2, 5, NULL, 3);
    const float typed = forward_batch(m, &x);
    const float untyped = zt_bert_forward(m, x.tokens, x.targets, 2, 5); /* the setting was used up */
    int32_t zeros[10] = {0};
    zt_bert_set_token_types(m, zeros);
    const float zero_typed = zt_bert_forward(m, x.tokens, x.targets, 2, 5);
    assert_true(typed != untyped);
    assert_memory_equal(&untyped, &zero_typed, sizeof untyped);
    zt_bert_destroy(m);
}

/* ---------------------------------------------------------------------------------------------------- */
/* export and import                                                                                    */
/* ---------------------------------------------------------------------------------------------------- */

static void test_export_import_roundtrip(void **state)
{
    (void)state;
    char path[300];
    path_in_dir(path, sizeof path, "model.safetensors");
    for (int k = 0; k < 4; k++) {
        zt_bert_config c = small_config(k & 1, (k & 2) ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM);
        zt_bert *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
        randomise_params(a, 9, 0.5);
        zt_err err = {{0}};
        assert_int_equal(zt_bert_export(a, path, &err), 0);
        /* the file holds Hugging Face's names, F32, and no tied decoder */
        zt_st_file *f = NULL;
        assert_int_equal(zt_st_open(path, &f, &err), 0);
        assert_int_equal((int)zt_st_count(f), zt_bert_num_tensors(a));
        assert_string_equal(zt_st_metadata(f, "format"), "pt");
        assert_non_null(zt_st_find(f, c.roberta ? "roberta.encoder.layer.1.output.LayerNorm.bias"
                                                : "bert.encoder.layer.1.output.LayerNorm.bias"));
        assert_null(zt_st_find(f, "cls.predictions.decoder.weight"));
        zt_st_close(f);
        if (zt_bert_import(b, path, &err) != 0)
            fail_msg("%s", err.msg);
        assert_memory_equal(zt_bert_params(a), zt_bert_params(b), zt_bert_num_params(a) * sizeof(float));
        /* the directory form finds model.safetensors */
        zt_bert *d = create_model(&c, 1, 4, 3);
        assert_int_equal(zt_bert_import(d, g_dir, &err), 0);
        assert_memory_equal(zt_bert_params(a), zt_bert_params(d), zt_bert_num_params(a) * sizeof(float));
        zt_bert_destroy(a);
        zt_bert_destroy(b);
        zt_bert_destroy(d);
    }
}

/* Writes the model's tensors to path with the safetensors writer, renaming, reshaping, retyping, dropping
 * or adding one tensor as told. */
typedef struct edit {
    const char *drop;        /* a tensor left out */
    const char *rename_from, *rename_to;
    const char *reshape;     /* written with one row too many */
    const char *extra;       /* an added tensor of 4 floats */
    const char *as_i32;      /* written as I32 */
    const char *tied_name;   /* the decoder written with ... */
    bool tied_differs;       /* ... values that are not the word embeddings' */
} edit;

static void write_edited(const zt_bert *m, const char *path, const edit *e)
{
    zt_st_writer *w = zt_st_writer_create();
    zt_err err = {{0}};
    const float *p = zt_bert_params((zt_bert *)m);
    static float junk[1 << 16];
    static float four[4] = {1, 2, 3, 4};
    for (int i = 0; i < zt_bert_num_tensors(m); i++) {
        const zt_param_info *t = zt_bert_tensor(m, i);
        if (e->drop && strcmp(e->drop, t->name) == 0)
            continue;
        const char *name = e->rename_from && strcmp(e->rename_from, t->name) == 0 ? e->rename_to : t->name;
        int64_t shape[2] = {t->shape[0], t->shape[1]};
        const void *data = p + t->offset;
        enum zt_dtype dt = ZT_DTYPE_F32;
        if (e->reshape && strcmp(e->reshape, t->name) == 0) {
            shape[0]++;
            data = junk;
        }
        if (e->as_i32 && strcmp(e->as_i32, t->name) == 0)
            dt = ZT_DTYPE_I32;
        assert_int_equal(zt_st_writer_add(w, name, dt, t->ndim, shape, data, &err), 0);
    }
    if (e->extra) {
        const int64_t shape[1] = {4};
        assert_int_equal(zt_st_writer_add(w, e->extra, ZT_DTYPE_F32, 1, shape, four, &err), 0);
    }
    if (e->tied_name) {
        const zt_param_info *t = zt_bert_tensor(m, 0);
        float *copy = malloc(t->numel * sizeof(float));
        memcpy(copy, p + t->offset, t->numel * sizeof(float));
        if (e->tied_differs)
            copy[7] += 1.0f;
        assert_int_equal(zt_st_writer_add(w, e->tied_name, ZT_DTYPE_F32, 2, t->shape, copy, &err), 0);
        assert_int_equal(zt_st_writer_write(w, path, &err), 0);
        free(copy);
    } else {
        assert_int_equal(zt_st_writer_write(w, path, &err), 0);
    }
    zt_st_writer_destroy(w);
}

static void test_import_errors_leave_model_unchanged(void **state)
{
    (void)state;
    char path[300];
    path_in_dir(path, sizeof path, "bad.safetensors");
    zt_bert_config c = small_config(false, ZT_BERT_HEAD_MLM);
    zt_bert *src = create_model(&c, 1, 4, 1), *m = create_model(&c, 1, 4, 2);
    randomise_params(src, 3, 0.5);
    const size_t bytes = zt_bert_num_params(m) * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, zt_bert_params(m), bytes);
    static const struct {
        edit e;
        int code;
        const char *needle;
    } cases[] = {
        {{.drop = "bert.encoder.layer.1.attention.self.value.bias"}, ZT_EMISMATCH,
         "'bert.encoder.layer.1.attention.self.value.bias' is missing"},
        {{.drop = "cls.predictions.bias"}, ZT_EMISMATCH, "'cls.predictions.bias' is missing"},
        {{.extra = "bert.encoder.layer.2.output.dense.bias"}, ZT_EMISMATCH,
         "unknown tensor 'bert.encoder.layer.2.output.dense.bias'"},
        {{.extra = "bert.pooler.dense.bias"}, ZT_EMISMATCH, "unknown tensor 'bert.pooler.dense.bias'"},
        {{.reshape = "bert.embeddings.token_type_embeddings.weight"}, ZT_EMISMATCH,
         "'bert.embeddings.token_type_embeddings.weight' has shape [4, 12]"},
        {{.as_i32 = "bert.embeddings.LayerNorm.bias"}, ZT_EUNSUPPORTED, "dtype I32"},
        {{.rename_from = "bert.encoder.layer.0.output.dense.weight", .rename_to = "encoder.layer.0.output.dense.weight",
          .extra = "bert.encoder.layer.0.output.dense.weight"},
         ZT_EMISMATCH, "appears twice"},
        {{.tied_name = "cls.predictions.decoder.weight", .tied_differs = true}, ZT_EMISMATCH,
         "'cls.predictions.decoder.weight' differs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_edited(src, path, &cases[i].e);
        zt_err err = {{0}};
        const int rc = zt_bert_import(m, path, &err);
        if (rc != cases[i].code || !strstr(err.msg, cases[i].needle) || !strstr(err.msg, "bad.safetensors"))
            fail_msg("case %zu: rc %d, message '%s' (expected %d and '%s' with the file)", i, rc, err.msg,
                     cases[i].code, cases[i].needle);
        assert_memory_equal(zt_bert_params(m), before, bytes);
    }
    /* accepted: the tied decoder equal to the word embeddings, a name without the "bert." prefix */
    const edit ok[] = {{.tied_name = "cls.predictions.decoder.weight"},
                       {.rename_from = "bert.embeddings.LayerNorm.weight", .rename_to = "embeddings.LayerNorm.gamma"}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        write_edited(src, path, &ok[i]);
        zt_err err = {{0}};
        if (zt_bert_import(m, path, &err) != 0)
            fail_msg("accepted case %zu: %s", i, err.msg);
        assert_memory_equal(zt_bert_params(m), zt_bert_params(src), bytes);
    }
    /* a classifier refuses a masked-LM file, naming the head's tensor */
    zt_bert_config cc = small_config(false, ZT_BERT_HEAD_CLASSIFY);
    zt_bert *cls = create_model(&cc, 1, 4, 2);
    write_edited(src, path, &(edit){0});
    zt_err err = {{0}};
    assert_int_equal(zt_bert_import(cls, path, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "cls.predictions"));
    zt_bert_destroy(cls);
    free(before);
    zt_bert_destroy(src);
    zt_bert_destroy(m);
}

/* Fine-tuning from a pretrained checkpoint: a masked-LM file into a classifier and back. The body comes from
 * the file, the head the file lacks keeps its initial values, the other head's tensors are skipped; the
 * body must still be complete. */
static void test_import_pretrained(void **state)
{
    (void)state;
    char path[300];
    path_in_dir(path, sizeof path, "model.safetensors");
    for (int roberta = 0; roberta < 2; roberta++) {
        zt_bert_config mc = small_config(roberta, ZT_BERT_HEAD_MLM), cc = small_config(roberta, ZT_BERT_HEAD_CLASSIFY);
        zt_bert *mlm = create_model(&mc, 1, 4, 1), *cls = create_model(&cc, 1, 4, 2);
        randomise_params(mlm, 4, 0.5);
        zt_err err = {{0}};
        const size_t body = zt_bert_block(cls, cc.num_hidden_layers + 1)->offset; /* blocks 0..L */
        const size_t head = zt_bert_num_params(cls) - body;
        float *head_before = malloc(head * sizeof(float));
        memcpy(head_before, zt_bert_params(cls) + body, head * sizeof(float));
        assert_int_equal(zt_bert_export(mlm, path, &err), 0);
        assert_int_equal(zt_bert_import(cls, path, &err), ZT_EMISMATCH); /* the strict import refuses */
        if (zt_bert_import_pretrained(cls, path, &err) != 0)
            fail_msg("%s", err.msg);
        assert_memory_equal(zt_bert_params(cls), zt_bert_params(mlm), body * sizeof(float));
        assert_memory_equal(zt_bert_params(cls) + body, head_before, head * sizeof(float));
        /* and back: the classifier's pooler and classifier are skipped, the masked-LM head is kept */
        randomise_params(cls, 6, 0.5);
        const size_t mbody = zt_bert_block(mlm, mc.num_hidden_layers + 1)->offset;
        float *mhead = malloc((zt_bert_num_params(mlm) - mbody) * sizeof(float));
        memcpy(mhead, zt_bert_params(mlm) + mbody, (zt_bert_num_params(mlm) - mbody) * sizeof(float));
        assert_int_equal(zt_bert_export(cls, path, &err), 0);
        assert_int_equal(zt_bert_import_pretrained(mlm, path, &err), 0);
        assert_memory_equal(zt_bert_params(mlm), zt_bert_params(cls), mbody * sizeof(float));
        assert_memory_equal(zt_bert_params(mlm) + mbody, mhead, (zt_bert_num_params(mlm) - mbody) * sizeof(float));
        /* a body tensor missing is still an error */
        char name[96];
        snprintf(name, sizeof name, "%sencoder.layer.0.intermediate.dense.bias", roberta ? "roberta." : "bert.");
        write_edited(mlm, path, &(edit){.drop = name});
        assert_int_equal(zt_bert_import_pretrained(cls, path, &err), ZT_EMISMATCH);
        assert_non_null(strstr(err.msg, name));
        free(head_before);
        free(mhead);
        zt_bert_destroy(mlm);
        zt_bert_destroy(cls);
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* masking                                                                                              */
/* ---------------------------------------------------------------------------------------------------- */

/* zt_task_mask_tokens: 15% of the non-special tokens chosen; of those 80% masked, 10% random, 10% kept
 * (each within 5 standard deviations); special tokens never chosen; targets hold the original tokens. */
static void test_mask_tokens(void **state)
{
    (void)state;
    enum { n = 200000, V = 1000, MASK = 103 };
    const int32_t special[3] = {0, 101, 102}; /* PAD, CLS, SEP */
    int32_t *orig = malloc(n * sizeof(int32_t)), *tok = malloc(n * sizeof(int32_t));
    int32_t *tgt = malloc(n * sizeof(int32_t)), *tok2 = malloc(n * sizeof(int32_t));
    int32_t *tgt2 = malloc(n * sizeof(int32_t));
    zt_rng r;
    zt_rng_seed(&r, 1);
    for (int i = 0; i < n; i++)
        orig[i] = i % 10 == 0 ? special[i % 3] : (int32_t)(104 + zt_rng_below(&r, V - 104));
    memcpy(tok, orig, n * sizeof(int32_t));
    memcpy(tok2, orig, n * sizeof(int32_t));
    zt_rng_seed(&r, 42);
    const size_t chosen = zt_task_mask_tokens(tok, tgt, n, MASK, V, special, 3, &r, 0.15f);
    zt_rng_seed(&r, 42);
    assert_int_equal(zt_task_mask_tokens(tok2, tgt2, n, MASK, V, special, 3, &r, 0.15f), chosen);
    assert_memory_equal(tok, tok2, n * sizeof(int32_t));
    assert_memory_equal(tgt, tgt2, n * sizeof(int32_t));
    size_t eligible = 0, masked = 0, kept = 0, replaced = 0, counted = 0;
    for (int i = 0; i < n; i++) {
        const bool sp = orig[i] == 0 || orig[i] == 101 || orig[i] == 102;
        eligible += !sp;
        if (tgt[i] == -1) {
            assert_int_equal(tok[i], orig[i]);
            continue;
        }
        assert_false(sp);
        assert_int_equal(tgt[i], orig[i]);
        counted++;
        if (tok[i] == MASK)
            masked++;
        else if (tok[i] == orig[i])
            kept++;
        else
            replaced++;
        assert_true(tok[i] >= 0 && tok[i] < V);
    }
    assert_int_equal(counted, chosen);
    /* within 5 standard deviations of the binomial means */
    const double pc = 0.15, sd_c = sqrt(eligible * pc * (1 - pc));
    if (fabs((double)chosen - eligible * pc) > 5 * sd_c)
        fail_msg("chose %zu of %zu, expected %.0f +- %.0f", chosen, eligible, eligible * pc, 5 * sd_c);
    const struct {
        const char *what;
        size_t got;
        double p;
    } parts[] = {{"masked", masked, 0.8}, {"replaced", replaced, 0.1 * (1 - 1.0 / V)}, {"kept", kept, 0.1 + 0.1 / V}};
    for (int k = 0; k < 3; k++) {
        const double mean = chosen * parts[k].p, sd = sqrt(chosen * parts[k].p * (1 - parts[k].p));
        if (fabs((double)parts[k].got - mean) > 5 * sd)
            fail_msg("%s %zu of %zu, expected %.0f +- %.0f", parts[k].what, parts[k].got, chosen, mean, 5 * sd);
    }
    print_message("masking: %zu of %zu chosen; %zu masked, %zu replaced, %zu kept\n", chosen, eligible, masked,
                  replaced, kept);
    free(orig);
    free(tok);
    free(tgt);
    free(tok2);
    free(tgt2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_hf_files),
        cmocka_unit_test(test_config_odd_sizes),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_config_model_type_defaults),
        cmocka_unit_test_setup_teardown(test_config_save_load, make_dir, remove_dir),
        cmocka_unit_test(test_num_params),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_per_block_equals_whole),
        cmocka_unit_test(test_engine_cpu),
        cmocka_unit_test(test_gradient_check),
        cmocka_unit_test(test_padding),
        cmocka_unit_test(test_token_types),
        cmocka_unit_test_setup_teardown(test_export_import_roundtrip, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_errors_leave_model_unchanged, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_pretrained, make_dir, remove_dir),
        cmocka_unit_test(test_mask_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
