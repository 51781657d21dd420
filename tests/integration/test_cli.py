"""The `fluxpg` command line, run as a user runs it: a subprocess (`python -m fluxpg.cli`)."""
from __future__ import annotations

import contextlib
import json
import os
import queue as queue_module
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import psycopg
import pytest

from fluxpg import db
from fluxpg.cli import redact_dsn
from fluxpg.embedded import postgres_processes
from fluxpg.testing import fresh_database
from tests.broker_process import free_port

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fluxpg.cli"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLUXPG_DSN", "FLUXPG_CONFIG")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120, input: bytes | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, env=env or cli_env(), timeout=timeout,
                          input=input, cwd=cwd or Path(tempfile.gettempdir()))


def text(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    return proc.stdout.decode(), proc.stderr.decode()


def assert_one_error_line(stderr: str, *needles: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def healthz(port: int, timeout: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"fluxpg serve exited with {proc.returncode}: {err.decode()}")
        reply = healthz(port)
        if reply is not None:
            return reply
        time.sleep(0.2)
    raise AssertionError(f"no /healthz answer on port {port} within {timeout} s")


def only_http(port: int) -> list[str]:
    return ["--mqtt", "off", "--amqp", "off", "--amqp091", "off", "--http", f"127.0.0.1:{port}"]


def sql(dsn: str, statement: str, *args):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, args)
        return cur.fetchall() if cur.description else None


@pytest.fixture
def database(server_dsn):
    with fresh_database(server_dsn) as dsn:
        yield dsn


@pytest.fixture
def private_tmp():
    """A temporary directory outside pytest's basetemp (see test_embedded.py: as root the embedded
    server's user must traverse its parents, and pytest resets /tmp/pytest-of-<user> to 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fluxpg-cli-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def queue(dsn, qname):
    """A classic queue with three messages, two claimed by consumer c1 of group workers."""
    sql(dsn, "SELECT fluxpg.declare_queue(%s, 'classic', NULL, '{}')", qname)
    for payload in (b"first", b"second", b"\x00\xffbinary"):
        sql(dsn, "SELECT * FROM fluxpg.append(%s, %s, NULL)", f"$queue/{qname}/eu", payload)
    claimed = sql(dsn, "SELECT seq FROM fluxpg.claim(%s, 'workers', 'c1', 2)", qname)
    assert [r[0] for r in claimed] == [0, 1]
    return qname


# -- migrate ---------------------------------------------------------------------------------------

def test_migrate_upgrades_prints_revisions_and_is_idempotent(database):
    head = db.head_revision()
    first = run("migrate", "--dsn", database)
    out, err = text(first)
    assert first.returncode == 0, err
    assert "before:    none" in out and f"after:     {head}" in out
    assert "functions and views: re-created (new revision)" in out
    assert db.current_revision(database) == head

    again = run("migrate", "--dsn", database)
    out, err = text(again)
    assert again.returncode == 0, err
    assert f"before:    {head}" in out and f"after:     {head}  (unchanged)" in out
    assert "functions and views: current" in out


def test_migrate_downgrade_and_revision(database):
    from alembic.script import ScriptDirectory

    revisions = [r.revision for r in ScriptDirectory.from_config(db._alembic(database)).walk_revisions()]
    assert run("migrate", "--dsn", database, "--revision", revisions[-1]).returncode == 0
    assert db.current_revision(database) == revisions[-1]
    assert run("migrate", "--dsn", database).returncode == 0
    assert db.current_revision(database) == revisions[0]
    if len(revisions) > 1:
        down = run("migrate", "--dsn", database, "--downgrade", revisions[1])
        assert down.returncode == 0, down.stderr
        assert f"after:     {revisions[1]}" in down.stdout.decode()
        assert db.current_revision(database) == revisions[1]
    conflict = run("migrate", "--dsn", database, "--revision", revisions[-1], "--downgrade", "base")
    assert conflict.returncode == 2
    assert_one_error_line(conflict.stderr.decode(), "--revision or --downgrade")


def test_unreachable_database_is_one_line(private_tmp):
    for args in (["migrate"], ["queues"], ["publish", "$queue/x/y", "m"]):
        proc = run(*args, "--dsn", "postgresql://postgres@127.0.0.1:1/nothing")
        assert proc.returncode == 1, args
        assert_one_error_line(proc.stderr.decode(), "cannot connect to PostgreSQL at 127.0.0.1:1",
                              "--dsn or FLUXPG_DSN")
    # FLUXPG_DSN is used when --dsn is not given.
    proc = run("queues", env=cli_env(FLUXPG_DSN="postgresql://postgres@127.0.0.1:1/nothing"))
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr.decode(), "127.0.0.1:1")


def test_inspecting_an_unmigrated_database_says_to_migrate(database):
    proc = run("queues", "--dsn", database)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr.decode(), "fluxpg migrate")


# -- inspection --------------------------------------------------------------------------------------

def test_pending_finds_a_group_by_its_plain_name_and_groups_counts_live_consumers(dsn, qname):
    """A subscription to $queue/<q>/# makes group `workers@#`; `fluxpg pending <q> workers` finds
    it, or says which groups exist; `fluxpg groups` counts only consumers seen lately."""
    sql(dsn, "SELECT fluxpg.declare_queue(%s, 'classic')", qname)
    sql(dsn, "SELECT * FROM fluxpg.append(%s, 'm', NULL)", f"$queue/{qname}/eu")
    sql(dsn, "SELECT * FROM fluxpg.claim(%s, 'workers@#', 'c1', 1)", qname)
    proc = run("pending", qname, "workers", "--dsn", dsn, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [(e["grp"], e["seq"]) for e in json.loads(proc.stdout)] == [("workers@#", 0)]

    proc = run("pending", qname, "nobody", "--dsn", dsn)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr.decode(), "no consumer group 'nobody'", "its groups: workers@#")
    sql(dsn, "SELECT * FROM fluxpg.claim(%s, 'workers@eu/#', 'c2', 1)", qname)
    proc = run("pending", qname, "workers", "--dsn", dsn)
    assert_one_error_line(proc.stderr.decode(), "workers@#, workers@eu/#", "full name")

    groups = {g["grp"]: g for g in json.loads(run("groups", qname, "--dsn", dsn, "--json").stdout)}
    assert groups["workers@#"]["consumers"] == 1
    # c1 went away long ago (its member row stays until the group expires): not a live consumer.
    sql(dsn, "UPDATE fluxpg.members SET last_seen_at = now() - interval '1 hour' WHERE name = 'c1'")
    groups = {g["grp"]: g for g in json.loads(run("groups", qname, "--dsn", dsn, "--json").stdout)}
    assert groups["workers@#"]["consumers"] == 0 and groups["workers@eu/#"]["consumers"] == 1


def test_queues_groups_pending_json(dsn, queue):
    proc = run("queues", "--dsn", dsn, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["queue"]: r for r in json.loads(proc.stdout)}
    q = rows[queue]
    assert (q["kind"], q["partitions"], q["head"], q["depth"], q["segments"], q["groups"]) == ("classic", 1, 3, 3, 1, 1)
    assert isinstance(q["bytes"], int) and q["bytes"] > 0
    assert q["topics"] == [f"$queue/{queue}/#"]
    assert q["oldest_at"].endswith("+00:00") and "T" in q["oldest_at"]

    proc = run("groups", queue, "--dsn", dsn, "--json")
    assert proc.returncode == 0, proc.stderr
    (group,) = json.loads(proc.stdout)
    assert (group["grp"], group["mode"], group["partition"], group["cursor"], group["committed"],
            group["lag"], group["pending"]) == ("workers", "classic", 0, 2, 0, 3, 2)
    assert isinstance(group["oldest_pending_age"], float) and group["oldest_pending_age"] >= 0

    proc = run("pending", queue, "workers", "--dsn", dsn, "--json")
    assert proc.returncode == 0, proc.stderr
    entries = json.loads(proc.stdout)
    assert [(e["seq"], e["consumer"], e["delivery_count"], e["message_id"]) for e in entries] == [
        (0, "c1", 1, f"{queue}:0"), (1, "c1", 1, f"{queue}:1")]
    assert all(isinstance(e["idle"], float) for e in entries)

    limited = json.loads(run("pending", queue, "workers", "--dsn", dsn, "--json", "--limit", "1").stdout)
    assert [e["seq"] for e in limited] == [0]


def test_tables_for_people(dsn, queue):
    out = run("queues", "--dsn", dsn).stdout.decode()
    assert queue in out and "classic" in out and "KiB" in out          # human-readable size
    out = run("groups", queue, "--dsn", dsn).stdout.decode()
    assert "workers" in out
    out = run("pending", queue, "workers", "--dsn", dsn).stdout.decode()
    assert f"{queue}:0" in out and "c1" in out


def test_unknown_queue_and_group(dsn, queue):
    for args in (["groups", "no-such-queue"], ["pending", "no-such-queue", "g"], ["tail", "no-such-queue"]):
        proc = run(*args, "--dsn", dsn)
        assert proc.returncode == 1, args
        assert_one_error_line(proc.stderr.decode(), "unknown queue 'no-such-queue'")
    proc = run("pending", queue, "nobody", "--dsn", dsn)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr.decode(), "no consumer group 'nobody'")


# -- publish / tail --------------------------------------------------------------------------------

def test_publish(dsn, qname, private_tmp):
    sql(dsn, "SELECT fluxpg.declare_queue(%s, 'classic', NULL, '{}')", qname)
    proc = run("publish", f"$queue/{qname}/eu", "hello", "--header", "content-type=text/plain",
               "-H", "x-trace=a=b", "--dsn", dsn)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [f"{qname}:0"]

    payload_file = private_tmp / "payload.bin"
    payload_file.write_bytes(b"\x00\x01\x02")
    proc = run("publish", f"$queue/{qname}/eu", "--file", str(payload_file), "--dsn", dsn)
    assert proc.stdout.decode().splitlines() == [f"{qname}:1"]
    proc = run("publish", f"$queue/{qname}/eu", "--file", "-", "--dsn", dsn, input=b"from stdin")
    assert proc.stdout.decode().splitlines() == [f"{qname}:2"]

    rows = sql(dsn, "SELECT l.seq, l.payload, l.headers FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                    "WHERE q.name = %s ORDER BY l.seq", qname)
    assert rows == [(0, b"hello", {"content-type": "text/plain", "x-trace": "a=b"}),
                    (1, b"\x00\x01\x02", None), (2, b"from stdin", None)]


def test_publish_reaches_every_matching_queue(dsn, qname):
    other = f"{qname}_copy"
    sql(dsn, "SELECT fluxpg.declare_queue(%s, 'classic', NULL, '{}')", qname)
    sql(dsn, "SELECT fluxpg.declare_queue(%s, 'stream', %s, '{}')", other, [f"$queue/{qname}/#"])
    proc = run("publish", f"$queue/{qname}/x", "fan-out", "--dsn", dsn)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().split()) == sorted([f"{qname}:0", f"{other}:0"])


def test_publish_errors(dsn, qname):
    proc = run("publish", "$queue/nothing-bound-here/x", "m", "--dsn", dsn)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr.decode(), "no queue is bound to topic")
    proc = run("publish", "$queue/x/y", "--dsn", dsn)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr.decode(), "MESSAGE")
    proc = run("publish", "$queue/x/y", "m", "-H", "no-equals-sign", "--dsn", dsn)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr.decode(), "KEY=VALUE")


def tail_lines(proc: subprocess.CompletedProcess) -> list[list[str]]:
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.decode().splitlines()]


def test_tail_reads_without_consuming(dsn, queue):
    before = sql(dsn, "SELECT cursor, pending FROM fluxpg.group_status WHERE queue = %s", queue)

    lines = tail_lines(run("tail", queue, "--dsn", dsn))  # default: the last 10
    assert [(l[0], l[2], l[3]) for l in lines] == [
        ("0", f"$queue/{queue}/eu", "first"), ("1", f"$queue/{queue}/eu", "second"),
        ("2", f"$queue/{queue}/eu", "hex:00ff62696e617279")]
    assert all(len(l) == 4 and "T" in l[1] for l in lines)   # ISO 8601 time

    assert [l[0] for l in tail_lines(run("tail", queue, "-n", "2", "--dsn", dsn))] == ["1", "2"]
    assert [l[0] for l in tail_lines(run("tail", queue, "--from", "first", "-n", "1", "--dsn", dsn))] == ["0"]
    assert [l[0] for l in tail_lines(run("tail", queue, "--from", "1", "--dsn", dsn))] == ["1", "2"]
    assert tail_lines(run("tail", queue, "--from", "last", "--dsn", dsn)) == []
    # --group: from the group's committed offset (0: nothing acknowledged yet).
    sql(dsn, "SELECT fluxpg.ack(%s, 'workers', ARRAY[0]::bigint[])", queue)
    assert [l[0] for l in tail_lines(run("tail", queue, "--group", "workers", "--dsn", dsn))] == ["1", "2"]

    # Nothing was claimed, acknowledged or moved by tail.
    after = sql(dsn, "SELECT cursor, pending FROM fluxpg.group_status WHERE queue = %s", queue)
    assert after == [(before[0][0], before[0][1] - 1)]  # only the ack above changed anything

    bad = run("tail", queue, "--from", "yesterday", "--dsn", dsn)
    assert bad.returncode == 2
    assert_one_error_line(bad.stderr.decode(), "--from")


def test_tail_follow_prints_new_messages_until_sigint(dsn, queue):
    proc = subprocess.Popen([*CLI, "tail", queue, "--from", "last", "--follow", "--dsn", dsn],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    lines: "queue.Queue[str]" = queue_module.Queue()
    threading.Thread(target=lambda: [lines.put(l.decode()) for l in iter(proc.stdout.readline, b"")],
                     daemon=True).start()
    try:
        # "last" is the head when tail has connected, which a loaded machine may delay past any
        # fixed sleep: a message appended before that is history, not followed. So append until
        # one is printed; every line after that is a later message, in offset order.
        line = None
        for i in range(30):
            sql(dsn, "SELECT * FROM fluxpg.append(%s, %s, NULL)", f"$queue/{queue}/eu", f"live{i}".encode())
            with contextlib.suppress(queue_module.Empty):
                line = lines.get(timeout=1)
                break
        assert line is not None, proc.stderr.read1().decode() if proc.poll() is not None else "nothing printed"
        first = int(line.split("\t")[0])
        assert first >= 3 and line.rstrip("\n").endswith(f"\tlive{first - 3}")
        sql(dsn, "SELECT * FROM fluxpg.append(%s, 'one more', NULL)", f"$queue/{queue}/eu")
        later = [lines.get(timeout=20) for _ in range(i - (first - 3) + 1)]
        assert [int(l.split("\t")[0]) for l in later] == list(range(first + 1, first + 1 + len(later)))
        assert later[-1].rstrip("\n").endswith("\tone more")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- serve -----------------------------------------------------------------------------------------

def test_bad_config_file_exits_2_naming_file_and_key(private_tmp):
    config = private_tmp / "fluxpg.yaml"
    config.write_text(textwrap.dedent("""\
        queues:
          - name: orders
            retry:
              multiplyer: 2
    """))
    proc = run("serve", "--config", str(config))
    assert proc.returncode == 2
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr
    assert f"{config}:4: queues[0].retry.multiplyer: unknown key" in stderr
    assert "did you mean 'multiplier'" in stderr

    proc = run("serve", "--config", str(private_tmp / "missing.yaml"))
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr.decode(), "missing.yaml", "cannot read config file")

    proc = run("serve", "--mqtt", "localhost")
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr.decode(), "--mqtt")


def test_port_in_use_names_the_flag(dsn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run("serve", "--dsn", dsn, "--mqtt", f"127.0.0.1:{port}", "--amqp", "off", "--amqp091", "off",
                   "--http", "off", timeout=60)
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr.decode(), f"127.0.0.1:{port}", "--mqtt")
    assert "already in use" in line


def test_every_conflicting_address_is_reported_before_the_embedded_server_starts(private_tmp):
    env = cli_env(HOME=str(private_tmp), XDG_DATA_HOME=str(private_tmp / "data"))
    env.pop("FLUXPG_TEST_DSN", None)
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        pa, pb = a.getsockname()[1], b.getsockname()[1]
        free = free_port()
        proc = run("serve", "--mqtt", f"127.0.0.1:{pa}", "--amqp", f"127.0.0.1:{pb}", "--amqp091", "off",
                   "--http", f"127.0.0.1:{free}", "--ws", f"127.0.0.1:{free}", env=env, cwd=private_tmp, timeout=60)
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr.decode(), f"--mqtt 127.0.0.1:{pa}", f"--amqp 127.0.0.1:{pb}",
                                 f"--ws 127.0.0.1:{free} (also given to --http)")
    assert "already in use" in line
    # Nothing was started: no embedded PostgreSQL, not even its data directory.
    assert not (private_tmp / "data" / "fluxpg" / "pgdata").exists()


def test_serve_with_a_dsn_announces_itself_and_stops_on_sigterm(database):
    # Trust authentication ignores the password; it must not appear in the output anyway.
    with_password = database.replace("postgres@", "postgres:s3cret-pw@", 1)
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--dsn", with_password, *only_http(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    try:
        reply = wait_healthy(proc, port, timeout=60)
        assert reply["status"] == "ok" and isinstance(reply["node"], int)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate()
    log = (out + err).decode()
    assert "s3cret-pw" not in log
    # Which database: the server this run was given (FLUXPG_TEST_DSN, Docker or the embedded one,
    # whose port is not 5432), as serve prints it.
    assert redact_dsn(database) in log and "postgres@" in redact_dsn(database)
    assert f"127.0.0.1:{port} (--http)" in log                # which listeners
    assert "open to everyone" in log                          # no auth section
    assert "Traceback" not in log
    # serve migrated the fresh database, and deregistered its node on the way out.
    assert db.current_revision(database) == db.head_revision()
    assert sql(database, "SELECT count(*) FROM fluxpg.nodes") == [(0,)]


EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_config_examples_run_as_shipped_on_the_embedded_server(private_tmp, example):
    """Only the listener ports are moved (the machine's MQTT/AMQP brokers hold the defaults); the
    database is the embedded one, as for a newcomer, and every configured queue is declared."""
    from fluxpg.config import load_config

    config = load_config(example)
    env = cli_env(HOME=str(private_tmp), XDG_DATA_HOME=str(private_tmp / "data"))
    env.pop("FLUXPG_TEST_DSN", None)
    http = free_port()
    ports = []
    for name, address in {"mqtt": config.listeners.mqtt, "amqp": config.listeners.amqp,
                          "amqp091": config.listeners.amqp091, "ws": config.listeners.ws}.items():
        ports += [f"--{name}", f"127.0.0.1:{free_port()}" if address else "off"]
    proc = subprocess.Popen([*CLI, "serve", "--config", str(example), *ports, "--http", f"127.0.0.1:{http}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=private_tmp)
    try:
        wait_healthy(proc, http)
        queues = run("queues", "--json", env=env)
        assert queues.returncode == 0, queues.stderr
        assert {q.name for q in config.effective_queues()} <= {q["queue"] for q in json.loads(queues.stdout)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate()
    assert "Traceback" not in (out + err).decode()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_embedded_stops_cleanly(private_tmp, sig):
    env = cli_env(HOME=str(private_tmp), XDG_DATA_HOME=str(private_tmp / "data"))
    env.pop("FLUXPG_TEST_DSN", None)
    data_dir = private_tmp / "data" / "fluxpg" / "pgdata"
    port = free_port()
    config = private_tmp / "fluxpg.yaml"
    config.write_text("queues:\n  - name: mqtt\n")
    proc = subprocess.Popen([*CLI, "serve", *only_http(port), "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=private_tmp)
    try:
        wait_healthy(proc, port)
        assert postgres_processes(data_dir), "the embedded server runs in the user's data directory"
        # Other commands reach the running embedded server through its socket.
        queues = run("queues", "--json", env=env)
        assert queues.returncode == 0, queues.stderr
        # The configured queue only: there is no implicit catch-all any more.
        assert [q["queue"] for q in json.loads(queues.stdout)] == ["mqtt"]
        published = run("publish", "$queue/mqtt/hello", "persisted", env=env)
        assert published.stdout.decode().split() == ["mqtt:0"]
        # The SQL API does not auto-create (queue_manager.auto_create is the broker's): refused, clearly.
        refused = run("publish", "$queue/nope/hello", "x", env=env)
        assert refused.returncode != 0 and b"no queue is bound" in refused.stderr
        assert b"Traceback" not in refused.stderr

        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _out, err = proc.communicate()
    assert "Traceback" not in err.decode(), err.decode()
    assert postgres_processes(data_dir) == [], "the embedded PostgreSQL outlived fluxpg serve"

    # The data persists: a later command starts the embedded server, finds the message, stops it.
    tail = run("tail", "mqtt", env=env)
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.decode().rstrip("\n").endswith("\tpersisted")
    assert postgres_processes(data_dir) == []


def _children(pid: int) -> list[psutil.Process]:
    """The live worker processes of the supervisor `pid`. A worker that has just died (gone, or a
    zombie whose command line can no longer be read) is left out on its own: were the whole list
    dropped, a check "the killed worker is no longer among them" would pass before the
    supervisor had even noticed the death."""
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    workers = []
    for child in children:
        try:
            if "--worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                workers.append(child)
        except psutil.NoSuchProcess:  # ZombieProcess included
            continue
    return workers


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.slow
def test_workers_share_the_port_and_are_supervised(dsn):
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--dsn", dsn, "--workers", "2", *only_http(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    try:
        wait_healthy(proc, port)
        workers = _wait_for(lambda: len(live := _children(proc.pid)) == 2 and live, 60, "two workers")
        # Both answer on the one port (the kernel spreads connections over SO_REUSEPORT sockets).
        nodes = set()
        deadline = time.monotonic() + 30
        while len(nodes) < 2 and time.monotonic() < deadline:
            reply = healthz(port)
            if reply:
                nodes.add(reply["node"])
        assert len(nodes) == 2, nodes

        # A crashed worker is replaced.
        victim = workers[0]
        victim.kill()
        # One listing per check: two of them could see the victim alive, then (dying) not at all.
        _wait_for(lambda: (live := {p.pid for p in _children(proc.pid)}) and len(live) == 2 and victim.pid not in live,
                  60, "the crashed worker to be restarted")
        wait_healthy(proc, port)

        remaining = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(remaining, timeout=10)
        assert not alive, "workers outlived their supervisor"
    except AssertionError as exc:
        if proc.poll() is None:
            proc.kill()
        raise AssertionError(f"{exc}\n--- fluxpg serve stderr ---\n{proc.communicate()[1].decode()}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _out, err = proc.communicate()
    assert "restarting" in err.decode()
    assert "Traceback" not in err.decode()


def test_workers_need_fixed_ports(dsn):
    proc = run("serve", "--dsn", dsn, "--workers", "2", "--mqtt", "127.0.0.1:0", "--amqp", "off",
               "--amqp091", "off", "--http", "off")
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr.decode(), "--mqtt", "fixed ports")


@pytest.mark.slow
def test_workers_stop_when_their_supervisor_is_killed(dsn):
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--dsn", dsn, "--workers", "2", *only_http(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env())
    workers: list[psutil.Process] = []
    try:
        wait_healthy(proc, port)
        workers = _wait_for(lambda: len(live := _children(proc.pid)) == 2 and live, 60, "two workers")
        proc.kill()  # SIGKILL: no chance to forward anything
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, "workers kept serving without their supervisor"
        assert healthz(port, timeout=1) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
