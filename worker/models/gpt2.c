/* GPT-2: its config.json mapping, tensor table and decoder architecture, on the shared host model
 * (host_model.h: the slabs, the decoder program's CPU runner and CUDA executor, safetensors import and
 * export from the table); see gpt2.h.
 *
 * Initialisation (the tensor table's rows): Hugging Face's GPT2PreTrainedModel scheme, i.e. normal(0, 0.02) for
 * wte, wpe and every linear weight, residual projections (attn.c_proj, mlp.c_proj) scaled by
 * 1/sqrt(2 n_layer), biases 0, layer norms weight 1 and bias 0. */
#include "worker/models/gpt2.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"        /* strict reading of config.json */
#include "worker/models/cpu_exec.h"    /* the engine's CPU executor */
#include "worker/models/decoder.h"     /* the layer program and its CPU runner */
#include "worker/models/family.h"      /* the family definition */
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_model.h"  /* the host model every decoder family shares */
#include "worker/models/host_io.h"     /* safetensors import and export from the tensor table */
#include "worker/models/host_shared.h" /* config keys every HF config has */
#include "worker/models/tensor_table.h" /* the tensors as data */

/* Limits that keep every size product far from overflow and catch typos such as an extra zero. */
#define GPT2_MAX_LAYERS 1024
#define GPT2_MAX_EMBD 65536
#define GPT2_MAX_POSITIONS (1 << 20)
#define GPT2_MAX_VOCAB (1 << 24)

#define HF_PREFIX "transformer."

/* A zt_gpt2 is the shared host model (host_model.h) of a GPT-2 config: the pointers are the same (gpt2.h
 * declares the type opaque; every function here hands it to zt__hm_*). */

/* ---------------------------------------------------------------------------------------------------- */
/* Configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

/* Sets GPT-2 small's values (12 x 768, 12 heads, 50257 tokens, 1024 positions, eps 1e-5, tied head). */
void zt_gpt2_config_default(zt_gpt2_config *cfg)
{
    cfg->n_layer = 12;
    cfg->n_head = 12;
    cfg->n_embd = 768;
    cfg->n_positions = 1024;
    cfg->vocab_size = 50257;
    cfg->layer_norm_epsilon = 1e-5f;
    cfg->tie_word_embeddings = true;
}

/* GPT2Config's keys: the sizes (each also under the name transformers maps onto it), the values ztrain's
 * GPT-2 computes with, and the fields that change nothing here (dropout, initialisation, token ids, the
 * summary head), with what a config ztrain writes holds. */
#define K(f, hi, al, ...)                                                                                      \
    {.key = #f, .type = ZT__CFG_INT, .offset = offsetof(zt_gpt2_config, f), .min = 1, .max = (hi), .alias = (al), \
     __VA_ARGS__}
#define NO_SAVE ZT__CFG_NO_SAVE
static const zt__cfg_key keys[] = {
    K(n_layer, GPT2_MAX_LAYERS, "num_hidden_layers"),
    K(n_head, GPT2_MAX_EMBD, "num_attention_heads", .divides = "n_embd"),
    K(n_embd, GPT2_MAX_EMBD, "hidden_size"),
    K(n_positions, GPT2_MAX_POSITIONS, "max_position_embeddings"),
    K(vocab_size, GPT2_MAX_VOCAB, NULL),
    ZT__CFG_R(zt_gpt2_config, FLOAT, layer_norm_epsilon, 0.0, 1.0, ZT__CFG_OPEN),
    ZT__CFG_B(zt_gpt2_config, tie_word_embeddings),
    ZT__CFG_ONLY_("activation_function", "\"gelu_new\"", 0, "GPT-2's tanh GELU"),
    ZT__CFG_ONLY_("scale_attn_weights", "true", 0, "attention scores are scaled by 1/sqrt(head size)"),
    ZT__CFG_ONLY_("scale_attn_by_inverse_layer_idx", "false", 0, "no per-layer attention scaling"),
    ZT__CFG_ONLY_("reorder_and_upcast_attn", "false", 0, "the standard attention order"),
    ZT__CFG_ONLY_("add_cross_attention", "false", NO_SAVE, "GPT-2 is a decoder without cross-attention"),
    ZT__CFG_ONLY_("is_encoder_decoder", "false", NO_SAVE, "GPT-2 is a decoder-only model"),
    ZT__CFG_ONLY_("pruned_heads", "{}", NO_SAVE | ZT__CFG_NULL_OK, "models with all heads"),
    ZT__CFG_IGNORE_("resid_pdrop", "0"), ZT__CFG_IGNORE_("embd_pdrop", "0"), ZT__CFG_IGNORE_("attn_pdrop", "0"),
    ZT__CFG_IGNORE_("initializer_range", "0.02"), ZT__CFG_IGNORE_("bos_token_id", NULL),
    ZT__CFG_IGNORE_("eos_token_id", NULL), ZT__CFG_IGNORE_("use_cache", "true"),
    ZT__CFG_IGNORE_("summary_type", "\"cls_index\""), ZT__CFG_IGNORE_("summary_use_proj", "true"),
    ZT__CFG_IGNORE_("summary_activation", "null"), ZT__CFG_IGNORE_("summary_proj_to_labels", "true"),
    ZT__CFG_IGNORE_("summary_first_dropout", "0.1"), ZT__CFG_IGNORE_("output_past", NULL),
    ZT__CFG_IGNORE_("gradient_checkpointing", NULL), ZT__CFG_IGNORE_("torch_dtype", "\"float32\""),
};
#undef K
#undef NO_SAVE
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* The rule the key table cannot say, with the source named in messages (the table's ranges are checked first,
 * zt__cfg_io_validate). */
static int validate_config(const void *cv, const char *where, zt_err *err)
{
    const zt_gpt2_config *cfg = cv;
    if (!cfg->tie_word_embeddings)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: tie_word_embeddings is false, but ztrain's GPT-2 ties the output head to wte "
                       "(set tie_word_embeddings to true)",
                       where);
    return 0;
}

/* n_ctx is GPT-2's old name for the context length; n_inner null means 4 * n_embd, the only MLP width. */
static int read_extra(zt_json_reader *r, const cJSON *obj, void *cv, zt_err *err)
{
    const zt_gpt2_config *c = cv;
    int n_ctx = 0, n_inner = 0, rc;
    bool have_n_ctx = false, have_inner = false;
    if ((rc = zt__host_json_int(r, "n_ctx", 1, GPT2_MAX_POSITIONS, &n_ctx, &have_n_ctx, err)) < 0)
        return rc;
    if (have_n_ctx && n_ctx != c->n_positions)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: n_ctx (%d) differs from n_positions (%d) (make them equal)",
                       r->where, n_ctx, c->n_positions);
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, "n_inner")))
        zt_json_accept(r, "n_inner");
    else if ((rc = zt__host_json_int(r, "n_inner", 1, INT_MAX, &n_inner, &have_inner, err)) < 0)
        return rc;
    if (have_inner && (int64_t)n_inner != 4 * (int64_t)c->n_embd)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: n_inner is %d, but ztrain's GPT-2 has an MLP of 4 * n_embd = %lld (set n_inner to null)",
                       r->where, n_inner, 4 * (long long)c->n_embd);
    return 0;
}

/* What a config.json of GPT2LMHeadModel holds beyond the table: <|endoftext|> is the last id of the 50257-token
 * vocabulary (smaller ones, bytes, have no special token), n_ctx, and n_inner null. */
static void write_extra(const void *cv, cJSON *o)
{
    const zt_gpt2_config *c = cv;
    zt__cfg_add_token(o, "bos_token_id", c->vocab_size >= 50257 ? 50256 : -1);
    zt__cfg_add_token(o, "eos_token_id", c->vocab_size >= 50257 ? 50256 : -1);
    cJSON_AddNumberToObject(o, "n_ctx", c->n_positions);
    cJSON_AddNullToObject(o, "n_inner");
}

static const char *head(const void *c)
{
    (void)c;
    return "GPT2LMHeadModel";
}

/* Any architectures are read (the body is the same); the written config names GPT2LMHeadModel. */
static const char *const model_types[] = {"gpt2", NULL};
static const zt__cfg_io io = {.model_types = model_types, .keys = keys, .nkeys = NKEYS,
                              .size = sizeof(zt_gpt2_config), .validate = validate_config,
                              .read_extra = read_extra, .write_extra = write_extra, .head = head};

int zt_gpt2_config_validate(const zt_gpt2_config *cfg, zt_err *err)
{
    return zt__cfg_io_validate(&io, cfg, "model config", err);
}

int zt_gpt2_config_from_json(zt_gpt2_config *cfg, const cJSON *obj, const char *where, zt_err *err)
{
    return zt__cfg_io_read(&io, cfg, obj, where, err);
}

static int from_json_v(void *c, const cJSON *o, const char *where, zt_err *err)
{
    return zt_gpt2_config_from_json(c, o, where, err);
}

int zt_gpt2_config_load(zt_gpt2_config *cfg, const char *path, zt_err *err)
{
    return zt__cfg_load(cfg, path, from_json_v, err);
}

int zt_gpt2_config_save(const zt_gpt2_config *cfg, const char *path, zt_err *err)
{
    return zt__cfg_io_save(&io, cfg, path, err);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Parameter layout                                                                                     */
/* ---------------------------------------------------------------------------------------------------- */

enum { D_C = 1, D_3C, D_4C, D_V, D_P }; /* dimension symbols */

/* Hugging Face's names and order; Conv1D's weights are stored [in, out] in the files. Initialisation as
 * GPT2PreTrainedModel's: normal(0, 0.02), the projections into the residual stream scaled by 1/sqrt(2 n_layer). */
#define R(part, name, d0, d1, init, role, ...) {ZT__TT(part, name, d0, d1, init, role), __VA_ARGS__}
#define CONV .transposed_in_hf = true
static const zt__tt_row rows[] = {
    R(EMBED, "wte.weight", D_V, D_C, NORMAL, ZT__TT_NO_ROLE, .split = ZT_TP_ROWS),
    R(EMBED, "wpe.weight", D_P, D_C, NORMAL, ZT__TT_NO_ROLE),
    R(LAYER, "ln_1.weight", D_C, 0, ONE, ZT__DEC_LN1_W),
    R(LAYER, "ln_1.bias", D_C, 0, ZERO, ZT__DEC_LN1_B),
    R(LAYER, "attn.c_attn.weight", D_3C, D_C, NORMAL, ZT__DEC_QKV_W, CONV, .split = ZT_TP_ROWS),
    R(LAYER, "attn.c_attn.bias", D_3C, 0, ZERO, ZT__DEC_QKV_B, .split = ZT_TP_ROWS),
    R(LAYER, "attn.c_proj.weight", D_C, D_C, NORMAL_RESIDUAL, ZT__DEC_O_W, CONV, .split = ZT_TP_COLS),
    R(LAYER, "attn.c_proj.bias", D_C, 0, ZERO, ZT__DEC_O_B),
    R(LAYER, "ln_2.weight", D_C, 0, ONE, ZT__DEC_LN2_W),
    R(LAYER, "ln_2.bias", D_C, 0, ZERO, ZT__DEC_LN2_B),
    R(LAYER, "mlp.c_fc.weight", D_4C, D_C, NORMAL, ZT__DEC_UP_W, CONV, .split = ZT_TP_ROWS),
    R(LAYER, "mlp.c_fc.bias", D_4C, 0, ZERO, ZT__DEC_UP_B, .split = ZT_TP_ROWS),
    R(LAYER, "mlp.c_proj.weight", D_C, D_4C, NORMAL_RESIDUAL, ZT__DEC_DOWN_W, CONV, .split = ZT_TP_COLS),
    R(LAYER, "mlp.c_proj.bias", D_C, 0, ZERO, ZT__DEC_DOWN_B),
    R(FINAL, "ln_f.weight", D_C, 0, ONE, ZT__DEC_FINAL_W),
    R(FINAL, "ln_f.bias", D_C, 0, ZERO, ZT__DEC_FINAL_B),
};
#undef CONV
#undef R

static void dims(const void *cv, zt__tt_dims *d)
{
    const zt_gpt2_config *c = cv;
    const int64_t C = c->n_embd;
    *d = (zt__tt_dims){.layers = c->n_layer, .std = 0.02, .pad_row = -1,
                       .d = {[D_C] = C, [D_3C] = 3 * C, [D_4C] = 4 * C, [D_V] = c->vocab_size, [D_P] = c->n_positions}};
}

/* "transformer." before every name (or none); lm_head.weight is the tied head (it must equal wte); the
 * attention-mask buffers of older files (h.<n>.attn.bias, .masked_bias) are skipped. */
static const zt__tt_alias aliases[] = {{"lm_head.weight", "wte.weight", ZT_HF_TIED, 0, 0}};
static const char *const buffers[] = {"attn.bias", "attn.masked_bias", NULL};
static const zt__tt table = {.rows = rows, .nrows = (int)(sizeof rows / sizeof rows[0]), .layer_prefix = "h.%d.",
                             .dims = dims, .hf_prefix = HF_PREFIX, .hf_aliases = aliases, .hf_naliases = 1,
                             .hf_buffers = buffers, .hf_model = "a GPT-2"};

/* GPT-2 as the decoder program sees it: LayerNorms with biases, the tanh GELU, learned positions, every
 * linear layer with a bias, and the head tied to wte. */
static void decoder_arch(const void *cv, zt__dec_arch *a)
{
    const zt_gpt2_config *cfg = cv;
    const int C = cfg->n_embd;
    *a = (zt__dec_arch){.L = cfg->n_layer, .C = C, .NH = cfg->n_head, .NKV = cfg->n_head, .HS = C / cfg->n_head,
                        .F = 4 * C, .V = cfg->vocab_size, .norm = ZT__DEC_LAYERNORM, .eps = cfg->layer_norm_epsilon,
                        .mlp = ZT__DEC_MLP_GELU_TANH, .wpe = true, .pad_token_id = -1};
}

extern const zt_family_def zt__family_gpt2;
static const zt__hm_spec spec = {.def = &zt__family_gpt2, .config_size = sizeof(zt_gpt2_config),
                                 .positions_key = "n_positions", .table = &table, .arch = decoder_arch};

/* The typed API of gpt2.h over the host model. */
ZT__HM_TYPED_API(zt_gpt2, zt_gpt2, zt_gpt2_config, spec, zt__family_gpt2)

/* Returns the number of parameters of a GPT-2 with cfg's shape (cfg must be valid), without allocating it. */
size_t zt_gpt2_config_num_params(const zt_gpt2_config *cfg)
{
    return zt__tt_num_params(&table, cfg);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Hugging Face files and the family definition                                                         */
/* ---------------------------------------------------------------------------------------------------- */

static const zt_hf_names hf_names = {
    ZT__TT_HF_NAMES
    .tied_fix = "ztrain's GPT-2 ties its head to wte: untied heads are not supported",
    .head_optional = false,
};

/* The family's entries over void pointers (family.h). */
static void f_config_default(void *c, const char *model_type)
{
    (void)model_type;
    zt_gpt2_config_default(c);
}

static void f_config_describe(const void *c, char *buf, size_t cap)
{
    const zt_gpt2_config *g = c;
    snprintf(buf, cap, "GPT-2, %d layers x %d wide, %d heads, vocab %d, %d positions", g->n_layer, g->n_embd,
             g->n_head, g->vocab_size, g->n_positions);
}

static void f_config_shape(const void *c, zt_family_shape *s)
{
    const zt_gpt2_config *g = c;
    *s = (zt_family_shape){.layers = g->n_layer, .positions = g->n_positions, .vocab = g->vocab_size,
                           .width = g->n_embd, .heads = g->n_head, .num_params = zt_gpt2_config_num_params(g),
                           .task = ZT_TASK_CAUSAL_LM, .pad_token_id = -1,
                           /* <|endoftext|>, as the export's config.json writes it (none for smaller vocabularies) */
                           .n_eos = g->vocab_size >= 50257, .eos_ids = {50256}};
}


const zt_family_def zt__family_gpt2 = {
    .name = "gpt2",
    .model_types = model_types,
    .config_default = f_config_default,
    .io = &io,
    .number = 0, /* the fields: io's keys */
    .config_describe = f_config_describe,
    .config_shape = f_config_shape,
    .host = &spec,
    .hf = &hf_names,
    ZT__HM_FAMILY_ENTRIES
};
