/* Tests of `ztrain inspect` (worker/cmd_inspect.c) on a checkpoint written here with known values: the
 * table has the mean, std, min and max of the selected parameters and of their Adam moments, the glob
 * selects by name, gradient rows come from a gradient dump (grads.safetensors) whose checksum is checked,
 * and bad input (no checkpoint, a glob that matches nothing, missing flag) fails with a
 * message. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "worker/models/gpt2.h"
#include "worker/cli/commands.h"

#include "run_command.h"
#include "worker/train/checkpoint.h"

static char dir[] = "/tmp/zt_inspect_XXXXXX";
static char gdir[PATH_MAX]; /* dir/with_grads: the same checkpoint with a gradient dump */

/* Runs zt_cmd_inspect(argv) in a child with stdout and stderr captured into out; returns its status. */
static int inspect(char **argv, char *out, size_t cap)
{
    return zt_test_run_command(zt_cmd_inspect, argv, out, cap);
}

/* A checkpoint of a tiny model where every tensor holds 2.0 except h.1.attn.c_proj.weight, which
 * alternates -1, +1 (mean 0, std 1), with Adam m = 0.25 and v = 4 everywhere. */
/* The model every test here uses: 2 layers, 2 heads, 8 channels, 8 positions, 11 tokens. */
static zt_gpt2_config tiny_config(void)
{
    zt_gpt2_config c;
    zt_gpt2_config_default(&c);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    c.n_positions = 8;
    c.vocab_size = 11;
    return c;
}

/* tiny_config as a model family's config. */
static zt_family_config tiny_family(void)
{
    zt_family_config f;
    zt_family_config_default(&f);
    (*ZT_GPT2_CONFIG(&f)) = tiny_config();
    return f;
}


static int setup(void **state)
{
    (void)state;
    assert_non_null(mkdtemp(dir));
    zt_family_config c = tiny_family();
    zt_err err = {{0}};
    zt_family_model *m = NULL;
    assert_int_equal(zt_family_model_create(&m, &c, 1, 4, 1, &err), 0);
    float *p = zt_family_model_params(m);
    size_t n = zt_family_model_num_params(m);
    for (size_t i = 0; i < n; i++)
        p[i] = 2.0f;
    bool found = false;
    for (int t = 0; t < zt_family_model_num_tensors(m); t++) {
        const zt_param_info *info = zt_family_model_tensor(m, t);
        if (strcmp(info->name, "h.1.attn.c_proj.weight") == 0) {
            for (size_t i = 0; i < info->numel; i++)
                p[info->offset + i] = i % 2 ? 1.0f : -1.0f;
            found = true;
        }
    }
    assert_true(found);
    zt_optimizer opt;
    assert_int_equal(zt_optimizer_init(&opt, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
    for (size_t i = 0; i < n; i++) {
        opt.m[i] = 0.25f;
        opt.v[i] = 4.0f;
    }
    opt.adam_step = 7;
    zt_train_config cfg;
    zt_train_config_init(&cfg);
    cfg.model = c;
    cfg.model_loaded = true;
    zt_ckpt_state st;
    memset(&st, 0, sizeof st);
    st.step = 7;
    st.adam_step = 7;
    assert_int_equal(zt_checkpoint_save(dir, m, &opt, &cfg, &st, NULL, 0, &err), 0);
    /* Gradients 0.5 everywhere but -3 in h.1.attn.c_proj.weight. */
    float *g = zt_family_model_grads(m);
    for (size_t i = 0; i < n; i++)
        g[i] = 0.5f;
    for (int t = 0; t < zt_family_model_num_tensors(m); t++) {
        const zt_param_info *info = zt_family_model_tensor(m, t);
        if (strcmp(info->name, "h.1.attn.c_proj.weight") == 0)
            for (size_t i = 0; i < info->numel; i++)
                g[info->offset + i] = -3.0f;
    }
    snprintf(gdir, sizeof gdir, "%s/with_grads", dir);
    assert_int_equal(mkdir(gdir, 0755), 0);
    assert_int_equal(zt_checkpoint_save_with_grads(gdir, m, &opt, g, &cfg, &st, NULL, 0, &err), 0);
    zt_optimizer_free(&opt);
    zt_family_model_destroy(m);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void assert_contains(const char *text, const char *what)
{
    if (!strstr(text, what))
        fail_msg("expected '%s' in:\n%s", what, text);
}

static void test_table_of_selected_tensors(void **state)
{
    (void)state;
    static char out[1 << 16];
    char *argv[] = {"inspect", "--checkpoint", dir, "--params", "h.1.attn.*", NULL};
    if (inspect(argv, out, sizeof out) != 0)
        fail_msg("ztrain inspect failed:\n%s", out);
    assert_contains(out, "step 7, Adam step 7");
    char row[256];
    snprintf(row, sizeof row, "%-32s %-7s %-14s %13.6e %13.6e %13.6e %13.6e", "h.1.attn.c_proj.weight", "param",
             "[8,8]", 0.0, 1.0, -1.0, 1.0);
    assert_contains(out, row);
    snprintf(row, sizeof row, "%-32s %-7s %-14s %13.6e %13.6e %13.6e %13.6e", "h.1.attn.c_proj.weight", "adam_m",
             "[8,8]", 0.25, 0.0, 0.25, 0.25);
    assert_contains(out, row);
    snprintf(row, sizeof row, "%-32s %-7s %-14s %13.6e %13.6e %13.6e %13.6e", "h.1.attn.c_proj.weight", "adam_v",
             "[8,8]", 4.0, 0.0, 4.0, 4.0);
    assert_contains(out, row);
    assert_contains(out, "h.1.attn.c_attn.bias");
    /* the glob keeps other tensors out */
    assert_null(strstr(out, "h.0."));
    assert_null(strstr(out, "wte.weight"));
    assert_null(strstr(out, "h.1.mlp"));
}

static void test_every_tensor_by_default(void **state)
{
    (void)state;
    static char out[1 << 16];
    char *argv[] = {"inspect", "--checkpoint", dir, NULL};
    assert_int_equal(inspect(argv, out, sizeof out), 0);
    assert_contains(out, "wte.weight");
    assert_contains(out, "ln_f.bias");
    assert_contains(out, "h.0.mlp.c_fc.weight");
}

static void test_gradient_rows(void **state)
{
    (void)state;
    static char out[1 << 16];
    char *plain[] = {"inspect", "--checkpoint", dir, "--params", "h.1.attn.c_proj.weight", NULL};
    assert_int_equal(inspect(plain, out, sizeof out), 0);
    assert_contains(out, "no gradient dump");
    assert_null(strstr(out, " grad "));

    char *argv[] = {"inspect", "--checkpoint", gdir, "--params", "h.1.attn.*", NULL};
    if (inspect(argv, out, sizeof out) != 0)
        fail_msg("ztrain inspect failed:\n%s", out);
    assert_null(strstr(out, "no gradient dump"));
    char row[256];
    snprintf(row, sizeof row, "%-32s %-7s %-14s %13.6e %13.6e %13.6e %13.6e", "h.1.attn.c_proj.weight", "grad",
             "[8,8]", -3.0, 0.0, -3.0, -3.0);
    assert_contains(out, row);
    snprintf(row, sizeof row, "%-32s %-7s %-14s %13.6e %13.6e %13.6e %13.6e", "h.1.attn.c_proj.bias", "grad",
             "[8]", 0.5, 0.0, 0.5, 0.5);
    assert_contains(out, row);
}

/* Loading (resuming) accepts a checkpoint with a gradient dump and leaves the gradients alone; a damaged
 * dump is refused by the checksum check, by inspect and by loading alike. */
static void test_gradient_dump_on_load(void **state)
{
    (void)state;
    zt_err err = {{0}};
    char ckpt[PATH_MAX], path[PATH_MAX + 32];
    assert_int_equal(zt_checkpoint_find(gdir, ckpt, sizeof ckpt, &err), 0);
    zt_family_config c = tiny_family();
    zt_family_model *m = NULL;
    assert_int_equal(zt_family_model_create(&m, &c, 1, 4, 1, &err), 0);
    size_t n = zt_family_model_num_params(m);
    zt_optimizer opt;
    assert_int_equal(zt_optimizer_init(&opt, n, 0.9, 0.95, 1e-8, 0.1, 1.0, &err), 0);
    zt_family_model_zero_grad(m);
    zt_ckpt_state st;
    if (zt_checkpoint_load(ckpt, m, &opt, &st, &err) != 0)
        fail_msg("load failed: %s", err.msg);
    assert_int_equal(st.step, 7);
    for (size_t i = 0; i < n; i++)
        assert_true(zt_family_model_grads(m)[i] == 0.0f);

    /* Flip one byte of the last gradient value. */
    snprintf(path, sizeof path, "%s/grads.safetensors", ckpt);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, -1, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(ch ^ 0x40, f);
    fclose(f);
    assert_int_equal(zt_checkpoint_verify(ckpt, NULL, &err), ZT_ECHECKSUM);
    assert_non_null(strstr(err.msg, "grads.safetensors crc32c mismatch"));
    assert_int_equal(zt_checkpoint_load(ckpt, m, &opt, &st, &err), ZT_ECHECKSUM);
    static char out[1 << 16];
    char *argv[] = {"inspect", "--checkpoint", gdir, NULL};
    assert_int_equal(inspect(argv, out, sizeof out), 1);
    assert_contains(out, "grads.safetensors crc32c mismatch");
    zt_optimizer_free(&opt);
    zt_family_model_destroy(m);
}

static void test_bad_input(void **state)
{
    (void)state;
    char out[4096];
    char *none[] = {"inspect", "--checkpoint", dir, "--params", "nothing.*", NULL};
    assert_int_equal(inspect(none, out, sizeof out), 1);
    assert_contains(out, "no tensor");
    char *missing[] = {"inspect", "--checkpoint", "/nonexistent/run", NULL};
    assert_int_equal(inspect(missing, out, sizeof out), 1);
    assert_contains(out, "/nonexistent/run");
    char *noflag[] = {"inspect", NULL};
    assert_int_equal(inspect(noflag, out, sizeof out), 2);
    assert_contains(out, "--checkpoint DIR is required");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_of_selected_tensors),
        cmocka_unit_test(test_every_tensor_by_default),
        cmocka_unit_test(test_gradient_rows),
        cmocka_unit_test(test_gradient_dump_on_load),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
