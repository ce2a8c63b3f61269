/* The CUDA executors' bookkeeping of forward passes (worker/models/cuda_exec.h), which needs no GPU: in the
 * engine's order (model.h) every first forward is a first one, a checkpointed block's forward before its
 * backward is a rebuild (the highest checkpointed block's keeps its activations), and every backward finds
 * its block ready; a caller that skips discard() is caught; begin() forgets everything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "worker/models/cuda_exec.h"

#define MAXL 6

/* One tensor per block: embeddings, L layers, head. */
static void make_layout(zt__cuda_layout *lay, int L, const bool *ckpt)
{
    zt_param_info t[MAXL + 2];
    memset(t, 0, sizeof t);
    for (int b = 0; b < L + 2; b++) {
        snprintf(t[b].name, sizeof t[b].name, "block%d.weight", b);
        t[b].ndim = 1;
        t[b].shape[0] = 64;
        t[b].offset = (size_t)b * 64;
        t[b].numel = 64;
        t[b].block = b;
    }
    zt__cuda_layout_init(lay, t, L + 2, L + 2);
    zt__cuda_layout_finish(lay, t, L, ckpt, false);
}

/* One training micro-batch in the engine's order; returns the number of rebuilds. */
static int train_micro(zt__cuda_layout *lay, int L)
{
    const int nb = L + 2;
    int top = -1, rebuilds = 0;
    zt__cuda_passes_begin(lay);
    for (int b = 0; b < nb; b++) {
        assert_int_equal(zt__cuda_pass_of(lay, b), ZT__CUDA_PASS_FIRST);
        if (lay->block_ckpt[b]) {
            zt__cuda_pass_discard(lay, b);
            top = b;
        }
    }
    for (int b = nb - 1; b >= 0; b--) {
        if (lay->block_ckpt[b]) {
            const enum zt__cuda_pass p = zt__cuda_pass_of(lay, b);
            assert_int_equal(p, b == top ? ZT__CUDA_PASS_KEPT : ZT__CUDA_PASS_REBUILD);
            rebuilds += p == ZT__CUDA_PASS_REBUILD;
        }
        assert_true(zt__cuda_pass_backward_ready(lay, b));
    }
    return rebuilds;
}

static void test_engine_order(void **state)
{
    (void)state;
    static const char *const patterns[] = {"111111", "000000", "101101", "011110", "000001", "100000"};
    for (size_t k = 0; k < sizeof patterns / sizeof patterns[0]; k++) {
        bool ckpt[MAXL];
        int n = 0;
        for (int l = 0; l < MAXL; l++)
            n += ckpt[l] = patterns[k][l] == '1';
        zt__cuda_layout lay;
        make_layout(&lay, MAXL, ckpt);
        /* Two micro-batches, an evaluation (forwards only) between them: every checkpointed layer but the
         * highest is rebuilt each time. */
        assert_int_equal(train_micro(&lay, MAXL), n > 0 ? n - 1 : 0);
        zt__cuda_passes_begin(&lay);
        for (int b = 0; b < MAXL + 2; b++)
            assert_int_equal(zt__cuda_pass_of(&lay, b), ZT__CUDA_PASS_FIRST);
        assert_int_equal(train_micro(&lay, MAXL), n > 0 ? n - 1 : 0);
        zt__cuda_layout_free(&lay);
    }
}

/* A caller that runs a checkpointed block's forward again without discarding it first gets a first
 * forward, and the block's backward is not ready (the executors assert it). */
static void test_backward_without_discard(void **state)
{
    (void)state;
    const bool ckpt[2] = {true, true};
    zt__cuda_layout lay;
    make_layout(&lay, 2, ckpt);
    zt__cuda_passes_begin(&lay);
    for (int b = 0; b < 4; b++)
        assert_int_equal(zt__cuda_pass_of(&lay, b), ZT__CUDA_PASS_FIRST);
    assert_true(zt__cuda_pass_backward_ready(&lay, 3)); /* the head block is not checkpointed */
    assert_int_equal(zt__cuda_pass_of(&lay, 2), ZT__CUDA_PASS_FIRST);
    assert_false(zt__cuda_pass_backward_ready(&lay, 2));
    /* A rebuilt block is ready until its next first forward. */
    zt__cuda_pass_discard(&lay, 1);
    assert_int_equal(zt__cuda_pass_of(&lay, 1), ZT__CUDA_PASS_REBUILD);
    assert_true(zt__cuda_pass_backward_ready(&lay, 1));
    assert_int_equal(zt__cuda_pass_of(&lay, 1), ZT__CUDA_PASS_FIRST);
    assert_false(zt__cuda_pass_backward_ready(&lay, 1));
    zt__cuda_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_order),
        cmocka_unit_test(test_backward_without_discard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
