"""Bucketed retention of regression samples.

A plain FIFO window lets sustained traffic at one operating point push out
everything the model knew about other loads (and the profile seeds with it),
so the fit extrapolates badly the moment load shifts. Dynamo's answer, kept
here: split each feature axis into equal-width buckets between the smallest
and largest value ever observed (16 buckets in 1D, a 4×4 grid in 2D); when
more than ``max_samples`` are held, drop the oldest sample of the fullest
bucket. Samples spread over the operating range survive; a crowded region
is thinned oldest first. Buckets are re-indexed whenever the bounds move.

Two choices Dynamo leaves to dict order are fixed here so the result is a
pure function of the sample sequence: "oldest" is by arrival sequence number,
and among equally full buckets the one holding the oldest sample loses it.
:meth:`add_many` gives exactly the samples :meth:`add` would, one by one, so
the way FPMs were batched on the log can never change a decision.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

SMALL_BATCH = 16
"""Up to this many rows, :meth:`BucketedSamples.add_many` adds them one by one."""


class BucketedSamples:
    def __init__(self, ndim: int, max_samples: int, buckets_per_axis: int) -> None:
        if ndim not in (1, 2):
            raise ValueError(f"ndim must be 1 or 2, got {ndim}")
        self.ndim = ndim
        self.max_samples = max_samples
        self.buckets_per_axis = buckets_per_axis
        self._lo: list[float] | None = None
        self._hi: list[float] | None = None
        self._next_seq = 0
        # seq -> (features, wall_time); insertion order is seq order.
        self._samples: dict[int, tuple[tuple[float, ...], float]] = {}
        self._queues: list[deque[int]] = [deque() for _ in range(buckets_per_axis**ndim)]
        # len() of each queue, kept up to date: eviction reads them for every sample.
        self._sizes: list[int] = [0] * len(self._queues)

    # -- reading -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def bounds(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        if self._lo is None or self._hi is None:
            return None
        return tuple(self._lo), tuple(self._hi)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Retained samples oldest first: features (n, ndim) and wall times (n,)."""
        xs = [x for x, _ in self._samples.values()]
        ys = [y for _, y in self._samples.values()]
        return np.array(xs, dtype=np.float64).reshape(-1, self.ndim), np.array(ys, dtype=np.float64)

    def bucket_counts(self) -> list[int]:
        """Samples per bucket, row-major over the grid (axis 0 outermost)."""
        return [len(q) for q in self._queues]

    # -- writing -------------------------------------------------------------

    def add(self, x: tuple[float, ...], wall_time: float) -> None:
        x = tuple(float(v) for v in x)
        if len(x) != self.ndim:
            raise ValueError(f"expected {self.ndim} features, got {len(x)}")
        moved = self._widen_bounds(x)
        self._insert(x, float(wall_time), rebuild=moved)

    def add_many(self, x: np.ndarray, wall_time: np.ndarray) -> None:
        """Add rows of ``x`` (n, ndim) in order; identical to calling :meth:`add` per row."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.ndim)
        wall_time = np.asarray(wall_time, dtype=np.float64).reshape(-1)
        n = x.shape[0]
        if n != wall_time.shape[0]:
            raise ValueError("x and wall_time lengths differ")
        if n == 0:
            return
        if n <= SMALL_BATCH:
            # A few rows: numpy's per-call cost outweighs the loop it saves.
            for row, wall in zip(x.tolist(), wall_time.tolist(), strict=True):
                self.add(row, wall)
            return
        lo_run, hi_run, moved = self._running_bounds(x)
        rows = x.tolist()
        walls = wall_time.tolist()
        starts = np.flatnonzero(moved).tolist()
        if not starts or starts[0] != 0:
            starts.insert(0, 0)
        starts.append(n)
        for s, e in zip(starts[:-1], starts[1:], strict=True):
            if moved[s]:
                self._lo = lo_run[s].tolist()
                self._hi = hi_run[s].tolist()
            self._insert(tuple(rows[s]), walls[s], rebuild=bool(moved[s]))
            if e - s > 1:
                self._append_run(rows[s + 1 : e], walls[s + 1 : e], self._keys_of(x[s + 1 : e]).tolist())

    # -- internals -----------------------------------------------------------

    def _widen_bounds(self, x: tuple[float, ...]) -> bool:
        if self._lo is None or self._hi is None:
            self._lo, self._hi = list(x), list(x)
            return True
        moved = False
        for i, v in enumerate(x):
            if v < self._lo[i]:
                self._lo[i] = v
                moved = True
            if v > self._hi[i]:
                self._hi[i] = v
                moved = True
        return moved

    def _running_bounds(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bounds after each row, and whether that row moved them."""
        if self._lo is None or self._hi is None:
            lo0, hi0 = x[0], x[0]
            first_moves = True
        else:
            lo0 = np.minimum(np.asarray(self._lo), x[0])
            hi0 = np.maximum(np.asarray(self._hi), x[0])
            first_moves = bool((lo0 < np.asarray(self._lo)).any() or (hi0 > np.asarray(self._hi)).any())
        lo_run = np.minimum.accumulate(np.vstack([lo0, x[1:]]), axis=0)
        hi_run = np.maximum.accumulate(np.vstack([hi0, x[1:]]), axis=0)
        moved = np.zeros(x.shape[0], dtype=bool)
        moved[0] = first_moves
        moved[1:] = (lo_run[1:] < lo_run[:-1]).any(axis=1) | (hi_run[1:] > hi_run[:-1]).any(axis=1)
        return lo_run, hi_run, moved

    def _key_of(self, x: tuple[float, ...]) -> int:
        assert self._lo is not None and self._hi is not None
        nb = self.buckets_per_axis
        key = 0
        for v, lo, hi in zip(x, self._lo, self._hi, strict=True):
            idx = 0
            if hi > lo:
                idx = int((v - lo) / (hi - lo) * nb)
                if idx > nb - 1:
                    idx = nb - 1
            key = key * nb + idx
        return key

    def _keys_of(self, x: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`_key_of`, same arithmetic in the same order."""
        assert self._lo is not None and self._hi is not None
        nb = self.buckets_per_axis
        key = np.zeros(x.shape[0], dtype=np.int64)
        for axis, (lo, hi) in enumerate(zip(self._lo, self._hi, strict=True)):
            idx = np.zeros(x.shape[0], dtype=np.int64)
            if hi > lo:
                idx = np.minimum(np.floor((x[:, axis] - lo) / (hi - lo) * nb).astype(np.int64), nb - 1)
            key = key * nb + idx
        return key

    def _insert(self, x: tuple[float, ...], wall_time: float, *, rebuild: bool) -> None:
        if rebuild:
            seq = self._next_seq
            self._next_seq += 1
            self._samples[seq] = (x, wall_time)
            self._rebuild()
            self._evict_if_full()
        else:
            self._append(x, wall_time, self._key_of(x))

    def _append(self, x: tuple[float, ...], wall_time: float, key: int) -> None:
        seq = self._next_seq
        self._next_seq += 1
        self._samples[seq] = (x, wall_time)
        self._queues[key].append(seq)
        self._sizes[key] += 1
        self._evict_if_full()

    def _append_run(self, rows: list, walls: list, keys: list[int]) -> None:
        """:meth:`_append` for each row in order, with the loop inlined (the hot path).

        At a steady operating point every row lands in the one fullest bucket,
        which then loses its oldest sample. Once :meth:`_evict_one` took a sample
        from the only fullest bucket, the next row landing there makes it the only
        fullest again (the others did not grow), so it loses its oldest sample
        at once, and the bucket sizes are back where they were: no need to look
        at the other buckets again until a row lands elsewhere.
        """
        samples, queues, sizes = self._samples, self._queues, self._sizes
        cap = self.max_samples
        seq = self._next_seq
        only_fullest = -1  # the bucket the last eviction took from, if it was the only fullest
        for row, wall, key in zip(rows, walls, keys, strict=True):
            samples[seq] = (tuple(row), wall)
            queues[key].append(seq)
            seq += 1
            if key == only_fullest:  # over the cap: only_fullest is set by an eviction
                del samples[queues[key].popleft()]
                continue
            sizes[key] += 1
            if len(samples) > cap:
                only_fullest = self._evict_one()
        self._next_seq = seq

    def _evict_if_full(self) -> None:
        if len(self._samples) > self.max_samples:
            self._evict_one()

    def _evict_one(self) -> int:
        """Drop the oldest sample of the fullest bucket (ties: the bucket holding the oldest).

        Returns that bucket if it was the only fullest, else -1.
        """
        queues, sizes = self._queues, self._sizes
        fullest = max(sizes)
        only = sizes.count(fullest) == 1
        if only:
            victim = sizes.index(fullest)
        else:
            victim = min(
                (j for j, size in enumerate(sizes) if size == fullest), key=lambda j: queues[j][0]
            )
        sizes[victim] -= 1
        del self._samples[queues[victim].popleft()]
        return victim if only else -1

    def _rebuild(self) -> None:
        """Re-index every retained sample under the current bounds (seq order kept).

        This runs on every bounds change, so :meth:`_key_of`'s arithmetic is
        inlined here, specialised for one and two axes.
        """
        assert self._lo is not None and self._hi is not None
        queues = self._queues
        for q in queues:
            q.clear()
        nb = self.buckets_per_axis
        top = nb - 1
        lo0, w0 = self._lo[0], self._hi[0] - self._lo[0]
        if self.ndim == 1:
            for seq, (x, _) in self._samples.items():
                i = int((x[0] - lo0) / w0 * nb) if w0 > 0 else 0
                queues[i if i < top else top].append(seq)
        else:
            lo1, w1 = self._lo[1], self._hi[1] - self._lo[1]
            for seq, (x, _) in self._samples.items():
                i = int((x[0] - lo0) / w0 * nb) if w0 > 0 else 0
                j = int((x[1] - lo1) / w1 * nb) if w1 > 0 else 0
                queues[(i if i < top else top) * nb + (j if j < top else top)].append(seq)
        self._sizes = [len(q) for q in queues]

    # -- state ---------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "ndim": self.ndim,
            "max_samples": self.max_samples,
            "buckets_per_axis": self.buckets_per_axis,
            "lo": None if self._lo is None else list(self._lo),
            "hi": None if self._hi is None else list(self._hi),
            "next_seq": self._next_seq,
            "seq": list(self._samples),
            "x": [list(x) for x, _ in self._samples.values()],
            "wall_time": [y for _, y in self._samples.values()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BucketedSamples:
        samples = cls(int(state["ndim"]), int(state["max_samples"]), int(state["buckets_per_axis"]))
        if state["lo"] is not None:
            samples._lo = [float(v) for v in state["lo"]]
            samples._hi = [float(v) for v in state["hi"]]
        samples._next_seq = int(state["next_seq"])
        for seq, x, y in zip(state["seq"], state["x"], state["wall_time"], strict=True):
            samples._samples[int(seq)] = (tuple(float(v) for v in x), float(y))
        if samples._samples:
            samples._rebuild()
        return samples
