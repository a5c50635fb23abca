# A standby runs no reaper (its worker starts at promotion, BgWorkerStart_RecoveryFinished): the
# primary's reaper does the work and the standby replays it. Promoted, the standby reaps.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $primary = jobcap_node('primary', allows_streaming => 1);
$primary->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    SELECT jobcap.create_queue('s', lease => '1 hour', backoff_base => '0', backoff_max => '0');
    SELECT jobcap.enqueue_job('s') FROM generate_series(1, 2);
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;

$primary->safe_psql('postgres', q{
    SELECT count(*) FROM jobcap.claim_job('s', 'w', batch => 2);
    UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = 1;
});
ok(defined wait_until($primary, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 1"),
	'the primary reaps');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'"),
	'0', 'no reaper on the standby');
is($standby->safe_psql('postgres', "SELECT string_agg(job_id || ':' || state, ' ' ORDER BY job_id) FROM jobcap.jobs"),
	'1:pending 2:running', 'the standby replays what the primary reaped');

$primary->stop;
$standby->promote;
ok(defined wait_until($standby, "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'jobcap reaper'"),
	'promoted, it starts its reaper');
$standby->safe_psql('postgres',
	"UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = 2");
ok(defined wait_until($standby, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = 2"),
	'and reaps');

$standby->stop;
done_testing();
