"""Everything the planner remembers about one deployment, as plain data.

The state is what Faust keeps in changelog-backed tables and what a
snapshot holds, so it round-trips exactly: ``from_data(to_data(s))``
behaves identically to ``s`` for every later event and tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetplan.models.config import PlannerConfig
from fleetplan.models.forecast import TrafficObservation
from fleetplan.models.mix import LengthMix
from fleetplan.models.perf_models import perf_model_from_state
from fleetplan.models.quantiles import QuantileForecaster
from fleetplan.schemas.codec import decode_dict, event_to_dict
from fleetplan.schemas.events import ForwardPassMetrics, Role


@dataclass
class Worker:
    role: Role
    state: str
    gpus: int
    since: float
    # known only from its FPMs (no inventory event named it): forgotten when they stop
    discovered: bool = False


@dataclass
class PendingDecision:
    """A decision sent to the connector and not yet acknowledged."""

    decision_id: int
    time: float
    targets: dict[Role, int]

    def to_data(self) -> dict:
        return {"decision_id": self.decision_id, "time": self.time, "targets": dict(self.targets)}

    @classmethod
    def from_data(cls, data: dict | None) -> PendingDecision | None:
        return None if data is None else cls(data["decision_id"], data["time"], dict(data["targets"]))


def request_kv_hit_rate(req) -> float | None:
    """A request's prefix-cache hit rate: reported, else cached over input tokens."""
    kv = req.kv_hit_rate
    if kv is None and req.cached_tokens and req.input_tokens:
        kv = min(req.cached_tokens / req.input_tokens, 1.0)
    return kv


def add_finished_sums(sums, req) -> None:
    """Add one finished request to the sums every window of them keeps.

    The count, ISL, OSL, prefix-cache hits and accepted draft tokens: the
    core's ``TrafficWindow`` keeps more, the stream's mirror of it
    (``streams.tables.TrafficSums``) just these, and the mirror checks that
    the same requests landed in the same window, so both add them here.
    """
    sums.count += 1
    sums.sum_isl += req.input_tokens
    sums.sum_osl += req.output_tokens
    kv = request_kv_hit_rate(req)
    if kv is not None:
        sums.sum_kv_hit += kv
        sums.n_kv_hit += 1
    if req.accept_length is not None:
        sums.sum_accept += req.accept_length
        sums.n_accept += 1


CURVE_SCALES = (1, 2, 4, 8, 16)  # seconds: the time scales of the arrivals' dispersion curve
CURVE_MIN_BINS = 8  # whole bins a scale needs in the window to be measured


def _index_of_dispersion(total: float, square_sum: float, bins: int) -> float:
    """Variance over mean of ``bins`` counts, from their sum and their sum of squares."""
    mean = total / bins
    return max(square_sum / bins - mean * mean, 0.0) / mean


def count_subwindow(counts: dict[str, int], time: float, width_s: int) -> None:
    """Count one request in its ``width_s`` sub-window (key ``floor(time / width_s)``; 0: not counted)."""
    if width_s:
        key = str(math.floor(time / width_s))
        counts[key] = counts.get(key, 0) + 1


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
    arrivals: int = 0
    sum_arrival_isl: float = 0.0
    # requests per burst sub-window (key: floor(time / burst_window_seconds))
    burst_arrivals: dict[str, int] = field(default_factory=dict)
    burst_finished: dict[str, int] = field(default_factory=dict)
    # arrivals per whole second (key: floor(time)), for the arrival process's burstiness
    second_arrivals: dict[str, int] = field(default_factory=dict)
    mix: dict[str, list[float]] = field(default_factory=dict)  # LengthMix buckets
    # the burst sub-window the counts above are of: the one in force at the window's first count
    burst_s: int | None = None

    def burst_width(self, configured: int) -> int:
        """The burst sub-window this window counts in: ``configured`` when it first counts, then that.

        A ``set_config`` can change the width (``burst_window_seconds``, or a throughput
        interval shorter than it) while the window is open. Its counts so far are of the old
        width, and read as counts of the new one a steady 10 req/s counted by the minute
        peaked at 30 req/s on 20-s sub-windows; the new width counts from the next window on.
        """
        if self.burst_s is None:
            self.burst_s = configured
        return self.burst_s

    def add_arrival(self, time: float, input_tokens: float, burst_s: int) -> None:
        """One request's arrival: the demand count, its prompt, and its burst and one-second sub-windows."""
        self.arrivals += 1
        self.sum_arrival_isl += input_tokens
        count_subwindow(self.burst_arrivals, time, self.burst_width(burst_s))
        count_subwindow(self.second_arrivals, time, 1)

    def peak_count(self, interval_s: float, burst_s: int, *, by_arrival: bool) -> float | None:
        """The busiest burst sub-window's requests, scaled to a whole window's count.

        The throughput loop's quantile sizes for this peak rate rather than
        the window's mean: a minute of twice the traffic inside a 3-minute
        window queues prompts for the rest of it. None without sub-windows.
        ``burst_s`` is the width in force; the counts are of their own (:meth:`burst_width`).
        """
        counts = self.burst_arrivals if by_arrival else self.burst_finished
        if not burst_s or not counts:
            return None
        return max(counts.values()) * interval_s / self.burst_width(burst_s)

    def whole_seconds(self, start_s: float, duration_s: float) -> list[int]:
        """Arrivals in each whole second of the window ``[start_s, start_s + duration_s)``, empty ones too.

        The first window runs from the first request, inside a second: that
        second lies mostly before the window, and counted as one of its bins
        its few arrivals read as a burst (the compose demo's first window, 30 s
        from 149.81, had a 1-s dispersion of 3.57 where its whole seconds give
        1.52). A tick ends every window, on a whole second.
        """
        first = math.ceil(start_s)
        # float noise in start + duration must not drop the last second
        seconds = max(math.floor(start_s + duration_s + 1e-9) - first, 0)
        per_second = [0] * seconds
        for key, n in self.second_arrivals.items():
            j = int(key) - first
            if 0 <= j < seconds:
                per_second[j] += n
        return per_second

    def arrival_dispersion(self, start_s: float, duration_s: float) -> float | None:
        """Index of dispersion of arrivals per second (variance / mean of the counts).

        1 for Poisson arrivals; bursty traffic (requests that come in
        clusters, as Azure's code trace does) runs far above it, and queues
        longer than a Poisson queueing model says. None with too few
        arrivals (under 30) or under two seconds to tell. Over the window's
        whole seconds (:meth:`whole_seconds`).
        """
        per_second = self.whole_seconds(start_s, duration_s)
        total = sum(per_second)
        if len(per_second) < 2 or total < 30:
            return None
        return _index_of_dispersion(total, sum(c * c for c in per_second), len(per_second))

    def dispersion_curve(self, start_s: float, duration_s: float) -> list[list[float]] | None:
        """The index of dispersion of arrivals at several time scales: ``[[tau, I(tau)], ...]``.

        ``I(tau)`` is the variance over the mean of the arrival counts in
        consecutive ``tau``-second bins from ``start_s`` (the variance-time
        curve divided by the mean). It is flat for Poisson arrivals (1) and
        for clusters that come and go within a second; it grows with tau when
        bursts last longer, as Azure's code trace's do (10 at 1 s, 26-62 at
        5 s), and those are the bursts a queue cannot absorb. Scales from 1 s
        to 16 s, each with at least ``CURVE_MIN_BINS`` whole bins in the
        window (its whole seconds: :meth:`whole_seconds`); None when the 1-s
        point cannot be told (under 30 arrivals or two seconds).
        """
        per_second = self.whole_seconds(start_s, duration_s)
        total_seconds = len(per_second)
        if total_seconds < 2 or sum(per_second) < 30:
            return None
        curve = []
        for tau in CURVE_SCALES:
            bins = total_seconds // tau
            if tau > 1 and bins < CURVE_MIN_BINS:
                break
            counts = [sum(per_second[j * tau:(j + 1) * tau]) for j in range(bins)]
            total = sum(counts)
            if total <= 0:
                break
            curve.append([float(tau), _index_of_dispersion(total, sum(c * c for c in counts), bins)])
        return curve or None

    def to_data(self) -> dict:
        """Plain data, its dicts and lists copied (the live window keeps changing)."""
        return {
            **self.__dict__, "mix": {k: list(v) for k, v in self.mix.items()},
            "burst_arrivals": dict(self.burst_arrivals), "burst_finished": dict(self.burst_finished),
            "second_arrivals": dict(self.second_arrivals),
        }

    @classmethod
    def from_data(cls, data: dict) -> TrafficWindow:
        return cls(**{
            **data, "mix": {k: list(v) for k, v in data["mix"].items()},
            "burst_arrivals": dict(data["burst_arrivals"]), "burst_finished": dict(data["burst_finished"]),
            "second_arrivals": dict(data.get("second_arrivals", {})),  # absent in older state
        })

    @property
    def length_mix(self) -> LengthMix:
        """The window's (ISL, OSL) buckets; a view that writes through to ``mix``."""
        return LengthMix(self.mix)

    def observation(
        self, duration_s: float, *, by_arrival: bool = False, last_osl: float | None = None,
    ) -> TrafficObservation:
        """The window as the forecaster sees it.

        ``by_arrival`` counts demand (and its mean ISL) from arrival events;
        the mean OSL is known only from finished requests, so a window where
        nothing finished carries ``last_osl`` over.
        """
        n = self.count
        isl = self.sum_isl / n if n else 0.0
        osl = self.sum_osl / n if n else 0.0
        if by_arrival:
            a = self.arrivals
            isl = self.sum_arrival_isl / a if a else 0.0
            if not n and last_osl is not None:
                osl = last_osl
            n = a
        return TrafficObservation(
            duration_s=duration_s,
            num_req=float(n),
            isl=isl,
            osl=osl,
            kv_hit_rate=self.sum_kv_hit / self.n_kv_hit if self.n_kv_hit else None,
            accept_length=self.sum_accept / self.n_accept if self.n_accept else None,
        )


@dataclass
class DeploymentState:
    deployment: str
    config: PlannerConfig
    perf: dict[Role, object]
    forecaster: QuantileForecaster
    config_version: int = 0
    min_overrides: dict[Role, int] = field(default_factory=dict)
    advisory_override: bool | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    latest_fpm: dict[str, ForwardPassMetrics] = field(default_factory=dict)
    window: TrafficWindow = field(default_factory=TrafficWindow)
    window_start: float | None = None
    seen_traffic: bool = False
    seen_arrivals: bool = False
    first_traffic: float | None = None  # when the deployment's first request arrived
    last_kv_hit_rate: float | None = None
    last_accept_length: float | None = None
    lower_bound: dict[Role, int] = field(default_factory=dict)
    # per role, when its current unbroken run of load-loop scale-down verdicts began
    down_since: dict[Role, float] = field(default_factory=dict)
    # without the throughput loop: per closed window, oldest first, the engines its traffic needed
    measured_floors: list[dict[Role, int]] = field(default_factory=list)
    next_decision_id: int = 0
    pending: PendingDecision | None = None
    # the last decision the ack timeout gave up on: its late ``applied`` ack still says where the fleet is
    timed_out: PendingDecision | None = None
    desired: dict[Role, int] | None = None
    advised: dict[Role, int] | None = None
    # sizing past the reference: the last window's mix correction, startups seen
    mix_factor: dict[Role, float] = field(default_factory=dict)
    scale_up_times: list[list[float]] = field(default_factory=list)  # [decision_id, time]
    startup_samples: list[float] = field(default_factory=list)
    inventory_seen: bool = False  # whether an orchestrator writes inventory (else acks time startups)
    gone_workers: dict[str, float] = field(default_factory=dict)  # inventory's gone engines: when (apply.py)
    arrival_dispersion: float = 1.0  # the last window's (Poisson until measured)
    dispersion_curve: list[list[float]] = field(default_factory=list)  # the last window's [[tau, I]]
    # event time
    buffer: list = field(default_factory=list)
    max_time: float | None = None
    next_tick: float | None = None
    last_tick: float | None = None
    late_events: int = 0
    # the windows the forecaster was fed, last predictor_history_windows of them:
    # [start_s, duration_s, num_req, isl, osl, kv_hit_rate, accept_length, peak] (models/predictor_swap.py)
    traffic_history: list[list] = field(default_factory=list)
    rejected_controls: int = 0  # control events (set_config, reset_perf, set_min_endpoints, seed_traffic) refused when their tick applied them
    last_input: float | None = None  # time of the latest event applied (models/sequencer.py skips long silences)
    silent_ticks_skipped: int = 0  # ticks of such silences not fired

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
                w: [v.role, v.state, v.gpus, v.since, *([True] if v.discovered else [])]
                for w, v in self.workers.items()
            },
            "latest_fpm": {k: event_to_dict(f) for k, f in self.latest_fpm.items()},
            "window": self.window.to_data(),
            "window_start": self.window_start,
            "seen_traffic": self.seen_traffic,
            "seen_arrivals": self.seen_arrivals,
            "first_traffic": self.first_traffic,
            "last_kv_hit_rate": self.last_kv_hit_rate,
            "last_accept_length": self.last_accept_length,
            "lower_bound": dict(self.lower_bound),
            "down_since": dict(self.down_since),
            "measured_floors": [dict(f) for f in self.measured_floors],
            "next_decision_id": self.next_decision_id,
            "pending": None if self.pending is None else self.pending.to_data(),
            "timed_out": None if self.timed_out is None else self.timed_out.to_data(),
            "desired": None if self.desired is None else dict(self.desired),
            "advised": None if self.advised is None else dict(self.advised),
            "mix_factor": dict(self.mix_factor),
            "scale_up_times": [list(p) for p in self.scale_up_times],
            "startup_samples": list(self.startup_samples),
            "inventory_seen": self.inventory_seen,
            "gone_workers": dict(self.gone_workers),
            "arrival_dispersion": self.arrival_dispersion,
            "dispersion_curve": [list(p) for p in self.dispersion_curve],
            "buffer": [event_to_dict(e) for e in self.buffer],
            "max_time": self.max_time,
            "next_tick": self.next_tick,
            "last_tick": self.last_tick,
            "late_events": self.late_events,
            "traffic_history": [list(w) for w in self.traffic_history],
            "rejected_controls": self.rejected_controls,
            "last_input": self.last_input,
            "silent_ticks_skipped": self.silent_ticks_skipped,
        }

    @classmethod
    def from_data(cls, data: dict) -> DeploymentState:
        return cls(
            deployment=data["deployment"],
            config=PlannerConfig.model_validate(data["config"]),
            perf={r: perf_model_from_state(s) for r, s in data["perf"].items()},
            forecaster=QuantileForecaster.from_state(data["forecaster"]),
            config_version=data["config_version"],
            min_overrides=dict(data["min_overrides"]),
            advisory_override=data["advisory_override"],
            workers={w: Worker(*v) for w, v in data["workers"].items()},
            latest_fpm={k: decode_dict(v) for k, v in data["latest_fpm"].items()},
            window=TrafficWindow.from_data(data["window"]),
            window_start=data["window_start"],
            seen_traffic=data["seen_traffic"],
            seen_arrivals=data["seen_arrivals"],
            # fields added after state was first written default when absent, so a worker
            # upgraded in place restores the changelog an older one wrote
            first_traffic=data.get("first_traffic"),
            last_kv_hit_rate=data["last_kv_hit_rate"],
            last_accept_length=data["last_accept_length"],
            lower_bound=dict(data["lower_bound"]),
            down_since=dict(data.get("down_since", {})),
            measured_floors=[dict(f) for f in data.get("measured_floors", [])],
            next_decision_id=data["next_decision_id"],
            pending=PendingDecision.from_data(data["pending"]),
            timed_out=PendingDecision.from_data(data.get("timed_out")),  # absent in older state
            desired=None if data["desired"] is None else dict(data["desired"]),
            advised=None if data["advised"] is None else dict(data["advised"]),
            mix_factor=dict(data["mix_factor"]),
            scale_up_times=[list(p) for p in data["scale_up_times"]],
            startup_samples=list(data["startup_samples"]),
            inventory_seen=data.get("inventory_seen", False),
            gone_workers={str(k): float(v) for k, v in data.get("gone_workers", {}).items()},
            arrival_dispersion=data.get("arrival_dispersion", 1.0),
            dispersion_curve=[list(p) for p in data.get("dispersion_curve", [])],
            buffer=[decode_dict(e) for e in data["buffer"]],
            max_time=data["max_time"],
            next_tick=data["next_tick"],
            last_tick=data["last_tick"],
            late_events=data["late_events"],
            traffic_history=[list(w) for w in data.get("traffic_history", [])],
            rejected_controls=data.get("rejected_controls", 0),
            last_input=data.get("last_input"),
            silent_ticks_skipped=data.get("silent_ticks_skipped", 0),
        )
