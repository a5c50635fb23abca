-- The install: it adopts schema jobcap only when a superuser owns it, nobody else may create in
-- it and it is empty; it creates its two roles once per cluster and leaves them at DROP
-- EXTENSION; it refuses roles of those names that are more than group roles; and it takes back
-- privileges that default privileges would hand out. (Runs last: it drops the extension.)
\set VERBOSITY terse
CREATE ROLE regress_squatter;
GRANT CREATE ON DATABASE :"DBNAME" TO regress_squatter;

-- DROP EXTENSION leaves the roles and the (empty) schema; installing again adopts both.
DROP EXTENSION jobcap;
SELECT rolname FROM pg_roles WHERE rolname LIKE 'jobcap\_%' ORDER BY 1;
SELECT nspname, pg_get_userbyid(nspowner) = current_user AS ours,
       (SELECT count(*) FROM pg_depend WHERE refobjid = n.oid AND refclassid = 'pg_namespace'::regclass) AS dependents
  FROM pg_namespace n WHERE nspname = 'jobcap';
CREATE EXTENSION jobcap;

-- A schema jobcap made by an ordinary role (one with CREATE on the database) is refused.
DROP EXTENSION jobcap;
DROP SCHEMA jobcap;
SET ROLE regress_squatter;
CREATE SCHEMA jobcap;
RESET ROLE;
CREATE EXTENSION jobcap;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'jobcap';

-- A superuser's schema that already holds something is refused: a function, a table, an
-- operator someone put there would sit on the install's own path.
ALTER SCHEMA jobcap OWNER TO CURRENT_USER;
CREATE FUNCTION jobcap.backoff(integer, interval, interval) RETURNS interval LANGUAGE sql
    AS $$ SELECT interval '100 years' $$;
CREATE EXTENSION jobcap;
DROP FUNCTION jobcap.backoff(integer, interval, interval);
CREATE TABLE jobcap.queues (queue text);
CREATE EXTENSION jobcap;
DROP TABLE jobcap.queues;
CREATE OPERATOR jobcap.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = int8eq);
CREATE EXTENSION jobcap;
DROP OPERATOR jobcap.= (bigint, bigint);

-- ... and so is one where another role may create objects.
GRANT CREATE ON SCHEMA jobcap TO regress_squatter;
CREATE EXTENSION jobcap;
REVOKE CREATE ON SCHEMA jobcap FROM regress_squatter;

-- Roles named jobcap_worker or jobcap_operator must be plain group roles to be adopted.
ALTER ROLE jobcap_worker LOGIN;
CREATE EXTENSION jobcap;
ALTER ROLE jobcap_worker NOLOGIN;
ALTER ROLE jobcap_operator CREATEROLE;
CREATE EXTENSION jobcap;
ALTER ROLE jobcap_operator NOCREATEROLE;
GRANT pg_read_all_data TO jobcap_operator;
CREATE EXTENSION jobcap;
REVOKE pg_read_all_data FROM jobcap_operator;

-- Default privileges of the installing role would grant jobcap's tables and functions to
-- others: the install takes them back, and warns (CREATE EXTENSION hides notices).
ALTER DEFAULT PRIVILEGES GRANT SELECT, INSERT ON TABLES TO regress_squatter;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO regress_squatter;
CREATE EXTENSION jobcap;
SELECT count(*) AS squatter_grants FROM (
    SELECT FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.relnamespace = 'jobcap'::regnamespace AND a.grantee = 'regress_squatter'::regrole
    UNION ALL
    SELECT FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.pronamespace = 'jobcap'::regnamespace AND a.grantee = 'regress_squatter'::regrole) g;
ALTER DEFAULT PRIVILEGES REVOKE SELECT, INSERT ON TABLES FROM regress_squatter;
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM regress_squatter;

-- Roles are cluster-wide: a second database's install finds them and goes ahead.
\set first_db :DBNAME
CREATE DATABASE regress_jobcap_second;
\c regress_jobcap_second
CREATE EXTENSION jobcap;
SELECT count(*) AS roles FROM pg_roles WHERE rolname IN ('jobcap_worker', 'jobcap_operator');
SELECT jobcap.create_queue('elsewhere');
DROP EXTENSION jobcap;
\c :first_db
DROP DATABASE regress_jobcap_second;
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'jobcap';

DROP OWNED BY regress_squatter;
DROP ROLE regress_squatter;
