/* safetensors reading (mmap + full header validation) and writing (padded header, atomic write).
 * The checks follow the reference implementation (huggingface/safetensors): a file this reader accepts
 * is one that library accepts, and a file it writes that library reads. */
#include "common/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/json.h" /* the exact total size in a shard index */

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER 100000000ULL
/* Shape dims and offsets are JSON numbers (doubles in cJSON): above 2^53 they are no longer exact. */
#define ST_MAX_EXACT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} g_dtypes[] = {
    [ZT_DTYPE_F32] = {"F32", 4}, [ZT_DTYPE_F16] = {"F16", 2},   [ZT_DTYPE_BF16] = {"BF16", 2},
    [ZT_DTYPE_F64] = {"F64", 8}, [ZT_DTYPE_I8] = {"I8", 1},     [ZT_DTYPE_U8] = {"U8", 1},
    [ZT_DTYPE_I16] = {"I16", 2}, [ZT_DTYPE_U16] = {"U16", 2},   [ZT_DTYPE_I32] = {"I32", 4},
    [ZT_DTYPE_U32] = {"U32", 4}, [ZT_DTYPE_I64] = {"I64", 8},   [ZT_DTYPE_U64] = {"U64", 8},
    [ZT_DTYPE_BOOL] = {"BOOL", 1},
};
#define N_DTYPES (sizeof(g_dtypes) / sizeof(g_dtypes[0]))

/* Bytes per element of dtype; 0 for a value outside the enum. */
size_t zt_dtype_size(enum zt_dtype dtype)
{
    if ((unsigned)dtype >= N_DTYPES)
        return 0;
    return g_dtypes[dtype].size;
}

/* The safetensors name of dtype ("F32", ...); "?" for a value outside the enum. */
const char *zt_dtype_name(enum zt_dtype dtype)
{
    if ((unsigned)dtype >= N_DTYPES)
        return "?";
    return g_dtypes[dtype].name;
}

/* Parses a safetensors dtype name (exact case, as the format writes them); returns 0 or ZT_EFORMAT. */
int zt_dtype_parse(const char *name, enum zt_dtype *out)
{
    for (size_t i = 0; i < N_DTYPES; i++) {
        if (name != NULL && strcmp(name, g_dtypes[i].name) == 0) {
            *out = (enum zt_dtype)i;
            return 0;
        }
    }
    return ZT_EFORMAT;
}

/* True when s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            min = 0x80;
            c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            min = 0x800;
            c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            min = 0x10000;
            c &= 0x07;
        } else {
            return false;
        }
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            c = (c << 6) | (s[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* Reading                                                                                         */

struct zt_st_file {
    void *map;              /* the whole file, read-only */
    size_t map_len;         /* bytes */
    cJSON *header;          /* parsed header; tensor names and metadata strings point into it */
    const cJSON *metadata;  /* the "__metadata__" object, or NULL */
    zt_st_tensor *tensors;  /* count entries, in data-offset order */
    size_t count;
    size_t *by_name;        /* indices into tensors, sorted by name, for zt_st_find */
};

/* Offsets of one tensor during validation; begin/end are relative to the data buffer. */
typedef struct st_range {
    uint64_t begin, end;
    size_t index;
} st_range;

static int cmp_range(const void *a, const void *b, void *tensors)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    const zt_st_tensor *t = tensors;
    return strcmp(t[x->index].name, t[y->index].name);
}

static int cmp_name(const void *a, const void *b, void *tensors)
{
    const zt_st_tensor *t = tensors;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* Reads a JSON number that must be a whole number in [0, 2^53]; false otherwise. */
static bool json_count(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return false;
    double v = item->valuedouble;
    if (!(v >= 0.0 && v <= ST_MAX_EXACT) || v != floor(v))
        return false;
    *out = (uint64_t)v;
    return true;
}

/* Validates the entry of one tensor and fills t (except data) and its byte range. */
static int parse_tensor(const char *path, const cJSON *entry, uint64_t buffer_len, zt_st_tensor *t, st_range *range,
                        zt_err *err)
{
    const char *name = entry->string;
    if (!cJSON_IsObject(entry))
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': expected an object with dtype, shape and data_offsets",
                       path, name);
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (const cJSON *f = entry->child; f != NULL; f = f->next) {
        const cJSON **slot = NULL;
        if (strcmp(f->string, "dtype") == 0)
            slot = &dtype;
        else if (strcmp(f->string, "shape") == 0)
            slot = &shape;
        else if (strcmp(f->string, "data_offsets") == 0)
            slot = &offsets;
        else
            return zt_fail(err, ZT_EFORMAT,
                           "%s: tensor '%s': unexpected field '%s' (only dtype, shape and data_offsets are allowed)",
                           path, name, f->string);
        if (*slot != NULL)
            return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': field '%s' appears twice", path, name, f->string);
        *slot = f;
    }
    if (dtype == NULL || shape == NULL || offsets == NULL)
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': missing field '%s'", path, name,
                       dtype == NULL ? "dtype" : shape == NULL ? "shape" : "data_offsets");

    t->name = name;
    if (!cJSON_IsString(dtype))
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': dtype must be a string", path, name);
    if (zt_dtype_parse(dtype->valuestring, &t->dtype) != 0)
        return zt_fail(err, ZT_EFORMAT,
                       "%s: tensor '%s': unknown dtype '%s' (ztrain reads F32, F16, BF16, F64, I8, U8, I16, U16, I32, "
                       "U32, I64, U64 and BOOL)",
                       path, name, dtype->valuestring);

    if (!cJSON_IsArray(shape))
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': shape must be an array of whole numbers", path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ZT_ST_MAX_DIMS)
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': %d dimensions, ztrain reads at most %d", path, name, ndim,
                       ZT_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t nbytes = zt_dtype_size(t->dtype);
    int d = 0;
    for (const cJSON *dim = shape->child; dim != NULL; dim = dim->next, d++) {
        uint64_t v;
        if (!json_count(dim, &v))
            return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': shape[%d] must be a whole number from 0 to 2^53", path,
                           name, d);
        t->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(nbytes, v, &nbytes))
            return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': the size of shape overflows 64 bits", path, name);
    }

    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': data_offsets must be an array [begin, end]", path, name);
    uint64_t begin, end;
    if (!json_count(offsets->child, &begin) || !json_count(offsets->child->next, &end))
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s': data_offsets must be whole numbers from 0 to 2^53", path,
                       name);
    if (begin > end || end > buffer_len)
        return zt_fail(err, ZT_EFORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] are not a range inside the %llu-byte data buffer "
                       "(the file may be truncated)",
                       path, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)buffer_len);
    if (end - begin != nbytes)
        return zt_fail(err, ZT_EFORMAT,
                       "%s: tensor '%s': shape and dtype %s make %llu bytes, data_offsets [%llu, %llu] hold %llu", path,
                       name, zt_dtype_name(t->dtype), (unsigned long long)nbytes, (unsigned long long)begin,
                       (unsigned long long)end, (unsigned long long)(end - begin));
    t->nbytes = (size_t)nbytes;
    range->begin = begin;
    range->end = end;
    return 0;
}

static int check_metadata(const char *path, const cJSON *meta, zt_err *err)
{
    if (!cJSON_IsObject(meta))
        return zt_fail(err, ZT_EFORMAT, "%s: __metadata__ must be an object of strings", path);
    for (const cJSON *m = meta->child; m != NULL; m = m->next) {
        if (!cJSON_IsString(m))
            return zt_fail(err, ZT_EFORMAT, "%s: __metadata__ entry '%s' must be a string", path, m->string);
        for (const cJSON *p = meta->child; p != m; p = p->next)
            if (strcmp(p->string, m->string) == 0)
                return zt_fail(err, ZT_EFORMAT, "%s: __metadata__ entry '%s' appears twice", path, m->string);
    }
    return 0;
}

/* Parses and validates the header of a mapped file; fills f->header, f->tensors, f->count, f->by_name. */
static int parse_header(const char *path, zt_st_file *f, zt_err *err)
{
    const unsigned char *bytes = f->map;
    if (f->map_len < 8)
        return zt_fail(err, ZT_EFORMAT,
                       "%s: file is %zu bytes, too short for a safetensors file (at least 8); it may be truncated",
                       path, f->map_len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | bytes[i];
    if (n > ST_MAX_HEADER)
        return zt_fail(err, ZT_EFORMAT,
                       "%s: header length %llu is above the 100 MB limit of the format; this is not a safetensors "
                       "file or it is corrupt",
                       path, (unsigned long long)n);
    if (n > f->map_len - 8)
        return zt_fail(err, ZT_EFORMAT, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                       path, (unsigned long long)n, f->map_len);
    const char *hdr = (const char *)bytes + 8;
    if (n == 0 || hdr[0] != '{')
        return zt_fail(err, ZT_EFORMAT, "%s: header does not start with '{'; this is not a safetensors file", path);
    if (memchr(hdr, '\0', n) != NULL || !utf8_valid((const unsigned char *)hdr, n))
        return zt_fail(err, ZT_EFORMAT, "%s: header is not valid UTF-8 JSON text", path);

    char *text = malloc(n + 1);
    if (text == NULL)
        return zt_fail(err, ZT_ENOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)n);
    memcpy(text, hdr, n);
    text[n] = '\0';
    const char *end = NULL;
    f->header = cJSON_ParseWithOpts(text, &end, 1);
    size_t err_pos = f->header == NULL && end != NULL ? (size_t)(end - text) : 0;
    free(text);
    if (f->header == NULL)
        return zt_fail(err, ZT_EFORMAT, "%s: header is not valid JSON (error at byte %zu of the header)", path,
                       err_pos);
    if (!cJSON_IsObject(f->header))
        return zt_fail(err, ZT_EFORMAT, "%s: header must be a JSON object", path);

    uint64_t buffer_len = f->map_len - 8 - n;
    size_t cap = 0;
    for (const cJSON *c = f->header->child; c != NULL; c = c->next)
        cap++;
    f->tensors = calloc(cap ? cap : 1, sizeof(*f->tensors));
    st_range *ranges = calloc(cap ? cap : 1, sizeof(*ranges));
    f->by_name = calloc(cap ? cap : 1, sizeof(*f->by_name));
    if (f->tensors == NULL || ranges == NULL || f->by_name == NULL) {
        free(ranges);
        return zt_fail(err, ZT_ENOMEM, "%s: out of memory for %zu tensor entries", path, cap);
    }

    int rc = 0;
    size_t count = 0;
    for (const cJSON *c = f->header->child; c != NULL && rc == 0; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (f->metadata != NULL)
                rc = zt_fail(err, ZT_EFORMAT, "%s: __metadata__ appears twice", path);
            else if ((rc = check_metadata(path, c, err)) == 0)
                f->metadata = c;
            continue;
        }
        rc = parse_tensor(path, c, buffer_len, &f->tensors[count], &ranges[count], err);
        ranges[count].index = count;
        count++;
    }
    if (rc != 0)
        goto out;

    /* Unique names. */
    for (size_t i = 0; i < count; i++)
        f->by_name[i] = i;
    qsort_r(f->by_name, count, sizeof(size_t), cmp_name, f->tensors);
    for (size_t i = 1; i < count; i++) {
        if (strcmp(f->tensors[f->by_name[i]].name, f->tensors[f->by_name[i - 1]].name) == 0) {
            rc = zt_fail(err, ZT_EFORMAT, "%s: tensor '%s' appears twice", path, f->tensors[f->by_name[i]].name);
            goto out;
        }
    }

    /* The ranges, in offset order, must tile the buffer: each starts where the previous one ended. */
    qsort_r(ranges, count, sizeof(st_range), cmp_range, f->tensors);
    uint64_t expect = 0;
    for (size_t i = 0; i < count; i++) {
        const char *name = f->tensors[ranges[i].index].name;
        if (ranges[i].begin < expect) {
            rc = zt_fail(err, ZT_EFORMAT, "%s: tensor '%s' at bytes [%llu, %llu) overlaps the tensor before it", path,
                         name, (unsigned long long)ranges[i].begin, (unsigned long long)ranges[i].end);
            goto out;
        }
        if (ranges[i].begin > expect) {
            rc = zt_fail(err, ZT_EFORMAT, "%s: gap of %llu bytes in the data buffer before tensor '%s' (at byte %llu)",
                         path, (unsigned long long)(ranges[i].begin - expect), name, (unsigned long long)expect);
            goto out;
        }
        expect = ranges[i].end;
    }
    if (expect != buffer_len) {
        rc = zt_fail(err, ZT_EFORMAT,
                     "%s: the tensors cover %llu bytes of the %llu-byte data buffer; the rest belongs to no tensor",
                     path, (unsigned long long)expect, (unsigned long long)buffer_len);
        goto out;
    }

    /* Tensors in data-offset order; by_name is rebuilt for the new positions. */
    zt_st_tensor *sorted = calloc(count ? count : 1, sizeof(*sorted));
    if (sorted == NULL) {
        rc = zt_fail(err, ZT_ENOMEM, "%s: out of memory for %zu tensor entries", path, count);
        goto out;
    }
    const char *data = (const char *)bytes + 8 + n;
    for (size_t i = 0; i < count; i++) {
        sorted[i] = f->tensors[ranges[i].index];
        sorted[i].data = data + ranges[i].begin;
    }
    free(f->tensors);
    f->tensors = sorted;
    f->count = count;
    for (size_t i = 0; i < count; i++)
        f->by_name[i] = i;
    qsort_r(f->by_name, count, sizeof(size_t), cmp_name, f->tensors);

out:
    free(ranges);
    return rc;
}

/* Opens, maps and validates path; see safetensors.h. */
int zt_st_open(const char *path, zt_st_file **out, zt_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zt_fail(err, -e, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return zt_fail(err, -e, "cannot open %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zt_fail(err, ZT_EFORMAT, "%s: not a regular file", path);
    }
    zt_st_file *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        close(fd);
        return zt_fail(err, ZT_ENOMEM, "%s: out of memory", path);
    }
    f->map_len = (size_t)st.st_size;
    if (f->map_len >= 8) {
        f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            int e = errno;
            f->map = NULL;
            close(fd);
            zt_st_close(f);
            return zt_fail(err, -e, "cannot map %s: %s", path, strerror(e));
        }
    }
    close(fd);
    int rc = parse_header(path, f, err);
    if (rc != 0) {
        zt_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* Unmaps the file and frees everything zt_st_open allocated; accepts NULL. */
void zt_st_close(zt_st_file *f)
{
    if (f == NULL)
        return;
    if (f->map != NULL)
        munmap(f->map, f->map_len);
    cJSON_Delete(f->header);
    free(f->tensors);
    free(f->by_name);
    free(f);
}

/* Number of tensors in the file. */
size_t zt_st_count(const zt_st_file *f)
{
    return f->count;
}

/* The i-th tensor in data-offset order; i must be below zt_st_count(f). */
const zt_st_tensor *zt_st_get(const zt_st_file *f, size_t i)
{
    ZT_ASSERT(i < f->count);
    return &f->tensors[i];
}

/* The tensor called name, or NULL when the file has none. */
const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name)
{
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const zt_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* The value of a "__metadata__" key, or NULL. */
const char *zt_st_metadata(const zt_st_file *f, const char *key)
{
    if (f->metadata == NULL)
        return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->metadata, key);
    return v != NULL ? v->valuestring : NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* Values and checkpoints                                                                          */

/* Gives back the mapping's pages under bytes [src, src + bytes) of f's mapping: whole pages around the range (a
 * read-only mapping of the file, so a neighbour's page given back too is only read again). */
static void release_range(const zt_st_file *f, const char *src, size_t bytes)
{
    if (bytes == 0)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), base = (uintptr_t)f->map;
    const uintptr_t lo = ((uintptr_t)src - base) / page * page, hi = (uintptr_t)src + bytes - base;
    (void)madvise((char *)f->map + lo, hi - lo, MADV_DONTNEED);
}

/* Copies a range of a tensor out of the mapping and drops the mapping's pages of it; see safetensors.h. */
void zt_st_copy_out(const zt_st_file *f, const zt_st_tensor *t, size_t offset, void *dst, size_t bytes)
{
    ZT_ASSERT(offset <= t->nbytes && bytes <= t->nbytes - offset);
    if (bytes == 0)
        return;
    const char *src = (const char *)t->data + offset;
    memcpy(dst, src, bytes);
    release_range(f, src, bytes);
}

/* Drops the mapping's pages of a tensor; see safetensors.h. */
void zt_st_release(const zt_st_file *f, const zt_st_tensor *t)
{
    release_range(f, t->data, t->nbytes);
}

/* F32, F16 and BF16: the dtypes zt_st_element_f32 reads. */
bool zt_st_dtype_is_f32_readable(enum zt_dtype dtype)
{
    return dtype == ZT_DTYPE_F32 || dtype == ZT_DTYPE_F16 || dtype == ZT_DTYPE_BF16;
}

/* Frees the list of zt_st_shard_files. */
void zt_st_shard_files_free(char **files, int n)
{
    for (int i = 0; files && i < n; i++)
        free(files[i]);
    free(files);
}

/* A list of one file. */
static void one_file(const char *path, char ***files, int *n)
{
    *files = zt_xcalloc(1, sizeof **files);
    (*files)[0] = zt_xstrdup(path);
    *n = 1;
}

/* The files of a checkpoint: path itself, the shards of an index, or a directory's model.safetensors or
 * index (see the header). */
int zt_st_shard_files(const char *path, char ***files, int *n, zt_err *err)
{
    *files = NULL;
    *n = 0;
    char probe[4096];
    const char *index = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(probe, sizeof probe, "%s/model.safetensors", path);
        if (access(probe, F_OK) == 0) {
            one_file(probe, files, n);
            return 0;
        }
        snprintf(probe, sizeof probe, "%s/model.safetensors.index.json", path);
        if (access(probe, F_OK) != 0)
            return zt_fail(err, -ENOENT, "%s: a directory without model.safetensors or model.safetensors.index.json "
                           "(give the safetensors file, the index or the directory of a Hugging Face model)", path);
        index = probe;
    } else {
        const size_t len = strlen(path);
        if (len > 5 && strcmp(path + len - 5, ".json") == 0)
            index = path;
    }
    if (!index) {
        one_file(path, files, n);
        return 0;
    }
    char *text = NULL;
    size_t tlen = 0;
    int rc = zt_read_file(index, &text, &tlen, err);
    if (rc < 0)
        return rc;
    cJSON *root = cJSON_ParseWithLength(text, tlen);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map) || !map->child) {
        cJSON_Delete(root);
        return zt_fail(err, ZT_EFORMAT, "%s: not a safetensors index (expected a JSON object with a \"weight_map\" "
                       "of tensor names to shard files)", index);
    }
    /* the folder of the index: the shards' names are relative to it */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", index);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    int cap = 0;
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0) {
            rc = zt_fail(err, ZT_EFORMAT, "%s: weight_map entry '%s' must name a shard file in the index's folder",
                         index, e->string ? e->string : "?");
            break;
        }
        char shard[4096 + 256];
        snprintf(shard, sizeof shard, "%s%s", dir, e->valuestring);
        bool known = false;
        for (int i = 0; i < *n && !known; i++)
            known = strcmp((*files)[i], shard) == 0;
        if (known)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            *files = zt_xrealloc(*files, (size_t)cap * sizeof **files);
        }
        (*files)[(*n)++] = zt_xstrdup(shard);
    }
    cJSON_Delete(root);
    if (rc < 0) {
        zt_st_shard_files_free(*files, *n);
        *files = NULL;
        *n = 0;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* Writing                                                                                         */

typedef struct st_wtensor {
    char *name;
    enum zt_dtype dtype;
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    const void *data; /* borrowed; NULL for a declared tensor (zt_st_writer_declare) */
    size_t nbytes;
    uint64_t offset;  /* zt_st_writer_begin: first byte of its data in the file */
} st_wtensor;

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct zt_st_writer {
    st_wtensor *tensors;
    size_t count, cap;
    st_meta *meta;
    size_t nmeta, meta_cap;
    int fd;           /* zt_st_writer_begin .. zt_st_writer_finish: the open path.tmp, else -1 */
    char *path;       /* ... and the file it becomes */
    uint64_t size;    /* ... its size */
    uint64_t data_start; /* ... where its data buffer begins (after the length and the header) */
};

/* A new, empty writer; aborts only when out of memory. Free with zt_st_writer_destroy. */
zt_st_writer *zt_st_writer_create(void)
{
    zt_st_writer *w = zt_xcalloc(1, sizeof(zt_st_writer));
    w->fd = -1;
    return w;
}

/* A streamed file that was begun and not finished: closed, and its .tmp removed. */
static void writer_abandon(zt_st_writer *w)
{
    if (w->fd < 0)
        return;
    close(w->fd);
    w->fd = -1;
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", w->path) < (int)sizeof(tmp))
        unlink(tmp);
}

/* Frees the writer and its copies of names and metadata; accepts NULL. */
void zt_st_writer_destroy(zt_st_writer *w)
{
    if (w == NULL)
        return;
    writer_abandon(w);
    free(w->path);
    for (size_t i = 0; i < w->count; i++)
        free(w->tensors[i].name);
    for (size_t i = 0; i < w->nmeta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->tensors);
    free(w->meta);
    free(w);
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = zt_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

/* A tensor with its data (borrowed) or, declared, without. */
static int add_tensor(zt_st_writer *w, const char *name, enum zt_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, bool declared, zt_err *err)
{
    if (w->fd >= 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s' added after zt_st_writer_begin", name);
    if (name == NULL || name[0] == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: a tensor needs a non-empty name");
    if (!utf8_valid((const unsigned char *)name, strlen(name)))
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor name '%s' is not valid UTF-8", name);
    if (strcmp(name, "__metadata__") == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: '__metadata__' is reserved and cannot name a tensor");
    if (zt_dtype_size(dtype) == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s': unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > ZT_ST_MAX_DIMS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s': %d dimensions (0 to %d are allowed)", name,
                       ndim, ZT_ST_MAX_DIMS);
    uint64_t nbytes = zt_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s': shape[%d] = %lld is negative", name, d,
                           (long long)shape[d]);
        if (__builtin_mul_overflow(nbytes, (uint64_t)shape[d], &nbytes) || nbytes > (uint64_t)ST_MAX_EXACT)
            return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s': size of the shape is too large", name);
    }
    if (!declared && data == NULL && nbytes > 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s': data is NULL", name);
    for (size_t i = 0; i < w->count; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s' was added twice", name);

    if (w->count == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 16;
        st_wtensor *bigger = realloc(w->tensors, w->cap * sizeof(*bigger));
        ZT_ASSERT(bigger != NULL);
        w->tensors = bigger;
    }
    st_wtensor *t = &w->tensors[w->count++];
    memset(t, 0, sizeof(*t));
    t->name = xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->data = declared ? NULL : data;
    t->nbytes = (size_t)nbytes;
    return 0;
}

/* Adds a tensor (name copied, data borrowed until zt_st_writer_write returns); see safetensors.h. */
int zt_st_writer_add(zt_st_writer *w, const char *name, enum zt_dtype dtype, int ndim, const int64_t *shape,
                     const void *data, zt_err *err)
{
    return add_tensor(w, name, dtype, ndim, shape, data, false, err);
}

/* Adds a tensor whose bytes come later through zt_st_writer_put; see safetensors.h. */
int zt_st_writer_declare(zt_st_writer *w, const char *name, enum zt_dtype dtype, int ndim, const int64_t *shape,
                         zt_err *err)
{
    return add_tensor(w, name, dtype, ndim, shape, NULL, true, err);
}

/* Adds a "__metadata__" entry; both strings are copied. A key given twice is an error. */
int zt_st_writer_add_metadata(zt_st_writer *w, const char *key, const char *value, zt_err *err)
{
    if (key == NULL || value == NULL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: metadata key and value must not be NULL");
    if (!utf8_valid((const unsigned char *)key, strlen(key)) ||
        !utf8_valid((const unsigned char *)value, strlen(value)))
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: metadata '%s' is not valid UTF-8", key);
    for (size_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[i].key, key) == 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: metadata key '%s' was added twice", key);
    if (w->nmeta == w->meta_cap) {
        w->meta_cap = w->meta_cap ? w->meta_cap * 2 : 8;
        st_meta *bigger = realloc(w->meta, w->meta_cap * sizeof(*bigger));
        ZT_ASSERT(bigger != NULL);
        w->meta = bigger;
    }
    w->meta[w->nmeta].key = xstrdup(key);
    w->meta[w->nmeta].value = xstrdup(value);
    w->nmeta++;
    return 0;
}

/* A growing string for the header. */
typedef struct st_buf {
    char *p;
    size_t len, cap;
} st_buf;

static void buf_put(st_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *bigger = realloc(b->p, cap);
        ZT_ASSERT(bigger != NULL);
        b->p = bigger;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_str(st_buf *b, const char *s)
{
    buf_put(b, s, strlen(s));
}

/* A JSON string literal with the escapes serde_json uses. */
static void buf_json_string(st_buf *b, const char *s)
{
    buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        char esc[8];
        switch (*p) {
        case '"':
            buf_str(b, "\\\"");
            break;
        case '\\':
            buf_str(b, "\\\\");
            break;
        case '\n':
            buf_str(b, "\\n");
            break;
        case '\r':
            buf_str(b, "\\r");
            break;
        case '\t':
            buf_str(b, "\\t");
            break;
        case '\b':
            buf_str(b, "\\b");
            break;
        case '\f':
            buf_str(b, "\\f");
            break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", *p);
                buf_str(b, esc);
            } else {
                buf_put(b, (const char *)p, 1);
            }
        }
    }
    buf_put(b, "\"", 1);
}

/* The header of the collected tensors (padded to a multiple of 8 bytes) in h; records each tensor's offset in
 * the data buffer. */
static void build_header(zt_st_writer *w, st_buf *out)
{
    st_buf h = {0};
    char num[64];
    buf_str(&h, "{");
    bool first = true;
    if (w->nmeta > 0) {
        buf_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i > 0)
                buf_str(&h, ",");
            buf_json_string(&h, w->meta[i].key);
            buf_str(&h, ":");
            buf_json_string(&h, w->meta[i].value);
        }
        buf_str(&h, "}");
        first = false;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->count; i++) {
        const st_wtensor *t = &w->tensors[i];
        if (!first)
            buf_str(&h, ",");
        first = false;
        buf_json_string(&h, t->name);
        buf_str(&h, ":{\"dtype\":\"");
        buf_str(&h, zt_dtype_name(t->dtype));
        buf_str(&h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof(num), d > 0 ? ",%lld" : "%lld", (long long)t->shape[d]);
            buf_str(&h, num);
        }
        snprintf(num, sizeof(num), "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                 (unsigned long long)(offset + t->nbytes));
        buf_str(&h, num);
        w->tensors[i].offset = offset;
        offset += t->nbytes;
    }
    buf_str(&h, "}");
    /* Spaces up to a multiple of 8, so that the data buffer starts 8-byte aligned in the file. */
    while (h.len % 8 != 0)
        buf_str(&h, " ");
    *out = h;
}

/* Writes the collected tensors and metadata to path atomically; see safetensors.h. */
int zt_st_writer_write(zt_st_writer *w, const char *path, zt_err *err)
{
    for (size_t i = 0; i < w->count; i++)
        if (w->tensors[i].data == NULL && w->tensors[i].nbytes > 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: tensor '%s' was declared without data: write %s "
                           "with zt_st_writer_begin and zt_st_writer_put", w->tensors[i].name, path);
    st_buf h;
    build_header(w, &h);
    unsigned char len_le[8];
    for (int i = 0; i < 8; i++)
        len_le[i] = (unsigned char)((uint64_t)h.len >> (8 * i));

    size_t nparts = 2 + w->count;
    zt_file_part *parts = zt_xcalloc(nparts, sizeof(*parts));
    parts[0] = (zt_file_part){len_le, 8};
    parts[1] = (zt_file_part){h.p, h.len};
    for (size_t i = 0; i < w->count; i++)
        parts[2 + i] = (zt_file_part){w->tensors[i].data, w->tensors[i].nbytes};
    int rc = zt_write_file_atomic_parts(path, parts, nparts, err);
    free(parts);
    free(h.p);
    return rc;
}

/* Creates path.tmp at its full size with the header of the collected tensors; see safetensors.h. */
int zt_st_writer_begin(zt_st_writer *w, const char *path, zt_err *err)
{
    if (w->fd >= 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: %s: zt_st_writer_begin called twice", path);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return zt_fail(err, -ENAMETOOLONG, "cannot write %s: path too long", path);
    st_buf h;
    build_header(w, &h);
    const size_t h_len = h.len;
    uint64_t size = 8 + (uint64_t)h.len;
    for (size_t i = 0; i < w->count; i++)
        size += w->tensors[i].nbytes;
    unsigned char len_le[8];
    for (int i = 0; i < 8; i++)
        len_le[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(h.p);
        return zt_fail(err, -e, "cannot write %s: cannot create %s: %s", path, tmp, strerror(e));
    }
    int rc = 0;
    const char *step = "resize";
    /* the whole size at once: a disk or a file size limit that cannot hold it fails here, before any data */
    if (ftruncate(fd, (off_t)size) != 0)
        rc = -errno;
    if (rc == 0) {
        step = "write";
        rc = zt_pwrite_all(fd, len_le, 8, 0);
    }
    if (rc == 0)
        rc = zt_pwrite_all(fd, h.p, h.len, 8);
    free(h.p);
    if (rc != 0) {
        close(fd);
        unlink(tmp);
        return zt_fail(err, rc, "cannot write %s: %s of %s failed: %s", path, step, tmp, strerror(-rc));
    }
    free(w->path);
    w->path = xstrdup(path);
    w->fd = fd;
    w->size = size;
    w->data_start = 8 + (uint64_t)h_len;
    return 0;
}

/* Writes bytes of tensor index's data at byte offset within it; see safetensors.h. */
int zt_st_writer_put(zt_st_writer *w, size_t index, uint64_t offset, const void *data, size_t bytes, zt_err *err)
{
    if (w->fd < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: zt_st_writer_put before zt_st_writer_begin");
    if (index >= w->count || offset > w->tensors[index].nbytes || bytes > w->tensors[index].nbytes - offset)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: %s: bytes [%llu, %llu) of tensor %zu lie outside it",
                       w->path, (unsigned long long)offset, (unsigned long long)(offset + bytes), index);
    int rc = zt_pwrite_all(w->fd, data, bytes, w->data_start + w->tensors[index].offset + offset);
    if (rc != 0) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof(tmp), "%s.tmp", w->path);
        return zt_fail(err, rc, "cannot write %s: write of %s failed: %s", w->path, tmp, strerror(-rc));
    }
    return 0;
}

/* fsync, close and rename of a streamed file; see safetensors.h. */
int zt_st_writer_finish(zt_st_writer *w, zt_err *err)
{
    if (w->fd < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "safetensors: zt_st_writer_finish before zt_st_writer_begin");
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s.tmp", w->path);
    int rc = 0;
    const char *step = "fsync";
    if (fsync(w->fd) != 0)
        rc = -errno;
    if (close(w->fd) != 0 && rc == 0) {
        step = "close";
        rc = -errno;
    }
    w->fd = -1;
    if (rc == 0) {
        step = "rename";
        if (rename(tmp, w->path) != 0)
            rc = -errno;
    }
    if (rc != 0) {
        unlink(tmp);
        return zt_fail(err, rc, "cannot write %s: %s of %s failed: %s", w->path, step, tmp, strerror(-rc));
    }
    rc = zt_fsync_parent_dir(w->path, NULL);
    if (rc != 0)
        return zt_fail(err, rc, "cannot write %s: the file was renamed into place but fsync of its directory failed: %s",
                       w->path, strerror(-rc));
    return 0;
}

/* The shard each tensor goes to (shard_of[i], from 0) and the number of shards. */
static int plan_shards(const zt_st_writer *w, size_t max_bytes, int *shard_of)
{
    int k = 0;
    size_t used = 0;
    for (size_t i = 0; i < w->count; i++) {
        const size_t n = w->tensors[i].nbytes;
        if (used > 0 && used + n > max_bytes) {
            k++;
            used = 0;
        }
        shard_of[i] = k;
        used += n;
    }
    return k + 1;
}

/* Writes the tensors in shards with an index; see safetensors.h. */
int zt_st_writer_write_sharded(zt_st_writer *w, const char *dir, size_t max_shard_bytes, int *nshards,
                               zt_err *err)
{
    if (nshards)
        *nshards = 0;
    if (max_shard_bytes == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the shard size must be at least one byte", dir);
    int rc = zt_mkdir_p(dir, err);
    if (rc < 0)
        return rc;
    char path[4096 + 64];
    int *shard_of = zt_xcalloc(w->count ? w->count : 1, sizeof *shard_of);
    const int n = plan_shards(w, max_shard_bytes, shard_of);
    if (n == 1) {
        free(shard_of);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = zt_st_writer_write(w, path, err);
        if (rc == 0 && nshards)
            *nshards = 1;
        return rc;
    }
    cJSON *index = cJSON_CreateObject(), *map = cJSON_CreateObject();
    uint64_t total = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n);
        zt_st_writer *part = zt_st_writer_create();
        for (size_t i = 0; i < w->nmeta && rc == 0; i++)
            rc = zt_st_writer_add_metadata(part, w->meta[i].key, w->meta[i].value, err);
        for (size_t i = 0; i < w->count && rc == 0; i++) {
            const st_wtensor *t = &w->tensors[i];
            if (shard_of[i] != k)
                continue;
            rc = zt_st_writer_add(part, t->name, t->dtype, t->ndim, t->shape, t->data, err);
            cJSON_AddStringToObject(map, t->name, file);
            total += t->nbytes;
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (rc == 0)
            rc = zt_st_writer_write(part, path, err);
        zt_st_writer_destroy(part);
    }
    free(shard_of);
    if (rc == 0) {
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddItemToObject(meta, "total_size", zt_json_exact_int((int64_t)total));
        cJSON_AddItemToObject(index, "weight_map", map);
        map = NULL;
        char *text = cJSON_Print(index);
        ZT_ASSERT(text != NULL);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        const zt_file_part parts[2] = {{text, strlen(text)}, {"\n", 1}};
        rc = zt_write_file_atomic_parts(path, parts, 2, err);
        cJSON_free(text);
    }
    cJSON_Delete(map);
    cJSON_Delete(index);
    if (rc == 0 && nshards)
        *nshards = n;
    return rc;
}
