/* A small deterministic random generator (xoshiro256**, seeded through splitmix64) for parameter
 * initialisation, data shuffling and sampling. Its state is four words, so it can be saved in a
 * checkpoint and restored exactly. The same seed gives the same sequence on every platform. */
#ifndef ZT_COMMON_RNG_H
#define ZT_COMMON_RNG_H

#include <stdint.h>

typedef struct zt_rng {
    uint64_t s[4];
} zt_rng;

void zt_rng_seed(zt_rng *r, uint64_t seed);
uint64_t zt_rng_u64(zt_rng *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t zt_rng_below(zt_rng *r, uint64_t n);
/* Uniform in [0, 1) with 53 random bits. */
double zt_rng_uniform(zt_rng *r);
/* Standard normal (Box-Muller, no cached second value so that the state alone defines the stream). */
double zt_rng_normal(zt_rng *r);
/* The Box-Muller transform zt_rng_normal applies to its two uniforms u1, u2 (drawn in that order), so
 * that callers can draw the uniforms in order and transform them elsewhere (for example on several
 * threads) and get the same values. */
double zt_rng_normal_from(double u1, double u2);
/* Advances r as n calls of zt_rng_u64 would (in O(log n)), so that threads can each draw their own part
 * of one sequence: the values are the sequence's whatever the split. Thread-safe on distinct r. */
void zt_rng_jump(zt_rng *r, uint64_t n);
/* Fisher-Yates shuffle of idx[0..n). */
void zt_rng_shuffle_u64(zt_rng *r, uint64_t *idx, uint64_t n);

#endif
