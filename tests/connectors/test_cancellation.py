"""A cancelled Redis call is cancelled: the task ends, it does not run on.

On Python 3.11, redis-py 8 swallowed most cancellations of a command
(every command goes through ``asyncio.wait_for`` under its 5-s socket
timeout, and 3.11's ``wait_for`` drops a cancellation that lands as the
inner call completes, CPython gh-86296). A connector lane cancelled at
shutdown, or an orchestrator's ``wait_for`` around ``decisions()``, then
ran on: the test of a withdrawn decision hung until pytest's timeout in
about one run in four. pyproject.toml keeps redis-py below 8 on 3.11.
"""

from __future__ import annotations

import asyncio

import pytest

from fleetplan.connectors.ledger import connect

pytestmark = pytest.mark.redis

ROUNDS = 30


async def _ends_when_cancelled(coro_factory, after: float) -> bool:
    task = asyncio.create_task(coro_factory())
    await asyncio.sleep(after)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    if not done:  # swallowed: stop it for good before failing
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.2)
    return bool(done) and task.cancelled()


async def test_a_loop_of_commands_stops_at_every_cancel(redis_url, redis_key_prefix):
    client = connect(redis_url)
    key = f"{redis_key_prefix}cancel"

    async def loop():
        while True:
            await client.hmget(key, ["a", "b"])

    try:
        ended = [await _ends_when_cancelled(loop, 0.01 + 0.001 * i) for i in range(ROUNDS)]
    finally:
        await client.aclose()
    assert all(ended), f"{ended.count(False)} of {ROUNDS} cancellations swallowed"
