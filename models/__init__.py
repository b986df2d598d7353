"""The pure planning core: config, predictors, perf models, loops, state and tick."""

# each module registers its predictor kinds (models/predictors.py holds the
# interface, the registry and the two simplest kinds)
from fleetplan.models import arima as _arima  # noqa: F401  "arima", "arima_frozen"
from fleetplan.models import ensemble as _ensemble  # noqa: F401  "ensemble"
from fleetplan.models import prophet_predictor as _prophet  # noqa: F401  "prophet"
