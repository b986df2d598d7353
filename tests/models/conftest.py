"""Fixtures for core tests: planners built the same way everywhere."""

from __future__ import annotations

import pytest

from fleetplan.models.config import config_from_dict
from fleetplan.models.fleet import Fleet
from fleetplan.models.planner import Planner
from fleetplan.sim.profiles import load_profile


@pytest.fixture(scope="session")
def h200():
    return load_profile("h200-llama3.1-8b")


@pytest.fixture
def make_fleet(h200):
    def make(profile=True, **config) -> Fleet:
        cfg = config_from_dict({"load_predictor": "constant", "max_gpu_budget": 64, **config})
        return Fleet(Planner(cfg, profile=h200 if profile else None))

    return make


