/* Sampling tokens from a GPT-2 model (see generate.h): a forward pass over the context for every new
 * token, then temperature / top-k sampling from the last position's logits. */
#include "worker/train/generate.h"

#include "worker/models/model.h" /* zt_model_seq2seq */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A logit with its token id, so that top-k can sort candidates and still know which token each is. */
typedef struct candidate {
    double logit;
    int token;
} candidate;

/* Larger logit first; equal logits in token order, so the choice never depends on qsort's details. */
static int compare_candidates(const void *pa, const void *pb)
{
    const candidate *a = pa;
    const candidate *b = pb;
    if (a->logit > b->logit)
        return -1;
    if (a->logit < b->logit)
        return 1;
    return (a->token > b->token) - (a->token < b->token);
}

int zt_generate_sample(const float *logits, int V, double temperature, int top_k, zt_rng *rng, zt_err *err)
{
    if (V <= 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "sampling needs at least one logit, got V = %d", V);
    if (!(temperature >= 0.0) || isinf(temperature))
        return zt_fail(err, ZT_EINVAL_CONFIG, "temperature must be a finite number >= 0, got %g", temperature);
    if (top_k < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "top-k must be >= 0 (0 keeps every token), got %d", top_k);

    /* NaN or +inf means the weights are broken; -inf is a legitimate "never this token". */
    int best = -1;
    for (int i = 0; i < V; i++) {
        float x = logits[i];
        if (isnan(x) || (isinf(x) && x > 0))
            return zt_fail(err, ZT_EFORMAT,
                           "the model produced a non-finite logit (token %d is %g); the weights are corrupt "
                           "or training diverged: use an earlier checkpoint",
                           i, (double)x);
        if (isinf(x))
            continue;
        if (best < 0 || x > logits[best])
            best = i;
    }
    if (best < 0)
        return zt_fail(err, ZT_EFORMAT, "every logit is -inf, so no token can be sampled; check the weights");
    if (temperature == 0.0)
        return best;

    candidate *c = malloc((size_t)V * sizeof(*c));
    if (!c)
        return zt_fail(err, ZT_ENOMEM, "out of memory for %d sampling candidates", V);
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (isinf(logits[i]))
            continue;
        c[n].logit = (double)logits[i] / temperature;
        c[n].token = i;
        n++;
    }
    if (top_k > 0 && top_k < n) {
        qsort(c, (size_t)n, sizeof(*c), compare_candidates);
        n = top_k;
    }

    double max = (double)logits[best] / temperature;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].logit = exp(c[i].logit - max);
        sum += c[i].logit;
    }
    /* sum >= 1 because the best token contributes exp(0); walking the cumulative sum in a fixed order
     * makes the draw a pure function of the uniform number. */
    double u = zt_rng_uniform(rng) * sum;
    int token = c[n - 1].token;
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += c[i].logit;
        if (u < acc) {
            token = c[i].token;
            break;
        }
    }
    free(c);
    return token;
}

/* A sequence-to-sequence model (T5): the prompt is the encoder's input; the decoder starts from the start token
 * and takes each drawn token as its next input, until the end-of-sequence token (not passed on) or max_new. */
static int generate_seq2seq(zt_family_model *model, const zt_family_shape *shape, const int32_t *prompt, int n_prompt,
                            int max_new, double temperature, int top_k, zt_rng *rng, zt_generate_token_fn on_token,
                            void *user, zt_err *err)
{
    const int V = shape->vocab;
    int32_t *dec = malloc(((size_t)max_new + 1) * sizeof *dec);
    if (!dec)
        return zt_fail(err, ZT_ENOMEM, "out of memory for a sequence of %d tokens", max_new + 1);
    dec[0] = shape->decoder_start_token_id;
    int rc = 0;
    for (int len = 1; len <= max_new; len++) {
        const zt_model_seq2seq s = {.decoder_tokens = dec, .Td = len, .encoder_lens = NULL};
        zt_family_model_set_seq2seq(model, &s);
        zt_family_model_forward(model, prompt, NULL, 1, n_prompt);
        const float *last = zt_family_model_logits(model) + (size_t)(len - 1) * (size_t)V;
        const int token = zt_generate_sample(last, V, temperature, top_k, rng, err);
        if (token < 0) {
            rc = token;
            break;
        }
        if (token == shape->eos_token_id)
            break;
        dec[len] = token;
        if (on_token) {
            const int cb = on_token(token, user);
            if (cb != 0) {
                rc = cb < 0 ? cb : 0;
                break;
            }
        }
    }
    free(dec);
    return rc;
}

int zt_generate(zt_family_model *model, const int32_t *prompt, int n_prompt, int max_new, double temperature, int top_k,
                uint64_t seed, zt_generate_token_fn on_token, void *user, zt_err *err)
{
    ZT_ASSERT(model != NULL);
    const zt_family_config *cfg = zt_family_model_config(model);
    const int V = zt_family_config_vocab(cfg);
    const size_t positions = (size_t)zt_family_config_positions(cfg);

    if (n_prompt < 1 || !prompt)
        return zt_fail(err, ZT_EINVAL_CONFIG, "generation needs a prompt of at least one token, got %d", n_prompt);
    if (max_new < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the number of new tokens must be >= 0, got %d", max_new);
    if (!(temperature >= 0.0) || isinf(temperature))
        return zt_fail(err, ZT_EINVAL_CONFIG, "temperature must be a finite number >= 0, got %g", temperature);
    if (top_k < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "top-k must be >= 0 (0 keeps every token), got %d", top_k);
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= V)
            return zt_fail(err, ZT_EMISMATCH,
                           "prompt token %d is %d, outside the model's vocabulary of %d tokens; use a model "
                           "whose vocab_size covers the tokenizer",
                           i, (int)prompt[i], V);
    }

    size_t total = (size_t)n_prompt + (size_t)max_new;
    int32_t *seq = malloc(total * sizeof(*seq));
    if (!seq)
        return zt_fail(err, ZT_ENOMEM, "out of memory for a sequence of %zu tokens", total);
    for (int i = 0; i < n_prompt; i++)
        seq[i] = prompt[i];

    zt_rng rng;
    zt_rng_seed(&rng, seed);
    int rc = 0;
    zt_family_shape shape;
    zt_family_config_shape(cfg, &shape);
    if (shape.task == ZT_TASK_SEQ2SEQ) {
        rc = generate_seq2seq(model, &shape, prompt, n_prompt, max_new, temperature, top_k, &rng, on_token, user, err);
        free(seq);
        return rc;
    }
    for (size_t len = (size_t)n_prompt; len < total; len++) {
        /* The context is the last n_positions tokens at most: older ones fall out of the window. */
        size_t ctx = len < positions ? len : positions;
        zt_family_model_forward(model, seq + (len - ctx), NULL, 1, (int)ctx);
        const float *last = zt_family_model_logits(model) + (ctx - 1) * (size_t)V;
        int token = zt_generate_sample(last, V, temperature, top_k, &rng, err);
        if (token < 0) {
            rc = token;
            break;
        }
        seq[len] = token;
        if (on_token) {
            int cb = on_token(token, user);
            if (cb < 0) {
                rc = cb;
                break;
            }
            if (cb > 0)
                break;
        }
    }
    free(seq);
    return rc;
}

/* ---- a stop string over generated text ---- */

int zt_stop_scan_push(zt_stop_scan *s, const char *bytes, size_t len, const char **out, size_t *out_len)
{
    ZT_ASSERT(s->stop != NULL && s->stop_len > 0);
    if (s->handed) {
        memmove(s->buf, s->buf + s->handed, s->n - s->handed);
        s->n -= s->handed;
        s->handed = 0;
    }
    if (s->n + len > s->cap) {
        size_t cap = 2 * (s->n + len) + 64;
        char *b = realloc(s->buf, cap);
        if (!b)
            return ZT_ENOMEM;
        s->buf = b;
        s->cap = cap;
    }
    if (len)
        memcpy(s->buf + s->n, bytes, len);
    s->n += len;
    *out = s->buf;
    for (size_t i = 0; i + s->stop_len <= s->n; i++)
        if (memcmp(s->buf + i, s->stop, s->stop_len) == 0) {
            *out_len = i;
            s->n = s->handed = 0;
            return 1;
        }
    /* Hold the longest tail that is a start of the stop string. */
    size_t keep = s->stop_len - 1 < s->n ? s->stop_len - 1 : s->n;
    while (keep > 0 && memcmp(s->buf + s->n - keep, s->stop, keep) != 0)
        keep--;
    *out_len = s->handed = s->n - keep;
    return 0;
}

void zt_stop_scan_rest(zt_stop_scan *s, const char **out, size_t *out_len)
{
    *out = s->buf + s->handed;
    *out_len = s->n - s->handed;
    s->n = s->handed = 0;
}

void zt_stop_scan_free(zt_stop_scan *s)
{
    free(s->buf);
    *s = (zt_stop_scan){0};
}
