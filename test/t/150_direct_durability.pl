# Nothing the executor did goes missing on the direct path (jobcap.hot_path = direct, the
# default; src/direct/direct.hpp):
#  1. its claims, completions and heartbeats survive a crash (pg_ctl stop -m immediate) exactly,
#     and those of a transaction open at the crash are gone after it;
#  2. a streaming standby replays them row for row;
#  3. logical decoding sees the same row changes as for the SQL statements (hot_path = sql);
#  4. heartbeats stay HOT, and the statistics count what the SQL path counts;
#  5. whatever only the executor (or the rewriter) does sends the calls to the SQL path or is done
#     on the direct path too: triggers, row security, a transaction snapshot, CHECK constraints,
#     stored generated columns, rules, the replica identity check, indexes a DBA adds.
# amcheck checks every btree index of jobcap.jobs with its heap (heapallindexed) and the heap
# itself (verify_heapam) after the crash, on the primary and on the standby; WAL is written with
# wal_consistency_checking, so every replayed page is compared with the one the primary wrote.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# Every session below says which path served each call (DEBUG2, src/direct/shape.cpp).
my $direct = "SET jobcap.hot_path = direct; SET client_min_messages = debug2;\n";

# The paths named in a session's messages: "claim_job direct, heartbeat SQL, ...".
sub paths_in
{
	my ($stderr) = @_;
	my @said;
	while ($stderr =~ /jobcap: (\w+) takes the (direct|SQL) path/g)
	{
		push @said, "$1 $2";
	}
	return join(', ', @said);
}

# Runs $sql in a session of its own on the direct path; returns (stdout, the paths it said).
sub run_direct
{
	my ($node, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql($db, $direct . $sql, stdout => \$out, stderr => \$err, on_error_die => 1);
	return ($out, paths_in($err));
}

# Runs $sql in the long-lived session $s; returns (stdout, the paths it said, its messages).
sub in_session
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	my $out = $s->query($sql);
	my $err = $s->{stderr};
	$s->{stderr} = '';
	die "query failed: $err" if $err =~ /ERROR:/;
	return ($out, paths_in($err), $err);
}

# Every row of jobcap.jobs, whole, in job order.
sub jobs_rows
{
	my ($node, $db) = @_;
	return $node->safe_psql($db,
		"SELECT string_agg(j::text, E'\\n' ORDER BY job_id) FROM jobcap.jobs j");
}

# amcheck on every btree index of jobcap.jobs, heap included (every live tuple has its entries);
# parent also checks the levels against each other (needs a ShareLock: not on a standby).
# Returns the names of the indexes checked, or the error amcheck raised.
sub check_indexes
{
	my ($node, $db, $parent) = @_;
	my $check = $parent ? 'bt_index_parent_check' : 'bt_index_check';
	my ($rc, $stdout, $stderr) = $node->psql($db, qq{
        SELECT string_agg(c.relname, ',' ORDER BY c.relname)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid,
               LATERAL (SELECT $check(i.indexrelid, true)) x
         WHERE i.indrelid = 'jobcap.jobs'::regclass AND c.relam = (SELECT oid FROM pg_am WHERE amname = 'btree')});
	return $rc == 0 ? $stdout : $stderr;
}

# amcheck's verify_heapam on jobcap.jobs: its problems (HOT chains, xmin/xmax, TOAST), or ''.
sub check_heap
{
	my ($node, $db) = @_;
	return $node->safe_psql($db, q{
        SELECT string_agg(blkno || '/' || offnum || ': ' || msg, E'\n')
          FROM verify_heapam('jobcap.jobs', check_toast => true)});
}

# One job of queue $q by its place in the queue (0: the first enqueued): "job_id, fence" of it,
# as a FROM item "j".
sub nth
{
	my ($q, $k) = @_;
	return "(SELECT job_id, fence FROM jobcap.jobs WHERE queue = '$q' ORDER BY job_id OFFSET $k LIMIT 1) j";
}

my $consistency = "'heap,heap2,btree'";

###############################################################################
# 1. Crash recovery.
###############################################################################
my $node = jobcap_node('crash', wal_consistency_checking => $consistency);
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    CREATE EXTENSION amcheck;
    SELECT jobcap.create_queue('c', max_attempts => 5, lease => '1 hour',
                               backoff_base => '0', backoff_max => '0');
    SELECT count(jobcap.enqueue_job('c', jsonb_build_object('n', n))) FROM generate_series(1, 12) n;
    SELECT jobcap.create_queue('c2', max_attempts => 5, lease => '1 hour');
});

my ($out, $said) = run_direct($node, 'postgres',
	"SELECT string_agg(job_id || ':' || attempt, ' ' ORDER BY job_id) FROM jobcap.claim_job('c', 'w1', 4)");
is($out, '1:1 2:1 3:1 4:1', 'committed: four jobs claimed');
is($said, 'claim_job direct', 'on the direct path');
(undef, $said) = run_direct($node, 'postgres', q{
    SELECT jobcap.complete_job(j.job_id, j.fence, '{"r": 1}') FROM } . nth('c', 0) . q{;
    SELECT jobcap.complete_jobs(array_agg(job_id ORDER BY job_id), array_agg(fence ORDER BY job_id))
      FROM jobcap.jobs WHERE job_id IN (2, 3);
    SELECT jobcap.heartbeat(j.job_id, j.fence, '2 hours') FROM } . nth('c', 3) . q{;
    BEGIN;
    SELECT count(*) FROM jobcap.complete_and_claim(4, (SELECT fence FROM jobcap.jobs WHERE job_id = 4),
                                                   'c', 'w2', 2, output => '{"r": 4}');
    SELECT jobcap.assert_fence(j.job_id, j.fence) FROM } . nth('c', 4) . q{;
    SELECT jobcap.heartbeat(j.job_id, j.fence) FROM } . nth('c', 5) . q{;
    COMMIT;
});
is($said, 'complete_job direct, complete_jobs direct, heartbeat direct, complete_and_claim direct, '
	. 'complete_and_claim direct, assert_fence direct, heartbeat direct',
	'committed: a completion, a batch completion, heartbeats, complete_and_claim, assert_fence, all direct');
# Enqueues (a batch: heap_multi_insert) and failures (their history rows) on queue c2.
(undef, $said) = run_direct($node, 'postgres', q{
    SELECT cardinality(jobcap.enqueue_jobs('c2', ARRAY['{"m": 1}', '{"m": 2}', '{"m": 3}']::jsonb[]));
    SELECT count(*) FROM jobcap.claim_job('c2', 'w5', 2);
    SELECT jobcap.fail_job(j.job_id, j.fence, 'boom', retry_in => '1 hour') FROM } . nth('c2', 0) . q{;
    SELECT jobcap.crash_job(j.job_id, j.fence, 'oom') FROM } . nth('c2', 1) . q{;
});
is($said, 'enqueue_jobs direct, claim_job direct, fail_job direct, crash_job direct',
	'committed: a batch enqueue, a failure and a crash, all direct');
$node->safe_psql('postgres', 'CHECKPOINT');

# After the checkpoint: replayed from WAL.
(undef, $said) = run_direct($node, 'postgres', q{
    SELECT count(*) FROM jobcap.claim_job('c', 'w3');
    SELECT jobcap.complete_job(j.job_id, j.fence) FROM } . nth('c', 4) . q{;
    SELECT jobcap.heartbeat(j.job_id, j.fence, '3 hours') FROM } . nth('c', 5) . q{;
});
is($said, 'claim_job direct, complete_job direct, heartbeat direct',
	'committed after the checkpoint: a claim, a completion, a heartbeat');

# An open transaction claims two jobs, completes job 6 and extends job 7's lease; a checkpoint
# writes those uncommitted versions to disk; another session commits a claim after it.
my $open = $node->background_psql('postgres', on_error_stop => 0);
my $open_said;
(undef, $open_said) = in_session($open, $direct . q{
    BEGIN;
    SELECT count(*) FROM jobcap.claim_job('c', 'open', 2);
    SELECT jobcap.complete_job(j.job_id, j.fence) FROM } . nth('c', 5) . q{;
    SELECT jobcap.heartbeat(j.job_id, j.fence, '5 hours') FROM } . nth('c', 6) . q{;
    SELECT cardinality(jobcap.enqueue_jobs('c2', ARRAY['{"open": 1}', '{"open": 2}']::jsonb[]));
    SELECT jobcap.enqueue_job('c2', '{"open": 3}') > 0;
    SELECT count(*) FROM jobcap.claim_job('c2', 'open');
    SELECT jobcap.fail_job(j.job_id, j.fence, 'open') FROM } . nth('c2', 2) . q{;});
is($open_said, 'claim_job direct, complete_job direct, heartbeat direct, enqueue_jobs direct, '
	. 'enqueue_job direct, claim_job direct, fail_job direct',
	'an open transaction claims, completes, heartbeats, enqueues and fails on the direct path');
is($node->safe_psql('postgres', "SELECT string_agg(job_id::text, ' ' ORDER BY job_id) FROM jobcap.jobs
                                  WHERE worker = 'open'"), '', 'its claims are not visible to others');
$node->safe_psql('postgres', 'CHECKPOINT');
($out, $said) = run_direct($node, 'postgres',
	"SELECT string_agg(job_id::text, ' ') FROM jobcap.claim_job('c', 'w4')");
is($out, '10', 'a claim committed after it skips the two locked jobs');

my $before = jobs_rows($node, 'postgres');
my $history = q{SELECT string_agg(e::text, E'\n' ORDER BY seq) FROM jobcap.job_errors e};
my $history_before = $node->safe_psql('postgres', $history);
my $max_fence = $node->safe_psql('postgres', 'SELECT max(fence) FROM jobcap.jobs');
is($node->safe_psql('postgres', "SELECT string_agg(job_id || ' ' || state || ' ' || attempts, ', ' ORDER BY job_id)
                                    FROM jobcap.jobs WHERE job_id IN (6, 7, 8, 9)"),
	'6 running 1, 7 running 1, 8 pending 0, 9 pending 0', 'before the crash, as committed');

my $log_offset = -s $node->logfile;
$node->stop('immediate');
eval { $open->quit };
$node->start;
like(slurp_file($node->logfile, $log_offset),
	qr/database system was not properly shut down; automatic recovery in progress/, 'crash recovery ran');
unlike(slurp_file($node->logfile, $log_offset), qr/inconsistent page found/,
	'wal_consistency_checking found every replayed page as written');

is(jobs_rows($node, 'postgres'), $before,
	'every committed claim, completion and heartbeat survived exactly (every column of every job)');
is($node->safe_psql('postgres', "SELECT string_agg(job_id || ' ' || state || ' ' || attempts || ' ' || fence, ', ' ORDER BY job_id)
                                   FROM jobcap.jobs WHERE job_id IN (8, 9)"),
	'8 pending 0 0, 9 pending 0 0', 'the uncommitted claims are gone: pending, attempts and fences as before');
is($node->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE worker = 'open'"), '0',
	'nothing of the open transaction is left');
is($node->safe_psql('postgres', $history), $history_before,
	'the committed history survived exactly, the open transaction\'s failure is gone');
is($node->safe_psql('postgres', "SELECT count(*) || ' ' || count(*) FILTER (WHERE payload ? 'open')
                                   FROM jobcap.jobs WHERE queue = 'c2'"), '3 0',
	'the committed batch enqueue is there, the open transaction\'s enqueues are not');
is($node->safe_psql('postgres', q{
    SELECT string_agg(c.relname, ',' ORDER BY c.relname)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid,
           LATERAL (SELECT bt_index_parent_check(i.indexrelid, true)) x
     WHERE i.indrelid = 'jobcap.job_errors'::regclass}), 'job_errors_at,job_errors_job,job_errors_pkey',
	'amcheck (parent, heapallindexed) on the indexes of jobcap.job_errors');

is(check_heap($node, 'postgres'), '', 'verify_heapam finds nothing wrong in jobcap.jobs');
my $checked = check_indexes($node, 'postgres', 1);
like($checked, qr/^jobs_claim,.*jobs_pkey.*jobs_running,jobs_start_by,jobs_waiting$/, "amcheck (parent, heapallindexed): $checked");
is($node->safe_psql('postgres', q{
    SET enable_seqscan = off; SET enable_bitmapscan = off;
    SELECT string_agg(job_id::text, ' ' ORDER BY priority, run_at, job_id)
      FROM jobcap.jobs WHERE queue = 'c' AND state = 'pending'}), '8 9 11 12',
	'the claim index finds the pending jobs');

($out, $said) = run_direct($node, 'postgres', q{
    SELECT string_agg(job_id || ':' || attempt || ':' || (fence > } . $max_fence . q{), ' ' ORDER BY job_id)
      FROM jobcap.claim_job('c', 'after', 3)});
is($out, '8:1:true 9:1:true 11:1:true', 'after recovery the direct claim finds them again, with new fences');
is($said, 'claim_job direct', 'on the direct path');
like(check_indexes($node, 'postgres', 1), qr/^jobs_claim,.*jobs_running,jobs_start_by,jobs_waiting$/,
	'amcheck after the claims that followed recovery');
$node->stop;

###############################################################################
# 2-5 on a primary with wal_level = logical and a streaming standby.
###############################################################################
my $primary = jobcap_node('primary', allows_streaming => 'logical', wal_keep_size => "'2GB'",
	wal_consistency_checking => $consistency);
$primary->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    CREATE EXTENSION amcheck;
    CREATE DATABASE dec;
});
# Database dec has no reaper (jobcap.database = 'postgres'): only these sessions write there.
$primary->safe_psql('dec', q{
    CREATE EXTENSION jobcap;
    CREATE EXTENSION amcheck;
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;

###############################################################################
# 3 and 4. Logical decoding and statistics: the same operations on the SQL path (queue sq)
# and on the direct path (queue dq), on identical jobs.
###############################################################################
$primary->safe_psql('dec', q{
    SELECT jobcap.create_queue(q, max_attempts => 3, lease => '1 hour', backoff_base => '0', backoff_max => '0')
      FROM unnest(ARRAY['sq', 'dq']) q;
    SELECT count(jobcap.enqueue_job(q, jsonb_build_object('n', n), priority => n % 2))
      FROM unnest(ARRAY['sq', 'dq']) q, generate_series(1, 6) n;
    -- Old versions decoded whole too.
    ALTER TABLE jobcap.jobs REPLICA IDENTITY FULL;
    SELECT 'slot' FROM pg_create_logical_replication_slot('dec', 'test_decoding');
});

# The first running job of queue $q, as a FROM item "j".
sub running
{
	my ($q) = @_;
	return "(SELECT job_id, fence FROM jobcap.jobs WHERE queue = '$q' AND state = 'running' ORDER BY job_id LIMIT 1) j";
}

# The operations, on queue $q (priorities 1 0 1 0 1 0: the first claim takes the 2nd, 4th and
# 6th job); the session's path is set before.
sub operations
{
	my ($q) = @_;
	return join("\n",
		"SELECT count(*) FROM jobcap.claim_job('$q', 'w', 3);",
		"SELECT jobcap.complete_job(j.job_id, j.fence, '{\"ok\": 1}') FROM " . nth($q, 1) . ";",
		("SELECT jobcap.heartbeat(j.job_id, j.fence, '2 hours') IS NOT NULL FROM " . nth($q, 3) . ";") x 3,
		"SELECT jobcap.complete_jobs(array_agg(job_id ORDER BY job_id), array_agg(fence ORDER BY job_id),"
		  . " array_agg(jsonb_build_object('id', job_id - (SELECT min(job_id) FROM jobcap.jobs WHERE queue = '$q')) ORDER BY job_id))"
		  . " FROM jobcap.jobs WHERE queue = '$q' AND state = 'running';",
		"SELECT count(*) FROM jobcap.claim_job('$q', 'w');",
		"SELECT count(*) FROM (SELECT job_id, fence FROM jobcap.jobs WHERE queue = '$q' AND state = 'running') j, "
		  . "jobcap.complete_and_claim(j.job_id, j.fence, '$q', 'w', 2) c;",
		"BEGIN;",
		"SELECT jobcap.assert_fence(j.job_id, j.fence) FROM " . running($q) . ";",
		"SELECT jobcap.heartbeat(j.job_id, j.fence) IS NOT NULL FROM " . running($q) . ";",
		"COMMIT;",
		"BEGIN;",
		"SELECT jobcap.complete_job(j.job_id, j.fence) FROM " . running($q) . ";",
		"ROLLBACK;",
		"SELECT jobcap.complete_job(j.job_id, j.fence) FROM (SELECT job_id, fence FROM jobcap.jobs"
		  . " WHERE queue = '$q' AND state = 'running' ORDER BY job_id) j;",
		"SELECT pg_stat_force_next_flush();");
}

# What the slot decoded since last time, normalised: the queue named Q, job ids counted from
# the queue's first, fences by their rank, no transaction ids, and a timestamp as null, as
# "same" when the old version had the same (the old tuple: the previous decoded version), else
# as T.
sub decoded
{
	my ($q) = @_;
	my %last;
	my $first = $primary->safe_psql('dec', "SELECT min(job_id) FROM jobcap.jobs WHERE queue = '$q'");
	my @lines = split /\n/, $primary->safe_psql('dec', q{
        SELECT data FROM pg_logical_slot_get_changes('dec', NULL, NULL,
                                                     'include-xids', '0', 'skip-empty-xacts', '1')});
	my (%fences, %seqs, @out);
	for my $line (@lines)
	{
		if ($line !~ /^table (\S+): (\w+): (.*)$/)
		{
			push @out, $line;
			next;
		}
		my ($table, $action, $cols) = ($1, $2, $3);
		my @cols;
		my ($row) = $cols =~ /job_id\[bigint\]:(\d+)/;
		$row //= '';
		my $was = $last{"$table $row"} //= {};
		my %now;
		while ($cols =~ /(\w+)\[([^\]]+)\]:('(?:[^']|'')*'|\S+)/g)
		{
			my ($name, $type, $value) = ($1, $2, $3);
			# The new tuple's value against the old one's (REPLICA IDENTITY FULL decodes it
			# first, without its nulls), the old one's against the previous decoded version.
			my $ref = exists $now{$name} ? $now{$name} : $was->{$name};
			$now{$name} = $value;
			if ($value eq 'null') { }
			elsif ($type =~ /^timestamp/)
			{
				$value = (defined $ref && $ref eq $value) ? 'same' : 'T';
			}
			elsif ($name eq 'job_id') { $value -= $first; }
			elsif ($name eq 'queue' && $value eq "'$q'") { $value = "'Q'"; }
			elsif ($name eq 'fence' && $value ne '0')
			{
				$fences{$value} //= 'F' . (scalar(keys %fences) + 1);
				$value = $fences{$value};
			}
			elsif ($name eq 'seq')    # job_errors' identity, by rank
			{
				$seqs{$value} //= 'S' . (scalar(keys %seqs) + 1);
				$value = $seqs{$value};
			}
			push @cols, "$name=$value";
		}
		$last{"$table $row"} = \%now;
		push @out, "$table $action " . join(' ', @cols);
	}
	return \@out;
}

sub counts
{
	return $primary->safe_psql('dec',
		"SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass");
}

my $slot_start = decoded('sq');    # the enqueues
my @sql_counts = split / /, counts();
my ($sql_out, $sql_err) = ('', '');
$primary->psql('dec', "SET jobcap.hot_path = sql; SET client_min_messages = debug2;\n" . operations('sq'),
	stdout => \$sql_out, stderr => \$sql_err, on_error_die => 1);
my $sql_decoded = decoded('sq');
my @sql_after = split / /, counts();
# Pages pruned and frozen alike before the second run.
$primary->safe_psql('dec', 'VACUUM jobcap.jobs');
my @direct_counts = split / /, counts();
my ($direct_out, $direct_err) = ('', '');
$primary->psql('dec', $direct . operations('dq'),
	stdout => \$direct_out, stderr => \$direct_err, on_error_die => 1);
my $direct_decoded = decoded('dq');
my @direct_after = split / /, counts();

unlike(paths_in($sql_err), qr/direct/, 'hot_path = sql: no call took the direct path');
unlike(paths_in($direct_err), qr/SQL/, 'hot_path = direct: every call took the direct path');
like(paths_in($direct_err), qr/^claim_job direct, complete_job direct, heartbeat direct.*complete_jobs direct.*complete_and_claim direct.*assert_fence direct/,
	'hot_path = direct: claims, completions, heartbeats, complete_and_claim and assert_fence');
is($direct_out, $sql_out, 'both paths returned the same');
is(scalar(grep { /^jobcap\.jobs UPDATE/ } @$direct_decoded), 16,
	'the slot decoded 16 updates of jobcap.jobs on the direct path (6 claims, 6 completions, 4 heartbeats)');
is_deeply($direct_decoded, $sql_decoded, 'logical decoding: the same changes, column by column, on both paths');
note "decoded on the direct path:\n" . join("\n", @$direct_decoded);

# Enqueues (one, and a batch: heap_multi_insert) and failures (a retry, a crash, a death with
# the history pruned to jobcap.error_history = 1 row), on queue se (SQL) and de (direct).
$primary->safe_psql('dec', q{
    SELECT jobcap.create_queue(q, max_attempts => 2, lease => '1 hour', backoff_base => '0', backoff_max => '0')
      FROM unnest(ARRAY['se', 'de']) q;
});
decoded('se');    # what came before
sub failures
{
	my ($q) = @_;
	return join("\n",
		"SELECT cardinality(jobcap.enqueue_jobs('$q', ARRAY['{\"a\": 1}', '{\"a\": 2}', '{\"a\": 3}']::jsonb[]));",
		"SELECT jobcap.enqueue_job('$q', '{\"b\": 1}', priority => 1) IS NOT NULL;",
		"SELECT count(*) FROM jobcap.claim_job('$q', 'w', 4);",
		"SELECT jobcap.fail_job(j.job_id, j.fence, 'boom') FROM " . nth($q, 0) . ";",
		"SELECT jobcap.crash_job(j.job_id, j.fence, 'oom') FROM " . nth($q, 1) . ";",
		"SET jobcap.error_history = 1;",
		"SELECT count(*) FROM jobcap.claim_job('$q', 'w', 2);",
		"SELECT jobcap.fail_job(j.job_id, j.fence, 'last', retry_in => '1 hour') FROM " . nth($q, 0) . ";",
		"SELECT jobcap.fail_job(j.job_id, j.fence, NULL, retry_in => '1 hour') FROM " . nth($q, 2) . ";",
		"RESET jobcap.error_history;");
}
($sql_out, $sql_err) = ('', '');
$primary->psql('dec', "SET jobcap.hot_path = sql; SET client_min_messages = debug2;\n" . failures('se'),
	stdout => \$sql_out, stderr => \$sql_err, on_error_die => 1);
$sql_decoded = decoded('se');
($direct_out, $direct_err) = ('', '');
$primary->psql('dec', $direct . failures('de'),
	stdout => \$direct_out, stderr => \$direct_err, on_error_die => 1);
$direct_decoded = decoded('de');
is(paths_in($direct_err), 'enqueue_jobs direct, enqueue_job direct, claim_job direct, fail_job direct, '
	. 'crash_job direct, claim_job direct, fail_job direct, fail_job direct',
	'hot_path = direct: the enqueues and failures took the direct path');
is($direct_out, $sql_out, 'both paths returned the same (states: pending, pending, dead, pending)');
is(scalar(grep { /^jobcap\.jobs INSERT/ } @$direct_decoded) . ' '
	. scalar(grep { /^jobcap\.job_errors INSERT/ } @$direct_decoded) . ' '
	. scalar(grep { /^jobcap\.job_errors DELETE/ } @$direct_decoded), '4 4 1',
	'the slot decoded 4 job inserts, 4 history rows and 1 pruned on the direct path');
is_deeply($direct_decoded, $sql_decoded, 'logical decoding of enqueues and failures: the same on both paths');
note "decoded on the direct path:\n" . join("\n", @$direct_decoded);

# 17 updates: 6 claims, 6 completions, 4 heartbeats and the completion that rolled back (n_tup_upd
# counts attempted updates); the 4 heartbeats are HOT (lease_expires_at is in no index).
is(($sql_after[0] - $sql_counts[0]) . ' ' . ($sql_after[1] - $sql_counts[1]), '17 4',
	'hot_path = sql: 17 updates, 4 of them HOT');
is(($direct_after[0] - $direct_counts[0]) . ' ' . ($direct_after[1] - $direct_counts[1]), '17 4',
	'hot_path = direct: 17 updates, 4 of them HOT (the heartbeats)');

# Heartbeats alone: each one HOT on the direct path (after a VACUUM, so that the page has room).
$primary->safe_psql('dec', 'VACUUM jobcap.jobs');
my @hb_before = split / /, counts();
(undef, $said) = run_direct($primary, 'dec', q{
    SELECT count(*) FROM jobcap.enqueue_job('dq', '{"hb": 1}');
    SELECT count(*) FROM jobcap.claim_job('dq', 'hb');
    SELECT jobcap.heartbeat(j.job_id, j.fence, n * interval '1 hour') IS NOT NULL
      FROM (SELECT job_id, fence FROM jobcap.jobs WHERE worker = 'hb') j, generate_series(1, 10) n;
    SELECT pg_stat_force_next_flush();
});
my @hb_after = split / /, counts();
is($said, 'enqueue_job direct, claim_job direct' . ', heartbeat direct' x 10,
	'an enqueue, a claim and ten heartbeats on the direct path');
is(($hb_after[0] - $hb_before[0]) . ' ' . ($hb_after[1] - $hb_before[1]), '11 10',
	'n_tup_upd + 11, n_tup_hot_upd + 10: every heartbeat was HOT');
$primary->safe_psql('dec', "SELECT pg_drop_replication_slot('dec')");
like(check_indexes($primary, 'dec', 1), qr/^jobs_claim,.*jobs_running,jobs_start_by,jobs_waiting$/, 'amcheck on the primary (dec)');

###############################################################################
# 5. Only the executor fires triggers, applies row security and uses a transaction snapshot:
# calls then take the SQL path, and return to the direct path when the reason is gone.
###############################################################################
$primary->safe_psql('postgres', q{
    SELECT jobcap.create_queue('t', lease => '1 hour', backoff_base => '0', backoff_max => '0');
    SELECT count(jobcap.enqueue_job('t', jsonb_build_object('n', n))) FROM generate_series(1, 20) n;
    CREATE TABLE public.trigger_log (job_id bigint, op text, old_state text, new_state text);
    CREATE FUNCTION public.log_job() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.trigger_log VALUES (NEW.job_id, TG_OP, OLD.state::text, NEW.state::text);
        RETURN NEW;
    END $$;
});
my $s = $primary->background_psql('postgres', on_error_stop => 0);
in_session($s, $direct);

# The calls: claim one, heartbeat it, complete it with complete_and_claim (claims the next),
# assert the fence of that one and complete it.
my $calls = q{
    SELECT count(*) FROM jobcap.claim_job('t', 'trig');
    SELECT jobcap.heartbeat(job_id, fence) IS NOT NULL FROM jobcap.jobs WHERE worker = 'trig' AND state = 'running';
    SELECT count(*) FROM jobcap.jobs j, jobcap.complete_and_claim(j.job_id, j.fence, 't', 'trig')
     WHERE j.worker = 'trig' AND j.state = 'running';
    BEGIN;
    SELECT jobcap.assert_fence(job_id, fence) FROM jobcap.jobs WHERE worker = 'trig' AND state = 'running';
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE worker = 'trig' AND state = 'running';
    COMMIT;
};
# complete_and_claim asks twice on the direct path (its completion, then its claim), once when
# the SQL path serves it all.
sub all_on
{
	my ($path) = @_;
	my @names = qw(claim_job heartbeat complete_and_claim complete_and_claim assert_fence complete_job);
	splice(@names, 3, 1) if $path eq 'SQL';
	return join(', ', map { "$_ $path" } @names);
}
my $logged = sub { $primary->safe_psql('postgres', 'SELECT count(*) FROM public.trigger_log') };

my ($o, $p, $err) = in_session($s, $calls);
is($p, all_on('direct'), 'without a trigger: the direct path');

$primary->safe_psql('postgres',
	'CREATE TRIGGER log_job AFTER UPDATE ON jobcap.jobs FOR EACH ROW EXECUTE FUNCTION public.log_job()');
($o, $p, $err) = in_session($s, $calls);
is($p, all_on('SQL'), 'with a user trigger on jobcap.jobs (created by another session): the SQL path');
like($err, qr/takes the SQL path: jobcap\.jobs has triggers, rules, row security/, 'and it says why');
is($logged->(), '5', 'the trigger fired for each update: claim, heartbeat, completion, claim, completion');
is($primary->safe_psql('postgres', "SELECT string_agg(old_state || '>' || new_state, ' ' ORDER BY ctid) FROM public.trigger_log"),
	'pending>running running>running running>succeeded pending>running running>succeeded', 'in order');

$primary->safe_psql('postgres', 'DROP TRIGGER log_job ON jobcap.jobs');
($o, $p, $err) = in_session($s, $calls);
is($p, all_on('direct'), 'trigger dropped: the direct path again, in the same session');
is($logged->(), '5', 'and nothing fires');

$primary->safe_psql('postgres', 'ALTER TABLE jobcap.jobs ENABLE ROW LEVEL SECURITY');
($o, $p, $err) = in_session($s, $calls);
is($p, all_on('SQL'), 'with row security enabled: the SQL path');
like($err, qr/takes the SQL path: jobcap\.jobs has triggers, rules, row security/, 'and it says why');
$primary->safe_psql('postgres', 'ALTER TABLE jobcap.jobs DISABLE ROW LEVEL SECURITY');
($o, $p, $err) = in_session($s, $calls);
is($p, all_on('direct'), 'row security disabled: the direct path again');

for my $level ('REPEATABLE READ', 'SERIALIZABLE')
{
	($o, $p, $err) = in_session($s, qq{
        BEGIN ISOLATION LEVEL $level;
        SELECT count(*) FROM jobcap.claim_job('t', 'iso');
        SELECT jobcap.heartbeat(job_id, fence) IS NOT NULL FROM jobcap.jobs WHERE worker = 'iso' AND state = 'running';
        SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE worker = 'iso' AND state = 'running';
        COMMIT;});
	is($p, 'claim_job SQL, heartbeat SQL, complete_job SQL', "$level: the SQL path");
	like($err, qr/takes the SQL path: the transaction is REPEATABLE READ or SERIALIZABLE/, 'and it says why');
}
($o, $p, $err) = in_session($s, $calls);
is($p, all_on('direct'), 'READ COMMITTED again: the direct path');
is($primary->safe_psql('postgres', "SELECT string_agg(w || ' ' || state || ' ' || n, ', ' ORDER BY w, state)
                                      FROM (SELECT coalesce(worker, 'none') w, state, count(*) n FROM jobcap.jobs
                                             WHERE queue = 't' GROUP BY 1, 2) s"),
	'iso succeeded 2, none pending 6, trig succeeded 12',
	'every call did its work on whichever path');

# Indexes a DBA adds while the session has learned the table's: the direct path writes their
# entries too. One on lease_expires_at makes heartbeats non-HOT; a partial one of its own; one
# built CONCURRENTLY; then a hash index (not a btree: the direct path lets the executor's
# ExecInsertIndexTuples do the entries). An index on an expression would send the calls to the
# SQL path (sql/direct_index_exprs.sql).
$primary->safe_psql('postgres', q{
    SELECT jobcap.create_queue('i', lease => '1 hour', backoff_base => '0', backoff_max => '0');
    SELECT count(jobcap.enqueue_job('i', jsonb_build_object('n', n))) FROM generate_series(1, 12) n;
});
my $index_calls = q{
    SELECT count(*) FROM jobcap.claim_job('i', 'idx', 2);
    SELECT count(jobcap.heartbeat(job_id, fence, '3 hours')) FROM jobcap.jobs WHERE worker = 'idx' AND state = 'running';
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE worker = 'idx' AND state = 'running'
     ORDER BY job_id LIMIT 1;
};
($o, $p) = in_session($s, $index_calls);
is($p, 'claim_job direct, heartbeat direct, heartbeat direct, complete_job direct', 'before the new indexes: direct');
$primary->safe_psql('postgres', q{
    CREATE INDEX CONCURRENTLY jobs_lease ON jobcap.jobs (lease_expires_at) WHERE state = 'running';
    CREATE INDEX jobs_n ON jobcap.jobs (priority, worker) WHERE attempts > 0;
});
my $hot_updates = "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass";
in_session($s, 'SELECT pg_stat_force_next_flush();');    # what the session counted so far
my $hot_before = $primary->safe_psql('postgres', $hot_updates);
($o, $p) = in_session($s, $index_calls . 'SELECT pg_stat_force_next_flush();');
is($p, 'claim_job direct, heartbeat direct, heartbeat direct, heartbeat direct, complete_job direct',
	'with the new indexes, in the same session: direct');
is($primary->safe_psql('postgres', $hot_updates) - $hot_before, 0,
	'no HOT update: the heartbeats change an indexed column now');
like(check_indexes($primary, 'postgres', 1), qr/jobs_lease,jobs_n,/,
	'amcheck (parent, heapallindexed) on every index of jobcap.jobs, the new ones too');
my $forced = 'SET enable_seqscan = off; SET enable_bitmapscan = off;';
my $by_lease = q{
    SELECT count(*) FROM jobcap.jobs WHERE state = 'running' AND lease_expires_at > now() + interval '2 hours'};
like($primary->safe_psql('postgres', "$forced EXPLAIN (COSTS OFF) $by_lease"), qr/jobs_lease/, 'jobs_lease is used');
is($primary->safe_psql('postgres', "$forced $by_lease"), '2',
	'jobs_lease finds the two running jobs whose lease the heartbeats extended');
$primary->safe_psql('postgres', q{
    DROP INDEX jobcap.jobs_n;
    CREATE INDEX jobs_worker_hash ON jobcap.jobs USING hash (worker);
});
($o, $p) = in_session($s, $index_calls);
is($p, 'claim_job direct, heartbeat direct, heartbeat direct, heartbeat direct, heartbeat direct, complete_job direct',
	'with a hash index: direct');
my $by_hash = q{
    SELECT count(*) FROM jobcap.jobs WHERE worker = 'idx'};
like($primary->safe_psql('postgres', "$forced EXPLAIN (COSTS OFF) $by_hash"), qr/jobs_worker_hash/, 'the hash index is used');
is($primary->safe_psql('postgres', "$forced $by_hash"), '6', 'the hash index finds the six jobs the session claimed');
like(check_indexes($primary, 'postgres', 1), qr/^jobs_claim,.*jobs_running,jobs_start_by,jobs_waiting$/, 'amcheck after the hash index');
is(check_heap($primary, 'postgres'), '', 'verify_heapam finds nothing wrong in jobcap.jobs');
$primary->safe_psql('postgres', 'DROP INDEX jobcap.jobs_worker_hash');
$s->quit;

# Constraints and stored generated columns are the executor's too (ExecConstraints,
# ExecComputeStoredGenerated; logical replication's apply worker calls them as well): with a
# CHECK constraint or a stored generated column a DBA adds, calls take the SQL path, the
# constraint holds and the generated column follows the row.
$primary->safe_psql('postgres', q{
    SELECT jobcap.create_queue('g', lease => '1 hour', backoff_base => '0', backoff_max => '0');
    SELECT count(jobcap.enqueue_job('g', jsonb_build_object('n', n))) FROM generate_series(1, 6) n;
    ALTER TABLE jobcap.jobs ADD CONSTRAINT worker_not_evil CHECK (worker IS DISTINCT FROM 'evil');
});
for my $path ('sql', 'direct')
{
	my ($rc, $stdout, $stderr) = $primary->psql('postgres',
		"SET jobcap.hot_path = $path; SET client_min_messages = debug2; SELECT count(*) FROM jobcap.claim_job('g', 'evil')");
	like($stderr, qr/takes the SQL path/, "hot_path = $path with a CHECK constraint: the SQL path");
	like($stderr, qr/violates check constraint "worker_not_evil"/,
		"hot_path = $path: a claim that would break a CHECK constraint on jobcap.jobs fails");
}
is($primary->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE worker = 'evil'"), '0',
	'no row breaks the constraint');
$primary->safe_psql('postgres', q{
    ALTER TABLE jobcap.jobs DROP CONSTRAINT worker_not_evil;
    ALTER TABLE jobcap.jobs ADD COLUMN done boolean GENERATED ALWAYS AS (state = 'succeeded') STORED;
});
for my $path ('sql', 'direct')
{
	my ($stdout, $stderr) = ('', '');
	$primary->psql('postgres', qq{
        SET jobcap.hot_path = $path; SET client_min_messages = debug2;
        SELECT count(*) FROM jobcap.claim_job('g', 'gen-$path', 2);
        SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE worker = 'gen-$path'
         ORDER BY job_id LIMIT 1;}, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
	is(paths_in($stderr), 'claim_job SQL, complete_job SQL', "hot_path = $path with a stored generated column: the SQL path");
	is($primary->safe_psql('postgres',
		"SELECT string_agg(state || ' ' || done, ', ' ORDER BY job_id) FROM jobcap.jobs WHERE worker = 'gen-$path'"),
		'succeeded true, running false', "hot_path = $path: a stored generated column follows the claim and the completion");
}
$primary->safe_psql('postgres', 'ALTER TABLE jobcap.jobs DROP COLUMN done');

# A rule on jobcap.jobs is the rewriter's: an ON UPDATE DO ALSO rule runs its action for every
# update the SQL path makes, so the direct path must leave such a table to it. (The SQL path's
# claims, one WITH statement, cannot run under such a rule at all: the jobs are claimed before
# the rule exists.)
$primary->safe_psql('postgres', q{
    SELECT jobcap.create_queue('r', lease => '1 hour', backoff_base => '0', backoff_max => '0');
    SELECT count(jobcap.enqueue_job('r', jsonb_build_object('n', n))) FROM generate_series(1, 2) n;
    SELECT count(*) FROM unnest(ARRAY['sql', 'direct']) p, jobcap.claim_job('r', 'rule-' || p) c;
    CREATE TABLE public.rule_log (job_id bigint, state text);
    CREATE RULE log_updates AS ON UPDATE TO jobcap.jobs
        DO ALSO INSERT INTO public.rule_log VALUES (NEW.job_id, NEW.state::text);
});
for my $path ('sql', 'direct')
{
	my ($stdout, $stderr) = ('', '');
	$primary->psql('postgres', qq{
        SET jobcap.hot_path = $path; SET client_min_messages = debug2;
        SELECT jobcap.heartbeat(job_id, fence) IS NOT NULL FROM jobcap.jobs WHERE worker = 'rule-$path';
        SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE worker = 'rule-$path';},
		stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
	is(paths_in($stderr), 'heartbeat SQL, complete_job SQL', "hot_path = $path with a rule on jobcap.jobs: the SQL path");
	is($primary->safe_psql('postgres', qq{
        SELECT string_agg(l.state, ' ') FROM public.rule_log l JOIN jobcap.jobs j USING (job_id)
         WHERE j.worker = 'rule-$path'}), 'running succeeded', "hot_path = $path: the rule's action ran for both updates");
}
$primary->safe_psql('postgres', 'DROP RULE log_updates ON jobcap.jobs');

# A table that publishes updates needs a replica identity: both paths refuse without one.
$primary->safe_psql('postgres', q{
    ALTER TABLE jobcap.jobs REPLICA IDENTITY NOTHING;
    CREATE PUBLICATION jobs_pub FOR TABLE jobcap.jobs;
});
for my $path ('sql', 'direct')
{
	my ($rc, $stdout, $stderr) = $primary->psql('postgres',
		"SET jobcap.hot_path = $path; SELECT count(*) FROM jobcap.claim_job('g', 'pub')");
	like($stderr, qr/cannot update table "jobs" because it does not have a replica identity and publishes updates/,
		"hot_path = $path: no claim in a table that publishes updates without a replica identity");
}
$primary->safe_psql('postgres', q{
    DROP PUBLICATION jobs_pub;
    ALTER TABLE jobcap.jobs REPLICA IDENTITY DEFAULT;
});

###############################################################################
# 2. The standby replays all of it: jobcap.jobs row by row, and its indexes check.
###############################################################################
# A last mix on the primary, left running: claims, heartbeats, a completion.
(undef, $said) = run_direct($primary, 'postgres', q{
    SELECT count(*) FROM jobcap.claim_job('t', 'last', 3);
    SELECT count(jobcap.heartbeat(job_id, fence, '4 hours')) FROM jobcap.jobs WHERE worker = 'last';
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs WHERE worker = 'last' ORDER BY job_id LIMIT 1;
});
is($said, 'claim_job direct, heartbeat direct, heartbeat direct, heartbeat direct, complete_job direct',
	'a last mix on the direct path');
$primary->wait_for_catchup($standby);
for my $db ('postgres', 'dec')
{
	my $rows = jobs_rows($primary, $db);
	is(jobs_rows($standby, $db), $rows, "standby, database $db: jobcap.jobs equals the primary's, row by row");
	like(check_indexes($standby, $db, 0), qr/jobs_claim.*jobs_pkey.*jobs_running/,
		"standby, database $db: amcheck (heapallindexed) on every index of jobcap.jobs");
	is(check_heap($standby, $db), '', "standby, database $db: verify_heapam finds nothing wrong in jobcap.jobs");
	is($standby->safe_psql($db, q{
        SET enable_seqscan = off; SET enable_bitmapscan = off;
        SELECT count(*) FROM jobcap.jobs WHERE state = 'running'}),
		$primary->safe_psql($db, "SELECT count(*) FROM jobcap.jobs WHERE state = 'running'"),
		"standby, database $db: jobs_running finds the running jobs");
}
unlike(slurp_file($standby->logfile), qr/inconsistent page found/,
	'wal_consistency_checking: the standby found every replayed page as the primary wrote it');

$standby->stop;
$primary->stop;
done_testing();
