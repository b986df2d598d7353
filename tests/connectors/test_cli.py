"""``fleetplan connector`` fails fast, naming the option, before consuming anything."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fleetplan.connectors.base import ConnectorConfigError
from fleetplan.connectors.cli import parse_dgds, parse_services, register

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str):
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # keep "connector" a subcommand
    return CliRunner().invoke(app, ["connector", *args])


@pytest.mark.parametrize(("args", "field"), [
    (["--backend", "kubernetes"], "--deployment"),
    (["--backend", "kubernetes", "--deployment", "a", "--service", "gpu=X"], "--service"),
    (["--backend", "kubernetes", "--deployment", "a", "--deployment", "b", "--dgd", "x"], "--dgd"),
    (["--backend", "kubernetes", "--deployment", "a", "--ready-poll", "0"], "--ready-poll"),
    (["--backend", "kubernetes", "--deployment", "a", "--ready-timeout", "nan"], "--ready-timeout"),
    (["--backend", "kubernetes", "--deployment", "a", "--request-timeout", "inf"], "--request-timeout"),
    (["--backend", "log", "--claim-lease", "inf"], "--claim-lease"),
    (["--backend", "virtual", "--completion-timeout", "nan"], "--completion-timeout"),
    (["--backend", "kubernetes", "--deployment", "a", "--kubeconfig", "/nonexistent"], "--kubeconfig"),
    (["--backend", "virtual", "--dgd", "x"], "--dgd"),
    (["--backend", "log", "--metrics-port", "70000"], "--metrics-port"),
    (["--backend", "log", "--log-level", "bogus"], "--log-level"),
    (["--backend", "log", "--bootstrap", "host:notaport"], "--bootstrap"),
    (["--backend", "log", "--redis-url", "redis://127.0.0.1:1/0"], "--redis-url"),
    # names Kafka refuses: an empty group raised InvalidGroupIdError at the join (a traceback); a
    # decision topic that cannot exist was waited for without end, and an ack topic that cannot
    # was found only after the first decision was applied (its ack then failed ten times a second)
    (["--backend", "log", "--group-id", "", "--redis-url", "redis://127.0.0.1:1/0"], "--group-id"),
    (["--backend", "log", "--decisions-topic", "bad topic", "--redis-url", "redis://127.0.0.1:1/0"],
     "--decisions-topic"),
    (["--backend", "log", "--acks-topic", "", "--redis-url", "redis://127.0.0.1:1/0"], "--acks-topic"),
    (["--backend", "log", "--deadletter-topic", "x" * 250, "--redis-url", "redis://127.0.0.1:1/0"],
     "--deadletter-topic"),
    (["--backend", "log", "--acks-topic", "..", "--redis-url", "redis://127.0.0.1:1/0"], "--acks-topic"),
    # a duration like the others: a broker refuses it only at the group join, after Redis and Kafka
    (["--backend", "log", "--session-timeout-ms", "-5", "--redis-url", "redis://127.0.0.1:1/0"],
     "--session-timeout-ms"),
    # past a 32-bit int: aiokafka raised a KafkaError traceback at the group join
    (["--backend", "log", "--session-timeout-ms", "99999999999", "--redis-url", "redis://127.0.0.1:1/0"],
     "--session-timeout-ms"),
    # names no decision can carry: every decision was skipped and committed past (until 2026-12-05)
    (["--backend", "log", "--deployment", "", "--redis-url", "redis://127.0.0.1:1/0"], "--deployment"),
    (["--backend", "log", "--deployment", "d" * 257, "--redis-url", "redis://127.0.0.1:1/0"], "--deployment"),
])
def test_config_errors_name_the_option(args, field):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert f"fleetplan: error: {field}:" in result.output


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/x", "redis://127.0.0.1:1/-1", "redis://127.0.0.1:1/0/1"])
def test_a_redis_database_that_is_not_a_number_is_refused_before_redis_is_reached(url):
    """redis-py took database 0 for such a URL without a word (until 2026-12-05), so the ledger
    lived where the operator had not put it."""
    result = run("--backend", "log", "--redis-url", url)
    assert result.exit_code == 2, result.output
    assert f"fleetplan: error: --redis-url: {url}: the database must be a number >= 0" in result.output


def test_a_unix_socket_redis_url_is_not_read_as_a_database():
    from fleetplan.connectors.cli import redis_db_problem

    assert redis_db_problem("unix:///run/redis/redis.sock?db=2") is None
    assert redis_db_problem("redis://127.0.0.1:6379/3") is None and redis_db_problem("redis://h") is None


def test_role_and_dgd_mappings():
    assert parse_services("sglang", ["agg=Worker"]) == {"prefill": "prefill", "decode": "decode",
                                                       "agg": "Worker"}
    assert parse_dgds(["a", "b"], ["b=dgd-b"]) == {"a": "a", "b": "dgd-b"}
    assert parse_dgds(["a"], ["dgd-a"]) == {"a": "dgd-a"}


@pytest.mark.parametrize(("deployments", "dgds", "named"), [
    (["a", "b"], ["a=llama", "b=llama"], "'a', 'b' would all scale DGD 'llama'"),
    (["a", "b"], ["a=b"], "'a', 'b' would all scale DGD 'b'"),  # b keeps its own name
])
def test_two_deployments_on_one_dgd_are_refused(deployments, dgds, named):
    """Each deployment has its own planner; on one DGD each undid the other's replica counts."""
    with pytest.raises(ConnectorConfigError) as refused:
        parse_dgds(deployments, dgds)
    assert refused.value.field == "--dgd" and named in str(refused.value)


@pytest.mark.redis
@pytest.mark.kafka
async def test_a_missing_dgd_stops_the_connector_at_start(fake_k8s, tmp_path, redis_url,
                                                          kafka_bootstrap):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_k8s.kubeconfig())
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleetplan", "connector", "--backend", "kubernetes",
        "--kubeconfig", str(kubeconfig), "--deployment", "llama", "--redis-url", redis_url,
        "--bootstrap", kafka_bootstrap, "--metrics-port", "0", cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "fleetplan: error: --dgd: DynamoGraphDeployment default/llama" in out.decode()


@pytest.mark.redis
@pytest.mark.kafka
@pytest.mark.parametrize("session_timeout_ms", ["100", "3600000"])
def test_a_session_timeout_the_broker_refuses_is_named(kafka_bootstrap, redis_url, redis_key_prefix,
                                                       kafka_topic_factory, session_timeout_ms):
    """Outside the broker's group.min/max.session.timeout.ms (6 s..30 min by default): until
    2026-12-05 an InvalidSessionTimeoutError traceback, exit 1."""
    decisions = kafka_topic_factory("decisions")
    result = run("--backend", "log", "--bootstrap", kafka_bootstrap, "--redis-url", redis_url,
                 "--ledger-prefix", f"{redis_key_prefix}ledger", "--metrics-port", "0",
                 "--decisions-topic", decisions, "--group-id", decisions,
                 "--session-timeout-ms", session_timeout_ms)
    assert result.exit_code == 2, result.output
    assert "fleetplan: error: --session-timeout-ms: the broker refuses " in result.output
