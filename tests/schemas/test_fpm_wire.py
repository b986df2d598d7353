"""The worker's FPM decode (msgspec) against the reference decode (pydantic).

What msgspec accepts, pydantic must accept with the same values, bit for bit;
whatever pydantic refuses, msgspec must refuse; and ``decode_input`` must give
what ``decode_event`` gives, the same event or the same ``SchemaError``.
Records are written as JSON text by hand so that the inputs a JSON library
would never produce (NaN, 1e400, duplicate keys, lone surrogates) are tried too.
"""

from __future__ import annotations

import copy
import json

import msgspec
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.schemas import (
    MAX_EVENT_BYTES,
    ForwardPassMetrics,
    FpmBatch,
    QueuedRequests,
    ScheduledRequests,
    SchemaError,
    decode_event,
    event_to_dict,
)
from fleetplan.schemas.events import MAX_EVENT_TIME
from fleetplan.schemas.fpm_wire import _DECODER, WireFpm, WireFpmBatch, decode_input


class Raw(str):
    """JSON text written as is (a token no JSON library would write)."""


class Obj(list):
    """A JSON object as (key, value) pairs, so a key can repeat."""


def dumps(value) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def canon(event) -> str:
    """An event's data as exact text (floats by repr, so -0.0 and 0.0 differ; ints
    beyond 64 bits, which pydantic accepts and orjson cannot write, as they are)."""
    return json.dumps(event_to_dict(event))


def outcome(decode, data: bytes):
    try:
        return decode(data)
    except SchemaError as err:
        return err


def error_of(err: SchemaError) -> tuple:
    return str(err), err.field, err.expected, err.oversize


def check(data: bytes) -> str:
    """Hold the two decoders to each other on ``data``; which one accepted it."""
    reference = outcome(decode_event, data)
    fast = None
    if len(data) <= MAX_EVENT_BYTES:  # decode_input's size check comes first
        try:
            fast = _DECODER.decode(data)
        except (msgspec.MsgspecError, UnicodeDecodeError):  # the latter: msgspec before 0.23
            pass
    if fast is not None:
        assert not isinstance(reference, SchemaError), f"msgspec accepted what pydantic refused: {reference}"
        assert canon(fast) == canon(reference)
    got = outcome(decode_input, data)
    if isinstance(reference, SchemaError):
        assert isinstance(got, SchemaError) and error_of(got) == error_of(reference)
        return "refused"
    assert not isinstance(got, SchemaError)
    assert canon(got) == canon(reference)
    assert type(got) is (type(reference) if fast is None else WireFpmBatch if reference.type == "fpm_batch"
                         else ForwardPassMetrics)
    return "pydantic" if fast is None else "msgspec"


# --- inputs -------------------------------------------------------------------

TRICKY = [
    -1, 0, 1, 7, 2**63, 2**64, 10**30, -0.0, 0.5, 3.0, 1e308, 2e-324, 1e20, True, False, None,
    "", "3", "1.5", "x" * 256, "x" * 257, "é" * 256, "\U0001f600" * 256, "\U0001f600" * 257,
    [], Obj(), "fpm", "fpm_batch", "agg", "prefill", "decode", "AGG", "request",
    Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("-0"), Raw("1E2"),
    Raw("1.0e0"), Raw("10e-1"), Raw("0.30000000000000004"), Raw("123456789012345678901234567890.5"),
    Raw('"\\ud800"'), Raw('"\\u00e9"'), Raw('"a\\u0000"'), Raw('"\\ud83d\\ude00"'), Raw('"a\nb"'),
    Raw("1.7976931348623157e308"), Raw("1.7976931348623159e308"), Raw("4.9e-324"), Raw("00"), Raw("+1"),
]

SCHEDULED = ["num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "sum_prefill_kv_tokens",
             "num_decode_requests", "sum_decode_kv_tokens", "var_decode_kv_tokens"]
QUEUED = ["num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "num_decode_requests",
          "sum_decode_kv_tokens", "var_decode_kv_tokens"]

numbers = st.one_of(st.integers(0, 2**70), st.floats(min_value=0, allow_nan=False, allow_infinity=False),
                    st.sampled_from(TRICKY).map(copy.deepcopy))
names = st.one_of(st.text(min_size=1, max_size=6), st.sampled_from(["e0", "e1", "w/1"]))


@st.composite
def work(draw, fields):
    floats = st.one_of(st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False))
    pairs = [(f, draw(floats if f.startswith("var_") else st.integers(0, 2**62)))
             for f in fields if draw(st.booleans())]
    return Obj(draw(st.permutations(pairs)))


@st.composite
def fpm_obj(draw, top: bool):
    pairs = [("deployment", draw(names)), ("time", draw(st.floats(0, 2e9, allow_nan=False))),
             ("role", draw(st.sampled_from(["prefill", "decode", "agg"]))), ("worker_id", draw(names))]
    optional = [("schema_version", 1), ("type", "fpm"), ("dp_rank", draw(st.integers(0, 8))),
                ("counter_id", draw(st.integers(0, 2**40))), ("wall_time", draw(st.floats(0, 10, allow_nan=False))),
                ("scheduled", draw(work(SCHEDULED))), ("queued", draw(work(QUEUED)))]
    pairs += [p for p in optional if (top and p[0] == "type") or draw(st.booleans())]
    return Obj(draw(st.permutations(pairs)))


@st.composite
def batch_obj(draw):
    """A valid batch: its FPMs are its deployment's, and its time is at least their latest."""
    deployment = draw(names)
    fpms = [Obj((k, deployment if k == "deployment" else v) for k, v in fpm)
            for fpm in draw(st.lists(fpm_obj(top=False), min_size=1, max_size=3))]
    latest = max(v for fpm in fpms for k, v in fpm if k == "time")
    time = draw(st.sampled_from([latest, min(latest + 0.5, MAX_EVENT_TIME)]))
    pairs = [("deployment", deployment), ("time", time), ("type", "fpm_batch"), ("fpms", fpms)]
    if draw(st.booleans()):
        pairs.append(("schema_version", 1))
    return Obj(draw(st.permutations(pairs)))


def objects(value):
    """Every object inside ``value``, itself first."""
    if isinstance(value, Obj):
        yield value
        for _, v in value:
            yield from objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from objects(v)


@st.composite
def mutated(draw, base):
    """A valid record with up to three changes: a value replaced, a key dropped,
    an unknown or repeated key added."""
    doc = draw(base)
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(list(objects(doc))))
        action = draw(st.sampled_from(["replace", "drop", "add", "repeat"]))
        if action == "add" or not target:
            target.append((draw(st.sampled_from(["extra", "Type", "fpms", "time"])), draw(numbers)))
            continue
        i = draw(st.integers(0, len(target) - 1))
        key, _ = target[i]
        if action == "replace":
            target[i] = (key, draw(numbers))
        elif action == "drop":
            del target[i]
        else:
            target.insert(draw(st.integers(0, len(target))), (key, draw(numbers)))
    return dumps(doc).encode("utf-8", "surrogatepass")


SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(mutated(batch_obj()))
def test_batch_records_decode_alike(data):
    check(data)


@SETTINGS
@given(mutated(fpm_obj(top=True)))
def test_single_fpm_records_decode_alike(data):
    check(data)


@settings(max_examples=200, deadline=None)
@given(batch_obj())
def test_valid_batches_take_the_fast_path(doc):
    assert check(dumps(doc).encode()) == "msgspec"


# --- a table of inputs ------------------------------------------------------------

FPM = {"deployment": "d", "time": 12.5, "role": "decode", "worker_id": "e1", "dp_rank": 1,
       "counter_id": 9, "wall_time": 0.02, "scheduled": {"num_decode_requests": 4, "sum_decode_kv_tokens": 900},
       "queued": {"num_prefill_requests": 1, "sum_prefill_tokens": 300, "var_prefill_length": 2.5}}


def batch(*fpms, **top) -> bytes:
    record = {"deployment": "d", "time": 13.0, "type": "fpm_batch", "fpms": list(fpms) or [FPM], **top}
    return json.dumps(record).encode()


def fpm_with(**changes) -> dict:
    out = {**FPM, **changes}
    return {k: v for k, v in out.items() if v is not DROP}


def scheduled_with(**changes) -> dict:
    return fpm_with(scheduled={**FPM["scheduled"], **changes})


DROP = object()

REFUSED = {
    "negative count": batch(fpm_with(dp_rank=-1)),
    "negative nested count": batch(scheduled_with(num_decode_requests=-3)),
    "negative tokens": batch(fpm_with(queued={"sum_prefill_tokens": -1})),
    "negative float": batch(fpm_with(wall_time=-0.5)),
    "negative time": batch(time=-1.0),
    "NaN": batch(FPM).replace(b'"wall_time": 0.02', b'"wall_time": NaN'),
    "Infinity": batch(FPM).replace(b'"wall_time": 0.02', b'"wall_time": Infinity'),
    "1e400": batch(FPM).replace(b'"wall_time": 0.02', b'"wall_time": 1e400'),
    "a pass over 600 s": batch(fpm_with(wall_time=1e300)),
    "nested 1e400": batch(scheduled_with(var_decode_kv_tokens=1.0)).replace(
        b'"var_decode_kv_tokens": 1.0', b'"var_decode_kv_tokens": 1e400'),
    "missing worker_id": batch(fpm_with(worker_id=DROP)),
    "missing role": batch(fpm_with(role=DROP)),
    "missing time": batch(fpm_with(time=DROP)),
    "missing batch deployment": json.dumps({"time": 1.0, "type": "fpm_batch", "fpms": [FPM]}).encode(),
    "missing fpms": json.dumps({"deployment": "d", "time": 1.0, "type": "fpm_batch"}).encode(),
    "missing type": json.dumps({"deployment": "d", "time": 1.0, "fpms": [FPM]}).encode(),
    "extra field": batch(fpm_with(extra=1)),
    "extra nested field": batch(scheduled_with(num_decode_tokens=1)),
    "extra batch field": batch(note="x"),
    "unknown role": batch(fpm_with(role="router")),
    "string for object": batch(fpm_with(scheduled="none")),
    "null for object": batch(fpm_with(scheduled=None)),
    "null for count": batch(fpm_with(counter_id=None)),
    "fractional count": batch(fpm_with(counter_id=1.5)),
    "list for name": batch(fpm_with(worker_id=["e1"])),
    "number for name": batch(fpm_with(worker_id=7)),
    "empty name": batch(fpm_with(worker_id="")),
    "long name": batch(fpm_with(worker_id="w" * 257)),
    "long deployment": batch(deployment="d" * 257),
    "empty list": batch(fpms=[]),
    "too many fpms": batch(fpms=[FPM] * 10_001),
    "too many small fpms": batch(fpms=[{"deployment": "d", "time": 1, "role": "agg", "worker_id": "e"}] * 10_001),
    "negative variance": batch(scheduled_with(var_decode_kv_tokens=-1.0)),
    "time past the last": batch(fpm_with(time=MAX_EVENT_TIME + 1), time=MAX_EVENT_TIME + 1),
    "fpms not a list": batch(fpms=FPM),
    "schema_version 2": batch(schema_version=2),
    "nested schema_version 2": batch(fpm_with(schema_version=2)),
    "schema_version '1'": batch(fpm_with(schema_version="1")),
    "nested type fpm_batch": batch(fpm_with(type="fpm_batch")),
    "nested type request": batch(fpm_with(type="request")),
    "type fpm with fpms": json.dumps({**FPM, "type": "fpm", "fpms": [FPM]}).encode(),
    "repeated type, last wrong": batch().replace(b'"fpms"', b'"type": "fpm", "fpms"'),
    "lone surrogate": batch(fpm_with(worker_id="X")).replace(b'"X"', b'"\\ud800"'),
    "invalid utf-8": batch(fpm_with(worker_id="X")).replace(b'"X"', b'"\xff"'),
    "control character in a string": batch(fpm_with(worker_id="X")).replace(b'"X"', b'"a\nb"'),
    "trailing garbage": batch() + b"x",
    "truncated": batch()[:-1],
    "not an object": b'["fpm_batch"]',
    "empty": b"",
    "whitespace": b"   ",
    "oversize": batch(fpms=[FPM] * 4000),
}

ACCEPTED_BY_PYDANTIC_ONLY = {
    "bool for count": batch(fpm_with(dp_rank=True)),
    "bool for float": batch(fpm_with(wall_time=True)),
    "float for count": batch(fpm_with(counter_id=3.0)),
    "string for count": batch(fpm_with(counter_id="3")),
    "string for float": batch(fpm_with(wall_time="0.5")),
    "float schema_version": batch(fpm_with(schema_version=1.0)),
    "type last of two": json.dumps({**FPM, "type": "fpm"}).encode().replace(b'{', b'{"type": "fpm_batch", ', 1),
}

ACCEPTED = {
    "minimal": batch({"deployment": "d", "time": 1, "role": "agg", "worker_id": "e"}),
    "defaults written out": batch(fpm_with(type="fpm", schema_version=1), schema_version=1),
    "ints for floats": batch(fpm_with(wall_time=0, time=12)),
    "negative zero": batch(fpm_with(wall_time=-0.0)),
    "largest float": batch(scheduled_with(var_decode_kv_tokens=1.7976931348623157e308)),
    "longest pass": batch(fpm_with(wall_time=600.0)),
    "subnormal": batch(fpm_with(wall_time=5e-324)),
    "underflow to zero": batch(fpm_with(wall_time=1.0)).replace(b'"wall_time": 1.0', b'"wall_time": 1e-400'),
    "largest int": batch(fpm_with(counter_id=2**63 - 1)),
    "repeated key, last wins": batch(fpm_with(dp_rank=1)).replace(b'"dp_rank": 1', b'"dp_rank": 5, "dp_rank": 1'),
    "repeated type, same": batch().replace(b'"fpms"', b'"type": "fpm_batch", "fpms"'),
    "escapes": batch(fpm_with(worker_id="X")).replace(b'"X"', b'"\\u00e9\\ud83d\\ude00\\n"'),
    "astral name at the limit": batch(fpm_with(worker_id="\U0001f600" * 256)),
    "10,000 fpms": batch(fpms=[{"deployment": "d", "time": 1, "role": "agg", "worker_id": "e"}] * 10_000),
    "single fpm": json.dumps({**FPM, "type": "fpm"}).encode(),
    "whitespace around": b"\n " + batch() + b" \n",
}


@pytest.mark.parametrize("data", REFUSED.values(), ids=REFUSED.keys())
def test_refused_records_give_pydantics_error(data):
    assert check(data) == "refused"


@pytest.mark.parametrize("data", ACCEPTED_BY_PYDANTIC_ONLY.values(), ids=ACCEPTED_BY_PYDANTIC_ONLY.keys())
def test_lax_records_fall_back_to_pydantic(data):
    assert check(data) == "pydantic"


@pytest.mark.parametrize("data", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_records_take_the_fast_path(data):
    assert check(data) == "msgspec"


def test_oversize_is_refused_before_decoding():
    data = batch(fpms=[FPM] * 4000)
    assert len(data) > MAX_EVENT_BYTES
    with pytest.raises(SchemaError) as err:
        decode_input(data)
    assert err.value.oversize


def test_invalid_utf8_is_refused_as_pydantic_refuses_it_whatever_msgspec_raises(monkeypatch):
    """msgspec before 0.23 raised UnicodeDecodeError, not a MsgspecError, for a string of invalid
    UTF-8: it left decode_input, and the worker's router (which takes SchemaError as a bad
    record) failed its batch on it, and again on the same record at every restart."""
    from fleetplan.schemas import fpm_wire

    class OldMsgspec:
        def decode(self, data):
            return data.decode("utf-8")  # msgspec 0.18-0.22: UnicodeDecodeError escapes

    data = REFUSED["invalid utf-8"]
    reference = outcome(decode_event, data)
    monkeypatch.setattr(fpm_wire, "_DECODER", OldMsgspec())
    got = outcome(decode_input, data)
    assert isinstance(got, SchemaError) and error_of(got) == error_of(reference)


def test_other_events_are_decoded_by_pydantic():
    data = json.dumps({"deployment": "d", "time": 1.0, "type": "clock"}).encode()
    assert decode_input(data) == decode_event(data)


# --- the models the planner keeps ------------------------------------------------------


def test_to_model_builds_what_validation_builds():
    reference = decode_event(batch(FPM)).fpms[0]
    built = msgspec.json.decode(json.dumps(FPM).encode(), type=WireFpm).to_model()
    assert type(built) is ForwardPassMetrics
    assert built == reference and built.model_dump() == reference.model_dump()
    assert type(built.scheduled) is ScheduledRequests and type(built.queued) is QueuedRequests
    constructed = ForwardPassMetrics.model_construct(**dict(reference))
    for model, other in ((built, constructed), (built.queued, constructed.queued)):
        assert model.__dict__ == other.__dict__
        assert model.model_fields_set == set(type(model).model_fields)
        assert model.__pydantic_extra__ is None and model.__pydantic_private__ is None
    assert built.is_heartbeat is False
    with pytest.raises(pydantic.ValidationError):
        built.wall_time = 1.0  # frozen, as the validated model


def test_batch_to_model():
    data = batch(FPM, fpm_with(worker_id="e2"))
    wire = decode_input(data)
    assert type(wire) is WireFpmBatch and wire.type == "fpm_batch"
    model = wire.to_model()
    assert type(model) is FpmBatch and model == decode_event(data)


def test_a_count_past_64_bits_is_refused_by_both_decoders():
    """State is written with orjson, which carries at most 64-bit integers."""
    import orjson
    import pytest

    from fleetplan.schemas.codec import SchemaError, decode_event
    from fleetplan.schemas.events import MAX_COUNT
    from fleetplan.schemas.fpm_wire import decode_input

    def record(counter: int) -> bytes:
        return orjson.dumps({"type": "fpm", "deployment": "d", "time": 1.0, "role": "decode",
                             "worker_id": "w", "wall_time": 0.01}).replace(
            b'"wall_time"', f'"counter_id":{counter},"wall_time"'.encode())

    assert decode_input(record(MAX_COUNT)).counter_id == MAX_COUNT
    for decode in (decode_event, decode_input):
        with pytest.raises(SchemaError, match="counter_id"):
            decode(record(MAX_COUNT + 1))
