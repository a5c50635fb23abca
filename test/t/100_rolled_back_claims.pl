# A claim whose transaction rolls back still counts its attempt (jobcap preloaded): the reaper
# adds it in a transaction of its own, with a history row of kind claim_rolled_back, so a job
# whose claims keep rolling back dies at exactly its cap, like a SIGKILLed one, and the
# statistics show it. A claim that committed is never counted twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $node = jobcap_node('rollback', 'jobcap.error_history' => '50',
	'max_prepared_transactions' => '2');
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('sql', max_attempts => 50, backoff_base => '0', backoff_max => '0');
    SELECT jobcap.create_queue('expr', max_attempts => 50, backoff_base => '0', backoff_max => '0');
    SELECT jobcap.create_queue('cap', max_attempts => 3, backoff_base => '0', backoff_max => '0');
    SELECT jobcap.create_queue('burst', max_attempts => 3, backoff_base => '0', backoff_max => '0');
    SELECT jobcap.create_queue('cas', max_attempts => 10, backoff_base => '0', backoff_max => '0');
});
my %job = map {
	$_ => $node->safe_psql('postgres', "SELECT jobcap.enqueue_job('$_', '{\"n\": 1}')")
} qw(sql expr cap burst cas);

sub job_state
{
	my ($queue) = @_;
	return $node->safe_psql('postgres',
		"SELECT state || ' ' || attempts FROM jobcap.jobs WHERE job_id = $job{$queue}");
}

sub history
{
	my ($queue) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) || ' ' || coalesce(string_agg(DISTINCT kind || '/' || worker, ','), '')
		   FROM jobcap.job_errors WHERE job_id = $job{$queue}");
}

# Ten BEGIN; claim; ROLLBACK.
my @said;
for my $i (1 .. 10)
{
	push @said, $node->safe_psql('postgres', q{
        BEGIN;
        SELECT attempt FROM jobcap.claim_job('sql', 'w-rollback');
        ROLLBACK;});
}
note("the ten rolled-back claims said attempt " . join(', ', @said));
ok(defined wait_until($node, "SELECT attempts = 10 FROM jobcap.jobs WHERE job_id = $job{sql}"),
	'ten BEGIN; claim; ROLLBACK count ten attempts');
is(job_state('sql'), 'pending 10', 'the job is pending with 10 attempts');
is(history('sql'), '10 claim_rolled_back/w-rollback', 'ten history rows of kind claim_rolled_back');

# Ten autocommit statements whose outer expression raises after the claim.
my $raised = 0;
for my $i (1 .. 10)
{
	my ($rc, $out, $err) = $node->psql('postgres',
		"SELECT (payload->>'n')::int / 0 FROM jobcap.claim_job('expr', 'w-expr')");
	$raised++ if $rc != 0 && $err =~ /division by zero/;
}
is($raised, 10, 'ten autocommit claims raised in their outer expression');
ok(defined wait_until($node, "SELECT attempts = 10 FROM jobcap.jobs WHERE job_id = $job{expr}"),
	'their ten attempts are counted');
is(history('expr'), '10 claim_rolled_back/w-expr', 'ten history rows of kind claim_rolled_back');

# The statistics show them as attempts that ended without a report.
is($node->safe_psql('postgres',
	"SELECT string_agg(queue || ' ' || lost_leases || ' ' || crashed_jobs || ' ' || failed_attempts, ', ' ORDER BY queue)
	   FROM jobcap.queue_stats WHERE queue IN ('sql', 'expr')"),
	'expr 10 1 0, sql 10 1 0', 'queue_stats: 10 lost attempts of 1 job per queue, no reported error');
is($node->safe_psql('postgres',
	"SELECT string_agg(queue || ' ' || failures || ' ' || crashes || ' ' || errors, ', ' ORDER BY queue)
	   FROM jobcap.top_failing_jobs()"),
	'expr 10 10 0, sql 10 10 0', 'top_failing_jobs lists both jobs with 10 crashes each');
my $metrics = $node->safe_psql('postgres', 'SELECT jobcap.metrics()');
like($metrics, qr/^jobcap_window_lost_leases\{queue="sql"\} 10$/m, 'metrics(): lost attempts of "sql"');
like($metrics, qr/^jobcap_window_crashed_jobs\{queue="expr"\} 1$/m, 'metrics(): one crashed job in "expr"');

# A job whose claims keep rolling back dies at exactly its cap, each claim seeing the count of
# the previous ones.
my @attempts;
for my $i (1 .. 3)
{
	push @attempts, $node->safe_psql('postgres', q{
        BEGIN;
        SELECT attempt || '/' || max_attempts FROM jobcap.claim_job('cap', 'w-cap');
        ROLLBACK;});
	wait_until($node, "SELECT attempts = $i FROM jobcap.jobs WHERE job_id = $job{cap}");
}
is(join(', ', @attempts), '1/3, 2/3, 3/3', 'each claim saw the attempts before it');
is(job_state('cap'), 'dead 3', 'dead at exactly its cap');
is($node->safe_psql('postgres',
	"SELECT attempts || '/' || max_attempts || ' ' || last_outcome || ' crashes ' || crashes || ' ' || last_worker
	   FROM jobcap.dead_jobs WHERE job_id = $job{cap}"),
	'3/3 claim_rolled_back crashes 3 w-cap', 'dead_jobs tells why');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job('cap', 'w-cap')"), '0',
	'nothing claims it any more');
is($node->safe_psql('postgres', "SELECT new_dead FROM jobcap.queue_stats WHERE queue = 'cap'"), '1',
	'queue_stats counts the death');

# Ten rollbacks in a burst, faster than the reaper counts: still dead at exactly 3, never above.
for my $i (1 .. 10)
{
	$node->psql('postgres', q{
        BEGIN;
        SELECT attempt FROM jobcap.claim_job('burst', 'w-burst');
        ROLLBACK;});
}
ok(defined wait_until($node, "SELECT state = 'dead' FROM jobcap.jobs WHERE job_id = $job{burst}"),
	'the burst job went dead');
sleep 1;    # ten reap intervals: any claim left in the ring is counted by now
is(job_state('burst'), 'dead 3', 'at exactly its cap');
is(history('burst'), '3 claim_rolled_back/w-burst', 'with three history rows');

# Compare-and-swap: a claim that committed after a rolled-back one is not counted again. The
# reaper's count waits behind a lock on job_errors (and retries) while another claim commits.
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN; LOCK TABLE jobcap.job_errors IN EXCLUSIVE MODE');
$node->safe_psql('postgres', q{
    BEGIN;
    SELECT fence FROM jobcap.claim_job('cas', 'w-rolled-back');
    ROLLBACK;});
ok(defined wait_until($node, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND datname = 'postgres'"),
	'the reaper is held up by the lock');
my $claimed = $node->safe_psql('postgres',
	"SELECT attempt || ' ' || fence FROM jobcap.claim_job('cas', 'w-committed')");
like($claimed, qr/^1 \d+$/, 'the committed claim is attempt 1');
$locker->query_safe('COMMIT');
$locker->quit;
sleep 2;    # the reaper's retries (lock_timeout, back-off) are over by now
is(job_state('cas'), 'running 1', 'the rolled-back claim is not counted on top of the committed one');
is(history('cas'), '0 ', 'no history row');
my ($fence) = $claimed =~ /^1 (\d+)$/;
is($node->safe_psql('postgres', "SELECT jobcap.complete_job($job{cas}, $fence)"), 'succeeded',
	'the committed claim completes');
is(job_state('cas'), 'succeeded 1', 'one attempt in all');

# A transaction that claimed cannot be prepared; its claim is counted as rolled back.
my $prepare_job = $node->safe_psql('postgres', "SELECT jobcap.enqueue_job('sql')");
my ($rc, $out, $err) = $node->psql('postgres', q{
    BEGIN;
    SELECT jobcap.claim_job_by_id(} . $prepare_job . q{, 'w-prepare');
    PREPARE TRANSACTION 'claimed';});
like($err, qr/cannot prepare a transaction that claimed jobcap jobs/, 'PREPARE TRANSACTION refused');
ok(defined wait_until($node, "SELECT state = 'pending' AND attempts = 1 FROM jobcap.jobs WHERE job_id = $prepare_job"),
	'the refused transaction\'s claim is counted');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'), '0', 'nothing prepared');

# The ring's limits. A database no reaper serves keeps its rolled-back claims uncounted in the
# ring; one transaction rolling back more claims than the ring holds (8192) loses the rest, and
# a reaper says so. Newer entries overwrite the oldest, so the served database is still counted.
$node->safe_psql('postgres', 'CREATE DATABASE unserved');
my ($install_rc, $install_out, $install_err) = $node->psql('unserved', 'CREATE EXTENSION jobcap');
like($install_err, qr/no jobcap background worker serves database "unserved"/,
	'CREATE EXTENSION warns that no worker serves the database');
unlike($install_err, qr/not preloaded/, '... but not that jobcap is not preloaded');
$node->safe_psql('unserved', q{
    SELECT jobcap.create_queue('big', max_attempts => 5);
    SELECT cardinality(jobcap.enqueue_jobs('big', array_fill('{}'::jsonb, ARRAY[9000])));
});
my $log_offset = -s $node->logfile;
is($node->safe_psql('unserved', q{
    BEGIN;
    SELECT count(*) FROM jobcap.claim_job('big', 'w-big', 9000);
    ROLLBACK;}), '9000', 'one transaction claimed 9000 jobs and rolled back');
ok($node->wait_for_log(qr/LOG:  jobcap lost 808 rolled-back claims without counting their attempts/, $log_offset),
	'a reaper logs the 808 claims the ring could not hold');
is($node->safe_psql('unserved', 'SELECT count(*) FROM jobcap.jobs WHERE attempts > 0'), '0',
	'no reaper serves the database: nothing counted there');
my $late = $node->safe_psql('postgres', "SELECT jobcap.enqueue_job('sql')");
$node->safe_psql('postgres', qq{
    BEGIN;
    SELECT jobcap.claim_job_by_id($late, 'w-late');
    ROLLBACK;});
ok(defined wait_until($node, "SELECT attempts = 1 FROM jobcap.jobs WHERE job_id = $late"),
	'with the ring full, a new rolled-back claim is still counted');

done_testing();
