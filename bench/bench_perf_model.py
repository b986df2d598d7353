"""Benchmark the perf model's hot operations.

    .venv/bin/python bench/bench_perf_model.py [--repeat 7]

Times, on the bundled H200 Llama-3.1-8B profile:
- one capacity search per role (ISL 3000 / OSL 150, TTFT 200 ms / ITL 50 ms);
- one load-loop estimate over 1,000 engines, per-FPM calls and vectorised;
- observing 100k FPMs in one batch (random loads; and the worst case where
  every sample is a new maximum, forcing a re-bucketing each time);
- one refit after the samples changed.
Each figure is the median of ``--repeat`` runs. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from fleetplan.models.perf import (
    DecodePerfModel,
    FpmColumns,
    PrefillPerfModel,
    seeded_perf_model,
)
from fleetplan.schemas import ForwardPassMetrics
from fleetplan.sim.profiles import load_profile

ENGINES = 1_000
SAMPLES = 100_000


def median_seconds(run: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeat):
        arg = setup() if setup else None
        start = time.perf_counter()
        run() if arg is None else run(arg)  # type: ignore[call-arg]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_call(run: Callable[[], object], repeat: int, calls: int) -> float:
    return median_seconds(lambda: [run() for _ in range(calls)], repeat) / calls


def engine_fpms(role: str, rng: np.random.Generator) -> list[ForwardPassMetrics]:
    return [
        ForwardPassMetrics(
            deployment="bench", time=0.0, role=role, worker_id=f"{role}-{i}", wall_time=0.02,
            scheduled={"num_decode_requests": int(rng.integers(1, 256)),
                       "sum_decode_kv_tokens": int(rng.integers(0, 800_000))},
            queued={"sum_prefill_tokens": int(rng.integers(0, 40_000)),
                    "sum_decode_kv_tokens": int(rng.integers(0, 20_000))},
        )
        for i in range(ENGINES)
    ]


def random_columns(role: str, rng: np.random.Generator) -> FpmColumns:
    n = SAMPLES
    wall = rng.uniform(0.005, 0.2, n) * (rng.random(n) > 0.05)  # 5% idle heartbeats
    if role == "prefill":
        tokens = rng.integers(1, 8193, n).astype(float)
        return FpmColumns(wall, np.ones(n), tokens, np.zeros(n), np.zeros(n))
    requests = rng.integers(1, 257, n).astype(float)
    return FpmColumns(wall, np.zeros(n), np.zeros(n), requests, requests * rng.uniform(300, 3000, n))


def ramp_columns() -> FpmColumns:
    n = SAMPLES
    return FpmColumns(np.full(n, 0.02), np.ones(n), np.arange(1, n + 1, dtype=float), np.zeros(n), np.zeros(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    repeat = args.repeat
    rng = np.random.default_rng(7)
    profile = load_profile("h200-llama3.1-8b")
    models = {role: seeded_perf_model(profile, role) for role in ("prefill", "decode", "agg")}
    for model in models.values():
        model.fit()  # warm the cache: the tick reads a fitted model

    rows: list[tuple[str, float, str]] = []
    for role, model in models.items():
        t = per_call(lambda m=model: m.capacity_rps(3000, 150, 200.0, 50.0, 0.2, 1.0), repeat, 200)
        rows.append((f"capacity search, {role}", t, "per search"))

    prefill, decode = models["prefill"], models["decode"]
    p_fpms, d_fpms = engine_fpms("prefill", rng), engine_fpms("decode", rng)
    rows.append((f"TTFT estimate, {ENGINES} prefill engines (per-FPM calls)",
                 median_seconds(lambda: [prefill.estimate_ttft_ms(f, 0.2) for f in p_fpms], repeat), "per tick"))
    rows.append((f"ITL estimate, {ENGINES} decode engines (per-FPM calls)",
                 median_seconds(lambda: [decode.estimate_itl_ms(f, 1.0) for f in d_fpms], repeat), "per tick"))
    queued = np.array([f.queued.sum_prefill_tokens for f in p_fpms], dtype=float)
    kv = np.array([f.scheduled.sum_decode_kv_tokens + f.queued.sum_decode_kv_tokens for f in d_fpms], dtype=float)
    rows.append((f"TTFT estimate, {ENGINES} prefill engines (vectorised)",
                 median_seconds(lambda: prefill.estimate_ttft_ms_many(queued, 0.2), repeat), "per tick"))
    rows.append((f"ITL estimate, {ENGINES} decode engines (vectorised)",
                 median_seconds(lambda: decode.estimate_itl_ms_many(kv, 1.0), repeat), "per tick"))

    for role, cls in (("prefill", PrefillPerfModel), ("decode", DecodePerfModel)):
        cols = random_columns(role, rng)
        t = median_seconds(lambda m, c=cols: m.observe_batch(c), repeat, setup=cls)
        rows.append((f"observe_batch {SAMPLES:,} {role} FPMs, random loads", t, f"{t / SAMPLES * 1e6:.2f} µs/FPM"))
    ramp = ramp_columns()
    t = median_seconds(lambda m: m.observe_batch(ramp), max(1, repeat // 3), setup=PrefillPerfModel)
    rows.append((f"observe_batch {SAMPLES:,} prefill FPMs, each a new max (worst case)", t,
                 f"{t / SAMPLES * 1e6:.2f} µs/FPM"))
    one = d_fpms[:200]
    t = median_seconds(lambda m: [m.observe(f) for f in one], repeat, setup=lambda: seeded_perf_model(profile, "decode"))
    rows.append(("observe, one decode FPM at a time", t / len(one), "per FPM"))

    def refit(model: DecodePerfModel) -> None:
        model.fit()

    def changed() -> DecodePerfModel:
        model = seeded_perf_model(profile, "decode")
        model.observe(d_fpms[0])
        return model

    rows.append(("refit after a change (decode, 42 samples)", median_seconds(refit, repeat, setup=changed), "per refit"))

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}, numpy {np.__version__}")
    width = max(len(name) for name, _, _ in rows)
    print(f"{'operation':<{width}}  {'median':>11}  note")
    for name, seconds, note in rows:
        print(f"{name:<{width}}  {format_time(seconds):>11}  {note}")


def format_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


if __name__ == "__main__":
    main()
