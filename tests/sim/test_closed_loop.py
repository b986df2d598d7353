"""The closed loop: the planner drives the simulated fleet, and its log replays exactly."""

from __future__ import annotations

import io

import orjson
import pytest
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app
from fleetplan.eventlog import read_events
from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.sim.experiment import run_planner
from fleetplan.sim.traces import read_trace
from fleetplan.sim.workload import Workload, rate_scale, slice_trace
from tests.sim.sim_helpers import CONV

CONFIG = {
    "load_predictor": "constant", "max_gpu_budget": 64, "enable_load_scaling": True,
    "throughput_adjustment_interval_seconds": 60,
}


@pytest.fixture(scope="module")
def workload():
    reqs = slice_trace(read_trace(CONV), 0, 300)
    return Workload.from_requests("conv5", rate_scale(reqs, 12, seed=1, duration_s=300), 300)


@pytest.fixture(scope="module")
def planned(workload, h200, tmp_path_factory):
    """One planner run from a cold 1P/1D fleet, with its log on disk."""
    from fleetplan.sim.runner import SimOptions, make_setup

    cfg = config_from_dict(CONFIG)
    setup = make_setup(cfg, h200, SimOptions(seed=5))
    path = tmp_path_factory.mktemp("loop") / "events.jsonl"
    with path.open("wb") as fh:
        result = run_planner(workload, setup, Planner(cfg, profile=h200), {"prefill": 1, "decode": 1}, log=fh)
    config_path = path.parent / "config.yaml"
    config_path.write_text("\n".join(f"{k}: {v if not isinstance(v, bool) else str(v).lower()}" for k, v in CONFIG.items()))
    return result, path, config_path


def test_the_planner_scales_the_fleet(planned, workload):
    result, _, _ = planned
    assert result.summary.requests == sum(1 for _ in workload.requests())  # nothing dropped
    assert result.late_events == 0
    assert len(result.decisions) >= 2
    assert result.summary.peak_replicas["prefill"] > 1


def test_fleetplan_plan_reproduces_every_decision(planned):
    result, log, config = planned
    _register_optional()
    out = CliRunner().invoke(app, ["plan", "--events", str(log), "--config", str(config), "--profile", "h200-llama3.1-8b"])
    assert out.exit_code == 0, out.output
    replayed = [orjson.loads(line) for line in out.stdout.splitlines() if line.strip()]
    logged = [orjson.loads(line) for line in log.read_bytes().splitlines() if b'"type":"decision"' in line]
    assert replayed == logged
    assert [d["decision_id"] for d in replayed] == list(range(len(result.decisions)))


def test_the_log_holds_every_input_and_each_ack_follows_its_decision(planned):
    result, log, _ = planned
    events = list(read_events(log))
    kinds = {e.type for e in events}
    assert {"fpm", "request", "inventory", "clock", "decision", "ack"} <= kinds
    times = [e.time for e in events if e.type != "decision"]
    assert times == sorted(times)  # fed in event-time order
    acked = [e.decision_id for e in events if e.type == "ack"]
    decided = [e.decision_id for e in events if e.type == "decision"]
    assert acked == decided[: len(acked)]
    assert sum(1 for e in events if e.type == "request") == result.summary.requests
    clocks = [e.time for e in events if e.type == "clock"]
    assert clocks[:3] == [1.0, 2.0, 3.0]


def test_same_seed_same_run(workload, h200):
    from fleetplan.sim.runner import SimOptions, make_setup

    cfg = config_from_dict(CONFIG)
    logs = []
    for _ in range(2):
        setup = make_setup(cfg, h200, SimOptions(seed=5, startup="uniform:60:180"))
        buf = io.BytesIO()
        run_planner(workload, setup, Planner(cfg, profile=h200), {"prefill": 1, "decode": 1}, log=buf)
        logs.append(buf.getvalue())
    assert logs[0] == logs[1]


def test_an_aggregated_fleet_replays_too(h200, tmp_path):
    from fleetplan.sim.runner import SimOptions, make_setup

    conf = {**CONFIG, "mode": "agg"}
    cfg = config_from_dict(conf)
    reqs = slice_trace(read_trace(CONV), 0, 240)
    workload = Workload.from_requests("conv4", rate_scale(reqs, 8, seed=2, duration_s=240), 240)
    log = tmp_path / "agg.jsonl"
    with log.open("wb") as fh:
        result = run_planner(workload, make_setup(cfg, h200, SimOptions()), Planner(cfg, profile=h200), {"agg": 1}, log=fh)
    assert result.decisions and result.late_events == 0
    config = tmp_path / "agg.yaml"
    config.write_text("\n".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in conf.items()))
    _register_optional()
    out = CliRunner().invoke(app, ["plan", "--events", str(log), "--config", str(config), "--profile", "h200-llama3.1-8b"])
    assert out.exit_code == 0, out.output
    logged = [line for line in log.read_bytes().splitlines() if b'"type":"decision"' in line]
    assert out.stdout_bytes.splitlines() == logged


def test_a_gpu_budget_below_one_engine_of_each_role_fails_at_setup(h200):
    """The profile says an engine's GPUs; a budget that cannot hold one of each role would
    leave a role at 0 engines and its requests queued forever, so the run never ends."""
    from fleetplan.sim.runner import SimOptions, make_setup

    gpus = h200.tp or 1
    with pytest.raises(ValueError, match=r"max_gpu_budget: .* cannot hold one engine of each role"):
        make_setup(config_from_dict({"max_gpu_budget": 2 * gpus - 1}), h200, SimOptions())
    make_setup(config_from_dict({"max_gpu_budget": 2 * gpus}), h200, SimOptions())  # one of each fits
