# The worker vacuums jobcap.jobs (jobcap.vacuum): every cycle it applies autovacuum's threshold
# for the table (autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor x rows, the
# table's own settings: 1000 + 2%; its rows less the finished jobs kept) and runs VACUUM itself
# when more rows than that have died since its last vacuum. Autovacuum is on but looks only once a day here, so every vacuum
# counted in pg_stat_user_tables.vacuum_count (manual vacuums; autovacuum's have their own
# counter) is the worker's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use JobcapTest;

my $node = jobcap_node('vacuum', autovacuum_naptime => "'1d'", log_min_messages => 'debug1');
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('v');
    SELECT count(*) FROM unnest(jobcap.enqueue_jobs('v', array_fill('{}'::jsonb, ARRAY[6000])));
    VACUUM ANALYZE jobcap.jobs;
});
my $threshold = 1000 + 0.02 * 6000;

sub vacuums
{
	return $node->safe_psql('postgres', "SELECT vacuum_count || ' ' || autovacuum_count
	    FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass");
}

sub dead
{
	return $node->safe_psql('postgres',
		"SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass");
}

# $n dead rows: updates of pending jobs' payloads, in one transaction of a session that ends (its
# counts reach the statistics when it exits): the first $n pending jobs by id from the $from-th
# on. While a snapshot is held, each call updates jobs no call updated since (a version made after
# the snapshot and then updated dies invisible to every snapshot, and pruning may remove it
# before a vacuum, lowering the dead rows counted).
sub kill_rows
{
	my ($n, $from) = @_;
	$from //= 0;
	$node->safe_psql('postgres', "UPDATE jobcap.jobs SET payload = payload
	    WHERE job_id IN (SELECT job_id FROM jobcap.jobs WHERE state = 'pending'
	                      ORDER BY job_id OFFSET $from LIMIT $n)");
}

# Claims and completions make dead rows the way a queue does.
sub work
{
	my ($n) = @_;
	$node->safe_psql('postgres', "SELECT jobcap.complete_jobs(array_agg(job_id), array_agg(fence))
	    FROM jobcap.claim_job('v', 'w', $n)");
}

# Waits until jobcap.jobs has been vacuumed $n times in all (VACUUM ANALYZE above included).
sub vacuumed
{
	my ($n) = @_;
	return defined wait_until($node, "SELECT vacuum_count = $n FROM pg_stat_user_tables
	    WHERE relid = 'jobcap.jobs'::regclass");
}

# Ten cycles of the worker (reap_interval is 100 ms) and a little more.
sub some_cycles { usleep(1_500_000); }

is(vacuums(), '1 0', 'only the VACUUM ANALYZE so far');

my $offset = -s $node->logfile;
work(700);    # 1400 dead rows
ok(vacuumed(2), 'claims and completions past the threshold: the worker vacuums');
is(vacuums(), '2 0', 'one vacuum, the worker\'s; none by autovacuum');
ok(dead() < 100, 'the dead rows are gone');
is(count_log($node, qr/jobcap reaper vacuumed jobcap\.jobs in database "postgres" in \d+ ms: \d+ dead rows before, \d+ after/, $offset),
	1, 'the worker says so at DEBUG1');

kill_rows(int($threshold * 0.8));
some_cycles();
is(vacuums(), '2 0', 'below the threshold: no vacuum');
kill_rows(int($threshold * 0.4));
ok(vacuumed(3), 'past it, counting the rows that died before: a vacuum');

$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.vacuum = off; SELECT pg_reload_conf()");
some_cycles();
kill_rows(2000);
some_cycles();
is(vacuums(), '3 0', 'jobcap.vacuum = off: no vacuum');
$node->safe_psql('postgres', "ALTER SYSTEM RESET jobcap.vacuum; SELECT pg_reload_conf()");
ok(vacuumed(4), 'on again: the rows that died meanwhile are vacuumed');

$node->safe_psql('postgres', "ALTER TABLE jobcap.jobs SET (autovacuum_enabled = false)");
kill_rows(2000);
some_cycles();
is(vacuums(), '4 0', 'autovacuum_enabled = false for the table: no vacuum');
$node->safe_psql('postgres', "ALTER TABLE jobcap.jobs RESET (autovacuum_enabled)");
ok(vacuumed(5), 'reset: vacuumed');

# A snapshot that sees the rows about to die keeps them: the vacuum frees little, and the next
# waits for twice the threshold of new dead rows, not for one more cycle.
my $holder = $node->background_psql('postgres');
$holder->query_safe("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM jobcap.jobs");
$offset = -s $node->logfile;
kill_rows(int($threshold * 1.5));
ok(vacuumed(6), 'held back: the worker vacuums once');
ok(dead() >= int($threshold * 1.5), 'and the dead rows stay');
is(count_log($node, qr/Most dead rows are still visible to some snapshot: the next vacuum waits for \d+ new dead rows/, $offset),
	1, 'the worker says why it waits');
kill_rows(int($threshold * 1.5), int($threshold * 1.5));
some_cycles();
is(vacuums(), '6 0', 'one threshold of new dead rows is not enough now');
kill_rows(int($threshold * 0.9), int($threshold * 3));
ok(vacuumed(7), 'twice the threshold is');
$holder->query_safe("COMMIT");
$holder->quit;
ok(defined wait_until($node, "SELECT n_dead_tup < 100 FROM pg_stat_user_tables
    WHERE relid = 'jobcap.jobs'::regclass"), 'the snapshot gone, a vacuum frees them all');

is($node->safe_psql('postgres', "SELECT count(*) FILTER (WHERE state = 'pending') || ' '
    || count(*) FILTER (WHERE state = 'succeeded') FROM jobcap.jobs"), '5300 700',
	'no job changed by any of it');

# A history kept does not put vacuums further apart: the rule's rows are the table's less the
# finished jobs (jobs_finished's reltuples), the rows that claims walk. With 100,000 succeeded
# jobs kept (100,700 finished and 5,300 pending in all), autovacuum's rule would wait for
# 1000 + 2% of 106,000 = 3,120 dead rows; the worker's waits for 1000 + 2% of the 5,300 pending
# jobs, 1,106. (Dead rows counted drop below those made: an UPDATE prunes what it finds dead.)
$node->safe_psql('postgres', q{
    INSERT INTO jobcap.jobs (queue, state, attempts, fence, lease, worker, enqueued_at,
                             first_claimed_at, claimed_at, finished_at, payload)
    SELECT 'v', 'succeeded', 1, 1, '1 hour', 'w', now(), now(), now(), now(), '{}'
      FROM generate_series(1, 100000);
    VACUUM ANALYZE jobcap.jobs;
});
is($node->safe_psql('postgres', "SELECT reltuples > 90000 FROM pg_class
    WHERE oid = 'jobcap.jobs_finished'::regclass"), 't', 'jobs_finished counts the kept history');
my ($done) = split / /, vacuums();
kill_rows(700);
some_cycles();
is(vacuums(), "$done 0", 'history kept, 700 dead rows: below the threshold, no vacuum');
kill_rows(1100);
ok(vacuumed($done + 1), 'history kept, 1,800 dead rows: past 1,106, a vacuum (not 3,120)');
is($node->safe_psql('postgres', "SELECT count(*) FILTER (WHERE state = 'pending') || ' '
    || count(*) FILTER (WHERE state = 'succeeded') FROM jobcap.jobs"), '5300 100700',
	'no job changed by it');
is(count_log($node, qr/could not vacuum/), 0, 'no vacuum failed');

$node->stop;
done_testing();
