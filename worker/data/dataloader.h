/* Token data in llm.c's shard format, and a deterministic, resumable batch loader over several shards.
 *
 * Shard file: 256 little-endian int32 header, then header[2] tokens, little-endian, in one of llm.c's two
 * formats: header[0] = 20240520 and header[1] = 1 with uint16 tokens (GPT-2's; vocabularies up to 65536
 * ids), or header[0] = 20240801 and header[1] = 7 with uint32 tokens (LLaMA-3's; larger vocabularies).
 * Anything else is a format error naming the file and the field. The shards of one pattern may mix the
 * formats.
 *
 * A batch is B rows of T+1 consecutive tokens from one shard (inputs = first T, targets = last T).
 * An epoch visits every shard, and in each shard every window start k*B*T (windows that fit). With
 * shuffle on, the order of shards and of windows inside a shard is a permutation drawn from a generator
 * seeded by (seed, epoch), so the sequence of batches is a pure function of (files, B, T, seed) and a
 * position (epoch, shard index, window index) restores it exactly. */
#ifndef ZT_WORKER_DATALOADER_H
#define ZT_WORKER_DATALOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define ZT_SHARD_MAGIC 20240520   /* uint16 tokens */
#define ZT_SHARD_VERSION 1
#define ZT_SHARD32_MAGIC 20240801 /* uint32 tokens */
#define ZT_SHARD32_VERSION 7
#define ZT_SHARD_HEADER_INTS 256

typedef struct zt_dataloader zt_dataloader; /* opaque */

/* Where the loader is; saved in training checkpoints. */
typedef struct zt_data_position {
    uint64_t epoch;
    uint64_t shard;   /* index in this epoch's shard order */
    uint64_t window;  /* index in this shard's window order */
} zt_data_position;

/* Opens every file matching pattern (a glob; sorted by name), validates each header and size, and maps
 * the files. Fails with a message if nothing matches, a shard is truncated or corrupt, or no shard holds
 * at least one window of B*T+1 tokens. */
int zt_dataloader_open(zt_dataloader **out, const char *pattern, int B, int T, bool shuffle, uint64_t seed,
                       zt_err *err);
void zt_dataloader_close(zt_dataloader *dl); /* accepts NULL */

/* Writes the next batch (inputs and targets, B*T int32 each) and advances, wrapping to a new epoch. */
void zt_dataloader_next(zt_dataloader *dl, int32_t *inputs, int32_t *targets);
/* Goes back to the start of epoch 0. */
void zt_dataloader_reset(zt_dataloader *dl);
void zt_dataloader_get_position(const zt_dataloader *dl, zt_data_position *pos);
/* Restores a position from get_position; ZT_EMISMATCH if it does not fit these files. */
int zt_dataloader_set_position(zt_dataloader *dl, const zt_data_position *pos, zt_err *err);

/* Total tokens over all shards; the largest token id seen in any shard (for the vocab check);
 * the number of batches in one epoch. */
uint64_t zt_dataloader_num_tokens(const zt_dataloader *dl);
int zt_dataloader_max_token(const zt_dataloader *dl);
uint64_t zt_dataloader_batches_per_epoch(const zt_dataloader *dl);

/* The largest token id of one shard file (either format; saturated at INT32_MAX), or -1 if it cannot be
 * read or is not a shard. */
int zt_shard_max_token(const char *path);

/* Writes tokens as one shard file, atomically: 16-bit tokens (< 65536) in the GPT-2 format, or 32-bit ones
 * in the LLaMA-3 format. */
int zt_shard_write(const char *path, const uint16_t *tokens, size_t n, zt_err *err);
int zt_shard_write32(const char *path, const uint32_t *tokens, size_t n, zt_err *err);

#endif
