-- jobcap.jobs attached by a DBA as a partition (here the default partition of a table whose other
-- partition holds queue 'r4_elsewhere'). An INSERT into a partition checks the partition
-- constraint (ExecPartitionCheck): the SQL path raises 23514 for a job of queue r4_elsewhere.
-- executor_needed looks at relkind, not at relispartition, so the direct path inserts the row
-- (and a claim's UPDATE would move a row out of a constraint on state the same way).
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('r4_elsewhere');
CREATE TABLE public.r4_all (LIKE jobcap.jobs) PARTITION BY LIST (queue);
CREATE TABLE public.r4_jobs_elsewhere PARTITION OF public.r4_all FOR VALUES IN ('r4_elsewhere');
ALTER TABLE public.r4_all ATTACH PARTITION jobcap.jobs DEFAULT;
SELECT jobcap.enqueue_job('r4_elsewhere', '{}') > 0 AS enqueued;
SELECT jobcap.enqueue_jobs('r4_elsewhere', ARRAY['{}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT count(*) AS outside_its_partition FROM jobcap.jobs WHERE queue = 'r4_elsewhere';
ALTER TABLE public.r4_all DETACH PARTITION jobcap.jobs;
DROP TABLE public.r4_all;
SELECT jobcap.drop_queue('r4_elsewhere', force => true);
