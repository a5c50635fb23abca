-- What the executor does for an UPDATE of jobcap.jobs and the direct path must do too (or leave
-- to the SQL path): refuse to write in a read-only transaction, check CHECK constraints, compute
-- stored generated columns, apply rules. The expected output is the SQL path's
-- (jobcap.hot_path = sql); every query here must give the same on the direct path.
\set VERBOSITY terse
SELECT jobcap.create_queue('divergence', max_attempts => 3);

-- A read-only transaction writes nothing.
SELECT jobcap.enqueue_job('divergence') AS job \gset
SELECT fence FROM jobcap.claim_job('divergence', 'w') \gset
BEGIN READ ONLY;
SELECT jobcap.heartbeat(:job, :fence) IS NOT NULL AS extended;
ROLLBACK;
BEGIN READ ONLY;
SELECT jobcap.complete_job(:job, :fence);
ROLLBACK;
BEGIN READ ONLY;
SELECT jobcap.complete_jobs(ARRAY[:job]::bigint[], ARRAY[:fence]::bigint[]);
ROLLBACK;
BEGIN READ ONLY;
SELECT jobcap.assert_fence(:job, :fence);
ROLLBACK;
SELECT state FROM jobcap.jobs WHERE job_id = :job;
SELECT jobcap.complete_job(:job, :fence);

-- A DBA's CHECK constraint and stored generated column on jobcap.jobs (no trigger, no row
-- security) hold for jobcap's own writes.
ALTER TABLE jobcap.jobs ADD COLUMN is_done boolean GENERATED ALWAYS AS (state = 'succeeded') STORED;
ALTER TABLE jobcap.jobs ADD CONSTRAINT worker_named CHECK (worker IS NULL OR worker <> 'forbidden');
SELECT jobcap.enqueue_job('divergence') AS job \gset
SELECT count(*) AS claimed FROM jobcap.claim_job('divergence', 'forbidden');
SELECT fence FROM jobcap.claim_job('divergence', 'allowed') \gset
SELECT jobcap.complete_job(:job, :fence);
SELECT state, worker, is_done FROM jobcap.jobs WHERE job_id = :job;
ALTER TABLE jobcap.jobs DROP CONSTRAINT worker_named, DROP COLUMN is_done;

-- A rule on UPDATE of jobcap.jobs is applied to settles.
SELECT jobcap.enqueue_job('divergence') AS job \gset
SELECT fence FROM jobcap.claim_job('divergence', 'w') \gset
CREATE TABLE audit (job_id bigint, state text);
CREATE RULE audit_jobs AS ON UPDATE TO jobcap.jobs
    DO ALSO INSERT INTO public.audit VALUES (new.job_id, new.state);
SELECT jobcap.heartbeat(:job, :fence) IS NOT NULL AS extended;
SELECT jobcap.complete_job(:job, :fence);
SELECT count(*) AS audited FROM audit WHERE job_id = :job;
DROP RULE audit_jobs ON jobcap.jobs;
DROP TABLE audit;
SELECT jobcap.drop_queue('divergence', force => true);
