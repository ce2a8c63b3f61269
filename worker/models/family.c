/* Model families: dispatch on the family; see family.h. */
#include "worker/models/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/json.h"
#include "worker/models/model.h"
#ifdef ZT_WITH_CUDA
#include "worker/models/gpt2_cuda.h"
#include "worker/models/llama_cuda.h"
#include "worker/models/bert_cuda.h"
#endif

struct zt_family_model {
    zt_family_config cfg;
    zt_gpt2 *gpt2;   /* family gpt2 */
    zt_llama *llama; /* family llama */
    zt_bert *bert;   /* family bert */
};

#define IS_LLAMA(c) ((c)->family == ZT_FAMILY_LLAMA)
#define IS_BERT(c) ((c)->family == ZT_FAMILY_BERT)
/* The expression for the family of config c: GPT-2's, LLaMA's or BERT's. */
#define BY_FAMILY(c, g, l, b) (IS_LLAMA(c) ? (l) : IS_BERT(c) ? (b) : (g))

const char *zt_family_name(enum zt_family f)
{
    switch (f) {
    case ZT_FAMILY_GPT2:
        return "gpt2";
    case ZT_FAMILY_LLAMA:
        return "llama";
    case ZT_FAMILY_BERT:
        return "bert";
    }
    return "?";
}

void zt_family_config_default(zt_family_config *c)
{
    memset(c, 0, sizeof *c);
    c->family = ZT_FAMILY_GPT2;
    zt_gpt2_config_default(&c->gpt2);
}

int zt_family_config_from_json(zt_family_config *c, const cJSON *obj, const char *where, zt_err *err)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "model_type");
    if (type && !cJSON_IsString(type))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: \"model_type\" must be a string such as \"gpt2\"", where);
    if (!type || strcmp(type->valuestring, "gpt2") == 0) {
        zt_family_config_default(c);
        return zt_gpt2_config_from_json(&c->gpt2, obj, where, err);
    }
    if (strcmp(type->valuestring, "llama") == 0 || strcmp(type->valuestring, "mistral") == 0) {
        zt_family_config_default(c);
        c->family = ZT_FAMILY_LLAMA;
        zt_llama_config_default(&c->llama);
        return zt_llama_config_from_json(&c->llama, obj, where, err);
    }
    if (strcmp(type->valuestring, "bert") == 0 || strcmp(type->valuestring, "roberta") == 0) {
        zt_family_config_default(c);
        c->family = ZT_FAMILY_BERT;
        if (type->valuestring[0] == 'r')
            zt_bert_config_default_roberta(&c->bert);
        else
            zt_bert_config_default(&c->bert);
        return zt_bert_config_from_json(&c->bert, obj, where, err);
    }
    return zt_fail(err, ZT_EUNSUPPORTED, "%s: model_type '%s' is not a family ztrain trains (it trains gpt2, llama, "
                   "mistral, bert and roberta)", where, type->valuestring);
}

int zt_family_config_load(zt_family_config *c, const char *path, zt_err *err)
{
    cJSON *root = NULL;
    int rc = zt_json_load_object(path, &root, err);
    if (rc < 0)
        return rc;
    rc = zt_family_config_from_json(c, root, path, err);
    cJSON_Delete(root);
    return rc;
}

int zt_family_config_save(const zt_family_config *c, const char *path, zt_err *err)
{
    return BY_FAMILY(c, zt_gpt2_config_save(&c->gpt2, path, err), zt_llama_config_save(&c->llama, path, err),
                     zt_bert_config_save(&c->bert, path, err));
}

int zt_family_config_validate(const zt_family_config *c, zt_err *err)
{
    if (c->family != ZT_FAMILY_GPT2 && c->family != ZT_FAMILY_LLAMA && c->family != ZT_FAMILY_BERT)
        return zt_fail(err, ZT_EINVAL_CONFIG, "model family %d is not known", (int)c->family);
    return BY_FAMILY(c, zt_gpt2_config_validate(&c->gpt2, err), zt_llama_config_validate(&c->llama, err),
                     zt_bert_config_validate(&c->bert, err));
}

const char *zt_family_config_diff(const zt_family_config *a, const zt_family_config *b, char *av, char *bv,
                                  size_t cap)
{
    if (a->family != b->family) {
        snprintf(av, cap, "%s", zt_family_name(a->family));
        snprintf(bv, cap, "%s", zt_family_name(b->family));
        return "model_type";
    }
#define CMP_INT(f)                                                                                            \
    if (x->f != y->f) {                                                                                       \
        snprintf(av, cap, "%d", (int)x->f);                                                                   \
        snprintf(bv, cap, "%d", (int)y->f);                                                                   \
        return #f;                                                                                            \
    }
#define CMP_REAL(f)                                                                                           \
    if (x->f != y->f) {                                                                                       \
        snprintf(av, cap, "%g", (double)x->f);                                                                \
        snprintf(bv, cap, "%g", (double)y->f);                                                                \
        return #f;                                                                                            \
    }
    if (IS_LLAMA(a)) {
        const zt_llama_config *x = &a->llama, *y = &b->llama;
        CMP_INT(family)
        CMP_INT(num_hidden_layers)
        CMP_INT(hidden_size)
        CMP_INT(num_attention_heads)
        CMP_INT(num_key_value_heads)
        CMP_INT(intermediate_size)
        CMP_INT(max_position_embeddings)
        CMP_INT(vocab_size)
        CMP_INT(tie_word_embeddings)
        CMP_INT(pad_token_id)
        CMP_REAL(rms_norm_eps)
        CMP_REAL(rope.theta)
        CMP_INT(rope.scaling)
        CMP_REAL(rope.factor)
        CMP_REAL(rope.low_freq_factor)
        CMP_REAL(rope.high_freq_factor)
        CMP_INT(rope.original_max_position_embeddings)
        return NULL;
    }
    if (IS_BERT(a)) {
        const zt_bert_config *x = &a->bert, *y = &b->bert;
        CMP_INT(roberta)
        CMP_INT(head)
        CMP_INT(vocab_size)
        CMP_INT(hidden_size)
        CMP_INT(num_hidden_layers)
        CMP_INT(num_attention_heads)
        CMP_INT(intermediate_size)
        CMP_INT(max_position_embeddings)
        CMP_INT(type_vocab_size)
        CMP_INT(pad_token_id)
        CMP_INT(hidden_act)
        CMP_REAL(layer_norm_eps)
        CMP_INT(num_labels)
        return NULL;
    }
    const zt_gpt2_config *x = &a->gpt2, *y = &b->gpt2;
    CMP_INT(n_layer)
    CMP_INT(n_head)
    CMP_INT(n_embd)
    CMP_INT(n_positions)
    CMP_INT(vocab_size)
    CMP_INT(tie_word_embeddings)
    CMP_REAL(layer_norm_epsilon)
#undef CMP_INT
#undef CMP_REAL
    return NULL;
}

bool zt_family_config_has_cuda(const zt_family_config *c)
{
    (void)c;
    return true; /* every family has one */
}

enum zt_family_task zt_family_config_task(const zt_family_config *c)
{
    if (!IS_BERT(c))
        return ZT_TASK_CAUSAL_LM;
    return c->bert.head == ZT_BERT_HEAD_CLASSIFY ? ZT_TASK_CLASSIFY : ZT_TASK_MASKED_LM;
}

int zt_family_config_layers(const zt_family_config *c)
{
    return BY_FAMILY(c, c->gpt2.n_layer, c->llama.num_hidden_layers, c->bert.num_hidden_layers);
}

int zt_family_config_positions(const zt_family_config *c)
{
    return BY_FAMILY(c, c->gpt2.n_positions, c->llama.max_position_embeddings, zt_bert_config_max_seq(&c->bert));
}

int zt_family_config_vocab(const zt_family_config *c)
{
    return BY_FAMILY(c, c->gpt2.vocab_size, c->llama.vocab_size, c->bert.vocab_size);
}

int zt_family_config_width(const zt_family_config *c)
{
    return BY_FAMILY(c, c->gpt2.n_embd, c->llama.hidden_size, c->bert.hidden_size);
}

int zt_family_config_heads(const zt_family_config *c)
{
    return BY_FAMILY(c, c->gpt2.n_head, c->llama.num_attention_heads, c->bert.num_attention_heads);
}

size_t zt_family_config_num_params(const zt_family_config *c)
{
    return BY_FAMILY(c, zt_gpt2_config_num_params(&c->gpt2), zt_llama_config_num_params(&c->llama),
                     zt_bert_config_num_params(&c->bert));
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

uint64_t zt_family_config_fingerprint(const zt_family_config *c)
{
    if (IS_LLAMA(c)) {
        const zt_llama_config *l = &c->llama;
        const int64_t ints[] = {c->family, l->family, l->num_hidden_layers, l->hidden_size, l->num_attention_heads,
                                l->num_key_value_heads, l->intermediate_size, l->max_position_embeddings,
                                l->vocab_size, l->tie_word_embeddings, l->pad_token_id, l->rope.scaling,
                                l->rope.original_max_position_embeddings};
        const double reals[] = {l->rms_norm_eps, l->rope.theta, l->rope.factor, l->rope.low_freq_factor,
                                l->rope.high_freq_factor, l->initializer_range};
        return fnv(fnv(14695981039346656037ULL, ints, sizeof ints), reals, sizeof reals);
    }
    if (IS_BERT(c)) {
        const zt_bert_config *e = &c->bert;
        const int64_t ints[] = {c->family, e->roberta, e->head, e->vocab_size, e->hidden_size, e->num_hidden_layers,
                                e->num_attention_heads, e->intermediate_size, e->max_position_embeddings,
                                e->type_vocab_size, e->pad_token_id, e->hidden_act, e->num_labels};
        const double reals[] = {e->layer_norm_eps, e->initializer_range};
        return fnv(fnv(14695981039346656037ULL, ints, sizeof ints), reals, sizeof reals);
    }
    const zt_gpt2_config *g = &c->gpt2;
    const int64_t ints[] = {c->family, g->n_layer, g->n_head, g->n_embd, g->n_positions, g->vocab_size,
                            g->tie_word_embeddings};
    const double eps = g->layer_norm_epsilon;
    uint64_t h = fnv(14695981039346656037ULL, ints, sizeof ints);
    return fnv(h, &eps, sizeof eps);
}

void zt_family_config_describe(const zt_family_config *c, char *buf, size_t cap)
{
    if (IS_LLAMA(c)) {
        const zt_llama_config *l = &c->llama;
        snprintf(buf, cap, "%s, %d layers x %d wide, %d heads (%d key/value), MLP %d, vocab %d, %d positions%s",
                 l->family == ZT_LLAMA_FAMILY_MISTRAL ? "Mistral" : "LLaMA", l->num_hidden_layers, l->hidden_size,
                 l->num_attention_heads, l->num_key_value_heads, l->intermediate_size, l->vocab_size,
                 l->max_position_embeddings, l->tie_word_embeddings ? ", tied head" : "");
        return;
    }
    if (IS_BERT(c)) {
        const zt_bert_config *e = &c->bert;
        snprintf(buf, cap, "%s, %d layers x %d wide, %d heads, MLP %d, vocab %d, %d positions, %s", e->roberta ? "RoBERTa" : "BERT",
                 e->num_hidden_layers, e->hidden_size, e->num_attention_heads, e->intermediate_size, e->vocab_size,
                 zt_bert_config_max_seq(e), e->head == ZT_BERT_HEAD_CLASSIFY ? "classification head" : "masked-LM head");
        if (e->head == ZT_BERT_HEAD_CLASSIFY) {
            size_t k = strlen(buf);
            snprintf(buf + k, cap > k ? cap - k : 0, " (%d labels)", e->num_labels);
        }
        return;
    }
    snprintf(buf, cap, "GPT-2, %d layers x %d wide, %d heads, vocab %d, %d positions", c->gpt2.n_layer,
             c->gpt2.n_embd, c->gpt2.n_head, c->gpt2.vocab_size, c->gpt2.n_positions);
}

/* ---- the host model ---- */

static zt_family_model *wrap(const zt_family_config *c)
{
    zt_family_model *m = zt_xcalloc(1, sizeof *m);
    m->cfg = *c;
    return m;
}

int zt_family_model_create(zt_family_model **out, const zt_family_config *c, int B, int T, uint64_t seed,
                           zt_err *err)
{
    *out = NULL;
    zt_family_model *m = wrap(c);
    int rc = BY_FAMILY(c, zt_gpt2_create(&m->gpt2, &c->gpt2, B, T, seed, err),
                       zt_llama_create(&m->llama, &c->llama, B, T, seed, err),
                       zt_bert_create(&m->bert, &c->bert, B, T, seed, err));
    if (rc < 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int zt_family_model_create_layout(zt_family_model **out, const zt_family_config *c, zt_err *err)
{
    *out = NULL;
    zt_family_model *m = wrap(c);
    int rc = BY_FAMILY(c, zt_gpt2_create_layout(&m->gpt2, &c->gpt2, err),
                       zt_llama_create_layout(&m->llama, &c->llama, err),
                       zt_bert_create_layout(&m->bert, &c->bert, err));
    if (rc < 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void zt_family_model_destroy(zt_family_model *m)
{
    if (!m)
        return;
    zt_gpt2_destroy(m->gpt2);
    zt_llama_destroy(m->llama);
    zt_bert_destroy(m->bert);
    free(m);
}

const zt_family_config *zt_family_model_config(const zt_family_model *m)
{
    return &m->cfg;
}

zt_gpt2 *zt_family_model_gpt2(zt_family_model *m)
{
    return m->gpt2;
}

zt_llama *zt_family_model_llama(zt_family_model *m)
{
    return m->llama;
}

zt_bert *zt_family_model_bert(zt_family_model *m)
{
    return m->bert;
}

/* The expression for the family of host model m. */
#define BY_MODEL(m, g, l, b) ((m)->llama ? (l) : (m)->bert ? (b) : (g))

size_t zt_family_model_num_params(const zt_family_model *m)
{
    return BY_MODEL(m, zt_gpt2_num_params(m->gpt2), zt_llama_num_params(m->llama), zt_bert_num_params(m->bert));
}

int zt_family_model_num_tensors(const zt_family_model *m)
{
    return BY_MODEL(m, zt_gpt2_num_tensors(m->gpt2), zt_llama_num_tensors(m->llama), zt_bert_num_tensors(m->bert));
}

const zt_param_info *zt_family_model_tensor(const zt_family_model *m, int i)
{
    return BY_MODEL(m, zt_gpt2_tensor(m->gpt2, i), zt_llama_tensor(m->llama, i), zt_bert_tensor(m->bert, i));
}

float *zt_family_model_params(zt_family_model *m)
{
    return BY_MODEL(m, zt_gpt2_params(m->gpt2), zt_llama_params(m->llama), zt_bert_params(m->bert));
}

float *zt_family_model_grads(zt_family_model *m)
{
    return BY_MODEL(m, zt_gpt2_grads(m->gpt2), zt_llama_grads(m->llama), zt_bert_grads(m->bert));
}

void zt_family_model_release_params(zt_family_model *m)
{
    if (m->llama)
        zt_llama_release_params(m->llama);
    else if (m->bert)
        zt_bert_release_params(m->bert);
    else
        zt_gpt2_release_params(m->gpt2);
}

int zt_family_model_export(const zt_family_model *m, const char *path, zt_err *err)
{
    return BY_MODEL(m, zt_gpt2_export(m->gpt2, path, err), zt_llama_export(m->llama, path, err),
                    zt_bert_export(m->bert, path, err));
}

int zt_family_model_import(zt_family_model *m, const char *path, zt_err *err)
{
    /* a BERT checkpoint of another head (bert-base-uncased into a classifier) fine-tunes as transformers'
     * from_pretrained does: the missing head keeps its initialisation */
    return BY_MODEL(m, zt_gpt2_import(m->gpt2, path, err), zt_llama_import(m->llama, path, err),
                    zt_bert_import_pretrained(m->bert, path, err));
}

float zt_family_model_forward(zt_family_model *m, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    if (m->bert)
        return zt_bert_forward(m->bert, tokens, targets, B, T);
    return m->llama ? zt_llama_forward(m->llama, tokens, targets, B, T) : zt_gpt2_forward(m->gpt2, tokens, targets, B, T);
}

const float *zt_family_model_logits(const zt_family_model *m)
{
    return BY_MODEL(m, zt_gpt2_logits(m->gpt2), zt_llama_logits(m->llama), zt_bert_logits(m->bert));
}

int zt_family_model_cpu(struct zt_model **out, zt_family_model *m, int max_micro, const bool *ckpt_layers,
                        zt_err *err)
{
    return BY_MODEL(m, zt_gpt2_model_cpu(out, m->gpt2, max_micro, ckpt_layers, err),
                    zt_llama_model_cpu(out, m->llama, max_micro, ckpt_layers, err),
                    zt_bert_model_cpu(out, m->bert, max_micro, ckpt_layers, err));
}

#ifdef ZT_WITH_CUDA
int zt_family_model_cuda(struct zt_model **out, const zt_family_model *m, int B, int T, int max_micro,
                         enum zt_dtype dtype, const bool *ckpt_layers, zt_err *err)
{
    if (m->bert)
        return zt_bert_cuda_create(out, m->bert, B, T, max_micro, dtype, ckpt_layers, err);
    if (m->llama)
        return zt_llama_cuda_create(out, m->llama, B, T, max_micro, dtype, ckpt_layers, err);
    return zt_gpt2_cuda_create(out, m->gpt2, B, T, max_micro, dtype, ckpt_layers, err);
}

struct zt_model *zt_family_model_cuda_shape(const zt_family_model *m, int B, int T, int max_micro,
                                            enum zt_dtype dtype, const bool *ckpt_layers)
{
    if (m->bert)
        return zt_bert_cuda_shape(m->bert, B, T, max_micro, dtype, ckpt_layers);
    if (m->llama)
        return zt_llama_cuda_shape(m->llama, B, T, max_micro, dtype, ckpt_layers);
    return zt_gpt2_cuda_shape(m->gpt2, B, T, max_micro, dtype, ckpt_layers);
}
#endif
