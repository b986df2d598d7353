"""The checked-in JSON Schema files match the models."""

from fleetplan.schemas.generate import JSON_DIR, render


def test_json_schemas_are_fresh():
    rendered = render()
    on_disk = {p.name: p.read_bytes() for p in JSON_DIR.glob("*.json")}
    stale = sorted(n for n in rendered if on_disk.get(n) != rendered[n])
    extra = sorted(set(on_disk) - set(rendered))
    assert not stale and not extra, (
        f"stale: {stale}, unexpected: {extra}; run `python -m fleetplan.schemas.generate`"
    )
