# pg_upgrade from an older major holding jobcap: a cluster of the old major (JOBCAP_OLD_INSTALL,
# an installation directory with bin/ and lib/ and jobcap installed; test/run sets it from
# JOBCAP_OLD_PG_CONFIG, as the version matrix does in its PostgreSQL 17 root) with jobs in every
# state, history, grants and statistics is upgraded to the PostgreSQL under test. Afterwards
# every row is there unchanged, the next fence is above every fence handed out before, a worker
# that claimed before the upgrade completes with its fence, and the background reaper reaps an
# expired lease. Skipped when JOBCAP_OLD_INSTALL is not set.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $old_install = $ENV{JOBCAP_OLD_INSTALL};
plan skip_all => 'JOBCAP_OLD_INSTALL (an older PostgreSQL with jobcap installed) is not set'
  unless $old_install;

my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init;
$old->append_conf('postgresql.conf', "shared_preload_libraries = 'jobcap'\n"
	  . "jobcap.database = 'postgres'\njobcap.reap_interval = '100ms'\n");
$old->start;
my $old_version = $old->safe_psql('postgres', 'SHOW server_version_num');

$old->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    CREATE ROLE upg_worker LOGIN IN ROLE jobcap_worker;
    SELECT jobcap.create_queue('work', lease => '1 hour', max_attempts => 2, backoff_base => '1 hour',
                               backoff_max => '1 hour');
    SELECT jobcap.create_queue('other', lease => '1 hour');
    SELECT jobcap.grant_queue('work', 'upg_worker');
    -- succeeded
    SELECT jobcap.enqueue_job('work', '{"n": 1}');
    SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('work', 'w1');
    -- dead, with two failed attempts in its history
    SELECT jobcap.enqueue_job('work', '{"n": 2}', max_attempts => 2);
    SELECT jobcap.fail_job(job_id, fence, 'first failure', retry_in => '0')
      FROM jobcap.claim_job('work', 'w1');
    SELECT jobcap.fail_job(job_id, fence, 'second failure') FROM jobcap.claim_job('work', 'w1');
    -- cancelled
    SELECT jobcap.cancel_job(jobcap.enqueue_job('other', '{"n": 3}'));
    -- pending after a failed attempt (backing off for an hour), with its history row
    SELECT jobcap.enqueue_job('other', '{"n": 4}');
    SELECT jobcap.fail_job(job_id, fence, 'will retry') FROM jobcap.claim_job('other', 'w2');
    -- two running under a lease: one completes after the upgrade, one's lease expires
    SELECT jobcap.enqueue_job('work', '{"n": 5}', priority => -2);
    SELECT jobcap.enqueue_job('work', '{"n": 6}', priority => -1);
    CREATE TABLE public.claimed AS SELECT job_id, fence FROM jobcap.claim_job('work', 'w3', batch => 2);
    -- pending, and scheduled for tomorrow, with a dedupe key
    SELECT jobcap.enqueue_job('work', '{"n": 7}');
    SELECT jobcap.enqueue_job('work', '{"n": 8}', run_at => now() + interval '1 day', dedupe_key => 'k8');
    SELECT jobcap.refresh_stats();
});
# A claim rolled back: its fence was handed out (the sequence moved) though no row keeps it.
$old->safe_psql('postgres', "BEGIN; SELECT jobcap.claim_job('work', 'w9'); ROLLBACK;");

# What must survive: every row of jobcap's tables (compared as text, in UTC): queues, jobs, their
# history, queue grants and the counted statistics; the roles' grants; the extension's version.
my @tables = qw(queues jobs job_errors queue_grants stats_minutes stats_latency stats_progress);
# The reaper counts and prunes on its own: the snapshots are taken with none running, so that
# they show what pg_upgrade is given and what it gave.
$old->append_conf('postgresql.conf', "shared_preload_libraries = ''\n");
$old->restart;
sub snapshot
{
	my ($node) = @_;
	my %s;
	for my $t (@tables)
	{
		$s{$t} = $node->safe_psql('postgres', "SET TimeZone = 'UTC';
            SELECT count(*) || ' ' || coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t::text)), '-')
              FROM jobcap.$t t");
	}
	$s{roles} = $node->safe_psql('postgres', "SELECT pg_has_role('upg_worker', 'jobcap_worker', 'member')
        || ' ' || has_function_privilege('upg_worker', 'jobcap.claim_job(text, text, integer, interval)', 'execute')");
	$s{states} = $node->safe_psql('postgres', "SELECT string_agg(state || ' ' || n, ', ' ORDER BY state)
        FROM (SELECT state, count(*) AS n FROM jobcap.jobs GROUP BY state) s");
	$s{extension} = $node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'jobcap'");
	return \%s;
}
my $before = snapshot($old);
is($before->{states}, 'pending 3, running 2, succeeded 1, dead 1, cancelled 1', 'old: jobs in every state');
my $max_fence = $old->safe_psql('postgres', "SELECT greatest((SELECT max(fence) FROM jobcap.jobs),
    (SELECT max(fence) FROM jobcap.job_errors), (SELECT last_value FROM jobcap.fences))");
cmp_ok($max_fence, '>', $old->safe_psql('postgres', "SELECT max(fence) FROM jobcap.jobs"),
	'old: the rolled-back claim took a fence no row keeps');
my ($running1, $fence1, $running2) = split /\|/, $old->safe_psql('postgres',
	"SELECT (array_agg(job_id ORDER BY job_id))[1], (array_agg(fence ORDER BY job_id))[1],
            (array_agg(job_id ORDER BY job_id))[2] FROM public.claimed");
$old->stop;

# pg_upgrade runs with no jobcap worker on either side; the new cluster preloads jobcap once
# it is upgraded and compared.
my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
my $new_version = $new->pg_version;
my $dir = PostgreSQL::Test::Utils::tempdir;
chdir $dir;
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', "$old_install/bin",
		'-s', $new->host, '-p', $old->port, '-P', $new->port,
		'--copy'
	],
	'pg_upgrade from ' . int($old_version / 10000) . " to $new_version");

$new->start;
cmp_ok(int($new->safe_psql('postgres', 'SHOW server_version_num') / 10000), '>', int($old_version / 10000),
	'the upgraded cluster runs the newer major');
my $after = snapshot($new);
for my $k (sort keys %$before)
{
	is($after->{$k}, $before->{$k}, "$k: the same after the upgrade ($before->{$k})");
}
$new->stop;
$new->append_conf('postgresql.conf', "shared_preload_libraries = 'jobcap'\n"
	  . "jobcap.database = 'postgres'\njobcap.reap_interval = '100ms'\n");
$new->start;

# Fences go on rising; the worker that claimed before the upgrade completes with its fence.
my $next = $new->safe_psql('postgres', "SELECT fence FROM jobcap.claim_job('work', 'w4')");
cmp_ok($next, '>', $max_fence, "the next fence ($next) is above every fence before ($max_fence)");
is($new->safe_psql('postgres', "SELECT jobcap.complete_job($running1, $fence1)"), 'succeeded',
	'a job claimed before the upgrade completes with its fence');

# The reaper serves the upgraded database and reaps an expired lease.
$new->wait_for_log(qr/jobcap reaper is serving database "postgres"/);
$new->safe_psql('postgres', "UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'
    WHERE job_id = $running2");
ok(defined wait_until($new, "SELECT state = 'pending' AND attempts = 1 FROM jobcap.jobs WHERE job_id = $running2"),
	'the reaper reaps an expired lease after the upgrade');
is($new->safe_psql('postgres', "SELECT count(*) FROM jobcap.job_errors WHERE job_id = $running2 AND kind = 'lease_expired'"),
	'1', 'with its history row');
is($new->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE queue = 'work' AND state = 'running'"),
	'1', 'the job claimed after the upgrade still runs');

$new->stop;
done_testing();
