/* Raw sequential O_DIRECT reads or writes of one file through io_uring, with QUEUE_DEPTH requests of
 * IO_KIB each kept in flight and nothing else (no checksum, no header, no record files): the ceiling the
 * NVMe tier (offload/store.h) is compared with at the same queue depth and request size, where fio is
 * not installed. Run by bench/offload/disk.sh; never by ctest.
 *
 * usage: bench_rawio read|write FILE GIB QUEUE_DEPTH IO_KIB
 *   write creates (or overwrites) FILE with GIB GiB; read reads its first GIB GiB. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 6 || (strcmp(argv[1], "read") != 0 && strcmp(argv[1], "write") != 0)) {
        fprintf(stderr, "usage: %s read|write FILE GIB QUEUE_DEPTH IO_KIB\n", argv[0]);
        return 2;
    }
    int is_write = strcmp(argv[1], "write") == 0;
    size_t total = (size_t)(atof(argv[3]) * 1073741824.0);
    int qd = atoi(argv[4]);
    size_t io = (size_t)atoi(argv[5]) * 1024;
    if (qd < 1 || qd > 1024 || io == 0 || io % 4096 || total < io) {
        fprintf(stderr, "bad arguments: queue depth 1..1024, IO_KIB a multiple of 4, GIB at least one request\n");
        return 2;
    }
    total = total / io * io;
    int fd = open(argv[2], is_write ? O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT : O_RDONLY | O_DIRECT, 0600);
    if (fd < 0) {
        fprintf(stderr, "cannot open %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    /* One buffer per slot of the queue, all registered. */
    char *mem = NULL;
    if (posix_memalign((void **)&mem, 4096, (size_t)qd * io) != 0) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(mem, 0x5a, (size_t)qd * io);
    struct io_uring ring;
    int rc = io_uring_queue_init((unsigned)qd * 2, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-rc));
        return 1;
    }
    struct iovec iov = {.iov_base = mem, .iov_len = (size_t)qd * io};
    int fixed = io_uring_register_buffers(&ring, &iov, 1) == 0;

    size_t next = 0, done = 0;
    int inflight = 0;
    double t0 = now();
    int slot = 0;
    while (done < total) {
        /* Refill: every free slot takes the next request of the file. */
        while (inflight < qd && next < total) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe)
                break;
            char *p = mem + (size_t)slot * io;
            if (is_write)
                fixed ? io_uring_prep_write_fixed(sqe, fd, p, (unsigned)io, (off_t)next, 0)
                      : io_uring_prep_write(sqe, fd, p, (unsigned)io, (off_t)next);
            else
                fixed ? io_uring_prep_read_fixed(sqe, fd, p, (unsigned)io, (off_t)next, 0)
                      : io_uring_prep_read(sqe, fd, p, (unsigned)io, (off_t)next);
            slot = (slot + 1) % qd; /* with completions out of order two requests may share a slot's
                                      buffer; harmless here, since the data is never looked at */
            next += io;
            inflight++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe = NULL;
        rc = io_uring_wait_cqe(&ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0) {
            fprintf(stderr, "io_uring_wait_cqe: %s\n", strerror(-rc));
            return 1;
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            if (cqe->res != (int)io) {
                fprintf(stderr, "request failed: %s\n", cqe->res < 0 ? strerror(-cqe->res) : "short transfer");
                return 1;
            }
            done += io;
            inflight--;
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
    }
    if (is_write)
        fdatasync(fd);
    double t = now() - t0;
    printf("rawio op=%s qd=%d io_kib=%zu registered=%s gbytes_s=%.2f\n", argv[1], qd, io / 1024, fixed ? "yes" : "no",
           (double)total / t / 1e9);
    io_uring_queue_exit(&ring);
    close(fd);
    free(mem);
    return 0;
}
