/* The parameter tables every host model (worker/models/gpt2.h, llama.h) describes itself with: one entry
 * per named tensor, and one range per block, both in elements of the model's parameter slab (the
 * gradient slab has the same layout). Blocks are contiguous in block order and tensors in slab order. */
#ifndef ZT_WORKER_MODELS_PARAMS_H
#define ZT_WORKER_MODELS_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The dimension along which tensor parallelism splits a tensor: none (every rank holds it whole), its rows
 * (a column-parallel linear layer's output features, a vocabulary's rows) or its columns (a row-parallel
 * layer's input features). */
enum zt_tp_split { ZT_TP_REPLICATED = 0, ZT_TP_ROWS, ZT_TP_COLS };

/* One named parameter tensor. */
typedef struct zt_param_info {
    char name[96];      /* e.g. "h.3.attn.c_attn.weight" (T5's longest names take 69 bytes) */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* ztrain layout ([out, in] for linear weights) */
    size_t offset;      /* in elements, from the start of the parameter slab */
    size_t numel;
    int block;          /* index of the block that owns it */
    bool weight_decay;  /* false for biases and normalisation weights (layer norm, RMSNorm), true for the rest */
    bool transposed_in_hf; /* stored transposed in HF files (GPT-2's Conv1D weights) */
    unsigned char tp_split; /* enum zt_tp_split */
} zt_param_info;

typedef struct zt_block_info {
    size_t offset;      /* in elements, first element of the block in the parameter slab */
    size_t numel;
} zt_block_info;

#endif
