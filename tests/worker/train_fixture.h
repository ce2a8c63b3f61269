/* Shared set-up of the tests that run the trainer (test_trainer, test_placement, test_sft_train, test_t5_train,
 * tests/gpu/test_gpu_training): a temporary folder for shards and runs, token shards written into it, the
 * resolve-and-validate step every test config ends with, a training run that must succeed, and the checks
 * that the runs on examples share (the loss falls, two ranks train as one, a resumed run ends on the same bits).
 * Include after <cmocka.h>. */
#ifndef ZT_TESTS_TRAIN_FIXTURE_H
#define ZT_TESTS_TRAIN_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/data/dataloader.h"
#include "worker/models/gpt2.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

/* Makes a fresh folder $TMPDIR/<prefix>XXXXXX (or under /tmp) in dir; returns 0 or -1. */
static inline int zt_fixture_make_dir(char *dir, size_t cap, const char *prefix)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/%sXXXXXX", tmp && tmp[0] ? tmp : "/tmp", prefix);
    return mkdtemp(dir) ? 0 : -1;
}

/* Removes the folder and everything in it; returns 0 or -1. */
static inline int zt_fixture_remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes n tokens as the shard dir/name; fails the test on error. */
static inline void zt_fixture_write_shard(const char *dir, const char *name, const uint16_t *tok, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    zt_err err = {{0}};
    if (zt_shard_write(path, tok, n, &err) != 0)
        fail_msg("%s", err.msg);
}

/* Writes n tokens below vocab as the shard dir/name: a phrase of 13 tokens with a random token (from
 * seed) at every fourth position, something a model can learn, but not all of it. */
static inline void zt_fixture_write_phrase_shard(const char *dir, const char *name, size_t n, uint32_t seed,
                                                 int vocab)
{
    uint16_t *tok = malloc(n * sizeof(uint16_t));
    assert_non_null(tok);
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (uint16_t)(i % 4 == 3 ? (x >> 16) % (uint32_t)vocab : ((i % 13) * 17 + 3) % (size_t)vocab);
    }
    zt_fixture_write_shard(dir, name, tok, n);
    free(tok);
}

/* The forward and backward passes of one step over the whole model, as a reference for the engine: zeroes
 * the gradients, then for each of grad_accum micro-batches takes the next batch of B x T tokens from dl
 * (into inputs and targets) and runs forward and backward with loss scale 1/grad_accum, so the gradient
 * slab ends up holding the gradient of the mean loss. Returns that mean loss. */
static inline float zt_fixture_accumulate(zt_gpt2 *model, zt_dataloader *dl, int grad_accum, int B, int T,
                                          int32_t *inputs, int32_t *targets)
{
    zt_gpt2_zero_grad(model);
    float scale = 1.0f / (float)grad_accum;
    double sum = 0.0;
    for (int i = 0; i < grad_accum; i++) {
        zt_dataloader_next(dl, inputs, targets);
        sum += zt_gpt2_forward(model, inputs, targets, B, T);
        zt_gpt2_backward(model, scale);
    }
    return (float)(sum / grad_accum);
}

/* Resolves the automatic settings of a test config and validates it, as zt_cmd_train would. */
static inline void zt_fixture_finish_config(zt_train_config *c)
{
    zt_err err = {{0}};
    assert_int_equal(zt_train_config_resolve(c, &err), 0);
    if (zt_train_config_validate(c, &err) != 0)
        fail_msg("%s", err.msg);
}

/* Trains as c says; fails the test, naming the run directory and the reason, if the run fails. */
static inline void zt_fixture_train_ok(const zt_train_config *c, zt_train_result *res)
{
    zt_err err = {{0}};
    int rc = zt_trainer_run(c, res, &err);
    if (rc != 0)
        fail_msg("zt_trainer_run (%s) failed (%d): %s", c->out_dir, rc, err.msg);
}

/* Trains as c says with W ranks, each a forked process with RANK, WORLD_SIZE and MASTER_PORT set as a
 * launcher would: fills losses with rank 0's train losses of its first nsteps steps and val (may be NULL)
 * with its last validation loss and accuracy; fails the test when a rank fails. */
static inline void zt_fixture_train_ranks(const zt_train_config *c, int W, float *losses, int nsteps,
                                          float val[2])
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pids[16];
    assert_true(W >= 1 && W <= 16);
    fflush(NULL);
    for (int r = 0; r < W; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            char v[16];
            snprintf(v, sizeof v, "%d", r);
            setenv("RANK", v, 1);
            snprintf(v, sizeof v, "%d", W);
            setenv("WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", 20000 + (int)(getppid() % 20000));
            setenv("MASTER_PORT", v, 1);
            zt_train_result res;
            zt_err err = {{0}};
            if (zt_trainer_run(c, &res, &err) < 0) {
                fprintf(stderr, "rank %d: %s\n", r, err.msg);
                _exit(1);
            }
            const size_t n = (size_t)nsteps * sizeof(float);
            const float last[2] = {res.last_val_loss, res.last_val_accuracy};
            if (r == 0 && (write(fds[1], res.losses, n) != (ssize_t)n ||
                           write(fds[1], last, sizeof last) != (ssize_t)sizeof last))
                _exit(1);
            _exit(0);
        }
    }
    close(fds[1]);
    size_t got = 0, want = (size_t)nsteps * sizeof(float);
    while (got < want) {
        ssize_t n = read(fds[0], (char *)losses + got, want - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    float last[2] = {NAN, NAN};
    if (got == want && read(fds[0], last, sizeof last) == (ssize_t)sizeof last && val) {
        val[0] = last[0];
        val[1] = last[1];
    }
    close(fds[0]);
    for (int r = 0; r < W; r++) {
        int st;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("%s: rank %d of %d failed (status %d)", c->out_dir, r, W, st);
    }
    assert_int_equal(got, want);
}

/* A test's config of a run named out (a folder of the test's temporary folder): the test's own function, which
 * ends with zt_fixture_finish_config. */
typedef void (*zt_fixture_config_fn)(zt_train_config *c, const char *out);

/* The files of a test that trains on examples: its temporary folder, the model config and tokenizer of the
 * source tree, and the training and validation examples in the folder (which the test writes). */
typedef struct {
    char dir[256];
    char model[512], tok[512], train[512], val[512];
} zt_fixture_examples;

/* Makes x's temporary folder ($TMPDIR/<prefix>XXXXXX) and fills its paths: $ZT_SOURCE_DIR/examples/<model_file>,
 * the byte-level examples/byte-tokenizer.json, dir/train.jsonl and dir/val.jsonl. Returns 0, or -1 without
 * ZT_SOURCE_DIR or when the folder cannot be made. */
static inline int zt_fixture_examples_setup(zt_fixture_examples *x, const char *prefix, const char *model_file)
{
    const char *src = getenv("ZT_SOURCE_DIR");
    if (!src || zt_fixture_make_dir(x->dir, sizeof x->dir, prefix) < 0)
        return -1;
    snprintf(x->model, sizeof x->model, "%s/examples/%s", src, model_file);
    snprintf(x->tok, sizeof x->tok, "%s/examples/byte-tokenizer.json", src);
    snprintf(x->train, sizeof x->train, "%s/train.jsonl", x->dir);
    snprintf(x->val, sizeof x->val, "%s/val.jsonl", x->dir);
    return 0;
}

/* The settings of the tests that train on the examples of x: its model config, tokenizer, training and
 * validation examples, the run directory x->dir/out, steps steps of batch_size x seq_len, a learning rate
 * warming up over 2 steps from 3e-3 to 3e-4, checkpoints every 6 steps, one thread, no log lines. The caller
 * sets the rest (eval_every first) and calls zt_fixture_finish_config. */
static inline void zt_fixture_examples_config(zt_train_config *c, const zt_fixture_examples *x, const char *out,
                                              int steps, int batch_size, int seq_len)
{
    zt_train_config_init(c);
    snprintf(c->model_path, sizeof c->model_path, "%s", x->model);
    snprintf(c->tokenizer, sizeof c->tokenizer, "%s", x->tok);
    snprintf(c->sft_data, sizeof c->sft_data, "%s", x->train);
    snprintf(c->sft_val_data, sizeof c->sft_val_data, "%s", x->val);
    snprintf(c->out_dir, sizeof c->out_dir, "%s/%s", x->dir, out);
    c->steps = steps;
    c->batch_size = batch_size;
    c->seq_len = seq_len;
    c->lr = 3e-3;
    c->min_lr = 3e-4;
    c->warmup_steps = 2;
    c->save_every = 6;
    c->log_every = 100;
    c->threads = 1;
}

/* Reads the file path whole into a buffer the caller frees, its size in *n; fails the test when it cannot. */
static inline char *zt_fixture_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *d = malloc(*n + 1);
    assert_non_null(d);
    assert_int_equal(fread(d, 1, *n, f), *n);
    fclose(f);
    return d;
}

/* Fails unless the files a and b hold the same bytes. */
static inline void zt_fixture_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *da = zt_fixture_slurp(a, &na), *db = zt_fixture_slurp(b, &nb);
    if (na != nb || memcmp(da, db, na) != 0)
        fail_msg("%s and %s differ", a, b);
    free(da);
    free(db);
}

/* Prints, labelled what, res's train loss of its first and last of steps steps and its first and last
 * validation loss, and fails unless each last one is below factor times the first. */
static inline void zt_fixture_expect_loss_falls(const char *what, const zt_train_result *res, int steps,
                                                float factor)
{
    print_message("%s: train loss %.4f -> %.4f, val loss %.4f -> %.4f\n", what, (double)res->losses[0],
                  (double)res->losses[steps - 1], (double)res->first_val_loss, (double)res->last_val_loss);
    assert_true(res->losses[steps - 1] < factor * res->losses[0]);
    assert_true(res->last_val_loss < factor * res->first_val_loss);
}

/* Trains config's run "W1" with one rank and "W2" with two (both without evaluation), steps steps each: their
 * train losses into one and two, the paths of their last checkpoints' model.safetensors into p1 and p2. */
static inline void zt_fixture_train_one_and_two(zt_fixture_config_fn config, int steps, float *one, float *two,
                                                char *p1, char *p2, size_t cap)
{
    zt_train_config c;
    float val[2];
    config(&c, "W1");
    c.eval_every = 0;
    zt_fixture_train_ranks(&c, 1, one, steps, val);
    snprintf(p1, cap, "%s/ckpt_%06d/model.safetensors", c.out_dir, steps);
    config(&c, "W2");
    c.eval_every = 0;
    zt_fixture_train_ranks(&c, 2, two, steps, val);
    snprintf(p2, cap, "%s/ckpt_%06d/model.safetensors", c.out_dir, steps);
}

/* A run stopped at step stop and resumed from its checkpoint ends on the bits of a run straight through:
 * trains config's run "S" straight (steps steps) and "R" twice, stopped and resumed; fails unless the resumed
 * run's train losses equal the straight run's and their last checkpoints' weights are the same bytes. */
static inline void zt_fixture_check_resume(zt_fixture_config_fn config, int steps, int stop)
{
    zt_train_config c;
    zt_train_result straight, first, second;
    config(&c, "S");
    zt_fixture_train_ok(&c, &straight);
    char a[ZT_TRAIN_PATH_MAX + 64], b[ZT_TRAIN_PATH_MAX + 64];
    snprintf(a, sizeof a, "%s/ckpt_%06d/model.safetensors", c.out_dir, steps);
    config(&c, "R");
    c.stop_at_step = stop;
    zt_fixture_train_ok(&c, &first);
    assert_true(first.interrupted);
    config(&c, "R");
    char r[ZT_TRAIN_PATH_MAX + 64];
    snprintf(r, sizeof r, "%s/ckpt_%06d", c.out_dir, stop);
    assert_true(strlen(r) < sizeof c.resume);
    memcpy(c.resume, r, strlen(r) + 1);
    zt_fixture_train_ok(&c, &second);
    for (int i = 0; i < steps - stop; i++)
        assert_true(second.losses[i] == straight.losses[stop + i]);
    snprintf(b, sizeof b, "%s/ckpt_%06d/model.safetensors", c.out_dir, steps);
    zt_fixture_same_file(a, b);
    zt_train_result_free(&straight);
    zt_train_result_free(&first);
    zt_train_result_free(&second);
}

#endif
