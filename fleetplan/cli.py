"""The ``fleetplan`` command line: thin wrappers that route to the packages.

No planning logic lives here (design principle 1); each command parses its
arguments, builds the pieces and hands over to the core or a runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

app = typer.Typer(
    name="fleetplan",
    help="SLA-driven autoscaling planner for LLM inference fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """SLA-driven autoscaling planner for LLM inference fleets."""


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error (no traceback) and exit: bad input is the user's to fix."""
    typer.echo(f"fleetplan: error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def plan(
    events: Annotated[Path, typer.Option("--events", help="JSONL event log to fold")],
    config: Annotated[Path | None, typer.Option("--config", help="planner config, YAML or JSON")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="profile name or NPZ/JSON path")] = None,
    reports: Annotated[Path | None, typer.Option("--reports", help="also write every tick report here (JSONL)")] = None,
    skip_invalid: Annotated[bool, typer.Option(help="skip invalid lines instead of stopping")] = False,
) -> None:
    """Fold an event log with the planning core and print its decisions as JSONL."""
    from fleetplan.bootstrap import build_planner
    from fleetplan.eventlog import EventLogError, read_events
    from fleetplan.models.config import ConfigError
    from fleetplan.models.fleet import Fleet, LateEvent
    from fleetplan.schemas.codec import encode_event

    try:
        planner = build_planner(config, profile)
    except (ConfigError, ValueError, OSError) as err:
        fail(str(err))
    fleet = Fleet(planner)
    errors: list = []
    late = 0
    out = sys.stdout.buffer
    report_fh = reports.open("wb") if reports else None
    try:
        outputs = fleet.run(read_events(events, skip_invalid=skip_invalid, errors=errors))
    except EventLogError as err:
        fail(str(err))
    for item in outputs:
        if isinstance(item, LateEvent):
            late += 1
            continue
        if item.decision is not None:
            out.write(encode_event(item.decision) + b"\n")
        if report_fh:
            report_fh.write(orjson.dumps(item.to_dict()) + b"\n")
    if report_fh:
        report_fh.close()
    for _, message in errors:
        typer.echo(f"fleetplan: skipped {message}", err=True)
    if late:
        typer.echo(f"fleetplan: {late} late event(s) refused", err=True)


def _register_optional() -> list:
    """Commands of the runtime packages, registered if present; returns their modules."""
    import importlib

    registered = []
    for module in ("fleetplan.sim.cli", "fleetplan.streams.cli", "fleetplan.connectors.cli"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            continue
        mod.register(app)
        registered.append(mod)
    return registered


def main() -> None:
    args = sys.argv[1:]
    for mod in _register_optional():
        # Options typer cannot express (an optional value) are spelled out first.
        rewrite = getattr(mod, "rewrite_args", None)
        if rewrite is not None:
            args = rewrite(args)
    app(args=args)


if __name__ == "__main__":
    main()
