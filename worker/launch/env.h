/* The launch environment of a worker process: its rank, the world size and where rank 0's rendezvous
 * listens, read from the variables that torchrun, Slurm wrappers and a Kubernetes Indexed Job set
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, JOB_COMPLETION_INDEX).
 *
 * Rules, in order:
 *   rank              RANK, else JOB_COMPLETION_INDEX (set by Kubernetes in an Indexed Job), else 0
 *   world_size        WORLD_SIZE, else 1
 *   local_world_size  LOCAL_WORLD_SIZE, else 1
 *   local_rank        LOCAL_RANK, else rank % LOCAL_WORLD_SIZE when LOCAL_WORLD_SIZE is set, else 0
 *   master_addr       MASTER_ADDR, else 127.0.0.1
 *   master_port       MASTER_PORT, else 29500
 * A variable that is set must hold a valid value: an empty or malformed value is an error, never
 * silently replaced by the default. The result is checked as a whole (rank < world_size,
 * local_rank < local_world_size <= world_size, 1 <= port <= 65535). */
#ifndef ZT_WORKER_LAUNCH_ENV_H
#define ZT_WORKER_LAUNCH_ENV_H

#include "common/status.h"

#define ZT_LAUNCH_ADDR_LEN 256          /* room for a DNS name (253 characters) and its NUL */
#define ZT_LAUNCH_DEFAULT_ADDR "127.0.0.1"
#define ZT_LAUNCH_DEFAULT_PORT 29500    /* torchrun's default, so existing scripts keep working */

typedef struct zt_launch_env {
    int rank;                             /* 0 <= rank < world_size */
    int world_size;                       /* number of worker processes in the job, >= 1 */
    int local_rank;                       /* 0 <= local_rank < local_world_size; picks the GPU */
    int local_world_size;                 /* worker processes on this host, 1 <= it <= world_size */
    char master_addr[ZT_LAUNCH_ADDR_LEN]; /* host name or address of rank 0; NUL-terminated */
    int master_port;                      /* rank 0's rendezvous port, 1..65535 */
} zt_launch_env;

/* Looks up one environment variable by name; returns its value, or NULL when it is not set. The
 * returned string must stay valid until zt_launch_env_parse_with returns. ctx is passed through. */
typedef const char *(*zt_launch_getenv_fn)(const char *name, void *ctx);

/* Fills out from envp, a NULL-terminated array of "NAME=value" strings (as main's third argument or
 * execve take), or from the process environment when envp is NULL. Returns 0, or ZT_EINVAL_CONFIG
 * with a sentence in err (when err is not NULL) naming the variable, its value and the fix. out is
 * written only on success. Nothing is allocated. */
int zt_launch_env_parse(char *const *envp, zt_launch_env *out, zt_err *err);

/* Same as zt_launch_env_parse, with each variable looked up through get(name, ctx). */
int zt_launch_env_parse_with(zt_launch_getenv_fn get, void *ctx, zt_launch_env *out, zt_err *err);

#endif
