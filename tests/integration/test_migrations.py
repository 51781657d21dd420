"""Schema migrations (Alembic, fluxpg.db.migrate/downgrade) against a real server, and the wheel
carrying sql/ and migrations/ so an installed fluxpg can migrate."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import psycopg
import pytest

from fluxpg import db
from fluxpg.testing import fresh_database

REPO = Path(__file__).resolve().parents[2]

TABLES = ("queues", "heads", "log", "groups", "cursors", "pending", "members", "nodes")  # DESIGN §2
VIEWS = {  # DESIGN §3: the columns each view keeps at least
    "queue_stats": {"queue", "kind", "partitions", "head", "depth", "bytes", "segments", "oldest_at"},
    "group_status": {"queue", "grp", "mode", "partition", "cursor", "committed", "lag", "pending",
                     "oldest_pending_age"},
    "pending_entries": {"queue", "grp", "partition", "seq", "consumer", "idle", "delivery_count"},
    "segments": {"queue", "partition", "name", "from_seq", "to_seq", "rows", "bytes", "min_created_at",
                 "max_created_at"},
}
FUNCTIONS = (  # DESIGN §3 signatures (optional arguments may follow), type names as regtype spells them
    "fluxpg.declare_queue(text, text, text[], jsonb)",
    "fluxpg.publish(text, bytea, jsonb)",
    "fluxpg.append(text, bytea, jsonb)",
    "fluxpg.publish_batch(text[], bytea[], jsonb[])",
    "fluxpg.claim(text, text, text, integer)",
    "fluxpg.read(text, text, text, integer)",
    "fluxpg.ack(text, text, bigint[])",
    "fluxpg.nack(text, text, bigint[])",
    "fluxpg.reject(text, text, bigint[], text)",
    "fluxpg.commit(text, text, bigint)",
    "fluxpg.seek(text, text, text)",
    "fluxpg.claim_stale(text, text, text, interval, integer)",
    "fluxpg.enforce_retention()",
)
# Columns whose meaning is not obvious from their name must say it in a comment (`\d+` shows it).
COMMENTED_COLUMNS = (
    "queues.name", "queues.kind", "queues.topics", "queues.partitions", "queues.segment_size", "queues.settings",
    "heads.next_seq", "heads.first_seq", "log.seq", "log.topic", "log.headers", "log.expires_at",
    "groups.filter", "groups.auto_commit", "cursors.cursor", "cursors.committed", "cursors.owner",
    "pending.consumer", "pending.delivery_count", "pending.visible_at",
)


@pytest.fixture
def database(server_dsn):
    with fresh_database(server_dsn) as dsn:
        yield dsn


def query(dsn: str, sql: str, *args) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def execute(dsn: str, sql: str, *args) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, args)


def scalar(dsn: str, sql: str, *args):
    return query(dsn, sql, *args)[0][0]


def fluxpg_objects(dsn: str) -> dict[str, set[str]]:
    """Relations, functions and types fluxpg owns, by kind (nothing when the schema is gone)."""
    if scalar(dsn, "SELECT to_regnamespace('fluxpg')") is None:
        return {}
    rels = query(dsn, "SELECT relkind::text, relname FROM pg_class WHERE relnamespace = 'fluxpg'::regnamespace")
    procs = query(dsn, "SELECT 'f', proname FROM pg_proc WHERE pronamespace = 'fluxpg'::regnamespace")
    out: dict[str, set[str]] = {}
    for kind, name in rels + procs:
        out.setdefault(kind, set()).add(name)
    return out


def callable_as(dsn: str, signature: str) -> bool:
    """Is there a commented fluxpg function callable with exactly these argument types? Trailing
    arguments added later must have defaults (DESIGN §3: signatures grow, never lose)."""
    name, _, args = signature.partition("(")
    wanted = [a.strip() for a in args.rstrip(")").split(",") if a.strip()]
    rows = query(dsn, "SELECT pronargs, pronargdefaults, proargtypes::oid[]::regtype[]::text[], "
                      "obj_description(oid, 'pg_proc') FROM pg_proc "
                      "WHERE pronamespace = 'fluxpg'::regnamespace AND proname = %s", name.split(".")[1])
    for nargs, ndefaults, types, comment in rows:
        if list(types[:len(wanted)]) == wanted and nargs - ndefaults <= len(wanted):
            assert comment, f"{signature} has no comment"
            return True
    return False


def test_upgrade_creates_the_documented_schema(database):
    assert db.current_revision(database) is None
    db.migrate(database)
    assert db.current_revision(database) == db.head_revision()

    assert scalar(database, "SELECT obj_description('fluxpg'::regnamespace, 'pg_namespace')")
    for table in TABLES:
        kind, comment = query(database, "SELECT relkind::text, obj_description(oid, 'pg_class') FROM pg_class "
                                        "WHERE oid = to_regclass(%s)", f"fluxpg.{table}")[0]
        assert kind in ("r", "p"), table
        assert comment, f"table fluxpg.{table} has no comment"
    assert scalar(database, "SELECT relkind::text FROM pg_class WHERE oid = 'fluxpg.log'::regclass") == "p", \
        "the log is a partitioned table"
    for column in COMMENTED_COLUMNS:
        table, name = column.split(".")
        comment = scalar(database, "SELECT col_description(attrelid, attnum) FROM pg_attribute "
                                   "WHERE attrelid = %s::regclass AND attname = %s", f"fluxpg.{table}", name)
        assert comment, f"column fluxpg.{column} has no comment"

    for view, wanted in VIEWS.items():
        assert scalar(database, "SELECT obj_description(%s::regclass, 'pg_class')", f"fluxpg.{view}"), view
        columns = {r[0] for r in query(database, "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                                                 "AND attnum > 0", f"fluxpg.{view}")}
        assert wanted <= columns, f"fluxpg.{view} lacks {wanted - columns}"
        query(database, f"SELECT * FROM fluxpg.{view} LIMIT 0")  # and they run

    for signature in FUNCTIONS:
        assert callable_as(database, signature), f"{signature} is missing"
    assert scalar(database, "SELECT to_regtype('fluxpg.delivery')") is not None
    delivery = {r[0] for r in query(database, "SELECT attname FROM pg_attribute WHERE attrelid = "
                                              "(SELECT typrelid FROM pg_type WHERE oid = 'fluxpg.delivery'::regtype)")}
    assert {"queue", "grp", "partition", "seq", "topic", "payload", "headers", "created_at", "delivery_count",
            "message_id"} <= delivery

    # Nothing outside the schema: the Alembic version table sits in it too.
    assert scalar(database, "SELECT to_regclass('public.alembic_version')") is None
    assert scalar(database, "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace") == 0


def test_second_upgrade_is_a_no_op(database):
    db.migrate(database)
    query(database, "SELECT fluxpg.declare_queue('kept', 'classic', NULL, '{}')")
    query(database, "SELECT * FROM fluxpg.append('$queue/kept/x', 'payload', NULL)")
    before = fluxpg_objects(database)
    db.migrate(database)
    db.migrate(database, "head")
    assert db.current_revision(database) == db.head_revision()
    assert fluxpg_objects(database) == before  # no object added or dropped by the re-runs
    assert scalar(database, "SELECT convert_from(payload, 'UTF8') FROM fluxpg.log WHERE topic = '$queue/kept/x'") \
        == "payload"



def test_downgrade_to_base_removes_fluxpg_and_nothing_else(database):
    # Somebody else's schema in the same database, with a table of the same name as one of ours.
    execute(database, "CREATE SCHEMA other_app")
    execute(database, "CREATE TABLE other_app.queues (id int PRIMARY KEY, note text)")
    execute(database, "INSERT INTO other_app.queues VALUES (1, 'not fluxpg''s')")
    execute(database, "CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)")
    execute(database, "INSERT INTO public.alembic_version VALUES ('someone-elses')")

    db.migrate(database)
    # Real data in it: queues with log segments, a group, pending entries.
    query(database, "SELECT fluxpg.declare_queue('orders', 'classic', NULL, '{}')")
    query(database, "SELECT fluxpg.declare_queue('events', 'stream', NULL, '{\"partitions\": 2}')")
    for i in range(5):
        query(database, "SELECT * FROM fluxpg.append('$queue/orders/eu', %s, NULL)", f"m{i}".encode())
        query(database, "SELECT * FROM fluxpg.append('$queue/events/x', %s, NULL)", f"e{i}".encode())
    assert len(query(database, "SELECT * FROM fluxpg.claim('orders', 'workers', 'c1', 2)")) == 2
    assert fluxpg_objects(database)

    db.downgrade(database, "base")
    assert db.current_revision(database) is None
    assert scalar(database, "SELECT to_regnamespace('fluxpg')") is None, "schema fluxpg is left behind"
    assert fluxpg_objects(database) == {}
    # No function, type or table of ours anywhere else either.
    assert scalar(database, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')") == 0
    assert query(database, "SELECT id, note FROM other_app.queues") == [(1, "not fluxpg's")]
    assert query(database, "SELECT version_num FROM public.alembic_version") == [("someone-elses",)]

    # …and up again, from nothing, works.
    db.migrate(database)
    assert db.current_revision(database) == db.head_revision()
    query(database, "SELECT fluxpg.declare_queue('orders', 'classic', NULL, '{}')")
    assert query(database, "SELECT queue, seq FROM fluxpg.append('$queue/orders/eu', 'again', NULL)") == \
        [("orders", 0)]


def test_downgrade_step_by_step_and_back(database):
    """Every revision's downgrade down to the first runs, one step at a time, removing what its
    upgrade added; upgrade returns to head. (Down to base: the test above.)"""
    from alembic.script import ScriptDirectory

    db.migrate(database)
    at_head = fluxpg_objects(database)
    script = ScriptDirectory.from_config(db._alembic(database))
    revisions = [rev.revision for rev in script.walk_revisions()]  # head first
    for rev in revisions[1:]:
        db.downgrade(database, rev)
        assert db.current_revision(database) == rev
    at_first = fluxpg_objects(database)
    if len(revisions) > 1:
        assert sum(map(len, at_first.values())) < sum(map(len, at_head.values()))
    db.migrate(database)
    assert db.current_revision(database) == revisions[0]
    assert fluxpg_objects(database) == at_head


def test_wheel_ships_sql_and_migrations_and_migrates_from_them(server_dsn, tmp_path):
    out = tmp_path / "dist"
    # --no-build-isolation: build with the venv's hatchling, no index needed.
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("fluxpg-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "fluxpg/_data/sql/functions.sql" in names
        assert "fluxpg/_data/sql/schema.sql" in names
        assert "fluxpg/_data/migrations/env.py" in names
        assert any(n.startswith("fluxpg/_data/migrations/versions/") and n.endswith(".py") for n in names)
        assert "fluxpg/cli/__init__.py" in names and "fluxpg/cli/__main__.py" in names
        # The console is served from the wheel as is (no build step on the user's machine).
        for page in ("templates/base.html", "templates/queue.html", "static/console.js", "static/console.css"):
            assert f"fluxpg/console/{page}" in names, page
        site = Path(tempfile.mkdtemp(prefix="fluxpg-wheel-", dir=tmp_path))
        zf.extractall(site)

    script = textwrap.dedent("""
        import sys
        import fluxpg, fluxpg.db as db
        assert fluxpg.__file__.startswith(sys.argv[1]), fluxpg.__file__
        print(db.resource_dir("migrations"))
        print(db.resource_dir("sql"))
        db.migrate(sys.argv[2])
        print(db.current_revision(sys.argv[2]) == db.head_revision())
    """)
    with fresh_database(server_dsn) as dsn:
        # The unpacked wheel first on the path, run from a directory that holds no checkout, so
        # the _data/ copies are used and not the repository's sql/ and migrations/.
        env = {**os.environ, "PYTHONPATH": str(site)}
        run = subprocess.run([sys.executable, "-c", script, str(site), dsn], capture_output=True, text=True,
                             cwd=site, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        migrations, sql, at_head = run.stdout.split()
        assert migrations == str(site / "fluxpg" / "_data" / "migrations")
        assert sql == str(site / "fluxpg" / "_data" / "sql")
        assert at_head == "True"
        assert scalar(dsn, "SELECT to_regclass('fluxpg.queues') IS NOT NULL")
