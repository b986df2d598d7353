"""``fleetplan audit``: prove each recorded decision from the events before it.

The audit reads a deployment's inputs and its recorded decisions, folds the
inputs with the same core (``offer``/``advance``), and compares decision by
decision. It reports every decision reproduced, or the first divergence:
which decision, which field, what was recorded, what the core computes now.

Two sources, two replays, each matching how the events were first folded:

* A Kafka cluster. The worker folded each event at its event-time tick, in
  canonical order, except events it refused as late, which it dead-lettered
  with their coordinates. So the audit sorts the inputs by the core's
  ``canonical_key``, leaves out the dead-lettered ones, and fires each tick
  before the first event at or after it. Ticks the worker had not fired
  yet (beyond the last tick diagnostics) are not compared.
* A local JSONL log of ``fleetplan simulate``: it holds the inputs in the
  order the simulator fed them to ``Fleet.feed``, so the audit feeds them
  the same way (lateness included) and finishes as the simulator does.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from fleetplan.models.fleet import INPUT_TYPES, Fleet
from fleetplan.models.planner import Planner, TickReport
from fleetplan.models.sequencer import advance, canonical_key, offer
from fleetplan.schemas.codec import SchemaError, decode_event, event_to_dict

_AT = re.compile(r"\[at (?P<topic>[^\]\s]+):(?P<partition>\d+):(?P<offset>\d+)\]")


@dataclass
class Divergence:
    decision_id: int | None
    field: str
    recorded: object
    recomputed: object


@dataclass
class AuditResult:
    deployment: str
    source: str
    inputs: int = 0
    excluded_late: int = 0
    reproduced: list[int] = field(default_factory=list)
    divergence: Divergence | None = None
    beyond_horizon: int = 0
    horizon: float | None = None
    # what the report is drawn from: the inputs folded and every tick of the re-fold
    events: list = field(default_factory=list, repr=False)
    reports: list[TickReport] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def lines(self, verbose: bool = False) -> list[str]:
        out = [f"audit {self.deployment} from {self.source}: {self.inputs} input events"
               f" ({self.excluded_late} refused as late, left out)"]
        if verbose:
            out.extend(f"decision {i}: reproduced" for i in self.reproduced)
        if self.divergence is None:
            out.append(f"OK: {len(self.reproduced)} decision(s) reproduced"
                       + (f"; {self.beyond_horizon} not yet recorded (after tick {self.horizon})"
                          if self.beyond_horizon else ""))
        else:
            d = self.divergence
            out.append(f"DIVERGED at decision {d.decision_id}: field {d.field}: "
                       f"recorded {_show(d.recorded)}, recomputed {_show(d.recomputed)}"
                       f" ({len(self.reproduced)} reproduced before it)")
        return out


def _show(value: object) -> str:
    return orjson.dumps(value).decode() if value is not None else "nothing"


# --- replays ---------------------------------------------------------------------


def refold_by_event_time(planner: Planner, deployment: str, events: Iterable) -> list[TickReport]:
    """Fold events as the live worker did: each tick sees exactly the events before it."""
    state = planner.new_state(deployment)
    reports: list[TickReport] = []
    for event in sorted(events, key=canonical_key):
        reports.extend(advance(planner, state, event.time))
        if not offer(state, event):  # cannot happen in time order; a core bug if it does
            raise AssertionError(f"event at {event.time} refused in time order")
    if state.max_time is not None:
        reports.extend(advance(planner, state, state.max_time))
    return reports


def refold_as_fed(planner: Planner, events: Iterable) -> list[TickReport]:
    """Fold events in the given order with ``Fleet.feed``, as the simulator does."""
    return [r for r in Fleet(planner).run(events) if isinstance(r, TickReport)]


# --- comparison --------------------------------------------------------------------


def first_difference(recorded, recomputed, path: str = "") -> tuple[str, object, object] | None:
    """The dotted path of the first leaf that differs, with both values."""
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        for key in sorted(set(recorded) | set(recomputed)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in recorded or key not in recomputed:
                return sub, recorded.get(key), recomputed.get(key)
            found = first_difference(recorded[key], recomputed[key], sub)
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(recomputed, list):
        if len(recorded) != len(recomputed):
            return path, recorded, recomputed
        for i, (a, b) in enumerate(zip(recorded, recomputed, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(recorded, float) and isinstance(recomputed, float):
        if recorded == recomputed or (math.isnan(recorded) and math.isnan(recomputed)):
            return None
        return path, recorded, recomputed
    return None if recorded == recomputed else (path, recorded, recomputed)


def compare(result: AuditResult, recorded: list[dict], reports: list[TickReport],
            horizon: float | None) -> AuditResult:
    """Check recorded decisions against the recomputed ones, in decision_id order."""
    recomputed = [event_to_dict(r.decision) for r in reports if r.decision is not None]
    result.horizon = horizon
    seen: set[int] = set()
    for i, rec in enumerate(recorded):
        did = rec.get("decision_id")
        if did in seen:
            result.divergence = Divergence(did, "decision_id", f"{did} recorded again", None)
            return result
        seen.add(did)
        if did != i:
            result.divergence = Divergence(did, "decision_id", did, i)
            return result
        mine = recomputed[i] if i < len(recomputed) else None
        if mine is None:
            result.divergence = Divergence(did, "decision", rec, None)
            return result
        diff = first_difference(rec, mine)
        if diff is not None:
            result.divergence = Divergence(did, diff[0], diff[1], diff[2])
            return result
        result.reproduced.append(did)
    extra = recomputed[len(recorded):]
    for mine in extra:
        if horizon is not None and mine["time"] > horizon:
            result.beyond_horizon += 1
            continue
        # The worker fired this tick and recorded no decision for it.
        result.divergence = Divergence(mine["decision_id"], "decision", None, mine)
        return result
    return result


# --- sources -----------------------------------------------------------------------


def audit_log(path: str | Path, deployment: str, *, config=None, profile=None,
              planner: Planner | None = None) -> AuditResult:
    """Audit a ``fleetplan simulate`` JSONL log."""
    from fleetplan.bootstrap import build_planner
    from fleetplan.eventlog import read_events

    planner = planner or build_planner(config, profile)
    inputs, recorded = [], []
    for event in read_events(path):
        if event.deployment != deployment:
            continue
        if event.type in INPUT_TYPES:
            inputs.append(event)
        elif event.type == "decision":
            recorded.append(event_to_dict(event))
    reports = refold_as_fed(planner, inputs)
    result = AuditResult(deployment, str(path), inputs=len(inputs), events=inputs, reports=reports)
    return compare(result, recorded, reports, horizon=None)


def audit_kafka(bootstrap: str, deployment: str, *, config=None, profile=None, topic_prefix: str = "",
                partitions: int | None = None, planner: Planner | None = None) -> AuditResult:
    """Audit a deployment from the topics of a Kafka cluster."""
    from fleetplan.bootstrap import build_planner

    planner = planner or build_planner(config, profile)
    return asyncio.run(_audit_kafka(bootstrap, deployment, planner, topic_prefix, partitions))


async def _audit_kafka(bootstrap, deployment, planner, topic_prefix, partitions) -> AuditResult:
    from fleetplan.streams.kafka_io import read_partitions
    from fleetplan.streams.topics import Topics, partition_for

    topics = Topics(topic_prefix)
    if partitions is None:
        partitions = await _partition_count(bootstrap, topics.fpm)
    p = partition_for(deployment, partitions)
    wanted = [(t, p) for t in topics.inputs] + [(topics.decisions, p), (topics.deadletter, p), (topics.ticks, p)]
    slices = await read_partitions(bootstrap, wanted)

    refused: set[tuple[str, int, int]] = set()
    for r in slices[(topics.deadletter, p)]:
        letter = _decode(r.value)
        if letter is None or letter.deployment != deployment or letter.reason != "late":
            continue
        m = _AT.search(letter.detail)
        if m:
            refused.add((m["topic"], int(m["partition"]), int(m["offset"])))

    inputs = []
    excluded = 0
    for name in topics.inputs:
        logical = topics.logical(name)
        for r in slices[(name, p)]:
            event = _decode(r.value)
            if event is None or event.type not in INPUT_TYPES or event.deployment != deployment:
                continue
            if r.key is None or r.key.decode("utf-8", "replace") != deployment:
                continue  # the worker dead-letters records not keyed by their deployment
            if (logical, p, r.offset) in refused:
                excluded += 1
                continue
            inputs.append(event)

    recorded = []
    for r in slices[(topics.decisions, p)]:
        decision = _decode(r.value)
        if decision is not None and decision.type == "decision" and decision.deployment == deployment:
            recorded.append(event_to_dict(decision))
    horizon = None
    for r in slices[(topics.ticks, p)]:
        try:
            diag = orjson.loads(r.value)
        except orjson.JSONDecodeError:
            continue
        if diag.get("deployment") == deployment:
            t = diag.get("time")
            horizon = t if horizon is None else max(horizon, t)
    if recorded:
        last = recorded[-1]["time"]
        horizon = last if horizon is None else max(horizon, last)

    source = f"kafka {bootstrap} partition {p}" + (f" prefix {topic_prefix!r}" if topic_prefix else "")
    reports = refold_by_event_time(planner, deployment, inputs)
    result = AuditResult(deployment, source, inputs=len(inputs), excluded_late=excluded, events=inputs,
                         reports=reports)
    return compare(result, recorded, reports, horizon=horizon if horizon is not None else -math.inf)


def write_audit_report(result: AuditResult, config, out: Path, window_s: float = 60.0) -> Path:
    """Draw the deployment's recorded run as ``fleetplan simulate`` draws a simulated one."""
    from fleetplan.sim.recorded import recorded_run
    from fleetplan.sim.report import write_report

    gpus = {r: config.gpus_per_engine(r) or 1 for r in config.roles}
    run = recorded_run(result.deployment, result.events, result.reports, config.roles, gpus,
                       config.ttft_ms, config.itl_ms, window_s)
    out.mkdir(parents=True, exist_ok=True)
    title = f"fleetplan audit: {result.deployment} from {result.source}"
    return write_report(out / "report.html", [run.result], config.ttft_ms, config.itl_ms, window_s,
                        run.arrivals, title)


def _decode(raw: bytes | None):
    if not raw:
        return None
    try:
        return decode_event(raw)
    except SchemaError:
        return None


async def _partition_count(bootstrap: str, topic: str) -> int:
    from fleetplan.streams.topics import partition_counts

    counts = await partition_counts(bootstrap, [topic])
    if topic not in counts:
        raise ValueError(f"topic {topic} does not exist on {bootstrap} (wrong --topic-prefix?)")
    return counts[topic]
