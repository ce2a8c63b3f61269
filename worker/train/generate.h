/* Text generation from a GPT-2 model: temperature and top-k sampling, deterministic for a given seed.
 *
 * There is no KV cache yet: every new token recomputes the forward pass over the context, which is the
 * last min(length, n_positions) tokens. That is quadratic in the length but simple and exact; a cache
 * can replace it later without changing this interface. */
#ifndef ZT_WORKER_GENERATE_H
#define ZT_WORKER_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"
#include "worker/models/family.h"

/* Called once per generated token, in order. Return 0 to go on, a positive value to stop early (not an
 * error), or a negative ZT_E* / -errno code to stop with that error (for example a failed write). */
typedef int (*zt_generate_token_fn)(int32_t token, void *user);

/* Draws one token from a row of V logits. temperature == 0 picks the argmax (the lowest index on ties);
 * otherwise logits are divided by temperature and turned into probabilities with a softmax computed in
 * double. top_k > 0 keeps only the top_k largest logits (ties broken towards the lower index);
 * top_k == 0 (or >= V) keeps all. Uses exactly one zt_rng_uniform draw when temperature > 0 and none
 * when it is 0. Returns the token id in [0, V), or ZT_EFORMAT with a message when the logits hold a NaN
 * or when no logit is finite. */
int zt_generate_sample(const float *logits, int V, double temperature, int top_k, zt_rng *rng, zt_err *err);

/* Generates max_new tokens after the prompt (n_prompt >= 1 tokens, each in [0, vocab_size)), calling
 * on_token for each one. The model must have been created with B >= 1 and T >= min(n_positions,
 * n_prompt + max_new); its parameters are only read, its activations are overwritten. The sequence is a
 * pure function of (weights, prompt, temperature, top_k, seed). temperature must be >= 0 and top_k >= 0.
 * Returns 0 (also when on_token stopped early with a positive value), the negative code on_token
 * returned, or ZT_EINVAL_CONFIG / ZT_EFORMAT / ZT_ENOMEM with a message in err. */
int zt_generate(zt_family_model *model, const int32_t *prompt, int n_prompt, int max_new, double temperature, int top_k,
                uint64_t seed, zt_generate_token_fn on_token, void *user, zt_err *err);

/* Beam search, as transformers' generate(num_beams=K, do_sample=False) does it with early_stopping False:
 * each step extends the K running beams by every token, keeps the max(2, 1 + n_eos) K best continuations by their summed
 * log-probabilities, of which those among the first K that end (the end-of-sequence token, or the last of
 * max_new tokens) become finished hypotheses scored by their sum over (generated length) ^ length_penalty,
 * and the best K that do not end run on; the search stops when no running beam can beat the worst of the K
 * best finished ones (the same heuristic: the best running sum over the current length ^ length_penalty),
 * or at max_new tokens. eos holds the n_eos end-of-sequence ids (n_eos 0: none, and every hypothesis ends
 * at max_new). A causal LM extends the prompt (the context is the last n_positions tokens); a
 * sequence-to-sequence model (T5) encodes the prompt and decodes from its start token. The model must have been created with B >= num_beams and T >= min(n_positions, n_prompt + max_new).
 * On success *out (malloc'd, *n_out tokens) is the best hypothesis's new tokens without its final eos.
 * Returns 0, or ZT_EINVAL_CONFIG / ZT_EFORMAT / ZT_ENOMEM with a message. */
int zt_generate_beam(zt_family_model *model, const int32_t *prompt, int n_prompt, int max_new, int num_beams,
                     double length_penalty, const int *eos, int n_eos, int32_t **out, int *n_out, zt_err *err);

/* Generated text cut at a stop string (a chat template's end-of-turn marker, "<|im_end|>"), which may come
 * in pieces over several tokens or inside one: the bytes that could still begin it are held back until
 * the next bytes tell (what is still held when generation ends is a start of the stop string that never
 * completed, and is dropped). Zero-initialise, set stop and stop_len (> 0), push each token's bytes. */
typedef struct zt_stop_scan {
    const char *stop;
    size_t stop_len;
    char *buf;       /* held bytes, and the ones handed out by the last push */
    size_t n, cap;
    size_t handed;   /* bytes at the front of buf handed out by the last push */
} zt_stop_scan;

/* Appends len bytes. *out and *out_len are then the bytes that can be printed (valid until the next call);
 * returns 1 when the stop string is complete (out ends just before it; what follows it is dropped), 0 when
 * it is not, ZT_ENOMEM. */
int zt_stop_scan_push(zt_stop_scan *s, const char *bytes, size_t len, const char **out, size_t *out_len);
void zt_stop_scan_free(zt_stop_scan *s);

#endif
