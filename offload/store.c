/* RAM and NVMe storage tiers of the state server (offload/store.h).
 *
 * RAM: each record is one anonymous mapping (zero pages until written, transparent huge pages asked for).
 * NVMe: one file per record, opened O_DIRECT, registered as a fixed file of one io_uring. A background
 * I/O thread owns the ring: it cuts queued requests into io_size pieces, keeps up to queue_depth of them
 * in flight (the oldest request's pieces first), and marks a request done when its last piece completes. Callers only touch the request
 * table under the store's mutex and sleep on a condition variable in zt_store_wait; the payload's
 * checksum is computed in the caller's thread (write_async and wait), never in the I/O thread, so that
 * checksums never hold up submissions. A reader in zt_store_wait checksums the pieces that have arrived
 * while the rest are still on their way (pieces complete out of order: a bitmap per request tracks them
 * and done_prefix is the length of the completed start of the payload), so only the last pieces are
 * checksummed after the I/O. A write sends the payload first and the header (with the new checksum)
 * last. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "offload/store.h"

#define ZT_STORE_ALIGN 4096u
#define ZT_STORE_HEADER_BYTES 4096u
#define ZT_STORE_MAGIC "ZTSTORE1"
#define ZT_STORE_VERSION 1u
#define ZT_STORE_MAX_REQUESTS 256 /* tickets pending at once */
#define ZT_STORE_MAX_FIXED_FILES 65536u
#define ZT_STORE_HEADER_PIECE 0xffffffffu /* piece index of a write's header in a completion's user data */

/* On-disk record header (little-endian), padded to 4096 bytes; header_crc covers the bytes before it. */
typedef struct file_header {
    char magic[8];            /* "ZTSTORE1" */
    uint32_t version;         /* ZT_STORE_VERSION */
    uint32_t header_bytes;    /* 4096 */
    uint64_t run;
    uint32_t block;
    uint32_t shard;
    uint64_t n;               /* elements per array */
    uint64_t payload_bytes;   /* 12 n */
    uint32_t payload_crc;     /* CRC-32C of the payload bytes */
    uint32_t header_crc;      /* CRC-32C of the header bytes above this field */
} file_header;

typedef struct record {
    zt_store_key key;
    size_t n;
    size_t payload_bytes; /* 12 n */
    size_t io_bytes;      /* payload rounded up to 4096 */
    float *ram;           /* RAM tier: the mapping of io_bytes */
    int fd;               /* NVMe: the record file, -1 on RAM */
    int fixed;            /* NVMe: index in the fixed-file table, -1 if files are not registered */
    int pending;          /* tickets on it not yet waited for */
    uint32_t crc;         /* NVMe: checksum of the payload on disk */
    int broken;           /* NVMe: a write failed part way; reads fail until a write succeeds */
} record;

typedef struct request {
    int in_use;            /* the ticket is handed out */
    int queued;            /* in the I/O thread's list, pieces left to submit or complete */
    int is_write;
    record *rec;
    char *buf;             /* the caller's buffer */
    size_t total;          /* bytes of payload I/O (rec->io_bytes) */
    size_t next_off;       /* next payload offset to submit */
    int inflight;          /* pieces submitted, not completed */
    int header_sent;       /* write: header piece submitted */
    int buf_index;         /* registered buffer that holds buf, or -1 */
    int result;            /* 0 or the first error (negative errno) */
    int done;
    uint32_t crc;          /* write: checksum of the new payload; read: checksum expected */
    char *hdr;             /* 4096-byte aligned header buffer of this slot */
    uint64_t *piece_done;  /* read: one bit per io_size piece, set when it completes */
    size_t done_prefix;    /* read: bytes from offset 0 whose pieces have all completed */
    int waiting;           /* read: the caller sleeps in zt_store_wait and checksums what arrives */
    uint64_t seq;          /* order in which requests were queued: the I/O thread serves the oldest first */
} request;

struct zt_store {
    zt_store_config cfg;
    char *dir;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the I/O thread waits for requests */
    pthread_cond_t done_cv; /* callers wait for completions */
    record **recs;
    size_t nrecs, caprecs;
    size_t used;            /* payload bytes */
    request reqs[ZT_STORE_MAX_REQUESTS];
    char *hdr_slab;         /* ZT_STORE_MAX_REQUESTS headers */
    /* NVMe only */
    int nvme;
    struct io_uring ring;
    int ring_ok;
    pthread_t thread;
    int thread_ok;
    int stop;
    int inflight;           /* pieces in the ring (I/O thread only) */
    int fixed_files;        /* 1: the ring has a sparse fixed-file table */
    unsigned char *fixed_used;
    unsigned nfixed;
    struct iovec *bufs;     /* registered buffers */
    int nbufs;
    int requests_seen;      /* registration must come before any request */
    uint64_t next_seq;      /* seq of the next queued request */
};

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* Returns the bytes of a buffer that holds a record of n elements: 12 n rounded up to 4096. */
size_t zt_store_buffer_bytes(size_t n)
{
    return round_up(n * 3 * sizeof(float), ZT_STORE_ALIGN);
}

/* Allocates a zeroed, 4096-aligned record buffer, or returns NULL. */
float *zt_store_buffer_alloc(size_t n)
{
    size_t bytes = zt_store_buffer_bytes(n > 0 ? n : 1);
    void *p = NULL;
    if (posix_memalign(&p, ZT_STORE_ALIGN, bytes) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

/* Frees a buffer of zt_store_buffer_alloc; accepts NULL. */
void zt_store_buffer_free(float *buf)
{
    free(buf);
}

static int key_equal(zt_store_key a, zt_store_key b)
{
    return a.run == b.run && a.block == b.block && a.shard == b.shard;
}

static record *find_locked(zt_store *s, zt_store_key key, size_t *index)
{
    for (size_t i = 0; i < s->nrecs; i++) {
        if (key_equal(s->recs[i]->key, key)) {
            if (index)
                *index = i;
            return s->recs[i];
        }
    }
    return NULL;
}

static int add_locked(zt_store *s, record *r)
{
    if (s->nrecs == s->caprecs) {
        size_t cap = s->caprecs ? s->caprecs * 2 : 64;
        record **p = realloc(s->recs, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        s->recs = p;
        s->caprecs = cap;
    }
    s->recs[s->nrecs++] = r;
    s->used += r->payload_bytes;
    return 0;
}

static void record_path(const zt_store *s, zt_store_key key, char *out, size_t len)
{
    snprintf(out, len, "%s/r%" PRIu64 "-b%" PRIu32 "-s%" PRIu32 ".zts", s->dir, key.run, key.block, key.shard);
}

static void header_fill(char *hdr, const record *r, uint32_t payload_crc)
{
    memset(hdr, 0, ZT_STORE_HEADER_BYTES);
    file_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, ZT_STORE_MAGIC, 8);
    h.version = ZT_STORE_VERSION;
    h.header_bytes = ZT_STORE_HEADER_BYTES;
    h.run = r->key.run;
    h.block = r->key.block;
    h.shard = r->key.shard;
    h.n = r->n;
    h.payload_bytes = r->payload_bytes;
    h.payload_crc = payload_crc;
    h.header_crc = zt_crc32c(0, &h, offsetof(file_header, header_crc));
    memcpy(hdr, &h, sizeof(h));
}

/* Registers fd in the fixed-file table if there is one; sets r->fixed. */
static void fixed_add_locked(zt_store *s, record *r)
{
    r->fixed = -1;
    if (!s->fixed_files)
        return;
    for (unsigned i = 0; i < s->nfixed; i++) {
        if (!s->fixed_used[i]) {
            int fd = r->fd;
            if (io_uring_register_files_update(&s->ring, i, &fd, 1) == 1) {
                s->fixed_used[i] = 1;
                r->fixed = (int)i;
            }
            return;
        }
    }
}

static void fixed_remove_locked(zt_store *s, record *r)
{
    if (r->fixed < 0)
        return;
    int fd = -1;
    io_uring_register_files_update(&s->ring, (unsigned)r->fixed, &fd, 1);
    s->fixed_used[r->fixed] = 0;
    r->fixed = -1;
}

static void record_free(record *r)
{
    if (!r)
        return;
    if (r->ram)
        munmap(r->ram, r->io_bytes);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

/* ---- the I/O thread ---- */

/* Queues the next piece of request q; returns 1 if one was queued, 0 if q has nothing left to send. */
static int submit_piece_locked(zt_store *s, int slot)
{
    request *q = &s->reqs[slot];
    record *r = q->rec;
    int fd = r->fixed >= 0 ? r->fixed : r->fd;
    if (q->next_off < q->total) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
        if (!sqe)
            return 0;
        size_t len = q->total - q->next_off;
        if (len > s->cfg.io_size)
            len = s->cfg.io_size;
        char *p = q->buf + q->next_off;
        off_t off = (off_t)(ZT_STORE_HEADER_BYTES + q->next_off);
        if (q->is_write) {
            if (q->buf_index >= 0)
                io_uring_prep_write_fixed(sqe, fd, p, (unsigned)len, off, q->buf_index);
            else
                io_uring_prep_write(sqe, fd, p, (unsigned)len, off);
        } else {
            if (q->buf_index >= 0)
                io_uring_prep_read_fixed(sqe, fd, p, (unsigned)len, off, q->buf_index);
            else
                io_uring_prep_read(sqe, fd, p, (unsigned)len, off);
        }
        if (r->fixed >= 0)
            sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, ((uint64_t)slot << 32) | (uint32_t)(q->next_off / s->cfg.io_size));
        q->next_off += len;
        q->inflight++;
        s->inflight++;
        return 1;
    }
    /* A write's header goes last, once every payload piece is on its way back. */
    if (q->is_write && !q->header_sent && q->inflight == 0 && q->result == 0) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
        if (!sqe)
            return 0;
        io_uring_prep_write(sqe, fd, q->hdr, ZT_STORE_HEADER_BYTES, 0);
        if (r->fixed >= 0)
            sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, ((uint64_t)slot << 32) | ZT_STORE_HEADER_PIECE);
        q->header_sent = 1;
        q->inflight++;
        s->inflight++;
        return 1;
    }
    return 0;
}

static void finish_if_done_locked(zt_store *s, request *q)
{
    int payload_done = q->next_off >= q->total || q->result != 0;
    int header_done = !q->is_write || q->header_sent || q->result != 0;
    if (!q->queued || q->inflight > 0 || !payload_done || !header_done)
        return;
    q->queued = 0;
    q->done = 1;
    record *r = q->rec;
    if (q->is_write) {
        if (q->result == 0) {
            r->crc = q->crc;
            r->broken = 0;
        } else {
            r->broken = 1;
        }
    } else {
        q->crc = r->crc;
        if (r->broken && q->result == 0)
            q->result = ZT_EIO;
    }
    pthread_cond_broadcast(&s->done_cv);
}

/* Marks a read's piece complete and, if the completed start of the payload grew, wakes its waiter so
 * that it checksums the new bytes while the rest are still being read. */
static void piece_arrived_locked(zt_store *s, request *q, uint32_t piece)
{
    q->piece_done[piece / 64] |= (uint64_t)1 << (piece % 64);
    size_t before = q->done_prefix;
    while (q->done_prefix < q->total) {
        size_t next = q->done_prefix / s->cfg.io_size;
        if (!(q->piece_done[next / 64] & ((uint64_t)1 << (next % 64))))
            break;
        q->done_prefix += s->cfg.io_size;
    }
    if (q->done_prefix > q->total)
        q->done_prefix = q->total;
    if (q->done_prefix > before && q->waiting)
        pthread_cond_broadcast(&s->done_cv);
}

/* Returns 1 if request q has a piece that can be submitted now (payload left, or a write's header once
 * its payload is done). */
static int can_submit(const request *q)
{
    return q->queued && q->result == 0 &&
           (q->next_off < q->total || (q->is_write && !q->header_sent && q->inflight == 0));
}

static int has_work_locked(zt_store *s)
{
    for (int i = 0; i < ZT_STORE_MAX_REQUESTS; i++) {
        if (can_submit(&s->reqs[i]))
            return 1;
    }
    return 0;
}

/* Returns the slot of the oldest request with a piece to submit, or -1. Slots are reused, so a low slot
 * may hold the newest request: order by seq, not by slot, or a request queued later overtakes the one
 * its caller is waiting for (which then cannot checksum while its pieces arrive). */
static int oldest_submittable_locked(zt_store *s)
{
    int best = -1;
    for (int i = 0; i < ZT_STORE_MAX_REQUESTS; i++) {
        if (can_submit(&s->reqs[i]) && (best < 0 || s->reqs[i].seq < s->reqs[best].seq))
            best = i;
    }
    return best;
}

static void *io_thread(void *arg)
{
    zt_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->inflight == 0 && !has_work_locked(s))
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (s->stop && s->inflight == 0 && !has_work_locked(s))
            break;
        /* Fill the queue up to queue_depth pieces: all of the oldest request's pieces, then the next
         * oldest's. (The ring has room for twice queue_depth entries, so it should never fill up; the
         * io_uring_sq_space_left check, and submit_piece_locked stopping when io_uring_get_sqe finds no
         * entry, are what guard against it.) */
        int queued = 0;
        while (s->inflight < s->cfg.queue_depth && io_uring_sq_space_left(&s->ring) > 0) {
            int slot = oldest_submittable_locked(s);
            if (slot < 0)
                break;
            while (s->inflight < s->cfg.queue_depth && submit_piece_locked(s, slot))
                queued++;
        }
        pthread_mutex_unlock(&s->mu);
        if (queued)
            io_uring_submit(&s->ring);
        if (s->inflight == 0) { /* nothing could be sent (cannot happen while the queue has room) */
            pthread_mutex_lock(&s->mu);
            continue;
        }
        struct io_uring_cqe *cqe = NULL;
        int rc = io_uring_wait_cqe(&s->ring, &cqe);
        pthread_mutex_lock(&s->mu);
        if (rc < 0)
            continue; /* -EINTR: try again */
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&s->ring, head, cqe) {
            uint64_t data = io_uring_cqe_get_data64(cqe);
            int slot = (int)(data >> 32);
            uint32_t piece = (uint32_t)(data & 0xffffffffu);
            request *q = &s->reqs[slot];
            size_t len = ZT_STORE_HEADER_BYTES;
            if (piece != ZT_STORE_HEADER_PIECE) {
                size_t off = (size_t)piece * s->cfg.io_size;
                len = q->total - off < s->cfg.io_size ? q->total - off : s->cfg.io_size;
            }
            if (cqe->res < 0 && q->result == 0)
                q->result = cqe->res;
            else if (cqe->res >= 0 && (unsigned)cqe->res != len && q->result == 0)
                q->result = ZT_EIO; /* short transfer: the file is shorter than its header says */
            q->inflight--;
            s->inflight--;
            if (q->piece_done && piece != ZT_STORE_HEADER_PIECE && cqe->res >= 0 && (size_t)cqe->res == len)
                piece_arrived_locked(s, q, piece);
            finish_if_done_locked(s, q);
            seen++;
        }
        io_uring_cq_advance(&s->ring, seen);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- opening and closing ---- */

static int probe_direct(zt_store *s, zt_err *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/.zt-store-probe-%d", s->dir, (int)getpid());
    int flags = O_RDWR | O_CREAT | O_TRUNC | (s->cfg.buffered ? 0 : O_DIRECT);
    int fd = open(path, flags, 0600);
    if (fd < 0) {
        int e = errno;
        if (e == EINVAL)
            return zt_fail(err, ZT_EUNSUPPORTED,
                           "store: the file system of %s does not support O_DIRECT (tmpfs?); put the NVMe store "
                           "on a disk file system, or use buffered I/O for tests",
                           s->dir);
        return zt_fail(err, -e, "store: cannot create files in %s: %s; check that it exists and is writable",
                       s->dir, strerror(e));
    }
    close(fd);
    unlink(path);
    return 0;
}

static int load_record_file(zt_store *s, const char *name, zt_err *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", s->dir, name);
    int fd = open(path, O_RDWR | (s->cfg.buffered ? 0 : O_DIRECT));
    if (fd < 0)
        return zt_fail(err, -errno, "store: cannot open %s: %s", path, strerror(errno));
    char *hdr = NULL;
    if (posix_memalign((void **)&hdr, ZT_STORE_ALIGN, ZT_STORE_HEADER_BYTES) != 0) {
        close(fd);
        return zt_fail(err, ZT_ENOMEM, "store: out of memory reading %s", path);
    }
    ssize_t got = pread(fd, hdr, ZT_STORE_HEADER_BYTES, 0);
    file_header h;
    memcpy(&h, hdr, sizeof(h));
    free(hdr);
    struct stat st;
    int bad = got != (ssize_t)ZT_STORE_HEADER_BYTES || memcmp(h.magic, ZT_STORE_MAGIC, 8) != 0 ||
              h.header_crc != zt_crc32c(0, &h, offsetof(file_header, header_crc)) ||
              h.version != ZT_STORE_VERSION || h.payload_bytes != h.n * 12 || fstat(fd, &st) != 0 ||
              (uint64_t)st.st_size < ZT_STORE_HEADER_BYTES + round_up(h.payload_bytes, ZT_STORE_ALIGN);
    if (bad) {
        close(fd);
        return zt_fail(err, ZT_EFORMAT,
                       "store: %s is not a valid record file (truncated or corrupt header); remove it and "
                       "restore the run's state from a snapshot",
                       path);
    }
    record *r = calloc(1, sizeof(*r));
    if (!r) {
        close(fd);
        return zt_fail(err, ZT_ENOMEM, "store: out of memory");
    }
    r->key.run = h.run;
    r->key.block = h.block;
    r->key.shard = h.shard;
    r->n = h.n;
    r->payload_bytes = h.payload_bytes;
    r->io_bytes = round_up(h.payload_bytes, ZT_STORE_ALIGN);
    r->fd = fd;
    r->crc = h.payload_crc;
    if (find_locked(s, r->key, NULL)) {
        record_free(r);
        return zt_fail(err, ZT_EFORMAT, "store: %s repeats a key found in another file; remove one of them", path);
    }
    if (add_locked(s, r) != 0) {
        record_free(r);
        return zt_fail(err, ZT_ENOMEM, "store: out of memory");
    }
    fixed_add_locked(s, r);
    return 0;
}

static int load_directory(zt_store *s, zt_err *err)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return zt_fail(err, -errno, "store: cannot read directory %s: %s", s->dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".zts") == 0)
            rc = load_record_file(s, e->d_name, err);
    }
    closedir(d);
    if (rc == 0 && s->cfg.capacity && s->used > s->cfg.capacity)
        rc = zt_fail(err, ZT_ENOMEM, "store: %s holds %zu bytes of records, more than the capacity of %zu; raise it",
                     s->dir, s->used, s->cfg.capacity);
    return rc;
}

/* Opens a store; see offload/store.h. */
int zt_store_open(const zt_store_config *cfg, zt_store **out, zt_err *err)
{
    *out = NULL;
    if (!cfg || (cfg->kind != ZT_STORE_RAM && cfg->kind != ZT_STORE_NVME))
        return zt_fail(err, ZT_EINVAL_CONFIG, "store: kind must be RAM or NVMe");
    zt_store *s = calloc(1, sizeof(*s));
    if (!s)
        return zt_fail(err, ZT_ENOMEM, "store: out of memory");
    s->cfg = *cfg;
    s->cfg.path = NULL;
    if (s->cfg.queue_depth <= 0)
        s->cfg.queue_depth = 32;
    if (s->cfg.io_size == 0)
        s->cfg.io_size = (size_t)1 << 20;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    int rc = 0;
    if (s->cfg.io_size % ZT_STORE_ALIGN || s->cfg.io_size > ((size_t)1 << 30) || s->cfg.queue_depth > 4096) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG,
                     "store: io_size %zu must be a multiple of 4096 up to 1 GiB and queue_depth %d at most 4096",
                     s->cfg.io_size, s->cfg.queue_depth);
        goto err;
    }
    if (posix_memalign((void **)&s->hdr_slab, ZT_STORE_ALIGN, (size_t)ZT_STORE_MAX_REQUESTS * ZT_STORE_HEADER_BYTES)) {
        rc = zt_fail(err, ZT_ENOMEM, "store: out of memory");
        goto err;
    }
    for (int i = 0; i < ZT_STORE_MAX_REQUESTS; i++)
        s->reqs[i].hdr = s->hdr_slab + (size_t)i * ZT_STORE_HEADER_BYTES;
    if (cfg->kind == ZT_STORE_RAM) {
        *out = s;
        return 0;
    }

    s->nvme = 1;
    if (!cfg->path || !cfg->path[0]) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "store: the NVMe store needs a directory (--store nvme:PATH)");
        goto err;
    }
    s->dir = strdup(cfg->path);
    struct stat st;
    if (stat(s->dir, &st) != 0) {
        rc = zt_fail(err, -errno, "store: directory %s: %s; create it first", s->dir, strerror(errno));
        goto err;
    }
    if (!S_ISDIR(st.st_mode)) {
        rc = zt_fail(err, -ENOTDIR, "store: %s is not a directory", s->dir);
        goto err;
    }
    if ((rc = probe_direct(s, err)) != 0)
        goto err;
    rc = io_uring_queue_init((unsigned)s->cfg.queue_depth * 2, &s->ring, 0);
    if (rc < 0) {
        rc = zt_fail(err, ZT_EUNSUPPORTED, "store: io_uring is not available (%s); the NVMe store needs Linux 5.10 "
                     "or newer with io_uring enabled", strerror(-rc));
        goto err;
    }
    s->ring_ok = 1;
    /* A sparse fixed-file table, as large as the descriptor limit allows; without it, plain descriptors. */
    struct rlimit rl;
    unsigned nfixed = ZT_STORE_MAX_FIXED_FILES;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < nfixed)
        nfixed = (unsigned)rl.rlim_cur;
    if (nfixed > 0 && io_uring_register_files_sparse(&s->ring, nfixed) == 0) {
        s->fixed_used = calloc(nfixed, 1);
        if (s->fixed_used) {
            s->fixed_files = 1;
            s->nfixed = nfixed;
        }
    }
    if ((rc = load_directory(s, err)) != 0)
        goto err;
    if (pthread_create(&s->thread, NULL, io_thread, s) != 0) {
        rc = zt_fail(err, ZT_ENOMEM, "store: cannot start the I/O thread");
        goto err;
    }
    s->thread_ok = 1;
    *out = s;
    return 0;
err:
    zt_store_close(s);
    return rc;
}

/* Waits for pending requests and closes the store; see offload/store.h. */
void zt_store_close(zt_store *s)
{
    if (!s)
        return;
    if (s->thread_ok) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; i < s->nrecs; i++) {
        if (s->recs[i]->fd >= 0)
            fdatasync(s->recs[i]->fd);
        record_free(s->recs[i]);
    }
    free(s->recs);
    for (int i = 0; i < ZT_STORE_MAX_REQUESTS; i++)
        free(s->reqs[i].piece_done); /* reads never waited for */
    if (s->ring_ok)
        io_uring_queue_exit(&s->ring);
    free(s->fixed_used);
    free(s->bufs);
    free(s->hdr_slab);
    free(s->dir);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    free(s);
}

/* Registers caller buffers for fixed-buffer I/O; see offload/store.h. */
int zt_store_register_buffers(zt_store *s, float *const *bufs, const size_t *lens, int count, zt_err *err)
{
    if (!s->nvme)
        return 0;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->nbufs > 0 || s->requests_seen) {
        pthread_mutex_unlock(&s->mu);
        return zt_fail(err, ZT_ESTATE, "store: buffers are registered once, before the first read or write");
    }
    if (count <= 0)
        goto out;
    s->bufs = calloc((size_t)count, sizeof(*s->bufs));
    if (!s->bufs) {
        rc = zt_fail(err, ZT_ENOMEM, "store: out of memory");
        goto out;
    }
    for (int i = 0; i < count; i++) {
        if ((uintptr_t)bufs[i] % ZT_STORE_ALIGN || lens[i] % ZT_STORE_ALIGN || lens[i] > ((size_t)1 << 30)) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG,
                         "store: buffer %d must be 4096-aligned, a multiple of 4096 bytes long and at most 1 GiB", i);
            goto out;
        }
        s->bufs[i].iov_base = bufs[i];
        s->bufs[i].iov_len = lens[i];
    }
    rc = io_uring_register_buffers(&s->ring, s->bufs, (unsigned)count);
    if (rc < 0) {
        rc = zt_fail(err, rc, "store: registering %d buffers failed: %s (raise the locked-memory limit, ulimit -l)",
                     count, strerror(-rc));
        goto out;
    }
    s->nbufs = count;
out:
    if (rc) {
        free(s->bufs);
        s->bufs = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- records ---- */

static int create_file(zt_store *s, record *r, zt_err *err)
{
    char path[4096];
    record_path(s, r->key, path, sizeof(path));
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | (s->cfg.buffered ? 0 : O_DIRECT), 0600);
    if (fd < 0)
        return zt_fail(err, -errno, "store: cannot create %s: %s", path, strerror(errno));
    off_t size = (off_t)(ZT_STORE_HEADER_BYTES + r->io_bytes);
    int rc = posix_fallocate(fd, 0, size);
    if (rc == EOPNOTSUPP || rc == EINVAL)
        rc = ftruncate(fd, size) == 0 ? 0 : errno;
    if (rc != 0) {
        close(fd);
        unlink(path);
        return zt_fail(err, -rc, "store: cannot allocate %lld bytes for %s: %s; free disk space or move the store",
                       (long long)size, path, strerror(rc));
    }
    /* The payload is zeros: its checksum, computed a page at a time. */
    static const char zeros[65536];
    uint32_t crc = 0;
    for (size_t left = r->payload_bytes; left > 0;) {
        size_t k = left < sizeof(zeros) ? left : sizeof(zeros);
        crc = zt_crc32c(crc, zeros, k);
        left -= k;
    }
    char *hdr = NULL;
    if (posix_memalign((void **)&hdr, ZT_STORE_ALIGN, ZT_STORE_HEADER_BYTES) != 0) {
        close(fd);
        unlink(path);
        return zt_fail(err, ZT_ENOMEM, "store: out of memory");
    }
    header_fill(hdr, r, crc);
    ssize_t w = pwrite(fd, hdr, ZT_STORE_HEADER_BYTES, 0);
    int e = errno;
    free(hdr);
    if (w != (ssize_t)ZT_STORE_HEADER_BYTES) {
        close(fd);
        unlink(path);
        return zt_fail(err, w < 0 ? -e : ZT_EIO, "store: cannot write the header of %s: %s", path,
                       w < 0 ? strerror(e) : "short write");
    }
    r->fd = fd;
    r->crc = crc;
    return 0;
}

/* Creates a zero record; see offload/store.h. */
int zt_store_create(zt_store *s, zt_store_key key, size_t n, zt_err *err)
{
    if (n == 0 || n > ((size_t)1 << 40))
        return zt_fail(err, ZT_EINVAL_CONFIG, "store: a record needs 1 to 2^40 elements, not %zu", n);
    record *r = calloc(1, sizeof(*r));
    if (!r)
        return zt_fail(err, ZT_ENOMEM, "store: out of memory");
    r->key = key;
    r->n = n;
    r->payload_bytes = n * 3 * sizeof(float);
    r->io_bytes = round_up(r->payload_bytes, ZT_STORE_ALIGN);
    r->fd = -1;
    r->fixed = -1;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (find_locked(s, key, NULL)) {
        rc = zt_fail(err, -EEXIST, "store: record (run %" PRIu64 ", block %" PRIu32 ", shard %" PRIu32 ") exists",
                     key.run, key.block, key.shard);
        goto fail;
    }
    if (s->cfg.capacity && s->used + r->payload_bytes > s->cfg.capacity) {
        rc = zt_fail(err, ZT_ENOMEM,
                     "store: a record of %zu bytes does not fit: %zu of the %zu bytes allowed are in use; raise "
                     "the limit (--mem-limit) or spread the state over more servers",
                     r->payload_bytes, s->used, s->cfg.capacity);
        goto fail;
    }
    if (s->nvme) {
        /* The file is created under the lock so that two creators of one key cannot race. */
        if ((rc = create_file(s, r, err)) != 0)
            goto fail;
    } else {
        void *p = mmap(NULL, r->io_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            rc = zt_fail(err, ZT_ENOMEM, "store: cannot map %zu bytes for a record: %s", r->io_bytes, strerror(errno));
            goto fail;
        }
        madvise(p, r->io_bytes, MADV_HUGEPAGE);
        r->ram = p;
    }
    if (add_locked(s, r) != 0) {
        rc = zt_fail(err, ZT_ENOMEM, "store: out of memory");
        goto fail;
    }
    if (s->nvme)
        fixed_add_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    return 0;
fail:
    pthread_mutex_unlock(&s->mu);
    if (r->fd >= 0) {
        char path[4096];
        record_path(s, key, path, sizeof(path));
        unlink(path);
    }
    record_free(r);
    return rc;
}

/* Removes a record and its file; see offload/store.h. */
int zt_store_remove(zt_store *s, zt_store_key key, zt_err *err)
{
    pthread_mutex_lock(&s->mu);
    size_t idx = 0;
    record *r = find_locked(s, key, &idx);
    int rc = 0;
    if (!r) {
        rc = zt_fail(err, -ENOENT, "store: no record (run %" PRIu64 ", block %" PRIu32 ", shard %" PRIu32 ")",
                     key.run, key.block, key.shard);
    } else if (r->pending > 0) {
        rc = zt_fail(err, ZT_ESTATE, "store: a request on the record is pending; wait for it before removing");
    } else {
        s->recs[idx] = s->recs[--s->nrecs];
        s->used -= r->payload_bytes;
        if (s->nvme) {
            fixed_remove_locked(s, r);
            char path[4096];
            record_path(s, key, path, sizeof(path));
            unlink(path);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == 0)
        record_free(r);
    return rc;
}

/* Looks a record up; see offload/store.h. */
int zt_store_lookup(zt_store *s, zt_store_key key, size_t *n)
{
    pthread_mutex_lock(&s->mu);
    record *r = find_locked(s, key, NULL);
    if (r && n)
        *n = r->n;
    pthread_mutex_unlock(&s->mu);
    return r ? 0 : -ENOENT;
}

/* Returns the number of records. */
size_t zt_store_count(zt_store *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->nrecs;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Returns the payload bytes in use. */
size_t zt_store_used_bytes(zt_store *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->used;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Lists up to max keys and returns the number of records. */
size_t zt_store_list(zt_store *s, zt_store_key *keys, size_t max)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->nrecs;
    for (size_t i = 0; i < n && i < max; i++)
        keys[i] = s->recs[i]->key;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* RAM tier: the record's own memory; see offload/store.h. */
int zt_store_ram_data(zt_store *s, zt_store_key key, float **data, size_t *n)
{
    if (s->nvme)
        return ZT_EUNSUPPORTED;
    pthread_mutex_lock(&s->mu);
    record *r = find_locked(s, key, NULL);
    if (r) {
        *data = r->ram;
        if (n)
            *n = r->n;
    }
    pthread_mutex_unlock(&s->mu);
    return r ? 0 : -ENOENT;
}

/* ---- requests ---- */

static int find_buffer_locked(zt_store *s, const char *p, size_t len)
{
    for (int i = 0; i < s->nbufs; i++) {
        const char *base = s->bufs[i].iov_base;
        if (p >= base && p + len <= base + s->bufs[i].iov_len)
            return i;
    }
    return -1;
}

static int start_request(zt_store *s, zt_store_key key, float *buf, int is_write, int *ticket, zt_err *err)
{
    *ticket = -1;
    if (!buf)
        return zt_fail(err, ZT_EINVAL_CONFIG, "store: the buffer is NULL");
    if (s->nvme && !s->cfg.buffered && (uintptr_t)buf % ZT_STORE_ALIGN)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "store: the buffer must be 4096-aligned for direct I/O; allocate it with zt_store_buffer_alloc");
    pthread_mutex_lock(&s->mu);
    s->requests_seen = 1;
    record *r = find_locked(s, key, NULL);
    int rc = 0;
    if (!r) {
        rc = zt_fail(err, -ENOENT, "store: no record (run %" PRIu64 ", block %" PRIu32 ", shard %" PRIu32 ")",
                     key.run, key.block, key.shard);
        goto out;
    }
    int slot = -1;
    for (int i = 0; i < ZT_STORE_MAX_REQUESTS; i++) {
        if (!s->reqs[i].in_use) {
            slot = i;
            break;
        }
    }
    if (slot < 0) {
        rc = zt_fail(err, ZT_ESTATE, "store: %d requests are pending; wait for some before queueing more",
                     ZT_STORE_MAX_REQUESTS);
        goto out;
    }
    request *q = &s->reqs[slot];
    char *hdr = q->hdr;
    memset(q, 0, sizeof(*q));
    q->hdr = hdr;
    q->in_use = 1;
    q->is_write = is_write;
    q->rec = r;
    q->buf = (char *)buf;
    q->buf_index = -1;
    *ticket = slot;
    r->pending++; /* until zt_store_wait: the record cannot be removed under a ticket */
    if (!s->nvme) {
        /* RAM: the copy is the whole request. */
        if (is_write)
            memcpy(r->ram, buf, r->payload_bytes);
        else
            memcpy(buf, r->ram, r->payload_bytes);
        q->done = 1;
        goto out;
    }
    if (is_write) {
        /* The checksum is computed without the lock, so that other callers and the I/O thread go on. */
        pthread_mutex_unlock(&s->mu);
        uint32_t crc = zt_crc32c(0, buf, r->payload_bytes);
        pthread_mutex_lock(&s->mu);
        q->crc = crc;
        header_fill(q->hdr, r, crc);
    }
    q->total = r->io_bytes;
    q->buf_index = find_buffer_locked(s, q->buf, q->total);
    if (!is_write) {
        /* Without the bitmap (out of memory) the read is checksummed after its last piece instead. */
        size_t pieces = (q->total + s->cfg.io_size - 1) / s->cfg.io_size;
        q->piece_done = calloc((pieces + 63) / 64, sizeof(uint64_t));
    }
    q->seq = s->next_seq++;
    q->queued = 1;
    pthread_cond_signal(&s->work_cv);
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Queues a read of a whole record; see offload/store.h. */
int zt_store_read_async(zt_store *s, zt_store_key key, float *dst, int *ticket, zt_err *err)
{
    return start_request(s, key, dst, 0, ticket, err);
}

/* Queues a write of a whole record; see offload/store.h. */
int zt_store_write_async(zt_store *s, zt_store_key key, const float *src, int *ticket, zt_err *err)
{
    return start_request(s, key, (float *)src, 1, ticket, err);
}

/* Waits for a request and releases its ticket; see offload/store.h. */
int zt_store_wait(zt_store *s, int ticket, zt_err *err)
{
    if (ticket < 0 || ticket >= ZT_STORE_MAX_REQUESTS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "store: ticket %d is not a ticket", ticket);
    pthread_mutex_lock(&s->mu);
    request *q = &s->reqs[ticket];
    if (!q->in_use) {
        pthread_mutex_unlock(&s->mu);
        return zt_fail(err, ZT_ESTATE, "store: ticket %d is not pending (waited twice?)", ticket);
    }
    int reading = s->nvme && !q->is_write;
    size_t payload = q->rec->payload_bytes;
    uint32_t got = 0;   /* read: checksum of the payload's first checked bytes */
    size_t checked = 0;
    q->waiting = 1;
    while (!q->done) {
        if (reading && q->result == 0 && q->done_prefix > checked && checked < payload) {
            /* These bytes have arrived and the kernel no longer writes them: checksum them unlocked. */
            size_t end = q->done_prefix < payload ? q->done_prefix : payload;
            pthread_mutex_unlock(&s->mu);
            got = zt_crc32c(got, q->buf + checked, end - checked);
            pthread_mutex_lock(&s->mu);
            checked = end;
            continue;
        }
        pthread_cond_wait(&s->done_cv, &s->mu);
    }
    q->waiting = 0;
    int rc = q->result;
    int verify = reading && rc == 0;
    zt_store_key key = q->rec->key;
    uint32_t want = q->crc;
    const char *buf = q->buf;
    int is_write = q->is_write;
    free(q->piece_done);
    q->piece_done = NULL;
    q->rec->pending--;
    q->in_use = 0;
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        char path[4096];
        record_path(s, key, path, sizeof(path));
        return zt_fail(err, rc, "store: %s of %s (run %" PRIu64 ", block %" PRIu32 ", shard %" PRIu32 ") failed: %s%s",
                       is_write ? "write" : "read", path, key.run, key.block, key.shard,
                       rc == ZT_EIO ? "the record is incomplete (a write failed or the file is short)" : zt_strerror(rc),
                       is_write ? " (free space on that disk or fix it, then resume from the last checkpoint)" : "");
    }
    if (verify && zt_crc32c(got, buf + checked, payload - checked) != want)
        return zt_fail(err, ZT_ECHECKSUM,
                       "store: record (run %" PRIu64 ", block %" PRIu32 ", shard %" PRIu32 ") fails its checksum: the "
                       "file is corrupt; restore the run's state from a snapshot",
                       key.run, key.block, key.shard);
    return 0;
}

/* Reads a record synchronously. */
int zt_store_read(zt_store *s, zt_store_key key, float *dst, zt_err *err)
{
    int t;
    int rc = zt_store_read_async(s, key, dst, &t, err);
    return rc ? rc : zt_store_wait(s, t, err);
}

/* Writes a record synchronously. */
int zt_store_write(zt_store *s, zt_store_key key, const float *src, zt_err *err)
{
    int t;
    int rc = zt_store_write_async(s, key, src, &t, err);
    return rc ? rc : zt_store_wait(s, t, err);
}
