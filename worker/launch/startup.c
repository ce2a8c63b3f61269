/* Multi-rank start-up: the gRPC rendezvous, then the communicator (see startup.h). */
#include "worker/launch/startup.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/rendezvous.h"

#define STARTUP_VERDICT_GRACE_S 5.0 /* see zt_startup_comm */

/* Reads the rendezvous port; see startup.h. */
int zt_startup_rdzv_port(const zt_launch_env *env, zt_err *err)
{
    const char *v = getenv("ZT_RDZV_PORT");
    if (v) {
        char *end = NULL;
        long p = strtol(v, &end, 10);
        if (!*v || *end || p < 1 || p > 65535)
            return zt_fail(err, ZT_EINVAL_CONFIG, "ZT_RDZV_PORT='%s' is not a port number: set it to 1..65535 "
                           "or unset it to use MASTER_PORT", v);
        return (int)p;
    }
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent && strcmp(agent, "True") == 0)
        return env->master_port < 65535 ? env->master_port + 1 : env->master_port - 1;
    return env->master_port;
}

/* Reads a number of seconds from the environment; see startup.h. */
double zt_startup_env_seconds(const char *name, double def)
{
    const char *v = getenv(name);
    if (!v)
        return def;
    char *end = NULL;
    double d = strtod(v, &end);
    return (!*v || *end || !(d > 0)) ? def : d;
}

static bool is_loopback(const char *addr)
{
    return strncmp(addr, "127.", 4) == 0 || strcmp(addr, "localhost") == 0 || strcmp(addr, "::1") == 0;
}

/* The rendezvous, then the communicator; see startup.h. */
int zt_startup_comm(const zt_launch_env *env, enum zt_comm_backend backend, uint64_t config_hash, int device,
                    zt_comm **out, zt_err *err)
{
    *out = NULL;
    const double join_s = zt_startup_env_seconds("ZT_RDZV_TIMEOUT_S", 60);
    zt_comm_options co;
    zt_comm_options_init(&co);
    co.backend = backend;
    co.rank = env->rank;
    co.world_size = env->world_size;
    co.device = device;
    snprintf(co.name, sizeof co.name, "p%d", env->master_port);
    co.config_hash = config_hash;
    co.join_timeout_s = join_s;
    co.timeout_s = zt_startup_env_seconds("ZT_COMM_TIMEOUT_S", 300);

    int rc = 0;
    if (backend == ZT_COMM_NCCL && env->rank == 0 && (rc = zt_comm_nccl_unique_id(co.nccl_id, err)) < 0)
        return rc;
    if (env->world_size > 1) {
        int port = zt_startup_rdzv_port(env, err);
        if (port < 0)
            return port;
        char addr[ZT_LAUNCH_ADDR_LEN + 16];
        zt_err e = {{0}};
        if (env->rank == 0) {
            snprintf(addr, sizeof addr, "%s:%d", is_loopback(env->master_addr) ? "127.0.0.1" : "0.0.0.0", port);
            rc = zt_rdzv_serve(addr, env->world_size, config_hash, co.nccl_id, join_s, NULL, &e);
        } else {
            snprintf(addr, sizeof addr, "%s:%d", env->master_addr, port);
            /* rank 0 decides when the rendezvous has failed; the others wait a little longer for its
             * verdict, so that they print its reason rather than a timeout of their own */
            rc = zt_rdzv_join(addr, env->rank, env->world_size, config_hash, join_s + STARTUP_VERDICT_GRACE_S,
                              NULL, co.nccl_id, &e);
        }
        if (rc < 0)
            return zt_fail(err, rc, "start-up of rank %d of %d failed: %s", env->rank, env->world_size, e.msg);
    }
    return zt_comm_create(out, &co, err);
}
