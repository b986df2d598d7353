"""``fleetplan bridge``: engines and frontends publish over ZMQ; the bridge puts it on Kafka.

Engines publish forward-pass metrics (FPMs) and frontends publish finished
request records over ZMQ, to SUB or PULL endpoints of the bridge. The bridge:

* decodes each message (JSON or msgpack, one event or an array of events;
  the format is in docs/wire-format.md) and validates every event with the
  schemas, so nothing malformed reaches the planner;
* packs a deployment's FPMs into ``FpmBatch`` records (cut at whole seconds
  of event time, so no record straddles a tick boundary: tick intervals
  are whole seconds), because per-record cost, not per-FPM cost, bounds the
  worker's ingest;
* keeps every record it produces within ``MAX_EVENT_BYTES``, which the worker
  dead-letters whole: packs are cut by size as well as by count, and a
  publisher's ``fpm_batch`` that re-encodes bigger is split;
* produces with an idempotent producer (``acks=all``), keyed by deployment,
  and keeps each (topic, deployment) in the order accepted, retries
  included, so no record falls behind a later heartbeat and comes late;
* holds at most ``buffer`` accepted-but-unacknowledged events: when full it
  stops reading, so PUSH senders block (ZMQ high-water mark) and PUB
  publishers drop at *their* side, never silently inside the bridge;
* retries a failed produce until the broker takes it, so an accepted event
  survives a broker restart (at least once), in its place in the order;
* sends a clock heartbeat for a deployment's topic that has been idle for
  ``heartbeat_s``, so the worker's event-time clock keeps moving; its time
  is the deployment's latest event time plus the wall time since, so it
  stays in the sources' clock domain rather than the bridge's. A topic
  that carried nothing since the deployment's clock crossed a multiple of
  ``heartbeat_s`` gets its heartbeat right then, not up to ``heartbeat_s``
  later: ticks fall on whole seconds, so with a grace period that is a
  multiple of ``heartbeat_s`` an idle topic (requests, at low traffic) no
  longer holds a tick back by up to ``heartbeat_s``;
* with ``max_ahead_s`` set, dead-letters an event dated further ahead of the
  bridge's wall clock than that: one engine whose clock is a day fast would move
  its deployment's event-time clock a day on, and every event after it at
  the true time would come late (docs/runtime.md, "A clock that jumps").
  Off by default, since a backfill (``simulate --publish`` without
  ``--realtime``) sends times ahead of the wall clock on purpose;
* dead-letters anything invalid with the reason, and never crashes on input.

It stamps nothing it cannot know: events carry their own event time and
deployment; the bridge only adds heartbeats, which say so (``source``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import msgpack
import orjson
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from fleetplan.schemas.codec import (
    MAX_EVENT_BYTES,
    SchemaError,
    decode_dict,
    encode_event,
    event_to_dict,
)
from fleetplan.schemas.events import (
    MAX_EVENT_TIME,
    MAX_NAME_LENGTH,
    ClockEvent,
    DeadLetter,
    ForwardPassMetrics,
    FpmBatch,
)

log = logging.getLogger("fleetplan.bridge")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest ZMQ message read (an array of events); each event is still held to MAX_EVENT_BYTES."""

ACCEPTED_TYPES = ("fpm", "fpm_batch", "request", "arrival")
PAYLOAD_LIMIT = 4096
MAX_EVENTS_PER_MESSAGE = 100_000
"""Longest array of events one message may carry; a longer one is dead-lettered whole. Each
element is validated on the event loop: 100,000 empty objects took 0.43 s (bench/input_bounds.py),
so the 16 million of a 16 MiB msgpack array would hold every other message and heartbeat back
for over a minute."""
MAX_REJECTED_PER_MESSAGE = 100
"""Bad events of one array dead-lettered one by one; the rest are counted in one more dead
letter. A 16 MiB array holds millions of one-byte items, and a dead letter each (each
holding its encoding until sent) ran the bridge out of memory."""
PACK_FILL = 0.9
"""Share of ``MAX_EVENT_BYTES`` a pack is planned to fill: FPMs differ in size
(names, digits), so a pack cut by the size of the ones before it keeps room."""
FORGET_AFTER_S = 600.0
"""A deployment silent this long gets no more heartbeats (it is probably gone)."""

_MSGPACK_FIRST = frozenset(range(0x80, 0xA0)) | {0xDC, 0xDD, 0xDE, 0xDF}


# --- endpoints -------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    kind: Literal["sub", "pull"]
    address: str
    bind: bool

    @property
    def label(self) -> str:
        return f"zmq:{self.kind}:{self.address}"


class EndpointError(ValueError):
    """A ZMQ endpoint the bridge cannot bind or connect to, named by its option."""


def parse_endpoints(sub: list[str], pull: list[str]) -> list[Endpoint]:
    """``--sub`` connects unless given as ``bind:ADDR``; ``--pull`` binds unless ``connect:ADDR``."""
    out: list[Endpoint] = []
    for kind, items, default_bind in (("sub", sub, False), ("pull", pull, True)):
        for item in items:
            mode, sep, address = item.partition(":")
            if sep and mode in ("bind", "connect") and "//" in address:
                bind = mode == "bind"
            else:
                address, bind = item, default_bind
            problem = _address_problem(address, bind)
            if problem is not None:
                raise ValueError(f"--{kind}: {problem}, got {item!r}")
            out.append(Endpoint(kind, address, bind))  # type: ignore[arg-type]
    return out


_ZMQ_TRANSPORTS = ("tcp", "ipc", "inproc")


def _address_problem(address: str, bind: bool) -> str | None:
    """What is wrong with a ZMQ address that can be told before binding, or None.

    An address ZMQ would take but never reach (a tcp address without a port,
    a wildcard host to connect to) is refused here, before any connection;
    one it refuses only when binding is named by ``Bridge.start``.
    """
    transport, sep, rest = address.partition("://")
    if not sep or transport not in _ZMQ_TRANSPORTS or not rest:
        return "a ZMQ address like tcp://host:port, ipc:///path or inproc://name"
    if transport != "tcp":
        return None
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return "a tcp address needs host:port with a port in 1..65535"
    if host == "*" and not bind:
        return "a wildcard host (*) can only be bound, not connected to"
    return None


@dataclass
class BridgeSettings:
    bootstrap: str
    endpoints: list[Endpoint]
    topic_prefix: str = ""
    partitions: int = 8
    replication: int | None = None
    create_topics: bool = True
    buffer: int = 100_000
    pack_max: int = 256
    pack_within_s: float = 0.02
    heartbeat_s: float = 1.0
    linger_ms: int = 5
    max_batch_bytes: int = 1024 * 1024
    retry_backoff_s: float = 0.5
    metrics_port: int | None = None
    max_ahead_s: float | None = None
    """Seconds an event may be dated ahead of the bridge's wall clock (None: any)."""


# --- decoding ---------------------------------------------------------------------


@dataclass
class Rejected:
    """Input that cannot be used, with the reason for the dead-letter topic."""

    reason: Literal["invalid", "oversize"]
    detail: str
    deployment: str
    payload: bytes


def decode_message(frames: list[bytes]) -> tuple[list, list[Rejected]]:
    """(valid events, rejections) of one ZMQ message. Never raises."""
    if not frames or len(frames) > 2:
        raw = b"".join(frames)[:PAYLOAD_LIMIT]
        return [], [Rejected("invalid", f"message: 1 or 2 frames (optional label, payload), got {len(frames)}",
                             "unknown", raw)]
    payload = frames[-1]
    if len(payload) > MAX_MESSAGE_BYTES:
        return [], [Rejected("oversize", f"message: at most {MAX_MESSAGE_BYTES} bytes, got {len(payload)}",
                             "unknown", payload[:PAYLOAD_LIMIT])]
    stripped = payload.lstrip()
    if not stripped:
        return [], [Rejected("invalid", "payload: a JSON or msgpack event, got an empty frame", "unknown", payload)]
    first = stripped[0]
    try:
        if first in b"{[":
            obj = _json_loads(payload)
        elif first in _MSGPACK_FIRST:
            obj = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
        else:
            return [], [Rejected("invalid", "payload: a JSON or msgpack object or array of events",
                                 "unknown", payload)]
    except Exception as err:  # noqa: BLE001 - every decoder error is bad input, never a crash
        kind = "JSON" if first in b"{[" else "msgpack"
        return [], [Rejected("invalid", f"payload: valid {kind} ({type(err).__name__}: {err})"[:500],
                             "unknown", payload)]
    items = obj if isinstance(obj, list) else [obj]
    single = not isinstance(obj, list)
    if len(items) > MAX_EVENTS_PER_MESSAGE:
        return [], [Rejected("oversize", f"message: an array of at most {MAX_EVENTS_PER_MESSAGE:,} events, "
                             f"got {len(items):,}", "unknown", payload[:PAYLOAD_LIMIT])]
    events, rejected = [], []
    more = 0  # bad events past MAX_REJECTED_PER_MESSAGE
    for item in items:
        if more and not isinstance(item, dict):
            more += 1  # cheap: not an event, and its own dead letter would not be sent anyway
            continue
        event, problem = _validate(item, payload if single else None)
        if event is not None:
            events.append(event)
        elif len(rejected) < MAX_REJECTED_PER_MESSAGE:
            rejected.append(problem)
        else:
            more += 1
    if more:
        rejected.append(Rejected(
            "invalid", f"message: {more} more bad events in this array of {len(items)}, not dead-lettered "
            f"one by one (the first {MAX_REJECTED_PER_MESSAGE} were)", "unknown", payload[:PAYLOAD_LIMIT]))
    return events, rejected


def _json_loads(payload: bytes):
    """The JSON payload's value; NaN and Infinity read as floats for the events to refuse.

    orjson refuses the whole text over one ``NaN`` (which Python's
    ``json.dumps`` writes by default), so an array was dead-lettered whole,
    as "not valid JSON", where wire-format.md promises its good events are
    kept and the bad one dead-lettered naming its field. Only a text orjson
    refuses is read again, by the standard library's parser, which takes
    them; the schemas then refuse the non-finite field by name.
    """
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        try:
            return json.loads(payload)
        except (ValueError, RecursionError):
            pass
        raise


def _shown(item) -> bytes:
    """The start of an item that cannot be encoded, for the dead letter: its repr, cut short."""
    try:
        return repr(item)[:PAYLOAD_LIMIT].encode()
    except RecursionError:
        return f"<{type(item).__name__} nested too deeply to show>".encode()


def _validate(item, raw: bytes | None):
    deployment = "unknown"
    if isinstance(item, dict):
        d = item.get("deployment")
        if isinstance(d, str) and 0 < len(d) <= MAX_NAME_LENGTH:
            deployment = d
    try:
        encoded = raw if raw is not None else orjson.dumps(item)
    except Exception as err:  # noqa: BLE001 - e.g. msgpack bytes or ext values
        return None, Rejected("invalid", f"event: plain JSON-like values ({err})"[:300], deployment,
                              _shown(item))
    if len(encoded) > MAX_EVENT_BYTES:
        return None, Rejected("oversize", f"event: at most {MAX_EVENT_BYTES} bytes, got {len(encoded)}",
                              deployment, encoded[:PAYLOAD_LIMIT])
    if not isinstance(item, dict):
        return None, Rejected("invalid", f"event: an object, got {type(item).__name__}", deployment, encoded)
    try:
        event = decode_dict(item)
    except SchemaError as err:
        return None, Rejected("invalid", str(err), deployment, encoded)
    except Exception as err:  # noqa: BLE001 - a validator surprise is still bad input
        return None, Rejected("invalid", f"event: {type(err).__name__}: {err}"[:300], deployment, encoded)
    if event.type not in ACCEPTED_TYPES:
        return None, Rejected("invalid", f"type: one of {', '.join(ACCEPTED_TYPES)} at the bridge, got {event.type!r}",
                              deployment, encoded)
    return event, None


def _straddles_a_second(batch: FpmBatch) -> bool:
    """Whether a publisher's batch holds FPMs of more than one whole second of event time.

    Ticks fall on whole seconds, and the core folds a batch at the tick its
    ``time`` falls in, so such a batch would fold its earlier FPMs a tick late
    (and differently from the same FPMs sent one by one).
    """
    times = [f.time for f in batch.fpms]
    return math.floor(min(times)) != math.floor(batch.time)


def fpm_records(batch: FpmBatch) -> list[tuple[bytes, int]]:
    """``batch`` encoded as (record, FPMs in it), each record within ``MAX_EVENT_BYTES``.

    A batch that encodes too big is cut into consecutive pieces, in its order,
    each keeping the batch's ``time``: the worker places a batch in a tick by
    its time, so the pieces fall in the tick the whole batch would (none comes
    late for being cut), and folding a batch equals folding its FPMs one by one
    (``_apply_fpm_batch``), so the pieces fold as the batch does. (Pieces of
    equal time are folded in the order of their first FPMs, which is theirs
    for a batch in time order.) One FPM always fits: its names are at most 256
    characters.
    """
    value = encode_event(batch)
    n = len(batch.fpms)
    if len(value) <= MAX_EVENT_BYTES or n == 1:
        return [(value, n)]
    pieces = min(n, math.ceil(len(value) / (MAX_EVENT_BYTES * PACK_FILL)))
    step = math.ceil(n / pieces)
    out: list[tuple[bytes, int]] = []
    for i in range(0, n, step):
        piece = FpmBatch(deployment=batch.deployment, time=batch.time, fpms=batch.fpms[i:i + step])
        out.extend(fpm_records(piece))
    return out


# --- the bridge --------------------------------------------------------------------


@dataclass
class Outgoing:
    """One record to produce, and how many accepted events it carries."""

    topic: str
    key: bytes
    value: bytes
    events: int
    attempts: int = 0
    seq: int = 0  # order of acceptance, set when enqueued


@dataclass
class _Window:
    """The records of a lane handed to the producer together."""

    records: list[Outgoing]
    unresolved: int = 0  # handed over, delivery not known yet
    handing: bool = True  # still being handed over
    failed: list[Outgoing] = field(default_factory=list)  # to re-send: refused, failed, or never handed over
    attempts_failed: int = 0  # records to send again: refused or failed, or held back behind a refusal
    error: object = None


@dataclass
class _Lane:
    """One (topic, deployment): its records reach Kafka in the order accepted.

    At most one window is with the producer at a time; what is accepted
    meanwhile waits here, and the window's failed records are re-sent first,
    so neither a newer record nor a heartbeat overtakes a retried one (the
    worker would dead-letter it as late once a heartbeat moved its tick on).

    The idempotent producer alone does not give this order: aiokafka keeps one
    batch per partition in flight and retries it, but fails a batch that waits
    too long for a partition leader (and ``send`` itself can fail), and a
    re-send is a new record, behind whatever was delivered meanwhile. Waiting
    one window costs a lane a produce round trip, which aiokafka's one batch
    in flight per partition costs anyway. Within one window order can still
    break if aiokafka splits it into batches and fails an earlier one only.
    """

    key: tuple[str, bytes]
    waiting: deque[Outgoing] = field(default_factory=deque)
    window: _Window | None = None
    backing_off: bool = False
    scheduled: bool = False


@dataclass
class _Pack:
    fpms: list[ForwardPassMetrics] = field(default_factory=list)
    second: int = 0
    started: float = 0.0


@dataclass
class _Source:
    """What the bridge knows of one deployment's clock."""

    latest: float
    seen_at: float
    last_sent: dict[str, float] = field(default_factory=dict)
    clock_sent: float = 0.0
    # per topic, the latest event time a record sent on it carried (data or heartbeat)
    sent_time: dict[str, float] = field(default_factory=dict)
    # encoded bytes per FPM of the deployment's latest FPM record, to cut packs by size
    fpm_bytes: float = 0.0


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.messages = Counter("fleetplan_bridge_messages", "ZMQ messages received", ["endpoint"], registry=r)
        self.accepted = Counter("fleetplan_bridge_events_accepted", "valid events accepted", ["type"], registry=r)
        self.deadletters = Counter("fleetplan_bridge_deadletters", "inputs dead-lettered", ["reason"], registry=r)
        self.produced = Counter("fleetplan_bridge_records_produced", "records acknowledged by Kafka", ["topic"],
                                registry=r)
        self.retries = Counter("fleetplan_bridge_produce_retries", "records re-sent after a failed produce",
                               registry=r)
        # no deployment label: the names come from the input, refused input included
        self.ahead = Counter("fleetplan_bridge_events_ahead", "events dead-lettered as dated too far ahead "
                             "of the bridge's clock (--max-ahead): a publisher's clock is wrong", registry=r)
        self.heartbeats = Counter("fleetplan_bridge_heartbeats", "clock heartbeats sent", registry=r)
        self.tick_errors = Counter("fleetplan_bridge_tick_errors", "pack flush / heartbeat rounds that failed",
                                   registry=r)
        self.buffered = Gauge("fleetplan_bridge_buffered_events", "accepted events not yet acknowledged by Kafka",
                              registry=r)


class Bridge:
    """ZMQ in, Kafka out. ``await start()``, then ``await stop()``."""

    def __init__(self, settings: BridgeSettings, metrics: BridgeMetrics | None = None, *, producer=None) -> None:
        from fleetplan.streams.topics import Topics

        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.metrics = metrics or BridgeMetrics()
        self.ctx = zmq.asyncio.Context.instance()
        self.sockets: list[tuple[Endpoint, zmq.asyncio.Socket]] = []
        self.producer = producer  # injected in tests; else an idempotent aiokafka producer at start
        self._buffered = 0
        self._room = asyncio.Event()
        self._room.set()
        self._lanes: dict[tuple[str, bytes], _Lane] = {}
        self._due: deque[_Lane] = deque()  # lanes with records to hand to the producer
        self._seq = 0
        self._ready = asyncio.Event()
        self._packs: dict[str, _Pack] = {}
        self._sources: dict[str, _Source] = {}
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._retries: set[asyncio.Task] = set()
        self._in_hand: set[asyncio.Task] = set()  # receivers taking in a message read from ZMQ
        self._waiting = 0  # callers of _reserve waiting for buffer room
        self.bound: list[str] = []

    # --- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        from fleetplan.streams.topics import MAX_RECORD_BYTES, ensure_topics, event_log_specs

        s = self.settings
        self._open_sockets()  # first: an address ZMQ refuses stops it before the topics are created
        try:
            if s.create_topics:
                await ensure_topics(s.bootstrap, event_log_specs(self.topics, s.partitions),
                                    replication=s.replication)
            if self.producer is None:
                self.producer = AIOKafkaProducer(
                    bootstrap_servers=s.bootstrap, acks="all", enable_idempotence=True, linger_ms=s.linger_ms,
                    max_batch_size=s.max_batch_bytes, max_request_size=MAX_RECORD_BYTES,
                    request_timeout_ms=30_000, retry_backoff_ms=200,
                )
            await self.producer.start()
        except BaseException:
            self._close_sockets()  # a later start (a test's) can bind them again
            raise
        loop = asyncio.get_running_loop()
        for ep, sock in self.sockets:
            self._tasks.append(loop.create_task(self._receive(ep, sock), name=f"receive {ep.label}"))
        self._tasks.append(loop.create_task(self._send_loop(), name="send"))
        self._tasks.append(loop.create_task(self._tick_loop(), name="pack and heartbeat"))
        log.info("bridge up: %s -> %s", ", ".join(self.bound), s.bootstrap)

    def _open_sockets(self) -> None:
        """Bind or connect every endpoint; nothing is read from them until the receivers start.

        An address ZMQ refuses only when it is bound (a port in use, an ipc path
        without its directory, a host not this machine's) raises EndpointError naming it.
        """
        for ep in self.settings.endpoints:
            sock = self.ctx.socket(zmq.SUB if ep.kind == "sub" else zmq.PULL)
            self.sockets.append((ep, sock))
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # larger messages are dropped by ZMQ
            if ep.kind == "sub":
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            try:
                if ep.bind:
                    sock.bind(ep.address)
                    self.bound.append(sock.getsockopt(zmq.LAST_ENDPOINT).decode())
                else:
                    sock.connect(ep.address)
                    self.bound.append(ep.address)
            except zmq.ZMQError as err:
                self._close_sockets()
                verb = "bind" if ep.bind else "connect to"
                raise EndpointError(f"--{ep.kind}: cannot {verb} {ep.address} ({err.strerror})") from None

    def _close_sockets(self) -> None:
        for _, sock in self.sockets:
            sock.close()
        self.sockets.clear()
        self.bound.clear()

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop reading, flush what was accepted (up to ``drain_timeout_s``), close."""
        if self._stopping:
            return
        self._stopping = True
        deadline = time.monotonic() + drain_timeout_s
        receivers = [t for t in self._tasks if t.get_name().startswith("receive")]
        for t in receivers:
            if t not in self._in_hand:  # waiting on ZMQ: nothing read is lost
                t.cancel()
        # a receiver with a message in hand (waiting for buffer room) takes it in first: it was
        # read from ZMQ, so its publisher has let it go, and cancelling dropped it unrecorded
        _, late = await asyncio.wait(receivers, timeout=drain_timeout_s) if receivers else ((), ())
        for t in late:
            log.error("bridge stopped with a message in hand not taken in (no buffer room)")
            t.cancel()
        await asyncio.gather(*receivers, return_exceptions=True)
        self._flush_packs(force=True)
        try:
            await asyncio.wait_for(self._wait_drained(), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            log.error("bridge stopped with %d accepted events not acknowledged by Kafka", self._buffered)
        for t in (*self._tasks, *self._retries):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._retries, return_exceptions=True)
        if self.producer is not None:
            await self.producer.stop()
        for _, sock in self.sockets:
            sock.close(0)

    async def _wait_drained(self) -> None:
        while self._buffered:
            self._room.clear()
            await self._room.wait()

    @property
    def buffered(self) -> int:
        """Accepted events not yet acknowledged by Kafka."""
        return self._buffered

    # --- ingress -------------------------------------------------------------------

    async def _receive(self, ep: Endpoint, sock) -> None:
        task = asyncio.current_task()
        while not self._stopping:
            try:
                frames = await sock.recv_multipart()
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as err:
                log.warning("receive on %s failed: %s", ep.label, err)
                await asyncio.sleep(0.1)
                continue
            self.metrics.messages.labels(ep.label).inc()
            self._in_hand.add(task)
            try:
                await self.accept(frames, ep.label)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug here must not stop the bridge
                log.exception("unexpected error on a message from %s; dead-lettering it", ep.label)
                await self._dead(Rejected("invalid", "bridge could not process this message", "unknown",
                                          b"".join(frames)[:PAYLOAD_LIMIT]), ep.label)
            finally:
                self._in_hand.discard(task)

    async def accept(self, frames: list[bytes], source: str = "direct") -> int:
        """Validate one message and take its events in; returns how many were accepted."""
        events, rejected = decode_message(frames)
        for problem in rejected:
            await self._dead(problem, source)
        accepted = 0
        for event in events:
            event, refused = self._screen_ahead(event)
            for problem in refused:
                self.metrics.ahead.inc()
                await self._dead(problem, source)
            if event is None:
                continue
            if event.type in ("fpm", "fpm_batch"):
                await self._take_fpms(event)
            elif not await self._take_request(event, source):
                continue
            accepted += 1
        return accepted

    def _screen_ahead(self, event) -> tuple[object | None, list[Rejected]]:
        """``(what to take, what to refuse)`` of one event under ``max_ahead_s``.

        Judged on the bridge's clock because the event's own cannot be trusted: the
        worker orders everything by event time and has no wall clock to judge by (its
        decisions must not depend on when it runs). A publisher's batch is judged FPM
        by FPM, since it may carry several engines' (a sidecar's): the fast ones are
        refused and the rest taken, dated by their latest when the batch's own time is
        ahead too.
        """
        limit = self.settings.max_ahead_s
        if limit is None:
            return event, []
        now = time.time()
        latest = now + limit
        if event.time <= latest:
            return event, []
        if event.type != "fpm_batch":
            return None, [self._ahead(event, limit, now)]
        kept = [f for f in event.fpms if f.time <= latest]
        refused = [self._ahead(f, limit, now) for f in event.fpms if f.time > latest]
        if not kept:
            return None, refused
        return FpmBatch(deployment=event.deployment, time=max(f.time for f in kept), fpms=kept), refused

    @staticmethod
    def _ahead(event, limit: float, now: float) -> Rejected:
        return Rejected(
            "invalid", f"time: at most {limit:g} s ahead of the bridge's clock ({now:.3f}), got "
            f"{event.time:.3f}, {event.time - now:.0f} s ahead (the publisher's clock is fast, or its "
            "times are not Unix seconds)", event.deployment, encode_event(event)[:PAYLOAD_LIMIT])

    async def _take_fpms(self, event: ForwardPassMetrics | FpmBatch) -> None:
        """An FPM joins its deployment's pack; a publisher's batch goes out as it is,
        in as many records as its re-encoding (defaults filled in) needs."""
        n = len(event.fpms) if event.type == "fpm_batch" else 1
        await self._reserve(n)
        self.metrics.accepted.labels(event.type).inc()
        self._observe(event)
        if event.type == "fpm":
            self._pack(event)
            return
        if _straddles_a_second(event):
            # packed again like single FPMs, so each lands in the tick its own time falls in, as
            # the bridge's own packs (cut at whole seconds) do: a batch is folded at its time
            for fpm in event.fpms:
                self._pack(fpm)
            return
        pack = self._packs.get(event.deployment)
        if pack is not None:
            # the FPMs packed before the batch go out before it, as accepted: a batch of the
            # next second ahead of them moved the worker's clock past them
            self._emit_pack(event.deployment, pack)
        self._send_fpms(event)
        self._touch(event.deployment, self.topics.fpm, event.time)

    async def _take_request(self, event, source: str) -> bool:
        """A request record or arrival, unless its re-encoding (defaults filled in) is
        over the worker's limit: then it is dead-lettered here, not after accepting it."""
        value = encode_event(event)
        if len(value) > MAX_EVENT_BYTES:
            await self._dead(Rejected(
                "oversize", f"event: at most {MAX_EVENT_BYTES} bytes once encoded with its defaults, "
                f"got {len(value)}", event.deployment, value[:PAYLOAD_LIMIT]), source)
            return False
        await self._reserve(1)
        self.metrics.accepted.labels(event.type).inc()
        self._observe(event)
        self._enqueue(Outgoing(self.topics.requests, event.deployment.encode(), value, 1))
        self._touch(event.deployment, self.topics.requests, event.time)
        return True

    async def _reserve(self, n: int) -> None:
        """Take buffer room for ``n`` events, waiting while the buffer is full (backpressure).

        A record bigger than the whole buffer is let through alone, so it cannot wait forever.
        """
        while self._buffered and self._buffered + n > self.settings.buffer:
            self._room.clear()
            self._waiting += 1
            try:
                await self._room.wait()
            finally:
                self._waiting -= 1
        self._buffered += n
        self.metrics.buffered.set(self._buffered)

    def _release(self, n: int) -> None:
        self._buffered -= n
        self.metrics.buffered.set(self._buffered)
        self._room.set()

    async def _dead(self, problem: Rejected, source: str) -> None:
        letter = DeadLetter(
            deployment=problem.deployment, time=time.time(), reason=problem.reason,
            detail=problem.detail, source_topic=source,
            payload=problem.payload[:PAYLOAD_LIMIT].decode("utf-8", "replace"),
        )
        self.metrics.deadletters.labels(problem.reason).inc()
        await self._reserve(1)
        self._enqueue(Outgoing(self.topics.deadletter, problem.deployment.encode(),
                               orjson.dumps(event_to_dict(letter)), 1))

    # --- packing and heartbeats -------------------------------------------------------

    def _pack(self, fpm: ForwardPassMetrics) -> None:
        second = math.floor(fpm.time)
        pack = self._packs.get(fpm.deployment)
        if pack is not None and pack.second != second:
            self._emit_pack(fpm.deployment, pack)
            pack = None
        if pack is None:
            pack = self._packs[fpm.deployment] = _Pack(second=second, started=time.monotonic())
        pack.fpms.append(fpm)
        if len(pack.fpms) >= self._pack_limit(fpm.deployment):
            self._emit_pack(fpm.deployment, pack)

    def _pack_limit(self, deployment: str) -> int:
        """FPMs a pack may hold: ``pack_max``, or fewer when that many would not fit
        in ``PACK_FILL`` of a record at the size of the deployment's latest FPMs."""
        src = self._sources.get(deployment)
        if src is None or not src.fpm_bytes:
            return self.settings.pack_max
        return max(1, min(self.settings.pack_max, int(MAX_EVENT_BYTES * PACK_FILL / src.fpm_bytes)))

    def _emit_pack(self, deployment: str, pack: _Pack) -> None:
        self._packs.pop(deployment, None)
        batch = FpmBatch(deployment=deployment, time=max(f.time for f in pack.fpms), fpms=pack.fpms)
        self._send_fpms(batch)
        self._touch(deployment, self.topics.fpm, batch.time)

    def _send_fpms(self, batch: FpmBatch) -> None:
        """Enqueue ``batch`` as records within ``MAX_EVENT_BYTES``, and note its bytes per FPM."""
        records = fpm_records(batch)
        src = self._sources.get(batch.deployment)
        if src is not None:
            src.fpm_bytes = sum(len(v) for v, _ in records) / len(batch.fpms)
        key = batch.deployment.encode()
        for value, n in records:
            self._enqueue(Outgoing(self.topics.fpm, key, value, n))

    def _flush_packs(self, force: bool = False) -> None:
        now = time.monotonic()
        for deployment, pack in list(self._packs.items()):
            if force or now - pack.started >= self.settings.pack_within_s:
                self._emit_pack(deployment, pack)

    def _observe(self, event) -> None:
        src = self._sources.get(event.deployment)
        now = time.monotonic()
        if src is None:
            self._sources[event.deployment] = _Source(event.time, now)
        else:
            src.latest = max(src.latest, event.time)
            src.seen_at = now

    def _touch(self, deployment: str, topic: str, event_time: float) -> None:
        src = self._sources.get(deployment)
        if src is not None:
            src.last_sent[topic] = time.monotonic()
            if event_time > src.sent_time.get(topic, -math.inf):
                src.sent_time[topic] = event_time

    async def _tick_loop(self) -> None:
        s = self.settings
        period = max(min(s.pack_within_s, s.heartbeat_s / 2 if s.heartbeat_s else 1.0), 0.005)
        while True:
            await asyncio.sleep(period)
            try:
                self._flush_packs()
                self._forget_quiet()
                if s.heartbeat_s and not self._stopping:
                    await self._heartbeats()
            except Exception:
                # one bad round must not stop packs and heartbeats for every deployment
                log.exception("pack flush / heartbeat round failed; the next round goes on")
                self.metrics.tick_errors.inc()

    def _forget_quiet(self) -> None:
        """Drop the deployments silent for ``FORGET_AFTER_S``, heartbeats or not: the names
        come from the input, and without heartbeats nothing else ever dropped them."""
        now = time.monotonic()
        for deployment, src in list(self._sources.items()):
            if now - src.seen_at > FORGET_AFTER_S:
                del self._sources[deployment]

    async def _heartbeats(self) -> None:
        now = time.monotonic()
        every = self.settings.heartbeat_s
        for deployment, src in list(self._sources.items()):
            # an accepted event just under the schema's last time must not push the
            # heartbeat past it: the heartbeat would fail validation
            clock_time = min(max(src.latest + (now - src.seen_at), src.clock_sent), MAX_EVENT_TIME)
            for topic in (self.topics.fpm, self.topics.requests):
                if topic == self.topics.fpm and deployment in self._packs:
                    # the open pack carries the clock within pack_within_s; a heartbeat would
                    # go ahead of it on its lane, dated past the FPMs it holds
                    continue
                if now - src.last_sent.get(topic, src.seen_at) < every and not self._crossed(
                        src, topic, clock_time):
                    continue
                if self._buffered >= self.settings.buffer or self._waiting:
                    # the buffer is full, or a message read from ZMQ waits for room: heartbeats
                    # wait their turn (dated latest + the stall, one sent first would go ahead
                    # of that message on its lane, and make it late at the worker)
                    return
                beat = ClockEvent(deployment=deployment, time=clock_time, source="bridge")
                await self._reserve(1)
                self._enqueue(Outgoing(topic, deployment.encode(), encode_event(beat), 1))
                src.last_sent[topic] = now
                src.clock_sent = clock_time
                src.sent_time[topic] = max(src.sent_time.get(topic, clock_time), clock_time)
                self.metrics.heartbeats.inc()

    def _crossed(self, src: _Source, topic: str, clock_time: float) -> bool:
        """Whether the deployment's clock crossed a multiple of ``heartbeat_s`` that
        ``topic`` has not carried yet."""
        sent = src.sent_time.get(topic)
        every = self.settings.heartbeat_s
        return sent is None or math.floor(sent / every) < math.floor(clock_time / every)

    # --- egress ----------------------------------------------------------------------

    def _enqueue(self, out: Outgoing) -> None:
        self._seq += 1
        out.seq = self._seq
        key = (out.topic, out.key)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(key)
        lane.waiting.append(out)
        if lane.window is None and not lane.backing_off:
            self._schedule(lane)

    def _schedule(self, lane: _Lane) -> None:
        if not lane.scheduled:
            lane.scheduled = True
            self._due.append(lane)
            self._ready.set()

    async def _send_loop(self) -> None:
        while True:
            if not self._due:
                self._ready.clear()
                await self._ready.wait()
                continue
            lane = self._due.popleft()
            lane.scheduled = False
            if lane.window is None and not lane.backing_off and lane.waiting:
                await self._send_window(lane)

    async def _send_window(self, lane: _Lane) -> None:
        """Hand the producer everything waiting in ``lane``, in order.

        If a send is refused, it and the records after it count as failed
        without being handed over, so none of them is delivered before it.
        """
        window = lane.window = _Window(list(lane.waiting))
        lane.waiting.clear()
        for i, out in enumerate(window.records):
            try:
                future = await self.producer.send(out.topic, out.value, key=out.key)
            except asyncio.CancelledError:
                lane.waiting.extendleft(reversed(window.records[i:]))
                raise
            except Exception as err:  # noqa: BLE001 - broker down, buffer full: retry, never drop
                out.attempts += 1
                # the records after it are held back with it, and sent again with it
                window.attempts_failed += len(window.records) - i
                window.failed.extend(window.records[i:])
                window.error = err
                break
            window.unresolved += 1
            future.add_done_callback(lambda f, out=out: self._delivered(f, lane, window, out))
        window.handing = False
        self._maybe_close(lane, window)

    def _delivered(self, future: asyncio.Future, lane: _Lane, window: _Window, out: Outgoing) -> None:
        window.unresolved -= 1
        if future.cancelled() or future.exception() is not None:
            out.attempts += 1
            window.attempts_failed += 1
            window.failed.append(out)
            window.error = "cancelled" if future.cancelled() else future.exception()
        else:
            self.metrics.produced.labels(self.topics.logical(out.topic)).inc()
            self._release(out.events)
        self._maybe_close(lane, window)

    def _maybe_close(self, lane: _Lane, window: _Window) -> None:
        """Once the producer has settled every record of ``window``: put its failed
        records back in front of the lane, in their order, and retry after a backoff."""
        if window.handing or window.unresolved:
            return
        lane.window = None
        if window.failed:
            window.failed.sort(key=lambda out: out.seq)
            lane.waiting.extendleft(reversed(window.failed))
            lane.backing_off = True
            task = asyncio.get_running_loop().create_task(self._retry(lane, window))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)
        elif lane.waiting:
            self._schedule(lane)
        else:
            del self._lanes[lane.key]

    async def _retry(self, lane: _Lane, window: _Window) -> None:
        attempts = max(out.attempts for out in window.failed)
        self.metrics.retries.inc(window.attempts_failed)
        if attempts in (1, 10) or attempts % 100 == 0:
            log.warning("produce of %d records to %s failed (attempt %d): %s; retrying in order",
                        window.attempts_failed, lane.key[0], attempts, window.error)
        await asyncio.sleep(min(self.settings.retry_backoff_s * attempts, 5.0))
        lane.backing_off = False
        self._schedule(lane)


async def run_bridge(settings: BridgeSettings) -> None:
    """Run until SIGTERM/SIGINT, then drain and stop."""
    bridge = Bridge(settings)
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, registry=bridge.metrics.registry)
    await bridge.start()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await bridge.stop()
