-- A DBA archives history into an inheritance child of jobcap.job_errors. The SQL path's
-- DELETE FROM jobcap.job_errors (and its subquery) include the child's rows: with
-- jobcap.error_history = 1 the job's archived row goes too. The direct path scans only
-- job_errors_job, the parent's index, and leaves it.
\set VERBOSITY terse
SET jobcap.hot_path = direct;
SELECT jobcap.create_queue('errors_inherit', max_attempts => 100, backoff_base => '0', backoff_max => '0');
SELECT jobcap.enqueue_job('errors_inherit', '{}') AS j \gset
CREATE TABLE public.errors_archive () INHERITS (jobcap.job_errors);
SELECT jobcap.fail_job(:j, fence, 'e1', retry_in => '0') FROM jobcap.claim_job('errors_inherit', 'w');
INSERT INTO public.errors_archive SELECT * FROM ONLY jobcap.job_errors WHERE queue = 'errors_inherit';
DELETE FROM ONLY jobcap.job_errors WHERE queue = 'errors_inherit';
SET jobcap.error_history = 1;
SELECT jobcap.fail_job(:j, fence, 'e2', retry_in => '0') FROM jobcap.claim_job('errors_inherit', 'w');
-- SQL path: only e2, in jobcap.job_errors.
SELECT tableoid::regclass, attempt, error FROM jobcap.job_errors WHERE queue = 'errors_inherit' ORDER BY seq;
RESET jobcap.error_history;
DROP TABLE public.errors_archive;
-- ANALYZE clears the parent's relhassubclass, which the direct path reads as "has a child".
ANALYZE jobcap.job_errors;
SELECT jobcap.drop_queue('errors_inherit', force => true);
DELETE FROM jobcap.job_errors WHERE queue = 'errors_inherit';
