/* `muse-engine tokenize` and `muse-engine detokenize`: text <-> token ids on the command line. */
#ifndef MUSE_CMD_TOKENIZE_H
#define MUSE_CMD_TOKENIZE_H

/* argv[0] is the subcommand name. Returns the exit code: 0 ok, 2 bad input (message on stderr),
 * 1 an output failure. */
int muse_cmd_tokenize(int argc, char **argv);   /* --tokenizer FILE [--text-file F] */
int muse_cmd_detokenize(int argc, char **argv); /* --tokenizer FILE [--ids 1,2,3] */

#endif
