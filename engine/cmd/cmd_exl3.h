/* muse-engine subcommands for EXL3 packs. Each returns the process exit code. */
#ifndef MUSE_CMD_EXL3_H
#define MUSE_CMD_EXL3_H

/* muse-engine dequant --model DIR --tensor KEY --out FILE: the effective W of one EXL3 Linear. */
int muse_cmd_dequant(int argc, char **argv);

#endif
