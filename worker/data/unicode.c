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
enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7, HANGUL_LN = 19, HANGUL_VN = 21,
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

int zt_unicode_nfkd(uint32_t cp, uint32_t out[ZT_UNICODE_MAX_NFKD])
{
    const zt__uc_map *m = cp < 0xA0 ? NULL : find_map(zt__uc_nfkd, zt__uc_nfkd_count, cp);
    if (!m) { /* no compatibility mapping: the canonical one */
        uint32_t d[ZT_UNICODE_MAX_EXPANSION];
        int n = zt_unicode_nfd(cp, d);
        for (int i = 0; i < n; i++)
            out[i] = d[i];
        return n;
    }
    for (int i = 0; i < m->len; i++)
        out[i] = zt__uc_nfkd_pool[m->start + i];
    return m->len;
}

uint32_t zt_unicode_compose(uint32_t first, uint32_t second)
{
    if (first >= HANGUL_L && first < HANGUL_L + HANGUL_LN && second >= HANGUL_V && second < HANGUL_V + HANGUL_VN)
        return HANGUL_S + ((first - HANGUL_L) * HANGUL_VN + (second - HANGUL_V)) * HANGUL_TN;
    if (first >= HANGUL_S && first < HANGUL_S + HANGUL_COUNT && (first - HANGUL_S) % HANGUL_TN == 0 &&
        second > HANGUL_T && second < HANGUL_T + HANGUL_TN)
        return first + (second - HANGUL_T);
    int lo = 0, hi = zt__uc_comp_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const zt__uc_pair *c = &zt__uc_comp[mid];
        if (c->first == first && c->second == second)
            return c->composite;
        if (c->first < first || (c->first == first && c->second < second))
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
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

/* ---- grapheme clusters --------------------------------------------------------------------------- */

/* Grapheme_Cluster_Break values (and Extended_Pictographic, which no other value overlaps outside
 * Other). */
enum gcb { G_OTHER, G_CR, G_LF, G_CONTROL, G_EXTEND, G_ZWJ, G_RI, G_PREPEND, G_SPACING_MARK, G_L, G_V, G_T,
           G_LV, G_LVT, G_EXT_PICT };

/* Grapheme_Cluster_Break of Unicode 14.0 (the version of unicode_tables.c), every value but Other and the
 * Hangul syllables (LV, LVT: computed), with Extended_Pictographic in place of Other; written from Perl's
 * Unicode::UCD (Perl 5.36: Unicode 14.0) by
 *   perl -MUnicode::UCD=prop_invmap -e '($l,$m) = prop_invmap("GCB"); ...'
 * which prints each range of prop_invmap("GCB") whose value is not Other, LV or LVT. */
static const struct {
    uint32_t first, last;
    uint8_t value;
} gcb_ranges[] = {
    {0x0, 0x9, G_CONTROL}, {0xA, 0xA, G_LF}, {0xB, 0xC, G_CONTROL}, {0xD, 0xD, G_CR}, {0xE, 0x1F, G_CONTROL},
    {0x7F, 0x9F, G_CONTROL}, {0xA9, 0xA9, G_EXT_PICT}, {0xAD, 0xAD, G_CONTROL}, {0xAE, 0xAE, G_EXT_PICT},
    {0x300, 0x36F, G_EXTEND}, {0x483, 0x489, G_EXTEND}, {0x591, 0x5BD, G_EXTEND}, {0x5BF, 0x5BF, G_EXTEND},
    {0x5C1, 0x5C2, G_EXTEND}, {0x5C4, 0x5C5, G_EXTEND}, {0x5C7, 0x5C7, G_EXTEND}, {0x600, 0x605, G_PREPEND},
    {0x610, 0x61A, G_EXTEND}, {0x61C, 0x61C, G_CONTROL}, {0x64B, 0x65F, G_EXTEND}, {0x670, 0x670, G_EXTEND},
    {0x6D6, 0x6DC, G_EXTEND}, {0x6DD, 0x6DD, G_PREPEND}, {0x6DF, 0x6E4, G_EXTEND}, {0x6E7, 0x6E8, G_EXTEND},
    {0x6EA, 0x6ED, G_EXTEND}, {0x70F, 0x70F, G_PREPEND}, {0x711, 0x711, G_EXTEND}, {0x730, 0x74A, G_EXTEND},
    {0x7A6, 0x7B0, G_EXTEND}, {0x7EB, 0x7F3, G_EXTEND}, {0x7FD, 0x7FD, G_EXTEND}, {0x816, 0x819, G_EXTEND},
    {0x81B, 0x823, G_EXTEND}, {0x825, 0x827, G_EXTEND}, {0x829, 0x82D, G_EXTEND}, {0x859, 0x85B, G_EXTEND},
    {0x890, 0x891, G_PREPEND}, {0x898, 0x89F, G_EXTEND}, {0x8CA, 0x8E1, G_EXTEND}, {0x8E2, 0x8E2, G_PREPEND},
    {0x8E3, 0x902, G_EXTEND}, {0x903, 0x903, G_SPACING_MARK}, {0x93A, 0x93A, G_EXTEND},
    {0x93B, 0x93B, G_SPACING_MARK}, {0x93C, 0x93C, G_EXTEND}, {0x93E, 0x940, G_SPACING_MARK},
    {0x941, 0x948, G_EXTEND}, {0x949, 0x94C, G_SPACING_MARK}, {0x94D, 0x94D, G_EXTEND},
    {0x94E, 0x94F, G_SPACING_MARK}, {0x951, 0x957, G_EXTEND}, {0x962, 0x963, G_EXTEND}, {0x981, 0x981, G_EXTEND},
    {0x982, 0x983, G_SPACING_MARK}, {0x9BC, 0x9BC, G_EXTEND}, {0x9BE, 0x9BE, G_EXTEND},
    {0x9BF, 0x9C0, G_SPACING_MARK}, {0x9C1, 0x9C4, G_EXTEND}, {0x9C7, 0x9C8, G_SPACING_MARK},
    {0x9CB, 0x9CC, G_SPACING_MARK}, {0x9CD, 0x9CD, G_EXTEND}, {0x9D7, 0x9D7, G_EXTEND}, {0x9E2, 0x9E3, G_EXTEND},
    {0x9FE, 0x9FE, G_EXTEND}, {0xA01, 0xA02, G_EXTEND}, {0xA03, 0xA03, G_SPACING_MARK}, {0xA3C, 0xA3C, G_EXTEND},
    {0xA3E, 0xA40, G_SPACING_MARK}, {0xA41, 0xA42, G_EXTEND}, {0xA47, 0xA48, G_EXTEND}, {0xA4B, 0xA4D, G_EXTEND},
    {0xA51, 0xA51, G_EXTEND}, {0xA70, 0xA71, G_EXTEND}, {0xA75, 0xA75, G_EXTEND}, {0xA81, 0xA82, G_EXTEND},
    {0xA83, 0xA83, G_SPACING_MARK}, {0xABC, 0xABC, G_EXTEND}, {0xABE, 0xAC0, G_SPACING_MARK},
    {0xAC1, 0xAC5, G_EXTEND}, {0xAC7, 0xAC8, G_EXTEND}, {0xAC9, 0xAC9, G_SPACING_MARK},
    {0xACB, 0xACC, G_SPACING_MARK}, {0xACD, 0xACD, G_EXTEND}, {0xAE2, 0xAE3, G_EXTEND}, {0xAFA, 0xAFF, G_EXTEND},
    {0xB01, 0xB01, G_EXTEND}, {0xB02, 0xB03, G_SPACING_MARK}, {0xB3C, 0xB3C, G_EXTEND}, {0xB3E, 0xB3F, G_EXTEND},
    {0xB40, 0xB40, G_SPACING_MARK}, {0xB41, 0xB44, G_EXTEND}, {0xB47, 0xB48, G_SPACING_MARK},
    {0xB4B, 0xB4C, G_SPACING_MARK}, {0xB4D, 0xB4D, G_EXTEND}, {0xB55, 0xB57, G_EXTEND}, {0xB62, 0xB63, G_EXTEND},
    {0xB82, 0xB82, G_EXTEND}, {0xBBE, 0xBBE, G_EXTEND}, {0xBBF, 0xBBF, G_SPACING_MARK}, {0xBC0, 0xBC0, G_EXTEND},
    {0xBC1, 0xBC2, G_SPACING_MARK}, {0xBC6, 0xBC8, G_SPACING_MARK}, {0xBCA, 0xBCC, G_SPACING_MARK},
    {0xBCD, 0xBCD, G_EXTEND}, {0xBD7, 0xBD7, G_EXTEND}, {0xC00, 0xC00, G_EXTEND}, {0xC01, 0xC03, G_SPACING_MARK},
    {0xC04, 0xC04, G_EXTEND}, {0xC3C, 0xC3C, G_EXTEND}, {0xC3E, 0xC40, G_EXTEND}, {0xC41, 0xC44, G_SPACING_MARK},
    {0xC46, 0xC48, G_EXTEND}, {0xC4A, 0xC4D, G_EXTEND}, {0xC55, 0xC56, G_EXTEND}, {0xC62, 0xC63, G_EXTEND},
    {0xC81, 0xC81, G_EXTEND}, {0xC82, 0xC83, G_SPACING_MARK}, {0xCBC, 0xCBC, G_EXTEND},
    {0xCBE, 0xCBE, G_SPACING_MARK}, {0xCBF, 0xCBF, G_EXTEND}, {0xCC0, 0xCC1, G_SPACING_MARK},
    {0xCC2, 0xCC2, G_EXTEND}, {0xCC3, 0xCC4, G_SPACING_MARK}, {0xCC6, 0xCC6, G_EXTEND},
    {0xCC7, 0xCC8, G_SPACING_MARK}, {0xCCA, 0xCCB, G_SPACING_MARK}, {0xCCC, 0xCCD, G_EXTEND},
    {0xCD5, 0xCD6, G_EXTEND}, {0xCE2, 0xCE3, G_EXTEND}, {0xD00, 0xD01, G_EXTEND}, {0xD02, 0xD03, G_SPACING_MARK},
    {0xD3B, 0xD3C, G_EXTEND}, {0xD3E, 0xD3E, G_EXTEND}, {0xD3F, 0xD40, G_SPACING_MARK}, {0xD41, 0xD44, G_EXTEND},
    {0xD46, 0xD48, G_SPACING_MARK}, {0xD4A, 0xD4C, G_SPACING_MARK}, {0xD4D, 0xD4D, G_EXTEND},
    {0xD4E, 0xD4E, G_PREPEND}, {0xD57, 0xD57, G_EXTEND}, {0xD62, 0xD63, G_EXTEND}, {0xD81, 0xD81, G_EXTEND},
    {0xD82, 0xD83, G_SPACING_MARK}, {0xDCA, 0xDCA, G_EXTEND}, {0xDCF, 0xDCF, G_EXTEND},
    {0xDD0, 0xDD1, G_SPACING_MARK}, {0xDD2, 0xDD4, G_EXTEND}, {0xDD6, 0xDD6, G_EXTEND},
    {0xDD8, 0xDDE, G_SPACING_MARK}, {0xDDF, 0xDDF, G_EXTEND}, {0xDF2, 0xDF3, G_SPACING_MARK},
    {0xE31, 0xE31, G_EXTEND}, {0xE33, 0xE33, G_SPACING_MARK}, {0xE34, 0xE3A, G_EXTEND}, {0xE47, 0xE4E, G_EXTEND},
    {0xEB1, 0xEB1, G_EXTEND}, {0xEB3, 0xEB3, G_SPACING_MARK}, {0xEB4, 0xEBC, G_EXTEND}, {0xEC8, 0xECD, G_EXTEND},
    {0xF18, 0xF19, G_EXTEND}, {0xF35, 0xF35, G_EXTEND}, {0xF37, 0xF37, G_EXTEND}, {0xF39, 0xF39, G_EXTEND},
    {0xF3E, 0xF3F, G_SPACING_MARK}, {0xF71, 0xF7E, G_EXTEND}, {0xF7F, 0xF7F, G_SPACING_MARK},
    {0xF80, 0xF84, G_EXTEND}, {0xF86, 0xF87, G_EXTEND}, {0xF8D, 0xF97, G_EXTEND}, {0xF99, 0xFBC, G_EXTEND},
    {0xFC6, 0xFC6, G_EXTEND}, {0x102D, 0x1030, G_EXTEND}, {0x1031, 0x1031, G_SPACING_MARK},
    {0x1032, 0x1037, G_EXTEND}, {0x1039, 0x103A, G_EXTEND}, {0x103B, 0x103C, G_SPACING_MARK},
    {0x103D, 0x103E, G_EXTEND}, {0x1056, 0x1057, G_SPACING_MARK}, {0x1058, 0x1059, G_EXTEND},
    {0x105E, 0x1060, G_EXTEND}, {0x1071, 0x1074, G_EXTEND}, {0x1082, 0x1082, G_EXTEND},
    {0x1084, 0x1084, G_SPACING_MARK}, {0x1085, 0x1086, G_EXTEND}, {0x108D, 0x108D, G_EXTEND},
    {0x109D, 0x109D, G_EXTEND}, {0x1100, 0x115F, G_L}, {0x1160, 0x11A7, G_V}, {0x11A8, 0x11FF, G_T},
    {0x135D, 0x135F, G_EXTEND}, {0x1712, 0x1714, G_EXTEND}, {0x1715, 0x1715, G_SPACING_MARK},
    {0x1732, 0x1733, G_EXTEND}, {0x1734, 0x1734, G_SPACING_MARK}, {0x1752, 0x1753, G_EXTEND},
    {0x1772, 0x1773, G_EXTEND}, {0x17B4, 0x17B5, G_EXTEND}, {0x17B6, 0x17B6, G_SPACING_MARK},
    {0x17B7, 0x17BD, G_EXTEND}, {0x17BE, 0x17C5, G_SPACING_MARK}, {0x17C6, 0x17C6, G_EXTEND},
    {0x17C7, 0x17C8, G_SPACING_MARK}, {0x17C9, 0x17D3, G_EXTEND}, {0x17DD, 0x17DD, G_EXTEND},
    {0x180B, 0x180D, G_EXTEND}, {0x180E, 0x180E, G_CONTROL}, {0x180F, 0x180F, G_EXTEND}, {0x1885, 0x1886, G_EXTEND},
    {0x18A9, 0x18A9, G_EXTEND}, {0x1920, 0x1922, G_EXTEND}, {0x1923, 0x1926, G_SPACING_MARK},
    {0x1927, 0x1928, G_EXTEND}, {0x1929, 0x192B, G_SPACING_MARK}, {0x1930, 0x1931, G_SPACING_MARK},
    {0x1932, 0x1932, G_EXTEND}, {0x1933, 0x1938, G_SPACING_MARK}, {0x1939, 0x193B, G_EXTEND},
    {0x1A17, 0x1A18, G_EXTEND}, {0x1A19, 0x1A1A, G_SPACING_MARK}, {0x1A1B, 0x1A1B, G_EXTEND},
    {0x1A55, 0x1A55, G_SPACING_MARK}, {0x1A56, 0x1A56, G_EXTEND}, {0x1A57, 0x1A57, G_SPACING_MARK},
    {0x1A58, 0x1A5E, G_EXTEND}, {0x1A60, 0x1A60, G_EXTEND}, {0x1A62, 0x1A62, G_EXTEND}, {0x1A65, 0x1A6C, G_EXTEND},
    {0x1A6D, 0x1A72, G_SPACING_MARK}, {0x1A73, 0x1A7C, G_EXTEND}, {0x1A7F, 0x1A7F, G_EXTEND},
    {0x1AB0, 0x1ACE, G_EXTEND}, {0x1B00, 0x1B03, G_EXTEND}, {0x1B04, 0x1B04, G_SPACING_MARK},
    {0x1B34, 0x1B3A, G_EXTEND}, {0x1B3B, 0x1B3B, G_SPACING_MARK}, {0x1B3C, 0x1B3C, G_EXTEND},
    {0x1B3D, 0x1B41, G_SPACING_MARK}, {0x1B42, 0x1B42, G_EXTEND}, {0x1B43, 0x1B44, G_SPACING_MARK},
    {0x1B6B, 0x1B73, G_EXTEND}, {0x1B80, 0x1B81, G_EXTEND}, {0x1B82, 0x1B82, G_SPACING_MARK},
    {0x1BA1, 0x1BA1, G_SPACING_MARK}, {0x1BA2, 0x1BA5, G_EXTEND}, {0x1BA6, 0x1BA7, G_SPACING_MARK},
    {0x1BA8, 0x1BA9, G_EXTEND}, {0x1BAA, 0x1BAA, G_SPACING_MARK}, {0x1BAB, 0x1BAD, G_EXTEND},
    {0x1BE6, 0x1BE6, G_EXTEND}, {0x1BE7, 0x1BE7, G_SPACING_MARK}, {0x1BE8, 0x1BE9, G_EXTEND},
    {0x1BEA, 0x1BEC, G_SPACING_MARK}, {0x1BED, 0x1BED, G_EXTEND}, {0x1BEE, 0x1BEE, G_SPACING_MARK},
    {0x1BEF, 0x1BF1, G_EXTEND}, {0x1BF2, 0x1BF3, G_SPACING_MARK}, {0x1C24, 0x1C2B, G_SPACING_MARK},
    {0x1C2C, 0x1C33, G_EXTEND}, {0x1C34, 0x1C35, G_SPACING_MARK}, {0x1C36, 0x1C37, G_EXTEND},
    {0x1CD0, 0x1CD2, G_EXTEND}, {0x1CD4, 0x1CE0, G_EXTEND}, {0x1CE1, 0x1CE1, G_SPACING_MARK},
    {0x1CE2, 0x1CE8, G_EXTEND}, {0x1CED, 0x1CED, G_EXTEND}, {0x1CF4, 0x1CF4, G_EXTEND},
    {0x1CF7, 0x1CF7, G_SPACING_MARK}, {0x1CF8, 0x1CF9, G_EXTEND}, {0x1DC0, 0x1DFF, G_EXTEND},
    {0x200B, 0x200B, G_CONTROL}, {0x200C, 0x200C, G_EXTEND}, {0x200D, 0x200D, G_ZWJ}, {0x200E, 0x200F, G_CONTROL},
    {0x2028, 0x202E, G_CONTROL}, {0x203C, 0x203C, G_EXT_PICT}, {0x2049, 0x2049, G_EXT_PICT},
    {0x2060, 0x206F, G_CONTROL}, {0x20D0, 0x20F0, G_EXTEND}, {0x2122, 0x2122, G_EXT_PICT},
    {0x2139, 0x2139, G_EXT_PICT}, {0x2194, 0x2199, G_EXT_PICT}, {0x21A9, 0x21AA, G_EXT_PICT},
    {0x231A, 0x231B, G_EXT_PICT}, {0x2328, 0x2328, G_EXT_PICT}, {0x2388, 0x2388, G_EXT_PICT},
    {0x23CF, 0x23CF, G_EXT_PICT}, {0x23E9, 0x23F3, G_EXT_PICT}, {0x23F8, 0x23FA, G_EXT_PICT},
    {0x24C2, 0x24C2, G_EXT_PICT}, {0x25AA, 0x25AB, G_EXT_PICT}, {0x25B6, 0x25B6, G_EXT_PICT},
    {0x25C0, 0x25C0, G_EXT_PICT}, {0x25FB, 0x25FE, G_EXT_PICT}, {0x2600, 0x2605, G_EXT_PICT},
    {0x2607, 0x2612, G_EXT_PICT}, {0x2614, 0x2685, G_EXT_PICT}, {0x2690, 0x2705, G_EXT_PICT},
    {0x2708, 0x2712, G_EXT_PICT}, {0x2714, 0x2714, G_EXT_PICT}, {0x2716, 0x2716, G_EXT_PICT},
    {0x271D, 0x271D, G_EXT_PICT}, {0x2721, 0x2721, G_EXT_PICT}, {0x2728, 0x2728, G_EXT_PICT},
    {0x2733, 0x2734, G_EXT_PICT}, {0x2744, 0x2744, G_EXT_PICT}, {0x2747, 0x2747, G_EXT_PICT},
    {0x274C, 0x274C, G_EXT_PICT}, {0x274E, 0x274E, G_EXT_PICT}, {0x2753, 0x2755, G_EXT_PICT},
    {0x2757, 0x2757, G_EXT_PICT}, {0x2763, 0x2767, G_EXT_PICT}, {0x2795, 0x2797, G_EXT_PICT},
    {0x27A1, 0x27A1, G_EXT_PICT}, {0x27B0, 0x27B0, G_EXT_PICT}, {0x27BF, 0x27BF, G_EXT_PICT},
    {0x2934, 0x2935, G_EXT_PICT}, {0x2B05, 0x2B07, G_EXT_PICT}, {0x2B1B, 0x2B1C, G_EXT_PICT},
    {0x2B50, 0x2B50, G_EXT_PICT}, {0x2B55, 0x2B55, G_EXT_PICT}, {0x2CEF, 0x2CF1, G_EXTEND},
    {0x2D7F, 0x2D7F, G_EXTEND}, {0x2DE0, 0x2DFF, G_EXTEND}, {0x302A, 0x302F, G_EXTEND}, {0x3030, 0x3030, G_EXT_PICT},
    {0x303D, 0x303D, G_EXT_PICT}, {0x3099, 0x309A, G_EXTEND}, {0x3297, 0x3297, G_EXT_PICT},
    {0x3299, 0x3299, G_EXT_PICT}, {0xA66F, 0xA672, G_EXTEND}, {0xA674, 0xA67D, G_EXTEND}, {0xA69E, 0xA69F, G_EXTEND},
    {0xA6F0, 0xA6F1, G_EXTEND}, {0xA802, 0xA802, G_EXTEND}, {0xA806, 0xA806, G_EXTEND}, {0xA80B, 0xA80B, G_EXTEND},
    {0xA823, 0xA824, G_SPACING_MARK}, {0xA825, 0xA826, G_EXTEND}, {0xA827, 0xA827, G_SPACING_MARK},
    {0xA82C, 0xA82C, G_EXTEND}, {0xA880, 0xA881, G_SPACING_MARK}, {0xA8B4, 0xA8C3, G_SPACING_MARK},
    {0xA8C4, 0xA8C5, G_EXTEND}, {0xA8E0, 0xA8F1, G_EXTEND}, {0xA8FF, 0xA8FF, G_EXTEND}, {0xA926, 0xA92D, G_EXTEND},
    {0xA947, 0xA951, G_EXTEND}, {0xA952, 0xA953, G_SPACING_MARK}, {0xA960, 0xA97C, G_L}, {0xA980, 0xA982, G_EXTEND},
    {0xA983, 0xA983, G_SPACING_MARK}, {0xA9B3, 0xA9B3, G_EXTEND}, {0xA9B4, 0xA9B5, G_SPACING_MARK},
    {0xA9B6, 0xA9B9, G_EXTEND}, {0xA9BA, 0xA9BB, G_SPACING_MARK}, {0xA9BC, 0xA9BD, G_EXTEND},
    {0xA9BE, 0xA9C0, G_SPACING_MARK}, {0xA9E5, 0xA9E5, G_EXTEND}, {0xAA29, 0xAA2E, G_EXTEND},
    {0xAA2F, 0xAA30, G_SPACING_MARK}, {0xAA31, 0xAA32, G_EXTEND}, {0xAA33, 0xAA34, G_SPACING_MARK},
    {0xAA35, 0xAA36, G_EXTEND}, {0xAA43, 0xAA43, G_EXTEND}, {0xAA4C, 0xAA4C, G_EXTEND},
    {0xAA4D, 0xAA4D, G_SPACING_MARK}, {0xAA7C, 0xAA7C, G_EXTEND}, {0xAAB0, 0xAAB0, G_EXTEND},
    {0xAAB2, 0xAAB4, G_EXTEND}, {0xAAB7, 0xAAB8, G_EXTEND}, {0xAABE, 0xAABF, G_EXTEND}, {0xAAC1, 0xAAC1, G_EXTEND},
    {0xAAEB, 0xAAEB, G_SPACING_MARK}, {0xAAEC, 0xAAED, G_EXTEND}, {0xAAEE, 0xAAEF, G_SPACING_MARK},
    {0xAAF5, 0xAAF5, G_SPACING_MARK}, {0xAAF6, 0xAAF6, G_EXTEND}, {0xABE3, 0xABE4, G_SPACING_MARK},
    {0xABE5, 0xABE5, G_EXTEND}, {0xABE6, 0xABE7, G_SPACING_MARK}, {0xABE8, 0xABE8, G_EXTEND},
    {0xABE9, 0xABEA, G_SPACING_MARK}, {0xABEC, 0xABEC, G_SPACING_MARK}, {0xABED, 0xABED, G_EXTEND},
    {0xD7B0, 0xD7C6, G_V}, {0xD7CB, 0xD7FB, G_T}, {0xFB1E, 0xFB1E, G_EXTEND}, {0xFE00, 0xFE0F, G_EXTEND},
    {0xFE20, 0xFE2F, G_EXTEND}, {0xFEFF, 0xFEFF, G_CONTROL}, {0xFF9E, 0xFF9F, G_EXTEND}, {0xFFF0, 0xFFFB, G_CONTROL},
    {0x101FD, 0x101FD, G_EXTEND}, {0x102E0, 0x102E0, G_EXTEND}, {0x10376, 0x1037A, G_EXTEND},
    {0x10A01, 0x10A03, G_EXTEND}, {0x10A05, 0x10A06, G_EXTEND}, {0x10A0C, 0x10A0F, G_EXTEND},
    {0x10A38, 0x10A3A, G_EXTEND}, {0x10A3F, 0x10A3F, G_EXTEND}, {0x10AE5, 0x10AE6, G_EXTEND},
    {0x10D24, 0x10D27, G_EXTEND}, {0x10EAB, 0x10EAC, G_EXTEND}, {0x10F46, 0x10F50, G_EXTEND},
    {0x10F82, 0x10F85, G_EXTEND}, {0x11000, 0x11000, G_SPACING_MARK}, {0x11001, 0x11001, G_EXTEND},
    {0x11002, 0x11002, G_SPACING_MARK}, {0x11038, 0x11046, G_EXTEND}, {0x11070, 0x11070, G_EXTEND},
    {0x11073, 0x11074, G_EXTEND}, {0x1107F, 0x11081, G_EXTEND}, {0x11082, 0x11082, G_SPACING_MARK},
    {0x110B0, 0x110B2, G_SPACING_MARK}, {0x110B3, 0x110B6, G_EXTEND}, {0x110B7, 0x110B8, G_SPACING_MARK},
    {0x110B9, 0x110BA, G_EXTEND}, {0x110BD, 0x110BD, G_PREPEND}, {0x110C2, 0x110C2, G_EXTEND},
    {0x110CD, 0x110CD, G_PREPEND}, {0x11100, 0x11102, G_EXTEND}, {0x11127, 0x1112B, G_EXTEND},
    {0x1112C, 0x1112C, G_SPACING_MARK}, {0x1112D, 0x11134, G_EXTEND}, {0x11145, 0x11146, G_SPACING_MARK},
    {0x11173, 0x11173, G_EXTEND}, {0x11180, 0x11181, G_EXTEND}, {0x11182, 0x11182, G_SPACING_MARK},
    {0x111B3, 0x111B5, G_SPACING_MARK}, {0x111B6, 0x111BE, G_EXTEND}, {0x111BF, 0x111C0, G_SPACING_MARK},
    {0x111C2, 0x111C3, G_PREPEND}, {0x111C9, 0x111CC, G_EXTEND}, {0x111CE, 0x111CE, G_SPACING_MARK},
    {0x111CF, 0x111CF, G_EXTEND}, {0x1122C, 0x1122E, G_SPACING_MARK}, {0x1122F, 0x11231, G_EXTEND},
    {0x11232, 0x11233, G_SPACING_MARK}, {0x11234, 0x11234, G_EXTEND}, {0x11235, 0x11235, G_SPACING_MARK},
    {0x11236, 0x11237, G_EXTEND}, {0x1123E, 0x1123E, G_EXTEND}, {0x112DF, 0x112DF, G_EXTEND},
    {0x112E0, 0x112E2, G_SPACING_MARK}, {0x112E3, 0x112EA, G_EXTEND}, {0x11300, 0x11301, G_EXTEND},
    {0x11302, 0x11303, G_SPACING_MARK}, {0x1133B, 0x1133C, G_EXTEND}, {0x1133E, 0x1133E, G_EXTEND},
    {0x1133F, 0x1133F, G_SPACING_MARK}, {0x11340, 0x11340, G_EXTEND}, {0x11341, 0x11344, G_SPACING_MARK},
    {0x11347, 0x11348, G_SPACING_MARK}, {0x1134B, 0x1134D, G_SPACING_MARK}, {0x11357, 0x11357, G_EXTEND},
    {0x11362, 0x11363, G_SPACING_MARK}, {0x11366, 0x1136C, G_EXTEND}, {0x11370, 0x11374, G_EXTEND},
    {0x11435, 0x11437, G_SPACING_MARK}, {0x11438, 0x1143F, G_EXTEND}, {0x11440, 0x11441, G_SPACING_MARK},
    {0x11442, 0x11444, G_EXTEND}, {0x11445, 0x11445, G_SPACING_MARK}, {0x11446, 0x11446, G_EXTEND},
    {0x1145E, 0x1145E, G_EXTEND}, {0x114B0, 0x114B0, G_EXTEND}, {0x114B1, 0x114B2, G_SPACING_MARK},
    {0x114B3, 0x114B8, G_EXTEND}, {0x114B9, 0x114B9, G_SPACING_MARK}, {0x114BA, 0x114BA, G_EXTEND},
    {0x114BB, 0x114BC, G_SPACING_MARK}, {0x114BD, 0x114BD, G_EXTEND}, {0x114BE, 0x114BE, G_SPACING_MARK},
    {0x114BF, 0x114C0, G_EXTEND}, {0x114C1, 0x114C1, G_SPACING_MARK}, {0x114C2, 0x114C3, G_EXTEND},
    {0x115AF, 0x115AF, G_EXTEND}, {0x115B0, 0x115B1, G_SPACING_MARK}, {0x115B2, 0x115B5, G_EXTEND},
    {0x115B8, 0x115BB, G_SPACING_MARK}, {0x115BC, 0x115BD, G_EXTEND}, {0x115BE, 0x115BE, G_SPACING_MARK},
    {0x115BF, 0x115C0, G_EXTEND}, {0x115DC, 0x115DD, G_EXTEND}, {0x11630, 0x11632, G_SPACING_MARK},
    {0x11633, 0x1163A, G_EXTEND}, {0x1163B, 0x1163C, G_SPACING_MARK}, {0x1163D, 0x1163D, G_EXTEND},
    {0x1163E, 0x1163E, G_SPACING_MARK}, {0x1163F, 0x11640, G_EXTEND}, {0x116AB, 0x116AB, G_EXTEND},
    {0x116AC, 0x116AC, G_SPACING_MARK}, {0x116AD, 0x116AD, G_EXTEND}, {0x116AE, 0x116AF, G_SPACING_MARK},
    {0x116B0, 0x116B5, G_EXTEND}, {0x116B6, 0x116B6, G_SPACING_MARK}, {0x116B7, 0x116B7, G_EXTEND},
    {0x1171D, 0x1171F, G_EXTEND}, {0x11722, 0x11725, G_EXTEND}, {0x11726, 0x11726, G_SPACING_MARK},
    {0x11727, 0x1172B, G_EXTEND}, {0x1182C, 0x1182E, G_SPACING_MARK}, {0x1182F, 0x11837, G_EXTEND},
    {0x11838, 0x11838, G_SPACING_MARK}, {0x11839, 0x1183A, G_EXTEND}, {0x11930, 0x11930, G_EXTEND},
    {0x11931, 0x11935, G_SPACING_MARK}, {0x11937, 0x11938, G_SPACING_MARK}, {0x1193B, 0x1193C, G_EXTEND},
    {0x1193D, 0x1193D, G_SPACING_MARK}, {0x1193E, 0x1193E, G_EXTEND}, {0x1193F, 0x1193F, G_PREPEND},
    {0x11940, 0x11940, G_SPACING_MARK}, {0x11941, 0x11941, G_PREPEND}, {0x11942, 0x11942, G_SPACING_MARK},
    {0x11943, 0x11943, G_EXTEND}, {0x119D1, 0x119D3, G_SPACING_MARK}, {0x119D4, 0x119D7, G_EXTEND},
    {0x119DA, 0x119DB, G_EXTEND}, {0x119DC, 0x119DF, G_SPACING_MARK}, {0x119E0, 0x119E0, G_EXTEND},
    {0x119E4, 0x119E4, G_SPACING_MARK}, {0x11A01, 0x11A0A, G_EXTEND}, {0x11A33, 0x11A38, G_EXTEND},
    {0x11A39, 0x11A39, G_SPACING_MARK}, {0x11A3A, 0x11A3A, G_PREPEND}, {0x11A3B, 0x11A3E, G_EXTEND},
    {0x11A47, 0x11A47, G_EXTEND}, {0x11A51, 0x11A56, G_EXTEND}, {0x11A57, 0x11A58, G_SPACING_MARK},
    {0x11A59, 0x11A5B, G_EXTEND}, {0x11A84, 0x11A89, G_PREPEND}, {0x11A8A, 0x11A96, G_EXTEND},
    {0x11A97, 0x11A97, G_SPACING_MARK}, {0x11A98, 0x11A99, G_EXTEND}, {0x11C2F, 0x11C2F, G_SPACING_MARK},
    {0x11C30, 0x11C36, G_EXTEND}, {0x11C38, 0x11C3D, G_EXTEND}, {0x11C3E, 0x11C3E, G_SPACING_MARK},
    {0x11C3F, 0x11C3F, G_EXTEND}, {0x11C92, 0x11CA7, G_EXTEND}, {0x11CA9, 0x11CA9, G_SPACING_MARK},
    {0x11CAA, 0x11CB0, G_EXTEND}, {0x11CB1, 0x11CB1, G_SPACING_MARK}, {0x11CB2, 0x11CB3, G_EXTEND},
    {0x11CB4, 0x11CB4, G_SPACING_MARK}, {0x11CB5, 0x11CB6, G_EXTEND}, {0x11D31, 0x11D36, G_EXTEND},
    {0x11D3A, 0x11D3A, G_EXTEND}, {0x11D3C, 0x11D3D, G_EXTEND}, {0x11D3F, 0x11D45, G_EXTEND},
    {0x11D46, 0x11D46, G_PREPEND}, {0x11D47, 0x11D47, G_EXTEND}, {0x11D8A, 0x11D8E, G_SPACING_MARK},
    {0x11D90, 0x11D91, G_EXTEND}, {0x11D93, 0x11D94, G_SPACING_MARK}, {0x11D95, 0x11D95, G_EXTEND},
    {0x11D96, 0x11D96, G_SPACING_MARK}, {0x11D97, 0x11D97, G_EXTEND}, {0x11EF3, 0x11EF4, G_EXTEND},
    {0x11EF5, 0x11EF6, G_SPACING_MARK}, {0x13430, 0x13438, G_CONTROL}, {0x16AF0, 0x16AF4, G_EXTEND},
    {0x16B30, 0x16B36, G_EXTEND}, {0x16F4F, 0x16F4F, G_EXTEND}, {0x16F51, 0x16F87, G_SPACING_MARK},
    {0x16F8F, 0x16F92, G_EXTEND}, {0x16FE4, 0x16FE4, G_EXTEND}, {0x16FF0, 0x16FF1, G_SPACING_MARK},
    {0x1BC9D, 0x1BC9E, G_EXTEND}, {0x1BCA0, 0x1BCA3, G_CONTROL}, {0x1CF00, 0x1CF2D, G_EXTEND},
    {0x1CF30, 0x1CF46, G_EXTEND}, {0x1D165, 0x1D165, G_EXTEND}, {0x1D166, 0x1D166, G_SPACING_MARK},
    {0x1D167, 0x1D169, G_EXTEND}, {0x1D16D, 0x1D16D, G_SPACING_MARK}, {0x1D16E, 0x1D172, G_EXTEND},
    {0x1D173, 0x1D17A, G_CONTROL}, {0x1D17B, 0x1D182, G_EXTEND}, {0x1D185, 0x1D18B, G_EXTEND},
    {0x1D1AA, 0x1D1AD, G_EXTEND}, {0x1D242, 0x1D244, G_EXTEND}, {0x1DA00, 0x1DA36, G_EXTEND},
    {0x1DA3B, 0x1DA6C, G_EXTEND}, {0x1DA75, 0x1DA75, G_EXTEND}, {0x1DA84, 0x1DA84, G_EXTEND},
    {0x1DA9B, 0x1DA9F, G_EXTEND}, {0x1DAA1, 0x1DAAF, G_EXTEND}, {0x1E000, 0x1E006, G_EXTEND},
    {0x1E008, 0x1E018, G_EXTEND}, {0x1E01B, 0x1E021, G_EXTEND}, {0x1E023, 0x1E024, G_EXTEND},
    {0x1E026, 0x1E02A, G_EXTEND}, {0x1E130, 0x1E136, G_EXTEND}, {0x1E2AE, 0x1E2AE, G_EXTEND},
    {0x1E2EC, 0x1E2EF, G_EXTEND}, {0x1E8D0, 0x1E8D6, G_EXTEND}, {0x1E944, 0x1E94A, G_EXTEND},
    {0x1F000, 0x1F0FF, G_EXT_PICT}, {0x1F10D, 0x1F10F, G_EXT_PICT}, {0x1F12F, 0x1F12F, G_EXT_PICT},
    {0x1F16C, 0x1F171, G_EXT_PICT}, {0x1F17E, 0x1F17F, G_EXT_PICT}, {0x1F18E, 0x1F18E, G_EXT_PICT},
    {0x1F191, 0x1F19A, G_EXT_PICT}, {0x1F1AD, 0x1F1E5, G_EXT_PICT}, {0x1F1E6, 0x1F1FF, G_RI},
    {0x1F201, 0x1F20F, G_EXT_PICT}, {0x1F21A, 0x1F21A, G_EXT_PICT}, {0x1F22F, 0x1F22F, G_EXT_PICT},
    {0x1F232, 0x1F23A, G_EXT_PICT}, {0x1F23C, 0x1F23F, G_EXT_PICT}, {0x1F249, 0x1F3FA, G_EXT_PICT},
    {0x1F3FB, 0x1F3FF, G_EXTEND}, {0x1F400, 0x1F53D, G_EXT_PICT}, {0x1F546, 0x1F64F, G_EXT_PICT},
    {0x1F680, 0x1F6FF, G_EXT_PICT}, {0x1F774, 0x1F77F, G_EXT_PICT}, {0x1F7D5, 0x1F7FF, G_EXT_PICT},
    {0x1F80C, 0x1F80F, G_EXT_PICT}, {0x1F848, 0x1F84F, G_EXT_PICT}, {0x1F85A, 0x1F85F, G_EXT_PICT},
    {0x1F888, 0x1F88F, G_EXT_PICT}, {0x1F8AE, 0x1F8FF, G_EXT_PICT}, {0x1F90C, 0x1F93A, G_EXT_PICT},
    {0x1F93C, 0x1F945, G_EXT_PICT}, {0x1F947, 0x1FAFF, G_EXT_PICT}, {0x1FC00, 0x1FFFD, G_EXT_PICT},
    {0xE0000, 0xE001F, G_CONTROL}, {0xE0020, 0xE007F, G_EXTEND}, {0xE0080, 0xE00FF, G_CONTROL},
    {0xE0100, 0xE01EF, G_EXTEND}, {0xE01F0, 0xE0FFF, G_CONTROL},
};

static enum gcb gcb_of(uint32_t cp)
{
    if (cp >= 0xAC00 && cp <= 0xD7A3) /* Hangul syllables: LV when there is no trailing consonant */
        return (cp - 0xAC00) % 28 == 0 ? G_LV : G_LVT;
    if (cp >= 0x20 && cp < 0x7F)
        return G_OTHER;
    int lo = 0, hi = (int)(sizeof(gcb_ranges) / sizeof(gcb_ranges[0])) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < gcb_ranges[mid].first)
            hi = mid - 1;
        else if (cp > gcb_ranges[mid].last)
            lo = mid + 1;
        else
            return (enum gcb)gcb_ranges[mid].value;
    }
    return G_OTHER;
}

/* The character at s[i] of valid UTF-8 and its length. */
static uint32_t utf8_at(const unsigned char *s, size_t i, int *n)
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

size_t zt_unicode_grapheme_end(const unsigned char *s, size_t len, size_t i)
{
    if (i >= len)
        return len;
    int n;
    enum gcb prev = gcb_of(utf8_at(s, i, &n));
    i += (size_t)n;
    bool pict = prev == G_EXT_PICT; /* GB11: ExtPict Extend* so far, then ZWJ */
    bool pict_zwj = false;
    int ri = prev == G_RI ? 1 : 0;  /* GB12/13: regional indicators in a row */
    while (i < len) {
        enum gcb next = gcb_of(utf8_at(s, i, &n));
        bool join;
        if (prev == G_CR && next == G_LF)
            join = true; /* GB3 */
        else if (prev == G_CR || prev == G_LF || prev == G_CONTROL || next == G_CR || next == G_LF ||
                 next == G_CONTROL)
            join = false; /* GB4, GB5 */
        else if (prev == G_L && (next == G_L || next == G_V || next == G_LV || next == G_LVT))
            join = true; /* GB6 */
        else if ((prev == G_LV || prev == G_V) && (next == G_V || next == G_T))
            join = true; /* GB7 */
        else if ((prev == G_LVT || prev == G_T) && next == G_T)
            join = true; /* GB8 */
        else if (next == G_EXTEND || next == G_ZWJ || next == G_SPACING_MARK || prev == G_PREPEND)
            join = true; /* GB9, GB9a, GB9b */
        else if (prev == G_ZWJ && next == G_EXT_PICT && pict_zwj)
            join = true; /* GB11 */
        else if (prev == G_RI && next == G_RI && ri % 2 == 1)
            join = true; /* GB12, GB13 */
        else
            join = false;
        if (!join)
            break;
        pict_zwj = pict && next == G_ZWJ;
        pict = (pict && next == G_EXTEND) || next == G_EXT_PICT;
        ri = next == G_RI ? ri + 1 : 0;
        prev = next;
        i += (size_t)n;
    }
    return i;
}
