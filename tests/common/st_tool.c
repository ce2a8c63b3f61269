/* Test tool for the safetensors interop test (st_interop.py):
 *   st_tool write PATH [--no-bf16]   writes the fixed set of tensors described below, with metadata
 *   st_tool dump PATH [KEY...]       prints the tensors of PATH (file order) and the given metadata
 *                                    keys as JSON: {"tensors": [{"name", "dtype", "shape", "hex"}],
 *                                    "metadata": {KEY: value or null}}
 * The tensor values follow formulas that st_interop.py repeats, so each side checks the other. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/safetensors.h"

typedef struct tool_tensor {
    const char *name;
    enum zt_dtype dtype;
    int ndim;
    int64_t shape[3];
} tool_tensor;

/* Keep in step with TENSORS in st_interop.py. */
static const tool_tensor g_tensors[] = {
    {"h.0.attn.weight", ZT_DTYPE_F32, 2, {3, 4}},
    {"h.0.mlp.bias", ZT_DTYPE_F64, 1, {5}},
    {"wte.half", ZT_DTYPE_F16, 3, {2, 3, 2}},
    {"wte.bf16", ZT_DTYPE_BF16, 2, {1, 7}},
    {"i8", ZT_DTYPE_I8, 1, {10}},
    {"u8", ZT_DTYPE_U8, 2, {2, 5}},
    {"i16", ZT_DTYPE_I16, 2, {3, 3}},
    {"u16", ZT_DTYPE_U16, 1, {4}},
    {"i32", ZT_DTYPE_I32, 2, {2, 2}},
    {"u32", ZT_DTYPE_U32, 1, {6}},
    {"i64", ZT_DTYPE_I64, 1, {3}},
    {"u64", ZT_DTYPE_U64, 1, {3}},
    {"mask", ZT_DTYPE_BOOL, 2, {2, 3}},
    {"scalar", ZT_DTYPE_F32, 0, {0}},
    {"empty", ZT_DTYPE_F32, 2, {0, 4}},
};
#define N_TENSORS (sizeof(g_tensors) / sizeof(g_tensors[0]))

static const char *g_meta[][2] = {
    {"format", "pt"},
    {"note", "quote \" backslash \\ \xc3\xbcn\xc3\xaf" "code"},
};

/* IEEE half bits of a float that half represents exactly (zero or a normal value). */
static uint16_t f32_to_f16_exact(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
    if ((b & 0x7FFFFFFF) == 0)
        return sign;
    int exp = (int)((b >> 23) & 0xFF) - 127 + 15;
    return (uint16_t)(sign | (exp << 10) | ((b >> 13) & 0x3FF));
}

/* Element j of tensor t, stored little-endian (the machine's order) at out. */
static void element(int t, int64_t j, enum zt_dtype dtype, unsigned char *out)
{
    double fv = (double)(j - 5) * 0.25 + t;
    int64_t s = ((j * 37 + t) % 200) - 100;
    uint64_t u = (uint64_t)((j * 53 + t) % 250);
    float f = (float)fv;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    union {
        float f32;
        double f64;
        uint16_t u16;
        int8_t i8;
        uint8_t u8;
        int16_t i16;
        int32_t i32;
        uint32_t u32;
        int64_t i64;
        uint64_t u64;
    } v;
    switch (dtype) {
    case ZT_DTYPE_F32: v.f32 = f; break;
    case ZT_DTYPE_F64: v.f64 = fv; break;
    case ZT_DTYPE_F16: v.u16 = f32_to_f16_exact(f); break;
    case ZT_DTYPE_BF16: v.u16 = (uint16_t)(fb >> 16); break;
    case ZT_DTYPE_I8: v.i8 = (int8_t)s; break;
    case ZT_DTYPE_U8: v.u8 = (uint8_t)u; break;
    case ZT_DTYPE_I16: v.i16 = (int16_t)(s * 300); break;
    case ZT_DTYPE_U16: v.u16 = (uint16_t)(u * 260); break;
    case ZT_DTYPE_I32: v.i32 = (int32_t)(s * 20000000); break;
    case ZT_DTYPE_U32: v.u32 = (uint32_t)(u * 17000000u); break;
    case ZT_DTYPE_I64: v.i64 = s * 90000000000000000LL; break;
    case ZT_DTYPE_U64: v.u64 = u * 73000000000000000ULL; break;
    case ZT_DTYPE_BOOL: v.u8 = (uint8_t)((j + t) % 3 == 0); break;
    }
    memcpy(out, &v, zt_dtype_size(dtype));
}

static int cmd_write(const char *path, int with_bf16)
{
    zt_st_writer *w = zt_st_writer_create();
    unsigned char *bufs[N_TENSORS] = {0};
    zt_err err;
    int rc = 0;
    for (size_t i = 0; i < N_TENSORS && rc == 0; i++) {
        const tool_tensor *t = &g_tensors[i];
        if (t->dtype == ZT_DTYPE_BF16 && !with_bf16)
            continue;
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++)
            n *= t->shape[d];
        size_t es = zt_dtype_size(t->dtype);
        bufs[i] = malloc(n > 0 ? (size_t)n * es : 1);
        for (int64_t j = 0; j < n; j++)
            element((int)i, j, t->dtype, bufs[i] + (size_t)j * es);
        rc = zt_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, bufs[i], &err);
    }
    for (size_t k = 0; k < sizeof(g_meta) / sizeof(g_meta[0]) && rc == 0; k++)
        rc = zt_st_writer_add_metadata(w, g_meta[k][0], g_meta[k][1], &err);
    if (rc == 0)
        rc = zt_st_writer_write(w, path, &err);
    if (rc != 0)
        fprintf(stderr, "st_tool: %s\n", err.msg);
    for (size_t i = 0; i < N_TENSORS; i++)
        free(bufs[i]);
    zt_st_writer_destroy(w);
    return rc == 0 ? 0 : 1;
}

static int cmd_dump(const char *path, int nkeys, char **keys)
{
    zt_st_file *f;
    zt_err err;
    if (zt_st_open(path, &f, &err) != 0) {
        fprintf(stderr, "st_tool: %s\n", err.msg);
        return 1;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(root, "tensors");
    for (size_t i = 0; i < zt_st_count(f); i++) {
        const zt_st_tensor *t = zt_st_get(f, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "dtype", zt_dtype_name(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        char *hex = malloc(2 * t->nbytes + 1);
        const unsigned char *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++)
            snprintf(hex + 2 * k, 3, "%02x", p[k]);
        hex[2 * t->nbytes] = '\0';
        cJSON_AddStringToObject(o, "hex", hex);
        free(hex);
        cJSON_AddItemToArray(list, o);
    }
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    for (int k = 0; k < nkeys; k++) {
        const char *v = zt_st_metadata(f, keys[k]);
        cJSON_AddItemToObject(meta, keys[k], v != NULL ? cJSON_CreateString(v) : cJSON_CreateNull());
    }
    char *text = cJSON_PrintUnformatted(root);
    puts(text);
    free(text);
    cJSON_Delete(root);
    zt_st_close(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "write") == 0)
        return cmd_write(argv[2], !(argc >= 4 && strcmp(argv[3], "--no-bf16") == 0));
    if (argc >= 3 && strcmp(argv[1], "dump") == 0)
        return cmd_dump(argv[2], argc - 3, argv + 3);
    fprintf(stderr, "usage: st_tool write PATH [--no-bf16] | st_tool dump PATH [METADATA_KEY...]\n");
    return 2;
}
