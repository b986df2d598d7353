"""docs/events.md names every field of every event.

A producer in another language writes its records from that page; a field
it leaves out is one the producer cannot know of, and a name it only
paraphrases ("worker ids") is one the producer guesses, which the models
refuse as an unknown field.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetplan.schemas.events import EVENT_MODELS

EVENTS_MD = Path(__file__).parents[2] / "docs" / "events.md"
ENVELOPE = ("type", "deployment", "time", "schema_version")


def _rows() -> dict[str, str]:
    """Event type -> the text of its row in the page's input and output tables."""
    rows = {}
    for line in EVENTS_MD.read_text().splitlines():
        match = re.match(r"\| `(\w+)` \| [^|]* \| (.*) \|$", line)
        if match and match.group(1) in EVENT_MODELS:
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_envelope_is_documented():
    page = EVENTS_MD.read_text()
    for field in ENVELOPE:
        assert f"| `{field}` |" in page, field


@pytest.mark.parametrize("kind", sorted(EVENT_MODELS))
def test_every_field_of_an_event_is_named_in_its_row(kind):
    row = _rows().get(kind)
    assert row is not None, f"docs/events.md has no row for {kind}"
    named = set(re.findall(r"\w+", row))
    missing = [f for f in EVENT_MODELS[kind].model_fields if f not in ENVELOPE and f not in named]
    assert not missing, f"docs/events.md's {kind} row leaves out {missing}"
