"""MQTT front-end: the cross-node pub/sub relay (UNLOGGED) and the retained messages.

Revision ID: 0002_mqtt
Revises: 0001
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0002_mqtt"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "mqtt.sql")


def downgrade() -> None:
    # Exactly what mqtt.sql created (their indexes and the relay's id sequence go with them).
    op.execute("DROP TABLE IF EXISTS fluxpg.mqtt_retained")
    op.execute("DROP TABLE IF EXISTS fluxpg.mqtt_relay")
