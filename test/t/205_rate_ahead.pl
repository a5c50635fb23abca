# A backend that keeps claiming a queue far below its rate limit charges the window ahead
# (src/direct/rates.cpp, core::RateAllowance) and makes the claims that follow in the same slot
# without reading or writing it. What must hold: every claim made is counted in the window (the
# limit is never exceeded), a rolled-back charge allows nothing, a change of the queue's row
# (alter_queue) gives up what was charged under the old one, and what is charged and never claimed
# stays small. The queues' periods are long enough (16 s and more) that nothing leaves the window
# while a check runs.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use JobcapTest;

my $node = jobcap_node('rate_ahead', max_connections => 20);
$node->safe_psql('postgres', q{
	CREATE EXTENSION jobcap;
	SELECT jobcap.create_queue('ahead', rate_limit => 1000000, rate_period => '16 seconds');
	SELECT jobcap.create_queue('undone', rate_limit => 1000000, rate_period => '16 seconds');
	SELECT jobcap.create_queue('altered', rate_limit => 1000000, rate_period => '32 seconds');
	SELECT jobcap.enqueue_jobs(q, array_fill('{}'::jsonb, ARRAY[30000]))
	  FROM unnest(ARRAY['ahead', 'undone', 'altered']) q;
});

# The claims a queue's window counts, and its jobs claimed by a transaction that committed
# (leased for an hour: none is reaped or completed during the test).
sub counted
{
	my ($queue) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(sum(c), 0) FROM jobcap.queue_rates r, unnest(r.counts) c WHERE r.queue = '$queue'});
}
sub running
{
	my ($queue) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(*) FROM jobcap.jobs WHERE queue = '$queue' AND state = 'running'});
}
sub window_writes
{
	return $node->safe_psql('postgres', q{
		SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relid = 'jobcap.queue_rates'::regclass});
}

# pgbench: 4 clients claim one job a transaction for 3 s; with $undo, 1 transaction in 4 rolls back.
sub claim_for_a_while
{
	my ($queue, $undo) = @_;
	my $script = $node->basedir . "/$queue.pgbench";
	open my $fh, '>', $script or die $!;
	print $fh "\\set r random(1, 4)\nBEGIN;\n"
	  . "SELECT count(*) FROM jobcap.claim_job('$queue', 'w', 1, '1 hour');\n"
	  . ($undo ? "\\if :r = 1\nROLLBACK;\n\\else\nCOMMIT;\n\\endif\n" : "COMMIT;\n");
	close $fh;
	$node->command_ok(
		[ $node->installed_command('pgbench'), '-n', '-c', '4', '-j', '2', '-T', '3',
		  '-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
		"$queue: 4 clients claim for 3 s" . ($undo ? ', 1 transaction in 4 rolled back' : ''));
}

# Charged ahead: far fewer writes of the window than claims, every claim counted, and what was
# charged and not claimed at most 31 a client a slot (4 clients, at most 5 slots of 1 s).
my $writes = window_writes();
claim_for_a_while('ahead', 0);
my ($n, $c) = (running('ahead'), counted('ahead'));
cmp_ok($n, '>', 1000, "ahead: the clients claimed ($n)");
cmp_ok($c, '>=', $n, "ahead: the window counts every claim ($c counted, $n claimed)");
cmp_ok($c - $n, '<=', 4 * 5 * 31, 'ahead: what was charged and never claimed is small');
# A backend's table statistics are sent as it exits: wait for pgbench's to be gone.
ok(defined wait_until($node, q{SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'pgbench'}),
	'pgbench\'s backends have exited');
my $w = window_writes() - $writes;
ok($w > 0 && $w < $n / 4, "ahead: the window was written, for fewer than 1 claim in 4 ($w writes)");

# Rolled back: a charge undone allows nothing (the claims it would have covered would not be
# counted: the window would count fewer than were made).
claim_for_a_while('undone', 1);
($n, $c) = (running('undone'), counted('undone'));
cmp_ok($n, '>', 500, "undone: the clients claimed ($n)");
cmp_ok($c, '>=', $n, "undone: the window counts every claim that committed ($c counted, $n claimed)");

# Claims of other backends first, so that the window counts more than the shared turn's room
# (512) when the limit is lowered to it below: a claim that reads the lower limit does not
# share the turn, only one under an old charge could take a job.
claim_for_a_while('altered', 0);

# The claimer: a session of its own claiming one job of 'altered' at a time. Its claims are the
# queue's only ones, so the window's sum, read in the claim's transaction before and after it,
# grows by what the claim charged: 0 for a claim covered by a charge made ahead.
my $claimer = $node->background_psql('postgres');
sub window_sum
{
	return $claimer->query_safe(q{
		SELECT coalesce(sum(c), 0) FROM jobcap.queue_rates r, unnest(r.counts) c WHERE r.queue = 'altered'});
}
# In an open transaction: a claim, and what it took and charged.
sub claim_charged
{
	my $sum = window_sum();
	my $took = $claimer->query_safe(
		q{SELECT count(*) FROM jobcap.claim_job('altered', 'w', 1, '1 hour')});
	return ($took, window_sum() - $sum);
}

# Claims one at a time (each in a transaction of its own, committed) until done($took, $charged)
# holds of one, whose transaction ends with $end; false after 20 s without.
sub claim_until
{
	my ($done, $end) = @_;
	my $start = time;
	while (time - $start < 20)
	{
		$claimer->query_safe('BEGIN');
		my $hit = $done->(claim_charged());
		$claimer->query_safe($hit ? $end : 'COMMIT');
		return 1 if $hit;
	}
	return 0;
}
my $covered = sub { $_[0] == 1 && $_[1] == 0 };    # a job taken, nothing charged

ok(claim_until($covered, 'COMMIT'),
	'altered: a claim was covered by what an earlier one charged ahead');

# A charge ahead rolled back, then a transaction without a claim committed: the next claim is not
# covered by the charge undone. The claimer claims until a claim charges more than it took.
ok(claim_until(sub { $_[0] == 1 && $_[1] > 1 }, 'ROLLBACK'),
	'altered: a claim charged ahead, and rolled back');
$claimer->query_safe('SELECT 1');
$claimer->query_safe('BEGIN');
my ($took, $charged) = claim_charged();
$claimer->query_safe('COMMIT');
ok($took == 1 && $charged >= 1, "altered: the next claim charges the window again ($charged)");

# alter_queue: what was charged under the queue's old row is given up. The claimer claims until
# it has a charge ahead left (a claim covered), then the limit is lowered to what the window
# counts: its next claim must get nothing (under its old charge it would get a job, unless that
# charge happened to be used up).
ok(claim_until($covered, 'COMMIT'), 'altered: a claim was covered again');
cmp_ok(window_sum(), '>', 512, 'altered: the window counts more than the shared turn\'s room');
$node->safe_psql('postgres', q{
	SELECT jobcap.alter_queue('altered', rate_limit => (
		SELECT sum(c)::int FROM jobcap.queue_rates r, unnest(r.counts) c WHERE r.queue = 'altered'))});
is($claimer->query_safe(q{SELECT count(*) FROM jobcap.claim_job('altered', 'w', 1, '1 hour')}),
	'0', 'altered: after alter_queue the window is full, and the old charge allows nothing');
($n, $c) = (running('altered'), counted('altered'));
cmp_ok($c, '>=', $n, "altered: the window counts every claim ($c counted, $n claimed)");
$claimer->quit;

# A limit the load reaches (700 a second), claimed every way at once by 8 clients for 8 s
# (adapted from a reviewer's attack): batches of 1 to 3 (1 in 10 of them rolled back), of 32
# and of 40 (the SQL path), complete_and_claim, claim_job_by_id, and transactions that claim
# twice 50 ms apart. No second of claimed_at may hold more than the limit. (A job's claimed_at
# is its last claim's: a claim that rolled back and was made again is counted once, so this
# reads what committed.)
$node->safe_psql('postgres', q{
	SELECT jobcap.create_queue('mixed', rate_limit => 700, rate_period => '1 second');
	SELECT jobcap.enqueue_jobs('mixed', array_fill('{}'::jsonb, ARRAY[60000]));
});
my $script = $node->basedir . '/mixed.pgbench';
open my $fh, '>', $script or die $!;
print $fh <<'END';
\set r random(1, 100)
\set b random(1, 3)
\if :r <= 50
BEGIN;
SELECT count(*) FROM jobcap.claim_job('mixed', 'w', :b, '1 hour');
\if :r <= 5
ROLLBACK;
\else
COMMIT;
\endif
\elif :r <= 60
SELECT count(*) FROM jobcap.claim_job('mixed', 'w', 32, '1 hour');
\elif :r <= 63
SELECT count(*) FROM jobcap.claim_job('mixed', 'w', 40, '1 hour');
\elif :r <= 80
SELECT coalesce(max(job_id), 0) AS jid, coalesce(max(fence), 0) AS fnc FROM jobcap.claim_job('mixed', 'w', 1, '1 hour') \gset
\if :jid > 0
SELECT count(*) FROM jobcap.complete_and_claim(:jid, :fnc, 'mixed', 'w', :b, '1 hour');
\endif
\elif :r <= 90
SELECT coalesce(min(job_id), 0) AS pid FROM (SELECT job_id FROM jobcap.jobs WHERE queue = 'mixed' AND state = 'pending' ORDER BY job_id LIMIT 50) s \gset
\if :pid > 0
SELECT count(*) FROM jobcap.claim_job_by_id(:pid + 0, 'w', '1 hour');
\endif
\else
BEGIN;
SELECT count(*) FROM jobcap.claim_job('mixed', 'w', 1, '1 hour');
SELECT pg_sleep(0.05);
SELECT count(*) FROM jobcap.claim_job('mixed', 'w', :b, '1 hour');
COMMIT;
\endif
END
close $fh;
$node->command_ok(
	[ $node->installed_command('pgbench'), '-n', '-c', '8', '-j', '2', '-T', '8',
	  '-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
	'mixed: 8 clients claim every way for 8 s');
my ($claimed, $busiest) = split /\|/, $node->safe_psql('postgres', q{
	SELECT count(*), max(n) FROM (
		SELECT count(*) OVER (ORDER BY claimed_at
		         RANGE BETWEEN interval '1 second' - interval '1 microsecond' PRECEDING AND CURRENT ROW) n
		  FROM jobcap.jobs WHERE queue = 'mixed' AND claimed_at IS NOT NULL) w});
cmp_ok($claimed, '>', 2 * 700, "mixed: more than two seconds' worth claimed ($claimed)");
cmp_ok($busiest, '<=', 700, "mixed: no second of claimed_at over the limit (busiest $busiest)");

done_testing();
