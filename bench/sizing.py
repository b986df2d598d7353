"""Which sizing should be the default? Each departure from Dynamo's sizing, added and taken away.

Usage:

    .venv/bin/python bench/sizing.py --data /work/shared/data \
        [--only conv,code,mooncake,m-large] [--sla 500,50] [--variants A,B] \
        [--jobs 1] [--no-oracle] [--load-factors 0.9,1,1.1] [--day 4 --warm-days 4] [--json out.json] \
        [--profile h100-llama3.3-70b [--tp 4]]   # the traces on an engine the defaults were not tuned on
        [--engine-timing interp-extend]           # decode levels carried on past their measured usage
        # --variants frontier: Dynamo's sizing swept; forecast-frontier: the reference's forecasting swept;
        # departures: today's defaults, each departure from Dynamo's sizing taken away

Runs the oracle and each variant of ``VARIANTS`` (config overrides on top
of the defaults; throughput loop only, ARIMA, unless a variant says
otherwise) on the workloads of ``bench/quality.py`` at the rate scales
recorded there (``SCALES``), and prints SLA attainment and GPU-hours
against the oracle. "dynamo+..." rows add fleetplan's departures to
Dynamo's sizing one at a time; "fleetplan -..." rows take one away from
fleetplan's defaults as they were when docs/sizing.md first measured them,
and "defaults -..." rows one away from today's, nothing else pinned.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from quality import (
    REFERENCE_FORECAST,
    TIMING_SUFFIX,
    WORKLOADS,
    Spec,
    _row,
    add_engine_options,
    build_workload,
    choose_scale,
    held_out_engine,
    make_setup,
    on_day,
    only_workloads,
    predictors,
    rate_scale_shift,
    sla_pair,
    specs,
    warm_history,
)

from fleetplan.models.config import REFERENCE_SIZING

Q = {"throughput_sizing": "startup_quantile"}
B = {"capacity_mix": "buckets"}
U = {"target_utilization": 0.8}
W = {"burst_sizing": "both"}  # the busiest burst in prefill's rate count too (until 2026-12-04)
C = {"calibrated_utilization": None, **W}  # target_utilization throughout, calibrated or not
VARIANTS: dict[str, dict] = {
    # Dynamo's sizing, then fleetplan's departures added one at a time
    "dynamo": dict(REFERENCE_SIZING),
    "dynamo+util0.8": {**REFERENCE_SIZING, **U},
    "dynamo+util0.8+quantile": {**REFERENCE_SIZING, **U, **Q},
    "dynamo+util0.8+quantile+buckets": {**REFERENCE_SIZING, **U, **Q, **B},
    # fleetplan's defaults, then each departure taken away; all but the first pin the headroom
    # as it was when docs/sizing.md measured them (before calibrated_utilization, 2026-12-02),
    # and all but the first two the burst sizing (W)
    "fleetplan (ensemble)": {"load_predictor": "ensemble"},  # the defaults
    # the rate count sized for the busiest burst too, as the queueing floor is (until 2026-12-04)
    "fleetplan (ensemble) -windowrate": {"load_predictor": "ensemble", **W},
    "fleetplan (ensemble) -calibrated": {"load_predictor": "ensemble", **C},  # until 2026-12-02
    # the full headroom until the P90 is conformal (the default until 2026-12-04)
    "fleetplan (ensemble) -coverage": {"load_predictor": "ensemble", "uncalibrated_headroom": "full", **W},
    **{f"fleetplan (ensemble) calibrated{u:g}": {"load_predictor": "ensemble", "calibrated_utilization": u, **W}
       for u in (0.85, 0.95, 1.0)},
    "fleetplan (arima)": {**C},
    "fleetplan (ensemble) -slots": {"load_predictor": "ensemble", "decode_sizing": "rate", **C},  # until 2026-12-01
    "fleetplan (ensemble) util0.9": {"load_predictor": "ensemble", "target_utilization": 0.9, **C},
    "fleetplan -queueing": {"prefill_sizing": "rate", **C},
    "fleetplan -dispersion": {"queueing_arrivals": "poisson", **C},
    "fleetplan -timescales": {"queueing_arrivals": "measured", **C},  # the 1-s dispersion alone (until 2026-12-01)
    "fleetplan -burst": {"burst_window_seconds": 0, **C},
    "fleetplan -mix": {"capacity_mix": "mean", **C},
    "fleetplan -quantile": {"throughput_sizing": "point", **C},
    "fleetplan -headroom": {"target_utilization": 1.0, **C},
    "fleetplan util0.8": {"target_utilization": 0.8, **C},  # the default until 2026-11-30
    "fleetplan -quadratic": {"prefill_time_model": "linear", **C},
    "fleetplan burst 20s": {"burst_window_seconds": 20, **C},
    "fleetplan burst 10s": {"burst_window_seconds": 10, **C},
    # with the load loop too
    "fleetplan both (arima)": {"enable_load_scaling": True, **C},
    "dynamo both (arima)": {**REFERENCE_SIZING, "enable_load_scaling": True},
}

# Today's defaults, then each departure from Dynamo's sizing taken away with nothing else pinned
# (docs/sizing.md's "What each departure buys"; the rows above keep what they were measured with)
DEPARTURES: dict[str, dict] = {
    "defaults": {},
    "defaults -queueing": {"prefill_sizing": "rate"},
    "defaults -dispersion": {"queueing_arrivals": "poisson"},
    "defaults -timescales": {"queueing_arrivals": "measured"},
    "defaults -burst": {"burst_window_seconds": 0},
    "defaults -windowrate": dict(W),
    "defaults -mix": {"capacity_mix": "mean"},
    "defaults -slots": {"decode_sizing": "rate"},
    "defaults -quantile": {"throughput_sizing": "point"},
    "defaults -coverage": {"uncalibrated_headroom": "full"},
    "defaults -calibrated": {"calibrated_utilization": None},
    "defaults -headroom": {"target_utilization": 1.0, "calibrated_utilization": None},
    "defaults -quadratic": {"prefill_time_model": "linear"},
    "defaults constant": {"load_predictor": "constant"},
    "defaults arima_frozen": {"load_predictor": "arima_frozen"},
    "defaults +load loop": {"enable_load_scaling": True},
}
VARIANTS.update({name: {"load_predictor": "ensemble", **change} for name, change in DEPARTURES.items()})

# The reference frontier: Dynamo's sizing with a reference predictor, plus a headroom knob
# Dynamo does not have, swept so that some setting spends what fleetplan's defaults spend.
# fleetplan's point is compared with this curve at equal GPU-hours (`--variants frontier`).
FRONTIER: dict[str, dict] = {
    f"dynamo ({p}) util{u:g}": {**REFERENCE_SIZING, "load_predictor": p, "target_utilization": u}
    for p in ("arima", "kalman") for u in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
}
VARIANTS.update(FRONTIER)

# Issue 5's frontier: fleetplan's sizing with the reference's forecasting (point forecast of
# the next window) and predictors, headroom swept, against the defaults (startup quantile) at
# equal GPU-hours (`--variants forecast-frontier`).
FORECAST_FRONTIER: dict[str, dict] = {
    f"reference forecast ({p}) util{u:g}": {**REFERENCE_FORECAST, "load_predictor": p, "target_utilization": u}
    for p in predictors("reference-forecast") for u in (0.9, 0.8, 0.7, 0.6, 0.55, 0.5)
}  # constant, arima_frozen, kalman, and prophet where the extra is installed
VARIANTS.update(FORECAST_FRONTIER)
# past the frontier's half, where the default spends more than the reference at 0.5 (m-mid's day 4),
# and between 0.7 and 0.6, where a verdict rests on the line between them (m-mid's day 5)
VARIANTS.update({f"reference forecast (constant) util{u:g}": {**REFERENCE_FORECAST, "load_predictor": "constant",
                                                             "target_utilization": u} for u in (0.65, 0.45, 0.4)})
# between 0.55 and 0.5, where code at 0.9× rests on the line between them
VARIANTS.update({f"reference forecast ({p}) util0.525": {**REFERENCE_FORECAST, "load_predictor": p,
                                                         "target_utilization": 0.525}
                 for p in ("constant", "arima_frozen", "kalman")})
# The defaults with replay-based retune (sim/retune.py, docs/retune.md): every window, the
# headroom that served the last one best is chosen by replaying it, not read with hindsight.
# A 30-minute trace never calibrates its P90, so target_utilization is its headroom; a day
# runs on calibrated_utilization from its eleventh tick on.
RETUNE: dict[str, dict] = {
    "fleetplan (ensemble) +retune": {
        "interval_seconds": 540, "grace_seconds": 60, "planner": {"target_utilization": [0.7, 0.8, 0.9]}},
    "fleetplan (ensemble) +retune1h": {
        "interval_seconds": 3600, "grace_seconds": 60, "planner": {"calibrated_utilization": [0.8, 0.9, 0.95]}},
    # +retune with Dynamo's predictor pre-sweep over the ensemble, constant and kalman
    "fleetplan (ensemble) +retune+predictors": {
        "interval_seconds": 540, "grace_seconds": 60, "planner": {"target_utilization": [0.7, 0.8, 0.9]},
        "load_predictor": [{"load_predictor": "ensemble"}, {"load_predictor": "constant"},
                           {"load_predictor": "kalman"}]},
}
# the hourly retune as the ServeGen file measured it, on the default before 2026-12-04
RETUNE["fleetplan (ensemble) -coverage +retune1h"] = RETUNE["fleetplan (ensemble) +retune1h"]
VARIANTS.update({name: {**VARIANTS["fleetplan (ensemble) -coverage" if "-coverage" in name else "fleetplan (ensemble)"]}
                 for name in RETUNE})
GROUPS = {"frontier": FRONTIER, "forecast-frontier": FORECAST_FRONTIER, "departures": DEPARTURES}
ABLATION = [name for name in VARIANTS if not any(name in group for group in GROUPS.values())]
# the variants below measured before decode held its engines until the quantile scored a forecast
# (hold_until_scored: decode, 2026-12-06) keep releasing on the first tick, as their rows were run
RELEASE_FIRST = {"hold_until_scored": "none"}
# the defaults with each role sized for the quantile of its own tokens (docs/sizing.md); asked for by name
VARIANTS["fleetplan (ensemble) tokens"] = {"load_predictor": "ensemble", "quantile_basis": "tokens", **RELEASE_FIRST}
# the default until 2026-12-06: every count on the request count, prefill's queueing floor too (docs/sizing.md)
VARIANTS["fleetplan (ensemble) requests-basis"] = {"load_predictor": "ensemble", "quantile_basis": "requests",
                                                    **RELEASE_FIRST}
# the default until 2026-12-06 (later that day): every role released on the first tick; and every role held
# until the quantile has scored a forecast, prefill too (docs/sizing.md; bench/results/hold-until-scored),
# both measured before prefill's queueing floor kept the forecast's headroom; and the default until
# 2026-12-07, decode alone held (hold_until_scored: all, every role, is the default since)
NO_FLOOR_MARGIN = {"floor_headroom": "none"}
HOLD_DECODE = {"hold_until_scored": "decode"}
VARIANTS["fleetplan (ensemble) hold-none"] = {"load_predictor": "ensemble", "hold_until_scored": "none",
                                              **NO_FLOOR_MARGIN}
VARIANTS["fleetplan (ensemble) hold-all"] = {"load_predictor": "ensemble", "hold_until_scored": "all",
                                             **NO_FLOOR_MARGIN}
VARIANTS["fleetplan (ensemble) hold-decode"] = {"load_predictor": "ensemble", **HOLD_DECODE}
# prefill's queueing floor without the headroom for the forecast's error before the quantile is
# conformal, the default until floor_headroom: coverage (docs/sizing.md; bench/results/floor-headroom),
# measured while decode alone was held
VARIANTS["fleetplan (ensemble) floor-none"] = {"load_predictor": "ensemble", **NO_FLOOR_MARGIN, **HOLD_DECODE}
VARIANTS["fleetplan (ensemble) tokens util0.9"] = {**VARIANTS["fleetplan (ensemble) tokens"], "target_utilization": 0.9}
# decode's demand, as measured before quantile_basis: floor_tokens (on the request basis):
# decode's counts sized for the window's own count's quantile, not the busiest minute's (docs/sizing.md)
VARIANTS["fleetplan (ensemble) decode-window"] = {**VARIANTS["fleetplan (ensemble) requests-basis"], "decode_demand": "window"}
# decode's slot-wait count held to the share of the window's requests that wait too long (docs/sizing.md;
# the default since 2026-12-06), and the default before it, whose rows bench/results/decode-weighted keeps
VARIANTS["fleetplan (ensemble) decode-weighted"] = {**VARIANTS["fleetplan (ensemble) requests-basis"], "decode_demand": "weighted"}
VARIANTS["fleetplan (ensemble) decode-burst"] = {**VARIANTS["fleetplan (ensemble) requests-basis"], "decode_demand": "burst"}
# both: each role on its own tokens' quantile, decode on the window's rather than the busiest minute's
VARIANTS["fleetplan (ensemble) tokens decode-window"] = {**VARIANTS["fleetplan (ensemble) tokens"], "decode_demand": "window"}
# Every variant above was run with prefill rated at its best batch (prefill_capacity: best, the default
# until 2026-12-07) and keeps it, so it runs again to its committed rows; the defaults and the departures
# from them follow today's
LIVE = {"fleetplan (ensemble)", *DEPARTURES}
for _name, _overrides in VARIANTS.items():
    if _name not in LIVE:
        _overrides.setdefault("prefill_capacity", "best")
# prefill's rate count at what an engine with a queue sustains, its passes packed to max_num_batched_tokens
# (the default since 2026-12-07: its rows keep the name they were run under), and the same for every use
# of prefill's rate, the queueing floor's too (docs/sizing.md; bench/results/prefill-capacity); and the
# default before, prefill at its best batch everywhere
VARIANTS["fleetplan (ensemble) backlog"] = {"load_predictor": "ensemble", "prefill_capacity": "backlog"}
VARIANTS["fleetplan (ensemble) backlog-all"] = {"load_predictor": "ensemble", "prefill_capacity": "backlog_all"}
VARIANTS["fleetplan (ensemble) best"] = {"load_predictor": "ensemble", "prefill_capacity": "best"}
# the reference's forecasting swept with the default's backlogged prefill rate, as the default runs
# (`--variants forecast-frontier-backlog`; bench/frontier.py --reference-sizing backlog reads it)
FORECAST_FRONTIER_BACKLOG = {f"{name} backlog": {**overrides, "prefill_capacity": "backlog"}
                             for name, overrides in FORECAST_FRONTIER.items()}
VARIANTS.update(FORECAST_FRONTIER_BACKLOG)
GROUPS["forecast-frontier-backlog"] = FORECAST_FRONTIER_BACKLOG

# Scales chosen by bench/quality.py (busiest minute >= 10 engines at 500/50).
SCALES = {"azure-conv-30min": 34.0, "azure-code-30min": 50.0, "mooncake-conv-30min": 6.0,
          "mooncake-conv-30min-spread": 6.0, "servegen-m-large-24h": 0.1714, "servegen-m-mid-24h": 0.0667}


def run_variant(spec: Spec, sla, name: str) -> dict:
    from fleetplan.models.planner import Planner
    from fleetplan.sim.experiment import initial_fleet, run_oracle, run_planner, size_workload
    from fleetplan.sim.forecast_check import run_coverage
    from fleetplan.sim.retune import Retuner, load_retune

    # ARIMA unless the variant says otherwise: the ablations in docs/sizing.md were measured
    # with it, the default predictor until 2026-12-01 ("fleetplan (ensemble)" is today's)
    overrides = {} if name == "oracle" else {"load_predictor": "arima", **VARIANTS[name]}
    cfg, setup = make_setup(spec, sla, overrides)
    workload = build_workload(spec)
    sizing = size_workload(workload, setup)
    t0 = time.perf_counter()
    if name == "oracle":
        result = run_oracle(workload, setup, sizing, goal=0.99, rounds=5)
    else:
        retune = Retuner(load_retune(RETUNE[name]), setup, setup.profile) if name in RETUNE else None
        result = run_planner(workload, setup, Planner(cfg, profile=setup.profile),
                             initial_fleet("warm", setup, sizing, workload), retune=retune,
                             seed=warm_history(spec, cfg))
    row = _row(spec, sla, name, result, time.perf_counter() - t0, setup=setup)
    if name != "oracle":
        row["forecast"] = run_coverage(result, workload, cfg)  # the point's error, the sized quantile's misses
    if result.retune is not None:
        row["retune"] = [
            {**{k: d[k] for k in ("window", "decided_at", "outcome", "changes")},
             "candidates": [{k: c[k] for k in ("changes", "attainment", "gpu_hours", "score")} for c in d["candidates"]],
             **({"predictor_presweep": d["predictor_presweep"]} if "predictor_presweep" in d else {})}
            for d in result.retune
        ]
    return row


def _task(args):
    return run_variant(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--only", default="conv,code,mooncake",
                        help=f"workloads, comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--sla", default="500,50")
    parser.add_argument("--variants", default=",".join(ABLATION),
                        help="variant names, comma-separated; 'frontier' adds the reference sweep, "
                             "'forecast-frontier' the reference forecasting's ('forecast-frontier-backlog' with "
                             "prefill at the default's backlogged rate), 'departures' today's defaults "
                             "with each departure from Dynamo's sizing taken away")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--no-oracle", dest="oracle", action="store_false",
                        help="skip the oracle (slow on a day: six replays); ratios need it")
    parser.add_argument("--load-factors", default="1",
                        help="multiples of each workload's recorded rate scale to run it at, comma-separated "
                             "(e.g. 0.9,1,1.1: is a verdict a property of the policy or of one load level?)")
    parser.add_argument("--day", type=int, default=None,
                        help="ServeGen: run day D of the week (0-6) instead of day 0")
    parser.add_argument("--warm-days", type=int, default=0,
                        help="ServeGen: feed the planner's forecaster the W days before --day first, "
                             "as a deployment that has been running (sim/warm.py)")
    parser.add_argument("--rate-scale-shift", type=float, default=None, metavar="S",
                        help="traces: shift each rate-scale copy within S seconds either way, keeping the "
                             "trace's shape over time (fleetplan simulate --rate-scale-shift); the workload "
                             "is named with -shiftS. Default: anywhere in the window, as recorded")
    parser.add_argument("--choose-scale", action="store_true",
                        help="traces: choose each trace's rate scale by bench/quality.py's rule (the fewest "
                             "copies whose busiest window needs 10 engines at 500/50, whatever --sla) on the "
                             "trace as it runs here, "
                             "with --rate-scale-shift, instead of the recorded scale chosen for the "
                             "flattened trace; --load-factors multiply it")
    parser.add_argument("--seeds", default="0",
                        help="draws to run each workload at, comma-separated (the seed of the rate-scale "
                             "copies' shifts, spread arrivals, ServeGen's requests and startup times, as "
                             "fleetplan simulate --seed); a workload drawn at a seed other than 0 is named "
                             "with -seedN. Is a verdict a property of the policy or of one draw?")
    add_engine_options(parser, "traces: run on this bundled engine profile instead of the H200 Llama-3.1-8B "
                               "the recorded scales and defaults were measured on (a profile held out of the "
                               "tuning); the scale is chosen for it as --choose-scale does, and the workload "
                               "is named with -PROFILE (-PROFILE-tpN with --tp)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rate_scale_shift(parser, args.rate_scale_shift)
    try:
        factors = [float(f) for f in args.load_factors.split(",") if f.strip()]
    except ValueError:
        factors = []
    if not factors or not all(f > 0 for f in factors):
        parser.error(f"--load-factors: positive numbers, comma-separated, got {args.load_factors!r}")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) < len(seeds):
        parser.error(f"--seeds: distinct whole numbers >= 0, comma-separated, got {args.seeds!r}")
    sla = sla_pair(parser, args.sla)
    engine = held_out_engine(parser, args.profile, args.tp)
    chosen = []
    for s in specs(args.data, only_workloads(parser, args.only), 10, 24, 24.0, choose=False):
        if engine is not None and s.kind == "trace" and (args.profile, args.tp) != (s.profile, s.tp):
            s = replace(s, profile=args.profile, tp=args.tp, name=s.name + engine)
        s = replace(s, timing=args.engine_timing)
        base = SCALES.get(s.name, s.scale)
        if (args.choose_scale or s.name not in SCALES) and s.kind == "trace":
            base = choose_scale(replace(s, shift=args.rate_scale_shift), 10, integer=True).scale
            print(f"{s.name}: rate scale {base:g} by the busiest window", flush=True)
        # named after the recorded scales, which are the interp engine's, are looked up
        s = replace(s, name=s.name + TIMING_SUFFIX[s.timing])
        scaled = [replace(s, scale=base * f) for f in factors]
        if args.rate_scale_shift is not None and s.kind == "trace":
            scaled = [replace(x, shift=args.rate_scale_shift, name=f"{x.name}-shift{args.rate_scale_shift:g}")
                      for x in scaled]
        if args.day is not None or args.warm_days:
            try:
                scaled = [on_day(x, args.day or 0, args.warm_days) for x in scaled]
            except ValueError as err:
                parser.error(str(err))
        chosen += [replace(x, seed=n, name=x.name + (f"-seed{n}" if n else "")) for x in scaled for n in seeds]
    asked = [v.strip() for v in args.variants.split(",") if v.strip()]
    asked = [name for v in asked for name in GROUPS.get(v, [v])]
    unknown = [v for v in asked if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    names = [*(["oracle"] if args.oracle else []), *asked]
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
        oracle = next((r for r in rows if r["workload"] == row["workload"] and r["scale"] == row["scale"]
                       and r["policy"] == "oracle"), None)
        ratio = f"{row['gpu_hours'] / oracle['gpu_hours']:.2f}" if oracle else ""
        print(f"| {row['workload']} x{row['scale']:g} | {row['policy']} | {row['attainment']:.2%} | "
              f"{row['gpu_hours']:.2f} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps({"sla": sla, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
