"""Run every row of a bench/sizing.py --json file again, on the simulator as it is now.

Usage:

    .venv/bin/python bench/remeasure.py --data /work/shared/data \
        bench/results/verdicts/azure-conv-500-50.json [--jobs 2] [--out new.json] [--only-policies A,B] \
        [--only-workloads W1,W2]

The verdict files (bench/results/verdicts/) hold the runs that
bench/frontier.py reads its verdicts from. When the simulator changes, every
one of those runs is stale at once; this re-runs each row (the same
workload, rate scale, SLA and variant, through ``bench/sizing.py``'s
``run_variant``) and writes the file back with the new figures, in the same
order, so the verdicts can be read again with nothing else changed. It
prints each row's attainment and GPU-hours before and after. Any row
bench/sizing.py writes can be run again: a ServeGen day of the week, a
trace with its shape kept (-shiftS), another draw (-seedN), a trace on a
held-out engine (-PROFILE[-tpN]) or timed past its profile's rows the other
way (-extend); the row's profile, tp and timing say which engine.

Without ``--out`` the file is rewritten in place. It is written again after each row, so a run
stopped partway keeps the rows it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from quality import EVERY_WORKLOAD, TIMING_SUFFIX, Spec, engine_suffix, on_day, specs
from sizing import VARIANTS, run_variant

SEED = re.compile(r"(?P<rest>.+)-seed(?P<seed>\d+)")
SHIFT = re.compile(r"(?P<rest>.+)-shift(?P<shift>\d+(?:\.\d+)?)")


def _known(data: Path) -> dict[str, Spec]:
    """Every workload bench/sizing.py knows, by its name at scale 1 on its own engine, with each
    ServeGen day of the week, cold or warmed on the days before (``--day``, ``--warm-days``)."""
    base = {s.name: s for s in specs(data, EVERY_WORKLOAD, 10, 24, 24.0, choose=False)}
    moved = [on_day(s, day, warm) for s in base.values() if s.kind == "servegen"
             for day in range(WEEK_DAYS) for warm in range(day + 1)]
    return {**base, **{s.name: s for s in moved}}


def workload_spec(row: dict, known: dict[str, Spec]) -> Spec | None:
    """The workload bench/sizing.py ran ``row`` on (at scale 1), or None if it names none.

    sizing.py names a run ``NAME[-PROFILE[-tpN]][-extend][-shiftS][-seedN]``: a trace on a held-out
    engine (``--profile``, ``--tp``), an engine timed past its profile's rows the other way
    (``--engine-timing interp-extend``), its rate-scale copies shifted within S seconds
    (``--rate-scale-shift``), drawn at seed N (``--seeds``). The row records its profile, tp and
    timing, so those suffixes are checked against them; the shift and the draw are in the name only.
    """
    name, seed, shift = row["workload"], 0, None
    if m := SEED.fullmatch(name):
        name, seed = m["rest"], int(m["seed"])
    if m := SHIFT.fullmatch(name):
        name, shift = m["rest"], float(m["shift"])
    timing = row.get("timing", "interp")
    if timing not in TIMING_SUFFIX or not name.endswith(TIMING_SUFFIX[timing]):
        return None
    name = name.removesuffix(TIMING_SUFFIX[timing])
    spec = known.get(name)
    profile, tp = row.get("profile"), row.get("tp")
    if spec is None and profile is not None:  # a trace run on a held-out engine
        engine = engine_suffix(profile, tp)
        spec = known.get(name.removesuffix(engine)) if name.endswith(engine) else None
        if spec is None or spec.kind != "trace":
            return None
    if spec is None or (shift is not None and spec.kind != "trace"):
        return None
    return replace(spec, name=row["workload"], profile=profile or spec.profile, tp=tp, timing=timing,
                   shift=shift, seed=seed)


WEEK_DAYS = 7  # the ServeGen curves are one week


def _task(args):
    index, spec, sla, policy = args
    return index, run_variant(spec, sla, policy)


def _named(parser, file: Path, option: str, value: str, present: set[str], noun: str) -> set[str]:
    """The names an ``--only-*`` option gives, each one the file has (none: every row)."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    if names - present:  # a misspelled name would re-run nothing and still rewrite the file
        parser.error(f"{option}: no row of {file} is {', '.join(map(repr, sorted(names - present)))}; "
                     f"its {noun}: {', '.join(sorted(present))}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only-policies", default="",
                        help="re-run only these policies (comma-separated); the other rows are kept as they are")
    parser.add_argument("--only-workloads", default="",
                        help="re-run only the rows of these workloads (comma-separated names as the rows carry "
                             "them); the other rows are kept as they are")
    args = parser.parse_args()
    doc = json.loads(args.file.read_text())
    sla = tuple(doc["sla"])
    rows = doc["rows"]
    only = _named(parser, args.file, "--only-policies", args.only_policies, {row["policy"] for row in rows}, "policies")
    only_workloads = _named(parser, args.file, "--only-workloads", args.only_workloads,
                            {row["workload"] for row in rows}, "workloads")
    known = _known(args.data)
    tasks = []
    copies: dict[tuple, list[int]] = {}  # a run is deterministic: a row repeated in the file runs once
    for i, row in enumerate(rows):
        if (only and row["policy"] not in only) or (only_workloads and row["workload"] not in only_workloads):
            continue
        key = (row["workload"], row["scale"], row["policy"])
        if key in copies:
            copies[key].append(i)
            continue
        copies[key] = [i]
        spec = workload_spec(row, known)
        if spec is None:
            parser.error(f"{args.file}: row {i}: workload {row['workload']!r} is not one bench/sizing.py runs")
        if row["policy"] != "oracle" and row["policy"] not in VARIANTS:
            parser.error(f"{args.file}: row {i}: policy {row['policy']!r} is not a bench/sizing.py variant")
        tasks.append((i, replace(spec, scale=row["scale"]), sla, row["policy"]))
    started = time.time()
    new_rows = list(rows)
    out = args.out or args.file
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, row in pool.map(_task, tasks):
            old = rows[i]
            for j in copies[(row["workload"], row["scale"], row["policy"])]:
                new_rows[j] = row
            _write(out, {**doc, "rows": new_rows})
            print(f"[{time.time() - started:5.0f}s] {row['workload']} x{row['scale']:g} {row['policy']}: "
                  f"{old['attainment']:.2%} {old['gpu_hours']:.2f} -> {row['attainment']:.2%} "
                  f"{row['gpu_hours']:.2f} GPU-h", flush=True)
    _write(out, {**doc, "rows": new_rows})  # also when no row was run
    print(f"{len(tasks)} runs for {sum(map(len, copies.values()))} rows in {time.time() - started:.0f} s; written to {out}")


def _write(out: Path, doc: dict) -> None:
    """Write the file as it stands after each row, whole or not at all: a re-run of the ServeGen days
    takes hours, and one stopped partway keeps the rows it finished (each carries its sim_revision,
    so the rows not yet run again still say which simulator measured them)."""
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(doc, indent=1))
    os.replace(partial, out)


if __name__ == "__main__":
    main()
