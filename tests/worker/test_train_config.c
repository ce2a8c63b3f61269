/* Tests of the training configuration (worker/train/config.h): defaults, a config file with paths
 * relative to its folder, flag overrides, an inline model, unknown keys with a suggestion, every
 * validation error (each message must name the setting), and save + load giving the same settings.
 * Files are written to a fresh temporary folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/models/gpt2.h"
#include "common/log.h"
#include "worker/train/config.h"

static char g_dir[256];

static const char tiny_model[] =
    "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"n_positions\": 64, "
    "\"vocab_size\": 256, \"layer_norm_epsilon\": 1e-5, \"tie_word_embeddings\": true}";

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/zt_test_train_config_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir))
        return -1;
    char path[512];
    snprintf(path, sizeof(path), "%s/sub", g_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/sub/model.json", g_dir);
    write_text(path, tiny_model);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A config that passes validation: the tiny model, some data, 100 steps. */
static void valid_config(zt_train_config *c)
{
    char path[512];
    zt_train_config_init(c);
    snprintf(path, sizeof(path), "%s/sub/model.json", g_dir);
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(c, "--model", path, &err), 0);
    assert_int_equal(zt_train_config_set_flag(c, "--train-data", "data/x_train_*.bin", &err), 0);
    assert_int_equal(zt_train_config_set_flag(c, "--steps", "100", &err), 0);
    assert_int_equal(zt_train_config_set_flag(c, "--seq-len", "64", &err), 0);
    assert_int_equal(zt_train_config_resolve(c, &err), 0);
    if (zt_train_config_validate(c, &err) != 0)
        fail_msg("valid config refused: %s", err.msg);
}

static void test_defaults(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_config_init(&c);
    assert_int_equal(c.steps, 1000);
    assert_int_equal(c.batch_size, 8);
    assert_int_equal(c.seq_len, 256);
    assert_int_equal(c.grad_accum, 1);
    assert_true(c.lr == 6e-4);
    assert_true(c.min_lr == 6e-5);
    assert_int_equal(c.schedule, ZT_SCHEDULE_COSINE);
    assert_int_equal(c.warmup_steps, ZT_TRAIN_AUTO);
    assert_true(c.lr_gamma == 0.999);
    assert_true(c.weight_decay == 0.1);
    assert_true(c.beta1 == 0.9);
    assert_true(c.beta2 == 0.95);
    assert_true(c.eps == 1e-8);
    assert_true(c.grad_clip == 1.0);
    assert_int_equal(c.eval_every, 100);
    assert_int_equal(c.eval_batches, 10);
    assert_int_equal(c.save_every, 500);
    assert_int_equal(c.log_every, 10);
    assert_int_equal(c.seed, 1337);
    assert_int_equal(c.threads, 0);
    assert_true(c.shuffle);
    assert_string_equal(c.init_from, "");
    assert_string_equal(c.val_data, "");
    assert_string_equal(c.resume, "");
    assert_false(c.model_loaded);

    /* Without a model there is nothing to train. */
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_resolve(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--model"));

    /* Auto warmup: min(50, steps / 10). */
    valid_config(&c);
    assert_int_equal(c.warmup_steps, 10);
    zt_train_config_init(&c);
    c.steps = 5000;
    zt_train_config_resolve(&c, &err);
    assert_int_equal(c.warmup_steps, 50);
}

static void test_file_then_flags(void **state)
{
    (void)state;
    char path[512], want[600];
    snprintf(path, sizeof(path), "%s/sub/train.json", g_dir);
    write_text(path, "{\n"
                     "  \"model\": \"model.json\",\n"
                     "  \"init_from\": null,\n"
                     "  \"train_data\": \"data/x_train_*.bin\",\n"
                     "  \"val_data\": \"/abs/x_val_*.bin\",\n"
                     "  \"out_dir\": \"runs/a\",\n"
                     "  \"steps\": 200, \"batch_size\": 4, \"seq_len\": 32, \"grad_accum\": 2,\n"
                     "  \"lr\": 1e-3, \"min_lr\": 1e-5, \"schedule\": \"linear\", \"warmup_steps\": 7,\n"
                     "  \"lr_gamma\": 0.5, \"weight_decay\": 0.0, \"beta1\": 0.8, \"beta2\": 0.99, \"eps\": 1e-6,\n"
                     "  \"grad_clip\": 0, \"eval_every\": 20, \"eval_batches\": 3, \"save_every\": 50,\n"
                     "  \"log_every\": 5, \"seed\": 7, \"threads\": 1, \"shuffle\": false\n"
                     "}\n");
    zt_train_config c;
    zt_train_config_init(&c);
    zt_err err = {{0}};
    if (zt_train_config_load_file(&c, path, &err) != 0)
        fail_msg("%s", err.msg);

    /* Paths are relative to the file's folder, absolute ones stay. */
    snprintf(want, sizeof(want), "%s/sub/model.json", g_dir);
    assert_string_equal(c.model_path, want);
    snprintf(want, sizeof(want), "%s/sub/data/x_train_*.bin", g_dir);
    assert_string_equal(c.train_data, want);
    assert_string_equal(c.val_data, "/abs/x_val_*.bin");
    snprintf(want, sizeof(want), "%s/sub/runs/a", g_dir);
    assert_string_equal(c.out_dir, want);
    assert_string_equal(c.init_from, "");
    assert_int_equal(c.steps, 200);
    assert_int_equal(c.batch_size, 4);
    assert_int_equal(c.seq_len, 32);
    assert_int_equal(c.grad_accum, 2);
    assert_true(c.lr == 1e-3);
    assert_true(c.min_lr == 1e-5);
    assert_int_equal(c.schedule, ZT_SCHEDULE_LINEAR);
    assert_int_equal(c.warmup_steps, 7);
    assert_true(c.lr_gamma == 0.5);
    assert_true(c.weight_decay == 0.0);
    assert_true(c.beta1 == 0.8);
    assert_true(c.beta2 == 0.99);
    assert_true(c.eps == 1e-6);
    assert_true(c.grad_clip == 0.0);
    assert_int_equal(c.eval_every, 20);
    assert_int_equal(c.eval_batches, 3);
    assert_int_equal(c.save_every, 50);
    assert_int_equal(c.log_every, 5);
    assert_int_equal(c.seed, 7);
    assert_int_equal(c.threads, 1);
    assert_false(c.shuffle);

    /* Flags override the file; their paths are taken as they are (relative to the current folder). */
    assert_int_equal(zt_train_config_set_flag(&c, "--steps", "300", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--lr", "2e-3", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--schedule", "cosine", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--warmup", "0", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--out", "runs/b", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--val-data", "v_*.bin", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--init-from", "w.safetensors", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--batch-size", "6", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--grad-clip", "0.5", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--resume", "runs/a", &err), 0);
    assert_int_equal(c.steps, 300);
    assert_true(c.lr == 2e-3);
    assert_int_equal(c.schedule, ZT_SCHEDULE_COSINE);
    assert_int_equal(c.warmup_steps, 0);
    assert_string_equal(c.out_dir, "runs/b");
    assert_string_equal(c.val_data, "v_*.bin");
    assert_string_equal(c.init_from, "w.safetensors");
    assert_int_equal(c.batch_size, 6);
    assert_true(c.grad_clip == 0.5);
    assert_string_equal(c.resume, "runs/a");
    assert_int_equal(c.seed, 7); /* not overridden */

    assert_int_equal(zt_train_config_resolve(&c, &err), 0);
    assert_true(c.model_loaded);
    assert_int_equal(ZT_GPT2_CONFIG(&c.model)->n_layer, 2);
    assert_int_equal(ZT_GPT2_CONFIG(&c.model)->n_embd, 32);
    if (zt_train_config_validate(&c, &err) != 0)
        fail_msg("%s", err.msg);
    zt_train_config_log(&c); /* one line per key; must not crash */
}

static void test_inline_model(void **state)
{
    (void)state;
    char path[512], text[1024];
    snprintf(path, sizeof(path), "%s/inline.json", g_dir);
    snprintf(text, sizeof(text), "{\"model\": %s, \"train_data\": \"d_*.bin\", \"seq_len\": 64}", tiny_model);
    write_text(path, text);
    zt_train_config c;
    zt_train_config_init(&c);
    zt_err err = {{0}};
    if (zt_train_config_load_file(&c, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_true(c.model_loaded);
    assert_string_equal(c.model_path, "");
    assert_int_equal(ZT_GPT2_CONFIG(&c.model)->n_head, 2);
    assert_int_equal(zt_train_config_resolve(&c, &err), 0);
    assert_int_equal(zt_train_config_validate(&c, &err), 0);

    /* An inline model with a field GPT-2 does not know is refused, naming it. */
    snprintf(text, sizeof(text), "{\"model\": {\"n_layer\": 2, \"n_layers\": 3}}");
    write_text(path, text);
    zt_train_config_init(&c);
    assert_int_not_equal(zt_train_config_load_file(&c, path, &err), 0);
    assert_non_null(strstr(err.msg, "n_layers"));

    /* --model replaces an inline model. */
    snprintf(text, sizeof(text), "{\"model\": %s}", tiny_model);
    write_text(path, text);
    zt_train_config_init(&c);
    assert_int_equal(zt_train_config_load_file(&c, path, &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--model", "/nonexistent/model.json", &err), 0);
    assert_false(c.model_loaded);
    assert_true(zt_train_config_resolve(&c, &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent/model.json"));
}

static void expect_load_error(const char *text, const char *needle1, const char *needle2)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/bad.json", g_dir);
    write_text(path, text);
    zt_train_config c;
    zt_train_config_init(&c);
    zt_err err = {{0}};
    int rc = zt_train_config_load_file(&c, path, &err);
    if (rc >= 0)
        fail_msg("'%s' was accepted", text);
    if (!strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2)))
        fail_msg("message '%s' does not name '%s' and '%s'", err.msg, needle1, needle2 ? needle2 : "");
}

static void test_file_errors(void **state)
{
    (void)state;
    /* Unknown keys are errors, with a suggestion for a misspelling. */
    expect_load_error("{\"stepz\": 10}", "'stepz'", "did you mean 'steps'");
    expect_load_error("{\"modle\": \"m.json\"}", "'modle'", "did you mean 'model'");
    expect_load_error("{\"warmup\": 10}", "'warmup'", NULL);
    expect_load_error("{\"resume\": \"runs/a\"}", "'resume'", NULL); /* a flag, not a file key */
    /* Wrong types and forms. */
    expect_load_error("{\"steps\": \"ten\"}", "steps", "whole number");
    expect_load_error("{\"steps\": 1.5}", "steps", "whole number");
    expect_load_error("{\"lr\": true}", "lr", "number");
    expect_load_error("{\"shuffle\": 1}", "shuffle", "true or false");
    expect_load_error("{\"model\": 3}", "model", "path");
    expect_load_error("{\"steps\": 10,}", "bad.json", "line 1");
    expect_load_error("[1, 2]", "bad.json", "object");
    /* A missing file names the file. */
    zt_train_config c;
    zt_train_config_init(&c);
    zt_err err = {{0}};
    assert_true(zt_train_config_load_file(&c, "/nonexistent/train.json", &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent/train.json"));
}

static void test_flag_errors(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_config_init(&c);
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(&c, "--bogus", "1", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--bogus"));
    assert_int_equal(zt_train_config_set_flag(&c, "--steps", "12x", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--steps"));
    assert_non_null(strstr(err.msg, "'12x'"));
    assert_int_equal(zt_train_config_set_flag(&c, "--lr", "fast", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--lr"));
    assert_int_equal(c.steps, 1000); /* unchanged */
    /* File-only keys have no flag. */
    assert_int_equal(zt_train_config_set_flag(&c, "--beta1", "0.5", &err), ZT_EINVAL_CONFIG);
}

/* One validation case: a change to a valid config and the words its message must contain. */
struct bad_case {
    const char *what;
    void (*apply)(zt_train_config *c);
    const char *needle1;
    const char *needle2;
};

#define BAD(name, body)                                                                                       \
    static void bad_##name(zt_train_config *c)                                                                \
    {                                                                                                         \
        body;                                                                                                 \
    }
BAD(steps, c->steps = 0)
BAD(batch, c->batch_size = 0)
BAD(seq_len_zero, c->seq_len = 0)
BAD(seq_len_long, c->seq_len = 65)
BAD(accum, c->grad_accum = 0)
BAD(lr_zero, c->lr = 0.0)
BAD(lr_nan, c->lr = NAN)
BAD(min_lr_neg, c->min_lr = -1e-4)
BAD(min_lr_above, c->min_lr = 1.0)
BAD(schedule, c->schedule = (enum zt_schedule_kind)9)
BAD(warmup_neg, c->warmup_steps = -5)
BAD(warmup_long, c->warmup_steps = 100)
BAD(gamma_zero, c->lr_gamma = 0.0)
BAD(gamma_big, c->lr_gamma = 1.5)
BAD(wd, c->weight_decay = -0.1)
BAD(beta1, c->beta1 = 1.0)
BAD(beta2, c->beta2 = -0.5)
BAD(eps, c->eps = 0.0)
BAD(clip, c->grad_clip = -1.0)
BAD(eval_every, c->eval_every = -1)
BAD(eval_batches, c->eval_batches = 0)
BAD(save_every, c->save_every = -2)
BAD(gpu_mem_cpu, c->gpu_mem = 1ULL << 30)
BAD(weights_cpu, c->weights = ZT_WEIGHTS_HOST)
BAD(weights_host_gpu_opt, { c->device = ZT_DEVICE_CUDA; c->optimizer = ZT_OPTIMIZER_GPU; c->weights = ZT_WEIGHTS_HOST; })
BAD(weights_host_zero2, { c->device = ZT_DEVICE_CUDA; c->optimizer = ZT_OPTIMIZER_CPU; c->zero_level = 2; c->weights = ZT_WEIGHTS_HOST; })
BAD(moments_bf16_gpu_opt, { c->device = ZT_DEVICE_CUDA; c->optimizer = ZT_OPTIMIZER_GPU; c->adam_moments = ZT_MOMENTS_BF16; })
BAD(moments_dir_cpu, { c->optimizer = ZT_OPTIMIZER_CPU; c->zero_level = 2; snprintf(c->moments_dir, sizeof c->moments_dir, "/tmp"); })
BAD(log_every, c->log_every = 0)
BAD(seed, c->seed = -1)
BAD(threads, c->threads = -2)
BAD(train_data, c->train_data[0] = '\0')
BAD(out_dir, c->out_dir[0] = '\0')
BAD(model_missing, { c->model_loaded = false; c->model_path[0] = '\0'; })
BAD(model_heads, { ZT_GPT2_CONFIG(&c->model)->n_head = 3; })
BAD(stop_at, c->stop_at_step = -1)

static void test_validation_errors(void **state)
{
    (void)state;
    const struct bad_case cases[] = {
        {"steps", bad_steps, "\"steps\" (--steps)", "= 0"},
        {"batch_size", bad_batch, "\"batch_size\" (--batch-size)", "= 0"},
        {"seq_len 0", bad_seq_len_zero, "\"seq_len\" (--seq-len)", "= 0"},
        {"seq_len > n_positions", bad_seq_len_long, "\"seq_len\" (--seq-len)", "64 positions"},
        {"grad_accum", bad_accum, "\"grad_accum\" (--grad-accum)", "= 0"},
        {"lr 0", bad_lr_zero, "\"lr\" (--lr)", "out of range"},
        {"lr nan", bad_lr_nan, "\"lr\" (--lr)", "out of range"},
        {"min_lr < 0", bad_min_lr_neg, "\"min_lr\" (--min-lr)", "out of range"},
        {"min_lr > lr", bad_min_lr_above, "\"min_lr\" (--min-lr)", "\"lr\" (--lr)"},
        {"schedule", bad_schedule, "\"schedule\" (--schedule)", "nodecay"},
        {"warmup < 0", bad_warmup_neg, "\"warmup_steps\" (--warmup)", "= -5"},
        {"warmup >= steps", bad_warmup_long, "\"warmup_steps\" (--warmup)", "\"steps\" (--steps) = 100"},
        {"lr_gamma 0", bad_gamma_zero, "\"lr_gamma\"", "out of range"},
        {"lr_gamma > 1", bad_gamma_big, "\"lr_gamma\"", "out of range"},
        {"weight_decay", bad_wd, "\"weight_decay\" (--weight-decay)", "out of range"},
        {"beta1", bad_beta1, "\"beta1\"", "out of range"},
        {"beta2", bad_beta2, "\"beta2\"", "out of range"},
        {"eps", bad_eps, "\"eps\"", "out of range"},
        {"grad_clip", bad_clip, "\"grad_clip\" (--grad-clip)", "out of range"},
        {"eval_every", bad_eval_every, "\"eval_every\" (--eval-every)", "= -1"},
        {"eval_batches", bad_eval_batches, "\"eval_batches\" (--eval-batches)", "= 0"},
        {"save_every", bad_save_every, "\"save_every\" (--save-every)", "= -2"},
        {"gpu_mem on the CPU", bad_gpu_mem_cpu, "\"gpu_mem\" (--gpu-mem)", "--device cuda"},
        {"weights on the CPU", bad_weights_cpu, "\"weights\" (--weights)", "--device cuda"},
        {"weights host, optimizer gpu", bad_weights_host_gpu_opt, "\"weights\" (--weights)", "--optimizer cpu or server"},
        {"weights host, ZeRO-2", bad_weights_host_zero2, "\"weights\" (--weights)", "--zero-level 3"},
        {"bf16 moments, optimizer gpu", bad_moments_bf16_gpu_opt, "\"adam_moments\" (--adam-moments)", "--optimizer cpu"},
        {"moments on disk, CPU device, ZeRO-2", bad_moments_dir_cpu, "\"moments_dir\" (--moments-dir)", "--zero-level 3"},
        {"log_every", bad_log_every, "\"log_every\" (--log-every)", "= 0"},
        {"seed", bad_seed, "\"seed\" (--seed)", "= -1"},
        {"threads", bad_threads, "\"threads\" (--threads)", "= -2"},
        {"train_data", bad_train_data, "\"train_data\" (--train-data)", "ztrain tokenize"},
        {"out_dir", bad_out_dir, "\"out_dir\" (--out)", NULL},
        {"no model", bad_model_missing, "--model", "\"model\""},
        {"model heads", bad_model_heads, "n_head", NULL},
        {"stop_at_step", bad_stop_at, "stop_at_step", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        zt_train_config c;
        valid_config(&c);
        cases[i].apply(&c);
        zt_err err = {{0}};
        int rc = zt_train_config_validate(&c, &err);
        if (rc != ZT_EINVAL_CONFIG)
            fail_msg("case '%s': validate returned %d, expected ZT_EINVAL_CONFIG", cases[i].what, rc);
        if (!strstr(err.msg, cases[i].needle1) || (cases[i].needle2 && !strstr(err.msg, cases[i].needle2)))
            fail_msg("case '%s': message '%s' does not contain '%s' and '%s'", cases[i].what, err.msg,
                     cases[i].needle1, cases[i].needle2 ? cases[i].needle2 : "");
    }

    /* Warmup as long as the run is fine when nothing decays after it. */
    zt_train_config c;
    valid_config(&c);
    c.warmup_steps = 100;
    c.schedule = ZT_SCHEDULE_NODECAY;
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_validate(&c, &err), 0);
}

/* Typed settings: each value is read by name from flags and files, a wrong name is refused at once with
 * the accepted ones, and every value saves and reads back as its name. */
static void test_typed_settings(void **state)
{
    (void)state;
    static const struct {
        const char *flag, *value, *needle;
    } bad[] = {
        {"--schedule", "cosin", "nodecay, noam, linear, cosine or exponential"},
        {"--device", "gpu", "cpu or cuda"},
        {"--precision", "fp8", "auto, fp32, bf16 or fp16"},
        {"--optimizer", "host", "auto, gpu, cpu or server"},
        {"--checkpointing", "every:0", "every:K"},
        {"--checkpointing", "some", "none, all or every:K"},
        {"--state-store", "disk", "ram or nvme:DIR"},
        {"--state-store", "nvme:", "ram or nvme:DIR"},
        {"--gpu-mem", "lots", "11GiB"},
        {"--gpu-mem", "-1GiB", "11GiB"},
        {"--weights", "cpu", "auto, gpu, host or masters"},
        {"--offload", "disk", "nvme:DIR"},
        {"--offload", "nvme:", "nvme:DIR"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zt_train_config c;
        valid_config(&c);
        zt_err err = {{0}};
        if (zt_train_config_set_flag(&c, bad[i].flag, bad[i].value, &err) != ZT_EINVAL_CONFIG ||
            !strstr(err.msg, bad[i].flag) || !strstr(err.msg, bad[i].needle))
            fail_msg("%s %s: message '%s' lacks the flag or '%s'", bad[i].flag, bad[i].value, err.msg, bad[i].needle);
    }
    zt_train_config c;
    valid_config(&c);
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(&c, "--device", "cuda", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--precision", "bf16", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--optimizer", "server", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--checkpointing", "every:3", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--state-store", "nvme:/tmp/st", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--gpu-mem", "11GiB", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--weights", "host", &err), 0);
    assert_true(c.gpu_mem == 11ULL << 30);
    assert_int_equal(c.weights, ZT_WEIGHTS_HOST);
    assert_int_equal(c.device, ZT_DEVICE_CUDA);
    assert_int_equal(c.precision, ZT_PRECISION_BF16);
    assert_int_equal(c.optimizer, ZT_OPTIMIZER_SERVER);
    assert_int_equal(c.checkpointing, ZT_CKPT_EVERY);
    assert_int_equal(c.checkpoint_every, 3);
    assert_true(zt_train_config_layer_checkpointed(&c, 3));
    assert_false(zt_train_config_layer_checkpointed(&c, 4));
    assert_int_equal(c.state_store, ZT_STORE_NVME);
    assert_string_equal(c.state_store_dir, "/tmp/st");
    assert_int_equal(zt_train_config_validate(&c, &err), 0);
    /* the masters are streamed from the host AdamW only: refused with the state servers, naming the fix */
    assert_int_equal(zt_train_config_set_flag(&c, "--weights", "masters", &err), 0);
    assert_int_equal(c.weights, ZT_WEIGHTS_MASTERS);
    assert_int_equal(zt_train_config_validate(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--optimizer cpu"));
    assert_non_null(strstr(err.msg, "--weights host"));
    assert_int_equal(zt_train_config_set_flag(&c, "--weights", "host", &err), 0);

    char path[600];
    snprintf(path, sizeof(path), "%s/typed.json", g_dir);
    assert_int_equal(zt_train_config_save(&c, path, "model_config.json", &err), 0);
    zt_train_config back;
    zt_train_config_init(&back);
    if (zt_train_config_load_file(&back, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(back.device, ZT_DEVICE_CUDA);
    assert_int_equal(back.precision, ZT_PRECISION_BF16);
    assert_int_equal(back.optimizer, ZT_OPTIMIZER_SERVER);
    assert_int_equal(back.checkpointing, ZT_CKPT_EVERY);
    assert_int_equal(back.checkpoint_every, 3);
    assert_int_equal(back.state_store, ZT_STORE_NVME);
    assert_string_equal(back.state_store_dir, "/tmp/st");
    assert_true(back.gpu_mem == 11ULL << 30);
    assert_int_equal(back.weights, ZT_WEIGHTS_HOST);

    /* --offload is shorthand for the optimizer's placement and the embedded server's store */
    zt_train_config o;
    valid_config(&o);
    assert_int_equal(zt_train_config_set_flag(&o, "--offload", "nvme:/tmp/st2", &err), 0);
    assert_int_equal(o.optimizer, ZT_OPTIMIZER_SERVER);
    assert_int_equal(o.state_store, ZT_STORE_NVME);
    assert_string_equal(o.state_store_dir, "/tmp/st2");
    assert_int_equal(zt_train_config_set_flag(&o, "--offload", "cpu", &err), 0);
    assert_int_equal(o.optimizer, ZT_OPTIMIZER_CPU);
    /* a cap that is not a whole number of MiB saves as bytes and reads back */
    assert_int_equal(zt_train_config_set_flag(&o, "--gpu-mem", "1000000000", &err), 0);
    assert_true(o.gpu_mem == 1000000000ULL);

    /* a file with a bad value names the file and the key */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"device\": \"tpu\"}\n", f);
    fclose(f);
    zt_train_config_init(&back);
    assert_int_equal(zt_train_config_load_file(&back, path, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "typed.json"));
    assert_non_null(strstr(err.msg, "'tpu'"));
    assert_non_null(strstr(err.msg, "cpu or cuda"));

    /* loss scales are powers of two */
    valid_config(&c);
    c.loss_scale = 1000.0;
    assert_int_equal(zt_train_config_validate(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "powers of two"));
}

/* save_grads: off by default, a flag with no value or true/false, on either device. */
static void test_save_grads_flag(void **state)
{
    (void)state;
    zt_train_config c;
    valid_config(&c);
    assert_false(c.save_grads);
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_set_flag(&c, "--save-grads", "", &err), 0);
    assert_true(c.save_grads);
    assert_int_equal(zt_train_config_set_flag(&c, "--save-grads", "false", &err), 0);
    assert_false(c.save_grads);
    assert_int_equal(zt_train_config_set_flag(&c, "--save-grads", "true", &err), 0);
    assert_true(c.save_grads);
    assert_int_equal(zt_train_config_set_flag(&c, "--save-grads", "maybe", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "expected true or false, got 'maybe'"));
    assert_true(c.save_grads);
    assert_int_equal(zt_train_config_validate(&c, &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--device", "cuda", &err), 0);
    assert_int_equal(zt_train_config_validate(&c, &err), 0); /* the GPU trainer downloads its gradients */
}

static void test_save_and_load_back(void **state)
{
    (void)state;
    zt_train_config c;
    valid_config(&c);
    zt_err err = {{0}};
    c.lr = 3.0000000000000004e-4; /* needs all 17 digits */
    c.grad_accum = 3;
    c.shuffle = false;
    snprintf(c.val_data, sizeof(c.val_data), "%s/v_*.bin", g_dir);
    c.schedule = ZT_SCHEDULE_EXPONENTIAL;

    char dir[512], path[600], model_path[600];
    snprintf(dir, sizeof(dir), "%s/saved", g_dir);
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    snprintf(model_path, sizeof(model_path), "%s/model_config.json", dir);
    if (zt_train_config_save(&c, path, "model_config.json", &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(zt_family_config_save(&c.model, model_path, &err), 0);

    zt_train_config back;
    zt_train_config_init(&back);
    if (zt_train_config_load_file(&back, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(zt_train_config_resolve(&back, &err), 0);
    assert_string_equal(back.model_path, model_path);
    assert_int_equal(ZT_GPT2_CONFIG(&back.model)->n_layer, ZT_GPT2_CONFIG(&c.model)->n_layer);
    assert_int_equal(ZT_GPT2_CONFIG(&back.model)->n_head, ZT_GPT2_CONFIG(&c.model)->n_head);
    assert_int_equal(ZT_GPT2_CONFIG(&back.model)->n_embd, ZT_GPT2_CONFIG(&c.model)->n_embd);
    assert_int_equal(ZT_GPT2_CONFIG(&back.model)->n_positions, ZT_GPT2_CONFIG(&c.model)->n_positions);
    assert_int_equal(ZT_GPT2_CONFIG(&back.model)->vocab_size, ZT_GPT2_CONFIG(&c.model)->vocab_size);
    assert_true(ZT_GPT2_CONFIG(&back.model)->layer_norm_epsilon == ZT_GPT2_CONFIG(&c.model)->layer_norm_epsilon);
    /* A relative path is saved as an absolute one. */
    char cwd[512], want[1200];
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    snprintf(want, sizeof(want), "%s/data/x_train_*.bin", cwd);
    assert_string_equal(back.train_data, want);
    assert_string_equal(back.val_data, c.val_data);
    assert_string_equal(back.init_from, "");
    assert_true(back.lr == c.lr);
    assert_true(back.min_lr == c.min_lr);
    assert_int_equal(back.grad_accum, 3);
    assert_int_equal(back.warmup_steps, c.warmup_steps);
    assert_int_equal(back.steps, c.steps);
    assert_false(back.shuffle);
    assert_int_equal(back.schedule, ZT_SCHEDULE_EXPONENTIAL);
    assert_true(back.eps == c.eps && back.beta2 == c.beta2 && back.lr_gamma == c.lr_gamma);
    assert_int_equal(zt_train_config_validate(&back, &err), 0);
}

int main(void)
{
    zt_log_set_level(ZT_LOG_WARN); /* zt_train_config_log's lines would drown cmocka's report */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_file_then_flags),
        cmocka_unit_test(test_inline_model),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_validation_errors),
        cmocka_unit_test(test_typed_settings),
        cmocka_unit_test(test_save_grads_flag),
        cmocka_unit_test(test_save_and_load_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
