"""The bridge without a broker: wire-format decoding, packing, backpressure, retries.

A fake producer stands in for Kafka so a test can hold or fail deliveries at will;
the bridge against the real broker is in test_stream_bridge.py.
"""

from __future__ import annotations

import asyncio
import math
import re

import msgpack
import orjson
import pytest
import zmq
import zmq.asyncio

from fleetplan.connectors.bridge import (
    Bridge,
    BridgeSettings,
    Endpoint,
    decode_message,
    parse_endpoints,
)
from fleetplan.schemas.codec import MAX_EVENT_BYTES, decode_event, encode_event, event_to_dict
from fleetplan.schemas.events import MAX_EVENT_TIME
from fleetplan.schemas.fpm_wire import decode_input
from tests.streams.traffic import T0, fpm, request


def as_dict(event) -> dict:
    return event_to_dict(event)


@pytest.mark.parametrize("encode", [orjson.dumps, msgpack.packb], ids=["json", "msgpack"])
def test_one_event_or_an_array_in_json_or_msgpack(encode):
    one = fpm("alpha", T0, 1)
    events, rejected = decode_message([encode(as_dict(one))])
    assert events == [one] and rejected == []
    many = [fpm("alpha", T0 + i, i) for i in range(3)] + [request("alpha", T0, 7)]
    events, rejected = decode_message([b"fleetplan.fpm", encode([as_dict(e) for e in many])])
    assert events == many and rejected == []


@pytest.mark.parametrize(("frames", "reason", "needle"), [
    ([b"garbage"], "invalid", "JSON or msgpack"),
    ([b"{not json"], "invalid", "valid JSON"),
    ([b"\x85\x01"], "invalid", "valid msgpack"),
    ([b""], "invalid", "empty"),
    ([b"a", b"b", b"c"], "invalid", "frames"),
    ([], "invalid", "frames"),
    ([b'{"type": "fpm", "deployment": "alpha", "time": -1, "role": "agg", "worker_id": "w"}'], "invalid", "time"),
    ([b'{"type": "fpm", "deployment": "alpha", "time": 1, "role": "gpu", "worker_id": "w"}'], "invalid", "role"),
    ([b'{"type": "inventory", "deployment": "alpha", "time": 1, "role": "agg", "worker_id": "w",'
      b' "state": "ready"}'], "invalid", "at the bridge"),
    ([b"[1, 2]"], "invalid", "an object"),
    ([msgpack.packb({1: 2})], "invalid", "msgpack"),
    ([msgpack.packb({"type": msgpack.ExtType(1, b"x")})], "invalid", "type"),
    ([b"[" * 5000 + b"]" * 5000], "invalid", "valid JSON"),
    # nested deep enough to pass the decoders, too deep to encode or show (until 2026-12-05 it
    # raised RecursionError from the repr of the rejected item)
    ([b"[" * 1000 + b"]" * 1000], "invalid", "Recursion limit"),
    ([b"\x91" * 1000 + b"\x90"], "invalid", "Recursion limit"),
    ([orjson.dumps({**as_dict(fpm("alpha", T0, 1)), "worker_id": "w" * (MAX_EVENT_BYTES + 10)})], "oversize", "bytes"),
])
def test_bad_messages_are_rejected_with_a_reason_and_never_raise(frames, reason, needle):
    events, rejected = decode_message(frames)
    assert events == []
    assert len(rejected) >= 1
    assert rejected[0].reason == reason, rejected[0]
    assert needle in rejected[0].detail, rejected[0].detail


def test_a_bad_event_in_an_array_does_not_reject_its_neighbours():
    good = fpm("alpha", T0, 1)
    bad = {**as_dict(good), "counter_id": -5}
    events, rejected = decode_message([orjson.dumps([as_dict(good), bad, "x"])])
    assert events == [good]
    assert [r.reason for r in rejected] == ["invalid", "invalid"]
    assert rejected[0].deployment == "alpha" and "counter_id" in rejected[0].detail


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_in_one_event_of_a_json_array_rejects_that_event_only(token):
    """Python's json.dumps writes NaN and Infinity; orjson refused the whole text over one, so the
    array was dead-lettered whole as "not valid JSON", its good events lost and no field named."""
    import json

    good = fpm("alpha", T0, 1)
    bad = {**as_dict(fpm("alpha", T0, 2)), "wall_time": 0.5}
    text = json.dumps([as_dict(good), bad]).replace("0.5", token).encode()
    events, rejected = decode_message([text])
    assert events == [good]
    assert len(rejected) == 1 and rejected[0].deployment == "alpha" and "wall_time" in rejected[0].detail


def test_text_that_is_not_json_is_still_refused_whole():
    events, rejected = decode_message([b'[{"type": "fpm", "deployment": "a",'])
    assert events == [] and len(rejected) == 1 and rejected[0].detail.startswith("payload: valid JSON")


@pytest.mark.parametrize("encode", [orjson.dumps, msgpack.packb], ids=["json", "msgpack"])
def test_an_array_of_junk_gives_a_bounded_number_of_dead_letters(encode):
    """A 16 MiB message holds millions of one-byte items: each a dead letter of its own (with
    its ~4 KB encoding held until then) took the bridge to tens of GB and a dead-letter
    record per byte. The first ones are dead-lettered one by one, the rest counted in one."""
    good = fpm("alpha", T0, 1)
    events, rejected = decode_message([encode([0] * 99_000 + [as_dict(good)])])
    assert events == [good]
    assert 1 < len(rejected) <= 101
    assert all("an object, got int" in r.detail for r in rejected[:-1])
    assert "98900 more" in rejected[-1].detail and rejected[-1].reason == "invalid"


@pytest.mark.parametrize("encode", [orjson.dumps, msgpack.packb], ids=["json", "msgpack"])
def test_an_array_longer_than_a_message_may_carry_is_refused_whole(encode):
    """Each element is validated on the event loop: 16 MiB of empty objects held every other
    message and heartbeat back for about a minute."""
    good = as_dict(fpm("alpha", T0, 1))
    events, rejected = decode_message([encode([good] + [{}] * 100_000)])
    assert events == []
    assert [(r.reason, r.detail) for r in rejected] == [
        ("oversize", "message: an array of at most 100,000 events, got 100,001")]


def test_endpoint_parsing():
    eps = parse_endpoints(["tcp://engine:5557", "bind:tcp://*:5558"], ["tcp://*:5559", "connect:ipc:///tmp/x"])
    assert eps == [
        Endpoint("sub", "tcp://engine:5557", False), Endpoint("sub", "tcp://*:5558", True),
        Endpoint("pull", "tcp://*:5559", True), Endpoint("pull", "ipc:///tmp/x", False),
    ]
    with pytest.raises(ValueError, match="--pull"):
        parse_endpoints([], ["5559"])


class FakeProducer:
    """Records sends; deliveries complete only when the test says so."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, bytes, asyncio.Future]] = []
        self.delivered: list[tuple[str, bytes]] = []
        self.fail_next_send = 0
        self.auto = False

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic, value, key=None):
        if self.fail_next_send:
            self.fail_next_send -= 1
            raise ConnectionError("broker down")
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((topic, value, fut))
        if self.auto:
            self.deliver()
        return fut

    def deliver(self, n: int | None = None, error: Exception | None = None) -> None:
        todo, self.pending = (self.pending, []) if n is None else (self.pending[:n], self.pending[n:])
        for topic, value, fut in todo:
            if error is None:
                self.delivered.append((topic, value))
                fut.set_result(None)
            else:
                fut.set_exception(error)


def settings(**kw) -> BridgeSettings:
    base = dict(bootstrap="unused:1", endpoints=[], create_topics=False, heartbeat_s=0, pack_within_s=0.01,
                retry_backoff_s=0.01)
    return BridgeSettings(**{**base, **kw})


async def settle(producer: FakeProducer, until, timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not until():
            await asyncio.sleep(0.005)


async def test_fpms_are_packed_per_deployment_and_cut_at_whole_seconds():
    producer = FakeProducer()
    bridge = Bridge(settings(pack_max=4, pack_within_s=10), producer=producer)
    await bridge.start()
    try:
        times = [T0 + 0.1, T0 + 0.2, T0 + 0.9, T0 + 1.1, T0 + 1.2, T0 + 1.3, T0 + 1.4, T0 + 1.5]
        for i, t in enumerate(times):
            await bridge.accept([encode_event(fpm("alpha", t, i))])
        await bridge.accept([encode_event(request("alpha", T0 + 1.5, 1))])
        await settle(producer, lambda: len(producer.pending) == 3)
        producer.auto = True
        producer.deliver()
    finally:
        await bridge.stop()  # flushes the open pack
    batches = [decode_event(v) for t, v in producer.delivered if t.endswith("fpm.v1")]
    assert [[f.time for f in b.fpms] for b in batches] == [times[:3], times[3:7], times[7:]]
    assert all(b.time == b.fpms[-1].time for b in batches)
    assert [decode_event(v).type for t, v in producer.delivered if t.endswith("requests.v1")] == ["request"]
    assert bridge.buffered == 0


async def test_a_full_buffer_stops_intake_until_kafka_acknowledges():
    producer = FakeProducer()
    bridge = Bridge(settings(buffer=5, pack_max=1), producer=producer)
    await bridge.start()
    try:
        for i in range(5):
            await bridge.accept([encode_event(request("alpha", T0 + i, i))])
        assert bridge.buffered == 5
        blocked = asyncio.ensure_future(bridge.accept([encode_event(request("alpha", T0 + 9, 9))]))
        await asyncio.sleep(0.1)
        assert not blocked.done()  # backpressure: the receiver would stop reading ZMQ here
        await settle(producer, lambda: len(producer.pending) == 5)
        producer.deliver(2)
        await asyncio.wait_for(blocked, 2)
        assert bridge.buffered == 4
    finally:
        producer.auto = True
        producer.deliver()
        await bridge.stop()


async def test_failed_produces_are_retried_until_delivered():
    producer = FakeProducer()
    producer.fail_next_send = 3
    bridge = Bridge(settings(), producer=producer)
    await bridge.start()
    try:
        for i in range(3):
            await bridge.accept([encode_event(request("alpha", T0 + i, i))])
        await settle(producer, lambda: len(producer.pending) == 3)
        producer.deliver(error=ConnectionError("lost"))  # the broker died with them in flight
        await settle(producer, lambda: len(producer.pending) == 3)
        producer.deliver()
        await settle(producer, lambda: bridge.buffered == 0)
    finally:
        await bridge.stop()
    ids = [decode_event(v).request_id for _, v in producer.delivered]
    assert ids == [request("alpha", T0, i).request_id for i in range(3)]  # in the order accepted
    assert bridge.metrics.retries._value.get() >= 6


async def test_every_record_a_refused_send_held_back_counts_as_re_sent():
    """A send refused at once (the broker unreachable) keeps the records after it in the window
    back too, and all of them are sent again: fleetplan_bridge_produce_retries_total counted
    the refused one alone."""
    producer = FakeProducer()
    producer.fail_next_send, producer.auto = 1, True
    bridge = Bridge(settings(retry_backoff_s=0.01), producer=producer)
    await bridge.start()
    try:
        for i in range(3):  # accepted before the send loop runs: one window of three
            await bridge.accept([encode_event(request("alpha", T0 + i, i))])
        await settle(producer, lambda: bridge.buffered == 0)
    finally:
        await bridge.stop()
    assert len(producer.delivered) == 3
    assert bridge.metrics.retries._value.get() == 3


async def test_retried_records_go_out_in_the_order_accepted_before_newer_ones():
    """Three records fail in flight, two more are accepted during the backoff: all five
    reach Kafka in the order accepted (a retry used to jump the queue, last failed first)."""
    assert await _delivered_after_three_fail(FakeProducer(), first=3) == [
        request("alpha", T0, i).request_id for i in range(5)]


async def _delivered_after_three_fail(producer, first: int) -> list[str]:
    """Accept ``first`` of five requests, fail the three in flight, accept the rest, let every
    send through: the request ids in the order they reached Kafka."""
    bridge = Bridge(settings(retry_backoff_s=0.05), producer=producer)
    await bridge.start()
    try:
        for i in range(first):  # one window: nothing yields between the accepts
            await bridge.accept([encode_event(request("alpha", T0 + i, i))])
        await settle(producer, lambda: len(producer.pending) == 3)
        producer.deliver(error=ConnectionError("lost"))
        for i in range(first, 5):
            await bridge.accept([encode_event(request("alpha", T0 + i, i))])
        producer.auto = True
        await settle(producer, lambda: bridge.buffered == 0)
    finally:
        await bridge.stop()
    return [decode_event(v).request_id for _, v in producer.delivered]


async def test_a_heartbeat_never_overtakes_a_record_being_retried():
    """A record fails while heartbeats keep coming: it still reaches Kafka before every
    heartbeat and record accepted after it, so the worker's clock cannot pass it and
    dead-letter it as late."""
    producer = FakeProducer()
    bridge = Bridge(settings(retry_backoff_s=0.2, heartbeat_s=0.05), producer=producer)
    await bridge.start()
    try:
        await bridge.accept([encode_event(request("alpha", T0, 0))])
        await settle(producer, lambda: len(producer.pending) >= 1)
        producer.deliver(error=ConnectionError("lost"))
        producer.auto = True
        await bridge.accept([encode_event(request("alpha", T0 + 0.5, 1))])
        await asyncio.sleep(0.4)  # heartbeats are due during the backoff
        await settle(producer, lambda: bridge.buffered == 0)
    finally:
        await bridge.stop()
    on_requests = [decode_event(v) for t, v in producer.delivered if t.endswith("requests.v1")]
    assert [e.request_id for e in on_requests if e.type == "request"] == ["alpha-r0", "alpha-r1"]
    assert sum(e.type == "clock" for e in on_requests) >= 2
    times = [e.time for e in on_requests]
    assert times == sorted(times)  # accepted in event-time order, so delivered in it
    assert on_requests[0].type == "request" and on_requests[0].request_id == "alpha-r0"


def _decoded_by_the_worker(value: bytes):
    return decode_input(value)  # raises SchemaError(oversize) past MAX_EVENT_BYTES, as the worker would


async def test_fpm_packs_are_cut_by_size_as_well_as_by_count():
    """pack_max allows 10,000 FPMs (about 5 MB): packs stay within MAX_EVENT_BYTES, the
    first by splitting, the next cut at the size of the FPMs before them."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(pack_max=10_000, pack_within_s=10), producer=producer)
    await bridge.start()
    n = 4000
    sent = [fpm("alpha", T0 + second + i / n, i, worker=f"w{i % 40}") for second in (0, 1) for i in range(n)]
    try:
        for second in (0, 1):
            burst = sent[second * n:(second + 1) * n]
            assert await bridge.accept([orjson.dumps([as_dict(f) for f in burst])]) == n
    finally:
        await bridge.stop()
    records = [v for t, v in producer.delivered if t.endswith("fpm.v1")]
    assert len(records) >= 2 * 3
    assert all(len(v) <= MAX_EVENT_BYTES for v in records)
    batches = [_decoded_by_the_worker(v) for v in records]
    assert [f.to_model() for b in batches for f in b.fpms] == sent  # every FPM, once, in order
    assert all(math.floor(b.time) == math.floor(b.fpms[0].time) for b in batches)  # no tick straddled
    assert bridge.metrics.deadletters.labels("oversize")._value.get() == 0
    assert bridge.buffered == 0


async def test_a_publishers_batch_that_re_encodes_too_big_is_split_keeping_its_time():
    """5000 FPMs with their defaults left out are 443 KB; filled in, 2.5 MB. The batch goes
    out as pieces within MAX_EVENT_BYTES, each with the batch's time (so its tick)."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(), producer=producer)
    await bridge.start()
    fpms = [{"deployment": "alpha", "time": T0 + 0.9, "role": "decode", "worker_id": f"w{i % 50}",
             "counter_id": i} for i in range(5000)]
    raw = orjson.dumps({"type": "fpm_batch", "deployment": "alpha", "time": T0 + 0.95, "fpms": fpms})
    assert len(raw) < MAX_EVENT_BYTES
    try:
        assert await bridge.accept([raw]) == 1
    finally:
        await bridge.stop()
    records = [v for t, v in producer.delivered if t.endswith("fpm.v1")]
    assert len(records) > 1 and all(len(v) <= MAX_EVENT_BYTES for v in records)
    pieces = [_decoded_by_the_worker(v) for v in records]
    assert all(p.time == T0 + 0.95 for p in pieces)
    assert [f.counter_id for p in pieces for f in p.fpms] == list(range(5000))
    assert bridge.metrics.accepted.labels("fpm_batch")._value.get() == 1
    assert bridge.buffered == 0


async def test_a_publishers_batch_across_a_second_is_packed_again_by_second():
    """Ticks fall on whole seconds and a batch is folded at its time: one that straddles a
    second goes out as the bridge's own packs would, one record per second of its FPMs."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(), producer=producer)
    await bridge.start()
    times = [T0 + 0.2, T0 + 0.9, T0 + 1.1, T0 + 1.4]
    fpms = [{"deployment": "alpha", "time": t, "role": "decode", "worker_id": "w", "counter_id": i}
            for i, t in enumerate(times)]
    try:
        assert await bridge.accept([orjson.dumps({"type": "fpm_batch", "deployment": "alpha",
                                                  "time": T0 + 1.4, "fpms": fpms})]) == 1
    finally:
        await bridge.stop()
    records = [_decoded_by_the_worker(v) for t, v in producer.delivered if t.endswith("fpm.v1")]
    packs = [r for r in records if r.type == "fpm_batch"]
    assert [(p.time, [f.counter_id for f in p.fpms]) for p in packs] == [(T0 + 0.9, [0, 1]), (T0 + 1.4, [2, 3])]


async def test_a_request_that_re_encodes_too_big_is_dead_lettered_not_accepted():
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(), producer=producer)
    await bridge.start()
    body = {"type": "request", "deployment": "alpha", "time": T0, "request_id": "r-1", "input_tokens": 1,
            "output_tokens": 1, "request_received_ms": T0 * 1000}
    body["model"] = "m" * (MAX_EVENT_BYTES - len(orjson.dumps(body)) - 20)
    raw = orjson.dumps(body)
    assert len(raw) <= MAX_EVENT_BYTES
    try:
        assert await bridge.accept([raw]) == 0
    finally:
        await bridge.stop()
    assert [t.rsplit(".", 2)[-2] for t, _ in producer.delivered] == ["deadletter"]
    letter = decode_event(producer.delivered[0][1])
    assert letter.reason == "oversize" and f"at most {MAX_EVENT_BYTES} bytes" in letter.detail
    assert bridge.metrics.accepted.labels("request")._value.get() == 0


async def test_with_max_ahead_an_event_dated_past_the_clock_is_dead_lettered_and_its_neighbours_kept():
    """An engine whose clock is a day fast would move its deployment's event-time clock a day
    on, making every later event late. With ``max_ahead_s`` its events are refused, named as
    such, and the same message's other events (and the other deployment's) still go through;
    no heartbeat follows the refused time."""
    import time

    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(max_ahead_s=60.0, heartbeat_s=0.05), producer=producer)
    await bridge.start()
    now = time.time()
    fast = fpm("alpha", now + 86_400.0, 1, worker="fast")
    message = [as_dict(e) for e in (request("alpha", now - 1.0, 1), fast, fpm("alpha", now + 30.0, 2),
                                    fpm("beta", now, 3))]
    try:
        assert await bridge.accept([orjson.dumps(message)]) == 3
        await bridge.accept([orjson.dumps(as_dict(request("alpha", now + 3600.0, 2)))])
        await settle(producer, lambda: sum(b'"alpha"' in v and b'"clock"' in v for _, v in producer.delivered) >= 2)
    finally:
        await bridge.stop()
    letters = [decode_event(v) for t, v in producer.delivered if "deadletter" in t]
    assert [(d.reason, d.deployment) for d in letters] == [("invalid", "alpha")] * 2
    assert "at most 60 s ahead of the bridge's clock" in letters[0].detail
    assert '"worker_id":"fast"' in letters[0].payload
    assert 3595 < int(re.search(r", (\d+) s ahead", letters[1].detail)[1]) <= 3600
    sent = [decode_event(v) for t, v in producer.delivered if "deadletter" not in t]
    assert max(e.time for e in sent) < now + 60.0
    assert bridge.metrics.ahead._value.get() == 2


async def test_with_max_ahead_a_publishers_batch_loses_only_its_fast_fpms():
    """A sidecar's batch carries several engines' FPMs: the one engine whose clock is fast has its
    FPMs refused, the others' go through, dated by their latest when the batch's own time is fast
    too (a batch is folded at its time), and no heartbeat follows the batch's fast time (a kept
    batch that carried it moved the deployment's heartbeats two hours on, which only heartbeats
    show: the batch itself is packed again by its FPMs' seconds)."""
    import time

    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(max_ahead_s=60.0, heartbeat_s=0.05), producer=producer)
    await bridge.start()
    now = math.floor(time.time())
    fpms = [fpm("alpha", now + 0.2, 1, worker="ok-1"), fpm("alpha", now + 7200.0, 2, worker="fast"),
            fpm("alpha", now + 0.4, 3, worker="ok-2")]
    body = {"type": "fpm_batch", "deployment": "alpha", "time": now + 7200.0, "fpms": [as_dict(f) for f in fpms]}
    try:
        assert await bridge.accept([orjson.dumps(body)]) == 1
        await settle(producer, lambda: sum(b'"clock"' in v for _, v in producer.delivered) >= 2)
    finally:
        await bridge.stop()
    letters = [decode_event(v) for t, v in producer.delivered if "deadletter" in t]
    assert len(letters) == 1 and '"worker_id":"fast"' in letters[0].payload
    assert 7195 < int(re.search(r", (\d+) s ahead", letters[0].detail)[1]) <= 7200  # the clock moved on
    sent = [decode_input(v) for t, v in producer.delivered if "deadletter" not in t]
    batches = [e for e in sent if e.type == "fpm_batch"]
    assert [[f.worker_id for f in b.fpms] for b in batches] == [["ok-1", "ok-2"]]
    assert batches[0].time == now + 0.4
    assert max(e.time for e in sent) < now + 60.0  # the heartbeats too
    assert bridge.metrics.ahead._value.get() == 1


async def test_without_max_ahead_a_backfill_ahead_of_the_clock_is_taken():
    """``simulate --publish`` without ``--realtime`` sends event times ahead of the wall clock on
    purpose; the bridge takes them unless told otherwise."""
    import time

    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(), producer=producer)
    await bridge.start()
    try:
        assert await bridge.accept([encode_event(request("alpha", time.time() + 86_400.0, 1))]) == 1
    finally:
        await bridge.stop()
    assert [t.rsplit(".", 2)[-2] for t, _ in producer.delivered] == ["requests"]


async def test_idle_deployments_get_clock_heartbeats_on_both_topics():
    producer = FakeProducer()
    producer.auto = True  # a topic's next record waits for the one before it to be acknowledged
    bridge = Bridge(settings(heartbeat_s=0.05), producer=producer)
    await bridge.start()
    try:
        await bridge.accept([encode_event(request("alpha", T0, 1))])
        await settle(producer, lambda: sum(b'"clock"' in v for _, v in producer.delivered) >= 4)
    finally:
        await bridge.stop()
    clocks = [(t, decode_event(v)) for t, v in producer.delivered if b'"clock"' in v]
    assert {t.rsplit(".", 2)[-2] for t, _ in clocks} == {"fpm", "requests"}
    times = [c.time for _, c in clocks]
    assert all(t >= T0 for t in times) and times == sorted(times)
    assert all(c.source == "bridge" and c.deployment == "alpha" for _, c in clocks)


async def test_an_event_at_the_last_accepted_time_does_not_stop_heartbeats():
    """The heartbeat of a deployment whose last event is just under 2100 stays at 2100 (the
    schema's limit) instead of failing validation and ending the loop for every deployment."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(heartbeat_s=0.05), producer=producer)
    await bridge.start()
    try:
        assert await bridge.accept([encode_event(request("late", MAX_EVENT_TIME - 0.01, 1))]) == 1
        await settle(producer, lambda: sum(b'"late"' in v and b'"clock"' in v for _, v in producer.delivered) >= 2)
        await bridge.accept([encode_event(request("alpha", T0, 2))])
        await settle(producer, lambda: any(b'"alpha"' in v and b'"clock"' in v for _, v in producer.delivered))
    finally:
        await bridge.stop()
    late = [decode_event(v).time for _, v in producer.delivered if b'"late"' in v and b'"clock"' in v]
    assert max(late) == MAX_EVENT_TIME
    assert bridge.metrics.tick_errors._value.get() == 0


async def test_an_idle_topic_hears_of_each_whole_heartbeat_of_event_time_right_away():
    """FPMs flowing, no requests: once the clock crosses T0 + 1 the requests topic gets a
    heartbeat at once, not heartbeat_s (here 1 s) after its previous one, so a tick at a
    whole second is not held back by the idle topic."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(heartbeat_s=1.0), producer=producer)
    await bridge.start()

    def requests_clock() -> float:
        times = [decode_event(v).time for t, v in producer.delivered
                 if t.endswith("requests.v1") and b'"clock"' in v]
        return max(times, default=0.0)

    try:
        for i, t in enumerate([T0 + 0.3, T0 + 0.5, T0 + 0.7, T0 + 0.9]):
            await bridge.accept([encode_event(fpm("alpha", t, i))])
            await asyncio.sleep(0.01)
        await settle(producer, lambda: requests_clock() >= T0 + 0.3)  # the topic was never heard of
        assert requests_clock() < T0 + 1
        crossed = asyncio.get_running_loop().time()
        await bridge.accept([encode_event(fpm("alpha", T0 + 1.05, 9))])
        await settle(producer, lambda: requests_clock() >= T0 + 1.05)
        waited = asyncio.get_running_loop().time() - crossed
    finally:
        await bridge.stop()
    assert waited < 0.5  # the wall-clock rule alone would wait about 1 s


async def test_bad_input_over_zmq_is_dead_lettered_and_the_bridge_keeps_going():
    producer = FakeProducer()
    producer.auto = True  # a topic's next record waits for the one before it to be acknowledged
    bridge = Bridge(settings(endpoints=[Endpoint("pull", "tcp://127.0.0.1:*", True)]), producer=producer)
    await bridge.start()
    push = zmq.asyncio.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(bridge.bound[0])
    try:
        await push.send_multipart([b"\xff\xfe garbage"])
        await push.send_multipart([b"a", b"b", b"c"])
        await push.send_multipart([encode_event(request("alpha", T0, 1))])
        await settle(producer, lambda: len(producer.delivered) == 3)
    finally:
        push.close(0)
        await bridge.stop()
    topics = [t.rsplit(".", 2)[-2] for t, _ in producer.delivered]
    assert sorted(topics) == ["deadletter", "deadletter", "requests"]
    letters = [decode_event(v) for t, v in producer.delivered if "deadletter" in t]
    assert all(d.reason == "invalid" and d.source_topic.startswith("zmq:pull:") for d in letters)


async def test_deployments_gone_quiet_are_forgotten_without_heartbeats_too(monkeypatch):
    """With --heartbeat 0 the map of deployments was pruned nowhere: every name a publisher
    ever sent stayed for the bridge's life."""
    from fleetplan.connectors import bridge as bridge_module

    monkeypatch.setattr(bridge_module, "FORGET_AFTER_S", 0.05)
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(heartbeat_s=0), producer=producer)
    await bridge.start()
    try:
        for i in range(3):
            await bridge.accept([encode_event(request(f"dep-{i}", T0, i))])
        assert len(bridge._sources) == 3
        await settle(producer, lambda: not bridge._sources)
    finally:
        await bridge.stop()


def test_a_single_event_with_more_than_15_fields_in_msgpack_is_a_map16():
    """A request_end row with all its fields is a msgpack map16 (first byte 0xde), not a fixmap."""
    one = request("alpha", T0, 7)
    packed = msgpack.packb(as_dict(one))
    assert packed[0] == 0xDE
    assert decode_message([packed]) == ([one], [])


def test_json_after_leading_whitespace_is_json():
    one = request("alpha", T0, 7)
    assert decode_message([b"\n  " + encode_event(one)]) == ([one], [])


@pytest.mark.parametrize("kind", ["decision", "ack"])
def test_decisions_and_acks_are_refused_at_the_bridge(kind):
    """They have their own producers: one sent through the bridge would land on the requests topic."""
    from fleetplan.schemas.events import Ack, Decision

    event = {"decision": Decision(deployment="alpha", time=T0, decision_id=1, targets={"decode": 2},
                                  previous={"decode": 1}, throughput_reason="scale", load_reason="scale_up"),
             "ack": Ack(deployment="alpha", time=T0, decision_id=1, status="applied")}[kind]
    events, rejected = decode_message([encode_event(event)])
    assert events == [] and len(rejected) == 1
    assert "at the bridge" in rejected[0].detail and kind in rejected[0].detail


async def test_fpms_of_one_second_out_of_order_are_packed_at_the_latest_time():
    """Engines' FPMs of one second arrive in any order; the pack is dated by its latest FPM
    (a batch dated before one of its FPMs is invalid), so none is lost."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(pack_max=10, pack_within_s=0.01), producer=producer)
    await bridge.start()
    try:
        for i, t in enumerate([T0 + 0.5, T0 + 0.2, T0 + 0.4]):
            await bridge.accept([encode_event(fpm("alpha", t, i, worker=f"w{i}"))])
        await settle(producer, lambda: bridge.buffered == 0)
    finally:
        await bridge.stop()
    (batch,) = [decode_event(v) for t, v in producer.delivered if t.endswith("fpm.v1")]
    assert batch.time == T0 + 0.5 and [f.time for f in batch.fpms] == [T0 + 0.5, T0 + 0.2, T0 + 0.4]
    assert bridge.metrics.tick_errors._value.get() == 0


async def test_a_publishers_batch_larger_than_the_whole_buffer_is_let_through():
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(buffer=5), producer=producer)
    await bridge.start()
    body = {"type": "fpm_batch", "deployment": "alpha", "time": T0 + 0.9,
            "fpms": [as_dict(fpm("alpha", T0 + i / 10, i)) for i in range(10)]}
    try:
        assert await asyncio.wait_for(bridge.accept([orjson.dumps(body)]), 2) == 1
        await settle(producer, lambda: bridge.buffered == 0)
    finally:
        await bridge.stop()
    assert [len(decode_event(v).fpms) for t, v in producer.delivered if t.endswith("fpm.v1")] == [10]


async def test_a_buffer_full_of_an_open_pack_does_not_wait_on_a_heartbeat():
    """A heartbeat due while the buffer is full waits for the next round: taking room for it
    would hold the round, and with it the flush of the pack that fills the buffer, for good."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(buffer=3, pack_max=10, pack_within_s=0.2, heartbeat_s=0.02), producer=producer)
    await bridge.start()
    try:
        for i in range(3):
            await bridge.accept([encode_event(fpm("alpha", T0 + i / 10, i))])
        await settle(producer, lambda: any(t.endswith("fpm.v1") and b'"fpm_batch"' in v
                                           for t, v in producer.delivered))
    finally:
        await bridge.stop(drain_timeout_s=1)
    assert bridge.buffered == 0


async def test_records_refused_at_send_and_failed_in_flight_are_retried_in_the_order_accepted():
    """Three records in flight, the fourth refused by ``send`` (so the fifth is not handed over),
    then the three fail: the retry sends all five in the order they were accepted."""

    class RefusesTheFourth(FakeProducer):
        def __init__(self) -> None:
            super().__init__()
            self.sends = 0

        async def send(self, topic, value, key=None):
            self.sends += 1
            if self.sends == 4:
                raise ConnectionError("broker down")
            return await super().send(topic, value, key)

    assert await _delivered_after_three_fail(RefusesTheFourth(), first=5) == [
        request("alpha", T0, i).request_id for i in range(5)]


async def test_a_heartbeat_is_never_dated_before_the_one_sent_before_it():
    """An event older than the clock the bridge extrapolated (a publisher a little behind
    another) must not take the heartbeats back: one dated before a fired tick is late."""
    import time

    from fleetplan.connectors.bridge import _Source

    bridge = Bridge(settings(heartbeat_s=0.01))  # not started: heartbeats stay queued in their lanes
    now = time.monotonic()
    bridge._sources["alpha"] = _Source(latest=T0, seen_at=now - 5.0)  # its clock is at T0 + 5 now
    await bridge._heartbeats()
    bridge._observe(request("alpha", T0 + 1.0, 1))  # one second past T0, received just now
    for src in bridge._sources.values():
        src.last_sent = dict.fromkeys(src.last_sent, -math.inf)  # both topics are due again
    await bridge._heartbeats()
    per_topic = [[decode_event(out.value).time for out in lane.waiting] for lane in bridge._lanes.values()]
    assert len(per_topic) == 2 and all(len(beats) == 2 and beats[1] >= beats[0] for beats in per_topic)


async def test_a_publishers_batch_goes_out_after_the_open_pack_accepted_before_it():
    """One engine sends single FPMs, another (a sidecar) batches: a batch of the next second
    went out ahead of the pack of FPMs accepted before it, dated a second earlier, so with a
    grace under that lead the worker dead-lettered the pack as late."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(pack_max=10, pack_within_s=10), producer=producer)
    await bridge.start()
    body = {"type": "fpm_batch", "deployment": "alpha", "time": T0 + 1.3,
            "fpms": [as_dict(fpm("alpha", T0 + 1.2, 1, worker="w1")), as_dict(fpm("alpha", T0 + 1.3, 2, worker="w1"))]}
    try:
        await bridge.accept([encode_event(fpm("alpha", T0 + 0.9, 0))])
        await bridge.accept([orjson.dumps(body)])
        await settle(producer, lambda: len(producer.delivered) >= 1)
    finally:
        await bridge.stop()  # flushes a pack still open
    assert [decode_event(v).time for t, v in producer.delivered if t.endswith("fpm.v1")] == [T0 + 0.9, T0 + 1.3]


async def test_an_idle_fpm_heartbeat_never_goes_ahead_of_the_open_pack():
    """A pack open when the FPM topic's idle heartbeat fell due: the heartbeat, dated by the
    deployment's latest event plus the wall time since, went out before the pack of
    earlier FPMs on the same lane, moving the worker's clock past them."""
    producer = FakeProducer()
    producer.auto = True
    bridge = Bridge(settings(pack_max=10, pack_within_s=0.3, heartbeat_s=0.05), producer=producer)
    await bridge.start()
    try:
        await bridge.accept([encode_event(fpm("alpha", T0 + 0.9, 0))])
        await settle(producer, lambda: any(t.endswith("fpm.v1") and b'"fpm_batch"' in v
                                           for t, v in producer.delivered))
    finally:
        await bridge.stop()
    on_fpm = [decode_event(v) for t, v in producer.delivered if t.endswith("fpm.v1")]
    times = [e.time for e in on_fpm]
    assert times == sorted(times), [(e.type, round(e.time - T0, 3)) for e in on_fpm]


async def test_stopping_takes_in_the_message_a_full_buffer_held_in_hand():
    """SIGTERM while intake waits for room: the message already read from ZMQ (its publisher
    has let it go) was dropped by cancelling the receiver, neither produced nor dead-lettered."""
    producer = FakeProducer()
    bridge = Bridge(settings(buffer=2, endpoints=[Endpoint("pull", "tcp://127.0.0.1:*", True)]), producer=producer)
    await bridge.start()
    push = zmq.asyncio.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(bridge.bound[0])
    try:
        for i in range(3):
            await push.send(encode_event(request("alpha", T0 + i, i)))
        await settle(producer, lambda: len(producer.pending) == 2)
        await asyncio.sleep(0.1)  # the third is in hand, waiting for room
        assert bridge.metrics.messages.labels(bridge.settings.endpoints[0].label)._value.get() == 3
        producer.auto = True
        producer.deliver()
    finally:
        await bridge.stop(drain_timeout_s=2)
        push.close(0)
    assert [decode_event(v).request_id for _, v in producer.delivered] == [f"alpha-r{i}" for i in range(3)]


async def test_no_heartbeat_goes_ahead_of_a_message_waiting_for_room():
    """Kafka stalls with the buffer full and a receiver holding a message: when acks free room,
    a heartbeat round that ran before the receiver resumed sent clocks dated past that message
    (latest + the stall), ahead of it on its lane; after a stall past the grace the worker would
    take the message as late."""
    bridge = Bridge(settings(buffer=2, heartbeat_s=0.05))  # not started: records stay in their lanes
    for i in range(2):
        await bridge.accept([encode_event(request("alpha", T0 + i * 0.01, i))])
    held = asyncio.ensure_future(bridge.accept([encode_event(request("alpha", T0 + 0.02, 2))]))
    await asyncio.sleep(0.3)  # the stall
    bridge._release(2)  # acks come back; the round runs before the receiver resumes
    await bridge._heartbeats()
    bridge._release(2)  # more acks: room for the held message whatever the round took
    await asyncio.wait_for(held, 5)
    for lane in bridge._lanes.values():
        times = [decode_event(o.value).time for o in lane.waiting]
        assert times == sorted(times), (lane.key, [t - T0 for t in times])
