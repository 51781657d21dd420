"""Initial fluxpg schema: queues, heads, partitioned log, groups, cursors, pending, members,
nodes, the delivery type. The SQL API functions and the inspection views are not part of any
revision: fluxpg.routines creates them at head from sql/functions.sql and sql/views.sql.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Frozen table DDL only (schema.sql is never edited): running today's functions.sql here
    # would tie this revision to today's tables.
    run_sql_file(op.get_bind(), "schema.sql")


def downgrade() -> None:
    # Everything fluxpg created lives in schema fluxpg; only the Alembic version table must
    # survive until Alembic has recorded the downgrade (fluxpg.db.downgrade drops it after).
    # Names are taken as text before anything is dropped: a CASCADE may remove later entries.
    op.execute("""
        DO $$
        DECLARE r record;
        BEGIN
          FOR r IN SELECT format('fluxpg.%I', c.relname) AS rel FROM pg_class c
                    WHERE c.relnamespace = 'fluxpg'::regnamespace AND c.relkind IN ('v', 'm')
          LOOP EXECUTE 'DROP VIEW IF EXISTS ' || r.rel || ' CASCADE'; END LOOP;
          FOR r IN SELECT p.oid::regprocedure::text AS fn FROM pg_proc p WHERE p.pronamespace = 'fluxpg'::regnamespace
          LOOP EXECUTE 'DROP FUNCTION IF EXISTS ' || r.fn || ' CASCADE'; END LOOP;
          FOR r IN SELECT format('fluxpg.%I', c.relname) AS rel FROM pg_class c
                    WHERE c.relnamespace = 'fluxpg'::regnamespace AND c.relkind IN ('r', 'p')
                      AND c.relname <> 'alembic_version' AND NOT c.relispartition
          LOOP EXECUTE 'DROP TABLE IF EXISTS ' || r.rel || ' CASCADE'; END LOOP;
          FOR r IN SELECT format('fluxpg.%I', t.typname) AS typ FROM pg_type t
                    WHERE t.typnamespace = 'fluxpg'::regnamespace AND t.typtype = 'c'
                      AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
          LOOP EXECUTE 'DROP TYPE IF EXISTS ' || r.typ || ' CASCADE'; END LOOP;
        END $$;
    """)
