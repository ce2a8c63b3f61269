/* CRC-32C (Castagnoli), as used by iSCSI, ext4 and gRPC: checksums for snapshots and checkpoints.
 * Uses the SSE4.2 crc32 instruction when the CPU has it (runtime check), a table otherwise. */
#ifndef ZT_COMMON_CRC32C_H
#define ZT_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (start with 0) over n bytes and returns the new value. crc32c("123456789") = 0xE3069283. */
uint32_t zt_crc32c(uint32_t crc, const void *data, size_t n);

/* The two implementations behind zt_crc32c, for tests that compare them: the table version always
 * works; zt__crc32c_hw may only be called when zt__crc32c_has_hw() returns 1. */
uint32_t zt__crc32c_table(uint32_t crc, const void *data, size_t n);
uint32_t zt__crc32c_hw(uint32_t crc, const void *data, size_t n);
int zt__crc32c_has_hw(void);

#endif
