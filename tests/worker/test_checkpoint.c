/* Tests of training checkpoints (worker/train/checkpoint.h) when the disk gives out: a save that fails
 * part way (a file size limit, as ulimit -f or a disk that fills up at that size: the write fails with
 * EFBIG since SIGXFSZ is ignored) returns a clean error naming the file, leaves no ckpt_N.tmp or partial
 * ckpt_N behind, and keeps the previous checkpoint and `latest` usable: it verifies and loads into a
 * model bit for bit. Saving the same step again under the limit keeps the checkpoint already there.
 * A checkpoint streamed tensor by tensor (zt_checkpoint_begin/put/finish), in any order and untransformed
 * tensors in pieces, holds the bytes of zt_checkpoint_save's for GPT-2 (Conv1D weights transposed for the
 * files) and GPT-NeoX (q, k, v rows reordered), with a staging of its largest such tensor; under a file size
 * limit it fails at begin, naming the file, and leaves nothing behind; a transformed tensor in part is
 * refused. A checkpoint read tensor by tensor (zt_checkpoint_open/read), in pieces and in any order, gives the
 * values zt_checkpoint_load gives for both families, through a staging of two such tensors; a corrupt or
 * truncated file, or another model's config, is refused at open with nothing handed out or changed. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "worker/models/gpt2.h"
#include "common/fileio.h"
#include "train_fixture.h"
#include "worker/train/checkpoint.h"

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    return zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_ckpt_");
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

/* Lowers the file size limit to `bytes` (SIGXFSZ ignored) and returns the limit to put back. */
static struct rlimit limit_file_size(rlim_t bytes)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    low = old;
    low.rlim_cur = bytes;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
    return old;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void save(const char *run, zt_family_model *model, zt_optimizer *opt, const zt_train_config *cfg, int64_t step,
                 int expect_ok, zt_err *err)
{
    zt_ckpt_state st;
    memset(&st, 0, sizeof(st));
    st.step = step;
    st.adam_step = step;
    zt_rng_seed(&st.rng, 42);
    st.schedule.lr = 1e-3;
    st.schedule.total_steps = 10;
    char path[512];
    int rc = zt_checkpoint_save(run, model, opt, cfg, &st, path, sizeof(path), err);
    if (expect_ok && rc != 0)
        fail_msg("save of step %lld: %s", (long long)step, err->msg);
    if (!expect_ok)
        assert_true(rc < 0);
}

static void test_save_with_disk_full(void **state)
{
    (void)state;
    zt_family_config fc;
    zt_family_config_default(&fc);
    zt_gpt2_config mc = (*ZT_GPT2_CONFIG(&fc));
    mc.n_layer = 1;
    mc.n_head = 2;
    mc.n_embd = 16;
    mc.n_positions = 8;
    mc.vocab_size = 32;
    zt_err err = {{0}};
    (*ZT_GPT2_CONFIG(&fc)) = mc;
    zt_family_model *model = NULL;
    if (zt_family_model_create(&model, &fc, 1, 8, 5, &err) != 0)
        fail_msg("%s", err.msg);
    zt_optimizer opt;
    assert_int_equal(zt_optimizer_init(&opt, zt_family_model_num_params(model), 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
    for (size_t i = 0; i < opt.n; i++) {
        opt.m[i] = (float)i * 1e-3f;
        opt.v[i] = (float)i * 1e-6f;
    }
    zt_train_config cfg;
    zt_train_config_init(&cfg);
    cfg.model = fc;
    char run[300];
    snprintf(run, sizeof(run), "%s/run", g_dir);
    assert_int_equal(zt_mkdir_p(run, &err), 0);

    /* Step 2 is saved; the parameters it holds are kept to compare with what loads back. */
    save(run, model, &opt, &cfg, 2, 1, &err);
    size_t n = zt_family_model_num_params(model);
    float *saved = malloc(n * sizeof(float));
    memcpy(saved, zt_family_model_params(model), n * sizeof(float));

    /* The weights move on; step 4's save meets a 1 KiB file size limit. */
    for (size_t i = 0; i < n; i++)
        zt_family_model_params(model)[i] += 1.0f;
    struct rlimit old = limit_file_size(1024);
    save(run, model, &opt, &cfg, 4, 0, &err);
    zt_err again = {{0}};
    save(run, model, &opt, &cfg, 2, 0, &again); /* the same step as the one on disk */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_non_null(strstr(err.msg, "ckpt_000004.tmp"));
    assert_non_null(strstr(err.msg, "File too large"));

    /* Nothing of step 4 is left; step 2 and `latest` are as they were. */
    char path[600];
    snprintf(path, sizeof(path), "%s/ckpt_000004", run);
    assert_false(exists(path));
    snprintf(path, sizeof(path), "%s/ckpt_000004.tmp", run);
    assert_false(exists(path));
    snprintf(path, sizeof(path), "%s/ckpt_000002.tmp", run);
    assert_false(exists(path));
    char found[600];
    assert_int_equal(zt_checkpoint_find(run, found, sizeof(found), &err), 0);
    snprintf(path, sizeof(path), "%s/ckpt_000002", run);
    assert_string_equal(found, path);
    zt_ckpt_state st;
    if (zt_checkpoint_verify(found, &st, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(st.step, 2);
    zt_family_model *back = NULL;
    assert_int_equal(zt_family_model_create(&back, &fc, 1, 8, 99, &err), 0);
    zt_optimizer opt2;
    assert_int_equal(zt_optimizer_init(&opt2, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
    if (zt_checkpoint_load(found, back, &opt2, &st, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_family_model_params(back), saved, n * sizeof(float));
    assert_memory_equal(opt2.m, opt.m, n * sizeof(float));

    /* With room again, step 4 saves. */
    save(run, model, &opt, &cfg, 4, 1, &err);
    assert_int_equal(zt_checkpoint_find(run, found, sizeof(found), &err), 0);
    assert_non_null(strstr(found, "ckpt_000004"));

    zt_optimizer_free(&opt2);
    zt_family_model_destroy(back);
    free(saved);
    zt_optimizer_free(&opt);
    zt_family_model_destroy(model);
}

/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    zt_err err;
    bool same = zt_read_file(a, &x, &nx, &err) == 0 && zt_read_file(b, &y, &ny, &err) == 0 && nx == ny &&
                memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static void make_model(const char *family_json, zt_family_model **out, zt_train_config *cfg)
{
    zt_err err = {{0}};
    cJSON *o = cJSON_Parse(family_json);
    assert_non_null(o);
    zt_family_config fc;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    zt_family_config_default_of(&fc, type->valuestring);
    if (zt_family_config_from_json(&fc, o, "test", &err) != 0)
        fail_msg("%s", err.msg);
    cJSON_Delete(o);
    if (zt_family_model_create(out, &fc, 1, 8, 5, &err) != 0)
        fail_msg("%s", err.msg);
    zt_train_config_init(cfg);
    cfg->model = fc;
}

/* The two small families the streamed checkpoint tests run: GPT-2, and GPT-NeoX (partial rotary, its own names). */
static const char *k_families[2] = {
    "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 16, \"n_positions\": 8, "
    "\"vocab_size\": 40}",
    "{\"model_type\": \"gpt_neox\", \"hidden_size\": 24, \"num_attention_heads\": 3, \"num_hidden_layers\": 2, "
    "\"intermediate_size\": 20, \"vocab_size\": 50, \"max_position_embeddings\": 16}",
};

static void test_streamed_equals_gathered(void **state)
{
    (void)state;
    for (int fam = 0; fam < 2; fam++) {
        zt_family_model *model = NULL;
        zt_train_config cfg;
        make_model(k_families[fam], &model, &cfg);
        zt_err err = {{0}};
        const size_t n = zt_family_model_num_params(model);
        zt_optimizer opt;
        assert_int_equal(zt_optimizer_init(&opt, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
        for (size_t i = 0; i < n; i++) {
            opt.m[i] = (float)i * 1e-3f - 0.5f;
            opt.v[i] = (float)i * 1e-6f;
        }
        char a_run[300], b_run[300];
        snprintf(a_run, sizeof a_run, "%s/gathered%d", g_dir, fam);
        snprintf(b_run, sizeof b_run, "%s/streamed%d", g_dir, fam);
        assert_int_equal(zt_mkdir_p(a_run, &err), 0);
        assert_int_equal(zt_mkdir_p(b_run, &err), 0);
        save(a_run, model, &opt, &cfg, 3, 1, &err);

        /* the largest tensor transposed or reordered for the files, and no more */
        size_t most = 0, largest = 0;
        for (int i = 0; i < zt_family_model_num_tensors(model); i++) {
            const zt_param_info *t = zt_family_model_tensor(model, i);
            largest = t->numel > largest ? t->numel : largest;
            if (t->transposed_in_hf)
                most = t->numel > most ? t->numel : most;
        }
        print_message("%s: %zu parameters, staging %zu bytes\n", fam ? "GPT-NeoX" : "GPT-2", n,
                      zt_checkpoint_stream_bytes(model));
        assert_int_equal(zt_checkpoint_stream_bytes(model), 4 * (fam == 0 ? most : largest));
        assert_true(zt_checkpoint_stream_bytes(model) < 4 * n);

        /* tensors last to first; those the files hold as they are (GPT-2's) in pieces of 7 elements */
        zt_ckpt_writer *w = NULL;
        if (zt_checkpoint_begin(b_run, model, 3, &w, &err) != 0)
            fail_msg("%s", err.msg);
        const float *p = zt_family_model_params(model);
        for (int i = zt_family_model_num_tensors(model) - 1; i >= 0; i--) {
            const zt_param_info *t = zt_family_model_tensor(model, i);
            const bool as_is = !t->transposed_in_hf && fam == 0;
            for (size_t at = 0; at < t->numel; at += as_is ? 7 : t->numel) {
                const size_t k = as_is && t->numel - at > 7 ? 7 : t->numel - at;
                const size_t o = t->offset + at;
                if (zt_checkpoint_put(w, o, k, p + o, opt.m + o, opt.v + o, &err) != 0)
                    fail_msg("%s", err.msg);
            }
        }
        /* a transformed tensor in part is refused (GPT-2: a transposed one; GPT-NeoX: its first layer's fused
         * q, k, v, the first tensor with "query_key_value" in its Hugging Face name) */
        for (int i = 0; i < zt_family_model_num_tensors(model); i++) {
            const zt_param_info *t = zt_family_model_tensor(model, i);
            char hf[160];
            int64_t shape[2];
            zt_family_model_export_layout(model, i, hf, sizeof hf, shape);
            if (fam == 0 ? t->transposed_in_hf : strstr(hf, "query_key_value") != NULL) {
                assert_int_equal(zt_checkpoint_put(w, t->offset, 1, p, opt.m, opt.v, &err), ZT_EINVAL_CONFIG);
                assert_non_null(strstr(err.msg, t->name));
                break;
            }
        }
        zt_ckpt_state st;
        memset(&st, 0, sizeof(st));
        st.step = 3;
        st.adam_step = 3;
        zt_rng_seed(&st.rng, 42);
        st.schedule.lr = 1e-3;
        st.schedule.total_steps = 10;
        if (zt_checkpoint_finish(w, NULL, &cfg, &st, NULL, 0, &err) != 0)
            fail_msg("%s", err.msg);
        const char *files[5] = {"model.safetensors", "optim.safetensors", "config.json", "model_config.json",
                                "manifest.json"};
        for (int f = 0; f < 5; f++) {
            char a[700], b[700];
            snprintf(a, sizeof a, "%s/ckpt_000003/%s", a_run, files[f]);
            snprintf(b, sizeof b, "%s/ckpt_000003/%s", b_run, files[f]);
            if (!same_file(a, b))
                fail_msg("%s: the streamed %s differs from the gathered one", fam ? "GPT-NeoX" : "GPT-2", files[f]);
        }

        /* a file size limit below the files' size: begin fails, naming the file, and leaves nothing */
        struct rlimit old = limit_file_size(1024);
        w = NULL;
        int rc = zt_checkpoint_begin(b_run, model, 5, &w, &err);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
        assert_true(rc < 0);
        assert_null(w);
        assert_non_null(strstr(err.msg, "ckpt_000005.tmp/model.safetensors"));
        char path[700];
        snprintf(path, sizeof path, "%s/ckpt_000005.tmp", b_run);
        assert_false(exists(path));
        /* abandoned: nothing either */
        assert_int_equal(zt_checkpoint_begin(b_run, model, 6, &w, &err), 0);
        zt_checkpoint_abandon(w);
        snprintf(path, sizeof path, "%s/ckpt_000006.tmp", b_run);
        assert_false(exists(path));
        char found[600];
        assert_int_equal(zt_checkpoint_find(b_run, found, sizeof(found), &err), 0);
        assert_non_null(strstr(found, "ckpt_000003"));
        zt_optimizer_free(&opt);
        zt_family_model_destroy(model);
    }
}

/* Writes bytes into path (replacing it). */
static void put_file(const char *path, const char *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Opening ckpt for model fails with code `want` and a message holding `says`; the reader, the state and the
 * optimizer's counters are left as they were. */
static void open_refused(const char *ckpt, const zt_family_model *model, int want, const char *says)
{
    zt_err err = {{0}};
    zt_optimizer opt;
    memset(&opt, 0, sizeof opt);
    opt.adam_step = 77;
    zt_ckpt_state st;
    memset(&st, 0, sizeof st);
    st.step = 99;
    zt_ckpt_reader *r = (zt_ckpt_reader *)&st; /* not NULL: open must clear it */
    const int rc = zt_checkpoint_open(ckpt, model, &opt, &st, &r, &err);
    print_message("refused (%d): %s\n", rc, err.msg);
    assert_int_equal(rc, want);
    assert_null(r);
    assert_non_null(strstr(err.msg, says));
    assert_int_equal(st.step, 99);
    assert_int_equal(opt.adam_step, 77);
}

static void test_streamed_read(void **state)
{
    (void)state;
    for (int fam = 0; fam < 2; fam++) {
        zt_family_model *model = NULL, *loaded = NULL, *target = NULL;
        zt_train_config cfg;
        make_model(k_families[fam], &model, &cfg);
        make_model(k_families[fam], &loaded, &cfg);
        make_model(k_families[fam], &target, &cfg);
        zt_err err = {{0}};
        const size_t n = zt_family_model_num_params(model);
        zt_optimizer opt, back;
        assert_int_equal(zt_optimizer_init(&opt, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
        assert_int_equal(zt_optimizer_init(&back, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
        float *p = zt_family_model_params(model);
        for (size_t i = 0; i < n; i++) {
            p[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
            opt.m[i] = (float)i * 1e-3f - 0.5f;
            opt.v[i] = (float)i * 1e-6f;
        }
        char run[300], ckpt[400];
        snprintf(run, sizeof run, "%s/read%d", g_dir, fam);
        assert_int_equal(zt_mkdir_p(run, &err), 0);
        save(run, model, &opt, &cfg, 3, 1, &err);
        snprintf(ckpt, sizeof ckpt, "%s/ckpt_000003", run);
        zt_ckpt_state want, got;
        if (zt_checkpoint_load(ckpt, loaded, &back, &want, &err) != 0)
            fail_msg("%s", err.msg);

        zt_optimizer counters;
        memset(&counters, 0, sizeof counters);
        zt_ckpt_reader *r = NULL;
        if (zt_checkpoint_open(ckpt, target, &counters, &got, &r, &err) != 0)
            fail_msg("%s", err.msg);
        assert_memory_equal(&got, &want, sizeof got);
        assert_int_equal(counters.adam_step, back.adam_step);
        assert_int_equal(zt_checkpoint_read_bytes(target), 2 * zt_checkpoint_stream_bytes(target));
        /* tensors last to first, each in pieces of 5 elements from its end: transformed ones are read whole once */
        float *xp = calloc(n, sizeof(float)), *xm = calloc(n, sizeof(float)), *xv = calloc(n, sizeof(float));
        for (int i = zt_family_model_num_tensors(target) - 1; i >= 0; i--) {
            const zt_param_info *t = zt_family_model_tensor(target, i);
            for (size_t done = 0; done < t->numel;) {
                const size_t k = t->numel - done > 5 ? 5 : t->numel - done;
                const size_t o = t->offset + t->numel - done - k;
                if (zt_checkpoint_read(r, o, k, xp + o, xm + o, xv + o, &err) != 0)
                    fail_msg("%s", err.msg);
                done += k;
            }
        }
        zt_checkpoint_close(r);
        assert_memory_equal(xp, zt_family_model_params(loaded), n * sizeof(float));
        assert_memory_equal(xp, p, n * sizeof(float));
        assert_memory_equal(xm, back.m, n * sizeof(float));
        assert_memory_equal(xv, back.v, n * sizeof(float));
        print_message("%s: read in pieces, the values of zt_checkpoint_load (staging %zu bytes)\n",
                      fam ? "GPT-NeoX" : "GPT-2", zt_checkpoint_read_bytes(target));

        /* a byte changed in optim.safetensors, model.safetensors cut short: refused, then usable again */
        const char *names[2] = {"optim.safetensors", "model.safetensors"};
        for (int f = 0; f < 2; f++) {
            char path[500];
            snprintf(path, sizeof path, "%s/%s", ckpt, names[f]);
            char *bytes = NULL;
            size_t len = 0;
            assert_int_equal(zt_read_file(path, &bytes, &len, &err), 0);
            if (f == 0) {
                bytes[len / 2] ^= 0x10;
                put_file(path, bytes, len);
                bytes[len / 2] ^= 0x10;
            } else {
                put_file(path, bytes, len - 100);
            }
            open_refused(ckpt, target, ZT_ECHECKSUM, names[f]);
            put_file(path, bytes, len);
            free(bytes);
        }
        assert_int_equal(zt_checkpoint_open(ckpt, target, NULL, &got, &r, &err), 0);
        zt_checkpoint_close(r);

        /* another model: the field that differs is named */
        zt_family_model *other = NULL;
        zt_train_config ocfg;
        char json[400];
        snprintf(json, sizeof json, "%s", k_families[fam]);
        const char *key = fam ? "\"num_hidden_layers\": " : "\"n_layer\": ";
        char *at = strstr(json, key);
        assert_non_null(at);
        at[strlen(key)] = '3'; /* 2 layers become 3 */
        make_model(json, &other, &ocfg);
        open_refused(ckpt, other, ZT_EMISMATCH, fam ? "num_hidden_layers" : "n_layer");
        zt_family_model_destroy(other);

        free(xp);
        free(xm);
        free(xv);
        zt_optimizer_free(&opt);
        zt_optimizer_free(&back);
        zt_family_model_destroy(model);
        zt_family_model_destroy(loaded);
        zt_family_model_destroy(target);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_save_with_disk_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streamed_equals_gathered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streamed_read, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
