/* Host staging buffer pool (see pinned.h): one slab carved into equal buffers, a stack of free buffer
 * indices under a mutex, and a condition variable for acquires that wait. The slab is cudaHostAlloc'd
 * memory in CUDA builds (unless the caller asks for CPU memory or pinning fails and is not required),
 * otherwise aligned_alloc'd memory. */
#include "offload/pinned.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

#ifdef ZT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

struct zt_pinned_pool {
    char *slab;          /* nbuffers * buffer_bytes bytes */
    size_t buffer_bytes; /* multiple of ZT_PINNED_ALIGN */
    int nbuffers;
    int pinned;          /* slab came from cudaHostAlloc */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *free_stack;     /* indices of free buffers; nfree of them */
    int nfree;
    unsigned char *out;  /* out[i]: buffer i is handed out */
};

/* Tries to page-lock a slab of bytes; returns NULL (with the reason in why) when it cannot. */
static char *pin_slab(size_t bytes, char *why, size_t cap)
{
#ifdef ZT_WITH_CUDA
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        snprintf(why, cap, "cudaHostAlloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
        cudaGetLastError(); /* clear the error so that later CUDA calls do not report it */
        return NULL;
    }
    return p;
#else
    (void)bytes;
    snprintf(why, cap, "this build has no CUDA (configure with -DZT_CUDA=ON on a machine with the CUDA toolkit)");
    return NULL;
#endif
}

static void free_slab(zt_pinned_pool_t *pool)
{
#ifdef ZT_WITH_CUDA
    if (pool->pinned) {
        cudaFreeHost(pool->slab);
        return;
    }
#endif
    free(pool->slab);
}

int zt_pinned_pool_create(size_t buffer_bytes, int nbuffers, int flags, zt_pinned_pool_t **out, zt_err *err)
{
    *out = NULL;
    if (buffer_bytes == 0 || nbuffers <= 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "a staging pool needs a buffer size and a buffer count above 0 "
                       "(got %zu bytes x %d)", buffer_bytes, nbuffers);
    if ((flags & ZT_PINNED_FLAG_REQUIRE) && (flags & ZT_PINNED_FLAG_CPU_ONLY))
        return zt_fail(err, ZT_EINVAL_CONFIG, "a staging pool cannot both require pinned memory and use CPU "
                       "memory only; pass one of the two flags");
    if (buffer_bytes > SIZE_MAX - ZT_PINNED_ALIGN)
        return zt_fail(err, ZT_EINVAL_CONFIG, "staging buffers of %zu bytes are too large", buffer_bytes);
    size_t bb = (buffer_bytes + ZT_PINNED_ALIGN - 1) / ZT_PINNED_ALIGN * ZT_PINNED_ALIGN;
    if (bb > SIZE_MAX / (size_t)nbuffers)
        return zt_fail(err, ZT_EINVAL_CONFIG, "a staging pool of %d x %zu bytes does not fit in memory", nbuffers, bb);
    size_t total = bb * (size_t)nbuffers;

    zt_pinned_pool_t *pool = zt_xcalloc(1, sizeof(*pool));
    pool->buffer_bytes = bb;
    pool->nbuffers = nbuffers;
    char why[ZT_ERR_LEN] = "";
    if (!(flags & ZT_PINNED_FLAG_CPU_ONLY)) {
        pool->slab = pin_slab(total, why, sizeof(why));
        pool->pinned = pool->slab != NULL;
    }
    if (pool->slab == NULL && (flags & ZT_PINNED_FLAG_REQUIRE)) {
        free(pool);
        return zt_fail(err, ZT_EUNSUPPORTED, "cannot pin %zu bytes of staging memory: %s; run on a machine with "
                       "a GPU (and enough locked memory, ulimit -l) or accept unpinned buffers", total, why);
    }
    if (pool->slab == NULL) {
        if (!(flags & ZT_PINNED_FLAG_CPU_ONLY) && why[0] != '\0')
            ZT_DEBUG("pinned: using unpinned staging memory: %s", why);
        pool->slab = aligned_alloc(ZT_PINNED_ALIGN, total);
        if (pool->slab == NULL) {
            free(pool);
            return zt_fail(err, ZT_ENOMEM, "cannot allocate %zu bytes of staging memory (%d x %zu bytes); use "
                           "fewer or smaller buffers", total, nbuffers, bb);
        }
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->free_stack = zt_xmalloc((size_t)nbuffers * sizeof(*pool->free_stack));
    pool->out = zt_xcalloc((size_t)nbuffers, 1);
    /* Lowest index on top, so that a pool used one buffer at a time keeps reusing the first (warm) one. */
    for (int i = 0; i < nbuffers; i++)
        pool->free_stack[i] = nbuffers - 1 - i;
    pool->nfree = nbuffers;
    *out = pool;
    return 0;
}

void zt_pinned_pool_destroy(zt_pinned_pool_t *pool)
{
    if (pool == NULL)
        return;
    ZT_ASSERT(pool->nfree == pool->nbuffers); /* every buffer must be released before the pool goes */
    free_slab(pool);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->free_stack);
    free(pool->out);
    free(pool);
}

int zt_pinned_pool_acquire(zt_pinned_pool_t *pool, double timeout_s, void **buf, zt_err *err)
{
    *buf = NULL;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s > 0) {
        double whole = timeout_s > 1e9 ? 1e9 : timeout_s;
        until.tv_sec += (time_t)whole;
        until.tv_nsec += (long)((whole - (double)(time_t)whole) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&pool->mu);
    while (pool->nfree == 0 && timeout_s > 0) {
        if (pthread_cond_timedwait(&pool->cv, &pool->mu, &until) == ETIMEDOUT)
            break;
    }
    int rc = 0;
    if (pool->nfree == 0) {
        rc = zt_fail(err, -ETIMEDOUT, "all %d staging buffers are still in use after %.3g s: release buffers "
                     "sooner or create the pool with more of them", pool->nbuffers, timeout_s);
    } else {
        int i = pool->free_stack[--pool->nfree];
        pool->out[i] = 1;
        *buf = pool->slab + (size_t)i * pool->buffer_bytes;
    }
    pthread_mutex_unlock(&pool->mu);
    return rc;
}

void zt_pinned_pool_release(zt_pinned_pool_t *pool, void *buf)
{
    char *p = buf;
    ZT_ASSERT(p >= pool->slab && p < pool->slab + (size_t)pool->nbuffers * pool->buffer_bytes);
    size_t off = (size_t)(p - pool->slab);
    ZT_ASSERT(off % pool->buffer_bytes == 0);
    int i = (int)(off / pool->buffer_bytes);
    pthread_mutex_lock(&pool->mu);
    ZT_ASSERT(pool->out[i]); /* released twice, or never acquired */
    pool->out[i] = 0;
    pool->free_stack[pool->nfree++] = i;
    pthread_cond_signal(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
}

int zt_pinned_pool_is_pinned(const zt_pinned_pool_t *pool)
{
    return pool->pinned;
}

size_t zt_pinned_pool_buffer_bytes(const zt_pinned_pool_t *pool)
{
    return pool->buffer_bytes;
}

int zt_pinned_pool_count(const zt_pinned_pool_t *pool)
{
    return pool->nbuffers;
}

int zt_pinned_pool_free_count(zt_pinned_pool_t *pool)
{
    pthread_mutex_lock(&pool->mu);
    int n = pool->nfree;
    pthread_mutex_unlock(&pool->mu);
    return n;
}
