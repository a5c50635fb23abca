# Shared by jobcap's TAP tests: a throwaway cluster with jobcap preloaded and quick settings,
# and small helpers for waiting on the background worker.
package JobcapTest;

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use Exporter 'import';
our @EXPORT = qw(jobcap_node wait_until wait_until_db reaper_pid count_log);

# A started node whose worker serves database "postgres", reaping every 100 ms. %conf adds or
# overrides settings (name => value, written as given).
sub jobcap_node
{
	my ($name, %conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => delete $conf{allows_streaming});
	my %settings = (
		shared_preload_libraries => "'jobcap'",
		'jobcap.database' => "'postgres'",
		'jobcap.reap_interval' => "'100ms'",
		'jobcap.report_interval' => "'1s'",
		# killed clients are noticed at once, not at the backend's next write
		client_connection_check_interval => "'100ms'",
		%conf);
	$node->append_conf('postgresql.conf',
		join('', map { "$_ = $settings{$_}\n" } sort keys %settings));
	$node->start;
	return $node;
}

# Polls $query until it returns $expected (default 't'), every 50 ms, for at most $seconds.
# Returns the seconds it took, or undef on timeout.
sub wait_until
{
	my ($node, $query, $expected, $seconds) = @_;
	return wait_until_db($node, 'postgres', $query, $expected, $seconds);
}

# The same in database $db.
sub wait_until_db
{
	my ($node, $db, $query, $expected, $seconds) = @_;
	$expected = 't' unless defined $expected;
	$seconds = 30 unless defined $seconds;
	my $start = time;
	while (time - $start < $seconds)
	{
		my ($rc, $out) = $node->psql($db, $query);
		return time - $start if $rc == 0 && $out eq $expected;
		usleep(50_000);
	}
	return undef;
}

# The pid of the worker serving database "postgres", or '' when none is running.
sub reaper_pid
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'jobcap reaper' AND datname = 'postgres'");
}

# How many lines of the server log, from byte $offset on, match $regexp.
sub count_log
{
	my ($node, $regexp, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset || 0);
	my $n = () = $log =~ m/$regexp/gm;
	return $n;
}

1;
