"""`report` against real Postgres and local Spark: every number equals SQL's own answer."""
from __future__ import annotations

import random
from datetime import timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fluxpg.analytics import report
from tests.analytics.helpers import append, declare

pytestmark = pytest.mark.spark

NO_BACKOFF = {"retry": {"initial_backoff": "0s", "max_backoff": "0s"}}


@pytest.fixture
def traffic(pg, qname):
    """A classic queue (3 routing keys, messages spread over 3 hours, a group with pending entries,
    redeliveries and dead letters) and a 2-partition stream with a committed group."""
    rnd = random.Random(7)
    classic, stream = f"{qname}_c", f"{qname}_s"
    cid = declare(pg, classic, "classic", NO_BACKOFF)
    sid = declare(pg, stream, "stream", {"partitions": 2})
    n = 600
    append(pg, cid, [f"$queue/{classic}/" + ("eu/de", "eu/fr", "us")[i % 3] for i in range(n)],
           [rnd.randbytes(rnd.randrange(0, 300)) for _ in range(n)])
    append(pg, cid, [f"$queue/{classic}"] * 5, [b"root"] * 5)  # routing key '' (the queue root)
    append(pg, sid, [f"$queue/{stream}/k{i % 4}" for i in range(400)], [b"x" * (i % 50) for i in range(400)])
    # Spread the classic queue over three hours (test data only: the broker never updates the log).
    pg.execute("""UPDATE fluxpg.log SET created_at = created_at - (seq %% 3) * interval '1 hour'
                   WHERE queue_id = %s""", (cid,))
    # Group g: 20 claimed, 4 nacked and claimed again (redeliveries), 3 rejected (dead-lettered).
    seqs = [r[0] for r in pg.execute("SELECT seq FROM fluxpg.claim(%s, 'g', 'c1', 20)", (classic,))]
    pg.execute("SELECT fluxpg.nack(%s, 'g', %s::bigint[])", (classic, seqs[:4]))
    pg.execute("SELECT fluxpg.claim(%s, 'g', 'c1', 4)", (classic,))
    pg.execute("SELECT fluxpg.reject(%s, 'g', %s::bigint[])", (classic, seqs[10:13]))
    pg.execute("SELECT fluxpg.ack(%s, 'g', %s::bigint[])", (classic, seqs[13:15]))
    pg.execute("SELECT fluxpg.claim(%s, 'other', 'c2', 3)", (classic,))
    pg.execute("SELECT fluxpg.read(%s, 's', 'c', 150)", (stream,))
    pg.execute("SELECT fluxpg.commit(%s, 's', c.cursor, c.partition) FROM fluxpg.group_status c WHERE queue = %s AND grp = 's'",
               (stream, stream))
    return classic, stream


def _epoch(dt):
    return dt.timestamp() if dt.tzinfo else dt.replace(tzinfo=None).timestamp()


def test_report_matches_sql(spark, target, pg, traffic):
    classic, stream = traffic
    queues = [classic, stream]
    r = report.build(spark, target, pg, bucket="1h", queues=queues)
    got = report.collect(r)
    r.close()

    want_tp = {(q, b.replace(tzinfo=timezone.utc).timestamp()): (n, size) for q, b, n, size in pg.execute(
        """SELECT q.name, date_trunc('hour', l.created_at AT TIME ZONE 'UTC'), count(*), sum(octet_length(l.payload))
             FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id WHERE q.name = ANY (%s) GROUP BY 1, 2""", (queues,))}
    cols, rows = got["throughput"]
    assert cols == ["queue", "bucket", "messages", "bytes"]
    assert {(q, _epoch(b)): (n, size) for q, b, n, size in rows} == want_tp
    assert len({b for q, b, _, _ in rows if q == classic}) >= 3  # the spread really spans buckets

    want_rk = {(q, k): (n, size) for q, k, n, size in pg.execute(
        """SELECT q.name, fluxpg.routing_key(l.topic), count(*), sum(octet_length(l.payload))
             FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id WHERE q.name = ANY (%s) GROUP BY 1, 2""", (queues,))}
    cols, rows = got["routing_keys"]
    assert {(q, k): (n, size) for q, k, n, size, *_ in rows} == want_rk
    assert (classic, "") in want_rk and (classic, "eu/de") in want_rk

    cols, rows = got["groups"]
    groups = {(row[0], row[1]): dict(zip(cols, row)) for row in rows}
    assert set(groups) == {(classic, "g"), (classic, "other"), (stream, "s")}
    for (q, g), row in groups.items():
        head, committed, lag, pending = pg.execute(
            """SELECT sum(committed + lag), sum(committed), sum(lag), sum(pending) FROM fluxpg.group_status
                WHERE queue = %s AND grp = %s""", (q, g)).fetchone()
        assert (row["head"], row["committed"], row["lag"], row["pending"]) == (head, committed, lag, pending)
    g = groups[(classic, "g")]
    assert g["head"] == 605 and g["pending"] == 20 - 3 - 2 and g["redeliveries"] == 4 and g["dead_lettered"] == 3
    assert g["redeliveries"] == pg.execute(
        "SELECT count(*) FROM fluxpg.pending_entries WHERE queue = %s AND grp = 'g' AND delivery_count > 1", (classic,)).fetchone()[0]
    assert g["dead_lettered"] == pg.execute(
        """SELECT count(*) FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id
            WHERE q.name = %s AND l.headers ->> '_dlq_group' = 'g'""", ("$dlq/" + classic,)).fetchone()[0]
    assert groups[(classic, "other")]["dead_lettered"] == 0
    s = groups[(stream, "s")]
    assert (s["partitions"], s["head"], s["lag"], s["committed"]) == (2, 400, 250, 150)


def test_report_cli_tables_chart_and_files(spark, dsn, traffic, tmp_path: Path):
    from fluxpg.analytics.cli import app

    classic, stream = traffic
    chart, out = tmp_path / "report.png", tmp_path / "tables"
    result = CliRunner().invoke(app, ["report", "--dsn", dsn, "-q", classic, "-q", stream, "--bucket", "1d",
                                      "--chart", str(chart), "--out", str(out), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert "Throughput per 1d" in result.output and "Consumer groups" in result.output
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    for name in ("throughput", "routing_keys", "groups"):
        csvs = list((out / name).glob("part-*.csv"))
        assert len(csvs) == 1
    lines = next((out / "throughput").glob("part-*.csv")).read_text().splitlines()
    assert lines[0] == "queue,bucket,messages,bytes"
    assert sum(int(ln.split(",")[2]) for ln in lines[1:]) == 605 + 400

    result = CliRunner().invoke(app, ["report", "--dsn", dsn, "--bucket", "5m"])
    assert result.exit_code == 1 and "invalid --bucket '5m'" in result.output
