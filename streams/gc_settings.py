"""Garbage-collector settings for the long-running runtime processes (worker, bridge).

A pydantic FPM is three models with their dicts and field sets, and up to a
tick interval's worth of events stay alive (buffered for the tick, or kept
to roll back a fold ahead). With CPython's default thresholds (a collection
every 700 net allocations) the collector ran every few dozen FPMs, and a
full collection, which walks every live object, every few thousand:
``bench/bench_route.py`` measured 22-25 us per FPM with CPython's defaults,
12.4-14.4 us with these settings. The worker now decodes FPM records into
msgspec structs the collector does not track (``schemas/fpm_wire.py``), and
there the settings no longer matter (3.6-3.8 us per FPM with these, 3.7 us
with CPython's defaults); the bridge still builds pydantic FPMs.

These objects hold no reference cycles, so reference counting frees them;
collecting less often costs little memory. ``gc.freeze()`` moves what
start-up created (modules, the planner, Faust) out of the collector's sight
for good, so a full collection only walks what was made since.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 10)


def tune_gc(thresholds: tuple[int, int, int] = THRESHOLDS) -> None:
    """Freeze what exists now and collect at ``thresholds`` (see the module docstring)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
