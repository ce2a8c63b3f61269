/* LLaMA on the CPU as the training engine drives it (worker/models/model.h): the host model's per-block
 * passes (worker/models/llama.h) behind the model interface. The host model's layout is the engine's; the
 * head reads block zt_llama_head_block (embed_tokens when tied, lm_head in the last block when not). */
#include <stdlib.h>

#include "common/log.h"
#include "worker/models/llama.h"
#include "worker/models/cpu_layout.h"
#include "worker/models/model.h"

typedef struct llama_cpu {
    zt_model base;           /* first member: a zt_model * is a llama_cpu * */
    zt_llama *host;          /* borrowed */
    const int32_t *targets;  /* of the micro-batch begun last (the caller's array) */
    int micro;               /* its number */
    float scale;             /* the gradient scale given to head */
    float *micro_loss;       /* [max_micro] mean loss of each micro-batch */
    zt__cpu_layout lay;      /* the tables base points at */
} llama_cpu;

static void cpu_destroy(zt_model *base)
{
    llama_cpu *m = (llama_cpu *)base;
    free(m->micro_loss);
    zt__cpu_layout_free(&m->lay);
    free(m);
}

static void cpu_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro)
{
    llama_cpu *m = (llama_cpu *)base;
    ZT_ASSERT(micro >= 0 && micro < base->max_micro);
    zt_llama_forward_begin(m->host, tokens, B, T);
    m->targets = targets;
    m->micro = micro;
    m->micro_loss[micro] = 0.0f;
}

static void cpu_forward(zt_model *base, int b, const void *w)
{
    zt_llama_forward_block(((llama_cpu *)base)->host, b, w);
}

static void cpu_discard(zt_model *base, int b)
{
    zt_llama_discard_block_acts(((llama_cpu *)base)->host, b);
}

static void cpu_head(zt_model *base, const void *w, float scale)
{
    llama_cpu *m = (llama_cpu *)base;
    m->micro_loss[m->micro] = zt_llama_forward_head(m->host, w, m->targets);
    m->scale = scale;
}

static void cpu_head_backward(zt_model *base, const void *w, void *g)
{
    llama_cpu *m = (llama_cpu *)base;
    zt_llama_backward_head(m->host, w, g, m->scale);
}

static void cpu_backward(zt_model *base, int b, const void *w, void *g)
{
    zt_llama_backward_block(((llama_cpu *)base)->host, b, w, g);
}

static float cpu_loss(const zt_model *base, int micro)
{
    return ((const llama_cpu *)base)->micro_loss[micro];
}

static const zt_model_ops cpu_ops = {
    .destroy = cpu_destroy,
    .begin = cpu_begin,
    .forward = cpu_forward,
    .discard = cpu_discard,
    .head = cpu_head,
    .head_backward = cpu_head_backward,
    .backward = cpu_backward,
    .loss = cpu_loss,
};

/* Wraps a host model for the engine; see llama.h. */
int zt_llama_model_cpu(zt_model **out, zt_llama *host, int max_micro, const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    if (max_micro < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum must be at least 1 (it is %d)", max_micro);
    const zt_llama_config *cfg = zt_llama_get_config(host);
    llama_cpu *m = zt_xcalloc(1, sizeof *m);
    const int nb = zt_llama_num_blocks(host), nt = zt_llama_num_tensors(host);
    m->host = host;
    m->micro_loss = zt_xcalloc((size_t)max_micro, sizeof(float));
    const zt__cpu_host h = {.blocks = zt_llama_block(host, 0), .nblocks = nb, .tensors = zt_llama_tensor(host, 0),
                            .ntensors = nt, .nlayers = cfg->num_hidden_layers, .embedding_reads_weights = false,
                            .head_block = zt_llama_head_block(host), .num_params = zt_llama_num_params(host),
                            .max_B = zt_llama_max_batch(host), .max_T = zt_llama_max_seq(host)};
    zt_model *base = &m->base;
    zt__cpu_layout_init(base, &m->lay, &h, ckpt_layers, max_micro);
    base->ops = &cpu_ops;
    *out = base;
    return 0;
}
