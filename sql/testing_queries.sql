-- Named queries of fluxpg.testing (psycopg; {} is a psycopg.sql identifier filled in by the
-- caller). Each starts with `-- name: x`.

-- name: create_database
-- template0 + C collation: nobody is ever connected to template0 (so parallel runs can create at
-- once), and the collation does not depend on the server's locale.
CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C';

-- name: drop_database_force
DROP DATABASE IF EXISTS {} WITH (FORCE);

-- name: drop_database
-- No FORCE: a database somebody still uses is not stale, whatever its name says.
DROP DATABASE IF EXISTS {};

-- name: test_databases
SELECT datname FROM pg_database WHERE datname LIKE %s;
