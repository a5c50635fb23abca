-- jobcap.jobs attached by a DBA as a partition (here the default partition of a table whose other
-- partition holds queue 'elsewhere'). An INSERT into a partition checks the partition
-- constraint (ExecPartitionCheck): the SQL path raises 23514 for a job of queue elsewhere.
-- executor_needed looks at relkind, not at relispartition, so the direct path inserts the row
-- (and a claim's UPDATE would move a row out of a constraint on state the same way).
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('elsewhere');
CREATE TABLE public.all_jobs (LIKE jobcap.jobs) PARTITION BY LIST (queue);
CREATE TABLE public.jobs_elsewhere PARTITION OF public.all_jobs FOR VALUES IN ('elsewhere');
ALTER TABLE public.all_jobs ATTACH PARTITION jobcap.jobs DEFAULT;
SELECT jobcap.enqueue_job('elsewhere', '{}') > 0 AS enqueued;
SELECT jobcap.enqueue_jobs('elsewhere', ARRAY['{}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT count(*) AS outside_its_partition FROM jobcap.jobs WHERE queue = 'elsewhere';
ALTER TABLE public.all_jobs DETACH PARTITION jobcap.jobs;
DROP TABLE public.all_jobs;
SELECT jobcap.drop_queue('elsewhere', force => true);
