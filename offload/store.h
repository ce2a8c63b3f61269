/* Storage tiers for a state server's shard state: RAM or NVMe (files read and written through io_uring).
 *
 * A store holds records keyed by (run, block, shard). A record of n elements is three fp32 arrays laid
 * out one after the other: master weights [0, n), Adam m [n, 2n), Adam v [2n, 3n) -- 12 n bytes of
 * payload. Callers read a record into, and write it from, a buffer of zt_store_buffer_bytes(n) bytes
 * allocated with zt_store_buffer_alloc (4096-aligned, as O_DIRECT needs).
 *
 * Reads and writes are asynchronous: *_async queues the request and returns a ticket at once; a
 * background I/O thread keeps up to queue_depth requests of io_size bytes in flight; zt_store_wait
 * blocks until that request is done and reports its result. The caller must not touch the buffer until
 * then. So a server reads block i+1's state while AdamW runs on block i. On the RAM tier requests
 * complete inside the *_async call (a copy), with the same API.
 *
 * NVMe layout (persistent): one file per record under the store's directory, named
 * r<run>-b<block>-s<shard>.zts: a 4096-byte header (magic "ZTSTORE1", format version, key, n, CRC-32C of
 * the payload, CRC-32C of the header) then the payload padded to a multiple of 4096. Opening a
 * directory finds the records written before. A payload whose CRC does not match is reported as
 * ZT_ECHECKSUM by zt_store_wait. A record is rewritten in place: a crash during a write leaves it failing
 * its check, never silently wrong (the server's snapshots are what survives crashes).
 *
 * Files are opened with O_DIRECT by default; on a file system without it (tmpfs) zt_store_open fails
 * with a message naming the fix (direct = 0 selects buffered I/O, meant for tests). Buffers that the
 * caller registers (zt_store_register_buffers) are used with fixed-buffer reads and writes; record files
 * are registered as fixed files.
 *
 * Thread safety: every function may be called from any thread; a record cannot be removed while a
 * ticket on it has not been waited for (ZT_ESTATE). Requests on one record are not ordered among themselves: wait for
 * a write before reading the record back. */
#ifndef ZT_OFFLOAD_STORE_H
#define ZT_OFFLOAD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct zt_store zt_store; /* opaque: an open store */

enum zt_store_kind {
    ZT_STORE_RAM = 0,
    ZT_STORE_NVME = 1,
};

/* The key of a record. */
typedef struct zt_store_key {
    uint64_t run;   /* run id */
    uint32_t block; /* block index */
    uint32_t shard; /* shard index within the block */
} zt_store_key;

/* Options of zt_store_open; zero-initialise, then set what differs from the defaults. */
typedef struct zt_store_config {
    enum zt_store_kind kind;
    const char *path;     /* NVMe: an existing directory for the record files; ignored for RAM */
    size_t capacity;      /* bytes of payload (12 n per record) the store may hold; 0: no limit
                             (RAM: --mem-limit; NVMe: besides the disk's own limit) */
    int queue_depth;      /* NVMe: requests in flight; 0: 32 */
    size_t io_size;       /* NVMe: bytes per request, a multiple of 4096; 0: 1 MiB */
    int buffered;         /* NVMe: 1 = buffered I/O instead of O_DIRECT (tests on tmpfs); 0: direct */
} zt_store_config;

/* Opens a store. For NVMe, path must be an existing writable directory; records found there are loaded
 * (their headers are checked). Returns 0 and *out (free with zt_store_close), or a negative code with
 * the reason in err: -ENOENT/-EACCES/-ENOTDIR for the directory, ZT_EUNSUPPORTED where O_DIRECT or
 * io_uring is unavailable, ZT_EFORMAT for a record file with a bad header, ZT_EINVAL_CONFIG for bad
 * options. */
int zt_store_open(const zt_store_config *cfg, zt_store **out, zt_err *err);

/* Waits for pending requests, then closes the store (files stay on disk). Accepts NULL. */
void zt_store_close(zt_store *s);

/* Bytes of a buffer that holds a record of n elements: 12 n rounded up to a multiple of 4096. */
size_t zt_store_buffer_bytes(size_t n);

/* Allocates a zeroed, 4096-aligned buffer of zt_store_buffer_bytes(n) bytes; NULL if out of memory.
 * Free with zt_store_buffer_free. */
float *zt_store_buffer_alloc(size_t n);
void zt_store_buffer_free(float *buf); /* accepts NULL */

/* Registers count caller buffers (each 4096-aligned, lens[i] bytes) with the kernel, so requests whose
 * buffer lies inside one of them use fixed-buffer I/O. Call once, before any request; the buffers must
 * stay allocated until zt_store_close. Returns 0 (also on RAM, where it does nothing), ZT_ESTATE if
 * called twice, or a negative errno from the kernel (e.g. -ENOMEM past RLIMIT_MEMLOCK) with err set. */
int zt_store_register_buffers(zt_store *s, float *const *bufs, const size_t *lens, int count, zt_err *err);

/* Creates a record of n elements (n >= 1), all zero. Returns 0, -EEXIST if the key exists, ZT_ENOMEM if
 * it would exceed the capacity (the message says how much is used and what to raise), or an I/O error
 * (-ENOSPC ...) with err set. */
int zt_store_create(zt_store *s, zt_store_key key, size_t n, zt_err *err);

/* Removes a record (and its file). Returns 0, -ENOENT, or ZT_ESTATE while a request on it is pending. */
int zt_store_remove(zt_store *s, zt_store_key key, zt_err *err);

/* Looks a record up: returns 0 and its element count in *n (may be NULL), or -ENOENT. */
int zt_store_lookup(zt_store *s, zt_store_key key, size_t *n);

/* Number of records, and payload bytes in use (12 n summed). */
size_t zt_store_count(zt_store *s);
size_t zt_store_used_bytes(zt_store *s);

/* Lists up to max keys into keys (in no particular order) and returns how many there are in all. */
size_t zt_store_list(zt_store *s, zt_store_key *keys, size_t max);

/* Queues a read of the whole record into dst (zt_store_buffer_bytes(n) bytes, 4096-aligned on NVMe)
 * and returns 0 with *ticket, or -ENOENT / ZT_EINVAL_CONFIG (misaligned buffer) with err set; the
 * outcome of the read itself comes from zt_store_wait. */
int zt_store_read_async(zt_store *s, zt_store_key key, float *dst, int *ticket, zt_err *err);

/* Queues a write of the whole record from src (as for reads; the checksum is computed here, so src
 * must not change until zt_store_wait returns) and returns 0 with *ticket, or an error as above. */
int zt_store_write_async(zt_store *s, zt_store_key key, const float *src, int *ticket, zt_err *err);

/* Waits for the request of ticket and releases the ticket. Returns 0, ZT_ECHECKSUM for a read whose
 * data fails its CRC, a negative errno for a failed I/O, with err set. Each ticket is waited once. */
int zt_store_wait(zt_store *s, int ticket, zt_err *err);

/* Synchronous read and write: *_async then zt_store_wait. */
int zt_store_read(zt_store *s, zt_store_key key, float *dst, zt_err *err);
int zt_store_write(zt_store *s, zt_store_key key, const float *src, zt_err *err);

/* RAM tier only: the record's own memory (3 n floats as above), valid until it is removed or the store
 * closed, so AdamW can run in place without copies. Returns 0, -ENOENT, or ZT_EUNSUPPORTED on NVMe. */
int zt_store_ram_data(zt_store *s, zt_store_key key, float **data, size_t *n);

#endif
