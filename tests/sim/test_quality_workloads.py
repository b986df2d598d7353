"""bench/quality.py's workloads are the ones ``fleetplan simulate`` replays for the same trace and options."""

from __future__ import annotations

import json

from bench.quality import Spec, build_workload
from fleetplan.sim.cli import _workload


def _rounded_trace(path) -> None:
    """A Mooncake-style trace logged in 3-s steps: four requests at each of 0, 3, ..., 27 s."""
    rows = [{"timestamp": 3000 * step, "input_length": 500 + i, "output_length": 50, "hash_ids": [step, 100 + 4 * step + i]}
            for step in range(10) for i in range(4)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_spread_workload_is_the_simulators_spread_trace(tmp_path):
    """The spread trace covers its last step too (27-30 s): its copies wrap on 30 s, as
    `fleetplan simulate --spread-arrivals auto` wraps them. The bench took the span before
    spreading, 27 s, so each shifted copy overlapped its own first step and the trace's last
    step ran past the workload's end."""
    trace = tmp_path / "rounded.jsonl"
    _rounded_trace(trace)
    spec = Spec("rounded-spread", "trace", str(trace), "h200-llama3.1-8b", scale=3.0, spread=True)
    bench = build_workload(spec)
    cli, step = _workload(trace, None, None, 0.0, None, 3.0, 1.0, 0)
    assert step == 3.0
    assert bench.duration_s == cli.duration_s == 30.0
    assert [r.arrival_s for r in bench.requests()] == [r.arrival_s for r in cli.requests()]
    assert max(r.arrival_s for r in bench.requests()) < bench.duration_s
