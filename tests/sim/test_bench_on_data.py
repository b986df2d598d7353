"""The bench scripts on the shared data folder: what they report, and what the docs read off them.

They read the 30-minute traces in the shared data folder (the project's
machine); elsewhere they skip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DATA = Path("/work/shared/data")

pytestmark = [pytest.mark.skipif(not (DATA / "traces").is_dir(), reason="needs the shared data folder"),
              pytest.mark.slow]


def _table(script: str, *args: str) -> list[list[str]]:
    """The rows of the last markdown table the script prints, as cells."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--data", str(DATA), *args],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=True).stdout
    tables = out.split("\n\n")
    rows = [line.strip("|").split("|") for line in tables[-1].strip().splitlines()[2:]]
    return [[cell.strip() for cell in row] for row in rows]


def test_fixed_fleet_counts_an_answer_no_decode_engine_served_as_missing_the_itl():
    """A request never served has no ITL (NaN, as a one-token answer has): it was counted as
    meeting it, and a fleet with no decode engine met the ITL for 100 % of its requests."""
    (row,) = _table("fixed_fleet.py", "--workload", "mooncake-conv-30min", "--seed", "1", "--scales", "6",
                    "--fleet", "prefill=24", "--vary", "decode=0")
    itl, short = row[5], row[6]
    assert float(itl.rstrip("%")) < 1.0  # the one-token answers, which meet any ITL
    assert short.endswith(", 0.00%")


def test_fixed_fleet_says_so_where_a_scale_leaves_no_request():
    """A scale so small that no request is left ended in an empty array's max (a traceback)."""
    rows = _table("fixed_fleet.py", "--workload", "mooncake-conv-30min", "--scales", "1e-9", "--fleet", "prefill=1",
                  "--vary", "decode=1")
    assert [row[:4] for row in rows] == [["1e-09", "0", "{'prefill': 1, 'decode': 1}", "no requests at this scale"]]


def test_five_prefill_engines_at_tp4_miss_the_rate_the_best_batch_rates_them_for():
    """docs/sizing.md (prefill's rate under a backlog): on the 70B at TP4, conv ×10.8 at 1200/50 on a
    fixed fleet; the planner rates five engines at 73.5 prompts a second (14.7 each), and 60.65 is
    more than they serve."""
    rows = _table("fixed_fleet.py", "--workload", "azure-conv-30min", "--profile", "h100-llama3.3-70b", "--tp", "4",
                  "--sla", "1200,50", "--scales", "9.5,10,10.8", "--fleet", "decode=8", "--vary", "prefill=5,6")
    assert [row[:5] for row in rows] == [
        ["9.5", "53.33", "{'decode': 8, 'prefill': 5}", "99.94%", "99.94%"],
        ["9.5", "53.33", "{'decode': 8, 'prefill': 6}", "100.00%", "100.00%"],
        ["10", "56.16", "{'decode': 8, 'prefill': 5}", "99.00%", "99.00%"],
        ["10", "56.16", "{'decode': 8, 'prefill': 6}", "100.00%", "100.00%"],
        ["10.8", "60.65", "{'decode': 8, 'prefill': 5}", "74.75%", "74.75%"],
        ["10.8", "60.65", "{'decode': 8, 'prefill': 6}", "100.00%", "100.00%"],
    ]


def test_the_rate_decode_sizes_for_on_mooncake_at_seed_1_is_the_range_sizing_md_states():
    """docs/sizing.md (decode sized for the burst's backlog): the busiest minute's P90 from the
    second tick on, and decode's rate per engine, as bench/per_minute.py prints them."""
    ticks = _table("per_minute.py", "--workload", "mooncake-conv-30min", "--seed", "1",
                   "--set", "load_predictor=ensemble", "--set", "decode_demand=burst")[1:]
    sized = [float(row[4]) for row in ticks]
    per_engine = [float(row[7]) for row in ticks]
    text = " ".join((ROOT / "docs" / "sizing.md").read_text().split())
    assert (f"the busiest minute's P90, is {min(sized):.1f}–{max(sized):.1f} requests a second from the "
            f"second tick on, under four engines' rate (4 × {min(per_engine):.1f}–{max(per_engine):.1f})") in text
    assert max(sized) < 4 * min(per_engine)


def test_the_tp4_conv_row_sizes_decode_as_forecasting_md_states():
    """docs/forecasting.md (the 70B at TP4): decode's rate per engine at the batch limit, and the busiest
    minute's P90 it sizes for from the second tick on, as bench/per_minute.py prints them for conv x12."""
    ticks = _table("per_minute.py", "--workload", "azure-conv-30min", "--profile", "h100-llama3.3-70b", "--tp", "4",
                   "--scale", "12", "--set", "load_predictor=ensemble")
    per_engine = [float(row[7]) for row in ticks]
    sized = [float(row[4]) for row in ticks[1:]]
    text = " ".join((ROOT / "docs" / "forecasting.md").read_text().split())
    assert (f"It rates a decode engine at {min(per_engine):.1f}–{max(per_engine):.1f} requests a second at the "
            f"batch limit and sizes for the busiest minute's P90, {min(sized):.0f}–{max(sized):.0f} requests a "
            "second") in text
    assert all(row[1].endswith("'decode': 5}") for row in ticks[1:])  # the slot count's 5 from the second tick
