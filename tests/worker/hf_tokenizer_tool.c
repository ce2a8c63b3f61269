/* Runs a tokenizer.json tokenizer (worker/data/tokenize.h) for tests and benchmarks in other languages:
 *
 *   hf_tokenizer_tool info TOKENIZER.json                 prints "kind KIND" and "vocab_size N"
 *   hf_tokenizer_tool encode TOKENIZER.json IN OUT [--add-special]
 *       IN holds records "LENGTH\n" + LENGTH bytes of text; OUT gets one line of ids per record
 *       ("error: MESSAGE" for a text that is refused)
 *   hf_tokenizer_tool pair TOKENIZER.json IN OUT MAXLEN
 *       IN holds records in twos: text A, then text B or "-\n" for none; OUT gets "IDS | TYPES" per pair,
 *       encoded with special tokens and truncated to MAXLEN tokens (0: none)
 *   hf_tokenizer_tool normalize TOKENIZER.json IN OUT
 *       IN holds records as for encode; OUT gets the normalized texts as records (zt_tokenizer_normalize)
 *   hf_tokenizer_tool decode TOKENIZER.json IN OUT
 *       IN holds one line of ids per text; OUT gets records "LENGTH\n" + the decoded bytes
 *   hf_tokenizer_tool pieces TOKENIZER.json OUT           OUT gets zt_tokenizer_token_bytes of every id, as
 *                                                         records (empty for ids the vocabulary skips)
 *   hf_tokenizer_tool time TOKENIZER.json FILE ROUNDS     encodes FILE whole ROUNDS times; prints bytes,
 *                                                         tokens, the best wall seconds of one round and
 *                                                         the best CPU seconds of one round
 *   hf_tokenizer_tool unicode FIRST LAST OUT              OUT gets one line per code point FIRST..LAST (hex):
 *                                                         "CP CATEGORY WHITE_SPACE LOWER NFD" from the Unicode
 *                                                         tables (worker/data/unicode.h), mappings as hex
 *                                                         code points joined by '.' 
 * Exit status: 0, 1 when a file cannot be read or written or the tokenizer is refused (message on stderr),
 * 2 on bad arguments. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fileio.h"
#include "worker/data/tokenize.h"
#include "worker/data/unicode.h"

static int fail(const char *msg)
{
    fprintf(stderr, "hf_tokenizer_tool: %s\n", msg);
    return 1;
}

/* Reads the record at *pos ("LENGTH\n" + bytes, or "-\n" for none: *text NULL); 0, or -1 if malformed. */
static int next_record(const char *data, size_t len, size_t *pos, const char **text, size_t *n)
{
    if (*pos + 2 <= len && data[*pos] == '-' && data[*pos + 1] == '\n') {
        *text = NULL;
        *n = 0;
        *pos += 2;
        return 0;
    }
    char *end;
    unsigned long long v = strtoull(data + *pos, &end, 10);
    if (*end != '\n' || (size_t)(end + 1 - data) + v > len)
        return -1;
    *text = end + 1;
    *n = (size_t)v;
    *pos = (size_t)(*text - data) + (size_t)v;
    return 0;
}

static int encode(const zt_tokenizer *tok, const char *in, const char *out, unsigned flags)
{
    zt_err err;
    char *data;
    size_t len;
    if (zt_read_file(in, &data, &len, &err) != 0)
        return fail(err.msg);
    FILE *f = fopen(out, "w");
    if (!f) {
        free(data);
        return fail(strerror(errno));
    }
    size_t pos = 0;
    while (pos < len) {
        const char *text;
        size_t n;
        if (next_record(data, len, &pos, &text, &n) != 0 || text == NULL) {
            fclose(f);
            free(data);
            return fail("bad record in the input");
        }
        int32_t *ids;
        size_t nids;
        if (zt_tokenizer_encode_flags(tok, text, n, flags, &ids, &nids, &err) != 0) {
            fprintf(f, "error: %s\n", err.msg);
        } else {
            for (size_t i = 0; i < nids; i++)
                fprintf(f, i ? " %d" : "%d", (int)ids[i]);
            fputc('\n', f);
            free(ids);
        }
    }
    free(data);
    return fclose(f) == 0 ? 0 : fail("cannot write the output");
}

/* IN holds records in twos (text A, then text B or "-\n" for none); OUT gets a line "IDS | TYPES" per pair. */
static int encode_pairs(const zt_tokenizer *tok, const char *in, const char *out, size_t max_len)
{
    zt_err err;
    char *data;
    size_t len;
    if (zt_read_file(in, &data, &len, &err) != 0)
        return fail(err.msg);
    FILE *f = fopen(out, "w");
    if (!f) {
        free(data);
        return fail(strerror(errno));
    }
    size_t pos = 0;
    while (pos < len) {
        const char *a, *b;
        size_t na, nb;
        if (next_record(data, len, &pos, &a, &na) != 0 || a == NULL || next_record(data, len, &pos, &b, &nb) != 0) {
            fclose(f);
            free(data);
            return fail("bad record in the input");
        }
        int32_t *ids, *types;
        size_t nids;
        if (zt_tokenizer_encode_pair(tok, a, na, b, nb, max_len, &ids, &types, &nids, &err) != 0) {
            fprintf(f, "error: %s\n", err.msg);
            continue;
        }
        for (size_t i = 0; i < nids; i++)
            fprintf(f, i ? " %d" : "%d", (int)ids[i]);
        fputs(" |", f);
        for (size_t i = 0; i < nids; i++)
            fprintf(f, " %d", (int)types[i]);
        fputc('\n', f);
        free(ids);
        free(types);
    }
    free(data);
    return fclose(f) == 0 ? 0 : fail("cannot write the output");
}

static int normalize(const zt_tokenizer *tok, const char *in, const char *out)
{
    zt_err err;
    char *data;
    size_t len;
    if (zt_read_file(in, &data, &len, &err) != 0)
        return fail(err.msg);
    FILE *f = fopen(out, "wb");
    if (!f) {
        free(data);
        return fail(strerror(errno));
    }
    int rc = 0;
    for (size_t pos = 0; pos < len && rc == 0;) {
        const char *text;
        size_t n;
        if (next_record(data, len, &pos, &text, &n) != 0 || text == NULL) {
            rc = fail("bad record in the input");
            break;
        }
        char *norm;
        size_t nlen;
        if (zt_tokenizer_normalize(tok, text, n, &norm, &nlen, &err) != 0) {
            rc = fail(err.msg);
            break;
        }
        fprintf(f, "%zu\n", nlen);
        fwrite(norm, 1, nlen, f);
        free(norm);
    }
    fclose(f);
    free(data);
    return rc;
}

static int decode(const zt_tokenizer *tok, const char *in, const char *out)
{
    zt_err err;
    char *data;
    size_t len;
    if (zt_read_file(in, &data, &len, &err) != 0)
        return fail(err.msg);
    FILE *f = fopen(out, "wb");
    if (!f) {
        free(data);
        return fail(strerror(errno));
    }
    int32_t *ids = malloc((len + 1) * sizeof(int32_t));
    char *line = data;
    int rc = 0;
    while (rc == 0 && line < data + len) {
        char *nl = memchr(line, '\n', (size_t)(data + len - line));
        if (!nl)
            nl = data + len;
        *nl = '\0';
        size_t n = 0;
        for (char *p = line; *p;) {
            char *e;
            long v = strtol(p, &e, 10);
            if (e == p)
                break;
            ids[n++] = (int32_t)v;
            p = e;
        }
        char *text;
        size_t tlen;
        if (zt_tokenizer_decode(tok, ids, n, &text, &tlen, &err) != 0) {
            rc = fail(err.msg);
            break;
        }
        fprintf(f, "%zu\n", tlen);
        fwrite(text, 1, tlen, f);
        free(text);
        line = nl + 1;
    }
    free(ids);
    free(data);
    if (fclose(f) != 0 && rc == 0)
        rc = fail("cannot write the output");
    return rc;
}

static int pieces(const zt_tokenizer *tok, const char *out)
{
    FILE *f = fopen(out, "wb");
    if (!f)
        return fail(strerror(errno));
    for (int32_t id = 0; id < zt_tokenizer_vocab_size(tok); id++) {
        const char *b = "";
        size_t n = 0;
        zt_err err;
        if (zt_tokenizer_token_bytes(tok, id, &b, &n, &err) != 0)
            n = 0;
        fprintf(f, "%zu\n", n);
        fwrite(b, 1, n, f);
    }
    return fclose(f) == 0 ? 0 : fail("cannot write the output");
}

static double now(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int time_encode(const zt_tokenizer *tok, const char *path, int rounds)
{
    zt_err err;
    char *data;
    size_t len;
    if (zt_read_file(path, &data, &len, &err) != 0)
        return fail(err.msg);
    double best = 1e30, best_cpu = 1e30;
    size_t ntok = 0;
    for (int r = 0; r < rounds; r++) {
        int32_t *ids;
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (zt_tokenizer_encode(tok, data, len, &ids, &ntok, &err) != 0) {
            free(data);
            return fail(err.msg);
        }
        double dt = now(CLOCK_MONOTONIC) - t0, dc = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
        free(ids);
        if (dt < best)
            best = dt;
        if (dc < best_cpu)
            best_cpu = dc;
    }
    printf("bytes %zu tokens %zu seconds %.6f cpu_seconds %.6f\n", len, ntok, best, best_cpu);
    free(data);
    return 0;
}

static void put_map(FILE *f, const uint32_t *cps, int n)
{
    for (int i = 0; i < n; i++)
        fprintf(f, i ? ".%X" : " %X", cps[i]);
}

static int unicode_dump(const char *first, const char *last, const char *out)
{
    FILE *f = fopen(out, "w");
    if (!f)
        return fail(strerror(errno));
    uint32_t a = (uint32_t)strtoul(first, NULL, 16), b = (uint32_t)strtoul(last, NULL, 16);
    for (uint32_t cp = a; cp <= b && cp < ZT_UNICODE_LIMIT; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        uint32_t m[ZT_UNICODE_MAX_EXPANSION];
        fprintf(f, "%X %d %d", cp, zt_unicode_category(cp), zt_unicode_is_white_space(cp));
        put_map(f, m, zt_unicode_lower(cp, m));
        put_map(f, m, zt_unicode_nfd(cp, m));
        fputc('\n', f);
    }
    return fclose(f) == 0 ? 0 : fail("cannot write the output");
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "unicode") == 0)
        return unicode_dump(argv[2], argv[3], argv[4]);
    if (argc < 3)
        return fprintf(stderr, "usage: see the comment at the top of hf_tokenizer_tool.c\n"), 2;
    zt_tokenizer *tok;
    zt_err err;
    if (zt_tokenizer_load(&tok, argv[2], &err) != 0)
        return fail(err.msg);
    int rc = 2;
    if (strcmp(argv[1], "info") == 0) {
        printf("kind %s\nvocab_size %d\n", zt_tokenizer_kind(tok), zt_tokenizer_vocab_size(tok));
        rc = 0;
    } else if (strcmp(argv[1], "encode") == 0 && (argc == 5 || argc == 6)) {
        unsigned flags = argc == 6 && strcmp(argv[5], "--add-special") == 0 ? ZT_TOKENIZE_ADD_SPECIAL : 0;
        rc = encode(tok, argv[3], argv[4], flags);
    } else if (strcmp(argv[1], "pair") == 0 && argc == 6) {
        rc = encode_pairs(tok, argv[3], argv[4], (size_t)strtoull(argv[5], NULL, 10));
    } else if (strcmp(argv[1], "normalize") == 0 && argc == 5) {
        rc = normalize(tok, argv[3], argv[4]);
    } else if (strcmp(argv[1], "decode") == 0 && argc == 5) {
        rc = decode(tok, argv[3], argv[4]);
    } else if (strcmp(argv[1], "pieces") == 0 && argc == 4) {
        rc = pieces(tok, argv[3]);
    } else if (strcmp(argv[1], "time") == 0 && argc == 5) {
        rc = time_encode(tok, argv[3], atoi(argv[4]) > 0 ? atoi(argv[4]) : 1);
    } else {
        fprintf(stderr, "usage: see the comment at the top of hf_tokenizer_tool.c\n");
    }
    zt_tokenizer_destroy(tok);
    return rc;
}
