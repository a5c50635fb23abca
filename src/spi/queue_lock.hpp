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

}  // namespace jobcap
