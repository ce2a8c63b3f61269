/* Training tasks: what the training loop (trainer.c) reads for a model and how it weighs and scores it.
 *
 * A task owns its data: causal LM reads token shards and learns the next token; masked LM reads token
 * shards and masks 15% of their tokens as it reads them (BERT's recipe); classification reads labelled
 * texts (JSONL) and tokenizes them with --tokenizer; supervised fine-tuning (a causal LM family given
 * --sft-data) reads JSONL prompts and answers (worker/data/sft.h) and learns the answers' tokens, one example a
 * padded row, or several a row with --sft-pack. The loop calls every task through the same functions: it never branches on which task it runs.
 * The task follows from the model's config (zt_family_config_task) and, for fine-tuning, from --sft-data; a new
 * task (sequence-to-sequence) is one more entry in task.c's table. */
#ifndef ZT_WORKER_TRAIN_TASK_H
#define ZT_WORKER_TRAIN_TASK_H

#include <stdbool.h>
#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"
#include "worker/data/dataloader.h" /* zt_data_position */
#include "worker/models/model.h"     /* zt_model_seq2seq */
#include "worker/train/config.h"

typedef struct zt_task zt_task;

/* Checks, before anything slower, that the data paths of cfg can be read (the first error reported whatever
 * the device): token shards, or the JSONL files of a classifier. */
int zt_task_check_paths(const zt_train_config *cfg, zt_err *err);

/* Opens the task of cfg's model over its data, for global batches of B rows of T tokens; rank 0 (is0) logs
 * what it read. *eval_batches (the configured number of validation batches) is lowered to what the
 * validation data holds. Returns 0 or a negative code with a message naming the flag and file; *out is set
 * on success and freed with zt_task_close. */
int zt_task_open(zt_task **out, const zt_train_config *cfg, int B, int T, bool is0, int64_t *eval_batches,
                 zt_err *err);
void zt_task_close(zt_task *t); /* accepts NULL */

/* Whether validation data was given. */
bool zt_task_has_val(const zt_task *t);
/* Whether the model counts correct predictions (the evaluation reports an accuracy). */
bool zt_task_reports_accuracy(const zt_task *t);
/* Whether the rows of a batch score different numbers of targets (masked tokens, labelled rows): then a
 * rank's micro-batch weighs its share of the batch's scored targets instead of 1 / (grad_accum W). */
bool zt_task_weighs_targets(const zt_task *t);

/* The next global batch of the training data (val false) or the validation data: tokens, targets (-1: not
 * scored) and token types [B, T]. `key` names the batch (step and micro-batch, or the validation batch's
 * number): the draws of a masked LM depend on the seed and key only, so that every rank, a resumed run and
 * every evaluation mask alike. Supervised fine-tuning never hands out a batch without a trained token: it
 * skips such a batch with a warning. */
void zt_task_next(zt_task *t, bool val, uint64_t key, int32_t *tokens, int32_t *targets, int32_t *types,
                  int32_t *positions);
/* Whether the task packs several documents into a row (supervised fine-tuning with --sft-pack): then
 * zt_task_next writes positions [B, T] too, each token's position in its document (worker/models/model.h:
 * zt_model_docs), which the model needs with the tokens; otherwise positions is not written (may be NULL). */
bool zt_task_packs(const zt_task *t);
/* A sequence-to-sequence task (T5): the decoder side of the batch zt_task_next handed out last, for the rows
 * from row0 (a rank's share): the decoder's inputs, their length and the inputs' lengths; the targets are at
 * the start of each row of zt_task_next's targets. Returns false (s untouched) for the other tasks. */
bool zt_task_seq2seq(const zt_task *t, int row0, zt_model_seq2seq *s);
/* Rewinds the validation data and returns the number of batches one evaluation reads (a classifier reads
 * its whole file; the others eval_batches). */
int64_t zt_task_val_begin(zt_task *t, int64_t eval_batches);

/* Where the training data stands, for checkpoints; and the same set back on resume (a message says what
 * differs). */
void zt_task_get_position(const zt_task *t, zt_data_position *pos);
int zt_task_set_position(zt_task *t, const zt_data_position *pos, zt_err *err);

/* BERT's masking of n tokens in place: each token that is not one of the nspecial ids in special is chosen
 * with probability prob; a chosen token becomes mask_id with probability 0.8, a random id below vocab with
 * probability 0.1, or stays as it is; its target is the token, and -1 for the tokens not chosen. Draws from
 * rng (the same stream gives the same masks). Returns the number of chosen tokens. */
size_t zt_task_mask_tokens(int32_t *tokens, int32_t *targets, size_t n, int32_t mask_id, int vocab,
                           const int32_t *special, int nspecial, zt_rng *rng, float prob);

#endif
