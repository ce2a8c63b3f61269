/* GPT-NeoX: its config.json mapping, tensor table, initialisation and decoder architecture, on the shared host
 * model (host_model.h); see neox.h.
 *
 * Initialisation: PreTrainedModel._init_weights as GPTNeoXPreTrainedModel inherits it: normal(0,
 * initializer_range) for embed_in, embed_out and every linear weight, zero biases, LayerNorm weights 1 and
 * biases 0; tensors are filled in slab order from one generator. */
#include "worker/models/neox.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"               /* strict reading of config.json, exact numbers in the one written */
#include "common/rng.h"                /* deterministic initialisation */
#include "kernels/rope.h"              /* zt_rope_inv_freq */
#include "worker/models/family.h"      /* the family definition */
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_io.h"     /* how the table meets Hugging Face files */
#include "worker/models/host_model.h"  /* the host model every decoder family shares */
#include "worker/models/host_shared.h" /* generic config keys, the normal initialisation */

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
    ZT__CFG_I(S, num_attention_heads, 1, NEOX_MAX), ZT__CFG_I(S, intermediate_size, 1, NEOX_MAX_BIG),
    ZT__CFG_I(S, max_position_embeddings, 1, NEOX_MAX_BIG), ZT__CFG_I(S, vocab_size, 1, NEOX_MAX_BIG),
    ZT__CFG_R(S, FLOAT, layer_norm_eps, 0.0, 1.0, ZT__CFG_OPEN), ZT__CFG_R(S, DOUBLE, initializer_range, 0.0, 1.0, 0),
    ZT__CFG_R(S, DOUBLE, rotary_pct, 0.0, 1.0, ZT__CFG_NO_CHECK),
    ZT__CFG_R(S, DOUBLE, rotary_emb_base, 0.0, 1e300, ZT__CFG_NO_CHECK),
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

static int validate_where(const zt_neox_config *c, const char *where, zt_err *err)
{
    int rc = zt__cfg_check(keys, NKEYS, c, where, err);
    if (rc < 0)
        return rc;
    if (c->hidden_size % c->num_attention_heads != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: hidden_size %d is not divisible by num_attention_heads %d (choose a head count that "
                       "divides hidden_size)", where, c->hidden_size, c->num_attention_heads);
    if (!(c->rotary_pct > 0.0 && c->rotary_pct <= 1.0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rotary_pct (partial_rotary_factor) must be in (0, 1], got %g",
                       where, c->rotary_pct);
    const int rot = zt_neox_config_rotary_ndims(c);
    if (rot < 2 || rot % 2 != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: rotary_pct %g of heads of %d channels gives %d rotated channels, but ztrain rotates an "
                       "even number of at least 2 (choose a rotary_pct that gives one)",
                       where, c->rotary_pct, c->hidden_size / c->num_attention_heads, rot);
    if (!(c->rotary_emb_base > 0.0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rotary_emb_base (rope_theta) must be positive, got %g", where,
                       c->rotary_emb_base);
    if ((unsigned)c->hidden_act > ZT_NEOX_ACT_GELU_FAST)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: unknown hidden_act %d", where, (int)c->hidden_act);
    return 0;
}

static int config_validate(const void *c, zt_err *err)
{
    return validate_where(c, "model config", err);
}

/* rope_scaling (null only) and transformers 5's rope_parameters {rope_type "default", rope_theta,
 * partial_rotary_factor}, which must agree with rotary_emb_base and rotary_pct where both are given. */
static int read_rotary(zt_json_reader *r, const cJSON *obj, zt_neox_config *c, zt_err *err)
{
    const bool have_pct = cJSON_GetObjectItemCaseSensitive(obj, "rotary_pct") != NULL;
    const bool have_base = cJSON_GetObjectItemCaseSensitive(obj, "rotary_emb_base") != NULL;
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(obj, "rope_scaling");
    if (scaling && !cJSON_IsNull(scaling))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_scaling is set, but ztrain's GPT-NeoX computes unscaled "
                       "rotary embeddings (set it to null)", r->where);
    if (scaling)
        zt_json_accept(r, "rope_scaling");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "rope_parameters");
    if (p)
        zt_json_accept(r, "rope_parameters");
    if (!p || cJSON_IsNull(p))
        return 0;
    char w[320];
    snprintf(w, sizeof w, "%s, rope_parameters", r->where);
    if (!cJSON_IsObject(p))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s must be an object or null", w);
    zt_json_reader pr;
    zt_json_reader_init(&pr, p, w);
    char type[32] = "default";
    double theta = NAN, pct = NAN;
    int rc;
    if ((rc = zt_json_get_string(&pr, "rope_type", type, sizeof type, err)) < 0 ||
        (rc = zt_json_get_double(&pr, "rope_theta", 0.0, 1e300, &theta, err)) < 0 ||
        (rc = zt_json_get_double(&pr, "partial_rotary_factor", 0.0, 1.0, &pct, err)) < 0 ||
        (rc = zt_json_reader_finish(&pr, err)) < 0)
        return rc;
    if (strcmp(type, "default") != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_type \"%s\" is not one ztrain's GPT-NeoX computes (it "
                       "computes \"default\")", w, type);
    if (!isnan(theta) && have_base && theta != c->rotary_emb_base)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: rope_theta (%g) and rotary_emb_base (%g) disagree (keep one)", w,
                       theta, c->rotary_emb_base);
    if (!isnan(pct) && have_pct && pct != c->rotary_pct)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: partial_rotary_factor (%g) and rotary_pct (%g) disagree (keep one)", w, pct, c->rotary_pct);
    if (!isnan(theta))
        c->rotary_emb_base = theta;
    if (!isnan(pct))
        c->rotary_pct = pct;
    return 0;
}

static int config_from_json(void *cv, const cJSON *obj, const char *where, zt_err *err)
{
    static const char *const types[] = {"gpt_neox", NULL}, *const heads[] = {"GPTNeoXForCausalLM", NULL};
    zt_neox_config c = *(zt_neox_config *)cv;
    zt_json_reader r;
    int rc, type;
    if ((rc = zt__cfg_begin(&r, obj, where, types, &type, err)) < 0 ||
        (rc = zt__cfg_read(&r, obj, keys, NKEYS, &c, err)) < 0 || (rc = read_rotary(&r, obj, &c, err)) < 0 ||
        (rc = zt__cfg_finish(&r, obj, heads, err)) < 0 || (rc = validate_where(&c, where, err)) < 0)
        return rc;
    *(zt_neox_config *)cv = c;
    return 0;
}

/* GPTNeoXConfig's config.json in the form transformers 4.x writes (rotary_pct, rotary_emb_base), which 5.x
 * reads too; keys sorted. */
static int config_save(const void *cv, const char *path, zt_err *err)
{
    int rc = validate_where(cv, path, err);
    if (rc < 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    zt__cfg_write(keys, NKEYS, cv, o);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "architectures"), cJSON_CreateString("GPTNeoXForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", "gpt_neox");
    return zt__cfg_save(o, path, err);
}

#define F(name, kind) {#name, offsetof(zt_neox_config, name), ZT__HM_##kind, false}
static const zt__hm_field fields[] = {
    F(num_hidden_layers, INT), F(hidden_size, INT), F(num_attention_heads, INT), F(intermediate_size, INT),
    F(max_position_embeddings, INT), F(vocab_size, INT), F(layer_norm_eps, FLOAT), F(hidden_act, ENUM),
    F(use_parallel_residual, BOOL), F(attention_bias, BOOL), F(tie_word_embeddings, BOOL), F(rotary_pct, DOUBLE),
    F(rotary_emb_base, DOUBLE), F(initializer_range, DOUBLE),
};
#undef F

static void config_describe(const void *cv, char *buf, size_t cap)
{
    const zt_neox_config *c = cv;
    snprintf(buf, cap, "GPT-NeoX, %d layers x %d wide, %d heads (%d rotary channels), MLP %d, vocab %d, %d positions, "
             "%s residual%s", c->num_hidden_layers, c->hidden_size, c->num_attention_heads,
             zt_neox_config_rotary_ndims(c), c->intermediate_size, c->vocab_size, c->max_position_embeddings,
             c->use_parallel_residual ? "parallel" : "sequential", c->tie_word_embeddings ? ", tied head" : "");
}

/* ---- the tensor table ---- */

/* A layer's tensors in Hugging Face's order; the biases of query_key_value and dense only with
 * attention_bias. */
enum { T_LN1_W, T_LN1_B, T_LN2_W, T_LN2_B, T_QKV_W, T_QKV_B, T_O_W, T_O_B, T_UP_W, T_UP_B, T_DOWN_W, T_DOWN_B, T_N };
static const char *const layer_names[T_N] = {
    "input_layernorm.weight", "input_layernorm.bias", "post_attention_layernorm.weight",
    "post_attention_layernorm.bias", "attention.query_key_value.weight", "attention.query_key_value.bias",
    "attention.dense.weight", "attention.dense.bias", "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias",
    "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias"};

static bool has_tensor(const zt_neox_config *c, int k)
{
    return c->attention_bias || (k != T_QKV_B && k != T_O_B);
}

static int per_layer(const zt_neox_config *c)
{
    return c->attention_bias ? T_N : T_N - 2;
}

static int count_tensors(const void *cv)
{
    const zt_neox_config *c = cv;
    return 1 + c->num_hidden_layers * per_layer(c) + 2 + (c->tie_word_embeddings ? 0 : 1);
}

static size_t build_layout(const void *cv, zt_param_info *t, zt_block_info *blocks)
{
    const zt_neox_config *c = cv;
    const int64_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    const int64_t shape[T_N][2] = {{C, 0}, {C, 0}, {C, 0}, {C, 0}, {3 * C, C}, {3 * C, 0},
                                   {C, C}, {C, 0}, {F, C}, {F, 0}, {C, F}, {C, 0}};
    size_t off = 0;
    int i = 0;
    char name[64];
    zt__hm_add_tensor(&t[i++], 0, &off, "embed_in.weight", V, C, true);
    blocks[0] = (zt_block_info){0, off};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        blocks[1 + l].offset = off;
        for (int k = 0; k < T_N; k++)
            if (has_tensor(c, k)) {
                snprintf(name, sizeof name, "layers.%d.%s", l, layer_names[k]);
                zt__hm_add_tensor(&t[i++], 1 + l, &off, name, shape[k][0], shape[k][1], shape[k][1] > 0);
            }
        blocks[1 + l].numel = off - blocks[1 + l].offset;
    }
    const int last = c->num_hidden_layers + 1;
    blocks[last].offset = off;
    zt__hm_add_tensor(&t[i++], last, &off, "final_layer_norm.weight", C, 0, false);
    zt__hm_add_tensor(&t[i++], last, &off, "final_layer_norm.bias", C, 0, false);
    if (!c->tie_word_embeddings)
        zt__hm_add_tensor(&t[i++], last, &off, HEAD, V, C, true);
    blocks[last].numel = off - blocks[last].offset;
    return off;
}

static void config_shape(const void *cv, zt_family_shape *s)
{
    const zt_neox_config *c = cv;
    const size_t C = (size_t)c->hidden_size, V = (size_t)c->vocab_size, F = (size_t)c->intermediate_size;
    const size_t layer = 4 * C + 3 * C * C + C * C + 2 * F * C + F + C + (c->attention_bias ? 4 * C : 0);
    *s = (zt_family_shape){.layers = c->num_hidden_layers, .positions = c->max_position_embeddings,
                           .vocab = c->vocab_size, .width = c->hidden_size, .heads = c->num_attention_heads,
                           .num_params = V * C * (c->tie_word_embeddings ? 1 : 2) + (size_t)c->num_hidden_layers * layer
                                         + 2 * C,
                           .task = ZT_TASK_CAUSAL_LM, .pad_token_id = -1, .n_eos = c->eos_token_id >= 0,
                           .eos_ids = {c->eos_token_id}};
}

static void arch(const void *cv, const zt_param_info *t, int n, zt__dec_arch *a)
{
    const zt_neox_config *c = cv;
    *a = (zt__dec_arch){.L = c->num_hidden_layers, .C = c->hidden_size, .NH = c->num_attention_heads,
                        .NKV = c->num_attention_heads, .HS = c->hidden_size / c->num_attention_heads,
                        .F = c->intermediate_size, .V = c->vocab_size, .norm = ZT__DEC_LAYERNORM,
                        .eps = c->layer_norm_eps,
                        .mlp = c->hidden_act == ZT_NEOX_ACT_GELU ? ZT__DEC_MLP_GELU_ERF : ZT__DEC_MLP_GELU_TANH,
                        .rope = true, .rot = zt_neox_config_rotary_ndims(c),
                        .parallel_residual = c->use_parallel_residual, .pad_token_id = -1, .layer0 = 1,
                        .per_layer = per_layer(c), .final_w = n - (c->tie_word_embeddings ? 2 : 3),
                        .final_b = n - (c->tie_word_embeddings ? 1 : 2),
                        .head_tensor = c->tie_word_embeddings ? 0 : n - 1};
    (void)t;
    static const int roles[T_N] = {ZT__DEC_LN1_W, ZT__DEC_LN1_B, ZT__DEC_LN2_W, ZT__DEC_LN2_B,
                                   ZT__DEC_QKV_W, ZT__DEC_QKV_B, ZT__DEC_O_W,   ZT__DEC_O_B,
                                   ZT__DEC_UP_W,  ZT__DEC_UP_B,  ZT__DEC_DOWN_W, ZT__DEC_DOWN_B};
    for (int k = 0; k < ZT__DEC_ROLES; k++)
        a->role[k] = -1;
    for (int k = 0, j = 0; k < T_N; k++)
        if (has_tensor(c, k))
            a->role[roles[k]] = j++;
}

static void inv_freq(const void *cv, float *f)
{
    const zt_neox_config *c = cv;
    const zt_rope_config rope = {.theta = c->rotary_emb_base, .scaling = ZT_ROPE_SCALING_NONE};
    ZT_ASSERT(zt_rope_inv_freq(f, zt_neox_config_rotary_ndims(c), &rope, NULL) == 0); /* validated */
}

static void init(const void *cv, const zt_param_info *t, int n, float *params, uint64_t seed)
{
    const zt_neox_config *c = cv;
    zt_rng r;
    zt_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        float *x = params + t[i].offset;
        const bool ln_weight = t[i].ndim == 1 && strstr(t[i].name, "norm.weight");
        if (t[i].ndim == 2)
            zt__host_fill_normal(&r, x, t[i].numel, c->initializer_range);
        else
            for (size_t j = 0; j < t[i].numel; j++)
                x[j] = ln_weight ? 1.0f : 0.0f;
    }
}

static const zt__hm_spec spec = {.def = &zt__family_neox, .config_size = sizeof(zt_neox_config),
                                 .count_tensors = count_tensors, .build_layout = build_layout, .arch = arch,
                                 .inv_freq = inv_freq, .init = init};

static int create(void **out, const void *c, int B, int T, uint64_t seed, zt_err *err)
{
    return zt__hm_create((zt__hm **)out, &spec, c, B, T, seed, err);
}

static int create_layout(void **out, const void *c, zt_err *err)
{
    return zt__hm_create_layout((zt__hm **)out, &spec, c, err);
}

/* ---- Hugging Face files ---- */

static void hf_export_name(const void *m, const zt_param_info *t, char *out, size_t cap)
{
    (void)m;
    snprintf(out, cap, "%s%s", strcmp(t->name, HEAD) == 0 ? "" : HF_PREFIX, t->name);
}

static bool ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* "gpt_neox." names (or without the prefix); the head as embed_out.weight or transformers 5's lm_head.weight;
 * the attention's mask and rotary buffers that older files carry are skipped. */
static enum zt_hf_kind hf_map(const void *m, const char *name, int *idx)
{
    const zt_neox_config *c = zt__hm_config(m);
    if (ends_with(name, "rotary_emb.inv_freq") || ends_with(name, "attention.bias") ||
        ends_with(name, "attention.masked_bias"))
        return ZT_HF_BUFFER;
    const bool head = strcmp(name, HEAD) == 0 || strcmp(name, "lm_head.weight") == 0;
    if (head && c->tie_word_embeddings) {
        *idx = 0;
        return ZT_HF_TIED;
    }
    if (head)
        name = HEAD;
    else if (strncmp(name, HF_PREFIX, strlen(HF_PREFIX)) == 0)
        name += strlen(HF_PREFIX);
    *idx = zt__host_find_tensor(zt__hm_tensor(m, 0), zt__hm_num_tensors(m), name);
    return *idx < 0 ? ZT_HF_UNKNOWN : ZT_HF_PARAM;
}

static void hf_describe(const void *m, char *out, size_t cap)
{
    const zt_neox_config *c = zt__hm_config(m);
    snprintf(out, cap, "a GPT-NeoX with %d layers and %s head (tie_word_embeddings %s)", c->num_hidden_layers,
             c->tie_word_embeddings ? "a tied" : "an untied", c->tie_word_embeddings ? "true" : "false");
}

/* query_key_value's rows: ours are part p (q, k, v) of head h at row p*C + h*HS + i, Hugging Face's at
 * (3h + p)*HS + i. */
static bool hf_reorder(const void *m, int idx, const float *src, float *dst, bool to_hf)
{
    const zt__dec_arch *a = zt__hm_arch(m);
    const int layer = idx - a->layer0, k = layer >= 0 ? layer % a->per_layer : -1;
    if (layer < 0 || layer >= a->L * a->per_layer || (k != a->role[ZT__DEC_QKV_W] && k != a->role[ZT__DEC_QKV_B]))
        return false;
    const zt_param_info *t = zt__hm_tensor(m, idx);
    const size_t cols = t->numel / (size_t)t->shape[0], HS = (size_t)a->HS, C = (size_t)a->C;
    for (size_t p = 0; p < 3; p++)
        for (size_t h = 0; h < (size_t)a->NH; h++)
            for (size_t i = 0; i < HS; i++) {
                const size_t ours = p * C + h * HS + i, hf = (3 * h + p) * HS + i;
                memcpy(dst + (to_hf ? hf : ours) * cols, src + (to_hf ? ours : hf) * cols, cols * sizeof(float));
            }
    return true;
}

static const zt_hf_names hf_names = {
    .export_name = hf_export_name,
    .map = hf_map,
    .describe = hf_describe,
    .tied_fix = "tie_word_embeddings is true; set it to false to import an untied head",
    .reorder = hf_reorder,
};

static const char *const model_types[] = {"gpt_neox", NULL};

const zt_family_def zt__family_neox = {
    .name = "gpt_neox",
    .model_types = model_types,
    .config_default = config_default,
    .config_from_json = config_from_json,
    .config_save = config_save,
    .config_validate = config_validate,
    ZT__HM_FIELD_ENTRIES(fields, 4)
    .config_describe = config_describe,
    .config_shape = config_shape,
    .create = create,
    .create_layout = create_layout,
    .hf = &hf_names,
    ZT__HM_FAMILY_ENTRIES
};
