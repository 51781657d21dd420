"""Message ids and delivery properties (DESIGN §4)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluxpg.delivery import Delivery, parse_message_id
from fluxpg.errors import InvalidArgument


@given(queue=st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s), seq=st.integers(0, 2 ** 62))
def test_message_id_round_trip(queue, seq):
    d = Delivery(queue=queue, group="g", partition=0, seq=seq, topic="t", payload=b"", headers={},
                 created_at=datetime.now(timezone.utc), delivery_count=1)
    assert parse_message_id(d.message_id) == (queue, seq)


@pytest.mark.parametrize("bad", ["", "orders", "orders:", "orders:x", "orders:-1", ":1.5", None, 42])
def test_malformed_message_ids_are_clear_errors(bad):
    with pytest.raises(InvalidArgument, match="message-id"):
        parse_message_id(bad)


def test_number_after_the_last_colon_is_the_offset():
    assert parse_message_id("a:b:42") == ("a:b", 42)
    assert parse_message_id("7") == (None, 7)


def test_stream_delivery_properties_with_primary_group():
    at = datetime(2026, 1, 2, tzinfo=timezone.utc)
    d = Delivery(queue="events", group="audit@eu/#", partition=0, seq=5, topic="$queue/events/eu/x", payload=b"",
                 headers={}, created_at=at, delivery_count=1, kind="stream", work_committed=6, work_group="billing")
    assert d.properties() == {
        "message-id": "events:5", "group-id": "audit@eu/#", "queue": "events", "offset": "5",
        "x-source-topic": "$queue/events/eu/x", "x-stream-offset": "5",
        "x-stream-timestamp": str(int(at.timestamp() * 1000)), "x-stream-partition": "0",
        "x-work-committed-offset": "6", "x-work-acked": "true", "x-work-group": "billing"}
    assert not d.redelivered
