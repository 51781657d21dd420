"""`follow`: a consumer group in Spark micro-batches; killed anywhere, it resumes with no gap and
no duplicate in its output."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fluxpg.analytics import follow as fol
from fluxpg.analytics.jdbc import AnalyticsError
from tests.analytics.helpers import append, declare

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def outputs(out: Path, crashed: bool = False) -> list[tuple[int, int]]:
    """(partition, seq) of every row in every batch directory, duplicates kept. Only a crashed run
    may leave its temporary directory behind."""
    rows = []
    for d in sorted(out.iterdir()):
        if crashed and d.name.startswith(".tmp-"):
            continue
        assert fol.parse_batch_dir(d.name), f"unexpected entry {d.name} in {out}"
        t = pq.ParquetDataset(str(d)).read(columns=["partition", "seq"]).to_pylist()
        part, lo, hi = fol.parse_batch_dir(d.name)
        assert all(r["partition"] == part and lo <= r["seq"] < hi for r in t)  # named by its range
        rows += [(r["partition"], r["seq"]) for r in t]
    return rows


def committed(pg, queue, group) -> dict[int, int]:
    return dict(pg.execute("SELECT partition, committed FROM fluxpg.group_status WHERE queue = %s AND grp = %s",
                           (queue, group)).fetchall())


def test_classic_queue_is_refused(spark, target, pg, qname, tmp_path):
    declare(pg, qname, "classic")
    with pytest.raises(AnalyticsError, match=f"queue '{qname}' is a classic queue: follow reads stream queues only"):
        fol.follow(spark, target, pg, qname, "g", tmp_path)


def test_crash_between_write_and_commit_reruns_without_duplicates(spark, target, pg, qname, tmp_path, monkeypatch):
    qid = declare(pg, qname, "stream", {"partitions": 2})
    pos = append(pg, qid, [f"$queue/{qname}/k{i % 5}" for i in range(500)], [b"m%d" % i for i in range(500)])
    out = tmp_path / "out"
    real_commit = fol.Follower.commit
    calls = []

    def crashing_commit(self, ranges):
        calls.append(ranges)
        if len(calls) == 3:  # the third batch's output is in place, its commit never happens
            raise KeyboardInterrupt("killed")
        real_commit(self, ranges)

    monkeypatch.setattr(fol.Follower, "commit", crashing_commit)
    with pytest.raises(KeyboardInterrupt):
        fol.follow(spark, target, pg, qname, "arch", out, batch=100, drain=True)
    assert sum(committed(pg, qname, "arch").values()) == 200
    assert len(outputs(out, crashed=True)) == 300  # the uncommitted third batch is on disk
    monkeypatch.setattr(fol.Follower, "commit", real_commit)

    # More messages arrive before the rerun: the third batch's range now ends elsewhere, so its
    # output must be removed rather than overwritten.
    pos += append(pg, qid, [f"$queue/{qname}/k{i % 5}" for i in range(500, 530)], [b"m%d" % i for i in range(500, 530)])
    res = fol.follow(spark, target, pg, qname, "arch", out, batch=150, drain=True)
    assert len(res.removed) >= 1
    got = outputs(out)
    assert len(got) == len(set(got)) == 530 and set(got) == set(pos)
    assert committed(pg, qname, "arch") == dict(pg.execute(
        "SELECT partition, next_seq FROM fluxpg.heads WHERE queue_id = %s", (qid,)).fetchall())
    # caught up: a further run writes nothing; max_batches stops after K committed batches
    assert fol.follow(spark, target, pg, qname, "arch", out, batch=150, drain=True).batches == 0
    append(pg, qid, [f"$queue/{qname}/k1"] * 90, [b"late"] * 90)
    res = fol.follow(spark, target, pg, qname, "arch", out, batch=20, max_batches=2)
    assert res.batches == 2 and res.rows == 40
    assert sum(committed(pg, qname, "arch").values()) == 530 + 40
    assert len(outputs(out)) == 570


def test_json_batches(spark, target, pg, qname, tmp_path):
    """JSON lines output: payloads base64, one directory per batch range, every offset once."""
    import base64
    import json

    qid = declare(pg, qname, "stream")
    pos = append(pg, qid, [f"$queue/{qname}/a"] * 45, [bytes([i, 0, 255]) for i in range(45)])
    res = fol.follow(spark, target, pg, qname, "j", tmp_path, fmt="json", batch=20, drain=True)
    assert (res.batches, res.rows) == (3, 45)
    assert sorted(d.name for d in tmp_path.iterdir()) == [
        "p0-00000000000000000000-00000000000000000020", "p0-00000000000000000020-00000000000000000040",
        "p0-00000000000000000040-00000000000000000045"]
    rows = [json.loads(ln) for f in tmp_path.glob("p0-*/part-*.json") for ln in f.read_text().splitlines()]
    assert sorted((r["partition"], r["seq"]) for r in rows) == pos
    assert all(base64.b64decode(r["payload"]) == bytes([r["seq"], 0, 255]) for r in rows)


def test_filter_group_and_expired_messages(spark, target, pg, qname, tmp_path):
    """Like a broker consumer of the group: group@filter sees matching routing keys only, and
    expired messages are skipped; the checkpoint still moves past them."""
    qid = declare(pg, qname, "stream")
    pos = append(pg, qid, [f"$queue/{qname}/" + ("eu/de", "us/ny", "eu/fr")[i % 3] for i in range(60)], [b"x"] * 60)
    pg.execute("UPDATE fluxpg.log SET expires_at = now() - interval '1 minute' WHERE queue_id = %s AND seq < 6", (qid,))
    res = fol.follow(spark, target, pg, qname, "g@eu/#", tmp_path, batch=25, drain=True)
    got = sorted(outputs(tmp_path))
    assert got == [p for p in pos if p[1] % 3 != 1 and p[1] >= 6] and res.rows == len(got)
    assert committed(pg, qname, "g@eu/#") == {0: 60}


def _follow_cmd(dsn, queue, out, *extra, batch=100):
    return [sys.executable, "-m", "fluxpg.analytics.cli", "follow", queue, "--group", "archiver", "--out", str(out),
            "--dsn", dsn, "--batch", str(batch), "--interval", "0.2", "--master", "local[1]", *extra]


def _children(pid: int) -> list[int]:
    """Child processes of pid (Linux /proc; empty elsewhere)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_sigkill_between_batches_then_resume(pg, dsn, qname, tmp_path):
    """The real thing: a follow process SIGKILLed after its first commit, then run to completion."""
    qid = declare(pg, qname, "stream")
    n = 800
    append(pg, qid, [f"$queue/{qname}/x"] * n, [b"p%d" % i for i in range(n)])
    out = tmp_path / "out"
    proc = subprocess.Popen(_follow_cmd(dsn, qname, out), cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            done = committed(pg, qname, "archiver").get(0, 0)
            if done >= 100:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stdout.read().decode()
        assert committed(pg, qname, "archiver")[0] >= 100
        jvms = _children(proc.pid)
        assert jvms or not Path("/proc/self").exists()  # spark-submit execs the JVM as our child
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # The JVM notices its parent's death (its stdin pipe closes) and exits: no orphan left behind.
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{pid}").exists() for pid in jvms) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in jvms if Path(f"/proc/{pid}").exists()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_at = committed(pg, qname, "archiver")[0]
    assert killed_at < n, "the job finished before it was killed; the test proves nothing"

    done = subprocess.run(_follow_cmd(dsn, qname, out, "--drain", batch=400), cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    got = outputs(out)
    assert len(got) == len(set(got)) == n and set(got) == {(0, s) for s in range(n)}
    assert committed(pg, qname, "archiver") == {0: n}
