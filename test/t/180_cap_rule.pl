# The cap rule on a server, against the table of cases that test/unit/cap_test.cpp checks the
# C++ rule against (test/unit/cap_cases.txt): for each case, a job with the case's own
# max_attempts and cap_epoch, in a queue with the case's max_attempts and cap_epoch, with the
# case's attempts counted, is
#  - claimed or not, and shown with the case's cap, by claim_job on the SQL path
#    (jobcap.hot_path = sql: the statements' JOBCAP_CAP_OF), on the direct path (core::cap_of),
#    and by claim_job_by_id (SQL only);
#  - when its attempt fails, dead or back to pending by fail_job on both paths;
#  - reaped dead or back to pending when its lease expired, and made dead while pending when
#    its attempts are used up (reap_jobs: SQL only; a pending job with no attempt counted is
#    left alone).
# The DEBUG2 messages show which path served each call.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# The cases, read as the unit test reads them.
my @cases;
open(my $fh, '<', 'test/unit/cap_cases.txt') or die "test/unit/cap_cases.txt: $!";
while (my $line = <$fh>)
{
	next if $line =~ /^\s*(#|$)/;
	my @f = split ' ', $line;
	die "cap_cases.txt line $.: 8 fields expected" unless @f == 8;
	push @cases, { line => $., job_max => $f[0], job_epoch => $f[1], queue_max => $f[2],
		queue_epoch => $f[3], attempts => $f[4], cap => $f[5], may_claim => $f[6] eq 'yes',
		used_up => $f[7] eq 'yes' };
}
close $fh;
cmp_ok(scalar @cases, '>=', 20, 'the table of cases is read');

# No reaper serves these databases (jobcap.database is "postgres"): nothing but the test
# reaps, so over-cap jobs stay as the test leaves them.
my $node = jobcap_node('cap_rule');
$node->safe_psql('postgres', 'CREATE DATABASE caps; CREATE DATABASE caps_reap');
$node->safe_psql($_, 'CREATE EXTENSION jobcap') for qw(caps caps_reap);

# A queue with the case's settings and one job in it as the case has it (in state $state; a
# running job gets a fence and a lease, expired when $expired). Returns "job_id|fence".
sub job_of_case
{
	my ($db, $queue, $c, $state, $expired) = @_;
	my $lease = $expired ? "now() - interval '1 minute'" : "now() + interval '1 hour'";
	my $running = $state eq 'running'
	  ? ", state = 'running', fence = nextval('jobcap.fences'), lease = '1 hour',"
	  . " lease_expires_at = $lease, worker = 'w', claimed_at = now()"
	  : '';
	my $out = $node->safe_psql($db, qq{
        SELECT jobcap.create_queue('$queue', max_attempts => $c->{queue_max},
                                   backoff_base => '0', backoff_max => '0');
        UPDATE jobcap.queues SET cap_epoch = $c->{queue_epoch} WHERE queue = '$queue';
        SELECT jobcap.enqueue_job('$queue', '{}') \\gset
        UPDATE jobcap.jobs SET attempts = $c->{attempts}, max_attempts = $c->{job_max},
               cap_epoch = $c->{job_epoch} $running
         WHERE job_id = :enqueue_job RETURNING job_id || '|' || fence;
    });
	return (split /\n/, $out)[-1];    # after create_queue's empty result
}

# Runs $sql in database caps on $path; returns (stdout, the path that served $function).
sub on_path
{
	my ($path, $function, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('caps',
		"SET jobcap.hot_path = $path; SET client_min_messages = debug2; $sql",
		stdout => \$out, stderr => \$err, on_error_die => 1);
	my $served = $err =~ /jobcap: $function takes the direct path/ ? 'direct' : 'sql';
	$served = 'sql' if $err =~ /goes to the SQL path/;
	return ($out, $served);
}

my %reap;    # case line -> [expired job, pending job]
for my $c (@cases)
{
	my $n = $c->{line};
	my $name = "case at line $n ($c->{job_max} $c->{job_epoch} $c->{queue_max} "
	  . "$c->{queue_epoch} $c->{attempts})";
	for my $path (qw(sql direct))
	{
		my ($job) = split /\|/, job_of_case('caps', "claim_${path}_$n", $c, 'pending');
		my ($out, $served) = on_path($path, 'claim_job',
			"SELECT job_id || ' ' || coalesce(max_attempts::text, 'NULL')"
			  . " FROM jobcap.claim_job('claim_${path}_$n', 'w')");
		is($out, $c->{may_claim} ? "$job $c->{cap}" : '', "$name: claim_job on the $path path");
		is($served, $path, "$name: claim_job served by the $path path");

		my ($fjob, $fence) = split /\|/, job_of_case('caps', "fail_${path}_$n", $c, 'running');
		($out, $served) = on_path($path, 'fail_job',
			"SELECT jobcap.fail_job($fjob, $fence, 'boom', retry_in => '0')");
		is($out, $c->{used_up} ? 'dead' : 'pending', "$name: fail_job on the $path path");
		is($served, $path, "$name: fail_job served by the $path path");
	}
	my ($job) = split /\|/, job_of_case('caps', "by_id_$n", $c, 'pending');
	my ($out) = on_path('sql', 'claim_job_by_id',
		"SELECT job_id || ' ' || coalesce(max_attempts::text, 'NULL')"
		  . " FROM jobcap.claim_job_by_id($job, 'w')");
	is($out, $c->{may_claim} ? "$job $c->{cap}" : '', "$name: claim_job_by_id");

	my ($expired) = split /\|/, job_of_case('caps_reap', "expired_$n", $c, 'running', 1);
	my ($pending) = split /\|/, job_of_case('caps_reap', "pending_$n", $c, 'pending');
	$reap{$n} = [ $expired, $pending ];
}

# One reap over every case's jobs: an expired lease dies when its attempts are used up, else
# goes back to pending; a pending job dies when they are used up and any was counted.
my %outcome = map { split /\|/ } split /\n/,
  $node->safe_psql('caps_reap', "SELECT job_id || '|' || outcome FROM jobcap.reap_jobs()");
for my $c (@cases)
{
	my ($expired, $pending) = @{ $reap{ $c->{line} } };
	my $name = "case at line $c->{line}";
	is($outcome{$expired}, $c->{used_up} ? 'dead' : 'pending',
		"$name: reap_jobs, an expired lease");
	is($outcome{$pending} // 'not reaped',
		$c->{used_up} && $c->{attempts} > 0 ? 'dead' : 'not reaped',
		"$name: reap_jobs, a pending job");
}

$node->stop;
done_testing();
