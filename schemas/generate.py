"""Write the JSON Schema of every event into schemas/json/.

The files are checked in so that producers in other languages can validate
against them; ``tests/schemas/test_json_schema.py`` fails when they are
stale. Regenerate with ``python -m fleetplan.schemas.generate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson

from fleetplan.schemas.events import EVENT_MODELS

JSON_DIR = Path(__file__).parent / "json"


def _nodes(node: object) -> Iterator[dict]:
    """Every object in a schema, the schema itself first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def _require(schema: dict, field: str) -> None:
    if field not in schema.setdefault("required", []):
        schema["required"].insert(0, field)


def _tags_required(schema: dict) -> dict:
    """The schema with its tags required: the record's ``type`` and every command's ``command``.

    The models give each tag a default, so pydantic leaves it out of
    ``required``; but the decoders choose the model by the tag, and refuse a
    record or a control body without it (``type: one of ...``,
    ``body.command: one of ...``). A producer that checks its records against
    these files must not be told they are valid then. An FPM inside a batch
    may leave its ``type`` out (it is no union's tag there), and keeps it optional.
    """
    _require(schema, "type")
    defs = schema.get("$defs", {})
    for node in list(_nodes(schema)):
        tag = node.get("discriminator")
        if isinstance(tag, dict):
            for ref in tag["mapping"].values():
                _require(defs[ref.rsplit("/", 1)[1]], tag["propertyName"])
    return schema


def render() -> dict[str, bytes]:
    """File name -> content for every event type."""
    out = {}
    for name, model in sorted(EVENT_MODELS.items()):
        schema = _tags_required(model.model_json_schema())
        schema["$id"] = f"https://fleetplan.dev/schemas/{name}.v1.json"
        out[f"{name}.v1.json"] = orjson.dumps(
            schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
        ) + b"\n"
    return out


def main() -> None:
    JSON_DIR.mkdir(exist_ok=True)
    for name, content in render().items():
        (JSON_DIR / name).write_bytes(content)
    print(f"wrote {len(EVENT_MODELS)} schemas to {JSON_DIR}")


if __name__ == "__main__":
    main()
