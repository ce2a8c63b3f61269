/* GPT-NeoX: its config.json mapping, tensor table, initialisation and decoder architecture, on the shared host
 * model (host_model.h); see neox.h.
 *
 * Initialisation: PreTrainedModel._init_weights as GPTNeoXPreTrainedModel inherits it: normal(0,
 * initializer_range) for embed_in, embed_out and every linear weight, zero biases, LayerNorm weights 1 and
 * biases 0; tensors are filled in slab order from one generator. */
#include "worker/models/neox.h"

#include <stdio.h>

#include "kernels/rope.h"              /* zt_rope_inv_freq */
#include "worker/models/family.h"      /* the family definition */
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_model.h"  /* the host model every decoder family shares */
#include "worker/models/tensor_table.h" /* the tensors as data */

#define NEOX_MAX 65536
#define NEOX_MAX_BIG (1 << 24)
#define HF_PREFIX "gpt_neox."
#define HEAD "embed_out.weight"

extern const zt_family_def zt__family_neox;
static const char *const act_names[] = {"gelu", "gelu_new", "gelu_fast", NULL};

/* ---- configuration ---- */

/* Hugging Face GPTNeoXConfig's defaults (GPT-NeoX-20B's shape). */
static void config_default(void *cv, const char *model_type)
{
    (void)model_type;
    zt_neox_config *c = cv;
    *c = (zt_neox_config){.num_hidden_layers = 44, .hidden_size = 6144, .num_attention_heads = 64,
                          .intermediate_size = 24576, .max_position_embeddings = 2048, .vocab_size = 50432,
                          .layer_norm_eps = 1e-5f, .hidden_act = ZT_NEOX_ACT_GELU, .use_parallel_residual = true,
                          .attention_bias = true, .rotary_pct = 0.25, .rotary_emb_base = 10000.0,
                          .initializer_range = 0.02, .bos_token_id = 0, .eos_token_id = 2};
}

int zt_neox_config_rotary_ndims(const zt_neox_config *c)
{
    return (int)((double)(c->hidden_size / c->num_attention_heads) * c->rotary_pct);
}

/* GPTNeoXConfig's keys (rotary_pct and rotary_emb_base as the configs Pythia ships write them; read_rotary
 * reads transformers 5's rope_parameters). */
#define S zt_neox_config
static const zt__cfg_key keys[] = {
    ZT__CFG_I(S, num_hidden_layers, 1, 1024), ZT__CFG_I(S, hidden_size, 1, NEOX_MAX),
    ZT__CFG_HEADS(S, num_attention_heads, NEOX_MAX, "hidden_size"), ZT__CFG_I(S, intermediate_size, 1, NEOX_MAX_BIG),
    ZT__CFG_I(S, max_position_embeddings, 1, NEOX_MAX_BIG), ZT__CFG_I(S, vocab_size, 1, NEOX_MAX_BIG),
    ZT__CFG_R(S, FLOAT, layer_norm_eps, 0.0, 1.0, ZT__CFG_OPEN),
    ZT__CFG_R(S, DOUBLE, initializer_range, 0.0, 1.0, ZT__CFG_HASH_ONLY), /* a resumed run may change it */
    ZT__CFG_R(S, DOUBLE, rotary_pct, 0.0, 1.0, ZT__CFG_ABOVE_MIN),
    ZT__CFG_R(S, DOUBLE, rotary_emb_base, 0.0, 1e300, ZT__CFG_ABOVE_MIN),
    ZT__CFG_B(S, use_parallel_residual), ZT__CFG_B(S, attention_bias), ZT__CFG_B(S, tie_word_embeddings),
    {.key = "hidden_act", .type = ZT__CFG_NAME, .offset = offsetof(S, hidden_act), .names = act_names},
    ZT__CFG_T(S, bos_token_id), ZT__CFG_T(S, eos_token_id),
    ZT__CFG_ONLY_("attention_dropout", "0", 0, "ztrain trains without dropout"),
    ZT__CFG_ONLY_("hidden_dropout", "0", 0, "ztrain trains without dropout"),
    ZT__CFG_NUMBER_("classifier_dropout", 0.0, 1.0, 0, NULL), ZT__CFG_IGNORE_("use_cache", "true"),
    ZT__CFG_IGNORE_("torch_dtype", "\"float32\""),
};
#undef S
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* The rule the key table cannot say (its ranges are checked first, zt__cfg_io_validate). */
static int validate_where(const void *cv, const char *where, zt_err *err)
{
    const zt_neox_config *c = cv;
    const int rot = zt_neox_config_rotary_ndims(c);
    if (rot < 2 || rot % 2 != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: rotary_pct %g of heads of %d channels gives %d rotated channels, but ztrain rotates an "
                       "even number of at least 2 (choose a rotary_pct that gives one)",
                       where, c->rotary_pct, c->hidden_size / c->num_attention_heads, rot);
    return 0;
}

/* Transformers 5's rope_parameters against Pythia's rotary_pct and rotary_emb_base; rope_scaling only null. */
static int read_rotary(zt_json_reader *r, const cJSON *obj, void *cv, zt_err *err)
{
    zt_neox_config *c = cv;
    return zt__cfg_read_partial_rope(r, obj, "rotary_emb_base", &c->rotary_emb_base, "rotary_pct", &c->rotary_pct,
                                     "ztrain's GPT-NeoX", err);
}

static const char *const model_types[] = {"gpt_neox", NULL}, *const heads[] = {"GPTNeoXForCausalLM", NULL};
/* Written in the form transformers 4.x writes (rotary_pct, rotary_emb_base), which 5.x reads too. */
static const zt__cfg_io io = {.model_types = model_types, .heads = heads, .keys = keys, .nkeys = NKEYS,
                              .size = sizeof(zt_neox_config), .validate = validate_where, .read_extra = read_rotary};

static void config_describe(const void *cv, char *buf, size_t cap)
{
    const zt_neox_config *c = cv;
    snprintf(buf, cap, "GPT-NeoX, %d layers x %d wide, %d heads (%d rotary channels), MLP %d, vocab %d, %d positions, "
             "%s residual%s", c->num_hidden_layers, c->hidden_size, c->num_attention_heads,
             zt_neox_config_rotary_ndims(c), c->intermediate_size, c->vocab_size, c->max_position_embeddings,
             c->use_parallel_residual ? "parallel" : "sequential", c->tie_word_embeddings ? ", tied head" : "");
}

/* ---- the tensor table ---- */

enum { D_C = 1, D_3C, D_F, D_V };  /* dimension symbols */
enum { TIED = 1u, BIAS = 2u };     /* flags: tie_word_embeddings, attention_bias */

/* Hugging Face's order; the biases of query_key_value and dense only with attention_bias; query_key_value's
 * rows interleave the heads in the files (head h's q, k and v rows follow each other) while the table holds
 * all q | all k | all v as the attention kernels read them: import and export convert. */
#define R(part, name, d0, d1, init, role, ...) {ZT__TT(part, name, d0, d1, init, role), __VA_ARGS__}
#define PER_HEAD .hf_per_head = true
static const zt__tt_row rows[] = {
    R(EMBED, "embed_in.weight", D_V, D_C, NORMAL, ZT__TT_NO_ROLE, .split = ZT_TP_ROWS),
    R(LAYER, "input_layernorm.weight", D_C, 0, ONE, ZT__DEC_LN1_W),
    R(LAYER, "input_layernorm.bias", D_C, 0, ZERO, ZT__DEC_LN1_B),
    R(LAYER, "post_attention_layernorm.weight", D_C, 0, ONE, ZT__DEC_LN2_W),
    R(LAYER, "post_attention_layernorm.bias", D_C, 0, ZERO, ZT__DEC_LN2_B),
    R(LAYER, "attention.query_key_value.weight", D_3C, D_C, NORMAL, ZT__DEC_QKV_W, PER_HEAD, .split = ZT_TP_ROWS),
    R(LAYER, "attention.query_key_value.bias", D_3C, 0, ZERO, ZT__DEC_QKV_B, PER_HEAD, .when = BIAS,
      .split = ZT_TP_ROWS),
    R(LAYER, "attention.dense.weight", D_C, D_C, NORMAL, ZT__DEC_O_W, .split = ZT_TP_COLS),
    R(LAYER, "attention.dense.bias", D_C, 0, ZERO, ZT__DEC_O_B, .when = BIAS),
    R(LAYER, "mlp.dense_h_to_4h.weight", D_F, D_C, NORMAL, ZT__DEC_UP_W, .split = ZT_TP_ROWS),
    R(LAYER, "mlp.dense_h_to_4h.bias", D_F, 0, ZERO, ZT__DEC_UP_B, .split = ZT_TP_ROWS),
    R(LAYER, "mlp.dense_4h_to_h.weight", D_C, D_F, NORMAL, ZT__DEC_DOWN_W, .split = ZT_TP_COLS),
    R(LAYER, "mlp.dense_4h_to_h.bias", D_C, 0, ZERO, ZT__DEC_DOWN_B),
    R(FINAL, "final_layer_norm.weight", D_C, 0, ONE, ZT__DEC_FINAL_W),
    R(FINAL, "final_layer_norm.bias", D_C, 0, ZERO, ZT__DEC_FINAL_B),
    R(FINAL, HEAD, D_V, D_C, NORMAL, ZT__DEC_HEAD, .unless = TIED, .bare_in_hf = true, .split = ZT_TP_ROWS),
};
#undef PER_HEAD
#undef R

static void dims(const void *cv, zt__tt_dims *d)
{
    const zt_neox_config *c = cv;
    *d = (zt__tt_dims){.layers = c->num_hidden_layers, .heads = c->num_attention_heads, .std = c->initializer_range, .pad_row = -1,
                       .flags = (c->tie_word_embeddings ? TIED : 0) | (c->attention_bias ? BIAS : 0),
                       .d = {[D_C] = c->hidden_size, [D_3C] = 3 * (int64_t)c->hidden_size,
                             [D_F] = c->intermediate_size, [D_V] = c->vocab_size}};
}

/* "gpt_neox." before every name but the head's, which files also call lm_head.weight (transformers 5); the
 * attention's mask and rotary buffers that older files carry are skipped. */
static const zt__tt_alias aliases[] = {{"embed_out.weight", "embed_in.weight", ZT_HF_TIED, TIED, 0},
                                       {"lm_head.weight", "embed_in.weight", ZT_HF_TIED, TIED, 0},
                                       {"lm_head.weight", HEAD, ZT_HF_PARAM, 0, TIED}};
static const char *const buffers[] = {"rotary_emb.inv_freq", "attention.bias", "attention.masked_bias", NULL};
static const zt__tt table = {.rows = rows, .nrows = (int)(sizeof rows / sizeof rows[0]), .layer_prefix = "layers.%d.",
                             .dims = dims, .hf_prefix = HF_PREFIX, .hf_aliases = aliases, .hf_naliases = 3,
                             .hf_buffers = buffers, .hf_model = "a GPT-NeoX", .tie_flag = TIED};

static void config_shape(const void *cv, zt_family_shape *s)
{
    const zt_neox_config *c = cv;
    *s = (zt_family_shape){.layers = c->num_hidden_layers, .positions = c->max_position_embeddings,
                           .vocab = c->vocab_size, .width = c->hidden_size, .heads = c->num_attention_heads,
                           .num_params = zt__tt_num_params(&table, c), .task = ZT_TASK_CAUSAL_LM,
                           .pad_token_id = -1, .n_eos = c->eos_token_id >= 0, .eos_ids = {c->eos_token_id}};
}

static void arch(const void *cv, zt__dec_arch *a)
{
    const zt_neox_config *c = cv;
    *a = (zt__dec_arch){.L = c->num_hidden_layers, .C = c->hidden_size, .NH = c->num_attention_heads,
                        .NKV = c->num_attention_heads, .HS = c->hidden_size / c->num_attention_heads,
                        .F = c->intermediate_size, .V = c->vocab_size, .norm = ZT__DEC_LAYERNORM,
                        .eps = c->layer_norm_eps,
                        .mlp = c->hidden_act == ZT_NEOX_ACT_GELU ? ZT__DEC_MLP_GELU_ERF : ZT__DEC_MLP_GELU_TANH,
                        .rope = true, .rot = zt_neox_config_rotary_ndims(c),
                        .rope_cfg = {.theta = c->rotary_emb_base, .scaling = ZT_ROPE_SCALING_NONE},
                        .parallel_residual = c->use_parallel_residual, .pad_token_id = -1};
}

static const zt__hm_spec spec = {.def = &zt__family_neox, .config_size = sizeof(zt_neox_config), .table = &table,
                                 .arch = arch};

/* ---- Hugging Face files ---- */

static const zt_hf_names hf_names = {
    ZT__TT_HF_NAMES
    .tied_fix = "tie_word_embeddings is true; set it to false to import an untied head",
    .reorder = zt__tt_hf_reorder, /* query_key_value's heads interleaved in the files */
};

const zt_family_def zt__family_neox = {
    .name = "gpt_neox",
    .model_types = model_types,
    .config_default = config_default,
    .io = &io,
    .number = 4, /* the fields: io's keys */
    .config_describe = config_describe,
    .config_shape = config_shape,
    .host = &spec,
    .hf = &hf_names,
    ZT__HM_FAMILY_ENTRIES
};
