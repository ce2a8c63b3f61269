/* Chat templates recognised by their markers and rendered natively; see chat_template.h. */
#include "worker/data/chat_template.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "worker/data/unicode.h"

enum family { F_CHATML, F_LLAMA2, F_LLAMA3, F_LLAMA31, F_MISTRAL, F_GEMMA, F_GEMMA3, F_PHI3 };

struct zt_chat_template {
    enum family family;
    char name[16];
    char *bos, *eos;
    char *default_system; /* chatml: used when the first message is not a system one; NULL: none */
    const char *end_of_turn;
    bool phi3_skip_empty_system; /* Phi-3.5 writes no system block for an empty system message */
};

static const char NAMES[] = "chatml, qwen2, qwen2.5, llama2, llama3, llama3.1, mistral, gemma, gemma3, phi3";

static const char QWEN2_SYSTEM[] = "You are a helpful assistant.";
static const char QWEN25_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
/* What Llama 3.1's template writes into its system header when it is given no date_string. */
static const char LLAMA31_DATE[] = "26 Jul 2024";

const char *zt_chat_template_names(void)
{
    return NAMES;
}

/* ---- a growing string with spans ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > b->cap)
            b->cap *= 2;
        b->p = zt_xrealloc(b->p, b->cap);
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* Python's str.isspace, which Jinja's trim filter and str.strip() use: White_Space plus the separators
 * U+001C to U+001F (bidirectional classes B and S). */
static bool py_space(uint32_t cp)
{
    return (cp >= 0x1C && cp <= 0x1F) || zt_unicode_is_white_space(cp);
}

/* Python's s.strip() on UTF-8 bytes: narrows [*s, *s + *n) to drop leading and trailing whitespace. */
static void py_strip(const char **s, size_t *n)
{
    const unsigned char *p = (const unsigned char *)*s;
    size_t a = 0, b = *n;
    while (a < b) {
        uint32_t cp;
        int k = zt_utf8_decode(p + a, b - a, &cp);
        if (k <= 0 || !py_space(cp))
            break;
        a += (size_t)k;
    }
    while (b > a) {
        size_t s0 = b - 1;
        while (s0 > a && (p[s0] & 0xC0) == 0x80)
            s0--;
        uint32_t cp;
        int k = zt_utf8_decode(p + s0, b - s0, &cp);
        if (k <= 0 || (size_t)k != b - s0 || !py_space(cp))
            break;
        b = s0;
    }
    *s += a;
    *n = b - a;
}

/* ---- making templates ---- */

static void set_tokens(zt_chat_template *t, const char *bos, const char *eos)
{
    const char *dbos = "<s>", *deos = "</s>";
    switch (t->family) {
    case F_LLAMA3:
    case F_LLAMA31:
        dbos = "<|begin_of_text|>";
        deos = "<|eot_id|>";
        break;
    case F_GEMMA:
    case F_GEMMA3:
        dbos = "<bos>";
        deos = "<eos>";
        break;
    case F_PHI3:
        deos = "<|endoftext|>";
        break;
    case F_CHATML:
        dbos = "";
        deos = "<|im_end|>";
        break;
    default:
        break;
    }
    t->bos = zt_xstrdup(bos ? bos : dbos);
    t->eos = zt_xstrdup(eos ? eos : deos);
    switch (t->family) {
    case F_CHATML: t->end_of_turn = "<|im_end|>"; break;
    case F_LLAMA3:
    case F_LLAMA31: t->end_of_turn = "<|eot_id|>"; break;
    case F_GEMMA:
    case F_GEMMA3: t->end_of_turn = "<end_of_turn>"; break;
    case F_PHI3: t->end_of_turn = "<|end|>"; break;
    default: t->end_of_turn = t->eos; break;
    }
}

static zt_chat_template *make(enum family f, const char *name, const char *bos, const char *eos)
{
    zt_chat_template *t = zt_xcalloc(1, sizeof *t);
    t->family = f;
    snprintf(t->name, sizeof t->name, "%s", name);
    set_tokens(t, bos, eos);
    return t;
}

int zt_chat_template_by_name(zt_chat_template **out, const char *name, const char *bos, const char *eos,
                             zt_err *err)
{
    *out = NULL;
    static const struct { const char *name; enum family f; const char *system; } known[] = {
        {"chatml", F_CHATML, NULL},     {"qwen2", F_CHATML, QWEN2_SYSTEM}, {"qwen2.5", F_CHATML, QWEN25_SYSTEM},
        {"llama2", F_LLAMA2, NULL},     {"llama3", F_LLAMA3, NULL},        {"llama3.1", F_LLAMA31, NULL},
        {"mistral", F_MISTRAL, NULL},   {"gemma", F_GEMMA, NULL},          {"gemma3", F_GEMMA3, NULL},
        {"phi3", F_PHI3, NULL},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i].name) == 0) {
            zt_chat_template *t = make(known[i].f, known[i].f == F_CHATML ? "chatml" : name, bos, eos);
            if (known[i].system)
                t->default_system = zt_xstrdup(known[i].system);
            *out = t;
            return 0;
        }
    return zt_fail(err, ZT_EINVAL_CONFIG, "unknown chat template '%s'; ztrain knows %s", name, NAMES);
}

/* Reads the Jinja string literal whose text starts at s (just after its opening quote q) up to the closing
 * quote, unescaping it into b. Returns the bytes read (closing quote included), or 0 when the literal has
 * an escape ztrain does not read or no end. */
static size_t read_literal(const char *s, char q, sbuf *b)
{
    size_t i = 0;
    for (; s[i] && s[i] != q; i++) {
        if (s[i] != '\\') {
            sb_add(b, s + i, 1);
            continue;
        }
        char c = s[++i];
        const char *r = c == 'n' ? "\n" : c == 't' ? "\t" : c == 'r' ? "\r" : c == '\\' ? "\\" : c == '\'' ? "'"
                                    : c == '"' ? "\"" : NULL;
        if (!r)
            return 0;
        sb_str(b, r);
    }
    return s[i] == q ? i + 1 : 0;
}

/* The default system prompt of a ChatML template: "<|im_start|>system\n TEXT <|im_end|>" written as one
 * string literal (Qwen2's and Qwen2.5's) or as text outside the template's tags (Qwen2-VL's), with TEXT not
 * empty; NULL when there is none. */
static char *chatml_default_system(const char *jinja)
{
    static const char head[] = "<|im_start|>system", end[] = "<|im_end|>";
    for (const char *p = jinja; (p = strstr(p, head)) != NULL; p++) {
        sbuf b = {0};
        if (p > jinja && (p[-1] == '\'' || p[-1] == '"')) {
            if (!read_literal(p, p[-1], &b)) {
                free(b.p);
                continue;
            }
        } else if (p - jinja >= 2 && p[-1] == '}' && (p[-2] == '}' || p[-2] == '%')) {
            const char *e = strstr(p, end); /* raw template text, up to the next tag */
            const char *tag = strchr(p, '{');
            if (!e || e < p || (tag && tag < e))
                continue;
            sb_add(&b, p, (size_t)(e - p) + strlen(end) + (e[strlen(end)] == '\n'));
        } else {
            continue;
        }
        const size_t hl = strlen(head) + 1, el = strlen(end);
        char *sys = NULL;
        if (b.len > hl + el && strncmp(b.p, head, hl - 1) == 0 && b.p[hl - 1] == '\n') {
            const char *e = strstr(b.p + hl, end);
            if (e && e > b.p + hl && strcmp(e, "<|im_end|>\n") == 0) {
                sys = zt_xmalloc((size_t)(e - b.p) - hl + 1);
                memcpy(sys, b.p + hl, (size_t)(e - b.p) - hl);
                sys[(size_t)(e - b.p) - hl] = '\0';
            }
        }
        free(b.p);
        if (sys)
            return sys;
    }
    return NULL;
}

static int unknown(const char *where, const char *why, zt_err *err)
{
    return zt_fail(err, ZT_EUNSUPPORTED, "%s: the chat_template is %s; ztrain renders these families: %s (name "
                   "one with --chat-template NAME if the model was trained with it)", where, why, NAMES);
}

int zt_chat_template_detect(zt_chat_template **out, const char *jinja, const char *bos, const char *eos,
                            const char *where, zt_err *err)
{
    *out = NULL;
    if (!where)
        where = "chat template";
    if (strlen(jinja) < 16) { /* a name, as llama.cpp accepts one in place of a template */
        zt_err e2;
        if (zt_chat_template_by_name(out, jinja, bos, eos, &e2) == 0)
            return 0;
    }
#define HAS(s) (strstr(jinja, (s)) != NULL)
    enum family f;
    if (HAS("<|im_start|>")) {
        if (HAS("<|im_sep|>"))
            return unknown(where, "Phi-4's (<|im_sep|>), which ztrain does not render", err);
        if (HAS("<think>"))
            return unknown(where, "a ChatML template with reasoning blocks (<think>, as Qwen3's), which ztrain "
                           "does not render", err);
        zt_chat_template *t = make(F_CHATML, "chatml", bos, eos);
        t->default_system = chatml_default_system(jinja);
        *out = t;
        return 0;
    } else if (HAS("[INST]")) {
        if (HAS("<<SYS>>") && HAS("content.strip()") && HAS("bos_token + '[INST] '"))
            f = F_LLAMA2;
        else if (HAS("[AVAILABLE_TOOLS]") && HAS("\"[INST] \" + system_message") && HAS("loop.last and system_message"))
            f = F_MISTRAL;
        else
            return unknown(where, "an [INST] template of a variant ztrain does not know (it knows LLaMA-2's "
                           "and Mistral-7B-Instruct-v0.3's)", err);
    } else if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) {
        f = HAS("Cutting Knowledge Date") ? F_LLAMA31 : F_LLAMA3;
    } else if (HAS("<start_of_turn>")) {
        f = HAS("first_user_prefix") ? F_GEMMA3 : F_GEMMA;
    } else if (HAS("<|assistant|>") && HAS("<|end|>") && HAS("<|user|>")) {
        f = F_PHI3;
    } else {
        return unknown(where, "not one ztrain recognises", err);
    }
    static const char *const fname[] = {"chatml", "llama2", "llama3", "llama3.1", "mistral", "gemma", "gemma3",
                                        "phi3"};
    zt_chat_template *t = make(f, fname[f], bos, eos);
    t->phi3_skip_empty_system = f == F_PHI3 && HAS("message['role'] == 'system' and message['content']");
#undef HAS
    *out = t;
    return 0;
}

/* A special token of tokenizer_config.json: a string, or an object with "content"; NULL when absent. */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int zt_chat_template_load(zt_chat_template **out, const char *config_path, const char *name, zt_err *err)
{
    *out = NULL;
    cJSON *cfg = NULL;
    int rc = zt_json_load_object(config_path, &cfg, err);
    if (rc < 0)
        return rc;
    const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
    if (name) {
        rc = zt_chat_template_by_name(out, name, bos, eos, err);
        cJSON_Delete(cfg);
        return rc;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *jinja = NULL;
    if (cJSON_IsString(ct)) {
        jinja = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(n) && strcmp(n->valuestring, "default") == 0 && cJSON_IsString(tx))
                jinja = tx->valuestring;
        }
    }
    if (!jinja)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s has no chat_template%s; name the model's format with "
                     "--chat-template NAME (%s)", config_path, ct ? " string (nor a \"default\" one in its list)" : "",
                     NAMES);
    else
        rc = zt_chat_template_detect(out, jinja, bos, eos, config_path, err);
    cJSON_Delete(cfg);
    return rc;
}

void zt_chat_template_destroy(zt_chat_template *t)
{
    if (!t)
        return;
    free(t->bos);
    free(t->eos);
    free(t->default_system);
    free(t);
}

const char *zt_chat_template_name(const zt_chat_template *t)
{
    return t->name;
}

const char *zt_chat_template_end_of_turn(const zt_chat_template *t)
{
    return t->end_of_turn;
}

/* ---- rendering ---- */

typedef struct render {
    sbuf b;
    zt_text_span *spans;
    int nspans, cap;
    size_t open; /* start of the trained span being written */
} render;

static void span_begin(render *r)
{
    r->open = r->b.len;
}

static void span_end(render *r)
{
    if (r->nspans == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 8;
        r->spans = zt_xrealloc(r->spans, (size_t)r->cap * sizeof *r->spans);
    }
    r->spans[r->nspans++] = (zt_text_span){r->open, r->b.len};
}

static const char *role_name(enum zt_chat_role role)
{
    return role == ZT_CHAT_SYSTEM ? "system" : role == ZT_CHAT_USER ? "user" : "assistant";
}

/* The check of the templates that want user, assistant, user, ... after an optional first system message
 * (first: the index of the first message after it). */
static int alternate(const zt_chat_template *t, const zt_chat_message *m, int n, int first, zt_err *err)
{
    for (int i = first; i < n; i++) {
        enum zt_chat_role want = (i - first) % 2 == 0 ? ZT_CHAT_USER : ZT_CHAT_ASSISTANT;
        if (m[i].role != want)
            return zt_fail(err, ZT_EINVAL_CONFIG, "message %d is a %s message where the %s template wants a %s one: "
                           "after an optional first system message, roles must alternate user / assistant",
                           i + 1, role_name(m[i].role), t->name, role_name(want));
    }
    return 0;
}

/* content, stripped as Python's str.strip() when strip is set */
static void add_content(render *r, const zt_chat_message *m, bool strip)
{
    const char *s = m->content;
    size_t n = m->len;
    if (strip)
        py_strip(&s, &n);
    sb_add(&r->b, s, n);
}

static int render_chatml(const zt_chat_template *t, const zt_chat_message *m, int n, render *r)
{
    if (t->default_system && m[0].role != ZT_CHAT_SYSTEM) {
        sb_str(&r->b, "<|im_start|>system\n");
        sb_str(&r->b, t->default_system);
        sb_str(&r->b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        sb_str(&r->b, "<|im_start|>");
        sb_str(&r->b, role_name(m[i].role));
        sb_str(&r->b, "\n");
        if (m[i].role == ZT_CHAT_ASSISTANT)
            span_begin(r);
        add_content(r, &m[i], false);
        sb_str(&r->b, "<|im_end|>");
        if (m[i].role == ZT_CHAT_ASSISTANT)
            span_end(r);
        sb_str(&r->b, "\n");
    }
    return 0;
}

static int render_llama2(const zt_chat_template *t, const zt_chat_message *m, int n, render *r, zt_err *err)
{
    const int first = m[0].role == ZT_CHAT_SYSTEM ? 1 : 0;
    int rc = alternate(t, m, n, first, err);
    if (rc < 0)
        return rc;
    for (int i = first; i < n; i++) {
        if (m[i].role == ZT_CHAT_USER) {
            sb_str(&r->b, t->bos);
            sb_str(&r->b, "[INST] ");
            if (i == first && first == 1) {
                /* content.strip() of '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + user: the system text is inside */
                sbuf c = {0};
                sb_str(&c, "<<SYS>>\n");
                sb_add(&c, m[0].content, m[0].len);
                sb_str(&c, "\n<</SYS>>\n\n");
                sb_add(&c, m[i].content, m[i].len);
                zt_chat_message whole = {ZT_CHAT_USER, c.p, c.len};
                add_content(r, &whole, true);
                free(c.p);
            } else {
                add_content(r, &m[i], true);
            }
            sb_str(&r->b, " [/INST]");
        } else {
            span_begin(r);
            sb_str(&r->b, " ");
            add_content(r, &m[i], true);
            sb_str(&r->b, " ");
            sb_str(&r->b, t->eos);
            span_end(r);
        }
    }
    return 0;
}

static void llama3_message(const zt_chat_template *t, const zt_chat_message *m, render *r)
{
    (void)t;
    sb_str(&r->b, "<|start_header_id|>");
    sb_str(&r->b, role_name(m->role));
    sb_str(&r->b, "<|end_header_id|>\n\n");
    if (m->role == ZT_CHAT_ASSISTANT)
        span_begin(r);
    add_content(r, m, true);
    sb_str(&r->b, "<|eot_id|>");
    if (m->role == ZT_CHAT_ASSISTANT)
        span_end(r);
}

static int render_llama3(const zt_chat_template *t, const zt_chat_message *m, int n, render *r)
{
    sb_str(&r->b, t->bos);
    int first = 0;
    if (t->family == F_LLAMA31) {
        sb_str(&r->b, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                      "Today Date: ");
        sb_str(&r->b, LLAMA31_DATE);
        sb_str(&r->b, "\n\n");
        if (m[0].role == ZT_CHAT_SYSTEM) {
            add_content(r, &m[0], true);
            first = 1;
        }
        sb_str(&r->b, "<|eot_id|>");
    }
    for (int i = first; i < n; i++)
        llama3_message(t, &m[i], r);
    return 0;
}

static int render_mistral(const zt_chat_template *t, const zt_chat_message *m, int n, render *r, zt_err *err)
{
    const int first = m[0].role == ZT_CHAT_SYSTEM ? 1 : 0;
    int rc = alternate(t, m, n, first, err);
    if (rc < 0)
        return rc;
    sb_str(&r->b, t->bos);
    for (int i = first; i < n; i++) {
        if (m[i].role == ZT_CHAT_USER) {
            sb_str(&r->b, "[INST] ");
            if (i == n - 1 && first == 1) {
                sb_add(&r->b, m[0].content, m[0].len);
                sb_str(&r->b, "\n\n");
            }
            add_content(r, &m[i], false);
            sb_str(&r->b, "[/INST]");
        } else {
            span_begin(r);
            sb_str(&r->b, " ");
            add_content(r, &m[i], true);
            sb_str(&r->b, t->eos);
            span_end(r);
        }
    }
    return 0;
}

static int render_gemma(const zt_chat_template *t, const zt_chat_message *m, int n, render *r, zt_err *err)
{
    const int first = m[0].role == ZT_CHAT_SYSTEM ? 1 : 0;
    if (first && t->family == F_GEMMA)
        return zt_fail(err, ZT_EINVAL_CONFIG, "message 1 is a system message, which the gemma template has no role "
                       "for (its template raises 'System role not supported'); fold it into the first user "
                       "message, or use gemma3 if the model is Gemma 3");
    int rc = alternate(t, m, n, first, err);
    if (rc < 0)
        return rc;
    sb_str(&r->b, t->bos);
    for (int i = first; i < n; i++) {
        const bool asst = m[i].role == ZT_CHAT_ASSISTANT;
        sb_str(&r->b, "<start_of_turn>");
        sb_str(&r->b, asst ? "model" : role_name(m[i].role));
        sb_str(&r->b, "\n");
        if (i == first && first == 1) {
            sb_add(&r->b, m[0].content, m[0].len);
            sb_str(&r->b, "\n\n");
        }
        if (asst)
            span_begin(r);
        add_content(r, &m[i], true);
        sb_str(&r->b, "<end_of_turn>");
        if (asst)
            span_end(r);
        sb_str(&r->b, "\n");
    }
    return 0;
}

static int render_phi3(const zt_chat_template *t, const zt_chat_message *m, int n, render *r)
{
    for (int i = 0; i < n; i++) {
        if (m[i].role == ZT_CHAT_SYSTEM && m[i].len == 0 && t->phi3_skip_empty_system)
            continue;
        sb_str(&r->b, "<|");
        sb_str(&r->b, role_name(m[i].role));
        sb_str(&r->b, "|>\n");
        if (m[i].role == ZT_CHAT_ASSISTANT)
            span_begin(r);
        add_content(r, &m[i], false);
        sb_str(&r->b, "<|end|>");
        if (m[i].role == ZT_CHAT_ASSISTANT)
            span_end(r);
        sb_str(&r->b, "\n");
    }
    return 0;
}

int zt_chat_template_render(const zt_chat_template *t, const zt_chat_message *msgs, int n,
                            bool add_generation_prompt, zt_chat_render *out, zt_err *err)
{
    memset(out, 0, sizeof *out);
    if (n < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "an empty conversation: give at least one message");
    for (int i = 1; i < n; i++)
        if (msgs[i].role == ZT_CHAT_SYSTEM && t->family != F_CHATML && t->family != F_PHI3 && t->family != F_LLAMA3 &&
            t->family != F_LLAMA31)
            return zt_fail(err, ZT_EINVAL_CONFIG, "message %d is a system message; the %s template takes one only "
                           "as the first message", i + 1, t->name);
    render r = {0};
    sb_add(&r.b, "", 0);
    int rc = 0;
    switch (t->family) {
    case F_CHATML: rc = render_chatml(t, msgs, n, &r); break;
    case F_LLAMA2: rc = render_llama2(t, msgs, n, &r, err); break;
    case F_LLAMA3:
    case F_LLAMA31: rc = render_llama3(t, msgs, n, &r); break;
    case F_MISTRAL: rc = render_mistral(t, msgs, n, &r, err); break;
    case F_GEMMA:
    case F_GEMMA3: rc = render_gemma(t, msgs, n, &r, err); break;
    case F_PHI3: rc = render_phi3(t, msgs, n, &r); break;
    }
    if (rc == 0) {
        switch (t->family) {
        case F_CHATML:
            if (add_generation_prompt)
                sb_str(&r.b, "<|im_start|>assistant\n");
            break;
        case F_LLAMA3:
        case F_LLAMA31:
            if (add_generation_prompt)
                sb_str(&r.b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            break;
        case F_GEMMA:
        case F_GEMMA3:
            if (add_generation_prompt)
                sb_str(&r.b, "<start_of_turn>model\n");
            break;
        case F_PHI3:
            sb_str(&r.b, add_generation_prompt ? "<|assistant|>\n" : t->eos);
            break;
        default: /* LLaMA-2 and Mistral end a prompt with [/INST] */
            break;
        }
    }
    if (rc < 0) {
        free(r.b.p);
        free(r.spans);
        return rc;
    }
    out->text = r.b.p;
    out->len = r.b.len;
    out->spans = r.spans;
    out->nspans = r.nspans;
    return 0;
}

void zt_chat_render_free(zt_chat_render *r)
{
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

/* ---- conversations from JSON, the template's file ---- */

int zt_chat_messages_from_json(const cJSON *msgs, const char *where, zt_chat_message **out, int *n, zt_err *err)
{
    *out = NULL;
    *n = 0;
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: \"messages\" is %s; a chat record holds \"messages\": "
                       "[{\"role\": \"user\", \"content\": \"...\"}, {\"role\": \"assistant\", ...}]", where,
                       cJSON_IsArray(msgs) ? "empty" : msgs ? "not an array" : "missing");
    const int nm = cJSON_GetArraySize(msgs);
    zt_chat_message *m = calloc((size_t)nm, sizeof *m);
    if (!m)
        return zt_fail(err, ZT_ENOMEM, "%s: out of memory for %d messages", where, nm);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsObject(e) || !cJSON_IsString(role)) {
            free(m);
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: message %d has no \"role\" string; each message is "
                           "{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": \"...\"}", where, i + 1);
        }
        const char *rs = role->valuestring;
        if (strcmp(rs, "system") == 0)
            m[i].role = ZT_CHAT_SYSTEM;
        else if (strcmp(rs, "user") == 0)
            m[i].role = ZT_CHAT_USER;
        else if (strcmp(rs, "assistant") == 0)
            m[i].role = ZT_CHAT_ASSISTANT;
        else {
            int rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: message %d has the unknown role '%s'; roles are system, "
                             "user and assistant (rename it, e.g. 'human' to user and 'gpt' or 'bot' to assistant)",
                             where, i + 1, rs);
            free(m);
            return rc;
        }
        if (!cJSON_IsString(content)) {
            int rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: message %d (%s) has %s \"content\"; give its text as a "
                             "string", where, i + 1, rs, content ? "a non-string" : "no");
            free(m);
            return rc;
        }
        m[i].content = content->valuestring;
        m[i].len = strlen(content->valuestring);
        i++;
    }
    *out = m;
    *n = nm;
    return 0;
}

bool zt_chat_template_config_beside(const char *tokenizer, char *buf, size_t cap)
{
    const char *slash = strrchr(tokenizer, '/');
    const int dir = slash ? (int)(slash - tokenizer) : 0;
    int n = slash ? snprintf(buf, cap, "%.*s/tokenizer_config.json", dir, tokenizer)
                  : snprintf(buf, cap, "tokenizer_config.json");
    return n > 0 && (size_t)n < cap && access(buf, R_OK) == 0;
}
