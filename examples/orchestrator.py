"""A runnable example orchestrator: receive fleetplan decisions, "scale", complete them.

The fleet here is a dict of replica counts that takes a moment to change;
replace ``ToyFleet.scale_to`` with calls to your scheduler (Slurm, Nomad,
Ray, a cloud API ...).

Over Redis, next to ``fleetplan connector --backend virtual``::

    python examples/orchestrator.py --transport redis --deployment llama

Over Kafka, as the connector itself (do not also run ``fleetplan connector``)::

    python examples/orchestrator.py --transport kafka --deployment llama
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from fleetplan.connectors.client import (
    KafkaOrchestratorClient,
    OrchestratorClient,
    RedisOrchestratorClient,
)
from fleetplan.schemas.events import Decision

log = logging.getLogger("example-orchestrator")


class ToyFleet:
    """Replica counts per role; scaling takes ``seconds_per_replica`` per replica changed."""

    def __init__(self, max_replicas: int, seconds_per_replica: float) -> None:
        self.replicas: dict[str, int] = {}
        self.max_replicas = max_replicas
        self.seconds_per_replica = seconds_per_replica

    async def scale_to(self, targets: dict[str, int]) -> dict[str, int]:
        if sum(targets.values()) > self.max_replicas:
            raise RuntimeError(f"{sum(targets.values())} replicas asked, {self.max_replicas} allowed")
        changed = sum(abs(n - self.replicas.get(role, 0)) for role, n in targets.items())
        await asyncio.sleep(changed * self.seconds_per_replica)
        self.replicas.update(targets)
        return dict(self.replicas)


def make_client(args: argparse.Namespace) -> OrchestratorClient:
    if args.transport == "redis":
        return RedisOrchestratorClient(args.redis_url, prefix=args.virtual_prefix)
    return KafkaOrchestratorClient(args.bootstrap, [args.deployment], group_id=args.group_id)


async def run(args: argparse.Namespace) -> None:
    fleet = ToyFleet(args.max_replicas, args.seconds_per_replica)
    handled = 0
    async with make_client(args) as client:
        log.info("waiting for decisions of %s over %s", args.deployment, args.transport)
        async for decision in client.decisions(args.deployment):
            await handle(client, fleet, decision)
            handled += 1
            if args.max_decisions and handled >= args.max_decisions:
                break


async def handle(client: OrchestratorClient, fleet: ToyFleet, decision: Decision) -> None:
    log.info("decision %d: %s (reasons: %s / %s)", decision.decision_id, decision.targets,
             decision.throughput_reason, decision.load_reason)
    try:
        observed = await fleet.scale_to(dict(decision.targets))
    except RuntimeError as err:
        log.warning("refusing decision %d: %s", decision.decision_id, err)
        await client.complete(decision, "failed", error=str(err))
        return
    await client.complete(decision, "applied", observed=observed)
    log.info("decision %d applied: %s", decision.decision_id, observed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("redis", "kafka"), default="redis")
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--redis-url", default=os.environ.get("FLEETPLAN_REDIS_URL", "redis://localhost:6379/0"))
    parser.add_argument("--virtual-prefix", default="fleetplan:virtual")
    parser.add_argument("--bootstrap", default=os.environ.get("FLEETPLAN_KAFKA_BOOTSTRAP", "localhost:9092"))
    parser.add_argument("--group-id", default="example-orchestrator")
    parser.add_argument("--max-replicas", type=int, default=64)
    parser.add_argument("--seconds-per-replica", type=float, default=0.0)
    parser.add_argument("--max-decisions", type=int, default=0, help="stop after N (0: run forever)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
