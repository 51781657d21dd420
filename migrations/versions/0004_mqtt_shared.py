"""MQTT shared subscriptions across nodes: fluxpg.mqtt_shared (per-node group membership, with a
NOTIFY trigger) and the per-node message sequence on fluxpg.mqtt_relay.

Revision ID: 0004_mqtt_shared
Revises: 0003_auth
Create Date: 2026-11-24
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0004_mqtt_shared"
down_revision = "0003_auth"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "mqtt_shared.sql")


def downgrade() -> None:
    # Exactly what mqtt_shared.sql added; the table's trigger and index go with it.
    op.execute("DROP TABLE IF EXISTS fluxpg.mqtt_shared")
    op.execute("DROP FUNCTION IF EXISTS fluxpg.mqtt_shared_notify()")
    op.execute("ALTER TABLE fluxpg.mqtt_relay DROP COLUMN IF EXISTS seq")
