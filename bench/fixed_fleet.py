"""What a fixed fleet meets on a quality workload held at several rates: the simulator's answer to a sizing model.

Usage:

    .venv/bin/python bench/fixed_fleet.py --data /work/shared/data --workload mooncake-conv-30min \\
        --scales 6,6.6,7.2 --fleet prefill=24 --vary decode=3,4 [--seed 1] [--sla 500,50] \\
        [--profile h100-llama3.3-70b [--tp 4]] [--engine-timing interp-extend]

The planner's queueing models (the prefill floor, decode's slot-wait count)
are stationary: they say what share of requests a fleet of ``n`` engines
keeps within the SLA at a rate that lasts. A run of the planner cannot tell
whether such a model is right, since its fleet moves with the forecast. Here
the fleet does not move: the workload at each rate scale (``--scales``, its
whole 30 minutes at that scale) runs on the fixed ``--fleet`` with the role
in ``--vary`` at each count, and the table gives the share meeting each
target, for the short answers (2–63 tokens, whose slot budgets are the
smallest) too, and the ITL percentiles. A role held far above its need
(``--fleet prefill=24`` on Mooncake ×6) takes it out of the picture.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
from quality import (
    add_engine_options,
    build_workload,
    draw_seed,
    held_out_engine,
    make_setup,
    named_trace_spec,
    on_engine,
    sla_pair,
)

from fleetplan.sim.baselines import StaticPolicy
from fleetplan.sim.experiment import run_policy

SHORT_ANSWER = (2, 64)  # output tokens [lo, hi): the answers whose slot budgets are the smallest


def _counts(parser: argparse.ArgumentParser, option: str, text: str) -> dict[str, list[int]]:
    """``role=n[,n...]`` pairs separated by spaces or ';' into ``{role: [n, ...]}``; usage errors name the option."""
    out: dict[str, list[int]] = {}
    for item in text.replace(";", " ").split():
        role, sep, values = item.partition("=")
        try:
            counts = [int(v) for v in values.split(",")] if sep and role else []
        except ValueError:
            counts = []
        if not counts or min(counts) < 0:
            parser.error(f"{option} {item!r}: expected ROLE=N[,N...] with whole numbers >= 0, e.g. decode=3,4")
        if role in out:
            parser.error(f"{option} {item!r}: {role} is given twice")
        out[role] = counts
    return out


def _positive_numbers(text: str) -> list[float]:
    """Comma-separated finite numbers > 0; [] if any is not one."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        return []
    return values if all(0 < v < float("inf") for v in values) else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--workload", required=True,
                        help="azure-conv-30min, azure-code-30min, mooncake-conv-30min or mooncake-conv-30min-spread")
    parser.add_argument("--scales", required=True, help="rate scales, comma-separated (the workload's copies)")
    parser.add_argument("--fleet", required=True, help="the fixed counts, e.g. prefill=24 (one count per role)")
    parser.add_argument("--vary", required=True, help="one role and its counts, e.g. decode=3,4")
    parser.add_argument("--seed", type=int, default=0, help="the draw of the workload (bench/sizing.py --seeds)")
    parser.add_argument("--sla", default="500,50", help="TTFT,ITL in ms")
    add_engine_options(parser, "run on this bundled engine profile (bench/sizing.py --profile); --scales are "
                               "that engine's rate scales")
    args = parser.parse_args()
    draw_seed(parser, args.seed)
    held_out_engine(parser, args.profile, args.tp)
    scales = _positive_numbers(args.scales)
    if not scales:
        parser.error(f"--scales: positive numbers separated by commas, got {args.scales!r}")
    fleet = _counts(parser, "--fleet", args.fleet)
    if any(len(v) != 1 for v in fleet.values()):
        parser.error(f"--fleet {args.fleet!r}: one count per role, e.g. prefill=24")
    vary = _counts(parser, "--vary", args.vary)
    if len(vary) != 1:
        parser.error(f"--vary {args.vary!r}: one role and its counts, e.g. decode=3,4")
    (role, counts), = vary.items()
    ttft_ms, itl_ms = sla_pair(parser, args.sla)
    base = on_engine(named_trace_spec(parser, args.data, args.workload), args)
    fixed = {r: v[0] for r, v in fleet.items()} | {role: 0}
    roles = make_setup(base, (ttft_ms, itl_ms))[1].roles  # the roles do not depend on the scale
    if set(fixed) != set(roles):
        parser.error(f"--fleet and --vary: a count for each of {', '.join(roles)}, got {', '.join(fixed)}")
    print("| scale | requests/s | fleet | both met | TTFT met | ITL met | short answers: share, ITL met "
          "| ITL p50 / p90 / p99 ms |")
    print("|---:|---:|---|---:|---:|---:|---:|---|")
    for scale in scales:
        spec = replace(base, scale=scale, seed=args.seed)
        _, setup = make_setup(spec, (ttft_ms, itl_ms))
        workload = build_workload(spec)
        for n in counts:
            targets = fixed | {role: n}
            a = run_policy(workload, setup, StaticPolicy(targets), "fixed", targets).requests.arrays()
            if not len(a["arrival"]):
                print(f"| {scale:g} | 0 | {targets} | no requests at this scale | | | | |", flush=True)
                continue
            ttft_ok = a["ttft"] * 1000.0 <= ttft_ms
            itl_ok = (a["osl"] <= 1) | (a["itl"] * 1000.0 <= itl_ms)  # NaN: one token, or never served
            short = (a["osl"] >= SHORT_ANSWER[0]) & (a["osl"] < SHORT_ANSWER[1])
            rate = len(a["arrival"]) / max(float(a["arrival"].max() - a["arrival"].min()), 1e-9)
            served = a["itl"][~np.isnan(a["itl"])]  # none when no decode engine served an answer
            p50, p90, p99 = (np.percentile(served, q) * 1000.0 if served.size else float("nan") for q in (50, 90, 99))
            print(f"| {scale:g} | {rate:.2f} | {targets} | {(ttft_ok & itl_ok).mean():.2%} | {ttft_ok.mean():.2%} | "
                  f"{itl_ok.mean():.2%} | {short.mean():.1%}, {itl_ok[short].mean() if short.any() else float('nan'):.2%} | "
                  f"{p50:.1f} / {p90:.1f} / {p99:.1f} |", flush=True)


if __name__ == "__main__":
    main()
