/* Shared-memory segments between a process and a state server on the same host: the bulk path of the
 * state service when both run on one machine (worker/state/client.c creates, server/service.c attaches).
 *
 * A segment is a sealed memfd (no name in /dev/shm, so nothing is left behind by a crash: its memory
 * goes when the last process that maps it exits or unmaps it). Its first ZT_SHM_HEAD_BYTES hold a head
 * (magic, version, size, slot layout, a nonce of ZT_SHM_NONCE_BYTES random bytes); the rest is split into
 * `nslots` slots of `slot_bytes` each. The creator seals the size (F_SEAL_SHRINK, F_SEAL_GROW), so that a
 * process that maps it can never touch a page beyond its end (a shrunk file would raise SIGBUS there).
 *
 * The other side attaches it through /proc/PID/fd/FD, which the kernel lets it open only when it may
 * inspect the creator (the same user, the same PID namespace, a dumpable process): a server of another
 * user, in another container or on another host fails to open it, or opens something whose head does not
 * hold the nonce the creator sent on the authenticated call; either way the caller falls back to TCP.
 * Attaching checks the seals, the size and the nonce before the segment is used.
 *
 * Every offset and length that arrives from another process goes through zt_shm_span, which never
 * returns a pointer outside the segment's data area whatever the numbers say.
 *
 * Threading: zt_shm_slot_get/put may be called from any thread; the rest of a segment is read-only
 * after create or attach. */
#ifndef ZT_COMMON_SHM_H
#define ZT_COMMON_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define ZT_SHM_HEAD_BYTES 4096u      /* the head; slots start here */
#define ZT_SHM_NONCE_BYTES 16        /* random bytes at the head, sent on the attaching call */
#define ZT_SHM_MAX_SLOTS 64
#define ZT_SHM_MAX_BYTES (16ull << 30) /* the largest segment either side accepts: head plus slots */

typedef struct zt_shm zt_shm_t; /* opaque */

/* Creates a segment of nslots slots (1 to ZT_SHM_MAX_SLOTS) of slot_bytes each (a multiple of 4096, the
 * whole at most ZT_SHM_MAX_BYTES): a sealed memfd mapped read-write, its head written with a fresh nonce.
 * Returns 0 and *out (free with zt_shm_destroy), or a negative code with a message (bad sizes:
 * ZT_EINVAL_CONFIG; memfd_create, sealing or mmap refused: their -errno). */
int zt_shm_create(int nslots, uint64_t slot_bytes, zt_shm_t **out, zt_err *err);

/* Attaches the segment another process created: opens /proc/pid/fd/fd, checks that it is a memfd sealed
 * against shrinking and growing, `size` bytes long (what the creator said, at most ZT_SHM_MAX_BYTES), and
 * that its head is a version-1 head of that size whose nonce equals `nonce` (ZT_SHM_NONCE_BYTES bytes),
 * then keeps it mapped read-write. Returns 0 and *out (free with zt_shm_destroy), or a negative code with
 * a message that says which check failed (the file cannot be opened: its -errno, e.g. -EACCES for another
 * user; not sealed or another size: ZT_EINVAL_CONFIG; another nonce or head: ZT_EMISMATCH). */
int zt_shm_attach(int pid, int fd, uint64_t size, const uint8_t *nonce, zt_shm_t **out, zt_err *err);

/* Unmaps the segment (and closes the creator's descriptor). Accepts NULL. */
void zt_shm_destroy(zt_shm_t *s);

/* The creator's descriptor (another process opens it as /proc/<pid>/fd/<this>), or -1 for an attached
 * segment. */
int zt_shm_fd(const zt_shm_t *s);

/* Bytes of the whole segment, head included: what zt_shm_attach is given. */
uint64_t zt_shm_size(const zt_shm_t *s);

/* The segment's nonce (ZT_SHM_NONCE_BYTES bytes, valid as long as s). */
const uint8_t *zt_shm_nonce(const zt_shm_t *s);

/* Slots: their number and size (from the head, also for an attached segment). */
int zt_shm_nslots(const zt_shm_t *s);
uint64_t zt_shm_slot_bytes(const zt_shm_t *s);

/* The offset in the segment of slot i's first byte (ZT_SHM_HEAD_BYTES + i * slot_bytes). */
uint64_t zt_shm_slot_offset(const zt_shm_t *s, int i);

/* Takes a free slot, waiting for one when all are taken, and returns its index; give it back with
 * zt_shm_slot_put. */
int zt_shm_slot_get(zt_shm_t *s);

/* Gives slot i back. */
void zt_shm_slot_put(zt_shm_t *s, int i);

/* The bytes [off, off + len) of the segment when they lie inside its data area (after the head, before
 * its end; len may be 0), else NULL. Safe against any off and len, overflow included. */
void *zt_shm_span(const zt_shm_t *s, uint64_t off, uint64_t len);

#endif
