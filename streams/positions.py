"""Where to resume reading each input partition after a crash or a rebalance.

The worker keeps its own input positions instead of Faust's committed
offsets. Records whose events wait for a future tick are not done when the
agent has read them, so "read" and "safe to skip on restart" differ; Faust's
commit logic assumes they are the same, and in faust-streaming 0.11 it can
also commit past an unacknowledged record at the head of a partition and
lose records read before recovery when no offset was committed yet.

So, per input topic-partition:

* ``resume`` is the smallest offset not yet *settled* (folded into a saved
  state, dead-lettered, or replayed and skipped). It is stored with the
  tables and the consumer seeks to it after every assignment. A stale
  (smaller) value is always safe: the router recognises replayed records.
* ``expected`` is the next offset this incarnation will accept. Records must
  arrive in offset order without gaps: a smaller offset is a duplicate (read
  twice around a seek), a larger one a leftover fetched before the seek.

A seek can be undone: Faust drops re-read records older than the last one it
handed out, and a batch fetched before the seek can be handed out after it.
So a partition that keeps delivering larger offsets than expected is
sought again (``reseek_after_s`` apart). A real gap (a transaction marker,
retention overtaking a lagging worker) would stall the partition forever,
so after ``max_reseeks`` attempts it jumps ahead, with a warning.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class PartitionPosition:
    expected: int
    unsettled: deque = field(default_factory=deque)
    settled: set = field(default_factory=set)
    blocked_since: float | None = None
    reseeks: int = 0
    saved_resume: int | None = None

    @property
    def resume(self) -> int:
        while self.unsettled and self.unsettled[0] in self.settled:
            self.settled.discard(self.unsettled.popleft())
        return self.unsettled[0] if self.unsettled else self.expected


class InputPositions:
    """Resume offsets and the in-order filter of the partitions this worker owns."""

    def __init__(self, reseek_after_s: float = 1.0, max_reseeks: int = 5) -> None:
        self.reseek_after_s = reseek_after_s
        self.max_reseeks = max_reseeks
        self.partitions: dict[tuple[str, int], PartitionPosition] = {}
        self.jumps = 0

    def reset(self, tp: tuple[str, int], resume: int) -> None:
        """A new assignment: read ``tp`` again from ``resume``."""
        self.partitions[tp] = PartitionPosition(expected=resume, saved_resume=resume)

    def forget(self, partitions: set[int]) -> None:
        for tp in [tp for tp in self.partitions if tp[1] in partitions]:
            del self.partitions[tp]

    def accept(self, tp: tuple[str, int], offset: int, now: float) -> bool:
        """Whether to route this record now (in order, not seen yet)."""
        pos = self.partitions.get(tp)
        if pos is None:
            return False  # not owned
        if offset < pos.expected:
            return False  # a duplicate delivery around a seek
        if offset > pos.expected:
            if pos.reseeks < self.max_reseeks:
                if pos.blocked_since is None:
                    pos.blocked_since = now
                return False  # fetched before the seek; it comes again in order
            self.jumps += 1  # sought again and again: a real gap in the log, move on
        pos.blocked_since = None
        pos.reseeks = 0
        pos.expected = offset + 1
        pos.unsettled.append(offset)
        return True

    def due_for_reseek(self, now: float) -> dict[tuple[str, int], int]:
        """Partitions blocked on a missing offset long enough to seek to it again."""
        out = {}
        for tp, pos in self.partitions.items():
            if pos.blocked_since is not None and now - pos.blocked_since >= self.reseek_after_s:
                pos.reseeks += 1
                pos.blocked_since = None
                out[tp] = pos.expected
        return out

    def settle(self, tp: tuple[str, int], offset: int) -> None:
        pos = self.partitions.get(tp)
        if pos is not None:
            pos.settled.add(offset)

    def resume(self, tp: tuple[str, int]) -> int | None:
        pos = self.partitions.get(tp)
        return None if pos is None else pos.resume

    def changed(self) -> dict[int, dict[str, int]]:
        """Resume offsets that moved since the last call, by partition then topic."""
        out: dict[int, dict[str, int]] = {}
        for (topic, partition), pos in self.partitions.items():
            resume = pos.resume
            if resume != pos.saved_resume:
                pos.saved_resume = resume
                out.setdefault(partition, {})[topic] = resume
        return out

    def of_partition(self, partition: int) -> dict[str, int]:
        return {t: pos.resume for (t, p), pos in self.partitions.items() if p == partition}
