"""What the docs say the defaults and options are is what the code has.

docs/planner.md's config table is where a user reads a field's default, and
the docs name the CLI's options in prose and tables; both drift silently
when the code changes and the page does not. These read the pages and
compare them with ``PlannerConfig`` and the commands' typer parameters.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from typer.main import get_command

from fleetplan.cli import _register_optional, app
from fleetplan.models.config import REFERENCE_SIZING, PlannerConfig, field_names

ROOT = Path(__file__).parents[1]
PLANNER_MD = ROOT / "docs" / "planner.md"
TABLE_HEADER = "| field | default | meaning |"
NOT_A_VALUE = ("from inventory", "from profile")
"""Defaults the table describes in words: the field is unset (None) and filled in elsewhere."""


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _expand(name: str) -> list[str]:
    """``prefill_scale_{up,down}_queue_tokens`` -> both fields."""
    match = re.search(r"\{([^}]*)\}", name)
    if match is None:
        return [name]
    return [out for part in match.group(1).split(",")
            for out in _expand(name[:match.start()] + part + name[match.end():])]


def _value(text: str) -> object:
    text = text.strip().strip("`").replace("−", "-")
    if text in ("none", "null", *NOT_A_VALUE):
        return None
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return text


@cache
def config_table() -> dict[str, object]:
    """docs/planner.md's config table: field -> its documented default."""
    lines = PLANNER_MD.read_text().splitlines()
    start = lines.index(TABLE_HEADER) + 2
    table: dict[str, object] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        names_cell, default_cell, _ = _cells(line)
        names = [f for quoted in re.findall(r"`([^`]+)`", names_cell) for f in _expand(quoted)
                 if f in PlannerConfig.model_fields]  # the aliases (`ttft`) name the same fields
        defaults = [_value(d) for d in re.split(r", | / ", default_cell)]
        if len(defaults) == 1:
            defaults *= len(names)
        assert len(defaults) == len(names), f"planner.md: {names_cell}: {len(names)} fields, {default_cell!r}"
        table.update(zip(names, defaults, strict=True))
    return table


def test_the_config_table_lists_every_field():
    assert set(config_table()) == set(PlannerConfig.model_fields)


@pytest.mark.parametrize("name", sorted(PlannerConfig.model_fields))
def test_the_config_table_gives_each_fields_default(name):
    documented, actual = config_table()[name], PlannerConfig.model_fields[name].default
    if isinstance(actual, bool) or actual is None or isinstance(actual, str):
        assert documented == actual
    else:
        assert documented == pytest.approx(actual)


CONFIG_INTRO = re.compile(r"^## Config\n(.*?)^Checked when", re.S | re.M)
SIZING_BLOCK = re.compile(r"^### Sizing: where fleetplan's defaults leave the reference\n.*?^```yaml\n(.*?)^```", re.S | re.M)
DEFAULTS_NOT_DYNAMOS = ("optimization_target", "load_predictor", "profile_results_dir")
"""The fields outside ``REFERENCE_SIZING`` whose default is not Dynamo's 1.6.1 default
(``throughput``, ``arima``, ``profiling_results``: /work/shared/reference/dynamo-planner-notes.md §3)."""


def test_the_sizing_block_lists_every_sizing_default_that_is_not_dynamos():
    block = SIZING_BLOCK.search(PLANNER_MD.read_text()).group(1)
    listed = {line.split(":")[0] for line in block.splitlines() if line.strip()}
    differing = {f for f, v in REFERENCE_SIZING.items() if PlannerConfig.model_fields[f].default != v}
    assert listed == differing


def test_the_config_section_names_every_default_that_is_not_dynamos():
    """The section opens with "keeps Dynamo's field names and defaults": it must say which it does not keep.

    Until 2026-12-05 it called ``optimization_target`` "the one deliberate
    difference", beside ten sizing fields, the predictor and the profile
    directory whose defaults are not Dynamo's either.
    """
    intro = CONFIG_INTRO.search(PLANNER_MD.read_text()).group(1)
    missing = [f for f in DEFAULTS_NOT_DYNAMOS if f"`{f}`" not in intro]
    assert not missing, f"planner.md's Config section says it keeps Dynamo's defaults, but does not name {missing}"
    assert "#sizing-where-fleetplans-defaults-leave-the-reference" in intro
    assert "one deliberate difference" not in intro


# ---- the CLI's options ------------------------------------------------------------------

OPTION_PAGES = ("runtime.md", "connectors.md", "wire-format.md", "simulate.md", "compose.md", "events.md")
"""The pages that document ``fleetplan`` commands (the others quote the bench scripts' options)."""

COMMAND_OF_SECTION = re.compile(r"fleetplan (plan|simulate|worker|audit|bridge|connector)\b")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@cache
def command_options() -> dict[str, frozenset[str]]:
    _register_optional()
    group = get_command(app)
    return {name: frozenset(o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
            for name, cmd in group.commands.items()}


def _documented_options(text: str):
    """(command, option, line) for each option written on a line that runs a fleetplan command."""
    for number, line in enumerate(text.splitlines(), 1):
        commands = COMMAND_OF_SECTION.findall(line)
        if len(commands) != 1 or "bench/" in line:
            continue
        for option in OPTION.findall(line.split(f"fleetplan {commands[0]}", 1)[1]):
            yield commands[0], option, number


def test_every_option_a_documented_command_line_gives_exists():
    missing = []
    for page in (ROOT / "README.md", *(ROOT / "docs" / p for p in OPTION_PAGES)):
        for command, option, line in _documented_options(page.read_text()):
            if option not in command_options()[command]:
                missing.append(f"{page.name}:{line}: fleetplan {command} {option}")
    assert not missing


def test_the_simulate_synopsis_names_every_option():
    """simulate.md opens with the command's synopsis; ``--rate-scale-shift`` was left out of it."""
    synopsis = (ROOT / "docs" / "simulate.md").read_text().split("```")[1]
    assert not sorted(command_options()["simulate"] - set(OPTION.findall(synopsis)))


OPTION_TABLES = {"connectors.md": "connector", "wire-format.md": "bridge"}


@pytest.mark.parametrize("page,command", sorted(OPTION_TABLES.items()))
def test_every_option_in_a_commands_table_exists(page, command):
    text = (ROOT / "docs" / page).read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\| option \| default \|", line))
    listed = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        listed += OPTION.findall(_cells(line)[0])
    assert listed
    assert not sorted(set(listed) - command_options()[command])


def test_the_config_table_names_only_config_fields():
    """Every backquoted name in the table's first column is a field or a Dynamo alias."""
    lines = PLANNER_MD.read_text().splitlines()
    start = lines.index(TABLE_HEADER) + 2
    names = set()
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        names.update(f for quoted in re.findall(r"`([^`]+)`", _cells(line)[0]) for f in _expand(quoted))
    assert not sorted(names - set(field_names()))


RUNTIME_MD = ROOT / "docs" / "runtime.md"
DEFAULTS_BEFORE = {
    "target_utilization": "1.0", "hold_scale_down_until_floor": "false", "throughput_sizing": "point",
    "capacity_mix": "mean", "prefill_sizing": "rate", "prefill_time_model": "linear",
    "decode_scale_down": "absolute", "sizing_quantile_adapt_rate": "0",
    "load_predictor": "arima", "queueing_arrivals": "measured", "decode_sizing": "rate", "load_floor": "none",
    "calibrated_utilization": "null", "uncalibrated_headroom": "full", "burst_sizing": "both",
    "discovered_engine_ttl_seconds": "0", "decode_demand": "burst", "quantile_basis": "requests",
    "hold_until_scored": "none", "floor_headroom": "none", "prefill_capacity": "best",
}
"""Each field whose default changed (or that arrived with a default that changed the fold) since the
first recorded log (2026-11-30, examples/events/), with the value that gives the behaviour before
(models/config.py's history; the "default until" and "default since" notes in planner.md and sizing.md:
``decode_demand``'s row said only since when ``weighted`` was the default, and the table missed it)."""

# each field whose default changed a second time, with the value it had between the two changes
CHANGED_AGAIN = {"hold_until_scored": "decode"}


def test_the_audit_section_names_every_default_that_changed():
    """An audit re-folds with today's defaults, so runtime.md tells how to audit an older log.

    Until 2026-12-05 it said one default had changed (``load_predictor``),
    so a log recorded with ``burst_sizing`` or ``uncalibrated_headroom`` left
    unset, followed that advice and still diverged.
    """
    text = RUNTIME_MD.read_text()
    section = text[text.index("The audit recomputes with the config it is given"):]
    section = section[:section.index("\n\n`--report DIR`")]
    before = [*DEFAULTS_BEFORE.items(), *CHANGED_AGAIN.items()]
    missing = [f"{f}: {v}" for f, v in before if f"`{f}: {v}`" not in section]
    assert not missing, f"runtime.md's audit section does not name {missing}"
    noted = {f for line in PLANNER_MD.read_text().splitlines()
             if line.startswith("| `") and ("the default until" in line or "the default since" in line)
             for f in re.findall(r"`([a-z_]+)`", _cells(line)[0])}
    assert noted <= set(DEFAULTS_BEFORE)


FIELD_WITH_NUMBER = re.compile(r"`([a-z_]+)`\s+\((-?[\d,]+(?:\.\d+)?)( s)?\)")


def test_a_field_given_with_a_number_in_parentheses_is_given_its_default():
    """The docs' shorthand "`field` (value)" states the default: the value must be the field's.

    sizing.md gave ``load_scaling_down_sensitivity`` (0.8), a percentage whose
    default is 80: a config copying it kept a 0.8 % margin.
    """
    wrong = []
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for match in FIELD_WITH_NUMBER.finditer(page.read_text()):
            name, number = match.group(1), float(match.group(2).replace(",", ""))
            if name in PlannerConfig.model_fields and number != PlannerConfig.model_fields[name].default:
                wrong.append(f"{page.name}: {match.group(0)}")
    assert not wrong
