/* The worker's state-service client (see client.h): the step protocol over S ztrain-server processes via
 * proto/rpc.h, with retries on UNAVAILABLE, or over an in-process state server core (embedded mode).
 * Large pushes and pulls are split into pieces sent on concurrent streams ("lanes"): lane 0 is the calling
 * thread, lanes 1.. are threads of a small pool, each with its own channel (TCP connection) per server. */
#include "worker/state/client.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/shm.h"
#include "common/units.h"
#include "proto/rpc.h"
#include "proto/wire.h"
#include "ztrain/v1/state.pb-c.h"

#define SVC "/ztrain.v1.StateService/"

/* Streams used when neither the options nor ZT_STATE_STREAMS say: a quarter of the cores, at most this. */
#define DEFAULT_STREAMS_MAX 4
/* A piece of a split transfer is at least this many chunks (smaller shards go on one stream). */
#define PIECE_MIN_CHUNKS 4

/* A shared-memory segment offered to one server: used by calls in flight (refs); retired (spoiled) after a call
 * through it failed, and freed (DetachShm, unmapped) when the last of them is done. */
struct link_seg {
    zt_shm_t *shm;
    uint64_t id;             /* the server's name for it (AttachShmResponse.segment) */
    int refs;
    int spoiled;
};

/* How one server is reached: not decided yet, through shared memory, or over TCP. */
enum link_state {
    LINK_UNTRIED = 0,
    LINK_SHM = 1,
    LINK_TCP = 2,
};

/* Whether a server reads pushes from and writes pulls into one piece of the client's shared host memory
 * (zt_state_client_shared_alloc). */
enum arena_state {
    ARENA_UNTRIED = 0,
    ARENA_ON = 1,            /* attached: arena_id names it */
    ARENA_OFF = 2,           /* refused: pushes and pulls copy through the slots */
};

/* One piece of the client's shared host memory: a segment of its own, without slots. */
struct arena {
    zt_shm_t *shm;
    uint8_t *base;           /* its first byte that the caller may use (after the head) */
    uint64_t bytes;          /* bytes the caller asked for */
    enum zt_state_shared what;
};

/* The words of the log lines about a piece of shared host memory, by what it holds. */
static const struct {
    const char *name;        /* what the memory is */
    const char *use;         /* what goes without a copy, followed by "this process's <name>" */
    const char *copied;      /* what happens without it */
} shared_words[2] = {
    [ZT_STATE_SHARED_GRADIENT] = {"host gradient", "gradient pushes read by the server from",
                                  "gradient pushes copy through the shared-memory slots"},
    [ZT_STATE_SHARED_WEIGHTS] = {"host weights", "pulls written by the server into",
                                 "pulls copy out of the shared-memory slots"},
};

struct remote {
    char *target;            /* "host:port" */
    zt_rpc_channel_t *ch[ZT_STATE_CLIENT_MAX_STREAMS]; /* one channel per lane; lanes 1.. own their connection */
    pthread_mutex_t link_mu; /* guards link, cur and the arena fields; held while a segment is offered */
    enum link_state link;
    struct link_seg *cur;    /* with LINK_SHM: the segment new calls use */
    enum arena_state arena[ZT_STATE_CLIENT_MAX_SHARED]; /* per piece of the client's shared host memory */
    uint64_t arena_id[ZT_STATE_CLIENT_MAX_SHARED]; /* with ARENA_ON: the server's name for that piece */
    bool arena_pulls[ZT_STATE_CLIENT_MAX_SHARED]; /* with ARENA_ON: the server writes pulls into it only while this
                                                     client holds it (AttachShmResponse.pulls_checked) */
};

/* A copy of initial parameters this client pushed (one shard), kept until the run's first commit. */
struct init_copy {
    int block;
    int shard;
    float *data; /* n floats, owned */
    uint64_t n;
};

/* The world size and parameter dtype of each run registered through this client: the owner mapping and
 * the split of pulls need them. Remote runs also keep their packed RegisterRunRequest and, until the first
 * commit, copies of the initial parameters pushed, to give a server that lost the run (killed before the
 * run's first snapshot) the run again (recover_run). */
struct run_entry {
    char id[ZT_SERVER_RUN_ID_MAX];
    int world_size;
    enum zt_dtype param_dtype;
    uint8_t *reg;            /* the packed RegisterRunRequest (remote), owned */
    size_t reg_len;
    struct init_copy *init;  /* initial parameters pushed through this client, until the first commit */
    int ninit;
    int init_cap;
};

/* One piece of a push or pull: a contiguous range of one shard, sent on one lane's stream. */
struct piece {
    int lane;
    int pull;                /* 1: PullParams, 0: a push */
    int masters;             /* pull: the fp32 masters (PullParamsRequest.masters) */
    int standing;            /* pull: into the caller's weights in shared memory, one request that stands there
                                (PullParamsRequest.standing) */
    int server;
    const char *method;      /* push: SVC "PushParams" or SVC "PushGradients" */
    const char *run;
    int64_t step;
    int block, shard;
    Ztrain__V1__DType dtype; /* the wire dtype of the data sent or expected */
    size_t es;               /* bytes per element */
    uint64_t first;          /* the piece's first element in the shard */
    uint64_t n;              /* its elements */
    const uint8_t *src;      /* push: the piece's first byte */
    uint8_t *dst;            /* pull: where its first element goes */
    int code;                /* result: the final gRPC code ... */
    struct zt_rpc_status st; /* ... and status */
};

struct zt_state_client;

/* The argument of one pool thread. */
struct lane_arg {
    struct zt_state_client *c;
    int lane;
};

/* The threads of lanes 1..nthreads, started on the first split transfer. */
struct lane_pool {
    int tried;               /* the threads were started (or failed to start) */
    int nthreads;            /* started */
    pthread_t th[ZT_STATE_CLIENT_MAX_STREAMS];
    struct lane_arg arg[ZT_STATE_CLIENT_MAX_STREAMS];
    pthread_mutex_t mu;
    pthread_cond_t work;     /* a job was posted, or quit */
    pthread_cond_t done;     /* busy reached 0 */
    struct piece *job[ZT_STATE_CLIENT_MAX_STREAMS]; /* the piece of each lane, NULL when idle */
    int busy;                /* lanes still working on the current transfer */
    int quit;
};

struct zt_state_client {
    int n;                   /* servers; 1 in embedded mode */
    struct remote *srv;      /* n entries, or NULL in embedded mode */
    zt_server_core *core;    /* embedded mode, else NULL */
    int max_retries;
    double backoff_s;
    double timeout_s;
    size_t chunk_bytes;
    int streams;             /* lanes per server, 1 to ZT_STATE_CLIENT_MAX_STREAMS */
    enum zt_state_shm shm;
    enum zt__state_shm_fault shm_fault; /* tests */
    struct lane_pool pool;
    pthread_mutex_t hook_mu; /* one hook call at a time */
    pthread_mutex_t xfer_mu; /* one split transfer on the pool at a time (several threads may move data) */
    pthread_mutex_t init_mu; /* guards the runs' initial-parameter copies: a pull on one thread drops them
                                while a commit on another may push them again */
    struct run_entry runs[ZT_STATE_CLIENT_MAX_RUNS];
    int nruns;
    void (*hook)(void *user, int64_t step, int block, int shard, uint64_t bytes_sent);
    void *hook_user;
    /* zt_state_client_shared_alloc: pieces of host memory, each a segment of its own, offered to every server
     * that took a slot segment, from which pushes are read and into which pulls are written where they lie (no
     * copy through a slot) */
    struct arena arenas[ZT_STATE_CLIENT_MAX_SHARED];
    int narenas;
    _Atomic uint64_t bytes_in_place; /* push bytes the servers read from the arenas (tests) */
    _Atomic uint64_t bytes_pulled_in_place; /* pull bytes the servers wrote into the arenas (tests) */
    _Atomic uint64_t pull_copy_bytes; /* pulled bytes this process copied (slots, TCP messages) */
    _Atomic uint64_t pull_copy_ns;    /* ... and the nanoseconds of those copies, summed over threads */
};

/* ---- lifetime ---- */

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(zt_xmalloc(n), s, n);
}

static int parse_servers(zt_state_client_t *c, const char *list, zt_err *err)
{
    char *copy = xstrdup(list);
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    c->srv = zt_xcalloc((size_t)n, sizeof(*c->srv));
    int rc = 0;
    char *save = NULL;
    char *tok = strtok_r(copy, ",", &save);
    c->n = 0;
    for (; tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        const char *colon = strrchr(tok, ':');
        if (colon == NULL || colon == tok || colon[1] == '\0') {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "--servers %s: '%s' is not host:port", list, tok);
            break;
        }
        c->srv[c->n++].target = xstrdup(tok);
    }
    if (rc == 0 && c->n != n)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "--servers %s: an empty entry; list host:port pairs separated by commas",
                     list);
    free(copy);
    return rc;
}

/* The number of lanes: opt->streams, else ZT_STATE_STREAMS, else a quarter of the online cores (1 to
 * DEFAULT_STREAMS_MAX). Returns it, or a negative code with a message for a value out of range. */
static int choose_streams(int asked, zt_err *err)
{
    if (asked == 0) {
        const char *env = getenv("ZT_STATE_STREAMS");
        if (env != NULL && env[0] != '\0') {
            char *end;
            long v = strtol(env, &end, 10);
            if (*end != '\0' || v < 1 || v > ZT_STATE_CLIENT_MAX_STREAMS)
                return zt_fail(err, ZT_EINVAL_CONFIG, "ZT_STATE_STREAMS=%s: give a number of streams from 1 to %d",
                               env, ZT_STATE_CLIENT_MAX_STREAMS);
            return (int)v;
        }
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long v = cores / 4;
        return v < 1 ? 1 : v > DEFAULT_STREAMS_MAX ? DEFAULT_STREAMS_MAX : (int)v;
    }
    if (asked < 1 || asked > ZT_STATE_CLIENT_MAX_STREAMS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "state client: %d streams; give 1 to %d (or 0 for the default)", asked,
                       ZT_STATE_CLIENT_MAX_STREAMS);
    return asked;
}

/* Sets glibc's heap thresholds to the values its own dynamic adjustment reaches at most (blocks up to 32
 * MiB from the heap, freed memory at the top of a heap kept up to 64 MiB), unless the environment sets
 * them. With the default adjustment, the 1 MiB message buffers that gRPC and the pushes allocate and free
 * on several threads made the thread heaps shrink and regrow: on the 2-core development VM 10-20% of the
 * pulled bytes landed in freshly faulted (kernel-zeroed) pages with 4 streams, and a pull took 1.6x the
 * CPU time per GiB. */
static void tune_malloc(void)
{
    const char *t = getenv("GLIBC_TUNABLES");
    if ((t != NULL && strstr(t, "glibc.malloc.") != NULL) || getenv("MALLOC_TRIM_THRESHOLD_") != NULL ||
        getenv("MALLOC_MMAP_THRESHOLD_") != NULL)
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

int zt_state_client_create(const struct zt_state_client_options *opt, zt_state_client_t **out, zt_err *err)
{
    *out = NULL;
    int streams = choose_streams(opt->streams, err);
    if (streams < 0)
        return streams;
    zt_state_client_t *c = zt_xcalloc(1, sizeof(*c));
    pthread_mutex_init(&c->pool.mu, NULL);
    pthread_cond_init(&c->pool.work, NULL);
    pthread_cond_init(&c->pool.done, NULL);
    pthread_mutex_init(&c->hook_mu, NULL);
    pthread_mutex_init(&c->init_mu, NULL);
    pthread_mutex_init(&c->xfer_mu, NULL);
    c->max_retries = opt->max_retries > 0 ? opt->max_retries : 8;
    c->backoff_s = opt->backoff_s > 0 ? opt->backoff_s : 0.1;
    c->timeout_s = opt->timeout_s > 0 ? opt->timeout_s : 120.0;
    c->chunk_bytes = opt->chunk_bytes > 0 && opt->chunk_bytes <= (1u << 20) ? opt->chunk_bytes : (1u << 20);
    c->chunk_bytes -= c->chunk_bytes % 4; /* whole elements of every dtype */
    if (c->chunk_bytes == 0)
        c->chunk_bytes = 4;
    int rc;
    if (opt->servers == NULL || opt->servers[0] == '\0') {
        c->n = 1;
        c->streams = 1;
        rc = zt_server_core_create(&c->core, &opt->embedded, err);
    } else {
        c->streams = streams;
        c->shm = opt->shm;
        static pthread_once_t malloc_once = PTHREAD_ONCE_INIT;
        pthread_once(&malloc_once, tune_malloc);
        rc = parse_servers(c, opt->servers, err);
        for (int i = 0; i < c->n; i++) /* destroy destroys them, also after a bad list */
            pthread_mutex_init(&c->srv[i].link_mu, NULL);
        for (int i = 0; rc == 0 && i < c->n; i++) {
            for (int lane = 0; rc == 0 && lane < c->streams; lane++) {
                struct zt_rpc_channel_options co = {
                    .target = c->srv[i].target,
                    .tls_ca_file = opt->tls_ca_file,
                    .tls_cert_file = opt->tls_cert_file,
                    .tls_key_file = opt->tls_key_file,
                    .tls_server_name = opt->tls_server_name,
                    .token = opt->token,
                    .own_connection = lane > 0,
                };
                rc = zt_rpc_channel_create(&co, &c->srv[i].ch[lane], err);
            }
        }
    }
    if (rc != 0) {
        zt_state_client_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void free_seg(zt_state_client_t *c, int server, struct link_seg *seg);
static void detach_id(zt_state_client_t *c, int server, uint64_t id);

void zt_state_client_destroy(zt_state_client_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->pool.mu);
    c->pool.quit = 1;
    pthread_cond_broadcast(&c->pool.work);
    pthread_mutex_unlock(&c->pool.mu);
    for (int i = 0; i < c->pool.nthreads; i++)
        pthread_join(c->pool.th[i], NULL);
    for (int i = 0; c->srv != NULL && i < c->n; i++) {
        if (c->srv[i].cur != NULL) /* no call is in flight any more */
            free_seg(c, i, c->srv[i].cur);
        for (int k = 0; k < c->narenas; k++)
            if (c->srv[i].arena[k] == ARENA_ON)
                detach_id(c, i, c->srv[i].arena_id[k]);
        for (int lane = 0; lane < ZT_STATE_CLIENT_MAX_STREAMS; lane++)
            zt_rpc_channel_destroy(c->srv[i].ch[lane]);
        free(c->srv[i].target);
        pthread_mutex_destroy(&c->srv[i].link_mu);
    }
    free(c->srv);
    for (int i = 0; i < c->nruns; i++) {
        free(c->runs[i].reg);
        for (int k = 0; k < c->runs[i].ninit; k++)
            free(c->runs[i].init[k].data);
        free(c->runs[i].init);
    }
    zt_server_core_destroy(c->core);
    for (int k = 0; k < c->narenas; k++)
        zt_shm_destroy(c->arenas[k].shm);
    pthread_mutex_destroy(&c->pool.mu);
    pthread_cond_destroy(&c->pool.work);
    pthread_cond_destroy(&c->pool.done);
    pthread_mutex_destroy(&c->hook_mu);
    pthread_mutex_destroy(&c->init_mu);
    pthread_mutex_destroy(&c->xfer_mu);
    free(c);
}

/* Host memory the servers on this host read pushes from and write pulls into without a copy; see client.h. */
void *zt_state_client_shared_alloc(zt_state_client_t *c, size_t bytes, enum zt_state_shared what, zt_err *err)
{
    (void)err;
    if (c->core != NULL || c->shm == ZT_STATE_SHM_OFF || bytes == 0)
        return NULL;
    const int w = what == ZT_STATE_SHARED_WEIGHTS ? ZT_STATE_SHARED_WEIGHTS : ZT_STATE_SHARED_GRADIENT;
    if (c->narenas == ZT_STATE_CLIENT_MAX_SHARED) {
        ZT_INFO("state client: %s: the client gives at most %d pieces of shared memory, and has given them",
                shared_words[w].copied, ZT_STATE_CLIENT_MAX_SHARED);
        return NULL;
    }
    const uint64_t round = ((uint64_t)bytes + 4095) / 4096 * 4096;
    if (round > ZT_SHM_MAX_BYTES - ZT_SHM_HEAD_BYTES) {
        char have[32], most[32];
        zt_format_size(bytes, have, sizeof have);
        zt_format_size(ZT_SHM_MAX_BYTES - ZT_SHM_HEAD_BYTES, most, sizeof most);
        ZT_INFO("state client: %s: %s for the %s, more than one segment can hold (%s)", shared_words[w].copied, have,
                shared_words[w].name, most);
        return NULL;
    }
    zt_shm_t *shm = NULL;
    zt_err e = {{0}};
    if (c->shm_fault == ZT__STATE_SHM_FAULT_CREATE || zt_shm_create(1, round, &shm, &e) != 0) {
        ZT_INFO("state client: %s: no segment for the %s: %s", shared_words[w].copied, shared_words[w].name,
                c->shm_fault == ZT__STATE_SHM_FAULT_CREATE ? "a test made it fail" : e.msg);
        return NULL;
    }
    struct arena *a = &c->arenas[c->narenas];
    a->shm = shm;
    a->base = zt_shm_span(shm, ZT_SHM_HEAD_BYTES, round);
    a->bytes = bytes;
    a->what = (enum zt_state_shared)w;
    ZT_ASSERT(a->base != NULL);
    c->narenas++; /* before any push or pull (client.h): no other thread reads the pieces yet */
    return a->base;
}

void zt_state_client_pull_copies(zt_state_client_t *c, uint64_t *bytes, double *seconds)
{
    if (bytes)
        *bytes = c->pull_copy_bytes;
    if (seconds)
        *seconds = (double)c->pull_copy_ns * 1e-9;
}

uint64_t zt__state_client_bytes_in_place(zt_state_client_t *c)
{
    return c->bytes_in_place;
}

uint64_t zt__state_client_bytes_pulled_in_place(zt_state_client_t *c)
{
    return c->bytes_pulled_in_place;
}

/* Counts one copy of pulled bytes that this process made, which started at t0 (zt_now_s). */
static void count_pull_copy(zt_state_client_t *c, uint64_t bytes, double t0)
{
    c->pull_copy_bytes += bytes;
    c->pull_copy_ns += (uint64_t)((zt_now_s() - t0) * 1e9);
}

int zt_state_client_nservers(const zt_state_client_t *c)
{
    return c->n;
}

int zt_state_client_streams(const zt_state_client_t *c)
{
    return c->streams;
}

zt_server_core *zt_state_client_embedded_core(zt_state_client_t *c)
{
    return c->core;
}

/* The step a server reported to the last push, commit or pull that this thread made through client
 * `client` (see zt_state_client_server_step): per thread, since an engine pulls on one thread while it
 * commits on another. */
static _Thread_local struct {
    const zt_state_client_t *client;
    int64_t step;
} told;

static void set_server_step(const zt_state_client_t *c, int64_t step)
{
    told.client = c;
    told.step = step;
}

int64_t zt_state_client_server_step(const zt_state_client_t *c)
{
    return told.client == c ? told.step : -1;
}

void zt__state_client_set_chunk_hook(zt_state_client_t *c, void (*fn)(void *, int64_t, int, int, uint64_t), void *user)
{
    c->hook = fn;
    c->hook_user = user;
}

/* ---- helpers ---- */

/* The wire dtype of a parameter or gradient dtype (F32 for any other). */
static Ztrain__V1__DType dtype_to_wire(enum zt_dtype d)
{
    return d == ZT_DTYPE_F16    ? ZTRAIN__V1__DTYPE__DTYPE_F16
           : d == ZT_DTYPE_BF16 ? ZTRAIN__V1__DTYPE__DTYPE_BF16
                                : ZTRAIN__V1__DTYPE__DTYPE_F32;
}

static const struct run_entry *run_of(zt_state_client_t *c, const char *run, zt_err *err)
{
    for (int i = 0; i < c->nruns; i++)
        if (strcmp(c->runs[i].id, run) == 0)
            return &c->runs[i];
    zt_fail(err, ZT_ESTATE, "run %s was not registered through this client; call zt_state_client_register first",
            run);
    return NULL;
}

static int owner_of(zt_state_client_t *c, const char *run, int block, int shard, zt_err *err)
{
    const struct run_entry *r = run_of(c, run, err);
    if (r == NULL)
        return ZT_ESTATE;
    return zt_server_owner(run, block, shard, r->world_size, c->n);
}

/* Decides whether a call that ended with `code` is tried again; if so, logs and waits the backoff. */
static int should_retry(zt_state_client_t *c, int server, int code, int attempt, const struct zt_rpc_status *st)
{
    if (code == ZT_RPC_ABORTED && attempt == 0) /* an unknown shared-memory segment: offered again at once */
        return 1;
    if (code != ZT_RPC_UNAVAILABLE || attempt >= c->max_retries)
        return 0;
    double wait = c->backoff_s;
    for (int i = 0; i < attempt; i++)
        wait *= 2.0;
    ZT_WARN("state server %s unavailable, retry %d/%d in %.1fs (%s)", c->srv[server].target, attempt + 1,
            c->max_retries, wait, st->msg);
    struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return 1;
}

/* Turns a failed call's status into a negative code with a message naming the server. */
static int rpc_fail(zt_state_client_t *c, int server, const char *what, const struct zt_rpc_status *st, zt_err *err)
{
    int code = st->code == ZT_RPC_NOT_FOUND            ? -ENOENT
               : st->code == ZT_RPC_INVALID_ARGUMENT    ? ZT_EINVAL_CONFIG
               : st->code == ZT_RPC_FAILED_PRECONDITION ? ZT_ESTATE
               : st->code == ZT_RPC_UNAVAILABLE         ? -ECONNREFUSED
               : st->code == ZT_RPC_DEADLINE_EXCEEDED   ? -ETIMEDOUT
                                                        : ZT_EIO;
    return zt_fail(err, code, "state server %s: %s failed: %s: %s", c->srv[server].target, what,
                   zt_rpc_code_name(st->code), st->msg);
}

/* Packs msg into a malloc'd buffer. */
static void *pack(const ProtobufCMessage *msg, size_t *len)
{
    *len = protobuf_c_message_get_packed_size(msg);
    void *buf = zt_xmalloc(*len ? *len : 1);
    protobuf_c_message_pack(msg, buf);
    return buf;
}

/* A unary call with retries on UNAVAILABLE. Returns the final gRPC code; *resp as zt_rpc_unary. */
static int unary(zt_state_client_t *c, int server, const char *method, const ProtobufCMessage *req, void **resp,
                 size_t *resp_len, struct zt_rpc_status *st)
{
    size_t len;
    void *buf = pack(req, &len);
    int code;
    for (int attempt = 0;; attempt++) {
        code = zt_rpc_unary(c->srv[server].ch[0], method, buf, len, c->timeout_s, 0, resp, resp_len, st);
        if (!should_retry(c, server, code, attempt, st))
            break;
    }
    free(buf);
    return code;
}

/* The step a remote server holds for run (Stats), or -1 when it cannot tell. */
static int64_t remote_step(zt_state_client_t *c, int server, const char *run)
{
    Ztrain__V1__StatsRequest req = ZTRAIN__V1__STATS_REQUEST__INIT;
    req.run = (char *)run;
    void *resp = NULL;
    size_t len = 0;
    struct zt_rpc_status st;
    if (unary(c, server, SVC "Stats", &req.base, &resp, &len, &st) != ZT_RPC_OK)
        return st.code == ZT_RPC_NOT_FOUND ? 0 : -1;
    Ztrain__V1__StatsResponse *r = ztrain__v1__stats_response__unpack(NULL, len, resp);
    int64_t step = r != NULL && r->n_runs == 1 ? r->runs[0]->step : -1;
    if (r != NULL)
        ztrain__v1__stats_response__free_unpacked(r, NULL);
    free(resp);
    return step;
}

/* A push or commit of `step` was refused: if the server sits below step - 1 (it restarted from an older
 * snapshot, or lost the run), records its step and returns ZT_ESTATE saying where to resume. */
static int step_refused(zt_state_client_t *c, int server, const char *run, int64_t step, const char *what,
                        const struct zt_rpc_status *st, zt_err *err)
{
    if (st->code != ZT_RPC_FAILED_PRECONDITION && st->code != ZT_RPC_NOT_FOUND)
        return rpc_fail(c, server, what, st, err);
    int64_t at = remote_step(c, server, run);
    if (at < 0 || at >= step - 1)
        return rpc_fail(c, server, what, st, err);
    set_server_step(c, at);
    ZT_WARN("state server %s holds run %s at step %" PRId64 " (restarted from a snapshot?); the run resumes there",
            c->srv[server].target, run, at);
    return zt_fail(err, ZT_ESTATE, "state server %s holds run %s at step %" PRId64 ", not %" PRId64
                   ": resume the run from step %" PRId64 " (pull its parameters and redo the steps after it)",
                   c->srv[server].target, run, at, step - 1, at);
}

/* ---- shared memory ---- */

void zt__state_client_set_shm_fault(zt_state_client_t *c, enum zt__state_shm_fault fault)
{
    c->shm_fault = fault;
}

int zt__state_client_uses_shm(zt_state_client_t *c, int server)
{
    if (c->srv == NULL || server < 0 || server >= c->n)
        return 0;
    pthread_mutex_lock(&c->srv[server].link_mu);
    int on = c->srv[server].link == LINK_SHM;
    pthread_mutex_unlock(&c->srv[server].link_mu);
    return on;
}

const char *zt_state_client_transport(zt_state_client_t *c, char *buf, size_t cap)
{
    if (c->core != NULL) {
        snprintf(buf, cap, "embedded");
        return buf;
    }
    int on = 0;
    for (int i = 0; i < c->n; i++)
        on += zt__state_client_uses_shm(c, i);
    if (on == 0)
        snprintf(buf, cap, "TCP");
    else if (on == c->n)
        snprintf(buf, cap, "shared memory");
    else
        snprintf(buf, cap, "shared memory with %d of %d servers, TCP with the others", on, c->n);
    return buf;
}

/* Tells the server the segment is no longer used (best effort: a server that is gone forgets it anyway, and
 * drops it once this process has exited) and unmaps it. */
static void detach_id(zt_state_client_t *c, int server, uint64_t id)
{
    if (id == 0)
        return;
    Ztrain__V1__DetachShmRequest req = ZTRAIN__V1__DETACH_SHM_REQUEST__INIT;
    req.segment = id;
    size_t len;
    void *buf = pack(&req.base, &len), *resp = NULL;
    size_t rlen = 0;
    struct zt_rpc_status st;
    (void)zt_rpc_unary(c->srv[server].ch[0], SVC "DetachShm", buf, len, 2.0, 0, &resp, &rlen, &st);
    free(resp);
    free(buf);
}

static void free_seg(zt_state_client_t *c, int server, struct link_seg *seg)
{
    detach_id(c, server, seg->id);
    zt_shm_destroy(seg->shm);
    free(seg);
}

/* One AttachShm call offering segment shm to server (one attempt: a server that cannot be reached now is
 * offered a segment again by the next call). Returns the gRPC code with st filled, and *out the unpacked
 * answer (free it with ztrain__v1__attach_shm_response__free_unpacked) or NULL. */
static int attach_call(zt_state_client_t *c, int server, zt_shm_t *shm, Ztrain__V1__AttachShmResponse **out,
                       struct zt_rpc_status *st)
{
    uint8_t nonce[ZT_SHM_NONCE_BYTES];
    memcpy(nonce, zt_shm_nonce(shm), sizeof(nonce));
    if (c->shm_fault == ZT__STATE_SHM_FAULT_NONCE)
        nonce[0] ^= 0xff;
    Ztrain__V1__AttachShmRequest req = ZTRAIN__V1__ATTACH_SHM_REQUEST__INIT;
    req.pid = (int32_t)getpid();
    req.fd = zt_shm_fd(shm);
    req.size = zt_shm_size(shm);
    req.nonce.data = nonce;
    req.nonce.len = sizeof(nonce);
    void *resp = NULL;
    size_t len = 0, reqlen;
    void *reqbuf = pack(&req.base, &reqlen);
    int code = zt_rpc_unary(c->srv[server].ch[0], SVC "AttachShm", reqbuf, reqlen, c->timeout_s, 0, &resp, &len, st);
    free(reqbuf);
    *out = code == ZT_RPC_OK ? ztrain__v1__attach_shm_response__unpack(NULL, len, resp) : NULL;
    free(resp);
    return code;
}

/* Offers server piece k of the client's shared host memory (zt_state_client_shared_alloc) once it has taken a
 * slot segment. Under link_mu. Sets r->arena[k] to ARENA_ON with its id, or to ARENA_OFF with one INFO line
 * saying why (pushes from it and pulls into it then copy through the slots); a server that cannot be reached
 * leaves it untried. */
static void offer_arena(zt_state_client_t *c, int server, int k)
{
    struct remote *r = &c->srv[server];
    const struct arena *ar = &c->arenas[k];
    struct zt_rpc_status st;
    Ztrain__V1__AttachShmResponse *a = NULL;
    int code = attach_call(c, server, ar->shm, &a, &st);
    if (a != NULL && a->attached && a->segment != 0) {
        r->arena[k] = ARENA_ON;
        r->arena_id[k] = a->segment;
        r->arena_pulls[k] = a->pulls_checked;
        if (ar->what == ZT_STATE_SHARED_WEIGHTS && !a->pulls_checked)
            ZT_INFO("state server %s: %s: the server may write a pull into the %s after its call failed (a "
                    "ztrain-server older than this worker)", r->target, shared_words[ar->what].copied,
                    shared_words[ar->what].name);
        else
            ZT_INFO("state server %s: %s this process's %s (%.0f MiB of shared memory), without a copy", r->target,
                    shared_words[ar->what].use, shared_words[ar->what].name, (double)ar->bytes / (1 << 20));
    } else if (code != ZT_RPC_UNAVAILABLE && code != ZT_RPC_DEADLINE_EXCEEDED) {
        r->arena[k] = ARENA_OFF;
        ZT_INFO("state server %s: %s: the segment of the %s was refused: %s", r->target, shared_words[ar->what].copied,
                shared_words[ar->what].name,
                a != NULL ? (a->reason && a->reason[0] ? a->reason : "it did not attach it")
                : code == ZT_RPC_OK ? "its AttachShmResponse is not valid protobuf" : st.msg);
    }
    if (a != NULL)
        ztrain__v1__attach_shm_response__free_unpacked(a, NULL);
}

/* Offers server a new segment (AttachShm). Under link_mu. Sets the link to LINK_SHM with srv->cur, or to
 * LINK_TCP with one INFO line saying why; a server that cannot be reached leaves it LINK_UNTRIED (the call
 * goes over TCP, fails or is retried there, and the next one offers again). */
static void offer_shm(zt_state_client_t *c, int server)
{
    struct remote *r = &c->srv[server];
    const int nslots = 2 * c->streams; /* every lane of a transfer and one more thread's, with room to spare */
    zt_err e = {{0}};
    zt_shm_t *shm = NULL;
    int rc = c->shm_fault == ZT__STATE_SHM_FAULT_CREATE
                 ? zt_fail(&e, -ENOSYS, "the segment could not be created (a test made it fail)")
                 : zt_shm_create(nslots, ZT_STATE_CLIENT_SHM_SLOT_BYTES, &shm, &e);
    if (rc != 0) {
        ZT_INFO("state server %s: pushes and pulls over TCP: no shared-memory segment: %s", r->target, e.msg);
        r->link = LINK_TCP;
        return;
    }
    struct zt_rpc_status st;
    Ztrain__V1__AttachShmResponse *a = NULL;
    int code = attach_call(c, server, shm, &a, &st);
    if (a != NULL && a->attached && a->segment != 0) {
        struct link_seg *seg = zt_xcalloc(1, sizeof(*seg));
        seg->shm = shm;
        seg->id = a->segment;
        r->cur = seg;
        r->link = LINK_SHM;
        ZT_INFO("state server %s: pushes and pulls through shared memory (a segment of %.0f MiB: %d slots of %u "
                "MiB), the calls over gRPC", r->target, (double)zt_shm_size(shm) / (1 << 20), nslots,
                ZT_STATE_CLIENT_SHM_SLOT_BYTES >> 20);
    } else if (code == ZT_RPC_UNAVAILABLE || code == ZT_RPC_DEADLINE_EXCEEDED) {
        zt_shm_destroy(shm); /* not reached now: offered again by the next call */
    } else {
        zt_shm_destroy(shm);
        r->link = LINK_TCP;
        ZT_INFO("state server %s: pushes and pulls over TCP: %s", r->target,
                a != NULL ? (a->reason && a->reason[0] ? a->reason : "it did not attach the shared-memory segment")
                : code == ZT_RPC_UNIMPLEMENTED ? "it does not offer shared memory (a ztrain-server older than this worker)"
                : code == ZT_RPC_OK ? "its AttachShmResponse is not valid protobuf"
                                    : st.msg);
    }
    if (a != NULL)
        ztrain__v1__attach_shm_response__free_unpacked(a, NULL);
}

/* The segment a call to server moves its bytes through, with a reference taken (give it back with
 * shm_release), or NULL for TCP. The first call to a server offers it one. */
static struct link_seg *shm_take(zt_state_client_t *c, int server)
{
    if (c->shm == ZT_STATE_SHM_OFF)
        return NULL;
    struct remote *r = &c->srv[server];
    pthread_mutex_lock(&r->link_mu);
    if (r->link == LINK_UNTRIED)
        offer_shm(c, server);
    struct link_seg *seg = r->link == LINK_SHM ? r->cur : NULL;
    if (seg != NULL)
        seg->refs++;
    pthread_mutex_unlock(&r->link_mu);
    return seg;
}

/* Gives back a segment shm_take returned; failed: the call through it did not succeed, so the server's
 * handler may still be using its slot: the segment is retired, and the next call offers a new one. */
static void shm_release(zt_state_client_t *c, int server, struct link_seg *seg, int failed)
{
    struct remote *r = &c->srv[server];
    pthread_mutex_lock(&r->link_mu);
    if (failed && !seg->spoiled) {
        seg->spoiled = 1;
        if (r->cur == seg) {
            r->cur = NULL;
            r->link = LINK_UNTRIED;
        }
    }
    const int last = --seg->refs == 0 && seg->spoiled;
    pthread_mutex_unlock(&r->link_mu);
    if (last)
        free_seg(c, server, seg);
}

/* ---- a server that lost a run ---- */

static int push_remote_once(zt_state_client_t *c, const char *method, const char *run, int64_t step, int block,
                            int shard, Ztrain__V1__DType dtype, size_t es, const void *data, uint64_t n, int *code,
                            struct zt_rpc_status *st);

static struct run_entry *run_entry_of(zt_state_client_t *c, const char *run)
{
    for (int i = 0; i < c->nruns; i++)
        if (strcmp(c->runs[i].id, run) == 0)
            return &c->runs[i];
    return NULL;
}

/* Keeps a copy of initial parameters pushed for run (replacing one of the same shard). */
static void keep_init(zt_state_client_t *c, const char *run, int block, int shard, const float *data, uint64_t n)
{
    struct run_entry *r = run_entry_of(c, run);
    if (r == NULL)
        return;
    pthread_mutex_lock(&c->init_mu);
    struct init_copy *slot = NULL;
    for (int i = 0; i < r->ninit; i++)
        if (r->init[i].block == block && r->init[i].shard == shard)
            slot = &r->init[i];
    if (slot == NULL) {
        if (r->ninit == r->init_cap) {
            r->init_cap = r->init_cap ? 2 * r->init_cap : 16;
            r->init = realloc(r->init, (size_t)r->init_cap * sizeof(*r->init));
            ZT_ASSERT(r->init != NULL);
        }
        slot = &r->init[r->ninit++];
        slot->data = NULL;
    }
    free(slot->data);
    slot->block = block;
    slot->shard = shard;
    slot->n = n;
    slot->data = zt_xmalloc(n ? n * sizeof(float) : 1);
    memcpy(slot->data, data, n * sizeof(float));
    pthread_mutex_unlock(&c->init_mu);
}

/* Whether copies of run's initial parameters are still kept (the run has taken no step yet). */
static int has_init(zt_state_client_t *c, const struct run_entry *r)
{
    if (r == NULL)
        return 0;
    pthread_mutex_lock(&c->init_mu);
    int n = r->ninit;
    pthread_mutex_unlock(&c->init_mu);
    return n > 0;
}

/* Drops the copies of run's initial parameters: a commit succeeded, so every server had them. */
static void drop_init(zt_state_client_t *c, const char *run)
{
    struct run_entry *r = run_entry_of(c, run);
    if (r == NULL)
        return;
    pthread_mutex_lock(&c->init_mu);
    for (int i = 0; i < r->ninit; i++)
        free(r->init[i].data);
    free(r->init);
    r->init = NULL;
    r->ninit = r->init_cap = 0;
    pthread_mutex_unlock(&c->init_mu);
}

/* A server answered NOT_FOUND (or FAILED_PRECONDITION) for run: it may have restarted before the run had a
 * snapshot and lost it. Registers the run there again (idempotent: a server that has the run answers with
 * its position) and, if its initial parameters are incomplete there, pushes the copies this client kept.
 * Returns 1 when the server now holds the run, with the initial parameters as far as this client can give
 * them (the caller tries its call again), 0 when it could not be given the run. Logs what it does. */
static int recover_run(zt_state_client_t *c, int server, const char *run)
{
    struct run_entry *r = run_entry_of(c, run);
    if (r == NULL || r->reg == NULL)
        return 0;
    void *resp = NULL;
    size_t len = 0;
    struct zt_rpc_status st;
    int code = ZT_RPC_UNAVAILABLE;
    for (int attempt = 0;; attempt++) {
        code = zt_rpc_unary(c->srv[server].ch[0], SVC "RegisterRun", r->reg, r->reg_len, c->timeout_s, 0, &resp,
                            &len, &st);
        if (!should_retry(c, server, code, attempt, &st))
            break;
    }
    if (code != ZT_RPC_OK)
        return 0;
    Ztrain__V1__RegisterRunResponse *rr = ztrain__v1__register_run_response__unpack(NULL, len, resp);
    free(resp);
    int ready = rr != NULL && rr->info != NULL && rr->info->params_ready;
    int64_t at = rr != NULL && rr->info != NULL ? rr->info->step : -1;
    if (rr != NULL)
        ztrain__v1__register_run_response__free_unpacked(rr, NULL);
    if (ready || at != 0 || !has_init(c, r))
        return 1; /* the server holds the run (again): the call can be tried again */
    ZT_WARN("state server %s lost run %s before it was saved (restarted?); registering it again and pushing its "
            "initial parameters again", c->srv[server].target, run);
    int ok = 1;
    pthread_mutex_lock(&c->init_mu);
    for (int i = 0; ok && i < r->ninit; i++) {
        const struct init_copy *k = &r->init[i];
        if (zt_server_owner(run, k->block, k->shard, r->world_size, c->n) != server)
            continue;
        int pc;
        if (push_remote_once(c, SVC "PushParams", run, 0, k->block, k->shard, ZTRAIN__V1__DTYPE__DTYPE_F32, 4, k->data,
                             k->n, &pc, &st) != 0)
            ok = 0;
    }
    pthread_mutex_unlock(&c->init_mu);
    return ok;
}

/* ---- register ---- */

/* The client's entry for run, or a free one (NULL when ZT_STATE_CLIENT_MAX_RUNS runs are already held). */
static struct run_entry *run_slot(zt_state_client_t *c, const char *run)
{
    for (int i = 0; i < c->nruns; i++)
        if (strcmp(c->runs[i].id, run) == 0)
            return &c->runs[i];
    return c->nruns < ZT_STATE_CLIENT_MAX_RUNS ? &c->runs[c->nruns] : NULL;
}

/* RegisterRun on every server; *step = the lowest step any of them holds, *packed (malloc'd) and *packed_len
 * the request's bytes, which the caller keeps. */
static int register_remote(zt_state_client_t *c, const zt_server_run_desc *desc, int64_t *step, uint8_t **packed,
                           size_t *packed_len, zt_err *err)
{
    Ztrain__V1__RegisterRunRequest req = ZTRAIN__V1__REGISTER_RUN_REQUEST__INIT;
    req.run = (char *)desc->run_id;
    req.world_size = desc->world_size;
    req.beta1 = desc->beta1;
    req.beta2 = desc->beta2;
    req.eps = desc->eps;
    req.weight_decay = desc->weight_decay;
    req.param_dtype = dtype_to_wire(desc->param_dtype);
    int nranges = 0;
    for (int b = 0; b < desc->nblocks; b++)
        nranges += desc->blocks[b].ndecay;
    Ztrain__V1__BlockLayout *blocks = zt_xcalloc((size_t)desc->nblocks, sizeof(*blocks));
    Ztrain__V1__BlockLayout **bptr = zt_xcalloc((size_t)desc->nblocks, sizeof(*bptr));
    Ztrain__V1__Range *ranges = zt_xcalloc((size_t)(nranges ? nranges : 1), sizeof(*ranges));
    Ztrain__V1__Range **rptr = zt_xcalloc((size_t)(nranges ? nranges : 1), sizeof(*rptr));
    int at = 0;
    for (int b = 0; b < desc->nblocks; b++) {
        ztrain__v1__block_layout__init(&blocks[b]);
        blocks[b].numel = desc->blocks[b].numel;
        blocks[b].n_decay = (size_t)desc->blocks[b].ndecay;
        blocks[b].decay = &rptr[at];
        for (int r = 0; r < desc->blocks[b].ndecay; r++, at++) {
            ztrain__v1__range__init(&ranges[at]);
            ranges[at].begin = desc->blocks[b].decay[r].begin;
            ranges[at].end = desc->blocks[b].decay[r].end;
            rptr[at] = &ranges[at];
        }
        bptr[b] = &blocks[b];
    }
    req.n_blocks = (size_t)desc->nblocks;
    req.blocks = bptr;
    int rc = 0;
    int64_t lowest = INT64_MAX;
    for (int i = 0; rc == 0 && i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        if (unary(c, i, SVC "RegisterRun", &req.base, &resp, &len, &st) != ZT_RPC_OK) {
            rc = rpc_fail(c, i, "RegisterRun", &st, err);
            if (st.code == ZT_RPC_FAILED_PRECONDITION) /* another layout under this run id, as embedded */
                rc = ZT_EMISMATCH;
            break;
        }
        Ztrain__V1__RegisterRunResponse *r = ztrain__v1__register_run_response__unpack(NULL, len, resp);
        if (r == NULL || r->info == NULL)
            rc = zt_fail(err, ZT_EFORMAT, "state server %s: the RegisterRunResponse is not valid protobuf",
                         c->srv[i].target);
        else if (r->info->step < lowest)
            lowest = r->info->step;
        if (r != NULL)
            ztrain__v1__register_run_response__free_unpacked(r, NULL);
        free(resp);
    }
    if (rc == 0)
        *packed = pack(&req.base, packed_len);
    free(rptr);
    free(ranges);
    free(bptr);
    free(blocks);
    if (rc == 0 && step != NULL)
        *step = lowest;
    return rc;
}

/* Registers on the servers first; the run is recorded here only once every server has accepted it, so
 * a refused registration leaves the client as it was. */
int zt_state_client_register(zt_state_client_t *c, const zt_server_run_desc *desc, int64_t *step, zt_err *err)
{
    struct run_entry *slot = run_slot(c, desc->run_id);
    if (slot == NULL)
        return zt_fail(err, ZT_ENOMEM, "a state client serves at most %d runs; use another client for run %s",
                       ZT_STATE_CLIENT_MAX_RUNS, desc->run_id);
    int rc;
    uint8_t *packed = NULL;
    size_t packed_len = 0;
    if (c->core != NULL) {
        zt_server_run_info info;
        rc = zt_server_core_register(c->core, desc, &info, err);
        if (rc == 0 && step != NULL)
            *step = info.step;
    } else {
        rc = register_remote(c, desc, step, &packed, &packed_len, err);
    }
    if (rc < 0)
        return rc;
    /* every server accepted the run: from now on the client routes its shards */
    if (slot == &c->runs[c->nruns]) {
        memset(slot, 0, sizeof(*slot));
        c->nruns++;
    }
    free(slot->reg);
    slot->reg = packed;
    slot->reg_len = packed_len;
    snprintf(slot->id, sizeof(slot->id), "%s", desc->run_id);
    slot->world_size = desc->world_size;
    slot->param_dtype = desc->param_dtype;
    return 0;
}

/* ---- pushes ---- */

/* Largest encoded PushMessage before a chunk's data: the chunk field's tag and length, the offset's tag
 * and value, the data field's tag and length. */
#define PUSH_CHUNK_HEAD_MAX (1 + ZT_WIRE_VARINT_MAX + 1 + ZT_WIRE_VARINT_MAX + 1 + ZT_WIRE_VARINT_MAX)

/* Writes the bytes of a PushMessage holding a PushChunk that precede the chunk's data (PushMessage.chunk
 * = 2; PushChunk.offset = 1, PushChunk.data = 2), as protobuf-c would pack them (proto3: a zero offset
 * and empty data are left out), so that the data can be placed right after. Returns the header's length. */
static size_t put_push_chunk_head(uint8_t *p, uint64_t offset, size_t len)
{
    uint8_t inner[1 + ZT_WIRE_VARINT_MAX + 1 + ZT_WIRE_VARINT_MAX];
    size_t n = 0;
    if (offset != 0) {
        n += zt_wire_put_key(inner + n, 1, ZT_WIRE_VARINT);
        n += zt_wire_put_varint(inner + n, offset);
    }
    if (len != 0) {
        n += zt_wire_put_key(inner + n, 2, ZT_WIRE_LEN);
        n += zt_wire_put_varint(inner + n, len);
    }
    size_t h = 0;
    h += zt_wire_put_key(p + h, 2, ZT_WIRE_LEN);
    h += zt_wire_put_varint(p + h, n + len);
    memcpy(p + h, inner, n);
    return h + n;
}

/* Runs the chunk hook, one call at a time (pieces send from several threads). */
static void call_hook(zt_state_client_t *c, int64_t step, int block, int shard, uint64_t bytes_sent)
{
    pthread_mutex_lock(&c->hook_mu);
    if (c->hook != NULL)
        c->hook(c->hook_user, step, block, shard, bytes_sent);
    pthread_mutex_unlock(&c->hook_mu);
}

/* The chunks of one push attempt that gRPC still references (zt_rpc_stream_send_borrowed). */
struct borrowed {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left;
};

static void give_back(void *user)
{
    struct borrowed *b = user;
    pthread_mutex_lock(&b->mu);
    if (--b->left == 0)
        pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* The packed PushMessage header of total_bytes of p's shard from element offset (in shared-memory segment
 * seg at seg_off, or in the chunks that follow when seg is 0); free it with free(). */
static void *pack_push_header(const struct piece *p, uint64_t total_bytes, uint64_t offset, uint64_t seg,
                              uint64_t seg_off, size_t *len)
{
    Ztrain__V1__PushHeader h = ZTRAIN__V1__PUSH_HEADER__INIT;
    h.run = (char *)p->run;
    h.step = p->step;
    h.block = p->block;
    h.shard = p->shard;
    h.dtype = p->dtype;
    h.total_bytes = total_bytes;
    h.offset = offset;
    h.shm_segment = seg;
    h.shm_offset = seg_off;
    Ztrain__V1__PushMessage m = ZTRAIN__V1__PUSH_MESSAGE__INIT;
    m.msg_case = ZTRAIN__V1__PUSH_MESSAGE__MSG_HEADER;
    m.header = &h;
    return pack(&m.base, len);
}

/* One attempt at a push of one piece through shared memory: slot by slot, the bytes copied into a slot of seg
 * and a PushMessage header naming it (the server stores them from there). A slot whose call failed is not
 * given back (the server may still read it; the caller retires seg). Returns the gRPC code with st filled. */
static int push_shm(zt_state_client_t *c, const struct piece *p, struct link_seg *seg, struct zt_rpc_status *st)
{
    const uint64_t bytes = p->n * p->es, base = p->first * p->es;
    const uint64_t per = zt_shm_slot_bytes(seg->shm) / p->es * p->es;
    int code = ZT_RPC_OK;
    for (uint64_t at = 0; at < bytes && code == ZT_RPC_OK; at += per) {
        const uint64_t n = bytes - at < per ? bytes - at : per;
        const int slot = zt_shm_slot_get(seg->shm);
        const uint64_t off = zt_shm_slot_offset(seg->shm, slot);
        memcpy(zt_shm_span(seg->shm, off, n), p->src + at, n);
        size_t len;
        void *buf = pack_push_header(p, n, p->first + at / p->es, seg->id, off, &len), *resp = NULL;
        size_t rlen = 0;
        code = zt_rpc_unary(c->srv[p->server].ch[p->lane], p->method, buf, len, c->timeout_s, 0, &resp, &rlen, st);
        free(buf);
        free(resp);
        if (code != ZT_RPC_OK)
            break;
        zt_shm_slot_put(seg->shm, slot);
        if (c->hook != NULL)
            call_hook(c, p->step, p->block, p->shard, base + at + n);
    }
    return code;
}

/* The piece of the client's shared host memory that holds all of [p, p + bytes), or -1. */
static int arena_of(const zt_state_client_t *c, const uint8_t *p, uint64_t bytes)
{
    for (int k = 0; k < c->narenas; k++) {
        const struct arena *a = &c->arenas[k];
        if (p >= a->base && bytes <= a->bytes && (uint64_t)(p - a->base) <= a->bytes - bytes)
            return k;
    }
    return -1;
}

/* The id under which server reads [p, p + bytes) from, or (pull) writes it into, the client's shared host
 * memory (piece *k), or 0 when those bytes do not lie there or the server does not take that piece, or would
 * not check a pull into it (then they go through a slot or over TCP). The first such call to a server that
 * took a slot segment offers it the piece. */
static uint64_t arena_take(zt_state_client_t *c, int server, const uint8_t *p, uint64_t bytes, int pull, int *k)
{
    *k = bytes > 0 ? arena_of(c, p, bytes) : -1;
    if (*k < 0)
        return 0;
    struct link_seg *seg = shm_take(c, server); /* the slot segment first: the same negotiation and fallback */
    if (seg == NULL)
        return 0;
    shm_release(c, server, seg, 0);
    struct remote *r = &c->srv[server];
    pthread_mutex_lock(&r->link_mu);
    if (r->link == LINK_SHM && r->arena[*k] == ARENA_UNTRIED)
        offer_arena(c, server, *k);
    const uint64_t id = r->link == LINK_SHM && r->arena[*k] == ARENA_ON && (!pull || r->arena_pulls[*k])
                            ? r->arena_id[*k] : 0;
    pthread_mutex_unlock(&r->link_mu);
    return id;
}

/* Whether [p, p + bytes) lies in a piece (*k) of the client's shared host memory that holds the caller's weights
 * and that server writes pulls into (offering it the piece when it has not been yet). */
static int weights_arena(zt_state_client_t *c, int server, const void *p, uint64_t bytes, int *k)
{
    const int in = bytes > 0 ? arena_of(c, p, bytes) : -1;
    return in >= 0 && c->arenas[in].what == ZT_STATE_SHARED_WEIGHTS && arena_take(c, server, p, bytes, 1, k) != 0;
}

/* After a failed push or pull through piece k of the shared host memory under `id`: the server may have
 * restarted (it knows no segment) or the call broke; the next call offers the memory again under a new id, and
 * the old one is given up at once. A server handler still reading the old one for a push reads bytes that do
 * not change until the step is committed (the engine writes the next gradient only after the commit, which
 * waits for every push in progress); one still serving a pull sees the segment given up before it writes, or
 * writes the bytes of the same step and block that the caller pulls again. */
static void arena_failed(zt_state_client_t *c, int server, int k, uint64_t id)
{
    struct remote *r = &c->srv[server];
    int detach = 0;
    pthread_mutex_lock(&r->link_mu);
    if (r->arena[k] == ARENA_ON && r->arena_id[k] == id) {
        r->arena[k] = ARENA_UNTRIED;
        r->arena_id[k] = 0;
        detach = 1;
    }
    pthread_mutex_unlock(&r->link_mu);
    if (detach)
        detach_id(c, server, id);
}

/* One attempt at a push of one piece read by the server from piece k of the client's shared host memory
 * (segment `id`): no copy, a PushMessage header per slot's worth of bytes (as through the slots, so the chunk
 * hook is called as often). Returns the gRPC code with st filled. */
static int push_arena(zt_state_client_t *c, const struct piece *p, int k, uint64_t id, struct zt_rpc_status *st)
{
    const uint64_t bytes = p->n * p->es, base = p->first * p->es;
    const uint64_t per = ZT_STATE_CLIENT_SHM_SLOT_BYTES / p->es * p->es;
    const uint64_t at0 = ZT_SHM_HEAD_BYTES + (uint64_t)(p->src - c->arenas[k].base);
    int code = ZT_RPC_OK;
    for (uint64_t at = 0; at < bytes && code == ZT_RPC_OK; at += per) {
        const uint64_t n = bytes - at < per ? bytes - at : per;
        size_t len;
        void *buf = pack_push_header(p, n, p->first + at / p->es, id, at0 + at, &len), *resp = NULL;
        size_t rlen = 0;
        code = zt_rpc_unary(c->srv[p->server].ch[p->lane], p->method, buf, len, c->timeout_s, 0, &resp, &rlen, st);
        free(buf);
        free(resp);
        if (code != ZT_RPC_OK)
            break;
        c->bytes_in_place += n;
        if (c->hook != NULL)
            call_hook(c, p->step, p->block, p->shard, base + at + n);
    }
    return code;
}

/* One attempt at a push stream of one piece (the elements [p->first, p->first + p->n) of the shard):
 * read by the server where it lies when it is in the client's shared host memory, else through the server's
 * shared-memory segment when it has one, else over TCP. Returns the gRPC code with st filled. */
static int push_once(zt_state_client_t *c, const struct piece *p, struct zt_rpc_status *st)
{
    int k;
    const uint64_t arena_id = arena_take(c, p->server, p->src, p->n * p->es, 0, &k);
    if (arena_id != 0) {
        int code = push_arena(c, p, k, arena_id, st);
        if (code != ZT_RPC_OK)
            arena_failed(c, p->server, k, arena_id);
        return code;
    }
    struct link_seg *seg = p->n > 0 ? shm_take(c, p->server) : NULL;
    if (seg != NULL) {
        int code = push_shm(c, p, seg, st);
        shm_release(c, p->server, seg, code != ZT_RPC_OK);
        return code;
    }
    zt_rpc_stream_t *s = NULL;
    zt_err e = {{0}};
    if (zt_rpc_stream_start(c->srv[p->server].ch[p->lane], p->method, c->timeout_s, 0, &s, &e) != 0) {
        st->code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "%s", e.msg);
        return st->code;
    }
    uint64_t bytes = p->n * p->es, base = p->first * p->es;
    size_t len;
    void *buf = pack_push_header(p, bytes, p->first, 0, 0, &len);
    int ok = zt_rpc_stream_send(s, buf, len) == 0;
    free(buf);
    /* The chunks' data is sent from where it lies (no protobuf-c pack, no copy): gRPC references the
     * caller's array behind each chunk's small header until it lets go, which the push waits for. */
    struct borrowed lent = {.left = 0};
    pthread_mutex_init(&lent.mu, NULL);
    pthread_cond_init(&lent.cv, NULL);
    for (uint64_t at = 0; ok && at < bytes; at += c->chunk_bytes) {
        size_t n = (size_t)(bytes - at < c->chunk_bytes ? bytes - at : c->chunk_bytes);
        uint8_t head[PUSH_CHUNK_HEAD_MAX];
        size_t hlen = put_push_chunk_head(head, at, n);
        pthread_mutex_lock(&lent.mu);
        lent.left++;
        pthread_mutex_unlock(&lent.mu);
        ok = zt_rpc_stream_send_borrowed(s, head, hlen, p->src + at, n, give_back, &lent) == 0;
        if (ok && c->hook != NULL)
            call_hook(c, p->step, p->block, p->shard, base + at + n);
    }
    if (ok)
        zt_rpc_stream_close_send(s);
    const void *r;
    size_t rlen;
    int got = zt_rpc_stream_recv(s, &r, &rlen);
    int code = zt_rpc_stream_finish(s, st);
    pthread_mutex_lock(&lent.mu); /* the caller's array is its own again only when gRPC has let go */
    while (lent.left > 0)
        pthread_cond_wait(&lent.cv, &lent.mu);
    pthread_mutex_unlock(&lent.mu);
    pthread_mutex_destroy(&lent.mu);
    pthread_cond_destroy(&lent.cv);
    if (code == ZT_RPC_OK && got != 1) {
        st->code = code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "the server ended the push without a PushResponse");
    }
    return code;
}

static int pull_once(zt_state_client_t *c, const struct piece *p, struct zt_rpc_status *st);

/* Moves one piece with retries on UNAVAILABLE (a retried push sends the whole piece again: the server
 * overwrites what an interrupted attempt left) and stores the outcome in p->code and p->st. */
static void run_piece(zt_state_client_t *c, struct piece *p)
{
    for (int attempt = 0;; attempt++) {
        p->code = p->pull ? pull_once(c, p, &p->st) : push_once(c, p, &p->st);
        if (!should_retry(c, p->server, p->code, attempt, &p->st))
            break;
    }
}

/* The loop of the pool thread of one lane: waits for a piece, moves it, reports, until the client ends. */
static void *lane_main(void *arg)
{
    struct lane_arg *a = arg;
    struct lane_pool *pool = &a->c->pool;
    char name[16];
    snprintf(name, sizeof(name), "zt-state-lane%d", a->lane);
    pthread_setname_np(pthread_self(), name); /* shown by top -H and the state bench's thread report */
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->quit && pool->job[a->lane] == NULL)
            pthread_cond_wait(&pool->work, &pool->mu);
        if (pool->quit)
            break;
        struct piece *p = pool->job[a->lane];
        pthread_mutex_unlock(&pool->mu);
        run_piece(a->c, p);
        pthread_mutex_lock(&pool->mu);
        pool->job[a->lane] = NULL;
        if (--pool->busy == 0)
            pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/* Starts the pool threads of lanes 1..streams-1 once. A thread that cannot start leaves its lane to the
 * calling thread (run_pieces runs such pieces itself, one after the other). */
static void start_pool(zt_state_client_t *c)
{
    if (c->pool.tried)
        return;
    c->pool.tried = 1;
    for (int lane = 1; lane < c->streams; lane++) {
        c->pool.arg[c->pool.nthreads] = (struct lane_arg){.c = c, .lane = lane};
        if (pthread_create(&c->pool.th[c->pool.nthreads], NULL, lane_main, &c->pool.arg[c->pool.nthreads]) != 0) {
            ZT_WARN("state client: cannot start a thread for stream %d of %d; the calling thread sends its pieces",
                    lane + 1, c->streams);
            break;
        }
        c->pool.nthreads++;
    }
}

/* Moves pieces[0..k) at the same time: piece i on lane i, piece 0 on the calling thread. Returns when all
 * are done. */
static void run_pieces(zt_state_client_t *c, struct piece *pieces, int k)
{
    if (k == 1) { /* the calling thread alone, on lane 0's channel (channels serve any thread) */
        run_piece(c, &pieces[0]);
        return;
    }
    pthread_mutex_lock(&c->xfer_mu);
    start_pool(c);
    int posted = k - 1 < c->pool.nthreads ? k - 1 : c->pool.nthreads; /* lanes 1..posted have threads */
    if (posted > 0) {
        pthread_mutex_lock(&c->pool.mu);
        for (int i = 1; i <= posted; i++)
            c->pool.job[i] = &pieces[i];
        c->pool.busy = posted;
        pthread_cond_broadcast(&c->pool.work);
        pthread_mutex_unlock(&c->pool.mu);
    }
    run_piece(c, &pieces[0]);
    for (int i = posted + 1; i < k; i++)
        run_piece(c, &pieces[i]);
    if (posted > 0) {
        pthread_mutex_lock(&c->pool.mu);
        while (c->pool.busy > 0)
            pthread_cond_wait(&c->pool.done, &c->pool.mu);
        pthread_mutex_unlock(&c->pool.mu);
    }
    pthread_mutex_unlock(&c->xfer_mu);
}

/* Splits n elements into at most c->streams contiguous pieces of whole granules (the last piece may end
 * short), each at least PIECE_MIN_CHUNKS granules: each piece is a copy of *tmpl with .lane, .first and .n
 * set. A granule is one chunk (granule elements), so a piece's chunks are the chunks one stream would
 * send. Returns the number of pieces (1 for a shard too small to split, also for n = 0). */
static int split_pieces(const zt_state_client_t *c, uint64_t n, uint64_t granule, const struct piece *tmpl,
                        struct piece *pieces)
{
    uint64_t k = (uint64_t)c->streams;
    if (n / (PIECE_MIN_CHUNKS * granule) < k)
        k = n / (PIECE_MIN_CHUNKS * granule);
    uint64_t per = n;
    if (k > 1) {
        per = (n + k - 1) / k;
        per = (per + granule - 1) / granule * granule;
        k = (n + per - 1) / per;
    } else {
        k = 1;
    }
    for (uint64_t i = 0; i < k; i++) {
        pieces[i] = *tmpl;
        pieces[i].lane = (int)i;
        pieces[i].first = i * per;
        pieces[i].n = i + 1 < k ? per : n - i * per;
    }
    return (int)k;
}

/* The index of the first piece that failed, or -1 when all succeeded. */
static int first_failed(const struct piece *pieces, int k)
{
    for (int i = 0; i < k; i++)
        if (pieces[i].code != ZT_RPC_OK)
            return i;
    return -1;
}

/* One push of a whole shard to its owner (split over the lanes, each piece retried on UNAVAILABLE).
 * Returns 0, or -1 with the failed piece's gRPC code in *code and status in *st. */
static int push_remote_once(zt_state_client_t *c, const char *method, const char *run, int64_t step, int block,
                            int shard, Ztrain__V1__DType dtype, size_t es, const void *data, uint64_t n, int *code,
                            struct zt_rpc_status *st)
{
    const struct run_entry *r = run_entry_of(c, run);
    int server = zt_server_owner(run, block, shard, r->world_size, c->n);
    const struct piece tmpl = {.server = server, .method = method, .run = run, .step = step, .block = block,
                               .shard = shard, .dtype = dtype, .es = es};
    struct piece pieces[ZT_STATE_CLIENT_MAX_STREAMS];
    int k = split_pieces(c, n, c->chunk_bytes / es, &tmpl, pieces);
    for (int i = 0; i < k; i++)
        pieces[i].src = (const uint8_t *)data + pieces[i].first * es;
    run_pieces(c, pieces, k);
    int bad = first_failed(pieces, k);
    if (bad < 0)
        return 0;
    *code = pieces[bad].code;
    *st = pieces[bad].st;
    return -1;
}

static int push_remote(zt_state_client_t *c, const char *method, const char *run, int64_t step, int block, int shard,
                       Ztrain__V1__DType dtype, size_t es, const void *data, uint64_t n, zt_err *err)
{
    int server = owner_of(c, run, block, shard, err);
    if (server < 0)
        return server;
    set_server_step(c, -1);
    int code = ZT_RPC_OK;
    struct zt_rpc_status st;
    if (push_remote_once(c, method, run, step, block, shard, dtype, es, data, n, &code, &st) == 0)
        return 0;
    /* A server that lost the run: give it the run again, then try once more. */
    if (code == ZT_RPC_NOT_FOUND && recover_run(c, server, run) &&
        push_remote_once(c, method, run, step, block, shard, dtype, es, data, n, &code, &st) == 0)
        return 0;
    return step > 0 ? step_refused(c, server, run, step, method + strlen(SVC), &st, err)
                    : rpc_fail(c, server, method + strlen(SVC), &st, err);
}

int zt_state_client_push_params(zt_state_client_t *c, const char *run, int block, int shard, const float *data,
                                uint64_t n, zt_err *err)
{
    if (c->core != NULL) {
        zt_server_chunk ch = {.block = block, .shard = shard, .offset = 0, .n = n, .dtype = ZT_DTYPE_F32, .data = data};
        return zt_server_core_push_params(c->core, run, &ch, err);
    }
    int rc = push_remote(c, SVC "PushParams", run, 0, block, shard, ZTRAIN__V1__DTYPE__DTYPE_F32, 4, data, n, err);
    if (rc == 0)
        keep_init(c, run, block, shard, data, n);
    return rc;
}

int zt_state_client_push_grad(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                              enum zt_dtype dtype, const void *data, uint64_t n, zt_err *err)
{
    if (c->core != NULL) {
        zt_server_chunk ch = {.block = block, .shard = shard, .offset = 0, .n = n, .dtype = dtype, .data = data};
        return zt_server_core_push_grad(c->core, run, step, &ch, err);
    }
    /* Before the run's first step is taken, a server may have restarted without the initial parameters
     * this client pushed (it had no snapshot of the run yet): make sure it has them. */
    const struct run_entry *r = run_entry_of(c, run);
    if (has_init(c, r)) {
        int server = owner_of(c, run, block, shard, err);
        if (server < 0)
            return server;
        recover_run(c, server, run);
    }
    return push_remote(c, SVC "PushGradients", run, step, block, shard, dtype_to_wire(dtype), zt_dtype_size(dtype),
                       data, n, err);
}

/* ---- commit ---- */

/* One server's CommitStep, on a thread of its own when there are several servers. */
struct commit_call {
    zt_state_client_t *c;
    int server;
    const ProtobufCMessage *req;
    int code;
    struct zt_rpc_status st;
    double seconds;  /* the server's own update time from its answer (0 from a server too old to say) */
};

static void *commit_main(void *arg)
{
    struct commit_call *k = arg;
    void *resp = NULL;
    size_t len = 0;
    k->code = unary(k->c, k->server, SVC "CommitStep", k->req, &resp, &len, &k->st);
    if (k->code == ZT_RPC_OK) {
        Ztrain__V1__CommitStepResponse *r = ztrain__v1__commit_step_response__unpack(NULL, len, resp);
        if (r != NULL) {
            k->seconds = r->seconds;
            ztrain__v1__commit_step_response__free_unpacked(r, NULL);
        }
    }
    free(resp);
    return NULL;
}

int zt_state_client_commit(zt_state_client_t *c, const char *run, const zt_server_commit_args *args, zt_err *err)
{
    return zt_state_client_commit_timed(c, run, args, NULL, err);
}

/* Commits on every server and reports the longest server update; see client.h. */
int zt_state_client_commit_timed(zt_state_client_t *c, const char *run, const zt_server_commit_args *args,
                                 double *server_s, zt_err *err)
{
    set_server_step(c, -1);
    if (server_s)
        *server_s = 0.0;
    if (c->core != NULL) {
        zt_server_commit_result res = {0};
        int rc = zt_server_core_commit(c->core, run, args, &res, err);
        if (rc == 0 && server_s)
            *server_s = res.seconds;
        return rc;
    }
    Ztrain__V1__CommitStepRequest req = ZTRAIN__V1__COMMIT_STEP_REQUEST__INIT;
    req.run = (char *)run;
    req.step = args->step;
    req.grad_norm = args->grad_norm;
    req.clip_coef = args->clip_coef;
    req.lr = args->lr;
    req.overflow = args->overflow;
    /* every server applies its part of the update at the same time: one thread per server beyond the first
     * (the calling thread commits on server 0; a thread that cannot start leaves its server to it) */
    struct commit_call *calls = zt_xcalloc((size_t)c->n, sizeof(*calls));
    pthread_t *th = zt_xcalloc((size_t)c->n, sizeof(*th));
    bool *started = zt_xcalloc((size_t)c->n, sizeof(*started));
    for (int i = 0; i < c->n; i++) {
        calls[i] = (struct commit_call){.c = c, .server = i, .req = &req.base};
        started[i] = i > 0 && pthread_create(&th[i], NULL, commit_main, &calls[i]) == 0;
    }
    for (int i = 0; i < c->n; i++)
        if (!started[i])
            commit_main(&calls[i]);
    for (int i = 1; i < c->n; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    int rc = 0;
    for (int i = 0; i < c->n && rc == 0; i++) {
        const struct zt_rpc_status *st = &calls[i].st;
        if (calls[i].code == ZT_RPC_OK) {
            if (server_s && calls[i].seconds > *server_s)
                *server_s = calls[i].seconds;
            continue;
        }
        /* A server that lost the run before its first snapshot gets it again; the gradients it lost are then
         * pushed again by the caller, which retries a step the servers did not take. */
        if (st->code == ZT_RPC_NOT_FOUND || st->code == ZT_RPC_FAILED_PRECONDITION)
            recover_run(c, i, run);
        rc = step_refused(c, i, run, args->step, "CommitStep", st, err);
    }
    free(calls);
    free(th);
    free(started);
    if (rc == 0)
        drop_init(c, run); /* every server took a step, so every server had the initial parameters */
    return rc;
}

/* ---- pull ---- */

/* A ParamChunk parsed by hand (state.proto: block = 1, shard = 2, offset = 3, dtype = 4, data = 5; unknown
 * fields are skipped, fields may come in any order). */
struct param_view {
    int32_t block;
    int32_t shard;
    uint64_t offset;
    int dtype;          /* Ztrain__V1__DType */
    struct zt_wire_cursor data; /* at the first data byte; data.left = its length (0 when absent) */
};

/* A ParamChunk arrives in pieces (zt_rpc_stream_recv_parts) and is parsed where it lies, so that its data
 * (up to 1 MiB) is copied once, straight into the caller's array. Returns 0 with *v filled, or -1 when the
 * bytes are not a valid ParamChunk. */
static int parse_param_chunk(const struct zt_rpc_part *parts, size_t nparts, size_t len, struct param_view *v)
{
    memset(v, 0, sizeof(*v));
    struct zt_wire_cursor c;
    if (zt_wire_cursor_init(&c, parts, nparts, len) != 0)
        return -1;
    v->data = c;
    v->data.left = 0;
    while (c.left > 0) {
        uint32_t field;
        enum zt_wire_type wt;
        uint64_t x;
        if (zt_wire_read_key(&c, &field, &wt) != 0)
            return -1;
        if (field >= 1 && field <= 4 && wt == ZT_WIRE_VARINT) {
            if (zt_wire_read_varint(&c, &x) != 0)
                return -1;
            if (field == 1)
                v->block = (int32_t)(uint32_t)x; /* int32: protobuf keeps the low 32 bits */
            else if (field == 2)
                v->shard = (int32_t)(uint32_t)x;
            else if (field == 3)
                v->offset = x;
            else
                v->dtype = (int)(int32_t)(uint32_t)x;
        } else if (field == 5 && wt == ZT_WIRE_LEN) {
            if (zt_wire_read_sub(&c, &v->data) != 0)
                return -1;
        } else if (field <= 5) {
            return -1; /* a known field with the wrong wire type */
        } else if (zt_wire_skip_value(&c, wt) != 0) {
            return -1;
        }
    }
    return 0;
}

/* Starts a PullParams stream of elements [offset, offset + n) of p's shard and sends its one request (into
 * shared-memory segment seg at seg_off, or over the stream when seg is 0). Returns 1 when the request went
 * out, 0 when sending failed (the stream must still be finished), -1 with st filled when no stream
 * started. */
static int pull_start(zt_state_client_t *c, const struct piece *p, uint64_t offset, uint64_t n, uint64_t seg,
                      uint64_t seg_off, zt_rpc_stream_t **s, struct zt_rpc_status *st)
{
    zt_err e = {{0}};
    if (zt_rpc_stream_start(c->srv[p->server].ch[p->lane], SVC "PullParams", c->timeout_s, 0, s, &e) != 0) {
        st->code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "%s", e.msg);
        return -1;
    }
    Ztrain__V1__PullRange range = ZTRAIN__V1__PULL_RANGE__INIT;
    range.block = p->block;
    range.shard = p->shard;
    range.offset = offset;
    range.count = n;
    Ztrain__V1__PullRange *rp = &range;
    Ztrain__V1__PullParamsRequest req = ZTRAIN__V1__PULL_PARAMS_REQUEST__INIT;
    req.run = (char *)p->run;
    req.step = p->step;
    req.n_ranges = 1;
    req.ranges = &rp;
    req.masters = p->masters != 0;
    req.shm_segment = seg;
    req.shm_offset = seg_off;
    req.standing = p->standing && seg != 0;
    size_t len;
    void *buf = pack(&req.base, &len);
    const int ok = zt_rpc_stream_send(*s, buf, len) == 0 && zt_rpc_stream_close_send(*s) == 0;
    free(buf);
    return ok;
}

/* The rest of a PullParams stream through shared memory (its request sent when ok): no ParamChunk may come,
 * the server wrote the elements into the segment. Returns the gRPC code with st filled. */
static int pull_shm_finish(zt_rpc_stream_t *s, int ok, struct zt_rpc_status *st)
{
    const void *msg;
    size_t mlen;
    int chunks = 0;
    while (ok && zt_rpc_stream_recv(s, &msg, &mlen) == 1)
        chunks++;
    int code = zt_rpc_stream_finish(s, st);
    if (code == ZT_RPC_OK && chunks > 0) {
        st->code = code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "a ParamChunk in a pull through shared memory (the server did not "
                 "write the segment)");
    }
    return code;
}

/* One attempt at a pull of one piece through shared memory: slot by slot, a PullParams naming a slot of seg
 * (the server writes the elements there and sends no ParamChunk), then the slot's bytes copied to p->dst. A
 * slot whose call failed is not given back (the server may still write it; the caller retires seg). Returns
 * the gRPC code with st filled. */
static int pull_shm(zt_state_client_t *c, const struct piece *p, struct link_seg *seg, struct zt_rpc_status *st)
{
    const uint64_t per = zt_shm_slot_bytes(seg->shm) / p->es;
    int code = ZT_RPC_OK;
    for (uint64_t done = 0; done < p->n && code == ZT_RPC_OK; done += per) {
        const uint64_t k = p->n - done < per ? p->n - done : per;
        const int slot = zt_shm_slot_get(seg->shm);
        const uint64_t off = zt_shm_slot_offset(seg->shm, slot);
        zt_rpc_stream_t *s = NULL;
        int ok = pull_start(c, p, p->first + done, k, seg->id, off, &s, st);
        if (ok < 0) {
            code = st->code;
            break;
        }
        code = pull_shm_finish(s, ok, st);
        if (code != ZT_RPC_OK)
            break;
        const double t0 = zt_now_s();
        memcpy(p->dst + done * p->es, zt_shm_span(seg->shm, off, k * p->es), k * p->es);
        count_pull_copy(c, k * p->es, t0);
        zt_shm_slot_put(seg->shm, slot);
    }
    return code;
}

/* One attempt at a pull of one piece written by the server straight into piece k of the client's shared host
 * memory (segment `id`), where p->dst lies: no copy, a PullParams per slot's worth of bytes (as through the
 * slots, so that the server's copy under its run's lock stays as short), or one for the whole piece when it
 * stands there (the server's commits then write it in their update, and this pull copies nothing). Returns the
 * gRPC code with st filled. */
static int pull_arena(zt_state_client_t *c, const struct piece *p, int k, uint64_t id, struct zt_rpc_status *st)
{
    const uint64_t per = p->standing ? p->n : ZT_STATE_CLIENT_SHM_SLOT_BYTES / p->es;
    const uint64_t at0 = ZT_SHM_HEAD_BYTES + (uint64_t)(p->dst - c->arenas[k].base);
    int code = ZT_RPC_OK;
    for (uint64_t done = 0; done < p->n && code == ZT_RPC_OK; done += per) {
        const uint64_t n = p->n - done < per ? p->n - done : per;
        zt_rpc_stream_t *s = NULL;
        int ok = pull_start(c, p, p->first + done, n, id, at0 + done * p->es, &s, st);
        if (ok < 0)
            return st->code;
        code = pull_shm_finish(s, ok, st);
        if (code == ZT_RPC_OK)
            c->bytes_pulled_in_place += n * p->es;
    }
    return code;
}

/* One attempt at a PullParams stream of one piece: elements [p->first, p->first + p->n) of the shard
 * into p->dst: written there by the server when it lies in the client's shared host memory, else through the
 * server's shared-memory segment when it has one, else over TCP. Returns the gRPC code with st filled. */
static int pull_once(zt_state_client_t *c, const struct piece *p, struct zt_rpc_status *st)
{
    int k;
    const uint64_t arena_id = arena_take(c, p->server, p->dst, p->n * p->es, 1, &k);
    if (arena_id != 0) {
        int code = pull_arena(c, p, k, arena_id, st);
        if (code != ZT_RPC_OK)
            arena_failed(c, p->server, k, arena_id);
        return code;
    }
    struct link_seg *seg = p->n > 0 ? shm_take(c, p->server) : NULL;
    if (seg != NULL) {
        int code = pull_shm(c, p, seg, st);
        shm_release(c, p->server, seg, code != ZT_RPC_OK);
        return code;
    }
    const int block = p->block, shard = p->shard;
    const uint64_t offset = p->first, n = p->n;
    uint8_t *out = p->dst;
    zt_rpc_stream_t *s = NULL;
    int ok = pull_start(c, p, offset, n, 0, 0, &s, st);
    if (ok < 0)
        return st->code;
    uint64_t got = 0;
    const char *bad = NULL;
    while (ok) {
        const struct zt_rpc_part *parts;
        size_t nparts, dlen;
        if (zt_rpc_stream_recv_parts(s, &parts, &nparts, &dlen) != 1)
            break;
        struct param_view ch;
        int valid = parse_param_chunk(parts, nparts, dlen, &ch) == 0;
        if (valid && ch.dtype != (int)p->dtype) { /* F16 and BF16 have one size: compare the dtypes themselves */
            bad = p->masters ? "a ParamChunk of a dtype other than F32 for the fp32 masters (a server older than "
                               "the workers: update ztrain-server)"
                             : "a ParamChunk whose dtype is not the run's parameter dtype";
            break;
        }
        const size_t es = p->es;
        size_t clen = ch.data.left;
        if (!valid || ch.block != block || ch.shard != shard || ch.offset < offset || clen % es != 0 ||
            ch.offset - offset > n || clen / es > n - (ch.offset - offset)) {
            bad = "a ParamChunk that is not valid protobuf or lies outside the requested range";
            break;
        }
        const double t0 = zt_now_s();
        zt_wire_copy(ch.data, out + (ch.offset - offset) * es);
        count_pull_copy(c, clen, t0);
        got += clen / es;
    }
    int code = zt_rpc_stream_finish(s, st);
    if (code == ZT_RPC_OK && (bad != NULL || got != n)) {
        st->code = code = ZT_RPC_INTERNAL;
        snprintf(st->msg, sizeof(st->msg), "%s", bad ? bad : "the stream ended before every element arrived");
    }
    return code;
}

/* A pull of the run's parameters, or (masters) of its fp32 masters. */
static int pull(zt_state_client_t *c, const char *run, int64_t step, int block, int shard, uint64_t offset,
                uint64_t n, void *out, bool masters, zt_err *err)
{
    if (c->core != NULL && masters)
        return zt_server_core_read_masters(c->core, run, step, block, shard, offset, n, out, err);
    if (c->core != NULL)
        return zt_server_core_pull(c->core, run, step, block, shard, offset, n, out,
                                   (int)(c->timeout_s * 1000.0), err);
    const struct run_entry *r = run_of(c, run, err);
    if (r == NULL)
        return ZT_ESTATE;
    int server = zt_server_owner(run, block, shard, r->world_size, c->n);
    const enum zt_dtype dtype = masters ? ZT_DTYPE_F32 : r->param_dtype;
    size_t es = zt_dtype_size(dtype);
    const struct piece tmpl = {.pull = 1, .masters = masters, .server = server, .run = run, .step = step,
                               .block = block, .shard = shard, .dtype = dtype_to_wire(dtype), .es = es};
    struct piece pieces[ZT_STATE_CLIENT_MAX_STREAMS];
    /* Pieces of whole chunks of chunk_bytes (1 MiB by default). The server sends each piece as ParamChunks
     * of its own PULL_CHUNK_BYTES (1 MiB, server/service.c) counted from the piece's first element, so at
     * the default only a piece's last ParamChunk can be short; pull_once accepts ParamChunks of any size.
     * Into the caller's weights in shared memory that the server writes into, one piece that stands there:
     * the server copies nothing for it once its commits write the shard there themselves. */
    int ka;
    int k;
    if (!masters && weights_arena(c, server, out, n * es, &ka)) {
        pieces[0] = tmpl;
        pieces[0].n = n;
        pieces[0].standing = 1;
        k = 1;
    } else {
        k = split_pieces(c, n, c->chunk_bytes / es, &tmpl, pieces);
    }
    for (int i = 0; i < k; i++) {
        struct piece *p = &pieces[i];
        p->dst = (uint8_t *)out + p->first * es;
        p->first += offset;
    }
    run_pieces(c, pieces, k);
    int bad = first_failed(pieces, k);
    if (bad < 0 && step > 0)
        drop_init(c, run); /* a step was taken, so the server had every initial parameter */
    if (bad < 0)
        return 0;
    /* Pulls follow a commit that succeeded: a server below `step` restarted from an older snapshot (it
     * refuses a step in its future, or waits out the deadline for a commit it lost). */
    const struct zt_rpc_status *st = &pieces[bad].st;
    set_server_step(c, -1);
    if (step > 0 && (st->code == ZT_RPC_FAILED_PRECONDITION || st->code == ZT_RPC_NOT_FOUND ||
                     st->code == ZT_RPC_DEADLINE_EXCEEDED)) {
        int64_t at = remote_step(c, server, run);
        if (at >= 0 && at < step) {
            set_server_step(c, at);
            ZT_WARN("state server %s holds run %s at step %" PRId64 " (restarted from a snapshot?); the run resumes "
                    "there", c->srv[server].target, run, at);
            return zt_fail(err, ZT_ESTATE, "state server %s holds run %s at step %" PRId64 ", not %" PRId64
                           ": resume the run from step %" PRId64, c->srv[server].target, run, at, step, at);
        }
    }
    return rpc_fail(c, server, "PullParams", st, err);
}

int zt_state_client_pull(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                         uint64_t offset, uint64_t n, void *out, zt_err *err)
{
    return pull(c, run, step, block, shard, offset, n, out, false, err);
}

int zt_state_client_pull_masters(zt_state_client_t *c, const char *run, int64_t step, int block, int shard,
                                 uint64_t offset, uint64_t n, float *out, zt_err *err)
{
    return pull(c, run, step, block, shard, offset, n, out, true, err);
}

/* ---- snapshots ---- */

int zt_state_client_check_snapshots(zt_state_client_t *c, const char *why, zt_err *err)
{
    if (c->core != NULL)
        return 0;
    Ztrain__V1__StatsRequest req = ZTRAIN__V1__STATS_REQUEST__INIT;
    req.run = "";
    for (int i = 0; i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        if (unary(c, i, SVC "Stats", &req.base, &resp, &len, &st) != ZT_RPC_OK)
            return rpc_fail(c, i, "Stats", &st, err);
        Ztrain__V1__StatsResponse *r = ztrain__v1__stats_response__unpack(NULL, len, resp);
        free(resp);
        if (r == NULL)
            return zt_fail(err, ZT_EFORMAT, "state server %s: the StatsResponse is not valid protobuf",
                           c->srv[i].target);
        const bool none = r->snapshot_dir == ZTRAIN__V1__SNAPSHOT_DIR__SNAPSHOT_DIR_NONE;
        ztrain__v1__stats_response__free_unpacked(r, NULL);
        if (none)
            return zt_fail(err, ZT_EINVAL_CONFIG, "state server %s has no snapshot directory, and %s: start it with "
                           "`ztrain-server --snapshot-dir DIR` (the servers' half of every checkpoint), or train "
                           "with --save-every -1 (no checkpoints)", c->srv[i].target, why);
    }
    return 0;
}

int zt_state_client_restore_initial(zt_state_client_t *c, const char *run, zt_err *err)
{
    const struct run_entry *r = c->core != NULL ? NULL : run_entry_of(c, run);
    if (!has_init(c, r))
        return 0;
    for (int i = 0; i < c->n; i++)
        if (!recover_run(c, i, run))
            return zt_fail(err, ZT_EIO, "state server %s: run %s could not be registered again with its initial "
                           "parameters (its log says why)", c->srv[i].target, run);
    return 0;
}

int zt_state_client_load_snapshot(zt_state_client_t *c, const char *run, int64_t step, zt_err *err)
{
    if (c->core != NULL)
        return 0;
    Ztrain__V1__LoadSnapshotRequest req = ZTRAIN__V1__LOAD_SNAPSHOT_REQUEST__INIT;
    req.run = (char *)run;
    req.step = step;
    req.exact_step = 1;
    for (int i = 0; i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        int code = unary(c, i, SVC "LoadSnapshot", &req.base, &resp, &len, &st);
        if (code == ZT_RPC_NOT_FOUND)
            return zt_fail(err, -ENOENT, "state server %s has no snapshot of run '%s' at step %lld (%s): it keeps "
                           "the newest --snapshot-keep snapshots; resume from the checkpoint of a step it has, or "
                           "start it with a larger --snapshot-keep", c->srv[i].target, run, (long long)step, st.msg);
        if (code != ZT_RPC_OK)
            return rpc_fail(c, i, "LoadSnapshot", &st, err);
        Ztrain__V1__LoadSnapshotResponse *r = ztrain__v1__load_snapshot_response__unpack(NULL, len, resp);
        free(resp);
        const int64_t got = r && r->info ? r->info->step : -1;
        if (r)
            ztrain__v1__load_snapshot_response__free_unpacked(r, NULL);
        if (got != step)
            return zt_fail(err, ZT_EFORMAT, "state server %s: LoadSnapshot of run '%s' at step %lld answered step "
                           "%lld", c->srv[i].target, run, (long long)step, (long long)got);
    }
    return 0;
}

int zt_state_client_save_snapshot(zt_state_client_t *c, const char *run, const char *embedded_root, zt_err *err)
{
    if (c->core != NULL) {
        if (embedded_root == NULL)
            return zt_fail(err, ZT_EINVAL_CONFIG, "an embedded state server needs a snapshot directory");
        return zt_server_core_snapshot_save_checkpoint(c->core, run, embedded_root, 0, NULL, 0, err);
    }
    Ztrain__V1__SaveSnapshotRequest req = ZTRAIN__V1__SAVE_SNAPSHOT_REQUEST__INIT;
    req.run = (char *)run;
    for (int i = 0; i < c->n; i++) {
        void *resp = NULL;
        size_t len = 0;
        struct zt_rpc_status st;
        int code = unary(c, i, SVC "SaveSnapshot", &req.base, &resp, &len, &st);
        /* Before the first step (the checkpoint of step 0), a server that restarted and lost the run gets it
         * again, with the initial parameters this client kept, and snapshots it. */
        const struct run_entry *r = run_entry_of(c, run);
        if (code == ZT_RPC_NOT_FOUND && has_init(c, r) && recover_run(c, i, run))
            code = unary(c, i, SVC "SaveSnapshot", &req.base, &resp, &len, &st);
        if (code != ZT_RPC_OK)
            return rpc_fail(c, i, "SaveSnapshot", &st, err);
        free(resp);
    }
    return 0;
}
