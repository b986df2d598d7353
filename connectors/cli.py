"""``fleetplan connector``: the command that runs the connector service.

Configuration is checked before anything is consumed; every problem exits
with status 2 and one line that names the option to fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from fleetplan.connectors.base import Applier, ConnectorConfigError, check_seconds
from fleetplan.connectors.ledger import DEFAULT_LEASE_S
from fleetplan.options import (
    PATH,
    bootstrap_problem,
    log_level_problem,
    port_problem,
    topic_name_problem,
)
from fleetplan.schemas import topics
from fleetplan.schemas.events import MAX_NAME_LENGTH, ROLES

DEFAULT_BOOTSTRAP = "localhost:9092"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
MAX_KAFKA_INT32 = 2**31 - 1
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Backend(StrEnum):
    kubernetes = "kubernetes"
    virtual = "virtual"
    log = "log"


class Engine(StrEnum):
    vllm = "vllm"
    sglang = "sglang"
    trtllm = "trtllm"
    mocker = "mocker"


def _fail(message: str) -> None:
    from fleetplan.cli import fail

    fail(message)


def parse_services(engine: str, overrides: list[str]) -> dict[str, str]:
    """``role=Service`` overrides on top of the engine's Dynamo component names."""
    from fleetplan.connectors.kubernetes import SERVICE_NAMES

    services = dict(SERVICE_NAMES[engine])
    for item in overrides:
        role, sep, name = item.partition("=")
        if not sep or not name or role not in ROLES:
            raise ConnectorConfigError(
                "--service", f"expected ROLE=SERVICE with ROLE one of {', '.join(ROLES)}, got {item!r}"
            )
        services[role] = name
    return services


def parse_dgds(deployments: list[str], dgds: list[str]) -> dict[str, str]:
    """deployment -> DGD name. ``--dgd NAME`` works alone when there is one deployment.

    Two deployments on one DGD are refused: each has its own planner, and
    both would write the same DGD's replica counts, each undoing the other.
    """
    mapping = {d: d for d in deployments}
    env_name = os.environ.get("DYN_PARENT_DGD_K8S_NAME")
    if not dgds and env_name and len(deployments) == 1:
        mapping[deployments[0]] = env_name
    for item in dgds:
        deployment, sep, name = item.partition("=")
        if not sep:
            if len(deployments) != 1:
                raise ConnectorConfigError(
                    "--dgd", f"use DEPLOYMENT=DGD when there are several deployments, got {item!r}"
                )
            deployment, name = deployments[0], item
        if deployment not in mapping:
            raise ConnectorConfigError("--dgd", f"{deployment!r} is not one of the --deployment names")
        if not name:
            raise ConnectorConfigError("--dgd", f"empty DGD name in {item!r}")
        mapping[deployment] = name
    scaled_by: dict[str, list[str]] = {}
    for deployment, name in mapping.items():
        scaled_by.setdefault(name, []).append(deployment)
    for name, names in scaled_by.items():
        if len(names) > 1:  # each planner would overwrite the other's replica counts
            raise ConnectorConfigError(
                "--dgd", f"deployments {', '.join(map(repr, names))} would all scale DGD {name!r}; "
                "give each its own (DEPLOYMENT=DGD)",
            )
    return mapping


def default_namespace() -> str:
    if env := os.environ.get("POD_NAMESPACE"):
        return env
    try:
        return SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def redis_db_problem(url: str) -> str | None:
    """What is wrong with a Redis URL's database, if anything: redis-py reads a path that is not a
    number as database 0, so the ledger would live where the operator did not put it."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss"):  # unix://: the path is the socket's
        return None
    path = parsed.path.strip("/")
    if path and not (path.isascii() and path.isdigit()):
        return f"{url}: the database must be a number >= 0 (redis://HOST:PORT/DB), got {path!r}"
    return None


def connector(
    backend: Annotated[Backend, typer.Option(help="where decisions go")],
    bootstrap: Annotated[str, typer.Option(envvar="FLEETPLAN_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers")] = DEFAULT_BOOTSTRAP,
    redis_url: Annotated[str, typer.Option(envvar="FLEETPLAN_REDIS_URL", help="Redis for the ledger (and the virtual backend)")] = DEFAULT_REDIS_URL,
    deployment: Annotated[list[str] | None, typer.Option("--deployment", help="only these deployments (repeat); required for kubernetes")] = None,
    group_id: Annotated[str, typer.Option(help="Kafka consumer group")] = "fleetplan-connector",
    instance_id: Annotated[str | None, typer.Option(envvar="FLEETPLAN_CONNECTOR_INSTANCE_ID", help="Kafka static member id: a restart takes its partitions back at once")] = None,
    decisions_topic: Annotated[str, typer.Option(help="topic to read decisions from")] = topics.DECISIONS,
    acks_topic: Annotated[str, typer.Option(help="topic to write acks to")] = topics.ACKS,
    deadletter_topic: Annotated[str, typer.Option(help="topic for unusable records")] = topics.DEADLETTER,
    ledger_prefix: Annotated[str, typer.Option(help="Redis key prefix of the idempotency ledger")] = "fleetplan:ledger",
    claim_lease: Annotated[float, typer.Option(help="seconds a claim outlives its connector's last renewal before another connector recovers it (a restart with the same --instance-id recovers at once)")] = DEFAULT_LEASE_S,
    metrics_port: Annotated[int, typer.Option(help="Prometheus /metrics port, 0 for none")] = 9465,
    session_timeout_ms: Annotated[int, typer.Option(help="Kafka group session timeout")] = 10_000,
    virtual_prefix: Annotated[str, typer.Option(rich_help_panel="virtual backend", help="Redis key prefix of desired state")] = "fleetplan:virtual",
    completion_timeout: Annotated[float, typer.Option(rich_help_panel="virtual backend", help="seconds to wait for the orchestrator")] = 1800.0,
    kubeconfig: Annotated[Path | None, typer.Option(**PATH, rich_help_panel="kubernetes backend", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")] = None,
    context: Annotated[str | None, typer.Option(rich_help_panel="kubernetes backend", help="kubeconfig context ($KUBECONFIG or ~/.kube/config without --kubeconfig), taken over the in-cluster account")] = None,
    namespace: Annotated[str | None, typer.Option(rich_help_panel="kubernetes backend", help="namespace of the DGDs (default: the pod's, else default)")] = None,
    dgd: Annotated[list[str] | None, typer.Option("--dgd", rich_help_panel="kubernetes backend", help="DEPLOYMENT=DGD (repeat), or DGD with one deployment; default: the deployment name, or $DYN_PARENT_DGD_K8S_NAME")] = None,
    engine: Annotated[Engine, typer.Option(rich_help_panel="kubernetes backend", help="Dynamo backend, for default service names")] = Engine.vllm,
    service: Annotated[list[str] | None, typer.Option("--service", rich_help_panel="kubernetes backend", help="ROLE=SERVICE override (repeat)")] = None,
    ready_timeout: Annotated[float, typer.Option(rich_help_panel="kubernetes backend", help="seconds each wait may take: for Ready before a raise, and for the moved roles to settle after the patch (a raise may take both)")] = 1800.0,
    ready_poll: Annotated[float, typer.Option(rich_help_panel="kubernetes backend", help="seconds between readiness polls")] = 10.0,
    max_attempts: Annotated[int, typer.Option(rich_help_panel="kubernetes backend", help="attempts per API call on 409/429/5xx")] = 6,
    request_timeout: Annotated[float, typer.Option(rich_help_panel="kubernetes backend", help="seconds per API request")] = 10.0,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Apply the planner's decisions (each at most once) and acknowledge them."""
    deployments = list(deployment or [])
    try:
        for option, problem in (("--log-level", log_level_problem(log_level)),
                                ("--bootstrap", bootstrap_problem(bootstrap)),
                                ("--decisions-topic", topic_name_problem(decisions_topic)),
                                ("--acks-topic", topic_name_problem(acks_topic)),
                                ("--deadletter-topic", topic_name_problem(deadletter_topic))):
            if problem is not None:
                raise ConnectorConfigError(option, problem)
        for name in deployments:
            if not 1 <= len(name) <= MAX_NAME_LENGTH:  # the events' name bounds: no decision carries another
                raise ConnectorConfigError("--deployment", f"a name of 1 to {MAX_NAME_LENGTH} characters, "
                                                           f"got {len(name)}")
        if (problem := redis_db_problem(redis_url)) is not None:
            raise ConnectorConfigError("--redis-url", problem)
        if not group_id:
            # Kafka refuses an empty group at the join, after Redis and the broker were reached
            raise ConnectorConfigError("--group-id", "must not be empty")
        if not 0 <= metrics_port <= 65535:
            raise ConnectorConfigError("--metrics-port", f"must be 0..65535, got {metrics_port}")
        check_seconds("--claim-lease", claim_lease)
        check_seconds("--completion-timeout", completion_timeout)
        if not 0 < session_timeout_ms <= MAX_KAFKA_INT32:  # Kafka's wire field is a 32-bit int
            raise ConnectorConfigError("--session-timeout-ms", f"must be a positive number of milliseconds "
                                       f"up to {MAX_KAFKA_INT32}, got {session_timeout_ms}")
        if dgd and backend is not Backend.kubernetes:
            raise ConnectorConfigError("--dgd", "only applies to --backend kubernetes")
        if backend is Backend.kubernetes:
            from fleetplan.connectors.kubernetes import KubernetesSettings, load_configuration

            if not deployments:
                raise ConnectorConfigError("--deployment", "the kubernetes backend needs at least one")
            k8s_settings = KubernetesSettings(
                dgds=parse_dgds(deployments, list(dgd or [])),
                services=parse_services(engine.value, list(service or [])),
                namespace=namespace or default_namespace(),
                ready_timeout_s=ready_timeout, ready_poll_s=ready_poll,
                max_attempts=max_attempts, request_timeout_s=request_timeout,
            )
            k8s_settings.check()
            k8s_configuration = load_configuration(kubeconfig, context)

        def make_applier() -> Applier:
            if backend is Backend.log:
                from fleetplan.connectors.log import LogApplier

                return LogApplier()
            if backend is Backend.virtual:
                from fleetplan.connectors.ledger import connect
                from fleetplan.connectors.virtual import VirtualApplier

                # Its own pool: waits for orchestrators hold connections (XREAD BLOCK).
                return VirtualApplier(connect(redis_url, max_connections=256), owns_client=True,
                                      prefix=virtual_prefix,
                                      completion_timeout_s=completion_timeout)
            from fleetplan.connectors.kubernetes import KubernetesApplier

            return KubernetesApplier(k8s_settings, k8s_configuration)

        from fleetplan.connectors.worker import ServiceSettings

        settings = ServiceSettings(
            bootstrap=bootstrap, group_id=group_id, instance_id=instance_id,
            deployments=frozenset(deployments) if deployments else None,
            decisions_topic=decisions_topic, acks_topic=acks_topic,
            deadletter_topic=deadletter_topic, session_timeout_ms=session_timeout_ms,
            metrics_port=metrics_port or None,
        )
        if (problem := port_problem(metrics_port)) is not None:  # the last check: the others need no port
            raise ConnectorConfigError("--metrics-port", problem)
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        asyncio.run(_serve(settings, make_applier, redis_url, ledger_prefix, claim_lease))
    except ConnectorConfigError as err:
        _fail(str(err))


async def _serve(settings, make_applier, redis_url: str, ledger_prefix: str, claim_lease: float) -> None:
    import redis.asyncio as aioredis
    from aiokafka.errors import InvalidSessionTimeoutError, KafkaConnectionError

    from fleetplan.connectors.ledger import Ledger, connect
    from fleetplan.connectors.worker import ConnectorService

    try:
        redis_client = connect(redis_url)
    except ValueError as err:
        raise ConnectorConfigError("--redis-url", str(err)) from None
    try:
        try:
            await redis_client.ping()
        except (aioredis.RedisError, OSError, ValueError) as err:
            raise ConnectorConfigError(
                "--redis-url", f"cannot reach Redis at {redis_url} ({err})"
            ) from None
        claimant = settings.instance_id or f"{os.uname().nodename}:{os.getpid()}"
        service = ConnectorService(
            make_applier(), Ledger(redis_client, prefix=ledger_prefix, claimant=claimant, lease_s=claim_lease),
            settings,
        )
        try:
            await service.start()
        except KafkaConnectionError as err:
            raise ConnectorConfigError(
                "--bootstrap", f"cannot reach Kafka at {settings.bootstrap} ({err})"
            ) from None
        except InvalidSessionTimeoutError:  # its range is the broker's setting, known only at the join
            raise ConnectorConfigError(
                "--session-timeout-ms", f"the broker refuses {settings.session_timeout_ms} ms (outside its "
                "group.min.session.timeout.ms..group.max.session.timeout.ms, 6000..1800000 by default)"
            ) from None
        except OSError as err:
            raise ConnectorConfigError("--metrics-port", f"cannot listen ({err})") from None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop)
        await service.run()
    finally:
        await redis_client.aclose()


def register(app: typer.Typer) -> None:
    """Called by ``fleetplan.cli`` to add the ``connector`` command."""
    app.command("connector")(connector)
