/* What the libFuzzer harnesses of tests/fuzz share: a scratch folder per process (in /dev/shm
 * when it exists, so that the fsyncs of atomic writes cost nothing), whole-file writes, removal of a
 * folder tree, and the seed-writing mode.
 *
 * Seeds. A harness run with ZT_FUZZ_WRITE_SEEDS=DIR writes the seed inputs it knows how to make (valid
 * messages, manifests, records made by ztrain's own writers) into DIR and exits; that is how the committed
 * corpora under tests/fuzz/corpus/<harness>/ were made (bench/fuzz/run.sh --seeds makes them again).
 * Harness code is test code: a failure of its own setup aborts with a message. */
#ifndef ZT_TESTS_FUZZ_COMMON_H
#define ZT_TESTS_FUZZ_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char fz_root[256];

static inline int fz_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Removes a folder tree (or a file); a missing one is fine. */
static inline void fz_rm_tree(const char *path)
{
    nftw(path, fz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static inline void fz_cleanup(void)
{
    if (fz_root[0])
        fz_rm_tree(fz_root);
}

/* The process's scratch folder, made on first use and removed at exit. */
static inline const char *fz_scratch(void)
{
    if (!fz_root[0]) {
        struct stat st;
        const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
        snprintf(fz_root, sizeof(fz_root), "%s/ztrain-fuzz-%d", base, (int)getpid());
        fz_rm_tree(fz_root);
        if (mkdir(fz_root, 0700) != 0) {
            fprintf(stderr, "fuzz: cannot create %s: %s\n", fz_root, strerror(errno));
            abort();
        }
        atexit(fz_cleanup);
    }
    return fz_root;
}

/* path = scratch/name, in out (cap bytes). */
static inline void fz_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", fz_scratch(), name);
}

/* Writes len bytes to path (created or truncated); aborts on failure. */
static inline void fz_write(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const uint8_t *p = data;
    while (fd >= 0 && len > 0) {
        ssize_t w = write(fd, p, len);
        if (w <= 0)
            break;
        p += w;
        len -= (size_t)w;
    }
    if (fd < 0 || len > 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
    close(fd);
}

/* Makes a folder (and keeps an existing one); aborts on failure. */
static inline void fz_mkdir(const char *path)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz: cannot create %s: %s\n", path, strerror(errno));
        abort();
    }
}

/* The seed folder of ZT_FUZZ_WRITE_SEEDS, or NULL when the harness fuzzes. */
static inline const char *fz_seed_dir(void)
{
    const char *d = getenv("ZT_FUZZ_WRITE_SEEDS");
    return d && d[0] ? d : NULL;
}

/* Writes one seed file DIR/name. */
static inline void fz_write_seed(const char *name, const void *data, size_t len)
{
    char path[512];
    fz_mkdir(fz_seed_dir());
    snprintf(path, sizeof(path), "%s/%s", fz_seed_dir(), name);
    fz_write(path, data, len);
}

/* Reads a whole file into a malloc'd buffer; aborts on failure. */
static inline uint8_t *fz_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz: cannot read %s: %s\n", path, strerror(errno));
        abort();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
        abort();
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Quiet logs: the code under test logs every refusal, which would drown the fuzzer's own output
 * (ZT_FUZZ_LOG=1 keeps them, to see what a given input does). */
static inline void fz_quiet(void)
{
    if (getenv("ZT_FUZZ_LOG"))
        return;
    zt_log_set_level((enum zt_log_level)(ZT_LOG_ERROR + 1)); /* above every level: nothing is printed */
}

#endif
