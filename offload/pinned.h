/* A pool of host staging buffers for device <-> host copies on the worker side (gradients out to the
 * state servers, updated parameters back in).
 *
 * The pool allocates a fixed number of equally sized buffers once, at creation, and hands them out and
 * takes them back; nothing is allocated on the hot path. In a CUDA build (ZT_WITH_CUDA) the buffers are
 * page-locked ("pinned") with cudaHostAlloc, so cudaMemcpyAsync to and from them runs at full PCIe / NVLink
 * speed and overlaps with kernels. In a CPU build, or when pinning is impossible (no GPU, the locked-memory
 * limit reached) and the caller did not insist on it, the buffers are plain memory aligned to 4096 bytes
 * (also suitable for O_DIRECT I/O), so the same code runs and can be tested everywhere.
 *
 * Threading: acquire and release may be called from any thread; acquire can wait for a buffer that
 * another thread releases. */
#ifndef ZT_OFFLOAD_PINNED_H
#define ZT_OFFLOAD_PINNED_H

#include <stddef.h>

#include "common/status.h"

typedef struct zt_pinned_pool zt_pinned_pool_t;

/* Alignment of every buffer of a pool, in bytes. */
#define ZT_PINNED_ALIGN 4096

/* Flags of zt_pinned_pool_create(). */
enum zt_pinned_flags {
    ZT_PINNED_FLAG_NONE = 0,
    ZT_PINNED_FLAG_REQUIRE = 1,  /* fail instead of falling back to unpinned memory */
    ZT_PINNED_FLAG_CPU_ONLY = 2, /* never pin, even in a CUDA build (plain aligned memory) */
};

/* Creates a pool of nbuffers buffers of buffer_bytes bytes each (rounded up to ZT_PINNED_ALIGN), all free.
 * flags is a combination of enum zt_pinned_flags. Returns 0 and *out, or a negative code with a message
 * in err: ZT_EINVAL_CONFIG for a zero size or count (or REQUIRE together with CPU_ONLY), ZT_EUNSUPPORTED
 * when REQUIRE is set and the build or machine cannot pin memory, ZT_ENOMEM when the memory is not there.
 * Free with zt_pinned_pool_destroy(). */
int zt_pinned_pool_create(size_t buffer_bytes, int nbuffers, int flags, zt_pinned_pool_t **out, zt_err *err);

/* Frees the pool and its memory. Every buffer must have been released (a buffer still handed out is a
 * broken invariant and aborts). Accepts NULL. */
void zt_pinned_pool_destroy(zt_pinned_pool_t *pool);

/* Hands out a free buffer in *buf (ZT_PINNED_ALIGN-aligned, zt_pinned_pool_buffer_bytes() long, contents
 * left from its previous use), waiting up to timeout_s seconds for one to be released (0: do not wait).
 * Returns 0, or -ETIMEDOUT with a message in err when no buffer came free in time. The buffer belongs to
 * the caller until zt_pinned_pool_release(). */
int zt_pinned_pool_acquire(zt_pinned_pool_t *pool, double timeout_s, void **buf, zt_err *err);

/* Gives a buffer from zt_pinned_pool_acquire() back to the pool and wakes one waiting acquire. Releasing
 * a pointer the pool did not hand out (or releasing twice) is a broken invariant and aborts. */
void zt_pinned_pool_release(zt_pinned_pool_t *pool, void *buf);

/* Returns 1 if the pool's buffers are page-locked with cudaHostAlloc, 0 if they are plain memory. */
int zt_pinned_pool_is_pinned(const zt_pinned_pool_t *pool);

/* Returns the size of each buffer in bytes (the requested size rounded up to ZT_PINNED_ALIGN). */
size_t zt_pinned_pool_buffer_bytes(const zt_pinned_pool_t *pool);

/* Returns the number of buffers of the pool. */
int zt_pinned_pool_count(const zt_pinned_pool_t *pool);

/* Returns the number of buffers free right now (a snapshot: other threads may change it at once). */
int zt_pinned_pool_free_count(zt_pinned_pool_t *pool);

#endif
