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
  yet (beyond the last tick diagnostics) are not compared. FPMs are kept a
  day, so a deployment older than that is audited ``--since`` a time: from
  the first state snapshot the worker wrote on the ticks topic at or after
  it (hourly; streams/router.py), folding the inputs from its tick on, as a
  restarted worker does, and checking the decisions made after it.
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

from fleetplan.models.config_changes import intake_problem
from fleetplan.models.fleet import INPUT_TYPES, Fleet
from fleetplan.models.planner import Planner, TickReport
from fleetplan.models.sequencer import advance, canonical_key, offer
from fleetplan.models.state import DeploymentState
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
    invalid: int = 0
    reproduced: list[int] = field(default_factory=list)
    divergence: Divergence | None = None
    beyond_horizon: int = 0
    horizon: float | None = None
    # what the report is drawn from: the inputs folded and every tick of the re-fold
    events: list = field(default_factory=list, repr=False)
    reports: list[TickReport] = field(default_factory=list, repr=False)
    # the bad line that ended a log's audit early ("FILE:LINE: ..."), None when read to the end
    stopped: str | None = None
    # the deployment's state at the end of the re-fold (what ``--seed-out`` reads)
    state: DeploymentState | None = field(default=None, repr=False)
    # worker -> (role, state, gpus) of those inventory had named when the re-fold began: a
    # ``--since`` audit starts from a snapshot's fleet, which its inputs no longer show the report
    workers: dict[str, tuple[str, str, int]] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def lines(self, verbose: bool = False) -> list[str]:
        out = [f"audit {self.deployment} from {self.source}: {self.inputs} input events"
               f" ({self.excluded_late} refused as late, left out"
               + (f"; {self.invalid} invalid record(s) skipped, as the worker dead-lettered them"
                  if self.invalid else "") + ")"]
        if self.stopped is not None:
            out.append(f"STOPPED at {self.stopped}: only the lines before it are checked")
        if verbose:
            out.extend(f"decision {i}: reproduced" for i in self.reproduced)
        if self.divergence is None:
            out.append(f"OK: {len(self.reproduced)} decision(s) reproduced" + self._unchecked())
        else:
            d = self.divergence
            out.append(f"DIVERGED at decision {d.decision_id}: field {d.field}: "
                       f"recorded {_show(d.recorded)}, recomputed {_show(d.recomputed)}"
                       f" ({len(self.reproduced)} reproduced before it)")
        return out

    def _unchecked(self) -> str:
        """Recomputed decisions past what was recorded: not yet written (Kafka), or lost after a bad line."""
        if not self.beyond_horizon:
            return ""
        if self.stopped is not None:
            return f"; {self.beyond_horizon} recomputed after the last recorded one not checked"
        if self.horizon is None or math.isinf(self.horizon):
            return f"; {self.beyond_horizon} not yet recorded (no tick recorded yet)"
        return f"; {self.beyond_horizon} not yet recorded (after tick {self.horizon})"


def _show(value: object) -> str:
    return orjson.dumps(value).decode() if value is not None else "nothing"


# --- replays ---------------------------------------------------------------------


def refold_by_event_time(planner: Planner, deployment: str, events: Iterable,
                         state: DeploymentState | None = None) -> list[TickReport]:
    """Fold events as the live worker did: each tick sees exactly the events before it
    (into ``state`` when given, a new deployment's otherwise)."""
    state = planner.new_state(deployment) if state is None else state
    reports: list[TickReport] = []
    for event in sorted(events, key=canonical_key):
        reports.extend(advance(planner, state, event.time))
        if not offer(state, event):  # cannot happen in time order; a core bug if it does
            raise AssertionError(f"event at {event.time} refused in time order")
    if state.max_time is not None:
        reports.extend(advance(planner, state, state.max_time))
    return reports


def refold_as_fed(fleet: Fleet, events: Iterable) -> tuple[list[TickReport], int]:
    """Fold events in the given order with ``Fleet.feed``, as the simulator does:
    the tick reports, and how many events came too late for their tick (refused)."""
    out = fleet.run(events)
    reports = [r for r in out if isinstance(r, TickReport)]
    return reports, len(out) - len(reports)


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
            horizon: float | None, first_id: int = 0) -> AuditResult:
    """Check recorded decisions against the recomputed ones, in decision_id order from ``first_id``."""
    recomputed = [event_to_dict(r.decision) for r in reports if r.decision is not None]
    result.horizon = horizon
    seen: set[int] = set()
    for i, rec in enumerate(recorded):
        did = rec.get("decision_id")
        if did in seen:
            result.divergence = Divergence(did, "decision_id", f"{did} recorded again", None)
            return result
        seen.add(did)
        if did != first_id + i:
            result.divergence = Divergence(first_id + i, "decision_id",
                                           f"{did} where {first_id + i} was expected (missing or out of order)",
                                           first_id + i)
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


class NoEvents(ValueError):
    """The source holds nothing for the deployment: an audit of nothing proves nothing."""


def audit_log(path: str | Path, deployment: str, *, config=None, profile=None,
              planner: Planner | None = None) -> AuditResult:
    """Audit a ``fleetplan simulate`` JSONL log.

    A bad line ends the audit there: the decisions recorded before it are
    checked against the inputs before it (``stopped`` names the line), and
    decisions the re-fold makes after the last recorded one are counted as
    unchecked, since their records may be the lines that were lost.
    """
    from fleetplan.bootstrap import build_planner

    planner = planner or build_planner(config, profile)
    inputs, recorded, stopped, invalid = _read_log(Path(path), deployment, planner.config)
    fleet = Fleet(planner)
    reports, late = refold_as_fed(fleet, inputs)
    # the late ones were refused as the simulator refused them (until 2026-12-05 the
    # line said 0 and counted them among the inputs folded)
    result = AuditResult(deployment, str(path), inputs=len(inputs) - late, excluded_late=late, invalid=invalid,
                         events=inputs, reports=reports, stopped=stopped, state=fleet.states.get(deployment))
    horizon = None
    if stopped is not None:
        horizon = recorded[-1]["time"] if recorded else -math.inf
    return compare(result, recorded, reports, horizon=horizon)


def _read_log(path: Path, deployment: str, config) -> tuple[list, list[dict], str | None, int]:
    """The deployment's inputs and recorded decisions, up to the first bad line (named, or None),
    and how many of its inputs were skipped as the worker's intake refuses them.

    An event the live worker would dead-letter at intake (a ``set_config`` that can never
    apply) is skipped and counted, as the Kafka audit skips it: the worker folded nothing
    from it. Until 2026-12-05 it ended a log's audit there.
    """
    from fleetplan.eventlog import EventLogError, read_events

    inputs, recorded = [], []
    found: set[str] = set()
    stopped = None
    invalid = 0
    try:
        for event in read_events(path):
            found.add(event.deployment)
            if event.deployment != deployment:
                continue
            if event.type in INPUT_TYPES:
                if intake_problem(config, event) is not None:
                    invalid += 1
                    continue
                inputs.append(event)
            elif event.type == "decision":
                recorded.append(event_to_dict(event))
    except EventLogError as err:
        if not found:  # unreadable, or bad from line 1: there is nothing to audit
            raise
        stopped = str(err)
    if not inputs and not recorded and not invalid:
        raise NoEvents(_no_events(path, deployment, found, stopped))
    return inputs, recorded, stopped, invalid


def _no_events(source: object, deployment: str, found: set[str], stopped: str | None) -> str:
    if not found:
        return f"{source}: no events"
    message = f"no events for deployment {deployment!r} in {source} (found: {', '.join(sorted(found))})"
    return message if stopped is None else f"{message}; stopped at {stopped}"


def audit_kafka(bootstrap: str, deployment: str, *, config=None, profile=None, topic_prefix: str = "",
                partitions: int | None = None, planner: Planner | None = None,
                since: float | None = None) -> AuditResult:
    """Audit a deployment from the topics of a Kafka cluster (``since``: from the first
    snapshot at or after that event time, not from the first event)."""
    from fleetplan.bootstrap import build_planner

    planner = planner or build_planner(config, profile)
    return asyncio.run(_audit_kafka(bootstrap, deployment, planner, topic_prefix, partitions, since))


class NoSnapshot(ValueError):
    """``--since`` found no state snapshot to start from, or one whose inputs are gone."""


def _first_snapshot(records, deployment: str, since: float) -> dict | None:
    """The deployment's first snapshot on the ticks topic dated at or after ``since``."""
    best = None
    for r in records:
        try:
            data = orjson.loads(r.value or b"")
        except orjson.JSONDecodeError:
            continue
        if (isinstance(data, dict) and data.get("type") == "snapshot" and data.get("deployment") == deployment
                and isinstance(data.get("time"), int | float) and data["time"] >= since
                and (best is None or data["time"] < best["time"])):
            best = data
    return best


def _inputs_gone_after(slices, starts, input_topics, partition: int, deployment: str) -> tuple[str, float] | None:
    """The input topic whose retention cut the latest, and the event time it now starts at.

    A partition that no longer starts at offset 0 lost its oldest records. A
    deployment's records on one topic are in event-time order (the bridge keeps
    each deployment's order), so the ones lost are dated no later than its first
    kept (the partition's first, where it kept none); one that kept nothing may
    have lost any (``inf``).
    """
    latest = None
    for name in input_topics:
        records = slices[(name, partition)]
        if starts.get((name, partition), records[0].offset if records else 0) == 0:
            continue
        if not records:
            return name, math.inf
        first = None
        for r in records:
            if r.key is not None and r.key.decode("utf-8", "replace") == deployment:
                first = _decode(r.value)
                if first is not None:
                    break
        if first is None:
            first = next((e for e in map(_decode, (r.value for r in records)) if e is not None), None)
        if first is not None and (latest is None or first.time > latest[1]):
            latest = (name, first.time)
    return latest


async def _audit_kafka(bootstrap, deployment, planner, topic_prefix, partitions, since=None) -> AuditResult:
    from fleetplan.streams.kafka_io import read_partitions
    from fleetplan.streams.topics import Topics, partition_for

    topics = Topics(topic_prefix)
    if partitions is None:
        partitions = await _partition_count(bootstrap, topics.fpm)
    p = partition_for(deployment, partitions)
    wanted = [(t, p) for t in topics.inputs] + [(topics.decisions, p), (topics.deadletter, p), (topics.ticks, p)]
    starts: dict[tuple[str, int], int] = {}
    slices = await read_partitions(bootstrap, wanted, starts=starts)

    refused: set[tuple[str, int, int]] = set()
    for r in slices[(topics.deadletter, p)]:
        letter = _decode(r.value)
        if letter is None or letter.deployment != deployment or letter.reason != "late":
            continue
        m = _AT.search(letter.detail)
        if m:
            refused.add((m["topic"], int(m["partition"]), int(m["offset"])))

    inputs = []
    # event times of the inputs left out: an audit --since counts those from its tick on only
    excluded: list[float] = []
    invalid: list[float] = []  # inf: unreadable, so undated (counted either way)
    found: set[str] = set()
    for name in topics.inputs:
        logical = topics.logical(name)
        for r in slices[(name, p)]:
            event = _decode(r.value)
            if event is None:
                # the worker dead-lettered it and folded nothing from it: skipping is the same fold
                if r.key is not None and r.key.decode("utf-8", "replace") == deployment:
                    invalid.append(math.inf)
                continue
            found.add(event.deployment)
            if event.type not in INPUT_TYPES or event.deployment != deployment:
                continue
            if r.key is None or r.key.decode("utf-8", "replace") != deployment:
                continue  # the worker dead-letters records not keyed by their deployment
            if (logical, p, r.offset) in refused:
                excluded.append(event.time)
                continue
            if intake_problem(planner.config, event) is not None:
                invalid.append(event.time)  # the worker dead-lettered it at intake (a set_config that cannot apply)
                continue
            inputs.append(event)

    recorded = []
    stopped = None
    for r in slices[(topics.decisions, p)]:
        try:
            decision = decode_event(r.value) if r.value else None
        except SchemaError as err:
            if r.key is not None and r.key.decode("utf-8", "replace") == deployment:
                # the worker writes these: one unreadable is a damaged topic, and the ones
                # after it cannot be matched to their ids (until 2026-12-05 it was skipped,
                # and the next decision was blamed)
                stopped = f"{topics.decisions}:{p}:{r.offset}: not a decision ({err})"
                break
            continue
        if decision is not None and decision.type == "decision" and decision.deployment == deployment:
            recorded.append(event_to_dict(decision))
    horizon = None
    if stopped is None:
        for r in slices[(topics.ticks, p)]:
            t = _tick_time(r.value, deployment)
            if t is not None:
                horizon = t if horizon is None else max(horizon, t)
    if recorded:
        last = recorded[-1]["time"]
        horizon = last if horizon is None or stopped is not None else max(horizon, last)

    source = f"kafka {bootstrap} partition {p}" + (f" prefix {topic_prefix!r}" if topic_prefix else "")
    if not inputs and not recorded and not excluded and not invalid:
        raise NoEvents(_no_events(source, deployment, found, None))
    state, first_id = planner.new_state(deployment), 0
    if since is not None:
        state, inputs, recorded = _from_snapshot(slices, starts, topics, p, deployment, since, inputs, recorded,
                                                 grace=planner.config.grace_seconds)
        first_id = state.next_decision_id
        source += f" from the snapshot of its tick at {state.last_tick}"
        excluded = [t for t in excluded if t >= state.last_tick]
        invalid = [t for t in invalid if t >= state.last_tick]
    workers = {w: (v.role, v.state, v.gpus) for w, v in state.workers.items() if not v.discovered}
    reports = refold_by_event_time(planner, deployment, inputs, state)
    result = AuditResult(deployment, source, inputs=len(inputs), excluded_late=len(excluded), invalid=len(invalid),
                         events=inputs, reports=reports, state=state, stopped=stopped, workers=workers)
    return compare(result, recorded, reports, horizon=horizon if horizon is not None else -math.inf,
                   first_id=first_id)


def _from_snapshot(slices, starts, topics, p, deployment, since, inputs, recorded, *, grace: float):
    """The state of the first snapshot at or after ``since``, with the inputs and the recorded
    decisions that come after it: those its tick had not seen, those it had not made.

    ``grace``: how far a deployment's records may come out of event-time order on a topic (the
    worker's grace period, or the snapshot's where a set_config raised it), so how far past
    the first kept one a lost record may be dated."""
    snapshot = _first_snapshot(slices[(topics.ticks, p)], deployment, since)
    if snapshot is None:
        raise NoSnapshot(f"--since {since}: no snapshot of {deployment!r} at or after it on {topics.ticks} "
                         f"(the worker writes one each hour of event time; the topic keeps a week)")
    tick = float(snapshot["time"])
    state = DeploymentState.from_data(snapshot["state"])
    # the records after the tick were read under the grace period in force at it, which a
    # set_config may have raised above the config file's
    grace = max(grace, state.config.grace_seconds)
    gone = _inputs_gone_after(slices, starts, topics.inputs, p, deployment)
    # the tick saw the events before it, not those at it: one lost dated as the first kept,
    # at the tick, is needed too
    if gone is not None and gone[1] + grace >= tick:
        if math.isinf(gone[1]):
            raise NoSnapshot(f"--since {since}: the snapshot at {tick} needs the inputs from then on, and "
                             f"{gone[0]} partition {p} holds none now (its retention cut them all)")
        raise NoSnapshot(f"--since {since}: the snapshot at {tick} needs the inputs from then on, and "
                         f"{gone[0]} partition {p} now starts at event time {gone[1]} (its retention cut "
                         f"the rest; records may be {grace:g} s out of order): give a --since after "
                         f"{gone[1] + grace}")
    first_id = state.next_decision_id
    return (state, [e for e in inputs if e.time >= tick],
            [d for d in recorded if isinstance(d.get("decision_id"), int) and d["decision_id"] >= first_id])


def _tick_time(raw: bytes | None, deployment: str) -> float | None:
    """The time of a tick-diagnostics record of ``deployment`` (None for anything else:
    a record the audit cannot read tells it nothing about how far the worker got)."""
    try:
        diag = orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(diag, dict) or diag.get("deployment") != deployment:
        return None
    t = diag.get("time")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) else None


def write_audit_report(result: AuditResult, config, out: Path, window_s: float = 60.0, *,
                       profile_engine_gpus: int | None = None) -> tuple[Path, int]:
    """Draw the deployment's recorded run as ``fleetplan simulate`` draws a simulated one:
    the report's path, and how many finished requests its figures leave out as unmeasured
    (no TTFT, or a longer answer without its ITL), which the CLI says beside the path.

    Engines no inventory event prices cost the config's ``*_engine_num_gpu``,
    else the profile's engine (``profile_engine_gpus``), as the planner's GPU
    budget prices them: at 1 each, a TP2 fleet's report showed half its GPU-hours.
    """
    from fleetplan.sim.recorded import recorded_run
    from fleetplan.sim.report import write_report

    gpus = {r: config.gpus_per_engine(r) or profile_engine_gpus or 1 for r in config.roles}
    run = recorded_run(result.deployment, result.events, result.reports, config.roles, gpus,
                       config.ttft_ms, config.itl_ms, window_s, workers=result.workers)
    out.mkdir(parents=True, exist_ok=True)
    title = f"fleetplan audit: {result.deployment} from {result.source}"
    path = write_report(out / "report.html", [run.result], config.ttft_ms, config.itl_ms, window_s,
                        run.arrivals, title)
    return path, run.unmeasured


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
