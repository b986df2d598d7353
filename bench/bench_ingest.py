"""Benchmark the live runtime: FPM ingest and decision latency on the real broker.

    .venv/bin/python bench/bench_ingest.py [--bootstrap 127.0.0.1:19092] [--fpms 200000]
        [--stages ingest,latency] [--live-engines 2] [--heartbeat 1] [--batch-within 0.05] [--poll 0.05]

Stages, each on fresh topics (a unique prefix, deleted afterwards); ``--stages``
picks ``ingest`` (1-3) and/or ``latency`` (4):

1. bridge: push ``--fpms`` FPMs over ZMQ (msgpack arrays of 100 events) into a
   ``fleetplan bridge`` process; FPM/s until the bridge has every one
   acknowledged by Kafka (it packs them into FpmBatch records).
2. raw consume: read that FPM topic with a bare aiokafka consumer, bytes only,
   and again decoding every record with the schemas (pydantic), and with the
   worker's decode (``schemas/fpm_wire.py``, msgspec): the ceiling for a
   Python consumer of the same records, measured in the same run.
3. worker: ``fleetplan worker`` with 1, then 2 processes (each a new app id)
   reads the backlog; FPM/s from the first FPM routed to the last (summed over
   the processes' Prometheus endpoints).
4. decision latency: bridge and one worker live; ``--live-deployments`` x
   ``--live-engines`` engines publish FPMs at 50 Hz in real time (event time =
   wall time) with a load pattern that decides every other tick; per decision,
   its Kafka timestamp minus (tick time + grace),
   the earliest moment the watermark could pass the tick. p50/p99, beside the
   worker's own histogram (watermark passed -> decision acknowledged), and
   split by the input topics' timestamps: when the first FPM record and the
   first requests-topic record past tick + grace reached Kafka, and from the
   later of them to the decision.

Not a test: nothing asserts. Prints a markdown table and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import msgpack
import orjson
import yaml
import zmq

ROOT = Path(__file__).resolve().parents[1]
FLEETPLAN = str(ROOT / ".venv" / "bin" / "fleetplan")
CONFIG = {
    "mode": "agg", "optimization_target": "throughput", "load_adjustment_interval_seconds": 5,
    "context_length": 8192, "max_kv_tokens": 100_000, "ack_timeout_seconds": 5, "grace_seconds": 1,
    "max_gpu_budget": -1, "max_endpoint": 64,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return ""


def metric(body: str, name: str) -> float:
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def fpm(deployment: str, engine: int, counter: int, t: float, hot: bool) -> dict:
    return {
        "type": "fpm", "deployment": deployment, "time": t, "role": "agg", "worker_id": f"e{engine}",
        "counter_id": counter, "wall_time": 0.02,
        "scheduled": {"num_decode_requests": 8, "sum_decode_kv_tokens": 8000},
        "queued": {"num_prefill_requests": 3 if hot else 0, "sum_prefill_tokens": 9000 if hot else 0},
    }


class Proc:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._fh = log.open("ab")
        self.proc = subprocess.Popen(args, stdout=self._fh, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._fh.close()


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
        self.config = self.tmp / "planner.yaml"
        self.config.write_text(yaml.safe_dump(CONFIG))

    # --- processes -------------------------------------------------------------

    def bridge(self, prefix: str, port: int, pull: str) -> Proc:
        return Proc([FLEETPLAN, "bridge", "--bootstrap", self.args.bootstrap, "--pull", f"bind:{pull}",
                     "--topic-prefix", prefix, "--partitions", str(self.args.partitions), "--replication", "1",
                     "--metrics-port", str(port), "--heartbeat", str(self.args.heartbeat), "--buffer", "200000"],
                    self.tmp / f"bridge-{port}.log")

    def worker(self, prefix: str, app_id: str, port: int, n: int) -> Proc:
        return Proc([FLEETPLAN, "worker", "--bootstrap", self.args.bootstrap, "--config", str(self.config),
                     "--app-id", app_id, "--topic-prefix", prefix, "--partitions", str(self.args.partitions),
                     "--replication", "1", "--store", "memory://", "--datadir", str(self.tmp / f"{app_id}-{n}"),
                     "--session-timeout", "6", "--idle-after", "2", "--metrics-port", str(port),
                     "--instance-id", f"{app_id}-{n}", "--batch-max", str(self.args.batch_max),
                     "--batch-within", str(self.args.batch_within)],
                    self.tmp / f"worker-{app_id}-{n}.log")

    # --- stages -----------------------------------------------------------------

    def messages(self) -> list[bytes]:
        """The FPMs to push: deployments x engines at 50 iterations/s of event time."""
        a = self.args
        t0 = 1_000_000.0
        out, batch, counter = [], [], 0
        per_tick = a.deployments * a.engines
        while counter < a.fpms:
            i = counter // per_tick
            t = t0 + i * 0.02
            for d in range(a.deployments):
                for e in range(a.engines):
                    batch.append(fpm(f"d{d}", e, i, t, hot=True))
                    counter += 1
                    if len(batch) == 100:
                        out.append(msgpack.packb(batch))
                        batch = []
        if batch:
            out.append(msgpack.packb(batch))
        return out

    def stage_bridge(self, prefix: str) -> dict:
        port, pull = free_port(), f"tcp://127.0.0.1:{free_port()}"
        payloads = self.messages()
        n = sum(len(msgpack.unpackb(p)) for p in payloads)
        bridge = self.bridge(prefix, port, pull)
        try:
            wait(lambda: "fleetplan_bridge" in scrape(port), 30)
            push = zmq.Context.instance().socket(zmq.PUSH)
            push.connect(pull)
            start = time.perf_counter()
            for p in payloads:
                push.send(p)
            pushed = time.perf_counter()

            def done() -> bool:
                body = scrape(port)
                return (metric(body, 'fleetplan_bridge_events_accepted_total{type="fpm"}') >= n
                        and metric(body, "fleetplan_bridge_buffered_events") == 0)

            wait(done, 600, 0.05)
            end = time.perf_counter()
            push.close()
            body = scrape(port)
            records = metric(body, "fleetplan_bridge_records_produced_total")
        finally:
            bridge.stop()
        return {"fpms": n, "seconds": end - start, "push_seconds": pushed - start, "records": records}

    async def stage_raw(self, topic: str) -> dict:
        from aiokafka import AIOKafkaConsumer

        from fleetplan.schemas.codec import decode_event
        from fleetplan.schemas.fpm_wire import decode_input

        result = {}
        for kind, decode in (("bytes", None), ("decode", decode_event), ("fast", decode_input)):
            consumer = AIOKafkaConsumer(topic, bootstrap_servers=self.args.bootstrap, group_id=None,
                                        auto_offset_reset="earliest", enable_auto_commit=False,
                                        max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
            await consumer.start()
            try:
                parts = consumer.assignment()
                ends = await consumer.end_offsets(list(parts))
                total = sum(ends.values())
                got, fpms = 0, 0
                start = time.perf_counter()
                while got < total:
                    batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
                    for records in batches.values():
                        got += len(records)
                        if decode:
                            for r in records:
                                event = decode(r.value)
                                fpms += len(event.fpms) if event.type == "fpm_batch" else 1
                elapsed = time.perf_counter() - start
            finally:
                await consumer.stop()
            result[kind] = {"records": got, "seconds": elapsed, "fpms": fpms}
        return result

    def stage_worker(self, prefix: str, processes: int, n: int) -> dict:
        app_id = f"{prefix}w{processes}"
        ports = [free_port() for _ in range(processes)]
        workers = [self.worker(prefix, app_id, port, i) for i, port in enumerate(ports)]
        try:
            def routed() -> float:
                return sum(metric(scrape(p), "fleetplan_fpm_events_total") for p in ports)

            wait(lambda: routed() > 0, 120, 0.02)
            first = time.perf_counter()
            wait(lambda: routed() >= n, 900, self.args.poll)
            end = time.perf_counter()
            batch = [metric(scrape(p), "fleetplan_batch_seconds_sum") / max(metric(scrape(p), "fleetplan_batch_seconds_count"), 1)
                     for p in ports]
        finally:
            for w in workers:
                w.stop()
        return {"processes": processes, "fpms": n, "seconds": end - first, "mean_batch_s": statistics.mean(batch)}

    def stage_latency(self, prefix: str) -> dict:
        a = self.args
        bport, wport, pull = free_port(), free_port(), f"tcp://127.0.0.1:{free_port()}"
        bridge = self.bridge(prefix, bport, pull)
        worker = self.worker(prefix, f"{prefix}lat", wport, 0)
        try:
            wait(lambda: "fleetplan_bridge" in scrape(bport) and "fleetplan_ticks" in scrape(wport), 60)
            time.sleep(2)  # the worker's group settles
            push = zmq.Context.instance().socket(zmq.PUSH)
            push.connect(pull)
            deployments = [f"live{d}" for d in range(a.live_deployments)]
            counter, start = 0, time.time()
            while time.time() - start < a.live_seconds:
                now = time.time()
                batch = [fpm(d, e, counter, now, hot=True) for d in deployments for e in range(a.live_engines)]
                push.send(msgpack.packb(batch))
                counter += 1
                time.sleep(0.02)
            push.close()
            time.sleep(3)
            body = scrape(wport)
            histogram = parse_histogram(body, "fleetplan_decision_latency_seconds")
        finally:
            worker.stop()
            bridge.stop()
        records = asyncio.run(read_topic(a.bootstrap, f"{prefix}fleetplan.decisions.v1"))
        inputs = {name: first_past(asyncio.run(read_topic(a.bootstrap, f"{prefix}fleetplan.{name}.v1")))
                  for name in ("fpm", "requests")}
        lat, parts = [], {"fpm": [], "requests": [], "worker": []}
        for r in records:
            d = orjson.loads(r.value)
            if d["deployment"].startswith("live"):
                due = d["time"] + CONFIG["grace_seconds"]
                lat.append(r.timestamp_ms / 1000.0 - due)
                arrived = [inputs[name](d["deployment"], due) for name in ("fpm", "requests")]
                if None not in arrived:
                    parts["fpm"].append(arrived[0] - due)
                    parts["requests"].append(arrived[1] - due)
                    parts["worker"].append(r.timestamp_ms / 1000.0 - max(arrived))
        return {"decisions": len(lat), "external": lat, "internal": histogram, "parts": parts}

    # --- run ----------------------------------------------------------------------

    def run(self) -> None:
        a = self.args
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        bridge = raw = workers = latency = None
        try:
            asyncio.run(create_topics(a.bootstrap, prefix, a.partitions))
            if "ingest" in a.stages:
                bridge = self.stage_bridge(prefix)
                print(f"bridge: {bridge}", file=sys.stderr)
                raw = asyncio.run(self.stage_raw(f"{prefix}fleetplan.fpm.v1"))
                print(f"raw: {raw}", file=sys.stderr)
                workers = [self.stage_worker(prefix, k, bridge["fpms"]) for k in a.workers]
                print(f"workers: {workers}", file=sys.stderr)
            if "latency" in a.stages:
                # Fresh topics: the live worker must not start with the backlog above.
                live = f"bench{uuid.uuid4().hex[:6]}."
                asyncio.run(create_topics(a.bootstrap, live, a.partitions))
                try:
                    latency = self.stage_latency(live)
                finally:
                    asyncio.run(delete_topics(a.bootstrap, live))
                print(f"latency: {latency['decisions']} decisions, internal {latency['internal']}",
                      file=sys.stderr)
        finally:
            asyncio.run(delete_topics(a.bootstrap, prefix))
        report(a, bridge, raw, workers, latency)


def first_past(records):
    """f(deployment, t): the Kafka timestamp (s) of the first record of the deployment
    whose event time is >= t, i.e. when its source's clock first reached t on the topic."""
    by_dep: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        by_dep.setdefault(r.key.decode(), []).append((orjson.loads(r.value)["time"], r.timestamp_ms / 1000.0))
    index = {}
    for dep, rows in by_dep.items():
        rows.sort()
        earliest, suffix = float("inf"), []
        for _, ts in reversed(rows):
            earliest = min(earliest, ts)
            suffix.append(earliest)
        index[dep] = ([t for t, _ in rows], suffix[::-1])

    def at(deployment: str, t: float) -> float | None:
        times, suffix = index.get(deployment, ([], []))
        i = bisect.bisect_left(times, t)
        return suffix[i] if i < len(times) else None

    return at


def parse_histogram(body: str, name: str) -> dict:
    buckets = {}
    for line in body.splitlines():
        m = re.match(rf'{name}_bucket{{le="([^"]+)"}} (\S+)', line)
        if m:
            buckets[float(m[1])] = float(m[2])
    count = metric(body, f"{name}_count")
    out = {"count": count}
    for q in (0.5, 0.99):
        out[f"p{int(q * 100)}_le"] = next((le for le, c in sorted(buckets.items()) if count and c >= q * count), None)
    return out


def wait(predicate, timeout: float, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark stage did not finish")
        time.sleep(interval)


async def create_topics(bootstrap: str, prefix: str, partitions: int) -> None:
    from fleetplan.streams.topics import Topics, ensure_topics, event_log_specs

    await ensure_topics(bootstrap, event_log_specs(Topics(prefix), partitions), replication=1)


async def delete_topics(bootstrap: str, prefix: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


async def read_topic(bootstrap: str, topic: str):
    from fleetplan.streams.kafka_io import read_partitions
    from fleetplan.streams.topics import partition_counts

    n = (await partition_counts(bootstrap, [topic])).get(topic, 0)
    slices = await read_partitions(bootstrap, [(topic, p) for p in range(n)])
    return [r for records in slices.values() for r in records]


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}; Kafka broker on the same machine; load average {load} "
            f"at the end of the run")


def report(a, bridge, raw, workers, latency) -> None:
    print(f"Command: `.venv/bin/python bench/bench_ingest.py {' '.join(sys.argv[1:])}`  ")
    print(f"Machine: {machine()}  ")
    if bridge is not None:
        report_ingest(a, bridge, raw, workers)
    if latency is not None:
        report_latency(a, latency)


def report_ingest(a, bridge, raw, workers) -> None:
    rate = lambda n, s: f"{n / s:,.0f}"  # noqa: E731
    per_record = bridge["fpms"] / max(bridge["records"], 1)
    print(f"Load: {bridge['fpms']:,} FPMs, {a.deployments} deployments x {a.engines} engines, "
          f"{a.partitions} partitions; the bridge packed {per_record:.0f} FPMs per record.\n")
    print("| stage | FPM events/s | records/s | notes |")
    print("|---|---:|---:|---|")
    print(f"| ZMQ -> bridge -> Kafka (1 bridge process) | {rate(bridge['fpms'], bridge['seconds'])} | "
          f"{rate(bridge['records'], bridge['seconds'])} | validated with the schemas, packed, acks=all |")
    for kind, label in (("bytes", "raw aiokafka consume, bytes only"),
                        ("decode", "raw aiokafka consume + schema decode (pydantic)"),
                        ("fast", "raw aiokafka consume + the worker's decode (msgspec)")):
        r = raw[kind]
        fpms = r["fpms"] or r["records"] * per_record
        print(f"| {label} | {rate(fpms, r['seconds'])} | {rate(r['records'], r['seconds'])} | same topic, same run |")
    for w in workers:
        print(f"| Kafka -> worker ({w['processes']} process{'es' if w['processes'] > 1 else ''}) | "
              f"{rate(w['fpms'], w['seconds'])} | {rate(w['fpms'] / per_record, w['seconds'])} | "
              f"mean batch {w['mean_batch_s'] * 1000:.1f} ms |")


def report_latency(a, latency) -> None:
    ext = latency["external"]
    internal = latency["internal"]
    print(f"\nDecision latency ({latency['decisions']} decisions, {a.live_deployments} live deployments x "
          f"{a.live_engines} engines, {a.live_deployments * a.live_engines * 50:,} FPMs/s, bridge + 1 worker): "
          f"tick + grace -> decision on the topic p50 {quantile(ext, 0.5) * 1000:.0f} ms, "
          f"p99 {quantile(ext, 0.99) * 1000:.0f} ms; the worker's histogram (watermark passed -> "
          f"acknowledged) p50 <= {fmt_le(internal.get('p50_le'))}, p99 <= {fmt_le(internal.get('p99_le'))}.")
    parts = latency["parts"]
    show = lambda v: f"p50 {quantile(v, 0.5) * 1000:.0f} ms, p99 {quantile(v, 0.99) * 1000:.0f} ms"  # noqa: E731
    print(f"Where it goes (Kafka timestamps): the first FPM record past tick + grace is on the topic "
          f"{show(parts['fpm'])} after it, the first requests-topic record (a heartbeat) {show(parts['requests'])}; "
          f"from the later of the two to the decision on the topic {show(parts['worker'])}.")


def fmt_le(v) -> str:
    return "n/a" if v is None else f"{v * 1000:.0f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("FLEETPLAN_KAFKA_BOOTSTRAP", "127.0.0.1:19092"))
    p.add_argument("--fpms", type=int, default=300_000)
    p.add_argument("--deployments", type=int, default=8)
    p.add_argument("--engines", type=int, default=16)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--batch-max", type=int, default=2000)
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--live-deployments", type=int, default=16)
    p.add_argument("--live-seconds", type=float, default=30.0)
    p.add_argument("--live-engines", type=int, default=2, help="engines per live deployment (50 FPMs/s each)")
    p.add_argument("--batch-within", type=float, default=0.05, help="the workers' --batch-within (its default: 0.05)")
    p.add_argument("--heartbeat", type=float, default=1.0, help="the bridges' --heartbeat (its default: 1)")
    p.add_argument("--poll", type=float, default=0.05,
                   help="seconds between scrapes of the workers' metrics while they read the backlog "
                        "(scrapes cost the worker CPU: at 20 a second, a sixth of its py-spy samples in one run)")
    p.add_argument("--stages", type=lambda s: s.split(","), default=["ingest", "latency"],
                   help="comma-separated: ingest (bridge, raw consume, workers), latency")
    Bench(p.parse_args()).run()


if __name__ == "__main__":
    main()
