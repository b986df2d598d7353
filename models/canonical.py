"""The canonical order of input events: what makes a fold independent of arrival order.

Every consumer of the log (the live worker, the audit, the simulator) sorts a
tick's events with :func:`canonical_key` before applying them, so the order
must be total (two different events never tie, or the arrival order would
decide) and cheap: it is computed for every record on the hot path.
"""

from __future__ import annotations

from fleetplan.schemas.codec import encode_event

# Lifecycle and acks first, so a tick's metrics meet the inventory they belong to.
_TYPE_RANK = {"inventory": 0, "ack": 1, "control": 2, "arrival": 3, "request": 3, "fpm": 4, "fpm_batch": 4, "clock": 5}


class Encoding:
    """An event's full encoding, computed only when two keys tie on everything before it.

    The last resort of the order for FPMs and requests: two events with the
    same identity fields (a frontend that reuses a request id within one
    timestamp, an engine that repeats a counter) but different bodies would
    otherwise tie, and the stable sort would keep them in arrival order.
    Identical copies (a redelivery) compare equal, which is harmless.
    """

    __slots__ = ("_event", "_raw")

    def __init__(self, event) -> None:
        self._event = event
        self._raw: bytes | None = None

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = encode_event(self._event)
        return self._raw

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Encoding):
            return NotImplemented
        return self._event is other._event or self.raw() == other.raw()

    def __lt__(self, other: Encoding) -> bool:
        return self.raw() < other.raw()

    def __hash__(self) -> int:
        return hash(self.raw())


class BatchOrder(Encoding):
    """Orders ``FpmBatch`` records of equal time without encoding them up front.

    Encoding a whole batch costs microseconds per FPM, and batches rarely
    share a time, so the tie-break is computed only when a comparison needs
    it: first the FPMs' identities (what identifies a single FPM), then, for
    two batches with the same identities, their full encodings.
    """

    __slots__ = ("_ids",)

    def __init__(self, batch) -> None:
        super().__init__(batch)
        self._ids: tuple | None = None

    def ids(self) -> tuple:
        if self._ids is None:
            self._ids = tuple((f.time, f.worker_id, f.dp_rank, f.counter_id, f.wall_time)
                              for f in self._event.fpms)
        return self._ids

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchOrder):
            return NotImplemented
        return self._event is other._event or (self.ids() == other.ids() and self.raw() == other.raw())

    def __lt__(self, other: BatchOrder) -> bool:
        if self.ids() != other.ids():
            return self.ids() < other.ids()
        return self.raw() < other.raw()

    def __hash__(self) -> int:
        return hash(self.ids())


def canonical_key(event) -> tuple:
    """Total order of events: time, kind, then identity fields.

    FPMs are identified by (worker, rank, counter), requests by their id,
    then (lazily, :class:`Encoding`) by their full encoding; FPM batches by
    :class:`BatchOrder`; other events, which are rare, by their full
    encoding at once. So two different events never tie.
    """
    kind = event.type
    if kind == "fpm":
        return (event.time, 4, event.worker_id, event.dp_rank, event.counter_id, event.wall_time, Encoding(event))
    if kind == "fpm_batch":
        # The empty worker id sorts a batch before single FPMs of the same time
        # (worker ids are never empty), as the encoding-keyed order did.
        return (event.time, 4, "", 0, 0, 0.0, BatchOrder(event))
    if kind == "request":
        return (event.time, 3, event.request_id, 0, 0, 0.0, Encoding(event))
    if kind == "arrival":  # before a record of the same request and time
        return (event.time, 3, event.request_id, -1, 0, 0.0, Encoding(event))
    return (event.time, _TYPE_RANK.get(kind, 9), "", 0, 0, 0.0, encode_event(event))
