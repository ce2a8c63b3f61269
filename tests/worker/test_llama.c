/* Tests of the LLaMA model (worker/models/llama.c): config.json parsing (odd sizes, every refused field named,
 * the rope scaling forms of transformers 4.x and 5.x) and writing, the parameter count and layout,
 * initialisation, the per-block passes against the whole-model passes and checkpointed layers against kept
 * ones (bit for bit), a finite-difference check of every tensor, safetensors export/import (round trip,
 * dtypes, tied and untied heads, sharded checkpoints, every refusal leaving the model unchanged), the
 * training engine driving the model with its head in the last block, and a tiny model learning a fixed
 * sequence with plain SGD. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <math.h>

#include "common/rng.h"
#include "common/safetensors.h"
#include "kernels/cpu_threads.h"
#include "worker/comm/comm.h"
#include "worker/engine/engine.h"
#include "worker/models/llama.h"
#include "worker/models/model.h"

#include "model_once.h"

/* ---------------------------------------------------------------------------------------------------- */
/* helpers                                                                                              */
/* ---------------------------------------------------------------------------------------------------- */

static char g_dir[256]; /* a temporary folder for the files of one test */

static int make_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zt_test_llama_XXXXXX");
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

/* Parses text and runs zt_llama_config_from_json on a default config; returns its code. */
static int parse_config(const char *text, zt_llama_config *cfg, zt_err *err)
{
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    zt_llama_config_default(cfg);
    memset(err, 0, sizeof *err);
    int rc = zt_llama_config_from_json(cfg, obj, "config.json", err);
    cJSON_Delete(obj);
    return rc;
}

/* The odd shape the tests run on: 6 query heads of 4 channels sharing 2 key/value heads (ratio 3), an MLP of
 * 20, 37 tokens, llama3 rope scaling whose wavelengths fall on both sides of the ramp, an untied head. */
static zt_llama_config odd_config(void)
{
    zt_llama_config c;
    zt_llama_config_default(&c);
    c.num_hidden_layers = 2;
    c.hidden_size = 24;
    c.num_attention_heads = 6;
    c.num_key_value_heads = 2;
    c.intermediate_size = 20;
    c.vocab_size = 37;
    c.max_position_embeddings = 16;
    c.rms_norm_eps = 1e-5f;
    c.rope = (zt_rope_config){.theta = 10000.0, .scaling = ZT_ROPE_SCALING_LLAMA3, .factor = 8.0,
                              .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_max_position_embeddings = 8};
    return c;
}

static zt_llama *create_model(const zt_llama_config *cfg, int B, int T, uint64_t seed)
{
    zt_llama *m = NULL;
    zt_err err = {{0}};
    if (zt_llama_create(&m, cfg, B, T, seed, &err) != 0)
        fail_msg("zt_llama_create: %s", err.msg);
    return m;
}

/* Sets every parameter to a random value of a typical trained size, so that attention is far from uniform
 * and every path carries gradient (norm weights around 1). */
static void randomise_params(zt_llama *m, uint64_t seed, double scale)
{
    zt_rng r;
    zt_rng_seed(&r, seed);
    float *p = zt_llama_params(m);
    for (int i = 0; i < zt_llama_num_tensors(m); i++) {
        const zt_param_info *t = zt_llama_tensor(m, i);
        for (size_t j = 0; j < t->numel; j++)
            p[t->offset + j] = (float)((t->ndim == 1 && !strstr(t->name, "bias") ? 1.0 : 0.0) + scale * zt_rng_normal(&r));
    }
}

/* Mean cross-entropy of the model's logits over non-ignored targets, computed in double here. */
static double loss_from_logits(zt_llama *m, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    const int V = zt_llama_get_config(m)->vocab_size;
    zt_llama_forward(m, tokens, NULL, B, T);
    const float *logits = zt_llama_logits(m);
    double sum = 0;
    int n = 0;
    for (int i = 0; i < B * T; i++) {
        if (targets[i] < 0)
            continue;
        const float *row = logits + (size_t)i * V;
        double mx = row[0];
        for (int v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        double z = 0;
        for (int v = 0; v < V; v++)
            z += exp(row[v] - mx);
        sum += mx + log(z) - row[targets[i]];
        n++;
    }
    return sum / n;
}

/* ---------------------------------------------------------------------------------------------------- */
/* configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

/* Configs as Hugging Face publishes them: LLaMA-3.1 (grouped-query attention, llama3 rope scaling, a list
 * of end ids), LLaMA-2 (transformers 4.31), Mistral 7B v0.3, and transformers 5's rope_parameters form. */
static void test_config_hf_files(void **state)
{
    (void)state;
    zt_llama_config c;
    zt_err err;
    const char *llama31 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
        " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009], \"hidden_act\": \"silu\","
        " \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 14336,"
        " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
        " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"pretraining_tp\": 1,"
        " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
        " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
        " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
        " \"transformers_version\": \"4.43.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";
    if (parse_config(llama31, &c, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(c.family, ZT_LLAMA_FAMILY_LLAMA);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.vocab_size, 128256);
    assert_true(c.rope.theta == 500000.0);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_LLAMA3);
    assert_true(c.rope.factor == 8.0 && c.rope.low_freq_factor == 1.0 && c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_int_equal(c.num_eos_token_ids, 3);
    assert_int_equal(c.eos_token_ids[2], 128009);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.pad_token_id, -1);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(zt_llama_config_num_params(&c), 8030261248u);

    const char *llama2 =
        "{\"_name_or_path\": \"meta-llama/Llama-2-7b-hf\", \"architectures\": [\"LlamaForCausalLM\"],"
        " \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
        " \"initializer_range\": 0.02, \"intermediate_size\": 11008, \"max_position_embeddings\": 4096,"
        " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
        " \"num_key_value_heads\": 32, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null,"
        " \"tie_word_embeddings\": false, \"torch_dtype\": \"float16\", \"transformers_version\": \"4.31.0.dev0\","
        " \"use_cache\": true, \"vocab_size\": 32000}";
    if (parse_config(llama2, &c, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_NONE);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(zt_llama_config_num_params(&c), 6738415616u);

    const char *mistral =
        "{\"architectures\": [\"MistralForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 1,"
        " \"eos_token_id\": 2, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
        " \"initializer_range\": 0.02, \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
        " \"model_type\": \"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
        " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"sliding_window\": null,"
        " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.42.0.dev0\","
        " \"use_cache\": true, \"vocab_size\": 32768}";
    if (parse_config(mistral, &c, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(c.family, ZT_LLAMA_FAMILY_MISTRAL);
    assert_true(c.rope.theta == 1e6);

    /* LLaMA-3.2-1B in transformers 5's form: rope_parameters holds rope_theta and the scaling; a tied head. */
    const char *v5 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"dtype\": \"bfloat16\", \"head_dim\": 64,"
        " \"hidden_size\": 2048, \"intermediate_size\": 8192, \"max_position_embeddings\": 131072,"
        " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
        " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_parameters\": {\"factor\": 32.0,"
        " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
        " \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true,"
        " \"transformers_version\": \"5.0.0\", \"vocab_size\": 128256}";
    if (parse_config(v5, &c, &err) != 0)
        fail_msg("%s", err.msg);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 32.0);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(zt_llama_config_num_params(&c), 1235814400u);
}

/* Heads that are not a power of two, a key/value ratio of 3, a vocabulary that is not a multiple of 64;
 * num_key_value_heads absent means one per query head. */
static void test_config_odd_sizes(void **state)
{
    (void)state;
    zt_llama_config c;
    zt_err err;
    const char *text = "{\"hidden_size\": 36, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
                       " \"intermediate_size\": 50, \"vocab_size\": 1000, \"num_hidden_layers\": 3,"
                       " \"max_position_embeddings\": 64, \"head_dim\": 6}";
    if (parse_config(text, &c, &err) != 0)
        fail_msg("%s", err.msg);
    /* 1000*36 embed + 3 * (36 + 36*36 + 2*12*36 + 36*36 + 36 + 3*50*36) + 36 norm + 1000*36 head */
    const size_t per_layer = 36 + 36 * 36 + 2 * 12 * 36 + 36 * 36 + 36 + 3 * 50 * 36;
    assert_int_equal(zt_llama_config_num_params(&c), 2 * 1000 * 36 + 3 * per_layer + 36);
    c.tie_word_embeddings = true;
    assert_int_equal(zt_llama_config_num_params(&c), 1000 * 36 + 3 * per_layer + 36);
    assert_int_equal(parse_config("{\"hidden_size\": 36, \"num_attention_heads\": 6}", &c, &err), 0);
    assert_int_equal(c.num_key_value_heads, 6);
    assert_int_equal(parse_config("{\"hidden_size\": 36, \"num_attention_heads\": 6, \"num_key_value_heads\": null}",
                                  &c, &err),
                     0);
    assert_int_equal(c.num_key_value_heads, 6);
}

/* Every field ztrain does not compute is refused with a message that names it; cfg is left alone. */
static void test_config_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{\"attention_bias\": true}", "attention_bias"},
        {"{\"mlp_bias\": true}", "mlp_bias"},
        {"{\"attention_dropout\": 0.1}", "attention_dropout"},
        {"{\"pretraining_tp\": 2}", "pretraining_tp"},
        {"{\"head_dim\": 64, \"hidden_size\": 4096, \"num_attention_heads\": 32}", "head_dim"},
        {"{\"model_type\": \"gpt2\"}", "model_type"},
        {"{\"model_type\": \"mistral\", \"sliding_window\": 4096, \"max_position_embeddings\": 32768}",
         "sliding_window"},
        {"{\"model_type\": \"llama\", \"sliding_window\": null}", "sliding_window"},
        {"{\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}", "dynamic"},
        {"{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0}}", "yarn"},
        {"{\"rope_scaling\": {\"rope_type\": \"linear\"}}", "factor"},
        {"{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0}}", "factor"},
        {"{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0,"
         " \"original_max_position_embeddings\": 8192}}",
         "low_freq_factor"},
        {"{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
         " \"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}}",
         "high_freq_factor"},
        {"{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"beta_fast\": 32}}", "beta_fast"},
        {"{\"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"llama3\", \"factor\": 2.0}}", "disagree"},
        {"{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 5.0}}", "rope_theta"},
        {"{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0},"
         " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}",
         "rope_parameters"},
        {"{\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0}}",
         "rope_theta"},
        {"{\"rope_scaling\": 2}", "rope_scaling"},
        {"{\"rope_theta\": 0}", "rope_theta"},
        {"{\"num_attention_heads\": 6, \"num_key_value_heads\": 4, \"hidden_size\": 36}", "num_key_value_heads"},
        {"{\"num_attention_heads\": 4, \"hidden_size\": 36}", "odd"},
        {"{\"num_attention_heads\": 5, \"hidden_size\": 36}", "divisible"},
        {"{\"architectures\": [\"LlamaForSequenceClassification\"]}", "architectures"},
        {"{\"pad_token_id\": 32000}", "pad_token_id"},
        {"{\"eos_token_id\": \"2\"}", "eos_token_id"},
        {"{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", "eos_token_id"},
        {"{\"rms_norm_eps\": 0}", "rms_norm_eps"},
        {"{\"num_hidden_layers\": 0}", "num_hidden_layers"},
        {"{\"vocab_size\": 100000000}", "vocab_size"},
        {"{\"intermediate_size\": 0}", "intermediate_size"},
        {"{\"max_position_embeddings\": \"2048\"}", "max_position_embeddings"},
        {"{\"tie_word_embeddings\": 1}", "tie_word_embeddings"},
        {"{\"n_layer\": 2}", "n_layer"},
        {"{\"num_hidden_layer\": 2}", "num_hidden_layers"}, /* did you mean */
        {"{\"partial_rotary_factor\": 0.5}", "partial_rotary_factor"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zt_llama_config c;
        zt_err err;
        int rc = parse_config(bad[i].json, &c, &err);
        if (rc != ZT_EINVAL_CONFIG || !strstr(err.msg, bad[i].needle))
            fail_msg("%s: rc %d, message '%s' does not name %s", bad[i].json, rc, err.msg, bad[i].needle);
        zt_llama_config d;
        zt_llama_config_default(&d);
        assert_memory_equal(&c, &d, sizeof c); /* unchanged on error */
    }
}

/* The rope forms: none, linear (under rope_type and under its older name type, with and without
 * original_max_position_embeddings), llama3, and transformers 5's rope_parameters with the default type;
 * null resets an earlier scaling. */
static void test_config_rope_variants(void **state)
{
    (void)state;
    zt_llama_config c;
    zt_err err;
    assert_int_equal(parse_config("{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}}", &c, &err), 0);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_LINEAR);
    assert_true(c.rope.factor == 4.0);
    assert_int_equal(parse_config("{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0,"
                                  " \"original_max_position_embeddings\": 2048}}",
                                  &c, &err),
                     0);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_LINEAR);
    assert_int_equal(parse_config("{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1234.5}}", &c,
                                  &err),
                     0);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_NONE);
    assert_true(c.rope.theta == 1234.5);
    assert_int_equal(parse_config("{\"rope_theta\": 1234.5, \"rope_parameters\": {\"rope_theta\": 1234.5,"
                                  " \"rope_type\": \"linear\", \"factor\": 3.0}}",
                                  &c, &err),
                     0);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_LINEAR);
    assert_true(c.rope.factor == 3.0);
    assert_int_equal(parse_config("{\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"default\"}}", &c,
                                  &err),
                     0);
    assert_int_equal(c.rope.scaling, ZT_ROPE_SCALING_NONE);
    assert_true(c.rope.theta == 500000.0);

    /* Absent fields keep cfg's values; null resets the scaling. */
    zt_llama_config k = odd_config();
    cJSON *obj = cJSON_Parse("{\"vocab_size\": 40}");
    assert_int_equal(zt_llama_config_from_json(&k, obj, "x", &err), 0);
    cJSON_Delete(obj);
    assert_int_equal(k.rope.scaling, ZT_ROPE_SCALING_LLAMA3);
    assert_int_equal(k.vocab_size, 40);
    obj = cJSON_Parse("{\"rope_scaling\": null}");
    assert_int_equal(zt_llama_config_from_json(&k, obj, "x", &err), 0);
    cJSON_Delete(obj);
    assert_int_equal(k.rope.scaling, ZT_ROPE_SCALING_NONE);
}

static void read_text(const char *path, char *text, size_t cap)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, cap - 1, f);
    fclose(f);
    text[n] = '\0';
}

/* zt_llama_config_save writes what zt_llama_config_load reads back unchanged, in transformers' keys. */
static void test_config_save_load(void **state)
{
    (void)state;
    char path[320], text[4096];
    path_in_dir(path, sizeof path, "config.json");
    zt_err err = {{0}};
    zt_llama_config a = odd_config(), b;
    a.rope.theta = 500000.0;
    a.num_eos_token_ids = 2;
    a.eos_token_ids[1] = 7;
    a.pad_token_id = 3;
    a.initializer_range = 0.01;
    if (zt_llama_config_save(&a, path, &err) != 0)
        fail_msg("%s", err.msg);
    zt_llama_config_default(&b);
    if (zt_llama_config_load(&b, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(&a, &b, sizeof a);
    read_text(path, text, sizeof text);
    assert_non_null(strstr(text, "\"LlamaForCausalLM\""));
    assert_non_null(strstr(text, "\"model_type\":\t\"llama\""));
    assert_non_null(strstr(text, "\"rope_theta\":\t500000.0"));
    assert_non_null(strstr(text, "\"rope_type\":\t\"llama3\""));
    assert_non_null(strstr(text, "\"rms_norm_eps\":\t1e-05"));
    assert_non_null(strstr(text, "\"head_dim\":\t4"));

    zt_llama_config m = odd_config();
    m.family = ZT_LLAMA_FAMILY_MISTRAL;
    m.rope.scaling = ZT_ROPE_SCALING_NONE;
    m.tie_word_embeddings = true;
    m.num_eos_token_ids = 0;
    m.bos_token_id = -1;
    assert_int_equal(zt_llama_config_save(&m, path, &err), 0);
    zt_llama_config_default(&b);
    if (zt_llama_config_load(&b, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(b.family, ZT_LLAMA_FAMILY_MISTRAL);
    assert_true(b.tie_word_embeddings);
    assert_int_equal(b.rope.scaling, ZT_ROPE_SCALING_NONE);
    assert_int_equal(b.num_eos_token_ids, 0);
    assert_int_equal(b.bos_token_id, -1);
    read_text(path, text, sizeof text);
    assert_non_null(strstr(text, "\"MistralForCausalLM\""));
    assert_non_null(strstr(text, "\"sliding_window\":\tnull"));
    assert_null(strstr(text, "mlp_bias"));

    assert_true(zt_llama_config_load(&b, "/nonexistent/config.json", &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent/config.json"));
}

/* ---------------------------------------------------------------------------------------------------- */
/* layout and initialisation                                                                            */
/* ---------------------------------------------------------------------------------------------------- */

static void check_layout(bool tied)
{
    zt_llama_config c = odd_config();
    c.tie_word_embeddings = tied;
    zt_llama *m = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_llama_create_layout(&m, &c, &err), 0);
    const int L = c.num_hidden_layers, C = c.hidden_size, F = c.intermediate_size, KV = 2 * 4;
    assert_int_equal(zt_llama_num_params(m), zt_llama_config_num_params(&c));
    assert_int_equal(zt_llama_num_tensors(m), 1 + 9 * L + (tied ? 1 : 2));
    assert_int_equal(zt_llama_num_blocks(m), L + 2);
    assert_int_equal(zt_llama_head_block(m), tied ? 0 : L + 1);

    size_t off = 0;
    for (int i = 0; i < zt_llama_num_tensors(m); i++) {
        const zt_param_info *t = zt_llama_tensor(m, i);
        assert_int_equal(t->offset, off);
        assert_int_equal(t->numel, (size_t)t->shape[0] * (t->ndim == 2 ? (size_t)t->shape[1] : 1));
        assert_int_equal(t->weight_decay, t->ndim == 2);
        assert_false(t->transposed_in_hf);
        off += t->numel;
        const zt_block_info *b = zt_llama_block(m, t->block);
        assert_true(t->offset >= b->offset && t->offset + t->numel <= b->offset + b->numel);
    }
    assert_int_equal(off, zt_llama_num_params(m));
    off = 0;
    for (int i = 0; i < zt_llama_num_blocks(m); i++) {
        assert_int_equal(zt_llama_block(m, i)->offset, off);
        off += zt_llama_block(m, i)->numel;
    }
    assert_int_equal(off, zt_llama_num_params(m));

    static const char *const names[9] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",   "mlp.up_proj.weight",      "mlp.down_proj.weight"};
    const int64_t shapes[9][2] = {{C, 0}, {C, C}, {KV, C}, {KV, C}, {C, C}, {C, 0}, {F, C}, {F, C}, {C, F}};
    assert_string_equal(zt_llama_tensor(m, 0)->name, "embed_tokens.weight");
    assert_int_equal(zt_llama_tensor(m, 0)->shape[0], c.vocab_size);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 9; k++) {
            const zt_param_info *t = zt_llama_tensor(m, 1 + 9 * l + k);
            char want[64];
            snprintf(want, sizeof want, "layers.%d.%s", l, names[k]);
            assert_string_equal(t->name, want);
            assert_int_equal(t->block, 1 + l);
            assert_int_equal(t->shape[0], shapes[k][0]);
            assert_int_equal(t->shape[1], shapes[k][1]);
        }
    const zt_param_info *norm = zt_llama_tensor(m, 1 + 9 * L);
    assert_string_equal(norm->name, "norm.weight");
    assert_int_equal(norm->block, L + 1);
    if (!tied) {
        const zt_param_info *head = zt_llama_tensor(m, 2 + 9 * L);
        assert_string_equal(head->name, "lm_head.weight");
        assert_int_equal(head->block, L + 1);
        assert_int_equal(head->shape[0], c.vocab_size);
    }
    zt_llama_destroy(m);
}

static void test_layout(void **state)
{
    (void)state;
    check_layout(false);
    check_layout(true);
}

static void test_init(void **state)
{
    (void)state;
    zt_llama_config c = odd_config();
    c.hidden_size = 48; /* more samples per tensor */
    c.intermediate_size = 64;
    c.vocab_size = 300;
    c.initializer_range = 0.05;
    c.pad_token_id = 5;
    zt_llama *a = create_model(&c, 1, 4, 7), *b = create_model(&c, 2, 8, 7), *d = create_model(&c, 1, 4, 8);
    const size_t n = zt_llama_num_params(a);
    /* The same seed gives the same parameters whatever the batch shape; another seed differs. */
    assert_memory_equal(zt_llama_params(a), zt_llama_params(b), n * sizeof(float));
    assert_memory_not_equal(zt_llama_params(a), zt_llama_params(d), n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        assert_true(zt_llama_grads(a)[i] == 0.0f);
    for (int i = 0; i < zt_llama_num_tensors(a); i++) {
        const zt_param_info *t = zt_llama_tensor(a, i);
        const float *x = zt_llama_params(a) + t->offset;
        if (t->ndim == 1) {
            for (size_t j = 0; j < t->numel; j++)
                assert_true(x[j] == 1.0f);
            continue;
        }
        double s = 0, s2 = 0;
        for (size_t j = 0; j < t->numel; j++) {
            s += x[j];
            s2 += (double)x[j] * x[j];
        }
        const double mean = s / t->numel, sd = sqrt(s2 / t->numel - mean * mean);
        if (fabs(sd / c.initializer_range - 1.0) > 0.1 || fabs(mean) > 0.2 * c.initializer_range)
            fail_msg("%s: mean %g sd %g, expected sd %g", t->name, mean, sd, c.initializer_range);
    }
    /* The padding row starts at zero. */
    for (int j = 0; j < c.hidden_size; j++)
        assert_true(zt_llama_params(a)[5 * c.hidden_size + j] == 0.0f);
    zt_llama_destroy(a);
    zt_llama_destroy(b);
    zt_llama_destroy(d);

    zt_err err = {{0}};
    zt_llama *m = NULL;
    c = odd_config();
    assert_int_equal(zt_llama_create(&m, &c, 1, c.max_position_embeddings + 1, 1, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "max_position_embeddings"));
    assert_int_equal(zt_llama_create(&m, &c, 0, 4, 1, &err), ZT_EINVAL_CONFIG);
    c.num_key_value_heads = 4;
    assert_int_equal(zt_llama_create(&m, &c, 1, 4, 1, &err), ZT_EINVAL_CONFIG);
    assert_null(m);
}

/* ---------------------------------------------------------------------------------------------------- */
/* forward and backward                                                                                 */
/* ---------------------------------------------------------------------------------------------------- */

static void test_forward_shapes_and_loss(void **state)
{
    (void)state;
    zt_llama_config c = odd_config();
    zt_llama *big = create_model(&c, 3, 8, 4), *small = create_model(&c, 2, 5, 4);
    randomise_params(big, 1, 0.3);
    randomise_params(small, 1, 0.3);
    int32_t tokens[10] = {1, 2, 3, 4, 5, 36, 9, 8, 7, 6};
    int32_t targets[10] = {2, 3, 4, 5, 6, -1, 8, 7, 6, 5};
    const size_t V = (size_t)c.vocab_size;
    /* A model created for larger batches gives the same result on a smaller one. */
    float lb = zt_llama_forward(big, tokens, targets, 2, 5);
    float ls = zt_llama_forward(small, tokens, targets, 2, 5);
    assert_true(lb == ls);
    assert_memory_equal(zt_llama_logits(big), zt_llama_logits(small), 10 * V * sizeof(float));
    /* The loss is the mean over the 9 non-ignored positions. */
    double ref = loss_from_logits(small, tokens, targets, 2, 5);
    assert_true(fabs(ls - ref) < 1e-5 * ref);
    /* Causality: changing the last token of a row changes no earlier logit of that row. */
    zt_llama_forward(small, tokens, NULL, 2, 5);
    float *before = malloc(10 * V * sizeof(float));
    memcpy(before, zt_llama_logits(small), 10 * V * sizeof(float));
    tokens[4] = 0;
    zt_llama_forward(small, tokens, NULL, 2, 5);
    assert_memory_equal(before, zt_llama_logits(small), 4 * V * sizeof(float));
    assert_memory_not_equal(before + 4 * V, zt_llama_logits(small) + 4 * V, V * sizeof(float));
    /* Every target ignored: loss 0 and no gradient. */
    int32_t none[10];
    for (int i = 0; i < 10; i++)
        none[i] = -1;
    zt_llama_zero_grad(small);
    assert_true(zt_llama_forward(small, tokens, none, 2, 5) == 0.0f);
    zt_llama_backward(small, 1.0f);
    for (size_t i = 0; i < zt_llama_num_params(small); i++)
        assert_true(zt_llama_grads(small)[i] == 0.0f);
    free(before);
    zt_llama_destroy(big);
    zt_llama_destroy(small);
}

/* The passes over separate block buffers (as a runtime holds them) give the whole model's loss, logits and
 * gradients bit for bit, with the head block's gradient accumulated across the head and its own backward.
 * With checkpoint, every decoder layer's activations are dropped after its forward and rebuilt before its
 * backward: the same bits again. */
static void check_per_block(bool tied, bool checkpoint)
{
    zt_llama_config c = odd_config();
    c.tie_word_embeddings = tied;
    const int B = 2, T = 7, N = B * T;
    zt_llama *m = create_model(&c, B, T, 3);
    randomise_params(m, 21, 0.3);
    int32_t tokens[14], targets[14];
    zt_test_fill_batch(tokens, targets, N, c.vocab_size, 0);
    targets[3] = -1;
    const size_t n = zt_llama_num_params(m);
    const size_t logits_bytes = (size_t)N * c.vocab_size * sizeof(float);

    zt_llama_zero_grad(m);
    const float whole_loss = zt_llama_forward(m, tokens, targets, B, T);
    float *whole_logits = malloc(logits_bytes), *whole_grads = malloc(n * sizeof(float));
    memcpy(whole_logits, zt_llama_logits(m), logits_bytes);
    zt_llama_backward(m, 1.0f);
    memcpy(whole_grads, zt_llama_grads(m), n * sizeof(float));

    const int nb = zt_llama_num_blocks(m), h = zt_llama_head_block(m);
    float **bp = calloc((size_t)nb, sizeof *bp), **bg = calloc((size_t)nb, sizeof *bg);
    for (int b = 0; b < nb; b++) {
        const zt_block_info *k = zt_llama_block(m, b);
        bp[b] = malloc(k->numel * sizeof(float));
        bg[b] = calloc(k->numel, sizeof(float));
        memcpy(bp[b], zt_llama_params(m) + k->offset, k->numel * sizeof(float));
    }
    zt_llama_forward_begin(m, tokens, B, T);
    for (int b = 0; b < nb; b++) {
        zt_llama_forward_block(m, b, bp[b]);
        if (checkpoint)
            zt_llama_discard_block_acts(m, b);
    }
    const float loss = zt_llama_forward_head(m, bp[h], targets);
    assert_true(loss == whole_loss);
    assert_memory_equal(zt_llama_logits(m), whole_logits, logits_bytes);
    zt_llama_backward_head(m, bp[h], bg[h], 1.0f);
    for (int b = nb - 1; b >= 0; b--) {
        if (checkpoint)
            zt_llama_forward_block(m, b, bp[b]);
        zt_llama_backward_block(m, b, bp[b], bg[b]);
    }
    for (int b = 0; b < nb; b++) {
        const zt_block_info *k = zt_llama_block(m, b);
        if (memcmp(bg[b], whole_grads + k->offset, k->numel * sizeof(float)) != 0)
            fail_msg("block %d's gradient differs (tied %d, checkpoint %d)", b, tied, checkpoint);
        free(bp[b]);
        free(bg[b]);
    }
    free(bp);
    free(bg);
    free(whole_logits);
    free(whole_grads);
    zt_llama_destroy(m);
}

static void test_per_block_equals_whole(void **state)
{
    (void)state;
    check_per_block(false, false);
    check_per_block(true, false);
}

static void test_checkpointing_equals_kept(void **state)
{
    (void)state;
    check_per_block(false, true);
    check_per_block(true, true);
}

/* The central difference of the loss in parameter j with step h (the step as float arithmetic takes it). */
static double central_difference(zt_llama *m, size_t j, float h, const int32_t *tokens, const int32_t *targets,
                                 int B, int T)
{
    float *p = zt_llama_params(m);
    const float saved = p[j];
    p[j] = saved + h;
    const double lp = loss_from_logits(m, tokens, targets, B, T);
    p[j] = saved - h;
    const double lm = loss_from_logits(m, tokens, targets, B, T);
    p[j] = saved;
    return (lp - lm) / (2.0 * ((double)(saved + h) - (double)saved));
}

/* Finite differences of the whole model's loss against the backward pass, on up to 40 entries of every
 * tensor; the loss in double from the float logits. The embedding's entries pass through RMSNorm at a small
 * scale, where the curvature is large: a central difference with step 1e-2 is off by several percent there
 * (it converges to the backward as the step shrinks), and a smaller step drowns in the float forward's
 * rounding. So the difference is extrapolated (Richardson: (4 D(h/2) - D(h)) / 3 cancels the h^2 term) with
 * h = 1e-2. Entries above 1e-3 must agree within 2%, smaller ones within 1e-4. */
static void check_gradients(bool tied, bool qwen2)
{
    zt_llama_config c = odd_config();
    c.tie_word_embeddings = tied;
    if (qwen2) { /* q, k and v with biases */
        c.family = ZT_LLAMA_FAMILY_QWEN2;
        c.qkv_bias = true;
    }
    const int B = 2, T = 7;
    zt_llama *m = create_model(&c, B, T, 4);
    randomise_params(m, tied ? 78 : 77, qwen2 ? 0.25 : 0.3); /* biases shift q and k: a little less curvature */
    int32_t tokens[14] = {1, 4, 2, 9, 10, 0, 36, 3, 3, 7, 5, 6, 8, 30};
    int32_t targets[14] = {4, 2, 9, 10, 0, 6, 3, -1, 5, 6, 8, 1, 35, 2};
    zt_llama_zero_grad(m);
    float loss = zt_llama_forward(m, tokens, targets, B, T);
    double ref = loss_from_logits(m, tokens, targets, B, T);
    assert_true(fabs(loss - ref) < 1e-5 * ref);
    zt_llama_forward(m, tokens, targets, B, T);
    zt_llama_backward(m, 1.0f);

    const float *g = zt_llama_grads(m);
    const float eps = 1e-2f;
    zt_rng r;
    zt_rng_seed(&r, 123);
    int checked = 0, large = 0;
    double worst_rel = 0, worst_abs = 0;
    for (int i = 0; i < zt_llama_num_tensors(m); i++) {
        const zt_param_info *t = zt_llama_tensor(m, i);
        const int count = t->numel < 40 ? (int)t->numel : 40;
        int tensor_large = 0;
        for (int k = 0; k < count; k++) {
            const size_t j = t->offset + (t->numel <= 40 ? (size_t)k : zt_rng_below(&r, t->numel));
            const double num = (4.0 * central_difference(m, j, eps / 2, tokens, targets, B, T) -
                                central_difference(m, j, eps, tokens, targets, B, T)) / 3.0;
            const double ana = g[j];
            const double diff = fabs(num - ana);
            checked++;
            if (fabs(ana) > 1e-3 || fabs(num) > 1e-3) {
                large++;
                tensor_large++;
                const double rel = diff / fmax(fabs(num), fabs(ana));
                worst_rel = fmax(worst_rel, rel);
                if (rel > 2e-2)
                    fail_msg("%s[%zu]: backward %.6g, finite difference %.6g", t->name, j - t->offset, ana, num);
            } else {
                worst_abs = fmax(worst_abs, diff);
                if (diff > 1e-4)
                    fail_msg("%s[%zu]: backward %.6g, finite difference %.6g", t->name, j - t->offset, ana, num);
            }
        }
        if (tensor_large == 0) /* every tensor's check is not vacuous */
            fail_msg("%s: no entry with a gradient above 1e-3", t->name);
    }
    print_message("gradient check (%s%s head): %d entries, %d with |g| > 1e-3, worst relative error %.3g, worst "
                  "absolute error of small ones %.3g\n",
                  qwen2 ? "Qwen2, " : "", tied ? "tied" : "untied", checked, large, worst_rel, worst_abs);
    assert_true(large > checked / 2);
    zt_llama_destroy(m);
}

static void test_gradient_check(void **state)
{
    (void)state;
    check_gradients(false, false);
    check_gradients(true, false);
    check_gradients(false, true);
    check_gradients(true, true);
}

/* Qwen2's config.json as transformers writes it: the LLaMA math with q, k and v biases, whose tensors come
 * after each layer's MLP in the table (one packed bias for the packed q | k | v weight) and start at zero; the
 * window fields are accepted while use_sliding_window is false, refused otherwise; a saved config reads back
 * the same. */
static void test_qwen2_config(void **state)
{
    (void)state;
    const char *json =
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643, "
        "\"eos_token_id\": 151645, \"hidden_act\": \"silu\", \"hidden_size\": 96, \"initializer_range\": 0.02, "
        "\"intermediate_size\": 200, \"layer_types\": [\"full_attention\", \"full_attention\"], "
        "\"max_position_embeddings\": 64, \"max_window_layers\": 21, \"model_type\": \"qwen2\", "
        "\"num_attention_heads\": 6, \"num_hidden_layers\": 2, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, "
        "\"rope_scaling\": null, \"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true, "
        "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.1\", \"use_cache\": true, "
        "\"use_sliding_window\": false, \"vocab_size\": 151937}";
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    zt_family_config fc;
    zt_err err;
    if (zt_family_config_from_json(&fc, o, "qwen2.json", &err) != 0)
        fail_msg("%s", err.msg);
    const zt_llama_config *c = ZT_LLAMA_CONFIG(&fc);
    assert_int_equal(c->family, ZT_LLAMA_FAMILY_QWEN2);
    assert_true(c->qkv_bias);
    assert_string_equal(zt_family_name(&fc), "qwen2");
    zt_llama *m = NULL;
    assert_int_equal(zt_llama_create_layout(&m, c, &err), 0);
    const zt_param_info *qb = zt_llama_tensor(m, ZT_LLAMA_LAYER_TENSOR(ZT_LLAMA_T_COUNT_QKV_BIAS, 1, ZT_LLAMA_T_Q_BIAS));
    assert_string_equal(qb->name, "layers.1.self_attn.q_proj.bias");
    assert_int_equal(qb->shape[0], 96);
    const zt_param_info *vb = zt_llama_tensor(m, ZT_LLAMA_LAYER_TENSOR(ZT_LLAMA_T_COUNT_QKV_BIAS, 1, ZT_LLAMA_T_V_BIAS));
    assert_int_equal(vb->shape[0], 32);
    assert_int_equal(vb->offset, qb->offset + 96 + 32); /* q | k | v biases adjacent */
    assert_int_equal(zt_llama_num_params(m), zt_llama_config_num_params(c));
    zt_llama_destroy(m);
    zt_llama *full = create_model(c, 1, 4, 3);
    assert_float_equal(zt_llama_params(full)[qb->offset], 0.0f, 0.0f);
    zt_llama_destroy(full);

    /* saved and read back */
    char path[] = "/tmp/zt_qwen2_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    if (zt_family_config_save(&fc, path, &err) != 0)
        fail_msg("%s", err.msg);
    zt_family_config back;
    if (zt_family_config_load(&back, path, &err) != 0)
        fail_msg("%s", err.msg);
    char av[64], bv[64];
    const char *diff = zt_family_config_diff(&fc, &back, av, bv, sizeof av);
    if (diff)
        fail_msg("%s: %s vs %s", diff, av, bv);
    unlink(path);

    /* a sliding window in use is refused, naming the field */
    cJSON_ReplaceItemInObject(o, "use_sliding_window", cJSON_CreateTrue());
    assert_int_equal(zt_family_config_from_json(&fc, o, "qwen2.json", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "use_sliding_window"));
    cJSON_Delete(o);
}

static void test_backward_accumulates(void **state)
{
    (void)state;
    zt_llama_config c = odd_config();
    zt_llama *m = create_model(&c, 2, 6, 4);
    randomise_params(m, 2, 0.3);
    int32_t tokens[12], targets[12];
    zt_test_fill_batch(tokens, targets, 12, c.vocab_size, 1);
    const size_t n = zt_llama_num_params(m);
    float *g1 = malloc(n * sizeof(float));
    zt_llama_zero_grad(m);
    zt_llama_forward(m, tokens, targets, 2, 6);
    zt_llama_backward(m, 1.0f);
    memcpy(g1, zt_llama_grads(m), n * sizeof(float));
    /* A second pass adds the same gradient again (up to rounding); loss_scale 2 doubles it exactly. */
    zt_llama_forward(m, tokens, targets, 2, 6);
    zt_llama_backward(m, 1.0f);
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(zt_llama_grads(m)[i] - 2.0f * g1[i]) <= 1e-5f * fabsf(g1[i]) + 1e-8f);
    zt_llama_zero_grad(m);
    zt_llama_forward(m, tokens, targets, 2, 6);
    zt_llama_backward(m, 2.0f);
    for (size_t i = 0; i < n; i++)
        assert_true(zt_llama_grads(m)[i] == 2.0f * g1[i]);
    free(g1);
    zt_llama_destroy(m);
}

/* The padding row of embed_tokens gets nothing from the embedding's backward (nn.Embedding's padding_idx):
 * untied it stays zero; tied it keeps exactly the head's part. */
static void test_padding_row(void **state)
{
    (void)state;
    for (int tied = 0; tied < 2; tied++) {
        zt_llama_config c = odd_config();
        c.tie_word_embeddings = tied;
        c.pad_token_id = 0;
        zt_llama *m = create_model(&c, 2, 6, 4), *ref = NULL;
        c.pad_token_id = -1;
        ref = create_model(&c, 2, 6, 4);
        randomise_params(m, 5, 0.3);
        memcpy(zt_llama_params(ref), zt_llama_params(m), zt_llama_num_params(m) * sizeof(float));
        int32_t tokens[12] = {0, 3, 0, 5, 6, 0, 1, 0, 2, 0, 4, 9}, targets[12];
        for (int i = 0; i < 12; i++)
            targets[i] = (i * 5 + 2) % c.vocab_size;
        zt_llama_zero_grad(m);
        zt_llama_zero_grad(ref);
        assert_true(zt_llama_forward(m, tokens, targets, 2, 6) == zt_llama_forward(ref, tokens, targets, 2, 6));
        zt_llama_backward(m, 1.0f);
        zt_llama_backward(ref, 1.0f);
        const size_t C = (size_t)c.hidden_size;
        /* Rows other than 0 are as without padding; row 0 has no embedding part (with a tied head, the
         * head's part alone: not zero, and not what the reference has). */
        assert_memory_equal(zt_llama_grads(m) + C, zt_llama_grads(ref) + C,
                            (zt_llama_num_params(m) - C) * sizeof(float));
        bool zero = true, same = true;
        for (size_t j = 0; j < C; j++) {
            zero = zero && zt_llama_grads(m)[j] == 0.0f;
            same = same && zt_llama_grads(m)[j] == zt_llama_grads(ref)[j];
        }
        assert_true(tied ? !zero : zero);
        assert_false(same);
        zt_llama_destroy(m);
        zt_llama_destroy(ref);
    }
}

/* Plain SGD on one fixed batch drives the loss close to 0: the model can learn. */
static void test_sgd_learns(void **state)
{
    (void)state;
    zt_llama_config c = odd_config();
    c.hidden_size = 48;
    c.intermediate_size = 64;
    c.vocab_size = 16;
    c.initializer_range = 0.1;
    const int B = 2, T = 12;
    zt_llama *m = create_model(&c, B, T, 42);
    int32_t tokens[24], targets[24];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T + 1; t++) {
            int tok = (b == 0) ? (3 * t + 1) % 16 : (5 * t + 2) % 16;
            if (t < T)
                tokens[b * T + t] = tok;
            if (t > 0)
                targets[b * T + t - 1] = tok;
        }
    const size_t n = zt_llama_num_params(m);
    float first = 0, loss = 0;
    for (int step = 0; step < 300; step++) {
        zt_llama_zero_grad(m);
        loss = zt_llama_forward(m, tokens, targets, B, T);
        if (step == 0)
            first = loss;
        zt_llama_backward(m, 1.0f);
        float *p = zt_llama_params(m);
        const float *g = zt_llama_grads(m);
        for (size_t i = 0; i < n; i++)
            p[i] -= 0.1f * g[i];
    }
    print_message("SGD: loss %.4f -> %.4f after 300 steps\n", first, loss);
    assert_true(first > 2.0f);
    assert_true(loss < 0.05f);
    zt_llama_destroy(m);
}

/* ---------------------------------------------------------------------------------------------------- */
/* export and import                                                                                    */
/* ---------------------------------------------------------------------------------------------------- */

static void check_roundtrip(bool tied)
{
    char path[320];
    path_in_dir(path, sizeof path, "model.safetensors");
    zt_llama_config c = odd_config();
    c.tie_word_embeddings = tied;
    zt_llama *a = create_model(&c, 1, 4, 11), *b = create_model(&c, 1, 4, 12);
    randomise_params(a, 5, 0.5);
    zt_err err = {{0}};
    if (zt_llama_export(a, path, &err) != 0)
        fail_msg("%s", err.msg);

    /* HF names, nn.Linear shapes, F32, format pt; lm_head only when untied. */
    zt_st_file *f = NULL;
    assert_int_equal(zt_st_open(path, &f, &err), 0);
    assert_int_equal(zt_st_count(f), (size_t)zt_llama_num_tensors(a));
    assert_string_equal(zt_st_metadata(f, "format"), "pt");
    const zt_st_tensor *k = zt_st_find(f, "model.layers.1.self_attn.k_proj.weight");
    assert_non_null(k);
    assert_int_equal(k->dtype, ZT_DTYPE_F32);
    assert_int_equal(k->shape[0], 8);
    assert_int_equal(k->shape[1], c.hidden_size);
    assert_non_null(zt_st_find(f, "model.embed_tokens.weight"));
    assert_non_null(zt_st_find(f, "model.norm.weight"));
    assert_non_null(zt_st_find(f, "model.layers.0.mlp.down_proj.weight"));
    if (tied) {
        assert_null(zt_st_find(f, "lm_head.weight"));
    } else {
        const zt_st_tensor *h = zt_st_find(f, "lm_head.weight");
        assert_non_null(h);
        const zt_param_info *t = zt_llama_tensor(a, zt_llama_num_tensors(a) - 1);
        assert_memory_equal(h->data, zt_llama_params(a) + t->offset, t->numel * sizeof(float));
    }
    zt_st_close(f);

    if (zt_llama_import(b, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_llama_params(a), zt_llama_params(b), zt_llama_num_params(a) * sizeof(float));
    zt_llama_destroy(a);
    zt_llama_destroy(b);
}

static void test_export_import_roundtrip(void **state)
{
    (void)state;
    check_roundtrip(false);
    check_roundtrip(true);
}

/* How rewrite_file changes the tensors of an exported file. */
typedef struct rewrite_opts {
    const char *skip;      /* drop the tensor with this (file) name */
    const char *reshape;   /* write this tensor with one row (element) fewer */
    const char *extra;     /* add a tensor with this name */
    bool strip_prefix;     /* write names without "model." */
    bool add_lm_head;      /* add lm_head.weight = embed_tokens */
    bool lm_head_differs;  /* ... with one element changed */
    bool add_buffers;      /* add rotary_emb.inv_freq buffers */
    enum zt_dtype dtype;   /* F32 or BF16 */
    bool int_dtype_on_emb; /* write embed_tokens as I32 */
} rewrite_opts;

/* Writes dst from the exported file src with the changes in o. */
static void rewrite_file(const char *src, const char *dst, const rewrite_opts *o)
{
    zt_err err = {{0}};
    zt_st_file *f = NULL;
    assert_int_equal(zt_st_open(src, &f, &err), 0);
    zt_st_writer *w = zt_st_writer_create();
    const size_t n = zt_st_count(f);
    void **bufs = calloc(n + 4, sizeof *bufs);
    int nbuf = 0;
    static const float buffer_data[4] = {1, 0.5f, 0.25f, 0.125f};
    for (size_t i = 0; i < n; i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        if (o->skip && strcmp(t->name, o->skip) == 0)
            continue;
        const char *name = t->name;
        if (o->strip_prefix && strncmp(name, "model.", 6) == 0)
            name += 6;
        int64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
        if (o->reshape && strcmp(t->name, o->reshape) == 0)
            shape[0]--;
        const size_t numel = (size_t)shape[0] * (t->ndim == 2 ? (size_t)shape[1] : 1);
        enum zt_dtype dtype = o->dtype;
        if (o->int_dtype_on_emb && strstr(t->name, "embed_tokens"))
            dtype = ZT_DTYPE_I32;
        const void *data = t->data;
        if (dtype == ZT_DTYPE_BF16) {
            uint16_t *h = malloc(numel * 2);
            for (size_t j = 0; j < numel; j++) {
                uint32_t bits;
                memcpy(&bits, (const char *)t->data + 4 * j, 4);
                h[j] = (uint16_t)(bits >> 16);
            }
            bufs[nbuf++] = h;
            data = h;
        }
        assert_int_equal(zt_st_writer_add(w, name, dtype, t->ndim, shape, data, &err), 0);
    }
    const zt_st_tensor *emb = zt_st_find(f, "model.embed_tokens.weight");
    if (o->add_lm_head) {
        float *copy = malloc(emb->nbytes);
        memcpy(copy, emb->data, emb->nbytes);
        if (o->lm_head_differs)
            copy[3] += 1.0f;
        bufs[nbuf++] = copy;
        assert_int_equal(zt_st_writer_add(w, "lm_head.weight", ZT_DTYPE_F32, 2, emb->shape, copy, &err), 0);
    }
    if (o->add_buffers) {
        int64_t shape[1] = {2};
        assert_int_equal(
            zt_st_writer_add(w, "model.layers.0.self_attn.rotary_emb.inv_freq", ZT_DTYPE_F32, 1, shape, buffer_data, &err),
            0);
        assert_int_equal(zt_st_writer_add(w, "model.rotary_emb.inv_freq", ZT_DTYPE_F32, 1, shape, buffer_data, &err), 0);
    }
    if (o->extra) {
        int64_t shape[1] = {4};
        assert_int_equal(zt_st_writer_add(w, o->extra, ZT_DTYPE_F32, 1, shape, buffer_data, &err), 0);
    }
    assert_int_equal(zt_st_writer_add_metadata(w, "format", "pt", &err), 0);
    if (zt_st_writer_write(w, dst, &err) != 0)
        fail_msg("%s", err.msg);
    zt_st_writer_destroy(w);
    for (int i = 0; i < nbuf; i++)
        free(bufs[i]);
    free(bufs);
    zt_st_close(f);
}

static void test_import_variants(void **state)
{
    (void)state;
    char src[320], dst[320];
    path_in_dir(src, sizeof src, "a.safetensors");
    path_in_dir(dst, sizeof dst, "b.safetensors");
    zt_llama_config c = odd_config();
    c.tie_word_embeddings = true;
    zt_llama *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
    randomise_params(a, 9, 0.5);
    const size_t bytes = zt_llama_num_params(a) * sizeof(float);
    zt_err err = {{0}};
    assert_int_equal(zt_llama_export(a, src, &err), 0);

    /* Names without the prefix, a tied lm_head.weight equal to embed_tokens and rotary buffers. */
    rewrite_opts o = {.strip_prefix = true, .add_lm_head = true, .add_buffers = true, .dtype = ZT_DTYPE_F32};
    rewrite_file(src, dst, &o);
    if (zt_llama_import(b, dst, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_llama_params(a), zt_llama_params(b), bytes);

    /* BF16: every value is the top half of the float. */
    rewrite_opts bf = {.dtype = ZT_DTYPE_BF16};
    rewrite_file(src, dst, &bf);
    if (zt_llama_import(b, dst, &err) != 0)
        fail_msg("%s", err.msg);
    for (size_t i = 0; i < zt_llama_num_params(a); i++) {
        uint32_t bits;
        memcpy(&bits, &zt_llama_params(a)[i], 4);
        bits &= 0xffff0000u;
        float want;
        memcpy(&want, &bits, 4);
        assert_true(zt_llama_params(b)[i] == want);
    }
    zt_llama_destroy(a);
    zt_llama_destroy(b);
}

static void test_import_errors_leave_model_unchanged(void **state)
{
    (void)state;
    char src[320], dst[320];
    path_in_dir(src, sizeof src, "a.safetensors");
    path_in_dir(dst, sizeof dst, "b.safetensors");
    zt_llama_config c = odd_config();
    zt_llama *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
    c.tie_word_embeddings = true;
    zt_llama *tied = create_model(&c, 1, 4, 3);
    const size_t bytes = zt_llama_num_params(b) * sizeof(float), tied_bytes = zt_llama_num_params(tied) * sizeof(float);
    float *before = malloc(bytes), *tied_before = malloc(tied_bytes);
    memcpy(before, zt_llama_params(b), bytes);
    memcpy(tied_before, zt_llama_params(tied), tied_bytes);
    zt_err err = {{0}};
    assert_int_equal(zt_llama_export(a, src, &err), 0);

    static const struct {
        rewrite_opts o;
        bool into_tied;
        const char *needle;
    } cases[] = {
        {{.skip = "lm_head.weight"}, false, "tie_word_embeddings"},
        {{.skip = "model.norm.weight"}, false, "norm.weight"},
        {{.skip = "model.layers.1.mlp.up_proj.weight"}, false, "layers.1.mlp.up_proj.weight"},
        {{.reshape = "model.layers.0.self_attn.v_proj.weight"}, false, "layers.0.self_attn.v_proj.weight"},
        {{.reshape = "model.layers.1.post_attention_layernorm.weight"}, false, "post_attention_layernorm"},
        {{.extra = "model.layers.2.input_layernorm.weight"}, false, "model.layers.2.input_layernorm.weight"},
        {{.extra = "score.weight"}, false, "score.weight"},
        {{.extra = "model.lm_head.weight"}, false, "model.lm_head.weight"},
        {{.int_dtype_on_emb = true}, false, "I32"},
        /* an untied file into a tied model: its lm_head differs from embed_tokens */
        {{.dtype = ZT_DTYPE_F32}, true, "tie_word_embeddings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite_file(src, dst, &cases[i].o);
        memset(&err, 0, sizeof err);
        zt_llama *m = cases[i].into_tied ? tied : b;
        int rc = zt_llama_import(m, dst, &err);
        if (rc == 0 || !strstr(err.msg, cases[i].needle) || !strstr(err.msg, g_dir))
            fail_msg("case %zu: rc %d, message '%s' does not name '%s' and the file", i, rc, err.msg,
                     cases[i].needle);
        assert_memory_equal(zt_llama_params(b), before, bytes);
        assert_memory_equal(zt_llama_params(tied), tied_before, tied_bytes);
    }
    /* A tensor with a NaN is refused. */
    zt_llama_params(a)[zt_llama_num_params(a) - 1] = NAN;
    assert_int_equal(zt_llama_export(a, src, &err), 0);
    assert_int_equal(zt_llama_import(b, src, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "lm_head.weight"));
    assert_memory_equal(zt_llama_params(b), before, bytes);
    /* A missing file. */
    assert_true(zt_llama_import(b, "/nonexistent/model.safetensors", &err) < 0);
    assert_memory_equal(zt_llama_params(b), before, bytes);
    /* A model of another shape. */
    zt_llama_config c3 = odd_config();
    c3.num_hidden_layers = 3;
    zt_llama *d = create_model(&c3, 1, 4, 3);
    assert_int_equal(zt_llama_export(d, dst, &err), 0);
    assert_int_equal(zt_llama_import(b, dst, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "layers.2."));
    assert_memory_equal(zt_llama_params(b), before, bytes);
    free(before);
    free(tied_before);
    zt_llama_destroy(a);
    zt_llama_destroy(b);
    zt_llama_destroy(d);
    zt_llama_destroy(tied);
}

/* A sharded export (shards of at most 4 KiB, an index) imports from the index and from its folder; a
 * shard that is missing is named. With room for everything, one model.safetensors. */
static void test_import_sharded(void **state)
{
    (void)state;
    char dir[300], idx[360], shard[360];
    path_in_dir(dir, sizeof dir, "sharded");
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    zt_llama_config c = odd_config();
    zt_llama *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
    randomise_params(a, 11, 0.5);
    const size_t bytes = zt_llama_num_params(a) * sizeof(float);
    zt_err err = {{0}};
    if (zt_llama_export_sharded(a, dir, 4096, &err) != 0)
        fail_msg("%s", err.msg);
    char **files = NULL;
    int n = 0;
    assert_int_equal(zt_st_shard_files(dir, &files, &n, &err), 0);
    print_message("sharded export: %d shards of at most 4096 bytes for %zu bytes\n", n, bytes);
    assert_true(n > 2);
    zt_st_shard_files_free(files, n);
    if (zt_llama_import(b, idx, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_llama_params(a), zt_llama_params(b), bytes);
    zt_llama_destroy(b);
    b = create_model(&c, 1, 4, 3);
    if (zt_llama_import(b, dir, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_llama_params(a), zt_llama_params(b), bytes);

    float *before = malloc(bytes);
    memcpy(before, zt_llama_params(b), bytes);
    snprintf(shard, sizeof shard, "%s/model-00002-of-%05d.safetensors", dir, n);
    assert_int_equal(unlink(shard), 0);
    assert_true(zt_llama_import(b, dir, &err) < 0);
    assert_non_null(strstr(err.msg, "model-00002-of-"));
    assert_memory_equal(zt_llama_params(b), before, bytes);
    free(before);

    path_in_dir(dir, sizeof dir, "whole");
    assert_int_equal(zt_llama_export_sharded(a, dir, (size_t)1 << 30, &err), 0);
    snprintf(shard, sizeof shard, "%s/model.safetensors", dir);
    zt_llama_destroy(b);
    b = create_model(&c, 1, 4, 3);
    assert_int_equal(zt_llama_import(b, shard, &err), 0);
    assert_memory_equal(zt_llama_params(a), zt_llama_params(b), bytes);
    zt_llama_destroy(a);
    zt_llama_destroy(b);
}

/* ---------------------------------------------------------------------------------------------------- */
/* the training engine                                                                                  */
/* ---------------------------------------------------------------------------------------------------- */

#define ENGINE_B 4
#define ENGINE_T 6
#define ENGINE_ACCUM 2

/* The whole model's gradient of the mean of ENGINE_ACCUM micro-batches of ENGINE_B rows. */
static float *reference_grads(const zt_llama_config *c, float *loss)
{
    zt_llama *m = create_model(c, ENGINE_B, ENGINE_T, 9);
    zt_llama_zero_grad(m);
    int32_t tok[ENGINE_B * ENGINE_T], tgt[ENGINE_B * ENGINE_T];
    double sum = 0;
    for (int a = 0; a < ENGINE_ACCUM; a++) {
        zt_test_fill_batch(tok, tgt, ENGINE_B * ENGINE_T, c->vocab_size, a);
        sum += zt_llama_forward(m, tok, tgt, ENGINE_B, ENGINE_T);
        zt_llama_backward(m, 1.0f / ENGINE_ACCUM);
    }
    *loss = (float)(sum / ENGINE_ACCUM);
    float *g = malloc(zt_llama_num_params(m) * sizeof(float));
    memcpy(g, zt_llama_grads(m), zt_llama_num_params(m) * sizeof(float));
    zt_llama_destroy(m);
    return g;
}

/* One rank of W: the engine over this rank's rows of every micro-batch; returns 0 when the step's loss and
 * the gathered gradient match the reference (bit for bit at W = 1, within rounding otherwise). */
static int engine_rank(const zt_llama_config *c, int W, int rank, int level, bool checkpoint, const char *name,
                       char *msg, size_t cap)
{
    zt_err err = {{0}};
    const int b = ENGINE_B / W;
    zt_llama *m = create_model(c, b, ENGINE_T, 9);
    bool ck[8] = {checkpoint, checkpoint, checkpoint};
    zt_model *model = NULL;
    float *grads = NULL, *ref = NULL;
    int rc = -1;
    if (zt_llama_model_cpu(&model, m, ENGINE_ACCUM, ck, &err) < 0) {
        snprintf(msg, cap, "model: %s", err.msg);
        goto out;
    }
    const size_t n = zt_llama_num_params(m);
    grads = malloc(n * sizeof(float));
    float loss = 0;
    if (zt_test_engine_step(model, zt_llama_params(m), W, rank, level, ENGINE_ACCUM, b, ENGINE_T, c->vocab_size,
                            name, &loss, grads, msg, cap) < 0)
        goto out;
    float ref_loss = 0;
    ref = reference_grads(c, &ref_loss);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)grads[i] - ref[i]));
    if (W == 1 ? (loss != ref_loss || memcmp(grads, ref, n * sizeof(float)) != 0)
               : (fabs(loss - ref_loss) > 1e-5 * ref_loss || worst > 1e-5 * scale)) {
        snprintf(msg, cap, "W=%d ZeRO-%d: loss %.9g (reference %.9g), largest gradient difference %.3g of %.3g", W,
                 level, (double)loss, (double)ref_loss, worst, scale);
        goto out;
    }
    rc = 0;
out:
    free(grads);
    free(ref);
    if (model)
        model->ops->destroy(model);
    zt_llama_destroy(m);
    return rc;
}

/* A rank of the two of test_engine. */
typedef struct {
    const zt_llama_config *c;
    int level;
    const char *name;
} two_ranks;

static int two_ranks_rank(int r, void *ctx)
{
    const two_ranks *t = ctx;
    char msg[ZT_ERR_LEN + 128];
    int rc = engine_rank(t->c, 2, r, t->level, r == 1, t->name, msg, sizeof msg);
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", r, msg);
    return rc;
}

/* The training engine drives the model with the head in its last block (untied) and in block 0 (tied):
 * one rank gives the whole model's loss and gradient bit for bit, with and without checkpointed layers;
 * two ranks (separate processes on the shared-memory backend, ZeRO-3 and ZeRO-2) give them within
 * rounding. */
static void test_engine(void **state)
{
    (void)state;
    zt_cpu_set_threads(1);
    char msg[ZT_ERR_LEN + 128];
    for (int tied = 0; tied < 2; tied++) {
        zt_llama_config c = odd_config();
        c.tie_word_embeddings = tied;
        for (int ck = 0; ck < 2; ck++) {
            char name[64];
            snprintf(name, sizeof name, "zt_test_llama_%d_%d_w1", (int)getpid(), tied);
            if (engine_rank(&c, 1, 0, 3, ck, name, msg, sizeof msg) != 0)
                fail_msg("tied %d, checkpointing %d: %s", tied, ck, msg);
        }
        for (int level = 2; level <= 3; level++) {
            char name[64];
            snprintf(name, sizeof name, "zt_test_llama_%d_%d_%d", (int)getpid(), tied, level);
            two_ranks t = {&c, level, name};
            int st = 0, r = zt_test_run_ranks(2, two_ranks_rank, &t, &st);
            if (r >= 0)
                fail_msg("tied %d, W=2 ZeRO-%d: rank %d failed (status %d)", tied, level, r, st);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_hf_files),
        cmocka_unit_test(test_config_odd_sizes),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_config_rope_variants),
        cmocka_unit_test_setup_teardown(test_config_save_load, make_dir, remove_dir),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_forward_shapes_and_loss),
        cmocka_unit_test(test_per_block_equals_whole),
        cmocka_unit_test(test_checkpointing_equals_kept),
        cmocka_unit_test(test_gradient_check),
        cmocka_unit_test(test_qwen2_config),
        cmocka_unit_test(test_backward_accumulates),
        cmocka_unit_test(test_padding_row),
        cmocka_unit_test(test_sgd_learns),
        cmocka_unit_test_setup_teardown(test_export_import_roundtrip, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_variants, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_errors_leave_model_unchanged, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_sharded, make_dir, remove_dir),
        cmocka_unit_test(test_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
