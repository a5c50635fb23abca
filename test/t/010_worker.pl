# The background worker's life: it waits quietly for the extension, shows in pg_stat_activity,
# reaps without anyone calling reap_jobs(), follows SIGHUP, comes back after SIGTERM, and does not
# block behind a row lock or stall behind a table lock.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# Two databases listed: "postgres" exists, "other" does not yet.
my $node = jobcap_node('worker', 'jobcap.database' => "'postgres, other'");

# Before CREATE EXTENSION: the worker is connected, recognisable, and waits without log spam.
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND application_name = 'jobcap reaper'
      AND datname = 'postgres'"), 'the worker shows in pg_stat_activity as "jobcap reaper"');
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_activity
    WHERE backend_type = 'jobcap launcher' AND datname IS NULL AND application_name = 'jobcap launcher'"),
	'one launcher, connected to no database');
sleep 1;    # ten cycles at 100 ms
is(count_log($node, qr/waiting for extension "jobcap" in database "postgres"/), 1,
	'one log line while the extension is missing, not one per cycle');

# Installing says whether a worker serves the database.
my ($rc, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION jobcap');
is($rc, 0, 'create extension');
unlike($err, qr/no jobcap background worker/, 'no warning where the worker serves the database');
$node->safe_psql('postgres', 'CREATE DATABASE third');
($rc, $out, $err) = $node->psql('third', 'CREATE EXTENSION jobcap');
like($err, qr/WARNING:  no jobcap background worker serves database "third"/,
	'installing where no worker serves says so');
$node->wait_for_log(qr/jobcap reaper is serving database "postgres"/);

# A listed database that did not exist: the launcher finds it at its next look (every sixty
# reap intervals: 6 s here) and serves it like the first.
$node->safe_psql('postgres', 'CREATE DATABASE other');
ok(defined wait_until($node, "SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'",
	't', 15), 'one worker per listed database');
is(count_log($node, qr/FATAL/), 0, 'no FATAL for the database that was missing');
is(count_log($node, qr/LOG:  jobcap launcher cannot serve database "other" named in jobcap.database/), 1,
	'but one line saying it could not be served');
($rc, $out, $err) = $node->psql('other', 'CREATE EXTENSION jobcap');
is($err, '', 'installing where a worker serves is quiet');
$node->safe_psql('other', q{
    SELECT jobcap.create_queue('o', lease => '1 second');
    SELECT jobcap.enqueue_job('o');
    SELECT count(*) FROM jobcap.claim_job('o', 'w');
});
ok(defined wait_until($node, "SELECT true FROM pg_stat_activity WHERE datname = 'other'
    AND backend_type = 'jobcap reaper'") && defined wait_until_db($node, 'other',
	"SELECT state = 'pending' FROM jobcap.jobs"), 'the second database is reaped too');

# The server alone reaps an expired lease.
$node->safe_psql('postgres', q{
    SELECT jobcap.create_queue('q', lease => '1 second', backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('q') FROM generate_series(1, 4);
    SELECT count(*) FROM jobcap.claim_job('q', 'w', batch => 1);
});
my $took = wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 1");
ok(defined $took && $took < 3, "an expired lease is reaped by the worker alone (${\ ($took // 'never')} s)");
is($node->safe_psql('postgres',
	"SELECT kind || ' ' || worker FROM jobcap.job_errors WHERE job_id = 1"),
	'lease_expired w', 'and its history says the lease expired');

# SIGHUP: a database no longer listed loses its reaper.
$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.database = 'postgres'; SELECT pg_reload_conf()");
$node->wait_for_log(qr/jobcap reaper leaves database "other": jobcap.database no longer selects it/);
ok(defined wait_until($node, "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'
    AND datname = 'other'"), 'unlisted, its reaper is gone');

# SIGHUP: a longer interval holds reaping back, a shorter one brings it back, live.
my $expire = "UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %d";
$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.reap_interval = '1h'; SELECT pg_reload_conf()");
sleep 1;    # the reload wakes the worker for one cycle, then it sleeps for the hour
$node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job('q', 'w', lease => '1 hour');"
	  . sprintf($expire, 2));
ok(!defined wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 2", 't', 2),
	'with reap_interval = 1h an expired lease waits');
$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.reap_interval = '100ms'; SELECT pg_reload_conf()");
ok(defined wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 2", 't', 5),
	'after SIGHUP to 100ms it is reaped');
$node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job('q', 'w', lease => '1 hour');"
	  . sprintf($expire, 3));
$took = wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 3", 't', 5);
ok(defined $took && $took < 1.5, "and the next one within the new interval (${\ ($took // 'never')} s)");

# SIGTERM: the worker exits cleanly and the postmaster starts it again.
my $pid = reaper_pid($node);
my $offset = -s $node->logfile;
kill 'TERM', $pid;
$node->wait_for_log(qr/terminating background worker "jobcap reaper" due to administrator command/,
	$offset);
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND datname = 'postgres' AND pid <> $pid", 't', 15), 'SIGTERM: the worker returns');
$node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job('q', 'w', lease => '1 hour');"
	  . sprintf($expire, 4));
ok(defined wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 4", 't', 5),
	'and reaps again');
is(count_log($node, qr/server process .* was terminated|terminated by signal/, $offset), 0,
	'no crash');

# A session holding a job's row lock: the worker skips that job, reaps the others, and gets it
# on the first cycle after the lock goes.
$node->safe_psql('postgres', q{
    UPDATE jobcap.jobs SET state = 'succeeded', finished_at = now() WHERE queue = 'q';
    SELECT jobcap.enqueue_job('q') FROM generate_series(1, 3);
    SELECT count(*) FROM jobcap.claim_job('q', 'w', batch => 3, lease => '1 hour');
});
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; SELECT * FROM jobcap.jobs WHERE job_id = 5 FOR UPDATE');
$node->safe_psql('postgres', "UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'
    WHERE job_id IN (6, 7)");
ok(defined wait_until($node, "SELECT count(*) = 2 FROM jobcap.jobs WHERE job_id IN (6, 7) AND state = 'pending'",
	't', 5), 'the other jobs are reaped while one row is locked');
# Expire the locked one too: the holder's own update, so the lock stays held.
$holder->query_safe(sprintf($expire, 5));
sleep 1;
is($node->safe_psql('postgres', "SELECT state FROM jobcap.jobs WHERE job_id = 5"), 'running',
	'the locked job is skipped, not waited for');
isnt($node->safe_psql('postgres', "SELECT coalesce(wait_event_type, 'none') FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND datname = 'postgres'"), 'Lock', 'the worker is not waiting on a lock');
$holder->query_safe('COMMIT');
$took = wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 5", 't', 5);
ok(defined $took && $took < 1.5, "released, it is reaped on the next cycle (${\ ($took // 'never')} s)");

# A table lock: the worker's lock_timeout fires, the batch rolls back, it backs off with a smaller
# batch and resumes when the lock is gone.
$node->safe_psql('postgres', q{
    SELECT count(*) FROM jobcap.claim_job('q', 'w', batch => 3, lease => '1 hour');
    UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE state = 'running';
});
$offset = -s $node->logfile;
$holder->query_safe('BEGIN; LOCK TABLE jobcap.jobs IN ACCESS EXCLUSIVE MODE');
$node->wait_for_log(qr/jobcap reaper could not reap jobs in database "postgres", retrying in \d+ ms with batches of \d+\n.*DETAIL:  canceling statement due to lock timeout/,
	$offset);
like(slurp_file($node->logfile, $offset), qr/retrying in \d+ ms with batches of 500\n/,
	'a lock timeout shrinks the batch and backs off');
$holder->query_safe('COMMIT');
ok(defined wait_until($node, "SELECT count(*) = 0 FROM jobcap.jobs WHERE state = 'running'", 't', 10),
	'after the lock goes, reaping resumes');
$holder->quit;

# Two reapers at once, the worker and reap_jobs() by hand: every expired lease is reaped exactly
# once (one lease_expired history row each, attempts untouched, no error).
$node->safe_psql('postgres', q{
    SELECT jobcap.create_queue('many', lease => '1 hour', backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('many') FROM generate_series(1, 3000);
    SELECT count(*) FROM jobcap.claim_job('many', 'w', batch => 3000);
});
my $manual = $node->background_psql('postgres');
$manual->query_safe("CREATE TEMP TABLE by_hand (job_id bigint)");
# The leases expire in the transaction of the first reap by hand, so that the worker, which skips
# the rows that transaction holds, cannot have reaped them all before the hand starts.
$manual->query_safe("BEGIN;
    UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE queue = 'many';
    INSERT INTO by_hand SELECT job_id FROM jobcap.reap_jobs(25);
    COMMIT");
for (2 .. 40)
{
	$manual->query_safe("INSERT INTO by_hand SELECT job_id FROM jobcap.reap_jobs(25)");
}
ok(defined wait_until($node, "SELECT count(*) = 0 FROM jobcap.jobs WHERE queue = 'many' AND state = 'running'",
	't', 10), 'all reaped');
my $by_hand = $manual->query_safe("SELECT count(*) FROM by_hand");
$manual->quit;
is($node->safe_psql('postgres', q{
    SELECT count(*) FILTER (WHERE n <> 1) || ' ' || count(*) FROM (
      SELECT j.job_id, count(e.seq) AS n FROM jobcap.jobs j
        LEFT JOIN jobcap.job_errors e ON e.job_id = j.job_id AND e.kind = 'lease_expired'
       WHERE j.queue = 'many' AND j.state = 'pending' AND j.attempts = 1
       GROUP BY j.job_id) s}), '0 3000',
	"each of 3000 jobs reaped exactly once, $by_hand of them by hand");
ok($by_hand > 0 && $by_hand < 3000, 'both reapers took part');

# DROP EXTENSION under a running worker: it goes back to waiting (one line), and serves the new
# extension once it is created again (its kept plans are re-planned against the new tables).
$offset = -s $node->logfile;
$node->safe_psql('postgres', 'DROP EXTENSION jobcap');
$node->wait_for_log(qr/jobcap reaper is waiting for extension "jobcap" in database "postgres"/, $offset);
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('again', lease => '1 second');
    SELECT jobcap.enqueue_job('again');
    SELECT count(*) FROM jobcap.claim_job('again', 'w');
});
ok(defined wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs"), 'recreated, it is reaped again');
unlike(slurp_file($node->logfile, $offset), qr/could not reap|ERROR/, 'without an error');

$node->stop;
done_testing();
