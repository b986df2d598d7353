"""The worker's route path in-process: records in, decisions out, no broker, no Faust.

    .venv/bin/python bench/bench_route.py [--fpms 300000] [--batch 20] [--gc tuned|default|off] [--profile]

Builds records as the bridge would for ``bench_ingest.py``'s load (8 deployments
x 16 engines at 50 iterations/s of event time, FPMs packed per deployment into
``FpmBatch`` records of up to 192 and cut at whole seconds, a clock heartbeat
on the requests topic at each second), then routes them through
:class:`~fleetplan.streams.router.Router` ``--batch`` records at a time, saving
and sending as the worker does. Reports CPU time per FPM (process time, so a
shared machine inflates it less than wall time) and the slowest batch that
fired ticks. ``--gc`` applies the worker's collector settings
(``streams/gc_settings.py``), CPython's defaults, or none. ``--parts`` times
the pieces apart on the same records instead: schema decode, the canonical
sort key, and the core's ``apply``, for the pydantic decode and the worker's
(:func:`~fleetplan.schemas.fpm_wire.decode_input`). Not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import pstats
import time

from fleetplan.models.canonical import canonical_key
from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.schemas import topics as canonical
from fleetplan.schemas.codec import decode_event, encode_event
from fleetplan.schemas.events import (
    ClockEvent,
    ForwardPassMetrics,
    FpmBatch,
    QueuedRequests,
    ScheduledRequests,
)
from fleetplan.schemas.fpm_wire import decode_input
from fleetplan.streams.gc_settings import tune_gc
from fleetplan.streams.router import InputRecord, Router
from fleetplan.streams.topics import CLOCKED
from fleetplan.streams.watermark import Watermarks

CONFIG = {
    "mode": "agg", "optimization_target": "throughput", "load_adjustment_interval_seconds": 5,
    "context_length": 8192, "max_kv_tokens": 100_000, "ack_timeout_seconds": 5, "grace_seconds": 1,
    "max_gpu_budget": -1, "max_endpoint": 64,
}
T0 = 1_000_000.0


def fpm(deployment: str, engine: int, counter: int, t: float) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        deployment=deployment, time=t, role="agg", worker_id=f"e{engine}", counter_id=counter,
        wall_time=0.02 + (counter % 7) * 0.001,
        scheduled=ScheduledRequests(num_decode_requests=8 + counter % 5,
                                    sum_decode_kv_tokens=8000 + (counter * 37) % 5000),
        queued=QueuedRequests(num_prefill_requests=3, sum_prefill_tokens=9000),
    )


def build(n: int, deployments: int, engines: int, pack: int) -> tuple[list[InputRecord], int]:
    records: list[InputRecord] = []
    offsets: dict[str, int] = {}
    packs: dict[str, list] = {}
    second: dict[str, int] = {}

    def emit(topic: str, event) -> None:
        offset = offsets.get(topic, 0)
        offsets[topic] = offset + 1
        records.append(InputRecord(topic, 0, offset, event.deployment.encode(), encode_event(event),
                                   0.0, (topic, offset)))

    def flush(name: str) -> None:
        fpms = packs.pop(name, None)
        if fpms:
            emit(canonical.FPM, FpmBatch(deployment=name, time=max(f.time for f in fpms), fpms=fpms))

    count, i = 0, 0
    while count < n:
        t = T0 + i * 0.02
        for d in range(deployments):
            name = f"d{d}"
            if second.get(name) != math.floor(t):
                flush(name)
                emit(canonical.REQUESTS, ClockEvent(deployment=name, time=t, source="bridge"))
                second[name] = math.floor(t)
            group = packs.setdefault(name, [])
            group.extend(fpm(name, e, i, t) for e in range(engines))
            count += engines
            if len(group) >= pack:
                flush(name)
        i += 1
    for name in list(packs):
        flush(name)
    return records, count


def route_all(router: Router, records: list[InputRecord], batch: int) -> tuple[int, float]:
    now, ticks, worst = 0.0, 0, 0.0
    for k in range(0, len(records), batch):
        now += 0.01
        started = time.process_time()
        routed = router.route(records[k:k + batch], now)
        router.saved(routed)
        router.sent(routed)
        if routed.ticks:
            worst = max(worst, time.process_time() - started)
        ticks += len(routed.ticks)
    return ticks, worst


def parts(planner: Planner, records: list[InputRecord], n: int) -> str:
    """CPU time per FPM of decoding the FPM records, keying them, and applying them,
    for the pydantic decode and the worker's (msgspec for FPM records)."""
    values = [r.value for r in records if r.topic == canonical.FPM]
    per = 1e6 / n
    out = []
    for name, decode in (("pydantic", decode_event), ("fpm_wire", decode_input)):
        started = time.process_time()
        events = [decode(v) for v in values]
        decoded = time.process_time()
        for event in events:
            canonical_key(event)
        keyed = time.process_time()
        states: dict = {}
        for event in events:
            state = states.get(event.deployment)
            if state is None:
                state = states[event.deployment] = planner.new_state(event.deployment)
            planner.apply(state, event)
        applied = time.process_time()
        del events, states
        out.append(f"{name}: decode {(decoded - started) * per:.2f} us per FPM (the decoded events "
                   f"kept), canonical_key {(keyed - decoded) * per:.3f} us, apply {(applied - keyed) * per:.2f} us")
    return "; ".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fpms", type=int, default=300_000)
    p.add_argument("--deployments", type=int, default=8)
    p.add_argument("--engines", type=int, default=16)
    p.add_argument("--pack", type=int, default=192, help="FPMs per record at most")
    p.add_argument("--batch", type=int, default=20, help="records per routed batch")
    p.add_argument("--gc", choices=["tuned", "default", "off"], default="tuned")
    p.add_argument("--profile", action="store_true", help="print a cProfile of the run (slower)")
    p.add_argument("--parts", action="store_true", help="time decode, sort key and apply apart")
    a = p.parse_args()
    records, n = build(a.fpms, a.deployments, a.engines, a.pack)
    planner = Planner(config_from_dict(dict(CONFIG)))
    router = Router(planner, Watermarks(CLOCKED, idle_after_s=1e9), clock=lambda: 0.0)
    gc.collect()
    if a.gc == "tuned":
        tune_gc()
    elif a.gc == "off":
        gc.disable()
    if a.parts:
        print(f"{n:,} FPMs in {len(records):,} records, gc {a.gc}: {parts(planner, records, n)}")
        return
    profiler = cProfile.Profile() if a.profile else None
    if profiler:
        profiler.enable()
    started = time.process_time()
    ticks, worst = route_all(router, records, a.batch)
    elapsed = time.process_time() - started
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    print(f"{n:,} FPMs in {len(records):,} records, {a.batch} records per batch, gc {a.gc}: "
          f"{elapsed * 1e6 / n:.2f} us per FPM ({n / elapsed:,.0f} FPM/s of CPU), {ticks} ticks, "
          f"slowest batch with ticks {worst * 1000:.1f} ms")


if __name__ == "__main__":
    main()
