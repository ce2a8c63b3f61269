/* `ztrain generate`: loads a trained model (a checkpoint or run directory, or exported weights plus their
 * config.json), prints the prompt and streams sampled text to stdout as it is generated. With --chat, the
 * prompt is a conversation rendered by the model's chat template (as supervised fine-tuning renders it),
 * and only the assistant's reply is printed, up to the template's end-of-turn marker. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/fileio.h"
#include "common/json.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/cli/commands.h"
#include "worker/data/chat_template.h"
#include "worker/data/tokenize.h"
#include "worker/train/generate.h"

/* The Unicode replacement character, printed for a token the tokenizer has no bytes for. */
static const char replacement_char[] = "\xEF\xBF\xBD";

static const char usage_text[] =
    "usage: ztrain generate (--checkpoint DIR | --weights FILE.safetensors --model config.json)\n"
    "                       [--prompt TEXT | --chat FILE [--chat-template NAME]] [--max-new-tokens N]\n"
    "                       [--temperature X] [--top-k N] [--seed N] [--num-beams K [--length-penalty X]]\n"
    "                       [--ignore-eos]\n"
    "                       [--tokenizer tokenizer.json [--add-special-tokens]]\n"
    "\n"
    "Generates text from a trained model (GPT-2, LLaMA, Mistral, Qwen2, GPT-NeoX, T5) on the CPU and writes\n"
    "the prompt and the generated text to stdout (with --chat, the reply only).\n"
    "\n"
    "  --checkpoint DIR      a checkpoint directory (ckpt_000500/) or a run directory, whose newest\n"
    "                        checkpoint (named in its 'latest' file) is used\n"
    "  --weights FILE        weights exported by 'ztrain export' (or any GPT-2 safetensors with\n"
    "                        Hugging Face names); needs --model\n"
    "  --model FILE          the Hugging Face config.json that goes with --weights\n"
    "  --prompt TEXT         text to continue (default: empty, which starts from a newline)\n"
    "  --chat FILE           a conversation to answer: a JSON object {\"messages\": [{\"role\": \"user\",\n"
    "                        \"content\": \"...\"}, ...]} as in fine-tuning data, ending with a user message;\n"
    "                        rendered by the chat template, and only the reply is printed (it ends at the\n"
    "                        template's end-of-turn marker)\n"
    "  --chat-template NAME  the template for --chat (default: the chat_template of the tokenizer_config.json\n"
    "                        beside --tokenizer); one of chatml, qwen2, qwen2.5, llama2, llama3, llama3.1,\n"
    "                        mistral, gemma, gemma3, phi3\n"
    "  --max-new-tokens N    tokens to generate (default 200)\n"
    "  --temperature X       0 picks the most likely token every time; higher is more random (default 0.8)\n"
    "  --top-k N             sample among the N most likely tokens; 0 = all (default 40)\n"
    "  --seed N              the same seed gives the same text (default 1337)\n"
    "  --num-beams K         beam search over K beams instead of sampling (as transformers' generate with\n"
    "                        num_beams=K); hypotheses end at the end-of-sequence ids (a chat's also at\n"
    "                        the end-of-turn token) or after --max-new-tokens; the best is printed at the end\n"
    "  --length-penalty X    beam search: a finished hypothesis scores its log-probability over its length\n"
    "                        to the power X (default 1; 0 compares sums, > 0 favours longer ones)\n"
    "  --ignore-eos          a decoder goes on past the end-of-sequence ids of its config.json's\n"
    "                        eos_token_id (by default generation stops there, as transformers' does)\n"
    "  --tokenizer FILE      the Hugging Face tokenizer.json the model was trained with (default: the\n"
    "                        byte-level tokenizer of 'ztrain tokenize' without --tokenizer)\n"
    "  --add-special-tokens  put the tokenizer's special tokens around the prompt (<|begin_of_text|> ...)\n"
    "  --help                print this help\n";

/* Prints one usage error line and returns the usage exit status. */
static int usage_error(const char *msg)
{
    fprintf(stderr, "ztrain: error: generate: %s; run 'ztrain generate --help' for the flags\n", msg);
    return 2;
}

static int runtime_error(const zt_err *err)
{
    fprintf(stderr, "ztrain: error: %s\n", err->msg);
    return 1;
}

static bool is_directory(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds the checkpoint to load: dir itself when it holds model.safetensors, else the checkpoint named
 * by dir/latest (a run directory). Writes the checkpoint directory into out. */
static int resolve_checkpoint(const char *dir, char *out, size_t cap, zt_err *err)
{
    char path[4096];
    if (!is_directory(dir))
        return zt_fail(err, -ENOENT,
                       "checkpoint directory %s does not exist: pass a run directory or a ckpt_NNNNNN directory "
                       "written by 'ztrain train'",
                       dir);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (is_file(path)) {
        if ((size_t)snprintf(out, cap, "%s", dir) >= cap)
            return zt_fail(err, -ENAMETOOLONG, "checkpoint path %s is too long", dir);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/latest", dir);
    if (!is_file(path))
        return zt_fail(err, -ENOENT,
                       "%s holds neither model.safetensors nor a 'latest' file: pass a run directory or a "
                       "ckpt_NNNNNN directory written by 'ztrain train'",
                       dir);
    char *name = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &name, &len, err);
    if (rc < 0)
        return rc;
    while (len > 0 && (name[len - 1] == '\n' || name[len - 1] == '\r' || name[len - 1] == ' '))
        name[--len] = '\0';
    if (len == 0 || strchr(name, '/') != NULL) {
        free(name);
        return zt_fail(err, ZT_EFORMAT,
                       "%s should hold the name of the newest checkpoint (ckpt_NNNNNN) but holds '%.64s'; "
                       "pass a checkpoint directory with --checkpoint instead",
                       path, name);
    }
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) {
        free(name);
        return zt_fail(err, -ENAMETOOLONG, "checkpoint path %s is too long", dir);
    }
    free(name);
    if (!is_directory(out))
        return zt_fail(err, -ENOENT, "%s names checkpoint %s, which does not exist: pass an existing ckpt_NNNNNN "
                       "directory with --checkpoint", path, out);
    return 0;
}

/* State of the per-token callback: where bytes go and whether the output ended with a newline. */
typedef struct stream_state {
    const zt_tokenizer *tok;
    FILE *out;
    bool ends_with_newline;
    int write_errno;
    /* --chat: the reply ends at the template's end-of-turn marker (not printed) */
    bool chat;
    zt_stop_scan stop;
    /* the ids generation stops at (not printed): a decoder's end-of-sequence ids, the chat marker's token */
    int eos[ZT_FAMILY_MAX_EOS + 1];
    int n_eos;
} stream_state;

static int write_bytes(stream_state *s, const char *bytes, size_t len)
{
    if (len == 0)
        return 0;
    if (fwrite(bytes, 1, len, s->out) != len || fflush(s->out) != 0) {
        s->write_errno = errno ? errno : EIO;
        return -s->write_errno;
    }
    s->ends_with_newline = bytes[len - 1] == '\n';
    return 0;
}

/* Writes a token's bytes, or with --chat what of them comes before the end-of-turn marker. Returns 0, 1
 * when the marker is complete (generation stops), or a negative error. */
static int emit(stream_state *s, const char *bytes, size_t len)
{
    if (!s->chat)
        return write_bytes(s, bytes, len);
    const char *out;
    size_t n;
    int found = zt_stop_scan_push(&s->stop, bytes, len, &out, &n);
    if (found < 0)
        return found;
    int rc = write_bytes(s, out, n);
    return rc < 0 ? rc : found;
}

static int on_token(int32_t token, void *user)
{
    stream_state *s = user;
    for (int i = 0; i < s->n_eos; i++)
        if (token == s->eos[i])
            return 1;
    const char *bytes;
    size_t len;
    if (zt_tokenizer_token_bytes(s->tok, token, &bytes, &len, NULL) < 0)
        return emit(s, replacement_char, sizeof(replacement_char) - 1);
    return emit(s, bytes, len);
}

typedef struct generate_args {
    const char *checkpoint;
    const char *weights;
    const char *model;
    const char *prompt;
    int64_t max_new;
    double temperature;
    int64_t top_k;
    int64_t seed;
    const char *tokenizer; /* tokenizer.json, or NULL for bytes */
    bool add_special;
    bool prompt_given;
    const char *chat;          /* a conversation (JSON), or NULL */
    const char *chat_template; /* a template's name, or NULL: the tokenizer_config.json's */
    int64_t num_beams;         /* 1: sampling (or greedy); > 1: beam search */
    double length_penalty;
    bool sampling_given;       /* --temperature or --top-k was given */
    bool ignore_eos;           /* a decoder goes on past its end-of-sequence ids */
} generate_args;

/* Parses the flags; returns 0, 2 after printing a usage error, or -1 when --help was printed. */
static int parse_args(int argc, char **argv, generate_args *a)
{
    enum { OPT_CHECKPOINT = 1000, OPT_WEIGHTS, OPT_MODEL, OPT_PROMPT, OPT_MAX_NEW, OPT_TEMPERATURE, OPT_TOP_K,
           OPT_SEED, OPT_HELP, OPT_TOKENIZER, OPT_ADD_SPECIAL, OPT_CHAT, OPT_CHAT_TEMPLATE,
           OPT_NUM_BEAMS, OPT_LENGTH_PENALTY, OPT_IGNORE_EOS };
    static const struct option options[] = {
        {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
        {"weights", required_argument, NULL, OPT_WEIGHTS},
        {"model", required_argument, NULL, OPT_MODEL},
        {"prompt", required_argument, NULL, OPT_PROMPT},
        {"max-new-tokens", required_argument, NULL, OPT_MAX_NEW},
        {"temperature", required_argument, NULL, OPT_TEMPERATURE},
        {"top-k", required_argument, NULL, OPT_TOP_K},
        {"seed", required_argument, NULL, OPT_SEED},
        {"help", no_argument, NULL, OPT_HELP},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"add-special-tokens", no_argument, NULL, OPT_ADD_SPECIAL},
        {"chat", required_argument, NULL, OPT_CHAT},
        {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
        {"num-beams", required_argument, NULL, OPT_NUM_BEAMS},
        {"length-penalty", required_argument, NULL, OPT_LENGTH_PENALTY},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {NULL, 0, NULL, 0},
    };
    *a = (generate_args){.prompt = "", .max_new = 200, .temperature = 0.8, .top_k = 40, .seed = 1337, .num_beams = 1,
                         .length_penalty = 1.0};

    zt_err err = {{0}};
    char msg[ZT_ERR_LEN + 64];
    opterr = 0;  /* we print our own one-line messages */
    optind = 0;  /* glibc: restart scanning at argv[1] even if getopt ran before */
    for (;;) {
        int c = getopt_long(argc, argv, ":", options, NULL);
        if (c == -1)
            break;
        int rc = 0;
        switch (c) {
        case OPT_CHECKPOINT: a->checkpoint = optarg; break;
        case OPT_WEIGHTS: a->weights = optarg; break;
        case OPT_MODEL: a->model = optarg; break;
        case OPT_PROMPT: a->prompt = optarg; a->prompt_given = true; break;
        case OPT_MAX_NEW: rc = zt_arg_int("--max-new-tokens", optarg, 0, 1000000, &a->max_new, &err); break;
        case OPT_TEMPERATURE:
            rc = zt_arg_double("--temperature", optarg, 0.0, 100.0, &a->temperature, &err);
            a->sampling_given = true;
            break;
        case OPT_TOP_K:
            rc = zt_arg_int("--top-k", optarg, 0, 1000000000, &a->top_k, &err);
            a->sampling_given = true;
            break;
        case OPT_NUM_BEAMS: rc = zt_arg_int("--num-beams", optarg, 1, 256, &a->num_beams, &err); break;
        case OPT_LENGTH_PENALTY:
            rc = zt_arg_double("--length-penalty", optarg, -100.0, 100.0, &a->length_penalty, &err);
            break;
        case OPT_SEED: rc = zt_arg_int("--seed", optarg, 0, INT64_MAX, &a->seed, &err); break;
        case OPT_HELP: fputs(usage_text, stdout); return -1;
        case OPT_TOKENIZER: a->tokenizer = optarg; break;
        case OPT_ADD_SPECIAL: a->add_special = true; break;
        case OPT_CHAT: a->chat = optarg; break;
        case OPT_IGNORE_EOS: a->ignore_eos = true; break;
        case OPT_CHAT_TEMPLATE: a->chat_template = optarg; break;
        case ':':
            snprintf(msg, sizeof(msg), "%s needs a value", argv[optind - 1]);
            return usage_error(msg);
        default:
            snprintf(msg, sizeof(msg), "unknown flag '%s'", argv[optind - 1]);
            return usage_error(msg);
        }
        if (rc < 0)
            return usage_error(err.msg);
    }
    if (optind < argc) {
        snprintf(msg, sizeof(msg), "unexpected argument '%s' (the prompt goes after --prompt)", argv[optind]);
        return usage_error(msg);
    }
    if (a->chat && a->prompt_given)
        return usage_error("pass either --prompt TEXT or --chat FILE, not both (the conversation is the prompt)");
    if (a->chat && a->add_special)
        return usage_error("--add-special-tokens does not go with --chat: the chat template writes the special "
                           "tokens itself");
    if (a->num_beams > 1 && a->sampling_given)
        return usage_error("--num-beams searches deterministically: --temperature and --top-k do not apply to it "
                           "(drop them, or drop --num-beams to sample)");
    if (a->num_beams > 1 && a->max_new < 1)
        return usage_error("--num-beams needs --max-new-tokens 1 or more");
    if (a->chat_template && !a->chat)
        return usage_error("--chat-template names the template of a --chat conversation; give --chat FILE too");
    if (a->checkpoint && (a->weights || a->model))
        return usage_error("pass either --checkpoint or --weights with --model, not both");
    if (!a->checkpoint && !a->weights && !a->model)
        return usage_error("say which model to load with --checkpoint DIR or --weights FILE --model config.json");
    if (!a->checkpoint && (!a->weights || !a->model))
        return usage_error(a->weights ? "--weights needs --model config.json (the config written beside it by "
                                        "'ztrain export')"
                                      : "--model needs --weights FILE.safetensors");
    return 0;
}

/* The chat template for --chat: --chat-template NAME (with the bos and eos of the tokenizer_config.json
 * beside the tokenizer when there is one), else that file's chat_template. */
static int open_chat_template(const generate_args *a, zt_chat_template **t, zt_err *err)
{
    char tcfg[4200];
    const bool has = a->tokenizer && zt_chat_template_config_beside(a->tokenizer, tcfg, sizeof tcfg);
    if (a->chat_template) {
        int rc = has ? zt_chat_template_load(t, tcfg, a->chat_template, err)
                     : zt_chat_template_by_name(t, a->chat_template, NULL, NULL, err);
        if (rc < 0)
            zt_err_prefix(err, "--chat-template");
        return rc;
    }
    if (!has)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--chat: no chat template: there is no tokenizer_config.json beside "
                       "%s; name the one the model was fine-tuned with: --chat-template NAME (%s)",
                       a->tokenizer ? a->tokenizer : "the byte tokenizer (no --tokenizer)", zt_chat_template_names());
    return zt_chat_template_load(t, tcfg, NULL, err);
}

/* The prompt of --chat: the conversation of file rendered by t with the header that asks for the
 * assistant's turn, as text (malloc'd, NUL-terminated) for the tokenizer. */
static int chat_prompt(const char *file, const zt_chat_template *t, char **text, zt_err *err)
{
    *text = NULL;
    cJSON *root = NULL;
    int rc = zt_json_load_object(file, &root, err);
    if (rc < 0)
        return rc;
    zt_chat_message *m = NULL;
    int n = 0;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s holds no \"messages\"; give --chat one conversation as "
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}", file);
    if (rc == 0)
        rc = zt_chat_messages_from_json(msgs, file, &m, &n, err);
    if (rc == 0 && m[n - 1].role == ZT_CHAT_ASSISTANT)
        rc = zt_fail(err, ZT_EINVAL_CONFIG, "%s: the conversation ends with an assistant message, so there is "
                     "nothing to answer; end it with the user message the reply should follow", file);
    zt_chat_render rd = {0};
    if (rc == 0)
        rc = zt_chat_template_render(t, m, n, true, &rd, err);
    if (rc == 0) {
        *text = rd.text;
        rd.text = NULL;
    } else if (err && strncmp(err->msg, file, strlen(file)) != 0) {
        zt_err_prefix(err, file);
    }
    zt_chat_render_free(&rd);
    free(m);
    cJSON_Delete(root);
    return rc;
}

/* Runs `ztrain generate`: loads the model, streams the prompt and the sampled text to stdout, and returns
 * the exit status (0 done, 1 a file or write failed, 2 bad flags). */
int zt_cmd_generate(int argc, char **argv)
{
    generate_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? 0 : rc;

    zt_err err = {{0}};
    char ckpt[4096], config_path[4200], weights_path[4200];
    if (a.checkpoint) {
        if (resolve_checkpoint(a.checkpoint, ckpt, sizeof(ckpt), &err) < 0)
            return runtime_error(&err);
        snprintf(config_path, sizeof(config_path), "%s/model_config.json", ckpt);
        snprintf(weights_path, sizeof(weights_path), "%s/model.safetensors", ckpt);
    } else {
        snprintf(config_path, sizeof(config_path), "%s", a.model);
        snprintf(weights_path, sizeof(weights_path), "%s", a.weights);
    }

    zt_family_config cfg;
    if (zt_family_config_load(&cfg, config_path, &err) < 0)
        return runtime_error(&err);
    const bool seq2seq = zt_family_config_task(&cfg) == ZT_TASK_SEQ2SEQ;
    if (zt_family_config_task(&cfg) != ZT_TASK_CAUSAL_LM && !seq2seq) {
        zt_fail(&err, ZT_EUNSUPPORTED, "%s is a %s model, which does not generate text (generate works with causal "
                "language models: GPT-2, LLaMA, Mistral, Qwen2, GPT-NeoX, and text-to-text models: T5); evaluate it with ztrain "
                "train's --val-data instead", config_path, zt_family_name(&cfg));
        return runtime_error(&err);
    }

    zt_tokenizer *tok = NULL;
    zt_family_model *model = NULL;
    const int vocab = zt_family_config_vocab(&cfg), positions = zt_family_config_positions(&cfg);
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    int status = 1;
    unsigned flags = a.add_special ? ZT_TOKENIZE_ADD_SPECIAL : 0;
    zt_chat_template *tmpl = NULL;
    char *chat_text = NULL;
    stream_state s = {.out = stdout, .ends_with_newline = false};
    if (a.chat && seq2seq) {
        zt_fail(&err, ZT_EUNSUPPORTED, "--chat: %s is a text-to-text model (%s), which has no chat template; give "
                "its input with --prompt", config_path, zt_family_name(&cfg));
        goto done;
    }
    if (a.chat) { /* the conversation is the prompt; the template writes its special tokens itself */
        if (open_chat_template(&a, &tmpl, &err) < 0 || chat_prompt(a.chat, tmpl, &chat_text, &err) < 0)
            goto done;
        a.prompt = chat_text;
        s.stop.stop = zt_chat_template_end_of_turn(tmpl);
        s.stop.stop_len = strlen(s.stop.stop);
        s.chat = s.stop.stop_len > 0;
    }
    if ((a.tokenizer ? zt_tokenizer_load(&tok, a.tokenizer, &err) : zt_tokenizer_create(&tok, "bytes", &err)) < 0)
        goto done;
    s.tok = tok;
    if (zt_tokenizer_encode_flags(tok, a.prompt, strlen(a.prompt), flags, &prompt, &n_prompt, &err) < 0)
        goto done;
    if (n_prompt == 0) {
        /* An empty prompt starts from a newline, the most neutral context for text. */
        free(prompt);
        if (zt_tokenizer_encode_flags(tok, "\n", 1, flags, &prompt, &n_prompt, &err) < 0)
            goto done;
    }
    if (n_prompt == 0) {
        zt_fail(&err, ZT_EINVAL_CONFIG, "the %s tokenizer makes no token of an empty prompt or a newline; give "
                "some text with --prompt", zt_tokenizer_kind(tok));
        goto done;
    }
    if (n_prompt > (size_t)INT32_MAX / 2) {
        zt_fail(&err, ZT_EINVAL_CONFIG, "the prompt is too long (%zu tokens)", n_prompt);
        goto done;
    }
    int tok_vocab = zt_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n_prompt; i++) {
        if (prompt[i] >= vocab) {
            zt_fail(&err, ZT_EMISMATCH,
                    "the prompt has token %d but the model in %s knows only %d tokens; use a prompt the "
                    "model's vocabulary covers",
                    (int)prompt[i], config_path, vocab);
            goto done;
        }
    }
    if (vocab > tok_vocab)
        ZT_WARN("generate: the model has %d tokens and the %s tokenizer %d; tokens it cannot print show as "
                "U+FFFD",
                vocab, zt_tokenizer_kind(tok), tok_vocab);

    /* Where generation stops: the config's end-of-sequence ids (a decoder's unless --ignore-eos; a text-to-text
     * model always ends at its own), and with --chat the end-of-turn marker where the tokenizer makes one
     * token of it (<|im_end|>, <|eot_id|>, ...; else the text is cut at the marker as it is printed). */
    zt_family_shape shape;
    zt_family_config_shape(&cfg, &shape);
    for (int i = 0; i < shape.n_eos && (seq2seq || !a.ignore_eos); i++)
        if (shape.eos_ids[i] >= 0 && shape.eos_ids[i] < vocab)
            s.eos[s.n_eos++] = shape.eos_ids[i];
    if (s.chat) {
        int32_t *marker = NULL;
        size_t n_marker = 0;
        if (zt_tokenizer_encode_flags(tok, s.stop.stop, s.stop.stop_len, 0, &marker, &n_marker, NULL) == 0 &&
            n_marker == 1 && marker[0] < vocab)
            s.eos[s.n_eos++] = marker[0];
        free(marker);
    }

    /* The context never grows past the prompt plus the new tokens, so the model needs no more room. */
    int64_t need = (int64_t)n_prompt + a.max_new;
    int T = need < positions ? (int)need : positions;
    if (zt_family_model_create(&model, &cfg, (int)a.num_beams, T, 0, &err) < 0)
        goto done;
    if (zt_family_model_import(model, weights_path, &err) < 0)
        goto done;
    ZT_INFO("generate: %s (%zu parameters, %d layers, vocab %d), prompt of %zu tokens, %lld new tokens, "
            "temperature %g, top-k %lld, seed %lld",
            weights_path, zt_family_model_num_params(model), zt_family_config_layers(&cfg), vocab, n_prompt,
            (long long)a.max_new, a.temperature, (long long)a.top_k, (long long)a.seed);
    if (s.n_eos > 0)
        ZT_INFO("generate: stops at token %d%s%s", s.eos[0], s.n_eos > 1 ? " and the other end ids" : "",
                seq2seq || s.chat ? "" : " (its end-of-sequence id; --ignore-eos goes on)");
    if (a.num_beams > 1)
        ZT_INFO("generate: beam search over %lld beams, length penalty %g (--temperature, --top-k and --seed do not "
                "apply)", (long long)a.num_beams, a.length_penalty);
    if (tmpl)
        ZT_INFO("generate: --chat %s rendered with the %s template; the reply ends at '%s'", a.chat,
                zt_chat_template_name(tmpl), s.stop.stop);

    /* a text-to-text model's output follows its input on the next line; a chat prints its reply only */
    if ((!tmpl && write_bytes(&s, a.prompt, strlen(a.prompt)) < 0) || (seq2seq && write_bytes(&s, "\n", 1) < 0)) {
        zt_fail(&err, -s.write_errno, "cannot write to standard output: %s", strerror(s.write_errno));
        goto done;
    }
    if (a.num_beams > 1) { /* the best hypothesis, printed once the search is over */
        int32_t *best = NULL;
        int n_best = 0;
        rc = zt_generate_beam(model, prompt, (int)n_prompt, (int)a.max_new, (int)a.num_beams, a.length_penalty, s.eos,
                              s.n_eos, &best, &n_best, &err);
        for (int i = 0; rc == 0 && i < n_best; i++) {
            int cb = on_token(best[i], &s);
            rc = cb < 0 ? cb : 0;
            if (cb > 0)
                break;
        }
        free(best);
    } else {
        rc = zt_generate(model, prompt, (int)n_prompt, (int)a.max_new, a.temperature, (int)a.top_k,
                         (uint64_t)a.seed, on_token, &s, &err);
    }
    if (rc < 0) {
        if (s.write_errno)
            zt_fail(&err, rc, "cannot write to standard output: %s", strerror(s.write_errno));
        /* The text so far ends without a newline; keep the error on its own line. */
        if (!s.ends_with_newline)
            fputc('\n', stdout);
        fflush(stdout);
        goto done;
    }
    if (!s.ends_with_newline && write_bytes(&s, "\n", 1) < 0) {
        zt_fail(&err, -s.write_errno, "cannot write to standard output: %s", strerror(s.write_errno));
        goto done;
    }
    status = 0;

done:
    if (status != 0)
        runtime_error(&err);
    zt_family_model_destroy(model);
    free(prompt);
    zt_tokenizer_destroy(tok);
    zt_chat_template_destroy(tmpl);
    free(chat_text);
    zt_stop_scan_free(&s.stop);
    return status;
}
