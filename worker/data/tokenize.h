/* Tokenizers: text bytes to token ids and back.
 *
 * One interface for every kind, so that the tokenize command and text generation do not change when a new
 * kind is added. This build has one kind, "bytes": token = byte value, vocabulary 256, every byte string
 * round-trips exactly. A BPE kind (GPT-2's vocabulary) will come behind the same functions. */
#ifndef ZT_WORKER_TOKENIZE_H
#define ZT_WORKER_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct zt_tokenizer zt_tokenizer; /* opaque */

/* Creates a tokenizer of the named kind ("bytes"). Returns 0 and *out (freed with zt_tokenizer_destroy),
 * or ZT_EINVAL_CONFIG with a message listing the known kinds. */
int zt_tokenizer_create(zt_tokenizer **out, const char *kind, zt_err *err);
/* Frees a tokenizer; accepts NULL. */
void zt_tokenizer_destroy(zt_tokenizer *tok);

/* Returns the kind name given at creation (a static string, never NULL). */
const char *zt_tokenizer_kind(const zt_tokenizer *tok);
/* Returns the number of token ids: every token this tokenizer makes is in [0, vocab size). */
int zt_tokenizer_vocab_size(const zt_tokenizer *tok);

/* Encodes len bytes of text (any bytes, not only valid UTF-8) into *tokens, a malloc'd array of *n ids
 * that the caller frees (NULL when *n is 0). Returns 0, or ZT_ENOMEM with a message. */
int zt_tokenizer_encode(const zt_tokenizer *tok, const void *text, size_t len, int32_t **tokens, size_t *n,
                        zt_err *err);

/* Decodes n tokens into *text, a malloc'd buffer of *len bytes plus a NUL (not counted in *len) that the
 * caller frees. Returns 0, ZT_EMISMATCH if a token is outside [0, vocab size) (a model whose vocabulary is
 * larger than the tokenizer's), or ZT_ENOMEM. */
int zt_tokenizer_decode(const zt_tokenizer *tok, const int32_t *tokens, size_t n, char **text, size_t *len,
                        zt_err *err);

/* Points *bytes at the bytes of one token (borrowed, valid until the tokenizer is destroyed; not
 * NUL-terminated) and sets *len, for printing tokens one at a time as they are generated. Returns 0, or
 * ZT_EMISMATCH if the token is outside [0, vocab size). */
int zt_tokenizer_token_bytes(const zt_tokenizer *tok, int32_t token, const char **bytes, size_t *len,
                             zt_err *err);

#endif
