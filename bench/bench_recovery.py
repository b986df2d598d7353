"""Benchmark recovery after ``kill -9`` of the worker against the size of its state table.

    .venv/bin/python bench/bench_recovery.py [--sizes 100,1000] [--bootstrap 127.0.0.1:19092]

The default sizes take about a minute on the 2-core development machine;
``--sizes 100,1000,4000`` (the figures in docs/runtime.md) 5-7 minutes, most
of it loading the 4,000 deployments.

For each table size N, on fresh topics (a unique prefix, deleted afterwards):

1. load: N deployments, each with ``--seconds`` of event time of FPMs (packed
   as the bridge packs them) and request records, produced to the input
   topics; one ``fleetplan worker`` folds them until every deployment has
   fired its ticks, so the ``deployments`` table holds N states;
2. ``kill -9`` the worker (no shutdown code runs, nothing is flushed);
3. a probe: one more second of input for one deployment, enough for the
   watermark to pass its next tick;
4. restart the worker (same app id and static member id, as after a crash)
   and time, from the spawn of the new process (log lines are timestamped
   by the worker):
   - *Faust up*: Faust logs ``[^Worker]: Starting...`` (interpreter and imports);
   - *table read*: Faust logs ``Restore complete`` (the ``deployments`` and
     ``traffic`` tables read back from their changelogs);
   - *router rebuilt*: the worker logs ``owning partitions`` (every stored
     state decoded into the router, ``PlannerWorker._on_recovered``);
   - *next output*: the probe deployment's new tick diagnostic is on
     ``fleetplan.ticks.v1`` (its Kafka timestamp), the first thing the
     restarted worker computes that the killed one never did.

The size of what recovery reads (changelog records and bytes of the
``deployments`` table at the moment of the kill) is printed beside each row.
The default store is used (``memory://`` unless rocksdict is installed; the
worker deletes a RocksDB directory at start and rebuilds it from the
changelog too, so recovery reads the same records either way).

Not a test: nothing asserts. Prints a markdown table and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import CONFIG, FLEETPLAN, Proc, free_port, machine, metric, scrape, wait  # noqa: E402

T0 = 1_000_000.0


def inputs(deployment: str, seconds: int, engines: int) -> tuple[list[bytes], list[bytes]]:
    """(FpmBatch records, request records) of one deployment: one batch per second of
    event time with every engine's FPMs at 4 iterations/s, a request every second."""
    from fleetplan.schemas.codec import encode_event
    from fleetplan.schemas.events import (
        ForwardPassMetrics,
        FpmBatch,
        QueuedRequests,
        RequestRecord,
        ScheduledRequests,
    )

    fpms, requests = [], []
    for s in range(seconds):
        batch = []
        for k in range(4):
            t = T0 + s + k * 0.25
            for e in range(engines):
                batch.append(ForwardPassMetrics(
                    deployment=deployment, time=t, role="agg", worker_id=f"e{e}", counter_id=s * 4 + k,
                    wall_time=0.02,
                    scheduled=ScheduledRequests(num_decode_requests=8, sum_decode_kv_tokens=8000 + 100 * e),
                    queued=QueuedRequests(num_prefill_requests=s % 2, sum_prefill_tokens=3000 * (s % 2)),
                ))
        fpms.append(encode_event(FpmBatch(deployment=deployment, time=batch[-1].time, fpms=batch)))
        requests.append(encode_event(RequestRecord(
            deployment=deployment, time=T0 + s + 0.5, request_id=f"{deployment}-r{s}", input_tokens=900 + s,
            output_tokens=120, cached_tokens=100, request_received_ms=(T0 + s) * 1000.0, ttft_ms=80.0,
            avg_itl_ms=9.0,
        )))
    return fpms, requests


async def produce(bootstrap: str, records: list[tuple[str, str, bytes]]) -> None:
    """(topic, key, value) records, keyed by deployment with the default partitioner."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                max_batch_size=1 << 20, max_request_size=8 << 20)
    await producer.start()
    try:
        pending = []
        for topic, key, value in records:
            pending.append(await producer.send(topic, value, key=key.encode()))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def create_topics(bootstrap: str, prefix: str, app_id: str, partitions: int) -> None:
    from fleetplan.streams.topics import Topics, changelog_specs, ensure_topics, event_log_specs

    specs = event_log_specs(Topics(prefix), partitions) + changelog_specs(
        app_id, partitions, traffic_retention_ms=8 * 180 * 1000)
    await ensure_topics(bootstrap, specs, replication=1)


async def delete_topics(bootstrap: str, prefixes: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(tuple(prefixes))]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


async def changelog_size(bootstrap: str, topic: str, partitions: int) -> tuple[int, int, int]:
    """(records, bytes, distinct keys) of a changelog: what a recovery reads."""
    from fleetplan.streams.kafka_io import read_partitions

    slices = await read_partitions(bootstrap, [(topic, p) for p in range(partitions)])
    records = [r for rs in slices.values() for r in rs]
    return len(records), sum(len(r.value or b"") for r in records), len({r.key for r in records})


async def end_offset(bootstrap: str, topic: str, partition: int) -> int:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        return (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()


async def wait_for_tick(bootstrap: str, topic: str, partition: int, start: int, deployment: str,
                        tick: float, timeout_s: float) -> float:
    """Kafka timestamp (s) of ``deployment``'s diagnostic of ``tick``, read from offset ``start``."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for r in records:
                    diag = orjson.loads(r.value)
                    if diag.get("deployment") == deployment and diag.get("time") == tick:
                        return r.timestamp / 1000.0  # CreateTime: when the worker produced it
        raise TimeoutError(f"no diagnostic of {deployment} at {tick} after {timeout_s} s")
    finally:
        await consumer.stop()


class Worker(Proc):
    """A worker process whose log lines are timed from its spawn."""

    def __init__(self, args, prefix: str, app_id: str, config: Path, tmp: Path, n: int) -> None:
        self.port = free_port()
        self.args = [
            FLEETPLAN, "worker", "--bootstrap", args.bootstrap, "--config", str(config),
            "--app-id", app_id, "--topic-prefix", prefix, "--partitions", str(args.partitions),
            "--replication", "1", "--datadir", str(tmp / f"data-{app_id}"),
            "--session-timeout", "6", "--heartbeat", "1", "--commit-interval", "0.5", "--idle-after", "2",
            "--instance-id", f"{app_id}-0", "--metrics-port", str(self.port), "--loglevel", "info",
        ]
        self.spawned_at = time.time()
        super().__init__(self.args, tmp / f"worker-{app_id}-{n}.log")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def seconds_to(self, marker: str) -> float:
        """Seconds from the spawn to the first log line containing ``marker`` (its own timestamp)."""
        line = next(line for line in self.text().splitlines() if marker in line)
        stamp = datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")  # local time
        return stamp.timestamp() - self.spawned_at

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._fh.close()


def run_size(args, n: int, tmp: Path, config: Path) -> dict:
    from fleetplan.streams.topics import Topics, changelog_name, partition_for

    tag = uuid.uuid4().hex[:6]
    prefix, app_id = f"brec{tag}.", f"brec{tag}-worker"
    topics = Topics(prefix)
    asyncio.run(create_topics(args.bootstrap, prefix, app_id, args.partitions))
    try:
        deployments = [f"d{i}" for i in range(n)]
        per_deployment = {d: inputs(d, args.seconds, args.engines) for d in deployments}
        # In event-time order across deployments, as a live bridge produces them: what a
        # restart re-reads is then the tail since the oldest unsettled record, not most of
        # the log behind one deployment's first held record.
        records = []
        for second in range(args.seconds):
            for d, (fpms, requests) in per_deployment.items():
                records += [(topics.fpm, d, fpms[second]), (topics.requests, d, requests[second])]
        started = time.perf_counter()
        asyncio.run(produce(args.bootstrap, records))
        # Ticks every load interval (5 s) up to the last second's watermark, per deployment.
        ticks = int((args.seconds - CONFIG["grace_seconds"]) // CONFIG["load_adjustment_interval_seconds"])
        first = Worker(args, prefix, app_id, config, tmp, 0)
        try:
            wait(lambda: metric(scrape(first.port), "fleetplan_ticks_total") >= ticks * n, args.load_timeout, 0.5)
            loaded_s = time.perf_counter() - started
            time.sleep(2.0)  # resume offsets committed (every 0.5 s): the restart re-reads little
        except BaseException:
            first.stop()
            raise
        first.kill()
        table = changelog_name(app_id, "deployments")
        size = asyncio.run(changelog_size(args.bootstrap, table, args.partitions))

        probe = deployments[0]
        part = partition_for(probe, args.partitions)
        last = T0 + args.seconds
        tick = float((int(last - T0) // 5 + 1) * 5 + T0)  # the next tick after the load
        fpms, requests = inputs(probe, int(tick - T0) + 2, args.engines)
        asyncio.run(produce(args.bootstrap, [(topics.fpm, probe, v) for v in fpms[args.seconds:]]
                            + [(topics.requests, probe, v) for v in requests[args.seconds:]]))
        start = asyncio.run(end_offset(args.bootstrap, topics.name("fleetplan.ticks.v1"), part))

        second = Worker(args, prefix, app_id, config, tmp, 1)
        try:
            wait(lambda: "owning partitions" in second.text(), args.load_timeout, 0.1)
            emitted = asyncio.run(wait_for_tick(args.bootstrap, topics.name("fleetplan.ticks.v1"), part, start,
                                                probe, tick, args.load_timeout))
            output_s = emitted - second.spawned_at
            marks = {name: second.seconds_to(marker) for name, marker in (
                ("faust_s", "[^Worker]: Starting"), ("restored_s", "Restore complete"),
                ("rebuilt_s", "owning partitions"))}
            owning = next(line for line in second.text().splitlines() if "owning partitions" in line)
        finally:
            second.stop()
        return {"n": n, "loaded_s": loaded_s, "records": size[0], "bytes": size[1], "keys": size[2],
                **marks, "output_s": output_s, "owning": owning.split("owning", 1)[1].strip()}
    finally:
        asyncio.run(delete_topics(args.bootstrap, [prefix, app_id]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("FLEETPLAN_KAFKA_BOOTSTRAP", "127.0.0.1:19092"))
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000])
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seconds", type=int, default=12, help="seconds of event time loaded per deployment")
    p.add_argument("--engines", type=int, default=4, help="engines per deployment")
    p.add_argument("--load-timeout", type=float, default=600.0)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    config = tmp / "planner.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    rows = []
    for n in args.sizes:
        row = run_size(args, n, tmp, config)
        print(row, file=sys.stderr)
        rows.append(row)
    print(f"worker logs (per-step timestamps) in {tmp}", file=sys.stderr)
    print(f"Command: `.venv/bin/python bench/bench_recovery.py {' '.join(sys.argv[1:])}`  ")
    print(f"Machine: {machine()}  ")
    from fleetplan.streams.app import default_store

    print(f"State: {args.seconds} s of event time per deployment, {args.engines} engines each, "
          f"{args.partitions} partitions, one worker; store: {default_store()} (the default).\n")
    print("Seconds from the spawn of the restarted process:\n")
    print("| deployments in the table | changelog read at restart | Faust up | table read | "
          "router rebuilt | next diagnostic on the topic |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']:,} | {r['records']:,} records, {r['bytes'] / 2**20:.1f} MiB ({r['keys']:,} keys) | "
              f"{r['faust_s']:.2f} | {r['restored_s']:.2f} | {r['rebuilt_s']:.2f} | {r['output_s']:.2f} |")


if __name__ == "__main__":
    main()
