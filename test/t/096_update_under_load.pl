# ALTER EXTENSION jobcap UPDATE from each released version (0.1.0, 0.2.0) while workers enqueue,
# claim, fail and complete (pgbench, 4 clients) and the background worker reaps: no deadlock, no
# worker call killed, the update done. The 0.1.0 -> 0.2.0 script's DDL locks job_errors and
# queues before jobs, and a worker's fail_job locks jobs before them; the update takes every
# jobcap table's lock, jobs first, before its script runs (src/background/ddl.cpp), so the two
# wait for each other in turn instead of in a cycle. Five trials, each in a database of its own.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $node = jobcap_node('update_load', 'jobcap.database' => "'*'", deadlock_timeout => "'100ms'");
my $dir = PostgreSQL::Test::Utils::tempdir;
open(my $fh, '>', "$dir/work.sql") or die;
# As a worker calls them: each claim and each settle a statement of its own. (A statement that
# claims and settles at once can fail while the update commits: the 0.1.0 -> 0.2.0 script replaces
# complete_job, and a call that started before the commit finds its old definition gone.)
print $fh <<'SQL';
SELECT jobcap.enqueue_job('q', '{}');
SELECT jobcap.enqueue_job('q', '{}');
SELECT job_id AS failing, fence AS failing_fence FROM jobcap.claim_job('q', 'w') \gset
SELECT jobcap.fail_job(:failing, :failing_fence, 'boom', retry_in => '0');
SELECT job_id AS done, fence AS done_fence FROM jobcap.claim_job('q', 'w') \gset
SELECT jobcap.complete_job(:done, :done_fence);
SQL
close $fh;

my @from = ('0.1.0', '0.1.0', '0.1.0', '0.2.0', '0.2.0');
for my $trial (1 .. @from)
{
	my $db = "trial$trial";
	my $from = $from[ $trial - 1 ];
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
        CREATE EXTENSION jobcap VERSION '$from';
        SELECT jobcap.create_queue('q', max_attempts => 1000, backoff_base => '0',
                                   backoff_max => '0');
        SELECT jobcap.enqueue_job('q', '{}') FROM generate_series(1, 200);
    });
	my $log_offset = -s $node->logfile;
	my ($out, $err) = ('', '');
	my $bench = IPC::Run::start(
		[ $node->installed_command('pgbench'), '-n', '-c', '4', '-j', '2', '-T', '6',
		  '-f', "$dir/work.sql", '-h', $node->host, '-p', $node->port, $db ],
		'>', \$out, '2>', \$err);
	ok(defined wait_until_db($node, $db,
			"SELECT count(*) > 100 FROM jobcap.job_errors", 't', 30),
		"trial $trial: the workers are failing and retrying jobs");

	my ($rc, $stdout, $stderr) = $node->psql($db, 'ALTER EXTENSION jobcap UPDATE');
	is($rc, 0, "trial $trial: the update succeeded under load") or diag($stderr);
	$bench->finish;
	is($err =~ /aborted|ERROR/ ? $err : '', '', "trial $trial: no worker call failed");
	like($out, qr/number of transactions actually processed: [1-9]/,
		"trial $trial: the workers went on after the update");
	is(count_log($node, qr/deadlock detected/, $log_offset), 0,
		"trial $trial: no deadlock in the server log");
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'jobcap'"),
		$node->safe_psql($db, "SELECT default_version FROM pg_available_extensions WHERE name = 'jobcap'"),
		"trial $trial: updated from $from to the default version");
}

done_testing();
