"""fluxpg.log_watchers: a node's appends NOTIFY fluxpg_log only for queues another node consumes
or a SQL listener watches (each NOTIFY wakes every LISTENing backend of the database).

Revision ID: 0015_log_watchers
Revises: 0014_pending_due
Create Date: 2026-11-24
"""
from alembic import op

from fluxpg import routines
from fluxpg.db import run_sql_file

revision = "0015_log_watchers"
down_revision = "0014_pending_due"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0015_log_watchers.sql")


def downgrade() -> None:
    op.execute("DROP TABLE fluxpg.log_watchers")
    # 0013's _outbox_commit body, as a fresh install at 0014 has (fluxpg.routines).
    routines.restore_trigger_functions(op.get_bind())
