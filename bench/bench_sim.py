"""Simulator speed: simulated seconds per wall second, closed loop with the planner.

Usage (paths are arguments; nothing is read from a fixed location):

    .venv/bin/python bench/bench_sim.py \\
        /work/shared/data/traces/azure2023/AzureLLMInferenceTrace_conv_first30min.csv \\
        /work/shared/data/traces/mooncake/conversation_trace_first30min.jsonl \\
        [--rate-scale 1] [--repeat 3] [--json out.json]

For each trace and each setting it runs the whole closed loop (the planning
core folds every event, decisions go through the simulated connector) and
reports the best of ``--repeat`` runs: sim-seconds per wall-second,
requests/s, engine iterations/s, events/s. Settings:

- ``planner+log``: default planner config, the JSONL log written to a temp file;
- ``planner``: the same without the log;
- ``planner-both-loops``: throughput and load loops, constant predictor;
- ``static``: no planner (a fixed fleet): the fleet simulation alone.

Imports (statsmodels for ARIMA is ~1.5 s) happen before the clock starts:
the figure is the simulator's steady speed, not process start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import statsmodels.tsa.arima.model  # noqa: F401  (import cost kept out of the timings)

from fleetplan.bootstrap import build_planner
from fleetplan.models.config import config_from_dict
from fleetplan.sim.baselines import StaticPolicy
from fleetplan.sim.experiment import initial_fleet, run_planner, run_policy, size_workload
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.runner import SimOptions, make_setup
from fleetplan.sim.traces import read_trace
from fleetplan.sim.workload import Workload, rate_scale

SETTINGS = {
    "planner+log": ({}, True),
    "planner": ({}, False),
    "planner-both-loops": ({"enable_load_scaling": True, "load_predictor": "constant"}, False),
    "static": (None, False),
}


def bench_one(workload, profile, profile_name, name, overrides, with_log, router):
    cfg = config_from_dict({"max_gpu_budget": 64, **(overrides or {})})
    setup = make_setup(cfg, profile, SimOptions(router=router))
    sizing = size_workload(workload, setup)
    initial = initial_fleet("warm", setup, sizing, workload)
    if overrides is None:
        result = run_policy(workload, setup, StaticPolicy(initial), "static", initial)
    elif with_log:
        with tempfile.TemporaryFile() as fh:
            result = run_planner(workload, setup, build_planner(cfg, profile_name), initial, log=fh)
    else:
        result = run_planner(workload, setup, build_planner(cfg, profile_name), initial)
    wall = result.wall_s
    return {
        "setting": name, "wall_s": wall, "sim_s": result.end_s,
        "sim_per_wall": result.end_s / wall, "requests": result.summary.requests,
        "requests_per_s": result.summary.requests / wall,
        "iterations_per_s": result.iterations / wall,
        "events": result.events, "events_per_s": result.events / wall, "fpms": result.fpms,
        "decisions": result.summary.decisions, "late_events": result.late_events,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--profile", default="h200-llama3.1-8b")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    rows = []
    for path in args.traces:
        reqs = read_trace(path)
        if args.rate_scale != 1.0:
            reqs = rate_scale(reqs, args.rate_scale, seed=0)
        workload = Workload.from_requests(path.stem, reqs)
        router = "prefix" if any(r.hash_ids for r in reqs[:100]) else "least-loaded"
        for name, (overrides, with_log) in SETTINGS.items():
            best = None
            for _ in range(args.repeat):
                row = bench_one(workload, profile, args.profile, name, overrides, with_log, router)
                if best is None or row["wall_s"] < best["wall_s"]:
                    best = row
            best["trace"] = path.name
            best["router"] = router
            rows.append(best)
            print(
                f"{path.name:55s} {name:20s} {best['sim_per_wall']:8,.0f}x  "
                f"{best['requests_per_s']:9,.0f} req/s  {best['iterations_per_s']:11,.0f} it/s  "
                f"{best['events_per_s']:9,.0f} events/s  wall {best['wall_s']:.2f} s",
                flush=True,
            )
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    print(f"machine: {machine}; best of {args.repeat}; {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
