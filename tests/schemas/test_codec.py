"""Codec: every event round-trips; every kind of bad input gets one clear error."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetplan.schemas import (
    MAX_EVENT_BYTES,
    Ack,
    ControlEvent,
    Decision,
    ForwardPassMetrics,
    FpmBatch,
    InventoryEvent,
    RequestRecord,
    ScheduledRequests,
    SchemaError,
    SetMinEndpoints,
    decode_event,
    encode_event,
)
from fleetplan.schemas.events import ARRIVAL_SLACK_MS, MAX_EVENT_TIME

counts = st.integers(min_value=0, max_value=2**40)
finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
event_times = st.floats(min_value=0, max_value=MAX_EVENT_TIME, allow_nan=False, allow_infinity=False)


@st.composite
def fpms(draw):
    return ForwardPassMetrics(
        deployment=draw(st.sampled_from(["a", "b-2", "ünïcode"])),
        time=draw(event_times),
        role=draw(st.sampled_from(["prefill", "decode", "agg"])),
        worker_id=draw(st.text(min_size=1, max_size=20)),
        dp_rank=draw(st.integers(0, 64)),
        counter_id=draw(counts),
        wall_time=draw(st.floats(0, 600, allow_nan=False)),
        scheduled=ScheduledRequests(
            num_prefill_requests=draw(counts), sum_prefill_tokens=draw(counts),
            num_decode_requests=draw(counts), sum_decode_kv_tokens=draw(counts),
            var_decode_kv_tokens=draw(finite),
        ),
    )


@given(fpms())
def test_fpm_round_trips_exactly(fpm):
    assert decode_event(encode_event(fpm)) == fpm


def test_every_event_type_round_trips():
    events = [
        RequestRecord(deployment="d", time=10.0, request_id="r1", input_tokens=3000,
                      output_tokens=150, request_received_ms=9000.5, ttft_ms=80.0, avg_itl_ms=9.5,
                      kv_hit_rate=0.25),
        InventoryEvent(deployment="d", time=1.0, worker_id="w1", role="decode", state="starting", gpus=2),
        ControlEvent(deployment="d", time=2.0, body=SetMinEndpoints(minimums={"prefill": 2})),
        Decision(deployment="d", time=180.0, decision_id=0, targets={"prefill": 2, "decode": 1},
                 previous={"prefill": 1, "decode": 1}, throughput_reason="scale", load_reason="disabled"),
        Ack(deployment="d", time=181.0, decision_id=0, status="applied", observed={"prefill": 2}),
        FpmBatch(deployment="d", time=3.0, fpms=[
            ForwardPassMetrics(deployment="d", time=3.0, role="prefill", worker_id="w", wall_time=0.1)]),
    ]
    for event in events:
        assert decode_event(encode_event(event)) == event


def _fpm_json(**overrides) -> bytes:
    import orjson

    base = {"type": "fpm", "deployment": "d", "time": 1.0, "role": "prefill", "worker_id": "w"}
    base.update(overrides)
    return orjson.dumps(base)


@pytest.mark.parametrize(
    ("raw", "field", "expected"),
    [
        (b"\x00garbage", "", "valid JSON"),
        (b"", "", "empty message"),
        (b'{"type": "nope"}', "type", "one of ack, arrival, clock"),
        (b'{"deployment": "d"}', "type", "one of"),
        (_fpm_json(role="cook"), "role", "'prefill', 'decode' or 'agg'"),
        (_fpm_json(wall_time=-1), "wall_time", "greater than or equal to 0"),
        # a pass of 1e300 s stayed among the perf model's samples and scaled prefill up on every tick
        (_fpm_json(wall_time=1e300), "wall_time", "less than or equal to 600"),
        (_fpm_json(scheduled={"num_decode_requests": -3}), "scheduled.num_decode_requests", ">= 0"),
        (_fpm_json(worker_id=None), "worker_id", "valid string"),
        (_fpm_json(time="soon"), "time", "valid number"),
        (_fpm_json(surprise=1), "surprise", "Extra inputs"),
        (b'{"type":"fpm","deployment":"d","time":1,"role":"prefill"}', "worker_id", "required"),
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"reboot"}}', "body.command", "set_min_endpoints"),
        # reset_perf is a command too: the list of them names it, and its fields are body.<name>
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"reboot"}}', "body.command", "reset_perf"),
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"reset_perf","chnages":{}}}',
         "body.chnages", "Extra inputs"),
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"reset_perf",'
         b'"changes":{"namespace":[99999999999999999999]}}}', "body.changes", "integers within 64 bits"),
        # one request is not a million million tokens: a unit or parsing error (MAX_REQUEST_TOKENS)
        (b'{"type":"request","deployment":"d","time":5,"request_id":"r","input_tokens":1000000000000000000,'
         b'"output_tokens":1,"request_received_ms":1}', "input_tokens", "less than or equal to 10000000"),
        # a request ends after it arrives: one that "arrived" later (seconds sent as milliseconds,
        # or two clocks) would date the deployment's first window after its traffic
        (b'{"type":"request","deployment":"d","time":5,"request_id":"r","input_tokens":10,'
         b'"output_tokens":1,"request_received_ms":5002}', "request_received_ms", "at most the record's time"),
        (b'{"type":"arrival","deployment":"d","time":5,"request_id":"r","input_tokens":10000001}',
         "input_tokens", "less than or equal to 10000000"),
        # a speculative decoder accepts a few tokens a step, not 1e307 (MAX_ACCEPT_LENGTH): an unbounded
        # one made decode's capacity infinite and failed every tick that sized it
        (b'{"type":"request","deployment":"d","time":5,"request_id":"r","input_tokens":10,'
         b'"output_tokens":1,"request_received_ms":1,"accept_length":1e307}', "accept_length",
         "less than or equal to 256"),
        (b'{"type":"control","deployment":"d","time":5,"body":{"command":"seed_traffic","windows":'
         b'[{"start_s":0,"duration_s":1,"num_req":1,"isl":1,"osl":1,"accept_length":300}]}}',
         "body.windows.0.accept_length", "less than or equal to 256"),
        # what the worker sorts and stores by its encoding must encode (an int past 64 bits cannot)
        (b'{"type":"inventory","deployment":"d","time":1,"worker_id":"w","role":"agg","state":"ready",'
         b'"decision_id":99999999999999999999}', "decision_id", "less than or equal to"),
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"set_config",'
         b'"changes":{"namespace":{"a":[99999999999999999999]}}}}', "body.changes", "integers within 64 bits"),
        # a decision read back (the audit, the connectors) is encoded again: 10**23 windows cannot be
        (b'{"type":"decision","deployment":"d","time":5,"decision_id":0,"targets":{"prefill":1},"previous":{},'
         b'"throughput_reason":"scale","load_reason":"disabled","predicted":{"num_req":1,"isl":1,"osl":1,'
         b'"rps":1,"horizon_windows":100000000000000000000000}}', "predicted.horizon_windows",
         "less than or equal to 9223372036854775807"),
        # JSON writes NaN and infinity as null: a change holding one would be stored as another
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"set_config",'
         b'"changes":{"request_timeout_seconds":NaN}}}', "body.changes",
         "finite numbers (JSON writes NaN and infinities as null): request_timeout_seconds is nan"),
        (b'{"type":"control","deployment":"d","time":1,"body":{"command":"reset_perf",'
         b'"changes":{"scheduling":{"weights":[1,-Infinity]}}}}', "body.changes", "scheduling.weights.1 is -inf"),
        (b'{"type":"control","deployment":"d","time":5,"body":{"command":"seed_traffic","windows":'
         b'[{"start_s":0,"duration_s":1,"num_req":1e19,"isl":1,"osl":1}]}}', "body.windows.0.num_req",
         "less than or equal to 1000000000000"),
    ],
)
def test_bad_input_names_field_and_expectation(raw, field, expected):
    with pytest.raises(SchemaError) as info:
        decode_event(raw)
    err = info.value
    assert err.field == field
    assert expected.replace(">= 0", "greater than or equal to 0") in str(err)
    assert str(err).startswith(f"{field or 'message'}:")


def test_non_finite_numbers_rejected():
    for bad in (b"NaN", b"Infinity", b"1e999"):
        raw = b'{"type":"fpm","deployment":"d","role":"prefill","worker_id":"w","time":' + bad + b"}"
        with pytest.raises(SchemaError) as info:
            decode_event(raw)
        assert info.value.field == "time" and "finite number" in str(info.value)


def test_a_config_change_round_trips_exactly():
    """What the worker folds is what its encoding says: a change is stored and sorted by it."""
    raw = (b'{"type":"control","deployment":"d","time":1,"body":{"command":"set_config",'
           b'"changes":{"request_timeout_seconds":1e-7,"namespace":{"a":[9223372036854775807,0.5]}}}}')
    event = decode_event(raw)
    assert decode_event(encode_event(event)) == event
    assert encode_event(decode_event(encode_event(event))) == encode_event(event)


def test_python_side_rejects_non_finite():
    with pytest.raises(ValueError, match=r"time\n  Input should be a finite number"):
        ForwardPassMetrics(deployment="d", time=math.inf, role="prefill", worker_id="w")


def test_oversize_message_is_flagged():
    """At most ``MAX_EVENT_BYTES``: a record of exactly that size is read, one byte more is
    refused. The bridge packs records up to the limit and the worker's FPM fast path reads
    them up to it, so every other record must be read up to it too (a refusal one byte early
    or late passed when only a record a whole MiB over was tried)."""
    fpm = _fpm_json(worker_id="x" * 10)
    at_limit = fpm + b" " * (MAX_EVENT_BYTES - len(fpm))
    assert decode_event(at_limit).worker_id == "x" * 10
    with pytest.raises(SchemaError) as info:
        decode_event(at_limit + b" ")
    assert info.value.oversize
    assert f"at most {MAX_EVENT_BYTES} bytes, got {MAX_EVENT_BYTES + 1}" in str(info.value)


def test_request_ending_as_it_arrived_is_accepted():
    """Arrival and end stamped on one clock may meet, or differ by float rounding."""
    for received_ms in (5000.0, 5000.0 + ARRIVAL_SLACK_MS):
        raw = (b'{"type":"request","deployment":"d","time":5,"request_id":"r","input_tokens":10,'
               b'"output_tokens":1,"request_received_ms":' + str(received_ms).encode() + b"}")
        assert decode_event(raw).arrival_s == received_ms / 1000.0
