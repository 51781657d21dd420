"""Upgrades that really upgrade (issue 14): a database migrated by an old fluxpg, upgraded with
today's code, holds exactly what a fresh install holds — functions, views, tables, columns,
indexes, constraints, triggers and comments — and so does every downgrade compared with a fresh
install at that revision. Generic over the revisions: new ones are covered without change here.

The old databases are frozen copies (tests/data/old_schemas/*.sql, made by make.sh beside them
with the old commit's own migrations and sql/): CI's clone may not hold the history."""
from __future__ import annotations

import difflib
import pprint
from pathlib import Path

import psycopg
import pytest

from fluxpg import db, routines
from fluxpg.testing import fresh_database

ACK_DEF = "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname = 'ack' AND pronamespace = 'fluxpg'::regnamespace"
OLD_SCHEMAS = sorted((Path(__file__).resolve().parents[1] / "data" / "old_schemas").glob("*.sql"))


# The log's partitions are data (one per queue and segment), not schema: left out.
PARTITIONS = "SELECT relname FROM pg_class WHERE relnamespace = 'fluxpg'::regnamespace AND relispartition"


def snapshot(dsn: str) -> dict[str, object]:
    """Everything of schema fluxpg a client or a later migration can see, as comparable values."""
    q = {
        "schema comment": "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'fluxpg'",
        "version": "SELECT version_num FROM fluxpg.alembic_version",
        # fluxpg._route_version()'s body is the routing version (state: it depends on the
        # changes made, sql/0017_route_version.sql), not a definition to compare.
        "functions": """SELECT p.oid::regprocedure::text, p.prokind::text,
                               CASE WHEN p.prokind = 'a' THEN NULL
                                    WHEN p.proname = '_route_version'
                                    THEN regexp_replace(pg_get_functiondef(p.oid), 'SELECT -?\\d+::bigint', 'SELECT N::bigint')
                                    ELSE pg_get_functiondef(p.oid) END,
                               obj_description(p.oid, 'pg_proc')
                          FROM pg_proc p WHERE p.pronamespace = 'fluxpg'::regnamespace""",
        "views": """SELECT c.relname, pg_get_viewdef(c.oid), obj_description(c.oid, 'pg_class')
                      FROM pg_class c WHERE c.relnamespace = 'fluxpg'::regnamespace AND c.relkind IN ('v', 'm')""",
        "relations": """SELECT c.relname, c.relkind::text, c.relpersistence::text, c.reloptions::text,
                               obj_description(c.oid, 'pg_class')
                          FROM pg_class c WHERE c.relnamespace = 'fluxpg'::regnamespace AND NOT c.relispartition""",
        "columns": """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                             pg_get_expr(d.adbin, d.adrelid), col_description(c.oid, a.attnum),
                             row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)
                        FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                        LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
                       WHERE c.relnamespace = 'fluxpg'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
                         AND NOT c.relispartition""",
        "indexes": f"""SELECT indexname, indexdef FROM pg_indexes
                        WHERE schemaname = 'fluxpg' AND tablename NOT IN ({PARTITIONS})""",
        "constraints": f"""SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
                             FROM pg_constraint WHERE connamespace = 'fluxpg'::regnamespace
                              AND conrelid::regclass::text NOT IN (SELECT 'fluxpg.' || n FROM ({PARTITIONS}) AS p(n))""",
        "triggers": """SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
                        WHERE NOT tgisinternal AND tgrelid IN
                              (SELECT oid FROM pg_class WHERE relnamespace = 'fluxpg'::regnamespace)""",
        "types": """SELECT t.typname, t.typtype::text, obj_description(t.oid, 'pg_type') FROM pg_type t
                     WHERE t.typnamespace = 'fluxpg'::regnamespace AND t.typcategory <> 'A'
                       AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relispartition)""",
        "sources": "SELECT name, sha256 FROM fluxpg.sql_source",
    }
    out: dict[str, object] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for key, sql in q.items():
            try:
                out[key] = sorted(map(tuple, conn.execute(sql).fetchall()), key=repr)
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                out[key] = None
    return out


def assert_same(got: dict, want: dict, what: str) -> None:
    if got != want:
        diff = difflib.unified_diff(pprint.pformat(want, width=200).splitlines(),
                                    pprint.pformat(got, width=200).splitlines(),
                                    "fresh install", what, lineterm="", n=1)
        pytest.fail(f"{what} differs from a fresh install:\n" + "\n".join(list(diff)[:80]))


@pytest.fixture(scope="module")
def fresh_head(server_dsn):
    with fresh_database(server_dsn) as dsn:
        assert db.migrate(dsn) == ["revision"]
        yield snapshot(dsn)


@pytest.mark.parametrize("old", OLD_SCHEMAS, ids=[p.stem for p in OLD_SCHEMAS])
def test_database_of_an_old_commit_upgrades_to_exactly_a_fresh_install(server_dsn, fresh_head, old):
    with fresh_database(server_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(old.read_text())
            # Work in flight under the old functions: a queue, messages, one claimed.
            conn.execute("SELECT fluxpg.declare_queue('orders', 'classic', NULL, '{}')")
            for i in range(3):
                conn.execute("SELECT * FROM fluxpg.publish('$queue/orders/eu', %s, NULL)", (f"m{i}".encode(),))
            claimed = conn.execute("SELECT seq FROM fluxpg.claim('orders', 'workers', 'c1', 1)").fetchall()
            old_ack = conn.execute(ACK_DEF).fetchall()
        assert db.current_revision(dsn) is not None

        changed = db.migrate(dsn)
        assert changed, "the old functions and views were not re-created"
        assert_same(snapshot(dsn), fresh_head, f"{old.stem} upgraded")
        assert db.migrate(dsn) == [], "a second migrate must find everything current"

        with psycopg.connect(dsn, autocommit=True) as conn:
            if old.stem in ("02a8d05", "7aec865"):  # before c9bc93e changed ack's body
                assert conn.execute(ACK_DEF).fetchall() != old_ack
            # The data survived and today's functions work on it.
            assert conn.execute("SELECT fluxpg.ack('orders', 'workers', %s)", ([claimed[0][0]],)).fetchone()[0] == 1
            rest = conn.execute("SELECT convert_from(payload, 'UTF8') FROM fluxpg.claim('orders', 'workers', 'c1', 10)"
                                ).fetchall()
            assert [r[0] for r in rest] == ["m1", "m2"]


def test_installed_definitions_changed_by_hand_are_restored(server_dsn, fresh_head):
    with fresh_database(server_dsn) as dsn:
        db.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A view with other columns (CREATE OR REPLACE could not bring the old ones back).
            conn.execute("DROP VIEW fluxpg.queue_stats")
            conn.execute("CREATE VIEW fluxpg.queue_stats AS SELECT 1 AS x")
            conn.execute("COMMENT ON FUNCTION fluxpg.enforce_retention() IS 'edited'")
            conn.execute("CREATE FUNCTION fluxpg.leftover() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        assert db.migrate(dsn) == [routines.INSTALLED]
        assert_same(snapshot(dsn), fresh_head, "hand-edited, migrated")


def test_a_changed_source_file_is_reapplied(server_dsn, monkeypatch):
    with fresh_database(server_dsn) as dsn:
        db.migrate(dsn)
        original = routines.read_sql

        def edited(name: str) -> str:
            text = original(name)
            if name == "views.sql":
                text += "\nCOMMENT ON VIEW fluxpg.segments IS 'edited in place';\n"
            return text

        monkeypatch.setattr(routines, "read_sql", edited)
        assert db.migrate(dsn) == ["views.sql"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT obj_description('fluxpg.segments'::regclass, 'pg_class')").fetchone()[0] \
                == "edited in place"
        assert db.migrate(dsn) == []


def test_every_downgrade_matches_a_fresh_install_at_that_revision(server_dsn, fresh_head):
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db._alembic("postgresql://localhost/x"))
    revisions = [rev.revision for rev in script.walk_revisions()][1:] + ["base"]  # below head, newest first
    with fresh_database(server_dsn) as dsn:
        db.migrate(dsn)
        for rev in revisions:
            db.downgrade(dsn, rev)
            with fresh_database(server_dsn) as fresh:
                if rev != "base":
                    db.migrate(fresh, rev)
                assert_same(snapshot(dsn), snapshot(fresh), f"downgraded to {rev}")
        db.migrate(dsn)
        assert_same(snapshot(dsn), fresh_head, "downgraded to base and upgraded again")


def test_fluxpg_migrate_on_an_old_database_says_what_it_recreated(server_dsn):
    """The issue's case: an old database, same revision as head, used to get "up to date"."""
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fluxpg.cli", *args], capture_output=True, timeout=120)

    old = OLD_SCHEMAS[-1]
    with fresh_database(server_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(old.read_text())
        first = run("migrate", "--dsn", dsn)
        assert first.returncode == 0, first.stderr
        out = first.stdout.decode()
        if f"alembic_version VALUES ('{db.head_revision()}')" in old.read_text():  # no revision step runs
            assert "functions and views: re-created (functions.sql changed, views.sql changed, comments changed, " \
                   "installed definitions differed)" in out
        else:
            assert "functions and views: re-created (new revision)" in out
        assert "functions and views: current" in run("migrate", "--dsn", dsn).stdout.decode()
