/* The tokenizers behind worker/data/tokenize.h. "bytes" maps each byte to the token of the same value;
 * it needs no vocabulary file and is what the demo corpus and the tiny models use. A Hugging Face
 * tokenizer.json is read by tokenize_load.c and run by tokenize_hf.c; this file checks the arguments
 * (UTF-8, token ranges) and dispatches. */
#include "worker/data/tokenize.h"

#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "worker/data/tokenize_hf.h"
#include "worker/data/unicode.h"

enum tok_kind { TOK_BYTES, TOK_HF };

struct zt_tokenizer {
    enum tok_kind kind;
    int vocab_size;
    char byte_table[256]; /* byte_table[i] == i: the bytes of token i for the "bytes" kind */
    zt__hf hf;            /* TOK_HF */
};

int zt_tokenizer_create(zt_tokenizer **out, const char *kind, zt_err *err)
{
    *out = NULL;
    if (strcmp(kind, "bytes") != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "unknown tokenizer '%s' (built in: bytes; other tokenizers come from a Hugging Face "
                       "tokenizer.json file)",
                       kind);
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

int zt_tokenizer_load_json(zt_tokenizer **out, const char *json, const char *name, zt_err *err)
{
    *out = NULL;
    /* JSON is UTF-8 (RFC 8259), and every string in it (vocabulary, merges, added tokens) is read as such */
    const size_t len = strlen(json), valid = zt_utf8_valid_prefix(json, len);
    if (valid != len)
        return zt_fail(err, ZT_EFORMAT, "%s: not UTF-8 at byte %zu (a tokenizer.json is UTF-8 text; save it as "
                       "UTF-8)", name, valid);
    zt_tokenizer *tok = calloc(1, sizeof(*tok));
    if (!tok)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating the tokenizer");
    tok->kind = TOK_HF;
    int rc = zt__hf_load(&tok->hf, json, strlen(json), name, err);
    if (rc != 0) {
        zt_tokenizer_destroy(tok);
        return rc;
    }
    tok->vocab_size = tok->hf.vocab_size;
    *out = tok;
    return 0;
}

int zt_tokenizer_load(zt_tokenizer **out, const char *path, zt_err *err)
{
    *out = NULL;
    char *json = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &json, &len, err);
    if (rc != 0)
        return rc;
    if (strlen(json) != len) {
        free(json);
        return zt_fail(err, ZT_EFORMAT, "%s holds a NUL byte, so it is not a tokenizer.json (JSON text); give the "
                       "tokenizer.json file of the tokenizer", path);
    }
    rc = zt_tokenizer_load_json(out, json, path, err);
    free(json);
    return rc;
}

void zt_tokenizer_destroy(zt_tokenizer *tok)
{
    if (!tok)
        return;
    if (tok->kind == TOK_HF)
        zt__hf_free(&tok->hf);
    free(tok);
}

const char *zt_tokenizer_kind(const zt_tokenizer *tok)
{
    return tok->kind == TOK_HF ? tok->hf.kind : "bytes";
}

int zt_tokenizer_vocab_size(const zt_tokenizer *tok)
{
    return tok->vocab_size;
}

int32_t zt_tokenizer_find(const zt_tokenizer *tok, const char *token)
{
    const size_t len = strlen(token);
    if (tok->kind != TOK_HF)
        return len == 1 ? (int32_t)(unsigned char)token[0] : -1;
    for (int k = 0; k < tok->hf.nadded; k++) /* added tokens first: they win over the model's entry */
        if (tok->hf.added[k].content.len == len && memcmp(tok->hf.added[k].content.p, token, len) == 0)
            return tok->hf.added[k].id;
    return zt__strmap_get(&tok->hf.vocab, token, len);
}

bool zt_tokenizer_is_special(const zt_tokenizer *tok, int32_t id)
{
    return tok->kind == TOK_HF && id >= 0 && id < tok->vocab_size && tok->hf.is_special[id];
}

/* ZT_EFORMAT unless text is UTF-8 (what a tokenizer.json reads), naming the first bad byte. */
static int check_utf8(const void *text, size_t len, zt_err *err)
{
    size_t ok = zt_utf8_valid_prefix(text, len);
    if (ok == len)
        return 0;
    return zt_fail(err, ZT_EFORMAT,
                   "the text is not UTF-8: byte %zu (0x%02X) does not start a valid UTF-8 character, and "
                   "Hugging Face tokenizers read UTF-8; convert the text first (for example with iconv "
                   "-f LATIN1 -t UTF-8)",
                   ok, ((const unsigned char *)text)[ok]);
}

int zt_tokenizer_normalize(const zt_tokenizer *tok, const void *text, size_t len, char **out, size_t *out_len,
                           zt_err *err)
{
    *out = NULL;
    *out_len = 0;
    int rc = check_utf8(text, len, err);
    if (rc != 0)
        return rc;
    zt__bytes r = {0};
    if (tok->kind == TOK_HF) {
        if ((rc = zt__hf_normalize(&tok->hf, text, len, &r, err)) != 0)
            return rc;
    } else {
        r.p = malloc(len + 1);
        if (!r.p)
            return zt_fail(err, ZT_ENOMEM, "out of memory normalizing %zu bytes of text", len);
        memcpy(r.p, text, len);
        r.p[len] = '\0';
        r.len = len;
    }
    *out = r.p;
    *out_len = r.len;
    return 0;
}

int zt_tokenizer_encode_flags(const zt_tokenizer *tok, const void *text, size_t len, unsigned flags,
                              int32_t **tokens, size_t *n, zt_err *err)
{
    *tokens = NULL;
    *n = 0;
    if (tok->kind == TOK_HF) {
        int rc = check_utf8(text, len, err);
        if (rc != 0)
            return rc;
        return zt__hf_encode(&tok->hf, text, len, (flags & ZT_TOKENIZE_ADD_SPECIAL) != 0, tokens, n, err);
    }
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

int zt_tokenizer_encode(const zt_tokenizer *tok, const void *text, size_t len, int32_t **tokens, size_t *n,
                        zt_err *err)
{
    return zt_tokenizer_encode_flags(tok, text, len, 0, tokens, n, err);
}

int zt_tokenizer_encode_pair(const zt_tokenizer *tok, const char *a, size_t alen, const char *b, size_t blen,
                             size_t max_len, int32_t **tokens, int32_t **types, size_t *n, zt_err *err)
{
    *tokens = NULL;
    *types = NULL;
    *n = 0;
    if (tok->kind == TOK_HF) {
        int rc = check_utf8(a, alen, err);
        if (rc == 0 && b)
            rc = check_utf8(b, blen, err);
        return rc != 0 ? rc : zt__hf_encode_pair(&tok->hf, a, alen, b, blen, max_len, tokens, types, n, err);
    }
    size_t na = alen, nb = b ? blen : 0;
    if (max_len > 0 && !b && na > max_len)
        na = max_len;
    else if (max_len > 0 && b)
        zt__truncate_longest_first(&na, &nb, max_len);
    const size_t total = na + nb;
    int32_t *t = malloc((total ? total : 1) * sizeof(int32_t)), *y = malloc((total ? total : 1) * sizeof(int32_t));
    if (!t || !y) {
        free(t);
        free(y);
        return zt_fail(err, ZT_ENOMEM, "out of memory encoding %zu bytes of text", total);
    }
    for (size_t i = 0; i < na; i++) {
        t[i] = ((const unsigned char *)a)[i];
        y[i] = 0;
    }
    for (size_t i = 0; i < nb; i++) {
        t[na + i] = ((const unsigned char *)b)[i];
        y[na + i] = 1;
    }
    *tokens = t;
    *types = y;
    *n = total;
    return 0;
}

/* ZT_EMISMATCH unless token is an id of tok. */
static int check_token(const zt_tokenizer *tok, int32_t token, zt_err *err)
{
    if (token >= 0 && token < tok->vocab_size && (tok->kind != TOK_HF || tok->hf.tokens[token].p))
        return 0;
    if (token >= 0 && token < tok->vocab_size)
        return zt_fail(err, ZT_EMISMATCH,
                       "token %d is not in the '%s' tokenizer's vocabulary (its ids skip it); the model and the "
                       "tokenizer do not belong together",
                       (int)token, zt_tokenizer_kind(tok));
    return zt_fail(err, ZT_EMISMATCH,
                   "token %d is outside the '%s' tokenizer's vocabulary (0 to %d); the model's vocab_size "
                   "is larger than the tokenizer's",
                   (int)token, zt_tokenizer_kind(tok), tok->vocab_size - 1);
}

int zt_tokenizer_token_bytes(const zt_tokenizer *tok, int32_t token, const char **bytes, size_t *len,
                             zt_err *err)
{
    int rc = check_token(tok, token, err);
    if (rc != 0)
        return rc;
    if (tok->kind == TOK_HF) {
        *bytes = tok->hf.pieces[token].p;
        *len = tok->hf.pieces[token].len;
        return 0;
    }
    *bytes = &tok->byte_table[token];
    *len = 1;
    return 0;
}

int zt_tokenizer_decode(const zt_tokenizer *tok, const int32_t *tokens, size_t n, char **text, size_t *len,
                        zt_err *err)
{
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = check_token(tok, tokens[i], err);
        if (rc != 0)
            return rc;
    }
    if (tok->kind == TOK_HF) {
        zt__bytes out;
        int rc = zt__hf_decode(&tok->hf, tokens, n, &out, err);
        if (rc != 0)
            return rc;
        *text = out.p;
        *len = out.len;
        return 0;
    }
    char *out = malloc(n + 1); /* one byte per token for "bytes" */
    if (!out)
        return zt_fail(err, ZT_ENOMEM, "out of memory decoding %zu tokens", n);
    for (size_t i = 0; i < n; i++)
        out[i] = tok->byte_table[tokens[i]];
    out[n] = '\0';
    *text = out;
    *len = n;
    return 0;
}
