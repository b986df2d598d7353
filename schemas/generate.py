"""Write the JSON Schema of every event into schemas/json/.

The files are checked in so that producers in other languages can validate
against them; ``tests/schemas/test_json_schema.py`` fails when they are
stale. Regenerate with ``python -m fleetplan.schemas.generate``.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from fleetplan.schemas.events import EVENT_MODELS

JSON_DIR = Path(__file__).parent / "json"


def render() -> dict[str, bytes]:
    """File name -> content for every event type."""
    out = {}
    for name, model in sorted(EVENT_MODELS.items()):
        schema = model.model_json_schema()
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
