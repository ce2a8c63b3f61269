/* Tests of text generation (worker/train/generate.h): the sampler's greedy, top-k and temperature
 * behaviour against exact probabilities, its use of the random generator, and zt_generate on a small
 * random GPT-2 (greedy tokens equal an independent argmax over the sliding context, seeds reproduce,
 * callbacks stop early, bad prompts and broken weights are errors), and the stop string of chat replies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "worker/models/gpt2.h"
#include "worker/train/generate.h"

/* ---- the sampler alone --------------------------------------------------------------------------- */

static void test_greedy(void **state)
{
    (void)state;
    const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    zt_rng rng, before;
    zt_rng_seed(&rng, 7);
    before = rng;
    zt_err err = {{0}};
    /* The lowest index wins a tie, and greedy sampling draws nothing from the generator. */
    assert_int_equal(zt_generate_sample(logits, 5, 0.0, 0, &rng, &err), 1);
    assert_int_equal(zt_generate_sample(logits, 5, 0.0, 2, &rng, &err), 1);
    assert_memory_equal(&rng, &before, sizeof(rng));
    /* top-k 1 is greedy at any temperature, but consumes one draw. */
    for (int i = 0; i < 50; i++)
        assert_int_equal(zt_generate_sample(logits, 5, 1.5, 1, &rng, &err), 1);
}

static void test_one_draw_per_sample(void **state)
{
    (void)state;
    const float logits[] = {0.1f, 0.2f, 0.3f, 0.4f};
    zt_rng rng, expect;
    zt_rng_seed(&rng, 99);
    zt_rng_seed(&expect, 99);
    zt_err err = {{0}};
    for (int i = 0; i < 10; i++) {
        double u = zt_rng_uniform(&expect);
        int token = zt_generate_sample(logits, 4, 1.0, 0, &rng, &err);
        assert_memory_equal(&rng, &expect, sizeof(rng));
        /* The draw picks the token whose cumulative probability interval holds u. */
        double p[4], sum = 0, acc = 0;
        for (int k = 0; k < 4; k++)
            sum += p[k] = exp((double)logits[k] - (double)logits[3]);
        int want = 3;
        for (int k = 0; k < 4; k++) {
            acc += p[k] / sum;
            if (u < acc) {
                want = k;
                break;
            }
        }
        assert_int_equal(token, want);
    }
}

/* Draws n samples and checks the frequencies against probs within tol. */
static void check_frequencies(const float *logits, int V, double temperature, int top_k, const double *probs,
                              int n, double tol)
{
    int counts[16] = {0};
    zt_rng rng;
    zt_rng_seed(&rng, 2024);
    zt_err err = {{0}};
    for (int i = 0; i < n; i++) {
        int t = zt_generate_sample(logits, V, temperature, top_k, &rng, &err);
        assert_true(t >= 0 && t < V);
        counts[t]++;
    }
    for (int k = 0; k < V; k++) {
        double f = (double)counts[k] / n;
        if (probs[k] == 0.0)
            assert_int_equal(counts[k], 0);
        else if (fabs(f - probs[k]) > tol)
            fail_msg("token %d: frequency %.4f, expected %.4f", k, f, probs[k]);
    }
}

static void test_temperature_and_top_k(void **state)
{
    (void)state;
    /* Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1. */
    const float logits[] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    const double t1[] = {0.4, 0.3, 0.2, 0.1};
    check_frequencies(logits, 4, 1.0, 0, t1, 40000, 0.01);

    /* Temperature 2: p^(1/2), renormalised. */
    double t2[4], s = 0;
    for (int k = 0; k < 4; k++)
        s += t2[k] = sqrt(t1[k]);
    for (int k = 0; k < 4; k++)
        t2[k] /= s;
    check_frequencies(logits, 4, 2.0, 0, t2, 40000, 0.01);

    /* top-k 2: only the two best, renormalised: 4/7 and 3/7. */
    const double k2[] = {4.0 / 7.0, 3.0 / 7.0, 0, 0};
    check_frequencies(logits, 4, 1.0, 2, k2, 40000, 0.01);

    /* top-k larger than V keeps everything. */
    check_frequencies(logits, 4, 1.0, 100, t1, 40000, 0.01);
}

static void test_non_finite_logits(void **state)
{
    (void)state;
    zt_rng rng;
    zt_rng_seed(&rng, 1);
    zt_err err = {{0}};

    /* -inf masks a token; it is never drawn, even with top-k wider than the finite tokens. */
    const float masked[] = {-INFINITY, 0.0f, -INFINITY, 0.0f};
    const double half[] = {0, 0.5, 0, 0.5};
    check_frequencies(masked, 4, 1.0, 3, half, 20000, 0.015);
    assert_int_equal(zt_generate_sample(masked, 4, 0.0, 0, &rng, &err), 1);

    const float with_nan[] = {0.0f, NAN, 1.0f};
    assert_int_equal(zt_generate_sample(with_nan, 3, 1.0, 0, &rng, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "non-finite"));
    const float with_inf[] = {0.0f, INFINITY, 1.0f};
    assert_int_equal(zt_generate_sample(with_inf, 3, 0.0, 0, &rng, &err), ZT_EFORMAT);
    const float all_masked[] = {-INFINITY, -INFINITY};
    assert_int_equal(zt_generate_sample(all_masked, 2, 1.0, 0, &rng, &err), ZT_EFORMAT);

    assert_int_equal(zt_generate_sample(masked, 4, -1.0, 0, &rng, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_generate_sample(masked, 4, 1.0, -1, &rng, &err), ZT_EINVAL_CONFIG);
}

/* ---- zt_generate on a small model ----------------------------------------------------------------- */

#define N_POS 8
#define VOCAB 32

/* A small random GPT-2 with its token embeddings multiplied by wte_scale (through the tied head this
 * sharpens the logits) and its other matrices by mix_scale (which makes the next token depend more on
 * the context than on the last token alone). (1, 1) is GPT-2's initial, nearly flat model. */
static zt_family_model *make_model_b(int B, float wte_scale, float mix_scale)
{
    zt_family_config fc;
    zt_family_config_default(&fc);
    zt_gpt2_config cfg = (*ZT_GPT2_CONFIG(&fc));
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_embd = 16;
    cfg.n_positions = N_POS;
    cfg.vocab_size = VOCAB;
    zt_family_model *m = NULL;
    zt_err err = {{0}};
    (*ZT_GPT2_CONFIG(&fc)) = cfg;
    int rc = zt_family_model_create(&m, &fc, B, N_POS, 1234, &err);
    if (rc != 0)
        fail_msg("zt_family_model_create: %s", err.msg);
    float *p = zt_family_model_params(m);
    for (int i = 0; i < zt_family_model_num_tensors(m); i++) {
        const zt_param_info *t = zt_family_model_tensor(m, i);
        if (t->ndim != 2)
            continue;
        float scale = strcmp(t->name, "wte.weight") == 0 ? wte_scale : mix_scale;
        for (size_t k = 0; k < t->numel; k++)
            p[t->offset + k] *= scale;
    }
    return m;
}

static zt_family_model *make_model(float wte_scale, float mix_scale)
{
    return make_model_b(1, wte_scale, mix_scale);
}

typedef struct recorder {
    int32_t tokens[256];
    int n;
    int stop_after; /* return 1 after this many tokens; 0 = never */
    int fail_after; /* return this code... */
    int fail_code;  /* ...after fail_after tokens; 0 = never */
} recorder;

static int record(int32_t token, void *user)
{
    recorder *r = user;
    assert_true(r->n < 256);
    r->tokens[r->n++] = token;
    if (r->fail_code && r->n == r->fail_after)
        return r->fail_code;
    if (r->stop_after && r->n == r->stop_after)
        return 1;
    return 0;
}

static void test_greedy_matches_sliding_argmax(void **state)
{
    (void)state;
    zt_family_model *m = make_model(1.0f, 5.0f);
    const int32_t prompt[] = {3, 1, 4};
    recorder r = {0};
    zt_err err = {{0}};
    const int max_new = 14; /* 3 + 14 > N_POS: the window slides */
    assert_int_equal(zt_generate(m, prompt, 3, max_new, 0.0, 0, 5, record, &r, &err), 0);
    assert_int_equal(r.n, max_new);
    /* A text that repeats one token would not show whether the window slides the right way. */
    int distinct = 0;
    for (int i = 0; i < max_new; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen = seen || r.tokens[j] == r.tokens[i];
        distinct += !seen;
    }
    assert_true(distinct >= 4);

    int32_t seq[32];
    memcpy(seq, prompt, sizeof(prompt));
    memcpy(seq + 3, r.tokens, (size_t)max_new * sizeof(int32_t));
    for (int i = 0; i < max_new; i++) {
        int len = 3 + i;
        int ctx = len < N_POS ? len : N_POS;
        zt_family_model_forward(m, seq + len - ctx, NULL, 1, ctx);
        const float *row = zt_family_model_logits(m) + (size_t)(ctx - 1) * VOCAB;
        int best = 0;
        for (int v = 1; v < VOCAB; v++) {
            if (row[v] > row[best])
                best = v;
        }
        assert_int_equal(r.tokens[i], best);
    }

    /* top-k 1 at temperature 1 is the same as greedy. */
    recorder r1 = {0};
    assert_int_equal(zt_generate(m, prompt, 3, max_new, 1.0, 1, 77, record, &r1, &err), 0);
    assert_memory_equal(r1.tokens, r.tokens, (size_t)max_new * sizeof(int32_t));
    zt_family_model_destroy(m);
}

static void test_seeds(void **state)
{
    (void)state;
    /* Flat logits: different seeds must give different text. */
    zt_family_model *m = make_model(1.0f, 1.0f);
    const int32_t prompt[] = {7};
    zt_err err = {{0}};
    recorder a = {0}, b = {0}, c = {0};
    assert_int_equal(zt_generate(m, prompt, 1, 20, 1.0, 0, 42, record, &a, &err), 0);
    assert_int_equal(zt_generate(m, prompt, 1, 20, 1.0, 0, 42, record, &b, &err), 0);
    assert_int_equal(zt_generate(m, prompt, 1, 20, 1.0, 0, 43, record, &c, &err), 0);
    assert_int_equal(a.n, 20);
    assert_memory_equal(a.tokens, b.tokens, 20 * sizeof(int32_t));
    assert_memory_not_equal(a.tokens, c.tokens, 20 * sizeof(int32_t));

    /* top-k 3: every token is among the 3 best logits of its context. */
    recorder k = {0};
    assert_int_equal(zt_generate(m, prompt, 1, 12, 1.0, 3, 9, record, &k, &err), 0);
    int32_t seq[16] = {7};
    memcpy(seq + 1, k.tokens, 12 * sizeof(int32_t));
    for (int i = 0; i < 12; i++) {
        int len = 1 + i;
        int ctx = len < N_POS ? len : N_POS;
        zt_family_model_forward(m, seq + len - ctx, NULL, 1, ctx);
        const float *row = zt_family_model_logits(m) + (size_t)(ctx - 1) * VOCAB;
        int above = 0;
        for (int v = 0; v < VOCAB; v++)
            above += row[v] > row[k.tokens[i]];
        assert_true(above < 3);
    }
    zt_family_model_destroy(m);
}

static void test_callback_and_errors(void **state)
{
    (void)state;
    zt_family_model *m = make_model(50.0f, 1.0f);
    const int32_t prompt[] = {1, 2};
    zt_err err = {{0}};

    recorder stop = {.stop_after = 5};
    assert_int_equal(zt_generate(m, prompt, 2, 50, 0.8, 10, 1, record, &stop, &err), 0);
    assert_int_equal(stop.n, 5);

    recorder fail = {.fail_after = 3, .fail_code = -32 /* -EPIPE */};
    assert_int_equal(zt_generate(m, prompt, 2, 50, 0.8, 10, 1, record, &fail, &err), -32);
    assert_int_equal(fail.n, 3);

    recorder none = {0};
    assert_int_equal(zt_generate(m, prompt, 2, 0, 0.8, 10, 1, record, &none, &err), 0);
    assert_int_equal(none.n, 0);

    const int32_t bad[] = {1, VOCAB};
    assert_int_equal(zt_generate(m, bad, 2, 5, 0.8, 10, 1, record, &none, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "vocabulary"));
    const int32_t negative[] = {-1};
    assert_int_equal(zt_generate(m, negative, 1, 5, 0.8, 10, 1, record, &none, &err), ZT_EMISMATCH);
    assert_int_equal(zt_generate(m, prompt, 0, 5, 0.8, 10, 1, record, &none, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(zt_generate(m, prompt, 2, 5, NAN, 10, 1, record, &none, &err), ZT_EINVAL_CONFIG);
    assert_int_equal(none.n, 0);

    /* Broken weights: an error, not a made-up token. */
    float *p = zt_family_model_params(m);
    for (size_t i = 0; i < zt_family_model_num_params(m); i++)
        p[i] = NAN;
    assert_int_equal(zt_generate(m, prompt, 2, 5, 0.8, 10, 1, record, &none, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "non-finite"));
    assert_int_equal(none.n, 0);
    zt_family_model_destroy(m);
}

/* ---- beam search ---------------------------------------------------------------------------------- */

/* The log-probabilities of the token after seq[0, len) (the last N_POS tokens), in double. */
static void next_logprobs(zt_family_model *m, const int32_t *seq, int len, double *lp)
{
    int ctx = len < N_POS ? len : N_POS;
    zt_family_model_forward(m, seq + len - ctx, NULL, 1, ctx);
    const float *row = zt_family_model_logits(m) + (size_t)(ctx - 1) * VOCAB;
    double max = row[0], sum = 0.0;
    for (int v = 1; v < VOCAB; v++)
        max = row[v] > max ? row[v] : max;
    for (int v = 0; v < VOCAB; v++)
        sum += exp((double)row[v] - max);
    for (int v = 0; v < VOCAB; v++)
        lp[v] = (double)row[v] - max - log(sum);
}

static void test_beam_search(void **state)
{
    (void)state;
    const int K = 4;
    zt_family_model *m = make_model_b(K, 1.0f, 3.0f);
    const int32_t prompt[] = {3, 1, 4};
    zt_err err = {{0}};
    int32_t *out = NULL;
    int n = 0;

    /* One beam is greedy search, the window sliding past N_POS too. */
    recorder g = {0};
    assert_int_equal(zt_generate(m, prompt, 3, 9, 0.0, 0, 5, record, &g, &err), 0);
    assert_int_equal(zt_generate_beam(m, prompt, 3, 9, 1, 1.0, NULL, 0, &out, &n, &err), 0);
    assert_int_equal(n, 9);
    assert_memory_equal(out, g.tokens, 9 * sizeof(int32_t));
    free(out);

    /* Two new tokens, no end token: the K first tokens of highest log-probability, each followed by its best
     * second token, and the best of those pairs (by brute force over the model's own passes). */
    double lp1[VOCAB], lp2[VOCAB];
    int32_t seq[8] = {3, 1, 4};
    next_logprobs(m, seq, 3, lp1);
    bool taken[VOCAB] = {false};
    double best = -INFINITY;
    int32_t best_pair[2] = {-1, -1};
    for (int k = 0; k < K; k++) {
        int t = -1;
        for (int v = 0; v < VOCAB; v++)
            if (!taken[v] && (t < 0 || lp1[v] > lp1[t]))
                t = v;
        taken[t] = true;
        seq[3] = t;
        next_logprobs(m, seq, 4, lp2);
        for (int v = 0; v < VOCAB; v++)
            if (lp1[t] + lp2[v] > best) {
                best = lp1[t] + lp2[v];
                best_pair[0] = t;
                best_pair[1] = v;
            }
    }
    for (int k = 1; k <= K; k *= 2) { /* length penalties do not matter when every hypothesis is as long */
        assert_int_equal(zt_generate_beam(m, prompt, 3, 2, K, k - 2.0, NULL, 0, &out, &n, &err), 0);
        assert_int_equal(n, 2);
        assert_memory_equal(out, best_pair, sizeof best_pair);
        free(out);
    }

    /* An end token. When it is the likeliest first token and the length penalty is 0 (plain sums, which only
     * fall as tokens are added), the end token alone is the best hypothesis: nothing is printed. Otherwise
     * the tokens printed never include it (it ends a hypothesis). */
    int first = 0;
    for (int v = 1; v < VOCAB; v++)
        first = lp1[v] > lp1[first] ? v : first;
    assert_int_equal(zt_generate_beam(m, prompt, 3, 6, K, 0.0, &first, 1, &out, &n, &err), 0);
    assert_int_equal(n, 0);
    free(out);
    const int two[2] = {(first + 1) % VOCAB, (first + 2) % VOCAB}; /* several end tokens (LLaMA 3.1 lists 3) */
    for (int ne = 1; ne <= 2; ne++) {
        assert_int_equal(zt_generate_beam(m, prompt, 3, 6, K, 1.0, two, ne, &out, &n, &err), 0);
        assert_true(n >= 0 && n <= 6);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < ne; j++)
                assert_int_not_equal(out[i], two[j]);
        free(out);
    }
    const int with_first[2] = {(first + 3) % VOCAB, first};
    assert_int_equal(zt_generate_beam(m, prompt, 3, 6, K, 0.0, with_first, 2, &out, &n, &err), 0);
    assert_int_equal(n, 0);
    free(out);

    /* Bad arguments are errors with messages. */
    assert_int_equal(zt_generate_beam(m, prompt, 3, 2, VOCAB, 1.0, NULL, 0, &out, &n, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "--num-beams"));
    assert_int_equal(zt_generate_beam(m, prompt, 3, 0, K, 1.0, NULL, 0, &out, &n, &err), ZT_EINVAL_CONFIG);
    zt_family_model_destroy(m);
}

/* ---- the stop string of chat replies ------------------------------------------------------------ */

/* Pushes each piece; returns what was handed out, joined (a start of the stop string held at the end is not),
 * and whether the stop string was found (then what comes after it in the pieces is never pushed). */
static char *scan_all(const char *stop, const char *const *pieces, int n, bool *found)
{
    zt_stop_scan s = {.stop = stop, .stop_len = strlen(stop)};
    char *text = calloc(256, 1);
    size_t len = 0;
    *found = false;
    for (int i = 0; i < n && !*found; i++) {
        const char *out;
        size_t k;
        int rc = zt_stop_scan_push(&s, pieces[i], strlen(pieces[i]), &out, &k);
        assert_true(rc == 0 || rc == 1);
        memcpy(text + len, out, k);
        len += k;
        *found = rc == 1;
    }
    zt_stop_scan_free(&s);
    return text;
}

static void test_stop_scan(void **state)
{
    (void)state;
    static const struct {
        const char *pieces[6];
        int n;
        const char *text;
        bool found;
    } cases[] = {
        {{"11 - 8", "0 = 3", "<|im_end|>"}, 3, "11 - 80 = 3", true},     /* the marker as one token */
        {{"ab<|i", "m_e", "nd|", ">cd", "ef"}, 5, "ab", true},             /* in pieces, text after it */
        {{"x<|im_end|im_end|>y"}, 1, "x<|im_end|im_end|>y", false},        /* near misses are text */
        {{"<", "<|im_", "end|>"}, 3, "<", true},                           /* a false start before it */
        {{"ok <|im_en"}, 1, "ok ", false},                                 /* an unfinished start at the end */
        {{"ok <|im_en", "x"}, 2, "ok <|im_enx", false},                    /* ... which was text after all */
        {{"", "<|im_end|>", "after"}, 3, "", true},                        /* an empty reply */
        {{"a", "b", "c"}, 3, "abc", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool found;
        char *text = scan_all("<|im_end|>", cases[i].pieces, cases[i].n, &found);
        assert_string_equal(text, cases[i].text);
        assert_int_equal(found, cases[i].found);
        free(text);
    }
    /* Text is handed out as soon as it cannot begin the marker: after "ab<" only "ab" is out. */
    zt_stop_scan s = {.stop = "</s>", .stop_len = 4};
    const char *out;
    size_t k;
    assert_int_equal(zt_stop_scan_push(&s, "ab<", 3, &out, &k), 0);
    assert_int_equal(k, 2);
    assert_memory_equal(out, "ab", 2);
    assert_int_equal(zt_stop_scan_push(&s, "b", 1, &out, &k), 0);
    assert_int_equal(k, 2);
    assert_memory_equal(out, "<b", 2);
    zt_stop_scan_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_one_draw_per_sample),
        cmocka_unit_test(test_temperature_and_top_k),
        cmocka_unit_test(test_non_finite_logits),
        cmocka_unit_test(test_greedy_matches_sliding_argmax),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_callback_and_errors),
        cmocka_unit_test(test_stop_scan),
        cmocka_unit_test(test_beam_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
