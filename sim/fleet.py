"""The simulated fleet: engines of each role, their lifecycle, routing and KV transfer.

Lifecycle, as an orchestrator runs it: a worker is **starting** from the
moment it is asked for (its GPUs are allocated, and billed, from then on),
**ready** after its startup time, **draining** when asked to stop (no new
work is routed to it, everything it holds finishes: no request is ever
dropped) and **gone** once empty. A starting worker asked to stop is gone at
once. GPU-seconds run from start to gone, per engine.

Requests: a prompt goes to a ready prefill (or agg) engine; when no engine
of the role is ready it waits at the frontend and goes out as soon as one
is (that wait is part of its TTFT, as users see it). After prefill the KV
cache moves to a decode engine, taking ``isl · kv_bytes_per_token /
bandwidth``; the first token reaches the user when the KV has landed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from fleetplan.models.perf import EngineLimits
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.engines import Engine, SimRequest
from fleetplan.sim.metrics import no_replicas
from fleetplan.sim.router import Router
from fleetplan.sim.startup import StartupTime
from fleetplan.sim.timing import EngineTiming


@dataclass(frozen=True)
class KvTransfer:
    """Prefill→decode KV move: bytes per token over a link bandwidth (Dynamo's mocker: 64 GB/s)."""

    kv_bytes_per_token: int = 131_072
    bandwidth_bytes_per_s: float = 64e9

    def seconds(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s


class FleetListener:
    """What the fleet tells the run about (the runner turns it into events)."""

    def worker_changed(self, engine: Engine, state: str, decision_id: int | None) -> None:
        pass

    def request_finished(self, req: SimRequest) -> None:
        pass


class SimFleet:
    def __init__(
        self,
        clock: VirtualClock,
        mode: str,
        timing: EngineTiming,
        limits: EngineLimits,
        gpus: dict[str, int],
        router: Router,
        startup: StartupTime,
        transfer: KvTransfer,
        listener: FleetListener,
        prefix_block_tokens: int = 512,
        prefill_first: bool = False,
    ) -> None:
        if mode not in ("disagg", "agg"):
            raise ValueError(f"simulate supports mode disagg or agg, got {mode!r}")
        self.clock = clock
        self.mode = mode
        self.roles: tuple[str, ...] = ("prefill", "decode") if mode == "disagg" else ("agg",)
        self.entry_role = "prefill" if mode == "disagg" else "agg"
        self.timing = timing
        self.limits = limits
        self.gpus = gpus
        self.router = router
        self.startup = startup
        self.transfer = transfer
        self.listener = listener
        self.prefix_block_tokens = prefix_block_tokens
        self.prefill_first = prefill_first
        self.engines: list[Engine] = []  # every engine ever, in start order
        self.ready: dict[str, list[Engine]] = {r: [] for r in self.roles}
        self.frontend: dict[str, deque[SimRequest]] = {r: deque() for r in self.roles}
        self._next_id: dict[str, int] = {r: 0 for r in self.roles}
        self.in_flight = 0

    # -- counts -------------------------------------------------------------------

    def live(self, role: str) -> list[Engine]:
        """Engines of ``role`` not gone, in start order."""
        return [e for e in self.engines if e.role == role and e.state != "gone"]

    def count(self, role: str, state: str) -> int:
        return sum(1 for e in self.engines if e.role == role and e.state == state)

    def counts(self) -> dict[str, dict[str, int]]:
        out = no_replicas(self.roles)
        for e in self.engines:
            if e.state != "gone":
                out[e.role][e.state] += 1
        return out

    def gpus_in_use(self) -> int:
        return sum(e.gpus for e in self.engines if e.state != "gone")

    # -- lifecycle ------------------------------------------------------------------

    def _new_engine(self, role: str) -> Engine:
        n = self._next_id[role]
        self._next_id[role] = n + 1
        engine = Engine(
            f"{role}-{n}", role, self.gpus[role], self.timing, self.limits, self.clock, self,
            self.clock.now, self.prefix_block_tokens, self.prefill_first,
        )
        self.engines.append(engine)
        return engine

    def add_ready(self, role: str) -> Engine:
        """A worker that is already up (the initial fleet)."""
        engine = self._new_engine(role)
        self._become_ready(engine, None)
        return engine

    def start(self, role: str, decision_id: int | None) -> tuple[Engine, float]:
        """Ask for a new worker; returns it and when it will be ready."""
        engine = self._new_engine(role)
        self.listener.worker_changed(engine, "starting", decision_id)
        delay = self.startup.sample()
        self.clock.after(delay, self._ready_if_starting, engine, decision_id)
        return engine, self.clock.now + delay

    def _ready_if_starting(self, engine: Engine, decision_id: int | None) -> None:
        if engine.state == "starting":
            self._become_ready(engine, decision_id)

    def _become_ready(self, engine: Engine, decision_id: int | None) -> None:
        engine.state = "ready"
        self.ready[engine.role].append(engine)
        self.listener.worker_changed(engine, "ready", decision_id)
        waiting = self.frontend[engine.role]
        # the ready event may have run a planner tick that stopped the role's last engine: the
        # queue then waits for the next one (dispatched, each request came straight back to it)
        while waiting and self.ready[engine.role]:
            self._dispatch(engine.role, waiting.popleft())

    def stop(self, engine: Engine, decision_id: int | None) -> None:
        """Scale one worker down: cancel it if starting, else drain it."""
        if engine.state == "starting":
            self._gone(engine, decision_id)
            return
        if engine.state != "ready":
            return
        self.ready[engine.role].remove(engine)
        engine.state = "draining"
        self.listener.worker_changed(engine, "draining", decision_id)
        if engine.idle:
            self._gone(engine, decision_id)

    def engine_drained(self, engine: Engine) -> None:
        """Called by a draining engine once it holds nothing."""
        if engine.state == "draining":
            self._gone(engine, None)

    def _gone(self, engine: Engine, decision_id: int | None) -> None:
        engine.state = "gone"
        engine.stopped = self.clock.now
        self.listener.worker_changed(engine, "gone", decision_id)

    def gpu_seconds(self, until: float) -> float:
        total = 0.0
        for e in self.engines:
            end = e.stopped if e.stopped is not None else until
            total += max(0.0, end - e.started) * e.gpus
        return total

    # -- requests -----------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        """A new request arrives at the frontend."""
        self.in_flight += 1
        self._dispatch(self.entry_role, req)

    def _dispatch(self, role: str, req: SimRequest) -> None:
        engines = self.ready[role]
        if not engines:
            self.frontend[role].append(req)
            return
        engine = self.router.pick(role, engines, req)
        if role == "decode":
            engine.inbound += 1
            engine.inbound_context += req.isl + req.osl
            self.clock.after(self.transfer.seconds(req.isl), self._kv_landed, engine, req)
        else:
            engine.enqueue(req)

    def prompt_done(self, req: SimRequest, engine: Engine, now: float) -> None:
        """A prefill engine finished a prompt: move its KV to decode."""
        if req.osl <= 1:
            # Nothing to decode: the one token goes out after the same hop.
            self.clock.after(self.transfer.seconds(req.isl), self._single_token_done, req)
            return
        self._dispatch("decode", req)

    def _kv_landed(self, engine: Engine, req: SimRequest) -> None:
        req.first_token = self.clock.now
        engine.inbound -= 1
        engine.inbound_context -= req.isl + req.osl
        engine.enqueue(req)

    def _single_token_done(self, req: SimRequest) -> None:
        req.first_token = self.clock.now
        self.request_finished(req, None, self.clock.now)

    def request_finished(self, req: SimRequest, engine: Engine | None, now: float) -> None:
        req.end = now
        self.in_flight -= 1
        self.listener.request_finished(req)
