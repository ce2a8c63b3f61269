/* xoshiro256** by Blackman and Vigna (public domain algorithm), seeded with splitmix64. */
#include "common/rng.h"

#include <math.h>

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
