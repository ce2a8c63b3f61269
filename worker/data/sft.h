/* Supervised fine-tuning data: JSONL records tokenized once (and cached) into examples whose tokens carry a
 * "trained" flag, and batches of them, packed several to a row or padded one to a row.
 *
 * Records, one JSON object a line (blank lines skipped); a file holds one format, told by the fields of its
 * first record:
 *   prompt / completion   {"prompt": "...", "completion": "..."}: the text prompt + completion as written
 *                         (no template), with the tokenizer's special tokens around it (LLaMA's <s>) and the
 *                         eos token after the completion; the completion and eos are trained.
 *   alpaca                {"instruction": "...", "input": "..." (optional), "output": "...", "system": "..."
 *                         (optional)}: with a chat template, a chat of one user turn (the instruction, then a
 *                         blank line and the input when there is one) and one assistant turn (the output);
 *                         without one, Stanford Alpaca's prompt ("Below is an instruction that describes a
 *                         task... ### Instruction:\n...\n\n### Response:\n") followed by the output and eos.
 *   chat                  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}:
 *                         rendered by the chat template (worker/data/chat_template.h) exactly as transformers'
 *                         apply_chat_template renders it, tokenized as a whole (the template writes the bos);
 *                         every assistant turn is trained (content and end-of-turn marker). A chat needs at
 *                         least one assistant message.
 *   input / target        {"input": "...", "target": "..."}: a sequence-to-sequence example (T5): the input's
 *                         tokens (with the tokenizer's special tokens, T5's </s>) for the encoder, the
 *                         target's for the decoder, all trained.
 * With train_on_prompt every token is trained (prompts, system and user turns too).
 *
 * Token flags mark what is predicted: trained[i] means the loss includes predicting token i from the tokens
 * before it. Examples with no trained token (an empty completion without eos, or one that truncation cut
 * away) are dropped and reported (a warning with the file and line), never trained on silently.
 *
 * A bad record is an error naming file:line, the problem and the fix: a line that is not a JSON object, a
 * missing or non-string field, an unknown role, a chat without an assistant turn or that breaks its
 * template's rules, a chat without a template, an input without a target, a record of another format than
 * the file's first, a token outside the model's vocabulary.
 *
 * Cache: the examples are saved next to the data (or in cache_dir) as DATA.<key>.sftcache, where key hashes
 * the data file, the tokenizer file, the template and the options; a later open with the same key reads the
 * cache instead of tokenizing. A change of any of them gives another key, so a stale cache is never read
 * (old cache files stay until removed). A directory that cannot be written only costs the cache (logged).
 *
 * Batches (zt_sft_loader): B rows of T tokens with, per token, the target (the next token of the same
 * example when that one is trained, else -1: prompts, padding and the last token of each example never
 * have one), the position inside its example (restarting at 0 for each), and per row the cumulative offsets
 * of its sequences (cu_seqlens: 0, end of the first example, ..., T; padding at the end of a row is one more
 * sequence, with no targets), so attention can stay inside each example. Packed: examples in the epoch's
 * order are placed first-fit into rows (among the last 64 rows opened) and rows go out in the order they
 * were opened. Padded: one example per row. An example longer than T is truncated to T tokens or refused,
 * as the options say; both are counted and logged. An epoch visits every example once, in file order or
 * in an order drawn from (seed, epoch); a position (epoch, batch) restores the sequence of batches. A
 * validation file is opened the same way, and read without shuffling. */
#ifndef ZT_WORKER_DATA_SFT_H
#define ZT_WORKER_DATA_SFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/data/chat_template.h"
#include "worker/data/dataloader.h" /* zt_data_position */
#include "worker/data/tokenize.h"

typedef struct zt_sft_data zt_sft_data;     /* opaque: the tokenized examples of one file */
typedef struct zt_sft_loader zt_sft_loader; /* opaque: batches over a zt_sft_data */

/* The record formats (saved in caches: only grows). */
enum zt_sft_format {
    ZT_SFT_PROMPT_COMPLETION = 1,
    ZT_SFT_ALPACA = 2,
    ZT_SFT_CHAT = 3,
    ZT_SFT_SEQ2SEQ = 4,
};

/* How a file is read. Zero-initialised fields mean: no template, prompts not trained, no eos appended, no
 * vocabulary check, no cache. */
typedef struct zt_sft_options {
    const zt_chat_template *chat_template; /* NULL: none (chat records are refused; alpaca uses its prompt) */
    bool train_on_prompt;                  /* train on every token, prompts included */
    const char *eos_token;                 /* appended (trained) after completions and alpaca outputs read
                                            * without a template, such as "</s>"; NULL: nothing appended */
    int vocab_size;                        /* the model's: every token id must be below it; 0: no check */
    const char *tokenizer_path;            /* the tokenizer.json tok was loaded from, for the cache key;
                                            * NULL: no cache */
    const char *cache_dir;                 /* where caches go; NULL: next to the data file */
} zt_sft_options;

/* Reads and tokenizes the JSONL file at path with tok (or reads its cache), as the header says. Returns 0
 * and *out (freed with zt_sft_close), a negative errno (the file), ZT_EFORMAT (a line that is not a JSON
 * object), ZT_EINVAL_CONFIG (a bad record, no examples) or ZT_ENOMEM, with a message naming file:line and
 * the fix. Logs one line with the counts (examples, tokens, trained tokens, dropped, from cache or not). */
int zt_sft_open(zt_sft_data **out, const char *path, const zt_tokenizer *tok, const zt_sft_options *opt,
                zt_err *err);
/* Frees the examples; accepts NULL. Loaders made over d must be destroyed first. */
void zt_sft_close(zt_sft_data *d);

/* What a file held. */
typedef struct zt_sft_stats {
    enum zt_sft_format format;
    size_t examples;       /* kept */
    size_t dropped;        /* records without a trained token */
    uint64_t tokens;       /* of the kept examples (decoder side) */
    uint64_t trained;      /* tokens flagged trained */
    size_t longest;        /* tokens of the longest example */
    bool from_cache;
} zt_sft_stats;
void zt_sft_get_stats(const zt_sft_data *d, zt_sft_stats *s);

/* One example, borrowed from d (valid until zt_sft_close). */
typedef struct zt_sft_example {
    const int32_t *ids;     /* [n] tokens (the decoder's, for input/target records) */
    const uint8_t *trained; /* [n] 1 where the token is trained */
    size_t n;
    const int32_t *src;     /* [nsrc] encoder tokens of an input/target record; NULL otherwise */
    size_t nsrc;
    size_t line;            /* the line of the file it came from */
} zt_sft_example;
size_t zt_sft_count(const zt_sft_data *d);
/* Points ex at example i (< zt_sft_count). */
void zt_sft_get(const zt_sft_data *d, size_t i, zt_sft_example *ex);

/* Tokenizes text with flags (enum zt_tokenize_flag) as one piece, and flags as trained the tokens that fall
 * inside spans (byte ranges, in order, not overlapping): a token belongs to the range that holds its last
 * byte. Token boundaries come from the tokenizer itself (the ids of each span's start and end prefix of the
 * text), so the ids are exactly those of the whole text. *ids and *trained are malloc'd, *n entries each
 * (freed by the caller). Returns 0, ZT_EFORMAT (not UTF-8) or ZT_ENOMEM. */
int zt_sft_encode_spans(const zt_tokenizer *tok, const char *text, size_t len, unsigned flags,
                        const zt_text_span *spans, int nspans, int32_t **ids, uint8_t **trained, size_t *n,
                        zt_err *err);

/* Renders a conversation with tmpl and tokenizes it as zt_sft_encode_spans does (the template writes its
 * special tokens: no others are added), for generation (add_generation_prompt) or for checks. */
int zt_sft_encode_chat(const zt_tokenizer *tok, const zt_chat_template *tmpl, const zt_chat_message *msgs, int n,
                       bool add_generation_prompt, int32_t **ids, uint8_t **trained, size_t *ntok, zt_err *err);

/* What to do with an example longer than T tokens. */
enum zt_sft_overlong { ZT_SFT_TRUNCATE, ZT_SFT_REFUSE };

typedef struct zt_sft_batch_options {
    int B, T;                      /* rows, tokens a row (the decoder's, for input/target data) */
    bool packed;                   /* several examples a row; false: one, padded */
    bool shuffle;
    uint64_t seed;
    int32_t pad_id;                /* token written where a row has no example */
    enum zt_sft_overlong overlong;
    int S;                         /* input/target data only: encoder tokens a row */
    int32_t decoder_start_id;      /* input/target data only: the decoder's first input (T5: the pad id) */
} zt_sft_batch_options;

/* One batch, in buffers the caller allocates (B*T int32 for tokens, targets and positions; B*(T+1) for
 * cu_seqlens; B for nseqs). */
typedef struct zt_sft_batch {
    int32_t *tokens;     /* [B*T] */
    int32_t *targets;    /* [B*T] the next token, or -1 */
    int32_t *positions;  /* [B*T] position inside the token's example */
    int32_t *cu_seqlens; /* [B*(T+1)]: row b's offsets at cu_seqlens[b*(T+1) + 0 .. nseqs[b]] (0 ... T) */
    int32_t *nseqs;      /* [B] sequences in row b (examples, plus one for padding at its end) */
    int64_t trained;     /* out: targets that are not -1 */
    int examples;        /* out: examples in the batch */
} zt_sft_batch;

/* Makes a loader over d (borrowed; it must outlive the loader). For input/target data the loader serves
 * sequence-to-sequence batches (zt_sft_loader_next_seq2seq; o->S > 0, not packed); for the other formats
 * decoder batches (zt_sft_loader_next). Examples longer than T (or inputs longer than S): with
 * ZT_SFT_REFUSE, ZT_EINVAL_CONFIG naming how many and the file:line of the first; with ZT_SFT_TRUNCATE
 * they keep their first T tokens (and S input tokens; those left without a trained token are dropped),
 * counted and logged. Returns 0 and *out, or ZT_EINVAL_CONFIG. */
int zt_sft_loader_create(zt_sft_loader **out, const zt_sft_data *d, const zt_sft_batch_options *o, zt_err *err);
void zt_sft_loader_destroy(zt_sft_loader *l); /* accepts NULL */

/* Examples truncated to T, and examples dropped because truncation left them without a trained token. */
size_t zt_sft_loader_truncated(const zt_sft_loader *l);
size_t zt_sft_loader_dropped(const zt_sft_loader *l);
/* Batches in the current epoch (with packing and shuffling, epochs may differ by a batch or so). */
uint64_t zt_sft_loader_batches_per_epoch(const zt_sft_loader *l);
/* The rows of the current epoch holding examples, and the tokens of those examples: their ratio to
 * rows * T is how full packing keeps the rows. */
uint64_t zt_sft_loader_rows(const zt_sft_loader *l);
uint64_t zt_sft_loader_tokens(const zt_sft_loader *l);
/* The examples an epoch visits (those that fit in T tokens, or keep a trained token once truncated). */
size_t zt_sft_loader_examples(const zt_sft_loader *l);

/* Writes the next batch into b and advances (a new epoch after the last batch). Returns 0, or ZT_ESTATE
 * with a message when the batch has no trained target (the caller must not step on it silently; the
 * loader has advanced past it). */
int zt_sft_loader_next(zt_sft_loader *l, zt_sft_batch *b, zt_err *err);

/* A sequence-to-sequence batch (input/target data), one example a row, in caller-allocated buffers. */
typedef struct zt_sft_seq2seq_batch {
    int32_t *src;        /* [B*S] the input's tokens, then pad_id */
    int32_t *src_len;    /* [B] tokens of each input (0 for an empty row) */
    int32_t *dec_in;     /* [B*T] decoder inputs: decoder_start_id, then the target shifted right, then pad_id */
    int32_t *targets;    /* [B*T] the target's tokens, then -1 */
    int64_t trained;     /* out: targets that are not -1 */
    int examples;        /* out */
} zt_sft_seq2seq_batch;
/* Writes the next sequence-to-sequence batch and advances, as zt_sft_loader_next does. */
int zt_sft_loader_next_seq2seq(zt_sft_loader *l, zt_sft_seq2seq_batch *b, zt_err *err);
/* Back to the start of epoch 0. */
void zt_sft_loader_reset(zt_sft_loader *l);
/* The position of the next batch (shard is always 0; window is the batch index in the epoch). */
void zt_sft_loader_get_position(const zt_sft_loader *l, zt_data_position *pos);
/* Moves to pos; ZT_EINVAL_CONFIG when the epoch has no such batch. */
int zt_sft_loader_set_position(zt_sft_loader *l, const zt_data_position *pos, zt_err *err);

#endif
