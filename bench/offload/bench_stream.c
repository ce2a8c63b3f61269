/* STREAM-style triad a[i] = b[i] + s * c[i] over doubles with OpenMP, to measure the memory bandwidth
 * the CPU AdamW benchmark is compared with. Counts 24 bytes per element, as STREAM does (no
 * write-allocate traffic). Run by bench/offload/run.sh; never by ctest.
 *
 * usage: bench_stream N_MILLIONS THREADS [ITERS] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s N_MILLIONS THREADS [ITERS]\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)(atof(argv[1]) * 1e6);
    int threads = atoi(argv[2]);
    int iters = argc > 3 ? atoi(argv[3]) : 10;
    double *a = malloc(n * 8), *b = malloc(n * 8), *c = malloc(n * 8);
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    const double s = 3.0;
    double best = 1e30;
    for (int it = 0; it < iters + 1; it++) {
        double t0 = now();
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] + s * c[i];
        double dt = now() - t0;
        if (it >= 1 && dt < best)
            best = dt;
    }
    double check = a[n / 2];
    printf("triad threads=%d n=%zu best_s=%.6f gbytes_s=%.2f check=%.1f\n", threads, n, best, 24.0 * (double)n / best / 1e9,
           check);
    return 0;
}
