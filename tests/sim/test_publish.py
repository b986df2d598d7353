"""`fleetplan simulate --publish --realtime`: the demo fleet's events on a ZMQ socket.

The bridge side is a PULL socket in the test; the run into a real bridge and
Kafka is in tests/streams/test_stream_bridge.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import msgpack
import orjson
import pytest
import zmq

from fleetplan.schemas.codec import decode_dict, decode_event
from fleetplan.sim.cli import rewrite_args
from fleetplan.sim.publish import PublishTarget
from fleetplan.sim.realtime import RealtimePacer
from tests.sim.sim_helpers import CONV, ROOT

FLEETPLAN = str(ROOT / ".venv" / "bin" / "fleetplan")
QUICKSTART = ROOT / "examples" / "configs" / "quickstart.yaml"


@pytest.mark.parametrize("spec,expected", [
    ("tcp://bridge:5557", ("push", "tcp://bridge:5557", False)),
    ("push:connect:tcp://bridge:5557", ("push", "tcp://bridge:5557", False)),
    ("pub:tcp://bridge:5556", ("pub", "tcp://bridge:5556", False)),
    ("pub:bind:tcp://*:5556", ("pub", "tcp://*:5556", True)),
    ("bind:ipc:///tmp/fleet.sock", ("push", "ipc:///tmp/fleet.sock", True)),
])
def test_publish_targets(spec, expected):
    t = PublishTarget.parse(spec)
    assert (t.kind, t.address, t.bind) == expected


@pytest.mark.parametrize("spec", ["bridge:5557", "dealer:tcp://bridge:5557", ""])
def test_bad_publish_targets(spec):
    with pytest.raises(ValueError, match="--publish"):
        PublishTarget.parse(spec)


def test_bare_realtime_means_speed_one():
    assert rewrite_args(["simulate", "--realtime", "--json"]) == ["simulate", "--realtime=1", "--json"]
    assert rewrite_args(["simulate", "--json", "--realtime"]) == ["simulate", "--json", "--realtime=1"]
    assert rewrite_args(["simulate", "--realtime", "4"]) == ["simulate", "--realtime", "4"]
    assert rewrite_args(["plan", "--realtime"]) == ["plan", "--realtime"]


def test_pacer_holds_virtual_time_to_the_wall_clock():
    now = [100.0]
    slept: list[float] = []
    flushes: list[float] = []

    def sleep(s: float) -> None:
        slept.append(round(s, 6))
        now[0] += s

    pacer = RealtimePacer(4.0, before_wait=lambda: flushes.append(now[0]), sleep=sleep,
                          monotonic=lambda: now[0])
    pacer.start()
    pacer(0.0)       # due now: no sleep, no flush
    pacer(2.0)       # 2 virtual s at 4x = 0.5 s of wall time
    pacer(2.001)     # 0.25 ms later: not worth a sleep
    now[0] += 3.0    # the simulation fell behind (e.g. backpressure) ...
    pacer(8.0)       # ... so it runs on without sleeping until it catches up
    pacer(20.0)
    assert slept == [0.5, 1.5]
    assert flushes == [100.0, 103.5]  # flushed right before each sleep


def pull_socket() -> tuple[zmq.Socket, str]:
    sock = zmq.Context.instance().socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def receive_all(sock: zmq.Socket, idle_s: float, into: list) -> None:
    """(arrival wall time, message) until the socket is quiet for ``idle_s`` after the first."""
    while sock.poll(int(idle_s * 1000) if into else 60_000):
        into.append((time.time(), sock.recv()))


def test_simulate_publishes_valid_events_paced_to_the_wall_clock(tmp_path):
    sock, address = pull_socket()
    got: list[tuple[float, bytes]] = []
    reader = threading.Thread(target=receive_all, args=(sock, 5.0, got), daemon=True)
    reader.start()
    started = time.time()
    run = subprocess.run(
        [FLEETPLAN, "simulate", "--trace", str(CONV), "--config", str(QUICKSTART), "--duration", "40",
         "--deployment", "demo-fleet", "--publish", address, "--realtime", "20", "--json",
         "--out", str(tmp_path)],
        capture_output=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert run.returncode == 0, run.stderr.decode()
    reader.join(30)
    sock.close()
    assert set(orjson.loads(run.stdout)["results"]) == {"planner"}  # live: no baselines by default

    events = []
    for _, message in got:
        payload = msgpack.unpackb(message)
        assert isinstance(payload, list) and payload
        events.extend(decode_dict(item) for item in payload)  # the bridge's validation
    assert {e.type for e in events} == {"fpm", "arrival", "request"}
    assert {e.deployment for e in events} == {"demo-fleet"}
    assert f"published {len(events):,} events in {len(got):,} messages".encode() in run.stderr

    # Exactly the run's own FPMs, arrivals and requests, in order, shifted from virtual time to epoch time.
    logged = [decode_event(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]
    logged = [e for e in logged if e.type in ("fpm", "arrival", "request")]
    assert len(events) == len(logged) > 100
    epoch = events[0].time - logged[0].time
    assert started < epoch < started + 30
    for pub, log in zip(events, logged, strict=True):
        assert pub.time == pytest.approx(log.time + epoch, abs=1e-6)
        unshifted = {"time": log.time}
        if pub.type == "request":
            assert pub.request_received_ms == pytest.approx(log.request_received_ms + epoch * 1000)
            unshifted["request_received_ms"] = log.request_received_ms
        assert pub.model_copy(update=unshifted) == log

    # Paced: 40 s of trace at 20x took about 2 s of wall time, and events left as they happened.
    span = got[-1][0] - got[0][0]
    assert 1.4 < span < 10, span
    for arrived, message in got:
        latest = max(item["time"] for item in msgpack.unpackb(message))
        assert arrived >= epoch + (latest - epoch) / 20 - 0.05


def test_the_tail_reaches_a_bridge_that_binds_after_the_run(tmp_path):
    # "the socket lingers up to 10 s to deliver the tail": the process waits for it. Until
    # 2026-12-05 it exited at once, its queued messages lost, and still printed "published N events"
    sock, address = pull_socket()
    sock.close(linger=0)  # a free port, with nothing on it until the run is over
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetplan", "simulate", "--trace", str(CONV), "--duration", "60",
         "--no-baselines", "--json", "--publish", address],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.time() + 5  # the 60-s slice runs in about 2 s: it is over, its tail queued
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    late = zmq.Context.instance().socket(zmq.PULL)
    late.bind(address)
    got: list[tuple[float, bytes]] = []
    while late.poll(3_000 if got else 12_000):  # the linger is 10 s
        got.append((time.time(), late.recv()))
    late.close()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    events = sum(len(msgpack.unpackb(message)) for _, message in got)
    assert events > 100
    assert f"published {events:,} events in {len(got):,} messages".encode() in err


def test_a_run_no_bridge_ever_reads_says_so_and_fails():
    # a PUSH queues for a peer that may never come: the run waited its linger and then printed
    # "published N events" with exit 0 although nothing was delivered (until 2026-12-05)
    sock, address = pull_socket()
    sock.close(linger=0)  # a free port that nothing binds
    run = subprocess.run(
        [sys.executable, "-m", "fleetplan", "simulate", "--trace", str(CONV), "--duration", "20",
         "--no-baselines", "--json", "--publish", address],
        cwd=ROOT, capture_output=True, timeout=60,
    )
    assert run.returncode == 1
    err = run.stderr.decode().strip().splitlines()[-1]
    assert err.startswith(f"fleetplan: error: --publish: no bridge connected to {address} during the run "
                          "or 10 s after it: its ")
    assert err.endswith(" events were not delivered")
