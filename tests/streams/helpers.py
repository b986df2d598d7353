"""Helpers shared by the streams tests that talk to the real broker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import time
from collections.abc import Callable

import orjson

from fleetplan.schemas.codec import encode_event
from fleetplan.streams.audit import refold_by_event_time
from tests.streams.traffic import deciding_planner


def run_async(coro):
    """Run a coroutine to completion on a private loop in a thread (works from any test)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decisions_of(ns, deployment: str | None = None) -> list[dict]:
    """The decisions on the namespace's topic, per partition in offset order."""
    records = run_async(ns.read(ns.topics.decisions))
    out = [orjson.loads(r.value) for r in sorted(records, key=lambda r: (r.partition, r.offset))]
    return [d for d in out if deployment is None or d["deployment"] == deployment]


def expected_decisions(deployment: str, *inputs) -> list[dict]:
    """What the core decides from these inputs, folded by event time (the audit's replay)."""
    events = [e for group in inputs for e in group]
    reports = refold_by_event_time(deciding_planner(), deployment, events)
    return [orjson.loads(encode_event(r.decision)) for r in reports if r.decision is not None]
