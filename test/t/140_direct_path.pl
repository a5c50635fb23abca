# The differential test of the direct path: the same randomised sequences of operations run
# through jobcap.hot_path = sql (the SQL statements, the reference) in database "ref" and through
# jobcap.hot_path = direct in database "dut", from the same start state, with three sessions
# per database interleaved in the same order (one or two hold claims, settles, heartbeats and
# fence assertions open in transactions while the others claim past them with SKIP LOCKED, settle
# other jobs and reap). Every operation's outcome (its rows, or its SQLSTATE) is compared, and so
# is every table's state at the end of each sequence (see $state_query for what is normalised,
# and why), after amcheck has checked that jobcap.jobs' indexes hold every row they should.
# The DEBUG2 messages prove that "dut" took the direct path (and "ref" did not).
# On a difference it fails with the first one; a failed run is reproduced by its seed.
#
# JOBCAP_DIFF_SEED, JOBCAP_DIFF_SEQUENCES and JOBCAP_DIFF_OPS override the defaults.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use JobcapTest;

my $seed = $ENV{JOBCAP_DIFF_SEED} // (time() % 1_000_000);
my $sequences = $ENV{JOBCAP_DIFF_SEQUENCES} // 40;
my $ops_per_sequence = $ENV{JOBCAP_DIFF_OPS} // 120;
diag("differential: seed $seed (JOBCAP_DIFF_SEED=$seed reproduces this run)");
srand($seed);

# jobcap.database stays "postgres": no reaper serves "ref" or "dut", so nothing but the
# operations below changes them (a rolled-back claim is not counted behind the test's back).
my $node = jobcap_node('differential');
for my $db (qw(ref dut))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION jobcap; CREATE EXTENSION amcheck');
}
# Worker roles: one plain, one whose name needs quoting, one that works through its membership
# in the first, and an operator (who works only the queues granted to it, too).
$node->safe_psql('postgres', q{
    CREATE ROLE jc_diff_worker IN ROLE jobcap_worker;
    CREATE ROLE "jc Diff Worker" IN ROLE jobcap_worker;
    CREATE ROLE jc_diff_member IN ROLE jc_diff_worker;
    CREATE ROLE jc_diff_operator IN ROLE jobcap_operator;
});
my %path = (ref => 'sql', dut => 'direct');

# A psql session of our own (IPC::Run), quieter than BackgroundPsql: send_sql() sends statements,
# each followed by its SQLSTATE, and returns (stdout, stderr).
sub session
{
	my ($db) = @_;
	my %s = (db => $db, in => '', out => '', err => '', n => 0);
	$s{timer} = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	$s{run} = IPC::Run::start(
		[ $node->installed_command('psql'), '-XAtq', '-d', $node->connstr($db), '-f', '-' ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err}, $s{timer});
	my $self = \%s;
	send_sql($self, "SET client_min_messages = debug2", "SET jobcap.hot_path = $path{$db}",
		"SET lock_timeout = '5s'");
	return $self;
}

sub send_sql
{
	my ($s, @statements) = @_;
	my $mark = "#done " . $s->{n}++;
	$s->{out} = $s->{err} = '';
	$s->{in} .= join('', map { "$_\n;\n\\echo '#SQLSTATE' :SQLSTATE\n" } @statements)
	  . "\\echo '$mark'\n\\warn '$mark'\n";
	$s->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
	$s->{run}->pump until ($s->{out} =~ /^\Q$mark\E$/m && $s->{err} =~ /^\Q$mark\E$/m);
	my ($out, $err) = ($s->{out}, $s->{err});
	$out =~ s/^\Q$mark\E\n//m;
	$err =~ s/^\Q$mark\E\n//m;
	return ($out, $err);
}

my %sessions = map { my $db = $_; ($db => [ map { session($db) } 1 .. 3 ]) } qw(ref dut);

# Which path served which function, per database (from the DEBUG2 messages).
my %served;
# Operations compared so far, and the first difference found.
my $compared = 0;
my $failure;
our $show_outcomes = 0;    # note every outcome (the scripted sequence)
# Outcomes seen, per kind of operation: SQLSTATEs and claimed rows (so the log shows what the
# sequences exercised).
my %tally;

# The fences the claims handed out, per database, in the order they were handed out: ticket k
# is the k-th, the same job on both sides (else the outcomes differed already).
my %tickets = (ref => [], dut => []);
my @ticket_job;    # ticket -> job_id
# Which call handed out a fence, per database: the number of the operation (the same on both
# sides). The final states name fences by it: a batch claim may take its fences from the
# sequence in another order on each path, which is no difference (nothing promises an order).
my %fence_call = (ref => {}, dut => {});
my %latest;        # job_id -> its latest ticket
my %live;          # job_id -> claimed, and not settled since as far as the driver knows

# Turns a template into SQL for database $db: {F:k} is ticket k's fence there (k < 0: fence 0),
# {PATH} the database's own jobcap.hot_path.
sub expand
{
	my ($db, $sql) = @_;
	$sql =~ s/\{F:(-?\d+)\}/$1 < 0 ? 0 : $tickets{$db}[$1]/ge;
	$sql =~ s/\{PATH\}/$path{$db}/g;
	return $sql;
}

# An outcome in a comparable form: claimed rows ("C|job|fence|...") get their ticket instead of
# the fence (new tickets are recorded), SQLSTATEs stay, messages go (they name fences).
sub normalise
{
	my ($db, $out, $err) = @_;
	my @lines;
	for my $line (split /\n/, $out)
	{
		if ($line =~ /^C\|(\d+)\|(\d+)\|(.*)$/)
		{
			my ($job, $fence, $rest) = ($1, $2, $3);
			push @{ $tickets{$db} }, $fence;
			$fence_call{$db}{$fence} = "claim#$compared";
			my $k = $#{ $tickets{$db} };
			$line = "C|$job|T$k|$rest";
			if ($db eq 'ref')
			{
				$ticket_job[$k] = $job;
				$latest{$job} = $k;
				$live{$job} = 1;
			}
		}
		push @lines, $line;
	}
	while ($err =~ /jobcap: (\w+) takes the (direct|SQL) path(?:: (the transaction is REPEATABLE READ|jobcap.hot_path is sql))?/g)
	{
		my ($f, $path, $why) = ($1, $2, $3 // '');
		$path .= ' (repeatable read)' if $why =~ /REPEATABLE/;
		$path .= ' (switched)' if $db eq 'dut' && $why =~ /hot_path/;
		$served{$db}{$f}{$path}++;
	}
	return join("\n", @lines);
}

# ---- the start state ------------------------------------------------------------------------

my @queues = qw(qa qb qc qd);
my %queue_model;    # what the driver set: whether a queue is capped (max_running, rate_limit,
                    # max_running_per_key or round-robin fairness)

sub pick { return $_[ int(rand(@_)) ]; }

# Setup SQL, from the PRNG: queues with different caps, leases and backoff (qb's retries wait
# an hour, the others' are due at once), jobs with priorities, run_at in the past and the
# future, their own caps, a requeue budget, and grants of qd (sometimes qa) to the worker role.
sub start_state
{
	my @sql = (
		"SELECT jobcap.create_queue('qa', max_attempts => " . (2 + int(rand(3))) . ", backoff_base => '0', backoff_max => '0')",
		"SELECT jobcap.create_queue('qb', max_attempts => " . (3 + int(rand(3))) . ", lease => '10 minutes', backoff_base => '1 hour', backoff_max => '2 hours')",
		"SELECT jobcap.create_queue('qc', max_attempts => 2, lease => '3 minutes', backoff_base => '0', backoff_max => '0', max_running => 2)",
		"SELECT jobcap.create_queue('qd', max_attempts => 4, backoff_base => '0', backoff_max => '0')",
		"SELECT jobcap.grant_queue('qd', 'jc_diff_worker')");
	push @sql, "SELECT jobcap.grant_queue('qa', 'jc_diff_worker')" if rand() < 0.5;
	%queue_model = (qc => { capped => 1, running => 1 });
	# Sometimes a rate-limited queue from the start (its claims go to the SQL path on both sides;
	# a period of an hour, so that no claim leaves the window during the run).
	if (rand() < 0.5)
	{
		push @sql, "SELECT jobcap.alter_queue('qb', rate_limit => 3, rate_period => '1 hour')";
		$queue_model{qb} = { capped => 1, rated => 1 };
	}
	# Sometimes a per-key limit or round-robin fairness from the start (claims on the SQL path on
	# both sides, as for any capped queue; enqueues direct on "dut").
	if (rand() < 0.5)
	{
		push @sql, "SELECT jobcap.alter_queue('qd', max_running_per_key => 1)";
		$queue_model{qd} = { capped => 1, keyed => 1 };
	}
	if (rand() < 0.5)
	{
		push @sql, "SELECT jobcap.alter_queue('qa', fairness => 'round_robin')";
		$queue_model{qa} = { capped => 1, fair => 1 };
	}
	my $jobs = 0;
	for my $q (@queues)
	{
		for (1 .. 5 + int(rand(8)))
		{
			my $when = pick("now() - interval '2 hours'", "now() - interval '1 minute'",
				"now()", "now() + interval '1 hour'");
			my $own = rand() < 0.3 ? 1 + int(rand(5)) : 'NULL';
			my $ck = pick('NULL', "'ka'", "'kb'", "'kc'");
			push @sql,
			    "SELECT jobcap.enqueue_job('$q', '{\"n\": " . ++$jobs . "}', run_at => $when,"
			  . " priority => " . (int(rand(4)) - 1) . ", max_attempts => $own, concurrency_key => $ck)";
		}
	}
	# A budget granted by requeue_job: cancelled, then requeued with 2 or 5 extra attempts.
	for my $id (1, 1 + int(rand($jobs)))
	{
		push @sql, "SELECT jobcap.cancel_job($id)",
		  "SELECT jobcap.requeue_job($id, 'budget', " . pick(2, 5) . ")";
	}
	return @sql;
}

# ---- operations -----------------------------------------------------------------------------

# The jobs the operations generated since the last reset name (an open transaction may hold
# their rows locked).
my %touched;

my $claim_cols = "SELECT 'C', job_id, fence, attempt, max_attempts, payload";

# A job that was claimed (by ticket), or any job id; a fence for it: its latest ticket (current,
# unless settled since), an older one (stale), another job's or 0.
sub some_ticket
{
	my (%avoid) = @_;
	my @jobs = grep { !$avoid{$_} } keys %latest;
	return undef unless @jobs;
	# Mostly a job the driver believes running (its fence is then current), so that settles
	# succeed about as often as they are refused.
	my @live = grep { $live{$_} } @jobs;
	@jobs = @live if @live && rand() < 0.75;
	my $job = pick(sort { $a <=> $b } @jobs);
	$touched{$job} = 1;
	my $r = rand();
	my $k = $latest{$job};
	if ($r < 0.15)
	{
		my @older = grep { $ticket_job[$_] == $job } 0 .. $k;
		$k = pick(@older);
	}
	elsif ($r < 0.2)
	{
		$k = -1;    # fence 0: never current
	}
	return ($job, $k);
}

# One operation: [label, template statements...]. %avoid: jobs locked by an open transaction of
# another session (settling them would wait); $limited: only what cannot wait on such locks;
# $in_transaction: the session has a transaction open (no BEGIN of its own).
# Whether the driver made queue q capped: its claims take turns on its row.
sub capped
{
	my ($q) = @_;
	my $m = $queue_model{$q} // {};
	return $m->{running} || $m->{rated} || $m->{keyed} || $m->{fair};
}

sub random_op
{
	my ($limited, $in_transaction, %avoid) = @_;
	my $q = pick(@queues);
	my $lease = pick('NULL', 'NULL', "'2 minutes'", "'20 minutes'");
	my $w = pick('w1', 'w2', 'w3');
	my @kinds = (('claim') x 8, ('by_id') x 2, ('cac') x 3, ('complete') x 3, ('complete_jobs') x 2,
		('fail') x 3, ('heartbeat') x 2, ('assert') x 2, ('release') x 1, ('crash') x 1, 'history',
		# reap_jobs and requeue_dead skip locked rows: safe beside open transactions too.
		('reap') x 2, 'expire', 'requeue_dead');
	push @kinds, (('requeue') x 2, ('alter') x 2, 'grant',
		'pause', 'max_running', 'rate_limit', 'per_key', 'fairness', 'lease', 'drop', 'cancel', ('enqueue') x 3, ('as_worker') x 3,
		'repeatable_read')
	  unless $limited;
	my $kind = pick(@kinds);
	# In an open transaction they would lock rows the driver cannot name for the others to avoid.
	# (claim_job_by_id of a capped queue's job locks the queue's row, and the driver does not
	# know the job's queue.)
	$kind = 'claim' if $in_transaction && $kind =~ /^(reap|requeue_dead|by_id)$/;
	# In a transaction: sometimes the path switched for the rest of it (SET LOCAL), so that one
	# transaction mixes the paths on "dut".
	if ($in_transaction && rand() < 0.08)
	{
		my $to = pick('sql', '{PATH}');
		return ("switch to $to", "SET LOCAL jobcap.hot_path = $to");
	}
	# While another session holds locks, claims only from queues whose row nobody locks.
	$q = pick(grep { !$queue_model{$_}{capped} } @queues) if $limited;

	if ($kind eq 'claim')
	{
		return ("claim_job $q",
			"$claim_cols FROM jobcap.claim_job('$q', '$w', " . (1 + int(rand(4))) . ", $lease)");
	}
	if ($kind eq 'by_id')
	{
		my $id = 1 + int(rand(50));
		$touched{$id} = 1;
		return ("claim_job_by_id $id",
			"$claim_cols FROM jobcap.claim_job_by_id($id, '$w', $lease)");
	}
	my ($job, $k) = some_ticket(%avoid);
	return random_op($limited, $in_transaction, %avoid) unless defined $job
	  || $kind =~ /^(reap|expire|requeue|requeue_dead|alter|grant|pause|max_running|rate_limit|per_key|fairness|lease|drop|cancel|enqueue|as_worker|repeatable_read|history)$/;
	if ($kind eq 'cac')
	{
		my $out = rand() < 0.3 ? "'{\"ok\": 1}'" : 'NULL';
		return ("complete_and_claim $job -> $q",
			"$claim_cols FROM jobcap.complete_and_claim($job, {F:$k}, '$q', '$w', "
			  . (1 + int(rand(3))) . ", $lease, $out)");
	}
	if ($kind eq 'complete')
	{
		my $out = rand() < 0.3 ? ", '{\"r\": $job}'" : '';
		return ("complete_job $job", "SELECT jobcap.complete_job($job, {F:$k}$out)");
	}
	if ($kind eq 'complete_jobs')
	{
		# Two to four pairs: sometimes one listed twice, sometimes a stale one.
		my @pairs = ([ $job, $k ]);
		for (1 .. int(rand(3)))
		{
			my ($j2, $k2) = some_ticket(%avoid);
			push @pairs, [ $j2, $k2 ] if defined $j2;
		}
		push @pairs, $pairs[0] if rand() < 0.3;
		push @pairs, [ $job, -1 ] if rand() < 0.1;
		my $outputs = rand() < 0.3
		  ? ", ARRAY[" . join(', ', map { "'{\"b\": $_->[0]}'::jsonb" } @pairs) . "]"
		  : '';
		return ("complete_jobs " . join(',', map { $_->[0] } @pairs),
			"SELECT jobcap.complete_jobs(ARRAY[" . join(', ', map { $_->[0] } @pairs)
			  . "]::bigint[], ARRAY[" . join(', ', map { "{F:$_->[1]}" } @pairs) . "]::bigint[]$outputs)");
	}
	if ($kind eq 'history')
	{
		# How much history a failure keeps (and prunes to), for the rest of this session.
		my $keep = pick(0, 1, 2, 10);
		return ("error_history $keep", "SET jobcap.error_history = $keep");
	}
	if ($kind eq 'fail')
	{
		my $retry = pick('', '', ", '0'", ", '1 hour'");
		return ("fail_job $job", "SELECT jobcap.fail_job($job, {F:$k}, 'boom $job'$retry)");
	}
	if ($kind eq 'heartbeat')
	{
		my $extend = pick('NULL', "'1 minute'", "'30 minutes'");
		return ("heartbeat $job",
			"SELECT jobcap.heartbeat($job, {F:$k}, $extend) IS NOT NULL");
	}
	if ($kind eq 'assert')
	{
		# assert_fence inside a transaction that writes something of its own.
		my @body = ("SELECT jobcap.assert_fence($job, {F:$k})",
			"UPDATE jobcap.jobs SET payload = payload || '{\"asserted\": true}' WHERE job_id = $job");
		return ("assert_fence $job", @body) if $in_transaction;
		return ("assert_fence $job", "BEGIN", @body, pick("COMMIT", "ROLLBACK"));
	}
	if ($kind eq 'release')
	{
		return ("release_job $job", "SELECT jobcap.release_job($job, {F:$k})");
	}
	if ($kind eq 'crash')
	{
		return ("crash_job $job", "SELECT jobcap.crash_job($job, {F:$k}, 'died')");
	}
	# Expiring a lease: a fixed instant in the past, as the tables' owner (no job: nothing).
	my $expire = "UPDATE jobcap.jobs SET lease_expires_at = '2000-01-01 00:00:00+00'"
	  . " WHERE job_id = " . ($job // 0) . " AND state = 'running'";
	if ($kind eq 'reap')
	{
		# Expire one running job's lease, then reap (jobs other sessions hold locked are skipped).
		return ("reap after expiring " . ($job // 'none'), $expire,
			"SELECT job_id, queue, outcome FROM jobcap.reap_jobs() ORDER BY job_id");
	}
	if ($kind eq 'expire')
	{
		# Left expired: the next heartbeat, settle or reap meets it.
		return ("expire " . ($job // 'none'), $expire);
	}
	if ($kind eq 'requeue')
	{
		my $id = 1 + int(rand(50));
		return ("requeue_job $id",
			"SELECT jobcap.requeue_job($id, 'again', " . pick('NULL', 1, 3) . ")");
	}
	if ($kind eq 'requeue_dead')
	{
		return ("requeue_dead $q", "SELECT jobcap.requeue_dead('$q', 'all again')");
	}
	if ($kind eq 'alter')
	{
		return ("alter_queue $q max_attempts",
			"SELECT jobcap.alter_queue('$q', max_attempts => " . (1 + int(rand(6))) . ")");
	}
	if ($kind eq 'grant')
	{
		# To the worker role itself, or to the group role it is a member of.
		my $f = pick('grant_queue', 'revoke_queue');
		my $role = pick('jc_diff_worker', 'jc_diff_worker', 'jobcap_worker', 'jc Diff Worker',
			'jc_diff_operator');
		return ("$f $q $role", "SELECT jobcap.$f('$q', '$role')");
	}
	if ($kind eq 'lease')
	{
		return ("alter_queue $q lease",
			"SELECT jobcap.alter_queue('$q', lease => '" . pick('4 minutes', '7 minutes') . "')");
	}
	if ($kind eq 'drop')
	{
		# Refused while the queue has pending or running jobs, unless forced; created again.
		my $force = pick('false', 'false', 'true');
		# Only a forced drop surely happens (the driver may think a queue capped that is not).
		$queue_model{$q} = {} if $force eq 'true';
		return ("drop_queue $q force $force", "SELECT jobcap.drop_queue('$q', force => $force)",
			"SELECT jobcap.create_queue('$q', max_attempts => 3, backoff_base => '0', backoff_max => '0')");
	}
	if ($kind eq 'pause')
	{
		my $f = pick('pause_queue', 'resume_queue', 'resume_queue');
		return ("$f $q", "SELECT jobcap.$f('$q')");
	}
	if ($kind eq 'max_running')
	{
		# 100000: far above the load, its claims share the queue's claim turn on the direct path.
		my $n = pick(0, 0, 1, 3, 100000);
		$queue_model{$q}{running} = $n > 0;
		$queue_model{$q}{capped} = capped($q);
		return ("alter_queue $q max_running $n",
			"SELECT jobcap.alter_queue('$q', max_running => $n)");
	}
	if ($kind eq 'rate_limit')
	{
		# 100000: far above the load, its claims share the turn and charge their slots' rows of
		# the window; 515: they do until 4 claims are charged, then take the turn exclusive.
		my $n = pick(0, 0, 2, 5, 515, 100000);
		$queue_model{$q}{rated} = $n > 0;
		$queue_model{$q}{capped} = capped($q);
		return ("alter_queue $q rate_limit $n",
			"SELECT jobcap.alter_queue('$q', rate_limit => $n, rate_period => '1 hour')");
	}
	if ($kind eq 'per_key')
	{
		# 100000: far above the load, as max_running's.
		my $n = pick(0, 0, 1, 2, 100000);
		$queue_model{$q}{keyed} = $n > 0;
		$queue_model{$q}{capped} = capped($q);
		return ("alter_queue $q max_running_per_key $n",
			"SELECT jobcap.alter_queue('$q', max_running_per_key => $n)");
	}
	if ($kind eq 'fairness')
	{
		my $f = pick('fifo', 'round_robin');
		$queue_model{$q}{fair} = $f eq 'round_robin';
		$queue_model{$q}{capped} = capped($q);
		return ("alter_queue $q fairness $f", "SELECT jobcap.alter_queue('$q', fairness => '$f')");
	}
	if ($kind eq 'cancel')
	{
		my $id = 1 + int(rand(50));
		return ("cancel_job $id", "SELECT jobcap.cancel_job($id)");
	}
	if ($kind eq 'enqueue')
	{
		# enqueue_job (with or without a dedupe key: a key goes to the SQL path on both) or a
		# batch of 0 to 4 through enqueue_jobs, due now or later, with or without a cap.
		my $prio = int(rand(3)) - 1;
		my $when = pick('now()', "now() - interval '1 minute'", "now() + interval '1 hour'");
		my $own = rand() < 0.3 ? 1 + int(rand(4)) : 'NULL';
		if (rand() < 0.5)
		{
			my $key = rand() < 0.3 ? "'k" . int(rand(3)) . "'" : 'NULL';
			my $ck = pick('NULL', "'ka'", "'kb'");
			return ("enqueue_job $q key $key concurrency_key $ck",
				"SELECT jobcap.enqueue_job('$q', '{\"late\": true}', run_at => $when, priority => $prio,"
				  . " max_attempts => $own, dedupe_key => $key, concurrency_key => $ck)");
		}
		my $n = int(rand(5));
		my $cks = rand() < 0.5 ? 'NULL'
		  : "ARRAY[" . join(', ', map { pick('NULL', "'ka'", "'kb'", "'kc'") } 1 .. $n) . "]::text[]";
		return ("enqueue_jobs $q x$n keys $cks",
			"SELECT jobcap.enqueue_jobs('$q', array_fill('{\"many\": true}'::jsonb, ARRAY[$n]),"
			  . " run_at => $when, priority => $prio, max_attempts => $own, concurrency_keys => $cks)");
	}
	if ($kind eq 'repeatable_read')
	{
		# The direct path leaves REPEATABLE READ to the SQL statements: the same outcomes still.
		my ($label, @inner) = random_op(1, 1, %avoid);
		return ("repeatable read: $label", "BEGIN ISOLATION LEVEL REPEATABLE READ", @inner,
			"COMMIT");
	}
	# as_worker: a worker-role call, allowed on its granted queues, denied elsewhere (and the
	# operator's calls denied always).
	my ($label, @inner) = random_op(1, $in_transaction, %avoid);
	@inner = ("SELECT jobcap.reap_jobs()") if rand() < 0.1;
	my $role = pick('jc_diff_worker', 'jc_diff_worker', '"jc Diff Worker"', 'jc_diff_member',
		'jc_diff_operator');
	return ("as worker: $label", "SET ROLE $role", @inner, "RESET ROLE");
}

# ---- running and comparing ------------------------------------------------------------------

# Runs op (label, templates...) on session $i of both databases; returns false on a difference.
sub apply_op
{
	my ($i, $label, @templates) = @_;
	my %outcome;
	for my $db (qw(ref dut))
	{
		my ($out, $err) = send_sql($sessions{$db}[$i], map { expand($db, $_) } @templates);
		$outcome{$db} = normalise($db, $out, $err);
	}
	$compared++;
	my ($kind) = $label =~ /^((?:as worker|repeatable read): \S+|\S+)/;
	$tally{"$kind $_"}++ for $outcome{ref} =~ /#SQLSTATE (\w+)/g;
	my $rows = () = $outcome{ref} =~ /^C\|/mg;
	$tally{"$kind rows"} += $rows if $rows;
	# A settle that went through: the job is no longer running.
	if ($outcome{ref} !~ /#SQLSTATE (?!00000)/
		&& $label =~ /^(?:as worker: )?(?:complete_job|complete_jobs|fail_job|crash_job|release_job|complete_and_claim) ([\d,]+)/)
	{
		delete $live{$_} for split /,/, $1;
	}
	if ($outcome{ref} =~ /#SQLSTATE 55P03/ || $outcome{dut} =~ /#SQLSTATE 55P03/)
	{
		# The driver let an operation wait for another session's lock: its bug, not a path's.
		$failure = "operation '$label' in session $i waited for a lock (lock_timeout)";
		return 0;
	}
	note("$label: " . join(' ', split /\n/, $outcome{ref})) if $show_outcomes;
	return 1 if $outcome{ref} eq $outcome{dut};
	$failure = "operation '$label' in session $i differs:\n"
	  . "statements: " . join('; ', map { expand('ref', $_) } @templates) . "\n"
	  . "--- ref (sql)\n$outcome{ref}\n--- dut (direct)\n$outcome{dut}\n";
	return 0;
}

# Every table's state, normalised: timestamps by rank among the database's timestamps (they
# differ legitimately between the databases), except run_at in the future, which is only that
# (a retry's backoff is random: jitter), fences by the call that handed them out (in state_of),
# history rows by their order among the job's (seq follows physical order in statements that
# change several jobs), the rest as is.
my $state_query = q{
WITH ts AS (
    SELECT DISTINCT v FROM (
        SELECT unnest(ARRAY[CASE WHEN run_at <= now() THEN run_at END, lease_expires_at, enqueued_at, first_claimed_at,
                            claimed_at, finished_at]) AS v FROM jobcap.jobs
        UNION ALL SELECT at FROM jobcap.job_errors) t
     WHERE v IS NOT NULL),
tr AS (SELECT v, dense_rank() OVER (ORDER BY v) AS k FROM ts)
SELECT 'job', j.job_id, j.queue, j.state::text, j.priority,
       CASE WHEN j.run_at > now() THEN 'future' ELSE (SELECT k FROM tr WHERE v = j.run_at)::text END,
       j.attempts, j.max_attempts, j.fence, j.lease,
       (SELECT k FROM tr WHERE v = j.lease_expires_at), j.worker, j.dedupe_key,
       (SELECT k FROM tr WHERE v = j.enqueued_at), (SELECT k FROM tr WHERE v = j.first_claimed_at),
       (SELECT k FROM tr WHERE v = j.claimed_at), (SELECT k FROM tr WHERE v = j.finished_at),
       j.payload, j.cap_epoch, j.output || jsonb_build_object('concurrency_key', j.concurrency_key)
  FROM jobcap.jobs j
UNION ALL
SELECT 'error', e.job_id, e.queue, e.kind, e.attempt, (SELECT k FROM tr WHERE v = e.at)::text,
       row_number() OVER (PARTITION BY e.job_id ORDER BY e.seq),
       NULL, e.fence, NULL, NULL, e.worker, e.error,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM jobcap.job_errors e
UNION ALL
SELECT 'queue', NULL, q.queue, NULL, q.max_attempts,
       (SELECT sum(c) FROM jobcap.queue_rates r, unnest(r.counts) c WHERE r.queue = q.queue)::text,
       q.max_running, q.rate_limit, q.cap_epoch,
       q.lease, NULL, q.paused::text,
       q.backoff_base || '/' || q.backoff_max || '/' || q.fairness || '/'
         || coalesce((SELECT t.last_key FROM jobcap.queue_turns t
                       WHERE t.queue = q.queue), 'no turn'),
       q.max_running_per_key, NULL, NULL, NULL, NULL, NULL, NULL
  FROM jobcap.queues q
UNION ALL
SELECT 'grant', NULL, g.queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, g.grantee,
       g.granted_by, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM jobcap.queue_grants g
ORDER BY 1, 2, 3, 7, 12};

sub state_of
{
	my ($db) = @_;
	my @rows = map { [ split /\|/, $_, -1 ] } split /\n/, $node->safe_psql($db, $state_query);
	# Field 8 of a job or an error row is the fence, field 1 the job: a fence is named by the
	# claim that handed it out, or (requeue_job and requeue_dead take one too) by its rank among
	# the job's fences. A statement that changes several rows (requeue_dead, reap_jobs) meets
	# them in physical order, which differs between the databases: so does the order in which it
	# takes fences and history rows' seq (see $state_query).
	my @fenced = grep { $_->[0] eq 'job' || $_->[0] eq 'error' } @rows;
	my %of_job;
	$of_job{ $_->[1] }{ $_->[8] } = 1 for @fenced;
	for my $job (keys %of_job)
	{
		my $k = 0;
		$of_job{$job}{$_} = $k++ for sort { $a <=> $b } keys %{ $of_job{$job} };
	}
	$_->[8] = $fence_call{$db}{ $_->[8] } // "job fence #$of_job{ $_->[1] }{ $_->[8] }" for @fenced;
	return join("\n", map { join('|', @$_) } @rows);
}

# Starts a sequence from an empty database (identities restarted, so job ids match).
# Indexes a DBA might add to jobcap.jobs (one per sequence, or none): the direct path keeps every
# index of the table (the one on lease_expires_at makes heartbeats non-HOT; the unique one is
# checked on every claim; the partial one has a predicate of its own to evaluate); amcheck checks
# them after the sequence. (An index on an expression sends every call to the SQL path:
# sql/direct_index_exprs.sql.)
my @extra_indexes = (
	'',
	'CREATE INDEX diff_worker ON jobcap.jobs (worker)',
	'CREATE INDEX diff_lease ON jobcap.jobs (lease_expires_at)',
	"CREATE INDEX diff_partial ON jobcap.jobs (queue, attempts) WHERE state = 'running' AND attempts > 1",
	"CREATE UNIQUE INDEX diff_unique ON jobcap.jobs (fence) WHERE state = 'running'");
my %extra_used;

sub reset_and_setup
{
	my @setup = @_;
	my $extra = pick(@extra_indexes);
	$extra_used{ $extra =~ /INDEX (\w+)/ ? $1 : 'none' }++;
	for my $db (qw(ref dut))
	{
		$node->safe_psql($db, 'TRUNCATE jobcap.jobs, jobcap.job_errors, jobcap.queue_grants,'
			  . ' jobcap.queues RESTART IDENTITY CASCADE;'
			  . join('', map { "DROP INDEX IF EXISTS jobcap.$_;" } qw(diff_worker diff_lease diff_partial diff_unique))
			  . $extra);
		my ($out, $err) = send_sql($sessions{$db}[0], @setup);
		die "setup failed in $db: $err" if $out =~ /#SQLSTATE (?!00000)/;
	}
	%tickets = (ref => [], dut => []);
	%fence_call = (ref => {}, dut => {});
	@ticket_job = ();
	%latest = ();
	%live = ();
}

# A concurrent block: sessions 1 and 2 open transactions (one or both, at random moments) and
# claim, settle, heartbeat and assert in them, while the other sessions claim past their locks
# (SKIP LOCKED) and settle other jobs; each transaction ends in COMMIT or ROLLBACK. No operation
# touches a job another open transaction may hold locked (it would wait), and claims in this
# block skip capped queues (their claims lock the queue's row).
sub concurrent_block
{
	my %open;    # session -> the jobs its open transaction may hold locked
	for (1 .. 3 + int(rand(10)))
	{
		my $i = pick(0, 1, 2);
		if ($i != 0 && !$open{$i} && rand() < 0.5)
		{
			return 0 unless apply_op($i, "BEGIN (session $i)", 'BEGIN');
			$open{$i} = {};
			next;
		}
		my %avoid = map { %{ $open{$_} } } grep { $_ != $i } keys %open;
		%touched = ();
		my $first = scalar @{ $tickets{ref} };
		return 0 unless apply_op($i, random_op(1, $open{$i} ? 1 : 0, %avoid));
		if ($open{$i})
		{
			$open{$i}{$_} = 1 for keys %touched, map { $ticket_job[$_] } $first .. $#{ $tickets{ref} };
			if (rand() < 0.2)
			{
				my $end = pick('COMMIT', 'ROLLBACK');
				return 0 unless apply_op($i, "$end (session $i)", $end);
				delete $open{$i};
			}
		}
	}
	for my $i (sort keys %open)
	{
		my $end = pick('COMMIT', 'ROLLBACK');
		return 0 unless apply_op($i, "$end (session $i)", $end);
	}
	return 1;
}

# Sequence 0 is scripted: the cases a random sequence meets only by luck. A transaction claims a
# job again after releasing it and after failing it (its own locked, pending row), settles it
# twice; another session claims past its locks; complete_jobs gets a pair twice and a stale
# pair; a heartbeat asks for less than the lease left; a fence asserted in an open transaction
# keeps its expired job from the reaper until that transaction ends.
my @script_setup = (
	"SELECT jobcap.create_queue('qa', max_attempts => 3, backoff_base => '0', backoff_max => '0')",
	"SELECT jobcap.create_queue('qb', max_attempts => 2, lease => '10 minutes', backoff_base => '0', backoff_max => '0')",
	"SELECT jobcap.enqueue_job('qa', '{\"n\": 1}', run_at => now() - interval '1 minute')",
	"SELECT jobcap.enqueue_job('qa', '{\"n\": 2}', run_at => now() - interval '1 minute', priority => 1)",
	"SELECT jobcap.enqueue_job('qa', '{\"n\": 3}', run_at => now() - interval '1 minute')",
	"SELECT jobcap.enqueue_job('qb', '{\"n\": 4}', run_at => now() - interval '1 minute')",
	"SELECT jobcap.enqueue_job('qb', '{\"n\": 5}', run_at => now() - interval '1 minute')");
my $claim_qa = "$claim_cols FROM jobcap.claim_job('qa', 'w', %d)";
my @script = (
	[ 1, 'BEGIN' ],
	[ 1, 'claim_job qa', sprintf($claim_qa, 1) ],                      # job 1: T0
	[ 1, 'release_job 1', 'SELECT jobcap.release_job(1, {F:0})' ],
	[ 1, 'claim_job qa', sprintf($claim_qa, 1) ],                      # job 1 again: T1
	[ 1, 'fail_job 1', "SELECT jobcap.fail_job(1, {F:1}, 'x', '0')" ],
	[ 1, 'claim_job qa', sprintf($claim_qa, 2) ],                      # jobs 3, 1: T2, T3
	[ 0, 'claim_job qa', sprintf($claim_qa, 3) ],                      # job 2 only: T4
	[ 1, 'complete_job 1', 'SELECT jobcap.complete_job(1, {F:3})' ],
	[ 1, 'complete_job 1', 'SELECT jobcap.complete_job(1, {F:3})' ],   # JC001
	[ 1, 'ROLLBACK' ],
	[ 0, 'claim_job qa', sprintf($claim_qa, 3) ],                      # jobs 1, 3: T5, T6
	[ 0, 'complete_jobs 1', 'SELECT jobcap.complete_jobs(ARRAY[1, 1], ARRAY[{F:5}, {F:5}])' ],
	[ 0, 'complete_jobs 3', 'SELECT jobcap.complete_jobs(ARRAY[3, 3], ARRAY[{F:6}, {F:3}])' ],
	[ 0, 'heartbeat 3', "SELECT jobcap.heartbeat(3, {F:6}, '1 minute') IS NOT NULL" ],
	[ 0, 'expire 3', "UPDATE jobcap.jobs SET lease_expires_at = '2000-01-01 00:00:00+00' WHERE job_id = 3" ],
	[ 1, 'BEGIN' ],
	[ 1, 'assert_fence 3', 'SELECT jobcap.assert_fence(3, {F:6})' ],
	[ 0, 'reap', 'SELECT job_id, queue, outcome FROM jobcap.reap_jobs() ORDER BY job_id' ],
	[ 1, 'heartbeat 3', 'SELECT jobcap.heartbeat(3, {F:6}) IS NOT NULL' ],
	[ 1, 'COMMIT' ],
	[ 0, 'expire 3', "UPDATE jobcap.jobs SET lease_expires_at = '2000-01-01 00:00:00+00' WHERE job_id = 3" ],
	[ 0, 'reap', 'SELECT job_id, queue, outcome FROM jobcap.reap_jobs() ORDER BY job_id' ],
	[ 0, 'complete_and_claim 2', "$claim_cols FROM jobcap.complete_and_claim(2, {F:4}, 'qa', 'w', 2)" ],
	[ 0, 'claim_job_by_id 4', "$claim_cols FROM jobcap.claim_job_by_id(4, 'w')" ],
	[ 0, 'complete_job 4', 'SELECT jobcap.complete_job(4, {F:0})' ],     # stale: JC001
	[ 0, 'heartbeat 4', "SELECT jobcap.heartbeat(4, {F:-1}, '1 hour') IS NOT NULL" ],
	[ 0, 'repeatable read: claim_job qb', 'BEGIN ISOLATION LEVEL REPEATABLE READ',
		"$claim_cols FROM jobcap.claim_job('qb', 'w')", 'COMMIT' ]);

my $sequences_run = 0;
SEQUENCE: for my $n (0 .. $sequences)
{
	reset_and_setup($n == 0 ? @script_setup : start_state());
	if ($n == 0)
	{
		local $show_outcomes = 1;
		for my $step (@script)
		{
			my ($i, $label, @templates) = @$step;
			@templates = ($label) unless @templates;
			last SEQUENCE unless apply_op($i, $label, @templates);
		}
	}
	my $ops = $n == 0 ? 0 : int($ops_per_sequence / 2) + int(rand($ops_per_sequence));
	for (1 .. $ops)
	{
		my $ok =
		  rand() < 0.15
		  ? concurrent_block()
		  : apply_op(0, random_op(0, 0));
		last SEQUENCE unless $ok;
	}
	# The indexes of jobcap.jobs hold every row they should (the direct path inserts their
	# entries itself): amcheck's heapallindexed check.
	for my $db (qw(ref dut))
	{
		my ($rc, $out, $err) = $node->psql($db,
			"SELECT bt_index_check(indexrelid, true) FROM pg_index WHERE indrelid = 'jobcap.jobs'::regclass");
		next if $rc == 0;
		$failure = "after sequence $n an index of jobcap.jobs in $db fails amcheck: $err";
		last SEQUENCE;
	}
	my %state = map { $_ => state_of($_) } qw(ref dut);
	if ($state{ref} ne $state{dut})
	{
		my @r = split /\n/, $state{ref};
		my @d = split /\n/, $state{dut};
		my $i = 0;
		$i++ while $i < @r && $i < @d && $r[$i] eq $d[$i];
		# Both states whole, for a closer look.
		for my $db (qw(ref dut))
		{
			PostgreSQL::Test::Utils::append_to_file(
				"$PostgreSQL::Test::Utils::tmp_check/differential_state_$db.txt", $state{$db});
		}
		$failure = "state after sequence $n differs, first at row $i"
		  . " (both whole in tmp_check/differential_state_*.txt):\n"
		  . "--- ref (sql)\n" . ($r[$i] // '(none)') . "\n--- dut (direct)\n" . ($d[$i] // '(none)') . "\n";
		last SEQUENCE;
	}
	$sequences_run++;
}

ok(!defined $failure, 'the direct path and the SQL path give the same outcomes and states')
  or diag("seed $seed: $failure");
diag("differential: $sequences_run sequences, $compared operations compared, "
	  . ($failure ? 'a difference found' : 'all states equal'));

note("extra indexes: " . join(', ', map { "$_ $extra_used{$_}" } sort keys %extra_used));
note("outcomes: " . join(', ', map { "$_ $tally{$_}" } sort keys %tally));

# The comparison compared the two paths: dut's hot calls took the direct path, ref's never.
for my $f (qw(claim_job complete_and_claim complete_job complete_jobs heartbeat assert_fence fail_job crash_job enqueue_job
	enqueue_jobs))
{
	ok(($served{dut}{$f}{direct} // 0) > 0,
		"dut: $f took the direct path ($served{dut}{$f}{direct} times)")
	  or diag(explain($served{dut}{$f}));
	is($served{ref}{$f}{direct} // 0, 0, "ref: $f never took the direct path");
	is($served{dut}{$f}{SQL} // 0, 0,
		"dut: $f took the SQL path only in REPEATABLE READ or after switching to it");
}
ok((grep { $_->{'SQL (repeatable read)'} } values %{ $served{dut} }) > 0,
	'dut: calls in REPEATABLE READ took the SQL path');
for my $db (qw(ref dut))
{
	note("$db: " . join(', ', map {
		my $f = $_;
		"$f " . join('/', map { "$_ $served{$db}{$f}{$_}" } sort keys %{ $served{$db}{$f} })
	} sort keys %{ $served{$db} }));
}

for my $db (qw(ref dut))
{
	$_->{in} .= "\\q\n" for @{ $sessions{$db} };
	$_->{run}->finish for @{ $sessions{$db} };
}
$node->stop;
done_testing();
