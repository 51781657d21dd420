"""fluxpg._route_version(): the routing version fluxpg.publish checks, a constant in the catalog
that every routing change replaces (PostgreSQL re-plans the calls that inlined it), instead of
the sum over fluxpg.route_changes that every publish read (a second relation per call).

Revision ID: 0017_route_version
Revises: 0016_route_changes
Create Date: 2026-11-29
"""
from alembic import op

from fluxpg import routines
from fluxpg.db import run_sql, run_sql_file

revision = "0017_route_version"
down_revision = "0016_route_changes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0017_route_version.sql")


def downgrade() -> None:
    bind = op.get_bind()
    # 0016's table, its sum starting above every version of this revision (a session's cached
    # route holds one, and it must not pass for a sum), with 0016's comments, and 0016's body of
    # the trigger function.
    run_sql(bind, "CREATE TABLE fluxpg.route_changes (weight bigint NOT NULL DEFAULT 1 CHECK (weight > 0));"
                  "INSERT INTO fluxpg.route_changes (weight) SELECT last_value + 1 FROM fluxpg.route_versions;")
    for statement in routines.comment_statements():
        if "fluxpg.route_changes" in statement.split(" IS ", 1)[0]:
            run_sql(bind, statement)
    run_sql(bind, routines.revision_function("0016_route_changes.sql", "_route_changed"))
    run_sql(bind, "DROP FUNCTION fluxpg._route_version(); DROP SEQUENCE fluxpg.route_versions;")
    # Below head, every trigger function holds its revision's body (fluxpg.routines).
    routines.restore_trigger_functions(bind)
