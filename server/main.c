/* ztrain-server: a state server process. It holds fp32 master weights and Adam moments of training runs
 * (RAM or NVMe tier), serves ztrain.v1.StateService and grpc.health.v1.Health over gRPC, optionally a
 * plaintext health-only port for Kubernetes probes and a Prometheus text endpoint, restores the latest
 * snapshots at start, and shuts down gracefully on SIGTERM or SIGINT. */
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

struct server_config {
    const char *listen;
    const char *store;
    uint64_t mem_limit;
    int threads;
    const char *snapshot_dir;
    int snapshot_keep;
    const char *tls_cert, *tls_key, *tls_ca;
    const char *token_file;
    const char *health_listen;
    const char *metrics_listen;
    const char *log_level;
    int server_index, server_count;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ztrain-server [options]\n"
            "  --listen ADDR          gRPC address (default 127.0.0.1:7070; 0.0.0.0:PORT for other hosts)\n"
            "  --store ram|nvme:PATH  where master weights and Adam moments live (default ram)\n"
            "  --mem-limit SIZE       RAM the runs may hold (e.g. 64GiB; default: no limit)\n"
            "  --threads N            CPU Adam threads (default: all cores)\n"
            "  --snapshot-dir DIR     snapshots: restored at start, written by SaveSnapshot\n"
            "  --snapshot-keep N      snapshots kept per run (default 2; 0 keeps all)\n"
            "  --tls-cert F --tls-key F   serve TLS with this certificate and key (PEM)\n"
            "  --tls-ca F             require client certificates signed by this CA (mutual TLS)\n"
            "  --token-file F         require 'authorization: Bearer <token>' with the token in F on every call\n"
            "  --health-listen ADDR   plaintext port serving only grpc.health.v1.Health (Kubernetes probes)\n"
            "  --metrics-listen ADDR  Prometheus text on GET /metrics at ADDR (host:port)\n"
            "  --server-index I --server-count S   this server's place among S servers sharing runs\n"
            "  --log-level L          debug|info|warn|error (default info)\n");
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
        if (i + 1 >= argc)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s needs a value (see ztrain-server --help)", flag);
        const char *v = argv[++i];
        int64_t n;
        int rc = 0;
        if (strcmp(flag, "--listen") == 0)
            cfg->listen = v;
        else if (strcmp(flag, "--store") == 0)
            cfg->store = v;
        else if (strcmp(flag, "--mem-limit") == 0)
            rc = zt_parse_size(v, &cfg->mem_limit, err);
        else if (strcmp(flag, "--threads") == 0) {
            rc = zt_arg_int(flag, v, 1, 4096, &n, err);
            cfg->threads = (int)n;
        } else if (strcmp(flag, "--snapshot-dir") == 0)
            cfg->snapshot_dir = v;
        else if (strcmp(flag, "--snapshot-keep") == 0) {
            rc = zt_arg_int(flag, v, 0, 1000000, &n, err);
            cfg->snapshot_keep = (int)n;
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
    return 0;
}

/* Reads the token file: its first line, without trailing whitespace. */
static int read_token(const char *path, char **out, zt_err *err)
{
    size_t len;
    int rc = zt_read_file(path, out, &len, err);
    if (rc != 0)
        return rc;
    char *t = *out;
    t[strcspn(t, "\r\n")] = '\0';
    size_t n = strlen(t);
    while (n > 0 && (t[n - 1] == ' ' || t[n - 1] == '\t'))
        t[--n] = '\0';
    if (n == 0) {
        free(t);
        *out = NULL;
        return zt_fail(err, ZT_EINVAL_CONFIG, "the token file %s is empty; write the token on its first line", path);
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
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char *token = NULL;
    zt_server_core *core = NULL;
    zt_service_t *svc = NULL;
    zt_rpc_server_t *srv = NULL;
    struct metrics met = {.fd = -1};
    int status = 1;

    if (cfg.token_file != NULL && read_token(cfg.token_file, &token, &err) != 0)
        goto out;
    zt_server_core_options copt = {0};
    copt.store = strcmp(cfg.store, "ram") == 0 ? ZT_SERVER_STORE_RAM : ZT_SERVER_STORE_NVME;
    copt.store_path = copt.store == ZT_SERVER_STORE_NVME ? cfg.store + 5 : NULL;
    copt.mem_limit = cfg.mem_limit;
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
                                      .server_index = cfg.server_index, .server_count = cfg.server_count};
    if (zt_service_create(core, &sopt, &svc, &err) != 0)
        goto out;
    struct zt_rpc_server_options ropt = {0};
    ropt.listen_addr = cfg.listen;
    ropt.tls_cert_file = cfg.tls_cert;
    ropt.tls_key_file = cfg.tls_key;
    ropt.tls_ca_file = cfg.tls_ca;
    ropt.require_client_cert = cfg.tls_ca != NULL;
    ropt.token = token;
    ropt.health_listen_addr = cfg.health_listen;
    if (zt_rpc_server_create(&ropt, &srv, &err) != 0 || zt_service_add_methods(svc, srv, &err) != 0 ||
        zt_rpc_server_start(srv, &err) != 0)
        goto out;
    if (cfg.metrics_listen != NULL) {
        met.core = core;
        met.fd = listen_tcp(cfg.metrics_listen, &err);
        if (met.fd < 0 || pthread_create(&met.thread, NULL, metrics_thread, &met) != 0)
            goto out;
    }
    ZT_INFO("server: listening on %s (port %d, %s%s, store %s, server %d of %d)%s%s", cfg.listen,
            zt_rpc_server_port(srv), cfg.tls_cert ? (cfg.tls_ca ? "mutual TLS" : "TLS") : "plaintext",
            token ? ", token required" : "", cfg.store, cfg.server_index, cfg.server_count,
            cfg.health_listen ? ", health on " : "", cfg.health_listen ? cfg.health_listen : "");
    /* A line a supervising script can wait for (and read the port from, with --listen host:0). */
    printf("ztrain-server ready port=%d health_port=%d metrics_port=%d\n", zt_rpc_server_port(srv),
           zt_rpc_server_health_port(srv), bound_port(met.fd));
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
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
    free(token);
    if (status == 0)
        ZT_INFO("server: stopped");
    return status;
}
