"""The ``fleetplan`` command line: thin wrappers that route to the packages.

No planning logic lives here (design principle 1); each command parses its
arguments, builds the pieces and hands over to the core or a runtime.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated

import orjson
import typer

from fleetplan.options import PATH

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


def cannot_write(option: str, path: Path, err: OSError) -> str:
    """The one message for an output path that cannot be written, naming the option."""
    return f"{option}: cannot write {path} ({err.strerror or err})"


def open_output(option: str, path: Path):
    """Open an output file before any work, so a bad path costs nothing already computed."""
    try:
        return path.open("wb")
    except OSError as err:
        fail(cannot_write(option, path, err))


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path once resolved, or (a hard link,
    a bind mount) the same file on disk."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)
    except OSError:  # one of them is not there (yet): not the same file
        return False


def refuse_overwriting(option: str, path: Path | None, source_option: str, source: Path | None) -> None:
    """Stop when an output option names an input file (the log, the config, the profile):
    writing it would erase that input."""
    if path is not None and source is not None and same_file(path, source):
        fail(f"{option}: is the {source_option} file ({source}); writing it would erase it")


def refuse_replacing(option: str, path: Path) -> None:
    """Stop when an output file whose name is fixed is already there: it may be another
    command's (the simulator's report.html beside its log), and replacing it would say nothing."""
    if path.exists():
        fail(f"{option}: {path} exists; remove it or give another directory")


def ensure_output_dir(option: str, path: Path) -> Path:
    """Create an output directory at start: a path that cannot hold files fails before the run, not after."""
    if path.exists() and not path.is_dir():
        fail(f"{option}: cannot write {path} (a file, not a directory)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(cannot_write(option, path, err))
    if not os.access(path, os.W_OK | os.X_OK):
        fail(f"{option}: cannot write {path} (Permission denied)")
    return path


class _OutputError(Exception):
    """An output could not be written (a full disk, a closed pipe): its option and why."""


@contextlib.contextmanager
def _naming_output(option: str, path: Path | None):
    """Turn an OSError while writing an output into one line naming its option."""
    try:
        yield
    except OSError as err:
        raise _OutputError(cannot_write(option, path, err)) from None


def fold_log(fleet, events: Iterable, emit: Callable[[object], None]) -> ValueError | None:
    """Fold events into ``fleet``, handing each output to ``emit`` as it is made.

    A bad line stops the fold, and the fleet finishes as if the log ended
    just before it: everything decided from the lines already read is still
    emitted (what ``head`` of the same file would print). Returns the error
    that stopped it, or None.
    """
    from fleetplan.eventlog import EventLogError

    stopped = None
    try:
        for event in events:
            for item in fleet.feed(event):
                emit(item)
    except EventLogError as err:
        stopped = err
    for item in fleet.finish():
        emit(item)
    return stopped


@app.command()
def plan(
    events: Annotated[Path, typer.Option("--events", **PATH, help="JSONL event log to fold")],
    config: Annotated[Path | None, typer.Option("--config", **PATH, help="planner config, YAML or JSON")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="profile name or NPZ/JSON path")] = None,
    reports: Annotated[Path | None, typer.Option("--reports", **PATH, help="also write every tick report here (JSONL)")] = None,
    skip_invalid: Annotated[bool, typer.Option(help="skip invalid lines instead of stopping")] = False,
    seed_out: Annotated[Path | None, typer.Option("--seed-out", **PATH, help="also write, per deployment, a seed_traffic control of the windows its forecaster was fed, to start another planner from (JSONL)")] = None,
) -> None:
    """Fold an event log with the planning core and print its decisions as JSONL.

    A bad line stops the fold with ``FILE:LINE: ...`` and exit 2, after the
    decisions (and reports, and seeds) of the lines before it are written.
    """
    from fleetplan.bootstrap import build_planner
    from fleetplan.eventlog import EventLogError, read_events
    from fleetplan.models.config import ConfigError
    from fleetplan.models.config_changes import intake_problem
    from fleetplan.models.fleet import Fleet, LateEvent
    from fleetplan.schemas.codec import encode_event

    try:
        planner = build_planner(config, profile)
    except (ConfigError, ValueError, OSError) as err:
        fail(str(err))
    # the config and profile are read already, but a run that erased them could not be repeated
    profile_file = Path(profile) if profile and Path(profile).is_file() else None  # not a bundled name
    inputs = [("--events", events), ("--config", config), ("--profile", profile_file)]
    for option, path in (("--reports", reports), ("--seed-out", seed_out)):
        for source_option, source in inputs:
            refuse_overwriting(option, path, source_option, source)
    refuse_overwriting("--seed-out", seed_out, "--reports", reports)  # two handles would write over each other
    errors: list = []
    try:
        # opened before an output is (and truncated), and only once: a pipe cannot be read twice
        log = read_events(events, skip_invalid=skip_invalid, errors=errors,
                          check=lambda event: intake_problem(planner.config, event))
    except EventLogError as err:
        fail(str(err))
    seed_fh = open_output("--seed-out", seed_out) if seed_out else None
    report_fh = open_output("--reports", reports) if reports else None
    out = sys.stdout.buffer
    late = 0
    unwritten = None  # the first output that could not be written

    def emit(item) -> None:
        nonlocal late
        if isinstance(item, LateEvent):
            late += 1
            return
        if item.decision is not None:
            with _naming_output("stdout", Path("-")):
                out.write(encode_event(item.decision) + b"\n")
        if report_fh:
            with _naming_output("--reports", reports):
                report_fh.write(orjson.dumps(item.to_dict()) + b"\n")

    fleet = Fleet(planner)
    try:
        stopped = fold_log(fleet, log, emit)
        if seed_fh:
            with _naming_output("--seed-out", seed_out):
                for name in sorted(fleet.states):
                    write_seed(fleet.states[name], seed_fh)
    except _OutputError as err:
        unwritten = str(err)
    finally:
        # a full disk often surfaces only here, at the last flush
        closers = [("stdout", Path("-"), out.flush)] + [
            (option, path, fh.close) for option, path, fh in
            (("--reports", reports, report_fh), ("--seed-out", seed_out, seed_fh)) if fh
        ]
        for option, path, close in closers:
            try:
                with _naming_output(option, path):
                    close()
            except _OutputError as err:
                unwritten = unwritten or str(err)
    # what the run left out is said first: an output that failed must not hide it
    for _, message in errors:
        typer.echo(f"fleetplan: skipped {message}", err=True)
    if late:
        typer.echo(f"fleetplan: {late} late event(s) refused", err=True)
    if unwritten:
        fail(unwritten)
    if stopped is not None:
        fail(str(stopped))
    if not fleet.states:  # nothing to plan from: an empty log, or decisions alone (as the audit says)
        fail(f"{events}: no events")


def write_seed(state, out) -> bool:
    """The windows ``state``'s forecaster was fed as a ``seed_traffic`` control dated its latest
    event, one JSONL line (docs/planner.md: starting another planner from them); False, and
    said on stderr, when it has been fed none.

    Dated its last tick where that is later: the live worker fires a silent deployment's ticks
    on its partition's clock, past its last event, and a snapshot of that state (an audit
    ``--since``) holds windows that end after it, which a seed dated before them may not carry.
    """
    from fleetplan.models.predictor_swap import seed_control, seed_windows
    from fleetplan.schemas.codec import encode_event

    windows = seed_windows(state.traffic_history, state.config.throughput_adjustment_interval_seconds)
    if not windows:
        typer.echo(f"fleetplan: {state.deployment}: {_nothing_to_seed(state)}, no seed written", err=True)
        return False
    time = max(t for t in (state.max_time, state.last_tick) if t is not None)
    out.write(encode_event(seed_control(state.deployment, time, windows, issued_by="fleetplan")) + b"\n")
    return True


def _nothing_to_seed(state) -> str:
    """Why ``state`` gives no seed: a forecaster fed windows may keep none a seed can carry, and
    "none fed" sent the operator looking for missing traffic instead of at the setting."""
    fed = state.forecaster.windows_seen
    if not fed:
        return "no throughput window fed yet"
    why = (f"predictor_history_windows: {state.config.predictor_history_windows}" if not state.traffic_history
           else "a load_predictor_warmup_trace's windows have no start time")
    return f"its forecaster was fed {fed} windows and keeps none to seed from ({why})"


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
