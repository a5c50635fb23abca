# Crashes. A backend is SIGKILLed (restart_after_crash on): the cluster restarts, committed claims
# and completions survive, in-flight ones roll back, and the worker comes back and reaps the
# orphaned leases within one lease plus one interval. Then the worker itself is SIGKILLed in the
# middle of a batch: the batch rolls back whole and is done again, exactly once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use JobcapTest;

my $node = jobcap_node('crash', restart_after_crash => 'on', 'jobcap.reap_interval' => "'200ms'");
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('c', lease => '2 seconds', backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('c', jsonb_build_object('n', n)) FROM generate_series(1, 5) n;
    -- 1: claimed, committed; its client will die in the crash
    SELECT count(*) FROM jobcap.claim_job_by_id(1, 'orphan');
    -- 2: claimed and completed, committed
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job_by_id(2, 'done');
});
# 3: claimed, committed; its completion will be in flight
my $fence3 = $node->safe_psql('postgres', "SELECT fence FROM jobcap.claim_job_by_id(3, 'settling')");
my $settling = $node->background_psql('postgres');
my $victim = $settling->query_safe('SELECT pg_backend_pid()');
$settling->query_safe("BEGIN; SELECT jobcap.complete_job(3, $fence3)");
my $claiming = $node->background_psql('postgres');
$claiming->query_safe("BEGIN; SELECT count(*) FROM jobcap.claim_job_by_id(4, 'in-flight')");
my $old_reaper = reaper_pid($node);

my $offset = -s $node->logfile;
kill 'KILL', $victim;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
ok(defined wait_until($node, 'SELECT true'), 'the cluster restarts');
my $restarted = time;
eval { $settling->quit };
eval { $claiming->quit };

is($node->safe_psql('postgres', "SELECT string_agg(job_id || ':' || state || '/' || attempts, ' ' ORDER BY job_id)
    FROM jobcap.jobs WHERE job_id IN (2, 4, 5)"),
	'2:succeeded/1 4:pending/0 5:pending/0',
	'the committed completion survives; the in-flight claim rolled back');
is($node->safe_psql('postgres', "SELECT fence FROM jobcap.jobs WHERE job_id = 4"), '0',
	'the rolled-back claim used no fence');
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND pid <> $old_reaper", 't', 10), 'the worker is back');
my $took = wait_until($node, "SELECT count(*) = 2 FROM jobcap.jobs WHERE job_id IN (1, 3) AND state = 'pending'",
	't', 10);
$took = defined $took ? time - $restarted : undef;
ok(defined $took && $took < 2 + 0.2 + 1,
	"the orphaned leases (the claim and the rolled-back completion) are reaped within a lease "
	  . "plus an interval of the restart (${\ ($took // 'never')} s)");
is($node->safe_psql('postgres', "SELECT string_agg(job_id || ':' || attempt || ' ' || kind, ' ' ORDER BY job_id)
    FROM jobcap.job_errors"), '1:1 lease_expired 3:1 lease_expired',
	'each orphan lost exactly one attempt');

# The worker SIGKILLed mid-batch. With error_history = 1 the reaper's batch deletes job 1's older
# history row after updating the jobs; a session holding that row makes the batch wait there
# (until lock_timeout), with the jobs already updated in the batch's transaction.
$node->safe_psql('postgres', 'ALTER SYSTEM SET jobcap.error_history = 1; SELECT pg_reload_conf()');
my $fences = $node->safe_psql('postgres', q{
    SELECT (SELECT fence FROM jobcap.claim_job_by_id(1, 'second', lease => '1 hour')) || '/' ||
           (SELECT fence FROM jobcap.claim_job_by_id(5, 'other', lease => '1 hour'))});
my ($fence1, $fence5) = split m{/}, $fences;
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; SELECT seq FROM jobcap.job_errors WHERE job_id = 1 FOR UPDATE');
$node->safe_psql('postgres', "UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'
    WHERE job_id IN (1, 5)");
ok(defined wait_until($node, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper'", 't', 10), 'the worker waits in the middle of its batch');
$old_reaper = reaper_pid($node);
$offset = -s $node->logfile;
kill 'KILL', $old_reaper;
$node->wait_for_log(qr/background worker "jobcap reaper" \(PID $old_reaper\) was terminated by signal 9/,
	$offset);
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
eval { $holder->quit };
ok(defined wait_until($node, "SELECT count(*) = 2 FROM jobcap.jobs WHERE job_id IN (1, 5) AND state = 'pending'",
	't', 15), 'after the crash the new worker reaps the batch');
is($node->safe_psql('postgres', "SELECT string_agg(job_id || ':' || attempts || '/' || fence, ' ' ORDER BY job_id)
    FROM jobcap.jobs WHERE job_id IN (1, 5)"), "1:2/$fence1 5:1/$fence5",
	'attempts counted once, fences those of the last claims');
is($node->safe_psql('postgres', "SELECT string_agg(job_id || ':' || attempt || ' ' || kind, ' ' ORDER BY job_id, seq)
    FROM jobcap.job_errors WHERE job_id IN (1, 5)"), '1:2 lease_expired 5:1 lease_expired',
	'one history row per lost lease: the killed batch left nothing behind');

$node->stop;
done_testing();
