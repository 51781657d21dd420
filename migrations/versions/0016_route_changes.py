"""fluxpg.route_changes: a routing version fluxpg.publish checks before reusing a session's
cached route (routing over every queue's bindings was most of what publishing cost beyond the
insert).

Revision ID: 0016_route_changes
Revises: 0015_log_watchers
Create Date: 2026-11-29
"""
from alembic import op

from fluxpg import routines
from fluxpg.db import run_sql_file

revision = "0016_route_changes"
down_revision = "0015_log_watchers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0016_route_changes.sql")


def downgrade() -> None:
    for trigger in ("row", "update", "truncate"):
        op.execute(f"DROP TRIGGER queues_route_{trigger} ON fluxpg.queues")
    op.execute("DROP FUNCTION fluxpg._route_changed()")
    op.execute("DROP TABLE fluxpg.route_changes")
    routines.restore_trigger_functions(op.get_bind())
