# The worker's vacuums are spaced, so that vacuuming takes at most a tenth of its time. After a
# vacuum that took D, none starts sooner than 9 D after it ended, although the threshold is long
# past; once that is over, the next cycle vacuums. Vacuums are made slow with PostgreSQL's
# cost-based delay (as in 171_vacuum_manners.pl): the wait is sleep, not CPU, so D is about the
# same on any machine, and the test reads D and the end of each vacuum from the worker's own
# DEBUG1 line rather than predicting them. Every time compared comes from the server log's %m
# stamps (one clock), so the test's own scheduling does not enter the assertions, only the
# preconditions (skipped, not failed, when the machine was too slow to set them up).
#
# The test fails without spacing (kVacuumSpacing = 0): the second vacuum then starts as soon as
# the first has ended, far sooner than 9 D.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use Time::Local qw(timegm);
use JobcapTest;

my $node = jobcap_node('spacing', autovacuum_naptime => "'1d'", log_min_messages => 'debug1',
	vacuum_cost_delay => "'20ms'", vacuum_cost_limit => '1');
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('v');
    SELECT count(*) FROM unnest(jobcap.enqueue_jobs('v', array_fill('{}'::jsonb, ARRAY[3000])));
    SET vacuum_cost_delay = 0;
    VACUUM ANALYZE jobcap.jobs;
});
# The worker's threshold: 1000 + 2% of 3000 = 1060 dead rows.

sub kill_rows
{
	my ($n) = @_;
	$node->safe_psql('postgres', "UPDATE jobcap.jobs SET payload = payload
	    WHERE job_id IN (SELECT job_id FROM jobcap.jobs WHERE state = 'pending' LIMIT $n)");
}

sub stamp    # a %m log stamp as seconds (differences only; the log's zone cancels out)
{
	my ($y, $mo, $d, $h, $mi, $s, $ms) = @_;
	return timegm($s, $mi, $h, $d, $mo - 1, $y) + $ms / 1000;
}
my $ts = qr/^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{3}) \S+ \[\d+\] /m;

# The worker's vacuums logged from $offset on: [end, duration] in seconds. Waits (up to $s
# seconds) until there are at least $n: vacuum_count moves before the line is written.
sub vacuums_logged
{
	my ($offset, $n, $s) = @_;
	for (my $i = 0; $i < $s * 20; ++$i)
	{
		my $log = slurp_file($node->logfile, $offset);
		my @v;
		while ($log =~ /${ts}DEBUG:  jobcap reaper vacuumed jobcap\.jobs in database "postgres" in (\d+) ms/gm)
		{
			push @v, [ stamp($1, $2, $3, $4, $5, $6, $7), $8 / 1000 ];
		}
		return @v if @v >= $n;
		usleep(50_000);
	}
	return ();
}

# When the server received the statement that marks a point of the test.
sub mark
{
	my ($offset, $name) = @_;
	$node->safe_psql('postgres', "SELECT 'mark $name'");
	my $log = slurp_file($node->logfile, $offset);
	return $log =~ /${ts}.*LOG:  statement: SELECT 'mark $name'/m
	  ? stamp($1, $2, $3, $4, $5, $6, $7) : undef;
}

my $offset = -s $node->logfile;
kill_rows(1500);
ok(defined wait_until($node, "SELECT vacuum_count = 2 FROM pg_stat_user_tables
    WHERE relid = 'jobcap.jobs'::regclass"), 'past the threshold: a (slow) vacuum');
my @v = vacuums_logged($offset, 1, 30);
is(scalar @v, 1, 'logged once');
my ($end1, $d1) = @{ $v[0] };
cmp_ok($d1, '>=', 0.3, "the cost delay makes it last (${d1} s)");
my $spacing = 9 * $d1;

# The second burst, well inside the spacing.
kill_rows(1500);
my $burst = mark($offset, 'burst');
SKIP:
{
	skip 'the second burst came too late to tell spacing from a cycle', 3
	  unless defined $burst && $burst < $end1 + $spacing - 1.5;

	ok(defined wait_until($node, "SELECT vacuum_count = 3 FROM pg_stat_user_tables
	    WHERE relid = 'jobcap.jobs'::regclass", 't', $spacing + 60),
		'the next vacuum comes');
	@v = vacuums_logged($offset, 2, 30);
	my ($end2, $d2) = @{ $v[1] };
	# The second vacuum started at most at $end2 - $d2 (its line follows its end; the logged
	# duration is truncated). The spacing puts its start at least 9 x d1 after the first one
	# ended, which is at most the first line's stamp: 1 s covers the steps between a vacuum's end
	# and its line. Without spacing the difference is about -(spacing - 1.5 s) or less.
	my $start2 = $end2 - $d2;
	cmp_ok($start2 - ($end1 + $spacing), '>=', -1.0,
		sprintf('none sooner than 9 x %.3f s after the first ended (started %.2f s after it)',
			$d1, $start2 - $end1));
	# Liveness, generously: it starts within a few cycles of the spacing's end.
	cmp_ok($start2 - ($end1 + $spacing), '<=', 10,
		'and the worker vacuums once the spacing is over');
}
is(count_log($node, qr/could not vacuum/), 0, 'no vacuum failed (none reached its 10 s)');

$node->stop;
done_testing();
