/* Prints the launch environment that a worker derives from its process environment, one "key=value"
 * per line, or the error on stderr with exit status 1. The Kubernetes manifest test runs it in the
 * environment the manifests give each pod of the worker Job. */
#include <stdio.h>

#include "worker/launch/env.h"

int main(void)
{
    zt_launch_env e;
    zt_err err = {{0}};
    int rc = zt_launch_env_parse(NULL, &e, &err);
    if (rc != 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }
    printf("rank=%d\nworld_size=%d\nlocal_rank=%d\nlocal_world_size=%d\nmaster_addr=%s\nmaster_port=%d\n", e.rank,
           e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.master_port);
    return 0;
}
