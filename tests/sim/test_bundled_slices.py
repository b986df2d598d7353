"""The bundled trace slices are what examples/traces/README.md says they are.

They are cut from the public traces in the shared data folder, so these run
only where that folder is (the project's machine); elsewhere they skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim.sim_helpers import CODE, CONV, ROOT

SOURCE = Path("/work/shared/data/traces/azure2023")
SLICES = {CONV: "AzureLLMInferenceTrace_conv_first30min.csv", CODE: "AzureLLMInferenceTrace_code_first30min.csv"}
README = ROOT / "examples" / "traces" / "README.md"

pytestmark = pytest.mark.skipif(not SOURCE.is_dir(), reason="needs the shared data folder")


def source_prefix(bundled: Path) -> bytes:
    """As many lines of the source as the slice has, as the source stores them."""
    lines = (SOURCE / SLICES[bundled]).read_bytes().splitlines(keepends=True)
    return b"".join(lines[:len(bundled.read_bytes().splitlines())])


@pytest.mark.parametrize("bundled", sorted(SLICES), ids=lambda p: p.name)
def test_a_slice_holds_the_first_ten_minutes_of_its_trace(bundled: Path):
    from fleetplan.sim.traces import read_trace

    rows = bundled.read_bytes().splitlines()
    assert rows == source_prefix(bundled).splitlines()
    arrivals = [r.arrival_s for r in read_trace(SOURCE / SLICES[bundled])]
    assert len(rows) - 1 == sum(1 for t in arrivals if t < 600.0)


def test_the_readme_says_byte_for_byte_only_of_bytes_kept():
    """The sources end their lines with CRLF and the slices with LF, so the rows are the same but
    not their bytes: the README said "byte for byte", and a checksum against the source failed."""
    changed = [p.name for p in SLICES if p.read_bytes() != source_prefix(p)]
    if changed:
        assert "byte for byte" not in README.read_text(), changed
