# Starvation: three tenants share a queue, the big one's backlog enqueued first. With
# fairness => 'round_robin' each small tenant's jobs are all claimed within a bounded number of
# claims of one job (3 tenants: one claim in 3 each while all three have jobs, then one in 2);
# with 'fifo' (the same jobs, the control) neither small tenant gets a claim before the big one's
# backlog is done. Claims of one job, each completed at once, as a worker's loop.
#
# JOBCAP_FAIRNESS_SIZES="100000,1000,10" runs the issue's sizes (default 10000,100,10, which
# runs in seconds); the time per claim at that backlog is reported.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;
use Time::HiRes ();

my ($big, $small, $tiny) = split /,/, ($ENV{JOBCAP_FAIRNESS_SIZES} // '10000,100,10');
# While all three have jobs each gets one claim in 3; once tiny is done, small one in 2.
my $tiny_bound = 3 * $tiny;
my $small_bound = $tiny_bound + 2 * ($small - $tiny);

my $node = jobcap_node('fairness');
$node->safe_psql('postgres', 'CREATE EXTENSION jobcap');

# Enqueues the three backlogs into queue $q (big first), then claims $claims jobs one at a time,
# completing each, and logs which tenant each claim served.
sub run_queue
{
	my ($q, $fairness, $claims) = @_;
	# In batches of at most 10,000 (enqueue_jobs' limit is 100,000), big first.
	for my $t ([ 'big', $big ], [ 'small', $small ], [ 'tiny', $tiny ])
	{
		my ($tenant, $n) = @$t;
		while ($n > 0)
		{
			my $b = $n > 10000 ? 10000 : $n;
			$node->safe_psql('postgres',
				"SELECT jobcap.create_queue('$q', fairness => '$fairness')"
				  . " WHERE NOT EXISTS (SELECT FROM jobcap.queues WHERE queue = '$q');"
				  . " SELECT jobcap.enqueue_jobs('$q', array_fill('{}'::jsonb, ARRAY[$b]),"
				  . " concurrency_keys => array_fill('$tenant'::text, ARRAY[$b])) IS NOT NULL");
			$n -= $b;
		}
	}
	my $t0 = Time::HiRes::time();
	$node->safe_psql('postgres', qq{
		CREATE TABLE log_$q (n int, tenant text);
		DO \$\$
		DECLARE
		    r record;
		BEGIN
		    FOR i IN 1..$claims LOOP
		        FOR r IN SELECT c.job_id, c.fence, j.concurrency_key
		                   FROM jobcap.claim_job('$q', 'w', 1) c JOIN jobcap.jobs j USING (job_id) LOOP
		            INSERT INTO log_$q VALUES (i, r.concurrency_key);
		            PERFORM jobcap.complete_job(r.job_id, r.fence);
		        END LOOP;
		    END LOOP;
		END
		\$\$;
	});
	diag(sprintf('%s: %.1f ms per claim+complete at a backlog of %d jobs', $fairness,
		(Time::HiRes::time() - $t0) * 1000 / $claims, $big + $small + $tiny));
	my %last = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		"SELECT tenant, max(n) FROM log_$q GROUP BY tenant");
	my %count = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		"SELECT tenant, count(*) FROM log_$q GROUP BY tenant");
	return (\%last, \%count);
}

my $claims = $small_bound + 10;
my ($t0) = time();
my ($last, $count) = run_queue('fair', 'round_robin', $claims);
diag(sprintf('round_robin, %d/%d/%d jobs: tiny done at claim %s (bound %d), small at %s (bound %d), '
	  . '%d claims in %d s', $big, $small, $tiny, $last->{tiny} // '-', $tiny_bound,
	$last->{small} // '-', $small_bound, $claims, time() - $t0));
is($count->{tiny}, $tiny, "round_robin: every job of the $tiny-job tenant claimed");
cmp_ok($last->{tiny}, '<=', $tiny_bound, "round_robin: all within the first $tiny_bound claims");
is($count->{small}, $small, "round_robin: every job of the $small-job tenant claimed");
cmp_ok($last->{small}, '<=', $small_bound,
	"round_robin: all within the first $small_bound claims");
is($count->{big}, $claims - $small - $tiny, 'round_robin: the big tenant got every other claim');

# The control: fifo hands the big backlog out first, so the same bounds do not hold.
my ($flast, $fcount) = run_queue('fifo', 'fifo', $claims);
is($fcount->{big}, $claims, "fifo: the first $claims claims all go to the big tenant");
ok(!defined $fcount->{tiny} && !defined $fcount->{small}, 'fifo: the small tenants get none');

done_testing();
