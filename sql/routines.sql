-- Named queries of the routine re-apply mechanism (fluxpg.routines, run by fluxpg.db.migrate).
-- Functions and views are not frozen per revision: they are re-created from functions.sql and
-- views.sql whenever those files or the installed definitions changed. Each starts with `-- name: x`.

-- name: installed_fingerprint
-- md5 over every function's and view's definition and comment in schema fluxpg: tells whether
-- what is installed is still what the last re-apply left (a hand edit, an old node's migrate).
-- Not fluxpg._route_version(): its body is the routing version, which every routing change
-- replaces (sql/0017_route_version.sql), state rather than a definition.
SELECT md5(coalesce(string_agg(def, E'\n' ORDER BY def), ''))
  FROM (SELECT p.oid::regprocedure::text || E'\n' || pg_get_functiondef(p.oid) || E'\n'
               || coalesce(obj_description(p.oid, 'pg_proc'), '') AS def
          FROM pg_proc p
         WHERE p.pronamespace = 'fluxpg'::regnamespace AND p.prokind IN ('f', 'p', 'w')
           AND p.proname <> '_route_version'
        UNION ALL
        SELECT c.relname || E'\n' || pg_get_viewdef(c.oid) || E'\n' || coalesce(obj_description(c.oid, 'pg_class'), '')
          FROM pg_class c
         WHERE c.relnamespace = 'fluxpg'::regnamespace AND c.relkind IN ('v', 'm')) AS d;

-- name: recorded_sources
-- What the last re-apply recorded (nothing when fluxpg.sql_source does not exist yet).
SELECT name, sha256 FROM fluxpg.sql_source;

-- name: sql_source_exists
SELECT to_regclass('fluxpg.sql_source') IS NOT NULL;

-- name: drop_routines
-- Every view, then every function nothing but views depended on (a trigger's function, created by
-- the revision that created the trigger, stays and is replaced in place; fluxpg._route_version(),
-- which holds the routing version, stays too), and the record of them.
-- One DROP statement per kind and no CASCADE: objects of fluxpg may depend on each other, but if
-- something outside schema fluxpg depends on them the migration stops with PostgreSQL's error
-- instead of silently dropping it.
DO $$
DECLARE
  names text;
BEGIN
  IF to_regnamespace('fluxpg') IS NULL THEN RETURN; END IF;  -- a database never migrated
  SELECT string_agg(c.oid::regclass::text, ', ') INTO names
    FROM pg_class c WHERE c.relnamespace = 'fluxpg'::regnamespace AND c.relkind = 'm';
  IF names IS NOT NULL THEN EXECUTE 'DROP MATERIALIZED VIEW ' || names; END IF;
  SELECT string_agg(c.oid::regclass::text, ', ') INTO names
    FROM pg_class c WHERE c.relnamespace = 'fluxpg'::regnamespace AND c.relkind = 'v';
  IF names IS NOT NULL THEN EXECUTE 'DROP VIEW ' || names; END IF;
  SELECT string_agg(p.oid::regprocedure::text, ', ') INTO names
    FROM pg_proc p
   WHERE p.pronamespace = 'fluxpg'::regnamespace AND p.proname <> '_route_version'
     AND NOT EXISTS (SELECT 1 FROM pg_depend d
                      WHERE d.refclassid = 'pg_proc'::regclass AND d.refobjid = p.oid
                        AND d.classid <> 'pg_proc'::regclass AND d.deptype = 'n');
  IF names IS NOT NULL THEN EXECUTE 'DROP ROUTINE ' || names; END IF;
  DROP TABLE IF EXISTS fluxpg.sql_source;
END $$;

-- name: create_sql_source
CREATE TABLE fluxpg.sql_source (
    name       text PRIMARY KEY,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fluxpg.sql_source IS
  'What fluxpg migrate last installed of the functions and views: per source file (functions.sql, '
  'views.sql) the sha256 of its text, and under name ''installed'' the md5 of the installed definitions. '
  'A difference in either makes the next migrate or broker start re-create all of them.';

-- name: record_source
-- psycopg placeholders: the migration runs on psycopg, not asyncpg.
INSERT INTO fluxpg.sql_source (name, sha256) VALUES (%s, %s);
