# pg_ctl stop -m immediate in the middle of a busy workload (pgbench claiming, completing, failing
# and abandoning jobs; a client enqueueing), then start: crash recovery loses no job, and after
# one lease plus one interval no job is left running without a live lease.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $node = jobcap_node('immediate', 'jobcap.reap_interval' => "'200ms'");
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('w', max_attempts => 3, lease => '1 second',
                               backoff_base => '0', backoff_max => '0');
    SELECT count(jobcap.enqueue_job('w', jsonb_build_object('n', n))) FROM generate_series(1, 3000) n;
});

# Workers claim one job at a time and then complete it, report a failure, or die silently
# (the claim commits, nothing follows: the lease must expire).
my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file("$dir/work.sql", q{
SELECT CASE WHEN r < 0.6 THEN jobcap.complete_job(c.job_id, c.fence)::text
            WHEN r < 0.8 THEN jobcap.fail_job(c.job_id, c.fence, 'boom')::text
            ELSE 'abandoned' END
  FROM jobcap.claim_job('w', 'bench-' || :client_id, 1) c, random() r;
});
PostgreSQL::Test::Utils::append_to_file("$dir/settle_later.sql", q{
BEGIN;
SELECT job_id AS id, fence AS f FROM jobcap.claim_job('w', 'slow-' || :client_id, 1) \gset
SELECT pg_sleep(0.02);
SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE job_id = :id AND fence = :f;
COMMIT;
});
my ($out, $err) = ('', '');
my $bench = IPC::Run::start(
	[ $node->installed_command('pgbench'), '-n', '-c', '4', '-j', '2', '-T', '60',
	  '-f', "$dir/work.sql\@4", '-f', "$dir/settle_later.sql\@1",
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);

my $client = $node->background_psql('postgres');
my @acknowledged;
push @acknowledged, $client->query_safe("SELECT jobcap.enqueue_job('w', '{\"late\": true}')") for 1 .. 300;
ok(defined wait_until($node, "SELECT count(*) > 1000 FROM jobcap.jobs WHERE attempts > 0"),
	'the workload is busy: a thousand jobs claimed at least once');
my $before = $node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE state = 'running'");
note "running just before the stop: $before";

$node->stop('immediate');
eval { $client->quit };
$bench->finish;
$node->start;
like(slurp_file($node->logfile), qr/database system was not properly shut down; automatic recovery in progress/,
	'crash recovery ran');

is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE job_id <= 3000"), '3000',
	'every job enqueued before the workload is there');
my $ids = join(',', @acknowledged);
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE job_id IN ($ids)"),
	scalar(@acknowledged), 'every acknowledged enqueue is there');

my $took = wait_until($node, "SELECT count(*) = 0 FROM jobcap.jobs WHERE state = 'running'", 't', 10);
ok(defined $took && $took < 1 + 0.2 + 1,
	"no job left running without a live lease after one lease plus one interval (${\ ($took // 'never')} s)");
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM jobcap.jobs j
     WHERE j.attempts > 3 OR (j.attempts = 0) <> (j.fence = 0)
        OR (j.state = 'dead') <> (j.attempts = 3 AND j.state <> 'succeeded' AND j.state <> 'pending')
        OR (j.state = 'pending' AND j.attempts >= 3)}), '0',
	'every job within its cap, fenced exactly when claimed, dead exactly at the cap');
is($node->safe_psql('postgres', "SELECT count(DISTINCT fence) = count(*) FROM jobcap.jobs WHERE fence > 0"),
	't', 'no fence issued twice across the crash');
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM jobcap.job_errors e
     WHERE NOT EXISTS (SELECT FROM jobcap.jobs j WHERE j.job_id = e.job_id AND e.attempt <= j.attempts)}),
	'0', 'history matches the jobs');
note $node->safe_psql('postgres', "SELECT string_agg(state || ' ' || n, ', ') FROM
    (SELECT state, count(*) AS n FROM jobcap.jobs GROUP BY state ORDER BY state) s");

$node->stop;
done_testing();
