/* muse-engine subcommands that run the model. Each returns the process exit code. */
#ifndef MUSE_CMD_MODEL_H
#define MUSE_CMD_MODEL_H

int muse_cmd_logits(int argc, char **argv);
int muse_cmd_generate(int argc, char **argv);
int muse_cmd_inspect(int argc, char **argv);
int muse_cmd_chat(int argc, char **argv);

#endif
