/* Multi-rank start-up: rank 0 serves a small gRPC rendezvous, every other rank joins it.
 *
 * Each rank says who it is (rank, world size, a hash of its configuration, its host name); once all
 * world_size ranks are there, every rank receives the NCCL unique id rank 0 made and the member list.
 * Any disagreement fails the whole rendezvous, on every rank, with one clear message:
 *   - a world size that differs from rank 0's,
 *   - a configuration hash that differs from rank 0's ("every rank must run the same config"),
 *   - a rank outside [0, world_size) or a rank that joined twice,
 *   - ranks that did not join before the timeout (they are named).
 * Nothing waits past the timeout. The service is ztrain.v1.Rendezvous (proto/ztrain/v1/rendezvous.proto).
 *
 * Typical use (worker/launch): rank 0 calls zt_rdzv_serve("0.0.0.0:MASTER_PORT", ...), the others
 * zt_rdzv_join("MASTER_ADDR:MASTER_PORT", ...). */
#ifndef ZT_PROTO_RENDEZVOUS_H
#define ZT_PROTO_RENDEZVOUS_H

#include <stdint.h>

#include "common/status.h"
#include "proto/rpc.h"

/* Size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). The bytes are opaque here. */
#define ZT_RDZV_ID_BYTES 128

/* Optional security for the rendezvous; pass NULL for plaintext without a token. */
struct zt_rdzv_security {
    const char *tls_cert_file; /* serve: server certificate (PEM), or NULL */
    const char *tls_key_file;  /* serve: server key (PEM) */
    const char *tls_ca_file;   /* join: CA of the server certificate, or NULL for plaintext */
    const char *token;         /* bearer token both sides use, or NULL */
};

/* Run by rank 0: serves the rendezvous on addr ("0.0.0.0:29500"; loopback "127.0.0.1:PORT" in tests),
 * joins as rank 0 with config_hash, and hands nccl_id (made by rank 0) to every other rank. Returns 0
 * once all world_size ranks have joined and received their answer; returns a negative code with one
 * sentence in err when the rendezvous fails (see the header comment) or timeout_s passes. After a
 * failure it keeps answering ranks that come late with the same error until every rank has been told or
 * the timeout passes, so every rank prints the same reason. sec may be NULL. */
int zt_rdzv_serve(const char *addr, int world_size, uint64_t config_hash, const uint8_t nccl_id[ZT_RDZV_ID_BYTES],
                  double timeout_s, const struct zt_rdzv_security *sec, zt_err *err);

/* Run by ranks 1..world_size-1: joins the rendezvous at master ("host:port"), waiting for rank 0 to come
 * up and for every rank to join, for at most timeout_s seconds. Returns 0 with nccl_id filled, or a
 * negative code with one sentence in err (rank 0's reason when rank 0 refused the rendezvous, or that
 * rank 0 could not be reached). sec may be NULL. */
int zt_rdzv_join(const char *master, int rank, int world_size, uint64_t config_hash, double timeout_s,
                 const struct zt_rdzv_security *sec, uint8_t nccl_id[ZT_RDZV_ID_BYTES], zt_err *err);

/* ---- tests and fuzzing harnesses ---- */

/* The largest world size a rendezvous accepts. */
#define ZT_RDZV_MAX_WORLD 65536

/* The state of rank 0's rendezvous without its server, so that a test or a fuzzing harness can put its
 * Join handler on a server of its own (zt_rpc_server_call_local: no network). zt_rdzv_serve is these
 * three around a listening server. */
typedef struct rdzv zt__rdzv;

/* Creates the state of a rendezvous of world_size ranks in which rank 0 has joined; the join of every
 * other rank is decided against world_size and config_hash within timeout_s seconds. Returns 0 and *out
 * (free with zt__rdzv_destroy after the server that uses it), or ZT_EINVAL_CONFIG for a world size outside
 * [1, ZT_RDZV_MAX_WORLD]. */
int zt__rdzv_create(int world_size, uint64_t config_hash, const uint8_t nccl_id[ZT_RDZV_ID_BYTES], double timeout_s,
                    zt__rdzv **out, zt_err *err);

/* Registers the Join method of r on srv (before zt_rpc_server_start). Returns 0 or a negative code. */
int zt__rdzv_add_methods(zt__rdzv *r, zt_rpc_server_t *srv, zt_err *err);

/* Frees r. Accepts NULL. */
void zt__rdzv_destroy(zt__rdzv *r);

#endif
