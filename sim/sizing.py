"""Hindsight sizing: how many engines each window of a workload needs.

The baselines need a replica count per window. They use the planner's own
capacity search (:mod:`fleetplan.models.perf.capacity`: the best batch an
engine can run within the SLA, and the rate that gives), but evaluated on
the *simulated engine's* pass times rather than on the planner's fitted
model, and on the traffic that actually arrived in the window rather than a
forecast: hindsight and the true engine are what make it an oracle. The
capacity search assumes a steady stream, so the count it gives is a lower
bound that the oracle then raises where the replay shows misses
(:mod:`fleetplan.sim.baselines`). The oracle starts lower still, from the
engine's peak throughput at any latency, so its search can only meet the
fewest engines that work from below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetplan.models.perf import (
    EngineLimits,
    agg_capacity,
    decode_capacity,
    decode_context_length,
    prefill_capacity,
)
from fleetplan.sim.timing import EngineTiming
from fleetplan.sim.workload import Workload


@dataclass(frozen=True)
class WindowTraffic:
    t: float
    num_req: int
    isl: float
    osl: float
    duration_s: float  # the window's length; the last one is shorter when the workload ends inside it


def window_traffic(workload: Workload, window_s: float) -> list[WindowTraffic]:
    """Arrivals per window of ``window_s`` over the workload's duration.

    The last window ends with the workload, so its rate is its arrivals over
    the time it covers: read as a full window, a 46-s tail would look like
    three quarters of its real rate and be sized short.
    """
    n = max(1, math.ceil(workload.duration_s / window_s))
    count = np.zeros(n, dtype=np.int64)
    isl = np.zeros(n)
    osl = np.zeros(n)
    for r in workload.requests():
        j = min(int(r.arrival_s // window_s), n - 1)
        count[j] += 1
        isl[j] += r.input_tokens
        osl[j] += r.output_tokens
    return [
        WindowTraffic(j * window_s, int(count[j]), isl[j] / count[j] if count[j] else 0.0,
                      osl[j] / count[j] if count[j] else 0.0, _covered(workload.duration_s, j, window_s))
        for j in range(n)
    ]


def _covered(duration_s: float, j: int, window_s: float) -> float:
    """Seconds of window ``j`` inside the workload (a full window when the
    workload has no length, or a request arrives after it ends)."""
    covered = min(window_s, duration_s - j * window_s)
    return covered if covered > 0 else window_s


class _PassTimes:
    """The simulated engine's pass times in the shape the capacity search asks for."""

    def __init__(self, fn) -> None:
        self._fn = fn

    def predict_many(self, *columns):
        arrays = np.broadcast_arrays(*(np.asarray(c, dtype=np.float64) for c in columns))
        return np.array([self._fn(*row) for row in zip(*(a.tolist() for a in arrays), strict=True)])


class EngineCapacity:
    """Requests per second one simulated engine of a role sustains within the SLA.

    With ``ttft_ms = itl_ms = None`` it is the engine's peak throughput at any
    latency: no policy can serve more per engine, so counts sized with it are
    a lower bound (where the oracle starts its search).
    """

    def __init__(
        self, timing: EngineTiming, limits: EngineLimits, ttft_ms: float | None, itl_ms: float | None,
    ) -> None:
        self.timing = timing
        self.limits = limits
        self.ttft_ms = ttft_ms
        self.itl_ms = itl_ms
        self._cache: dict[tuple, float] = {}

    def rps(self, role: str, isl: float, osl: float) -> float:
        isl_i = max(1, int(round(isl)))
        osl_i = max(1, int(round(osl)))
        key = (role, isl_i, osl_i)
        if key not in self._cache:
            self._cache[key] = self._compute(role, isl_i, osl_i)
        return self._cache[key]

    def _compute(self, role: str, isl: int, osl: int) -> float:
        t = self.timing
        if role == "prefill":
            cap = prefill_capacity(_PassTimes(t.prefill_s), self.limits, isl, self.ttft_ms, None)
        elif role == "decode":
            cap = decode_capacity(
                _PassTimes(lambda b, kv: t.decode_s(int(round(b)), kv)), self.limits, isl, osl,
                self.itl_ms, None,
            )
        else:
            ctx = decode_context_length(isl, osl)
            fit = _PassTimes(lambda p, kv: t.mixed_s(p, max(1, int(round(kv / ctx))), kv))
            cap = agg_capacity(fit, self.limits, isl, osl, self.ttft_ms, self.itl_ms, None, None)
        return cap.rps if cap is not None and cap.rps > 0 else math.inf

    def need(self, role: str, traffic: WindowTraffic, minimum: int) -> int:
        if traffic.num_req == 0:
            return minimum
        rps = traffic.num_req / traffic.duration_s
        return max(minimum, math.ceil(rps / self.rps(role, traffic.isl, traffic.osl) - 1e-9))


def window_needs(
    traffic: list[WindowTraffic], capacity: EngineCapacity, roles: tuple[str, ...], minimums: dict[str, int],
) -> list[dict[str, int]]:
    return [{r: capacity.need(r, w, minimums[r]) for r in roles} for w in traffic]
