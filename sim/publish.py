"""Publish the simulated fleet's metrics to ``fleetplan bridge`` over ZMQ.

This is what makes the simulator a demo fleet for the live stack: its
engines' forward-pass metrics and its frontend's finished requests go out
in the bridge's wire format (docs/wire-format.md), as Dynamo engines and
frontends would send them, and the live worker plans from them.

Only the event types the bridge accepts from engines and frontends are
sent (FPMs, request arrivals and finished request records). Inventory,
acks, clocks and decisions stay inside the simulator: the bridge refuses
them by design (they have their own producers), and the simulated fleet is
scaled by its own in-process planner, not by the live one.

Event times are shifted from the virtual clock (seconds since the start of
the run) to the Unix epoch: the bridge stamps nothing, and the live
planner's ticks and the connector's acks are in epoch seconds. With
``--realtime`` at speed 1 the published event times therefore track the
wall clock, which is what a live fleet looks like.

Events are sent as msgpack arrays, one ZMQ message per ``max_batch`` events
or per :meth:`ZmqPublisher.flush`, to amortise the per-message cost. A PUSH
socket blocks when the bridge stops reading (its buffer is full): the
simulator then waits, which is the backpressure the wire format promises.
A PUB socket drops instead, so PUSH is the default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgpack
import zmq

from fleetplan.schemas.codec import event_to_dict

PUBLISHED_TYPES = frozenset({"fpm", "request", "arrival"})
"""Event types the bridge accepts from a fleet (``fpm_batch`` is the bridge's own packing)."""

_KINDS = {"push": zmq.PUSH, "pub": zmq.PUB}


@dataclass(frozen=True)
class PublishTarget:
    """Where to publish: socket kind, address, and whether this side binds."""

    kind: str
    address: str
    bind: bool

    @classmethod
    def parse(cls, spec: str) -> PublishTarget:
        """``[push:|pub:][bind:|connect:]ADDR``; a plain address is a PUSH that connects.

        ``tcp://bridge:5557`` suits a bridge started with ``--pull`` (it binds);
        ``pub:tcp://bridge:5556`` one started with ``--sub bind:...``;
        ``pub:bind:tcp://*:5556`` one that connects its SUB to this fleet.
        """
        kind, bind, rest = "push", False, spec
        while "://" in rest:
            head, sep, tail = rest.partition(":")
            if not sep or tail.startswith("//"):
                break  # head is the transport (tcp, ipc, inproc)
            if head in _KINDS:
                kind = head
            elif head in ("bind", "connect"):
                bind = head == "bind"
            else:
                raise ValueError(f"--publish: unknown prefix {head!r} in {spec!r} "
                                 "(expected push:, pub:, bind: or connect:)")
            rest = tail
        if "://" not in rest:
            raise ValueError(f"--publish: a ZMQ address like tcp://host:port, got {spec!r}")
        return cls(kind, rest, bind)


class ZmqPublisher:
    """Sends the fleet's FPMs and request records to a bridge, shifted to epoch time."""

    def __init__(self, target: PublishTarget, *, epoch: float | None = None, max_batch: int = 500,
                 linger_s: float = 10.0, context: zmq.Context | None = None) -> None:
        self.target = target
        self.epoch = time.time() if epoch is None else epoch
        self.max_batch = max_batch
        self.sent_events = 0
        self.sent_messages = 0
        self._pending: list[dict] = []
        # its own context unless given one: only terminating it waits out the linger (below)
        self._context = zmq.Context() if context is None else context
        self._owns_context = context is None
        self._socket = self._context.socket(_KINDS[target.kind])
        self._socket.setsockopt(zmq.LINGER, int(linger_s * 1000))
        self.linger_s = linger_s
        # whether a bridge ever completed a handshake: a PUSH queues for a peer that may never come
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.reached = False
        if target.bind:
            self._socket.bind(target.address)
        else:
            self._socket.connect(target.address)
        if target.kind == "pub":
            # ZMQ's slow joiner: a PUB drops what it sends before the subscriber is there.
            time.sleep(0.5)

    def write(self, event) -> None:
        """Queue one simulator event (virtual time); types the bridge refuses are skipped."""
        if event.type not in PUBLISHED_TYPES:
            return
        data = event_to_dict(event)
        data["time"] += self.epoch
        if event.type == "request":
            data["request_received_ms"] += self.epoch * 1000.0
        self._pending.append(data)
        if len(self._pending) >= self.max_batch:
            self.flush()

    def flush(self) -> None:
        """Send what is queued as one message (blocks while a PUSH peer is not reading)."""
        if not self._pending:
            return
        self._socket.send(msgpack.packb(self._pending))
        self._note_peer(timeout_ms=0)
        self.sent_events += len(self._pending)
        self.sent_messages += 1
        self._pending = []

    def close(self) -> None:
        """Flush, then give queued messages up to ``linger_s`` to reach the bridge.

        Closing the socket returns at once; terminating the context is what waits for
        the queue. Until 2026-12-05 the context was the process's shared one, never
        terminated, so the process exited with its tail unsent.
        """
        self.flush()
        # a bridge that comes during the linger still gets the queue; one that never does gets
        # nothing, and the run must not say it published
        self._note_peer(timeout_ms=0 if self.reached else int(self.linger_s * 1000))
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close()
        if self._owns_context:
            self._context.term()

    def _note_peer(self, timeout_ms: int) -> None:
        """Read the monitor's events (waiting up to ``timeout_ms`` for the first): any is a handshake."""
        while not self.reached and self._monitor.poll(timeout_ms):
            self._monitor.recv_multipart()
            self.reached = True
