/* The training tasks; see task.h. Each task is a table of functions over one state struct. */
#include "worker/train/task.h"

#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/data/classify.h"
#include "worker/data/tokenize.h"
#include "worker/models/family.h"

typedef struct task_ops {
    const char *name;
    enum zt_family_task kind;
    bool reads_shards;     /* token shards (else labelled JSONL texts) */
    bool reports_accuracy;
    bool weighs_targets;
    int (*open)(zt_task *t, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches, zt_err *err);
    void (*next)(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types);
} task_ops;

struct zt_task {
    const task_ops *ops;
    uint64_t seed;
    size_t batch_tokens;        /* B x T */
    zt_family_shape shape;
    zt_dataloader *train, *val; /* token shards */
    zt_classify_data *ctrain, *cval; /* labelled texts */
    zt_tokenizer *tokenizer;    /* a classifier's texts; a masked LM's [MASK] and special tokens */
    int32_t mask_id;            /* masked LM: [MASK] / <mask> */
    int32_t *specials;          /* masked LM: the ids never masked (special tokens and padding) */
    int nspecials;
};

/* Puts "flag: " before the message in err. */
static void prefix_error(zt_err *err, const char *flag)
{
    if (err == NULL)
        return;
    size_t n = strlen(flag) + 2; /* "flag: " */
    if (n >= sizeof(err->msg))
        return;
    memmove(err->msg + n, err->msg, sizeof(err->msg) - n);
    err->msg[sizeof(err->msg) - 1] = '\0';
    memcpy(err->msg, flag, n - 2);
    err->msg[n - 2] = ':';
    err->msg[n - 1] = ' ';
}

/* ---- token shards: causal LM and masked LM ---- */

/* Refuses data with token ids the model's embedding has no row for, naming the first such file. */
static int check_vocab(const zt_dataloader *dl, const char *pattern, int vocab_size, zt_err *err)
{
    int max = zt_dataloader_max_token(dl);
    if (max < vocab_size)
        return 0;
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            int file_max = zt_shard_max_token(g.gl_pathv[i]);
            if (file_max >= vocab_size) {
                int rc = zt_fail(err, ZT_EMISMATCH, "token id %d in '%s' does not fit vocab_size %d of the model "
                                 "(tokenize with the model's tokenizer or raise vocab_size)",
                                 file_max, g.gl_pathv[i], vocab_size);
                globfree(&g);
                return rc;
            }
        }
        globfree(&g);
    }
    return zt_fail(err, ZT_EMISMATCH, "token id %d in '%s' does not fit vocab_size %d of the model (tokenize with "
                   "the model's tokenizer or raise vocab_size)", max, pattern, vocab_size);
}

static void log_data(const char *what, const char *pattern, const zt_dataloader *dl, const zt_train_config *cfg)
{
    uint64_t tokens = zt_dataloader_num_tokens(dl);
    uint64_t batches = zt_dataloader_batches_per_epoch(dl);
    zt_log(ZT_LOG_INFO, "data: %s '%s': %llu tokens, %llu batches of %lld x %lld per epoch (max token id %d)",
           what, pattern, (unsigned long long)tokens, (unsigned long long)batches, (long long)cfg->batch_size,
           (long long)cfg->seq_len, zt_dataloader_max_token(dl));
}

/* The training shards, and the validation shards when given (eval_batches lowered to what they hold). */
static int open_shards(zt_task *t, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                       zt_err *err)
{
    int rc;
    if ((rc = zt_dataloader_open(&t->train, cfg->train_data, B, T, cfg->shuffle, (uint64_t)cfg->seed, err)) < 0) {
        prefix_error(err, "--train-data");
        return rc;
    }
    if ((rc = check_vocab(t->train, cfg->train_data, t->shape.vocab, err)) < 0)
        return rc;
    if (is0)
        log_data("train", cfg->train_data, t->train, cfg);
    if (!cfg->val_data[0]) {
        if (is0)
            zt_log(ZT_LOG_INFO, "data: no val_data given: no evaluation");
        return 0;
    }
    if ((rc = zt_dataloader_open(&t->val, cfg->val_data, B, T, false, (uint64_t)cfg->seed, err)) < 0) {
        prefix_error(err, "--val-data");
        return rc;
    }
    if ((rc = check_vocab(t->val, cfg->val_data, t->shape.vocab, err)) < 0)
        return rc;
    if (is0)
        log_data("val", cfg->val_data, t->val, cfg);
    uint64_t available = zt_dataloader_batches_per_epoch(t->val);
    if ((uint64_t)*eval_batches > available) {
        if (is0)
            zt_log(ZT_LOG_INFO, "eval: the validation data has %llu batches; evaluating on those instead of %lld",
                   (unsigned long long)available, (long long)*eval_batches);
        *eval_batches = (int64_t)available;
    }
    return 0;
}

static void next_shards(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types)
{
    (void)key;
    (void)types;
    zt_dataloader_next(val ? t->val : t->train, tokens, targets);
}

/* A masked LM's tokens from its tokenizer.json: [MASK] (or RoBERTa's <mask>), and the ids never masked
 * (every special token, and padding); then the shards. */
static int open_masked(zt_task *t, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                       zt_err *err)
{
    const int vocab = t->shape.vocab, pad = t->shape.pad_token_id;
    int rc = zt_tokenizer_load(&t->tokenizer, cfg->tokenizer, err);
    if (rc < 0) {
        prefix_error(err, "--tokenizer");
        return rc;
    }
    t->mask_id = zt_tokenizer_find(t->tokenizer, "[MASK]");
    if (t->mask_id < 0)
        t->mask_id = zt_tokenizer_find(t->tokenizer, "<mask>");
    if (t->mask_id < 0 || t->mask_id >= vocab)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--tokenizer %s: %s; a masked LM needs the model's own tokenizer.json, "
                       "which has [MASK] (BERT) or <mask> (RoBERTa)", cfg->tokenizer,
                       t->mask_id < 0 ? "it has neither [MASK] nor <mask>"
                                      : "its mask token is outside the model's vocabulary");
    const int V = zt_tokenizer_vocab_size(t->tokenizer) < vocab ? zt_tokenizer_vocab_size(t->tokenizer) : vocab;
    t->specials = zt_xcalloc((size_t)V + 1, sizeof(int32_t));
    t->specials[t->nspecials++] = pad;
    for (int32_t id = 0; id < V; id++)
        if (id != pad && zt_tokenizer_is_special(t->tokenizer, id))
            t->specials[t->nspecials++] = id;
    if (is0)
        zt_log(ZT_LOG_INFO, "masked LM: 15%% of the tokens of each batch are chosen (80%% become token %d, 10%% a "
               "random token, 10%% stay), never the %d special tokens", (int)t->mask_id, t->nspecials);
    return open_shards(t, cfg, B, T, is0, eval_batches, err);
}

/* The shard's tokens with 15% of them masked (targets: the tokens chosen, -1 elsewhere). */
static void next_masked(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types)
{
    zt_dataloader_next(val ? t->val : t->train, tokens, targets);
    (void)types;
    zt_rng rng;
    zt_rng_seed(&rng, (t->seed * 0x9E3779B97F4A7C15ULL) ^ (key + (val ? 1ULL << 63 : 0)));
    zt_task_mask_tokens(tokens, targets, t->batch_tokens, t->mask_id, t->shape.vocab, t->specials, t->nspecials,
                        &rng, 0.15f);
}

size_t zt_task_mask_tokens(int32_t *tokens, int32_t *targets, size_t n, int32_t mask_id, int vocab,
                           const int32_t *special, int nspecial, zt_rng *rng, float prob)
{
    ZT_ASSERT(vocab > 0 && mask_id >= 0 && mask_id < vocab && prob >= 0.0f && prob <= 1.0f);
    size_t chosen = 0;
    for (size_t i = 0; i < n; i++) {
        bool is_special = false;
        for (int k = 0; k < nspecial && !is_special; k++)
            is_special = tokens[i] == special[k];
        targets[i] = -1;
        if (is_special || zt_rng_uniform(rng) >= (double)prob)
            continue;
        chosen++;
        targets[i] = tokens[i];
        const double u = zt_rng_uniform(rng);
        if (u < 0.8)
            tokens[i] = mask_id;
        else if (u < 0.9)
            tokens[i] = (int32_t)zt_rng_below(rng, (uint64_t)vocab);
    }
    return chosen;
}

/* ---- labelled texts: classification ---- */

/* The tokenizer, the JSONL examples of --train-data and --val-data, tokenized for B x T batches with the
 * model's labels and padding. */
static int open_labelled(zt_task *t, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                         zt_err *err)
{
    (void)eval_batches; /* a classifier evaluates its whole validation file */
    const int nlabels = t->shape.num_labels;
    int rc = zt_tokenizer_load(&t->tokenizer, cfg->tokenizer, err);
    if (rc < 0) {
        prefix_error(err, "--tokenizer");
        return rc;
    }
    /* the label names: id2label's, or LABEL_<i> (written into bufs) */
    char *bufs = zt_xcalloc((size_t)nlabels, 32);
    const char **names = zt_xcalloc((size_t)nlabels, sizeof(char *));
    for (int i = 0; i < nlabels; i++)
        names[i] = zt_family_config_label(&cfg->model, i, bufs + 32 * (size_t)i, 32);
    const zt_classify_labels labels = {.num_labels = nlabels, .names = names};
    const char *flags[2] = {"--train-data", "--val-data"};
    const char *paths[2] = {cfg->train_data, cfg->val_data};
    zt_classify_data **sets[2] = {&t->ctrain, &t->cval};
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (paths[i][0] == '\0')
            continue;
        rc = zt_classify_open(sets[i], paths[i], t->tokenizer, t->shape.vocab, t->shape.pad_token_id, &labels, B, T,
                              i == 0 && cfg->shuffle, (uint64_t)cfg->seed, err);
        if (rc < 0) {
            prefix_error(err, flags[i]);
            break;
        }
        if (is0)
            zt_log(ZT_LOG_INFO, "data: %s '%s': %zu examples (%zu cut to %d tokens), %llu batches of %d per epoch, "
                   "%d labels", i == 0 ? "train" : "val", paths[i], zt_classify_examples(*sets[i]),
                   zt_classify_truncated(*sets[i]), T, (unsigned long long)zt_classify_batches_per_epoch(*sets[i]), B,
                   nlabels);
    }
    free(names);
    free(bufs);
    if (rc == 0 && is0) {
        if (t->cval)
            zt_log(ZT_LOG_INFO, "eval: a classifier is evaluated on its whole validation file (loss and accuracy; "
                   "eval_batches does not apply)");
        else
            zt_log(ZT_LOG_INFO, "data: no val_data given: no evaluation");
    }
    return rc;
}

static void next_labelled(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types)
{
    (void)key;
    zt_classify_next(val ? t->cval : t->ctrain, tokens, types, targets);
}

/* ---- the tasks ---- */

static const task_ops tasks[] = {
    {.name = "causal LM", .kind = ZT_TASK_CAUSAL_LM, .reads_shards = true, .open = open_shards,
     .next = next_shards},
    {.name = "masked LM", .kind = ZT_TASK_MASKED_LM, .reads_shards = true, .reports_accuracy = true,
     .weighs_targets = true, .open = open_masked, .next = next_masked},
    {.name = "classification", .kind = ZT_TASK_CLASSIFY, .reports_accuracy = true, .weighs_targets = true,
     .open = open_labelled, .next = next_labelled},
};

static const task_ops *task_of(const zt_train_config *cfg)
{
    const enum zt_family_task kind = zt_family_config_task(&cfg->model);
    for (size_t i = 0; i < sizeof tasks / sizeof tasks[0]; i++)
        if (tasks[i].kind == kind)
            return &tasks[i];
    ZT_ASSERT(!"a family's task has no entry in the task table");
    return NULL;
}

int zt_task_check_paths(const zt_train_config *cfg, zt_err *err)
{
    const task_ops *ops = task_of(cfg);
    const char *flags[2] = {"--train-data", "--val-data"};
    const char *paths[2] = {cfg->train_data, cfg->val_data};
    for (int i = 0; i < 2; i++) {
        if (paths[i][0] == '\0')
            continue;
        if (!ops->reads_shards) {
            if (access(paths[i], R_OK) != 0)
                return zt_fail(err, -errno, "%s: cannot read '%s': %s (give the JSONL file of examples)", flags[i],
                               paths[i], strerror(errno));
            continue;
        }
        zt_dataloader *dl = NULL;
        int rc = zt_dataloader_open(&dl, paths[i], 1, (int)cfg->seq_len, false, (uint64_t)cfg->seed, err);
        zt_dataloader_close(dl);
        if (rc < 0) {
            prefix_error(err, flags[i]);
            return rc;
        }
    }
    return 0;
}

int zt_task_open(zt_task **out, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                 zt_err *err)
{
    *out = NULL;
    zt_task *t = zt_xcalloc(1, sizeof *t);
    t->ops = task_of(cfg);
    t->seed = (uint64_t)cfg->seed;
    t->batch_tokens = (size_t)B * (size_t)T;
    zt_family_config_shape(&cfg->model, &t->shape);
    int rc = t->ops->open(t, cfg, B, T, is0, eval_batches, err);
    if (rc < 0) {
        zt_task_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

void zt_task_close(zt_task *t)
{
    if (!t)
        return;
    zt_dataloader_close(t->train);
    zt_dataloader_close(t->val);
    zt_classify_close(t->ctrain);
    zt_classify_close(t->cval);
    zt_tokenizer_destroy(t->tokenizer);
    free(t->specials);
    free(t);
}

const char *zt_task_name(const zt_task *t)
{
    return t->ops->name;
}

bool zt_task_has_val(const zt_task *t)
{
    return t->val || t->cval;
}

bool zt_task_reports_accuracy(const zt_task *t)
{
    return t->ops->reports_accuracy;
}

bool zt_task_weighs_targets(const zt_task *t)
{
    return t->ops->weighs_targets;
}

void zt_task_next(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types)
{
    t->ops->next(t, val, key, tokens, targets, types);
}

int64_t zt_task_val_begin(zt_task *t, int64_t eval_batches)
{
    if (t->cval) {
        zt_classify_reset(t->cval);
        return (int64_t)zt_classify_batches_per_epoch(t->cval);
    }
    zt_dataloader_reset(t->val);
    return eval_batches;
}

void zt_task_get_position(const zt_task *t, zt_data_position *pos)
{
    if (t->ctrain)
        zt_classify_get_position(t->ctrain, pos);
    else
        zt_dataloader_get_position(t->train, pos);
}

int zt_task_set_position(zt_task *t, const zt_data_position *pos, zt_err *err)
{
    return t->ctrain ? zt_classify_set_position(t->ctrain, pos, err) : zt_dataloader_set_position(t->train, pos, err);
}
