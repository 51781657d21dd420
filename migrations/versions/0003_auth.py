"""Authentication: the fluxpg.users table (hashed passwords and per-user permissions).

Revision ID: 0003_auth
Revises: 0002_mqtt
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0003_auth"
down_revision = "0002_mqtt"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "auth.sql")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS fluxpg.users")
