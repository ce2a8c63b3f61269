/* state_rank: one (or several) ZeRO ranks of a small synthetic model driving the state service through
 * worker/state/client.h, for tests/server/state_client_test.py. The test sends one command per line on
 * stdin and reads one reply line on stdout, which makes the ranks of several processes step in lock step
 * without sleeps:
 *   init            register the run; rank 0 pushes the initial parameters   -> "ok STEP"
 *   pull S          pull the parameters of this process's shards after step S -> "ok"
 *   push S          gradients of step S (from the current parameters) pushed  -> "ok" | "resume STEP"
 *   pushpause S     as push, but stops after the first chunk, prints "paused" and goes on after a line
 *   commit S        commit step S on every server                             -> "ok" | "resume STEP"
 *   save            snapshot on every server (embedded: under --snap-root)    -> "ok"
 *   dump PREFIX     writes PREFIX.r<rank>: the fp32 parameters of that rank's shards, block by block
 *   quit
 * Any other failure replies "err MESSAGE".
 *
 * --streams N: concurrent streams per push and pull (zt_state_client_options.streams; 0, the default, takes
 * ZT_STATE_STREAMS or the core count). With 1 KiB chunks, N >= 2 splits the pushes and pulls of block 0.
 *
 * usage: state_rank --ranks 0,1 [--servers host:port,...] [--snap-root DIR] [--streams N] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/state/client.h"

#define RUN "rank-test"
#define W 2
#define NBLOCKS 3
static const uint64_t numel[NBLOCKS] = {5000, 1234, 77};
static const zt_server_range decay0[] = {{0, 4000}}, decay2[] = {{0, 77}};

static int ranks[W], nranks;
static float *params[NBLOCKS][W]; /* this process's shards, fp32 */
static zt_state_client_t *client;

/* A deterministic value in [-1, 1) from three integers (splitmix64). */
static float noise(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint64_t shard_n(int b)
{
    return zt_server_shard_numel(numel[b], W);
}

static int reply_err(int rc, const zt_err *err)
{
    if (rc == ZT_ESTATE && zt_state_client_server_step(client) >= 0)
        printf("resume %lld\n", (long long)zt_state_client_server_step(client));
    else
        printf("err %s\n", err->msg);
    fflush(stdout);
    return rc;
}

static void pause_hook(void *user, int64_t step, int block, int shard, uint64_t sent)
{
    (void)step, (void)block, (void)shard, (void)sent;
    int *armed = user;
    if (!*armed)
        return;
    *armed = 0;
    printf("paused\n");
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof(line), stdin) == NULL)
        exit(1);
}

static int do_init(zt_err *err)
{
    zt_server_block_desc blocks[NBLOCKS] = {
        {.numel = numel[0], .decay = decay0, .ndecay = 1},
        {.numel = numel[1]},
        {.numel = numel[2], .decay = decay2, .ndecay = 1},
    };
    zt_server_run_desc desc = {.run_id = RUN, .world_size = W, .nblocks = NBLOCKS, .blocks = blocks, .beta1 = 0.9f,
                               .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .param_dtype = ZT_DTYPE_F32};
    int64_t step = 0;
    int rc = zt_state_client_register(client, &desc, &step, err);
    for (int i = 0; rc == 0 && i < nranks; i++) {
        if (ranks[i] != 0 || step != 0)
            continue;
        for (int b = 0; rc == 0 && b < NBLOCKS; b++) {
            uint64_t n = shard_n(b);
            float *p = calloc(n, sizeof(float));
            for (int s = 0; rc == 0 && s < W; s++) {
                for (uint64_t k = 0; k < n; k++) {
                    uint64_t e = (uint64_t)s * n + k;
                    p[k] = e < numel[b] ? 0.1f * noise(0, (uint64_t)b, e) : 0.0f;
                }
                rc = zt_state_client_push_params(client, RUN, b, s, p, n, err);
            }
            free(p);
        }
    }
    if (rc == 0) {
        printf("ok %lld\n", (long long)step);
        fflush(stdout);
    }
    return rc;
}

static int do_push(int64_t step, int pause, zt_err *err)
{
    int armed = pause;
    zt__state_client_set_chunk_hook(client, pause ? pause_hook : NULL, &armed);
    int rc = 0;
    for (int b = 0; rc == 0 && b < NBLOCKS; b++) {
        uint64_t n = shard_n(b);
        float *g = malloc(n * sizeof(float));
        for (int i = 0; rc == 0 && i < nranks; i++) {
            int s = ranks[i];
            for (uint64_t k = 0; k < n; k++) {
                uint64_t e = (uint64_t)s * n + k;
                g[k] = e < numel[b] ? noise((uint64_t)step, (uint64_t)b, e) + 0.05f * params[b][i][k] : 0.0f;
            }
            rc = zt_state_client_push_grad(client, RUN, step, b, s, ZT_DTYPE_F32, g, n, err);
        }
        free(g);
    }
    zt__state_client_set_chunk_hook(client, NULL, NULL);
    return rc;
}

static int do_pull(int64_t step, zt_err *err)
{
    int rc = 0;
    for (int b = 0; rc == 0 && b < NBLOCKS; b++) /* block 0 first */
        for (int i = 0; rc == 0 && i < nranks; i++)
            rc = zt_state_client_pull(client, RUN, step, b, ranks[i], 0, shard_n(b), params[b][i], err);
    return rc;
}

static int do_dump(const char *prefix, zt_err *err)
{
    for (int i = 0; i < nranks; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s.r%d", prefix, ranks[i]);
        FILE *f = fopen(path, "wb");
        if (f == NULL)
            return zt_fail(err, ZT_EIO, "cannot write %s", path);
        for (int b = 0; b < NBLOCKS; b++)
            fwrite(params[b][i], sizeof(float), shard_n(b), f);
        fclose(f);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *servers = NULL, *snap_root = NULL, *rank_list = "0";
    int streams = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--servers") == 0)
            servers = argv[i + 1];
        else if (strcmp(argv[i], "--ranks") == 0)
            rank_list = argv[i + 1];
        else if (strcmp(argv[i], "--snap-root") == 0)
            snap_root = argv[i + 1];
        else if (strcmp(argv[i], "--streams") == 0)
            streams = atoi(argv[i + 1]);
    }
    for (const char *p = rank_list; *p && nranks < W; p++)
        if (*p >= '0' && *p < '0' + W)
            ranks[nranks++] = *p - '0';
    for (int b = 0; b < NBLOCKS; b++)
        for (int i = 0; i < nranks; i++)
            params[b][i] = calloc(shard_n(b), sizeof(float));
    struct zt_state_client_options opt = {.servers = servers, .backoff_s = 0.05, .max_retries = 8,
                                          .timeout_s = 20.0, .chunk_bytes = 1024, .streams = streams};
    opt.embedded.threads = 1;
    zt_err err = {{0}};
    if (zt_state_client_create(&opt, &client, &err) != 0) {
        fprintf(stderr, "state_rank: %s\n", err.msg);
        return 1;
    }
    char line[4096];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        char cmd[32] = "", arg[4000] = "";
        if (sscanf(line, "%31s %3999s", cmd, arg) < 1)
            continue;
        long long s = atoll(arg);
        int rc = 0, quiet = 0;
        memset(&err, 0, sizeof(err));
        if (strcmp(cmd, "quit") == 0)
            break;
        else if (strcmp(cmd, "init") == 0)
            rc = do_init(&err), quiet = 1;
        else if (strcmp(cmd, "pull") == 0)
            rc = do_pull(s, &err);
        else if (strcmp(cmd, "push") == 0 || strcmp(cmd, "pushpause") == 0)
            rc = do_push(s, strcmp(cmd, "pushpause") == 0, &err);
        else if (strcmp(cmd, "commit") == 0) {
            zt_server_commit_args a = {.step = s, .grad_norm = 1.0, .clip_coef = 0.5f, .lr = 1e-3f * (float)s};
            rc = zt_state_client_commit(client, RUN, &a, &err);
        } else if (strcmp(cmd, "save") == 0)
            rc = zt_state_client_save_snapshot(client, RUN, snap_root, &err);
        else if (strcmp(cmd, "dump") == 0)
            rc = do_dump(arg, &err);
        else
            rc = zt_fail(&err, ZT_EINVAL_CONFIG, "unknown command %s", cmd);
        if (rc != 0)
            reply_err(rc, &err);
        else if (!quiet) {
            printf("ok\n");
            fflush(stdout);
        }
    }
    zt_state_client_destroy(client);
    for (int b = 0; b < NBLOCKS; b++)
        for (int i = 0; i < nranks; i++)
            free(params[b][i]);
    return 0;
}
