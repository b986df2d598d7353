"""A simulated fleet scaled by the live planner: the demo's orchestrator.

``fleetplan simulate --policy fleetplan.sim.follow:FollowDecisions --publish ...
--realtime`` closes the live loop on the simulator. The fleet publishes its
FPMs and requests to the bridge; the worker decides; ``fleetplan connector
--backend virtual`` writes each decision's desired counts to Redis; this
policy reads them with the orchestrator client
(:class:`~fleetplan.connectors.client.RedisOrchestratorClient`), scales the
simulated fleet to them (the simulated connector: startup time, draining)
and completes each decision once the fleet has reached it — the connector
then acks it on Kafka and the worker folds the ack.

The client is asynchronous and the simulator is not: a daemon thread runs
the client's event loop, hands decisions over through a queue and sends the
completions. A decision the fleet has not reached when a newer one arrives
is completed as ``superseded``. Settings come from the environment, since
policies are built with no arguments: ``FLEETPLAN_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) and ``FLEETPLAN_VIRTUAL_PREFIX`` (the
connector's ``--virtual-prefix``); the deployment is the simulation's
``--deployment``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Mapping

from fleetplan.connectors.virtual import DEFAULT_PREFIX
from fleetplan.schemas.events import Decision
from fleetplan.sim.policy import PolicyContext, PolicyView

log = logging.getLogger(__name__)


class FollowDecisions:
    """Scale to the live planner's decisions; complete each when the fleet reaches it."""

    interval_s = 1.0

    def __init__(self, redis_url: str | None = None, prefix: str | None = None) -> None:
        self.redis_url = redis_url or os.environ.get("FLEETPLAN_REDIS_URL", "redis://127.0.0.1:6379/0")
        self.prefix = prefix or os.environ.get("FLEETPLAN_VIRTUAL_PREFIX", DEFAULT_PREFIX)
        self.deployment = ""
        self.completed: list[tuple[int, str]] = []  # (decision_id, status), in order sent
        self._inbox: queue.Queue[Decision] = queue.Queue()
        self._pending: Decision | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None

    def bind(self, context: PolicyContext) -> None:
        self.deployment = context.deployment
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="follow-decisions", daemon=True).start()
        if not ready.wait(10.0):
            raise RuntimeError(f"no orchestrator client for {self.redis_url} after 10 s")

    def decide(self, view: PolicyView) -> Mapping[str, int] | None:
        newest = None
        while True:
            try:
                newest = self._inbox.get_nowait()
            except queue.Empty:
                break
        if newest is not None:
            if self._pending is not None and self._pending.decision_id < newest.decision_id:
                self._complete(self._pending, "superseded", view.ready)
            self._pending = newest
            log.info("%s: scaling to decision %d %s", self.deployment, newest.decision_id, newest.targets)
            return {r: n for r, n in newest.targets.items() if r in view.ready}
        pending = self._pending
        if pending is not None and all(view.ready.get(r, 0) == n for r, n in pending.targets.items()):
            self._complete(pending, "applied", view.ready)
            self._pending = None
        return None

    # --- the client's thread -------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        asyncio.run(self._follow(ready))

    async def _follow(self, ready: threading.Event) -> None:
        from fleetplan.connectors.client import RedisOrchestratorClient

        self._loop = asyncio.get_running_loop()
        self._client = RedisOrchestratorClient(self.redis_url, prefix=self.prefix, poll_s=0.2)
        ready.set()
        try:
            async for decision in self._client.decisions(self.deployment):
                self._inbox.put(decision)
        finally:
            await self._client.stop()

    def _complete(self, decision: Decision, status: str, observed: Mapping[str, int]) -> None:
        self.completed.append((decision.decision_id, status))
        seen = {r: int(observed.get(r, 0)) for r in decision.targets}
        future = asyncio.run_coroutine_threadsafe(
            self._client.complete(decision, status, observed=seen), self._loop)
        future.add_done_callback(lambda f: f.exception() and log.error(
            "%s: completing decision %d failed: %s", self.deployment, decision.decision_id, f.exception()))
