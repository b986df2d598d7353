"""Helpers shared by the simulator tests (imported as a module; fixtures live in conftest)."""

from __future__ import annotations

import sys
from pathlib import Path

from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.engines import Engine, SimRequest
from fleetplan.sim.traces import TraceRequest
from fleetplan.sim.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
CONV = ROOT / "examples" / "traces" / "azure_conv_10min.csv"
CODE = ROOT / "examples" / "traces" / "azure_code_10min.csv"
DATA = Path(__file__).resolve().parent / "data"


class Recorder:
    """Stands in for the fleet: records what an engine hands back."""

    def __init__(self) -> None:
        self.finished: list[tuple[SimRequest, float]] = []
        self.prompts: list[tuple[SimRequest, float]] = []
        self.drained: list[Engine] = []

    def request_finished(self, req, engine, now):
        req.end = now
        self.finished.append((req, now))

    def prompt_done(self, req, engine, now):
        self.prompts.append((req, now))

    def engine_drained(self, engine):
        self.drained.append(engine)


class InlinePool:
    """Stands in for a ProcessPoolExecutor in the bench scripts' tests: a subclass's ``map`` says
    what the runs give back, and no process is started."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


def sizing_tasks(monkeypatch, *argv: str, choose=None) -> list[tuple]:
    """The (spec, sla, variant) runs bench/sizing.py would make with ``argv`` (none is made);
    ``choose`` stands in for its choose_scale, which would read the trace."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import sizing
    finally:
        sys.path.remove(str(ROOT / "bench"))
    tasks = []

    class Pool(InlinePool):
        def map(self, fn, work):
            tasks.extend(work)
            return []

    if choose is not None:
        monkeypatch.setattr(sizing, "choose_scale", choose)
    monkeypatch.setattr(sizing, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(sys, "argv", ["sizing.py", "--data", "/nonexistent", *argv])
    sizing.main()
    return tasks


def run_all(clock: VirtualClock) -> None:
    while clock.step():
        pass



def synthetic(rps: float, seconds: float, isl: int = 1000, osl: int = 100, seed_offset: float = 0.0) -> Workload:
    """Evenly spaced requests: a steady load that is easy to reason about."""
    n = int(rps * seconds)
    rows = [TraceRequest(seed_offset + i / rps, isl, osl) for i in range(n)]
    return Workload.from_requests("synthetic", rows, seconds)
