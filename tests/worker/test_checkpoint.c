/* Tests of training checkpoints (worker/train/checkpoint.h) when the disk gives out: a save that fails
 * part way (a file size limit, as ulimit -f or a disk that fills up at that size: the write fails with
 * EFBIG since SIGXFSZ is ignored) returns a clean error naming the file, leaves no ckpt_N.tmp or partial
 * ckpt_N behind, and keeps the previous checkpoint and `latest` usable: it verifies and loads into a
 * model bit for bit. Saving the same step again under the limit keeps the checkpoint already there. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_save_with_disk_full, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
