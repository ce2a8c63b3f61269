/* Reads a Hugging Face tokenizer.json into the form tokenize_hf.c runs (worker/data/tokenize_hf.h).
 *
 * Every object is checked key by key: a component type, field or value that this build does not implement
 * is refused with ZT_EUNSUPPORTED and its JSON path (for example `pre_tokenizer.pretokenizers[0].pattern`),
 * rather than ignored, because ignoring it would give other ids than the tokenizers library without a word.
 * Fields that only matter for offsets (trim_offsets) or for pairs of sequences are accepted and unused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "worker/data/tokenize_hf.h"
#include "worker/data/unicode.h"

#define PATH_LEN 256

/* ---- hash maps ------------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    if (n > 0)
        memcpy(&v, p, n);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 32;
    return h;
}

static int strmap_grow_slots(zt__strmap *m)
{
    size_t nslots = m->nslots ? m->nslots * 2 : 64;
    uint32_t *slots = calloc(nslots, sizeof(uint32_t));
    if (!slots)
        return ZT_ENOMEM;
    for (size_t i = 0; i < m->n; i++) {
        size_t s = m->entries[i].hash & (nslots - 1);
        while (slots[s])
            s = (s + 1) & (nslots - 1);
        slots[s] = (uint32_t)i + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->nslots = nslots;
    return 0;
}

int32_t zt__strmap_get(const zt__strmap *m, const char *key, size_t len)
{
    if (m->n == 0)
        return -1;
    uint64_t h = hash_bytes(key, len);
    size_t s = h & (m->nslots - 1);
    for (;;) {
        uint32_t e = m->slots[s];
        if (e == 0)
            return -1;
        const struct zt__strmap_entry *x = &m->entries[e - 1];
        if (x->hash == h && x->len == len && (len == 0 || memcmp(m->arena + x->off, key, len) == 0))
            return x->value;
        s = (s + 1) & (m->nslots - 1);
    }
}

int zt__strmap_put(zt__strmap *m, const char *key, size_t len, int32_t value)
{
    if (len > UINT32_MAX / 2)
        return ZT_ENOMEM;
    if ((m->n + 1) * 2 > m->nslots && strmap_grow_slots(m) != 0)
        return ZT_ENOMEM;
    uint64_t h = hash_bytes(key, len);
    size_t s = h & (m->nslots - 1);
    for (;;) {
        uint32_t e = m->slots[s];
        if (e == 0)
            break;
        struct zt__strmap_entry *x = &m->entries[e - 1];
        if (x->hash == h && x->len == len && (len == 0 || memcmp(m->arena + x->off, key, len) == 0)) {
            x->value = value;
            return 0;
        }
        s = (s + 1) & (m->nslots - 1);
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        void *p = realloc(m->entries, cap * sizeof(*m->entries));
        if (!p)
            return ZT_ENOMEM;
        m->entries = p;
        m->cap = cap;
    }
    if (m->arena_len + len > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap : 1024;
        while (cap < m->arena_len + len)
            cap *= 2;
        if (cap > UINT32_MAX)
            return ZT_ENOMEM;
        char *p = realloc(m->arena, cap);
        if (!p)
            return ZT_ENOMEM;
        m->arena = p;
        m->arena_cap = cap;
    }
    if (len > 0)
        memcpy(m->arena + m->arena_len, key, len);
    m->entries[m->n] = (struct zt__strmap_entry){.hash = h, .off = (uint32_t)m->arena_len, .len = (uint32_t)len,
                                                 .value = value};
    m->arena_len += len;
    m->slots[s] = (uint32_t)++m->n;
    return 0;
}

void zt__strmap_free(zt__strmap *m)
{
    free(m->entries);
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof(*m));
}

/* ---- messages and fields ----------------------------------------------------------------------- */

typedef struct loader {
    zt__hf *hf;
    const char *where; /* file name for messages */
    zt_err *err;
    const char *json;  /* the file's text (Unigram scores are read from it as the library reads them) */
    size_t len;
} loader;

/* A short rendering of a JSON value for messages. */
static void value_text(const cJSON *v, char *out, size_t cap)
{
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    if (!s) {
        snprintf(out, cap, "(missing)");
        return;
    }
    if (strlen(s) > 80)
        snprintf(out, cap, "%.77s...", s);
    else
        snprintf(out, cap, "%s", s);
    free(s);
}

/* ZT_EUNSUPPORTED for the value at path: "where: path = value is not supported ...; hint". */
static int unsupported(loader *ld, const char *path, const cJSON *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int unsupported(loader *ld, const char *path, const cJSON *v, const char *fmt, ...)
{
    char val[96], hint[300];
    value_text(v, val, sizeof(val));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hint, sizeof(hint), fmt, ap);
    va_end(ap);
    return zt_fail(ld->err, ZT_EUNSUPPORTED, "%s: %s = %s is not supported by ztrain's tokenizers: %s", ld->where,
                   path, val, hint);
}

/* ZT_EFORMAT for a field of the wrong form. */
static int bad_field(loader *ld, const char *path, const char *expected)
{
    return zt_fail(ld->err, ZT_EFORMAT, "%s: %s should be %s; the file is not a valid tokenizer.json", ld->where,
                   path, expected);
}

/* path.key into out (PATH_LEN bytes; a longer path is cut, which only shortens a message). */
static void child_path(char *out, const char *path, const char *key)
{
    if (snprintf(out, PATH_LEN, "%s%s%s", path, path[0] ? "." : "", key) >= PATH_LEN)
        out[PATH_LEN - 1] = '\0';
}

static void index_path(char *out, const char *path, int i)
{
    if (snprintf(out, PATH_LEN, "%s[%d]", path, i) >= PATH_LEN)
        out[PATH_LEN - 1] = '\0';
}

/* Refuses any key of obj that is not in the NULL-terminated list. */
static int check_keys(loader *ld, const cJSON *obj, const char *path, const char *const *known)
{
    for (const cJSON *it = obj->child; it; it = it->next) {
        bool ok = false;
        for (int i = 0; known[i]; i++)
            ok = ok || strcmp(it->string, known[i]) == 0;
        if (!ok) {
            char p[PATH_LEN];
            child_path(p, path, it->string);
            return unsupported(ld, p, it, "this field is not implemented; remove it if it is not needed");
        }
    }
    return 0;
}

/* Reads a bool field (absent or null: *out keeps its default). */
static int get_bool(loader *ld, const cJSON *obj, const char *path, const char *key, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v)) {
        char p[PATH_LEN];
        child_path(p, path, key);
        return bad_field(ld, p, "true or false");
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Reads a non-negative integer field (absent or null: *out keeps its default). */
static int get_int(loader *ld, const cJSON *obj, const char *path, const char *key, int64_t max, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)max ||
        v->valuedouble != floor(v->valuedouble)) {
        char p[PATH_LEN], what[64];
        child_path(p, path, key);
        snprintf(what, sizeof(what), "an integer from 0 to %lld", (long long)max);
        return bad_field(ld, p, what);
    }
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int dup_bytes(zt__bytes *b, const char *s, size_t len)
{
    b->p = malloc(len + 1);
    if (!b->p)
        return ZT_ENOMEM;
    memcpy(b->p, s, len);
    b->p[len] = '\0';
    b->len = len;
    return 0;
}

/* Reads a string field into *out (absent or null: out stays empty and *present false). */
static int get_string(loader *ld, const cJSON *obj, const char *path, const char *key, zt__bytes *out,
                      bool *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (present)
        *present = false;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v)) {
        char p[PATH_LEN];
        child_path(p, path, key);
        return bad_field(ld, p, "a string");
    }
    if (present)
        *present = true;
    free(out->p);
    out->p = NULL;
    if (dup_bytes(out, v->valuestring, strlen(v->valuestring)) != 0)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    return 0;
}

/* Reads a required string field. */
static int need_string(loader *ld, const cJSON *obj, const char *path, const char *key, zt__bytes *out)
{
    bool present;
    int rc = get_string(ld, obj, path, key, out, &present);
    if (rc == 0 && !present) {
        char p[PATH_LEN];
        child_path(p, path, key);
        return bad_field(ld, p, "a string (it is missing)");
    }
    return rc;
}

/* The "type" of a component; NULL (with the error set) when it is missing or not a string. */
static const char *component_type(loader *ld, const cJSON *obj, const char *path)
{
    char p[PATH_LEN];
    child_path(p, path, "type");
    if (!cJSON_IsObject(obj)) {
        bad_field(ld, path, "an object or null");
        return NULL;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    if (!cJSON_IsString(t)) {
        bad_field(ld, p, "a string naming the component");
        return NULL;
    }
    return t->valuestring;
}

/* A Split / Replace pattern: {"String": s} or {"Regex": r}. Sets *is_regex and the text. */
static int get_pattern(loader *ld, const cJSON *obj, const char *path, zt__bytes *out, bool *is_regex)
{
    char p[PATH_LEN];
    child_path(p, path, "pattern");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    const cJSON *s = cJSON_IsObject(pat) ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
    const cJSON *r = cJSON_IsObject(pat) ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
    const cJSON *v = s ? s : r;
    if (!v || !cJSON_IsString(v) || cJSON_GetArraySize(pat) != 1)
        return bad_field(ld, p, "{\"String\": ...} or {\"Regex\": ...}");
    *is_regex = r != NULL;
    if (dup_bytes(out, v->valuestring, strlen(v->valuestring)) != 0)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    return 0;
}

/* ---- normalizers ----------------------------------------------------------------------------------- */

static int add_norm(loader *ld, zt__norm n)
{
    zt__hf *hf = ld->hf;
    void *p = realloc(hf->norms, (size_t)(hf->nnorms + 1) * sizeof(*hf->norms));
    if (!p)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    hf->norms = p;
    hf->norms[hf->nnorms++] = n;
    return 0;
}

static const char norm_list[] =
    "ztrain implements the normalizers BertNormalizer, Lowercase, NFD, NFKD, NFC, NFKC, StripAccents, Strip, "
    "Prepend, Replace (with a String pattern or the Regex \" {2,}\"), Precompiled and Sequence";

/* Standard base64 with padding (the library's BASE64_STANDARD) into *out; false when s is not that. */
static bool base64_decode(const char *s, size_t len, zt__bytes *out)
{
    if (len % 4 != 0)
        return false;
    out->p = malloc(len / 4 * 3 + 1);
    if (!out->p)
        return false;
    size_t n = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            char c = s[i + k];
            int d = c >= 'A' && c <= 'Z'   ? c - 'A'
                    : c >= 'a' && c <= 'z' ? c - 'a' + 26
                    : c >= '0' && c <= '9' ? c - '0' + 52
                    : c == '+'             ? 62
                    : c == '/'             ? 63
                                           : -1;
            if (c == '=' && i + 4 == len && k >= 2 && (k == 3 || s[i + 3] == '=')) {
                pad++;
                d = 0;
            } else if (d < 0 || pad) {
                free(out->p);
                out->p = NULL;
                return false;
            }
            v = v << 6 | (uint32_t)d;
        }
        out->p[n++] = (char)(v >> 16);
        if (pad < 2)
            out->p[n++] = (char)(v >> 8);
        if (pad < 1)
            out->p[n++] = (char)v;
    }
    out->len = n;
    return true;
}

/* Precompiled: SentencePiece's precompiled_charsmap, base64 of [u32 trie size in bytes][the trie's u32
 * units][the normalized strings, each ended by a NUL], as spm_precompiled reads it. */
static int load_precompiled(loader *ld, const cJSON *obj, const char *path, zt__norm *n)
{
    static const char *const keys[] = {"type", "precompiled_charsmap", NULL};
    char p[PATH_LEN];
    int rc;
    zt__bytes b64 = {0}, blob = {0};
    child_path(p, path, "precompiled_charsmap");
    if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
        (rc = need_string(ld, obj, path, "precompiled_charsmap", &b64)) != 0)
        return rc;
    bool ok = base64_decode(b64.p, b64.len, &blob);
    free(b64.p);
    if (!ok)
        return bad_field(ld, p, "a base64 string (SentencePiece's precompiled charsmap)");
    const unsigned char *u = (const unsigned char *)blob.p;
    uint32_t trie_bytes = blob.len >= 4 ? (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 |
                                              (uint32_t)u[3] << 24
                                        : 0;
    size_t units = trie_bytes / 4;
    if (blob.len < 4 || units == 0 || (blob.len - 4) / 4 < units) {
        free(blob.p);
        return bad_field(ld, p, "a charsmap whose trie fits in it (4 bytes of trie size, then the trie)");
    }
    n->type = ZT__NORM_PRECOMPILED;
    n->ntrie = units;
    n->trie = malloc(units * sizeof(uint32_t));
    size_t rest = blob.len - 4 - units * 4;
    if (!n->trie || dup_bytes(&n->a, blob.p + 4 + units * 4, rest) != 0) {
        free(blob.p);
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    }
    for (size_t i = 0; i < units; i++) {
        const unsigned char *q = u + 4 + 4 * i;
        n->trie[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    }
    free(blob.p);
    if (zt_utf8_valid_prefix(n->a.p, n->a.len) != n->a.len)
        return bad_field(ld, p, "a charsmap whose normalized strings are UTF-8");
    return 0;
}

static int load_normalizer(loader *ld, const cJSON *obj, const char *path, int depth)
{
    if (cJSON_IsNull(obj))
        return 0;
    const char *type = component_type(ld, obj, path);
    if (!type)
        return ZT_EFORMAT;
    char p[PATH_LEN];
    zt__norm n = {0};
    int rc;
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "normalizers", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "normalizers");
        child_path(p, path, "normalizers");
        if (!cJSON_IsArray(list))
            return bad_field(ld, p, "an array of normalizers");
        if (depth > 16)
            return unsupported(ld, p, list, "Sequences nested more than 16 deep");
        int i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char q[PATH_LEN];
            index_path(q, p, i);
            if ((rc = load_normalizer(ld, it, q, depth + 1)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "BertNormalizer") == 0) {
        static const char *const keys[] = {"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase",
                                           NULL};
        n.type = ZT__NORM_BERT;
        n.clean_text = n.handle_chinese_chars = n.lowercase = true;
        bool strip_set = false, strip = false;
        const cJSON *sa = cJSON_GetObjectItemCaseSensitive(obj, "strip_accents");
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_bool(ld, obj, path, "clean_text", &n.clean_text)) != 0 ||
            (rc = get_bool(ld, obj, path, "handle_chinese_chars", &n.handle_chinese_chars)) != 0 ||
            (rc = get_bool(ld, obj, path, "lowercase", &n.lowercase)) != 0 ||
            (rc = get_bool(ld, obj, path, "strip_accents", &strip)) != 0)
            return rc;
        strip_set = sa && !cJSON_IsNull(sa);
        n.strip_accents = strip_set ? strip : n.lowercase; /* null follows lowercase, as in the library */
        return add_norm(ld, n);
    }
    if (strcmp(type, "Lowercase") == 0 || strcmp(type, "NFD") == 0 || strcmp(type, "StripAccents") == 0 ||
        strcmp(type, "NFKD") == 0 || strcmp(type, "NFC") == 0 || strcmp(type, "NFKC") == 0) {
        static const char *const keys[] = {"type", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        n.type = type[0] == 'L'                 ? ZT__NORM_LOWERCASE
                 : strcmp(type, "NFD") == 0     ? ZT__NORM_NFD
                 : strcmp(type, "NFKD") == 0    ? ZT__NORM_NFKD
                 : strcmp(type, "NFC") == 0     ? ZT__NORM_NFC
                 : strcmp(type, "NFKC") == 0    ? ZT__NORM_NFKC
                                                : ZT__NORM_STRIP_ACCENTS;
        return add_norm(ld, n);
    }
    if (strcmp(type, "Precompiled") == 0) {
        if ((rc = load_precompiled(ld, obj, path, &n)) == 0 && (rc = add_norm(ld, n)) == 0)
            return 0;
        free(n.a.p);
        free(n.trie);
        return rc;
    }
    if (strcmp(type, "Strip") == 0) {
        static const char *const keys[] = {"type", "strip_left", "strip_right", NULL};
        n.type = ZT__NORM_STRIP;
        n.strip_left = n.strip_right = true;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_bool(ld, obj, path, "strip_left", &n.strip_left)) != 0 ||
            (rc = get_bool(ld, obj, path, "strip_right", &n.strip_right)) != 0)
            return rc;
        return add_norm(ld, n);
    }
    if (strcmp(type, "Prepend") == 0) {
        static const char *const keys[] = {"type", "prepend", NULL};
        n.type = ZT__NORM_PREPEND;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 || (rc = need_string(ld, obj, path, "prepend", &n.a)) != 0 ||
            (rc = add_norm(ld, n)) != 0) {
            free(n.a.p);
            return rc;
        }
        return 0;
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        n.type = ZT__NORM_REPLACE;
        bool is_regex = false;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 || (rc = get_pattern(ld, obj, path, &n.a, &is_regex)) != 0 ||
            (rc = need_string(ld, obj, path, "content", &n.b)) != 0)
            goto replace_fail;
        child_path(p, path, "pattern");
        if (is_regex && strcmp(n.a.p, " {2,}") == 0) {
            n.type = ZT__NORM_REPLACE_SPACES; /* T5's, matched by hand */
        } else if (is_regex) {
            rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "pattern"),
                             "ztrain has no regex engine; Replace takes a String pattern, or the Regex \" {2,}\" "
                             "(runs of spaces, as T5 has)");
            goto replace_fail;
        }
        if (n.a.len == 0) {
            rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "pattern"), "an empty pattern");
            goto replace_fail;
        }
        if ((rc = add_norm(ld, n)) == 0)
            return 0;
    replace_fail:
        free(n.a.p);
        free(n.b.p);
        return rc;
    }
    child_path(p, path, "type");
    return unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "type"), "%s", norm_list);
}

/* ---- pre-tokenizers -------------------------------------------------------------------------------- */

static int add_pretok(loader *ld, zt__pretok t)
{
    zt__hf *hf = ld->hf;
    void *p = realloc(hf->pretoks, (size_t)(hf->npretoks + 1) * sizeof(*hf->pretoks));
    if (!p)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    hf->pretoks = p;
    hf->pretoks[hf->npretoks++] = t;
    return 0;
}

/* The patterns written by hand (worker/data/tokenize_hf.c): GPT-2's, cl100k's (LLaMA-3) and Qwen2's. */
static const struct {
    const char *text;
    enum zt__regex regex;
} known_regexes[] = {
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", ZT__REGEX_GPT2},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     ZT__REGEX_CL100K},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     ZT__REGEX_QWEN2},
};

static int get_behavior(loader *ld, const cJSON *obj, const char *path, enum zt__split_behavior *out)
{
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    char p[PATH_LEN];
    child_path(p, path, "behavior");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "behavior");
    if (!cJSON_IsString(v))
        return bad_field(ld, p, "one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    for (int i = 0; i < 5; i++)
        if (strcmp(v->valuestring, names[i]) == 0) {
            *out = (enum zt__split_behavior)i;
            return 0;
        }
    return bad_field(ld, p, "one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

/* The fields of Metaspace (pre-tokenizer and decoder): replacement, prepend_scheme, split, and the older
 * add_prefix_space and str_rep, read as the library reads them. */
static int get_metaspace(loader *ld, const cJSON *obj, const char *path, zt__bytes *rep, enum zt__prepend *prepend,
                         bool *split)
{
    static const char *const keys[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                       "str_rep", NULL};
    char p[PATH_LEN];
    int rc;
    bool add_prefix_space = true, has_aps;
    zt__bytes unused = {0};
    *prepend = ZT__PREPEND_ALWAYS;
    *split = true;
    if ((rc = check_keys(ld, obj, path, keys)) != 0 || (rc = need_string(ld, obj, path, "replacement", rep)) != 0 ||
        (rc = get_bool(ld, obj, path, "split", split)) != 0 ||
        (rc = get_bool(ld, obj, path, "add_prefix_space", &add_prefix_space)) != 0 ||
        (rc = get_string(ld, obj, path, "str_rep", &unused, NULL)) != 0)
        return rc;
    free(unused.p);
    uint32_t cp;
    if (rep->len == 0 || zt_utf8_decode((const unsigned char *)rep->p, rep->len, &cp) != (int)rep->len) {
        child_path(p, path, "replacement");
        return bad_field(ld, p, "one character");
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "prepend_scheme");
    child_path(p, path, "prepend_scheme");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v))
            return bad_field(ld, p, "\"always\", \"never\" or \"first\"");
        if (strcmp(v->valuestring, "always") == 0)
            *prepend = ZT__PREPEND_ALWAYS;
        else if (strcmp(v->valuestring, "never") == 0)
            *prepend = ZT__PREPEND_NEVER;
        else if (strcmp(v->valuestring, "first") == 0)
            *prepend = ZT__PREPEND_FIRST;
        else
            return bad_field(ld, p, "\"always\", \"never\" or \"first\"");
    }
    has_aps = cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(obj, "add_prefix_space"));
    if (has_aps && !add_prefix_space) {
        if (*prepend != ZT__PREPEND_NEVER && v && !cJSON_IsNull(v))
            return bad_field(ld, p, "\"never\" when add_prefix_space is false");
        *prepend = ZT__PREPEND_NEVER;
    }
    return 0;
}

/* True when some normalizer step can delete characters at the start of a text, which moves where the
 * first piece begins in the original text (Metaspace's "first" looks at that). */
static bool normalizer_may_delete(const zt__hf *hf)
{
    for (int i = 0; i < hf->nnorms; i++) {
        const zt__norm *n = &hf->norms[i];
        if ((n->type == ZT__NORM_BERT && (n->clean_text || n->strip_accents)) || n->type == ZT__NORM_STRIP_ACCENTS ||
            (n->type == ZT__NORM_STRIP && n->strip_left) ||
            ((n->type == ZT__NORM_REPLACE || n->type == ZT__NORM_REPLACE_SPACES) && n->b.len == 0) ||
            n->type == ZT__NORM_PRECOMPILED) /* a charsmap may map characters to nothing */
            return true;
    }
    return false;
}

static const char pretok_list[] =
    "ztrain implements the pre-tokenizers ByteLevel, Split (a String pattern, or the GPT-2, LLaMA-3/cl100k or "
    "Qwen2 regex), Metaspace, BertPreTokenizer, WhitespaceSplit, Punctuation, Digits and Sequence";

static int load_pretok(loader *ld, const cJSON *obj, const char *path, int depth)
{
    if (cJSON_IsNull(obj))
        return 0;
    const char *type = component_type(ld, obj, path);
    if (!type)
        return ZT_EFORMAT;
    char p[PATH_LEN];
    zt__pretok t = {0};
    int rc;
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "pretokenizers", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "pretokenizers");
        child_path(p, path, "pretokenizers");
        if (!cJSON_IsArray(list))
            return bad_field(ld, p, "an array of pre-tokenizers");
        if (depth > 16)
            return unsupported(ld, p, list, "Sequences nested more than 16 deep");
        int i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char q[PATH_LEN];
            index_path(q, p, i);
            if ((rc = load_pretok(ld, it, q, depth + 1)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        t.type = ZT__PRETOK_BYTE_LEVEL;
        t.add_prefix_space = true;
        t.use_regex = true;
        bool trim = true;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_bool(ld, obj, path, "add_prefix_space", &t.add_prefix_space)) != 0 ||
            (rc = get_bool(ld, obj, path, "use_regex", &t.use_regex)) != 0 ||
            (rc = get_bool(ld, obj, path, "trim_offsets", &trim)) != 0) /* offsets only */
            return rc;
        return add_pretok(ld, t);
    }
    if (strcmp(type, "Split") == 0) {
        static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
        bool is_regex = false, invert = false;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 || (rc = get_pattern(ld, obj, path, &t.a, &is_regex)) != 0)
            return rc;
        if ((rc = get_behavior(ld, obj, path, &t.behavior)) != 0 || (rc = get_bool(ld, obj, path, "invert", &invert)))
            goto split_fail;
        if (invert) {
            child_path(p, path, "invert");
            rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "invert"), "only invert false is implemented");
            goto split_fail;
        }
        child_path(p, path, "pattern");
        if (is_regex) {
            size_t k = 0, nk = sizeof(known_regexes) / sizeof(known_regexes[0]);
            while (k < nk && strcmp(known_regexes[k].text, t.a.p) != 0)
                k++;
            if (k == nk) {
                rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "pattern"),
                                 "ztrain has no regex engine; it implements GPT-2's, LLaMA-3's (cl100k) and Qwen2's "
                                 "split patterns, character for character");
                goto split_fail;
            }
            t.type = ZT__PRETOK_SPLIT_REGEX;
            t.regex = known_regexes[k].regex;
        } else {
            if (t.a.len == 0) {
                rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "pattern"), "an empty pattern");
                goto split_fail;
            }
            t.type = ZT__PRETOK_SPLIT_STRING;
        }
        if ((rc = add_pretok(ld, t)) == 0)
            return 0;
    split_fail:
        free(t.a.p);
        return rc;
    }
    if (strcmp(type, "BertPreTokenizer") == 0 || strcmp(type, "WhitespaceSplit") == 0) {
        static const char *const keys[] = {"type", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        t.type = type[0] == 'B' ? ZT__PRETOK_BERT : ZT__PRETOK_WHITESPACE_SPLIT;
        return add_pretok(ld, t);
    }
    if (strcmp(type, "Punctuation") == 0) {
        static const char *const keys[] = {"type", "behavior", NULL};
        t.type = ZT__PRETOK_PUNCTUATION;
        t.behavior = ZT__SPLIT_ISOLATED;
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        if (cJSON_GetObjectItemCaseSensitive(obj, "behavior") && (rc = get_behavior(ld, obj, path, &t.behavior)) != 0)
            return rc;
        return add_pretok(ld, t);
    }
    if (strcmp(type, "Metaspace") == 0) {
        t.type = ZT__PRETOK_METASPACE;
        if ((rc = get_metaspace(ld, obj, path, &t.a, &t.prepend, &t.split)) != 0)
            goto metaspace_fail;
        if (t.prepend == ZT__PREPEND_FIRST && (ld->hf->npretoks > 0 || normalizer_may_delete(ld->hf))) {
            child_path(p, path, "prepend_scheme");
            rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "prepend_scheme"),
                             "\"first\" is implemented for a Metaspace that comes first among the pre-tokenizers, "
                             "after normalizers that delete no characters");
            goto metaspace_fail;
        }
        if ((rc = add_pretok(ld, t)) == 0)
            return 0;
    metaspace_fail:
        free(t.a.p);
        return rc;
    }
    if (strcmp(type, "Digits") == 0) {
        static const char *const keys[] = {"type", "individual_digits", NULL};
        t.type = ZT__PRETOK_DIGITS;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_bool(ld, obj, path, "individual_digits", &t.individual_digits)) != 0)
            return rc;
        return add_pretok(ld, t);
    }
    child_path(p, path, "type");
    return unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "type"), "%s", pretok_list);
}

/* ---- decoders -------------------------------------------------------------------------------------- */

static int add_decoder(loader *ld, zt__decoder d)
{
    zt__hf *hf = ld->hf;
    void *p = realloc(hf->decoders, (size_t)(hf->ndecoders + 1) * sizeof(*hf->decoders));
    if (!p)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    hf->decoders = p;
    hf->decoders[hf->ndecoders++] = d;
    return 0;
}

static const char decoder_list[] =
    "ztrain implements the decoders ByteLevel, ByteFallback, Fuse, Strip, Replace (with a String pattern), "
    "WordPiece, BPEDecoder, Metaspace and Sequence";

static int load_decoder(loader *ld, const cJSON *obj, const char *path, int depth)
{
    if (cJSON_IsNull(obj))
        return 0;
    const char *type = component_type(ld, obj, path);
    if (!type)
        return ZT_EFORMAT;
    ld->hf->has_decoder = true;
    char p[PATH_LEN];
    zt__decoder d = {0};
    int rc;
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "decoders", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "decoders");
        child_path(p, path, "decoders");
        if (!cJSON_IsArray(list))
            return bad_field(ld, p, "an array of decoders");
        if (depth > 16)
            return unsupported(ld, p, list, "Sequences nested more than 16 deep");
        int i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char q[PATH_LEN];
            index_path(q, p, i);
            if ((rc = load_decoder(ld, it, q, depth + 1)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        bool unused = false;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_bool(ld, obj, path, "add_prefix_space", &unused)) != 0 ||
            (rc = get_bool(ld, obj, path, "trim_offsets", &unused)) != 0 ||
            (rc = get_bool(ld, obj, path, "use_regex", &unused)) != 0)
            return rc;
        d.type = ZT__DEC_BYTE_LEVEL;
        return add_decoder(ld, d);
    }
    if (strcmp(type, "ByteFallback") == 0 || strcmp(type, "Fuse") == 0) {
        static const char *const keys[] = {"type", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        d.type = type[0] == 'B' ? ZT__DEC_BYTE_FALLBACK : ZT__DEC_FUSE;
        return add_decoder(ld, d);
    }
    if (strcmp(type, "Strip") == 0) {
        static const char *const keys[] = {"type", "content", "start", "stop", NULL};
        int64_t start = 0, stop = 0;
        d.type = ZT__DEC_STRIP;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 || (rc = need_string(ld, obj, path, "content", &d.a)) != 0 ||
            (rc = get_int(ld, obj, path, "start", 1 << 20, &start)) != 0 ||
            (rc = get_int(ld, obj, path, "stop", 1 << 20, &stop)) != 0)
            goto strip_fail;
        uint32_t cp;
        if (d.a.len == 0 || zt_utf8_decode((const unsigned char *)d.a.p, d.a.len, &cp) != (int)d.a.len) {
            child_path(p, path, "content");
            rc = bad_field(ld, p, "one character");
            goto strip_fail;
        }
        d.start = (int)start;
        d.stop = (int)stop;
        if ((rc = add_decoder(ld, d)) == 0)
            return 0;
    strip_fail:
        free(d.a.p);
        return rc;
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        bool is_regex = false;
        d.type = ZT__DEC_REPLACE;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 || (rc = get_pattern(ld, obj, path, &d.a, &is_regex)) != 0 ||
            (rc = need_string(ld, obj, path, "content", &d.b)) != 0)
            goto replace_fail;
        child_path(p, path, "pattern");
        if (is_regex || d.a.len == 0) {
            rc = unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "pattern"),
                             "Replace takes a non-empty String pattern here");
            goto replace_fail;
        }
        if ((rc = add_decoder(ld, d)) == 0)
            return 0;
    replace_fail:
        free(d.a.p);
        free(d.b.p);
        return rc;
    }
    if (strcmp(type, "WordPiece") == 0) {
        static const char *const keys[] = {"type", "prefix", "cleanup", NULL};
        d.type = ZT__DEC_WORDPIECE;
        d.cleanup = true;
        bool present;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_string(ld, obj, path, "prefix", &d.a, &present)) != 0 ||
            (rc = get_bool(ld, obj, path, "cleanup", &d.cleanup)) != 0)
            goto wp_fail;
        if (!present && (rc = dup_bytes(&d.a, "##", 2)) != 0)
            goto wp_fail;
        if ((rc = add_decoder(ld, d)) == 0)
            return 0;
    wp_fail:
        free(d.a.p);
        return rc == ZT_ENOMEM ? zt_fail(ld->err, rc, "out of memory reading %s", ld->where) : rc;
    }
    if (strcmp(type, "Metaspace") == 0) {
        bool split;
        d.type = ZT__DEC_METASPACE;
        if ((rc = get_metaspace(ld, obj, path, &d.a, &d.prepend, &split)) == 0 && (rc = add_decoder(ld, d)) == 0)
            return 0;
        free(d.a.p);
        return rc;
    }
    if (strcmp(type, "BPEDecoder") == 0) {
        static const char *const keys[] = {"type", "suffix", NULL};
        d.type = ZT__DEC_BPE;
        bool present;
        if ((rc = check_keys(ld, obj, path, keys)) != 0 ||
            (rc = get_string(ld, obj, path, "suffix", &d.a, &present)) != 0)
            goto bpe_fail;
        if (!present && (rc = dup_bytes(&d.a, "</w>", 4)) != 0)
            goto bpe_fail;
        if ((rc = add_decoder(ld, d)) == 0)
            return 0;
    bpe_fail:
        free(d.a.p);
        return rc == ZT_ENOMEM ? zt_fail(ld->err, rc, "out of memory reading %s", ld->where) : rc;
    }
    child_path(p, path, "type");
    return unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "type"), "%s", decoder_list);
}

/* ---- model ----------------------------------------------------------------------------------------- */

static int load_vocab(loader *ld, const cJSON *model)
{
    zt__hf *hf = ld->hf;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return bad_field(ld, "model.vocab", "an object of token: id");
    for (const cJSON *it = vocab->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)INT32_MAX ||
            it->valuedouble != floor(it->valuedouble)) {
            char p[PATH_LEN + 64];
            snprintf(p, sizeof(p), "model.vocab[\"%.60s\"]", it->string);
            return bad_field(ld, p, "a token id (an integer from 0)");
        }
        size_t len = strlen(it->string);
        if (zt__strmap_put(&hf->vocab, it->string, len, (int32_t)it->valuedouble) != 0)
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading the vocabulary of %s", ld->where);
        if (len > hf->max_token_len)
            hf->max_token_len = len;
    }
    return 0;
}

static int merges_put(zt__hf *hf, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t s = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & hf->merges_mask;
    while (hf->merges[s].key != 0 && hf->merges[s].key != key)
        s = (s + 1) & hf->merges_mask;
    hf->merges[s] = (struct zt__merge){.key = key, .rank = rank, .id = id};
    return 0;
}

/* One merge "a b" or ["a", "b"]; sets the two strings (borrowed from the JSON or from buf). */
static int merge_parts(loader *ld, const cJSON *m, int i, char *buf, size_t cap, const char **a, size_t *alen,
                       const char **b, size_t *blen)
{
    char p[PATH_LEN];
    index_path(p, "model.merges", i);
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return bad_field(ld, p, "two tokens separated by one space (\"a b\")");
        size_t n = strlen(s);
        if (n + 1 > cap)
            return bad_field(ld, p, "a merge of tokens shorter than 4096 bytes");
        memcpy(buf, s, n + 1);
        *a = buf;
        *alen = (size_t)(sp - s);
        *b = buf + *alen + 1;
        *blen = n - *alen - 1;
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *alen = strlen(*a);
        *b = m->child->next->valuestring;
        *blen = strlen(*b);
        return 0;
    }
    return bad_field(ld, p, "\"a b\" or [\"a\", \"b\"]");
}

static int load_merges(loader *ld, const cJSON *model)
{
    zt__hf *hf = ld->hf;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges))
        return bad_field(ld, "model.merges", "an array of merges");
    size_t n = (size_t)cJSON_GetArraySize(merges);
    size_t slots = 16;
    while (slots < 2 * n + 2)
        slots *= 2;
    hf->merges = calloc(slots, sizeof(*hf->merges));
    if (!hf->merges)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory for the %zu merges of %s", n, ld->where);
    hf->merges_mask = slots - 1;
    char *joined = malloc(4096 * 2 + 2);
    char *one = malloc(4096 * 2 + 2);
    if (!joined || !one) {
        free(joined);
        free(one);
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    }
    int rc = 0;
    uint32_t rank = 0;
    int i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++) {
        if (cJSON_IsString(m) && strncmp(m->valuestring, "#version", 8) == 0)
            continue; /* a merges.txt header, skipped by the library too (it does not take a rank) */
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if ((rc = merge_parts(ld, m, i, one, 4096 * 2 + 2, &a, &alen, &b, &blen)) != 0)
            break;
        int32_t ia = zt__strmap_get(&hf->vocab, a, alen), ib = zt__strmap_get(&hf->vocab, b, blen);
        size_t plen = hf->subword_prefix.len;
        if (ia < 0 || ib < 0 || blen < plen || alen + blen - plen > 4096 * 2) {
            char p[PATH_LEN];
            index_path(p, "model.merges", i);
            rc = zt_fail(ld->err, ZT_EFORMAT, "%s: %s merges '%.*s' and '%.*s', but '%.*s' is not in model.vocab; "
                         "the file is not a valid tokenizer.json",
                         ld->where, p, (int)alen, a, (int)blen, b, (int)(ia < 0 ? alen : blen), ia < 0 ? a : b);
            break;
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b + plen, blen - plen);
        int32_t id = zt__strmap_get(&hf->vocab, joined, alen + blen - plen);
        if (id < 0) {
            char p[PATH_LEN];
            index_path(p, "model.merges", i);
            rc = zt_fail(ld->err, ZT_EFORMAT, "%s: %s makes '%.*s', which is not in model.vocab; the file is not a "
                         "valid tokenizer.json",
                         ld->where, p, (int)(alen + blen - plen), joined);
            break;
        }
        merges_put(hf, ia, ib, rank++, id); /* a pair listed twice keeps its last rank, as in the library */
    }
    free(joined);
    free(one);
    return rc;
}

/* ---- Unigram scores, read as the library reads them ---------------------------------------------- */

/* The library parses tokenizer.json with serde_json, whose default float parsing is not correctly rounded:
 * the digits go into a u64 (digits past its range are dropped), which becomes a double and is then
 * multiplied or divided by a power of ten, two roundings. strtod (cJSON) is correctly rounded, and the two
 * differ in the last bit for about one score in twenty. Viterbi compares sums of scores, so a score one bit
 * off can change a segmentation where two paths are nearly tied: the scores are read again from the file's
 * text, the serde_json way. */

/* serde_json's f64_from_parts: significand * 10^exponent in two roundings. */
static double serde_from_parts(bool positive, uint64_t significand, int64_t exponent, const double *pow10)
{
    double f = (double)significand;
    for (;;) {
        int64_t a = exponent < 0 ? -exponent : exponent;
        if (a <= 308) {
            if (exponent >= 0)
                f *= pow10[a];
            else
                f /= pow10[a];
            break;
        }
        if (f == 0.0)
            break;
        if (exponent >= 0) {
            f = INFINITY; /* the library refuses such a number; cJSON's value is used then */
            break;
        }
        f /= 1e308;
        exponent += 308;
    }
    return positive ? f : -f;
}

/* Parses the JSON number at p (up to end) as serde_json does; false when it is not one. */
static bool serde_number(const char *p, const char *end, const double *pow10, double *out)
{
    bool positive = true;
    if (p < end && *p == '-') {
        positive = false;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return false;
    const uint64_t max10 = UINT64_MAX / 10, maxd = UINT64_MAX % 10;
    uint64_t sig = 0;
    int64_t exponent = 0;
    bool overflow = false;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            uint64_t d = (uint64_t)(*p - '0');
            if (overflow || (sig >= max10 && (sig > max10 || d > maxd))) {
                overflow = true; /* parse_long_integer: the digit counts in the exponent */
                exponent++;
            } else {
                sig = sig * 10 + d;
            }
            p++;
        }
    }
    bool is_float = overflow;
    if (p < end && *p == '.') {
        is_float = true;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return false;
        while (p < end && *p >= '0' && *p <= '9') {
            uint64_t d = (uint64_t)(*p - '0');
            if (!overflow && sig >= max10 && (sig > max10 || d > maxd))
                overflow = true; /* parse_decimal_overflow: further digits are dropped */
            if (!overflow) {
                sig = sig * 10 + d;
                exponent--;
            }
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = true;
        p++;
        bool pos_exp = true;
        if (p < end && (*p == '+' || *p == '-'))
            pos_exp = *p++ == '+';
        if (p >= end || *p < '0' || *p > '9')
            return false;
        int64_t e = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (e < 100000)
                e = e * 10 + (*p - '0');
            p++;
        }
        if (e >= 100000) { /* parse_exponent_overflow */
            if (sig != 0 && pos_exp)
                return false;
            *out = positive ? 0.0 : -0.0;
            return true;
        }
        exponent += pos_exp ? e : -e;
    }
    if (!is_float) { /* an integer: u64, or i64, made a double */
        *out = positive ? (double)sig : -(double)sig;
        return true;
    }
    *out = serde_from_parts(positive, sig, exponent, pow10);
    return true;
}

static const char *json_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the JSON value at p (which cJSON has already found valid), or NULL. */
static const char *json_skip(const char *p, const char *end)
{
    p = json_ws(p, end);
    if (p >= end)
        return NULL;
    if (*p == '"') {
        for (p++; p < end; p++) {
            if (*p == '\\')
                p++;
            else if (*p == '"')
                return p + 1;
        }
        return NULL;
    }
    if (*p == '{' || *p == '[') {
        int depth = 0;
        for (; p < end; p++) {
            if (*p == '"') {
                p = json_skip(p, end);
                if (!p)
                    return NULL;
                p--;
            } else if (*p == '{' || *p == '[') {
                depth++;
            } else if (*p == '}' || *p == ']') {
                if (--depth == 0)
                    return p + 1;
            }
        }
        return NULL;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\r' && *p != '\t')
        p++;
    return p;
}

/* The value of the first member named key (written without escapes) of the object at p, or NULL. */
static const char *json_member(const char *p, const char *end, const char *key)
{
    p = json_ws(p, end);
    if (!p || p >= end || *p != '{')
        return NULL;
    p++;
    size_t klen = strlen(key);
    for (;;) {
        p = json_ws(p, end);
        if (p >= end || *p != '"')
            return NULL;
        const char *k = p + 1;
        const char *after = json_skip(p, end);
        if (!after)
            return NULL;
        bool same = (size_t)(after - 1 - k) == klen && memcmp(k, key, klen) == 0;
        p = json_ws(after, end);
        if (p >= end || *p != ':')
            return NULL;
        p = json_ws(p + 1, end);
        if (same)
            return p;
        p = json_skip(p, end);
        if (!p)
            return NULL;
        p = json_ws(p, end);
        if (p >= end || *p != ',')
            return NULL;
        p++;
    }
}

/* Reads the n scores of model.vocab ([[piece, score], ...]) from the text as serde_json does. False when
 * the text cannot be followed (a key written with escapes, say): then cJSON's values stay. */
static bool serde_scores(const loader *ld, double *scores, int32_t n)
{
    double pow10[309];
    for (int i = 0; i <= 308; i++) {
        char t[16];
        snprintf(t, sizeof(t), "1e%d", i);
        pow10[i] = strtod(t, NULL);
    }
    const char *end = ld->json + ld->len;
    const char *p = json_member(ld->json, end, "model");
    p = p ? json_member(p, end, "vocab") : NULL;
    if (!p || *p != '[')
        return false;
    double *tmp = malloc(((size_t)n + 1) * sizeof(double));
    if (!tmp)
        return false;
    p++;
    int32_t i = 0;
    bool ok = true;
    while (ok) {
        p = json_ws(p, end);
        if (p < end && *p == ']')
            break;
        if (i >= n || p >= end || *p != '[') {
            ok = false;
            break;
        }
        p = json_skip(p + 1, end); /* the piece */
        p = p ? json_ws(p, end) : NULL;
        if (!p || p >= end || *p != ',') {
            ok = false;
            break;
        }
        p = json_ws(p + 1, end);
        const char *num = p;
        p = json_skip(p, end);
        double v;
        /* the same number as cJSON read, within a few units in the last place */
        ok = p && serde_number(num, p, pow10, &v) && isfinite(v) &&
             fabs(v - scores[i]) <= 4 * fabs(nextafter(scores[i], INFINITY) - scores[i]);
        if (!ok)
            break;
        tmp[i++] = v;
        p = json_ws(p, end);
        if (p >= end || *p != ']') {
            ok = false;
            break;
        }
        p = json_ws(p + 1, end);
        if (p < end && *p == ',')
            p++;
    }
    if (ok && i == n)
        memcpy(scores, tmp, (size_t)n * sizeof(double));
    free(tmp);
    return ok && i == n;
}

/* model.type "Unigram": vocab [[piece, score], ...] (the id is the index), unk_id, byte_fallback. */
static int load_unigram(loader *ld, const cJSON *model)
{
    zt__hf *hf = ld->hf;
    static const char *const keys[] = {"type", "unk_id", "vocab", "byte_fallback", NULL};
    int rc;
    hf->model = ZT__MODEL_UNIGRAM;
    if ((rc = check_keys(ld, model, "model", keys)) != 0 ||
        (rc = get_bool(ld, model, "model", "byte_fallback", &hf->byte_fallback)) != 0)
        return rc;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsArray(vocab))
        return bad_field(ld, "model.vocab", "an array of [piece, score]");
    int n = cJSON_GetArraySize(vocab);
    if (n > ZT__HF_MAX_ID)
        return zt_fail(ld->err, ZT_EUNSUPPORTED, "%s: model.vocab has %d pieces, more than ztrain reads (%d)",
                       ld->where, n, ZT__HF_MAX_ID);
    hf->uni_pieces = calloc((size_t)n + 1, sizeof(zt__bytes));
    hf->uni_scores = calloc((size_t)n + 1, sizeof(double));
    if (!hf->uni_pieces || !hf->uni_scores)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory for the %d pieces of %s", n, ld->where);
    hf->uni_min_score = INFINITY;
    int i = 0;
    for (const cJSON *it = vocab->child; it; it = it->next, i++) {
        char p[PATH_LEN];
        index_path(p, "model.vocab", i);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !cJSON_IsString(it->child) ||
            !cJSON_IsNumber(it->child->next))
            return bad_field(ld, p, "[piece, score] (a string and a number)");
        const char *piece = it->child->valuestring;
        size_t len = strlen(piece);
        if (dup_bytes(&hf->uni_pieces[i], piece, len) != 0 || zt__strmap_put(&hf->vocab, piece, len, i) != 0)
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading the vocabulary of %s", ld->where);
        hf->uni_scores[i] = it->child->next->valuedouble;
        if (len > hf->max_token_len)
            hf->max_token_len = len;
        for (size_t k = 1; k < len; k++) /* the proper prefixes that end on a character boundary */
            if (((unsigned char)piece[k] & 0xC0) != 0x80 && zt__strmap_put(&hf->uni_prefixes, piece, k, 0) != 0)
                return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading the vocabulary of %s", ld->where);
        hf->nuni = i + 1;
    }
    serde_scores(ld, hf->uni_scores, hf->nuni);
    for (i = 0; i < hf->nuni; i++)
        if (hf->uni_scores[i] < hf->uni_min_score)
            hf->uni_min_score = hf->uni_scores[i];
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    if (unk && !cJSON_IsNull(unk)) {
        int64_t v = 0;
        if ((rc = get_int(ld, model, "model", "unk_id", INT32_MAX, &v)) != 0)
            return rc;
        if (v >= hf->nuni)
            return zt_fail(ld->err, ZT_EFORMAT, "%s: model.unk_id is %lld, but model.vocab has %d pieces; the file is "
                           "not a valid tokenizer.json", ld->where, (long long)v, (int)hf->nuni);
        hf->unk_id = (int32_t)v;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        hf->byte_ids[b] = zt__strmap_get(&hf->vocab, name, 6);
    }
    return 0;
}

static int load_model(loader *ld, const cJSON *model)
{
    zt__hf *hf = ld->hf;
    if (!cJSON_IsObject(model))
        return bad_field(ld, "model", "an object (the tokenizer's model)");
    const char *type;
    if (!cJSON_GetObjectItemCaseSensitive(model, "type")) {
        /* files of older library versions leave the type out: merges make a BPE, a vocabulary alone WordPiece
         * (the order in which the library tries them) */
        type = cJSON_GetObjectItemCaseSensitive(model, "merges") ? "BPE" : "WordPiece";
    } else if (!(type = component_type(ld, model, "model"))) {
        return ZT_EFORMAT;
    }
    int rc;
    bool present;
    hf->unk_id = -1;
    for (int i = 0; i < 256; i++)
        hf->byte_ids[i] = -1;
    if (strcmp(type, "BPE") == 0) {
        static const char *const keys[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                           "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                           "vocab", "merges", NULL};
        hf->model = ZT__MODEL_BPE;
        if ((rc = check_keys(ld, model, "model", keys)) != 0)
            return rc;
        const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
        if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
            return unsupported(ld, "model.dropout", dropout,
                               "BPE dropout is random and only meant for training the tokenizer; set it to null");
        if ((rc = get_string(ld, model, "model", "unk_token", &hf->unk_token, &present)) != 0 ||
            (rc = get_string(ld, model, "model", "continuing_subword_prefix", &hf->subword_prefix, NULL)) != 0 ||
            (rc = get_string(ld, model, "model", "end_of_word_suffix", &hf->word_suffix, NULL)) != 0 ||
            (rc = get_bool(ld, model, "model", "fuse_unk", &hf->fuse_unk)) != 0 ||
            (rc = get_bool(ld, model, "model", "byte_fallback", &hf->byte_fallback)) != 0 ||
            (rc = get_bool(ld, model, "model", "ignore_merges", &hf->ignore_merges)) != 0 ||
            (rc = load_vocab(ld, model)) != 0 || (rc = load_merges(ld, model)) != 0)
            return rc;
        if (present) {
            hf->unk_id = zt__strmap_get(&hf->vocab, hf->unk_token.p, hf->unk_token.len);
            if (hf->unk_id < 0)
                return zt_fail(ld->err, ZT_EFORMAT, "%s: model.unk_token '%s' is not in model.vocab; add it to the "
                               "vocabulary or set unk_token to null",
                               ld->where, hf->unk_token.p);
        }
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof(name), "<0x%02X>", b);
            hf->byte_ids[b] = zt__strmap_get(&hf->vocab, name, 6);
        }
        return 0;
    }
    if (strcmp(type, "Unigram") == 0)
        return load_unigram(ld, model);
    if (strcmp(type, "WordPiece") == 0) {
        static const char *const keys[] = {"type", "unk_token", "continuing_subword_prefix",
                                           "max_input_chars_per_word", "vocab", NULL};
        int64_t max_chars = 100;
        hf->model = ZT__MODEL_WORDPIECE;
        if ((rc = check_keys(ld, model, "model", keys)) != 0 ||
            (rc = get_string(ld, model, "model", "unk_token", &hf->unk_token, &present)) != 0 ||
            (rc = get_string(ld, model, "model", "continuing_subword_prefix", &hf->subword_prefix, NULL)) != 0 ||
            (rc = get_int(ld, model, "model", "max_input_chars_per_word", INT32_MAX, &max_chars)) != 0 ||
            (rc = load_vocab(ld, model)) != 0)
            return rc;
        if (!present && dup_bytes(&hf->unk_token, "[UNK]", 5) != 0)
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
        if (!cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) {
            free(hf->subword_prefix.p);
            if (dup_bytes(&hf->subword_prefix, "##", 2) != 0)
                return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
        }
        hf->max_input_chars_per_word = (int)max_chars;
        hf->unk_id = zt__strmap_get(&hf->vocab, hf->unk_token.p, hf->unk_token.len);
        if (hf->unk_id < 0)
            return zt_fail(ld->err, ZT_EFORMAT, "%s: model.unk_token '%s' is not in model.vocab; a WordPiece model "
                           "needs its unknown token in the vocabulary",
                           ld->where, hf->unk_token.p);
        return 0;
    }
    return unsupported(ld, "model.type", cJSON_GetObjectItemCaseSensitive(model, "type"),
                       "ztrain implements the models BPE, WordPiece and Unigram");
}

/* ---- added tokens ---------------------------------------------------------------------------------- */

static int load_added(loader *ld, const cJSON *list)
{
    zt__hf *hf = ld->hf;
    if (!list || cJSON_IsNull(list))
        return 0;
    if (!cJSON_IsArray(list))
        return bad_field(ld, "added_tokens", "an array");
    int count = cJSON_GetArraySize(list);
    hf->added = calloc((size_t)count + 1, sizeof(*hf->added));
    if (!hf->added)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    zt__strmap by_content = {0};
    /* the library numbers new tokens from the model's vocabulary size (a Unigram's: its list, duplicates too) */
    int32_t next_id = hf->model == ZT__MODEL_UNIGRAM ? hf->nuni : (int32_t)hf->vocab.n;
    int rc = 0, i = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        static const char *const keys[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized",
                                           "special", NULL};
        char p[PATH_LEN];
        index_path(p, "added_tokens", i);
        if (!cJSON_IsObject(it)) {
            rc = bad_field(ld, p, "an object");
            break;
        }
        zt__added a = {0};
        bool single_word = false;
        int64_t file_id = 0;
        a.normalized = true;
        if ((rc = check_keys(ld, it, p, keys)) != 0 || (rc = need_string(ld, it, p, "content", &a.content)) != 0 ||
            (rc = get_bool(ld, it, p, "single_word", &single_word)) != 0 ||
            (rc = get_bool(ld, it, p, "lstrip", &a.lstrip)) != 0 ||
            (rc = get_bool(ld, it, p, "rstrip", &a.rstrip)) != 0 ||
            (rc = get_bool(ld, it, p, "special", &a.special)) != 0 ||
            (rc = get_int(ld, it, p, "id", INT32_MAX - 1, &file_id)) != 0) {
            free(a.content.p);
            break;
        }
        /* normalized defaults to !special in the library's AddedToken::from, but a file always says it */
        if ((rc = get_bool(ld, it, p, "normalized", &a.normalized)) != 0) {
            free(a.content.p);
            break;
        }
        if (single_word) {
            char q[PATH_LEN];
            child_path(q, p, "single_word");
            rc = unsupported(ld, q, cJSON_GetObjectItemCaseSensitive(it, "single_word"),
                             "single-word added tokens need the \\w class of Rust's regex; set it to false");
            free(a.content.p);
            break;
        }
        if (a.content.len == 0) { /* ignored by the library */
            free(a.content.p);
            continue;
        }
        int32_t prev = zt__strmap_get(&by_content, a.content.p, a.content.len);
        if (prev >= 0) { /* the same content again: its settings change, its id does not */
            a.id = hf->added[prev].id;
            free(hf->added[prev].content.p);
            free(hf->added[prev].pattern.p);
            hf->added[prev] = a;
        } else {
            int32_t id = zt__strmap_get(&hf->vocab, a.content.p, a.content.len);
            a.id = id >= 0 ? id : next_id++;
            if (zt__strmap_put(&by_content, a.content.p, a.content.len, hf->nadded) != 0) {
                free(a.content.p);
                rc = zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
                break;
            }
            hf->added[hf->nadded++] = a;
        }
        (void)file_id; /* like the library, ids follow the vocabulary, not the file's "id" field */
    }
    zt__strmap_free(&by_content);
    if (rc != 0)
        return rc;
    /* What each one matches: the content, or the content normalized. */
    for (int k = 0; k < hf->nadded; k++) {
        zt__added *a = &hf->added[k];
        if (a->normalized && hf->nnorms > 0) {
            if ((rc = zt__hf_normalize(hf, a->content.p, a->content.len, &a->pattern, ld->err)) != 0)
                return rc;
        } else if (dup_bytes(&a->pattern, a->content.p, a->content.len) != 0) {
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
        }
    }
    return 0;
}

/* Orders added tokens by first byte, then longest first, then as listed (qsort_r comparator). */
static int cmp_added(const void *x, const void *y, void *ctx)
{
    const zt__hf *hf = ctx;
    const zt__added *a = &hf->added[*(const int *)x], *b = &hf->added[*(const int *)y];
    unsigned char fa = a->pattern.len ? (unsigned char)a->pattern.p[0] : 0;
    unsigned char fb = b->pattern.len ? (unsigned char)b->pattern.p[0] : 0;
    if (fa != fb)
        return fa < fb ? -1 : 1;
    if (a->pattern.len != b->pattern.len)
        return a->pattern.len > b->pattern.len ? -1 : 1;
    return *(const int *)x - *(const int *)y;
}

static int build_added_set(zt__hf *hf, zt__added_set *set, bool normalized)
{
    set->order = malloc(((size_t)hf->nadded + 1) * sizeof(int));
    if (!set->order)
        return ZT_ENOMEM;
    set->count = 0;
    for (int k = 0; k < hf->nadded; k++)
        if (hf->added[k].normalized == normalized && hf->added[k].pattern.len > 0)
            set->order[set->count++] = k;
    qsort_r(set->order, (size_t)set->count, sizeof(int), cmp_added, hf);
    int k = 0;
    for (int b = 0; b < 256; b++) {
        set->start[b] = k;
        while (k < set->count && (unsigned char)hf->added[set->order[k]].pattern.p[0] == b)
            k++;
    }
    set->start[256] = k;
    return 0;
}

/* ---- post-processor -------------------------------------------------------------------------------- */

static int push_ids(loader *ld, int32_t **ids, int *n, const int32_t *add, int nadd)
{
    void *p = realloc(*ids, (size_t)(*n + nadd + 1) * sizeof(int32_t));
    if (!p)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    *ids = p;
    if (nadd > 0)
        memcpy(*ids + *n, add, (size_t)nadd * sizeof(int32_t));
    *n += nadd;
    return 0;
}

/* ["[CLS]", 101] of BertProcessing / RobertaProcessing. */
static int token_pair(loader *ld, const cJSON *obj, const char *path, const char *key, int32_t *id)
{
    char p[PATH_LEN];
    child_path(p, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsString(v->child) ||
        !cJSON_IsNumber(v->child->next) || v->child->next->valuedouble < 0 ||
        v->child->next->valuedouble >= (double)INT32_MAX)
        return bad_field(ld, p, "[\"token\", id]");
    *id = (int32_t)v->child->next->valuedouble;
    return 0;
}

/* Wraps the current prefix and suffix in those of one more processor (applied after the earlier ones). */
static int wrap_ids(loader *ld, const int32_t *pre, int npre, const int32_t *suf, int nsuf)
{
    zt__hf *hf = ld->hf;
    int32_t *np = NULL;
    int nn = 0;
    if (push_ids(ld, &np, &nn, pre, npre) != 0 || push_ids(ld, &np, &nn, hf->prefix_ids, hf->nprefix) != 0) {
        free(np);
        return ZT_ENOMEM;
    }
    free(hf->prefix_ids);
    hf->prefix_ids = np;
    hf->nprefix = nn;
    return push_ids(ld, &hf->suffix_ids, &hf->nsuffix, suf, nsuf);
}

/* Appends one piece to hf's pair layout; ids (seq 0) are copied. */
static int push_pair_piece(loader *ld, int seq, int32_t type_id, const int32_t *ids, int nids)
{
    zt__hf *hf = ld->hf;
    void *p = realloc(hf->pair, (size_t)(hf->npair + 1) * sizeof *hf->pair);
    if (!p)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    hf->pair = p;
    struct zt__pair_piece *pc = &hf->pair[hf->npair++];
    memset(pc, 0, sizeof *pc);
    pc->seq = seq;
    pc->type_id = type_id;
    return nids > 0 ? push_ids(ld, &pc->ids, &pc->nids, ids, nids) : 0;
}

/* A post-processor that defines the pair layout: the second one makes pairs unsupported (a Sequence of
 * two such processors nests templates, which no published tokenizer does). */
static void begin_pair_layout(loader *ld)
{
    zt__hf *hf = ld->hf;
    for (int i = 0; i < hf->npair; i++)
        free(hf->pair[i].ids);
    hf->npair = 0;
    hf->pair_processors++;
}

/* The ids of a template's special token `name` (its entry in special_tokens). */
static const cJSON *template_special(loader *ld, const cJSON *specials, const char *q, const char *name)
{
    const cJSON *def = specials ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
    const cJSON *ids = def ? cJSON_GetObjectItemCaseSensitive(def, "ids") : NULL;
    if (!cJSON_IsArray(ids)) {
        zt_fail(ld->err, ZT_EFORMAT, "%s: %s uses the special token '%s', which post_processor.special_tokens "
                "does not define with its ids; the file is not a valid tokenizer.json", ld->where, q, name);
        return NULL;
    }
    return ids;
}

/* TemplateProcessing's "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A",
 * "type_id": 0}}, ...] with A and B once each. A template ztrain cannot use leaves the tokenizer loadable
 * (hf->pair_problem says why pairs are refused); only ZT_ENOMEM fails. */
static int load_pair_template(loader *ld, const cJSON *obj)
{
    zt__hf *hf = ld->hf;
    const cJSON *pair = cJSON_GetObjectItemCaseSensitive(obj, "pair");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(obj, "special_tokens");
    if (!pair || cJSON_IsNull(pair))
        return 0; /* no pair layout: pairs take the default */
    begin_pair_layout(ld);
    if (!cJSON_IsArray(pair)) {
        hf->pair_problem = "post_processor.pair is not an array of template pieces";
        return 0;
    }
    int seen[3] = {0, 0, 0}, rc = 0;
    for (const cJSON *it = pair->child; it && rc == 0; it = it->next) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *body = seq ? seq : sp;
        const cJSON *id = body ? cJSON_GetObjectItemCaseSensitive(body, "id") : NULL;
        const cJSON *type = body ? cJSON_GetObjectItemCaseSensitive(body, "type_id") : NULL;
        if (!cJSON_IsString(id) || (type && (!cJSON_IsNumber(type) || type->valuedouble < 0 ||
                                             type->valuedouble > 255))) {
            hf->pair_problem = "post_processor.pair holds a piece that is not {\"Sequence\": {\"id\", \"type_id\"}} "
                               "or {\"SpecialToken\": {\"id\", \"type_id\"}}";
            return 0;
        }
        const int32_t type_id = type ? (int32_t)type->valuedouble : 0;
        if (seq) {
            int which = strcmp(id->valuestring, "A") == 0 ? 1 : strcmp(id->valuestring, "B") == 0 ? 2 : 0;
            if (which == 0 || seen[which]++)
                break;
            rc = push_pair_piece(ld, which, type_id, NULL, 0);
            continue;
        }
        const cJSON *def = specials ? cJSON_GetObjectItemCaseSensitive(specials, id->valuestring) : NULL;
        const cJSON *ids = def ? cJSON_GetObjectItemCaseSensitive(def, "ids") : NULL;
        if (!cJSON_IsArray(ids)) {
            hf->pair_problem = "post_processor.pair uses a special token that post_processor.special_tokens does not "
                               "define";
            return 0;
        }
        int32_t *v = NULL;
        int nv = 0;
        for (const cJSON *x = ids->child; x && rc == 0; x = x->next) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= (double)INT32_MAX) {
                free(v);
                hf->pair_problem = "post_processor.special_tokens holds an id that is not an integer from 0";
                return 0;
            }
            int32_t one = (int32_t)x->valuedouble;
            rc = push_ids(ld, &v, &nv, &one, 1);
        }
        if (rc == 0)
            rc = push_pair_piece(ld, 0, type_id, v, nv);
        free(v);
    }
    if (rc == 0 && (seen[1] != 1 || seen[2] != 1))
        hf->pair_problem = "post_processor.pair does not hold the sequences A and B once each";
    return rc;
}

/* BertProcessing's pair: [CLS] A [SEP] B [SEP], B and its [SEP] of type 1; RobertaProcessing's:
 * <s> A </s> </s> B </s>, every type 0 (as the tokenizers library gives them). */
static int bert_pair_layout(loader *ld, bool roberta, int32_t cls, int32_t sep)
{
    begin_pair_layout(ld);
    const int32_t tb = roberta ? 0 : 1;
    int rc = push_pair_piece(ld, 0, 0, &cls, 1);
    if (rc == 0)
        rc = push_pair_piece(ld, 1, 0, NULL, 0);
    if (rc == 0)
        rc = push_pair_piece(ld, 0, 0, &sep, 1);
    if (rc == 0 && roberta)
        rc = push_pair_piece(ld, 0, 0, &sep, 1);
    if (rc == 0)
        rc = push_pair_piece(ld, 2, tb, NULL, 0);
    if (rc == 0)
        rc = push_pair_piece(ld, 0, tb, &sep, 1);
    return rc;
}

static int load_template(loader *ld, const cJSON *obj, const char *path)
{
    char p[PATH_LEN];
    child_path(p, path, "single");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(obj, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(obj, "special_tokens");
    if (!cJSON_IsArray(single))
        return bad_field(ld, p, "an array of template pieces");
    if (specials && !cJSON_IsObject(specials) && !cJSON_IsNull(specials))
        return bad_field(ld, "post_processor.special_tokens", "an object");
    int32_t *pre = NULL, *suf = NULL;
    int npre = 0, nsuf = 0, nseq = 0, rc = 0, i = 0;
    for (const cJSON *it = single->child; it && rc == 0; it = it->next, i++) {
        char q[PATH_LEN];
        index_path(q, p, i);
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (seq) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(seq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0 || nseq > 0) {
                rc = unsupported(ld, q, it, "a single-sequence template holds the sequence A once");
                break;
            }
            nseq++;
            continue;
        }
        const cJSON *name = sp ? cJSON_GetObjectItemCaseSensitive(sp, "id") : NULL;
        if (!cJSON_IsString(name)) {
            rc = bad_field(ld, q, "{\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
            break;
        }
        const cJSON *ids = template_special(ld, specials, q, name->valuestring);
        if (!ids) {
            rc = ZT_EFORMAT;
            break;
        }
        for (const cJSON *x = ids->child; x && rc == 0; x = x->next) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= (double)INT32_MAX) {
                rc = bad_field(ld, "post_processor.special_tokens", "token ids (integers from 0)");
                break;
            }
            int32_t v = (int32_t)x->valuedouble;
            rc = nseq ? push_ids(ld, &suf, &nsuf, &v, 1) : push_ids(ld, &pre, &npre, &v, 1);
        }
    }
    if (rc == 0 && nseq != 1)
        rc = unsupported(ld, p, single, "a single-sequence template holds the sequence A once");
    if (rc == 0)
        rc = wrap_ids(ld, pre, npre, suf, nsuf);
    free(pre);
    free(suf);
    return rc == 0 ? load_pair_template(ld, obj) : rc;
}

static int load_post(loader *ld, const cJSON *obj, const char *path, int depth)
{
    if (!obj || cJSON_IsNull(obj))
        return 0;
    const char *type = component_type(ld, obj, path);
    if (!type)
        return ZT_EFORMAT;
    int rc;
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "processors", NULL};
        char p[PATH_LEN];
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "processors");
        child_path(p, path, "processors");
        if (!cJSON_IsArray(list))
            return bad_field(ld, p, "an array of post-processors");
        if (depth > 16)
            return unsupported(ld, p, list, "Sequences nested more than 16 deep");
        int i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char q[PATH_LEN];
            index_path(q, p, i);
            if ((rc = load_post(ld, it, q, depth + 1)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        return check_keys(ld, obj, path, keys); /* offsets only */
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        static const char *const keys[] = {"type", "single", "pair", "special_tokens", NULL};
        if ((rc = check_keys(ld, obj, path, keys)) != 0)
            return rc;
        return load_template(ld, obj, path);
    }
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        static const char *const bert_keys[] = {"type", "sep", "cls", NULL};
        static const char *const roberta_keys[] = {"type", "sep", "cls", "trim_offsets", "add_prefix_space", NULL};
        int32_t cls, sep;
        if ((rc = check_keys(ld, obj, path, type[0] == 'B' ? bert_keys : roberta_keys)) != 0 ||
            (rc = token_pair(ld, obj, path, "cls", &cls)) != 0 || (rc = token_pair(ld, obj, path, "sep", &sep)) != 0)
            return rc;
        if ((rc = wrap_ids(ld, &cls, 1, &sep, 1)) != 0)
            return rc;
        return bert_pair_layout(ld, type[0] == 'R', cls, sep);
    }
    char p[PATH_LEN];
    child_path(p, path, "type");
    return unsupported(ld, p, cJSON_GetObjectItemCaseSensitive(obj, "type"),
                       "ztrain implements the post-processors TemplateProcessing, BertProcessing, "
                       "RobertaProcessing, ByteLevel and Sequence");
}

/* ---- the whole file -------------------------------------------------------------------------------- */

/* True when the words of a BPE may be cut before every "▁" that follows another character (LLaMA-2 style,
 * where the whole text is one word): a merge across such a cut makes a token in which "▁" follows another
 * character, so if no vocabulary entry has one (runs such as "▁▁" are fine), no merge crosses the cut. "▁"
 * must be a token of its own (else unknown characters on both sides could fuse into one unknown token), and
 * nothing may depend on where the word ends (end_of_word_suffix, continuing_subword_prefix, ignore_merges). */
static bool meta_boundaries_safe(const zt__hf *hf)
{
    static const char meta[] = "\xe2\x96\x81";
    if (hf->model != ZT__MODEL_BPE || hf->ignore_merges || hf->subword_prefix.len || hf->word_suffix.len ||
        zt__strmap_get(&hf->vocab, meta, 3) < 0)
        return false;
    for (size_t i = 0; i < hf->vocab.n; i++) {
        const char *t = hf->vocab.arena + hf->vocab.entries[i].off;
        size_t len = hf->vocab.entries[i].len;
        for (size_t at = 1; at + 3 <= len; at++)
            if (memcmp(t + at, meta, 3) == 0 && (at < 3 || memcmp(t + at - 3, meta, 3) != 0))
                return false;
    }
    return true;
}

static int build_id_tables(loader *ld)
{
    zt__hf *hf = ld->hf;
    int32_t max_id = -1;
    for (size_t i = 0; i < hf->vocab.n; i++)
        if (hf->vocab.entries[i].value > max_id)
            max_id = hf->vocab.entries[i].value;
    for (int k = 0; k < hf->nadded; k++)
        if (hf->added[k].id > max_id)
            max_id = hf->added[k].id;
    if (max_id < 0)
        return zt_fail(ld->err, ZT_EFORMAT, "%s: the vocabulary is empty; the file is not a usable tokenizer.json",
                       ld->where);
    if (max_id > ZT__HF_MAX_ID) /* the id tables below have an entry per id up to the largest */
        return zt_fail(ld->err, ZT_EUNSUPPORTED, "%s: token id %d is above the largest id ztrain reads (%d; the "
                       "largest published vocabularies have about 1 million ids); the file is not a usable "
                       "tokenizer.json", ld->where, (int)max_id, ZT__HF_MAX_ID);
    hf->vocab_size = max_id + 1;
    hf->tokens = calloc((size_t)hf->vocab_size, sizeof(zt__bytes));
    hf->pieces = calloc((size_t)hf->vocab_size, sizeof(zt__bytes));
    hf->is_special = calloc((size_t)hf->vocab_size, sizeof(bool));
    if (!hf->tokens || !hf->pieces || !hf->is_special)
        return zt_fail(ld->err, ZT_ENOMEM, "out of memory for the %d tokens of %s", (int)hf->vocab_size, ld->where);
    for (size_t i = 0; i < hf->vocab.n; i++) {
        const struct zt__strmap_entry *e = &hf->vocab.entries[i];
        zt__bytes *t = &hf->tokens[e->value];
        free(t->p); /* two strings with one id: the library keeps one of them too */
        if (dup_bytes(t, hf->vocab.arena + e->off, e->len) != 0)
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    }
    for (int32_t i = 0; i < hf->nuni; i++) /* a Unigram piece listed twice: the earlier id has it too */
        if (!hf->tokens[i].p && dup_bytes(&hf->tokens[i], hf->uni_pieces[i].p, hf->uni_pieces[i].len) != 0)
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
    for (int k = 0; k < hf->nadded; k++) {
        zt__bytes *t = &hf->tokens[hf->added[k].id];
        free(t->p);
        /* decoding uses the normalized form, so that the decoders undo the normalizer */
        if (dup_bytes(t, hf->added[k].pattern.p, hf->added[k].pattern.len) != 0)
            return zt_fail(ld->err, ZT_ENOMEM, "out of memory reading %s", ld->where);
        hf->is_special[hf->added[k].id] = hf->added[k].special;
    }
    for (int32_t id = 0; id < hf->vocab_size; id++) {
        if (!hf->tokens[id].p)
            continue;
        int rc = zt__hf_token_piece(hf, id, &hf->pieces[id], ld->err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void zt__hf_free(zt__hf *hf)
{
    if (!hf)
        return;
    zt__strmap_free(&hf->vocab);
    zt__strmap_free(&hf->uni_prefixes);
    if (hf->uni_pieces)
        for (int32_t i = 0; i < hf->nuni; i++)
            free(hf->uni_pieces[i].p);
    free(hf->uni_pieces);
    free(hf->uni_scores);
    free(hf->unk_token.p);
    free(hf->subword_prefix.p);
    free(hf->word_suffix.p);
    free(hf->merges);
    for (int i = 0; i < hf->nnorms; i++) {
        free(hf->norms[i].a.p);
        free(hf->norms[i].b.p);
        free(hf->norms[i].trie);
    }
    free(hf->norms);
    for (int i = 0; i < hf->npretoks; i++)
        free(hf->pretoks[i].a.p);
    free(hf->pretoks);
    for (int i = 0; i < hf->ndecoders; i++) {
        free(hf->decoders[i].a.p);
        free(hf->decoders[i].b.p);
    }
    free(hf->decoders);
    for (int i = 0; i < hf->nadded; i++) {
        free(hf->added[i].content.p);
        free(hf->added[i].pattern.p);
    }
    free(hf->added);
    free(hf->raw_set.order);
    free(hf->norm_set.order);
    free(hf->prefix_ids);
    free(hf->suffix_ids);
    for (int i = 0; i < hf->npair; i++)
        free(hf->pair[i].ids);
    free(hf->pair);
    if (hf->tokens)
        for (int32_t i = 0; i < hf->vocab_size; i++) {
            free(hf->tokens[i].p);
            free(hf->pieces[i].p);
        }
    free(hf->tokens);
    free(hf->pieces);
    free(hf->is_special);
    memset(hf, 0, sizeof(*hf));
}

int zt__hf_load(zt__hf *hf, const char *json, size_t len, const char *where, zt_err *err)
{
    loader ld = {.hf = hf, .where = where, .err = err, .json = json, .len = len};
    cJSON *root = NULL;
    int rc = zt_json_parse_object(json, where, &root, err);
    if (rc != 0)
        return rc;
    static const char *const keys[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    if ((rc = check_keys(&ld, root, "", keys)) != 0)
        goto done;
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (version && !(cJSON_IsString(version) && strcmp(version->valuestring, "1.0") == 0)) {
        rc = unsupported(&ld, "version", version, "the tokenizers library writes version \"1.0\"");
        goto done;
    }
    static const char *const off[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, off[i]);
        if (v && !cJSON_IsNull(v)) {
            rc = unsupported(&ld, off[i], v, "ztrain encodes whole texts; set %s to null", off[i]);
            goto done;
        }
    }
    if ((rc = load_model(&ld, cJSON_GetObjectItemCaseSensitive(root, "model"))) != 0)
        goto done;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if ((norm && (rc = load_normalizer(&ld, norm, "normalizer", 0)) != 0) ||
        (pre && (rc = load_pretok(&ld, pre, "pre_tokenizer", 0)) != 0) ||
        (dec && (rc = load_decoder(&ld, dec, "decoder", 0)) != 0) ||
        (rc = load_added(&ld, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) != 0)
        goto done;
    if (build_added_set(hf, &hf->raw_set, false) != 0 || build_added_set(hf, &hf->norm_set, true) != 0) {
        rc = zt_fail(err, ZT_ENOMEM, "out of memory reading %s", where);
        goto done;
    }
    if ((rc = load_post(&ld, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor", 0)) != 0 ||
        (rc = build_id_tables(&ld)) != 0)
        goto done;
    for (int i = 0; i < hf->nprefix + hf->nsuffix; i++) {
        int32_t id = i < hf->nprefix ? hf->prefix_ids[i] : hf->suffix_ids[i - hf->nprefix];
        if (id >= hf->vocab_size || !hf->tokens[id].p) {
            rc = zt_fail(err, ZT_EFORMAT, "%s: post_processor adds token id %d, which is not in the vocabulary; the "
                         "file is not a valid tokenizer.json",
                         where, (int)id);
            goto done;
        }
    }
    for (int k = 0; k < hf->npair; k++)
        for (int i = 0; i < hf->pair[k].nids; i++) {
            int32_t id = hf->pair[k].ids[i];
            if (id >= hf->vocab_size || !hf->tokens[id].p)
                hf->pair_problem = "post_processor's pair template adds a token id that is not in the vocabulary";
        }
    hf->split_at_meta = meta_boundaries_safe(hf);
    bool byte_level = false;
    for (int i = 0; i < hf->npretoks; i++)
        byte_level = byte_level || hf->pretoks[i].type == ZT__PRETOK_BYTE_LEVEL;
    snprintf(hf->kind, sizeof(hf->kind), "%s",
             hf->model == ZT__MODEL_WORDPIECE ? "wordpiece"
             : hf->model == ZT__MODEL_UNIGRAM ? "unigram"
             : byte_level                     ? "byte-level-bpe"
                                              : "bpe");
done:
    cJSON_Delete(root);
    return rc;
}
