/* Tests of the optimizer placements of the single-process trainer (worker/train/placement.h): a tiny
 * GPT-2 trains 6 steps with --optimizer cpu, server with the embedded core on RAM, server with the
 * embedded core on the NVMe tier (in a temporary directory), and server with one real ztrain-server
 * process on loopback (ZT_SERVER_BIN names the binary; that case is skipped without it). Every run must
 * give the same losses and the same final checkpoint (parameters and Adam moments), bit for bit, as a
 * reference loop written here with kernels/adamw.h's zt_cpu_adamw_update (the CPU trainer's update before
 * placements existed). Resuming a cpu run with placement server, and a server run with placement cpu,
 * continue the same losses and end on the same checkpoint. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"
#include "kernels/adamw.h"
#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/train/checkpoint.h"
#include "worker/train/config.h"
#include "worker/engine/optimizer.h"
#include "worker/train/schedule.h"
#include "worker/train/trainer.h"

#include "train_fixture.h"

#define VOCAB 64
#define STEPS 6

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    if (zt_fixture_make_dir(g_dir, sizeof(g_dir), "zt_test_placement_") != 0)
        return -1;
    enum { N = 4000 };
    static uint16_t tok[N];
    for (size_t i = 0; i < N; i++)
        tok[i] = (uint16_t)(((i % 11) * 7 + (i / 97) % 5) % VOCAB);
    zt_fixture_write_shard(g_dir, "p_train_000.bin", tok, N);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return zt_fixture_remove_dir(g_dir);
}

static void base_config(zt_train_config *c, const char *out, const char *optimizer)
{
    zt_train_config_init(c);
    zt_family_config_default(&c->model);
    ZT_GPT2_CONFIG(&c->model)->n_layer = 2;
    ZT_GPT2_CONFIG(&c->model)->n_head = 2;
    ZT_GPT2_CONFIG(&c->model)->n_embd = 32;
    ZT_GPT2_CONFIG(&c->model)->n_positions = 32;
    ZT_GPT2_CONFIG(&c->model)->vocab_size = VOCAB;
    c->model_loaded = true;
    snprintf(c->train_data, sizeof(c->train_data), "%s/p_train_*.bin", g_dir);
    snprintf(c->out_dir, sizeof(c->out_dir), "%s/%s", g_dir, out);
    zt_err ferr = {{0}};
    if (zt_train_config_set_flag(c, "--optimizer", optimizer, &ferr) != 0)
        fail_msg("%s", ferr.msg);
    c->steps = STEPS;
    c->batch_size = 2;
    c->seq_len = 16;
    c->grad_accum = 2;
    c->lr = 1e-2;
    c->min_lr = 1e-3;
    c->warmup_steps = 2;
    c->save_every = 3;
    c->log_every = 100;
    c->seed = 7;
    c->threads = 2;
    c->grad_clip = 0.5; /* small enough that clipping is active */
    zt_fixture_finish_config(c);
}

/* The reference: the trainer's loop with the per-tensor zt_cpu_adamw_update of kernels/adamw.h. */
static void reference(float *losses, float **params_out, size_t *n_out)
{
    zt_train_config c;
    base_config(&c, "unused", "cpu");
    zt_err err = {{0}};
    zt_gpt2 *model = NULL;
    zt_dataloader *dl = NULL;
    assert_int_equal(zt_gpt2_create(&model, ZT_GPT2_CONFIG(&c.model), 2, 16, (uint64_t)c.seed, &err), 0);
    assert_int_equal(zt_dataloader_open(&dl, c.train_data, 2, 16, c.shuffle, (uint64_t)c.seed, &err), 0);
    size_t n = zt_gpt2_num_params(model);
    float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    int32_t in[32], tg[32];
    zt_schedule s = {.lr = c.lr, .min_lr = c.min_lr, .warmup_steps = c.warmup_steps, .total_steps = c.steps,
                     .gamma = c.lr_gamma};
    s.kind = c.schedule;
    for (int step = 1; step <= STEPS; step++) {
        losses[step - 1] = zt_fixture_accumulate(model, dl, (int)c.grad_accum, 2, 16, in, tg);
        const float *g = zt_gpt2_grads(model);
        double norm = zt_optimizer_grad_norm(g, n);
        zt_adamw_params p = {.lr = (float)zt_schedule_lr(&s, step), .beta1 = (float)c.beta1,
                             .beta2 = (float)c.beta2, .eps = (float)c.eps,
                             .grad_scale = zt_optimizer_clip_coef(norm, c.grad_clip), .step = step};
        for (int i = 0; i < zt_gpt2_num_tensors(model); i++) {
            const zt_param_info *t = zt_gpt2_tensor(model, i);
            p.weight_decay = t->weight_decay ? (float)c.weight_decay : 0.0f;
            zt_cpu_adamw_update(zt_gpt2_params(model) + t->offset, m + t->offset, v + t->offset, g + t->offset,
                                t->numel, &p);
        }
    }
    *params_out = malloc(n * sizeof(float));
    memcpy(*params_out, zt_gpt2_params(model), n * sizeof(float));
    *n_out = n;
    free(m);
    free(v);
    zt_dataloader_close(dl);
    zt_gpt2_destroy(model);
}

static char *slurp(const char *out, const char *file, size_t *len)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s/ckpt_%06d/%s", g_dir, out, STEPS, file);
    char *data = NULL;
    zt_err err = {{0}};
    if (zt_read_file(path, &data, len, &err) != 0)
        fail_msg("%s", err.msg);
    return data;
}

/* The final checkpoints of runs a and b hold the same parameters and moments, bit for bit. */
static void expect_same_checkpoint(const char *a, const char *b)
{
    const char *files[] = {"model.safetensors", "optim.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t na = 0, nb = 0;
        char *da = slurp(a, files[i], &na), *db = slurp(b, files[i], &nb);
        if (na != nb || memcmp(da, db, na) != 0)
            fail_msg("%s of %s and %s differ", files[i], a, b);
        free(da);
        free(db);
    }
}

static void expect_same_losses(const float *want, const zt_train_result *res, const char *what)
{
    for (int64_t s = res->start_step; s < res->end_step; s++)
        if (memcmp(&want[s], &res->losses[s - res->start_step], sizeof(float)) != 0)
            fail_msg("%s: loss of step %lld is %.9g, expected %.9g", what, (long long)s + 1,
                     (double)res->losses[s - res->start_step], (double)want[s]);
}

/* Starts ztrain-server on a free loopback port; returns its pid and writes "127.0.0.1:PORT" into addr. */
static pid_t start_server(const char *bin, char *addr, size_t cap)
{
    char snap[300];
    snprintf(snap, sizeof(snap), "%s/snapshots", g_dir);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(bin, bin, "--listen", "127.0.0.1:0", "--threads", "2", "--snapshot-dir", snap, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[256];
    int port = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "ztrain-server ready port=%d", &port) == 1)
            break;
    fclose(f);
    if (port <= 0)
        fail_msg("%s did not print its ready line", bin);
    snprintf(addr, cap, "127.0.0.1:%d", port);
    return pid;
}

static void test_placements_are_bit_identical(void **state)
{
    (void)state;
    float want[STEPS];
    float *ref_params = NULL;
    size_t n = 0;
    reference(want, &ref_params, &n);

    zt_train_config c;
    zt_train_result res;
    base_config(&c, "cpu", "cpu");
    zt_fixture_train_ok(&c, &res);
    expect_same_losses(want, &res, "cpu");
    zt_train_result_free(&res);

    base_config(&c, "ram", "server");
    zt_fixture_train_ok(&c, &res);
    expect_same_losses(want, &res, "server (embedded, RAM)");
    zt_train_result_free(&res);
    expect_same_checkpoint("cpu", "ram");

    base_config(&c, "nvme", "server");
    c.state_store = ZT_STORE_NVME;
    snprintf(c.state_store_dir, sizeof(c.state_store_dir), "%s/nvme_store", g_dir);
    zt_fixture_train_ok(&c, &res);
    expect_same_losses(want, &res, "server (embedded, NVMe)");
    zt_train_result_free(&res);
    expect_same_checkpoint("cpu", "nvme");

    /* the checkpoint's parameters are the reference loop's */
    zt_family_model *model = NULL;
    zt_optimizer opt;
    zt_ckpt_state st;
    zt_err err = {{0}};
    char ck[600];
    snprintf(ck, sizeof(ck), "%s/ram/ckpt_%06d", g_dir, STEPS);
    base_config(&c, "unused", "cpu");
    assert_int_equal(zt_family_model_create(&model, &c.model, 2, 16, 1, &err), 0);
    assert_int_equal(zt_optimizer_init(&opt, n, c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_clip, &err), 0);
    if (zt_checkpoint_load(ck, model, &opt, &st, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(zt_family_model_params(model), ref_params, n * sizeof(float));
    zt_optimizer_free(&opt);
    zt_family_model_destroy(model);

    const char *bin = getenv("ZT_SERVER_BIN");
    if (bin && bin[0]) {
        char addr[64];
        pid_t pid = start_server(bin, addr, sizeof(addr));
        base_config(&c, "remote", "server");
        snprintf(c.servers, sizeof(c.servers), "%s", addr);
        zt_err e = {{0}};
        int rc = zt_trainer_run(&c, &res, &e);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        if (rc != 0)
            fail_msg("remote run failed: %s", e.msg);
        expect_same_losses(want, &res, "server (1 ztrain-server on loopback)");
        zt_train_result_free(&res);
        /* the moments stay on the server: compare the parameters */
        size_t na = 0, nb = 0;
        char *da = slurp("cpu", "model.safetensors", &na), *db = slurp("remote", "model.safetensors", &nb);
        assert_true(na == nb && memcmp(da, db, na) == 0);
        free(da);
        free(db);
        /* its checkpoints lack the moments: continuing one with placement cpu is refused */
        base_config(&c, "remote", "cpu");
        c.steps = STEPS + 1;
        snprintf(c.resume, sizeof(c.resume), "%s/remote", g_dir);
        assert_int_equal(zt_trainer_run(&c, &res, &e), ZT_EINVAL_CONFIG);
        assert_non_null(strstr(e.msg, "remote state servers"));
        zt_train_result_free(&res);
        /* every checkpoint asked the server for a snapshot of the same step */
        char latest[600];
        snprintf(latest, sizeof(latest), "%s/snapshots/remote/server0of1/step_%08d/manifest.json", g_dir, STEPS);
        assert_int_equal(access(latest, F_OK), 0);
    } else {
        print_message("ZT_SERVER_BIN is not set: the loopback ztrain-server case is skipped\n");
    }
    free(ref_params);
}

/* cpu for 3 steps, then resumed with placement server (embedded): the same losses and final checkpoint
 * as the uninterrupted cpu run; and the other way round. */
static void test_resume_across_placements(void **state)
{
    (void)state;
    float want[STEPS];
    float *ref_params = NULL;
    size_t n = 0;
    reference(want, &ref_params, &n);
    free(ref_params);
    const char *pairs[2][3] = {{"cpu2server", "cpu", "server"}, {"server2cpu", "server", "cpu"}};
    for (int i = 0; i < 2; i++) {
        zt_train_config c;
        zt_train_result res;
        base_config(&c, pairs[i][0], pairs[i][1]);
        c.stop_at_step = 3;
        zt_fixture_train_ok(&c, &res);
        assert_true(res.interrupted);
        expect_same_losses(want, &res, pairs[i][1]);
        zt_train_result_free(&res);
        base_config(&c, pairs[i][0], pairs[i][2]);
        snprintf(c.resume, sizeof(c.resume), "%s/%s", g_dir, pairs[i][0]);
        zt_fixture_train_ok(&c, &res);
        assert_int_equal(res.start_step, 3);
        expect_same_losses(want, &res, pairs[i][0]);
        zt_train_result_free(&res);
    }
    /* both end on the checkpoint of an uninterrupted run (test_placements_are_bit_identical wrote "cpu") */
    expect_same_checkpoint("cpu", "cpu2server");
    expect_same_checkpoint("cpu", "server2cpu");
}

static void test_config_checks(void **state)
{
    (void)state;
    zt_train_config c;
    zt_err err = {{0}};
    base_config(&c, "x", "cpu");
    snprintf(c.servers, sizeof(c.servers), "127.0.0.1:1");
    assert_int_equal(zt_train_config_validate(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--servers"));
    base_config(&c, "x", "cpu"); /* the GPU computes, the CPU runs AdamW */
    c.device = ZT_DEVICE_CUDA;
    assert_int_equal(zt_train_config_validate(&c, &err), 0);
    base_config(&c, "x", "cpu");
    c.optimizer = ZT_OPTIMIZER_GPU;
    assert_int_equal(zt_train_config_validate(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--device cuda"));
    base_config(&c, "x", "server");
    assert_int_equal(zt_train_config_set_flag(&c, "--state-store", "disk", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "nvme:DIR"));
    base_config(&c, "x", "cpu"); /* the NVMe store belongs to the embedded state server */
    assert_int_equal(zt_train_config_set_flag(&c, "--state-store", "nvme:/tmp/x", &err), 0);
    assert_int_equal(zt_train_config_validate(&c, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--optimizer server"));
    base_config(&c, "x", "cpu");
    assert_int_equal(zt_train_config_set_flag(&c, "--checkpointing", "every:0", &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "every:K"));
    /* the flags */
    zt_train_config_init(&c);
    assert_int_equal(zt_train_config_set_flag(&c, "--optimizer", "server", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--servers", "a:1,b:2", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--token-file", "t", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--tls-ca", "ca", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--tls-cert", "c", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--tls-key", "k", &err), 0);
    assert_int_equal(zt_train_config_set_flag(&c, "--zero-level", "2", &err), 0);
    assert_string_equal(c.servers, "a:1,b:2");
    assert_int_equal(c.zero_level, 2);
}

/* The automatic rewind after a state server restarted from an older snapshot: only to an existing
 * checkpoint of the server's step, at most ZT_TRAIN_MAX_REWINDS times, otherwise the run's own message
 * (how to resume by hand) with the reason added. */
/* The NVMe tier failing in the middle of a run (a disk that fills up or stops taking writes, here a soft
 * file size limit of one byte set after step 4, when the checkpoint of step 3 is on disk): the run stops at
 * the next step with an error naming what failed, the checkpoint of step 3 verifies, and resuming it (the
 * limit lifted) ends on the uninterrupted run's checkpoint, bit for bit. */
static struct rlimit g_fsize;
static void limit_writes_after(void *user, int64_t step)
{
    if (step == *(const int64_t *)user) {
        signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead of killing the process */
        struct rlimit one = {1, g_fsize.rlim_max};
        setrlimit(RLIMIT_FSIZE, &one);
    }
}

static void test_nvme_fails_mid_run(void **state)
{
    (void)state;
    zt_train_config c;
    zt_train_result res;
    base_config(&c, "nvme_ref", "server");
    c.state_store = ZT_STORE_NVME;
    snprintf(c.state_store_dir, sizeof(c.state_store_dir), "%s/nvme_ref_store", g_dir);
    zt_fixture_train_ok(&c, &res);
    zt_train_result_free(&res);

    base_config(&c, "nvme_fail", "server");
    c.state_store = ZT_STORE_NVME;
    snprintf(c.state_store_dir, sizeof(c.state_store_dir), "%s/nvme_fail_store", g_dir);
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &g_fsize), 0);
    static int64_t at = 4;
    zt_trainer_hooks h = {.user = &at, .after_step = limit_writes_after};
    zt_trainer_set_hooks(&h);
    zt_err err = {{0}};
    int rc = zt_trainer_run(&c, &res, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &g_fsize), 0);
    signal(SIGXFSZ, SIG_DFL);
    zt_trainer_set_hooks(NULL);
    print_message("NVMe tier failing after step 4: %s\n", err.msg);
    assert_true(rc < 0);                /* stopped with an error ... */
    assert_int_equal(res.end_step, 4);   /* ... in step 5, whose update could not be written */
    assert_non_null(strstr(err.msg, "File too large"));
    zt_train_result_free(&res);
    char ck[600];
    assert_int_equal(zt_checkpoint_find(c.out_dir, ck, sizeof ck, &err), 0);
    assert_non_null(strstr(ck, "ckpt_000003"));
    if (zt_checkpoint_verify(ck, NULL, &err) != 0)
        fail_msg("%s", err.msg);

    snprintf(c.resume, sizeof(c.resume), "%s/nvme_fail", g_dir);
    zt_fixture_train_ok(&c, &res);
    assert_int_equal(res.end_step, STEPS);
    zt_train_result_free(&res);
    expect_same_checkpoint("nvme_ref", "nvme_fail");
}

static void test_rewind_target(void **state)
{
    (void)state;
    zt_train_config c;
    base_config(&c, "rewind", "server");
    zt_train_result res;
    memset(&res, 0, sizeof(res));
    zt_err err = {{0}};
    char ckpt[ZT_TRAIN_PATH_MAX + 32], path[ZT_TRAIN_PATH_MAX + 64];

    /* not a restarted server: no rewind, the message stays */
    res.rewind_to = -1;
    snprintf(err.msg, sizeof(err.msg), "step failed");
    assert_int_equal(zt_trainer_rewind_target(&c, &res, 0, ckpt, sizeof(ckpt), &err), ZT_ESTATE);
    assert_string_equal(err.msg, "step failed");

    /* the checkpoint of the server's step is missing */
    res.rewind_to = 4;
    snprintf(err.msg, sizeof(err.msg), "server at step 4");
    assert_int_equal(zt_trainer_rewind_target(&c, &res, 0, ckpt, sizeof(ckpt), &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "server at step 4"));
    assert_non_null(strstr(err.msg, "ckpt_000004 is missing"));

    /* it exists: rewind, up to the limit */
    snprintf(path, sizeof(path), "%s/ckpt_000004", c.out_dir);
    assert_int_equal(zt_mkdir_p(path, &err), 0);
    snprintf(path, sizeof(path), "%s/ckpt_000004/manifest.json", c.out_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{}\n", f);
    fclose(f);
    for (int done = 0; done < ZT_TRAIN_MAX_REWINDS; done++) {
        assert_int_equal(zt_trainer_rewind_target(&c, &res, done, ckpt, sizeof(ckpt), &err), 0);
        snprintf(path, sizeof(path), "%s/ckpt_000004", c.out_dir);
        assert_string_equal(ckpt, path);
    }
    snprintf(err.msg, sizeof(err.msg), "server at step 4");
    assert_int_equal(zt_trainer_rewind_target(&c, &res, ZT_TRAIN_MAX_REWINDS, ckpt, sizeof(ckpt), &err), ZT_ESTATE);
    assert_non_null(strstr(err.msg, "server at step 4"));
    assert_non_null(strstr(err.msg, "after 3 automatic rewinds"));
}

int main(void)
{
    zt_log_set_level(ZT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements_are_bit_identical),
        cmocka_unit_test(test_resume_across_placements),
        cmocka_unit_test(test_config_checks),
        cmocka_unit_test(test_rewind_target),
        cmocka_unit_test(test_nvme_fails_mid_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
