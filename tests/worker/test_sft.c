/* Tests of the supervised fine-tuning data (worker/data/sft.h) and chat templates
 * (worker/data/chat_template.h): every record format with its trained flags, the rendering of each template
 * family against hand-written expectations, recognition of templates by their markers, packing and padding
 * (tokens, targets, positions, cu_seqlens), truncation and refusal of long examples, the cache and its
 * invalidation, resumable positions, and every bad input with its message. The "bytes" tokenizer makes token
 * ids the bytes of the text, so expectations are exact. The comparison with transformers'
 * apply_chat_template is tests/interop/chat_template_check.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/data/chat_template.h"
#include "worker/data/sft.h"
#include "worker/data/tokenize.h"

static char dir[256];
static zt_tokenizer *bytes_tok;

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/zt-test-sft-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    zt_err err;
    return zt_tokenizer_create(&bytes_tok, "bytes", &err);
}

static int teardown(void **state)
{
    (void)state;
    zt_tokenizer_destroy(bytes_tok);
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[600];
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
    return 0;
}

static const char *write_file(const char *name, const char *text)
{
    static char path[4][600];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static zt_sft_data *open_ok(const char *text, const zt_sft_options *o)
{
    const char *path = write_file("data.jsonl", text);
    zt_sft_data *d = NULL;
    zt_err err = {{0}};
    int rc = zt_sft_open(&d, path, bytes_tok, o, &err);
    if (rc != 0)
        fail_msg("open failed (%d): %s", rc, err.msg);
    return d;
}

/* The message of a refused file, which must name data.jsonl:line and hold want. */
static void open_fails(const char *text, const zt_sft_options *o, int code, int line, const char *want)
{
    const char *path = write_file("data.jsonl", text);
    zt_sft_data *d = NULL;
    zt_err err = {{0}};
    int rc = zt_sft_open(&d, path, bytes_tok, o, &err);
    assert_null(d);
    if (rc != code)
        fail_msg("got %d (%s), expected %d", rc, err.msg, code);
    char at[64];
    snprintf(at, sizeof at, "data.jsonl:%d:", line);
    if (line > 0 && !strstr(err.msg, at))
        fail_msg("'%s' does not name %s", err.msg, at);
    if (!strstr(err.msg, want))
        fail_msg("'%s' does not say '%s'", err.msg, want);
}

/* Example i is the bytes of text, trained from byte `from` on (and the trailing eos # when eos). */
static void expect_example(const zt_sft_data *d, size_t i, const char *text, size_t from, bool eos)
{
    zt_sft_example ex;
    zt_sft_get(d, i, &ex);
    const size_t n = strlen(text);
    assert_int_equal(ex.n, n + (eos ? 1 : 0));
    for (size_t j = 0; j < n; j++) {
        assert_int_equal(ex.ids[j], (unsigned char)text[j]);
        assert_int_equal(ex.trained[j], j >= from);
    }
    if (eos) {
        assert_int_equal(ex.ids[n], '#');
        assert_int_equal(ex.trained[n], 1);
    }
}

static void test_prompt_completion(void **state)
{
    (void)state;
    zt_sft_options o = {.eos_token = "#"};
    zt_sft_data *d = open_ok("{\"prompt\": \"Q: 2+2?\\nA: \", \"completion\": \"4\"}\n\n"
                             "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n", &o);
    assert_int_equal(zt_sft_count(d), 2);
    expect_example(d, 0, "Q: 2+2?\nA: 4", 11, true);
    expect_example(d, 1, "abcd", 2, true);
    zt_sft_example ex;
    zt_sft_get(d, 1, &ex);
    assert_int_equal(ex.line, 3);
    assert_null(ex.src);
    zt_sft_stats s;
    zt_sft_get_stats(d, &s);
    assert_int_equal(s.format, ZT_SFT_PROMPT_COMPLETION);
    assert_int_equal(s.tokens, 13 + 5);
    assert_int_equal(s.trained, 2 + 3);
    zt_sft_close(d);

    o.train_on_prompt = true;
    d = open_ok("{\"prompt\": \"ab\", \"completion\": \"cd\"}\n", &o);
    expect_example(d, 0, "abcd", 0, true);
    zt_sft_close(d);
}

static void test_alpaca(void **state)
{
    (void)state;
    zt_sft_options o = {.eos_token = "#"};
    zt_sft_data *d = open_ok("{\"instruction\": \"Reverse it.\", \"input\": \"abc\", \"output\": \"cba\"}\n"
                             "{\"instruction\": \"Say hi.\", \"output\": \"hi\"}\n", &o);
    const char *p0 = "Below is an instruction that describes a task, paired with an input that provides further "
                     "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
                     "Reverse it.\n\n### Input:\nabc\n\n### Response:\n";
    const char *p1 = "Below is an instruction that describes a task. Write a response that appropriately completes "
                     "the request.\n\n### Instruction:\nSay hi.\n\n### Response:\n";
    char t0[512], t1[512];
    snprintf(t0, sizeof t0, "%scba", p0);
    snprintf(t1, sizeof t1, "%shi", p1);
    expect_example(d, 0, t0, strlen(p0), true);
    expect_example(d, 1, t1, strlen(p1), true);
    zt_sft_close(d);

    /* with a chat template: one user turn (instruction, blank line, input) and one assistant turn */
    zt_chat_template *t;
    zt_err err;
    assert_int_equal(zt_chat_template_by_name(&t, "chatml", NULL, NULL, &err), 0);
    o.chat_template = t;
    d = open_ok("{\"instruction\": \"Reverse it.\", \"input\": \"abc\", \"output\": \"cba\", \"system\": \"S\"}\n", &o);
    const char *head = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nReverse it.\n\nabc<|im_end|>\n"
                       "<|im_start|>assistant\n";
    char text[512];
    snprintf(text, sizeof text, "%scba<|im_end|>\n", head);
    zt_sft_example ex;
    zt_sft_get(d, 0, &ex);
    assert_int_equal(ex.n, strlen(text)); /* no eos appended: the template ends the turn */
    for (size_t j = 0; j < ex.n; j++) {
        assert_int_equal(ex.ids[j], (unsigned char)text[j]);
        assert_int_equal(ex.trained[j], j >= strlen(head) && j < strlen(text) - 1); /* not the final \n */
    }
    zt_sft_close(d);
    zt_chat_template_destroy(t);
}

static void test_chat_masks(void **state)
{
    (void)state;
    zt_chat_template *t;
    zt_err err;
    assert_int_equal(zt_chat_template_by_name(&t, "llama3", "<B>", "<E>", &err), 0);
    zt_sft_options o = {.chat_template = t};
    zt_sft_data *d = open_ok("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                             "\"content\": \" yo \"}, {\"role\": \"user\", \"content\": \"more\"}, {\"role\": "
                             "\"assistant\", \"content\": \"ok\"}]}\n", &o);
    const char *text = "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nmore<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>";
    zt_sft_example ex;
    zt_sft_get(d, 0, &ex);
    assert_int_equal(ex.n, strlen(text));
    const char *a1 = strstr(text, "yo<|eot_id|>"), *a2 = strstr(text, "ok<|eot_id|>");
    const size_t b1 = (size_t)(a1 - text), b2 = (size_t)(a2 - text), l = strlen("yo<|eot_id|>");
    for (size_t j = 0; j < ex.n; j++) {
        assert_int_equal(ex.ids[j], (unsigned char)text[j]);
        assert_int_equal(ex.trained[j], (j >= b1 && j < b1 + l) || (j >= b2 && j < b2 + l));
    }
    zt_sft_close(d);
    o.train_on_prompt = true;
    d = open_ok("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                "\"content\": \"yo\"}]}\n", &o);
    zt_sft_get(d, 0, &ex);
    for (size_t j = 0; j < ex.n; j++)
        assert_int_equal(ex.trained[j], 1);
    zt_sft_close(d);
    zt_chat_template_destroy(t);
}

/* Renders a conversation and compares the text and the trained ranges' text. */
static void expect_render(const char *name, const zt_chat_message *m, int n, bool gen, const char *want,
                          const char *trained)
{
    zt_chat_template *t;
    zt_err err;
    assert_int_equal(zt_chat_template_by_name(&t, name, NULL, NULL, &err), 0);
    zt_chat_render r;
    int rc = zt_chat_template_render(t, m, n, gen, &r, &err);
    if (rc != 0)
        fail_msg("%s: %s", name, err.msg);
    if (strcmp(r.text, want) != 0)
        fail_msg("%s renders\n'%s', expected\n'%s'", name, r.text, want);
    char got[1024] = "";
    for (int i = 0; i < r.nspans; i++) {
        strncat(got, r.text + r.spans[i].begin, r.spans[i].end - r.spans[i].begin);
        strcat(got, "|");
    }
    if (trained && strcmp(got, trained) != 0)
        fail_msg("%s trains on '%s', expected '%s'", name, got, trained);
    zt_chat_render_free(&r);
    zt_chat_template_destroy(t);
}

#define MSG(r, s) {r, s, sizeof(s) - 1}

static void test_render_families(void **state)
{
    (void)state;
    const zt_chat_message c[] = {MSG(ZT_CHAT_SYSTEM, "Be brief."), MSG(ZT_CHAT_USER, " Hi "),
                                 MSG(ZT_CHAT_ASSISTANT, " Hello! "), MSG(ZT_CHAT_USER, "Bye")};
    expect_render("chatml", c, 3, false, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
                  "<|im_start|>assistant\n Hello! <|im_end|>\n", " Hello! <|im_end|>|");
    expect_render("qwen2", c + 1, 3, true, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\n"
                  "Bye<|im_end|>\n<|im_start|>assistant\n", NULL);
    expect_render("llama2", c, 3, false, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello! </s>",
                  " Hello! </s>|");
    expect_render("llama2", c + 1, 3, true, "<s>[INST] Hi [/INST] Hello! </s><s>[INST] Bye [/INST]", NULL);
    expect_render("llama3", c, 3, true, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."
                  "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
                  "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                  "Hello!<|eot_id|>|");
    expect_render("llama3.1", c + 1, 2, false, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                  "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>"
                  "user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!"
                  "<|eot_id|>", "Hello!<|eot_id|>|");
    /* Mistral v0.3 writes the system prompt before the last user message only */
    expect_render("mistral", c, 4, false, "<s>[INST]  Hi [/INST] Hello!</s>[INST] Be brief.\n\nBye[/INST]",
                  " Hello!</s>|");
    expect_render("mistral", c, 3, false, "<s>[INST]  Hi [/INST] Hello!</s>", " Hello!</s>|");
    expect_render("gemma", c + 1, 3, true, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
                  "Hello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
                  "Hello!<end_of_turn>|");
    expect_render("gemma3", c, 3, false, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>"
                  "model\nHello!<end_of_turn>\n", "Hello!<end_of_turn>|");
    expect_render("phi3", c, 3, false, "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi <|end|>\n<|assistant|>\n Hello! "
                  "<|end|>\n<|endoftext|>", " Hello! <|end|>|");
    expect_render("phi3", c, 2, true, "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi <|end|>\n<|assistant|>\n", "");
    /* Python's str.strip(): Unicode spaces and the separators U+001C..U+001F, not other controls */
    const zt_chat_message w[] = {MSG(ZT_CHAT_USER, "\xc2\xa0\x1c x\xe3\x80\x80"), MSG(ZT_CHAT_ASSISTANT, "\x01y\t")};
    expect_render("gemma", w, 2, false, "<bos><start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n\x01y"
                  "<end_of_turn>\n", "\x01y<end_of_turn>|");
}

static void test_render_rules(void **state)
{
    (void)state;
    zt_chat_template *t;
    zt_err err;
    zt_chat_render r;
    const zt_chat_message uu[] = {MSG(ZT_CHAT_USER, "a"), MSG(ZT_CHAT_USER, "b")};
    const zt_chat_message sys[] = {MSG(ZT_CHAT_SYSTEM, "s"), MSG(ZT_CHAT_USER, "b")};
    assert_int_equal(zt_chat_template_by_name(&t, "llama2", NULL, NULL, &err), 0);
    assert_int_equal(zt_chat_template_render(t, uu, 2, false, &r, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "message 2 is a user message"));
    assert_non_null(strstr(err.msg, "alternate"));
    assert_int_equal(zt_chat_template_render(t, uu, 0, false, &r, &err), ZT_EINVAL_CONFIG);
    zt_chat_template_destroy(t);
    assert_int_equal(zt_chat_template_by_name(&t, "gemma", NULL, NULL, &err), 0);
    assert_int_equal(zt_chat_template_render(t, sys, 2, false, &r, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "system"));
    zt_chat_template_destroy(t);
    assert_int_equal(zt_chat_template_by_name(&t, "chatml", NULL, NULL, &err), 0);
    assert_int_equal(zt_chat_template_render(t, uu, 2, false, &r, &err), 0); /* ChatML has no such rule */
    zt_chat_render_free(&r);
    zt_chat_template_destroy(t);
    assert_int_equal(zt_chat_template_by_name(&t, "vicuna", NULL, NULL, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "chatml, qwen2"));
}

static void expect_detect(const char *jinja, const char *name)
{
    zt_chat_template *t = NULL;
    zt_err err = {{0}};
    int rc = zt_chat_template_detect(&t, jinja, NULL, NULL, "cfg.json", &err);
    if (!name) {
        assert_int_equal(rc, ZT_EUNSUPPORTED);
        assert_non_null(strstr(err.msg, "cfg.json"));
        assert_non_null(strstr(err.msg, "--chat-template"));
        assert_non_null(strstr(err.msg, "chatml, qwen2, qwen2.5, llama2, llama3"));
        return;
    }
    if (rc != 0)
        fail_msg("'%s' refused: %s", jinja, err.msg);
    assert_string_equal(zt_chat_template_name(t), name);
    zt_chat_template_destroy(t);
}

static void test_detect(void **state)
{
    (void)state;
    expect_detect("{{'<|im_start|>' + message['role'] + '\\n'}}", "chatml");
    expect_detect("{{'<|im_start|>' + m }}{{'<|im_sep|>'}}", NULL);        /* Phi-4 */
    expect_detect("{{'<|im_start|>assistant\\n<think>\\n'}}", NULL);        /* Qwen3 */
    expect_detect("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}<<SYS>>", "llama2");
    expect_detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}", NULL); /* another [INST] variant */
    expect_detect("[AVAILABLE_TOOLS] {%- if loop.last and system_message is defined %}{{- \"[INST] \" + "
                  "system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}", "mistral");
    expect_detect("'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'", "llama3");
    expect_detect("<|start_header_id|><|end_header_id|>Cutting Knowledge Date: December 2023", "llama3.1");
    expect_detect("{{ '<start_of_turn>' + role }}", "gemma");
    expect_detect("{%- set first_user_prefix = '' -%}{{ '<start_of_turn>' + role }}", "gemma3");
    expect_detect("{{'<|user|>\\n' + m + '<|end|>\\n'}}{{'<|assistant|>\\n'}}", "phi3");
    expect_detect("{{ 'USER: ' + m + ' ASSISTANT: ' }}", NULL);
    expect_detect("gemma3", "gemma3"); /* a name, as llama.cpp takes one */

    /* the default system prompt of a ChatML template is read from it */
    zt_chat_template *t;
    zt_err err;
    assert_int_equal(zt_chat_template_detect(&t, "{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                                             "'<|im_start|>system\\nYou\\'re \"kind\".<|im_end|>\\n' }}{% endif %}"
                                             "{{'<|im_start|>' + message['role']}}", NULL, NULL, "x", &err), 0);
    const zt_chat_message m[] = {MSG(ZT_CHAT_USER, "q"), MSG(ZT_CHAT_ASSISTANT, "a")};
    zt_chat_render r;
    assert_int_equal(zt_chat_template_render(t, m, 2, false, &r, &err), 0);
    assert_string_equal(r.text, "<|im_start|>system\nYou're \"kind\".<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                                "<|im_start|>assistant\na<|im_end|>\n");
    zt_chat_render_free(&r);
    zt_chat_template_destroy(t);
    /* ... or from the template's text outside its tags (Qwen2-VL), not from an expression */
    assert_int_equal(zt_chat_template_detect(&t, "{% if loop.first and message['role'] != 'system' %}<|im_start|>"
                                             "system\nBe nice.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}"
                                             "\n", NULL, NULL, "x", &err), 0);
    assert_int_equal(zt_chat_template_render(t, m, 2, false, &r, &err), 0);
    assert_string_equal(r.text, "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                                "<|im_start|>assistant\na<|im_end|>\n");
    zt_chat_render_free(&r);
    zt_chat_template_destroy(t);
    assert_int_equal(zt_chat_template_detect(&t, "{{ '<|im_start|>system\\n' + messages[0]['content'] + "
                                             "'<|im_end|>\\n' }}", NULL, NULL, "x", &err), 0);
    assert_int_equal(zt_chat_template_render(t, m, 2, false, &r, &err), 0);
    assert_string_equal(r.text, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
    zt_chat_render_free(&r);
    zt_chat_template_destroy(t);

    /* from a tokenizer_config.json: its tokens; a list of named templates; none */
    const char *cfg = write_file("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<S>\"}, \"eos_token\": "
                                 "\"<E>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, "
                                 "{\"name\": \"default\", \"template\": \"{{ bos_token + '[INST] ' + "
                                 "content.strip() }}<<SYS>>\"}]}");
    assert_int_equal(zt_chat_template_load(&t, cfg, NULL, &err), 0);
    assert_string_equal(zt_chat_template_name(t), "llama2");
    assert_string_equal(zt_chat_template_end_of_turn(t), "<E>");
    assert_int_equal(zt_chat_template_render(t, m, 2, false, &r, &err), 0);
    assert_string_equal(r.text, "<S>[INST] q [/INST] a <E>");
    zt_chat_render_free(&r);
    zt_chat_template_destroy(t);
    cfg = write_file("tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    assert_int_equal(zt_chat_template_load(&t, cfg, NULL, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "has no chat_template"));
    assert_non_null(strstr(err.msg, "--chat-template"));
    assert_int_equal(zt_chat_template_load(&t, cfg, "phi3", &err), 0);
    zt_chat_template_destroy(t);
}

static void test_bad_input(void **state)
{
    (void)state;
    zt_chat_template *t;
    zt_err err;
    assert_int_equal(zt_chat_template_by_name(&t, "llama2", NULL, NULL, &err), 0);
    zt_sft_options o = {.chat_template = t};
    const char *ok = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
    char text[1024];
    snprintf(text, sizeof text, "%s{\"prompt\": \"a\", \"completion\": \"b\"\n", ok);
    open_fails(text, &o, ZT_EFORMAT, 2, "not valid JSON");
    snprintf(text, sizeof text, "%s[1, 2]\n", ok);
    open_fails(text, &o, ZT_EFORMAT, 2, "not a JSON object");
    snprintf(text, sizeof text, "%s{\"prompt\": \"a\"}\n", ok);
    open_fails(text, &o, ZT_EINVAL_CONFIG, 2, "\"completion\" is missing");
    open_fails("{\"prompt\": \"a\", \"completion\": 3}\n", &o, ZT_EINVAL_CONFIG, 1, "\"completion\" is not a string");
    open_fails("{\"instruction\": \"a\"}\n", &o, ZT_EINVAL_CONFIG, 1, "\"output\" is missing");
    open_fails("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\", \"content\": \"b\"}]}\n",
               &o, ZT_EINVAL_CONFIG, 1, "message 2 has the unknown role 'bot'; roles are system, user and assistant");
    open_fails("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n", &o, ZT_EINVAL_CONFIG, 1,
               "no assistant message");
    open_fails("{\"messages\": [{\"role\": \"user\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n", &o,
               ZT_EINVAL_CONFIG, 1, "message 1 (user) has no \"content\"");
    open_fails("{\"messages\": []}\n", &o, ZT_EINVAL_CONFIG, 1, "\"messages\" is empty");
    open_fails("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}\n", &o, ZT_EINVAL_CONFIG, 1,
               "roles must alternate");
    open_fails("{\"input\": \"translate: hi\"}\n", &o, ZT_EINVAL_CONFIG, 1, "\"target\" is missing");
    snprintf(text, sizeof text, "%s{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n", ok);
    open_fails(text, &o, ZT_EINVAL_CONFIG, 2, "first record (line 1) is prompt/completion");
    open_fails("{\"text\": \"a\"}\n", &o, ZT_EINVAL_CONFIG, 1, "no format ztrain reads");
    open_fails("\n\n", &o, ZT_EINVAL_CONFIG, 0, "no examples");
    zt_sft_options none = {0};
    open_fails("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
               "\"b\"}]}\n", &none, ZT_EINVAL_CONFIG, 1, "no chat template");
    none.vocab_size = 100; /* 'z' is 122 */
    open_fails("{\"prompt\": \"a\", \"completion\": \"z\"}\n", &none, ZT_EINVAL_CONFIG, 1, "token 122");
    none.vocab_size = 0;
    none.eos_token = "</s>"; /* not one byte: not a token of the bytes tokenizer */
    open_fails(ok, &none, ZT_EINVAL_CONFIG, 0, "eos token '</s>'");
    zt_chat_template_destroy(t);
}

static void test_untrained_dropped(void **state)
{
    (void)state;
    zt_sft_options o = {0}; /* no eos: an empty completion leaves nothing trained */
    zt_sft_data *d = open_ok("{\"prompt\": \"ab\", \"completion\": \"\"}\n{\"prompt\": \"ab\", \"completion\": "
                             "\"c\"}\n", &o);
    zt_sft_stats s;
    zt_sft_get_stats(d, &s);
    assert_int_equal(s.examples, 1);
    assert_int_equal(s.dropped, 1);
    zt_sft_close(d);
    open_fails("{\"prompt\": \"ab\", \"completion\": \"\"}\n", &o, ZT_EINVAL_CONFIG, 0, "every record was dropped");
}

static void test_seq2seq(void **state)
{
    (void)state;
    zt_sft_data *d = open_ok("{\"input\": \"abc\", \"target\": \"xy\"}\n{\"input\": \"abcdef\", \"target\": "
                             "\"z\"}\n", NULL);
    zt_sft_example ex;
    zt_sft_get(d, 0, &ex);
    assert_int_equal(ex.nsrc, 3);
    assert_int_equal(ex.src[2], 'c');
    assert_int_equal(ex.n, 2);
    assert_int_equal(ex.ids[0], 'x');
    assert_int_equal(ex.trained[0], 1);
    assert_int_equal(ex.trained[1], 1);
    zt_sft_loader *l;
    zt_err err;
    zt_sft_batch_options bo = {.B = 3, .T = 4, .pad_id = 0, .decoder_start_id = 9};
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "encoder-decoder"));
    bo.S = 4;
    bo.overlong = ZT_SFT_REFUSE;
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "line 2, has 6 tokens"));
    bo.overlong = ZT_SFT_TRUNCATE;
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), 0);
    assert_int_equal(zt_sft_loader_truncated(l), 1);
    int32_t src[12], slen[3], din[12], tgt[12];
    zt_sft_seq2seq_batch b = {src, slen, din, tgt, 0, 0};
    assert_int_equal(zt_sft_loader_next_seq2seq(l, &b, &err), 0);
    const int32_t wsrc[12] = {'a', 'b', 'c', 0, 'a', 'b', 'c', 'd', 0, 0, 0, 0};
    const int32_t wdin[12] = {9, 'x', 'y', 0, 9, 'z', 0, 0, 9, 0, 0, 0};
    const int32_t wtgt[12] = {'x', 'y', -1, -1, 'z', -1, -1, -1, -1, -1, -1, -1};
    assert_memory_equal(src, wsrc, sizeof src);
    assert_memory_equal(din, wdin, sizeof din);
    assert_memory_equal(tgt, wtgt, sizeof tgt);
    assert_int_equal(slen[0], 3);
    assert_int_equal(slen[1], 4);
    assert_int_equal(slen[2], 0);
    assert_int_equal(b.trained, 3);
    assert_int_equal(b.examples, 2);
    zt_sft_loader_destroy(l);
    zt_sft_close(d);
    /* a decoder's data is not read as sequence to sequence */
    d = open_ok("{\"prompt\": \"a\", \"completion\": \"b\"}\n", NULL);
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "only for input/target data"));
    zt_sft_close(d);
}

typedef struct bufs {
    int32_t tok[64], tgt[64], pos[64], cu[68], ns[4]; /* room for B 2 x T 20 */
    zt_sft_batch b;
} bufs;

static void bufs_init(bufs *x)
{
    memset(x, 0, sizeof *x);
    x->b = (zt_sft_batch){x->tok, x->tgt, x->pos, x->cu, x->ns, 0, 0};
}

static void test_packing(void **state)
{
    (void)state;
    zt_sft_options o = {.eos_token = "#"};
    /* lengths 5, 4, 6, 3 (eos included) */
    zt_sft_data *d = open_ok("{\"prompt\": \"ab\", \"completion\": \"cd\"}\n{\"prompt\": \"e\", \"completion\": "
                             "\"fg\"}\n{\"prompt\": \"hij\", \"completion\": \"kl\"}\n{\"prompt\": \"m\", "
                             "\"completion\": \"n\"}\n", &o);
    zt_sft_loader *l;
    zt_err err;
    zt_sft_batch_options bo = {.B = 2, .T = 10, .packed = true, .pad_id = 0};
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), 0);
    /* first fit: row 0 = ex0 (5) + ex1 (4); row 1 = ex2 (6) + ex3 (3) */
    assert_int_equal(zt_sft_loader_rows(l), 2);
    assert_int_equal(zt_sft_loader_batches_per_epoch(l), 1);
    assert_int_equal(zt_sft_loader_tokens(l), 18);
    bufs x;
    bufs_init(&x);
    assert_int_equal(zt_sft_loader_next(l, &x.b, &err), 0);
    const char *row0 = "abcd#efg#", *row1 = "hijkl#mn#";
    for (int j = 0; j < 9; j++) {
        assert_int_equal(x.tok[j], row0[j]);
        assert_int_equal(x.tok[10 + j], row1[j]);
    }
    assert_int_equal(x.tok[9], 0);
    assert_int_equal(x.tok[19], 0);
    /* targets: next token where it is trained, -1 at the end of each example and across it */
    const int32_t t0[10] = {-1, 'c', 'd', '#', -1, 'f', 'g', '#', -1, -1};
    const int32_t t1[10] = {-1, -1, 'k', 'l', '#', -1, 'n', '#', -1, -1};
    const int32_t p0[10] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 0}, p1[10] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 0};
    for (int j = 0; j < 10; j++) {
        assert_int_equal(x.tgt[j], t0[j]);
        assert_int_equal(x.tgt[10 + j], t1[j]);
        assert_int_equal(x.pos[j], p0[j]);
        assert_int_equal(x.pos[10 + j], p1[j]);
    }
    assert_int_equal(x.ns[0], 3);
    assert_int_equal(x.cu[0], 0);
    assert_int_equal(x.cu[1], 5);
    assert_int_equal(x.cu[2], 9);
    assert_int_equal(x.cu[3], 10);
    assert_int_equal(x.ns[1], 3);
    assert_int_equal(x.cu[11 + 1], 6);
    assert_int_equal(x.cu[11 + 2], 9);
    assert_int_equal(x.cu[11 + 3], 10);
    assert_int_equal(x.b.trained, 6 + 5);
    assert_int_equal(x.b.examples, 4);
    zt_sft_loader_destroy(l);

    /* padded: one example a row, B = 2 → two batches */
    bo.packed = false;
    bo.pad_id = 7;
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), 0);
    assert_int_equal(zt_sft_loader_batches_per_epoch(l), 2);
    assert_int_equal(zt_sft_loader_next(l, &x.b, &err), 0);
    assert_int_equal(x.ns[0], 2);
    assert_int_equal(x.cu[1], 5);
    assert_int_equal(x.cu[2], 10);
    assert_int_equal(x.tok[5], 7);
    assert_int_equal(x.pos[5], 0);
    assert_int_equal(x.tgt[5], -1);
    assert_int_equal(x.tok[10], 'e');
    assert_int_equal(x.b.trained, 3 + 3);
    assert_int_equal(zt_sft_loader_next(l, &x.b, &err), 0);
    assert_int_equal(x.tok[0], 'h');
    zt_data_position pos;
    zt_sft_loader_get_position(l, &pos);
    assert_int_equal(pos.epoch, 1);
    assert_int_equal(pos.window, 0);
    zt_sft_loader_destroy(l);
    zt_sft_close(d);
}

static void test_truncation(void **state)
{
    (void)state;
    zt_sft_options o = {.eos_token = "#"};
    zt_sft_data *d = open_ok("{\"prompt\": \"ab\", \"completion\": \"cdefgh\"}\n{\"prompt\": \"abcdef\", "
                             "\"completion\": \"g\"}\n{\"prompt\": \"a\", \"completion\": \"b\"}\n", &o);
    zt_sft_loader *l = NULL;
    zt_err err;
    zt_sft_batch_options bo = {.B = 1, .T = 5, .packed = false, .overlong = ZT_SFT_REFUSE};
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), ZT_EINVAL_CONFIG);
    assert_null(l);
    assert_non_null(strstr(err.msg, "2 examples are longer than the sequence length 5"));
    assert_non_null(strstr(err.msg, "line 1, has 9 tokens"));
    bo.overlong = ZT_SFT_TRUNCATE;
    assert_int_equal(zt_sft_loader_create(&l, d, &bo, &err), 0);
    assert_int_equal(zt_sft_loader_truncated(l), 2);
    assert_int_equal(zt_sft_loader_dropped(l), 1); /* "abcdef" + "g#": nothing trained in the first 5 */
    assert_int_equal(zt_sft_loader_batches_per_epoch(l), 2);
    bufs x;
    bufs_init(&x);
    assert_int_equal(zt_sft_loader_next(l, &x.b, &err), 0);
    const int32_t want[5] = {-1, 'c', 'd', 'e', -1};
    for (int j = 0; j < 5; j++) {
        assert_int_equal(x.tok[j], "abcde"[j]);
        assert_int_equal(x.tgt[j], want[j]);
    }
    assert_int_equal(x.ns[0], 1);
    assert_int_equal(x.cu[1], 5);
    zt_sft_loader_destroy(l);
    zt_sft_close(d);
}

static void test_shuffle_resume(void **state)
{
    (void)state;
    char text[8192] = "";
    for (int i = 0; i < 40; i++) {
        char line[128];
        snprintf(line, sizeof line, "{\"prompt\": \"%.*s\", \"completion\": \"%.*s\"}\n", 1 + i % 7, "ppppppppp",
                 1 + (i * 5) % 9, "ccccccccccc");
        strcat(text, line);
    }
    zt_sft_options o = {.eos_token = "#"};
    zt_sft_data *d = open_ok(text, &o);
    zt_sft_batch_options bo = {.B = 2, .T = 20, .packed = true, .shuffle = true, .seed = 5};
    zt_sft_loader *a, *b;
    zt_err err;
    assert_int_equal(zt_sft_loader_create(&a, d, &bo, &err), 0);
    assert_int_equal(zt_sft_loader_create(&b, d, &bo, &err), 0);
    bufs x, y;
    bufs_init(&x);
    bufs_init(&y);
    const uint64_t per = zt_sft_loader_batches_per_epoch(a);
    /* every example once an epoch, and the rows of an epoch hold the tokens of the file */
    uint64_t served = 0;
    for (uint64_t k = 0; k < per; k++) {
        assert_int_equal(zt_sft_loader_next(a, &x.b, &err), 0);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(x.cu[r * 21 + x.ns[r]], 20);
        }
        served += (uint64_t)x.b.examples;
    }
    zt_sft_stats s;
    zt_sft_get_stats(d, &s);
    assert_int_equal(served, s.examples);
    assert_true(zt_sft_loader_tokens(a) == s.tokens);
    /* a position restores the batches */
    for (int k = 0; k < 3; k++)
        assert_int_equal(zt_sft_loader_next(a, &x.b, &err), 0);
    zt_data_position pos;
    zt_sft_loader_get_position(a, &pos);
    assert_int_equal(pos.epoch, 1);
    assert_int_equal(pos.window, 3);
    assert_int_equal(zt_sft_loader_set_position(b, &pos, &err), 0);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(zt_sft_loader_next(a, &x.b, &err), 0);
        assert_int_equal(zt_sft_loader_next(b, &y.b, &err), 0);
        assert_memory_equal(x.tok, y.tok, sizeof x.tok);
        assert_memory_equal(x.tgt, y.tgt, sizeof x.tgt);
    }
    pos.window = 1000;
    assert_int_equal(zt_sft_loader_set_position(b, &pos, &err), ZT_EINVAL_CONFIG);
    /* another epoch, another order */
    zt_sft_loader_reset(b);
    assert_int_equal(zt_sft_loader_next(b, &y.b, &err), 0);
    zt_data_position p0 = {1, 0, 0};
    assert_int_equal(zt_sft_loader_set_position(a, &p0, &err), 0);
    assert_int_equal(zt_sft_loader_next(a, &x.b, &err), 0);
    assert_memory_not_equal(x.tok, y.tok, sizeof x.tok);
    zt_sft_loader_destroy(a);
    zt_sft_loader_destroy(b);
    zt_sft_close(d);
}

static int count_caches(void)
{
    int n = 0;
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        n += strstr(e->d_name, ".sftcache") != NULL;
    closedir(dd);
    return n;
}

static void test_cache(void **state)
{
    (void)state;
    const char *tokfile = write_file("tokenizer.json", "{\"stands for\": \"the tokenizer file\"}");
    char tokpath[600];
    snprintf(tokpath, sizeof tokpath, "%s", tokfile);
    zt_sft_options o = {.eos_token = "#", .tokenizer_path = tokpath};
    const char *data = "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n";
    zt_sft_data *d = open_ok(data, &o);
    zt_sft_stats s;
    zt_sft_get_stats(d, &s);
    assert_false(s.from_cache);
    zt_sft_close(d);
    assert_int_equal(count_caches(), 1);
    d = open_ok(data, &o);
    zt_sft_get_stats(d, &s);
    assert_true(s.from_cache);
    expect_example(d, 0, "abcd", 2, true);
    zt_sft_close(d);
    /* a changed input, or changed options, are not served from the cache */
    d = open_ok("{\"prompt\": \"ab\", \"completion\": \"xy\"}\n", &o);
    zt_sft_get_stats(d, &s);
    assert_false(s.from_cache);
    expect_example(d, 0, "abxy", 2, true);
    zt_sft_close(d);
    o.train_on_prompt = true;
    d = open_ok(data, &o);
    zt_sft_get_stats(d, &s);
    assert_false(s.from_cache);
    expect_example(d, 0, "abcd", 0, true);
    zt_sft_close(d);
    /* a changed tokenizer file too */
    o.train_on_prompt = false;
    write_file("tokenizer.json", "{\"another\": 1}");
    d = open_ok(data, &o);
    zt_sft_get_stats(d, &s);
    assert_false(s.from_cache);
    zt_sft_close(d);
    /* a damaged cache is read as none */
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        if (strstr(e->d_name, ".sftcache")) {
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            FILE *f = fopen(p, "r+");
            fseek(f, -3, SEEK_END);
            fputs("zzz", f);
            fseek(f, 0, SEEK_END);
            fputs("extra", f);
            fclose(f);
        }
    closedir(dd);
    d = open_ok(data, &o);
    zt_sft_get_stats(d, &s);
    assert_false(s.from_cache);
    expect_example(d, 0, "abcd", 2, true);
    zt_sft_close(d);
    /* a cache directory of its own */
    char cdir[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    assert_int_equal(mkdir(cdir, 0755), 0);
    o.cache_dir = cdir;
    d = open_ok(data, &o);
    zt_sft_close(d);
    d = open_ok(data, &o);
    zt_sft_get_stats(d, &s);
    assert_true(s.from_cache);
    zt_sft_close(d);
    DIR *cd = opendir(cdir);
    while ((e = readdir(cd)) != NULL)
        if (e->d_name[0] != '.') {
            char p[900];
            snprintf(p, sizeof p, "%s/%s", cdir, e->d_name);
            unlink(p);
        }
    closedir(cd);
    rmdir(cdir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_completion), cmocka_unit_test(test_alpaca),
        cmocka_unit_test(test_chat_masks),        cmocka_unit_test(test_render_families),
        cmocka_unit_test(test_render_rules),      cmocka_unit_test(test_detect),
        cmocka_unit_test(test_bad_input),         cmocka_unit_test(test_untrained_dropped),
        cmocka_unit_test(test_seq2seq),           cmocka_unit_test(test_packing),
        cmocka_unit_test(test_truncation),        cmocka_unit_test(test_shuffle_resume),
        cmocka_unit_test(test_cache),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
