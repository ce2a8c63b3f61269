/* The gRPC handlers of ztrain.v1.StateService (proto/ztrain/v1/state.proto): they decode requests, call
 * the state server core (server/core.h) and encode its answers. Every refusal is a gRPC status with one
 * sentence: malformed protobuf and bad sizes INVALID_ARGUMENT, an unknown run NOT_FOUND, a stale or future
 * step and layout mismatches FAILED_PRECONDITION, memory limits RESOURCE_EXHAUSTED; tokens, deadlines and
 * message size limits are enforced by proto/rpc before a handler runs. A refused request changes nothing
 * in the core. */
#ifndef ZT_SERVER_SERVICE_H
#define ZT_SERVER_SERVICE_H

#include "common/status.h"
#include "proto/rpc.h"
#include "server/core.h"

typedef struct zt_service zt_service_t;

struct zt_service_options {
    const char *snapshot_dir; /* root of SaveSnapshot / LoadSnapshot, or NULL: those calls are refused */
    int snapshot_keep;        /* snapshots kept per run and server; 0 keeps all */
    int snapshot_commits;     /* with snapshot_dir: a snapshot after every N-th commit, written before the commit
                               * is answered, and one when a run's initial parameters are complete; 0: only
                               * SaveSnapshot writes snapshots */
    int server_index;         /* this server's index, as given to the core */
    int server_count;         /* S; 0 means 1 */
    int shm_off;              /* refuse AttachShm (ztrain-server --shm off): every client moves its bytes over
                               * gRPC */
};

/* The most shared-memory segments a service keeps attached (one per client process on this host); an
 * AttachShm beyond them, once the segments of exited processes are dropped, is refused (the client keeps
 * TCP). */
#define ZT_SERVICE_MAX_SHM 64

/* Creates the service over core (borrowed: it must outlive the service). opt is copied. Returns 0 and
 * *out, free with zt_service_destroy() after the rpc server that uses it. */
int zt_service_create(zt_server_core *core, const struct zt_service_options *opt, zt_service_t **out, zt_err *err);

/* Registers every StateService method on srv (before zt_rpc_server_start). Returns 0 or a negative code. */
int zt_service_add_methods(zt_service_t *svc, zt_rpc_server_t *srv, zt_err *err);

/* For tests (the fuzzing harness): shared-memory segment ids from `first` up instead of random ones, so that
 * a script can name the segment it attached. */
void zt__service_set_shm_ids(zt_service_t *svc, uint64_t first);

/* Frees the service. Accepts NULL. */
void zt_service_destroy(zt_service_t *svc);

#endif
