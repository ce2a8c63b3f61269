/* LLaMA on the CPU kernels: Hugging Face config.json reading and writing, the parameter layout in blocks,
 * deterministic initialisation, forward and backward passes, and safetensors export/import with Hugging
 * Face tensor names.
 *
 * The host model is the one every decoder family shares (host_model.h: one parameter slab, one gradient slab
 * of the same layout, the decoder program's CPU runner); this file gives it the config, the tensor table,
 * the initialisation and the architecture.
 *
 * Initialisation (the tensor table's rows): LlamaPreTrainedModel._init_weights, i.e. normal(0, initializer_range)
 * for embed_tokens, lm_head and every linear weight (no residual scaling, unlike GPT-2), RMSNorm weights 1,
 * and embed_tokens' row pad_token_id 0 (nn.Embedding's padding_idx). */
#include "worker/models/llama.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"         /* strict reading of config.json, exact numbers in the one written */
#include "kernels/rope.h"                   /* rotary position embeddings */
#include "worker/models/cpu_exec.h"         /* the engine's CPU executor */
#include "worker/models/decoder.h"          /* the layer program and its CPU runner */
#include "worker/models/family.h"           /* the family definition */
#include "worker/models/host_io.h"          /* safetensors import and export from the tensor table */
#include "worker/models/llama_family.h"     /* what the families written on LLaMA's share */
#include "worker/models/host_config.h"       /* the config.json mapping as a table */
#include "worker/models/host_model.h"        /* the host model every decoder family shares */
#include "worker/models/host_shared.h"      /* config keys every HF config has */
#include "worker/models/tensor_table.h"     /* the tensors as data */

/* Limits that keep every size product far from overflow and catch typos such as an extra zero. */
#define LLAMA_MAX_LAYERS 1024
#define LLAMA_MAX_HIDDEN 65536
#define LLAMA_MAX_INTERMEDIATE (1 << 20)
#define LLAMA_MAX_POSITIONS (1 << 24)
#define LLAMA_MAX_VOCAB (1 << 24)

#define HF_PREFIX "model."
#define LM_HEAD "lm_head.weight"

/* A zt_llama is the shared host model (host_model.h) of a LLaMA config: the pointers are the same (llama.h
 * declares the type opaque; every function here hands it to zt__hm_*). */

/* ---------------------------------------------------------------------------------------------------- */
/* Configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

/* Sets Hugging Face LlamaConfig's defaults. */
void zt_llama_config_default(zt_llama_config *cfg)
{
    *cfg = (zt_llama_config){.family = ZT_LLAMA_FAMILY_LLAMA, .num_hidden_layers = 32, .hidden_size = 4096,
                             .num_attention_heads = 32, .num_key_value_heads = 32, .intermediate_size = 11008,
                             .max_position_embeddings = 2048, .vocab_size = 32000, .rms_norm_eps = 1e-6f,
                             .rope = {.theta = 10000.0, .scaling = ZT_ROPE_SCALING_NONE},
                             .tie_word_embeddings = false, .initializer_range = 0.02, .bos_token_id = 1,
                             .pad_token_id = -1, .num_eos_token_ids = 1, .eos_token_ids = {2}};
}

/* The keys of LlamaConfig, MistralConfig and Qwen2Config that ztrain reads the same way (the window fields,
 * the rope fields, num_key_value_heads, head_dim and the end ids have their own rules below). Each variant
 * writes the keys its transformers class writes: llama's own are added in zt_llama_config_save. */
#define S zt_llama_config
#define NS ZT__CFG_NO_SAVE
static const zt__cfg_key keys[] = {
    ZT__CFG_I(S, num_hidden_layers, 1, LLAMA_MAX_LAYERS), ZT__CFG_I(S, hidden_size, 1, LLAMA_MAX_HIDDEN),
    ZT__CFG_HEADS(S, num_attention_heads, LLAMA_MAX_HIDDEN, "hidden_size"),
    ZT__CFG_I(S, intermediate_size, 1, LLAMA_MAX_INTERMEDIATE),
    ZT__CFG_I(S, max_position_embeddings, 1, LLAMA_MAX_POSITIONS), ZT__CFG_I(S, vocab_size, 1, LLAMA_MAX_VOCAB),
    ZT__CFG_R(S, FLOAT, rms_norm_eps, 0.0, 1.0, ZT__CFG_OPEN | ZT__CFG_PY_FLOAT),
    ZT__CFG_R(S, DOUBLE, initializer_range, 0.0, 1.0, ZT__CFG_PY_FLOAT), ZT__CFG_B(S, tie_word_embeddings),
    ZT__CFG_T(S, bos_token_id), {.key = "pad_token_id", .type = ZT__CFG_TOKEN, .offset = offsetof(S, pad_token_id),
                                 .flags = NS},
    ZT__CFG_ONLY_("hidden_act", "\"silu\"", 0, "SwiGLU's silu"),
    ZT__CFG_ONLY_("attention_bias", "false", NS, "q, k, v and o projections without bias"),
    ZT__CFG_ONLY_("mlp_bias", "false", NS, "MLP projections without bias"),
    ZT__CFG_ONLY_("attention_dropout", "0.0", 0, "ztrain trains without dropout"),
    ZT__CFG_ONLY_("pretraining_tp", "1", NS | ZT__CFG_NULL_OK,
                  "the projections computed whole: the result is the same up to rounding"),
    ZT__CFG_IGNORE_("use_cache", "true"), ZT__CFG_IGNORE_("torch_dtype", "\"float32\""),
};
#undef NS
#undef S
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* Validation with the source named in messages. */
static int validate_config(const zt_llama_config *c, const char *where, zt_err *err)
{
    int rc = zt__cfg_check(keys, NKEYS, c, where, err);
    if (rc < 0)
        return rc;
    const int C = c->hidden_size, NH = c->num_attention_heads, NKV = c->num_key_value_heads;
    if (NKV < 1 || NKV > NH || NH % NKV != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: num_key_value_heads is %d, but it must divide num_attention_heads (%d): each key/value "
                       "head serves the same number of query heads",
                       where, NKV, NH);
    const int HS = C / NH;
    if (HS % 2 != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: the head size hidden_size / num_attention_heads = %d is odd, but rotary embeddings turn "
                       "pairs of channels (choose sizes that give an even head size)",
                       where, HS);
    if ((unsigned)c->family > ZT_LLAMA_FAMILY_QWEN2)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: unknown model family %d", where, (int)c->family);
    if (c->qkv_bias != (c->family == ZT_LLAMA_FAMILY_QWEN2))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: q, k and v biases come with Qwen2 only (model_type \"qwen2\")",
                       where);
    if (c->pad_token_id < -1 || c->pad_token_id >= c->vocab_size)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: pad_token_id %d is not a token of the vocabulary of %d (embed_tokens' padding row must "
                       "exist; set it to null for none)",
                       where, c->pad_token_id, c->vocab_size);
    if (c->num_eos_token_ids < 0 || c->num_eos_token_ids > ZT_LLAMA_MAX_EOS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %d end-of-sequence ids (at most %d)", where, c->num_eos_token_ids,
                       ZT_LLAMA_MAX_EOS);
    float *inv_freq = zt_xmalloc((size_t)HS / 2 * sizeof *inv_freq);
    zt_err rope_err = {{0}};
    rc = zt_rope_inv_freq(inv_freq, HS, &c->rope, &rope_err);
    free(inv_freq);
    if (rc < 0)
        return zt_fail(err, rc, "%s: %s", where, rope_err.msg);
    return 0;
}

/* Checks ranges and consistency of cfg. Returns 0 or ZT_EINVAL_CONFIG with a message in err. */
int zt_llama_config_validate(const zt_llama_config *cfg, zt_err *err)
{
    return validate_config(cfg, "model config", err);
}

/* Mistral's sliding_window: none, or one no shorter than the context (the same math as full attention). */
static int read_mistral_window(zt_json_reader *r, const cJSON *obj, const zt_llama_config *c, zt_err *err)
{
    int rc, window = 0;
    bool have_window = false;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, "sliding_window")))
        zt_json_accept(r, "sliding_window");
    else if ((rc = zt__host_json_int(r, "sliding_window", 0, INT_MAX, &window, &have_window, err)) < 0)
        return rc;
    if (have_window && window < c->max_position_embeddings)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: sliding_window is %d, shorter than max_position_embeddings (%d), but ztrain's attention "
                       "sees the whole context (set sliding_window to null)",
                       r->where, window, c->max_position_embeddings);
    return 0;
}

static void write_llama_keys(const zt_llama_config *c, cJSON *o)
{
    if (c->rope.scaling == ZT_ROPE_SCALING_NONE)
        cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_AddFalseToObject(o, "attention_bias");
    cJSON_AddFalseToObject(o, "mlp_bias");
    cJSON_AddNumberToObject(o, "pretraining_tp", 1);
}

static void write_mistral_keys(const zt_llama_config *c, cJSON *o)
{
    (void)c;
    cJSON_AddNullToObject(o, "sliding_window");
}

static const zt__llama_variant llama_v = {.model_type = "llama", .architecture = "LlamaForCausalLM",
                                          .family = ZT_LLAMA_FAMILY_LLAMA, .write = write_llama_keys};
static const zt__llama_variant mistral_v = {.model_type = "mistral", .architecture = "MistralForCausalLM",
                                            .family = ZT_LLAMA_FAMILY_MISTRAL, .read = read_mistral_window,
                                            .write = write_mistral_keys};
static const zt__llama_variant *const variants[] = {&llama_v, &mistral_v, NULL};

int zt__llama_config_read(zt_llama_config *cfg, const cJSON *obj, const char *where,
                          const zt__llama_variant *const *vs, zt_err *err)
{
    const char *types[8];
    int nv = 0, rc, type;
    while (vs[nv] && nv < 7) {
        types[nv] = vs[nv]->model_type;
        nv++;
    }
    types[nv] = NULL;
    zt_llama_config c = *cfg;
    zt_json_reader r;
    if ((rc = zt__cfg_begin(&r, obj, where, types, &type, err)) < 0)
        return rc;
    const zt__llama_variant *v = vs[0];
    for (int i = 0; i < nv; i++) /* no model_type: the variant of cfg's family */
        if (type == i || (type < 0 && vs[i]->family == c.family))
            v = vs[i];
    c.family = v->family;
    c.qkv_bias = v->qkv_bias;
    if ((rc = zt__cfg_read(&r, obj, keys, NKEYS, &c, err)) < 0)
        return rc;
    /* num_key_value_heads: absent or null means one per query head, as transformers reads it */
    c.num_key_value_heads = c.num_attention_heads;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, "num_key_value_heads")))
        zt_json_accept(&r, "num_key_value_heads");
    else if ((rc = zt__host_json_int(&r, "num_key_value_heads", 1, LLAMA_MAX_HIDDEN, &c.num_key_value_heads, NULL,
                                     err)) < 0)
        return rc;
    /* head_dim: null, or hidden_size / num_attention_heads (the only head size ztrain's layout has) */
    int head_dim = 0;
    bool have_hd = false;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, "head_dim")))
        zt_json_accept(&r, "head_dim");
    else if ((rc = zt__host_json_int(&r, "head_dim", 1, LLAMA_MAX_HIDDEN, &head_dim, &have_hd, err)) < 0)
        return rc;
    if (have_hd && (int64_t)head_dim * c.num_attention_heads != c.hidden_size)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: head_dim is %d, but ztrain's LLaMA has heads of hidden_size / num_attention_heads = "
                       "%d / %d channels (set head_dim to that or to null)",
                       where, head_dim, c.hidden_size, c.num_attention_heads);
    const char *heads[] = {v->architecture, NULL};
    if ((rc = zt__cfg_read_rope(&r, obj, &c.rope, LLAMA_MAX_POSITIONS, err)) < 0 ||
        (v->read && (rc = v->read(&r, obj, &c, err)) < 0) ||
        (rc = zt__cfg_read_token_list(&r, obj, "eos_token_id", c.eos_token_ids, ZT_LLAMA_MAX_EOS,
                                      &c.num_eos_token_ids, err)) < 0 ||
        (rc = zt__cfg_finish(&r, obj, heads, err)) < 0 || (rc = validate_config(&c, where, err)) < 0)
        return rc;
    *cfg = c;
    return 0;
}

/* Fills cfg from a Hugging Face LLaMA or Mistral config.json object; see llama.h. */
int zt_llama_config_from_json(zt_llama_config *cfg, const cJSON *obj, const char *where, zt_err *err)
{
    return zt__llama_config_read(cfg, obj, where, variants, err);
}

static int from_json_v(void *c, const cJSON *o, const char *where, zt_err *err)
{
    return zt_llama_config_from_json(c, o, where, err);
}

/* Reads a Hugging Face config.json file into cfg (see zt_llama_config_from_json). Returns 0 or a negative
 * code with a message naming the file. */
int zt_llama_config_load(zt_llama_config *cfg, const char *path, zt_err *err)
{
    return zt__cfg_load(cfg, path, from_json_v, err);
}

int zt__llama_config_write(const zt_llama_config *c, const char *path, const zt__llama_variant *v, zt_err *err)
{
    int rc = validate_config(c, path, err);
    if (rc < 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    zt__cfg_write(keys, NKEYS, c, o);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "architectures"), cJSON_CreateString(v->architecture));
    cJSON_AddStringToObject(o, "model_type", v->model_type);
    zt__cfg_write_token_list(o, "eos_token_id", c->eos_token_ids, c->num_eos_token_ids);
    cJSON_AddNumberToObject(o, "head_dim", c->hidden_size / c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->num_key_value_heads);
    if (c->pad_token_id >= 0)
        zt__cfg_add_token(o, "pad_token_id", c->pad_token_id);
    zt__cfg_write_rope(o, &c->rope, false);
    v->write(c, o);
    return zt__cfg_save(o, path, err);
}

/* Writes cfg as a Hugging Face config.json (keys sorted, as transformers writes them) atomically; see
 * llama.h. Returns 0 or a negative code with a message naming the path. */
int zt_llama_config_save(const zt_llama_config *c, const char *path, zt_err *err)
{
    if (c->family != ZT_LLAMA_FAMILY_LLAMA && c->family != ZT_LLAMA_FAMILY_MISTRAL)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: a config of model family %d is written by its own family "
                       "(zt_family_config_save)", path, (int)c->family);
    return zt__llama_config_write(c, path, c->family == ZT_LLAMA_FAMILY_LLAMA ? &llama_v : &mistral_v, err);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Parameter layout                                                                                     */
/* ---------------------------------------------------------------------------------------------------- */

int zt_llama_config_layer_tensors(const zt_llama_config *cfg)
{
    return cfg->qkv_bias ? ZT_LLAMA_T_COUNT_QKV_BIAS : ZT_LLAMA_T_COUNT;
}

enum { D_C = 1, D_KV, D_F, D_V };    /* dimension symbols (D_KV: the key/value heads' width) */
enum { TIED = 1u, QKV_BIAS = 2u };   /* flags: tie_word_embeddings, Qwen2's q, k and v biases */

/* Hugging Face's names in the order of llama.h's ZT_LLAMA_T_* (the biases after a layer's weights). k and v
 * continue q in the program's packed weight (and bias), up continues gate. Initialisation as
 * LlamaPreTrainedModel's: normal(0, initializer_range), RMSNorm weights 1, embed_tokens' row pad_token_id 0. */
#define R(part, name, d0, d1, init, role, ...) {ZT__TT(part, name, d0, d1, init, role), __VA_ARGS__}
#define ROWS .split = ZT_TP_ROWS
static const zt__tt_row rows[] = {
    R(EMBED, "embed_tokens.weight", D_V, D_C, NORMAL_PAD, ZT__TT_NO_ROLE, ROWS),
    R(LAYER, "input_layernorm.weight", D_C, 0, ONE, ZT__DEC_LN1_W),
    R(LAYER, "self_attn.q_proj.weight", D_C, D_C, NORMAL, ZT__DEC_QKV_W, ROWS),
    R(LAYER, "self_attn.k_proj.weight", D_KV, D_C, NORMAL, ZT__TT_NO_ROLE, ROWS, .packed = true),
    R(LAYER, "self_attn.v_proj.weight", D_KV, D_C, NORMAL, ZT__TT_NO_ROLE, ROWS, .packed = true),
    R(LAYER, "self_attn.o_proj.weight", D_C, D_C, NORMAL, ZT__DEC_O_W, .split = ZT_TP_COLS),
    R(LAYER, "post_attention_layernorm.weight", D_C, 0, ONE, ZT__DEC_LN2_W),
    R(LAYER, "mlp.gate_proj.weight", D_F, D_C, NORMAL, ZT__DEC_UP_W, ROWS),
    R(LAYER, "mlp.up_proj.weight", D_F, D_C, NORMAL, ZT__TT_NO_ROLE, ROWS, .packed = true),
    R(LAYER, "mlp.down_proj.weight", D_C, D_F, NORMAL, ZT__DEC_DOWN_W, .split = ZT_TP_COLS),
    R(LAYER, "self_attn.q_proj.bias", D_C, 0, ZERO, ZT__DEC_QKV_B, ROWS, .when = QKV_BIAS),
    R(LAYER, "self_attn.k_proj.bias", D_KV, 0, ZERO, ZT__TT_NO_ROLE, ROWS, .when = QKV_BIAS, .packed = true),
    R(LAYER, "self_attn.v_proj.bias", D_KV, 0, ZERO, ZT__TT_NO_ROLE, ROWS, .when = QKV_BIAS, .packed = true),
    R(FINAL, "norm.weight", D_C, 0, ONE, ZT__DEC_FINAL_W),
    R(FINAL, LM_HEAD, D_V, D_C, NORMAL, ZT__DEC_HEAD, ROWS, .unless = TIED, .bare_in_hf = true),
};
#undef ROWS
#undef R

static void dims(const void *cv, zt__tt_dims *d)
{
    const zt_llama_config *c = cv;
    const int64_t C = c->hidden_size, KV = (int64_t)c->num_key_value_heads * (C / c->num_attention_heads);
    *d = (zt__tt_dims){.layers = c->num_hidden_layers, .std = c->initializer_range, .pad_row = c->pad_token_id,
                       .flags = (c->tie_word_embeddings ? TIED : 0) | (c->qkv_bias ? QKV_BIAS : 0),
                       .d = {[D_C] = C, [D_KV] = KV, [D_F] = c->intermediate_size, [D_V] = c->vocab_size}};
}

/* "model." before every name but lm_head.weight (which never has it); with a tied head, a file's
 * lm_head.weight must equal embed_tokens; the rotary buffers of older files ("rotary_emb.inv_freq") are
 * skipped. */
static const zt__tt_alias aliases[] = {{LM_HEAD, "embed_tokens.weight", ZT_HF_TIED, TIED, 0}};
static const char *const buffers[] = {"rotary_emb.inv_freq", NULL};
static const zt__tt table = {.rows = rows, .nrows = (int)(sizeof rows / sizeof rows[0]),
                             .layer_prefix = "layers.%d.", .dims = dims, .hf_prefix = HF_PREFIX,
                             .hf_aliases = aliases, .hf_naliases = 1, .hf_buffers = buffers, .hf_model = "a LLaMA",
                             .tie_flag = TIED};

/* LLaMA as the decoder program sees it: RMSNorms, SwiGLU, rotary embeddings, no biases but Qwen2's on q, k
 * and v, the head tied to embed_tokens or lm_head. */
static void decoder_arch(const void *cv, zt__dec_arch *a)
{
    const zt_llama_config *c = cv;
    const int HS = c->hidden_size / c->num_attention_heads;
    *a = (zt__dec_arch){.L = c->num_hidden_layers, .C = c->hidden_size, .NH = c->num_attention_heads,
                        .NKV = c->num_key_value_heads, .HS = HS, .F = c->intermediate_size, .V = c->vocab_size,
                        .norm = ZT__DEC_RMSNORM, .eps = c->rms_norm_eps, .mlp = ZT__DEC_MLP_SWIGLU, .rope = true,
                        .rot = HS, .rope_cfg = c->rope, .pad_token_id = c->pad_token_id};
}

extern const zt_family_def zt__family_llama;
const zt__hm_spec zt__llama_spec = {.def = &zt__family_llama, .config_size = sizeof(zt_llama_config),
                                    .table = &table, .arch = decoder_arch};

/* The typed API of llama.h over the host model. */
ZT__HM_TYPED_API(zt_llama, zt_llama, zt_llama_config, zt__llama_spec, zt__family_llama)

/* Returns the number of parameters of a LLaMA with cfg's shape (cfg must be valid), without allocating the
 * model. */
size_t zt_llama_config_num_params(const zt_llama_config *cfg)
{
    return zt__tt_num_params(&table, cfg);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Hugging Face files and the family definition                                                         */
/* ---------------------------------------------------------------------------------------------------- */

const zt_hf_names zt__llama_hf_names = {
    ZT__TT_HF_NAMES
    .tied_fix = "tie_word_embeddings is true; set it to false to import an untied head",
    .head_optional = false,
};

/* The family's entries over void pointers (family.h); those from zt__llama_config_validate_v on are shared
 * with the families written on LLaMA's (llama_family.h). */
static void f_config_default(void *c, const char *model_type)
{
    (void)model_type; /* zt_llama_config_from_json reads it */
    zt_llama_config_default(c);
}
static int f_config_from_json(void *c, const cJSON *o, const char *where, zt_err *err)
{
    return zt_llama_config_from_json(c, o, where, err);
}
static int f_config_save(const void *c, const char *path, zt_err *err)
{
    return zt_llama_config_save(c, path, err);
}
int zt__llama_config_validate_v(const void *c, zt_err *err)
{
    return zt_llama_config_validate(c, err);
}

#define F(name, kind, hash_only) {#name, offsetof(zt_llama_config, name), ZT__HM_##kind, hash_only}
const zt__hm_field zt__llama_fields[ZT__LLAMA_NUM_FIELDS] = {
    F(family, ENUM, false), F(num_hidden_layers, INT, false), F(hidden_size, INT, false),
    F(num_attention_heads, INT, false), F(num_key_value_heads, INT, false), F(intermediate_size, INT, false),
    F(max_position_embeddings, INT, false), F(vocab_size, INT, false), F(tie_word_embeddings, BOOL, false),
    F(pad_token_id, INT, false), F(rms_norm_eps, FLOAT, false), F(rope.theta, DOUBLE, false),
    F(rope.scaling, ENUM, false), F(rope.factor, DOUBLE, false), F(rope.low_freq_factor, DOUBLE, false),
    F(rope.high_freq_factor, DOUBLE, false), F(rope.original_max_position_embeddings, INT, false),
    F(initializer_range, DOUBLE, true),
};
#undef F

void zt__llama_describe(const void *c, char *buf, size_t cap)
{
    const zt_llama_config *l = c;
    static const char *const names[] = {"LLaMA", "Mistral", "Qwen2"};
    snprintf(buf, cap, "%s, %d layers x %d wide, %d heads (%d key/value), MLP %d, vocab %d, %d positions%s",
             names[l->family], l->num_hidden_layers, l->hidden_size,
             l->num_attention_heads, l->num_key_value_heads, l->intermediate_size, l->vocab_size,
             l->max_position_embeddings, l->tie_word_embeddings ? ", tied head" : "");
}

void zt__llama_shape(const void *c, zt_family_shape *s)
{
    const zt_llama_config *l = c;
    *s = (zt_family_shape){.layers = l->num_hidden_layers, .positions = l->max_position_embeddings,
                           .vocab = l->vocab_size, .width = l->hidden_size, .heads = l->num_attention_heads,
                           .num_params = zt_llama_config_num_params(l), .task = ZT_TASK_CAUSAL_LM,
                           .pad_token_id = l->pad_token_id, .n_eos = l->num_eos_token_ids};
    for (int i = 0; i < l->num_eos_token_ids && i < ZT_FAMILY_MAX_EOS; i++)
        s->eos_ids[i] = l->eos_token_ids[i];
}

ZT__HM_TYPED_CUDA_API(zt_llama, zt_llama)

static const char *const model_types[] = {"llama", "mistral", NULL};

const zt_family_def zt__family_llama = {
    .name = "llama",
    .model_types = model_types,
    .config_default = f_config_default,
    .config_from_json = f_config_from_json,
    .config_save = f_config_save,
    ZT__LLAMA_SHARED_ENTRIES
};
