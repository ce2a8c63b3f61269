/* The CPU executors' layout tables; see cpu_layout.h. */
#include "worker/models/cpu_layout.h"

#include <stdlib.h>

#include "common/status.h"

void zt__cpu_layout_init(zt_model *base, zt__cpu_layout *lay, const zt__cpu_host *h, const bool *ckpt_layers,
                         int max_micro)
{
    const int nb = h->nblocks, nt = h->ntensors;
    lay->block_offset = zt_xcalloc((size_t)nb, sizeof(size_t));
    lay->block_len = zt_xcalloc((size_t)nb, sizeof(size_t));
    lay->checkpointed = zt_xcalloc((size_t)nb, sizeof(bool));
    lay->reads_weights = zt_xcalloc((size_t)nb, sizeof(bool));
    lay->tensors = zt_xcalloc((size_t)nt, sizeof(zt_model_tensor));
    for (int b = 0; b < nb; b++) {
        lay->block_offset[b] = h->blocks[b].offset;
        lay->block_len[b] = h->blocks[b].numel;
        lay->checkpointed[b] = ckpt_layers && b >= 1 && b <= h->nlayers && ckpt_layers[b - 1];
        lay->reads_weights[b] = b != 0 || h->embedding_reads_weights;
    }
    for (int i = 0; i < nt; i++) {
        const zt_param_info *t = &h->tensors[i];
        lay->tensors[i] = (zt_model_tensor){.block = t->block, .offset = t->offset, .len = t->numel,
                                            .host_offset = t->offset, .numel = t->numel,
                                            .weight_decay = t->weight_decay};
    }
    base->backend = ZT_MODEL_CPU;
    base->dtype = ZT_DTYPE_F32;
    base->nblocks = nb;
    base->head_block = h->head_block;
    base->block_offset = lay->block_offset;
    base->block_len = lay->block_len;
    base->checkpointed = lay->checkpointed;
    base->backward_reads_weights = lay->reads_weights;
    base->ntensors = nt;
    base->tensors = lay->tensors;
    base->host_numel = h->num_params;
    base->max_B = h->max_B;
    base->max_T = h->max_T;
    base->max_micro = max_micro;
}

void zt__cpu_layout_free(zt__cpu_layout *lay)
{
    free(lay->block_offset);
    free(lay->block_len);
    free(lay->checkpointed);
    free(lay->reads_weights);
    free(lay->tensors);
}
