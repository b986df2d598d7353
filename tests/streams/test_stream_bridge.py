"""The bridge against the real broker: ZMQ -> bridge -> Kafka -> worker -> decision,
bad input at the ZMQ edge, a broker restart under load, and the simulator publishing
into it as the demo fleet. The loop on through the connector and back is in
test_stream_loop.py.

The broker-restart test stops and starts the shared broker through
scripts/services/kafka.sh (``FLEETPLAN_KAFKA_SCRIPT`` points it at another
copy, e.g. a private broker while developing) and always leaves it running.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import msgpack
import orjson
import pytest
import zmq

from fleetplan.schemas.codec import decode_event, encode_event, event_to_dict
from fleetplan.sim.publish import PUBLISHED_TYPES
from fleetplan.streams.audit import audit_kafka
from tests.streams.helpers import decisions_of, expected_decisions, run_async, wait_for
from tests.streams.traffic import FLEETPLAN, ROOT, T0, deciding_planner, fpm, request, traffic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

KAFKA_SCRIPT = os.environ.get("FLEETPLAN_KAFKA_SCRIPT", str(ROOT / "scripts" / "services" / "kafka.sh"))


def pusher(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(address)
    return sock


def fpms_of(records) -> list:
    out = []
    for r in records:
        event = decode_event(r.value)
        if event.type == "fpm_batch":
            out.extend(event.fpms)
        elif event.type == "fpm":
            out.append(event)
    return out


def test_zmq_to_decision_end_to_end_with_bad_input_at_the_edge(namespace, worker_factory, bridge_factory):
    worker = worker_factory().start()
    bridge = bridge_factory().start()
    fa, ra = traffic("alpha", 60)
    fb, rb = traffic("beta", 60)

    push = pusher(bridge.pull)
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.connect(bridge.sub)
    time.sleep(0.5)  # ZMQ slow joiner: the SUB side must see the PUB before messages count
    try:
        # alpha: FPMs one JSON event per message, requests as msgpack arrays; beta over PUB/SUB.
        pending_req = list(ra)
        for e in fa:
            push.send_multipart([encode_event(e)])
            due = [r for r in pending_req if r.time <= e.time]
            if due:
                push.send_multipart([b"requests", msgpack.packb([event_to_dict(r) for r in due])])
                pending_req = pending_req[len(due):]
        for e in sorted(fb + rb, key=lambda e: e.time):
            pub.send_multipart([b"fleetplan", encode_event(e)])
        push.send_multipart([b"\x00garbage"])
        push.send_multipart([orjson.dumps({**event_to_dict(fpm("alpha", T0, 1)), "role": "tpu"})])
        push.send_multipart([b'{"type": "fpm", "deployment": "alpha", "pad": "' + b"x" * (1 << 20) + b'"}'])
        push.send_multipart([encode_event(request("alpha", T0 + 59, 10_000)).replace(b'"request"', b'"ack"')])
    finally:
        push.close()
        pub.close(linger=2000)

    want_a = [d for d in expected_decisions("alpha", fa, ra) if d["time"] <= T0 + 55]
    wait_for(lambda: len(decisions_of(namespace, "alpha")) >= len(want_a), 60, "alpha's decisions")
    assert decisions_of(namespace, "alpha")[:len(want_a)] == want_a
    want_b = [d for d in expected_decisions("beta", fb, rb) if d["time"] <= T0 + 55]
    wait_for(lambda: len(decisions_of(namespace, "beta")) >= len(want_b), 30, "beta's decisions")
    assert decisions_of(namespace, "beta")[:len(want_b)] == want_b

    letters = [orjson.loads(r.value) for r in run_async(namespace.read(namespace.topics.deadletter))]
    assert sorted(d["reason"] for d in letters) == ["invalid", "invalid", "invalid", "oversize"]
    assert all(d["source_topic"].startswith("zmq:pull:") for d in letters)
    assert bridge.alive() and worker.alive()

    # The bridge packed FPMs into batches and heartbeats the now idle deployments.
    fpm_records = run_async(namespace.read(namespace.topics.fpm))
    assert len(fpms_of(fpm_records)) == len(fa) + len(fb)
    assert len(fpm_records) < len(fa) + len(fb)
    wait_for(lambda: any(b'"clock"' in r.value for r in run_async(namespace.read(namespace.topics.requests))),
             10, "a clock heartbeat")

    for deployment in ("alpha", "beta"):
        result = audit_kafka(namespace.bootstrap, deployment, planner=deciding_planner(),
                             topic_prefix=namespace.prefix, partitions=namespace.partitions)
        assert result.ok, result.lines()


def restart_broker(down_s: float) -> None:
    """Stop the broker, wait, start it again; it is running when this returns (or raises)."""
    try:
        subprocess.run(["bash", KAFKA_SCRIPT, "stop"], check=True, timeout=60, capture_output=True)
        time.sleep(down_s)
    finally:
        subprocess.run(["bash", KAFKA_SCRIPT, "start"], check=True, timeout=180, capture_output=True)


def test_broker_restart_under_load_loses_no_accepted_event(namespace, bridge_factory):
    bridge = bridge_factory(extra=["--heartbeat", "0"]).start()
    fpms = [fpm("alpha", T0 + i * 0.01, i) for i in range(4000)]
    reqs = [request("alpha", T0 + i * 0.04, i) for i in range(1000)]
    pushed = threading.Event()

    def push_all() -> None:  # ~8 s of steady load
        sock = pusher(bridge.pull)
        try:
            for i, e in enumerate(fpms):
                sock.send_multipart([encode_event(e)])
                if i % 4 == 0:
                    sock.send_multipart([encode_event(reqs[i // 4])])
                if i % 50 == 0:
                    time.sleep(0.1)
        finally:
            sock.close()
            pushed.set()

    loader = threading.Thread(target=push_all, daemon=True)
    loader.start()
    time.sleep(2.0)
    assert not pushed.is_set()  # the broker goes down under load
    restart_broker(down_s=3.0)
    assert pushed.wait(120)
    assert bridge.alive(), bridge.log()

    def delivered() -> tuple[int, int]:
        got_fpms = {(f.worker_id, f.counter_id) for f in fpms_of(run_async(namespace.read(namespace.topics.fpm)))}
        got_reqs = {decode_event(r.value).request_id for r in run_async(namespace.read(namespace.topics.requests))}
        return len(got_fpms), len(got_reqs)

    wait_for(lambda: delivered() == (len(fpms), len(reqs)), 90, "every accepted event on its topic")
    assert bridge.alive()


def test_simulated_fleet_publishes_into_the_bridge(namespace, bridge_factory, tmp_path):
    """The compose demo fleet in small: ``fleetplan simulate --publish --realtime`` into a
    real bridge; every event it sent is accepted and lands on its topic, nothing is
    dead-lettered."""
    bridge = bridge_factory(extra=["--heartbeat", "0"]).start()
    run = subprocess.run(
        [FLEETPLAN, "simulate", "--trace", str(ROOT / "examples" / "traces" / "azure_conv_10min.csv"),
         "--config", str(ROOT / "examples" / "configs" / "quickstart.yaml"), "--duration", "30",
         "--deployment", "demo", "--publish", bridge.pull, "--realtime", "30", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    logged = [decode_event(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]
    sent = [e for e in logged if e.type in PUBLISHED_TYPES]
    want_fpms = {(e.worker_id, e.counter_id) for e in sent if e.type == "fpm"}
    want_others = sorted((e.type, e.request_id) for e in sent if e.type != "fpm")
    assert want_fpms and want_others

    def delivered():
        fpms = fpms_of(run_async(namespace.read(namespace.topics.fpm)))
        others = [decode_event(r.value) for r in run_async(namespace.read(namespace.topics.requests))]
        return fpms, others

    wait_for(lambda: len(delivered()[0]) >= len(want_fpms), 30, "the fleet's FPMs on the topic")
    fpms, others = delivered()
    assert {(f.worker_id, f.counter_id) for f in fpms} == want_fpms
    assert {f.deployment for f in fpms} == {"demo"}
    assert sorted((e.type, e.request_id) for e in others) == want_others
    assert run_async(namespace.read(namespace.topics.deadletter)) == []
    assert bridge.alive()
