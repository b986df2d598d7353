"""bench/remeasure.py: the rows asked for are run again in place, the others kept, a bad row named.

It runs on a data folder laid out like the shared one, holding only the
first 30 requests of the Azure code trace (tests/data/traces), so a run takes
a second or two.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetplan.sim import REVISION
from tests.sim.sim_helpers import InlinePool, sizing_tasks

ROOT = Path(__file__).parents[2]
CODE_HEAD = ROOT / "tests" / "data" / "traces" / "azure2023_code_head30.csv"


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data" / "traces" / "azure2023"
    folder.mkdir(parents=True)
    shutil.copy(CODE_HEAD, folder / "AzureLLMInferenceTrace_code_first30min.csv")
    return tmp_path / "data"


def _row(policy: str, **fields) -> dict:
    return {"workload": "azure-code-30min", "scale": 1.0, "sla": [500.0, 50.0], "policy": policy,
            "attainment": 0.5, "gpu_hours": 99.0, **fields}


def _remeasure(data: Path, runs: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "remeasure.py"), str(runs), "--data", str(data), *args],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )


def test_the_policies_asked_for_are_run_again_and_the_rest_kept(data, tmp_path):
    runs = tmp_path / "runs.json"
    rows = [
        _row("fleetplan (ensemble)"),
        _row("reference forecast (constant) util0.8", note="kept as it was"),
        _row("fleetplan (ensemble)"),  # a repeated row runs once and both copies take its figures
    ]
    runs.write_text(json.dumps({"sla": [500.0, 50.0], "rows": rows}))
    out = tmp_path / "new.json"
    done = _remeasure(data, runs, "--only-policies", "fleetplan (ensemble)", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "1 runs for 2 rows" in done.stdout
    assert json.loads(runs.read_text())["rows"] == rows  # --out leaves the file alone
    new = json.loads(out.read_text())["rows"]
    assert new[1] == rows[1]
    assert new[0] == new[2]
    assert new[0]["policy"] == "fleetplan (ensemble)" and new[0]["sim_revision"] == REVISION
    assert new[0]["requests"] == 30 and 0.0 <= new[0]["attainment"] <= 1.0
    assert 0.0 < new[0]["gpu_hours"] < 99.0


def test_a_row_on_a_held_out_engine_at_another_draw_runs_again_on_that_engine(data, tmp_path):
    runs = tmp_path / "runs.json"
    row = _row("fleetplan (ensemble)", workload="azure-code-30min-h100-llama3.3-70b-tp4-extend-seed1",
               profile="h100-llama3.3-70b", tp=4, timing="interp-extend")
    runs.write_text(json.dumps({"sla": [500.0, 50.0], "rows": [row]}))
    done = _remeasure(data, runs)
    assert done.returncode == 0, done.stderr
    (new,) = json.loads(runs.read_text())["rows"]
    engine = ("workload", "profile", "tp", "timing")
    assert {k: new[k] for k in engine} == {k: row[k] for k in engine}
    assert new["requests"] == 30 and new["gpu_hours"] < 99.0


def test_a_row_it_cannot_run_is_named_before_anything_runs(data, tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"sla": [500.0, 50.0], "rows": [
        _row("fleetplan (ensemble)"), _row("fleetplan (nonsense)")]}))
    done = _remeasure(data, runs)
    assert done.returncode == 2
    assert "row 1: policy 'fleetplan (nonsense)' is not a bench/sizing.py variant" in done.stderr
    assert json.loads(runs.read_text())["rows"][0]["attainment"] == 0.5  # nothing was rewritten


def _spec_of(data: Path, workload: str, **fields):
    """The workload bench/remeasure.py would run a row of ``workload`` on, with ``data`` its --data
    (None: it refuses the row)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import remeasure
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return remeasure.workload_spec({"workload": workload, **fields}, remeasure._known(data))


def test_a_servegen_day_of_the_week_warmed_or_not_is_a_workload_it_knows(tmp_path):
    warm = _spec_of(tmp_path, "servegen-m-large-24h-day4-warm4d")
    assert (warm.model, warm.start_day, warm.warm_days) == ("m-large", 4, 4)
    assert _spec_of(tmp_path, "servegen-m-mid-24h-day6").start_day == 6
    assert _spec_of(tmp_path, "servegen-m-mid-24h-day2-warm3d") is None  # more warm days than the week has before it
    assert _spec_of(tmp_path, "azure-code-30min").kind == "trace"


def test_a_shape_kept_trace_is_a_workload_it_knows(tmp_path):
    """bench/sizing.py --rate-scale-shift S names its rows TRACE-shiftS; they were refused as
    'not one bench/sizing.py runs', so bench/results/shape-kept/ could not be re-measured."""
    kept = _spec_of(tmp_path, "azure-conv-30min-shift30")
    assert (kept.kind, kept.shift, kept.path) == ("trace", 30.0, _spec_of(tmp_path, "azure-conv-30min").path)
    assert _spec_of(tmp_path, "mooncake-conv-30min-spread-shift7.5").shift == 7.5
    assert _spec_of(tmp_path, "servegen-m-large-24h-shift30") is None
    assert _spec_of(tmp_path, "azure-conv-30min-shiftx") is None


def test_a_draw_a_held_out_engine_and_the_other_engine_timing_are_workloads_it_knows(tmp_path):
    """Rows at another seed (-seedN), on a held-out engine (-PROFILE[-tpN]) or timed past the profile's
    rows the other way (-extend) were refused too: bench/results/draws/, other-engine/ and engine-timing/
    could not be re-measured. The engine is the one the row records, and its suffix has to say so."""
    tp4 = {"profile": "h100-llama3.3-70b", "tp": 4, "timing": "interp-extend"}
    spec = _spec_of(tmp_path, "azure-conv-30min-h100-llama3.3-70b-tp4-extend-shift30-seed2", **tp4)
    assert (spec.name, spec.profile, spec.tp, spec.timing, spec.shift, spec.seed) == (
        "azure-conv-30min-h100-llama3.3-70b-tp4-extend-shift30-seed2", "h100-llama3.3-70b", 4, "interp-extend",
        30.0, 2)
    assert spec.path == _spec_of(tmp_path, "azure-conv-30min").path
    day = _spec_of(tmp_path, "servegen-m-mid-24h-day5-warm5d-seed1", profile="h100-llama3.3-70b")
    assert (day.start_day, day.warm_days, day.seed) == (5, 5, 1)
    assert _spec_of(tmp_path, "azure-conv-30min-h100-llama3.3-70b-tp4-seed2", profile="h100-llama3.3-70b") is None
    assert _spec_of(tmp_path, "azure-conv-30min-h100-llama3.3-70b-tp4-extend", profile="h100-llama3.3-70b", tp=4) is None
    assert _spec_of(tmp_path, "servegen-m-mid-24h-h100-llama3.3-70b", profile="h100-llama3.3-70b") is None


@pytest.mark.parametrize("argv", [
    ("--only", "conv,m-mid", "--seeds", "0,2", "--rate-scale-shift", "30"),
    ("--only", "conv,code", "--profile", "h100-llama3.3-70b", "--tp", "4", "--engine-timing", "interp-extend",
     "--seeds", "1"),
    ("--only", "m-mid", "--day", "5", "--warm-days", "5", "--seeds", "0,1"),
])
def test_a_row_is_run_again_on_the_workload_sizing_ran_it_on(monkeypatch, argv):
    """What bench/sizing.py ran each row on, bench/remeasure.py rebuilds from the row alone."""
    from dataclasses import replace

    tasks = sizing_tasks(monkeypatch, "--no-oracle", "--variants", "fleetplan (ensemble)", *argv,
                         choose=lambda spec, target, integer: replace(spec, scale=5.0))
    assert tasks
    for spec, _, _ in tasks:
        row = {"profile": spec.profile, **({} if spec.tp is None else {"tp": spec.tp}),
               **({} if spec.timing == "interp" else {"timing": spec.timing})}
        assert replace(_spec_of(Path("/nonexistent"), spec.name, **row), scale=spec.scale) == spec  # sizing's --data


def test_every_committed_row_is_one_it_can_run_again(tmp_path):
    """So that a change of the simulator can bring every file of bench/results/ up to it."""
    paths = sorted((ROOT / "bench" / "results").rglob("*.json"))
    rows = [row for path in paths for row in json.loads(path.read_text())["rows"]]
    assert len(rows) > 4000
    for row in rows:
        spec = _spec_of(tmp_path, row["workload"], **{k: row[k] for k in ("profile", "tp", "timing") if k in row})
        assert spec is not None, row["workload"]
        assert (spec.name, spec.tp, spec.timing) == (row["workload"], row.get("tp"), row.get("timing", "interp"))


def test_a_run_stopped_partway_keeps_the_rows_it_finished(monkeypatch, tmp_path):
    """The file is written after each row: re-running the ServeGen days takes hours, and a stop
    after the first row used to lose it with the rest."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import remeasure

    runs = tmp_path / "runs.json"
    rows = [_row("fleetplan (ensemble)"), _row("reference forecast (constant) util0.8")]
    runs.write_text(json.dumps({"sla": [500.0, 50.0], "rows": rows}))

    class StoppedAfterOneRow(InlinePool):
        """A pool whose run is stopped (^C) once the first row is back."""

        def map(self, task, tasks):
            index, spec, sla, policy = tasks[0]
            yield index, {**rows[index], "attainment": 0.75, "gpu_hours": 1.5, "sim_revision": REVISION}
            raise KeyboardInterrupt

    monkeypatch.setattr(remeasure, "ProcessPoolExecutor", StoppedAfterOneRow)
    monkeypatch.setattr(sys, "argv", ["remeasure.py", str(runs), "--data", str(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        remeasure.main()
    kept = json.loads(runs.read_text())["rows"]
    assert (kept[0]["attainment"], kept[0]["gpu_hours"], kept[0]["sim_revision"]) == (0.75, 1.5, REVISION)
    assert kept[1] == rows[1]  # not run again: as it was
    assert [p.name for p in tmp_path.iterdir()] == ["runs.json"]  # no half-written file left beside it
