/* Adam moments on disk (placement cpu with moments_dir; see engine.h): this rank's m and v of every block
 * live in one record per block of an NVMe store (offload/store.h: files read and written through io_uring,
 * O_DIRECT, with a checksum), m first, then v, in the moment dtype. The host AdamW (host_optimizer.c)
 * reads block b + 1's record while it updates block b and writes each record back behind it, through two
 * staging buffers; so the host holds two blocks' moments instead of the model's.
 *
 * With moments_ram_bytes the leading blocks (mram_blocks) keep theirs in host memory, as without a directory,
 * and only the others have records.
 *
 * With masters_disk the fp32 masters of the blocks from xram_blocks on (a subset of those with records) are in
 * the record too, before the moments: the update reads and writes a block's whole fp32 state in one record,
 * so the host holds the masters of the leading blocks only, and the compute-dtype copy the passes read.
 *
 * Across the step boundary: once an update's last writes are done, the host thread reads the records of the
 * first two blocks on disk into the two staging buffers (zt__mdisk_read_ahead), during the next step's passes,
 * so that the next update starts on records already in memory instead of waiting for the disk; the records do
 * not change in between (a skipped step leaves them, and anything else that reads or writes a record first
 * drops the reads ahead). The bytes are the same, only read earlier.
 *
 * A store record is sized in elements of 12 bytes (offload/store.h); a block's record takes the fewest that
 * hold 2 S_b moments. Rank r keeps its records in DIR/rank<r>. The records are created zero when the engine
 * starts: the directory holds the state of one run at a time, and what a previous run left there under the
 * same keys is replaced. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "offload/store.h"
#include "worker/engine/engine_internal.h"

/* The key of this rank's record of block b ("mom" in the run field keeps them apart from a state server's). */
static zt_store_key key_of(const zt_engine *e, int b)
{
    return (zt_store_key){.run = 0x6d6f6d656e7473ull, .block = (uint32_t)b, .shard = (uint32_t)e->rank};
}

size_t zt__mdisk_record_elems(const zt_engine *e, int b)
{
    const size_t bytes = zt__mdisk_moment_off(e, b) + 2 * e->blocks[b].shard * e->msize;
    return (bytes + 11) / 12;
}

/* The record elements of the largest block on disk. */
static size_t max_record_elems(const zt_engine *e)
{
    size_t most = 0;
    for (int b = e->mram_blocks; b < e->nb; b++) {
        size_t n = zt__mdisk_record_elems(e, b);
        most = n > most ? n : most;
    }
    return most;
}

size_t zt__mdisk_buffer_bytes(const zt_engine *e)
{
    return zt_store_buffer_bytes(max_record_elems(e));
}

size_t zt__mdisk_record_bytes(const zt_engine *e, int b)
{
    return zt_store_buffer_bytes(zt__mdisk_record_elems(e, b));
}

size_t zt__mdisk_bytes(const zt_engine *e)
{
    size_t sum = 0;
    for (int b = e->mram_blocks; b < e->nb; b++)
        sum += zt_store_buffer_bytes(zt__mdisk_record_elems(e, b)) + 4096; /* payload and header */
    return sum;
}

int zt__mdisk_open(zt_engine *e, zt_err *err)
{
    /* each rank its own store in its own folder: ranks sharing the directory never read each other's
     * records while they are being created */
    struct stat st;
    if (stat(e->moments_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return zt_fail(err, ZT_EINVAL_CONFIG, "Adam moments on disk: '%s' is not a directory; create it first (an "
                       "empty directory on a local disk)", e->moments_dir);
    char path[sizeof e->moments_dir + 32];
    snprintf(path, sizeof path, "%s/rank%d", e->moments_dir, e->rank);
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return zt_fail(err, -errno, "Adam moments on disk: cannot create '%s': %s", path, strerror(errno));
    zt_store_config cfg = {.kind = ZT_STORE_NVME, .path = path};
    int rc = zt_store_open(&cfg, &e->mstore, err);
    if (rc == ZT_EUNSUPPORTED && strstr(err->msg, "O_DIRECT")) {
        /* a file system without direct I/O (tmpfs): the page cache then holds the moments as well */
        zt_log(ZT_LOG_WARN, "moments: %s has no O_DIRECT: buffered I/O (the page cache will hold the moments "
               "too; use a directory on a disk)", e->moments_dir);
        cfg.buffered = 1;
        rc = zt_store_open(&cfg, &e->mstore, err);
    }
    char why[sizeof err->msg];
    if (rc < 0) {
        snprintf(why, sizeof why, "%s", err->msg);
        return zt_fail(err, rc, "Adam moments on disk in '%s': %s", e->moments_dir, why);
    }
    for (int b = e->mram_blocks; b < e->nb && rc == 0; b++) {
        const zt_store_key k = key_of(e, b);
        if (zt_store_lookup(e->mstore, k, NULL) == 0 && (rc = zt_store_remove(e->mstore, k, err)) < 0)
            break;
        rc = zt_store_create(e->mstore, k, zt__mdisk_record_elems(e, b), err);
    }
    if (rc < 0) {
        snprintf(why, sizeof why, "%s", err->msg);
        return zt_fail(err, rc, "Adam moments on disk in '%s': %s (free space there or choose another directory)",
                       e->moments_dir, why);
    }
    for (int i = 0; i < 2 && e->mram_blocks < e->nb; i++) {
        e->mbuf[i] = zt_store_buffer_alloc(max_record_elems(e));
        if (!e->mbuf[i])
            return zt_fail(err, ZT_ENOMEM, "out of host memory for the staging of the Adam moments (2 x %zu bytes)",
                           zt__mdisk_buffer_bytes(e));
    }
    return 0;
}

void zt__mdisk_read_ahead(zt_engine *e)
{
    for (int i = 0; i < 2; i++) {
        const int b = e->mram_blocks + i;
        ZT_ASSERT(e->mahead[i] < 0); /* the update took them */
        if (b >= e->nb)
            break;
        zt_err ignored;
        if (zt__mdisk_read_async(e, b, i, &e->mahead_ticket[i], &ignored) == 0)
            e->mahead[i] = b; /* a read that cannot be queued is queued again by the update, which reports it */
    }
}

void zt__mdisk_drop_ahead(zt_engine *e)
{
    for (int i = 0; i < 2; i++) {
        if (e->mahead[i] < 0)
            continue;
        zt_err ignored;
        (void)zt__mdisk_wait(e, e->mahead_ticket[i], &ignored); /* the record is read again where it is needed */
        e->mahead[i] = -1;
    }
}

void zt__mdisk_close(zt_engine *e)
{
    if (e->mstore)
        zt__mdisk_drop_ahead(e);
    zt_store_close(e->mstore); /* the records stay: they are this run's, replaced by the next */
    e->mstore = NULL;
    for (int i = 0; i < 2; i++) {
        zt_store_buffer_free(e->mbuf[i]);
        e->mbuf[i] = NULL;
    }
}

int zt__mdisk_read_async(zt_engine *e, int b, int buf, int *ticket, zt_err *err)
{
    return zt_store_read_async(e->mstore, key_of(e, b), e->mbuf[buf], ticket, err);
}

int zt__mdisk_write_async(zt_engine *e, int b, int buf, int *ticket, zt_err *err)
{
    return zt_store_write_async(e->mstore, key_of(e, b), e->mbuf[buf], ticket, err);
}

int zt__mdisk_wait(zt_engine *e, int ticket, zt_err *err)
{
    return zt_store_wait(e->mstore, ticket, err);
}

/* Block b's record: its masters (where it holds them) and its moments widened to fp32 (S_b floats each). */
int zt__mdisk_load(zt_engine *e, int b, float *master, float *m, float *v, zt_err *err)
{
    zt__mdisk_drop_ahead(e); /* staging buffer 0 is read into */
    int rc = zt_store_read(e->mstore, key_of(e, b), e->mbuf[0], err);
    if (rc < 0)
        return rc;
    const size_t n = e->blocks[b].shard;
    const char *rec = (const char *)e->mbuf[0];
    if (zt__mdisk_has_master(e, b))
        memcpy(master, rec, n * 4);
    rec += zt__mdisk_moment_off(e, b);
    zt_err cerr;
    if (zt_cpu_adam_widen(m, rec, e->o.moment_dtype, n, e->o.threads, &cerr) < 0 ||
        zt_cpu_adam_widen(v, rec + n * e->msize, e->o.moment_dtype, n, e->o.threads, &cerr) < 0)
        ZT_ASSERT(!"fp32 and bf16 are supported dtypes");
    return 0;
}

/* Writes block b's record: its masters (where it holds them) and its moments from fp32 (rounded to nearest
 * for bf16). */
int zt__mdisk_store(zt_engine *e, int b, const float *master, const float *m, const float *v, zt_err *err)
{
    zt__mdisk_drop_ahead(e); /* the record changes, and staging buffer 0 is written from */
    const size_t n = e->blocks[b].shard;
    char *rec = (char *)e->mbuf[0];
    if (zt__mdisk_has_master(e, b))
        memcpy(rec, master, n * 4);
    rec += zt__mdisk_moment_off(e, b);
    zt_err cerr;
    if (zt_cpu_adam_convert(rec, e->o.moment_dtype, m, n, e->o.threads, &cerr) < 0 ||
        zt_cpu_adam_convert(rec + n * e->msize, e->o.moment_dtype, v, n, e->o.threads, &cerr) < 0)
        ZT_ASSERT(!"fp32 and bf16 are supported dtypes");
    return zt_store_write(e->mstore, key_of(e, b), e->mbuf[0], err);
}
