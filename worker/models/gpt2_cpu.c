/* GPT-2 on the CPU as the training engine drives it (worker/models/model.h): the host model's per-block
 * passes (worker/models/gpt2.h) behind the model interface. The host model's layout is the engine's. */
#include <stdlib.h>

#include "common/log.h"
#include "worker/models/gpt2.h"
#include "worker/models/cpu_layout.h"
#include "worker/models/model.h"

typedef struct gpt2_cpu {
    zt_model base;           /* first member: a zt_model * is a gpt2_cpu * */
    zt_gpt2 *host;           /* borrowed */
    const int32_t *targets;  /* of the micro-batch begun last (the caller's array) */
    int micro;               /* its number */
    float scale;             /* the gradient scale given to head */
    float *micro_loss;       /* [max_micro] mean loss of each micro-batch */
    zt__cpu_layout lay;      /* the tables base points at */
} gpt2_cpu;

static void cpu_destroy(zt_model *base)
{
    gpt2_cpu *m = (gpt2_cpu *)base;
    free(m->micro_loss);
    zt__cpu_layout_free(&m->lay);
    free(m);
}

static void cpu_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro)
{
    gpt2_cpu *m = (gpt2_cpu *)base;
    ZT_ASSERT(micro >= 0 && micro < base->max_micro);
    zt_gpt2_forward_begin(m->host, tokens, B, T);
    m->targets = targets;
    m->micro = micro;
    m->micro_loss[micro] = 0.0f;
}

static void cpu_forward(zt_model *base, int b, const void *w)
{
    zt_gpt2_forward_block(((gpt2_cpu *)base)->host, b, w);
}

static void cpu_discard(zt_model *base, int b)
{
    zt_gpt2_discard_block_acts(((gpt2_cpu *)base)->host, b);
}

static void cpu_head(zt_model *base, const void *w, float scale)
{
    gpt2_cpu *m = (gpt2_cpu *)base;
    m->micro_loss[m->micro] = zt_gpt2_forward_head(m->host, w, m->targets);
    m->scale = scale;
}

static void cpu_head_backward(zt_model *base, const void *w, void *g)
{
    gpt2_cpu *m = (gpt2_cpu *)base;
    zt_gpt2_backward_head(m->host, w, g, m->scale);
}

static void cpu_backward(zt_model *base, int b, const void *w, void *g)
{
    zt_gpt2_backward_block(((gpt2_cpu *)base)->host, b, w, g);
}

static float cpu_loss(const zt_model *base, int micro)
{
    return ((const gpt2_cpu *)base)->micro_loss[micro];
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

/* Wraps a host model for the engine; see gpt2.h. */
int zt_gpt2_model_cpu(zt_model **out, zt_gpt2 *host, int max_micro, const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    if (max_micro < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum must be at least 1 (it is %d)", max_micro);
    const zt_gpt2_config *cfg = zt_gpt2_get_config(host);
    gpt2_cpu *m = zt_xcalloc(1, sizeof *m);
    const int nb = zt_gpt2_num_blocks(host), nt = zt_gpt2_num_tensors(host);
    m->host = host;
    m->micro_loss = zt_xcalloc((size_t)max_micro, sizeof(float));
    const zt__cpu_host h = {.blocks = zt_gpt2_block(host, 0), .nblocks = nb, .tensors = zt_gpt2_tensor(host, 0),
                            .ntensors = nt, .nlayers = cfg->n_layer, .embedding_reads_weights = false,
                            .head_block = 0, .num_params = zt_gpt2_num_params(host),
                            .max_B = zt_gpt2_max_batch(host), .max_T = zt_gpt2_max_seq(host)};
    zt_model *base = &m->base;
    zt__cpu_layout_init(base, &m->lay, &h, ckpt_layers, max_micro);
    base->ops = &cpu_ops;
    *out = base;
    return 0;
}
