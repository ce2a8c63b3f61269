/* The tokenizers behind worker/data/tokenize.h. "bytes" maps each byte to the token of the same value;
 * it needs no vocabulary file and is what the demo corpus and the tiny models use. */
#include "worker/data/tokenize.h"

#include <stdlib.h>
#include <string.h>

enum tok_kind { TOK_BYTES };

struct zt_tokenizer {
    enum tok_kind kind;
    int vocab_size;
    char byte_table[256]; /* byte_table[i] == i: the bytes of token i for the "bytes" kind */
};

int zt_tokenizer_create(zt_tokenizer **out, const char *kind, zt_err *err)
{
    *out = NULL;
    if (strcmp(kind, "bytes") != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "unknown tokenizer '%s' (this build has: bytes)", kind);
    zt_tokenizer *tok = calloc(1, sizeof(*tok));
    if (!tok)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating the tokenizer");
    tok->kind = TOK_BYTES;
    tok->vocab_size = 256;
    for (int i = 0; i < 256; i++)
        tok->byte_table[i] = (char)(unsigned char)i;
    *out = tok;
    return 0;
}

void zt_tokenizer_destroy(zt_tokenizer *tok)
{
    free(tok);
}

const char *zt_tokenizer_kind(const zt_tokenizer *tok)
{
    (void)tok; /* one kind so far */
    return "bytes";
}

int zt_tokenizer_vocab_size(const zt_tokenizer *tok)
{
    return tok->vocab_size;
}

int zt_tokenizer_encode(const zt_tokenizer *tok, const void *text, size_t len, int32_t **tokens, size_t *n,
                        zt_err *err)
{
    (void)tok;
    *tokens = NULL;
    *n = 0;
    if (len == 0)
        return 0;
    int32_t *t = malloc(len * sizeof(int32_t));
    if (!t)
        return zt_fail(err, ZT_ENOMEM, "out of memory encoding %zu bytes of text", len);
    const unsigned char *p = text;
    for (size_t i = 0; i < len; i++)
        t[i] = p[i];
    *tokens = t;
    *n = len;
    return 0;
}

int zt_tokenizer_token_bytes(const zt_tokenizer *tok, int32_t token, const char **bytes, size_t *len,
                             zt_err *err)
{
    if (token < 0 || token >= tok->vocab_size)
        return zt_fail(err, ZT_EMISMATCH,
                       "token %d is outside the '%s' tokenizer's vocabulary (0 to %d); the model's vocab_size "
                       "is larger than the tokenizer's",
                       (int)token, zt_tokenizer_kind(tok), tok->vocab_size - 1);
    *bytes = &tok->byte_table[token];
    *len = 1;
    return 0;
}

int zt_tokenizer_decode(const zt_tokenizer *tok, const int32_t *tokens, size_t n, char **text, size_t *len,
                        zt_err *err)
{
    *text = NULL;
    *len = 0;
    char *out = malloc(n + 1); /* one byte per token for "bytes" */
    if (!out)
        return zt_fail(err, ZT_ENOMEM, "out of memory decoding %zu tokens", n);
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t blen;
        int rc = zt_tokenizer_token_bytes(tok, tokens[i], &b, &blen, err);
        if (rc != 0) {
            free(out);
            return rc;
        }
        memcpy(out + used, b, blen);
        used += blen;
    }
    out[used] = '\0';
    *text = out;
    *len = used;
    return 0;
}
