# Databases created, renamed and copied while the server runs (jobcap.database lists them):
# a new listed database is served as soon as it exists, so CREATE EXTENSION there does not warn
# and its jobs are reaped within one reap interval; the reaper gets out of the way of ALTER
# DATABASE ... RENAME, CREATE DATABASE ... TEMPLATE and DROP DATABASE (with or without FORCE) and
# comes back after the first two; only a database no worker will serve gets the install warning.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use JobcapTest;

# The default pace: a reap interval of a second, so the launcher's own look for new databases
# comes only every 60 s.
my $node = jobcap_node('ddl', 'jobcap.database' => "'postgres, app'",
	'jobcap.reap_interval' => "'1s'");
ok(defined wait_until($node, "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'
    AND datname = 'postgres'", 't', 15), 'the reaper of postgres runs');
my $reaper_in = sub {
	my ($db) = @_;
	return "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = '$db'";
};

# CREATE DATABASE wakes the launcher when it commits; CREATE EXTENSION right after finds the
# reaper connected (or waits a moment for it), so it does not warn.
my $start = time;
$node->safe_psql('postgres', 'CREATE DATABASE app');
my ($rc, $out, $err) = $node->psql('app', 'CREATE EXTENSION jobcap');
is($rc, 0, 'CREATE EXTENSION in the new database');
unlike($err, qr/no jobcap background worker/, 'no warning: the listed database is served');
my $took = wait_until($node, $reaper_in->('app'), 't', 70);
ok(defined $took && time - $start < 3,
	sprintf('its reaper connected at once (%.1f s after CREATE DATABASE)', time - $start));
$node->safe_psql('app', q{
    SELECT jobcap.create_queue('q', lease => '1 second', backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('q');
    SELECT count(*) FROM jobcap.claim_job('q', 'w');
});
$took = wait_until_db($node, 'app', "SELECT state = 'pending' FROM jobcap.jobs", 't', 70);
ok(defined $took && $took < 3.5,
	sprintf('an expired lease there is reaped within a reap interval of its expiry (%s s)',
		defined $took ? sprintf('%.1f', $took) : 'never'));

# ALTER DATABASE ... RENAME: the reaper leaves instead of making it fail after 5 s.
my $offset = -s $node->logfile;
$start = time;
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE app RENAME TO app_renamed');
my $rename_took = time - $start;
is($err, '', 'ALTER DATABASE ... RENAME of a served database succeeds');
ok($rename_took < 3, sprintf('without waiting out the 5 s (%.1f s)', $rename_took));
like(slurp_file($node->logfile, $offset),
	qr/stopping the jobcap reaper of database "app" for ALTER DATABASE \.\.\. RENAME/,
	'the log says why the reaper stopped');
sleep 6;    # past the launcher's 5 s restart wait
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND datname = 'app_renamed'"), '0',
	'under its new name, which jobcap.database does not list, it is not served');
$node->safe_psql('postgres', 'ALTER DATABASE app_renamed RENAME TO app');
ok(defined wait_until($node, $reaper_in->('app'), 't', 3), 'renamed back, it is served at once');

# Only the owner's rename stops the reaper: anyone else's fails on its own, the reaper stays.
my $pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'app'");
$node->safe_psql('postgres', 'CREATE ROLE stranger LOGIN CREATEDB');
($rc, $out, $err) = $node->psql('postgres', 'SET ROLE stranger; ALTER DATABASE app RENAME TO mine');
like($err, qr/must be owner of database app/, "a stranger's rename is refused");
is($node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'app'"),
	$pid, 'and the reaper was left alone');

# CREATE DATABASE ... TEMPLATE: the same.
($rc, $out, $err) = $node->psql('postgres', 'CREATE DATABASE app_copy TEMPLATE app');
is($err, '', 'CREATE DATABASE ... TEMPLATE of a served database succeeds');
is($node->safe_psql('app_copy', 'SELECT count(*) FROM jobcap.jobs'), '1', 'with its jobs');
ok(defined wait_until($node, $reaper_in->('app'), 't', 3), 'and the reaper of app comes back at once');

# A database jobcap.database does not list: the warning is true, and comes without a wait.
$node->safe_psql('postgres', 'CREATE DATABASE other');
$start = time;
($rc, $out, $err) = $node->psql('other', 'CREATE EXTENSION jobcap');
like($err, qr/WARNING:  no jobcap background worker serves database "other"/,
	'where no worker will serve, CREATE EXTENSION warns');
ok(time - $start < 1.5, 'at once');
is(count_log($node, qr/FATAL:  database .* does not exist/), 0, 'no FATAL for a renamed database');

# DROP DATABASE: the reaper leaves instead of making it fail after 5 s (Django's and
# pytest-django's test runners drop and create their test database again on every run).
$offset = -s $node->logfile;
$start = time;
($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE app');
is($err, '', 'DROP DATABASE of a served database succeeds');
ok(time - $start < 3, sprintf('without waiting out the 5 s (%.1f s)', time - $start));
like(slurp_file($node->logfile, $offset),
	qr/stopping the jobcap reaper of database "app" for DROP DATABASE/,
	'the log says why the reaper stopped');
# Created again, as a test runner's second run does: served again. Its owner, no superuser,
# drops it WITH (FORCE), which may not terminate a superuser's process: the reaper left first.
$node->safe_psql('postgres', 'CREATE ROLE app_owner LOGIN CREATEDB; CREATE DATABASE app OWNER app_owner');
$node->safe_psql('app', 'CREATE EXTENSION jobcap');
ok(defined wait_until($node, $reaper_in->('app'), 't', 3), 'the new app is served at once');
($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE app WITH (FORCE)',
	extra_params => [ '-U', 'app_owner' ]);
is($err, '', "its owner's DROP DATABASE ... WITH (FORCE) succeeds");
sleep 6;    # past the launcher's 5 s restart wait
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity
    WHERE backend_type = 'jobcap reaper' AND datname = 'app'"), '0', 'and no reaper comes back');
is(count_log($node, qr/FATAL:  database .* does not exist/, $offset), 0, 'no FATAL loop');

$node->stop;
done_testing();
