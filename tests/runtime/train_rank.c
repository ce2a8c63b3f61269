/* A stand-in for `ztrain train` as one rank of a multi-rank job, for the start-up tests: applies
 * `--flag value` pairs to the training config (as `ztrain train` does after its config file), then runs
 * zt_zero_train_main when the launch environment has WORLD_SIZE > 1 and zt_trainer_run otherwise, with
 * SIGINT/SIGTERM asking for a stop. Exit status as `ztrain train`: 0, 1 runtime failure, 2 usage, 130
 * interrupted. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "worker/runtime/zero_train.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

static void on_stop_signal(int sig)
{
    (void)sig;
    zt_trainer_request_stop();
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
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    zt_train_result res;
    int rc = zt_zero_train_wanted() ? zt_zero_train_main(&cfg, &res, &err) : zt_trainer_run(&cfg, &res, &err);
    bool interrupted = res.interrupted;
    zt_train_result_free(&res);
    if (rc < 0) {
        zt_log(ZT_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    return interrupted ? 130 : 0;
}
