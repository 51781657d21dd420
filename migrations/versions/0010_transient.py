"""Transient queues: durability / owner columns on fluxpg.queues, a byte counter on heads, the
UNLOGGED default partition of the log that holds transient queues' messages, and the trigger that
removes a transient queue's messages with it.

Revision ID: 0010_transient
Revises: 0009_mqtt_sessions
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0010_transient"
down_revision = "0009_mqtt_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0010_transient.sql")


def downgrade() -> None:
    # Transient queues do not survive a downgrade (their rows need the columns dropped here).
    op.execute("DELETE FROM fluxpg.queues WHERE durability = 'transient'")
    op.execute("DROP TRIGGER IF EXISTS queues_transient_cleanup ON fluxpg.queues")
    op.execute("DROP FUNCTION IF EXISTS fluxpg._transient_cleanup()")
    op.execute("DROP TABLE IF EXISTS fluxpg.log_transient")
    op.execute("ALTER TABLE fluxpg.heads DROP COLUMN IF EXISTS bytes")
    op.execute("ALTER TABLE fluxpg.queues DROP CONSTRAINT IF EXISTS queues_transient_owner, "
               "DROP COLUMN IF EXISTS auto_delete, DROP COLUMN IF EXISTS owner, "
               "DROP COLUMN IF EXISTS owner_node, DROP COLUMN IF EXISTS durability")
