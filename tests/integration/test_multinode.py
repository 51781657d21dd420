"""Several broker processes on one database (issue 8): a node killed with SIGKILL under load loses
no confirmed message — its consumers' unacknowledged deliveries are released by the surviving
nodes (node heartbeat timeout) and delivered again elsewhere. Plus a bounded soak test with
random kills and restarts."""
from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aio_pika
import pytest

from tests.broker_process import BrokerProcess, free_port, http_ready

pytestmark = pytest.mark.slow

CONFIG = """
queue_manager:
  visibility_timeout: 30s        # long on purpose: only the dead-node release can redeliver fast
  heartbeat_interval: 500ms
  heartbeat_timeout: 2s
queues:
  - name: {queue}
    limits: {{max_depth: 0}}
"""


class Node(BrokerProcess):
    """One broker process serving AMQP 0-9-1 and HTTP (healthy when /healthz says so)."""

    def __init__(self, dsn: str, config: Path, name: str):
        self.amqp_port, self.http_port = free_port(), free_port()
        super().__init__(dsn, ["--config", str(config), "--mqtt", "off", "--amqp", "off",
                               "--amqp091", f"127.0.0.1:{self.amqp_port}", "--http", f"127.0.0.1:{self.http_port}"],
                         ready=http_ready(self.http_port), name=f"node-{name}")

    def kill(self) -> None:
        self.kill9()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"


class Consumer:
    """An aio-pika consumer on one node; records every payload it was given and acks it."""

    def __init__(self, node: Node, queue: str, received: set[bytes]):
        self.node, self.queue, self.received = node, queue, received
        self.connection = None

    async def start(self) -> None:
        self.connection = await aio_pika.connect(self.node.url)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=20)
        q = await channel.get_queue(self.queue, ensure=False)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self.received.add(message.body)
            await asyncio.sleep(0.002)          # some work
            await message.ack()

        await q.consume(on_message, arguments={"x-consumer-group": "workers"})

    async def close(self) -> None:
        if self.connection is not None:
            try:
                await asyncio.wait_for(self.connection.close(), 5)
            except Exception:  # noqa: BLE001 - its node may be dead
                pass


async def publish_confirmed(node: Node, queue: str, payloads: list[bytes], confirmed: set[bytes]) -> None:
    connection = await aio_pika.connect(node.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        for payload in payloads:
            try:
                await channel.default_exchange.publish(aio_pika.Message(payload, delivery_mode=2), routing_key=queue)
                confirmed.add(payload)
            except Exception:  # noqa: BLE001 - a nack or a lost connection: not confirmed
                pass
    finally:
        await connection.close()


async def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.2)
    return predicate()


@pytest.fixture
def cluster(dsn, tmp_path_factory, qname):
    config = tmp_path_factory.mktemp("multinode") / "fluxpg.yaml"
    config.write_text(CONFIG.format(queue=qname))
    nodes = [Node(dsn, config, f"n{i}") for i in range(3)]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.close()


async def group_state(dsn, queue):
    from fluxpg import db

    conn = await db.connect(dsn)
    try:
        return await conn.fetchrow("SELECT coalesce(sum(pending), 0) AS pending, min(committed) AS committed "
                                   "FROM fluxpg.group_status WHERE queue = $1 AND grp = 'workers'", queue)
    finally:
        await conn.close()


async def test_kill_9_a_node_under_load_loses_no_confirmed_message(cluster, dsn, qname):
    a, b, c = cluster
    received: set[bytes] = set()
    confirmed: set[bytes] = set()
    consumers = [Consumer(node, qname, received) for node in (a, b, c)]
    for consumer in consumers:
        await consumer.start()
    payloads = [b"m-%05d" % i for i in range(1500)]
    publishers = [asyncio.create_task(publish_confirmed(node, qname, payloads[i::2], confirmed))
                  for i, node in enumerate((a, c))]
    await wait_until(lambda: len(received) > 300, 30)
    b.kill()                                     # its consumer's unacked deliveries are in flight
    await asyncio.gather(*publishers)
    assert len(confirmed) == len(payloads)       # a and c stayed up: every publish was confirmed
    assert await wait_until(lambda: confirmed <= received, 60), f"{len(confirmed - received)} lost"
    # Everything delivered was eventually acknowledged: nothing stays pending on the dead node.
    deadline = time.monotonic() + 30
    while (state := await group_state(dsn, qname))["pending"] and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert state["pending"] == 0 and state["committed"] == len(payloads)
    for consumer in consumers:
        await consumer.close()


async def test_soak_random_node_kills(cluster, dsn, qname):
    """About a minute of publishing and consuming while nodes are killed and restarted."""
    random.seed(11)
    received: set[bytes] = set()
    confirmed: set[bytes] = set()
    consumers = {node.name: Consumer(node, qname, received) for node in cluster}
    for consumer in consumers.values():
        await consumer.start()
    stop = time.monotonic() + 45
    counter = 0

    async def producer():
        nonlocal counter
        while time.monotonic() < stop:
            node = random.choice([n for n in cluster if n.proc.poll() is None])
            batch = [b"s-%06d" % (counter + i) for i in range(50)]
            counter += 50
            try:
                await publish_confirmed(node, qname, batch, confirmed)
            except Exception:  # noqa: BLE001 - the node died under us; unconfirmed, fine
                pass

    async def chaos():
        while time.monotonic() < stop - 5:
            await asyncio.sleep(random.uniform(3, 6))
            victim = random.choice(cluster)
            victim.kill()
            await consumers[victim.name].close()
            await asyncio.sleep(random.uniform(0.5, 2))
            await asyncio.to_thread(victim.start)
            consumers[victim.name] = Consumer(victim, qname, received)
            await consumers[victim.name].start()

    await asyncio.gather(producer(), producer(), chaos())
    assert confirmed, "nothing was confirmed"
    assert await wait_until(lambda: confirmed <= received, 90), f"{len(confirmed - received)} confirmed messages lost"
    for consumer in consumers.values():
        await consumer.close()
