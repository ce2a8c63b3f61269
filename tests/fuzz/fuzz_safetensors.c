/* libFuzzer harness: the safetensors reader (common/safetensors.c). The input is a whole file; the harness
 * opens it with zt_st_open and, when the reader accepts it, walks every tensor and reads every byte the
 * reader says is there (so a tensor pointing outside the mapping is caught by ASan) and the metadata. */
#include "fuzz_common.h"

#include "common/safetensors.h"

static char g_path[512];

/* A valid file of two tensors and metadata, written by ztrain's own writer. */
static void write_seeds(void)
{
    char path[512];
    fz_path(path, sizeof(path), "seed.safetensors");
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3c00, 0x4000, 0x4200};
    zt_st_writer *w = zt_st_writer_create();
    zt_err err;
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    if (zt_st_writer_add(w, "h.0.attn.weight", ZT_DTYPE_F32, 2, sa, a, &err) != 0 ||
        zt_st_writer_add(w, "wte", ZT_DTYPE_F16, 1, sb, b, &err) != 0 ||
        zt_st_writer_add_metadata(w, "format", "pt", &err) != 0 || zt_st_writer_write(w, path, &err) != 0) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
    zt_st_writer_destroy(w);
    size_t len;
    uint8_t *data = fz_read(path, &len);
    fz_write_seed("two_tensors.safetensors", data, len);
    /* The smallest valid file: an empty header object. */
    static const uint8_t empty[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    fz_write_seed("empty.safetensors", empty, sizeof(empty));
    free(data);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    fz_path(g_path, sizeof(g_path), "input.safetensors");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(g_path, data, size);
    zt_st_file *f = NULL;
    zt_err err;
    if (zt_st_open(g_path, &f, &err) != 0)
        return 0;
    volatile uint8_t sink = 0;
    (void)sink;
    for (size_t i = 0; i < zt_st_count(f); i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        sink ^= (uint8_t)strlen(t->name);
        sink ^= (uint8_t)zt_dtype_size(t->dtype);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++)
            sink ^= p[k];
        if (zt_st_find(f, t->name) != t)
            abort(); /* a name must find its own tensor */
    }
    const char *fmt = zt_st_metadata(f, "format");
    if (fmt)
        sink ^= (uint8_t)strlen(fmt);
    zt_st_close(f);
    return 0;
}
