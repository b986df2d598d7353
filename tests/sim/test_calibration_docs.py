"""docs/calibration.md's profile-point tables are what bench/calibrate.py prints today.

The tables are the simulator's own pass times against the bundled profiles,
deterministic to the printed digit, so a change to sim/timing.py that moves
them (revision 4 moved the decode rows at the shortest context level) must
move the page too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.calibrate import profile_points

DOC = Path(__file__).parents[2] / "docs" / "calibration.md"


def _section(text: str, heading: str) -> list[str]:
    """The table rows and the summary line under ``heading``, up to the next heading."""
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    body = text[start + len(heading):end if end >= 0 else None]
    return [line for line in body.splitlines() if line.startswith("|") or line.startswith("Largest")]


@pytest.mark.parametrize(("name", "tp"), [("h200-llama3.1-8b", None), ("h100-llama3.3-70b", 2)])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_profile_point_tables_are_the_simulators(name, tp, role):
    generated = profile_points(name, tp).replace("#### ", "### ")
    doc = DOC.read_text()
    heading = next(line for line in generated.splitlines() if line.startswith("### ") and f", {role}:" in line)
    assert _section(doc, heading) == _section(generated, heading)
