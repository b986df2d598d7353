"""Fixtures for core tests: planners built the same way everywhere."""

from __future__ import annotations

import pytest

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.fleet import Fleet
from fleetplan.models.planner import Planner
from fleetplan.sim.profiles import load_profile


@pytest.fixture(scope="session")
def h200():
    return load_profile("h200-llama3.1-8b")


@pytest.fixture
def make_fleet(h200):
    def make(profile=True, sizing="reference", **config) -> Fleet:
        """Dynamo's sizing unless ``sizing="fleetplan"``: most tests check the reference's numbers."""
        base = dict(REFERENCE_SIZING) if sizing == "reference" else {}
        cfg = config_from_dict({"load_predictor": "constant", "max_gpu_budget": 64, **base, **config})
        return Fleet(Planner(cfg, profile=h200 if profile else None))

    return make


