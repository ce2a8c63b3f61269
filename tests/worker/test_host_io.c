/* The import of Hugging Face weights in steps (worker/models/family.h: zt_family_model_import_open,
 * zt_family_import_fill_through, zt_family_import_close), as a run whose engine takes a lazily created model's
 * blocks one by one uses it: for every family the model filled block by block holds the bits of the whole import
 * (zt_family_model_import into a model initialised at once), a pretrained body's task head included; and every
 * bad input is refused by the open with zt_family_model_import's message, before anything is written. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/rng.h"
#include "common/safetensors.h"
#include "worker/models/family.h"

#include "train_fixture.h" /* the temporary folder */

static char g_dir[256];

static int make_dir(void **state)
{
    (void)state;
    return zt_fixture_make_dir(g_dir, sizeof g_dir, "zt_test_host_io_");
}

static int remove_dir(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

/* A model of the config json, created at once or lazily (its slab then filled with a marker, so that what the
 * open must not write is seen). */
static zt_family_model *model_of(const char *json, bool lazy, uint64_t seed)
{
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    zt_family_config c;
    zt_err err = {{0}};
    if (zt_family_config_from_json(&c, o, "test", &err) < 0)
        fail_msg("%s: %s", json, err.msg);
    cJSON_Delete(o);
    zt_family_model *m = NULL;
    if ((lazy ? zt_family_model_create_lazy : zt_family_model_create)(&m, &c, 1, 4, seed, &err) < 0)
        fail_msg("%s: %s", json, err.msg);
    if (lazy)
        for (size_t i = 0; i < zt_family_model_num_params(m); i++)
            zt_family_model_params(m)[i] = -7.0f;
    return m;
}

/* Every parameter a different value, biases and norms included. */
static void randomise(zt_family_model *m, uint64_t seed)
{
    zt_rng r;
    zt_rng_seed(&r, seed);
    for (size_t i = 0; i < zt_family_model_num_params(m); i++)
        zt_family_model_params(m)[i] = (float)(0.5 * zt_rng_normal(&r));
}

static int num_blocks(const zt_family_model *m)
{
    return zt_family_model_tensor(m, zt_family_model_num_tensors(m) - 1)->block + 1;
}

/* The engine's order on a lazy model: each block made from the family's initialisation, then the files' values.
 * The initialisation leaves out exactly the tensors the files write: after it, a tensor of the block either still
 * holds the marker and the fill writes it, or holds its initial values and the fill leaves them. */
static void import_lazily(zt_family_model *m, const char *path)
{
    zt_family_import *imp = NULL;
    zt_err err = {{0}};
    if (zt_family_model_import_open(m, path, &imp, &err) < 0)
        fail_msg("open %s: %s", path, err.msg);
    const int n = zt_family_model_num_tensors(m);
    const size_t P = zt_family_model_num_params(m);
    float *before = malloc(P * sizeof *before);
    for (int b = 0; b < num_blocks(m); b++) {
        zt_family_model_init_through(m, b);
        memcpy(before, zt_family_model_params(m), P * sizeof *before);
        zt_family_import_fill_through(imp, b);
        zt_family_import_fill_through(imp, b); /* again: nothing more */
        for (int i = 0; i < n; i++) {
            const zt_param_info *t = zt_family_model_tensor(m, i);
            if (t->block != b)
                continue;
            bool marker = true, written = false;
            for (size_t j = 0; j < t->numel; j++) {
                marker = marker && before[t->offset + j] == -7.0f;
                written = written || memcmp(&before[t->offset + j], &zt_family_model_params(m)[t->offset + j],
                                            sizeof(float)) != 0;
            }
            if (marker != written)
                fail_msg("%s: tensor %s was %s by the initialisation and %s by the files", path, t->name,
                         marker ? "left" : "made", written ? "written" : "not written");
        }
    }
    free(before);
    zt_family_import_close(imp);
}

/* path imported eagerly into a model of seed 2 and lazily into another: the same bits; returns the eager one. */
static zt_family_model *both_ways(const char *json, const char *path)
{
    zt_family_model *eager = model_of(json, false, 2), *lazy = model_of(json, true, 2);
    zt_err err = {{0}};
    if (zt_family_model_import(eager, path, &err) < 0)
        fail_msg("%s: %s", path, err.msg);
    import_lazily(lazy, path);
    assert_memory_equal(zt_family_model_params(eager), zt_family_model_params(lazy),
                        zt_family_model_num_params(eager) * sizeof(float));
    zt_family_model_destroy(lazy);
    return eager;
}

static const char *const configs[] = {
    /* Conv1D weights transposed in the files, a tied head */
    "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, "
    "\"vocab_size\": 40}",
    "{\"model_type\": \"llama\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 50, \"tie_word_embeddings\": false}",
    "{\"model_type\": \"qwen2\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 50, \"tie_word_embeddings\": true}",
    /* query_key_value's rows reordered */
    "{\"model_type\": \"gpt_neox\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 2, \"vocab_size\": 50, \"max_position_embeddings\": 32, \"rotary_pct\": 0.5}",
    "{\"model_type\": \"bert\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"vocab_size\": 50, \"max_position_embeddings\": 32, "
    "\"architectures\": [\"BertForMaskedLM\"]}",
    "{\"model_type\": \"roberta\", \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"vocab_size\": 50, \"max_position_embeddings\": 40, \"num_labels\": 3, "
    "\"architectures\": [\"RobertaForSequenceClassification\"]}",
    "{\"model_type\": \"t5\", \"vocab_size\": 40, \"d_model\": 16, \"d_kv\": 4, \"d_ff\": 24, \"num_layers\": 2, "
    "\"num_decoder_layers\": 3, \"num_heads\": 2, \"feed_forward_proj\": \"gated-gelu\", "
    "\"tie_word_embeddings\": false}",
};

/* Each family's export, in one file and in shards, imported both ways: the exported model's bits. */
static void test_lazy_fill_equals_import(void **state)
{
    (void)state;
    char file[300], dir[300];
    path_in_dir(file, sizeof file, "model.safetensors");
    path_in_dir(dir, sizeof dir, "sharded");
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        zt_family_model *src = model_of(configs[k], false, 1);
        randomise(src, 100 + k);
        zt_err err = {{0}};
        const size_t bytes = zt_family_model_num_params(src) * sizeof(float);
        assert_int_equal(zt_family_model_export(src, file, &err), 0);
        zt_family_model *got = both_ways(configs[k], file);
        assert_memory_equal(zt_family_model_params(got), zt_family_model_params(src), bytes);
        zt_family_model_destroy(got);
        assert_int_equal(zt_family_model_export_sharded(src, dir, bytes / 3, &err), 0); /* a few shards */
        got = both_ways(configs[k], dir);
        assert_memory_equal(zt_family_model_params(got), zt_family_model_params(src), bytes);
        zt_family_model_destroy(got);
        zt_family_model_destroy(src);
    }
}

/* A model of json (seed 1) with random parameters (seed), exported into <dir>/a.safetensors (src); dst is
 * <dir>/b.safetensors, for rewrites. */
static zt_family_model *exported(const char *json, uint64_t seed, char *src, char *dst, size_t cap)
{
    path_in_dir(src, cap, "a.safetensors");
    path_in_dir(dst, cap, "b.safetensors");
    zt_family_model *m = model_of(json, false, 1);
    randomise(m, seed);
    zt_err err = {{0}};
    if (zt_family_model_export(m, src, &err) < 0)
        fail_msg("%s", err.msg);
    return m;
}

/* How rewrite changes the tensors of an exported file (names as in the file). */
typedef struct edit {
    const char *drop;      /* leave this tensor out */
    const char *reshape;   /* write it with its dimensions swapped (one row short if square) or one element short */
    const char *extra;     /* add a tensor under this name (a copy of the first) */
    const char *twice;     /* write this tensor once more under the name without its first prefix ("transformer.") */
    const char *nan_in;    /* set elements nan_at[0] and nan_at[1] of this tensor to NaN */
    long nan_at[2];
    const char *int_dtype; /* write this tensor as I32 */
    const char *tie, *tie_to; /* add tensor `tie` as a copy of tensor tie_to, one element changed with tie_differs */
    bool tie_differs;
    bool bf16;             /* every tensor in BF16 (its top half) */
} edit;

/* Writes dst from the exported file src with the changes in e. */
static void rewrite(const char *src, const char *dst, const edit *e)
{
    zt_err err = {{0}};
    zt_st_file *f = NULL;
    assert_int_equal(zt_st_open(src, &f, &err), 0);
    zt_st_writer *w = zt_st_writer_create();
    const size_t n = zt_st_count(f);
    void **copies = calloc(n + 4, sizeof *copies);
    int ncopies = 0;
    for (size_t i = 0; i < n; i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        if (e->drop && strcmp(t->name, e->drop) == 0)
            continue;
        int64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
        if (e->reshape && strcmp(t->name, e->reshape) == 0) {
            if (t->ndim == 2) {
                shape[0] = t->shape[1];
                shape[1] = t->shape[0];
                if (shape[0] == shape[1])
                    shape[0]--;
            } else {
                shape[0]--;
            }
        }
        const size_t numel = (size_t)shape[0] * (t->ndim == 2 ? (size_t)shape[1] : 1);
        float *x = malloc(t->nbytes);
        memcpy(x, t->data, t->nbytes);
        copies[ncopies++] = x;
        if (e->nan_in && strcmp(t->name, e->nan_in) == 0)
            x[e->nan_at[0]] = x[e->nan_at[1]] = NAN;
        enum zt_dtype dtype = e->int_dtype && strcmp(t->name, e->int_dtype) == 0 ? ZT_DTYPE_I32 : ZT_DTYPE_F32;
        if (e->bf16) {
            uint16_t *h = (uint16_t *)x; /* in place: element j's top half into slot j */
            for (size_t j = 0; j < numel; j++) {
                uint32_t bits;
                memcpy(&bits, x + j, 4);
                h[j] = (uint16_t)(bits >> 16);
            }
            dtype = ZT_DTYPE_BF16;
        }
        assert_int_equal(zt_st_writer_add(w, t->name, dtype, t->ndim, shape, x, &err), 0);
        if (e->twice && strcmp(t->name, e->twice) == 0)
            assert_int_equal(zt_st_writer_add(w, strchr(t->name, '.') + 1, dtype, t->ndim, shape, x, &err), 0);
    }
    if (e->extra) {
        const zt_st_tensor *t = zt_st_get(f, 0);
        assert_int_equal(zt_st_writer_add(w, e->extra, t->dtype, t->ndim, t->shape, t->data, &err), 0);
    }
    if (e->tie) {
        const zt_st_tensor *t = zt_st_find(f, e->tie_to);
        assert_non_null(t);
        float *x = malloc(t->nbytes);
        memcpy(x, t->data, t->nbytes);
        copies[ncopies++] = x;
        if (e->tie_differs)
            x[t->nbytes / sizeof(float) - 1] += 1.0f;
        assert_int_equal(zt_st_writer_add(w, e->tie, ZT_DTYPE_F32, t->ndim, t->shape, x, &err), 0);
    }
    assert_int_equal(zt_st_writer_write(w, dst, &err), 0);
    zt_st_writer_destroy(w);
    for (int i = 0; i < ncopies; i++)
        free(copies[i]);
    free(copies);
    zt_st_close(f);
}

/* Files rewritten from an export (BF16, a tied head written out, buffers' neighbours) still import both ways. */
static void test_lazy_fill_rewritten(void **state)
{
    (void)state;
    char src[300], dst[300];
    zt_family_model *m = exported(configs[0], 7, src, dst, sizeof src);
    rewrite(src, dst, &(edit){.bf16 = true});
    zt_family_model_destroy(both_ways(configs[0], dst));
    rewrite(src, dst, &(edit){.tie = "lm_head.weight", .tie_to = "transformer.wte.weight"});
    zt_family_model *got = both_ways(configs[0], dst);
    assert_memory_equal(zt_family_model_params(got), zt_family_model_params(m),
                        zt_family_model_num_params(m) * sizeof(float));
    zt_family_model_destroy(got);
    zt_family_model_destroy(m);
}

/* A pretrained body into a model with another head: the head the files lack keeps the family's initialisation (the
 * lazy fill makes it before it writes the block), the other head's tensors are skipped; a tied tensor whose target
 * the files lack is compared with that initialisation, by the open, before the lazy model has made it. */
static void test_lazy_fill_pretrained_head(void **state)
{
    (void)state;
    static const char *const mlm = "{\"model_type\": \"bert\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                                   "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 50, "
                                   "\"max_position_embeddings\": 32, \"architectures\": [\"BertForMaskedLM\"]}";
    static const char *const cls = "{\"model_type\": \"bert\", \"hidden_size\": 16, \"intermediate_size\": 24, "
                                   "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 50, "
                                   "\"max_position_embeddings\": 32, \"num_labels\": 3, "
                                   "\"architectures\": [\"BertForSequenceClassification\"]}";
    char src[300], dst[300];
    zt_err err = {{0}};
    for (int way = 0; way < 2; way++) { /* a masked-LM file into a classifier, and back */
        const char *from = way ? cls : mlm, *into = way ? mlm : cls;
        zt_family_model *m = exported(from, 9, src, dst, sizeof src), *fresh = model_of(into, false, 2);
        zt_family_model *got = both_ways(into, src);
        const int last = num_blocks(got) - 1;
        for (int i = 0; i < zt_family_model_num_tensors(got); i++) { /* body from the file, head initialised */
            const zt_param_info *t = zt_family_model_tensor(got, i);
            const zt_family_model *want = t->block == last ? fresh : m;
            const zt_param_info *wt = t->block == last ? t : zt_family_model_tensor(m, i);
            assert_string_equal(t->name, wt->name);
            assert_memory_equal(zt_family_model_params(got) + t->offset, zt_family_model_params((zt_family_model *)want)
                                + wt->offset, t->numel * sizeof(float));
        }
        zt_family_model_destroy(got);
        zt_family_model_destroy(fresh);
        zt_family_model_destroy(m);
    }
    /* cls.predictions.decoder.bias without cls.predictions.bias: equal to the bias's initialisation it is accepted,
     * else refused, by the eager import and the lazy open alike */
    zt_family_model *m = model_of(mlm, false, 1), *fresh = model_of(mlm, false, 2);
    randomise(m, 10);
    const zt_param_info *bias = zt_family_model_tensor(m, zt_family_model_num_tensors(m) - 1);
    assert_string_equal(bias->name, "cls.predictions.bias");
    memcpy(zt_family_model_params(m) + bias->offset, zt_family_model_params(fresh) + bias->offset,
           bias->numel * sizeof(float));
    assert_int_equal(zt_family_model_export(m, src, &err), 0);
    for (int differs = 0; differs < 2; differs++) {
        rewrite(src, dst, &(edit){.drop = "cls.predictions.bias", .tie = "cls.predictions.decoder.bias",
                                        .tie_to = "cls.predictions.bias", .tie_differs = differs});
        if (!differs) {
            zt_family_model *got = both_ways(mlm, dst);
            assert_memory_equal(zt_family_model_params(got), zt_family_model_params(m),
                                zt_family_model_num_params(m) * sizeof(float));
            zt_family_model_destroy(got);
            continue;
        }
        zt_family_model *lazy = model_of(mlm, true, 2);
        zt_family_import *imp = (zt_family_import *)0x1;
        assert_int_equal(zt_family_model_import_open(lazy, dst, &imp, &err), ZT_EMISMATCH);
        assert_null(imp);
        assert_non_null(strstr(err.msg, "'cls.predictions.decoder.bias' differs from 'cls.predictions.bias'"));
        assert_int_equal(zt_family_model_import(fresh, dst, &err), ZT_EMISMATCH);
        assert_non_null(strstr(err.msg, "'cls.predictions.decoder.bias' differs from 'cls.predictions.bias'"));
        zt_family_model_destroy(lazy);
    }
    zt_family_model_destroy(fresh);
    zt_family_model_destroy(m);
}

/* Every bad input refused by the open, before anything is written (the lazy model's marker, the eager model's
 * initialisation unchanged), with the message zt_family_model_import gives. */
static void test_open_refuses_before_writing(void **state)
{
    (void)state;
    char src[300], dst[300];
    zt_family_model *m = exported(configs[0], 8, src, dst, sizeof src);
    zt_err err = {{0}};
    /* h.0.attn.c_attn.weight is [3C, C] = [24, 8] here, [8, 24] in the file: its element 1 (k 0, o 1) is ours 8,
     * its element 24 (k 1, o 0) ours 1, the first in ztrain's layout */
    static const struct {
        edit e;
        int rc;
        const char *needle;
    } cases[] = {
        {{.nan_in = "transformer.ln_f.bias", .nan_at = {3, 3}}, ZT_EFORMAT,
         "tensor 'transformer.ln_f.bias' holds a non-finite value (NaN or infinity) at element 3"},
        {{.nan_in = "transformer.h.0.attn.c_attn.weight", .nan_at = {1, 24}}, ZT_EFORMAT,
         "tensor 'transformer.h.0.attn.c_attn.weight' holds a non-finite value (NaN or infinity) at element 1"},
        {{.reshape = "transformer.h.1.attn.c_proj.weight"}, ZT_EMISMATCH,
         "tensor 'transformer.h.1.attn.c_proj.weight' has shape [7, 8], the model config expects [8, 8]"},
        {{.reshape = "transformer.ln_f.weight"}, ZT_EMISMATCH,
         "tensor 'transformer.ln_f.weight' has shape [7], the model config expects [8]"},
        {{.drop = "transformer.h.1.mlp.c_fc.weight"}, ZT_EMISMATCH,
         "tensor 'transformer.h.1.mlp.c_fc.weight' is missing ("},
        {{.drop = "transformer.ln_f.bias"}, ZT_EMISMATCH,
         "tensor 'transformer.ln_f.bias' is missing ("},
        {{.twice = "transformer.h.0.ln_1.weight"}, ZT_EMISMATCH,
         "tensor 'h.0.ln_1.weight' appears twice"},
        {{.extra = "transformer.h.2.ln_1.weight"}, ZT_EMISMATCH,
         "unknown tensor 'transformer.h.2.ln_1.weight' (not a parameter of "},
        {{.tie = "lm_head.weight", .tie_to = "transformer.wte.weight", .tie_differs = true},
         ZT_EMISMATCH, "tensor 'lm_head.weight' differs from 'wte.weight', to which the model ties it"},
        {{.int_dtype = "transformer.wpe.weight"}, ZT_EUNSUPPORTED,
         "tensor 'transformer.wpe.weight' has dtype I32"},
    };
    zt_family_model *eager = model_of(configs[0], false, 2);
    const size_t bytes = zt_family_model_num_params(eager) * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, zt_family_model_params(eager), bytes);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(src, dst, &cases[i].e);
        zt_family_model *lazy = model_of(configs[0], true, 2);
        zt_family_import *imp = (zt_family_import *)0x1;
        memset(&err, 0, sizeof err);
        int rc = zt_family_model_import_open(lazy, dst, &imp, &err);
        if (rc != cases[i].rc || !strstr(err.msg, cases[i].needle) || !strstr(err.msg, dst))
            fail_msg("case %zu: open: rc %d, message '%s' does not say '%s'", i, rc, err.msg, cases[i].needle);
        assert_null(imp);
        for (size_t j = 0; j < zt_family_model_num_params(lazy); j++)
            assert_true(zt_family_model_params(lazy)[j] == -7.0f);
        char open_msg[sizeof err.msg];
        snprintf(open_msg, sizeof open_msg, "%s", err.msg);
        memset(&err, 0, sizeof err);
        assert_int_equal(zt_family_model_import(eager, dst, &err), cases[i].rc);
        assert_string_equal(err.msg, open_msg);
        assert_memory_equal(zt_family_model_params(eager), before, bytes);
        zt_family_model_destroy(lazy);
    }
    free(before);
    zt_family_model_destroy(eager);
    zt_family_model_destroy(m);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, make_dir, remove_dir)
    const struct CMUnitTest tests[] = {
        T(test_lazy_fill_equals_import),
        T(test_lazy_fill_rewritten),
        T(test_lazy_fill_pretrained_head),
        T(test_open_refuses_before_writing),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
