# enqueue_jobs on the direct path writes heap_multi_insert records (many rows per page, toasted
# payloads, a DBA's extra indexes): a streaming standby replays them, crash recovery keeps the
# committed batches and drops an open one, wal_consistency_checking finds every replayed page as
# written, and amcheck finds every index entry.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

my $primary = jobcap_node('mi_primary', allows_streaming => 1, wal_keep_size => "'2GB'",
	wal_consistency_checking => "'heap,heap2,btree,hash'");
$primary->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    CREATE EXTENSION amcheck;
    SELECT jobcap.create_queue('mi');
    CREATE INDEX jobs_r4_hash ON jobcap.jobs USING hash (payload);
    CREATE INDEX jobs_r4_payload ON jobcap.jobs (queue, payload) WHERE payload ? 'pad';
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('mi_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;

my $batch = q{SELECT array_length(jobcap.enqueue_jobs('mi', (SELECT array_agg(CASE WHEN n %% 500 = 0
      THEN jsonb_build_object('n', n, 'blob', (SELECT string_agg(md5(i::text || n), '') FROM generate_series(1, 3000) i))
      ELSE jsonb_build_object('n', n, 'pad', repeat('x', n %% 200)) END ORDER BY n) FROM generate_series(%d, %d) n)), 1)};
my ($out, $err) = ('', '');
$primary->psql('postgres', "SET client_min_messages = debug2; " . sprintf($batch, 1, 2500),
	stdout => \$out, stderr => \$err);
is($out, '2500', 'a batch of 2500');
like($err, qr/enqueue_jobs takes the direct path/, 'on the direct path');
$primary->safe_psql('postgres', 'CHECKPOINT');
$primary->safe_psql('postgres', sprintf($batch, 2501, 4000));

my $open = $primary->background_psql('postgres', on_error_stop => 0);
$open->query_safe('BEGIN');
$open->query_safe(sprintf($batch, 4001, 6000));
$primary->safe_psql('postgres', 'CHECKPOINT');
$primary->safe_psql('postgres', sprintf($batch, 6001, 6100));

my $rows = q{SELECT count(*), md5(string_agg(job_id || ':' || (payload->>'n') || ':' || length(payload::text), ',' ORDER BY job_id)) FROM jobcap.jobs};
my $before = $primary->safe_psql('postgres', $rows);
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', $rows), $before, 'the standby has every committed row');

my $offset = -s $primary->logfile;
$primary->stop('immediate');
eval { $open->quit };
$primary->start;
my $log = slurp_file($primary->logfile, $offset);
like($log, qr/automatic recovery in progress/, 'crash recovery ran');
unlike($log, qr/inconsistent page found/, 'wal_consistency_checking: every replayed page as written');
is($primary->safe_psql('postgres', $rows), $before, 'committed batches survived, the open one is gone');
is($primary->safe_psql('postgres', "SELECT count(*) FROM jobcap.jobs WHERE (payload->>'n')::int BETWEEN 4001 AND 6000"),
	'0', 'no row of the open batch');

is($primary->safe_psql('postgres', q{SELECT count(*) FROM verify_heapam('jobcap.jobs')}), '0', 'verify_heapam');
$primary->safe_psql('postgres', q{SELECT bt_index_check(c.oid, true) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = 'jobcap.jobs'::regclass AND a.amname = 'btree'});
pass('bt_index_check(heapallindexed) on every btree of jobcap.jobs');
is($primary->safe_psql('postgres', q{SET enable_seqscan = off; SET enable_bitmapscan = off;
    SELECT count(*) FROM jobcap.jobs j WHERE payload = (SELECT payload FROM jobcap.jobs k WHERE k.job_id = j.job_id)}),
	$primary->safe_psql('postgres', 'SELECT count(*) FROM jobcap.jobs'), 'every row found through the hash index');
$primary->wait_for_catchup($standby);
$log = slurp_file($standby->logfile);
unlike($log, qr/inconsistent page found/, 'the standby: every replayed page as written');
is($standby->safe_psql('postgres', $rows), $before, 'the standby after the crash');
$standby->safe_psql('postgres', q{SELECT bt_index_check(c.oid, true) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = 'jobcap.jobs'::regclass AND a.amname = 'btree'});
pass('bt_index_check on the standby');
done_testing();
