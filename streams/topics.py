"""The topics of one fleetplan installation: names, partitions, retention, compaction.

Every topic is created up front with explicit settings rather than left to
broker auto-creation, because the partition count is a contract: every
topic is keyed by deployment, and a deployment's inputs, decisions and
table changelogs must all land on the same partition number so that one
worker process owns all of a deployment's history (Faust co-partitions
topics with equal partition counts). Changing the count re-homes
deployments, so an existing topic with another count is an error, not
something to fix silently.

A ``prefix`` namespaces every name, so tests and side-by-side installs can
share one broker without reading each other's events.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from aiokafka.partitioner import murmur2

from fleetplan.schemas import topics as canonical

DAY_MS = 24 * 3600 * 1000

TICKS = "fleetplan.ticks.v1"
"""Tick diagnostics (one ``TickReport`` per deployment per tick), streams' own topic."""

CLOCKED = (canonical.FPM, canonical.REQUESTS)
"""Dense input topics whose event time moves the watermark; the bridge heartbeats them."""

STATE_TABLE = "deployments"
"""Faust table of per-deployment planner state (changelog ``{app_id}-deployments-changelog``)."""

TRAFFIC_TABLE = "traffic"
"""Faust windowed table mirroring the request aggregates (``{app_id}-traffic-changelog``)."""

MAX_RECORD_BYTES = 16 * 1024 * 1024
"""Largest record on state changelogs (a big deployment's state can exceed Kafka's 1 MiB default)."""


@dataclass(frozen=True)
class TopicSpec:
    """One topic and the settings it is created with."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    role: str = ""


def partition_for(deployment: str, partitions: int) -> int:
    """The partition a deployment's records go to: Kafka's default (murmur2) partitioner.

    The bridge (aiokafka), Faust's producer and Java clients all use this
    function on the key bytes, which is what makes the topics co-partitioned.
    """
    return (murmur2(deployment.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class Topics:
    """Names of every topic of one installation (``prefix`` + canonical name)."""

    prefix: str = ""

    def name(self, logical: str) -> str:
        return f"{self.prefix}{logical}"

    def logical(self, name: str) -> str:
        """The canonical name of a (possibly prefixed) topic name."""
        return name[len(self.prefix):] if self.prefix and name.startswith(self.prefix) else name

    @property
    def fpm(self) -> str:
        return self.name(canonical.FPM)

    @property
    def requests(self) -> str:
        return self.name(canonical.REQUESTS)

    @property
    def inventory(self) -> str:
        return self.name(canonical.INVENTORY)

    @property
    def control(self) -> str:
        return self.name(canonical.CONTROL)

    @property
    def decisions(self) -> str:
        return self.name(canonical.DECISIONS)

    @property
    def acks(self) -> str:
        return self.name(canonical.ACKS)

    @property
    def deadletter(self) -> str:
        return self.name(canonical.DEADLETTER)

    @property
    def ticks(self) -> str:
        return self.name(TICKS)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.name(t) for t in canonical.INPUT_TOPICS)


def changelog_name(app_id: str, table: str) -> str:
    """Faust's changelog topic name for a table of app ``app_id``."""
    return f"{app_id}-{table}-changelog"


def event_log_specs(topics: Topics, partitions: int, *, fpm_retention_ms: int = DAY_MS) -> list[TopicSpec]:
    """The event log of design.md: inputs and outputs, kept by time.

    FPMs are the bulk of the volume and only matter for a few tick
    intervals (and the audit window), so they are kept for a day by default;
    everything else for a week, decisions for a month.
    """
    week = str(7 * DAY_MS)
    kept = {"cleanup.policy": "delete"}
    return [
        TopicSpec(topics.fpm, partitions, {**kept, "retention.ms": str(fpm_retention_ms),
                                           "max.message.bytes": str(MAX_RECORD_BYTES)}, "input"),
        TopicSpec(topics.requests, partitions, {**kept, "retention.ms": week}, "input"),
        TopicSpec(topics.inventory, partitions, {**kept, "retention.ms": week}, "input"),
        TopicSpec(topics.control, partitions, {**kept, "retention.ms": week}, "input"),
        TopicSpec(topics.acks, partitions, {**kept, "retention.ms": week}, "input"),
        TopicSpec(topics.decisions, partitions, {**kept, "retention.ms": str(30 * DAY_MS)}, "output"),
        TopicSpec(topics.deadletter, partitions, {**kept, "retention.ms": week}, "output"),
        # the hourly state snapshots are larger than a tick's diagnostics (streams/router.py)
        TopicSpec(topics.ticks, partitions, {**kept, "retention.ms": week,
                                             "max.message.bytes": str(MAX_RECORD_BYTES)}, "output"),
    ]


CHANGELOG_SEGMENT_MS = 10 * 60 * 1000
"""Roll the state changelog's segment every 10 minutes: the log cleaner never
compacts the active segment, so without a roll a restart reads every save
since the topic was created (Kafka's default roll is 7 days)."""


def changelog_specs(app_id: str, partitions: int, *, traffic_retention_ms: int) -> list[TopicSpec]:
    """The worker's table changelogs: compacted, so recovery reads about one record per key."""
    return [
        TopicSpec(changelog_name(app_id, STATE_TABLE), partitions, {
            "cleanup.policy": "compact", "max.message.bytes": str(MAX_RECORD_BYTES),
            "segment.ms": str(CHANGELOG_SEGMENT_MS), "min.cleanable.dirty.ratio": "0.1",
        }, "changelog"),
        # Windowed: old windows are deleted by time as well as compacted.
        TopicSpec(changelog_name(app_id, TRAFFIC_TABLE), partitions, {
            "cleanup.policy": "compact,delete", "retention.ms": str(traffic_retention_ms),
        }, "changelog"),
    ]


class TopicMismatch(RuntimeError):
    """An existing topic whose partition count or cleanup policy differs from the installation's."""


class TopicCreationError(RuntimeError):
    """The broker refused to create a topic: the user's to fix (``--replication``, its policies)."""


class SessionTimeoutRefused(RuntimeError):
    """The brokers' group settings refuse the consumer session timeout: the user's to fix."""


async def check_session_timeout(bootstrap: str, session_timeout_s: float, option: str = "--session-timeout") -> None:
    """Refuse a session timeout outside the brokers' ``group.min/max.session.timeout.ms``.

    A consumer whose timeout the broker refuses cannot join its group. aiokafka
    raises InvalidSessionTimeoutError at the join, but Faust logs it and retries
    for good, so a worker started with ``--session-timeout 2`` (under the 6-s
    default minimum) hung without a word of why. Read from the first broker's
    configuration before anything starts.
    """
    from aiokafka.admin.config_resource import ConfigResourceType

    keys = ("group.min.session.timeout.ms", "group.max.session.timeout.ms")
    async with _admin(bootstrap) as admin:
        cluster = await admin.describe_cluster()
        brokers = sorted(b["node_id"] for b in cluster.get("brokers", []))
        if not brokers:
            return
        found = await _config_values(admin, ConfigResourceType.BROKER, [str(brokers[0])], keys)
    bounds = {k: int(v) for k, v in found.get(str(brokers[0]), {}).items() if v is not None}
    low, high = bounds.get(keys[0]), bounds.get(keys[1])
    ms = session_timeout_s * 1000.0
    if (low is not None and ms < low) or (high is not None and ms > high):
        raise SessionTimeoutRefused(
            f"{option}: the brokers take {low / 1000:g} to {high / 1000:g} s "
            f"(group.min/max.session.timeout.ms), got {session_timeout_s:g}")


async def ensure_topics(bootstrap: str, specs: list[TopicSpec], *, replication: int | None = None) -> list[str]:
    """Create the missing topics; fail if an existing one has another partition count
    or cleanup policy.

    The policy is checked because a topic made by other tooling (or by broker
    auto-creation) gets the broker's default, ``delete``: a state changelog
    kept by time loses the states of deployments quiet for longer than its
    retention, and an event topic compacted by deployment keeps only the
    last record of each. Other settings (retention, record size) are the
    operator's to tune. Returns the names created. ``replication`` defaults
    to min(3, brokers).
    """
    from aiokafka.admin import NewTopic

    async with _admin(bootstrap) as admin:
        metadata = await admin.describe_cluster()
        brokers = len(metadata.get("brokers", [])) or 1
        rf = replication or min(3, brokers)
        existing = await _partition_counts(admin, [s.name for s in specs])
        for spec in specs:
            have = existing.get(spec.name)
            if have is not None and have != spec.partitions:
                raise TopicMismatch(
                    f"topic {spec.name} has {have} partitions, this installation uses "
                    f"{spec.partitions}; deployments would move partitions (use another "
                    f"--topic-prefix, or recreate the topics)"
                )
        policies = await _cleanup_policies(admin, [s.name for s in specs if s.name in existing])
        for spec in specs:
            want, have = _policy(spec.config.get("cleanup.policy", "delete")), policies.get(spec.name)
            if have is not None and _policy(have) != want:
                raise TopicMismatch(
                    f"topic {spec.name} has cleanup.policy {have}, this installation needs "
                    f"{','.join(sorted(want))}; a changelog must be compacted and an event topic "
                    f"kept by time (use another --topic-prefix, or alter the topic's cleanup.policy)"
                )
        missing = [s for s in specs if s.name not in existing]
        created: list[str] = []
        if missing:
            response = await admin.create_topics(
                [NewTopic(s.name, s.partitions, rf, topic_configs=s.config) for s in missing],
                timeout_ms=15000,
            )
            for name, code, *rest in response.topic_errors:
                if code == 0:
                    created.append(name)
                elif code == _INVALID_REPLICATION_FACTOR:  # more replicas than brokers
                    raise TopicCreationError(f"--replication {rf}: cannot create topic {name} ({rest[0] if rest else code})")
                elif code != _TOPIC_ALREADY_EXISTS:  # a concurrent process won the race
                    raise TopicCreationError(f"cannot create topic {name}: error {code} {rest}")
            again = await _partition_counts(admin, [s.name for s in missing])
            for spec in missing:
                if again.get(spec.name, spec.partitions) != spec.partitions:
                    raise TopicMismatch(f"topic {spec.name} was created concurrently with "
                                        f"{again[spec.name]} partitions, not {spec.partitions}")
        return created


_TOPIC_ALREADY_EXISTS = 36
_INVALID_REPLICATION_FACTOR = 38


async def partition_counts(bootstrap: str, names: list[str]) -> dict[str, int]:
    """Partition counts of those of ``names`` that exist on the cluster."""
    async with _admin(bootstrap) as admin:
        return await _partition_counts(admin, names)


@contextlib.asynccontextmanager
async def _admin(bootstrap: str):
    """An admin client, started, closed on the way out."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def _config_values(admin, kind, names: list[str], keys: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``keys`` of each named resource (topics or brokers, ``kind``), as the cluster has them in
    effect; a resource the cluster answers with an error is left out."""
    from aiokafka.admin.config_resource import ConfigResource

    responses = await admin.describe_configs([ConfigResource(kind, n, dict.fromkeys(keys)) for n in names])
    out: dict[str, dict[str, str]] = {}
    for response in responses:
        for error_code, _message, _type, name, entries, *_ in response.resources:
            for key, value, *_ in entries if error_code == 0 else ():
                if key in keys:
                    out.setdefault(name, {})[key] = value
    return out


def _policy(value: str) -> frozenset[str]:
    """A ``cleanup.policy`` value as a set: ``compact,delete`` and ``delete, compact`` agree."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


async def _cleanup_policies(admin, names: list[str]) -> dict[str, str]:
    """The effective ``cleanup.policy`` of each of ``names`` (existing topics only)."""
    if not names:
        return {}
    from aiokafka.admin.config_resource import ConfigResourceType

    found = await _config_values(admin, ConfigResourceType.TOPIC, names, ("cleanup.policy",))
    return {name: values["cleanup.policy"] for name, values in found.items()}


async def _partition_counts(admin, names: list[str]) -> dict[str, int]:
    """Partition counts of those of ``names`` that exist.

    Only existing topics are described: a metadata request for a missing
    topic can auto-create it with the broker's default partition count.
    """
    present = set(await admin.list_topics())
    wanted = [n for n in names if n in present]
    if not wanted:
        return {}
    described = await admin.describe_topics(wanted)
    out: dict[str, int] = {}
    for item in described:
        if item.get("error_code", 0) == 0 and item.get("partitions"):
            out[item["topic"]] = len(item["partitions"])
    return out
