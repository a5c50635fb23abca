-- enqueue_jobs' ids with an identity a DBA made descending. The SQL statement returns
-- array_agg(job_id ORDER BY job_id): ascending, so not in payload order. The direct path returns
-- them in payload order (what src/functions/enqueue.cpp promises). The expected output is the SQL
-- path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('descending_ids');
ALTER TABLE jobcap.jobs ALTER COLUMN job_id SET INCREMENT BY -1 SET MINVALUE -1000000 RESTART WITH -100;
SELECT jobcap.enqueue_jobs('descending_ids', ARRAY['{"i": 1}', '{"i": 2}', '{"i": 3}']::jsonb[]) AS ids;
SELECT job_id, payload FROM jobcap.jobs WHERE queue = 'descending_ids' ORDER BY payload ->> 'i';
SELECT jobcap.drop_queue('descending_ids', force => true);
ALTER TABLE jobcap.jobs ALTER COLUMN job_id SET INCREMENT BY 1;
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'),
              greatest(1, (SELECT max(job_id) FROM jobcap.jobs))) > 0 AS restored;
ALTER TABLE jobcap.jobs ALTER COLUMN job_id SET MINVALUE 1;
