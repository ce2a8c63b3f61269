/* Hints about large host buffers. */
#ifndef ZT_COMMON_MEMORY_H
#define ZT_COMMON_MEMORY_H

#include <stddef.h>

/* Asks the kernel to back the pages of [p, p + bytes) with transparent huge pages (2 MiB on x86-64) when
 * they are first touched, for buffers of 4 MiB or more: far fewer page faults when a slab of gigabytes is
 * first written, and fewer TLB misses when it is streamed (the optimizer's arrays). Only a hint: where
 * the system has no transparent huge pages, or refuses, nothing changes. Contents are untouched. */
void zt_advise_huge_pages(void *p, size_t bytes);

/* Gives the whole pages inside [p, p + bytes) back to the kernel (madvise MADV_DONTNEED): memory from
 * malloc/calloc reads as zeros there afterwards and takes pages again when written. For a buffer whose
 * contents are no longer needed but which stays allocated. */
void zt_release_pages(void *p, size_t bytes);

#endif
