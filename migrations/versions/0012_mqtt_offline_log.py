"""Offline MQTT messages through a shared log: fluxpg.mqtt_offline_log, mqtt_offline_cursors,
mqtt_sessions.offline_dropped (issue 16).

Revision ID: 0012_mqtt_offline_log
Revises: 0011_queue_deleted
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0012_mqtt_offline_log"
down_revision = "0011_queue_deleted"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0012_mqtt_offline_log.sql")


def downgrade() -> None:
    op.execute("ALTER TABLE fluxpg.mqtt_sessions DROP COLUMN IF EXISTS offline_dropped")
    op.execute("DROP TABLE IF EXISTS fluxpg.mqtt_offline_cursors")
    op.execute("DROP TABLE IF EXISTS fluxpg.mqtt_offline_log")
