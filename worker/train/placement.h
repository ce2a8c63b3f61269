/* Optimizer placement "server" for the single-process trainer (DESIGN.md decisions 7-9): the fp32 master
 * weights and the AdamW moments live in a state server, remote (--servers host:port,...) or embedded in
 * this process (no --servers; --state-store ram or nvme:DIR), and every step goes through
 * worker/state/client.h as one ZeRO rank of a world of 1 would drive it:
 *   push the gradient of every block (one shard per block), commit the step with (grad norm, clip coef,
 *   lr, overflow), pull the updated fp32 parameters block 0 first into the model's parameter slab.
 * The gradient norm, clipping and the skip guard are the CPU trainer's (worker/train/optimizer.h), and the
 * server's AdamW is offload/cpu_adam.h's, so the parameters are those of placement "cpu" bit for bit.
 *
 * The run id on the servers is the name of the run directory (its last path component, characters outside
 * [A-Za-z0-9._-] replaced by '_'): two runs sharing servers need different run directory names.
 *
 * Checkpoints keep the trainer's format. In embedded mode the master weights and moments are read back from
 * the core; with remote servers the master weights are pulled (fp32) and every server is asked to write a
 * snapshot of the same step (ztrain-server --snapshot-dir): the servers hold the moments, and resuming
 * with remote servers continues from the state they hold (after a restart, from their latest snapshot). */
#ifndef ZT_WORKER_TRAIN_PLACEMENT_H
#define ZT_WORKER_TRAIN_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/models/gpt2.h"
#include "worker/state/client.h"
#include "worker/train/config.h"
#include "worker/train/optimizer.h"

typedef struct zt_placement_server zt_placement_server; /* opaque */

/* The run id on the state servers for a run directory: its last path component, characters outside
 * [A-Za-z0-9._-] replaced by '_' ("train" for "/", "." or ".."). */
void zt_placement_run_id(const char *out_dir, char *id, size_t cap);

/* Creates the state client cfg describes: remote servers (cfg->servers, TLS files, the bearer token read
 * from cfg->token_file) or the embedded core (cfg->state_store). *token receives the token the client
 * uses (NULL when none): free it after zt_state_client_destroy. Returns 0 and *out, or a negative code
 * with a message naming the flag to fix. */
int zt_placement_client_create(const zt_train_config *cfg, zt_state_client_t **out, char **token, zt_err *err);

/* Connects to the state servers (or creates the embedded core) and registers the run. A new run
 * (step 0) pushes the model's parameters as the initial master weights. A resumed run (step > 0, the
 * model and opt loaded from a checkpoint) hands the checkpoint's master weights and moments to the
 * embedded core; remote servers must already hold the run at that step (restored from their snapshot),
 * and their parameters are pulled into the model. Returns 0 and *out (free with
 * zt_placement_server_close), or a negative code with a message saying what to change. */
int zt_placement_server_open(zt_placement_server **out, const zt_train_config *cfg, zt_gpt2 *model,
                             const zt_optimizer *opt, int64_t step, zt_err *err);

/* Closes the connections (or frees the embedded core). Accepts NULL. */
void zt_placement_server_close(zt_placement_server *ps);

/* One optimizer step `step` through the servers, with zt_optimizer_step's contract: the gradient norm,
 * clip coefficient and skip guard are computed here and booked in opt (adam_step, skipped steps); a
 * skipped step is committed as an overflow (no update). The model's parameter slab receives the updated
 * parameters. A failed push or commit is tried once more, whole (a server back at the step before this
 * one lost the pushes it had taken). Returns 0, ZT_ESTATE (diverged, or a server back at an older step:
 * zt_placement_server_stale_step gives it, the message how to resume), or another negative code with a
 * message. */
int zt_placement_server_step(zt_placement_server *ps, zt_gpt2 *model, zt_optimizer *opt, int64_t step,
                             float loss, float lr, zt_optimizer_report *report, zt_err *err);

/* Prepares a checkpoint of step `step`: fills opt's m and v (embedded mode: read from the core; remote:
 * left as they are, the servers keep them) and asks every remote server to write a snapshot of the run.
 * The model's parameters are already the servers' after every step. Returns 0 or a negative code. */
int zt_placement_server_checkpoint(zt_placement_server *ps, zt_optimizer *opt, int64_t step, zt_err *err);

/* The step a state server reported it holds when the last zt_placement_server_step failed because the
 * server restarted from an older snapshot (the run can continue from the checkpoint of that step), or -1.
 * Accepts NULL. */
int64_t zt_placement_server_stale_step(const zt_placement_server *ps);

/* Test hook for the fault tests (tests/placement): with ZT_TEST_PAUSE=where and ZT_TEST_PAUSE_FIFO=path in
 * the environment, the process stops at `where` ("step:N": after step N and its checkpoint; "push:N": after
 * the first chunk of block 1 of its gradient push of step N), logs "test pause: where", and goes on when a
 * line can be read from the FIFO. It stops once per process, or ZT_TEST_PAUSE_TIMES times. Without the
 * variables it does nothing. */
void zt__placement_test_pause(const char *where);

/* Test hook: makes the client's pushes call zt__placement_test_pause("push:N"), N the pushed step, when
 * ZT_TEST_PAUSE is set; otherwise does nothing. */
void zt__placement_test_watch_pushes(zt_state_client_t *client);

/* Whether the servers are remote (then checkpoints do not carry the moments). */
bool zt_placement_server_is_remote(const zt_placement_server *ps);

#endif
