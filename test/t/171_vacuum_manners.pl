# The worker's vacuum of jobcap.jobs (jobcap.vacuum) gets out of the way as autovacuum does:
# a DDL statement it blocks cancels it after deadlock_timeout; a table another session has
# locked is left for a later cycle, without a WARNING per cycle and without taking the skip for
# a vacuum that freed nothing; it never truncates the table (a lock replayed on standbys, where
# it cancels readers); and a vacuum longer than 10 s is cancelled, so the worker's other steps
# wait no longer than that. vacuum_cost_delay makes vacuums of a small table slow enough to
# watch.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use JobcapTest;

my $node = jobcap_node('manners', allows_streaming => 1,
	autovacuum_naptime => "'1d'",
	deadlock_timeout => "'1s'",
	log_min_messages => 'debug1');
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('r', lease => '1 hour');
});

sub vacuum_count
{
	return $node->safe_psql('postgres',
		"SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass");
}

# $n dead rows at the end of the table, in a session that ends (its counts reach the statistics).
sub churn
{
	my ($n) = @_;
	$node->safe_psql('postgres', "INSERT INTO jobcap.jobs (queue, state, attempts, fence, finished_at)
        SELECT 'r', 'succeeded', 1, 1, now() FROM generate_series(1, $n)");
	$node->safe_psql('postgres', "DELETE FROM jobcap.jobs WHERE state = 'succeeded'");
}

# 1. A table locked by another session: left alone, quietly, and vacuumed once it is free.
my $offset = -s $node->logfile;
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; LOCK TABLE jobcap.jobs IN SHARE UPDATE EXCLUSIVE MODE');
churn(3000);
usleep(1_500_000);
churn(3000);
usleep(1_500_000);
is(vacuum_count(), '0', 'locked: no vacuum');
is(count_log($node, qr/skipping vacuum of "jobs"/, $offset), 0, 'and no WARNING about it');
ok(count_log($node, qr/jobcap reaper leaves jobcap\.jobs in database "postgres" for a later cycle/, $offset) > 0,
	'the worker says why at DEBUG1');
is(count_log($node, qr/Most dead rows are still visible/, $offset), 0, 'a skip is not taken for a vacuum that freed little');
$holder->query_safe('COMMIT');
$holder->quit;
ok(defined wait_until($node, "SELECT vacuum_count = 1 AND n_dead_tup < 100 FROM pg_stat_user_tables
    WHERE relid = 'jobcap.jobs'::regclass"), 'the lock gone, the next cycle vacuums it');

# 2. No truncation: the table keeps its emptied pages (a standby's readers keep theirs).
my $standby = PostgreSQL::Test::Cluster->new('manners_standby');
$node->backup('b');
$standby->init_from_backup($node, 'b', has_streaming => 1);
$standby->append_conf('postgresql.conf', "max_standby_streaming_delay = '1s'\n");
$standby->start;
my $reader = $standby->background_psql('postgres', on_error_stop => 0);
# A reader in a transaction on the standby holds its lock on jobcap.jobs (a truncation's lock,
# replayed, would cancel it after max_standby_streaming_delay).
$reader->query_safe('BEGIN; SELECT count(*) FROM jobcap.jobs');
churn(5000);
ok(defined wait_until($node, "SELECT vacuum_count = 2 FROM pg_stat_user_tables
    WHERE relid = 'jobcap.jobs'::regclass"), 'a drained burst: vacuumed');
is($node->safe_psql('postgres', "SELECT count(*) || ' rows, '
    || (pg_relation_size('jobcap.jobs') > 0) FROM jobcap.jobs"), '0 rows, true',
	'not truncated: the empty table keeps its pages');
$node->wait_for_catchup($standby);
is($standby->safe_psql('postgres',
	"SELECT confl_lock FROM pg_stat_database_conflicts WHERE datname = 'postgres'"),
	'0', 'no reader on the standby cancelled for a lock');
is($reader->query_safe('SELECT count(*) FROM jobcap.jobs'), '0', 'the standby reader carries on');
$reader->query_safe('COMMIT');
$reader->quit;
$standby->stop;

# Slow vacuums from here on.
$node->safe_psql('postgres', "ALTER SYSTEM SET vacuum_cost_delay = '20ms';
    ALTER SYSTEM SET vacuum_cost_limit = 1; SELECT pg_reload_conf()");
my $pid = reaper_pid($node);

# 3. A DDL statement blocked by the worker's vacuum cancels it after deadlock_timeout, and the
# statements queued behind the DDL do not wait for the vacuum either.
churn(5000);
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_progress_vacuum WHERE pid = $pid"),
	'the worker is vacuuming');
$offset = -s $node->logfile;
my $ddl = $node->background_psql('postgres', on_error_stop => 0);
my $t0 = time;
$ddl->query_until(qr/started/, "\\echo started\nSET lock_timeout = '4s';\n"
	  . "ALTER TABLE jobcap.jobs ADD COLUMN IF NOT EXISTS manners int;\n\\echo ddl-done\n");
usleep(200_000);
my $r0 = time;
$node->safe_psql('postgres', "SELECT jobcap.enqueue_job('r')");
my $enqueue_s = time - $r0;
$ddl->query_until(qr/ddl-done/, "");
my $stderr = $ddl->{stderr} // '';
$ddl->quit;
unlike($stderr, qr/lock timeout/, 'ALTER TABLE gets its lock while the worker vacuums');
cmp_ok($enqueue_s, '<', 2.5, 'an enqueue queued behind it waits for deadlock_timeout, not the vacuum');
ok(count_log($node, qr/sending cancel to blocking autovacuum PID $pid/, $offset) >= 1,
	'the waiter cancelled the worker\'s vacuum as it would autovacuum\'s');
ok(count_log($node, qr/jobcap reaper could not vacuum jobcap\.jobs in database "postgres", trying again in/, $offset) >= 1,
	'the worker logs the cancelled vacuum and backs off');
$node->safe_psql('postgres', "ALTER TABLE jobcap.jobs DROP COLUMN manners");

# 4. A vacuum runs for 10 s at most: the worker's other steps (here, reaping an expired lease)
# wait no longer than that.
ok(defined wait_until($node, "SELECT count(*) = 0 FROM pg_stat_progress_vacuum WHERE pid = $pid", 't', 60),
	'no vacuum in progress');
$node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job('r', 'w')");
$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.vacuum = off; SELECT pg_reload_conf()");
usleep(300_000);
churn(20000);
$node->safe_psql('postgres', "ALTER SYSTEM RESET jobcap.vacuum; SELECT pg_reload_conf()");
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_progress_vacuum WHERE pid = $pid"),
	'the worker is vacuuming a bigger table');
$offset = -s $node->logfile;
$t0 = time;
$node->safe_psql('postgres', "UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'
    WHERE state = 'running'");
my $took = wait_until($node, "SELECT count(*) = 0 FROM jobcap.jobs WHERE state = 'running'", 't', 60);
ok(defined $took && $took < 13, 'the expired lease is reaped within the vacuum\'s 10 s and a cycle'
	. (defined $took ? sprintf(' (%.1f s)', $took) : ''));
ok(count_log($node, qr/canceling statement due to statement timeout/, $offset) >= 1,
	'the vacuum was cancelled at 10 s');
ok(count_log($node, qr/could not vacuum jobcap\.jobs in database "postgres", trying again in 90000 ms/, $offset) >= 1,
	'and it spaces the next one as a finished vacuum would: 9 x its 10 s');

is($node->safe_psql('postgres', "SELECT string_agg(state || ' ' || n, ', ' ORDER BY state)
    FROM (SELECT state, count(*) AS n FROM jobcap.jobs GROUP BY state) s"), 'pending 1',
	'the jobs are where they should be');

$node->stop;
done_testing();
