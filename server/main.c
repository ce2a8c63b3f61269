/* ztrain-server: a state server process. It holds fp32 master weights and Adam moments of training runs
 * (RAM or NVMe tier), serves ztrain.v1.StateService and grpc.health.v1.Health over gRPC, optionally a
 * plaintext health-only port for Kubernetes probes and a Prometheus text endpoint, restores the latest
 * snapshots at start, re-reads its token file on SIGHUP, and shuts down gracefully on SIGTERM or SIGINT.
 * It refuses to start on an address other hosts can reach without a way to authenticate clients (a token
 * or client certificates) unless --insecure says so: see docs/security.md. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/args.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/units.h"
#include "proto/rpc.h"
#include "server/core.h"
#include "server/service.h"

/* The smallest --max-message: ztrain's clients send chunks of 1 MiB plus a header. */
#define MIN_MESSAGE_BYTES (2u << 20)

struct server_config {
    const char *listen;
    const char *store;
    uint64_t mem_limit;
    int max_runs;
    uint64_t max_message;
    int insecure;
    int threads;
    const char *snapshot_dir;
    int snapshot_keep;
    int snapshot_commits;
    const char *tls_cert, *tls_key, *tls_ca;
    const char *token_file;
    const char *health_listen;
    const char *metrics_listen;
    const char *log_level;
    int server_index, server_count;
    int shm_off;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ztrain-server [options]\n"
            "  --listen ADDR          gRPC address (default 127.0.0.1:7070; 0.0.0.0:PORT for other hosts)\n"
            "  --store ram|nvme:PATH  where master weights and Adam moments live (default ram)\n"
            "  --max-memory SIZE      RAM the runs may hold (e.g. 64GiB; default: no limit); a run that does not\n"
            "                         fit is refused with RESOURCE_EXHAUSTED (also spelt --mem-limit)\n"
            "  --max-runs N           runs held at once (default: no limit); more are refused with RESOURCE_EXHAUSTED\n"
            "  --max-message SIZE     largest gRPC message received or sent (default 4MiB, at least 2MiB)\n"
            "  --threads N            CPU Adam threads (default: all cores)\n"
            "  --snapshot-dir DIR     snapshots: restored at start, written by SaveSnapshot\n"
            "  --snapshot-keep N      snapshots kept per run: the newest N of the workers' checkpoints and the\n"
            "                         newest N of --snapshot-commits' (default 2; 0 keeps all)\n"
            "  --snapshot-commits N   also a snapshot after every N-th commit, before it is answered, and when a\n"
            "                         run's initial parameters are complete: a restart loses no answered commit\n"
            "                         (default 0: snapshots only when workers ask, at their checkpoints)\n"
            "  --tls-cert F --tls-key F   serve TLS with this certificate and key (PEM)\n"
            "  --tls-ca F             require client certificates signed by this CA (mutual TLS)\n"
            "  --token-file F         require 'authorization: Bearer <token>' with the token of F's first line on\n"
            "                         every call (further lines: tokens also accepted, during a rotation);\n"
            "                         SIGHUP re-reads F (tokens no longer in it are refused from then on)\n"
            "  --insecure yes         allow a --listen address other hosts can reach with neither --token-file\n"
            "                         nor --tls-ca (without it such a server refuses to start)\n"
            "  --health-listen ADDR   plaintext port serving only grpc.health.v1.Health (Kubernetes probes)\n"
            "  --metrics-listen ADDR  Prometheus text on GET /metrics at ADDR (host:port)\n"
            "  --server-index I --server-count S   this server's place among S servers sharing runs\n"
            "  --shm auto|off         auto (default): a client on this host (the same user) moves its pushed and\n"
            "                         pulled bytes through shared memory, the calls still over gRPC; off: all over gRPC\n"
            "  --log-level L          debug|info|warn|error (default info)\n");
}

/* Whether a gRPC listen address can be reached from this machine only: a loopback address (127.0.0.0/8,
 * ::1, ::ffff:127.x.y.z), "localhost", or a Unix socket. Anything else, host names and the wildcard
 * addresses included, counts as reachable from other hosts. */
static int is_loopback(const char *addr)
{
    if (strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "unix-abstract:", 14) == 0)
        return 1;
    if (strncmp(addr, "ipv4:", 5) == 0 || strncmp(addr, "ipv6:", 5) == 0)
        addr += 5;
    char host[256];
    size_t n;
    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');
        if (end == NULL)
            return 0;
        addr++;
        n = (size_t)(end - addr);
    } else {
        const char *colon = strrchr(addr, ':');
        n = colon ? (size_t)(colon - addr) : strlen(addr);
    }
    if (n == 0 || n >= sizeof(host))
        return 0;
    memcpy(host, addr, n);
    host[n] = '\0';
    if (strcmp(host, "localhost") == 0)
        return 1;
    struct in_addr v4;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    struct in6_addr v6;
    if (inet_pton(AF_INET6, host, &v6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
    return 0;
}

/* Protected mode: a server that other hosts can reach must be able to tell its clients apart from
 * anyone else's, by a bearer token or by client certificates (mutual TLS). Returns 0 when the listen
 * address is loopback, one of the two is configured, or --insecure was given (then with a warning). */
static int check_protected_mode(const struct server_config *cfg, zt_err *err)
{
    if (is_loopback(cfg->listen) || cfg->token_file != NULL || cfg->tls_ca != NULL)
        return 0;
    if (cfg->insecure) {
        ZT_WARN("server: --insecure: %s can be reached from other hosts and any client there may read and change "
                "every run's state (no --token-file, no --tls-ca)", cfg->listen);
        return 0;
    }
    return zt_fail(err, ZT_EINVAL_CONFIG,
                   "--listen %s can be reached from other hosts, but with neither --token-file nor --tls-ca any "
                   "client there could read and change every run's state; give a token (--token-file) or client "
                   "certificates (--tls-cert/--tls-key/--tls-ca), listen on 127.0.0.1, or add --insecure yes on a "
                   "network you trust (docs/security.md)",
                   cfg->listen);
}

static int parse_args(int argc, char **argv, struct server_config *cfg, zt_err *err)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen = "127.0.0.1:7070";
    cfg->store = "ram";
    cfg->snapshot_keep = 2;
    cfg->server_count = 1;
    cfg->log_level = "info";
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(flag, "--insecure") == 0 && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            cfg->insecure = 1; /* also accepted without a value */
            continue;
        }
        if (i + 1 >= argc)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s needs a value (see ztrain-server --help)", flag);
        const char *v = argv[++i];
        int64_t n;
        int rc = 0;
        if (strcmp(flag, "--listen") == 0)
            cfg->listen = v;
        else if (strcmp(flag, "--store") == 0)
            cfg->store = v;
        else if (strcmp(flag, "--max-memory") == 0 || strcmp(flag, "--mem-limit") == 0)
            rc = zt_parse_size(v, &cfg->mem_limit, err);
        else if (strcmp(flag, "--max-runs") == 0) {
            rc = zt_arg_int(flag, v, 1, 1000000, &n, err);
            cfg->max_runs = (int)n;
        } else if (strcmp(flag, "--max-message") == 0) {
            rc = zt_parse_size(v, &cfg->max_message, err);
            if (rc == 0 && (cfg->max_message < MIN_MESSAGE_BYTES || cfg->max_message > 0x7fffffffu))
                return zt_fail(err, ZT_EINVAL_CONFIG, "--max-message %s: give 2MiB to 2GiB (ztrain's clients send "
                               "chunks of 1 MiB)", v);
        } else if (strcmp(flag, "--insecure") == 0) {
            if (strcmp(v, "yes") != 0 && strcmp(v, "true") != 0 && strcmp(v, "1") != 0)
                return zt_fail(err, ZT_EINVAL_CONFIG, "--insecure %s: write --insecure yes (or leave it out)", v);
            cfg->insecure = 1;
        }
        else if (strcmp(flag, "--threads") == 0) {
            rc = zt_arg_int(flag, v, 1, 4096, &n, err);
            cfg->threads = (int)n;
        } else if (strcmp(flag, "--snapshot-dir") == 0)
            cfg->snapshot_dir = v;
        else if (strcmp(flag, "--snapshot-keep") == 0) {
            rc = zt_arg_int(flag, v, 0, 1000000, &n, err);
            cfg->snapshot_keep = (int)n;
        } else if (strcmp(flag, "--snapshot-commits") == 0) {
            rc = zt_arg_int(flag, v, 0, 1000000, &n, err);
            cfg->snapshot_commits = (int)n;
        } else if (strcmp(flag, "--tls-cert") == 0)
            cfg->tls_cert = v;
        else if (strcmp(flag, "--tls-key") == 0)
            cfg->tls_key = v;
        else if (strcmp(flag, "--tls-ca") == 0)
            cfg->tls_ca = v;
        else if (strcmp(flag, "--token-file") == 0)
            cfg->token_file = v;
        else if (strcmp(flag, "--health-listen") == 0)
            cfg->health_listen = v;
        else if (strcmp(flag, "--metrics-listen") == 0)
            cfg->metrics_listen = v;
        else if (strcmp(flag, "--log-level") == 0)
            cfg->log_level = v;
        else if (strcmp(flag, "--server-index") == 0) {
            rc = zt_arg_int(flag, v, 0, ZT_SERVER_MAX_WORLD - 1, &n, err);
            cfg->server_index = (int)n;
        } else if (strcmp(flag, "--server-count") == 0) {
            rc = zt_arg_int(flag, v, 1, ZT_SERVER_MAX_WORLD, &n, err);
            cfg->server_count = (int)n;
        } else if (strcmp(flag, "--shm") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "off") != 0)
                return zt_fail(err, ZT_EINVAL_CONFIG, "--shm %s: write --shm auto (shared memory with clients on this "
                               "host) or --shm off (everything over gRPC)", v);
            cfg->shm_off = strcmp(v, "off") == 0;
        } else
            return zt_fail(err, ZT_EINVAL_CONFIG, "unknown option %s (see ztrain-server --help)", flag);
        if (rc != 0)
            return rc;
    }
    if (cfg->server_index >= cfg->server_count)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--server-index %d must be below --server-count %d", cfg->server_index,
                       cfg->server_count);
    if (strcmp(cfg->store, "ram") != 0 && (strncmp(cfg->store, "nvme:", 5) != 0 || cfg->store[5] == '\0'))
        return zt_fail(err, ZT_EINVAL_CONFIG, "--store %s: use ram or nvme:PATH", cfg->store);
    if (cfg->snapshot_commits > 0 && cfg->snapshot_dir == NULL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--snapshot-commits needs --snapshot-dir DIR to write the snapshots to");
    return check_protected_mode(cfg, err);
}

/* The bearer tokens of a token file: its first line is the token clients send; further non-empty lines
 * are tokens also accepted while a token is rotated (up to ZT_RPC_MAX_TOKENS in all). */
struct tokens {
    char *text;                         /* the file, cut into lines in place; owned */
    const char *list[ZT_RPC_MAX_TOKENS];
    int n;
};

static void tokens_free(struct tokens *t)
{
    if (t->text != NULL)
        explicit_bzero(t->text, strlen(t->text));
    free(t->text);
    memset(t, 0, sizeof(*t));
}

/* Reads the token file into *t (lines without surrounding blanks). Returns 0, or a negative code with a
 * message for an unreadable file, an empty first line or more than ZT_RPC_MAX_TOKENS tokens. */
static int read_tokens(const char *path, struct tokens *t, zt_err *err)
{
    memset(t, 0, sizeof(*t));
    size_t len;
    int rc = zt_read_file(path, &t->text, &len, err);
    if (rc != 0)
        return rc;
    char *line = t->text;
    for (int first = 1; line != NULL; first = 0) {
        char *next = strpbrk(line, "\r\n");
        if (next != NULL)
            *next++ = '\0';
        while (*line == ' ' || *line == '\t')
            line++;
        size_t n = strlen(line);
        while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t'))
            line[--n] = '\0';
        if (first && n == 0) {
            tokens_free(t);
            return zt_fail(err, ZT_EINVAL_CONFIG, "the token file %s is empty; write the token on its first line", path);
        }
        if (n > 0) {
            if (t->n == ZT_RPC_MAX_TOKENS) {
                tokens_free(t);
                return zt_fail(err, ZT_EINVAL_CONFIG, "the token file %s holds more than %d tokens; keep the token "
                               "and the ones still being rotated out", path, ZT_RPC_MAX_TOKENS);
            }
            t->list[t->n++] = line;
        }
        line = next;
    }
    return 0;
}

/* ---- Prometheus text over a tiny HTTP responder ---- */

struct metrics {
    zt_server_core *core;
    int fd;
    pthread_t thread;
};

static int listen_tcp(const char *addr, zt_err *err)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    if (colon == NULL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--metrics-listen %s: use host:port", addr);
    *colon = '\0';
    const char *port = colon + 1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    if (getaddrinfo(host[0] ? host : NULL, port, &hints, &res) != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--metrics-listen %s: cannot resolve the address", addr);
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return zt_fail(err, -e, "cannot listen on %s for metrics: %s", addr, strerror(e));
    }
    freeaddrinfo(res);
    return fd;
}

/* The port a listening socket is bound to (after binding port 0), or 0 for no socket. */
static int bound_port(int fd)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof(a);
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return 0;
    if (a.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return 0;
}

static void *metrics_thread(void *arg)
{
    struct metrics *m = arg;
    for (;;) {
        int c = accept(m->fd, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            break; /* the listening socket was shut down */
        }
        char req[1024];
        ssize_t n = recv(c, req, sizeof(req) - 1, 0);
        req[n > 0 ? n : 0] = '\0';
        char *body = NULL;
        const char *status = "404 Not Found";
        size_t blen = 0;
        if (strncmp(req, "GET /metrics ", 13) == 0 || strncmp(req, "GET /metrics?", 13) == 0) {
            size_t need = zt_server_core_metrics_text(m->core, NULL, 0);
            body = zt_xmalloc(need + 1);
            blen = zt_server_core_metrics_text(m->core, body, need + 1);
            if (blen > need)
                blen = need;
            status = "200 OK";
        }
        char head[256];
        int hlen = snprintf(head, sizeof(head),
                            "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %zu\r\n"
                            "Connection: close\r\n\r\n",
                            status, blen);
        if (send(c, head, (size_t)hlen, MSG_NOSIGNAL) == hlen && blen > 0)
            (void)!send(c, body, blen, MSG_NOSIGNAL);
        free(body);
        close(c);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct server_config cfg;
    zt_err err = {{0}};
    if (parse_args(argc, argv, &cfg, &err) != 0) {
        fprintf(stderr, "ztrain-server: %s\n", err.msg);
        return 2;
    }
    enum zt_log_level level;
    if (zt_log_parse_level(cfg.log_level, &level) != 0) {
        fprintf(stderr, "ztrain-server: --log-level %s: use debug, info, warn or error\n", cfg.log_level);
        return 2;
    }
    zt_log_set_level(level);

    /* Signals are taken by sigwait in this thread; every thread started below inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A file size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk, instead of
     * killing the server. */
    signal(SIGXFSZ, SIG_IGN);

    struct tokens tokens = {0};
    zt_server_core *core = NULL;
    zt_service_t *svc = NULL;
    zt_rpc_server_t *srv = NULL;
    struct metrics met = {.fd = -1};
    int status = 1;

    if (cfg.token_file != NULL && read_tokens(cfg.token_file, &tokens, &err) != 0)
        goto out;
    zt_server_core_options copt = {0};
    copt.store = strcmp(cfg.store, "ram") == 0 ? ZT_SERVER_STORE_RAM : ZT_SERVER_STORE_NVME;
    copt.store_path = copt.store == ZT_SERVER_STORE_NVME ? cfg.store + 5 : NULL;
    copt.mem_limit = cfg.mem_limit;
    copt.max_runs = cfg.max_runs;
    copt.threads = cfg.threads;
    copt.server_index = cfg.server_index;
    copt.server_count = cfg.server_count;
    if (zt_server_core_create(&core, &copt, &err) != 0)
        goto out;
    if (cfg.snapshot_dir != NULL) {
        int nruns = 0;
        if (zt_mkdir_p(cfg.snapshot_dir, &err) != 0 || zt_server_core_restore_all(core, cfg.snapshot_dir, &nruns, &err) != 0)
            goto out;
        ZT_INFO("server: restored %d run(s) from %s", nruns, cfg.snapshot_dir);
    }
    struct zt_service_options sopt = {.snapshot_dir = cfg.snapshot_dir, .snapshot_keep = cfg.snapshot_keep,
                                      .snapshot_commits = cfg.snapshot_commits,
                                      .server_index = cfg.server_index, .server_count = cfg.server_count,
                                      .shm_off = cfg.shm_off};
    if (zt_service_create(core, &sopt, &svc, &err) != 0)
        goto out;
    struct zt_rpc_server_options ropt = {0};
    ropt.listen_addr = cfg.listen;
    ropt.tls_cert_file = cfg.tls_cert;
    ropt.tls_key_file = cfg.tls_key;
    ropt.tls_ca_file = cfg.tls_ca;
    ropt.require_client_cert = cfg.tls_ca != NULL;
    ropt.token = tokens.n > 0 ? tokens.list[0] : NULL;
    ropt.max_message_bytes = (size_t)cfg.max_message;
    ropt.health_listen_addr = cfg.health_listen;
    if (zt_rpc_server_create(&ropt, &srv, &err) != 0 || zt_service_add_methods(svc, srv, &err) != 0 ||
        (tokens.n > 1 && zt_rpc_server_set_tokens(srv, tokens.list, tokens.n, &err) != 0) ||
        zt_rpc_server_start(srv, &err) != 0)
        goto out;
    if (cfg.metrics_listen != NULL) {
        met.core = core;
        met.fd = listen_tcp(cfg.metrics_listen, &err);
        if (met.fd < 0 || pthread_create(&met.thread, NULL, metrics_thread, &met) != 0)
            goto out;
    }
    ZT_INFO("server: listening on %s (port %d, %s%s, store %s, server %d of %d, shared memory %s)%s%s", cfg.listen,
            zt_rpc_server_port(srv), cfg.tls_cert ? (cfg.tls_ca ? "mutual TLS" : "TLS") : "plaintext",
            tokens.n ? ", token required" : "", cfg.store, cfg.server_index, cfg.server_count,
            cfg.shm_off ? "off" : "for clients on this host",
            cfg.health_listen ? ", health on " : "", cfg.health_listen ? cfg.health_listen : "");
    /* A line a supervising script can wait for (and read the port from, with --listen host:0). */
    printf("ztrain-server ready port=%d health_port=%d metrics_port=%d\n", zt_rpc_server_port(srv),
           zt_rpc_server_health_port(srv), bound_port(met.fd));
    fflush(stdout);

    int sig = 0;
    for (;;) {
        sigwait(&sigs, &sig);
        if (sig != SIGHUP)
            break;
        if (cfg.token_file == NULL) {
            ZT_WARN("server: SIGHUP received; there is no --token-file to re-read");
            continue;
        }
        struct tokens fresh;
        zt_err rerr = {{0}};
        if (read_tokens(cfg.token_file, &fresh, &rerr) != 0 ||
            zt_rpc_server_set_tokens(srv, fresh.list, fresh.n, &rerr) != 0)
            ZT_ERROR("server: SIGHUP: %s; the tokens in use stay", rerr.msg);
        else
            ZT_INFO("server: SIGHUP: token reloaded from %s (%d accepted); calls with any other token are refused",
                    cfg.token_file, fresh.n);
        tokens_free(&fresh);
    }
    ZT_INFO("server: %s received, shutting down (running calls get 10s)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    status = 0;

out:
    if (status != 0)
        ZT_ERROR("server: %s", err.msg);
    zt_rpc_server_destroy(srv, 10.0);
    if (met.fd >= 0) {
        shutdown(met.fd, SHUT_RDWR);
        if (met.core != NULL && met.thread)
            pthread_join(met.thread, NULL);
        close(met.fd);
    }
    zt_service_destroy(svc);
    zt_server_core_destroy(core);
    tokens_free(&tokens);
    if (status == 0)
        ZT_INFO("server: stopped");
    return status;
}
