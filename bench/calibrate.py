"""Calibration: does a simulated engine reproduce what was measured?

Usage (the shared data folder is an argument):

    .venv/bin/python bench/calibrate.py --data /work/shared/data [--md calibration.md]

Three checks, printed as markdown tables (docs/calibration.md holds a run):

1. **Profile points, one engine at a time.** Each prefill NPZ row: one
   prompt of that ISL on an idle simulated prefill engine (chunked at
   ``max_num_batched_tokens`` = 8192), TTFT against the measured TTFT. Each
   decode NPZ row: the batch the row describes (``kv_usage·max_kv / ctx``
   sequences at that context) on an idle simulated decode engine, ITL over
   50 steps against the measured ITL. For contrast, the planner's own linear
   fit of the same profile (``--engine-timing fit``) at the same points.
2. **Between context levels, held out.** The simulated engine interpolates
   decode ITL between the measured context levels linearly in 1/context
   (linear in the batch at a fixed KV usage). Each inner level is dropped in
   turn and predicted from its two neighbours, in 1/context and, for
   contrast, linearly in the context itself; mean and largest error against
   the measured rows.
3. **A measured serving curve.** DistServe's vLLM runs of OPT-13B on one
   A100 (37 runs with Poisson arrivals, one JSON line per request): each run
   replayed request for request (same issue times, prompt and output
   lengths) against one simulated aggregated engine whose profile is
   DistServe's fitted vLLM coefficients; TTFT and TPOT percentiles against
   the measured ones, and the rate at which TTFT p90 breaks.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from fleetplan.models.config import config_from_dict
from fleetplan.models.perf import EngineLimits
from fleetplan.sim.baselines import StaticPolicy
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.engines import Engine, SimRequest
from fleetplan.sim.experiment import run_policy
from fleetplan.sim.profile_convert import distserve_profile
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.runner import SimOptions, make_setup
from fleetplan.sim.timing import engine_timing
from fleetplan.sim.traces import TraceRequest
from fleetplan.sim.workload import Workload


class _Sink:
    def __init__(self):
        self.done = []

    def request_finished(self, req, engine, now):
        req.end = now
        self.done.append(req)

    def prompt_done(self, req, engine, now):
        req.prefill_end = now
        self.done.append(req)

    def engine_drained(self, engine):
        pass


def _engine(role, timing, limits):
    clock = VirtualClock()
    sink = _Sink()
    engine = Engine(f"{role}-0", role, 1, timing, limits, clock, sink, 0.0)
    engine.state = "ready"
    return engine, clock, sink


def lone_prompt_ttft(timing, limits, isl: int) -> float:
    engine, clock, sink = _engine("prefill", timing, limits)
    engine.enqueue(SimRequest(0, 0.0, isl, 2))
    while clock.step():
        pass
    return sink.done[0].prefill_end


def batch_itl(timing, limits, seqs: int, ctx: float, steps: int = 50) -> float:
    engine, clock, sink = _engine("decode", timing, limits)
    isl = max(1, int(round(ctx)) - steps // 2)  # mid-run context = the row's context
    for i in range(seqs):
        req = SimRequest(i, 0.0, isl, steps + 1)
        req.first_token = 0.0
        engine.enqueue(req)
    while clock.step():
        pass
    return max(r.end for r in sink.done) / steps


def profile_points(name: str, tp: int | None) -> str:
    profile = load_profile(name, tp=tp)
    limits = EngineLimits(max_kv_tokens=profile.max_kv_tokens)
    interp = engine_timing(profile, "interp")
    fit = engine_timing(profile, "fit", limits)
    # The profiler ran each prompt in one pass; the default 8,192-token budget chunks longer ones.
    unchunked = EngineLimits(max_num_batched_tokens=32_768, max_kv_tokens=profile.max_kv_tokens)
    lines = [f"#### {name} (TP{profile.tp}), prefill: TTFT of one prompt on an idle engine\n",
             "| ISL | measured ms | simulated ms | error | chunked at 8,192 ms | error | planner's linear fit ms | fit error |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errs, chunk_errs = [], []
    for isl, ttft in zip(profile.prefill_isl.tolist(), profile.prefill_ttft_ms.tolist(), strict=True):
        sim = lone_prompt_ttft(interp, unchunked, int(isl)) * 1000
        chunked = lone_prompt_ttft(interp, limits, int(isl)) * 1000
        lin = lone_prompt_ttft(fit, unchunked, int(isl)) * 1000
        errs.append(abs(sim / ttft - 1))
        chunk_errs.append(abs(chunked / ttft - 1))
        lines.append(
            f"| {int(isl):,} | {ttft:.1f} | {sim:.1f} | {sim / ttft - 1:+.1%} | {chunked:.1f} | "
            f"{chunked / ttft - 1:+.1%} | {lin:.1f} | {lin / ttft - 1:+.1%} |"
        )
    lines.append(
        f"\nLargest simulated error: {max(errs):.1%} in one pass (as profiled); {max(chunk_errs):.1%} "
        "when prompts above 8,192 tokens are chunked at the default budget.\n"
    )
    lines += [f"#### {name} (TP{profile.tp}), decode: ITL of a batch on an idle engine\n",
              "| KV usage | context | sequences | measured ms | simulated ms | error | linear fit ms | fit error |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errs = []
    skipped = 0
    for u, ctx, itl in zip(profile.x_kv_usage.tolist(), profile.y_context_length.tolist(), profile.z_itl_ms.tolist(), strict=True):
        seqs = u * profile.max_kv_tokens / ctx
        if seqs < 0.5 or round(seqs) > 4096:
            skipped += 1
            continue
        seqs = max(1, round(seqs))
        sim = batch_itl(interp, EngineLimits(max_num_seqs=4096, max_kv_tokens=profile.max_kv_tokens), seqs, ctx) * 1000
        lin = batch_itl(fit, EngineLimits(max_num_seqs=4096, max_kv_tokens=profile.max_kv_tokens), seqs, ctx) * 1000
        errs.append(abs(sim / itl - 1))
        lines.append(f"| {u:.3f} | {ctx:,.0f} | {seqs} | {itl:.2f} | {sim:.2f} | {sim / itl - 1:+.1%} | {lin:.2f} | {lin / itl - 1:+.1%} |")
    lines.append(f"\nLargest simulated error: {max(errs):.1%} over {len(errs)} rows"
                 + (f" ({skipped} rows with under half a sequence skipped)" if skipped else "") + ".\n")
    return "\n".join(lines)


def held_out_levels(name: str, tp: int | None) -> str:
    """Predict each inner context level from its neighbours: in 1/context and in context."""
    profile = load_profile(name, tp)
    rows = profile.decode_levels()
    levels = list(rows)
    lines = [f"#### {name} (TP{profile.tp})\n",
             "| held-out context | from | rows | in 1/context: mean | max | in context: mean | max |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for below, ctx, above in zip(levels[:-2], levels[1:-1], levels[2:], strict=True):
        (usage, itl), (u0, t0), (u1, t1) = rows[ctx], rows[below], rows[above]
        inside = (usage >= max(u0[0], u1[0])) & (usage <= min(u0[-1], u1[-1]))
        if not inside.any():
            continue
        lo, hi = np.interp(usage[inside], u0, t0), np.interp(usage[inside], u1, t1)
        w_inverse = (1 / below - 1 / ctx) / (1 / below - 1 / above)
        w_linear = (ctx - below) / (above - below)
        e_inv = np.abs((lo + (hi - lo) * w_inverse) / itl[inside] - 1)
        e_lin = np.abs((lo + (hi - lo) * w_linear) / itl[inside] - 1)
        lines.append(f"| {ctx:,.0f} | {below:,.0f} and {above:,.0f} | {int(inside.sum())} | {e_inv.mean():.1%} | "
                     f"{e_inv.max():.1%} | {e_lin.mean():.1%} | {e_lin.max():.1%} |")
    return "\n".join(lines) + "\n"


def distserve_curve(data: Path) -> str:
    folder = data / "profiles" / "distserve"
    profile = distserve_profile(folder / "profiler-a100-80g.vllm.json", "facebook/opt-13b", 1)
    summary = [line.split(",") for line in (folder / "summary_ttft_tpot_vs_rate.csv").read_text().splitlines()]
    header, rows = summary[0], summary[1:]
    col = {h: i for i, h in enumerate(header)}
    vllm = [r for r in rows if r[col["system"]] == "vllm"]
    cfg = config_from_dict({
        "mode": "agg", "max_num_batched_tokens": 2560, "max_num_seqs": 256, "max_kv_tokens": profile.max_kv_tokens,
        "max_gpu_budget": 64,
    })
    # The measured runs predate chunked prefill: prompts run in passes of their own.
    setup = make_setup(cfg, profile, SimOptions(agg_scheduler="prefill-first"))
    lines = ["| run | rate req/s | measured TTFT p50 / p90 / p99 ms | simulated | measured TPOT p50 / p90 ms | simulated |",
             "|---|---:|---:|---:|---:|---:|"]
    curve = []
    for r in sorted(vllm, key=lambda r: float(r[col["nominal_rate"]])):
        raw = [json.loads(x) for x in (folder / "raw" / f"{r[col['file']]}.jsonl").read_text().splitlines() if x.strip()]
        t0 = min(x["issue_time"] for x in raw)
        reqs = sorted((TraceRequest(x["issue_time"] - t0, int(x["prompt_len"]), int(x["output_len"])) for x in raw),
                      key=lambda q: q.arrival_s)
        workload = Workload.from_requests(r[col["file"]], reqs, math.ceil(reqs[-1].arrival_s) + 1)
        result = run_policy(workload, setup, StaticPolicy({"agg": 1}), "vllm", {"agg": 1})
        a = result.requests.arrays()
        ttft = np.percentile(a["ttft"], [50, 90, 99]) * 1000
        itl = a["itl"][~np.isnan(a["itl"])]
        tpot = np.percentile(itl, [50, 90]) * 1000
        rate = float(r[col["nominal_rate"]])
        m_ttft = [float(r[col[k]]) for k in ("ttft_p50", "ttft_p90", "ttft_p99")]
        m_tpot = [float(r[col[k]]) for k in ("tpot_p50", "tpot_p90")]
        curve.append((rate, m_ttft[1], ttft[1]))
        lines.append(
            f"| {r[col['file']]} | {rate:g} | {m_ttft[0]:,.0f} / {m_ttft[1]:,.0f} / {m_ttft[2]:,.0f} | "
            f"{ttft[0]:,.0f} / {ttft[1]:,.0f} / {ttft[2]:,.0f} | {m_tpot[0]:.0f} / {m_tpot[1]:.0f} | "
            f"{tpot[0]:.0f} / {tpot[1]:.0f} |"
        )
    breaks = {}
    for label, idx in (("measured", 1), ("simulated", 2)):
        ok = [rate for rate, *v in curve if v[idx - 1] <= 1000.0]
        bad = [rate for rate, *v in curve if v[idx - 1] > 1000.0]
        breaks[label] = (max(ok) if ok else None, min(bad) if bad else None)
    lines.append(
        "\nTTFT p90 breaks (first rate above 1 s): measured between "
        f"{breaks['measured'][0]} and {breaks['measured'][1]} req/s, simulated between "
        f"{breaks['simulated'][0]} and {breaks['simulated'][1]} req/s."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args()
    parts = [
        "### Profile points\n",
        profile_points("h200-llama3.1-8b", None),
        profile_points("h100-llama3.3-70b", 2),
        "### Decode between context levels (each inner level held out)\n",
        held_out_levels("h200-llama3.1-8b", None),
        held_out_levels("h100-llama3.3-70b", 2),
        "### DistServe vLLM OPT-13B, one A100\n",
        distserve_curve(args.data),
    ]
    text = "\n".join(parts)
    if args.md:
        args.md.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
