"""Bytes in, events out: the one place that turns wire data into models
(:mod:`fleetplan.schemas.fpm_wire` is the worker's faster way in for FPMs).

Every decode failure raises :class:`SchemaError`, whose message names the
field and what was expected, so the bridge can dead-letter it with a reason
and a user can fix the producer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from fleetplan.schemas.events import EVENT_MODELS, ControlCommand, Event

MAX_EVENT_BYTES = 1 << 20
"""Largest encoded event accepted (1 MiB); bigger ones are dead-lettered as oversize."""

_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
_COMMANDS = tuple(model.model_fields["command"].default for model in get_args(get_args(ControlCommand)[0]))
"""Every control command's tag, read from the union so that none is left out: a list written
by hand lacked ``reset_perf``, so a bad command was told the others only, and a bad
``reset_perf`` field was named ``body.reset_perf.<name>`` instead of ``body.<name>``."""


class SchemaError(ValueError):
    """An input that is not a valid fleetplan event.

    ``field`` is the dotted path of the offending field ("" for the whole
    message) and ``expected`` says what would have been accepted.
    """

    def __init__(self, field: str, expected: str, *, oversize: bool = False) -> None:
        self.field = field
        self.expected = expected
        self.oversize = oversize
        where = field or "message"
        super().__init__(f"{where}: {expected}")


def _explain(err: ValidationError) -> SchemaError:
    first = err.errors(include_url=False)[0]
    loc = [str(p) for p in first["loc"]]
    kind = first["type"]
    if kind == "json_invalid":
        return SchemaError("", f"valid JSON ({first['msg']})")
    # The first path element of a discriminated union is the tag itself; drop it.
    if loc and loc[0] in EVENT_MODELS:
        loc = loc[1:]
    if len(loc) >= 2 and loc[0] == "body" and loc[1] in _COMMANDS:
        del loc[1]  # the control command's tag, likewise: the field is body.<name>
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        if loc:  # a nested union: the control command body
            return SchemaError(".".join(loc + ["command"]), f"one of {', '.join(_COMMANDS)}")
        return SchemaError("type", f"one of {', '.join(sorted(EVENT_MODELS))}")
    field = ".".join(loc)
    got = first.get("input")
    detail = first["msg"]
    if kind == "value_error" and (not loc or loc == ["body"]):
        # a check across fields (of the event, or of its command): its message starts with the field it names
        named, _, detail = str(first["ctx"]["error"]).partition(": ")
        return SchemaError(".".join([*loc, named]), detail)
    if kind == "missing":
        return SchemaError(field, "a value (field is required)")
    if not isinstance(got, dict | list):
        detail = f"{detail}, got {got!r}"[:300]
    return SchemaError(field, detail)


def decode_event(data: bytes | str) -> Event:
    """Parse and validate one event; raise :class:`SchemaError` on anything wrong."""
    size = len(data)
    if size > MAX_EVENT_BYTES:
        raise SchemaError("", f"at most {MAX_EVENT_BYTES} bytes, got {size}", oversize=True)
    if size == 0:
        raise SchemaError("", "a JSON object, got an empty message")
    try:
        return _EVENT_ADAPTER.validate_json(data)
    except ValidationError as err:
        raise _explain(err) from None


def decode_dict(obj: object) -> Event:
    """Validate an already-parsed JSON value (used when reading msgpack frames)."""
    try:
        return _EVENT_ADAPTER.validate_python(obj)
    except ValidationError as err:
        raise _explain(err) from None


def event_to_dict(event: BaseModel) -> dict:
    """Plain data for an event: what is written to logs and topics.

    Also takes the msgspec structs of :mod:`fleetplan.schemas.fpm_wire`, as
    the data of the pydantic model they mirror.
    """
    if not isinstance(event, BaseModel):
        event = event.to_model()
    return event.model_dump(mode="json")


def encode_event(event: BaseModel) -> bytes:
    """Compact JSON bytes; ``decode_event(encode_event(e)) == e`` for every event."""
    return orjson.dumps(event_to_dict(event))


def encode_lines(events: Iterable[BaseModel]) -> bytes:
    """Events as JSONL, one per line, the format of local event logs."""
    return b"".join(encode_event(e) + b"\n" for e in events)
