"""What the bounds on untrusted input protect against, measured.

Usage:

    .venv/bin/python bench/input_bounds.py [--events 100000] [--samples 10000]

- the bridge validates every element of a message's array on its event
  loop: the time to decode an array of ``--events`` empty objects (the
  bridge's ``MAX_EVENTS_PER_MESSAGE``; docs/wire-format.md);
- a perf model's retained FPM samples are stored in the deployment's
  changelog record: the bytes of a prefill and a decode model holding
  ``--samples`` samples (``max_num_fpm_samples``' ceiling; docs/planner.md),
  after twice as many random FPMs.
"""

from __future__ import annotations

import argparse
import random
import time

import msgpack
import orjson

from fleetplan.connectors.bridge import decode_message
from fleetplan.models.config import config_from_dict
from fleetplan.models.perf_models import make_perf_models
from fleetplan.schemas import ForwardPassMetrics, QueuedRequests, ScheduledRequests


def _fpm(role: str, t: float, rng: random.Random) -> ForwardPassMetrics:
    prefill = role == "prefill"
    return ForwardPassMetrics(
        deployment="d", time=t, role=role, worker_id="w", counter_id=int(t), wall_time=rng.uniform(0.005, 0.05),
        scheduled=ScheduledRequests(
            num_prefill_requests=1 if prefill else 0, sum_prefill_tokens=rng.randint(100, 8000) if prefill else 0,
            num_decode_requests=0 if prefill else rng.randint(1, 256),
            sum_decode_kv_tokens=0 if prefill else rng.randint(1000, 900_000)),
        queued=QueuedRequests(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=10_000)
    args = parser.parse_args()

    payload = msgpack.packb([{}] * args.events)
    started = time.perf_counter()
    _, rejected = decode_message([payload])
    print(f"bridge: an array of {args.events:,} empty objects decoded in {time.perf_counter() - started:.2f} s "
          f"({len(rejected)} dead letters)")

    models = make_perf_models(config_from_dict({"max_num_fpm_samples": args.samples}), None)
    rng = random.Random(1)
    for i in range(2 * args.samples):
        for role in ("prefill", "decode"):
            models[role].observe(_fpm(role, 1_800_000_000.0 + i, rng))
    for role in ("prefill", "decode"):
        size = len(orjson.dumps(models[role].to_state()))
        print(f"perf model ({role}): {size / 1e6:.2f} MB stored with {args.samples:,} samples kept")


if __name__ == "__main__":
    main()
