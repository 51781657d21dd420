"""Durable MQTT sessions: fluxpg.mqtt_sessions, mqtt_session_subscriptions, mqtt_session_messages,
mqtt_session_inbound (issue 16).

Revision ID: 0009_mqtt_sessions
Revises: 0008_connections
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0009_mqtt_sessions"
down_revision = "0008_connections"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0009_mqtt_sessions.sql")


def downgrade() -> None:
    for table in ("mqtt_session_inbound", "mqtt_session_messages", "mqtt_session_subscriptions",
                  "mqtt_sessions"):
        op.execute(f"DROP TABLE IF EXISTS fluxpg.{table}")
