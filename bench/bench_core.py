"""Benchmark the planning core: tick time and apply throughput.

    .venv/bin/python bench/bench_core.py [--predictor constant] [--set decode_sizing=rate ...]

Tick time is measured for one deployment of 1, 100 and 1,000 engines (both
loops due: a 180 s boundary, load loop on, every engine reporting, the
window's 200 requests of one length restored before every tick so each
tick closes a full window), for the same 100 engines with a window of
3,000 requests of lognormal lengths (24 ISL/OSL buckets: the request-mix
capacity and the queueing floor's per-bucket budgets are computed per
bucket), for those 100 engines and 3,000 requests with the load loop
alone, ticked 90 s into a window (so its floor from the measured traffic
sizes the window, mix and all, every 5-s tick), the same two cases with
the window's arrivals too (bursty, so the queueing floor computes the
arrivals' dispersion curve from 1 s to 16 s; with ``queueing_arrivals:
measured`` beside it for the cost of the curve), and for 100 deployments
of 10 engines each. Apply throughput is
FPM events folded per second, one event at a time and as FpmBatch records
of 500.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from overrides import add_set_option, parse_sets

from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.models.state import TrafficWindow
from fleetplan.schemas import (
    ForwardPassMetrics,
    FpmBatch,
    InventoryEvent,
    QueuedRequests,
    RequestArrival,
    RequestRecord,
    ScheduledRequests,
)
from fleetplan.sim.profiles import load_profile

T0 = 1_800_000_000.0
PROFILE = load_profile("h200-llama3.1-8b")
def configs(predictor: str | None, overrides: dict | None = None) -> tuple:
    """The default config (both loops, no GPU budget), the load loop alone, and the 1-s dispersion.

    ``predictor`` None keeps the default predictor (the ensemble); ``overrides``
    sets any other field in all three, to price one part of the tick.
    """
    base = {"enable_load_scaling": True, "max_gpu_budget": -1, **(overrides or {})}
    if predictor is not None:
        base["load_predictor"] = predictor
    return (config_from_dict(base), config_from_dict({**base, "enable_throughput_scaling": False}),
            config_from_dict({**base, "queueing_arrivals": "measured"}))


def _fpm(dep: str, worker: str, role: str, i: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        deployment=dep, time=T0 + 1 + i * 1e-3, role=role, worker_id=worker, counter_id=i,
        wall_time=0.02 + (i % 7) * 1e-3,
        scheduled=ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=1000 + (i * 37) % 7000,
                                    num_decode_requests=8 + i % 32, sum_decode_kv_tokens=20_000 + (i * 131) % 90_000),
        queued=QueuedRequests(sum_prefill_tokens=(i * 53) % 9000, sum_decode_kv_tokens=(i * 17) % 3000),
    )


def _lengths(wide: bool, rng: random.Random) -> tuple[int, int]:
    """One request's (ISL, OSL): all alike, or lognormal around 5k / 200 tokens."""
    if not wide:
        return 3000, 150
    return max(int(rng.lognormvariate(8.5, 1.2)), 1), max(int(rng.lognormvariate(5.3, 0.9)), 2)


def _bursty_arrival_times(count: int) -> list[float]:
    """``count`` arrivals over 180 s, in 10-s blocks at half and at 1.5 times the mean rate.

    Their dispersion grows with the time scale, as Azure code's does, so
    the queueing floor computes its full dispersion curve.
    """
    rate = count / 180.0
    times: list[float] = []
    for block in range(18):
        block_rate = rate * (1.5 if block % 2 else 0.5)
        n = round(block_rate * 10)
        times += [10.0 * block + 10.0 * i / n for i in range(n)]
    return times[:count]


def _deployment(planner: Planner, dep: str, engines: int, wide_mix: bool = False, arrivals: bool = False):
    state = planner.new_state(dep)
    half = max(engines // 2, 1)
    for k in range(engines):
        role = "prefill" if k < half else "decode"
        w = f"{role}-{k}"
        planner.apply(state, InventoryEvent(deployment=dep, time=T0, worker_id=w, role=role, state="ready"))
        planner.apply(state, _fpm(dep, w, role, k))
    rng = random.Random(0)
    count = 3000 if wide_mix else 200
    for k in range(count):
        isl, osl = _lengths(wide_mix, rng)
        planner.apply(state, RequestRecord(deployment=dep, time=T0 + k * 100.0 / count, request_id=f"r{k}",
                                           input_tokens=isl, output_tokens=osl, request_received_ms=T0 * 1000))
    if arrivals:
        for k, at in enumerate(_bursty_arrival_times(count)):
            planner.apply(state, RequestArrival(deployment=dep, time=T0 + at, request_id=f"r{k}", input_tokens=3000))
    return state


def _time_ticks(planner: Planner, states, reps: int, into_window: float = 180) -> list[float]:
    """Milliseconds per tick round (all ``states`` ticked once, ``into_window`` seconds into a window).

    The default ticks at the 180 s boundary, where the window closes.
    """
    out = []
    windows = [st.window.to_data() for st in states]
    for r in range(reps):
        now = T0 + 180 * r + into_window
        shift = round(now - into_window - T0)
        for st, window in zip(states, windows, strict=True):
            st.window = TrafficWindow.from_data(window)  # every round sees the same window
            # its arrivals per second moved with it (they are keyed by the second)
            st.window.second_arrivals = {str(int(k) + shift): n for k, n in window["second_arrivals"].items()}
            st.window_start = now - into_window
        started = time.perf_counter()
        for st in states:
            planner.tick(st, now)
            st.pending = None  # keep every round deciding afresh
            st.desired = None
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--predictor", default=None, help="load_predictor (default: the config's default)")
    add_set_option(parser)
    args = parser.parse_args()
    config, load_alone, one_second = configs(args.predictor, parse_sets(parser, args.overrides))
    planner = Planner(config, profile=PROFILE)
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    print("| case | p50 ms per tick round | p90 ms |")
    print("|---|---:|---:|")
    for engines in (1, 100, 1000):
        st = _deployment(planner, "d", engines)
        samples = _time_ticks(planner, [st], 30)
        print(f"| 1 deployment, {engines} engines | {statistics.median(samples):.3f} | {statistics.quantiles(samples, n=10)[-1]:.3f} |")
    st = _deployment(planner, "d", 100, wide_mix=True)
    samples = _time_ticks(planner, [st], 30)
    print(f"| 1 deployment, 100 engines, 24-bucket request mix | {statistics.median(samples):.3f} | {statistics.quantiles(samples, n=10)[-1]:.3f} |")
    for label, cfg in (("dispersion curve, the default", config), ("1-s dispersion", one_second)):
        bursty = Planner(cfg, profile=PROFILE)
        st = _deployment(bursty, "d", 100, wide_mix=True, arrivals=True)
        samples = _time_ticks(bursty, [st], 30)
        print(f"| 1 deployment, 100 engines, 24-bucket request mix, bursty arrivals ({label}) | "
              f"{statistics.median(samples):.3f} | {statistics.quantiles(samples, n=10)[-1]:.3f} |")
    alone = Planner(load_alone, profile=PROFILE)
    st = _deployment(alone, "d", 100, wide_mix=True, arrivals=True)
    samples = _time_ticks(alone, [st], 30, into_window=90)
    print(f"| 1 deployment, 100 engines, load loop alone (measured floor), 24-bucket request mix, bursty arrivals | "
          f"{statistics.median(samples):.3f} | {statistics.quantiles(samples, n=10)[-1]:.3f} |")
    st = _deployment(alone, "d", 100, wide_mix=True)
    samples = _time_ticks(alone, [st], 30, into_window=90)
    print(f"| 1 deployment, 100 engines, load loop alone (measured floor), 24-bucket request mix | "
          f"{statistics.median(samples):.3f} | {statistics.quantiles(samples, n=10)[-1]:.3f} |")
    states = [_deployment(planner, f"d{k}", 10) for k in range(100)]
    samples = _time_ticks(planner, states, 10)
    print(f"| 100 deployments x 10 engines | {statistics.median(samples):.3f} | {statistics.quantiles(samples, n=10)[-1]:.3f} |")

    events = [_fpm("d", f"decode-{i % 200}", "decode", i) for i in range(100_000)]
    st = planner.new_state("d")
    started = time.perf_counter()
    for e in events:
        planner.apply(st, e)
    single = len(events) / (time.perf_counter() - started)
    batches = [FpmBatch(deployment="d", time=events[i + 499].time, fpms=events[i:i + 500])
               for i in range(0, len(events), 500)]
    st = planner.new_state("d")
    started = time.perf_counter()
    for b in batches:
        planner.apply(st, b)
    batched = len(events) / (time.perf_counter() - started)
    print()
    print("| apply | FPM events/s |")
    print("|---|---:|")
    print(f"| one event at a time | {single:,.0f} |")
    print(f"| FpmBatch of 500 | {batched:,.0f} |")


if __name__ == "__main__":
    main()
