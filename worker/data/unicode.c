/* Lookups in the generated Unicode tables (worker/data/unicode_tables.c), the fixed lists that are not
 * worth a table (White_Space, the BERT normalizer's CJK blocks), Hangul decomposition, and UTF-8. */
#include "worker/data/unicode.h"

const char *zt_unicode_version(void)
{
    return zt__unicode_tables_version;
}

bool zt_unicode_is_white_space(uint32_t cp)
{
    /* White_Space has not changed since Unicode 6.3 (which removed U+180E). */
    if (cp <= 0x20)
        return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85)
        return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool zt_unicode_is_cjk(uint32_t cp)
{
    /* The ranges of the BERT normalizer (Hugging Face tokenizers, Google's BERT): they are blocks, not a
     * property, so they do not follow the Unicode version. */
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) ||
           (cp >= 0x2B920 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* Binary search of a sorted mapping table; returns the entry for cp or NULL. */
static const zt__uc_map *find_map(const zt__uc_map *table, int count, uint32_t cp)
{
    int lo = 0, hi = count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (table[mid].cp == cp)
            return &table[mid];
        if (table[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int zt_unicode_lower(uint32_t cp, uint32_t out[ZT_UNICODE_MAX_EXPANSION])
{
    if (cp < 0x80) {
        out[0] = (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
        return 1;
    }
    const zt__uc_map *m = find_map(zt__uc_lower, zt__uc_lower_count, cp);
    if (!m) {
        out[0] = cp;
        return 1;
    }
    for (int i = 0; i < m->len; i++)
        out[i] = zt__uc_lower_pool[m->start + i];
    return m->len;
}

/* Hangul syllables decompose by arithmetic (Unicode 3.12). */
enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7, HANGUL_VN = 21,
       HANGUL_TN = 28, HANGUL_COUNT = 11172 };

int zt_unicode_nfd(uint32_t cp, uint32_t out[ZT_UNICODE_MAX_EXPANSION])
{
    if (cp < 0xC0) {
        out[0] = cp;
        return 1;
    }
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_COUNT) {
        uint32_t s = cp - HANGUL_S;
        out[0] = HANGUL_L + s / (HANGUL_VN * HANGUL_TN);
        out[1] = HANGUL_V + (s % (HANGUL_VN * HANGUL_TN)) / HANGUL_TN;
        if (s % HANGUL_TN == 0)
            return 2;
        out[2] = HANGUL_T + s % HANGUL_TN;
        return 3;
    }
    const zt__uc_map *m = find_map(zt__uc_nfd, zt__uc_nfd_count, cp);
    if (!m) {
        out[0] = cp;
        return 1;
    }
    for (int i = 0; i < m->len; i++)
        out[i] = zt__uc_nfd_pool[m->start + i];
    return m->len;
}

int zt_unicode_ccc(uint32_t cp)
{
    if (cp < 0x300)
        return 0;
    int lo = 0, hi = zt__uc_ccc_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < zt__uc_ccc[mid].first)
            hi = mid - 1;
        else if (cp > zt__uc_ccc[mid].last)
            lo = mid + 1;
        else
            return zt__uc_ccc[mid].value;
    }
    return 0;
}

/* The allowed range of the second byte after lead byte b (Unicode Table 3-7); the later ones are 80..BF. */
static void second_byte_range(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b == 0xE0)
        *lo = 0xA0;
    else if (b == 0xED)
        *hi = 0x9F;
    else if (b == 0xF0)
        *lo = 0x90;
    else if (b == 0xF4)
        *hi = 0x8F;
}

/* The length of the character that lead byte b starts, or 0 if b cannot start one. */
static int lead_length(unsigned char b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* The number of bytes at s (at most len) that conform to a well-formed sequence started by s[0]. */
static int conforming_bytes(const unsigned char *s, size_t len, int need)
{
    unsigned char lo, hi;
    second_byte_range(s[0], &lo, &hi);
    int n = 1;
    while (n < need && (size_t)n < len) {
        if (s[n] < lo || s[n] > hi)
            break;
        lo = 0x80;
        hi = 0xBF;
        n++;
    }
    return n;
}

int zt_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need = lead_length(b);
    if (need == 0 || conforming_bytes(s, len, need) != need)
        return 0;
    uint32_t v = b & (0xFFu >> (need + 1));
    for (int i = 1; i < need; i++)
        v = (v << 6) | (s[i] & 0x3Fu);
    *cp = v;
    return need;
}

int zt_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t zt_utf8_valid_prefix(const void *text, size_t len)
{
    const unsigned char *s = text;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int n = zt_utf8_decode(s + i, len - i, &cp);
        if (n == 0)
            return i;
        i += (size_t)n;
    }
    return len;
}

int zt_utf8_invalid_length(const unsigned char *s, size_t len)
{
    int need = lead_length(s[0]);
    if (need <= 1)
        return 1;
    return conforming_bytes(s, len, need);
}
