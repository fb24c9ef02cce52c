/* muse-engine subcommands that check the backends: kernel-check (every registry kernel against
 * the CPU reference) and compare (teacher-forced logits of two backends). Each returns the
 * process exit code. */
#ifndef MUSE_CMD_CHECK_H
#define MUSE_CMD_CHECK_H

int muse_cmd_kernel_check(int argc, char **argv);
int muse_cmd_compare(int argc, char **argv);

#endif
