/* Unit tests of the launch environment parser (worker/launch/env.h): defaults, the torchrun, Slurm
 * and Kubernetes Indexed Job variable sets, and a clear error for every malformed or inconsistent value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/launch/env.h"

/* Parses envp (NULL-terminated "NAME=value" strings) and asserts success. */
static zt_launch_env parse_ok(char *const *envp)
{
    zt_launch_env e;
    zt_err err = {{0}};
    int rc = zt_launch_env_parse(envp, &e, &err);
    if (rc != 0)
        fail_msg("unexpected error %d: %s", rc, err.msg);
    return e;
}

/* Parses envp, asserts ZT_EINVAL_CONFIG, that out was left untouched, and that the message holds every
 * string in words (a NULL-terminated list). */
static void parse_fails(char *const *envp, const char *const *words)
{
    zt_launch_env e;
    memset(&e, 0x5a, sizeof(e));
    zt_launch_env before = e;
    zt_err err = {{0}};
    assert_int_equal(zt_launch_env_parse(envp, &e, &err), ZT_EINVAL_CONFIG);
    assert_memory_equal(&e, &before, sizeof(e));
    for (; *words != NULL; words++)
        if (strstr(err.msg, *words) == NULL)
            fail_msg("message '%s' does not mention '%s'", err.msg, *words);
}

static void test_defaults_with_empty_environment(void **state)
{
    (void)state;
    char *envp[] = {NULL};
    zt_launch_env e = parse_ok(envp);
    assert_int_equal(e.rank, 0);
    assert_int_equal(e.world_size, 1);
    assert_int_equal(e.local_rank, 0);
    assert_int_equal(e.local_world_size, 1);
    assert_string_equal(e.master_addr, "127.0.0.1");
    assert_int_equal(e.master_port, 29500);
}

static void test_torchrun_variables(void **state)
{
    (void)state;
    char *envp[] = {"PATH=/usr/bin",  "RANK=5",          "WORLD_SIZE=8",      "LOCAL_RANK=1",
                    "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=node-a.example", "MASTER_PORT=29400", NULL};
    zt_launch_env e = parse_ok(envp);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.world_size, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_world_size, 4);
    assert_string_equal(e.master_addr, "node-a.example");
    assert_int_equal(e.master_port, 29400);
}

/* What the Kubernetes manifests give a pod: no RANK, the Job controller's JOB_COMPLETION_INDEX. */
static void test_indexed_job_index_gives_rank(void **state)
{
    (void)state;
    char *envp[] = {"JOB_COMPLETION_INDEX=3", "WORLD_SIZE=4", "MASTER_ADDR=ztrain-train-0.ztrain-workers",
                    NULL};
    zt_launch_env e = parse_ok(envp);
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.world_size, 4);
    assert_int_equal(e.local_rank, 0);
    assert_int_equal(e.local_world_size, 1);
    assert_string_equal(e.master_addr, "ztrain-train-0.ztrain-workers");
    assert_int_equal(e.master_port, 29500);
}

static void test_rank_wins_over_job_index(void **state)
{
    (void)state;
    char *envp[] = {"JOB_COMPLETION_INDEX=1", "RANK=6", "WORLD_SIZE=8", NULL};
    assert_int_equal(parse_ok(envp).rank, 6);
}

static void test_local_rank_derived_from_local_world_size(void **state)
{
    (void)state;
    char *envp[] = {"RANK=6", "WORLD_SIZE=8", "LOCAL_WORLD_SIZE=4", NULL};
    zt_launch_env e = parse_ok(envp);
    assert_int_equal(e.local_rank, 2);
    assert_int_equal(e.local_world_size, 4);
}

static void test_lookup_does_not_match_prefixes(void **state)
{
    (void)state;
    /* RANKS and MY_RANK must not be taken for RANK. */
    char *envp[] = {"RANKS=7", "MY_RANK=7", "XWORLD_SIZE=9", "WORLD_SIZE=2", NULL};
    zt_launch_env e = parse_ok(envp);
    assert_int_equal(e.rank, 0);
    assert_int_equal(e.world_size, 2);
}

static void test_largest_values(void **state)
{
    (void)state;
    char addr[300] = "MASTER_ADDR=";
    memset(addr + strlen(addr), 'a', 255);
    char *envp[] = {"RANK=2147483646", "WORLD_SIZE=2147483647", "MASTER_PORT=65535", addr, NULL};
    zt_launch_env e = parse_ok(envp);
    assert_int_equal(e.rank, 2147483646);
    assert_int_equal(e.world_size, 2147483647);
    assert_int_equal(e.master_port, 65535);
    assert_int_equal(strlen(e.master_addr), 255);
}

static const char *table_get(const char *name, void *ctx)
{
    const char *const *kv = ctx;
    for (; kv[0] != NULL; kv += 2)
        if (strcmp(kv[0], name) == 0)
            return kv[1];
    return NULL;
}

static void test_callback_lookup(void **state)
{
    (void)state;
    const char *table[] = {"RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "10.0.0.7", NULL, NULL};
    zt_launch_env e;
    zt_err err = {{0}};
    assert_int_equal(zt_launch_env_parse_with(table_get, (void *)table, &e, &err), 0);
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.world_size, 2);
    assert_string_equal(e.master_addr, "10.0.0.7");
}

static void test_process_environment(void **state)
{
    (void)state;
    assert_int_equal(setenv("RANK", "2", 1), 0);
    assert_int_equal(setenv("WORLD_SIZE", "3", 1), 0);
    zt_launch_env e;
    zt_err err = {{0}};
    int rc = zt_launch_env_parse(NULL, &e, &err);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    assert_int_equal(rc, 0);
    assert_int_equal(e.rank, 2);
    assert_int_equal(e.world_size, 3);
}

static void test_malformed_numbers(void **state)
{
    (void)state;
    char *bad_rank[] = {"RANK=1x", "WORLD_SIZE=4", NULL};
    parse_fails(bad_rank, (const char *const[]){"RANK='1x'", "whole number", NULL});
    char *negative[] = {"RANK=-1", NULL};
    parse_fails(negative, (const char *const[]){"RANK='-1'", NULL});
    char *empty[] = {"WORLD_SIZE=", NULL};
    parse_fails(empty, (const char *const[]){"WORLD_SIZE=''", NULL});
    char *space[] = {"LOCAL_RANK= 1", NULL};
    parse_fails(space, (const char *const[]){"LOCAL_RANK=' 1'", NULL});
    char *overflow[] = {"WORLD_SIZE=2147483648", NULL};
    parse_fails(overflow, (const char *const[]){"WORLD_SIZE='2147483648'", NULL});
    char *index[] = {"JOB_COMPLETION_INDEX=a", NULL};
    parse_fails(index, (const char *const[]){"JOB_COMPLETION_INDEX='a'", "Indexed Job", NULL});
}

static void test_rank_out_of_range(void **state)
{
    (void)state;
    char *rank[] = {"RANK=4", "WORLD_SIZE=4", NULL};
    parse_fails(rank, (const char *const[]){"RANK=4", "WORLD_SIZE=4", NULL});
    char *no_world[] = {"RANK=1", NULL};
    parse_fails(no_world, (const char *const[]){"RANK=1", "WORLD_SIZE=1", "not set", NULL});
    char *index[] = {"JOB_COMPLETION_INDEX=2", "WORLD_SIZE=2", NULL};
    parse_fails(index, (const char *const[]){"JOB_COMPLETION_INDEX=2", "completions", NULL});
    char *zero[] = {"WORLD_SIZE=0", NULL};
    parse_fails(zero, (const char *const[]){"WORLD_SIZE=0", NULL});
}

static void test_local_values_out_of_range(void **state)
{
    (void)state;
    char *local[] = {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=4", NULL};
    parse_fails(local, (const char *const[]){"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL});
    char *local_default[] = {"LOCAL_RANK=1", "WORLD_SIZE=4", NULL};
    parse_fails(local_default, (const char *const[]){"LOCAL_RANK=1", "not set", NULL});
    char *too_many[] = {"LOCAL_WORLD_SIZE=8", "WORLD_SIZE=4", NULL};
    parse_fails(too_many, (const char *const[]){"LOCAL_WORLD_SIZE=8", "WORLD_SIZE=4", NULL});
    char *zero[] = {"LOCAL_WORLD_SIZE=0", NULL};
    parse_fails(zero, (const char *const[]){"LOCAL_WORLD_SIZE=0", NULL});
}

static void test_bad_port(void **state)
{
    (void)state;
    char *zero[] = {"MASTER_PORT=0", NULL};
    parse_fails(zero, (const char *const[]){"MASTER_PORT=0", "65535", NULL});
    char *big[] = {"MASTER_PORT=65536", NULL};
    parse_fails(big, (const char *const[]){"MASTER_PORT=65536", NULL});
    char *name[] = {"MASTER_PORT=http", NULL};
    parse_fails(name, (const char *const[]){"MASTER_PORT='http'", NULL});
}

static void test_bad_address(void **state)
{
    (void)state;
    char *empty[] = {"MASTER_ADDR=", NULL};
    parse_fails(empty, (const char *const[]){"MASTER_ADDR=''", NULL});
    char *space[] = {"MASTER_ADDR=node a", NULL};
    parse_fails(space, (const char *const[]){"MASTER_ADDR='node a'", NULL});
    char addr[300] = "MASTER_ADDR=";
    memset(addr + strlen(addr), 'a', 256);
    char *long_addr[] = {addr, NULL};
    parse_fails(long_addr, (const char *const[]){"256 characters", NULL});
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_with_empty_environment),
        cmocka_unit_test(test_torchrun_variables),
        cmocka_unit_test(test_indexed_job_index_gives_rank),
        cmocka_unit_test(test_rank_wins_over_job_index),
        cmocka_unit_test(test_local_rank_derived_from_local_world_size),
        cmocka_unit_test(test_lookup_does_not_match_prefixes),
        cmocka_unit_test(test_largest_values),
        cmocka_unit_test(test_callback_lookup),
        cmocka_unit_test(test_process_environment),
        cmocka_unit_test(test_malformed_numbers),
        cmocka_unit_test(test_rank_out_of_range),
        cmocka_unit_test(test_local_values_out_of_range),
        cmocka_unit_test(test_bad_port),
        cmocka_unit_test(test_bad_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
