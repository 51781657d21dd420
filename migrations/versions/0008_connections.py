"""Connections: fluxpg.connections (every node's live client connections, for the console).

Revision ID: 0008_connections
Revises: 0007_pending_error
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0008_connections"
down_revision = "0007_pending_error"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # fluxpg.report_connections lives in functions.sql (re-created at head by fluxpg.routines).
    run_sql_file(op.get_bind(), "0008_connections.sql")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS fluxpg.connections")
