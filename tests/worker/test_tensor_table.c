/* The tensor table as data (worker/models/tensor_table.h): a small table's layout, parameter count,
 * initialisation and roles, and how the families' tables meet Hugging Face names. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "worker/models/decoder.h"
#include "worker/models/family.h"
#include "worker/models/host_io.h"
#include "worker/models/host_model.h"
#include "worker/models/tensor_table.h"

/* ---- a small table of its own ---- */

typedef struct {
    int layers, width, vocab;
    bool bias, tied;
    int pad;
} toy_config;

enum { D_C = 1, D_2C, D_V };
enum { BIAS = 1u, TIED = 2u };

#define R(part, name, d0, d1, init, role, ...) {ZT__TT(part, name, d0, d1, init, role), __VA_ARGS__}
static const zt__tt_row rows[] = {
    R(EMBED, "emb.weight", D_V, D_C, NORMAL_PAD, ZT__TT_NO_ROLE, .split = ZT_TP_ROWS),
    R(LAYER, "norm.weight", D_C, 0, ONE, ZT__DEC_LN1_W),
    R(LAYER, "up.weight", D_2C, D_C, NORMAL, ZT__DEC_UP_W, .split = ZT_TP_ROWS),
    R(LAYER, "gate.weight", D_2C, D_C, NORMAL, ZT__TT_NO_ROLE, .packed = true),
    R(LAYER, "up.bias", D_2C, 0, ZERO, ZT__DEC_UP_B, .when = BIAS),
    R(LAYER, "down.weight", D_C, D_2C, NORMAL_RESIDUAL, ZT__DEC_DOWN_W, .split = ZT_TP_COLS),
    R(FINAL, "final.weight", D_C, 0, ONE, ZT__TT_NO_ROLE),
    R(FINAL, "head.weight", D_V, D_C, NORMAL, ZT__TT_NO_ROLE, .unless = TIED, .bare_in_hf = true),
};
#undef R

static void dims(const void *cv, zt__tt_dims *d)
{
    const toy_config *c = cv;
    *d = (zt__tt_dims){.layers = c->layers, .std = 0.5, .pad_row = c->pad,
                       .flags = (c->bias ? BIAS : 0) | (c->tied ? TIED : 0),
                       .d = {[D_C] = c->width, [D_2C] = 2 * c->width, [D_V] = c->vocab}};
}

static const zt__tt toy = {.rows = rows, .nrows = 8, .layer_prefix = "blocks.%d.", .dims = dims, .hf_prefix = "m."};

static void test_layout_and_count(void **state)
{
    (void)state;
    const toy_config cases[] = {{3, 4, 10, true, false, 2}, {2, 6, 7, false, true, -1}, {1, 2, 3, true, true, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const toy_config *c = &cases[k];
        const int n = zt__tt_count(&toy, c);
        assert_int_equal(n, 1 + c->layers * (c->bias ? 5 : 4) + 1 + (c->tied ? 0 : 1));
        zt_param_info *t = calloc((size_t)n, sizeof *t);
        zt_block_info *b = calloc((size_t)c->layers + 2, sizeof *b);
        const size_t total = zt__tt_layout(&toy, c, t, b);
        assert_int_equal(total, zt__tt_num_params(&toy, c));
        /* tensors follow each other in slab order, blocks cover them exactly */
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            assert_int_equal(t[i].offset, off);
            off += t[i].numel;
            assert_true(t[i].offset >= b[t[i].block].offset);
            assert_true(t[i].offset + t[i].numel <= b[t[i].block].offset + b[t[i].block].numel);
        }
        assert_int_equal(off, total);
        size_t covered = 0;
        for (int i = 0; i < c->layers + 2; i++) {
            assert_int_equal(b[i].offset, covered);
            covered += b[i].numel;
        }
        assert_int_equal(covered, total);
        assert_string_equal(t[1].name, "blocks.0.norm.weight");
        assert_int_equal(t[1].block, 1);
        assert_false(t[1].weight_decay);
        assert_true(t[2].weight_decay);
        assert_int_equal(t[2].shape[0], 2 * c->width);
        assert_int_equal(t[2].tp_split, ZT_TP_ROWS);
        const int down = 1 + (c->bias ? 4 : 3);
        assert_string_equal(t[down].name, "blocks.0.down.weight");
        assert_int_equal(t[down].tp_split, ZT_TP_COLS);
        assert_string_equal(t[n - 1].name, c->tied ? "final.weight" : "head.weight");
        assert_int_equal(t[n - 1].block, c->layers + 1);

        /* roles: indices within a layer, absent rows left out */
        int role[ZT__DEC_ROLES];
        bool packed[8] = {false};
        assert_int_equal(zt__tt_layer_roles(&toy, c, role, ZT__DEC_ROLES, packed), c->bias ? 5 : 4);
        assert_int_equal(role[ZT__DEC_LN1_W], 0);
        assert_int_equal(role[ZT__DEC_UP_W], 1);
        assert_true(packed[2] && !packed[1]);
        assert_int_equal(role[ZT__DEC_UP_B], c->bias ? 3 : -1);
        assert_int_equal(role[ZT__DEC_DOWN_W], c->bias ? 4 : 3);
        assert_int_equal(role[ZT__DEC_QKV_W], -1);

        /* initialisation: ones, zeros, the padding row, the residual scaling; deterministic */
        float *p = malloc(total * sizeof *p), *q = malloc(total * sizeof *q);
        zt__tt_init(&toy, c, t, n, p, 7);
        zt__tt_init(&toy, c, t, n, q, 7);
        assert_memory_equal(p, q, total * sizeof *p);
        for (size_t j = 0; j < t[1].numel; j++)
            assert_true(p[t[1].offset + j] == 1.0f);
        if (c->bias)
            for (size_t j = 0; j < t[4].numel; j++)
                assert_true(p[t[4].offset + j] == 0.0f);
        for (int r = 0; r < c->vocab; r++) {
            bool zero = true;
            for (int j = 0; j < c->width; j++)
                zero = zero && p[t[0].offset + (size_t)r * c->width + j] == 0.0f;
            assert_int_equal(zero, r == c->pad);
        }
        double s_up = 0, s_down = 0;
        for (size_t j = 0; j < t[2].numel; j++)
            s_up += (double)p[t[2].offset + j] * p[t[2].offset + j];
        for (size_t j = 0; j < t[down].numel; j++)
            s_down += (double)p[t[down].offset + j] * p[t[down].offset + j];
        assert_true(s_up > 0 && s_down > 0);
        /* a different seed gives different weights */
        zt__tt_init(&toy, c, t, n, q, 8);
        assert_true(memcmp(p, q, total * sizeof *p) != 0);
        free(p);
        free(q);
        free(t);
        free(b);
    }
}

/* The residual rows draw normal(0, std / sqrt(2 L)): on a large tensor the sample deviation is close. */
static void test_residual_scale(void **state)
{
    (void)state;
    const toy_config c = {8, 64, 5, false, true, -1};
    const int n = zt__tt_count(&toy, &c);
    zt_param_info *t = calloc((size_t)n, sizeof *t);
    zt_block_info *b = calloc((size_t)c.layers + 2, sizeof *b);
    const size_t total = zt__tt_layout(&toy, &c, t, b);
    float *p = malloc(total * sizeof *p);
    zt__tt_init(&toy, &c, t, n, p, 1);
    double s = 0, su = 0;
    const zt_param_info *down = &t[1 + 3], *up = &t[1 + 1];
    for (size_t j = 0; j < down->numel; j++)
        s += (double)p[down->offset + j] * p[down->offset + j];
    for (size_t j = 0; j < up->numel; j++)
        su += (double)p[up->offset + j] * p[up->offset + j];
    assert_true(fabs(sqrt(s / (double)down->numel) - 0.5 / sqrt(16.0)) < 0.01);
    assert_true(fabs(sqrt(su / (double)up->numel) - 0.5) < 0.03);
    free(p);
    free(t);
    free(b);
}

/* ---- the families' tables and Hugging Face names ---- */

static void *layout_of(const char *json, const zt_family_def **def)
{
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    zt_family_config c;
    zt_err err = {0};
    assert_int_equal(zt_family_config_from_json(&c, o, "test", &err), 0);
    cJSON_Delete(o);
    void *m = NULL;
    *def = c.def;
    assert_int_equal(zt__hm_create_layout((zt__hm **)&m, c.def->host, c.body, &err), 0);
    return m;
}

static enum zt_hf_kind map(const zt_family_def *def, void *m, const char *name, const char **tname)
{
    int idx = -1;
    const enum zt_hf_kind k = def->hf->map(m, name, &idx);
    *tname = (k == ZT_HF_PARAM || k == ZT_HF_TIED) && idx >= 0 ? def->tensor(m, idx)->name : NULL;
    return k;
}

static void expect(const zt_family_def *def, void *m, const char *file_name, enum zt_hf_kind kind, const char *tname)
{
    const char *got = NULL;
    const enum zt_hf_kind k = map(def, m, file_name, &got);
    if (k != kind)
        fail_msg("%s: kind %d, expected %d", file_name, (int)k, (int)kind);
    if (tname)
        assert_string_equal(got, tname);
}

/* Every tensor's export name maps back onto it. */
static void round_trip(const zt_family_def *def, void *m)
{
    for (int i = 0; i < def->num_tensors(m); i++) {
        char name[200];
        def->hf->export_name(m, def->tensor(m, i), name, sizeof name);
        int idx = -1;
        assert_int_equal(def->hf->map(m, name, &idx), ZT_HF_PARAM);
        assert_int_equal(idx, i);
    }
}

static void test_llama_names(void **state)
{
    (void)state;
    const zt_family_def *def;
    void *m = layout_of("{\"model_type\": \"llama\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                        "\"vocab_size\": 50, \"tie_word_embeddings\": false}", &def);
    round_trip(def, m);
    expect(def, m, "model.layers.1.mlp.up_proj.weight", ZT_HF_PARAM, "layers.1.mlp.up_proj.weight");
    expect(def, m, "layers.1.mlp.up_proj.weight", ZT_HF_PARAM, "layers.1.mlp.up_proj.weight");
    expect(def, m, "lm_head.weight", ZT_HF_PARAM, "lm_head.weight");
    expect(def, m, "model.lm_head.weight", ZT_HF_UNKNOWN, NULL); /* the head never has the prefix */
    expect(def, m, "model.layers.0.self_attn.rotary_emb.inv_freq", ZT_HF_BUFFER, NULL);
    expect(def, m, "model.layers.2.mlp.up_proj.weight", ZT_HF_UNKNOWN, NULL);
    char name[200];
    def->hf->export_name(m, def->tensor(m, def->num_tensors(m) - 1), name, sizeof name);
    assert_string_equal(name, "lm_head.weight");
    def->hf->describe(m, name, sizeof name);
    assert_string_equal(name, "a LLaMA with 2 layers and an untied head (tie_word_embeddings false)");
    def->destroy(m);
    m = layout_of("{\"model_type\": \"qwen2\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                  "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                  "\"vocab_size\": 50, \"tie_word_embeddings\": true}", &def);
    round_trip(def, m);
    expect(def, m, "lm_head.weight", ZT_HF_TIED, "embed_tokens.weight");
    expect(def, m, "model.layers.0.self_attn.k_proj.bias", ZT_HF_PARAM, "layers.0.self_attn.k_proj.bias");
    assert_int_equal(def->tensor(m, 0)->tp_split, ZT_TP_ROWS);
    def->destroy(m);
}

static void test_neox_names(void **state)
{
    (void)state;
    const zt_family_def *def;
    void *m = layout_of("{\"model_type\": \"gpt_neox\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 50, "
                        "\"rotary_pct\": 0.5, \"tie_word_embeddings\": false}", &def);
    round_trip(def, m);
    expect(def, m, "embed_out.weight", ZT_HF_PARAM, "embed_out.weight");
    expect(def, m, "lm_head.weight", ZT_HF_PARAM, "embed_out.weight"); /* transformers 5's name */
    expect(def, m, "gpt_neox.layers.0.attention.bias", ZT_HF_BUFFER, NULL);
    expect(def, m, "gpt_neox.layers.0.attention.dense.bias", ZT_HF_PARAM, "layers.0.attention.dense.bias");
    def->destroy(m);
    m = layout_of("{\"model_type\": \"gpt_neox\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                  "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 50, \"rotary_pct\": 0.5, "
                  "\"tie_word_embeddings\": true, \"attention_bias\": false}", &def);
    round_trip(def, m);
    expect(def, m, "embed_out.weight", ZT_HF_TIED, "embed_in.weight");
    expect(def, m, "lm_head.weight", ZT_HF_TIED, "embed_in.weight");
    expect(def, m, "gpt_neox.layers.0.attention.dense.bias", ZT_HF_UNKNOWN, NULL);
    def->destroy(m);
}

static void test_bert_names(void **state)
{
    (void)state;
    const zt_family_def *def;
    void *m = layout_of("{\"model_type\": \"bert\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 50, "
                        "\"max_position_embeddings\": 32, \"architectures\": [\"BertForMaskedLM\"]}", &def);
    round_trip(def, m);
    expect(def, m, "embeddings.word_embeddings.weight", ZT_HF_PARAM, "bert.embeddings.word_embeddings.weight");
    expect(def, m, "bert.encoder.layer.1.output.LayerNorm.gamma", ZT_HF_PARAM,
           "bert.encoder.layer.1.output.LayerNorm.weight");
    expect(def, m, "cls.predictions.decoder.weight", ZT_HF_TIED, "bert.embeddings.word_embeddings.weight");
    expect(def, m, "cls.predictions.decoder.bias", ZT_HF_TIED, "cls.predictions.bias");
    expect(def, m, "bert.embeddings.position_ids", ZT_HF_BUFFER, NULL);
    expect(def, m, "bert.pooler.dense.weight", ZT_HF_OTHER_HEAD, NULL);
    expect(def, m, "cls.seq_relationship.weight", ZT_HF_OTHER_HEAD, NULL);
    expect(def, m, "bert.encoder.layer.2.output.dense.weight", ZT_HF_UNKNOWN, NULL);
    def->destroy(m);
    m = layout_of("{\"model_type\": \"roberta\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                  "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 50, "
                  "\"max_position_embeddings\": 34, \"num_labels\": 3, "
                  "\"architectures\": [\"RobertaForSequenceClassification\"]}", &def);
    round_trip(def, m);
    expect(def, m, "classifier.out_proj.weight", ZT_HF_PARAM, "classifier.out_proj.weight");
    expect(def, m, "lm_head.dense.weight", ZT_HF_OTHER_HEAD, NULL);
    assert_int_equal(def->tensor(m, def->num_tensors(m) - 2)->shape[0], 3);
    def->destroy(m);
}

static void test_gpt2_names(void **state)
{
    (void)state;
    const zt_family_def *def;
    void *m = layout_of("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, "
                        "\"n_positions\": 16, \"vocab_size\": 40}", &def);
    round_trip(def, m);
    expect(def, m, "lm_head.weight", ZT_HF_TIED, "wte.weight");
    expect(def, m, "h.1.attn.bias", ZT_HF_BUFFER, NULL);
    expect(def, m, "transformer.h.1.attn.masked_bias", ZT_HF_BUFFER, NULL);
    expect(def, m, "transformer.h.1.attn.c_attn.bias", ZT_HF_PARAM, "h.1.attn.c_attn.bias");
    assert_true(def->tensor(m, 4)->transposed_in_hf); /* h.0.attn.c_attn.weight, a Conv1D */
    def->destroy(m);
}

/* Two stacks (T5): blocks 1..Le the encoder's, Le+1..Le+Ld the decoder's; the bias table in each stack's
 * first layer, the encoder's final norm in its last layer's block. */
static void test_t5_names(void **state)
{
    (void)state;
    const zt_family_def *def;
    void *m = layout_of("{\"model_type\": \"t5\", \"vocab_size\": 40, \"d_model\": 16, \"d_kv\": 4, \"d_ff\": 24, "
                        "\"num_layers\": 2, \"num_decoder_layers\": 3, \"num_heads\": 2, "
                        "\"feed_forward_proj\": \"gated-gelu\", \"tie_word_embeddings\": false}", &def);
    round_trip(def, m);
    assert_int_equal(def->num_blocks(m), 2 + 3 + 2);
    const int n = def->num_tensors(m);
    int bias_blocks = 0;
    for (int i = 0; i < n; i++) {
        const zt_param_info *t = def->tensor(m, i);
        if (strstr(t->name, "relative_attention_bias")) {
            assert_true(strstr(t->name, ".block.0.") != NULL);
            bias_blocks |= 1 << t->block;
        }
        if (strcmp(t->name, "encoder.final_layer_norm.weight") == 0)
            assert_int_equal(t->block, 2);
        if (strncmp(t->name, "decoder.block.2.", 16) == 0)
            assert_int_equal(t->block, 5);
    }
    assert_int_equal(bias_blocks, (1 << 1) | (1 << 3));
    assert_string_equal(def->tensor(m, n - 1)->name, "lm_head.weight");
    assert_int_equal(def->tensor(m, n - 1)->block, 6);
    expect(def, m, "encoder.embed_tokens.weight", ZT_HF_TIED, "shared.weight");
    expect(def, m, "lm_head.weight", ZT_HF_PARAM, "lm_head.weight");
    expect(def, m, "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", ZT_HF_BUFFER, NULL);
    expect(def, m, "decoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight", ZT_HF_UNKNOWN, NULL);
    expect(def, m, "decoder.block.2.layer.2.DenseReluDense.wi_1.weight", ZT_HF_PARAM,
           "decoder.block.2.layer.2.DenseReluDense.wi_1.weight");
    def->destroy(m);
}

/* A lazily created model filled block by block, in one call or in several, holds the bits of the one initialised
 * at once, for every family; a tensor's values asked before its block is filled are those bits too. */
static void test_lazy_init(void **state)
{
    (void)state;
    static const char *const configs[] = {
        "{\"model_type\": \"gpt2\", \"n_layer\": 3, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, "
        "\"vocab_size\": 40}",
        "{\"model_type\": \"llama\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 50, \"tie_word_embeddings\": false}",
        "{\"model_type\": \"gpt_neox\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 2, \"vocab_size\": 50, \"max_position_embeddings\": 32}",
        "{\"model_type\": \"roberta\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 4, \"vocab_size\": 50, \"max_position_embeddings\": 40}",
        "{\"model_type\": \"t5\", \"vocab_size\": 40, \"d_model\": 16, \"d_kv\": 4, \"d_ff\": 24, \"num_layers\": 2, "
        "\"num_decoder_layers\": 3, \"num_heads\": 2}",
    };
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        cJSON *o = cJSON_Parse(configs[k]);
        assert_non_null(o);
        zt_family_config c;
        zt_err err = {0};
        if (zt_family_config_from_json(&c, o, "test", &err) < 0)
            fail_msg("%s: %s", configs[k], err.msg);
        cJSON_Delete(o);
        zt_family_model *eager, *steps, *once;
        assert_int_equal(zt_family_model_create(&eager, &c, 1, 4, 11, &err), 0);
        assert_int_equal(zt_family_model_create_lazy(&steps, &c, 1, 4, 11, &err), 0);
        assert_int_equal(zt_family_model_create_lazy(&once, &c, 1, 4, 11, &err), 0);
        int nb = 0;
        for (int i = 0; i < zt_family_model_num_tensors(eager); i++)
            nb = zt_family_model_tensor(eager, i)->block + 1 > nb ? zt_family_model_tensor(eager, i)->block + 1 : nb;
        /* lazy: block 0 filled leaves the next block's tensors as they were (a marker here) */
        float *sp = zt_family_model_params(steps);
        const size_t total = zt_family_model_num_params(eager);
        for (size_t j = 0; j < total; j++)
            sp[j] = -7.0f;
        zt_family_model_init_through(steps, 0);
        for (int i = 0; i < zt_family_model_num_tensors(eager); i++) {
            const zt_param_info *t = zt_family_model_tensor(eager, i);
            if (t->block == 1)
                assert_true(sp[t->offset] == -7.0f && sp[t->offset + t->numel - 1] == -7.0f);
        }
        /* a tensor's values before its block is filled are the ones the fill gives it (none filled, block 0) */
        float *vals = malloc(total * sizeof *vals);
        for (int i = 0; i < zt_family_model_num_tensors(eager); i++) {
            const zt_param_info *t = zt_family_model_tensor(eager, i);
            const float *want = zt_family_model_params(eager) + t->offset;
            c.def->tensor_values(zt_family_model_host(once), i, vals);
            assert_memory_equal(vals, want, t->numel * sizeof *vals);
            c.def->tensor_values(zt_family_model_host(steps), i, vals);
            assert_memory_equal(vals, want, t->numel * sizeof *vals);
        }
        free(vals);
        for (int b = 0; b < nb; b++) {
            zt_family_model_init_through(steps, b);
            zt_family_model_init_through(steps, b); /* again: nothing more */
        }
        zt_family_model_init_through(once, nb - 1);
        const size_t bytes = zt_family_model_num_params(eager) * sizeof(float);
        assert_memory_equal(zt_family_model_params(eager), zt_family_model_params(steps), bytes);
        assert_memory_equal(zt_family_model_params(eager), zt_family_model_params(once), bytes);
        zt_family_model_destroy(eager);
        zt_family_model_destroy(steps);
        zt_family_model_destroy(once);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_count), cmocka_unit_test(test_residual_scale),
        cmocka_unit_test(test_llama_names),      cmocka_unit_test(test_neox_names),
        cmocka_unit_test(test_bert_names),       cmocka_unit_test(test_gpt2_names),
        cmocka_unit_test(test_t5_names),         cmocka_unit_test(test_lazy_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
