# A backup keeps the queue: pg_dump dumps the rows of jobcap's tables and the positions of its
# sequences with the extension. Jobs in every state, grants, history, periodic jobs and
# statistics, dumped and restored into a new database (plain and --data-only), come back row for
# row; the next fence is above every fence handed out before, a granted worker claims, and the
# restored database's reaper works.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# No reaper serves the source: nothing changes there between the dump and the comparison.
my $node = jobcap_node('backup', 'jobcap.database' => "''");
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', q{
    CREATE EXTENSION jobcap;
    CREATE ROLE backup_worker LOGIN;
    GRANT jobcap_worker TO backup_worker;
});

# Two queues, one granted to the worker; jobs in every state, with history of every kind.
$node->safe_psql('src', q{
    SELECT jobcap.create_queue('mail', max_attempts => 2, backoff_base => '0', backoff_max => '0');
    SELECT jobcap.create_queue('idle', max_attempts => 5, lease => '10 minutes', notify => true);
    SELECT jobcap.grant_queue('mail', 'backup_worker');

    SELECT jobcap.enqueue_job('mail', jsonb_build_object('n', n), priority => n)
      FROM generate_series(1, 6) n;
    SELECT jobcap.enqueue_job('mail', '{"n": "later"}', run_at => now() + interval '1 day');
    SELECT jobcap.enqueue_job('mail', '{"n": "keyed"}', dedupe_key => 'k1', max_attempts => 1);
    SELECT jobcap.enqueue_job('idle', '{"n": "idle"}');
    SELECT jobcap.schedule_job('nightly', '0 3 * * *', 'mail', '{"report": true}', priority => 2);
    SELECT jobcap.schedule_job('hourly', '@hourly', 'idle');
});
# 1 succeeds, 2 fails for good (dead after 2 attempts), 3 fails once (pending, retrying),
# 4 stays running, 5 is cancelled, 6 is dead, requeued and dead again (history: requeued),
# "keyed" loses its lease (history: lease_expired) and dies.
$node->safe_psql('src', q{
    DO $$
    DECLARE j record;
    BEGIN
      FOR j IN SELECT * FROM jobcap.claim_job('mail', 'w', 10, lease => '1 hour') LOOP
        CASE j.payload->>'n'
          WHEN '1' THEN PERFORM jobcap.complete_job(j.job_id, j.fence);
          WHEN '2' THEN PERFORM jobcap.fail_job(j.job_id, j.fence, 'boom');
          WHEN '3' THEN PERFORM jobcap.fail_job(j.job_id, j.fence, 'flaky', retry_in => '1 day');
          WHEN '6' THEN PERFORM jobcap.fail_job(j.job_id, j.fence, 'bad input');
          WHEN 'keyed' THEN NULL;
          ELSE NULL;
        END CASE;
      END LOOP;
    END $$;
});
$node->safe_psql('src', q{
    DO $$
    DECLARE j record;
    BEGIN
      FOR j IN SELECT * FROM jobcap.claim_job('mail', 'w', 10, lease => '1 hour') LOOP
        PERFORM jobcap.fail_job(j.job_id, j.fence, 'boom again');
      END LOOP;
    END $$;
    SELECT jobcap.cancel_job(job_id) FROM jobcap.jobs WHERE payload->>'n' = '5';
    SELECT jobcap.requeue_job(job_id, 'fixed the input', extra_attempts => 1)
      FROM jobcap.jobs WHERE payload->>'n' = '6';
    UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'
     WHERE payload->>'n' = 'keyed';
    SELECT count(*) FROM jobcap.reap_jobs();
});
$node->safe_psql('src', q{
    DO $$
    DECLARE j record;
    BEGIN
      FOR j IN SELECT * FROM jobcap.claim_job('mail', 'w', 10, lease => '1 hour') LOOP
        IF j.payload->>'n' = '6' THEN
          PERFORM jobcap.fail_job(j.job_id, j.fence, 'still bad');
        END IF;
      END LOOP;
    END $$;
    SELECT jobcap.refresh_stats();
});

is($node->safe_psql('src', q{SELECT string_agg(DISTINCT state::text, ',') FROM jobcap.jobs}),
	'cancelled,dead,pending,running,succeeded', 'the source has jobs in every state');
is($node->safe_psql('src', q{SELECT string_agg(DISTINCT kind, ',') FROM jobcap.job_errors}),
	'cancelled,error,lease_expired,requeued', 'history of every kind');
is($node->safe_psql('src', 'SELECT count(*) FROM jobcap.job_schedules'), '2', 'two periodic jobs');
is($node->safe_psql('src', q{SELECT (SELECT count(*) FROM jobcap.stats_minutes) > 0
    AND (SELECT count(*) FROM jobcap.stats_latency) > 0}), 't', 'and statistics');

my @tables = qw(queues jobs job_errors queue_grants job_schedules stats_minutes stats_latency stats_progress);
my @sequences = qw(fences jobs_job_id_seq job_errors_seq_seq);
sub contents
{
	my ($db) = @_;
	my %rows;
	for my $t (@tables)
	{
		$rows{$t} = $node->safe_psql($db,
			"SELECT count(*) || ' rows ' || md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), ''))
			   FROM jobcap.$t t");
	}
	for my $s (@sequences)
	{
		$rows{$s} = $node->safe_psql($db, "SELECT last_value || ' ' || is_called FROM jobcap.$s");
	}
	return \%rows;
}
my $before = contents('src');
note("source $_: $before->{$_}") for (@tables, @sequences);
my $last_fence = $node->safe_psql('src',
	'SELECT greatest((SELECT max(fence) FROM jobcap.jobs), (SELECT max(fence) FROM jobcap.job_errors))');
my $max_job = $node->safe_psql('src', 'SELECT max(job_id) FROM jobcap.jobs');

# A plain dump restored with psql, and a --data-only dump into a database that has the extension.
my $dir = PostgreSQL::Test::Utils::tempdir;
$node->command_ok([ 'pg_dump', '-d', $node->connstr('src'), '-f', "$dir/full.sql" ], 'pg_dump');
$node->command_ok([ 'pg_dump', '--data-only', '-d', $node->connstr('src'), '-f', "$dir/data.sql" ],
	'pg_dump --data-only');
$node->safe_psql('postgres', 'CREATE DATABASE restored; CREATE DATABASE data_only');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored'),
		'-f', "$dir/full.sql" ], 'the dump restores without an error');
$node->safe_psql('data_only', 'CREATE EXTENSION jobcap');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('data_only'),
		'-f', "$dir/data.sql" ], 'the data-only dump restores without an error');

for my $db ('restored', 'data_only')
{
	my $after = contents($db);
	is($after->{$_}, $before->{$_}, "$db: $_ equal") for (@tables, @sequences);
}
is($node->safe_psql('src', 'SELECT count(*) FROM jobcap.jobs'), '9', 'all nine jobs were compared');

# The worker, granted in the source, may work the restored queue; the next job id and fence
# follow those handed out before the dump.
my $as_worker = $node->connstr('restored') . ' user=backup_worker';
is($node->safe_psql('restored', "SELECT jobcap.enqueue_job('mail', '{\"n\": \"after\"}') > $max_job",
		connstr => $as_worker),
	't', 'a granted worker enqueues in the restored database, a job id above the restored ones');
my $fence = $node->safe_psql('restored',
	"SELECT fence FROM jobcap.claim_job('mail', 'w2', lease => '1 second')", connstr => $as_worker);
note("last fence before the dump: $last_fence; first fence after the restore: $fence");
ok($fence > $last_fence, 'and claims it, with a fence above every fence handed out before the dump');
my ($rc, $out, $err) = $node->psql('restored', "SELECT jobcap.enqueue_job('idle')",
	connstr => $as_worker);
like($err, qr/permission denied for queue "idle"/, 'an ungranted queue stays refused');

# The restored database's reaper: the lease of the claim above expires and is reaped.
$node->safe_psql('postgres', q{
    ALTER SYSTEM SET jobcap.database = 'restored';
    SELECT pg_reload_conf();
});
ok( defined wait_until_db($node, 'restored', q{
    SELECT count(*) = 1 FROM jobcap.job_errors e JOIN jobcap.jobs j USING (job_id)
     WHERE e.kind = 'lease_expired' AND e.worker = 'w2' AND j.state = 'pending'}),
	'the reaper serves the restored database: the expired lease went back to pending');

# --table: the data of just the tables named (and no sequence unless named too).
$node->command_ok([ 'pg_dump', '--table', 'jobcap.queues', '-d', $node->connstr('src'),
		'-f', "$dir/table.sql" ], 'pg_dump --table jobcap.queues');
my $dump = slurp_file("$dir/table.sql");
ok($dump =~ /^COPY jobcap\.queues /m && $dump !~ /CREATE EXTENSION|COPY jobcap\.jobs |setval/,
	'--table dumps that table\'s rows only');

done_testing();
