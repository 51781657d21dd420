"""pending_due only for queries about visible_at: after VACUUM the planner took it for the ack's
DELETE by offsets and read every pending entry of the group per ack.

Revision ID: 0014_pending_due
Revises: 0013_outbox_once
Create Date: 2026-11-24
"""
from alembic import op

from fluxpg import routines
from fluxpg.db import run_sql_file

revision = "0014_pending_due"
down_revision = "0013_outbox_once"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0014_pending_due.sql")


def downgrade() -> None:
    op.execute("DROP INDEX fluxpg.pending_due")
    op.execute("CREATE INDEX pending_due ON fluxpg.pending (group_id, visible_at)")
    # 0013's _outbox_commit body (functions.sql replaces it in place at head; fluxpg.routines).
    routines.restore_trigger_functions(op.get_bind())
