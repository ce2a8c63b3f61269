/* Internal to the tokenize module: the in-memory form of a Hugging Face tokenizer.json, shared by its
 * loader (tokenize_load.c, which fills it and refuses what it does not implement) and its encoder and
 * decoder (tokenize_hf.c). Users include worker/data/tokenize.h, never this file.
 *
 * The pipeline follows the tokenizers library (version 0.23): added tokens are cut out of the raw text
 * first, the rest is normalized, cut again at normalized added tokens, pre-tokenized into words, and each
 * word goes through the model; a post-processor adds special tokens when asked. Sequences of normalizers,
 * pre-tokenizers and decoders are flattened into arrays of steps, which apply in the same order. */
#ifndef ZT_WORKER_TOKENIZE_HF_H
#define ZT_WORKER_TOKENIZE_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The largest token id a tokenizer.json may use (8,388,607): the id tables hold an entry per id. */
#define ZT__HF_MAX_ID ((1 << 23) - 1)

/* An owned byte string (not NUL-terminated unless said). */
typedef struct zt__bytes {
    char *p;
    size_t len;
} zt__bytes;

/* String -> int32 map with open addressing; keys live in one arena. */
typedef struct zt__strmap {
    struct zt__strmap_entry {
        uint64_t hash;
        uint32_t off; /* key offset in arena */
        uint32_t len; /* key length, bytes */
        int32_t value;
    } *entries;
    size_t n, cap;     /* entries used / allocated */
    uint32_t *slots;   /* entry index + 1, 0 = empty; nslots is a power of two */
    size_t nslots;
    char *arena;
    size_t arena_len, arena_cap;
} zt__strmap;

/* Inserts or replaces key -> value. Returns 0 or ZT_ENOMEM. */
int zt__strmap_put(zt__strmap *m, const char *key, size_t len, int32_t value);
/* Returns the value of key, or -1 when absent (values are never negative). */
int32_t zt__strmap_get(const zt__strmap *m, const char *key, size_t len);
void zt__strmap_free(zt__strmap *m);

enum zt__norm_type {
    ZT__NORM_BERT,          /* clean_text, handle_chinese_chars, strip_accents, lowercase */
    ZT__NORM_LOWERCASE,
    ZT__NORM_NFD,
    ZT__NORM_NFKD,
    ZT__NORM_NFC,
    ZT__NORM_NFKC,
    ZT__NORM_STRIP_ACCENTS, /* drops marks, Mn Mc Me (no decomposition of its own) */
    ZT__NORM_STRIP,         /* strip_left / strip_right of White_Space */
    ZT__NORM_PREPEND,       /* a: the string put before a non-empty text */
    ZT__NORM_REPLACE,       /* a: the pattern (a plain string), b: what replaces it */
    ZT__NORM_REPLACE_SPACES, /* the Regex " {2,}" (T5's): every run of two or more spaces -> b */
    ZT__NORM_PRECOMPILED,   /* SentencePiece's precompiled charsmap (trie, ntrie, a: the normalized strings) */
};

typedef struct zt__norm {
    enum zt__norm_type type;
    bool clean_text, handle_chinese_chars, strip_accents, lowercase; /* BERT */
    bool strip_left, strip_right;                                    /* STRIP */
    zt__bytes a, b;
    uint32_t *trie;                                                  /* PRECOMPILED: double-array units */
    size_t ntrie;                                                    /* PRECOMPILED: units in trie */
} zt__norm;

enum zt__split_behavior { ZT__SPLIT_REMOVED, ZT__SPLIT_ISOLATED, ZT__SPLIT_MERGED_WITH_PREVIOUS,
                          ZT__SPLIT_MERGED_WITH_NEXT, ZT__SPLIT_CONTIGUOUS };

/* The regular expressions of Split pre-tokenizers that are implemented by hand. */
enum zt__regex { ZT__REGEX_GPT2, ZT__REGEX_CL100K, ZT__REGEX_QWEN2 };

enum zt__pretok_type {
    ZT__PRETOK_BYTE_LEVEL,       /* add_prefix_space, use_regex (GPT-2's pattern) */
    ZT__PRETOK_SPLIT_REGEX,      /* regex, behavior */
    ZT__PRETOK_SPLIT_STRING,     /* a, behavior */
    ZT__PRETOK_BERT,             /* White_Space removed, punctuation isolated */
    ZT__PRETOK_WHITESPACE_SPLIT, /* White_Space removed */
    ZT__PRETOK_PUNCTUATION,      /* behavior */
    ZT__PRETOK_DIGITS,           /* individual_digits */
    ZT__PRETOK_METASPACE,        /* a: replacement, prepend, split */
};

/* Metaspace's prepend_scheme. */
enum zt__prepend { ZT__PREPEND_ALWAYS, ZT__PREPEND_NEVER, ZT__PREPEND_FIRST };

typedef struct zt__pretok {
    enum zt__pretok_type type;
    bool add_prefix_space, use_regex; /* BYTE_LEVEL */
    bool individual_digits;           /* DIGITS */
    enum zt__prepend prepend;         /* METASPACE */
    bool split;                       /* METASPACE */
    enum zt__regex regex;
    enum zt__split_behavior behavior;
    zt__bytes a;
} zt__pretok;

enum zt__decoder_type {
    ZT__DEC_BYTE_LEVEL,
    ZT__DEC_BYTE_FALLBACK,
    ZT__DEC_FUSE,
    ZT__DEC_STRIP,     /* a: the character (UTF-8), start, stop */
    ZT__DEC_REPLACE,   /* a -> b */
    ZT__DEC_WORDPIECE, /* a: prefix, cleanup */
    ZT__DEC_BPE,       /* a: suffix */
    ZT__DEC_METASPACE, /* a: replacement, prepend */
};

typedef struct zt__decoder {
    enum zt__decoder_type type;
    zt__bytes a, b;
    int start, stop; /* STRIP: characters */
    bool cleanup;    /* WORDPIECE */
    enum zt__prepend prepend; /* METASPACE */
} zt__decoder;

/* An added token, matched in the text before the model sees it. */
typedef struct zt__added {
    zt__bytes content; /* as in the file */
    zt__bytes pattern; /* what is matched: content, or content normalized when normalized is true */
    int32_t id;
    bool special, normalized, lstrip, rstrip;
} zt__added;

/* Leftmost-longest matching of a set of added tokens (those with normalized true, or false). */
typedef struct zt__added_set {
    int *order;         /* indices into hf->added, grouped by first byte, longest first */
    int start[257];     /* order[start[b] .. start[b + 1]) begin with byte b */
    int count;
} zt__added_set;

enum zt__model_type { ZT__MODEL_BPE, ZT__MODEL_WORDPIECE, ZT__MODEL_UNIGRAM };

typedef struct zt__hf {
    /* model */
    enum zt__model_type model;
    zt__strmap vocab;        /* the model's vocabulary */
    int32_t unk_id;          /* -1: none */
    zt__bytes unk_token;
    zt__bytes subword_prefix; /* continuing_subword_prefix ("" when none) */
    zt__bytes word_suffix;    /* BPE end_of_word_suffix ("" when none) */
    bool fuse_unk, byte_fallback, ignore_merges; /* BPE */
    int32_t byte_ids[256];   /* BPE byte_fallback: id of <0xXX>, -1 when absent */
    int max_input_chars_per_word; /* WordPiece */
    bool split_at_meta;      /* BPE whose merges can never join across a "▁" (U+2581): words are cut before
                              * each one, which gives the same ids, faster */
    size_t max_token_len;    /* longest vocabulary entry, bytes */
    /* Unigram: the pieces in file order (the id is the index; a piece listed twice keeps both ids, and the
     * vocabulary map above, like the library's, the last), their scores, the lowest score, and every proper
     * prefix of a piece that ends on a character boundary (so that the search for pieces at a position can
     * stop early) */
    zt__bytes *uni_pieces;   /* [nuni] */
    double *uni_scores;      /* [nuni] */
    int32_t nuni;
    double uni_min_score;
    zt__strmap uni_prefixes;
    /* BPE merges: (left id, right id) -> rank and merged id */
    struct zt__merge { uint64_t key; uint32_t rank; int32_t id; } *merges; /* open addressing; key 0 = empty */
    size_t merges_mask;      /* slots - 1 */
    /* pipeline */
    zt__norm *norms;
    int nnorms;
    zt__pretok *pretoks;
    int npretoks;
    zt__decoder *decoders;
    int ndecoders;
    bool has_decoder;        /* false: tokens are joined with spaces, as the library does without one */
    /* added tokens and post-processing */
    zt__added *added;
    int nadded;
    zt__added_set raw_set, norm_set; /* normalized false / true */
    int32_t *prefix_ids, *suffix_ids; /* added around a text when special tokens are asked for */
    int nprefix, nsuffix;
    /* The layout of a pair of texts (zt__hf_encode_pair): the pieces of the post-processor that defines one
     * (TemplateProcessing's "pair", BertProcessing, RobertaProcessing), in order. npair 0 with
     * pair_processors 0: no such post-processor, and a pair is A then B, with type ids 0 and 1, as the
     * library's default processing gives it. More than one such post-processor: pairs are refused. */
    struct zt__pair_piece {
        int seq;          /* 0: special tokens (ids), 1: the text A, 2: the text B */
        int32_t type_id;
        int32_t *ids;     /* seq 0 */
        int nids;
    } *pair;
    int npair;
    int pair_processors;
    const char *pair_problem; /* why pairs are refused (a pair template ztrain cannot use), or NULL; such a
                               * template does not stop the tokenizer from loading: single texts work */
    /* id -> token */
    int32_t vocab_size;      /* largest id + 1 */
    zt__bytes *tokens;       /* [vocab_size]: the token string (added tokens: their content); p NULL for holes */
    zt__bytes *pieces;       /* [vocab_size]: the bytes the token stands for inside a text (decoders applied
                              * token by token), for zt_tokenizer_token_bytes */
    bool *is_special;        /* [vocab_size] */
    char kind[32];           /* "bpe", "byte-level-bpe", "wordpiece", "unigram" */
} zt__hf;

/* Parses a tokenizer.json text into hf (zeroed by the caller); where names the file in messages. Returns
 * 0, ZT_EFORMAT (not JSON, or a field of the wrong type), ZT_EUNSUPPORTED (a component, field or value
 * this build does not implement, named by its JSON path) or ZT_ENOMEM. On failure the caller frees hf with
 * zt__hf_free. */
int zt__hf_load(zt__hf *hf, const char *json, size_t len, const char *where, zt_err *err);
void zt__hf_free(zt__hf *hf);

/* Applies the normalizer steps to text; *out is malloc'd (freed by the caller). Returns 0 or ZT_ENOMEM. */
int zt__hf_normalize(const zt__hf *hf, const char *text, size_t len, zt__bytes *out, zt_err *err);

/* Encodes valid UTF-8 text (the public zt_tokenizer_encode checks it) into *ids (malloc'd, *n ids). */
int zt__hf_encode(const zt__hf *hf, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                  zt_err *err);

/* The lengths texts A and B (*na, *nb tokens) keep within budget tokens, as the library's "longest_first"
 * truncation gives them: only the longer one is cut while the shorter fits in half; otherwise both get
 * half (B the odd token). */
void zt__truncate_longest_first(size_t *na, size_t *nb, size_t budget);

/* Encodes the text a, or with b the pair (a, b), as the library's encode(a, b, add_special_tokens=True)
 * does with truncation to max_len tokens ("longest_first", from the right; 0: no truncation): special
 * tokens of the post-processor around them, and each id's type id (segment) in *types. Both texts are
 * valid UTF-8 (b may be NULL). *ids and *types are malloc'd, *n entries each. Returns 0, ZT_EINVAL_CONFIG
 * (max_len is shorter than the special tokens), ZT_EUNSUPPORTED (post-processors that disagree on pairs)
 * or ZT_ENOMEM. */
int zt__hf_encode_pair(const zt__hf *hf, const char *a, size_t alen, const char *b, size_t blen, size_t max_len,
                       int32_t **ids, int32_t **types, size_t *n, zt_err *err);

/* Decodes ids (each in [0, vocab_size), not a hole) through the decoders into *out (malloc'd, NUL-terminated,
 * the NUL not counted in out->len). */
int zt__hf_decode(const zt__hf *hf, const int32_t *ids, size_t n, zt__bytes *out, zt_err *err);

/* The bytes of one token as it appears inside a decoded text (the per-token decoders applied), malloc'd. */
int zt__hf_token_piece(const zt__hf *hf, int32_t id, zt__bytes *out, zt_err *err);

#endif
