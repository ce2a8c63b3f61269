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

/* The index of the largest finite logit of a row, or ZT_EFORMAT with a message: NaN or +inf means the weights
 * are broken; -inf is a legitimate "never this token", but not for every token. */
static int best_logit(const float *logits, int V, zt_err *err)
{
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
    return best;
}

/* A prompt generation can start from: at least one token, each in [0, V). */
static int check_prompt(const int32_t *prompt, int n_prompt, int V, zt_err *err)
{
    if (n_prompt < 1 || !prompt)
        return zt_fail(err, ZT_EINVAL_CONFIG, "generation needs a prompt of at least one token, got %d", n_prompt);
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= V)
            return zt_fail(err, ZT_EMISMATCH,
                           "prompt token %d is %d, outside the model's vocabulary of %d tokens; use a model "
                           "whose vocab_size covers the tokenizer",
                           i, (int)prompt[i], V);
    }
    return 0;
}

int zt_generate_sample(const float *logits, int V, double temperature, int top_k, zt_rng *rng, zt_err *err)
{
    if (V <= 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "sampling needs at least one logit, got V = %d", V);
    if (!(temperature >= 0.0) || isinf(temperature))
        return zt_fail(err, ZT_EINVAL_CONFIG, "temperature must be a finite number >= 0, got %g", temperature);
    if (top_k < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "top-k must be >= 0 (0 keeps every token), got %d", top_k);

    const int best = best_logit(logits, V, err);
    if (best < 0 || temperature == 0.0)
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

    int rc = check_prompt(prompt, n_prompt, V, err);
    if (rc < 0)
        return rc;
    if (max_new < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "the number of new tokens must be >= 0, got %d", max_new);
    if (!(temperature >= 0.0) || isinf(temperature))
        return zt_fail(err, ZT_EINVAL_CONFIG, "temperature must be a finite number >= 0, got %g", temperature);
    if (top_k < 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "top-k must be >= 0 (0 keeps every token), got %d", top_k);

    size_t total = (size_t)n_prompt + (size_t)max_new;
    int32_t *seq = malloc(total * sizeof(*seq));
    if (!seq)
        return zt_fail(err, ZT_ENOMEM, "out of memory for a sequence of %zu tokens", total);
    for (int i = 0; i < n_prompt; i++)
        seq[i] = prompt[i];

    zt_rng rng;
    zt_rng_seed(&rng, seed);
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

/* ---- beam search ---- */

/* A continuation: beam b extended by token, with its summed log-probability. */
typedef struct beam_cand {
    double score;
    int beam, token;
} beam_cand;

/* Higher score first; ties by beam, then token, so the order never depends on qsort. */
static int compare_beam_cands(const void *pa, const void *pb)
{
    const beam_cand *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->beam != b->beam)
        return a->beam - b->beam;
    return a->token - b->token;
}

/* A finished hypothesis: its new tokens (len of them, the eos included) and its length-penalised score. */
typedef struct beam_done {
    double score;
    int32_t *tokens;
    int len;
} beam_done;

/* Log-softmax of one row of V logits into lp (double). Returns ZT_EFORMAT as best_logit does. */
static int log_softmax_row(const float *x, int V, double *lp, zt_err *err)
{
    const int best = best_logit(x, V, err);
    if (best < 0)
        return best;
    const double max = x[best];
    double sum = 0.0;
    for (int i = 0; i < V; i++)
        sum += exp((double)x[i] - max);
    const double lse = max + log(sum);
    for (int i = 0; i < V; i++)
        lp[i] = (double)x[i] - lse;
    return 0;
}

/* Keeps hypothesis (tokens, len, score) among the best k finished ones (done[0..*nd), best first). */
static int keep_done(beam_done *done, int *nd, int k, const int32_t *tokens, int len, double score)
{
    int at = *nd;
    while (at > 0 && done[at - 1].score < score)
        at--;
    if (at >= k)
        return 0;
    int32_t *copy = malloc((size_t)(len > 0 ? len : 1) * sizeof *copy);
    if (!copy)
        return ZT_ENOMEM;
    memcpy(copy, tokens, (size_t)len * sizeof *copy);
    if (*nd == k) {
        free(done[k - 1].tokens);
        (*nd)--;
    }
    memmove(done + at + 1, done + at, (size_t)(*nd - at) * sizeof *done);
    done[at] = (beam_done){.score = score, .tokens = copy, .len = len};
    (*nd)++;
    return 0;
}

static bool is_eos(const int *eos, int n_eos, int token)
{
    for (int i = 0; i < n_eos; i++)
        if (eos[i] == token)
            return true;
    return false;
}

int zt_generate_beam(zt_family_model *model, const int32_t *prompt, int n_prompt, int max_new, int num_beams,
                     double length_penalty, const int *eos, int n_eos, int32_t **out, int *n_out, zt_err *err)
{
    ZT_ASSERT(model != NULL);
    *out = NULL;
    *n_out = 0;
    const zt_family_config *cfg = zt_family_model_config(model);
    zt_family_shape shape;
    zt_family_config_shape(cfg, &shape);
    const int V = shape.vocab, K = num_beams;
    const bool s2s = shape.task == ZT_TASK_SEQ2SEQ;
    const size_t positions = (size_t)shape.positions;
    int rc = check_prompt(prompt, n_prompt, V, err);
    if (rc < 0)
        return rc;
    if (max_new < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "beam search needs at least one new token, got %d", max_new);
    /* the continuations kept each step: enough that K run on even if every end token is among them */
    const int wide = n_eos + 1 > 2 ? n_eos + 1 : 2;
    if (K < 1 || (int64_t)wide * K > V)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--num-beams %d: give 1 to %d (the vocabulary of %d tokens over %d)", K,
                       V / wide, V, wide);
    if (!isfinite(length_penalty))
        return zt_fail(err, ZT_EINVAL_CONFIG, "the length penalty must be a finite number, got %g", length_penalty);

    /* Each running beam: its whole sequence (a causal LM's prompt, or the decoder's start token, then the
     * new tokens), row-major with stride cap. */
    const int lead = s2s ? 1 : n_prompt;
    const size_t cap = (size_t)lead + (size_t)max_new;
    int32_t *seq = malloc((size_t)K * cap * sizeof *seq), *next = malloc((size_t)K * cap * sizeof *next);
    int32_t *rows = malloc((size_t)K * cap * sizeof *rows);
    int32_t *enc = s2s ? malloc((size_t)K * (size_t)n_prompt * sizeof *enc) : NULL;
    double *score = calloc((size_t)K, sizeof *score), *lp = malloc((size_t)V * sizeof *lp);
    beam_cand *cand = malloc((size_t)K * (size_t)V * sizeof *cand);
    beam_done *done = calloc((size_t)K, sizeof *done);
    int nd = 0, live = 1;
    if (!seq || !next || !rows || (s2s && !enc) || !score || !lp || !cand || !done) {
        rc = zt_fail(err, ZT_ENOMEM, "out of memory for a beam search of %d beams over %d tokens", K, V);
        goto out;
    }
    if (s2s) {
        seq[0] = shape.decoder_start_token_id;
        for (int b = 0; b < K; b++) /* the encoder's input: the prompt once per beam */
            memcpy(enc + (size_t)b * (size_t)n_prompt, prompt, (size_t)n_prompt * sizeof *enc);
    } else {
        memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    }

    for (int len = 0; len < max_new; len++) {
        const size_t cur = (size_t)lead + (size_t)len; /* tokens in each running sequence */
        /* The logits of the next token of every running beam, in one batch. */
        size_t ctx = cur;
        if (s2s) {
            for (int b = 0; b < live; b++)
                memcpy(rows + (size_t)b * cur, seq + (size_t)b * cap, cur * sizeof *rows);
            const zt_model_seq2seq d = {.decoder_tokens = rows, .Td = (int)cur, .encoder_lens = NULL};
            zt_family_model_set_seq2seq(model, &d);
            zt_family_model_forward(model, enc, NULL, live, n_prompt);
        } else {
            ctx = cur < positions ? cur : positions; /* older tokens fall out of the window */
            for (int b = 0; b < live; b++)
                memcpy(rows + (size_t)b * ctx, seq + (size_t)b * cap + (cur - ctx), ctx * sizeof *rows);
            zt_family_model_forward(model, rows, NULL, live, (int)ctx);
        }
        const float *logits = zt_family_model_logits(model);
        int nc = 0;
        for (int b = 0; b < live; b++) {
            if ((rc = log_softmax_row(logits + ((size_t)b * ctx + ctx - 1) * (size_t)V, V, lp, err)) < 0)
                goto out;
            for (int v = 0; v < V; v++)
                cand[nc++] = (beam_cand){.score = score[b] + lp[v], .beam = b, .token = v};
        }
        qsort(cand, (size_t)nc, sizeof *cand, compare_beam_cands);
        const int keep = wide * K < nc ? wide * K : nc;
        const bool last = len + 1 == max_new;
        /* The first K continuations that end become finished hypotheses; the best K that do not run on. */
        const double norm = pow((double)(len + 1), length_penalty);
        int nl = 0;
        for (int i = 0; i < keep; i++) {
            const beam_cand *c = &cand[i];
            const bool ends = last || is_eos(eos, n_eos, c->token);
            if (ends) {
                if (i < K) {
                    int32_t *t = seq + (size_t)c->beam * cap + lead;
                    t[len] = c->token; /* written in place: this beam's slot beyond len is unused */
                    if (keep_done(done, &nd, K, t, len + 1, c->score / norm) < 0) {
                        rc = zt_fail(err, ZT_ENOMEM, "out of memory for a finished hypothesis");
                        goto out;
                    }
                }
                continue;
            }
            if (nl == K)
                continue;
            memcpy(next + (size_t)nl * cap, seq + (size_t)c->beam * cap, cur * sizeof *next);
            next[(size_t)nl * cap + cur] = c->token;
            score[nl] = c->score;
            nl++;
        }
        if (last || nl == 0)
            break;
        int32_t *tmp = seq;
        seq = next;
        next = tmp;
        live = nl;
        /* Stop when the K finished hypotheses are all better than the best running beam can be (at the
         * current length). */
        if (nd == K && score[0] / pow((double)(len + 1), length_penalty) <= done[K - 1].score)
            break;
    }
    if (nd == 0) {
        rc = zt_fail(err, ZT_EFORMAT, "beam search ended without a hypothesis");
        goto out;
    }
    *n_out = done[0].len - (done[0].len > 0 && is_eos(eos, n_eos, done[0].tokens[done[0].len - 1]));
    *out = done[0].tokens;
    done[0].tokens = NULL;
out:
    for (int i = 0; i < nd; i++)
        free(done[i].tokens);
    free(done);
    free(cand);
    free(lp);
    free(score);
    free(enc);
    free(rows);
    free(next);
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

void zt_stop_scan_free(zt_stop_scan *s)
{
    free(s->buf);
    *s = (zt_stop_scan){0};
}
