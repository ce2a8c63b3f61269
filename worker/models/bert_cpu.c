/* BERT and RoBERTa on the CPU as the training engine drives it (worker/models/model.h): the host model's
 * per-block passes (worker/models/bert.h) behind the model interface. The host model's layout is the
 * engine's. */
#include <stdlib.h>

#include "common/log.h"
#include "worker/models/bert.h"
#include "worker/models/cpu_layout.h"
#include "worker/models/model.h"

typedef struct bert_cpu {
    zt_model base;           /* first member: a zt_model * is a bert_cpu * */
    zt_bert *host;           /* borrowed */
    const int32_t *targets;  /* of the micro-batch begun last (the caller's array) */
    int micro;               /* its number */
    float scale;             /* the gradient scale given to head */
    float *micro_loss;       /* [max_micro] mean loss of each micro-batch */
    int *micro_correct;      /* [max_micro] correct predictions of each micro-batch */
    int *micro_counted;      /* [max_micro] counted targets of each micro-batch */
    zt__cpu_layout lay;      /* the tables base points at */
} bert_cpu;

static void cpu_destroy(zt_model *base)
{
    bert_cpu *m = (bert_cpu *)base;
    free(m->micro_loss);
    free(m->micro_correct);
    free(m->micro_counted);
    zt__cpu_layout_free(&m->lay);
    free(m);
}

static void cpu_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro)
{
    bert_cpu *m = (bert_cpu *)base;
    ZT_ASSERT(micro >= 0 && micro < base->max_micro);
    zt_bert_forward_begin(m->host, tokens, B, T);
    m->targets = targets;
    m->micro = micro;
    m->micro_loss[micro] = 0.0f;
    m->micro_correct[micro] = m->micro_counted[micro] = 0;
}

static void cpu_forward(zt_model *base, int b, const void *w)
{
    zt_bert_forward_block(((bert_cpu *)base)->host, b, w);
}

static void cpu_discard(zt_model *base, int b)
{
    zt_bert_discard_block_acts(((bert_cpu *)base)->host, b);
}

static void cpu_head(zt_model *base, const void *w, float scale)
{
    bert_cpu *m = (bert_cpu *)base;
    m->micro_loss[m->micro] = zt_bert_forward_head(m->host, w, m->targets);
    zt_bert_accuracy(m->host, &m->micro_correct[m->micro], &m->micro_counted[m->micro]);
    m->scale = scale;
}

static void cpu_head_backward(zt_model *base, const void *w, void *g)
{
    bert_cpu *m = (bert_cpu *)base;
    zt_bert_backward_head(m->host, w, g, m->scale);
}

static void cpu_backward(zt_model *base, int b, const void *w, void *g)
{
    zt_bert_backward_block(((bert_cpu *)base)->host, b, w, g);
}

static float cpu_loss(const zt_model *base, int micro)
{
    return ((const bert_cpu *)base)->micro_loss[micro];
}

static void cpu_set_token_types(zt_model *base, const int32_t *types)
{
    zt_bert_set_token_types(((bert_cpu *)base)->host, types);
}

static void cpu_accuracy(zt_model *base, int micro, int *correct, int *counted)
{
    const bert_cpu *m = (const bert_cpu *)base;
    ZT_ASSERT(micro >= 0 && micro < base->max_micro);
    *correct = m->micro_correct[micro];
    *counted = m->micro_counted[micro];
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
    .set_token_types = cpu_set_token_types,
    .accuracy = cpu_accuracy,
};

/* Wraps a host model for the engine; see bert.h. */
int zt_bert_model_cpu(zt_model **out, zt_bert *host, int max_micro, const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    if (max_micro < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum must be at least 1 (it is %d)", max_micro);
    const zt_bert_config *cfg = zt_bert_get_config(host);
    bert_cpu *m = zt_xcalloc(1, sizeof *m);
    const int nb = zt_bert_num_blocks(host), nt = zt_bert_num_tensors(host);
    m->host = host;
    m->micro_loss = zt_xcalloc((size_t)max_micro, sizeof(float));
    m->micro_correct = zt_xcalloc((size_t)max_micro, sizeof(int));
    m->micro_counted = zt_xcalloc((size_t)max_micro, sizeof(int));
    const zt__cpu_host h = {.blocks = zt_bert_block(host, 0), .nblocks = nb, .tensors = zt_bert_tensor(host, 0),
                            .ntensors = nt, .nlayers = cfg->num_hidden_layers, .embedding_reads_weights = true,
                            .head_block = zt_bert_head_block(host), .num_params = zt_bert_num_params(host),
                            .max_B = zt_bert_max_batch(host), .max_T = zt_bert_max_seq(host)};
    zt_model *base = &m->base;
    zt__cpu_layout_init(base, &m->lay, &h, ckpt_layers, max_micro);
    base->ops = &cpu_ops;
    *out = base;
    return 0;
}
