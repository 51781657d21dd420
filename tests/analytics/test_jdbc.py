"""DSN → JDBC conversion, driver discovery, range planning and position parsing (no Spark started)."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fluxpg.analytics import jdbc
from fluxpg.analytics.jdbc import (AnalyticsError, SeqRange, find_jdbc_jars, jdbc_target, parse_position,
                                   partition_count, plan_predicates, sanitize_view_name)

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _clean_pg_env(monkeypatch):
    for var in ("PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD", "FLUXPG_JDBC_JAR"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("dsn, url, props", [
    ("postgresql://postgres@127.0.0.1:5432/postgres", "jdbc:postgresql://127.0.0.1:5432/postgres",
     {"user": "postgres"}),
    ("postgres://u:p%40ss@db.example:6543/my%20db?sslmode=require&application_name=x",
     "jdbc:postgresql://db.example:6543/my%20db", {"user": "u", "password": "p@ss", "sslmode": "require",
                                                   "ApplicationName": "x"}),
    ("host=10.0.0.5 port=5433 dbname=fx user=alice password=secret connect_timeout=7",
     "jdbc:postgresql://10.0.0.5:5433/fx", {"user": "alice", "password": "secret", "connectTimeout": "7"}),
    ("postgresql://u@[::1]:5432/d", "jdbc:postgresql://[::1]:5432/d", {"user": "u"}),
    ("postgresql://u@h1:5433,h2/d?target_session_attrs=read-write", "jdbc:postgresql://h1:5433,h2:5432/d",
     {"targetServerType": "primary"}),
    ("postgresql://bob@/bobs", "jdbc:postgresql://localhost:5432/bobs", {"user": "bob"}),
])
def test_dsn_to_jdbc(dsn, url, props):
    t = jdbc_target(dsn)
    assert t.url == url
    assert t.properties["driver"] == "org.postgresql.Driver"
    for k, v in props.items():
        assert t.properties[k] == v
    assert "password" not in t.url


def test_dsn_defaults_follow_libpq_environment(monkeypatch):
    monkeypatch.setenv("PGHOST", "pg.internal")
    monkeypatch.setenv("PGPORT", "6000")
    monkeypatch.setenv("PGUSER", "carol")
    t = jdbc_target("dbname=x")
    assert t.url == "jdbc:postgresql://pg.internal:6000/x"
    assert t.properties["user"] == "carol"
    assert jdbc_target("user=dave").url.endswith("/dave")  # dbname defaults to the user, as in libpq


def test_unix_socket_dsn():
    with pytest.raises(AnalyticsError, match="unix socket /var/run/postgresql.*TCP address"):
        jdbc_target("postgresql://postgres@/fx?host=/var/run/postgresql")
    t = jdbc_target("host=/tmp port=5444 dbname=fx user=u", unix_socket_jar=True)
    assert t.url.startswith("jdbc:postgresql://localhost/fx?socketFactory=org.newsclub.net.unix.AFUNIXSocketFactory$FactoryArg")
    assert "socketFactoryArg=/tmp/.s.PGSQL.5444" in t.url


def test_bad_dsn_is_one_line_error():
    with pytest.raises(AnalyticsError, match="invalid DSN"):
        jdbc_target("postgresql://u@h:notaport/d")
    with pytest.raises(AnalyticsError, match="invalid DSN"):
        jdbc_target("host=h port=5432 =oops")


def test_driver_discovery(tmp_path, monkeypatch):
    jar = tmp_path / "postgresql-42.7.jar"
    jar.write_bytes(b"PK")
    assert find_jdbc_jars([str(jar)]) == [str(jar)]
    monkeypatch.setenv("FLUXPG_JDBC_JAR", str(jar))
    assert find_jdbc_jars() == [str(jar)]
    monkeypatch.setenv("FLUXPG_JDBC_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(AnalyticsError, match="FLUXPG_JDBC_JAR=.*missing.jar: no such file"):
        find_jdbc_jars()
    monkeypatch.delenv("FLUXPG_JDBC_JAR")
    assert find_jdbc_jars(search=[str(tmp_path / "nope.jar"), str(jar)]) == [str(jar.resolve())]
    with pytest.raises(AnalyticsError, match="--jars: no such file"):
        find_jdbc_jars([str(tmp_path / "x.jar")])


def test_missing_driver_message(monkeypatch, dsn):
    """Without any driver every command stops with one line saying how to install it."""
    from fluxpg.analytics.cli import app

    monkeypatch.setattr(jdbc, "DEFAULT_JAR_PATHS", ("/nonexistent/postgresql.jar",))
    for args in (["report"], ["sql", "select 1"], ["export", "q", "--out", "/tmp/x"], ["follow", "q", "-g", "g", "--out", "/tmp/x"]):
        result = CliRunner().invoke(app, [*args, "--dsn", dsn])
        assert result.exit_code == 1, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1, result.output
        assert lines[0].startswith("error: PostgreSQL JDBC driver not found")
        assert "apt-get install libpostgresql-jdbc-java" in lines[0]
        assert "FLUXPG_JDBC_JAR" in lines[0]
        assert "Traceback" not in result.output


def test_no_dsn_is_an_error(monkeypatch):
    from fluxpg.analytics.cli import app

    monkeypatch.delenv("FLUXPG_DSN", raising=False)
    result = CliRunner().invoke(app, ["report"])
    assert result.exit_code == 1
    assert "no database: pass --dsn" in result.output


def test_cli_module_does_not_import_pyspark():
    import subprocess
    import sys

    code = "import sys, fluxpg.analytics.cli; print('pyspark' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False"


def test_partition_count_follows_size():
    assert partition_count(0, 2) == 1
    assert partition_count(10, 2) == 1
    assert partition_count(250_001, 2) == 2
    assert partition_count(1_000_000, 2) == 4
    assert partition_count(100_000_000, 2) == 8   # at most 4 × cores
    assert partition_count(100_000_000, 16) == 64
    # large payloads: one partition per 256 MB on disk as well
    assert partition_count(10_000, 2, size=10_000 * 100_000) == 4
    assert partition_count(10_000, 16, size=10_000 * 100_000) == 4
    assert partition_count(1_000, 16, size=0) == 1


def _covered(predicates):
    """Expand predicates back into the set of (queue, partition, seq) they select."""
    got = []
    for p in predicates:
        for q, part, lo, hi in re.findall(r'queue_id = (\d+) AND "partition" = (\d+) AND seq >= (\d+) AND seq < (\d+)', p):
            got += [(int(q), int(part), s) for s in range(int(lo), int(hi))]
    return got


def test_plan_predicates_cover_ranges_exactly_once():
    ranges = [SeqRange(1, 0, 0, 10), SeqRange(1, 1, 5, 12), SeqRange(2, 0, 100, 103)]
    want = sorted((r.queue_id, r.partition, s) for r in ranges for s in range(r.lo, r.hi))
    for n in (1, 2, 3, 7, 20, 100):
        preds = plan_predicates(ranges, n)
        assert len(preds) == min(n, len(want))
        got = _covered(preds)
        assert sorted(got) == want and len(got) == len(set(got))
        sizes = [len(_covered([p])) for p in preds]
        assert max(sizes) - min(sizes) <= max(sizes) // 2 + 1  # about equal pieces
    assert plan_predicates([], 4) == ["1 = 0"]
    assert plan_predicates([SeqRange(1, 0, 5, 5)], 4) == ["1 = 0"]


def test_parse_position():
    assert parse_position("42").offset == 42
    assert parse_position("offset=7").offset == 7
    assert parse_position("timestamp=1700000000000").time == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert parse_position("timestamp=1700000000").time == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert parse_position("2026-01-31T12:00:00Z").time == datetime(2026, 1, 31, 12, tzinfo=timezone.utc)
    assert parse_position("2026-01-31 12:00").time == datetime(2026, 1, 31, 12, tzinfo=timezone.utc)
    with pytest.raises(AnalyticsError, match="invalid --from 'yesterday'"):
        parse_position("yesterday", "--from")


def test_view_names():
    assert sanitize_view_name("orders") == "q_orders"
    assert sanitize_view_name("$dlq/orders") == "q_dlq_orders"
    assert sanitize_view_name("Sensor.Readings-EU") == "q_sensor_readings_eu"
