/* libFuzzer harness: the Hugging Face tokenizer.json reader (zt_tokenizer_load_json,
 * worker/data/tokenize_hf.c). The input is a tokenizer.json; an accepted tokenizer encodes a few texts
 * (with and without special tokens, added tokens, invalid and multi-byte UTF-8) and decodes what it made,
 * encodes pairs and single texts truncated to a few lengths as a classifier's data does,
 * and every id's bytes are looked up. */
#include "fuzz_common.h"

#include "worker/data/tokenize.h"

/* Seeds: a byte-level BPE (GPT-2 style), a WordPiece (BERT style) and a BPE with byte fallback
 * (LLaMA-2 style), each small and complete. */
static const char seed_bpe[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [{\"id\": 9, \"content\": "
    "\"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
    "\"special\": true}], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
    "false, \"trim_offsets\": true, \"use_regex\": true}, \"post_processor\": {\"type\": \"ByteLevel\", "
    "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}, \"decoder\": {\"type\": "
    "\"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}, \"model\": {\"type\": "
    "\"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, \"end_of_word_suffix\": "
    "null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false, \"vocab\": {\"h\": 0, \"e\": 1, "
    "\"l\": 2, \"o\": 3, \"\\u0120\": 4, \"he\": 5, \"ll\": 6, \"hell\": 7, \"hello\": 8}, \"merges\": [[\"h\", "
    "\"e\"], [\"l\", \"l\"], [\"he\", \"ll\"], [\"hell\", \"o\"]]}}";
static const char seed_wordpiece[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [{\"id\": 1, \"content\": "
    "\"[CLS]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": "
    "true}, {\"id\": 2, \"content\": \"[SEP]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true}], \"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": "
    "true, \"handle_chinese_chars\": true, \"strip_accents\": null, \"lowercase\": true}, \"pre_tokenizer\": "
    "{\"type\": \"BertPreTokenizer\"}, \"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 2], "
    "\"cls\": [\"[CLS]\", 1]}, \"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}, "
    "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
    "\"max_input_chars_per_word\": 12, \"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, \"un\": 3, \"##aff\": 4, "
    "\"##able\": 5, \"hello\": 6, \",\": 7, \"!\": 8, \"\\u4e2d\": 9}}}";
static const char seed_fallback[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [{\"id\": 0, \"content\": "
    "\"<unk>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": "
    "true}, {\"id\": 1, \"content\": \"<s>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true}], \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": "
    "[{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
    "\"content\": \"\\u2581\"}]}, \"pre_tokenizer\": null, \"post_processor\": {\"type\": \"TemplateProcessing\", "
    "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": "
    "0}}], \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}}, "
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
    "\"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
    "\"content\": \" \", \"start\": 1, \"stop\": 0}]}, \"model\": {\"type\": \"BPE\", \"dropout\": null, "
    "\"unk_token\": \"<unk>\", \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": "
    "true, \"byte_fallback\": true, \"ignore_merges\": false, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, "
    "\"<0xC3>\": 3, \"<0xA9>\": 4, \"\\u2581\": 5, \"h\": 6, \"i\": 7, \"\\u2581h\": 8, \"\\u2581hi\": 9}, "
    "\"merges\": [\"\\u2581 h\", \"\\u2581h i\"]}}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    if (fz_seed_dir()) {
        fz_write_seed("bpe.json", seed_bpe, sizeof(seed_bpe) - 1);
        fz_write_seed("wordpiece.json", seed_wordpiece, sizeof(seed_wordpiece) - 1);
        fz_write_seed("byte_fallback.json", seed_fallback, sizeof(seed_fallback) - 1);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1);
    if (!json)
        return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    zt_tokenizer *tok = NULL;
    zt_err err;
    int rc = zt_tokenizer_load_json(&tok, json, "fuzz.json", &err);
    free(json);
    if (rc != 0)
        return 0;
    static const char *const texts[] = {"hello, unaffable world!", "  <s>hi <|endoftext|>[CLS]", "caf\xc3\xa9 \xe4\xb8\xad",
                                        "bad \xc3 utf8 \xff", ""};
    const int vocab = zt_tokenizer_vocab_size(tok);
    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++)
        for (unsigned flags = 0; flags <= ZT_TOKENIZE_ADD_SPECIAL; flags++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (zt_tokenizer_encode_flags(tok, texts[t], strlen(texts[t]), flags, &ids, &n, &err) != 0)
                continue;
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= vocab)
                    abort(); /* every id the encoder makes is in the vocabulary */
            char *back = NULL;
            size_t len = 0;
            if (zt_tokenizer_decode(tok, ids, n, &back, &len, &err) == 0)
                free(back);
            free(ids);
        }
    /* pairs and single texts for a classifier, truncated to a few lengths: ids in the vocabulary, types
     * given, never longer than asked */
    static const size_t lengths[] = {0, 1, 3, 7, 64};
    for (size_t t = 0; t + 1 < sizeof(texts) / sizeof(texts[0]); t++)
        for (size_t k = 0; k < sizeof(lengths) / sizeof(lengths[0]); k++)
            for (int pair = 0; pair < 2; pair++) {
                int32_t *ids = NULL, *types = NULL;
                size_t n = 0;
                const char *b = pair ? texts[t + 1] : NULL;
                if (zt_tokenizer_encode_pair(tok, texts[t], strlen(texts[t]), b, b ? strlen(b) : 0, lengths[k],
                                             &ids, &types, &n, &err) != 0)
                    continue;
                if (lengths[k] > 0 && n > lengths[k])
                    abort();
                for (size_t i = 0; i < n; i++)
                    if (ids[i] < 0 || ids[i] >= vocab || types[i] < 0)
                        abort();
                free(ids);
                free(types);
            }
    (void)zt_tokenizer_find(tok, "[MASK]");
    (void)zt_tokenizer_is_special(tok, 0);
    for (int32_t id = 0; id < vocab && id < 4096; id++) {
        const char *b;
        size_t len;
        (void)zt_tokenizer_token_bytes(tok, id, &b, &len, &err);
    }
    zt_tokenizer_destroy(tok);
    return 0;
}
