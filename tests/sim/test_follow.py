"""The demo fleet follows the live planner: a decision written by the virtual connector
is picked up from Redis, the simulated fleet scales to it, and the completion reaches
the connector."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from fleetplan.connectors.virtual import VirtualApplier, VirtualKeys
from fleetplan.models.config import config_from_dict
from fleetplan.schemas.events import Decision
from fleetplan.sim.experiment import run_policy
from fleetplan.sim.follow import FollowDecisions
from fleetplan.sim.realtime import LiveRun, RealtimePacer
from fleetplan.sim.runner import SimOptions, make_setup
from tests.sim.sim_helpers import synthetic

pytestmark = pytest.mark.redis


async def test_the_fleet_scales_to_the_decision_in_redis_and_completes_it(
        redis_url, redis_client, redis_key_prefix, h200):
    prefix = f"{redis_key_prefix}virtual"
    client = aioredis.from_url(redis_url)
    applier = VirtualApplier(client, prefix=prefix, poll_s=0.05, completion_timeout_s=60)
    decision = Decision(deployment="follow", time=1.0, decision_id=0, targets={"prefill": 3, "decode": 2},
                        previous={"prefill": 1, "decode": 1}, throughput_reason="scale",
                        load_reason="scale_up")
    apply = asyncio.create_task(applier.apply(decision))
    while await client.hget(VirtualKeys.of("follow", prefix).state, "decision_id") is None:
        await asyncio.sleep(0.02)

    setup = make_setup(config_from_dict({"max_gpu_budget": 16}), h200,
                       SimOptions(deployment="follow", startup="20"))
    policy = FollowDecisions(redis_url, prefix)
    live = LiveRun(pacer=RealtimePacer(speed=40.0))  # 160 s of virtual time in 4 s
    result = await asyncio.to_thread(run_policy, synthetic(4, 160), setup, policy, "follow",
                                     {"prefill": 1, "decode": 1}, None, None, live)

    assert await asyncio.wait_for(apply, 20) == {"prefill": 3, "decode": 2}  # the connector's view
    assert policy.completed == [(0, "applied")]
    _, counts, _ = result.timeline.points[-1]
    assert {r: counts[r]["ready"] for r in ("prefill", "decode")} == {"prefill": 3, "decode": 2}
    await client.aclose()
