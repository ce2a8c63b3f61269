/* A family's tensors as data: one row per tensor of the embeddings block, of every layer and of the final
 * block, in slab order, each with its Hugging Face name, its shape in symbols the config gives values to, when
 * it exists, how transformers initialises it, its role in the layer program (decoder.h, encoder.h) and the
 * dimension along which tensor parallelism splits it. Written once from such a table: the tensor table and
 * blocks of a config (params.h), its parameter count without allocating, the initialisation, the program's
 * roles, and how the tensors meet Hugging Face files (host_io.h's zt_hf_names). neox.c is the example.
 *
 * A layer row's name follows the layer's prefix ("layers.%d."; a second stack's has its own); layer rows, and rows marked body,
 * follow the config's body prefix too (BERT's "bert." or "roberta."; empty for the decoders). In the files a
 * tensor's name is the table's after the table's Hugging Face prefix ("model."), except rows marked bare_in_hf
 * (an untied lm_head.weight). Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_TENSOR_TABLE_H
#define ZT_WORKER_MODELS_TENSOR_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rng.h" /* zt_rng */
#include "worker/models/host_io.h"
#include "worker/models/params.h"

/* The parts of the slab, in block order: the embeddings (block 0), every layer of the first stack (blocks 1..L),
 * every layer of a second stack (an encoder-decoder's decoder: blocks L+1..L+L2), the final block (L+L2+1). */
enum zt__tt_part { ZT__TT_EMBED, ZT__TT_LAYER, ZT__TT_LAYER2, ZT__TT_FINAL };

/* Which layers of its stack a layer row is in. */
enum zt__tt_at { ZT__TT_EVERY = 0, ZT__TT_FIRST, ZT__TT_LAST };

enum zt__tt_init {
    ZT__TT_NORMAL,          /* normal(0, std) */
    ZT__TT_NORMAL_RESIDUAL, /* normal(0, std / sqrt(2 L)): GPT-2's projections into the residual stream */
    ZT__TT_NORMAL_PAD,      /* normal(0, std), then row pad_row zero (nn.Embedding's padding_idx), if >= 0 */
    ZT__TT_ZERO,            /* biases */
    ZT__TT_ONE,             /* normalisation weights */
    ZT__TT_FILL,            /* every value std (T5's norms: initializer_factor) */
};

#define ZT__TT_NO_ROLE (-1)
#define ZT__TT_MAX_DIMS 8

typedef struct zt__tt_row {
    const char *name;      /* after the prefixes (see above) */
    uint8_t part;          /* enum zt__tt_part */
    uint8_t d0, d1;        /* the shape as symbols: indices into zt__tt_dims.d, d1 0 for a vector */
    uint8_t init;          /* enum zt__tt_init */
    uint8_t std_div;       /* a dimension symbol: the normal's std is divided by sqrt of its value (0: not) */
    uint8_t at;            /* enum zt__tt_at: a layer row in every layer of its stack, or the first or last */
    bool no_layer_prefix;  /* a layer row named without the layer's prefix (T5's encoder.final_layer_norm) */
    int8_t role;           /* its role in the layer program (a layer row), or ZT__TT_NO_ROLE */
    uint32_t when, unless; /* flag bits the config must have and must not have for the row to exist */
    bool packed;           /* the program keeps it right after the previous row (k, v after q; up after gate) */
    bool body;             /* an embeddings or final row that follows the body prefix */
    bool transposed_in_hf; /* stored [in, out] in the files (GPT-2's Conv1D) */
    bool bare_in_hf;       /* without the Hugging Face prefix in the files */
    bool hf_per_head;      /* a fused q | k | v row whose parts the files interleave per head (head h's q, k
                              and v rows follow each other; GPT-NeoX's query_key_value) */
    uint8_t split;         /* enum zt_tp_split (params.h) */
} zt__tt_row;

/* A row: part, name, shape, initialisation and role; the other fields follow as designated initialisers. */
#define ZT__TT(part_, name_, d0_, d1_, init_, role_)                                                            \
    .part = ZT__TT_##part_, .name = (name_), .d0 = (d0_), .d1 = (d1_), .init = ZT__TT_##init_, .role = (role_)

/* What a config gives the table: its layer count, flag bits, each dimension symbol's value (d[0] is 0: no
 * dimension), the normal initialisation's standard deviation, the padding row and the body prefix. */
typedef struct zt__tt_dims {
    int layers, layers2; /* the layers of the first stack and of a second (0: none) */
    int heads;          /* attention heads, for rows with hf_per_head */
    uint32_t flags;
    int64_t d[ZT__TT_MAX_DIMS];
    double std;
    int64_t pad_row;    /* -1: none */
    const char *prefix; /* NULL: none */
} zt__tt_dims;

/* A name the files use for one of the table's tensors: the same tensor under another name (ZT_HF_PARAM), or
 * one that must hold the same values (ZT_HF_TIED: a tied head). Active when the config's flags have `when` and
 * lack `unless`. */
typedef struct zt__tt_alias {
    const char *file_name, *name;
    enum zt_hf_kind kind;
    uint32_t when, unless;
} zt__tt_alias;

typedef struct zt__tt {
    const zt__tt_row *rows;
    int nrows;
    const char *layer_prefix; /* printf format with the layer's number in its stack: "layers.%d." */
    const char *layer2_prefix; /* the second stack's */
    void (*dims)(const void *cfg, zt__tt_dims *d);
    /* Hugging Face files */
    const char *hf_prefix;           /* "model."; "" when the table's names are the files' */
    const zt__tt_alias *hf_aliases;  /* [hf_naliases] */
    int hf_naliases;
    const char *const *hf_buffers;   /* NULL-ended: endings (after a '.' or the whole name) of buffers to skip */
    const char *const *hf_renames;   /* NULL-ended pairs: an older ending and the one it stands for */
    const char *const *hf_other_heads; /* NULL-ended: starts (after the body prefix) of other task heads' names */
    const char *hf_model;            /* "a GPT-2", for messages; NULL: "a " and the class hf_class names */
    const char *(*hf_class)(const void *cfg); /* "BertForMaskedLM" */
    uint32_t tie_flag;               /* the flag of a tied head: messages name tie_word_embeddings */
} zt__tt;

/* The layout of cfg: the number of tensors; the tensors and the L + L2 + 2 blocks filled in slab order (returns
 * the parameter count); the parameter count alone, allocating nothing. */
int zt__tt_count(const zt__tt *tt, const void *cfg);
size_t zt__tt_layout(const zt__tt *tt, const void *cfg, zt_param_info *tensors, zt_block_info *blocks);
size_t zt__tt_num_params(const zt__tt *tt, const void *cfg);
/* Fills params (cfg's layout, n tensors) as the rows' initialisation says, tensors in slab order from one
 * generator seeded with seed. */
void zt__tt_init(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, float *params,
                 uint64_t seed);
/* The same for tensors [first, end) only, from *rng, which it advances: ranges taken in order from 0 with a
 * generator seeded with seed fill what zt__tt_init does. Tensors flagged in skip (NULL: none) are left as they
 * are, their draws skipped, so that the others get the same values (what an import will overwrite). */
void zt__tt_init_range(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, float *params,
                       const bool *skip, zt_rng *rng, int first, int end);
/* The values zt__tt_init_range from *rng at tensor first would give tensor `which` (first <= which < n), written into
 * dst (its numel floats) instead of the slab; *rng is left as it is (the tensors between are skipped, not drawn). */
void zt__tt_init_values(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, const zt_rng *rng,
                        int first, int which, float *dst);
/* A layer's rows as the program sees them: the number of tensors of a layer, each role's index within the
 * layer (-1 when absent; role[nroles]) and whether each continues the one before it (packed[per_layer]). */
int zt__tt_layer_roles(const zt__tt *tt, const void *cfg, int *role, int nroles, bool *packed);
/* The tensors of block b by role, as indices in the whole table (t[nroles], -1 when absent): for a program whose
 * layers differ (T5's encoder and decoder layers, its stacks' first and last). */
void zt__tt_block_roles(const zt__tt *tt, const void *cfg, int b, int *t, int nroles);

/* zt_hf_names' entries for a host model (host_model.h) whose spec has a table; a family's zt_hf_names takes
 * ZT__TT_HF_NAMES and adds its own data (tied_fix, head_optional, reorder). */
void zt__tt_hf_export_name(const void *m, const zt_param_info *t, char *out, size_t cap);
enum zt_hf_kind zt__tt_hf_map(const void *m, const char *name, int *idx);
void zt__tt_hf_describe(const void *m, char *out, size_t cap);
/* A zt_hf_names reorder entry for a table with hf_per_head rows: their rows from ours, all q | all k | all v
 * (part p of head h at row p*C + h*HS), to the files' (3h + p)*HS, or back. */
bool zt__tt_hf_reorder(const void *m, int idx, const float *src, float *dst, bool to_hf);
#define ZT__TT_HF_NAMES .export_name = zt__tt_hf_export_name, .map = zt__tt_hf_map, .describe = zt__tt_hf_describe,

#endif
