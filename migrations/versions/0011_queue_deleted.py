"""NOTIFY fluxpg_queues when a durable or stream queue row is deleted, however it was deleted.

Revision ID: 0011_queue_deleted
Revises: 0010_transient
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0011_queue_deleted"
down_revision = "0010_transient"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0011_queue_deleted.sql")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS queues_deleted_notify ON fluxpg.queues")
    op.execute("DROP FUNCTION IF EXISTS fluxpg._queue_deleted()")
