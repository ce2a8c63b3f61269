/* Hints about large host buffers; see common/memory.h. */
#include "common/memory.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void zt_advise_huge_pages(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    if (!p || bytes < ((size_t)4 << 20))
        return;
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    /* madvise takes whole pages: the ones inside the buffer (a malloc'd block starts past a header) */
    const uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + bytes) & ~(page - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_HUGEPAGE); /* a hint: its failure changes nothing */
#else
    (void)p;
    (void)bytes;
#endif
}

void zt_release_pages(void *p, size_t bytes)
{
    if (!p)
        return;
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    const uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + bytes) & ~(page - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_DONTNEED); /* private memory: cannot fail for a mapped range */
}
