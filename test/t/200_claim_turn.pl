# The claim turn of a queue whose limits are max_running, max_running_per_key and rate_limit
# alone (src/spi/queue_lock.hpp), on the direct path. Far below the limit claims take the turn shared
# and do not wait for each other; near it they take turns. Then the bound at its edge: 24 clients
# claim batches of 32 (each transaction held 20 ms, so more claims are in flight than there are
# slots) from a queue whose limit is 100 + 16 x 32, where every claim is shared until 100 run:
# none completes, so the running jobs at the end are the most that ever ran, and they must be
# exactly the limit: max_running; max_running_per_key with every job of one key; a rate limit
# per hour; and both of the first, a per-key limit of 612 on half the jobs and max_running 2,000
# on the queue.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use List::Util qw(sum);
use JobcapTest;

my $node = jobcap_node('claim_turn', max_connections => 40);
$node->safe_psql('postgres', q{
	CREATE EXTENSION jobcap;
	SELECT jobcap.create_queue('wide', max_running => 100000);
	SELECT jobcap.create_queue('narrow', max_running => 600);
	SELECT jobcap.create_queue('keyed', max_running_per_key => 100000);
	SELECT jobcap.create_queue('keyed_narrow', max_running_per_key => 600);
	SELECT jobcap.enqueue_jobs('keyed', array_fill('{}'::jsonb, ARRAY[10]),
	                           concurrency_keys => array_fill('k'::text, ARRAY[10]));
	SELECT jobcap.enqueue_jobs('keyed_narrow', array_fill('{}'::jsonb, ARRAY[200]));
	SELECT jobcap.enqueue_jobs('wide', array_fill('{}'::jsonb, ARRAY[100]));
	SELECT jobcap.enqueue_jobs('narrow', array_fill('{}'::jsonb, ARRAY[200]));
});

# The advisory locks (objsubid 5: turn, 6: slot) a session holds, as "mode/objsubid".
sub turn_locks
{
	my ($pid) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(mode || '/' || objsubid, ',' ORDER BY objsubid)
		  FROM pg_locks WHERE pid = $pid AND locktype = 'advisory' AND objsubid IN (5, 6) AND granted});
}

my $holder = $node->background_psql('postgres');
my $pid = $holder->query_safe('SELECT pg_backend_pid()');

# Far below its limit: the claim holds the shared turn and a slot; another claim does not wait.
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('wide', 'h', 1)});
is(turn_locks($pid), 'ShareLock/5,ExclusiveLock/6', 'a claim far below max_running holds the shared turn and a slot');
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '2s'; SELECT count(*) FROM jobcap.claim_job('wide', 'o', 1)});
is("$rc $out", '0 1', 'another claim of the queue does not wait for it');
# A second claim in the same transaction takes a slot of its own (each slot stands for one
# claim's jobs in flight), and still nobody waits.
$holder->query_safe(q{SELECT count(*) FROM jobcap.claim_job('wide', 'h', 1)});
is(turn_locks($pid), 'ShareLock/5,ExclusiveLock/6,ExclusiveLock/6', 'a second claim holds a second slot');
($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '2s'; SELECT count(*) FROM jobcap.claim_job('wide', 'o', 1)});
is("$rc $out", '0 1', 'another claim still does not wait');
$holder->query_safe('COMMIT');

# Two workers that each claim twice in one transaction, interleaved: no deadlock (the first
# claims are shared; so are the second ones, each under a slot of its own).
my $other = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('wide', 'h', 1)});
$other->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('wide', 'o', 1)});
$holder->query_safe(q{SELECT count(*) FROM jobcap.claim_job('wide', 'h', 1)});
$other->query_safe(q{SELECT count(*) FROM jobcap.claim_job('wide', 'o', 1)});
$holder->query_safe('COMMIT');
$other->query_safe('COMMIT');
$other->quit;
is($node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.jobs WHERE queue = 'wide' AND state = 'running'}),
	'8', 'both workers\' two claims went through');

# Near the limit (600 - 512 < 100 running after this fill): exclusive, and the next one waits.
$node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('narrow', 'f', 100)});
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('narrow', 'h', 1)});
is(turn_locks($pid), 'ExclusiveLock/5', 'a claim near max_running takes the turn exclusive');
($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '500ms'; SELECT count(*) FROM jobcap.claim_job('narrow', 'o', 1)});
like($err, qr/lock timeout/, 'another claim waits for it');
$holder->query_safe('COMMIT');

# A per-key limit far above the queue's running jobs: shared; near them (jobs without a key
# count too: a key's running jobs are some of the queue's), exclusive.
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('keyed', 'h', 1)});
is(turn_locks($pid), 'ShareLock/5,ExclusiveLock/6', 'a claim far below max_running_per_key holds the shared turn and a slot');
($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '2s'; SELECT count(*) FROM jobcap.claim_job('keyed', 'o', 1)});
is("$rc $out", '0 1', 'another claim of the keyed queue does not wait for it');
$holder->query_safe('COMMIT');
$node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('keyed_narrow', 'f', 100)});
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('keyed_narrow', 'h', 1)});
is(turn_locks($pid), 'ExclusiveLock/5', 'a claim near max_running_per_key takes the turn exclusive');
$holder->query_safe('COMMIT');

# A rate limit far above the window's claims: shared, the claim charged to its slot's own row of
# the window (queue_rates, slot 0 to 15); near it, exclusive, charged to the row of slot -1.
$node->safe_psql('postgres', q{
	SELECT jobcap.create_queue('rated', rate_limit => 1000000, rate_period => '1 hour');
	SELECT jobcap.create_queue('rated_narrow', rate_limit => 600, rate_period => '1 hour');
	SELECT jobcap.enqueue_jobs('rated', array_fill('{}'::jsonb, ARRAY[10]));
	SELECT jobcap.enqueue_jobs('rated_narrow', array_fill('{}'::jsonb, ARRAY[200]));
});
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('rated', 'h', 2)});
is(turn_locks($pid), 'ShareLock/5,ExclusiveLock/6', 'a claim far below rate_limit holds the shared turn and a slot');
($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '2s'; SELECT count(*) FROM jobcap.claim_job('rated', 'o', 1)});
is("$rc $out", '0 1', 'another claim of the rated queue does not wait for it');
$holder->query_safe('COMMIT');
# The window's rows (slot >= 0: a slot of the shared turn) and their charges.
sub rate_rows
{
	my ($queue) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(CASE WHEN slot < 0 THEN 'x' ELSE 's' END || (SELECT sum(c) FROM unnest(counts) c),
		                  ',' ORDER BY slot < 0, (SELECT sum(c) FROM unnest(counts) c))
		  FROM jobcap.queue_rates WHERE queue = '$queue'});
}
is(rate_rows('rated'), 's1,s2', 'each shared claim charged its own slot\'s row');
$node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('rated_narrow', 'f', 100)});
is(rate_rows('rated_narrow'), 'x100', 'a claim near the rate limit charged the exclusive turn\'s row');
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('rated_narrow', 'h', 1)});
is(turn_locks($pid), 'ExclusiveLock/5', 'a claim near rate_limit takes the turn exclusive');
$holder->query_safe('COMMIT');

# A claim's time is read once it holds the turn: a claim that waited for another's turn is not
# charged to a later slot than its jobs' claimed_at (it was, when the time was read before the
# wait: 19 claims within one period of 3.2 s, at a limit of 10). A fills the window; H claims
# nothing (the window is full) and holds the turn; X waits for it; once A's claims have left the
# window, H claims 1 and commits, and X takes the 9 left.
$node->safe_psql('postgres', q{
	SELECT jobcap.create_queue('late', rate_limit => 10, rate_period => '3.2 seconds');
	SELECT jobcap.enqueue_jobs('late', array_fill('{}'::jsonb, ARRAY[100]));
});
my $t0 = time;
is($node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('late', 'A', 10)}), '10',
	'A fills the window');
select(undef, undef, undef, 2.9 - (time - $t0));
$holder->query_safe(q{BEGIN; SELECT count(*) FROM jobcap.claim_job('late', 'H', 1)});
my $waiter = $node->background_psql('postgres');
$waiter->query_until(qr/started/, q{\echo started
	SELECT count(*) FROM jobcap.claim_job('late', 'X', 10);
});
select(undef, undef, undef, 3.6 - (time - $t0));
is($holder->query_safe(q{SELECT count(*) FROM jobcap.claim_job('late', 'H', 1)}), '1',
	'H claims once A\'s claims have left the window');
$holder->query_safe('COMMIT');
$waiter->quit;
is($node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE worker = 'X') || ' '
		       || (SELECT max((SELECT count(*) FROM jobcap.jobs k WHERE k.queue = 'late'
		                        AND k.claimed_at > j.claimed_at - interval '3.2 seconds'
		                        AND k.claimed_at <= j.claimed_at))
		             FROM jobcap.jobs j WHERE j.queue = 'late' AND j.claimed_at IS NOT NULL)
		  FROM jobcap.jobs WHERE queue = 'late'}),
	'9 10', 'X took the 9 left, and no window of the period holds more than 10 by claimed_at');
$holder->quit;

# The count at its bound, one claim at a time (max_running 552: shared while at most 40 run). The
# claim counts jobs_running's entries first and reads their rows only past 64 entries or past
# the bound (src/direct/claim.cpp): at 40 running it shares without reading a row; at 41 it takes
# the turn exclusive; with 30 running beside 11 completed jobs' entries (over 40) it reads the
# rows, finds 30 and shares.
$node->safe_psql('postgres', q{
	SELECT jobcap.create_queue('bound', max_running => 552);
	SELECT jobcap.enqueue_jobs('bound', array_fill('{}'::jsonb, ARRAY[100]));
});
my $prober = $node->background_psql('postgres');
my $prober_pid = $prober->query_safe('SELECT pg_backend_pid()');
# A claim of one job in a transaction rolled back: its turn locks and whether it read rows of
# jobcap.jobs through jobs_running. The count is taken before and after the claim: the backend
# sends its counts to the shared statistics at most once a second, and what it has not sent
# (earlier transactions' counts among them) is what the "xact" function reads.
sub probe_bound
{
	$prober->query_safe(q{BEGIN;
		CREATE TEMP TABLE fetched ON COMMIT DROP AS
		SELECT pg_stat_get_xact_tuples_fetched('jobcap.jobs_running'::regclass) AS before;
		SELECT count(*) FROM jobcap.claim_job('bound', 'p', 1)});
	my $locks = turn_locks($prober_pid);
	my $rows = $prober->query_safe(
		q{SELECT pg_stat_get_xact_tuples_fetched('jobcap.jobs_running'::regclass) > before FROM fetched});
	$prober->query_safe('ROLLBACK');
	return "$locks " . ($rows eq 't' ? 'rows read' : 'no row read');
}
$node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('bound', 'f', 40)});
is(probe_bound(), 'ShareLock/5,ExclusiveLock/6 no row read', '40 running: shared, by the entries alone');
$node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('bound', 'f', 1)});
is(probe_bound(), 'ExclusiveLock/5 rows read', '41 running: exclusive');
# A snapshot taken before the 11 complete keeps their running versions visible to it, so neither
# (auto)vacuum nor another scan can remove or mark dead their entries before the probe counts them.
my $old_snapshot = $node->background_psql('postgres');
$old_snapshot->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');
$node->safe_psql('postgres', q{
	SELECT count(jobcap.complete_job(job_id, fence))
	  FROM (SELECT job_id, fence FROM jobcap.jobs WHERE queue = 'bound' AND state = 'running'
	         ORDER BY job_id LIMIT 11) s});
is(probe_bound(), 'ShareLock/5,ExclusiveLock/6 rows read',
	'30 running beside 11 completed jobs\' entries: the rows read, shared');
$old_snapshot->quit;
$prober->quit;

# The edge. The low edges' bounds (40 running) lie within the entries of jobs_running a claim
# counts before it reads their rows (src/direct/claim.cpp's kEntriesFirst, 64): there the count
# of entries alone lets claims share the turn.
my $limit = 100 + 16 * 32;
my $low = 40 + 16 * 32;
$node->safe_psql('postgres', qq{
	SELECT jobcap.create_queue('edge', max_running => $limit);
	SELECT jobcap.enqueue_jobs('edge', array_fill('{}'::jsonb, ARRAY[3000]));
	SELECT jobcap.create_queue('edge_low', max_running => $low);
	SELECT jobcap.enqueue_jobs('edge_low', array_fill('{}'::jsonb, ARRAY[3000]));
	SELECT jobcap.create_queue('edge_low_key', max_running_per_key => $low);
	SELECT jobcap.enqueue_jobs('edge_low_key', array_fill('{}'::jsonb, ARRAY[3000]),
	                           concurrency_keys => array_fill('k'::text, ARRAY[3000]));
	SELECT jobcap.create_queue('edge_key', max_running_per_key => $limit);
	SELECT jobcap.enqueue_jobs('edge_key', array_fill('{}'::jsonb, ARRAY[3000]),
	                           concurrency_keys => array_fill('k'::text, ARRAY[3000]));
	SELECT jobcap.create_queue('edge_rate', rate_limit => $limit, rate_period => '1 hour');
	SELECT jobcap.enqueue_jobs('edge_rate', array_fill('{}'::jsonb, ARRAY[3000]));
	SELECT jobcap.create_queue('edge_both', max_running => 2000, max_running_per_key => $limit);
	SELECT jobcap.enqueue_jobs('edge_both', array_fill('{}'::jsonb, ARRAY[6000]),
	                           concurrency_keys => (SELECT array_agg(CASE WHEN i % 2 = 0 THEN 'k' END)
	                                                  FROM generate_series(1, 6000) i));
});
# The rate-limited queue's claims run 16 at once, one per slot: then no claim finds every slot
# taken and the claims go on sharing the turn in waves, each wave's claims seeing the last's
# charges, never their own (with 24 clients the first claim that finds no slot sends them all
# to the exclusive turn after the first wave, and a bound too loose would go unseen).
my %clients = (edge_rate => 16);
my %want = (
	edge => "$limit $limit 1",
	edge_key => "$limit $limit 1",
	edge_low => "$low $low 1",
	edge_low_key => "$low $low 1",
	edge_rate => "$limit $limit 1",
	edge_both => "2000 $limit 1");
for my $queue (sort keys %want)
{
	my $script = $node->basedir . "/$queue.pgbench";
	open my $fh, '>', $script or die $!;
	print $fh "BEGIN;\nSELECT count(*) FROM jobcap.claim_job('$queue', 'edge', 32);\n"
	  . "SELECT pg_sleep(0.02);\nCOMMIT;\n";
	close $fh;
	$node->command_ok(
		[ $node->installed_command('pgbench'), '-n', '-c', $clients{$queue} // 24, '-j', '2',
		  '-t', '10', '-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
		"$queue: " . ($clients{$queue} // 24) . " clients claim batches of 32");
	is($node->safe_psql('postgres', qq{
			SELECT count(*) FILTER (WHERE state = 'running') || ' '
			       || count(*) FILTER (WHERE state = 'running' AND concurrency_key IS NOT DISTINCT FROM
			                           (SELECT min(concurrency_key) FROM jobcap.jobs WHERE queue = '$queue'))
			       || ' ' || max(attempts)
			  FROM jobcap.jobs WHERE queue = '$queue'}),
		$want{$queue}, "$queue: exactly the limit runs ($want{$queue}: in all, of the key, most attempts)");
}
is($node->safe_psql('postgres', q{
		SELECT sum(c) || ' ' || bool_or(r.slot >= 0)
		  FROM jobcap.queue_rates r, unnest(r.counts) c WHERE r.queue = 'edge_rate'}),
	"$limit true", 'edge_rate: the window counts every claim, some of them charged under slots');
# The shared claims wrote their rows without the executor (src/direct/rates.cpp), updates HOT
# or not and inserts: the primary key holds every row once (amcheck reads the heap against it).
$node->safe_psql('postgres', 'CREATE EXTENSION amcheck');
is($node->safe_psql('postgres', q{
		SELECT jobcap_checked FROM (SELECT bt_index_parent_check('jobcap.queue_rates_pkey', true)) c(jobcap_checked)}),
	'', 'queue_rates_pkey indexes every row of the window');
# A charge whose page is full: the row's new version goes to another page, with a new key entry.
# (A claim takes whichever slot is free: every slot's row is there, on the full page.)
my $before = $node->safe_psql('postgres', q{
	SELECT n_tup_upd - n_tup_hot_upd FROM pg_stat_user_tables
	 WHERE relid = 'jobcap.queue_rates'::regclass});
$node->safe_psql('postgres', q{
	SELECT jobcap.enqueue_jobs('rated', array_fill('{}'::jsonb, ARRAY[3]));
	VACUUM jobcap.queue_rates;
	INSERT INTO jobcap.queue_rates
	  SELECT 'rated', s, 225000000, 0, array_fill(0, ARRAY[17]) FROM generate_series(0, 15) s
	  ON CONFLICT DO NOTHING;
	INSERT INTO jobcap.queue_rates
	  SELECT 'filler', s, 1, 0, array_fill(0, ARRAY[17]) FROM generate_series(0, 399) s;
});
# Each slot's charges. The claim's slot is the first free one from its process id modulo 16, so
# which row it charges (one with earlier charges or not) depends on the pid it got.
sub charges_by_slot
{
	return map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
		SELECT slot, (SELECT sum(c) FROM unnest(counts) c) FROM jobcap.queue_rates
		 WHERE queue = 'rated'});
}
my %charged = charges_by_slot();
is($node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('rated', 'f', 3)}), '3',
	'a claim whose row sits in a full page');
ok($node->poll_query_until('postgres', qq{
	SELECT n_tup_upd - n_tup_hot_upd > $before FROM pg_stat_user_tables
	 WHERE relid = 'jobcap.queue_rates'::regclass}), 'its row\'s new version left the page');
my %now = charges_by_slot();
my @changed = grep { $now{$_} != ($charged{$_} // 0) } sort keys %now;
is(join(',', map { $now{$_} - ($charged{$_} // 0) } @changed) . ' in all ' . sum(values %now),
	'3 in all 6', 'its charge is counted, in its slot\'s row alone');
is($node->safe_psql('postgres', q{
		SELECT jobcap_checked FROM (SELECT bt_index_parent_check('jobcap.queue_rates_pkey', true)) c(jobcap_checked)}),
	'', 'queue_rates_pkey indexes the new version');

# A publication of queue_rates whose column list leaves out the replica identity: the direct
# path's charge is refused as the SQL path's upsert is (nothing claimed, the error says why).
$node->safe_psql('postgres', q{
	SELECT jobcap.enqueue_jobs('rated', array_fill('{}'::jsonb, ARRAY[3]));
	CREATE PUBLICATION rates_counts FOR TABLE jobcap.queue_rates (queue, counts) WITH (publish = 'update');
});
($rc, $out, $err) = $node->psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('rated', 'pub', 3)});
like($err, qr/cannot update table "queue_rates"/, 'a publication that cannot carry the charge refuses it');
$node->safe_psql('postgres', 'DROP PUBLICATION rates_counts');
is($node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('rated', 'pub', 3)}), '3',
	'without it the claim goes through');

# DDL on queue_rates between a shared claim's read of the window and its write: the claim takes
# the write's lock before it reads, so an index created meanwhile waits for it, or (created
# first, as here) is seen by it, and the claim goes to the SQL path, whose INSERT fills every
# index. Before, the claim wrote its row into the primary key only.
$node->safe_psql('postgres', q{SELECT jobcap.enqueue_jobs('rated', array_fill('{}'::jsonb, ARRAY[3]))});
my $ddl = $node->background_psql('postgres');
$ddl->query_safe('BEGIN; LOCK TABLE jobcap.queue_rates IN SHARE MODE');
my $claimer = $node->background_psql('postgres');
$claimer->query_until(qr/started/, q{\echo started
	SELECT count(*) FROM jobcap.claim_job('rated', 'ddl', 3);
});
$ddl->query_safe('CREATE INDEX queue_rates_by_counts ON jobcap.queue_rates (queue, counts); COMMIT');
$ddl->quit;
$claimer->quit;
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM jobcap.jobs WHERE queue = 'rated' AND worker = 'ddl' AND state = 'running'}),
	'3', 'the claim waited for the DDL, then claimed');
is($node->safe_psql('postgres', q{
		SELECT jobcap_checked FROM (SELECT bt_index_check('jobcap.queue_rates_by_counts', true)) c(jobcap_checked)}),
	'', 'the index created meanwhile holds its row');

# jobs_running as 0.2.0 built it (on job_id alone, every queue's running jobs: a database not yet
# updated, served by this library): the count's entries are every queue's, thousands here, so it
# reads the rows and counts the queue's own, 30, and shares; at 41 exclusive.
$node->safe_psql('postgres', q{
	DROP INDEX jobcap.jobs_running;
	CREATE INDEX jobs_running ON jobcap.jobs (job_id) WHERE state OPERATOR(pg_catalog.=) 'running';
});
$prober = $node->background_psql('postgres');
$prober_pid = $prober->query_safe('SELECT pg_backend_pid()');
is(probe_bound(), 'ShareLock/5,ExclusiveLock/6 rows read', '0.2.0\'s jobs_running, 30 running: shared');
$node->safe_psql('postgres', q{SELECT count(*) FROM jobcap.claim_job('bound', 'f', 11)});
is(probe_bound(), 'ExclusiveLock/5 rows read', '0.2.0\'s jobs_running, 41 running: exclusive');
$prober->quit;

done_testing();
