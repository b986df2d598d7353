"""`fleetplan plan`: the core over a file, with clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import orjson
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
    assert [d["decision_id"] for d in decisions] == [0, 1, 2, 3, 4]
    # prefill follows the code trace's burst in the fourth minute (531 requests)
    assert [d["targets"]["prefill"] for d in decisions] == [3, 2, 9, 3, 4]
    # the acks in the log match the decisions the core just made
    acks = [orjson.loads(x) for x in EXAMPLE.read_bytes().splitlines() if b'"type":"ack"' in x]
    assert [a["decision_id"] for a in acks] == [0, 1, 2, 3, 4]
    assert [a["observed"] for a in acks] == [d["targets"] for d in decisions]
    # the clock heartbeats move the ticks through quiet minutes: no event arrives late
    assert "late" not in result.stderr
    ticks = (tmp_path / "ticks.jsonl").read_bytes().splitlines()
    assert len(ticks) == 10  # one per minute boundary up to the last ack at 640.5 s

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
    assert len(result.stdout.splitlines()) == 5  # every decision, the bad line skipped
    assert ":1: message: valid JSON" in result.output


def test_bad_config_fails_fast(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ttft_ms: fast\n")
    result = _plan("--events", EXAMPLE, "--config", cfg)
    assert result.exit_code == 2
    assert "ttft_ms: Input should be a valid number" in result.output
