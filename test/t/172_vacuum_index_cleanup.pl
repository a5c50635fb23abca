# Every vacuum of jobcap.jobs cleans its indexes (vacuum_index_cleanup = on, set by the 0.2.0
# script). With PostgreSQL's default (auto) a vacuum skips the index pass when fewer than 2% of
# the table's pages hold dead rows; beside a big history of finished jobs that is every vacuum a
# busy queue gets, and the claim index kept the entries of every job claimed since, which each
# claim walks over. This test makes that situation (a history of 150,000 finished jobs, then
# 400 jobs claimed and completed) and counts the claim index's entries after the worker's
# vacuum: one per pending job with the setting, the claimed jobs' entries left over without it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# Autovacuum looks once a day: every vacuum here is the worker's.
my $node = jobcap_node('vacuum_index_cleanup', autovacuum_naptime => "'1d'");
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    CREATE EXTENSION pageinspect;
    SELECT jobcap.create_queue('v');
    -- A history of finished jobs, as a day of retention keeps it.
    INSERT INTO jobcap.jobs (queue, state, attempts, claimed_at, finished_at)
    SELECT 'v', 'succeeded', 1, now(), now() FROM generate_series(1, 150000);
    SELECT count(*) FROM unnest(jobcap.enqueue_jobs('v', array_fill('{}'::jsonb, ARRAY[3000])));
    -- The worker's threshold: 500 dead rows, whatever the history.
    ALTER TABLE jobcap.jobs SET (autovacuum_vacuum_threshold = 500, autovacuum_vacuum_scale_factor = 0);
    VACUUM ANALYZE jobcap.jobs;
});

is($node->safe_psql('postgres', "SELECT option_value FROM pg_options_to_table(
    (SELECT reloptions FROM pg_class WHERE oid = 'jobcap.jobs'::regclass))
    WHERE option_name = 'vacuum_index_cleanup'"), 'on', 'jobcap.jobs has vacuum_index_cleanup = on');

# Entries of the claim index (leaf items other than high keys), and the pending jobs.
sub claim_entries
{
	return $node->safe_psql('postgres', q{
	    SELECT (SELECT count(*)
	              FROM (SELECT b FROM generate_series(1, (pg_relation_size('jobcap.jobs_claim') / 8192)::int - 1) b,
	                           bt_page_stats('jobcap.jobs_claim', b) s
	                     WHERE s.type = 'l') l,
	                   LATERAL bt_page_items('jobcap.jobs_claim', l.b) i
	             WHERE i.htid IS NOT NULL)
	        || ' ' || (SELECT count(*) FROM jobcap.jobs WHERE state = 'pending')});
}

sub vacuum_count
{
	return $node->safe_psql('postgres',
		"SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass");
}

is(claim_entries(), '3000 3000', 'after VACUUM ANALYZE: one claim-index entry per pending job');

# Claims 400 jobs and completes them (800 dead rows, on a few dozen of the table's thousands of
# pages), then waits for the worker's vacuum.
sub claim_and_vacuum
{
	my $before = vacuum_count();
	$node->safe_psql('postgres', "SELECT jobcap.complete_jobs(array_agg(job_id), array_agg(fence))
	    FROM jobcap.claim_job('v', 'w', 400)");
	return defined wait_until($node, "SELECT vacuum_count > $before FROM pg_stat_user_tables
	    WHERE relid = 'jobcap.jobs'::regclass");
}

my $pages = $node->safe_psql('postgres', "SELECT relpages FROM pg_class WHERE oid = 'jobcap.jobs'::regclass");
ok($pages > 2000, "the history fills the table: $pages pages, 2% of them more than the claims touch");

ok(claim_and_vacuum(), '400 jobs claimed and completed: the worker vacuums');
is(claim_entries(), '2600 2600', 'the vacuum removed their claim-index entries');

# The same with PostgreSQL's default: the vacuum skips the index pass and the entries stay,
# which is what the setting is for (and shows this test can tell the two apart).
$node->safe_psql('postgres', "ALTER TABLE jobcap.jobs SET (vacuum_index_cleanup = auto)");
ok(claim_and_vacuum(), 'with vacuum_index_cleanup = auto: the worker vacuums');
is(claim_entries(), '2600 2200', 'and the 400 claimed jobs\' entries stay in the claim index');

$node->safe_psql('postgres', "ALTER TABLE jobcap.jobs SET (vacuum_index_cleanup = on)");
ok(claim_and_vacuum(), 'on again: the worker vacuums');
is(claim_entries(), '1800 1800', 'and every entry left over goes with the new ones');

is($node->safe_psql('postgres', "SELECT count(*) FILTER (WHERE state = 'pending') || ' '
    || count(*) FILTER (WHERE state = 'succeeded') FROM jobcap.jobs"), '1800 151200',
	'no job lost or changed by the vacuums');

$node->stop;
done_testing();
