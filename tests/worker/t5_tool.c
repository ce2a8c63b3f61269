/* t5_tool: a small driver of the T5 model for the interop check tests/interop/t5_hf.py.
 *
 *   t5_tool [--device cuda] CONFIG_JSON SEED BATCH_FILE OUT_DIR [INIT_WEIGHTS]
 *
 * Reads a Hugging Face config.json, creates a model from SEED (or imports INIT_WEIGHTS: a safetensors file, an
 * index or a model folder), runs a forward and a backward pass on the batch, prints the mean loss with 9
 * significant digits on stdout, and writes into OUT_DIR (created if missing):
 *   model.safetensors   the weights as ztrain exports them, and config.json (a folder from_pretrained loads);
 *   outputs.safetensors "logits" [B,Td,V] and "grad.<Hugging Face name>" for every parameter: the gradient of
 *                       the mean loss (F32).
 *
 * BATCH_FILE: little-endian int32 values: B, Te, Td, then the encoder tokens [B,Te], the encoder lengths [B],
 * the decoder tokens [B,Td] and the targets [B,Td] (-1: ignored). Exit status 0 on success, 1 on a failure,
 * 2 on bad usage. With --device cuda (a CUDA build) the pass runs through the CUDA executor in fp32 instead
 * (tests/gpu/t5_cuda_pass.h); exit status 77 where no GPU is visible. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/safetensors.h"
#include "worker/models/family.h"
#include "worker/models/t5.h"

#ifdef ZT_WITH_CUDA
#include "tests/gpu/t5_cuda_pass.h"
#endif

static int die(const char *msg)
{
    fprintf(stderr, "t5_tool: error: %s\n", msg);
    return 1;
}

static int32_t *read_ints(FILE *f, size_t n)
{
    int32_t *p = malloc((n ? n : 1) * sizeof *p);
    if (!p || fread(p, sizeof *p, n, f) != n) {
        free(p);
        return NULL;
    }
    return p;
}

int main(int argc, char **argv)
{
    bool cuda = false;
    if (argc > 2 && strcmp(argv[1], "--device") == 0) {
        if (strcmp(argv[2], "cuda") != 0 && strcmp(argv[2], "cpu") != 0) {
            fprintf(stderr, "t5_tool: --device takes cpu or cuda, not '%s'\n", argv[2]);
            return 2;
        }
        cuda = strcmp(argv[2], "cuda") == 0;
        argc -= 2;
        argv += 2;
    }
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: t5_tool [--device cuda] CONFIG_JSON SEED BATCH_FILE OUT_DIR [INIT_WEIGHTS]\n");
        return 2;
    }
#ifdef ZT_WITH_CUDA
    int ngpu = 0;
    if (cuda && (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0)) {
        printf("no CUDA GPU: skipped\n");
        return 77;
    }
#else
    if (cuda)
        return die("this build has no CUDA backend (configure with -DZT_CUDA=ON)");
#endif
    const char *out_dir = argv[4], *init = argc == 6 ? argv[5] : NULL;
    const unsigned long long seed = strtoull(argv[2], NULL, 10);
    zt_err err = {{0}};
    zt_family_config cfg;
    if (zt_family_config_load(&cfg, argv[1], &err) < 0)
        return die(err.msg);
    FILE *f = fopen(argv[3], "rb");
    if (!f)
        return die(strerror(errno));
    int32_t hdr[3];
    if (fread(hdr, sizeof hdr[0], 3, f) != 3 || hdr[0] < 1 || hdr[1] < 1 || hdr[2] < 1)
        return die("the batch file must start with B, Te and Td (int32, at least 1)");
    const int B = hdr[0], Te = hdr[1], Td = hdr[2];
    int32_t *enc = read_ints(f, (size_t)B * Te), *lens = read_ints(f, (size_t)B);
    int32_t *dec = read_ints(f, (size_t)B * Td), *targets = read_ints(f, (size_t)B * Td);
    fclose(f);
    if (!enc || !lens || !dec || !targets)
        return die("the batch file ends early");
    if (Td > Te)
        return die("the decoder's length Td must be at most the encoder's Te (the targets sit in rows of Te)");

    zt_family_model *fm = NULL;
    if (zt_family_model_create(&fm, &cfg, B, Te, seed, &err) < 0 ||
        (init && zt_family_model_import(fm, init, &err) < 0) || zt_mkdir_p(out_dir, &err) < 0)
        return die(err.msg);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (zt_family_model_export(fm, path, &err) < 0)
        return die(err.msg);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (zt_family_config_save(&cfg, path, &err) < 0)
        return die(err.msg);

    zt_t5 *m = zt_family_model_host(fm);
    const zt_model_seq2seq s = {.decoder_tokens = dec, .Td = Td, .encoder_lens = lens};
    /* the targets as begin takes them: rows of Te, the decoder's Td first */
    int32_t *rows = malloc((size_t)B * Te * sizeof *rows);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Te; j++)
            rows[(size_t)b * Te + j] = j < Td ? targets[(size_t)b * Td + j] : -1;
    zt_family_model_zero_grad(fm);
    const int V = zt_family_config_vocab(&cfg);
    const size_t nlog = (size_t)B * Td * V;
    float *logits = malloc(nlog * sizeof *logits), *grads = zt_family_model_grads(fm), loss = 0.0f;
    if (!cuda) {
        loss = zt_t5_forward(m, enc, B, Te, &s, rows);
        memcpy(logits, zt_t5_logits(m), nlog * sizeof *logits);
        zt_t5_backward(m, 1.0f);
    }
#ifdef ZT_WITH_CUDA
    else {
        zt_model *g = NULL;
        if (zt_family_model_cuda(&g, fm, B, Te, 1, ZT_DTYPE_F32, NULL, &err) < 0)
            return die(err.msg);
        const int prc = zt_t5_cuda_pass(g, zt_family_model_params(fm), &s, enc, rows, B, Te, logits, grads, &loss);
        g->ops->destroy(g);
        if (prc < 0)
            return die("the CUDA pass failed (see above)");
    }
#endif
    free(rows);
    printf("%.9g\n", (double)loss);

    zt_st_writer *w = zt_st_writer_create();
    const int nt = zt_family_model_num_tensors(fm);
    char(*names)[112] = calloc((size_t)nt, sizeof *names);
    const int64_t shape[3] = {B, Td, V};
    int rc = zt_st_writer_add(w, "logits", ZT_DTYPE_F32, 3, shape, logits, &err);
    for (int i = 0; i < nt && rc == 0; i++) {
        const zt_param_info *t = zt_family_model_tensor(fm, i);
        snprintf(names[i], sizeof names[i], "grad.%s", t->name);
        rc = zt_st_writer_add(w, names[i], ZT_DTYPE_F32, t->ndim, t->shape, grads + t->offset, &err);
    }
    snprintf(path, sizeof path, "%s/outputs.safetensors", out_dir);
    if (rc == 0)
        rc = zt_st_writer_write(w, path, &err);
    zt_st_writer_destroy(w);
    free(names);
    free(logits);
    zt_family_model_destroy(fm);
    free(enc);
    free(lens);
    free(dec);
    free(targets);
    return rc < 0 ? die(err.msg) : 0;
}
