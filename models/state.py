"""Everything the planner remembers about one deployment, as plain data.

The state is what Faust keeps in changelog-backed tables and what a
snapshot holds, so it round-trips exactly: ``from_data(to_data(s))``
behaves identically to ``s`` for every later event and tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetplan.models.config import PlannerConfig
from fleetplan.models.forecast import TrafficForecaster, TrafficObservation
from fleetplan.models.perf_models import perf_model_from_state
from fleetplan.schemas.codec import decode_dict, event_to_dict
from fleetplan.schemas.events import ForwardPassMetrics, Role


@dataclass
class Worker:
    role: Role
    state: str
    gpus: int
    since: float


@dataclass
class PendingDecision:
    """A decision sent to the connector and not yet acknowledged."""

    decision_id: int
    time: float
    targets: dict[Role, int]


def request_kv_hit_rate(req) -> float | None:
    """A request's prefix-cache hit rate: reported, else cached over input tokens."""
    kv = req.kv_hit_rate
    if kv is None and req.cached_tokens and req.input_tokens:
        kv = min(req.cached_tokens / req.input_tokens, 1.0)
    return kv


@dataclass
class TrafficWindow:
    """Finished requests since the last throughput tick (sums, so merging is exact)."""

    count: int = 0
    sum_isl: float = 0.0
    sum_osl: float = 0.0
    sum_kv_hit: float = 0.0
    n_kv_hit: int = 0
    sum_accept: float = 0.0
    n_accept: int = 0
    sum_ttft_ms: float = 0.0
    n_ttft: int = 0
    sum_itl_ms: float = 0.0
    n_itl: int = 0

    def observation(self, duration_s: float) -> TrafficObservation:
        n = self.count
        return TrafficObservation(
            duration_s=duration_s,
            num_req=float(n),
            isl=self.sum_isl / n if n else 0.0,
            osl=self.sum_osl / n if n else 0.0,
            kv_hit_rate=self.sum_kv_hit / self.n_kv_hit if self.n_kv_hit else None,
            accept_length=self.sum_accept / self.n_accept if self.n_accept else None,
        )


@dataclass
class DeploymentState:
    deployment: str
    config: PlannerConfig
    perf: dict[Role, object]
    forecaster: TrafficForecaster
    config_version: int = 0
    min_overrides: dict[Role, int] = field(default_factory=dict)
    advisory_override: bool | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    latest_fpm: dict[str, ForwardPassMetrics] = field(default_factory=dict)
    window: TrafficWindow = field(default_factory=TrafficWindow)
    window_start: float | None = None
    seen_traffic: bool = False
    last_kv_hit_rate: float | None = None
    last_accept_length: float | None = None
    lower_bound: dict[Role, int] = field(default_factory=dict)
    next_decision_id: int = 0
    pending: PendingDecision | None = None
    desired: dict[Role, int] | None = None
    advised: dict[Role, int] | None = None
    # event time
    buffer: list = field(default_factory=list)
    max_time: float | None = None
    next_tick: float | None = None
    last_tick: float | None = None
    late_events: int = 0

    @property
    def advisory(self) -> bool:
        if self.advisory_override is not None:
            return self.advisory_override
        return self.config.advisory

    def to_data(self) -> dict:
        return {
            "deployment": self.deployment,
            "config": self.config.model_dump(mode="json"),
            "perf": {r: m.to_state() for r, m in self.perf.items()},
            "forecaster": self.forecaster.to_state(),
            "config_version": self.config_version,
            "min_overrides": dict(self.min_overrides),
            "advisory_override": self.advisory_override,
            "workers": {
                w: [v.role, v.state, v.gpus, v.since] for w, v in self.workers.items()
            },
            "latest_fpm": {k: event_to_dict(f) for k, f in self.latest_fpm.items()},
            "window": self.window.__dict__.copy(),
            "window_start": self.window_start,
            "seen_traffic": self.seen_traffic,
            "last_kv_hit_rate": self.last_kv_hit_rate,
            "last_accept_length": self.last_accept_length,
            "lower_bound": dict(self.lower_bound),
            "next_decision_id": self.next_decision_id,
            "pending": None if self.pending is None else {
                "decision_id": self.pending.decision_id, "time": self.pending.time,
                "targets": dict(self.pending.targets),
            },
            "desired": None if self.desired is None else dict(self.desired),
            "advised": None if self.advised is None else dict(self.advised),
            "buffer": [event_to_dict(e) for e in self.buffer],
            "max_time": self.max_time,
            "next_tick": self.next_tick,
            "last_tick": self.last_tick,
            "late_events": self.late_events,
        }

    @classmethod
    def from_data(cls, data: dict) -> DeploymentState:
        pending = data["pending"]
        return cls(
            deployment=data["deployment"],
            config=PlannerConfig.model_validate(data["config"]),
            perf={r: perf_model_from_state(s) for r, s in data["perf"].items()},
            forecaster=TrafficForecaster.from_state(data["forecaster"]),
            config_version=data["config_version"],
            min_overrides=dict(data["min_overrides"]),
            advisory_override=data["advisory_override"],
            workers={w: Worker(*v) for w, v in data["workers"].items()},
            latest_fpm={k: decode_dict(v) for k, v in data["latest_fpm"].items()},
            window=TrafficWindow(**data["window"]),
            window_start=data["window_start"],
            seen_traffic=data["seen_traffic"],
            last_kv_hit_rate=data["last_kv_hit_rate"],
            last_accept_length=data["last_accept_length"],
            lower_bound=dict(data["lower_bound"]),
            next_decision_id=data["next_decision_id"],
            pending=None if pending is None else PendingDecision(
                pending["decision_id"], pending["time"], dict(pending["targets"])
            ),
            desired=None if data["desired"] is None else dict(data["desired"]),
            advised=None if data["advised"] is None else dict(data["advised"]),
            buffer=[decode_dict(e) for e in data["buffer"]],
            max_time=data["max_time"],
            next_tick=data["next_tick"],
            last_tick=data["last_tick"],
            late_events=data["late_events"],
        )
