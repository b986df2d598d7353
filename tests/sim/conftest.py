"""Fixtures for simulator tests: the bundled profile, engines on a private clock."""

from __future__ import annotations

import pytest

from fleetplan.models.config import config_from_dict
from fleetplan.models.perf import EngineLimits
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.engines import Engine
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.runner import SimOptions, make_setup
from fleetplan.sim.timing import engine_timing
from tests.sim.sim_helpers import Recorder


@pytest.fixture(scope="session")
def h200():
    return load_profile("h200-llama3.1-8b")


@pytest.fixture(scope="session")
def timing(h200):
    return engine_timing(h200)


@pytest.fixture(scope="session")
def limits(h200):
    return EngineLimits(max_kv_tokens=h200.max_kv_tokens)


@pytest.fixture
def make_engine(timing, limits):
    def make(role: str, clock: VirtualClock | None = None, limits_=None, recorder=None, **kw):
        clock = clock or VirtualClock()
        recorder = recorder or Recorder()
        engine = Engine(f"{role}-0", role, 1, timing, limits_ or limits, clock, recorder, 0.0, **kw)
        engine.state = "ready"
        return engine, clock, recorder

    return make


@pytest.fixture
def make_setup_for(h200):
    def make(**config):
        options = config.pop("options", SimOptions())
        cfg = config_from_dict({"load_predictor": "constant", "max_gpu_budget": 64, **config})
        return make_setup(cfg, h200, options)

    return make
