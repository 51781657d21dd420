"""fluxpg.pending.last_error: a message whose dead-lettering failed inside claim (DLQ full) is
parked with the reason instead of making every claim of its group raise.

Revision ID: 0007_pending_error
Revises: 0006_redrive
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0007_pending_error"
down_revision = "0006_redrive"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0007_pending_error.sql")


def downgrade() -> None:
    op.execute("ALTER TABLE fluxpg.pending DROP COLUMN IF EXISTS last_error")
