"""The checked-in JSON Schema files match the models."""

import pytest

from fleetplan.schemas import SchemaError, decode_event
from fleetplan.schemas.generate import JSON_DIR, render


def test_json_schemas_are_fresh():
    rendered = render()
    on_disk = {p.name: p.read_bytes() for p in JSON_DIR.glob("*.json")}
    stale = sorted(n for n in rendered if on_disk.get(n) != rendered[n])
    extra = sorted(set(on_disk) - set(rendered))
    assert not stale and not extra, (
        f"stale: {stale}, unexpected: {extra}; run `python -m fleetplan.schemas.generate`"
    )


def _schemas() -> dict[str, dict]:
    import orjson

    return {name: orjson.loads(content) for name, content in render().items()}


@pytest.mark.parametrize("name", sorted(_schemas()))
def test_a_record_must_carry_its_type(name):
    """The decoders pick the model by ``type``, so a record without it is refused however
    well it fits; a producer validating against the schema must be told so. (The default
    the model gives ``type`` made it optional in the schemas until 2026-12-06.)"""
    assert "type" in _schemas()[name]["required"]


def test_a_control_body_must_carry_its_command():
    """Likewise the command of a control's body: ``{"advisory": true}`` fitted the schema's
    set_advisory and the worker dead-lettered it (``body.command: one of ...``)."""
    schema = _schemas()["control.v1.json"]
    mapping = schema["properties"]["body"]["discriminator"]["mapping"]
    for ref in mapping.values():
        assert "command" in schema["$defs"][ref.rsplit("/", 1)[1]]["required"], ref
    with pytest.raises(SchemaError, match="body.command"):
        decode_event(b'{"type":"control","deployment":"d","time":1,"body":{"advisory":true}}')


def test_an_fpm_in_a_batch_may_leave_its_type_out():
    """Inside a batch ``type`` is the FPM's default, and both decoders take it left out."""
    schema = _schemas()["fpm_batch.v1.json"]
    assert "type" not in schema["$defs"]["ForwardPassMetrics"]["required"]
    batch = decode_event(b'{"type":"fpm_batch","deployment":"d","time":1,"fpms":'
                         b'[{"deployment":"d","time":1,"role":"prefill","worker_id":"w"}]}')
    assert batch.fpms[0].type == "fpm"
