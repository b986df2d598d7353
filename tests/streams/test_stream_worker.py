"""``fleetplan worker`` against the real broker: decisions, bad input, metrics, kill -9.

The worker runs as a subprocess (so it can be SIGKILLed); inputs are produced
with aiokafka as the bridge would produce them (keyed by deployment).
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request

import orjson
import pytest
import yaml

from fleetplan.schemas.codec import MAX_EVENT_BYTES, decode_event, encode_event
from fleetplan.streams.audit import audit_kafka
from tests.streams.helpers import decisions_of, expected_decisions, free_port, run_async, wait_for
from tests.streams.traffic import FLEETPLAN, T0, deciding_planner, fpm, traffic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def tick_trail(ns, last: int = 30) -> str:
    """The last ticks as time@clock:decision_id, to explain a failure."""
    diags = [orjson.loads(r.value) for r in run_async(ns.read(ns.topics.ticks))]
    ticks = [d for d in diags if d.get("type") != "snapshot"]  # the hourly state snapshots
    return " ".join(f"{d['time']}@{d['clock']}:{d['decision_id']}" for d in ticks[-last:])


def produce(ns, fpms, requests, extra=None) -> None:
    run_async(ns.produce(ns.topics.fpm, fpms))
    run_async(ns.produce(ns.topics.requests, requests))


def test_worker_decides_dead_letters_bad_input_and_serves_metrics(namespace, worker_factory):
    port = free_port()
    worker = worker_factory(metrics_port=port).start()
    fa, ra = traffic("alpha", 60, batch=8)
    fb, rb = traffic("beta", 60)
    produce(namespace, fa + fb, ra + rb)
    want_a = [d for d in expected_decisions("alpha", fa, ra) if d["time"] <= T0 + 55]
    wait_for(lambda: len(decisions_of(namespace, "alpha")) >= len(want_a), 60, "alpha's decisions")
    got_a = decisions_of(namespace, "alpha")
    assert got_a[:len(want_a)] == want_a
    beta = decisions_of(namespace, "beta")
    assert [d["decision_id"] for d in beta] == list(range(len(beta)))

    # Bad input next to good input: dead-lettered with a reason; the worker keeps deciding.
    late = fpm("alpha", T0 + 2.0, 10_000)
    run_async(namespace.produce(namespace.topics.fpm, [late], raw=[
        (b"alpha", b"\x00\x01 not json"),
        (b"alpha", b'{"type": "fpm", "deployment": "alpha", "time": "soon"}'),
        (b"alpha", b"{" + b" " * MAX_EVENT_BYTES + b"}"),
        (b"gamma", encode_event(fpm("alpha", T0 + 70, 1))),
    ]))
    fa2, ra2 = traffic("alpha", 30, start=T0 + 60, batch=8)
    produce(namespace, fa2, ra2)

    def letters():
        return [orjson.loads(r.value) for r in run_async(namespace.read(namespace.topics.deadletter))]

    found = wait_for(lambda: (ls := letters()) and len(ls) >= 5 and ls, 30, "five dead letters")
    reasons = sorted(d["reason"] for d in found)
    assert reasons == ["invalid", "invalid", "invalid", "late", "oversize"]
    late_letter = next(d for d in found if d["reason"] == "late")
    assert decode_event(late_letter["payload"].encode()) == late
    assert all(d["detail"] for d in found)
    assert worker.alive()
    want_all = [d for d in expected_decisions("alpha", fa + fa2, ra + ra2) if d["time"] <= T0 + 85]
    wait_for(lambda: len(decisions_of(namespace, "alpha")) >= len(want_all), 30, "decisions after bad input")

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for name in ("fleetplan_replica_target{", "fleetplan_load_reason{", "fleetplan_engine_queue_depth{",
                 "fleetplan_decision_latency_seconds_bucket", "fleetplan_consumer_lag{",
                 "fleetplan_late_events_total{", "fleetplan_deadletters_total{", "fleetplan_estimated_ttft_ms",
                 "fleetplan_traffic_mirror_checks_total"):
        assert name in body, name
    assert 'fleetplan_deadletters_total{reason="invalid"} 3.0' in body
    assert 'fleetplan_traffic_mirror_mismatches_total{' not in body

    result = audit_kafka(namespace.bootstrap, "alpha", planner=deciding_planner(),
                         topic_prefix=namespace.prefix, partitions=namespace.partitions)
    assert result.ok, result.lines()
    assert result.excluded_late == 1 and len(result.reproduced) >= len(want_all)


def test_kill_9_mid_stream_resumes_without_gap_or_repeat(namespace, worker_factory, config_file, tmp_path):
    """SIGKILL the worker while it is deciding, restart it: state comes back from the
    changelog, decision ids continue with no gap or repeat, and the audit passes (and
    draws the recorded run as the simulator's report)."""
    fpms, reqs = traffic("alpha", 240, batch=4)
    worker = worker_factory(extra=["--snapshot-every", "60"]).start()  # a snapshot each minute
    stop = threading.Event()

    def feed() -> None:  # a steady stream: 240 s of event time over ~12 s of wall time
        for w in range(0, 240, 5):
            if stop.is_set():
                return
            lo, hi = T0 + w, T0 + w + 5
            produce(namespace, [e for e in fpms if lo <= e.time < hi], [e for e in reqs if lo <= e.time < hi])
            time.sleep(0.25)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    wait_for(lambda: len(decisions_of(namespace, "alpha")) >= 6, 60, "the first decisions")
    worker.kill()
    killed_at = len(decisions_of(namespace, "alpha"))
    time.sleep(1.0)  # the stream goes on while the worker is down
    worker.start()
    feeder.join(60)
    stop.set()

    want = [d for d in expected_decisions("alpha", fpms, reqs) if d["time"] <= T0 + 230]
    try:
        wait_for(lambda: len(decisions_of(namespace, "alpha")) >= len(want), 90, "all decisions after restart")
    except AssertionError as err:
        raise AssertionError(f"{err}; ticks: {tick_trail(namespace)}") from None
    got = decisions_of(namespace, "alpha")
    assert len(got) > killed_at
    assert [d["decision_id"] for d in got] == list(range(len(got))), "gap or repeat"
    assert got[:len(want)] == want, tick_trail(namespace)
    assert "owning partitions" in worker.log()

    result = audit_kafka(namespace.bootstrap, "alpha", planner=deciding_planner(),
                         topic_prefix=namespace.prefix, partitions=namespace.partitions)
    assert result.ok, result.lines()
    assert len(result.reproduced) == len(got)
    run = subprocess.run([FLEETPLAN, "audit", "--deployment", "alpha", "--bootstrap", namespace.bootstrap,
                          "--topic-prefix", namespace.prefix, "--config", str(config_file),
                          "--report", str(tmp_path / "report")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and f"OK: {len(got)} decision(s) reproduced" in run.stdout, run.stdout + run.stderr
    html = (tmp_path / "report" / "report.html").read_bytes()
    assert b"plotly" in html[:4_000_000] and b"fleetplan audit: alpha" in html

    # from a snapshot the worker wrote (through the kill, some twice): every decision after its tick
    since = audit_kafka(namespace.bootstrap, "alpha", planner=deciding_planner(), topic_prefix=namespace.prefix,
                        partitions=namespace.partitions, since=T0 + 100)
    assert since.ok, since.lines()
    # the last tick of the first batch whose ticks crossed a multiple of 60 after T0 + 100 (T0 + 140
    # when the worker keeps up, later when a batch fires several ticks, as after the restart)
    tick = float(since.source.rsplit(" ", 1)[1])
    assert T0 + 100 <= tick < T0 + 200
    assert since.reproduced == [d["decision_id"] for d in got if d["time"] > tick] != []


def test_windowed_traffic_table_mirrors_the_cores_window(namespace, worker_factory, tmp_path):
    """The Faust tumbling windowed table of request aggregates is a checked mirror of the
    window the core folds (DeploymentState.window): at each throughput tick both agree."""
    config = tmp_path / "throughput.yaml"
    config.write_text(yaml.safe_dump({
        "mode": "agg", "throughput_adjustment_interval_seconds": 10, "load_adjustment_interval_seconds": 5,
        "load_predictor": "constant", "grace_seconds": 1,
    }))
    port = free_port()
    worker_factory(config=config, metrics_port=port).start()
    fpms, reqs = traffic("alpha", 60)
    produce(namespace, fpms, reqs)

    def checked() -> list[dict]:
        diags = [orjson.loads(r.value) for r in run_async(namespace.read(namespace.topics.ticks))]
        return [d["traffic_mirror"] for d in diags if "traffic_mirror" in d]

    mirrors = wait_for(lambda: (c := checked()) and len(c) >= 3 and c, 40, "three mirrored windows")
    assert all(m["mismatch"] is None and m["count"] > 0 for m in mirrors), mirrors
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'fleetplan_traffic_mirror_checks_total{deployment="alpha"}' in body
    assert "fleetplan_traffic_mirror_mismatches_total{" not in body
    # a checked window is deleted by event time, not by Faust's wall-clock expiry, which deleted
    # the windows of a deployment running behind the wall clock while they filled (these are
    # dated 1970): its changelog ends each checked window with a tombstone
    from fleetplan.streams.topics import TRAFFIC_TABLE, changelog_name

    last: dict[bytes, bytes | None] = {}
    for record in run_async(namespace.read(changelog_name(namespace.app_id, TRAFFIC_TABLE))):
        last[record.key] = record.value
    checked_starts = {m["window_start"] for m in mirrors}
    closed = {float(orjson.loads(k)[1][0]) for k, v in last.items() if v is None}
    assert checked_starts <= closed, (sorted(checked_starts), sorted(closed))


def test_two_workers_share_the_partitions_and_a_rebalance_loses_nothing(namespace, worker_factory):
    """Scale-out by partition: a second worker joins mid-stream and takes a partition
    over (its state comes from the changelog); every deployment's decisions continue."""
    deployments = ["alpha", "epsilon"]  # partitions 0 and 1 of 2
    inputs = {d: traffic(d, 150, batch=4) for d in deployments}
    first = worker_factory(instance="w1").start()

    def feed(lo: float, hi: float) -> None:
        for w in range(int(lo), int(hi), 10):
            f = [e for d in deployments for e in inputs[d][0] if T0 + w <= e.time < T0 + w + 10]
            r = [e for d in deployments for e in inputs[d][1] if T0 + w <= e.time < T0 + w + 10]
            produce(namespace, f, r)
            time.sleep(0.2)

    feed(0, 60)
    wait_for(lambda: all(decisions_of(namespace, d) for d in deployments), 40, "decisions from one worker")
    second = worker_factory(instance="w2").start()
    feed(60, 90)  # the rebalance happens while the stream goes on
    wait_for(lambda: "owning partitions [" in second.log() and "revoked partitions" in first.log(), 60,
             "the second worker to take a partition")
    feed(90, 150)
    for d in deployments:
        want = [x for x in expected_decisions(d, *inputs[d]) if x["time"] <= T0 + 140]
        wait_for(lambda d=d, want=want: len(decisions_of(namespace, d)) >= len(want), 60, f"{d}'s decisions")
        got = decisions_of(namespace, d)
        assert [x["decision_id"] for x in got] == list(range(len(got))), f"gap or repeat for {d}"
        assert got[:len(want)] == want
        result = audit_kafka(namespace.bootstrap, d, planner=deciding_planner(),
                             topic_prefix=namespace.prefix, partitions=namespace.partitions)
        assert result.ok, result.lines()
    logs = first.log() + second.log()
    assert "revoked partitions" in first.log()
    assert "owning partitions [0]" in logs and "owning partitions [1]" in logs


def test_a_seed_on_the_control_topic_starts_the_workers_forecaster(namespace, worker_factory, tmp_path):
    """A seed_traffic control produced to the control topic warms the live worker's
    forecaster at its tick, exactly as the audit's refold of the same events does."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.planner import Planner
    from fleetplan.schemas.events import ControlEvent, SeedTraffic, SeedWindow
    from fleetplan.streams.audit import refold_by_event_time

    settings = {"mode": "agg", "throughput_adjustment_interval_seconds": 10, "load_adjustment_interval_seconds": 5,
                "load_predictor": "kalman", "grace_seconds": 1}
    config = tmp_path / "seeded.yaml"
    config.write_text(yaml.safe_dump(settings))
    worker_factory(config=config).start()
    # an hour of 10 s windows rising from 20 to 80 requests, ending where the traffic starts
    windows = [SeedWindow(start_s=T0 - 10.0 * (360 - k), duration_s=10.0, num_req=20 + k / 6, isl=100.0, osl=50.0,
                          peak=24 + k / 6) for k in range(360)]
    seed = ControlEvent(deployment="alpha", time=T0, issued_by="test", body=SeedTraffic(windows=windows))
    run_async(namespace.produce(namespace.topics.control, [seed]))
    fpms, reqs = traffic("alpha", 60)
    produce(namespace, fpms, reqs)

    def forecasts() -> list[dict]:
        diags = [orjson.loads(r.value) for r in run_async(namespace.read(namespace.topics.ticks))]
        return [d for d in diags if d["deployment"] == "alpha" and d.get("predicted") is not None]

    live = wait_for(lambda: (f := forecasts()) and len(f) >= 4 and f, 60, "four throughput ticks")
    assert all(d["rejected_controls"] == 0 for d in live)
    refold = [r for r in refold_by_event_time(Planner(config_from_dict(settings)), "alpha", [seed, *fpms, *reqs])
              if r.predicted is not None]
    cold = [r for r in refold_by_event_time(Planner(config_from_dict(settings)), "alpha", [*fpms, *reqs])
            if r.predicted is not None]
    assert [(d["time"], d["predicted"]["num_req"]) for d in live[:4]] == \
        [(r.time, r.predicted.num_req) for r in refold[:4]]
    # the trend of the hour before is in the forecast: the cold worker's is the traffic's own count
    assert refold[0].predicted.num_req != cold[0].predicted.num_req
    # the audit of the topics re-folds the seed too, and hands on the windows for another install
    audited = audit_kafka(namespace.bootstrap, "alpha", planner=Planner(config_from_dict(settings)),
                          topic_prefix=namespace.prefix, partitions=namespace.partitions)
    assert audited.state.traffic_history[:360] == [
        [w.start_s, w.duration_s, w.num_req, w.isl, w.osl, None, None, w.peak] for w in windows]


def test_a_decision_the_broker_refuses_stops_the_worker(namespace, worker_factory):
    """The decisions topic takes no record this large: the send fails, and the worker exits
    (to be restarted from the changelog) rather than settle the offsets the decision came from
    and carry on without it."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def shrink_decisions_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=namespace.bootstrap)
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(
                ConfigResourceType.TOPIC, namespace.topics.decisions, {"max.message.bytes": "200"})])
        finally:
            await admin.close()

    run_async(shrink_decisions_topic())
    worker = worker_factory().start()
    fa, ra = traffic("alpha", 60, batch=8)
    produce(namespace, fa, ra)
    wait_for(lambda: not worker.alive(), 90, "the worker to stop on the refused decision")
    assert worker.proc.returncode != 0, worker.log()
    assert decisions_of(namespace, "alpha") == []
    assert "not acknowledged" in worker.log() or "MessageSizeTooLarge" in worker.log() or "TooLarge" in worker.log()


def test_inputs_back_after_a_pause_longer_than_idle_after_are_not_late(namespace, worker_factory):
    """Every input of a deployment pauses longer than ``--idle-after`` (3 s here; a broker or
    bridge outage), then its backlog comes back, the FPMs first. The request records were as
    silent as the FPMs, not down, so none is dead-lettered late: until 2026-12-05 the FPMs
    alone moved the clock past them and every one was."""
    worker = worker_factory().start()
    fpms, reqs = traffic("alpha", 60, batch=4)
    produce(namespace, [e for e in fpms if e.time < T0 + 15], [e for e in reqs if e.time < T0 + 15])
    wait_for(lambda: decisions_of(namespace, "alpha"), 60, "the first decision")
    time.sleep(5.0)
    run_async(namespace.produce(namespace.topics.fpm, [e for e in fpms if e.time >= T0 + 15]))
    time.sleep(1.0)
    run_async(namespace.produce(namespace.topics.requests, [e for e in reqs if e.time >= T0 + 15]))
    want = [d for d in expected_decisions("alpha", fpms, reqs) if d["time"] <= T0 + 55]
    wait_for(lambda: len(decisions_of(namespace, "alpha")) >= len(want), 60, "the decisions after the pause")
    letters = [orjson.loads(r.value) for r in run_async(namespace.read(namespace.topics.deadletter))]
    assert [d["detail"] for d in letters] == [], worker.log()[-2000:]
    assert decisions_of(namespace, "alpha")[:len(want)] == want
