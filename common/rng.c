/* xoshiro256** by Blackman and Vigna (public domain algorithm), seeded with splitmix64. */
#include "common/rng.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void zt_rng_seed(zt_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

uint64_t zt_rng_u64(zt_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t zt_rng_below(zt_rng *r, uint64_t n)
{
    /* Rejection of the top partial range keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = zt_rng_u64(r);
    } while (x >= limit);
    return x % n;
}

double zt_rng_uniform(zt_rng *r)
{
    return (double)(zt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

double zt_rng_normal_from(double u1, double u2)
{
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double zt_rng_normal(zt_rng *r)
{
    double u1 = zt_rng_uniform(r);
    double u2 = zt_rng_uniform(r);
    return zt_rng_normal_from(u1, u2);
}

void zt_rng_shuffle_u64(zt_rng *r, uint64_t *idx, uint64_t n)
{
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = zt_rng_below(r, i);
        uint64_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* ---- jumping ahead ----
 *
 * One step of xoshiro256** is linear over GF(2) on its 256 state bits: state' = M state. A matrix is kept
 * as its 256 columns (the images of the 256 unit states), each 4 words; M^n applied to a state is the XOR
 * of the columns of its set bits. g_pow[k] = M^(2^k), built once; jumping n steps applies g_pow[k] for
 * each set bit k of n (the powers of one matrix commute). */

typedef struct jump_matrix {
    uint64_t col[256][4];
} jump_matrix;

static jump_matrix g_pow[64];
static pthread_once_t g_pow_once = PTHREAD_ONCE_INIT;

/* y = A x (y may not alias x). */
static void apply(const jump_matrix *a, const uint64_t x[4], uint64_t y[4])
{
    y[0] = y[1] = y[2] = y[3] = 0;
    for (int w = 0; w < 4; w++)
        for (uint64_t bits = x[w]; bits; bits &= bits - 1) {
            const uint64_t *c = a->col[w * 64 + __builtin_ctzll(bits)];
            y[0] ^= c[0];
            y[1] ^= c[1];
            y[2] ^= c[2];
            y[3] ^= c[3];
        }
}

static void build_powers(void)
{
    for (int i = 0; i < 256; i++) {
        zt_rng r = {{0, 0, 0, 0}};
        r.s[i / 64] = 1ULL << (i % 64);
        (void)zt_rng_u64(&r);
        memcpy(g_pow[0].col[i], r.s, sizeof r.s);
    }
    for (int k = 1; k < 64; k++)
        for (int i = 0; i < 256; i++) /* column i of M^(2^k) = M^(2^(k-1)) applied to its own column i */
            apply(&g_pow[k - 1], g_pow[k - 1].col[i], g_pow[k].col[i]);
}

void zt_rng_jump(zt_rng *r, uint64_t n)
{
    if (n == 0)
        return;
    pthread_once(&g_pow_once, build_powers);
    for (int k = 0; k < 64; k++)
        if (n >> k & 1) {
            uint64_t y[4];
            apply(&g_pow[k], r->s, y);
            memcpy(r->s, y, sizeof y);
        }
}
