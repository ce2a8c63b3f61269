/* `ztrain tokenize`: turns text files into token shards for `ztrain train`.
 *
 * The inputs are read whole, encoded one by one (with the byte-level tokenizer, or a Hugging Face
 * tokenizer.json given with --tokenizer) and their tokens concatenated in the order given, then split into a
 * training part (the beginning of the text) and a validation part (its last --val-fraction),
 * each written as shards of at most --shard-tokens tokens: DIR/NAME_train_000000.bin, ... and
 * DIR/NAME_val_000000.bin, .... Every file is written atomically; if one write fails, the files this run
 * already wrote are removed, so a failed run leaves no half-made data set. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/args.h"
#include "common/fileio.h"
#include "common/status.h"
#include "worker/cli/commands.h"
#include "worker/data/dataloader.h"
#include "worker/data/tokenize.h"

#define MAX_SHARD_FILES 1000000 /* the file index has six digits */
#define MAX_NAME_LEN 100

static const char usage_text[] =
    "usage: ztrain tokenize --input FILE [--input FILE...] --out-dir DIR [--val-fraction F]\n"
    "                       [--shard-tokens N] [--name PREFIX] [--tokenizer tokenizer.json]\n"
    "                       [--add-special-tokens]\n"
    "\n"
    "Turns text into token shards for 'ztrain train' (by default with the byte-level tokenizer: one token\n"
    "per byte, vocab 256). The tokens of the input files are concatenated in the order given. The last F of\n"
    "the tokens become the validation data, the rest (the beginning of the text) the training data.\n"
    "\n"
    "  --input FILE        text file to tokenize; repeat for several files (required)\n"
    "  --out-dir DIR       folder for the shards, created if missing (required)\n"
    "  --val-fraction F    fraction of the tokens kept for validation, 0 to 0.9 (default 0.1;\n"
    "                      0 writes no validation shard)\n"
    "  --shard-tokens N    at most N tokens per shard file (default 100000000)\n"
    "  --name PREFIX       file name prefix: letters, digits, '.', '_', '-' (default: the first input's\n"
    "                      name without its extension)\n"
    "  --tokenizer FILE    a Hugging Face tokenizer.json (BPE as GPT-2, LLaMA-2 or LLaMA-3, or WordPiece as\n"
    "                      BERT; the text must be UTF-8); the shards hold 16-bit ids, or 32-bit ones for\n"
    "                      more than 65536 ids\n"
    "  --add-special-tokens  put the tokenizer's special tokens around each input file ([CLS] ... [SEP],\n"
    "                      <|begin_of_text|> ...), as its post-processor says; off by default\n"
    "  --help              print this help\n"
    "\n"
    "Writes DIR/PREFIX_train_000000.bin, ... and DIR/PREFIX_val_000000.bin, ...; train on them with\n"
    "  ztrain train --train-data 'DIR/PREFIX_train_*.bin' --val-data 'DIR/PREFIX_val_*.bin' ...\n";

struct tokenize_opts {
    const char **inputs; /* borrowed from argv */
    int ninputs;
    const char *out_dir;
    double val_fraction;
    int64_t shard_tokens;
    char name[MAX_NAME_LEN + 1];
    const char *tokenizer; /* tokenizer.json, or NULL for bytes; borrowed from argv */
    bool add_special;
};

/* Prints one "ztrain: error: ..." line for a usage mistake and returns exit status 2. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ztrain: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see 'ztrain tokenize --help')\n", stderr);
    va_end(ap);
    return 2;
}

/* Prints one "ztrain: error: ..." line for a failure at run time and returns exit status 1. */
static int runtime_error(const char *msg)
{
    fprintf(stderr, "ztrain: error: %s\n", msg);
    return 1;
}

static bool name_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}

/* The default prefix: the first input's file name without its extension, other characters replaced by
 * '_' ("data/corpus.txt" gives "corpus"). */
static void default_name(const char *input, char *name)
{
    const char *base = strrchr(input, '/');
    base = base ? base + 1 : input;
    size_t len = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot && dot != base)
        len = (size_t)(dot - base);
    if (len > MAX_NAME_LEN)
        len = MAX_NAME_LEN;
    for (size_t i = 0; i < len; i++)
        name[i] = name_char_ok(base[i]) ? base[i] : '_';
    name[len] = '\0';
    if (len == 0)
        strcpy(name, "data");
}

/* Parses argv into o. Returns -1 to go on, or the exit status to return now (0 after --help, 2 on a
 * usage error, with its message printed). */
static int parse_args(int argc, char **argv, struct tokenize_opts *o)
{
    static const struct option longopts[] = {
        {"input", required_argument, NULL, 'i'},      {"out-dir", required_argument, NULL, 'o'},
        {"val-fraction", required_argument, NULL, 'v'}, {"shard-tokens", required_argument, NULL, 's'},
        {"name", required_argument, NULL, 'n'},       {"help", no_argument, NULL, 'h'},
        {"tokenizer", required_argument, NULL, 't'},  {"add-special-tokens", no_argument, NULL, 'a'},
        {NULL, 0, NULL, 0},
    };
    const char *name = NULL;
    zt_err err;
    int c;
    optind = 0; /* a full rescan, so that the command can run more than once in one process */
    opterr = 0; /* our own messages, in the "ztrain: error: " form */
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case 'i':
            if (optarg[0] == '\0')
                return usage_error("--input: expected a file name, got an empty string");
            o->inputs[o->ninputs++] = optarg;
            break;
        case 'o':
            if (optarg[0] == '\0')
                return usage_error("--out-dir: expected a folder name, got an empty string");
            o->out_dir = optarg;
            break;
        case 'v':
            if (zt_arg_double("--val-fraction", optarg, 0.0, 0.9, &o->val_fraction, &err) != 0)
                return usage_error("%s", err.msg);
            break;
        case 's':
            if (zt_arg_int("--shard-tokens", optarg, 1, INT32_MAX, &o->shard_tokens, &err) != 0)
                return usage_error("%s", err.msg);
            break;
        case 'n':
            name = optarg;
            break;
        case 't':
            if (optarg[0] == '\0')
                return usage_error("--tokenizer: expected a tokenizer.json file, got an empty string");
            o->tokenizer = optarg;
            break;
        case 'a':
            o->add_special = true;
            break;
        case ':':
            return usage_error("%s needs a value", argv[optind - 1]);
        default:
            if (optopt != 0)
                return usage_error("unknown flag '-%c' for 'ztrain tokenize'", optopt);
            return usage_error("unknown flag '%s' for 'ztrain tokenize'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'; give each input file with its own --input", argv[optind]);
    if (o->ninputs == 0)
        return usage_error("missing --input FILE (the text to tokenize)");
    if (!o->out_dir)
        return usage_error("missing --out-dir DIR (where to write the shards)");
    if (name) {
        size_t len = strlen(name);
        if (len == 0 || len > MAX_NAME_LEN)
            return usage_error("--name: expected 1 to %d characters, got '%s'", MAX_NAME_LEN, name);
        for (size_t i = 0; i < len; i++)
            if (!name_char_ok(name[i]))
                return usage_error("--name: '%s' has the character '%c'; use only letters, digits, '.', '_' and "
                                   "'-'",
                                   name, name[i]);
        memcpy(o->name, name, len + 1);
    } else {
        default_name(o->inputs[0], o->name);
    }
    return -1;
}

/* Reads and encodes every input, concatenating the tokens. Returns 0 with *tokens (malloc'd), *ntok and the
 * number of text bytes read, or a negative code with a message in err. */
static int encode_inputs(const struct tokenize_opts *o, const zt_tokenizer *tok, int32_t **tokens, size_t *ntok,
                         size_t *text_len, zt_err *err)
{
    int32_t *all = NULL;
    size_t total = 0;
    *text_len = 0;
    for (int i = 0; i < o->ninputs; i++) {
        char *buf;
        size_t n;
        int32_t *t;
        size_t nt;
        int rc = zt_read_file(o->inputs[i], &buf, &n, err);
        if (rc == 0) {
            rc = zt_tokenizer_encode_flags(tok, buf, n, o->add_special ? ZT_TOKENIZE_ADD_SPECIAL : 0, &t, &nt, err);
            free(buf);
            if (rc != 0) { /* name the file: the message says what is wrong with its text */
                zt_err inner = *err;
                zt_fail(err, rc, "%s: %s", o->inputs[i], inner.msg);
            }
        }
        if (rc != 0) {
            free(all);
            return rc;
        }
        *text_len += n;
        int32_t *bigger = nt ? realloc(all, (total + nt) * sizeof(int32_t)) : all;
        if (nt && !bigger) {
            free(t);
            free(all);
            return zt_fail(err, ZT_ENOMEM, "out of memory tokenizing %s (%zu tokens so far)", o->inputs[i], total + nt);
        }
        all = bigger;
        if (nt)
            memcpy(all + total, t, nt * sizeof(int32_t));
        total += nt;
        free(t);
    }
    *tokens = all;
    *ntok = total;
    return 0;
}

/* Parses "<name>_<split>_DDDDDD.bin"; returns true and the index if entry is such a file. */
static bool parse_shard_name(const char *entry, const char *name, const char *split, long *index)
{
    size_t nl = strlen(name), sl = strlen(split);
    if (strncmp(entry, name, nl) != 0 || entry[nl] != '_' || strncmp(entry + nl + 1, split, sl) != 0 ||
        entry[nl + 1 + sl] != '_')
        return false;
    const char *d = entry + nl + 1 + sl + 1;
    for (int i = 0; i < 6; i++)
        if (d[i] < '0' || d[i] > '9')
            return false;
    if (strcmp(d + 6, ".bin") != 0)
        return false;
    *index = strtol(d, NULL, 10);
    return true;
}

/* Refuses to run when the folder holds shards of the same name that this run would not overwrite: the
 * training glob would pick up the old and the new data together. */
static int check_stale_shards(const struct tokenize_opts *o, size_t ntrain_files, size_t nval_files, zt_err *err)
{
    DIR *d = opendir(o->out_dir);
    if (!d) {
        int e = errno;
        return zt_fail(err, -e, "cannot list --out-dir '%s': %s", o->out_dir, strerror(e));
    }
    int rc = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        long idx;
        const char *split = NULL;
        if (parse_shard_name(ent->d_name, o->name, "train", &idx) && (size_t)idx >= ntrain_files)
            split = "train";
        else if (parse_shard_name(ent->d_name, o->name, "val", &idx) && (size_t)idx >= nval_files)
            split = "val";
        if (split) {
            rc = zt_fail(err, -EEXIST,
                         "%s/%s is left from an earlier run and this run would not replace it, so training on "
                         "'%s/%s_%s_*.bin' would mix old and new data; delete the old shards (rm %s/%s_*.bin) "
                         "or choose another --name",
                         o->out_dir, ent->d_name, o->out_dir, o->name, split, o->out_dir, o->name);
            break;
        }
    }
    closedir(d);
    return rc;
}

static size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* Paths written so far, removed again if a later write fails. */
struct written {
    char **paths;
    size_t n;
};

static void remove_written(struct written *w)
{
    for (size_t i = 0; i < w->n; i++)
        unlink(w->paths[i]);
}

/* Writes tokens[0..n) as shards DIR/NAME_<split>_%06d.bin of at most per_shard tokens each, printing
 * one line per file: 16-bit tokens, or 32-bit ones (wide) for a vocabulary above 65536 ids. buf holds
 * per_shard tokens of the width. Returns 0 or a negative code with a message in err. */
static int write_split(const struct tokenize_opts *o, const char *split, const int32_t *tokens, size_t n,
                       size_t per_shard, bool wide, void *buf, struct written *w, zt_err *err)
{
    for (size_t start = 0, index = 0; start < n; start += per_shard, index++) {
        size_t count = n - start < per_shard ? n - start : per_shard;
        for (size_t i = 0; i < count; i++) {
            if (wide)
                ((uint32_t *)buf)[i] = (uint32_t)tokens[start + i];
            else
                ((uint16_t *)buf)[i] = (uint16_t)tokens[start + i];
        }
        char path[PATH_MAX];
        if (snprintf(path, sizeof(path), "%s/%s_%s_%06zu.bin", o->out_dir, o->name, split, index) >=
            (int)sizeof(path))
            return zt_fail(err, -ENAMETOOLONG, "--out-dir '%s': path too long", o->out_dir);
        int rc = wide ? zt_shard_write32(path, buf, count, err) : zt_shard_write(path, buf, count, err);
        if (rc != 0)
            return rc;
        w->paths[w->n] = strdup(path);
        if (!w->paths[w->n]) {
            unlink(path);
            return zt_fail(err, ZT_ENOMEM, "out of memory after writing %s", path);
        }
        w->n++;
        printf("wrote %s (%zu tokens)\n", path, count);
        fflush(stdout); /* in order with the error lines on stderr */
    }
    return 0;
}

int zt_cmd_tokenize(int argc, char **argv)
{
    struct tokenize_opts o = {.val_fraction = 0.1, .shard_tokens = 100000000};
    o.inputs = calloc((size_t)(argc > 0 ? argc : 1), sizeof(*o.inputs));
    if (!o.inputs)
        return runtime_error("out of memory parsing the command line");
    int status = parse_args(argc, argv, &o);
    if (status >= 0) {
        free(o.inputs);
        return status;
    }

    zt_err err;
    size_t text_len = 0;
    int32_t *tokens = NULL;
    size_t ntok = 0;
    zt_tokenizer *tok = NULL;
    void *buf = NULL;
    struct written w = {0};
    status = 1;

    int rc = o.tokenizer ? zt_tokenizer_load(&tok, o.tokenizer, &err) : zt_tokenizer_create(&tok, "bytes", &err);
    if (rc != 0) {
        runtime_error(err.msg);
        goto done;
    }
    const bool wide = zt_tokenizer_vocab_size(tok) > 65536; /* 32-bit shards (llm.c's LLaMA-3 format) */
    if (encode_inputs(&o, tok, &tokens, &ntok, &text_len, &err) != 0) {
        runtime_error(err.msg);
        goto done;
    }
    if (text_len == 0) {
        fprintf(stderr, "ztrain: error: the input is empty (%s%s): give text files with some content\n",
                o.inputs[0], o.ninputs > 1 ? " and the other --input files" : "");
        goto done;
    }

    if (ntok == 0) { /* text such as only spaces, which a tokenizer that splits on whitespace drops */
        fprintf(stderr,
                "ztrain: error: the input (%s%s) has %zu bytes but no text that the tokenizer turns into tokens: "
                "give a file with words in it\n",
                o.inputs[0], o.ninputs > 1 ? " and the other --input files" : "", text_len);
        goto done;
    }

    /* Validation is the end of the text, so that training starts at its beginning. */
    size_t nval = 0;
    if (o.val_fraction > 0) {
        nval = (size_t)llround((double)ntok * o.val_fraction);
        if (nval == 0)
            nval = 1;
    }
    if (nval >= ntok) {
        fprintf(stderr,
                "ztrain: error: the input has %zu token(s), too few to split into training and validation data; "
                "give more text or --val-fraction 0\n",
                ntok);
        goto done;
    }
    size_t ntrain = ntok - nval;
    size_t per_shard = (size_t)o.shard_tokens;
    size_t ntrain_files = ceil_div(ntrain, per_shard);
    size_t nval_files = ceil_div(nval, per_shard);
    if (ntrain_files > MAX_SHARD_FILES || nval_files > MAX_SHARD_FILES) {
        status = usage_error("--shard-tokens %" PRId64 " would make more than %d files of %zu tokens; raise it",
                             o.shard_tokens, MAX_SHARD_FILES, ntok);
        goto done;
    }

    if (zt_mkdir_p(o.out_dir, &err) != 0) {
        fprintf(stderr, "ztrain: error: --out-dir: %s (choose another folder)\n", err.msg);
        goto done;
    }
    if (access(o.out_dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "ztrain: error: cannot write to --out-dir '%s': %s (choose another folder or fix its "
                        "permissions)\n",
                o.out_dir, strerror(errno));
        goto done;
    }
    if (check_stale_shards(&o, ntrain_files, nval_files, &err) != 0) {
        runtime_error(err.msg);
        goto done;
    }

    size_t largest_split = ntrain > nval ? ntrain : nval;
    buf = malloc((largest_split < per_shard ? largest_split : per_shard) * (wide ? 4 : 2));
    w.paths = calloc(ntrain_files + nval_files, sizeof(char *));
    if (!buf || !w.paths) {
        runtime_error("out of memory for the shard buffer; lower --shard-tokens");
        goto done;
    }
    if (write_split(&o, "train", tokens, ntrain, per_shard, wide, buf, &w, &err) != 0 ||
        write_split(&o, "val", tokens + ntrain, nval, per_shard, wide, buf, &w, &err) != 0) {
        remove_written(&w);
        if (w.n > 0)
            fprintf(stderr, "ztrain: error: %s (removed the %zu shard file(s) this run had written)\n", err.msg,
                    w.n);
        else
            runtime_error(err.msg);
        goto done;
    }
    printf("tokenized %zu bytes from %d file(s) with the '%s' tokenizer (vocab %d): %zu train tokens in %zu "
           "shard(s), %zu val tokens in %zu shard(s), %d-bit tokens\n",
           text_len, o.ninputs, zt_tokenizer_kind(tok), zt_tokenizer_vocab_size(tok), ntrain, ntrain_files, nval,
           nval_files, wide ? 32 : 16);
    printf("train on them with: --train-data '%s/%s_train_*.bin'", o.out_dir, o.name);
    if (nval > 0)
        printf(" --val-data '%s/%s_val_*.bin'", o.out_dir, o.name);
    printf("\n");
    fflush(stdout);
    status = 0;

done:
    for (size_t i = 0; i < w.n; i++)
        free(w.paths[i]);
    free(w.paths);
    free(buf);
    free(tokens);
    zt_tokenizer_destroy(tok);
    free(o.inputs);
    return status;
}
