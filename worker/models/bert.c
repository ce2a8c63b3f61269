/* BERT and RoBERTa as data: Hugging Face config.json reading and writing, the tensor table in blocks with
 * Hugging Face's names, BertPreTrainedModel's initialisation, the encoder program's view of the model
 * (encoder.h: its CPU runner is this family's per-block passes, its CUDA executor the family's), and the
 * safetensors names and family definition. */
#include "worker/models/bert.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"         /* strict reading of config.json */
#include "worker/models/cpu_exec.h"    /* the engine's CPU executor (the typed API's) */
#include "worker/models/encoder.h"     /* the encoder program, its CPU runner and CUDA executor */
#include "worker/models/family.h"      /* the family definition */
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_io.h"     /* safetensors import and export from the tensor table */
#include "worker/models/host_model.h"  /* config field tables */
#include "worker/models/tensor_table.h" /* the tensors as data */

/* Limits that keep every size product far from overflow and catch typos such as an extra zero. */
#define BERT_MAX_LAYERS 1024
#define BERT_MAX_HIDDEN 65536
#define BERT_MAX_INTERMEDIATE (1 << 20)
#define BERT_MAX_POSITIONS (1 << 20)
#define BERT_MAX_VOCAB (1 << 24)
#define BERT_MAX_TYPES 1024

/* ---- configuration ---- */

/* Sets bert-base-uncased's values with the masked-LM head. */
void zt_bert_config_default(zt_bert_config *cfg)
{
    *cfg = (zt_bert_config){.head = ZT_BERT_HEAD_MLM, .vocab_size = 30522, .hidden_size = 768,
                            .num_hidden_layers = 12, .num_attention_heads = 12, .intermediate_size = 3072,
                            .max_position_embeddings = 512, .type_vocab_size = 2, .hidden_act = ZT_BERT_ACT_GELU,
                            .layer_norm_eps = 1e-12f, .initializer_range = 0.02f, .num_labels = 2};
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
    ZT__CFG_I(S, num_hidden_layers, 1, BERT_MAX_LAYERS),
    ZT__CFG_HEADS(S, num_attention_heads, BERT_MAX_HIDDEN, "hidden_size"),
    ZT__CFG_I(S, intermediate_size, 1, BERT_MAX_INTERMEDIATE),
    ZT__CFG_I(S, max_position_embeddings, 1, BERT_MAX_POSITIONS), ZT__CFG_I(S, type_vocab_size, 1, BERT_MAX_TYPES),
    ZT__CFG_R(S, INT, pad_token_id, 0, BERT_MAX_VOCAB, ZT__CFG_NO_CHECK),
    ZT__CFG_R(S, FLOAT, layer_norm_eps, 0.0, 1.0, ZT__CFG_OPEN),
    ZT__CFG_R(S, FLOAT, initializer_range, 0.0, 10.0, ZT__CFG_ABOVE_MIN),
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

/* The rules the key table cannot say, with the source named in messages (the table's ranges are checked first,
 * zt__cfg_io_validate). */
static int validate_config(const void *cv, const char *where, zt_err *err)
{
    const zt_bert_config *c = cv;
    if (c->num_labels < 1 || c->num_labels > ZT_BERT_MAX_LABELS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: num_labels must be from 1 to %d, got %d", where,
                       ZT_BERT_MAX_LABELS, c->num_labels);
    if (c->pad_token_id < 0 || c->pad_token_id >= c->vocab_size)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: pad_token_id %d is not a token id below vocab_size %d", where,
                       c->pad_token_id, c->vocab_size);
    if (c->roberta && zt_bert_config_max_seq(c) < 1)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: max_position_embeddings %d leaves no position for RoBERTa, whose positions start at "
                       "pad_token_id + 1 = %d (make max_position_embeddings larger)",
                       where, c->max_position_embeddings, c->pad_token_id + 1);
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

/* Beyond the key table: the head from "architectures" (a list of one class name, as transformers writes it),
 * hidden_act (its tanh form under two names) and the labels. */
static int read_extra(zt_json_reader *r, const cJSON *obj, void *cv, zt_err *err)
{
    zt_bert_config *c = cv;
    char text[64] = "";
    int rc = zt_json_get_string(r, "hidden_act", text, sizeof text, err);
    if (rc < 0)
        return rc;
    if (strcmp(text, "gelu") == 0)
        c->hidden_act = ZT_BERT_ACT_GELU;
    else if (strcmp(text, "gelu_new") == 0 || strcmp(text, "gelu_pytorch_tanh") == 0)
        c->hidden_act = ZT_BERT_ACT_GELU_TANH;
    else if (text[0])
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: hidden_act is \"%s\", but ztrain implements \"gelu\" (exact) and "
                       "\"gelu_new\" (tanh approximation)", r->where, text);
    if ((rc = zt__cfg_read_labels(r, obj, ZT_BERT_MAX_LABELS, &c->num_labels, c->label_names, sizeof c->label_names,
                                  err)) < 0)
        return rc;
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
    for (int k = 0; k < 4; k++) { /* the four classes: BERT and RoBERTa, each with either head */
        zt_bert_config known = {.roberta = k >= 2, .head = k % 2 ? ZT_BERT_HEAD_CLASSIFY : ZT_BERT_HEAD_MLM};
        if (strcmp(name, zt_bert_config_architecture(&known)) != 0)
            continue;
        if (known.roberta != c->roberta)
            return zt_fail(err, ZT_EINVAL_CONFIG,
                           "%s: architectures names %s, but model_type is \"%s\" (make them agree)", r->where, name,
                           c->roberta ? "roberta" : "bert");
        c->head = known.head;
        return 0;
    }
    return zt_fail(err, ZT_EINVAL_CONFIG,
                   "%s: architectures names %s, but ztrain's BERT and RoBERTa have the heads of %s and %s (a "
                   "masked-LM or a sequence-classification head)",
                   r->where, name, c->roberta ? "RobertaForMaskedLM" : "BertForMaskedLM",
                   c->roberta ? "RobertaForSequenceClassification" : "BertForSequenceClassification");
}

/* What a written config holds beyond the table; a classifier's problem_type. */
static void write_extra(const void *cv, cJSON *o)
{
    const zt_bert_config *c = cv;
    cJSON_AddStringToObject(o, "hidden_act", c->hidden_act == ZT_BERT_ACT_GELU ? "gelu" : "gelu_new");
    if (c->head == ZT_BERT_HEAD_CLASSIFY || c->num_labels != 2 || c->label_names[0])
        zt__cfg_write_labels(o, c->label_names, c->num_labels);
    if (c->head == ZT_BERT_HEAD_CLASSIFY)
        cJSON_AddStringToObject(o, "problem_type", "single_label_classification");
}

static const char *model_type(const void *c)
{
    return ((const zt_bert_config *)c)->roberta ? "roberta" : "bert";
}

static const char *head(const void *c)
{
    return zt_bert_config_architecture(c);
}

static const char *const model_types[] = {"bert", "roberta", NULL};
static const zt__cfg_io io = {.model_types = model_types, .keys = keys, .nkeys = NKEYS,
                              .size = sizeof(zt_bert_config), .validate = validate_config, .read_extra = read_extra,
                              .write_extra = write_extra, .model_type = model_type, .head = head};

int zt_bert_config_validate(const zt_bert_config *cfg, zt_err *err)
{
    return zt__cfg_io_validate(&io, cfg, "model config", err);
}

/* The model type's defaults when it differs from cfg's (the head kept), then the io's reading. */
int zt_bert_config_from_json(zt_bert_config *cfg, const cJSON *obj, const char *where, zt_err *err)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "model_type");
    zt_bert_config c = *cfg;
    if (cJSON_IsString(type) && (strcmp(type->valuestring, "roberta") == 0) != c.roberta) {
        if (c.roberta)
            zt_bert_config_default(&c);
        else
            zt_bert_config_default_roberta(&c);
        c.head = cfg->head;
    }
    int rc = zt__cfg_io_read(&io, &c, obj, where, err);
    if (rc == 0)
        *cfg = c;
    return rc;
}

static int from_json_v(void *c, const cJSON *o, const char *where, zt_err *err)
{
    return zt_bert_config_from_json(c, o, where, err);
}

int zt_bert_config_load(zt_bert_config *cfg, const char *path, zt_err *err)
{
    zt_bert_config c;
    zt_bert_config_default(&c);
    int rc = zt__cfg_load(&c, path, from_json_v, err);
    if (rc == 0)
        *cfg = c;
    return rc;
}

int zt_bert_config_save(const zt_bert_config *cfg, const char *path, zt_err *err)
{
    return zt__cfg_io_save(&io, cfg, path, err);
}

/* ---- the tensor table ---- */

enum { D_C = 1, D_I, D_V, D_P, D_TYPES, D_LABELS }; /* dimension symbols */
enum { ROBERTA = 1u, MLM = 2u };                    /* flags: RoBERTa's names, the masked-LM head */

/* Hugging Face's names (bert.h's ZT_BERT_* order): the embeddings and layers after the body's prefix
 * ("bert." or "roberta."), then the head. Initialisation as BertPreTrainedModel's: normal(0,
 * initializer_range), LayerNorms 1 and 0, biases 0, the padding rows zero (RoBERTa's positions have one). */
#define R(part, name, d0, d1, init, role, ...) {ZT__TT(part, name, d0, d1, init, role), __VA_ARGS__}
#define NR ZT__TT_NO_ROLE
#define H_DW ZT__ENC_H_DENSE_W
#define H_DB ZT__ENC_H_DENSE_B
#define H_LW ZT__ENC_H_LN_W
#define H_LB ZT__ENC_H_LN_B
#define H_OW ZT__ENC_H_OUT_W
#define H_OB ZT__ENC_H_OUT_B
#define ROWS .split = ZT_TP_ROWS
#define COLS .split = ZT_TP_COLS
static const zt__tt_row rows[] = {
    R(EMBED, "embeddings.word_embeddings.weight", D_V, D_C, NORMAL_PAD, ZT__ENC_E_WORD, .body = true, ROWS),
    R(EMBED, "embeddings.position_embeddings.weight", D_P, D_C, NORMAL, ZT__ENC_E_POS, .body = true,
      .unless = ROBERTA),
    R(EMBED, "embeddings.position_embeddings.weight", D_P, D_C, NORMAL_PAD, ZT__ENC_E_POS, .body = true,
      .when = ROBERTA),
    R(EMBED, "embeddings.token_type_embeddings.weight", D_TYPES, D_C, NORMAL, ZT__ENC_E_TYPE, .body = true),
    R(EMBED, "embeddings.LayerNorm.weight", D_C, 0, ONE, ZT__ENC_E_LN_W, .body = true),
    R(EMBED, "embeddings.LayerNorm.bias", D_C, 0, ZERO, ZT__ENC_E_LN_B, .body = true),
    R(LAYER, "attention.self.query.weight", D_C, D_C, NORMAL, ZT__ENC_QKV_W, ROWS),
    R(LAYER, "attention.self.key.weight", D_C, D_C, NORMAL, NR, ROWS, .packed = true),
    R(LAYER, "attention.self.value.weight", D_C, D_C, NORMAL, NR, ROWS, .packed = true),
    R(LAYER, "attention.self.query.bias", D_C, 0, ZERO, ZT__ENC_QKV_B, ROWS),
    R(LAYER, "attention.self.key.bias", D_C, 0, ZERO, NR, ROWS, .packed = true),
    R(LAYER, "attention.self.value.bias", D_C, 0, ZERO, NR, ROWS, .packed = true),
    R(LAYER, "attention.output.dense.weight", D_C, D_C, NORMAL, ZT__ENC_O_W, COLS),
    R(LAYER, "attention.output.dense.bias", D_C, 0, ZERO, ZT__ENC_O_B),
    R(LAYER, "attention.output.LayerNorm.weight", D_C, 0, ONE, ZT__ENC_LN1_W),
    R(LAYER, "attention.output.LayerNorm.bias", D_C, 0, ZERO, ZT__ENC_LN1_B),
    R(LAYER, "intermediate.dense.weight", D_I, D_C, NORMAL, ZT__ENC_UP_W, ROWS),
    R(LAYER, "intermediate.dense.bias", D_I, 0, ZERO, ZT__ENC_UP_B, ROWS),
    R(LAYER, "output.dense.weight", D_C, D_I, NORMAL, ZT__ENC_DOWN_W, COLS),
    R(LAYER, "output.dense.bias", D_C, 0, ZERO, ZT__ENC_DOWN_B),
    R(LAYER, "output.LayerNorm.weight", D_C, 0, ONE, ZT__ENC_LN2_W),
    R(LAYER, "output.LayerNorm.bias", D_C, 0, ZERO, ZT__ENC_LN2_B),
    /* the masked-LM head (its decoder is the word embeddings and the head's bias) */
    R(FINAL, "cls.predictions.transform.dense.weight", D_C, D_C, NORMAL, H_DW, .when = MLM, .unless = ROBERTA),
    R(FINAL, "cls.predictions.transform.dense.bias", D_C, 0, ZERO, H_DB, .when = MLM, .unless = ROBERTA),
    R(FINAL, "cls.predictions.transform.LayerNorm.weight", D_C, 0, ONE, H_LW, .when = MLM, .unless = ROBERTA),
    R(FINAL, "cls.predictions.transform.LayerNorm.bias", D_C, 0, ZERO, H_LB, .when = MLM, .unless = ROBERTA),
    R(FINAL, "cls.predictions.bias", D_V, 0, ZERO, ZT__ENC_H_BIAS, .when = MLM, .unless = ROBERTA, ROWS),
    R(FINAL, "lm_head.dense.weight", D_C, D_C, NORMAL, H_DW, .when = MLM | ROBERTA),
    R(FINAL, "lm_head.dense.bias", D_C, 0, ZERO, H_DB, .when = MLM | ROBERTA),
    R(FINAL, "lm_head.layer_norm.weight", D_C, 0, ONE, H_LW, .when = MLM | ROBERTA),
    R(FINAL, "lm_head.layer_norm.bias", D_C, 0, ZERO, H_LB, .when = MLM | ROBERTA),
    R(FINAL, "lm_head.bias", D_V, 0, ZERO, ZT__ENC_H_BIAS, .when = MLM | ROBERTA, ROWS),
    /* the classification head: BERT's pooler and classifier, RoBERTa's classifier (dense, out_proj) */
    R(FINAL, "pooler.dense.weight", D_C, D_C, NORMAL, H_DW, .body = true, .unless = MLM | ROBERTA),
    R(FINAL, "pooler.dense.bias", D_C, 0, ZERO, H_DB, .body = true, .unless = MLM | ROBERTA),
    R(FINAL, "classifier.weight", D_LABELS, D_C, NORMAL, H_OW, .unless = MLM | ROBERTA),
    R(FINAL, "classifier.bias", D_LABELS, 0, ZERO, H_OB, .unless = MLM | ROBERTA),
    R(FINAL, "classifier.dense.weight", D_C, D_C, NORMAL, H_DW, .when = ROBERTA, .unless = MLM),
    R(FINAL, "classifier.dense.bias", D_C, 0, ZERO, H_DB, .when = ROBERTA, .unless = MLM),
    R(FINAL, "classifier.out_proj.weight", D_LABELS, D_C, NORMAL, H_OW, .when = ROBERTA, .unless = MLM),
    R(FINAL, "classifier.out_proj.bias", D_LABELS, 0, ZERO, H_OB, .when = ROBERTA, .unless = MLM),
};
#undef COLS
#undef ROWS
#undef H_OB
#undef H_OW
#undef H_LB
#undef H_LW
#undef H_DB
#undef H_DW
#undef NR
#undef R

static void dims(const void *cv, zt__tt_dims *d)
{
    const zt_bert_config *c = cv;
    *d = (zt__tt_dims){.layers = c->num_hidden_layers, .std = (double)c->initializer_range,
                       .pad_row = c->pad_token_id, .prefix = c->roberta ? "roberta." : "bert.",
                       .flags = (c->roberta ? ROBERTA : 0) | (c->head == ZT_BERT_HEAD_MLM ? MLM : 0),
                       .d = {[D_C] = c->hidden_size, [D_I] = c->intermediate_size, [D_V] = c->vocab_size,
                             [D_P] = c->max_position_embeddings, [D_TYPES] = c->type_vocab_size,
                             [D_LABELS] = c->num_labels}};
}

/* Files may lack the body's prefix and say LayerNorm "gamma" / "beta" for weight / bias; position and token
 * type ids are buffers; the masked-LM decoder's weight and bias are tied to the word embeddings and the
 * head's bias; other task heads' tensors (cls., lm_head., classifier., pooler.) are skipped for a pretrained
 * body. */
static const zt__tt_alias aliases[] = {
    {"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight", ZT_HF_TIED, MLM, ROBERTA},
    {"cls.predictions.decoder.bias", "cls.predictions.bias", ZT_HF_TIED, MLM, ROBERTA},
    {"lm_head.decoder.weight", "roberta.embeddings.word_embeddings.weight", ZT_HF_TIED, MLM | ROBERTA, 0},
    {"lm_head.decoder.bias", "lm_head.bias", ZT_HF_TIED, MLM | ROBERTA, 0}};
static const char *const buffers[] = {"embeddings.position_ids", "embeddings.token_type_ids", NULL};
static const char *const renames[] = {"LayerNorm.gamma", "LayerNorm.weight", "LayerNorm.beta", "LayerNorm.bias", NULL};
static const char *const other_heads[] = {"cls.", "lm_head.", "classifier.", "pooler.", NULL};
static const zt__tt table = {.rows = rows, .nrows = (int)(sizeof rows / sizeof rows[0]),
                             .layer_prefix = "encoder.layer.%d.", .dims = dims, .hf_prefix = "",
                             .hf_aliases = aliases, .hf_naliases = 4, .hf_buffers = buffers, .hf_renames = renames,
                             .hf_other_heads = other_heads, .hf_class = head};

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

/* The encoder program's view of cfg (encoder.h; the tensor table's roles give the tensors). */
static void arch_of(const void *cv, zt__enc_arch *a)
{
    const zt_bert_config *cfg = cv;
    const bool mlm = cfg->head == ZT_BERT_HEAD_MLM;
    *a = (zt__enc_arch){
        .L = cfg->num_hidden_layers, .C = cfg->hidden_size, .NH = cfg->num_attention_heads, .F = cfg->intermediate_size,
        .V = cfg->vocab_size, .types = cfg->type_vocab_size, .eps = cfg->layer_norm_eps,
        .act = cfg->hidden_act == ZT_BERT_ACT_GELU ? ZT__ENC_GELU_ERF : ZT__ENC_GELU_TANH,
        /* RoBERTa's lm_head applies the exact GELU whatever hidden_act says, as transformers does */
        .head_act = cfg->roberta || cfg->hidden_act == ZT_BERT_ACT_GELU ? ZT__ENC_GELU_ERF : ZT__ENC_GELU_TANH,
        .head = mlm ? ZT__ENC_HEAD_MLM : ZT__ENC_HEAD_CLASSIFY, .K = zt_bert_config_outputs(cfg),
        .pos_row0 = cfg->roberta ? cfg->pad_token_id + 1 : 0, .pad_token_id = cfg->pad_token_id,
        .head_block = mlm ? 0 : cfg->num_hidden_layers + 1,
    };
}

/* ---- Hugging Face files and the family definition ---- */

extern const zt_family_def zt__family_bert;

/* Imports a pretrained body for fine-tuning; see bert.h. */
int zt_bert_import_pretrained(zt_bert *m, const char *path, zt_err *err)
{
    return zt__host_import(&zt__family_bert, m, path, true, err);
}

static const zt_hf_names hf_names = {
    ZT__TT_HF_NAMES
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

static const zt__hm_spec spec = {.def = &zt__family_bert, .config_size = sizeof(zt_bert_config), .table = &table,
                                 .enc_arch = arch_of, .check_batch = check_batch};

/* The parameter count of cfg's shape, from its tensor table. */
size_t zt_bert_config_num_params(const zt_bert_config *cfg)
{
    return zt__tt_num_params(&table, cfg);
}

/* The typed API of bert.h over the host model (host_model.h), and what the encoder's runner adds to it. */
ZT__HM_TYPED_API(zt_bert, zt_bert, zt_bert_config, spec, zt__family_bert)
void zt_bert_set_token_types(zt_bert *m, const int32_t *types) { zt__hm_set_token_types(m, types); }
void zt_bert_accuracy(const zt_bert *m, int *correct, int *counted) { zt__hm_accuracy(m, correct, counted); }
ZT__HM_TYPED_CUDA_API(zt_bert, zt_bert)

const zt_family_def zt__family_bert = {
    .name = "bert",
    .model_types = model_types,
    .config_default = f_config_default,
    .io = &io,
    ZT__HM_FIELD_ENTRIES(fields, 2)
    .config_describe = f_config_describe,
    .config_shape = f_config_shape,
    .config_label = f_config_label,
    .host = &spec,
    .hf = &hf_names,
    ZT__HM_FAMILY_ENTRIES
    ZT__HM_ENCODER_ENTRIES
};
