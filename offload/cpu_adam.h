/* CPU AdamW on one shard of a block: fp32 master weights and moments updated in place from an fp32, fp16
 * or bf16 gradient, optionally writing the updated weights rounded to fp16/bf16/fp32 for the GPUs.
 *
 * The math is kernels/adamw.h's (PyTorch's AdamW) in the same order of operations as
 * zt_cpu_adamw_update (kernels/cpu/adamw.c): with fp32 gradients the results are bit-identical to it on
 * every instruction set, so optimizer placements cpu and server give the parameters of the CPU trainer.
 * Vector paths (AVX-512F, AVX2+F16C) and the scalar path compute the same IEEE operations (no fused
 * multiply-add; sqrt and division are correctly rounded everywhere). Low-precision outputs round to
 * nearest even and keep NaN a NaN. The work is split over threads in fixed chunks; each element's result
 * depends only on its own inputs, so the thread count never changes a result.
 *
 * Weight decay per tensor (none for biases and layer-norm weights) is the caller's: call once per tensor
 * range with p->weight_decay set or 0. */
#ifndef ZT_OFFLOAD_CPU_ADAM_H
#define ZT_OFFLOAD_CPU_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "kernels/adamw.h"

/* Instruction sets of the update loop, best last. */
enum zt_cpu_adam_isa {
    ZT_CPU_ADAM_ISA_SCALAR = 0,
    ZT_CPU_ADAM_ISA_AVX2 = 1,   /* AVX2 + F16C */
    ZT_CPU_ADAM_ISA_AVX512 = 2, /* AVX-512F (bf16 conversions with integer operations) */
};

/* One range of a shard to update. All arrays hold n elements and may not overlap each other.
 *
 * Moments in bf16 (moment_dtype BF16, half the bytes): each element's m and v are widened to fp32, the
 * update runs exactly as with fp32 moments (the same parameter bits for the same widened moments), and
 * the new m and v are rounded back to bf16 stochastically: up with probability equal to the fraction of
 * the bf16 step the value lies above the lower neighbour, so that small updates (beta2 close to 1) are
 * not rounded away on average. The random bits come from (seed, index_base + i) alone (a Weyl sequence
 * over the indices, offset by a hash of the seed): the results depend on neither the thread count nor the
 * instruction set. */
typedef struct zt_cpu_adam_range {
    float *param;              /* fp32 master weights, updated in place */
    void *m;                   /* first moment of moment_dtype, updated in place */
    void *v;                   /* second moment of moment_dtype, updated in place */
    const void *grad;          /* gradient of grad_dtype */
    enum zt_dtype grad_dtype;  /* F32, F16 or BF16 */
    void *out;                 /* NULL, or receives the updated weights as out_dtype */
    enum zt_dtype out_dtype;   /* F32, F16 or BF16; ignored where out is NULL */
    size_t n;                  /* elements */
    enum zt_dtype moment_dtype; /* F32 (0, the default) or BF16 */
    uint64_t seed;             /* BF16 moments: the stochastic rounding's seed (e.g. the Adam step) */
    uint64_t index_base;       /* BF16 moments: the index of element 0 in the hash (e.g. its shard offset) */
    /* NULL: the update is in place. Otherwise the step reads the state from these three (n elements each, the
     * types of param, m and v, overlapping none of the other arrays) and writes the new state to param, m and
     * v, which need not hold anything (a state server's commit into its other slot). The old values are loaded
     * from the sources and the new ones stored once, with streaming stores where the destination is aligned
     * (with fp32 moments on AVX2 and AVX-512): the destination's old lines are never read, so the update
     * moves as many bytes as in place. Either all three are set or none. */
    const float *param_src;
    const void *m_src, *v_src;
} zt_cpu_adam_range;

/* The instruction set zt_cpu_adam_update uses: the best one this CPU supports, unless the environment
 * variable ZT_CPU_ADAM_ISA (avx512, avx2 or scalar) asks for a lower one. Chosen once per process. */
enum zt_cpu_adam_isa zt_cpu_adam_get_isa(void);

/* Whether this CPU (and build) can run the given instruction set: 1 or 0. */
int zt_cpu_adam_isa_supported(enum zt_cpu_adam_isa isa);

/* "avx512", "avx2" or "scalar". Never NULL. */
const char *zt_cpu_adam_isa_name(enum zt_cpu_adam_isa isa);

/* Applies one AdamW step with p's hyperparameters to the range r, on `threads` threads (<= 0: the CPU
 * kernels' count, kernels/cpu_threads.h). Returns 0, or ZT_EUNSUPPORTED for a dtype other than
 * F32/F16/BF16, ZT_EINVAL_CONFIG for p->step < 1 or a NULL array, with the reason in err; on error
 * nothing is changed. */
int zt_cpu_adam_update(const zt_cpu_adam_range *r, const zt_adamw_params *p, int threads, zt_err *err);

/* zt_cpu_adam_update with an explicit instruction set (tests and benchmarks compare them). Returns
 * ZT_EUNSUPPORTED, changing nothing, where zt_cpu_adam_isa_supported(isa) is 0. */
int zt_cpu_adam_update_isa(enum zt_cpu_adam_isa isa, const zt_cpu_adam_range *r, const zt_adamw_params *p,
                           int threads, zt_err *err);

/* Converts n fp32 values to dst_dtype (F32, F16 or BF16; round to nearest even, NaN stays NaN), e.g. the
 * master weights to the low-precision parameters a worker pulls before any step. Returns 0 or
 * ZT_EUNSUPPORTED with the reason in err. */
int zt_cpu_adam_convert(void *dst, enum zt_dtype dst_dtype, const float *src, size_t n, int threads, zt_err *err);

/* The reverse: n values of src_dtype (F32, F16 or BF16) widened to fp32, exactly (NaN stays NaN), e.g. bf16
 * Adam moments for a checkpoint. Returns 0 or ZT_EUNSUPPORTED with the reason in err. */
int zt_cpu_adam_widen(float *dst, const void *src, enum zt_dtype src_dtype, size_t n, int threads, zt_err *err);

/* dst[i] += src[i] for n fp32 values (the gradient of a micro-batch added to the step's sum on the host), on
 * `threads` threads (<= 0: the CPU kernels' count): one IEEE addition per element, so the same bits as the
 * device's fold of the same two numbers, whatever the thread count. dst and src may not overlap. */
void zt_cpu_adam_accumulate(float *dst, const float *src, size_t n, int threads);

#endif
