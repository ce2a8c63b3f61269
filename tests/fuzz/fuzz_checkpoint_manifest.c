/* libFuzzer harness: the manifest of a training checkpoint (zt_checkpoint_verify, worker/train/
 * checkpoint.c). The checkpoint folder holds the four files a manifest must list, with fixed contents;
 * the input is manifest.json. The seed lists them with their true sizes and CRC-32C, so the fuzzer starts
 * from a manifest that verifies. */
#include "fuzz_common.h"

#include <inttypes.h>

#include "common/fileio.h"
#include "worker/train/checkpoint.h"

static char g_dir[512], g_manifest[600];
static const char *const k_files[4] = {"model.safetensors", "optim.safetensors", "config.json", "model_config.json"};

static void make_dir(void)
{
    fz_path(g_dir, sizeof(g_dir), "ckpt_000010");
    fz_mkdir(g_dir);
    for (int i = 0; i < 4; i++) {
        char path[700], text[64];
        snprintf(path, sizeof(path), "%s/%s", g_dir, k_files[i]);
        int n = snprintf(text, sizeof(text), "contents of %s, %d\n", k_files[i], i * 11);
        fz_write(path, text, (size_t)n);
    }
    snprintf(g_manifest, sizeof(g_manifest), "%s/manifest.json", g_dir);
}

static void write_seeds(void)
{
    char files[2048];
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        char path[700];
        snprintf(path, sizeof(path), "%s/%s", g_dir, k_files[i]);
        uint64_t bytes;
        uint32_t crc;
        zt_err err;
        if (zt_checksum_file(path, &bytes, &crc, &err) != 0)
            abort();
        off += (size_t)snprintf(files + off, sizeof(files) - off, "%s\"%s\": {\"bytes\": %" PRIu64 ", \"crc32c\": \"%08" PRIx32 "\"}",
                                i ? ", " : "", k_files[i], bytes, crc);
    }
    char text[4096];
    int n = snprintf(text, sizeof(text),
                     "{\"format\": \"ztrain-checkpoint\", \"version\": 1, \"step\": 10, \"adam_step\": 9,"
                     " \"skipped_steps\": 1, \"elapsed_s\": 12.5, \"loss_scale\": 65536, \"loss_scale_clean_steps\": 3,"
                     " \"data_position\": {\"epoch\": 0, \"shard\": 1, \"window\": 7},"
                     " \"rng_state\": [\"0123456789abcdef\", \"fedcba9876543210\", \"0000000000000001\", \"ffffffffffffffff\"],"
                     " \"schedule\": {\"name\": \"cosine\", \"lr\": 0.0006, \"min_lr\": 0, \"warmup_steps\": 2,"
                     " \"total_steps\": 100, \"gamma\": 0.95},"
                     " \"files\": {%s}}",
                     files);
    fz_write_seed("manifest.json", text, (size_t)n);
    /* The seed must be a manifest that verifies. */
    fz_write(g_manifest, text, (size_t)n);
    zt_err err;
    if (zt_checkpoint_verify(g_dir, NULL, &err) != 0) {
        fprintf(stderr, "fuzz: the seed manifest does not verify: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    make_dir();
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(g_manifest, data, size);
    zt_ckpt_state st;
    zt_err err;
    (void)zt_checkpoint_verify(g_dir, &st, &err);
    char found[1024];
    (void)zt_checkpoint_find(g_dir, found, sizeof(found), &err);
    return 0;
}
