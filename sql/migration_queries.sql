-- Named queries of fluxpg.db's migrate/downgrade (run through SQLAlchemy: binds are written
-- colon-name, so the bodies below keep colons out of their comments). Each starts with `-- name: x`.

-- name: migration_lock
-- Concurrent migrations (fluxpg migrate, every broker start) wait for each other here.
SELECT pg_advisory_lock(:k);

-- name: migration_unlock
SELECT pg_advisory_unlock(:k);

-- name: version_table_exists
SELECT to_regclass('fluxpg.alembic_version') IS NOT NULL;

-- name: current_version
SELECT version_num FROM fluxpg.alembic_version;

-- name: drop_version_table
-- At base: Alembic leaves its version table; nothing of fluxpg is to be left.
DROP TABLE IF EXISTS fluxpg.alembic_version;

-- name: schema_relations
-- How many relations schema fluxpg still holds (NULL when there is no such schema): it is
-- dropped at base only when empty, never with something of someone else's in it.
SELECT CASE WHEN to_regnamespace('fluxpg') IS NOT NULL
            THEN (SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace('fluxpg')) END;

-- name: drop_schema
DROP SCHEMA IF EXISTS fluxpg;
