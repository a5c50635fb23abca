// The queue lock: a heavyweight lock on a tag made from a queue's name (an advisory lock tag with
// objsubid 4, which SQL's advisory-lock functions cannot make), held to the end of the
// transaction. Every insert of jobs takes it in ROW EXCLUSIVE mode, so inserters never wait for
// each other; drop_queue takes it in EXCLUSIVE mode, so a queue cannot be dropped under an
// insert into it, and dropping one queue makes no other queue wait. Two names may share a tag
// (a 32-bit hash): then a drop of one also waits for inserts into the other, nothing more.
#pragma once

#include "pg.hpp"

namespace jobcap {

// Before inserting jobs into queue (text), and before the insert's snapshot is taken.
void lock_queue_for_insert(Datum queue);

// create_queue, and grant_queue before it looks for a queue to create: creations of one name
// wait for each other (SHARE UPDATE EXCLUSIVE conflicts with itself, not with inserts), so a
// creation that waited sees the other's queue in its next statement's snapshot.
void lock_queue_for_create(Datum queue);

// drop_queue: waits for every transaction that inserted into queue and has not ended.
void lock_queue_for_drop(Datum queue);

// The claim turn of a queue whose limits are max_running, max_running_per_key and rate_limit (a tag
// of its own, objsubid 5, held to the end of the transaction; a key's running jobs are some of the
// queue's, so below, read max_running as the smaller of the first two; a rate limit is bounded the
// same way, each slot charging its own row of the window: spi/rates.hpp). A capped queue's claims used to take turns on
// its row, one at a time, even with the limit far above the load, and so claimed at half an open
// queue's rate. Now a claim far enough below max_running takes the turn SHARED, together with one
// of kClaimSlots slots (tags with objsubid 6, EXCLUSIVE, never waited for), claims at most
// kSharedClaimBatch jobs, and counts the queue's running jobs in a snapshot taken after both: at
// most kClaimSlots such claims are in flight at once, so while the running jobs it counted are at
// least kClaimSlots x kSharedClaimBatch below max_running, none of them can take the queue past it,
// whatever the others counted (src/direct/claim.cpp). A transaction may claim the queue so more
// than once: each claim takes a slot of its own. Every other claim of a capped queue takes the turn
// EXCLUSIVE (functions/claim.cpp), then the queue's row lock: it waits for the shared claims in
// flight, and its count, in a snapshot taken after, sees what they claimed; shared claims that come
// later do not wait for it, they join it on the SQL path. alter_queue, pause_queue and resume_queue
// take it EXCLUSIVE too, so a change of the queue's settings waits for the claims made under the
// old ones. The turn always comes before the row: a transaction that holds the turn shared (it
// claimed) and then needs the row (it claims near the limit, pauses the queue) never waits for a
// holder of the row that waits for it (a lock manager puts an upgrade ahead of the waiters it
// blocks).
constexpr int kClaimSlots = 16;
constexpr int kSharedClaimBatch = 32;
constexpr int kSharedClaimRoom = kClaimSlots * kSharedClaimBatch;

// The shared turn and a free slot, neither waited for: the slot's number, or -1 (holding
// neither) when an exclusive claim holds or awaits the turn, or every slot is taken.
int take_shared_claim_turn(Datum queue);
// Gives both back, for a claim that took nothing under them.
void give_back_shared_claim_turn(Datum queue, int slot);
void take_exclusive_claim_turn(Datum queue);

}  // namespace jobcap
