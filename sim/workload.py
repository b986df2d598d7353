"""Workloads: what arrives at the simulated fleet, and trace transforms.

A :class:`Workload` is a re-iterable stream of :class:`TraceRequest` in
arrival order with a known duration. Re-iterable because the runner reads
the traffic twice (once to size the baselines, once to replay it) and a
day of generated ServeGen traffic is too big to hold as a list.

Trace transforms keep the arrival times relative to 0 and the rows sorted:

- :func:`slice_trace` cuts a time window and rebases it to 0;
- :func:`speed` compresses (or stretches) the time axis;
- :func:`rate_scale` multiplies the request rate while *keeping* the time
  axis: it superposes ``k`` copies of the trace, each shifted by its own
  seeded offset and wrapped around (speeding up would squeeze a 30-minute
  trace below one throughput interval instead); offsets anywhere in the
  window flatten the shape over time, offsets bounded by ``max_shift_s``
  keep it;
- :func:`spread_arrivals` undoes a recording's rounding of arrival times:
  Mooncake's traces log them in 3-second steps, so ten requests that came
  over three seconds would otherwise reach the fleet at the same instant
  (:func:`timestamp_step` finds the step).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from fleetplan.sim.traces import TraceRequest

__all__ = [
    "Workload", "rate_scale", "slice_trace", "speed", "spread_arrivals", "timestamp_step", "trace_duration",
]


@dataclass(frozen=True)
class Workload:
    """A named, re-iterable request stream of ``duration_s`` seconds."""

    name: str
    duration_s: float
    _factory: Callable[[], Iterable[TraceRequest]]

    def requests(self) -> Iterator[TraceRequest]:
        return iter(self._factory())

    @classmethod
    def from_requests(
        cls, name: str, requests: Sequence[TraceRequest], duration_s: float | None = None
    ) -> Workload:
        rows = list(requests)
        duration = trace_duration(rows) if duration_s is None else float(duration_s)
        return cls(name, duration, lambda: rows)


def trace_duration(requests: Sequence[TraceRequest]) -> float:
    """The window a trace covers: its last arrival, rounded up to a whole second.

    A 10-minute slice whose last request came at 599.97 s is 600 s long, which
    is what wrapping copies around (``rate_scale``) needs.
    """
    if not requests:
        return 0.0
    return float(max(1, math.ceil(requests[-1].arrival_s)))


def slice_trace(
    requests: Sequence[TraceRequest], start_s: float = 0.0, end_s: float | None = None
) -> list[TraceRequest]:
    """Requests arriving in ``[start_s, end_s)``, with times rebased to ``start_s``."""
    out = []
    for r in requests:
        if r.arrival_s < start_s:
            continue
        if end_s is not None and r.arrival_s >= end_s:
            break
        out.append(_moved(r, r.arrival_s - start_s))
    return out


def speed(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """Play the trace ``factor`` times faster (``factor < 1`` slows it down)."""
    if not factor > 0:
        raise ValueError(f"speed factor must be > 0, got {factor}")
    return [_moved(r, r.arrival_s / factor) for r in requests]


def rate_scale(
    requests: Sequence[TraceRequest],
    factor: float,
    seed: int = 0,
    duration_s: float | None = None,
    max_shift_s: float | None = None,
) -> list[TraceRequest]:
    """``factor`` times the request rate over the same time axis.

    Copy 0 is the trace itself; copies 1..k-1 are shifted by a seeded offset
    and wrapped around the window, so their bursts no longer line up. With
    ``max_shift_s`` None the offset is drawn uniformly in ``[0, duration)``:
    each copy is the trace turned round by a random phase, and their sum
    tends to the trace's mean rate, so the shape over time flattens as k
    grows (the coefficient of variation of the 30-minute Azure code trace's
    per-minute counts: 0.99 as logged, 0.11 at ×50). With ``max_shift_s =
    S`` it is drawn in ``[-S, S]``: bursts shorter than S still spread, and
    the shape over times longer than S stays (0.87, and a correlation of
    0.97 with the logged minutes, at ×50 and S = 30 s; bench/rate_shape.py). A fractional part ``f`` adds one more shifted copy of
    which each request is kept with probability ``f``. ``factor < 1`` thins
    the trace (each request kept with probability ``factor``).

    Prefix blocks (``hash_ids``) shared by two or more requests of the trace
    (system prompts, earlier turns) stay shared across copies; blocks unique
    to one request are renamed per copy, because a copy stands for other
    users, whose private prompts do not hit each other's caches.
    """
    if not factor > 0:
        raise ValueError(f"rate scale factor must be > 0, got {factor}")
    if max_shift_s is not None and not (math.isfinite(max_shift_s) and max_shift_s >= 0):
        raise ValueError(f"--rate-scale-shift: a finite number of seconds >= 0, got {max_shift_s}")
    rows = list(requests)
    if len(rows) * factor > MAX_SCALED_REQUESTS:
        raise ValueError(f"--rate-scale: {factor:g} × {len(rows):,} requests is {len(rows) * factor:.3g}, "
                         f"more than the {MAX_SCALED_REQUESTS:,} one replay holds")
    if not rows or factor == 1.0:
        return rows
    duration = trace_duration(rows) if duration_s is None else float(duration_s)
    rng = random.Random(seed)
    whole = math.floor(factor)
    frac = factor - whole
    private, stride = _private_blocks(rows)
    tagged: list[tuple[float, int, int, TraceRequest]] = []
    copies = whole + (1 if frac > 1e-12 else 0)
    for c in range(copies):
        offset = 0.0 if c == 0 else _copy_offset(rng, duration, max_shift_s)
        keep = 1.0 if c < whole else frac
        for i, r in enumerate(rows):
            if keep < 1.0 and rng.random() >= keep:
                continue
            t = r.arrival_s + offset
            if offset > 0.0 and t >= duration:
                # a copy shifted forward wraps around; one not shifted (copy 0, the trace itself,
                # or any copy at max_shift_s = 0) keeps its last requests on the duration, where
                # whole-second times can end (ceil(1797.0) = 1797)
                t -= duration
            elif t < 0.0:  # shifted back (max_shift_s): its start wraps to the window's end
                t += duration
            hashes = r.hash_ids
            if c and hashes and private:
                hashes = tuple(h + c * stride if h in private else h for h in hashes)
            tagged.append((t, c, i, _moved(r, t, hashes)))
    tagged.sort(key=lambda x: x[:3])
    return [x[3] for x in tagged]


def _copy_offset(rng: random.Random, duration: float, max_shift_s: float | None) -> float:
    """One shifted copy's offset: anywhere in the window, or within ``max_shift_s`` either way."""
    if max_shift_s is None:
        return rng.random() * duration
    return (2.0 * rng.random() - 1.0) * min(max_shift_s, duration)


MAX_SCALED_REQUESTS = 10_000_000
"""The most requests a rate-scaled trace may hold (a ServeGen window may draw).
Scaling holds every row at once, 290 bytes a request at its peak
(``tracemalloc`` over 286,700 rows of the bundled conv trace ×100), so 10 M
is about 3 GB; a factor past it is a typo (1e6 for 1.6), which used to run
the machine out of memory. A ServeGen day is streamed window by window, so
only its busiest window counts (m-mid's day 5 at the benchmarks' scale is
12.7 M requests in all, far fewer in any one window)."""

MIN_TIMESTAMP_STEP_S = 1.0
"""Shorter steps are taken as the arrival process itself, not as rounding."""


def timestamp_step(requests: Sequence[TraceRequest]) -> float | None:
    """The step a trace's arrival times were rounded to, or None if they were not.

    Rounded when most requests share their arrival time with others (at
    least two per distinct time on average) and the distinct times lie a
    typical (median) gap of at least ``MIN_TIMESTAMP_STEP_S`` apart; that
    gap is the step. Mooncake's conversation trace: 5,719 requests at 600
    distinct times, 3 s apart. Azure's traces log 100-ns ticks: None.
    """
    times = sorted({r.arrival_s for r in requests})
    if len(times) < 3 or len(requests) < 2 * len(times):
        return None
    step = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
    return step if step >= MIN_TIMESTAMP_STEP_S else None


def spread_arrivals(requests: Sequence[TraceRequest], step_s: float, seed: int = 0) -> list[TraceRequest]:
    """Each arrival moved to a seeded uniform point of the ``step_s`` after its recorded time.

    A recording that rounds arrival times down to a step (Mooncake: 3 s)
    turns a steady stream into bursts at each step, which queue on a
    simulated fleet as no real one would see them (docs/benchmarks-sim.md
    measures how much on Mooncake). Spreading the requests uniformly over
    their step is the least-assuming undo. Rows stay sorted (ties by their
    order in the trace); the same seed gives the same times.
    """
    if not step_s > 0:
        raise ValueError(f"timestamp step must be > 0, got {step_s}")
    rng = random.Random(seed)
    moved = sorted(
        ((r.arrival_s + rng.random() * step_s, i, r) for i, r in enumerate(requests)), key=lambda x: x[:2]
    )
    return [_moved(r, t) for t, _, r in moved]


def _private_blocks(rows: Sequence[TraceRequest]) -> tuple[set[int], int]:
    """Blocks used by exactly one request, and a stride that renames them uniquely.

    The stride is the span of the hashes, not the largest one: readers take any
    integer (a u64 hash written as a signed i64 is negative), and ``h + c * stride``
    must land past every hash of the trace and of the copies before ``c``.
    """
    seen: dict[int, int] = {}
    top = bottom = 0
    for i, r in enumerate(rows):
        for h in set(r.hash_ids):
            seen[h] = -1 if h in seen and seen[h] != i else i
            top, bottom = max(top, h), min(bottom, h)
    private = {h for h, owner in seen.items() if owner >= 0}
    return private, top - bottom + 1


def _moved(r: TraceRequest, arrival_s: float, hash_ids: tuple[int, ...] | None = None) -> TraceRequest:
    return TraceRequest(
        arrival_s,
        r.input_tokens,
        r.output_tokens,
        r.hash_ids if hash_ids is None else hash_ids,
        r.cached_tokens,
        r.request_id,
        r.block_tokens,
    )
