/* The engine's view of a host model on the CPU (worker/models/model.h), shared by the families' CPU
 * executors (gpt2_cpu.c, llama_cpu.c, bert_cpu.c): on the CPU the model's layout is the host model's, so
 * the block and tensor tables of zt_model come straight from the host model's. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_CPU_LAYOUT_H
#define ZT_WORKER_MODELS_CPU_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/models/model.h"
#include "worker/models/params.h" /* zt_param_info, zt_block_info */

/* The tables a CPU executor owns and its zt_model points at. */
typedef struct zt__cpu_layout {
    size_t *block_offset, *block_len;
    bool *checkpointed, *reads_weights;
    zt_model_tensor *tensors;
} zt__cpu_layout;

/* What the family says of its host model: its tables (blocks[0..nblocks), tensors[0..ntensors), in slab
 * order), its layers (blocks 1..nlayers, the only ones checkpointing applies to; ckpt_layers names them, or
 * NULL), whether block 0's backward reads its weights, the head block and the sizes. */
typedef struct zt__cpu_host {
    const zt_block_info *blocks;
    int nblocks;
    const zt_param_info *tensors;
    int ntensors;
    int nlayers;
    bool embedding_reads_weights;
    int head_block;
    size_t num_params;
    int max_B, max_T;
} zt__cpu_host;

/* Fills lay and the layout fields of base (ops excepted) for max_micro micro-batches per step. */
void zt__cpu_layout_init(zt_model *base, zt__cpu_layout *lay, const zt__cpu_host *h, const bool *ckpt_layers,
                         int max_micro);
void zt__cpu_layout_free(zt__cpu_layout *lay);

#endif
