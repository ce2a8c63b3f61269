/* The run the server harnesses start from, made through the core's API: "fz", world size 2, two blocks
 * of 5 and 3 parameters (block 1's shards end in padding), a weight-decay range, F32 pulls, its initial
 * parameters pushed and, when asked, step 1 committed. Starting from a live run lets a few fuzzed
 * messages reach commits, pulls and snapshots instead of spending them on a registration. */
#ifndef ZT_TESTS_FUZZ_SERVER_RUN_H
#define ZT_TESTS_FUZZ_SERVER_RUN_H

#include "server/core.h"

#define FZ_RUN "fz"
#define FZ_WORLD 2
#define FZ_BLOCKS 2
static const uint64_t fz_numel[FZ_BLOCKS] = {5, 3};

/* The options of every core a harness makes: limits as a server open to untrusted clients should set
 * them, so that a fuzzed layout of 2^48 parameters is refused rather than allocated. */
static zt_server_core_options fz_core_options(void)
{
    zt_server_core_options o = {0};
    o.mem_limit = 64u << 20;
    o.max_runs = 4;
    o.threads = 1;
    return o;
}

static zt_server_run_desc fz_desc(zt_server_block_desc blocks[FZ_BLOCKS])
{
    static const zt_server_range decay0[1] = {{1, 4}};
    for (int b = 0; b < FZ_BLOCKS; b++) {
        blocks[b].numel = fz_numel[b];
        blocks[b].decay = b == 0 ? decay0 : NULL;
        blocks[b].ndecay = b == 0 ? 1 : 0;
    }
    zt_server_run_desc d = {.run_id = FZ_RUN, .world_size = FZ_WORLD, .nblocks = FZ_BLOCKS, .blocks = blocks,
                            .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .param_dtype = ZT_DTYPE_F32};
    return d;
}

/* Registers "fz" on core, pushes its initial parameters and commits `steps` steps. Aborts on failure. */
static void fz_make_run(zt_server_core *core, int steps)
{
    zt_server_block_desc blocks[FZ_BLOCKS];
    zt_server_run_desc d = fz_desc(blocks);
    zt_err err = {{0}};
    if (zt_server_core_register(core, &d, NULL, &err) != 0)
        goto fail;
    for (int b = 0; b < FZ_BLOCKS; b++) {
        uint64_t n = zt_server_shard_numel(fz_numel[b], FZ_WORLD);
        for (int s = 0; s < FZ_WORLD; s++) {
            float v[8] = {0};
            for (uint64_t i = 0; i < n; i++)
                v[i] = (uint64_t)s * n + i < fz_numel[b] ? 0.25f * (float)(b + 1) + 0.125f * (float)i : 0.0f;
            zt_server_chunk c = {.block = b, .shard = s, .offset = 0, .n = n, .dtype = ZT_DTYPE_F32, .data = v};
            if (zt_server_core_push_params(core, FZ_RUN, &c, &err) != 0)
                goto fail;
        }
    }
    for (int step = 1; step <= steps; step++) {
        for (int b = 0; b < FZ_BLOCKS; b++) {
            uint64_t n = zt_server_shard_numel(fz_numel[b], FZ_WORLD);
            for (int s = 0; s < FZ_WORLD; s++) {
                float g[8] = {0};
                for (uint64_t i = 0; i < n; i++)
                    g[i] = (uint64_t)s * n + i < fz_numel[b] ? 0.5f - 0.1f * (float)i : 0.0f;
                zt_server_chunk c = {.block = b, .shard = s, .offset = 0, .n = n, .dtype = ZT_DTYPE_F32, .data = g};
                if (zt_server_core_push_grad(core, FZ_RUN, step, &c, &err) != 0)
                    goto fail;
            }
        }
        zt_server_commit_args a = {.step = step, .grad_norm = 1.0, .clip_coef = 1.0f, .lr = 1e-2f};
        if (zt_server_core_commit(core, FZ_RUN, &a, NULL, &err) != 0)
            goto fail;
    }
    return;
fail:
    fprintf(stderr, "fuzz: making the run failed: %s\n", err.msg);
    abort();
}

#endif
