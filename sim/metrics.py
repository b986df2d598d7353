"""What a run is judged by: latency per request, SLA attainment, cost.

- **TTFT**: arrival at the frontend to first token at the user (frontend
  queueing, prefill queueing and compute, KV transfer).
- **ITL**: ``(end − first token) / (osl − 1)``, the mean gap between output
  tokens as the user sees it (decode queueing included); undefined for
  one-token answers, which meet any ITL target.
- **SLA attainment**: the share of requests meeting *both* targets.
- **Goodput**: output tokens of SLA-meeting requests per second of the run;
  **goodput per GPU** divides by the mean number of GPUs held.
- **GPU-hours**: every engine's GPUs from the moment it was asked for until
  it was gone (startup and draining are paid for).

Requests are kept in typed arrays (8 bytes a number), so a day of traffic
at tens of requests per second fits in memory.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from fleetplan.sim.engines import SimRequest


class RequestLog:
    """Per-request outcomes, appended as requests finish."""

    def __init__(self) -> None:
        self.arrival = array("d")
        self.ttft = array("d")
        self.itl = array("d")
        self.isl = array("q")
        self.osl = array("q")
        self.cached = array("q")
        self.end = array("d")

    def add(self, req: SimRequest) -> None:
        itl = (req.end - req.first_token) / (req.osl - 1) if req.osl > 1 else math.nan
        self.record(req.arrival, req.first_token - req.arrival, itl, req.isl, req.osl, req.cached, req.end)

    def record(self, arrival: float, ttft: float, itl: float, isl: int, osl: int, cached: int, end: float) -> None:
        """One finished request, in seconds (``itl`` NaN for a one-token answer)."""
        self.arrival.append(arrival)
        self.ttft.append(ttft)
        self.itl.append(itl)
        self.isl.append(isl)
        self.osl.append(osl)
        self.cached.append(cached)
        self.end.append(end)

    def __len__(self) -> int:
        return len(self.arrival)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "arrival": np.frombuffer(self.arrival, dtype=np.float64),
            "ttft": np.frombuffer(self.ttft, dtype=np.float64),
            "itl": np.frombuffer(self.itl, dtype=np.float64),
            "isl": np.frombuffer(self.isl, dtype=np.int64),
            "osl": np.frombuffer(self.osl, dtype=np.int64),
            "cached": np.frombuffer(self.cached, dtype=np.int64),
            "end": np.frombuffer(self.end, dtype=np.float64),
        }


def sla_met(ttft_s: np.ndarray, itl_s: np.ndarray, ttft_ms: float, itl_ms: float) -> np.ndarray:
    """Boolean per request: both targets met (a NaN ITL, one token, meets any)."""
    ok_itl = np.isnan(itl_s) | (itl_s * 1000.0 <= itl_ms)
    return (ttft_s * 1000.0 <= ttft_ms) & ok_itl


@dataclass(frozen=True)
class Summary:
    policy: str
    requests: int
    duration_s: float
    sla_attainment: float
    ttft_attainment: float
    itl_attainment: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    goodput_tps: float
    goodput_per_gpu_tps: float
    gpu_hours: float
    mean_gpus: float
    peak_replicas: dict
    mean_replicas: dict
    decisions: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(
    policy: str, log: RequestLog, ttft_ms: float, itl_ms: float, duration_s: float,
    gpu_seconds: float, peak_replicas: dict, mean_replicas: dict, decisions: int,
) -> Summary:
    a = log.arrays()
    n = len(log)
    ttft, itl, osl = a["ttft"], a["itl"], a["osl"]
    met = sla_met(ttft, itl, ttft_ms, itl_ms)
    has_itl = ~np.isnan(itl)
    duration = max(duration_s, 1e-9)
    good_tokens = float(osl[met].sum()) if n else 0.0
    mean_gpus = gpu_seconds / duration
    goodput = good_tokens / duration
    return Summary(
        policy=policy,
        requests=n,
        duration_s=duration_s,
        sla_attainment=float(met.mean()) if n else math.nan,
        ttft_attainment=float((ttft * 1000.0 <= ttft_ms).mean()) if n else math.nan,
        itl_attainment=float((~has_itl | (itl * 1000.0 <= itl_ms)).mean()) if n else math.nan,
        ttft_p50_ms=_pct(ttft, 50), ttft_p90_ms=_pct(ttft, 90), ttft_p99_ms=_pct(ttft, 99),
        itl_p50_ms=_pct(itl[has_itl], 50), itl_p90_ms=_pct(itl[has_itl], 90),
        itl_p99_ms=_pct(itl[has_itl], 99),
        goodput_tps=goodput,
        goodput_per_gpu_tps=goodput / mean_gpus if mean_gpus > 0 else math.nan,
        gpu_hours=gpu_seconds / 3600.0,
        mean_gpus=mean_gpus,
        peak_replicas=dict(peak_replicas),
        mean_replicas=dict(mean_replicas),
        decisions=decisions,
    )


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q) * 1000.0) if values.size else math.nan


def windowed(log: RequestLog, window_s: float, horizon_s: float, ttft_ms: float, itl_ms: float) -> dict:
    """Per-window series by arrival time: count, attainment, p50/p90 TTFT and ITL (ms)."""
    a = log.arrays()
    n_win = max(1, math.ceil(horizon_s / window_s))
    # clipped at both ends: a request is counted in some window, never in none
    idx = np.clip((a["arrival"] // window_s).astype(np.int64), 0, n_win - 1) if len(log) else np.zeros(0, np.int64)
    met = sla_met(a["ttft"], a["itl"], ttft_ms, itl_ms)
    out = {k: [] for k in ("t", "count", "attainment", "ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "isl", "osl")}
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n_win + 1))
    for w in range(n_win):
        sel = order[bounds[w]:bounds[w + 1]]
        out["t"].append(w * window_s)
        out["count"].append(int(sel.size))
        if sel.size == 0:
            for k in ("attainment", "ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "isl", "osl"):
                out[k].append(None)
            continue
        ttft = a["ttft"][sel]
        itl = a["itl"][sel]
        itl = itl[~np.isnan(itl)]
        out["attainment"].append(float(met[sel].mean()))
        out["ttft_p50"].append(_pct(ttft, 50))
        out["ttft_p90"].append(_pct(ttft, 90))
        out["itl_p50"].append(_pct(itl, 50) if itl.size else None)
        out["itl_p90"].append(_pct(itl, 90) if itl.size else None)
        out["isl"].append(float(a["isl"][sel].mean()))
        out["osl"].append(float(a["osl"][sel].mean()))
    return out


STATES = ("ready", "starting", "draining")
"""The replica states a timeline counts (``gone`` engines hold nothing)."""


def no_replicas(roles) -> dict[str, dict[str, int]]:
    """Counts of an empty fleet, per role and state."""
    return {r: dict.fromkeys(STATES, 0) for r in roles}


class ReplicaTimeline:
    """Replica counts per role and state, and GPUs held, at every change."""

    def __init__(self, roles: tuple[str, ...]) -> None:
        self.roles = roles
        self.points: list[tuple[float, dict[str, dict[str, int]], int]] = []

    def record(self, time: float, counts: dict[str, dict[str, int]], gpus: int) -> None:
        if self.points and self.points[-1][0] == time:
            self.points[-1] = (time, counts, gpus)
        else:
            self.points.append((time, counts, gpus))

    def peak(self) -> dict[str, int]:
        return {
            r: max((c[r]["ready"] + c[r]["starting"] + c[r]["draining"] for _, c, _ in self.points), default=0)
            for r in self.roles
        }

    def cumulative_gpu_seconds(self, until: float) -> list[float]:
        """GPU-seconds spent by each point, then by ``until`` (one more value than points)."""
        out: list[float] = []
        total = 0.0
        for i, (t, _, _) in enumerate(self.points):
            if i:
                before, _, gpus = self.points[i - 1]
                total += gpus * (t - before)
            out.append(total)
        if self.points:
            t, _, gpus = self.points[-1]
            total += gpus * max(0.0, until - t)
        out.append(total)
        return out

    def gpu_seconds(self, until: float) -> float:
        """GPUs held, integrated from the first point to ``until``."""
        return self.cumulative_gpu_seconds(until)[-1]

    def mean_ready(self, until: float) -> dict[str, float]:
        """Time-averaged ready replicas per role over ``[0, until]``."""
        out = {}
        for r in self.roles:
            total = 0.0
            for (t0, c, _), nxt in zip(self.points, self.points[1:] + [(until, None, 0)], strict=True):
                total += c[r]["ready"] * max(0.0, min(nxt[0], until) - t0)
            out[r] = total / until if until > 0 else 0.0
        return out

    def to_dict(self) -> dict:
        return {
            "t": [p[0] for p in self.points],
            "gpus": [p[2] for p in self.points],
            **{
                f"{r}_{s}": [p[1][r][s] for p in self.points]
                for r in self.roles for s in STATES
            },
        }
