"""Migration 0002_mqtt: creates the relay and retained tables (with comments) on top of 0001, and
its downgrade removes exactly what it created."""
from __future__ import annotations

import psycopg

from fluxpg import db
from fluxpg.testing import fresh_database

MQTT_OBJECTS = """
SELECT c.relname, obj_description(c.oid, 'pg_class') AS comment
  FROM pg_class c WHERE c.relnamespace = 'fluxpg'::regnamespace ORDER BY c.relname
"""


def test_0002_mqtt_upgrade_and_downgrade(server_dsn):
    with fresh_database(server_dsn) as dsn:
        db.migrate(dsn, "0001")
        with psycopg.connect(dsn) as c:
            before = c.execute(MQTT_OBJECTS).fetchall()
        db.migrate(dsn, "0002_mqtt")
        with psycopg.connect(dsn) as c:
            after = dict(c.execute(MQTT_OBJECTS).fetchall())
            assert after["mqtt_relay"] and after["mqtt_retained"]   # table comments
            uncommented = c.execute("""
                SELECT a.attrelid::regclass, a.attname FROM pg_attribute a
                 WHERE a.attrelid IN ('fluxpg.mqtt_relay'::regclass, 'fluxpg.mqtt_retained'::regclass)
                   AND a.attnum > 0 AND NOT a.attisdropped AND col_description(a.attrelid, a.attnum) IS NULL
            """).fetchall()
            assert uncommented == []
            persistence = dict(c.execute("SELECT relname, relpersistence FROM pg_class WHERE relname "
                                         "IN ('mqtt_relay', 'mqtt_retained')").fetchall())
            assert persistence == {"mqtt_relay": "u", "mqtt_retained": "p"}
        db.downgrade(dsn, "0001")
        with psycopg.connect(dsn) as c:
            assert c.execute(MQTT_OBJECTS).fetchall() == before
        assert db.current_revision(dsn) == "0001"
