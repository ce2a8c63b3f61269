/* Tests of the GPT-2 model (worker/models/gpt2.c): config.json parsing and writing, the parameter layout,
 * initialisation, safetensors export/import (round trip, dtypes, every refusal leaving the model
 * unchanged), a finite-difference check of the whole backward pass, and a tiny model learning a fixed
 * sequence with plain SGD. */
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
#include "kernels/cpu_threads.h"
#include "worker/models/gpt2.h"
#include "worker/models/host_shared.h" /* zt__host_fill_normal */

/* ---------------------------------------------------------------------------------------------------- */
/* helpers                                                                                              */
/* ---------------------------------------------------------------------------------------------------- */

static char g_dir[256]; /* a temporary folder for the files of one test */

static int make_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zt_test_gpt2_XXXXXX");
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

/* Parses text and runs zt_gpt2_config_from_json on a default config; returns its code. */
static int parse_config(const char *text, zt_gpt2_config *cfg, zt_err *err)
{
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    zt_gpt2_config_default(cfg);
    int rc = zt_gpt2_config_from_json(cfg, obj, "config.json", err);
    cJSON_Delete(obj);
    return rc;
}

static zt_gpt2_config tiny_config(void)
{
    zt_gpt2_config c;
    zt_gpt2_config_default(&c);
    c.n_layer = 2;
    c.n_embd = 16;
    c.n_head = 2;
    c.vocab_size = 11;
    c.n_positions = 8;
    return c;
}

static zt_gpt2 *create_model(const zt_gpt2_config *cfg, int B, int T, uint64_t seed)
{
    zt_gpt2 *m = NULL;
    zt_err err = {{0}};
    int rc = zt_gpt2_create(&m, cfg, B, T, seed, &err);
    if (rc != 0)
        fail_msg("zt_gpt2_create: %s", err.msg);
    return m;
}

/* Sets every parameter to a random value of a typical trained size, so that attention is far from
 * uniform and every path carries gradient. */
static void randomise_params(zt_gpt2 *m, uint64_t seed, double scale)
{
    zt_rng r;
    zt_rng_seed(&r, seed);
    float *p = zt_gpt2_params(m);
    for (int i = 0; i < zt_gpt2_num_tensors(m); i++) {
        const zt_param_info *t = zt_gpt2_tensor(m, i);
        bool ln_weight = strstr(t->name, "ln_") && strstr(t->name, ".weight");
        for (size_t j = 0; j < t->numel; j++)
            p[t->offset + j] = (float)((ln_weight ? 1.0 : 0.0) + scale * zt_rng_normal(&r));
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

/* The config.json of Hugging Face's openai-community/gpt2-medium, plus fields transformers adds. */
static void test_config_hf_file(void **state)
{
    (void)state;
    const char *text =
        "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], \"attn_pdrop\": 0.1,"
        " \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256, \"initializer_range\": 0.02,"
        " \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 1024,"
        " \"n_head\": 16, \"n_layer\": 24, \"n_positions\": 1024, \"n_special\": 0, \"predict_special_tokens\": true,"
        " \"resid_pdrop\": 0.1, \"summary_activation\": null, \"summary_first_dropout\": 0.1,"
        " \"summary_proj_to_labels\": true, \"summary_type\": \"cls_index\", \"summary_use_proj\": true,"
        " \"task_specific_params\": {\"text-generation\": {\"do_sample\": true, \"max_length\": 50}},"
        " \"vocab_size\": 50257}";
    zt_gpt2_config c;
    zt_err err = {{0}};
    /* n_special / predict_special_tokens are not GPT-2 fields (they are OpenAI GPT's): refused. */
    assert_int_equal(parse_config(text, &c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "n_special"));

    const char *text2 =
        "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], \"attn_pdrop\": 0.1,"
        " \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256, \"initializer_range\": 0.02,"
        " \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 1024,"
        " \"n_head\": 16, \"n_layer\": 24, \"n_positions\": 1024, \"n_inner\": null,"
        " \"resid_pdrop\": 0.1, \"summary_activation\": null, \"summary_first_dropout\": 0.1,"
        " \"summary_proj_to_labels\": true, \"summary_type\": \"cls_index\", \"summary_use_proj\": true,"
        " \"task_specific_params\": {\"text-generation\": {\"do_sample\": true, \"max_length\": 50}},"
        " \"scale_attn_weights\": true, \"use_cache\": true, \"scale_attn_by_inverse_layer_idx\": false,"
        " \"reorder_and_upcast_attn\": false, \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\","
        " \"transformers_version\": \"4.46.3\", \"pruned_heads\": {}, \"add_cross_attention\": false,"
        " \"id2label\": {\"0\": \"LABEL_0\"}, \"_name_or_path\": \"gpt2-medium\", \"vocab_size\": 50257}";
    assert_int_equal(parse_config(text2, &c, &err), 0);
    assert_int_equal(c.n_layer, 24);
    assert_int_equal(c.n_head, 16);
    assert_int_equal(c.n_embd, 1024);
    assert_int_equal(c.n_positions, 1024);
    assert_int_equal(c.vocab_size, 50257);
    assert_true(c.layer_norm_epsilon == 1e-5f);
    assert_true(c.tie_word_embeddings);

    /* Absent fields keep their values; aliases map onto GPT-2's names. */
    assert_int_equal(parse_config("{\"num_hidden_layers\": 3, \"hidden_size\": 96}", &c, &err), 0);
    assert_int_equal(c.n_layer, 3);
    assert_int_equal(c.n_embd, 96);
    assert_int_equal(c.n_head, 12);
    assert_int_equal(parse_config("{\"n_layer\": 3, \"num_hidden_layers\": 4}", &c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "num_hidden_layers"));
    assert_int_equal(parse_config("{\"n_embd\": 64, \"n_head\": 4, \"n_inner\": 256}", &c, &err), 0);
}

static void test_config_unknown_key(void **state)
{
    (void)state;
    zt_gpt2_config c;
    zt_err err = {{0}};
    assert_int_equal(parse_config("{\"n_layer\": 2, \"n_layers\": 3}", &c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "n_layers"));
    assert_int_equal(parse_config("{\"rope_theta\": 10000}", &c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "rope_theta"));
}

static void test_config_head_divisibility(void **state)
{
    (void)state;
    zt_gpt2_config c;
    zt_err err = {{0}};
    assert_int_equal(parse_config("{\"n_embd\": 100, \"n_head\": 3}", &c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "divisible"));
    /* cfg is left as it was on error. */
    assert_int_equal(c.n_embd, 768);
    assert_int_equal(c.n_head, 12);
}

static void test_config_wrong_types(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"n_layer\": \"4\"}",
        "{\"n_layer\": 4.5}",
        "{\"n_head\": null}",
        "{\"layer_norm_epsilon\": \"1e-5\"}",
        "{\"tie_word_embeddings\": 1}",
        "{\"activation_function\": 3}",
        "{\"n_inner\": \"3072\"}",
        "{\"model_type\": [\"gpt2\"]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zt_gpt2_config c;
        zt_err err = {{0}};
        int rc = parse_config(bad[i], &c, &err);
        if (rc != ZT_EINVAL_CONFIG)
            fail_msg("%s was accepted (rc %d)", bad[i], rc);
        assert_true(strlen(err.msg) > 0);
    }
}

static void test_config_values(void **state)
{
    (void)state;
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"n_positions\": 1024, \"n_ctx\": 512}", "n_ctx"},
        {"{\"n_inner\": 1000}", "n_inner"},
        {"{\"activation_function\": \"relu\"}", "gelu_new"},
        {"{\"model_type\": \"llama\"}", "model_type"},
        {"{\"tie_word_embeddings\": false}", "tie_word_embeddings"},
        {"{\"scale_attn_weights\": false}", "scale_attn_weights"},
        {"{\"reorder_and_upcast_attn\": true}", "reorder_and_upcast_attn"},
        {"{\"scale_attn_by_inverse_layer_idx\": true}", "scale_attn_by_inverse_layer_idx"},
        {"{\"add_cross_attention\": true}", "add_cross_attention"},
        {"{\"pruned_heads\": {\"0\": [1]}}", "pruned_heads"},
        {"{\"n_layer\": 0}", "n_layer"},
        {"{\"n_layer\": 5000}", "n_layer"},
        {"{\"vocab_size\": 100000000}", "vocab_size"},
        {"{\"layer_norm_epsilon\": 0}", "layer_norm_epsilon"},
        {"{\"layer_norm_epsilon\": 1}", "layer_norm_epsilon"},
        {"{\"n_embd\": 8, \"n_head\": 16}", "n_head"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zt_gpt2_config c;
        zt_err err = {{0}};
        int rc = parse_config(bad[i].json, &c, &err);
        if (rc != ZT_EINVAL_CONFIG || !strstr(err.msg, bad[i].needle))
            fail_msg("%s: rc %d, message '%s' does not name %s", bad[i].json, rc, err.msg, bad[i].needle);
    }
    zt_gpt2_config c;
    zt_err err = {{0}};
    assert_int_equal(parse_config("{\"n_positions\": 512, \"n_ctx\": 512}", &c, &err), 0);
    assert_int_equal(c.n_positions, 512);
}

static void test_config_save_load(void **state)
{
    (void)state;
    char path[320];
    path_in_dir(path, sizeof path, "config.json");
    zt_gpt2_config a = tiny_config(), b;
    a.layer_norm_epsilon = 1e-6f;
    zt_err err = {{0}};
    assert_int_equal(zt_gpt2_config_save(&a, path, &err), 0);
    zt_gpt2_config_default(&b);
    if (zt_gpt2_config_load(&b, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(a.n_layer, b.n_layer);
    assert_int_equal(a.n_head, b.n_head);
    assert_int_equal(a.n_embd, b.n_embd);
    assert_int_equal(a.n_positions, b.n_positions);
    assert_int_equal(a.vocab_size, b.vocab_size);
    assert_true(a.layer_norm_epsilon == b.layer_norm_epsilon);
    assert_true(b.tie_word_embeddings);

    /* The file is a Hugging Face GPT-2 config. */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_non_null(strstr(text, "\"model_type\":\t\"gpt2\""));
    assert_non_null(strstr(text, "GPT2LMHeadModel"));
    assert_non_null(strstr(text, "\"layer_norm_epsilon\":\t1e-06"));

    assert_int_equal(zt_gpt2_config_load(&b, "/nonexistent/config.json", &err) < 0, 1);
    assert_non_null(strstr(err.msg, "/nonexistent/config.json"));
}

/* ---------------------------------------------------------------------------------------------------- */
/* layout and initialisation                                                                            */
/* ---------------------------------------------------------------------------------------------------- */

static void test_num_params_124m(void **state)
{
    (void)state;
    zt_gpt2_config c;
    zt_gpt2_config_default(&c);
    /* wte 50257*768 + wpe 1024*768 + 12 * (2*768 + 768*2304 + 2304 + 768*768 + 768 + 2*768 + 768*3072
     * + 3072 + 3072*768 + 768) + 2*768. */
    size_t expect = 50257u * 768 + 1024u * 768 +
                    12u * (2 * 768 + 768u * 2304 + 2304 + 768u * 768 + 768 + 2 * 768 + 768u * 3072 + 3072 +
                           3072u * 768 + 768) +
                    2 * 768;
    assert_int_equal(expect, 124439808);
    assert_int_equal(zt_gpt2_config_num_params(&c), 124439808);
}

static void test_layout(void **state)
{
    (void)state;
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *m = create_model(&c, 2, 6, 1);
    const int L = c.n_layer, C = c.n_embd;
    assert_int_equal(zt_gpt2_num_params(m), zt_gpt2_config_num_params(&c));
    assert_int_equal(zt_gpt2_num_tensors(m), 2 + 12 * L + 2);
    assert_int_equal(zt_gpt2_num_blocks(m), L + 2);

    /* Tensors tile the slab in order, and blocks tile it too. */
    size_t off = 0;
    for (int i = 0; i < zt_gpt2_num_tensors(m); i++) {
        const zt_param_info *t = zt_gpt2_tensor(m, i);
        assert_int_equal(t->offset, off);
        assert_int_equal(t->numel, (size_t)t->shape[0] * (t->ndim == 2 ? (size_t)t->shape[1] : 1));
        assert_int_equal(t->weight_decay, t->ndim == 2);
        off += t->numel;
        const zt_block_info *b = zt_gpt2_block(m, t->block);
        assert_true(t->offset >= b->offset && t->offset + t->numel <= b->offset + b->numel);
    }
    assert_int_equal(off, zt_gpt2_num_params(m));
    off = 0;
    for (int i = 0; i < zt_gpt2_num_blocks(m); i++) {
        assert_int_equal(zt_gpt2_block(m, i)->offset, off);
        off += zt_gpt2_block(m, i)->numel;
    }
    assert_int_equal(off, zt_gpt2_num_params(m));

    static const char *const names[12] = {
        "ln_1.weight",  "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias"};
    static const int64_t shapes[12][2] = {{1, 0}, {1, 0}, {3, 1}, {3, 0}, {1, 1}, {1, 0},
                                          {1, 0}, {1, 0}, {4, 1}, {4, 0}, {1, 4}, {1, 0}};
    assert_string_equal(zt_gpt2_tensor(m, 0)->name, "wte.weight");
    assert_int_equal(zt_gpt2_tensor(m, 0)->shape[0], c.vocab_size);
    assert_string_equal(zt_gpt2_tensor(m, 1)->name, "wpe.weight");
    assert_int_equal(zt_gpt2_tensor(m, 1)->shape[0], c.n_positions);
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 12; k++) {
            const zt_param_info *t = zt_gpt2_tensor(m, 2 + 12 * l + k);
            char want[64];
            snprintf(want, sizeof want, "h.%d.%s", l, names[k]);
            assert_string_equal(t->name, want);
            assert_int_equal(t->block, 1 + l);
            assert_int_equal(t->shape[0], shapes[k][0] * C);
            assert_int_equal(t->shape[1], shapes[k][1] * C);
            assert_int_equal(t->transposed_in_hf, t->ndim == 2);
        }
    }
    assert_string_equal(zt_gpt2_tensor(m, 2 + 12 * L)->name, "ln_f.weight");
    assert_string_equal(zt_gpt2_tensor(m, 3 + 12 * L)->name, "ln_f.bias");
    assert_int_equal(zt_gpt2_tensor(m, 3 + 12 * L)->block, L + 1);
    zt_gpt2_destroy(m);
}

static void test_init(void **state)
{
    (void)state;
    zt_gpt2_config c = tiny_config();
    c.n_embd = 64;
    c.n_head = 4;
    c.vocab_size = 300;
    zt_gpt2 *a = create_model(&c, 1, 4, 7), *b = create_model(&c, 2, 8, 7), *d = create_model(&c, 1, 4, 8);
    size_t n = zt_gpt2_num_params(a);
    /* The same seed gives the same parameters whatever the batch shape; another seed differs. */
    assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), n * sizeof(float));
    assert_memory_not_equal(zt_gpt2_params(a), zt_gpt2_params(d), n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        assert_true(zt_gpt2_grads(a)[i] == 0.0f);

    for (int i = 0; i < zt_gpt2_num_tensors(a); i++) {
        const zt_param_info *t = zt_gpt2_tensor(a, i);
        const float *x = zt_gpt2_params(a) + t->offset;
        if (t->ndim == 1) {
            float want = strstr(t->name, "ln_") && strstr(t->name, ".weight") ? 1.0f : 0.0f;
            for (size_t j = 0; j < t->numel; j++)
                assert_true(x[j] == want);
            continue;
        }
        double s = 0, s2 = 0;
        for (size_t j = 0; j < t->numel; j++) {
            s += x[j];
            s2 += (double)x[j] * x[j];
        }
        double mean = s / t->numel, sd = sqrt(s2 / t->numel - mean * mean);
        double want = strstr(t->name, "c_proj.weight") ? 0.02 / sqrt(2.0 * c.n_layer) : 0.02;
        /* 512+ samples per tensor: the sample deviation is within ~3% of the true one (1 sigma). */
        if (fabs(sd / want - 1.0) > 0.1 || fabs(mean) > 0.2 * want)
            fail_msg("%s: mean %g sd %g, expected sd %g", t->name, mean, sd, want);
    }
    zt_gpt2_destroy(a);
    zt_gpt2_destroy(b);
    zt_gpt2_destroy(d);

    zt_err err = {{0}};
    zt_gpt2 *m = NULL;
    c = tiny_config();
    assert_int_equal(zt_gpt2_create(&m, &c, 1, c.n_positions + 1, 1, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "n_positions"));
    assert_int_equal(zt_gpt2_create(&m, &c, 0, 4, 1, &err), ZT_EINVAL_CONFIG);
    c.n_head = 3;
    assert_int_equal(zt_gpt2_create(&m, &c, 1, 4, 1, &err), ZT_EINVAL_CONFIG);
    assert_null(m);
}

/* The initialisation's normals (every family's, worker/models/host_shared.c) are zt_rng_normal's, one by
 * one, whatever the thread count, and leave the generator where the one-by-one draws would. */
static void test_init_normals_threads(void **state)
{
    (void)state;
    const size_t ns[] = {1000, 65536, 100003, 300001};
    const int threads[] = {1, 2, 3, 7};
    const int before = zt_cpu_get_threads();
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const size_t n = ns[i];
        float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        zt_rng a;
        zt_rng_seed(&a, 100 + i);
        (void)zt_rng_u64(&a); /* an odd position in the stream */
        zt_rng start = a;
        for (size_t j = 0; j < n; j++)
            want[j] = (float)(0.02 * zt_rng_normal(&a));
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            zt_cpu_set_threads(threads[t]);
            zt_rng b = start;
            zt__host_fill_normal(&b, got, n, 0.02);
            assert_memory_equal(got, want, n * sizeof *got);
            assert_memory_equal(b.s, a.s, sizeof a.s);
        }
        free(want);
        free(got);
    }
    zt_cpu_set_threads(before);
}

/* ---------------------------------------------------------------------------------------------------- */
/* export and import                                                                                    */
/* ---------------------------------------------------------------------------------------------------- */

static void test_export_import_roundtrip(void **state)
{
    (void)state;
    char path[320];
    path_in_dir(path, sizeof path, "model.safetensors");
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *a = create_model(&c, 1, 4, 11), *b = create_model(&c, 1, 4, 12);
    randomise_params(a, 5, 0.5); /* every tensor non-trivial, biases and layer norms included */
    zt_err err = {{0}};
    if (zt_gpt2_export(a, path, &err) != 0)
        fail_msg("%s", err.msg);

    /* The file holds HF names, HF shapes, F32, format pt; Conv1D weights transposed. */
    zt_st_file *f = NULL;
    assert_int_equal(zt_st_open(path, &f, &err), 0);
    assert_int_equal(zt_st_count(f), (size_t)zt_gpt2_num_tensors(a));
    assert_string_equal(zt_st_metadata(f, "format"), "pt");
    assert_null(zt_st_find(f, "lm_head.weight"));
    const zt_st_tensor *qkv = zt_st_find(f, "transformer.h.1.attn.c_attn.weight");
    assert_non_null(qkv);
    assert_int_equal(qkv->dtype, ZT_DTYPE_F32);
    assert_int_equal(qkv->shape[0], c.n_embd);
    assert_int_equal(qkv->shape[1], 3 * c.n_embd);
    const zt_param_info *t = zt_gpt2_tensor(a, 2 + 12 + 2);
    assert_string_equal(t->name, "h.1.attn.c_attn.weight");
    const float *ours = zt_gpt2_params(a) + t->offset; /* [3C, C] */
    for (int o = 0; o < 3 * c.n_embd; o++)
        for (int i = 0; i < c.n_embd; i++) {
            float v;
            memcpy(&v, (const char *)qkv->data + 4 * ((size_t)i * 3 * c.n_embd + o), 4);
            assert_true(v == ours[(size_t)o * c.n_embd + i]);
        }
    const zt_st_tensor *wpe = zt_st_find(f, "transformer.wpe.weight");
    assert_non_null(wpe);
    assert_int_equal(wpe->shape[0], c.n_positions);
    zt_st_close(f);

    if (zt_gpt2_import(b, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), zt_gpt2_num_params(a) * sizeof(float));
    zt_gpt2_destroy(a);
    zt_gpt2_destroy(b);
}

/* How rewrite_file changes the tensors of an exported file. */
typedef struct rewrite_opts {
    const char *skip;      /* drop the tensor with this (file) name */
    const char *reshape;   /* write this tensor with its dimensions swapped / one element short */
    const char *extra;     /* add a tensor with this name */
    bool strip_prefix;     /* write names without "transformer." */
    bool add_lm_head;      /* add lm_head.weight = wte */
    bool lm_head_differs;  /* ... with one element changed */
    bool add_buffers;      /* add h.N.attn.bias and h.N.attn.masked_bias buffers */
    enum zt_dtype dtype;   /* F32, F16 or BF16 (F16: values must be exact in half precision) */
    bool int_dtype_on_wte; /* write wte as I32 */
} rewrite_opts;

/* Half-precision bits of x, which must be exactly representable (a normal half, a subnormal or 0). */
static uint16_t exact_f16(float x)
{
    uint16_t sign = x < 0 ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a == 0)
        return sign;
    int e;
    double mant = frexp(a, &e); /* a = mant * 2^e, mant in [0.5, 1) */
    if (e - 1 < -14) {          /* subnormal: a = k * 2^-24 */
        double k = ldexp(a, 24);
        assert_true(k == floor(k));
        return sign | (uint16_t)k;
    }
    double frac = ldexp(mant * 2.0 - 1.0, 10);
    assert_true(frac == floor(frac) && e - 1 <= 15);
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)frac;
}

/* Writes dst from the exported file src with the changes in o. */
static void rewrite_file(const char *src, const char *dst, const rewrite_opts *o)
{
    zt_err err = {{0}};
    zt_st_file *f = NULL;
    assert_int_equal(zt_st_open(src, &f, &err), 0);
    zt_st_writer *w = zt_st_writer_create();
    size_t n = zt_st_count(f);
    void **bufs = calloc(n + 4, sizeof *bufs);
    int nbuf = 0;
    static const float buffer_data[4] = {1, 1, 0, 1};
    for (size_t i = 0; i < n; i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        if (o->skip && strcmp(t->name, o->skip) == 0)
            continue;
        const char *name = t->name;
        if (o->strip_prefix && strncmp(name, "transformer.", 12) == 0)
            name += 12;
        int64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
        if (o->reshape && strcmp(t->name, o->reshape) == 0) {
            if (t->ndim == 2) {
                shape[0] = t->shape[1];
                shape[1] = t->shape[0];
                if (shape[0] == shape[1])
                    shape[0]--; /* square: make it one row short (data shrinks below) */
            } else {
                shape[0]--;
            }
        }
        size_t numel = (size_t)shape[0] * (t->ndim == 2 ? (size_t)shape[1] : 1);
        const float *x = t->data;
        enum zt_dtype dtype = o->dtype;
        if (o->int_dtype_on_wte && strstr(t->name, "wte"))
            dtype = ZT_DTYPE_I32;
        const void *data = t->data;
        if (dtype == ZT_DTYPE_F16 || dtype == ZT_DTYPE_BF16) {
            uint16_t *h = malloc(numel * 2);
            for (size_t j = 0; j < numel; j++) {
                float v;
                memcpy(&v, x + j, 4);
                if (dtype == ZT_DTYPE_F16) {
                    h[j] = exact_f16(v);
                } else {
                    uint32_t bits;
                    memcpy(&bits, &v, 4);
                    h[j] = (uint16_t)(bits >> 16);
                }
            }
            bufs[nbuf++] = h;
            data = h;
        }
        assert_int_equal(zt_st_writer_add(w, name, dtype, t->ndim, shape, data, &err), 0);
    }
    const zt_st_tensor *wte = zt_st_find(f, "transformer.wte.weight");
    if (o->add_lm_head) {
        float *copy = malloc(wte->nbytes);
        memcpy(copy, wte->data, wte->nbytes);
        if (o->lm_head_differs)
            copy[3] += 1.0f;
        bufs[nbuf++] = copy;
        assert_int_equal(zt_st_writer_add(w, "lm_head.weight", ZT_DTYPE_F32, 2, wte->shape, copy, &err), 0);
    }
    if (o->add_buffers) {
        int64_t shape[2] = {2, 2};
        assert_int_equal(zt_st_writer_add(w, "transformer.h.0.attn.bias", ZT_DTYPE_F32, 2, shape, buffer_data, &err),
                         0);
        assert_int_equal(zt_st_writer_add(w, "h.1.attn.masked_bias", ZT_DTYPE_F32, 1, shape, buffer_data, &err), 0);
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

/* Hugging Face's sharded form: model.safetensors.index.json maps every tensor to one of several files;
 * the index, or the directory holding it, imports the same weights as the single file. A bad index, a
 * shard outside the folder and a missing shard are refused with the model unchanged. */
static void test_import_sharded(void **state)
{
    (void)state;
    char src[320], idx[320], s0[320], s1[320];
    path_in_dir(src, sizeof src, "whole.safetensors");
    path_in_dir(idx, sizeof idx, "model.safetensors.index.json");
    path_in_dir(s0, sizeof s0, "model-00001-of-00002.safetensors");
    path_in_dir(s1, sizeof s1, "model-00002-of-00002.safetensors");
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
    randomise_params(a, 11, 0.5);
    const size_t bytes = zt_gpt2_num_params(a) * sizeof(float);
    zt_err err = {{0}};
    assert_int_equal(zt_gpt2_export(a, src, &err), 0);

    /* tensors alternate between the two shards */
    zt_st_file *f = NULL;
    assert_int_equal(zt_st_open(src, &f, &err), 0);
    zt_st_writer *w[2] = {zt_st_writer_create(), zt_st_writer_create()};
    FILE *ix = fopen(idx, "w");
    assert_non_null(ix);
    fputs("{\"metadata\": {\"total_size\": 0}, \"weight_map\": {", ix);
    for (size_t i = 0; i < zt_st_count(f); i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        assert_int_equal(zt_st_writer_add(w[i % 2], t->name, t->dtype, t->ndim, t->shape, t->data, &err), 0);
        fprintf(ix, "%s\"%s\": \"model-0000%zu-of-00002.safetensors\"", i ? ", " : "", t->name, i % 2 + 1);
    }
    fputs("}}\n", ix);
    fclose(ix);
    assert_int_equal(zt_st_writer_write(w[0], s0, &err), 0);
    assert_int_equal(zt_st_writer_write(w[1], s1, &err), 0);
    zt_st_writer_destroy(w[0]);
    zt_st_writer_destroy(w[1]);
    zt_st_close(f);
    unlink(src); /* the directory holds only the shards and their index */

    if (zt_gpt2_import(b, idx, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), bytes);
    zt_gpt2_destroy(b);
    b = create_model(&c, 1, 4, 3);
    if (zt_gpt2_import(b, g_dir, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), bytes);

    float *before = malloc(bytes);
    memcpy(before, zt_gpt2_params(b), bytes);
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"not json", "weight_map"},
        {"{\"weight_map\": {\"wte.weight\": \"../x.safetensors\"}}", "in the index's folder"},
        {"{\"weight_map\": {\"wte.weight\": \"model-00003-of-00002.safetensors\"}}", "model-00003-of-00002"},
        {"{\"weight_map\": {\"wte.weight\": \"model-00001-of-00002.safetensors\"}}", "is missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ix = fopen(idx, "w");
        fputs(bad[i].text, ix);
        fclose(ix);
        memset(&err, 0, sizeof err);
        if (zt_gpt2_import(b, idx, &err) == 0 || !strstr(err.msg, bad[i].needle))
            fail_msg("case %zu: message '%s' does not name '%s'", i, err.msg, bad[i].needle);
        assert_memory_equal(zt_gpt2_params(b), before, bytes);
    }
    free(before);
    zt_gpt2_destroy(a);
    zt_gpt2_destroy(b);
}

static void test_import_variants(void **state)
{
    (void)state;
    char src[320], dst[320];
    path_in_dir(src, sizeof src, "a.safetensors");
    path_in_dir(dst, sizeof dst, "b.safetensors");
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
    randomise_params(a, 9, 0.5);
    const size_t bytes = zt_gpt2_num_params(a) * sizeof(float);
    zt_err err = {{0}};
    assert_int_equal(zt_gpt2_export(a, src, &err), 0);

    /* Names without the prefix, a tied lm_head.weight and HF's attention-mask buffers are accepted. */
    rewrite_opts o = {.strip_prefix = true, .add_lm_head = true, .add_buffers = true, .dtype = ZT_DTYPE_F32};
    rewrite_file(src, dst, &o);
    if (zt_gpt2_import(b, dst, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), bytes);

    /* BF16: every value is the top half of the float. */
    rewrite_opts bf = {.dtype = ZT_DTYPE_BF16};
    rewrite_file(src, dst, &bf);
    if (zt_gpt2_import(b, dst, &err) != 0)
        fail_msg("%s", err.msg);
    for (size_t i = 0; i < zt_gpt2_num_params(a); i++) {
        uint32_t bits;
        memcpy(&bits, &zt_gpt2_params(a)[i], 4);
        bits &= 0xffff0000u;
        float want;
        memcpy(&want, &bits, 4);
        assert_true(zt_gpt2_params(b)[i] == want);
    }

    /* F16: parameters set to values that half precision holds exactly, subnormals included. */
    float *p = zt_gpt2_params(a);
    zt_rng r;
    zt_rng_seed(&r, 3);
    for (size_t i = 0; i < zt_gpt2_num_params(a); i++) {
        int k = (int)zt_rng_below(&r, 2049) - 1024;
        p[i] = (i % 7 == 0) ? ldexpf((float)k, -24) : ldexpf((float)k, -9);
    }
    assert_int_equal(zt_gpt2_export(a, src, &err), 0);
    rewrite_opts h = {.dtype = ZT_DTYPE_F16};
    rewrite_file(src, dst, &h);
    if (zt_gpt2_import(b, dst, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_gpt2_params(a), zt_gpt2_params(b), bytes);
    zt_gpt2_destroy(a);
    zt_gpt2_destroy(b);
}

static void test_import_errors_leave_model_unchanged(void **state)
{
    (void)state;
    char src[320], dst[320];
    path_in_dir(src, sizeof src, "a.safetensors");
    path_in_dir(dst, sizeof dst, "b.safetensors");
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *a = create_model(&c, 1, 4, 1), *b = create_model(&c, 1, 4, 2);
    const size_t bytes = zt_gpt2_num_params(b) * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, zt_gpt2_params(b), bytes);
    zt_err err = {{0}};
    assert_int_equal(zt_gpt2_export(a, src, &err), 0);

    static const struct {
        rewrite_opts o;
        const char *needle;
    } cases[] = {
        /* The missing tensor comes last in the file, so everything else was converted already. */
        {{.skip = "transformer.ln_f.bias"}, "ln_f.bias"},
        {{.skip = "transformer.h.1.mlp.c_fc.weight"}, "h.1.mlp.c_fc.weight"},
        {{.reshape = "transformer.h.0.attn.c_attn.weight"}, "h.0.attn.c_attn.weight"},
        {{.reshape = "transformer.h.1.attn.c_proj.weight"}, "h.1.attn.c_proj.weight"},
        {{.reshape = "transformer.ln_f.weight"}, "ln_f.weight"},
        {{.extra = "transformer.h.2.ln_1.weight"}, "h.2.ln_1.weight"},
        {{.extra = "score.weight"}, "score.weight"},
        {{.add_lm_head = true, .lm_head_differs = true}, "'lm_head.weight' differs from 'wte.weight'"},
        {{.int_dtype_on_wte = true}, "I32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite_file(src, dst, &cases[i].o);
        memset(&err, 0, sizeof err);
        int rc = zt_gpt2_import(b, dst, &err);
        if (rc == 0 || !strstr(err.msg, cases[i].needle))
            fail_msg("case %zu: rc %d, message '%s' does not name '%s'", i, rc, err.msg, cases[i].needle);
        assert_memory_equal(zt_gpt2_params(b), before, bytes);
    }
    /* A tensor with a NaN is refused. */
    zt_gpt2_params(a)[zt_gpt2_num_params(a) - 1] = NAN;
    assert_int_equal(zt_gpt2_export(a, src, &err), 0);
    assert_int_equal(zt_gpt2_import(b, src, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "ln_f.bias"));
    assert_memory_equal(zt_gpt2_params(b), before, bytes);
    /* A missing file. */
    assert_true(zt_gpt2_import(b, "/nonexistent/model.safetensors", &err) < 0);
    assert_memory_equal(zt_gpt2_params(b), before, bytes);
    /* A model of another shape. */
    zt_gpt2_config c3 = c;
    c3.n_layer = 3;
    zt_gpt2 *d = create_model(&c3, 1, 4, 3);
    assert_int_equal(zt_gpt2_export(d, dst, &err), 0);
    assert_int_equal(zt_gpt2_import(b, dst, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "h.2."));
    assert_memory_equal(zt_gpt2_params(b), before, bytes);
    free(before);
    zt_gpt2_destroy(a);
    zt_gpt2_destroy(b);
    zt_gpt2_destroy(d);
}

/* ---------------------------------------------------------------------------------------------------- */
/* forward and backward                                                                                 */
/* ---------------------------------------------------------------------------------------------------- */

/* Mean cross-entropy of the model's logits over non-ignored targets, computed in double here. */
static double loss_from_logits(zt_gpt2 *m, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    const int V = zt_gpt2_get_config(m)->vocab_size;
    zt_gpt2_forward(m, tokens, NULL, B, T);
    const float *logits = zt_gpt2_logits(m);
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

static void test_forward_shapes_and_loss(void **state)
{
    (void)state;
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *big = create_model(&c, 3, 8, 4), *small = create_model(&c, 2, 5, 4);
    randomise_params(big, 1, 0.3);
    randomise_params(small, 1, 0.3);
    int32_t tokens[10] = {1, 2, 3, 4, 5, 10, 9, 8, 7, 6};
    int32_t targets[10] = {2, 3, 4, 5, 6, -1, 8, 7, 6, 5};
    /* A model created for larger batches gives the same result on a smaller one. */
    float lb = zt_gpt2_forward(big, tokens, targets, 2, 5);
    float ls = zt_gpt2_forward(small, tokens, targets, 2, 5);
    assert_true(lb == ls);
    assert_memory_equal(zt_gpt2_logits(big), zt_gpt2_logits(small), 10 * c.vocab_size * sizeof(float));
    /* The loss is the mean over the 9 non-ignored positions. */
    double ref = loss_from_logits(small, tokens, targets, 2, 5);
    assert_true(fabs(ls - ref) < 1e-5 * ref);
    /* Causality: changing the last token of a row changes no earlier logit of that row. */
    zt_gpt2_forward(small, tokens, NULL, 2, 5);
    float *before = malloc(10 * c.vocab_size * sizeof(float));
    memcpy(before, zt_gpt2_logits(small), 10 * c.vocab_size * sizeof(float));
    tokens[4] = 0;
    zt_gpt2_forward(small, tokens, NULL, 2, 5);
    assert_memory_equal(before, zt_gpt2_logits(small), 4 * c.vocab_size * sizeof(float));
    assert_memory_not_equal(before + 4 * c.vocab_size, zt_gpt2_logits(small) + 4 * c.vocab_size,
                            c.vocab_size * sizeof(float));
    /* Every target ignored: loss 0 and no gradient. */
    int32_t none[10];
    for (int i = 0; i < 10; i++)
        none[i] = -1;
    zt_gpt2_zero_grad(small);
    assert_true(zt_gpt2_forward(small, tokens, none, 2, 5) == 0.0f);
    zt_gpt2_backward(small, 1.0f);
    for (size_t i = 0; i < zt_gpt2_num_params(small); i++)
        assert_true(zt_gpt2_grads(small)[i] == 0.0f);
    free(before);
    zt_gpt2_destroy(big);
    zt_gpt2_destroy(small);
}

static void test_backward_accumulates(void **state)
{
    (void)state;
    zt_gpt2_config c = tiny_config();
    zt_gpt2 *m = create_model(&c, 2, 6, 4);
    randomise_params(m, 2, 0.3);
    int32_t tokens[12], targets[12];
    for (int i = 0; i < 12; i++) {
        tokens[i] = (i * 7 + 3) % c.vocab_size;
        targets[i] = (i * 5 + 1) % c.vocab_size;
    }
    const size_t n = zt_gpt2_num_params(m);
    float *g1 = malloc(n * sizeof(float));
    zt_gpt2_zero_grad(m);
    zt_gpt2_forward(m, tokens, targets, 2, 6);
    zt_gpt2_backward(m, 1.0f);
    memcpy(g1, zt_gpt2_grads(m), n * sizeof(float));
    /* A second forward/backward adds the same gradient again (up to rounding: kernels add their partial
     * sums into a non-zero gradient now); loss_scale 2 doubles it exactly. */
    zt_gpt2_forward(m, tokens, targets, 2, 6);
    zt_gpt2_backward(m, 1.0f);
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(zt_gpt2_grads(m)[i] - 2.0f * g1[i]) <= 1e-5f * fabsf(g1[i]) + 1e-8f);
    zt_gpt2_zero_grad(m);
    zt_gpt2_forward(m, tokens, targets, 2, 6);
    zt_gpt2_backward(m, 2.0f);
    for (size_t i = 0; i < n; i++)
        assert_true(zt_gpt2_grads(m)[i] == 2.0f * g1[i]);
    /* Rows of wpe beyond T get no gradient. */
    const zt_param_info *wpe = zt_gpt2_tensor(m, 1);
    for (size_t i = 6 * (size_t)c.n_embd; i < wpe->numel; i++)
        assert_true(zt_gpt2_grads(m)[wpe->offset + i] == 0.0f);
    free(g1);
    zt_gpt2_destroy(m);
}

/* Central differences of the whole model's loss against the backward pass, on ~50 entries of every
 * tensor. The loss is evaluated in double from the float logits. The float forward pass still rounds the
 * loss by ~3e-7, which puts ~1.5e-4/eps of noise on every difference: with eps = 1e-3 that alone is 15%
 * of a 1e-3 gradient, so eps is 1e-2, where noise and truncation error both stay below 1%. */
static void test_gradient_check(void **state)
{
    (void)state;
    zt_gpt2_config c = tiny_config();
    const int B = 2, T = 6;
    zt_gpt2 *m = create_model(&c, B, T, 4);
    randomise_params(m, 77, 0.3);
    int32_t tokens[12] = {1, 4, 2, 9, 10, 0, 3, 3, 7, 5, 6, 8};
    int32_t targets[12] = {4, 2, 9, 10, 0, 6, 3, -1, 5, 6, 8, 1};
    zt_gpt2_zero_grad(m);
    float loss = zt_gpt2_forward(m, tokens, targets, B, T);
    double ref = loss_from_logits(m, tokens, targets, B, T);
    assert_true(fabs(loss - ref) < 1e-5 * ref);
    zt_gpt2_forward(m, tokens, targets, B, T);
    zt_gpt2_backward(m, 1.0f);

    float *p = zt_gpt2_params(m);
    const float *g = zt_gpt2_grads(m);
    const float eps = 1e-2f;
    zt_rng r;
    zt_rng_seed(&r, 123);
    int checked = 0, large = 0;
    double worst_rel = 0, worst_abs = 0;
    for (int i = 0; i < zt_gpt2_num_tensors(m); i++) {
        const zt_param_info *t = zt_gpt2_tensor(m, i);
        int count = t->numel < 50 ? (int)t->numel : 50;
        for (int k = 0; k < count; k++) {
            size_t j = t->offset + (t->numel <= 50 ? (size_t)k : zt_rng_below(&r, t->numel));
            float saved = p[j];
            p[j] = saved + eps;
            double lp = loss_from_logits(m, tokens, targets, B, T);
            p[j] = saved - eps;
            double lm = loss_from_logits(m, tokens, targets, B, T);
            p[j] = saved;
            double num = (lp - lm) / (2.0 * ((double)(saved + eps) - (double)saved));
            double ana = g[j];
            double diff = fabs(num - ana);
            checked++;
            if (fabs(ana) > 1e-3 || fabs(num) > 1e-3) {
                large++;
                double rel = diff / fmax(fabs(num), fabs(ana));
                worst_rel = fmax(worst_rel, rel);
                if (rel > 2e-2)
                    fail_msg("%s[%zu]: backward %.6g, finite difference %.6g", t->name, j - t->offset, ana, num);
            } else {
                worst_abs = fmax(worst_abs, diff);
                if (diff > 1e-4)
                    fail_msg("%s[%zu]: backward %.6g, finite difference %.6g", t->name, j - t->offset, ana, num);
            }
        }
    }
    print_message("gradient check: %d entries, %d with |g| > 1e-3, worst relative error %.3g, worst absolute "
                  "error of small ones %.3g\n",
                  checked, large, worst_rel, worst_abs);
    assert_true(large > checked / 2); /* the check is not vacuous */
    zt_gpt2_destroy(m);
}

/* Plain SGD on one fixed batch drives the loss close to 0: the model can learn. */
static void test_sgd_learns(void **state)
{
    (void)state;
    zt_gpt2_config c = tiny_config();
    c.n_embd = 32;
    c.n_head = 4;
    c.vocab_size = 16;
    c.n_positions = 16;
    const int B = 2, T = 12;
    zt_gpt2 *m = create_model(&c, B, T, 42);
    int32_t tokens[24], targets[24];
    /* Each row is a walk over the vocabulary; the next token depends on the current one and the row. */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T + 1; t++) {
            int tok = (b == 0) ? (3 * t + 1) % 16 : (5 * t + 2) % 16;
            if (t < T)
                tokens[b * T + t] = tok;
            if (t > 0)
                targets[b * T + t - 1] = tok;
        }
    const size_t n = zt_gpt2_num_params(m);
    float first = 0, loss = 0;
    const float lr = 0.1f;
    for (int step = 0; step < 300; step++) {
        zt_gpt2_zero_grad(m);
        loss = zt_gpt2_forward(m, tokens, targets, B, T);
        if (step == 0)
            first = loss;
        zt_gpt2_backward(m, 1.0f);
        float *p = zt_gpt2_params(m);
        const float *g = zt_gpt2_grads(m);
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * g[i];
    }
    print_message("SGD: loss %.4f -> %.4f after 300 steps\n", first, loss);
    assert_true(first > 2.0f);
    assert_true(loss < 0.05f);
    zt_gpt2_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_hf_file),
        cmocka_unit_test(test_config_unknown_key),
        cmocka_unit_test(test_config_head_divisibility),
        cmocka_unit_test(test_config_wrong_types),
        cmocka_unit_test(test_config_values),
        cmocka_unit_test_setup_teardown(test_config_save_load, make_dir, remove_dir),
        cmocka_unit_test(test_num_params_124m),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_init_normals_threads),
        cmocka_unit_test_setup_teardown(test_export_import_roundtrip, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_variants, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_sharded, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_import_errors_leave_model_unchanged, make_dir, remove_dir),
        cmocka_unit_test(test_forward_shapes_and_loss),
        cmocka_unit_test(test_backward_accumulates),
        cmocka_unit_test(test_gradient_check),
        cmocka_unit_test(test_sgd_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
