# jobcap.database = '*': the launcher serves every database that has the extension and keeps no
# process in those that do not; CREATE EXTENSION is served at once; DROP DATABASE (with or without
# FORCE) ends the reaper for good; a restarted launcher takes over its reapers without ever running two
# in one database.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use JobcapTest;

my $node = jobcap_node('all', 'jobcap.database' => "'*'");
$node->safe_psql('postgres', 'CREATE DATABASE a; CREATE DATABASE b');
$node->safe_psql('a', 'CREATE EXTENSION jobcap');
my $reapers = "SELECT coalesce(string_agg(datname, ',' ORDER BY datname), '') FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper'";
ok(defined wait_until($node, $reapers, 'a', 15), 'a reaper in the database with jobcap only');
sleep 2;    # twenty reap intervals: the other databases are not probed again yet
is($node->safe_psql('postgres', $reapers), 'a', 'still only there');
is(count_log($node, qr/jobcap reaper .*database "(postgres|b)"/), 0, 'and nothing logged for the others');

my ($rc, $out, $err) = $node->psql('b', 'CREATE EXTENSION jobcap');
is($err, '', 'CREATE EXTENSION under * does not warn');
my $took = wait_until($node, $reapers, 'a,b', 10);
ok(defined $took && $took < 2, "and wakes the launcher: served at once (${\ ($took // 'never')} s)");

$node->safe_psql('b', q{
    SELECT jobcap.create_queue('q', lease => '1 second', backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('q');
    SELECT count(*) FROM jobcap.claim_job('q', 'w');
});
ok(defined wait_until_db($node, 'b', "SELECT state = 'pending' FROM jobcap.jobs"), 'b is reaped');

# A served database is dropped as any other: its reaper leaves first (DROP DATABASE counts the
# database's sessions and fails after 5 s while one is connected). Then it is gone for good,
# without a FATAL loop. The same WITH (FORCE).
my $offset = -s $node->logfile;
($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE a');
is($err, '', 'DROP DATABASE of a served database succeeds');
like(slurp_file($node->logfile, $offset), qr/stopping the jobcap reaper of database "a" for DROP DATABASE/,
	'the log says why its reaper stopped');
$node->safe_psql('postgres', 'CREATE DATABASE c');
$node->safe_psql('c', 'CREATE EXTENSION jobcap');
ok(defined wait_until($node, $reapers, 'b,c', 10), 'a new database c is served');
$node->safe_psql('postgres', 'DROP DATABASE c WITH (FORCE)');
sleep 6;    # past the launcher's 5 s restart wait
is($node->safe_psql('postgres', $reapers), 'b', 'after DROP DATABASE (with and without FORCE) their reapers stay gone');
is(count_log($node, qr/FATAL:  database .* does not exist/, $offset), 0, 'no FATAL loop');

# The launcher terminated: it comes back, its old reaper leaves, the new launcher's reaper takes
# over; at no moment do two reapers serve b.
my $launcher = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap launcher'");
my $old = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'");
$offset = -s $node->logfile;
kill 'TERM', $launcher;
my ($max, $new) = (0, '');
my $start = time;
while (time - $start < 15)
{
	my ($n, $pid) = split /\|/, $node->safe_psql('postgres', "SELECT count(*), max(pid)
	    FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'b'");
	$max = $n if $n > $max;
	if ($n == 1 && $pid != $old) { $new = $pid; last; }
	usleep(20_000);
}
ok($new, 'a new reaper serves b after the launcher restarted');
is($max, 1, 'never two reapers at once');
like(slurp_file($node->logfile, $offset), qr/jobcap reaper leaves database "b": its launcher is gone/,
	'the old reaper left by itself');
is($node->safe_psql('b', "SELECT count(*) FROM jobcap.claim_job('q', 'w')"), '1', 'claimed again');
ok(defined wait_until_db($node, 'b', "SELECT state = 'pending' FROM jobcap.jobs"), 'and b is reaped');

# The reaper lock cannot be taken from SQL: a session holding the advisory keys the reaper's
# lock is built from (any role can call pg_advisory_lock) does not stop a restarted reaper.
my $holder = $node->background_psql('b');
# (Under load the launcher may be between reapers for a moment: wait for the one reaper.)
$old = '';
for (1 .. 1500)
{
	$old = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'");
	last if $old =~ /^\d+$/;
	usleep(20_000);
}
like($old, qr/^\d+$/, 'one reaper to stop');
kill 'TERM', $old;
is($holder->query_safe('SELECT pg_try_advisory_lock(1785684579, 1919246704)'), 't',
	'a session takes the advisory keys of the reaper lock');
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'
    AND pid <> $old", 't', 15), 'the reaper is started again');
is($node->safe_psql('b', "SELECT count(*) FROM jobcap.claim_job('q', 'w')"), '1', 'claimed again');
ok(defined wait_until_db($node, 'b', "SELECT state = 'pending' FROM jobcap.jobs", 't', 5),
	'and reaped, though that session still holds its advisory lock');
is($node->safe_psql('b', "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
    WHERE l.locktype = 'advisory' AND l.objsubid = 3 AND l.granted
      AND a.backend_type = 'jobcap reaper' AND l.database = (SELECT oid FROM pg_database WHERE datname = 'b')"),
	'1', 'the reaper holds its own lock, which SQL cannot name');
$holder->query_safe('SELECT pg_advisory_unlock(1785684579, 1919246704)');
$holder->quit;

$node->stop;
done_testing();
