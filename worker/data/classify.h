/* Sequence-classification examples from a JSONL file, tokenized once at open and served in batches.
 *
 * Each line is an object {"text": "...", "text_pair": "..." (optional), "label": 2 or "positive"}; blank
 * lines are skipped. A label is an integer in [0, num_labels) or one of the model's label names (its
 * config's id2label). A text, or a pair, is encoded as the tokenizer's post-processor lays it out
 * ([CLS] A [SEP] B [SEP] for BERT, with token types 0 and 1), truncated to T tokens ("longest_first", as
 * transformers does with truncation=True and max_length=T), and padded on the right with pad_id.
 *
 * A batch is B examples: row b holds the tokens, types and, at position 0 of its targets, the label
 * (the other targets are -1: the layout of zt_bert_forward's classification loss). An epoch visits every
 * example once, in file order or, with shuffle, in an order drawn from (seed, epoch); its last batch is
 * filled up with examples from the epoch's start whose labels are -1 (they are read but not scored), so
 * every example counts once per epoch. A position (epoch, batch) restores the sequence of batches
 * exactly. */
#ifndef ZT_WORKER_DATA_CLASSIFY_H
#define ZT_WORKER_DATA_CLASSIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/data/dataloader.h" /* zt_data_position */
#include "worker/data/tokenize.h"

typedef struct zt_classify_data zt_classify_data; /* opaque */

/* How labels are read: num_labels classes, and the name of each (names[i], NULL or "" where a class has
 * no name; names may be NULL). */
typedef struct zt_classify_labels {
    int num_labels;
    const char *const *names;
} zt_classify_labels;

/* Reads and tokenizes every example of the JSONL file at path for B x T batches. Token ids must be below
 * vocab_size (the model's). Errors name the file, the line and the fix: a line that is not a JSON object,
 * a missing or non-string "text", a "text_pair" that is not a string, a missing label, a label out of
 * range or not among the names, a token id outside the model's vocabulary, a file without examples.
 * Returns 0, -errno (the file), ZT_EINVAL_CONFIG, ZT_EFORMAT or ZT_ENOMEM. */
int zt_classify_open(zt_classify_data **out, const char *path, const zt_tokenizer *tok, int vocab_size, int pad_id,
                     const zt_classify_labels *labels, int B, int T, bool shuffle, uint64_t seed, zt_err *err);
void zt_classify_close(zt_classify_data *d); /* accepts NULL */

/* Examples in the file, and how many of them were cut to T tokens. */
size_t zt_classify_examples(const zt_classify_data *d);
size_t zt_classify_truncated(const zt_classify_data *d);
/* Batches in one epoch: ceil(examples / B). */
uint64_t zt_classify_batches_per_epoch(const zt_classify_data *d);

/* The next batch: tokens, types and targets, B x T each. */
void zt_classify_next(zt_classify_data *d, int32_t *tokens, int32_t *types, int32_t *targets);
/* Back to the start of epoch 0. */
void zt_classify_reset(zt_classify_data *d);
/* The position of the next batch (shard is always 0; window is the batch index in the epoch). */
void zt_classify_get_position(const zt_classify_data *d, zt_data_position *pos);
/* Moves to pos; ZT_EINVAL_CONFIG when the file has no such batch (another file, or another B). */
int zt_classify_set_position(zt_classify_data *d, const zt_data_position *pos, zt_err *err);

#endif
