"""Mean-request capacity against mix capacity, on the shared traces, checked on the simulated fleet.

Usage:

    .venv/bin/python bench/capacity_mix.py --data /work/shared/data [--window 180]

1. For every 180-s window of the 30-minute Azure conv, Azure code and
   Mooncake conversation traces, one engine's SLA-bound rate (H200
   Llama-3.1-8B profile, 500 ms / 50 ms) at the window's mean ISL/OSL and on
   its ISL/OSL mix (``fleetplan.models.mix``); the ratio per role
   (min / median / max over windows).
2. The window where the two disagree most for decode is replayed on the
   simulated fleet (same engine timing the planner's perf model reads),
   rate-scaled so the mean request needs a few decode engines, with ample
   prefill and each decode count from the mean-based count to past the
   mix-based one. The smallest count that meets the ITL target for 99% of
   the requests is the truth each estimate is judged against.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from fleetplan.models.config import config_from_dict
from fleetplan.models.mix import LengthMix, mix_capacity
from fleetplan.models.perf_models import make_perf_models
from fleetplan.models.throughput import engine_capacity
from fleetplan.sim.baselines import StaticPolicy
from fleetplan.sim.experiment import run_policy
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.runner import SimOptions, make_setup
from fleetplan.sim.traces import read_trace
from fleetplan.sim.workload import Workload, rate_scale, slice_trace

TRACES = {
    "azure-conv": "traces/azure2023/AzureLLMInferenceTrace_conv_first30min.csv",
    "azure-code": "traces/azure2023/AzureLLMInferenceTrace_code_first30min.csv",
    "mooncake-conv": "traces/mooncake/conversation_trace_first30min.jsonl",
}
PROFILE = "h200-llama3.1-8b"
SLA = (500.0, 50.0)


def capacity_fn(model, cfg):
    def capacity_at(isl: float, osl: float) -> float | None:
        cap = engine_capacity(model, cfg, isl, osl)
        return None if cap is None else cap.rps
    return capacity_at


def windows_of(reqs, window_s: float) -> list[tuple[float, LengthMix]]:
    out: dict[int, LengthMix] = {}
    for r in reqs:
        out.setdefault(int(r.arrival_s // window_s), LengthMix()).add(r.input_tokens, r.output_tokens)
    return [(i * window_s, out[i]) for i in sorted(out)]


def survey(data: Path, window_s: float, cfg, perf) -> list[dict]:
    rows = []
    for name, rel in TRACES.items():
        reqs = read_trace(data / rel)
        for start, mix in windows_of(reqs, window_s):
            row = {"trace": name, "start": start, "n": mix.count, "means": mix.means()}
            for role in ("prefill", "decode"):
                cap = capacity_fn(perf[role], cfg)
                row[role] = (cap(*mix.means()), mix_capacity(mix, cap))
            rows.append(row)
    return rows


def ratio_table(rows: list[dict]) -> str:
    lines = ["| trace | windows | mean ISL / OSL | prefill mix/mean min · median · max | decode mix/mean min · median · max |",
             "|---|---:|---|---|---|"]
    for name in TRACES:
        mine = [r for r in rows if r["trace"] == name]
        isl = sum(r["means"][0] * r["n"] for r in mine) / sum(r["n"] for r in mine)
        osl = sum(r["means"][1] * r["n"] for r in mine) / sum(r["n"] for r in mine)
        cells = [name, str(len(mine)), f"{isl:,.0f} / {osl:,.0f}"]
        for role in ("prefill", "decode"):
            ratios = sorted(r[role][1] / r[role][0] for r in mine)
            cells.append(f"{ratios[0]:.2f} · {ratios[len(ratios) // 2]:.2f} · {ratios[-1]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_on_fleet(data: Path, row: dict, window_s: float, cfg, setup, target_mean_engines: int) -> str:
    reqs = read_trace(data / TRACES[row["trace"]])
    window = slice_trace(reqs, row["start"], row["start"] + window_s)
    rate = len(window) / window_s
    cap_mean, cap_mix = row["decode"]
    # the most copies the mean request still fits in ``target_mean_engines``
    scale = max(1, math.floor(target_mean_engines * cap_mean / rate))
    scaled = rate_scale(window, scale, seed=0, duration_s=window_s)
    demand = len(scaled) / window_s
    n_mean = math.ceil(demand / cap_mean)
    n_mix = math.ceil(demand / cap_mix)
    workload = Workload.from_requests("window", scaled, window_s)
    prefill = max(4, math.ceil(demand / row["prefill"][1] * 2))  # ample: prefill is not under test
    lines = [
        f"Window {row['trace']} at {row['start']:.0f} s: {row['n']} requests, mean ISL {row['means'][0]:,.0f}, "
        f"mean OSL {row['means'][1]:,.0f}; rate-scaled ×{scale} to {demand:.1f} rps. One decode engine: "
        f"{cap_mean:.2f} rps for the mean request, {cap_mix:.2f} rps on the mix, so {n_mean} vs {n_mix} engines. "
        f"Replayed with {prefill} prefill engines:",
        "",
        "| decode engines | ITL ≤ 50 ms | ITL p90 ms | TTFT ≤ 500 ms |",
        "|---:|---:|---:|---:|",
    ]
    for k in range(n_mean, n_mix + 2):
        result = run_policy(workload, setup, StaticPolicy({"prefill": prefill, "decode": k}), "static")
        s = result.summary
        lines.append(f"| {k} | {s.itl_attainment:.2%} | {s.itl_p90_ms:.1f} | {s.ttft_attainment:.2%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--window", type=float, default=180.0)
    parser.add_argument("--mean-engines", type=int, default=3,
                        help="rate-scale the checked window until the mean request needs this many decode engines")
    args = parser.parse_args()
    cfg = config_from_dict({"ttft_ms": SLA[0], "itl_ms": SLA[1], "max_gpu_budget": 4096})
    profile = load_profile(PROFILE)
    perf = make_perf_models(cfg, profile)
    rows = survey(args.data, args.window, cfg, perf)
    print(ratio_table(rows))
    print()
    worst = min(rows, key=lambda r: r["decode"][1] / r["decode"][0])
    setup = make_setup(cfg, profile, SimOptions(window_s=60.0))
    print(check_on_fleet(args.data, worst, args.window, cfg, setup, args.mean_engines))


if __name__ == "__main__":
    main()
