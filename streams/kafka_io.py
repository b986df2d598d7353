"""Reading bounded slices of topics: what the audit and outbox recovery need.

Both read "everything up to now" of a few partitions, without a consumer
group (nothing is committed, no rebalance to wait for): assign, snapshot the
end offsets, read until every partition has reached its snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition


@dataclass(frozen=True)
class LogRecord:
    """One record read back: where it is and what it holds."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


async def read_partitions(
    bootstrap: str, partitions: Iterable[tuple[str, int]], *, tail: int | None = None,
    timeout_s: float = 60.0, starts: dict[tuple[str, int], int] | None = None,
) -> dict[tuple[str, int], list[LogRecord]]:
    """Every record of ``partitions`` up to their end at call time.

    ``tail`` limits each partition to its last ``tail`` records. Partitions
    of topics that do not exist read as empty. ``starts``, when given, gets
    each partition's first offset kept (above 0 once retention deleted records;
    the end offset when it deleted them all).
    """
    wanted = list(dict.fromkeys(partitions))
    out: dict[tuple[str, int], list[LogRecord]] = {tp: [] for tp in wanted}
    if not wanted:
        return out
    from fleetplan.streams.topics import partition_counts

    counts = await partition_counts(bootstrap, sorted({t for t, _ in wanted}))
    tps = [TopicPartition(t, p) for t, p in wanted if p < counts.get(t, 0)]
    if not tps:
        return out
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        begins = await consumer.beginning_offsets(tps)
        if starts is not None:
            starts.update({(tp.topic, tp.partition): begins[tp] for tp in tps})
        todo: set[TopicPartition] = set()
        for tp in tps:
            start = begins[tp]
            if tail is not None:
                start = max(start, ends[tp] - tail)
            if start < ends[tp]:
                consumer.seek(tp, start)
                todo.add(tp)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while todo:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {sorted(map(str, todo))} did not reach the end in {timeout_s} s")
            batches = await consumer.getmany(*todo, timeout_ms=500)
            for tp, records in batches.items():
                sink = out[(tp.topic, tp.partition)]
                for r in records:
                    if r.offset < ends[tp]:
                        sink.append(LogRecord(tp.topic, tp.partition, r.offset, r.key, r.value, r.timestamp))
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
        return out
    finally:
        await consumer.stop()
