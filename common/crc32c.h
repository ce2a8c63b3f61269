/* CRC-32C (Castagnoli), as used by iSCSI, ext4 and gRPC: checksums for snapshots and checkpoints.
 * Uses the SSE4.2 crc32 instruction when the CPU has it (runtime check), a table otherwise. */
#ifndef ZT_COMMON_CRC32C_H
#define ZT_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (start with 0) over n bytes and returns the new value. crc32c("123456789") = 0xE3069283. */
uint32_t zt_crc32c(uint32_t crc, const void *data, size_t n);

#endif
