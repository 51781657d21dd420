"""Functions and views follow their source: re-created whenever sql/functions.sql or sql/views.sql
changed, or what is installed is no longer what fluxpg installed — detected, not remembered.

Tables are versioned by Alembic revisions whose DDL is frozen (sql/schema.sql for 0001, one
sql/<revision>_*.sql per later revision). Functions and views are not: they are edited in place
and their source is the truth at the head revision. `fluxpg.db.migrate` (the CLI's `fluxpg
migrate` and every broker start, under the migration advisory lock) therefore:

1. before any revision step runs, drops every view and every function only views depended on
   (views may depend on columns a step changes; functions may have changed signature), and
2. at head, compares the sha256 of each source file and the md5 of the installed definitions
   (sql/routines.sql, `installed_fingerprint`) with what `fluxpg.sql_source` recorded; on any
   difference it drops and re-creates all of them, in the same transaction, and records anew.

Comments are documentation, edited in place like functions: the `COMMENT ON` statements of the
revision files (schema.sql, mqtt.sql, …) are re-applied at head too, so an old database gets
today's table and column comments (a comment on an object a later revision dropped is skipped).

Below head (`fluxpg migrate --revision R`, `--downgrade R`) no functions or views are installed:
today's definitions belong to today's tables, so a database at R holds exactly R's tables, like
a fresh install at R. Running a fluxpg whose head is R migrates it back to a usable state.
"""
from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from fluxpg.db import queries, read_sql, resource_dir

log = logging.getLogger("fluxpg.routines")

# In the order they are created: views use functions (views.sql also holds the helper functions
# only views use). New files of CREATE OR REPLACE definitions are added here.
SOURCE_FILES = ("functions.sql", "views.sql")
INSTALLED = "installed"  # the sql_source row holding the fingerprint of the installed definitions
COMMENTS = "comments"    # the sql_source row of the COMMENT ON statements of the revision files

# COMMENT ON … IS 'text' (quotes doubled inside; adjacent literals on new lines) or IS NULL.
_COMMENT = re.compile(r"^COMMENT ON\b.*?\bIS\s+(?:NULL|'(?:[^']|'')*'(?:\s*\n\s*'(?:[^']|'')*')*)\s*;",
                      re.S | re.M)


def _q(name: str) -> str:
    return queries("routines.sql")[name]


def comment_statements() -> list[str]:
    """The COMMENT ON statements of the revision files (every sql/ file that is neither a source
    file here nor a file of named queries), schema.sql's first."""
    names = sorted((p.name for p in resource_dir("sql").glob("*.sql")), key=lambda n: (n != "schema.sql", n))
    out = []
    for name in names:
        text = read_sql(name)
        if name in SOURCE_FILES or "-- name:" in text:
            continue
        out.extend(m.group(0) for m in _COMMENT.finditer(text))
    return out


def source_hashes() -> dict[str, str]:
    hashes = {name: hashlib.sha256(read_sql(name).encode("utf-8")).hexdigest() for name in SOURCE_FILES}
    hashes[COMMENTS] = hashlib.sha256("\n".join(comment_statements()).encode("utf-8")).hexdigest()
    return hashes


def _raw(bind: Any):
    """The psycopg connection under an SQLAlchemy connection: whole files, no parameter parsing."""
    return bind.connection.dbapi_connection


def _scalar(raw: Any, sql: str) -> Any:
    with raw.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def drop(bind: Any) -> None:
    """Drop every view, every function nothing but views needs, and their record."""
    with _raw(bind).cursor() as cur:
        cur.execute(_q("drop_routines"))


# Trigger functions that functions.sql replaces in place at head (drop_routines keeps them: their
# triggers need them), each with the revision file that creates it. A database downgraded below
# head must hold that revision's body again, as a fresh install at the revision does.
FROZEN_TRIGGER_FUNCTIONS = {"_outbox_commit": "0013_outbox_once.sql"}


def revision_function(revision_file: str, name: str) -> str:
    """CREATE OR REPLACE of function fluxpg.<name>() as a revision file creates it (a downgrade
    puts back the body a later revision replaced)."""
    found = re.search(rf"^CREATE FUNCTION fluxpg\.{name}\(\).*?\nEND \$\$;", read_sql(revision_file), re.S | re.M)
    if found is None:
        raise LookupError(f"fluxpg.{name}() is not created in {revision_file}")
    return found.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def frozen_trigger_function(name: str) -> str:
    """CREATE OR REPLACE of a FROZEN_TRIGGER_FUNCTIONS function as its revision file creates it."""
    return revision_function(FROZEN_TRIGGER_FUNCTIONS[name], name)


def restore_trigger_functions(bind: Any) -> None:
    """The last step of a downgrade below head: each trigger function that exists back at its
    revision's body (one a lower revision dropped stays dropped)."""
    raw = _raw(bind)
    for name in FROZEN_TRIGGER_FUNCTIONS:
        if _scalar(raw, f"SELECT to_regprocedure('fluxpg.{name}()') IS NOT NULL"):
            with raw.cursor() as cur:
                cur.execute(frozen_trigger_function(name))


def stale(bind: Any) -> list[str]:
    """What differs from what was last installed: source file names, and/or INSTALLED when the
    installed definitions were changed by something else. Empty when all is current."""
    raw = _raw(bind)
    recorded: dict[str, str] = {}
    if _scalar(raw, _q("sql_source_exists")):
        with raw.cursor() as cur:
            cur.execute(_q("recorded_sources"))
            recorded = dict(cur.fetchall())
    wanted = source_hashes()
    changed = [name for name, digest in wanted.items() if recorded.get(name) != digest]
    if recorded.get(INSTALLED) != _scalar(raw, _q("installed_fingerprint")):
        changed.append(INSTALLED)
    return changed


def apply(bind: Any) -> None:
    """Drop and re-create all functions and views from their source files and record them."""
    raw = _raw(bind)
    drop(bind)
    with raw.cursor() as cur:
        for name in SOURCE_FILES:
            cur.execute(read_sql(name))
        for statement in comment_statements():
            _comment(raw, statement)
        cur.execute(_q("create_sql_source"))
        rows = list(source_hashes().items()) + [(INSTALLED, _scalar(raw, _q("installed_fingerprint")))]
        cur.executemany(_q("record_source"), rows)


def _comment(raw: Any, statement: str) -> None:
    import psycopg

    try:
        with raw.transaction(), raw.cursor() as cur:  # a savepoint: a skipped comment leaves no error behind
            cur.execute(statement)
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedObject,
            psycopg.errors.UndefinedFunction) as exc:
        log.debug("comment skipped, its object is gone: %s", exc)


def ensure(bind: Any) -> list[str]:
    """At head: re-apply if anything is stale. Returns what was stale (empty: nothing done)."""
    changed = stale(bind)
    if changed:
        log.info("re-creating fluxpg functions and views (changed: %s)", ", ".join(changed))
        apply(bind)
    return changed
