"""An empty path option is refused by name before a command does anything.

Typer turns ``""`` into ``Path(".")``, so ``simulate --out "$DIR"`` with
``DIR`` unset wrote events.jsonl, summary.json and report.html into the
working directory, over whatever was there, and ``plan --events ""`` read
a directory. ``.`` still means the working directory.
"""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app

runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def registered():
    _register_optional()


@pytest.mark.parametrize(("command", "option"), [
    ("plan", "--events"), ("plan", "--config"), ("plan", "--reports"), ("plan", "--seed-out"),
    ("simulate", "--trace"), ("simulate", "--config"), ("simulate", "--out"),
    ("simulate", "--servegen"), ("simulate", "--retune"),
    ("worker", "--config"), ("worker", "--datadir"),
    ("audit", "--log"), ("audit", "--report"), ("audit", "--seed-out"),
    ("connector", "--kubeconfig"),
])
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_path_is_refused_naming_the_option(command, option, empty, tmp_path):
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = runner.invoke(app, [command, option, empty])
    finally:
        os.chdir(before)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())  # the error box wraps its line
    assert f"Invalid value for '{option}': an empty path" in text
    assert list(tmp_path.iterdir()) == []  # nothing written where the command ran


def test_a_dot_is_still_the_working_directory():
    from fleetplan.options import path_value

    assert path_value(".") == path_value("./") and str(path_value(".")) == "."
