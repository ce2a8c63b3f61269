/* Benchmark of the float CPU matmul (forward, dinp and dweight products) on the shapes a small GPT-2
 * trains with. Prints GFLOP/s for 1 and 2 threads (or the thread counts given as arguments).
 * Built with the tests but not registered with ctest: timings do not belong in pass/fail checks.
 *
 *   bench_matmul [threads...]      e.g. bench_matmul 1 2 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu_threads.h"
#include "kernels/matmul.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *random_floats(size_t n)
{
    float *x = malloc(sizeof(float) * n);
    if (!x) {
        fprintf(stderr, "bench_matmul: out of memory\n");
        exit(1);
    }
    unsigned s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        x[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return x;
}

enum { OP_FORWARD, OP_DWEIGHT, OP_BACKWARD };

/* Runs one operation once; OP_DWEIGHT is the backward without dinp, OP_BACKWARD computes both. */
static void run_op(int op, float *out, float *dinp, float *dw, float *db, const float *inp, const float *w,
                   const float *b, const float *dout, int n, int ic, int oc)
{
    if (op == OP_FORWARD)
        zt_cpu_matmul_forward(out, inp, w, b, n, ic, oc);
    else
        zt_cpu_matmul_backward(op == OP_BACKWARD ? dinp : NULL, dw, db, dout, inp, w, n, ic, oc);
}

/* Best time of one call of the operation over repetitions filling about 0.5 s. */
static double time_op(int op, float *out, float *dinp, float *dw, float *db, const float *inp, const float *w,
                      const float *b, const float *dout, int n, int ic, int oc)
{
    run_op(op, out, dinp, dw, db, inp, w, b, dout, n, ic, oc); /* warm caches and thread pool */
    double best = 1e30, start = now_seconds();
    int reps = 0;
    while (reps < 5 || (now_seconds() - start < 0.5 && reps < 500)) {
        double t0 = now_seconds();
        run_op(op, out, dinp, dw, db, inp, w, b, dout, n, ic, oc);
        double t = now_seconds() - t0;
        best = t < best ? t : best;
        reps++;
    }
    return best;
}

int main(int argc, char **argv)
{
    const int shapes[][3] = {{1024, 256, 1024}, {1024, 1024, 256}, {1024, 768, 2304}};
    int threads[8] = {1, 2};
    int nthreads = 2;
    if (argc > 1) {
        nthreads = 0;
        for (int i = 1; i < argc && nthreads < 8; i++)
            threads[nthreads++] = atoi(argv[i]);
    }
    printf("GFLOP/s, best of repeats; 'backward' is both products, 'dinp' is backward minus dweight-only\n");
    printf("%-18s %7s %9s %9s %9s %9s\n", "N x IC x OC", "threads", "forward", "backward", "dweight", "dinp");
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], ic = shapes[s][1], oc = shapes[s][2];
        float *inp = random_floats((size_t)n * ic), *w = random_floats((size_t)oc * ic);
        float *b = random_floats(oc), *dout = random_floats((size_t)n * oc);
        float *out = random_floats((size_t)n * oc), *dinp = random_floats((size_t)n * ic);
        float *dw = random_floats((size_t)oc * ic), *db = random_floats(oc);
        double flops = 2.0 * n * ic * oc;
        for (int t = 0; t < nthreads; t++) {
            zt_cpu_set_threads(threads[t]);
            double tf = time_op(OP_FORWARD, out, dinp, dw, db, inp, w, b, dout, n, ic, oc);
            double tw = time_op(OP_DWEIGHT, out, dinp, dw, db, inp, w, b, dout, n, ic, oc);
            double tb = time_op(OP_BACKWARD, out, dinp, dw, db, inp, w, b, dout, n, ic, oc);
            double ti = tb - tw > 1e-9 ? tb - tw : 1e-9; /* dinp = full backward minus the dweight part */
            char name[32];
            snprintf(name, sizeof(name), "%dx%dx%d", n, ic, oc);
            printf("%-18s %7d %9.1f %9.1f %9.1f %9.1f\n", name, threads[t], flops / tf * 1e-9,
                   2 * flops / tb * 1e-9, flops / tw * 1e-9, flops / ti * 1e-9);
        }
        free(inp); free(w); free(b); free(dout); free(out); free(dinp); free(dw); free(db);
    }
    return 0;
}
