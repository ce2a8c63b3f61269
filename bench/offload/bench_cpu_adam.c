/* CPU AdamW throughput (offload/cpu_adam.h): M params/s and the memory traffic it implies, for one
 * gradient dtype, instruction set and thread count. Run by bench/offload/run.sh; never by ctest.
 *
 * usage: bench_cpu_adam N_MILLIONS THREADS f32|f16|bf16 [out: none|f32|f16|bf16] [ITERS] [4k|huge] [moments: f32|bf16]
 * Bytes counted per element: param, m, v read and written (24; 16 with bf16 moments), the gradient read (4 or 2), the output
 * written (0, 2 or 4) -- what the loop itself loads and stores, as STREAM counts its arrays.
 * As the engine holds them, m, v and the output start as untouched zero pages (calloc), so the first
 * update also takes their pages (first_s); best_s is the fastest of the later ones. huge: the arrays are
 * advised to transparent huge pages (common/memory.h), as the engine's host arrays are. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/memory.h"
#include "common/safetensors.h"
#include "offload/cpu_adam.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static enum zt_dtype parse_dtype(const char *s)
{
    return strcmp(s, "bf16") == 0 ? ZT_DTYPE_BF16 : strcmp(s, "f16") == 0 ? ZT_DTYPE_F16 : ZT_DTYPE_F32;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s N_MILLIONS THREADS f32|f16|bf16 [none|f32|f16|bf16] [ITERS] [4k|huge] [f32|bf16]\n",
                argv[0]);
        return 2;
    }
    size_t n = (size_t)(atof(argv[1]) * 1e6);
    int threads = atoi(argv[2]);
    enum zt_dtype gdt = parse_dtype(argv[3]);
    const char *outs = argc > 4 ? argv[4] : "none";
    int has_out = strcmp(outs, "none") != 0;
    enum zt_dtype odt = parse_dtype(outs);
    int iters = argc > 5 ? atoi(argv[5]) : 10;
    const int huge = argc > 6 && strcmp(argv[6], "huge") == 0;
    const enum zt_dtype mdt = argc > 7 ? parse_dtype(argv[7]) : ZT_DTYPE_F32;
    size_t gsz = zt_dtype_size(gdt), osz = has_out ? zt_dtype_size(odt) : 0, msz = zt_dtype_size(mdt);

    float *param = malloc(n * 4);
    void *m = calloc(n, msz), *v = calloc(n, msz);
    void *grad = malloc(n * gsz), *out = has_out ? calloc(n, osz) : NULL;
    if (!param || !m || !v || !grad || (has_out && !out)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    if (huge) {
        zt_advise_huge_pages(param, n * 4);
        zt_advise_huge_pages(m, n * msz);
        zt_advise_huge_pages(v, n * msz);
        zt_advise_huge_pages(grad, n * gsz);
        zt_advise_huge_pages(out, n * osz);
    }
    /* First touch of the weights and gradients in parallel, with the same static split as the update. */
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        param[i] = 0.01f * (float)(i % 1000);
        if (gsz == 4)
            ((float *)grad)[i] = 1e-3f * (float)(i % 777);
        else
            ((unsigned short *)grad)[i] = (unsigned short)(0x3a00 + i % 256);
    }
    zt_cpu_adam_range r = {.param = param, .m = m, .v = v, .grad = grad, .grad_dtype = gdt, .out = out,
                           .out_dtype = odt, .n = n, .moment_dtype = mdt, .seed = 1};
    zt_adamw_params p = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                         .grad_scale = 1.0f, .step = 1};
    zt_err err = {{0}};
    double best = 1e30, first = 0.0;
    for (int it = 0; it < iters + 2; it++) {
        p.step = it + 1;
        r.seed = (uint64_t)p.step;
        double t0 = now();
        if (zt_cpu_adam_update(&r, &p, threads, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        if (it == 0)
            first = dt;
        if (it >= 2 && dt < best)
            best = dt;
    }
    double bytes = (double)n * (8.0 + 4.0 * (double)msz + (double)gsz + (double)osz);
    printf("adam isa=%s threads=%d n=%zu grad=%s out=%s moments=%s pages=%s best_s=%.6f mparams_s=%.1f "
           "gbytes_s=%.2f first_s=%.6f\n",
           zt_cpu_adam_isa_name(zt_cpu_adam_get_isa()), threads, n, zt_dtype_name(gdt), has_out ? outs : "none",
           zt_dtype_name(mdt), huge ? "huge" : "4k", best, (double)n / best / 1e6, bytes / best / 1e9, first);
    return 0;
}
