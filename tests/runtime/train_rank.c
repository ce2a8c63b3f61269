/* A stand-in for `ztrain train`, for the start-up and placement tests: applies `--flag value` pairs to the
 * training config (as `ztrain train` does after its config file), then runs zt_trainer_run (the launch
 * environment gives the ranks), with SIGINT/SIGTERM asking for a stop. Exit status as `ztrain train`: 0,
 * 1 runtime failure, 2 usage, 130 interrupted.
 *
 * Pauses for the fault tests (tests/placement): with ZT_TEST_PAUSE=where and ZT_TEST_PAUSE_FIFO=path in
 * the environment, the process stops at `where` ("step:N": rank 0 after step N and its checkpoint;
 * "push:N": after the first chunk of block 1 of its gradient push of step N), logs "test pause: where (...)"
 * and goes on when a line can be read from the FIFO; once, or ZT_TEST_PAUSE_TIMES times. The trainer's
 * hooks (zt_trainer_set_hooks) carry them; `ztrain` itself has none. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

static void on_stop_signal(int sig)
{
    (void)sig;
    zt_trainer_request_stop();
}

static int pauses;

/* Pauses at `where` when the environment asks for it there. */
static void pause_at(const char *where)
{
    const char *want = getenv("ZT_TEST_PAUSE"), *fifo = getenv("ZT_TEST_PAUSE_FIFO");
    const char *times = getenv("ZT_TEST_PAUSE_TIMES");
    int allowed = times ? atoi(times) : 1;
    if (!want || !fifo || strcmp(want, where) != 0 || pauses >= allowed)
        return;
    pauses++;
    zt_log(ZT_LOG_WARN, "test pause: %s (waiting for a line on %s)", where, fifo);
    FILE *f = fopen(fifo, "r");
    if (f) {
        char line[64];
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
    }
    zt_log(ZT_LOG_WARN, "test pause: %s: going on", where);
}

static void after_step(void *user, int64_t step)
{
    (void)user;
    char where[48];
    snprintf(where, sizeof where, "step:%lld", (long long)step);
    pause_at(where);
}

static void on_chunk(void *user, int64_t step, int block, int shard, uint64_t bytes_sent)
{
    (void)user;
    (void)shard;
    (void)bytes_sent;
    char where[48];
    snprintf(where, sizeof where, "push:%lld", (long long)step);
    if (block == 1)
        pause_at(where);
}

static void on_state_client(void *user, zt_state_client_t *client)
{
    (void)user;
    zt__state_client_set_chunk_hook(client, on_chunk, NULL);
}

int main(int argc, char **argv)
{
    zt_err err = {{0}};
    zt_train_config cfg;
    zt_train_config_init(&cfg);
    for (int i = 1; i + 1 < argc; i += 2)
        if (zt_train_config_set_flag(&cfg, argv[i], argv[i + 1], &err) < 0) {
            fprintf(stderr, "train_rank: error: %s\n", err.msg);
            return 2;
        }
    if (zt_train_config_resolve(&cfg, &err) < 0 || zt_train_config_validate(&cfg, &err) < 0) {
        fprintf(stderr, "train_rank: error: %s\n", err.msg);
        return 2;
    }
    if (getenv("ZT_TEST_PAUSE")) {
        zt_trainer_hooks h = {.after_step = after_step, .on_state_client = on_state_client};
        zt_trainer_set_hooks(&h);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    zt_train_result res;
    int rc = zt_trainer_run(&cfg, &res, &err);
    bool interrupted = res.interrupted;
    zt_train_result_free(&res);
    if (rc < 0) {
        zt_log(ZT_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    return interrupted ? 130 : 0;
}
