"""The traffic mirror's windows are found without scanning the table at every tick.

``TrafficMirror.close`` read every key of the table at each throughput
tick, so a batch of ticks cost the square of the deployments a worker owns.
It now keeps an index of each deployment's open windows, read from the
table once after a recovery (windows written before a restart are found)
and kept by ``add`` and ``close``. No broker: a memory-store table.
"""

from __future__ import annotations

from fleetplan.streams.app import WorkerSettings, create_app
from fleetplan.streams.tables import TrafficMirror, TrafficSums


def _mirror(tmp_path) -> TrafficMirror:
    settings = WorkerSettings(bootstrap="127.0.0.1:1", store="memory://", datadir=str(tmp_path), partitions=1)
    return TrafficMirror(create_app(settings), lambda deployment: 0, interval_s=20, partitions=1)


def _sums(count: int) -> TrafficSums:
    sums = TrafficSums()
    sums.count = count
    return sums


class _CountingKeys:
    """The table, with its ``keys()`` calls counted."""

    def __init__(self, table) -> None:
        self.table, self.scans = table, 0

    def keys(self):
        self.scans += 1
        return self.table.keys()


def test_close_deletes_only_the_deployments_windows_that_ended(tmp_path):
    mirror = _mirror(tmp_path)
    for deployment, start in (("a", 0.0), ("a", 20.0), ("a", 40.0), ("b", 0.0)):
        mirror.add(deployment, start, _sums(3))
    assert mirror.close("a", 40.0) == 2
    assert sorted(mirror.table.keys()) == [("a", (40.0, 59.9)), ("b", (0.0, 19.9))]
    assert mirror.get("a", 40.0).count == 3 and mirror.get("b", 0.0).count == 3
    assert mirror.close("a", 40.0) == 0


def test_the_table_is_scanned_once_per_recovery_not_at_every_close(tmp_path):
    mirror = _mirror(tmp_path)
    counted = _CountingKeys(mirror.table)
    mirror.table = counted
    for tick in range(1, 51):  # 50 ticks of 20 deployments
        for d in range(20):
            mirror.add(f"d{d}", (tick - 1) * 20.0, _sums(1))
        for d in range(20):
            assert mirror.close(f"d{d}", tick * 20.0) == 1
    assert counted.scans == 1
    mirror.reindex()
    mirror.close("d0", 10_000.0)
    assert counted.scans == 2


def test_windows_in_a_recovered_table_are_found_after_reindex(tmp_path):
    """Windows another process wrote (a restart, a rebalance) are in the table, not the index."""
    mirror = _mirror(tmp_path)
    mirror.add("a", 0.0, _sums(2))
    mirror.close("b", 0.0)  # the index is read now, holding a's window only
    mirror._at.at = 0.0  # a window a previous owner wrote: in the table, not through add
    mirror.windows["b"] = _sums(5).to_bytes()
    assert mirror.close("b", 20.0) == 0  # not in this process's index yet
    mirror.reindex()  # PlannerWorker._on_recovered
    assert mirror.close("b", 20.0) == 1
    assert sorted(mirror.table.keys()) == [("a", (0.0, 19.9))]
