/* The subcommands of the ztrain CLI. Each parses its own flags (getopt_long), prints its own --help,
 * and returns the process exit status: 0 on success, 1 on a runtime failure, 2 on bad usage. */
#ifndef ZT_WORKER_COMMANDS_H
#define ZT_WORKER_COMMANDS_H

int zt_cmd_train(int argc, char **argv);
int zt_cmd_finetune(int argc, char **argv); /* train with the one-GPU fine-tuning defaults */
int zt_cmd_generate(int argc, char **argv);
int zt_cmd_export(int argc, char **argv);
int zt_cmd_tokenize(int argc, char **argv);
int zt_cmd_plot(int argc, char **argv);
int zt_cmd_launch(int argc, char **argv);
int zt_cmd_inspect(int argc, char **argv);

#endif
