"""The compose stack is well formed (there is no Docker engine here to run it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
import yaml

from fleetplan.connectors.cli import register

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
SERVICES = {"kafka", "redis", "prometheus", "grafana", "bridge", "worker", "connector", "fleet"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*))?\}")


def interpolate(args: list[str], env: dict[str, str]) -> list[str]:
    """A command as compose runs it: ``${NAME:-default}`` from the environment of ``docker compose``."""
    return [_VARIABLE.sub(lambda m: env.get(m["name"]) or (m["default"] or ""), a) for a in args]


def test_names_every_service(compose):
    assert SERVICES <= set(compose["services"])


def test_fleetplan_services_run_their_commands(compose):
    services = compose["services"]
    for name, command in [("bridge", "bridge"), ("worker", "worker"), ("connector", "connector"),
                          ("fleet", "simulate")]:
        assert services[name]["command"][:2] == ["fleetplan", command], name
        assert services[name]["build"]["dockerfile"] == "compose/Dockerfile"
        env = services[name]["environment"]
        assert env["FLEETPLAN_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert env["FLEETPLAN_REDIS_URL"].startswith("redis://redis:")
    fleet = services["fleet"]["command"]
    assert "--realtime" in fleet and fleet[fleet.index("--publish") + 1] == "tcp://bridge:5557"
    assert "5557:5557" in services["bridge"]["ports"]


def test_kafka_is_a_single_kraft_node(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:4")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "zookeeper" not in compose["services"]
    assert "healthcheck" in kafka and "healthcheck" in compose["services"]["redis"]
    # topics come from the worker and the bridge only, with their partition count (a connector
    # subscribing first would have the broker create the decision topic with its own)
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_kafka_keeps_its_log_on_its_volume(compose):
    """Set by environment alone, the image's log.dirs stays under /tmp unless KAFKA_LOG_DIRS moves it."""
    kafka = compose["services"]["kafka"]
    mounts = dict(v.split(":")[:2] for v in kafka["volumes"])
    assert kafka["environment"]["KAFKA_LOG_DIRS"] == mounts["kafka-data"]


def test_connector_command_uses_real_options(compose):
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    connector = typer.main.get_command(app).commands["connector"]
    known = {opt for p in connector.params for opt in getattr(p, "opts", [])}
    assert "--backend" in known
    used = [a for a in compose["services"]["connector"]["command"] if a.startswith("--")]
    assert set(used) <= known


def test_bridge_and_fleet_commands_parse_with_the_real_options(compose):
    """The demo fleet's ``simulate --publish --realtime`` and the bridge it publishes to."""
    from fleetplan.sim import cli as sim_cli
    from fleetplan.streams import cli as streams_cli

    app = typer.Typer()
    sim_cli.register(app)
    streams_cli.register(app)
    commands = typer.main.get_command(app).commands
    services = compose["services"]
    parsed = {}
    for name in ("bridge", "fleet"):
        command = interpolate(services[name]["command"], {})
        args = sim_cli.rewrite_args(command[1:])  # as fleetplan.cli.main does
        ctx = commands[args[0]].make_context(args[0], args[1:])  # parses, converts, validates
        assert not ctx.args, ctx.args
        parsed[name] = ctx.params
    fleet, bridge = parsed["fleet"], parsed["bridge"]
    assert fleet["realtime"] == 1.0 and fleet["deployment"] == "demo"
    # the demo fleet is scaled by the live decisions, so no other orchestrator runs by default
    from fleetplan.sim.follow import FollowDecisions
    from fleetplan.sim.policy import load_policy

    assert isinstance(load_policy(fleet["policy"]), FollowDecisions)
    assert services["orchestrator"]["profiles"] == ["example"]
    # The fleet PUSHes to the bridge's PULL endpoint, which binds; the SUB endpoint binds too
    # (publishers connect to the published port).
    assert fleet["publish"] == "tcp://bridge:5557"
    assert list(bridge["pull"]) == ["tcp://0.0.0.0:5557"]  # a tuple from typer 0.16's click
    assert list(bridge["sub"]) == ["bind:tcp://0.0.0.0:5556"]
    for option in ("trace", "config"):
        assert (COMPOSE.parent / fleet[option]).exists(), fleet[option]


def test_the_demo_deployment_is_named_by_the_composing_shell(compose):
    """FLEETPLAN_DEPLOYMENT renames the demo fleet's deployment, as it does for scripts/stack-local.sh;
    no container reads it, so it is not in their environment."""
    fleet = compose["services"]["fleet"]["command"]
    at = fleet.index("--deployment") + 1
    assert interpolate(fleet, {})[at] == "demo"
    assert interpolate(fleet, {"FLEETPLAN_DEPLOYMENT": "demo2"})[at] == "demo2"
    assert "FLEETPLAN_DEPLOYMENT" not in compose["x-fleetplan"]["environment"]


def test_worker_keeps_its_state_on_its_volume(compose):
    """The worker's --datadir is where the worker-state volume is mounted, not the default in /tmp."""
    from fleetplan.streams import cli as streams_cli

    app = typer.Typer()
    streams_cli.register(app)
    worker = typer.main.get_command(app).commands["worker"]
    command = compose["services"]["worker"]["command"]
    ctx = worker.make_context("worker", command[2:])
    assert not ctx.args, ctx.args
    mounts = dict(v.split(":")[:2] for v in compose["services"]["worker"]["volumes"])
    assert "worker-state" in compose["volumes"]
    assert str(ctx.params["datadir"]) == mounts["worker-state"]


def test_mounted_files_exist(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (COMPOSE / source).exists(), f"{name}: {source}"
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    for folder in ("fleetplan", "schemas", "models", "streams", "connectors", "sim", "examples"):
        assert f"COPY {folder} ./{folder}" in dockerfile


def test_prometheus_scrapes_the_fleetplan_services(compose):
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]}
    services = compose["services"]
    for name in ("bridge", "worker", "connector"):
        command = services[name]["command"]
        port = command[command.index("--metrics-port") + 1]
        assert f"{name}:{port}" in targets


def test_grafana_dashboard_is_provisioned():
    dashboard = json.loads((COMPOSE / "grafana" / "dashboards" / "fleetplan.json").read_text())
    datasource = yaml.safe_load(
        (COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert dashboard["uid"] == "fleetplan" and dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == datasource["uid"]
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("fleetplan_replica_target", "fleetplan_sizing_replicas", "fleetplan_estimated_ttft_ms", "fleetplan_load_reason",
                   "fleetplan_connector_decisions_total", "fleetplan_decision_latency_seconds_bucket",
                   "fleetplan_sizing_quantile_calibrated", "fleetplan_sizing_utilization",
                   "fleetplan_sizing_quantile_exceeded"):
        assert metric in exprs


def _exported_names() -> set[str]:
    """Every series name the worker, the bridge and the connector export (the ``_total`` of counters)."""
    from fleetplan.connectors.bridge import BridgeMetrics
    from fleetplan.connectors.metrics import ConnectorMetrics
    from fleetplan.streams.metrics import WorkerMetrics

    names = set()
    for metrics in (WorkerMetrics(), BridgeMetrics(), ConnectorMetrics("virtual")):
        for family in metrics.registry.collect():
            names.add(family.name)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


def _dashboard_panels() -> list[dict]:
    return json.loads((COMPOSE / "grafana" / "dashboards" / "fleetplan.json").read_text())["panels"]


def test_the_dashboard_queries_only_metrics_the_services_export():
    exported = _exported_names()
    for panel in _dashboard_panels():
        for target in panel["targets"]:
            for name in re.findall(r"\bfleetplan_\w+", target["expr"]):
                assert name in exported, (panel["title"], name)


def test_the_dead_letter_panel_counts_every_services_dead_letters():
    """The bridge dead-letters bad input at the edge, before Kafka; the panel's legend said
    worker/bridge, but its query read the worker's counter alone."""
    counters = {n for n in _exported_names() if "deadletter" in n and n.endswith("_total")}
    assert counters == {"fleetplan_deadletters_total", "fleetplan_bridge_deadletters_total",
                        "fleetplan_connector_deadlettered_total"}
    panel = next(p for p in _dashboard_panels() if "dead-lettered" in p["title"].lower())
    queried = {n for t in panel["targets"] for n in re.findall(r"\bfleetplan_\w+", t["expr"])}
    assert counters <= queried
