/* libFuzzer harness: the token shard reader (worker/data/dataloader.c, llm.c's 16- and 32-bit shard formats). The input
 * is one shard file; the harness opens it through the public loader API (B = 2, T = 4, shuffled) and,
 * when the loader accepts it, draws batches across an epoch boundary and moves the position back and
 * forth, so every token the loader hands out is read. */
#include "fuzz_common.h"

#include <limits.h>

#include "worker/data/dataloader.h"

static char g_path[512];

static void write_seeds(void)
{
    char path[512];
    fz_path(path, sizeof(path), "seed.bin");
    uint16_t tokens[64];
    for (int i = 0; i < 64; i++)
        tokens[i] = (uint16_t)((i * 7 + 3) % 50);
    zt_err err;
    if (zt_shard_write(path, tokens, 64, &err) != 0) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
    size_t len;
    uint8_t *data = fz_read(path, &len);
    fz_write_seed("shard_64_tokens.bin", data, len);
    free(data);
    if (zt_shard_write(path, tokens, 9, &err) != 0)
        abort();
    data = fz_read(path, &len);
    fz_write_seed("shard_one_window.bin", data, len);
    free(data);
    uint32_t wide[64]; /* the 32-bit format, with ids above 65535 */
    for (int i = 0; i < 64; i++)
        wide[i] = (uint32_t)(i * 4099 + 70000);
    if (zt_shard_write32(path, wide, 64, &err) != 0)
        abort();
    data = fz_read(path, &len);
    fz_write_seed("shard32_64_tokens.bin", data, len);
    free(data);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    fz_path(g_path, sizeof(g_path), "input_000.bin");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(g_path, data, size);
    zt_dataloader *dl = NULL;
    zt_err err;
    if (zt_dataloader_open(&dl, g_path, 2, 4, true, 7, &err) != 0)
        return 0;
    int32_t in[8], tg[8];
    const int max = zt_dataloader_max_token(dl); /* INT32_MAX when saturated (32-bit ids above it) */
    volatile uint64_t sink = zt_dataloader_num_tokens(dl);
    (void)sink;
    uint64_t per_epoch = zt_dataloader_batches_per_epoch(dl);
    for (uint64_t i = 0; i < per_epoch + 2 && i < 64; i++) {
        zt_dataloader_next(dl, in, tg);
        for (int k = 0; k < 8 && max < INT32_MAX; k++)
            if (in[k] < 0 || in[k] > max || tg[k] < 0 || tg[k] > max)
                abort(); /* every id a batch holds is one the loader counted in max_token */
        sink ^= (uint32_t)in[0] ^ (uint32_t)tg[7];
    }
    zt_data_position pos;
    zt_dataloader_get_position(dl, &pos);
    zt_dataloader_reset(dl);
    if (zt_dataloader_set_position(dl, &pos, &err) != 0)
        abort(); /* a position the loader reported must be accepted back */
    zt_dataloader_next(dl, in, tg);
    zt_dataloader_close(dl);
    return 0;
}
