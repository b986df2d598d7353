"""The simulated connector: applies targets to the fleet and acknowledges them.

It plays the orchestrator's part, as a Kubernetes or virtual connector
would: for each role it starts workers up to the target or removes workers
down to it, and acks the decision ``applied`` once every worker it started
is ready (at once when it started none). Removal cancels workers still
starting first (newest first: they have done no work), then drains the
ready workers holding the least work (newest first on ties); draining
workers finish what they hold, so nothing is dropped. A new decision that
arrives while the previous one waits for its workers supersedes it (the
previous one is acked ``superseded``); the planner itself never does that,
it waits for the ack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fleetplan.sim.engines import Engine
from fleetplan.sim.fleet import SimFleet


class SimConnector:
    def __init__(self, fleet: SimFleet, on_ack: Callable[[int, str, dict[str, int]], None]) -> None:
        self.fleet = fleet
        self.on_ack = on_ack
        self._pending_id: int | None = None
        self._pending_workers: set[str] = set()
        self.applied = 0

    def apply(self, decision_id: int, targets: Mapping[str, int]) -> None:
        fleet = self.fleet
        if self._pending_id is not None:
            self._ack(self._pending_id, "superseded")
        started: set[str] = set()
        for role in fleet.roles:
            target = targets.get(role)
            if target is None:
                continue
            live = [e for e in fleet.live(role) if e.state in ("starting", "ready")]
            if target > len(live):
                for _ in range(target - len(live)):
                    engine, _ = fleet.start(role, decision_id)
                    started.add(engine.worker_id)
            elif target < len(live):
                for engine in _removal_order(live)[: len(live) - target]:
                    fleet.stop(engine, decision_id)
        self.applied += 1
        if started:
            self._pending_id = decision_id
            self._pending_workers = started
        else:
            self._ack(decision_id, "applied")

    def worker_ready(self, engine: Engine) -> None:
        if self._pending_id is None or engine.worker_id not in self._pending_workers:
            return
        self._pending_workers.discard(engine.worker_id)
        if not self._pending_workers:
            self._ack(self._pending_id, "applied")

    def observed(self) -> dict[str, int]:
        return {
            role: sum(1 for e in self.fleet.live(role) if e.state in ("starting", "ready"))
            for role in self.fleet.roles
        }

    def _ack(self, decision_id: int, status: str) -> None:
        if decision_id == self._pending_id:
            self._pending_id = None
            self._pending_workers = set()
        self.on_ack(decision_id, status, self.observed())


def _removal_order(live: list[Engine]) -> list[Engine]:
    starting = [e for e in reversed(live) if e.state == "starting"]
    ready = [e for e in live if e.state == "ready"]
    # least held work first; among equals the newest (list is in start order)
    order = sorted(range(len(ready)), key=lambda i: (ready[i].outstanding, -i))
    return starting + [ready[i] for i in order]
