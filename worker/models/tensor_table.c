/* A family's tensors as data; see tensor_table.h. */
#include "worker/models/tensor_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/rng.h"                /* deterministic initialisation */
#include "common/status.h"             /* ZT_ASSERT */
#include "worker/models/host_model.h"  /* the model's config, table and spec */
#include "worker/models/host_shared.h" /* zt__host_fill_normal */

static bool present(const zt__tt_row *r, uint32_t flags)
{
    return (flags & r->when) == r->when && (flags & r->unless) == 0;
}

static void dims_of(const zt__tt *tt, const void *cfg, zt__tt_dims *d)
{
    memset(d, 0, sizeof *d);
    d->pad_row = -1;
    tt->dims(cfg, d);
    ZT_ASSERT(d->d[0] == 0 && d->layers >= 0);
}

/* The layers of part p (1 for the embeddings and the final block). */
static int part_layers(const zt__tt_dims *d, int p)
{
    return p == ZT__TT_LAYER ? d->layers : p == ZT__TT_LAYER2 ? d->layers2 : 1;
}

/* Whether row r is in layer l of its part. */
static bool in_layer(const zt__tt_row *r, const zt__tt_dims *d, int l)
{
    return r->at == ZT__TT_EVERY || (r->at == ZT__TT_FIRST && l == 0) ||
           (r->at == ZT__TT_LAST && l == part_layers(d, r->part) - 1);
}

static bool is_layer_row(const zt__tt_row *r)
{
    return r->part == ZT__TT_LAYER || r->part == ZT__TT_LAYER2;
}

/* The table's name of row r (in layer l of its stack for a layer row) into out. */
static void row_name(const zt__tt *tt, const zt__tt_dims *d, const zt__tt_row *r, int l, char *out, size_t cap)
{
    const char *body = is_layer_row(r) || r->body ? (d->prefix ? d->prefix : "") : "";
    char layer[48] = "";
    if (is_layer_row(r) && !r->no_layer_prefix)
        snprintf(layer, sizeof layer, r->part == ZT__TT_LAYER ? tt->layer_prefix : tt->layer2_prefix, l);
    const int n = snprintf(out, cap, "%s%s%s", body, layer, r->name);
    ZT_ASSERT(n > 0 && (size_t)n < cap);
}

/* Runs body for every tensor of the config with dims d in slab order, with its row r and its layer l (in its
 * stack; 0 for the embeddings and the final block). */
#define FOR_EACH_TENSOR(tt, d, r, l, body)                                                                      \
    for (int part_ = ZT__TT_EMBED; part_ <= ZT__TT_FINAL; part_++)                                              \
        for (int l = 0; l < part_layers(&(d), part_); l++)                                                      \
            for (const zt__tt_row *r = (tt)->rows; r < (tt)->rows + (tt)->nrows; r++)                           \
                if (r->part == part_ && present(r, (d).flags) && in_layer(r, &(d), l)) {                        \
                    body                                                                                        \
                }

int zt__tt_count(const zt__tt *tt, const void *cfg)
{
    zt__tt_dims d;
    dims_of(tt, cfg, &d);
    int n = 0;
    FOR_EACH_TENSOR(tt, d, r, l, { (void)r; (void)l; n++; })
    return n;
}

static int block_of(const zt__tt_row *r, int l, const zt__tt_dims *d)
{
    switch ((enum zt__tt_part)r->part) {
    case ZT__TT_EMBED: return 0;
    case ZT__TT_LAYER: return 1 + l;
    case ZT__TT_LAYER2: return 1 + d->layers + l;
    case ZT__TT_FINAL: break;
    }
    return 1 + d->layers + d->layers2;
}

size_t zt__tt_layout(const zt__tt *tt, const void *cfg, zt_param_info *tensors, zt_block_info *blocks)
{
    zt__tt_dims d;
    dims_of(tt, cfg, &d);
    size_t off = 0;
    int i = 0;
    const int nblocks = d.layers + d.layers2 + 2;
    for (int b = 0; b < nblocks; b++)
        blocks[b] = (zt_block_info){0, 0};
    FOR_EACH_TENSOR(tt, d, r, l, {
        const int b = block_of(r, l, &d);
        char name[sizeof tensors[0].name];
        row_name(tt, &d, r, l, name, sizeof name);
        if (blocks[b].numel == 0)
            blocks[b].offset = off;
        zt_param_info *t = &tensors[i++];
        zt__hm_add_tensor(t, b, &off, name, d.d[r->d0], d.d[r->d1], r->d1 != 0);
        t->transposed_in_hf = r->transposed_in_hf;
        t->tp_split = r->split;
        blocks[b].numel = off - blocks[b].offset;
    })
    /* a block without tensors (none today) sits where the slab is at its turn */
    for (int b = 1; b < nblocks; b++)
        if (blocks[b].numel == 0)
            blocks[b].offset = blocks[b - 1].offset + blocks[b - 1].numel;
    return off;
}

size_t zt__tt_num_params(const zt__tt *tt, const void *cfg)
{
    zt__tt_dims d;
    dims_of(tt, cfg, &d);
    size_t n = 0;
    for (const zt__tt_row *r = tt->rows; r < tt->rows + tt->nrows; r++)
        if (present(r, d.flags)) {
            const int layers = part_layers(&d, r->part);
            n += (size_t)d.d[r->d0] * (size_t)(r->d1 ? d.d[r->d1] : 1) *
                 (size_t)(r->at == ZT__TT_EVERY ? layers : layers > 0);
        }
    return n;
}

void zt__tt_init(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, float *params,
                 uint64_t seed)
{
    zt_rng rng;
    zt_rng_seed(&rng, seed);
    zt__tt_init_range(tt, cfg, tensors, n, params, NULL, &rng, 0, n);
}

/* Tensor t of row r with its initialisation from *rng, which it advances, into x (t->numel floats). */
static void init_tensor(const zt__tt_row *r, const zt__tt_dims *d, const zt_param_info *t, float *x, zt_rng *rng)
{
    const double std = r->std_div ? d->std / sqrt((double)d->d[r->std_div]) : d->std;
    switch ((enum zt__tt_init)r->init) {
    case ZT__TT_NORMAL:
    case ZT__TT_NORMAL_PAD:
        zt__host_fill_normal(rng, x, t->numel, std);
        if (r->init == ZT__TT_NORMAL_PAD && d->pad_row >= 0 && d->pad_row < t->shape[0])
            memset(x + (size_t)d->pad_row * (size_t)t->shape[1], 0, (size_t)t->shape[1] * sizeof *x);
        break;
    case ZT__TT_NORMAL_RESIDUAL:
        zt__host_fill_normal(rng, x, t->numel, std / sqrt(2.0 * d->layers));
        break;
    case ZT__TT_ZERO:
        memset(x, 0, t->numel * sizeof *x);
        break;
    case ZT__TT_ONE:
    case ZT__TT_FILL:
        for (size_t j = 0; j < t->numel; j++)
            x[j] = r->init == ZT__TT_ONE ? 1.0f : (float)std;
        break;
    }
}

/* The draws init_tensor takes from the generator for tensor t of row r (two per value of a normal). */
static uint64_t init_draws(const zt__tt_row *r, const zt_param_info *t)
{
    const bool normal = r->init == ZT__TT_NORMAL || r->init == ZT__TT_NORMAL_PAD || r->init == ZT__TT_NORMAL_RESIDUAL;
    return normal ? 2 * (uint64_t)t->numel : 0;
}

/* Tensors [first, end) from *rng, which it advances: into params at their offsets (but those skip flags, whose
 * draws are skipped), or with params NULL only the last of them, into one (the draws of those before it skipped). */
static void init_walk(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, zt_rng *rng, int first,
                      int end, float *params, const bool *skip, float *one)
{
    zt__tt_dims d;
    dims_of(tt, cfg, &d);
    int i = 0;
    FOR_EACH_TENSOR(tt, d, r, l, {
        (void)l;
        ZT_ASSERT(i < n);
        const int idx = i++;
        const zt_param_info *t = &tensors[idx];
        if (idx < first || idx >= end)
            continue;
        if (params && !(skip && skip[idx]))
            init_tensor(r, &d, t, params + t->offset, rng);
        else if (params || idx < end - 1)
            zt_rng_jump(rng, init_draws(r, t));
        else
            init_tensor(r, &d, t, one, rng);
    })
    ZT_ASSERT(i == n);
}

void zt__tt_init_range(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, float *params,
                       const bool *skip, zt_rng *rng, int first, int end)
{
    init_walk(tt, cfg, tensors, n, rng, first, end, params, skip, NULL);
}

void zt__tt_init_values(const zt__tt *tt, const void *cfg, const zt_param_info *tensors, int n, const zt_rng *rng,
                        int first, int which, float *dst)
{
    ZT_ASSERT(first <= which && which < n);
    zt_rng from = *rng;
    init_walk(tt, cfg, tensors, n, &from, first, which + 1, NULL, NULL, dst);
}

int zt__tt_layer_roles(const zt__tt *tt, const void *cfg, int *role, int nroles, bool *packed)
{
    zt__tt_dims d;
    dims_of(tt, cfg, &d);
    for (int k = 0; k < nroles; k++)
        role[k] = -1;
    int j = 0;
    for (const zt__tt_row *r = tt->rows; r < tt->rows + tt->nrows; r++)
        if (r->part == ZT__TT_LAYER && present(r, d.flags)) {
            if (r->role != ZT__TT_NO_ROLE) {
                ZT_ASSERT(r->role >= 0 && r->role < nroles);
                role[r->role] = j;
            }
            packed[j++] = r->packed;
        }
    return j;
}

void zt__tt_block_roles(const zt__tt *tt, const void *cfg, int b, int *t, int nroles)
{
    zt__tt_dims d;
    dims_of(tt, cfg, &d);
    for (int k = 0; k < nroles; k++)
        t[k] = -1;
    int i = 0;
    FOR_EACH_TENSOR(tt, d, r, l, {
        if (block_of(r, l, &d) == b && r->role != ZT__TT_NO_ROLE) {
            ZT_ASSERT(r->role >= 0 && r->role < nroles);
            t[r->role] = i;
        }
        i++;
    })
}

/* ---- Hugging Face names ---- */

/* The row of table tensor `name` of a model with dims d, or NULL (only embeddings and final rows: those are
 * the ones that may be bare in the files). */
static const zt__tt_row *outer_row(const zt__tt *tt, const zt__tt_dims *d, const char *name)
{
    char buf[sizeof ((zt_param_info *)0)->name];
    for (const zt__tt_row *r = tt->rows; r < tt->rows + tt->nrows; r++)
        if (!is_layer_row(r) && present(r, d->flags)) {
            row_name(tt, d, r, 0, buf, sizeof buf);
            if (strcmp(buf, name) == 0)
                return r;
        }
    return NULL;
}

static bool is_bare(const zt__tt *tt, const zt__tt_dims *d, const char *name)
{
    const zt__tt_row *r = outer_row(tt, d, name);
    return r && r->bare_in_hf;
}

void zt__tt_hf_export_name(const void *m, const zt_param_info *t, char *out, size_t cap)
{
    const zt__tt *tt = zt__hm_table(m);
    zt__tt_dims d;
    dims_of(tt, zt__hm_config(m), &d);
    snprintf(out, cap, "%s%s", is_bare(tt, &d, t->name) ? "" : tt->hf_prefix, t->name);
}

static bool ends_at_dot(const char *s, const char *ending)
{
    const size_t n = strlen(s), k = strlen(ending);
    return n >= k && strcmp(s + n - k, ending) == 0 && (n == k || s[n - k - 1] == '.');
}

static bool starts_with(const char *s, const char *start)
{
    return strncmp(s, start, strlen(start)) == 0;
}

static int find(const void *m, const char *name)
{
    return zt__host_find_tensor(zt__hm_tensor(m, 0), zt__hm_num_tensors(m), name);
}

/* A file's name, in this order: an older ending renamed; a buffer; an alias; the table's name as it is,
 * after the Hugging Face prefix (not for a bare row) or after the body prefix; another task head's. */
enum zt_hf_kind zt__tt_hf_map(const void *m, const char *name, int *idx)
{
    const zt__tt *tt = zt__hm_table(m);
    zt__tt_dims d;
    dims_of(tt, zt__hm_config(m), &d);
    char buf[200];
    if (strlen(name) + 1 > sizeof buf - 64)
        return ZT_HF_UNKNOWN;
    snprintf(buf, sizeof buf, "%s", name);
    for (const char *const *p = tt->hf_renames; p && p[0]; p += 2)
        if (ends_at_dot(buf, p[0])) {
            snprintf(buf + strlen(buf) - strlen(p[0]), sizeof buf - (strlen(buf) - strlen(p[0])), "%s", p[1]);
            break;
        }
    for (const char *const *p = tt->hf_buffers; p && *p; p++)
        if (ends_at_dot(buf, *p))
            return ZT_HF_BUFFER;
    for (const zt__tt_alias *a = tt->hf_aliases; a < tt->hf_aliases + tt->hf_naliases; a++)
        if ((d.flags & a->when) == a->when && (d.flags & a->unless) == 0 && strcmp(buf, a->file_name) == 0) {
            *idx = find(m, a->name);
            ZT_ASSERT(*idx >= 0);
            return a->kind;
        }
    if ((*idx = find(m, buf)) >= 0)
        return ZT_HF_PARAM;
    const size_t hp = strlen(tt->hf_prefix);
    if (hp > 0 && starts_with(buf, tt->hf_prefix) && (*idx = find(m, buf + hp)) >= 0 && !is_bare(tt, &d, buf + hp))
        return ZT_HF_PARAM;
    const char *body = d.prefix ? d.prefix : "";
    if (body[0]) {
        char full[sizeof buf + 32];
        snprintf(full, sizeof full, "%s%s", body, buf);
        if ((*idx = find(m, full)) >= 0)
            return ZT_HF_PARAM;
    }
    const char *rest = body[0] && starts_with(buf, body) ? buf + strlen(body) : buf;
    for (const char *const *p = tt->hf_other_heads; p && *p; p++)
        if (starts_with(rest, *p))
            return ZT_HF_OTHER_HEAD;
    *idx = -1;
    return ZT_HF_UNKNOWN;
}

bool zt__tt_hf_reorder(const void *m, int idx, const float *src, float *dst, bool to_hf)
{
    const zt__tt *tt = zt__hm_table(m);
    zt__tt_dims d;
    dims_of(tt, zt__hm_config(m), &d);
    int i = 0;
    const zt__tt_row *row = NULL;
    FOR_EACH_TENSOR(tt, d, r, l, {
        (void)l;
        if (i++ == idx)
            row = r;
    })
    if (!row || !row->hf_per_head)
        return false;
    const zt_param_info *t = zt__hm_tensor(m, idx);
    const size_t rows = (size_t)t->shape[0], cols = t->numel / rows, NH = (size_t)d.heads, C = rows / 3,
                 HS = C / NH;
    ZT_ASSERT(NH > 0 && rows == 3 * NH * HS);
    for (size_t p = 0; p < 3; p++)
        for (size_t h = 0; h < NH; h++)
            for (size_t j = 0; j < HS; j++) {
                const size_t ours = p * C + h * HS + j, hf = (3 * h + p) * HS + j;
                memcpy(dst + (to_hf ? hf : ours) * cols, src + (to_hf ? ours : hf) * cols, cols * sizeof(float));
            }
    return true;
}

void zt__tt_hf_describe(const void *m, char *out, size_t cap)
{
    const zt__tt *tt = zt__hm_table(m);
    zt__tt_dims d;
    dims_of(tt, zt__hm_config(m), &d);
    if (!tt->tie_flag) {
        if (tt->hf_model)
            snprintf(out, cap, "%s with %d layers", tt->hf_model, d.layers);
        else
            snprintf(out, cap, "a %s with %d layers", tt->hf_class(zt__hm_config(m)), d.layers);
        return;
    }
    const bool tied = (d.flags & tt->tie_flag) != 0;
    snprintf(out, cap, "%s with %d layers and %s head (tie_word_embeddings %s)", tt->hf_model, d.layers,
             tied ? "a tied" : "an untied", tied ? "true" : "false");
}
