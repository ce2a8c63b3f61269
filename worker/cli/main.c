/* The `ztrain` program: dispatches to the subcommands of worker/cli/commands.h, and answers --help and
 * --version. */
#include <stdio.h>
#include <string.h>

#include "worker/cli/commands.h"
#include "worker/models/family.h"

#ifndef ZT_VERSION
#define ZT_VERSION "unknown"
#endif

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"train", zt_cmd_train, "train a model on token shards, supervised examples or labelled texts (resumable)"},
    {"finetune", zt_cmd_finetune, "fine-tune Hugging Face weights on one GPU, beyond its memory (--gpu-mem)"},
    {"generate", zt_cmd_generate, "sample text from a checkpoint or exported weights"},
    {"export", zt_cmd_export, "write a checkpoint's weights as Hugging Face safetensors + config.json"},
    {"tokenize", zt_cmd_tokenize, "turn text files into token shards for training"},
    {"plot", zt_cmd_plot, "draw the loss curves of a run's metrics.jsonl as SVG"},
    {"launch", zt_cmd_launch, "start N local ranks with the torchrun environment"},
    {"inspect", zt_cmd_inspect, "per-parameter statistics of a checkpoint (values, Adam moments)"},
};
#define NUM_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_usage(FILE *f)
{
    char types[256];
    zt_family_list_model_types(types, sizeof types);
    fprintf(f, "usage: ztrain <command> [flags]   (ztrain <command> --help for its flags)\n"
               "       ztrain --help | ztrain --version\n\n"
               "Trains transformers in C and CUDA; a model is a Hugging Face config.json whose model_type is\n"
               "one of: %s.\n\ncommands:\n",
            types);
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        print_usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("ztrain %s\n", ZT_VERSION);
        return 0;
    }
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ztrain: error: unknown command '%s'; commands are train, finetune, generate, export, tokenize, plot, "
            "launch, inspect (see ztrain --help)\n", cmd);
    return 2;
}
