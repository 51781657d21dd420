"""The broker's event loop (fluxpg.aio.loop_factory): uvloop's where installed, asyncio's when
FLUXPG_EVENT_LOOP=asyncio; the tests run on the same one."""
from __future__ import annotations

import asyncio
import importlib.util

from fluxpg import aio


async def test_the_tests_run_on_the_brokers_loop():
    loop = asyncio.get_running_loop()
    if importlib.util.find_spec("uvloop") is not None:
        assert type(loop).__module__.startswith("uvloop")
    else:
        assert isinstance(loop, asyncio.BaseEventLoop)


def test_asyncio_on_request(monkeypatch):
    monkeypatch.setenv("FLUXPG_EVENT_LOOP", "asyncio")
    assert aio.loop_factory() is asyncio.new_event_loop


def test_run_returns_the_result_and_closes_its_loop(monkeypatch):
    seen = []

    async def main():
        seen.append(asyncio.get_running_loop())
        return 42

    for choice in ("asyncio", ""):
        monkeypatch.setenv("FLUXPG_EVENT_LOOP", choice)
        assert aio.run(main()) == 42
        assert seen[-1].is_closed()
