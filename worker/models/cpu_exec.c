/* The CPU executor of every family, and what the CPU runners share; see cpu_exec.h. */
#include "worker/models/cpu_exec.h"

#include <stdlib.h>

#include "common/memory.h" /* huge pages for the activation slab */
#include "kernels/crossentropy.h"

#include "worker/models/family.h"

typedef struct cpu_exec {
    zt_model base;                 /* first member: a zt_model * is a cpu_exec * */
    const zt_family_def *def;
    void *host;                    /* borrowed */
    const int32_t *targets;        /* of the micro-batch begun last (the caller's array) */
    int micro;                     /* its number */
    float scale;                   /* the gradient scale given to head */
    float *micro_loss;             /* [max_micro] mean loss of each micro-batch */
    int *micro_correct, *micro_counted; /* [max_micro] for families that count accuracy */
    /* The tables base points at. */
    size_t *block_offset, *block_len;
    bool *checkpointed, *reads_weights;
    zt_model_tensor *tensors;
    zt_model_ops ops;              /* the calls, with the optional ones the family offers */
} cpu_exec;

static void cpu_destroy(zt_model *base)
{
    cpu_exec *m = (cpu_exec *)base;
    free(m->micro_loss);
    free(m->micro_correct);
    free(m->micro_counted);
    free(m->block_offset);
    free(m->block_len);
    free(m->checkpointed);
    free(m->reads_weights);
    free(m->tensors);
    free(m);
}

static void cpu_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro,
                      const zt_model_docs *docs)
{
    cpu_exec *m = (cpu_exec *)base;
    ZT_ASSERT(micro >= 0 && micro < base->max_micro);
    m->def->forward_begin(m->host, tokens, B, T, docs ? docs->pos : NULL);
    m->targets = targets;
    m->micro = micro;
    m->micro_loss[micro] = 0.0f;
    m->micro_correct[micro] = m->micro_counted[micro] = 0;
}

static void cpu_forward(zt_model *base, int b, const void *w)
{
    cpu_exec *m = (cpu_exec *)base;
    m->def->forward_block(m->host, b, w);
}

static void cpu_discard(zt_model *base, int b)
{
    cpu_exec *m = (cpu_exec *)base;
    m->def->discard_block(m->host, b);
}

static void cpu_head(zt_model *base, const void *w, float scale)
{
    cpu_exec *m = (cpu_exec *)base;
    m->micro_loss[m->micro] = m->def->forward_head(m->host, w, m->targets);
    if (m->def->accuracy)
        m->def->accuracy(m->host, &m->micro_correct[m->micro], &m->micro_counted[m->micro]);
    m->scale = scale;
}

static void cpu_head_backward(zt_model *base, const void *w, void *g)
{
    cpu_exec *m = (cpu_exec *)base;
    m->def->backward_head(m->host, w, g, m->scale);
}

static void cpu_backward(zt_model *base, int b, const void *w, void *g)
{
    cpu_exec *m = (cpu_exec *)base;
    m->def->backward_block(m->host, b, w, g);
}

static float cpu_loss(const zt_model *base, int micro)
{
    return ((const cpu_exec *)base)->micro_loss[micro];
}

static void cpu_set_token_types(zt_model *base, const int32_t *types)
{
    cpu_exec *m = (cpu_exec *)base;
    m->def->set_token_types(m->host, types);
}

static void cpu_set_seq2seq(zt_model *base, const zt_model_seq2seq *s)
{
    cpu_exec *m = (cpu_exec *)base;
    m->def->set_seq2seq(m->host, s);
}

static void cpu_accuracy(zt_model *base, int micro, int *correct, int *counted)
{
    cpu_exec *m = (cpu_exec *)base;
    *correct = m->micro_correct[micro];
    *counted = m->micro_counted[micro];
}

int zt__cpu_exec_create(zt_model **out, const zt_family_def *def, void *host, int max_micro, const bool *ckpt_layers,
                        zt_err *err)
{
    *out = NULL;
    if (max_micro < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum must be at least 1 (it is %d)", max_micro);
    zt_family_shape shape;
    def->config_shape(def->config(host), &shape);
    cpu_exec *m = zt_xcalloc(1, sizeof *m);
    m->def = def;
    m->host = host;
    m->micro_loss = zt_xcalloc((size_t)max_micro, sizeof(float));
    m->micro_correct = zt_xcalloc((size_t)max_micro, sizeof(int));
    m->micro_counted = zt_xcalloc((size_t)max_micro, sizeof(int));
    const int nb = def->num_blocks(host), nt = def->num_tensors(host);
    m->block_offset = zt_xcalloc((size_t)nb, sizeof(size_t));
    m->block_len = zt_xcalloc((size_t)nb, sizeof(size_t));
    m->checkpointed = zt_xcalloc((size_t)nb, sizeof(bool));
    m->reads_weights = zt_xcalloc((size_t)nb, sizeof(bool));
    m->tensors = zt_xcalloc((size_t)nt, sizeof(zt_model_tensor));
    for (int b = 0; b < nb; b++) {
        m->block_offset[b] = def->block(host, b)->offset;
        m->block_len[b] = def->block(host, b)->numel;
        m->checkpointed[b] = ckpt_layers && b >= 1 && b <= shape.layers && ckpt_layers[b - 1];
        m->reads_weights[b] = b != 0 || def->embedding_reads_weights;
    }
    for (int i = 0; i < nt; i++) {
        const zt_param_info *t = def->tensor(host, i);
        m->tensors[i] = (zt_model_tensor){.block = t->block, .offset = t->offset, .len = t->numel,
                                          .host_offset = t->offset, .numel = t->numel,
                                          .weight_decay = t->weight_decay};
    }
    zt_model *base = &m->base;
    m->ops = (zt_model_ops){.destroy = cpu_destroy, .begin = cpu_begin, .forward = cpu_forward,
                            .discard = cpu_discard, .head = cpu_head, .head_backward = cpu_head_backward,
                            .backward = cpu_backward, .loss = cpu_loss,
                            .set_token_types = def->set_token_types ? cpu_set_token_types : NULL,
                            .set_seq2seq = def->set_seq2seq ? cpu_set_seq2seq : NULL,
                            .accuracy = def->accuracy ? cpu_accuracy : NULL};
    base->ops = &m->ops;
    base->backend = ZT_MODEL_CPU;
    base->dtype = ZT_DTYPE_F32;
    base->nblocks = nb;
    base->head_block = def->head_block(host);
    base->block_offset = m->block_offset;
    base->block_len = m->block_len;
    base->checkpointed = m->checkpointed;
    base->backward_reads_weights = m->reads_weights;
    base->ntensors = nt;
    base->tensors = m->tensors;
    base->host_numel = def->num_params(host);
    base->max_B = def->max_batch(host);
    base->max_T = def->max_seq(host);
    base->max_micro = max_micro;
    *out = base;
    return 0;
}

/* ---- what the runners share ---- */

float zt__mean_loss(const float *losses, size_t n, int counted)
{
    if (counted == 0)
        return 0.0f;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += losses[i];
    return (float)(sum / counted);
}

float zt__cpu_loss_forward(zt__cpu_loss *l, const float *logits, int rows, int K)
{
    l->rows = rows;
    l->K = K;
    l->counted = zt_cpu_crossentropy_forward_backward(l->losses, NULL, logits, l->targets, rows, K, -1, 0.0f);
    l->have_targets = true;
    return zt__mean_loss(l->losses, (size_t)rows, l->counted);
}

bool zt__cpu_loss_backward(zt__cpu_loss *l, float *logits, float loss_scale)
{
    ZT_ASSERT(l->have_targets); /* backward needs a forward pass with targets, once */
    l->have_targets = false;
    l->skip = l->counted == 0;
    if (l->skip)
        return false;
    /* dlogits replace the logits in place (the kernel allows the alias) */
    zt_cpu_crossentropy_forward_backward(l->losses, logits, logits, l->targets, l->rows, l->K, -1,
                                         loss_scale / (float)l->counted);
    return true;
}

void zt__cpu_runner_init(zt__cpu_runner *c, const zt_param_info *tensors, const zt_block_info *blocks, int B,
                         int T)
{
    c->tensors = tensors;
    c->blocks = blocks;
    c->max_B = B;
    c->max_T = T;
}

int zt__cpu_runner_open(zt__cpu_runner *c, size_t slab_bytes, size_t io_ints, int widest, zt_err *err)
{
    c->slab = malloc(slab_bytes);
    c->io = malloc(io_ints * sizeof(int32_t));
    if (!c->slab || !c->io)
        return zt_fail(err, ZT_ENOMEM,
                       "out of memory: activations for batch %d x %d need %.1f MiB (lower the batch size or sequence "
                       "length)", c->max_B, c->max_T, (double)slab_bytes / (1 << 20));
    zt_advise_huge_pages(c->slab, slab_bytes);
    /* the unfused compositions' scratch: the widest linear output or GELU output */
    zt__ops_cpu_init(&c->ops, (size_t)c->max_B * c->max_T, (size_t)widest);
    return 0;
}

void zt__cpu_runner_free(zt__cpu_runner *c)
{
    if (c->ops.ctx)
        zt__ops_cpu_free(&c->ops);
    free(c->slab);
    free(c->io);
}

void zt__cpu_runner_begin(zt__cpu_runner *c, int B, int T)
{
    ZT_ASSERT(B >= 1 && B <= c->max_B && T >= 1 && T <= c->max_T);
    c->B = B;
    c->T = T;
    c->loss.have_targets = false;
}

float *zt__cpu_in_block(const zt__cpu_runner *c, const float *bp, int idx)
{
    const zt_param_info *t = &c->tensors[idx];
    return (float *)bp + (t->offset - c->blocks[t->block].offset);
}
