"""The load loop's decode scale-down: Dynamo's absolute bound and the bound above the engine's floor."""

from __future__ import annotations

import numpy as np
import pytest

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.load import EngineLoads, decode_signal
from fleetplan.models.perf import seeded_perf_model
from fleetplan.sim.profiles import load_profile
from tests.models.factories import T0, fpm


def _light_decode_model(profile_name: str, seqs: int, kv_per_seq: int):
    """A decode model seeded from the profile that then saw engines holding ``seqs`` short sequences."""
    model = seeded_perf_model(load_profile(profile_name), "decode")
    wall = model.fit().predict(seqs, seqs * kv_per_seq)
    for i in range(200):
        model.observe(fpm("d0", "decode", T0 + i, wall=wall, decode_reqs=seqs,
                          decode_kv=seqs * kv_per_seq, counter=i))
    return model


def _loads(kv_per_engine: list[float]) -> EngineLoads:
    kv = np.array(kv_per_engine, dtype=np.float64)
    return EngineLoads(np.zeros_like(kv), kv, np.zeros_like(kv))


def _cfg(rule: str, itl: float = 20.0):
    return config_from_dict({"itl": itl, "decode_scale_down": rule})


def test_the_70b_engine_is_above_dynamos_bound_alone():
    model = _light_decode_model("h100-llama3.3-70b", seqs=1, kv_per_seq=600)
    floor = model.estimate_itl_floor_ms(1.0)
    assert 0.8 * 20 < floor < 20  # one sequence: over 16 ms, under the target


def test_absolute_bound_never_releases_an_idle_70b_engine_and_the_floor_bound_does():
    model = _light_decode_model("h100-llama3.3-70b", seqs=1, kv_per_seq=600)
    loads = _loads([600.0, 600.0, 600.0])
    locked = decode_signal(_cfg("absolute"), model, loads, 1.0)
    freed = decode_signal(_cfg("above_floor"), model, loads, 1.0)
    assert locked.step == 0 and locked.reason == "scale_down_refused_consolidation"
    assert freed.step == -1 and freed.reason == "scale_down"


def test_the_floor_bound_still_refuses_engines_near_the_target():
    model = _light_decode_model("h100-llama3.3-70b", seqs=1, kv_per_seq=600)
    floor = model.estimate_itl_floor_ms(1.0)
    bound = floor + 0.8 * (20 - floor)
    lo, hi = 0.0, 1e6  # the KV per engine at which one engine fewer reaches the bound
    for _ in range(60):
        mid = (lo + hi) / 2
        post = model.estimate_itl_ms_many(np.array([mid]), 1.0, load_scale=1.5)[0]
        lo, hi = (mid, hi) if post < bound else (lo, mid)
    over = decode_signal(_cfg("above_floor"), model, _loads([hi * 1.05] * 3), 1.0)
    under = decode_signal(_cfg("above_floor"), model, _loads([lo * 0.95] * 3), 1.0)
    assert over.step == 0 and over.reason == "scale_down_refused_consolidation"
    assert under.step == -1


@pytest.mark.parametrize("itl", [15.0, 17.0])
def test_no_bound_releases_an_engine_whose_floor_is_the_target(itl):
    """At or below the floor no fleet meets the target: scale-down stays off."""
    model = _light_decode_model("h100-llama3.3-70b", seqs=1, kv_per_seq=600)
    assert model.estimate_itl_floor_ms(1.0) > itl
    sig = decode_signal(_cfg("above_floor", itl), model, _loads([0.0, 0.0]), 1.0)
    assert sig.step == 1  # every engine over the target: the loop asks for more, never fewer


def test_on_the_8b_engine_the_bounds_agree_where_the_floor_is_small():
    """At 500/50 the floor (≈ 6 ms) moves the bound by 1.3 ms of 40: the same verdicts on
    light and on loaded engines."""
    model = _light_decode_model("h200-llama3.1-8b", seqs=8, kv_per_seq=1500)
    for kv in (2_000.0, 60_000.0, 400_000.0):
        loads = _loads([kv] * 4)
        a = decode_signal(_cfg("absolute", 50.0), model, loads, 1.0)
        b = decode_signal(_cfg("above_floor", 50.0), model, loads, 1.0)
        assert (a.step, a.reason) == (b.step, b.reason)


def test_reference_sizing_keeps_dynamos_rule():
    assert config_from_dict(dict(REFERENCE_SIZING)).decode_scale_down == "absolute"
    assert config_from_dict({}).decode_scale_down == "above_floor"
