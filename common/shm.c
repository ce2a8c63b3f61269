/* Shared-memory segments: a sealed memfd, its head and slots, attaching through /proc (see shm.h). */
#include "common/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHM_MAGIC "ZTSHMSEG"
#define SHM_VERSION 1u

/* The head at offset 0; the rest of the first ZT_SHM_HEAD_BYTES is zero. */
struct shm_head {
    char magic[8];
    uint32_t version;
    uint32_t nslots;
    uint64_t slot_bytes;
    uint64_t size;                     /* the whole segment, head included */
    uint8_t nonce[ZT_SHM_NONCE_BYTES];
};

struct zt_shm {
    uint8_t *base;      /* the mapping, size bytes */
    uint64_t size;
    int fd;             /* the creator's memfd, -1 when attached */
    int nslots;
    uint64_t slot_bytes;
    uint8_t nonce[ZT_SHM_NONCE_BYTES];
    pthread_mutex_t mu;
    pthread_cond_t freed;
    uint64_t busy;      /* bit i: slot i is taken */
};

static zt_shm_t *shm_new(void)
{
    zt_shm_t *s = zt_xcalloc(1, sizeof(*s));
    s->fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->freed, NULL);
    return s;
}

int zt_shm_create(int nslots, uint64_t slot_bytes, zt_shm_t **out, zt_err *err)
{
    *out = NULL;
    if (nslots < 1 || nslots > ZT_SHM_MAX_SLOTS || slot_bytes == 0 || slot_bytes % 4096 != 0 ||
        slot_bytes > (ZT_SHM_MAX_BYTES - ZT_SHM_HEAD_BYTES) / (uint64_t)nslots)
        return zt_fail(err, ZT_EINVAL_CONFIG, "shared-memory segment: %d slots of %llu bytes; give 1 to %d slots of a "
                       "multiple of 4096 bytes, %llu bytes in all at most", nslots, (unsigned long long)slot_bytes,
                       ZT_SHM_MAX_SLOTS, (unsigned long long)ZT_SHM_MAX_BYTES);
    zt_shm_t *s = shm_new();
    s->nslots = nslots;
    s->slot_bytes = slot_bytes;
    s->size = ZT_SHM_HEAD_BYTES + (uint64_t)nslots * slot_bytes;
    int rc = 0;
    s->fd = memfd_create("ztrain-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (s->fd < 0) {
        rc = zt_fail(err, -errno, "memfd_create: %s", strerror(errno));
        goto err;
    }
    if (ftruncate(s->fd, (off_t)s->size) != 0) {
        rc = zt_fail(err, -errno, "sizing a shared-memory segment of %llu bytes: %s", (unsigned long long)s->size,
                     strerror(errno));
        goto err;
    }
    if (fcntl(s->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = zt_fail(err, -errno, "sealing a shared-memory segment: %s", strerror(errno));
        goto err;
    }
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (p == MAP_FAILED) {
        rc = zt_fail(err, -errno, "mapping a shared-memory segment of %llu bytes: %s", (unsigned long long)s->size,
                     strerror(errno));
        goto err;
    }
    s->base = p;
    size_t got = 0;
    while (got < sizeof(s->nonce)) {
        ssize_t n = getrandom(s->nonce + got, sizeof(s->nonce) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = zt_fail(err, n < 0 ? -errno : ZT_EIO, "getrandom: %s", n < 0 ? strerror(errno) : "no bytes");
            goto err;
        }
        got += (size_t)n;
    }
    struct shm_head h = {.version = SHM_VERSION, .nslots = (uint32_t)nslots, .slot_bytes = slot_bytes,
                         .size = s->size};
    memcpy(h.magic, SHM_MAGIC, sizeof(h.magic));
    memcpy(h.nonce, s->nonce, sizeof(h.nonce));
    memcpy(s->base, &h, sizeof(h));
    *out = s;
    return 0;
err:
    zt_shm_destroy(s);
    return rc;
}

int zt_shm_attach(int pid, int fd, uint64_t size, const uint8_t *nonce, zt_shm_t **out, zt_err *err)
{
    *out = NULL;
    if (pid <= 0 || fd < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "no shared-memory segment named (pid %d, descriptor %d)", pid, fd);
    if (size <= ZT_SHM_HEAD_BYTES || size > ZT_SHM_MAX_BYTES)
        return zt_fail(err, ZT_EINVAL_CONFIG, "a shared-memory segment of %llu bytes; accepted: %u to %llu",
                       (unsigned long long)size, ZT_SHM_HEAD_BYTES + 1, (unsigned long long)ZT_SHM_MAX_BYTES);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return zt_fail(err, -errno, "cannot open %s: %s (another user, another PID namespace or another host?)", path,
                       strerror(errno));
    int rc = 0;
    struct stat st;
    int seals = fcntl(f, F_GET_SEALS);
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s is not a shared-memory file", path);
        goto done;
    }
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s is not a memfd sealed against shrinking and growing", path);
        goto done;
    }
    if ((uint64_t)st.st_size != size) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s holds %lld bytes, not the %llu announced", path, (long long)st.st_size,
                     (unsigned long long)size);
        goto done;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (p == MAP_FAILED) {
        rc = zt_fail(err, -errno, "mapping %s: %s", path, strerror(errno));
        goto done;
    }
    struct shm_head h;
    memcpy(&h, p, sizeof(h));
    const int nslots = (int)h.nslots;
    if (memcmp(h.magic, SHM_MAGIC, sizeof(h.magic)) != 0 || h.version != SHM_VERSION || h.size != size ||
        memcmp(h.nonce, nonce, ZT_SHM_NONCE_BYTES) != 0) {
        munmap(p, size);
        rc = zt_fail(err, ZT_EMISMATCH, "%s does not hold the segment that was announced (its head or nonce "
                     "differs: a process on another host?)", path);
        goto done;
    }
    if (h.nslots < 1 || h.nslots > ZT_SHM_MAX_SLOTS || h.slot_bytes == 0 ||
        h.slot_bytes > (size - ZT_SHM_HEAD_BYTES) / h.nslots) {
        munmap(p, size);
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: %u slots of %llu bytes do not fit in %llu bytes", path, h.nslots,
                     (unsigned long long)h.slot_bytes, (unsigned long long)size);
        goto done;
    }
    zt_shm_t *s = shm_new();
    s->base = p;
    s->size = size;
    s->nslots = nslots;
    s->slot_bytes = h.slot_bytes;
    memcpy(s->nonce, h.nonce, sizeof(s->nonce));
    *out = s;
done:
    close(f);
    return rc;
}

void zt_shm_destroy(zt_shm_t *s)
{
    if (s == NULL)
        return;
    if (s->base != NULL)
        munmap(s->base, s->size);
    if (s->fd >= 0)
        close(s->fd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->freed);
    free(s);
}

int zt_shm_fd(const zt_shm_t *s)
{
    return s->fd;
}

uint64_t zt_shm_size(const zt_shm_t *s)
{
    return s->size;
}

const uint8_t *zt_shm_nonce(const zt_shm_t *s)
{
    return s->nonce;
}

int zt_shm_nslots(const zt_shm_t *s)
{
    return s->nslots;
}

uint64_t zt_shm_slot_bytes(const zt_shm_t *s)
{
    return s->slot_bytes;
}

uint64_t zt_shm_slot_offset(const zt_shm_t *s, int i)
{
    ZT_ASSERT(i >= 0 && i < s->nslots);
    return ZT_SHM_HEAD_BYTES + (uint64_t)i * s->slot_bytes;
}

int zt_shm_slot_get(zt_shm_t *s)
{
    pthread_mutex_lock(&s->mu);
    const uint64_t all = s->nslots == 64 ? ~0ull : (1ull << s->nslots) - 1;
    while ((s->busy & all) == all)
        pthread_cond_wait(&s->freed, &s->mu);
    int i = __builtin_ctzll(~s->busy & all);
    s->busy |= 1ull << i;
    pthread_mutex_unlock(&s->mu);
    return i;
}

void zt_shm_slot_put(zt_shm_t *s, int i)
{
    ZT_ASSERT(i >= 0 && i < s->nslots);
    pthread_mutex_lock(&s->mu);
    ZT_ASSERT(s->busy & (1ull << i));
    s->busy &= ~(1ull << i);
    pthread_cond_signal(&s->freed);
    pthread_mutex_unlock(&s->mu);
}

void *zt_shm_span(const zt_shm_t *s, uint64_t off, uint64_t len)
{
    if (off < ZT_SHM_HEAD_BYTES || off > s->size || len > s->size - off)
        return NULL;
    return s->base + off;
}
