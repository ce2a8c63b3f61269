/* libFuzzer harness: the JSON training-config reader (zt_train_config_load_file, worker/train/config.c).
 * The input is a config file; an accepted config is written back (zt_train_config_save) and read again,
 * which must succeed. Model paths in the input are never opened: only zt_train_config_resolve reads them,
 * and the harness does not call it. */
#include "fuzz_common.h"

#include "worker/train/config.h"

static char g_path[512], g_saved[512];

static void write_seeds(void)
{
    static const char *const files[] = {"examples/demo.json", "examples/gpt2-tiny.json",
                                        "deploy/k8s/base/config/train.json"};
    const char *src = getenv("ZT_SOURCE_DIR");
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[512], name[64];
        snprintf(path, sizeof(path), "%s/%s", src ? src : ".", files[i]);
        size_t len;
        uint8_t *data = fz_read(path, &len);
        snprintf(name, sizeof(name), "config_%zu.json", i);
        fz_write_seed(name, data, len);
        free(data);
    }
    static const char inline_model[] =
        "{\"model\": {\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16,"
        " \"vocab_size\": 37}, \"steps\": 10, \"lr\": 0.001, \"batch_size\": 2, \"seq_len\": 8,"
        " \"optimizer\": \"server\", \"servers\": \"127.0.0.1:7070\", \"schedule\": \"cosine\"}";
    fz_write_seed("inline_model.json", inline_model, sizeof(inline_model) - 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    fz_path(g_path, sizeof(g_path), "input.json");
    fz_path(g_saved, sizeof(g_saved), "saved.json");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(g_path, data, size);
    zt_train_config c;
    zt_train_config_init(&c);
    zt_err err;
    if (zt_train_config_load_file(&c, g_path, &err) != 0)
        return 0;
    if (zt_train_config_save(&c, g_saved, "model_config.json", &err) != 0)
        return 0;
    zt_train_config again;
    zt_train_config_init(&again);
    (void)zt_train_config_load_file(&again, g_saved, &err);
    return 0;
}
