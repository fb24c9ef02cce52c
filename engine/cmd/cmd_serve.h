/* muse-engine serve: the engine process behind ngx_muse_module. */
#ifndef MUSE_CMD_SERVE_H
#define MUSE_CMD_SERVE_H

int muse_cmd_serve(int argc, char **argv);

#endif
