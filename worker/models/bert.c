/* BERT and RoBERTa on the CPU kernels: Hugging Face config.json reading and writing, the parameter layout in
 * blocks, BertPreTrainedModel's initialisation, forward and backward passes with the masked-LM or the
 * sequence-classification head, safetensors export/import with Hugging Face tensor names, and the
 * masked-LM masking of inputs.
 *
 * As in worker/models/gpt2.c: one parameter slab, one gradient slab of the same layout, one activation slab
 * carved at create time for the largest batch; the forward pass keeps what the backward pass reads, and the
 * backward pass allocates nothing (its scratch is part of the activation slab, reused by every layer). */
#include "worker/models/bert.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"       /* zt_read_file, zt_write_file_atomic */
#include "common/json.h"         /* strict reading of config.json */
#include "common/memory.h"       /* huge pages for the slabs */
#include "common/safetensors.h"  /* export and import */
#include "kernels/activation.h"  /* exact and tanh GELU, tanh (pooler) */
#include "kernels/attention.h"   /* bidirectional attention with a padding mask */
#include "kernels/crossentropy.h"
#include "kernels/embedding.h" /* word + token type + position embeddings */
#include "kernels/layernorm.h"
#include "kernels/matmul.h"   /* linear layers and the tied decoder */
#include "kernels/pooler.h"   /* the first token of each sequence */
#include "kernels/residual.h" /* residual adds */
#include "worker/models/cpu_exec.h"    /* the engine's CPU executor */
#include "worker/models/family.h"      /* the family definition */
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_io.h"     /* safetensors import and export from the tensor table */
#include "worker/models/host_model.h"  /* config field tables */
#include "worker/models/host_shared.h" /* the normal initialisation */
#ifdef ZT_WITH_CUDA
#include "worker/models/bert_cuda.h" /* the CUDA executor */
#endif

/* Limits that keep every size product far from overflow and catch typos such as an extra zero. */
#define BERT_MAX_LAYERS 1024
#define BERT_MAX_HIDDEN 65536
#define BERT_MAX_INTERMEDIATE (1 << 20)
#define BERT_MAX_POSITIONS (1 << 20)
#define BERT_MAX_VOCAB (1 << 24)
#define BERT_MAX_TYPES 1024

#define IGNORE_INDEX (-1)

/* The tensor tables' order: ZT_BERT_E_* (block 0), ZT_BERT_T_* (a layer), ZT_BERT_H_* (the head), bert.h. */
#define LAYER_TENSOR(l, k) ZT_BERT_LAYER_TENSOR(l, k)
#define HEAD_TENSOR(m, k) ZT_BERT_HEAD_TENSOR((m)->cfg.num_hidden_layers, k)

/* What the forward pass keeps of one encoder layer for the backward pass. */
typedef struct layer_acts {
    float *qkv;                       /* [N,3C] */
    float *atty, *att_lse;            /* [N,C] attention output; [B,NH,T] log-sum-exp per query row */
    float *res1;                      /* [N,C] x + attention.output.dense(atty) */
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] attention.output.LayerNorm */
    float *inter, *inter_act;         /* [N,I] intermediate.dense before and after GELU */
    float *res2;                      /* [N,C] ln1 + output.dense(inter_act) */
    float *out, *out_mean, *out_rstd; /* [N,C], [N], [N] output.LayerNorm: the layer's output */
} layer_acts;

/* The passes' state beside the host model's tables and slabs (host_model.h): its config, tables (borrowed from
 * the host model) and the activations. */
typedef struct bert_run {
    zt_bert_config cfg;
    int max_B, max_T;
    int num_tensors;
    const zt_param_info *tensors; /* [num_tensors] */
    int num_blocks;
    const zt_block_info *blocks;  /* [num_blocks] */

    /* Activation slab; N = B*T rows are used of max_B*max_T. */
    float *acts;
    float *emb, *emb_mean, *emb_rstd, *enc; /* [N,C] embedding sum, its LayerNorm stats, block 0's output */
    layer_acts *layers;
    /* masked-LM head */
    float *tr_pre, *tr_act, *tr_ln, *tr_mean, *tr_rstd; /* [N,C] x3, [N] x2 */
    float *dec_bias, *ddec_bias;                         /* [V] the decoder bias of block L+1; its gradient */
    /* classification head */
    float *first, *pool_pre, *pooled; /* [B,C] */
    float *dpooled, *dpool_pre, *dfirst; /* [B,C] */
    float *logits; /* [N,V] or [B,NL]; the logits' gradient after a backward pass */
    float *losses; /* [N] or [B] */
    /* backward scratch */
    float *proj;              /* [N,C] a projection before its residual add (forward) */
    float *dres;              /* [N,C] gradient of the residual stream (a block's output, then its input) */
    float *dln;               /* [N,C] */
    float *datty;             /* [N,C] */
    float *dqkv;              /* [N,3C] */
    float *dinter, *dinter_act; /* [N,I] */
    int32_t *tokens;          /* [N] inputs of the last forward pass */
    int32_t *types;           /* [N] their token types */
    int32_t *targets;         /* [N] (masked LM) or [B] (classification) counted targets of the last forward */
    int32_t *lens;            /* [B] tokens before each sequence's trailing padding */
    const int32_t *next_types; /* set by zt_bert_set_token_types for the next forward_begin; borrowed */

    int B, T;           /* shape of the last forward pass */
    bool have_targets;  /* the last forward pass had targets and no backward has consumed it */
    int n_valid;        /* counted targets of the last forward pass */
    int n_correct;      /* of which the argmax got right */
    bool backward_skip; /* the running backward pass has nothing to do (no counted target) */
} bert_run;

/* ---------------------------------------------------------------------------------------------------- */
/* Configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

/* Sets bert-base-uncased's values with the masked-LM head. */
void zt_bert_config_default(zt_bert_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->roberta = false;
    cfg->head = ZT_BERT_HEAD_MLM;
    cfg->vocab_size = 30522;
    cfg->hidden_size = 768;
    cfg->num_hidden_layers = 12;
    cfg->num_attention_heads = 12;
    cfg->intermediate_size = 3072;
    cfg->max_position_embeddings = 512;
    cfg->type_vocab_size = 2;
    cfg->pad_token_id = 0;
    cfg->hidden_act = ZT_BERT_ACT_GELU;
    cfg->layer_norm_eps = 1e-12f;
    cfg->initializer_range = 0.02f;
    cfg->num_labels = 2;
}

/* Sets roberta-base's values with the masked-LM head. */
void zt_bert_config_default_roberta(zt_bert_config *cfg)
{
    zt_bert_config_default(cfg);
    cfg->roberta = true;
    cfg->vocab_size = 50265;
    cfg->max_position_embeddings = 514;
    cfg->type_vocab_size = 1;
    cfg->pad_token_id = 1;
    cfg->layer_norm_eps = 1e-5f;
}

/* The longest sequence cfg serves; see bert.h. */
int zt_bert_config_max_seq(const zt_bert_config *cfg)
{
    return cfg->roberta ? cfg->max_position_embeddings - cfg->pad_token_id - 1 : cfg->max_position_embeddings;
}

/* Outputs of the head per scored row. */
int zt_bert_config_outputs(const zt_bert_config *cfg)
{
    return cfg->head == ZT_BERT_HEAD_MLM ? cfg->vocab_size : cfg->num_labels;
}

/* Hugging Face's class for cfg. */
const char *zt_bert_config_architecture(const zt_bert_config *cfg)
{
    if (cfg->head == ZT_BERT_HEAD_MLM)
        return cfg->roberta ? "RobertaForMaskedLM" : "BertForMaskedLM";
    return cfg->roberta ? "RobertaForSequenceClassification" : "BertForSequenceClassification";
}

/* The name of label i: its stored name, or LABEL_<i>. */
const char *zt_bert_config_label(const zt_bert_config *cfg, int i, char *buf, size_t cap)
{
    ZT_ASSERT(i >= 0 && i < cfg->num_labels);
    if (cfg->label_names[0]) {
        const char *s = cfg->label_names;
        for (int k = 0; k < i; k++)
            s += strlen(s) + 1;
        return s;
    }
    snprintf(buf, cap, "LABEL_%d", i);
    return buf;
}

/* BertConfig's and RobertaConfig's keys; the head (architectures), hidden_act and the labels have their
 * own readers below. */
#define S zt_bert_config
#define NS ZT__CFG_NO_SAVE
static const zt__cfg_key keys[] = {
    ZT__CFG_I(S, vocab_size, 1, BERT_MAX_VOCAB), ZT__CFG_I(S, hidden_size, 1, BERT_MAX_HIDDEN),
    ZT__CFG_I(S, num_hidden_layers, 1, BERT_MAX_LAYERS), ZT__CFG_I(S, num_attention_heads, 1, BERT_MAX_HIDDEN),
    ZT__CFG_I(S, intermediate_size, 1, BERT_MAX_INTERMEDIATE),
    ZT__CFG_I(S, max_position_embeddings, 1, BERT_MAX_POSITIONS), ZT__CFG_I(S, type_vocab_size, 1, BERT_MAX_TYPES),
    ZT__CFG_R(S, INT, pad_token_id, 0, BERT_MAX_VOCAB, ZT__CFG_NO_CHECK),
    ZT__CFG_R(S, FLOAT, layer_norm_eps, 0.0, 1.0, ZT__CFG_OPEN),
    ZT__CFG_R(S, FLOAT, initializer_range, 0.0, 10.0, ZT__CFG_NO_CHECK),
    ZT__CFG_ONLY_("position_embedding_type", "\"absolute\"", 0, "absolute positions"),
    ZT__CFG_ONLY_("problem_type", "\"single_label_classification\"", NS | ZT__CFG_NULL_OK,
                  "cross-entropy, one label per sequence"),
    ZT__CFG_ONLY_("tie_word_embeddings", "true", NS, "the masked-LM decoder is the word embeddings"),
    ZT__CFG_ONLY_("is_decoder", "false", NS, "BERT is a bidirectional encoder"),
    ZT__CFG_ONLY_("add_cross_attention", "false", NS, "an encoder without cross-attention"),
    ZT__CFG_ONLY_("is_encoder_decoder", "false", NS, "an encoder alone"),
    ZT__CFG_ONLY_("pruned_heads", "{}", NS | ZT__CFG_NULL_OK, "models with all heads"),
    /* dropout rates: ztrain trains without dropout, and writes them as 0 */
    ZT__CFG_NUMBER_("hidden_dropout_prob", 0.0, 1.0, 0, "0"),
    ZT__CFG_NUMBER_("attention_probs_dropout_prob", 0.0, 1.0, 0, "0"),
    ZT__CFG_NUMBER_("classifier_dropout", 0.0, 1.0, ZT__CFG_NULL_OK, "null"), ZT__CFG_IGNORE_("use_cache", "true"),
    ZT__CFG_IGNORE_("torch_dtype", "\"float32\""), ZT__CFG_IGNORE_("gradient_checkpointing", NULL),
    ZT__CFG_IGNORE_("bos_token_id", NULL), ZT__CFG_IGNORE_("eos_token_id", NULL),
    ZT__CFG_IGNORE_("sep_token_id", NULL), ZT__CFG_IGNORE_("cls_token_id", NULL),
    ZT__CFG_IGNORE_("mask_token_id", NULL), ZT__CFG_IGNORE_("output_past", NULL),
};
#undef NS
#undef S
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* Validation with the source named in messages. */
static int validate_config(const zt_bert_config *c, const char *where, zt_err *err)
{
    int rc = zt__cfg_check(keys, NKEYS, c, where, err);
    if (rc < 0)
        return rc;
    if (c->num_labels < 1 || c->num_labels > ZT_BERT_MAX_LABELS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: num_labels must be from 1 to %d, got %d", where,
                       ZT_BERT_MAX_LABELS, c->num_labels);
    if (c->hidden_size % c->num_attention_heads != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: hidden_size %d is not divisible by num_attention_heads %d (every head gets hidden_size / "
                       "num_attention_heads channels: choose a head count that divides hidden_size)",
                       where, c->hidden_size, c->num_attention_heads);
    if (c->pad_token_id < 0 || c->pad_token_id >= c->vocab_size)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: pad_token_id %d is not a token id below vocab_size %d", where,
                       c->pad_token_id, c->vocab_size);
    if (c->roberta && zt_bert_config_max_seq(c) < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: max_position_embeddings %d leaves no position for RoBERTa, whose positions start at "
                       "pad_token_id + 1 = %d (make max_position_embeddings larger)",
                       where, c->max_position_embeddings, c->pad_token_id + 1);
    if (!(c->initializer_range > 0.0f && c->initializer_range <= 10.0f))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: initializer_range must be above 0 and at most 10, got %g", where,
                       (double)c->initializer_range);
    if (c->hidden_act != ZT_BERT_ACT_GELU && c->hidden_act != ZT_BERT_ACT_GELU_TANH)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: unknown hidden_act %d", where, (int)c->hidden_act);
    if (c->head != ZT_BERT_HEAD_MLM && c->head != ZT_BERT_HEAD_CLASSIFY)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: unknown head %d", where, (int)c->head);
    if (c->head == ZT_BERT_HEAD_CLASSIFY && c->num_labels < 2)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: num_labels is 1, which transformers treats as regression (mean squared error); ztrain's "
                       "classification head needs at least 2 labels",
                       where);
    if (c->label_names[0]) {
        /* num_labels NUL-terminated names inside the buffer */
        size_t at = 0;
        for (int i = 0; i < c->num_labels; i++) {
            const char *nul = at < sizeof c->label_names
                                  ? memchr(c->label_names + at, '\0', sizeof c->label_names - at)
                                  : NULL;
            if (!nul || c->label_names[at] == '\0')
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the label names do not hold %d non-empty names", where,
                               c->num_labels);
            at = (size_t)(nul - c->label_names) + 1;
        }
    }
    return 0;
}

/* Checks ranges and consistency of cfg. */
int zt_bert_config_validate(const zt_bert_config *cfg, zt_err *err)
{
    return validate_config(cfg, "model config", err);
}

/* Reads the head from "architectures" (a list of one class name, as transformers writes it). */
static int read_architectures(zt_json_reader *r, const cJSON *obj, zt_bert_config *c, zt_err *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, "architectures");
    if (!a)
        return 0;
    zt_json_accept(r, "architectures");
    if (cJSON_IsNull(a))
        return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 1 || !cJSON_IsString(a->child))
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: architectures must be a list of one class name, such as [\"BertForMaskedLM\"]", r->where);
    const char *name = a->child->valuestring;
    static const struct {
        const char *name;
        bool roberta;
        enum zt_bert_head head;
    } known[] = {
        {"BertForMaskedLM", false, ZT_BERT_HEAD_MLM},
        {"BertForSequenceClassification", false, ZT_BERT_HEAD_CLASSIFY},
        {"RobertaForMaskedLM", true, ZT_BERT_HEAD_MLM},
        {"RobertaForSequenceClassification", true, ZT_BERT_HEAD_CLASSIFY},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(name, known[i].name) != 0)
            continue;
        if (known[i].roberta != c->roberta)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "%s: architectures names %s, but model_type is \"%s\" (make them agree)", r->where, name,
                           c->roberta ? "roberta" : "bert");
        c->head = known[i].head;
        return 0;
    }
    return zt_fail(err, ZT_EINVAL_CONFIG,
                   "%s: architectures names %s, but ztrain's BERT and RoBERTa have the heads of %s and %s (a "
                   "masked-LM or a sequence-classification head)",
                   r->where, name, c->roberta ? "RobertaForMaskedLM" : "BertForMaskedLM",
                   c->roberta ? "RobertaForSequenceClassification" : "BertForSequenceClassification");
}

/* Reads num_labels, id2label and label2id: id2label maps "0".."n-1" to names, label2id is its inverse. */
static int read_labels(zt_json_reader *r, const cJSON *obj, zt_bert_config *c, zt_err *err)
{
    int num_labels = 0;
    int rc = zt__host_json_int(r, "num_labels", 1, ZT_BERT_MAX_LABELS, &num_labels, NULL, err);
    if (rc < 0)
        return rc;
    const cJSON *id2label = cJSON_GetObjectItemCaseSensitive(obj, "id2label");
    const cJSON *label2id = cJSON_GetObjectItemCaseSensitive(obj, "label2id");
    if (id2label)
        zt_json_accept(r, "id2label");
    if (label2id)
        zt_json_accept(r, "label2id");
    if (!id2label) {
        if (label2id && !cJSON_IsNull(label2id))
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: label2id without id2label (give both, or neither)", r->where);
        if (num_labels > 0 && num_labels != c->num_labels) {
            c->num_labels = num_labels;
            c->label_names[0] = '\0';
        }
        return 0;
    }
    if (!cJSON_IsObject(id2label) || !id2label->child)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: id2label must be an object of label ids to names, such as "
                       "{\"0\": \"negative\", \"1\": \"positive\"}", r->where);
    const int n = cJSON_GetArraySize(id2label);
    if (n > ZT_BERT_MAX_LABELS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: id2label has %d labels, more than ztrain's %d", r->where, n,
                       ZT_BERT_MAX_LABELS);
    if (num_labels > 0 && num_labels != n)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: num_labels is %d but id2label has %d labels (make them agree)",
                       r->where, num_labels, n);
    char text[ZT_BERT_LABEL_TEXT];
    size_t at = 0;
    bool all_default = true;
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(id2label, key);
        if (!v)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "%s: id2label has %d labels but no label \"%s\" (ids run from 0 to %d)", r->where, n, key,
                           n - 1);
        if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: id2label[\"%s\"] must be a non-empty string", r->where, key);
        const size_t len = strlen(v->valuestring);
        if (at + len + 1 > sizeof text)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the names in id2label take more than ztrain's %d bytes "
                           "(shorten them)", r->where, ZT_BERT_LABEL_TEXT);
        memcpy(text + at, v->valuestring, len + 1);
        at += len + 1;
        char def[32];
        snprintf(def, sizeof def, "LABEL_%d", i);
        all_default = all_default && strcmp(v->valuestring, def) == 0;
        if (label2id && !cJSON_IsNull(label2id)) {
            const cJSON *id = cJSON_IsObject(label2id) ? cJSON_GetObjectItemCaseSensitive(label2id, v->valuestring)
                                                        : NULL;
            if (!cJSON_IsNumber(id) || id->valuedouble != (double)i)
                return zt_fail(err, ZT_EINVAL_CONFIG, "%s: label2id[\"%s\"] must be %d, the inverse of id2label",
                               r->where, v->valuestring, i);
        }
    }
    if (label2id && !cJSON_IsNull(label2id) && cJSON_GetArraySize(label2id) != n)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: label2id has %d entries but id2label %d (label2id must be the "
                       "inverse of id2label)", r->where, cJSON_GetArraySize(label2id), n);
    c->num_labels = n;
    if (all_default)
        c->label_names[0] = '\0';
    else
        memcpy(c->label_names, text, at);
    return 0;
}

/* Fills cfg from a Hugging Face BERT or RoBERTa config.json object; see bert.h. */
int zt_bert_config_from_json(zt_bert_config *cfg, const cJSON *obj, const char *where, zt_err *err)
{
    static const char *const types[] = {"bert", "roberta", NULL};
    zt_bert_config c = *cfg;
    zt_json_reader r;
    int rc, type;
    if ((rc = zt__cfg_begin(&r, obj, where, types, &type, err)) < 0)
        return rc;
    if (type >= 0 && (type == 1) != c.roberta) { /* the other model type's defaults, the head kept */
        const enum zt_bert_head head = c.head;
        if (type == 1)
            zt_bert_config_default_roberta(&c);
        else
            zt_bert_config_default(&c);
        c.head = head;
    }
    if ((rc = read_architectures(&r, obj, &c, err)) < 0 || (rc = zt__cfg_read(&r, obj, keys, NKEYS, &c, err)) < 0)
        return rc;
    char text[64] = "";
    if ((rc = zt_json_get_string(&r, "hidden_act", text, sizeof text, err)) < 0)
        return rc;
    if (strcmp(text, "gelu") == 0)
        c.hidden_act = ZT_BERT_ACT_GELU;
    else if (strcmp(text, "gelu_new") == 0 || strcmp(text, "gelu_pytorch_tanh") == 0)
        c.hidden_act = ZT_BERT_ACT_GELU_TANH;
    else if (text[0])
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: hidden_act is \"%s\", but ztrain implements \"gelu\" (exact) and \"gelu_new\" (tanh "
                       "approximation)",
                       where, text);
    if ((rc = read_labels(&r, obj, &c, err)) < 0 || (rc = zt__cfg_finish(&r, obj, NULL, err)) < 0 ||
        (rc = validate_config(&c, where, err)) < 0)
        return rc;
    *cfg = c;
    return 0;
}

/* Reads a config.json file; absent fields take the defaults of its model_type. */
int zt_bert_config_load(zt_bert_config *cfg, const char *path, zt_err *err)
{
    cJSON *obj = NULL;
    int rc = zt_json_load_object(path, &obj, err);
    if (rc < 0)
        return rc;
    zt_bert_config c;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "model_type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "roberta") == 0)
        zt_bert_config_default_roberta(&c);
    else
        zt_bert_config_default(&c);
    rc = zt_bert_config_from_json(&c, obj, path, err);
    cJSON_Delete(obj);
    if (rc == 0)
        *cfg = c;
    return rc;
}

/* Writes cfg as a Hugging Face config.json, keys sorted as transformers writes them, atomically. */
int zt_bert_config_save(const zt_bert_config *cfg, const char *path, zt_err *err)
{
    int rc = validate_config(cfg, path, err);
    if (rc < 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    zt__cfg_write(keys, NKEYS, cfg, o);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "architectures"),
                         cJSON_CreateString(zt_bert_config_architecture(cfg)));
    cJSON_AddStringToObject(o, "hidden_act", cfg->hidden_act == ZT_BERT_ACT_GELU ? "gelu" : "gelu_new");
    if (cfg->head == ZT_BERT_HEAD_CLASSIFY || cfg->num_labels != 2 || cfg->label_names[0]) {
        cJSON *id2label = cJSON_AddObjectToObject(o, "id2label"), *label2id = cJSON_AddObjectToObject(o, "label2id");
        for (int i = 0; i < cfg->num_labels; i++) {
            char key[16], buf[32];
            snprintf(key, sizeof key, "%d", i);
            cJSON_AddStringToObject(id2label, key, zt_bert_config_label(cfg, i, buf, sizeof buf));
            cJSON_AddNumberToObject(label2id, zt_bert_config_label(cfg, i, buf, sizeof buf), i);
        }
    }
    cJSON_AddStringToObject(o, "model_type", cfg->roberta ? "roberta" : "bert");
    if (cfg->head == ZT_BERT_HEAD_CLASSIFY)
        cJSON_AddStringToObject(o, "problem_type", "single_label_classification");
    return zt__cfg_save(o, path, err);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Parameter layout                                                                                     */
/* ---------------------------------------------------------------------------------------------------- */

static int head_count(const zt_bert_config *cfg)
{
    return cfg->head == ZT_BERT_HEAD_MLM ? ZT_BERT_H_MLM_COUNT : ZT_BERT_H_CLS_COUNT;
}

static int count_tensors(const void *cv)
{
    const zt_bert_config *cfg = cv;
    return ZT_BERT_E_COUNT + cfg->num_hidden_layers * ZT_BERT_T_COUNT + head_count(cfg);
}

/* Appends one tensor (d1 = 0: a vector); weight decay for matrices, not biases and LayerNorm parameters. */
static void add_tensor(zt_param_info *t, int block, size_t *offset, const char *name, int64_t d0, int64_t d1)
{
    zt__hm_add_tensor(t, block, offset, name, d0, d1, d1 > 0);
}

/* Fills tensors[count_tensors(cfg)] and blocks[L + 2] with Hugging Face's names; returns the parameter count. */
static size_t build_layout(const void *cv, zt_param_info *tensors, zt_block_info *blocks)
{
    const zt_bert_config *cfg = cv;
    const int64_t C = cfg->hidden_size, V = cfg->vocab_size, I = cfg->intermediate_size;
    const char *prefix = cfg->roberta ? "roberta." : "bert.";
    const int L = cfg->num_hidden_layers;
    size_t off = 0;
    int i = 0;
    char name[96];

    blocks[0].offset = off;
    static const char *const emb[ZT_BERT_E_COUNT] = {"word_embeddings.weight", "position_embeddings.weight",
                                             "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias"};
    const int64_t emb_rows[ZT_BERT_E_COUNT] = {V, cfg->max_position_embeddings, cfg->type_vocab_size, C, C};
    for (int k = 0; k < ZT_BERT_E_COUNT; k++) {
        snprintf(name, sizeof name, "%sembeddings.%s", prefix, emb[k]);
        add_tensor(&tensors[i++], 0, &off, name, emb_rows[k], k < ZT_BERT_E_LN_W ? C : 0);
    }
    blocks[0].numel = off - blocks[0].offset;

    static const struct {
        const char *suffix;
        char out, in; /* 'C', 'I', or 0 for a vector */
    } lt[ZT_BERT_T_COUNT] = {
        [ZT_BERT_T_Q_W] = {"attention.self.query.weight", 'C', 'C'},
        [ZT_BERT_T_K_W] = {"attention.self.key.weight", 'C', 'C'},
        [ZT_BERT_T_V_W] = {"attention.self.value.weight", 'C', 'C'},
        [ZT_BERT_T_Q_B] = {"attention.self.query.bias", 'C', 0},
        [ZT_BERT_T_K_B] = {"attention.self.key.bias", 'C', 0},
        [ZT_BERT_T_V_B] = {"attention.self.value.bias", 'C', 0},
        [ZT_BERT_T_AO_W] = {"attention.output.dense.weight", 'C', 'C'},
        [ZT_BERT_T_AO_B] = {"attention.output.dense.bias", 'C', 0},
        [ZT_BERT_T_ALN_W] = {"attention.output.LayerNorm.weight", 'C', 0},
        [ZT_BERT_T_ALN_B] = {"attention.output.LayerNorm.bias", 'C', 0},
        [ZT_BERT_T_I_W] = {"intermediate.dense.weight", 'I', 'C'},
        [ZT_BERT_T_I_B] = {"intermediate.dense.bias", 'I', 0},
        [ZT_BERT_T_O_W] = {"output.dense.weight", 'C', 'I'},
        [ZT_BERT_T_O_B] = {"output.dense.bias", 'C', 0},
        [ZT_BERT_T_OLN_W] = {"output.LayerNorm.weight", 'C', 0},
        [ZT_BERT_T_OLN_B] = {"output.LayerNorm.bias", 'C', 0},
    };
    for (int l = 0; l < L; l++) {
        blocks[1 + l].offset = off;
        for (int k = 0; k < ZT_BERT_T_COUNT; k++) {
            snprintf(name, sizeof name, "%sencoder.layer.%d.%s", prefix, l, lt[k].suffix);
            const int64_t d0 = lt[k].out == 'I' ? I : C;
            const int64_t d1 = lt[k].in == 0 ? 0 : lt[k].in == 'I' ? I : C;
            add_tensor(&tensors[i++], 1 + l, &off, name, d0, d1);
        }
        blocks[1 + l].numel = off - blocks[1 + l].offset;
    }

    const int h = L + 1;
    blocks[h].offset = off;
    if (cfg->head == ZT_BERT_HEAD_MLM) {
        static const char *const bert_names[ZT_BERT_H_MLM_COUNT] = {
            "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
            "cls.predictions.bias"};
        static const char *const roberta_names[ZT_BERT_H_MLM_COUNT] = {"lm_head.dense.weight", "lm_head.dense.bias",
                                                               "lm_head.layer_norm.weight", "lm_head.layer_norm.bias",
                                                               "lm_head.bias"};
        const char *const *names = cfg->roberta ? roberta_names : bert_names;
        add_tensor(&tensors[i++], h, &off, names[ZT_BERT_H_DENSE_W], C, C);
        add_tensor(&tensors[i++], h, &off, names[ZT_BERT_H_DENSE_B], C, 0);
        add_tensor(&tensors[i++], h, &off, names[ZT_BERT_H_LN_W], C, 0);
        add_tensor(&tensors[i++], h, &off, names[ZT_BERT_H_LN_B], C, 0);
        add_tensor(&tensors[i++], h, &off, names[ZT_BERT_H_BIAS], V, 0);
    } else {
        const int64_t NL = cfg->num_labels;
        char pool_w[64], pool_b[64];
        snprintf(pool_w, sizeof pool_w, "%s", cfg->roberta ? "classifier.dense.weight" : "bert.pooler.dense.weight");
        snprintf(pool_b, sizeof pool_b, "%s", cfg->roberta ? "classifier.dense.bias" : "bert.pooler.dense.bias");
        add_tensor(&tensors[i++], h, &off, pool_w, C, C);
        add_tensor(&tensors[i++], h, &off, pool_b, C, 0);
        add_tensor(&tensors[i++], h, &off, cfg->roberta ? "classifier.out_proj.weight" : "classifier.weight", NL, C);
        add_tensor(&tensors[i++], h, &off, cfg->roberta ? "classifier.out_proj.bias" : "classifier.bias", NL, 0);
    }
    blocks[h].numel = off - blocks[h].offset;
    ZT_ASSERT(i == count_tensors(cfg));
    return off;
}

/* The parameter count of cfg's shape, by formula. */
size_t zt_bert_config_num_params(const zt_bert_config *cfg)
{
    const size_t C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size, V = (size_t)cfg->vocab_size;
    const size_t emb = (V + (size_t)cfg->max_position_embeddings + (size_t)cfg->type_vocab_size) * C + 2 * C;
    const size_t layer = 3 * (C * C + C) + (C * C + C) + 2 * C + (I * C + I) + (C * I + C) + 2 * C;
    const size_t head = cfg->head == ZT_BERT_HEAD_MLM ? C * C + C + 2 * C + V
                                                      : C * C + C + (size_t)cfg->num_labels * (C + 1);
    return emb + (size_t)cfg->num_hidden_layers * layer + head;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Creation                                                                                             */
/* ---------------------------------------------------------------------------------------------------- */

/* Hands out n floats from base (or only counts them when base is NULL). */
static float *take(float *base, size_t *used, size_t n)
{
    float *p = base ? base + *used : NULL;
    *used += n;
    return p;
}

/* Carves the activation slab at base for max_B x max_T rows; returns its size in floats (base NULL: counts). */
static size_t carve_acts(bert_run *m, float *base)
{
    const size_t B = (size_t)m->max_B, N = B * (size_t)m->max_T;
    const size_t C = (size_t)m->cfg.hidden_size, I = (size_t)m->cfg.intermediate_size;
    const size_t V = (size_t)m->cfg.vocab_size, NH = (size_t)m->cfg.num_attention_heads;
    const bool mlm = m->cfg.head == ZT_BERT_HEAD_MLM;
    size_t used = 0;
    m->emb = take(base, &used, N * C);
    m->emb_mean = take(base, &used, N);
    m->emb_rstd = take(base, &used, N);
    m->enc = take(base, &used, N * C);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        layer_acts *a = &m->layers[l];
        a->qkv = take(base, &used, N * 3 * C);
        a->atty = take(base, &used, N * C);
        a->att_lse = take(base, &used, N * NH);
        a->res1 = take(base, &used, N * C);
        a->ln1 = take(base, &used, N * C);
        a->ln1_mean = take(base, &used, N);
        a->ln1_rstd = take(base, &used, N);
        a->inter = take(base, &used, N * I);
        a->inter_act = take(base, &used, N * I);
        a->res2 = take(base, &used, N * C);
        a->out = take(base, &used, N * C);
        a->out_mean = take(base, &used, N);
        a->out_rstd = take(base, &used, N);
    }
    if (mlm) {
        m->tr_pre = take(base, &used, N * C);
        m->tr_act = take(base, &used, N * C);
        m->tr_ln = take(base, &used, N * C);
        m->tr_mean = take(base, &used, N);
        m->tr_rstd = take(base, &used, N);
        m->dec_bias = take(base, &used, V);
        m->ddec_bias = take(base, &used, V);
        m->logits = take(base, &used, N * V);
        m->losses = take(base, &used, N);
    } else {
        const size_t NL = (size_t)m->cfg.num_labels;
        m->first = take(base, &used, B * C);
        m->pool_pre = take(base, &used, B * C);
        m->pooled = take(base, &used, B * C);
        m->dpooled = take(base, &used, B * C);
        m->dpool_pre = take(base, &used, B * C);
        m->dfirst = take(base, &used, B * C);
        m->logits = take(base, &used, B * NL);
        m->losses = take(base, &used, B);
    }
    m->proj = take(base, &used, N * C);
    m->dres = take(base, &used, N * C);
    m->dln = take(base, &used, N * C);
    m->datty = take(base, &used, N * C);
    m->dqkv = take(base, &used, N * 3 * C);
    m->dinter = take(base, &used, N * I);
    m->dinter_act = take(base, &used, N * I);
    return used;
}

/* BertPreTrainedModel's initialisation (see bert.h), tensors filled in slab order from one generator. */
static void init_params(const void *cv, const zt_param_info *tensors, int n, float *params, uint64_t seed)
{
    const zt_bert_config *cfg = cv;
    zt_rng r;
    zt_rng_seed(&r, seed);
    const size_t C = (size_t)cfg->hidden_size, pad = (size_t)cfg->pad_token_id;
    for (int i = 0; i < n; i++) {
        const zt_param_info *t = &tensors[i];
        float *x = params + t->offset;
        const size_t len = strlen(t->name);
        const bool norm_weight = (len > 16 && strcmp(t->name + len - 16, "LayerNorm.weight") == 0) ||
                                 (len > 17 && strcmp(t->name + len - 17, "layer_norm.weight") == 0);
        if (norm_weight) {
            for (size_t j = 0; j < t->numel; j++)
                x[j] = 1.0f;
        } else if (t->ndim == 1) {
            memset(x, 0, t->numel * sizeof *x);
        } else {
            zt__host_fill_normal(&r, x, t->numel, (double)cfg->initializer_range);
        }
    }
    /* nn.Embedding(padding_idx): the padding rows start at zero (RoBERTa's positions have one too). */
    memset(params + tensors[ZT_BERT_E_WORD].offset + pad * C, 0, C * sizeof(float));
    if (cfg->roberta)
        memset(params + tensors[ZT_BERT_E_POS].offset + pad * C, 0, C * sizeof(float));
}

static int head_block(const void *cv)
{
    const zt_bert_config *c = cv;
    return c->head == ZT_BERT_HEAD_MLM ? 0 : c->num_hidden_layers + 1;
}

/* RoBERTa's positions start after pad_token_id; B x T rows are counted in int with room to spare. */
static int check_batch(const void *cv, int B, int T, zt_err *err)
{
    const zt_bert_config *cfg = cv;
    const int max_T = zt_bert_config_max_seq(cfg);
    if (T > max_T)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "sequence length %d exceeds the %d positions of the model (max_position_embeddings %d%s); use a "
                       "sequence length of at most %d",
                       T, max_T, cfg->max_position_embeddings, cfg->roberta ? ", less RoBERTa's pad_token_id + 1" : "",
                       max_T);
    if ((int64_t)B * T > INT_MAX / 4)
        return zt_fail(err, ZT_EINVAL_CONFIG, "batch size %d x sequence length %d is too large (keep it below 2^29)",
                       B, T);
    return 0;
}

static void run_destroy(void *rv)
{
    bert_run *m = rv;
    if (!m)
        return;
    free(m->layers);
    free(m->acts);
    free(m->tokens);
    free(m->types);
    free(m->targets);
    free(m->lens);
    free(m);
}

/* The passes' state of host model hm; a layout needs none. */
static int run_create(void **out, const void *hm, bool acts, zt_err *err)
{
    *out = NULL;
    if (!acts)
        return 0;
    bert_run *m = calloc(1, sizeof *m);
    if (!m)
        return zt_fail(err, ZT_ENOMEM, "out of memory creating the model's tables");
    m->cfg = *(const zt_bert_config *)zt__hm_config(hm);
    m->max_B = zt__hm_max_batch(hm);
    m->max_T = zt__hm_max_seq(hm);
    m->num_tensors = zt__hm_num_tensors(hm);
    m->tensors = zt__hm_tensor(hm, 0);
    m->num_blocks = zt__hm_num_blocks(hm);
    m->blocks = zt__hm_block(hm, 0);
    const int B = m->max_B, T = m->max_T;
    const size_t N = (size_t)B * (size_t)T;
    m->layers = calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers);
    const size_t act_floats = m->layers ? carve_acts(m, NULL) : 0;
    m->acts = malloc(act_floats * sizeof(float));
    zt_advise_huge_pages(m->acts, act_floats * sizeof(float));
    m->tokens = malloc(N * sizeof(int32_t));
    m->types = malloc(N * sizeof(int32_t));
    m->targets = malloc(N * sizeof(int32_t));
    m->lens = malloc((size_t)B * sizeof(int32_t));
    if (!m->layers || !m->acts || !m->tokens || !m->types || !m->targets || !m->lens) {
        run_destroy(m);
        return zt_fail(err, ZT_ENOMEM,
                       "out of memory: activations for batch %d x %d need %.1f MiB (lower the batch size or sequence "
                       "length)",
                       B, T, (double)act_floats * sizeof(float) / (1 << 20));
    }
    ZT_ASSERT(carve_acts(m, m->acts) == act_floats);
    *out = m;
    return 0;
}

static bert_run *R(const zt_bert *m)
{
    return zt__hm_state(m);
}

extern const zt_family_def zt__family_bert;

/* The public API over the shared host model (a zt_bert is a zt__hm of this family). */
int zt_bert_create(zt_bert **out, const zt_bert_config *cfg, int B, int T, uint64_t seed, zt_err *err)
{
    return zt__family_bert.create((void **)out, cfg, B, T, seed, err);
}
int zt_bert_create_layout(zt_bert **out, const zt_bert_config *cfg, zt_err *err)
{
    return zt__family_bert.create_layout((void **)out, cfg, err);
}
void zt_bert_destroy(zt_bert *m) { zt__hm_destroy(m); }
const zt_bert_config *zt_bert_get_config(const zt_bert *m) { return zt__hm_config(m); }
size_t zt_bert_num_params(const zt_bert *m) { return zt__hm_num_params(m); }
int zt_bert_num_tensors(const zt_bert *m) { return zt__hm_num_tensors(m); }
const zt_param_info *zt_bert_tensor(const zt_bert *m, int i) { return zt__hm_tensor(m, i); }
int zt_bert_num_blocks(const zt_bert *m) { return zt__hm_num_blocks(m); }
const zt_block_info *zt_bert_block(const zt_bert *m, int i) { return zt__hm_block(m, i); }
int zt_bert_head_block(const zt_bert *m) { return zt__hm_head_block(m); }
float *zt_bert_params(zt_bert *m) { return zt__hm_params(m); }
float *zt_bert_grads(zt_bert *m) { return zt__hm_grads(m); }

/* ---------------------------------------------------------------------------------------------------- */
/* Forward and backward                                                                                 */
/* ---------------------------------------------------------------------------------------------------- */

/* Tensor idx inside its block's flat buffer bp. */
static const float *in_block(const bert_run *m, const float *bp, int idx)
{
    const zt_param_info *t = &m->tensors[idx];
    return bp + (t->offset - m->blocks[t->block].offset);
}

static float *in_block_mut(const bert_run *m, float *bp, int idx)
{
    const zt_param_info *t = &m->tensors[idx];
    return bp + (t->offset - m->blocks[t->block].offset);
}

/* The hidden states entering encoder layer l (l == L: the encoder's output, the head's input). */
static const float *layer_input(const bert_run *m, int l)
{
    return l > 0 ? m->layers[l - 1].out : m->enc;
}

/* Rows of the position table that position 0 reads: RoBERTa's positions start after its padding id. */
static size_t position_row0(const bert_run *m)
{
    return m->cfg.roberta ? (size_t)m->cfg.pad_token_id + 1 : 0;
}

static void act_forward(enum zt_bert_act act, float *out, const float *inp, size_t n)
{
    if (act == ZT_BERT_ACT_GELU)
        zt_cpu_gelu_erf_forward(out, inp, n);
    else
        zt_cpu_gelu_forward(out, inp, n);
}

static void act_backward(enum zt_bert_act act, float *dinp, const float *inp, const float *dout, size_t n)
{
    if (act == ZT_BERT_ACT_GELU)
        zt_cpu_gelu_erf_backward(dinp, inp, dout, n);
    else
        zt_cpu_gelu_backward(dinp, inp, dout, n);
}

/* The activation of the masked-LM head's transform: RoBERTa's lm_head applies the exact GELU always. */
static enum zt_bert_act head_act(const bert_run *m)
{
    return m->cfg.roberta ? ZT_BERT_ACT_GELU : m->cfg.hidden_act;
}

/* Token types for the next forward; see bert.h. */
void zt_bert_set_token_types(zt_bert *m, const int32_t *types)
{
    R(m)->next_types = types;
}

/* Starts a forward pass over tokens [B,T]: copies tokens and token types, finds each sequence's length
 * before its trailing padding. */
static void run_forward_begin(void *rv, const int32_t *tokens, int B, int T, const int32_t *pos)
{
    bert_run *m = rv;
    ZT_ASSERT(pos == NULL); /* BERT does not pack documents (the config refuses --sft-pack for it) */
    ZT_ASSERT(B >= 1 && B <= m->max_B && T >= 1 && T <= m->max_T);
    const int V = m->cfg.vocab_size, N = B * T, pad = m->cfg.pad_token_id;
    for (int i = 0; i < N; i++)
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < V);
    memmove(m->tokens, tokens, (size_t)N * sizeof *tokens);
    if (m->next_types) {
        for (int i = 0; i < N; i++)
            ZT_ASSERT(m->next_types[i] >= 0 && m->next_types[i] < m->cfg.type_vocab_size);
        memmove(m->types, m->next_types, (size_t)N * sizeof *m->types);
    } else {
        memset(m->types, 0, (size_t)N * sizeof *m->types);
    }
    m->next_types = NULL;
    for (int b = 0; b < B; b++) {
        int len = T;
        while (len > 0 && m->tokens[b * T + len - 1] == pad)
            len--;
        m->lens[b] = len;
    }
    m->B = B;
    m->T = T;
    m->have_targets = false;
}

/* Runs block `block` of the forward pass with its parameters at bp; see bert.h. */
static void run_forward_block(void *rv, int block, const float *bp)
{
    bert_run *m = rv;
    ZT_ASSERT(block >= 0 && block < m->num_blocks);
    const int B = m->B, T = m->T, N = B * T;
    const int C = m->cfg.hidden_size, NH = m->cfg.num_attention_heads, L = m->cfg.num_hidden_layers;
    const int I = m->cfg.intermediate_size;
    const float eps = m->cfg.layer_norm_eps;
    const size_t NC = (size_t)N * C;
    if (block == 0) {
        const float *wpe = in_block(m, bp, ZT_BERT_E_POS) + position_row0(m) * (size_t)C;
        zt_cpu_embedding_forward_typed(m->emb, m->tokens, m->types, in_block(m, bp, ZT_BERT_E_WORD), wpe,
                                       in_block(m, bp, ZT_BERT_E_TYPE), B, T, C);
        zt_cpu_layernorm_forward(m->enc, m->emb_mean, m->emb_rstd, m->emb, in_block(m, bp, ZT_BERT_E_LN_W),
                                 in_block(m, bp, ZT_BERT_E_LN_B), N, C, eps);
        return;
    }
    const float *h = layer_input(m, L);
#define H(k) in_block(m, bp, HEAD_TENSOR(m, ZT_BERT_H_##k))
    if (block == L + 1 && m->cfg.head == ZT_BERT_HEAD_MLM) {
        zt_cpu_matmul_forward(m->tr_pre, h, H(DENSE_W), H(DENSE_B), N, C, C);
        act_forward(head_act(m), m->tr_act, m->tr_pre, NC);
        zt_cpu_layernorm_forward(m->tr_ln, m->tr_mean, m->tr_rstd, m->tr_act, H(LN_W), H(LN_B), N, C, eps);
        memcpy(m->dec_bias, H(BIAS), (size_t)m->cfg.vocab_size * sizeof(float)); /* for the head pass */
        return;
    }
    if (block == L + 1) {
        zt_cpu_first_token_forward(m->first, h, B, T, C);
        zt_cpu_matmul_forward(m->pool_pre, m->first, H(POOL_W), H(POOL_B), B, C, C);
        zt_cpu_tanh_forward(m->pooled, m->pool_pre, (size_t)B * C);
        return;
    }
#undef H
    const int l = block - 1;
    layer_acts *a = &m->layers[l];
    const float *x = layer_input(m, l);
    const zt_attention_dims dims = {.B = B, .T = T, .NH = NH, .NKV = NH, .HS = C / NH, .causal = false};
#define W(k) in_block(m, bp, LAYER_TENSOR(l, ZT_BERT_T_##k))
    zt_cpu_matmul_forward(a->qkv, x, W(Q_W), W(Q_B), N, C, 3 * C); /* q, k, v weights are adjacent */
    zt_cpu_attention_forward_gqa(a->atty, a->att_lse, a->qkv, m->lens, &dims);
    zt_cpu_matmul_forward(m->proj, a->atty, W(AO_W), W(AO_B), N, C, C);
    zt_cpu_residual_forward(a->res1, x, m->proj, NC);
    zt_cpu_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, a->res1, W(ALN_W), W(ALN_B), N, C, eps);
    zt_cpu_matmul_forward(a->inter, a->ln1, W(I_W), W(I_B), N, C, I);
    act_forward(m->cfg.hidden_act, a->inter_act, a->inter, (size_t)N * I);
    zt_cpu_matmul_forward(m->proj, a->inter_act, W(O_W), W(O_B), N, I, C);
    zt_cpu_residual_forward(a->res2, a->ln1, m->proj, NC);
    zt_cpu_layernorm_forward(a->out, a->out_mean, a->out_rstd, a->res2, W(OLN_W), W(OLN_B), N, C, eps);
#undef W
}

/* Index of the first largest of x[0..n). */
static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The head's output layer and, with targets, the loss; see bert.h. */
static float run_forward_head(void *rv, const float *hp, const int32_t *targets)
{
    bert_run *m = rv;
    const int B = m->B, T = m->T, N = B * T, C = m->cfg.hidden_size, pad = m->cfg.pad_token_id;
    const bool mlm = m->cfg.head == ZT_BERT_HEAD_MLM;
    const int rows = mlm ? N : B, K = zt_bert_config_outputs(&m->cfg);
    if (mlm)
        zt_cpu_matmul_forward(m->logits, m->tr_ln, in_block(m, hp, ZT_BERT_E_WORD), m->dec_bias, N, C, K);
    else
        zt_cpu_matmul_forward(m->logits, m->pooled, in_block(m, hp, HEAD_TENSOR(m, ZT_BERT_H_CLS_W)),
                              in_block(m, hp, HEAD_TENSOR(m, ZT_BERT_H_CLS_B)), B, C, K);
    m->n_valid = m->n_correct = 0;
    if (!targets)
        return 0.0f;
    /* The counted targets: none at a padding token (for classification: a sequence that starts with one). */
    for (int r = 0; r < rows; r++) {
        const int at = mlm ? r : r * T;
        const int32_t y = targets[at];
        ZT_ASSERT(y == IGNORE_INDEX || (y >= 0 && y < K));
        if (!mlm)
            for (int t = 1; t < T; t++)
                ZT_ASSERT(targets[at + t] == IGNORE_INDEX); /* one label per sequence, at its first position */
        m->targets[r] = m->tokens[at] == pad ? IGNORE_INDEX : y;
    }
    m->n_valid = zt_cpu_crossentropy_forward_backward(m->losses, NULL, m->logits, m->targets, rows, K, IGNORE_INDEX,
                                                      0.0f);
    for (int r = 0; r < rows; r++)
        if (m->targets[r] != IGNORE_INDEX && argmax(m->logits + (size_t)r * K, K) == m->targets[r])
            m->n_correct++;
    m->have_targets = true;
    if (m->n_valid == 0)
        return 0.0f;
    double sum = 0.0;
    for (int r = 0; r < rows; r++)
        sum += m->losses[r];
    return (float)(sum / m->n_valid);
}

/* The head's backward; see bert.h. */
static void run_backward_head(void *rv, const float *hp, float *hg, float loss_scale)
{
    bert_run *m = rv;
    ZT_ASSERT(m->have_targets); /* backward needs a forward pass with targets, once */
    m->have_targets = false;
    m->backward_skip = m->n_valid == 0;
    if (m->backward_skip)
        return;
    const int B = m->B, N = B * m->T, C = m->cfg.hidden_size, K = zt_bert_config_outputs(&m->cfg);
    const float scale = loss_scale / (float)m->n_valid;
    if (m->cfg.head == ZT_BERT_HEAD_MLM) {
        /* dlogits replace the logits in place (the kernel allows the alias). */
        zt_cpu_crossentropy_forward_backward(m->losses, m->logits, m->logits, m->targets, N, K, IGNORE_INDEX, scale);
        memset(m->dln, 0, (size_t)N * C * sizeof(float));
        memset(m->ddec_bias, 0, (size_t)K * sizeof(float));
        zt_cpu_matmul_backward(m->dln, in_block_mut(m, hg, ZT_BERT_E_WORD), m->ddec_bias, m->logits, m->tr_ln,
                               in_block(m, hp, ZT_BERT_E_WORD), N, C, K);
        return;
    }
    zt_cpu_crossentropy_forward_backward(m->losses, m->logits, m->logits, m->targets, B, K, IGNORE_INDEX, scale);
    memset(m->dpooled, 0, (size_t)B * C * sizeof(float));
    zt_cpu_matmul_backward(m->dpooled, in_block_mut(m, hg, HEAD_TENSOR(m, ZT_BERT_H_CLS_W)),
                           in_block_mut(m, hg, HEAD_TENSOR(m, ZT_BERT_H_CLS_B)), m->logits, m->pooled,
                           in_block(m, hp, HEAD_TENSOR(m, ZT_BERT_H_CLS_W)), B, C, K);
}

/* Runs block `block` of the backward pass; see bert.h. */
static void run_backward_block(void *rv, int block, const float *bp, float *bg)
{
    bert_run *m = rv;
    ZT_ASSERT(block >= 0 && block < m->num_blocks);
    if (m->backward_skip)
        return;
    const int B = m->B, T = m->T, N = B * T;
    const int C = m->cfg.hidden_size, NH = m->cfg.num_attention_heads, L = m->cfg.num_hidden_layers;
    const int I = m->cfg.intermediate_size;
    const size_t NC = (size_t)N * C, NI = (size_t)N * I;
    if (block == L + 1) {
#define W(k) in_block(m, bp, HEAD_TENSOR(m, ZT_BERT_H_##k))
#define G(k) in_block_mut(m, bg, HEAD_TENSOR(m, ZT_BERT_H_##k))
        const float *h = layer_input(m, L);
        memset(m->dres, 0, NC * sizeof(float));
        if (m->cfg.head == ZT_BERT_HEAD_MLM) {
            /* m->dln holds d(transform LayerNorm output) from the decoder. */
            memset(m->proj, 0, NC * sizeof(float));
            zt_cpu_layernorm_backward(m->proj, G(LN_W), G(LN_B), m->dln, m->tr_act, W(LN_W), m->tr_mean,
                                      m->tr_rstd, N, C);
            memset(m->datty, 0, NC * sizeof(float));
            act_backward(head_act(m), m->datty, m->tr_pre, m->proj, NC);
            zt_cpu_matmul_backward(m->dres, G(DENSE_W), G(DENSE_B), m->datty, h, W(DENSE_W), N, C, C);
            zt_cpu_add_inplace(G(BIAS), m->ddec_bias, (size_t)m->cfg.vocab_size);
        } else {
            const size_t BC = (size_t)B * C;
            memset(m->dpool_pre, 0, BC * sizeof(float));
            zt_cpu_tanh_backward(m->dpool_pre, m->pooled, m->dpooled, BC);
            memset(m->dfirst, 0, BC * sizeof(float));
            zt_cpu_matmul_backward(m->dfirst, G(POOL_W), G(POOL_B), m->dpool_pre, m->first, W(POOL_W), B, C, C);
            zt_cpu_first_token_backward(m->dres, m->dfirst, B, T, C);
        }
        return;
#undef W
#undef G
    }
    if (block == 0) {
        memset(m->dln, 0, NC * sizeof(float));
        zt_cpu_layernorm_backward(m->dln, in_block_mut(m, bg, ZT_BERT_E_LN_W), in_block_mut(m, bg, ZT_BERT_E_LN_B),
                                  m->dres, m->emb, in_block(m, bp, ZT_BERT_E_LN_W), m->emb_mean, m->emb_rstd, N, C);
        zt_cpu_embedding_backward_typed(in_block_mut(m, bg, ZT_BERT_E_WORD),
                                        in_block_mut(m, bg, ZT_BERT_E_POS) + position_row0(m) * (size_t)C,
                                        in_block_mut(m, bg, ZT_BERT_E_TYPE), m->dln, m->tokens, m->types, B, T, C);
        return;
    }
    /* m->dres holds the gradient of the layer's output; it leaves with the gradient of its input. */
    const int l = block - 1;
    const layer_acts *a = &m->layers[l];
    const float *x = layer_input(m, l);
    const zt_attention_dims dims = {.B = B, .T = T, .NH = NH, .NKV = NH, .HS = C / NH, .causal = false};
#define W(k) in_block(m, bp, LAYER_TENSOR(l, ZT_BERT_T_##k))
#define G(k) in_block_mut(m, bg, LAYER_TENSOR(l, ZT_BERT_T_##k))
    /* out = LN(res2), res2 = ln1 + output.dense(act(intermediate.dense(ln1))). */
    memset(m->dln, 0, NC * sizeof(float));
    zt_cpu_layernorm_backward(m->dln, G(OLN_W), G(OLN_B), m->dres, a->res2, W(OLN_W), a->out_mean,
                              a->out_rstd, N, C);
    memset(m->dinter_act, 0, NI * sizeof(float));
    zt_cpu_matmul_backward(m->dinter_act, G(O_W), G(O_B), m->dln, a->inter_act, W(O_W), N, I, C);
    memset(m->dinter, 0, NI * sizeof(float));
    act_backward(m->cfg.hidden_act, m->dinter, a->inter, m->dinter_act, NI);
    zt_cpu_matmul_backward(m->dln, G(I_W), G(I_B), m->dinter, a->ln1, W(I_W), N, C, I); /* dln: d(ln1) */
    /* ln1 = LN(res1), res1 = x + attention.output.dense(attention(qkv(x))). */
    memset(m->dres, 0, NC * sizeof(float));
    zt_cpu_layernorm_backward(m->dres, G(ALN_W), G(ALN_B), m->dln, a->res1, W(ALN_W), a->ln1_mean,
                              a->ln1_rstd, N, C);
    memset(m->datty, 0, NC * sizeof(float));
    zt_cpu_matmul_backward(m->datty, G(AO_W), G(AO_B), m->dres, a->atty, W(AO_W), N, C, C);
    memset(m->dqkv, 0, 3 * NC * sizeof(float));
    zt_cpu_attention_backward_gqa(m->dqkv, m->datty, a->qkv, a->atty, a->att_lse, m->lens, &dims);
    zt_cpu_matmul_backward(m->dres, G(Q_W), G(Q_B), m->dqkv, x, W(Q_W), N, C, 3 * C); /* dres: d(x) */
#undef W
#undef G
}

/* Poisons an encoder layer's intermediate activations (checkpointing drops them); see bert.h. */
static void run_discard_block(void *rv, int block)
{
    bert_run *m = rv;
    if (block < 1 || block > m->cfg.num_hidden_layers)
        return;
    const size_t N = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg.hidden_size;
    const size_t I = (size_t)m->cfg.intermediate_size, NH = (size_t)m->cfg.num_attention_heads;
    layer_acts *a = &m->layers[block - 1];
    struct {
        float *p;
        size_t n;
    } parts[] = {{a->qkv, N * 3 * C}, {a->atty, N * C},     {a->att_lse, N * NH}, {a->res1, N * C},
                 {a->ln1, N * C},     {a->ln1_mean, N},     {a->ln1_rstd, N},     {a->inter, N * I},
                 {a->inter_act, N * I}, {a->res2, N * C},   {a->out_mean, N},     {a->out_rstd, N}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        for (size_t i = 0; i < parts[k].n; i++)
            parts[k].p[i] = NAN;
}

static const float *run_logits(const void *rv)
{
    return ((const bert_run *)rv)->logits;
}

static const zt__hm_passes passes = {.create = run_create, .destroy = run_destroy,
                                     .forward_begin = run_forward_begin, .forward_block = run_forward_block,
                                     .forward_head = run_forward_head, .backward_head = run_backward_head,
                                     .backward_block = run_backward_block, .discard_block = run_discard_block,
                                     .logits = run_logits};

/* The passes of the public API, as the engine's CPU executor drives them (bert.h). */
void zt_bert_forward_begin(zt_bert *m, const int32_t *tokens, int B, int T)
{
    run_forward_begin(R(m), tokens, B, T, NULL);
}
void zt_bert_forward_block(zt_bert *m, int block, const float *bp) { run_forward_block(R(m), block, bp); }
float zt_bert_forward_head(zt_bert *m, const float *hp, const int32_t *targets)
{
    return run_forward_head(R(m), hp, targets);
}
void zt_bert_backward_head(zt_bert *m, const float *hp, float *hg, float loss_scale)
{
    run_backward_head(R(m), hp, hg, loss_scale);
}
void zt_bert_backward_block(zt_bert *m, int block, const float *bp, float *bg)
{
    run_backward_block(R(m), block, bp, bg);
}
void zt_bert_discard_block_acts(zt_bert *m, int block) { run_discard_block(R(m), block); }
const float *zt_bert_logits(const zt_bert *m) { return run_logits(R(m)); }

/* The counted rows of the last forward with targets and the correct ones among them. */
void zt_bert_accuracy(const zt_bert *m, int *correct, int *counted)
{
    *correct = R(m)->n_correct;
    *counted = R(m)->n_valid;
}

/* Runs the whole forward pass; see bert.h. */
float zt_bert_forward(zt_bert *m, const int32_t *tokens, const int32_t *targets, int B, int T)
{
    zt_bert_forward_begin(m, tokens, B, T);
    return zt__hm_forward_rest(m, targets);
}

/* Accumulates d(mean loss of the last forward)/d(params) * loss_scale into the gradient slab. */
void zt_bert_backward(zt_bert *m, float loss_scale)
{
    zt__hm_backward(m, loss_scale);
}

/* Sets every gradient to zero. */
void zt_bert_zero_grad(zt_bert *m)
{
    zt__hm_zero_grad(m);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Masked-LM inputs                                                                                     */
/* ---------------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------------- */
/* Hugging Face files and the family definition                                                         */
/* ---------------------------------------------------------------------------------------------------- */

extern const zt_family_def zt__family_bert;

/* The engine's CPU executor of m; see bert.h. */
int zt_bert_model_cpu(zt_model **out, zt_bert *m, int max_micro, const bool *ckpt_layers, zt_err *err)
{
    return zt__cpu_exec_create(out, &zt__family_bert, m, max_micro, ckpt_layers, err);
}

/* Exports the parameters as F32 safetensors with Hugging Face names; see bert.h. */
int zt_bert_export(const zt_bert *m, const char *path, zt_err *err)
{
    return zt__host_export(&zt__family_bert, m, path, err);
}

/* Imports every parameter; see bert.h. */
int zt_bert_import(zt_bert *m, const char *path, zt_err *err)
{
    return zt__host_import(&zt__family_bert, m, path, false, err);
}

/* Imports a pretrained body for fine-tuning; see bert.h. */
int zt_bert_import_pretrained(zt_bert *m, const char *path, zt_err *err)
{
    return zt__host_import(&zt__family_bert, m, path, true, err);
}

static void hf_export_name(const void *m, const zt_param_info *t, char *out, size_t cap)
{
    (void)m;
    snprintf(out, cap, "%s", t->name);
}

/* Whether a file tensor's name is that of a task head the model does not have: another head's (cls.,
 * lm_head., classifier.), BERT's pre-training heads (cls.) or a pooler that a masked-LM model leaves out. */
static bool is_other_head(const zt_bert_config *c, const char *name)
{
    const char *prefix = c->roberta ? "roberta." : "bert.";
    if (strncmp(name, prefix, strlen(prefix)) == 0)
        name += strlen(prefix);
    return strncmp(name, "cls.", 4) == 0 || strncmp(name, "lm_head.", 8) == 0 ||
           strncmp(name, "classifier.", 11) == 0 || strncmp(name, "pooler.", 7) == 0;
}

/* A file's tensor name for the model: names may lack the "bert." / "roberta." prefix and LayerNorm "gamma"
 * / "beta" are weight / bias; position and token type ids are buffers; the masked-LM decoder's weight and
 * bias are tied to the word embeddings and the head's bias. */
static enum zt_hf_kind hf_map(const void *m, const char *name, int *idx)
{
    const zt_bert_config *c = zt__hm_config(m);
    char buf[160];
    const char *prefix = c->roberta ? "roberta." : "bert.";
    const size_t plen = strlen(prefix);
    if (strlen(name) + plen + 8 >= sizeof buf)
        return ZT_HF_UNKNOWN;
    if (strncmp(name, "embeddings.", 11) == 0 || strncmp(name, "encoder.", 8) == 0 || strncmp(name, "pooler.", 7) == 0)
        snprintf(buf, sizeof buf, "%s%s", prefix, name);
    else
        snprintf(buf, sizeof buf, "%s", name);
    size_t len = strlen(buf);
    if (len > 15 && strcmp(buf + len - 15, "LayerNorm.gamma") == 0)
        strcpy(buf + len - 5, "weight");
    else if (len > 14 && strcmp(buf + len - 14, "LayerNorm.beta") == 0)
        strcpy(buf + len - 4, "bias");
    const char *sub = buf + (strncmp(buf, prefix, plen) == 0 ? plen : 0);
    if (strcmp(sub, "embeddings.position_ids") == 0 || strcmp(sub, "embeddings.token_type_ids") == 0)
        return ZT_HF_BUFFER;
    if (c->head == ZT_BERT_HEAD_MLM) {
        const char *dw = c->roberta ? "lm_head.decoder.weight" : "cls.predictions.decoder.weight";
        const char *db = c->roberta ? "lm_head.decoder.bias" : "cls.predictions.decoder.bias";
        if (strcmp(buf, dw) == 0 || strcmp(buf, db) == 0) {
            *idx = strcmp(buf, dw) == 0 ? ZT_BERT_E_WORD : ZT_BERT_HEAD_TENSOR(c->num_hidden_layers, ZT_BERT_H_BIAS);
            return ZT_HF_TIED;
        }
    }
    *idx = zt__host_find_tensor(zt__hm_tensor(m, 0), zt__hm_num_tensors(m), buf);
    if (*idx >= 0)
        return ZT_HF_PARAM;
    return is_other_head(c, name) ? ZT_HF_OTHER_HEAD : ZT_HF_UNKNOWN;
}

static void hf_describe(const void *m, char *out, size_t cap)
{
    const zt_bert_config *c = zt__hm_config(m);
    snprintf(out, cap, "a %s with %d layers", zt_bert_config_architecture(c), c->num_hidden_layers);
}

static const zt_hf_names hf_names = {
    .export_name = hf_export_name,
    .map = hf_map,
    .describe = hf_describe,
    .tied_fix = "ztrain's decoder is tied to it: an untied decoder is not supported",
    .head_optional = true,
};

/* The family's entries over void pointers (family.h). */
static void f_config_default(void *c, const char *model_type)
{
    if (strcmp(model_type, "roberta") == 0)
        zt_bert_config_default_roberta(c);
    else
        zt_bert_config_default(c);
}
static int f_config_from_json(void *c, const cJSON *o, const char *where, zt_err *err)
{
    return zt_bert_config_from_json(c, o, where, err);
}
static int f_config_save(const void *c, const char *path, zt_err *err)
{
    return zt_bert_config_save(c, path, err);
}
static int f_config_validate(const void *c, zt_err *err)
{
    return zt_bert_config_validate(c, err);
}

#define F(name, kind, hash_only) {#name, offsetof(zt_bert_config, name), ZT__HM_##kind, hash_only}
static const zt__hm_field fields[] = {
    F(roberta, BOOL, false), F(head, ENUM, false), F(vocab_size, INT, false), F(hidden_size, INT, false),
    F(num_hidden_layers, INT, false), F(num_attention_heads, INT, false), F(intermediate_size, INT, false),
    F(max_position_embeddings, INT, false), F(type_vocab_size, INT, false), F(pad_token_id, INT, false),
    F(hidden_act, ENUM, false), F(layer_norm_eps, FLOAT, false), F(num_labels, INT, false),
    F(initializer_range, FLOAT, true),
};
#undef F

static void f_config_describe(const void *c, char *buf, size_t cap)
{
    const zt_bert_config *e = c;
    snprintf(buf, cap, "%s, %d layers x %d wide, %d heads, MLP %d, vocab %d, %d positions, %s",
             e->roberta ? "RoBERTa" : "BERT", e->num_hidden_layers, e->hidden_size, e->num_attention_heads,
             e->intermediate_size, e->vocab_size, zt_bert_config_max_seq(e),
             e->head == ZT_BERT_HEAD_CLASSIFY ? "classification head" : "masked-LM head");
    if (e->head == ZT_BERT_HEAD_CLASSIFY) {
        size_t k = strlen(buf);
        snprintf(buf + k, cap > k ? cap - k : 0, " (%d labels)", e->num_labels);
    }
}

static void f_config_shape(const void *c, zt_family_shape *s)
{
    const zt_bert_config *e = c;
    *s = (zt_family_shape){.layers = e->num_hidden_layers, .positions = zt_bert_config_max_seq(e),
                           .vocab = e->vocab_size, .width = e->hidden_size, .heads = e->num_attention_heads,
                           .num_params = zt_bert_config_num_params(e),
                           .task = e->head == ZT_BERT_HEAD_CLASSIFY ? ZT_TASK_CLASSIFY : ZT_TASK_MASKED_LM,
                           .pad_token_id = e->pad_token_id,
                           .num_labels = e->head == ZT_BERT_HEAD_CLASSIFY ? e->num_labels : 0};
}

static const char *f_config_label(const void *c, int i, char *buf, size_t cap)
{
    return zt_bert_config_label(c, i, buf, cap);
}

static const zt__hm_spec spec = {.def = &zt__family_bert, .config_size = sizeof(zt_bert_config),
                                 .count_tensors = count_tensors, .build_layout = build_layout, .init = init_params,
                                 .passes = &passes, .head_block = head_block, .check_batch = check_batch};

static int f_create(void **out, const void *c, int B, int T, uint64_t seed, zt_err *err)
{
    return zt__hm_create((zt__hm **)out, &spec, c, B, T, seed, err);
}
static int f_create_layout(void **out, const void *c, zt_err *err)
{
    return zt__hm_create_layout((zt__hm **)out, &spec, c, err);
}
static void f_set_token_types(void *m, const int32_t *types) { zt_bert_set_token_types(m, types); }
static void f_accuracy(const void *m, int *correct, int *counted) { zt_bert_accuracy(m, correct, counted); }
#ifdef ZT_WITH_CUDA
static int f_cuda_create(zt_model **out, const void *m, int B, int T, int max_micro, enum zt_dtype dtype,
                         const bool *ckpt_layers, zt_err *err)
{
    return zt_bert_cuda_create(out, m, B, T, max_micro, dtype, ckpt_layers, err);
}
static zt_model *f_cuda_shape(const void *m, int B, int T, int max_micro, enum zt_dtype dtype, const bool *ckpt)
{
    return zt_bert_cuda_shape(m, B, T, max_micro, dtype, ckpt);
}
#endif

static const char *const model_types[] = {"bert", "roberta", NULL};

const zt_family_def zt__family_bert = {
    .name = "bert",
    .model_types = model_types,
    .config_default = f_config_default,
    .config_from_json = f_config_from_json,
    .config_save = f_config_save,
    .config_validate = f_config_validate,
    ZT__HM_FIELD_ENTRIES(fields, 2)
    .config_describe = f_config_describe,
    .config_shape = f_config_shape,
    .config_label = f_config_label,
    .create = f_create,
    .create_layout = f_create_layout,
    .hf = &hf_names,
    ZT__HM_HOST_ENTRIES
    .embedding_reads_weights = true,
    .set_token_types = f_set_token_types,
    .accuracy = f_accuracy,
#ifdef ZT_WITH_CUDA
    .cuda_create = f_cuda_create,
    .cuda_shape = f_cuda_shape,
#endif
};
