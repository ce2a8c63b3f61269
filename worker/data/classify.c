/* Sequence-classification examples from JSONL; see classify.h. */
#include "worker/data/classify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/rng.h"

struct zt_classify_data {
    int B, T;
    size_t n;            /* examples */
    size_t truncated;
    int32_t *tokens;     /* [n, T] */
    int32_t *types;      /* [n, T] */
    int32_t *labels;     /* [n] */
    bool shuffle;
    uint64_t seed;
    uint64_t *order;     /* [n]: this epoch's order */
    uint64_t epoch, batch; /* the next batch */
};

/* This epoch's order of examples: file order, or a permutation drawn from (seed, epoch). */
static void make_order(zt_classify_data *d)
{
    for (size_t i = 0; i < d->n; i++)
        d->order[i] = i;
    if (d->shuffle) {
        zt_rng rng;
        zt_rng_seed(&rng, d->seed * 0x9E3779B97F4A7C15ULL + d->epoch + 1);
        zt_rng_shuffle_u64(&rng, d->order, d->n);
    }
}

/* The label of one example: an integer in range, or one of the names. */
static int read_label(const cJSON *v, const zt_classify_labels *labels, const char *where, size_t line,
                      int32_t *out, zt_err *err)
{
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (x != floor(x) || x < 0 || x >= labels->num_labels)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: \"label\" %g is not a class of this model (an integer "
                           "from 0 to %d, or a label name); fix the line or the model's num_labels", where, line, x,
                           labels->num_labels - 1);
        *out = (int32_t)x;
        return 0;
    }
    if (cJSON_IsString(v)) {
        for (int i = 0; labels->names && i < labels->num_labels; i++)
            if (labels->names[i] && strcmp(labels->names[i], v->valuestring) == 0) {
                *out = i;
                return 0;
            }
        char known[256] = "";
        size_t k = 0;
        for (int i = 0; labels->names && i < labels->num_labels && k + 1 < sizeof known; i++)
            if (labels->names[i] && labels->names[i][0])
                k += (size_t)snprintf(known + k, sizeof known - k, "%s'%s'", k ? ", " : "", labels->names[i]);
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: \"label\" '%s' is not a label of this model (%s%s); give the "
                       "class number, or name the labels in the model's config.json id2label", where, line,
                       v->valuestring, known[0] ? "its labels: " : "it names no labels", known);
    }
    return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: \"label\" is %s; every example needs \"label\": a class "
                   "number or a label name", where, line, v ? "neither a number nor a string" : "missing");
}

/* Adds one example (line `line`, an object) to d, growing its arrays. */
static int add_example(zt_classify_data *d, size_t *cap, const cJSON *obj, const zt_tokenizer *tok, int vocab,
                       int pad_id, const zt_classify_labels *labels, const char *where, size_t line, zt_err *err)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, "text");
    const cJSON *pair = cJSON_GetObjectItemCaseSensitive(obj, "text_pair");
    if (!cJSON_IsString(text))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: \"text\" is %s; every example needs \"text\": a string",
                       where, line, text ? "not a string" : "missing");
    if (pair && !cJSON_IsString(pair) && !cJSON_IsNull(pair))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: \"text_pair\" is not a string (give a string, or leave it "
                       "out for single texts)", where, line);
    const bool has_pair = pair && cJSON_IsString(pair);
    int32_t label = -1;
    int rc = read_label(cJSON_GetObjectItemCaseSensitive(obj, "label"), labels, where, line, &label, err);
    if (rc < 0)
        return rc;
    int32_t *ids = NULL, *types = NULL, *full = NULL, *ftypes = NULL;
    size_t n = 0, nfull = 0;
    zt_err terr;
    rc = zt_tokenizer_encode_pair(tok, text->valuestring, strlen(text->valuestring),
                                  has_pair ? pair->valuestring : NULL, has_pair ? strlen(pair->valuestring) : 0,
                                  (size_t)d->T, &ids, &types, &n, &terr);
    /* the untruncated length, to count the examples that were cut */
    if (rc == 0)
        rc = zt_tokenizer_encode_pair(tok, text->valuestring, strlen(text->valuestring),
                                      has_pair ? pair->valuestring : NULL, has_pair ? strlen(pair->valuestring) : 0, 0,
                                      &full, &ftypes, &nfull, &terr);
    free(full);
    free(ftypes);
    if (rc != 0) {
        free(ids);
        free(types);
        return zt_fail(err, rc, "%s:%zu: %s", where, line, terr.msg);
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            int32_t bad = ids[i];
            free(ids);
            free(types);
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s:%zu: the tokenizer gives token %d, which the model's "
                           "vocabulary (%d tokens) has no row for; use the model's own tokenizer.json",
                           where, line, (int)bad, vocab);
        }
    if (d->n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        d->tokens = zt_xrealloc(d->tokens, *cap * (size_t)d->T * sizeof(int32_t));
        d->types = zt_xrealloc(d->types, *cap * (size_t)d->T * sizeof(int32_t));
        d->labels = zt_xrealloc(d->labels, *cap * sizeof(int32_t));
    }
    int32_t *rt = d->tokens + d->n * (size_t)d->T, *ry = d->types + d->n * (size_t)d->T;
    for (int t = 0; t < d->T; t++) {
        rt[t] = (size_t)t < n ? ids[t] : pad_id;
        ry[t] = (size_t)t < n ? types[t] : 0;
    }
    d->labels[d->n++] = label;
    if (nfull > n)
        d->truncated++;
    free(ids);
    free(types);
    return 0;
}

int zt_classify_open(zt_classify_data **out, const char *path, const zt_tokenizer *tok, int vocab_size, int pad_id,
                     const zt_classify_labels *labels, int B, int T, bool shuffle, uint64_t seed, zt_err *err)
{
    *out = NULL;
    if (B < 1 || T < 1 || labels->num_labels < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "classification data needs a batch, a sequence length and classes "
                       "(B %d, T %d, %d labels)", B, T, labels->num_labels);
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc < 0)
        return rc;
    zt_classify_data *d = zt_xcalloc(1, sizeof *d);
    d->B = B;
    d->T = T;
    d->shuffle = shuffle;
    d->seed = seed;
    size_t cap = 0, line = 0;
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
            continue; /* blank */
        cJSON *obj = cJSON_ParseWithLength(start, n);
        if (!cJSON_IsObject(obj))
            rc = zt_fail(err, ZT_EFORMAT, "%s:%zu: not a JSON object; each line holds one example such as "
                         "{\"text\": \"...\", \"label\": 0}", path, line);
        else
            rc = add_example(d, &cap, obj, tok, vocab_size, pad_id, labels, path, line, err);
        cJSON_Delete(obj);
    }
    free(text);
    if (rc == 0 && d->n == 0)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: no examples; each line holds one such as {\"text\": \"...\", "
                     "\"label\": 0}", path);
    if (rc < 0) {
        zt_classify_close(d);
        return rc;
    }
    d->order = zt_xmalloc(d->n * sizeof(uint64_t));
    make_order(d);
    *out = d;
    return 0;
}

void zt_classify_close(zt_classify_data *d)
{
    if (!d)
        return;
    free(d->tokens);
    free(d->types);
    free(d->labels);
    free(d->order);
    free(d);
}

size_t zt_classify_examples(const zt_classify_data *d)
{
    return d->n;
}

size_t zt_classify_truncated(const zt_classify_data *d)
{
    return d->truncated;
}

uint64_t zt_classify_batches_per_epoch(const zt_classify_data *d)
{
    return (d->n + (size_t)d->B - 1) / (size_t)d->B;
}

void zt_classify_next(zt_classify_data *d, int32_t *tokens, int32_t *types, int32_t *targets)
{
    const size_t T = (size_t)d->T;
    for (int b = 0; b < d->B; b++) {
        const size_t k = (size_t)d->batch * (size_t)d->B + (size_t)b;
        const bool real = k < d->n;
        const size_t ex = d->order[real ? k : k % d->n]; /* the last batch is filled up from the start */
        memcpy(tokens + (size_t)b * T, d->tokens + ex * T, T * sizeof(int32_t));
        memcpy(types + (size_t)b * T, d->types + ex * T, T * sizeof(int32_t));
        for (size_t t = 0; t < T; t++)
            targets[(size_t)b * T + t] = -1;
        if (real)
            targets[(size_t)b * T] = d->labels[ex];
    }
    if (++d->batch == zt_classify_batches_per_epoch(d)) {
        d->batch = 0;
        d->epoch++;
        make_order(d);
    }
}

void zt_classify_reset(zt_classify_data *d)
{
    d->epoch = 0;
    d->batch = 0;
    make_order(d);
}

void zt_classify_get_position(const zt_classify_data *d, zt_data_position *pos)
{
    pos->epoch = d->epoch;
    pos->shard = 0;
    pos->window = d->batch;
}

int zt_classify_set_position(zt_classify_data *d, const zt_data_position *pos, zt_err *err)
{
    if (pos->shard != 0 || pos->window >= zt_classify_batches_per_epoch(d))
        return zt_fail(err, ZT_EINVAL_CONFIG, "the data position (epoch %llu, batch %llu) is not in this "
                       "classification data (%llu batches an epoch)", (unsigned long long)pos->epoch,
                       (unsigned long long)pos->window, (unsigned long long)zt_classify_batches_per_epoch(d));
    d->epoch = pos->epoch;
    d->batch = pos->window;
    make_order(d);
    return 0;
}
