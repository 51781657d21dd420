"""The Python work per message of MQTT plain pub/sub, in process and without sockets:

    python -m benchmarks.cpu.mqtt_replay [--messages 20000] [--per-read 1 4] [--rounds 15]

A publisher Connection consumes encoded QoS 1 PUBLISHes (`--per-read` packets per read, as
InlineReader hands them over), the router delivers each to a subscriber Connection (writes
discarded), which then consumes the PUBACKs for them. Prints the best process time per message
over the rounds. No event loop turns, no system calls: what `benchmarks.cpu mqtt` measures on
top of this is the loop and the sockets (see benchmarks/README.md, MQTT fourth round). Noisy on a
shared machine (±10 %); compare two checkouts by running it from each (PYTHONPATH=.).
"""
from __future__ import annotations

import argparse
import asyncio
import time
import types

from fluxpg.protocols.mqtt import session as S
from fluxpg.protocols.mqtt.codec import MQTT_5, encode_ack_ok, encode_publish_plain
from fluxpg.protocols.mqtt.router import Router, make_sub_options


class _Transport:
    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, *a, **k):
        return None


class _Writer:
    def __init__(self) -> None:
        self.transport = _Transport()

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, *a, **k):
        return None

    def is_closing(self) -> bool:
        return False


async def replay(n: int, per_read: int, rounds: int) -> float:
    manager = types.SimpleNamespace(node_id=1)
    ctx = types.SimpleNamespace(manager=manager, config=types.SimpleNamespace(), state={})
    router = Router(manager)
    options = S.MqttOptions()

    def connection(cid: str) -> S.Connection:
        c = S.Connection(None, _Writer(), ctx, router, options)
        c.version = c.decoder.version = MQTT_5
        c.client_id = cid
        c.send_quota = 65535
        sess = S.Session(router, cid)
        sess.conn, c.session = c, sess
        router.sessions[cid] = sess
        return c

    pub, sub = connection("pub"), connection("sub")
    router.add_subscription(sub.session, make_sub_options("bench/t", 1, False, False, 0, None))
    payload = bytes(256)
    best = float("inf")
    sent = 0
    for _ in range(rounds):
        pubs = [encode_publish_plain("bench/t", payload, 1, False, (i % 65535) + 1, MQTT_5) for i in range(n)]
        acks = [encode_ack_ok(0x40, ((sent + i) % 65535) + 1) for i in range(n)]
        sent += n
        reads = [(b"".join(pubs[i:i + per_read]), b"".join(acks[i:i + per_read])) for i in range(0, n, per_read)]
        t = time.process_time()
        for p, a in reads:
            pub._consume(p)
            sub._consume(a)
        best = min(best, time.process_time() - t)
        assert not sub.session.inflight
    return best / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--per-read", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    for k in args.per_read:
        us = asyncio.run(replay(args.messages, k, args.rounds))
        print(f"{k} packet(s) per read: {us:.2f} µs/msg (publish + deliver + PUBACK, Python only)")


if __name__ == "__main__":
    main()
