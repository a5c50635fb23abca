# Retention: succeeded jobs past jobcap.succeeded_retention go in batches, each its own
# transaction, with their error history; dead and cancelled jobs stay by default
# (dead_retention = 0) and go only once dead_retention is set.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $node = jobcap_node('retention', 'jobcap.succeeded_retention' => 0);
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('r');
    -- 2500 succeeded two days ago, 3 succeeded just now, 2 dead and 1 cancelled two days ago
    INSERT INTO jobcap.jobs (queue, state, attempts, fence, finished_at)
    SELECT 'r', 'succeeded', 1, 1, now() - interval '2 days' FROM generate_series(1, 2500);
    INSERT INTO jobcap.jobs (queue, state, attempts, fence, finished_at)
    SELECT 'r', 'succeeded', 1, 1, now() FROM generate_series(1, 3);
    INSERT INTO jobcap.jobs (queue, state, attempts, fence, finished_at, max_attempts)
    SELECT 'r', s::jobcap.job_state, 2, 2, now() - interval '2 days', 2
      FROM unnest(ARRAY['dead', 'dead', 'cancelled']) s;
    -- history: a failed first attempt for every one of them
    INSERT INTO jobcap.job_errors (job_id, queue, attempt, fence, kind, error)
    SELECT job_id, queue, 1, 1, 'error', 'boom' FROM jobcap.jobs;
});
sleep 1;
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs"), '2506',
	'succeeded_retention = 0 keeps everything');

my $offset = -s $node->logfile;
$node->safe_psql('postgres', q{
    ALTER SYSTEM SET jobcap.succeeded_retention = '1d';
    ALTER SYSTEM SET log_min_messages = debug1;
    SELECT pg_reload_conf();
});
ok(defined wait_until($node, "SELECT count(*) = 6 FROM jobcap.jobs"), 'old succeeded jobs pruned');
$node->safe_psql('postgres', "ALTER SYSTEM RESET log_min_messages; SELECT pg_reload_conf()");
my @batches = slurp_file($node->logfile, $offset) =~
  m/jobcap reaper pruned (\d+) succeeded jobs in database "postgres" \(batch of 1000\)/g;
is(join(' ', @batches), '1000 1000 500', 'in batches of 1000, one transaction each');
is($node->safe_psql('postgres', "SELECT string_agg(state || ' ' || n, ', ' ORDER BY state) FROM
    (SELECT state, count(*) AS n FROM jobcap.jobs GROUP BY state) s"),
	'succeeded 3, dead 2, cancelled 1', 'recent succeeded jobs stay; dead and cancelled stay by default');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.job_errors e
    WHERE NOT EXISTS (SELECT FROM jobcap.jobs j WHERE j.job_id = e.job_id)"), '0',
	'the pruned jobs took their history with them');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.job_errors"), '6', 'the rest keep theirs');

$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.dead_retention = '1d'; SELECT pg_reload_conf()");
ok(defined wait_until($node, "SELECT count(*) = 3 FROM jobcap.jobs"), 'dead_retention set: old dead and cancelled go');
is($node->safe_psql('postgres', "SELECT string_agg(DISTINCT state::text, ',') || ' ' || count(*)
    FROM jobcap.jobs"), 'succeeded 3', 'only the recent succeeded jobs are left');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.job_errors"), '3', 'with their history');

# At scale, with none due: 100,000 succeeded and 1,000 dead jobs kept, finished in the last hour
# in no particular order of the table's pages (as completions, retries and vacuums leave them).
# A cycle's prunes walk jobs_finished and never read the table; a sequential scan there, every
# cycle, held back the xmin horizon of every claim while it read the whole table. The prunes'
# InitPlan reads stats_progress (a sequential scan of its one row), which counts the cycles.
$node->safe_psql('postgres', q{
    INSERT INTO jobcap.jobs (queue, state, attempts, fence, finished_at)
    SELECT 'r', 'succeeded', 1, 1, now() - random() * interval '1 hour'
      FROM generate_series(1, 100000);
    INSERT INTO jobcap.jobs (queue, state, attempts, fence, finished_at, max_attempts)
    SELECT 'r', 'dead', 1, 1, now() - random() * interval '1 hour', 1
      FROM generate_series(1, 1000);
    ANALYZE jobcap.jobs;
    ALTER SYSTEM SET jobcap.reap_interval = '50ms';
    SELECT pg_reload_conf();
});
# Measure from the first count that covers them (it reads the ones finished since the last
# count, once).
my $inserted = $node->safe_psql('postgres', 'SELECT now()');
ok(defined wait_until($node, "SELECT counted_until > '$inserted' FROM jobcap.stats_progress"),
	'the worker counted up to now');
my $scans = q{SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'jobcap.%s'::regclass};
# The worker's statistics reach pg_stat_user_tables at most once a second, all its pending
# counts at once, and a flush may leave an entry someone is reading for the next. Its plans from
# before the ANALYZE (a table of three rows, then one growing under the INSERT) may have read the
# table: wait for two flushes after the count, so that those scans are in the baseline.
for (1 .. 2) {
	my $flushed = $node->safe_psql('postgres', sprintf($scans, 'stats_progress'));
	defined wait_until($node, "SELECT seq_scan > $flushed FROM pg_stat_user_tables
	    WHERE relid = 'jobcap.stats_progress'::regclass")
	  or die "the worker's statistics did not reach pg_stat_user_tables";
}
my $jobs_scans = $node->safe_psql('postgres', sprintf($scans, 'jobs'));
my $finished_read = q{SELECT idx_tup_read FROM pg_stat_user_indexes
    WHERE indexrelid = 'jobcap.jobs_finished'::regclass};
my $finished_before = $node->safe_psql('postgres', $finished_read);
my $progress_scans = $node->safe_psql('postgres', sprintf($scans, 'stats_progress'));
ok(defined wait_until($node, "SELECT seq_scan >= $progress_scans + 40 FROM pg_stat_user_tables
    WHERE relid = 'jobcap.stats_progress'::regclass"),
	'the worker ran its prunes at least 20 times');
is($node->safe_psql('postgres', sprintf($scans, 'jobs')), $jobs_scans,
	'with 101,000 finished jobs kept and none due, no step of the worker read the whole table');
my $finished_entries = $node->safe_psql('postgres', $finished_read) - $finished_before;
cmp_ok($finished_entries, '<', 1000,
	'nor read more than a few jobs_finished entries per cycle (the counts among them)');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs"), '101003', 'and none went');

$node->stop;
done_testing();
