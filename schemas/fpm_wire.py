"""FPM records decoded without pydantic: the worker's hot path.

At 100k FPMs/s a worker has about 10 us of CPU per FPM for everything, and
pydantic's ``validate_json`` of an ``FpmBatch`` took about 6 us per FPM of it
(three models, their dicts and field sets, for each FPM; all of them objects
the garbage collector scans while the FPMs wait for their tick). These
msgspec structs mirror :class:`~fleetplan.schemas.events.ForwardPassMetrics`
and :class:`~fleetplan.schemas.events.FpmBatch` field for field, with the
same constraints, and are decoded straight from the record's bytes. They are
untracked by the cyclic collector (``gc=False``: they hold only scalars,
strings and a list of each other, so they cannot form a cycle).

msgspec is stricter than pydantic's lax mode (no ``3.0`` or ``"3"`` for an
int, no ``true`` for a number, no NaN token), never looser, so anything it
accepts pydantic accepts with the same values: :func:`decode_input` hands what
msgspec refuses to :func:`~fleetplan.schemas.codec.decode_event`, which
accepts it as before or raises the same ``SchemaError`` as before.
``tests/schemas/test_fpm_wire.py`` holds both decoders to that.

The planning core folds a :class:`WireFpmBatch` as it folds an ``FpmBatch``
(it reads the same attribute names); what it keeps beyond the fold (an
engine's latest FPM) it keeps as the pydantic model, from :meth:`WireFpm.to_model`.
"""

from __future__ import annotations

import sys
from typing import Annotated, ClassVar, Literal

import msgspec
from pydantic import BaseModel

from fleetplan.schemas.codec import MAX_EVENT_BYTES, decode_event
from fleetplan.schemas.events import (
    MAX_COUNT,
    MAX_EVENT_TIME,
    MAX_NAME_LENGTH,
    MAX_PASS_SECONDS,
    ForwardPassMetrics,
    FpmBatch,
    QueuedRequests,
    Role,
    ScheduledRequests,
    batch_problem,
)

# The constraints of schemas/events.py. A JSON number too large for a float
# decodes to inf, which ``le`` refuses (pydantic: allow_inf_nan=False); NaN
# and Infinity are not JSON to msgspec at all.
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Tokens = Count
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
PassSeconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_PASS_SECONDS)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH)]
EventTime = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_EVENT_TIME)]


class _Wire(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    """Frozen and strict like the pydantic models (``extra="forbid"``); not tracked
    by the cyclic garbage collector."""


class WireScheduled(_Wire):
    """``ScheduledRequests``."""

    num_prefill_requests: Count = 0
    sum_prefill_tokens: Tokens = 0
    var_prefill_length: NonNegative = 0.0
    sum_prefill_kv_tokens: Tokens = 0
    num_decode_requests: Count = 0
    sum_decode_kv_tokens: Tokens = 0
    var_decode_kv_tokens: NonNegative = 0.0


class WireQueued(_Wire):
    """``QueuedRequests``."""

    num_prefill_requests: Count = 0
    sum_prefill_tokens: Tokens = 0
    var_prefill_length: NonNegative = 0.0
    num_decode_requests: Count = 0
    sum_decode_kv_tokens: Tokens = 0
    var_decode_kv_tokens: NonNegative = 0.0


_new = object.__new__
_setattr = object.__setattr__


def _built(cls: type[BaseModel], values: dict) -> BaseModel:
    """A model of already-validated values, as ``cls.model_construct(**values)`` builds
    it (every field given), at about a quarter of its cost (measured 2.4 against
    8.5 us for an FPM's three models: ``model_construct`` walks the fields for
    aliases and defaults), and the planner keeps one FPM per engine per batch.
    ``tests/schemas/test_fpm_wire.py`` checks the result against
    ``model_construct`` and against validation."""
    model = _new(cls)
    _setattr(model, "__dict__", values)
    _setattr(model, "__pydantic_fields_set__", set(values))
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


_NO_SCHEDULED = WireScheduled()
_NO_QUEUED = WireQueued()


class WireFpm(_Wire, tag_field="type", tag="fpm"):
    """``ForwardPassMetrics``. The tag is optional inside a batch, as ``type``'s
    default is there; a record on its own must carry it (pydantic's discriminator)."""

    type: ClassVar[str] = "fpm"
    deployment: Name
    time: EventTime
    role: Role
    worker_id: Name
    schema_version: Literal[1] = 1
    dp_rank: Count = 0
    counter_id: Count = 0
    wall_time: PassSeconds = 0.0
    scheduled: WireScheduled = _NO_SCHEDULED
    queued: WireQueued = _NO_QUEUED

    def to_model(self) -> ForwardPassMetrics:
        """The pydantic model of this FPM (the planner keeps each engine's latest)."""
        return _built(ForwardPassMetrics, {
            "deployment": self.deployment, "time": self.time, "schema_version": 1, "type": "fpm",
            "role": self.role, "worker_id": self.worker_id, "dp_rank": self.dp_rank,
            "counter_id": self.counter_id, "wall_time": self.wall_time,
            "scheduled": _built(ScheduledRequests, msgspec.structs.asdict(self.scheduled)),
            "queued": _built(QueuedRequests, msgspec.structs.asdict(self.queued)),
        })


class WireFpmBatch(_Wire, tag_field="type", tag="fpm_batch"):
    """``FpmBatch``: what the planning core folds on the hot path."""

    type: ClassVar[str] = "fpm_batch"
    deployment: Name
    time: EventTime
    fpms: Annotated[list[WireFpm], msgspec.Meta(min_length=1, max_length=10_000)]
    schema_version: Literal[1] = 1

    def __post_init__(self) -> None:
        problem = batch_problem(self.deployment, self.time, self.fpms)
        if problem is not None:
            raise ValueError(problem)  # msgspec refuses it; decode_event then names the field

    def to_model(self) -> FpmBatch:
        """The pydantic model of the batch (for encoding it; never on the hot path)."""
        return _built(FpmBatch, {
            "deployment": self.deployment, "time": self.time, "schema_version": 1,
            "type": "fpm_batch", "fpms": [f.to_model() for f in self.fpms],
        })


WIRE_TYPES = (WireFpm, WireFpmBatch)

_DECODER = msgspec.json.Decoder(WireFpmBatch | WireFpm)


def decode_input(data: bytes) -> object:
    """:func:`~fleetplan.schemas.codec.decode_event`, with FPM records decoded by msgspec.

    A batch comes back as a :class:`WireFpmBatch`, a single FPM as its pydantic
    model; anything else, and anything msgspec refuses, goes to ``decode_event``
    (so a refused record raises the ``SchemaError`` it always raised).
    """
    if type(data) is bytes and b'"fpm' in data and len(data) <= MAX_EVENT_BYTES:
        try:
            event = _DECODER.decode(data)
        except (msgspec.MsgspecError, UnicodeDecodeError):
            # msgspec before 0.23 raises UnicodeDecodeError for a string of invalid UTF-8:
            # pydantic refuses it as a SchemaError, which the router dead-letters
            pass
        else:
            return event if type(event) is WireFpmBatch else event.to_model()
    return decode_event(data)
