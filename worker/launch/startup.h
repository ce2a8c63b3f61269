/* Multi-rank start-up: the ranks of a job meet at rank 0's gRPC rendezvous
 * (proto/rendezvous.h), which checks that every rank brings the same WORLD_SIZE and the same config hash
 * and hands out the NCCL unique id; then each rank creates its communicator (worker/comm/comm.h).
 *
 * Where the rendezvous listens: MASTER_ADDR:PORT, where PORT is ZT_RDZV_PORT when set, else MASTER_PORT,
 * else (under torchrun, whose agent already holds MASTER_PORT for its own store, which it says by setting
 * TORCHELASTIC_USE_AGENT_STORE=True) MASTER_PORT + 1. Rank 0 binds 127.0.0.1 when MASTER_ADDR is a
 * loopback address or "localhost", and 0.0.0.0 otherwise, so ranks on other hosts can reach it.
 *
 * Timeout: ZT_RDZV_TIMEOUT_S seconds (default 60) for the rendezvous and the communicator's check-in
 * (ranks other than 0 wait 5 s more for rank 0's verdict, so that every rank prints rank 0's reason);
 * collectives wait ZT_COMM_TIMEOUT_S seconds (default 300) for a slow peer. A WORLD_SIZE mismatch,
 * different configs, or ranks that never join (named) fail on every rank that took part, with the same
 * sentence, within the timeout. */
#ifndef ZT_WORKER_RUNTIME_STARTUP_H
#define ZT_WORKER_RUNTIME_STARTUP_H

#include <stdint.h>

#include "common/status.h"
#include "worker/comm/comm.h"
#include "worker/launch/env.h"

/* The rendezvous port for env, by the rules above. Returns 1..65535, or ZT_EINVAL_CONFIG with a message
 * for a malformed ZT_RDZV_PORT. */
int zt_startup_rdzv_port(const zt_launch_env *env, zt_err *err);

/* The value of the environment variable name as a positive number of seconds, or def when it is unset,
 * empty or not a positive number. */
double zt_startup_env_seconds(const char *name, double def);

/* Runs the rendezvous for env (nothing to do at WORLD_SIZE 1) with config_hash, then creates this rank's
 * communicator of the given backend (device: the CUDA device for nccl). Returns 0 and sets *out (free
 * with zt_comm_destroy), or a negative code with one sentence in err. */
int zt_startup_comm(const zt_launch_env *env, enum zt_comm_backend backend, uint64_t config_hash, int device,
                    zt_comm **out, zt_err *err);

#endif
