"""A live deployment's run rebuilt from its recorded events, for the simulator's report.

``fleetplan audit --report DIR`` reads what a deployment recorded (its
inputs on Kafka, or a ``fleetplan simulate`` log), re-folds them with the
core to get every tick, and hands this module the events and the tick
reports. Out comes a :class:`~fleetplan.sim.runner.RunResult` that
``write_report`` draws exactly as it draws a simulated run:

- requests: each ``request`` record's arrival (``request_received_ms``),
  TTFT (``ttft_ms``) and mean ITL (``avg_itl_ms``), as the frontend
  measured them; records without a TTFT, or without an ITL for an answer
  of more than one token, are left out (counted in ``unmeasured``), since
  they cannot be judged against the SLA;
- replicas: from ``inventory`` events when the orchestrator sends them
  (starting, ready, draining, with their GPUs), else the ready counts the
  planner saw at its ticks (engines it discovered from their FPMs) at the
  config's GPUs per engine;
- load and estimates: every tick's observed and predicted load and the
  perf model's TTFT/ITL estimates.

Times are seconds from the first event, as in a simulated run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetplan.sim.metrics import ReplicaTimeline, RequestLog, no_replicas, summarize
from fleetplan.sim.runner import RunResult, tick_row


@dataclass
class RecordedRun:
    result: RunResult
    arrivals: list[tuple[float, int]]  # (window start, requests arriving in it)
    start_s: float  # epoch time of the run's zero
    unmeasured: int  # finished requests without a TTFT, or a longer answer's ITL


def recorded_run(
    name: str, events: Sequence, reports: Iterable, roles: tuple[str, ...], gpus_per_engine: dict[str, int],
    ttft_ms: float, itl_ms: float, window_s: float, *, workers: dict[str, tuple[str, str, int]] | None = None,
) -> RecordedRun:
    """Rebuild the run of one deployment from its inputs and the core's tick reports.

    ``workers`` (worker -> (role, state, gpus)): those inventory had named before the
    first event, as the snapshot an ``audit --since`` starts from holds them.
    """
    reports = list(reports)
    times = [e.time for e in events] + [r.time for r in reports]
    if not times:
        raise ValueError("no events recorded for this deployment")
    # a request recorded after the log begins can have arrived before it (a topic whose
    # retention cut into the traffic): the run starts at the earliest of either, or those
    # requests fall in no minute of the report (before 2026-12-05, a third of them could)
    t0 = min([*times, *(e.arrival_s for e in events if e.type == "request")])
    end = max(times) - t0
    requests, unmeasured = _requests(events, t0)
    timeline = (_inventory_timeline(events, roles, t0, workers or {})
                or _tick_timeline(reports, roles, gpus_per_engine, t0))
    ticks = []
    for report in reports:
        row = tick_row(report)
        row["t"] = report.time - t0
        ticks.append(row)
    decisions = [r.decision for r in reports if r.decision is not None]
    gpu_seconds = timeline.gpu_seconds(end)
    summary = summarize(name, requests, ttft_ms, itl_ms, end, gpu_seconds, timeline.peak(),
                        timeline.mean_ready(end), len(decisions))
    result = RunResult(name, summary, requests, timeline, end, ticks=ticks, decisions=decisions,
                       events=len(events))
    return RecordedRun(result, _arrivals(events, t0, end, window_s), t0, unmeasured)


def _requests(events: Sequence, t0: float) -> tuple[RequestLog, int]:
    log = RequestLog()
    unmeasured = 0
    for e in sorted((e for e in events if e.type == "request"), key=lambda e: (e.arrival_s, e.request_id)):
        # a NaN ITL meets any target (a one-token answer has none), so a longer answer
        # whose ITL was not measured is left out, not counted as meeting it
        if e.ttft_ms is None or (e.output_tokens > 1 and e.avg_itl_ms is None):
            unmeasured += 1
            continue
        itl = e.avg_itl_ms / 1000.0 if e.output_tokens > 1 else math.nan
        log.record(e.arrival_s - t0, e.ttft_ms / 1000.0, itl, e.input_tokens, e.output_tokens,
                   e.cached_tokens, e.time - t0)
    return log, unmeasured


def _arrivals(events: Sequence, t0: float, end: float, window_s: float) -> list[tuple[float, int, float]]:
    """Requests per window by arrival (``arrival`` events, else the finished records'
    arrivals), with the seconds each window covers: the last is cut short by the run's end,
    and its count over a full window would draw it at a fraction of its rate (the report
    of ``fleetplan simulate`` had this fixed; the audit's did not until 2026-12-05)."""
    arrived = [e.time for e in events if e.type == "arrival"]
    if not arrived:
        arrived = [e.arrival_s for e in events if e.type == "request"]
    n = max(1, math.ceil(end / window_s))
    counts = [0] * n
    for t in arrived:
        counts[min(max(int((t - t0) // window_s), 0), n - 1)] += 1
    return [(i * window_s, c, min(window_s, end - i * window_s)) for i, c in enumerate(counts)]


def _inventory_timeline(events: Sequence, roles: tuple[str, ...], t0: float,
                        start: dict[str, tuple[str, str, int]]) -> ReplicaTimeline | None:
    inventory = [e for e in events if e.type == "inventory" and e.role in roles]
    workers = {w: v for w, v in start.items() if v[0] in roles}  # worker -> (role, state, gpus)
    if not inventory and not workers:
        return None
    timeline = ReplicaTimeline(roles)
    timeline.record(0.0, _counts(workers, roles), sum(g for _, _, g in workers.values()))
    for e in sorted(inventory, key=lambda e: e.time):
        if e.state == "gone":
            workers.pop(e.worker_id, None)
        else:
            workers[e.worker_id] = (e.role, e.state, e.gpus)
        timeline.record(e.time - t0, _counts(workers, roles), sum(g for _, _, g in workers.values()))
    return timeline


def _counts(workers: dict[str, tuple[str, str, int]], roles: tuple[str, ...]) -> dict[str, dict[str, int]]:
    counts = no_replicas(roles)
    for role, state, _ in workers.values():
        counts[role][state] += 1
    return counts


def _tick_timeline(
    reports: Sequence, roles: tuple[str, ...], gpus_per_engine: dict[str, int], t0: float,
) -> ReplicaTimeline:
    timeline = ReplicaTimeline(roles)
    timeline.record(0.0, no_replicas(roles), 0)
    for report in reports:
        counts = no_replicas(roles)
        for r in roles:
            counts[r]["ready"] = report.ready.get(r, 0)
        gpus = sum(counts[r]["ready"] * gpus_per_engine.get(r, 1) for r in roles)
        timeline.record(report.time - t0, counts, gpus)
    return timeline
