"""Which sizing should be the default? The planner's config variants on the quality workloads.

Usage:

    .venv/bin/python bench/sizing.py --data /work/shared/data \\
        [--only conv,code,mooncake] [--sla 500,50] [--jobs 1] [--json out.json]

Runs the oracle and, for each variant below, the planner (Dynamo's default
config otherwise: throughput loop only, ARIMA) on the rate-scaled traces of
``bench/quality.py``, with the scales recorded there (``--scales`` to
change them), and prints attainment and GPU-hours against the oracle.
The variants isolate each departure from the reference sizing:
``startup_quantile`` (upper quantile over the startup horizon),
``buckets`` (capacity from the ISL/OSL mix), ``target_utilization`` and
the load loop.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from quality import Spec, _row, build_workload, make_setup, specs

from fleetplan.models.config import REFERENCE_SIZING

Q = {"throughput_sizing": "startup_quantile"}
B = {"capacity_mix": "buckets"}
U = {"target_utilization": 0.8}
LOAD = {"enable_load_scaling": True, "hold_scale_down_until_floor": True}
VARIANTS: dict[str, dict] = {
    "fleetplan (arima)": {},
    "fleetplan (ensemble)": {"load_predictor": "ensemble"},
    "dynamo": dict(REFERENCE_SIZING),
    "dynamo+util0.8": {**REFERENCE_SIZING, **U},
    "dynamo+util0.8+quantile": {**REFERENCE_SIZING, **U, **Q},
    "dynamo+util0.8+quantile+buckets": {**REFERENCE_SIZING, **U, **Q, **B},
    "fleetplan, no queueing floor": {"prefill_sizing": "rate"},
    "fleetplan, no burst window": {"burst_window_seconds": 0},
    "fleetplan, no mix": {"capacity_mix": "mean"},
    "fleetplan, no quantile": {"throughput_sizing": "point"},
    "fleetplan, util 1.0": {"target_utilization": 1.0},
    "reference": {"target_utilization": 1.0, "throughput_sizing": "point", "capacity_mix": "mean"},
    "quantile": {**Q},
    "buckets": {**B},
    "util0.8": {**U},
    "util0.8+quantile": {**U, **Q},
    "util0.8+quantile+buckets": {**U, **Q, **B},
    "util0.8+quantile+buckets+ensemble": {**U, **Q, **B, "load_predictor": "ensemble"},
    "util0.8+quantile+buckets+load": {**U, **Q, **B, **LOAD},
    "util0.9+quantile+buckets": {**Q, **B, "target_utilization": 0.9},
    "util0.7+quantile+buckets": {**Q, **B, "target_utilization": 0.7},
    "util0.8+quantile+buckets, no burst": {**U, **Q, **B, "burst_window_seconds": 0},
    "util0.8+quantile+buckets+queueing": {**U, **Q, **B, "prefill_sizing": "queueing"},
    "util0.8+buckets+queueing": {**U, **B, "prefill_sizing": "queueing"},
}

# Scales chosen by bench/quality.py (busiest minute >= 10 engines at 500/50).
SCALES = {"azure-conv-30min": 26.0, "azure-code-30min": 50.0, "mooncake-conv-30min": 6.0,
          "servegen-m-large-24h": 0.16}


def run_variant(spec: Spec, sla, name: str) -> dict:
    from fleetplan.models.planner import Planner
    from fleetplan.sim.experiment import initial_fleet, run_oracle, run_planner, size_workload

    overrides = VARIANTS.get(name, {})
    cfg, setup = make_setup(spec, sla, overrides)
    workload = build_workload(spec)
    sizing = size_workload(workload, setup)
    t0 = time.perf_counter()
    if name == "oracle":
        result = run_oracle(workload, setup, sizing, goal=0.99, rounds=5)
    else:
        result = run_planner(workload, setup, Planner(cfg, profile=setup.profile),
                             initial_fleet("warm", setup, sizing))
    return _row(spec, sla, name, result, time.perf_counter() - t0)


def _task(args):
    return run_variant(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--only", default="conv,code,mooncake")
    parser.add_argument("--sla", default="500,50")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--no-oracle", dest="oracle", action="store_false",
                        help="skip the oracle (slow on a day: six replays); ratios need it")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sla = tuple(float(x) for x in args.sla.split(","))
    chosen = []
    for s in specs(args.data, set(args.only.split(",")), 10, 24, 24.0, choose=False):
        chosen.append(Spec(**{**s.__dict__, "scale": SCALES.get(s.name, s.scale)}))
    names = [*(["oracle"] if args.oracle else []), *[v for v in args.variants.split(",") if v]]
    tasks = [(s, sla, n) for s in chosen for n in names]
    started = time.time()
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(_task, tasks):
            rows.append(row)
            print(f"[{time.time() - started:5.0f}s] {row['workload']} x{row['scale']:g} {row['policy']}: "
                  f"{row['attainment']:.2%} {row['gpu_hours']:.2f} GPU-h", flush=True)
    print("\n| workload | policy | attainment | GPU-h | x oracle |\n|---|---|---:|---:|---:|")
    for row in rows:
        oracle = next((r for r in rows if r["workload"] == row["workload"] and r["policy"] == "oracle"), None)
        ratio = f"{row['gpu_hours'] / oracle['gpu_hours']:.2f}" if oracle else ""
        print(f"| {row['workload']} x{row['scale']:g} | {row['policy']} | {row['attainment']:.2%} | "
              f"{row['gpu_hours']:.2f} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps({"sla": sla, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
