/* Runs the chat templates and the supervised data reader (worker/data/chat_template.h, worker/data/sft.h) for
 * the interop check against transformers (tests/interop/chat_template_check.py):
 *
 *   sft_tool chat TOKENIZER.json CONFIG.json IN.jsonl OUT [--gen]
 *       CONFIG.json is a tokenizer_config.json (chat_template, bos_token, eos_token); each line of IN is a
 *       chat {"messages": [...]}; OUT gets, per line, "IDS | FLAGS" (the template's name first, on a line
 *       "template NAME"), or "error: MESSAGE" for a chat the template refuses. --gen renders with the
 *       generation prompt.
 *   sft_tool open TOKENIZER.json CONFIG.json DATA.jsonl OUT [--train-on-prompt] [--eos TOKEN]
 *       reads DATA with zt_sft_open (CONFIG.json "-": no template); OUT gets "LINE: IDS | FLAGS" per example.
 *   sft_tool detect CONFIG.json       prints the name of the template recognised, or the error.
 * Exit status: 0, 1 when something is refused (message on stderr), 2 on bad arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "worker/data/chat_template.h"
#include "worker/data/sft.h"
#include "worker/data/tokenize.h"

static void put_ids(FILE *f, const int32_t *ids, const uint8_t *tr, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, i ? " %d" : "%d", (int)ids[i]);
    fputs(" |", f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %d", (int)tr[i]);
    fputc('\n', f);
}

static int chat(const zt_tokenizer *tok, const zt_chat_template *t, const char *in, const char *out, bool gen)
{
    FILE *fi = fopen(in, "r"), *fo = fopen(out, "w");
    if (!fi || !fo) {
        fprintf(stderr, "sft_tool: cannot open %s or %s\n", in, out);
        return 1;
    }
    fprintf(fo, "template %s\n", zt_chat_template_name(t));
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, fi) > 0) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
        int n = cJSON_GetArraySize(msgs);
        zt_chat_message *m = calloc((size_t)n + 1, sizeof *m);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, msgs) {
            const char *role = cJSON_GetObjectItemCaseSensitive(e, "role")->valuestring;
            const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
            m[i].role = strcmp(role, "system") == 0 ? ZT_CHAT_SYSTEM : strcmp(role, "user") == 0 ? ZT_CHAT_USER
                                                                                               : ZT_CHAT_ASSISTANT;
            m[i].content = content;
            m[i].len = strlen(content);
            i++;
        }
        int32_t *ids = NULL;
        uint8_t *tr = NULL;
        size_t nt = 0;
        zt_err err;
        if (zt_sft_encode_chat(tok, t, m, n, gen, &ids, &tr, &nt, &err) == 0)
            put_ids(fo, ids, tr, nt);
        else
            fprintf(fo, "error: %s\n", err.msg);
        free(ids);
        free(tr);
        free(m);
        cJSON_Delete(o);
    }
    free(line);
    fclose(fi);
    return fclose(fo) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    zt_err err;
    if (argc == 3 && strcmp(argv[1], "detect") == 0) {
        zt_chat_template *t;
        if (zt_chat_template_load(&t, argv[2], NULL, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("%s\n", zt_chat_template_name(t));
        zt_chat_template_destroy(t);
        return 0;
    }
    if (argc < 6 || (strcmp(argv[1], "chat") != 0 && strcmp(argv[1], "open") != 0)) {
        fprintf(stderr, "usage: sft_tool chat|open TOKENIZER.json CONFIG.json IN OUT [options]\n");
        return 2;
    }
    zt_tokenizer *tok = NULL;
    if (zt_tokenizer_load(&tok, argv[2], &err) < 0) {
        fprintf(stderr, "sft_tool: %s\n", err.msg);
        return 1;
    }
    zt_chat_template *t = NULL;
    if (strcmp(argv[3], "-") != 0 && zt_chat_template_load(&t, argv[3], NULL, &err) < 0) {
        fprintf(stderr, "sft_tool: %s\n", err.msg);
        zt_tokenizer_destroy(tok);
        return 1;
    }
    int rc = 0;
    if (strcmp(argv[1], "chat") == 0) {
        rc = t ? chat(tok, t, argv[4], argv[5], argc > 6 && strcmp(argv[6], "--gen") == 0) : 2;
    } else {
        zt_sft_options o = {.chat_template = t};
        for (int i = 6; i < argc; i++) {
            if (strcmp(argv[i], "--train-on-prompt") == 0)
                o.train_on_prompt = true;
            else if (strcmp(argv[i], "--eos") == 0 && i + 1 < argc)
                o.eos_token = argv[++i];
        }
        zt_sft_data *d = NULL;
        if (zt_sft_open(&d, argv[4], tok, &o, &err) < 0) {
            fprintf(stderr, "sft_tool: %s\n", err.msg);
            rc = 1;
        } else {
            FILE *fo = fopen(argv[5], "w");
            for (size_t i = 0; fo && i < zt_sft_count(d); i++) {
                zt_sft_example ex;
                zt_sft_get(d, i, &ex);
                fprintf(fo, "%zu: ", ex.line);
                put_ids(fo, ex.ids, ex.trained, ex.n);
            }
            rc = fo && fclose(fo) == 0 ? 0 : 1;
            zt_sft_close(d);
        }
    }
    zt_chat_template_destroy(t);
    zt_tokenizer_destroy(tok);
    return rc;
}
