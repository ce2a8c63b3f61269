/* The training tasks; see task.h. Each task is a table of functions over one state struct. */
#include "worker/train/task.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/log.h"
#include "worker/data/chat_template.h"
#include "worker/data/classify.h"
#include "worker/data/sft.h"
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
    zt_chat_template *tmpl;     /* supervised fine-tuning: the chat template, or NULL */
    zt_sft_data *strain, *sval; /* supervised fine-tuning: the examples */
    zt_sft_loader *ltrain, *lval;
    int32_t *positions, *cu_seqlens, *nseqs; /* supervised fine-tuning: the loader's batch buffers */
    bool packed;                /* supervised fine-tuning: several examples a row (--sft-pack) */
    int64_t untrained;          /* supervised fine-tuning: batches skipped for having no trained token */
    int rows;                   /* B */
    int Td;                     /* sequence-to-sequence: the decoder's tokens a row (at most T) */
    int32_t *dec_in, *src_len, *dec_targets; /* sequence-to-sequence: the last batch's [B*Td], [B], [B*Td] */
};

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
        zt_err_prefix(err, "--train-data");
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
        zt_err_prefix(err, "--val-data");
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
        zt_err_prefix(err, "--tokenizer");
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
        zt_err_prefix(err, "--tokenizer");
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
            zt_err_prefix(err, flags[i]);
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

/* ---- supervised examples: fine-tuning a decoder ---- */

/* The eos_token of a tokenizer_config.json (a string, or an object with "content"), into buf; false when it
 * has none or cannot be read. */
static bool config_eos(const char *path, char *buf, size_t cap)
{
    cJSON *root = NULL;
    zt_err err;
    if (zt_json_load_object(path, &root, &err) < 0)
        return false;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token");
    if (cJSON_IsObject(e))
        e = cJSON_GetObjectItemCaseSensitive(e, "content");
    const bool ok = cJSON_IsString(e) && e->valuestring[0] && strlen(e->valuestring) < cap;
    if (ok)
        snprintf(buf, cap, "%s", e->valuestring);
    cJSON_Delete(root);
    return ok;
}

/* The chat template: --chat-template NAME (with the bos and eos of the tokenizer_config.json beside the
 * tokenizer when there is one), none, or the chat_template of that file (none when it has no such file or no
 * chat_template). */
static int open_template(zt_task *t, const zt_train_config *cfg, const char *tcfg, bool has_tcfg, bool is0,
                         zt_err *err)
{
    const char *name = cfg->chat_template;
    if (strcmp(name, "none") == 0)
        return 0;
    int rc;
    if (name[0]) {
        rc = has_tcfg ? zt_chat_template_load(&t->tmpl, tcfg, name, err)
                      : zt_chat_template_by_name(&t->tmpl, name, NULL, NULL, err);
        if (rc < 0) {
            zt_err_prefix(err, "--chat-template");
            if (rc == ZT_EINVAL_CONFIG && err && strlen(err->msg) + 40 < sizeof err->msg)
                strcat(err->msg, " (or none: no template)");
        }
        return rc;
    }
    if (!has_tcfg) {
        if (is0)
            zt_log(ZT_LOG_INFO, "sft: no tokenizer_config.json beside '%s' and no --chat-template: no chat template "
                   "(chats need one: name it with --chat-template)", cfg->tokenizer);
        return 0;
    }
    rc = zt_chat_template_load(&t->tmpl, tcfg, NULL, err);
    if (rc == ZT_EINVAL_CONFIG) { /* the file has no chat_template: a base model */
        if (is0)
            zt_log(ZT_LOG_INFO, "sft: '%s' has no chat_template: no chat template (chats need one: name it with "
                   "--chat-template)", tcfg);
        return 0;
    }
    if (rc < 0)
        zt_err_prefix(err, "--tokenizer's tokenizer_config.json");
    return rc;
}

/* Logs what a file of examples and its loader hold. */
static void log_sft(const char *what, const char *path, const zt_sft_data *d, const zt_sft_loader *l, int B, int T,
                    bool packed)
{
    static const char *const formats[] = {"?", "prompt/completion", "alpaca", "chat", "input/target"};
    zt_sft_stats s;
    zt_sft_get_stats(d, &s);
    const uint64_t rows = zt_sft_loader_rows(l), tokens = zt_sft_loader_tokens(l);
    zt_log(ZT_LOG_INFO, "sft: %s '%s': %s, %zu examples, %llu tokens, %llu trained (%.1f%%), longest %zu; %zu cut to "
           "%d tokens, %zu dropped (no trained token); %llu batches of %d x %d per epoch, padding %.1f%% of the "
           "rows' tokens", what, path, formats[(unsigned)s.format < 5 ? s.format : 0], s.examples,
           (unsigned long long)s.tokens, (unsigned long long)s.trained,
           s.tokens ? 100.0 * (double)s.trained / (double)s.tokens : 0.0, s.longest, zt_sft_loader_truncated(l), T,
           zt_sft_loader_dropped(l) + s.dropped, (unsigned long long)zt_sft_loader_batches_per_epoch(l), B, T,
           rows ? 100.0 * (1.0 - (double)tokens / ((double)rows * (double)T)) : 0.0);
    if (packed) {
        const size_t used = zt_sft_loader_examples(l);
        zt_log(ZT_LOG_INFO, "sft: %s packed: %zu examples in %llu rows of %d tokens, %.2f examples a row, rows %.1f%% "
               "full; %zu longer than %d tokens truncated", what, used, (unsigned long long)rows, T,
               rows ? (double)used / (double)rows : 0.0,
               rows ? 100.0 * (double)tokens / ((double)rows * (double)T) : 0.0, zt_sft_loader_truncated(l), T);
    }
}

/* Opens the training and validation files of examples (--sft-data, --sft-val-data) into loaders of B x T
 * batches and logs what they hold (rank 0); trims *eval_batches to what the validation file fills. `fix` is
 * the flags named when an example is too long and --sft-overlong refuse. Returns 0 or the error, prefixed
 * with the file's flag. */
static int open_example_files(zt_task *t, const zt_train_config *cfg, const zt_sft_options *opt,
                              const zt_sft_batch_options *bo, int B, int T, bool packed, const char *fix, bool is0,
                              int64_t *eval_batches, zt_err *err)
{
    const char *flags[2] = {"--sft-data", "--sft-val-data"};
    const char *paths[2] = {cfg->sft_data, cfg->sft_val_data};
    zt_sft_data **sets[2] = {&t->strain, &t->sval};
    zt_sft_loader **loaders[2] = {&t->ltrain, &t->lval};
    for (int i = 0; i < 2; i++) {
        if (paths[i][0] == '\0')
            continue;
        zt_sft_batch_options o = *bo;
        o.shuffle = i == 0 && cfg->shuffle;
        int rc;
        if ((rc = zt_sft_open(sets[i], paths[i], t->tokenizer, opt, err)) < 0 ||
            (rc = zt_sft_loader_create(loaders[i], *sets[i], &o, err)) < 0) {
            zt_err_prefix(err, flags[i]);
            if (rc == ZT_EINVAL_CONFIG && cfg->sft_overlong == ZT_OVERLONG_REFUSE && err &&
                strstr(err->msg, "longer") && strlen(err->msg) + strlen(fix) + 4 < sizeof err->msg) {
                strcat(err->msg, " (");
                strcat(err->msg, fix);
                strcat(err->msg, ")");
            }
            return rc;
        }
        if (is0)
            log_sft(i == 0 ? "train" : "val", paths[i], *sets[i], *loaders[i], B, T, packed);
    }
    if (!t->lval) {
        if (is0)
            zt_log(ZT_LOG_INFO, "data: no sft_val_data given: no evaluation");
        return 0;
    }
    const uint64_t available = zt_sft_loader_batches_per_epoch(t->lval);
    if ((uint64_t)*eval_batches > available) {
        if (is0)
            zt_log(ZT_LOG_INFO, "eval: the validation examples fill %llu batches; evaluating on those instead of %lld",
                   (unsigned long long)available, (long long)*eval_batches);
        *eval_batches = (int64_t)available;
    }
    return 0;
}

/* The tokenizer, the chat template, the examples of --sft-data and --sft-val-data, and padded or packed
 * (--sft-pack) loaders over them (eval_batches lowered to the validation file's batches). */
static int open_sft(zt_task *t, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                    zt_err *err)
{
    int rc = zt_tokenizer_load(&t->tokenizer, cfg->tokenizer, err);
    if (rc < 0) {
        zt_err_prefix(err, "--tokenizer");
        return rc;
    }
    char tcfg[ZT_TRAIN_PATH_MAX + 32], eos[256];
    const bool has_tcfg = zt_chat_template_config_beside(cfg->tokenizer, tcfg, sizeof tcfg);
    if ((rc = open_template(t, cfg, tcfg, has_tcfg, is0, err)) < 0)
        return rc;
    const bool has_eos = has_tcfg && config_eos(tcfg, eos, sizeof eos);
    const zt_sft_options opt = {.chat_template = t->tmpl, .train_on_prompt = cfg->train_on_prompt,
                                .eos_token = has_eos ? eos : NULL, .vocab_size = t->shape.vocab,
                                .tokenizer_path = cfg->tokenizer};
    int32_t pad = t->shape.pad_token_id;
    if (pad < 0 || pad >= t->shape.vocab)
        pad = 0; /* padding is never attended to by the tokens before it, nor scored */
    t->packed = cfg->sft_pack;
    const zt_sft_batch_options bo = {.B = B, .T = T, .packed = cfg->sft_pack, .shuffle = cfg->shuffle,
                                     .seed = (uint64_t)cfg->seed, .pad_id = pad,
                                     .overlong = cfg->sft_overlong == ZT_OVERLONG_REFUSE ? ZT_SFT_REFUSE
                                                                                         : ZT_SFT_TRUNCATE};
    if (is0)
        zt_log(ZT_LOG_INFO, "sft: chat template %s, %s trained, eos after plain completions: %s; %s; the loss is "
               "the mean over the batch's trained tokens", t->tmpl ? zt_chat_template_name(t->tmpl) : "none",
               cfg->train_on_prompt ? "prompts and answers" : "answers only", has_eos ? eos : "none",
               cfg->sft_pack ? "packed batches (examples first-fit into rows, each attending only within itself, "
                               "positions restarting at 0)"
                             : "padded batches (one example a row)");
    const size_t n = (size_t)B * (size_t)T;
    t->positions = zt_xmalloc(n * sizeof(int32_t));
    t->cu_seqlens = zt_xmalloc((size_t)B * ((size_t)T + 1) * sizeof(int32_t));
    t->nseqs = zt_xmalloc((size_t)B * sizeof(int32_t));
    return open_example_files(t, cfg, &opt, &bo, B, T, cfg->sft_pack, "--seq-len, --sft-overlong truncate", is0,
                              eval_batches, err);
}

/* The next padded or packed batch (its positions kept in t->positions). A batch without a trained token (possible only when every example in it lost its
 * answer) is never trained on: it is skipped with a warning and the next one taken. */
static void next_sft(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types)
{
    (void)key;
    zt_sft_loader *l = val ? t->lval : t->ltrain;
    zt_sft_batch b = {.tokens = tokens, .targets = targets, .positions = t->positions, .cu_seqlens = t->cu_seqlens,
                      .nseqs = t->nseqs};
    const uint64_t limit = zt_sft_loader_batches_per_epoch(l) + 1;
    for (uint64_t tries = 0;; tries++) {
        zt_err err = {{0}};
        if (zt_sft_loader_next(l, &b, &err) == 0)
            break;
        t->untrained++;
        zt_log(ZT_LOG_WARN, "sft: %s; skipped (%lld such batches so far)", err.msg, (long long)t->untrained);
        /* the loader keeps only examples with a trained token, so a whole epoch of such batches cannot be */
        ZT_ASSERT(tries < limit);
    }
    memset(types, 0, t->batch_tokens * sizeof(int32_t));
}

/* ---- sequence-to-sequence (T5): input/target JSONL ---- */

/* The tokenizer and loaders of input/target examples: inputs of T tokens for the encoder, targets of Td
 * tokens for the decoder (cfg->target_len, or T). */
static int open_seq2seq(zt_task *t, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                        zt_err *err)
{
    int rc = zt_tokenizer_load(&t->tokenizer, cfg->tokenizer, err);
    if (rc < 0) {
        zt_err_prefix(err, "--tokenizer");
        return rc;
    }
    t->Td = cfg->target_len > 0 ? (int)cfg->target_len : T;
    const zt_sft_options opt = {.vocab_size = t->shape.vocab, .tokenizer_path = cfg->tokenizer};
    int32_t pad = t->shape.pad_token_id;
    if (pad < 0 || pad >= t->shape.vocab)
        pad = 0;
    const zt_sft_batch_options bo = {.B = B, .T = t->Td, .S = T, .shuffle = cfg->shuffle,
                                     .seed = (uint64_t)cfg->seed, .pad_id = pad,
                                     .decoder_start_id = t->shape.decoder_start_token_id,
                                     .overlong = cfg->sft_overlong == ZT_OVERLONG_REFUSE ? ZT_SFT_REFUSE
                                                                                         : ZT_SFT_TRUNCATE};
    if (is0)
        zt_log(ZT_LOG_INFO, "seq2seq: inputs of %d tokens, targets of %d, decoder start token %d; the loss is the mean "
               "over the batch's target tokens; dropout is not applied", T, t->Td, bo.decoder_start_id);
    t->dec_in = zt_xmalloc((size_t)B * (size_t)t->Td * sizeof(int32_t));
    t->dec_targets = zt_xmalloc((size_t)B * (size_t)t->Td * sizeof(int32_t));
    t->src_len = zt_xmalloc((size_t)B * sizeof(int32_t));
    return open_example_files(t, cfg, &opt, &bo, B, T, false, "--seq-len, --target-len, --sft-overlong truncate",
                              is0, eval_batches, err);
}

/* The next batch: the inputs in tokens [B,T] (padded), the targets at the start of each row of targets [B,T]
 * (the rest -1), the decoder's inputs and the inputs' lengths kept for zt_task_seq2seq. */
static void next_seq2seq(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types)
{
    (void)key;
    zt_sft_loader *l = val ? t->lval : t->ltrain;
    zt_sft_seq2seq_batch b = {.src = tokens, .src_len = t->src_len, .dec_in = t->dec_in, .targets = t->dec_targets};
    const uint64_t limit = zt_sft_loader_batches_per_epoch(l) + 1;
    for (uint64_t tries = 0;; tries++) {
        zt_err err = {{0}};
        if (zt_sft_loader_next_seq2seq(l, &b, &err) == 0)
            break;
        t->untrained++;
        zt_log(ZT_LOG_WARN, "seq2seq: %s; skipped (%lld such batches so far)", err.msg, (long long)t->untrained);
        ZT_ASSERT(tries < limit);
    }
    const size_t T = t->batch_tokens / (size_t)t->rows, Td = (size_t)t->Td;
    for (int r = 0; r < t->rows; r++)
        for (size_t j = 0; j < T; j++)
            targets[(size_t)r * T + j] = j < Td ? t->dec_targets[(size_t)r * Td + j] : -1;
    memset(types, 0, t->batch_tokens * sizeof(int32_t));
}

/* ---- the tasks ---- */

static const task_ops tasks[] = {
    {.name = "causal LM", .kind = ZT_TASK_CAUSAL_LM, .reads_shards = true, .open = open_shards,
     .next = next_shards},
    {.name = "masked LM", .kind = ZT_TASK_MASKED_LM, .reads_shards = true, .reports_accuracy = true,
     .weighs_targets = true, .open = open_masked, .next = next_masked},
    {.name = "classification", .kind = ZT_TASK_CLASSIFY, .reports_accuracy = true, .weighs_targets = true,
     .open = open_labelled, .next = next_labelled},
    {.name = "sequence-to-sequence", .kind = ZT_TASK_SEQ2SEQ, .weighs_targets = true, .open = open_seq2seq,
     .next = next_seq2seq},
};

/* Supervised fine-tuning: a causal LM family, chosen by --sft-data rather than by the model. */
static const task_ops sft_task = {.name = "supervised fine-tuning", .kind = ZT_TASK_CAUSAL_LM,
                                  .weighs_targets = true, .open = open_sft, .next = next_sft};

static const task_ops *task_of(const zt_train_config *cfg)
{
    const enum zt_family_task kind = zt_family_config_task(&cfg->model);
    if (cfg->sft_data[0] && kind == ZT_TASK_CAUSAL_LM)
        return &sft_task;
    for (size_t i = 0; i < sizeof tasks / sizeof tasks[0]; i++)
        if (tasks[i].kind == kind)
            return &tasks[i];
    ZT_ASSERT(!"a family's task has no entry in the task table");
    return NULL;
}

int zt_task_check_paths(const zt_train_config *cfg, zt_err *err)
{
    const task_ops *ops = task_of(cfg);
    const bool sft = ops == &sft_task || ops->kind == ZT_TASK_SEQ2SEQ;
    const char *flags[3] = {"--train-data", "--val-data", "--tokenizer"};
    const char *paths[3] = {sft ? cfg->sft_data : cfg->train_data, sft ? cfg->sft_val_data : cfg->val_data,
                            cfg->tokenizer};
    if (sft) {
        flags[0] = "--sft-data";
        flags[1] = "--sft-val-data";
    }
    for (int i = 0; i < 3; i++) {
        if (i == 2) {
            if (sft && access(paths[2], R_OK) != 0)
                return zt_fail(err, -errno, "--tokenizer: cannot read '%s': %s (give the model's tokenizer.json)",
                               paths[2], strerror(errno));
            continue;
        }
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
            zt_err_prefix(err, flags[i]);
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
    t->rows = B;
    zt_family_config_shape(&cfg->model, &t->shape);
    if (is0)
        zt_log(ZT_LOG_INFO, "task: %s", t->ops->name);
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
    zt_sft_loader_destroy(t->ltrain);
    zt_sft_loader_destroy(t->lval);
    zt_sft_close(t->strain);
    zt_sft_close(t->sval);
    zt_chat_template_destroy(t->tmpl);
    free(t->positions);
    free(t->cu_seqlens);
    free(t->nseqs);
    free(t->dec_in);
    free(t->dec_targets);
    free(t->src_len);
    zt_tokenizer_destroy(t->tokenizer);
    free(t->specials);
    free(t);
}

bool zt_task_has_val(const zt_task *t)
{
    return t->val || t->cval || t->lval;
}

bool zt_task_reports_accuracy(const zt_task *t)
{
    return t->ops->reports_accuracy;
}

bool zt_task_weighs_targets(const zt_task *t)
{
    return t->ops->weighs_targets;
}

bool zt_task_packs(const zt_task *t)
{
    return t->packed;
}

void zt_task_next(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types,
                  int32_t *positions)
{
    t->ops->next(t, val, key, tokens, targets, types);
    if (t->packed && positions)
        memcpy(positions, t->positions, t->batch_tokens * sizeof(int32_t));
}

bool zt_task_seq2seq(const zt_task *t, int row0, zt_model_seq2seq *s)
{
    if (t->ops->kind != ZT_TASK_SEQ2SEQ)
        return false;
    *s = (zt_model_seq2seq){.decoder_tokens = t->dec_in + (size_t)row0 * (size_t)t->Td, .Td = t->Td,
                            .encoder_lens = t->src_len + row0};
    return true;
}

int64_t zt_task_val_begin(zt_task *t, int64_t eval_batches)
{
    if (t->cval) {
        zt_classify_reset(t->cval);
        return (int64_t)zt_classify_batches_per_epoch(t->cval);
    }
    if (t->lval) {
        zt_sft_loader_reset(t->lval);
        return eval_batches;
    }
    zt_dataloader_reset(t->val);
    return eval_batches;
}

void zt_task_get_position(const zt_task *t, zt_data_position *pos)
{
    if (t->ctrain)
        zt_classify_get_position(t->ctrain, pos);
    else if (t->ltrain)
        zt_sft_loader_get_position(t->ltrain, pos);
    else
        zt_dataloader_get_position(t->train, pos);
}

int zt_task_set_position(zt_task *t, const zt_data_position *pos, zt_err *err)
{
    if (t->ltrain)
        return zt_sft_loader_set_position(t->ltrain, pos, err);
    return t->ctrain ? zt_classify_set_position(t->ctrain, pos, err) : zt_dataloader_set_position(t->train, pos, err);
}
