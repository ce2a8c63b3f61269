/* The tokens file of the interop tools (gpt2_tool, llama_tool, family_tool): int32 B and T, then B rows of
 * T+1 tokens, a row's inputs its first T tokens and its targets its last T. */
#ifndef ZT_TESTS_TOKENS_FILE_H
#define ZT_TESTS_TOKENS_FILE_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads the tokens file path (int32 B, T, then B rows of T+1 tokens below vocab; a row's last token may be -1)
 * into *inputs and *targets ([B,T] each, the first and the last T tokens of each row; malloc'd, the caller
 * frees them, also on error). Returns 0, or -1 with a message in msg. */
static inline int zt_test_read_tokens(const char *path, int vocab, int *B, int *T, int32_t **inputs,
                                      int32_t **targets, char *msg, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, cap, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int32_t hdr[2];
    int rc = -1;
    int32_t *row = NULL;
    if (fread(hdr, sizeof hdr[0], 2, f) != 2 || hdr[0] < 1 || hdr[1] < 1 || hdr[0] > 4096 || hdr[1] > 65536) {
        snprintf(msg, cap, "%s: expected int32 B >= 1 and T >= 1 first", path);
        goto out;
    }
    *B = hdr[0];
    *T = hdr[1];
    const size_t n = (size_t)*B * (size_t)*T;
    *inputs = malloc(n * sizeof(int32_t));
    *targets = malloc(n * sizeof(int32_t));
    row = malloc(((size_t)*T + 1) * sizeof(int32_t));
    if (!*inputs || !*targets || !row) {
        snprintf(msg, cap, "out of memory reading %s", path);
        goto out;
    }
    for (int b = 0; b < *B; b++) {
        if (fread(row, sizeof(int32_t), (size_t)*T + 1, f) != (size_t)*T + 1) {
            snprintf(msg, cap, "%s: file ends inside row %d (expected %d rows of %d tokens)", path, b, *B, *T + 1);
            goto out;
        }
        for (int t = 0; t <= *T; t++) {
            /* Only the last token of a row is a target and nothing else, so only it may be -1. */
            bool ok = (row[t] >= 0 && row[t] < vocab) || (t == *T && row[t] == -1);
            if (!ok) {
                snprintf(msg, cap, "%s: token %" PRId32 " at row %d, column %d is outside the vocabulary of %d", path,
                         row[t], b, t, vocab);
                goto out;
            }
        }
        memcpy(*inputs + (size_t)b * *T, row, (size_t)*T * sizeof(int32_t));
        memcpy(*targets + (size_t)b * *T, row + 1, (size_t)*T * sizeof(int32_t));
    }
    rc = 0;
out:
    free(row);
    fclose(f);
    return rc;
}

#endif
