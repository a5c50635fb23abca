# The incident, replayed: a client claims a poison job and is SIGKILLed mid-work, again and again.
# Nobody calls reap_jobs() and nobody calls fail_job(): the server alone requeues the job after
# each lease, moves it to dead at exactly max_attempts, then leaves it alone; the log holds one
# report line for it, naming one job.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# Reports every 30 s while the job burns its attempts, so they all fall in one window; the test
# then lowers the interval to get the line now.
my $node = jobcap_node('poison', 'jobcap.report_interval' => "'30s'");
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('media', max_attempts => 3, lease => '1 second',
                               backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('media', '{"file": "corrupt.mp4"}');
});
my $offset = -s $node->logfile;

for my $attempt (1 .. 3)
{
	# The client: claims (committed before any work), then "decodes" until it is killed.
	my $client = IPC::Run::start(
		[ $node->installed_command('psql'), '-X', '-d', $node->connstr('postgres'),
		  '-c', "SELECT job_id FROM jobcap.claim_job('media', 'decoder-$attempt')",
		  '-c', 'SELECT pg_sleep(60)' ],
		'>', \my $stdout, '2>', \my $stderr);
	ok(defined wait_until($node, "SELECT state = 'running' AND attempts = $attempt FROM jobcap.jobs"),
		"attempt $attempt claimed");
	$client->signal('KILL');
	$client->finish;
	my $next = $attempt < 3 ? "'pending'" : "'dead'";
	my $took = wait_until($node, "SELECT state = $next AND attempts = $attempt FROM jobcap.jobs");
	ok(defined $took && $took < 3,
		"attempt $attempt: SIGKILL, then the server alone made it $next (${\ ($took // 'never')} s)");
}

is($node->safe_psql('postgres', "SELECT 'dead ' || attempts || '/' || max_attempts FROM jobcap.dead_jobs"),
	'dead 3/3', 'dead at exactly max_attempts');
is($node->safe_psql('postgres', "SELECT string_agg(attempt || ' ' || kind || ' ' || worker, ', ' ORDER BY seq)
    FROM jobcap.job_errors"),
	'1 lease_expired decoder-1, 2 lease_expired decoder-2, 3 lease_expired decoder-3',
	'its history tells three silent deaths');

# Dead is quiet: the reaper no longer touches the row (same row version), nothing claims it.
my $version = $node->safe_psql('postgres', "SELECT xmin || ' ' || ctid FROM jobcap.jobs");
$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.report_interval = '1s'; SELECT pg_reload_conf()");
$node->wait_for_log(qr/jobcap queue "media"/, $offset);
sleep 3;    # three more report windows, thirty reap cycles
is($node->safe_psql('postgres', "SELECT xmin || ' ' || ctid FROM jobcap.jobs"), $version,
	'the reaper leaves the dead job alone');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job('media', 'decoder-4')"), '0',
	'nothing claims it');
is(count_log($node, qr/jobcap queue "media"/, $offset), 1, 'one report line for the poison job');
like(slurp_file($node->logfile, $offset),
	qr/LOG:  jobcap queue "media" in database "postgres": 1 job went dead \(1 dead in all\); 1 job lost 3 attempts to expired leases or rolled-back claims$/m,
	'the line counts one job, not its attempts');

$node->stop;
done_testing();
