-- Calls for throughput: many jobs enqueued in one statement; complete-and-claim-next in one
-- transaction (one commit per job), fenced like complete_job.
\set VERBOSITY terse
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 4000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 400, false) IS NOT NULL AS fences_reset;
SELECT jobcap.create_queue('bulk', backoff_base => '0', backoff_max => '0');

SELECT jobcap.enqueue_jobs('bulk', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[], priority => 5) AS ids \gset
SELECT cardinality(:'ids'::bigint[]) AS enqueued;
-- Ids come back in payload order.
SELECT u.n, j.payload, j.priority FROM unnest(:'ids'::bigint[]) WITH ORDINALITY u(id, n)
  JOIN jobcap.jobs j ON j.job_id = u.id ORDER BY u.n;
SELECT jobcap.enqueue_jobs('bulk', '{}') AS none;
SELECT jobcap.enqueue_jobs('bulk', ARRAY['{}', NULL]::jsonb[]);
SELECT jobcap.enqueue_jobs('bulk', NULL);
SELECT jobcap.enqueue_jobs('nowhere', ARRAY['{}']::jsonb[]);
SELECT count(*) AS jobs FROM jobcap.jobs WHERE queue = 'bulk';

-- complete_and_claim: the first claim is a plain claim; each later call settles the previous
-- job and claims the next in the same transaction.
SELECT job_id, fence FROM jobcap.claim_job('bulk', 'w') \gset
SELECT payload->>'n' AS n, attempt FROM jobcap.complete_and_claim(:job_id, :fence, 'bulk', 'w') \gset
SELECT :n AS claimed_next;
SELECT state FROM jobcap.jobs WHERE job_id = :job_id;
SELECT job_id, fence FROM jobcap.jobs WHERE queue = 'bulk' AND state = 'running' \gset
SELECT payload->>'n' AS n FROM jobcap.complete_and_claim(:job_id, :fence, 'bulk', 'w');
SELECT job_id AS last_job, fence AS last_fence FROM jobcap.jobs WHERE queue = 'bulk' AND state = 'running' \gset
-- A stale fence raises before anything is claimed or completed.
SELECT jobcap.enqueue_job('bulk', '{"n": 4}') IS NOT NULL AS enqueued;
SELECT * FROM jobcap.complete_and_claim(:last_job, :last_fence - 1, 'bulk', 'w');
\echo :LAST_ERROR_SQLSTATE
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'bulk' GROUP BY state ORDER BY state;
-- The last job completes and nothing is left to claim but job 4.
SELECT payload->>'n' AS n FROM jobcap.complete_and_claim(:last_job, :last_fence, 'bulk', 'w');
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'bulk' GROUP BY state ORDER BY state;
SELECT * FROM jobcap.complete_and_claim(:last_job, :last_fence, 'bulk', '');

-- complete_jobs: one statement for a batch, all or nothing.
SELECT count(jobcap.enqueue_job('bulk')) FROM generate_series(1, 5);
SELECT array_agg(job_id ORDER BY job_id) AS ids, array_agg(fence ORDER BY job_id) AS fences
  FROM jobcap.claim_job('bulk', 'w', 10) \gset
SELECT cardinality(:'ids'::bigint[]) AS claimed;
-- One stale fence in the batch: JC001 for that job, and none of the others is completed.
SELECT jobcap.complete_jobs(:'ids'::bigint[], array_append(trim_array(:'fences'::bigint[], 1), 0));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS still_running FROM jobcap.jobs WHERE job_id = ANY (:'ids'::bigint[]) AND state = 'running';
SELECT jobcap.complete_jobs(:'ids'::bigint[], :'fences'::bigint[]) AS completed;
SELECT count(*) AS succeeded FROM jobcap.jobs WHERE job_id = ANY (:'ids'::bigint[]) AND state = 'succeeded';
SELECT jobcap.complete_jobs(:'ids'::bigint[], :'fences'::bigint[]);
SELECT jobcap.complete_jobs('{}', '{}') AS nothing;
-- A job listed twice, once under a stale fence, is still all or nothing.
SELECT jobcap.enqueue_job('bulk') AS twice \gset
SELECT fence AS twice_fence FROM jobcap.claim_job('bulk', 'w') \gset
SELECT jobcap.complete_jobs(ARRAY[:twice, :twice], ARRAY[:twice_fence - 1, :twice_fence]);
\echo :LAST_ERROR_SQLSTATE
SELECT state FROM jobcap.jobs WHERE job_id = :twice;
SELECT jobcap.complete_jobs(ARRAY[:twice, :twice], ARRAY[:twice_fence, :twice_fence]) AS completed_once;
SELECT jobcap.complete_jobs('{1,2}', '{1}');
SELECT jobcap.complete_jobs('{1,NULL}', '{1,2}');
SELECT jobcap.complete_jobs(NULL, '{1}');

SELECT jobcap.drop_queue('bulk', force => true);
