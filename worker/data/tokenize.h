/* Tokenizers: text bytes to token ids and back.
 *
 * One interface for every kind, so that the tokenize command and text generation do not change when a new
 * kind is added. Two sources:
 *   - "bytes" (zt_tokenizer_create): token = byte value, vocabulary 256, every byte string round-trips
 *     exactly;
 *   - a Hugging Face tokenizer.json (zt_tokenizer_load): BPE (byte-level as GPT-2 and LLaMA-3, or with byte
 *     fallback as LLaMA-2), WordPiece (BERT) and Unigram (SentencePiece's, as T5 and mT5), giving the ids of
 *     the tokenizers library. Their kinds are "byte-level-bpe", "bpe", "wordpiece" and "unigram". A
 *     component of the file that is not implemented is refused when the file is loaded (ZT_EUNSUPPORTED,
 *     naming its JSON path), never skipped. The pre-tokenizers are written by hand over the Unicode tables
 *     of worker/data/unicode.h.
 * A tokenizer is read-only after it is made: several threads may encode and decode with it at once. */
#ifndef ZT_WORKER_TOKENIZE_H
#define ZT_WORKER_TOKENIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct zt_tokenizer zt_tokenizer; /* opaque */

/* Creates a tokenizer of the named kind ("bytes"). Returns 0 and *out (freed with zt_tokenizer_destroy),
 * or ZT_EINVAL_CONFIG with a message listing the known kinds. */
int zt_tokenizer_create(zt_tokenizer **out, const char *kind, zt_err *err);
/* Reads a Hugging Face tokenizer.json. Returns 0 and *out (freed with zt_tokenizer_destroy), or a negative
 * errno when the file cannot be read, ZT_EFORMAT when it is not a valid tokenizer.json, ZT_EUNSUPPORTED
 * naming the JSON path and value of a component this build does not implement, or ZT_ENOMEM; the message
 * names the file. */
int zt_tokenizer_load(zt_tokenizer **out, const char *path, zt_err *err);
/* Like zt_tokenizer_load, from the text of a tokenizer.json (json, NUL-terminated); name stands for the file
 * in messages. */
int zt_tokenizer_load_json(zt_tokenizer **out, const char *json, const char *name, zt_err *err);
/* Frees a tokenizer; accepts NULL. */
void zt_tokenizer_destroy(zt_tokenizer *tok);

/* Returns the kind: "bytes", "byte-level-bpe", "bpe", "wordpiece" or "unigram" (a string that lives as long as tok;
 * never NULL). */
const char *zt_tokenizer_kind(const zt_tokenizer *tok);
/* Returns the number of token ids: every token this tokenizer makes is in [0, vocab size). For a
 * tokenizer.json that is its largest id (model vocabulary or added token) plus one. */
int zt_tokenizer_vocab_size(const zt_tokenizer *tok);

/* The id of the token whose text is exactly `token` (a vocabulary entry or an added token such as
 * "[MASK]"), or -1 when there is none. */
int32_t zt_tokenizer_find(const zt_tokenizer *tok, const char *token);
/* Whether id is a special token of the tokenizer.json (an added token marked "special": [CLS], <s>, ...);
 * false for the "bytes" tokenizer and for ids outside the vocabulary. */
bool zt_tokenizer_is_special(const zt_tokenizer *tok, int32_t id);

/* Flags of zt_tokenizer_encode_flags. */
enum zt_tokenize_flag {
    /* Add the special tokens of the tokenizer.json's post-processor around the text ([CLS] ... [SEP],
     * <|begin_of_text|> ...), as the library's encode(add_special_tokens=True) does. Off for training text. */
    ZT_TOKENIZE_ADD_SPECIAL = 1,
};

/* Encodes len bytes of text into *tokens, a malloc'd array of *n ids that the caller frees (NULL when *n is
 * 0), without special tokens around it (added tokens written in the text, such as <|endoftext|>, are
 * still recognised). "bytes" takes any bytes; a tokenizer.json takes UTF-8 and returns ZT_EFORMAT with the
 * offset of the first byte that is not. Returns 0, ZT_EFORMAT or ZT_ENOMEM with a message. */
int zt_tokenizer_encode(const zt_tokenizer *tok, const void *text, size_t len, int32_t **tokens, size_t *n,
                        zt_err *err);
/* zt_tokenizer_encode with flags (enum zt_tokenize_flag, or-ed; 0 is zt_tokenizer_encode). */
int zt_tokenizer_encode_flags(const zt_tokenizer *tok, const void *text, size_t len, unsigned flags,
                              int32_t **tokens, size_t *n, zt_err *err);

/* Encodes text a, or the pair (a, b) when b is not NULL, for a sequence-classification model, as the tokenizers
 * library's encode(a, b, add_special_tokens=True) with truncation="longest_first" to max_len tokens does
 * (max_len 0: no truncation): the post-processor's special tokens around the text or the pair ([CLS] A
 * [SEP] B [SEP]; <s> A </s></s> B </s>; a template's "pair"), and in *types each token's type id (segment:
 * 0 for A and 1 for B in BERT's layout). Truncation cuts the longer text first, from the right. The
 * "bytes" tokenizer gives the bytes of a then of b, types 0 and 1. *tokens and *types are malloc'd arrays
 * of *n entries (the caller frees both). Returns 0, ZT_EFORMAT (a text that is not UTF-8),
 * ZT_EINVAL_CONFIG (max_len cannot hold the special tokens), ZT_EUNSUPPORTED or ZT_ENOMEM. */
int zt_tokenizer_encode_pair(const zt_tokenizer *tok, const char *a, size_t alen, const char *b, size_t blen,
                             size_t max_len, int32_t **tokens, int32_t **types, size_t *n, zt_err *err);

/* Applies the normalizer of a tokenizer.json to UTF-8 text, as the library's normalizer.normalize_str does
 * (the bytes tokenizer has none: the text comes back as it is). *out (malloc'd, NUL-terminated, the NUL not
 * counted in *out_len) is freed by the caller. Returns 0, ZT_EFORMAT (the text is not UTF-8) or ZT_ENOMEM. */
int zt_tokenizer_normalize(const zt_tokenizer *tok, const void *text, size_t len, char **out, size_t *out_len,
                           zt_err *err);

/* Decodes n tokens into *text, a malloc'd buffer of *len bytes plus a NUL (not counted in *len) that the
 * caller frees. A tokenizer.json decodes through its decoders, special tokens included, as the library's
 * decode(ids, skip_special_tokens=False) does (so bytes that are not UTF-8 become U+FFFD). Returns 0,
 * ZT_EMISMATCH if a token is outside [0, vocab size) or an id the vocabulary skips (a model whose vocabulary
 * is larger than the tokenizer's), or ZT_ENOMEM. */
int zt_tokenizer_decode(const zt_tokenizer *tok, const int32_t *tokens, size_t n, char **text, size_t *len,
                        zt_err *err);

/* Points *bytes at the bytes of one token (borrowed, valid until the tokenizer is destroyed; not
 * NUL-terminated) and sets *len, for printing tokens one at a time as they are generated. For a
 * tokenizer.json these are the token's bytes inside a text: its decoders applied to it alone (a byte-level
 * or <0xXX> token gives its raw byte, which may be part of a UTF-8 character; a WordPiece token without
 * "##" starts with a space). Returns 0, or ZT_EMISMATCH if the token is outside [0, vocab size) or an id
 * the vocabulary skips. */
int zt_tokenizer_token_bytes(const zt_tokenizer *tok, int32_t token, const char **bytes, size_t *len,
                             zt_err *err);

#endif
