"""Unit tests of fluxpg.config (pure: YAML files in tmp_path, no database)."""
from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluxpg.config import (
    Config,
    ConfigError,
    DurationError,
    QueueConfig,
    QueueManagerConfig,
    format_duration,
    load_config,
    parse_address,
    parse_duration,
    queue_config_from_amqp_args,
    settings_from_amqp_args,
)
from fluxpg.errors import InvalidArgument

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("FLUXPG_CONFIG", raising=False)
    monkeypatch.delenv("FLUXPG_DSN", raising=False)


def write(tmp_path: Path, text: str, name: str = "fluxpg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems_of(path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    message = str(exc.value)
    assert "Traceback" not in message
    return message


# ----------------------------------------------------------------------------- defaults


def test_defaults_are_fluxmqs():
    c = load_config(None)
    assert c == Config()
    assert c.database.dsn is None and c.database.pool_size == 10 and c.database.min_pool_size == 2
    assert c.database.data_dir is None
    assert c.listeners.model_dump() == {
        "mqtt": "0.0.0.0:1883",
        "amqp": "0.0.0.0:5672",
        "amqp091": "0.0.0.0:5682",
        "http": "0.0.0.0:8082",
        "ws": None,      # MQTT over WebSocket: off unless configured
    }
    qm = c.queue_manager
    assert qm.auto_commit_interval == timedelta(seconds=5)
    assert qm.visibility_timeout == timedelta(seconds=30)
    assert (qm.max_pending_per_group, qm.claim_batch, qm.delivery_batch) == (100_000, 10, 100)
    assert qm.retention_interval == qm.ephemeral_grace == timedelta(minutes=5)
    assert (qm.heartbeat_interval, qm.heartbeat_timeout) == (timedelta(seconds=5), timedelta(seconds=30))
    assert qm.max_groups_per_stream == 50
    assert (qm.auto_create, qm.transient_max_bytes) == ("durable", 256 * 2 ** 20)
    assert c.queues == []


def test_effective_queues_default_has_no_implicit_catch_all():
    # FluxMQ's implicit reserved `mqtt` queue would take every unmatched publish and defeat
    # auto_create (durable by default): with no queues configured there are none.
    assert Config().effective_queues() == []
    c = Config(queues=[{"name": "orders"}])
    assert [q.name for q in c.effective_queues()] == ["orders"]
    catch_all = Config(queues=[{"name": "mqtt", "topics": ["$queue/#"], "reserved": True}])
    (q,) = catch_all.effective_queues()
    assert (q.name, q.topics, q.reserved) == ("mqtt", ["$queue/#"], True)


def test_auto_create_values():
    assert Config(queue_manager={"auto_create": "transient"}).queue_manager.auto_create == "transient"
    assert Config(queue_manager={"auto_create": "off"}).queue_manager.auto_create == "off"
    with pytest.raises(ValueError):
        Config(queue_manager={"auto_create": "memory"})
    with pytest.raises(ValueError):
        Config(queue_manager={"transient_max_bytes": -1})
    assert any("ephemeral_grace is ignored" in w
               for w in Config(queue_manager={"ephemeral_grace": "1m"}).warnings())


def test_queue_defaults():
    q = QueueConfig(name="orders")
    assert q.topics == ["$queue/orders/#"]
    assert (q.reserved, q.type, q.primary_group, q.partitions, q.segment_size) == (False, "classic", "", 1, 100_000)
    assert q.limits.model_dump(mode="json") == {
        "max_message_size": 10485760,
        "max_depth": 100000,
        "message_ttl": "168h",
        "overflow": "reject-publish",
    }
    assert q.retry.model_dump(mode="json") == {
        "max_retries": 10,
        "initial_backoff": "5s",
        "max_backoff": "5m",
        "multiplier": 2.0,
        "nack_backoff": False,
    }
    assert q.dlq.enabled and q.dlq.topic == "" and q.dlq_queue == "$dlq/orders" and not q.dlq.expired
    assert q.retention.model_dump(mode="json") == {"max_age": "0s", "max_length_bytes": 0, "max_length_messages": 0}
    assert q.replication.enabled is False


def test_shipped_config_file_equals_defaults():
    assert load_config(REPO / "config" / "fluxpg.yaml") == Config()


def test_env_config_and_dsn(monkeypatch, tmp_path):
    path = write(tmp_path, "database: {pool_size: 3, min_pool_size: 1}\n")
    monkeypatch.setenv("FLUXPG_CONFIG", str(path))
    assert load_config(None).database.pool_size == 3
    monkeypatch.setenv("FLUXPG_DSN", "postgresql://x@h/db")
    c = load_config(None)
    assert c.database.dsn == "postgresql://x@h/db" and c.database.pool_size == 3
    monkeypatch.delenv("FLUXPG_CONFIG")
    assert load_config(None).database.dsn == "postgresql://x@h/db"


# ----------------------------------------------------------------------------- full example


def test_example_loads():
    examples = sorted((REPO / "config" / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(path)
    c = load_config(REPO / "config" / "examples" / "orders-and-events.yaml")
    orders, events = c.queues
    assert orders.type == "classic" and orders.dlq.enabled and orders.retry.multiplier == 3.0
    assert orders.limits.message_ttl == timedelta(hours=72)
    assert events.type == "stream" and events.partitions == 4 and events.primary_group == "billing"
    assert events.retention.max_age == timedelta(days=7)
    assert c.listeners.amqp is None
    assert c.listeners.addresses() == {
        "mqtt": ("0.0.0.0", 1883),
        "amqp091": ("0.0.0.0", 5682),
        "http": ("127.0.0.1", 8082),
    }
    assert c.queue_manager.visibility_timeout == timedelta(minutes=1)


def test_every_key_loads(tmp_path):
    path = write(
        tmp_path,
        """
        database: {dsn: "postgresql://u@h/d", pool_size: 4, min_pool_size: 0, data_dir: /tmp/pg}
        listeners: {mqtt: "[::1]:0", amqp: ":5672", amqp091: null, http: "localhost:8082"}
        queue_manager:
          auto_commit_interval: "0"
          visibility_timeout: 1m30s
          max_pending_per_group: 5
          claim_batch: 1
          delivery_batch: 1
          retention_interval: 10s
          ephemeral_grace: 0
          auto_create: transient
          transient_max_bytes: 1000
          heartbeat_interval: 1s
          heartbeat_timeout: 3s
          max_groups_per_stream: 2
        queues:
          - name: s
            topics: ["$queue/s/#", "sensors/+/temp"]
            reserved: true
            type: stream
            primary_group: g
            partitions: 3
            segment_size: 10
            limits: {max_message_size: 0, max_depth: 0, message_ttl: "0", overflow: drop-head}
            retry: {max_retries: 0, initial_backoff: 100ms, max_backoff: 1s, multiplier: 1, nack_backoff: true}
            dlq: {enabled: false, topic: "$dlq/other", expired: true}
            retention: {max_age: 1W, max_length_bytes: 1000, max_length_messages: 10}
            replication: {enabled: true, group: r, mode: async, ack_timeout: 1s,
                          replication_factor: 1, min_in_sync_replicas: 1}
        """,
    )
    c = load_config(path)
    q = c.queues[0]
    assert q.limits.message_ttl == timedelta(0) and q.dlq_queue is None
    assert c.listeners.addresses()["mqtt"] == ("::1", 0)
    assert (c.queue_manager.auto_create, c.queue_manager.transient_max_bytes) == ("transient", 1000)
    assert (q.limits.overflow, q.retry.nack_backoff, q.dlq.expired) == ("drop-head", True, True)
    assert c.warnings() == ["queues[0].replication is ignored by fluxpg (PostgreSQL replication applies instead)",
                            "queue_manager.ephemeral_grace is ignored: in-memory ephemeral queues were replaced "
                            "by transient queues (see queue_manager.auto_create)"]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "text, expected",
    [
        ("colour: red\n", ":1: colour: unknown key 'colour'"),
        ("database:\n  dns: x\n", ":2: database.dns: unknown key 'dns' (did you mean 'dsn'?)"),
        ("queue_manager:\n  claim_batch: 1\n  vis: 1s\n", ":3: queue_manager.vis: unknown key"),
        (
            "queues:\n  - name: a\n  - name: b\n    retry:\n      multiplyer: 2\n",
            ":5: queues[1].retry.multiplyer: unknown key 'multiplyer' (did you mean 'multiplier'?)",
        ),
        (
            "queues:\n  - name: a\n    replication: {enabled: false, extra: 1}\n",
            ":3: queues[0].replication.extra: unknown key",
        ),
    ],
)
def test_unknown_keys_report_path_and_line(tmp_path, text, expected):
    message = problems_of(write(tmp_path, text))
    assert message.startswith(str(tmp_path / "fluxpg.yaml"))
    assert expected in message
    assert "expected one of:" in message


def test_every_problem_is_one_line(tmp_path):
    path = write(
        tmp_path,
        """
        database: {pool_size: 0}
        listeners: {mqtt: "1883"}
        queues:
          - name: "a/b"
          - name: ok
            retry: {multiplier: abc}
        """,
    )
    lines = problems_of(path).splitlines()
    assert len(lines) == 4
    assert all(line.startswith(f"{path}:") for line in lines)
    joined = "\n".join(lines)
    assert "database.pool_size: Input should be greater than or equal to 1" in joined
    assert "listeners.mqtt: invalid address '1883'" in joined
    assert "queues[0].name: queue name 'a/b' must not contain '/'" in joined
    assert "queues[1].retry.multiplier:" in joined and "'abc'" in joined


@pytest.mark.parametrize(
    "text, expected",
    [
        ("queue_manager: {visibility_timeout: 30}\n", "queue_manager.visibility_timeout: expected a duration"),
        ("queue_manager: {visibility_timeout: 5 parsecs}\n", "invalid duration '5 parsecs'"),
        ("queue_manager: {visibility_timeout: '0'}\n", "must be greater than zero"),
        ("queues: [{name: q, limits: {message_ttl: -5s}}]\n", "queues[0].limits.message_ttl: duration '-5s' is negative"),
        ("queues: [{name: q, retry: {initial_backoff: 10m}}]\n", "initial_backoff (10m) must not exceed max_backoff (5m)"),
        ("queue_manager: {heartbeat_timeout: 5s}\n", "heartbeat_timeout (5s) must be longer"),
    ],
)
def test_bad_durations(tmp_path, text, expected):
    assert expected in problems_of(write(tmp_path, text))


@pytest.mark.parametrize(
    "value, expected",
    [
        ("'1883'", "missing ':PORT'"),
        ("'::1:1883'", "put an IPv6 host in brackets"),
        ("'host:http'", "invalid port 'http'"),
        ("'host:70000'", "invalid port 70000"),
        ("'[::1:1883'", "invalid address"),
        ("1883", "expected HOST:PORT"),
    ],
)
def test_bad_addresses(tmp_path, value, expected):
    message = problems_of(write(tmp_path, f"listeners:\n  amqp091: {value}\n"))
    assert ":2: listeners.amqp091:" in message and expected in message


def test_parse_address():
    assert parse_address("0.0.0.0:1883") == ("0.0.0.0", 1883)
    assert parse_address("[::1]:1883") == ("::1", 1883)
    assert parse_address("[::]:0") == ("::", 0)
    assert parse_address(":5672") == ("0.0.0.0", 5672)
    assert parse_address("broker.local:8082") == ("broker.local", 8082)
    for bad in ["", "x", "x:", "x:-1", "[x]:1", "a b:1", "[::1]1883"]:
        with pytest.raises(ValueError):
            parse_address(bad)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("''", "must not be empty"),
        ("'a+b'", "must not contain the wildcard '+'"),
        ("'a#'", "must not contain the wildcard '#'"),
        ("'$dlq'", "must not start with '$'"),
        ("'" + "x" * 201 + "'", "at most 200"),
        ("\"a\\0b\"", "must not contain control characters"),
    ],
)
def test_bad_queue_names(tmp_path, name, expected):
    message = problems_of(write(tmp_path, f"queues:\n  - name: {name}\n"))
    assert ":2: queues[0].name:" in message and expected in message


def test_other_queue_problems(tmp_path):
    assert "queues[1].name: duplicate queue name 'a' (already queues[0])" in problems_of(
        write(tmp_path, "queues:\n  - name: a\n  - name: a\n")
    )
    assert ":3: queues[1].name: duplicate" in problems_of(write(tmp_path, "queues:\n  - name: a\n  - name: a\n"))
    assert "queues[0].topics[1]: topic filter 'a/#/b'" in problems_of(
        write(tmp_path, "queues:\n  - name: a\n    topics: ['x/#', 'a/#/b']\n")
    )
    assert "queues[0].topics: must list at least one" in problems_of(
        write(tmp_path, "queues:\n  - name: a\n    topics: []\n")
    )
    assert "queues[0].type: Input should be 'classic' or 'stream'" in problems_of(
        write(tmp_path, "queues: [{name: a, type: quorum}]\n")
    )
    assert "queues[0].partitions: Input should be greater than or equal to 1" in problems_of(
        write(tmp_path, "queues: [{name: a, partitions: 0}]\n")
    )
    assert "queues[0].dlq.topic:" in problems_of(write(tmp_path, "queues: [{name: a, dlq: {topic: 'x/y'}}]\n"))
    assert "queues[0].name: required key is missing" in problems_of(write(tmp_path, "queues: [{type: stream}]\n"))
    assert "database: min_pool_size (5) must not exceed pool_size (2)" in problems_of(
        write(tmp_path, "database: {pool_size: 2, min_pool_size: 5}\n")
    )


def test_yaml_syntax_error_reports_line(tmp_path):
    path = write(tmp_path, "database:\n  dsn: x\nlisteners:\n  mqtt: [unclosed\nqueues: []\n")
    message = problems_of(path)
    assert message.startswith(f"{path}:")
    assert "YAML syntax error" in message
    line = int(message.split(":")[1])
    assert 4 <= line <= 5


def test_yaml_indentation_error_reports_line(tmp_path):
    path = write(tmp_path, "database:\n  dsn: x\n   pool_size: 3\n")
    assert problems_of(path).startswith(f"{path}:3:")


def test_other_file_problems(tmp_path):
    assert "duplicate key 'pool_size'" in problems_of(write(tmp_path, "database:\n  pool_size: 1\n  pool_size: 2\n"))
    assert ":1: expected a mapping of sections" in problems_of(write(tmp_path, "- a\n- b\n"))
    assert "cannot read config file" in problems_of(tmp_path / "missing.yaml")
    assert load_config(write(tmp_path, "# nothing but a comment\n")) == Config()


# ----------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("5s", timedelta(seconds=5)),
        ("1m30s", timedelta(seconds=90)),
        ("168h", timedelta(hours=168)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5h", timedelta(minutes=90)),
        ("250us", timedelta(microseconds=250)),
        ("250µs", timedelta(microseconds=250)),
        ("1500ns", timedelta(microseconds=2)),  # rounded to timedelta's resolution
        ("7D", timedelta(days=7)),
        ("1W", timedelta(weeks=1)),
        ("24h", timedelta(days=1)),
        ("1M", timedelta(days=30)),
        ("1Y", timedelta(days=365)),
        ("1D12h", timedelta(hours=36)),
        (" 5s ", timedelta(seconds=5)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "5", "s", "5 s", "-1s", "5x", "1h-5m", "abc", "1e3s", "5S", "5.s.s"])
def test_parse_duration_errors(bad):
    with pytest.raises(DurationError) as exc:
        parse_duration(bad)
    assert "expected a duration" in str(exc.value)


def test_parse_duration_other_types():
    assert parse_duration(0) == timedelta(0)
    assert parse_duration(timedelta(seconds=3)) == timedelta(seconds=3)
    for bad in [30, 1.5, True, None, timedelta(seconds=-1)]:
        with pytest.raises(DurationError):
            parse_duration(bad)  # type: ignore[arg-type]


def test_format_duration():
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(seconds=5)) == "5s"
    assert format_duration(timedelta(seconds=90)) == "1m30s"
    assert format_duration(timedelta(hours=168)) == "168h"
    assert format_duration(timedelta(milliseconds=500)) == "500ms"
    assert format_duration(timedelta(microseconds=250)) == "250us"
    assert format_duration(timedelta(hours=1, milliseconds=500)) == "1h0.5s"
    with pytest.raises(ValueError):
        format_duration(timedelta(seconds=-1))


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=100_000)))
def test_duration_round_trip(td):
    text = format_duration(td)
    assert parse_duration(text) == td
    assert format_duration(parse_duration(text)) == text


_units = st.sampled_from(["ms", "s", "m", "h", "D", "W", "M", "Y", "us"])


@given(st.lists(st.tuples(st.integers(0, 10_000), _units), min_size=1, max_size=4))
def test_parsed_durations_format_stably(parts):
    text = "".join(f"{n}{u}" for n, u in parts)
    td = parse_duration(text)
    assert parse_duration(format_duration(td)) == td


# ----------------------------------------------------------------------------- settings


def test_to_settings_defaults():
    settings = QueueConfig(name="orders").to_settings(QueueManagerConfig())
    assert settings == {
        "limits": {"max_message_size": 10485760, "max_depth": 100000, "message_ttl": "168h",
                   "overflow": "reject-publish"},
        "retry": {"max_retries": 10, "initial_backoff": "5s", "max_backoff": "5m", "multiplier": 2.0,
                  "nack_backoff": False},
        "dlq": {"enabled": True, "topic": "", "expired": False},  # "" = $dlq/orders, as in SQL
        "retention": {"max_age": "0s", "max_length_bytes": 0, "max_length_messages": 0},  # classic: no age limit
        "primary_group": "",
        "partitions": 1,
        "segment_size": 100000,
        "delivery": {"visibility_timeout": "30s", "max_pending": 100000, "auto_commit_interval": "5s",
                     "member_timeout": "30s", "max_groups": 50},
        "reserved": False,
    }


def test_to_settings_from_file(tmp_path):
    c = load_config(
        write(
            tmp_path,
            """
            queue_manager: {visibility_timeout: 90s, max_pending_per_group: 7}
            queues:
              - name: ev
                type: stream
                primary_group: billing
                partitions: 2
                retention: {max_age: 7D}
                limits: {message_ttl: "0"}
                dlq: {topic: dead}
            """,
        )
    )
    settings = c.queues[0].to_settings(c.queue_manager)
    assert settings["retention"]["max_age"] == "168h"
    assert settings["limits"]["message_ttl"] == "0s"
    assert settings["dlq"] == {"enabled": True, "topic": "dead", "expired": False}
    assert settings["delivery"] == {"visibility_timeout": "1m30s", "max_pending": 7, "auto_commit_interval": "5s",
                                     "member_timeout": "30s", "max_groups": 50}
    assert (settings["primary_group"], settings["partitions"]) == ("billing", 2)
    # The stored settings describe the same queue when read back.
    again = QueueConfig(name="ev", **{k: settings[k] for k in ("limits", "retry", "retention", "partitions")})
    assert again.retention == c.queues[0].retention and again.limits == c.queues[0].limits


def test_settings_from_amqp_args():
    assert settings_from_amqp_args(None) == {}
    assert settings_from_amqp_args({"x-dead-letter-exchange": "dlx"}) == {}
    stream = settings_from_amqp_args(
        {"x-queue-type": b"stream", "x-max-age": "7D", "x-max-length": 1000, "x-max-length-bytes": 20_000_000}
    )
    assert stream == {
        "type": "stream",
        "retention": {"max_age": "168h", "max_length_messages": 1000, "max_length_bytes": 20_000_000},
    }
    classic = settings_from_amqp_args({"x-max-length": 50, "x-message-ttl": 60_000})
    assert classic == {"limits": {"max_depth": 50, "message_ttl": "1m"}}
    assert settings_from_amqp_args({"x-queue-type": "quorum"}) == {"type": "classic"}
    q = queue_config_from_amqp_args("events", {"x-queue-type": "stream", "x-max-age": "1Y"})
    assert q.type == "stream" and q.retention.max_age == timedelta(days=365)
    assert q.topics == ["$queue/events/#"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"x-queue-type": "lazy"}, "x-queue-type: expected 'classic' or 'stream'"),
        ({"x-queue-type": 5}, "x-queue-type: expected a string"),
        ({"x-max-age": "7 days"}, "x-max-age: invalid duration"),
        ({"x-max-length": -1}, "x-max-length: expected a non-negative integer"),
        ({"x-max-length-bytes": "lots"}, "x-max-length-bytes: expected a non-negative integer"),
        ({"x-message-ttl": 1.5}, "x-message-ttl: expected a non-negative integer"),
        ({"x-message-ttl": True}, "x-message-ttl: expected a non-negative integer"),
    ],
)
def test_settings_from_amqp_args_errors(args, fragment):
    with pytest.raises(InvalidArgument) as exc:
        settings_from_amqp_args(args)
    assert fragment in str(exc.value)


def test_queue_config_from_amqp_args_bad_name():
    with pytest.raises(InvalidArgument) as exc:
        queue_config_from_amqp_args("a/b", {})
    assert "name: queue name 'a/b' must not contain '/'" in str(exc.value)


def test_models_validate_assignment():
    c = Config()
    with pytest.raises(Exception):
        c.listeners.mqtt = "nope"
    c.listeners.mqtt = "127.0.0.1:0"
    assert c.listeners.addresses()["mqtt"] == ("127.0.0.1", 0)
