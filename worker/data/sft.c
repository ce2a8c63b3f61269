/* Supervised fine-tuning data from JSONL, its cache, and packed or padded batches; see sft.h. */
#include "worker/data/sft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/rng.h"

struct zt_sft_data {
    enum zt_sft_format format;
    size_t n;             /* examples */
    uint64_t *off;        /* [n + 1] into ids / trained */
    uint64_t *soff;       /* [n + 1] into src */
    uint64_t *line;       /* [n] */
    int32_t *ids;
    uint8_t *trained;
    int32_t *src;
    size_t cap_n, cap_tok, cap_src;
    size_t dropped;
    bool from_cache;
    char path[512];
};

static const char *format_name(enum zt_sft_format f)
{
    switch (f) {
    case ZT_SFT_PROMPT_COMPLETION: return "prompt/completion";
    case ZT_SFT_ALPACA: return "alpaca (instruction/input/output)";
    case ZT_SFT_CHAT: return "chat (messages)";
    case ZT_SFT_SEQ2SEQ: return "input/target";
    }
    return "?";
}

/* ---- masked tokenization ---- */

/* The index of the first token of ids (the whole text's) that does not come from text[0, b): the length of
 * the common prefix of ids and the ids of that prefix (special tokens the flags add before a text, such as
 * bos, come from every prefix, the empty one too). */
static int boundary(const zt_tokenizer *tok, const char *text, size_t len, unsigned flags, size_t b,
                    const int32_t *ids, size_t n, size_t *k, zt_err *err)
{
    if (b >= len && len > 0) {
        *k = n;
        return 0;
    }
    int32_t *p = NULL;
    size_t np = 0;
    int rc = zt_tokenizer_encode_flags(tok, text, b, flags, &p, &np, err);
    if (rc < 0)
        return rc;
    size_t i = 0;
    while (i < np && i < n && p[i] == ids[i])
        i++;
    free(p);
    *k = i;
    return 0;
}

int zt_sft_encode_spans(const zt_tokenizer *tok, const char *text, size_t len, unsigned flags,
                        const zt_text_span *spans, int nspans, int32_t **ids, uint8_t **trained, size_t *n,
                        zt_err *err)
{
    *ids = NULL;
    *trained = NULL;
    *n = 0;
    int32_t *t = NULL;
    size_t nt = 0;
    int rc = zt_tokenizer_encode_flags(tok, text, len, flags, &t, &nt, err);
    if (rc < 0)
        return rc;
    uint8_t *m = zt_xcalloc(nt ? nt : 1, 1);
    size_t last = 0;
    for (int s = 0; s < nspans; s++) {
        size_t kb, ke;
        if ((rc = boundary(tok, text, len, flags, spans[s].begin, t, nt, &kb, err)) < 0 ||
            (rc = boundary(tok, text, len, flags, spans[s].end, t, nt, &ke, err)) < 0) {
            free(t);
            free(m);
            return rc;
        }
        if (kb < last)
            kb = last;
        if (ke < kb)
            ke = kb;
        for (size_t i = kb; i < ke; i++)
            m[i] = 1;
        last = ke;
    }
    *ids = t;
    *trained = m;
    *n = nt;
    return 0;
}

int zt_sft_encode_chat(const zt_tokenizer *tok, const zt_chat_template *tmpl, const zt_chat_message *msgs, int n,
                       bool add_generation_prompt, int32_t **ids, uint8_t **trained, size_t *ntok, zt_err *err)
{
    zt_chat_render r;
    int rc = zt_chat_template_render(tmpl, msgs, n, add_generation_prompt, &r, err);
    if (rc < 0)
        return rc;
    rc = zt_sft_encode_spans(tok, r.text, r.len, 0, r.spans, r.nspans, ids, trained, ntok, err);
    zt_chat_render_free(&r);
    return rc;
}

/* ---- reading records ---- */

static void push_example(zt_sft_data *d, const int32_t *ids, const uint8_t *tr, size_t n, const int32_t *src,
                         size_t nsrc, size_t line)
{
    if (d->n + 1 >= d->cap_n) {
        d->cap_n = d->cap_n ? 2 * d->cap_n : 1024;
        d->off = zt_xrealloc(d->off, (d->cap_n + 1) * sizeof *d->off);
        d->soff = zt_xrealloc(d->soff, (d->cap_n + 1) * sizeof *d->soff);
        d->line = zt_xrealloc(d->line, d->cap_n * sizeof *d->line);
    }
    if (d->n == 0)
        d->off[0] = d->soff[0] = 0;
    const size_t at = d->off[d->n], sat = d->soff[d->n];
    if (at + n > d->cap_tok) {
        while (at + n > d->cap_tok)
            d->cap_tok = d->cap_tok ? 2 * d->cap_tok : 65536;
        d->ids = zt_xrealloc(d->ids, d->cap_tok * sizeof *d->ids);
        d->trained = zt_xrealloc(d->trained, d->cap_tok);
    }
    if (sat + nsrc > d->cap_src) {
        while (sat + nsrc > d->cap_src)
            d->cap_src = d->cap_src ? 2 * d->cap_src : 65536;
        d->src = zt_xrealloc(d->src, d->cap_src * sizeof *d->src);
    }
    memcpy(d->ids + at, ids, n * sizeof *ids);
    memcpy(d->trained + at, tr, n);
    if (nsrc)
        memcpy(d->src + sat, src, nsrc * sizeof *src);
    d->line[d->n] = line;
    d->n++;
    d->off[d->n] = at + n;
    d->soff[d->n] = sat + nsrc;
}

/* The format a record's fields say, or 0. */
static enum zt_sft_format record_format(const cJSON *o)
{
    if (cJSON_GetObjectItemCaseSensitive(o, "messages"))
        return ZT_SFT_CHAT;
    if (cJSON_GetObjectItemCaseSensitive(o, "instruction"))
        return ZT_SFT_ALPACA;
    if (cJSON_GetObjectItemCaseSensitive(o, "prompt") || cJSON_GetObjectItemCaseSensitive(o, "completion"))
        return ZT_SFT_PROMPT_COMPLETION;
    if (cJSON_GetObjectItemCaseSensitive(o, "input") || cJSON_GetObjectItemCaseSensitive(o, "target"))
        return ZT_SFT_SEQ2SEQ;
    return 0;
}

/* A string field: 0 and *s, or an error naming it. optional: absent or null gives *s NULL. */
static int get_str(const cJSON *o, const char *key, bool optional, const char **s, size_t *len, const char *where,
                   size_t line, const char *needs, zt_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *s = NULL;
    *len = 0;
    if (optional && (!v || cJSON_IsNull(v)))
        return 0;
    if (!cJSON_IsString(v))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: \"%s\" is %s; %s", where, line, key,
                       v ? "not a string" : "missing", needs);
    *s = v->valuestring;
    *len = strlen(v->valuestring);
    return 0;
}

typedef struct reader {
    zt_sft_data *d;
    const zt_tokenizer *tok;
    const zt_sft_options *opt;
    int32_t eos_id; /* -1: none */
    const char *where;
    size_t dropped_lines[5];
} reader;

static int check_vocab(const reader *r, const int32_t *ids, size_t n, size_t line, zt_err *err)
{
    if (r->opt->vocab_size <= 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= r->opt->vocab_size)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: the tokenizer gives token %d, which the model's "
                           "vocabulary (%d tokens) has no row for; use the model's own tokenizer.json", r->where,
                           line, (int)ids[i], r->opt->vocab_size);
    return 0;
}

/* Adds an example unless no token of it is trained (then it is counted as dropped). */
static int keep(reader *r, int32_t *ids, uint8_t *tr, size_t n, const int32_t *src, size_t nsrc, size_t line,
                zt_err *err)
{
    int rc = check_vocab(r, ids, n, line, err);
    if (rc == 0)
        rc = check_vocab(r, src, nsrc, line, err);
    if (rc < 0)
        return rc;
    size_t k = 0;
    for (size_t i = 1; i < n; i++) /* the first token is never predicted */
        k += tr[i];
    if (k == 0) {
        if (r->d->dropped < sizeof r->dropped_lines / sizeof r->dropped_lines[0])
            r->dropped_lines[r->d->dropped] = line;
        r->d->dropped++;
        return 0;
    }
    push_example(r->d, ids, tr, n, src, nsrc, line);
    return 0;
}

/* Text prompt + completion (as written), special tokens around it and eos after, trained from the end of
 * the prompt. */
static int add_text_pair(reader *r, const char *prompt, size_t plen, const char *comp, size_t clen, size_t line,
                         zt_err *err)
{
    char *text = zt_xmalloc(plen + clen + 1);
    memcpy(text, prompt, plen);
    memcpy(text + plen, comp, clen);
    text[plen + clen] = '\0';
    zt_text_span span = {r->opt->train_on_prompt ? 0 : plen, plen + clen};
    int32_t *ids = NULL;
    uint8_t *tr = NULL;
    size_t n = 0;
    zt_err e2;
    int rc = zt_sft_encode_spans(r->tok, text, plen + clen, ZT_TOKENIZE_ADD_SPECIAL, &span, 1, &ids, &tr, &n, &e2);
    free(text);
    if (rc < 0)
        return zt_fail(err, rc, "%s:%zu: %s", r->where, line, e2.msg);
    if (r->eos_id >= 0) {
        ids = zt_xrealloc(ids, (n + 1) * sizeof *ids);
        tr = zt_xrealloc(tr, n + 1);
        ids[n] = r->eos_id;
        tr[n] = 1;
        n++;
    }
    rc = keep(r, ids, tr, n, NULL, 0, line, err);
    free(ids);
    free(tr);
    return rc;
}

static int add_chat(reader *r, const zt_chat_message *m, int nm, size_t line, zt_err *err)
{
    if (!r->opt->chat_template)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: a chat record, and no chat template to render it with: give "
                       "the model's tokenizer_config.json (its chat_template) or name one with --chat-template "
                       "NAME (%s)", r->where, line, zt_chat_template_names());
    zt_chat_render rd;
    zt_err e2;
    int rc = zt_chat_template_render(r->opt->chat_template, m, nm, false, &rd, &e2);
    if (rc < 0)
        return zt_fail(err, rc, "%s:%zu: %s", r->where, line, e2.msg);
    zt_text_span all = {0, rd.len};
    int32_t *ids = NULL;
    uint8_t *tr = NULL;
    size_t n = 0;
    rc = zt_sft_encode_spans(r->tok, rd.text, rd.len, 0, r->opt->train_on_prompt ? &all : rd.spans,
                             r->opt->train_on_prompt ? 1 : rd.nspans, &ids, &tr, &n, &e2);
    zt_chat_render_free(&rd);
    if (rc < 0)
        return zt_fail(err, rc, "%s:%zu: %s", r->where, line, e2.msg);
    rc = keep(r, ids, tr, n, NULL, 0, line, err);
    free(ids);
    free(tr);
    return rc;
}

static int read_chat(reader *r, const cJSON *o, size_t line, zt_err *err)
{
    char where[4200];
    snprintf(where, sizeof where, "%s:%zu", r->where, line);
    zt_chat_message *m;
    int nm;
    int rc = zt_chat_messages_from_json(cJSON_GetObjectItemCaseSensitive(o, "messages"), where, &m, &nm, err);
    if (rc < 0)
        return rc;
    int assistants = 0;
    for (int i = 0; i < nm; i++)
        assistants += m[i].role == ZT_CHAT_ASSISTANT;
    if (assistants == 0)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: the chat has no assistant message, so nothing in it would be "
                     "trained; add the assistant's answer, or remove the line", where);
    if (rc == 0)
        rc = add_chat(r, m, nm, line, err);
    free(m);
    return rc;
}

static const char ALPACA_WITH_INPUT[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n%s\n\n### Input:\n%s\n\n"
    "### Response:\n";
static const char ALPACA_NO_INPUT[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\n%s\n\n### Response:\n";

static int read_alpaca(reader *r, const cJSON *o, size_t line, zt_err *err)
{
    static const char needs[] = "an alpaca record needs \"instruction\" and \"output\" strings (\"input\" and "
                                "\"system\" are optional)";
    const char *ins, *in, *out, *sys;
    size_t lins, lin, lout, lsys;
    int rc;
    if ((rc = get_str(o, "instruction", false, &ins, &lins, r->where, line, needs, err)) < 0 ||
        (rc = get_str(o, "input", true, &in, &lin, r->where, line, needs, err)) < 0 ||
        (rc = get_str(o, "output", false, &out, &lout, r->where, line, needs, err)) < 0 ||
        (rc = get_str(o, "system", true, &sys, &lsys, r->where, line, needs, err)) < 0)
        return rc;
    if (r->opt->chat_template) {
        char *user = zt_xmalloc(lins + 2 + lin + 1);
        memcpy(user, ins, lins);
        size_t lu = lins;
        if (lin) {
            memcpy(user + lu, "\n\n", 2);
            memcpy(user + lu + 2, in, lin);
            lu += 2 + lin;
        }
        zt_chat_message m[3];
        int nm = 0;
        if (sys)
            m[nm++] = (zt_chat_message){ZT_CHAT_SYSTEM, sys, lsys};
        m[nm++] = (zt_chat_message){ZT_CHAT_USER, user, lu};
        m[nm++] = (zt_chat_message){ZT_CHAT_ASSISTANT, out, lout};
        rc = add_chat(r, m, nm, line, err);
        free(user);
        return rc;
    }
    if (sys)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: a \"system\" prompt needs a chat template (the Alpaca prompt "
                       "has no place for one): give the model's tokenizer_config.json or --chat-template NAME, or "
                       "drop the field", r->where, line);
    const size_t cap = sizeof ALPACA_WITH_INPUT + lins + lin;
    char *prompt = zt_xmalloc(cap);
    int pl = lin ? snprintf(prompt, cap, ALPACA_WITH_INPUT, ins, in) : snprintf(prompt, cap, ALPACA_NO_INPUT, ins);
    rc = add_text_pair(r, prompt, (size_t)pl, out, lout, line, err);
    free(prompt);
    return rc;
}

static int read_prompt_completion(reader *r, const cJSON *o, size_t line, zt_err *err)
{
    static const char needs[] = "a prompt/completion record needs \"prompt\" and \"completion\" strings";
    const char *p, *c;
    size_t lp, lc;
    int rc;
    if ((rc = get_str(o, "prompt", false, &p, &lp, r->where, line, needs, err)) < 0 ||
        (rc = get_str(o, "completion", false, &c, &lc, r->where, line, needs, err)) < 0)
        return rc;
    return add_text_pair(r, p, lp, c, lc, line, err);
}

static int read_seq2seq(reader *r, const cJSON *o, size_t line, zt_err *err)
{
    static const char needs[] = "an input/target record (sequence to sequence, as T5 is trained) needs \"input\" "
                                "and \"target\" strings";
    const char *in, *tg;
    size_t lin, ltg;
    int rc;
    if ((rc = get_str(o, "input", false, &in, &lin, r->where, line, needs, err)) < 0 ||
        (rc = get_str(o, "target", false, &tg, &ltg, r->where, line, needs, err)) < 0)
        return rc;
    int32_t *src = NULL, *ids = NULL;
    size_t ns = 0, n = 0;
    zt_err e2;
    rc = zt_tokenizer_encode_flags(r->tok, in, lin, ZT_TOKENIZE_ADD_SPECIAL, &src, &ns, &e2);
    if (rc == 0)
        rc = zt_tokenizer_encode_flags(r->tok, tg, ltg, ZT_TOKENIZE_ADD_SPECIAL, &ids, &n, &e2);
    if (rc < 0) {
        free(src);
        free(ids);
        return zt_fail(err, rc, "%s:%zu: %s", r->where, line, e2.msg);
    }
    /* the decoder predicts every target token, the first included (from its start token) */
    uint8_t *tr = zt_xmalloc(n ? n : 1);
    memset(tr, 1, n);
    rc = check_vocab(r, src, ns, line, err);
    if (rc == 0)
        rc = check_vocab(r, ids, n, line, err);
    if (rc == 0 && n == 0) {
        if (r->d->dropped < 5)
            r->dropped_lines[r->d->dropped] = line;
        r->d->dropped++;
    } else if (rc == 0) {
        push_example(r->d, ids, tr, n, src, ns, line);
    }
    free(src);
    free(ids);
    free(tr);
    return rc;
}

static int read_records(reader *r, const char *text, size_t len, zt_err *err)
{
    size_t line = 0, first_line = 0;
    int rc = 0;
    for (size_t pos = 0; pos < len && rc == 0;) {
        const char *start = text + pos;
        const char *nl = memchr(start, '\n', len - pos);
        const size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + 1;
        line++;
        size_t k = 0;
        while (k < n && (start[k] == ' ' || start[k] == '\t' || start[k] == '\r'))
            k++;
        if (k == n)
            continue;
        cJSON *o = cJSON_ParseWithLength(start, n);
        if (!cJSON_IsObject(o)) {
            rc = zt_fail(err, ZT_EFORMAT, "%s:%zu: %s; each line holds one JSON object such as {\"prompt\": \"...\", "
                         "\"completion\": \"...\"} or {\"messages\": [...]} (check quotes, escapes and braces)",
                         r->where, line, o ? "not a JSON object" : "not valid JSON");
            cJSON_Delete(o);
            break;
        }
        enum zt_sft_format f = record_format(o);
        if (f == 0) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: a record of no format ztrain reads; give \"prompt\" and "
                         "\"completion\", \"instruction\" and \"output\" (alpaca), \"messages\" (chat), or \"input\" "
                         "and \"target\"", r->where, line);
        } else if (r->d->format == 0) {
            r->d->format = f;
            first_line = line;
        } else if (f != r->d->format) {
            rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: a %s record in a file whose first record (line %zu) is %s; "
                         "one file holds one format (split the file)", r->where, line, format_name(f), first_line,
                         format_name(r->d->format));
        }
        if (rc == 0) {
            switch (f) {
            case ZT_SFT_CHAT: rc = read_chat(r, o, line, err); break;
            case ZT_SFT_ALPACA: rc = read_alpaca(r, o, line, err); break;
            case ZT_SFT_PROMPT_COMPLETION: rc = read_prompt_completion(r, o, line, err); break;
            case ZT_SFT_SEQ2SEQ: rc = read_seq2seq(r, o, line, err); break;
            }
        }
        cJSON_Delete(o);
    }
    return rc;
}

/* ---- cache ---- */

#define CACHE_MAGIC "ZTSFT\0\0\1"

typedef struct fnv {
    uint64_t h;
} fnv;

static void fnv_add(fnv *f, const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = f->h;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    f->h = h;
}

static void fnv_str(fnv *f, const char *s)
{
    if (!s)
        s = "(none)";
    fnv_add(f, s, strlen(s) + 1);
}

/* The cache key of (data, tokenizer file, template, options). */
static int cache_key(const char *data, size_t len, const zt_sft_options *o, uint64_t *key, zt_err *err)
{
    fnv f = {0xcbf29ce484222325ULL};
    fnv_str(&f, "ztrain sft cache 1");
    fnv_add(&f, &len, sizeof len);
    fnv_add(&f, data, len);
    char *tk = NULL;
    size_t tl = 0;
    int rc = zt_read_file(o->tokenizer_path, &tk, &tl, err);
    if (rc < 0)
        return rc;
    fnv_add(&f, &tl, sizeof tl);
    fnv_add(&f, tk, tl);
    free(tk);
    if (o->chat_template) {
        /* the template's identity: its name and what it writes around a probe conversation */
        const zt_chat_message probe[] = {{ZT_CHAT_USER, "u", 1}, {ZT_CHAT_ASSISTANT, "a", 1}};
        zt_chat_render r;
        zt_err e2;
        fnv_str(&f, zt_chat_template_name(o->chat_template));
        if (zt_chat_template_render(o->chat_template, probe, 2, false, &r, &e2) == 0) {
            fnv_add(&f, r.text, r.len);
            zt_chat_render_free(&r);
        }
        const zt_chat_message probe_sys[] = {{ZT_CHAT_SYSTEM, "s", 1}, {ZT_CHAT_USER, "u", 1},
                                             {ZT_CHAT_ASSISTANT, "a", 1}};
        if (zt_chat_template_render(o->chat_template, probe_sys, 3, false, &r, &e2) == 0) {
            fnv_add(&f, r.text, r.len);
            zt_chat_render_free(&r);
        }
    } else {
        fnv_str(&f, NULL);
    }
    uint8_t flags = o->train_on_prompt;
    fnv_add(&f, &flags, 1);
    fnv_str(&f, o->eos_token);
    int32_t v = o->vocab_size;
    fnv_add(&f, &v, sizeof v);
    *key = f.h;
    return 0;
}

static void cache_path(const char *data_path, const char *dir, uint64_t key, char *out, size_t cap)
{
    if (dir) {
        const char *base = strrchr(data_path, '/');
        base = base ? base + 1 : data_path;
        snprintf(out, cap, "%s/%s.%016llx.sftcache", dir, base, (unsigned long long)key);
    } else {
        snprintf(out, cap, "%s.%016llx.sftcache", data_path, (unsigned long long)key);
    }
}

struct cache_header {
    char magic[8];
    uint64_t key;
    uint64_t n, ntok, nsrc, dropped;
    uint32_t format, pad;
};

static int cache_write(const zt_sft_data *d, const char *path, uint64_t key, zt_err *err)
{
    struct cache_header h = {.key = key, .n = d->n, .ntok = d->off[d->n], .nsrc = d->soff[d->n],
                             .dropped = d->dropped, .format = (uint32_t)d->format};
    memcpy(h.magic, CACHE_MAGIC, 8);
    const zt_file_part parts[] = {
        {&h, sizeof h},
        {d->off, (d->n + 1) * sizeof *d->off},
        {d->soff, (d->n + 1) * sizeof *d->soff},
        {d->line, d->n * sizeof *d->line},
        {d->ids, h.ntok * sizeof *d->ids},
        {d->trained, h.ntok},
        {d->src, h.nsrc * sizeof *d->src},
    };
    return zt_write_file_atomic_parts(path, parts, sizeof parts / sizeof parts[0], err);
}

/* Reads a cache file; 0 on a hit, 1 when there is none or it does not hold this key (or is damaged). */
static int cache_read(zt_sft_data *d, const char *path, uint64_t key)
{
    char *buf = NULL;
    size_t len = 0;
    zt_err e2;
    if (zt_read_file(path, &buf, &len, &e2) < 0)
        return 1;
    struct cache_header h;
    if (len < sizeof h) {
        free(buf);
        return 1;
    }
    memcpy(&h, buf, sizeof h);
    const uint64_t want = sizeof h + (h.n + 1) * 16 + h.n * 8 + h.ntok * 5 + h.nsrc * 4;
    if (memcmp(h.magic, CACHE_MAGIC, 8) != 0 || h.key != key || h.n == 0 || h.n > len || h.ntok > len ||
        h.nsrc > len || want != len) {
        free(buf);
        return 1;
    }
    const char *p = buf + sizeof h;
    d->n = h.n;
    d->format = (enum zt_sft_format)h.format;
    d->dropped = h.dropped;
    d->off = zt_xmalloc((h.n + 1) * sizeof *d->off);
    memcpy(d->off, p, (h.n + 1) * 8);
    p += (h.n + 1) * 8;
    d->soff = zt_xmalloc((h.n + 1) * sizeof *d->soff);
    memcpy(d->soff, p, (h.n + 1) * 8);
    p += (h.n + 1) * 8;
    d->line = zt_xmalloc(h.n * sizeof *d->line);
    memcpy(d->line, p, h.n * 8);
    p += h.n * 8;
    d->ids = zt_xmalloc(h.ntok ? h.ntok * 4 : 1);
    memcpy(d->ids, p, h.ntok * 4);
    p += h.ntok * 4;
    d->trained = zt_xmalloc(h.ntok ? h.ntok : 1);
    memcpy(d->trained, p, h.ntok);
    p += h.ntok;
    d->src = zt_xmalloc(h.nsrc ? h.nsrc * 4 : 1);
    memcpy(d->src, p, h.nsrc * 4);
    free(buf);
    bool ok = d->off[0] == 0 && d->off[h.n] == h.ntok && d->soff[0] == 0 && d->soff[h.n] == h.nsrc;
    for (size_t i = 0; ok && i < h.n; i++)
        ok = d->off[i] <= d->off[i + 1] && d->soff[i] <= d->soff[i + 1];
    if (!ok) {
        free(d->off), free(d->soff), free(d->line), free(d->ids), free(d->trained), free(d->src);
        d->off = d->soff = d->line = NULL;
        d->ids = d->src = NULL;
        d->trained = NULL;
        d->n = 0;
        return 1;
    }
    return 0;
}

int zt_sft_open(zt_sft_data **out, const char *path, const zt_tokenizer *tok, const zt_sft_options *opt,
                zt_err *err)
{
    *out = NULL;
    zt_sft_options none = {0};
    if (!opt)
        opt = &none;
    reader r = {.tok = tok, .opt = opt, .eos_id = -1, .where = path};
    if (opt->eos_token) {
        r.eos_id = zt_tokenizer_find(tok, opt->eos_token);
        if (r.eos_id < 0)
            return zt_fail(err, ZT_EINVAL_CONFIG, "the eos token '%s' is not in the tokenizer's vocabulary; give the "
                           "model's own eos token (tokenizer_config.json's eos_token)", opt->eos_token);
    }
    if (opt->chat_template) {
        const char *eot = zt_chat_template_end_of_turn(opt->chat_template);
        if (zt_tokenizer_find(tok, eot) < 0)
            ZT_WARN("sft: the %s template ends each answer with '%s', which is not a token of this tokenizer: it is "
                    "trained as text, and generation will not stop at one token; check that the template and the "
                    "tokenizer belong to the same model", zt_chat_template_name(opt->chat_template), eot);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc < 0)
        return rc;
    zt_sft_data *d = zt_xcalloc(1, sizeof *d);
    snprintf(d->path, sizeof d->path, "%s", path);
    r.d = d;
    uint64_t key = 0;
    char cpath[1024] = "";
    if (opt->tokenizer_path) {
        rc = cache_key(text, len, opt, &key, err);
        if (rc < 0) {
            free(text);
            zt_sft_close(d);
            return rc;
        }
        cache_path(path, opt->cache_dir, key, cpath, sizeof cpath);
        if (cache_read(d, cpath, key) == 0)
            d->from_cache = true;
    }
    if (!d->from_cache)
        rc = read_records(&r, text, len, err);
    free(text);
    if (rc == 0 && d->n == 0)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: no examples to train on%s; each line holds one record such as "
                     "{\"prompt\": \"...\", \"completion\": \"...\"}", path,
                     d->dropped ? " (every record was dropped: none has a trained token)" : "");
    if (rc < 0) {
        zt_sft_close(d);
        return rc;
    }
    if (d->dropped && !d->from_cache) {
        char lines[96] = "";
        size_t k = 0;
        for (size_t i = 0; i < d->dropped && i < 5 && k + 1 < sizeof lines; i++)
            k += (size_t)snprintf(lines + k, sizeof lines - k, "%s%zu", i ? ", " : "", r.dropped_lines[i]);
        ZT_WARN("sft: %s: %zu records dropped: no token of theirs is trained (an empty answer without eos?); "
                "lines %s%s", path, d->dropped, lines, d->dropped > 5 ? ", ..." : "");
    } else if (d->dropped) {
        ZT_WARN("sft: %s: %zu records dropped: no token of theirs is trained", path, d->dropped);
    }
    if (cpath[0] && !d->from_cache) {
        zt_err e2;
        if (cache_write(d, cpath, key, &e2) < 0)
            ZT_WARN("sft: %s: not cached (%s); it will be tokenized again next time", path, e2.msg);
    }
    zt_sft_stats s;
    zt_sft_get_stats(d, &s);
    ZT_INFO("sft: %s: %s, %zu examples, %llu tokens, %llu trained, longest %zu, %zu dropped%s%s", path,
            format_name(s.format), s.examples, (unsigned long long)s.tokens, (unsigned long long)s.trained, s.longest,
            s.dropped, d->from_cache ? ", from cache " : "", d->from_cache ? cpath : "");
    *out = d;
    return 0;
}

void zt_sft_close(zt_sft_data *d)
{
    if (!d)
        return;
    free(d->off);
    free(d->soff);
    free(d->line);
    free(d->ids);
    free(d->trained);
    free(d->src);
    free(d);
}

void zt_sft_get_stats(const zt_sft_data *d, zt_sft_stats *s)
{
    memset(s, 0, sizeof *s);
    s->format = d->format;
    s->examples = d->n;
    s->dropped = d->dropped;
    s->from_cache = d->from_cache;
    s->tokens = d->n ? d->off[d->n] : 0;
    for (uint64_t i = 0; i < s->tokens; i++)
        s->trained += d->trained[i];
    for (size_t i = 0; i < d->n; i++)
        if (d->off[i + 1] - d->off[i] > s->longest)
            s->longest = (size_t)(d->off[i + 1] - d->off[i]);
}

size_t zt_sft_count(const zt_sft_data *d)
{
    return d->n;
}

void zt_sft_get(const zt_sft_data *d, size_t i, zt_sft_example *ex)
{
    ZT_ASSERT(i < d->n);
    ex->ids = d->ids + d->off[i];
    ex->trained = d->trained + d->off[i];
    ex->n = (size_t)(d->off[i + 1] - d->off[i]);
    ex->nsrc = (size_t)(d->soff[i + 1] - d->soff[i]);
    ex->src = ex->nsrc ? d->src + d->soff[i] : NULL;
    ex->line = (size_t)d->line[i];
}

/* ---- batches ---- */

#define OPEN_ROWS 64 /* rows first-fit packing keeps open */

struct zt_sft_loader {
    const zt_sft_data *d;
    zt_sft_batch_options o;
    size_t *ex;     /* [nex] the examples used (those that fit, or were truncated and keep a trained token) */
    size_t *len;    /* [nex] their lengths in a row (at most T) */
    size_t nex;
    size_t truncated, dropped;
    uint64_t epoch, batch;
    /* this epoch's rows: row r holds items[row_start[r] .. row_start[r + 1]) (indices into ex) */
    size_t *items;
    size_t *row_start;
    size_t nrows;
    uint64_t tokens;
};

/* The rows of this epoch. */
static void plan_epoch(zt_sft_loader *l)
{
    const size_t n = l->nex, T = (size_t)l->o.T;
    uint64_t *order = zt_xmalloc((n ? n : 1) * sizeof *order);
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    if (l->o.shuffle) {
        zt_rng rng;
        zt_rng_seed(&rng, l->o.seed * 0x9E3779B97F4A7C15ULL + l->epoch + 1);
        zt_rng_shuffle_u64(&rng, order, n);
    }
    free(l->items);
    free(l->row_start);
    l->items = zt_xmalloc((n ? n : 1) * sizeof *l->items);
    l->row_start = zt_xmalloc((n + 1) * sizeof *l->row_start);
    l->tokens = 0;
    if (!l->o.packed) {
        for (size_t i = 0; i < n; i++) {
            l->items[i] = order[i];
            l->row_start[i] = i;
            l->tokens += l->len[order[i]];
        }
        l->row_start[n] = n;
        l->nrows = n;
        free(order);
        return;
    }
    /* first fit among the last OPEN_ROWS rows; a row's items are kept in linked lists until the end */
    size_t *row_of = zt_xmalloc((n ? n : 1) * sizeof *row_of); /* item -> row */
    size_t *used = zt_xmalloc((n ? n : 1) * sizeof *used);     /* row -> tokens */
    size_t nrows = 0;
    for (size_t k = 0; k < n; k++) {
        const size_t e = order[k], L = l->len[e];
        size_t r = nrows;
        for (size_t c = nrows > OPEN_ROWS ? nrows - OPEN_ROWS : 0; c < nrows; c++)
            if (used[c] + L <= T) {
                r = c;
                break;
            }
        if (r == nrows)
            used[nrows++] = 0;
        used[r] += L;
        row_of[k] = r;
        l->tokens += L;
    }
    /* counting sort of the items by row, keeping the epoch's order inside a row */
    size_t *count = zt_xcalloc(nrows + 1, sizeof *count);
    for (size_t k = 0; k < n; k++)
        count[row_of[k] + 1]++;
    for (size_t r = 0; r < nrows; r++)
        count[r + 1] += count[r];
    for (size_t r = 0; r <= nrows; r++)
        l->row_start[r] = count[r];
    for (size_t k = 0; k < n; k++)
        l->items[count[row_of[k]]++] = order[k];
    l->nrows = nrows;
    free(count);
    free(used);
    free(row_of);
    free(order);
}

int zt_sft_loader_create(zt_sft_loader **out, const zt_sft_data *d, const zt_sft_batch_options *o, zt_err *err)
{
    *out = NULL;
    if (o->B < 1 || o->T < 2)
        return zt_fail(err, ZT_EINVAL_CONFIG, "supervised batches need B >= 1 rows and T >= 2 tokens (B %d, T %d)",
                       o->B, o->T);
    const bool s2s = d->format == ZT_SFT_SEQ2SEQ;
    if (s2s && (o->S < 1 || o->packed))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s holds input/target records, for encoder-decoder models: their "
                       "batches need an input length (S %d) and are not packed", d->path, o->S);
    if (!s2s && o->S > 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s holds %s records, for decoder-only models; an input length S "
                       "is only for input/target data", d->path, format_name(d->format));
    zt_sft_loader *l = zt_xcalloc(1, sizeof *l);
    l->d = d;
    l->o = *o;
    l->ex = zt_xmalloc((d->n ? d->n : 1) * sizeof *l->ex);
    l->len = zt_xmalloc((d->n ? d->n : 1) * sizeof *l->len);
    const size_t T = (size_t)o->T;
    size_t longer = 0, first_line = 0, first_len = 0, dropped_line = 0;
    for (size_t i = 0; i < d->n; i++) {
        zt_sft_example ex;
        zt_sft_get(d, i, &ex);
        size_t L = ex.n;
        if (L > T || (s2s && ex.nsrc > (size_t)o->S)) {
            if (longer++ == 0) {
                first_line = ex.line;
                first_len = L > T ? ex.n : ex.nsrc;
            }
            L = L > T ? T : L;
            size_t k = 0;
            for (size_t j = s2s ? 0 : 1; j < L; j++) /* a decoder predicts its first target from the start */
                k += ex.trained[j];
            if (k == 0) {
                if (l->dropped++ == 0)
                    dropped_line = ex.line;
                continue;
            }
        }
        l->ex[l->nex] = i;
        l->len[l->nex++] = L;
    }
    l->truncated = longer;
    if (longer && o->overlong == ZT_SFT_REFUSE) {
        zt_sft_loader_destroy(l);
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %zu examples are longer than the sequence length %d%s (the "
                       "first, line %zu, has %zu tokens); raise the sequence length, or let them be truncated",
                       d->path, longer, o->T, s2s ? " or their inputs than the input length" : "", first_line,
                       first_len);
    }
    if (longer)
        ZT_WARN("sft: %s: %zu examples truncated to %d tokens (the first: line %zu, %zu tokens)%s", d->path, longer,
                o->T, first_line, first_len, l->dropped ? "" : "");
    if (l->dropped)
        ZT_WARN("sft: %s: %zu truncated examples dropped: truncation cut away every trained token (the first: "
                "line %zu); raise the sequence length to train on them", d->path, l->dropped, dropped_line);
    if (l->nex == 0) {
        zt_sft_loader_destroy(l);
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: no example keeps a trained token within %d tokens; raise the "
                       "sequence length", d->path, o->T);
    }
    plan_epoch(l);
    ZT_INFO("sft: %s: %s batches of %d x %d, %llu rows, %.1f%% of their tokens used", d->path,
            o->packed ? "packed" : "padded", o->B, o->T, (unsigned long long)l->nrows,
            100.0 * (double)l->tokens / ((double)l->nrows * (double)o->T));
    *out = l;
    return 0;
}

void zt_sft_loader_destroy(zt_sft_loader *l)
{
    if (!l)
        return;
    free(l->ex);
    free(l->len);
    free(l->items);
    free(l->row_start);
    free(l);
}

size_t zt_sft_loader_truncated(const zt_sft_loader *l)
{
    return l->truncated;
}

size_t zt_sft_loader_dropped(const zt_sft_loader *l)
{
    return l->dropped;
}

uint64_t zt_sft_loader_batches_per_epoch(const zt_sft_loader *l)
{
    return (l->nrows + (size_t)l->o.B - 1) / (size_t)l->o.B;
}

uint64_t zt_sft_loader_rows(const zt_sft_loader *l)
{
    return l->nrows;
}

size_t zt_sft_loader_examples(const zt_sft_loader *l)
{
    return l->nex;
}

uint64_t zt_sft_loader_tokens(const zt_sft_loader *l)
{
    return l->tokens;
}

/* Moves to the next batch; returns the batch just served in *epoch, *batch. */
static void advance(zt_sft_loader *l, uint64_t *epoch, uint64_t *batch)
{
    *epoch = l->epoch;
    *batch = l->batch;
    if (++l->batch >= zt_sft_loader_batches_per_epoch(l)) {
        l->batch = 0;
        l->epoch++;
        plan_epoch(l);
    }
}

static int untrained(const zt_sft_loader *l, uint64_t epoch, uint64_t batch, zt_err *err)
{
    return zt_fail(err, ZT_ESTATE, "%s: batch %llu of epoch %llu has no trained token (every target is -1); "
                   "it was skipped, not trained on", l->d->path, (unsigned long long)batch, (unsigned long long)epoch);
}

int zt_sft_loader_next_seq2seq(zt_sft_loader *l, zt_sft_seq2seq_batch *b, zt_err *err)
{
    ZT_ASSERT(l->d->format == ZT_SFT_SEQ2SEQ);
    const size_t T = (size_t)l->o.T, S = (size_t)l->o.S;
    b->trained = 0;
    b->examples = 0;
    for (int row = 0; row < l->o.B; row++) {
        int32_t *src = b->src + (size_t)row * S, *din = b->dec_in + (size_t)row * T;
        int32_t *tgt = b->targets + (size_t)row * T;
        const size_t r = (size_t)l->batch * (size_t)l->o.B + (size_t)row;
        size_t ns = 0, nt = 0;
        zt_sft_example ex = {0};
        if (r < l->nrows) {
            zt_sft_get(l->d, l->ex[l->items[l->row_start[r]]], &ex);
            ns = ex.nsrc < S ? ex.nsrc : S;
            nt = l->len[l->items[l->row_start[r]]];
            b->examples++;
        }
        for (size_t j = 0; j < S; j++)
            src[j] = j < ns ? ex.src[j] : l->o.pad_id;
        for (size_t j = 0; j < T; j++) {
            din[j] = j == 0 ? l->o.decoder_start_id : j <= nt ? ex.ids[j - 1] : l->o.pad_id;
            tgt[j] = j < nt && ex.trained[j] ? ex.ids[j] : -1;
            b->trained += tgt[j] >= 0;
        }
        b->src_len[row] = (int32_t)ns;
    }
    uint64_t epoch, batch;
    advance(l, &epoch, &batch);
    return b->trained ? 0 : untrained(l, epoch, batch, err);
}

int zt_sft_loader_next(zt_sft_loader *l, zt_sft_batch *b, zt_err *err)
{
    ZT_ASSERT(l->d->format != ZT_SFT_SEQ2SEQ);
    const size_t T = (size_t)l->o.T;
    b->trained = 0;
    b->examples = 0;
    for (int row = 0; row < l->o.B; row++) {
        int32_t *tok = b->tokens + (size_t)row * T, *tgt = b->targets + (size_t)row * T;
        int32_t *pos = b->positions + (size_t)row * T, *cu = b->cu_seqlens + (size_t)row * (T + 1);
        const size_t r = (size_t)l->batch * (size_t)l->o.B + (size_t)row;
        size_t at = 0;
        int ns = 0;
        cu[0] = 0;
        if (r < l->nrows)
            for (size_t k = l->row_start[r]; k < l->row_start[r + 1]; k++) {
                const size_t e = l->items[k], L = l->len[e];
                zt_sft_example ex;
                zt_sft_get(l->d, l->ex[e], &ex);
                for (size_t j = 0; j < L; j++) {
                    tok[at + j] = ex.ids[j];
                    pos[at + j] = (int32_t)j;
                    const bool t = j + 1 < L && ex.trained[j + 1];
                    tgt[at + j] = t ? ex.ids[j + 1] : -1;
                    b->trained += t;
                }
                at += L;
                cu[++ns] = (int32_t)at;
                b->examples++;
            }
        ZT_ASSERT(at <= T);
        for (size_t j = at; j < T; j++) {
            tok[j] = l->o.pad_id;
            pos[j] = (int32_t)(j - at);
            tgt[j] = -1;
        }
        if (at < T)
            cu[++ns] = (int32_t)T;
        b->nseqs[row] = ns;
    }
    uint64_t epoch, batch;
    advance(l, &epoch, &batch);
    return b->trained ? 0 : untrained(l, epoch, batch, err);
}

void zt_sft_loader_reset(zt_sft_loader *l)
{
    l->epoch = 0;
    l->batch = 0;
    plan_epoch(l);
}

void zt_sft_loader_get_position(const zt_sft_loader *l, zt_data_position *pos)
{
    pos->epoch = l->epoch;
    pos->shard = 0;
    pos->window = l->batch;
}

int zt_sft_loader_set_position(zt_sft_loader *l, const zt_data_position *pos, zt_err *err)
{
    const uint64_t e0 = l->epoch;
    l->epoch = pos->epoch;
    plan_epoch(l);
    if (pos->shard != 0 || pos->window >= zt_sft_loader_batches_per_epoch(l)) {
        l->epoch = e0;
        plan_epoch(l);
        return zt_fail(err, ZT_EINVAL_CONFIG, "the data position (epoch %llu, batch %llu) is not in this "
                       "supervised data (%llu batches in that epoch)", (unsigned long long)pos->epoch,
                       (unsigned long long)pos->window, (unsigned long long)zt_sft_loader_batches_per_epoch(l));
    }
    l->batch = pos->window;
    return 0;
}
