"""``fleetplan worker``, ``fleetplan audit`` and ``fleetplan bridge``.

Thin wrappers: each parses its options into the settings of a runtime
part and starts it. Bad options exit with status 2 and one line naming the
option; no planning logic lives here.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from fleetplan.options import PATH, bootstrap_problem, log_level_problem, port_problem

BOOTSTRAP_ENV = "FLEETPLAN_KAFKA_BOOTSTRAP"
_UNABLE_CONNECT = re.compile(r'^Unable connect to "[^"]*": ')  # aiokafka's prefix; the address is in ours


def _fail(message: str, code: int = 2) -> None:
    from fleetplan.cli import fail

    fail(message, code)


def _check_finite(**options: float | None) -> None:
    """Typer's ``min`` lets nan and inf through; a duration or an interval must be a real number."""
    for name, value in options.items():
        if value is not None and not math.isfinite(value):
            _fail(f"--{name.replace('_', '-')}: must be a finite number, got {value}")


def kafka_unreachable(bootstrap: str, err: Exception, detail: str | None = None) -> str:
    """The one line for a broker that does not answer, naming --bootstrap.

    aiokafka's exception says only "Unable to bootstrap"; the line it logs
    just before (``detail``) says why (refused, no such host), so it is
    preferred when there is one.
    """
    why = _UNABLE_CONNECT.sub("", detail) if detail else str(err).removeprefix(f"{type(err).__name__}: ")
    return f"--bootstrap {bootstrap}: cannot reach Kafka ({why})"


class _LastKafkaError(logging.Handler):
    """Keeps aiokafka's last error line for the message, instead of letting it print on its own."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


@contextmanager
def _reaching_kafka(bootstrap: str) -> Iterator[None]:
    """Turn a broker that cannot be reached into one line and exit 2, not a traceback."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

    logger = logging.getLogger("aiokafka")
    handler = _LastKafkaError()
    logger.addHandler(handler)
    try:
        yield
    except (KafkaConnectionError, KafkaTimeoutError) as err:
        _fail(kafka_unreachable(bootstrap, err, handler.last))
    finally:
        logger.removeHandler(handler)


def _start_errors() -> tuple[type[Exception], ...]:
    """What a bad --config, --profile or warm-up trace raises at start: the user's to fix, in one line."""
    from fleetplan.models.config import ConfigError

    errors: list[type[Exception]] = [ConfigError, OSError]
    try:
        from fleetplan.sim.profiles import ProfileError
        from fleetplan.sim.traces import TraceFormatError
    except ModuleNotFoundError:  # no simulator installed: profiles and warm-up traces cannot be read anyway
        return tuple(errors)
    return (*errors, ProfileError, TraceFormatError)


def _bootstrap(value: str | None) -> str:
    bootstrap = value or os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        _fail(f"--bootstrap: give the Kafka bootstrap address (or set {BOOTSTRAP_ENV})")
    _refuse("--bootstrap", bootstrap_problem(bootstrap))
    return bootstrap


def _refuse(option: str, problem: str | None) -> None:
    """Stop with ``OPTION: problem`` when a check (fleetplan/options.py) found one."""
    if problem is not None:
        _fail(f"{option}: {problem}")


_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]*")
MAX_NAME_PART = 200
"""Longest --topic-prefix or --app-id: Kafka takes topic names of 249 characters, and the
longest name built from one adds about 30."""


def _topic_name_part(option: str, value: str, *, empty_ok: bool = True) -> str:
    """A --topic-prefix or --app-id that Kafka topic names can carry, refused at start."""
    if not value and not empty_ok:
        _fail(f"{option}: must not be empty")
    if not _TOPIC_CHARS.fullmatch(value) or len(value) > MAX_NAME_PART:
        _fail(f"{option}: letters, digits, '.', '_' and '-' only (Kafka topic names), at most "
              f"{MAX_NAME_PART} characters, got {value!r}")
    return value


def _loglevel(value: str) -> str:
    _refuse("--loglevel", log_level_problem(value))
    return value.lower()


def _store(value: str) -> str:
    """memory:// or rocksdb:// (the latter only with its extra installed)."""
    from fleetplan.streams.app import rocksdb_available

    if value.startswith("memory://"):
        return value
    if value.startswith("rocksdb://"):
        if not rocksdb_available():
            _fail("--store: rocksdb:// needs the optional extra: pip install 'fleetplan[rocksdb]'")
        return value
    _fail(f"--store: memory:// or rocksdb://, got {value!r}")


Bootstrap = Annotated[str | None, typer.Option("--bootstrap", help=f"Kafka bootstrap host:port (default ${BOOTSTRAP_ENV})")]
Prefix = Annotated[str, typer.Option("--topic-prefix", help="namespace prepended to every topic name")]
Partitions = Annotated[int, typer.Option("--partitions", min=1, help="partitions of every topic (a contract: keep it)")]
Config = Annotated[Path | None, typer.Option("--config", **PATH, help="planner config, YAML or JSON")]
Profile = Annotated[str | None, typer.Option("--profile", help="profile name or NPZ/JSON path")]


def worker(
    bootstrap: Bootstrap = None,
    config: Config = None,
    profile: Profile = None,
    app_id: Annotated[str, typer.Option("--app-id", help="Faust app id: consumer group and changelog names")] = "fleetplan-worker",
    topic_prefix: Prefix = "",
    partitions: Partitions = 8,
    replication: Annotated[int | None, typer.Option(min=1, help="replication factor of created topics (default min(3, brokers))")] = None,
    store: Annotated[str | None, typer.Option(help="table store URL: rocksdb:// (default when rocksdict is installed) or memory://")] = None,
    datadir: Annotated[Path, typer.Option(**PATH, help="local state directory")] = Path("/tmp/fleetplan-worker"),
    batch_max: Annotated[int, typer.Option(min=1, help="records per batch at most")] = 2000,
    batch_within: Annotated[float, typer.Option(min=0.001, help="seconds to wait to fill a batch")] = 0.05,
    idle_after: Annotated[float, typer.Option(min=0.1, help="seconds of silence after which a source stops holding the watermark")] = 30.0,
    snapshot_every: Annotated[float, typer.Option(min=0.0, help="event-time seconds between the state snapshots each deployment writes on the ticks topic, which `audit --since` starts from (0: none)")] = 3600.0,
    session_timeout: Annotated[float, typer.Option(min=1.0, help="consumer session timeout, seconds")] = 10.0,
    heartbeat: Annotated[float, typer.Option(min=0.1, help="consumer heartbeat interval, seconds")] = 1.0,
    commit_interval: Annotated[float, typer.Option(min=0.1, help="offset commit interval, seconds")] = 1.0,
    instance_id: Annotated[str | None, typer.Option(help="static group membership id (fast restarts)")] = None,
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="serve Prometheus /metrics on this port")] = None,
    loglevel: Annotated[str, typer.Option(help="log level")] = "warning",
) -> None:
    """Run the planner worker: inputs from Kafka into the core, decisions out.

    Everything checkable without a broker is checked first (options, the
    state directory; then ``run_worker`` builds the planner from --config
    and --profile before it creates the topics), so bad input fails at start.
    """
    from fleetplan.cli import ensure_output_dir
    from fleetplan.streams.app import WorkerSettings, default_store
    from fleetplan.streams.topics import SessionTimeoutRefused, TopicCreationError, TopicMismatch
    from fleetplan.streams.worker import run_worker

    _check_finite(batch_within=batch_within, idle_after=idle_after, session_timeout=session_timeout,
                  heartbeat=heartbeat, commit_interval=commit_interval, snapshot_every=snapshot_every)
    if heartbeat >= session_timeout:
        _fail(f"--heartbeat: must be below --session-timeout ({session_timeout}), got {heartbeat}")
    _refuse("--metrics-port", port_problem(metrics_port))
    settings = WorkerSettings(
        bootstrap=_bootstrap(bootstrap), app_id=_topic_name_part("--app-id", app_id, empty_ok=False),
        topic_prefix=_topic_name_part("--topic-prefix", topic_prefix),
        partitions=partitions, replication=replication, store=_store(store or default_store()),
        datadir=str(datadir), config=None if config is None else str(config), profile=profile,
        batch_max=batch_max, batch_within_s=batch_within, idle_after_s=idle_after, snapshot_every_s=snapshot_every,
        session_timeout_s=session_timeout, heartbeat_s=heartbeat, commit_interval_s=commit_interval,
        instance_id=instance_id, metrics_port=metrics_port, loglevel=_loglevel(loglevel),
    )
    ensure_output_dir("--datadir", datadir)
    try:
        with _reaching_kafka(settings.bootstrap):
            run_worker(settings)
    except (*_start_errors(), TopicMismatch, TopicCreationError, SessionTimeoutRefused) as err:
        _fail(str(err))


def audit(
    deployment: Annotated[str, typer.Option("--deployment", help="the deployment to audit")],
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", help=f"read the topics of this Kafka cluster (default ${BOOTSTRAP_ENV} when --log is not given)")] = None,
    log: Annotated[Path | None, typer.Option("--log", **PATH, help="read a local JSONL event log instead (fleetplan simulate)")] = None,
    config: Config = None,
    profile: Profile = None,
    topic_prefix: Prefix = "",
    partitions: Annotated[int | None, typer.Option("--partitions", min=1, help="partitions of the topics (default: read from the cluster)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="print every decision checked")] = False,
    report: Annotated[Path | None, typer.Option("--report", **PATH, help="also write DIR/report.html (not there yet): the simulator's report of the recorded run")] = None,
    seed_out: Annotated[Path | None, typer.Option("--seed-out", **PATH, help="also write a seed_traffic control of the windows the re-fold fed its forecaster, to start another planner from (JSONL)")] = None,
    since: Annotated[float | None, typer.Option("--since", help="Kafka only: start from the worker's first state snapshot at or after this event time (Unix seconds), for a deployment older than its FPMs' retention (a day)")] = None,
) -> None:
    """Re-fold a deployment's inputs with the core and check every recorded decision.

    Exits 0 when every decision is reproduced, 1 on a divergence, 2 on bad
    input: also when a bad line ended a log's audit early, after printing
    what the lines before it proved.
    """
    from fleetplan.bootstrap import build_planner
    from fleetplan.cli import (
        ensure_output_dir,
        open_output,
        refuse_overwriting,
        refuse_replacing,
        write_seed,
    )
    from fleetplan.eventlog import EventLogError
    from fleetplan.models.config import ConfigError
    from fleetplan.streams.audit import audit_kafka, audit_log, write_audit_report

    if bootstrap is None and log is None:
        bootstrap = os.environ.get(BOOTSTRAP_ENV)  # as worker and bridge read it
    if (bootstrap is None) == (log is None):
        _fail(f"give exactly one of --bootstrap (Kafka, or ${BOOTSTRAP_ENV}) or --log (JSONL file)")
    if not deployment:
        _fail("--deployment: must not be empty")
    _check_finite(since=since)
    if since is not None and log is not None:
        _fail("--since: reads the worker's snapshots on Kafka (--bootstrap); a --log audit folds from its first line")
    if report is not None:
        ensure_output_dir("--report", report)
        refuse_replacing("--report", report / "report.html")
    if log is not None:
        refuse_overwriting("--seed-out", seed_out, "--log", log)
    else:
        bootstrap = _bootstrap(bootstrap)
        _topic_name_part("--topic-prefix", topic_prefix)
    # opened before the audit runs: a path that cannot be written costs nothing already done
    seed_fh = open_output("--seed-out", seed_out) if seed_out is not None else None
    try:
        planner = build_planner(config, profile)
        if log is not None:
            result = audit_log(log, deployment, planner=planner)
        else:
            with _reaching_kafka(bootstrap):
                result = audit_kafka(bootstrap, deployment, topic_prefix=topic_prefix, partitions=partitions,
                                     planner=planner, since=since)
    except (ConfigError, EventLogError, OSError, ValueError) as err:
        _fail(str(err))
    for line in result.lines(verbose=verbose):
        typer.echo(line)
    if not result.ok and profile is None and not planner.config.profile_results_dir:
        # a planner without a profile folds to other decisions than one seeded from it
        typer.echo("hint: audited without an engine profile; the planner that made these decisions "
                   "had one if it was fleetplan simulate (default h200-llama3.1-8b) or a worker given "
                   "--profile: audit with the same --profile and --config")
    if seed_fh is not None:
        with seed_fh:
            if result.state is None:
                typer.echo(f"fleetplan: {deployment}: no input folded, no seed written", err=True)
            elif write_seed(result.state, seed_fh):
                typer.echo(f"seed: {seed_out}")
    if report is not None:
        try:
            engine_gpus = None if planner.profile is None else planner.profile.engine_gpus
            path, unmeasured = write_audit_report(result, planner.config, report, profile_engine_gpus=engine_gpus)
            left_out = (f" ({unmeasured:,} finished request(s) without a measured TTFT or ITL left out of its "
                        f"figures)") if unmeasured else ""
            typer.echo(f"report: {path}{left_out}")
        except (OSError, ValueError) as err:
            if result.ok:
                _fail(f"--report: {err}")
            # a divergence is the answer and keeps its exit code (until 2026-12-05 this was 2)
            typer.echo(f"fleetplan: warning: --report: {err}", err=True)
    if result.ok and result.stopped is not None:
        _fail(f"{result.stopped} (the audit checked only the lines before it)")
    raise typer.Exit(0 if result.ok else 1)


def bridge(
    bootstrap: Bootstrap = None,
    sub: Annotated[list[str] | None, typer.Option("--sub", help="ZMQ SUB endpoint; 'bind:tcp://*:5557' binds, a plain address connects (repeatable)")] = None,
    pull: Annotated[list[str] | None, typer.Option("--pull", help="ZMQ PULL endpoint; binds unless given as 'connect:ADDR' (repeatable)")] = None,
    topic_prefix: Prefix = "",
    partitions: Partitions = 8,
    replication: Annotated[int | None, typer.Option(min=1, help="replication factor of created topics")] = None,
    buffer: Annotated[int, typer.Option(min=1, help="events accepted but not yet acknowledged by Kafka, at most")] = 100_000,
    pack_max: Annotated[int, typer.Option(min=1, max=10_000, help="FPMs packed into one record at most")] = 256,
    pack_within: Annotated[float, typer.Option(min=0.0, help="seconds an FPM may wait to be packed")] = 0.02,
    heartbeat: Annotated[float, typer.Option(min=0.0, help="idle seconds before a clock heartbeat (0: none)")] = 1.0,
    linger_ms: Annotated[int, typer.Option(min=0, help="producer linger")] = 5,
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="serve Prometheus /metrics on this port")] = None,
    max_ahead: Annotated[float | None, typer.Option(min=0.0, help="dead-letter events dated more than this many seconds ahead of the bridge's clock (default: any)")] = None,
    loglevel: Annotated[str, typer.Option(help="log level")] = "warning",
) -> None:
    """Run the ZMQ ingress bridge: validate FPMs and request records, produce them to Kafka.

    An existing topic with another partition count (``TopicMismatch``) stops
    it with one line, as it stops the worker: the fix is the user's.
    """
    import asyncio
    import logging

    from fleetplan.connectors.bridge import (
        BridgeSettings,
        EndpointError,
        parse_endpoints,
        run_bridge,
    )
    from fleetplan.streams.gc_settings import tune_gc
    from fleetplan.streams.topics import TopicCreationError, TopicMismatch

    sub, pull = sub or [], pull or []
    if not sub and not pull:
        _fail("give at least one --sub or --pull endpoint")
    try:
        endpoints = parse_endpoints(sub, pull)
    except ValueError as err:
        _fail(str(err))
    _refuse("--metrics-port", port_problem(metrics_port))
    logging.basicConfig(level=_loglevel(loglevel).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = BridgeSettings(
        bootstrap=_bootstrap(bootstrap), endpoints=endpoints,
        topic_prefix=_topic_name_part("--topic-prefix", topic_prefix),
        partitions=partitions, replication=replication, buffer=buffer, pack_max=pack_max,
        pack_within_s=pack_within, heartbeat_s=heartbeat, linger_ms=linger_ms, metrics_port=metrics_port,
        max_ahead_s=max_ahead,
    )
    _check_finite(pack_within=pack_within, heartbeat=heartbeat, max_ahead=max_ahead)
    tune_gc()
    try:
        with _reaching_kafka(settings.bootstrap):
            asyncio.run(run_bridge(settings))
    except (TopicMismatch, TopicCreationError, EndpointError) as err:
        _fail(str(err))


def register(app: typer.Typer) -> None:
    """Add the runtime's commands to the ``fleetplan`` CLI."""
    app.command("worker")(worker)
    app.command("audit")(audit)
    app.command("bridge")(bridge)
