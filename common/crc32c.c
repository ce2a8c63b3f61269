/* CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78): the SSE4.2 crc32 instruction when
 * the CPU has it, a byte-wise table otherwise. Both give identical results; tests compare them. */
#include "common/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define CRC32C_POLY_REFLECTED 0x82F63B78u

static uint32_t g_table[256];
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void build_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY_REFLECTED : c >> 1;
        g_table[i] = c;
    }
}

/* Table implementation; same contract as zt_crc32c. Exported for tests that compare both paths. */
uint32_t zt__crc32c_table(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&g_table_once, build_table);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++)
        c = g_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t c = ~crc;
    /* Bytes up to an 8-byte boundary, then 8 bytes at a time, then the tail. */
    while (n > 0 && ((uintptr_t)p & 7) != 0) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    while (n > 0) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    return ~(uint32_t)c;
}
#endif

/* Returns 1 when the hardware path is available on this CPU. Exported for tests. */
int zt__crc32c_has_hw(void)
{
#if defined(__x86_64__)
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    return 0;
#endif
}

/* Hardware implementation; must only be called when zt__crc32c_has_hw() returns 1. */
uint32_t zt__crc32c_hw(uint32_t crc, const void *data, size_t n)
{
#if defined(__x86_64__)
    return crc32c_sse42(crc, data, n);
#else
    return zt__crc32c_table(crc, data, n);
#endif
}

/* Extends crc over n bytes of data and returns the new value (start with crc = 0). */
uint32_t zt_crc32c(uint32_t crc, const void *data, size_t n)
{
    if (zt__crc32c_has_hw())
        return zt__crc32c_hw(crc, data, n);
    return zt__crc32c_table(crc, data, n);
}
