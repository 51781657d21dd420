"""`export` round-trips every message byte-exact (Parquet binary, JSON base64), decodes losslessly,
and selects ranges by offset and by time."""
from __future__ import annotations

import base64
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fluxpg.analytics import export
from fluxpg.analytics.jdbc import AnalyticsError, Position
from tests.analytics.helpers import append, declare

pytestmark = pytest.mark.spark


@pytest.fixture
def archive(pg, qname):
    """A 2-partition stream of awkward payloads: empty, NUL bytes, invalid UTF-8, UTF-8 text, JSON."""
    rnd = random.Random(11)
    qid = declare(pg, qname, "stream", {"partitions": 2})
    payloads = [b"", b"\x00", b"\xff\xfe\x00binary", "żółw ✓".encode(), b'{"a": 1, "b": "x"}', b"\n,\"quoted\"\r\n"]
    payloads += [rnd.randbytes(rnd.randrange(0, 2000)) for _ in range(300)]
    payloads += [json.dumps({"id": i, "name": f"n{i}", "tags": ["t", str(i)]}).encode() for i in range(100)]
    topics = [f"$queue/{qname}/k{i % 7}" for i in range(len(payloads))]
    headers = [{"i": i, "quote": '"'} if i % 2 else None for i in range(len(payloads))]
    pos = append(pg, qid, topics, payloads, headers)
    return qname, {p: payload for p, payload in zip(pos, payloads)}


def _parquet_rows(path: Path):
    table = pq.ParquetDataset(str(path)).read()
    return table.to_pylist()


def test_parquet_round_trip_is_byte_exact(spark, target, pg, archive, tmp_path):
    queue, messages = archive
    res = export.export(spark, target, pg, queue, tmp_path / "out", fmt="parquet", num_partitions=3)
    assert res.rows == len(messages) == res.expected
    rows = _parquet_rows(tmp_path / "out")
    got = {(r["partition"], r["seq"]): r["payload"] for r in rows}
    assert len(rows) == len(got) == len(messages)
    assert got == messages  # bytes, byte for byte
    db = {(p, s): (t, h) for p, s, t, h in pg.execute(
        """SELECT l.partition, l.seq, l.topic, l.headers::text FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id
            WHERE q.name = %s""", (queue,))}
    assert {(r["partition"], r["seq"]): (r["topic"], r["headers"]) for r in rows} == db


def test_json_round_trip_base64(spark, target, pg, archive, tmp_path):
    queue, messages = archive
    res = export.export(spark, target, pg, queue, tmp_path / "out", fmt="json")
    assert res.rows == len(messages)
    lines = [json.loads(ln) for f in sorted((tmp_path / "out").glob("part-*.json")) for ln in f.read_text().splitlines()]
    # validate=True: RFC 4648 alphabet only, no line breaks (Spark 4's base64() adds them every 76)
    got = {(r["partition"], r["seq"]): base64.b64decode(r["payload"], validate=True) for r in lines}
    assert len(lines) == len(got) and got == messages
    assert max(map(len, messages.values())) > 57, "payloads long enough to be line-broken"
    assert all(datetime.fromisoformat(r["created_at"]).tzinfo is not None for r in lines)


def test_csv_base64_is_rfc4648_without_line_breaks(spark, target, pg, archive, tmp_path):
    import csv

    queue, messages = archive
    export.export(spark, target, pg, queue, tmp_path / "out", fmt="csv")
    rows = [r for f in sorted((tmp_path / "out").glob("part-*.csv")) for r in csv.DictReader(f.open(newline=""))]
    got = {(int(r["partition"]), int(r["seq"])): base64.b64decode(r["payload"], validate=True) for r in rows}
    assert len(rows) == len(got) and got == messages


def test_decode_utf8_is_lossless_and_json_schema(spark, target, pg, archive, tmp_path):
    queue, messages = archive
    export.export(spark, target, pg, queue, tmp_path / "u", fmt="parquet", decode="utf8")
    for r in _parquet_rows(tmp_path / "u"):
        original = messages[(r["partition"], r["seq"])]
        try:
            text = original.decode("utf-8")
        except UnicodeDecodeError:
            assert r["payload_text"] is None and r["payload"] == original
        else:
            assert r["payload_text"] == text and r["payload"] is None

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}))
    res = export.export(spark, target, pg, queue, tmp_path / "j", fmt="json", json_schema=schema)
    assert [f.name for f in res.schema.fields] == ["id", "name", "tags"]
    bodies = {}
    for f in (tmp_path / "j").glob("part-*.json"):
        for ln in f.read_text().splitlines():
            r = json.loads(ln)
            original = messages[(r["partition"], r["seq"])]
            if r["payload"] is not None:
                assert base64.b64decode(r["payload"], validate=True) == original
            if r["body"] is not None and r["body"]["id"] is not None:
                bodies[r["body"]["id"]] = r["body"]
    assert len(bodies) == 100 and bodies[42] == {"id": 42, "name": "n42", "tags": ["t", "42"]}

    # inferred schema, CSV: top-level fields flattened
    res = export.export(spark, target, pg, queue, tmp_path / "c", fmt="csv", decode="json")
    assert {"id", "name", "tags"} <= {f.name for f in res.schema.fields}
    header = next((tmp_path / "c").glob("part-*.csv")).read_text().splitlines()[0]
    assert "body_id" in header and "body_tags" in header


def test_ranges_by_offset_and_time(spark, target, pg, qname, tmp_path):
    qid = declare(pg, qname, "stream")
    append(pg, qid, [f"$queue/{qname}/a"] * 100, [str(i).encode() for i in range(100)])
    # created_at: seq i at base + i minutes (test data only)
    base = datetime(2026, 3, 1, tzinfo=timezone.utc)
    pg.execute("UPDATE fluxpg.log SET created_at = %s + seq * interval '1 minute' WHERE queue_id = %s", (base, qid))

    def seqs(path):
        return sorted(r["seq"] for r in _parquet_rows(path))

    res = export.export(spark, target, pg, qname, tmp_path / "o", start=Position(offset=10), end=Position(offset=25))
    assert seqs(tmp_path / "o") == list(range(10, 25)) and res.expected == 15
    export.export(spark, target, pg, qname, tmp_path / "t", start=Position(time=base + timedelta(minutes=30)),
                  end=Position(time=base + timedelta(minutes=40, seconds=30)))
    assert seqs(tmp_path / "t") == list(range(30, 41))

    from fluxpg.analytics.cli import app

    ms = int((base + timedelta(minutes=95)).timestamp() * 1000)
    result = CliRunner().invoke(app, ["export", qname, "--dsn", pg.info.dsn, "--from", f"timestamp={ms}",
                                      "--out", str(tmp_path / "cli"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "exported 5 messages" in result.output
    result = CliRunner().invoke(app, ["export", qname, "--dsn", pg.info.dsn, "--from", str(ms), "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and f"for unix ms write timestamp={ms}" in result.output
    result = CliRunner().invoke(app, ["export", qname, "--dsn", pg.info.dsn, "--out", str(tmp_path / "cli")])
    assert result.exit_code == 1 and "exists: remove it or pass --overwrite" in result.output
    with pytest.raises(AnalyticsError, match="unknown queue 'nope'"):
        export.export(spark, target, pg, "nope", tmp_path / "n")
