"""The simulator without inventory events: the live stack's view of the fleet.

fleetplan's live stack writes no inventory, so the planner knows its
engines from their FPMs and times startups by the acks of its scale-ups
(models/startup.py). ``SimOptions(inventory=False)`` (``simulate
--no-inventory``) runs the closed loop that way.
"""

from __future__ import annotations

import io

import orjson
import pytest
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app
from fleetplan.eventlog import read_events
from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.sim.runner import ClosedLoop, PlannerController, SimOptions, make_setup
from fleetplan.sim.traces import read_trace
from fleetplan.sim.workload import Workload, rate_scale, slice_trace
from tests.sim.sim_helpers import CONV

CONFIG = {"load_predictor": "constant", "max_gpu_budget": 64, "throughput_adjustment_interval_seconds": 60}
STARTUP = 150.0


@pytest.fixture(scope="module")
def workload():
    reqs = slice_trace(read_trace(CONV), 0, 600)
    return Workload.from_requests("conv10", rate_scale(reqs, 12, seed=1, duration_s=600), 600)


def _run(workload, h200, inventory: bool):
    cfg = config_from_dict(CONFIG)
    setup = make_setup(cfg, h200, SimOptions(seed=5, startup=f"{STARTUP:g}", inventory=inventory))
    controller = PlannerController(Planner(cfg, profile=h200))
    log = io.BytesIO()
    result = ClosedLoop(workload, setup, controller, {"prefill": 1, "decode": 1}, log=log).run()
    return result, controller.core.states[setup.options.deployment], log.getvalue()


@pytest.fixture(scope="module")
def both(workload, h200):
    return _run(workload, h200, True), _run(workload, h200, False)


def test_without_inventory_the_acks_time_the_startup_the_engines_took(both):
    (with_inv, state_inv, _), (without, state, log) = both
    events = [orjson.loads(line) for line in log.splitlines()]
    assert not [e for e in events if e["type"] == "inventory"]
    scale_ups = [e for e in events if e["type"] == "decision"
                 and any(n > e["previous"][r] for r, n in e["targets"].items())]
    assert scale_ups  # the run grows the fleet
    assert not state.inventory_seen and state_inv.inventory_seen
    # a tick at event time t fires once the watermark passes it, grace_seconds (2) later, and
    # the engines start then: both planners time the decision to its engines serving, one
    # sample per acked scale-up here, one per engine from the ready events
    took = STARTUP + 2.0
    assert state.startup_samples and set(state.startup_samples) == {took}
    assert set(state_inv.startup_samples) == {took}
    assert len(state.startup_samples) < len(state_inv.startup_samples)
    assert without.summary.requests == with_inv.summary.requests


def test_a_log_without_inventory_replays_to_the_same_decisions(both, tmp_path):
    _, (_, _, log) = both
    path = tmp_path / "events.jsonl"
    path.write_bytes(log)
    config = tmp_path / "config.yaml"
    config.write_text("\n".join(f"{k}: {v}" for k, v in CONFIG.items()))
    _register_optional()
    out = CliRunner().invoke(app, ["plan", "--events", str(path), "--config", str(config),
                                   "--profile", "h200-llama3.1-8b"])
    assert out.exit_code == 0, out.output
    replayed = [orjson.loads(line) for line in out.stdout.splitlines() if line.strip()]
    logged = [e.model_dump(mode="json") for e in read_events(path) if e.type == "decision"]
    assert replayed == [orjson.loads(orjson.dumps(d)) for d in logged] and replayed
