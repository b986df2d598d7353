"""A connector SIGKILLed between apply and ack, then restarted: never applied twice, still acked.

The connector runs as a real ``fleetplan connector`` process. It kills itself
with SIGKILL at a named step (the FLEETPLAN_CONNECTOR_CRASH_AT hook), so the
kill lands exactly between apply and ack; the restart runs without the hook.
Applies are counted where they land: PATCH requests on the fake Kubernetes
API, desired-state writes in Redis.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetplan.connectors.client import RedisOrchestratorClient
from fleetplan.connectors.virtual import VirtualKeys
from fleetplan.connectors.worker import CRASH_ENV
from tests.connectors.conftest import make_decision, produce, read_events

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]


async def start_connector(args: list[str], crash_at: str | None, log: Path):
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetplan", "connector", *args, env=env, cwd=ROOT,
            stdout=out, stderr=subprocess.STDOUT,
        )


def common_args(kafka_bootstrap, redis_url, topics, prefix) -> list[str]:
    return [
        "--bootstrap", kafka_bootstrap, "--redis-url", redis_url,
        "--decisions-topic", topics["decisions_topic"], "--acks-topic", topics["acks_topic"],
        "--deadletter-topic", topics["deadletter_topic"],
        "--group-id", f"{prefix}group", "--instance-id", f"{prefix}connector",
        "--ledger-prefix", f"{prefix}ledger", "--metrics-port", "0",
        "--session-timeout-ms", "6000",
    ]


async def stop(proc, log: Path) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("crash_at", ["after_claim", "after_apply", "after_record", "after_ack"])
async def test_kubernetes_connector_killed_between_apply_and_ack(
        crash_at, fake_k8s, tmp_path, kafka_bootstrap, redis_url, redis_client,
        redis_key_prefix, connector_topics):
    fake_k8s.add_dgd("llama-dgd", {"Frontend": 1, "VllmPrefillWorker": 1, "VllmDecodeWorker": 1})
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_k8s.kubeconfig())
    log = tmp_path / "connector.log"
    args = common_args(kafka_bootstrap, redis_url, connector_topics, redis_key_prefix) + [
        "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--deployment", "llama",
        "--dgd", "llama-dgd", "--ready-poll", "0.05",
    ]
    acks_topic = connector_topics["acks_topic"]
    await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                  [make_decision("llama", 0, prefill=2, decode=3)])

    first = await start_connector(args, crash_at, log)
    await asyncio.wait_for(first.wait(), 60)
    assert first.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    applied_before_kill = crash_at != "after_claim"
    # prefill and decode were scaled (or nothing was, when killed right after the claim)
    assert len(fake_k8s.writes) == (2 if applied_before_kill else 0)
    acks_before = 1 if crash_at == "after_ack" else 0

    second = await start_connector(args, None, log)
    try:
        await read_events(kafka_bootstrap, acks_topic, acks_before + 1, timeout=45)
        # The restarted connector goes on with the next decision.
        await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                      [make_decision("llama", 1, prefill=2, decode=5)])
        acks = await read_events(kafka_bootstrap, acks_topic, acks_before + 2, timeout=45)
    finally:
        await stop(second, log)
    by_id: dict[int, list] = {}
    for ack in acks:
        by_id.setdefault(ack.decision_id, []).append(ack)
    text = log.read_text()
    assert [a.status for a in by_id[1]] == ["applied"], text[-3000:]
    if applied_before_kill:
        assert {a.status for a in by_id[0]} == {"applied"}, text[-3000:]
        assert by_id[0][-1].observed == {"prefill": 2, "decode": 3}
        # Decision 0 was applied once (2 patches); decision 1 changed decode only (1 patch).
        assert len(fake_k8s.writes) == 3
    else:
        # The dead run may or may not have reached the API; the spec says it did not,
        # but at most once forbids guessing: acked failed, never applied.
        (ack,) = by_id[0]
        assert ack.status == "failed" and "not applied again" in ack.error
        assert len(fake_k8s.writes) == 2  # decision 1 only: prefill 1->2, decode 1->5
    if crash_at in ("after_claim", "after_apply"):
        assert "recovering llama decision 0" in text
    assert fake_k8s.replicas("llama-dgd") == {"Frontend": 1, "VllmPrefillWorker": 2,
                                             "VllmDecodeWorker": 5}


async def test_virtual_connector_killed_between_apply_and_ack(
        tmp_path, kafka_bootstrap, redis_url, redis_client, redis_key_prefix, connector_topics,
        aredis):
    prefix = f"{redis_key_prefix}virtual"
    log = tmp_path / "connector.log"
    args = common_args(kafka_bootstrap, redis_url, connector_topics, redis_key_prefix) + [
        "--backend", "virtual", "--virtual-prefix", prefix,
    ]

    async def orchestrate() -> None:
        async with RedisOrchestratorClient(client=aredis, prefix=prefix, poll_s=0.1) as client:
            async for d in client.decisions("llama"):
                await client.complete(d, "applied")

    orchestrator = asyncio.create_task(orchestrate())
    try:
        await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                      [make_decision("llama", 0, decode=4)])
        first = await start_connector(args, "after_apply", log)
        await asyncio.wait_for(first.wait(), 60)
        assert first.returncode == -signal.SIGKILL, log.read_text()[-3000:]
        second = await start_connector(args, None, log)
        try:
            (ack,) = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1, timeout=45)
        finally:
            await stop(second, log)
    finally:
        orchestrator.cancel()
    assert (ack.decision_id, ack.status, ack.observed) == (0, "applied", {"decode": 4})
    writes = await aredis.xrange(VirtualKeys.of("llama", prefix).desired)
    assert [fields[b"decision_id"] for _, fields in writes] == [b"0"]
