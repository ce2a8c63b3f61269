/* BERT and RoBERTa as data: Hugging Face config.json reading and writing, the tensor table in blocks with
 * Hugging Face's names, BertPreTrainedModel's initialisation, the encoder program's view of the model
 * (encoder.h: its CPU runner is this family's per-block passes, its CUDA executor the family's), and the
 * safetensors names and family definition. */
#include "worker/models/bert.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"         /* strict reading of config.json */
#include "worker/models/cpu_exec.h"    /* the engine's CPU executor */
#include "worker/models/encoder.h"     /* the encoder program, its CPU runner and CUDA executor */
#include "worker/models/family.h"      /* the family definition */
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_io.h"     /* safetensors import and export from the tensor table */
#include "worker/models/host_model.h"  /* config field tables */
#include "worker/models/host_shared.h" /* the normal initialisation */

/* Limits that keep every size product far from overflow and catch typos such as an extra zero. */
#define BERT_MAX_LAYERS 1024
#define BERT_MAX_HIDDEN 65536
#define BERT_MAX_INTERMEDIATE (1 << 20)
#define BERT_MAX_POSITIONS (1 << 20)
#define BERT_MAX_VOCAB (1 << 24)
#define BERT_MAX_TYPES 1024



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
    return zt__cfg_label(cfg->label_names, i, buf, cap);
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
    if (!zt__cfg_labels_ok(c->label_names, sizeof c->label_names, c->num_labels))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: the label names do not hold %d non-empty names", where,
                       c->num_labels);
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
    if ((rc = zt__cfg_read_labels(&r, obj, ZT_BERT_MAX_LABELS, &c.num_labels, c.label_names, sizeof c.label_names,
                                  err)) < 0 || (rc = zt__cfg_finish(&r, obj, NULL, err)) < 0 ||
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
    if (cfg->head == ZT_BERT_HEAD_CLASSIFY || cfg->num_labels != 2 || cfg->label_names[0])
        zt__cfg_write_labels(o, cfg->label_names, cfg->num_labels);
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

/* ---------------------------------------------------------------------------------------------------- */
/* Creation                                                                                             */
/* ---------------------------------------------------------------------------------------------------- */

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


/* The encoder program's view of cfg (encoder.h): the roles of the tensor table's entries. */
static void arch_of(const zt_bert_config *cfg, zt__enc_arch *a)
{
    const int L = cfg->num_hidden_layers;
    const bool mlm = cfg->head == ZT_BERT_HEAD_MLM;
    *a = (zt__enc_arch){
        .L = L, .C = cfg->hidden_size, .NH = cfg->num_attention_heads, .F = cfg->intermediate_size,
        .V = cfg->vocab_size, .types = cfg->type_vocab_size, .eps = cfg->layer_norm_eps,
        .act = cfg->hidden_act == ZT_BERT_ACT_GELU ? ZT__ENC_GELU_ERF : ZT__ENC_GELU_TANH,
        /* RoBERTa's lm_head applies the exact GELU whatever hidden_act says, as transformers does */
        .head_act = cfg->roberta || cfg->hidden_act == ZT_BERT_ACT_GELU ? ZT__ENC_GELU_ERF : ZT__ENC_GELU_TANH,
        .head = mlm ? ZT__ENC_HEAD_MLM : ZT__ENC_HEAD_CLASSIFY, .K = zt_bert_config_outputs(cfg),
        .pos_row0 = cfg->roberta ? cfg->pad_token_id + 1 : 0, .pad_token_id = cfg->pad_token_id,
        .emb = {ZT_BERT_E_WORD, ZT_BERT_E_POS, ZT_BERT_E_TYPE, ZT_BERT_E_LN_W, ZT_BERT_E_LN_B},
        .layer0 = ZT_BERT_LAYER_TENSOR(0, 0), .per_layer = ZT_BERT_T_COUNT,
        .role = {ZT_BERT_T_Q_W, ZT_BERT_T_Q_B, ZT_BERT_T_AO_W, ZT_BERT_T_AO_B, ZT_BERT_T_ALN_W, ZT_BERT_T_ALN_B,
                 ZT_BERT_T_I_W, ZT_BERT_T_I_B, ZT_BERT_T_O_W, ZT_BERT_T_O_B, ZT_BERT_T_OLN_W, ZT_BERT_T_OLN_B},
        .packed = {[ZT_BERT_T_K_W] = true, [ZT_BERT_T_V_W] = true, [ZT_BERT_T_K_B] = true, [ZT_BERT_T_V_B] = true},
        .head_block = mlm ? 0 : L + 1,
    };
    const int h = ZT_BERT_HEAD_TENSOR(L, 0);
    const int mlm_t[ZT__ENC_H_ROLES] = {h + ZT_BERT_H_DENSE_W, h + ZT_BERT_H_DENSE_B, h + ZT_BERT_H_LN_W,
                                        h + ZT_BERT_H_LN_B, h + ZT_BERT_H_BIAS, ZT_BERT_E_WORD, -1};
    const int cls_t[ZT__ENC_H_ROLES] = {h + ZT_BERT_H_POOL_W, h + ZT_BERT_H_POOL_B, -1, -1, -1, h + ZT_BERT_H_CLS_W,
                                        h + ZT_BERT_H_CLS_B};
    memcpy(a->head_t, mlm ? mlm_t : cls_t, sizeof a->head_t);
}

/* The encoder's CPU runner as the passes of host model hm; a layout needs none. */
static int run_create(void **out, const void *hm, bool acts, zt_err *err)
{
    *out = NULL;
    if (!acts)
        return 0;
    zt__enc_arch a;
    arch_of(zt__hm_config(hm), &a);
    return zt__enc_cpu_create((zt__enc_cpu **)out, &a, zt__hm_tensor(hm, 0), zt__hm_block(hm, 0),
                              zt__hm_max_batch(hm), zt__hm_max_seq(hm), err);
}

static const zt__hm_passes passes = {
    .create = run_create, .destroy = zt__enc_cpu_destroy, .forward_begin = zt__enc_cpu_begin,
    .forward_block = zt__enc_cpu_forward_block, .forward_head = zt__enc_cpu_forward_head,
    .backward_head = zt__enc_cpu_backward_head, .backward_block = zt__enc_cpu_backward_block,
    .discard_block = zt__enc_cpu_discard_block, .logits = zt__enc_cpu_logits};


/* ---------------------------------------------------------------------------------------------------- */
/* Hugging Face files and the family definition                                                         */
/* ---------------------------------------------------------------------------------------------------- */

extern const zt_family_def zt__family_bert;

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

/* The parameter count of cfg's shape, from its tensor table. */
size_t zt_bert_config_num_params(const zt_bert_config *cfg)
{
    return zt__hm_config_num_params(&spec, cfg, cfg->num_hidden_layers);
}

/* The typed API of bert.h over the host model (host_model.h), and what the encoder's runner adds to it. */
ZT__HM_TYPED_API(zt_bert, zt_bert, zt_bert_config, spec, zt__family_bert)
void zt_bert_set_token_types(zt_bert *m, const int32_t *types) { zt__enc_cpu_set_token_types(zt__hm_state(m), types); }
void zt_bert_accuracy(const zt_bert *m, int *correct, int *counted)
{
    zt__enc_cpu_accuracy(zt__hm_state(m), correct, counted);
}

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
/* The host model as the encoder's CUDA executor reads it, with its architecture in a. */
static zt__enc_model enc_model(const zt_bert *host, zt__enc_arch *a)
{
    arch_of(zt_bert_get_config(host), a);
    return (zt__enc_model){.arch = a, .tensors = zt__hm_tensor(host, 0), .ntensors = zt__hm_num_tensors(host),
                           .nblocks = zt__hm_num_blocks(host), .num_params = zt__hm_num_params(host)};
}

/* The encoder's CUDA executor over the host model's tables; see bert.h. */
int zt_bert_cuda_create(zt_model **out, const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                        const bool *ckpt_layers, zt_err *err)
{
    zt__enc_arch a;
    const zt__enc_model em = enc_model(host, &a);
    return zt__enc_cuda_create(out, &em, B, T, max_micro, dtype, ckpt_layers, err);
}
zt_model *zt_bert_cuda_shape(const zt_bert *host, int B, int T, int max_micro, enum zt_dtype dtype,
                             const bool *ckpt_layers)
{
    zt__enc_arch a;
    const zt__enc_model em = enc_model(host, &a);
    return zt__enc_cuda_shape(&em, B, T, max_micro, dtype, ckpt_layers);
}
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
