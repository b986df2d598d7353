"""The simulated prefill engine's tokens a second by pass size, as docs/sizing.md tabulates them.

``prefill_capacity: backlog`` rests on them peaking below the full pass a
backlogged engine packs (docs/sizing.md, "Prefill's rate under a backlog").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetplan.sim.profiles import load_profile
from fleetplan.sim.timing import engine_timing

SIZING_MD = Path(__file__).parents[2] / "docs" / "sizing.md"
PASSES = (1000, 2000, 4000, 7000, 8192)
ENGINES = {"H100 70B at TP4": ("h100-llama3.3-70b", 4), "H100 70B at TP2": ("h100-llama3.3-70b", 2),
           "H200 8B": ("h200-llama3.1-8b", None)}


def _table() -> dict[str, list[str]]:
    text = SIZING_MD.read_text()
    start = text.index("| engine | 1,000 tokens | 2,000 | 4,000 | 7,000 | 8,192 (a full pass) |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, *cells = (c.strip() for c in line.strip("|").split("|"))
        rows[name] = cells
    return rows


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_the_tokens_a_second_sizing_md_gives_are_the_simulated_engines(name):
    profile, tp = ENGINES[name]
    timing = engine_timing(load_profile(profile, tp=tp))
    rates = [tokens / timing.prefill_s(tokens) / 1000.0 for tokens in PASSES]
    cells = _table()[name]
    assert [float(re.sub(r"[^0-9.]", "", c.removesuffix("k/s"))) for c in cells] == [round(r, 1) for r in rates]
    peak = max(range(len(rates)), key=rates.__getitem__)
    assert cells[peak].startswith("**") and peak < len(PASSES) - 1  # the peak, bold, below the full pass
