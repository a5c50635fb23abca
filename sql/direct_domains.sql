-- A column a DBA adds to jobcap.jobs whose type is a domain. The SQL path's INSERT gives a column
-- it does not list its default, and without a column default the domain's own (the rewriter's
-- build_column_default), and coerces what it stores to the domain, checking its constraints
-- (the planner's expand_insert_targetlist). The direct path's learn_defaults looks only at
-- column defaults (atthasdef) and at attnotnull. The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('domain_default');
CREATE DOMAIN public.tier AS int DEFAULT 7;
ALTER TABLE jobcap.jobs ADD COLUMN tier public.tier;
-- 1. The domain's default: 7 on the SQL path, NULL on the direct path.
SELECT jobcap.enqueue_job('domain_default', '{"a": 1}') > 0 AS enqueued;
SELECT array_length(jobcap.enqueue_jobs('domain_default', ARRAY['{"b": 1}', '{"b": 2}']::jsonb[]), 1)
    AS enqueued;
SELECT payload, tier FROM jobcap.jobs WHERE queue = 'domain_default' ORDER BY job_id;
-- 2. A domain that does not allow NULL (its default dropped after the column was added): the
-- SQL path raises 23502, the direct path stores NULL in it.
CREATE DOMAIN public.required AS text DEFAULT 'x' NOT NULL;
ALTER TABLE jobcap.jobs ADD COLUMN required public.required;
ALTER DOMAIN public.required DROP DEFAULT;
SELECT jobcap.enqueue_job('domain_default', '{"c": 1}') > 0 AS enqueued;
SELECT jobcap.enqueue_jobs('domain_default', ARRAY['{"d": 1}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT count(*) AS stored_null FROM jobcap.jobs WHERE required IS NULL;
ALTER TABLE jobcap.jobs DROP COLUMN tier, DROP COLUMN required;
DROP DOMAIN public.tier;
DROP DOMAIN public.required;
SELECT jobcap.drop_queue('domain_default', force => true);
-- 3. The same for jobcap.job_errors, which fail_job's direct path writes (learn_errors uses the
-- same learn_defaults): a domain default on a column a DBA adds to the history.
SELECT jobcap.create_queue('domain_default_fail', max_attempts => 3);
SELECT jobcap.enqueue_job('domain_default_fail', '{}') > 0 AS enqueued;
CREATE DOMAIN public.severity AS int DEFAULT 3;
ALTER TABLE jobcap.job_errors ADD COLUMN severity public.severity;
SELECT jobcap.fail_job(job_id, fence, 'boom', retry_in => '0') AS state
  FROM jobcap.claim_job('domain_default_fail', 'w');
SELECT kind, error, severity FROM jobcap.job_errors WHERE queue = 'domain_default_fail';
ALTER TABLE jobcap.job_errors DROP COLUMN severity;
DROP DOMAIN public.severity;
SELECT jobcap.drop_queue('domain_default_fail', force => true);
