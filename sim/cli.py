"""``fleetplan simulate``: a real trace against a simulated fleet, closed-loop.

Registered on the main CLI by :func:`register`. It parses options, builds
the workload, the fleet and the planner, and hands over to
:mod:`fleetplan.sim.experiment`; nothing here plans or simulates.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import orjson
import typer

from fleetplan.options import PATH

POLICIES = "planner|static-peak|static-mean|oracle|MODULE:CLASS"
DEFAULT_PROFILE = "h200-llama3.1-8b"
"""The engine profile a run uses when neither --profile nor the config's profile_results_dir names one."""
MIN_WINDOW_S = 1.0
"""--window floor: the baselines and the report bin a run by it (1e-9 s asked for 104 GiB)."""
MIN_FPM_INTERVAL_S = 0.01
"""--fpm-interval floor: a forward pass takes milliseconds; 1e-9 s sampled the engines without end."""


def register(app: typer.Typer) -> None:
    app.command(name="simulate")(simulate)


def rewrite_args(args: list[str]) -> list[str]:
    """Give a bare ``--realtime`` its default speed: ``--realtime [SPEED]``.

    Typer has no option with an optional value, and ``--realtime`` alone (as
    compose runs it) must mean speed 1. Called by ``fleetplan.cli.main`` on
    the command line before parsing; only the ``simulate`` command is touched.
    """
    if not args or args[0] != "simulate":
        return args
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--realtime" and not _is_number(out[i + 1] if i + 1 < len(out) else None):
            out[i] = "--realtime=1"
    return out


def _is_number(text: str | None) -> bool:
    try:
        float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def simulate(
    trace: Annotated[Path | None, typer.Option("--trace", **PATH, help="request trace: Azure CSV, Mooncake or dynamo.request.trace.v1 JSONL (.gz ok)")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="engine profile: bundled name (h200-llama3.1-8b, h100-llama3.3-70b), NPZ/JSON path, splitwise:FILE:MODEL:HW:TP or distserve:FILE:MODEL:TP; default: the config's profile_results_dir, else h200-llama3.1-8b")] = None,
    config: Annotated[Path | None, typer.Option("--config", **PATH, help="planner config, YAML or JSON (its SLA, mode and engine limits define the fleet)")] = None,
    policy: Annotated[str, typer.Option("--policy", help=f"who scales the fleet: {POLICIES}")] = "planner",
    out: Annotated[Path | None, typer.Option("--out", **PATH, help="directory for events.jsonl, summary.json and report.html")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON instead of a table")] = False,
    start: Annotated[float, typer.Option("--start", help="slice: first second of the trace to replay")] = 0.0,
    duration: Annotated[float | None, typer.Option("--duration", help="slice: seconds of the trace to replay (default: all)")] = None,
    warm_up: Annotated[float | None, typer.Option("--warm-up", help="seconds of the traffic before --start fed to the planner's forecaster first, as a deployment that has been running (logged as a seed_traffic control)")] = None,
    rate_scale: Annotated[float, typer.Option("--rate-scale", help="multiply the request rate, time axis kept (superposed shifted copies)")] = 1.0,
    rate_scale_shift: Annotated[float | None, typer.Option("--rate-scale-shift", help="shift each --rate-scale copy by at most this many seconds either way, keeping the trace's shape over longer times (default: anywhere in the window, which flattens it)")] = None,
    spread: Annotated[str, typer.Option("--spread-arrivals", help="arrival times the trace rounded to a step (Mooncake: 3 s): auto (find the step, spread each request uniformly over it), off, or the step in seconds")] = "auto",
    speed: Annotated[float, typer.Option("--speed", help="play the trace this many times faster")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="seed of rate scaling, startup draws and generators")] = 0,
    servegen: Annotated[Path | None, typer.Option("--servegen", **PATH, help="generate the workload from ServeGen clients_rate_10min CSV(.gz) instead of --trace")] = None,
    servegen_model: Annotated[str, typer.Option("--servegen-model", help="ServeGen model column (m-large, m-mid, ...)")] = "m-large",
    router: Annotated[str, typer.Option("--router", help="round-robin | least-loaded | prefix")] = "least-loaded",
    prefix_block_tokens: Annotated[int | None, typer.Option("--prefix-block-tokens", help="tokens per prompt hash block (default: the trace's own, a Dynamo trace's replay.trace_block_size, else 512 as in Mooncake)")] = None,
    startup: Annotated[str, typer.Option("--startup", help="worker startup seconds, or uniform:LO:HI, normal:MEAN:SD, lognormal:MEDIAN:SIGMA")] = "120",
    initial: Annotated[str, typer.Option("--initial", help="initial fleet: warm (sized for the traffic until the first decision takes effect), min, or e.g. prefill=2,decode=3")] = "warm",
    fpm_interval: Annotated[float, typer.Option("--fpm-interval", help="seconds between sampled FPMs per engine")] = 1.0,
    engine_timing: Annotated[str, typer.Option("--engine-timing", help="interp (profile measurements) | interp-extend (decode levels carry on past their measured usage) | fit (the planner's own linear fit)")] = "interp",
    inventory: Annotated[bool, typer.Option("--inventory/--no-inventory", help="send the planner inventory events (engine starting, ready, draining, gone), as an orchestrator that writes them; --no-inventory: none, as in fleetplan's live stack, where engines are known from their FPMs and startups are timed by acks")] = True,
    baselines: Annotated[bool | None, typer.Option("--baselines/--no-baselines", help="also run static-peak, static-mean and oracle on the same fleet (default: yes, unless --publish or --realtime)")] = None,
    oracle_rounds: Annotated[int, typer.Option("--oracle-rounds", help="replays the oracle may use to raise windows that missed the goal")] = 4,
    goal: Annotated[float, typer.Option("--goal", help="per-window SLA attainment the oracle must reach")] = 0.99,
    window: Annotated[float, typer.Option("--window", help="seconds per window for baselines and report")] = 60.0,
    deployment: Annotated[str, typer.Option("--deployment", help="deployment name on every event (the Kafka key when published)")] = "sim",
    publish: Annotated[str | None, typer.Option("--publish", help="send the fleet's FPMs and request events to a fleetplan bridge over ZMQ: tcp://HOST:PORT (PUSH, the bridge's --pull), pub:tcp://HOST:PORT (PUB, its --sub bind:...)")] = None,
    realtime: Annotated[float | None, typer.Option("--realtime", help="hold the virtual clock to the wall clock; --realtime alone is speed 1, --realtime 10 runs 10x faster than real time")] = None,
    retune: Annotated[Path | None, typer.Option("--retune", **PATH, help="retune spec, YAML or JSON: replay each past window against a grid of planner settings and apply the best (docs/retune.md)")] = None,
) -> None:
    """Replay a trace against a simulated fleet driven by the planner (or another policy)."""
    from fleetplan.cli import ensure_output_dir, fail

    try:
        _check_numbers(start=start, duration=duration, warm_up=warm_up, rate_scale=rate_scale, speed=speed,
                       fpm_interval=fpm_interval, window=window, prefix_block_tokens=prefix_block_tokens,
                       oracle_rounds=oracle_rounds, goal=goal, rate_scale_shift=rate_scale_shift, seed=seed)
        if out is not None:
            ensure_output_dir("--out", out)  # before the trace is read and the runs take minutes
        run = _prepare(
            trace, profile, config, policy, start, duration, rate_scale, speed, seed, servegen,
            servegen_model, router, startup, initial, fpm_interval, engine_timing, window,
            prefix_block_tokens, deployment, spread, inventory, rate_scale_shift,
        )
        with _status(f"cutting the {warm_up or 0:g} s before --start into throughput windows",
                     on=warm_up is not None and not as_json):
            run["seed"] = _warm_history(warm_up, run, trace, servegen, servegen_model, start, rate_scale, speed,
                                        seed, spread)
        if run["seed"] is not None and publish is not None:
            # the bridge relays engine and request events; a control goes to the control topic
            raise _UserError("--warm-up: not with --publish: the bridge does not relay the seed_traffic "
                             "control; produce it to the control topic (docs/planner.md)")
        run["live"] = _live(publish, realtime)
        run["retune"] = _retune(retune, run)
    except _UserError as err:
        fail(str(err))
    if run["spread_s"] is not None and spread == "auto":
        typer.echo(f"fleetplan: {trace}: arrival times come in {run['spread_s']:g} s steps; each request is "
                   "spread uniformly over its step (--spread-arrivals off keeps them)", err=True)
    if baselines is None:
        # A live run is a demo fleet: baselines are neither published nor paced, and the
        # oracle's replays would run first and hold up the live run.
        baselines = run["live"] is None
    publisher = None if run["live"] is None else run["live"].publisher
    try:
        _execute(run, out, as_json, baselines, oracle_rounds, goal)
    finally:
        if publisher is not None:
            publisher.close()
    if publisher is not None:
        if publisher.sent_events and not publisher.reached:
            fail(f"--publish: no bridge connected to {publisher.target.address} during the run or "
                 f"{publisher.linger_s:g} s after it: its {publisher.sent_events:,} events were not delivered",
                 code=1)
        typer.echo(f"published {publisher.sent_events:,} events in {publisher.sent_messages:,} "
                   f"messages to {publisher.target.address}", err=True)


class _UserError(Exception):
    pass


def _check_numbers(*, start, duration, rate_scale, speed, fpm_interval, window, prefix_block_tokens,
                   oracle_rounds, goal, warm_up=None, rate_scale_shift=None, seed=0) -> None:
    """Every numeric option in range, named, before anything is read.

    Written out rather than typer's ``min``/``max``: those let nan and inf
    through, and an open bound (``--goal`` in (0, 1]) reads better said.
    ``--seed`` is >= 0: Python's ``random`` seeds with its absolute value
    (``--seed -1`` replayed ``--seed 1``) and numpy's generator (ServeGen)
    refuses a negative one with a traceback.
    """
    positive = {"--rate-scale": rate_scale, "--speed": speed, "--fpm-interval": fpm_interval,
                "--window": window, "--prefix-block-tokens": prefix_block_tokens, "--duration": duration,
                "--warm-up": warm_up}
    for name, value in positive.items():
        if value is not None and not value > 0:
            raise _UserError(f"{name}: must be > 0, got {value}")
        if value is not None and math.isinf(value):
            raise _UserError(f"{name}: must be a finite number, got {value}")
    for name, value, floor in (("--window", window, MIN_WINDOW_S),
                               ("--fpm-interval", fpm_interval, MIN_FPM_INTERVAL_S)):
        if value < floor:
            raise _UserError(f"{name}: at least {floor:g} s, got {value:g}")
    if not (start >= 0 and math.isfinite(start)):
        raise _UserError(f"--start: must be a finite number of seconds >= 0, got {start}")
    if rate_scale_shift is not None and not (rate_scale_shift >= 0 and math.isfinite(rate_scale_shift)):
        raise _UserError(f"--rate-scale-shift: a finite number of seconds >= 0, got {rate_scale_shift}")
    if rate_scale_shift is not None and rate_scale <= 1:
        # at K <= 1 the trace is replayed itself (or thinned): there is no copy the shift could move
        raise _UserError(f"--rate-scale-shift: shifts the copies a --rate-scale above 1 adds; "
                         f"got --rate-scale {rate_scale:g}, which adds none")
    if seed < 0:
        raise _UserError(f"--seed: must be >= 0, got {seed}")
    if oracle_rounds < 0:
        raise _UserError(f"--oracle-rounds: must be >= 0, got {oracle_rounds}")
    if not 0 < goal <= 1:
        raise _UserError(f"--goal: a fraction in (0, 1], got {goal:g}")


def _prepare(
    trace, profile, config, policy, start, duration, rate_scale, speed, seed, servegen,
    servegen_model, router, startup, initial, fpm_interval, engine_timing, window,
    prefix_block_tokens=None, deployment="sim", spread="auto", inventory=True, rate_scale_shift=None,
) -> dict:
    from fleetplan.bootstrap import build_planner
    from fleetplan.models.config import (
        ConfigError,
        check_profile_engines,
        engine_gpus_wanted,
        load_config,
    )
    from fleetplan.sim.policy import PolicyError, load_policy
    from fleetplan.sim.profile_convert import ProfileConvertError, profile_from_spec
    from fleetplan.sim.profiles import ProfileError, load_profile
    from fleetplan.sim.router import ROUTERS
    from fleetplan.sim.runner import SimOptions, make_setup
    from fleetplan.sim.servegen import ServeGenError
    from fleetplan.sim.startup import parse_startup
    from fleetplan.sim.timing import TIMING_MODES
    from fleetplan.sim.traces import TraceFormatError

    if router not in ROUTERS:
        raise _UserError(f"--router: expected one of {', '.join(ROUTERS)}, got {router!r}")
    if engine_timing not in TIMING_MODES:
        raise _UserError(f"--engine-timing: expected one of {', '.join(TIMING_MODES)}, got {engine_timing!r}")
    try:
        parse_startup(startup)
    except ValueError as err:
        raise _UserError(f"--startup: {err}") from None
    try:
        cfg = load_config(config)
    except ConfigError as err:
        raise _UserError(str(err)) from None
    # the flag, else the config's field, else the bundled 8B profile; an error names the one used
    where = "--profile"
    if profile is None and cfg.profile_results_dir is not None:
        profile, where = cfg.profile_results_dir, "profile_results_dir"
    profile = profile or DEFAULT_PROFILE
    try:
        prof = profile_from_spec(profile)
        converted = prof is not None
        if prof is None:
            prof = load_profile(profile, tp=cfg.profile_tp, engine_gpus=engine_gpus_wanted(cfg))
    except (ProfileError, ProfileConvertError) as err:
        raise _UserError(f"{where}: profile {err}") from None
    except ValueError as err:
        raise _UserError(f"{where}: profile {profile}: {err}") from None
    try:
        check_profile_engines(cfg, prof.engine_gpus, prof.name)
    except ConfigError as err:
        raise _UserError(f"{config or 'config'}: {err}") from None
    if not deployment:
        raise _UserError("--deployment: must not be empty")
    options = SimOptions(
        router=router, startup=startup, fpm_interval_s=fpm_interval, seed=seed, timing=engine_timing,
        window_s=window, deployment=deployment, inventory=inventory,
    )
    try:
        setup = make_setup(cfg, prof, options)
    except ValueError as err:
        raise _UserError(f"{config or 'config'}: {err}") from None
    try:
        workload, spread_s = _workload(trace, servegen, servegen_model, start, duration, rate_scale, speed, seed,
                                       spread, rate_scale_shift)
    except (TraceFormatError, ServeGenError, ValueError) as err:
        raise _UserError(str(err)) from None
    except OSError as err:
        option = "--trace" if trace else "--servegen"
        raise _UserError(f"{option}: cannot read {err.filename or trace or servegen} ({err.strerror or err})") from None
    setup.options = replace(setup.options, prefix_block_tokens=_block_tokens(prefix_block_tokens, workload, trace))
    if policy in ("planner",):
        try:
            if converted:
                from fleetplan.bootstrap import load_warmup
                from fleetplan.models.planner import Planner

                planner = Planner(cfg, profile=prof, **load_warmup(cfg))
            else:
                planner = build_planner(cfg, profile)
        except (ConfigError, ValueError, OSError) as err:
            raise _UserError(str(err)) from None
        policy_obj = None
    elif policy in ("static-peak", "static-mean", "oracle"):
        planner, policy_obj = None, policy
    else:
        try:
            policy_obj = load_policy(policy)
        except PolicyError as err:
            raise _UserError(str(err)) from None
        planner = None
    try:
        initial_spec = _initial_spec(initial)
        _check_initial(initial_spec, cfg, setup.gpus)
    except ValueError as err:
        raise _UserError(f"--initial: {err}") from None
    return {
        "workload": workload, "setup": setup, "planner": planner, "policy": policy,
        "policy_obj": policy_obj, "initial": initial_spec, "config_path": config, "profile": profile,
        "trace": trace or servegen, "rate_scale": rate_scale, "rate_scale_shift": rate_scale_shift,
        "speed": speed, "spread_s": spread_s,
        "converted_profile": prof if converted else None,
    }


def _block_tokens(flag: int | None, workload, trace) -> int:
    """Tokens per prompt hash block: the trace's own where it says (a Dynamo trace's
    ``replay.trace_block_size``), else the flag, else Mooncake's 512.

    A hit counts its blocks at this size and the prefix cache holds the KV's worth of
    them: Dynamo's 16-token hashes read as 512-token blocks made a prompt sharing its
    first 32 tokens with an earlier one a hit on all of them.
    """
    declared = sorted({r.block_tokens for r in workload.requests() if r.block_tokens is not None})
    if len(declared) > 1:
        raise _UserError(f"{trace}: hash blocks of {', '.join(map(str, declared))} tokens (replay.trace_block_size): "
                         "one size a trace")
    if declared and flag is not None and flag != declared[0]:
        raise _UserError(f"--prefix-block-tokens: {flag}, but {trace} hashes blocks of {declared[0]} tokens "
                         "(replay.trace_block_size)")
    return declared[0] if declared else flag or 512


def _status(message: str, on: bool):
    """A spinner on a terminal's stderr while a slow step runs (a ServeGen day of warm-up takes ~10 s)."""
    from contextlib import nullcontext

    from rich.console import Console

    console = Console(stderr=True)
    return console.status(message) if on and console.is_terminal else nullcontext()


def _warm_history(warm_up, run, trace, servegen, servegen_model, start, rate_scale, speed, seed, spread):
    """``--warm-up SECONDS``: the throughput windows of the traffic before ``--start``, from the
    same source at the same scale (sim/warm.py), to seed the planner's forecaster (None: off)."""
    if warm_up is None:
        return None
    from fleetplan.models.predictor_swap import seed_problem
    from fleetplan.schemas.events import MAX_SEED_WINDOWS
    from fleetplan.sim.servegen import ServeGenError
    from fleetplan.sim.traces import TraceFormatError
    from fleetplan.sim.warm import history_windows

    if run["policy"] != "planner":
        raise _UserError(f"--warm-up: warms the planner's forecaster, not --policy {run['policy']}")
    if warm_up > start:
        raise _UserError(f"--warm-up: {warm_up:g} s of traffic before --start, which is {start:g} s "
                         "into the source; start later or warm up on less")
    cfg = run["setup"].config
    interval = cfg.throughput_adjustment_interval_seconds
    if warm_up / speed / interval > MAX_SEED_WINDOWS:
        raise _UserError(f"--warm-up: {warm_up:g} s is more than the {MAX_SEED_WINDOWS} throughput windows "
                         f"of {interval} s one seed carries")
    try:
        history, _ = _workload(trace, servegen, servegen_model, start - warm_up, warm_up, rate_scale, speed, seed,
                               spread, run.get("rate_scale_shift"))
    except (TraceFormatError, ServeGenError, ValueError, OSError) as err:
        raise _UserError(f"--warm-up: {str(err).removeprefix('--start/--duration: ')}") from None
    rows = history_windows(history.requests(), span_s=history.duration_s, interval_s=interval,
                           burst_s=cfg.burst_seconds)
    if not rows:
        raise _UserError(f"--warm-up: no full throughput window ({interval} s) of traffic in the "
                         f"{warm_up:g} s before --start")
    problem = seed_problem(cfg, run["planner"].new_state(run["setup"].options.deployment).forecaster, rows)
    if problem is not None:  # a warm-up trace in the config has fed it
        raise _UserError(f"--warm-up: cannot seed the forecaster: {problem} (load_predictor_warmup_trace)")
    return rows


def _retune(path: Path | None, run: dict):
    """``--retune FILE``: the run's retune loop, validated before anything runs (None: off)."""
    if path is None:
        return None
    from fleetplan.models.config import ConfigError, read_settings_file
    from fleetplan.sim.retune import RetuneError, Retuner, load_retune

    if run["policy"] != "planner":
        raise _UserError(f"--retune: retunes the planner, not --policy {run['policy']}")
    if run["live"] is not None:
        # a sweep replays candidates while virtual time stands still, which a live run cannot do
        raise _UserError("--retune: replay only (as in Dynamo), not with --publish or --realtime")
    try:
        spec = load_retune(read_settings_file(path, "retune spec"), source=str(path))
    except (ConfigError, RetuneError) as err:  # unreadable, not YAML/JSON, or a bad field: each names the file
        raise _UserError(f"--retune: {err}") from None
    try:
        return Retuner(spec, run["setup"], run["planner"].profile)
    except RetuneError as err:
        raise _UserError(f"--retune: {path}: {err}") from None


def _live(publish: str | None, realtime: float | None):
    """The run's live outputs (--publish, --realtime), or None for an offline run."""
    from fleetplan.sim.realtime import LiveRun, RealtimePacer

    if publish is None and realtime is None:
        return None
    pacer = None
    if realtime is not None:
        if not realtime > 0:
            raise _UserError(f"--realtime: the speed must be > 0, got {realtime}")
        pacer = RealtimePacer(realtime)
    publisher = None
    if publish is not None:
        import zmq

        from fleetplan.sim.publish import PublishTarget, ZmqPublisher

        try:
            publisher = ZmqPublisher(PublishTarget.parse(publish))
        except ValueError as err:
            raise _UserError(str(err)) from None
        except zmq.ZMQError as err:
            raise _UserError(f"--publish: {publish}: {err}") from None
    return LiveRun(publisher, pacer)


def _spread_step(spread: str, requests) -> float | None:
    """``--spread-arrivals``: the step to spread arrivals over, None to keep them."""
    from fleetplan.sim.workload import timestamp_step

    if spread == "off":
        return None
    if spread == "auto":
        return timestamp_step(requests)
    try:
        step = float(spread)
    except ValueError:
        step = math.nan
    if not step > 0 or math.isinf(step):
        raise ValueError(f"--spread-arrivals: expected auto, off or a step in seconds > 0, got {spread!r}")
    return step


def _workload(trace, servegen, servegen_model, start, duration, rate_scale, speed, seed, spread="auto",
              rate_scale_shift=None):
    """The run's workload, and the step its arrivals were spread over (None: kept)."""
    from fleetplan.sim.servegen import servegen_workload
    from fleetplan.sim.traces import MAX_TRACE_SPAN_S, read_trace
    from fleetplan.sim.workload import Workload, slice_trace, spread_arrivals, trace_duration
    from fleetplan.sim.workload import rate_scale as scale_rate
    from fleetplan.sim.workload import speed as speed_up

    if (trace is None) == (servegen is None):
        raise ValueError("give exactly one of --trace FILE or --servegen FILE")
    if servegen is not None:
        wl = servegen_workload(
            servegen, servegen_model, start_s=start, duration_s=duration or 86_400.0,
            rate_scale=rate_scale, seed=seed,
        )
        if speed != 1.0:
            raise ValueError("--speed applies to --trace workloads only")
        if spread not in ("auto", "off"):
            raise ValueError("--spread-arrivals applies to --trace workloads only")
        if rate_scale_shift is not None:
            raise ValueError("--rate-scale-shift applies to --trace workloads only (ServeGen draws its own arrivals)")
        return wl, None
    if not trace.exists():
        raise ValueError(f"{trace}: no such trace file")
    requests = read_trace(trace)
    if not requests:
        raise ValueError(f"{trace}: the trace has no requests")
    spread_s = _spread_step(spread, requests)
    if spread_s is not None:
        # before slicing: the rounding is the recording's, on the trace's own clock
        requests = spread_arrivals(requests, spread_s, seed=seed)
    full = trace_duration(requests)
    end = None if duration is None else start + duration
    if start or end is not None:
        requests = slice_trace(requests, start, end)
        if not requests:
            raise ValueError(f"--start/--duration: {trace}: no requests in [{start:g}, "
                             f"{end if end is not None else full:g}) s (the trace spans {full:g} s)")
    covered = max(full - start, 1.0)  # the part of the slice the trace has
    window = duration if duration is not None else covered
    if rate_scale != 1.0:
        # the copies wrap around the trace's own span: wrapped around a --duration past its
        # end they put part of the traffic in a tail the trace leaves empty, and less in it
        sliced = len(requests)
        requests = scale_rate(requests, rate_scale, seed=seed, duration_s=min(window, covered),
                              max_shift_s=rate_scale_shift)
        if not requests:  # thinned to nothing, as an empty slice: a replay of no traffic measures nothing
            raise ValueError(f"--rate-scale: {rate_scale:g} kept none of the slice's {sliced:,} requests "
                             f"(each is kept with probability {rate_scale:g})")
    if speed != 1.0:
        if window / speed > MAX_TRACE_SPAN_S:
            raise ValueError(f"--speed: {speed:g} stretches {window:g} s of trace to {window / speed:.3g} s, "
                             f"past the longest replay, {MAX_TRACE_SPAN_S / 86_400:g} days")
        requests = speed_up(requests, speed)
        window = window / speed
    return Workload.from_requests(Path(trace).stem, requests, window), spread_s


MAX_INITIAL_ENGINES = 10_000
"""--initial's ceiling per role when the config sets none (decode=100000 ran without end)."""


def _check_initial(spec, cfg, gpus) -> None:
    """Counts for the roles the mode runs, within the config's ceilings and GPU budget.

    ``gpus`` is the fleet's GPUs per engine (``FleetSetup.gpus``): the config's
    ``*_engine_num_gpu``, else the profile's TP, as the runs bill them.
    """
    if not isinstance(spec, dict):
        return
    for role, count in spec.items():
        if role not in cfg.roles:
            raise ValueError(f"{role}: not a role of mode {cfg.mode} (its roles: {', '.join(cfg.roles)})")
        ceiling = cfg.max_endpoints(role)
        if count > (MAX_INITIAL_ENGINES if ceiling is None else ceiling):
            limit = f"the config's ceiling ({ceiling})" if ceiling is not None else f"{MAX_INITIAL_ENGINES:,}"
            raise ValueError(f"{role}={count}: more engines than {limit}")
    if cfg.max_gpu_budget >= 0:
        total = sum(spec.get(r, 1) * gpus[r] for r in cfg.roles)
        if total > cfg.max_gpu_budget:
            raise ValueError(f"{total} GPUs, more than max_gpu_budget ({cfg.max_gpu_budget})")


def _initial_spec(text: str):
    """``warm``, ``min`` or role counts; a role given twice is refused, not run on its last count."""
    if text in ("warm", "min"):
        return text
    out = {}
    for part in text.split(","):
        role, sep, n = part.partition("=")
        role = role.strip()
        if not sep or role not in ("prefill", "decode", "agg"):
            raise ValueError(f"expected warm, min or role=count pairs like prefill=2,decode=3; got {text!r}")
        if role in out:
            raise ValueError(f"{role}: given twice in {text!r}")
        try:
            out[role] = int(n)
        except ValueError:
            raise ValueError(f"{role}: expected an integer count, got {n!r}") from None
        if out[role] < 0:
            raise ValueError(f"{role}: count must be >= 0")
    return out


def _execute(run: dict, out: Path | None, as_json: bool, baselines: bool, oracle_rounds: int, goal: float) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fleetplan.sim import experiment
    from fleetplan.sim.forecast_check import sized_basis
    from fleetplan.sim.policy import PolicyError
    from fleetplan.sim.report import write_report

    workload = run["workload"]
    setup = run["setup"]
    console = Console(stderr=True)
    show = not as_json and console.is_terminal
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if run["converted_profile"] is not None:
            from fleetplan.sim.profile_convert import write_profile_json

            # `fleetplan plan --profile OUT/profile.json` replays the log with it
            write_profile_json(run["converted_profile"], out / "profile.json")
    sizing = experiment.size_workload(workload, setup)
    try:
        initial = experiment.initial_fleet(run["initial"], setup, sizing, workload)
    except ValueError as err:
        from fleetplan.cli import fail

        fail(f"--initial: {err}")
    duration = workload.duration_s
    policy = run["policy"]
    names = [policy]
    if baselines:
        names += [b for b in ("oracle", "static-peak", "static-mean") if b != policy]
    results: dict[str, object] = {}
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(), console=console, disable=not show, transient=True,
    ) as progress:
        def task_for(name):
            task = progress.add_task(name, total=duration, note="")

            def update(sim_t):
                progress.update(task, completed=min(sim_t, duration), note=f"{sim_t / 60:.0f} min simulated")

            return update

        order = sorted(names, key=lambda n: 0 if n == "oracle" else 1)  # statics read the oracle's needs
        for name in order:
            log_fh = None
            if name == policy and out is not None:
                log_fh = (out / "events.jsonl").open("wb")
            try:
                results[name] = _run_one(name, run, setup, workload, sizing, initial, log_fh, task_for(name),
                                         oracle_rounds, goal, lambda msg: progress.console.log(msg) if show else None,
                                         run["live"] if name == policy else None)
            except PolicyError as err:
                from fleetplan.cli import fail

                fail(str(err))
            finally:
                if log_fh is not None:
                    log_fh.close()
    ordered = [results[n] for n in names]
    summary = _summary_json(run, sizing, ordered, out)
    if out is not None:
        (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        arrivals = [(w.t, w.num_req, w.duration_s) for w in sizing.traffic]
        title = f"fleetplan simulate: {run['policy']} on {workload.name} ({setup.config.mode}, {run['profile']})"
        write_report(out / "report.html", ordered, setup.config.ttft_ms, setup.config.itl_ms, sizing.window_s, arrivals,
                     title, sized_basis=sized_basis(setup.config))
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        _print_table(ordered, setup, workload, run, out, summary["forecast"])


def _run_one(name, run, setup, workload, sizing, initial, log_fh, progress, rounds, goal, note, live=None):
    from fleetplan.sim import experiment

    if name == "planner":
        return experiment.run_planner(workload, setup, run["planner"], initial, log=log_fh, progress=progress,
                                      live=live, retune=run.get("retune"), seed=run.get("seed"))
    if name == "oracle":
        return experiment.run_oracle(workload, setup, sizing, goal, rounds, progress=note, log=log_fh, live=live)
    if name == "static-peak":
        return experiment.run_static(workload, setup, sizing, "peak", log=log_fh, live=live)
    if name == "static-mean":
        return experiment.run_static(workload, setup, sizing, "mean", log=log_fh, live=live)
    return experiment.run_policy(workload, setup, run["policy_obj"], name, initial=initial, log=log_fh,
                                 progress=progress, live=live)


def stranded_note(result) -> str | None:
    """Say so when the run stalled: its summary counts requests its log has no record of.

    A fleet left unable to serve (a policy that stopped a role's last engine) ends the
    run an hour after the trace; the requests still waiting count as missed in the
    table and the report, but no engine finished them, so ``events.jsonl`` holds no
    ``request`` record of them and an audit of that log cannot see them.
    """
    from fleetplan.sim.runner import STALL_S

    if not result.stranded:
        return None
    return (f"{result.policy}: the run stalled: nothing finished for {STALL_S / 3600:g} h, and the "
            f"{result.stranded:,} requests still waiting count as missed (the log has no record of them)")


def _summary_json(run, sizing, results, out) -> dict:
    from fleetplan.sim import REVISION
    from fleetplan.sim.forecast_check import run_coverage

    setup = run["setup"]
    cfg = setup.config
    main = results[0]
    wall = sum(r.wall_s for r in results)
    return {
        "sim_revision": REVISION,
        "trace": str(run["trace"]), "workload": run["workload"].name, "profile": run["profile"],
        "config": None if run["config_path"] is None else str(run["config_path"]),
        "mode": cfg.mode, "rate_scale": run["rate_scale"], "rate_scale_shift_s": run.get("rate_scale_shift"),
        "speed": run["speed"], "spread_arrivals_s": run["spread_s"],
        "warm_up_windows": None if run.get("seed") is None else len(run["seed"]),
        "duration_s": run["workload"].duration_s, "requests": main.summary.requests,
        "sla": {"ttft_ms": cfg.ttft_ms, "itl_ms": cfg.itl_ms},
        "startup": setup.startup().describe(), "router": setup.options.router,
        "inventory": setup.options.inventory, "engine_timing": setup.timing.mode,
        "gpus_per_engine": setup.gpus,
        "policy": main.policy,
        "results": {r.policy: {**r.summary.to_dict(), "wall_s": r.wall_s, "sim_per_wall": r.end_s / r.wall_s if r.wall_s else None} for r in results},
        "oracle_gpu_hours_ratio": _oracle_ratios(results),
        "sizing": {
            "window_s": sizing.window_s, "engine_rps_at_mean_shape": sizing.engine_rps,
            "oracle_refine_rounds": sizing.refine_rounds,
        },
        "speed_main": {
            "sim_seconds_per_wall_second": main.end_s / main.wall_s if main.wall_s else None,
            "requests_per_wall_second": main.summary.requests / main.wall_s if main.wall_s else None,
            "iterations_per_wall_second": main.iterations / main.wall_s if main.wall_s else None,
            "events": main.events, "logged": main.logged, "fpms": main.fpms,
        },
        "wall_s_total": wall,
        "late_events": main.late_events,
        "stranded_requests": main.stranded,
        "gpu_budget_held_ticks": budget_held_ticks(main),
        "retune": main.retune,
        "forecast": run_coverage(main, run["workload"], cfg),
        "files": None if out is None else {
            "events": str(out / "events.jsonl"), "summary": str(out / "summary.json"),
            "report": str(out / "report.html"),
        },
    }


def budget_held_ticks(result) -> int:
    """The planner's ticks whose targets the GPU budget cut or held (reasons ``gpu_budget_*``).

    The baselines are not held to ``max_gpu_budget``, so a run where the
    budget binds compares a capped planner with uncapped fleets.
    """
    return sum(
        1 for t in result.ticks
        if str(t.get("throughput_reason", "")).startswith("gpu_budget")
        or str(t.get("load_reason", "")).startswith("gpu_budget")
    )


def retune_lines(decisions: list[dict]) -> list[str]:
    """One line per retune decision: the window, what was chosen, and the scores it rests on."""
    from fleetplan.sim.retune import describe_changes

    lines = []
    for d in decisions:
        start, end = d["window"]
        when = "" if d["decided_at"] is None else f", decided at {d['decided_at']:g} s"  # not run, or not landed
        head = f"retune [{start:g}, {end:g}) s, {d['requests']:,} requests{when}: {d['outcome']}"
        if d["changes"]:
            head += " " + describe_changes(d["changes"])
        cands = d["candidates"]
        if cands:
            best, current = cands[d["best"]], cands[0]
            if d.get("objective") == "gpu_hours_at_goal":  # what that objective ranks by
                head += (f" ({_at_goal(best)} against the current {_at_goal(current)})")
            else:
                head += f" (score {best['score']:,.1f} against the current {current['score']:,.1f})"
        lines.append(head)
    return lines


def _at_goal(score: dict) -> str:
    return f"{score['attainment']:.2%} at {score['gpu_hours']:.3f} GPU-hours"


def _budget_note(result, cfg) -> str | None:
    held = budget_held_ticks(result)
    if not held or cfg.max_gpu_budget < 0:
        return None
    return (
        f"note: the GPU budget held the planner at max_gpu_budget = {cfg.max_gpu_budget} GPUs on {held} "
        f"tick(s) (8 is Dynamo's default); the baselines are not held to it. "
        f"Set max_gpu_budget in --config (-1: none) to size the planner freely."
    )


def _oracle_ratios(results) -> dict:
    oracle = results_by(results, "oracle")
    if oracle is None or not oracle.summary.gpu_hours > 0:
        return {}
    return {r.policy: r.summary.gpu_hours / oracle.summary.gpu_hours for r in results}


def results_by(results, name):
    return next((r for r in results if r.policy == name), None)


def _print_unsqueezed(console, table) -> None:
    """Print ``table`` at its full width, wider than ``console`` if it must be.

    Squeezed into a narrower console, rich cuts every column to fit, the
    numbers too: ``make run`` on an 80-column terminal printed SLA met as
    "10…" and GPU-hours as "…", and the compose demo fleet's policy name
    cut its GPU-hours to "0.…" in the log. A terminal wraps a long line
    instead, and every figure stays whole.
    """
    from rich.console import Console
    from rich.measure import Measurement

    needed = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
    if needed > console.width:
        console = Console(width=needed, markup=False, emoji=False)
    console.print(table)


def _print_table(results, setup, workload, run, out, coverage=None) -> None:
    from rich.console import Console
    from rich.table import Table

    from fleetplan.sim.forecast_check import coverage_line

    cfg = setup.config
    oracle = results_by(results, "oracle")
    table = Table(title=(
        f"{workload.name}: {results[0].summary.requests:,} requests over {workload.duration_s / 60:.1f} min, "
        f"SLA TTFT {cfg.ttft_ms:g} ms / ITL {cfg.itl_ms:g} ms, {cfg.mode}"
    ))
    for col in ("policy", "SLA met", "TTFT p90 ms", "ITL p90 ms", "goodput tok/s", "tok/s/GPU",
                "GPU-h", "x oracle", "peak", "decisions"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in results:
        s = r.summary
        ratio = f"{s.gpu_hours / oracle.summary.gpu_hours:.2f}x" if oracle and oracle.summary.gpu_hours else "-"
        peak = " ".join(f"{k[0].upper()}{v}" for k, v in s.peak_replicas.items())
        table.add_row(
            s.policy, f"{s.sla_attainment:.2%}", f"{s.ttft_p90_ms:,.0f}", f"{s.itl_p90_ms:,.1f}",
            f"{s.goodput_tps:,.0f}", f"{s.goodput_per_gpu_tps:,.0f}", f"{s.gpu_hours:.2f}", ratio, peak,
            str(s.decisions),
        )
    # names and paths are printed as given: not rich markup ('[/b]' in --out raised) nor emoji codes
    console = Console(markup=False, emoji=False)
    if not console.is_terminal:
        # a pipe or a log file: do not squeeze the table into 80 columns
        console = Console(width=132, markup=False, emoji=False)
    _print_unsqueezed(console, table)
    main = results[0]
    console.print(
        f"{main.policy}: {main.end_s / main.wall_s:,.0f}x real time "
        f"({main.summary.requests / main.wall_s:,.0f} requests/s, {main.events:,} events)"
    )
    if run.get("seed"):
        seed = run["seed"]
        hours = sum(row[1] for row in seed) / 3600.0
        console.print(f"warm-up: the forecaster was seeded with {len(seed):,} windows ({hours:,.1f} h) of the "
                      "traffic before --start")
    line = coverage_line(coverage)
    if line:
        console.print(line)
    for line in retune_lines(main.retune or []):
        console.print(line)
    for note in (_budget_note(main, cfg), stranded_note(main)):
        if note:
            console.print(note, style="yellow")
    if out is not None:
        console.print(f"wrote {out / 'events.jsonl'}, {out / 'summary.json'}, {out / 'report.html'}")
