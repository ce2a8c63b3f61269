/* Encoding and decoding with a Hugging Face tokenizer.json (loaded by tokenize_load.c), written to give the
 * ids of the tokenizers library (0.23) for the components it implements.
 *
 * Encoding: added tokens are cut out of the raw text (leftmost-longest), each remaining piece is normalized
 * and cut at the normalized added tokens, pre-tokenized into words by the pre-tokenizer steps, and each word
 * goes through the model: BPE (merges applied by rank with a heap over a linked list of symbols, as the
 * library's Word::merge_all does; byte fallback, unknown-token fusing) or WordPiece (greedy longest match).
 * Words repeat, so the ids of each word are kept in a cache for the length of one encode call. The split
 * regexes (GPT-2's, cl100k's, Qwen2's) are matched by hand, alternative by alternative, with the same
 * backtracking outcome as Oniguruma.
 *
 * Decoding runs the decoders over the list of token strings, as the library does. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/data/tokenize_hf.h"
#include "worker/data/unicode.h"

/* ---- growable buffers ------------------------------------------------------------------------------ */

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static int buf_reserve(buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return ZT_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_add(buf *b, const void *s, size_t n)
{
    if (buf_reserve(b, n + 1) != 0)
        return ZT_ENOMEM;
    if (n > 0)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* Decodes the character at s[i] of valid UTF-8 (the encoder checks its input once). */
static inline uint32_t next_cp(const unsigned char *s, size_t i, int *n)
{
    unsigned char b = s[i];
    if (b < 0x80) {
        *n = 1;
        return b;
    }
    if (b < 0xE0) {
        *n = 2;
        return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (b < 0xF0) {
        *n = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6) |
           (s[i + 3] & 0x3F);
}

/* ---- character classes of the pre-tokenizers ------------------------------------------------------- */

enum { CL_L = 1, CL_N = 2, CL_S = 4 };

static unsigned char ascii_class[128];

static void init_ascii_class(void)
{
    for (int c = 0; c < 128; c++) {
        unsigned char k = 0;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            k |= CL_L;
        if (c >= '0' && c <= '9')
            k |= CL_N;
        if (c == ' ' || (c >= 9 && c <= 13))
            k |= CL_S;
        ascii_class[c] = k;
    }
}

static inline unsigned cp_class(uint32_t cp)
{
    if (cp < 128)
        return ascii_class[cp];
    unsigned k = 0;
    if (zt_unicode_is_letter(cp))
        k |= CL_L;
    else if (zt_unicode_is_number(cp))
        k |= CL_N;
    else if (zt_unicode_is_white_space(cp))
        k |= CL_S;
    return k;
}

/* Class of the character at s[i] (0 past the end) and its length. */
static inline unsigned class_at(const unsigned char *s, size_t len, size_t i, uint32_t *cp, int *n)
{
    if (i >= len) {
        *n = 0;
        *cp = 0;
        return 0;
    }
    *cp = next_cp(s, i, n);
    return cp_class(*cp);
}

/* End of the run of characters of class mask from i (at most max characters; max < 0: no limit). */
static size_t run_of(const unsigned char *s, size_t len, size_t i, unsigned mask, bool want, int max)
{
    int count = 0;
    while (i < len && (max < 0 || count < max)) {
        uint32_t cp;
        int n;
        unsigned k = class_at(s, len, i, &cp, &n);
        if (((k & mask) != 0) != want)
            break;
        i += (size_t)n;
        count++;
    }
    return i;
}

/* [^\s\p{L}\p{N}] */
static inline bool is_other_class(unsigned k)
{
    return (k & (CL_L | CL_N | CL_S)) == 0;
}

/* ASCII case-insensitive compare of s[i..] with lower-case word w; 's' also matches U+017F (long s), as
 * Unicode case folding does under (?i). Returns the matched length or 0. */
static size_t match_ci(const unsigned char *s, size_t len, size_t i, const char *w, bool fold)
{
    size_t j = i;
    for (const char *c = w; *c; c++) {
        if (j >= len)
            return 0;
        unsigned char b = s[j];
        if (b == (unsigned char)*c || (fold && b < 128 && b + 32 == (unsigned char)*c)) {
            j++;
            continue;
        }
        if (fold && *c == 's' && j + 1 < len && b == 0xC5 && s[j + 1] == 0xBF) {
            j += 2;
            continue;
        }
        return 0;
    }
    return j - i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i (an apostrophe there); fold: case-insensitive. */
static size_t contraction(const unsigned char *s, size_t len, size_t i, bool fold)
{
    static const char *const words[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (int w = 0; w < 7; w++) {
        size_t m = match_ci(s, len, i + 1, words[w], fold);
        if (m)
            return i + 1 + m;
    }
    return 0;
}

/* \s+(?!\S) then \s+ at i (whitespace there): the run, less its last character when a non-space follows and
 * the run has more than one character. */
static size_t whitespace_tail(const unsigned char *s, size_t len, size_t i)
{
    size_t end = i, last = i;
    while (end < len) {
        uint32_t cp;
        int n;
        unsigned k = class_at(s, len, end, &cp, &n);
        if (!(k & CL_S))
            break;
        last = end;
        end += (size_t)n;
    }
    if (end == len || last == i)
        return end;
    return last;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ; returns the end of the
 * match at i (every position matches something). */
static size_t match_gpt2(const unsigned char *s, size_t len, size_t i)
{
    if (s[i] == '\'') {
        size_t e = contraction(s, len, i, false);
        if (e)
            return e;
    }
    uint32_t c0, c1;
    int n0, n1;
    unsigned k0 = class_at(s, len, i, &c0, &n0);
    unsigned k1 = class_at(s, len, i + (size_t)n0, &c1, &n1);
    bool space = c0 == ' ';
    if (space && (k1 & CL_L))
        return run_of(s, len, i + 1, CL_L, true, -1);
    if (k0 & CL_L)
        return run_of(s, len, i, CL_L, true, -1);
    if (space && (k1 & CL_N))
        return run_of(s, len, i + 1, CL_N, true, -1);
    if (k0 & CL_N)
        return run_of(s, len, i, CL_N, true, -1);
    if (space && n1 > 0 && is_other_class(k1))
        return run_of(s, len, i + 1, CL_L | CL_N | CL_S, false, -1);
    if (is_other_class(k0))
        return run_of(s, len, i, CL_L | CL_N | CL_S, false, -1);
    return whitespace_tail(s, len, i);
}

static size_t crlf_run(const unsigned char *s, size_t len, size_t i)
{
    while (i < len && (s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* cl100k (LLaMA-3) and Qwen2, which differ in \p{N}{1,3} against \p{N}:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
 * \s+(?!\S)|\s+ */
static size_t match_cl100k(const unsigned char *s, size_t len, size_t i, int max_digits)
{
    if (s[i] == '\'') {
        size_t e = contraction(s, len, i, true);
        if (e)
            return e;
    }
    uint32_t c0, c1;
    int n0, n1;
    unsigned k0 = class_at(s, len, i, &c0, &n0);
    unsigned k1 = class_at(s, len, i + (size_t)n0, &c1, &n1);
    if (k0 & CL_L)
        return run_of(s, len, i, CL_L, true, -1);
    if (c0 != '\r' && c0 != '\n' && !(k0 & CL_N) && (k1 & CL_L))
        return run_of(s, len, i + (size_t)n0, CL_L, true, -1);
    if (k0 & CL_N)
        return run_of(s, len, i, CL_N, true, max_digits);
    if (c0 == ' ' && n1 > 0 && is_other_class(k1))
        return crlf_run(s, len, run_of(s, len, i + 1, CL_L | CL_N | CL_S, false, -1));
    if (is_other_class(k0))
        return crlf_run(s, len, run_of(s, len, i, CL_L | CL_N | CL_S, false, -1));
    /* whitespace: \s*[\r\n]+ ends after the run's last CR or LF */
    size_t end = i, last_crlf = 0;
    bool any = false;
    while (end < len) {
        uint32_t cp;
        int n;
        unsigned k = class_at(s, len, end, &cp, &n);
        if (!(k & CL_S))
            break;
        if (cp == '\r' || cp == '\n') {
            last_crlf = end;
            any = true;
        }
        end += (size_t)n;
    }
    if (any)
        return last_crlf + 1;
    return whitespace_tail(s, len, i);
}

/* ---- splits ------------------------------------------------------------------------------------------ */

typedef struct span {
    size_t off, len;
} span;

typedef struct splits {
    buf text;
    span *v;
    size_t n, cap;
} splits;

static int splits_push(splits *s, const char *p, size_t len)
{
    if (len == 0)
        return 0; /* the library drops empty splits */
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        span *v = realloc(s->v, cap * sizeof(span));
        if (!v)
            return ZT_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (span){s->text.len, len};
    return buf_add(&s->text, p, len);
}

typedef struct seg {
    size_t start, end;
    bool match;
} seg;

typedef struct encoder {
    const zt__hf *hf;
    int32_t *ids;
    size_t n, cap;
    splits a, b;
    seg *segs;
    size_t nsegs, capsegs;
    buf norm, norm2, word, tmp;
    /* word cache: word -> offset in pool of [count, ids...] */
    zt__strmap cache;
    int32_t *pool;
    size_t npool, cappool;
    /* BPE */
    struct sym {
        int32_t id, prev, next;
        uint32_t len;
    } *syms;
    size_t capsyms;
    struct hitem {
        uint32_t rank, pos;
        int32_t id;
    } *heap;
    size_t nheap, capheap;
    int32_t *wids;
    size_t nwids, capwids;
    /* Unigram: the best path ending at each byte of a word */
    struct best {
        double score;
        int64_t start; /* -1: no path ends here yet */
        int32_t id;
    } *best;
    size_t capbest;
    struct cut {
        size_t start, end;
    } *cuts;
    size_t ncuts, capcuts;
    char problem[400]; /* why a text cannot be encoded (a character without a piece and no unk_id) */
} encoder;

static int push_id(encoder *e, int32_t id)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 1024;
        int32_t *p = realloc(e->ids, cap * sizeof(int32_t));
        if (!p)
            return ZT_ENOMEM;
        e->ids = p;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
    return 0;
}

static int push_seg(encoder *e, size_t start, size_t end, bool match)
{
    if (e->nsegs == e->capsegs) {
        size_t cap = e->capsegs ? e->capsegs * 2 : 64;
        seg *p = realloc(e->segs, cap * sizeof(seg));
        if (!p)
            return ZT_ENOMEM;
        e->segs = p;
        e->capsegs = cap;
    }
    e->segs[e->nsegs++] = (seg){start, end, match};
    return 0;
}

/* Turns e->segs (covering text s) into splits of out according to behavior, as NormalizedString::split. */
static int apply_behavior(encoder *e, const char *s, enum zt__split_behavior behavior, splits *out)
{
    size_t n = e->nsegs;
    seg *g = e->segs;
    if (behavior == ZT__SPLIT_ISOLATED || behavior == ZT__SPLIT_REMOVED) {
        for (size_t i = 0; i < n; i++)
            if (!(behavior == ZT__SPLIT_REMOVED && g[i].match) &&
                splits_push(out, s + g[i].start, g[i].end - g[i].start) != 0)
                return ZT_ENOMEM;
        return 0;
    }
    /* The merging behaviors fold neighbouring segments together; fold in place, then emit. */
    size_t m = 0;
    if (behavior == ZT__SPLIT_MERGED_WITH_NEXT) {
        bool prev_match = false;
        for (size_t i = n; i-- > 0;) {
            bool match = g[i].match; /* read first: the slot written below may be g[i] itself */
            if (match && !prev_match && m > 0)
                g[n - m].start = g[i].start; /* merge into the next (the last kept, stored from the end) */
            else
                g[n - ++m] = (seg){g[i].start, g[i].end, false};
            prev_match = match;
        }
        for (size_t i = n - m; i < n; i++)
            if (splits_push(out, s + g[i].start, g[i].end - g[i].start) != 0)
                return ZT_ENOMEM;
        return 0;
    }
    bool prev_match = false;
    for (size_t i = 0; i < n; i++) {
        bool match = g[i].match; /* read first: the slot written below may be g[i] itself */
        bool merge = behavior == ZT__SPLIT_CONTIGUOUS ? match == prev_match : match && !prev_match;
        if (merge && m > 0)
            g[m - 1].end = g[i].end;
        else
            g[m++] = (seg){g[i].start, g[i].end, false};
        prev_match = match;
    }
    for (size_t i = 0; i < m; i++)
        if (splits_push(out, s + g[i].start, g[i].end - g[i].start) != 0)
            return ZT_ENOMEM;
    return 0;
}

/* Bytes -> the printable characters of GPT-2's byte-level alphabet (UTF-8, one or two bytes). */
static struct {
    char c[2];
    unsigned char n;
} byte_chars[256];
static unsigned char char_bytes_lo[512]; /* code point (< 512) -> byte, valid where char_bytes_ok */
static bool char_bytes_ok[512];

static void init_byte_chars(void)
{
    int next = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)next++;
        char u[4];
        int n = zt_utf8_encode(cp, u);
        memcpy(byte_chars[b].c, u, (size_t)n);
        byte_chars[b].n = (unsigned char)n;
        char_bytes_lo[cp] = (unsigned char)b;
        char_bytes_ok[cp] = true;
    }
}

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    init_ascii_class();
    init_byte_chars();
}

/* Fills the static tables above once per process, whichever thread gets here first. */
static void ensure_tables(void)
{
    pthread_once(&tables_once, init_tables);
}

static int byte_level_map(const char *s, size_t len, splits *out)
{
    size_t start = out->text.len;
    if (buf_reserve(&out->text, 2 * len + 1) != 0)
        return ZT_ENOMEM;
    char *d = out->text.p + out->text.len;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        *d++ = byte_chars[b].c[0];
        if (byte_chars[b].n == 2)
            *d++ = byte_chars[b].c[1];
    }
    size_t n = (size_t)(d - (out->text.p + start));
    out->text.len = start;
    /* splits_push copies; write in place instead */
    if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 64;
        span *v = realloc(out->v, cap * sizeof(span));
        if (!v)
            return ZT_ENOMEM;
        out->v = v;
        out->cap = cap;
    }
    if (n == 0)
        return 0;
    out->v[out->n++] = (span){start, n};
    out->text.len = start + n;
    return 0;
}

static bool is_bert_punct(uint32_t cp)
{
    if (cp < 128)
        return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
    return zt_unicode_is_punctuation(cp);
}

static bool is_numeric(uint32_t cp)
{
    return zt_unicode_is_number(cp);
}

/* One pre-tokenizer step over every split of in, into out. at_start: in's first split begins the text (what
 * Metaspace's prepend_scheme "first" asks; the loader allows it only as the first step). */
static int pretok_step(encoder *e, const zt__pretok *t, const splits *in, splits *out, bool at_start)
{
    for (size_t k = 0; k < in->n; k++) {
        const char *s = in->text.p + in->v[k].off;
        size_t len = in->v[k].len;
        const unsigned char *u = (const unsigned char *)s;
        e->nsegs = 0;
        switch (t->type) {
        case ZT__PRETOK_BYTE_LEVEL: {
            if (t->add_prefix_space && s[0] != ' ') {
                e->tmp.len = 0;
                if (buf_add(&e->tmp, " ", 1) != 0 || buf_add(&e->tmp, s, len) != 0)
                    return ZT_ENOMEM;
                s = e->tmp.p;
                len = e->tmp.len;
                u = (const unsigned char *)s;
            }
            if (!t->use_regex) {
                if (byte_level_map(s, len, out) != 0)
                    return ZT_ENOMEM;
                break;
            }
            for (size_t i = 0; i < len;) {
                size_t end = match_gpt2(u, len, i);
                if (byte_level_map(s + i, end - i, out) != 0)
                    return ZT_ENOMEM;
                i = end;
            }
            break;
        }
        case ZT__PRETOK_SPLIT_REGEX:
            for (size_t i = 0; i < len;) {
                size_t end = t->regex == ZT__REGEX_GPT2 ? match_gpt2(u, len, i)
                                                        : match_cl100k(u, len, i, t->regex == ZT__REGEX_CL100K ? 3 : 1);
                if (push_seg(e, i, end, true) != 0)
                    return ZT_ENOMEM;
                i = end;
            }
            if (apply_behavior(e, s, t->behavior, out) != 0)
                return ZT_ENOMEM;
            break;
        case ZT__PRETOK_SPLIT_STRING: {
            size_t prev = 0;
            for (size_t i = 0; i + t->a.len <= len;) {
                const char *hit = memmem(s + i, len - i, t->a.p, t->a.len);
                if (!hit)
                    break;
                size_t at = (size_t)(hit - s);
                if (at > prev && push_seg(e, prev, at, false) != 0)
                    return ZT_ENOMEM;
                if (push_seg(e, at, at + t->a.len, true) != 0)
                    return ZT_ENOMEM;
                prev = i = at + t->a.len;
            }
            if (prev < len && push_seg(e, prev, len, false) != 0)
                return ZT_ENOMEM;
            if (apply_behavior(e, s, t->behavior, out) != 0)
                return ZT_ENOMEM;
            break;
        }
        case ZT__PRETOK_BERT:
        case ZT__PRETOK_WHITESPACE_SPLIT: {
            size_t word = 0;
            for (size_t i = 0; i < len;) {
                int n;
                uint32_t cp = next_cp(u, i, &n);
                if (zt_unicode_is_white_space(cp)) {
                    if (splits_push(out, s + word, i - word) != 0)
                        return ZT_ENOMEM;
                    word = i + (size_t)n;
                } else if (t->type == ZT__PRETOK_BERT && is_bert_punct(cp)) {
                    if (splits_push(out, s + word, i - word) != 0 || splits_push(out, s + i, (size_t)n) != 0)
                        return ZT_ENOMEM;
                    word = i + (size_t)n;
                }
                i += (size_t)n;
            }
            if (splits_push(out, s + word, len - word) != 0)
                return ZT_ENOMEM;
            break;
        }
        case ZT__PRETOK_METASPACE: {
            /* spaces become the replacement, which may also go in front; split: cut before each one */
            e->tmp.len = 0;
            const zt__bytes *rep = &t->a;
            bool starts = len > 0 && (s[0] == ' ' || (len >= rep->len && memcmp(s, rep->p, rep->len) == 0));
            bool prepend = t->prepend == ZT__PREPEND_ALWAYS || (t->prepend == ZT__PREPEND_FIRST && k == 0 && at_start);
            if (prepend && !starts && buf_add(&e->tmp, rep->p, rep->len) != 0)
                return ZT_ENOMEM;
            for (size_t i = 0; i < len; i++)
                if ((s[i] == ' ' ? buf_add(&e->tmp, rep->p, rep->len) : buf_add(&e->tmp, s + i, 1)) != 0)
                    return ZT_ENOMEM;
            const char *r = e->tmp.p;
            size_t rlen = e->tmp.len;
            if (!t->split) {
                if (splits_push(out, r, rlen) != 0)
                    return ZT_ENOMEM;
                break;
            }
            size_t prev = 0;
            for (size_t i = 0; i + rep->len <= rlen;) {
                const char *hit = memmem(r + i, rlen - i, rep->p, rep->len);
                if (!hit)
                    break;
                size_t at = (size_t)(hit - r);
                if ((at > prev && push_seg(e, prev, at, false) != 0) || push_seg(e, at, at + rep->len, true) != 0)
                    return ZT_ENOMEM;
                prev = i = at + rep->len;
            }
            if (prev < rlen && push_seg(e, prev, rlen, false) != 0)
                return ZT_ENOMEM;
            if (apply_behavior(e, r, ZT__SPLIT_MERGED_WITH_NEXT, out) != 0)
                return ZT_ENOMEM;
            break;
        }
        case ZT__PRETOK_PUNCTUATION:
        case ZT__PRETOK_DIGITS: {
            size_t prev = 0;
            for (size_t i = 0; i < len;) {
                int n;
                uint32_t cp = next_cp(u, i, &n);
                bool hit = t->type == ZT__PRETOK_PUNCTUATION ? is_bert_punct(cp) : is_numeric(cp);
                if (hit) {
                    if (i > prev && push_seg(e, prev, i, false) != 0)
                        return ZT_ENOMEM;
                    if (push_seg(e, i, i + (size_t)n, true) != 0)
                        return ZT_ENOMEM;
                    prev = i + (size_t)n;
                }
                i += (size_t)n;
            }
            if (prev < len && push_seg(e, prev, len, false) != 0)
                return ZT_ENOMEM;
            enum zt__split_behavior b = t->type == ZT__PRETOK_PUNCTUATION ? t->behavior
                                        : t->individual_digits             ? ZT__SPLIT_ISOLATED
                                                                           : ZT__SPLIT_CONTIGUOUS;
            if (apply_behavior(e, s, b, out) != 0)
                return ZT_ENOMEM;
            break;
        }
        }
    }
    return 0;
}

/* ---- normalizers ----------------------------------------------------------------------------------- */

typedef struct cpvec {
    uint32_t *v;
    size_t n, cap;
} cpvec;

static int cp_push(cpvec *c, uint32_t cp)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        uint32_t *v = realloc(c->v, cap * sizeof(uint32_t));
        if (!v)
            return ZT_ENOMEM;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = cp;
    return 0;
}

/* Canonical ordering: every run of characters with a non-zero combining class is sorted by class, keeping
 * the order of equal classes (insertion sort: the runs are short). */
static void canonical_order(cpvec *c)
{
    for (size_t i = 1; i < c->n; i++) {
        int ci = zt_unicode_ccc(c->v[i]);
        if (ci == 0)
            continue;
        size_t j = i;
        uint32_t x = c->v[i];
        while (j > 0) {
            int cj = zt_unicode_ccc(c->v[j - 1]);
            if (cj == 0 || cj <= ci)
                break;
            c->v[j] = c->v[j - 1];
            j--;
        }
        c->v[j] = x;
    }
}

static int decompose(const cpvec *in, cpvec *out)
{
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        uint32_t d[ZT_UNICODE_MAX_EXPANSION];
        int k = zt_unicode_nfd(in->v[i], d);
        for (int j = 0; j < k; j++)
            if (cp_push(out, d[j]) != 0)
                return ZT_ENOMEM;
    }
    canonical_order(out);
    return 0;
}

/* Compatibility decomposition (NFKD) of in into out, canonically ordered. */
static int decompose_compat(const cpvec *in, cpvec *out)
{
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        uint32_t d[ZT_UNICODE_MAX_NFKD];
        int k = zt_unicode_nfkd(in->v[i], d);
        for (int j = 0; j < k; j++)
            if (cp_push(out, d[j]) != 0)
                return ZT_ENOMEM;
    }
    canonical_order(out);
    return 0;
}

/* Canonical composition of a decomposed, ordered c, in place (UAX #15): a character joins the last starter
 * when it is not blocked from it (no character between them of its combining class or higher, or a starter
 * right after the starter). */
static void compose(cpvec *c)
{
    size_t w = 0;
    bool have_starter = false;
    size_t starter = 0; /* where the last starter is in the output */
    int last = 0;       /* class of the last character written after it; 0: it is the last one written */
    for (size_t i = 0; i < c->n; i++) {
        uint32_t ch = c->v[i];
        int cc = zt_unicode_ccc(ch);
        if (have_starter && (last < cc || last == 0)) {
            uint32_t comp = zt_unicode_compose(c->v[starter], ch);
            if (comp) {
                c->v[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            have_starter = true;
            starter = w;
            last = 0;
        } else {
            last = cc;
        }
        c->v[w++] = ch;
    }
    c->n = w;
}

static int to_cps(const char *s, size_t len, cpvec *c)
{
    c->n = 0;
    for (size_t i = 0; i < len;) {
        int n;
        uint32_t cp = next_cp((const unsigned char *)s, i, &n);
        if (cp_push(c, cp) != 0)
            return ZT_ENOMEM;
        i += (size_t)n;
    }
    return 0;
}

static int from_cps(const cpvec *c, buf *out)
{
    out->len = 0;
    if (buf_reserve(out, c->n * 4 + 1) != 0)
        return ZT_ENOMEM;
    for (size_t i = 0; i < c->n; i++)
        out->len += (size_t)zt_utf8_encode(c->v[i], out->p + out->len);
    return 0;
}

static bool is_bert_control(uint32_t cp)
{
    if (cp == '\t' || cp == '\n' || cp == '\r')
        return false;
    int k = zt_unicode_category(cp);
    return k == ZT_UCAT_CC || k == ZT_UCAT_CF || k == ZT_UCAT_CO;
}

static int lower_cps(cpvec *c, cpvec *tmp)
{
    tmp->n = 0;
    for (size_t i = 0; i < c->n; i++) {
        uint32_t d[ZT_UNICODE_MAX_EXPANSION];
        int k = zt_unicode_lower(c->v[i], d);
        for (int j = 0; j < k; j++)
            if (cp_push(tmp, d[j]) != 0)
                return ZT_ENOMEM;
    }
    cpvec t = *c;
    *c = *tmp;
    *tmp = t;
    return 0;
}

/* Drops the nonspacing marks (Mn: BertNormalizer's strip_accents), or every mark (Mn, Mc, Me: the
 * StripAccents normalizer, which uses is_combining_mark). */
static void drop_marks(cpvec *c, bool all_marks)
{
    size_t m = 0;
    for (size_t i = 0; i < c->n; i++) {
        int k = zt_unicode_category(c->v[i]);
        if (!(k == ZT_UCAT_MN || (all_marks && (k == ZT_UCAT_MC || k == ZT_UCAT_ME))))
            c->v[m++] = c->v[i];
    }
    c->n = m;
}

/* ---- the precompiled charsmap (normalizers/precompiled.rs and the spm_precompiled crate) ------------ */

/* The first (shortest) key of the charsmap's double-array trie (darts-clone's layout) that is a prefix of
 * key[0..len), as common_prefix_search(...)[0]; the search stops at a NUL byte. Returns the offset of its
 * normalized string, or -1 when no key is a prefix. */
static int64_t charsmap_first(const zt__norm *nm, const unsigned char *key, size_t len)
{
    const uint32_t *a = nm->trie;
#define UNIT_OFFSET(u) (((uint64_t)(u) >> 10) << (((u) & (1u << 9)) >> 6))
    uint64_t pos = UNIT_OFFSET(a[0]);
    for (size_t i = 0; i < len && key[i] != 0; i++) {
        pos ^= key[i];
        if (pos >= nm->ntrie)
            return -1;
        uint32_t unit = a[pos];
        if ((unit & ((1u << 31) | 0xFFu)) != key[i])
            return -1;
        pos ^= UNIT_OFFSET(unit);
        if ((unit >> 8) & 1)
            return pos < nm->ntrie ? (int64_t)(a[pos] & 0x7FFFFFFFu) : -1;
    }
#undef UNIT_OFFSET
    return -1;
}

/* Appends the normalized string at offset v (up to its NUL) of the charsmap; false when v is past the end. */
static bool charsmap_put(const zt__norm *nm, int64_t v, buf *out, int *rc)
{
    if ((size_t)v > nm->a.len || ((size_t)v < nm->a.len && ((unsigned char)nm->a.p[v] & 0xC0) == 0x80))
        return false; /* not the start of a string: the library panics on such a charsmap */
    const char *p = nm->a.p + v;
    const char *nul = memchr(p, 0, nm->a.len - (size_t)v);
    size_t n = nul ? (size_t)(nul - p) : nm->a.len - (size_t)v;
    *rc = buf_add(out, p, n);
    return true;
}

/* Precompiled over in[0..len): grapheme cluster by grapheme cluster, a cluster shorter than 6 bytes that
 * begins with a key of the charsmap is replaced as a whole by that (shortest) key's string, whatever follows
 * the key in the cluster; any other cluster character by character, each one that is a key replaced. This
 * is what the library does (not SentencePiece's longest match over the text). */
static int precompiled(const zt__norm *nm, const char *in, size_t len, buf *out)
{
    const unsigned char *u = (const unsigned char *)in;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t end = zt_unicode_grapheme_end(u, len, i);
        if (end - i < 6) {
            int64_t v = charsmap_first(nm, u + i, end - i);
            if (v >= 0 && charsmap_put(nm, v, out, &rc)) {
                i = end;
                continue;
            }
        }
        for (size_t j = i; j < end && rc == 0;) {
            int n;
            next_cp(u, j, &n);
            int64_t v = charsmap_first(nm, u + j, (size_t)n);
            if (!(v >= 0 && charsmap_put(nm, v, out, &rc)))
                rc = buf_add(out, in + j, (size_t)n);
            j += (size_t)n;
        }
        i = end;
    }
    return rc != 0 ? rc : buf_reserve(out, 1);
}

/* One normalizer step: in (len bytes) -> out. */
static int norm_step(const zt__norm *nm, const char *in, size_t len, buf *out, cpvec *c1, cpvec *c2)
{
    out->len = 0;
    switch (nm->type) {
    case ZT__NORM_PREPEND:
        if (len > 0 && (buf_add(out, nm->a.p, nm->a.len) != 0 || buf_add(out, in, len) != 0))
            return ZT_ENOMEM;
        return 0;
    case ZT__NORM_REPLACE: {
        size_t i = 0;
        while (i < len) {
            const char *hit = memmem(in + i, len - i, nm->a.p, nm->a.len);
            if (!hit)
                break;
            size_t at = (size_t)(hit - in);
            if (buf_add(out, in + i, at - i) != 0 || buf_add(out, nm->b.p, nm->b.len) != 0)
                return ZT_ENOMEM;
            i = at + nm->a.len;
        }
        return buf_add(out, in + i, len - i);
    }
    case ZT__NORM_REPLACE_SPACES:
        for (size_t i = 0; i < len;) {
            size_t j = i;
            while (j < len && in[j] == ' ')
                j++;
            if (j - i >= 2) {
                if (buf_add(out, nm->b.p, nm->b.len) != 0)
                    return ZT_ENOMEM;
                i = j;
                continue;
            }
            if (j == i)
                j++;
            if (buf_add(out, in + i, j - i) != 0)
                return ZT_ENOMEM;
            i = j;
        }
        return buf_reserve(out, 1);
    case ZT__NORM_PRECOMPILED:
        return precompiled(nm, in, len, out);
    case ZT__NORM_STRIP: {
        size_t start = 0, end = len;
        const unsigned char *u = (const unsigned char *)in;
        if (nm->strip_left)
            while (start < end) {
                int n;
                if (!zt_unicode_is_white_space(next_cp(u, start, &n)))
                    break;
                start += (size_t)n;
            }
        if (nm->strip_right)
            while (end > start) {
                size_t j = end - 1;
                while (j > start && (u[j] & 0xC0) == 0x80)
                    j--;
                int n;
                if (!zt_unicode_is_white_space(next_cp(u, j, &n)))
                    break;
                end = j;
            }
        return buf_add(out, in + start, end - start);
    }
    case ZT__NORM_LOWERCASE: {
        bool ascii = true;
        for (size_t i = 0; i < len && ascii; i++)
            ascii = (unsigned char)in[i] < 0x80;
        if (ascii) {
            if (buf_reserve(out, len + 1) != 0)
                return ZT_ENOMEM;
            for (size_t i = 0; i < len; i++)
                out->p[i] = (in[i] >= 'A' && in[i] <= 'Z') ? (char)(in[i] + 32) : in[i];
            out->len = len;
            return 0;
        }
        if (to_cps(in, len, c1) != 0 || lower_cps(c1, c2) != 0)
            return ZT_ENOMEM;
        return from_cps(c1, out);
    }
    case ZT__NORM_NFKD:
    case ZT__NORM_NFC:
    case ZT__NORM_NFKC: {
        if (to_cps(in, len, c1) != 0)
            return ZT_ENOMEM;
        if ((nm->type == ZT__NORM_NFC ? decompose(c1, c2) : decompose_compat(c1, c2)) != 0)
            return ZT_ENOMEM;
        if (nm->type != ZT__NORM_NFKD)
            compose(c2);
        return from_cps(c2, out);
    }
    case ZT__NORM_NFD:
    case ZT__NORM_STRIP_ACCENTS:
        if (to_cps(in, len, c1) != 0)
            return ZT_ENOMEM;
        if (nm->type == ZT__NORM_NFD) {
            if (decompose(c1, c2) != 0)
                return ZT_ENOMEM;
            return from_cps(c2, out);
        }
        drop_marks(c1, true);
        return from_cps(c1, out);
    case ZT__NORM_BERT: {
        c1->n = 0;
        for (size_t i = 0; i < len;) {
            int n;
            uint32_t cp = next_cp((const unsigned char *)in, i, &n);
            i += (size_t)n;
            if (nm->clean_text) {
                if (cp == 0 || cp == 0xFFFD || is_bert_control(cp))
                    continue;
                if (cp == '\t' || cp == '\n' || cp == '\r' || zt_unicode_is_white_space(cp))
                    cp = ' ';
            }
            if (nm->handle_chinese_chars && zt_unicode_is_cjk(cp)) {
                if (cp_push(c1, ' ') != 0 || cp_push(c1, cp) != 0 || cp_push(c1, ' ') != 0)
                    return ZT_ENOMEM;
                continue;
            }
            if (cp_push(c1, cp) != 0)
                return ZT_ENOMEM;
        }
        if (nm->strip_accents) {
            if (decompose(c1, c2) != 0)
                return ZT_ENOMEM;
            cpvec t = *c1;
            *c1 = *c2;
            *c2 = t;
            drop_marks(c1, false);
        }
        if (nm->lowercase && lower_cps(c1, c2) != 0)
            return ZT_ENOMEM;
        return from_cps(c1, out);
    }
    }
    return 0;
}

/* Runs every normalizer step; the result is in *res (one of the two buffers, or in itself when there are no
 * steps: then res->p == in). */
static int normalize_into(const zt__hf *hf, const char *in, size_t len, buf *b1, buf *b2, zt__bytes *res)
{
    cpvec c1 = {0}, c2 = {0};
    const char *cur = in;
    size_t cur_len = len;
    int rc = 0;
    for (int i = 0; i < hf->nnorms && rc == 0; i++) {
        buf *out = (cur == b1->p) ? b2 : b1;
        rc = norm_step(&hf->norms[i], cur, cur_len, out, &c1, &c2);
        if (rc == 0 && buf_reserve(out, 1) != 0) /* non-NULL even when empty */
            rc = ZT_ENOMEM;
        cur = out->p;
        cur_len = out->len;
    }
    free(c1.v);
    free(c2.v);
    res->p = (char *)cur;
    res->len = cur_len;
    return rc;
}

int zt__hf_normalize(const zt__hf *hf, const char *text, size_t len, zt__bytes *out, zt_err *err)
{
    buf b1 = {0}, b2 = {0};
    zt__bytes r;
    int rc = normalize_into(hf, text, len, &b1, &b2, &r);
    if (rc == 0) {
        out->p = malloc(r.len + 1);
        if (!out->p)
            rc = ZT_ENOMEM;
        else {
            if (r.len > 0)
                memcpy(out->p, r.p, r.len);
            out->p[r.len] = '\0';
            out->len = r.len;
        }
    }
    free(b1.p);
    free(b2.p);
    return rc == 0 ? 0 : zt_fail(err, rc, "out of memory normalizing %zu bytes of text", len);
}

/* ---- models ---------------------------------------------------------------------------------------- */

static inline bool merge_get(const zt__hf *hf, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t s = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & hf->merges_mask;
    for (;;) {
        const struct zt__merge *m = &hf->merges[s];
        if (m->key == key) {
            *rank = m->rank;
            *id = m->id;
            return true;
        }
        if (m->key == 0)
            return false;
        s = (s + 1) & hf->merges_mask;
    }
}

static int word_push(encoder *e, int32_t id)
{
    if (e->nwids == e->capwids) {
        size_t cap = e->capwids ? e->capwids * 2 : 64;
        int32_t *p = realloc(e->wids, cap * sizeof(int32_t));
        if (!p)
            return ZT_ENOMEM;
        e->wids = p;
        e->capwids = cap;
    }
    e->wids[e->nwids++] = id;
    return 0;
}

static int sym_add(encoder *e, size_t *nsym, int32_t id, uint32_t len)
{
    if (*nsym == e->capsyms) {
        size_t cap = e->capsyms ? e->capsyms * 2 : 64;
        struct sym *p = realloc(e->syms, cap * sizeof(*p));
        if (!p)
            return ZT_ENOMEM;
        e->syms = p;
        e->capsyms = cap;
    }
    size_t i = (*nsym)++;
    e->syms[i] = (struct sym){.id = id, .prev = (int32_t)i - 1, .next = -1, .len = len};
    if (i > 0)
        e->syms[i - 1].next = (int32_t)i;
    return 0;
}

static inline bool heap_less(const struct hitem *a, const struct hitem *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(encoder *e, uint32_t rank, uint32_t pos, int32_t id)
{
    if (e->nheap == e->capheap) {
        size_t cap = e->capheap ? e->capheap * 2 : 64;
        struct hitem *p = realloc(e->heap, cap * sizeof(*p));
        if (!p)
            return ZT_ENOMEM;
        e->heap = p;
        e->capheap = cap;
    }
    size_t i = e->nheap++;
    struct hitem x = {rank, pos, id};
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&x, &e->heap[parent]))
            break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = x;
    return 0;
}

static struct hitem heap_pop(encoder *e)
{
    struct hitem top = e->heap[0];
    struct hitem x = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!heap_less(&e->heap[c], &x))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n > 0)
        e->heap[i] = x;
    return top;
}

/* BPE of one word into e->wids (models/bpe/model.rs merge_word and word.rs merge_all). */
static int bpe_word(encoder *e, const char *w, size_t len)
{
    const zt__hf *hf = e->hf;
    size_t nsym = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    const unsigned char *u = (const unsigned char *)w;
    for (size_t i = 0; i < len;) {
        int n;
        next_cp(u, i, &n);
        bool first = i == 0, last = i + (size_t)n == len;
        const char *key = w + i;
        size_t klen = (size_t)n;
        if ((!first && hf->subword_prefix.len) || (last && hf->word_suffix.len)) {
            e->word.len = 0;
            if ((!first && buf_add(&e->word, hf->subword_prefix.p, hf->subword_prefix.len) != 0) ||
                buf_add(&e->word, w + i, (size_t)n) != 0 ||
                (last && buf_add(&e->word, hf->word_suffix.p, hf->word_suffix.len) != 0))
                return ZT_ENOMEM;
            key = e->word.p;
            klen = e->word.len;
        }
        int32_t id = zt__strmap_get(&hf->vocab, key, klen);
        if (id >= 0) {
            if (unk >= 0) {
                if (sym_add(e, &nsym, unk, unk_len) != 0)
                    return ZT_ENOMEM;
                unk = -1;
            }
            if (sym_add(e, &nsym, id, (uint32_t)n) != 0)
                return ZT_ENOMEM;
            i += (size_t)n;
            continue;
        }
        if (hf->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < klen && all; j++)
                all = hf->byte_ids[(unsigned char)key[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < klen; j++)
                    if (sym_add(e, &nsym, hf->byte_ids[(unsigned char)key[j]], 1) != 0)
                        return ZT_ENOMEM;
                i += (size_t)n;
                continue; /* a pending unknown token stays pending, as in the library */
            }
        }
        if (hf->unk_id >= 0) {
            if (unk >= 0 && hf->fuse_unk) {
                unk_len += (uint32_t)n;
            } else {
                if (unk >= 0 && sym_add(e, &nsym, unk, unk_len) != 0)
                    return ZT_ENOMEM;
                unk = hf->unk_id;
                unk_len = (uint32_t)n;
            }
        }
        i += (size_t)n;
    }
    if (unk >= 0 && sym_add(e, &nsym, unk, unk_len) != 0)
        return ZT_ENOMEM;

    struct sym *s = e->syms;
    e->nheap = 0;
    for (size_t i = 0; i + 1 < nsym; i++) {
        uint32_t rank;
        int32_t id;
        if (merge_get(hf, s[i].id, s[i + 1].id, &rank, &id) && heap_push(e, rank, (uint32_t)i, id) != 0)
            return ZT_ENOMEM;
    }
    while (e->nheap > 0) {
        struct hitem top = heap_pop(e);
        struct sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        struct sym right = s[cur->next];
        uint32_t rank;
        int32_t id;
        if (!merge_get(hf, cur->id, right.id, &rank, &id) || id != top.id)
            continue; /* stale */
        int32_t next_pos = cur->next;
        cur->id = top.id;
        cur->len += right.len;
        cur->next = right.next;
        s[next_pos].len = 0;
        if (right.next >= 0 && (size_t)right.next < nsym)
            s[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && merge_get(hf, s[cur->prev].id, cur->id, &rank, &id) &&
            heap_push(e, rank, (uint32_t)cur->prev, id) != 0)
            return ZT_ENOMEM;
        cur = &s[top.pos]; /* heap_push does not move syms, but keep it obvious */
        if (cur->next >= 0 && merge_get(hf, cur->id, s[cur->next].id, &rank, &id) &&
            heap_push(e, rank, top.pos, id) != 0)
            return ZT_ENOMEM;
    }
    for (size_t i = 0; i < nsym; i++)
        if (s[i].len != 0 && word_push(e, s[i].id) != 0)
            return ZT_ENOMEM;
    return 0;
}

/* WordPiece of one word into e->wids (models/wordpiece/mod.rs tokenize). */
static int wordpiece_word(encoder *e, const char *w, size_t len)
{
    const zt__hf *hf = e->hf;
    size_t nchars = 0;
    for (size_t i = 0; i < len; i++)
        nchars += ((unsigned char)w[i] & 0xC0) != 0x80;
    if (nchars > (size_t)hf->max_input_chars_per_word)
        return word_push(e, hf->unk_id);
    size_t first = e->nwids;
    size_t plen = hf->subword_prefix.len;
    for (size_t start = 0; start < len;) {
        size_t room = hf->max_token_len >= (start > 0 ? plen : 0) ? hf->max_token_len - (start > 0 ? plen : 0) : 0;
        size_t end = len - start > room ? start + room : len;
        while (end > start && end < len && ((unsigned char)w[end] & 0xC0) == 0x80)
            end--;
        int32_t found = -1;
        while (end > start) {
            const char *key = w + start;
            size_t klen = end - start;
            if (start > 0) {
                e->word.len = 0;
                if (buf_add(&e->word, hf->subword_prefix.p, plen) != 0 || buf_add(&e->word, w + start, klen) != 0)
                    return ZT_ENOMEM;
                key = e->word.p;
                klen = e->word.len;
            }
            found = zt__strmap_get(&hf->vocab, key, klen);
            if (found >= 0)
                break;
            end--;
            while (end > start && ((unsigned char)w[end] & 0xC0) == 0x80)
                end--;
        }
        if (found < 0) {
            e->nwids = first;
            return word_push(e, hf->unk_id);
        }
        if (word_push(e, found) != 0)
            return ZT_ENOMEM;
        start = end;
    }
    return 0;
}

/* The id of the piece s[0..len) in a Unigram vocabulary, byte fallback (the piece's bytes as <0xXX> tokens,
 * when it has no id and every byte has one) or the unknown token, into e->wids (models/unigram/model.rs
 * tokenize). */
static int unigram_piece(encoder *e, const char *s, size_t len)
{
    const zt__hf *hf = e->hf;
    int32_t id = zt__strmap_get(&hf->vocab, s, len);
    if (id >= 0)
        return word_push(e, id);
    if (hf->byte_fallback) {
        bool all = true;
        for (size_t j = 0; j < len && all; j++)
            all = hf->byte_ids[(unsigned char)s[j]] >= 0;
        if (all) {
            for (size_t j = 0; j < len; j++)
                if (word_push(e, hf->byte_ids[(unsigned char)s[j]]) != 0)
                    return ZT_ENOMEM;
            return 0;
        }
    }
    return word_push(e, hf->unk_id); /* unigram_word saw that the model has one */
}

/* Fails the encoding of a text in which the character at w has no piece and the model no unk_id, as the
 * library does ("Encountered an unknown token but `unk_id` is missing"). */
static int unigram_no_unk(encoder *e, const char *w)
{
    int n;
    uint32_t cp = next_cp((const unsigned char *)w, 0, &n);
    snprintf(e->problem, sizeof(e->problem), "the text has the character U+%04X, which the Unigram vocabulary has no "
             "piece for, and the tokenizer has no unk_id to stand for it (the tokenizers library refuses the text "
             "too): remove the character, or use a tokenizer.json with an unk_id", (unsigned)cp);
    return ZT_EINVAL_CONFIG;
}

/* Unigram of one word into e->wids: the segmentation of highest total score, found left to right as the
 * library's encode_optimized does (which is SentencePiece's), with the same ties (a path replaces the best
 * one ending at a position only with a strictly higher score: earlier starts and, from one start, shorter
 * pieces win), a character without a piece of its own as the unknown token (score: the lowest piece score
 * minus 10), and runs of unknown tokens fused into one, which then goes through byte fallback as a whole. */
static int unigram_word(encoder *e, const char *w, size_t len)
{
    const zt__hf *hf = e->hf;
    const unsigned char *u = (const unsigned char *)w;
    if (len + 1 > e->capbest) {
        size_t cap = e->capbest ? e->capbest : 64;
        while (cap < len + 1)
            cap *= 2;
        struct best *p = realloc(e->best, cap * sizeof(*p));
        if (!p)
            return ZT_ENOMEM;
        e->best = p;
        e->capbest = cap;
    }
    struct best *b = e->best;
    for (size_t i = 0; i <= len; i++)
        b[i] = (struct best){0.0, -1, 0};
    const double unk_score = hf->uni_min_score - 10.0;
    for (size_t start = 0; start < len;) {
        const double here = b[start].score;
        int mblen;
        next_cp(u, start, &mblen);
        bool single = false;
        for (size_t end = start; end < len && end - start < hf->max_token_len;) {
            int n;
            next_cp(u, end, &n);
            end += (size_t)n;
            int32_t id = zt__strmap_get(&hf->vocab, w + start, end - start);
            if (id >= 0) {
                double cand = hf->uni_scores[id] + here;
                if (b[end].start < 0 || cand > b[end].score)
                    b[end] = (struct best){cand, (int64_t)start, id};
                single = single || end - start == (size_t)mblen;
            }
            if (zt__strmap_get(&hf->uni_prefixes, w + start, end - start) < 0)
                break; /* no longer piece begins with these characters */
        }
        size_t next = start + (size_t)mblen;
        if (!single) {
            double cand = unk_score + here;
            if (b[next].start < 0 || cand > b[next].score) {
                if (hf->unk_id < 0)
                    return unigram_no_unk(e, w + start);
                b[next] = (struct best){cand, (int64_t)start, hf->unk_id};
            }
        }
        start = next;
    }
    /* Back from the end: the path's cuts, last first; a run of unknown tokens (pieces with the unk id, as
     * in the library) is one cut. */
    e->ncuts = 0;
    bool fusing = false;
    for (size_t end = len; end > 0;) {
        const struct best *node = &b[end];
        size_t start = (size_t)node->start;
        bool unk = hf->unk_id >= 0 && node->id == hf->unk_id;
        if (unk && fusing) {
            e->cuts[e->ncuts - 1].start = start;
        } else {
            if (e->ncuts == e->capcuts) {
                size_t cap = e->capcuts ? e->capcuts * 2 : 64;
                struct cut *p = realloc(e->cuts, cap * sizeof(*p));
                if (!p)
                    return ZT_ENOMEM;
                e->cuts = p;
                e->capcuts = cap;
            }
            e->cuts[e->ncuts++] = (struct cut){start, end};
        }
        fusing = unk;
        end = start;
    }
    for (size_t k = e->ncuts; k-- > 0;) {
        int rc = unigram_piece(e, w + e->cuts[k].start, e->cuts[k].end - e->cuts[k].start);
        if (rc != 0)
            return rc;
    }
    return 0;
}

#define CACHE_MAX_WORD 256       /* longer words are not cached (the library's MAX_LENGTH) */
#define CACHE_MAX_ENTRIES 200000 /* then the cache starts again */

/* The ids of one word: from the cache, or from the model (and then cached). */
static int model_word(encoder *e, const char *w, size_t len)
{
    const zt__hf *hf = e->hf;
    if (hf->model == ZT__MODEL_BPE && hf->ignore_merges) {
        int32_t id = zt__strmap_get(&hf->vocab, w, len);
        if (id >= 0)
            return push_id(e, id);
    }
    bool cacheable = len < CACHE_MAX_WORD;
    if (cacheable) {
        int32_t at = zt__strmap_get(&e->cache, w, len);
        if (at >= 0) {
            int32_t count = e->pool[at];
            for (int32_t i = 0; i < count; i++)
                if (push_id(e, e->pool[at + 1 + i]) != 0)
                    return ZT_ENOMEM;
            return 0;
        }
    }
    e->nwids = 0;
    int rc = hf->model == ZT__MODEL_BPE         ? bpe_word(e, w, len)
             : hf->model == ZT__MODEL_UNIGRAM ? unigram_word(e, w, len)
                                              : wordpiece_word(e, w, len);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < e->nwids; i++)
        if (push_id(e, e->wids[i]) != 0)
            return ZT_ENOMEM;
    if (!cacheable)
        return 0;
    if (e->cache.n >= CACHE_MAX_ENTRIES) {
        zt__strmap_free(&e->cache);
        e->npool = 0;
    }
    if (e->npool + e->nwids + 1 > e->cappool) {
        size_t cap = e->cappool ? e->cappool * 2 : 4096;
        while (cap < e->npool + e->nwids + 1)
            cap *= 2;
        int32_t *p = realloc(e->pool, cap * sizeof(int32_t));
        if (!p)
            return ZT_ENOMEM;
        e->pool = p;
        e->cappool = cap;
    }
    if (e->npool > INT32_MAX / 2)
        return 0;
    if (zt__strmap_put(&e->cache, w, len, (int32_t)e->npool) != 0)
        return ZT_ENOMEM;
    e->pool[e->npool++] = (int32_t)e->nwids;
    if (e->nwids > 0)
        memcpy(e->pool + e->npool, e->wids, e->nwids * sizeof(int32_t));
    e->npool += e->nwids;
    return 0;
}

/* ---- the pipeline ---------------------------------------------------------------------------------- */

/* Runs the model on one word, cut before each "▁" that follows another character when no merge can cross
 * such a cut (hf->split_at_meta). */
static int cut_word(encoder *e, const char *s, size_t len)
{
    if (!e->hf->split_at_meta)
        return model_word(e, s, len);
    static const char meta[] = "\xe2\x96\x81";
    size_t start = 0, from = 1;
    for (;;) {
        const char *next = NULL;
        while (from < len && (next = memmem(s + from, len - from, meta, 3)) != NULL) {
            size_t at = (size_t)(next - s);
            if (at >= 3 && memcmp(s + at - 3, meta, 3) == 0) { /* inside a run of ▁: no cut */
                from = at + 3;
                next = NULL;
                continue;
            }
            break;
        }
        size_t end = next ? (size_t)(next - s) : len;
        int rc = model_word(e, s + start, end - start);
        if (rc != 0 || !next)
            return rc;
        start = end;
        from = end + 3;
    }
}

/* Pre-tokenizes one normalized piece and runs the model on each word; at_start: the piece begins the text. */
static int encode_words(encoder *e, const char *s, size_t len, bool at_start)
{
    const zt__hf *hf = e->hf;
    if (len == 0)
        return 0;
    if (hf->npretoks == 0)
        return cut_word(e, s, len);
    splits *in = &e->a, *out = &e->b;
    in->n = 0;
    in->text.len = 0;
    if (splits_push(in, s, len) != 0)
        return ZT_ENOMEM;
    for (int i = 0; i < hf->npretoks; i++) {
        out->n = 0;
        out->text.len = 0;
        if (pretok_step(e, &hf->pretoks[i], in, out, at_start && i == 0) != 0)
            return ZT_ENOMEM;
        splits *t = in;
        in = out;
        out = t;
    }
    for (size_t k = 0; k < in->n; k++) {
        int rc = cut_word(e, in->text.p + in->v[k].off, in->v[k].len);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Finds the leftmost-longest added token of set in s[from..len); returns false when there is none. */
static bool added_find(const zt__hf *hf, const zt__added_set *set, const char *s, size_t len, size_t from,
                       size_t *at, int *which)
{
    if (set->count == 0)
        return false;
    for (size_t i = from; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        for (int j = set->start[b]; j < set->start[b + 1]; j++) {
            const zt__added *a = &hf->added[set->order[j]];
            if (a->pattern.len <= len - i && memcmp(s + i, a->pattern.p, a->pattern.len) == 0) {
                *at = i;
                *which = set->order[j];
                return true;
            }
        }
    }
    return false;
}

/* The start of the run of White_Space characters that ends at s[end] (regex \s*$ on s[0..end)). */
static size_t space_before(const char *s, size_t end)
{
    const unsigned char *u = (const unsigned char *)s;
    while (end > 0) {
        size_t j = end - 1;
        while (j > 0 && (u[j] & 0xC0) == 0x80)
            j--;
        int n;
        if (!zt_unicode_is_white_space(next_cp(u, j, &n)))
            break;
        end = j;
    }
    return end;
}

static size_t space_after(const char *s, size_t len, size_t i)
{
    while (i < len) {
        int n;
        if (!zt_unicode_is_white_space(next_cp((const unsigned char *)s, i, &n)))
            break;
        i += (size_t)n;
    }
    return i;
}

/* Cuts s at the added tokens of set: the tokens' ids go out, the text between them to fn (with whether it
 * begins the text: s does, at_start, and the piece starts at its beginning). */
static int split_added(encoder *e, const zt__added_set *set, const char *s, size_t len, bool at_start,
                       int (*fn)(encoder *, const char *, size_t, bool))
{
    const zt__hf *hf = e->hf;
    size_t done = 0, from = 0, at;
    int which;
    while (added_find(hf, set, s, len, from, &at, &which)) {
        const zt__added *a = &hf->added[which];
        size_t start = at, stop = at + a->pattern.len;
        if (a->lstrip) {
            size_t ns = space_before(s, start);
            start = ns > done ? ns : done;
        }
        if (a->rstrip)
            stop = space_after(s, len, stop);
        if (start > done) {
            int rc = fn(e, s + done, start - done, at_start && done == 0);
            if (rc != 0)
                return rc;
        }
        if (push_id(e, a->id) != 0)
            return ZT_ENOMEM;
        done = from = stop;
    }
    if (done < len)
        return fn(e, s + done, len - done, at_start && done == 0);
    return 0;
}

static int normalized_piece(encoder *e, const char *s, size_t len, bool at_start)
{
    return split_added(e, &e->hf->norm_set, s, len, at_start, encode_words);
}

static int raw_piece(encoder *e, const char *s, size_t len, bool at_start)
{
    const zt__hf *hf = e->hf;
    if (hf->nnorms == 0)
        return normalized_piece(e, s, len, at_start);
    zt__bytes r;
    if (normalize_into(hf, s, len, &e->norm, &e->norm2, &r) != 0)
        return ZT_ENOMEM;
    /* encode_words does not touch e->norm / e->norm2, and one piece is normalized at a time */
    return normalized_piece(e, r.p, r.len, at_start);
}

static void encoder_free(encoder *e)
{
    free(e->a.text.p);
    free(e->a.v);
    free(e->b.text.p);
    free(e->b.v);
    free(e->segs);
    free(e->norm.p);
    free(e->norm2.p);
    free(e->word.p);
    free(e->tmp.p);
    zt__strmap_free(&e->cache);
    free(e->pool);
    free(e->syms);
    free(e->heap);
    free(e->wids);
    free(e->best);
    free(e->cuts);
}

int zt__hf_encode(const zt__hf *hf, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                  zt_err *err)
{
    ensure_tables();
    encoder e = {.hf = hf};
    int rc = 0;
    if (add_special)
        for (int i = 0; i < hf->nprefix && rc == 0; i++)
            rc = push_id(&e, hf->prefix_ids[i]);
    if (rc == 0)
        rc = split_added(&e, &hf->raw_set, text, len, true, raw_piece);
    if (add_special)
        for (int i = 0; i < hf->nsuffix && rc == 0; i++)
            rc = push_id(&e, hf->suffix_ids[i]);
    encoder_free(&e);
    if (rc != 0) {
        free(e.ids);
        if (rc != ZT_ENOMEM && e.problem[0])
            return zt_fail(err, rc, "%s", e.problem);
        return zt_fail(err, rc, "out of memory encoding %zu bytes of text", len);
    }
    if (e.n == 0) {
        free(e.ids);
        e.ids = NULL;
    }
    *ids = e.ids;
    *n = e.n;
    return 0;
}

/* ---- decoding -------------------------------------------------------------------------------------- */

typedef struct strlist {
    zt__bytes *v;
    size_t n, cap;
} strlist;

static int list_push(strlist *l, const char *p, size_t len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        zt__bytes *v = realloc(l->v, cap * sizeof(zt__bytes));
        if (!v)
            return ZT_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s)
        return ZT_ENOMEM;
    if (len > 0)
        memcpy(s, p, len);
    s[len] = '\0';
    l->v[l->n++] = (zt__bytes){s, len};
    return 0;
}

static void list_free(strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].p);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* Replaces every occurrence of pat in s with rep, into out. */
static int replace_all(const char *s, size_t len, const char *pat, size_t plen, const char *rep, size_t rlen, buf *out)
{
    out->len = 0;
    size_t i = 0;
    while (plen > 0 && i < len) {
        const char *hit = memmem(s + i, len - i, pat, plen);
        if (!hit)
            break;
        size_t at = (size_t)(hit - s);
        if (buf_add(out, s + i, at - i) != 0 || buf_add(out, rep, rlen) != 0)
            return ZT_ENOMEM;
        i = at + plen;
    }
    return buf_add(out, s + i, len - i);
}

/* Bytes -> valid UTF-8, each maximal ill-formed part replaced by U+FFFD (String::from_utf8_lossy). */
static int lossy_utf8(const char *s, size_t len, buf *out)
{
    out->len = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t ok = zt_utf8_valid_prefix(u + i, len - i);
        if (buf_add(out, s + i, ok) != 0)
            return ZT_ENOMEM;
        i += ok;
        if (i < len) {
            if (buf_add(out, "\xEF\xBF\xBD", 3) != 0)
                return ZT_ENOMEM;
            i += (size_t)zt_utf8_invalid_length(u + i, len - i);
        }
    }
    return buf_reserve(out, 1);
}

/* The raw bytes of a byte-level token: each character mapped back to its byte, or the token's own bytes when
 * one of its characters is not in the byte-level alphabet (as the library's ByteLevel decoder does). */
static int byte_level_bytes(const zt__bytes *t, buf *out)
{
    size_t start = out->len;
    const unsigned char *u = (const unsigned char *)t->p;
    for (size_t i = 0; i < t->len;) {
        int n;
        uint32_t cp = next_cp(u, i, &n);
        if (cp >= 512 || !char_bytes_ok[cp]) {
            out->len = start;
            return buf_add(out, t->p, t->len);
        }
        unsigned char b = char_bytes_lo[cp];
        if (buf_add(out, &b, 1) != 0)
            return ZT_ENOMEM;
        i += (size_t)n;
    }
    return 0;
}

/* <0xXX> -> the byte (u8::from_str_radix of the two characters, which accepts a leading '+'). */
static bool byte_token(const zt__bytes *t, unsigned char *b)
{
    if (t->len != 6 || memcmp(t->p, "<0x", 3) != 0 || t->p[5] != '>')
        return false;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = t->p[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+')
                continue;
            return false;
        }
        v = v * 16 + d;
        digits++;
    }
    if (digits == 0)
        return false;
    *b = (unsigned char)v;
    return true;
}

static const char *const wp_cleanup[][2] = {
    {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
    {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
};

/* One decoder step over the list of token strings (in place; may join them into one). */
static int decoder_step(const zt__decoder *d, strlist *l, buf *t1, buf *t2)
{
    switch (d->type) {
    case ZT__DEC_BYTE_LEVEL:
    case ZT__DEC_FUSE: {
        t1->len = 0;
        for (size_t i = 0; i < l->n; i++)
            if ((d->type == ZT__DEC_BYTE_LEVEL ? byte_level_bytes(&l->v[i], t1) : buf_add(t1, l->v[i].p, l->v[i].len)) != 0)
                return ZT_ENOMEM;
        if (d->type == ZT__DEC_BYTE_LEVEL) {
            if (lossy_utf8(t1->p, t1->len, t2) != 0)
                return ZT_ENOMEM;
            buf t = *t1;
            *t1 = *t2;
            *t2 = t;
        }
        list_free(l);
        return list_push(l, t1->p ? t1->p : "", t1->len);
    }
    case ZT__DEC_BYTE_FALLBACK: {
        strlist out = {0};
        t1->len = 0; /* pending bytes */
        size_t npending = 0;
        for (size_t i = 0; i <= l->n; i++) {
            unsigned char b;
            if (i < l->n && byte_token(&l->v[i], &b)) {
                if (buf_add(t1, &b, 1) != 0)
                    goto oom;
                npending++;
                continue;
            }
            if (npending > 0) {
                if (zt_utf8_valid_prefix(t1->p, t1->len) == t1->len) {
                    if (list_push(&out, t1->p, t1->len) != 0)
                        goto oom;
                } else {
                    for (size_t k = 0; k < npending; k++)
                        if (list_push(&out, "\xEF\xBF\xBD", 3) != 0)
                            goto oom;
                }
                t1->len = 0;
                npending = 0;
            }
            if (i < l->n && list_push(&out, l->v[i].p, l->v[i].len) != 0)
                goto oom;
        }
        list_free(l);
        *l = out;
        return 0;
    oom:
        list_free(&out);
        return ZT_ENOMEM;
    }
    case ZT__DEC_STRIP:
        for (size_t i = 0; i < l->n; i++) {
            zt__bytes *t = &l->v[i];
            size_t start = 0, stop = t->len;
            for (int k = 0; k < d->start && start + d->a.len <= t->len; k++) {
                if (memcmp(t->p + start, d->a.p, d->a.len) != 0)
                    break;
                start += d->a.len;
            }
            for (int k = 0; k < d->stop && stop >= start + d->a.len; k++) {
                if (memcmp(t->p + stop - d->a.len, d->a.p, d->a.len) != 0)
                    break;
                stop -= d->a.len;
            }
            if (stop > start)
                memmove(t->p, t->p + start, stop - start);
            t->len = stop - start;
            t->p[t->len] = '\0';
        }
        return 0;
    case ZT__DEC_REPLACE:
    case ZT__DEC_WORDPIECE:
    case ZT__DEC_BPE:
    case ZT__DEC_METASPACE:
        for (size_t i = 0; i < l->n; i++) {
            zt__bytes *t = &l->v[i];
            t1->len = 0;
            if (d->type == ZT__DEC_METASPACE) {
                /* the replacement is a space, and is dropped in the first token unless prepend is never */
                bool drop = i == 0 && d->prepend != ZT__PREPEND_NEVER;
                if (replace_all(t->p, t->len, d->a.p, d->a.len, " ", drop ? 0 : 1, t1) != 0)
                    return ZT_ENOMEM;
            } else if (d->type == ZT__DEC_REPLACE) {
                if (replace_all(t->p, t->len, d->a.p, d->a.len, d->b.p, d->b.len, t1) != 0)
                    return ZT_ENOMEM;
            } else if (d->type == ZT__DEC_BPE) {
                bool last = i + 1 == l->n;
                if (replace_all(t->p, t->len, d->a.p, d->a.len, " ", last ? 0 : 1, t1) != 0)
                    return ZT_ENOMEM;
            } else {
                if (i == 0) {
                    if (buf_add(t1, t->p, t->len) != 0)
                        return ZT_ENOMEM;
                } else if (t->len >= d->a.len && memcmp(t->p, d->a.p, d->a.len) == 0) {
                    if (buf_add(t1, t->p + d->a.len, t->len - d->a.len) != 0)
                        return ZT_ENOMEM;
                } else if (buf_add(t1, " ", 1) != 0 || buf_add(t1, t->p, t->len) != 0) {
                    return ZT_ENOMEM;
                }
                if (d->cleanup)
                    for (size_t k = 0; k < sizeof(wp_cleanup) / sizeof(wp_cleanup[0]); k++) {
                        if (replace_all(t1->p, t1->len, wp_cleanup[k][0], strlen(wp_cleanup[k][0]), wp_cleanup[k][1],
                                        strlen(wp_cleanup[k][1]), t2) != 0)
                            return ZT_ENOMEM;
                        buf t = *t1;
                        *t1 = *t2;
                        *t2 = t;
                    }
            }
            char *p = malloc(t1->len + 1);
            if (!p)
                return ZT_ENOMEM;
            if (t1->len > 0)
                memcpy(p, t1->p, t1->len);
            p[t1->len] = '\0';
            free(t->p);
            *t = (zt__bytes){p, t1->len};
        }
        return 0;
    }
    return 0;
}

/* Runs the decoders over tokens (a list of strings) and joins the result into out. */
static int decode_list(const zt__hf *hf, strlist *l, zt__bytes *out)
{
    buf t1 = {0}, t2 = {0}, res = {0};
    int rc = 0;
    if (!hf->has_decoder) { /* the library joins the tokens with spaces */
        for (size_t i = 0; i < l->n && rc == 0; i++)
            rc = (i > 0 && buf_add(&res, " ", 1) != 0) ? ZT_ENOMEM : buf_add(&res, l->v[i].p, l->v[i].len);
    } else {
        for (int i = 0; i < hf->ndecoders && rc == 0; i++)
            rc = decoder_step(&hf->decoders[i], l, &t1, &t2);
        for (size_t i = 0; i < l->n && rc == 0; i++)
            rc = buf_add(&res, l->v[i].p, l->v[i].len);
    }
    if (rc == 0)
        rc = buf_reserve(&res, 1);
    free(t1.p);
    free(t2.p);
    if (rc != 0) {
        free(res.p);
        return ZT_ENOMEM;
    }
    res.p[res.len] = '\0';
    out->p = res.p;
    out->len = res.len;
    return 0;
}

int zt__hf_decode(const zt__hf *hf, const int32_t *ids, size_t n, zt__bytes *out, zt_err *err)
{
    ensure_tables();
    strlist l = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = list_push(&l, hf->tokens[ids[i]].p, hf->tokens[ids[i]].len);
    if (rc == 0)
        rc = decode_list(hf, &l, out);
    list_free(&l);
    return rc == 0 ? 0 : zt_fail(err, rc, "out of memory decoding %zu tokens", n);
}

int zt__hf_token_piece(const zt__hf *hf, int32_t id, zt__bytes *out, zt_err *err)
{
    ensure_tables();
    const zt__bytes *tok = &hf->tokens[id];
    buf t1 = {0}, t2 = {0};
    strlist l = {0};
    int rc = 0;
    if (!hf->has_decoder) {
        rc = buf_add(&t1, " ", 1) != 0 || buf_add(&t1, tok->p, tok->len) != 0 ? ZT_ENOMEM : 0;
        if (rc == 0) {
            out->p = t1.p;
            out->len = t1.len;
            return 0;
        }
        free(t1.p);
        return zt_fail(err, rc, "out of memory preparing the tokenizer's token strings");
    }
    /* The token between two empty ones, so that decoders which treat the first (WordPiece) or the last
     * (BPEDecoder) token apart decode it as inside a text. The steps run up to the first that joins the
     * tokens; ByteLevel and ByteFallback give the token's raw bytes, without the lossy UTF-8 conversion
     * that needs its neighbours. */
    rc = list_push(&l, "", 0) != 0 || list_push(&l, tok->p, tok->len) != 0 || list_push(&l, "", 0) != 0 ? ZT_ENOMEM : 0;
    for (int i = 0; i < hf->ndecoders && rc == 0; i++) {
        const zt__decoder *d = &hf->decoders[i];
        if (d->type == ZT__DEC_FUSE)
            break;
        if (d->type == ZT__DEC_BYTE_LEVEL || d->type == ZT__DEC_BYTE_FALLBACK) {
            unsigned char b;
            t1.len = 0;
            if (d->type == ZT__DEC_BYTE_LEVEL)
                rc = byte_level_bytes(&l.v[1], &t1);
            else if (byte_token(&l.v[1], &b))
                rc = buf_add(&t1, &b, 1);
            else
                continue;
            if (rc == 0 && buf_reserve(&t1, 1) == 0) {
                free(l.v[1].p);
                l.v[1].p = t1.p;
                l.v[1].len = t1.len;
                t1 = (buf){0};
            }
            if (d->type == ZT__DEC_BYTE_LEVEL)
                break;
            continue;
        }
        rc = decoder_step(d, &l, &t1, &t2);
    }
    if (rc == 0) {
        *out = l.v[1];
        l.v[1].p = NULL;
    }
    free(t1.p);
    free(t2.p);
    list_free(&l);
    return rc == 0 ? 0 : zt_fail(err, rc, "out of memory preparing the tokenizer's token strings");
}

void zt__truncate_longest_first(size_t *na, size_t *nb, size_t budget)
{
    if (*na + *nb <= budget)
        return;
    size_t n1 = *na, n2 = *nb;
    const bool swap = n1 > n2;
    if (swap) {
        n1 = *nb;
        n2 = *na;
    }
    n2 = n1 > budget ? n1 : (n1 > budget - n1 ? n1 : budget - n1);
    if (n1 + n2 > budget) {
        n1 = budget / 2;
        n2 = n1 + budget % 2;
    }
    *na = swap ? n2 : n1;
    *nb = swap ? n1 : n2;
}

int zt__hf_encode_pair(const zt__hf *hf, const char *a, size_t alen, const char *b, size_t blen, size_t max_len,
                       int32_t **ids, int32_t **types, size_t *n, zt_err *err)
{
    *ids = NULL;
    *types = NULL;
    *n = 0;
    if (b && hf->pair_processors > 1)
        return zt_fail(err, ZT_EUNSUPPORTED, "this tokenizer.json has %d post-processors that lay out pairs of texts; "
                       "ztrain encodes pairs with one (give single texts, or a tokenizer with one template)",
                       hf->pair_processors);
    if (b && hf->pair_problem)
        return zt_fail(err, ZT_EUNSUPPORTED, "this tokenizer.json cannot encode pairs of texts: %s (give single "
                       "texts, or fix the template)", hf->pair_problem);
    int32_t *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    int rc = zt__hf_encode(hf, a, alen, false, &ta, &na, err);
    if (rc == 0 && b)
        rc = zt__hf_encode(hf, b, blen, false, &tb, &nb, err);
    if (rc != 0) {
        free(ta);
        return rc;
    }
    /* the layout: single texts take prefix + A + suffix; pairs the pair pieces (or A B with types 0 and 1) */
    size_t specials = 0;
    if (!b)
        specials = (size_t)hf->nprefix + (size_t)hf->nsuffix;
    else
        for (int k = 0; k < hf->npair; k++)
            specials += (size_t)hf->pair[k].nids;
    if (max_len > 0) {
        if (max_len < specials) {
            free(ta);
            free(tb);
            return zt_fail(err, ZT_EINVAL_CONFIG, "a sequence of %zu tokens cannot hold the %zu special tokens the "
                           "tokenizer adds around %s; raise the sequence length", max_len, specials,
                           b ? "a pair of texts" : "a text");
        }
        const size_t budget = max_len - specials;
        if (!b)
            na = na < budget ? na : budget;
        else
            zt__truncate_longest_first(&na, &nb, budget);
    }
    const size_t total = specials + na + nb;
    int32_t *oi = malloc((total ? total : 1) * sizeof(int32_t)), *ot = malloc((total ? total : 1) * sizeof(int32_t));
    if (!oi || !ot) {
        free(oi);
        free(ot);
        free(ta);
        free(tb);
        return zt_fail(err, ZT_ENOMEM, "out of memory encoding a pair of texts");
    }
    size_t k = 0;
#define PUT(id, type)                                                                                         \
    do {                                                                                                      \
        oi[k] = (id);                                                                                         \
        ot[k] = (type);                                                                                       \
        k++;                                                                                                  \
    } while (0)
    if (!b) {
        for (int i = 0; i < hf->nprefix; i++)
            PUT(hf->prefix_ids[i], 0);
        for (size_t i = 0; i < na; i++)
            PUT(ta[i], 0);
        for (int i = 0; i < hf->nsuffix; i++)
            PUT(hf->suffix_ids[i], 0);
    } else if (hf->npair == 0) {
        for (size_t i = 0; i < na; i++)
            PUT(ta[i], 0);
        for (size_t i = 0; i < nb; i++)
            PUT(tb[i], 1);
    } else {
        for (int p = 0; p < hf->npair; p++) {
            const struct zt__pair_piece *pc = &hf->pair[p];
            if (pc->seq == 0)
                for (int i = 0; i < pc->nids; i++)
                    PUT(pc->ids[i], pc->type_id);
            for (size_t i = 0; pc->seq == 1 && i < na; i++)
                PUT(ta[i], pc->type_id);
            for (size_t i = 0; pc->seq == 2 && i < nb; i++)
                PUT(tb[i], pc->type_id);
        }
    }
#undef PUT
    free(ta);
    free(tb);
    *ids = oi;
    *types = ot;
    *n = k;
    return 0;
}
