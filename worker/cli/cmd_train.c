/* `ztrain train`: reads the training config (file, then flags), validates it, and runs the trainer;
 * SIGINT and SIGTERM stop it after the current step with a checkpoint (exit status 130). When a state
 * server restarts from an older snapshot, the run continues from the checkpoint of that step by itself
 * (at most ZT_TRAIN_MAX_REWINDS times). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/cli/commands.h"
#include "worker/train/checkpoint.h"
#include "worker/train/config.h"
#include "worker/train/trainer.h"

static const char train_usage[] =
    "usage: ztrain train [--config FILE] [--model FILE] [--init-from FILE] [--train-data GLOB] [--val-data GLOB]\n"
    "                    [--tokenizer FILE] [--steps N] [--out DIR] [--resume DIR] [--batch-size N] [--seq-len N] [--grad-accum N]\n"
    "                    [--lr X] [--min-lr X] [--schedule S] [--warmup N] [--weight-decay X] [--grad-clip X]\n"
    "                    [--eval-every N] [--eval-batches N] [--save-every N] [--log-every N] [--seed N]\n"
    "                    [--threads N] [--device D] [--precision P] [--optimizer O] [--servers LIST]\n"
    "                    [--optimizer-gpu-fraction X] [--adam-moments M] [--moments-dir DIR] [--moments-ram SIZE] [--token-file F] [--tls-ca F] [--tls-cert F] [--tls-key F] [--server-shm M] [--state-store S]\n"
    "                    [--zero-level N] [--checkpointing C] [--prefetch N] [--save-grads] [--log-level L]\n"
    "                    [--gpu-mem SIZE] [--host-mem SIZE] [--host-grad-accum] [--weights W] [--auto-micro-batch]\n"
    "                    [--offload O] [--sft-data FILE] [--sft-val-data FILE] [--chat-template NAME]\n"
    "                    [--train-on-prompt] [--sft-overlong O] [--sft-pack] [--plan-only]\n"
    "\n"
    "Trains a causal language model (GPT-2, LLaMA, Mistral, Qwen2, GPT-NeoX) on token shards made by\n"
    "`ztrain tokenize` or on supervised examples (--sft-data), a BERT or RoBERTa masked LM on token shards,\n"
    "a BERT or RoBERTa classifier on labelled texts (JSONL), or a T5 / mT5 on input and target texts\n"
    "(--sft-data); every family trains on the CPU (--device cpu) or on CUDA GPUs (--device cuda).\n"
    "Settings come from their defaults, then the JSON config file, then these flags.\n"
    "\n"
    "  --config FILE        training config (JSON; paths in it are relative to its folder)\n"
    "  --model FILE         Hugging Face config.json of the model (e.g. examples/gpt2-tiny.json)\n"
    "  --init-from FILE     start from these weights (safetensors with Hugging Face names)\n"
    "  --train-data GLOB    training shards, e.g. 'runs/demo/data/corpus_train_*.bin'\n"
    "  --val-data GLOB      validation shards; without them there is no evaluation\n"
    "                       (a classifier: JSONL files of {\"text\", \"text_pair\" (optional), \"label\"}\n"
    "                       per line for both; evaluation also reports accuracy)\n"
    "  --tokenizer FILE     BERT / RoBERTa: the model's tokenizer.json (a classifier's JSONL texts become\n"
    "                       tokens with it; a masked LM takes [MASK] and the special tokens from it)\n"
    "                       --sft-data: the decoder's tokenizer.json\n"
    "  --sft-data FILE      fine-tune a decoder on supervised examples instead of shards: JSONL of\n"
    "                       {\"prompt\", \"completion\"}, alpaca {\"instruction\", \"input\", \"output\"} or\n"
    "                       chats {\"messages\": [{\"role\", \"content\"}, ...]}; the loss is the mean over\n"
    "                       the answers' tokens (one example a row, padded); a T5: {\"input\", \"target\"}\n"
    "  --sft-val-data FILE  validation examples (the same formats); their loss is reported\n"
    "  --chat-template NAME how chats and alpaca records are laid out: chatml, qwen2, qwen2.5, llama2,\n"
    "                       llama3, llama3.1, mistral, gemma, gemma3, phi3, or none; default: the\n"
    "                       chat_template of the tokenizer_config.json beside --tokenizer\n"
    "  --train-on-prompt    the loss covers the prompts (system and user turns) too\n"
    "  --sft-overlong O     an example longer than --seq-len: truncate (default; counted in the log) or\n"
    "                       refuse (the run stops, naming the line)\n"
    "  --sft-pack           pack several examples into each row of --seq-len tokens (first fit), each\n"
    "                       attending only within itself with positions from 0: the same loss as padded\n"
    "                       rows, fewer rows (decoders: gpt2, llama, qwen2, gpt_neox)\n"
    "  --steps N            optimizer steps to train to (default 1000)\n"
    "  --out DIR            run directory: config, metrics.jsonl, checkpoints (default runs/train)\n"
    "  --resume DIR         continue a run directory (its latest checkpoint) or a ckpt_NNNNNN directory;\n"
    "                       without --config the settings saved with the checkpoint are used\n"
    "  --batch-size N       sequences per micro-batch (default 8)\n"
    "  --seq-len N          tokens per sequence, at most the model's n_positions (default 256)\n"
    "  --target-len N       a text-to-text model's (T5) target tokens, at most --seq-len (default: --seq-len)\n"
    "  --grad-accum N       micro-batches per step (default 1)\n"
    "  --lr X               peak learning rate (default 6e-4)\n"
    "  --min-lr X           floor of the decaying schedules (default 6e-5)\n"
    "  --schedule S         nodecay | noam | linear | cosine | exponential (default cosine)\n"
    "  --warmup N           linear warmup steps (default min(50, steps / 10))\n"
    "  --weight-decay X     AdamW weight decay of matrices and embeddings (default 0.1)\n"
    "  --grad-clip X        maximum global gradient norm, 0 = no clipping (default 1.0)\n"
    "  --eval-every N       steps between evaluations, 0 = only at start and end (default 100)\n"
    "  --eval-batches N     validation batches per evaluation (default 10)\n"
    "  --save-every N       steps between checkpoints, 0 = only the final one, -1 = none (default 500)\n"
    "  --log-every N        steps between progress lines (default 10)\n"
    "  --seed N             seed of initialisation and shuffling (default 1337)\n"
    "  --threads N          CPU threads, 0 = one per core (default 0)\n"
    "  --save-grads         every checkpoint also holds grads.safetensors, the last step's gradients (one\n"
    "                       process; shown by ztrain inspect)\n"
    "  --device D           cpu | cuda (default cpu)\n"
    "  --precision P        auto | fp32 | bf16 | fp16 on cuda (default auto: bf16 on sm_80+, fp16 below)\n"
    "  --optimizer O        where AdamW and its state live: gpu (cuda) | cpu (host memory; with --device cuda\n"
    "                       the host updates each block while the next step starts) | server (default: gpu on\n"
    "                       cuda, cpu on cpu)\n"
    "  --optimizer-gpu-fraction X  with --device cuda --optimizer cpu: the leading blocks holding this fraction\n"
    "                       of the parameters keep their AdamW on the GPU, the host updates the rest (same\n"
    "                       results; faster when the host is the bottleneck; default 0)\n"
    "  --adam-moments M     fp32 | bf16: with --optimizer cpu, bf16 halves the moments' host memory (2 bytes\n"
    "                       each instead of 4), rounded stochastically so small updates are kept on average;\n"
    "                       results differ from fp32's within rounding (default fp32)\n"
    "  --moments-dir DIR    with --optimizer cpu: the Adam moments live on disk in DIR (NVMe, io_uring), each\n"
    "                       block's read ahead of its update and written behind it; the host keeps 8 (fp32)\n"
    "                       or 4 (bf16) bytes per parameter less, the disk holds them (under --host-mem the\n"
    "                       fp32 masters too, where needed; on the CPU the weights are streamed, ZeRO-3)\n"
    "  --moments-ram SIZE   with --moments-dir: RAM the moments of the leading blocks keep instead of the disk\n"
    "                       (less disk traffic per step; default none: what the memory plan leaves free,\n"
    "                       less 4 GiB or 5%; a size below one block's moments keeps them all on disk)\n"
    "  --servers LIST       state servers host:port,... for --optimizer server; without it the state\n"
    "                       server runs inside this process (embedded)\n"
    "  --token-file F       file holding the bearer token of the state servers\n"
    "  --tls-ca F           PEM CA of the state servers' certificates (TLS); --tls-cert/--tls-key F: mutual TLS\n"
    "  --server-shm M       auto (default): with a state server on this host, the pushed and pulled bytes move\n"
    "                       through shared memory (the calls stay on gRPC; TCP where the server refuses);\n"
    "                       off: everything over TCP\n"
    "  --state-store S      embedded state server's store: ram | nvme:DIR (default ram)\n"
    "  --zero-level N       ZeRO level 2 (keep a block gathered until the step ends) | 3 (gather again for\n"
    "                       the backward; default). With WORLD_SIZE > 1 ranks and --device cuda: one GPU per\n"
    "                       rank (LOCAL_RANK) over NCCL\n"
    "  --checkpointing C    activation checkpointing of the transformer layers: none | all | every:K (default\n"
    "                       none): keep only a layer's input and recompute the rest before its backward\n"
    "  --prefetch N         blocks gathered ahead on the GPUs' communication stream (default 1)\n"
    "  --gpu-mem SIZE       cap on the GPU memory ztrain allocates per rank, e.g. 10GiB (default: the GPU's\n"
    "                       free memory); the plan that fits is printed, or the run is refused with what fits\n"
    "  --host-mem SIZE      cap on the host memory of each rank's training state, e.g. 64GiB: the engine's host\n"
    "                       arrays (pinned and pageable), the embedded state server's, the checkpoints' staging;\n"
    "                       the planner moves the Adam moments, then the fp32 masters, to --moments-dir to fit\n"
    "                       (the plan printed at start shows where), or refuses naming the minimum\n"
    "  --host-grad-accum    add the gradients of the middle micro-batches of a step on the host instead of\n"
    "                       bringing the sum up to the GPU each time (the same bits where it applies)\n"
    "  --weights W          auto | gpu | host | masters: where the weights live between passes; host streams\n"
    "                       each block to the GPU when needed (--optimizer cpu or server, ZeRO-3; with several\n"
    "                       ranks each copies up its shard and the all-gather joins them; default auto: on the\n"
    "                       GPU unless the memory plan needs them in host memory); masters streams the host\n"
    "                       AdamW's fp32 masters and rounds them on the GPU (no bf16 copy in RAM, twice the\n"
    "                       bytes up; auto and host switch to it when RAM is short)\n"
    "  --auto-micro-batch   let the planner lower --batch-size, raising --grad-accum to keep the tokens per\n"
    "                       step, until the run fits\n"
    "  --plan-only          --device cuda: print the memory plan (GPU, host, disk) and stop, allocating and\n"
    "                       reading nothing (no data needed); without a visible GPU it plans for one of\n"
    "                       --gpu-mem, and --host-mem stands for the RAM of the machine planned for\n"
    "  --offload O          cpu (the optimizer in host RAM, as --optimizer cpu) | nvme:DIR (the embedded state\n"
    "                       server keeps masters and moments on NVMe in DIR)\n"
    "  --log-level L        debug | info | warn | error (default info)\n"
    "\n"
    "Config-file keys without a flag: lr_gamma (exponential schedule), beta1, beta2, eps, shuffle,\n"
    "loss_scale, loss_scale_window, min_loss_scale (fp16 dynamic loss scaling).\n"
    "Ctrl-C stops after the current step and writes a checkpoint; continue with --resume DIR.\n";

static const char finetune_usage[] =
    "usage: ztrain finetune --init-from PATH --train-data GLOB [--model FILE] [--gpu-mem SIZE] [--offload O]\n"
    "                       [any flag of ztrain train]\n"
    "\n"
    "Fine-tunes a Hugging Face checkpoint (any model_type of `ztrain --help`) on one GPU whose memory may be\n"
    "smaller than the model's training state: `ztrain train` with these defaults (each can be overridden by\n"
    "its flag):\n"
    "  --device cuda --optimizer cpu (AdamW and its fp32 state in host memory) --checkpointing all\n"
    "  --auto-micro-batch (the micro-batch is lowered until the plan fits --gpu-mem, grad_accum raised)\n"
    "  --lr 3e-5 --min-lr 3e-6 --weight-decay 0 --steps 1000 --seq-len 1024 (at most the model's positions)\n"
    "\n"
    "  --init-from PATH     model.safetensors, a sharded checkpoint's model.safetensors.index.json, or the\n"
    "                       directory of a Hugging Face model (required unless --resume)\n"
    "  --model FILE         its config.json (default: config.json beside --init-from)\n"
    "  --gpu-mem SIZE       cap on the GPU memory used, e.g. 10GiB on an 11 GiB card (default: what is free)\n"
    "  --offload O          cpu (default) | nvme:DIR (masters and moments on NVMe through the embedded state\n"
    "                       server)\n"
    "See ztrain train --help for the other flags.\n";

/* The settings `ztrain finetune` starts from, before the config file and the flags. */
static void finetune_defaults(zt_train_config *c)
{
    c->device = ZT_DEVICE_CUDA;
    c->optimizer = ZT_OPTIMIZER_CPU;
    c->checkpointing = ZT_CKPT_ALL;
    c->auto_micro_batch = true;
    c->lr = 3e-5;
    c->min_lr = 3e-6;
    c->weight_decay = 0.0;
    c->seq_len = 1024;
}

/* The folder of path (a file or a directory): "." when it has none. */
static void folder_of(const char *path, bool is_dir, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    if (is_dir)
        return;
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == out)
        out[1] = '\0';
    else
        *slash = '\0';
}

static void on_stop_signal(int sig)
{
    (void)sig;
    zt_trainer_request_stop(); /* the handler is reset to the default, so a second Ctrl-C ends at once */
}

/* The exit status of a failure to read the config file: a bad setting in it is a usage error (2); a
 * missing or malformed file a runtime failure (1). */
static int exit_status(int rc)
{
    return rc == ZT_EINVAL_CONFIG ? 2 : 1;
}

/* The run directory a --resume DIR continues: DIR itself, or the folder of the checkpoint DIR. */
static void run_dir_of(const char *resume, char *out, size_t cap)
{
    char manifest[ZT_TRAIN_PATH_MAX + 32];
    snprintf(manifest, sizeof(manifest), "%s/manifest.json", resume);
    snprintf(out, cap, "%s", resume);
    if (access(manifest, F_OK) != 0)
        return;
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/')
        out[--n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == out)
        out[1] = '\0';
    else
        *slash = '\0';
}

static const char *g_command = "train";

static int fail_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "ztrain: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "; see ztrain %s --help\n", g_command);
    return 2;
}

/* Runs `ztrain train ARGS` or, with finetune, `ztrain finetune ARGS`; returns the exit status (0, 1, 2, or
 * 130 when interrupted). */
static int run_command(int argc, char **argv, bool finetune)
{
    g_command = finetune ? "finetune" : "train";
    enum { OPT_CONFIG = 1000, OPT_LOG_LEVEL, OPT_SETTING };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"config", required_argument, NULL, OPT_CONFIG},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"model", required_argument, NULL, OPT_SETTING},
        {"init-from", required_argument, NULL, OPT_SETTING},
        {"train-data", required_argument, NULL, OPT_SETTING},
        {"val-data", required_argument, NULL, OPT_SETTING},
        {"tokenizer", required_argument, NULL, OPT_SETTING},
        {"steps", required_argument, NULL, OPT_SETTING},
        {"out", required_argument, NULL, OPT_SETTING},
        {"resume", required_argument, NULL, OPT_SETTING},
        {"batch-size", required_argument, NULL, OPT_SETTING},
        {"seq-len", required_argument, NULL, OPT_SETTING},
        {"target-len", required_argument, NULL, OPT_SETTING},
        {"grad-accum", required_argument, NULL, OPT_SETTING},
        {"lr", required_argument, NULL, OPT_SETTING},
        {"min-lr", required_argument, NULL, OPT_SETTING},
        {"schedule", required_argument, NULL, OPT_SETTING},
        {"warmup", required_argument, NULL, OPT_SETTING},
        {"weight-decay", required_argument, NULL, OPT_SETTING},
        {"grad-clip", required_argument, NULL, OPT_SETTING},
        {"save-grads", no_argument, NULL, OPT_SETTING},
        {"eval-every", required_argument, NULL, OPT_SETTING},
        {"eval-batches", required_argument, NULL, OPT_SETTING},
        {"save-every", required_argument, NULL, OPT_SETTING},
        {"log-every", required_argument, NULL, OPT_SETTING},
        {"seed", required_argument, NULL, OPT_SETTING},
        {"threads", required_argument, NULL, OPT_SETTING},
        {"device", required_argument, NULL, OPT_SETTING},
        {"precision", required_argument, NULL, OPT_SETTING},
        {"optimizer", required_argument, NULL, OPT_SETTING},
        {"optimizer-gpu-fraction", required_argument, NULL, OPT_SETTING},
        {"adam-moments", required_argument, NULL, OPT_SETTING},
        {"moments-dir", required_argument, NULL, OPT_SETTING},
        {"moments-ram", required_argument, NULL, OPT_SETTING},
        {"servers", required_argument, NULL, OPT_SETTING},
        {"token-file", required_argument, NULL, OPT_SETTING},
        {"tls-ca", required_argument, NULL, OPT_SETTING},
        {"tls-cert", required_argument, NULL, OPT_SETTING},
        {"tls-key", required_argument, NULL, OPT_SETTING},
        {"server-shm", required_argument, NULL, OPT_SETTING},
        {"state-store", required_argument, NULL, OPT_SETTING},
        {"zero-level", required_argument, NULL, OPT_SETTING},
        {"checkpointing", required_argument, NULL, OPT_SETTING},
        {"prefetch", required_argument, NULL, OPT_SETTING},
        {"gpu-mem", required_argument, NULL, OPT_SETTING},
        {"host-mem", required_argument, NULL, OPT_SETTING},
        {"host-grad-accum", no_argument, NULL, OPT_SETTING},
        {"weights", required_argument, NULL, OPT_SETTING},
        {"auto-micro-batch", no_argument, NULL, OPT_SETTING},
        {"plan-only", no_argument, NULL, OPT_SETTING},
        {"offload", required_argument, NULL, OPT_SETTING},
        {"sft-data", required_argument, NULL, OPT_SETTING},
        {"sft-val-data", required_argument, NULL, OPT_SETTING},
        {"chat-template", required_argument, NULL, OPT_SETTING},
        {"train-on-prompt", no_argument, NULL, OPT_SETTING},
        {"sft-overlong", required_argument, NULL, OPT_SETTING},
        {"sft-pack", no_argument, NULL, OPT_SETTING},
        {NULL, 0, NULL, 0},
    };
    enum { MAX_SETTINGS = 64 };
    struct {
        char flag[32];
        const char *value;
    } settings[MAX_SETTINGS];
    int nsettings = 0;
    const char *config_path = NULL;
    const char *resume = NULL;
    const char *init_from = NULL, *model = NULL;
    bool seq_len_given = false;
    zt_err err = {{0}};

    /* Pass 1: collect the flags; they apply after the config file, whatever their position. */
    optind = 0; /* full re-initialisation, so the command can run more than once in a process */
    opterr = 0;
    int c, index = 0;
    while ((c = getopt_long(argc, argv, ":h", options, &index)) != -1) {
        switch (c) {
        case 'h':
            fputs(finetune ? finetune_usage : train_usage, stdout);
            return 0;
        case OPT_CONFIG:
            config_path = optarg;
            break;
        case OPT_LOG_LEVEL: {
            enum zt_log_level level;
            if (zt_log_parse_level(optarg, &level) < 0)
                return fail_usage("--log-level: expected debug, info, warn or error, got '%s'", optarg);
            zt_log_set_level(level);
            break;
        }
        case OPT_SETTING:
            if (nsettings == MAX_SETTINGS)
                return fail_usage("%s: too many flags", "train");
            snprintf(settings[nsettings].flag, sizeof(settings[0].flag), "--%s", options[index].name);
            settings[nsettings].value = optarg ? optarg : ""; /* "" for a flag without a value */
            if (strcmp(options[index].name, "resume") == 0)
                resume = optarg;
            if (strcmp(options[index].name, "init-from") == 0)
                init_from = optarg;
            if (strcmp(options[index].name, "model") == 0)
                model = optarg;
            if (strcmp(options[index].name, "seq-len") == 0)
                seq_len_given = true;
            nsettings++;
            break;
        case ':':
            return fail_usage("%s needs a value", argv[optind - 1]);
        default:
            return fail_usage("unknown flag '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail_usage("unexpected argument '%s' (only flags are taken)", argv[optind]);
    if (finetune && !init_from && !resume && !config_path)
        return fail_usage("%s needs --init-from: the Hugging Face weights to start from (model.safetensors, "
                          "its sharded index, or the model's directory)", "finetune");

    /* Defaults, then the file (or, when resuming without one, the config saved with the checkpoint). */
    zt_train_config cfg;
    zt_train_config_init(&cfg);
    if (finetune)
        finetune_defaults(&cfg);
    int rc = 0;
    if (config_path) {
        rc = zt_train_config_load_file(&cfg, config_path, &err);
    } else if (resume) {
        char ckpt[ZT_TRAIN_PATH_MAX + 64], saved[ZT_TRAIN_PATH_MAX + 96];
        rc = zt_checkpoint_find(resume, ckpt, sizeof(ckpt), &err);
        if (rc == 0) {
            snprintf(saved, sizeof(saved), "%s/config.json", ckpt);
            zt_log(ZT_LOG_INFO, "config: no --config given: using %s, saved with the checkpoint", saved);
            rc = zt_train_config_load_file(&cfg, saved, &err);
        }
        /* The run continues where its checkpoint is, even if the directory was moved or copied. */
        if (rc == 0)
            run_dir_of(resume, cfg.out_dir, sizeof(cfg.out_dir));
    }
    if (rc < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return exit_status(rc);
    }
    for (int i = 0; i < nsettings; i++) {
        if ((rc = zt_train_config_set_flag(&cfg, settings[i].flag, settings[i].value, &err)) < 0) {
            fprintf(stderr, "ztrain: error: %s\n", err.msg);
            return 2;
        }
    }
    /* finetune: the model's config.json beside its weights, and its full context unless told otherwise */
    if (finetune && init_from && !model && !config_path && !resume) {
        struct stat st;
        const bool is_dir = stat(init_from, &st) == 0 && S_ISDIR(st.st_mode);
        char dir[ZT_TRAIN_PATH_MAX], hf[ZT_TRAIN_PATH_MAX + 16];
        folder_of(init_from, is_dir, dir, sizeof dir);
        snprintf(hf, sizeof hf, "%s/config.json", dir);
        if (access(hf, R_OK) != 0) {
            fprintf(stderr, "ztrain: error: --init-from %s: no config.json beside it (%s); pass the model's "
                    "config with --model FILE\n", init_from, hf);
            return 2;
        }
        if ((rc = zt_train_config_set_flag(&cfg, "--model", hf, &err)) < 0) {
            fprintf(stderr, "ztrain: error: %s\n", err.msg);
            return 2;
        }
    }
    if ((rc = zt_train_config_resolve(&cfg, &err)) < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return cfg.model_path[0] ? 1 : 2; /* a model file that cannot be used is a runtime failure */
    }
    if (finetune && !seq_len_given && !config_path && !resume && cfg.seq_len > zt_family_config_positions(&cfg.model))
        cfg.seq_len = zt_family_config_positions(&cfg.model);
    if ((rc = zt_train_config_validate(&cfg, &err)) < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 2;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    zt_train_result res;
    /* The loop continues by itself from an older checkpoint when state servers restarted from older
     * snapshots (with several ranks, every rank together). */
    rc = zt_trainer_run(&cfg, &res, &err);
    bool interrupted = res.interrupted;
    zt_train_result_free(&res);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (rc < 0) {
        zt_log(ZT_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    return interrupted ? 130 : 0; /* the trainer logged how to resume */
}

int zt_cmd_train(int argc, char **argv)
{
    return run_command(argc, argv, false);
}

int zt_cmd_finetune(int argc, char **argv)
{
    return run_command(argc, argv, true);
}
