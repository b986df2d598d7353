"""Where a planner run misses: SLA attainment per minute, and what each throughput tick decided.

Usage:

    .venv/bin/python bench/per_minute.py --data /work/shared/data --workload azure-code-30min \\
        [--sla 500,50] [--warm replayed|capacity] [--load-factor 1] [--set key=value ...] \\
        [--profile h100-llama3.3-70b [--tp 4] --scale 12]   # a row of bench/results/other-engine
        [--engine-timing interp-extend]                     # a row of bench/results/engine-timing

Runs fleetplan's default config with the throughput loop and ARIMA (the
default predictor until 2026-12-01, which the docs' per-minute figures were
measured with; ``--set load_predictor=ensemble`` for today's default;
``--set`` overrides any field, YAML values) on one quality workload of ``bench/quality.py``
at its ``bench/sizing.py`` scale, from the replayed warm fleet, and prints
per arrival minute the requests, the share meeting both targets and each
target alone, the share meeting the TTFT per size of the prompt an engine
computes (ISL less cached prefix), then per tick the targets, ready
engines, forecast (the point, and the rate sized for: the quantile of the
busiest burst window), the share of each role's per-engine rate it was
sized at (``target_utilization``, or ``calibrated_utilization`` once the
quantile is conformal), the perf model's per-engine capacity and what set
each count (prefill: engines by rate, engines the queueing floor asks for;
decode: engines by rate, engines the slot-wait model asks for where decode
runs at its batch limit; with the load loop alone, the floor the measured
traffic sets per role).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
from overrides import add_set_option, parse_sets
from quality import (
    LOOPS,
    add_engine_options,
    build_workload,
    draw_seed,
    held_out_engine,
    make_setup,
    named_trace_spec,
    on_engine,
    rate_scale_shift,
    sla_pair,
)
from sizing import SCALES

from fleetplan.models.planner import Planner
from fleetplan.sim.experiment import initial_fleet, run_planner, size_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--workload", required=True,
                        help="azure-conv-30min, azure-code-30min, mooncake-conv-30min or mooncake-conv-30min-spread")
    parser.add_argument("--sla", default="500,50")
    parser.add_argument("--warm", choices=("replayed", "capacity"), default="replayed",
                        help="initial fleet: replayed until the first span meets the SLA, or the capacity search alone")
    parser.add_argument("--rate-scale-shift", type=float, default=None, metavar="S",
                        help="shift each rate-scale copy within S seconds, keeping the trace's shape "
                             "(bench/sizing.py --rate-scale-shift)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the draw of the workload (bench/sizing.py --seeds, fleetplan simulate --seed)")
    parser.add_argument("--load-factor", type=float, default=1.0,
                        help="multiple of the workload's recorded rate scale (bench/sizing.py --load-factors)")
    add_engine_options(parser, "run on this bundled engine profile (bench/sizing.py --profile); give --scale, "
                               "the rate scale its row ran at, since the recorded ones are the H200 8B's")
    parser.add_argument("--scale", type=float, default=None,
                        help="the rate scale itself, in place of the recorded one (times --load-factor)")
    add_set_option(parser)
    args = parser.parse_args()
    if not args.load_factor > 0:
        parser.error(f"--load-factor: a positive number, got {args.load_factor!r}")
    rate_scale_shift(parser, args.rate_scale_shift)
    draw_seed(parser, args.seed)
    sla = sla_pair(parser, args.sla)
    overrides = parse_sets(parser, args.overrides)
    if args.scale is not None and not args.scale > 0:
        parser.error(f"--scale: a positive number, got {args.scale!r}")
    if args.profile is not None and args.scale is None:
        parser.error("--profile: give --scale too, the rate scale the row ran at on that engine")
    held_out_engine(parser, args.profile, args.tp)
    s = named_trace_spec(parser, args.data, args.workload)
    scale = SCALES[s.name] if args.scale is None else args.scale
    spec = replace(on_engine(s, args), scale=scale * args.load_factor, seed=args.seed, shift=args.rate_scale_shift)
    cfg, setup = make_setup(spec, sla, {**LOOPS["throughput"], "load_predictor": "arima", **overrides})
    workload = build_workload(spec)
    replay = workload if args.warm == "replayed" else None
    initial = initial_fleet("warm", setup, size_workload(workload, setup), replay)
    result = run_planner(workload, setup, Planner(cfg, profile=setup.profile), initial)
    summary = result.summary
    print(f"{spec.name} ×{spec.scale:g} at {sla[0]:g}/{sla[1]:g}: warm fleet {initial}, "
          f"attainment {summary.sla_attainment:.2%}, {summary.gpu_hours:.2f} GPU-h")
    a = result.requests.arrays()
    ttft_ok = a["ttft"] * 1000.0 <= sla[0]
    itl_ok = np.isnan(a["itl"]) | (a["itl"] * 1000.0 <= sla[1])
    minute = (a["arrival"] // 60).astype(np.int64)
    print("\n| minute | requests | both met | TTFT met | ITL met |\n|---:|---:|---:|---:|---:|")
    for m in range(int(minute.max()) + 1):
        sel = minute == m
        if sel.any():
            print(f"| {m} | {int(sel.sum())} | {(ttft_ok & itl_ok)[sel].mean():.1%} | "
                  f"{ttft_ok[sel].mean():.1%} | {itl_ok[sel].mean():.1%} |")
    # the prompt tokens an engine computes: long ones cannot meet a tight TTFT on their own
    computed = a["isl"] - a["cached"]
    print("\n| prompt tokens computed | requests | share | TTFT met | TTFT p50 ms |\n|---|---:|---:|---:|---:|")
    edges = [0, 256, 1024, 2048, 4096, 8192, 16384, 32768]
    for lo, hi in zip(edges, edges[1:] + [None], strict=True):
        sel = (computed >= lo) & (computed < hi if hi is not None else True)
        if sel.any():
            span = f"{lo:,}–{hi - 1:,}" if hi is not None else f"{lo:,}+"
            print(f"| {span} | {int(sel.sum())} | {sel.mean():.1%} | {ttft_ok[sel].mean():.1%} | "
                  f"{np.median(a['ttft'][sel]) * 1000.0:.0f} |")
    print("\n| tick s | targets | ready | predicted rps | sized rps | utilisation prefill / decode | prefill rps/engine | decode rps/engine "
          "| prefill by rate / queueing floor | decode by rate / slots | measured floor |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---|---|---|")
    for t in result.ticks:
        floor = {r: t[f"{r}_measured_floor"] for r in t["targets"] if f"{r}_measured_floor" in t}
        print(f"| {t['t']:g} | {t['targets']} | {t['ready']} | {t.get('predicted_rps', float('nan')):.1f} | "
              f"{t.get('sized_rps', float('nan')):.1f} | {t.get('prefill_utilization', float('nan')):.2f} / "
              f"{t.get('decode_utilization', float('nan')):.2f} | "
              f"{t.get('prefill_capacity_rps', float('nan')):.1f} | {t.get('decode_capacity_rps', float('nan')):.1f} | "
              f"{t.get('prefill_rate_replicas', '–')} / {t.get('prefill_queueing_replicas', '–')} | "
              f"{t.get('decode_rate_replicas', '–')} / {t.get('decode_queueing_replicas', '–')} | {floor or '–'} |")


if __name__ == "__main__":
    main()
