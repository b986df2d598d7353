"""`fleetplan audit` and `fleetplan worker`: one-line errors naming the option or line, no broker needed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app
from fleetplan.streams.cli import kafka_unreachable
from tests.streams.test_stream_audit import write_log
from tests.streams.traffic import DECIDING_CONFIG

runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def registered():
    _register_optional()


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "planner.yaml"
    path.write_text(yaml.safe_dump(DECIDING_CONFIG))
    return path


def _run(*args):
    return runner.invoke(app, [*map(str, args)])


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: a broker that refuses at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fleetplan: error: "), result.output
    return lines[0]


# --- audit -------------------------------------------------------------------------------


def test_audit_of_an_unknown_deployment_names_the_ones_found(tmp_path, config):
    log = tmp_path / "events.jsonl"
    write_log(log)
    result = _run("audit", "--deployment", "nosuch", "--log", log, "--config", config)
    assert result.exit_code == 2
    assert f"no events for deployment 'nosuch' in {log} (found: alpha)" in _one_error_line(result)


def test_audit_of_an_empty_log_fails(tmp_path, config):
    log = tmp_path / "empty.jsonl"
    log.write_bytes(b"")
    result = _run("audit", "--deployment", "alpha", "--log", log, "--config", config)
    assert result.exit_code == 2
    assert _one_error_line(result).endswith(f"{log}: no events")


def test_audit_stopped_by_a_bad_line_reports_what_it_proved_before_it(tmp_path, config):
    log = tmp_path / "events.jsonl"
    decisions = write_log(log)
    lines = log.read_bytes().splitlines()
    fourth = next(i for i, x in enumerate(lines) if b'"decision_id":3' in x)
    cut = fourth + 2  # 1-based number of the line after decision 3
    log.write_bytes(b"\n".join([*lines[:cut - 1], lines[cut - 1][:25], *lines[cut:]]) + b"\n")
    result = _run("audit", "--deployment", "alpha", "--log", log, "--config", config)
    assert result.exit_code == 2
    assert f"STOPPED at {log}:{cut}: message: valid JSON" in result.stdout
    assert "OK: 4 decision(s) reproduced" in result.stdout and len(decisions) > 4
    assert f"{log}:{cut}:" in _one_error_line(result)


@pytest.mark.parametrize(("args", "message"), [
    (["--log", "events.jsonl", "--since", "1000"], "--since: reads the worker's snapshots on Kafka (--bootstrap)"),
    (["--bootstrap", "127.0.0.1:1", "--since", "nan"], "--since: must be a finite number"),
])
def test_audit_since_is_for_kafka_and_a_time(tmp_path, config, args, message):
    result = _run("audit", "--deployment", "alpha", "--config", config, *args)
    assert result.exit_code == 2
    assert message in _one_error_line(result)


def test_audit_checks_the_report_directory_before_auditing(tmp_path, config):
    log = tmp_path / "events.jsonl"
    write_log(log)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = _run("audit", "--deployment", "alpha", "--log", log, "--config", config, "--report", blocker / "r")
    assert result.exit_code == 2 and result.stdout == ""
    assert f"--report: cannot write {blocker / 'r'} (Not a directory)" in _one_error_line(result)


# --- worker ------------------------------------------------------------------------------


def _worker(tmp_path, *args):
    return _run("worker", "--bootstrap", f"127.0.0.1:{_closed_port()}", "--store", "memory://",
                "--datadir", tmp_path / "state", *args)


def test_worker_without_a_broker_fails_in_one_line_naming_bootstrap(tmp_path):
    result = _worker(tmp_path)
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert "--bootstrap 127.0.0.1:" in line and ": cannot reach Kafka (" in line and "Connect call failed" in line


def test_worker_checks_profile_and_config_before_kafka(tmp_path):
    npz = tmp_path / "trunc.npz"
    npz.write_bytes(b"PK\x03\x04 not a whole zip")
    result = _worker(tmp_path, "--profile", npz)
    assert result.exit_code == 2
    assert f"{npz}: not a readable NPZ file" in _one_error_line(result)  # not the Kafka error
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ttft_msec: 100\n")
    result = _worker(tmp_path, "--config", cfg)
    assert result.exit_code == 2
    assert f"{cfg}: ttft_msec: unknown field" in _one_error_line(result)


@pytest.mark.parametrize(("args", "message"), [
    (["--batch-within", "inf"], "--batch-within: must be a finite number, got inf"),
    (["--session-timeout", "inf"], "--session-timeout: must be a finite number, got inf"),
    (["--heartbeat", "20"], "--heartbeat: must be below --session-timeout (10.0), got 20.0"),
])
def test_worker_numeric_options_are_named(tmp_path, args, message):
    result = _worker(tmp_path, *args)
    assert result.exit_code == 2
    assert message in _one_error_line(result)


def _held_port() -> socket.socket:
    """A socket listening on a port, so the port is taken."""
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen()
    return held


@pytest.mark.parametrize(("args", "message"), [
    # all refused before any connection is tried (they crashed inside aiokafka, or were found
    # only after the topics were created)
    (["--bootstrap", "host:notaport"], "--bootstrap: expected host:port[,host:port...] with ports in 1..65535"),
    (["--bootstrap", "127.0.0.1:99999"], "--bootstrap: expected host:port"),
    (["--topic-prefix", "bad prefix/!"], "--topic-prefix: letters, digits, '.', '_' and '-' only"),
    (["--topic-prefix", "x" * 201], "at most 200 characters"),
    (["--app-id", ""], "--app-id: must not be empty"),
    (["--app-id", "bad id!"], "--app-id: letters, digits"),
    (["--loglevel", "bogus"], "--loglevel: one of debug, info, warning, error, critical, got 'bogus'"),
    (["--store", "aerospike://"], "--store: memory:// or rocksdb://, got 'aerospike://'"),
])
def test_worker_options_kafka_would_refuse_are_refused_first(tmp_path, args, message):
    result = _worker(tmp_path, *args)
    assert result.exit_code == 2
    assert message in _one_error_line(result)


def test_runtime_commands_refuse_a_metrics_port_that_is_taken(tmp_path):
    with _held_port() as held:
        port = held.getsockname()[1]
        for result in (_worker(tmp_path, "--metrics-port", port),
                       _run("bridge", "--bootstrap", "127.0.0.1:1", "--pull", "tcp://127.0.0.1:1",
                            "--metrics-port", port)):
            assert result.exit_code == 2
            assert f"--metrics-port: cannot listen on port {port} (Address already in use)" in _one_error_line(result)


@pytest.mark.parametrize(("args", "message"), [
    (["--pull", "xyz://127.0.0.1:25557"], "--pull: a ZMQ address like tcp://host:port"),
    (["--pull", "tcp://127.0.0.1"], "--pull: a tcp address needs host:port"),
    (["--sub", "tcp://*:5557"], "--sub: a wildcard host (*) can only be bound"),
    (["--pull", "tcp://127.0.0.1:1", "--loglevel", "bogus"], "--loglevel: one of"),
    (["--pull", "tcp://127.0.0.1:1", "--bootstrap", "host:notaport"], "--bootstrap: expected host:port"),
    (["--pull", "tcp://127.0.0.1:1", "--max-ahead", "inf"], "--max-ahead: must be a finite number"),
])
def test_bridge_options_are_checked_before_kafka(args, message):
    result = _run("bridge", "--bootstrap", "127.0.0.1:1", *args)
    assert result.exit_code == 2
    assert message in _one_error_line(result)


def test_bridge_stops_in_one_line_on_a_topic_with_another_partition_count(monkeypatch):
    """As the worker does: e.g. a decision topic auto-created with the broker's default count."""
    from fleetplan.streams import topics

    async def mismatch(bootstrap, specs, *, replication=None):
        raise topics.TopicMismatch(
            "topic fleetplan.decisions.v1 has 3 partitions, this installation uses 8; deployments would "
            "move partitions (use another --topic-prefix, or recreate the topics)")

    monkeypatch.setattr(topics, "ensure_topics", mismatch)
    result = _run("bridge", "--bootstrap", "127.0.0.1:1", "--pull", f"tcp://127.0.0.1:{_closed_port()}")
    assert result.exit_code == 2
    assert _one_error_line(result).endswith(
        "topic fleetplan.decisions.v1 has 3 partitions, this installation uses 8; deployments would "
        "move partitions (use another --topic-prefix, or recreate the topics)")


def test_audit_opens_its_seed_output_before_auditing(tmp_path, config):
    log = tmp_path / "events.jsonl"
    write_log(log)
    result = _run("audit", "--deployment", "alpha", "--log", log, "--config", config,
                  "--seed-out", tmp_path / "no" / "dir" / "seed.jsonl")
    assert result.exit_code == 2 and result.stdout == ""  # nothing audited first
    assert "--seed-out: cannot write" in _one_error_line(result)


def test_worker_state_directory_is_checked(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = _run("worker", "--bootstrap", "127.0.0.1:1", "--datadir", blocker)
    assert result.exit_code == 2
    assert f"--datadir: cannot write {blocker} (a file, not a directory)" in _one_error_line(result)


def test_the_kafka_message_prefers_the_reason_aiokafka_logged():
    from aiokafka.errors import KafkaConnectionError

    err = KafkaConnectionError("Unable to bootstrap from [('h', 1, <AddressFamily.AF_INET: 2>)]")
    logged = "Unable connect to \"h:1\": [Errno 111] Connect call failed ('h', 1)"
    assert kafka_unreachable("h:1", err, logged) == (
        "--bootstrap h:1: cannot reach Kafka ([Errno 111] Connect call failed ('h', 1))")
    assert kafka_unreachable("h:1", err).startswith("--bootstrap h:1: cannot reach Kafka (Unable to bootstrap")


def test_audit_reads_the_bootstrap_from_the_environment_as_worker_and_bridge_do(monkeypatch):
    monkeypatch.setenv("FLEETPLAN_KAFKA_BOOTSTRAP", f"127.0.0.1:{_closed_port()}")
    result = _run("audit", "--deployment", "alpha")
    assert result.exit_code == 2
    assert ": cannot reach Kafka (" in _one_error_line(result)  # not "give exactly one of ..."
    monkeypatch.delenv("FLEETPLAN_KAFKA_BOOTSTRAP")
    assert "give exactly one of --bootstrap" in _one_error_line(_run("audit", "--deployment", "alpha"))



def test_the_worker_snapshots_each_hour_by_default():
    """``audit --since`` finds a snapshot within the hour before any time the ticks topic keeps."""
    import inspect

    from fleetplan.streams.app import WorkerSettings
    from fleetplan.streams.cli import worker
    from fleetplan.streams.router import SNAPSHOT_EVERY_SECONDS

    default = inspect.signature(worker).parameters["snapshot_every"].default
    assert default == WorkerSettings().snapshot_every_s == SNAPSHOT_EVERY_SECONDS == 3600


@pytest.mark.kafka
@pytest.mark.parametrize("command", ["worker", "bridge"])
def test_a_replication_factor_the_cluster_cannot_hold_is_named(tmp_path, kafka_bootstrap, command):
    """The broker refuses the topics; until 2026-12-05 that ended in a RuntimeError traceback, exit 1."""
    import uuid

    prefix = f"t{uuid.uuid4().hex[:8]}."
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--partitions", "1", "--replication", "99"]
    if command == "worker":
        result = _run("worker", *common, "--store", "memory://", "--datadir", tmp_path / "state",
                      "--app-id", f"{prefix}worker")
    else:
        result = _run("bridge", *common, "--pull", f"tcp://127.0.0.1:{_closed_port()}")
    assert result.exit_code == 2
    assert "--replication 99: cannot create topic " in _one_error_line(result)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:{held}", "ipc:///nonexistent/dir/bridge.sock"])
def test_bridge_names_an_endpoint_it_cannot_bind_before_kafka(endpoint):
    """A port in use or a socket path without its directory: until 2026-12-05 a ZMQError traceback,
    exit 1, after the topics were created."""
    with _held_port() as held:
        address = endpoint.format(held=held.getsockname()[1])
        result = _run("bridge", "--bootstrap", f"127.0.0.1:{_closed_port()}", "--pull", address)
    assert result.exit_code == 2
    assert f"--pull: cannot bind {address} (" in _one_error_line(result)


@pytest.mark.kafka
@pytest.mark.parametrize("seconds", ["2", "4000"])
def test_a_session_timeout_the_brokers_refuse_stops_the_worker_at_start(tmp_path, kafka_bootstrap, seconds):
    """Under group.min.session.timeout.ms (6 s by default) or over the max (30 min): the worker's
    Faust consumer logged InvalidSessionTimeoutError at the join and retried for good, a worker
    hung without a word of why (until 2026-12-05); it now stops before anything starts."""
    import uuid

    prefix = f"t{uuid.uuid4().hex[:8]}."
    result = _run("worker", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--partitions", "1",
                  "--store", "memory://", "--datadir", tmp_path / "state", "--app-id", f"{prefix}worker",
                  "--session-timeout", seconds, "--heartbeat", "0.5")
    assert result.exit_code == 2
    assert _one_error_line(result) == (f"fleetplan: error: --session-timeout: the brokers take 6 to 1800 s "
                                       f"(group.min/max.session.timeout.ms), got {seconds}")
