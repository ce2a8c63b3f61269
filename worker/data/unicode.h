/* Unicode character data and UTF-8 for the tokenizers (worker/data/tokenize.h).
 *
 * The pre-tokenizers and normalizers of Hugging Face tokenizer.json files are written by hand over UTF-8
 * (no regex library), so they need a few character properties: general categories (letters, numbers,
 * punctuation, marks, controls), White_Space, lowercase mappings, canonical decompositions and combining
 * classes (NFD). The tables are generated from Python's unicodedata by tools/gen_unicode_tables.py into
 * worker/data/unicode_tables.c; zt_unicode_version() names their Unicode version. Everything here is
 * read-only data and pure functions: safe from any thread. */
#ifndef ZT_WORKER_UNICODE_H
#define ZT_WORKER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* General categories, in the order of the generated tables (Cn, unassigned, is 0). */
enum zt_ucat {
    ZT_UCAT_CN, ZT_UCAT_LU, ZT_UCAT_LL, ZT_UCAT_LT, ZT_UCAT_LM, ZT_UCAT_LO, ZT_UCAT_MN, ZT_UCAT_MC,
    ZT_UCAT_ME, ZT_UCAT_ND, ZT_UCAT_NL, ZT_UCAT_NO, ZT_UCAT_PC, ZT_UCAT_PD, ZT_UCAT_PS, ZT_UCAT_PE,
    ZT_UCAT_PI, ZT_UCAT_PF, ZT_UCAT_PO, ZT_UCAT_SM, ZT_UCAT_SC, ZT_UCAT_SK, ZT_UCAT_SO, ZT_UCAT_ZS,
    ZT_UCAT_ZL, ZT_UCAT_ZP, ZT_UCAT_CC, ZT_UCAT_CF, ZT_UCAT_CS, ZT_UCAT_CO,
};

/* The largest code point, plus one. */
#define ZT_UNICODE_LIMIT 0x110000u
/* At most this many code points come out of zt_unicode_lower or zt_unicode_nfd for one code point. */
#define ZT_UNICODE_MAX_EXPANSION 4
/* At most this many come out of zt_unicode_nfkd (U+FDFA, an Arabic ligature, makes 18). */
#define ZT_UNICODE_MAX_NFKD 18

/* The generated tables (worker/data/unicode_tables.c); read them through the functions below. */
typedef struct zt__uc_map {
    uint32_t cp;    /* the code point mapped */
    uint32_t start; /* index of its mapping in the pool */
    uint8_t len;    /* code points in the mapping */
} zt__uc_map;
typedef struct zt__uc_range {
    uint32_t first, last; /* inclusive */
    uint8_t value;
} zt__uc_range;
typedef struct zt__uc_pair {
    uint32_t first, second, composite;
} zt__uc_pair;
extern const char zt__unicode_tables_version[];
extern const uint16_t zt__uc_cat_stage1[ZT_UNICODE_LIMIT >> 8];
extern const uint8_t zt__uc_cat_stage2[];
extern const int zt__uc_lower_count, zt__uc_nfd_count, zt__uc_ccc_count, zt__uc_nfkd_count, zt__uc_comp_count;
extern const zt__uc_map zt__uc_lower[], zt__uc_nfd[], zt__uc_nfkd[];
extern const uint32_t zt__uc_lower_pool[], zt__uc_nfd_pool[], zt__uc_nfkd_pool[];
extern const zt__uc_range zt__uc_ccc[];
extern const zt__uc_pair zt__uc_comp[];

/* Returns the Unicode version of the tables, such as "14.0.0" (a static string). */
const char *zt_unicode_version(void);

/* Returns the general category (enum zt_ucat) of cp; ZT_UCAT_CN for anything >= ZT_UNICODE_LIMIT. */
static inline int zt_unicode_category(uint32_t cp)
{
    if (cp >= ZT_UNICODE_LIMIT)
        return ZT_UCAT_CN;
    return zt__uc_cat_stage2[(size_t)zt__uc_cat_stage1[cp >> 8] * 256u + (cp & 255u)];
}

/* \p{L}: Lu, Ll, Lt, Lm, Lo. */
static inline bool zt_unicode_is_letter(uint32_t cp)
{
    int c = zt_unicode_category(cp);
    return c >= ZT_UCAT_LU && c <= ZT_UCAT_LO;
}

/* \p{N}: Nd, Nl, No. */
static inline bool zt_unicode_is_number(uint32_t cp)
{
    int c = zt_unicode_category(cp);
    return c >= ZT_UCAT_ND && c <= ZT_UCAT_NO;
}

/* Punctuation: Pc, Pd, Ps, Pe, Pi, Pf, Po. */
static inline bool zt_unicode_is_punctuation(uint32_t cp)
{
    int c = zt_unicode_category(cp);
    return c >= ZT_UCAT_PC && c <= ZT_UCAT_PO;
}

/* The White_Space property (what regex \s and Rust's char::is_whitespace match): tab to carriage return,
 * space, U+0085, U+00A0, U+1680, U+2000 to U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
bool zt_unicode_is_white_space(uint32_t cp);

/* The CJK blocks the BERT normalizer puts spaces around (handle_chinese_chars). */
bool zt_unicode_is_cjk(uint32_t cp);

/* Writes the full lowercase mapping of cp (what Rust's char::to_lowercase gives) into out and returns
 * its length, 1 to ZT_UNICODE_MAX_EXPANSION (1 and cp itself when cp has no lowercase mapping). */
int zt_unicode_lower(uint32_t cp, uint32_t out[ZT_UNICODE_MAX_EXPANSION]);

/* Writes the full canonical decomposition of cp (Hangul syllables included) into out and returns its
 * length, 1 to ZT_UNICODE_MAX_EXPANSION (1 and cp itself when cp does not decompose). */
int zt_unicode_nfd(uint32_t cp, uint32_t out[ZT_UNICODE_MAX_EXPANSION]);

/* Returns the canonical combining class of cp (0 for most characters). */
int zt_unicode_ccc(uint32_t cp);

/* Writes the compatibility decomposition of cp, fully expanded (NFKD of cp alone), into out and returns its
 * length, 1 to ZT_UNICODE_MAX_NFKD (1 and cp itself when cp does not decompose). */
int zt_unicode_nfkd(uint32_t cp, uint32_t out[ZT_UNICODE_MAX_NFKD]);

/* Returns the primary composite of first + second (canonical composition, Hangul included), or 0 when
 * they do not compose. */
uint32_t zt_unicode_compose(uint32_t first, uint32_t second);

/* Returns the end (a byte offset) of the extended grapheme cluster that begins at byte i of the valid
 * UTF-8 s (len bytes), by the rules of Unicode's UAX #29 (GB3 to GB13; not GB9c, the Indic conjuncts of
 * Unicode 15.1) over the Grapheme_Cluster_Break property of Unicode 14.0. Returns len when i >= len. */
size_t zt_unicode_grapheme_end(const unsigned char *s, size_t len, size_t i);

/* Decodes one UTF-8 character at s (len > 0 bytes available): returns its length (1 to 4) and sets *cp,
 * or returns 0 if the bytes there are not well-formed UTF-8 (overlong forms, surrogates and code points
 * above U+10FFFF are not). */
int zt_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);

/* Encodes cp (< ZT_UNICODE_LIMIT) as UTF-8 into out and returns its length, 1 to 4. */
int zt_utf8_encode(uint32_t cp, char out[4]);

/* Returns the offset of the first byte of s that does not start a well-formed UTF-8 character, or len
 * when all of s is well-formed. */
size_t zt_utf8_valid_prefix(const void *s, size_t len);

/* Returns the length of the maximal prefix of an ill-formed sequence at s (1 to 3 bytes; len > 0 and s not
 * starting a well-formed character): the bytes that one U+FFFD replaces in a lossy conversion, as
 * Rust's String::from_utf8_lossy and Python's bytes.decode(errors="replace") count them. */
int zt_utf8_invalid_length(const unsigned char *s, size_t len);

#endif
