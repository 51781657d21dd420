"""`sql`: Spark SQL over per-queue views answers JSON-field questions as Postgres does."""
from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from fluxpg.analytics import sql
from fluxpg.analytics.jdbc import AnalyticsError, sanitize_view_name
from tests.analytics.helpers import append, declare

pytestmark = pytest.mark.spark


@pytest.fixture
def orders(pg, qname):
    rnd = random.Random(3)
    name = f"{qname}.Orders-EU"  # sanitized to a view name
    qid = declare(pg, name, "classic")
    payloads = [json.dumps({"customer": rnd.choice(["ann", "bob", "cid"]), "amount": rnd.randrange(1, 500),
                            "items": [{"sku": "a"}] * rnd.randrange(1, 4)}).encode() for _ in range(400)]
    payloads.append(b"\xff not json")  # a payload that is neither UTF-8 nor JSON is tolerated
    append(pg, qid, [f"$queue/{name}/eu"] * len(payloads), payloads)
    return name


def test_json_field_question(spark, target, pg, orders):
    view = sanitize_view_name(orders)
    want = pg.execute(
        """SELECT convert_from(payload, 'UTF8')::jsonb ->> 'customer', count(*), sum((convert_from(payload, 'UTF8')::jsonb ->> 'amount')::int)
             FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id
            WHERE q.name = %s AND l.payload <> '\\xff206e6f74206a736f6e'::bytea GROUP BY 1 ORDER BY 1""", (orders,)).fetchall()
    cols, rows, more, views = sql.run(spark, target, pg,
        f"""SELECT get_json_object(payload_text, '$.customer') AS customer, count(*) AS n,
                   sum(cast(get_json_object(payload_text, '$.amount') AS INT)) AS total
              FROM {view} WHERE get_json_object(payload_text, '$.customer') IS NOT NULL GROUP BY 1 ORDER BY 1""")
    assert cols == ["customer", "n", "total"] and not more
    assert [tuple(r) for r in rows] == [tuple(r) for r in want]
    assert views.registered[view].endswith("(with body)")

    # the same through the parsed body struct
    _, rows, _, _ = sql.run(spark, target, pg, f"SELECT body.customer, count(*), sum(body.amount) FROM {view} "
                                               "WHERE body.customer IS NOT NULL GROUP BY 1 ORDER BY 1")
    assert [tuple(r) for r in rows] == [tuple(r) for r in want]


def test_log_view_and_cli(spark, dsn, pg, orders):
    from fluxpg.analytics.cli import app

    result = CliRunner().invoke(app, ["sql", "--dsn", dsn,
                                      f"SELECT count(*) AS n, sum(size) AS b FROM log WHERE queue = '{orders}'"])
    assert result.exit_code == 0, result.output
    n, b = pg.execute("""SELECT count(*), sum(octet_length(payload)) FROM fluxpg.log l JOIN fluxpg.queues q
                          ON q.id = l.queue_id WHERE q.name = %s""", (orders,)).fetchone()
    assert f"{n:,}" in result.output and f"{b:,}" in result.output

    result = CliRunner().invoke(app, ["sql", "--dsn", dsn, "SELECT * FROM q_does_not_exist"])
    assert result.exit_code == 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "TABLE_OR_VIEW_NOT_FOUND" in lines[0] and sanitize_view_name(orders) in lines[0]
    with pytest.raises(AnalyticsError, match="empty SQL"):
        sql.run(spark, None, pg, "  ")
