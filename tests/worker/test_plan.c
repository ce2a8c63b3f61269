/* The memory planner (worker/train/plan.h) with a made-up price list: it takes the fastest layout that
 * fits, lowers an automatic micro-batch only as far as needed, and a refusal names the minimum and each
 * change that would fit with its need. Host and disk refusals name both numbers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "worker/train/plan.h"

#define MiB ((size_t)1 << 20)

/* Prices: weights resident 1000 MiB (optimizer on the GPU: 4000), chunked 800, streamed 100; activations
 * 100 MiB per row of the micro-batch, a third of it with every layer checkpointed; 34 MiB fixed. */
static int priced; /* calls */
static void price(void *ctx, enum zt_plan_weights w, bool on_gpu, int b, bool ckpt_all, zt_plan_device *out)
{
    (void)ctx;
    priced++;
    out->engine = (w == ZT_PLAN_RESIDENT ? (on_gpu ? 4000 : 1000) : w == ZT_PLAN_CHUNKED ? 800 : 100) * MiB;
    out->model = (size_t)b * (ckpt_all ? 33 : 100) * MiB;
    out->fixed = 34 * MiB;
}

static zt_plan_request request(uint64_t cap_mib, int micro)
{
    zt_plan_request r = {
        .cap = cap_mib * MiB,
        .gpu_free = 100000 * MiB,
        .weights = ZT_WEIGHTS_AUTO,
        .optimizer_on_gpu = false,
        .can_chunk = true,
        .can_stream = true,
        .world = 1,
        .micro_batch = micro,
        .grad_accum = 2,
        .seq_len = 1024,
        .price = price,
    };
    return r;
}

static void test_fastest_that_fits(void **state)
{
    (void)state;
    zt_plan_choice c;
    zt_err err = {{0}};
    /* 8 rows: 800 MiB of activations; resident 1834, chunked 1634, streamed 934 */
    zt_plan_request r = request(2000, 8);
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_RESIDENT);
    assert_int_equal(c.micro_batch, 8);
    assert_int_equal(c.grad_accum, 2);
    assert_true(c.limit == 2000 * MiB);
    r = request(1700, 8);
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_CHUNKED);
    r = request(1000, 8);
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_STREAMED);
    assert_true(zt_plan_device_total(&c.device) == 934 * MiB);
    /* no cap: the GPU's free memory */
    r = request(0, 8);
    r.gpu_free = 1500 * MiB;
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_STREAMED);
    assert_true(c.limit == 1500 * MiB);
    /* --weights gpu never streams; --weights host always does */
    r = request(1700, 8);
    r.weights = ZT_WEIGHTS_HOST;
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_STREAMED);
    r = request(1000, 8);
    r.weights = ZT_WEIGHTS_GPU;
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
    /* several ranks: gradient pieces and streamed weights as with one */
    r = request(1700, 8);
    r.world = 2;
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_CHUNKED);
    /* a request without pieces still streams the weights */
    r.can_chunk = false;
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_STREAMED);
    /* ... and with streaming ruled out too (ZeRO-2), resident only */
    r.can_stream = false;
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
}

static void test_auto_micro_batch(void **state)
{
    (void)state;
    zt_plan_choice c;
    zt_err err = {{0}};
    /* 12 rows do not fit 700 MiB in any layout; the divisors 6, 4 do not either (734, 534 streamed: 6 -> 734
     * too much, 4 -> 534 fits) */
    zt_plan_request r = request(700, 12);
    r.auto_micro = true;
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.micro_batch, 4);
    assert_int_equal(c.grad_accum, 2 * 3);
    assert_int_equal(c.weights, ZT_PLAN_STREAMED);
    /* without auto the same request is refused */
    r.auto_micro = false;
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
}

static void test_refusal_names_minimum_and_fixes(void **state)
{
    (void)state;
    zt_plan_choice c;
    zt_err err = {{0}};
    /* 8 rows, optimizer on the GPU (resident only): 4000 + 800 + 34 = 4834 MiB against a cap of 1000; only
     * moving the optimizer off the GPU fits (checkpointing or fewer rows leave 4000 MiB of weights) */
    zt_plan_request r = request(1000, 8);
    r.optimizer_on_gpu = true;
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
    const char *m = err.msg;
    if (!strstr(m, "--gpu-mem is 1000 MiB") || !strstr(m, "at least 4.72 GiB") ||
        !strstr(m, "--optimizer cpu (streamed weights, 934 MiB)") || strstr(m, "--checkpointing all") ||
        strstr(m, "--batch-size") || !strstr(m, "--gpu-mem 4916MiB or more"))
        fail_msg("message: %s", m);
    /* optimizer off the GPU but a cap below even the streamed minimum at 8 rows (934): checkpointing all
     * (100 + 264 + 34 = 398) and 4 rows (534) would fit; 1 row would too, the largest fitting is named */
    r = request(600, 8);
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
    m = err.msg;
    if (!strstr(m, "at least 934 MiB") || strstr(m, "--optimizer cpu") || !strstr(m, "--checkpointing all (398 MiB)") ||
        !strstr(m, "--batch-size 4 --grad-accum 4 for the same tokens per step (534 MiB)") ||
        !strstr(m, "--gpu-mem 1024MiB"))
        fail_msg("message: %s", m);
    /* without a cap the message speaks of the GPU's free memory */
    r = request(0, 8);
    r.gpu_free = 100 * MiB;
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
    if (!strstr(err.msg, "the GPU has 100 MiB") || !strstr(err.msg, "a GPU with --gpu-mem"))
        fail_msg("message: %s", err.msg);
    /* a cap above the GPU's free memory: the free memory is the limit, and the message says so */
    r = request(2000, 8);
    r.gpu_free = 1000 * MiB;
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_int_equal(c.weights, ZT_PLAN_STREAMED);
    assert_true(c.limit == 1000 * MiB);
    assert_false(c.capped);
    r = request(2000, 8);
    assert_int_equal(zt_plan_fit(&r, &c, &err), 0);
    assert_true(c.capped);
    r = request(2000, 8);
    r.gpu_free = 600 * MiB;
    assert_int_equal(zt_plan_fit(&r, &c, &err), ZT_ENOMEM);
    if (!strstr(err.msg, "the GPU has 600 MiB free (less than --gpu-mem 1.95 GiB)") ||
        !strstr(err.msg, "a GPU with --gpu-mem"))
        fail_msg("message: %s", err.msg);
}

static void test_host_and_disk(void **state)
{
    (void)state;
    zt_err err = {{0}};
    zt_plan_host h = {.ram_needed = 120ULL << 30, .ram_available = 100ULL << 30, .ram_parts = "engine 120 GiB"};
    assert_int_equal(zt_plan_check_host(&h, &err), ZT_ENOMEM);
    if (!strstr(err.msg, "120 GiB") || !strstr(err.msg, "100 GiB") || !strstr(err.msg, "--offload nvme:DIR"))
        fail_msg("message: %s", err.msg);
    /* with the other settings that would fit, the message names them instead */
    h.ram_fixes = "--adam-moments bf16 (RAM 98.0 GiB)";
    assert_int_equal(zt_plan_check_host(&h, &err), ZT_ENOMEM);
    if (!strstr(err.msg, "what would fit: --adam-moments bf16 (RAM 98.0 GiB)") || !strstr(err.msg, "120 GiB"))
        fail_msg("message: %s", err.msg);
    h.ram_fixes = NULL;
    h.ram_available = 200ULL << 30;
    assert_int_equal(zt_plan_check_host(&h, &err), 0);
    h.disk_needed = 80ULL << 30;
    h.disk_free = 64ULL << 30;
    h.disk_dir = "/mnt/nvme";
    assert_int_equal(zt_plan_check_host(&h, &err), ZT_ENOMEM);
    if (!strstr(err.msg, "80.0 GiB") || !strstr(err.msg, "64.0 GiB") || !strstr(err.msg, "/mnt/nvme"))
        fail_msg("message: %s", err.msg);
    /* the machine's numbers are readable here */
    assert_true(zt_plan_ram_available() > 0);
    assert_true(zt_plan_disk_free(".") > 0);
    assert_true(zt_plan_disk_free("/no/such/dir") == 0);
}

/* A made-up host price list: base bytes, moments M and masters X in 8 equal blocks; a tier on disk keeps the
 * whole blocks that fit its RAM share; staging S inside base. */
#define GiB (1ULL << 30)
struct host_list {
    uint64_t base, M, X;
};

static uint64_t kept(uint64_t total, bool disk, uint64_t ram)
{
    if (!disk)
        return total;
    const uint64_t block = total / 8;
    uint64_t n = ram / block;
    return (n > 8 ? 8 : n) * block;
}

static void host_price(void *ctx, const zt_plan_tiers *t, zt_plan_host_price *out)
{
    const struct host_list *l = ctx;
    const uint64_t m = kept(l->M, t->moments_disk, t->moments_ram), x = kept(l->X, t->masters_disk, t->masters_ram);
    out->ram = l->base + m + x;
    out->disk = (l->M - m) + (l->X - x);
    snprintf(out->parts, sizeof out->parts, "base %llu GiB", (unsigned long long)(l->base / GiB));
}

static void test_host_mem_tiers(void **state)
{
    (void)state;
    struct host_list l = {.base = 20 * GiB, .M = 64 * GiB, .X = 32 * GiB};
    zt_plan_host_request r = {.cap = 200 * GiB, .has_dir = true, .can_masters_disk = true, .staging = 8 * GiB,
                              .price = host_price, .ctx = &l};
    zt_plan_host_choice c;
    zt_err err = {{0}};
    /* everything fits: nothing moves */
    assert_int_equal(zt_plan_fit_host(&r, &c, &err), 0);
    assert_false(c.tiers.moments_disk);
    assert_true(c.price.ram == 116 * GiB && c.price.disk == 0);
    /* 100 GiB: the moments go to disk but for the blocks that fit in what is left (80 - 52 = 28 GiB: 3 of 8) */
    r.cap = 80 * GiB;
    assert_int_equal(zt_plan_fit_host(&r, &c, &err), 0);
    assert_true(c.tiers.moments_disk && !c.tiers.masters_disk);
    assert_true(c.price.ram == 52 * GiB + 24 * GiB && c.price.ram <= r.cap);
    assert_true(c.price.disk == 40 * GiB);
    /* 40 GiB: the moments all on disk, the masters too but for 20 GiB of them (5 of 8 blocks) */
    r.cap = 40 * GiB;
    assert_int_equal(zt_plan_fit_host(&r, &c, &err), 0);
    assert_true(c.tiers.moments_disk && c.tiers.masters_disk && c.tiers.moments_ram == 0);
    assert_true(c.price.ram == 40 * GiB && c.price.disk == 64 * GiB + 12 * GiB);
    /* below the smallest plan (20 GiB): refused with the minimum, and without checkpoints what fits */
    r.cap = 16 * GiB;
    assert_int_equal(zt_plan_fit_host(&r, &c, &err), ZT_ENOMEM);
    print_message("refusal: %s\n", err.msg);
    if (!strstr(err.msg, "--host-mem 16.0 GiB") || !strstr(err.msg, "at least 20.0 GiB") ||
        !strstr(err.msg, "--host-mem 20480MiB or more") || !strstr(err.msg, "--save-every -1 (no checkpoint staging: "
                                                                           "12.0 GiB)") ||
        !strstr(err.msg, "base 20 GiB"))
        fail_msg("message: %s", err.msg);
    /* masters that cannot leave RAM: the moments' floor is the minimum */
    r.can_masters_disk = false;
    r.cap = 40 * GiB;
    assert_int_equal(zt_plan_fit_host(&r, &c, &err), ZT_ENOMEM);
    if (!strstr(err.msg, "at least 52.0 GiB") || !strstr(err.msg, "--weights masters"))
        fail_msg("message: %s", err.msg);
    /* no directory: refused, naming what --moments-dir would need */
    r.can_masters_disk = true;
    r.has_dir = false;
    assert_int_equal(zt_plan_fit_host(&r, &c, &err), ZT_ENOMEM);
    print_message("refusal: %s\n", err.msg);
    if (!strstr(err.msg, "at least 116 GiB") ||
        !strstr(err.msg, "--moments-dir DIR, moments on disk (RAM 52.0 GiB, above the cap, disk 64.0 GiB)") ||
        !strstr(err.msg, "--moments-dir DIR, moments and masters on disk (RAM 20.0 GiB, disk 96.0 GiB)"))
        fail_msg("message: %s", err.msg);
    /* a checkpoint that the disk cannot hold: refused before writing, naming both numbers */
    const uint64_t need = zt_plan_checkpoint_bytes(1000000000ULL, false);
    assert_true(need == 12000000000ULL + (1ULL << 20));
    assert_true(zt_plan_checkpoint_bytes(1000000000ULL, true) == need + 4000000000ULL);
    assert_int_equal(zt_plan_check_checkpoint(need, need, "/ckpt", &err), 0);
    assert_int_equal(zt_plan_check_checkpoint(need, 0, "/ckpt", &err), 0); /* unknown: not refused */
    assert_int_equal(zt_plan_check_checkpoint(need, 10 * GiB, "/ckpt", &err), ZT_ENOMEM);
    if (!strstr(err.msg, "11.2 GiB in '/ckpt'") || !strstr(err.msg, "10.0 GiB free") || !strstr(err.msg, "--save-every -1"))
        fail_msg("message: %s", err.msg);
    char flag[32];
    zt_plan_size_flag(3 * (1ULL << 20) + 1, flag, sizeof flag);
    assert_string_equal(flag, "4MiB");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fastest_that_fits),
        cmocka_unit_test(test_auto_micro_batch),
        cmocka_unit_test(test_refusal_names_minimum_and_fixes),
        cmocka_unit_test(test_host_and_disk),
        cmocka_unit_test(test_host_mem_tiers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
