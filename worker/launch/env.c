/* Reads a worker's rank, world size and rendezvous address from the launch environment (torchrun,
 * Slurm, a Kubernetes Indexed Job) and checks that they agree with each other. See env.h for the rules. */
#include "worker/launch/env.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* Parses a whole decimal number from 0 to INT_MAX: digits only, no sign, no spaces, no suffix.
 * Returns 0, or -1 when text is not such a number. */
static int parse_count(const char *text, int *out)
{
    long long v = 0;
    if (text[0] == '\0')
        return -1;
    for (const char *p = text; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (*p - '0');
        if (v > INT_MAX)
            return -1;
    }
    *out = (int)v;
    return 0;
}

/* Reads the number in variable name into out. Leaves out unchanged and sets *found to 0 when the
 * variable is not set. what says what the number is, for the error message. */
static int read_count(zt_launch_getenv_fn get, void *ctx, const char *name, const char *what, int *out,
                      int *found, zt_err *err)
{
    const char *text = get(name, ctx);
    *found = text != NULL;
    if (text == NULL)
        return 0;
    if (parse_count(text, out) != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s='%.64s' is not a whole number from 0 to %d; set %s to %s, or unset it", name,
                       text, INT_MAX, name, what);
    return 0;
}

/* Returns 1 when text is usable as a host name or address: printable, no spaces, not empty. */
static int is_host(const char *text)
{
    if (text[0] == '\0')
        return 0;
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++)
        if (*p <= ' ' || *p >= 0x7f)
            return 0;
    return 1;
}

/* Fills out from variables looked up through get; see env.h. */
int zt_launch_env_parse_with(zt_launch_getenv_fn get, void *ctx, zt_launch_env *out, zt_err *err)
{
    zt_launch_env e = {.rank = 0,
                       .world_size = 1,
                       .local_rank = 0,
                       .local_world_size = 1,
                       .master_port = ZT_LAUNCH_DEFAULT_PORT};
    int has_rank, has_index, has_world, has_local_rank, has_local_world, has_port;
    int rc;

    rc = read_count(get, ctx, "RANK", "this process's rank (0 for the first process)", &e.rank, &has_rank, err);
    if (rc != 0)
        return rc;
    int index = 0;
    rc = read_count(get, ctx, "JOB_COMPLETION_INDEX", "the pod's index in the Indexed Job", &index, &has_index,
                    err);
    if (rc != 0)
        return rc;
    if (!has_rank && has_index)
        e.rank = index;

    rc = read_count(get, ctx, "WORLD_SIZE", "the number of worker processes (the Job's completions)",
                    &e.world_size, &has_world, err);
    if (rc != 0)
        return rc;
    rc = read_count(get, ctx, "LOCAL_WORLD_SIZE", "the number of worker processes on this host",
                    &e.local_world_size, &has_local_world, err);
    if (rc != 0)
        return rc;
    rc = read_count(get, ctx, "LOCAL_RANK", "this process's rank among the processes on this host",
                    &e.local_rank, &has_local_rank, err);
    if (rc != 0)
        return rc;

    int port = 0;
    rc = read_count(get, ctx, "MASTER_PORT", "rank 0's rendezvous port (default 29500)", &port, &has_port, err);
    if (rc != 0)
        return rc;
    if (has_port) {
        if (port < 1 || port > 65535)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "MASTER_PORT=%d is not a TCP port; set it to a port from 1 to 65535 (default 29500)",
                           port);
        e.master_port = port;
    }

    const char *addr = get("MASTER_ADDR", ctx);
    if (addr == NULL)
        addr = ZT_LAUNCH_DEFAULT_ADDR;
    if (!is_host(addr))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "MASTER_ADDR='%.64s' is not a host name or address; set it to the host of rank 0 "
                       "(no spaces), or unset it for 127.0.0.1",
                       addr);
    if (strlen(addr) >= sizeof(e.master_addr))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "MASTER_ADDR is %zu characters long, more than a host name can be (%d); set it to the "
                       "host of rank 0",
                       strlen(addr), ZT_LAUNCH_ADDR_LEN - 1);
    memcpy(e.master_addr, addr, strlen(addr) + 1);

    /* The whole, checked together: each message names where the offending number came from. */
    if (e.world_size < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "WORLD_SIZE=0: a job needs at least one worker; set WORLD_SIZE to the number of worker "
                       "processes");
    if (e.rank >= e.world_size) {
        const char *src = has_rank ? "RANK" : "JOB_COMPLETION_INDEX";
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s=%d is not below WORLD_SIZE=%d%s; ranks run from 0 to WORLD_SIZE-1, so set WORLD_SIZE "
                       "to the number of worker processes%s",
                       src, e.rank, e.world_size, has_world ? "" : " (the default, as WORLD_SIZE is not set)",
                       has_rank ? "" : " (in Kubernetes, the Job's completions)");
    }
    if (e.local_world_size < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "LOCAL_WORLD_SIZE=0: a host runs at least one worker; set it to the number of worker "
                       "processes on this host");
    if (e.local_world_size > e.world_size)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "LOCAL_WORLD_SIZE=%d is larger than WORLD_SIZE=%d; a host cannot run more workers than "
                       "the job has, so fix one of them",
                       e.local_world_size, e.world_size);
    if (!has_local_rank && has_local_world)
        e.local_rank = e.rank % e.local_world_size;
    if (e.local_rank >= e.local_world_size)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d%s; set LOCAL_WORLD_SIZE to the number of "
                       "worker processes on this host",
                       e.local_rank, e.local_world_size,
                       has_local_world ? "" : " (the default, as LOCAL_WORLD_SIZE is not set)");
    *out = e;
    return 0;
}

/* Looks name up in a NULL-terminated "NAME=value" array (ctx). */
static const char *envp_get(const char *name, void *ctx)
{
    char *const *envp = ctx;
    size_t n = strlen(name);
    for (; *envp != NULL; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

/* Fills out from envp, or from the process environment when envp is NULL; see env.h. */
int zt_launch_env_parse(char *const *envp, zt_launch_env *out, zt_err *err)
{
    return zt_launch_env_parse_with(envp_get, envp != NULL ? (void *)envp : (void *)environ, out, err);
}
