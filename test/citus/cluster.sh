#!/usr/bin/env bash
# A Citus cluster on this machine (a coordinator and two workers, shared_preload_libraries =
# 'citus,jobcap') and jobcap's core checks against it: test/citus/cluster.sh BINDIR DIR
# Run by test/run citus as the tester, with BINDIR the private install of test/citus/build.
# Each check fails the run: distribute() places the tables; calls made on the coordinator reach
# the shard of their queue; job ids and fences are unique across nodes; a job failed to its cap
# ends dead on its shard; the background worker of a worker node reaps a lease that expired on
# its shard.
set -euo pipefail
bindir=$1
dir=$2
# Below the kernel's ephemeral range (32768-60999 by default): a port in it can be the local end of
# any outgoing connection meanwhile (Citus's nodes open many to each other), and a server
# started on it then fails with "Address already in use" (the restore node did, on 55474).
ports=(25471 25472 25473)
export PATH="$bindir:$PATH"
export PGHOST=/tmp PGDATABASE=postgres

failures=0
ok() { echo "ok - $*"; }
notok() { echo "not ok - $*"; failures=$((failures + 1)); }
q() { local port=$1; shift; psql -X -q -A -t -v ON_ERROR_STOP=1 -p "$port" -c "$*"; }
expect() {  # expect NAME WANT GOT
    if [ "$2" = "$3" ]; then ok "$1"; else notok "$1: want '$2', got '$3'"; fi
}

stop_all() {
    local p
    for p in n0 n1 n2 back; do
        [ -f "$dir/$p/postmaster.pid" ] && pg_ctl -D "$dir/$p" -m immediate stop >/dev/null 2>&1 || true
    done
}
[ -n "${KEEP:-}" ] || trap stop_all EXIT
# The shard of jobs that holds a queue, and the port of its node: "jobcap.jobs_N PORT".
shard_of() {
    q $c "SELECT shard_name('jobcap.jobs'::regclass, s.shardid), n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid), LATERAL (SELECT get_shard_id_for_distribution_column('jobcap.jobs', '$1') AS shardid) s WHERE p.shardid = s.shardid"
}

# Waits up to $2 s for job $3 of queue $1 to leave 'running' (a node restarting counts as
# running); prints its state then.
wait_reaped() {
    local st=running
    for _ in $(seq 1 "$2"); do
        st=$(q $c "SELECT state FROM jobcap.jobs WHERE queue = '$1' AND job_id = $3" 2>/dev/null || echo running)
        [ "$st" = running ] || break
        sleep 1
    done
    echo "$st"
}

for n in 0 1 2; do
    initdb -D "$dir/n$n" -A trust >/dev/null
    cat >>"$dir/n$n/postgresql.conf" <<EOF
port = ${ports[$n]}
listen_addresses = 'localhost'
unix_socket_directories = '/tmp'
shared_preload_libraries = 'citus,jobcap'
max_connections = 40
jobcap.reap_interval = '1s'
EOF
    pg_ctl -D "$dir/n$n" -l "$dir/n$n.log" -w start >/dev/null
    q "${ports[$n]}" "CREATE EXTENSION citus; CREATE EXTENSION jobcap;"
done
c=${ports[0]}
q $c "SELECT citus_set_coordinator_host('localhost', $c)" >/dev/null
q $c "SELECT citus_add_node('localhost', ${ports[1]})" >/dev/null
q $c "SELECT citus_add_node('localhost', ${ports[2]})" >/dev/null

# Queues before distributing; eight of them, so that both workers hold some.
for i in 1 2 3 4 5 6 7 8; do
    q $c "SELECT jobcap.create_queue('q$i', max_attempts => 2, lease => '1 hour', backoff_base => '0', backoff_max => '0')" >/dev/null
done
q $c "SELECT jobcap.distribute(shard_count => 8)" >/dev/null
expect "distribute: jobs and job_errors distributed by queue" "2" \
    "$(q $c "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid IN ('jobcap.jobs'::regclass, 'jobcap.job_errors'::regclass) AND partmethod = 'h'")"
expect "distribute: queues a reference table" "n" \
    "$(q $c "SELECT partmethod FROM pg_dist_partition WHERE logicalrelid = 'jobcap.queues'::regclass")"
expect "distribute: shards on both workers" "2" \
    "$(q $c "SELECT count(DISTINCT n.nodeport) FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid) WHERE s.logicalrelid = 'jobcap.jobs'::regclass AND n.nodeport <> $c")"

# Enqueue on the coordinator: each job's row is on the node that holds its queue's shard.
for i in 1 2 3 4 5 6 7 8; do
    q $c "SELECT jobcap.enqueue_job('q$i', '{\"i\": $i}'); SELECT jobcap.enqueue_job('q$i', '{\"i\": $i}')" >/dev/null
done
expect "enqueue: 16 jobs seen from the coordinator" "16" "$(q $c "SELECT count(*) FROM jobcap.jobs")"
# The shard each queue hashes to, and its node; the node's shard table holds the queue's rows.
misplaced=0
for i in 1 2 3 4 5 6 7 8; do
    read -r shard port < <(shard_of "q$i" | tr '|' ' ')
    n=$(q "$port" "SELECT count(*) FROM $shard WHERE queue = 'q$i'")
    [ "$n" = 2 ] || misplaced=$((misplaced + 1))
done
expect "enqueue: every queue's jobs in its shard on its node" "0" "$misplaced"

# Claim, heartbeat and complete through the coordinator, each queue.
bad=0
for i in 1 2 3 4 5 6 7 8; do
    read -r id fence < <(q $c "SELECT job_id, fence FROM jobcap.claim_job('q$i', 'w')" | tr '|' ' ')
    [ -n "$id" ] || { bad=$((bad + 1)); continue; }
    q $c "SELECT jobcap.heartbeat($id, $fence)" >/dev/null || bad=$((bad + 1))
    st=$(q $c "SELECT jobcap.complete_job($id, $fence)")
    [ "$st" = succeeded ] || bad=$((bad + 1))
    st=$(q $c "SELECT state FROM jobcap.jobs WHERE queue = 'q$i' AND job_id = $id")
    [ "$st" = succeeded ] || bad=$((bad + 1))
done
expect "claim/heartbeat/complete on the coordinator reach each queue's shard" "0" "$bad"

# The cap: the other job of q1 failed twice (max_attempts 2) ends dead, a third claim finds none.
read -r id fence < <(q $c "SELECT job_id, fence FROM jobcap.claim_job('q1', 'w')" | tr '|' ' ')
expect "fail 1 of 2: pending again" "pending" "$(q $c "SELECT jobcap.fail_job($id, $fence, 'e1')")"
read -r id2 fence2 < <(q $c "SELECT job_id, fence FROM jobcap.claim_job('q1', 'w')" | tr '|' ' ')
expect "the retry is the same job" "$id" "$id2"
expect "fail 2 of 2: dead" "dead" "$(q $c "SELECT jobcap.fail_job($id2, $fence2, 'e2')")"
expect "dead job: no claim after the cap" "" "$(q $c "SELECT job_id FROM jobcap.claim_job('q1', 'w')")"
expect "dead job: a stale fence is refused quietly" "dead" \
    "$(q $c "SELECT state FROM jobcap.jobs WHERE queue = 'q1' AND job_id = $id")"
read -r shard port < <(shard_of q1 | tr '|' ' ')
expect "dead on its shard, on its node" "dead 2" "$(q "$port" "SELECT state || ' ' || attempts FROM $shard WHERE job_id = $id")"

# Ids and fences unique across the cluster (fence 0: never claimed), and each node's ids in its own range.
expect "job ids unique across nodes" "0" "$(q $c "SELECT count(*) - count(DISTINCT job_id) FROM jobcap.jobs")"
expect "fences unique across nodes" "0" \
    "$(q $c "SELECT count(*) - count(DISTINCT fence) FROM jobcap.jobs WHERE fence <> 0")"
expect "job ids from more than one node's range" "t" \
    "$(q $c "SELECT count(DISTINCT job_id >> 48) > 1 FROM jobcap.jobs")"

# Reaping on a worker: a job of q2 claimed with a lease of a second; the worker node's
# background worker (not the coordinator's, which holds no shard of jobs) makes it pending again.
read -r id fence < <(q $c "SELECT job_id, fence FROM jobcap.claim_job('q2', 'w', lease => '1 second')" | tr '|' ' ')
expect "reap: an expired lease on a worker's shard is reaped" "pending" "$(wait_reaped q2 30 "$id")"

# The functions distribute() delegates, and by which argument, are the ones the C++ routes
# (src/spi/citus.cpp's kRules, read from the source): two lists of one rule, tied here.
routed=$(grep -o '{"[a-z_]*", By::[a-z]*, [0-9]*}' "$(dirname "$0")/../../src/spi/citus.cpp" \
    | sed 's/{"\([a-z_]*\)", By::[a-z]*, \([0-9]*\)}/\1 \2/' | sort | tr '\n' ';')
expect "distribute() delegates exactly the functions the C++ routes, by the same argument" "$routed" \
    "$(q $c "SELECT string_agg(p.proname || ' ' || d.distribution_argument_index, ';' ORDER BY p.proname) || ';' FROM pg_dist_object d JOIN pg_proc p ON p.oid = d.objid WHERE d.classid = 'pg_proc'::regclass AND p.pronamespace = 'jobcap'::regnamespace")"

# The other hot-path calls through the coordinator, on q3 (max_attempts 2, no backoff): each
# lands on q3's shard, and the cap, the fence and the history hold there.
read -r shard3 port3 < <(shard_of q3 | tr '|' ' ')
ids=$(q $c "SELECT jobcap.enqueue_jobs('q3', ARRAY['{}', '{}', '{}', '{}', '{}', '{}', '{}']::jsonb[])")
expect "enqueue_jobs: seven jobs in q3's shard on its node" "7" \
    "$(q "$port3" "SELECT count(*) FROM $shard3 WHERE job_id = ANY('$ids')")"
claim() { q $c "SELECT job_id, fence FROM jobcap.claim_job('q3', 'w')" | tr '|' ' '; }
read -r a fa < <(claim)
read -r b fb < <(q $c "SELECT job_id, fence FROM jobcap.complete_and_claim($a, $fa, 'q3', 'w')" | tr '|' ' ')
expect "complete_and_claim: the first succeeded, the next running" "succeeded running" \
    "$(q $c "SELECT string_agg(state::text, ' ' ORDER BY job_id = $b) FROM jobcap.jobs WHERE queue = 'q3' AND job_id IN ($a, $b)")"
expect "release_job: pending" "pending" "$(q $c "SELECT jobcap.release_job($b, $fb)")"
expect "release_job: the attempt given back" "0" \
    "$(q $c "SELECT attempts FROM jobcap.jobs WHERE queue = 'q3' AND job_id = $b")"
read -r cj fc < <(claim)
expect "crash_job: pending, the attempt counted" "pending" "$(q $c "SELECT jobcap.crash_job($cj, $fc, 'worker lost')")"
expect "assert_fence: a stale fence (the crashed attempt's) raises JC001" "JC001" \
    "$(psql -X -q -A -t -v VERBOSITY=verbose -p $c -c "BEGIN" -c "SELECT jobcap.assert_fence($cj, $fc)" -c "COMMIT" 2>&1 | grep -o 'JC001' | head -1)"
read -r d fd < <(claim)
expect "assert_fence: the current fence holds, in a transaction" "ok" \
    "$(psql -X -q -A -t -v ON_ERROR_STOP=1 -p $c -c "BEGIN" -c "SELECT jobcap.assert_fence($d, $fd)" -c "COMMIT" >/dev/null && echo ok)"
expect "give_up_job: dead" "dead" "$(q $c "SELECT jobcap.give_up_job($d, $fd, 'cannot succeed')")"
read -r e fe < <(claim)
expect "snooze_job: pending, the attempt given back" "pending" "$(q $c "SELECT jobcap.snooze_job($e, $fe, '0 s')")"
read -r g fg < <(claim)
expect "time_out_job: pending, the attempt counted" "pending" "$(q $c "SELECT jobcap.time_out_job($g, $fg, 'time limit')")"
expect "history on q3's shard: crashed, released, snoozed, timed_out and the give-up" \
    "crashed error released snoozed timed_out" \
    "$(q $c "SELECT string_agg(DISTINCT kind, ' ' ORDER BY kind) FROM jobcap.job_errors WHERE queue = 'q3'")"
expect "over the cap: none" "0" "$(q $c "SELECT count(*) FROM jobcap.jobs j JOIN jobcap.queues USING (queue) WHERE j.attempts > 2")"

# Workflows on a cluster: a queue created after distribute(); a child waits for its parent of
# the same queue (the same shard), runs when it succeeded, is cancelled when it died; a parent
# in another queue (another shard, maybe another node) is refused with a detail saying why.
q $c "SELECT jobcap.create_queue('wf', max_attempts => 3)" >/dev/null
wf() {  # wf DEPENDS_ON: a parent and its child; claims the parent: "parent fence child"
    local p k
    p=$(q $c "SELECT jobcap.enqueue_job('wf', '{}')")
    k=$(q $c "SELECT jobcap.enqueue_job('wf', '{}', depends_on => ARRAY[$p]::bigint[])")
    echo "$(q $c "SELECT job_id, fence FROM jobcap.claim_job('wf', 'w')" | tr '|' ' ') $k"
}
read -r p fp k < <(wf)
expect "depends_on: the child waits, the parent is the one claimed" "waiting" \
    "$(q $c "SELECT state FROM jobcap.jobs WHERE queue = 'wf' AND job_id = $k")"
q $c "SELECT jobcap.complete_job($p, $fp)" >/dev/null
expect "depends_on: the parent succeeded, the child is pending" "pending" \
    "$(q $c "SELECT state FROM jobcap.jobs WHERE queue = 'wf' AND job_id = $k")"
q $c "SELECT jobcap.purge_pending('wf')" >/dev/null
read -r p fp k < <(wf)
q $c "SELECT jobcap.give_up_job($p, $fp, 'cannot')" >/dev/null
expect "depends_on: the parent died, the child is cancelled" "cancelled" \
    "$(q $c "SELECT state FROM jobcap.jobs WHERE queue = 'wf' AND job_id = $k")"
expect "depends_on a job of another queue: refused, saying why" "42704 own queue" \
    "$(psql -X -q -A -t -v VERBOSITY=verbose -p $c -c "SELECT jobcap.enqueue_job('q4', '{}', depends_on => ARRAY[$p]::bigint[])" 2>&1 | grep -o '42704\|own queue' | tr '\n' ' ' | sed 's/ $//' || true)"

# Flow control on a cluster: the claims of a queue created after distribute() run on its shard
# as the delegated call, with the queue's turn and running jobs per key read there. Round-robin
# with 2 per key (keys a a a b b c c, two jobs without a key): a batch of 4 takes a, b, c and a
# again; then a batch of 10 takes b, c (a at its limit) and the two without a key. A fifo queue
# with 1 per key takes one job of each key; a rate limit of 3 an hour hands out 3 of 10.
# (Returned in claim order: priority, run_at, id.)
q $c "SELECT jobcap.create_queue('fair', fairness => 'round_robin', max_running_per_key => 2)" >/dev/null
q $c "SELECT jobcap.create_queue('perkey', max_running_per_key => 1)" >/dev/null
q $c "SELECT jobcap.create_queue('rated', rate_limit => 3, rate_period => '1 hour')" >/dev/null
for fq in fair perkey rated; do
    q $c "SELECT jobcap.enqueue_jobs('$fq', ARRAY['{\"k\": \"a\"}', '{\"k\": \"a\"}', '{\"k\": \"a\"}', '{\"k\": \"b\"}', '{\"k\": \"b\"}', '{\"k\": \"c\"}', '{\"k\": \"c\"}', '{\"k\": \"-\"}', '{\"k\": \"-\"}']::jsonb[], concurrency_keys => ARRAY['a', 'a', 'a', 'b', 'b', 'c', 'c', NULL, NULL])" >/dev/null
done
keys_of() { q $c "SELECT coalesce(string_agg(payload->>'k', ' '), '') FROM jobcap.claim_job('$1', 'w', $2)"; }
expect "round-robin, 2 per key: a batch of 4 takes a, b, c, a" "a a b c" "$(keys_of fair 4)"
expect "round-robin: the turn ends on a, on the queue's shard" "a" \
    "$(q "$(shard_of fair | cut -d'|' -f2)" "SELECT last_key FROM jobcap.queue_turns WHERE queue = 'fair'")"
expect "round-robin: then b, c and the jobs without a key (a at its limit)" "b c - -" "$(keys_of fair 10)"
expect "fifo, 1 per key: one job of each key and those without a key" "a b c - -" "$(keys_of perkey 10)"
expect "rate limit of 3 an hour: 3 of 10" "3" \
    "$(q $c "SELECT count(*) FROM jobcap.claim_job('rated', 'w', 10)")"
expect "rate limit: nothing more this hour" "0" \
    "$(q $c "SELECT count(*) FROM jobcap.claim_job('rated', 'w', 10)")"

# A shard move under load: two clients enqueue, claim and complete jobs of q5 through the
# coordinator while q5's shard (with its colocated shards) moves to the other worker. Nothing
# acknowledged is lost: every enqueue is there, every claim's fence is its job's (a claim
# committed to the moved-away shard would leave the job to be claimed again with another
# fence), every completion is on the moved shard; the calls that met the move were told to
# retry (40001), and the new node's background worker reaps.
read -r shard5 port5 < <(shard_of q5 | tr '|' ' ')
target=${ports[1]}
[ "$port5" = "$target" ] && target=${ports[2]}
load() {  # load SECONDS CLIENT
    local end=$((SECONDS + $1)) id jf st
    while [ $SECONDS -lt "$end" ]; do
        if id=$(q $c "SELECT jobcap.enqueue_job('q5', '{}')" 2>>"$dir/load.err"); then
            echo "$id" >>"$dir/enqueued.$2"
        fi
        jf=$(q $c "SELECT job_id || ' ' || fence FROM jobcap.claim_job('q5', 'w')" 2>>"$dir/load.err") || continue
        [ -n "$jf" ] || continue
        echo "$jf" >>"$dir/claimed.$2"
        if st=$(q $c "SELECT jobcap.complete_job(${jf% *}, ${jf#* })" 2>>"$dir/load.err"); then
            echo "${jf% *} $st" >>"$dir/completed.$2"
        fi
    done
}
: >"$dir/load.err"
load 12 1 &
load1=$!
load 12 2 &
load2=$!
sleep 4
q $c "SELECT citus_move_shard_placement(${shard5##*_}, 'localhost', $port5, 'localhost', $target, shard_transfer_mode => 'block_writes')" >/dev/null
wait $load1 $load2
cat "$dir"/enqueued.* >"$dir/enqueued"; cat "$dir"/claimed.* >"$dir/claimed"; cat "$dir"/completed.* >"$dir/completed"
expect "shard move: q5's shard is on the other worker" "$target" "$(shard_of q5 | cut -d'|' -f2)"
enqueued=$(wc -l <"$dir/enqueued")
expect "shard move: every job enqueued under load is there ($enqueued)" "$enqueued" \
    "$(q $c "SELECT count(*) FROM jobcap.jobs WHERE queue = 'q5' AND job_id = ANY('{$(paste -sd, "$dir/enqueued")}')")"
claimed=$(wc -l <"$dir/claimed")
expect "shard move: every claim acknowledged under load is its job's fence ($claimed)" "0" \
    "$(q $c "SELECT count(*) FROM (VALUES $(awk '{print "(" $1 ", " $2 ")"}' "$dir/claimed" | paste -sd,)) v(id, f) LEFT JOIN jobcap.jobs j ON j.queue = 'q5' AND j.job_id = v.id AND j.fence = v.f WHERE j.job_id IS NULL")"
completed=$(grep -c ' succeeded$' "$dir/completed" || true)
expect "shard move: every completion acknowledged is succeeded on the moved shard ($completed)" "$completed" \
    "$(q "$target" "SELECT count(*) FROM $(shard_of q5 | cut -d'|' -f1) WHERE state = 'succeeded' AND job_id = ANY('{$(cut -d' ' -f1 "$dir/completed" | paste -sd,)}')")"
expect "shard move: calls failed only with a retry (40001-class) message" "" \
    "$(grep '^ERROR' "$dir/load.err" | grep -v 'moved to another node\|keep moving\|could not serialize' | head -3 || true)"
echo "# under load: $enqueued enqueued, $claimed claimed, $completed completed, $(grep -c '^ERROR' "$dir/load.err" || true) calls told to retry"
# (A job of its own: the load may have drained the queue.)
q $c "SELECT jobcap.enqueue_job('q5', '{}')" >/dev/null
read -r id fence < <(q $c "SELECT job_id, fence FROM jobcap.claim_job('q5', 'w', lease => '1 second')" | tr '|' ' ')
expect "shard move: the new node's background worker reaps q5's expired lease" "pending" \
    "$(wait_reaped q5 30 "$id")"

# A claim that rolls back while its shard moves away: the claim (on the node holding q7's
# shard) holds the job while citus_move_shard_placement starts, and rolls back; the old node's
# background worker counts the rolled-back attempt after the move, on the node that holds the
# job now (jobcap.count_rolled_back_claim, which Citus delegates by the fence). Without that the
# attempt went uncounted, one more than the cap allows.
read -r shard7 port7 < <(shard_of q7 | tr '|' ' ')
to7=${ports[1]}
[ "$port7" = "$to7" ] && to7=${ports[2]}
q $c "SELECT jobcap.enqueue_job('q7', '{}')" >/dev/null
{ echo "BEGIN;"; echo "SELECT job_id FROM jobcap.claim_job('q7', 'rolled-back');"; sleep 4
  echo "ROLLBACK;"; } | psql -X -q -A -t -p "$port7" >"$dir/rollback7.out" 2>&1 &
held=$!
sleep 1.5
q $c "SELECT citus_move_shard_placement(${shard7##*_}, 'localhost', $port7, 'localhost', $to7, shard_transfer_mode => 'block_writes')" >/dev/null
wait $held
id7=$(head -1 "$dir/rollback7.out")
expect "rolled back in a move: the claim held a job of q7" "1" \
    "$(q $c "SELECT count(*) FROM jobcap.jobs WHERE queue = 'q7' AND job_id = ${id7:-0}")"
expect "rolled back in a move: q7's shard moved" "$to7" "$(shard_of q7 | cut -d'|' -f2)"
counted=
for _ in $(seq 1 30); do
    counted=$(q $c "SELECT attempts || ' ' || (SELECT count(*) FROM jobcap.job_errors e WHERE e.queue = 'q7' AND e.job_id = $id7 AND e.kind = 'claim_rolled_back') FROM jobcap.jobs WHERE queue = 'q7' AND job_id = $id7")
    [ "$counted" = "1 1" ] && break
    sleep 1
done
expect "rolled back in a move: the attempt counted on the new node (attempts, history rows)" "1 1" "$counted"

# A worker node restarted with -m immediate while it holds a job claimed with a short lease:
# after the restart its background worker reaps the job.
read -r shard6 port6 < <(shard_of q6 | tr '|' ' ')
q $c "SELECT jobcap.enqueue_job('q6', '{}')" >/dev/null
read -r id fence < <(q $c "SELECT job_id, fence FROM jobcap.claim_job('q6', 'w', lease => '2 seconds')" | tr '|' ' ')
for n in 1 2; do
    [ "${ports[$n]}" = "$port6" ] && pg_ctl -D "$dir/n$n" -m immediate -w restart -l "$dir/n$n.log" >/dev/null
done
expect "node restart: the restarted node's background worker reaps the lease" "pending" \
    "$(wait_reaped q6 40 "$id")"
expect "node restart: the reaped attempt's fence is refused (JC001)" "JC001" \
    "$(psql -X -q -A -t -v VERBOSITY=verbose -p $c -c "SELECT jobcap.complete_job($id, $fence)" 2>&1 | grep -o 'JC001' | head -1 || true)"

# What does not run on a cluster yet is refused at once with 0A000 (src/spi/citus.cpp's
# kNotDistributed), not with Citus's planner error from inside: each listed function, called.
declare -A calls=(
    [cancel_job]="SELECT jobcap.cancel_job($e)"
    [claim_job_by_id]="SELECT * FROM jobcap.claim_job_by_id($e, 'w')"
    [complete_jobs]="SELECT * FROM jobcap.complete_jobs(ARRAY[$e]::bigint[], ARRAY[$fe]::bigint[])"
    [drop_queue]="SELECT jobcap.drop_queue('q8', force => true)"
    [job_result]="SELECT * FROM jobcap.job_result($e)"
    [job_tree]="SELECT * FROM jobcap.job_tree($e)"
    [metrics]="SELECT * FROM jobcap.metrics()"
    [queue_stats_between]="SELECT * FROM jobcap.queue_stats_between(now() - interval '1 hour', now())"
    [reap_jobs]="SELECT * FROM jobcap.reap_jobs()"
    [requeue_dead]="SELECT jobcap.requeue_dead('q1', 'again')"
    [requeue_job]="SELECT jobcap.requeue_job($d, 'again')"
    [top_failing_jobs]="SELECT * FROM jobcap.top_failing_jobs()"
)
listed=$(sed -n '/kNotDistributed\[\] = {/,/};/p' "$(dirname "$0")/../../src/spi/citus.cpp" \
    | grep -o '"[a-z_]*"' | tr -d '"' | sort | tr '\n' ' ')
expect "every function refused on a cluster is called here" "$listed" \
    "$(printf '%s\n' "${!calls[@]}" | sort | tr '\n' ' ')"
refused=""
for f in $(printf '%s\n' "${!calls[@]}" | sort); do
    got=$(psql -X -q -A -t -v VERBOSITY=verbose -p $c -c "${calls[$f]}" 2>&1 | grep -o '0A000' | head -1 || true)
    [ "$got" = 0A000 ] || refused="$refused $f"
done
expect "not yet on a cluster: each refused with 0A000" "" "$refused"
expect "a refused drop_queue dropped nothing" "1" "$(q $c "SELECT count(*) FROM jobcap.queues WHERE queue = 'q8'")"

# The way back to one server (docs/scaling.md, "Going back to one server"): the rows read through
# the coordinator, copied into a fresh install on a plain node, the sequences set past what was
# handed out; the queues then work there, with their jobs' states, attempts and caps as they were.
b=25474
rm -rf "$dir/back"
initdb -D "$dir/back" -A trust >/dev/null
printf '%s\n' "port = $b" "listen_addresses = 'localhost'" "unix_socket_directories = '/tmp'" \
    "shared_preload_libraries = 'jobcap'" >>"$dir/back/postgresql.conf"
pg_ctl -D "$dir/back" -l "$dir/back.log" -w start >/dev/null
q $b "CREATE EXTENSION jobcap" >/dev/null
for t in queues queue_grants job_schedules jobs job_errors; do
    psql -X -q -v ON_ERROR_STOP=1 -p $c -c "\copy (SELECT * FROM jobcap.$t) TO '$dir/back-$t.copy'"
    psql -X -q -v ON_ERROR_STOP=1 -p $b -c "\copy jobcap.$t FROM '$dir/back-$t.copy'"
done
q $b "SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), (SELECT max(job_id) FROM jobcap.jobs));
      SELECT setval('jobcap.fences', (SELECT max(fence) FROM jobcap.jobs));
      SELECT setval(pg_get_serial_sequence('jobcap.job_errors', 'seq'), (SELECT max(seq) FROM jobcap.job_errors))" >/dev/null
summary="SELECT string_agg(queue || ':' || state || ':' || attempts || ':' || n, ' ' ORDER BY queue, state, attempts) FROM (SELECT queue, state, attempts, count(*) AS n FROM jobcap.jobs GROUP BY 1, 2, 3) s"
expect "way back: the jobs' queues, states and attempts as on the cluster" "$(q $c "$summary")" "$(q $b "$summary")"
expect "way back: the history as on the cluster" "$(q $c "SELECT count(*) FROM jobcap.job_errors")" \
    "$(q $b "SELECT count(*) FROM jobcap.job_errors")"
expect "way back: a dead job stays dead (no claim of q1)" "" "$(q $b "SELECT job_id FROM jobcap.claim_job('q1', 'w')")"
id=$(q $b "SELECT jobcap.enqueue_job('q5', '{\"back\": true}')")
expect "way back: a new job's id above every copied one" "t" "$(q $b "SELECT $id > max(job_id) FILTER (WHERE job_id <> $id) FROM jobcap.jobs")"
read -r cid cfence < <(q $b "SELECT job_id, fence FROM jobcap.claim_job_by_id($id, 'w')" | tr '|' ' ')
expect "way back: the claim's fence above every fence handed out on the cluster" "t" \
    "$(q $b "SELECT $cfence > max(fence) FILTER (WHERE job_id <> $cid) FROM jobcap.jobs")"
expect "way back: claimed and completed on the plain node" "succeeded" "$(q $b "SELECT jobcap.complete_job($cid, $cfence)")"
pg_ctl -D "$dir/back" -m fast stop >/dev/null

echo "citus: $failures failed"
[ "$failures" -eq 0 ]
