"""What the queueing models cost, and how closely Erlang B's Poisson form matches its recursion.

    .venv/bin/python bench/bench_queueing.py

Times ``erlang_c`` at 1,024 servers both ways, and one ``slot_replicas``
search (decode sized by the wait for a slot) for 4 and 463 engines of 256
slots with a five-point dispersion curve and three OSL classes; then the
largest relative gap between the Poisson form (used past
``RECURSION_SERVERS``) and the recursion over 300 random fleets of 257 to
300,000 servers at 50–99.9 % load.
"""

from __future__ import annotations

import argparse
import math
import random
import timeit

from fleetplan.models.queueing import RECURSION_SERVERS, erlang_c, slot_replicas

CURVE = [(1.0, 1.3), (2.0, 1.5), (4.0, 1.8), (8.0, 2.0), (16.0, 2.2)]
BUDGETS = [(0.3, 1.0), (0.4, 4.0), (0.3, 9.0)]


def by_recursion(servers: int, offered: float) -> float:
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1.0 - blocking))


def best_of(fn, number: int) -> float:
    """Microseconds per call, the best of five repeats."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    # no options: the parser is there so that --help describes the run instead of starting it,
    # and a mistyped flag is refused instead of ignored
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(f"erlang_c(1024, 950): Poisson form {best_of(lambda: erlang_c(1024, 950.0), 2000):.1f} µs, "
          f"recursion {best_of(lambda: by_recursion(1024, 950.0), 200):.1f} µs")
    for demand in (211.0, 211.0 * 125):
        n = slot_replicas(demand, 57.0, 256, BUDGETS, 0.99, 1, arrival_dispersion=CURVE)
        us = best_of(lambda d=demand: slot_replicas(d, 57.0, 256, BUDGETS, 0.99, 1, arrival_dispersion=CURVE), 200)
        print(f"slot_replicas at {demand:,.0f} rps: {n} engines, {us / 1000:.3f} ms")
    rng = random.Random(1)
    worst = 0.0
    for _ in range(300):
        servers = int(math.exp(rng.uniform(math.log(RECURSION_SERVERS + 1), math.log(300_000))))
        offered = servers * rng.uniform(0.5, 0.999)
        exact = by_recursion(servers, offered)
        if exact > 1e-300:
            worst = max(worst, abs(erlang_c(servers, offered) - exact) / exact)
    print(f"Poisson form against the recursion, 300 fleets of {RECURSION_SERVERS + 1}-300,000 servers: "
          f"worst relative gap {worst:.1e}")


if __name__ == "__main__":
    main()
