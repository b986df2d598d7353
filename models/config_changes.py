"""What a ``set_config`` or ``reset_perf`` may change, judged on the change alone.

Intake (streams/router.py) dead-letters a ``set_config`` whose change is
wrong by itself: an unknown field, a value its own field refuses, a field
fixed when the deployment starts (``reset_perf`` may change the perf
models' fields), a load predictor this install cannot build. It must not
judge a change against the deployment's config as it stands when the
record is read. Control events read but not yet folded (they wait for
their tick) would change that verdict, so the same events read in
another order would be refused in one run and applied in another,
and the audit, which folds in event time, would disagree with both. What
depends on other fields (a floor above a ceiling, a budget too small for
one engine) is judged at the tick, in event-time order, and counted in
``rejected_controls`` when it fails (models/planner.py).
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from fleetplan.models.config import (
    DYNAMO_RUNTIME_FIELDS,
    PlannerConfig,
    bucket_size_problem,
    field_names,
    startup_field_problem,
    value_problem,
)
from fleetplan.models.predictors import PredictorUnavailable, make_predictor
from fleetplan.schemas.events import ResetPerf, SetConfig

__all__ = ["change_problem"]


def change_problem(config: PlannerConfig, changes: dict[str, Any], command: str = "set_config") -> str | None:
    """Why ``changes`` can never apply, whatever else changes first; None when it may.

    ``config`` is only consulted for the fields fixed at start that nothing
    changes at run time (``startup_field_problem``): restating one is
    allowed, anything else not.
    """
    fields = field_names()
    given: dict[str, str] = {}  # field -> the key that named it
    for key, value in changes.items():
        if key in DYNAMO_RUNTIME_FIELDS:
            continue  # accepted and ignored, as in a config file
        name = fields.get(key)
        if name is None:
            return f"{command}: {key}: unknown field"
        if name in given:
            # by its name and its Dynamo alias (ttft_ms, ttft): the fold refuses it as a config
            # file is refused, so it passed intake only to be counted rejected at its tick
            return f"{command}: {key}: the same field as {given[name]}, given both"
        given[name] = key
        problem = value_problem(key, value)
        if problem is not None:
            return f"{command}: {problem}"
        try:
            checked = _adapter(name).validate_python(value)
        except ValidationError as err:
            return f"{command}: {key}: {err.errors(include_url=False)[0]['msg']}"
        # the config's validator checks it with those across fields, but it is wrong alone
        square = bucket_size_problem(checked) if name == "fpm_sample_bucket_size" else None
        if square is not None:
            return f"{command}: {square}"
        fixed = startup_field_problem(command, name, restates=checked == getattr(config, name))
        if fixed is not None:
            return fixed
        if name == "load_predictor":
            try:
                make_predictor(checked)
            except (PredictorUnavailable, ValueError) as err:
                return f"{command}: load_predictor: {err}"
    return None


@cache
def _adapter(name: str) -> TypeAdapter:
    """The field's own type and constraints, without the checks across fields."""
    info = PlannerConfig.model_fields[name]
    kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(kind, config=ConfigDict(allow_inf_nan=False))


def intake_problem(config: PlannerConfig, event) -> str | None:
    """What the live worker's intake refuses a well-formed event for, or None.

    A ``set_config`` or ``reset_perf`` whose change can never apply (``change_problem``) is
    dead-lettered there; ``fleetplan plan`` treats it as a bad line, so a
    log folded by hand and the same events on the topics agree.
    """
    body = getattr(event, "body", None)
    if getattr(event, "type", None) == "control" and isinstance(body, SetConfig | ResetPerf):
        problem = change_problem(config, body.changes, body.command)
        if problem is not None:
            return f"body.changes: {problem}"
    return None

