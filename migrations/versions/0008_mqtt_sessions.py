"""Durable MQTT sessions: fluxpg.mqtt_sessions, mqtt_session_subscriptions, mqtt_session_messages,
mqtt_session_inbound (issue 16).

Revision ID: 0008_mqtt_sessions
Revises: 0007_pending_error
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0008_mqtt_sessions"
down_revision = "0007_pending_error"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0008_mqtt_sessions.sql")


def downgrade() -> None:
    for table in ("mqtt_session_inbound", "mqtt_session_messages", "mqtt_session_subscriptions",
                  "mqtt_sessions"):
        op.execute(f"DROP TABLE IF EXISTS fluxpg.{table}")
