/* libFuzzer harness: the manifest of a state-server snapshot (zt_server_core_snapshot_read,
 * server/snapshot.c). The snapshot folder holds the block files of a real snapshot of the "fz" run at
 * step 1 (fuzz_server_run.h); the input is its manifest.json. Each input is restored into a fresh core
 * (with the limits of fz_core_options); a restored run's state is then read back shard by shard. */
#include "fuzz_common.h"

#include "fuzz_server_run.h"

static char g_dir[512], g_manifest[600];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_path(g_dir, sizeof(g_dir), "snap");
    zt_server_core_options o = fz_core_options();
    zt_server_core *core = NULL;
    zt_err err = {{0}};
    if (zt_server_core_create(&core, &o, &err) != 0)
        abort();
    fz_make_run(core, 1);
    if (zt_server_core_snapshot_write(core, FZ_RUN, g_dir, &err) != 0) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
    zt_server_core_destroy(core);
    snprintf(g_manifest, sizeof(g_manifest), "%s/manifest.json", g_dir);
    if (fz_seed_dir()) {
        size_t len;
        uint8_t *data = fz_read(g_manifest, &len);
        fz_write_seed("manifest.json", data, len);
        free(data);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(g_manifest, data, size);
    zt_server_core_options o = fz_core_options();
    zt_server_core *core = NULL;
    zt_err err = {{0}};
    if (zt_server_core_create(&core, &o, &err) != 0)
        abort();
    zt_server_run_info info;
    if (zt_server_core_snapshot_read(core, g_dir, &info, &err) == 0) {
        zt_server_run_stats st;
        zt_server_run_stats *all = &st;
        int n = 0;
        zt_server_core_list_stats(core, all, 1, &n);
        for (int b = 0; n > 0 && b < info.nblocks && b < 4; b++) {
            uint64_t shard_numel = 0;
            if (zt_server_core_block_numel(core, st.run_id, b, NULL, &shard_numel, &err) != 0 ||
                shard_numel > 4096)
                continue;
            float *out = malloc(shard_numel * sizeof(float) + 1);
            for (int s = 0; s < info.world_size && s < 4; s++)
                (void)zt_server_core_read_state(core, st.run_id, b, s, ZT_SERVER_MASTER, out, NULL, &err);
            free(out);
        }
    }
    zt_server_core_destroy(core);
    return 0;
}
