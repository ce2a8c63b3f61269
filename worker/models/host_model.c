/* The host model of a family from its spec; see host_model.h. */
#include "worker/models/host_model.h"

#include <limits.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"          /* the initialisation of a large model is logged */
#include "common/memory.h"       /* huge pages for the slabs */
#include "kernels/cpu_threads.h" /* the thread count in the initialisation's log line */
#include "worker/models/tensor_table.h" /* the tensors as data */

struct zt__hm {
    const zt__hm_spec *spec;
    alignas(max_align_t) unsigned char cfg[ZT_FAMILY_CONFIG_BYTES];
    int max_B, max_T;
    size_t num_params;
    int num_tensors;
    zt_param_info *tensors; /* [num_tensors] */
    int num_blocks;         /* L + 2 */
    zt_block_info *blocks;  /* [num_blocks] */
    int head_block;         /* 0 when the head reads the embedding, L+1 when not */
    float *params, *grads;  /* [num_params] each; NULL for a layout */
    float *inv_freq;        /* [rot/2] with arch.rope */
    zt__dec_arch arch;
    zt__enc_arch earch;     /* with spec->enc_arch */
    zt__dec_cpu *run;       /* the decoder's CPU runner; NULL for a layout and for the other programs */
    const zt__hm_passes *passes; /* the encoder runner's or the family's own; NULL for the decoder */
    void *state;            /* their state */
    zt_rng init_rng;        /* a lazy initialisation's generator, at tensor init_next */
    int init_next;          /* the first tensor not initialised yet (num_tensors: all are) */
    bool *init_skip;        /* [num_tensors] or NULL: tensors the lazy initialisation leaves (zt__hm_skip_init) */
};

/* The encoder program's CPU runner as passes of the host model; a layout needs none. */
static int enc_create(void **out, const void *mv, bool acts, zt_err *err)
{
    const zt__hm *m = mv;
    *out = NULL;
    return acts ? zt__enc_cpu_create((zt__enc_cpu **)out, &m->earch, m->tensors, m->blocks, m->max_B, m->max_T, err)
                : 0;
}

static const zt__hm_passes enc_passes = {
    .create = enc_create, .destroy = zt__enc_cpu_destroy, .forward_begin = zt__enc_cpu_begin,
    .forward_block = zt__enc_cpu_forward_block, .forward_head = zt__enc_cpu_forward_head,
    .backward_head = zt__enc_cpu_backward_head, .backward_block = zt__enc_cpu_backward_block,
    .discard_block = zt__enc_cpu_discard_block, .logits = zt__enc_cpu_logits};

/* The index of block b's first tensor. */
static int first_tensor(const zt__hm *m, int b)
{
    int i = 0;
    while (m->tensors[i].block != b)
        i++;
    return i;
}

/* What the tensor table says of the program's tensors: a layer's roles, where layer 0 starts, the roles of
 * the embeddings (the encoder's) and of the final block. */
static void dec_roles(zt__hm *m, const void *cfg)
{
    zt__dec_arch *a = &m->arch;
    int fin[ZT__DEC_FINAL_ROLES];
    a->per_layer = zt__tt_layer_roles(m->spec->table, cfg, a->role, ZT__DEC_ROLES, a->packed);
    a->layer0 = first_tensor(m, 1);
    zt__tt_block_roles(m->spec->table, cfg, m->num_blocks - 1, fin, ZT__DEC_FINAL_ROLES);
    a->final_w = fin[ZT__DEC_FINAL_W];
    a->final_b = fin[ZT__DEC_FINAL_B];
    a->head_tensor = fin[ZT__DEC_HEAD] >= 0 ? fin[ZT__DEC_HEAD] : 0; /* tied: the token embedding */
}

static void enc_roles(zt__hm *m, const void *cfg)
{
    zt__enc_arch *a = &m->earch;
    a->per_layer = zt__tt_layer_roles(m->spec->table, cfg, a->role, ZT__ENC_ROLES, a->packed);
    a->layer0 = first_tensor(m, 1);
    zt__tt_block_roles(m->spec->table, cfg, 0, a->emb, ZT__ENC_E_ROLES);
    zt__tt_block_roles(m->spec->table, cfg, m->num_blocks - 1, a->head_t, ZT__ENC_H_ROLES);
    if (a->head == ZT__ENC_HEAD_MLM) /* the decoder is the word embeddings */
        a->head_t[ZT__ENC_H_OUT_W] = a->emb[ZT__ENC_E_WORD];
}

/* The tables of cfg without slabs; NULL when out of memory. */
static zt__hm *new_tables(const zt__hm_spec *spec, const void *cfg, int B, int T)
{
    ZT_ASSERT(spec->config_size <= ZT_FAMILY_CONFIG_BYTES);
    zt__hm *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->spec = spec;
    memcpy(m->cfg, cfg, spec->config_size);
    m->max_B = B;
    m->max_T = T;
    m->num_tensors = zt__tt_count(spec->table, cfg);
    zt_family_shape shape;
    spec->def->config_shape(cfg, &shape);
    m->num_blocks = shape.layers + 2;
    m->tensors = calloc((size_t)m->num_tensors, sizeof *m->tensors);
    m->blocks = calloc((size_t)m->num_blocks, sizeof *m->blocks);
    if (!m->tensors || !m->blocks) {
        zt__hm_destroy(m);
        return NULL;
    }
    m->num_params = zt__tt_layout(spec->table, cfg, m->tensors, m->blocks);
    ZT_ASSERT(m->num_params == shape.num_params);
    if (spec->enc_arch) {
        spec->enc_arch(cfg, &m->earch);
        enc_roles(m, cfg);
        m->passes = &enc_passes;
        m->head_block = m->earch.head_block;
        return m;
    }
    if (spec->passes) {
        m->passes = spec->passes;
        m->head_block = spec->head_block(cfg);
        return m;
    }
    spec->arch(cfg, &m->arch);
    dec_roles(m, cfg);
    m->head_block = m->tensors[m->arch.head_tensor].block;
    if (m->arch.rope) {
        ZT_ASSERT(m->arch.rot > 0 && m->arch.rot <= m->arch.HS && m->arch.rot % 2 == 0);
        if (!(m->inv_freq = calloc((size_t)m->arch.rot / 2, sizeof *m->inv_freq))) {
            zt__hm_destroy(m);
            return NULL;
        }
        ZT_ASSERT(zt_rope_inv_freq(m->inv_freq, m->arch.rot, &m->arch.rope_cfg, NULL) == 0); /* validated */
    }
    return m;
}

int zt__hm_create_layout(zt__hm **out, const zt__hm_spec *spec, const void *cfg, zt_err *err)
{
    *out = NULL;
    int rc = zt__family_validate(spec->def, cfg, err);
    if (rc < 0)
        return rc;
    if (!(*out = new_tables(spec, cfg, 1, 1)))
        return zt_fail(err, ZT_ENOMEM, "out of memory creating the model's tables");
    if ((*out)->passes && (rc = (*out)->passes->create(&(*out)->state, *out, false, err)) < 0) {
        zt__hm_destroy(*out);
        *out = NULL;
        return rc;
    }
    return 0;
}

/* Whether the tensors' blocks never decrease in table order (a tensor table lays them out so), so that blocks
 * are filled in order by filling tensors in order. */
static bool blocks_in_order(const zt__hm *m)
{
    for (int i = 1; i < m->num_tensors; i++)
        if (m->tensors[i].block < m->tensors[i - 1].block)
            return false;
    return true;
}

static int create(zt__hm **out, const zt__hm_spec *spec, const void *cfg, int B, int T, uint64_t seed, bool lazy,
                  zt_err *err)
{
    *out = NULL;
    int rc = zt__family_validate(spec->def, cfg, err);
    if (rc < 0)
        return rc;
    zt_family_shape shape;
    spec->def->config_shape(cfg, &shape);
    if (B < 1 || T < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG, "batch size (%d) and sequence length (%d) must be at least 1", B, T);
    if (spec->check_batch) {
        if ((rc = spec->check_batch(cfg, B, T, err)) < 0)
            return rc;
    } else if (T > shape.positions)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "sequence length %d exceeds the model's %s %d (use a sequence length of at most %d)", T,
                       spec->positions_key ? spec->positions_key : "max_position_embeddings", shape.positions,
                       shape.positions);
    zt__hm *m = new_tables(spec, cfg, B, T);
    if (!m)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating the model's tables");
    const int64_t widest = m->arch.V > zt__dec_up_width(&m->arch) ? m->arch.V : zt__dec_up_width(&m->arch);
    if (!m->passes && ((int64_t)B * T > INT_MAX || (int64_t)B * T * widest > (int64_t)1 << 50)) {
        zt__hm_destroy(m);
        return zt_fail(err, ZT_EINVAL_CONFIG, "batch size %d x sequence length %d is too large for this model", B, T);
    }
    const size_t param_bytes = m->num_params * sizeof(float);
    m->params = malloc(param_bytes);
    m->grads = calloc(m->num_params, sizeof(float));
    zt_advise_huge_pages(m->params, param_bytes); /* the slabs of a large model fault in 2 MiB pages */
    zt_advise_huge_pages(m->grads, param_bytes);
    if (!m->params || !m->grads) {
        rc = zt_fail(err, ZT_ENOMEM, "out of memory: parameters and gradients need %.1f MiB (choose a smaller model)",
                     2.0 * (double)param_bytes / (1 << 20));
        goto err;
    }
    if (m->passes)
        rc = m->passes->create(&m->state, m, true, err);
    else
        rc = zt__dec_cpu_create(&m->run, &m->arch, m->tensors, m->blocks, B, T, m->inv_freq, err);
    if (rc < 0)
        goto err;
    zt_rng_seed(&m->init_rng, seed);
    if (lazy) { /* zt__hm_init_through fills the blocks */
        ZT_ASSERT(blocks_in_order(m));
        if (m->num_params >= ((size_t)100 << 20))
            zt_log(ZT_LOG_INFO, "model: %.2fM parameters initialised block by block as they are taken (seed %llu)",
                   (double)m->num_params / 1e6, (unsigned long long)seed);
        *out = m;
        return 0;
    }
    if (m->num_params >= ((size_t)100 << 20)) /* a few seconds of work: say what it is */
        zt_log(ZT_LOG_INFO, "model: initialising %.2fM parameters (seed %llu, %d threads)", (double)m->num_params / 1e6,
               (unsigned long long)seed, zt_cpu_get_threads());
    zt__tt_init(spec->table, m->cfg, m->tensors, m->num_tensors, m->params, seed);
    m->init_next = m->num_tensors;
    *out = m;
    return 0;
err:
    zt__hm_destroy(m);
    return rc;
}

int zt__hm_create(zt__hm **out, const zt__hm_spec *spec, const void *cfg, int B, int T, uint64_t seed, zt_err *err)
{
    return create(out, spec, cfg, B, T, seed, false, err);
}

int zt__hm_create_lazy(zt__hm **out, const zt__hm_spec *spec, const void *cfg, int B, int T, uint64_t seed,
                       zt_err *err)
{
    return create(out, spec, cfg, B, T, seed, true, err);
}

void zt__hm_init_through(void *mv, int block)
{
    zt__hm *m = mv;
    int end = m->init_next;
    while (end < m->num_tensors && m->tensors[end].block <= block)
        end++;
    if (end == m->init_next)
        return;
    zt__tt_init_range(m->spec->table, m->cfg, m->tensors, m->num_tensors, m->params, m->init_skip, &m->init_rng,
                      m->init_next, end);
    m->init_next = end;
}

void zt__hm_skip_init(void *mv, const bool *skip)
{
    zt__hm *m = mv;
    free(m->init_skip);
    m->init_skip = NULL;
    if (skip) {
        m->init_skip = zt_xmalloc((size_t)m->num_tensors * sizeof *m->init_skip);
        memcpy(m->init_skip, skip, (size_t)m->num_tensors * sizeof *m->init_skip);
    }
}

void zt__hm_tensor_values(const void *mv, int i, float *dst)
{
    const zt__hm *m = mv;
    ZT_ASSERT(i >= 0 && i < m->num_tensors);
    const zt_param_info *t = &m->tensors[i];
    if (i < m->init_next)
        memcpy(dst, m->params + t->offset, t->numel * sizeof(float));
    else
        zt__tt_init_values(m->spec->table, m->cfg, m->tensors, m->num_tensors, &m->init_rng, m->init_next, i, dst);
}

void zt__hm_destroy(void *mv)
{
    zt__hm *m = mv;
    if (!m)
        return;
    zt__dec_cpu_destroy(m->run);
    if (m->passes)
        m->passes->destroy(m->state);
    free(m->tensors);
    free(m->init_skip);
    free(m->blocks);
    free(m->inv_freq);
    free(m->params);
    free(m->grads);
    free(m);
}

const void *zt__hm_config(const void *m) { return ((const zt__hm *)m)->cfg; }
const struct zt__tt *zt__hm_table(const void *m) { return ((const zt__hm *)m)->spec->table; }
const zt__dec_arch *zt__hm_arch(const void *m) { return &((const zt__hm *)m)->arch; }
void *zt__hm_state(const void *m) { return ((const zt__hm *)m)->state; }
size_t zt__hm_num_params(const void *m) { return ((const zt__hm *)m)->num_params; }
int zt__hm_num_tensors(const void *m) { return ((const zt__hm *)m)->num_tensors; }
int zt__hm_num_blocks(const void *m) { return ((const zt__hm *)m)->num_blocks; }
int zt__hm_head_block(const void *m) { return ((const zt__hm *)m)->head_block; }
int zt__hm_max_batch(const void *m) { return ((const zt__hm *)m)->max_B; }
int zt__hm_max_seq(const void *m) { return ((const zt__hm *)m)->max_T; }
float *zt__hm_params(void *m) { return ((zt__hm *)m)->params; }
float *zt__hm_grads(void *m) { return ((zt__hm *)m)->grads; }

const zt_param_info *zt__hm_tensor(const void *mv, int i)
{
    const zt__hm *m = mv;
    ZT_ASSERT(i >= 0 && i < m->num_tensors);
    return &m->tensors[i];
}

void zt__hm_set_token_types(void *m, const int32_t *types)
{
    ZT_ASSERT(((const zt__hm *)m)->spec->enc_arch);
    zt__enc_cpu_set_token_types(zt__hm_state(m), types);
}

void zt__hm_accuracy(const void *m, int *correct, int *counted)
{
    ZT_ASSERT(((const zt__hm *)m)->spec->enc_arch);
    zt__enc_cpu_accuracy(zt__hm_state(m), correct, counted);
}

const zt_block_info *zt__hm_block(const void *mv, int i)
{
    const zt__hm *m = mv;
    ZT_ASSERT(i >= 0 && i < m->num_blocks);
    return &m->blocks[i];
}

/* The slab reads as zeros and takes memory again only where written (an export). */
void zt__hm_release_params(void *mv)
{
    zt__hm *m = mv;
    free(m->params);
    m->params = calloc(m->num_params ? m->num_params : 1, sizeof(float));
    ZT_ASSERT(m->params); /* calloc of untouched pages */
}

/* The per-block passes: the family's own, or the decoder program's CPU runner. */
#define PASSES(m) (((const zt__hm *)(m))->passes)
void zt__hm_forward_begin(void *m, const int32_t *tok, int B, int T, const int32_t *pos)
{
    if (PASSES(m))
        PASSES(m)->forward_begin(((zt__hm *)m)->state, tok, B, T, pos);
    else
        zt__dec_cpu_begin(((zt__hm *)m)->run, tok, B, T, pos);
}
void zt__hm_forward_block(void *m, int b, const float *w)
{
    if (PASSES(m))
        PASSES(m)->forward_block(((zt__hm *)m)->state, b, w);
    else
        zt__dec_cpu_forward_block(((zt__hm *)m)->run, b, w);
}
float zt__hm_forward_head(void *m, const float *w, const int32_t *t)
{
    return PASSES(m) ? PASSES(m)->forward_head(((zt__hm *)m)->state, w, t)
                     : zt__dec_cpu_forward_head(((zt__hm *)m)->run, w, t);
}
void zt__hm_backward_head(void *m, const float *w, float *g, float s)
{
    if (PASSES(m))
        PASSES(m)->backward_head(((zt__hm *)m)->state, w, g, s);
    else
        zt__dec_cpu_backward_head(((zt__hm *)m)->run, w, g, s);
}
void zt__hm_backward_block(void *m, int b, const float *w, float *g)
{
    if (PASSES(m))
        PASSES(m)->backward_block(((zt__hm *)m)->state, b, w, g);
    else
        zt__dec_cpu_backward_block(((zt__hm *)m)->run, b, w, g);
}
void zt__hm_discard_block(void *m, int b)
{
    if (PASSES(m))
        PASSES(m)->discard_block(((zt__hm *)m)->state, b);
    else
        zt__dec_cpu_discard_block(((zt__hm *)m)->run, b);
}
const float *zt__hm_logits(const void *m)
{
    return PASSES(m) ? PASSES(m)->logits(((const zt__hm *)m)->state) : zt__dec_cpu_logits(((const zt__hm *)m)->run);
}
#undef PASSES

float zt__hm_forward_rest(void *mv, const int32_t *targets)
{
    zt__hm *m = mv;
    for (int b = 0; b < m->num_blocks; b++)
        zt__hm_forward_block(m, b, m->params + m->blocks[b].offset);
    return zt__hm_forward_head(m, m->params + m->blocks[m->head_block].offset, targets);
}

void zt__hm_backward(void *mv, float loss_scale)
{
    zt__hm *m = mv;
    const size_t h = m->blocks[m->head_block].offset;
    zt__hm_backward_head(m, m->params + h, m->grads + h, loss_scale);
    for (int b = m->num_blocks - 1; b >= 0; b--)
        zt__hm_backward_block(m, b, m->params + m->blocks[b].offset, m->grads + m->blocks[b].offset);
}

void zt__hm_zero_grad(void *mv)
{
    zt__hm *m = mv;
    memset(m->grads, 0, m->num_params * sizeof(float));
}

#ifdef ZT_WITH_CUDA
static zt__dec_model dec_model(const zt__hm *m)
{
    return (zt__dec_model){.arch = &m->arch, .tensors = m->tensors, .ntensors = m->num_tensors,
                           .nblocks = m->num_blocks, .head_block = m->head_block, .num_params = m->num_params,
                           .inv_freq = m->inv_freq};
}

static zt__enc_model enc_model(const zt__hm *m)
{
    return (zt__enc_model){.arch = &m->earch, .tensors = m->tensors, .ntensors = m->num_tensors,
                           .nblocks = m->num_blocks, .num_params = m->num_params};
}

int zt__hm_cuda_create(struct zt_model **out, const void *mv, int B, int T, int max_micro, enum zt_dtype dtype,
                       const bool *ckpt_layers, zt_err *err)
{
    const zt__hm *m = mv;
    ZT_ASSERT(!m->spec->passes); /* a family with its own passes has its own executor */
    if (m->spec->enc_arch) {
        const zt__enc_model e = enc_model(m);
        return zt__enc_cuda_create(out, &e, B, T, max_micro, dtype, ckpt_layers, err);
    }
    const zt__dec_model d = dec_model(m);
    return zt__dec_cuda_create(out, &d, B, T, max_micro, dtype, ckpt_layers, err);
}

struct zt_model *zt__hm_cuda_shape(const void *mv, int B, int T, int max_micro, enum zt_dtype dtype,
                                   const bool *ckpt_layers)
{
    const zt__hm *m = mv;
    ZT_ASSERT(!m->spec->passes);
    if (m->spec->enc_arch) {
        const zt__enc_model e = enc_model(m);
        return zt__enc_cuda_shape(&e, B, T, max_micro, dtype, ckpt_layers);
    }
    const zt__dec_model d = dec_model(m);
    return zt__dec_cuda_shape(&d, B, T, max_micro, dtype, ckpt_layers);
}
#endif

/* ---- field tables ---- */

static bool is_real(const zt__hm_field *f)
{
    return f->kind == ZT__HM_FLOAT || f->kind == ZT__HM_DOUBLE;
}

/* Field f of cfg as a double (every kind's values are exact in one). */
static double field_value(const zt__hm_field *f, const void *cfg)
{
    const char *p = (const char *)cfg + f->offset;
    switch (f->kind) {
    case ZT__HM_INT: return *(const int *)p;
    case ZT__HM_ENUM: return (double)*(const int *)p; /* enums are int-sized here (C11 6.7.2.2) */
    case ZT__HM_BOOL: return *(const bool *)p;
    case ZT__HM_FLOAT: return *(const float *)p;
    case ZT__HM_DOUBLE: return *(const double *)p;
    }
    return 0;
}

/* v as the field's kind writes it: a float's or double's shortest decimal that reads back as the same value. */
static void field_text(const zt__hm_field *f, double v, char *buf, size_t cap)
{
    if (f->kind == ZT__HM_BOOL) {
        snprintf(buf, cap, "%s", v != 0 ? "true" : "false");
        return;
    }
    if (!is_real(f)) {
        snprintf(buf, cap, "%lld", (long long)v);
        return;
    }
    char text[40];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        const double back = strtod(text, NULL);
        if (f->kind == ZT__HM_FLOAT ? (float)back == (float)v : back == v)
            break;
    }
    snprintf(buf, cap, "%s", text);
}

const char *zt__hm_config_diff(const zt__hm_field *fields, int n, const void *a, const void *b, char *av, char *bv,
                               size_t cap)
{
    for (int i = 0; i < n; i++) {
        const double x = field_value(&fields[i], a), y = field_value(&fields[i], b);
        if (!fields[i].hash_only && x != y) {
            field_text(&fields[i], x, av, cap);
            field_text(&fields[i], y, bv, cap);
            return fields[i].name;
        }
    }
    return NULL;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

uint64_t zt__hm_config_fingerprint(const zt__hm_field *fields, int n, int64_t family_number, const void *cfg)
{
    uint64_t h = fnv(14695981039346656037ULL, &family_number, sizeof family_number);
    for (int i = 0; i < n; i++)
        if (!is_real(&fields[i])) {
            const int64_t v = (int64_t)field_value(&fields[i], cfg);
            h = fnv(h, &v, sizeof v);
        }
    for (int i = 0; i < n; i++)
        if (is_real(&fields[i])) {
            const double v = field_value(&fields[i], cfg);
            h = fnv(h, &v, sizeof v);
        }
    return h;
}

void zt__hm_add_tensor(zt_param_info *t, int block, size_t *offset, const char *name, int64_t d0, int64_t d1,
                       bool decay)
{
    memset(t, 0, sizeof *t);
    int n = snprintf(t->name, sizeof t->name, "%s", name);
    ZT_ASSERT(n > 0 && (size_t)n < sizeof t->name);
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 0;
    t->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    t->offset = *offset;
    t->block = block;
    t->weight_decay = decay;
    *offset += t->numel;
}
