# Periodic jobs and the background worker: the worker enqueues a schedule's due slot once, only
# the latest of the slots it missed, skips a slot while the schedule's last job is still
# pending, and after a server restart neither enqueues a handled slot again nor makes up the
# slots missed while it was down (only the latest).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $node = jobcap_node('schedules');
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('s');
    SELECT jobcap.schedule_job('tick', '* * * * *', 's', '{"task": "tick"}');
    -- ten minutes of slots missed
    UPDATE jobcap.job_schedules SET last_slot = date_trunc('minute', now()) - interval '10 minutes';
});
ok(defined wait_until($node, "SELECT count(*) = 1 FROM jobcap.jobs"), 'the worker enqueued a missed slot');
sleep 1;
# (A minute may pass meanwhile: its slot is skipped, the job being still pending.)
is($node->safe_psql('postgres', q{
    SELECT count(*) || ' ' || bool_and(j.run_at <= s.last_slot)
           || ' ' || bool_and(j.run_at >= date_trunc('minute', now()) - interval '1 minute')
      FROM jobcap.jobs j, jobcap.job_schedules s}),
	'1 true true', 'only the latest missed slot, once');

# The job is still pending: the next slot is skipped, not piled up.
$node->safe_psql('postgres',
	"UPDATE jobcap.job_schedules SET last_slot = last_slot - interval '1 minute'");
ok(defined wait_until($node, "SELECT skipped >= 1 FROM jobcap.schedules"), 'a slot was skipped');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs"), '1', 'no second copy');

# Finish the job and restart: the slot handled before the restart is not enqueued again.
$node->safe_psql('postgres', q{
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('s', 'w');
});
my $last = $node->safe_psql('postgres', "SELECT last_slot FROM jobcap.job_schedules");
my $before = $node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE run_at <= '$last'");
$node->restart;
ok(defined wait_until($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'"),
	'the worker is back');
sleep 2;
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE run_at <= '$last'"), $before,
	'no slot handled before the restart was enqueued again');
is($node->safe_psql('postgres', "SELECT count(*) = count(DISTINCT run_at) FROM jobcap.jobs"), 't',
	'no slot twice');

# Slots missed while no worker served the database, across a restart: only the latest.
$node->safe_psql('postgres', q{
    ALTER SYSTEM SET jobcap.database = 'template1';
    SELECT pg_reload_conf();
});
ok(defined wait_until($node, "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'postgres'"),
	'no worker serves the database');
$node->safe_psql('postgres', q{
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('s', 'w', 10);
    DELETE FROM jobcap.jobs;
    UPDATE jobcap.job_schedules SET last_slot = date_trunc('minute', now()) - interval '30 minutes';
});
$node->restart;
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs"), '0', 'nothing enqueued while not served');
$node->safe_psql('postgres', q{
    ALTER SYSTEM RESET jobcap.database;
    SELECT pg_reload_conf();
});
ok(defined wait_until($node, "SELECT count(*) = 1 FROM jobcap.jobs"), 'served again: a slot enqueued');
sleep 1;
is($node->safe_psql('postgres', q{
    SELECT count(*) || ' ' || bool_and(j.run_at >= date_trunc('minute', now()) - interval '1 minute')
      FROM jobcap.jobs j}),
	'1 true', 'of thirty missed slots, only the latest');

$node->stop;
done_testing();
