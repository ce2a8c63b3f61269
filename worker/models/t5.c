/* T5 and mT5: the config mapping, the tensor table, the layer program over the op table, its CPU runner, its
 * CUDA executor and the family definition; see t5.h. The program (prog_forward_block, prog_backward_block and
 * the layer functions under them) reads only the op table, the buffers of t5_run and the tensor offsets of
 * each block's buffer, so both backends run it unchanged; the CPU runner and the CUDA executor own the head
 * (logits and the classifier), the staging of tokens and where the buffers live.
 *
 * Initialisation (the tensor table's rows): T5PreTrainedModel._init_weights with initializer_factor f: the shared
 * embedding and lm_head normal(0, f); q normal(0, f (d_model d_kv)^-0.5), k and v normal(0, f d_model^-0.5),
 * o normal(0, f (num_heads d_kv)^-0.5), the bias tables normal(0, f d_model^-0.5), wi (wi_0, wi_1)
 * normal(0, f d_model^-0.5), wo normal(0, f d_ff^-0.5), norms f. */
#include "worker/models/t5.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/json.h"
#include "common/memory.h"
#include "common/rng.h"
#include "kernels/crossentropy.h"
#include "kernels/matmul.h"
#include "worker/models/cpu_exec.h"
#include "worker/models/family.h"
#include "worker/models/host_config.h" /* the config.json mapping as a table */
#include "worker/models/host_io.h"
#include "worker/models/host_model.h"
#include "worker/models/host_shared.h"
#include "worker/models/ops.h"
#include "worker/models/tensor_table.h" /* the tensors as data */
#ifdef ZT_WITH_CUDA
#include "common/log.h"
#include "kernels/cuda/cuda_common.h" /* ZT_CUDA_CHECK, the inf/NaN check */
#include "kernels/embedding.h"
#include "kernels/rmsnorm.h"
#include "worker/models/cuda_exec.h"
#include "worker/models/ops_cuda.h"
#endif

#define T5_MAX_LAYERS 1024
#define T5_MAX_WIDTH 65536
#define T5_MAX_FF (1 << 20)
#define T5_MAX_VOCAB (1 << 24)
#define T5_MAX_POSITIONS (1 << 24)
#define IGNORE_INDEX (-1)

/* ---------------------------------------------------------------------------------------------------- */
/* Configuration                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */

void zt_t5_config_default(zt_t5_config *c)
{
    *c = (zt_t5_config){.vocab_size = 32128, .d_model = 512, .d_kv = 64, .d_ff = 2048, .num_layers = 6,
                        .num_decoder_layers = 6, .num_heads = 8, .num_buckets = 32, .max_distance = 128,
                        .layer_norm_epsilon = 1e-6f, .initializer_factor = 1.0, .dropout_rate = 0.1,
                        .gated = false, .tie_word_embeddings = true, .scale_decoder_outputs = true,
                        .n_positions = 512, .pad_token_id = 0, .eos_token_id = 1, .decoder_start_token_id = 0};
}

/* T5Config's and MT5Config's keys; the MLP's three keys, num_decoder_layers, the head's two booleans and
 * the token ids have their own rules below. */
#define S zt_t5_config
#define K(k, f, lo, hi) {.key = (k), .type = ZT__CFG_INT, .offset = offsetof(S, f), .min = (lo), .max = (hi)}
static const zt__cfg_key keys[] = {
    ZT__CFG_I(S, vocab_size, 1, T5_MAX_VOCAB), ZT__CFG_I(S, d_model, 1, T5_MAX_WIDTH), ZT__CFG_I(S, d_kv, 1, T5_MAX_WIDTH),
    ZT__CFG_I(S, d_ff, 1, T5_MAX_FF), ZT__CFG_I(S, num_layers, 1, T5_MAX_LAYERS), ZT__CFG_I(S, num_heads, 1, T5_MAX_WIDTH),
    K("relative_attention_num_buckets", num_buckets, 2, 1 << 16),
    K("relative_attention_max_distance", max_distance, 1, T5_MAX_POSITIONS), ZT__CFG_I(S, n_positions, 1, T5_MAX_POSITIONS),
    ZT__CFG_R(S, FLOAT, layer_norm_epsilon, 0.0, 1.0, ZT__CFG_OPEN | ZT__CFG_PY_FLOAT),
    ZT__CFG_R(S, DOUBLE, initializer_factor, 0.0, 100.0, ZT__CFG_ABOVE_MIN | ZT__CFG_PY_FLOAT),
    ZT__CFG_R(S, DOUBLE, dropout_rate, 0.0, 1.0, ZT__CFG_NO_CHECK | ZT__CFG_PY_FLOAT),
    ZT__CFG_NUMBER_("classifier_dropout", 0.0, 1.0, 0, "0.0"),
    ZT__CFG_ONLY_("is_encoder_decoder", "true", 0, "ztrain trains T5ForConditionalGeneration"),
    ZT__CFG_IGNORE_("use_cache", "true"), ZT__CFG_IGNORE_("output_past", NULL),
    ZT__CFG_IGNORE_("torch_dtype", "\"float32\""),
};
#undef K
#undef S
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* The rules the key table cannot say (its ranges are checked first, zt__cfg_io_validate). */
static int validate_config(const void *cv, const char *where, zt_err *err)
{
    const zt_t5_config *c = cv;
    if (c->num_decoder_layers < 1 || c->num_decoder_layers > T5_MAX_LAYERS)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: num_decoder_layers must be from 1 to %d, got %d", where,
                       T5_MAX_LAYERS, c->num_decoder_layers);
    if ((int64_t)c->num_heads * c->d_kv > T5_MAX_WIDTH)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: num_heads x d_kv = %lld is above %d (choose fewer or smaller heads)",
                       where, (long long)c->num_heads * c->d_kv, T5_MAX_WIDTH);
    /* the bidirectional encoder halves the buckets, and each half has num_buckets / 4 exact ones */
    if (c->num_buckets % 4 != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: relative_attention_num_buckets is %d; use a multiple of 4 (the encoder splits the buckets "
                       "into two directions, each with exact and logarithmic halves)", where, c->num_buckets);
    if (c->max_distance <= c->num_buckets / 4)
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: relative_attention_max_distance %d must be above relative_attention_num_buckets / 4 (%d), "
                       "where the logarithmic buckets start", where, c->max_distance, c->num_buckets / 4);
    if (!(c->dropout_rate >= 0.0 && c->dropout_rate < 1.0))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: dropout_rate must be from 0 to 1 (exclusive), got %g", where,
                       c->dropout_rate);
    const struct {
        const char *key;
        int v;
        bool nullable;
    } ids[] = {{"pad_token_id", c->pad_token_id, false},
               {"eos_token_id", c->eos_token_id, true},
               {"decoder_start_token_id", c->decoder_start_token_id, false}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].v >= c->vocab_size || ids[i].v < (ids[i].nullable ? -1 : 0))
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s %d is not a token of the vocabulary of %d", where,
                           ids[i].key, ids[i].v, c->vocab_size);
    return 0;
}

/* A token id: a whole number from 0, or null (-1) where null_ok. */
static int get_token_id(zt_json_reader *r, const cJSON *obj, const char *key, bool null_ok, int *out, zt_err *err)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsNull(item) && !null_ok)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s is null, but T5 needs it (give a token id)", r->where, key);
    if (cJSON_IsArray(item))
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: %s lists several ids; ztrain's T5 takes one", r->where, key);
    return zt__host_json_token_id(r, obj, key, out, err);
}

/* What T5Config reads beyond the key table (mT5 from model_type: the registry's defaults of that type). */
static int read_extra(zt_json_reader *r, const cJSON *obj, void *cv, zt_err *err)
{
    zt_t5_config *c = cv;
    const char *where = r->where;
    int rc;
    /* num_decoder_layers: absent or null is num_layers, as T5Config reads it */
    c->num_decoder_layers = c->num_layers;
    const cJSON *ndl = cJSON_GetObjectItemCaseSensitive(obj, "num_decoder_layers");
    if (cJSON_IsNull(ndl))
        zt_json_accept(r, "num_decoder_layers");
    else if ((rc = zt__host_json_int(r, "num_decoder_layers", 1, T5_MAX_LAYERS, &c->num_decoder_layers, NULL,
                                     err)) < 0)
        return rc;
    /* the MLP: feed_forward_proj, and the fields T5Config derives from it (they must agree) */
    char ff[32] = "relu", act[32] = "";
    if ((rc = zt_json_get_string(r, "feed_forward_proj", ff, sizeof ff, err)) < 0 ||
        (rc = zt_json_get_string(r, "dense_act_fn", act, sizeof act, err)) < 0)
        return rc;
    if (strcmp(ff, "relu") == 0)
        c->gated = false;
    else if (strcmp(ff, "gated-gelu") == 0)
        c->gated = true;
    else
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "%s: feed_forward_proj is \"%s\", but ztrain's T5 computes \"relu\" (T5 v1.0) and \"gated-gelu\" "
                       "(v1.1, FLAN-T5, mT5)", where, ff);
    const char *want_act = c->gated ? "gelu_new" : "relu";
    if (act[0] && strcmp(act, want_act) != 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: dense_act_fn is \"%s\", but feed_forward_proj \"%s\" computes \"%s\"",
                       where, act, ff, want_act);
    bool is_gated = c->gated;
    if ((rc = zt_json_get_bool(r, "is_gated_act", &is_gated, err)) < 0)
        return rc;
    if (is_gated != c->gated)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: is_gated_act is %s, but feed_forward_proj is \"%s\"", where,
                       is_gated ? "true" : "false", ff);
    /* The head: tie_word_embeddings (absent: tied) and scale_decoder_outputs (transformers 5 writes it for T5
     * and ties every head; absent: T5's scale follows the tie, as transformers derives it, and mT5 has none, as
     * transformers 5's MT5ForConditionalGeneration computes it). */
    c->tie_word_embeddings = true;
    if ((rc = zt_json_get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings, err)) < 0)
        return rc;
    c->scale_decoder_outputs = c->tie_word_embeddings && !c->mt5;
    if ((rc = zt_json_get_bool(r, "scale_decoder_outputs", &c->scale_decoder_outputs, err)) < 0)
        return rc;

    if ((rc = get_token_id(r, obj, "pad_token_id", false, &c->pad_token_id, err)) < 0 ||
        (rc = get_token_id(r, obj, "eos_token_id", true, &c->eos_token_id, err)) < 0)
        return rc;
    int bos = -1; /* mT5 writes bos_token_id null; T5 has no beginning-of-sequence token */
    if ((rc = get_token_id(r, obj, "bos_token_id", true, &bos, err)) < 0)
        return rc;
    c->decoder_start_token_id = c->pad_token_id;
    if ((rc = get_token_id(r, obj, "decoder_start_token_id", false, &c->decoder_start_token_id, err)) < 0)
        return rc;

    return 0;
}

/* What a written config holds beyond the key table. */
static void write_extra(const void *cv, cJSON *o)
{
    const zt_t5_config *c = cv;
    cJSON_AddNumberToObject(o, "num_decoder_layers", c->num_decoder_layers);
    cJSON_AddStringToObject(o, "dense_act_fn", c->gated ? "gelu_new" : "relu");
    cJSON_AddStringToObject(o, "feed_forward_proj", c->gated ? "gated-gelu" : "relu");
    cJSON_AddBoolToObject(o, "is_gated_act", c->gated);
    cJSON_AddBoolToObject(o, "scale_decoder_outputs", c->scale_decoder_outputs);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    zt__cfg_add_token(o, "pad_token_id", c->pad_token_id);
    zt__cfg_add_token(o, "eos_token_id", c->eos_token_id);
    zt__cfg_add_token(o, "decoder_start_token_id", c->decoder_start_token_id);
}

static const char *model_type(const void *c)
{
    return ((const zt_t5_config *)c)->mt5 ? "mt5" : "t5";
}

static const char *head(const void *c)
{
    return ((const zt_t5_config *)c)->mt5 ? "MT5ForConditionalGeneration" : "T5ForConditionalGeneration";
}

static const char *const model_types[] = {"t5", "mt5", NULL};
static const char *const heads[] = {"T5ForConditionalGeneration", "MT5ForConditionalGeneration", NULL};
static const zt__cfg_io io = {.model_types = model_types, .heads = heads, .keys = keys, .nkeys = NKEYS,
                              .size = sizeof(zt_t5_config), .validate = validate_config, .read_extra = read_extra,
                              .write_extra = write_extra, .model_type = model_type, .head = head};

/* ---------------------------------------------------------------------------------------------------- */
/* Tensor table                                                                                         */
/* ---------------------------------------------------------------------------------------------------- */

/* What a tensor of a layer does in the program. Q, CK and WI start packed weights (q | k | v, k' | v',
 * wi_0 | wi_1): the tensors after them continue them in the slab. */
enum t5_role {
    R_LN1, R_Q, R_O, R_BIAS, R_LN2, R_CQ, R_CK, R_CO, R_LN3, R_WI, R_WO, R_FINAL, R_COUNT
};

typedef struct t5_layer {
    bool decoder;
    int first;        /* first global layer of its stack (0 or Le) */
    int t[R_COUNT];   /* tensor index of each role, -1 when absent */
} t5_layer;

/* The passes' state beside the shared host model's tables and slabs (host_model.h; a zt_t5 is that host
 * model): the config, the layers' roles, the tables borrowed from the host model and the CPU runner. */
typedef struct t5_model {
    zt_t5_config cfg;
    int Le, Ld, L;       /* encoder, decoder, all layers */
    int I;               /* num_heads x d_kv: the attention's inner width */
    int UP;              /* width of the MLP's first projection: d_ff or 2 d_ff */
    int max_B, max_T;
    size_t num_params;
    int num_tensors, num_blocks, head_block, head_tensor, final_tensor;
    const zt_param_info *tensors; /* the host model's */
    const zt_block_info *blocks;  /* the host model's */
    t5_layer *layers;    /* [L] */
    struct t5_run *run;  /* activations (NULL for a layout) */
} t5_model;

enum { D_C = 1, D_I, D_F, D_V, D_NB, D_NH, D_CKV }; /* dimension symbols (D_I: num_heads x d_kv, D_CKV: d_model x d_kv) */
enum { TIED = 1u, GATED = 2u };                       /* flags: tie_word_embeddings, the gated feed-forward */

/* Hugging Face's names in slab order: the shared embedding; each encoder layer (self-attention, its bias table
 * in layer 0, the feed-forward; the encoder's final norm in its last layer's block); each decoder layer (the
 * same with cross-attention between); the decoder's final norm and an untied lm_head. Initialisation as
 * T5PreTrainedModel's with initializer_factor f: the embeddings normal(0, f); q f (d_model d_kv)^-0.5; k, v,
 * the bias tables and wi f d_model^-0.5; o f (num_heads d_kv)^-0.5; wo f d_ff^-0.5; the norms f. */
#define R(part, name, d0, d1, init, role, ...) {ZT__TT(part, name, d0, d1, init, role), __VA_ARGS__}
#define SELF(part)                                                                                             \
    R(part, "layer.0.SelfAttention.q.weight", D_I, D_C, NORMAL, R_Q, .std_div = D_CKV),                        \
    R(part, "layer.0.SelfAttention.k.weight", D_I, D_C, NORMAL, ZT__TT_NO_ROLE, .std_div = D_C, .packed = true), \
    R(part, "layer.0.SelfAttention.v.weight", D_I, D_C, NORMAL, ZT__TT_NO_ROLE, .std_div = D_C, .packed = true), \
    R(part, "layer.0.SelfAttention.o.weight", D_C, D_I, NORMAL, R_O, .std_div = D_I),                          \
    R(part, "layer.0.SelfAttention.relative_attention_bias.weight", D_NB, D_NH, NORMAL, R_BIAS, .std_div = D_C, \
      .at = ZT__TT_FIRST),                                                                                     \
    R(part, "layer.0.layer_norm.weight", D_C, 0, FILL, R_LN1)
#define FF(part, k)                                                                                            \
    R(part, "layer." #k ".DenseReluDense.wi_0.weight", D_F, D_C, NORMAL, R_WI, .std_div = D_C, .when = GATED),  \
    R(part, "layer." #k ".DenseReluDense.wi_1.weight", D_F, D_C, NORMAL, ZT__TT_NO_ROLE, .std_div = D_C,        \
      .when = GATED, .packed = true),                                                                          \
    R(part, "layer." #k ".DenseReluDense.wi.weight", D_F, D_C, NORMAL, R_WI, .std_div = D_C, .unless = GATED),  \
    R(part, "layer." #k ".DenseReluDense.wo.weight", D_C, D_F, NORMAL, R_WO, .std_div = D_F),                  \
    R(part, "layer." #k ".layer_norm.weight", D_C, 0, FILL, R_LN3)
static const zt__tt_row rows[] = {
    R(EMBED, "shared.weight", D_V, D_C, NORMAL, ZT__TT_NO_ROLE),
    SELF(LAYER),
    FF(LAYER, 1),
    R(LAYER, "encoder.final_layer_norm.weight", D_C, 0, FILL, R_FINAL, .at = ZT__TT_LAST, .no_layer_prefix = true),
    SELF(LAYER2),
    R(LAYER2, "layer.1.EncDecAttention.q.weight", D_I, D_C, NORMAL, R_CQ, .std_div = D_CKV),
    R(LAYER2, "layer.1.EncDecAttention.k.weight", D_I, D_C, NORMAL, R_CK, .std_div = D_C),
    R(LAYER2, "layer.1.EncDecAttention.v.weight", D_I, D_C, NORMAL, ZT__TT_NO_ROLE, .std_div = D_C, .packed = true),
    R(LAYER2, "layer.1.EncDecAttention.o.weight", D_C, D_I, NORMAL, R_CO, .std_div = D_I),
    R(LAYER2, "layer.1.layer_norm.weight", D_C, 0, FILL, R_LN2),
    FF(LAYER2, 2),
    R(FINAL, "decoder.final_layer_norm.weight", D_C, 0, FILL, ZT__TT_NO_ROLE),
    R(FINAL, "lm_head.weight", D_V, D_C, NORMAL, ZT__TT_NO_ROLE, .unless = TIED),
};
#undef FF
#undef SELF
#undef R

static void dims(const void *cv, zt__tt_dims *d)
{
    const zt_t5_config *c = cv;
    const int64_t C = c->d_model, I = (int64_t)c->num_heads * c->d_kv;
    *d = (zt__tt_dims){.layers = c->num_layers, .layers2 = c->num_decoder_layers, .heads = c->num_heads,
                       .std = c->initializer_factor, .pad_row = -1,
                       .flags = (c->tie_word_embeddings ? TIED : 0) | (c->gated ? GATED : 0),
                       .d = {[D_C] = C, [D_I] = I, [D_F] = c->d_ff, [D_V] = c->vocab_size, [D_NB] = c->num_buckets,
                             [D_NH] = c->num_heads, [D_CKV] = C * c->d_kv}};
}

/* The table's names are the files'; the stacks' embed_tokens and a tied lm_head are the shared embedding; the
 * decoder's cross-attention bias table, which transformers ignores, is skipped. */
static const zt__tt_alias aliases[] = {{"encoder.embed_tokens.weight", "shared.weight", ZT_HF_TIED, 0, 0},
                                       {"decoder.embed_tokens.weight", "shared.weight", ZT_HF_TIED, 0, 0},
                                       {"lm_head.weight", "shared.weight", ZT_HF_TIED, TIED, 0}};
static const char *const buffers[] = {"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
                                      NULL};
static const zt__tt table = {.rows = rows, .nrows = (int)(sizeof rows / sizeof rows[0]),
                             .layer_prefix = "encoder.block.%d.", .layer2_prefix = "decoder.block.%d.", .dims = dims,
                             .hf_prefix = "", .hf_aliases = aliases, .hf_naliases = 3, .hf_buffers = buffers};

/* ---------------------------------------------------------------------------------------------------- */
/* The layer program (op table) and its CPU runner                                                      */
/* ---------------------------------------------------------------------------------------------------- */

/* What a layer keeps for its backward. Cross-attention parts (ln2 .. res3) are the decoder's only; enc_out
 * and final_rstd the last encoder layer's only. */
typedef struct t5_acts {
    void *ln1, *qkv, *atty, *res2, *ln2, *cq, *ckv, *catty, *res3, *ln3, *h, *act, *out, *enc_out;
    float *rstd1, *lse, *rstd2, *clse, *rstd3, *final_rstd; /* statistics: fp32 on every backend */
} t5_acts;

/* What the layer program reads and writes: buffers of the backend's element type (o->esize bytes; fp32 on the
 * CPU), the statistics and bias tables in fp32, and where each tensor sits in its block's buffer (woff, in
 * elements: the host slab's offsets on the CPU). A CUDA executor fills the same fields with device memory
 * and its layout's offsets; the CPU runner's own parts (slab, head, tokens kept) follow them. */
typedef struct t5_run {
    zt_ops ops;
    const size_t *woff;        /* [ntensors] element offset of each tensor in its block's buffer */
    void *emb_enc, *emb_dec;   /* [Ne,C], [Nd,C] */
    t5_acts *acts;             /* [L] */
    void *lnf;                 /* [Nd,C] the decoder's final norm (scaled) */
    float *lnf_rstd;           /* [Nd] */
    float *bias[2], *dbias[2]; /* [NB*NH] each stack's table (copied by its layer 0) and its gradient sum */
    /* gradients */
    void *dres, *dln, *datty, *dqkv, *dh, *dact, *dcq, *dckv, *denc_part, *denc, *ddec_emb;
    int32_t *enc_tokens, *dec_tokens; /* as the backend's embedding takes them (host memory on the CPU) */
    int32_t *enc_lens;         /* [B] host memory: the cross-attention's key counts */
    const int32_t *lens_arg;   /* the same lengths as the backend's attention takes them */
    bool padded;               /* some encoder length is below Te */
    /* the CPU runner's own */
    size_t cap_e, cap_d;       /* rows the slab holds: encoder (B*Te) and decoder (B*Td) */
    char *slab;
    size_t *woff_host;
    void *logits;              /* [Nd,Vp] the backend's type */
    float *losses;             /* [Nd] */
    int32_t *targets;
    int B, Te, Td;
    bool have_seq2seq;         /* set_seq2seq came before this begin */
    bool have_targets;
    int n_valid;
    bool backward_skip;
} t5_run;

/* Where the program's buffers are carved: elements of e bytes, the logits' rows Vp wide, every buffer on an
 * `align`-byte boundary (the CPU runner's slab and a CUDA executor's pool). */
typedef struct t5_carving {
    size_t e, Vp, align;
} t5_carving;

static void *take(char *base, size_t *used, size_t bytes, size_t align)
{
    *used = (*used + align - 1) / align * align;
    void *p = base ? base + *used : NULL;
    *used += bytes;
    return p;
}

/* Carves the buffers for ne encoder and nd decoder rows from base (NULL: counts); returns the bytes. Layers
 * with shared[l] (checkpointed ones; shared may be NULL) write their intermediates into one set they share,
 * sized for a decoder layer, and keep only their own output (and the encoder's output at its top): their
 * backward comes after a rebuild. */
static size_t carve(const t5_model *m, t5_run *r, char *base, size_t ne, size_t nd, const t5_carving *k,
                    const bool *shared)
{
    const size_t C = (size_t)m->cfg.d_model, I = (size_t)m->I, F = (size_t)m->cfg.d_ff, UP = (size_t)m->UP;
    const size_t NH = (size_t)m->cfg.num_heads, f = k->e, f4 = sizeof(float), al = k->align;
    const size_t nmax = ne > nd ? ne : nd, TB = (size_t)m->cfg.num_buckets * NH;
    size_t u = 0;
#define take(base, u, bytes) take(base, u, bytes, al)
    r->emb_enc = take(base, &u, ne * C * f);
    r->emb_dec = take(base, &u, nd * C * f);
    bool any_shared = false;
    for (int l = 0; shared && l < m->L; l++)
        any_shared |= shared[l];
    t5_acts set = {0};
    for (int l = -1; l < m->L; l++) {
        /* l = -1: the shared set, when some layer uses it */
        if (l < 0 && !any_shared)
            continue;
        t5_acts *a = l < 0 ? &set : &r->acts[l];
        const bool dec = l < 0 || m->layers[l].decoder;
        const size_t n = l < 0 ? nmax : dec ? nd : ne;
        memset(a, 0, sizeof *a);
        if (l >= 0 && shared && shared[l]) {
            *a = set;
            a->out = take(base, &u, n * C * f);
            if (!dec) /* an encoder layer has no cross-attention parts */
                a->ln2 = a->cq = a->ckv = a->catty = a->res3 = NULL, a->rstd2 = a->clse = NULL;
            a->enc_out = NULL;
            a->final_rstd = NULL;
            if (m->layers[l].t[R_FINAL] >= 0) {
                a->enc_out = take(base, &u, ne * C * f);
                a->final_rstd = take(base, &u, ne * f4);
            }
            continue;
        }
        a->ln1 = take(base, &u, n * C * f);
        a->rstd1 = take(base, &u, n * f4);
        a->qkv = take(base, &u, n * 3 * I * f);
        a->atty = take(base, &u, n * I * f);
        a->lse = take(base, &u, n * NH * f4);
        a->res2 = take(base, &u, n * C * f);
        if (dec) {
            a->ln2 = take(base, &u, n * C * f);
            a->rstd2 = take(base, &u, n * f4);
            a->cq = take(base, &u, n * I * f);
            a->ckv = take(base, &u, ne * 2 * I * f);
            a->catty = take(base, &u, n * I * f);
            a->clse = take(base, &u, n * NH * f4);
            a->res3 = take(base, &u, n * C * f);
        }
        a->ln3 = take(base, &u, n * C * f);
        a->rstd3 = take(base, &u, n * f4);
        a->h = take(base, &u, n * UP * f);
        a->act = take(base, &u, n * F * f);
        if (l < 0) /* each layer has its own output */
            continue;
        a->out = take(base, &u, n * C * f);
        if (m->layers[l].t[R_FINAL] >= 0) {
            a->enc_out = take(base, &u, ne * C * f);
            a->final_rstd = take(base, &u, ne * f4);
        }
    }
    r->lnf = take(base, &u, nd * C * f);
    r->lnf_rstd = take(base, &u, nd * f4);
    r->logits = take(base, &u, nd * k->Vp * f);
    r->losses = take(base, &u, nd * f4);
    for (int s = 0; s < 2; s++) {
        r->bias[s] = take(base, &u, TB * f4);
        r->dbias[s] = take(base, &u, TB * f4);
    }
    r->dres = take(base, &u, nmax * C * f);
    r->dln = take(base, &u, nmax * C * f);
    r->datty = take(base, &u, nmax * I * f);
    r->dqkv = take(base, &u, nmax * 3 * I * f);
    r->dh = take(base, &u, nmax * UP * f);
    r->dact = take(base, &u, nmax * F * f);
    r->dcq = take(base, &u, nd * I * f);
    r->dckv = take(base, &u, ne * 2 * I * f);
    r->denc_part = take(base, &u, ne * C * f);
    r->denc = take(base, &u, ne * C * f);
    r->ddec_emb = take(base, &u, nd * C * f);
#undef take
    return u;
}

/* Makes room for ne encoder and nd decoder rows (nothing is kept across micro-batches but the bias copies'
 * room, which a new slab gives again). */
static void reserve(t5_model *m, size_t ne, size_t nd)
{
    t5_run *r = m->run;
    if (ne <= r->cap_e && nd <= r->cap_d)
        return;
    ne = ne > r->cap_e ? ne : r->cap_e;
    nd = nd > r->cap_d ? nd : r->cap_d;
    free(r->slab);
    const t5_carving k = {.e = sizeof(float), .Vp = (size_t)m->cfg.vocab_size, .align = 64};
    const size_t bytes = carve(m, r, NULL, ne, nd, &k, NULL);
    r->slab = zt_xmalloc(bytes);
    zt_advise_huge_pages(r->slab, bytes);
    ZT_ASSERT(carve(m, r, r->slab, ne, nd, &k, NULL) == bytes);
    r->cap_e = ne;
    r->cap_d = nd;
    /* the unfused compositions' scratch: a linear output of d_model columns before its residual */
    if (r->ops.ctx)
        zt__ops_cpu_free(&r->ops);
    zt__ops_cpu_init(&r->ops, ne > nd ? ne : nd, (size_t)m->cfg.d_model);
}

/* Element i of a buffer of the backend's type. */
#define EL(p, i) ((void *)((char *)(p) + (size_t)(i) * r->ops.esize))

/* Tensor idx in its block's buffer bp. */
static void *in_block(const t5_run *r, const void *bp, int idx)
{
    return EL(bp, r->woff[idx]);
}

/* The self-attention descriptor of layer l over its packed q | k | v rows. */
static zt_attention_desc self_desc(const t5_model *m, const t5_run *r, const t5_acts *a, bool dec)
{
    const int I = m->I, T = dec ? r->Td : r->Te;
    return (zt_attention_desc){
        .q = a->qkv, .k = EL(a->qkv, I), .v = EL(a->qkv, 2 * I), .q_stride = 3 * I, .k_stride = 3 * I,
        .v_stride = 3 * I, .out = a->atty, .out_stride = I, .lse = a->lse, .B = r->B, .Tq = T, .Tk = T,
        .NH = m->cfg.num_heads, .NKV = m->cfg.num_heads, .HS = m->cfg.d_kv, .scale = 1.0f, .causal = dec,
        .window = -1, .lens = !dec && r->padded ? r->lens_arg : NULL, .bias = ZT_ATTENTION_BIAS_T5,
        .bias_table = r->bias[dec], .num_buckets = m->cfg.num_buckets, .max_distance = m->cfg.max_distance,
        .bias_bidirectional = !dec};
}

/* The cross-attention descriptor of sequences b0 .. b0+nb-1 (all of them with nb = B and no padding). */
static zt_attention_desc cross_desc(const t5_model *m, const t5_run *r, const t5_acts *a, int b0, int nb)
{
    const int I = m->I;
    const size_t q0 = (size_t)b0 * r->Td, k0 = (size_t)b0 * r->Te;
    return (zt_attention_desc){
        .q = EL(a->cq, q0 * I), .k = EL(a->ckv, k0 * 2 * I), .v = EL(a->ckv, k0 * 2 * I + I), .q_stride = I,
        .k_stride = 2 * I, .v_stride = 2 * I, .out = EL(a->catty, q0 * I), .out_stride = I,
        .lse = a->clse + (size_t)b0 * m->cfg.num_heads * r->Td, .B = nb, .Tq = r->Td,
        .Tk = nb == r->B && !r->padded ? r->Te : r->enc_lens[b0], .NH = m->cfg.num_heads, .NKV = m->cfg.num_heads,
        .HS = m->cfg.d_kv, .scale = 1.0f, .causal = false, .window = -1, .bias = ZT_ATTENTION_BIAS_NONE};
}

/* Sequences per cross-attention call: all at once, or one by one where the encoder has padding (each call
 * sees its sequence's valid keys). */
static int cross_calls(const t5_run *r)
{
    return r->padded ? r->B : 1;
}

static void ff_forward(const t5_model *m, const t5_run *r, const void *bp, const t5_layer *ly, t5_acts *a,
                       const void *x, int N)
{
    const zt_ops *o = &r->ops;
    const int C = m->cfg.d_model, F = m->cfg.d_ff;
#define W(role) in_block(r, bp, ly->t[role])
    o->rmsnorm(o, a->ln3, a->rstd3, x, W(R_LN3), N, C, m->cfg.layer_norm_epsilon);
    o->linear(o, a->h, a->ln3, W(R_WI), NULL, N, C, m->UP);
    if (m->cfg.gated)
        o->geglu(o, a->act, a->h, N, F);
    else
        o->relu(o, a->act, a->h, (size_t)N * F);
    o->linear_residual(o, a->out, a->act, W(R_WO), NULL, x, N, F, C);
#undef W
}

/* Layer l's forward from x into its activations. */
static void layer_forward(const t5_model *m, t5_run *r, int l, const void *bp, const void *x)
{
    const zt_ops *o = &r->ops;
    const t5_layer *ly = &m->layers[l];
    t5_acts *a = &r->acts[l];
    const bool dec = ly->decoder;
    const int C = m->cfg.d_model, I = m->I, N = r->B * (dec ? r->Td : r->Te), Ne = r->B * r->Te;
    const float eps = m->cfg.layer_norm_epsilon;
#define W(role) in_block(r, bp, ly->t[role])
    if (ly->t[R_BIAS] >= 0) /* layer 0 of its stack: the table every layer of the stack reads */
        o->to_f32(o, r->bias[dec], W(R_BIAS), (size_t)m->cfg.num_buckets * m->cfg.num_heads);
    o->rmsnorm(o, a->ln1, a->rstd1, x, W(R_LN1), N, C, eps);
    o->linear(o, a->qkv, a->ln1, W(R_Q), NULL, N, C, 3 * I);
    const zt_attention_desc d = self_desc(m, r, a, dec);
    o->attention_desc(o, &d);
    o->linear_residual(o, a->res2, a->atty, W(R_O), NULL, x, N, I, C);
    const void *ff_in = a->res2;
    if (dec) {
        const void *e = r->acts[m->Le - 1].enc_out;
        o->rmsnorm(o, a->ln2, a->rstd2, a->res2, W(R_LN2), N, C, eps);
        o->linear(o, a->cq, a->ln2, W(R_CQ), NULL, N, C, I);
        o->linear(o, a->ckv, e, W(R_CK), NULL, Ne, C, 2 * I);
        const int calls = cross_calls(r), per = r->B / calls;
        for (int c = 0; c < calls; c++) {
            const zt_attention_desc cd = cross_desc(m, r, a, c * per, per);
            o->attention_desc(o, &cd);
        }
        o->linear_residual(o, a->res3, a->catty, W(R_CO), NULL, a->res2, N, I, C);
        ff_in = a->res3;
    }
    ff_forward(m, r, bp, ly, a, ff_in, N);
    if (ly->t[R_FINAL] >= 0)
        o->rmsnorm(o, a->enc_out, a->final_rstd, a->out, W(R_FINAL), N, C, eps);
#undef W
}

/* Layer l's backward: r->dres from d(out) to d(x); weight gradients into bg; the decoder's cross-attention
 * adds d(encoder output) into r->denc. */
static void layer_backward(const t5_model *m, t5_run *r, int l, const void *bp, void *bg, const void *x)
{
    const zt_ops *o = &r->ops;
    const t5_layer *ly = &m->layers[l];
    const t5_acts *a = &r->acts[l];
    const bool dec = ly->decoder;
    const int C = m->cfg.d_model, I = m->I, F = m->cfg.d_ff, N = r->B * (dec ? r->Td : r->Te), Ne = r->B * r->Te;
#define W(role) in_block(r, bp, ly->t[role])
#define G(role) in_block(r, bg, ly->t[role])
    /* MLP */
    const void *ff_in = dec ? a->res3 : a->res2;
    o->linear_backward(o, r->dact, G(R_WO), NULL, r->dres, a->act, W(R_WO), N, F, C);
    if (m->cfg.gated)
        o->geglu_backward(o, r->dh, a->h, r->dact, N, F);
    else
        o->relu_backward(o, r->dh, a->h, r->dact, (size_t)N * F);
    o->linear_backward(o, r->dln, G(R_WI), NULL, r->dh, a->ln3, W(R_WI), N, C, m->UP);
    o->rmsnorm_backward(o, r->dres, G(R_LN3), r->dln, ff_in, W(R_LN3), a->rstd3, N, C);
    if (dec) {
        /* cross-attention */
        const void *e = r->acts[m->Le - 1].enc_out;
        o->linear_backward(o, r->datty, G(R_CO), NULL, r->dres, a->catty, W(R_CO), N, I, C);
        o->zero(o, r->dcq, (size_t)N * I);
        o->zero(o, r->dckv, (size_t)Ne * 2 * I);
        const int calls = cross_calls(r), per = r->B / calls;
        for (int c = 0; c < calls; c++) {
            const zt_attention_desc cd = cross_desc(m, r, a, c * per, per);
            const size_t q0 = (size_t)c * per * r->Td, k0 = (size_t)c * per * r->Te;
            const zt_attention_grads g = {.dout = EL(r->datty, q0 * I), .dq = EL(r->dcq, q0 * I),
                                          .dk = EL(r->dckv, k0 * 2 * I), .dv = EL(r->dckv, k0 * 2 * I + I),
                                          .dq_stride = I, .dk_stride = 2 * I, .dv_stride = 2 * I,
                                          .accumulate = true};
            o->attention_desc_backward(o, &cd, &g);
        }
        o->linear_backward(o, r->dln, G(R_CQ), NULL, r->dcq, a->ln2, W(R_CQ), N, C, I);
        o->rmsnorm_backward(o, r->dres, G(R_LN2), r->dln, a->res2, W(R_LN2), a->rstd2, N, C);
        o->linear_backward(o, r->denc_part, G(R_CK), NULL, r->dckv, e, W(R_CK), Ne, C, 2 * I);
        o->add(o, r->denc, r->denc_part, (size_t)Ne * C);
    }
    /* self-attention */
    o->linear_backward(o, r->datty, G(R_O), NULL, r->dres, a->atty, W(R_O), N, I, C);
    o->zero(o, r->dqkv, (size_t)N * 3 * I);
    const zt_attention_desc d = self_desc(m, r, a, dec);
    const zt_attention_grads g = {.dout = r->datty, .dq = r->dqkv, .dk = EL(r->dqkv, I), .dv = EL(r->dqkv, 2 * I),
                                  .dq_stride = 3 * I, .dk_stride = 3 * I, .dv_stride = 3 * I,
                                  .dbias_table = r->dbias[dec], .accumulate = true};
    o->attention_desc_backward(o, &d, &g);
    o->linear_backward(o, r->dln, G(R_Q), NULL, r->dqkv, a->ln1, W(R_Q), N, C, 3 * I);
    o->rmsnorm_backward(o, r->dres, G(R_LN1), r->dln, x, W(R_LN1), a->rstd1, N, C);
    if (ly->t[R_BIAS] >= 0) /* the stack's last backward: its table's gradient from every layer */
        o->add_f32(o, G(R_BIAS), r->dbias[dec], (size_t)m->cfg.num_buckets * m->cfg.num_heads);
#undef W
#undef G
}

/* The residual stream entering layer l. */
static const void *layer_input(const t5_model *m, const t5_run *r, int l)
{
    if (l == 0)
        return r->emb_enc;
    if (l == m->Le)
        return r->emb_dec;
    return r->acts[l - 1].out;
}

static float decoder_scale(const t5_model *m)
{
    return m->cfg.scale_decoder_outputs ? 1.0f / sqrtf((float)m->cfg.d_model) : 1.0f;
}

static void t5_set_seq2seq(t5_model *m, const zt_model_seq2seq *s)
{
    t5_run *r = m->run;
    ZT_ASSERT(s && s->decoder_tokens && s->Td >= 1 && s->Td <= m->max_T);
    r->Td = s->Td;
    r->have_seq2seq = true;
    /* the tokens and lengths are copied at begin, when B is known: keep the caller's pointers until then */
    r->dec_tokens = (int32_t *)s->decoder_tokens;
    r->enc_lens = (int32_t *)s->encoder_lens;
}

static void t5_begin(void *mv, const int32_t *tokens, int B, int T, const int32_t *pos)
{
    t5_model *m = mv;
    ZT_ASSERT(pos == NULL); /* T5 does not pack (refused by the config) */
    t5_run *r = m->run;
    ZT_ASSERT(r->have_seq2seq); /* a T5 micro-batch needs its decoder side (set_seq2seq) first */
    ZT_ASSERT(B >= 1 && B <= m->max_B && T >= 1 && T <= m->max_T);
    const int32_t *dec = r->dec_tokens, *lens = r->enc_lens;
    const size_t ne = (size_t)B * T, nd = (size_t)B * r->Td;
    /* the caller's arrays, before the slab may move */
    int32_t *keep = zt_xmalloc((ne + nd + (size_t)B) * sizeof(int32_t));
    memcpy(keep, tokens, ne * sizeof(int32_t));
    memcpy(keep + ne, dec, nd * sizeof(int32_t));
    for (int b = 0; b < B; b++)
        keep[ne + nd + b] = lens ? (lens[b] < 1 ? 1 : lens[b] > T ? T : lens[b]) : T;
    reserve(m, ne, nd);
    free(r->enc_tokens);
    r->enc_tokens = keep;
    r->dec_tokens = keep + ne;
    r->enc_lens = keep + ne + nd;
    r->lens_arg = r->enc_lens;
    r->B = B;
    r->Te = T;
    r->padded = false;
    for (int b = 0; b < B; b++)
        r->padded |= r->enc_lens[b] < T;
    for (size_t i = 0; i < ne + nd; i++)
        ZT_ASSERT(keep[i] >= 0 && keep[i] < m->cfg.vocab_size);
    r->have_seq2seq = false;
    r->have_targets = false;
}

/* Block `block`'s forward (model.h's order) from the previous block's output, with its weights at bp. */
static void prog_forward_block(const t5_model *m, t5_run *r, int block, const void *bp)
{
    const zt_ops *o = &r->ops;
    ZT_ASSERT(block >= 0 && block <= m->L + 1);
    const int C = m->cfg.d_model;
    if (block == 0) {
        o->embedding(o, r->emb_enc, r->enc_tokens, in_block(r, bp, 0), NULL, r->B, r->Te, C);
        o->embedding(o, r->emb_dec, r->dec_tokens, in_block(r, bp, 0), NULL, r->B, r->Td, C);
        return;
    }
    if (block == m->L + 1) {
        const int N = r->B * r->Td;
        o->rmsnorm(o, r->lnf, r->lnf_rstd, r->acts[m->L - 1].out, in_block(r, bp, m->final_tensor), N, C,
                   m->cfg.layer_norm_epsilon);
        if (m->cfg.scale_decoder_outputs)
            o->scale(o, r->lnf, decoder_scale(m), (size_t)N * C);
        return;
    }
    const int l = block - 1;
    layer_forward(m, r, l, bp, layer_input(m, r, l));
}

/* After the head's backward has left d(lnf) in r->dln: the rescale's backward, and the sums that the decoder
 * layers (the encoder output's gradient) and each stack's layers (its bias table's) add into, zeroed. */
static void prog_head_backward_done(const t5_model *m, t5_run *r)
{
    const zt_ops *o = &r->ops;
    const size_t TB = (size_t)m->cfg.num_buckets * m->cfg.num_heads;
    if (m->cfg.scale_decoder_outputs)
        o->scale(o, r->dln, decoder_scale(m), (size_t)r->B * r->Td * m->cfg.d_model);
    o->zero(o, r->denc, (size_t)r->B * r->Te * m->cfg.d_model);
    o->zero_f32(o, r->dbias[0], TB);
    o->zero_f32(o, r->dbias[1], TB);
}

/* Block `block`'s backward: r->dres from d(its output) to d(its input); weight gradients added into bg. */
static void prog_backward_block(const t5_model *m, t5_run *r, int block, const void *bp, void *bg)
{
    const zt_ops *o = &r->ops;
    ZT_ASSERT(block >= 0 && block <= m->L + 1);
    const int C = m->cfg.d_model, Nd = r->B * r->Td, Ne = r->B * r->Te;
    if (block == m->L + 1) {
        o->zero(o, r->dres, (size_t)Nd * C);
        o->rmsnorm_backward(o, r->dres, in_block(r, bg, m->final_tensor), r->dln, r->acts[m->L - 1].out,
                            in_block(r, bp, m->final_tensor), r->lnf_rstd, Nd, C);
        return;
    }
    if (block == 0) {
        o->embedding_backward(o, in_block(r, bg, 0), NULL, r->dres, r->enc_tokens, r->B, r->Te, C,
                              m->cfg.vocab_size);
        o->embedding_backward(o, in_block(r, bg, 0), NULL, r->ddec_emb, r->dec_tokens, r->B, r->Td, C,
                              m->cfg.vocab_size);
        return;
    }
    const int l = block - 1;
    const t5_layer *ly = &m->layers[l];
    if (ly->t[R_FINAL] >= 0) {
        /* the encoder's top: dres holds d(decoder embedding), kept for block 0; the encoder output's gradient
         * is complete (every decoder layer added its part) */
        o->copy(o, r->ddec_emb, r->dres, (size_t)Nd * C);
        o->zero(o, r->dres, (size_t)Ne * C);
        o->rmsnorm_backward(o, r->dres, in_block(r, bg, ly->t[R_FINAL]), r->denc, r->acts[l].out,
                            in_block(r, bp, ly->t[R_FINAL]), r->acts[l].final_rstd, Ne, C);
    }
    layer_backward(m, r, l, bp, bg, layer_input(m, r, l));
}

/* ---- the CPU runner: the program with the CPU binding, the head on the CPU kernels ---- */

static void t5_forward_block(void *mv, int block, const float *bp)
{
    t5_model *m = mv;
    prog_forward_block(m, m->run, block, bp);
}

static float t5_forward_head(void *mv, const float *hp, const int32_t *targets)
{
    t5_model *m = mv;
    t5_run *r = m->run;
    const int N = r->B * r->Td, C = m->cfg.d_model, V = m->cfg.vocab_size;
    zt_cpu_matmul_forward(r->logits, r->lnf, in_block(r, hp, m->head_tensor), NULL, N, C, V);
    if (!targets)
        return 0.0f;
    /* targets [B,Te]: row b's first Td are the decoder positions' */
    ZT_ASSERT(r->Td <= r->Te);
    r->targets = zt_xrealloc(r->targets, (size_t)N * sizeof(int32_t));
    for (int b = 0; b < r->B; b++)
        for (int j = 0; j < r->Td; j++) {
            const int32_t y = targets[(size_t)b * r->Te + j];
            ZT_ASSERT(y == IGNORE_INDEX || (y >= 0 && y < V));
            r->targets[(size_t)b * r->Td + j] = y;
        }
    r->n_valid = zt_cpu_crossentropy_forward_backward(r->losses, NULL, r->logits, r->targets, N, V, IGNORE_INDEX,
                                                      0.0f);
    r->have_targets = true;
    if (r->n_valid == 0)
        return 0.0f;
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += r->losses[i];
    return (float)(sum / r->n_valid);
}

static void t5_backward_head(void *mv, const float *hp, float *hg, float loss_scale)
{
    t5_model *m = mv;
    t5_run *r = m->run;
    ZT_ASSERT(r->have_targets); /* backward needs a forward with targets, once */
    r->have_targets = false;
    r->backward_skip = r->n_valid == 0;
    if (r->backward_skip)
        return;
    const int N = r->B * r->Td, C = m->cfg.d_model, V = m->cfg.vocab_size;
    zt_cpu_crossentropy_forward_backward(r->losses, r->logits, r->logits, r->targets, N, V, IGNORE_INDEX,
                                         loss_scale / (float)r->n_valid);
    memset(r->dln, 0, (size_t)N * C * sizeof(float));
    zt_cpu_matmul_backward(r->dln, in_block(r, hg, m->head_tensor), NULL, r->logits, r->lnf,
                           in_block(r, hp, m->head_tensor), N, C, V);
    prog_head_backward_done(m, r);
}

static void t5_backward_block(void *mv, int block, const float *bp, float *bg)
{
    t5_model *m = mv;
    if (!m->run->backward_skip)
        prog_backward_block(m, m->run, block, bp, bg);
}

/* Fills a layer's intermediates with NaN (its output and the encoder output stay): a rebuild recomputes them. */
static void t5_discard_block(void *mv, int block)
{
    t5_model *m = mv;
    if (block < 1 || block > m->L)
        return;
    t5_run *r = m->run;
    t5_acts *a = &r->acts[block - 1];
    const bool dec = m->layers[block - 1].decoder;
    const size_t N = (size_t)r->B * (dec ? r->Td : r->Te), C = (size_t)m->cfg.d_model, I = (size_t)m->I;
    const struct {
        void *p;
        size_t n;
    } parts[] = {{a->ln1, N * C}, {a->qkv, N * 3 * I}, {a->atty, N * I}, {a->ln3, N * C},
                 {a->h, N * (size_t)m->UP}, {a->act, N * (size_t)m->cfg.d_ff}, {a->cq, dec ? N * I : 0},
                 {a->catty, dec ? N * I : 0}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        for (size_t i = 0; i < parts[k].n; i++)
            ((float *)parts[k].p)[i] = NAN;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Creation                                                                                             */
/* ---------------------------------------------------------------------------------------------------- */

static void t5_destroy(void *mv)
{
    t5_model *m = mv;
    if (!m)
        return;
    if (m->run) {
        if (m->run->ops.ctx)
            zt__ops_cpu_free(&m->run->ops);
        free(m->run->slab);
        free(m->run->acts);
        free(m->run->woff_host);
        free(m->run->enc_tokens);
        free(m->run->targets);
        free(m->run);
    }
    free(m->layers);
    free(m);
}

/* The config's derived sizes in m (the rest zero). */
static void shape_of(t5_model *m, const zt_t5_config *cfg)
{
    *m = (t5_model){.cfg = *cfg, .Le = cfg->num_layers, .Ld = cfg->num_decoder_layers,
                    .L = cfg->num_layers + cfg->num_decoder_layers, .I = cfg->num_heads * cfg->d_kv,
                    .UP = cfg->gated ? 2 * cfg->d_ff : cfg->d_ff};
}

static int head_block(const void *cv)
{
    const zt_t5_config *c = cv;
    return c->tie_word_embeddings ? 0 : c->num_layers + c->num_decoder_layers + 1;
}

/* Relative positions have no limit: only the widest activation row bounds B x T. */
static int check_batch(const void *cv, int B, int T, zt_err *err)
{
    const zt_t5_config *cfg = cv;
    if ((int64_t)B * T * (cfg->vocab_size > 2 * cfg->d_ff ? cfg->vocab_size : 2 * cfg->d_ff) > (int64_t)1 << 50)
        return zt_fail(err, ZT_EINVAL_CONFIG, "batch size %d x sequence length %d is too large for this model", B, T);
    return 0;
}

/* The state of host model hm: the layers' roles over its tables, and with acts the CPU runner. */
static int t5_state_create(void **out, const void *hm, bool acts, zt_err *err)
{
    (void)err; /* allocations abort (zt_xcalloc) */
    t5_model *m = zt_xcalloc(1, sizeof *m);
    shape_of(m, zt__hm_config(hm));
    m->layers = zt_xcalloc((size_t)m->L, sizeof *m->layers);
    for (int l = 0; l < m->L; l++) { /* each layer's tensors by role */
        m->layers[l].decoder = l >= m->Le;
        m->layers[l].first = l >= m->Le ? m->Le : 0;
        zt__tt_block_roles(&table, &m->cfg, 1 + l, m->layers[l].t, R_COUNT);
    }
    m->num_tensors = zt__hm_num_tensors(hm);
    m->num_params = zt__hm_num_params(hm);
    m->num_blocks = zt__hm_num_blocks(hm);
    m->tensors = zt__hm_tensor(hm, 0);
    m->blocks = zt__hm_block(hm, 0);
    m->max_B = zt__hm_max_batch(hm);
    m->max_T = zt__hm_max_seq(hm);
    m->head_block = zt__hm_head_block(hm);
    m->head_tensor = m->cfg.tie_word_embeddings ? 0 : m->num_tensors - 1;
    m->final_tensor = zt__host_find_tensor(m->tensors, m->num_tensors, "decoder.final_layer_norm.weight");
    if (acts) {
        m->run = zt_xcalloc(1, sizeof *m->run);
        m->run->acts = zt_xcalloc((size_t)m->L, sizeof *m->run->acts);
        m->run->woff_host = zt_xcalloc((size_t)m->num_tensors, sizeof(size_t));
        for (int i = 0; i < m->num_tensors; i++)
            m->run->woff_host[i] = m->tensors[i].offset - m->blocks[m->tensors[i].block].offset;
        m->run->woff = m->run->woff_host;
    }
    *out = m;
    return 0;
}

static const float *t5_logits(const void *mv)
{
    return ((const t5_model *)mv)->run->logits;
}

static const zt__hm_passes passes = {.create = t5_state_create, .destroy = t5_destroy, .forward_begin = t5_begin,
                                     .forward_block = t5_forward_block, .forward_head = t5_forward_head,
                                     .backward_head = t5_backward_head, .backward_block = t5_backward_block,
                                     .discard_block = t5_discard_block, .logits = t5_logits};

/* ---------------------------------------------------------------------------------------------------- */
/* Whole passes                                                                                         */
/* ---------------------------------------------------------------------------------------------------- */

float zt_t5_forward(zt_t5 *m, const int32_t *enc_tokens, int B, int T, const zt_model_seq2seq *s,
                    const int32_t *targets)
{
    t5_set_seq2seq(zt__hm_state(m), s);
    zt__hm_forward_begin(m, enc_tokens, B, T, NULL);
    return zt__hm_forward_rest(m, targets);
}

void zt_t5_backward(zt_t5 *m, float loss_scale)
{
    zt__hm_backward(m, loss_scale);
}

const float *zt_t5_logits(const zt_t5 *m)
{
    return zt__hm_logits(m);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Hugging Face names and the family definition                                                         */
/* ---------------------------------------------------------------------------------------------------- */

static void hf_describe(const void *m, char *out, size_t cap)
{
    const zt_t5_config *c = zt__hm_config(m);
    snprintf(out, cap, "a T5 with %d encoder and %d decoder layers and %s head (tie_word_embeddings %s)",
             c->num_layers, c->num_decoder_layers, c->tie_word_embeddings ? "a tied" : "an untied",
             c->tie_word_embeddings ? "true" : "false");
}

static const zt_hf_names hf_names = {
    .export_name = zt__tt_hf_export_name,
    .map = zt__tt_hf_map,
    .describe = hf_describe,
    .tied_fix = "tie_word_embeddings is true; set it to false to import an untied lm_head",
    .head_optional = false,
};

static void f_config_default(void *c, const char *model_type)
{
    zt_t5_config_default(c);
    ((zt_t5_config *)c)->mt5 = model_type && strcmp(model_type, "mt5") == 0;
}

#define F(name, kind, hash_only) {#name, offsetof(zt_t5_config, name), ZT__HM_##kind, hash_only}
static const zt__hm_field fields[] = {
    F(mt5, BOOL, false), F(vocab_size, INT, false), F(d_model, INT, false), F(d_kv, INT, false),
    F(d_ff, INT, false), F(num_layers, INT, false), F(num_decoder_layers, INT, false), F(num_heads, INT, false),
    F(num_buckets, INT, false), F(max_distance, INT, false), F(layer_norm_epsilon, FLOAT, false),
    F(gated, BOOL, false), F(tie_word_embeddings, BOOL, false), F(scale_decoder_outputs, BOOL, false),
    F(n_positions, INT, false), F(pad_token_id, INT, false), F(eos_token_id, INT, false),
    F(decoder_start_token_id, INT, false), F(initializer_factor, DOUBLE, true), F(dropout_rate, DOUBLE, true),
};
#undef F

static void f_config_describe(const void *cv, char *buf, size_t cap)
{
    const zt_t5_config *c = cv;
    snprintf(buf, cap, "%s, %d + %d layers x %d wide, %d heads of %d, MLP %d (%s), vocab %d, %d buckets%s",
             c->mt5 ? "mT5" : "T5", c->num_layers, c->num_decoder_layers, c->d_model, c->num_heads, c->d_kv, c->d_ff,
             c->gated ? "gated-gelu" : "relu", c->vocab_size, c->num_buckets,
             c->tie_word_embeddings ? ", tied head" : "");
}

static void f_config_shape(const void *cv, zt_family_shape *s)
{
    const zt_t5_config *c = cv;
    *s = (zt_family_shape){.layers = c->num_layers + c->num_decoder_layers, .positions = c->n_positions,
                           .vocab = c->vocab_size, .width = c->d_model, .heads = c->num_heads,
                           .num_params = zt__tt_num_params(&table, c), .task = ZT_TASK_SEQ2SEQ,
                           .pad_token_id = c->pad_token_id, .decoder_start_token_id = c->decoder_start_token_id,
                           .eos_token_id = c->eos_token_id, .n_eos = c->eos_token_id >= 0,
                           .eos_ids = {c->eos_token_id}};
}

extern const zt_family_def zt__family_t5;

static const zt__hm_spec spec = {.def = &zt__family_t5, .config_size = sizeof(zt_t5_config),
                                 .table = &table, .passes = &passes, .head_block = head_block, .check_batch = check_batch};

static void f_set_seq2seq(void *m, const zt_model_seq2seq *s) { t5_set_seq2seq(zt__hm_state(m), s); }

#ifdef ZT_WITH_CUDA
/* ---------------------------------------------------------------------------------------------------- */
/* The CUDA executor: the same program with the CUDA binding                                            */
/* ---------------------------------------------------------------------------------------------------- */

/* Device layout: the host table's tensors in order, each on a 64-element boundary unless it continues a packed
 * weight (k and v after q, k' and v' after k', wi_1 after wi_0); the shared embedding and an untied lm_head
 * padded to a vocabulary of a multiple of 128 rows. A layer that is not checkpointed keeps its activations; the
 * checkpointed ones share one set and keep their output only, and the engine's rebuild reruns their forward
 * before their backward (the last one to write the set skips it). Buffers are carved from one
 * pool for micro-batches of up to max_B x max_T encoder and decoder tokens; nothing is allocated in a step. */
typedef struct t5_cuda {
    zt_model base;              /* first member: a zt_model * is a t5_cuda * */
    const t5_model *m;             /* the host model's tables (borrowed) */
    t5_run r;                   /* the program's state: device buffers, the CUDA binding */
    enum zt_dtype dtype;
    int max_B, max_T, max_micro, Vp;
    zt__cuda_layout lay;
    zt__cuda_state cs;
    size_t *woff;               /* [ntensors] */
    int32_t *d_lens, *d_targets;
    void *attn_scratch, *emb_scratch, *norm_scratch;
    int *d_flag;
    int32_t *h_lens, *h_dec, *h_tgt; /* host copies of the micro-batch's lengths, decoder tokens, targets */
    const int32_t *pend_dec, *pend_lens; /* set_seq2seq's, until begin */
    int pend_Td;
    bool have_seq2seq;
    int n_valid[ZT__CUDA_MAX_MICRO], n_rows[ZT__CUDA_MAX_MICRO];
    int micro;
} t5_cuda;

static const zt_model_ops t5_cuda_ops;

/* The largest attention calls of a micro-batch, for the backward's scratch. */
static size_t cuda_attn_scratch(const t5_model *m, int B, int T)
{
    const zt_attention_desc self = {.B = B, .Tq = T, .Tk = T, .NH = m->cfg.num_heads, .NKV = m->cfg.num_heads,
                                    .HS = m->cfg.d_kv, .scale = 1.0f, .window = -1, .bias = ZT_ATTENTION_BIAS_T5,
                                    .num_buckets = m->cfg.num_buckets, .max_distance = m->cfg.max_distance};
    zt_attention_desc cross = self;
    cross.bias = ZT_ATTENTION_BIAS_NONE;
    const size_t a = zt_cuda_attention_bwd_scratch_size(&self), b = zt_cuda_attention_bwd_scratch_size(&cross);
    return a > b ? a : b;
}

static size_t cuda_carve(t5_cuda *g, char *base, size_t plan[2])
{
    const size_t N = (size_t)g->max_B * g->max_T, al = ZT__CUDA_POOL_ALIGN;
    const t5_carving k = {.e = zt_dtype_size(g->dtype), .Vp = (size_t)g->Vp, .align = al};
    size_t used = carve(g->m, &g->r, base, N, N, &k, g->lay.block_ckpt + 1);
    used = (used + al - 1) / al * al;
    if (plan)
        plan[0] = used;
    const size_t mark = used;
    g->r.enc_tokens = take(base, &used, N * 4, al);
    g->r.dec_tokens = take(base, &used, N * 4, al);
    g->d_targets = take(base, &used, N * 4, al);
    g->d_lens = take(base, &used, (size_t)g->max_B * 4, al);
    g->attn_scratch = take(base, &used, cuda_attn_scratch(g->m, g->max_B, g->max_T), al);
    g->emb_scratch = take(base, &used, zt_cuda_embedding_backward_scratch_size(g->max_B, g->max_T, g->m->cfg.vocab_size),
                          al);
    g->norm_scratch = take(base, &used, zt_cuda_rmsnorm_backward_scratch_size((int)N, g->m->cfg.d_model), al);
    g->d_flag = take(base, &used, 4, al);
    if (plan)
        plan[1] = used - mark;
    return used;
}

static t5_cuda *cuda_new_shape(const t5_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                               const bool *ckpt_layers)
{
    t5_cuda *g = zt_xcalloc(1, sizeof *g);
    g->m = m;
    g->dtype = dtype;
    g->max_B = B;
    g->max_T = T;
    g->max_micro = max_micro;
    g->Vp = (int)zt__round_up((size_t)m->cfg.vocab_size, ZT__CUDA_VOCAB_PAD);
    g->r.acts = zt_xcalloc((size_t)m->L, sizeof *g->r.acts);
    g->r.ops.esize = zt_dtype_size(dtype); /* for carving; the binding is set at creation */
    zt__cuda_layout_init(&g->lay, m->tensors, m->num_tensors, m->num_blocks);
    const size_t C = (size_t)m->cfg.d_model;
    g->lay.tlen[0] = (size_t)g->Vp * C;
    g->lay.tlen[m->head_tensor] = (size_t)g->Vp * C;
    for (int l = 0; l < m->L; l++) {
        const t5_layer *ly = &m->layers[l];
        g->lay.packed[ly->t[R_Q] + 1] = g->lay.packed[ly->t[R_Q] + 2] = true;
        if (ly->decoder)
            g->lay.packed[ly->t[R_CK] + 1] = true;
        if (m->cfg.gated)
            g->lay.packed[ly->t[R_WI] + 1] = true;
    }
    zt__cuda_layout_finish(&g->lay, m->tensors, m->L, ckpt_layers, false);
    g->woff = zt_xcalloc((size_t)m->num_tensors, sizeof *g->woff);
    for (int i = 0; i < m->num_tensors; i++)
        g->woff[i] = g->lay.toff[i] - g->lay.boff[m->tensors[i].block];
    g->r.woff = g->woff;
    g->h_lens = zt_xcalloc((size_t)B, sizeof(int32_t));
    g->h_dec = zt_xcalloc((size_t)B * T, sizeof(int32_t));
    g->h_tgt = zt_xcalloc((size_t)B * T, sizeof(int32_t));
    g->base.ops = &t5_cuda_ops;
    zt__cuda_layout_describe(&g->base, &g->lay, dtype, m->head_block, m->num_params, B, T, max_micro);
    return g;
}

static void t5_cuda_destroy(zt_model *base)
{
    t5_cuda *g = (t5_cuda *)base;
    if (!g)
        return;
    if (g->cs.stream)
        ZT_CUDA_CHECK(cudaStreamSynchronize(g->cs.stream));
    if (g->r.ops.ctx)
        zt__ops_cuda_free(&g->r.ops);
    zt__cuda_state_close(&g->cs);
    zt__cuda_layout_free(&g->lay);
    free(g->r.acts);
    free(g->woff);
    free(g->h_lens);
    free(g->h_dec);
    free(g->h_tgt);
    free(g);
}

/* Whether the kernels serve the model; 0 or ZT_EUNSUPPORTED with the fix. */
static int cuda_check_shape(const t5_model *m, int max_micro, enum zt_dtype dtype, zt_err *err)
{
    const zt_t5_config *c = &m->cfg;
    if (dtype != ZT_DTYPE_F32 && dtype != ZT_DTYPE_BF16 && dtype != ZT_DTYPE_F16)
        return zt_fail(err, ZT_EUNSUPPORTED, "the CUDA model computes in fp32, bf16 or fp16 only");
    /* the shape of the encoder's (bidirectional) and the decoder's (causal) self-attention; the check reads
     * the pointers only for being given */
    static float given[1];
    const long w = (long)c->num_heads * c->d_kv;
    bool served = true;
    for (int bidir = 0; bidir < 2; bidir++) {
        const zt_attention_desc d = {.q = given, .k = given, .v = given, .out = given, .lse = given,
                                     .q_stride = w, .k_stride = w, .v_stride = w, .out_stride = w, .B = 1,
                                     .Tq = 1, .Tk = 1, .NH = c->num_heads, .NKV = c->num_heads, .HS = c->d_kv,
                                     .scale = 1.0f, .window = -1, .bias = ZT_ATTENTION_BIAS_T5, .bias_table = given,
                                     .num_buckets = c->num_buckets, .max_distance = c->max_distance,
                                     .bias_bidirectional = bidir == 1};
        served = served && zt_cuda_attention_desc_supported(&d, dtype);
    }
    if (!served)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA attention serves heads of up to 256 channels and up to %d buckets; this T5 has d_kv "
                       "%d and %d buckets (train with --device cpu)", ZT_ATTENTION_MAX_BUCKETS, c->d_kv,
                       c->num_buckets);
    if (c->d_model % 8 != 0 || m->I % 8 != 0 || c->d_ff % 8 != 0)
        return zt_fail(err, ZT_EUNSUPPORTED,
                       "the CUDA kernels need d_model, num_heads x d_kv and d_ff to be multiples of 8 (they are %d, %d "
                       "and %d); choose sizes that are, or train with --device cpu (which takes any size)",
                       c->d_model, m->I, c->d_ff);
    if (max_micro < 1 || max_micro > ZT__CUDA_MAX_MICRO)
        return zt_fail(err, ZT_EINVAL_CONFIG, "grad_accum %d is out of range for the CUDA trainer (1..%d)",
                       max_micro, ZT__CUDA_MAX_MICRO);
    return 0;
}

static zt_model *t5_cuda_shape(const t5_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                               const bool *ckpt_layers)
{
    t5_cuda *g = cuda_new_shape(m, B, T, max_micro, dtype, ckpt_layers);
    g->base.device_bytes = cuda_carve(g, NULL, NULL);
    return &g->base;
}

static int t5_cuda_create(zt_model **out, const t5_model *m, int B, int T, int max_micro, enum zt_dtype dtype,
                          const bool *ckpt_layers, zt_err *err)
{
    *out = NULL;
    int rc = cuda_check_shape(m, max_micro, dtype, err);
    if (rc < 0)
        return rc;
    t5_cuda *g = cuda_new_shape(m, B, T, max_micro, dtype, ckpt_layers);
    size_t plan[2];
    const size_t pool_bytes = cuda_carve(g, NULL, plan), N = (size_t)B * T;
    if ((rc = zt__cuda_state_open(&g->cs, pool_bytes, plan, 2 * N, (size_t)max_micro * N, dtype, B, T, err)) < 0) {
        t5_cuda_destroy(&g->base);
        return rc;
    }
    ZT_ASSERT(cuda_carve(g, g->cs.pool, NULL) == pool_bytes);
    const zt__ops_cuda_res res = {.stream = g->cs.stream, .blas = g->cs.blas, .norm_scratch = g->norm_scratch,
                                  .attn_scratch = g->attn_scratch, .emb_scratch = g->emb_scratch,
                                  .attn_scratch_bytes = cuda_attn_scratch(m, B, T)};
    zt__ops_cuda_init(&g->r.ops, &res, dtype);
    g->base.stream = g->cs.stream;
    g->base.nonfinite_flag = g->d_flag;
    g->base.device_bytes = pool_bytes;
    *out = &g->base;
    return 0;
}

static void t5_cuda_set_seq2seq(zt_model *base, const zt_model_seq2seq *s)
{
    t5_cuda *g = (t5_cuda *)base;
    ZT_ASSERT(s && s->decoder_tokens && s->Td >= 1 && s->Td <= g->max_T);
    g->pend_dec = s->decoder_tokens;
    g->pend_lens = s->encoder_lens;
    g->pend_Td = s->Td;
    g->have_seq2seq = true;
}

static void t5_cuda_begin(zt_model *base, const int32_t *tokens, const int32_t *targets, int B, int T, int micro,
                          const zt_model_docs *docs)
{
    ZT_ASSERT(docs == NULL); /* T5 does not pack (refused by the config) */
    t5_cuda *g = (t5_cuda *)base;
    t5_run *r = &g->r;
    ZT_ASSERT(g->have_seq2seq); /* a T5 micro-batch needs its decoder side (set_seq2seq) first */
    ZT_ASSERT(B >= 1 && B <= g->max_B && T >= 1 && T <= g->max_T && g->pend_Td <= T);
    ZT_ASSERT(micro >= 0 && micro < g->max_micro);
    const int Td = g->pend_Td, V = g->m->cfg.vocab_size;
    if (micro == 0)
        ZT_CUDA_CHECK(cudaMemsetAsync(g->d_flag, 0, sizeof(int), g->cs.stream));
    r->padded = false;
    for (int b = 0; b < B; b++) {
        const int32_t n = g->pend_lens ? g->pend_lens[b] : T;
        g->h_lens[b] = n < 1 ? 1 : n > T ? T : n;
        r->padded |= g->h_lens[b] < T;
        for (int j = 0; j < Td; j++) {
            g->h_dec[(size_t)b * Td + j] = g->pend_dec[(size_t)b * Td + j];
            g->h_tgt[(size_t)b * Td + j] = targets ? targets[(size_t)b * T + j] : -1;
        }
    }
    for (size_t i = 0; i < (size_t)B * T; i++)
        ZT_ASSERT(tokens[i] >= 0 && tokens[i] < V);
    /* from pageable memory: each copy returns once it has read the host array, which may then change */
    ZT_CUDA_CHECK(cudaMemcpyAsync(r->enc_tokens, tokens, (size_t)B * T * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  g->cs.stream));
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->d_lens, g->h_lens, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  g->cs.stream));
    g->n_valid[micro] = zt__cuda_stage_lm(&g->cs, micro & 1, g->h_dec, g->h_tgt, B, Td, V, r->dec_tokens,
                                          g->d_targets);
    g->n_rows[micro] = B * Td;
    r->enc_lens = g->h_lens;
    r->lens_arg = g->d_lens;
    r->B = B;
    r->Te = T;
    r->Td = Td;
    g->micro = micro;
    g->have_seq2seq = false;
    zt__cuda_passes_begin(&g->lay);
}

static void t5_cuda_forward(zt_model *base, int b, const void *w)
{
    t5_cuda *g = (t5_cuda *)base;
    /* a rebuild of the checkpointed layer that wrote the shared set last finds its intermediates there */
    if (b >= 1 && b <= g->m->L && zt__cuda_pass_of(&g->lay, b) == ZT__CUDA_PASS_KEPT)
        return;
    prog_forward_block(g->m, &g->r, b, w);
}

/* Checkpointed layers write into the set they share: nothing to free, but the next forward is a rebuild. */
static void t5_cuda_discard(zt_model *base, int b)
{
    zt__cuda_pass_discard(&((t5_cuda *)base)->lay, b);
}

/* The head (logits over Vp padded rows) and the fused classifier: the losses and, in training, the logits'
 * gradient in place. */
static void t5_cuda_head(zt_model *base, const void *w, float scale)
{
    t5_cuda *g = (t5_cuda *)base;
    t5_run *r = &g->r;
    const int N = r->B * r->Td, valid = g->n_valid[g->micro], C = g->m->cfg.d_model;
    const bool train = scale != 0.0f;
    const float grad_scale = valid > 0 ? scale / (float)valid : 0.0f;
    r->ops.linear(&r->ops, r->logits, r->lnf, in_block(r, w, g->m->head_tensor), NULL, N, C, g->Vp);
    zt_cuda_crossentropy_forward_backward(r->losses, train ? r->logits : NULL, r->logits, g->d_targets, N,
                                          g->m->cfg.vocab_size, g->Vp, -1, grad_scale, NULL, g->dtype, g->cs.stream);
    if (train)
        zt_cuda_check_finite(g->d_flag, r->losses, (size_t)N, ZT_DTYPE_F32, g->cs.stream);
    ZT_CUDA_CHECK(cudaMemcpyAsync(g->cs.h_losses + (size_t)g->micro * g->max_B * g->max_T, r->losses,
                                  (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, g->cs.stream));
}

static void t5_cuda_head_backward(zt_model *base, const void *w, void *gr)
{
    t5_cuda *g = (t5_cuda *)base;
    t5_run *r = &g->r;
    const int N = r->B * r->Td, C = g->m->cfg.d_model;
    r->ops.linear_backward(&r->ops, r->dln, in_block(r, gr, g->m->head_tensor), NULL, r->logits, r->lnf,
                           in_block(r, w, g->m->head_tensor), N, C, g->Vp);
    prog_head_backward_done(g->m, r);
}

static void t5_cuda_backward(zt_model *base, int b, const void *w, void *gr)
{
    t5_cuda *g = (t5_cuda *)base;
    ZT_ASSERT(zt__cuda_pass_backward_ready(&g->lay, b)); /* a checkpointed block was rebuilt first */
    prog_backward_block(g->m, &g->r, b, w, gr);
}

static float t5_cuda_loss(const zt_model *base, int micro)
{
    const t5_cuda *g = (const t5_cuda *)base;
    return zt__mean_loss(g->cs.h_losses + (size_t)micro * g->max_B * g->max_T, (size_t)g->n_rows[micro],
                         g->n_valid[micro]);
}

static void t5_cuda_logits(zt_model *base, float *out)
{
    t5_cuda *g = (t5_cuda *)base;
    zt__cuda_rows_to_f32(out, g->r.logits, (size_t)g->r.B * g->r.Td, (size_t)g->m->cfg.vocab_size, (size_t)g->Vp,
                         g->dtype, g->cs.stream);
}

static void t5_cuda_set_profiling(zt_model *base, bool on)
{
    zt__ops_cuda_set_profiling(&((t5_cuda *)base)->r.ops, on);
}

static void t5_cuda_profile_report(zt_model *base)
{
    zt__ops_cuda_profile_report(&((t5_cuda *)base)->r.ops);
}

static const zt_model_ops t5_cuda_ops = {
    .destroy = t5_cuda_destroy,
    .begin = t5_cuda_begin,
    .forward = t5_cuda_forward,
    .discard = t5_cuda_discard,
    .head = t5_cuda_head,
    .head_backward = t5_cuda_head_backward,
    .backward = t5_cuda_backward,
    .loss = t5_cuda_loss,
    .set_seq2seq = t5_cuda_set_seq2seq,
    .logits = t5_cuda_logits,
    .set_profiling = t5_cuda_set_profiling,
    .profile_report = t5_cuda_profile_report,
};

static int f_cuda_create(zt_model **out, const void *m, int B, int T, int max_micro, enum zt_dtype dtype,
                         const bool *ckpt_layers, zt_err *err)
{
    return t5_cuda_create(out, zt__hm_state(m), B, T, max_micro, dtype, ckpt_layers, err);
}

static zt_model *f_cuda_shape(const void *m, int B, int T, int max_micro, enum zt_dtype dtype, const bool *ckpt)
{
    return t5_cuda_shape(zt__hm_state(m), B, T, max_micro, dtype, ckpt);
}
#endif /* ZT_WITH_CUDA */


const zt_family_def zt__family_t5 = {
    .name = "t5",
    .model_types = model_types,
    .config_default = f_config_default,
    .io = &io,
    ZT__HM_FIELD_ENTRIES(fields, 5)
    .config_describe = f_config_describe,
    .config_shape = f_config_shape,
    .host = &spec,
    .hf = &hf_names,
    ZT__HM_HOST_ENTRIES
    .embedding_reads_weights = false,
    .set_seq2seq = f_set_seq2seq,
#ifdef ZT_WITH_CUDA
    .cuda_create = f_cuda_create,
    .cuda_shape = f_cuda_shape,
#endif
};
