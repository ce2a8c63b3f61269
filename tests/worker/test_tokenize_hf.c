/* Tests of the Hugging Face tokenizer.json tokenizers (worker/data/tokenize.h) on small hand-written files:
 * byte-level BPE, BPE with byte fallback (LLaMA-2 style), WordPiece (BERT), Unigram (T5: its Viterbi, the
 * precompiled charsmap, Metaspace), added tokens, post-processors,
 * decoding and per-token bytes, every refusal of an unimplemented component, and `ztrain tokenize
 * --tokenizer`. The comparison with the tokenizers library itself is tests/interop/tokenizers_check.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/cli/commands.h"
#include "worker/data/dataloader.h"
#include "worker/data/tokenize.h"
#include "worker/data/unicode.h"

/* A tokenizer.json from its parts (JSON text each; "null" where absent). */
static char *make_json(const char *added, const char *normalizer, const char *pre, const char *post,
                       const char *decoder, const char *model)
{
    const char *fmt = "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": %s, "
                      "\"normalizer\": %s, \"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": %s, "
                      "\"model\": %s}";
    size_t n = strlen(fmt) + strlen(added) + strlen(normalizer) + strlen(pre) + strlen(post) + strlen(decoder) +
               strlen(model) + 1;
    char *s = malloc(n);
    assert_non_null(s);
    snprintf(s, n, fmt, added, normalizer, pre, post, decoder, model);
    return s;
}

static zt_tokenizer *load_ok(const char *json)
{
    zt_tokenizer *tok = NULL;
    zt_err err = {{0}};
    int rc = zt_tokenizer_load_json(&tok, json, "test.json", &err);
    if (rc != 0)
        fail_msg("load failed (%d): %s", rc, err.msg);
    return tok;
}

/* Encodes text and compares with the expected ids (n of them). */
static void expect_ids(const zt_tokenizer *tok, const char *text, unsigned flags, const int32_t *want, size_t n)
{
    int32_t *ids;
    size_t got;
    zt_err err;
    int rc = zt_tokenizer_encode_flags(tok, text, strlen(text), flags, &ids, &got, &err);
    if (rc != 0)
        fail_msg("encode '%s' failed: %s", text, err.msg);
    if (got != n) {
        for (size_t i = 0; i < got; i++)
            print_message("%d ", (int)ids[i]);
        print_message("\n");
        fail_msg("'%s': %zu ids, expected %zu", text, got, n);
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] != want[i])
            fail_msg("'%s': id %zu is %d, expected %d", text, i, (int)ids[i], (int)want[i]);
    free(ids);
}

static void expect_decode(const zt_tokenizer *tok, const int32_t *ids, size_t n, const char *want)
{
    char *text;
    size_t len;
    zt_err err;
    int rc = zt_tokenizer_decode(tok, ids, n, &text, &len, &err);
    if (rc != 0)
        fail_msg("decode failed: %s", err.msg);
    if (len != strlen(want) || memcmp(text, want, len) != 0)
        fail_msg("decoded '%s', expected '%s'", text, want);
    free(text);
}

static void expect_piece(const zt_tokenizer *tok, int32_t id, const char *want, size_t wlen)
{
    const char *b;
    size_t len;
    zt_err err;
    assert_int_equal(zt_tokenizer_token_bytes(tok, id, &b, &len, &err), 0);
    assert_int_equal(len, wlen);
    assert_memory_equal(b, want, wlen);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

/* ---- byte-level BPE (GPT-2 style) ---- */

static const char gpt2_vocab[] =
    "{\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3, \"\\u0120\": 4, \"w\": 5, \"r\": 6, \"d\": 7, \"he\": 8, \"ll\": 9, "
    "\"hell\": 10, \"hello\": 11, \"\\u0120w\": 12, \"or\": 13, \"\\u0120wor\": 14, \"'\": 15, \"s\": 16, \"'s\": 17, "
    "\"\\u00c3\": 18, \"\\u00a9\": 19, \"\\u010a\": 20}";

static char *gpt2_json(const char *pre, const char *merges)
{
    char model[2048];
    snprintf(model, sizeof(model),
             "{\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
             "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false, "
             "\"vocab\": %s, \"merges\": %s}",
             gpt2_vocab, merges);
    /* the added token takes the first id after the vocabulary (21), as in the library */
    return make_json("[{\"id\": 21, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
                     "\"rstrip\": false, \"normalized\": false, \"special\": true}]",
                     "null", pre, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
                                  "\"use_regex\": true}",
                     "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}",
                     model);
}

static const char gpt2_merges_list[] = "[[\"h\", \"e\"], [\"l\", \"l\"], [\"he\", \"ll\"], [\"hell\", \"o\"], "
                                       "[\"\\u0120\", \"w\"], [\"o\", \"r\"], [\"\\u0120w\", \"or\"], [\"'\", \"s\"]]";
static const char gpt2_merges_strings[] = "[\"#version: 0.2\", \"h e\", \"l l\", \"he ll\", \"hell o\", "
                                          "\"\\u0120 w\", \"o r\", \"\\u0120w or\", \"' s\"]";

static void test_byte_level_bpe(void **state)
{
    (void)state;
    const char *merges[2] = {gpt2_merges_list, gpt2_merges_strings};
    for (int m = 0; m < 2; m++) { /* merges as [a, b] lists and as "a b" strings give the same */
        char *json = gpt2_json("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
                               "\"use_regex\": true}",
                               merges[m]);
        zt_tokenizer *tok = load_ok(json);
        assert_string_equal(zt_tokenizer_kind(tok), "byte-level-bpe");
        assert_int_equal(zt_tokenizer_vocab_size(tok), 22);
        /* "hello world": hello | Ġworld -> Ġwor l d */
        expect_ids(tok, "hello world", 0, IDS(11, 14, 2, 7));
        /* the contraction 's is its own word; "é" is bytes C3 A9; a newline is Ċ */
        expect_ids(tok, "he's\n", 0, IDS(8, 17, 20));
        expect_ids(tok, "\xc3\xa9", 0, IDS(18, 19));
        /* the special token is cut out first; characters with no token are dropped (no unk_token) */
        expect_ids(tok, "hi<|endoftext|>hello", 0, IDS(0, 21, 11));
        /* the post-processor (ByteLevel) adds nothing */
        expect_ids(tok, "hello", ZT_TOKENIZE_ADD_SPECIAL, IDS(11));
        expect_decode(tok, IDS(11, 14, 2, 7, 21), "hello world<|endoftext|>");
        expect_decode(tok, IDS(18), "\xef\xbf\xbd"); /* half a character: U+FFFD, as the library */
        expect_piece(tok, 14, " wor", 4);
        expect_piece(tok, 18, "\xc3", 1); /* raw byte, for printing token by token */
        expect_piece(tok, 21, "<|endoftext|>", 13);
        zt_tokenizer_destroy(tok);
        free(json);
    }
    /* add_prefix_space: "hello" is " hello" */
    char *json = gpt2_json("{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
                           "\"use_regex\": true}",
                           gpt2_merges_list);
    zt_tokenizer *tok = load_ok(json);
    expect_ids(tok, "hello", 0, IDS(4, 11));
    expect_ids(tok, " hello", 0, IDS(4, 11));
    zt_tokenizer_destroy(tok);
    free(json);
    /* LLaMA-3 style: Split on cl100k's regex, then ByteLevel without its own regex */
    json = gpt2_json("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
                     "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
                     "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "
                     "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                     "false, \"trim_offsets\": true, \"use_regex\": false}]}",
                     gpt2_merges_list);
    tok = load_ok(json);
    expect_ids(tok, "hello world", 0, IDS(11, 14, 2, 7));
    expect_ids(tok, "he'S", 0, IDS(8, 15)); /* 'S is a contraction here (case-insensitive); S has no token */
    zt_tokenizer_destroy(tok);
    free(json);
}

/* ---- BPE with byte fallback (LLaMA-2 style) ---- */

static char *llama2_json(bool byte_fallback, bool fuse_unk)
{
    /* <unk> <s> </s>, then <0x00>..<0xFF> (ids 3..258), then pieces */
    size_t cap = 16384;
    char *vocab = malloc(cap);
    assert_non_null(vocab);
    size_t n = (size_t)snprintf(vocab, cap, "{\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int b = 0; b < 256 && byte_fallback; b++)
        n += (size_t)snprintf(vocab + n, cap - n, ", \"<0x%02X>\": %d", b, 3 + b);
    snprintf(vocab + n, cap - n, ", \"\\u2581\": 259, \"h\": 260, \"i\": 261, \"\\u2581h\": 262, \"\\u2581hi\": 263, "
                                 "\"\\u2581\\u2581\": 264}");
    char *model = malloc(cap);
    assert_non_null(model);
    snprintf(model, cap,
             "{\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"continuing_subword_prefix\": null, "
             "\"end_of_word_suffix\": null, \"fuse_unk\": %s, \"byte_fallback\": %s, \"ignore_merges\": false, "
             "\"vocab\": %s, \"merges\": [\"\\u2581 h\", \"\\u2581h i\", \"\\u2581 \\u2581\"]}",
             fuse_unk ? "true" : "false", byte_fallback ? "true" : "false", vocab);
    char *json = make_json(
        "[{\"id\": 0, \"content\": \"<unk>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true}, {\"id\": 1, \"content\": \"<s>\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}]",
        "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": "
        "\"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}",
        "null",
        "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
        "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": "
        "\"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}}",
        "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, "
        "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
        "\"content\": \" \", \"start\": 1, \"stop\": 0}]}",
        model);
    free(vocab);
    free(model);
    return json;
}

static void test_byte_fallback_bpe(void **state)
{
    (void)state;
    char *json = llama2_json(true, true);
    zt_tokenizer *tok = load_ok(json);
    assert_string_equal(zt_tokenizer_kind(tok), "bpe");
    assert_int_equal(zt_tokenizer_vocab_size(tok), 265);
    expect_ids(tok, "hi hi", 0, IDS(263, 263));
    /* "▁▁" is a token: the run of two spaces stays one word; ▁h (rank 0) merges before ▁▁ (rank 2) */
    expect_ids(tok, "hi  hi", 0, IDS(263, 259, 263));
    expect_ids(tok, "   ", 0, IDS(264, 264));
    expect_ids(tok, "hi hi", ZT_TOKENIZE_ADD_SPECIAL, IDS(1, 263, 263));
    /* é has no piece: its bytes C3 A9 */
    expect_ids(tok, "h\xc3\xa9", 0, IDS(262, 3 + 0xC3, 3 + 0xA9));
    /* an added token cuts the text; each piece gets its own "▁" */
    expect_ids(tok, "<s>hi", 0, IDS(1, 263));
    expect_decode(tok, IDS(263, 262, 3 + 0xC3, 3 + 0xA9), "hi h\xc3\xa9");
    expect_decode(tok, IDS(1, 263), "<s> hi");
    expect_decode(tok, IDS(3 + 0xC3, 263), "\xef\xbf\xbd hi"); /* a lone lead byte: one U+FFFD per byte */
    expect_piece(tok, 263, " hi", 3);
    expect_piece(tok, 3 + 0xC3, "\xc3", 1);
    zt_tokenizer_destroy(tok);
    free(json);

    /* no byte tokens: unknown characters become <unk>, fused when fuse_unk */
    json = llama2_json(false, true);
    tok = load_ok(json);
    expect_ids(tok, "hxyz", 0, IDS(262, 0));
    zt_tokenizer_destroy(tok);
    free(json);
    json = llama2_json(false, false);
    tok = load_ok(json);
    expect_ids(tok, "hxyz", 0, IDS(262, 0, 0, 0));
    zt_tokenizer_destroy(tok);
    free(json);
}

/* Metaspace instead of the normalizers: "first" prepends "▁" only where the text begins. */
static void test_metaspace(void **state)
{
    (void)state;
    char *json = llama2_json(true, true);
    const char *from = strstr(json, "\"normalizer\": {");
    const char *to = strstr(json, "\"pre_tokenizer\": null");
    assert_non_null(from);
    assert_non_null(to);
    char *edited = malloc(strlen(json) + 256);
    assert_non_null(edited);
    size_t head = (size_t)(from - json);
    memcpy(edited, json, head);
    sprintf(edited + head, "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "
                           "\"\\u2581\", \"prepend_scheme\": \"first\", \"split\": false}%s",
            to + strlen("\"pre_tokenizer\": null"));
    zt_tokenizer *tok = load_ok(edited);
    expect_ids(tok, "hi hi", 0, IDS(263, 263));
    expect_ids(tok, "<s>hi", 0, IDS(1, 260, 261)); /* after <s>: not the beginning, no "▁" */
    zt_tokenizer_destroy(tok);
    free(edited);
    free(json);
}

/* ---- WordPiece (BERT) ---- */

static char *bert_json(const char *normalizer, const char *extra_added)
{
    char added[1024];
    snprintf(added, sizeof(added),
             "[{\"id\": 1, \"content\": \"[CLS]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true}, {\"id\": 2, \"content\": \"[SEP]\", \"single_word\": false, "
             "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}%s]",
             extra_added);
    return make_json(added, normalizer, "{\"type\": \"BertPreTokenizer\"}",
                     "{\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}",
                     "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}",
                     "{\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
                     "\"max_input_chars_per_word\": 12, \"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, "
                     "\"un\": 3, \"##aff\": 4, \"##able\": 5, \"hello\": 6, \",\": 7, \"!\": 8, \"cafe\": 9, "
                     "\"\\u4e2d\": 10, \"caf\": 11, \"##\\u00e9\": 12}}");
}

static void test_wordpiece(void **state)
{
    (void)state;
    char *json = bert_json("{\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
                           "\"strip_accents\": null, \"lowercase\": true}",
                           ", {\"id\": 13, \"content\": \"Jerusalem\", \"single_word\": false, \"lstrip\": false, "
                           "\"rstrip\": false, \"normalized\": true, \"special\": false}");
    zt_tokenizer *tok = load_ok(json);
    assert_string_equal(zt_tokenizer_kind(tok), "wordpiece");
    assert_int_equal(zt_tokenizer_vocab_size(tok), 14);
    expect_ids(tok, "UnAffable, Hello!", 0, IDS(3, 4, 5, 7, 6, 8));
    expect_ids(tok, "UnAffable, Hello!", ZT_TOKENIZE_ADD_SPECIAL, IDS(1, 3, 4, 5, 7, 6, 8, 2));
    /* accents stripped (lowercase implies it), CJK split off, unknown word -> [UNK], tabs are spaces */
    expect_ids(tok, "Caf\xc3\xa9\t\xe4\xb8\xad\xe6\x96\x87 xyz", 0, IDS(9, 10, 0, 0));
    /* longer than max_input_chars_per_word (12) */
    expect_ids(tok, "unaffableunaffable", 0, IDS(0));
    /* a normalized added token matches the lowercased text */
    expect_ids(tok, "JERUSALEM!", 0, IDS(13, 8));
    expect_decode(tok, IDS(1, 3, 4, 5, 7, 6, 8, 2), "[CLS] unaffable, hello! [SEP]");
    expect_piece(tok, 4, "aff", 3);
    expect_piece(tok, 6, " hello", 6);
    expect_piece(tok, 7, ",", 1); /* cleanup: " ," is "," */
    /* pairs: [CLS] A [SEP] B [SEP] with B's segment 1; longest_first truncation cuts the longer text */
    {
        int32_t *ids, *types;
        size_t n;
        zt_err err;
        assert_int_equal(zt_tokenizer_encode_pair(tok, "UnAffable,", 10, "Hello!", 6, 0, &ids, &types, &n, &err), 0);
        const int32_t want_ids[] = {1, 3, 4, 5, 7, 2, 6, 8, 2}, want_types[] = {0, 0, 0, 0, 0, 0, 1, 1, 1};
        assert_int_equal(n, 9);
        assert_memory_equal(ids, want_ids, sizeof want_ids);
        assert_memory_equal(types, want_types, sizeof want_types);
        free(ids);
        free(types);
        assert_int_equal(zt_tokenizer_encode_pair(tok, "UnAffable,", 10, "Hello!", 6, 6, &ids, &types, &n, &err), 0);
        const int32_t cut_ids[] = {1, 3, 4, 2, 6, 2}; /* 3 tokens to share: B, the shorter, keeps 1, A 2 */
        assert_int_equal(n, 6);
        assert_memory_equal(ids, cut_ids, sizeof cut_ids);
        free(ids);
        free(types);
        assert_int_equal(zt_tokenizer_encode_pair(tok, "UnAffable,", 10, NULL, 0, 4, &ids, &types, &n, &err), 0);
        const int32_t single_ids[] = {1, 3, 4, 2};
        assert_int_equal(n, 4);
        assert_memory_equal(ids, single_ids, sizeof single_ids);
        free(ids);
        free(types);
        assert_int_equal(zt_tokenizer_encode_pair(tok, "a", 1, "b", 1, 2, &ids, &types, &n, &err), ZT_EINVAL_CONFIG);
        assert_non_null(strstr(err.msg, "3 special tokens"));
        assert_null(ids);
    }
    zt_tokenizer_destroy(tok);
    free(json);

    /* cased, accents kept: é is ##é */
    json = bert_json("{\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
                     "\"strip_accents\": null, \"lowercase\": false}",
                     "");
    tok = load_ok(json);
    expect_ids(tok, "caf\xc3\xa9 Hello", 0, IDS(11, 12, 0));
    zt_tokenizer_destroy(tok);
    free(json);
    /* NFD + StripAccents as separate normalizers; control characters dropped by clean_text */
    json = bert_json("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"BertNormalizer\", \"clean_text\": true, "
                     "\"handle_chinese_chars\": false, \"strip_accents\": false, \"lowercase\": false}, {\"type\": "
                     "\"NFD\"}, {\"type\": \"StripAccents\"}, {\"type\": \"Lowercase\"}]}",
                     "");
    tok = load_ok(json);
    expect_ids(tok, "C\x01" "AF\xc3\x89 hel\x7flo", 0, IDS(9, 6));
    zt_tokenizer_destroy(tok);
    free(json);
}

/* ---- refusals ---- */

static const char small_model[] =
    "{\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
    "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false, "
    "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}";

struct refusal {
    const char *added, *normalizer, *pre, *post, *decoder, *model;
    int rc;
    const char *words[3]; /* the message must hold each */
};

/* A tokenizer.json that is not UTF-8 (here an added token's content) is refused at load with the byte
 * offset, before any of its strings is read as UTF-8 (found by the fuzzing harness: the normalizer read
 * past the end of such a string). */
/* ---- Unigram (SentencePiece, T5) ---- */

/* Pieces and scores chosen for the Viterbi's ties: "ab" = "a" + "b" exactly (the piece wins, its path is
 * found first), "abc" loses to "ab" + "c", "d" is listed twice (the later id and score count), and "ee"'s
 * score is a number the library reads as -2.0000000000000004 where strtod gives -2.0, so "e" + "e" (-2.0)
 * beats it. The ids of every case below are the library's (tokenizers 0.23.3). */
static char *unigram_json(bool byte_fallback, bool unk)
{
    char model[1024];
    snprintf(model, sizeof(model),
             "{\"type\": \"Unigram\", \"unk_id\": %s, \"vocab\": [[\"<unk>\", 0.0], [\"a\", -1.0], [\"b\", -2.0], "
             "[\"ab\", -3.0], [\"c\", -1.5], [\"abc\", -5.0], [\"d\", -1.0], [\"<0x78>\", -20.0], [\"<0x79>\", -20.0], "
             "[\"d\", -0.5], [\"e\", -1.0], [\"ee\", -2.00000000000000017]], \"byte_fallback\": %s}",
             unk ? "0" : "null", byte_fallback ? "true" : "false");
    return make_json("[]", "null", "null", "null", "null", model);
}

static void test_unigram(void **state)
{
    (void)state;
    char *json = unigram_json(false, true);
    zt_tokenizer *tok = load_ok(json);
    assert_string_equal(zt_tokenizer_kind(tok), "unigram");
    assert_int_equal(zt_tokenizer_vocab_size(tok), 12);
    expect_ids(tok, "ab", 0, IDS(3));
    expect_ids(tok, "abc", 0, IDS(3, 4));
    expect_ids(tok, "abcabc", 0, IDS(3, 4, 3, 4));
    expect_ids(tok, "ba", 0, IDS(2, 1));
    expect_ids(tok, "d", 0, IDS(9));
    expect_ids(tok, "ee", 0, IDS(10, 10));
    expect_ids(tok, "", 0, NULL, 0);
    /* characters without a piece: one unknown token for the run */
    expect_ids(tok, "xyz", 0, IDS(0));
    expect_ids(tok, "axyb", 0, IDS(1, 0, 2));
    expect_ids(tok, "axzb", 0, IDS(1, 0, 2));
    zt_tokenizer_destroy(tok);
    free(json);

    /* byte fallback takes the fused run as a whole: "xy" has both bytes, "xz" not (then <unk>) */
    json = unigram_json(true, true);
    tok = load_ok(json);
    expect_ids(tok, "axyb", 0, IDS(1, 7, 8, 2));
    expect_ids(tok, "axzb", 0, IDS(1, 0, 2));
    expect_ids(tok, "xyz", 0, IDS(0));
    zt_tokenizer_destroy(tok);
    free(json);

    /* no unk_id: a text with a character without a piece is refused, as the library refuses it */
    json = unigram_json(false, false);
    tok = load_ok(json);
    expect_ids(tok, "ab", 0, IDS(3));
    int32_t *ids;
    size_t n;
    zt_err err;
    assert_int_equal(zt_tokenizer_encode_flags(tok, "ax", 2, 0, &ids, &n, &err), ZT_EINVAL_CONFIG);
    assert_non_null(strstr(err.msg, "U+0078"));
    assert_non_null(strstr(err.msg, "unk_id"));
    zt_tokenizer_destroy(tok);
    free(json);
}

/* A precompiled charsmap made by tests/interop/tokenizers_check.py (charsmap_base64) from
 * {"ﬁ": "fi", "\t": " ", "\r": " ", "\n": " ", "e\u0301": "é", "™": "TM", "\x01": ""}. */
static const char small_charsmap[] =
    "AAQAAAAAAAABRQAAAAAAAAkAAIAAAAAAAAAAAAYAAIAAAAAAAAAAAAkZAAAKEQAAAwAAgAEAAIANBQAAAQAAgAEAAIAAAACAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAZYgBAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAhBQCAAAAAAAA"
    "AAAAgQECAAAAAAAAAAAAAAAAAAAAAAAAAAAAgQkCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAooUC"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAArLwCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAzAwDAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAADimAMAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA77gDAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIADDqQBUTQBmaQA=";

/* T5's pipeline around a small vocabulary: Precompiled, Strip (right), Replace " {2,}" -> "▁", WhitespaceSplit
 * + Metaspace, $A </s>, a Metaspace decoder. pre: another pre_tokenizer; norm: another normalizer. */
static char *t5_json(const char *norm, const char *pre)
{
    static const char vocab[] =
        "[[\"<pad>\", 0.0], [\"</s>\", 0.0], [\"<unk>\", 0.0], [\"\\u2581\", -2.0], [\"\\u2581fi\", -3.0], "
        "[\"x\", -2.5], [\"\\u00e9\", -3.0], [\"TM\", -4.0], [\"\\u2581TM\", -4.5], [\"fi\", -3.5], "
        "[\"\\u2581a\", -3.0], [\"b\", -3.0], [\"\\u2581\\u2581\", -5.0], [\"\\u2581\\u00e9\", -3.5], [\"\\u2581b\", -3.0]]";
    size_t cap = sizeof(small_charsmap) + 4096;
    char *model = malloc(cap), *normalizer = malloc(cap);
    assert_non_null(model);
    assert_non_null(normalizer);
    snprintf(model, cap, "{\"type\": \"Unigram\", \"unk_id\": 2, \"vocab\": %s, \"byte_fallback\": false}", vocab);
    if (norm)
        snprintf(normalizer, cap, norm, small_charsmap);
    else
        snprintf(normalizer, cap,
                 "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Precompiled\", \"precompiled_charsmap\": "
                 "\"%s\"}, {\"type\": \"Strip\", \"strip_left\": false, \"strip_right\": true}, {\"type\": "
                 "\"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, \"content\": \"\\u2581\"}]}",
                 small_charsmap);
    char *json = make_json(
        "[{\"id\": 0, \"content\": \"<pad>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true}, {\"id\": 1, \"content\": \"</s>\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}, {\"id\": 2, \"content\": "
        "\"<unk>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
        "\"special\": true}]",
        normalizer,
        pre ? pre
            : "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"WhitespaceSplit\"}, {\"type\": \"Metaspace\", "
              "\"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\", \"split\": true}]}",
        "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
        "{\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"</s>\": "
        "{\"id\": \"</s>\", \"ids\": [1], \"tokens\": [\"</s>\"]}}}",
        "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\", \"split\": true}",
        model);
    free(model);
    free(normalizer);
    return json;
}

static void expect_normalized(const zt_tokenizer *tok, const char *text, const char *want)
{
    char *out;
    size_t len;
    zt_err err;
    assert_int_equal(zt_tokenizer_normalize(tok, text, strlen(text), &out, &len, &err), 0);
    if (len != strlen(want) || memcmp(out, want, len) != 0)
        fail_msg("'%s' normalized to '%s', expected '%s'", text, out, want);
    free(out);
}

static void test_unigram_t5(void **state)
{
    (void)state;
    char *json = t5_json(NULL, NULL);
    zt_tokenizer *tok = load_ok(json);
    assert_string_equal(zt_tokenizer_kind(tok), "unigram");
    /* the charsmap: a key, a two-character key, a key that begins a grapheme cluster shorter than 6 bytes
     * (the whole cluster is replaced: the accent goes), CR LF as one cluster (one space), a key mapped to
     * nothing; then Strip and Replace */
    expect_normalized(tok, "\xef\xac\x81x", "fix");
    expect_normalized(tok, "e\xcc\x81", "\xc3\xa9");
    expect_normalized(tok, "\xe2\x84\xa2\xcc\x81", "TM");
    expect_normalized(tok, "a\r\nb", "a b");
    expect_normalized(tok, "a\n\nb", "a\xe2\x96\x81" "b");
    expect_normalized(tok, "a\x01" "b", "ab");
    expect_normalized(tok, "  \xef\xac\x81x\tx  ", "\xe2\x96\x81" "fix x");
    expect_ids(tok, "\xef\xac\x81x", 0, IDS(4, 5));
    expect_ids(tok, "\xef\xac\x81x", ZT_TOKENIZE_ADD_SPECIAL, IDS(4, 5, 1));
    expect_ids(tok, "  \xef\xac\x81x\tx  ", ZT_TOKENIZE_ADD_SPECIAL, IDS(4, 5, 3, 5, 1));
    expect_ids(tok, "a\r\nb", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 14, 1));
    expect_ids(tok, "e\xcc\x81", ZT_TOKENIZE_ADD_SPECIAL, IDS(13, 1));
    expect_ids(tok, "\xe2\x84\xa2\xcc\x81", ZT_TOKENIZE_ADD_SPECIAL, IDS(8, 1));
    expect_ids(tok, "x\xe2\x84\xa2", ZT_TOKENIZE_ADD_SPECIAL, IDS(3, 5, 7, 1));
    expect_ids(tok, "a\x01" "b", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 11, 1));
    expect_ids(tok, "zz q", ZT_TOKENIZE_ADD_SPECIAL, IDS(3, 2, 3, 2, 1));
    expect_ids(tok, "x   x", ZT_TOKENIZE_ADD_SPECIAL, IDS(3, 5, 3, 5, 1));
    expect_ids(tok, "a</s>b", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 1, 14, 1));
    expect_decode(tok, IDS(4, 5, 3, 5, 1), "fix x</s>");
    expect_decode(tok, IDS(3, 2, 3, 2, 1), "<unk> <unk></s>");
    zt_tokenizer_destroy(tok);
    free(json);

    /* the older form: the charsmap alone and Metaspace (add_prefix_space): runs of spaces are runs of "▁" */
    json = t5_json("{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"%s\"}",
                   "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"add_prefix_space\": true}");
    tok = load_ok(json);
    expect_ids(tok, "a  b", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 3, 14, 1));
    expect_ids(tok, "a\tb", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 14, 1));
    expect_ids(tok, " a", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 1));
    expect_ids(tok, "\xef\xac\x81 \xef\xac\x81", ZT_TOKENIZE_ADD_SPECIAL, IDS(4, 4, 1));
    zt_tokenizer_destroy(tok);
    free(json);

    /* prepend_scheme first: "▁" only where the text begins, not after an added token */
    json = t5_json("null", "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\", "
                           "\"split\": true}");
    tok = load_ok(json);
    expect_ids(tok, "a b", ZT_TOKENIZE_ADD_SPECIAL, IDS(10, 14, 1));
    expect_ids(tok, "</s>b", ZT_TOKENIZE_ADD_SPECIAL, IDS(1, 11, 1));
    expect_ids(tok, "b</s>b", ZT_TOKENIZE_ADD_SPECIAL, IDS(14, 1, 11, 1));
    zt_tokenizer_destroy(tok);
    free(json);
}

/* NFC, NFKC and NFKD: compatibility characters (ligature, circled digit, the Arabic ligature of 18
 * characters), a singleton (the Angstrom sign), Hangul jamo, marks to reorder and compose, a mark blocked
 * from its base by one of the same class, a text that begins with a mark. The results are the library's. */
static void test_unicode_forms(void **state)
{
    (void)state;
    const char *text = "\xef\xac\x81x \xe2\x91\xa0 \xe2\x84\xab \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 e\xcc\x81\xcc\xa3 "
                       "\xcc\xa3" "e\xcc\x81 \xc3\x85\xcc\x81 \xef\xb7\xba a\xcc\xa8\xcc\x81 \xcc\x81x";
    static const char arabic[] = "\xd8\xb5\xd9\x84\xd9\x89 \xd8\xa7\xd9\x84\xd9\x84\xd9\x87 \xd8\xb9\xd9\x84\xd9\x8a"
                                 "\xd9\x87 \xd9\x88\xd8\xb3\xd9\x84\xd9\x85";
    char want[3][512];
    snprintf(want[0], sizeof(want[0]), "%s",
             "\xef\xac\x81x \xe2\x91\xa0 \xc3\x85 \xea\xb0\x81 \xe1\xba\xb9\xcc\x81 \xcc\xa3\xc3\xa9 \xc7\xba "
             "\xef\xb7\xba \xc4\x85\xcc\x81 \xcc\x81x");
    snprintf(want[1], sizeof(want[1]), "fix 1 \xc3\x85 \xea\xb0\x81 \xe1\xba\xb9\xcc\x81 \xcc\xa3\xc3\xa9 \xc7\xba %s "
             "\xc4\x85\xcc\x81 \xcc\x81x", arabic);
    snprintf(want[2], sizeof(want[2]), "fix 1 A\xcc\x8a \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 e\xcc\xa3\xcc\x81 "
             "\xcc\xa3" "e\xcc\x81 A\xcc\x8a\xcc\x81 %s a\xcc\xa8\xcc\x81 \xcc\x81x", arabic);
    const char *forms[3] = {"NFC", "NFKC", "NFKD"};
    for (int f = 0; f < 3; f++) {
        char norm[64];
        snprintf(norm, sizeof(norm), "{\"type\": \"%s\"}", forms[f]);
        char *json = make_json("[]", norm, "null", "null", "null", small_model);
        zt_tokenizer *tok = load_ok(json);
        expect_normalized(tok, text, want[f]);
        zt_tokenizer_destroy(tok);
        free(json);
    }
}

static void test_not_utf8(void **state)
{
    (void)state;
    char *json = bert_json("{\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
                           "\"strip_accents\": null, \"lowercase\": true}",
                           ", {\"id\": 13, \"content\": \"ab\xe4\xb8\", \"single_word\": false, \"lstrip\": false, "
                           "\"rstrip\": false, \"normalized\": true, \"special\": false}");
    zt_tokenizer *tok = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_tokenizer_load_json(&tok, json, "bad.json", &err), ZT_EFORMAT);
    assert_null(tok);
    assert_non_null(strstr(err.msg, "bad.json: not UTF-8 at byte"));
    free(json);
}

static void test_refusals(void **state)
{
    (void)state;
    const char *M = small_model;
    const struct refusal cases[] = {
        {"[]", "null", "null", "null", "null", "{\"type\": \"WordLevel\", \"vocab\": {}}", ZT_EUNSUPPORTED,
         {"model.type", "WordLevel", "BPE, WordPiece and Unigram"}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"Unigram\", \"unk_id\": 2, \"vocab\": [[\"a\", -1.0], "
         "[\"b\", -2.0]]}", ZT_EFORMAT, {"model.unk_id", "2 pieces", NULL}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", \"x\"]]}",
         ZT_EFORMAT, {"model.vocab[0]", "[piece, score]", NULL}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", 0.0]], "
         "\"alpha\": 0.1}", ZT_EUNSUPPORTED, {"model.alpha", NULL, NULL}},
        {"[]", "{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"not base64!\"}", "null", "null", "null",
         M, ZT_EFORMAT, {"normalizer.precompiled_charsmap", "base64", NULL}},
        {"[]", "{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"QAAAAA==\"}", "null", "null", "null", M,
         ZT_EFORMAT, {"normalizer.precompiled_charsmap", "trie fits", NULL}},
        {"[]", "{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"BAAAAAAAAAA=\"}",
         "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\", \"split\": false}",
         "null", "null", M, ZT_EUNSUPPORTED, {"pre_tokenizer.prepend_scheme", "first", NULL}},
        /* an id far above any vocabulary (found by fuzzing: the id tables took 3.5 GB) */
        {"[]", "null", "null", "null", "null", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 222222221}, "
         "\"merges\": []}", ZT_EUNSUPPORTED, {"token id 222222221", "8388607", NULL}},
        {"[]", "{\"type\": \"Nmt\"}", "null", "null", "null", M, ZT_EUNSUPPORTED, {"normalizer.type", "Nmt", NULL}},
        {"[]", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"}, {\"type\": \"Precompiled\"}]}", "null",
         "null", "null", M, ZT_EFORMAT, {"normalizer.normalizers[1].precompiled_charsmap", NULL, NULL}},
        {"[]", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {3,}\"}, \"content\": \" \"}", "null", "null",
         "null", M, ZT_EUNSUPPORTED, {"normalizer.pattern", "Regex", " {2,}"}},
        {"[]", "{\"type\": \"Lowercase\", \"extra\": 1}", "null", "null", "null", M, ZT_EUNSUPPORTED,
         {"normalizer.extra", NULL, NULL}},
        {"[]", "null", "{\"type\": \"Whitespace\"}", "null", "null", M, ZT_EUNSUPPORTED,
         {"pre_tokenizer.type", "Whitespace", NULL}},
        {"[]", "{\"type\": \"BertNormalizer\"}", "{\"type\": \"Metaspace\", \"replacement\": \"_\", "
               "\"prepend_scheme\": \"first\", \"split\": false}", "null", "null", M, ZT_EUNSUPPORTED,
         {"pre_tokenizer.prepend_scheme", "first", NULL}},
        {"[]", "null", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\", "
                       "\"invert\": false}", "null", "null", M, ZT_EUNSUPPORTED,
         {"pre_tokenizer.pattern", "\\\\w+", "regex"}},
        {"[]", "null", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"String\": "
                       "\" \"}, \"behavior\": \"Removed\", \"invert\": true}]}", "null", "null", M, ZT_EUNSUPPORTED,
         {"pre_tokenizer.pretokenizers[0].invert", "true", NULL}},
        {"[]", "null", "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Sideways\", "
                       "\"invert\": false}", "null", "null", M, ZT_EFORMAT, {"pre_tokenizer.behavior", NULL, NULL}},
        {"[]", "null", "null", "null", "{\"type\": \"CTC\", \"pad_token\": \"<pad>\"}", M, ZT_EUNSUPPORTED,
         {"decoder.type", "CTC", NULL}},
        {"[]", "null", "null", "{\"type\": \"Unknown\"}", "null", M, ZT_EUNSUPPORTED,
         {"post_processor.type", "Unknown", NULL}},
        {"[]", "null", "null", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", "
                               "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], "
                               "\"special_tokens\": {}}", "null", M, ZT_EFORMAT, {"<x>", "special_tokens", NULL}},
        {"[{\"id\": 3, \"content\": \"<m>\", \"single_word\": true, \"lstrip\": false, \"rstrip\": false, "
         "\"normalized\": false, \"special\": true}]", "null", "null", "null", "null", M, ZT_EUNSUPPORTED,
         {"added_tokens[0].single_word", NULL, NULL}},
        {"[]", "null", "null", "null", "null",
         "{\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}", ZT_EUNSUPPORTED,
         {"model.dropout", "0.1", "null"}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}",
         ZT_EFORMAT, {"model.merges[0]", "'c'", NULL}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}",
         ZT_EFORMAT, {"model.vocab", NULL, NULL}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": "
                                              "{\"a\": 0}}", ZT_EFORMAT, {"[UNK]", "model.unk_token", NULL}},
        {"[]", "null", "null", "null", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"_+\"}, \"content\": "
                                       "\" \"}", M, ZT_EUNSUPPORTED, {"decoder.pattern", "Regex", NULL}},
        {"[]", "null", "null", "null", "{\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": 0}", M,
         ZT_EFORMAT, {"decoder.content", "one character", NULL}},
        {"[]", "null", "null", "null", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
                                       "\"CTC\"}]}", M, ZT_EUNSUPPORTED, {"decoder.decoders[1].type", "CTC", NULL}},
        {"[]", "null", "null", "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", "
                               "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"pair\": [], "
                               "\"special_tokens\": {}}", "null", M, ZT_EUNSUPPORTED,
         {"post_processor.single[1]", "sequence A once", NULL}},
        {"[]", "null", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"add_prefix_space\": false, "
                       "\"prepend_scheme\": \"always\"}", "null", "null", M, ZT_EFORMAT,
         {"pre_tokenizer.prepend_scheme", "add_prefix_space", NULL}},
        {"[]", "{\"normalizers\": []}", "null", "null", "null", M, ZT_EFORMAT, {"normalizer.type", NULL, NULL}},
        {"[{\"id\": 3, \"special\": true}]", "null", "null", "null", "null", M, ZT_EFORMAT,
         {"added_tokens[0].content", NULL, NULL}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}",
         ZT_EFORMAT, {"model.merges[0]", NULL, NULL}},
        {"[]", "null", "null", "null", "null", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": "
                                              "[\"a b\"]}", ZT_EFORMAT, {"model.merges[0]", "'ab'", NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct refusal *c = &cases[i];
        char *json = make_json(c->added, c->normalizer, c->pre, c->post, c->decoder, c->model);
        zt_tokenizer *tok = (zt_tokenizer *)0x1;
        zt_err err = {{0}};
        int rc = zt_tokenizer_load_json(&tok, json, "bad.json", &err);
        if (rc != c->rc)
            fail_msg("case %zu: rc %d, expected %d (%s)", i, rc, c->rc, err.msg);
        assert_null(tok);
        assert_non_null(strstr(err.msg, "bad.json"));
        for (int w = 0; w < 3 && c->words[w]; w++)
            if (!strstr(err.msg, c->words[w]))
                fail_msg("case %zu: '%s' is not in the message: %s", i, c->words[w], err.msg);
        free(json);
    }

    /* top-level fields */
    const char *top[][2] = {
        {"{\"version\": \"2.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "version"},
        {"{\"truncation\": {\"max_length\": 512}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
         "truncation"},
        {"{\"padding\": {\"strategy\": \"BatchLongest\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": "
         "[]}}", "padding"},
        {"{\"colour\": 1, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "colour"},
    };
    for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++) {
        zt_tokenizer *tok;
        zt_err err;
        assert_int_equal(zt_tokenizer_load_json(&tok, top[i][0], "top.json", &err), ZT_EUNSUPPORTED);
        if (!strstr(err.msg, top[i][1]))
            fail_msg("'%s' is not in: %s", top[i][1], err.msg);
    }
    zt_tokenizer *tok;
    zt_err err;
    assert_int_equal(zt_tokenizer_load_json(&tok, "{\"model\": ", "trunc.json", &err), ZT_EFORMAT);
    assert_int_equal(zt_tokenizer_load_json(&tok, "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
                                            "empty.json", &err),
                     ZT_EFORMAT); /* an empty vocabulary */
    assert_true(zt_tokenizer_load(&tok, "/nonexistent/tokenizer.json", &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));
}

static void test_text_and_id_errors(void **state)
{
    (void)state;
    char *json = gpt2_json("{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", gpt2_merges_list);
    zt_tokenizer *tok = load_ok(json);
    int32_t *ids = (int32_t *)0x1;
    size_t n = 7;
    zt_err err;
    /* not UTF-8: refused with the offset of the bad byte */
    assert_int_equal(zt_tokenizer_encode(tok, "hel\xff", 4, &ids, &n, &err), ZT_EFORMAT);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err.msg, "byte 3"));
    assert_int_equal(zt_tokenizer_encode(tok, "\xed\xa0\x80", 3, &ids, &n, &err), ZT_EFORMAT); /* a surrogate */
    assert_int_equal(zt_tokenizer_encode(tok, "", 0, &ids, &n, &err), 0);
    assert_int_equal(n, 0);
    /* ids outside the vocabulary (22 is past the end) */
    char *text;
    size_t len;
    const char *b;
    assert_int_equal(zt_tokenizer_decode(tok, IDS(11, 22), &text, &len, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "token 22"));
    assert_int_equal(zt_tokenizer_token_bytes(tok, -1, &b, &len, &err), ZT_EMISMATCH);
    zt_tokenizer_destroy(tok);
    free(json);
    /* a model without "type" (older files): merges make it a BPE */
    json = make_json("[]", "null", "null", "null", "null", "{\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                     "\"merges\": [\"a b\"]}");
    tok = load_ok(json);
    assert_string_equal(zt_tokenizer_kind(tok), "bpe");
    expect_ids(tok, "ab", 0, IDS(2));
    zt_tokenizer_destroy(tok);
    free(json);
    /* a hole: ids 0 and 5 only */
    json = make_json("[]", "null", "null", "null", "null",
                     "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 5}, \"merges\": []}");
    tok = load_ok(json);
    assert_int_equal(zt_tokenizer_vocab_size(tok), 6);
    assert_int_equal(zt_tokenizer_decode(tok, IDS(0, 3), &text, &len, &err), ZT_EMISMATCH);
    assert_non_null(strstr(err.msg, "skip"));
    /* no decoder: the tokens joined with spaces, as the library */
    expect_decode(tok, IDS(0, 5, 0), "a b a");
    zt_tokenizer_destroy(tok);
    free(json);
}

static void test_utf8_and_unicode(void **state)
{
    (void)state;
    uint32_t cp;
    assert_int_equal(zt_utf8_decode((const unsigned char *)"\xe2\x82\xac", 3, &cp), 3);
    assert_int_equal(cp, 0x20AC);
    assert_int_equal(zt_utf8_decode((const unsigned char *)"\xc0\x80", 2, &cp), 0); /* overlong */
    assert_int_equal(zt_utf8_decode((const unsigned char *)"\xf4\x90\x80\x80", 4, &cp), 0); /* > U+10FFFF */
    assert_int_equal(zt_utf8_valid_prefix("ab\xe2\x82", 4), 2);
    /* maximal ill-formed parts, as Python and Rust replace them */
    assert_int_equal(zt_utf8_invalid_length((const unsigned char *)"\xe2\x82x", 3), 2);
    assert_int_equal(zt_utf8_invalid_length((const unsigned char *)"\xed\xa0\x80", 3), 1);
    assert_int_equal(zt_utf8_invalid_length((const unsigned char *)"\xf0\x9f\x98", 3), 3);
    assert_string_equal(zt_unicode_version(), "14.0.0");
    assert_true(zt_unicode_is_letter(0x4E2D));
    assert_true(zt_unicode_is_number(0x0663));
    assert_true(zt_unicode_is_white_space(0x3000));
    assert_false(zt_unicode_is_white_space(0x200B));
    assert_int_equal(zt_unicode_category(0x0301), ZT_UCAT_MN);
    uint32_t m[ZT_UNICODE_MAX_EXPANSION];
    assert_int_equal(zt_unicode_lower(0x0130, m), 2); /* İ -> i + U+0307 */
    assert_int_equal(m[1], 0x0307);
    assert_int_equal(zt_unicode_nfd(0xAC01, m), 3); /* Hangul 각 */
    assert_int_equal(zt_unicode_nfd(0x1E69, m), 3); /* ṩ -> s + U+0323 + U+0307 */
    assert_int_equal(zt_unicode_ccc(0x0323), 220);
}

/* ---- ztrain tokenize --tokenizer ---- */

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/zt_test_tokenize_hf_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_text(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int run_tokenize(char **args, int nargs)
{
    char *argv[16];
    argv[0] = "tokenize";
    for (int i = 0; i < nargs; i++)
        argv[i + 1] = args[i];
    argv[nargs + 1] = NULL;
    fflush(stdout);
    return zt_cmd_tokenize(nargs + 1, argv);
}

static void test_cmd_tokenize_with_tokenizer(void **state)
{
    (void)state;
    char *json = llama2_json(true, true);
    write_text("tok.json", json);
    free(json);
    write_text("a.txt", "hi hi");
    write_text("b.txt", "hi");
    char tok[512], a[512], b[512], out[512];
    snprintf(tok, sizeof(tok), "%s/tok.json", g_dir);
    snprintf(a, sizeof(a), "%s/a.txt", g_dir);
    snprintf(b, sizeof(b), "%s/b.txt", g_dir);
    snprintf(out, sizeof(out), "%s/out", g_dir);
    /* each file is encoded by itself, and with --add-special-tokens wrapped in <s> */
    char *args[] = {"--input", a, "--input", b, "--out-dir", out, "--name", "x", "--val-fraction", "0",
                    "--tokenizer", tok, "--add-special-tokens"};
    assert_int_equal(run_tokenize(args, 13), 0);
    char pat[600];
    snprintf(pat, sizeof(pat), "%s/x_train_*.bin", out);
    zt_dataloader *dl;
    zt_err err;
    assert_int_equal(zt_dataloader_open(&dl, pat, 1, 4, false, 0, &err), 0);
    assert_int_equal(zt_dataloader_num_tokens(dl), 5);
    int32_t in[4], tg[4], in6[6], tg6[6];
    zt_dataloader_next(dl, in, tg);
    const int32_t want[5] = {1, 263, 263, 1, 263};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(in[i], want[i]);
        assert_int_equal(tg[i], want[i + 1]);
    }
    zt_dataloader_close(dl);

    /* a Unigram tokenizer.json (T5's pipeline): </s> after the text */
    json = t5_json(NULL, NULL);
    write_text("t5.json", json);
    free(json);
    write_text("t5.txt", "a\r\nb x   x");
    char t5[512], t5_txt[512], t5_dir[512];
    snprintf(t5, sizeof(t5), "%s/t5.json", g_dir);
    snprintf(t5_txt, sizeof(t5_txt), "%s/t5.txt", g_dir);
    snprintf(t5_dir, sizeof(t5_dir), "%s/t5", g_dir);
    char *args_t5[] = {"--input", t5_txt, "--out-dir", t5_dir, "--name", "t", "--val-fraction", "0",
                       "--tokenizer", t5, "--add-special-tokens"};
    assert_int_equal(run_tokenize(args_t5, 11), 0);
    snprintf(pat, sizeof(pat), "%s/t_train_*.bin", t5_dir);
    assert_int_equal(zt_dataloader_open(&dl, pat, 1, 6, false, 0, &err), 0);
    assert_int_equal(zt_dataloader_num_tokens(dl), 7);
    zt_dataloader_next(dl, in6, tg6);
    const int32_t want_t5[7] = {10, 14, 3, 5, 3, 5, 1};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(in6[i], want_t5[i]);
        assert_int_equal(tg6[i], want_t5[i + 1]);
    }
    zt_dataloader_close(dl);

    /* a vocabulary over 65536 ids (LLaMA-3's 128256): 32-bit shards, which the loader reads back */
    write_text("big.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"h\": 0, \"i\": 70000}, \"merges\": []}}");
    char big[512], wide_dir[512];
    snprintf(big, sizeof(big), "%s/big.json", g_dir);
    snprintf(wide_dir, sizeof(wide_dir), "%s/wide", g_dir);
    char *args2[] = {"--input", a, "--out-dir", wide_dir, "--tokenizer", big};
    assert_int_equal(run_tokenize(args2, 6), 0);
    snprintf(pat, sizeof(pat), "%s/a_train_*.bin", wide_dir);
    assert_int_equal(zt_dataloader_open(&dl, pat, 1, 2, false, 0, &err), 0);
    assert_int_equal(zt_dataloader_max_token(dl), 70000);
    zt_dataloader_next(dl, in, tg);
    assert_int_equal(in[0], 0); /* "hi hi": h i h i (no token for the space), the last i in val */
    assert_int_equal(in[1], 70000);
    assert_int_equal(tg[1], 0);
    zt_dataloader_close(dl);
    char out2[512];
    snprintf(out2, sizeof(out2), "%s/out2", g_dir);
    /* a refused tokenizer.json and text that is not UTF-8: exit 1, nothing written */
    write_text("bad.json", "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}");
    write_text("latin1.txt", "caf\xe9");
    char bad[512], latin1[512];
    snprintf(bad, sizeof(bad), "%s/bad.json", g_dir);
    snprintf(latin1, sizeof(latin1), "%s/latin1.txt", g_dir);
    char *args3[] = {"--input", a, "--out-dir", out2, "--tokenizer", bad};
    assert_int_equal(run_tokenize(args3, 6), 1);
    char *args4[] = {"--input", latin1, "--out-dir", out2, "--tokenizer", tok};
    assert_int_equal(run_tokenize(args4, 6), 1);
    assert_int_not_equal(access(out2, F_OK), 0);
    char *args5[] = {"--input", a, "--out-dir", out2, "--tokenizer", ""};
    assert_int_equal(run_tokenize(args5, 6), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_level_bpe),
        cmocka_unit_test(test_byte_fallback_bpe),
        cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_wordpiece),
        cmocka_unit_test(test_unigram),
        cmocka_unit_test(test_unigram_t5),
        cmocka_unit_test(test_unicode_forms),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_not_utf8),
        cmocka_unit_test(test_text_and_id_errors),
        cmocka_unit_test(test_utf8_and_unicode),
        cmocka_unit_test_setup_teardown(test_cmd_tokenize_with_tokenizer, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
