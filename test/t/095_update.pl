# ALTER EXTENSION jobcap UPDATE from the released 0.1.0 to the default version, with jobs in every
# state and a worker's lease in flight: the worker that claimed under 0.1.0 completes with its
# fence afterwards, no row of jobcap's tables is lost or changed, the next fence is higher than any
# before, and the upgraded schema is the schema of a fresh install (pg_dump --binary-upgrade, which
# dumps an extension's members one by one, as pg_upgrade's own test compares them; the members
# and their privileges from the catalogs).
#
# Nothing here names an object the upgrade script adds: the comparisons run over whatever the
# catalogs hold, so the test keeps its meaning as the script grows. A change the upgrade makes to
# existing rows on purpose goes into %documented_changes below, with UPDATING.md's words for it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $old = '0.1.0';

# Columns of 0.1.0's tables whose values the upgrade changes on purpose, as 'table.column'
# (UPDATING.md, "From 0.1.0 to 0.2.0", says how). Left out of the before/after comparison.
my %documented_changes = ();

# Database "postgres" gets the upgrade; no background worker serves it, so nothing but this test
# writes its tables (the worker's refresh_stats would move the statistics between snapshots).
# Database "reaped" is served, and is upgraded under its running worker.
my $node = jobcap_node('upgrade', 'jobcap.database' => "'reaped'");
$node->safe_psql('postgres', 'CREATE DATABASE reaped');
my $new = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'jobcap'");
isnt($new, $old, "the default version ($new) is not the released $old");

$node->safe_psql('postgres', qq{
    CREATE EXTENSION jobcap VERSION '$old';
    CREATE ROLE w1 LOGIN IN ROLE jobcap_worker;
});
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'jobcap'"),
	$old, "created at $old");

# Jobs in every state. Queue "q" is granted to w1, which does the work; "dead" caps at two.
$node->safe_psql('postgres', q{
    SELECT jobcap.create_queue('q', max_attempts => 5, lease => '1 hour',
                               backoff_base => '1 hour', backoff_max => '2 hours');
    SELECT jobcap.create_queue('dead', max_attempts => 2, lease => '1 hour', notify => true);
    SELECT jobcap.create_queue('idle');
    SELECT jobcap.grant_queue('q', 'w1');
    SELECT jobcap.grant_queue('dead', 'jobcap_worker');
});
# w1's session stays open from its first claim under 0.1.0 to its completion under the new
# version. Until ALTER EXTENSION jobcap UPDATE, the new library serves the 0.1.0 schema
# (UPDATING.md): a call that fails there fails this test with its error.
my $worker = $node->background_psql('postgres', extra_params => [ '-U', 'w1' ], on_error_stop => 0);
my $w = sub {
	my ($query) = @_;
	my $out = $worker->query($query);
	return $out if $worker->{stderr} eq '';
	my $at = $node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'jobcap'");
	fail("as w1, on the schema of jobcap $at: $query");
	diag($worker->{stderr});
	die "w1's call failed on the $at schema\n";
};

# succeeded
$w->(q{SELECT jobcap.enqueue_job('q', '{"state": "succeeded"}', priority => -3)});
$w->(q{SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('q', 'w1')});
# dead, with an error per attempt; then one requeued and dead again (a 'requeued' history row)
$w->(q{SELECT jobcap.enqueue_job('dead', '{"state": "dead"}', dedupe_key => 'poison')});
my $requeued = $w->(q{SELECT jobcap.enqueue_job('dead', '{"state": "dead, requeued"}')});
for my $i (1 .. 2)
{
	$w->(qq{SELECT jobcap.fail_job(job_id, fence, 'boom $i', retry_in => '0')
              FROM jobcap.claim_job('dead', 'w1', batch => 2)});
}
$node->safe_psql('postgres', qq{SELECT jobcap.requeue_job($requeued, 'one more try', extra_attempts => 1)});
$w->(q{SELECT jobcap.fail_job(job_id, fence, 'boom again') FROM jobcap.claim_job('dead', 'w1')});
# a lease that expired (a 'lease_expired' history row), now pending again
$w->(q{SELECT jobcap.enqueue_job('q', '{"state": "reaped"}', priority => -2)});
$w->(q{SELECT count(*) FROM jobcap.claim_job('q', 'w1', lease => '10 milliseconds')});
sleep 1;
$node->safe_psql('postgres', 'SELECT count(*) FROM jobcap.reap_jobs()');
# cancelled
my $cancelled = $w->(q{SELECT jobcap.enqueue_job('q', '{"state": "cancelled"}', priority => 5)});
$node->safe_psql('postgres', qq{SELECT jobcap.cancel_job($cancelled)});
# scheduled: for tomorrow, and a retry waiting out its backoff
$w->(q{SELECT jobcap.enqueue_job('q', '{"state": "scheduled"}', run_at => now() + interval '1 day')});
$w->(q{SELECT jobcap.enqueue_job('q', '{"state": "retry"}', priority => -1)});
$w->(q{SELECT jobcap.fail_job(job_id, fence, 'try later') FROM jobcap.claim_job('q', 'w1')});
# running, under a lease w1 holds; no transaction is open while it "works"
$w->(q{SELECT jobcap.enqueue_job('q', '{"state": "running"}', priority => -1)});
my ($job, $fence) = split /\|/, $w->(q{SELECT job_id, fence FROM jobcap.claim_job('q', 'w1')});
# pending: what the next claim takes
my $pending = $w->(q{SELECT jobcap.enqueue_job('q', '{"state": "pending"}', priority => 9)});
$node->safe_psql('postgres', 'SELECT jobcap.refresh_stats()');

is( $node->safe_psql('postgres', q{
        SELECT string_agg(state || CASE WHEN run_at > now() THEN ' (scheduled)' ELSE '' END, ',' ORDER BY job_id)
          FROM jobcap.jobs}),
	'succeeded,dead,dead,pending (scheduled),cancelled,pending (scheduled),pending (scheduled),running,pending',
	'jobs in every state');
is($node->safe_psql('postgres',
		"SELECT string_agg(kind, ',' ORDER BY seq) FROM jobcap.job_errors"),
	'error,error,error,error,requeued,error,lease_expired,error',
	'their history: errors, a requeue, an expired lease');
is($node->safe_psql('postgres', "SELECT state || ' ' || worker FROM jobcap.jobs WHERE job_id = $job"),
	'running w1', "job $job runs under w1's lease, fence $fence");

# Every table of the extension, as text, over the columns it has now.
sub tables
{
	my ($db) = @_;
	return split /\n/, $node->safe_psql($db, q{
        SELECT c.oid::regclass FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
         WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e' AND c.relkind IN ('r', 'p')
           AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'jobcap')
         ORDER BY 1});
}

sub columns
{
	my ($db, $table) = @_;
	return grep { !exists $documented_changes{"$table.$_"} } split /\n/, $node->safe_psql($db, qq{
        SELECT attname FROM pg_attribute WHERE attrelid = '$table'::regclass AND attnum > 0
           AND NOT attisdropped ORDER BY attnum});
}

sub contents
{
	my ($db, $table, @columns) = @_;
	my $cols = join(', ', map { qq{"$_"} } @columns);
	return $node->safe_psql($db, "SELECT $cols FROM $table ORDER BY " . join(', ', 1 .. @columns));
}

my %before;
for my $t (tables('postgres'))
{
	my @columns = columns('postgres', $t);
	$before{$t} = { columns => \@columns, rows => contents('postgres', $t, @columns) };
}
ok(keys %before >= 6, 'the tables of ' . $old . ': ' . join(' ', sort keys %before));
my $max_fence_before = $node->safe_psql('postgres', q{
    SELECT greatest((SELECT max(fence) FROM jobcap.jobs), (SELECT max(fence) FROM jobcap.job_errors),
                    (SELECT last_value FROM jobcap.fences))});

# The served database gets the same upgrade under its running background worker.
# Until its ALTER EXTENSION, a database is at 0.1.0 under the new library (UPDATING.md): the
# worker serves it and reaps there too.
$node->safe_psql('reaped', qq{CREATE EXTENSION jobcap VERSION '$old';
    SELECT jobcap.create_queue('r', lease => '1 hour');
    SELECT jobcap.enqueue_job('r') FROM generate_series(1, 2);
    SELECT count(*) FROM jobcap.claim_job('r', 'w', batch => 2);});
$node->wait_for_log(qr/jobcap reaper is serving database "reaped"/);
my $reaper = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'reaped'");
$node->safe_psql('reaped', q{UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = 1});
ok(defined wait_until_db($node, 'reaped', "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 1"),
	"the background worker reaps a database at $old");

# The rest of a worker's and an operator's calls there, still at $old, with $old's cap rule (a
# job's own max_attempts, else its queue's): a last attempt that fails, a last lease that the
# background worker reaps, top_failing_jobs, requeue_job and requeue_dead (whose budgets, above
# the queue's cap of one, the next claim honours), and a claim that rolls back, which $old has
# no place to count: the worker says so once and leaves the job as the rollback left it.
$node->safe_psql('reaped', q{SELECT jobcap.create_queue('d', max_attempts => 1, lease => '1 hour');
    SELECT jobcap.enqueue_job('d', '{"n": 3}');
    SELECT jobcap.enqueue_job('d', '{"n": 4}');});
is($node->safe_psql('reaped', q{SELECT job_id || ' ' || jobcap.fail_job(job_id, fence, 'fatal')
                                  FROM jobcap.claim_job('d', 'w')}),
	'3 dead', "fail_job at $old: the last attempt dies");
$node->safe_psql('reaped', q{SELECT count(*) FROM jobcap.claim_job('d', 'w', lease => '10 milliseconds')});
ok(defined wait_until_db($node, 'reaped', "SELECT state = 'dead' FROM jobcap.jobs WHERE job_id = 4"),
	"the background worker reaps a last lease into death at $old");
is($node->safe_psql('reaped', q{SELECT job_id, state, attempts, max_attempts, failures, errors, crashes
                                  FROM jobcap.top_failing_jobs('d')}),
	"4|dead|1|1|1|0|1\n3|dead|1|1|1|1|0", "top_failing_jobs at $old");
is($node->safe_psql('reaped', q{SELECT jobcap.requeue_job(4, 'one more', extra_attempts => 1)}),
	't', "requeue_job at $old");
is($node->safe_psql('reaped', q{SELECT jobcap.requeue_dead('d', 'two more', extra_attempts => 2)}),
	'1', "requeue_dead at $old");
is($node->safe_psql('reaped', q{SELECT string_agg(job_id || ' ' || attempt || '/' || max_attempts || ' '
                                                  || jobcap.complete_job(job_id, fence), ', ' ORDER BY job_id)
                                  FROM jobcap.claim_job('d', 'w', batch => 2)}),
	'3 2/3 succeeded, 4 2/2 succeeded', 'the requeued jobs run again within their new budgets');
my $rollback_offset = -s $node->logfile;
$node->safe_psql('reaped', q{SELECT jobcap.enqueue_job('d', '{"n": 5}');
    BEGIN; SELECT count(*) FROM jobcap.claim_job('d', 'w'); ROLLBACK;});
$node->wait_for_log(
	qr/jobcap reaper does not count rolled-back claims in database "reaped" until ALTER EXTENSION/,
	$rollback_offset);
is($node->safe_psql('reaped', 'SELECT state || \' \' || attempts FROM jobcap.jobs WHERE job_id = 5'),
	'pending 0', "a rolled-back claim at $old is not counted");

# The upgrade, with w1's session open and its lease in flight.
my ($rc, $out, $err) = $node->psql('postgres', 'ALTER EXTENSION jobcap UPDATE');
is($rc, 0, 'ALTER EXTENSION jobcap UPDATE') or diag($err);
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'jobcap'"),
	$new, "now at $new");
($rc, $out, $err) = $node->psql('reaped', 'ALTER EXTENSION jobcap UPDATE');
is($rc, 0, 'the same under a running background worker') or diag($err);

# Nothing lost: every table of 0.1.0 is there, with the same rows over the columns it had.
my %after = map { $_ => 1 } tables('postgres');
for my $t (sort keys %before)
{
	ok($after{$t}, "$t is still there") or next;
	my %now = map { $_ => 1 } columns('postgres', $t);
	my @gone = grep { !$now{$_} } @{ $before{$t}{columns} };
	is("@gone", '', "$t keeps its columns");
	my @kept = grep { $now{$_} } @{ $before{$t}{columns} };
	my $rows = () = $before{$t}{rows} =~ /^/mg;
	$rows = 0 if $before{$t}{rows} eq '';
	is(contents('postgres', $t, @kept), $before{$t}{rows}, "$t: the same rows ($rows)");
}

# The worker settles its 0.1.0 lease with its 0.1.0 fence, in the session it claimed in.
is($w->("SELECT jobcap.complete_job($job, $fence)"), 'succeeded',
	"w1 completes job $job with the fence ($fence) it got under $old");
my ($next_job, $next_fence) = split /\|/, $w->(q{SELECT job_id, fence FROM jobcap.claim_job('q', 'w1')});
is($next_job, $pending, 'the next claim takes the pending job');
cmp_ok($next_fence, '>', $max_fence_before, "its fence ($next_fence) is higher than any before ($max_fence_before)");
is($w->("SELECT jobcap.complete_job($next_job, $next_fence)"), 'succeeded', 'and completes it');
is(count_log($node, qr/ERROR|FATAL|PANIC/), 0, 'no error in the server log up to here');
my ($frc, $fout, $ferr) = $node->psql('postgres', "SELECT jobcap.complete_job($job, $fence)",
	extra_params => [ '-U', 'w1' ]);
like($ferr, qr/JC001|fence/, 'a settled lease stays settled');
my $log_offset = -s $node->logfile;
$worker->quit;

# The worker of the upgraded database still reaps.
$node->safe_psql('reaped', q{UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = 2});
ok(defined wait_until_db($node, 'reaped', "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 2"),
	'and after the upgrade');
is($node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'reaped'"),
	$reaper, 'the same worker process, never restarted');
is(count_log($node, qr/ERROR|FATAL|PANIC/, $log_offset), 0, 'no error in the server log since');

# The upgraded schema is the fresh install's.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION jobcap');
is($node->safe_psql('fresh', "SELECT extversion FROM pg_extension WHERE extname = 'jobcap'"),
	$new, "a fresh install is at $new");

# pg_dump --binary-upgrade writes every member of the extension (pg_upgrade's own dump); plain
# --schema-only writes the CREATE EXTENSION. Normalised: what pg_upgrade carries over by identity
# and which differs between two databases by nature (object OIDs, relfilenodes, the LSNs of
# attribute versions, transaction ids, sequence positions); the calls and statements themselves stay.
# PostgreSQL 18's pg_dump can write planner statistics, which are data (row counts): left out.
my ($dump_help) = run_command([ 'pg_dump', '--help' ]);
my @no_statistics = $dump_help =~ /--no-statistics/ ? ('--no-statistics') : ();

sub dump_schema
{
	my ($db, @opts) = @_;
	my $file = $node->basedir . "/$db" . join('', @opts) . '.sql';
	$node->command_ok([ 'pg_dump', '--schema-only', '--no-sync', @no_statistics, @opts, '-f', $file,
		'-d', $node->connstr($db) ], join(' ', 'pg_dump --schema-only', @opts, $db));
	my $sql = slurp_file($file);
	$sql =~ s/^(SELECT pg_catalog\.binary_upgrade_set_next_\w+)\('[^']*'::pg_catalog\.\w+(\[\])?\);$/$1(<id>);/mg;
	$sql =~ s/^(SET relfrozenxid = )'\d+', (relminmxid = )'\d+'$/$1'<xid>', $2'<mxid>'/mg;
	$sql =~ s/^WHERE oid = '\d+';$/WHERE oid = '<toast oid>';/mg;
	# Sequence positions are data (the fences are checked above).
	$sql =~ s/^(SELECT pg_catalog\.setval\('[^']+', )\d+, (true|false)\);$/$1<value>);/mg;
	$sql =~ s/^-- Dumped (from|by) .*\n//mg;
	# psql's \restrict key (pg_dump 15.14 and later) is random per dump.
	$sql =~ s/^\\(un)?restrict \S+$/\\$1restrict <key>/mg;
	# The extension's config tables by OID, if it ever marks some (pg_extension_config_dump).
	$sql =~ s/(binary_upgrade_create_empty_extension\([^;]*?)'\{[\d,]*\}'/$1'{<oids>}'/g;
	return $sql;
}

sub first_difference
{
	my ($a, $b) = @_;
	my @a = split /\n/, $a;
	my @b = split /\n/, $b;
	for my $i (0 .. ($#a > $#b ? $#a : $#b))
	{
		my ($x, $y) = ($a[$i] // '<end>', $b[$i] // '<end>');
		return "line " . ($i + 1) . ":\n  upgraded: $x\n  fresh:    $y" if $x ne $y;
	}
	return '';
}

for my $opts ([], ['--binary-upgrade'])
{
	my ($upgraded, $fresh) = map { dump_schema($_, @$opts) } ('postgres', 'fresh');
	my $lines = () = $fresh =~ /\n/g;
	ok($upgraded eq $fresh, join(' ', 'pg_dump --schema-only', @$opts) . ": upgraded = fresh ($lines lines)")
	  or diag(first_difference($upgraded, $fresh));
}
# The binary-upgrade dump holds the members themselves: sanity, so that an empty dump cannot pass.
like(dump_schema('fresh', '--binary-upgrade'), qr/ALTER EXTENSION jobcap ADD FUNCTION jobcap\.claim_job\(/,
	'the binary-upgrade dump lists the members');

# The members from the catalogs, with their privileges now and as installed (pg_init_privs),
# column privileges included.
my $members_sql = q{
    WITH m AS (
        SELECT d.classid, d.objid, d.objsubid FROM pg_depend d
         WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
           AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'jobcap'))
    SELECT pg_describe_object(m.classid, m.objid, m.objsubid) AS member,
           coalesce(CASE m.classid
                WHEN 'pg_class'::regclass THEN (SELECT relacl::text FROM pg_class WHERE oid = m.objid)
                WHEN 'pg_proc'::regclass THEN (SELECT proacl::text FROM pg_proc WHERE oid = m.objid)
                WHEN 'pg_type'::regclass THEN (SELECT typacl::text FROM pg_type WHERE oid = m.objid)
                WHEN 'pg_namespace'::regclass THEN (SELECT nspacl::text FROM pg_namespace WHERE oid = m.objid)
                END, '-') AS acl,
           coalesce((SELECT string_agg(i.objsubid || ':' || i.privtype::text || ':' || i.initprivs::text, ' '
                                       ORDER BY i.objsubid)
                       FROM pg_init_privs i WHERE i.classoid = m.classid AND i.objoid = m.objid), '-') AS init,
           coalesce(CASE WHEN m.classid = 'pg_class'::regclass THEN
                (SELECT string_agg(a.attname || ':' || a.attacl::text, ' ' ORDER BY a.attnum)
                   FROM pg_attribute a WHERE a.attrelid = m.objid AND a.attacl IS NOT NULL) END, '-') AS columns
      FROM m ORDER BY 1};
my $fresh_members = $node->safe_psql('fresh', $members_sql);
my $upgraded_members = $node->safe_psql('postgres', $members_sql);
my $n_members = () = $fresh_members =~ /^/mg;
ok($upgraded_members eq $fresh_members, "members and their privileges: upgraded = fresh ($n_members members)")
  or diag(first_difference($upgraded_members, $fresh_members));
# The policy of every version: PUBLIC gets nothing on jobcap's objects (a function created
# without a REVOKE is executable by PUBLIC: its ACL is NULL).
is($node->safe_psql('postgres', q{
    SELECT string_agg(pg_describe_object(d.classid, d.objid, 0), ', ' ORDER BY 1)
      FROM pg_depend d
      LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
      LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'jobcap')
       AND (p.oid IS NOT NULL AND (p.proacl IS NULL OR EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0))
            OR c.oid IS NOT NULL AND EXISTS (SELECT FROM aclexplode(c.relacl) a WHERE a.grantee = 0))}),
	'', 'after the upgrade PUBLIC may execute or read none of the members');
my $ext_sql = q{SELECT extversion, extrelocatable, extnamespace::regnamespace,
                       (SELECT array_agg(c::regclass ORDER BY c::regclass::text) FROM unnest(extconfig) c),
                       extcondition FROM pg_extension WHERE extname = 'jobcap'};
is($node->safe_psql('postgres', $ext_sql), $node->safe_psql('fresh', $ext_sql),
	'pg_extension: the same version, schema and config tables');

done_testing();
