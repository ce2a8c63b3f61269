/* Tests of `ztrain launch` (worker/cmd_launch.c) with real processes: every rank gets the torchrun
 * environment and its lines come out prefixed with [rN]; a failing rank stops the others and its status
 * becomes the launcher's, with a message naming it; bad flags are usage errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/cli/commands.h"

#include "run_command.h"

/* Runs zt_cmd_launch(argv) in a child with stdout and stderr captured into out; returns its status. */
static int launch(char **argv, char *out, size_t cap)
{
    return zt_test_run_command(zt_cmd_launch, argv, out, cap);
}

static void test_environment_and_prefix(void **state)
{
    (void)state;
    char out[8192];
    char *argv[] = {"launch", "--nproc", "3", "--master-port", "29731", "--", "/bin/sh", "-c",
                    "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT", NULL};
    assert_int_equal(launch(argv, out, sizeof out), 0);
    assert_non_null(strstr(out, "[r0] env 0 3 0 3 127.0.0.1 29731\n"));
    assert_non_null(strstr(out, "[r1] env 1 3 1 3 127.0.0.1 29731\n"));
    assert_non_null(strstr(out, "[r2] env 2 3 2 3 127.0.0.1 29731\n"));
}

static void test_failing_rank_stops_the_job(void **state)
{
    (void)state;
    char out[8192];
    /* rank 1 fails; the others would wait on a pipe that never delivers, so only the launcher's SIGTERM
     * can end them */
    char *argv[] = {"launch", "--nproc", "3", "--", "/bin/sh", "-c",
                    "if [ $RANK = 1 ]; then echo failing; exit 7; fi; exec cat /dev/zero > /dev/null", NULL};
    assert_int_equal(launch(argv, out, sizeof out), 7);
    assert_non_null(strstr(out, "[r1] failing"));
    assert_non_null(strstr(out, "rank 1"));
    assert_non_null(strstr(out, "exited with status 7"));
}

static void test_bad_flags(void **state)
{
    (void)state;
    char out[4096];
    char *no_nproc[] = {"launch", "--", "/bin/true", NULL};
    assert_int_equal(launch(no_nproc, out, sizeof out), 2);
    assert_non_null(strstr(out, "--nproc N is required"));
    char *bad_nproc[] = {"launch", "--nproc", "0", "--", "/bin/true", NULL};
    assert_int_equal(launch(bad_nproc, out, sizeof out), 2);
    char *no_cmd[] = {"launch", "--nproc", "2", NULL};
    assert_int_equal(launch(no_cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "give the command"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_environment_and_prefix),
        cmocka_unit_test(test_failing_rank_stops_the_job),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
