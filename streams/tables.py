"""What the worker keeps in Faust's changelog-backed tables, and how.

``deployments`` holds one record per deployment: the core's
``DeploymentState.to_data()`` (without its event buffer), the input
positions it has folded, and its outbox. The buffer of events waiting for
their tick is deliberately *not* stored: at FPM rates it is hundreds of
thousands of events, and they are already durable in the input topics. The
worker holds their offsets uncommitted instead, so after a crash they are
read again; ``positions`` tells an event already folded (skip it) from one
that was only buffered (offer it again).

``outbox`` is the decisions, late-event dead letters and tick diagnostics of
the last save. They are written to the changelog *before* they are sent,
so a crash between the two re-sends them on recovery rather than losing
them (decisions are de-duplicated against the decisions topic).

``traffic`` is a tumbling, event-time windowed table of request aggregates
at the throughput interval. It is a checked mirror, not a source of truth:
the core folds the same requests into ``DeploymentState.window``, and the
worker compares the two at each throughput tick (a metric and a field of
the tick diagnostics).

Changelog records go to the deployment's input partition (not to the
partition of whichever event happens to be current in a batch), so the
worker that owns a deployment's inputs recovers its state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import faust
import orjson

from fleetplan.models.state import TrafficWindow, add_finished_sums
from fleetplan.schemas.events import RequestArrival, RequestRecord

STORED_VERSION = 1


@dataclass
class Output:
    """A record the worker produces: logical topic, key, value (plain data)."""

    topic: str
    key: str
    value: dict

    def to_data(self) -> dict:
        return {"topic": self.topic, "key": self.key, "value": self.value}

    @classmethod
    def from_data(cls, data: dict) -> Output:
        return cls(data["topic"], data["key"], data["value"])


@dataclass
class StoredDeployment:
    """The table record of one deployment."""

    partition: int
    state: dict
    positions: dict[str, int] = field(default_factory=dict)
    outbox: list[Output] = field(default_factory=list)
    # per topic, the offset of the last record buffered for a tick when this was saved
    awaiting: dict[str, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "v": STORED_VERSION, "partition": self.partition, "state": self.state,
            "positions": self.positions, "outbox": [o.to_data() for o in self.outbox],
            "awaiting": self.awaiting,
        })

    @classmethod
    def from_bytes(cls, raw: bytes) -> StoredDeployment:
        data = orjson.loads(raw)
        if data.get("v") != STORED_VERSION:
            raise ValueError(f"stored deployment version {data.get('v')!r}, expected {STORED_VERSION}")
        return cls(
            partition=data["partition"], state=data["state"],
            positions={k: int(v) for k, v in data["positions"].items()},
            outbox=[Output.from_data(o) for o in data["outbox"]],
            # records saved before 2026-12-05 have none: they resume as they did
            awaiting={k: int(v) for k, v in data.get("awaiting", {}).items()},
        )


def routed_table(app: faust.App, name: str, partition_of: Callable[[str], int], **kwargs) -> faust.Table:
    """A Faust table whose changelog partition is ``partition_of(deployment)``.

    Keys are the deployment (``bytes`` or ``str``), or ``(deployment, window)``
    for windowed tables.
    """

    class RoutedTable(faust.Table):
        def partition_for_key(self, key):  # noqa: D102 - Faust hook
            deployment = key[0] if isinstance(key, tuple) else key
            if isinstance(deployment, bytes):
                deployment = deployment.decode()
            return partition_of(deployment)

    return app.tables.add(RoutedTable(app, name=name, beacon=app.tables.beacon, **kwargs))


# --- the traffic mirror ------------------------------------------------------


@dataclass
class TrafficSums:
    """Request aggregates of one window, as sums so that merging is exact.

    ``upto`` is the largest request-topic offset folded in, so a request
    read again after a restart is not counted twice.
    """

    count: int = 0
    sum_isl: float = 0.0
    sum_osl: float = 0.0
    sum_kv_hit: float = 0.0
    n_kv_hit: int = 0
    sum_accept: float = 0.0
    n_accept: int = 0
    arrivals: int = 0
    sum_arrival_isl: float = 0.0
    upto: int = -1

    def add(self, req: RequestRecord | RequestArrival) -> None:
        if req.type == "arrival":
            self.arrivals += 1
            self.sum_arrival_isl += req.input_tokens
            return
        add_finished_sums(self, req)

    def merge(self, other: TrafficSums) -> None:
        for name in ("count", "sum_isl", "sum_osl", "sum_kv_hit", "n_kv_hit", "sum_accept", "n_accept",
                     "arrivals", "sum_arrival_isl"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.upto = max(self.upto, other.upto)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> TrafficSums:
        return cls(**orjson.loads(raw)) if raw else cls()

    def mismatch(self, observed: dict, *, by_arrival: bool = False) -> str | None:
        """The first field where the core's window observation differs, or None.

        ``by_arrival``: the core counts demand from arrival events (it has
        seen one), so the count and mean ISL are the arrivals'; with nothing
        finished in the window the core carries the last OSL over, which a
        window alone cannot know, so OSL is not compared then.
        """
        window = TrafficWindow(
            count=self.count, sum_isl=self.sum_isl, sum_osl=self.sum_osl,
            sum_kv_hit=self.sum_kv_hit, n_kv_hit=self.n_kv_hit,
            sum_accept=self.sum_accept, n_accept=self.n_accept,
            arrivals=self.arrivals, sum_arrival_isl=self.sum_arrival_isl,
        )
        # What the mirror checks is which requests landed in the window; the means
        # come from the core's own arithmetic. A carried-over OSL is taken as given.
        obs = window.observation(0.0, by_arrival=by_arrival, last_osl=observed.get("osl"))
        for name in ("num_req", "isl", "osl", "kv_hit_rate", "accept_length"):
            value = getattr(obs, name)
            theirs = observed.get(name)
            if value is None or theirs is None:
                if value != theirs:
                    return name
            elif not math.isclose(value, theirs, rel_tol=1e-9, abs_tol=1e-9):
                return name
        return None


class _EventTime:
    """The event time the next windowed-table operation refers to.

    Faust windows are relative to the current stream event; the worker
    works on batches of many deployments, so it names the time explicitly.
    """

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self, event=None) -> float:
        return self.at


class TrafficMirror:
    """Tumbling event-time windows of request aggregates per deployment.

    A window is deleted when the throughput tick at its end has checked it
    (:meth:`close`), by event time: nothing folds into it after that tick
    (a later record is late). Faust's own expiry is off: it goes by the wall
    clock, so a deployment whose events ran more than the expiry behind it
    (a backlog after an outage, a replay) had a window deleted while it was
    still filling, and its check reported a ``num_req`` mismatch.
    """

    def __init__(self, app: faust.App, partition_of: Callable[[str], int], *,
                 interval_s: int, partitions: int) -> None:
        self.interval_s = interval_s
        self._at = _EventTime()
        table = routed_table(
            app, "traffic", partition_of, default=bytes, partitions=partitions,
            value_type=bytes,  # keys (deployment, window) as JSON, values raw TrafficSums bytes
            help="request aggregates per deployment, tumbling event-time windows (a mirror)",
        )
        self.table = table
        self.windows = table.tumbling(interval_s).relative_to(self._at)
        # window starts per deployment, read from the table's keys when first needed after
        # a recovery (``reindex``), then kept by ``add`` and ``close``
        self._starts: dict[str, set[float]] | None = None

    def reindex(self) -> None:
        """Read the open windows from the table's keys again at the next use.

        Called once partitions are recovered: the table may then hold windows
        written before a restart, or by another worker before a rebalance.
        """
        self._starts = None

    def _open_starts(self) -> dict[str, set[float]]:
        if self._starts is None:
            starts: dict[str, set[float]] = {}
            for name, rng in list(self.table.keys()):
                starts.setdefault(name, set()).add(float(rng[0]))
            self._starts = starts
        return self._starts

    def window_start(self, event_time: float) -> float:
        return math.floor(event_time / self.interval_s) * self.interval_s

    def get(self, deployment: str, window_start: float) -> TrafficSums:
        self._at.at = window_start
        return TrafficSums.from_bytes(self.windows[deployment].value())

    def add(self, deployment: str, window_start: float, delta: TrafficSums) -> None:
        current = self.get(deployment, window_start)
        current.merge(delta)
        self._at.at = window_start
        self.windows[deployment] = current.to_bytes()
        self._open_starts().setdefault(deployment, set()).add(window_start)

    def close(self, deployment: str, until: float) -> int:
        """Delete ``deployment``'s windows that end by ``until`` (event time); how many.

        The windows are found in an index of the table's keys, read from the
        table after each recovery (so windows written before a restart are
        found too) and kept since. Scanning the table's keys at every close
        made each throughput tick cost every deployment's windows: a batch of
        ticks grew with the square of the deployments a worker owns.
        """
        open_starts = self._open_starts().get(deployment, set())
        starts = sorted(s for s in open_starts if s + self.interval_s <= until)
        for start in starts:
            self._at.at = start
            del self.windows[deployment]
            open_starts.discard(start)
        return len(starts)
