"""bench/sizing.py's variants: each is a valid config, and each departure row departs.

docs/sizing.md reads "what each departure buys" off the ``defaults -…``
rows, so a row whose override the defaults already hold (or a misspelt
field) would report a departure that was never taken away.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleetplan.models.config import config_from_dict

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # bench scripts import each other by name
from sizing import (  # noqa: E402
    ABLATION,
    DEPARTURES,
    FORECAST_FRONTIER,
    FORECAST_FRONTIER_BACKLOG,
    LIVE,
    VARIANTS,
)

SLA = {"ttft_ms": 500.0, "itl_ms": 50.0}
BEST = {"prefill_capacity": "best"}  # the default until 2026-12-07, that every row before it ran with


def _before_backlog() -> object:
    """The default as the variants measured before 2026-12-07 ran against it: prefill at its best batch."""
    return config_from_dict({**SLA, **VARIANTS["fleetplan (ensemble)"], **BEST})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_is_a_valid_config(name):
    config_from_dict({**SLA, **VARIANTS[name]})


@pytest.mark.parametrize("name", [n for n in DEPARTURES if n != "defaults"])
def test_each_departure_changes_the_defaults(name):
    defaults = config_from_dict({**SLA, **VARIANTS["defaults"]})
    departed = config_from_dict({**SLA, **VARIANTS[name]})
    changed = {k for k in DEPARTURES[name] if getattr(departed, k) != getattr(defaults, k)}
    assert changed == set(DEPARTURES[name])


def test_the_defaults_row_is_the_default_config():
    assert config_from_dict({**SLA, **VARIANTS["defaults"]}) == config_from_dict(SLA)


def test_the_tokens_row_is_the_default_with_the_token_basis_asked_for_by_name():
    """docs/sizing.md's token-basis rows: fleetplan's defaults (``fleetplan (ensemble)``) with
    ``quantile_basis: tokens``, releasing on the first tick as they were run (``hold_until_scored:
    none``, the default until 2026-12-06), run when named, not with the ablation's list."""
    tokens = config_from_dict({**SLA, **VARIANTS["fleetplan (ensemble) tokens"]})
    default = _before_backlog()
    assert tokens.quantile_basis == "tokens" and default.quantile_basis == "floor_tokens"
    assert tokens.model_copy(update={"quantile_basis": "floor_tokens", "hold_until_scored": "all"}) == default
    assert "fleetplan (ensemble) tokens" not in ABLATION


def test_the_rows_measured_on_the_request_basis_keep_it():
    """``requests-basis`` is the default until 2026-12-06 (bench/results/floor-tokens), and decode's
    demand variants were measured on it, so they keep it: run again, they give their committed rows."""
    default = _before_backlog()
    before = config_from_dict({**SLA, **VARIANTS["fleetplan (ensemble) requests-basis"]})
    assert before == default.model_copy(update={"quantile_basis": "requests", "hold_until_scored": "none"})
    for demand in ("window", "weighted", "burst"):
        variant = config_from_dict({**SLA, **VARIANTS[f"fleetplan (ensemble) decode-{demand}"]})
        assert variant == before.model_copy(update={"decode_demand": demand})
    assert "fleetplan (ensemble) requests-basis" not in ABLATION


@pytest.mark.parametrize("name, hold, floor", [("hold-none", "none", "none"), ("hold-all", "all", "none"),
                                               ("hold-decode", "decode", "coverage"),
                                               ("floor-none", "decode", "none")])
def test_the_hold_rows_are_the_default_with_another_hold(name, hold, floor):
    """bench/results/hold-until-scored: the default before 2026-12-06's hold (every role released on the
    first tick) and every role held, as they ran before the floor's margin (none.json, all.json); the
    default until 2026-12-07, decode alone held (decode.json), and that default without the floor's
    margin (floor-headroom/none.json); nothing else changed, so each runs again to its rows."""
    default = _before_backlog()
    variant = config_from_dict({**SLA, **VARIANTS[f"fleetplan (ensemble) {name}"]})
    assert (default.hold_until_scored, default.floor_headroom) == ("all", "coverage")
    assert variant == default.model_copy(update={"hold_until_scored": hold, "floor_headroom": floor})
    assert f"fleetplan (ensemble) {name}" not in ABLATION


def test_every_variant_run_before_the_backlogged_rate_keeps_the_best_batch():
    """prefill_capacity: backlog is the default since 2026-12-07; every variant with rows run before
    it keeps prefill at its best batch, so it runs again to them. The defaults and the departures
    from them follow today's; ``best`` is today's default with the best batch, Dynamo's sizing has it."""
    default = config_from_dict({**SLA, **VARIANTS["fleetplan (ensemble)"]})
    assert default.prefill_capacity == "backlog"
    for name in VARIANTS:
        capacity = config_from_dict({**SLA, **VARIANTS[name]}).prefill_capacity
        if name in LIVE or name in FORECAST_FRONTIER_BACKLOG or name == "fleetplan (ensemble) backlog":
            assert capacity == "backlog", name
        elif name != "fleetplan (ensemble) backlog-all":
            assert capacity == "best", name
    assert config_from_dict({**SLA, **VARIANTS["fleetplan (ensemble) best"]}) == _before_backlog()
    assert config_from_dict({**SLA, **VARIANTS["dynamo"]}).prefill_capacity == "best"


def test_the_backlogged_frontier_is_the_reference_sweep_with_the_defaults_prefill_rate():
    assert len(FORECAST_FRONTIER_BACKLOG) == len(FORECAST_FRONTIER)
    for name, overrides in FORECAST_FRONTIER.items():
        assert FORECAST_FRONTIER_BACKLOG[f"{name} backlog"] == {**overrides, "prefill_capacity": "backlog"}
        assert overrides["prefill_capacity"] == "best"
