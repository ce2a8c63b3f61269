/* bench_raw_tcp: the baseline of the state-service benchmark: copies N MiB over one loopback TCP
 * connection (a receiving thread reads into a 1 MiB buffer, the sender writes 1 MiB at a time) and
 * prints "raw_tcp mib=N seconds=S gib_s=R".
 *
 * usage: bench_raw_tcp MIB */
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)

static long long total;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *receiver(void *arg)
{
    int fd = accept(*(int *)arg, NULL, NULL);
    char *buf = malloc(CHUNK);
    long long got = 0;
    ssize_t n;
    while (got < total && (n = recv(fd, buf, CHUNK, 0)) > 0)
        got += n;
    free(buf);
    close(fd);
    return got == total ? NULL : (void *)1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench_raw_tcp MIB\n");
        return 2;
    }
    total = atoll(argv[1]) * (long long)CHUNK;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0) {
        perror("bench_raw_tcp: listen");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, receiver, &ls);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("bench_raw_tcp: connect");
        return 1;
    }
    char *buf = malloc(CHUNK);
    memset(buf, 1, CHUNK);
    double t0 = now();
    for (long long sent = 0; sent < total;) {
        ssize_t n = send(fd, buf, CHUNK, 0);
        if (n <= 0) {
            perror("bench_raw_tcp: send");
            return 1;
        }
        sent += n;
    }
    void *bad;
    pthread_join(t, &bad);
    double s = now() - t0;
    close(fd);
    close(ls);
    free(buf);
    if (bad != NULL) {
        fprintf(stderr, "bench_raw_tcp: the receiver got fewer bytes than sent\n");
        return 1;
    }
    printf("raw_tcp mib=%s seconds=%.3f gib_s=%.3f\n", argv[1], s, (double)total / s / (1 << 30));
    return 0;
}
