-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path,
-- none is SECURITY DEFINER; new objects get their privileges in the last section.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.2.0'" to load this file. \quit

-- Backups, rolled-back claims, caps.

-- Giving back an unstarted job: release_job.

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- What the Celery and Django-Q adapters call.

-- The hot path's tables and indexes.

-- Privileges of the objects above (the same policy as 0.1.0: PUBLIC gets nothing).
