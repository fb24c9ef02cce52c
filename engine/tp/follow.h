/* The round stream: rank 0 runs the scheduler and publishes, before running them itself, every
 * call that changes the ranks' state (a round with its batch and the KV block tables of its
 * sequences, a snapshot save or load); the other ranks replay it on their backend through the
 * same forward plan, so every sum meets its peers in the same order. */
#ifndef MUSE_TP_FOLLOW_H
#define MUSE_TP_FOLLOW_H

#include "model/forward.h"
#include "tp/comm.h"

/* Rank 0: publishes round r (tables read from be->kv as they are now). -1 when a rank has
 * stopped (the comm's error names it). */
int muse_tp_lead_round(muse_comm *c, const muse_backend *be, const muse_round *r);
/* Rank 0: publishes a snapshot save (save 1) or load of seq at end_pos in slot. */
int muse_tp_lead_snapshot(muse_comm *c, int save, int seq, int64_t end_pos, int slot);

/* Makes f publish through c when c is rank 0 of a world (the plan's round hook: every round
 * and snapshot goes to the other ranks before it runs here); nothing for another rank or a
 * NULL c. Call after muse_forward_create wherever a world is joined. */
void muse_tp_lead_forward(muse_comm *c, muse_forward *f);

/* Another rank: replays rank 0's stream on f until rank 0 says stop (0), or until rank 0 or
 * the replay fails (-1 with the reason; rank 0's loss is named "rank 0 (HOST:PORT) stopped"). */
int muse_tp_follow(muse_comm *c, muse_forward *f, muse_err *e);

/* Ends the world: rank 0 tells the others to stop (they exit 0), then every rank closes. */
void muse_tp_close(muse_comm *c);

#endif
