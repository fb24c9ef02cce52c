/* muse-engine plan: the memory plan of any config without loading weights. */
#ifndef MUSE_CMD_PLAN_H
#define MUSE_CMD_PLAN_H

int muse_cmd_plan(int argc, char **argv);

#endif
