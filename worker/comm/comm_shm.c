/* The shared-memory backend of comm.h: ranks are processes on one host that map one POSIX shared-memory
 * segment, /ztrain-<name>.
 *
 * Segment layout: a header (magic, world size, a robust process-shared mutex and condition variable, the
 * abort flag and its message, one slot per rank) followed by one staging buffer of chunk_bytes per rank.
 * Rank 0 creates the segment and removes its name once every rank has mapped it, so nothing is left in
 * /dev/shm after the job. Every collective moves its data in chunks: each rank copies its part into its own
 * staging buffer, a barrier, each rank reads what it needs from all buffers (reductions in rank order, so
 * the result is the same on every rank), a second barrier so that buffers can be reused.
 *
 * Failure handling: every wait wakes up at least every 200 ms to check that the peers it waits for are
 * still alive (a process that exited or is a zombie counts as dead) and that the deadline has not passed.
 * The first rank to see a failure writes the message into the header and sets the abort flag; every other
 * rank then fails with that same message instead of waiting for its own timeout. */
#include "worker/comm/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x7a74726e73686d31ull /* "ztrnshm1" */
#define SHM_MAX_RANKS 1024
#define SHM_DEFAULT_CHUNK (4u << 20)
#define SHM_POLL_S 0.2

typedef struct shm_slot {
    int32_t pid;
    int32_t joined;       /* 1 once the rank has registered */
    uint64_t config_hash;
    uint64_t gen;         /* barriers this rank has entered */
    int32_t mbox_dst;     /* point-to-point mailbox, this rank as sender: destination, -1 when empty */
    uint64_t mbox_bytes;  /* bytes waiting in this rank's staging buffer for mbox_dst */
} shm_slot;

typedef struct shm_header {
    _Atomic uint64_t magic; /* written last by rank 0: the segment is ready */
    int32_t world_size;
    int32_t creator_pid;
    uint64_t chunk_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t aborted;
    char abort_msg[ZT_ERR_LEN];
    shm_slot slots[SHM_MAX_RANKS];
} shm_header;

typedef struct shm_comm {
    zt_comm base;
    shm_header *h;
    size_t map_bytes;
    char seg_name[ZT_COMM_NAME_LEN + 16];
    bool unlinked;       /* rank 0: the segment's name has been removed */
    double timeout_s;
    unsigned char *bufs; /* world_size staging buffers of chunk_bytes */
    size_t chunk_bytes;
} shm_comm;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* True while process pid exists and has not exited (a zombie awaiting its parent counts as exited). */
static bool pid_alive(int pid)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    if (!paren || paren[1] != ' ')
        return true;
    return paren[2] != 'Z' && paren[2] != 'X';
}

static unsigned char *buf_of(shm_comm *c, int rank)
{
    return c->bufs + (size_t)rank * c->chunk_bytes;
}

/* Locks the segment's mutex; a holder that died leaves it consistent again and aborts the job. */
static void seg_lock(shm_comm *c)
{
    int rc = pthread_mutex_lock(&c->h->mu);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&c->h->mu);
        if (!c->h->aborted) {
            c->h->aborted = 1;
            snprintf(c->h->abort_msg, sizeof c->h->abort_msg,
                     "a rank exited in the middle of a collective; see that rank's log for its error");
        }
        pthread_cond_broadcast(&c->h->cv);
    } else {
        ZT_ASSERT(rc == 0);
    }
}

static void seg_unlock(shm_comm *c)
{
    pthread_mutex_unlock(&c->h->mu);
}

/* With the lock held: records the job's first failure (later ones keep the first message), wakes every
 * waiter and returns code with the recorded message in err. */
static int seg_abort(shm_comm *c, zt_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int seg_abort(shm_comm *c, zt_err *err, int code, const char *fmt, ...)
{
    if (!c->h->aborted) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->h->abort_msg, sizeof c->h->abort_msg, fmt, ap);
        va_end(ap);
        c->h->aborted = 1;
    }
    pthread_cond_broadcast(&c->h->cv);
    return zt_fail(err, code, "%s", c->h->abort_msg);
}

/* What a wait is waiting for: ready() says when it is over; lagging(q) says whether rank q is one of the
 * ranks that holds it up (to name them and to check that they are alive). */
typedef struct wait_spec {
    bool (*ready)(shm_comm *c, const void *arg);
    bool (*lagging)(shm_comm *c, const void *arg, int q);
    const void *arg;
    const char *what; /* "the barrier", "joining", ... for messages */
} wait_spec;

/* Appends "1, 3 and 4" (the ranks for which lagging() holds) to buf. */
static void list_lagging(shm_comm *c, const wait_spec *w, char *buf, size_t cap)
{
    size_t len = 0;
    int shown = 0;
    buf[0] = '\0';
    for (int q = 0; q < c->base.world_size && len + 16 < cap; q++) {
        if (!w->lagging(c, w->arg, q))
            continue;
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", shown ? ", " : "", q);
        shown++;
    }
    if (shown == 0)
        snprintf(buf, cap, "none");
}

/* With the lock held: waits until w->ready, the job aborts, a lagging peer dies or the deadline passes.
 * Returns 0 when ready, or a negative code with a message (the job is then aborted for every rank). */
static int seg_wait(shm_comm *c, const wait_spec *w, double deadline, zt_err *err)
{
    shm_header *h = c->h;
    for (;;) {
        if (h->aborted)
            return zt_fail(err, ZT_ESTATE, "%s", h->abort_msg);
        if (w->ready(c, w->arg))
            return 0;
        double now = now_s();
        for (int q = 0; q < c->base.world_size; q++) {
            shm_slot *s = &h->slots[q];
            if (q != c->base.rank && s->joined && w->lagging(c, w->arg, q) && !pid_alive(s->pid))
                return seg_abort(c, err, ZT_ESTATE,
                                 "rank %d (pid %d) exited while rank %d waited for it in %s; see rank %d's log "
                                 "for its error",
                                 q, (int)s->pid, c->base.rank, w->what, q);
        }
        if (now >= deadline) {
            char ranks[256];
            list_lagging(c, w, ranks, sizeof ranks);
            return seg_abort(c, err, ZT_ESTATE,
                             "timed out after %.0f s in %s: rank(s) %s did not arrive (seen by rank %d); check "
                             "that every rank runs and is not stuck, or raise the timeout",
                             c->timeout_s, w->what, ranks, c->base.rank);
        }
        double until = now + SHM_POLL_S < deadline ? now + SHM_POLL_S : deadline;
        struct timespec ts;
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        int rc = pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        if (rc == EOWNERDEAD) {
            pthread_mutex_consistent(&h->mu);
            return seg_abort(c, err, ZT_ESTATE, "a rank exited in the middle of a collective; see that rank's log");
        }
    }
}

/* ---- barrier ---- */

static bool barrier_ready(shm_comm *c, const void *arg)
{
    uint64_t gen = *(const uint64_t *)arg;
    for (int q = 0; q < c->base.world_size; q++)
        if (c->h->slots[q].gen < gen)
            return false;
    return true;
}

static bool barrier_lagging(shm_comm *c, const void *arg, int q)
{
    return c->h->slots[q].gen < *(const uint64_t *)arg;
}

/* Waits until every rank has entered as many barriers as this one. */
static int shm_sync(shm_comm *c, const char *what, zt_err *err)
{
    seg_lock(c);
    uint64_t gen = ++c->h->slots[c->base.rank].gen;
    pthread_cond_broadcast(&c->h->cv);
    wait_spec w = {barrier_ready, barrier_lagging, &gen, what};
    int rc = seg_wait(c, &w, now_s() + c->timeout_s, err);
    seg_unlock(c);
    return rc;
}

static int shm_barrier(zt_comm *base, void *stream, zt_err *err)
{
    (void)stream;
    return shm_sync((shm_comm *)base, "a barrier", err);
}

/* ---- reductions, in rank order ---- */

static int check_dtype(enum zt_comm_dtype dtype, zt_err *err)
{
    if (dtype == ZT_COMM_F32 || dtype == ZT_COMM_F64 || dtype == ZT_COMM_I32)
        return 0;
    return zt_fail(err, ZT_EUNSUPPORTED,
                   "the shared-memory backend handles fp32, fp64 and int32 only (bf16 and fp16 need nccl)");
}

/* dst[i] = src_0[i] op src_1[i] op ... over the staging buffers of every rank, at byte offset off. */
static void reduce_bufs(shm_comm *c, void *dst, size_t off, size_t n, enum zt_comm_dtype dtype, enum zt_comm_op op)
{
    const int W = c->base.world_size;
#define REDUCE(T)                                                                                          \
    do {                                                                                                   \
        T *d = (T *)dst;                                                                                   \
        memcpy(d, buf_of(c, 0) + off, n * sizeof(T));                                                      \
        for (int q = 1; q < W; q++) {                                                                      \
            const T *s = (const T *)(buf_of(c, q) + off);                                                  \
            if (op == ZT_COMM_SUM)                                                                         \
                for (size_t i = 0; i < n; i++)                                                             \
                    d[i] += s[i];                                                                          \
            else                                                                                           \
                for (size_t i = 0; i < n; i++)                                                             \
                    d[i] = s[i] > d[i] || s[i] != s[i] ? s[i] : d[i];                                      \
        }                                                                                                  \
    } while (0)
    if (dtype == ZT_COMM_F32)
        REDUCE(float);
    else if (dtype == ZT_COMM_F64)
        REDUCE(double);
    else
        REDUCE(int32_t);
#undef REDUCE
}

static int shm_all_reduce(zt_comm *base, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                          enum zt_comm_op op, void *stream, zt_err *err)
{
    (void)stream;
    shm_comm *c = (shm_comm *)base;
    int rc = check_dtype(dtype, err);
    const size_t es = zt_comm_dtype_size(dtype), per = c->chunk_bytes / es;
    for (size_t off = 0; rc == 0 && off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(buf_of(c, base->rank), (const unsigned char *)send + off * es, n * es);
        if ((rc = shm_sync(c, "all_reduce", err)) < 0)
            break;
        reduce_bufs(c, (unsigned char *)recv + off * es, 0, n, dtype, op);
        rc = shm_sync(c, "all_reduce", err);
    }
    return rc;
}

static int shm_reduce_scatter(zt_comm *base, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                              enum zt_comm_op op, void *stream, zt_err *err)
{
    (void)stream;
    shm_comm *c = (shm_comm *)base;
    int rc = check_dtype(dtype, err);
    const int W = base->world_size;
    const size_t es = zt_comm_dtype_size(dtype), per = c->chunk_bytes / es / (size_t)W;
    for (size_t off = 0; rc == 0 && off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        for (int q = 0; q < W; q++)
            memcpy(buf_of(c, base->rank) + (size_t)q * n * es,
                   (const unsigned char *)send + ((size_t)q * count + off) * es, n * es);
        if ((rc = shm_sync(c, "reduce_scatter", err)) < 0)
            break;
        reduce_bufs(c, (unsigned char *)recv + off * es, (size_t)base->rank * n * es, n, dtype, op);
        rc = shm_sync(c, "reduce_scatter", err);
    }
    return rc;
}

static int shm_all_gather(zt_comm *base, const void *send, void *recv, size_t count, enum zt_comm_dtype dtype,
                          void *stream, zt_err *err)
{
    (void)stream;
    shm_comm *c = (shm_comm *)base;
    int rc = check_dtype(dtype, err);
    const size_t es = zt_comm_dtype_size(dtype), per = c->chunk_bytes / es;
    for (size_t off = 0; rc == 0 && off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(buf_of(c, base->rank), (const unsigned char *)send + off * es, n * es);
        if ((rc = shm_sync(c, "all_gather", err)) < 0)
            break;
        for (int q = 0; q < base->world_size; q++)
            memmove((unsigned char *)recv + ((size_t)q * count + off) * es, buf_of(c, q), n * es);
        rc = shm_sync(c, "all_gather", err);
    }
    return rc;
}

static int shm_broadcast(zt_comm *base, void *buf, size_t count, enum zt_comm_dtype dtype, int root, void *stream,
                         zt_err *err)
{
    (void)stream;
    shm_comm *c = (shm_comm *)base;
    int rc = check_dtype(dtype, err);
    const size_t es = zt_comm_dtype_size(dtype), per = c->chunk_bytes / es;
    for (size_t off = 0; rc == 0 && off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        if (base->rank == root)
            memcpy(buf_of(c, root), (unsigned char *)buf + off * es, n * es);
        if ((rc = shm_sync(c, "broadcast", err)) < 0)
            break;
        if (base->rank != root)
            memcpy((unsigned char *)buf + off * es, buf_of(c, root), n * es);
        rc = shm_sync(c, "broadcast", err);
    }
    return rc;
}

/* ---- point to point: a mailbox in the sender's slot ---- */

typedef struct mbox_arg {
    int sender;
    int32_t want_dst; /* ready when the sender's mbox_dst equals this */
} mbox_arg;

static bool mbox_ready(shm_comm *c, const void *arg)
{
    const mbox_arg *a = arg;
    return c->h->slots[a->sender].mbox_dst == a->want_dst;
}

static bool mbox_lagging(shm_comm *c, const void *arg, int q)
{
    const mbox_arg *a = arg;
    if (a->sender == c->base.rank) /* the sender waits for the receiver */
        return q == c->h->slots[a->sender].mbox_dst;
    return q == a->sender;
}

static int shm_send(zt_comm *base, const void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                    zt_err *err)
{
    (void)stream;
    shm_comm *c = (shm_comm *)base;
    int rc = check_dtype(dtype, err);
    const size_t es = zt_comm_dtype_size(dtype), per = c->chunk_bytes / es;
    shm_slot *me = &c->h->slots[base->rank];
    for (size_t off = 0; rc == 0 && (off < count || (count == 0 && off == 0)); off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(buf_of(c, base->rank), (const unsigned char *)buf + off * es, n * es);
        seg_lock(c);
        me->mbox_bytes = n * es;
        me->mbox_dst = peer;
        pthread_cond_broadcast(&c->h->cv);
        mbox_arg a = {base->rank, -1};
        wait_spec w = {mbox_ready, mbox_lagging, &a, "send"};
        rc = seg_wait(c, &w, now_s() + c->timeout_s, err);
        seg_unlock(c);
        if (count == 0)
            break;
    }
    return rc;
}

static int shm_recv(zt_comm *base, void *buf, size_t count, enum zt_comm_dtype dtype, int peer, void *stream,
                    zt_err *err)
{
    (void)stream;
    shm_comm *c = (shm_comm *)base;
    int rc = check_dtype(dtype, err);
    const size_t es = zt_comm_dtype_size(dtype), per = c->chunk_bytes / es;
    shm_slot *from = &c->h->slots[peer];
    for (size_t off = 0; rc == 0 && (off < count || (count == 0 && off == 0)); off += per) {
        size_t n = count - off < per ? count - off : per;
        seg_lock(c);
        mbox_arg a = {peer, base->rank};
        wait_spec w = {mbox_ready, mbox_lagging, &a, "recv"};
        rc = seg_wait(c, &w, now_s() + c->timeout_s, err);
        if (rc == 0 && from->mbox_bytes != n * es)
            rc = seg_abort(c, err, ZT_EMISMATCH,
                           "rank %d sent %llu bytes where rank %d expected %zu: the send and recv counts differ",
                           peer, (unsigned long long)from->mbox_bytes, base->rank, n * es);
        seg_unlock(c);
        if (rc < 0)
            break;
        memcpy((unsigned char *)buf + off * es, buf_of(c, peer), n * es);
        seg_lock(c);
        from->mbox_dst = -1;
        pthread_cond_broadcast(&c->h->cv);
        seg_unlock(c);
        if (count == 0)
            break;
    }
    return rc;
}

/* ---- creation and the job's check-in ---- */

static void shm_destroy(zt_comm *base)
{
    shm_comm *c = (shm_comm *)base;
    if (c->base.rank == 0 && !c->unlinked && c->h)
        shm_unlink(c->seg_name);
    if (c->h)
        munmap(c->h, c->map_bytes);
    free(c);
}

static const zt__comm_ops shm_ops = {shm_all_gather, shm_reduce_scatter, shm_all_reduce, shm_broadcast,
                                     shm_barrier,    shm_send,           shm_recv,       shm_destroy};

static bool joined_ready(shm_comm *c, const void *arg)
{
    (void)arg;
    for (int q = 0; q < c->base.world_size; q++)
        if (!c->h->slots[q].joined)
            return false;
    return true;
}

static bool joined_lagging(shm_comm *c, const void *arg, int q)
{
    (void)arg;
    return !c->h->slots[q].joined;
}

/* Rank 0: creates and initialises the segment (replacing a stale one of the same name). */
static int create_segment(shm_comm *c, zt_err *err)
{
    shm_unlink(c->seg_name);
    int fd = shm_open(c->seg_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return zt_fail(err, -errno, "cannot create shared-memory segment %s: %s (is /dev/shm mounted and writable?)",
                       c->seg_name, strerror(errno));
    if (ftruncate(fd, (off_t)c->map_bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(c->seg_name);
        return zt_fail(err, -e, "cannot size shared-memory segment %s to %zu bytes: %s (free space in /dev/shm)",
                       c->seg_name, c->map_bytes, strerror(e));
    }
    void *p = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(c->seg_name);
        return zt_fail(err, -errno, "cannot map shared-memory segment %s: %s", c->seg_name, strerror(errno));
    }
    shm_header *h = p;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    h->world_size = c->base.world_size;
    h->creator_pid = (int32_t)getpid();
    h->chunk_bytes = c->chunk_bytes;
    for (int q = 0; q < SHM_MAX_RANKS; q++)
        h->slots[q].mbox_dst = -1;
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    c->h = h;
    return 0;
}

/* Ranks > 0: maps rank 0's segment once it exists and is ready, polling until the deadline. */
static int open_segment(shm_comm *c, double deadline, zt_err *err)
{
    const struct timespec pause = {0, 2 * 1000 * 1000};
    for (;;) {
        int fd = shm_open(c->seg_name, O_RDWR, 0600);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(shm_header)) {
                size_t bytes = (size_t)st.st_size;
                void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p != MAP_FAILED) {
                    shm_header *h = p;
                    if (atomic_load_explicit(&h->magic, memory_order_acquire) == SHM_MAGIC &&
                        pid_alive(h->creator_pid)) {
                        close(fd);
                        c->h = h;
                        c->map_bytes = bytes;
                        return 0;
                    }
                    munmap(p, bytes); /* not ready yet, or left over from a job that ended */
                }
            }
            close(fd);
        }
        if (now_s() >= deadline)
            return zt_fail(err, ZT_ESTATE,
                           "rank %d: rank 0 did not open the job's shared-memory segment %s within %.0f s: rank(s) "
                           "0 never joined; start rank 0 with the same MASTER_PORT, or raise the join timeout",
                           c->base.rank, c->seg_name, c->timeout_s);
        nanosleep(&pause, NULL);
    }
}

/* Creates a shm communicator and checks the job in (see comm.h). */
int zt__comm_shm_create(zt_comm **out, const zt_comm_options *o, zt_err *err)
{
    if (o->world_size > SHM_MAX_RANKS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the shared-memory backend supports at most %d ranks, not %d",
                       SHM_MAX_RANKS, o->world_size);
    if (!(o->join_timeout_s > 0) || !(o->timeout_s > 0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "communication timeouts must be positive (join %g s, collectives %g s)",
                       o->join_timeout_s, o->timeout_s);
    if (o->name[0] == '\0' || strnlen(o->name, ZT_COMM_NAME_LEN) == ZT_COMM_NAME_LEN)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the job name for the shared-memory segment must have 1 to %d characters",
                       ZT_COMM_NAME_LEN - 1);
    for (const char *p = o->name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_'))
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "job name '%s' for the shared-memory segment may hold only letters, digits, '-' and '_'",
                           o->name);
    size_t chunk = o->chunk_bytes ? o->chunk_bytes : SHM_DEFAULT_CHUNK;
    /* Room for every rank's slice of a reduce-scatter chunk of 8-byte elements. */
    size_t min_chunk = 8 * (size_t)o->world_size;
    if (chunk < min_chunk)
        chunk = min_chunk;
    chunk = (chunk + 63) / 64 * 64;

    shm_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating a communicator");
    c->base.ops = &shm_ops;
    c->base.rank = o->rank;
    c->base.world_size = o->world_size;
    c->timeout_s = o->join_timeout_s;
    snprintf(c->seg_name, sizeof c->seg_name, "/ztrain-%s", o->name);
    c->chunk_bytes = chunk;
    c->map_bytes = (sizeof(shm_header) + 63) / 64 * 64 + (size_t)o->world_size * chunk;

    const double deadline = now_s() + o->join_timeout_s;
    int rc = o->rank == 0 ? create_segment(c, err) : open_segment(c, deadline, err);
    if (rc < 0) {
        c->h = NULL;
        shm_destroy(&c->base);
        return rc;
    }
    shm_header *h = c->h;
    c->chunk_bytes = h->chunk_bytes;
    c->bufs = (unsigned char *)h + (sizeof(shm_header) + 63) / 64 * 64;

    seg_lock(c);
    if (h->world_size != o->world_size) {
        rc = seg_abort(c, err, ZT_EMISMATCH,
                       "WORLD_SIZE mismatch: rank 0 runs with WORLD_SIZE=%d but rank %d with WORLD_SIZE=%d; start "
                       "every rank with the same WORLD_SIZE",
                       (int)h->world_size, o->rank, o->world_size);
    } else if (h->slots[o->rank].joined) {
        rc = seg_abort(c, err, ZT_ESTATE,
                       "two processes claim rank %d (pids %d and %d); give every process its own RANK", o->rank,
                       (int)h->slots[o->rank].pid, (int)getpid());
    } else {
        shm_slot *me = &h->slots[o->rank];
        me->pid = (int32_t)getpid();
        me->config_hash = o->config_hash;
        me->joined = 1;
        pthread_cond_broadcast(&h->cv);
        wait_spec w = {joined_ready, joined_lagging, NULL, "joining the job"};
        rc = seg_wait(c, &w, deadline, err);
    }
    seg_unlock(c);
    if (rc == 0 && o->rank == 0) {
        shm_unlink(c->seg_name); /* every rank has it mapped; no name is left behind */
        c->unlinked = true;
    }
    if (rc == 0) {
        char ranks[256];
        size_t len = 0;
        int bad = 0;
        ranks[0] = '\0';
        for (int q = 1; q < o->world_size; q++)
            if (h->slots[q].config_hash != h->slots[0].config_hash && len + 16 < sizeof ranks) {
                len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", bad ? ", " : "", q);
                bad++;
            }
        if (bad)
            rc = zt_fail(err, ZT_EMISMATCH,
                         "rank(s) %s run a different training config than rank 0 (config hash %016llx on rank 0, "
                         "%016llx on rank %d): start every rank with the same config file and flags",
                         ranks, (unsigned long long)h->slots[0].config_hash,
                         (unsigned long long)h->slots[o->rank].config_hash, o->rank);
    }
    if (rc < 0) {
        shm_destroy(&c->base);
        return rc;
    }
    c->timeout_s = o->timeout_s;
    *out = &c->base;
    return 0;
}
