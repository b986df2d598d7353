"""The simulated vLLM engine breaks where DistServe's measured one does.

DistServe's vLLM runs of OPT-13B on one A100 (bundled in data/distserve,
see its README) replayed request for request. With the kernel-profiled
coefficients as given the engine is too fast under load and its TTFT p90
breaks one rate step late; with the host's per-sequence step cost fitted on
TPOT *below* the knee, the knee (not fitted) lands where it was measured.
"""

from __future__ import annotations

from pathlib import Path

from bench.calibrate import fit_host_ms, knee, replay_vllm, vllm_runs
from fleetplan.sim.profile_convert import distserve_profile

DATA = Path(__file__).parent / "data" / "distserve"
COEFFICIENTS = DATA / "profiler-a100-80g.vllm.json"


def test_fitted_host_cost_moves_the_knee_to_the_measured_rate():
    runs = vllm_runs(DATA)
    rates = [r["rate"] for r in runs]
    measured = knee(rates, [r["ttft"][1] for r in runs])
    assert measured == (2.5, 3.0)

    fitted, errors, below = fit_host_ms(runs, COEFFICIENTS)
    assert [rates[i] for i in below] == [1.0, 1.5, 2.0, 2.0, 2.5]  # only runs under the knee are fitted
    assert 0.2 <= fitted <= 0.5
    assert min(errors) < 0.5 * errors[0]  # the term explains half the TPOT error

    given = replay_vllm(runs, distserve_profile(COEFFICIENTS, "facebook/opt-13b", 1))
    host = replay_vllm(runs, distserve_profile(COEFFICIENTS, "facebook/opt-13b", 1, host_ms_per_seq=fitted))
    assert knee(rates, [g[0][1] for g in given]) == (3.0, 3.5)  # one step late as given
    assert knee(rates, [h[0][1] for h in host]) == measured
