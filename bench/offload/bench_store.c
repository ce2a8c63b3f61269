/* NVMe tier throughput (offload/store.h): writes then reads TOTAL GiB of records through the store as a
 * state server would, with BUFS registered record buffers reused in a pipeline (record i+BUFS is queued
 * as soon as record i is waited for). Payload checksums are computed and verified as in real use.
 * Run by bench/offload/run.sh and bench/offload/disk.sh; never by ctest.
 *
 * usage: bench_store DIR TOTAL_GIB RECORD_MIB [QUEUE_DEPTH] [IO_KIB] [BUFS] [MODE]
 *   MODE rw (default): create the records, write them, read them, remove them;
 *        write: create and write them and leave them in DIR; read: read the records a `write` run left
 *        (same TOTAL_GIB and RECORD_MIB), as often as wanted with other settings, and leave them.
 * Reads also report the process's CPU seconds per GiB read (all threads). It also prints the
 * single-thread CRC-32C rate over one record buffer (crc_gbytes_s): the rate at which zt_store_wait can
 * check what arrives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/crc32c.h"
#include "offload/store.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds (user + system) of the process so far, all threads. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static int run(zt_store *s, int nrec, float **bufs, int nbufs, int is_write, zt_err *err)
{
    int tickets[256];
    for (int i = 0; i < nrec + nbufs; i++) {
        if (i >= nbufs) { /* the buffer of record i - nbufs is free again once its request is done */
            int rc = zt_store_wait(s, tickets[(i - nbufs) % nbufs], err);
            if (rc)
                return rc;
        }
        if (i < nrec) {
            zt_store_key k = {.run = 1, .block = (unsigned)i, .shard = 0};
            float *b = bufs[i % nbufs];
            int rc = is_write ? zt_store_write_async(s, k, b, &tickets[i % nbufs], err)
                              : zt_store_read_async(s, k, b, &tickets[i % nbufs], err);
            if (rc)
                return rc;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR TOTAL_GIB RECORD_MIB [QUEUE_DEPTH] [IO_KIB] [BUFS] [rw|write|read]\n", argv[0]);
        return 2;
    }
    double total_gib = atof(argv[2]), rec_mib = atof(argv[3]);
    int qd = argc > 4 ? atoi(argv[4]) : 32;
    size_t io = argc > 5 ? (size_t)atoi(argv[5]) * 1024 : 1 << 20;
    int nbufs = argc > 6 ? atoi(argv[6]) : 4;
    const char *mode = argc > 7 ? argv[7] : "rw";
    int do_write = strcmp(mode, "rw") == 0 || strcmp(mode, "write") == 0;
    int do_read = strcmp(mode, "rw") == 0 || strcmp(mode, "read") == 0;
    int keep = strcmp(mode, "rw") != 0;
    size_t n = (size_t)(rec_mib * 1048576.0 / 12.0);
    int nrec = (int)(total_gib * 1024.0 / rec_mib + 0.5);
    if (nbufs < 1 || nbufs > 64 || nrec < 1 || (!do_write && !do_read)) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    zt_store_config cfg = {.kind = ZT_STORE_NVME, .path = argv[1], .queue_depth = qd, .io_size = io};
    zt_store *s = NULL;
    zt_err err = {{0}};
    if (zt_store_open(&cfg, &s, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float *bufs[64];
    size_t lens[64];
    for (int i = 0; i < nbufs; i++) {
        bufs[i] = zt_store_buffer_alloc(n);
        lens[i] = zt_store_buffer_bytes(n);
        if (!bufs[i]) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        for (size_t j = 0; j < 3 * n; j++)
            bufs[i][j] = (float)(j % 1000) * 0.5f + (float)i;
    }
    int reg = zt_store_register_buffers(s, bufs, lens, nbufs, &err);
    if (reg)
        fprintf(stderr, "note: buffers not registered (%s); plain reads and writes\n", err.msg);
    for (int i = 0; i < nrec; i++) {
        zt_store_key k = {.run = 1, .block = (unsigned)i, .shard = 0};
        size_t have = 0;
        if (!do_write) { /* read mode: the records of an earlier write run */
            if (zt_store_lookup(s, k, &have) != 0 || have != n) {
                fprintf(stderr, "record %d of %zu elements is not in %s: run the same sizes with mode write first\n",
                        i, n, argv[1]);
                return 1;
            }
        } else if (zt_store_create(s, k, n, &err) != 0) {
            fprintf(stderr, "%s (mode write needs an empty directory)\n", err.msg);
            return 1;
        }
    }
    double bytes = (double)nrec * (double)zt_store_buffer_bytes(n);
    double tw = 0, tr = 0;
    if (do_write) {
        double t0 = now();
        if (run(s, nrec, bufs, nbufs, 1, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        tw = now() - t0;
    }
    double read_cpu = 0;
    if (do_read) {
        double c0 = cpu_seconds();
        double t0 = now();
        if (run(s, nrec, bufs, nbufs, 0, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        tr = now() - t0;
        read_cpu = cpu_seconds() - c0;
    }
    /* The checksum's rate on one thread, over a buffer just used (cache-cold for its larger part). */
    double t0 = now();
    volatile uint32_t crc = zt_crc32c(0, bufs[0], lens[0]);
    double tc = now() - t0;
    (void)crc;
    printf("store mode=%s records=%d record_mib=%.0f qd=%d io_kib=%zu bufs=%d registered=%s", mode, nrec, rec_mib,
           qd, io / 1024, nbufs, reg ? "no" : "yes");
    if (do_write)
        printf(" write_gbytes_s=%.2f", bytes / tw / 1e9);
    if (do_read)
        printf(" read_gbytes_s=%.2f read_cpu_s_gib=%.3f", bytes / tr / 1e9, read_cpu / (bytes / 1073741824.0));
    printf(" crc_gbytes_s=%.2f\n", (double)lens[0] / tc / 1e9);
    for (int i = 0; i < nrec && !keep; i++) {
        zt_store_key k = {.run = 1, .block = (unsigned)i, .shard = 0};
        zt_store_remove(s, k, NULL);
    }
    zt_store_close(s);
    for (int i = 0; i < nbufs; i++)
        zt_store_buffer_free(bufs[i]);
    return 0;
}
