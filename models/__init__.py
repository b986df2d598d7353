"""The pure planning core: config, predictors, perf models, loops, state and tick."""

from fleetplan.models import ensemble as _ensemble  # noqa: F401  registers the "ensemble" kind
