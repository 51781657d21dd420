"""Outbox: fluxpg.staged (messages of open transactions) and fluxpg.outbox (committed, waiting for
the sequencer), so fluxpg.publish no longer holds a queue's head lock until the caller commits.

Revision ID: 0005_outbox
Revises: 0004_mqtt_shared
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0005_outbox"
down_revision = "0004_mqtt_shared"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0005_outbox.sql")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS fluxpg.staged")
    op.execute("DROP TABLE IF EXISTS fluxpg.outbox")
    op.execute("DROP FUNCTION IF EXISTS fluxpg._commit_staged()")
