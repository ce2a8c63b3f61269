/* Chat templates: a conversation (system, user and assistant messages) rendered as the text a chat model
 * was trained on, with the byte ranges of the assistant turns (what supervised fine-tuning trains on).
 *
 * Models publish their template as a Jinja program (tokenizer_config.json's "chat_template"), which
 * transformers' apply_chat_template runs. ztrain has no Jinja interpreter: like llama.cpp, it recognises
 * the template of each family it knows by its markers and renders that family's format natively, giving
 * the same text as apply_chat_template with the real template string (checked by
 * tests/interop/chat_template_check.py). A template whose markers match no family, or a variant of a family
 * that renders differently (Qwen3's thinking blocks, Phi-4), is refused, never approximated.
 *
 * The families ("names") and what tells them apart:
 *   chatml    <|im_start|>role\n ... <|im_end|>\n; a default system prompt written in the template (Qwen2's
 *             "You are a helpful assistant.", Qwen2.5's) is found and used when a chat has no system
 *             message. Named forms: "chatml" (none), "qwen2", "qwen2.5".
 *   llama2    <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] answer </s> (meta-llama/Llama-2-*-chat).
 *   llama3    <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|> (Meta-Llama-3-*-Instruct);
 *   llama3.1  the same with the system header Llama 3.1 always writes ("Cutting Knowledge Date" ...).
 *   mistral   <s>[INST] ...[/INST] answer</s> of Mistral-7B-Instruct-v0.3 (its template puts the system
 *             prompt before the last user message, so a chat that ends with an assistant turn loses it,
 *             as it does in transformers).
 *   gemma     <bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n (Gemma, Gemma 2: no
 *             system role); gemma3: the system prompt goes before the first user message.
 *   phi3      <|user|>\n...<|end|>\n<|assistant|>\n (Phi-3, Phi-3.5 mini instruct; eos closes a chat
 *             rendered without a generation prompt).
 *
 * The trained range of an assistant turn is its content as the template writes it (trimmed where the
 * template trims, with the space some templates put before it) and the end-of-turn marker that follows
 * (<|im_end|>, </s>, <|eot_id|>, <end_of_turn>, <|end|>), not the newline after that marker. Everything
 * here is pure: a template is read-only once made and may be shared by threads. */
#ifndef ZT_WORKER_DATA_CHAT_TEMPLATE_H
#define ZT_WORKER_DATA_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

typedef struct zt_chat_template zt_chat_template; /* opaque */

enum zt_chat_role { ZT_CHAT_SYSTEM, ZT_CHAT_USER, ZT_CHAT_ASSISTANT };

/* One message; content is borrowed for the call (UTF-8, len bytes, need not be NUL-terminated). */
typedef struct zt_chat_message {
    enum zt_chat_role role;
    const char *content;
    size_t len;
} zt_chat_message;

/* A byte range [begin, end) of a rendered text. */
typedef struct zt_text_span {
    size_t begin, end;
} zt_text_span;

/* A rendered conversation: text (malloc'd, NUL-terminated, the NUL not counted in len) and the trained
 * ranges of its assistant turns, in order (spans malloc'd, nspans of them). */
typedef struct zt_chat_render {
    char *text;
    size_t len;
    zt_text_span *spans;
    int nspans;
} zt_chat_render;

/* The names ztrain knows, comma-separated (a static string), for messages and --help. */
const char *zt_chat_template_names(void);

/* Recognises a chat template from its Jinja text (tokenizer_config.json's chat_template; a name from
 * zt_chat_template_names is accepted too, as llama.cpp does). bos and eos are the tokenizer's bos_token and
 * eos_token strings the template writes (NULL: the family's usual ones, "<s>" and "</s>" for LLaMA-2, ...);
 * where names the file in messages. Returns 0 and *out (freed with zt_chat_template_destroy), or
 * ZT_EUNSUPPORTED with a message naming the templates ztrain knows and how to name one. */
int zt_chat_template_detect(zt_chat_template **out, const char *jinja, const char *bos, const char *eos,
                            const char *where, zt_err *err);
/* Makes the template of a family by name (zt_chat_template_names). Returns 0 and *out, or
 * ZT_EINVAL_CONFIG with a message listing the names. */
int zt_chat_template_by_name(zt_chat_template **out, const char *name, const char *bos, const char *eos,
                             zt_err *err);
/* Reads a tokenizer_config.json: its chat_template (a string, or the "default" one of a list of named
 * templates) recognised as zt_chat_template_detect does, with its bos_token and eos_token; name, when not
 * NULL, chooses the family instead (and then the file needs no chat_template). Returns 0 and *out, a
 * negative errno (the file), ZT_EFORMAT (not JSON), ZT_EINVAL_CONFIG (no chat_template and no name, or an
 * unknown name) or ZT_EUNSUPPORTED (a template ztrain does not know). */
int zt_chat_template_load(zt_chat_template **out, const char *config_path, const char *name, zt_err *err);
/* Frees a template; accepts NULL. */
void zt_chat_template_destroy(zt_chat_template *t);

/* The family's name ("chatml", "llama3", ...: a string that lives as long as t). */
const char *zt_chat_template_name(const zt_chat_template *t);
/* The end-of-turn marker trained after each answer ("<|im_end|>", the eos token, ...; lives as long as t). */
const char *zt_chat_template_end_of_turn(const zt_chat_template *t);

/* Renders n messages as the template does, and with add_generation_prompt the header that asks the model
 * for the next assistant turn (for generation). Returns 0 and *out (freed with zt_chat_render_free), or
 * ZT_EINVAL_CONFIG with a message when the conversation breaks a rule of the template (an empty
 * conversation; roles that must alternate user / assistant after an optional first system message; a
 * system message where the family has none, or not first), naming the message (from 1) and the rule. */
int zt_chat_template_render(const zt_chat_template *t, const zt_chat_message *msgs, int n,
                            bool add_generation_prompt, zt_chat_render *out, zt_err *err);
/* Frees what zt_chat_template_render made and zeroes r; accepts a zeroed r. */
void zt_chat_render_free(zt_chat_render *r);

/* Reads a conversation: msgs is a JSON array of {"role": "system"|"user"|"assistant", "content": "..."}, as
 * a chat record's "messages" holds it. *out (malloc'd, *n messages) borrows the contents from msgs. where
 * begins every error message ("chats.jsonl:12"). Returns 0, or ZT_EINVAL_CONFIG naming the message and the
 * fix (not an array, empty, a missing role or content, an unknown role). */
struct cJSON;
int zt_chat_messages_from_json(const struct cJSON *msgs, const char *where, zt_chat_message **out, int *n,
                               zt_err *err);

/* The tokenizer_config.json beside a tokenizer.json (the same folder) into buf: true when it is there and
 * readable, false otherwise. */
bool zt_chat_template_config_beside(const char *tokenizer, char *buf, size_t cap);

#endif
