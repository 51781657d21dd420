"""Redrive: the fluxpg.redriven table (dead letters moved back to their queue by fluxpg.redrive).

Revision ID: 0006_redrive
Revises: 0005_outbox
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0006_redrive"
down_revision = "0005_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # fluxpg.redrive and the claim that skips redriven offsets live in functions.sql, which
    # fluxpg.routines re-creates at head whenever it changed.
    run_sql_file(op.get_bind(), "0006_redrive.sql")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS fluxpg.redriven")
