"""Start the planner as a deployment that has been running: its forecaster fed the traffic before.

A deployed planner keeps its forecaster in a changelog-backed table, so a
restart, a redeploy or a new config picks it up where it was: the daily
cycle learned, the quantile's levels calibrated. A simulation that starts
the planner empty measures its first hours instead, the one time a real
deployment is cold. Here the traffic before the run is replayed into the
forecaster first, as the planner's throughput loop would have fed it (one
observation per throughput window: the count, the mean ISL and OSL of the
requests that arrived, and the busiest burst sub-window scaled to a
window's count), and the run starts from what that leaves: the windows go
to the log and the core as a ``seed_traffic`` control at the run's start
(``PlannerController(seed=...)``), which the core replays into its
forecaster, so ``fleetplan plan`` folds the log to the same decisions.
``fleetplan simulate --warm-up SECONDS`` and ``bench/sizing.py --day D
--warm-days W`` run so. Only the forecaster is warmed:
the perf model still learns from the run's own forward passes, as it
would after an engine change.

This is not ``load_predictor_warmup_trace`` (``bucket_traffic``), which
cuts a recorded trace of unknown time of day into windows from its first
request and feeds their counts alone. Here the history is the run's own
past, so the windows are on the run's clock (the last one ends at 0 and
a daily cycle keeps its phase) and each carries its busiest burst, which
the sizing quantile calibrates on. OSL comes from the arriving requests
here, where the running planner takes it from the requests that finished
in the window: in steady state the two are the same traffic a few
seconds apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from fleetplan.models.predictor_swap import remember_window
from fleetplan.models.state import TrafficWindow
from fleetplan.sim.traces import TraceRequest

__all__ = ["history_windows"]


def history_windows(
    requests: Iterable[TraceRequest], *, span_s: float, interval_s: float, burst_s: int,
) -> list[list]:
    """The throughput windows of the ``span_s`` seconds of ``requests``, as the planner keeps them.

    ``requests`` are timed from the history's start (``0 <= arrival <
    span_s``; others are ignored) and end where the run starts. Returns
    ``remember_window`` rows (``[start, duration, count, isl, osl, kv hit,
    accept, peak]``) with ``start`` on the run's clock: the last window
    ends at 0. A leading part window shorter than ``interval_s`` is left
    out, and so are the idle windows before the first request, which the
    planner skips too (it has seen no traffic). An idle window after it
    carries the last OSL over, as the planner does.
    """
    if not (interval_s > 0 and span_s >= 0 and burst_s >= 0):
        raise ValueError(f"need interval_s > 0, span_s >= 0, burst_s >= 0; got {interval_s}, {span_s}, {burst_s}")
    windows = int(math.floor(span_s / interval_s + 1e-9))
    origin = -windows * interval_s
    # the planner's own window sums, observation and busiest burst, one window per throughput interval
    cut = [TrafficWindow() for _ in range(windows)]
    for req in requests:
        t = req.arrival_s - span_s  # on the run's clock
        k = math.floor((t - origin) / interval_s)
        if not 0 <= k < windows:
            continue
        window = cut[k]
        window.add_arrival(t, req.input_tokens, burst_s)
        window.count += 1  # the OSL is known at arrival here: counted as the window's finished ones
        window.sum_osl += req.output_tokens
    rows: list[list] = []
    last_osl = None
    for k, window in enumerate(cut):
        if not rows and not window.arrivals:
            continue
        obs = window.observation(interval_s, by_arrival=True, last_osl=last_osl)
        last_osl = obs.osl
        peak = window.peak_count(interval_s, burst_s, by_arrival=True)
        remember_window(rows, replace(obs, start_s=origin + k * interval_s), peak, windows)
    return rows
