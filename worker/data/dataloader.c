/* Token shards (llm.c's format) and the batch loader over them: open and validate the files matched by a
 * glob, map them read-only, and hand out batches of B rows of T+1 tokens in an order that depends only on
 * (files, B, T, shuffle, seed) and a position, so that a resumed run sees exactly the batches it would
 * have seen. */
#include "worker/data/dataloader.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/rng.h"

/* Tokens are read straight from the mapped file as uint16 or uint32, which is only right on a little-endian
 * host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards are little-endian; big-endian hosts are not supported");

#define HEADER_BYTES (ZT_SHARD_HEADER_INTS * 4)

/* One mapped shard that holds at least one window. */
struct shard {
    char *path;             /* owned */
    void *map;              /* whole file, PROT_READ */
    size_t map_len;         /* bytes */
    const void *tokens;     /* map + HEADER_BYTES */
    int width;              /* bytes per token: 2 (uint16) or 4 (uint32) */
    uint64_t ntok;
    uint64_t nwin;          /* windows of B*T+1 tokens starting at k*B*T */
};

/* Token i of a shard, in either format. */
static inline uint32_t token_at(const struct shard *s, uint64_t i)
{
    return s->width == 2 ? ((const uint16_t *)s->tokens)[i] : ((const uint32_t *)s->tokens)[i];
}

struct zt_dataloader {
    int B, T;
    bool shuffle;
    uint64_t seed;

    struct shard *shards; /* in file (name) order; shards too small for one window are not kept */
    uint64_t nshards;
    uint64_t num_tokens;  /* over the kept shards */
    int max_token;
    uint64_t batches_per_epoch;

    zt_data_position pos; /* the batch the next call to next() returns; always a valid position */

    /* Orders derived from pos, recomputed when pos moves to another epoch or shard. */
    uint64_t *shard_order;     /* nshards entries: shard ids in this epoch's visiting order */
    bool shard_order_valid;
    uint64_t shard_order_epoch;
    uint64_t *window_order;    /* max nwin entries: window indices of the current shard */
    bool window_order_valid;
    uint64_t window_order_epoch;
    uint64_t window_order_shard; /* shard id the window order was drawn for */
};

/* splitmix64's finaliser: a bijective mix of 64 bits, used to derive generator seeds from small numbers. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Hash of a short list of words; (seed, epoch) and (seed, epoch, shard) give unrelated values. */
static uint64_t hash_words(const uint64_t *w, int n)
{
    uint64_t h = 0x243f6a8885a308d3ULL;
    for (int i = 0; i < n; i++)
        h = mix64(h ^ w[i]);
    return h;
}

static void fill_identity(uint64_t *idx, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        idx[i] = i;
}

static void compute_shard_order(zt_dataloader *dl, uint64_t epoch)
{
    if (dl->shard_order_valid && dl->shard_order_epoch == epoch)
        return;
    fill_identity(dl->shard_order, dl->nshards);
    if (dl->shuffle) {
        uint64_t words[2] = {dl->seed, epoch};
        zt_rng rng;
        zt_rng_seed(&rng, hash_words(words, 2));
        zt_rng_shuffle_u64(&rng, dl->shard_order, dl->nshards);
    }
    dl->shard_order_valid = true;
    dl->shard_order_epoch = epoch;
}

/* Window order of shard id `shard` in `epoch` (only used with shuffle on; off means 0, 1, 2, ...). */
static void compute_window_order(zt_dataloader *dl, uint64_t epoch, uint64_t shard)
{
    if (dl->window_order_valid && dl->window_order_epoch == epoch && dl->window_order_shard == shard)
        return;
    uint64_t n = dl->shards[shard].nwin;
    fill_identity(dl->window_order, n);
    uint64_t words[3] = {dl->seed, epoch, shard};
    zt_rng rng;
    zt_rng_seed(&rng, hash_words(words, 3));
    zt_rng_shuffle_u64(&rng, dl->window_order, n);
    dl->window_order_valid = true;
    dl->window_order_epoch = epoch;
    dl->window_order_shard = shard;
}

static uint32_t read_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void write_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Opens and validates one shard. Returns 0 with *kept = true and s filled when the shard holds at least
 * one window, 0 with *kept = false (only s->ntok set, and a WARN line) when it is valid but too small, or
 * a negative code. */
static int open_shard(struct shard *s, bool *kept, const char *path, uint64_t bt, zt_err *err)
{
    memset(s, 0, sizeof(*s));
    *kept = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot open token shard %s: %s", path, strerror(e));
    }
    int rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        rc = zt_fail(err, -e, "cannot stat token shard %s: %s", path, strerror(e));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = zt_fail(err, ZT_EFORMAT, "%s is not a regular file; the data glob must match token shard files only",
                     path);
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < HEADER_BYTES) {
        rc = zt_fail(err, ZT_EFORMAT,
                     "%s: file has %" PRIu64 " bytes, less than the %d-byte shard header; it is truncated or "
                     "not a token shard (write shards with 'ztrain tokenize')",
                     path, size, HEADER_BYTES);
        goto out;
    }
    unsigned char header[HEADER_BYTES];
    ssize_t got = pread(fd, header, sizeof(header), 0);
    if (got != (ssize_t)sizeof(header)) {
        int e = got < 0 ? errno : EIO;
        rc = zt_fail(err, -e, "cannot read the header of token shard %s: %s", path, strerror(e));
        goto out;
    }
    int32_t magic = (int32_t)read_le32(header);
    int32_t version = (int32_t)read_le32(header + 4);
    int32_t count = (int32_t)read_le32(header + 8);
    if (magic != ZT_SHARD_MAGIC && magic != ZT_SHARD32_MAGIC) {
        rc = zt_fail(err, ZT_EFORMAT,
                     "%s: bad magic %" PRId32 " in header[0] (expected %d for 16-bit or %d for 32-bit tokens); "
                     "this is not a token shard (write shards with 'ztrain tokenize')",
                     path, magic, ZT_SHARD_MAGIC, ZT_SHARD32_MAGIC);
        goto out;
    }
    const int want_version = magic == ZT_SHARD_MAGIC ? ZT_SHARD_VERSION : ZT_SHARD32_VERSION;
    if (version != want_version) {
        rc = zt_fail(err, ZT_EFORMAT,
                     "%s: unsupported shard version %" PRId32 " in header[1] (this build reads version %d of "
                     "the %d-bit format); re-create the shard with 'ztrain tokenize'",
                     path, version, want_version, magic == ZT_SHARD_MAGIC ? 16 : 32);
        goto out;
    }
    const int width = magic == ZT_SHARD_MAGIC ? 2 : 4;
    if (count < 0) {
        rc = zt_fail(err, ZT_EFORMAT, "%s: negative token count %" PRId32 " in header[2]; the shard is corrupt",
                     path, count);
        goto out;
    }
    uint64_t ntok = (uint64_t)count;
    uint64_t expect = HEADER_BYTES + (uint64_t)width * ntok;
    if (size < expect) {
        rc = zt_fail(err, ZT_EFORMAT,
                     "%s: truncated: header says %" PRIu64 " tokens (%" PRIu64 " bytes) but the file has %" PRIu64
                     " bytes; re-create it with 'ztrain tokenize'",
                     path, ntok, expect, size);
        goto out;
    }
    if (size > expect) {
        rc = zt_fail(err, ZT_EFORMAT,
                     "%s: header says %" PRIu64 " tokens (%" PRIu64 " bytes) but the file has %" PRIu64
                     " bytes; the shard is corrupt, re-create it with 'ztrain tokenize'",
                     path, ntok, expect, size);
        goto out;
    }
    s->ntok = ntok; /* also for a shard that is skipped, for the caller's message */
    uint64_t nwin = ntok >= bt + 1 ? (ntok - 1) / bt : 0;
    if (nwin == 0) {
        ZT_WARN("data: skipping %s: it has %" PRIu64 " tokens, fewer than one window of %" PRIu64
                " (batch size x seq len + 1)",
                path, ntok, bt + 1);
        rc = 0;
        goto out;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        rc = zt_fail(err, -e, "cannot map token shard %s: %s", path, strerror(e));
        goto out;
    }
    s->path = strdup(path);
    if (!s->path) {
        munmap(map, (size_t)size);
        rc = zt_fail(err, ZT_ENOMEM, "out of memory opening %s", path);
        goto out;
    }
    s->map = map;
    s->map_len = (size_t)size;
    s->tokens = (const unsigned char *)map + HEADER_BYTES;
    s->width = width;
    s->ntok = ntok;
    s->nwin = nwin;
    *kept = true;
    rc = 0;
out:
    close(fd);
    return rc;
}

int zt_dataloader_open(zt_dataloader **out, const char *pattern, int B, int T, bool shuffle, uint64_t seed,
                       zt_err *err)
{
    *out = NULL;
    if (B < 1 || T < 1 || (int64_t)B * T > INT32_MAX)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "data loader: batch size %d and seq len %d must be at least 1 and their product at most "
                       "%d",
                       B, T, INT32_MAX);
    uint64_t bt = (uint64_t)B * (uint64_t)T;

    glob_t g;
    memset(&g, 0, sizeof(g));
    int grc = glob(pattern, 0, NULL, &g);
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return zt_fail(err, -ENOENT, "no files match '%s' (check the path; quote the glob)", pattern);
    }
    if (grc != 0) {
        globfree(&g);
        return zt_fail(err, grc == GLOB_NOSPACE ? ZT_ENOMEM : ZT_EIO,
                       "cannot expand the data glob '%s' (a folder in the path cannot be read)", pattern);
    }

    int rc;
    zt_dataloader *dl = calloc(1, sizeof(*dl));
    if (!dl) {
        globfree(&g);
        return zt_fail(err, ZT_ENOMEM, "out of memory opening the data loader");
    }
    dl->B = B;
    dl->T = T;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->shards = calloc(g.gl_pathc, sizeof(*dl->shards));
    if (!dl->shards) {
        rc = zt_fail(err, ZT_ENOMEM, "out of memory opening %zu token shards", g.gl_pathc);
        goto err;
    }

    uint64_t largest = 0; /* tokens in the largest shard, for the message when none is big enough */
    uint64_t max_nwin = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct shard s;
        bool kept;
        rc = open_shard(&s, &kept, g.gl_pathv[i], bt, err);
        if (rc != 0)
            goto err;
        if (s.ntok > largest)
            largest = s.ntok;
        if (!kept)
            continue;
        dl->shards[dl->nshards++] = s;
        dl->num_tokens += s.ntok;
        dl->batches_per_epoch += s.nwin;
        if (s.nwin > max_nwin)
            max_nwin = s.nwin;
    }
    if (dl->nshards == 0) {
        rc = zt_fail(err, ZT_EINVAL_CONFIG,
                     "none of the %zu shard(s) matching '%s' holds one window of %" PRIu64
                     " tokens (batch size %d x seq len %d + 1; the largest shard has %" PRIu64
                     "); lower --batch-size or --seq-len, or tokenize more text",
                     g.gl_pathc, pattern, bt + 1, B, T, largest);
        goto err;
    }

    /* One pass over every token: cheap next to training, and it lets the trainer reject data whose
     * tokens do not fit the model's vocabulary before the first step. */
    uint32_t max_token = 0;
    for (uint64_t i = 0; i < dl->nshards; i++) {
        const struct shard *sh = &dl->shards[i];
        for (uint64_t j = 0; j < sh->ntok; j++) {
            uint32_t t = token_at(sh, j);
            if (t > max_token)
                max_token = t;
        }
    }
    dl->max_token = max_token > INT32_MAX ? INT32_MAX : (int)max_token; /* saturated: no model has that many */

    dl->shard_order = calloc(dl->nshards, sizeof(uint64_t));
    dl->window_order = calloc(max_nwin, sizeof(uint64_t));
    if (!dl->shard_order || !dl->window_order) {
        rc = zt_fail(err, ZT_ENOMEM, "out of memory for the data order (%" PRIu64 " windows)", max_nwin);
        goto err;
    }
    globfree(&g);
    *out = dl;
    return 0;

err:
    globfree(&g);
    zt_dataloader_close(dl);
    return rc;
}

void zt_dataloader_close(zt_dataloader *dl)
{
    if (!dl)
        return;
    for (uint64_t i = 0; i < dl->nshards; i++) {
        munmap(dl->shards[i].map, dl->shards[i].map_len);
        free(dl->shards[i].path);
    }
    free(dl->shards);
    free(dl->shard_order);
    free(dl->window_order);
    free(dl);
}

void zt_dataloader_next(zt_dataloader *dl, int32_t *inputs, int32_t *targets)
{
    compute_shard_order(dl, dl->pos.epoch);
    uint64_t id = dl->shard_order[dl->pos.shard];
    const struct shard *s = &dl->shards[id];
    ZT_ASSERT(dl->pos.window < s->nwin);
    uint64_t k = dl->pos.window;
    if (dl->shuffle) {
        compute_window_order(dl, dl->pos.epoch, id);
        k = dl->window_order[k];
    }

    const int B = dl->B, T = dl->T;
    const uint64_t w = k * (uint64_t)B * (uint64_t)T;
    for (int b = 0; b < B; b++) {
        const uint64_t row = w + (uint64_t)b * (uint64_t)T;
        for (int t = 0; t < T; t++) {
            /* ids above INT32_MAX wrap negative here; the trainer refuses such data (max_token) first */
            inputs[(size_t)b * T + t] = (int32_t)token_at(s, row + (uint64_t)t);
            targets[(size_t)b * T + t] = (int32_t)token_at(s, row + (uint64_t)t + 1);
        }
    }

    /* Advance, keeping pos a valid position (window < nwin of its shard). */
    dl->pos.window++;
    if (dl->pos.window == s->nwin) {
        dl->pos.window = 0;
        dl->pos.shard++;
        if (dl->pos.shard == dl->nshards) {
            dl->pos.shard = 0;
            dl->pos.epoch++;
        }
    }
}

void zt_dataloader_reset(zt_dataloader *dl)
{
    dl->pos.epoch = 0;
    dl->pos.shard = 0;
    dl->pos.window = 0;
}

void zt_dataloader_get_position(const zt_dataloader *dl, zt_data_position *pos)
{
    *pos = dl->pos;
}

int zt_dataloader_set_position(zt_dataloader *dl, const zt_data_position *pos, zt_err *err)
{
    if (pos->shard >= dl->nshards)
        return zt_fail(err, ZT_EMISMATCH,
                       "saved data position (epoch %" PRIu64 ", shard %" PRIu64 ", window %" PRIu64
                       ") does not fit the data: it has %" PRIu64
                       " usable shard(s); resume with the same data files as the run that saved it",
                       pos->epoch, pos->shard, pos->window, dl->nshards);
    compute_shard_order(dl, pos->epoch);
    const struct shard *s = &dl->shards[dl->shard_order[pos->shard]];
    if (pos->window >= s->nwin)
        return zt_fail(err, ZT_EMISMATCH,
                       "saved data position (epoch %" PRIu64 ", shard %" PRIu64 ", window %" PRIu64
                       ") does not fit the data: that shard (%s) has %" PRIu64
                       " windows of batch size %d x seq len %d; resume with the same data files, batch size "
                       "and seq len as the run that saved it",
                       pos->epoch, pos->shard, pos->window, s->path, s->nwin, dl->B, dl->T);
    dl->pos = *pos;
    return 0;
}

uint64_t zt_dataloader_num_tokens(const zt_dataloader *dl)
{
    return dl->num_tokens;
}

int zt_dataloader_max_token(const zt_dataloader *dl)
{
    return dl->max_token;
}

uint64_t zt_dataloader_batches_per_epoch(const zt_dataloader *dl)
{
    return dl->batches_per_epoch;
}

int zt_shard_max_token(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    unsigned char header[HEADER_BYTES];
    if (fread(header, 1, sizeof header, f) != sizeof header) {
        fclose(f);
        return -1;
    }
    const int32_t magic = (int32_t)read_le32(header);
    const int width = magic == ZT_SHARD_MAGIC ? 2 : magic == ZT_SHARD32_MAGIC ? 4 : 0;
    int64_t left = (int32_t)read_le32(header + 8);
    uint32_t buf[1 << 14];
    int64_t max = -1;
    while (width && left > 0) {
        const size_t per = sizeof buf / (size_t)width;
        size_t want = left < (int64_t)per ? (size_t)left : per;
        size_t got = fread(buf, (size_t)width, want, f);
        if (got == 0)
            break;
        for (size_t i = 0; i < got; i++) {
            const uint32_t t = width == 2 ? ((const uint16_t *)buf)[i] : buf[i];
            if ((int64_t)t > max)
                max = t;
        }
        left -= (int64_t)got;
    }
    fclose(f);
    return max > INT32_MAX ? INT32_MAX : (int)max;
}

/* One shard file of n tokens of `width` bytes, in the format of that width. */
static int shard_write(const char *path, const void *tokens, size_t n, int width, zt_err *err)
{
    if (n > INT32_MAX)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: %zu tokens do not fit one shard (at most %d, the header holds an int32 count); "
                       "split the data into smaller shards",
                       path, n, INT32_MAX);
    unsigned char header[HEADER_BYTES];
    memset(header, 0, sizeof(header));
    write_le32(header, width == 2 ? ZT_SHARD_MAGIC : ZT_SHARD32_MAGIC);
    write_le32(header + 4, width == 2 ? ZT_SHARD_VERSION : ZT_SHARD32_VERSION);
    write_le32(header + 8, (uint32_t)n);
    /* The tokens are written as they are in memory: little-endian, as the assertion above ensures. */
    zt_file_part parts[2] = {{header, sizeof(header)}, {tokens, (size_t)width * n}};
    return zt_write_file_atomic_parts(path, parts, 2, err);
}

int zt_shard_write(const char *path, const uint16_t *tokens, size_t n, zt_err *err)
{
    return shard_write(path, tokens, n, 2, err);
}

int zt_shard_write32(const char *path, const uint32_t *tokens, size_t n, zt_err *err)
{
    return shard_write(path, tokens, n, 4, err);
}
