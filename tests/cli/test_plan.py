"""`fleetplan plan`: the core over a file, with clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from fleetplan.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "events" / "azure_code_10min.jsonl"
CONFIG = ROOT / "examples" / "configs" / "plan.yaml"
runner = CliRunner()


def _plan(*args):
    return runner.invoke(app, ["plan", *map(str, args)])


def test_plan_reproduces_the_recorded_decisions(tmp_path):
    result = _plan("--events", EXAMPLE, "--config", CONFIG, "--profile", "h100-llama3.3-70b",
                   "--reports", tmp_path / "ticks.jsonl")
    assert result.exit_code == 0, result.output
    decisions = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [d["decision_id"] for d in decisions] == [0, 1, 2, 3]
    # prefill follows the code trace's burst in the fourth minute (531 requests); before it, two idle
    # minutes release nothing, since no forecast has been scored yet (hold_until_scored: all)
    assert [d["targets"]["prefill"] for d in decisions] == [3, 11, 10, 3]
    # the acks in the log match the decisions the core just made
    acks = [orjson.loads(x) for x in EXAMPLE.read_bytes().splitlines() if b'"type":"ack"' in x]
    assert [a["decision_id"] for a in acks] == [0, 1, 2, 3]
    assert [a["observed"] for a in acks] == [d["targets"] for d in decisions]
    # the clock heartbeats move the ticks through quiet minutes: no event arrives late
    assert "late" not in result.stderr
    ticks = [orjson.loads(line) for line in (tmp_path / "ticks.jsonl").read_bytes().splitlines()]
    assert len(ticks) == 9  # one per minute boundary up to the last ack at 540.5 s
    assert ticks[2]["throughput_reason"] == "held_until_scored"  # 180 s: prefill 3 -> 2 held

def test_bad_line_names_file_line_and_field(tmp_path):
    log = tmp_path / "bad.jsonl"
    lines = EXAMPLE.read_bytes().splitlines()[:3]
    lines.append(b'{"type":"fpm","deployment":"code","time":1,"role":"prefill","worker_id":"w","wall_time":-2}')
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = _plan("--events", log)
    assert result.exit_code == 2
    assert f"{log}:4: wall_time: Input should be greater than or equal to 0" in result.output


def test_skip_invalid_keeps_going(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_bytes(b"not json\n" + EXAMPLE.read_bytes())
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b", "--skip-invalid")
    assert result.exit_code == 0
    assert len(result.stdout.splitlines()) == 4  # every decision, the bad line skipped
    assert ":1: message: valid JSON" in result.output


def test_bad_config_fails_fast(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ttft_ms: fast\n")
    result = _plan("--events", EXAMPLE, "--config", cfg)
    assert result.exit_code == 2
    assert "ttft_ms: Input should be a valid number" in result.output


def _decisions_of(log, tmp_path, name):
    reports = tmp_path / f"{name}.reports.jsonl"
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b", "--reports", reports)
    return result, reports.read_bytes()


def test_a_bad_line_keeps_the_decisions_folded_before_it(tmp_path):
    lines = EXAMPLE.read_bytes().splitlines()
    cut = 1200  # past the burst: decisions 0-2 are made from the lines before it
    head = tmp_path / "head.jsonl"
    head.write_bytes(b"\n".join(lines[:cut - 1]) + b"\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([*lines[:cut - 1], lines[cut - 1][:40], *lines[cut:]]) + b"\n")
    expected, expected_reports = _decisions_of(head, tmp_path, "head")
    result, reports = _decisions_of(bad, tmp_path, "bad")
    assert result.exit_code == 2
    assert f"{bad}:{cut}: message: valid JSON" in result.stderr
    decisions = [orjson.loads(x) for x in result.stdout.splitlines()]
    assert len(decisions) >= 3 and result.stdout == expected.stdout  # what `head` of the file prints
    assert reports == expected_reports and reports


def test_a_truncated_last_line_keeps_every_decision_before_it(tmp_path):
    data = EXAMPLE.read_bytes().rstrip(b"\n")
    log = tmp_path / "trunc.jsonl"
    log.write_bytes(data[: len(data) - 30])  # the writer died mid-line
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b")
    assert result.exit_code == 2
    assert f"{log}:1951: message: valid JSON" in result.stderr
    assert [orjson.loads(x)["decision_id"] for x in result.stdout.splitlines()] == [0, 1, 2, 3]


def test_a_reports_path_that_cannot_be_written_fails_before_folding(tmp_path):
    target = tmp_path / "no" / "dir" / "r.jsonl"
    result = _plan("--events", EXAMPLE, "--config", CONFIG, "--reports", target)
    assert result.exit_code == 2
    assert result.stdout == ""  # nothing folded
    assert f"fleetplan: error: --reports: cannot write {target} (No such file or directory)" in result.stderr
    result = _plan("--events", EXAMPLE, "--config", CONFIG, "--reports", tmp_path)
    assert result.exit_code == 2 and f"--reports: cannot write {tmp_path} (Is a directory)" in result.stderr
    log = tmp_path / "log.jsonl"
    log.write_bytes(EXAMPLE.read_bytes())
    result = _plan("--events", log, "--config", CONFIG, "--reports", log)
    assert result.exit_code == 2 and "--reports: is the --events file" in result.stderr
    assert log.read_bytes() == EXAMPLE.read_bytes()  # the input is not truncated


def test_seed_out_writes_the_windows_a_new_planner_starts_from(tmp_path):
    from fleetplan.bootstrap import build_planner
    from fleetplan.eventlog import read_events
    from fleetplan.models.fleet import Fleet
    from fleetplan.schemas import ClockEvent, decode_event

    seeds = tmp_path / "seed.jsonl"
    result = _plan("--events", EXAMPLE, "--config", CONFIG, "--profile", "h100-llama3.3-70b", "--seed-out", seeds)
    assert result.exit_code == 0, result.output
    (line,) = seeds.read_bytes().splitlines()
    seed = decode_event(line)
    assert seed.body.command == "seed_traffic" and seed.issued_by == "fleetplan"

    # the windows are the ones the fold fed its forecaster, every one of them here
    original = Fleet(build_planner(CONFIG, "h100-llama3.3-70b"))
    original.run(read_events(EXAMPLE))
    state = original.state(seed.deployment)
    assert [w.start_s for w in seed.body.windows] == [row[0] for row in state.traffic_history]
    assert len(seed.body.windows) == state.forecaster.windows_seen == 9
    assert seed.time == state.max_time >= seed.body.windows[-1].end_s

    # a new planner started from the seed forecasts what the one that saw the traffic does
    fresh = Fleet(build_planner(CONFIG, "h100-llama3.3-70b"))
    fresh.run([seed, ClockEvent(deployment=seed.deployment, time=seed.time + 62.0)])  # its tick, and no traffic
    moved = fresh.state(seed.deployment)
    assert moved.rejected_controls == 0 and moved.forecaster.windows_seen == 9
    assert moved.forecaster.forecast() == state.forecaster.forecast()


def test_seed_out_with_a_warm_up_trace_writes_the_live_windows(tmp_path):
    """The warm-up trace's windows have no start time and stay out of the seed (until 2026-12-05
    --seed-out crashed adding to their None start)."""
    from fleetplan.schemas import decode_event

    trace = tmp_path / "warm.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,2000,150\n" for i in range(600)))
    config = tmp_path / "warm.yaml"
    config.write_text(CONFIG.read_text() + f"load_predictor_warmup_trace: {trace}\n")
    seeds = tmp_path / "seed.jsonl"
    result = _plan("--events", EXAMPLE, "--config", config, "--profile", "h100-llama3.3-70b", "--seed-out", seeds)
    assert result.exit_code == 0, result.output
    (line,) = seeds.read_bytes().splitlines()
    windows = decode_event(line).body.windows
    assert len(windows) == 9 and all(w.start_s is not None for w in windows)


def test_seed_out_refuses_the_events_file():
    result = _plan("--events", EXAMPLE, "--seed-out", EXAMPLE)
    assert result.exit_code == 2
    assert "--seed-out: is the --events file" in result.stderr


def test_the_audit_writes_the_same_seed_from_its_refold(tmp_path):
    from fleetplan.cli import _register_optional

    _register_optional()
    planned, audited = tmp_path / "plan.jsonl", tmp_path / "audit.jsonl"
    assert _plan("--events", EXAMPLE, "--config", CONFIG, "--profile", "h100-llama3.3-70b",
                 "--seed-out", planned).exit_code == 0
    result = runner.invoke(app, ["audit", "--log", str(EXAMPLE), "--deployment", "code", "--config", str(CONFIG),
                                 "--profile", "h100-llama3.3-70b", "--seed-out", str(audited)])
    # the example log records no decisions, so the audit fails; the seed is the re-fold's all the same
    assert result.exit_code == 1 and "DIVERGED at decision 0" in result.stdout, result.output
    assert f"seed: {audited}" in result.stdout
    assert audited.read_bytes() == planned.read_bytes()


def test_a_mistyped_events_path_leaves_the_outputs_as_they_were(tmp_path):
    reports = tmp_path / "previous.jsonl"
    reports.write_bytes(b"yesterday's reports\n")
    result = _plan("--events", tmp_path / "typo.jsonl", "--config", CONFIG, "--reports", reports)
    assert result.exit_code == 2 and "typo.jsonl: cannot open event log" in result.stderr
    assert reports.read_bytes() == b"yesterday's reports\n"


def test_a_gz_events_file_that_is_not_gzip_leaves_the_outputs_as_they_were(tmp_path):
    """gzip reads its header on the first read, not at open: the check reads a line
    (until 2026-12-05 such a file emptied --reports, then failed)."""
    log = tmp_path / "plain.jsonl.gz"
    log.write_bytes(EXAMPLE.read_bytes())
    reports = tmp_path / "previous.jsonl"
    reports.write_bytes(b"yesterday's reports\n")
    result = _plan("--events", log, "--config", CONFIG, "--reports", reports)
    assert result.exit_code == 2 and "plain.jsonl.gz: not a gzip file" in result.stderr
    assert reports.read_bytes() == b"yesterday's reports\n"


def test_a_set_config_the_worker_would_dead_letter_is_a_bad_line(tmp_path):
    log = tmp_path / "with_control.jsonl"
    lines = EXAMPLE.read_bytes().splitlines()
    control = {"type": "control", "deployment": "code", "time": 1.0,
               "body": {"command": "set_config", "changes": {"ttft_msx": 3}}}
    lines.insert(2, orjson.dumps(control))
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b")
    assert result.exit_code == 2
    assert f"{log}:3: body.changes: set_config: ttft_msx: unknown field" in result.stderr
    skipped = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b", "--skip-invalid")
    assert skipped.exit_code == 0 and len(skipped.stdout.splitlines()) == 4
    assert "skipped" in skipped.stderr and ":3: body.changes" in skipped.stderr


def test_a_set_config_naming_one_field_twice_is_a_bad_line(tmp_path):
    """By its name and its Dynamo alias: the tick refused it (rejected_controls), so intake does."""
    log = tmp_path / "with_control.jsonl"
    lines = EXAMPLE.read_bytes().splitlines()
    control = {"type": "control", "deployment": "code", "time": 1700000040.0,
               "body": {"command": "set_config", "changes": {"ttft": 300, "ttft_ms": 200}}}
    lines.insert(2, orjson.dumps(control))
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b")
    assert result.exit_code == 2
    assert f"{log}:3: body.changes: set_config: ttft_ms: the same field as ttft, given both" in result.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_line_naming_the_output():
    result = _plan("--events", EXAMPLE, "--config", CONFIG, "--profile", "h100-llama3.3-70b",
                   "--reports", "/dev/full")
    assert result.exit_code == 2
    assert result.stderr.strip() == "fleetplan: error: --reports: cannot write /dev/full (No space left on device)"


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="needs /dev/fd")
def test_a_log_from_a_pipe_is_read_once(tmp_path):
    """``--events <(zcat log.gz)`` or ``/dev/stdin``: a pipe cannot be read twice. Until
    2026-12-05 the check before the outputs were opened read its first lines and dropped
    them, and the fold stopped at line 1 (mid-line) with no decision."""
    import contextlib
    import os
    import threading

    read_end, write_end = os.pipe()

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), os.fdopen(write_end, "wb") as fh:
            fh.write(EXAMPLE.read_bytes())  # a reader that stops early closes the pipe

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        result = _plan("--events", f"/dev/fd/{read_end}", "--config", CONFIG, "--profile", "h100-llama3.3-70b")
    finally:
        os.close(read_end)
        writer.join()
    assert result.exit_code == 0, result.output
    assert [orjson.loads(x)["decision_id"] for x in result.stdout.splitlines()] == [0, 1, 2, 3]


def test_an_output_that_is_the_events_file_by_another_name_is_refused(tmp_path):
    """A hard link names the same file by another path: until 2026-12-05 only the resolved
    paths were compared, so --reports emptied the log before it was read (exit 0, nothing)."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(EXAMPLE.read_bytes())
    alias = tmp_path / "alias.jsonl"
    alias.hardlink_to(log)
    for option in ("--reports", "--seed-out"):
        result = _plan("--events", log, "--config", CONFIG, option, alias)
        assert result.exit_code == 2 and f"{option}: is the --events file" in result.stderr
        assert log.read_bytes() == EXAMPLE.read_bytes()


def test_an_output_that_is_the_config_or_the_profile_file_is_refused(tmp_path):
    """They are inputs too: until 2026-12-05 only --events was guarded, so --reports naming the
    config replaced it with tick reports (exit 0), and the next run could not load it."""
    config = tmp_path / "plan.yaml"
    config.write_bytes(CONFIG.read_bytes())
    bundled = ROOT / "sim" / "profile_data" / "h100_sxm__vllm__nvidia__Llama-3.3-70B-Instruct-FP8"
    for role in ("prefill", "decode"):
        (tmp_path / f"h100__{role}.npz").write_bytes(Path(f"{bundled}__{role}.npz").read_bytes())
    profile = tmp_path / "h100__prefill.npz"
    kept = profile.read_bytes()
    for option in ("--reports", "--seed-out"):
        for source_option, source in (("--config", config), ("--profile", profile)):
            result = _plan("--events", EXAMPLE, "--config", config, "--profile", profile, option, source)
            assert result.exit_code == 2, result.output
            assert f"{option}: is the {source_option} file" in result.stderr
            assert result.stdout == ""  # refused at start
    assert config.read_bytes() == CONFIG.read_bytes() and profile.read_bytes() == kept


def test_reports_and_seed_out_in_one_file_are_refused(tmp_path):
    """Two handles on one file: until 2026-12-05 the seed was written over the first reports,
    a line cut in two (exit 0)."""
    both = tmp_path / "out.jsonl"
    result = _plan("--events", EXAMPLE, "--config", CONFIG, "--reports", both, "--seed-out", both)
    assert result.exit_code == 2 and "--seed-out: is the --reports file" in result.stderr
    assert result.stdout == "" and not both.exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_output_that_fails_does_not_hide_the_lines_skipped_before_it(tmp_path):
    """The skipped lines and the late count were printed after the output check, so a full disk
    (or a closed pipe) hid which input lines the run had left out (until 2026-12-05)."""
    log = tmp_path / "bad.jsonl"
    log.write_bytes(b"not json\n" + EXAMPLE.read_bytes())
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b", "--skip-invalid",
                   "--reports", "/dev/full")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"fleetplan: skipped {log}:1: message: valid JSON")
    assert lines[-1] == "fleetplan: error: --reports: cannot write /dev/full (No space left on device)"


@pytest.mark.parametrize("content", [b"", b"\n\n", None], ids=["empty", "blank", "decisions only"])
def test_a_log_without_an_input_event_is_refused_as_the_audit_refuses_it(tmp_path, content):
    """An empty log, or one of decisions alone (which the fold skips), printed nothing and
    exited 0 (until 2026-12-05), as if the planner had decided nothing from real traffic."""
    log = tmp_path / "e.jsonl"
    if content is None:  # the decisions a plan of the example prints
        content = _plan("--events", EXAMPLE, "--config", CONFIG, "--profile", "h100-llama3.3-70b").stdout_bytes
        assert content
    log.write_bytes(content)
    result = _plan("--events", log, "--config", CONFIG, "--profile", "h100-llama3.3-70b")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"fleetplan: error: {log}: no events"
